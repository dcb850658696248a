"""The observation-window rule (``evict_observed`` / ``evict_observed_rows``, SnapKV's
pooled window scores) pinned on every policy class of both backends: known answers, the
protected positions, ties, pooling, ragged rows, and every refusal leaving the state as
it was. The C path runs on both kernel paths."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from c_paths import backend_fixture  # noqa: F401  (the backend fixture: both C paths and the reference)
from conftest import unchanged

from scissorhands.errors import InvalidInputError, InvalidTypeError
from scissorhands.options import SPECS

#: Every class, and those that evict (Full never does).
ALL = tuple(spec.class_name for spec in SPECS.values())
EVICTING = tuple(spec.class_name for spec in SPECS.values() if spec.evicts)


@pytest.fixture(params=ALL)
def any_cls(request, backend):
    """Every policy class of each backend."""
    return getattr(backend, request.param)


@pytest.fixture(params=EVICTING)
def evicting(request, backend):
    """Every class that evicts, of each backend."""
    return getattr(backend, request.param)


def build(cls, budget=6, sinks=0, heads=1, **kw):
    """A policy of ``cls`` with ``sinks`` (Full: none), recent window 1 where it has one."""
    name = cls.__name__
    if name == "Full":
        return cls(budget=budget, heads=heads)
    if name != "StreamingLLM":
        kw.setdefault("recent_window", 1)
    return cls(budget=budget, sinks=sinks, heads=heads, **kw)


def held(cls, n, budget=6, sinks=0, heads=1, **kw):
    """A policy holding positions ``0 .. n-1`` in every row, admitted without attention."""
    p = build(cls, budget, sinks, heads, **kw)
    for pos in range(1, n):
        p.on_decode_step(pos, None)
    return p


def spike(n, window, at, heads=1, value=1.0):
    """A window whose every row puts ``value`` on slot ``at`` and 0 elsewhere."""
    attn = np.zeros((heads, window, n))
    attn[:, :, at] = value
    return attn[0] if heads == 1 else attn


# ---------------------------------------------------------------- known answers


def test_known_answer(evicting):
    """A spike at slot 4 pooled over 3 slots keeps 3..5; the rest of the evictions take
    the least pooled scores, ties (3, 4, 5 all pooled 3.0) going to the lower slot."""
    p = held(evicting, 10, budget=6, sinks=1)
    out = p.evict_observed_rows(spike(10, 3, 4), pool_kernel=3)
    assert out.counts.tolist() == [4]
    assert out.victims.tolist() == [1, 2, 3, 6]
    assert out.slots.tolist() == [1, 2, 3, 6]
    assert p.kept.tolist() == [0, 4, 5, 7, 8, 9]


def test_full_never_evicts(backend):
    """Full returns no victims and keeps everything, whatever the window says."""
    p = held(backend.Full, 10, budget=3)
    out = p.evict_observed_rows(spike(10, 2, 4))
    assert out.counts.tolist() == [0] and out.victims.size == 0 and out.slots.size == 0
    assert p.evict_observed(spike(10, 2, 4), budget=2) == []
    assert p.kept.tolist() == list(range(10))


def test_window_rows_read_only_earlier_slots(evicting):
    """Window row j of a row holding n reads slots i < n - W + j: a large weight on a
    later slot (the row's own or after it) counts for nothing."""
    n, w = 8, 3
    attn = np.zeros((w, n))
    attn[0, 5] = 100.0  # row 0 is slot 5: its weight on itself is not read
    attn[1, 7] = 100.0  # row 1 is slot 6: slot 7 is after it
    attn[2, 2] = 1.0    # row 2 is slot 7: reads slot 2
    p = held(evicting, n, budget=4)
    out = p.evict_observed_rows(attn, pool_kernel=1)
    assert out.victims.tolist() == [0, 1, 3, 4]


def test_unread_weights_are_not_checked(evicting):
    """NaN or negative weights outside the read entries (a row's own slot, later slots,
    the columns past a row's count) are neither read nor refused."""
    n, w = 6, 2
    attn = np.zeros((w, n))
    attn[0, 4:] = np.nan
    attn[1, 5] = -1.0
    attn[1, 1] = 1.0
    p = held(evicting, n, budget=4)
    assert p.evict_observed_rows(attn, pool_kernel=1).victims.tolist() == [0, 2]


def test_scores_add_in_window_order(evicting):
    """Slot 1's score is 1.0 + 2**-53 + 2**-53 added row after row (= 1.0, a tie with
    slot 2's 1.0, so the lower slot goes); added in another order it would be larger."""
    tiny = 2.0**-53
    attn = np.zeros((3, 7))
    attn[:, 1] = [1.0, tiny, tiny]  # rows 0..2 are slots 4..6: all read slot 1
    attn[0, 2] = 1.0
    attn[:, 3] = 5.0
    p = held(evicting, 7, budget=6, sinks=1)
    assert p.evict_observed_rows(attn, pool_kernel=1).victims.tolist() == [1]


def test_not_renormalised_and_float32_widened(evicting):
    """float32 weights are widened exactly and not renormalised: the same victims as
    their float64 values."""
    rng = np.random.default_rng(3)
    attn32 = rng.random((4, 20), dtype=np.float32) * 7
    a = held(evicting, 20, budget=9, sinks=2)
    b = held(evicting, 20, budget=9, sinks=2)
    ra = a.evict_observed_rows(attn32, pool_kernel=3)
    rb = b.evict_observed_rows(attn32.astype(np.float64), pool_kernel=3)
    assert ra.victims.tolist() == rb.victims.tolist()
    assert a.state_dict() == b.state_dict()


# ---------------------------------------------------------------- protection and ties


def test_sinks_and_window_protected_recent_window_not(backend):
    """The first sinks and the window's rows stay though their scores are the least;
    the policy's recent window is not protected by this rule."""
    p = backend.H2O(budget=7, recent_window=4, sinks=2)
    for pos in range(1, 10):
        p.on_decode_step(pos, None)
    attn = np.zeros((2, 10))
    attn[:, 2:5] = 1.0
    assert p.evict_observed_rows(attn, pool_kernel=1).victims.tolist() == [5, 6, 7]
    assert p.kept.tolist() == [0, 1, 2, 3, 4, 8, 9]


def test_streaming_llm_protects_its_sinks(backend):
    """StreamingLLM's sinks are its protected prefix; by this rule it evicts by the
    window's scores, not by age."""
    p = held(backend.StreamingLLM, 10, budget=7, sinks=3)
    attn = np.zeros((2, 10))
    attn[:, 3] = 1.0
    attn[:, 4] = 1.0
    assert p.evict_observed(attn, pool_kernel=1) == [5, 6, 7]
    assert p.kept.tolist() == [0, 1, 2, 3, 4, 8, 9]


def test_equal_pooled_scores_evict_the_lower_position(evicting):
    """A kernel wider than the row gives every slot the row's largest score: the lowest
    unprotected positions go."""
    p = held(evicting, 12, budget=7, sinks=1)
    attn = np.random.default_rng(1).random((3, 12))
    assert p.evict_observed(attn, pool_kernel=101) == [1, 2, 3, 4, 5]


def test_pool_kernel_one_is_no_pooling(evicting):
    """pool_kernel=1 ranks by the raw window scores."""
    scores = [0.0, 0.5, 0.1, 0.9, 0.2, 0.7, 0.3, 0.0]
    attn = np.zeros((1, 8))
    attn[0, :7] = scores[:7]
    p = held(evicting, 8, budget=4)
    assert p.evict_observed(attn, pool_kernel=1) == [0, 2, 4, 6]


def test_pool_ends_not_padded(evicting):
    """The pool is clipped at the row's ends and spans protected slots: slot 7 pools
    slots 5..8 (the window's slot 8 included), slot 0 slots 0..2."""
    attn = np.zeros((1, 9))
    attn[0, :8] = [0.3, 0.0, 0.0, 0.0, 0.2, 0.0, 0.0, 0.0]
    p = held(evicting, 9, budget=5)
    # pooled (r = 2): .3 .3 .3 .2 .2 .2 .2 0 (and the window slot 8)
    assert p.evict_observed(attn, pool_kernel=5) == [3, 4, 5, 7]


def test_window_taller_than_a_row(evicting):
    """W > n: every slot is the window's, so a row over budget cannot evict (refused),
    and a row within budget evicts nothing."""
    p = held(evicting, 5, budget=3)
    unchanged(p, InvalidInputError, p.evict_observed_rows, np.zeros((7, 5)))
    assert p.evict_observed_rows(np.zeros((7, 5)), budget=5).counts.tolist() == [0]


def test_survivors_keep_their_state(backend):
    """Survivors keep their votes or scores exactly; the last position stays."""
    for cls in (backend.H2O, backend.Scissorhands, backend.TOVA):
        p = cls(budget=8, recent_window=1)
        rng = np.random.default_rng(5)
        for pos in range(1, 12):
            p.on_decode_step(pos, rng.random(p.kept_count()))
        before = p.state_dict()
        key = "votes" if "votes" in before else "scores"
        out = p.evict_observed_rows(rng.random((3, 12)))
        after = p.state_dict()
        gone = set(out.slots.tolist())
        assert after["kept"][0] == [q for s, q in enumerate(before["kept"][0]) if s not in gone]
        assert after[key][0] == [v for s, v in enumerate(before[key][0]) if s not in gone]
        assert after["last_position"] == before["last_position"]


def test_per_call_budget_does_not_stick(evicting):
    """A per-call budget evicts to it (it may exceed the configured one) and the
    configured budget stays."""
    p = held(evicting, 12, budget=4)
    attn = np.random.default_rng(2).random((2, 12))
    assert len(p.evict_observed(attn, budget=10)) == 2
    assert p.budget == 4
    assert len(p.evict_observed(attn[:, :10])) == 6


# ---------------------------------------------------------------- rows and shapes


def test_ragged_rows(evicting):
    """Rows holding different counts (an extend with an admit mask) each read their own
    window rows; evict_observed refuses rows evicting different numbers."""
    p = build(evicting, budget=4, heads=2)
    chunk = 8
    admit = np.ones((2, chunk), dtype=bool)
    admit[1, [2, 5]] = False
    p.extend(np.full((2, chunk, chunk), 0.1), admit)
    assert p.counts.tolist() == [8, 6]
    attn = np.zeros((2, 2, 8))
    attn[0, :, 1] = 1.0
    attn[1, :, 3] = 1.0  # row 1's slot 3 is position 4
    unchanged(p, InvalidInputError, p.evict_observed, attn, pool_kernel=1)
    out = p.evict_observed_rows(attn, pool_kernel=1)
    assert out.counts.tolist() == [4, 2]
    assert out.victims.tolist() == [0, 2, 3, 4, 0, 1]
    assert p.kept_row(1).tolist() == [3, 4, 6, 7]


def test_evict_observed_shapes(evicting):
    """evict_observed returns as evict does: a list for one head, a (heads, k) array for
    more, with return_indices a pair."""
    p = held(evicting, 9, budget=5, heads=3)
    attn = np.random.default_rng(4).random((3, 2, 9))
    victims, slots = p.evict_observed(attn, return_indices=True)
    assert victims.shape == (3, 4) and victims.dtype == np.uint32
    assert slots.shape == (3, 4) and slots.dtype == np.int64
    q = held(evicting, 9, budget=5)
    v, s = q.evict_observed(attn[0], return_indices=True)
    assert v == victims[0].tolist() and s == slots[0].tolist()


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize(("kwargs", "exc"), [
    ({"budget": 0}, InvalidInputError),
    ({"budget": True}, InvalidTypeError),
    ({"budget": 4.0}, InvalidTypeError),
    ({"pool_kernel": 0}, InvalidInputError),
    ({"pool_kernel": 4}, InvalidInputError),
    ({"pool_kernel": True}, InvalidTypeError),
    ({"pool_kernel": 3.0}, InvalidTypeError),
])
def test_arguments_refused(any_cls, kwargs, exc):
    """Bad budgets and pool kernels are refused before anything changes."""
    p = held(any_cls, 10, budget=6)
    unchanged(p, exc, p.evict_observed_rows, np.zeros((2, 10)), **kwargs)
    unchanged(p, exc, p.evict_observed, np.zeros((2, 10)), **kwargs)


@pytest.mark.parametrize("shape", [(10,), (0, 10), (2, 9), (2, 11), (1, 2, 10), (2, 2, 2, 10)])
def test_shapes_refused(any_cls, shape):
    """attn must be (W, n) or (1, W, n) for one head, W >= 1, n the largest count."""
    p = held(any_cls, 10, budget=6)
    if len(shape) == 3:  # (1, W, n) is accepted for one head
        shape = (2, *shape[1:])
    unchanged(p, InvalidInputError, p.evict_observed_rows, np.zeros(shape))


def test_shape_message_names_the_expected_shape(evicting):
    """The shape error names (heads, W, n)."""
    p = held(evicting, 10, budget=6, heads=2)
    with pytest.raises(InvalidInputError, match=r"\(2, W, 10\)"):
        p.evict_observed_rows(np.zeros((2, 3, 9)))


def test_too_few_candidates_refused(evicting):
    """A row whose sinks and window leave fewer positions than it must evict is refused,
    the message naming them."""
    p = held(evicting, 10, budget=5, sinks=2)
    message = r"window 4 \+ sinks 2 leave only 4 positions to evict in row 0, need 5"
    with pytest.raises(InvalidInputError, match=message):
        p.evict_observed_rows(np.zeros((4, 10)))
    unchanged(p, InvalidInputError, p.evict_observed_rows, np.zeros((4, 10)))
    assert p.evict_observed_rows(np.zeros((3, 10))).counts.tolist() == [5]


def test_a_window_longer_than_the_row_is_named(evicting):
    """A window of more rows than the row holds positions: the refusal says so, and the
    policy is unchanged."""
    p = held(evicting, 8, budget=4)
    message = r"window 9 \+ sinks 0 leave only 0 positions .* the window's 9 rows are the row's last 9 positions, " \
              r"and it holds only 8"
    with pytest.raises(InvalidInputError, match=message):
        p.evict_observed_rows(np.full((9, 8), 0.1))
    unchanged(p, InvalidInputError, p.evict_observed_rows, np.full((9, 8), 0.1))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -1.0])
def test_bad_weights_refused(evicting, bad):
    """A read weight that is NaN, infinite or negative is refused in any row before any
    row changes."""
    p = held(evicting, 10, budget=6, heads=2)
    attn = np.zeros((2, 2, 10))
    attn[1, 1, 3] = bad
    unchanged(p, InvalidInputError, p.evict_observed_rows, attn)
    unchanged(p, InvalidInputError, p.evict_observed_rows, attn.astype(np.float32))


def test_non_numbers_refused(evicting):
    """Weights that are not real numbers are a type error."""
    p = held(evicting, 4, budget=2)
    unchanged(p, InvalidTypeError, p.evict_observed_rows, [["a", "b", "c", "d"]])


def test_pooled_budgets_refused(backend):
    """A pooled policy (pool != 1) is refused: the rule evicts each row on its own."""
    p = backend.H2O(budget=4, recent_window=1, heads=2, pool=2)
    for pos in range(1, 8):
        p.on_decode_step(pos, None)
    with pytest.raises(InvalidInputError, match=r"does not take pooled budgets \(pool=2\)"):
        p.evict_observed_rows(np.zeros((2, 2, 8)))
    unchanged(p, InvalidInputError, p.evict_observed, np.zeros((2, 2, 8)))


@pytest.mark.skipif("asan" in os.environ.get("LD_PRELOAD", ""),
                    reason="an address-space limit and AddressSanitizer's shadow memory do not mix")
def test_allocation_failure_raises_memory_error_and_changes_nothing():
    """The C path's scratch (22 bytes a slot of the fullest row) is allocated before any
    row changes: MemoryError leaves the policy as it was, and the same call succeeds
    once memory allows."""
    script = textwrap.dedent("""
        import resource
        import numpy as np
        import scissorhands as S
        n = 2**24  # 352 MiB of scratch, against a limit 256 MiB above what is used
        p = S.StreamingLLM(budget=8, sinks=0)
        p.extend(np.broadcast_to(np.float32(0), (n, n)))  # attention never read
        window = np.zeros((1, n), dtype=np.float32)
        before = (p.kept_row(0), p.memory_bytes(), repr(p))
        with open("/proc/self/statm") as f:
            used = int(f.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (used + 256 * 2**20, resource.RLIM_INFINITY))
        try:
            p.evict_observed_rows(window)
            outcome = "ok"
        except MemoryError:
            outcome = "MemoryError"
        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        assert np.array_equal(p.kept_row(0), before[0]) and (p.memory_bytes(), repr(p)) == before[1:]
        assert p.evict_observed_rows(window).counts.tolist() == [n - 8]
        print(outcome, p.kept.tolist() == list(range(n - 8, n)))
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "MemoryError True"
