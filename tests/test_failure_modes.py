"""Failure classes reported against other KV-cache eviction code, each pinned as a small
scenario on our policies, on both backends.

Protected positions evicted when scores tie; scores landing on the wrong position after an
eviction from the middle; positions confused with indices or counts; degenerate budgets;
victim lists that are not what the cache must drop; float32 rounding in the fair-share
test or in H2O's sums; backends or runs that disagree on ties; state leaking across a
reset or between objects; input buffers read wrongly (views, byte order, dtypes, counts);
integer wrap-around in positions and budgets; and corruption under threads.
"""

from __future__ import annotations

import copy
import math
import sys
import threading
from typing import Any

import numpy as np
import pytest
from conftest import BACKENDS, POLICY_NAMES, load_backend
from conftest import make_policy as make

from scissorhands._shared import UINT32_MAX
from scissorhands.errors import InvalidInputError, InvalidTypeError
from scissorhands.options import SPECS

HEAVY = tuple(name for name, spec in SPECS.items() if spec.reads_attention)
EVICTING = tuple(name for name, spec in SPECS.items() if spec.evicts)


# ---------------------------------------------------------------- helpers




def rows(p: Any) -> list[list[int]]:
    """Held positions per head, as lists."""
    return [list(r) for r in p.state_dict()["kept"]]


def score_rows(p: Any) -> list[list[Any]] | None:
    """Votes or scores per head (None for policies without)."""
    state = p.state_dict()
    return state.get("votes", state.get("scores"))


def score(p: Any, pos: int, head: int = 0) -> Any:
    """Votes (Scissorhands) or score (H2O, TOVA) of ``pos``."""
    return p.votes_of(pos, head) if hasattr(p, "votes_of") else p.score_of(pos, head)


def as_rows(result: Any) -> tuple[list[list[int]], list[list[int]] | None]:
    """An evict/step result as rows of victims (and of slots, with return_indices)."""
    slots = None
    if isinstance(result, tuple):
        result, slots = result
        slots = slots.tolist() if isinstance(slots, np.ndarray) else [slots]
    return (result.tolist() if isinstance(result, np.ndarray) else [result]), slots


def oracle(name: str, kept: list[int], scores: list[Any] | None, budget: int, protected: int) -> list[int]:
    """The victims the spec names, computed independently of both backends."""
    k = len(kept) - budget
    if k <= 0 or name == "full":
        return []
    if name == "streaming-llm":
        s = min(protected, len(kept))
        return kept[s: s + k]
    assert scores is not None
    prefix = range(len(kept) - protected)
    return sorted(kept[i] for i in sorted(prefix, key=lambda i: (scores[i], i))[:k])


def checked(p: Any, name: str, call: str, *args: Any, budget: int | None = None,
            **kwargs: Any) -> list[list[int]]:
    """Run ``evict`` or ``step``; check the output contract and the spec's victims per head.

    Contract: exactly held - budget victims (none when within budget), unique, ascending,
    all held before, none held after, survivors in their old order, slots indexing the
    victims in the rows before the eviction.
    """
    protected = p.state_dict()["params"].get("sinks", p.state_dict()["params"].get("recent_window", 0))
    if call == "step":
        pos = args[0]
        p2 = copy.deepcopy(p)
        p2.on_decode_step(pos, args[1])  # the state the eviction starts from
        before, scores = rows(p2), score_rows(p2)
        result = p.step(*args, budget, **kwargs)
    else:
        before, scores = rows(p), score_rows(p)
        result = p.evict(budget, **kwargs)
    after = rows(p)
    cap = budget if budget is not None else p.budget
    victims, slots = as_rows(result)
    assert len(victims) == len(before) == p.heads
    for h, (held, kept, gone) in enumerate(zip(before, after, victims)):
        want = 0 if name == "full" else max(0, len(held) - cap)
        assert len(gone) == want, f"head {h}: {len(gone)} victims, want {want}"
        assert gone == sorted(set(gone)), f"head {h}: not unique and ascending: {gone}"
        assert set(gone) <= set(held) and not set(gone) & set(kept), f"head {h}: {gone} vs {held} -> {kept}"
        assert kept == [q for q in held if q not in set(gone)], f"head {h}: survivors reordered"
        if slots is not None:
            assert [held[s] for s in slots[h]] == gone, f"head {h}: slots {slots[h]} do not index {gone}"
        assert gone == oracle(name, held, None if scores is None else scores[h], cap, protected), f"head {h}"
    return victims


@pytest.fixture(params=HEAVY)
def heavy(request: pytest.FixtureRequest) -> str:
    """The attention-scored policies (Scissorhands, H2O, TOVA), by registry name."""
    return request.param


@pytest.fixture(params=POLICY_NAMES)
def name(request: pytest.FixtureRequest) -> str:
    """Every policy, by registry name."""
    return request.param


# ---------------------------------------------------------------- protected positions


def test_recent_window_survives_although_it_scores_lowest(backend, heavy):
    """The recent window is never evicted although its positions always score lowest."""
    p = make(backend, heavy, budget=5, protected=3)
    for t in range(1, 40):
        n = p.kept_count()
        w = np.array([0.9] * max(n - 3, 0) + [0.0] * min(n, 3))  # old positions favoured
        before = rows(p)[0] + [t]
        victims = checked(p, heavy, "step", t, w)[0]
        assert not set(victims) & set(before[-3:]), f"step {t}: evicted {victims} from the window"
        assert rows(p)[0][-3:] == before[-3:]


def test_recent_window_protected_when_every_score_ties(backend, heavy):
    """All scores equal: the lower-position rule picks the oldest, never the window."""
    p = make(backend, heavy, budget=4, protected=3)
    for t in range(1, 12):
        p.on_decode_step(t, None)
    assert checked(p, heavy, "evict") == [list(range(8))]
    assert rows(p) == [[8, 9, 10, 11]]


def test_window_of_budget_minus_one_leaves_two_candidates(backend, heavy):
    """recent_window = budget - 1: only the two oldest are candidates; the window's zeros do not count."""
    p = make(backend, heavy, budget=4, protected=3)
    for t in range(1, 4):
        p.on_decode_step(t, None)
    # kept [0, 1, 2, 3]: 0 scores, 1, 2 and 3 do not; after admitting 4 the candidates are 0 and 1.
    assert checked(p, heavy, "step", 4, [5.0, 0.0, 0.0, 0.0]) == [[1]]
    assert rows(p) == [[0, 2, 3, 4]]


def test_sinks_survive_when_oldest_first_points_at_them(backend):
    """StreamingLLM: the oldest-first rule always points at the sinks; they are never evicted."""
    p = make(backend, "streaming-llm", budget=5, protected=2)
    for t in range(1, 30):
        victims = checked(p, "streaming-llm", "step", t, None)[0]
        assert 0 not in victims and 1 not in victims
        assert rows(p)[0][:2] == [0, 1]
    for t in range(30, 40):  # a batched eviction of many at once too
        p.on_decode_step(t, None)
    checked(p, "streaming-llm", "evict", budget=3)
    assert rows(p) == [[0, 1, 39]]


def test_sinks_are_the_first_positions_admitted_not_the_smallest_numbers(backend):
    """With gapped positions the sinks are {0, 7} (first admitted), not positions 0..1."""
    p = make(backend, "streaming-llm", budget=4, protected=2)
    for t in (7, 100, 101, 5000, 5001, 2**31):
        checked(p, "streaming-llm", "step", t, None)
    assert rows(p) == [[0, 7, 5001, 2**31]]
    assert p.sink_count() == 2


def test_sinks_protected_with_several_heads(backend):
    """Every head of a multi-head StreamingLLM keeps its sinks."""
    p = make(backend, "streaming-llm", budget=3, protected=2, heads=3)
    for t in range(1, 10):
        checked(p, "streaming-llm", "step", t, np.zeros((3, p.kept_count())))
    assert rows(p) == [[0, 1, 9]] * 3


# ---------------------------------------------------------------- index alignment


def test_weights_after_a_middle_eviction_land_on_the_right_positions(backend, heavy):
    """After evicting from the middle, slot i of the next weights scores kept[i], not the old slot i."""
    p = make(backend, heavy, budget=5, protected=1)
    for t in (10, 20, 30, 40):  # gapped positions: slots and positions differ
        p.on_decode_step(t, None)
    # kept [0, 10, 20, 30, 40]: 0, 10 and 30 earn; 20 and 40 do not.
    p.on_decode_step(50, [0.3, 0.3, 0.0, 0.3, 0.0])
    assert p.evict(return_indices=True) == ([20], [2])
    assert rows(p) == [[0, 10, 30, 40, 50]]
    before = {pos: score(p, pos) for pos in (0, 10, 30, 40, 50)}
    p.on_decode_step(60, [0.0, 0.0, 0.9, 0.0, 0.0])  # slot 2 is now position 30
    assert score(p, 20) == -1
    # TOVA's score is the latest weight; the others add to what the position had.
    assert score(p, 30) == (0.9 if heavy == "tova" else before[30] + (1 if heavy == "scissorhands" else 0.9))
    for pos in (0, 10, 40, 50):
        assert score(p, pos) == (0.0 if heavy == "tova" else before[pos])


def test_heads_evict_different_positions_and_stay_aligned(backend, heavy):
    """Two heads evict different positions; each head's next weights follow its own kept row."""
    p = make(backend, heavy, budget=3, protected=1, heads=2)
    for t in (5, 6):
        p.on_decode_step(t, None)
    # kept [0, 5, 6] in both heads; head 0 favours 0, head 1 favours 5.
    p.on_decode_step(7, [[0.9, 0.0, 0.0], [0.0, 0.9, 0.0]])
    victims = checked(p, heavy, "evict")
    assert victims == [[5], [0]]
    assert rows(p) == [[0, 6, 7], [5, 6, 7]]
    p.on_decode_step(8, [[0.0, 0.9, 0.0], [0.0, 0.9, 0.0]])  # slot 1 = position 6 in both
    assert score(p, 6, 0) > 0 and score(p, 6, 1) > 0
    assert score(p, 0, 1) == -1 and score(p, 5, 0) == -1


def test_position_numbers_are_not_indices_or_counts(backend, name):
    """Lookups take positions (not slots), victims are positions, slots are indices, a budget is a count."""
    p = make(backend, name, budget=3, protected=1)
    for t in (100, 200, 300, 400):
        p.on_decode_step(t, None)
    if name in HEAVY:
        assert score(p, 1) == -1 and score(p, 300) == 0  # slot 1 is not position 1
    victims, slots = p.evict(return_indices=True)
    if name == "full":
        assert (victims, slots) == ([], [])
        return
    assert len(rows(p)[0]) == 3  # budget 3 keeps three positions, not the positions <= 3
    if name in HEAVY:  # all scores 0: the two lowest positions outside the window
        assert (victims, slots) == ([0, 100], [0, 1])
    else:  # after the one sink, the two oldest
        assert (victims, slots) == ([100, 200], [1, 2])


def test_slots_index_the_rows_before_eviction_on_random_sequences(backend, name):
    """With gaps, ties and batched evictions, slots always index the victims in the pre-eviction rows."""
    rng = np.random.default_rng(17)
    p = make(backend, name, budget=6, protected=2, heads=2)
    pos = 0
    for _ in range(150):
        pos += int(rng.integers(1, 50))
        w = rng.integers(0, 4, (2, p.kept_count())) / 4
        if rng.integers(0, 3) == 0:
            p.on_decode_step(pos, w)
        else:
            checked(p, name, "step", pos, w, budget=int(rng.integers(3, 9)), return_indices=True)


# ---------------------------------------------------------------- degenerate budgets


def test_holding_no_more_than_the_budget_evicts_nothing(backend, name):
    """Held <= budget: no victims (an empty (heads, 0) array for several heads), nothing changes."""
    for heads in (1, 3):
        p = make(backend, name, budget=6, protected=2, heads=heads)
        for t in range(1, 6):
            p.on_decode_step(t, None)
        state, mem = p.state_dict(), p.memory_bytes()
        for budget in (None, 6, 7, UINT32_MAX):
            res = p.evict(budget)
            if heads == 1:
                assert res == []
            else:
                assert res.shape == (3, 0) and res.dtype == np.uint32
        assert p.state_dict() == state and p.memory_bytes() == mem


def test_budget_equal_to_held_count_then_one_below(backend, name):
    """evict(held) removes nothing; evict(held - 1) removes exactly one."""
    p = make(backend, name, budget=4, protected=1)
    for t in range(1, 8):
        p.on_decode_step(t, np.full(p.kept_count(), 0.5))
    assert checked(p, name, "evict", budget=8) == [[]]
    assert len(checked(p, name, "evict", budget=7)[0]) == (0 if name == "full" else 1)


def test_cache_shorter_than_the_window_or_the_sinks(backend):
    """Fewer positions than the recent window or the sinks: nothing is evicted and nothing breaks."""
    s = make(backend, "scissorhands", budget=10, protected=8)
    st = make(backend, "streaming-llm", budget=8, protected=6)
    for t in range(1, 4):
        assert checked(s, "scissorhands", "step", t, np.full(s.kept_count(), 0.5)) == [[]]
        assert checked(st, "streaming-llm", "step", t, None) == [[]]
    assert st.sink_count() == 4  # min(sinks, held)
    for t in range(4, 9):
        st.on_decode_step(t, None)
    assert checked(st, "streaming-llm", "evict") == [[6]]  # the first non-sink


def test_prompt_longer_than_the_budget(backend, name):
    """A prefilled prompt longer than the budget is held whole; one evict then drops the excess."""
    rng = np.random.default_rng(3)
    p = make(backend, name, budget=6, protected=2, heads=2)
    prompt = np.tril(rng.integers(0, 4, (2, 20, 20)) / 4, -1)
    p.prefill(prompt)
    assert p.kept_count() == 20
    victims = checked(p, name, "evict")
    assert all(len(v) == (0 if name == "full" else 14) for v in victims)


def test_minimum_budget_and_the_one_below(backend, heavy):
    """budget = recent_window + 1 keeps the window and the best-scored position; recent_window is refused."""
    p = make(backend, heavy, budget=8, protected=3)
    for t in range(1, 9):
        w = np.zeros(p.kept_count())
        w[min(2, len(w) - 1)] = 0.9  # position 2 is the heavy hitter
        p.on_decode_step(t, w)
    state = p.state_dict()
    with pytest.raises(InvalidInputError):
        p.evict(3)
    assert p.state_dict() == state
    checked(p, heavy, "evict", budget=4)
    assert rows(p) == [[2, 6, 7, 8]]


def test_budget_one_without_protection(backend):
    """budget 1 with no window or sinks: every step keeps exactly one position."""
    for name in ("scissorhands", "h2o", "streaming-llm"):
        p = make(backend, name, budget=1, protected=0)
        for t in range(1, 10):
            checked(p, name, "step", t, np.full(p.kept_count(), 1.0))
            assert p.kept_count() == 1


# ---------------------------------------------------------------- the output contract


@pytest.mark.parametrize("heads", [1, 3])
def test_output_contract_after_every_eviction(backend, name, heads):
    """Random steps and evictions: every result is exactly what the spec names, per head."""
    rng = np.random.default_rng(heads * 101)
    p = make(backend, name, budget=7, protected=2, heads=heads)
    pos = 0
    for i in range(200):
        pos += int(rng.integers(1, 3))
        w = (rng.integers(0, 3, (heads, p.kept_count())) / 4).astype(rng.choice([np.float32, np.float64]))
        op = rng.integers(0, 5)
        budget = None if rng.integers(0, 2) else int(rng.integers(3, 12))
        if op == 0:
            p.on_decode_step(pos, w)
        elif op == 1:
            checked(p, name, "evict", budget=budget, return_indices=bool(i % 2))
        else:
            checked(p, name, "step", pos, w, budget=budget, return_indices=bool(i % 2))


# ---------------------------------------------------------------- precision


def test_float32_third_votes_and_float64_third_does_not(backend):
    """float32(1/3) is just above 1/3 as a double and votes; float64, list and float16 thirds do not."""
    cases = [(np.full(3, 1 / 3, dtype=np.float32), [1, 1, 1]),
             (np.full(3, 1 / 3, dtype=np.float64), [0, 0, 0]),
             ([1 / 3] * 3, [0, 0, 0]),
             (np.full(3, 1 / 3, dtype=np.float16), [0, 0, 0]),
             (np.full(3, np.nextafter(np.float32(1 / 3), np.float32(0))), [0, 0, 0])]
    for attn, votes in cases:
        p = make(backend, "scissorhands", budget=8, protected=1)
        p.on_decode_step(1, None)
        p.on_decode_step(2, None)
        p.on_decode_step(3, attn)
        assert p.votes.tolist()[:3] == votes, attn


@pytest.mark.parametrize("n", [3, 5, 6, 7, 10, 11, 49, 100, 1000])
def test_fair_share_compared_in_double_at_many_sizes(backend, n):
    """A float32 weight of 1/n votes exactly when its double value exceeds 1.0 / n."""
    p = make(backend, "scissorhands", budget=2000, protected=1)
    for t in range(1, n):
        p.on_decode_step(t, None)
    w = np.float32(1 / n)
    p.on_decode_step(n, np.full(n, w))
    assert p.votes_of(0) == int(float(w) > 1.0 / n)


def test_float32_neighbours_of_every_share_up_to_400(backend):
    """n = 3..400: float32(1/n) and its float32 neighbours vote exactly when their double beats 1.0 / n."""
    p = make(backend, "scissorhands", budget=1000, protected=1)
    p.on_decode_step(1, None)
    p.on_decode_step(2, None)
    for n in range(3, 401):
        mid = np.float32(1 / n)
        cands = [np.nextafter(mid, np.float32(0)), mid, np.nextafter(mid, np.float32(1))]
        attn = np.zeros(n, dtype=np.float32)
        attn[:3] = cands
        before = p.votes.tolist()[:3]
        p.on_decode_step(n, attn)
        gained = [a - b for a, b in zip(p.votes.tolist()[:3], before)]
        assert gained == [int(float(c) > 1.0 / n) for c in cands], n


def test_h2o_float32_weight_widened_exactly(backend):
    """H2O adds a float32 weight's exact double value, not its decimal rounding."""
    p = make(backend, "h2o", budget=4, protected=1)
    p.on_decode_step(1, np.array([1 / 3], dtype=np.float32))
    assert p.score_of(0) == float(np.float32(1 / 3)) == 0.3333333432674408


def test_h2o_thousands_of_small_additions_order_correctly(backend):
    """2000 additions of 2**-25 lift X above Y's 1 + 2**-20 in float64; in float32 they would vanish."""
    p = make(backend, "h2o", budget=5, protected=2)
    p.on_decode_step(1, None)
    p.on_decode_step(2, None)
    x, y = 1, 2
    p.on_decode_step(3, np.array([5.0, 1.0, 1.0 + 2.0**-20], dtype=np.float32))  # 0 stays safe
    tiny = np.float32(2.0**-25)
    for t in range(4, 2004):
        w = np.zeros(p.kept_count(), dtype=np.float32)
        w[1] = tiny  # slot 1 is X throughout: 0 and X and Y are never evicted
        p.step(t, w)
    assert rows(p)[0][:3] == [0, x, y]
    assert p.score_of(x) == 1.0 + 2000 * 2.0**-25  # exact in double
    f32 = np.float32(1.0)
    for _ in range(2000):
        f32 = np.float32(f32 + tiny)
    assert f32 == np.float32(1.0)  # what a float32 accumulator would hold: X < Y
    assert p.evict(4) == [y]


def test_h2o_last_bit_decides(backend):
    """0.1 + 0.2 > 0.3 in double: the higher position with exactly 0.3 is evicted, not the lower one."""
    p = make(backend, "h2o", budget=3, protected=1)
    for t in (1, 2):
        p.on_decode_step(t, None)
    p.on_decode_step(3, [0.0, 0.1, 0.3])
    p.on_decode_step(4, [0.0, 0.2, 0.0, 0.0])
    assert p.score_of(1) == 0.1 + 0.2 != 0.3 == p.score_of(2)
    assert p.evict() == [0, 3]  # the two zero scores
    assert p.evict(2) == [2]  # 0.3 < 0.30000000000000004: position 2 goes although 1 is lower


@pytest.mark.parametrize("name", HEAVY)
def test_backends_agree_bit_for_bit(name):
    """Grid and irrational-ish weights with many ties: identical victims and bit-identical scores."""
    native, ref = (make(load_backend(b), name, budget=16, protected=3, heads=2) for b in BACKENDS)
    rng = np.random.default_rng(23)
    for t in range(1, 600):
        n = native.kept_count()
        if t % 3:
            w = rng.integers(0, 5, (2, n)) / 4
        else:
            w = rng.random((2, n)).astype(np.float32) / 3
        budget = None if t % 5 else 12
        a, b = native.step(t, w, budget, return_indices=True), ref.step(t, w, budget, return_indices=True)
        assert [x.tolist() for x in a] == [x.tolist() for x in b], f"step {t}"
    sa, sb = native.state_dict(), ref.state_dict()
    key = SPECS[name].score_key
    assert sa["kept"] == sb["kept"]
    assert [[float(v).hex() for v in r] for r in sa[key]] == [[float(v).hex() for v in r] for r in sb[key]]


def test_equal_scores_give_the_same_victims_every_time(backend, heavy):
    """Many equal scores: repeated runs and copies name the same victims, lower positions first."""
    def build() -> Any:
        p = make(backend, heavy, budget=40, protected=5)
        for t in range(1, 100):
            p.on_decode_step(t, np.full(p.kept_count(), 0.5) if t % 2 else None)
        return p

    results = []
    for p in (build(), build(), copy.deepcopy(build())):
        results.append((p.evict(63), p.step(100, np.full(p.kept_count(), 0.5), 30)))
    assert results[0] == results[1] == results[2]
    victims = results[0][0]
    assert victims == oracle(heavy, list(range(100)), score_rows(build())[0], 63, 5)


# ---------------------------------------------------------------- reset and isolation


def sequence(p: Any, seed: int, steps: int = 60) -> list[Any]:
    """A deterministic run of steps with weights and budgets; its results."""
    rng = np.random.default_rng(seed)
    out = []
    pos = p.state_dict()["last_position"]
    for _ in range(steps):
        pos += 1
        w = rng.integers(0, 4, (p.heads, p.kept_count())) / 4
        out.append(np.asarray(p.step(pos, w, int(rng.integers(4, 9)))).tolist())
    return out + [p.state_dict()["kept"], score_rows(p)]


def test_reset_carries_nothing_over(backend, name):
    """After reset a policy holds {0}, accepts position 1 again, and decides exactly like a fresh one."""
    fresh_state = make(backend, name, heads=2).state_dict()
    p = make(backend, name, heads=2)
    sequence(p, seed=1)
    p.reset()
    assert p.state_dict() == fresh_state
    assert sequence(p, seed=2) == sequence(make(backend, name, heads=2), seed=2)
    p.reset()
    p.prefill(np.tril(np.full((2, 5, 5), 0.5), -1))  # fresh again: prefill allowed
    assert p.kept_count() == 5


def test_objects_share_no_state(backend, name):
    """A policy created after (or interleaved with) another behaves as if it were alone."""
    alone = sequence(make(backend, name), seed=5)
    busy = make(backend, name)
    sequence(busy, seed=6, steps=200)
    assert sequence(make(backend, name), seed=5) == alone
    a, b = make(backend, name), make(backend, name)
    ra, rb = np.random.default_rng(5), np.random.default_rng(7)
    out_a, out_b = [], []
    for t in range(1, 61):  # alternate steps on two objects
        for p, rng, out in ((a, ra, out_a), (b, rb, out_b)):
            w = rng.integers(0, 4, (1, p.kept_count())) / 4
            out.append(np.asarray(p.step(t, w, int(rng.integers(4, 9)))).tolist())
    assert out_a + [a.state_dict()["kept"], score_rows(a)] == alone


# ---------------------------------------------------------------- buffer hygiene


def reads_like(backend: Any, heavy: str, attn: Any, values: list[float], heads: int = 1) -> None:
    """Feeding ``attn`` gives the same state as feeding the float64 ``values``."""
    a, b = (make(backend, heavy, budget=8, protected=1, heads=heads) for _ in range(2))
    for p in (a, b):
        for t in range(1, len(values) // heads):
            p.on_decode_step(t, None)
    a.on_decode_step(99, np.array(values, dtype=np.float64).reshape(heads, -1))
    b.on_decode_step(99, attn)
    assert b.state_dict() == a.state_dict()


VALUES = [0.0, 0.75, 0.25, 0.0, 0.5]  # exact in every dtype below


def test_views_and_temporaries_read_from_the_right_place(backend, heavy):
    """Offset, reversed, strided, broadcast and column views, and temporaries read the values they show."""
    buf = np.array([9.0, 9.0, 9.0] + VALUES + [9.0], dtype=np.float64)
    reads_like(backend, heavy, buf[3:8], VALUES)  # contiguous, but not at the buffer's start
    reads_like(backend, heavy, np.array(VALUES[::-1])[::-1], VALUES)
    grid = np.zeros((5, 3), dtype=np.float32)
    grid[:, 1] = VALUES
    reads_like(backend, heavy, grid[:, 1], VALUES)  # a column: stride of 3 elements
    reads_like(backend, heavy, np.broadcast_to(np.float32(0.25), (5,)), [0.25] * 5)  # stride 0
    reads_like(backend, heavy, (np.arange(10, dtype=np.float64) * 0.0 + np.repeat(VALUES, 2))[::2], VALUES)
    two = np.array([VALUES, VALUES[::-1]])
    reads_like(backend, heavy, np.asfortranarray(two), two.ravel().tolist(), heads=2)
    reads_like(backend, heavy, np.ascontiguousarray(two.T).T, two.ravel().tolist(), heads=2)


def test_byte_order_and_odd_dtypes_are_converted(backend, heavy):
    """Big-endian, float16, small and unsigned integers and longdouble read as their values."""
    for dtype in (">f8", ">f4", "<f2", np.longdouble):
        reads_like(backend, heavy, np.array(VALUES, dtype=dtype), VALUES)
    ints = [0, 3, 1, 0, 2]
    for dtype in (np.int8, np.uint8, ">i4", np.uint64, np.int64):
        reads_like(backend, heavy, np.array(ints, dtype=dtype), [float(x) for x in ints])


def test_input_arrays_are_never_written_or_retained(backend, heavy):
    """Read-only arrays are accepted; the caller's array is never written, and later changes do nothing."""
    p = make(backend, heavy, budget=12, protected=1)
    for t in range(1, 5):
        p.on_decode_step(t, None)
    for dtype in (np.float32, np.float64):
        attn = np.array((VALUES * 3)[: p.kept_count()], dtype=dtype)
        attn.setflags(write=False)
        keep = attn.copy()
        p.on_decode_step(p.state_dict()["last_position"] + 1, attn)
        assert np.array_equal(attn, keep)
        writable = np.array((VALUES * 3)[: p.kept_count()] + [0.0], dtype=dtype)[: p.kept_count()]
        p.on_decode_step(p.state_dict()["last_position"] + 1, writable)
        state = p.state_dict()
        writable[:] = 0.875
        assert p.state_dict() == state


@pytest.mark.parametrize("attn", [
    np.zeros(3, dtype=bool), np.zeros(3, dtype=complex), np.array(["a", "b", "c"]),
    np.zeros(3, dtype="datetime64[s]"), np.zeros(3, dtype="timedelta64[s]"),
    np.zeros(3, dtype=[("w", "f8")]), np.array([0.5, None, 0.5], dtype=object), [0.5, "0.5", 0.5],
    [0.5, None, 0.5], np.array([0.5, "x", 0.5], dtype=object)],
    ids=["bool", "complex", "str", "datetime", "timedelta", "structured", "object-None", "list-str",
         "list-None", "object-str"])
def test_non_numeric_dtypes_refused_before_c(backend, heavy, attn):
    """Non-real weights raise InvalidTypeError and change nothing."""
    p = make(backend, heavy, budget=8, protected=1)
    p.on_decode_step(1, None)
    p.on_decode_step(2, None)
    state, mem = p.state_dict(), p.memory_bytes()
    with pytest.raises(InvalidTypeError):
        p.on_decode_step(3, attn)
    assert p.state_dict() == state and p.memory_bytes() == mem


@pytest.mark.parametrize("where", ["read", "unread"])
def test_integers_too_large_for_a_double_are_refused_where_no_step_reads_them(backend, heavy, where):
    """An int beyond the double range raises InvalidInputError in both backends, read or not."""
    p = make(backend, heavy, budget=8, protected=1)
    prompt = [[0.0, 0.0], [0.5, 0.0]]
    prompt[1 if where == "read" else 0][0 if where == "read" else 1] = 10**400
    with pytest.raises(InvalidInputError):
        p.prefill(prompt)
    assert p.kept.tolist() == [0]


def test_counts_disagreeing_with_the_data_are_refused(backend, heavy):
    """Weights, rows, prompts or state fields whose counts disagree: InvalidInputError, nothing changes."""
    p = make(backend, heavy, budget=8, protected=1, heads=2)
    for t in range(1, 4):
        p.on_decode_step(t, None)
    state, mem = p.state_dict(), p.memory_bytes()
    for attn in (np.zeros((2, 3)), np.zeros((2, 5)), np.zeros((1, 4)), np.zeros(4), np.zeros((3, 4)),
                 np.zeros((2, 4, 1)), np.zeros(8), [[0.5] * 4, [0.5] * 3]):
        with pytest.raises(InvalidInputError):
            p.on_decode_step(4, attn)
        with pytest.raises(InvalidInputError):
            p.step(4, attn)
        assert p.state_dict() == state and p.memory_bytes() == mem
    q = make(backend, heavy, budget=8, protected=1, heads=2)
    for prompt in (np.zeros((1, 4, 4)), np.zeros((3, 4, 4)), np.zeros((2, 4, 5)), np.zeros((4, 4)),
                   np.zeros((2, 0, 0))):
        with pytest.raises(InvalidInputError):
            q.prefill(prompt)
        assert q.kept_count() == 1
    key = SPECS[heavy].score_key
    for field, value in ((key, [state[key][0], state[key][1][:-1]]), (key, state[key][:1]),
                         ("kept", state["kept"][:1]), ("kept", [state["kept"][0], state["kept"][1][:-1]])):
        bad = dict(state, **{field: value})
        with pytest.raises(InvalidInputError):
            backend.POLICIES[heavy].from_state_dict(bad)


def test_returned_arrays_are_copies_not_views_of_internal_buffers(backend, name):
    """Victim arrays survive later calls, and writing into kept/votes/scores or results changes nothing."""
    p = make(backend, name, budget=3, protected=1, heads=2)
    first = p.step(1, np.zeros((2, 1)))
    results = [p.step(t, np.full((2, p.kept_count()), 0.5)) for t in range(2, 8)]
    snapshot = [r.tolist() for r in results]
    for t in range(8, 20):
        p.step(t, np.full((2, p.kept_count()), 0.5))
    assert [r.tolist() for r in results] == snapshot and first.shape == (2, 0)
    state = p.state_dict()
    for arr in (p.kept, getattr(p, "votes", p.kept), getattr(p, "scores", p.kept), results[-1]):
        arr[...] = 7
    assert p.state_dict() == state


# ---------------------------------------------------------------- signedness and range


def test_positions_across_the_int32_and_uint32_limits(backend, name):
    """Positions 2**31-1, 2**31 and 2**32-1 are held as given (no sign, no wrap); nothing comes after."""
    p = make(backend, name, budget=6, protected=1)
    for pos in (2**31 - 1, 2**31, 2**31 + 1, UINT32_MAX - 1, UINT32_MAX):
        p.on_decode_step(pos, np.full(p.kept_count(), 0.5))
    assert rows(p) == [[0, 2**31 - 1, 2**31, 2**31 + 1, UINT32_MAX - 1, UINT32_MAX]]
    assert p.kept.dtype == np.uint32 and int(p.kept[-1]) == UINT32_MAX
    if name in HEAVY:
        assert score(p, 2**31) != -1 and score(p, UINT32_MAX) == 0
    state = p.state_dict()
    for pos in (2**32, 2**32 + 1, 0, 1, UINT32_MAX):
        with pytest.raises(InvalidInputError):
            p.on_decode_step(pos, None)
    assert p.state_dict() == state


@pytest.mark.parametrize(("pos", "exc"), [
    (-1, InvalidInputError), (-(2**31), InvalidInputError), (2**32, InvalidInputError),
    (2**64, InvalidInputError), (-(2**63), InvalidInputError), (np.int64(-1), InvalidInputError),
    (np.uint64(2**64 - 1), InvalidInputError), (np.int8(-1), InvalidInputError),
    (True, InvalidTypeError), (False, InvalidTypeError), (np.bool_(True), InvalidTypeError),
    (1.0, InvalidTypeError), (np.float64(1), InvalidTypeError), (float("nan"), InvalidTypeError),
    ("1", InvalidTypeError), (None, InvalidTypeError)])
def test_bad_positions_refused(backend, name, pos, exc):
    """Negative, too-large, bool, float or str positions raise the right class and change nothing."""
    p = make(backend, name)
    p.on_decode_step(5, None)
    state, mem = p.state_dict(), p.memory_bytes()
    for call in (lambda: p.on_decode_step(pos, None), lambda: p.step(pos, None)):
        with pytest.raises(exc):
            call()
        assert p.state_dict() == state and p.memory_bytes() == mem


@pytest.mark.parametrize(("budget", "exc"), [
    (0, InvalidInputError), (-1, InvalidInputError), (2**32, InvalidInputError), (2**64, InvalidInputError),
    (-(2**32) + 5, InvalidInputError), (np.int64(-1), InvalidInputError),
    (True, InvalidTypeError), (False, InvalidTypeError), (5.0, InvalidTypeError),
    (np.float32(5), InvalidTypeError),
    ("5", InvalidTypeError), (math.inf, InvalidTypeError)])
def test_bad_budgets_refused(backend, name, budget, exc):
    """A budget that is not a positive 32-bit integer is refused by the constructor, evict and step alike."""
    with pytest.raises(exc):
        make(backend, name, budget=budget, protected=0)
    p = make(backend, name, budget=4, protected=1)
    for t in range(1, 7):
        p.on_decode_step(t, None)
    state, mem = p.state_dict(), p.memory_bytes()
    with pytest.raises(exc):
        p.evict(budget)
    with pytest.raises(exc):
        p.step(7, None, budget)
    assert p.state_dict() == state and p.memory_bytes() == mem


def test_large_valid_budgets_and_numpy_integers(backend, name):
    """Per-call budgets 2**31 and 2**32-1 and numpy integers are valid; np.uint32 works as a position."""
    p = make(backend, name, budget=4, protected=1)
    for t in range(1, 7):
        p.on_decode_step(np.uint32(t), None)
    assert p.evict(2**31) == [] and p.evict(UINT32_MAX) == [] and p.evict(np.uint64(UINT32_MAX)) == []
    assert len(p.evict(np.int16(5))) == (0 if name == "full" else 2)


@pytest.mark.parametrize("pos", [-1, -(2**31), 2**32, 2**64, np.int64(-5), np.uint64(2**63)])
def test_lookups_of_out_of_range_positions_say_not_held(backend, heavy, pos):
    """votes_of / score_of return -1 for positions no policy can hold, instead of wrapping."""
    p = make(backend, heavy)
    for t in (1, 2**31, UINT32_MAX):
        p.on_decode_step(t, None)
    assert score(p, pos) == -1
    assert score(p, UINT32_MAX) == 0 and score(p, 2**31) == 0


# ---------------------------------------------------------------- threads


def weights_for(pos: int, n: int) -> np.ndarray:
    """Deterministic weights of step ``pos`` over ``n`` held positions."""
    return np.random.default_rng(pos).integers(0, 5, n) / 4


@pytest.fixture
def fast_switching():
    """Make the interpreter switch threads as often as it can, to force interleavings."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def test_state_dict_is_one_moment_while_another_thread_steps(native, fast_switching):
    """state_dict() reads the arrays and last_position under one hold of the lock: with a
    recent window the newest position admitted is always held, so every snapshot's last
    kept position equals its last_position, however the threads interleave."""
    p = native.Scissorhands(budget=8, recent_window=2, vote_rate=True)
    done = threading.Event()

    def stepper() -> None:
        pos = 0
        while not done.is_set():
            pos += 1
            p.step(pos, None)

    thread = threading.Thread(target=stepper)
    thread.start()
    try:
        torn = [s["kept"][0][-1] for s in (p.state_dict() for _ in range(20000))
                if s["kept"][0][-1] != s["last_position"]]
    finally:
        done.set()
        thread.join()
    assert p.state_dict()["last_position"] > 100  # the two threads did interleave
    assert not torn, torn[:5]


@pytest.mark.parametrize("name", EVICTING)
def test_two_threads_on_one_policy_equal_a_serial_order(native, name, fast_switching):
    """Two threads stepping one policy end where a serial replay of the successful steps ends."""
    # Positions come from a shared counter, so steps may arrive out of order, or with
    # weights sized for a count that has moved: those must fail cleanly and change nothing.
    # Only the C-backed classes promise a per-object lock (the pure-Python reference is a
    # single-threaded spec), so this runs on the native backend and replays on both.
    p = make(native, name, budget=12, protected=3)
    counter_lock = threading.Lock()
    counter = [0]
    logs: list[list[Any]] = [[], []]
    crashes: list[BaseException] = []

    def worker(i: int) -> None:
        for _ in range(3000):
            with counter_lock:
                counter[0] += 1
                pos = counter[0]
            n = p.kept_count()
            try:
                logs[i].append((pos, n, p.step(pos, weights_for(pos, n))))
            except InvalidInputError:
                continue  # out of order, or the count moved under us: nothing happened
            except BaseException as exc:
                crashes.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not crashes, crashes[:3]
    done = sorted(logs[0] + logs[1])
    assert done, "no step succeeded"
    for backend_name in BACKENDS:
        serial = make(load_backend(backend_name), name, budget=12, protected=3)
        for pos, n, victims in done:
            if name in HEAVY:  # the weights' length was checked against the count
                assert serial.kept_count() == n
            w = weights_for(pos, n if name in HEAVY else serial.kept_count())
            assert serial.step(pos, w) == victims, (backend_name, pos)
        assert serial.state_dict() == p.state_dict()


def test_evictions_from_another_thread_conserve_positions(native, fast_switching):
    """One thread admits, another evicts: every position is held at the end or was returned exactly once."""
    p = make(native, "scissorhands", budget=20, protected=4, heads=2)
    stop = threading.Event()
    evicted: list[Any] = []
    crashes: list[BaseException] = []

    def admitter() -> None:
        try:
            for t in range(1, 4001):
                p.on_decode_step(t, None)
        except BaseException as exc:
            crashes.append(exc)
        finally:
            stop.set()

    def evicter() -> None:
        rng = np.random.default_rng(0)
        try:
            while not stop.is_set():
                evicted.append(p.evict(int(rng.integers(5, 30))))
        except BaseException as exc:
            crashes.append(exc)

    threads = [threading.Thread(target=admitter), threading.Thread(target=evicter)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not crashes, crashes[:3]
    kept = p.kept
    for h in range(2):
        gone = [int(v) for batch in evicted for v in batch[h]]
        assert all(list(batch[h]) == sorted(batch[h]) for batch in evicted)
        held = kept[h].tolist()
        assert held == sorted(held)
        assert sorted(gone + held) == list(range(4001)), f"head {h}: positions lost or duplicated"


@pytest.mark.parametrize("name", EVICTING)
def test_two_policies_in_two_threads(backend, name, fast_switching):
    """Two objects stepped concurrently from two threads each end exactly as when run alone."""
    def run(p: Any, seed: int, out: list[Any]) -> None:
        rng = np.random.default_rng(seed)
        for t in range(1, 1500):
            w = rng.integers(0, 4, (2, p.kept_count())) / 4
            out.append(p.step(t, w, int(rng.integers(5, 12))).tolist())
        out.append(p.state_dict())

    alone = []
    for seed in (1, 2):
        out: list[Any] = []
        run(make(backend, name, budget=8, protected=2, heads=2), seed, out)
        alone.append(out)
    together: list[list[Any]] = [[], []]
    threads = [threading.Thread(target=run, args=(make(backend, name, budget=8, protected=2, heads=2), s, o))
               for s, o in zip((1, 2), together)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == alone
