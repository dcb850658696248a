"""Fuzz: random operation sequences, valid and invalid, on the C path and the reference.

A hypothesis state machine builds the same policy (any of the five, ``heads`` in
{1, 2, 3}; Scissorhands, H2O and TOVA with or without sinks, Scissorhands with or
without a history window and a vote rate) on both backends and drives them in lockstep with
decode steps, fused steps,
evictions, prefill, chunks (``extend``, with and without ``admit``), pinned spans
(``pin``: no victim may be pinned), the row-by-row
``step_rows``/``evict_rows``, row selection (``select_rows``: beams, copies, fewer or
more rows), reset, state round trips (across backends, through JSON, pickle,
``copy``), corrupted states and accessor queries. Rows come to hold different counts
(chunks with ``admit``, corrupted states), and every call is checked there too. Inputs are valid and invalid: positions
-1, 2**31, 2**32, bools, floats, numpy scalars, out of order; bad budgets; attention of
the wrong length, rank or dtype, with NaN/inf/negative weights, in every accepted layout
(lists, float16..float64, integers, Fortran order, strided, read-only, byte-swapped).

After every operation: both backends returned the same value or raised the same class
(only ``ScissorhandsError`` subclasses and ``MemoryError`` may escape: anything else is a
crash), a failed call left each object exactly as it was, both hold the same state, and
every eviction met the output contract (held - budget victims in each row, unique,
ascending, all held before, none after).

How to run:

* quick, in the default suite: ``tests/test_reliability.py::test_fuzz_quick``;
* the bounded CI run (about a minute): ``python -m pytest -q tests/fuzz_ops.py``;
* longer, on demand: ``SCISSORHANDS_FUZZ_EXAMPLES=20000 python -m pytest -q tests/fuzz_ops.py``
  (add ``HYPOTHESIS_PROFILE=long`` for fresh random seeds rather than the derandomised
  ``ci`` ones). A failure prints the shortest sequence found; pin it as a plain test in
  ``tests/test_reliability.py`` (section "regressions found by the fuzzer").
"""

from __future__ import annotations

import copy
import json
import math
import os
import pickle
from typing import Any

import numpy as np
import pytest
from conftest import BACKENDS, POLICY_NAMES, load_backend
from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from scissorhands._shared import UINT32_MAX, RowVictims
from scissorhands.errors import ScissorhandsError
from scissorhands.options import SPECS

#: Examples (sequences) of the bounded run; about a minute on this 2-core machine.
FUZZ_EXAMPLES = int(os.environ.get("SCISSORHANDS_FUZZ_EXAMPLES", "1200"))
#: Operations per sequence.
FUZZ_STEPS = int(os.environ.get("SCISSORHANDS_FUZZ_STEPS", "40"))

GRID = [i / 8 for i in range(9)]
BAD_WEIGHTS = [math.nan, math.inf, -math.inf, -0.125, -1e-300]
ODD_GOOD_WEIGHTS = [-0.0, 5e-324, 1e-300, 1e300, 1.7e308, 3.4e38, 1.0, 2.0]


# ---------------------------------------------------------------- comparison helpers


def plain(value: Any) -> Any:
    """A result as comparable plain data (arrays keep their dtype and shape)."""
    if isinstance(value, np.ndarray):
        return ("array", str(value.dtype), value.shape, value.tolist())
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, float):
        return ("float", value.hex())  # bit-exact, and -0.0 != 0.0
    return value


def outcome(fn: Any, *args: Any, **kwargs: Any) -> tuple[tuple[str, Any], Any]:
    """(``("ok", plain result)`` or ``("raised", class name)``, the raw result or None).

    Only the library's errors and ``MemoryError`` may escape a call: anything else (an
    ``IndexError``, a numpy error, a ``SystemError`` from cffi) is a crash and propagates.
    """
    try:
        raw = fn(*args, **kwargs)
    except (ScissorhandsError, MemoryError) as exc:
        return ("raised", type(exc).__name__), None
    return ("ok", plain(raw)), raw


def snapshot(p: Any) -> tuple[Any, ...]:
    """Everything observable about a policy, as plain data (what raises on rows of
    different counts, as kept does, is observed as the class it raises)."""
    def read(name: str) -> Any:
        return outcome(getattr, p, name)[0]

    cls = type(p)
    extra: Any = None
    if hasattr(cls, "votes"):
        extra = read("votes")
    elif hasattr(cls, "scores"):
        extra = read("scores")
    elif hasattr(cls, "sink_count"):
        extra = outcome(p.sink_count)[0]
    return (p.state_dict(), p.memory_bytes(), outcome(p.kept_count)[0], read("kept"), plain(p.counts),
            extra, repr(p))


def victim_rows(result: Any) -> tuple[list[list[int]], list[list[int]] | None]:
    """Victims (and slots, if returned) of an evict/step result as lists of rows; a
    :class:`RowVictims` is split row by row."""
    if isinstance(result, RowVictims):
        assert result.counts.dtype == np.uint32 and result.victims.dtype == np.uint32
        assert result.slots.dtype == np.int64 and result.victims.shape == result.slots.shape
        ends = np.cumsum(result.counts.astype(np.int64))
        assert result.counts.ndim == 1 and int(ends[-1]) == len(result.victims)
        return ([part.tolist() for part in np.split(result.victims, ends[:-1])],
                [part.tolist() for part in np.split(result.slots, ends[:-1])])
    slots = None
    if isinstance(result, tuple):
        result, slots = result
        slots = slots.tolist() if isinstance(slots, np.ndarray) else [slots]
    victims = result.tolist() if isinstance(result, np.ndarray) else [result]
    return victims, slots


def check_contract(before: list[list[int]], after: list[list[int]], result: Any, budget: int | None,
                   evicts: bool) -> None:
    """The eviction output contract, per head."""
    victims, slots = victim_rows(result)
    assert len(victims) == len(before), f"{len(victims)} rows of victims for {len(before)} heads"
    for h, (held, kept, gone) in enumerate(zip(before, after, victims)):
        want = max(0, len(held) - budget) if evicts and budget is not None else 0
        assert len(gone) == want, f"head {h}: {len(gone)} victims, expected {want}"
        assert gone == sorted(set(gone)), f"head {h}: victims not unique and ascending: {gone}"
        assert set(gone) <= set(held), f"head {h}: a victim was not held"
        assert not set(gone) & set(kept), f"head {h}: a victim is still held"
        assert kept == [p for p in held if p not in set(gone)], f"head {h}: survivors reordered"
        if slots is not None:
            assert [held[s] for s in slots[h]] == gone, f"head {h}: slots do not index the victims"


# ---------------------------------------------------------------- strategies


def positions(last: int) -> st.SearchStrategy[Any]:
    """Mostly the next positions, sometimes far ahead, often something invalid."""
    nxt = last + 1
    odd: list[Any] = [last, 0, -1, -(2**31), 2**31, 2**31 - 1, UINT32_MAX, 2**32, 2**32 + nxt,
                      2**63, -(2**63), 2**64, True, False, float(nxt), 1.5, math.nan, "7", None,
                      np.int64(nxt), np.int64(-1), np.int8(-1), np.bool_(True), np.float64(nxt),
                      np.uint64(2**64 - 1)]
    if nxt <= UINT32_MAX:
        odd.append(np.uint32(nxt))
    return st.one_of(
        st.integers(nxt, nxt + 2), st.integers(nxt, nxt + 2), st.integers(nxt, nxt + 2),
        st.integers(nxt, nxt + 2), st.integers(nxt + 3, nxt + 2**20),
        st.sampled_from(odd))


def budgets(held: int, protected: int) -> st.SearchStrategy[Any]:
    """None (the configured budget), small and boundary integers, and wrong kinds."""
    edge = [protected, protected + 1, held, held - 1, held + 1, 2**31, UINT32_MAX, 2**32, 0, -1,
            True, False, 2.0, np.int64(protected + 1), np.float64(3.0), "3", math.inf]
    return st.one_of(st.none(), st.none(), st.integers(-1, 12), st.sampled_from(edge))


@st.composite
def weight_rows(draw: Any, heads: int, n: int) -> list[list[float]]:
    """``heads`` rows of ``n`` weights: grid, uniform, exact shares, odd or bad values."""
    mode = draw(st.sampled_from(["grid", "grid", "grid", "uniform", "share", "huge", "odd", "bad"]))
    if mode == "huge":  # H2O scores saturate at the largest double
        rows = [[draw(st.sampled_from([1e308, 1.7e308, 0.0])) for _ in range(n)] for _ in range(heads)]
    elif mode == "uniform":
        rows = [[draw(st.floats(0, 1)) for _ in range(n)] for _ in range(heads)]
    elif mode == "share":
        rows = [[1.0 / max(n, 1)] * n for _ in range(heads)]
    else:
        rows = [[draw(st.sampled_from(GRID)) for _ in range(n)] for _ in range(heads)]
    if mode in ("odd", "bad") and n:
        h, i = draw(st.integers(0, heads - 1)), draw(st.integers(0, n - 1))
        rows[h][i] = draw(st.sampled_from(ODD_GOOD_WEIGHTS if mode == "odd" else BAD_WEIGHTS))
    return rows


def layout(draw: Any, rows: list[list[Any]], heads: int) -> Any:
    """The rows in one of the accepted input layouts."""
    form = draw(st.sampled_from(["f32", "f64", "f64", "list", "tuple", "f16", "int", "fortran",
                                 "strided", "readonly", "swapped", "object"]))
    arr = np.array(rows, dtype=np.float64).reshape(heads, -1)
    if form == "f32":
        with np.errstate(over="ignore"):
            out: Any = arr.astype(np.float32)
    elif form == "list":
        out = [list(r) for r in rows]
    elif form == "tuple":
        out = tuple(tuple(r) for r in rows)
    elif form == "f16":
        with np.errstate(over="ignore"):
            out = arr.astype(np.float16)
    elif form == "int":
        small = np.isfinite(arr) & (np.abs(arr) < 1e6)
        out = np.where(small, np.round(np.where(small, arr, 0) * 8), -1).astype(np.int64).astype(
            draw(st.sampled_from([np.int64, np.int8, np.uint16])))
    elif form == "fortran":
        out = np.asfortranarray(arr)
    elif form == "strided":
        wide = np.zeros((heads, 2 * arr.shape[1]))
        wide[:, ::2] = arr
        out = wide[:, ::2]
    elif form == "readonly":
        out = arr.copy()
        out.setflags(write=False)
    elif form == "swapped":
        out = arr.astype(arr.dtype.newbyteorder(">"))
    else:  # object array mixing Python ints and floats
        out = np.array([[x if i % 2 else int(x) if float(x).is_integer() else x for i, x in
                         enumerate(r)] for r in arr.tolist()], dtype=object).reshape(arr.shape)
    if heads == 1 and draw(st.booleans()):
        out = out[0]  # (n,) rather than (1, n)
    return out


@st.composite
def attention(draw: Any, heads: int, n: int) -> Any:
    """One step's attention in some accepted layout, or a malformed one."""
    kind = draw(st.sampled_from(["valid"] * 10 + ["none", "length", "heads", "rank", "type"]))
    if kind == "none":
        return None
    if kind == "type":
        return draw(st.sampled_from([
            [True] * n, ["0.5"] * n, np.zeros((heads, n), dtype=bool), np.zeros((heads, n), dtype=complex),
            np.array([0.5] * n, dtype=object) if n else [None], [None] * max(n, 1), "weights", b"ab",
            np.zeros((heads, n), dtype="datetime64[ns]"), object(), 0.5]))
    if kind == "rank":
        return draw(st.sampled_from([np.zeros(()), np.zeros((heads, n, 1)), np.zeros((1, heads, n)), 0.5,
                                     [[[0.5] * n]] * heads]))
    if kind == "length":
        width = draw(st.sampled_from([w for w in (n - 1, n + 1, 0, 2 * n + 1) if w >= 0 and w != n]))
        return layout(draw, draw(weight_rows(heads, width)), heads)
    if kind == "heads":
        rows = draw(st.sampled_from([h for h in (heads - 1, heads + 1) if h >= 1 and h != heads]))
        return np.array(draw(weight_rows(rows, n)), dtype=np.float64).reshape(rows, n)
    return layout(draw, draw(weight_rows(heads, n)), heads)


@st.composite
def prompts(draw: Any, heads: int) -> Any:
    """A prompt for prefill: lower-triangular (P, P) / (heads, P, P), often malformed."""
    p = draw(st.integers(0, 7))
    rows = heads + draw(st.sampled_from([0] * 6 + [-1, 1]))
    rows = max(rows, 1)
    grid = np.array([[[draw(st.sampled_from(GRID)) for _ in range(p)] for _ in range(p)]
                     for _ in range(rows)], dtype=np.float64).reshape(rows, p, p)
    # The diagonal and above are never read: junk there must not matter.
    grid = np.tril(grid, -1) + np.triu(np.full((rows, p, p), np.nan))
    if p >= 2 and draw(st.integers(0, 5)) == 0:
        i = draw(st.integers(1, p - 1))
        h, j = draw(st.integers(0, rows - 1)), draw(st.integers(0, i - 1))
        grid[h, i, j] = draw(st.sampled_from(BAD_WEIGHTS))
    shape = draw(st.sampled_from(["ok"] * 8 + ["nonsquare", "flat"]))
    if shape == "nonsquare" and p >= 1:
        grid = grid[:, :, : p - 1] if draw(st.booleans()) else np.concatenate([grid, grid[:, :1]], axis=1)
    elif shape == "flat":
        grid = grid.reshape(-1)
    dtype = draw(st.sampled_from([np.float64, np.float32, np.float64, "list", "f16", bool]))
    if dtype == "list":
        out: Any = grid.tolist()
    elif dtype == "f16":
        out = grid.astype(np.float16)
    else:
        out = grid.astype(dtype)
    one = heads == 1 and isinstance(out, np.ndarray) and out.ndim == 3 and out.shape[0] == 1
    if one and draw(st.booleans()):
        out = out[0]
    return out


@st.composite
def chunks(draw: Any, heads: int, base: int, valid: bool = False) -> tuple[Any, Any]:
    """``extend``'s (attn, admit): ``(heads, C, base + C)`` weights (C in 1..4) in some
    accepted layout, often with an invalid value somewhere (read or not) or the wrong
    shape, and an admission mask that is None, bools in several forms, or malformed.
    With ``valid``: a well-formed chunk (float weights of the grid) and a random mask,
    so that rows come to hold different counts."""
    if valid:
        c = draw(st.integers(1, 4))
        grid = np.array([[[draw(st.sampled_from(GRID)) for _ in range(base + c)] for _ in range(c)]
                         for _ in range(heads)], dtype=draw(st.sampled_from([np.float32, np.float64])))
        mask = np.array([[draw(st.booleans()) for _ in range(c)] for _ in range(heads)], dtype=bool)
        return grid.reshape(heads, c, base + c), mask.reshape(heads, c)
    c = draw(st.sampled_from([1, 1, 2, 3, 4, 0]))
    width = base + c + draw(st.sampled_from([0] * 8 + [-1, 1]))
    rows = heads + draw(st.sampled_from([0] * 10 + [-1, 1]))
    rows, width = max(rows, 1), max(width, 0)
    grid = np.array([[[draw(st.sampled_from(GRID)) for _ in range(width)] for _ in range(c)]
                     for _ in range(rows)], dtype=np.float64).reshape(rows, c, width)
    if grid.size and draw(st.integers(0, 3)) == 0:  # a bad value: read or not, both must agree
        h, i, j = (draw(st.integers(0, n - 1)) for n in grid.shape)
        grid[h, i, j] = draw(st.sampled_from(BAD_WEIGHTS))
    form = draw(st.sampled_from(["f64", "f32", "list", "int", "bool", "flat"]))
    if form == "f32":
        with np.errstate(over="ignore"):
            attn: Any = grid.astype(np.float32)
    elif form == "list":
        attn = grid.tolist()
    elif form == "int":
        attn = np.where(np.isfinite(grid) & (grid >= 0), grid * 8, -1).astype(np.int16)
    elif form == "bool":
        attn = grid > 0.5
    elif form == "flat":
        attn = grid.reshape(-1)
    else:
        attn = grid
    if heads == 1 and rows == 1 and draw(st.booleans()) and isinstance(attn, np.ndarray) and attn.ndim == 3:
        attn = attn[0]  # (C, W) for one head
    kind = draw(st.sampled_from(["none"] * 3 + ["array"] * 3 + ["list", "flat", "ints", "shape", "str"]))
    mask = np.array([[draw(st.booleans()) or draw(st.booleans()) for _ in range(c)] for _ in range(heads)],
                    dtype=bool).reshape(heads, c)
    admit: Any
    if kind == "none":
        admit = None
    elif kind == "array":
        admit = mask
    elif kind == "list":
        admit = mask.tolist()
    elif kind == "flat":
        admit = mask[0] if heads == 1 else mask.reshape(-1)
    elif kind == "ints":
        admit = mask.astype(draw(st.sampled_from([np.int64, np.uint8])))
    elif kind == "shape":
        admit = np.ones((heads, c + 1), dtype=bool)
    else:
        admit = "all"
    return attn, admit


def row_indices(heads: int) -> st.SearchStrategy[Any]:
    """``select_rows``' index: mostly 1..4 valid rows (repeats, reorders, fewer, more),
    sometimes empty, out of range, of the wrong kind or rank."""
    valid = st.lists(st.integers(0, heads - 1), min_size=1, max_size=4)
    return st.one_of(
        valid, valid, valid, valid.map(lambda v: np.array(v, dtype=np.int64)),
        valid.map(lambda v: np.array(v, dtype=np.uint16)),
        st.sampled_from([[], [heads], [-1], [True], [0.0], [[0]], 0, "0", None, np.zeros(2, dtype=bool),
                         np.zeros(1, dtype=np.float32), np.zeros((1, 1), dtype=np.int64)]))


# ---------------------------------------------------------------- the machine


class PolicyPair(RuleBasedStateMachine):
    """The same policy on both backends, driven in lockstep."""

    def __init__(self) -> None:
        super().__init__()
        self.backends = [load_backend(b) for b in BACKENDS]
        self.objs: list[Any] = []

    @initialize(policy=st.sampled_from(POLICY_NAMES), heads=st.sampled_from([1, 2, 3]), data=st.data())
    def build(self, policy: str, heads: int, data: Any) -> None:
        budget = data.draw(st.integers(1, 8), label="budget")
        params: dict[str, Any] = {"heads": heads}
        spec = SPECS[policy]
        if not spec.evicts:
            params["budget"] = data.draw(st.none() | st.just(budget), label="budget")
        else:
            params["budget"] = budget
            key = "recent_window" if spec.takes("recent_window") else "sinks"
            least = spec.min_recent_window if key == "recent_window" else 0
            if least:  # it always keeps its newest position: a window of 1 or more
                budget = params["budget"] = max(budget, least + 1)
            params[key] = data.draw(st.integers(least, budget - 1), label=key)
            if key != "sinks" and spec.takes("sinks") and data.draw(st.booleans(), label="sinks?"):
                params["sinks"] = data.draw(st.integers(0, budget - 1 - params[key]), label="sinks")
            if spec.takes("history_window") and data.draw(st.booleans(), label="history?"):
                params["history_window"] = data.draw(st.sampled_from([1, 2, 3, 5, 64]),
                                                     label="history_window")
            if spec.takes("vote_rate") and data.draw(st.booleans(), label="vote rate?"):
                params["vote_rate"] = True
        self.policy = policy
        self._configure(params)
        self.objs = [b.POLICIES[policy](**params) for b in self.backends]
        note(f"{policy}({params})")

    # ------------------------------------------------------------ plumbing

    def _configure(self, params: dict[str, Any]) -> None:
        """Remember the parameters the objects were built (or loaded) with."""
        self.params, self.heads = dict(params), params["heads"]
        self.protected = params.get("sinks", 0) + params.get("recent_window", 0)
        self.evicts = self.policy != "full"

    @property
    def last(self) -> int:
        return self.objs[1].state_dict()["last_position"]

    @property
    def held(self) -> int:
        """The largest count of a row (attention is that wide)."""
        return int(self.objs[1].counts.max())

    @property
    def fresh(self) -> bool:
        state = self.objs[1].state_dict()
        return state["last_position"] == 0 and all(len(r) == 1 for r in state["kept"])

    def rows(self, p: Any) -> list[list[int]]:
        return [list(r) for r in p.state_dict()["kept"]]

    def apply(self, name: str, *args: Any, **kwargs: Any) -> tuple[tuple[str, Any], Any]:
        """Call ``name`` on both; same outcome, no change on error. Returns the outcome and
        the native backend's raw result."""
        before = [snapshot(o) for o in self.objs]
        (native, raw), (ref, _) = [outcome(getattr(o, name), *args, **kwargs) for o in self.objs]
        note(f"{name}{args!r:.300} {kwargs} -> {native!r:.200}")
        assert native == ref, f"{name}: native {native!r:.300} != reference {ref!r:.300}"
        if native[0] == "raised":
            for o, b in zip(self.objs, before):
                assert snapshot(o) == b, f"{type(o).__module__}: a failed {name} changed the object"
        return native, raw

    @invariant()
    def same_state(self) -> None:
        if self.objs:
            native, ref = self.objs
            assert snapshot(native) == snapshot(ref)

    # ------------------------------------------------------------ the decode loop

    @rule(data=st.data())
    def decode(self, data: Any) -> None:
        pos = data.draw(positions(self.last), label="pos")
        attn = data.draw(attention(self.heads, self.held), label="attn")
        self.apply("on_decode_step", pos, attn)

    @rule(data=st.data())
    def step(self, data: Any) -> None:
        pos = data.draw(positions(self.last), label="pos")
        attn = data.draw(attention(self.heads, self.held), label="attn")
        budget = data.draw(budgets(self.held + 1, self.protected), label="budget")
        indices = data.draw(st.booleans(), label="return_indices")
        before = [row + [pos] for row in self.rows(self.objs[0])]
        (status, _), raw = self.apply("step", pos, attn, budget, return_indices=indices)
        if status == "ok":
            self._contract(before, raw, budget)

    @rule(data=st.data())
    def evict(self, data: Any) -> None:
        budget = data.draw(budgets(self.held, self.protected), label="budget")
        indices = data.draw(st.booleans(), label="return_indices")
        before = self.rows(self.objs[0])
        (status, _), raw = self.apply("evict", budget, return_indices=indices)
        if status == "ok":
            self._contract(before, raw, budget)

    @rule(data=st.data())
    def step_rows(self, data: Any) -> None:
        pos = data.draw(positions(self.last), label="pos")
        attn = data.draw(attention(self.heads, self.held), label="attn")
        budget = data.draw(budgets(self.held + 1, self.protected), label="budget")
        before = [row + [pos] for row in self.rows(self.objs[0])]
        (status, _), raw = self.apply("step_rows", pos, attn, budget)
        if status == "ok":
            self._contract(before, raw, budget)

    @rule(data=st.data())
    def evict_rows(self, data: Any) -> None:
        budget = data.draw(budgets(self.held, self.protected), label="budget")
        before = self.rows(self.objs[0])
        (status, _), raw = self.apply("evict_rows", budget)
        if status == "ok":
            self._contract(before, raw, budget)

    @rule(data=st.data(), valid=st.booleans())
    def extend(self, data: Any, valid: bool) -> None:
        attn, admit = data.draw(chunks(self.heads, 0 if self.fresh else self.held, valid), label="chunk")
        self.apply("extend", attn, admit)

    @rule(data=st.data())
    def select_rows(self, data: Any) -> None:
        index = data.draw(row_indices(self.heads), label="index")
        (status, _), _ = self.apply("select_rows", index)
        if status == "ok":
            self.heads = self.objs[1].heads
            self.params["heads"] = self.heads

    def _contract(self, before: list[list[Any]], raw: Any, budget: Any) -> None:
        """The output contract of the native call's own return value; no victim pinned."""
        cap = self.params["budget"] if budget is None else int(budget)
        before = [[int(p) for p in row] for row in before]
        check_contract(before, self.rows(self.objs[0]), raw, cap, self.evicts)
        spans = self.objs[0].pins
        pinned = [v for row in victim_rows(raw)[0] for v in row if any(a <= v < b for a, b in spans)]
        assert not pinned, f"pinned positions {pinned} were evicted (pins {spans})"

    @rule(data=st.data())
    def pin(self, data: Any) -> None:
        """pin() with short spans over the first positions (often overlapping the sinks or
        each other), now and then one empty, reversed, out of range or not integers."""
        start = data.draw(st.one_of(st.integers(0, 30), st.integers(0, 30), st.sampled_from(
            [-1, 2**32, UINT32_MAX, True, 1.5, None, np.int64(2)])), label="start")
        width = data.draw(st.integers(-1, 6), label="width")
        stop = start + width if isinstance(start, int) and not isinstance(start, bool) else 3
        self.apply("pin", start, stop)

    @rule(data=st.data())
    def prefill(self, data: Any) -> None:
        self.apply("prefill", data.draw(prompts(self.heads), label="prompt"))

    @rule()
    def reset(self) -> None:
        self.apply("reset")

    # ------------------------------------------------------------ state

    @rule(via=st.sampled_from(["cross", "json", "pickle", "deepcopy", "copy"]),
          protocol=st.integers(0, pickle.HIGHEST_PROTOCOL))
    def round_trip(self, via: str, protocol: int) -> None:
        """Replace both objects by restored copies; each must equal what it replaced."""
        before = [snapshot(o)[:4] for o in self.objs]
        if via == "cross":
            states = [o.state_dict() for o in self.objs]
            new = [b.POLICIES[self.policy].from_state_dict(s)
                   for b, s in zip(self.backends, reversed(states))]
        elif via == "json":
            new = [type(o).from_state_dict(json.loads(json.dumps(o.state_dict()))) for o in self.objs]
        elif via == "pickle":
            new = [pickle.loads(pickle.dumps(o, protocol=protocol)) for o in self.objs]
        elif via == "deepcopy":
            new = [copy.deepcopy(o) for o in self.objs]
        else:
            new = [copy.copy(o) for o in self.objs]
        for o, n in zip(self.objs, new):
            assert n is not o and type(n) is type(o)
        # memory_bytes may differ: a restored object grows only until its state fits.
        assert [snapshot(o)[0] for o in new] == [b[0] for b in before]
        assert [snapshot(o)[2:4] for o in new] == [b[2:4] for b in before]
        self.objs = new

    @rule(data=st.data())
    def load_corrupted(self, data: Any) -> None:
        """Both backends accept, or refuse with the same class, one corrupted state."""
        state = copy.deepcopy(self.objs[1].state_dict())
        field = data.draw(st.sampled_from(
            ["kept", "last_position", "params", "version", "format", "policy", "extra", "missing"]
            + [k for k in ("votes", "scores", "history", "steps_held") if k in state]), label="field")
        rows = state["kept"]
        if field == "last_position":
            state[field] = data.draw(st.sampled_from([-1, 0, 2**32, 1.0, None, True, "3"])
                                     | st.integers(0, state[field] + 2))
        elif field == "version":
            state[field] = data.draw(st.sampled_from([0, 2, 2**64, -1, True, 1.0, "1", None]))
        elif field == "format":
            state[field] = data.draw(st.sampled_from(["", "scissorhands.policy.v2", None]))
        elif field == "policy":
            state[field] = data.draw(st.sampled_from([n for n in POLICY_NAMES if n != self.policy] + [None]))
        elif field == "extra":
            state[data.draw(st.sampled_from(["extra", "votes", "scores"]))] = [[0]]
        elif field == "missing":
            del state[data.draw(st.sampled_from(sorted(state)))]
        elif field == "params":
            key = data.draw(st.sampled_from(sorted(state["params"]) + ["extra"]))
            state["params"][key] = data.draw(st.sampled_from([0, -1, 2**32, 1.5, True, None, 3, 65537]))
        else:
            target = state[field]
            how = data.draw(st.sampled_from(["value", "value", "value", "many", "row", "rows", "swap"]))
            h = data.draw(st.integers(0, len(target) - 1))
            if not target[h] and how not in ("rows", "row"):
                how = "row"  # an empty row has no value to corrupt
            if how == "row":
                target[h] = target[h][:-1] if data.draw(st.booleans()) or not target[h] else target[h] + target[h][-1:]
            elif how == "rows":
                state[field] = target[:-1] if data.draw(st.booleans()) else target + target[-1:]
            elif how == "swap" and len(target[h]) >= 2:
                target[h][0], target[h][1] = target[h][1], target[h][0]
            elif how == "many":  # one value in every other slot: ties, and -0.0 beside 0.0
                value = data.draw(st.sampled_from([-0.0, 0.0, 0.5, 0]) if field == "scores"
                                  else st.sampled_from([0, 1, UINT32_MAX]))
                for j in range(data.draw(st.integers(0, 1)), len(target[h]), 2):
                    target[h][j] = value
            else:
                i = data.draw(st.integers(0, len(target[h]) - 1))
                if field == "scores":
                    bad = (st.sampled_from([-0.5, -0.0, 5e-324, math.nan, math.inf, "1", None, 1, True, 1e308,
                                            np.float32(0.5), np.float64(-0.0)]) | st.floats(0, 4))
                elif field == "history":  # registers: bits above the window, or a popcount off
                    bad = (st.sampled_from([-1, 2**64, 2**64 - 1, 2**63, 1.0, True, None, "1", np.uint64(1)])
                           | st.integers(0, 2**6))
                elif field == "steps_held":  # fewer steps than votes or register bits
                    bad = (st.sampled_from([-1, 2**32, UINT32_MAX, 1.0, True, None, np.uint32(1)])
                           | st.integers(0, 8))
                else:
                    bad = (st.sampled_from([-1, 2**32, UINT32_MAX, 1.0, True, None, "1", np.int64(0),
                                            np.uint32(1), np.bool_(False)])
                           | st.integers(0, (rows[h][-1] if rows[h] else 0) + 2))
                target[h][i] = data.draw(bad)
        note(f"corrupted {field}: {state!r:.400}")
        outs, objs = [], []
        for b in self.backends:
            res, loaded = outcome(b.POLICIES[self.policy].from_state_dict, copy.deepcopy(state))
            outs.append(res if loaded is None else ("ok", snapshot(loaded)[:4]))
            objs.append(loaded)
        assert outs[0] == outs[1], f"from_state_dict: native {outs[0]!r:.300} != reference {outs[1]!r:.300}"
        if outs[0][0] == "ok" and data.draw(st.booleans(), label="continue with it"):
            # A state no operation sequence reaches (any votes, scores, gaps): carry on from it.
            self.objs = objs
            self._configure(objs[1].state_dict()["params"])

    @rule(data=st.data())
    def construct(self, data: Any) -> None:
        """Both backends build, or refuse with the same class, parameters that may be bad,
        several at once, or left to their defaults."""
        names = {"full": ["budget", "heads"], "streaming-llm": ["budget", "sinks", "heads"],
                 "h2o": ["budget", "recent_window", "heads", "sinks"],
                 "tova": ["budget", "recent_window", "heads", "sinks"],
                 "scissorhands": ["budget", "recent_window", "heads", "sinks", "history_window", "vote_rate"]}.get(
            self.policy, ["budget", "heads", *(o.name for o in SPECS[self.policy].options)])
        value = st.one_of(st.integers(-1, 9), st.integers(-1, 9), st.sampled_from(
            [0, 2**31, UINT32_MAX, 2**32, 65537, True, False, 2.0, None, "3", np.int64(3), np.uint8(1),
             0.5, 0.99, -0.5, math.nan, np.float32(0.25)]))
        params: dict[str, Any] = {}
        for k in names:
            if data.draw(st.integers(0, 3), label=f"give {k}"):
                params[k] = data.draw(value, label=k)
        if data.draw(st.integers(0, 3), label="give pins") == 0:
            params["pins"] = data.draw(st.sampled_from(
                [[], [(0, 2)], [(1, 3), (2, 5)], ((4, 6),), np.array([[0, 1]]), [(0, 10**6)], [(3, 3)],
                 [(0, 1, 2)], 5, "ab", [(True, 2)], [(0, 2.0)], None]), label="pins")
        heads = params.get("heads")
        if isinstance(heads, (int, np.integer)) and not isinstance(heads, bool) and 4 < heads <= 65536:
            params["heads"] = 4  # keep allocations small
        note(f"construct {self.policy}({params})")
        outs = []
        for b in self.backends:
            res, built = outcome(b.POLICIES[self.policy], **params)
            outs.append(res if built is None else ("ok", snapshot(built)))
        assert outs[0] == outs[1], f"constructor: native {outs[0]!r:.300} != reference {outs[1]!r:.300}"

    # ------------------------------------------------------------ queries

    @rule(data=st.data())
    def query(self, data: Any) -> None:
        last = self.last
        pos = data.draw(st.one_of(st.integers(-2, last + 2), st.sampled_from(
            [2**31, UINT32_MAX, 2**32, -(2**32), 2**64, True, 1.0, None, np.int64(0), np.uint64(2**64 - 1)])),
            label="pos")
        head = data.draw(st.one_of(st.integers(0, self.heads - 1), st.sampled_from(
            [-1, self.heads, True, 0.0, np.int64(0), 2**32])), label="head")
        if SPECS[self.policy].score_key:
            self.apply({"votes": "votes_of", "scores": "score_of"}[SPECS[self.policy].score_key], pos, head)
        elif self.policy == "streaming-llm":
            self.apply("sink_count")
        self.apply("kept_count")
        self.apply("kept_row", head)
        self.apply("memory_bytes")


def fuzz_settings(examples: int) -> settings:
    """Settings of a fuzz run of ``examples`` sequences (the loaded profile otherwise)."""
    return settings(max_examples=examples, stateful_step_count=FUZZ_STEPS, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.data_too_large])


TestPolicyPair = PolicyPair.TestCase
TestPolicyPair.settings = fuzz_settings(FUZZ_EXAMPLES)
TestPolicyPair = pytest.mark.slow(TestPolicyPair)
