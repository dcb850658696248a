"""``python -m scissorhands report``: several ``eval --json`` files as one table and plot.

Rows are configurations (a policy and its options, a recent window given as a fraction
of the budget staying one row across budgets), columns are (text, budget) pairs, each
cell a perplexity and its change against the same text's full cache.  Files measured
on other tokens, prompt, scored positions, head mode or model are refused: their
perplexities do not compare.  Files of ``eval --hindsight`` add the hindsight rows and,
after each (text, budget) column where one is measured, a gap-closed column
(:func:`scissorhands.hindsight.gap_closed`, each cell from the file its perplexity came
from).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from scissorhands.errors import ScissorhandsError
from scissorhands.hindsight import gap_closed_percent
from scissorhands.options import POLICY_NAMES, SPECS, series_label, spec_fraction

from .paths import check_inputs_and_outputs

__all__ = ["combine_reports", "format_longctx", "format_report", "plot_longctx", "plot_report", "run_report"]

#: The ``format`` of ``tasks --json`` documents (:mod:`scissorhands.commands.retrieval.driver`).
TASKS_FORMAT = "scissorhands.tasks"
#: The policy name of ``eval --hindsight``'s reference rows.
HINDSIGHT = "hindsight"


# --------------------------------------------------------------------------- reporting


def _values(result: Mapping[str, Any]) -> dict[str, Any]:
    """A result row's option values (the sinks of older documents, recorded as None,
    read as the policy's default, its registry entry's (see
    :data:`scissorhands.options.SPECS`); an option a document predates, such as
    ``pool``, read as its default)."""
    spec = SPECS[result["policy"]]
    values = {o.name: result.get(o.name, spec.default(o.name)) for o in spec.options}
    if values.get("sinks", 0) is None:
        values["sinks"] = spec.default("sinks")
    return values


def _window_spec(result: Mapping[str, Any]) -> str | None:
    """A fractional recent window as a percentage (``0.5x`` and ``50%`` are one row)."""
    spec = result.get("recent_window_spec")
    return None if spec is None else f"{float(100 * spec_fraction(spec)):g}%"


def _report_series(result: Mapping[str, Any]) -> str:
    """A result's configuration across budgets and files (a report row)."""
    if result["policy"] == HINDSIGHT:
        return f"hindsight W={result['hindsight_window']}"
    return series_label(result["policy"], _values(result), _window_spec(result))


def _report_order(result: Mapping[str, Any]) -> tuple[Any, ...]:
    """Where a configuration's row goes in a report: by policy, then its options in
    constructor order (a recent window in positions before fractions of the budget);
    the hindsight reference last, by window."""
    if result["policy"] == HINDSIGHT:
        return (len(POLICY_NAMES), result["hindsight_window"])
    key: list[Any] = [POLICY_NAMES.index(result["policy"])]
    values = _values(result)
    for option in SPECS[result["policy"]].options:
        value = values[option.name]
        if option.name == "recent_window":
            spec = result.get("recent_window_spec")
            key.append((0, Fraction(int(value or 0))) if spec is None else (1, spec_fraction(spec)))
        elif option.name == "pool":  # rows per pool, then the scopes (layer before model)
            key.append((1, ("layer", "model").index(value), 0) if isinstance(value, str) else (0, 0, value))
        elif option.default is None:  # off (None) before any value
            key.append((value is not None, value or 0))
        else:
            key.append(value or 0)
    return tuple(key)


def _check_result(result: Any, where: str) -> None:
    """A result row of an eval document: a known policy (or the hindsight reference,
    with a positive integer window), an integer budget (None for the full cache only)
    and a finite, positive perplexity."""
    if not isinstance(result, dict) or result.get("policy") not in (*POLICY_NAMES, HINDSIGHT):
        raise ScissorhandsError(f"{where}: a result is not an eval result row")
    window = result.get("hindsight_window")
    if result["policy"] == HINDSIGHT and (type(window) is not int or window < 1):
        raise ScissorhandsError(f"{where}: hindsight window {window!r} is not a positive integer")
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


def _eval_document(doc: Any, where: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(config, results)`` of an ``eval --json`` document, each result row checked
    (:func:`_check_result`)."""
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
    return config, results


def _setup(config: Mapping[str, Any]) -> tuple[Any, ...]:
    """What must agree for perplexities to compare: tokens, prompt, head mode, scored
    positions and the model's file name."""
    model = config.get("model")
    return tuple(config.get(k) for k in ("tokens", "prompt_tokens", "head_mode", "scored_positions")) + (
        os.path.basename(str(model.get("path") if isinstance(model, dict) else model)),)


def combine_reports(documents: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Merge ``eval --json`` documents into one grid of perplexities.

    Columns are (text, budget) pairs, texts told apart by the SHA-256 of their token ids
    and named after their source; rows are configurations (:func:`_report_series`), the
    full cache first, then the policies in the registry's order (see
    :data:`scissorhands.options.SPECS`), each by recent window
    (in positions before fractions of the budget), sinks, history window and vote rate.
    A configuration measured twice keeps its first value, and a note says so when the
    two differ.

    Returns
    -------
    dict
        ``columns`` (list of ``(text name, budget)``), ``rows`` (list of labels),
        ``full`` (text name -> full-cache perplexity), ``cells`` (``(label, column)`` ->
        perplexity), ``gaps`` (``(label, column)`` -> gap closed in percent, from the
        file the cell's perplexity came from: its StreamingLLM and hindsight rows of
        that budget, :func:`scissorhands.hindsight.gap_closed_percent`; absent where it
        has none), ``gap_columns`` (the columns with a hindsight row) and ``notes``
        (list of str).

    Raises
    ------
    ScissorhandsError
        A document is not an eval result (or a field of it is malformed), lacks the
        full-cache run, holds no other run, or was measured with other tokens, prompt,
        scored positions, head mode or model than the first.
    """
    setup = None
    names: dict[str, str] = {}
    full: dict[str, float] = {}
    cells: dict[tuple[str, tuple[str, int]], float] = {}
    gaps: dict[tuple[str, tuple[str, int]], float] = {}
    gap_columns: set[tuple[str, int]] = set()
    rows: dict[str, tuple[Any, ...]] = {}
    budgets: dict[str, set[int]] = {}
    notes: list[str] = []
    for index, doc in enumerate(documents):
        where = f"file {index + 1}"
        config, results = _eval_document(doc, where)
        this = _setup(config)
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
        for r, gap in zip(results, gap_closed_percent(results)):
            if r["policy"] == "full":
                continue
            label = _report_series(r)
            rows.setdefault(label, _report_order(r))
            column = (name, int(r["budget"]))
            budgets.setdefault(name, set()).add(int(r["budget"]))
            if r["policy"] == HINDSIGHT:
                gap_columns.add(column)
            if (label, column) not in cells and gap is not None:
                gaps[(label, column)] = gap
            old = cells.setdefault((label, column), r["perplexity"])
            if abs(old / r["perplexity"] - 1) > 1e-9:
                notes.append(f"{label} at {column[1]} on {name}: {r['perplexity']:.6f} in file "
                             f"{index + 1} differs from {old:.6f}; the first is kept")
    labels = sorted(rows, key=lambda lab: rows[lab])
    columns = [(name, b) for name in dict.fromkeys(names.values()) for b in sorted(budgets.get(name, ()))]
    if not columns:
        raise ScissorhandsError("the files hold only full-cache runs: nothing to compare")
    return {"columns": columns, "rows": labels, "full": full, "cells": cells, "gaps": gaps,
            "gap_columns": [c for c in columns if c in gap_columns], "notes": notes}


def format_report(report: dict[str, Any], markdown: bool = False) -> str:
    """The combined grid as text: one row per configuration, one column per (text,
    budget), each cell the perplexity and its change against the full cache (``-``: not
    measured). In Markdown the best configuration of each column (the hindsight
    reference aside) is bold.  After a column with a hindsight row, ``gap @budget``:
    each configuration's gap closed in percent (``-``: none); without hindsight rows the
    table is what it was before they existed."""
    columns, full, cells = report["columns"], report["full"], report["cells"]
    gaps, gap_columns = report.get("gaps", {}), set(report.get("gap_columns", ()))
    best = {}
    for column in columns:
        measured = [(cells[(lab, column)], lab) for lab in report["rows"]
                    if (lab, column) in cells and not lab.startswith(HINDSIGHT + " ")]
        if measured:
            best[column] = min(measured)[1]

    def cell(label: str, column: tuple[str, int]) -> str:
        if (label, column) not in cells:
            return "-"
        value = cells[(label, column)]
        text = f"{value:.3f} ({100 * (value / full[column[0]] - 1):+.1f}%)"
        return f"**{text}**" if markdown and best.get(column) == label else text

    def cells_of(label: str, column: tuple[str, int]) -> list[str]:
        if column not in gap_columns:
            return [cell(label, column)]
        gap = gaps.get((label, column))
        return [cell(label, column), "-" if gap is None else f"{gap:.1f}%"]

    head = ["configuration"]
    for name, budget in columns:
        head += [f"{name} @{budget}"] + ([f"gap @{budget}"] if (name, budget) in gap_columns else [])
    body = [["full cache"] + [text for name, budget in columns
                              for text in [f"{full[name]:.3f}"] + (["-"] if (name, budget) in gap_columns else [])]]
    body += [[label] + [text for column in columns for text in cells_of(label, column)] for label in report["rows"]]
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
    axis, one marker per budget; the hindsight reference's rows with stars, a dotted
    line joining its budgets."""
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
                      for lab, y in zip(labels, ys) if (lab, (name, budget)) in cells
                      and not lab.startswith(HINDSIGHT + " ")]
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], linestyle="none",
                        marker=markers[j % len(markers)], color=f"C{j}", label=f"budget {budget}")
            reference = [(100 * (cells[(lab, (name, budget))] / full[name] - 1), y)
                         for lab, y in zip(labels, ys) if (lab, (name, budget)) in cells
                         and lab.startswith(HINDSIGHT + " ")]
            if reference:
                ax.plot([p[0] for p in reference], [p[1] for p in reference], linestyle="none", marker="*",
                        markersize=11, color=f"C{j}", label=f"hindsight, budget {budget}")
        for lab, y in zip(labels, ys):
            if lab.startswith(HINDSIGHT + " "):
                xs = [100 * (cells[(lab, (name, b))] / full[name] - 1) for b in budgets if (lab, (name, b)) in cells]
                if len(xs) > 1:
                    ax.plot([min(xs), max(xs)], [y, y], linestyle=":", color="0.4", linewidth=1, zorder=0)
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


def _table_and_plot(table: Any, draw: Any, documents: list[Any], markdown: bool,
                    plot: str | os.PathLike[str] | None) -> int:
    """Print ``table(documents)`` and draw ``draw(documents, plot)`` when asked, a malformed
    field in any file refused as the library's error."""
    try:
        print(table(documents, markdown=markdown))
        if plot:
            draw(documents, plot)
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError) as exc:
        raise ScissorhandsError(f"cannot combine the files: malformed field ({exc!r})") from None
    return 0


def run_report(files: Sequence[str | os.PathLike[str]], markdown: bool = False,
               plot: str | os.PathLike[str] | None = None) -> int:
    """``python -m scissorhands report``: combine ``eval --json`` files into one table
    (``markdown`` for a Markdown one, the best of each column in bold) printed on
    stdout and, with ``plot``, one figure saved there; or, given ``longctx --json``
    files, their long-context table and plot. Returns 0.

    Raises
    ------
    ScissorhandsError
        A file cannot be read, is not an eval result, or does not compare with the
        others, or the plot cannot be written there (the CLI prints it on one line and
        exits 2); every file and the plot's path are checked before any is combined.
    """
    check_inputs_and_outputs(inputs=[("", path) for path in files], plots=[("--plot", plot)])
    documents = []
    for path in files:
        try:
            with open(path, encoding="utf-8") as handle:
                documents.append(json.load(handle))
        except (OSError, ValueError) as exc:
            raise ScissorhandsError(f"cannot read {path}: {exc}") from None
    kinds: dict[str, str] = {}
    for path, doc in zip(files, documents):
        kind = doc.get("format") if isinstance(doc, dict) else None
        if kind not in ("scissorhands.eval", "scissorhands.longctx", TASKS_FORMAT):
            raise ScissorhandsError(f"{path} is not a 'scissorhands eval --json', 'longctx --json' or "
                                    "'tasks --json' result")
        kinds.setdefault(kind, os.fspath(path))
    if len(kinds) > 1:
        first, second = list(kinds.items())[:2]
        raise ScissorhandsError(f"{first[1]} is a {first[0]} result and {second[1]} a {second[0]} result: "
                                "report combines one kind")
    if TASKS_FORMAT in kinds:
        from .retrieval.driver import format_tasks, plot_tasks

        return _table_and_plot(format_tasks, plot_tasks, documents, markdown, plot)
    if "scissorhands.longctx" in kinds:
        return _table_and_plot(format_longctx, plot_longctx, documents, markdown, plot)
    try:
        report = combine_reports(documents)
        table = format_report(report, markdown=markdown)
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError) as exc:
        # combine_reports checks the fields it knows; anything else malformed lands here.
        raise ScissorhandsError(f"cannot combine the files: malformed field ({exc!r})") from None
    print(table)
    if report["gap_columns"]:
        print("note: gap @budget: the share of streaming-llm's perplexity gap to hindsight a configuration "
              "closes, 100 * (streaming-llm - it) / (streaming-llm - hindsight), from the file it was "
              "measured in (streaming-llm at 4 sinks when there); 100% as good as hindsight, above 100% "
              "better (hindsight is greedy, not a bound); - without both in that file or when hindsight "
              "is not better")
    for note in report["notes"]:
        print(f"note: {note}")
    if plot:
        plot_report(report, plot)
    return 0


# ----------------------------------------------------------------------------- long context


def _longctx_runs(documents: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs of ``longctx --json`` documents, checked to compare (same text, window
    and chunk)."""
    setup = None
    runs: list[dict[str, Any]] = []
    for index, doc in enumerate(documents):
        where = f"file {index + 1}"
        if not isinstance(doc, dict) or doc.get("format") != "scissorhands.longctx" or doc.get("version") != 1:
            raise ScissorhandsError(f"{where} is not a 'scissorhands longctx --json' result")
        config = doc.get("config") or {}
        this = (config.get("text", {}).get("token_ids_sha256"), config.get("window"), config.get("chunk"))
        if setup is None:
            setup = this
        elif this != setup:
            raise ScissorhandsError(f"{where} was measured on another text, window or chunk than the first")
        runs.extend(doc.get("results") or [])
    return runs


def _run_name(run: Mapping[str, Any]) -> str:
    if run["policy"] == "full":
        return "full cache"
    name = f"{run['policy']}@{run['budget']} {run.get('label', '')}".strip()
    return name + (" positions=cache" if run.get("positions") == "cache" else "")


def format_longctx(documents: Sequence[dict[str, Any]], markdown: bool = False) -> str:
    """``longctx`` runs as one table: a row per configuration and context length: ms per
    decode step, the policy's and the cache's bookkeeping share of it (``ovh %``), the
    re-rotation of ``positions="cache"`` (ms per step), KV positions and MB held,
    resident MB, the window's perplexity and its change against the full cache at that
    length."""
    runs = _longctx_runs(documents)
    full = {row["length"]: row for run in runs if run["policy"] == "full" for row in run["rows"]}
    head = ["configuration", "context", "ms/step", "ovh %", "rerotate ms", "KV held", "KV MB", "RSS MB",
            "perplexity", "vs full"]
    body = []
    for run in runs:
        for row in run["rows"]:
            ppl = row.get("perplexity")
            base = full.get(row["length"], {}).get("perplexity")
            change = "-" if ppl is None or base is None else f"{100 * (ppl / base - 1):+.1f}%"
            overhead, rerotate = "-", "-"
            if "policy_ms_per_step" in row:
                share = (row["policy_ms_per_step"] + row["bookkeeping_ms_per_step"]) / row["ms_per_step"]
                overhead = f"{100 * share:.2f}"
                if run.get("positions") == "cache":
                    rerotate = f"{row['rerotate_ms_per_step']:.1f}"
            body.append([_run_name(run), str(row["length"]), f"{row['ms_per_step']:.1f}", overhead, rerotate,
                         str(row["kv_positions"]), f"{row['kv_bytes'] / 2**20:.1f}",
                         f"{row['rss_bytes'] / 2**20:.0f}", "-" if ppl is None else f"{ppl:.3f}", change])
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body])
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    fmt = lambda row: "  ".join(  # noqa: E731
        c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
    return "\n".join([fmt(head), "  ".join("-" * w for w in widths), *map(fmt, body)])


def plot_longctx(documents: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """Step time and KV memory against context length (and the window's perplexity),
    one line per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    runs = _longctx_runs(documents)
    fig = Figure(figsize=(13.5, 4.2), layout="constrained")
    axes = fig.subplots(1, 3)
    for index, run in enumerate(runs):
        rows = run["rows"]
        xs = [r["length"] for r in rows]
        style = dict(marker="o", color=f"C{index}", label=_run_name(run),
                     linestyle="--" if run["policy"] == "full" else "-")
        axes[0].plot(xs, [r["ms_per_step"] for r in rows], **style)
        axes[1].plot(xs, [r["kv_bytes"] / 2**20 for r in rows], **style)
        axes[2].plot(xs, [r.get("perplexity") or float("nan") for r in rows], **style)
    for ax, label in zip(axes, ("ms per decode step", "KV cache held (MB)", "window perplexity")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    axes[1].set_yscale("log")
    axes[2].set_yscale("log")  # past the trained context, true positions go off the scale
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 3), fontsize=8, frameon=False)
    fig.savefig(path, dpi=120)
