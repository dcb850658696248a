"""Reliability: the quick fuzz run, pickle / copy / cross-backend state round trips that keep
deciding exactly as the original would, the state's version check, and a leak check over
100,000 create/step/evict/destroy cycles.

The long fuzz run lives in ``tests/fuzz_ops.py`` (run it explicitly); the sanitizer run over
this whole suite is ``bash .ci/sanitize``. The leak check is marked ``slow``: select it
with ``python -m pytest -q -m slow tests/test_reliability.py`` (the plain ``pytest -q``
of ``.ci/run`` includes it).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import json
import os
import pickle
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import POLICY_NAMES, load_backend
from conftest import make_policy as make
from fuzz_ops import PolicyPair, fuzz_settings
from hypothesis.stateful import run_state_machine_as_test

from scissorhands.errors import InvalidInputError, InvalidTypeError

OTHER = {"native": "reference", "reference": "native"}




def drive(p: Any, rng: np.random.Generator, start: int, steps: int) -> list[Any]:
    """``steps`` random operations from position ``start``; the results, as plain data.

    Steps with gapped positions, grid-valued float32/float64 weights (many ties), per-call
    budgets, postponed evictions and return_indices: every decision the policy makes.
    """
    out: list[Any] = []
    pos = start
    for _ in range(steps):
        pos += int(rng.integers(1, 4))
        n = p.kept_count()
        w = (rng.integers(0, 9, (p.heads, n)) / 8).astype(rng.choice([np.float32, np.float64]))
        op = rng.integers(0, 4)
        if op == 0:
            p.on_decode_step(pos, w)
            out.append(None)
            continue
        budget = None if op == 1 else int(rng.integers(3, 12))
        res = p.step(pos, w, budget, return_indices=bool(rng.integers(0, 2)))
        out.append(plain(res))
    out.append(p.state_dict())
    return out


def plain(value: Any) -> Any:
    """Results as comparable plain data (arrays keep dtype and shape)."""
    if isinstance(value, np.ndarray):
        return (str(value.dtype), value.shape, value.tolist())
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def started(backend: Any, name: str, heads: int, seed: int) -> Any:
    """A policy some random way into its life (prefill or not, a few evictions)."""
    p = make(backend, name, budget=8, heads=heads)
    rng = np.random.default_rng(seed)
    if seed % 2:
        prompt = np.tril(rng.integers(0, 9, (heads, 6, 6)) / 8, -1)
        p.prefill(prompt)
    drive(p, rng, p.state_dict()["last_position"], 15)
    return p


# ---------------------------------------------------------------- the quick fuzz run


def test_fuzz_quick():
    """Random valid and invalid operation sequences agree across backends (short run of fuzz_ops)."""
    run_state_machine_as_test(PolicyPair, settings=fuzz_settings(int(os.environ.get(
        "SCISSORHANDS_FUZZ_QUICK_EXAMPLES", "60"))))


# ---------------------------------------------------------------- copies keep deciding alike


COPIERS = {
    **{f"pickle-{proto}": (lambda p, proto=proto: pickle.loads(pickle.dumps(p, protocol=proto)))
       for proto in range(pickle.HIGHEST_PROTOCOL + 1)},
    "deepcopy": copy.deepcopy,
    "copy": copy.copy,
    "json": lambda p: type(p).from_state_dict(json.loads(json.dumps(p.state_dict()))),
}


@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("name", POLICY_NAMES)
@pytest.mark.parametrize("how", COPIERS)
def test_copy_decides_like_the_original(backend, how, name, heads):
    """A pickled / copied / JSON-restored policy makes exactly the original's decisions from then on."""
    original = started(backend, name, heads, seed=zlib.crc32(f"{how}/{name}/{heads}".encode()) % 1000)
    restored = COPIERS[how](original)
    assert type(restored) is type(original) and restored is not original
    assert restored.state_dict() == original.state_dict()
    last = original.state_dict()["last_position"]
    rngs = np.random.default_rng(5), np.random.default_rng(5)
    assert drive(restored, rngs[0], last, 60) == drive(original, rngs[1], last, 60)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_copy_is_independent(backend, name):
    """Stepping or resetting a copy leaves the original untouched, and the other way round."""
    a = started(backend, name, 2, seed=3)
    state = a.state_dict()
    for b in (copy.copy(a), copy.deepcopy(a), pickle.loads(pickle.dumps(a))):
        drive(b, np.random.default_rng(1), state["last_position"], 10)
        b.reset()
        assert a.state_dict() == state
    c = copy.deepcopy(a)
    drive(a, np.random.default_rng(2), state["last_position"], 10)
    assert c.state_dict() == state


@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("name", POLICY_NAMES)
def test_state_loads_in_the_other_backend(backend, name, heads):
    """A state from one backend loads in the other, and both then decide identically."""
    other = load_backend(OTHER[backend.name])
    original = started(backend, name, heads, seed=11 + heads)
    moved = other.POLICIES[name].from_state_dict(original.state_dict())
    assert moved.state_dict() == original.state_dict()
    last = original.state_dict()["last_position"]
    rngs = np.random.default_rng(9), np.random.default_rng(9)
    assert drive(moved, rngs[0], last, 60) == drive(original, rngs[1], last, 60)


@pytest.mark.parametrize("version", [0, 2, 2**64, -1])
@pytest.mark.parametrize("name", POLICY_NAMES)
def test_state_version_is_checked(backend, name, version):
    """A state of another version (or none) is refused, not guessed at."""
    state = make(backend, name, budget=8).state_dict()
    assert state["version"] == 1
    state["version"] = version
    with pytest.raises(InvalidInputError):
        backend.POLICIES[name].from_state_dict(state)
    del state["version"]
    with pytest.raises(InvalidInputError):
        backend.POLICIES[name].from_state_dict(state)


@pytest.mark.parametrize("backend_name", ["native", "reference"])
@pytest.mark.parametrize("version", [True, 1.0, "1", None])
def test_state_version_of_the_wrong_kind(backend_name, version):
    """A version that is not an integer (True, 1.0, "1", None) raises InvalidTypeError (found by fuzzing)."""
    backend = load_backend(backend_name)
    state = backend.Scissorhands(budget=4, recent_window=1).state_dict()
    state["version"] = version
    with pytest.raises(InvalidTypeError):
        backend.Scissorhands.from_state_dict(state)


# ---------------------------------------------------------------- regressions found by the fuzzer


@pytest.mark.parametrize("backend_name", ["native", "reference"])
def test_h2o_negative_zero_score_orders_as_zero(backend_name):
    """A loaded H2O (or TOVA) score of -0.0 ties with 0.0 (lower position first) and is below 0.5."""
    backend = load_backend(backend_name)
    for cls in (backend.H2O, backend.TOVA):
        state = cls(budget=8, recent_window=1).state_dict()
        state.update(kept=[[0, 1, 2, 3, 4, 5]], scores=[[0.0, -0.0, 0.0, -0.0, 0.5, 0.0]], last_position=5)
        p = cls.from_state_dict(state)
        assert p.evict(3) == [0, 1, 2]


# ---------------------------------------------------------------- leaks


PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")


def rss_bytes() -> int:
    """Resident set size of this process, from /proc/self/statm."""
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * PAGE


def leak_cycle(backend: Any, i: int, weights: dict[tuple[int, int], np.ndarray],
               bad: dict[int, np.ndarray]) -> None:
    """One create/step/evict/destroy cycle; every few cycles also growth, errors, prefill, state."""
    name = POLICY_NAMES[i % len(POLICY_NAMES)]
    heads = 1 + i % 3
    p = make(backend, name, budget=4, protected=1, heads=heads)
    t = 0
    if i % 5 == 0:
        p.prefill(weights[(heads, 0)])
        t = 5
    p.on_decode_step(t + 1, weights[(heads, p.kept_count())])
    p.step(t + 2, weights[(heads, p.kept_count())], return_indices=i % 2 == 0)
    t += 2
    if i % 8 == 0:  # postponed eviction: the rows grow past budget + 1, then shrink
        for _ in range(6):
            t += 1
            p.on_decode_step(t, weights[(heads, p.kept_count())])
    p.evict()
    if i % 4 == 1:  # failed calls allocate nothing that stays
        with contextlib.suppress(InvalidInputError):
            p.on_decode_step(t + 1, bad[heads][:, : p.kept_count()])
        with contextlib.suppress(InvalidInputError):
            p.evict(0)
    if i % 16 == 3:
        q = type(p).from_state_dict(p.state_dict())
        q.reset()
        del q
    del p


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs /proc/self/statm (Linux)")
@pytest.mark.skipif(UNDER_ASAN, reason="ASan's quarantine keeps freed memory resident (LSan covers it)")
def test_no_leak_over_many_cycles(backend):
    """100,000 create/step/evict/destroy cycles (10,000 on the reference) leave RSS and traced memory flat."""
    cycles = 100_000 if backend.name == "native" else 10_000
    warmup = cycles // 20
    weights = {(h, n): np.full((h, n), 0.25, dtype=np.float32) for h in (1, 2, 3) for n in range(1, 40)}
    for h in (1, 2, 3):  # the prefill prompts, (heads, 6, 6)
        weights[(h, 0)] = np.tril(np.full((h, 6, 6), 0.25), -1)
    bad = {h: np.full((h, 40), np.nan) for h in (1, 2, 3)}
    for i in range(warmup):
        leak_cycle(backend, i, weights, bad)
    gc.collect()
    tracemalloc.start()
    try:
        rss0, traced0 = rss_bytes(), tracemalloc.get_traced_memory()[0]
        for i in range(warmup, cycles):
            leak_cycle(backend, i, weights, bad)
        gc.collect()
        rss1, traced1 = rss_bytes(), tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    # Leaking only the smallest allocation per cycle (the 56-byte policy header) adds ~4.5 MiB.
    assert rss1 - rss0 < 2 * 2**20, f"RSS grew by {(rss1 - rss0) / 2**20:.1f} MiB"
    grown = (traced1 - traced0) / 2**10
    assert grown < 256, f"traced Python memory grew by {grown:.0f} KiB"
