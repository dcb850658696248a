"""Timing helpers: calibrated batches, single calls between untimed set-ups, statistics.

Two ways to time a call:

* :func:`time_batch` for calls that can follow one another (a decode step in the
  steady state): ``run(number)`` times ``number`` calls in one tight loop and returns the
  elapsed nanoseconds; the per-call figure of one repeat is ``elapsed / number`` minus
  the cost of an empty loop iteration.
* :func:`time_each` for calls that need an untimed set-up before each one (an eviction,
  which must first be given something to evict): ``prepare()`` restores the state and
  returns ``(f, args)``; only ``f(*args)`` is timed, by a ``perf_counter_ns`` pair whose
  own cost is subtracted; the per-call figure of one repeat is the median of its samples.

Either way: a warm-up (the calibration runs count as such), then ``repeats`` repeats;
:class:`Stat` holds the median over repeats and the spread (quartiles, min, max).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "Settings",
    "Stat",
    "loop_overhead_ns",
    "time_batch",
    "time_batches",
    "time_each",
    "time_eaches",
    "timer_overhead_ns",
]

_clock = time.perf_counter_ns


@dataclass(frozen=True)
class Settings:
    """How long to time one implementation on one case.

    Each repeat lasts at least ``target_ns`` (or is one call, when a call takes longer
    than ``max_call_ns``: then ``slow_repeats`` repeats). Short repeats, many of them,
    and their median: a repeat that the scheduler interrupts is an outlier the median
    ignores, where one long run would average it in. There are ``repeats`` repeats, or
    fewer (never below ``min_repeats``) when they would take more than ``budget_ns``.
    """

    target_ns: int = 1_000_000
    repeats: int = 31
    min_repeats: int = 5
    budget_ns: int = 400_000_000
    #: A call slower than this gets ``slow_repeats`` repeats of one call.
    max_call_ns: int = 50_000_000
    slow_repeats: int = 3

    def repeats_for(self, repeat_ns: float) -> int:
        """Repeats of ``repeat_ns`` each that fit the budget (within the bounds)."""
        return max(self.min_repeats, min(self.repeats, int(self.budget_ns / max(repeat_ns, 1))))


@dataclass(frozen=True)
class Stat:
    """Per-call time in nanoseconds over ``repeats`` repeats of ``number`` calls."""

    median_ns: float
    q1_ns: float
    q3_ns: float
    min_ns: float
    max_ns: float
    repeats: int
    number: int

    @classmethod
    def of(cls, per_call: list[float], number: int) -> Stat:
        """Summarise per-call figures (one per repeat)."""
        xs = sorted(per_call)
        if len(xs) >= 2:
            q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
        else:
            q1 = q3 = xs[0]
        return cls(statistics.median(xs), q1, q3, xs[0], xs[-1], len(xs), number)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the JSON report."""
        return {k: (round(v, 1) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def loop_overhead_ns(samples: int = 9, number: int = 200_000) -> float:
    """Nanoseconds of one empty ``for pos, a in seq`` iteration (the minimum over
    ``samples`` runs: a constant cost, which interruptions only inflate)."""
    seq = [(i, None) for i in range(number)]

    def run() -> int:
        t0 = _clock()
        for _pos, _a in seq:
            pass
        return _clock() - t0

    return min(run() / number for _ in range(samples))


def timer_overhead_ns(samples: int = 20_001) -> float:
    """Median nanoseconds between two back-to-back ``perf_counter_ns`` calls (the
    clock ticks in steps, so the median, not the minimum, is its typical cost)."""
    clock = _clock
    out = []
    for _ in range(samples):
        t0 = clock()
        t1 = clock()
        out.append(t1 - t0)
    return statistics.median(out)


Prepare = Callable[[], tuple[Callable[..., Any], tuple[Any, ...]]]


def _calibrate(run: Callable[[int], int], settings: Settings) -> tuple[int, int]:
    """(number, elapsed ns) with one run of ``number`` calls lasting ``settings.target_ns``;
    number 0 when a single call exceeds ``settings.max_call_ns``. Doubles as the warm-up."""
    number = 1
    run(number)
    elapsed = run(number)
    if elapsed > settings.max_call_ns:
        return 0, elapsed
    while elapsed < settings.target_ns:
        # Jump close to the target, at most 10x at a time.
        grow = min(10.0, max(2.0, settings.target_ns / max(elapsed, 1)))
        number = int(number * grow) + 1
        elapsed = run(number)
    return number, elapsed


def time_batches(runs: dict[str, Callable[[int], int]], settings: Settings,
                 overhead_ns: float = 0.0) -> dict[str, Stat]:
    """Time several implementations of the same call, interleaved.

    ``runs[name](number)`` performs ``number`` calls and returns the elapsed ns. Each is
    calibrated (``number`` grows until a run lasts ``settings.target_ns``: the warm-up),
    then the repeats go round-robin over the implementations, so that a slow spell of
    the machine (another process, a sibling hyperthread) touches all of them alike and
    their ratios stay meaningful. ``overhead_ns`` (the empty loop) is subtracted from
    each per-call figure. An implementation slower than ``settings.max_call_ns`` per
    call is timed apart, ``settings.slow_repeats`` single calls.
    """
    numbers: dict[str, int] = {}
    out: dict[str, Stat] = {}
    round_ns = 0
    for name, run in runs.items():
        number, elapsed = _calibrate(run, settings)
        if number == 0:
            per = [elapsed - overhead_ns] + [run(1) - overhead_ns for _ in range(settings.slow_repeats - 1)]
            out[name] = Stat.of(per, 1)
        else:
            numbers[name] = number
            round_ns += elapsed
    per_call: dict[str, list[float]] = {name: [] for name in numbers}
    for _ in range(settings.repeats_for(round_ns) if numbers else 0):
        for name, number in numbers.items():
            per_call[name].append(runs[name](number) / number - overhead_ns)
    out.update({name: Stat.of(per_call[name], numbers[name]) for name in numbers})
    return {name: out[name] for name in runs}


def time_batch(run: Callable[[int], int], settings: Settings, overhead_ns: float = 0.0) -> Stat:
    """:func:`time_batches` of one implementation."""
    return time_batches({"run": run}, settings, overhead_ns)["run"]


def time_eaches(preps: dict[str, Prepare], settings: Settings, overhead_ns: float = 0.0) -> dict[str, Stat]:
    """Time single calls ``f(*args)`` of several implementations, each call after an
    untimed ``f, args = prepare()``.

    Each implementation gets enough samples per repeat to last about
    ``settings.target_ns`` (set-up included); a repeat reports their median; repeats go
    round-robin over the implementations (see :func:`time_batches`). ``overhead_ns``
    (the timer pair) is subtracted.
    """
    clock = _clock

    def sample(prepare: Prepare) -> tuple[int, int]:
        s0 = clock()
        f, args = prepare()
        t0 = clock()
        f(*args)
        t1 = clock()
        return t1 - t0, t1 - s0

    samples: dict[str, int] = {}
    out: dict[str, Stat] = {}
    round_ns = 0
    for name, prepare in preps.items():
        for _ in range(3):  # warm-up
            timed, total = sample(prepare)
        if timed > settings.max_call_ns:
            per = [timed - overhead_ns] + [sample(prepare)[0] - overhead_ns
                                           for _ in range(settings.slow_repeats - 1)]
            out[name] = Stat.of(per, 1)
            continue
        samples[name] = max(3, min(2000, int(settings.target_ns / max(total, 1))))
        round_ns += samples[name] * total
    per_call: dict[str, list[float]] = {name: [] for name in samples}
    for _ in range(settings.repeats_for(round_ns) if samples else 0):
        for name, k in samples.items():
            prepare = preps[name]
            per_call[name].append(statistics.median(sample(prepare)[0] for _ in range(k)) - overhead_ns)
    out.update({name: Stat.of(per_call[name], samples[name]) for name in samples})
    return {name: out[name] for name in preps}


def time_each(prepare: Prepare, settings: Settings, overhead_ns: float = 0.0) -> Stat:
    """:func:`time_eaches` of one implementation."""
    return time_eaches({"run": prepare}, settings, overhead_ns)["run"]
