"""What ``eval`` reports (:mod:`scissorhands.commands.evaluate` runs it): each
configuration's row summarised from its measurements over the scored positions, the
table and what its columns mean, the plot of perplexity against budget, the lines saying
what to read and run next, and the ``--json`` document (format ``scissorhands.eval``).

No torch, no argparse: the rows are plain dictionaries.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import textwrap
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from scissorhands.hindsight import gap_closed_percent
from scissorhands.options import OPTIONS, PRESETS, RECOMMENDED, SPECS, config_label, series_label

if TYPE_CHECKING:
    from .eval_request import EvalRequest, _EvalPlan

__all__ = ["eval_document", "eval_results", "format_table", "plot_results", "print_eval", "what_to_read", "write_json"]


#: What the table's hindsight row and gap column mean (after the columns' explanation).
HINDSIGHT_EXPLANATION = (
    "; hindsight W={window}: at each step evicts the held position the next {window} decode steps of the full "
    "run attend to least (greedy, a reference, not a bound); gap %: the share of streaming-llm's perplexity "
    "gap to hindsight a row closes at its budget, 100 * (streaming-llm - row) / (streaming-llm - hindsight): "
    "100 as good as hindsight, above 100 better than it, - without both or when hindsight is not better"
)


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


def eval_results(plan: _EvalPlan, measured: list[dict[str, Any]], schedule_seconds: float,
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


def print_eval(plan: _EvalPlan, request: EvalRequest, results: list[dict[str, Any]], model_info: dict[str, Any],
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


def eval_document(plan: _EvalPlan, request: EvalRequest, results: list[dict[str, Any]], model_info: dict[str, Any],
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


def write_json(path: str | os.PathLike[str], document: Mapping[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=2)
        handle.write("\n")

