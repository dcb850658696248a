"""The options of the attention-driven policies, pinned on both backends: ``sinks`` (the
first positions held are never evicted, Scissorhands, H2O and TOVA) and ``history_window``
(Scissorhands' votes count only the last w decode steps that carried attention).

Both are off by default, and off they must change nothing; every error with them on
leaves ``state_dict()`` (vote registers included) and ``memory_bytes()`` as they were.
"""

from __future__ import annotations

import copy
import json
import math
import pickle
from fractions import Fraction

import numpy as np
import pytest
from conftest import unchanged

from scissorhands.errors import InvalidInputError, InvalidTypeError


def stream(p, steps, seed, heads=1, budget=None, none_every=0):
    """Feed ``steps`` decode steps of random grid weights (every ``none_every``-th without
    attention), evicting to ``budget`` after each when given; returns the victims."""
    rng = np.random.default_rng(seed)
    pos = p.state_dict()["last_position"]
    out = []
    for t in range(steps):
        pos += 1
        n = p.kept_count()
        w = None if none_every and t % none_every == 0 else rng.integers(0, 9, (heads, n)) / 8
        if budget is None:
            p.on_decode_step(pos, w)
        else:
            got = p.step(pos, w, budget)
            out.append(got.tolist() if isinstance(got, np.ndarray) else got)
    return out


def popcount_consistent(state):
    """Every vote equals its register's number of bits."""
    return all(v == bin(r).count("1") for vs, rs in zip(state["votes"], state["history"])
               for v, r in zip(vs, rs))


# ---------------------------------------------------------------- defaults


def test_defaults_are_off(backend):
    """Defaults: sinks 0, no history window, state and repr and 9/13 bytes a slot as before."""
    s, h = backend.Scissorhands(), backend.H2O()
    assert (s.sinks, s.history_window, h.sinks) == (0, None, 0)
    assert s.sink_count() == h.sink_count() == 0
    assert s.state_dict()["params"] == h.state_dict()["params"] == {
        "budget": 512, "recent_window": 32, "heads": 1}
    assert "history" not in s.state_dict()
    assert (s.memory_bytes(), h.memory_bytes()) == (64 + 513 * 9, 64 + 513 * 13)
    assert repr(s) == "Scissorhands(budget=512, recent_window=32, heads=1, held=1)"
    t = backend.TOVA()
    assert t.sinks == t.sink_count() == 0 and t.memory_bytes() == 64 + 513 * 13
    assert t.state_dict()["params"] == {"budget": 512, "recent_window": 1, "heads": 1}
    assert repr(t) == "TOVA(budget=512, recent_window=1, heads=1, held=1)"


def test_explicit_off_equals_default(heavy):
    """sinks=0 (and history_window=None) behave exactly like the defaults, step by step."""
    extra = {"history_window": None} if heavy.__name__ == "Scissorhands" else {}
    a = heavy(budget=6, recent_window=2, heads=2)
    b = heavy(budget=6, recent_window=2, heads=2, sinks=0, **extra)
    assert stream(a, 60, 1, heads=2, budget=6, none_every=7) == \
        stream(b, 60, 1, heads=2, budget=6, none_every=7)
    assert a.state_dict() == b.state_dict() and a.memory_bytes() == b.memory_bytes()


def test_h2o_has_no_history_window(backend):
    """history_window is a Scissorhands option only: H2O does not take it."""
    with pytest.raises(TypeError):
        backend.H2O(budget=8, history_window=4)


# ---------------------------------------------------------------- sinks


@pytest.mark.parametrize("sinks", [1, 3])
def test_sinks_are_never_evicted(heavy, sinks):
    """The first ``sinks`` positions held survive every eviction, whatever their score."""
    p = heavy(budget=6, recent_window=1, sinks=sinks, heads=2)
    for victims in stream(p, 80, sinks, heads=2, budget=6):
        assert not any(v < sinks for row in victims for v in row)
    assert all(row[:sinks] == list(range(sinks)) for row in p.kept.tolist())
    assert p.sink_count() == sinks


def test_sinks_protect_the_lowest_scored(heavy):
    """Sinks with the lowest scores stay; the lowest-scored after them go instead."""
    window = 1 if heavy.name == "tova" else 0  # TOVA keeps its newest position
    victims = {}
    for sinks in (0, 2):
        p = heavy(budget=4, recent_window=window, sinks=sinks)
        for t, w in enumerate([[0.0], [0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.5, 0.5]], start=1):
            p.on_decode_step(t, w)
        victims[sinks] = p.evict(3 + window)
    # TOVA scores [0, 0, 0.5, 0.5] (the latest weights), 4 protected.
    assert victims == ({0: [0], 2: [2]} if window else {0: [0, 1], 2: [3, 4]})


def test_sink_count_is_min_of_sinks_and_held(heavy):
    """sink_count() = min(sinks, kept_count()), also after reset and a state round trip."""
    p = heavy(budget=8, recent_window=1, sinks=3)
    counts = []
    for t in range(1, 5):
        counts.append(p.sink_count())
        p.on_decode_step(t, None)
    assert counts == [1, 2, 3, 3]
    assert type(p).from_state_dict(p.state_dict()).sink_count() == 3
    p.reset()
    assert p.sink_count() == 1


@pytest.mark.parametrize(("kwargs", "exc"), [
    ({"sinks": -1}, InvalidInputError),
    ({"sinks": 4}, InvalidInputError),        # recent_window 1 + 4 > budget 4
    ({"sinks": 3}, InvalidInputError),        # recent_window 1 + 3 == budget 4
    ({"sinks": 1.0}, InvalidTypeError),
    ({"sinks": True}, InvalidTypeError),
    ({"sinks": None}, InvalidTypeError),
    ({"sinks": "1"}, InvalidTypeError),
])
def test_sinks_validation(heavy, kwargs, exc):
    """sinks is an integer >= 0 with recent_window + sinks < budget."""
    with pytest.raises(exc):
        heavy(budget=4, recent_window=1, **kwargs)


def test_sinks_accept_numpy_integers(heavy):
    """NumPy integers work as sinks and come back as plain ints in the state."""
    p = heavy(budget=np.int64(6), recent_window=np.uint8(1), sinks=np.int32(2))
    assert p.state_dict()["params"]["sinks"] == 2
    assert type(p.state_dict()["params"]["sinks"]) is int and type(p.sinks) is int


def test_per_call_budget_must_exceed_window_plus_sinks(heavy):
    """evict(budget) and step(..., budget) with budget <= recent_window + sinks raise, changing nothing."""
    p = heavy(budget=6, recent_window=2, sinks=2)
    stream(p, 4, 3)
    for budget in (0, 1, 2, 3, 4):
        unchanged(p, InvalidInputError, p.evict, budget)
        unchanged(p, InvalidInputError, p.step, 5, None, budget)
    unchanged(p, InvalidTypeError, p.evict, 5.0)
    assert p.evict(5) == [] and p.kept_count() == 5
    p.on_decode_step(5, None)
    assert len(p.evict(5)) == 1


def test_sinks_recorded_and_loaded(heavy):
    """sinks appears in state params when set; a state without it loads with sinks 0."""
    p = heavy(budget=5, recent_window=1, sinks=2)
    stream(p, 12, 4, budget=5)
    state = p.state_dict()
    assert state["params"]["sinks"] == 2
    q = type(p).from_state_dict(json.loads(json.dumps(state)))
    assert q.state_dict() == state and q.sinks == 2
    del state["params"]["sinks"]
    r = type(p).from_state_dict(state)
    assert r.sinks == 0 and "sinks" not in r.state_dict()["params"]


# ---------------------------------------------------------------- history window


class VoteBits:
    """An independent model of history-window votes: each position's list of vote bits,
    one per step that carried attention since it was admitted."""

    def __init__(self):
        self.bits = {0: []}

    def step(self, kept, pos, attn):
        if attn is not None:
            share = 1.0 / len(kept)
            for q, w in zip(kept, attn):
                self.bits[q].append(int(float(w) > share))
        self.bits[pos] = []

    def votes(self, kept, w):
        return [sum(self.bits[q][-w:]) if w else sum(self.bits[q]) for q in kept]


@pytest.mark.parametrize("window", [1, 2, 5, 64])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_history_votes_count_the_last_w_steps(backend, window, dtype):
    """Votes equal the vote bits of the last w attention-carrying steps; None steps do not count."""
    p = backend.Scissorhands(budget=200, recent_window=0, history_window=window)
    model = VoteBits()
    rng = np.random.default_rng(window)
    for t in range(1, 90):
        kept = p.kept.tolist()
        attn = None if t % 5 == 0 else (rng.integers(0, 9, len(kept)) / 8).astype(dtype)
        p.on_decode_step(t, attn)
        model.step(kept, t, attn)
        assert p.votes.tolist() == model.votes(p.kept.tolist(), window), f"step {t}"


def test_history_64_equals_no_window_for_short_runs(backend):
    """With fewer than 64 attention steps, history_window=64 counts exactly what no window counts."""
    a = backend.Scissorhands(budget=5, recent_window=1, history_window=64, heads=2)
    b = backend.Scissorhands(budget=5, recent_window=1, heads=2)
    assert stream(a, 63, 9, heads=2, budget=5) == stream(b, 63, 9, heads=2, budget=5)
    assert a.votes.tolist() == b.votes.tolist()


def test_history_forgets_an_early_burst(backend):
    """A position that was voted only early loses its votes after w steps and becomes the victim."""
    p = backend.Scissorhands(budget=3, recent_window=1, history_window=3)
    q = backend.Scissorhands(budget=3, recent_window=1)
    for pol in (p, q):
        pol.on_decode_step(1, [1.0])
        pol.on_decode_step(2, [0.0, 1.0])
        pol.on_decode_step(3, [0.0, 1.0, 0.0])  # position 1: two votes, then none
        for t in range(4, 7):
            n = pol.kept_count()
            pol.on_decode_step(t, [0.5] + [0.0] * (n - 3) + [0.5, 0.0])
    assert p.votes_of(1) == 0 and q.votes_of(1) == 2
    assert 1 in p.evict(3) and 1 not in q.evict(3)


def test_history_registers_follow_eviction_and_growth(backend):
    """Across batched evictions and capacity growth the votes stay the registers' popcounts."""
    p = backend.Scissorhands(budget=4, recent_window=1, sinks=1, history_window=3, heads=2)
    rng = np.random.default_rng(5)
    pos = 0
    for _ in range(40):
        for _ in range(int(rng.integers(1, 6))):
            pos += 1
            p.on_decode_step(pos, rng.integers(0, 9, (2, p.kept_count())) / 8)
        p.evict()
        state = p.state_dict()
        assert popcount_consistent(state)
        assert all(0 <= r < 8 for row in state["history"] for r in row)


def test_history_none_step_changes_no_register(backend):
    """attn=None shifts no register: the state gains the new position with an empty register only."""
    p = backend.Scissorhands(budget=8, recent_window=1, history_window=2)
    stream(p, 4, 2)
    before = p.state_dict()
    p.on_decode_step(5, None)
    after = p.state_dict()
    assert after["history"] == [before["history"][0] + [0]]
    assert after["votes"] == [before["votes"][0] + [0]]


def test_history_reset_forgets_registers(backend):
    """reset() empties every register and keeps the capacity."""
    p = backend.Scissorhands(budget=3, recent_window=1, history_window=4)
    stream(p, 9, 6)
    mem = p.memory_bytes()
    p.reset()
    assert p.state_dict() == backend.Scissorhands(budget=3, recent_window=1, history_window=4).state_dict()
    assert p.state_dict()["history"] == [[0]] and p.memory_bytes() == mem


@pytest.mark.parametrize(("window", "exc"), [
    (0, InvalidInputError), (65, InvalidInputError), (-1, InvalidInputError),
    (2**40, InvalidInputError), (2.0, InvalidTypeError), (True, InvalidTypeError),
    ("4", InvalidTypeError), (np.float64(4), InvalidTypeError),
])
def test_history_window_validation(backend, window, exc):
    """history_window is None or an integer in [1, 64]."""
    with pytest.raises(exc):
        backend.Scissorhands(budget=8, recent_window=1, history_window=window)


def test_history_window_bounds_accepted(backend):
    """history_window 1, 64 and NumPy integers are accepted; params come back as plain ints."""
    for w in (1, 64, np.uint8(7)):
        p = backend.Scissorhands(budget=8, recent_window=1, history_window=w)
        assert p.history_window == int(w)
        assert type(p.state_dict()["params"]["history_window"]) is int


@pytest.mark.parametrize("heads", [1, 3])
def test_history_memory_is_17_bytes_a_slot(backend, heads):
    """memory_bytes = 64 (+ 4 per row's count with several heads) + capacity * heads * 17
    with a history window, growing as without one."""
    p = backend.Scissorhands(budget=10, recent_window=1, history_window=8, heads=heads)
    q = backend.Scissorhands(budget=10, recent_window=1, heads=heads)
    fixed = 64 + (4 * heads if heads > 1 else 0)
    assert p.memory_bytes() == fixed + 11 * heads * 17
    for pol in (p, q):
        stream(pol, 30, 1, heads=heads)
    assert p.memory_bytes() - fixed == 44 * heads * 17 and q.memory_bytes() - fixed == 44 * heads * 9


def test_history_state_round_trip(backend):
    """A state with registers round-trips (JSON, pickle, deepcopy) and continues identically."""
    a = backend.Scissorhands(budget=5, recent_window=1, sinks=1, history_window=5, heads=2)
    stream(a, 25, 8, heads=2, budget=5)
    state = a.state_dict()
    assert state["params"] == {"budget": 5, "recent_window": 1, "heads": 2, "sinks": 1,
                               "history_window": 5}
    assert popcount_consistent(state) and json.loads(json.dumps(state)) == state
    copies = [backend.Scissorhands.from_state_dict(json.loads(json.dumps(state))),
              pickle.loads(pickle.dumps(a)), copy.deepcopy(a)]
    for b in copies:
        assert b.state_dict() == state and b.memory_bytes() == a.memory_bytes()
    want = stream(a, 20, 10, heads=2, budget=5)
    for b in copies:
        assert stream(b, 20, 10, heads=2, budget=5) == want
        assert b.state_dict() == a.state_dict()


def test_history_state_loads_across_backends(native, ref):
    """Each backend loads the other's history state and both continue identically."""
    for src, dst in ((native, ref), (ref, native)):
        a = src.Scissorhands(budget=4, recent_window=1, history_window=3, heads=2)
        stream(a, 20, 12, heads=2, budget=4)
        b = dst.Scissorhands.from_state_dict(a.state_dict())
        assert b.state_dict() == a.state_dict() and b.memory_bytes() == a.memory_bytes()
        assert stream(a, 10, 13, heads=2, budget=4) == stream(b, 10, 13, heads=2, budget=4)
        assert a.state_dict() == b.state_dict()


def test_older_states_load_with_defaults(backend):
    """A state written before the options existed (no sinks, no history_window) loads as before."""
    old = {"format": "scissorhands.policy", "version": 1, "policy": "scissorhands",
           "params": {"budget": 4, "recent_window": 1, "heads": 1},
           "kept": [[0, 3]], "votes": [[2, 0]], "last_position": 3}
    p = backend.Scissorhands.from_state_dict(old)
    assert (p.sinks, p.history_window) == (0, None) and p.state_dict() == old
    explicit = dict(old, params=dict(old["params"], sinks=0, history_window=None))
    assert backend.Scissorhands.from_state_dict(explicit).state_dict() == old


@pytest.mark.parametrize(("change", "exc"), [
    ({"history": None}, InvalidTypeError),
    ({"history": [[3, 0]]}, InvalidInputError),      # 2 bits, but votes say 1
    ({"history": [[8, 0]]}, InvalidInputError),      # bit 3 with a window of 3
    ({"history": [[1, 0], [1, 0]]}, InvalidInputError),
    ({"history": [[1.0, 0]]}, InvalidTypeError),
    ({"params": {"budget": 4, "recent_window": 1, "heads": 1}}, InvalidInputError),  # no window
    ({"params": {"budget": 4, "recent_window": 1, "heads": 1, "history_window": 0}}, InvalidInputError),
    ({"params": {"budget": 4, "recent_window": 1, "heads": 1, "history_window": 3,
                 "sinks": 3}}, InvalidInputError),
    ({"params": {"budget": 4, "recent_window": 1, "heads": 1, "history_window": 3,
                 "extra": 1}}, InvalidInputError),
])
def test_history_state_errors(backend, change, exc):
    """A history state with a bad register, shape or option is refused with the right class."""
    good = {"format": "scissorhands.policy", "version": 1, "policy": "scissorhands",
            "params": {"budget": 4, "recent_window": 1, "heads": 1, "history_window": 3},
            "kept": [[0, 3]], "votes": [[1, 0]], "history": [[4, 0]], "last_position": 3}
    assert backend.Scissorhands.from_state_dict(good).state_dict() == good
    with pytest.raises(exc):
        backend.Scissorhands.from_state_dict({**good, **change})


# ---------------------------------------------------------------- errors and the rest


def test_errors_leave_state_unchanged_with_options(backend):
    """Bad positions, attention, budgets and prefill leave votes, registers and memory untouched."""
    p = backend.Scissorhands(budget=5, recent_window=1, sinks=2, history_window=3, heads=2)
    stream(p, 6, 14, heads=2)
    n = p.kept_count()
    unchanged(p, InvalidInputError, p.on_decode_step, 6, np.full((2, n), 0.1))
    unchanged(p, InvalidTypeError, p.on_decode_step, 7.0, np.full((2, n), 0.1))
    unchanged(p, InvalidInputError, p.on_decode_step, 7, np.full((2, n + 1), 0.1))
    bad = np.full((2, n), 0.1)
    bad[1, -1] = math.nan
    unchanged(p, InvalidInputError, p.on_decode_step, 7, bad)
    unchanged(p, InvalidInputError, p.step, 7, np.full((2, n), -0.1), 5)
    unchanged(p, InvalidInputError, p.step, 7, np.full((2, n), 0.1), 3)
    unchanged(p, InvalidTypeError, p.on_decode_step, 7, [["x"] * n] * 2)
    unchanged(p, InvalidInputError, p.prefill, np.zeros((2, 3, 3)))
    unchanged(p, InvalidInputError, p.votes_of, 0, 2)


def test_prefill_with_options_equals_decode_steps(backend):
    """prefill with sinks and a history window equals the decode steps it replaces."""
    rng = np.random.default_rng(2)
    attn = np.tril(rng.integers(0, 9, (2, 12, 12)) / 8, -1).astype(np.float32)
    a = backend.Scissorhands(budget=6, recent_window=1, sinks=2, history_window=4, heads=2)
    b = backend.Scissorhands(budget=6, recent_window=1, sinks=2, history_window=4, heads=2)
    a.prefill(attn)
    for i in range(1, 12):
        b.on_decode_step(i, attn[:, i, :i])
    assert a.state_dict() == b.state_dict() and a.memory_bytes() == b.memory_bytes()
    assert a.evict().tolist() == b.evict().tolist()


def test_repr_shows_options_when_set(backend):
    """repr adds sinks and history_window after the fixed parameters, only when set."""
    p = backend.Scissorhands(budget=8, recent_window=2, sinks=1, history_window=4)
    assert repr(p) == "Scissorhands(budget=8, recent_window=2, heads=1, sinks=1, history_window=4, held=1)"
    assert repr(backend.H2O(budget=8, recent_window=2, sinks=3)) == \
        "H2O(budget=8, recent_window=2, heads=1, sinks=3, held=1)"


# ---------------------------------------------------------------- the C core directly


def test_c_core_options(native):
    """The C core: 17 bytes a slot with a window; a bad window or kind refused; imports all or nothing."""
    from scissorhands._native import ffi, lib

    def new(kind, window, sinks=0):
        cfg = ffi.new("sh_config *", {"kind": kind, "heads": 1, "budget": 4,
                                      "recent_window": 1, "sinks": sinks,
                                      "history_window": window})
        out = ffi.new("sh_policy **")
        rc = lib.sh_policy_new(cfg, out)
        return rc, (ffi.gc(out[0], lib.sh_policy_free) if rc == lib.SH_OK else None)

    assert new(lib.SH_SCISSORHANDS, 65)[0] == lib.SH_ERR_ARG
    assert new(lib.SH_H2O, 2)[0] == lib.SH_ERR_ARG
    assert new(lib.SH_STREAMING_LLM, 2)[0] == lib.SH_ERR_ARG
    assert new(lib.SH_SCISSORHANDS, 2, sinks=3)[0] == lib.SH_ERR_BUDGET
    rc, p = new(lib.SH_SCISSORHANDS, 2)
    assert rc == lib.SH_OK and lib.sh_policy_slot_bytes(p) == 17
    assert lib.sh_policy_memory_bytes(p) == 64 + 5 * 17
    rc, plain = new(lib.SH_SCISSORHANDS, 0)
    assert lib.sh_policy_slot_bytes(plain) == 9
    assert lib.sh_policy_export_history(plain, ffi.new("uint64_t[4]"), 4) == lib.SH_ERR_STATE

    kept = ffi.new("uint32_t[]", [0, 2])
    # The registers are required (C checks presence; the values are the Python layer's).
    rc = lib.sh_policy_import_state(p, 1, 2, kept, ffi.new("uint32_t[]", [1, 0]), ffi.NULL, ffi.NULL,
                                    ffi.NULL, 2)
    assert rc == lib.SH_ERR_ARG
    assert lib.sh_policy_count(p) == 1 and lib.sh_policy_last_position(p) == 0
    assert lib.sh_policy_import_state(p, 1, 2, kept, ffi.new("uint32_t[]", [2, 1]), ffi.NULL,
                                      ffi.new("uint64_t[]", [3, 2]), ffi.NULL, 2) == lib.SH_OK
    out = ffi.new("uint64_t[2]")
    assert lib.sh_policy_export_history(p, out, 1) == lib.SH_ERR_BUFFER
    assert lib.sh_policy_export_history(p, out, 2) == lib.SH_OK and list(out) == [3, 2]


# ---------------------------------------------------------------- recent_window as a fraction


@pytest.mark.parametrize("cls", ["Scissorhands", "H2O"])
@pytest.mark.parametrize(("fraction", "budget", "want"), [
    (0.5, 409, 204), (0.5, 256, 128), (0.0, 7, 0), (0.25, 3, 0),
    (np.float32(0.5), 9, 4), (np.float64(0.75), 8, 6), (Fraction(1, 3), 10, 3),
    # A float counts as the decimal it prints as: 0.7 and 0.999 are a little below
    # 7/10 and 999/1000 in binary, which would round 10 x 0.7 down to 6.
    (0.1, 10, 1), (0.7, 10, 7), (0.999, 1000, 999), (0.29, 100, 29), (np.float32(0.3), 10, 3),
    (Fraction(7, 10) - Fraction(1, 10**9), 10, 6)])
def test_recent_window_fraction_of_the_budget(backend, cls, fraction, budget, want):
    """A float recent_window is that fraction of the budget (the decimal it prints as),
    rounded down; the object then is the one built with the resolved count."""
    p = getattr(backend, cls)(budget=budget, recent_window=fraction)
    assert p.recent_window == want and type(p.recent_window) is int
    q = getattr(backend, cls)(budget=budget, recent_window=want)
    assert p.state_dict() == q.state_dict() and repr(p) == repr(q)
    assert stream(p, 30, 1, budget=budget) == stream(q, 30, 1, budget=budget)


@pytest.mark.parametrize("fraction", [1.0, 1.5, -0.25, -1e-300, math.nan, math.inf, -math.inf,
                                      Fraction(1), np.float64(2.0), 32.0])
def test_recent_window_fraction_out_of_range(backend, fraction):
    """A fraction outside [0, 1) is refused as out of range, with the value in the message."""
    for cls in (backend.Scissorhands, backend.H2O, backend.TOVA):
        with pytest.raises(InvalidInputError, match="fraction of the budget"):
            cls(budget=8, recent_window=fraction)


def test_recent_window_fraction_must_leave_room_for_sinks(backend):
    """The resolved window still obeys recent_window + sinks < budget."""
    assert backend.Scissorhands(budget=8, recent_window=0.5, sinks=3).recent_window == 4
    with pytest.raises(InvalidInputError):
        backend.Scissorhands(budget=8, recent_window=0.5, sinks=4)


# ---------------------------------------------------------------- vote_rate


def rate_order(p, head=0):
    """The evictable slots of row ``head`` ordered as a vote-rate eviction takes them,
    computed here from the exported votes and steps held."""
    votes = np.atleast_2d(p.votes)[head].tolist()
    held = np.atleast_2d(p.steps_held)[head].tolist()
    cap = p.history_window or 2**32
    n = len(votes)
    slots = range(min(p.sinks, n), n - p.recent_window)
    return sorted(slots, key=lambda s: (votes[s] / max(1, min(held[s], cap)), s))


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vote_rate_evicts_the_lowest_votes_per_step_held(backend, window, dtype):
    """Every eviction takes the slots of lowest votes / steps held (ties: lower position),
    on a long random stream with growth, evictions and steps without attention."""
    p = backend.Scissorhands(budget=7, recent_window=2, sinks=1, heads=2, history_window=window,
                             vote_rate=True)
    rng = np.random.default_rng(5)
    for t in range(1, 200):
        n = p.kept_count()
        w = None if t % 9 == 0 else (rng.integers(0, 9, (2, n)) / 8).astype(dtype)
        p.on_decode_step(t, w)
        if p.kept_count() > 7:
            k = p.kept_count() - 7
            kept = p.kept.tolist()
            want = [sorted(kept[h][s] for s in rate_order(p, h)[:k]) for h in range(2)]
            assert p.evict().tolist() == want


def test_vote_rate_counts_steps_held(backend):
    """steps_held: +1 per step carrying attention for every slot held before it; none for
    a step with attn=None, zero for a new position, kept through evictions."""
    p = backend.Scissorhands(budget=3, recent_window=1, vote_rate=True)
    p.on_decode_step(1, [1.0])
    p.on_decode_step(2, None)
    p.on_decode_step(3, [0.2, 0.3, 0.5])
    assert p.steps_held.tolist() == [2, 1, 1, 0]
    assert p.evict() == [0]
    assert p.steps_held.tolist() == [1, 1, 0] and p.votes.tolist() == [0, 1, 0]


def test_vote_rate_off_keeps_no_steps(backend):
    """Without vote_rate there is no step count to read, and nothing changes: 9 bytes a slot."""
    p = backend.Scissorhands(budget=4, recent_window=1, vote_rate=False)
    assert p.vote_rate is False and "vote_rate" not in p.state_dict()["params"]
    with pytest.raises(InvalidInputError, match="vote_rate"):
        _ = p.steps_held
    assert p.memory_bytes() == 64 + 5 * 9
    q = backend.Scissorhands(budget=4, recent_window=1)
    assert stream(p, 40, 3, budget=4) == stream(q, 40, 3, budget=4)
    assert p.state_dict() == q.state_dict()


@pytest.mark.parametrize(("window", "per_slot"), [(None, 13), (5, 21)])
def test_vote_rate_memory(backend, window, per_slot):
    """A vote rate adds a uint32 step count to each slot: 13 bytes, 21 with a history window."""
    p = backend.Scissorhands(budget=4, recent_window=1, heads=3, history_window=window, vote_rate=True)
    assert p.memory_bytes() == 64 + 4 * 3 + 5 * 3 * per_slot


@pytest.mark.parametrize("value", [1, 0, None, "on", 1.0, np.int64(1)])
def test_vote_rate_must_be_a_bool(backend, value):
    """vote_rate is a bool (NumPy's included); anything else is the wrong kind."""
    with pytest.raises(InvalidTypeError, match="vote_rate"):
        backend.Scissorhands(budget=4, recent_window=1, vote_rate=value)
    assert backend.Scissorhands(budget=4, recent_window=1, vote_rate=np.bool_(True)).vote_rate is True


def test_vote_rate_state_round_trips_across_backends(native, ref):
    """A state with steps held loads in either backend, and both continue identically."""
    a = native.Scissorhands(budget=5, recent_window=1, heads=2, history_window=4, vote_rate=True)
    stream(a, 30, 8, heads=2, budget=5, none_every=6)
    state = json.loads(json.dumps(a.state_dict()))
    assert "steps_held" in state and state["params"]["vote_rate"] is True
    b = ref.Scissorhands.from_state_dict(state)
    c = pickle.loads(pickle.dumps(a))
    assert b.state_dict() == c.state_dict() == a.state_dict()
    runs = [stream(x, 30, 9, heads=2, budget=5, none_every=4) for x in (a, b, c)]
    assert runs[0] == runs[1] == runs[2]
    assert a.state_dict() == b.state_dict() == c.state_dict()


@pytest.mark.parametrize(("change", "exc"), [
    (lambda s: s.pop("steps_held"), InvalidInputError),
    (lambda s: s["params"].pop("vote_rate"), InvalidInputError),
    (lambda s: s["steps_held"][0].__setitem__(0, 0), InvalidInputError),  # fewer steps than votes
    (lambda s: s["steps_held"][0].__setitem__(0, -1), InvalidInputError),
    (lambda s: s["steps_held"][0].__setitem__(0, 2.0), InvalidTypeError),
    (lambda s: s["steps_held"][0].pop(), InvalidInputError),
    (lambda s: s["params"].__setitem__("vote_rate", 1), InvalidTypeError),
])
def test_vote_rate_state_errors(backend, change, exc):
    """Loading refuses steps held that are missing, unexpected, malformed or below the votes."""
    p = backend.Scissorhands(budget=4, recent_window=1, vote_rate=True)
    for t, w in enumerate([[1.0], [0.9, 0.1], [0.8, 0.1, 0.1]], start=1):
        p.on_decode_step(t, w)
    state = copy.deepcopy(p.state_dict())
    assert state["votes"][0][0] == 2
    change(state)
    with pytest.raises(exc):
        backend.Scissorhands.from_state_dict(state)


def test_vote_rate_register_bits_within_steps_held(backend):
    """With a history window, a register bit older than the slot's steps held is refused."""
    state = {"format": "scissorhands.policy", "version": 1, "policy": "scissorhands",
             "params": {"budget": 4, "recent_window": 1, "heads": 1, "history_window": 4,
                        "vote_rate": True},
             "kept": [[0, 1]], "votes": [[1, 0]], "history": [[4, 0]], "steps_held": [[2, 0]],
             "last_position": 1}
    with pytest.raises(InvalidInputError):
        backend.Scissorhands.from_state_dict(state)
    state["steps_held"] = [[3, 0]]
    assert backend.Scissorhands.from_state_dict(state).steps_held.tolist() == [3, 0]


def test_vote_rate_errors_leave_state_unchanged(backend):
    """Failed calls leave votes, registers and steps held as they were."""
    p = backend.Scissorhands(budget=5, recent_window=1, history_window=3, heads=2, vote_rate=True)
    stream(p, 6, 14, heads=2)
    n = p.kept_count()
    bad = np.full((2, n), 0.1)
    bad[1, -1] = math.nan
    unchanged(p, InvalidInputError, p.on_decode_step, 7, bad)
    unchanged(p, InvalidInputError, p.step, 7, np.full((2, n + 1), 0.1), 5)
    unchanged(p, InvalidInputError, p.step, 7, np.full((2, n), 0.1), 1)
    unchanged(p, InvalidInputError, p.prefill, np.zeros((2, 3, 3)))


def test_vote_rate_prefill_equals_decode_steps(backend):
    """prefill counts its steps held as the decode steps it replaces."""
    rng = np.random.default_rng(4)
    attn = np.tril(rng.integers(0, 9, (2, 10, 10)) / 8, -1)
    a = backend.Scissorhands(budget=6, recent_window=1, heads=2, vote_rate=True)
    b = backend.Scissorhands(budget=6, recent_window=1, heads=2, vote_rate=True)
    a.prefill(attn)
    for i in range(1, 10):
        b.on_decode_step(i, attn[:, i, :i])
    assert a.state_dict() == b.state_dict()
    assert a.evict().tolist() == b.evict().tolist()


def test_c_core_vote_rate(native):
    """The C core: vote_rate is 0 or 1 and Scissorhands only; imports need the steps held
    exactly when it is on, and refuse ones below the votes, all or nothing."""
    from scissorhands._native import ffi, lib

    def new(kind, rate, window=0):
        cfg = ffi.new("sh_config *", {"kind": kind, "heads": 1, "budget": 4, "recent_window": 1,
                                      "history_window": window, "vote_rate": rate})
        out = ffi.new("sh_policy **")
        rc = lib.sh_policy_new(cfg, out)
        return rc, (ffi.gc(out[0], lib.sh_policy_free) if rc == lib.SH_OK else None)

    assert new(lib.SH_SCISSORHANDS, 2)[0] == lib.SH_ERR_ARG
    assert new(lib.SH_H2O, 1)[0] == lib.SH_ERR_ARG
    assert new(lib.SH_STREAMING_LLM, 1)[0] == lib.SH_ERR_ARG
    rc, p = new(lib.SH_SCISSORHANDS, 1)
    assert rc == lib.SH_OK and lib.sh_policy_slot_bytes(p) == 13
    assert new(lib.SH_SCISSORHANDS, 1, 8)[1] is not None
    assert lib.sh_policy_slot_bytes(new(lib.SH_SCISSORHANDS, 1, 8)[1]) == 21
    plain = new(lib.SH_SCISSORHANDS, 0)[1]
    assert lib.sh_policy_export_held(plain, ffi.new("uint32_t[4]"), 4) == lib.SH_ERR_STATE

    kept, votes = ffi.new("uint32_t[]", [0, 2]), ffi.new("uint32_t[]", [2, 0])
    # The steps held are required exactly with a vote rate (C checks presence; the
    # values are the Python layer's).
    assert lib.sh_policy_import_state(p, 1, 2, kept, votes, ffi.NULL, ffi.NULL, ffi.NULL, 2) == lib.SH_ERR_ARG
    assert lib.sh_policy_import_state(plain, 1, 2, kept, votes, ffi.NULL, ffi.NULL,
                                      ffi.new("uint32_t[]", [2, 0]), 2) == lib.SH_ERR_ARG
    assert lib.sh_policy_count(p) == 1 and lib.sh_policy_last_position(p) == 0
    assert lib.sh_policy_import_state(p, 1, 2, kept, votes, ffi.NULL, ffi.NULL,
                                      ffi.new("uint32_t[]", [2, 0]), 2) == lib.SH_OK
    out = ffi.new("uint32_t[2]")
    assert lib.sh_policy_export_held(p, out, 1) == lib.SH_ERR_BUFFER
    assert lib.sh_policy_export_held(p, out, 2) == lib.SH_OK and list(out) == [2, 0]


def test_c_core_tova(native):
    """The C core: TOVA refuses a recent window of 0 (and a history window or vote rate),
    keeps 13 bytes a slot, assigns each step's weights and exports them as scores."""
    from scissorhands._native import ffi, lib
    from scissorhands.options import SPECS

    def new(window, **kw):
        cfg = ffi.new("sh_config *", {"kind": lib.SH_TOVA, "heads": 1, "budget": 4,
                                      "recent_window": window, **kw})
        out = ffi.new("sh_policy **")
        rc = lib.sh_policy_new(cfg, out)
        return rc, (ffi.gc(out[0], lib.sh_policy_free) if rc == lib.SH_OK else None)

    assert new(0)[0] == lib.SH_ERR_ARG
    assert new(1, history_window=2)[0] == lib.SH_ERR_ARG
    assert new(1, vote_rate=1)[0] == lib.SH_ERR_ARG
    assert new(2, sinks=2)[0] == lib.SH_ERR_BUDGET
    unknown = 1 + max(getattr(lib, spec.kind) for spec in SPECS.values())  # the next kind no file declares
    cfg = ffi.new("sh_config *", {"kind": unknown, "heads": 1, "budget": 4, "recent_window": 1})
    assert lib.sh_policy_new(cfg, ffi.new("sh_policy **")) == lib.SH_ERR_ARG
    rc, p = new(1)
    assert rc == lib.SH_OK and lib.sh_policy_slot_bytes(p) == 13
    victims, n = ffi.new("uint32_t[4]"), ffi.new("size_t *")
    for pos, w in ((1, [0.5]), (2, [0.25, 0.75])):
        attn = ffi.new("double[]", w)
        assert lib.sh_policy_step(p, lib.SH_STEP_ADMIT, pos, lib.SH_DTYPE_F64, attn, 1, len(w), 4,
                                  victims, ffi.NULL, 4, n) == lib.SH_OK
    assert [lib.sh_policy_score_of(p, 0, q) for q in (0, 1, 2, 3)] == [0.25, 0.75, 0.0, -1.0]
    scores, kept = ffi.new("double[3]"), ffi.new("uint32_t[3]")
    assert lib.sh_policy_export(p, kept, ffi.NULL, scores, 3) == lib.SH_OK
    assert list(kept) == [0, 1, 2] and list(scores) == [0.25, 0.75, 0.0]
    assert lib.sh_policy_import_state(p, 1, 2, kept, ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL, 2) == lib.SH_ERR_ARG


# ---------------------------------------------------------------- options a policy does not take

#: A value that is not "off" for each option, to give a policy that does not take it.
SET_VALUES = {"recent_window": 4, "sinks": 1, "history_window": 4, "vote_rate": True, "pool": 2}


def _not_taken():
    from scissorhands.options import OPTIONS, SPECS

    return [(name, o.name) for name, spec in SPECS.items() for o in OPTIONS if not spec.takes(o.name)]


@pytest.mark.parametrize(("policy", "option"), _not_taken())
def test_make_policy_refuses_every_option_the_policy_does_not_take(backend, policy, option):
    """Each (policy, option it does not take) pair of the registry, set: InvalidTypeError
    naming both, on either backend, as the constructor refuses the keyword."""
    from scissorhands.options import PolicyOptions, make_policy

    options = PolicyOptions(**{option: SET_VALUES[option]})
    with pytest.raises(InvalidTypeError, match=rf"^{policy} takes no {option} \(it takes .*\), got {option}="):
        make_policy(policy, 8, options, backend=backend.name)


@pytest.mark.parametrize(("policy", "values", "named"), [
    ("h2o", {"recent_window": 4, "history_window": -5}, "history_window=-5"),
    ("streaming-llm", {"recent_window": 0.75}, "recent_window=0.75"),
    ("full", {"recent_window": True, "vote_rate": "x"}, "recent_window=True"),
    ("full", {"sinks": 0}, "sinks=0"),
    ("streaming-llm", {"pool": 2, "sinks": 1}, "pool=2"),
])
def test_the_issue_cases_are_refused_naming_the_option(policy, values, named):
    """The reported silent acceptances (and an explicit 0 sinks for full, a pool for
    streaming-llm) are refused, the message naming the policy and the first option not
    taken."""
    from scissorhands.options import PolicyOptions, make_policy

    with pytest.raises(InvalidTypeError, match=rf"^{policy} takes no .*got {named}$"):
        make_policy(policy, 64 if policy != "full" else None, PolicyOptions(**values), backend="reference")


def test_options_at_their_off_values_are_not_given(backend):
    """pool 1 (a NumPy 1 too) or "head", vote_rate False, and the None defaults count as
    not given: full and streaming-llm build with them; vote_rate 0 and pool True do not
    count as off."""
    from scissorhands.options import PolicyOptions, make_policy

    off = PolicyOptions(recent_window=None, sinks=None, history_window=None, vote_rate=False, pool=1)
    assert off.given() == {} and PolicyOptions(pool="head").given() == {}
    assert make_policy("full", None, off, backend=backend.name).kept_count() == 1
    assert make_policy("streaming-llm", 8, PolicyOptions(pool="head"), backend=backend.name).sinks == 4
    assert make_policy("full", None, PolicyOptions(pool=np.int64(1)), backend=backend.name).kept_count() == 1
    assert PolicyOptions(vote_rate=0, pool=True).given() == {"vote_rate": 0, "pool": True}


def test_the_transformers_cache_refuses_an_option_its_policy_does_not_take():
    """EvictingCache (and so from_model) refuses, before building anything, what
    make_policy refuses: h2o with a history window, streaming-llm with a recent window."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from scissorhands import hf
    from scissorhands.options import PolicyOptions

    config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1)
    with pytest.raises(InvalidTypeError, match="h2o takes no history_window"):
        hf.EvictingCache(config, "h2o", budget=64, recent_window=4, history_window=-5)
    with pytest.raises(InvalidTypeError, match="streaming-llm takes no recent_window"):
        hf.EvictingCache(config, "streaming-llm", budget=64, recent_window=0.75)
    with pytest.raises(InvalidTypeError, match="full takes no recent_window"):
        hf.EvictingCache(config, "full", budget=64, recent_window=True, vote_rate="x")
    with pytest.raises(InvalidTypeError, match="streaming-llm takes no pool"):
        hf.EvictingCache(config, configs=[hf.PolicyConfig("streaming-llm", 8, PolicyOptions(pool=2))])


# ---------------------------------------------------------------- sweeps that would run nothing asked


def test_a_sweep_refuses_a_value_that_runs_nowhere():
    """--recent-window 64 at budget 64 runs no policy: refused, naming the flag, the value
    and why, instead of a run of the full cache and streaming-llm alone."""
    from scissorhands.options import POLICY_NAMES, sweep

    with pytest.raises(InvalidInputError, match=r"^--recent-window 64 would run with no policy at budgets 64: "
                                                r"h2o at budget 64: --recent-window must be below the budget "
                                                r"\(64\): in \[0, 63\], got 64 \(or a budget above 64\)$"):
        sweep(POLICY_NAMES, [64], {"recent_window": [64]})


def test_a_sweep_refuses_an_option_no_named_policy_takes():
    """A value given for an option none of the named policies takes is refused."""
    from scissorhands.options import sweep

    with pytest.raises(InvalidInputError, match=r"^--recent-window: none of the policies streaming-llm takes it"):
        sweep(["streaming-llm"], [16], {"recent_window": [8]})
    with pytest.raises(InvalidInputError, match=r"^--history-window: none of the policies h2o, tova takes it"):
        sweep(["h2o", "tova"], [16], {"history_window": [4]}, by="policy")


def test_a_sweep_refuses_a_policy_that_runs_at_no_budget():
    """h2o at budget 16 with its default window of 32 runs nowhere: refused, saying the
    window is the default and how to pass another."""
    from scissorhands.options import sweep

    with pytest.raises(InvalidInputError, match=r"^h2o would run at none of the budgets 12, 16: --recent-window 32 "
                                                r"\(the h2o default\) needs a budget above 32, got budget 12"):
        sweep(["full", "h2o"], [12, 16], {})


def test_a_sweep_still_skips_what_runs_at_some_budget():
    """A value refused at one budget and run at another, and duplicates, are still notes."""
    from scissorhands.options import sweep

    runs, notes = sweep(["h2o"], [16, 64], {"recent_window": [8, 40, "50%", "0.5x"]})
    assert [(r.budget, r.values["recent_window"]) for r in runs[1:]] == [(16, 8), (64, 8), (64, 40), (64, 32)]
    assert any("skipped h2o budget 16 (rw=40 sinks=0)" in n for n in notes)
    assert any("the same run as an earlier configuration" in n for n in notes)


def test_eval_refuses_a_value_that_runs_nowhere_before_loading(monkeypatch, capsys):
    """eval --budgets 64 --recent-window 64 exits 2 at once, naming the flag, where it ran
    the full cache alone and exited 0."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from scissorhands import hf
    from scissorhands.commands.cli import main

    monkeypatch.setattr(hf, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main(["eval", "--no-progress", "--budgets", "64", "--recent-window", "64"]) == 2
    assert "--recent-window 64 would run with no policy at budgets 64" in capsys.readouterr().err
    assert main(["eval", "--no-progress", "--policies", "streaming-llm", "--recent-window", "8"]) == 2
    assert "--recent-window: none of the policies streaming-llm takes it" in capsys.readouterr().err


# ---------------------------------------------------------------- defaults a small budget cannot hold


@pytest.mark.parametrize(("make", "message"), [
    (lambda b: b.H2O(budget=16),
     "recent_window 32 (the h2o default) needs a budget above 32, got budget 16: pass a smaller "
     "recent_window=... (or a fraction of the budget such as 0.75)"),
    (lambda b: b.Scissorhands(budget=32, heads=2),
     "recent_window 32 (the scissorhands default) needs a budget above 32, got budget 32: pass a smaller "
     "recent_window=... (or a fraction of the budget such as 0.75)"),
    (lambda b: b.StreamingLLM(budget=4),
     "sinks 4 (the streaming-llm default) needs a budget above 4, got budget 4: pass a smaller sinks=..."),
    (lambda b: b.H2O(budget=34, sinks=4),
     "budget must be greater than recent_window + sinks (32 + 4), got 34; recent_window 32 is the h2o default: "
     "pass a smaller recent_window=... (or a fraction of the budget such as 0.75)"),
])
def test_a_default_the_budget_cannot_hold_is_named_as_the_default(backend, make, message):
    """Both backends: a budget too small for the policy's default says the value is the
    default and how to pass a smaller one (not a bare range for a value nobody passed)."""
    from scissorhands.options import DefaultRefusedError

    with pytest.raises(DefaultRefusedError) as info:
        make(backend)
    assert str(info.value) == message and isinstance(info.value, InvalidInputError)


def test_a_recent_window_refused_names_itself_and_the_budget(backend):
    """A recent window as a string that is no fraction names the option (it may come from
    far from where it was written), with the integer to write when it is a count; one at
    or above a small budget names the budget, the likely mistake."""
    from scissorhands.options import PolicyOptions, make_policy

    with pytest.raises(InvalidInputError, match=r"^recent_window '16' is not a fraction like 50% or 0\.5x "
                                                r"\(a count of positions is an integer: recent_window=16\)$"):
        make_policy("scissorhands", 64, PolicyOptions(recent_window="16"), backend=backend.name)
    with pytest.raises(InvalidInputError, match=r"^recent_window '16\.0' is not a fraction like 50% or 0\.5x "
                                                r"\(a count of positions is an integer: recent_window=16\)$"):
        make_policy("h2o", 64, PolicyOptions(recent_window="16.0"), backend=backend.name)
    with pytest.raises(InvalidInputError, match=r"^recent_window '0\.5' is not a fraction like 50% or 0\.5x "
                                                r"\(a fraction is a float, recent_window=0\.5, or a string with "
                                                r"its suffix, '0\.5x'\)$"):
        make_policy("tova", 64, PolicyOptions(recent_window="0.5"), backend=backend.name)
    with pytest.raises(InvalidInputError, match=r"^recent_window 'half' is not a fraction like 50% or 0\.5x$"):
        make_policy("h2o", 64, PolicyOptions(recent_window="half"), backend=backend.name)
    with pytest.raises(InvalidInputError, match=r"^recent_window must be below the budget \(1\): in \[0, 0\], "
                                                r"got 16 \(or a budget above 16\)$"):
        backend.Scissorhands(budget=1, recent_window=16)
    with pytest.raises(InvalidTypeError, match=r"^recent_window must be an integer, not bool$"):
        backend.H2O(budget=16, recent_window=True)


def test_a_value_given_keeps_its_plain_message(backend):
    """A recent window given (not the default) is refused with the range as before, and
    TOVA (whose default window of 1 is also its least) with the reason no window fits or
    the plain sum: no advice to pass a smaller window."""
    from scissorhands.options import DefaultRefusedError

    with pytest.raises(InvalidInputError,
                       match=r"^recent_window must be below the budget \(16\): in \[0, 15\], got 20 "
                             r"\(or a budget above 20\)$") as info:
        backend.H2O(budget=16, recent_window=20)
    assert not isinstance(info.value, DefaultRefusedError)
    with pytest.raises(InvalidInputError, match=r"^tova needs recent_window >= 1 .*a budget above 1, got budget 1$"):
        backend.TOVA(budget=1)
    with pytest.raises(InvalidInputError, match=r"^budget must be greater than recent_window \+ sinks \(1 \+ 2\), "
                                                r"got 3$") as info:  # TOVA's window of 1 cannot be smaller
        backend.TOVA(budget=3, sinks=2)
    assert not isinstance(info.value, DefaultRefusedError)


def test_the_default_refusal_in_the_command_lines_words():
    """flag_text gives the refusal with the flags and the command line's fraction syntax;
    the error pickles with both messages."""
    from scissorhands.options import flag_text, make_policy

    with pytest.raises(InvalidInputError) as info:
        make_policy("h2o", 16, backend="reference")
    assert flag_text(info.value) == (
        "--recent-window 32 (the h2o default) needs a budget above 32, got budget 16: pass a smaller "
        "--recent-window (a count, or a fraction of the budget such as 75%)")
    again = pickle.loads(pickle.dumps(info.value))
    assert (str(again), flag_text(again)) == (str(info.value), flag_text(info.value))


def test_the_cache_and_generate_say_the_window_is_the_default(monkeypatch, capsys):
    """EvictingCache(…, "h2o", budget=16) and generate --budget 32 name the default and
    how to change it; generate exits 2 before the model loads."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import io

    from scissorhands import hf
    from scissorhands.commands.generate import GenerateRequest, run_generate

    config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1)
    with pytest.raises(InvalidInputError, match=r"^recent_window 32 \(the h2o default\) needs a budget above 32"):
        hf.EvictingCache(config, "h2o", budget=16)
    monkeypatch.setattr(hf, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    status = run_generate(GenerateRequest(prompt="x", budget=32, progress=False), stdin=io.StringIO(),
                          stdout=io.StringIO())
    assert status == 2
    err = capsys.readouterr().err
    assert ("--recent-window 32 (the scissorhands default) needs a budget above 32, got budget 32: pass a smaller "
            "--recent-window (a count, or a fraction of the budget such as 75%) (--budget 32)") in err


def test_replay_says_the_window_is_the_default_in_flags(capsys):
    """replay --budgets 16 (scissorhands' default window of 32): exits 2, after the usage, on
    one line naming the default and the flag to pass, as the command line writes fractions."""
    from scissorhands.commands.cli import main

    assert main(["--policies", "scissorhands", "--budgets", "16", "--no-progress"]) == 2
    assert capsys.readouterr().err.splitlines(keepends=True)[-1] == (
        "scissorhands replay: error: scissorhands (recent window 32) at budget 16: --recent-window 32 "
        "(the scissorhands default) needs a budget above 32, got budget 16: pass a smaller --recent-window "
        "(a count, or a fraction of the budget such as 75%)\n")


def test_a_sweeps_skip_notes_speak_the_command_lines_words():
    """A combination skipped at one budget (the default window of 32 at budget 16) is noted
    with the flag to pass, as the commands that print the notes take it."""
    from scissorhands.options import sweep

    runs, notes = sweep(["scissorhands"], [16, 256], {})
    assert [(r.policy, r.budget) for r in runs] == [("full", None), ("scissorhands", 256)]
    (note,) = [n for n in notes if n.startswith("skipped")]
    assert "--recent-window" in note and "recent_window=" not in note


def test_numpy_option_values_are_kept_as_the_python_numbers_they_equal():
    """Options (and a cache configuration's budget) given as NumPy scalars, as a sweep's
    arrays give them, are the options written by hand: equal, printed alike, serialisable."""
    import dataclasses

    from scissorhands.options import PolicyOptions

    given = PolicyOptions(recent_window=np.float64(0.75), sinks=np.int32(4), history_window=np.int64(8),
                          vote_rate=np.bool_(True), pool=np.int16(2))
    by_hand = PolicyOptions(recent_window=0.75, sinks=4, history_window=8, vote_rate=True, pool=2)
    assert given == by_hand and repr(given) == repr(by_hand)
    assert all(type(getattr(given, n)) is type(getattr(by_hand, n)) for n in ("recent_window", "sinks", "vote_rate"))
    assert json.loads(json.dumps(dataclasses.asdict(given))) == dataclasses.asdict(by_hand)
    pytest.importorskip("transformers", reason="transformers is not installed (pip install .[hf])")
    from scissorhands.hf.rows import PolicyConfig

    config = PolicyConfig("scissorhands", np.int64(64), given)
    assert type(config.budget) is int and repr(config) == repr(PolicyConfig("scissorhands", 64, by_hand))


def test_an_unknown_registry_name_lists_the_known_ones(backend):
    """``POLICIES[name]`` with a misspelt name raises the library's error (also the
    ``KeyError`` of a mapping, and a ``ValueError``) naming what was passed and the known
    names; ``in`` and ``get`` stay a plain mapping's."""
    from scissorhands.errors import UnknownPolicyError
    from scissorhands.options import POLICY_NAMES, policy_spec

    with pytest.raises(UnknownPolicyError) as caught:
        backend.POLICIES["scisorhands"]
    assert isinstance(caught.value, KeyError) and isinstance(caught.value, InvalidInputError)
    assert str(caught.value) == f"unknown policy 'scisorhands'; known: {', '.join(POLICY_NAMES)}"
    with pytest.raises(UnknownPolicyError, match="unknown policy 'lru'"):
        policy_spec("lru")
    assert "scisorhands" not in backend.POLICIES and backend.POLICIES.get("scisorhands") is None
    assert list(backend.POLICIES) == list(POLICY_NAMES)


@pytest.mark.parametrize("text", ["foo", "-3", "0", "1.5"])
def test_a_pool_that_is_neither_rows_nor_a_scope_is_refused_naming_the_scopes(text):
    """``--pool`` text that is no count of rows >= 1 and no scope: the message names what was given and the
    scopes it could have been, whatever way it is wrong."""
    from scissorhands.options import POOL

    with pytest.raises(InvalidInputError, match=rf"'{text}' is not a number of rows >= 1 or one of head, layer, "):
        POOL.parse(text)
    assert POOL.parse(" Layer ") == "layer" and POOL.parse("head") == 1 and POOL.parse("6") == 6


def test_the_recommended_preset_resolves_to_explicit_options_and_keeps_the_seed_defaults():
    """``"recommended"`` is Scissorhands with recent_window=0.75, sinks=4 and prompt_aware, explicit values
    overriding it; a policy name passes through with the seed's defaults untouched."""
    from scissorhands.options import PRESETS, RECOMMENDED, SPECS, PolicyOptions, expand_preset

    assert PRESETS["recommended"] is RECOMMENDED and "recommended" not in SPECS
    assert expand_preset("recommended", None, {}, None) == (
        "scissorhands", None, {"recent_window": 0.75, "sinks": 4}, True)
    assert expand_preset("recommended", PolicyOptions(sinks=2), {"recent_window": 8}, False) == (
        "scissorhands", None, {"recent_window": 8, "sinks": 2}, False)
    assert expand_preset("scissorhands", None, {}, None) == ("scissorhands", None, {}, False)
    assert SPECS["scissorhands"].default("recent_window") == 32 and SPECS["scissorhands"].default("sinks") == 0
    line = RECOMMENDED.describe(512, defaulted=True)
    assert line.startswith("recommended = scissorhands recent_window=0.75 sinks=4 prompt_aware=True, budget 512")
    assert "the default" in line
    assert RECOMMENDED.as_dict() == {"preset": "recommended", "policy": "scissorhands", "recent_window": 0.75,
                                     "sinks": 4, "prompt_aware": True}


def test_a_pins_refusal_says_what_to_change():
    """Pins that leave nothing to evict are refused with the recent window that would fit and the budget."""
    import scissorhands

    with pytest.raises(InvalidInputError, match=r"= 1432 reach budget 1024; to pin these, pass recent_window=359 "
                                                r"or less \(a count\) at this budget, a budget above 1432"):
        scissorhands.Scissorhands(budget=1024, recent_window=0.75, sinks=4).pin(0, 664)
