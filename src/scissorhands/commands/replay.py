"""``python -m scissorhands replay``: a trace through each policy, as a table and a plot.

The trace is the canonical ``decode-4096`` (seed 7, :mod:`scissorhands.commands.traces`) or a
recorded real model's attention (``record``), one stream per (layer, KV head); the
measurement is :mod:`scissorhands.commands.harness`'s: retained attention mass and heavy-hitter
recall, before the policy acts, at every decode step.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scissorhands.options import POLICY_NAMES, SPECS, Run, policy_classes, setting, shown_values, sweep

from .harness import ReplayResult, prepare, replay, round6
from .paths import check_inputs_and_outputs
from .traces import decode_trace, load_recorded_trace

__all__ = ["DEFAULT_BUDGETS", "run_replay"]

#: Budgets replayed on ``decode-4096`` when none are given.
DEFAULT_BUDGETS = (256, 512, 1024)


@dataclass
class _Config:
    """One row of the table: a configuration and its results, one per stream."""

    run: Run
    results: list[ReplayResult] = field(default_factory=list)

    @property
    def policy(self) -> str:
        return self.run.policy

    @property
    def budget(self) -> int | None:
        return self.run.budget

    @property
    def params(self) -> dict[str, Any]:
        """The values the table names (the first option, then those set)."""
        return shown_values(self.run.policy, self.run.values) if self.run.values else {}


def _load_streams(trace: str | os.PathLike[str] | None,
                  budgets: Sequence[int] | None) -> tuple[list[Any], list[int], str, dict[str, Any]]:
    """The trace's streams, the budgets (the given ones, or the trace's defaults), the
    table's header and the JSON's description of the trace."""
    if not trace:
        canonical = decode_trace()
        header = f"{canonical.name} (seed {canonical.seed}): {canonical.steps} decode steps"
        trace_info: dict[str, Any] = {
            "name": canonical.name, "kind": "synthetic", "seed": canonical.seed,
            "num_positions": canonical.num_positions, "steps": canonical.steps, "streams": 1,
        }
        return [canonical], list(budgets or DEFAULT_BUDGETS), header, trace_info
    recorded_trace = load_recorded_trace(trace)
    streams = list(recorded_trace)
    n = recorded_trace.num_positions
    layers = sorted({int(x) for x in recorded_trace.layers})
    heads = sorted({int(x) for x in recorded_trace.heads})
    header = (
        f"{recorded_trace.name}: {len(streams)} streams (layers {_ranges(layers)}, KV heads "
        f"{_ranges(heads)}), {recorded_trace.steps} decode steps, "
        f"model {recorded_trace.model or '?'}"
    )
    trace_info = {
        "name": recorded_trace.name, "kind": "recorded", "path": str(trace),
        "model": recorded_trace.model, "num_positions": n, "steps": recorded_trace.steps,
        "prompt_tokens": recorded_trace.prompt_tokens, "streams": len(streams),
    }
    return streams, list(budgets or sorted({max(1, n // 8), max(1, n // 4), max(1, n // 2)})), header, trace_info


def _replay_all(configs: list[_Config], streams: list[Any], registry: Mapping[str, type], steps: int,
                progress: bool) -> float:
    """Every configuration over every stream (each stream prepared once), the results
    appended to each configuration; returns the seconds it took."""
    from tqdm import tqdm

    started = time.perf_counter()
    total = len(configs) * len(streams) * steps
    with tqdm(
        total=total, unit="step", unit_scale=True, desc="replay", file=sys.stderr,
        disable=True if not progress else None, leave=False,
    ) as bar:
        for stream in streams:
            prepared = prepare(stream)
            for config in configs:
                policy = registry[config.policy](budget=config.budget, **config.run.values)
                result = replay(policy, prepared, config.budget, name=config.policy,
                                progress=bar.update)
                config.results.append(result)
            del prepared
    return time.perf_counter() - started


def run_replay(
    policies: Sequence[str] = POLICY_NAMES,
    budgets: Sequence[int] | None = None,
    values: Mapping[str, Sequence[Any] | None] | None = None,
    *,
    backend: str = "native",
    trace: str | os.PathLike[str] | None = None,
    json_path: str | os.PathLike[str] | None = None,
    plot: str | os.PathLike[str] | None = None,
    progress: bool = True,
) -> int:
    """``python -m scissorhands replay``: replay a trace through each policy at each
    budget and print retained attention mass and heavy-hitter recall.

    Parameters
    ----------
    policies : sequence of str
        Registry names, in the order the table lists them.
    budgets : sequence of int, optional
        Default: 256, 512, 1024 on ``decode-4096``; N/8, N/4, N/2 on a recorded trace
        of N positions.
    values : mapping, optional
        Option name -> values to sweep (each a run; None or missing: each policy's
        default), as :func:`scissorhands.options.sweep` takes them.
    backend : {"native", "reference"}
    trace : path, optional
        A recorded ``.npz`` trace (``record``); default: the canonical ``decode-4096``.
    json_path, plot : path, optional
        Also write the rows as JSON / draw them (needs matplotlib).
    progress : bool
        A progress bar on stderr.

    Returns
    -------
    int
        0.

    Raises
    ------
    ScissorhandsError
        A path that cannot be read or written (the trace, the JSON, the plot), a
        configuration a policy refuses (naming it) or a trace that cannot be read;
        raised before any replay.
    """
    check_inputs_and_outputs(inputs=[("--trace", trace)], outputs=[("--json", json_path)], plots=[("--plot", plot)])
    registry = policy_classes(backend)
    streams, budgets, header, trace_info = _load_streams(trace, budgets)
    budgets = list(dict.fromkeys(budgets))
    header += f", {backend} backend"

    # Every configuration is checked (strict) before any replay.
    runs, _ = sweep(policies, budgets, values or {}, by="policy", strict=True)
    configs = [_Config(run) for run in runs]
    elapsed = _replay_all(configs, streams, registry, trace_info["steps"], progress)

    recorded = trace is not None
    rows = [_summarise(c, streams if recorded else None) for c in configs]
    print(header)
    print(_table(rows, recorded))
    print(f"{len(configs) * len(streams)} replays in {elapsed:.1f} s")

    if json_path:
        payload = {
            "format": "scissorhands.replay",
            "version": 1,
            "backend": backend,
            "trace": trace_info,
            "budgets": list(budgets),
            "results": rows,
        }
        with open(json_path, "w", encoding="utf-8") as fh:
            json.dump(payload, fh, indent=2)
            fh.write("\n")
    if plot:
        _plot(rows, budgets, header.rsplit(",", 1)[0], plot, recorded)
    return 0


def _ranges(values: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    parts: list[str] = []
    start = prev = None
    for v in values:
        if start is None:
            start = prev = v
        elif v == prev + 1:  # type: ignore[operator]
            prev = v
        else:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = v
    if start is not None:
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ", ".join(parts)


def _summarise(config: _Config, streams: list[Any] | None) -> dict[str, Any]:
    """One JSON-ready row; for a recorded trace, the mean and worst over streams."""
    results = config.results
    row: dict[str, Any] = {
        "policy": config.policy,
        "params": dict(config.params),
        "budget": config.budget,
    }
    if streams is None:
        (r,) = results
        row.update(
            retained_mass=r.retained_mass,
            heavy_hitter_recall=r.heavy_hitter_recall,
            eviction_calls=r.eviction_calls,
            steps=r.steps,
            policy_seconds=r.policy_seconds,
        )
        return row
    per_stream = [
        {
            "layer": s.layer,
            "head": s.head,
            "retained_mass": r.retained_mass,
            "heavy_hitter_recall": r.heavy_hitter_recall,
            "eviction_calls": r.eviction_calls,
            "policy_seconds": r.policy_seconds,
        }
        for s, r in zip(streams, results)
    ]
    worst_mass = min(per_stream, key=lambda d: d["retained_mass"])
    worst_recall = min(per_stream, key=lambda d: d["heavy_hitter_recall"])
    row.update(
        retained_mass=round6(math.fsum(d["retained_mass"] for d in per_stream) / len(per_stream)),
        heavy_hitter_recall=round6(
            math.fsum(d["heavy_hitter_recall"] for d in per_stream) / len(per_stream)
        ),
        worst_retained_mass=worst_mass["retained_mass"],
        worst_retained_mass_stream={"layer": worst_mass["layer"], "head": worst_mass["head"]},
        worst_heavy_hitter_recall=worst_recall["heavy_hitter_recall"],
        worst_heavy_hitter_recall_stream={
            "layer": worst_recall["layer"], "head": worst_recall["head"]
        },
        eviction_calls=sum(d["eviction_calls"] for d in per_stream),
        steps=results[0].steps,
        policy_seconds=math.fsum(d["policy_seconds"] for d in per_stream),
        streams=per_stream,
    )
    return row


def _table(rows: list[dict[str, Any]], recorded: bool) -> str:
    """An aligned plain-text table of the rows."""
    if recorded:
        head = ["policy", "setting", "budget", "mass mean", "mass worst", "(layer/head)",
                "recall mean", "recall worst", "(layer/head)", "policy time"]
    else:
        head = ["policy", "setting", "budget", "retained mass", "heavy-hitter recall",
                "evictions", "policy time"]
    body: list[list[str]] = []
    for r in rows:
        cells = [r["policy"], setting(r["policy"], r["params"]), "-" if r["budget"] is None else str(r["budget"])]
        if recorded:
            wm, wr = r["worst_retained_mass_stream"], r["worst_heavy_hitter_recall_stream"]
            cells += [
                f"{r['retained_mass']:.6f}", f"{r['worst_retained_mass']:.6f}",
                f"{wm['layer']}/{wm['head']}",
                f"{r['heavy_hitter_recall']:.6f}", f"{r['worst_heavy_hitter_recall']:.6f}",
                f"{wr['layer']}/{wr['head']}",
            ]
        else:
            cells += [f"{r['retained_mass']:.6f}", f"{r['heavy_hitter_recall']:.6f}",
                      str(r["eviction_calls"])]
        cells.append(_duration(r["policy_seconds"]))
        body.append(cells)
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    left = {0, 1}  # text columns; numbers right-aligned

    def fmt(row: list[str]) -> str:
        return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(head), rule, *(fmt(row) for row in body)])


def _duration(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _plot(
    rows: list[dict[str, Any]], budgets: Sequence[int], title: str, path: str | os.PathLike[str], recorded: bool
) -> None:
    """Retained mass and heavy-hitter recall against budget, one line per policy setting."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, NullLocator

    fig = Figure(figsize=(10, 4.2), layout="constrained")
    axes = fig.subplots(1, 2)
    metrics = [("retained_mass", "retained attention mass (mean over steps)"),
               ("heavy_hitter_recall", "heavy-hitter recall (top 32)")]
    series: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        series.setdefault((r["policy"], setting(r["policy"], r["params"])), []).append(r)
    colours = {name: spec.colour for name, spec in SPECS.items() if spec.colour}
    markers = ["o", "s", "^", "D", "v", "P"]
    seen_per_policy: dict[str, int] = {}
    for ax, (key, label) in zip(axes, metrics):
        seen_per_policy.clear()
        for (policy, setting_text), items in series.items():
            if policy == "full" or items[0]["budget"] is None:
                value = items[0][key]
                ax.axhline(value, color="0.4", linestyle="--", linewidth=1,
                           label="full cache")
                continue
            items = sorted(items, key=lambda d: d["budget"])
            idx = seen_per_policy.get(policy, 0)
            seen_per_policy[policy] = idx + 1
            colour = colours.get(policy, f"C{3 + idx}")
            xs = [d["budget"] for d in items]
            name = policy if setting_text == "-" else f"{policy} ({setting_text})"
            ax.plot(xs, [d[key] for d in items], marker=markers[idx % len(markers)],
                    color=colour, alpha=1.0 if idx == 0 else 0.65, label=name)
            if recorded:
                ax.plot(xs, [d[f"worst_{key}"] for d in items], linestyle=":",
                        marker=markers[idx % len(markers)], markersize=3, color=colour,
                        alpha=0.8)
        ax.set_xscale("log", base=2)
        ticks = sorted(set(budgets))
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([str(b) for b in ticks])
        ax.set_xlabel("cache budget (positions)")
        ax.set_ylabel(label)
        ax.grid(True, which="major", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    if recorded:
        unique["worst (layer, KV head)"] = Line2D([], [], color="0.3", linestyle=":")
    fig.legend(list(unique.values()), list(unique.keys()), loc="outside lower center",
               ncol=min(len(unique), 4), frameon=False)
    if recorded:
        title += "\nsolid: mean over (layer, KV head) streams; dotted: worst stream"
    fig.suptitle(title, fontsize=11)
    fig.savefig(path, dpi=150)


