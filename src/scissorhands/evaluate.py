"""Real-model evaluation (``python -m scissorhands eval``) and trace recording (``record``).

Protocol (so that every number is comparable)
---------------------------------------------
* Teacher forcing on a real text: the first ``tokens`` tokens (default 512) of the text
  (default: the standard library's ``pydoc_data.topics``, Python license, concatenated
  in sorted key order, so it is available offline everywhere).
* The prompt, the first ``prompt_tokens`` tokens (default 64), is consumed in one
  forward and handed to each policy's ``prefill``; then one token per decode step.
* Perplexity, next-token agreement with the full cache (same arg-max) and top-1
  accuracy are reported over the **same** target tokens for every policy and budget:
  positions ``max(budgets) .. N-1`` (a target at position ``t`` is predicted from the
  logits of position ``t-1``).
* Per policy, budget and configuration, also: the KV positions held per layer after
  each step (max/mean), and per decode step the policy's own time, the cache's
  bookkeeping time (GQA mean, reordering the weights to kept order, slot or gather work)
  and the model's forward time, in milliseconds, with policy + bookkeeping as a
  percentage of the forward (``overhead_percent_of_forward``), and the part of the
  forward spent writing keys and values into the cache (``cache_update_ms_per_step``).
* A sweep runs every combination of ``--recent-window`` (positions, or a fraction of
  each budget: ``50%``, ``0.5x``), ``--sinks`` (every policy taking sinks; default: each
  policy's own), ``--history-window`` and ``--vote-rate`` (scissorhands only) at every
  budget;
  combinations a policy refuses for a budget are skipped with a note.

Only this module and :mod:`scissorhands.hf` import ``torch``; they do it inside the
functions, so importing this module (e.g. from the CLI) stays cheap.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import sys
import time
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from .cli import spec_fraction
from .errors import ScissorhandsError

__all__ = [
    "DEFAULT_POLICIES",
    "default_text",
    "read_text",
    "default_budgets",
    "tokenize_prefix",
    "evaluate_policy",
    "format_table",
    "plot_results",
    "run_eval",
    "run_record",
]

#: Policies run by ``eval`` when ``--policies`` is not given.
DEFAULT_POLICIES = "full,streaming-llm,h2o,scissorhands"
_TEXT_SOURCE_DEFAULT = (
    "pydoc_data.topics (Python standard library, PSF license), topics in sorted key order"
)


# --------------------------------------------------------------------------- inputs


def default_text() -> str:
    """The default evaluation text: ``pydoc_data.topics`` concatenated in sorted key order.

    Real English prose with code, shipped with every CPython (PSF license), so the
    evaluation runs offline.  The text differs between Python versions; the JSON output
    records the Python version and a hash of the token ids.
    """
    from pydoc_data.topics import topics

    return "".join(topics[key] for key in sorted(topics))


def read_text(path: str | os.PathLike[str] | None) -> tuple[str, str]:
    """Return ``(text, source description)`` from a UTF-8 file, or the default text."""
    if path is None:
        return default_text(), _TEXT_SOURCE_DEFAULT
    with open(path, encoding="utf-8") as handle:
        return handle.read(), os.fspath(path)


def default_budgets(tokens: int) -> list[int]:
    """The default budgets: ``N/8`` and ``N/5``, rounded down (64 and 102 at N = 512)."""
    return sorted({max(1, tokens // 8), max(1, tokens // 5)})


def tokenize_prefix(tokenizer: Any, text: str, tokens: int) -> list[int]:
    """The first ``tokens`` token ids of ``text``.

    Only a prefix of the text is tokenised (growing until it yields comfortably more
    than ``tokens`` ids, so the cut cannot change the ids kept).

    Raises
    ------
    ScissorhandsError
        The whole text has fewer than ``tokens`` tokens.
    """
    chars = max(1024, tokens * 8)
    while True:
        ids = list(tokenizer(text[:chars], add_special_tokens=True)["input_ids"])
        if len(ids) >= tokens + 64 or chars >= len(text):
            break
        chars *= 2
    if len(ids) < tokens:
        raise ScissorhandsError(f"the text has only {len(ids)} tokens, {tokens} requested")
    return ids[:tokens]


# --------------------------------------------------------------------------- one run


def evaluate_policy(
    model: Any,
    ids: Sequence[int],
    policy: str,
    budget: int | None,
    *,
    recent_window: int = 32,
    sinks: int | None = None,
    history_window: int | None = None,
    vote_rate: bool = False,
    prompt_tokens: int = 64,
    head_mode: str = "per-head",
    cache_mode: str = "reuse",
    backend: str = "native",
    progress: Any = None,
) -> dict[str, Any]:
    """Run one policy teacher-forced over ``ids``; return per-target arrays and timings.

    Returns
    -------
    dict
        ``nll`` (float64, ``(N-1,)``: row ``r`` is the negative log-likelihood of token
        ``r + 1``), ``argmax`` (int64, ``(N-1,)``), ``held`` (int64, ``(steps, layers)``:
        positions held per layer after each decode step), ``decode_steps``, and seconds:
        ``policy_seconds``, ``bookkeeping_seconds``, ``forward_seconds`` (decode steps
        only), ``update_seconds`` (the part of the forward spent writing keys and values
        into the cache, decode steps only), ``prefill_seconds`` (a dict of policy,
        bookkeeping and forward for the prefill) and ``compactions``.

    ``sinks`` None is each policy's own default; ``history_window`` and ``vote_rate``
    apply to ``scissorhands`` only (see :func:`scissorhands.hf.make_policy`).
    """
    import torch

    from . import hf

    cache = hf.EvictingCache.from_policy(
        model.config,
        policy,
        budget,
        recent_window=recent_window,
        sinks=sinks,
        history_window=history_window,
        vote_rate=vote_rate,
        head_mode=head_mode,
        cache_mode=cache_mode,
        backend=backend,
    )
    tokens = torch.tensor(ids, dtype=torch.long)
    n = len(ids)
    nll = np.empty(n - 1, dtype=np.float64)
    argmax = np.empty(n - 1, dtype=np.int64)
    logits = hf.prefill(model, cache, tokens[:prompt_tokens])
    rows = min(prompt_tokens, n - 1)
    logp = torch.log_softmax(logits[:rows].double(), dim=-1)
    nll[:rows] = (-logp.gather(1, tokens[1 : rows + 1, None])[:, 0]).numpy()
    argmax[:rows] = logits[:rows].argmax(dim=-1).numpy()
    held = []
    after_prefill = (
        cache.policy_seconds,
        cache.bookkeeping_seconds,
        cache.forward_seconds,
        cache.update_seconds,
    )
    if progress is not None:
        progress(1)
    for t in range(prompt_tokens, n - 1):
        logits = hf.decode_step(model, cache, int(ids[t]))
        nll[t] = -float(torch.log_softmax(logits.double(), dim=-1)[ids[t + 1]])
        argmax[t] = int(logits.argmax())
        held.append(cache.held_counts())
        if progress is not None:
            progress(1)
    return {
        "nll": nll,
        "argmax": argmax,
        "held": np.array(held, dtype=np.int64).reshape(len(held), cache.num_layers),
        "decode_steps": cache.decode_steps,
        "policy_seconds": cache.policy_seconds - after_prefill[0],
        "bookkeeping_seconds": cache.bookkeeping_seconds - after_prefill[1],
        "forward_seconds": cache.forward_seconds - after_prefill[2],
        "update_seconds": cache.update_seconds - after_prefill[3],
        "prefill_seconds": dict(cache.prefill_seconds),
        "compactions": cache.compactions,
    }


def _summarise(
    run: dict[str, Any], first_target: int, full_argmax: np.ndarray, target_ids: np.ndarray
) -> dict[str, Any]:
    rows = slice(first_target - 1, None)
    nll = run["nll"][rows]
    argmax = run["argmax"][rows]
    steps = max(run["decode_steps"], 1)
    held = run["held"]
    mean_nll = float(nll.mean())
    return {
        "perplexity": math.exp(mean_nll),
        "mean_nll": mean_nll,
        "next_token_agreement": float((argmax == full_argmax[rows]).mean()),
        "top1_accuracy": float((argmax == target_ids[rows]).mean()),
        "kv_positions_held_max": int(held.max()) if held.size else 0,
        "kv_positions_held_mean": float(held.mean()) if held.size else 0.0,
        "policy_ms_per_step": 1e3 * run["policy_seconds"] / steps,
        "bookkeeping_ms_per_step": 1e3 * run["bookkeeping_seconds"] / steps,
        "forward_ms_per_step": 1e3 * run["forward_seconds"] / steps,
        "overhead_percent_of_forward": (
            100 * (run["policy_seconds"] + run["bookkeeping_seconds"]) / run["forward_seconds"]
            if run["forward_seconds"] > 0
            else 0.0
        ),
        "cache_update_ms_per_step": 1e3 * run.get("update_seconds", 0.0) / steps,
        "compactions": run.get("compactions", 0),
        "decode_steps": run["decode_steps"],
        "prefill_ms": {key: 1e3 * value for key, value in run["prefill_seconds"].items()},
    }


# --------------------------------------------------------------------------- reporting


def _window_text(result: dict[str, Any]) -> str:
    spec = result.get("recent_window_spec")
    window = f"rw={result['recent_window']}"
    return window if spec is None else f"{window} ({spec})"


def config_label(result: dict[str, Any]) -> str:
    """The configuration of one result as a short label: ``rw=51 (50%) sinks=0 hw=8``.

    Only the parameters the policy has: ``streaming-llm`` its sinks, ``h2o`` its recent
    window (and the fraction of the budget it came from) and sinks, ``scissorhands``
    those and its history window (``off`` when not set); ``full``: ``-``.
    """
    policy = result["policy"]
    if policy == "streaming-llm":
        return f"sinks={result['sinks']}"
    if policy not in ("h2o", "scissorhands"):
        return "-"
    label = f"{_window_text(result)} sinks={result['sinks']}"
    if policy == "scissorhands":
        window = result.get("history_window")
        label += f" hw={'off' if window is None else window}"
        if result.get("vote_rate"):
            label += " rate"
    return label


def _series_label(result: dict[str, Any]) -> str:
    """The plot series of a result: its configuration with the recent window as given
    (a fraction of the budget stays one series across budgets)."""
    policy = result["policy"]
    if policy in ("h2o", "scissorhands"):
        spec = result.get("recent_window_spec")
        window = f"rw={result['recent_window'] if spec is None else spec}"
        label = f"{policy} {window} sinks={result['sinks']}"
        if policy == "scissorhands" and result.get("history_window") is not None:
            label += f" hw={result['history_window']}"
        if policy == "scissorhands" and result.get("vote_rate"):
            label += " rate"
        return label
    if policy == "streaming-llm":
        return f"{policy} sinks={result['sinks']}"
    return policy


def format_table(results: Sequence[dict[str, Any]]) -> str:
    """A plain-text table of eval results, one row per policy, budget and configuration."""
    full = next((r for r in results if r["policy"] == "full"), None)
    width = max([len("config")] + [len(config_label(r)) for r in results])
    header = (
        f"{'policy':<13} {'budget':>6} {'config':<{width}} {'perplexity':>10} {'vs full':>9} "
        f"{'agree':>6} {'top-1':>6} {'KV max':>6} {'KV mean':>7} "
        f"{'policy ms':>9} {'cache ms':>8} {'model ms':>8} {'ovh %':>6}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        delta = f"{100 * (r['perplexity'] / full['perplexity'] - 1):+.1f}%" if full else "-"
        budget = "-" if r["budget"] is None else str(r["budget"])
        lines.append(
            f"{r['policy']:<13} {budget:>6} {config_label(r):<{width}} "
            f"{r['perplexity']:>10.3f} {delta:>9} "
            f"{r['next_token_agreement']:>6.3f} {r['top1_accuracy']:>6.3f} "
            f"{r['kv_positions_held_max']:>6d} {r['kv_positions_held_mean']:>7.1f} "
            f"{r['policy_ms_per_step']:>9.3f} {r['bookkeeping_ms_per_step']:>8.3f} "
            f"{r['forward_ms_per_step']:>8.1f} {r['overhead_percent_of_forward']:>6.2f}"
        )
    return "\n".join(lines)


def plot_results(
    results: Sequence[dict[str, Any]], path: str | os.PathLike[str], title: str = ""
) -> None:
    """Save a plot of perplexity against budget, one line per policy and configuration
    (a recent window given as a fraction of the budget is one line).

    Each line has its own colour and a marker per policy; the full cache is a dashed
    line.  The perplexity axis is logarithmic when the values span more than 4x, and a
    long legend goes to the right of the axes.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[int, float]]] = {}
    policy_of: dict[str, str] = {}
    full = None
    for r in results:
        if r["policy"] == "full":
            full = r["perplexity"]
            continue
        label = _series_label(r)
        series.setdefault(label, []).append((r["budget"], r["perplexity"]))
        policy_of[label] = r["policy"]
    wide = len(series) > 8
    fig, ax = plt.subplots(figsize=(9.6 if wide else 7.2, 4.8))
    if full is not None:
        ax.axhline(full, color="black", linestyle="--", linewidth=1, label="full cache")
    colors = plt.get_cmap("tab10" if len(series) <= 10 else "tab20")
    markers = {"streaming-llm": "s", "h2o": "^", "scissorhands": "o"}
    for index, (label, points) in enumerate(series.items()):
        points.sort()
        ax.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            marker=markers.get(policy_of[label], "D"),
            color=colors(index % colors.N),
            label=label,
        )
    values = [p[1] for points in series.values() for p in points] + (
        [] if full is None else [full]
    )
    if values and min(values) > 0 and max(values) / min(values) > 4:
        ax.set_yscale("log")
    ax.set_xlabel("budget (KV positions held per head)")
    ax.set_ylabel("perplexity")
    if title:
        ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    if wide:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    else:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------- commands


def _fail(message: str) -> int:
    print(f"scissorhands: error: {message}", file=sys.stderr)
    return 2


def _load(model_path: str | None, progress: bool) -> tuple[Any, Any, float]:
    from . import hf

    start = time.perf_counter()
    model, tokenizer = hf.load_model(model_path, progress=progress)
    return model, tokenizer, time.perf_counter() - start


def _model_info(model: Any, path: str | None) -> dict[str, Any]:
    from . import hf

    config = model.config.get_text_config(decoder=True)
    return {
        "path": path if path is not None else hf.default_gguf_path(),
        "architecture": getattr(config, "model_type", None),
        "layers": int(config.num_hidden_layers),
        "query_heads": int(config.num_attention_heads),
        "kv_heads": int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads),
    }


def _environment() -> dict[str, Any]:
    import torch
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "machine": platform.machine(),
    }


def _policy_names(policies: str | Sequence[str]) -> list[str]:
    """Policy names from a comma-separated string or a list, duplicates dropped, in order."""
    raw = policies.split(",") if isinstance(policies, str) else list(policies)
    names: list[str] = []
    for name in (str(item).strip().lower() for item in raw):
        if name and name not in names:
            names.append(name)
    return names


def _import_hf() -> Any:
    """Import :mod:`scissorhands.hf`, turning a missing torch/transformers into a message."""
    try:
        from . import hf
    except ImportError as exc:
        raise ScissorhandsError(
            f"the real-model commands need torch and the [hf] extra (see the README): {exc}"
        ) from None
    return hf


def _default_sinks(cls: type) -> int:
    """A policy class's own default ``sinks`` (0 when it has none)."""
    import inspect

    try:
        default = inspect.signature(cls).parameters["sinks"].default
    except (KeyError, TypeError, ValueError):
        return 0
    return int(default) if isinstance(default, int) else 0


def _runs(
    args: Any, budgets: list[int], registry: Any = None, backend: str = "native"
) -> tuple[list[dict[str, Any]], list[str]]:
    """The runs of a sweep, as configurations, and notes on skipped combinations.

    Each configuration is a dict: ``policy``, ``budget`` and, as the policy has them,
    ``recent_window`` (in positions), ``recent_window_spec`` (when given as a fraction of
    the budget, e.g. ``"50%"``), ``sinks``, ``history_window`` (None: off), ``vote_rate``
    (bool).  The full cache comes first.  ``args.sinks`` None: each policy's own
    default; values: every policy taking sinks.  ``args.history_window`` and
    ``args.vote_rate`` (list of bools; optional): scissorhands only.  A combination a
    policy refuses for a budget (e.g. ``recent_window + sinks >= budget``) is skipped
    with a note, and so is a duplicate (two specs giving the same window).
    """
    from . import hf
    from .cli import resolve_recent_window

    registry = registry if registry is not None else hf.policy_registry(backend)
    names = _policy_names(args.policies)
    runs: list[dict[str, Any]] = [{"policy": "full", "budget": None}]
    notes = []
    if "full" not in names:
        notes.append("full cache run anyway: it is the reference for agreement")
    sink_values = getattr(args, "sinks", None)
    history = [None] if getattr(args, "history_window", None) is None else args.history_window
    history = list(dict.fromkeys(None if not w else int(w) for w in history))
    rates = list(dict.fromkeys(bool(r) for r in (getattr(args, "vote_rate", None) or [False])))
    seen = set()
    for budget in budgets:
        for name in names:
            if name == "full":
                continue
            cls = registry[name]
            sinks_list = (
                [_default_sinks(cls)] if sink_values is None else list(dict.fromkeys(sink_values))
            )
            configs: list[dict[str, Any]] = []
            if name == "streaming-llm":
                configs = [{"sinks": int(sinks)} for sinks in sinks_list]
            else:
                for spec in dict.fromkeys(args.recent_window):
                    window = resolve_recent_window(spec, budget)
                    for sinks in sinks_list:
                        for hw in history if name == "scissorhands" else [None]:
                            for rate in rates if name == "scissorhands" else [False]:
                                config: dict[str, Any] = {"recent_window": window}
                                if isinstance(spec, str):
                                    config["recent_window_spec"] = spec
                                config["sinks"] = int(sinks)
                                if name == "scissorhands":
                                    config["history_window"] = hw
                                    config["vote_rate"] = rate
                                configs.append(config)
            for config in configs:
                config = {"policy": name, "budget": budget, **config}
                label = f"{name} budget {budget} ({config_label(config)})"
                key = (name, budget, config.get("recent_window"), config["sinks"],
                       config.get("history_window"), config.get("vote_rate"))  # fmt: skip
                if key in seen:
                    notes.append(f"skipped {label}: the same run as an earlier configuration")
                    continue
                try:
                    hf.make_policy(
                        name,
                        budget,
                        recent_window=config.get("recent_window", 0),
                        sinks=config["sinks"],
                        history_window=config.get("history_window"),
                        vote_rate=config.get("vote_rate", False),
                        backend=backend,
                    )
                except ScissorhandsError as exc:
                    notes.append(f"skipped {label}: {exc}")
                    continue
                seen.add(key)
                runs.append(config)
    return runs, notes


def _load_inputs(args: Any, tokens: int, progress: bool) -> tuple[str, Any, Any, float, list[int]] | str:
    """Read ``--text``, load ``--model`` and tokenize the first ``tokens`` tokens:
    ``(source, model, tokenizer, load_seconds, ids)``, or the message of what failed."""
    try:
        text, source = read_text(args.text)
    except OSError as exc:
        return f"cannot read --text: {exc}"
    try:
        model, tokenizer, load_seconds = _load(args.model, progress)
        ids = tokenize_prefix(tokenizer, text, tokens)
    except (ScissorhandsError, OSError) as exc:
        return str(exc)
    return source, model, tokenizer, load_seconds, ids


def run_eval(args: Any) -> int:
    """``python -m scissorhands eval``: perplexity and agreement per policy and budget.

    ``args`` (an ``argparse.Namespace``): ``tokens`` (int), ``budgets`` (list of int or
    None: N/8 and N/5), ``policies`` (comma-separated), ``prompt_tokens``,
    ``recent_window`` (list of int, or of fractions of the budget ``"50%"``/``"0.5x"``),
    ``sinks`` (list of int, or None: each policy's default), ``vote_rate`` (list of bool,
    scissorhands only; optional), ``history_window`` (list of
    int or None, scissorhands only; optional), ``text``, ``model``, ``json``, ``plot``
    (paths or None), ``no_progress``, ``head_mode`` (``per-head``/``mean``),
    ``cache_mode`` (``reuse``/``compact``; optional), ``backend``
    (``native``/``reference``).  Every combination of the swept values is run at every
    budget; combinations a policy refuses are skipped with a note.

    Returns the process exit status: 0, or 2 on a bad argument (message on stderr).
    """
    from tqdm import tqdm

    try:
        hf = _import_hf()
    except ScissorhandsError as exc:
        return _fail(str(exc))
    tokens = int(args.tokens)
    prompt_tokens = int(args.prompt_tokens)
    budgets = sorted(set(args.budgets)) if args.budgets else default_budgets(tokens)
    head_mode = getattr(args, "head_mode", "per-head")
    cache_mode = getattr(args, "cache_mode", "reuse")
    backend = getattr(args, "backend", "native")
    if tokens < 3:
        return _fail(f"--tokens must be at least 3, got {tokens}")
    if not 1 <= prompt_tokens < tokens:
        return _fail(f"--prompt-tokens must be in [1, {tokens - 1}], got {prompt_tokens}")
    if min(budgets) < 1 or max(budgets) > tokens - 1:
        return _fail(
            f"budgets must be in [1, {tokens - 1}] (targets are max(budgets)..N-1), got {budgets}"
        )
    if head_mode not in hf.HEAD_MODES:
        return _fail(f"--head-mode must be one of {', '.join(hf.HEAD_MODES)}, got {head_mode!r}")
    if cache_mode not in hf.CACHE_MODES:
        return _fail(
            f"--cache-mode must be one of {', '.join(hf.CACHE_MODES)}, got {cache_mode!r}"
        )
    try:
        registry = hf.policy_registry(backend)
    except ScissorhandsError as exc:
        return _fail(str(exc))
    names = _policy_names(args.policies)
    unknown = [name for name in names if name not in registry]
    if unknown or not names:
        return _fail(f"unknown policies {unknown}; known: {', '.join(registry)}")
    try:
        runs, notes = _runs(args, budgets, registry, backend)
    except (ScissorhandsError, ValueError, ZeroDivisionError) as exc:
        return _fail(f"bad sweep values: {exc}")

    progress = not args.no_progress
    loaded = _load_inputs(args, tokens, progress)
    if isinstance(loaded, str):
        return _fail(loaded)
    source, model, _tokenizer, load_seconds, ids = loaded
    first_target = max(budgets)
    target_ids = np.array(ids[1:], dtype=np.int64)

    steps_per_run = tokens - 1 - prompt_tokens + 1
    bar = tqdm(total=steps_per_run * len(runs), disable=not progress, unit="step", file=sys.stderr)
    results: list[dict[str, Any]] = []
    raw = []
    for config in runs:
        policy, budget = config["policy"], config["budget"]
        bar.set_description(f"{policy}" + ("" if budget is None else f"@{budget}"))
        start = time.perf_counter()
        run = evaluate_policy(
            model,
            ids,
            policy,
            budget,
            recent_window=config.get("recent_window", 0),
            sinks=config.get("sinks"),
            history_window=config.get("history_window"),
            vote_rate=config.get("vote_rate", False),
            prompt_tokens=prompt_tokens,
            head_mode=head_mode,
            cache_mode=cache_mode,
            backend=backend,
            progress=bar.update,
        )
        raw.append((config, run, time.perf_counter() - start))
    bar.close()
    for config, run, wall in raw:
        result: dict[str, Any] = dict(config)
        result["label"] = config_label(config)
        # raw[0] is the full-cache run: the reference for next-token agreement.
        result.update(_summarise(run, first_target, raw[0][1]["argmax"], target_ids))
        result["wall_seconds"] = wall
        results.append(result)
    full_ppl = results[0]["perplexity"]
    for result in results:
        result["perplexity_ratio_to_full"] = result["perplexity"] / full_ppl

    model_info = _model_info(model, args.model)
    scored = tokens - first_target
    summary = (
        f"{os.path.basename(model_info['path'])}: N={tokens} tokens (prompt {prompt_tokens}), "
        f"scored on positions {first_target}..{tokens - 1} ({scored} tokens); "
        f"head mode {head_mode}; cache mode {cache_mode}; backend {backend}; "
        f"model load {load_seconds:.1f} s"
    )
    print(summary)
    print(format_table(results))
    print(
        "perplexity/agree/top-1 over the scored positions; KV held per layer and head after "
        "each step; ms per decode step: policy calls, cache bookkeeping (GQA mean, reordering, "
        "slots or gathers), model forward; ovh %: policy + cache as a share of the forward; "
        "config: rw recent window in positions (and the fraction of the budget it came "
        "from, when given as one), sinks, hw history window, rate: evicting by votes per "
        "step held"
    )
    for note in notes:
        print(f"note: {note}")

    if args.json:
        document = {
            "format": "scissorhands.eval",
            "version": 1,
            "config": {
                "tokens": tokens,
                "prompt_tokens": prompt_tokens,
                "budgets": budgets,
                "policies": names,
                "recent_window": list(args.recent_window),
                "sinks": None if args.sinks is None else list(args.sinks),
                "history_window": list(getattr(args, "history_window", None) or [None]),
                "vote_rate": list(getattr(args, "vote_rate", None) or [False]),
                "head_mode": head_mode,
                "cache_mode": cache_mode,
                "backend": backend,
                "scored_positions": [first_target, tokens - 1],
                "scored_tokens": scored,
                "text": {
                    "source": source,
                    "token_ids_sha256": hashlib.sha256(
                        np.asarray(ids, dtype="<i8").tobytes()
                    ).hexdigest(),
                },
                "model": model_info,
                "environment": _environment(),
            },
            "model_load_seconds": load_seconds,
            "notes": notes,
            "results": results,
        }
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=2)
            handle.write("\n")
    if args.plot:
        plot_results(
            results,
            args.plot,
            title=f"N={tokens}, head mode {head_mode}, scored {first_target}..{tokens - 1}",
        )
    return 0


def run_record(args: Any) -> int:
    """``python -m scissorhands record``: store a real model's full-cache attention trace.

    ``args``: ``tokens`` (int), ``layers`` (list of int or None = all), ``out`` (path),
    ``text``, ``model`` (paths or None), ``prompt_tokens`` (int), ``no_progress``.

    Per step ``t = 1..N-1``, per selected layer and KV head: the new token's attention
    over positions ``0..t-1`` (mean over the GQA group's query heads, its weight on
    itself excluded), float16, written through ``scissorhands.traces.save_recorded_trace``.

    Returns the process exit status: 0, or 2 on a bad argument.
    """
    from tqdm import tqdm

    try:
        hf = _import_hf()
    except ScissorhandsError as exc:
        return _fail(str(exc))
    tokens = int(args.tokens)
    prompt_tokens = int(getattr(args, "prompt_tokens", 64))
    if tokens < 2:
        return _fail(f"--tokens must be at least 2, got {tokens}")
    if prompt_tokens < 1:
        return _fail(f"--prompt-tokens must be at least 1, got {prompt_tokens}")
    progress = not args.no_progress
    loaded = _load_inputs(args, tokens, progress)
    if isinstance(loaded, str):
        return _fail(loaded)
    source, model, _tokenizer, load_seconds, ids = loaded
    model_info = _model_info(model, args.model)
    layers = (
        list(range(model_info["layers"])) if args.layers is None else [int(i) for i in args.layers]
    )
    if not layers or any(not 0 <= i < model_info["layers"] for i in layers):
        return _fail(f"--layers must be in [0, {model_info['layers'] - 1}], got {layers}")
    bar = tqdm(total=tokens, disable=not progress, unit="token", desc="record", file=sys.stderr)
    start = time.perf_counter()
    weights = hf.record_attention(
        model, ids, layers=layers, prompt_tokens=prompt_tokens, progress=bar.update
    )
    bar.close()
    seconds = time.perf_counter() - start
    metadata = {
        "model": model_info,
        "text_source": source,
        "token_ids": [int(i) for i in ids],
        "head_reduction": "mean over the GQA group's query heads; the token's weight on itself "
        "excluded; not renormalised",
        "environment": _environment(),
    }
    from .traces import save_recorded_trace

    # weights: float16 (len(layers), kv_heads, N (N - 1) / 2), step t at offset t (t - 1) / 2.
    save_recorded_trace(
        args.out,
        weights,
        layers,
        prompt_tokens=min(prompt_tokens, tokens),
        model=os.path.basename(model_info["path"]),
        metadata=metadata,
    )
    print(
        f"recorded {tokens} tokens x {len(layers)} layers x {model_info['kv_heads']} KV heads "
        f"in {seconds:.1f} s (model load {load_seconds:.1f} s) -> {args.out}"
    )
    return 0


# --------------------------------------------------------------------------- report


def _report_series(result: dict[str, Any]) -> str:
    """A result's configuration across budgets and files: :func:`_series_label`, with a
    fractional recent window written as a percentage (``0.5x`` and ``50%`` are one row)
    and the sinks of older documents (recorded as None) read as the default then, 0."""
    if result["policy"] in ("h2o", "scissorhands"):
        result = dict(result)
        if result.get("sinks") is None:
            result["sinks"] = 0
        if result.get("recent_window_spec") is not None:
            result["recent_window_spec"] = f"{float(100 * spec_fraction(result['recent_window_spec'])):g}%"
    return _series_label(result)


def _report_order(result: dict[str, Any]) -> tuple[Any, ...]:
    """Where a configuration's row goes in a report: by policy, then its options."""
    spec = result.get("recent_window_spec")
    if spec is None:
        window: tuple[int, Any] = (0, Fraction(int(result.get("recent_window") or 0)))
    else:
        window = (1, spec_fraction(spec))
    history = result.get("history_window")
    return ({"streaming-llm": 0, "h2o": 1, "scissorhands": 2}.get(result["policy"], 3),
            window, result.get("sinks") or 0, history is not None, history or 0,
            bool(result.get("vote_rate")))


def _check_result(result: Any, where: str) -> None:
    """A result row of an eval document: a known policy, an integer budget (None for the
    full cache only) and a finite, positive perplexity."""
    if not isinstance(result, dict) or result.get("policy") not in ("full", "streaming-llm", "h2o",
                                                                      "scissorhands"):
        raise ScissorhandsError(f"{where}: a result is not an eval result row")
    budget = result.get("budget")
    if result["policy"] == "full" and budget is not None:
        raise ScissorhandsError(f"{where}: the full-cache run has a budget ({budget!r})")
    if result["policy"] != "full" and (type(budget) is not int or budget < 1):
        raise ScissorhandsError(f"{where}: budget {budget!r} of a {result['policy']} run is not a positive integer")
    ppl = result.get("perplexity")
    if isinstance(ppl, bool) or not isinstance(ppl, (int, float)) or not (math.isfinite(ppl) and ppl > 0):
        raise ScissorhandsError(f"{where}: perplexity {ppl!r} is not a finite positive number")


def _text_name(config: dict[str, Any]) -> str:
    """A short name for a document's text: the file name, or the built-in text's module."""
    source = str(config["text"]["source"])
    return source.split(" ", 1)[0] if " (" in source else os.path.basename(source)


def combine_reports(documents: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Merge ``eval --json`` documents into one grid of perplexities.

    Columns are (text, budget) pairs, texts told apart by the SHA-256 of their token ids
    and named after their source; rows are configurations (:func:`_report_series`), the
    full cache first, then StreamingLLM, H2O and Scissorhands, each by recent window
    (in positions before fractions of the budget), sinks, history window and vote rate.
    A configuration measured twice keeps its first value, and a note says so when the
    two differ.

    Returns
    -------
    dict
        ``columns`` (list of ``(text name, budget)``), ``rows`` (list of labels),
        ``full`` (text name -> full-cache perplexity), ``cells`` (``(label, column)`` ->
        perplexity) and ``notes`` (list of str).

    Raises
    ------
    ScissorhandsError
        A document is not an eval result (or a field of it is malformed), lacks the
        full-cache run, holds no other run, or was measured with other tokens, prompt,
        scored positions, head mode or model than the first.
    """
    setup_keys = ("tokens", "prompt_tokens", "head_mode", "scored_positions")
    setup = None
    names: dict[str, str] = {}
    full: dict[str, float] = {}
    cells: dict[tuple[str, tuple[str, int]], float] = {}
    rows: dict[str, tuple[Any, ...]] = {}
    budgets: dict[str, set[int]] = {}
    notes: list[str] = []
    for index, doc in enumerate(documents):
        where = f"file {index + 1}"
        if not isinstance(doc, dict) or doc.get("format") != "scissorhands.eval":
            raise ScissorhandsError(f"{where} is not a 'scissorhands eval --json' result")
        if doc.get("version") != 1:
            raise ScissorhandsError(f"{where}: eval result version {doc.get('version')!r} is not 1")
        config, results = doc.get("config"), doc.get("results")
        if (not isinstance(config, dict) or not isinstance(config.get("text"), dict)
                or not isinstance(config["text"].get("token_ids_sha256"), str)
                or not isinstance(results, list)):
            raise ScissorhandsError(f"{where}: no config, text hash or results")
        for result in results:
            _check_result(result, where)
        model = config.get("model")
        this = tuple(config.get(k) for k in setup_keys) + (
            os.path.basename(str(model.get("path") if isinstance(model, dict) else model)),)
        if setup is None:
            setup = this
        elif this != setup:
            raise ScissorhandsError(
                f"{where} was measured with {this} (tokens, prompt, head mode, scored "
                f"positions, model), the first with {setup}: their perplexities do not compare")
        key = config["text"]["token_ids_sha256"]
        name = names.setdefault(key, _text_name(config))
        if name in [n for k, n in names.items() if k != key]:
            name = names[key] = f"{name} ({key[:8]})"
        base = next((r for r in results if r["policy"] == "full"), None)
        if base is None:
            raise ScissorhandsError(f"{where} has no full-cache run")
        if name in full and abs(full[name] / base["perplexity"] - 1) > 1e-9:
            notes.append(f"{name}: full-cache perplexity {base['perplexity']:.6f} in file "
                         f"{index + 1} differs from {full[name]:.6f}; the first is kept")
        full.setdefault(name, base["perplexity"])
        for r in results:
            if r["policy"] == "full":
                continue
            label = _report_series(r)
            rows.setdefault(label, _report_order(r))
            column = (name, int(r["budget"]))
            budgets.setdefault(name, set()).add(int(r["budget"]))
            old = cells.setdefault((label, column), r["perplexity"])
            if abs(old / r["perplexity"] - 1) > 1e-9:
                notes.append(f"{label} at {column[1]} on {name}: {r['perplexity']:.6f} in file "
                             f"{index + 1} differs from {old:.6f}; the first is kept")
    labels = sorted(rows, key=lambda lab: rows[lab])
    columns = [(name, b) for name in dict.fromkeys(names.values()) for b in sorted(budgets.get(name, ()))]
    if not columns:
        raise ScissorhandsError("the files hold only full-cache runs: nothing to compare")
    return {"columns": columns, "rows": labels, "full": full, "cells": cells, "notes": notes}


def format_report(report: dict[str, Any], markdown: bool = False) -> str:
    """The combined grid as text: one row per configuration, one column per (text,
    budget), each cell the perplexity and its change against the full cache (``-``: not
    measured). In Markdown the best configuration of each column is bold."""
    columns, full, cells = report["columns"], report["full"], report["cells"]
    best = {}
    for column in columns:
        measured = [(cells[(lab, column)], lab) for lab in report["rows"] if (lab, column) in cells]
        if measured:
            best[column] = min(measured)[1]

    def cell(label: str, column: tuple[str, int]) -> str:
        if (label, column) not in cells:
            return "-"
        value = cells[(label, column)]
        text = f"{value:.3f} ({100 * (value / full[column[0]] - 1):+.1f}%)"
        return f"**{text}**" if markdown and best.get(column) == label else text

    head = ["configuration"] + [f"{name} @{budget}" for name, budget in columns]
    body = [["full cache"] + [f"{full[name]:.3f}" for name, _ in columns]]
    body += [[label] + [cell(label, column) for column in columns] for label in report["rows"]]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(row) + " |" for row in body]
        return "\n".join(lines)
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    fmt = lambda row: "  ".join(  # noqa: E731
        c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
    return "\n".join([fmt(head), "  ".join("-" * w for w in widths), *map(fmt, body)])


def plot_report(report: dict[str, Any], path: str | os.PathLike[str], title: str = "") -> None:
    """Save the combined grid as a dot plot: one panel per text, one line per
    configuration, the change in perplexity against the full cache (percent) on the x
    axis, one marker per budget."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    columns, full, cells, labels = report["columns"], report["full"], report["cells"], report["rows"]
    texts = list(dict.fromkeys(name for name, _ in columns))
    budgets = sorted({b for _, b in columns})
    fig = Figure(figsize=(5.2 * len(texts) + 2.4, 0.34 * len(labels) + 1.6), layout="constrained")
    axes = fig.subplots(1, len(texts), sharey=True, squeeze=False)[0]
    markers = "osD^v<>P"
    ys = list(range(len(labels)))[::-1]
    for ax, name in zip(axes, texts):
        for j, budget in enumerate(budgets):
            points = [(100 * (cells[(lab, (name, budget))] / full[name] - 1), y)
                      for lab, y in zip(labels, ys) if (lab, (name, budget)) in cells]
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], linestyle="none",
                        marker=markers[j % len(markers)], color=f"C{j}", label=f"budget {budget}")
        ax.set_title(f"{name} (full cache {full[name]:.2f})", fontsize=9)
        ax.set_xlabel("perplexity vs full cache (%)")
        ax.grid(True, axis="x", alpha=0.3)
        ax.axvline(0, color="black", linewidth=0.8)
        for y in ys:
            ax.axhline(y, color="0.9", linewidth=0.5, zorder=0)
    axes[0].set_yticks(ys, labels, fontsize=8)
    axes[-1].legend(fontsize=8, loc="lower right")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=120)


def run_report(args: Any) -> int:
    """``python -m scissorhands report``: combine ``eval --json`` files into one table
    (``--markdown`` for a Markdown one) and, with ``--plot``, one figure.

    ``args``: ``files`` (paths), ``markdown`` (bool), ``plot`` (path or None).
    Returns 0.

    Raises
    ------
    ScissorhandsError
        A file cannot be read, is not an eval result, or does not compare with the
        others (the CLI prints it on one line and exits 1).
    """
    documents = []
    for path in args.files:
        try:
            with open(path, encoding="utf-8") as handle:
                documents.append(json.load(handle))
        except (OSError, ValueError) as exc:
            raise ScissorhandsError(f"cannot read {path}: {exc}") from None
    try:
        report = combine_reports(documents)
        table = format_report(report, markdown=bool(args.markdown))
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError) as exc:
        # combine_reports checks the fields it knows; anything else malformed lands here.
        raise ScissorhandsError(f"cannot combine the files: malformed field ({exc!r})") from None
    print(table)
    for note in report["notes"]:
        print(f"note: {note}")
    if args.plot:
        plot_report(report, args.plot)
    return 0
