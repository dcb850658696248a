"""Pinned spans, the same on both backends: each span checked, merged and read, and the
budget they leave for the rest of a row."""

from __future__ import annotations

import bisect
import numbers
from collections.abc import Mapping
from typing import Any

from ._limits import MAX_PINS, UINT32_MAX, check_int, check_recent_window
from .errors import InvalidInputError, InvalidTypeError

# ----------------------------------------------------------------------------- pinned spans

Span = tuple[int, int]


def check_span(start: Any, stop: Any) -> Span:
    """One pinned span ``(start, stop)``, half-open: integers (not bools) with
    ``0 <= start < stop <= 2**32 - 1``.

    Raises
    ------
    InvalidTypeError
        ``start`` or ``stop`` is not an integer.
    InvalidInputError
        Either is out of range, or ``start >= stop``.
    """
    start = check_int("start", start, 0, UINT32_MAX)
    stop = check_int("stop", stop, 0, UINT32_MAX)
    if start >= stop:
        raise InvalidInputError(f"a pinned span needs start < stop, got ({start}, {stop})")
    return start, stop


def merge_spans(spans: list[Span], more: list[Span]) -> list[Span]:
    """``spans`` and ``more`` as one ascending list, overlapping or adjacent spans
    merged (``(0, 4)`` and ``(4, 6)`` become ``(0, 6)``).

    Raises
    ------
    InvalidInputError
        More than ``MAX_PINS`` spans after merging.
    """
    merged: list[list[int]] = []
    for start, stop in sorted([*spans, *more]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([start, stop])
    if len(merged) > MAX_PINS:
        raise InvalidInputError(f"at most {MAX_PINS} pinned spans (merged), got {len(merged)}")
    return [(a, b) for a, b in merged]


def read_pins(pins: Any) -> list[Span]:
    """The constructor's ``pins``: a sequence of ``(start, stop)`` pairs (lists,
    tuples or arrays of two integers), each checked as :func:`check_span`, merged.

    Raises
    ------
    InvalidTypeError
        ``pins`` is not a sequence of pairs, or a bound is not an integer.
    InvalidInputError
        A pair of the wrong length, a bound out of range, ``start >= stop``, or more
        than ``MAX_PINS`` spans after merging.
    """
    if isinstance(pins, (str, bytes, Mapping)) or not hasattr(pins, "__iter__"):
        raise InvalidTypeError(f"pins must be a sequence of (start, stop) pairs, not {type(pins).__name__}")
    spans = []
    for pair in pins:
        if isinstance(pair, (str, bytes, Mapping)) or not hasattr(pair, "__len__"):
            raise InvalidTypeError(f"pins must hold (start, stop) pairs, found {type(pair).__name__}")
        if len(pair) != 2:
            raise InvalidInputError(f"pins must hold (start, stop) pairs, found {len(pair)} values")
        spans.append(check_span(pair[0], pair[1]))
    return merge_spans([], spans)


def pinned_outside(spans: list[Span], sinks: int) -> int:
    """Positions the merged ``spans`` pin outside ``[0, sinks)`` (the sinks' overlap
    counted once)."""
    return sum(stop - max(start, sinks) for start, stop in spans if stop > sinks)


def window_beside_pins(raw: Any, spans: list[Span], sinks: int, budget: int) -> int | None:
    """A recent window given as a fraction (``raw``: a float or ``Fraction``), with
    spans pinned at construction: that fraction of what the pinned positions and the
    sinks leave of the budget, ``floor(fraction * (budget - pinned - sinks))`` (at
    least 0), so that pinning a span smaller than the budget still leaves positions to
    evict; None (the window as resolved against the budget) without spans or for a
    count."""
    if not spans or isinstance(raw, (bool, numbers.Integral)) or not isinstance(raw, numbers.Real):
        return None
    left = max(0, budget - pinned_outside(spans, sinks) - sinks)
    return check_recent_window(raw, left) if left > 0 else 0


def pins_budget_error(spans: list[Span], sinks: int, recent_window: int,
                      budget: int) -> InvalidInputError | None:
    """The refusal of ``spans`` that, with the sinks and the recent window, leave
    nothing to evict at ``budget`` (None when they leave something)."""
    pinned = pinned_outside(spans, sinks)
    if not spans or pinned + recent_window + sinks < budget:
        return None
    total = pinned + recent_window + sinks
    room = budget - pinned - sinks - 1  # the largest recent window these pins leave room for
    smaller = f"recent_window={room} or less (a count) at this budget, " if room >= 0 else ""
    return InvalidInputError(
        f"pins leave nothing to evict: {pinned} pinned (not counting the first {sinks}) + recent_window "
        f"{recent_window} + sinks {sinks} = {total} reach budget {budget}; to pin these, pass {smaller}"
        f"a budget above {total} with recent_window={recent_window} as a count (a fraction of the budget "
        "grows with it), or pin fewer positions")


def is_pinned(spans: list[Span], pos: int) -> bool:
    """Whether ``pos`` lies in one of the merged, ascending ``spans``."""
    j = bisect.bisect_right(spans, (pos, UINT32_MAX + 1))
    return j > 0 and spans[j - 1][0] <= pos < spans[j - 1][1]


def row_candidates(row: list[int], spans: list[Span], sinks: int, recent_window: int,
                   pos: int | None) -> int:
    """Slots a row holding ``row`` (ascending; ``pos`` appended when not None) may give
    up: those after its first ``min(sinks, n)`` and before its last ``recent_window``
    that are not pinned (0 when it holds no more than those)."""
    held = row if pos is None else [*row, pos]
    lo = min(sinks, len(held))
    if len(held) - lo <= recent_window:
        return 0
    return sum(1 for p in held[lo:len(held) - recent_window] if not is_pinned(spans, p))


def pinned_budget_error(rows: list[list[int]], spans: list[Span], sinks: int, recent_window: int,
                        budget: int, pos: int | None, pool: int = 1) -> InvalidInputError | None:
    """The refusal of an eviction to ``budget`` (after ``pos`` joins every row, when
    not None) where some row (with ``pool > 1``, some pool of ``pool`` consecutive
    rows, counted together against its share ``pool * budget``) holds fewer unpinned
    positions outside its sinks and recent window than it must evict; None when
    every row (pool) can."""
    if not spans:
        return None
    admitted = 0 if pos is None else 1
    for first in range(0, len(rows), pool):
        group = rows[first:first + pool]
        held = sum(len(r) + admitted for r in group)
        need = held - pool * budget
        if need <= 0:
            continue
        have = sum(row_candidates(r, spans, sinks, recent_window, pos) for r in group)
        if have < need:
            where = f"row {first}" if pool == 1 else f"pool {first // pool} (rows {first}..{first + pool - 1})"
            return InvalidInputError(
                f"budget {budget}: sinks {sinks}, recent_window {recent_window} and the pinned positions "
                f"leave only {have} positions to evict in {where}, need {need}")
    return None
