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
* A sweep runs every combination of the option values given
  (:func:`scissorhands.options.sweep`: a recent window in positions or as a fraction of
  each budget, the sinks of every policy taking them, ...) at every budget;
  combinations a policy refuses for a budget are skipped with a note.
* With ``hindsight=W`` (``--hindsight W``), one more configuration per budget: the
  hindsight reference of :mod:`scissorhands.hindsight` (evicting the held position the
  next ``W`` decode steps of the full run attend to least), its schedule computed from
  the full run's attention while it runs; and a gap-closed figure per configuration
  (:func:`scissorhands.hindsight.gap_closed`).

This module imports neither torch nor the command line: the model work is
:mod:`scissorhands.hf`'s, imported when a run starts.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
import re
import shutil
import sys
import textwrap
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import numpy as np

from scissorhands.errors import ScissorhandsError
from scissorhands.hindsight import gap_closed_percent
from scissorhands.models import model_problem
from scissorhands.options import (
    MODEL_POLICIES,
    OPTIONS,
    PRESETS,
    RECOMMENDED,
    SPECS,
    config_label,
    policy_classes,
    series_label,
    sweep,
    with_presets,
)

from .paths import input_problem, output_problem, plot_problem

__all__ = [
    "EvalRequest",
    "RecordRequest",
    "default_budgets",
    "default_text",
    "format_table",
    "plot_results",
    "read_text",
    "run_eval",
    "run_record",
    "tokenize_prefix",
]

#: Tokens consumed by the first forward when not given.
DEFAULT_PROMPT_TOKENS = 64
#: What the table's hindsight row and gap column mean (after the columns' explanation).
HINDSIGHT_EXPLANATION = (
    "; hindsight W={window}: at each step evicts the held position the next {window} decode steps of the full "
    "run attend to least (greedy, a reference, not a bound); gap %: the share of streaming-llm's perplexity "
    "gap to hindsight a row closes at its budget, 100 * (streaming-llm - row) / (streaming-llm - hindsight): "
    "100 as good as hindsight, above 100 better than it, - without both or when hindsight is not better"
)
_TEXT_SOURCE_DEFAULT = (
    "pydoc_data.topics (Python standard library, PSF license), topics in sorted key order"
)


@dataclass
class EvalRequest:
    """What one ``eval`` run measures.

    Attributes
    ----------
    tokens : int
        Tokens of text, prompt included (default 512).
    prompt_tokens : int, optional
        Tokens consumed by the first forward, the policies' prompt chunk (default 64).
    budgets : list of int, optional
        Default: N/8 and N/5, rounded down.
    policies : sequence of str
        Registry names; the full cache always runs first (the reference).
    values : mapping
        Option name -> values to sweep (None or missing: each policy's default).
    head_mode : {"per-head", "mean"}
    cache_mode : {"reuse", "compact"}
    backend : {"native", "reference"}
    text, model : str, optional
        The text file (default: :func:`default_text`) and the model (default: the
        SmolLM2-135M GGUF).
    json_path, plot : str, optional
        Also write the results as JSON / draw perplexity against budget.
    progress : bool
        A progress bar on stderr.
    attention : {"eager", "sdpa"}
        The attention implementation the model is loaded with (default eager: its own
        weights reach the policies; under sdpa the cache computes them).
    threads : int or None
        torch threads (default 1: as fast as two for this memory-bound model on this
        machine's two cores, and immune to the 10x slowdown two threads suffer when
        another process shares the cores); None leaves torch's default.
    hindsight : int or None
        ``W`` >= 1: also run the hindsight reference at every budget, each decision
        reading the next ``W`` decode steps of the full run's attention (default None:
        not run).  A value below 1 or not an integer is refused before the model loads.
    """

    tokens: int = 512
    prompt_tokens: int | None = None
    budgets: list[int] | None = None
    policies: Sequence[str] = (*MODEL_POLICIES, RECOMMENDED.name)
    values: Mapping[str, Sequence[Any] | None] = field(default_factory=dict)
    head_mode: str = "per-head"
    cache_mode: str = "reuse"
    backend: str = "native"
    text: str | None = None
    model: str | None = None
    json_path: str | None = None
    plot: str | None = None
    progress: bool = True
    attention: str = "eager"
    threads: int | None = 1
    hindsight: int | None = None


@dataclass
class RecordRequest:
    """What one ``record`` run stores: ``tokens`` tokens of ``text`` (the first
    ``prompt_tokens`` in one forward), the attention of ``layers`` (None: all), to
    ``out``."""

    tokens: int = 512
    prompt_tokens: int | None = None
    layers: list[int] | None = None
    out: str = "trace.npz"
    text: str | None = None
    model: str | None = None
    progress: bool = True
    attention: str = "eager"
    threads: int | None = 1


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


# --------------------------------------------------------------------------- reporting


def _summarise(
    run: dict[str, Any], first_target: int, full_argmax: np.ndarray, target_ids: np.ndarray
) -> dict[str, Any]:
    rows = slice(first_target - 1, None)
    nll = run["nll"][rows]
    argmax = run["argmax"][rows]
    steps = max(run["decode_steps"], 1)
    held = run["held"]
    mean_nll = float(nll.mean())
    # The cache's bookkeeping, the rows and the forward are the batch's: each sequence's share.
    share = 1.0 / run.get("batch", 1)
    bookkeeping = run["bookkeeping_seconds"] * share
    forward = run["forward_seconds"] * share
    return {
        "perplexity": math.exp(mean_nll),
        "mean_nll": mean_nll,
        "next_token_agreement": float((argmax == full_argmax[rows]).mean()),
        "top1_accuracy": float((argmax == target_ids[rows]).mean()),
        "kv_positions_held_max": int(held.max()) if held.size else 0,
        "kv_positions_held_mean": float(held.mean()) if held.size else 0.0,
        "policy_ms_per_step": 1e3 * run["policy_seconds"] / steps,
        "bookkeeping_ms_per_step": 1e3 * bookkeeping / steps,
        "rows_ms_per_step": 1e3 * run.get("rows_seconds", 0.0) * share / steps,
        "forward_ms_per_step": 1e3 * forward / steps,
        "overhead_percent_of_forward": (
            100 * (run["policy_seconds"] + bookkeeping) / forward if forward > 0 else 0.0
        ),
        "cache_update_ms_per_step": 1e3 * run.get("update_seconds", 0.0) * share / steps,
        "batch": run.get("batch", 1),
        "compactions": run.get("compactions", 0),
        "decode_steps": run["decode_steps"],
        "prefill_ms": {key: 1e3 * value for key, value in run["prefill_seconds"].items()},
    }


def _run_values(result: Mapping[str, Any]) -> dict[str, Any]:
    """A result row's option values (those its policy takes)."""
    return {o.name: result.get(o.name) for o in SPECS[result["policy"]].options}


def format_table(results: Sequence[dict[str, Any]]) -> str:
    """A plain-text table of eval results, one row per policy, budget and configuration.

    When a hindsight row is among them, a last column ``gap %``: each row's
    ``gap_closed_percent`` (computed from ``results`` when absent), ``-`` where there is
    none; without one, the table is exactly what it was before hindsight existed.
    """
    full = next((r for r in results if r["policy"] == "full"), None)
    with_gap = any(r["policy"] == "hindsight" for r in results)
    gaps = [r.get("gap_closed_percent") for r in results]
    if with_gap and not any("gap_closed_percent" in r for r in results):
        gaps = gap_closed_percent(results)
    width = max([len("config")] + [len(r['label']) for r in results])
    header = (
        f"{'policy':<13} {'budget':>6} {'config':<{width}} {'perplexity':>10} {'vs full':>9} "
        f"{'agree':>6} {'top-1':>6} {'KV max':>6} {'KV mean':>7} "
        f"{'policy ms':>9} {'cache ms':>8} {'model ms':>8} {'ovh %':>6}"
    ) + (f" {'gap %':>6}" if with_gap else "")
    lines = [header, "-" * len(header)]
    for r, gap in zip(results, gaps):
        delta = f"{100 * (r['perplexity'] / full['perplexity'] - 1):+.1f}%" if full else "-"
        budget = "-" if r["budget"] is None else str(r["budget"])
        gap_cell = "" if not with_gap else f" {'-':>6}" if gap is None else f" {gap:>6.1f}"
        lines.append(
            f"{r.get('preset') or r['policy']:<13} {budget:>6} {r['label']:<{width}} "
            f"{r['perplexity']:>10.3f} {delta:>9} "
            f"{r['next_token_agreement']:>6.3f} {r['top1_accuracy']:>6.3f} "
            f"{r['kv_positions_held_max']:>6d} {r['kv_positions_held_mean']:>7.1f} "
            f"{r['policy_ms_per_step']:>9.3f} {r['bookkeeping_ms_per_step']:>8.3f} "
            f"{r['forward_ms_per_step']:>8.1f} {r['overhead_percent_of_forward']:>6.2f}"
            + gap_cell
        )
    return "\n".join(lines)


def _series(result: Mapping[str, Any]) -> str:
    """A result's line in the plot: its policy and options (``hindsight W=32``)."""
    if result["policy"] == "hindsight":
        return f"hindsight W={result['hindsight_window']}"
    return series_label(result['policy'], _run_values(result), result.get('recent_window_spec'))


def plot_results(
    results: Sequence[dict[str, Any]], path: str | os.PathLike[str], title: str = ""
) -> None:
    """Save a plot of perplexity against budget, one line per policy and configuration
    (a recent window given as a fraction of the budget is one line).

    Each line has its own colour and a marker per policy; the full cache is a dashed
    line, the hindsight reference a dotted one with stars.  The perplexity axis is
    logarithmic when the values span more than 4x, and a long legend goes to the right
    of the axes.
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
        label = _series(r)
        series.setdefault(label, []).append((r["budget"], r["perplexity"]))
        policy_of[label] = r["policy"]
    wide = len(series) > 8
    fig, ax = plt.subplots(figsize=(9.6 if wide else 7.2, 4.8))
    if full is not None:
        ax.axhline(full, color="black", linestyle="--", linewidth=1, label="full cache")
    colors = plt.get_cmap("tab10" if len(series) <= 10 else "tab20")
    markers = {**{name: spec.marker for name, spec in SPECS.items() if spec.marker}, "hindsight": "*"}
    for index, (label, points) in enumerate(series.items()):
        points.sort()
        ax.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            marker=markers.get(policy_of[label], "D"),
            color=colors(index % colors.N),
            linestyle=":" if policy_of[label] == "hindsight" else "-",
            markersize=10 if policy_of[label] == "hindsight" else 6,
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


def _fail(message: str) -> NoReturn:
    """Refuse the user's input: the command line prints ``message`` under the command's usage."""
    raise ScissorhandsError(message)


def _import_hf() -> Any:
    """Import :mod:`scissorhands.hf`, turning a missing torch/transformers into a message."""
    try:
        from scissorhands import hf
    except ImportError as exc:
        raise ScissorhandsError(
            f"the real-model commands need torch and the [hf] extra (see the README): {exc}"
        ) from None
    return hf


def _paths_then_hf(text: str | None, model: str | None, outputs: Sequence[tuple[str, str | None]],
                   plots: Sequence[tuple[str, str | None]] = (), tokens: int | None = None) -> Any:
    """The user's paths checked (:func:`check_paths`), then :mod:`scissorhands.hf`
    imported: the module, or the message of the first problem (a ``str``)."""
    problem = check_paths(text, model, outputs, plots, tokens)
    if problem:
        return problem
    try:
        return _import_hf()
    except ScissorhandsError as exc:
        return str(exc)


def _load_inputs(hf: Any, text_path: str | None, model_path: str | None, tokens: int, progress: bool,
                 attention: str) -> tuple[str, Any, Any, float, list[int]] | str:
    """Read the text, load the model and tokenize the first ``tokens`` tokens:
    ``(source, model, tokenizer, load_seconds, ids)``, or the message of what failed."""
    try:
        text, source = read_text(text_path)
    except (OSError, ValueError) as exc:
        return f"cannot read --text: {exc}"
    try:
        start = time.perf_counter()
        model, tokenizer = hf.load_model(model_path, progress=progress, attn_implementation=attention)
        load_seconds = time.perf_counter() - start
        ids = tokenize_prefix(tokenizer, text, tokens)
    except (ScissorhandsError, OSError) as exc:
        return str(exc)
    return source, model, tokenizer, load_seconds, ids


def check_paths(text: str | None, model: str | None, outputs: Sequence[tuple[str, str | None]],
                plots: Sequence[tuple[str, str | None]] = (), tokens: int | None = None) -> str | None:
    """Why the user's paths cannot work (before any model loads), or None: ``--text``
    must be a readable UTF-8 file holding more than whitespace (and, with ``tokens``,
    not too short for them: :func:`text_too_short`), ``--model`` must exist, each output
    (flag, path) must go into an existing, writable directory, and each plot also needs
    matplotlib and a format it writes (:mod:`scissorhands.commands.paths`)."""
    problem = input_problem("--text", text, text=True) or (
        None if tokens is None else text_too_short("--text", text, tokens))
    if problem:
        return problem
    problem = model_problem(model)
    if problem is not None:
        return problem if model is None else f"--model {problem}"
    for flag, path in outputs:
        problem = output_problem(flag, path)
        if problem:
            return problem
    for flag, path in plots:
        problem = plot_problem(flag, path)
        if problem:
            return problem
    return None


def text_too_short(flag: str, path: str | None, tokens: int) -> str | None:
    """Why the text file ``path`` cannot hold ``tokens`` tokens whatever the tokenizer,
    or None: a tokenizer gives at most about one token per byte (a byte-level BPE one
    byte per token at worst, SentencePiece's byte fallback the same) and a few special
    ones, so fewer than ``tokens / 2 - 8`` bytes is refused before the model loads
    (and its tokenizer with it); a text between that and ``tokens`` is counted after."""
    if path is None or not os.path.isfile(path):
        return None
    size = os.path.getsize(path)
    if 2 * size + 16 < tokens:
        return f"{flag} {path}: {size} bytes cannot hold {tokens} tokens"
    return None


def _check_counts(tokens: int, prompt_tokens: int, prompt_given: bool, least: int) -> str | None:
    """Why ``--tokens``/``--prompt-tokens`` cannot work, naming the flag the user gave."""
    if tokens < least:
        return f"--tokens must be at least {least}, got {tokens}"
    if prompt_tokens >= tokens:
        if prompt_given:
            return f"--prompt-tokens {prompt_tokens} must be below --tokens ({tokens})"
        return (f"--tokens {tokens} leaves nothing to decode after the prompt (--prompt-tokens, "
                f"default {prompt_tokens}): give more tokens or a shorter --prompt-tokens")
    return None


def _config_values(request: EvalRequest) -> dict[str, Any]:
    """The swept values as the JSON records them: the list given, or, for an option
    every policy taking it defaults alike, that default in a list (else None: each
    policy's own)."""
    out: dict[str, Any] = {}
    for option in OPTIONS:
        given = request.values.get(option.name)
        if given:
            out[option.name] = list(given)
            continue
        defaults = {spec.default(option.name) for spec in SPECS.values() if spec.takes(option.name)}
        out[option.name] = [defaults.pop()] if len(defaults) == 1 else None
    return out


#: The largest ``--hindsight`` window (the scheduler's limit, in decode steps).
MAX_HINDSIGHT = 2**31


@dataclass
class _EvalPlan:
    """An ``eval`` run, its arguments checked: the counts, budgets and configurations,
    and the batch after the full cache (each budget's runs, then its hindsight one as the
    budget itself)."""

    hf: Any
    tokens: int
    prompt_tokens: int
    window: int | None
    budgets: list[int]
    names: list[str]
    runs: list[Any]
    notes: list[str]
    batch: list[Any]


def _check_hindsight(window: Any, tokens: int, prompt_tokens: int) -> str | None:
    """Why ``--hindsight`` cannot work, or None (None is off)."""
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, numbers.Integral) or window < 1:
        return f"--hindsight must be a whole number of decode steps, at least 1, got {window!r}"
    if int(window) > MAX_HINDSIGHT:
        return f"--hindsight must be at most {MAX_HINDSIGHT} decode steps, got {window}"
    if tokens - 1 - prompt_tokens < 1:
        return (f"--hindsight {window} reads the decode steps, and --tokens {tokens} leaves none after the "
                f"prompt of {prompt_tokens} (the last token is only a target): give more tokens")
    return None


def _check_modes(hf: Any, request: EvalRequest) -> str | None:
    """Why ``--head-mode``, ``--cache-mode`` or ``--attention`` cannot work, or None."""
    if request.head_mode not in hf.HEAD_MODES:
        return f"--head-mode must be one of {', '.join(hf.HEAD_MODES)}, got {request.head_mode!r}"
    if request.cache_mode not in hf.CACHE_MODES:
        return f"--cache-mode must be one of {', '.join(hf.CACHE_MODES)}, got {request.cache_mode!r}"
    if request.attention not in hf.WRAPPED:
        return f"--attention must be one of {', '.join(hf.WRAPPED)}, got {request.attention!r}"
    return None


def _plan_eval(request: EvalRequest) -> _EvalPlan | str:
    """Every argument of ``eval`` checked, in the order the flags are explained: the
    plan, or the message of the first problem."""
    tokens = int(request.tokens)
    prompt_given = request.prompt_tokens is not None
    prompt_tokens = DEFAULT_PROMPT_TOKENS if request.prompt_tokens is None else int(request.prompt_tokens)
    window = request.hindsight
    problem = _check_counts(tokens, prompt_tokens, prompt_given, 3) or _check_hindsight(window, tokens, prompt_tokens)
    if problem:
        return problem
    budgets = sorted(set(request.budgets)) if request.budgets else default_budgets(tokens)
    if min(budgets) < 1 or max(budgets) > tokens - 1:
        given = "--budgets" if request.budgets else f"the default budgets (N/8, N/5 of --tokens {tokens})"
        return f"{given} must be in [1, {tokens - 1}] (targets are max(budgets)..N-1), got {budgets}"
    hf = _paths_then_hf(request.text, request.model, [("--json", request.json_path)], [("--plot", request.plot)],
                        tokens)
    if isinstance(hf, str):
        return hf
    problem = _check_modes(hf, request)
    if problem:
        return problem
    names = list(dict.fromkeys(request.policies))
    presets = [PRESETS[name] for name in names if name in PRESETS]
    try:
        runs, notes = sweep([name for name in names if name not in PRESETS], budgets, request.values)
        runs = with_presets(runs, presets, budgets, notes)
        for chosen in presets:
            if chosen.prompt_aware:
                fits = ("which every budget holds, so its end would evict nothing" if min(budgets) >= prompt_tokens
                        else "longer than some budgets: those rows evict while it is read")
                notes.append(f"{chosen.name} runs here without prompt_aware (eval reads a prompt of {prompt_tokens} "
                             f"tokens, {fits})")
        policy_classes(request.backend)
    except ScissorhandsError as exc:
        return str(exc)
    # The batch: each budget's configurations, then (with --hindsight) its hindsight one, by budget.
    batch: list[Any] = []
    for budget in budgets:
        batch += [run for run in runs[1:] if run.budget == budget]
        if window is not None:
            batch.append(budget)
    plan = _EvalPlan(hf, tokens, prompt_tokens, window, budgets, names, runs, notes, batch)
    config = _checkpoint_config(request.model)
    return plan if config is None else (_check_batch(plan, config, request) or plan)


def _checkpoint_config(model: str | None) -> Any:
    """The model's configuration when reading it costs nothing (a checkpoint
    directory's ``config.json``), else None (a GGUF file: its configuration comes with
    the model)."""
    if model is None or not os.path.isfile(os.path.join(model, "config.json")):
        return None
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(model)
    except (OSError, ValueError):
        return None  # the model load reports it


def in_flag_names(message: str) -> str:
    """A library message in the command line's terms: each option's name
    (``recent_window``, ``pool``) as its flag (``--recent-window``, ``--pool``)."""
    for option in OPTIONS:
        message = re.sub(rf"\b{option.name}\b", option.flag, message)
    return message


def _check_batch(plan: _EvalPlan, config: Any, request: EvalRequest) -> str | None:
    """Why the evicting configurations cannot run on a model of ``config`` (a pool that
    does not divide a sequence's rows, ...), or None: the cache the batch will run is
    built, holding nothing."""
    configs = [plan.hf.PolicyConfig(run.policy, run.budget, run.options, request.backend)
               for run in plan.batch if not isinstance(run, int)]
    if not configs:
        return None
    try:
        plan.hf.EvictingCache(config, configs=configs, head_mode=request.head_mode, cache_mode=request.cache_mode)
    except ScissorhandsError as exc:
        return in_flag_names(str(exc))
    return None


def _measure(plan: _EvalPlan, model: Any, ids: list[int], request: EvalRequest) -> tuple[list[dict[str, Any]], float]:
    """The full cache alone, then the batch: each sequence's measurements (the full
    cache's first) and the seconds the hindsight schedules took."""
    from tqdm import tqdm

    hf, window, prompt_tokens, backend = plan.hf, plan.window, plan.prompt_tokens, request.backend
    steps = plan.tokens - 1 - prompt_tokens + 1
    scheduler = None
    if window is not None:
        from scissorhands.hindsight import HindsightScheduler

        # The decode steps are positions prompt_tokens .. tokens - 2 (the last token is only a target).
        scheduler = HindsightScheduler(plan.budgets, int(window), prompt_tokens, plan.tokens - 2)
    batches = [plan.runs[:1], plan.batch] if plan.batch else [plan.runs[:1]]
    bar = tqdm(total=steps * len(batches), disable=not request.progress, unit="step", file=sys.stderr)
    measured: list[dict[str, Any]] = []
    schedule_seconds = 0.0
    for index, batch in enumerate(batches):
        bar.set_description("full cache" if index == 0 else f"{len(batch)} configurations")
        start = time.perf_counter()
        if index == 0:
            configs = [hf.PolicyConfig(run.policy, run.budget, run.options, backend) for run in batch]
            sink: dict[str, Any] = {} if scheduler is None else {"attention_sink": scheduler.push}
        else:
            finishing = time.perf_counter()
            schedules: dict[int, Any] = {} if scheduler is None else scheduler.finish()
            # The last W decisions (all of them when W covers the text) wait for the end.
            schedule_seconds += time.perf_counter() - finishing
            configs = [hf.HindsightConfig.of(schedules[item], backend) if isinstance(item, int)
                       else hf.PolicyConfig(item.policy, item.budget, item.options, backend) for item in batch]
            sink = {}
        out = hf.evaluate_batch(model, ids, configs, prompt_tokens=prompt_tokens, head_mode=request.head_mode,
                                cache_mode=request.cache_mode, progress=bar.update, **sink)
        wall = time.perf_counter() - start
        if index == 0 and scheduler is not None:
            schedule_seconds += out[0].get("tap_seconds", 0.0)
        for one in out:
            one["wall_seconds"] = wall
        measured.extend(out)
    bar.close()
    return measured, schedule_seconds


def _eval_results(plan: _EvalPlan, measured: list[dict[str, Any]], schedule_seconds: float,
                  ids: list[int]) -> list[dict[str, Any]]:
    """One result row per configuration (the full cache's first), summarised over the
    scored positions, with the perplexity ratio and the gap closed."""
    first_target = max(plan.budgets)
    target_ids = np.array(ids[1:], dtype=np.int64)
    window = plan.window
    results: list[dict[str, Any]] = []
    for item, result_measured in zip([plan.runs[0], *plan.batch], measured):
        if isinstance(item, int):
            result = {"policy": "hindsight", "budget": item, "hindsight_window": int(window or 0),
                      "label": f"W={window}"}
        else:
            result = item.as_dict()
            result["label"] = config_label(item.policy, item.values, item.window_spec)
        # measured[0] is the full-cache run: the reference for next-token agreement.
        result.update(_summarise(result_measured, first_target, measured[0]["argmax"], target_ids))
        result["wall_seconds"] = result_measured["wall_seconds"]
        if isinstance(item, int):
            result["schedule_ms_per_step"] = 1e3 * schedule_seconds / max(result_measured["decode_steps"], 1)
        results.append(result)
    full_ppl = results[0]["perplexity"]
    for result, gap in zip(results, gap_closed_percent(results)):
        result["perplexity_ratio_to_full"] = result["perplexity"] / full_ppl
        if result["policy"] != "full":
            result["gap_closed_percent"] = gap
    return results


#: What the columns of the eval table mean (printed under it).
_COLUMNS_EXPLANATION = (
    "perplexity/agree/top-1 over the scored positions; KV held per layer and head after "
    "each step; ms per decode step and sequence: policy calls (its own), cache bookkeeping "
    "(GQA mean, reordering, slots) and model forward (the batch's, per sequence); ovh %: "
    "policy + cache as a share of the forward; config: rw recent window in positions (and "
    "the fraction of the budget it came from, when given as one), sinks, hw history "
    "window, rate: evicting by votes per step held"
)


def _print_eval(plan: _EvalPlan, request: EvalRequest, results: list[dict[str, Any]], model_info: dict[str, Any],
                load_seconds: float, notes: list[str]) -> None:
    """The summary line, the table, what its columns mean and the notes, on stdout."""
    tokens, window, first_target = plan.tokens, plan.window, max(plan.budgets)
    summary = (
        f"{os.path.basename(model_info['path'])}: N={tokens} tokens (prompt {plan.prompt_tokens}), "
        f"scored on positions {first_target}..{tokens - 1} ({tokens - first_target} tokens); "
        f"head mode {request.head_mode}; cache mode {request.cache_mode}; backend {request.backend}; attention "
        f"{request.attention}; {len(plan.batch)} configurations in one batch; "
        + ("" if window is None else f"hindsight W={window}; ")
        + f"torch threads {plan.hf.environment()['torch_threads']}; model load {load_seconds:.1f} s"
    )
    print(summary)
    print(format_table(results))
    width = max(40, shutil.get_terminal_size().columns - 1)
    legend = _COLUMNS_EXPLANATION + ("" if window is None else HINDSIGHT_EXPLANATION.format(window=window))
    for clause in legend.split("; "):  # one clause a line, each wrapped to the terminal
        print(textwrap.fill(clause, width, subsequent_indent="  "))
    for note in notes:
        print(f"note: {note}")
    reading = what_to_read(results)
    if reading:
        print(textwrap.fill(reading, width, subsequent_indent="  "))
        print(textwrap.fill(CHOSEN_AT, width, subsequent_indent="  "))
        for line in NEXT_COMMANDS:
            print(line)


#: What to run after the main job (printed under its table).
NEXT_COMMANDS = (
    'next: python -m scissorhands generate "Name a planet."  # the recommendation (generate\'s default)',
    "next: python -m scissorhands generate --file doc.txt    # a document, its question at the end",
    "next: python examples/chat.py                           # a chat across turns on one bounded cache",
    "next: python -m scissorhands eval --tokens 2048         # the README's results (budget 409)",
)


def _delta(result: Mapping[str, Any], full: Mapping[str, Any]) -> str:
    return f"{result['perplexity']:.3f} ({100 * (result['perplexity'] / full['perplexity'] - 1):+.1f}%)"


def what_to_read(results: Sequence[Mapping[str, Any]]) -> str | None:
    """The line saying which row, number and comparison to read: the recommendation's
    perplexity at the largest budget it ran at, against StreamingLLM's and the seed's
    Scissorhands' there, each as a change from the full cache (None without a
    recommended row or a full cache)."""
    full = next((r for r in results if r["policy"] == "full"), None)
    ours = [r for r in results if r.get("preset") == RECOMMENDED.name]
    if full is None or not ours:
        return None
    row = max(ours, key=lambda r: r["budget"])
    budget = row["budget"]
    others = []
    for r in results:
        if r["budget"] != budget or r.get("preset"):
            continue
        if r["policy"] == "streaming-llm":
            others.append(f"streaming-llm {_delta(r, full)}")
        elif r["policy"] == "scissorhands" and r.get("recent_window") == 32 and r.get("sinks") == 0:
            others.append(f"the seed's scissorhands rw=32 sinks=0 {_delta(r, full)}")
    against = f" against {' and '.join(others)}" if others else ""
    return (f"read: row {RECOMMENDED.name} at budget {budget}, column perplexity (lower is better; "
            f"% vs full): {_delta(row, full)}{against}")


#: Under the reading line: where the recommendation was chosen (its numbers are in
#: docs/configuration.md, made by ``eval --tokens 2048``).
CHOSEN_AT = ("note: the recommendation was chosen over 2048 tokens at budget 409 (eval --tokens 2048: +7.4% "
             "against streaming-llm's +8.9% and the seed's +18.7%, docs/configuration.md); over fewer tokens "
             "the order can differ")


def _eval_document(plan: _EvalPlan, request: EvalRequest, results: list[dict[str, Any]], model_info: dict[str, Any],
                   source: str, ids: list[int], load_seconds: float, notes: list[str]) -> dict[str, Any]:
    """The ``eval --json`` document (format ``scissorhands.eval``, version 1)."""
    tokens, first_target = plan.tokens, max(plan.budgets)
    return {
        "format": "scissorhands.eval",
        "version": 1,
        "config": {
            "tokens": tokens,
            "prompt_tokens": plan.prompt_tokens,
            "budgets": plan.budgets,
            "policies": plan.names,
            "presets": {name: PRESETS[name].as_dict() for name in plan.names if name in PRESETS},
            **_config_values(request),
            "head_mode": request.head_mode,
            "cache_mode": request.cache_mode,
            "backend": request.backend,
            "attention": request.attention,
            "hindsight": plan.window,
            "scored_positions": [first_target, tokens - 1],
            "scored_tokens": tokens - first_target,
            "text": {
                "source": source,
                "token_ids_sha256": hashlib.sha256(np.asarray(ids, dtype="<i8").tobytes()).hexdigest(),
            },
            "model": model_info,
            "environment": plan.hf.environment(),
        },
        "model_load_seconds": load_seconds,
        "notes": notes,
        "results": results,
    }


def _write_json(path: str | os.PathLike[str], document: Mapping[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=2)
        handle.write("\n")


def run_eval(request: EvalRequest) -> int:
    """``python -m scissorhands eval``: perplexity and agreement per policy and budget.

    Every argument (counts, budgets, policies and options, paths, matplotlib and the
    format of a plot) is checked before the model loads; the configurations' fit to
    the model (a ``pool`` dividing a sequence's rows) before it loads when the model is
    a checkpoint directory, else right after, before any run.  The full cache runs
    alone (it is the reference for agreement, and the only run holding every position);
    every other configuration runs in one batch, each sequence with its own policy.
    With ``hindsight``, the full run also computes every budget's hindsight schedule
    from its attention, and the batch replays them (one more sequence per budget).
    Prints the table (and the notes).

    Returns the process exit status, 0.

    Raises
    ------
    ScissorhandsError
        A bad argument, before the work it would waste (the command line prints it
        under the command's usage, exit 2).
    """
    plan = _plan_eval(request)
    if isinstance(plan, str):
        return _fail(plan)
    plan.hf.set_threads(request.threads)
    loaded = _load_inputs(plan.hf, request.text, request.model, plan.tokens, request.progress, request.attention)
    if isinstance(loaded, str):
        return _fail(loaded)
    source, model, _tokenizer, load_seconds, ids = loaded
    problem = _check_batch(plan, model.config, request)
    if problem:
        return _fail(problem)
    measured, schedule_seconds = _measure(plan, model, ids, request)
    results = _eval_results(plan, measured, schedule_seconds, ids)
    model_info = plan.hf.model_info(model, request.model)
    notes = plan.notes
    if plan.window is not None:
        notes = [*notes, (
            f"hindsight W={plan.window}: its schedule (every budget's) was computed from the full run's attention "
            f"during and right after the full run, {1e3 * schedule_seconds / max(measured[0]['decode_steps'], 1):.3f} "
            "ms per decode step, "
            "left out of the full row's model ms; its policy ms is only the replay of the schedule")]
    _print_eval(plan, request, results, model_info, load_seconds, notes)
    if request.json_path:
        _write_json(request.json_path,
                    _eval_document(plan, request, results, model_info, source, ids, load_seconds, notes))
    if request.plot:
        plot_results(results, request.plot, title=f"N={plan.tokens}, head mode {request.head_mode}, scored "
                     f"{max(plan.budgets)}..{plan.tokens - 1}")
    return 0


def _check_layers(layers: Sequence[int], count: int) -> str | None:
    """Why ``--layers`` cannot be recorded from a model of ``count`` layers, or None."""
    layers = [int(i) for i in layers]
    if not layers or any(not 0 <= i < count for i in layers):
        return f"--layers must be in [0, {count - 1}], got {layers}"
    return None


def _save_trace(out: str, weights: Any, layers: list[int], prompt_tokens: int, model_info: dict[str, Any],
                source: str, ids: list[int], environment: dict[str, Any]) -> None:
    """Write ``record``'s trace with its metadata (:func:`scissorhands.commands.traces.save_recorded_trace`)."""
    from .traces import save_recorded_trace

    metadata = {
        "model": model_info,
        "text_source": source,
        "token_ids": [int(i) for i in ids],
        "head_reduction": "mean over the GQA group's query heads; the token's weight on itself "
        "excluded; not renormalised",
        "environment": environment,
    }
    # weights: float16 (len(layers), kv_heads, N (N - 1) / 2), step t at offset t (t - 1) / 2.
    save_recorded_trace(out, weights, layers, prompt_tokens=prompt_tokens,
                        model=os.path.basename(model_info["path"]), metadata=metadata)


def run_record(request: RecordRequest) -> int:
    """``python -m scissorhands record``: store a real model's full-cache attention trace.

    Per step ``t = 1..N-1``, per selected layer and KV head: the new token's attention
    over positions ``0..t-1`` (mean over the GQA group's query heads, its weight on
    itself excluded), float16, written through ``scissorhands.commands.traces.save_recorded_trace``.

    Returns the process exit status, 0.

    Raises
    ------
    ScissorhandsError
        A bad argument, before the work it would waste.
    """
    from tqdm import tqdm

    tokens = int(request.tokens)
    prompt_tokens = DEFAULT_PROMPT_TOKENS if request.prompt_tokens is None else int(request.prompt_tokens)
    if tokens < 2:
        return _fail(f"--tokens must be at least 2, got {tokens}")
    if prompt_tokens < 1:
        return _fail(f"--prompt-tokens must be at least 1, got {prompt_tokens}")
    hf = _paths_then_hf(request.text, request.model, [("--out", request.out)], tokens=tokens)
    if isinstance(hf, str):
        return _fail(hf)
    config = _checkpoint_config(request.model)
    if config is not None and request.layers is not None:  # the model's layers known before it loads
        problem = _check_layers(request.layers, int(config.get_text_config(decoder=True).num_hidden_layers))
        if problem:
            return _fail(problem)
    hf.set_threads(request.threads)
    progress = request.progress
    loaded = _load_inputs(hf, request.text, request.model, tokens, progress, request.attention)
    if isinstance(loaded, str):
        return _fail(loaded)
    source, model, _tokenizer, load_seconds, ids = loaded
    model_info = hf.model_info(model, request.model)
    layers = (list(range(model_info["layers"])) if request.layers is None
              else [int(i) for i in request.layers])
    problem = _check_layers(layers, model_info["layers"])
    if problem:
        return _fail(problem)
    bar = tqdm(total=tokens, disable=not progress, unit="token", desc="record", file=sys.stderr)
    start = time.perf_counter()
    weights = hf.record_attention(
        model, ids, layers=layers, prompt_tokens=prompt_tokens, progress=bar.update
    )
    bar.close()
    seconds = time.perf_counter() - start
    _save_trace(request.out, weights, layers, min(prompt_tokens, tokens), model_info, source, ids, hf.environment())
    print(
        f"recorded {tokens} tokens x {len(layers)} layers x {model_info['kv_heads']} KV heads "
        f"in {seconds:.1f} s (model load {load_seconds:.1f} s) -> {request.out}"
    )
    return 0
