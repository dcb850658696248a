"""Pinned spans (``pin``, ``pins=``): positions no eviction takes, on both backends.

Sinks are the special case of a span at 0; the budget arithmetic and its errors; the
spans' life through ``reset``, ``select_rows``, ``state_dict`` and pickling; what they
add to ``memory_bytes``. The C path against the reference on random sequences with
pins is in ``tests/test_differential.py`` (``-k pin``); the vectors in
``vectors/generate.py``.
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from conftest import POLICY_NAMES, load_backend

from scissorhands._shared import UINT32_MAX
from scissorhands.errors import InvalidInputError, InvalidTypeError
from scissorhands.options import SPECS

EVICTING = tuple(name for name in POLICY_NAMES if SPECS[name].evicts)
#: The options of each evicting policy that leave room for pins at budget 8: a recent
#: window of 1 where it takes one, else no sinks (StreamingLLM's default of 4 would not).
ROOMY = {name: {"recent_window": 1} if SPECS[name].takes("recent_window") else {"sinks": 0}
         for name in EVICTING if SPECS[name].takes("recent_window") or SPECS[name].takes("sinks")}


def weights(rng: np.random.Generator, heads: int, n: int) -> np.ndarray:
    """A decode step's weights on a coarse grid (ties are common)."""
    return (rng.integers(0, 9, (heads, n)) / 8).astype(np.float32)


def run(policy, steps: int, seed: int = 0, budget: int | None = None, start: int = 1) -> list:
    """Decode ``steps`` tokens from position ``start`` with ``step_rows``; each step's victims."""
    rng = np.random.default_rng(seed)
    out = []
    for t in range(start, start + steps):
        n = int(policy.counts.max())
        out.append(policy.step_rows(t, weights(rng, policy.heads, n), budget).victims.tolist())
    return out


@pytest.mark.parametrize("name", EVICTING)
def test_pinned_positions_are_never_evicted(backend, name):
    """A span pinned ahead of admission stays held through many evicting steps in every row."""
    p = backend.POLICIES[name](budget=8, heads=2, **ROOMY[name], pins=[(3, 6)])
    victims = run(p, 60)
    assert not {3, 4, 5} & {v for row in victims for v in row}
    assert all({3, 4, 5} <= set(p.kept_row(h).tolist()) for h in range(2))


@pytest.mark.parametrize("name", EVICTING)
def test_sinks_are_a_pin_at_zero(backend, name):
    """sinks=s evicts exactly as sinks=0 with pin(0, s), step by step (every policy with sinks)."""
    if not SPECS[name].takes("sinks"):
        pytest.skip("no sinks")
    options = dict(ROOMY[name])
    a = backend.POLICIES[name](budget=8, heads=2, **{**options, "sinks": 3})
    b = backend.POLICIES[name](budget=8, heads=2, **{**options, "sinks": 0})
    b.pin(0, 3)
    assert run(a, 50, seed=4) == run(b, 50, seed=4)
    assert a.kept.tolist() == b.kept.tolist()
    assert a.state_dict()["kept"] == b.state_dict()["kept"]


@pytest.mark.parametrize("name", EVICTING)
def test_sinks_and_pin_agree_on_bulk_evictions(backend, name):
    """sinks=s and pin(0, s) agree when many positions go at once (the bulk selection)."""
    if not SPECS[name].takes("sinks"):
        pytest.skip("no sinks")
    rng = np.random.default_rng(9)
    prompt = np.tril(rng.integers(0, 9, (2, 40, 40)) / 8, -1)
    a = backend.POLICIES[name](budget=8, heads=2, **{**ROOMY[name], "sinks": 2})
    b = backend.POLICIES[name](budget=8, heads=2, **ROOMY[name], pins=[(0, 2)])
    for p in (a, b):
        p.prefill(prompt)
    assert a.evict(return_indices=True)[0].tolist() == b.evict(return_indices=True)[0].tolist()
    assert a.kept.tolist() == b.kept.tolist()


def test_pinned_slot_skipped_by_the_single_victim(backend):
    """The least-voted position is pinned: the next least goes instead (one victim a step)."""
    p = backend.Scissorhands(budget=4, recent_window=1, pins=[(1, 2)])
    # Positions 0 and 2 get two votes, 1 and 3 none: 1 would go first unpinned.
    for t in range(1, 5):
        n = p.kept_count()
        w = [0.0] * n
        if n > 2:
            w[0] = w[2] = 0.5
        p.on_decode_step(t, w)
    assert p.votes.tolist() == [2, 0, 2, 0, 0]
    assert p.evict() == [3]
    assert p.kept.tolist() == [0, 1, 2, 4]


def test_streaming_llm_skips_pinned_positions(backend):
    """StreamingLLM evicts the oldest unpinned positions after its sinks."""
    p = backend.StreamingLLM(budget=5, sinks=1, pins=[(2, 4)])
    victims = [p.step(t, None) for t in range(1, 9)]
    assert victims == [[], [], [], [], [1], [4], [5], [6]]
    assert p.kept.tolist() == [0, 2, 3, 7, 8]


def test_pooled_budgets_keep_pins(backend):
    """A pool of rows sharing a budget never takes a pinned position from any of its rows."""
    p = backend.H2O(budget=6, recent_window=1, heads=4, pool=2, pins=[(0, 3)])
    victims = run(p, 40, seed=2)
    assert not {0, 1, 2} & {v for row in victims for v in row}


def test_full_keeps_spans_and_never_evicts(backend):
    """Full takes pins and pin() (kept, in the state) and still evicts nothing."""
    p = backend.Full(budget=4, pins=[(0, 2)])
    p.pin(10, 12)
    for t in range(1, 20):
        p.on_decode_step(t, None)
    assert p.evict() == [] and p.kept_count() == 20
    assert p.pins == [(0, 2), (10, 12)]
    assert p.state_dict()["params"]["pins"] == [[0, 2], [10, 12]]


def test_spans_merge_and_ascend(backend):
    """Overlapping and adjacent spans merge; pins lists them ascending as (start, stop)."""
    p = backend.H2O(budget=64, recent_window=4, pins=[(20, 25), (0, 2)])
    p.pin(2, 4)
    p.pin(22, 30)
    p.pin(40, 41)
    assert p.pins == [(0, 4), (20, 30), (40, 41)]


@pytest.mark.parametrize(("args", "kind"), [
    ((3, 3), InvalidInputError), ((4, 3), InvalidInputError), ((-1, 3), InvalidInputError),
    ((0, 2**32), InvalidInputError), ((True, 3), InvalidTypeError), ((0, 2.0), InvalidTypeError),
    (("0", 3), InvalidTypeError)])
def test_bad_spans_are_refused(backend, args, kind):
    """pin() refuses empty, reversed, out-of-range and non-integer spans; nothing changes."""
    p = backend.Scissorhands(budget=16, recent_window=2, pins=[(5, 6)])
    before = p.state_dict()
    with pytest.raises(kind):
        p.pin(*args)
    assert p.state_dict() == before and p.pins == [(5, 6)]


def test_pins_budget_arithmetic(backend):
    """The sinks' overlap counts once: pins + recent window + sinks must stay below the budget."""
    p = backend.Scissorhands(budget=10, recent_window=3, sinks=2, pins=[(0, 4)])  # 2 pinned outside sinks
    p.pin(20, 22)  # 4 outside + 3 + 2 = 9 < 10: accepted
    before = p.state_dict()
    with pytest.raises(InvalidInputError, match=r"pins leave nothing to evict: 5 pinned .*3 \+ sinks 2 = 10 "
                                                r"reach budget 10"):
        p.pin(30, 31)
    assert p.state_dict() == before and p.pins == [(0, 4), (20, 22)]
    with pytest.raises(InvalidInputError, match="pins leave nothing to evict"):
        backend.StreamingLLM(budget=4, sinks=1, pins=[(5, 8)])
    backend.StreamingLLM(budget=4, sinks=1, pins=[(0, 1), (5, 7)])  # 2 + 1 < 4


@pytest.mark.parametrize("pins", [[(0,)], [(0, 1, 2)], 5, "ab", [3], [{"a": 1}]])
def test_constructor_pins_are_checked_like_pin(backend, pins):
    """pins= must be a sequence of (start, stop) pairs: other shapes and kinds are refused."""
    with pytest.raises((InvalidInputError, InvalidTypeError)):
        backend.H2O(budget=16, recent_window=2, pins=pins)


def test_per_call_budget_the_pins_exceed_is_refused(backend):
    """A per-call budget below the configured one that pins leave too little is refused, state unchanged."""
    p = backend.Scissorhands(budget=12, recent_window=2, pins=[(0, 6)])
    for t in range(1, 12):
        p.on_decode_step(t, None)
    before = p.state_dict()
    for call in (lambda: p.evict(5), lambda: p.evict_rows(5), lambda: p.step(12, None, 5),
                 lambda: p.step_rows(12, None, 5)):
        with pytest.raises(InvalidInputError, match=r"budget 5: .*leave only \d+ positions to evict in row 0"):
            call()
        assert p.state_dict() == before
    assert len(p.evict(9)) == 3  # 6 pinned + 2 recent: 9 leaves one candidate to spare
    assert {0, 1, 2, 3, 4, 5} <= set(p.kept.tolist())


def test_reset_keeps_the_constructors_spans_only(backend):
    """reset() goes back to the spans given at construction; those pin() added are forgotten."""
    p = backend.TOVA(budget=16, recent_window=2, pins=[(0, 3)])
    p.pin(8, 10)
    p.reset()
    assert p.pins == [(0, 3)]
    assert backend.TOVA(budget=16, recent_window=2).pins == []


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_state_round_trips_between_backends(name):
    """state_dict() carries the spans (params['pins']); either backend loads the other's, and pickles."""
    native, ref = load_backend("native"), load_backend("reference")
    options = ROOMY.get(name, {})
    for src, dst in ((native, ref), (ref, native)):
        p = src.POLICIES[name](budget=8, heads=2, **options, pins=[(1, 3)])
        p.pin(6, 7)
        run(p, 12, seed=1) if SPECS[name].evicts else None
        state = p.state_dict()
        assert state["params"]["pins"] == [[1, 3], [6, 7]]
        q = dst.POLICIES[name].from_state_dict(state)
        assert q.pins == [(1, 3), (6, 7)] and q.state_dict() == state
        assert q.memory_bytes() == p.memory_bytes()
        r = pickle.loads(pickle.dumps(p))
        assert r.pins == p.pins and copy.deepcopy(p).state_dict() == state


def test_old_states_without_pins_load(backend):
    """A state without params['pins'] (written before spans existed) loads with none."""
    state = backend.Scissorhands(budget=8, recent_window=2).state_dict()
    assert "pins" not in state["params"]
    assert backend.Scissorhands.from_state_dict(state).pins == []


def test_state_with_pins_that_leave_nothing_is_refused(backend):
    """A state whose spans leave nothing to evict is refused as the constructor refuses them."""
    state = backend.Scissorhands(budget=8, recent_window=2).state_dict()
    state["params"]["pins"] = [[0, 6]]
    with pytest.raises(InvalidInputError, match="pins leave nothing to evict"):
        backend.Scissorhands.from_state_dict(state)


def test_select_rows_keeps_the_spans(backend):
    """The spans are the object's: rows copied by select_rows keep them."""
    p = backend.H2O(budget=6, recent_window=1, heads=2, pins=[(2, 4)])
    run(p, 10)
    p.select_rows([1, 1, 0])
    assert p.pins == [(2, 4)]
    victims = run(p, 20, seed=3, start=11)
    assert not {2, 3} & {v for row in victims for v in row}


def test_memory_counts_the_spans(backend):
    """memory_bytes() adds 4 + 8 bytes per span when any is pinned (and nothing without)."""
    p = backend.Scissorhands(budget=64, recent_window=4)
    base = p.memory_bytes()
    p.pin(0, 4)
    assert p.memory_bytes() == base + 4 + 8
    p.pin(10, 12)
    p.pin(20, 22)
    assert p.memory_bytes() == base + 4 + 3 * 8
    p.pin(4, 10)  # merges the first two
    assert p.memory_bytes() == base + 4 + 2 * 8


def test_spans_may_reach_the_last_position(backend):
    """A span up to 2**32 - 1 is accepted (the largest position an admission may take is below it)."""
    p = backend.Full(pins=[(UINT32_MAX - 1, UINT32_MAX)])
    assert p.pins == [(UINT32_MAX - 1, UINT32_MAX)]


def test_observed_eviction_keeps_pinned_positions(backend):
    """evict_observed protects pinned positions: the least pooled unpinned candidates go."""
    p = backend.H2O(budget=4, recent_window=1, pins=[(1, 3)])
    for t in range(1, 9):
        p.on_decode_step(t, None)
    # Slots 0..6 read by both window rows (slot 7 by the second only): 1 and 2 lowest.
    row = [0.1, 0.0, 0.0, 0.2, 0.3, 0.9, 0.4, 0.5, 0.0]
    assert p.evict_observed([row, row], budget=5, pool_kernel=1) == [0, 3, 4, 6]
    assert p.kept.tolist() == [1, 2, 5, 7, 8]


def test_observed_refusal_counts_pinned_positions(backend):
    """A row the window, sinks and pins leave too few to evict is refused, naming the pinned count."""
    p = backend.Scissorhands(budget=6, recent_window=1, sinks=1, pins=[(2, 4)])
    for t in range(1, 9):
        p.on_decode_step(t, None)
    before = p.state_dict()
    with pytest.raises(InvalidInputError, match=r"window 2 \+ sinks 1 \+ pinned 2 leave only 4 positions "
                                                r"to evict in row 0, need 5"):
        p.evict_observed_rows(np.zeros((1, 2, 9)), budget=4)
    assert p.state_dict() == before
    assert p.evict_observed_rows(np.zeros((1, 2, 9)), budget=5).victims.tolist() == [1, 4, 5, 6]


def test_at_most_65536_spans(backend):
    """65,536 separate spans are accepted, one more is refused (after merging), nothing changed."""
    spans = [(2 * i, 2 * i + 1) for i in range(65536)]
    p = backend.Full(pins=spans)
    assert len(p.pins) == 65536
    with pytest.raises(InvalidInputError, match="at most 65536 pinned spans"):
        p.pin(2 * 65536, 2 * 65536 + 1)
    p.pin(1, 2)  # merges (0, 1), (1, 2) and (2, 3) into one
    assert len(p.pins) == 65535 and p.pins[0] == (0, 3)
    with pytest.raises(InvalidInputError, match="at most 65536 pinned spans"):
        backend.Full(pins=[*spans, (2 * 65536, 2 * 65536 + 1)])


@pytest.mark.parametrize("name", ["scissorhands", "h2o", "tova"])
def test_a_fractional_window_shares_what_constructor_pins_leave(backend, name):
    """recent_window=0.75 with a document pinned at construction is 0.75 of what the pins and sinks
    leave (floor(0.75 * (1024 - 660 - 4)) = 270), so pinning most of the budget still evicts; a count
    and a fraction without pins resolve as before, and pin() later keeps the window."""
    sinks = {"sinks": 4} if SPECS[name].takes("sinks") else {}
    p = backend.POLICIES[name](budget=1024, recent_window=0.75, heads=2, pins=[(0, 664)], **sinks)
    left = 1024 - (664 - len(sinks) * 4 if sinks else 664) - (4 if sinks else 0)
    assert p.state_dict()["params"]["recent_window"] == int(0.75 * left)
    assert backend.POLICIES[name](budget=1024, recent_window=0.75, heads=1, **sinks).state_dict()["params"][
        "recent_window"] == 768
    assert backend.POLICIES[name](budget=1024, recent_window=700, heads=1,
                                  **sinks).state_dict()["params"]["recent_window"] == 700
    with pytest.raises(InvalidInputError, match="pins leave nothing to evict"):
        backend.POLICIES[name](budget=1024, recent_window=100, heads=1, pins=[(0, 1000)], **sinks)
    small = backend.POLICIES[name](budget=16, recent_window=0.5, heads=1, pins=[(0, 8)], **sinks)
    victims = run(small, 40)
    assert victims and all(len(v) == 1 for v in victims[16:])  # it evicts
    assert not set(range(8)) & {x for row in victims for x in row}
    assert small.state_dict()["params"]["recent_window"] == int(0.5 * (16 - 8))
    small.pin(30, 31)  # a span pinned later: the window stays as resolved
    assert small.state_dict()["params"]["recent_window"] == int(0.5 * (16 - 8))
