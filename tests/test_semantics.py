"""Each semantic rule and each error of the policy API, pinned on both backends.

Every error test also checks that the failed call left ``state_dict()`` and
``memory_bytes()`` exactly as they were. The C path runs twice: on the kernels this CPU
runs by default (AVX2 where it has it) and on the forced scalar kernels.
"""

from __future__ import annotations

import copy
import json
import math
import pickle
import sys

import numpy as np
import pytest
from c_paths import backend_fixture  # noqa: F401  (the backend fixture: both C paths and the reference)
from conftest import unchanged

from scissorhands._shared import UINT32_MAX
from scissorhands.errors import InvalidInputError, InvalidTypeError, ScissorhandsError
from scissorhands.options import SPECS

#: The attention-driven classes, every class, and their bytes per slot, from the registry
#: (the design's 9 / 13 / 4 are pinned in test_registry).
HEAVY = tuple(spec.class_name for spec in SPECS.values() if spec.reads_attention)
ALL = tuple(spec.class_name for spec in SPECS.values())
BYTES_PER_SLOT = {spec.class_name: spec.slot_bytes for spec in SPECS.values()}


@pytest.fixture(params=ALL)
def any_cls(request, backend):
    """Every policy class of each backend."""
    return getattr(backend, request.param)


def make(cls, budget=4, heads=1, **kw):
    """A small policy of any class: recent window or sinks 1 where the class has one."""
    if cls.__name__ in HEAVY:
        kw.setdefault("recent_window", 1)
    elif cls.__name__ == "StreamingLLM":
        kw.setdefault("sinks", 1)
    return cls(budget=budget, heads=heads, **kw)


def fill(p, n):
    """Admit positions until ``n`` are held, with no attention."""
    pos = p.state_dict()["last_position"]
    while p.kept_count() < n:
        pos += 1
        p.on_decode_step(pos, None)


def score(p, pos, head=0):
    """Votes or score of ``pos``, whichever the policy keeps."""
    return p.votes_of(pos, head) if hasattr(p, "votes_of") else p.score_of(pos, head)


def scores(p):
    """The votes or scores property, whichever the policy keeps."""
    return (p.votes if hasattr(p, "votes_of") else p.scores).tolist()


# ---------------------------------------------------------------- construction


def test_defaults(backend):
    """Defaults: budget 512, recent window 32 (TOVA 1), sinks 4 (StreamingLLM) or 0; a new
    policy holds {0}; header + budget+1 slots."""
    s, h, t = backend.Scissorhands(), backend.H2O(), backend.TOVA()
    st, f = backend.StreamingLLM(), backend.Full()
    assert (s.budget, s.recent_window, s.heads) == (512, 32, 1)
    assert (h.budget, h.recent_window) == (512, 32)
    assert (t.budget, t.recent_window, t.sinks, t.heads) == (512, 1, 0, 1)
    assert (st.budget, st.sinks) == (512, 4)
    assert f.budget is None
    assert [p.kept.tolist() for p in (s, h, t, st, f)] == [[0]] * 5
    assert s.votes.tolist() == [0] and h.scores.tolist() == [0.0] and t.scores.tolist() == [0.0]
    assert [p.memory_bytes() for p in (s, h, t, st, f)] == [
        64 + 513 * 9, 64 + 513 * 13, 64 + 513 * 13, 64 + 513 * 4, 64 + 64 * 4]


def test_numpy_integer_parameters_accepted(any_cls):
    """NumPy integers work as parameters and come back as plain ints in the state."""
    kw = {"heads": np.int32(2)}
    if any_cls.__name__ in HEAVY:
        kw["recent_window"] = np.uint8(1)
    elif any_cls.__name__ == "StreamingLLM":
        kw["sinks"] = np.uint8(1)
    p = any_cls(budget=np.int64(4), **kw)
    params = p.state_dict()["params"]
    assert params["budget"] == 4 and params["heads"] == 2
    assert all(type(v) is int for v in params.values())


@pytest.mark.parametrize("rng", [None, 7, object(), np.random.default_rng(0)])
def test_rng_is_accepted_and_ignored(any_cls, rng):
    """Any rng is accepted and changes nothing: the policies are deterministic."""
    a, b = make(any_cls, budget=3, rng=rng), make(any_cls, budget=3)
    for p in (a, b):
        for t in range(1, 6):
            p.step(t, [0.5 / t] * (p.kept_count() - 1) + [0.5])
    assert a.state_dict() == b.state_dict()


@pytest.mark.parametrize(("kwargs", "exc"), [
    ({"budget": 0}, InvalidInputError),
    ({"budget": -3}, InvalidInputError),
    ({"budget": 2**32}, InvalidInputError),
    ({"budget": True}, InvalidTypeError),
    ({"budget": 4.0}, InvalidTypeError),
    ({"budget": "4"}, InvalidTypeError),
    ({"budget": 4, "heads": 0}, InvalidInputError),
    ({"budget": 4, "heads": 65537}, InvalidInputError),
    ({"budget": 4, "heads": 2.0}, InvalidTypeError),
    ({"budget": 4, "heads": False}, InvalidTypeError),
])
def test_constructor_rejects(any_cls, kwargs, exc):
    """Bad budget or heads raise the documented class for every policy."""
    if any_cls.__name__ in HEAVY:
        kwargs = {"recent_window": SPECS[any_cls.name].min_recent_window, **kwargs}
    elif any_cls.__name__ == "StreamingLLM":
        kwargs = {"sinks": 0, **kwargs}
    with pytest.raises(exc):
        any_cls(**kwargs)


@pytest.mark.parametrize(("window", "exc"), [
    (4, InvalidInputError), (5, InvalidInputError), (-1, InvalidInputError),
    (True, InvalidTypeError), (None, InvalidTypeError), ("1", InvalidTypeError)])
def test_protected_count_must_be_below_budget(backend, window, exc):
    """recent_window and sinks must be integers in [0, budget - 1]."""
    for make in (lambda: backend.Scissorhands(budget=4, recent_window=window),
                 lambda: backend.H2O(budget=4, recent_window=window),
                 lambda: backend.TOVA(budget=4, recent_window=window),
                 lambda: backend.StreamingLLM(budget=4, sinks=window),
                 lambda: backend.Scissorhands(budget=4, recent_window=0, sinks=window)):
        with pytest.raises(exc):
            make()


def test_float_sinks_are_refused(backend):
    """Only recent_window takes a fraction: a float sink count is the wrong kind."""
    for make in (lambda: backend.StreamingLLM(budget=4, sinks=1.0),
                 lambda: backend.Scissorhands(budget=4, recent_window=0, sinks=0.5)):
        with pytest.raises(InvalidTypeError):
            make()


def test_maximal_parameters_accepted(backend):
    """budget 2**32-1 with recent_window 2**32-2 and 65536 heads are legal, and nothing is preallocated."""
    p = backend.Scissorhands(budget=UINT32_MAX, recent_window=UINT32_MAX - 1)
    assert p.memory_bytes() == 64 + 4096 * 9
    q = backend.StreamingLLM(budget=2, sinks=1, heads=65536)
    assert q.memory_bytes() == 64 + 4 * 65536 + 3 * 65536 * 4


def test_registry(backend):
    """POLICIES maps the five documented registry names to the backend's classes, in
    table order (a policy added later may sit between them)."""
    five = {"full": backend.Full, "streaming-llm": backend.StreamingLLM, "h2o": backend.H2O,
            "tova": backend.TOVA, "scissorhands": backend.Scissorhands}
    assert {name: backend.POLICIES[name] for name in five} == five
    assert [name for name in backend.POLICIES if name in five] == list(five)
    for name, cls in backend.POLICIES.items():
        assert cls.name == name
        assert cls().state_dict()["policy"] == name


def test_error_hierarchy():
    """Input errors are ScissorhandsErrors and also the built-in TypeError/ValueError."""
    assert issubclass(InvalidTypeError, ScissorhandsError) and issubclass(InvalidTypeError, TypeError)
    assert issubclass(InvalidInputError, ScissorhandsError) and issubclass(InvalidInputError, ValueError)


# ---------------------------------------------------------------- votes and scores


def test_first_step_earns_no_vote(backend):
    """At the first step position 0 holds all the attention (share 1.0) and earns no vote."""
    p = backend.Scissorhands(budget=4, recent_window=1)
    p.on_decode_step(1, [1.0])
    assert p.votes.tolist() == [0, 0]


@pytest.mark.parametrize("n", [2, 3, 5, 7, 10, 33])
def test_fair_share_is_strict(backend, n):
    """A weight equal to 1.0/n earns no vote; the next double above earns one."""
    p = backend.Scissorhands(budget=64, recent_window=1)
    fill(p, n)
    share = 1.0 / n
    weights = [share] * n
    weights[0] = math.nextafter(share, 2.0)
    weights[-1] = math.nextafter(share, 0.0)
    p.on_decode_step(n, weights)
    assert p.votes.tolist() == [1] + [0] * n


def test_float32_weights_are_widened_exactly(backend):
    """float32 [1/3]*3 votes everyone, float64 [1/3]*3 no one, float16 [1/3]*3 (rounds down) no one."""
    for dtype, expect in ((np.float32, [1, 1, 1, 0]), (np.float64, [0, 0, 0, 0]),
                          (np.float16, [0, 0, 0, 0])):
        p = backend.Scissorhands(budget=8, recent_window=1)
        fill(p, 3)
        p.on_decode_step(3, np.full(3, 1 / 3, dtype=dtype))
        assert p.votes.tolist() == expect, dtype


@pytest.mark.parametrize("n", range(3, 21))
def test_float32_share_comparison_in_double(backend, n):
    """For float32 1/n the vote is exactly float(np.float32(1/n)) > 1.0/n."""
    p = backend.Scissorhands(budget=64, recent_window=1)
    fill(p, n)
    p.on_decode_step(n, np.full(n, 1 / n, dtype=np.float32))
    expect = int(float(np.float32(1 / n)) > 1.0 / n)
    assert p.votes.tolist() == [expect] * n + [0]


@pytest.mark.parametrize("n", [1, 2, 3, 6, 7, 10, 11, 49, 100, 333, 1000, 4097])
def test_float32_votes_at_the_share_boundary(backend, n):
    """float32 weights one ulp either side of float32(1/n) vote exactly when their double exceeds 1.0/n."""
    p = backend.Scissorhands(budget=8192, recent_window=1)
    fill(p, n)
    near = np.float32(1 / n)
    candidates = [np.nextafter(near, np.float32(0)), near, np.nextafter(near, np.float32(1))]
    w = np.array([candidates[i % 3] for i in range(n)], dtype=np.float32)
    p.on_decode_step(n, w)
    assert p.votes.tolist() == [int(float(x) > 1.0 / n) for x in w] + [0]


def test_votes_saturate(backend):
    """Votes stop at 2**32-1 instead of wrapping to 0."""
    p = backend.Scissorhands.from_state_dict({
        "format": "scissorhands.policy", "version": 1, "policy": "scissorhands",
        "params": {"budget": 8, "recent_window": 1, "heads": 1},
        "kept": [[0, 1]], "votes": [[UINT32_MAX - 1, UINT32_MAX]], "last_position": 1})
    p.on_decode_step(2, [0.75, 0.75])
    p.on_decode_step(3, [0.5, 0.5, 0.0])
    assert p.votes.tolist() == [UINT32_MAX, UINT32_MAX, 0, 0]
    assert p.votes_of(0) == UINT32_MAX


def test_h2o_first_step_scores(backend):
    """H2O counts the first step: position 0 scores the whole weight."""
    p = backend.H2O(budget=4, recent_window=1)
    p.on_decode_step(1, [1.0])
    assert p.scores.tolist() == [1.0, 0.0]
    assert type(p.score_of(0)) is float


def test_h2o_accumulates_in_float64(backend):
    """2**24 + 1.0 and 1 + 2**-30 keep their low bits (float32 would round them away)."""
    p = backend.H2O.from_state_dict({
        "format": "scissorhands.policy", "version": 1, "policy": "h2o",
        "params": {"budget": 8, "recent_window": 1, "heads": 1},
        "kept": [[0, 1]], "scores": [[2.0**24, 1.0]], "last_position": 1})
    p.on_decode_step(2, np.array([1.0, 2.0**-30], dtype=np.float32))
    assert p.scores.tolist() == [2.0**24 + 1.0, 1.0 + 2.0**-30, 0.0]


def test_h2o_sum_matches_sequential_float64(backend):
    """After many float32 steps each score is the sequential float64 sum of the widened weights."""
    rng = np.random.default_rng(3)
    p = backend.H2O(budget=4096, recent_window=1)
    expect = [0.0]
    for t in range(1, 200):
        w = rng.random(t).astype(np.float32) / t
        p.on_decode_step(t, w)
        expect = [e + float(x) for e, x in zip(expect, w)] + [0.0]
    assert p.scores.tolist() == expect


def test_tova_assigns_the_latest_weights(backend):
    """TOVA's score is the latest step's weight (H2O's the sum): the victims differ."""
    victims = {}
    for cls in (backend.TOVA, backend.H2O):
        p = cls(budget=3, recent_window=1)
        p.on_decode_step(1, [1.0])
        p.on_decode_step(2, [0.25, 0.75])
        victims[cls.__name__] = p.step(3, [0.5, 0.125, 0.375])
        if cls is backend.TOVA:
            assert p.scores.tolist() == [0.5, 0.375, 0.0]  # positions 0, 2, 3
            assert p.score_of(2) == 0.375 and p.score_of(1) == -1.0
    # TOVA: 0.5, 0.125, 0.375 -> 1 goes; H2O: 1.75, 0.875, 0.375 -> 2 goes.
    assert victims == {"TOVA": [1], "H2O": [2]}


def test_tova_float32_weights_widened_exactly(backend):
    """A float32 weight becomes its exact double (not the decimal it rounds to); -0.0 is
    stored as 0.0 and ties with it, lower position first."""
    p = backend.TOVA(budget=8, recent_window=1)
    fill(p, 4)
    p.on_decode_step(4, np.array([0.1, 0.0, -0.0, 0.5], dtype=np.float32))
    assert p.scores.tolist() == [float(np.float32(0.1)), 0.0, 0.0, 0.5, 0.0]
    assert math.copysign(1.0, p.score_of(2)) == 1.0
    assert p.evict(3) == [1, 2]


def test_tova_ties_evict_the_lower_position(backend):
    """Equal latest weights evict the lower positions; the newest is kept although it scores 0."""
    p = backend.TOVA(budget=3, recent_window=1)
    fill(p, 4)
    assert p.step(4, [0.25, 0.5, 0.25, 0.25]) == [0, 2]
    assert p.kept.tolist() == [1, 3, 4] and p.scores.tolist() == [0.5, 0.25, 0.0]


def test_tova_needs_a_recent_window(backend):
    """recent_window 0 (given, or a fraction rounding to it) is refused, saying why; so is a
    budget of 1, and a state that records either."""
    for kwargs in ({"budget": 4, "recent_window": 0}, {"budget": 4, "recent_window": 0.2},
                   {"budget": 4, "recent_window": 0, "sinks": 1}):
        with pytest.raises(InvalidInputError, match=r"tova needs recent_window >= 1 \(the newest position"):
            backend.TOVA(**kwargs)
    with pytest.raises(InvalidInputError, match=r"tova needs recent_window >= 1 .* budget above 1, got budget 1"):
        backend.TOVA(budget=1)
    assert backend.TOVA(budget=4, recent_window=0.25).recent_window == 1
    state = backend.TOVA(budget=4).state_dict()
    state["params"]["recent_window"] = 0
    with pytest.raises(InvalidInputError, match="tova needs recent_window >= 1"):
        backend.TOVA.from_state_dict(state)


def test_tova_sinks_are_kept(backend):
    """Sinks stay although they score lowest; the lowest after them go."""
    victims = {}
    for sinks in (0, 2):
        p = backend.TOVA(budget=4, recent_window=1, sinks=sinks)
        fill(p, 5)
        victims[sinks] = p.step(5, [0.0, 0.0, 0.5, 0.25, 0.25])
        assert p.sink_count() == sinks
    assert victims == {0: [0, 1], 2: [3, 4]}


def test_tova_chunk_equals_its_decode_steps(backend):
    """extend applies each token as a decode step: a slot ends with the weight of the last
    token that read it (prefill likewise)."""
    chunk = np.array([[0.5, 0.125, 9.0, 9.0, 9.0],
                      [0.25, 0.5, 0.75, 9.0, 9.0],
                      [0.375, 0.0, 0.125, 0.25, 9.0]])  # 9.0: a token's own column and later
    a, b = backend.TOVA(budget=8), backend.TOVA(budget=8)
    for p in (a, b):
        p.on_decode_step(1, [1.0])
    a.extend(chunk)
    for i in range(3):
        b.on_decode_step(2 + i, chunk[i, :2 + i])
    assert a.state_dict() == b.state_dict()
    assert a.scores.tolist() == [0.375, 0.0, 0.125, 0.25, 0.0]
    prompt = np.tril(np.full((4, 4), 0.25), -1)
    c = backend.TOVA(budget=8)
    c.prefill(prompt)
    assert c.scores.tolist() == [0.25, 0.25, 0.25, 0.0]


def test_ties_evict_the_lower_position(heavy):
    """With equal scores the lower positions go first, and victims come back ascending."""
    p = heavy(budget=3, recent_window=1)
    fill(p, 6)
    assert p.evict() == [0, 1, 2]
    assert p.kept.tolist() == [3, 4, 5]


def test_victims_ascending_with_slots(heavy):
    """Victims are returned ascending with their slot in kept before the eviction."""
    key = "votes" if heavy.__name__ == "Scissorhands" else "scores"
    vals = [5, 2, 0, 1, 4, 0]
    p = heavy.from_state_dict({
        "format": "scissorhands.policy", "version": 1, "policy": heavy.name,
        "params": {"budget": 3, "recent_window": 1, "heads": 1},
        "kept": [[0, 2, 5, 7, 8, 9]], key: [vals if key == "votes" else [float(v) for v in vals]],
        "last_position": 9})
    victims, slots = p.evict(return_indices=True)
    assert (victims, slots) == ([2, 5, 7], [1, 2, 3])
    assert all(type(v) is int for v in victims + slots)


def test_recent_window_protects_the_lowest(heavy):
    """Positions in the recent window survive even with the lowest score of all."""
    p = heavy(budget=3, recent_window=2)
    p.on_decode_step(1, [1.0])
    p.on_decode_step(2, [0.75, 0.25])
    p.on_decode_step(3, [0.375, 0.5, 0.125])
    if heavy.__name__ == "TOVA":  # the latest weights only: 0 scores 0.375, 1 scores 0.5
        assert p.evict() == [0]
        assert p.kept.tolist() == [1, 2, 3]
    else:
        assert p.evict() == [1]
        assert p.kept.tolist() == [0, 2, 3]


def test_recent_window_zero_may_evict_the_newest(backend):
    """With recent_window 0 the position just admitted is evictable like any other."""
    p = backend.Scissorhands.from_state_dict({
        "format": "scissorhands.policy", "version": 1, "policy": "scissorhands",
        "params": {"budget": 1, "recent_window": 0, "heads": 1},
        "kept": [[0]], "votes": [[5]], "last_position": 0})
    assert p.step(1, [1.0]) == [1]
    assert p.kept.tolist() == [0]


def test_null_attention_admits_without_scoring(heavy):
    """attn=None admits pos and changes no score (it is not read as zeros)."""
    p = heavy(budget=8, recent_window=1)
    p.on_decode_step(1, [1.0])
    before = scores(p)
    p.on_decode_step(2, None)
    assert scores(p) == before + [0]
    assert p.kept.tolist() == [0, 1, 2]


def test_early_spike_scissorhands_and_h2o_differ(backend):
    """On the early-spike steps H2O keeps the spiked position and Scissorhands evicts it (so
    does TOVA, which sees only the latest step)."""
    steps = [[1.0], [0.0625, 0.9375], [0.375, 0.125, 0.5], [0.3125, 0.0625, 0.3125, 0.3125]]
    victims = {}
    for cls in (backend.Scissorhands, backend.H2O, backend.TOVA):
        p = cls(budget=4, recent_window=1)
        for t, w in enumerate(steps, start=1):
            p.on_decode_step(t, w)
        victims[cls.__name__] = p.evict()
    assert victims == {"Scissorhands": [1], "H2O": [3], "TOVA": [1]}


def test_step_is_on_decode_step_then_evict(any_cls):
    """step(pos, attn, budget) returns and leaves exactly what on_decode_step + evict do."""
    rng = np.random.default_rng(5)
    a, b = make(any_cls, budget=5, heads=2), make(any_cls, budget=5, heads=2)
    for t in range(1, 40):
        w = rng.random((2, a.kept_count()))
        budget = int(rng.integers(5, 9)) if t % 3 else None
        got = a.step(t, w, budget, return_indices=bool(t % 2))
        b.on_decode_step(t, w)
        want = b.evict(budget, return_indices=bool(t % 2))
        if t % 2:
            assert [g.tolist() for g in got] == [x.tolist() for x in want]
        else:
            assert got.tolist() == want.tolist()
        assert a.state_dict() == b.state_dict()
        assert a.memory_bytes() == b.memory_bytes()


def test_per_call_budget_does_not_stick(any_cls):
    """A per-call budget may exceed the configured one; evict() then uses the configured budget."""
    p = make(any_cls, budget=3)
    fill(p, 6)
    assert p.evict(10) == []
    assert p.evict(6) == []
    first = {"Scissorhands": [0], "H2O": [0], "TOVA": [0], "StreamingLLM": [1], "Full": []}
    assert p.evict(np.int64(5)) == first[any_cls.__name__]
    p.evict()
    assert p.kept_count() == (6 if any_cls.__name__ == "Full" else 3)
    assert p.budget == 3


@pytest.mark.parametrize(("cls_name", "kwargs", "bad"), [
    ("Scissorhands", {"recent_window": 2}, [0, 1, 2]),
    ("H2O", {"recent_window": 2}, [0, 1, 2]),
    ("StreamingLLM", {"sinks": 2}, [0, 1, 2]),
    ("Full", {}, [0, -1]),
])
def test_evict_budget_validated_before_early_return(backend, cls_name, kwargs, bad):
    """evict(budget) with budget <= the protected count raises even when nothing needs evicting."""
    p = getattr(backend, cls_name)(budget=4, **kwargs)
    for budget in bad:
        unchanged(p, InvalidInputError, p.evict, budget)
        unchanged(p, InvalidInputError, p.step, 1, None, budget)
    for budget in (True, 3.0, "3", 2**32):
        exc = InvalidInputError if budget == 2**32 else InvalidTypeError
        unchanged(p, exc, p.evict, budget)
    assert p.evict(3) == []


# ---------------------------------------------------------------- attention input kinds


class ArrayLike:
    """A torch-like tensor: only ``__array__``."""

    def __init__(self, values, dtype=np.float32):
        self._values = np.asarray(values, dtype=dtype)

    def __array__(self, dtype=None, copy=None):
        return self._values if dtype is None else self._values.astype(dtype)


VALUES = [0.0, 3.0, 1.0, 0.0, 2.0]  # exact in every dtype below; share 1/5 -> votes at 1, 2, 4


def _strided(values):
    big = np.zeros(2 * len(values))
    big[::2] = values
    return big[::2]


INPUT_KINDS = {
    "list of floats": lambda v: list(v),
    "list of ints": lambda v: [int(x) for x in v],
    "tuple": lambda v: tuple(v),
    "list of numpy scalars": lambda v: [np.float32(x) for x in v],
    "float64 array": lambda v: np.array(v, dtype=np.float64),
    "float32 array": lambda v: np.array(v, dtype=np.float32),
    "float16 array": lambda v: np.array(v, dtype=np.float16),
    "int64 array": lambda v: np.array(v, dtype=np.int64),
    "uint8 array": lambda v: np.array(v, dtype=np.uint8),
    "numeric object array": lambda v: np.array([int(x) if x % 2 else x for x in v], dtype=object),
    "strided view": _strided,
    "read-only array": lambda v: np.frombuffer(np.array(v, dtype=np.float64).tobytes()),
    "(1, n) array": lambda v: np.array([v]),
    "(1, n) list": lambda v: [list(v)],
    "__array__ object": lambda v: ArrayLike(v),
}


@pytest.mark.parametrize("kind", INPUT_KINDS)
def test_attention_input_kinds(heavy, kind):
    """Lists (ints included), tuples, any real dtype, strided, (1, n), __array__: all read alike."""
    a, b = heavy(budget=8, recent_window=1), heavy(budget=8, recent_window=1)
    for p in (a, b):
        fill(p, 5)
    a.on_decode_step(5, [float(x) for x in VALUES])
    b.on_decode_step(5, INPUT_KINDS[kind](VALUES))
    assert b.state_dict() == a.state_dict()
    if heavy.__name__ == "Scissorhands":
        assert b.votes.tolist() == [0, 1, 1, 0, 1, 0]


def test_attention_fortran_and_strided_multi_head(heavy):
    """A Fortran-order or column-strided (heads, n) array reads like its C-order copy."""
    rows = np.array([VALUES, VALUES[::-1]], dtype=np.float32)
    wide = np.zeros((2, 10), dtype=np.float32)
    wide[:, ::2] = rows
    results = []
    for attn in (rows, np.asfortranarray(rows), wide[:, ::2]):
        p = heavy(budget=8, recent_window=1, heads=2)
        fill(p, 5)
        p.on_decode_step(5, attn)
        results.append(p.state_dict())
    assert results[0] == results[1] == results[2]


def test_attention_torch_tensor(heavy):
    """A torch CPU tensor is read through __array__ (bfloat16 via .float())."""
    torch = pytest.importorskip("torch")
    a, b = heavy(budget=8, recent_window=1), heavy(budget=8, recent_window=1)
    for p in (a, b):
        fill(p, 5)
    a.on_decode_step(5, np.array(VALUES, dtype=np.float32))
    b.on_decode_step(5, torch.tensor(VALUES, dtype=torch.bfloat16).float())
    assert a.state_dict() == b.state_dict()


def test_negative_zero_is_a_valid_weight(heavy):
    """-0.0 is zero, not negative: accepted, and it earns nothing."""
    p = heavy(budget=8, recent_window=1)
    p.on_decode_step(1, [-0.0])
    p.on_decode_step(2, np.array([-0.0, 1.0], dtype=np.float32))
    assert score(p, 0) == 0


@pytest.mark.parametrize("attn", [
    [True, 0.5], [0.5, False], np.array([True, False]), [1 + 0j, 0.0], np.array([0.5, 0.5j]),
    ["0.5", "0.5"], "ab", b"ab", [None, 0.5], np.array(["a", "b"]),
    np.array([0.5, "x"], dtype=object), {"a": 1}, np.array(["2020-01-01"] * 2, dtype="datetime64[D]"),
], ids=repr)
def test_attention_type_errors(heavy, attn):
    """Non-real attention (bool, complex, str, None, objects) raises InvalidTypeError, state unchanged."""
    p = heavy(budget=8, recent_window=1)
    fill(p, 2)
    unchanged(p, InvalidTypeError, p.on_decode_step, 2, attn)
    unchanged(p, InvalidTypeError, p.step, 2, attn)


@pytest.mark.parametrize("attn", [
    [math.nan, 0.5], [0.5, math.inf], [-math.inf, 0.5], [0.5, -1e-300], [-1, 2],
    np.array([np.nan, 0.5], dtype=np.float32), np.array([0.5, np.inf], dtype=np.float16),
    np.array([-1, 1], dtype=np.int64), [10**400, 0.5], (0.5, -0.25),
], ids=repr)
def test_attention_value_errors(heavy, attn):
    """NaN, infinite, negative or overflowing weights raise InvalidInputError, state unchanged."""
    p = heavy(budget=8, recent_window=1)
    fill(p, 2)
    unchanged(p, InvalidInputError, p.on_decode_step, 2, attn)
    unchanged(p, InvalidInputError, p.step, 2, attn, 8)


@pytest.mark.parametrize(("attn", "named"), [
    ([0.5, math.nan], "nan"), ([0.5, -0.25], "-0.25"), (np.array([np.inf, 0.5], dtype=np.float32), "inf"),
], ids=repr)
def test_a_refused_weight_is_named(heavy, attn, named):
    """The error for a weight that is not finite and >= 0 names its value (both backends), state unchanged."""
    p = heavy(budget=8, recent_window=1)
    fill(p, 2)
    error = unchanged(p, InvalidInputError, p.step, 2, attn)
    assert f"got {named}" in str(error)


def _prefill_refused(p):
    """A 5-token prompt whose only refused weight read is token 3's -0.25 over position 1, after
    a NaN in the upper triangle and an inf on the diagonal (never read)."""
    attn = np.tril(np.full((5, 5), 0.1))
    attn[0, 2], attn[1, 1], attn[3, 1] = math.nan, math.inf, -0.25
    return p.prefill, attn


def _extend_refused(p):
    """A chunk of 3 tokens after 2 held: the NaN in token 0's column of chunk token 1 (a later
    token) is never read; token 2's -0.25 over chunk token 0 is."""
    fill(p, 2)
    attn = np.full((3, 5), 0.1)
    attn[0, 3], attn[2, 2] = math.nan, -0.25
    return p.extend, attn


def _observe_refused(p):
    """A window of 2 rows over 6 held: row 0 reads slots 0..3, row 1 slots 0..4; the NaN at row
    0's slot 4 is never read, row 1's -0.25 at slot 4 is."""
    fill(p, 6)
    attn = np.full((2, 6), 0.1)
    attn[0, 4], attn[1, 4] = math.nan, -0.25
    return p.evict_observed, attn


@pytest.mark.parametrize("call", [_prefill_refused, _extend_refused, _observe_refused],
                         ids=["prefill", "extend", "evict_observed"])
def test_a_refused_weight_read_by_a_chunk_call_is_named(heavy, call):
    """prefill, extend and evict_observed name the refused weight they read, not an unread one before
    it (both backends), state unchanged."""
    p = heavy(budget=4, recent_window=1)
    fn, attn = call(p)
    error = unchanged(p, InvalidInputError, fn, attn)
    assert "got -0.25" in str(error) and str(error).count("got ") == 1


@pytest.mark.parametrize(("heads", "attn"), [
    (1, [0.5]), (1, [0.5, 0.25, 0.25]), (1, []), (1, 0.5), (1, np.float64(0.5)),
    (1, [[0.5, 0.5], [0.5, 0.5]]), (1, np.zeros((1, 1, 2))), (1, [[0.5, 0.5], [0.5]]),
    (2, [0.5, 0.5]), (2, np.zeros((1, 2))), (2, np.zeros((2, 3))), (2, np.zeros((3, 2))),
    (2, np.zeros((2, 2)).T[:1]),
], ids=repr)
def test_attention_shape_errors(heavy, heads, attn):
    """attn of the wrong rank or length raises InvalidInputError, state unchanged."""
    p = heavy(budget=8, recent_window=1, heads=heads)
    fill(p, 2)
    unchanged(p, InvalidInputError, p.on_decode_step, 2, attn)


def test_validation_order(heavy):
    """pos type, then pos order, then budget, then attention type, then shape, then values."""
    p = heavy(budget=4, recent_window=1)
    fill(p, 2)
    unchanged(p, InvalidTypeError, p.step, 1.0, [math.nan], 0)        # pos type first
    unchanged(p, InvalidInputError, p.step, 1, [True], 1.5)           # pos order before the rest
    unchanged(p, InvalidTypeError, p.step, 2, [True], 1.5)            # budget type before attn
    unchanged(p, InvalidInputError, p.step, 2, [True], 1)             # budget range before attn
    unchanged(p, InvalidTypeError, p.on_decode_step, 2, ["x"])        # attn type before length
    unchanged(p, InvalidTypeError, p.on_decode_step, 2, [math.nan, True])  # type before values
    unchanged(p, InvalidInputError, p.on_decode_step, 2, [math.nan])  # length (or value)


def test_streaming_and_full_ignore_attention(backend):
    """StreamingLLM and Full never read attn: garbage, NaN, wrong shapes all admit the position."""
    for p in (backend.StreamingLLM(budget=8, sinks=1), backend.Full()):
        for t, attn in enumerate([None, "garbage", [True], [math.nan, -1.0], object(),
                                  np.zeros((7, 7)), [1 + 2j]], start=1):
            p.on_decode_step(t, attn)
        assert p.kept.tolist() == list(range(8))


# ---------------------------------------------------------------- positions


def test_position_rules(any_cls):
    """Positions are integers in [0, 2**32-1] above every admitted one; reset forgets them."""
    p = make(any_cls)
    unchanged(p, InvalidInputError, p.on_decode_step, 0, None)
    unchanged(p, InvalidInputError, p.on_decode_step, -1, None)
    unchanged(p, InvalidInputError, p.on_decode_step, 2**32, None)
    for bad in (True, 1.0, "1", None, np.float64(1.0)):
        unchanged(p, InvalidTypeError, p.on_decode_step, bad, None)
    p.on_decode_step(np.int64(5), None)
    unchanged(p, InvalidInputError, p.on_decode_step, 5, None)
    unchanged(p, InvalidInputError, p.on_decode_step, 3, None)
    p.on_decode_step(np.uint32(UINT32_MAX), None)
    assert p.kept.tolist() == [0, 5, UINT32_MAX]
    unchanged(p, InvalidInputError, p.on_decode_step, UINT32_MAX, None)
    p.reset()
    p.on_decode_step(1, None)
    assert p.kept.tolist() == [0, 1]


def test_reset_forgets_everything(heavy):
    """reset() returns to holding {0} with no score and nothing remembered."""
    p = heavy(budget=3, recent_window=1)
    p.on_decode_step(1, [1.0])
    p.on_decode_step(2, [0.9, 0.1])
    p.reset()
    assert p.state_dict() == heavy(budget=3, recent_window=1).state_dict()


# ---------------------------------------------------------------- accessors and result types


def test_votes_of_edge_cases(backend):
    """votes_of: -1 when not held (also <0, >2**32-1); ITE for non-integer pos or head; IIE for head range."""
    p = backend.Scissorhands(budget=4, recent_window=1, heads=2)
    p.on_decode_step(1, [[1.0], [1.0]])
    assert p.votes_of(0) == 0 and p.votes_of(np.int64(1), np.int8(1)) == 0
    for pos in (-1, 2, 2**32, 2**32 - 1, 2**70, -(2**70)):
        assert p.votes_of(pos) == -1
    for pos in (True, False, 1.0, "1", None, np.float32(1)):
        unchanged(p, InvalidTypeError, p.votes_of, pos)
    for head in (2, -1, 2**40):
        unchanged(p, InvalidInputError, p.votes_of, 0, head)
    for head in (True, 1.0, None):
        unchanged(p, InvalidTypeError, p.votes_of, 0, head)
    assert type(p.votes_of(0)) is int and type(p.votes_of(7)) is int


def test_accessor_checks_pos_before_head(heavy):
    """With both arguments bad, the pos type is reported first (argument order, as for steps)."""
    p = heavy(budget=4, recent_window=1, heads=2)
    accessor = p.votes_of if hasattr(p, "votes_of") else p.score_of
    unchanged(p, InvalidTypeError, accessor, True, 5)
    unchanged(p, InvalidTypeError, accessor, 0.5, -1)


def test_score_of_edge_cases(backend):
    """score_of returns a float; -1.0 when not held; same errors as votes_of."""
    p = backend.H2O(budget=4, recent_window=1)
    p.on_decode_step(1, [1.0])
    assert p.score_of(0) == 1.0
    for pos in (-1, 2, 2**32, 2**32 - 1):
        got = p.score_of(pos)
        assert got == -1.0 and type(got) is float
    for pos in (True, 0.0, "0"):
        unchanged(p, InvalidTypeError, p.score_of, pos)
    unchanged(p, InvalidInputError, p.score_of, 0, 1)
    unchanged(p, InvalidTypeError, p.score_of, 0, False)


def test_result_types_one_head(any_cls):
    """One head: evict/step give a list of ints, or a (victims, slots) tuple of lists."""
    p = make(any_cls, budget=2)
    fill(p, 4)
    got = p.evict(return_indices=True)
    assert isinstance(got, tuple) and len(got) == 2
    assert all(isinstance(x, list) for x in got)
    out = p.step(9, None)
    assert isinstance(out, list) and all(type(v) is int for v in got[0] + got[1] + out)


def test_result_types_several_heads(any_cls):
    """Several heads: (heads, k) uint32 victims and int64 slots, each row ascending."""
    p = make(any_cls, budget=2, heads=3)
    fill(p, 5)
    victims, slots = p.evict(return_indices=True)
    k = 0 if any_cls.__name__ == "Full" else 3
    assert victims.shape == slots.shape == (3, k)
    assert victims.dtype == np.uint32 and slots.dtype == np.int64
    assert all(list(r) == sorted(r) for r in victims.tolist())
    empty = p.evict()
    assert empty.shape == (3, 0) and empty.dtype == np.uint32


def test_properties_are_copies(backend):
    """kept/votes/scores are fresh copies with the documented dtype and shape."""
    s, h = backend.Scissorhands(budget=4, recent_window=1, heads=2), backend.H2O(budget=4, recent_window=1)
    for p in (s, h):
        fill(p, 3)
    assert s.kept.dtype == np.uint32 and s.kept.shape == (2, 3)
    assert s.votes.dtype == np.uint32 and s.votes.shape == (2, 3)
    assert h.scores.dtype == np.float64 and h.scores.shape == (3,)
    k = s.kept
    k[:] = 99
    v = h.scores
    v[:] = 99.0
    assert s.kept.tolist() == [[0, 1, 2]] * 2 and h.scores.tolist() == [0.0] * 3


def test_sink_count(backend):
    """sink_count() = min(sinks, held); the sinks are the first positions and never leave."""
    p = backend.StreamingLLM(budget=5, sinks=3)
    assert p.sink_count() == 1
    fill(p, 3)
    assert p.sink_count() == 3
    fill(p, 9)
    assert p.evict() == [3, 4, 5, 6]
    assert p.sink_count() == 3 and p.kept.tolist()[:3] == [0, 1, 2]


def test_sinks_zero_is_a_sliding_window(backend):
    """sinks=0 keeps only the most recent budget positions."""
    p = backend.StreamingLLM(budget=3, sinks=0)
    for t in range(1, 10):
        p.step(t, None)
    assert p.kept.tolist() == [7, 8, 9]
    assert p.sink_count() == 0


def test_full_never_evicts(backend):
    """Full holds every position whatever the budget; its storage doubles from 64 slots."""
    p = backend.Full(budget=3, heads=2)
    sizes = set()
    for t in range(1, 200):
        assert p.step(t, None).shape == (2, 0)
        sizes.add(p.memory_bytes())
    assert p.kept.tolist() == [list(range(200))] * 2
    assert sorted(sizes) == [64 + 2 * 4 + c * 2 * 4 for c in (64, 128, 256)]


# ---------------------------------------------------------------- memory


@pytest.mark.parametrize("cls_name", ALL)
def test_memory_bytes_formula(backend, cls_name):
    """memory_bytes = 64 + 4 * heads + capacity * heads * bytes_per_slot for several heads
    (64 + capacity * bytes_per_slot for one), capacity starting at budget + 1."""
    p = make(getattr(backend, cls_name), budget=10, heads=3)
    cap = 64 if cls_name == "Full" else 11
    assert p.memory_bytes() == 64 + 4 * 3 + cap * 3 * BYTES_PER_SLOT[cls_name]
    one = make(getattr(backend, cls_name), budget=10, heads=1)
    assert one.memory_bytes() == 64 + cap * BYTES_PER_SLOT[cls_name]


def test_memory_grows_only_when_eviction_is_batched(heavy):
    """Evicting every step keeps capacity at budget + 1; batching doubles it; nothing shrinks."""
    p = heavy(budget=4, recent_window=1)
    bps = BYTES_PER_SLOT[heavy.__name__]
    for t in range(1, 50):
        p.step(t, None)
    assert p.memory_bytes() == 64 + 5 * bps
    fill(p, 6)
    assert p.memory_bytes() == 64 + 10 * bps
    fill(p, 11)
    assert p.memory_bytes() == 64 + 20 * bps
    p.evict()
    p.reset()
    assert p.memory_bytes() == 64 + 20 * bps


def test_memory_growth_stops_at_budget_plus_one(backend):
    """Above 4096 the first doubling is clamped to budget + 1, then it doubles again."""
    p = backend.Scissorhands(budget=4100, recent_window=0)
    assert p.memory_bytes() == 64 + 4096 * 9
    fill(p, 4096)
    assert p.memory_bytes() == 64 + 4096 * 9
    fill(p, 4097)
    assert p.memory_bytes() == 64 + 4101 * 9
    fill(p, 4102)
    assert p.memory_bytes() == 64 + 8202 * 9


def test_memory_after_from_state_dict(backend):
    """A loaded state grows capacity as admissions would, until it fits."""
    def load(n):
        return backend.StreamingLLM.from_state_dict({
            "format": "scissorhands.policy", "version": 1, "policy": "streaming-llm",
            "params": {"budget": 5000, "sinks": 4, "heads": 1},
            "kept": [list(range(n))], "last_position": n - 1})
    assert load(4096).memory_bytes() == 64 + 4096 * 4
    assert load(4097).memory_bytes() == 64 + 5001 * 4
    assert load(5002).memory_bytes() == 64 + 10002 * 4


def test_memory_after_prefill(heavy):
    """prefill grows capacity exactly as the decode steps it replaces."""
    a, b = heavy(budget=2, recent_window=1), heavy(budget=2, recent_window=1)
    a.prefill(np.tril(np.full((9, 9), 0.1)))
    for i in range(1, 9):
        b.on_decode_step(i, [0.1] * i)
    assert a.memory_bytes() == b.memory_bytes() == 64 + 12 * BYTES_PER_SLOT[heavy.__name__]
    assert a.state_dict() == b.state_dict()


# ---------------------------------------------------------------- state


def _busy(cls, heads=2):
    """A policy with some history: scores, an eviction, several heads."""
    p = make(cls, heads=heads)
    rng = np.random.default_rng(11)
    for t in range(1, 12):
        p.step(t, rng.random((heads, p.kept_count())), budget=6 if t % 4 else None)
    return p


def test_state_dict_is_plain_json(any_cls):
    """state_dict() is plain data: it survives JSON and holds Python ints and floats."""
    d = _busy(any_cls).state_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["format"] == "scissorhands.policy" and d["version"] == 1
    assert all(type(v) is int for row in d["kept"] for v in row)
    assert type(d["last_position"]) is int


def test_state_round_trip(any_cls):
    """from_state_dict(state_dict()) continues exactly like the original."""
    a = _busy(any_cls)
    b = type(a).from_state_dict(a.state_dict())
    assert b.state_dict() == a.state_dict()
    for t in range(20, 30):
        w = np.full((2, a.kept_count()), 0.25)
        assert a.step(t, w).tolist() == b.step(t, w).tolist()
    assert b.state_dict() == a.state_dict()


@pytest.mark.parametrize("cls_name", ALL)
def test_state_loads_across_backends(native, ref, cls_name):
    """Each backend loads the other's state_dict and both continue identically."""
    for src, dst in ((native, ref), (ref, native)):
        a = _busy(getattr(src, cls_name))
        b = getattr(dst, cls_name).from_state_dict(a.state_dict())
        assert b.state_dict() == a.state_dict()
        assert b.memory_bytes() == type(a).from_state_dict(a.state_dict()).memory_bytes()


def test_h2o_score_saturates_at_dbl_max(backend):
    """A sum past the largest double stays at DBL_MAX (never +inf), so the state still round-trips."""
    p = backend.H2O(budget=4, recent_window=1)
    p.on_decode_step(1, [1e308])
    p.on_decode_step(2, [1e308, 0.0])
    assert p.score_of(0) == sys.float_info.max
    for q in (backend.H2O.from_state_dict(p.state_dict()), copy.deepcopy(p)):
        assert q.state_dict() == p.state_dict()
    json.dumps(p.state_dict(), allow_nan=False)


@pytest.mark.parametrize("bad", [math.inf, math.nan, -0.5])
def test_h2o_state_scores_must_be_finite(backend, bad):
    """from_state_dict refuses an infinite, NaN or negative score."""
    with pytest.raises(InvalidInputError):
        backend.H2O.from_state_dict({
            "format": "scissorhands.policy", "version": 1, "policy": "h2o",
            "params": {"budget": 4, "recent_window": 1, "heads": 1},
            "kept": [[0, 1]], "scores": [[1.0, bad]], "last_position": 1})


def test_pickle_and_deepcopy(any_cls):
    """pickle and copy.deepcopy give an equal, independent policy of the same class."""
    a = _busy(any_cls)
    for b in (pickle.loads(pickle.dumps(a)), copy.deepcopy(a), copy.copy(a)):
        assert type(b) is type(a)
        assert b.state_dict() == a.state_dict()
        b.on_decode_step(100, None)
        assert a.kept_count() == b.kept_count() - 1


def test_repr(backend):
    """repr names the class, its parameters, heads and positions held."""
    assert repr(backend.Scissorhands()) == "Scissorhands(budget=512, recent_window=32, heads=1, held=1)"
    p = backend.H2O(budget=8, recent_window=2, heads=3)
    fill(p, 4)
    assert repr(p) == "H2O(budget=8, recent_window=2, heads=3, held=4)"
    assert repr(backend.StreamingLLM()) == "StreamingLLM(budget=512, sinks=4, heads=1, held=1)"
    assert repr(backend.Full()) == "Full(budget=None, heads=1, held=1)"


@pytest.mark.parametrize("bad", [None, [], "state", 3])
def test_from_state_dict_rejects_non_dicts(any_cls, bad):
    """A state that is not a dict raises InvalidTypeError."""
    with pytest.raises(InvalidTypeError):
        any_cls.from_state_dict(bad)


def test_from_state_dict_accepts_tuples_and_numpy_ints(backend):
    """Rows may be tuples and values NumPy integers (plain data from other producers)."""
    p = backend.Scissorhands.from_state_dict({
        "format": "scissorhands.policy", "version": 1, "policy": "scissorhands",
        "params": {"budget": 4, "recent_window": 1, "heads": 1},
        "kept": ((np.uint32(0), np.int64(3)),), "votes": [(1, np.uint32(2))],
        "last_position": np.int64(5)})
    assert p.kept.tolist() == [0, 3] and p.votes.tolist() == [1, 2]
    p.on_decode_step(6, None)
    unchanged(p, InvalidInputError, p.on_decode_step, 6, None)


def test_from_state_dict_is_fresh_only_at_zero(backend):
    """A loaded state with last_position 0 is fresh (prefill allowed); one above 0 is not."""
    base = {"format": "scissorhands.policy", "version": 1, "policy": "streaming-llm",
            "params": {"budget": 4, "sinks": 1, "heads": 1}}
    p = backend.StreamingLLM.from_state_dict({**base, "kept": [[0]], "last_position": 0})
    p.prefill(np.zeros((3, 3)))
    assert p.kept.tolist() == [0, 1, 2]
    q = backend.StreamingLLM.from_state_dict({**base, "kept": [[0]], "last_position": 4})
    unchanged(q, InvalidInputError, q.prefill, np.zeros((3, 3)))
    unchanged(q, InvalidInputError, q.on_decode_step, 4, None)


# ---------------------------------------------------------------- prefill


@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_prefill_equals_decode_steps(any_cls, heads, dtype):
    """prefill(attn) equals on_decode_step(i, attn[..., i, :i]) for i = 1..P-1, with no eviction."""
    rng = np.random.default_rng(heads)
    attn = np.tril(rng.random((heads, 9, 9)) / 4).astype(dtype)
    attn[:, 3, :3] = 1 / 3  # exact-share and float32-widening ties
    a, b = make(any_cls, heads=heads), make(any_cls, heads=heads)
    a.prefill(attn if heads > 1 else attn[0])
    for i in range(1, 9):
        b.on_decode_step(i, attn[:, i, :i])
    assert a.state_dict() == b.state_dict()
    assert a.kept_count() == 9 and a.memory_bytes() == b.memory_bytes()


def test_prefill_reads_only_the_lower_triangle(heavy):
    """NaN, inf or negative on or above the diagonal is never read."""
    attn = np.tril(np.full((5, 5), 0.2), -1)
    junk = attn + np.triu(np.full((5, 5), np.nan))
    junk[0, 4] = -1.0
    a, b = heavy(budget=8, recent_window=1), heavy(budget=8, recent_window=1)
    a.prefill(attn)
    b.prefill(junk)
    assert a.state_dict() == b.state_dict()


def test_prefill_needs_a_fresh_policy(any_cls):
    """prefill after a decode step raises; after reset() it works; P = 1 keeps the policy fresh."""
    p = make(any_cls)
    p.prefill(np.zeros((1, 1)))
    p.prefill(np.zeros((2, 2)))
    unchanged(p, InvalidInputError, p.prefill, np.zeros((2, 2)))
    p.reset()
    p.on_decode_step(1, None)
    unchanged(p, InvalidInputError, p.prefill, np.zeros((2, 2)))
    p.reset()
    p.prefill(np.zeros((3, 3)))
    assert p.kept.tolist() == [0, 1, 2]


@pytest.mark.parametrize(("heads", "shape"), [
    (1, (0, 0)), (1, (3,)), (1, (2, 3)), (1, (2, 2, 2)), (1, (1, 2, 3)), (1, ()),
    (2, (3, 3)), (2, (1, 3, 3)), (2, (3, 3, 3)), (2, (2, 3, 2)),
])
def test_prefill_shape_errors(any_cls, heads, shape):
    """prefill wants (P, P) or (heads, P, P) with P >= 1; anything else raises InvalidInputError."""
    p = make(any_cls, heads=heads)
    unchanged(p, InvalidInputError, p.prefill, np.zeros(shape))


def test_prefill_one_head_accepts_leading_axis(any_cls):
    """For one head a (1, P, P) prompt is accepted like (P, P)."""
    a, b = make(any_cls), make(any_cls)
    attn = np.tril(np.full((4, 4), 0.3))
    a.prefill(attn)
    b.prefill(attn[None])
    assert a.state_dict() == b.state_dict()


def test_prefill_value_and_type_errors(heavy):
    """A bad weight in the lower triangle, or a non-real prompt, raises and changes nothing."""
    p = heavy(budget=4, recent_window=1)
    for bad in (math.nan, -0.5, math.inf):
        attn = np.tril(np.full((4, 4), 0.25))
        attn[3, 1] = bad
        unchanged(p, InvalidInputError, p.prefill, attn)
    unchanged(p, InvalidTypeError, p.prefill, np.ones((3, 3), dtype=bool))
    unchanged(p, InvalidTypeError, p.prefill, [["a", "b"], ["c", "d"]])
    assert p.kept.tolist() == [0]


@pytest.mark.parametrize("prompt", [
    np.ones((3, 3), dtype=bool), [["a", "b", "c"]] * 3, np.full((3, 3), 1j), np.full((3, 3), np.nan),
], ids=["bool", "str", "complex", "nan"])
def test_prefill_of_attention_free_policies_reads_only_the_shape(backend, prompt):
    """StreamingLLM and Full never read attention, so prefill takes only P from the prompt's shape."""
    for p in (backend.StreamingLLM(budget=4, sinks=1), backend.Full()):
        p.prefill(prompt)
        assert p.kept.tolist() == [0, 1, 2]


# ---------------------------------------------------------------- multi-head


def test_heads_are_independent_rows(heavy):
    """Each head votes/scores and evicts on its own row of attention."""
    p = heavy(budget=2, recent_window=1, heads=2)
    p.on_decode_step(1, [[1.0], [0.0]])
    victims = p.step(2, [[0.75, 0.25], [0.25, 0.75]])
    assert victims.tolist() == [[1], [0]]
    assert p.kept.tolist() == [[0, 2], [1, 2]]
    assert score(p, 0, 0) > 0 and score(p, 1, 1) > 0
    assert score(p, 1, 0) == -1 and score(p, 0, 1) == -1


# ---------------------------------------------------------------- pooled budgets (Ada-KV)


def test_a_pool_evicts_its_least_voted_positions_whichever_row_holds_them(backend):
    """Two rows sharing 2 x budget: the row whose positions earned no votes loses them,
    the other keeps more than budget; victims come back row by row, ascending."""
    p = backend.Scissorhands(budget=3, recent_window=1, heads=2, pool=2)
    # Row 0: positions 0..2 all voted each step; row 1: only position 0.
    for t in range(1, 4):
        row0 = np.full(t, 1.0 / t + 0.01 if t > 1 else 1.0)
        row1 = np.zeros(t)
        row1[0] = 1.0
        out = p.step_rows(t, np.stack([row0, row1]))
    # After t=3 each row holds {0,1,2,3} (8 > 6): two go, both from row 1 (votes 0: 1 and 2).
    assert out.counts.tolist() == [0, 2] and out.victims.tolist() == [1, 2]
    assert out.slots.tolist() == [1, 2]
    assert p.counts.tolist() == [4, 2]
    assert p.kept_row(0).tolist() == [0, 1, 2, 3] and p.kept_row(1).tolist() == [0, 3]


def test_pool_ties_go_to_the_lower_position_then_the_lower_row(backend):
    """Equal keys everywhere: the lowest positions go first, and at one position row 0's
    copy before row 1's."""
    p = backend.H2O(budget=2, recent_window=0, heads=2, pool=2)
    p.extend(np.zeros((2, 4, 4)))  # positions 0..3 in both rows, every score 0
    out = p.evict_rows()
    assert out.counts.tolist() == [2, 2] and out.victims.tolist() == [0, 1, 0, 1]
    p = backend.H2O(budget=2, recent_window=0, heads=2, pool=2)
    p.extend(np.zeros((2, 3, 3)))  # 6 held, 4 allowed: position 0 of both rows goes
    assert p.evict_rows().victims.tolist() == [0, 0]
    out = p.evict_rows(budget=1)  # then position 1 of row 0, then of row 1
    assert out.counts.tolist() == [1, 1] and out.victims.tolist() == [1, 1]


@pytest.mark.parametrize("call", ["step", "evict"])
def test_a_pooled_policy_evicts_only_row_by_row(backend, call):
    """step and evict return one (heads, k) array, which pooled rows cannot fill: refused
    before anything changes, naming the row-by-row call."""
    p = backend.Scissorhands(budget=2, recent_window=1, heads=2, pool=2)
    before = p.state_dict()
    args = (1, np.zeros((2, 1))) if call == "step" else ()
    with pytest.raises(InvalidInputError, match=f"with pool=2 .* use {call}_rows"):
        getattr(p, call)(*args)
    assert p.state_dict() == before
    p.on_decode_step(1, np.zeros((2, 1)))  # admitting without evicting is fine


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(heads=3, pool=2), "pool must divide heads"),
    (dict(heads=2, pool="layer"), "needs a model's layers and KV heads"),
    (dict(heads=2, pool=0), "pool"),
    (dict(heads=2, pool="rows"), "pool must be a number of rows or one of head, layer, model"),
])
def test_bad_pools_are_refused(backend, kwargs, match):
    with pytest.raises((InvalidInputError, InvalidTypeError), match=match):
        backend.Scissorhands(budget=4, recent_window=1, **kwargs)


def test_pooled_state_round_trips_and_select_rows_keeps_whole_pools(backend):
    """The pool is a parameter of the state (shown when set); select_rows takes whole
    pools only."""
    p = backend.H2O(budget=2, recent_window=1, heads=4, pool=2)
    p.extend(np.random.default_rng(0).random((4, 5, 5)))
    p.evict_rows()
    state = p.state_dict()
    assert state["params"]["pool"] == 2
    q = type(p).from_state_dict(state)
    assert q.state_dict() == state
    with pytest.raises(InvalidInputError, match="multiple of pool=2"):
        p.select_rows([0, 1, 2])
    assert p.state_dict() == state
    for split in ([1, 2], [1, 0], [0, 0], [2, 3, 3, 2], [0, 1, 0, 2]):  # a pool cut, reordered or mixed
        with pytest.raises(InvalidInputError, match=r"each pool of 2 rows whole and in order"):
            p.select_rows(split)
        assert p.state_dict() == state
    p.select_rows([2, 3, 0, 1, 2, 3])
    assert p.heads == 6
    p = type(p).from_state_dict(state)
    p.select_rows([2, 3])
    assert p.heads == 2
