"""``python -m bench``: select cases, run them, print the tables, write the JSON."""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import gc
import json
import sys
import time
from typing import Any

from bench.cases import CASES, Case, Context
from bench.report import evaluate_targets, format_report, machine_info
from bench.timing import Settings, loop_overhead_ns, timer_overhead_ns
from scissorhands.commands.paths import output_problem

__all__ = ["FULL", "QUICK", "main", "run", "select_cases"]

#: Timing of a full run: repeats of >= 0.25 ms per implementation, up to 101 rounds
#: within 0.5 s per case.
FULL = Settings(target_ns=250_000, repeats=101, min_repeats=5, budget_ns=500_000_000)
#: Timing of a smoke run (``--quick``): a few seconds in all.
QUICK = Settings(target_ns=200_000, repeats=5, min_repeats=3, budget_ns=20_000_000, max_call_ns=5_000_000,
                 slow_repeats=2)

#: The JSON report's layout version.
REPORT_VERSION = 1


def select_cases(patterns: list[str] | None) -> list[Case]:
    """Cases matching any pattern: an exact name, a glob (``decode/*/512``) or a prefix
    ending at a ``/`` (``decode``, ``batch/h2o``); all cases when ``patterns`` is empty.

    Raises
    ------
    ValueError
        A pattern that matches no case.
    """
    if not patterns:
        return list(CASES)
    chosen: list[Case] = []
    for pattern in patterns:
        hits = [c for c in CASES if c.name == pattern or fnmatch.fnmatchcase(c.name, pattern)
                or c.name.startswith(pattern.rstrip("/") + "/")]
        if not hits:
            raise ValueError(f"no case matches {pattern!r} (see --list)")
        chosen += [c for c in hits if c not in chosen]
    return [c for c in CASES if c in chosen]  # run order


def _reference(ctx: Context) -> None:
    try:
        import scissorhands.reference as reference

        missing = [n for n in ("scissorhands", "h2o", "streaming-llm") if n not in getattr(reference, "POLICIES", {})]
        if missing:
            raise ImportError(f"scissorhands.reference.POLICIES lacks {missing}")
        ctx.reference = reference
    except Exception as exc:  # any failure to import the reference only drops that baseline
        ctx.reference = None
        ctx.note(f"reference baseline skipped: scissorhands.reference is not usable ({exc})")


def run(cases: list[Case], quick: bool = False, progress: Any = None) -> dict[str, Any]:
    """Run ``cases`` and return the report (plain data, as written to ``--json``)."""
    start = time.perf_counter()
    settings = QUICK if quick else FULL
    machine = machine_info()
    ctx = Context(settings=settings, quick=quick, loop_ns=loop_overhead_ns(samples=3 if quick else 9,
                                                                           number=50_000 if quick else 200_000),
                  timer_ns=timer_overhead_ns(2_001 if quick else 20_001))
    _reference(ctx)
    results = []
    for i, case in enumerate(cases, 1):
        t0 = time.perf_counter()
        gc.collect()
        gc.disable()
        try:
            results.append(case.run(ctx, case))
        finally:
            gc.enable()
        if progress is not None:
            print(f"[{i}/{len(cases)}] {case.name}: {time.perf_counter() - t0:.2f} s", file=progress, flush=True)
    return {
        "format": "scissorhands.bench",
        "version": REPORT_VERSION,
        "quick": quick,
        "machine": machine,
        "settings": dataclasses.asdict(settings),
        "loop_overhead_ns": round(ctx.loop_ns, 2),
        "timer_overhead_ns": round(ctx.timer_ns, 2),
        "reference": ctx.reference is not None,
        "results": results,
        "targets": evaluate_targets(results, machine),
        "notes": ctx.notes,
        "elapsed_s": round(time.perf_counter() - start, 2),
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bench``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Time the scissorhands C core through the Python API against the pure-Python "
                    "reference, a numpy baseline, the no-op cffi call and a memory-bandwidth floor.",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: a few seconds in all")
    parser.add_argument("--json", metavar="PATH", help="write every figure (and machine info) to PATH")
    parser.add_argument("--case", metavar="NAME", action="append",
                        help="run only this case (exact name, glob or prefix such as 'decode'); repeatable")
    parser.add_argument("--list", action="store_true", help="list the case names and exit")
    args = parser.parse_args(argv)
    if args.list:
        for case in CASES:
            print(case.name)
        return 0
    try:
        cases = select_cases(args.case)
    except ValueError as exc:
        parser.error(str(exc))
    problem = output_problem("--json", args.json)
    if problem:  # before the run, not after it
        parser.error(problem)
    skipped = []
    if args.quick and not args.case:
        skipped = [c.name for c in cases if not c.quick]
        cases = [c for c in cases if c.quick]
    report = run(cases, quick=args.quick, progress=sys.stderr)
    if skipped:
        report["notes"].append(f"--quick skips {', '.join(skipped)} (name them with --case to run them)")
    print(format_report(report))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
    return 0
