"""The C core's kernels and threads: the AVX2 and the scalar path give identical results,
at sizes where the vector loops and their tails both run, and so does any thread count.

The vector, differential and semantics suites already run on both kernel paths, but
their policies are small (a handful of slots: mostly the scalar tails). Here rows hold
17 to 300 slots, with ties, exact fair shares, saturated votes, scores that differ in
their last bit, sinks, no recent window (the newcomer may go at once), rows of
different counts and bulk evictions; every result is compared across the two paths
and with the pure-Python reference. The thread tests use calls large enough to be
split (``PARALLEL_MIN_SLOTS``), on every policy.
"""

from __future__ import annotations

import copy
import math
import os
import pickle
import platform
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from c_paths import PATHS, on_path

import scissorhands
import scissorhands.reference as reference
from scissorhands import _shared
from scissorhands._native import lib
from scissorhands.errors import InvalidInputError, InvalidTypeError
from scissorhands.options import SPECS

UINT32_MAX = 2**32 - 1
SIZES = (17, 40, 97, 300)
HEAVY = ("scissorhands", "h2o", "tova")


def plain(value: Any) -> Any:
    """Results as comparable plain data."""
    if isinstance(value, np.ndarray):
        return (str(value.dtype), value.tolist())
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def outcome(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``("ok", result)`` or ``("raised", exception class name)``."""
    try:
        return ("ok", plain(fn(*args, **kwargs)))
    except (TypeError, ValueError) as exc:
        return ("raised", type(exc).__name__)


def weights(rng: np.random.Generator, heads: int, n: int, dtype: Any) -> np.ndarray:
    """One step's weights, of a kind drawn at random: spread out, on a coarse grid (ties
    and weights exactly at the fair share), all equal (nobody votes) or a few spikes."""
    kind = rng.integers(0, 4)
    if kind == 0:
        w = rng.exponential(size=(heads, n))
        w /= w.sum(axis=1, keepdims=True)
    elif kind == 1:
        w = rng.integers(0, 4, size=(heads, n)) / max(n, 1)
    elif kind == 2:
        w = np.full((heads, n), 1.0 / max(n, 1))
    else:
        w = np.zeros((heads, n))
        w[:, rng.integers(0, max(n, 1), size=3)] = 0.3
    return np.ascontiguousarray(w.astype(dtype))


class Trio:
    """One policy three times: C on the AVX2 path, C on the scalar path, the reference."""

    def __init__(self, policy: str, state: dict[str, Any] | None = None, **params: Any) -> None:
        self.objs = []
        for module in (scissorhands, scissorhands, reference):
            cls = module.POLICIES[policy]
            self.objs.append(cls.from_state_dict(state) if state is not None else cls(**params))

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        outs = []
        for obj, path in zip(self.objs, (*PATHS, "simd")):
            with on_path(path):
                outs.append(outcome(getattr(obj, name), *args, **kwargs))
        assert outs[0] == outs[1], f"{name}: AVX2 {outs[0]!r:.300} != scalar {outs[1]!r:.300}"
        assert outs[0] == outs[2], f"{name}: C {outs[0]!r:.300} != reference {outs[2]!r:.300}"
        return outs[0]

    def check(self) -> None:
        states = [o.state_dict() for o in self.objs]
        assert states[0] == states[1], "AVX2 and scalar states differ"
        assert states[0] == states[2], "C and reference states differ"


# ---------------------------------------------------------------- the two paths


def test_simd_switch_and_level():
    """sh_set_simd(0) forces the scalar kernels and returns the previous setting; allowed,
    the level is AVX2 exactly when this CPU reports AVX2 (on Linux x86-64)."""
    before = lib.sh_set_simd(0)  # 0 already when SCISSORHANDS_SIMD=0 (the sanitizer's second pass)
    try:
        assert before in (0, 1)
        assert lib.sh_simd_level() == lib.SH_SIMD_SCALAR
        assert lib.sh_set_simd(1) == 0
        level = lib.sh_simd_level()
    finally:
        lib.sh_set_simd(before)
    if sys.platform == "linux" and platform.machine() == "x86_64":
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
        assert level == (lib.SH_SIMD_AVX2 if "avx2" in flags else lib.SH_SIMD_SCALAR)
    else:
        assert level in (lib.SH_SIMD_AVX2, lib.SH_SIMD_SCALAR)


def test_environment_variable_forces_the_scalar_path():
    """SCISSORHANDS_SIMD=0 when the package is imported makes every call use the scalar kernels."""
    code = "from scissorhands._native import lib; print(lib.sh_simd_level())"
    env = dict(os.environ, SCISSORHANDS_SIMD="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(lib.SH_SIMD_SCALAR)


@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("budget", SIZES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("policy", HEAVY)
@pytest.mark.parametrize("protect", ["none", "sinks", "half"])
def test_decode_paths_agree(policy, dtype, budget, heads, protect):
    """A long decode (fused one-victim steps, steps that evict more, split steps and bulk
    evictions) gives the same victims, slots and state on both paths and the reference."""
    rw, sinks = {"none": (0, 0), "sinks": (5, 3), "half": (budget // 2, 0)}[protect]
    rw = max(rw, SPECS[policy].min_recent_window)  # TOVA always keeps its newest position
    rng = np.random.default_rng([budget, heads, len(policy), len(protect)])
    trio = Trio(policy, budget=budget, recent_window=rw, sinks=sinks, heads=heads)
    for pos in range(1, int(budget * 1.5) + 41):
        n = trio.objs[2].kept_count()
        w = weights(rng, heads, n, dtype)
        if heads == 1 and rng.random() < 0.5:
            w = w[0]
        r = rng.random()
        if r < 0.08:  # a split step, then a bulk eviction to a smaller budget
            trio.call("on_decode_step", pos, w)
            trio.call("evict", int(rng.integers(rw + sinks + 1, budget + 1)), return_indices=True)
        elif r < 0.12:  # admit without evicting: the next step evicts two
            trio.call("on_decode_step", pos, w)
        else:
            trio.call("step", pos, w, return_indices=bool(rng.random() < 0.5))
    trio.check()


@pytest.mark.parametrize("policy", HEAVY)
@pytest.mark.parametrize("n", [9, 33, 130])
def test_bulk_selection_paths_agree(policy, n):
    """Bulk evictions over keys that tie across vector blocks, differ only in a low byte or
    bit, or saturate (UINT32_MAX votes, DBL_MAX scores) agree on both paths and the reference."""
    rng = np.random.default_rng(n)
    if policy == "scissorhands":
        pool = [0, 1, 255, 256, 257, 65535, 65536, 2**24, 2**24 + 1, UINT32_MAX - 1, UINT32_MAX]
    else:
        one = 1.0
        pool = [0.0, 5e-324, 1e-300, one, math.nextafter(one, 2), math.nextafter(math.nextafter(one, 2), 2),
                0.5, 2.0, 1e300, sys.float_info.max]
    for trial in range(12):
        values = [pool[i] for i in rng.integers(0, len(pool) if trial % 3 else 3, size=n)]
        state = scissorhands.POLICIES[policy](budget=n, recent_window=2, sinks=1).state_dict()
        state.update(kept=[list(range(n))], last_position=n - 1)
        state["votes" if policy == "scissorhands" else "scores"] = [values]
        trio = Trio(policy, state)
        trio.call("evict", int(rng.integers(4, n + 1)), return_indices=True)
        trio.check()


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_tova_assignment_paths_agree(dtype):
    """TOVA's assignment over rows of 40 slots (vector body and tails, fused one-victim steps
    and bulk evictions) with ties, subnormals and -0.0 (stored as 0.0: no score keeps the
    sign bit, which would order it last) agrees on both paths and the reference."""
    rng = np.random.default_rng(11)
    pool = np.array([0.0, -0.0, 5e-324, 1e-300, 0.25, 0.5, 1.0], dtype=dtype)
    trio = Trio("tova", budget=40, recent_window=1, heads=2)
    for pos in range(1, 120):
        n = trio.objs[2].kept_count()
        w = np.ascontiguousarray(pool[rng.integers(0, len(pool), size=(2, n))])
        if rng.random() < 0.2:
            trio.call("on_decode_step", pos, w)
            trio.call("evict", int(rng.integers(2, 41)), return_indices=True)
        else:
            trio.call("step", pos, w, return_indices=True)
        for obj in trio.objs:
            assert not np.signbit(obj.scores).any()
    trio.check()


def test_saturated_votes_agree():
    """Votes at and next to UINT32_MAX saturate alike on both paths and the reference."""
    n = 50
    state = scissorhands.Scissorhands(budget=n, recent_window=3).state_dict()
    state.update(kept=[list(range(n))], last_position=n - 1,
                 votes=[[UINT32_MAX - (i % 3) for i in range(n)]])
    trio = Trio("scissorhands", state)
    for t in range(n, n + 6):
        trio.call("step", t, np.full(trio.objs[2].kept_count(), 1.0, dtype=np.float32))
    trio.check()


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("policy", HEAVY)
def test_a_bad_weight_is_found_anywhere(policy, dtype):
    """A NaN, infinite or negative weight at any index (vector body or tail, any row) is
    refused on both paths, and the policy is left exactly as it was."""
    n, heads = 37, 3
    for path in PATHS:
        with on_path(path):
            p = scissorhands.POLICIES[policy](budget=n, recent_window=2, heads=heads)
            for t in range(1, n):
                p.step(t, np.full((heads, p.kept_count()), 0.5, dtype=dtype))
            before = p.state_dict()
            for bad in (math.nan, math.inf, -1e-30):
                for i in range(n):
                    w = np.full((heads, n), 0.01, dtype=dtype)
                    w[i % heads, i] = bad
                    with pytest.raises(InvalidInputError):
                        p.step(n, w)
            assert p.state_dict() == before


@pytest.mark.parametrize("policy", HEAVY)
def test_rows_of_different_counts_agree(policy):
    """step_rows on rows of different counts (each evicting none, one or several) agrees on
    both paths and the reference."""
    rng = np.random.default_rng(7)
    counts = [60, 45, 80, 1, 0]
    state = scissorhands.POLICIES[policy](budget=50, recent_window=4, heads=len(counts)).state_dict()
    state["kept"] = [sorted(rng.choice(200, size=c, replace=False).tolist()) for c in counts]
    key = "votes" if policy == "scissorhands" else "scores"
    state[key] = [(rng.integers(0, 5, size=c).tolist() if key == "votes" else (rng.integers(0, 5, size=c) / 4).tolist())
                  for c in counts]
    state["last_position"] = 199
    trio = Trio(policy, state)
    for t in range(200, 260):
        n = int(trio.objs[2].counts.max())
        budget = int(rng.integers(5, 70)) if rng.random() < 0.3 else None
        trio.call("step_rows", t, weights(rng, len(counts), n, np.float32), budget)
    trio.check()


@pytest.mark.parametrize("policy", ["scissorhands", "h2o", "tova", "streaming-llm"])
def test_step_fast_path_agrees_with_the_general_path(policy):
    """step(pos, attn) with the configured budget (which may go straight to C) and the same
    call through the general path (return_indices=True) give the same result or error."""
    params = {"budget": 20, "sinks": 2} if policy == "streaming-llm" else {"budget": 20, "recent_window": 3}
    base = scissorhands.POLICIES[policy](**params)
    for t in range(1, 25):
        base.step(t, np.full(base.kept_count(), 0.05))
    n, last = base.kept_count(), 24
    good = np.linspace(0.0, 0.1, n)
    inputs = [
        (last + 1, good.astype(np.float32)), (last + 1, good), (last + 1, good[None, :]),
        (last + 1, good.astype(np.float16)), (last + 1, good.astype(">f8")), (last + 1, good.tolist()),
        (last + 1, np.repeat(good, 2)[::2]), (last + 1, np.ones(n + 1)), (last + 1, np.ones((2, n))),
        (last + 1, np.array([math.nan] + [0.1] * (n - 1))), (last + 1, -good - 1),
        (last + 1, np.ones((1, 1, n))), (last + 1, np.float32(0.5)), (last + 1, None),
        (last, good), (-1, good), (2**32, good), (2**40, good), (True, good), (float(last + 1), good),
        (np.int64(last + 1), good),
    ]
    for pos, attn in inputs:
        fast, general = copy.deepcopy(base), copy.deepcopy(base)
        got = outcome(fast.step, pos, attn)
        want = outcome(general.step, pos, attn, return_indices=True)
        if want[0] == "ok":
            want = ("ok", want[1][0])
        assert got == want, (pos, attn)
        assert fast.state_dict() == general.state_dict() and fast.kept_count() == general.kept_count()


# ---------------------------------------------------------------- threads


def test_limits_agree_with_the_header():
    """_shared states the C header's thread limits exactly."""
    assert (_shared.MAX_THREADS, _shared.PARALLEL_MIN_SLOTS) == (lib.SH_MAX_THREADS, lib.SH_PARALLEL_MIN_SLOTS)


def test_threads_knob(backend):
    """threads is 1 by default, settable in [1, 64] (else the documented errors, nothing
    changes), kept by reset and select_rows, and not part of the state (a copy starts at 1)."""
    p = backend.Scissorhands(budget=8, recent_window=2, heads=2)
    assert p.threads == 1
    p.threads = 2
    assert p.threads == 2
    for bad, exc in ((0, InvalidInputError), (65, InvalidInputError), (-1, InvalidInputError),
                     (True, InvalidTypeError), (1.5, InvalidTypeError), ("2", InvalidTypeError)):
        with pytest.raises(exc):
            p.threads = bad
        assert p.threads == 2
    p.threads = np.int64(64)
    assert p.threads == 64
    p.reset()
    p.select_rows([1, 0, 0])
    assert p.threads == 64
    assert "threads" not in str(p.state_dict())
    for clone in (copy.deepcopy(p), pickle.loads(pickle.dumps(p)), type(p).from_state_dict(p.state_dict())):
        assert clone.threads == 1


def _threaded(policy: str, heads: int, budget: int, threads: int) -> Any:
    """A policy of ``heads`` rows holding ``budget`` each, on ``threads`` threads."""
    params = {"budget": budget}
    if policy in HEAVY:
        params["recent_window"] = 16
    elif policy == "streaming-llm":
        params["sinks"] = 4
    p = scissorhands.POLICIES[policy](heads=heads, **params)
    p.threads = threads
    for t in range(1, budget):
        p.step(t, None)
    return p


@pytest.mark.parametrize("policy", ["scissorhands", "h2o", "streaming-llm", "full"])
def test_threads_do_not_change_results(policy):
    """Calls split over 2, 3 or 7 threads (rows holding >= PARALLEL_MIN_SLOTS) return the
    victims and slots, and leave the state, of the same calls on one thread; a bad weight
    in the last row is refused before any row changes."""
    heads, budget = 80, 4096  # 327,680 slots: above the threshold
    assert heads * (budget - 600) >= _shared.PARALLEL_MIN_SLOTS
    rng = np.random.default_rng(3)
    ps = [_threaded(policy, heads, budget, t) for t in (1, 2, 3, 7)]
    pos = budget - 1

    def same(name: str, *args: Any, **kwargs: Any) -> None:
        outs = [outcome(getattr(p, name), *args, **kwargs) for p in ps]
        assert all(o == outs[0] for o in outs), name

    for step in range(12):
        pos += 1
        n = int(ps[0].counts.max())
        w = weights(rng, heads, n, np.float32 if step % 2 else np.float64)
        if step == 5:
            same("on_decode_step", pos, w)
            same("evict", budget - 500, return_indices=True)  # bulk, still above the threshold
        elif step == 8:  # rows of different counts: some rows leave the chunk's tokens out
            admit = rng.random((heads, 2)) < 0.5
            same("extend", np.full((heads, 2, n + 2), 0.01), admit)
            pos += 2
            same("step_rows", pos, weights(rng, heads, int(ps[0].counts.max()), np.float32), budget - 300)
        else:
            same("step", pos, w, return_indices=True)
    if policy in HEAVY:
        n = int(ps[0].counts.max())
        bad = np.full((heads, n), 0.01)
        bad[-1, int(ps[0].counts[-1]) - 1] = math.nan  # the last weight the last row reads
        before = [p.state_dict() for p in ps[:2]]
        for p in ps[:2]:
            with pytest.raises(InvalidInputError):
                p.step_rows(pos + 1, bad)
        assert [p.state_dict() for p in ps[:2]] == before
    states = [p.state_dict() for p in ps]
    assert all(s == states[0] for s in states)
