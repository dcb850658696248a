"""Rows of different counts, chunks (``extend``) and row selection (``select_rows``).

The known answers live in ``vectors/`` and the backend comparisons in
``tests/test_differential.py`` and ``tests/fuzz_ops.py``; this file pins what those
cannot state: NaN and infinities in weights no step reads, the array-like forms of
``admit`` and of a row index, the exact return types, the messages that name the
alternatives, the C statuses behind them, and allocation failures.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import POLICY_NAMES, make_policy, unchanged

import scissorhands
from scissorhands import _shared
from scissorhands._native import ffi, lib
from scissorhands.errors import InvalidInputError, InvalidTypeError
from scissorhands.options import SPECS

NAN, INF = float("nan"), float("inf")


class ArrayLike:
    """A stand-in for a torch tensor: anything NumPy reads through ``__array__``."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = values

    def __array__(self, dtype=None, copy=None):
        return self.values if dtype is None else self.values.astype(dtype)


def ragged(backend, name: str = "scissorhands", kept=((0, 2, 5), (2, 5)), **params):
    """A two-row policy holding ``kept`` (by default [0, 2, 5] and [2, 5]; last position 5)."""
    cls = backend.POLICIES[name]
    base = {"full": {}, "streaming-llm": {"budget": 3, "sinks": 1}}.get(name, {"budget": 3, "recent_window": 1})
    state = cls(heads=2, **{**base, **params}).state_dict()
    state.update(kept=[list(row) for row in kept], last_position=5)
    for key, zero in (("votes", 0), ("scores", 0.0), ("history", 0), ("steps_held", 0)):
        if key in state:
            state[key] = [[zero] * len(row) for row in kept]
    return cls.from_state_dict(state)


# ---------------------------------------------------------------- shared pieces


def test_limits_agree_with_the_header():
    """_shared states the C header's limits and sizes exactly."""
    assert (_shared.HEADER_BYTES, _shared.COUNT_BYTES, _shared.MAX_HEADS, _shared.MAX_HISTORY_WINDOW,
            _shared.INITIAL_CAPACITY_LIMIT, _shared.FULL_INITIAL_CAPACITY) == (
        lib.SH_HEADER_BYTES, lib.SH_COUNT_BYTES, lib.SH_MAX_HEADS, lib.SH_MAX_HISTORY_WINDOW,
        lib.SH_INITIAL_CAPACITY_LIMIT, lib.SH_FULL_INITIAL_CAPACITY)


def test_row_victims_is_one_exported_named_tuple(backend):
    """Both backends return scissorhands.RowVictims: uint32 counts and victims, int64 slots."""
    assert scissorhands.RowVictims is _shared.RowVictims and "RowVictims" in scissorhands.__all__
    p = make_policy(backend, "scissorhands", budget=3, protected=1, heads=2)
    got = p.evict_rows()
    assert type(got) is scissorhands.RowVictims and got._fields == ("counts", "victims", "slots")
    assert [(a.dtype, a.shape) for a in got] == [(np.uint32, (2,)), (np.uint32, (0,)), (np.int64, (0,))]
    for t in range(1, 5):
        got = p.step_rows(t, np.full((2, p.kept_count()), 0.5))
    assert [(a.dtype, a.shape) for a in got] == [(np.uint32, (2,)), (np.uint32, (2,)), (np.int64, (2,))]


def test_memory_formula_helper_matches_the_policies(backend):
    """memory_bytes(): 64 + capacity * bytes_per_slot for one row, + 4 per row's count for more."""
    assert _shared.memory_bytes(5, 1, 9) == 64 + 45
    assert _shared.memory_bytes(5, 3, 9) == 64 + 12 + 135
    p = make_policy(backend, "scissorhands", budget=4, protected=1, heads=3)
    assert p.memory_bytes() == _shared.memory_bytes(5, 3, 9)
    p.select_rows([0])
    assert p.memory_bytes() == _shared.memory_bytes(5, 1, 9)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_fit_capacity_then_growth_follows_what_is_held(backend, name):
    """fit_capacity(1) starts every row at one slot; admitting then doubles it to budget + 1
    (the memory formula at each capacity), the victims those of a policy never fitted;
    a capacity below a row's count is refused, nothing changed."""
    from scissorhands.errors import InvalidInputError

    fitted, plain = (make_policy(backend, name, budget=12, protected=2, heads=2) for _ in range(2))
    fitted.fit_capacity(1)
    start = 64 if name == "full" else 13  # the unfitted first capacity (Full has no budget)
    slot_bytes = (plain.memory_bytes() - 64 - 8) // (2 * start)
    assert fitted.memory_bytes() == _shared.memory_bytes(1, 2, slot_bytes)
    rng = np.random.default_rng(0)
    seen = []
    for pos in range(1, 40):
        attn = rng.random((2, int(np.asarray(plain.counts).max()))).astype(np.float32)
        a, b = fitted.step_rows(pos, attn, 12), plain.step_rows(pos, attn, 12)
        assert np.array_equal(np.asarray(a.slots), np.asarray(b.slots))
        seen.append(fitted.memory_bytes())
    assert seen[-1] == plain.memory_bytes()
    before = (fitted.state_dict(), fitted.memory_bytes())
    with pytest.raises(InvalidInputError, match="capacity"):
        fitted.fit_capacity(5)
    assert (fitted.state_dict(), fitted.memory_bytes()) == before


# ---------------------------------------------------------------- rows of different counts


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_equal_count_accessors_name_the_alternatives(backend, name):
    """kept_count, kept and the per-slot properties raise, naming counts, kept_row and state_dict."""
    p = ragged(backend, name)
    reads = [p.kept_count, lambda: p.kept]
    key = SPECS[name].score_key
    reads += [lambda: getattr(p, key)] if key else []
    for read in reads:
        with pytest.raises(InvalidInputError, match=r"counts.*kept_row\(head\).*state_dict\(\)"):
            read()
    assert p.counts.tolist() == [3, 2] and p.counts.dtype == np.uint32
    assert p.kept_row(0).tolist() == [0, 2, 5] and p.kept_row(np.int64(1)).dtype == np.uint32
    assert repr(p).endswith("held=2..3)")


def test_steps_held_refuses_rows_of_different_counts(backend):
    """steps_held (vote rate) needs equal counts, like votes."""
    p = ragged(backend, vote_rate=True)
    with pytest.raises(InvalidInputError, match="kept_row"):
        _ = p.steps_held


@pytest.mark.parametrize("name", [n for n in POLICY_NAMES if SPECS[n].evicts])
def test_step_and_evict_name_the_row_calls(backend, name):
    """Rows that would evict different numbers: step/evict raise naming step_rows/evict_rows."""
    p = ragged(backend, name)
    unchanged(p, InvalidInputError, p.evict, 2)
    with pytest.raises(InvalidInputError, match="evict_rows"):
        p.evict(2)
    with pytest.raises(InvalidInputError, match="step_rows"):
        p.step(6, np.full((2, 3), 0.25))
    assert p.step_rows(6, np.full((2, 3), 0.25)).counts.tolist() == [1, 0]


def test_unread_weights_may_be_nan(backend, heavy):
    """Row h reads its first counts[h] weights; NaN or inf after them is never read."""
    p = ragged(backend, heavy.name)
    p.on_decode_step(6, np.array([[0.5, 0.25, 0.25], [0.5, 0.5, NAN]], dtype=np.float32))
    p.step_rows(7, np.array([[0.25] * 4, [0.25, 0.25, 0.5, INF]]))
    unchanged(p, InvalidInputError, p.on_decode_step, 8, np.array([[0.5, NAN, 0.0], [0.5, 0.5, 0.0]]))


def test_a_refused_weight_is_named_among_those_its_row_reads(backend, heavy):
    """The error names the first refused weight a row reads, not a NaN in a shorter row's unread columns."""
    p = ragged(backend, heavy.name, kept=((2, 5), (0, 2, 5)))
    error = unchanged(p, InvalidInputError, p.on_decode_step, 6, np.array([[0.5, 0.5, NAN], [0.5, -0.5, 0.0]]))
    assert "got -0.5" in str(error)
    if backend.name == "native":  # the reference reads the rows in Python and names the value alone
        assert "at index [1, 1]" in str(error)


def test_rows_that_agree_again_read_as_one_array(backend):
    """Once the rows hold the same count again, kept_count, kept and votes answer as before."""
    p = ragged(backend)
    p.evict_rows(2)
    assert p.kept_count() == 2 and p.kept.tolist() == [[2, 5], [2, 5]] and p.votes.shape == (2, 2)


# ---------------------------------------------------------------- extend


def test_extend_never_reads_weights_outside_what_each_token_sees(backend, heavy):
    """NaN above the diagonal, in columns of tokens left out, and in tokens left out is fine."""
    p = backend.POLICIES[heavy.name](budget=8, recent_window=1, heads=2)
    attn = np.full((2, 4, 4), NAN)
    attn[0, 1, 0] = attn[0, 2, :2] = attn[0, 3, :3] = 0.25
    attn[1, 2, 1] = attn[1, 3, 1] = attn[1, 3, 2] = 0.5  # row 1 admits tokens 1..3 only
    p.extend(attn, admit=[[True] * 4, [False, True, True, True]])
    assert p.counts.tolist() == [4, 3]
    bad = np.zeros((2, 1, 5))
    bad[1, 0, 2] = NAN  # row 1 (3 held) reads columns 0..2: refused
    unchanged(p, InvalidInputError, p.extend, bad)
    bad[1, 0, 2], bad[1, 0, 3] = 0.0, NAN  # column 3 is the token itself: never read
    p.extend(bad)


def test_extend_names_the_refused_weight_a_joining_token_reads(backend, heavy):
    """Rows of different counts and a token left out of one row: the error names the first refused
    weight some joining token reads (the NaNs before it in C order are never read)."""
    p = ragged(backend, heavy.name, kept=((2, 5), (0, 2, 5)))  # row 0 holds 2, row 1 holds 3: width 3 + C
    attn = np.zeros((2, 2, 5))
    attn[0, 0, 2] = NAN  # row 0's token 0 over itself (column 2 = n_0 + 0): never read
    attn[0, 1, 4] = NAN  # past row 0's columns (2 held + 2 tokens): never read
    attn[1, 0, 1] = NAN  # row 1's token 0 does not join it: none of its weights is read
    attn[1, 1, 3] = -0.5  # row 1's token 1 over token 0, which did not join: never read
    attn[1, 1, 2] = -0.25  # row 1's token 1 over its third held position: refused
    error = unchanged(p, InvalidInputError, p.extend, attn, [[True, True], [False, True]])
    assert "got -0.25" in str(error)
    if backend.name == "native":
        assert "at index [1, 1, 2]" in str(error)


def test_extend_refuses_an_empty_chunk_and_wrong_shapes(backend):
    """C must be >= 1 and the width n + C; the message names the shape expected."""
    p = ragged(backend)
    for attn in (np.zeros((2, 0, 3)), np.zeros((2, 1, 3)), np.zeros((2, 1, 5)), np.zeros((1, 1, 4)),
                 np.zeros((2, 4)), np.zeros(4)):
        unchanged(p, InvalidInputError, p.extend, attn)
    with pytest.raises(InvalidInputError, match=r"\(2, C, 3 \+ C\)"):
        p.extend(np.zeros((2, 1, 3)))
    with pytest.raises(InvalidTypeError):
        p.extend(None)
    q = backend.Scissorhands(budget=4, recent_window=1)
    with pytest.raises(InvalidInputError, match=r"\(1, C, 0 \+ C\) or \(C, 0 \+ C\)"):
        q.extend(np.zeros((2, 3)))


@pytest.mark.parametrize("admit", [
    np.array([[True, False]]), [[True, False]], (np.True_, np.False_), [np.array([True, False])],
    ArrayLike(np.array([True, False])), np.array([True, False]),
])
def test_extend_takes_admit_as_bools_in_any_array_form(backend, admit):
    """admit: a bool array, lists or tuples of (NumPy) bools, an __array__ object; (C,) for one head."""
    p = backend.Scissorhands(budget=4, recent_window=1)
    p.extend(np.tril(np.full((2, 2), 0.5), -1), admit)
    assert p.kept.tolist() == [0]  # token 1 left out; position 0 stays
    assert p.state_dict()["last_position"] == 1


@pytest.mark.parametrize(("admit", "exc"), [
    (np.array([[1, 0]]), InvalidTypeError), ([[1, 0]], InvalidTypeError), ([[1.0, 0.0]], InvalidTypeError),
    (ArrayLike(np.array([1, 0])), InvalidTypeError), ("yes", InvalidTypeError), (True, InvalidTypeError),
    (np.ma.masked_array([True, False]), InvalidTypeError), (np.array([[True]]), InvalidInputError),
    (np.array([True, False, True]), InvalidInputError), ([[True], [True, False]], InvalidInputError),
    (np.ones((1, 1, 2), dtype=bool), InvalidInputError),
])
def test_extend_refuses_admit_that_is_not_bools_of_the_chunk_shape(backend, admit, exc):
    """Integers, strings and masked arrays are the wrong kind; other shapes are out of range."""
    p = backend.Scissorhands(budget=4, recent_window=1)
    unchanged(p, exc, p.extend, np.zeros((2, 2)), admit)


def test_extend_on_a_policy_that_ignores_attention_reads_only_the_shape(backend):
    """StreamingLLM and Full take any values of the right shape (NaN, strings) and refuse others."""
    for name in ("streaming-llm", "full"):
        p = make_policy(backend, name, budget=4, protected=1, heads=2)
        p.extend(np.full((2, 3, 3), NAN), admit=np.array([[False, True, True], [True] * 3]))
        assert p.counts.tolist() == [2, 3]
        p.extend([[["x"] * 4], [["y"] * 4]])
        unchanged(p, InvalidInputError, p.extend, np.zeros((2, 1, 3)))
        unchanged(p, InvalidInputError, p.extend, [[[0.0] * 4], [[0.0] * 3]])


def test_extend_overflowing_the_positions_is_refused(backend):
    """A chunk reaching past position 2**32 - 1 raises before anything changes."""
    p = backend.Full()
    p.on_decode_step(2**32 - 2, None)
    unchanged(p, InvalidInputError, p.extend, np.zeros((2, 4)))
    p.extend(np.zeros((1, 3)))
    assert p.kept.tolist() == [0, 2**32 - 2, 2**32 - 1]


# ---------------------------------------------------------------- select_rows


@pytest.mark.parametrize("index", [
    [1, 0, 1], (1, 0, 1), np.array([1, 0, 1], dtype=np.int8), np.array([1, 0, 1], dtype=np.uint64),
    ArrayLike(np.array([1, 0, 1])), [np.int64(1), np.uint8(0), 1],
])
def test_select_rows_takes_integers_in_any_array_form(backend, index):
    """Lists, tuples, integer arrays of any width, __array__ objects and NumPy scalars."""
    p = ragged(backend)
    p.select_rows(index)
    assert p.heads == 3 and p.counts.tolist() == [2, 3, 2]
    assert p.state_dict()["kept"] == [[2, 5], [0, 2, 5], [2, 5]]


@pytest.mark.parametrize(("index", "exc"), [
    ([], InvalidInputError), (np.array([], dtype=np.int64), InvalidInputError), ([2], InvalidInputError),
    ([-1], InvalidInputError), (np.array([[0]]), InvalidInputError), (1, InvalidInputError),
    (np.int64(1), InvalidInputError), ([0] * 65537, InvalidInputError), ([True], InvalidTypeError),
    (np.array([True]), InvalidTypeError), ([0.0], InvalidTypeError), (np.array([0.0]), InvalidTypeError),
    ("01", InvalidTypeError), (None, InvalidTypeError), ([0, "1"], InvalidTypeError),
])
def test_select_rows_refuses_bad_indices_and_changes_nothing(backend, index, exc):
    """Empty, out of range, not 1-D or too long: InvalidInputError; not integers: InvalidTypeError."""
    p = ragged(backend)
    unchanged(p, exc, p.select_rows, index)
    assert p.heads == 2


def test_select_rows_of_65536_rows(backend):
    """The largest row count is allowed, and rows may all copy one row."""
    p = backend.StreamingLLM(budget=2, sinks=1)
    p.select_rows(np.zeros(65536, dtype=np.int32))
    assert p.heads == 65536 and p.memory_bytes() == 64 + 4 * 65536 + 3 * 65536 * 4


def test_select_rows_then_state_round_trips(backend):
    """The new rows are a plain policy: heads in params, state loadable by the other backend."""
    p = ragged(backend, history_window=2)
    p.select_rows([1, 1])
    state = p.state_dict()
    assert state["params"]["heads"] == 2 and state["kept"] == [[2, 5], [2, 5]]
    for module in (scissorhands, scissorhands.reference):
        assert module.Scissorhands.from_state_dict(state).state_dict() == state


def test_kept_row_is_a_copy(backend):
    """Writing into kept_row's array changes nothing held."""
    p = ragged(backend)
    row = p.kept_row(0)
    row[:] = 9
    assert p.kept_row(0).tolist() == [0, 2, 5]


# ---------------------------------------------------------------- the C calls


def _policy(kind=lib.SH_SCISSORHANDS, heads=2, budget=3, recent=1):
    cfg = ffi.new("sh_config *", {"kind": kind, "heads": heads, "budget": budget, "recent_window": recent})
    out = ffi.new("sh_policy **")
    assert lib.sh_policy_new(cfg, out) == lib.SH_OK
    return ffi.gc(out[0], lib.sh_policy_free)


def test_c_step_statuses_for_rows_of_different_counts():
    """sh_policy_step: SH_ERR_LENGTH for a wrong width with equal counts, SH_ERR_RAGGED with
    different ones or different evictions; sh_policy_step_rows takes them."""
    p = _policy()
    counts = ffi.new("uint32_t[]", [3, 2])
    kept = ffi.new("uint32_t[]", [0, 2, 5, 2, 5])
    votes = ffi.new("uint32_t[5]")
    victims, slots, k = ffi.new("uint32_t[8]"), ffi.new("int64_t[8]"), ffi.new("size_t *")
    rows = ffi.new("uint32_t[2]")
    w = np.full(8, 0.25)
    step = lib.sh_policy_step
    both = lib.SH_STEP_ADMIT | lib.SH_STEP_EVICT
    assert step(p, both, 1, lib.SH_DTYPE_F64, ffi.from_buffer(w), 2, 2, 3, victims, slots, 8, k) == lib.SH_ERR_LENGTH
    assert lib.sh_policy_import_rows(p, 2, counts, kept, votes, ffi.NULL, ffi.NULL, ffi.NULL, 5) == lib.SH_OK
    assert lib.sh_policy_count(p) == 3 and lib.sh_policy_row_count(p, 1) == 2 and lib.sh_policy_row_count(p, 2) == 0
    assert step(p, both, 6, lib.SH_DTYPE_F64, ffi.from_buffer(w), 2, 2, 3, victims, slots, 8, k) == lib.SH_ERR_RAGGED
    assert step(p, both, 6, lib.SH_DTYPE_F64, ffi.from_buffer(w), 2, 3, 3, victims, slots, 8, k) == lib.SH_ERR_RAGGED
    assert step(p, lib.SH_STEP_EVICT, 0, lib.SH_DTYPE_NONE, ffi.NULL, 2, 0, 2, victims, slots, 8, k) \
        == lib.SH_ERR_RAGGED
    rows_step = lib.sh_policy_step_rows
    assert rows_step(p, both, 6, lib.SH_DTYPE_F64, ffi.from_buffer(w), 2, 2, 3, victims, slots, 8, rows, k) \
        == lib.SH_ERR_LENGTH
    assert rows_step(p, both, 6, lib.SH_DTYPE_F64, ffi.from_buffer(w), 2, 3, 3, victims, slots, 8, ffi.NULL, k) \
        == lib.SH_ERR_ARG
    assert rows_step(p, both, 6, lib.SH_DTYPE_F64, ffi.from_buffer(w), 2, 3, 3, victims, slots, 0, rows, k) \
        == lib.SH_ERR_BUFFER
    assert rows_step(p, both, 6, lib.SH_DTYPE_F64, ffi.from_buffer(w), 2, 3, 3, victims, slots, 8, rows, k) \
        == lib.SH_OK
    assert list(rows) == [1, 0] and k[0] == 1
    # The old equal-count import still takes n positions per row.
    assert lib.sh_policy_import_state(p, 2, 1, kept, votes, ffi.NULL, ffi.NULL, ffi.NULL, 5) == lib.SH_OK
    assert lib.sh_policy_count(p) == 1


def test_c_extend_select_and_exports_check_their_arguments():
    """The new C calls refuse bad arguments with their statuses and change nothing."""
    p = _policy()
    assert lib.sh_policy_extend(p, lib.SH_DTYPE_NONE, ffi.NULL, 2, 0, 0, ffi.NULL) == lib.SH_ERR_ARG
    w = np.zeros(2 * 2 * 2)
    assert lib.sh_policy_extend(p, lib.SH_DTYPE_F64, ffi.from_buffer(w), 1, 2, 2, ffi.NULL) == lib.SH_ERR_LENGTH
    assert lib.sh_policy_extend(p, lib.SH_DTYPE_F64, ffi.from_buffer(w), 2, 2, 3, ffi.NULL) == lib.SH_ERR_LENGTH
    assert lib.sh_policy_extend(p, lib.SH_DTYPE_F64, ffi.NULL, 2, 2, 2, ffi.NULL) == lib.SH_ERR_ARG
    assert lib.sh_policy_extend(p, lib.SH_DTYPE_F64, ffi.from_buffer(w), 2, 2, 2, ffi.NULL) == lib.SH_OK
    assert lib.sh_policy_prefill(p, lib.SH_DTYPE_F64, ffi.from_buffer(w), 2, 2) == lib.SH_ERR_STATE
    assert lib.sh_policy_select_rows(p, ffi.new("uint32_t[]", [2]), 1) == lib.SH_ERR_ARG
    assert lib.sh_policy_select_rows(p, ffi.new("uint32_t[]", [0]), 0) == lib.SH_ERR_ARG
    assert lib.sh_policy_select_rows(p, ffi.NULL, 1) == lib.SH_ERR_ARG
    assert lib.sh_policy_select_rows(p, ffi.new("uint32_t[]", [1, 1, 0]), 3) == lib.SH_OK
    out = ffi.new("uint32_t[3]")
    assert lib.sh_policy_counts(p, out, 2) == lib.SH_ERR_BUFFER
    assert lib.sh_policy_counts(p, out, 3) == lib.SH_OK and list(out) == [2, 2, 2]
    assert lib.sh_policy_export_row(p, 3, out, 3) == lib.SH_ERR_ARG
    assert lib.sh_policy_export_row(p, 0, out, 1) == lib.SH_ERR_BUFFER
    assert lib.sh_policy_export_row(p, 0, out, 2) == lib.SH_OK and list(out)[:2] == [0, 1]
    assert lib.sh_policy_memory_bytes(p) == 64 + 3 * 4 + 4 * 3 * 9


@pytest.mark.skipif("asan" in os.environ.get("LD_PRELOAD", ""),
                    reason="an address-space limit and AddressSanitizer's shadow memory do not mix")
def test_allocation_failures_raise_memory_error_and_change_nothing():
    """select_rows and extend allocate before they change anything: MemoryError leaves the policy as it was."""
    script = textwrap.dedent("""
        import resource
        import numpy as np
        import scissorhands as S
        p = S.Scissorhands(budget=2**32 - 1, recent_window=0, heads=2)  # 4096 slots a row
        p.extend(np.zeros((2, 3, 3)), admit=[[True, False, True], [True, True, True]])
        before = (p.state_dict(), p.memory_bytes(), p.heads)
        with open("/proc/self/statm") as f:
            used = int(f.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (used + 256 * 2**20, resource.RLIM_INFINITY))
        outcomes = []
        for call in (lambda: p.select_rows(np.zeros(65536, dtype=np.int64)),  # about 3.5 GB
                     lambda: S.Full(heads=4096).extend(np.broadcast_to(np.float32(0), (4096, 2**20, 2**20)))):
            try:
                call()
                outcomes.append("ok")
            except MemoryError:
                outcomes.append("MemoryError")
        assert (p.state_dict(), p.memory_bytes(), p.heads) == before
        print(outcomes)
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "['MemoryError', 'MemoryError']"


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_the_caches_steady_step_equals_step_rows(name):
    """The C policies' ``_step_slots`` (the transformers cache's decode step straight to C)
    evicts what ``step_rows`` evicts on a twin, step after step, and leaves the same
    state; it declines (None, nothing changed) what is not its case: another budget,
    rows of different counts, a non-contiguous array, a position not after the last,
    and a step C refuses (a NaN weight read)."""
    fast, slow = (make_policy(scissorhands, name, budget=6, protected=2, heads=3) for _ in range(2))
    budget = fast._budget  # the configured one (full's is the largest)
    reads = SPECS[name].reads_attention
    rng = np.random.default_rng(7)
    for pos in range(1, 12):
        w = rng.random((3, int(np.asarray(slow.counts).max()))).astype(np.float32)
        done = fast._step_slots(pos, w, budget)
        expect = slow.step_rows(pos, w, budget)
        assert done is not None
        k, slots = done
        assert np.array_equal(np.full(3, k), expect.counts) and np.array_equal(slots, expect.slots)
        assert fast.state_dict() == slow.state_dict()
    n = int(np.asarray(fast.counts).max())
    w = rng.random((3, n)).astype(np.float32)
    bad = w.copy()
    bad[1, 0] = NAN
    declined = [(12, w, 7), (11, w, budget)]
    if reads:  # the weights' layout and values matter only to a policy that reads them
        declined += [(12, rng.random((3, 2 * n)).astype(np.float32)[:, ::2], budget), (12, bad, budget)]
    for args in declined:
        before = fast.state_dict()
        assert fast._step_slots(*args) is None
        assert fast.state_dict() == before
    fast.extend(np.zeros((3, 1, n + 1), dtype=np.float32), np.array([[True], [False], [True]]))
    before = fast.state_dict()
    assert fast._step_slots(13, np.zeros((3, n + 1), dtype=np.float32), budget) is None  # rows of different counts
    assert fast.state_dict() == before


@pytest.mark.parametrize("value", [1, 0, "yes", None, 1.0])
def test_return_indices_must_be_a_bool(backend, value):
    """``evict`` and ``step`` refuse a ``return_indices`` that is not a bool (``1``
    included), naming its type, before anything changes."""
    p = make_policy(backend, "scissorhands", budget=6, protected=2)
    p.step(1, [1.0])
    for call in (lambda: p.evict(return_indices=value), lambda: p.step(2, [0.5, 0.5], return_indices=value)):
        unchanged(p, InvalidTypeError, call)
    victims, slots = p.step(2, [0.5, 0.5], return_indices=np.bool_(True))
    assert list(victims) == [] and list(slots) == []


def test_an_ndarray_subclass_is_read_as_its_plain_array(backend):
    """Weights as ``np.matrix`` (an ndarray subclass whose rows are 2-D) step as the
    same plain array does, in either backend."""
    plain, sub = (make_policy(backend, "scissorhands", budget=6, protected=2, heads=3) for _ in range(2))
    rng = np.random.default_rng(11)
    for pos in range(1, 9):
        w = rng.random((3, int(np.asarray(plain.counts).max())))
        assert np.array_equal(plain.step(pos, w), sub.step(pos, np.asmatrix(w)))
    assert plain.state_dict() == sub.state_dict()
