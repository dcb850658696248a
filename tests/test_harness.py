"""The replay harness: the seed's published numbers and claims, on both backends, and its policing."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from conftest import load_backend

from scissorhands.commands.harness import (
    HarnessError,
    PreparedTrace,
    ReplayResult,
    heavy_hitters,
    prepare,
    replay,
    round6,
)
from scissorhands.commands.traces import RecordedTrace, decode_trace, load_recorded_trace, save_recorded_trace
from scissorhands.errors import ScissorhandsError

BUDGETS = (256, 512, 1024)

#: The seed system's published Scissorhands figures on decode-4096: mass, recall.
PUBLISHED = {256: (0.641318, 0.882339), 512: (0.711377, 0.906047), 1024: (0.784746, 0.945091)}


@functools.cache
def _trace() -> PreparedTrace:
    return prepare(decode_trace())


@functools.cache
def _run(backend: str, policy: str, budget: int | None, **params: int) -> ReplayResult:
    cls = load_backend(backend).POLICIES[policy]
    obj = cls(**params) if budget is None else cls(budget=budget, **params)
    return replay(obj, _trace(), budget)


def _metrics(r: ReplayResult) -> tuple:
    return (r.policy, r.budget, r.retained_mass, r.heavy_hitter_recall, r.eviction_calls, r.steps)


# -------------------------------------------------------------------- the seed's numbers


@pytest.mark.parametrize("budget", BUDGETS)
def test_published_scissorhands_numbers(backend, budget):
    """Scissorhands on decode-4096 reproduces the seed's retained mass and recall to 6 decimals."""
    r = _run(backend.name, "scissorhands", budget)
    assert (r.retained_mass, r.heavy_hitter_recall) == PUBLISHED[budget]
    assert r.eviction_calls == 4096 - budget and r.steps == 4095
    assert r.policy == "scissorhands" and r.trace == "decode-4096" and r.policy_seconds > 0


@pytest.mark.parametrize("budget", BUDGETS)
def test_scissorhands_within_a_hundredth_of_h2o(backend, budget):
    """Scissorhands and H2O land within 0.01 of each other on both metrics at every budget."""
    s, h = _run(backend.name, "scissorhands", budget), _run(backend.name, "h2o", budget)
    assert abs(s.retained_mass - h.retained_mass) < 0.01
    assert abs(s.heavy_hitter_recall - h.heavy_hitter_recall) < 0.01


def test_wider_recent_window_raises_mass(backend):
    """recent_window 64 instead of 32 at budget 256 raises Scissorhands' retained mass by > 0.1."""
    narrow = _run(backend.name, "scissorhands", 256, recent_window=32)
    wide = _run(backend.name, "scissorhands", 256, recent_window=64)
    assert wide.retained_mass - narrow.retained_mass > 0.1


@pytest.mark.parametrize("policy", ["streaming-llm", "h2o", "scissorhands"])
@pytest.mark.parametrize("budget", BUDGETS)
def test_native_replay_equals_reference(policy, budget):
    """The C path and the pure-Python reference give identical replays of the whole trace."""
    assert _metrics(_run("native", policy, budget)) == _metrics(_run("reference", policy, budget))


def test_tova_replay_equals_reference():
    """TOVA (one budget: it shares H2O's selection) replays the whole trace alike on both
    backends, named by its registry name."""
    native, ref = _run("native", "tova", 256), _run("reference", "tova", 256)
    assert _metrics(native) == _metrics(ref) and native.policy == "tova"
    assert 0 < native.retained_mass < 1 and native.eviction_calls == 4096 - 256


def test_streaming_llm_published_numbers():
    """StreamingLLM (4 sinks) matches the seed's published 4-decimal figures."""
    got = [(round(r.retained_mass, 4), round(r.heavy_hitter_recall, 4))
           for r in (_run("native", "streaming-llm", b) for b in BUDGETS)]
    assert got == [(0.7367, 0.8594), (0.7862, 0.8835), (0.8662, 0.9276)]


def test_full_cache_keeps_everything(backend):
    """Full at budget None is never asked to evict and keeps all the mass and every heavy hitter."""
    r = _run(backend.name, "full", None)
    assert (r.retained_mass, r.heavy_hitter_recall, r.eviction_calls, r.budget) == (1.0, 1.0, 0, None)


# -------------------------------------------------------------------- what the policy is shown


class Recorder:
    """A fake policy that keeps the most recent `budget` positions and records what it sees."""

    def __init__(self, budget: int):
        self.budget = budget
        self.held = [0]
        self.seen: list[tuple[int, np.ndarray]] = []

    def on_decode_step(self, pos, attn):
        self.seen.append((pos, np.array(attn)))
        self.held.append(pos)

    def evict(self, budget):
        victims = self.held[: len(self.held) - budget]
        self.held = self.held[len(victims):]
        return victims


def test_policy_sees_held_weights_unnormalised():
    """Each step shows the held positions' weights in position order, not renormalised."""
    trace = decode_trace(num_positions=300)
    policy = Recorder(100)
    r = replay(policy, trace, 100, name="recorder")
    assert r.eviction_calls == 300 - 100 and r.policy == "recorder"
    assert policy.seen[0][0] == 1 and policy.seen[0][1].tolist() == [1.0]
    pos, attn = policy.seen[250]  # holds positions 151..250
    assert pos == 251 and attn.dtype == np.float32
    assert np.array_equal(attn, trace.weights(251)[151:251])
    assert attn.sum() < 0.9


def test_measured_before_the_policy_acts():
    """A policy that evicts everything old still had the full mass at the step it acted."""
    trace = decode_trace(num_positions=3)
    # steps 1 and 2; budget 1 keeps only the newest position after each step
    r = replay(Recorder(1), trace, 1)
    w2 = trace.weights(2)
    assert r.retained_mass == round6((1.0 + float(w2[1])) / 2)
    assert r.heavy_hitter_recall == round6((1 + 1) / (1 + 2))  # pooled: hits / possible


def test_heavy_hitters_is_stable_sort_set():
    """heavy_hitters is the first k of a stable sort on -weight (ties to the lower position)."""
    rng = np.random.default_rng(3)
    for n in (1, 5, 31, 32, 33, 200, 1000):
        w = (rng.integers(0, 6, size=n) / 8).astype(np.float32)  # many ties
        expected = np.sort(np.argsort(-w, kind="stable")[: min(32, n)])
        assert np.array_equal(heavy_hitters(w), expected)
    assert heavy_hitters(np.array([0.5, 0.5, 0.5], np.float32), 2).tolist() == [0, 1]


# -------------------------------------------------------------------- policing


class Misbehaving(Recorder):
    def __init__(self, budget, victims):
        super().__init__(budget)
        self.victims = victims

    def evict(self, budget):
        return self.victims(self, budget)


def _short():
    return decode_trace(num_positions=80)


def test_rejects_victim_not_held():
    """Evicting a position the cache does not hold raises HarnessError (a ScissorhandsError)."""
    policy = Misbehaving(40, lambda self, b: [999])
    with pytest.raises(HarnessError, match="evicted position 999, which the cache does not hold"):
        replay(policy, _short(), 40)
    assert issubclass(HarnessError, ScissorhandsError)


def test_rejects_victim_already_evicted():
    """Evicting the same position at two steps is caught the second time."""
    policy = Misbehaving(40, lambda self, b: [0])
    with pytest.raises(HarnessError, match="position 0, which the cache does not hold"):
        replay(policy, _short(), 40)


def test_rejects_duplicate_victims():
    """Naming a victim twice in one call raises HarnessError."""
    policy = Misbehaving(40, lambda self, b: [5, 5])
    with pytest.raises(HarnessError, match="twice"):
        replay(policy, _short(), 40)


def test_rejects_staying_over_budget():
    """A policy whose eviction leaves the cache over budget raises HarnessError."""
    policy = Misbehaving(40, lambda self, b: [])
    with pytest.raises(HarnessError, match="over the budget"):
        replay(policy, _short(), 40)


def test_rejects_non_integer_victims():
    """Victims must be integer positions."""
    policy = Misbehaving(40, lambda self, b: [1.0])
    with pytest.raises(HarnessError, match="not a position"):
        replay(policy, _short(), 40)


def test_rejects_used_policy(backend):
    """A policy that already holds more than position 0 is refused before the replay."""
    policy = backend.Scissorhands(budget=64)
    policy.on_decode_step(1, [1.0])
    with pytest.raises(HarnessError, match="fresh"):
        replay(policy, _short(), 64)


def test_rejects_bad_budget():
    """Budgets must be positive integers (or None)."""
    for bad in (0, -3, 2.5, True):
        with pytest.raises(HarnessError):
            replay(Recorder(4), _short(), bad)


# -------------------------------------------------------------------- recorded traces


def test_recorded_trace_replays_per_stream(tmp_path, backend):
    """A recorded .npz replays stream by stream, the same as its float16 weights held in memory."""
    rng = np.random.default_rng(5)
    n, streams = 120, 2
    steps = []
    for t in range(1, n):
        w = rng.random((streams, t)) ** 8
        w[:, 0] += 1.0  # a sink
        steps.append(w / w.sum(axis=1, keepdims=True) * 0.97)
    path = tmp_path / "rec.npz"
    save_recorded_trace(path, steps, layers=[3, 3], heads=[0, 1], prompt_tokens=16, model="tiny")
    loaded = load_recorded_trace(path)
    in_memory = RecordedTrace(np.concatenate(steps, axis=1), [3, 3], [0, 1])
    module = backend
    for a, b in zip(loaded, in_memory):
        ra = replay(module.Scissorhands(budget=48, recent_window=8), a, 48)
        rb = replay(module.Scissorhands(budget=48, recent_window=8), b, 48)
        assert _metrics(ra) == _metrics(rb)
        assert ra.eviction_calls == n - 48 and 0 < ra.retained_mass < 0.97
        full = replay(module.Full(), a, None)
        assert full.heavy_hitter_recall == 1.0 and abs(full.retained_mass - 0.97) < 1e-3
