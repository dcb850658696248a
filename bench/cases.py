"""The benchmark cases: what is timed, against which baselines, in which state.

Every timed case starts from a synthetic *steady state* (built once per case, loaded
into every implementation): each row holds ``budget`` positions (``budget + 1`` before a
single eviction) with votes or scores already accumulated, the most recent positions
contiguous, as after a long decode. Implementations measured side by side:

``c``
    the C core through the public Python API (``policy.step(pos, attn)``, ``evict(b)``);
``c_raw``
    ``lib.sh_policy_step`` called directly with the arguments the API passes (an
    ``ffi.from_buffer`` of the weights per call): the C work plus the bare cffi call;
``noop``
    ``lib.sh_noop_step`` with the same arguments: the floor of the call overhead;
``numpy``
    :mod:`bench.numpy_policy`, the same policy vectorised with numpy;
``reference``
    :mod:`scissorhands.reference`, the pure-Python spec (skipped with a note when it
    cannot be imported);
``separate``
    (batched cases) the same heads as H single-head C-backed policies, one call each;
``bandwidth``
    (batched and serving cases) a numpy pass touching the same bytes: ``np.add.reduce``
    over the weights plus a copy of the policy's state bytes;
``c_threads``
    (serving cases large enough to be split) the Python API with ``threads = 2``.

The ``serving`` cases are the shapes a serving loop runs: a model's rows (256 = 32
layers x 8 KV heads, Llama-3-8B's shape) at budgets 4,096 to 32,768 in one call, and a
single row at 8,192 and 32,768. Their steady states are loaded through the thin native
layer (``sh_policy_import_state``): ``from_state_dict`` checks each of millions of
values in Python, which would take longer than the timing.
"""

from __future__ import annotations

import gc
import itertools
import statistics
import threading
import time
import timeit
import tracemalloc
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import scissorhands
from bench.numpy_policy import NUMPY_POLICIES
from bench.timing import Settings, Stat, time_batches, time_eaches
from scissorhands._native import check, ffi, lib
from scissorhands._shared import PARALLEL_MIN_SLOTS
from scissorhands.options import SPECS, shown_values

__all__ = ["BATCH_SHAPES", "CASES", "DECODE_BUDGETS", "POLICY_NAMES", "SERVING_SHAPES", "Case", "Context"]

#: Policies compared on every case.
POLICY_NAMES = ("scissorhands", "h2o", "streaming-llm")
#: Budgets of the single-head decode and eviction cases.
DECODE_BUDGETS = (128, 512, 2048, 8192)
#: (heads, budget) of the batched cases: a layer's KV heads (3: SmolLM2-135M, 8, 32),
#: plus one call over a whole model's worth of rows (256 x 4096 = 1M weights).
BATCH_SHAPES = ((3, 512), (8, 512), (32, 512), (3, 4096), (8, 4096), (32, 4096), (256, 4096))
#: (heads, budget) of the serving cases: one call over a model's rows (256 = 32 layers x
#: 8 KV heads) at long budgets, and single rows at long budgets.
SERVING_SHAPES = ((1, 8192), (1, 32768), (256, 4096), (256, 8192), (256, 32768))
#: Threads of the ``c_threads`` implementation in the serving cases.
SERVING_THREADS = 2
#: Budget of the ``decode-4096`` replay.
REPLAY_BUDGET = 512


def default_params(policy: str, budget: int) -> dict[str, Any]:
    """The options a state of ``policy`` records at their defaults (the seed's): the
    protected recent window, or StreamingLLM's sinks (:mod:`scissorhands.options`)."""
    return shown_values(policy, SPECS[policy].check(budget, {}))


_ADMIT = int(lib.SH_STEP_ADMIT)
_EVICT = int(lib.SH_STEP_EVICT)
_F32 = int(lib.SH_DTYPE_F32)
_NONE = int(lib.SH_DTYPE_NONE)
_clock = time.perf_counter_ns


# ---------------------------------------------------------------------------- context


@dataclass
class Context:
    """What every case needs: timing settings, measured overheads, optional modules."""

    settings: Settings
    quick: bool
    loop_ns: float
    timer_ns: float
    reference: Any = None
    notes: list[str] = field(default_factory=list)
    seed: int = 20230530
    _trace: Any = None

    def rng(self, *key: Any) -> np.random.Generator:
        """A generator seeded by the run's seed and ``key`` (each case its own stream)."""
        return np.random.default_rng([self.seed, *(zlib.crc32(str(k).encode()) for k in key)])

    def note(self, text: str) -> None:
        """Record a note once (printed under the table and saved in the JSON)."""
        if text not in self.notes:
            self.notes.append(text)

    def reference_allowed(self, weights: int) -> bool:
        """Whether the pure-Python reference is timed on a call over ``weights`` weights."""
        if self.reference is None:
            return False
        if self.quick and weights > 4096:
            self.note("--quick: the pure-Python reference is timed only on calls over <= 4096 weights")
            return False
        return True


@dataclass
class Case:
    """One selectable benchmark case."""

    name: str
    group: str
    run: Callable[[Context, Case], dict[str, Any]]
    policy: str | None = None
    budget: int | None = None
    heads: int = 1
    #: Part of a ``--quick`` run unless named with ``--case``.
    quick: bool = True


# ---------------------------------------------------------------------------- state


@dataclass
class State:
    """A steady state: ``(heads, n)`` positions and scores plus the last position."""

    policy: str
    budget: int
    heads: int
    kept: np.ndarray
    scores: np.ndarray | None
    last: int

    @property
    def held(self) -> int:
        return self.kept.shape[1]

    def params(self) -> dict[str, int]:
        return {"budget": self.budget, **default_params(self.policy, self.budget), "heads": self.heads}

    def state_dict(self) -> dict[str, Any]:
        """The state in the ``state_dict()`` format both backends load."""
        d: dict[str, Any] = {
            "format": "scissorhands.policy",
            "version": 1,
            "policy": self.policy,
            "params": self.params(),
            "kept": self.kept.tolist(),
            "last_position": self.last,
        }
        if self.policy == "scissorhands":
            d["votes"] = self.scores.tolist()
        elif self.policy == "h2o":
            d["scores"] = self.scores.tolist()
        return d

    def row(self, h: int) -> State:
        """Row ``h`` alone, as a single-head state."""
        scores = None if self.scores is None else self.scores[h : h + 1]
        return State(self.policy, self.budget, 1, self.kept[h : h + 1], scores, self.last)


def steady_state(policy: str, budget: int, heads: int, held: int, rng: np.random.Generator) -> State:
    """Rows of ``held`` positions as after a long decode at ``budget``.

    StreamingLLM holds its sinks and the most recent positions. Scissorhands and H2O
    hold position 0, older survivors spread over ``[1, 4 * budget)`` and the most recent
    64 positions; votes are integers below ``4 * budget`` (so a bulk selection needs two
    radix bytes), H2O scores reals below 20, the most recent slots the smallest.
    """
    last = 4 * budget
    recent = min(64, held - 1)
    if policy == "streaming-llm":
        sinks = min(4, held)
        row = np.concatenate([np.arange(sinks), np.arange(last - (held - sinks) + 1, last + 1)])
        kept = np.tile(row.astype(np.uint32), (heads, 1))
        return State(policy, budget, heads, np.ascontiguousarray(kept), None, last)
    kept = np.empty((heads, held), dtype=np.uint32)
    old = held - 1 - recent
    for h in range(heads):
        kept[h, 0] = 0
        kept[h, 1 : 1 + old] = np.sort(rng.choice(np.arange(1, last - recent + 1), size=old, replace=False))
        kept[h, 1 + old :] = np.arange(last - recent + 1, last + 1)
    if policy == "scissorhands":
        scores = rng.integers(0, 4 * budget, size=(heads, held)).astype(np.uint32)
        scores[:, held - recent :] = rng.integers(0, 8, size=(heads, recent))
    else:
        scores = rng.random((heads, held)) * 20.0
        scores[:, held - recent :] *= 0.01
    return State(policy, budget, heads, kept, np.ascontiguousarray(scores), last)


def attention_pool(heads: int, n: int, rng: np.random.Generator, max_bytes: int = 64 << 20) -> list[np.ndarray]:
    """Float32 attention rows (each row sums to about 1, ~37% above the fair share):
    up to 64 arrays of shape ``(n,)`` (one head) or ``(heads, n)``, within ``max_bytes``."""
    m = int(min(64, max(2, max_bytes // (4 * heads * n))))
    pool = []
    for _ in range(m):
        a = rng.exponential(size=(heads, n))
        a /= a.sum(axis=1, keepdims=True)
        a = np.ascontiguousarray(a, dtype=np.float32)
        pool.append(a[0] if heads == 1 else a)
    return pool


def c_policy(state: State, sd: dict[str, Any] | None = None) -> Any:
    """The C-backed policy holding ``state``, through the public ``from_state_dict``."""
    return scissorhands.POLICIES[state.policy].from_state_dict(sd if sd is not None else state.state_dict())


#: States of at least this many slots are loaded with ``c_policy_loaded``.
_LOAD_DIRECTLY = 1 << 18


def c_policy_loaded(state: State, threads: int = 1) -> Any:
    """The C-backed policy holding ``state``, loaded through the thin native layer
    (``sh_policy_import_state``) rather than ``from_state_dict``, for states of millions
    of slots; the Python object's mirrors of the count and last position are then read
    back from C (``_sync``), as ``from_state_dict`` does."""
    obj = scissorhands.POLICIES[state.policy](**state.params())
    obj.threads = threads
    votes = scores = ffi.NULL
    if state.policy == "scissorhands":
        votes = ffi.from_buffer("uint32_t[]", state.scores)
    elif state.policy == "h2o":
        scores = ffi.from_buffer("double[]", state.scores)
    with obj._lock:
        check(lib.sh_policy_import_state(obj._ptr, state.heads, state.held, ffi.from_buffer("uint32_t[]", state.kept),
                                         votes, scores, ffi.NULL, ffi.NULL, state.last))
        obj._last = state.last
        obj._sync()
    return obj


class RawPolicy:
    """A C-backed policy of the package driven through its thin native layer
    (``scissorhands._native.lib``) rather than its Python methods: what ``c_raw`` and
    ``noop`` call.  The object is the package's own (built by ``from_state_dict``);
    only the per-call path is the bare C function."""

    def __init__(self, state: State) -> None:
        self.policy = c_policy(state) if state.heads * state.held < _LOAD_DIRECTLY else c_policy_loaded(state)
        self.ptr = self.policy._ptr
        self.heads = state.heads

    def load(self, state: State) -> None:
        """Replace the state (``sh_policy_import_state``: no Python parsing, for the
        untimed set-up between timed calls)."""
        votes = scores = ffi.NULL
        if state.policy == "scissorhands":
            votes = ffi.from_buffer("uint32_t[]", state.scores)
        elif state.policy == "h2o":
            scores = ffi.from_buffer("double[]", state.scores)
        check(lib.sh_policy_import_state(self.ptr, state.heads, state.held,
                                         ffi.from_buffer("uint32_t[]", state.kept), votes, scores,
                                         ffi.NULL, ffi.NULL, state.last))

    def count(self) -> int:
        return int(lib.sh_policy_count(self.ptr))

    def last(self) -> int:
        return int(lib.sh_policy_last_position(self.ptr))

    def capacity(self) -> int:
        return int(lib.sh_policy_capacity(self.ptr))

    def memory_bytes(self) -> int:
        return int(lib.sh_policy_memory_bytes(self.ptr))


def numpy_policy(state: State) -> Any:
    """The numpy baseline holding ``state``."""
    obj = NUMPY_POLICIES[state.policy](**state.params())
    obj.load(state.kept, state.scores, state.last)
    return obj


def reference_policy(ctx: Context, state: State, sd: dict[str, Any] | None = None) -> Any:
    """The pure-Python reference holding ``state`` (through ``from_state_dict``)."""
    return ctx.reference.POLICIES[state.policy].from_state_dict(sd if sd is not None else state.state_dict())


class _Positions:
    """Hands out increasing positions to the loops sharing one policy object."""

    def __init__(self, last: int) -> None:
        self.next = last + 1

    def take(self, number: int) -> int:
        start = self.next
        self.next += number
        return start


def _output_buffers(size: int) -> tuple[Any, Any, int]:
    """A victims buffer (its cdata keeps the array alive), ``*n_victims`` and the size."""
    victims = np.empty(size, dtype=np.uint32)
    return ffi.from_buffer("uint32_t[]", victims), ffi.new("size_t *"), size


# ---------------------------------------------------------------------------- loops
# Each returns run(number) -> elapsed ns of `number` calls in one tight loop; the
# argument list is built before the clock starts, so the loop body is the call alone.


def _seq(positions: _Positions, pool: list[Any], number: int) -> list[tuple[int, Any]]:
    p0 = positions.take(number)
    m = len(pool)
    return [(p0 + i, pool[i % m]) for i in range(number)]


def loop_api(step: Callable[..., Any], pool: list[Any], positions: _Positions) -> Callable[[int], int]:
    def run(number: int) -> int:
        seq = _seq(positions, pool, number)
        t0 = _clock()
        for pos, a in seq:
            step(pos, a)
        return _clock() - t0

    return run


def loop_c(fn: Any, obj: RawPolicy, budget: int, pool: list[Any], positions: _Positions) -> Callable[[int], int]:
    """``fn`` (``sh_policy_step`` or ``sh_noop_step``) with the API's arguments,
    including an ``ffi.from_buffer`` of the weights per call."""
    ptr, heads, n = obj.ptr, obj.heads, pool[0].shape[-1]
    vc, nv, cap = _output_buffers(4 * heads)
    fb, null, flags, f32 = ffi.from_buffer, ffi.NULL, _ADMIT | _EVICT, _F32

    def run(number: int) -> int:
        seq = _seq(positions, pool, number)
        rc = 0
        t0 = _clock()
        for pos, a in seq:
            rc = fn(ptr, flags, pos, f32, fb(a), heads, n, budget, vc, null, cap, nv)
        t1 = _clock()
        check(rc)
        return t1 - t0

    return run


def loop_separate(steps: list[Callable[..., Any]], pool: list[Any], positions: _Positions) -> Callable[[int], int]:
    rows = [list(a) for a in pool]  # row views, sliced before timing

    def run(number: int) -> int:
        seq = _seq(positions, rows, number)
        t0 = _clock()
        for pos, row in seq:
            for step, a in zip(steps, row):
                step(pos, a)
        return _clock() - t0

    return run


def loop_bandwidth(pool: list[np.ndarray], state_bytes: int) -> Callable[[int], int]:
    src = np.ones(state_bytes, dtype=np.uint8)
    dst = np.empty_like(src)
    reduce, copyto = np.add.reduce, np.copyto
    positions = _Positions(0)

    def run(number: int) -> int:
        seq = _seq(positions, pool, number)
        t0 = _clock()
        for _pos, a in seq:
            reduce(a, axis=None)
            copyto(dst, src)
        return _clock() - t0

    return run


# ---------------------------------------------------------------------------- results


def _ratio(num: Stat | None, den: Stat | None) -> float | None:
    if num is None or den is None or den.median_ns <= 0:
        return None
    return round(num.median_ns / den.median_ns, 3)


def _result(case: Case, stats: dict[str, Stat | None], held: int, **extra: Any) -> dict[str, Any]:
    c = stats.get("c")
    ratios = {
        "numpy/c": _ratio(stats.get("numpy"), c),
        "reference/c": _ratio(stats.get("reference"), c),
        "c/noop": _ratio(c, stats.get("noop")),
        "c/c_raw": _ratio(c, stats.get("c_raw")),
        "c_raw/noop": _ratio(stats.get("c_raw"), stats.get("noop")),
        "separate/c": _ratio(stats.get("separate"), c),
        "c/bandwidth": _ratio(c, stats.get("bandwidth")),
        "c_raw/bandwidth": _ratio(stats.get("c_raw"), stats.get("bandwidth")),
        "c/c_threads": _ratio(c, stats.get("c_threads")),
    }
    derived: dict[str, Any] = {}
    if c is not None and stats.get("c_raw") is not None:
        derived["api_overhead_ns"] = round(c.median_ns - stats["c_raw"].median_ns, 1)
    if stats.get("c_raw") is not None and stats.get("noop") is not None:
        work = stats["c_raw"].median_ns - stats["noop"].median_ns
        derived["c_work_ns"] = round(work, 1)
        derived["c_work_ns_per_slot"] = round(work / (held * case.heads), 4)
    if c is not None:
        derived["c_ns_per_slot"] = round(c.median_ns / (held * case.heads), 4)
    return {
        "name": case.name,
        "group": case.group,
        "policy": case.policy,
        "budget": case.budget,
        "heads": case.heads,
        "held": held,
        "weights": case.heads * held,
        "unit": "ns per call",
        "impls": {k: (v.to_dict() if v is not None else None) for k, v in stats.items()},
        "ratios": {k: v for k, v in ratios.items() if v is not None},
        **derived,
        **extra,
    }


# ---------------------------------------------------------------------------- decode step


def run_step_case(ctx: Context, case: Case) -> dict[str, Any]:
    """One decode step (``step(pos, attn)``, one victim per row) in the steady state;
    every implementation holds its own copy of the state, and they are timed
    interleaved."""
    policy, budget, heads = case.policy, case.budget, case.heads
    rng = ctx.rng(case.name)
    state = steady_state(policy, budget, heads, budget, rng)
    pool = attention_pool(heads, budget, rng)
    sd = state.state_dict()
    start = state.last

    obj = c_policy(state, sd)
    raw = RawPolicy(state)
    runs: dict[str, Callable[[int], int]] = {
        "c": loop_api(obj.step, pool, _Positions(start)),
        "c_raw": loop_c(lib.sh_policy_step, raw, budget, pool, _Positions(start)),
        "noop": loop_c(lib.sh_noop_step, raw, budget, pool, _Positions(0)),
    }
    if heads > 1:
        objs = [c_policy(state.row(h)) for h in range(heads)]
        runs["separate"] = loop_separate([o.step for o in objs], pool, _Positions(start))
    runs["numpy"] = loop_api(numpy_policy(state).step, pool, _Positions(start))
    if ctx.reference_allowed(heads * budget):
        runs["reference"] = loop_api(reference_policy(ctx, state, sd).step, pool, _Positions(start))
    extra: dict[str, Any] = {}
    if heads > 1:
        state_bytes = raw.memory_bytes() - int(lib.SH_HEADER_BYTES)
        runs["bandwidth"] = loop_bandwidth(pool, state_bytes)
        extra["bandwidth_bytes"] = state_bytes + pool[0].nbytes

    stats: dict[str, Stat | None] = dict(time_batches(runs, ctx.settings, ctx.loop_ns))
    stats.setdefault("reference", None)
    for name, held in (("C policy", obj.kept_count()), ("raw C policy", raw.count())):
        if held != budget:
            raise RuntimeError(f"{case.name}: the {name} left the steady state ({held} held)")
    return _result(case, stats, budget, **extra)


# ---------------------------------------------------------------------------- serving shapes


def run_serving_case(ctx: Context, case: Case) -> dict[str, Any]:
    """A decode step at a serving shape (``step(pos, attn)``, one victim per row, the
    steady state): the C path beside numpy and the bandwidth floor (a pass that reads
    the weights once and copies the state once), and, where the rows hold at least
    ``PARALLEL_MIN_SLOTS`` positions, the same API call on ``SERVING_THREADS`` threads.
    Every implementation holds its own copy of the state; they are timed interleaved.
    Afterwards one more step on fresh copies checks that C (on one thread and on
    several) and numpy evict the same positions."""
    policy, budget, heads = case.policy, case.budget, case.heads
    rng = ctx.rng(case.name)
    state = steady_state(policy, budget, heads, budget, rng)
    pool = attention_pool(heads, budget, rng)
    big = heads * budget >= _LOAD_DIRECTLY

    def make_c(threads: int = 1) -> Any:
        if big:
            return c_policy_loaded(state, threads)
        c = c_policy(state)
        c.threads = threads
        return c

    obj = make_c()
    raw = RawPolicy(state)
    start = state.last
    runs: dict[str, Callable[[int], int]] = {
        "c": loop_api(obj.step, pool, _Positions(start)),
        "c_raw": loop_c(lib.sh_policy_step, raw, budget, pool, _Positions(start)),
        "noop": loop_c(lib.sh_noop_step, raw, budget, pool, _Positions(0)),
    }
    threaded = heads > 1 and heads * budget >= PARALLEL_MIN_SLOTS
    if threaded:
        obj_t = make_c(SERVING_THREADS)
        runs["c_threads"] = loop_api(obj_t.step, pool, _Positions(start))
    runs["numpy"] = loop_api(numpy_policy(state).step, pool, _Positions(start))
    if heads == 1 and ctx.reference_allowed(budget):
        runs["reference"] = loop_api(reference_policy(ctx, state).step, pool, _Positions(start))
    state_bytes = raw.memory_bytes() - int(lib.SH_HEADER_BYTES)
    runs["bandwidth"] = loop_bandwidth(pool, state_bytes)

    stats: dict[str, Stat | None] = dict(time_batches(runs, ctx.settings, ctx.loop_ns))
    stats.setdefault("reference", None)
    stats.setdefault("c_threads", None)
    held_now = [("C policy", obj.kept_count()), ("raw C policy", raw.count())]
    if threaded:
        held_now.append(("threaded C policy", obj_t.kept_count()))
    for name, held in held_now:
        if held != budget:
            raise RuntimeError(f"{case.name}: the {name} left the steady state ({held} held)")
    del obj, raw, runs
    if threaded:
        del obj_t
    gc.collect()

    # One more step on fresh copies: the same victims everywhere?
    a = pool[0]
    want = np.asarray(numpy_policy(state).step(state.last + 1, a))
    same = np.array_equal(np.asarray(make_c().step(state.last + 1, a)), want)
    if threaded:
        same = same and np.array_equal(np.asarray(make_c(SERVING_THREADS).step(state.last + 1, a)), want)
    extra = {"bandwidth_bytes": state_bytes + pool[0].nbytes, "threads": SERVING_THREADS if threaded else None,
             "impls_same_victims": bool(same)}
    return _result(case, stats, budget, **extra)


# ---------------------------------------------------------------------------- eviction


def _prepare_evict_api(make: Callable[[], Any], bulk: bool, target: int, state: Any,
                       pool: Any) -> Callable[[], tuple[Any, tuple[Any, ...]]]:
    """Set-up of an eviction for an object with the policy API (C, numpy, reference)."""
    if bulk:
        def prep() -> tuple[Any, tuple[Any, ...]]:
            return make().evict, (target,)
        return prep
    obj = make()
    positions = _Positions(state.last)
    m = len(pool)

    def prep_one() -> tuple[Any, tuple[Any, ...]]:
        pos = positions.take(1)
        obj.on_decode_step(pos, pool[pos % m])
        return obj.evict, (target,)
    return prep_one


def _prepare_evict_raw(fn: Any, bulk: bool, target: int, state: Any, pool: Any, heads: int, held: int,
                       budget: int) -> Callable[[], tuple[Any, tuple[Any, ...]]]:
    """Set-up of an eviction for the raw C call ``fn`` (``sh_policy_step`` or the no-op)."""
    raw = RawPolicy(state)
    vc, nv, cap = _output_buffers(held * heads)
    args = (raw.ptr, _EVICT, 0, _NONE, ffi.NULL, heads, 0, target, vc, ffi.NULL, cap, nv)
    if bulk:
        def prep() -> tuple[Any, tuple[Any, ...]]:
            raw.load(state)
            return fn, args
        return prep
    positions = _Positions(state.last)
    step = lib.sh_policy_step
    m = len(pool)

    def prep_one() -> tuple[Any, tuple[Any, ...]]:
        if raw.count() == held:  # the no-op evicted nothing: evict for real, untimed
            check(step(*args))
        pos = positions.take(1)
        a = pool[pos % m]
        check(step(raw.ptr, _ADMIT, pos, _F32, ffi.from_buffer(a), heads, budget, budget, vc, ffi.NULL,
                   cap, nv))
        return fn, args
    return prep_one


def run_evict_case(ctx: Context, case: Case) -> dict[str, Any]:
    """``evict(b)`` alone, each call after an untimed set-up.

    ``evict-one``: the split form of a decode step in the steady state, as the harness
    calls it: ``on_decode_step(pos, attn)`` (untimed) takes the policy to ``budget + 1``,
    then ``evict(budget)`` drops one. ``evict-bulk``: from the steady state (``budget``
    held, restored before every call: ``from_state_dict`` for the Python-level objects,
    ``sh_policy_import`` for the raw one), ``evict(budget - budget // 4)`` drops a
    quarter at once. (A fresh Python-level object allocates its victims buffer on its
    first eviction: a few µs included in ``c``, small beside the list of victims.)
    """
    policy, budget, heads = case.policy, case.budget, case.heads
    bulk = case.group == "evict-bulk"
    held = budget if bulk else budget + 1
    target = budget - budget // 4 if bulk else budget
    rng = ctx.rng(case.name)
    state = steady_state(policy, budget, heads, budget, rng)
    pool = attention_pool(heads, budget, rng)
    sd = state.state_dict()
    preps = {
        "c": _prepare_evict_api(lambda: c_policy(state, sd), bulk, target, state, pool),
        "c_raw": _prepare_evict_raw(lib.sh_policy_step, bulk, target, state, pool, heads, held, budget),
        "noop": _prepare_evict_raw(lib.sh_noop_step, bulk, target, state, pool, heads, held, budget),
        "numpy": _prepare_evict_api(lambda: numpy_policy(state), bulk, target, state, pool),
    }
    if ctx.reference_allowed(heads * held):
        preps["reference"] = _prepare_evict_api(lambda: reference_policy(ctx, state, sd), bulk, target, state, pool)
    stats: dict[str, Stat | None] = dict(time_eaches(preps, ctx.settings, ctx.timer_ns))
    stats.setdefault("reference", None)

    # The same call on the same state: do the C path and the numpy baseline agree?
    c, npo = c_policy(state, sd), numpy_policy(state)
    if not bulk:
        c.on_decode_step(state.last + 1, pool[0])
        npo.on_decode_step(state.last + 1, pool[0])
    same = np.array_equal(np.asarray(c.evict(target)), np.asarray(npo.evict(target)))
    return _result(case, stats, held, victims=held - target, numpy_same_victims=bool(same))


# ---------------------------------------------------------------------------- replay


def _trace(ctx: Context) -> Any:
    if ctx._trace is None:
        from scissorhands.commands.harness import prepare
        from scissorhands.commands.traces import decode_trace

        ctx._trace = prepare(decode_trace())
    return ctx._trace


def run_replay_case(ctx: Context, case: Case) -> dict[str, Any]:
    """The canonical ``decode-4096`` replay at budget 512 through the harness: the
    policy's time per step (``on_decode_step`` + ``evict``) and its share of the step."""
    try:
        from scissorhands.commands.harness import replay
    except ImportError as exc:  # pragma: no cover - the harness exists in this tree
        ctx.note(f"replay skipped: scissorhands.commands.harness not importable ({exc})")
        return {"name": case.name, "group": case.group, "policy": case.policy, "skipped": str(exc)}
    trace = _trace(ctx)
    policy, budget = case.policy, case.budget
    params = {"budget": budget, **default_params(policy, budget)}
    makers: dict[str, Callable[[], Any]] = {
        "c": lambda: scissorhands.POLICIES[policy](**params),
        "numpy": lambda: NUMPY_POLICIES[policy](**params),
    }
    if ctx.reference is not None and not ctx.quick:
        makers["reference"] = lambda: ctx.reference.POLICIES[policy](**params)
    elif ctx.reference is not None:
        ctx.note("--quick: the replay case skips the pure-Python reference")
    impls: dict[str, Any] = {}
    metrics: dict[str, Any] = {}
    for impl, make in makers.items():
        repeats = 1 if (impl == "reference" or ctx.quick) else 3
        policy_ns, wall_ns = [], []
        for _ in range(repeats):
            p = make()
            t0 = _clock()
            r = replay(p, trace, budget)
            wall_ns.append((_clock() - t0) / r.steps)
            policy_ns.append(r.policy_seconds * 1e9 / r.steps)
        metrics[impl] = (r.retained_mass, r.heavy_hitter_recall, r.eviction_calls)
        impls[impl] = {
            "policy_ns_per_step": Stat.of(policy_ns, r.steps).to_dict(),
            "replay_ns_per_step": Stat.of(wall_ns, r.steps).to_dict(),
            "policy_share": round(statistics.median(policy_ns) / statistics.median(wall_ns), 4),
            "retained_mass": r.retained_mass,
            "heavy_hitter_recall": r.heavy_hitter_recall,
            "eviction_calls": r.eviction_calls,
        }
    c = impls["c"]["policy_ns_per_step"]["median_ns"]
    ratios = {f"{k}/c": round(v["policy_ns_per_step"]["median_ns"] / c, 3) for k, v in impls.items() if k != "c"}
    return {
        "name": case.name,
        "group": case.group,
        "policy": policy,
        "budget": budget,
        "heads": 1,
        "trace": trace.name,
        "steps": trace.steps,
        "unit": "ns per decode step",
        "impls": impls,
        "ratios": ratios,
        "same_metrics": len(set(metrics.values())) == 1,
    }


# ---------------------------------------------------------------------------- memory


def _traced_bytes(build: Callable[[], Any]) -> tuple[Any, int]:
    """``build()`` and the bytes it leaves allocated (tracemalloc)."""
    gc.collect()
    started = tracemalloc.is_tracing()
    if not started:
        tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    obj = build()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    if not started:
        tracemalloc.stop()
    return obj, after - before


def run_memory_case(ctx: Context, case: Case) -> dict[str, Any]:
    """``memory_bytes()`` per slot in the steady state, for every policy and budget;
    checked against tracemalloc where Python allocates (reference, numpy baseline).

    The capacity comes from a raw C object driven through the same state and steps
    (its ``memory_bytes`` must equal the Python object's)."""
    rows = []
    settle_steps = 3  # admit + evict: the capacity reaches its steady value
    for policy in POLICY_NAMES:
        for budget in DECODE_BUDGETS:
            rng = ctx.rng("memory", policy, budget)
            state = steady_state(policy, budget, 1, budget, rng)
            pool = attention_pool(1, budget, rng, max_bytes=1)

            def settle(p: Any, state: State = state, pool: list[np.ndarray] = pool) -> Any:
                for i in range(settle_steps):
                    p.step(state.last + 1 + i, pool[i % len(pool)])
                return p

            c = settle(c_policy(state))
            raw = RawPolicy(state)
            vc, nv, cap_v = _output_buffers(4)
            for i in range(settle_steps):
                a = pool[i % len(pool)]
                check(lib.sh_policy_step(raw.ptr, _ADMIT | _EVICT, state.last + 1 + i, _F32, ffi.from_buffer(a),
                                         1, budget, budget, vc, ffi.NULL, cap_v, nv))
            cap = raw.capacity()
            mb = c.memory_bytes()
            row: dict[str, Any] = {
                "policy": policy,
                "budget": budget,
                "held": c.kept_count(),
                "capacity": cap,
                "c_memory_bytes": mb,
                "raw_memory_bytes_agree": raw.memory_bytes() == mb,
                "c_bytes_per_slot": (mb - int(lib.SH_HEADER_BYTES)) / cap,
                "c_bytes_per_held_slot": round(mb / c.kept_count(), 3),
                "promised_bytes_per_slot": SPECS[policy].slot_bytes,
            }
            npo, npo_bytes = _traced_bytes(lambda state=state: settle(numpy_policy(state)))
            row["numpy_memory_bytes"] = npo.memory_bytes()
            row["numpy_traced_bytes_per_held_slot"] = round(npo_bytes / npo.kept_count(), 2)
            if ctx.reference is not None and not (ctx.quick and budget > 512):
                sd = state.state_dict()
                ref, ref_bytes = _traced_bytes(lambda state=state, sd=sd: settle(reference_policy(ctx, state, sd)))
                row["reference_memory_bytes"] = ref.memory_bytes()
                row["reference_formula_bytes_per_held_slot"] = round(ref.memory_bytes() / ref.kept_count(), 3)
                row["reference_traced_bytes"] = ref_bytes
                row["reference_traced_bytes_per_held_slot"] = round(ref_bytes / ref.kept_count(), 2)
                row["reference_formula_matches_c"] = ref.memory_bytes() == mb
            rows.append(row)
    if ctx.quick and ctx.reference is not None:
        ctx.note("--quick: reference memory measured at budgets <= 512 only")
    return {"name": case.name, "group": case.group, "unit": "bytes", "rows": rows}


# ---------------------------------------------------------------------------- overhead


class _Empty:
    """A method that does nothing: the cost of a Python-level call."""

    def f(self, pos: Any, attn: Any) -> None:
        return None


#: The pieces of a decode step through the Python API, each ``(label, statement)``.
_OVERHEAD_PIECES = [
    ("empty loop iteration", "pass"),
    ("obj.step(next(counter), attn): the whole API call", "obj.step(next(api_pos), a)"),
    ("sh_policy_step(12 arguments) with fb(attn) and next(counter): raw C",
     "step(ptr, 3, next(raw_pos), 1, fb(a), 1, n, n, vc, NULL, 4, nv)"),
    ("sh_noop_step(12 arguments) with fb(attn) and next(counter): the floor",
     "noop(ptr, 3, next(dummy_pos), 1, fb(a), 1, n, n, vc, NULL, 4, nv)"),
    ("next(counter) (part of the three above)", "next(dummy_pos)"),
    ("sh_noop_step(12 arguments), buffer pre-built", "noop(ptr, 3, 1, 1, ca, 1, n, n, vc, NULL, 4, nv)"),
    ("ffi.from_buffer(attn) (bound)", "fb(a)"),
    ("sh_policy_count(ptr) (a trivial C call, 1 argument)", "count(ptr)"),
    ("Python method call (2 arguments, returns None)", "m.f(1, a)"),
    ("with lock: (acquire + release)", "with lock: pass"),
    ("acquire(); release() (bound lock methods, as step() calls them)", "acq(); rel()"),
    ("lib.SH_STEP_ADMIT (a cffi constant, looked up on lib)", "lib.SH_STEP_ADMIT"),
    ("lib.sh_noop_step (a function, looked up on lib, not called)", "lib.sh_noop_step"),
    ("type(attn) is np.ndarray", "type(a) is np.ndarray"),
    ("attn.flags.c_contiguous", "a.flags.c_contiguous"),
    ("attn.ndim == 1 and len(attn) (the short path's rank and length)", "a.ndim == 1 and len(a)"),
    ("attn.shape == (h, n) or ... (shape check)", "a.shape == (1, n) or a.shape == (n,)"),
    ("victims[:k].tolist() (k = 1)", "vic[:1].tolist()"),
    ("ffi.unpack(victims_c, 1) (bound)", "unpack(vc, 1)"),
    ("[victims_c[0]] (one victim, indexed)", "[vc[0]]"),
    ("n_victims[0] (read a cffi size_t *)", "nv[0]"),
]
#: The pieces inside the policies' Python layer (timed when its internals import).
_INTERNAL_PIECES = [
    ("check_int('pos', pos, 0, 2**32 - 1)", "check_int('pos', n, 0, 4294967295)"),
    ("as_weights(attn) (float32, contiguous)", "as_weights(a)"),
    ("attn.dtype in _DTYPE_CODES", "a.dtype in codes"),
    ("_DTYPE_CODES[attn.dtype]", "codes[a.dtype]"),
    ("check(rc, name) with rc == 0", "check(0, 'Scissorhands')"),
]


def _overhead_env(obj: Any, raw: RawPolicy, a: Any, budget: int, state: Any) -> tuple[dict[str, Any], bool]:
    """The names the pieces' statements use, and whether the policies' internals are among them."""
    vic = np.empty(4, dtype=np.uint32)
    bound_lock = threading.Lock()
    env = {
        "obj": obj, "a": a, "lib": lib, "ffi": ffi, "check": check, "vic": vic,
        "ptr": raw.ptr, "n": budget, "lock": threading.Lock(), "np": np,
        "acq": bound_lock.acquire, "rel": bound_lock.release,
        "vc": ffi.from_buffer("uint32_t[]", vic), "nv": ffi.new("size_t *"),
        "ca": ffi.from_buffer(a), "m": _Empty(), "noop": lib.sh_noop_step, "fb": ffi.from_buffer,
        "NULL": ffi.NULL, "count": lib.sh_policy_count, "unpack": ffi.unpack, "step": lib.sh_policy_step,
        "api_pos": itertools.count(state.last + 1), "raw_pos": itertools.count(state.last + 1),
        "dummy_pos": itertools.count(),
    }
    try:
        from scissorhands._shared import check_int
        from scissorhands.policies import _base

        env["check_int"], env["as_weights"], env["codes"] = check_int, _base.as_weights, _base._DTYPE_CODES
        internals = True
    except (ImportError, AttributeError):  # pragma: no cover - depends on the policies' internals
        internals = False
    return env, internals


def _time_pieces(pieces: list[tuple[str, str]], env: dict[str, Any], quick: bool) -> list[dict[str, Any]]:
    """Each piece timed with ``timeit`` in interleaved rounds, per occurrence, the empty loop subtracted."""
    number = 2_000 if quick else 10_000
    rounds = 3 if quick else 21
    setup = "; ".join(f"{k} = _env[{k!r}]" for k in env)
    timers = [timeit.Timer(stmt, setup=setup, globals={"_env": env}) for _, stmt in pieces]
    samples: list[list[float]] = [[] for _ in pieces]
    for timer in timers:  # warm-up
        timer.timeit(number // 10)
    for _ in range(rounds):
        for i, timer in enumerate(timers):
            samples[i].append(timer.timeit(number) * 1e9 / number)
    empty = statistics.median(samples[0])
    rows = []
    for (label, stmt), ns in zip(pieces, samples):
        sub = 0.0 if stmt == "pass" else empty
        rows.append({"piece": label, "stmt": stmt, "ns": round(statistics.median(ns) - sub, 1),
                     "min_ns": round(min(ns) - sub, 1)})
    return rows


def _calls_per_step(ctx: Context, obj: Any, pool: Any, first: int) -> dict[str, float]:
    """The calls per decode step of the Python API, counted by cProfile over 2000 steps."""
    calls: dict[str, float] = {}
    try:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        steps = 2000
        prof.enable()
        for i in range(steps):
            obj.step(first + i, pool[i % len(pool)])
        prof.disable()
        st = pstats.Stats(prof)
        for (file, line, fn), (_cc, nc, _tt, _ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
            where = fn if file == "~" else f"{file.rsplit('/', 1)[-1]}:{line}({fn})"
            if nc >= steps and "_lsprof" not in where:
                calls[where] = round(nc / steps, 2)
    except Exception as exc:  # pragma: no cover - profiling is best effort
        ctx.note(f"overhead: cProfile call counts unavailable ({exc})")
    return dict(sorted(calls.items(), key=lambda kv: (-kv[1], kv[0])))


def run_overhead_case(ctx: Context, case: Case) -> dict[str, Any]:
    """Where the Python API's time per decode step goes.

    The whole ``step(pos, attn)``, the direct C call and the no-op floor, beside the
    unit cost of each piece the API performs, all timed with ``timeit`` in interleaved
    rounds (so the machine's slow spells touch them alike), per occurrence, the empty
    loop subtracted. The call counts per step come from cProfile.
    """
    budget = case.budget
    state = steady_state("scissorhands", budget, 1, budget, ctx.rng(case.name))
    pool = attention_pool(1, budget, ctx.rng(case.name, "attn"))
    obj = c_policy(state)
    raw = RawPolicy(state)
    env, internals = _overhead_env(obj, raw, pool[0], budget, state)
    pieces = _OVERHEAD_PIECES + (_INTERNAL_PIECES if internals else [])
    rows = _time_pieces(pieces, env, ctx.quick)
    if obj.kept_count() != budget or raw.count() != budget:
        raise RuntimeError(f"{case.name}: a policy left the steady state")
    calls = _calls_per_step(ctx, obj, pool, next(env["api_pos"]))
    by = {r["stmt"]: r["ns"] for r in rows}
    api, raw_ns, floor = by["obj.step(next(api_pos), a)"], by[pieces[2][1]], by[pieces[3][1]]
    return {
        "name": case.name,
        "group": case.group,
        "policy": "scissorhands",
        "budget": budget,
        "heads": 1,
        "unit": "ns per occurrence",
        "step_ns": api,
        "raw_ns": raw_ns,
        "noop_ns": floor,
        "api_overhead_ns": round(api - raw_ns, 1),
        "pieces": rows,
        "calls_per_step": calls,
    }


# ---------------------------------------------------------------------------- registry


def _build_cases() -> list[Case]:
    cases: list[Case] = []
    for group in ("decode", "evict-one", "evict-bulk"):
        run = run_step_case if group == "decode" else run_evict_case
        for policy in POLICY_NAMES:
            for budget in DECODE_BUDGETS:
                cases.append(Case(f"{group}/{policy}/{budget}", group, run, policy, budget))
    for policy in POLICY_NAMES:
        for heads, budget in BATCH_SHAPES:
            cases.append(Case(f"batch/{policy}/{heads}x{budget}", "batch", run_step_case, policy, budget, heads,
                              quick=heads * budget < 1 << 20))
    for policy in POLICY_NAMES:
        for heads, budget in SERVING_SHAPES:
            cases.append(Case(f"serving/{policy}/{heads}x{budget}", "serving", run_serving_case, policy, budget,
                              heads, quick=heads * budget < 1 << 20))
    for policy in POLICY_NAMES:
        cases.append(Case(f"replay/{policy}/{REPLAY_BUDGET}", "replay", run_replay_case, policy, REPLAY_BUDGET))
    cases.append(Case("memory", "memory", run_memory_case))
    cases.append(Case("overhead/scissorhands/128", "overhead", run_overhead_case, "scissorhands", 128))
    return cases


#: Every case, in run order.
CASES: list[Case] = _build_cases()
