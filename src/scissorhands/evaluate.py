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
* Per policy and budget, also: the KV positions held per layer after each step
  (max/mean), and per decode step the policy's own time, the cache's bookkeeping time
  (GQA mean, gathers) and the model's forward time, in milliseconds.

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
from typing import Any

import numpy as np

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
    sinks: int = 4,
    prompt_tokens: int = 64,
    head_mode: str = "per-head",
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
        only) and ``prefill_seconds`` (a dict of the same three for the prefill).
    """
    import torch

    from . import hf

    cache = hf.EvictingCache.from_policy(
        model.config,
        policy,
        budget,
        recent_window=recent_window,
        sinks=sinks,
        head_mode=head_mode,
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
    after_prefill = (cache.policy_seconds, cache.bookkeeping_seconds, cache.forward_seconds)
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
        "prefill_seconds": dict(cache.prefill_seconds),
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
        "decode_steps": run["decode_steps"],
        "prefill_ms": {key: 1e3 * value for key, value in run["prefill_seconds"].items()},
    }


# --------------------------------------------------------------------------- reporting


def _param_label(result: dict[str, Any]) -> str:
    if result["policy"] == "streaming-llm":
        return f"sinks={result['sinks']}"
    if result["policy"] in ("h2o", "scissorhands"):
        return f"rw={result['recent_window']}"
    return "-"


def format_table(results: Sequence[dict[str, Any]]) -> str:
    """A plain-text table of eval results, one row per policy, budget and parameter."""
    full = next((r for r in results if r["policy"] == "full"), None)
    header = (
        f"{'policy':<14} {'budget':>6} {'param':>9} {'perplexity':>10} {'vs full':>8} "
        f"{'agree':>6} {'top-1':>6} {'KV max':>6} {'KV mean':>7} "
        f"{'policy ms':>9} {'cache ms':>8} {'model ms':>8}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        delta = f"{100 * (r['perplexity'] / full['perplexity'] - 1):+.1f}%" if full else "-"
        budget = "-" if r["budget"] is None else str(r["budget"])
        lines.append(
            f"{r['policy']:<14} {budget:>6} {_param_label(r):>9} "
            f"{r['perplexity']:>10.3f} {delta:>8} "
            f"{r['next_token_agreement']:>6.3f} {r['top1_accuracy']:>6.3f} "
            f"{r['kv_positions_held_max']:>6d} {r['kv_positions_held_mean']:>7.1f} "
            f"{r['policy_ms_per_step']:>9.3f} {r['bookkeeping_ms_per_step']:>8.3f} "
            f"{r['forward_ms_per_step']:>8.1f}"
        )
    return "\n".join(lines)


def plot_results(
    results: Sequence[dict[str, Any]], path: str | os.PathLike[str], title: str = ""
) -> None:
    """Save a plot of perplexity against budget, one line per policy (and parameter)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    series: dict[str, list[tuple[int, float]]] = {}
    for r in results:
        if r["policy"] == "full":
            ax.axhline(
                r["perplexity"], color="black", linestyle="--", linewidth=1, label="full cache"
            )
            continue
        label = r["policy"] if _param_label(r) == "-" else f"{r['policy']} ({_param_label(r)})"
        series.setdefault(label, []).append((r["budget"], r["perplexity"]))
    for label, points in series.items():
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    ax.set_xlabel("budget (KV positions held per head)")
    ax.set_ylabel("perplexity")
    if title:
        ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
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


def _runs(
    args: Any, budgets: list[int]
) -> tuple[list[tuple[str, int | None, int, int]], list[str]]:
    """The (policy, budget, recent_window, sinks) runs, and notes on skipped combinations."""
    names = _policy_names(args.policies)
    runs: list[tuple[str, int | None, int, int]] = [("full", None, 0, 0)]
    notes = []
    if "full" not in names:
        notes.append("full cache run anyway: it is the reference for agreement")
    for budget in budgets:
        for name in names:
            if name == "full":
                continue
            if name == "streaming-llm":
                for sinks in args.sinks:
                    if sinks >= budget:
                        notes.append(
                            f"skipped streaming-llm budget {budget} sinks {sinks}: sinks >= budget"
                        )
                        continue
                    runs.append((name, budget, 0, sinks))
            else:
                for window in args.recent_window:
                    if window >= budget:
                        notes.append(
                            f"skipped {name} budget {budget} recent_window {window}: "
                            "recent_window >= budget"
                        )
                        continue
                    runs.append((name, budget, window, 0))
    return runs, notes


def run_eval(args: Any) -> int:
    """``python -m scissorhands eval``: perplexity and agreement per policy and budget.

    ``args`` (an ``argparse.Namespace``): ``tokens`` (int), ``budgets`` (list of int or
    None: N/8 and N/5), ``policies`` (comma-separated), ``prompt_tokens``,
    ``recent_window`` (list of int), ``sinks`` (list of int), ``text``, ``model``,
    ``json``, ``plot`` (paths or None), ``no_progress``, ``head_mode``
    (``per-head``/``mean``), ``backend`` (``native``/``reference``).

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
    try:
        registry = hf.policy_registry(backend)
    except ScissorhandsError as exc:
        return _fail(str(exc))
    names = _policy_names(args.policies)
    unknown = [name for name in names if name not in registry]
    if unknown or not names:
        return _fail(f"unknown policies {unknown}; known: {', '.join(registry)}")
    runs, notes = _runs(args, budgets)

    try:
        text, source = read_text(args.text)
    except OSError as exc:
        return _fail(f"cannot read --text: {exc}")
    progress = not args.no_progress
    try:
        model, tokenizer, load_seconds = _load(args.model, progress)
    except (ScissorhandsError, OSError) as exc:
        return _fail(str(exc))
    try:
        ids = tokenize_prefix(tokenizer, text, tokens)
    except ScissorhandsError as exc:
        return _fail(str(exc))
    first_target = max(budgets)
    target_ids = np.array(ids[1:], dtype=np.int64)

    steps_per_run = tokens - 1 - prompt_tokens + 1
    bar = tqdm(total=steps_per_run * len(runs), disable=not progress, unit="step", file=sys.stderr)
    results: list[dict[str, Any]] = []
    raw = []
    for policy, budget, window, sinks in runs:
        bar.set_description(f"{policy}" + ("" if budget is None else f"@{budget}"))
        start = time.perf_counter()
        run = evaluate_policy(
            model,
            ids,
            policy,
            budget,
            recent_window=window,
            sinks=sinks,
            prompt_tokens=prompt_tokens,
            head_mode=head_mode,
            backend=backend,
            progress=bar.update,
        )
        wall = time.perf_counter() - start
        raw.append((policy, budget, window, sinks, run, wall))
    bar.close()
    for policy, budget, window, sinks, run, wall in raw:
        result: dict[str, Any] = {"policy": policy, "budget": budget}
        if policy in ("h2o", "scissorhands"):
            result["recent_window"] = window
        if policy == "streaming-llm":
            result["sinks"] = sinks
        # raw[0] is the full-cache run: the reference for next-token agreement.
        result.update(_summarise(run, first_target, raw[0][4]["argmax"], target_ids))
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
        f"head mode {head_mode}; backend {backend}; model load {load_seconds:.1f} s"
    )
    print(summary)
    print(format_table(results))
    print(
        "perplexity/agree/top-1 over the scored positions; KV held per layer and head after "
        "each step; ms per decode step: policy calls, cache bookkeeping (GQA mean, gathers), "
        "model forward"
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
                "sinks": list(args.sinks),
                "head_mode": head_mode,
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
            title=f"N={tokens}, {head_mode}, scored {first_target}..{tokens - 1}",
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
    try:
        text, source = read_text(args.text)
    except OSError as exc:
        return _fail(f"cannot read --text: {exc}")
    progress = not args.no_progress
    try:
        model, tokenizer, load_seconds = _load(args.model, progress)
        ids = tokenize_prefix(tokenizer, text, tokens)
    except (ScissorhandsError, OSError) as exc:
        return _fail(str(exc))
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
