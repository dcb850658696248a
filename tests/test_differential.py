"""Property tests: the C path equals the reference on random operation sequences.

Each example builds the same policy on both backends and applies one random sequence of
operations (decode steps, evictions, fused steps, prefill, chunks with and without
admission masks, row-by-row steps and evictions, row selection, reset, state round trips
across backends, accessor queries), valid and invalid.  Scissorhands, H2O and TOVA
configurations include sinks, and Scissorhands ones a history window and a vote rate.  After every
operation both must
have returned the same value or raised the same class, and hold the same state and
memory.  Weights are float32 or float64, drawn from a coarse grid (multiples of 1/8, so
ties and exact fair shares are common) or from the unit interval.

Chunks, rows of different counts and row selection are also checked against oracles
written independently of both backends: ``extend`` on a fresh policy against
``prefill``, a chunk against the decode steps its admitted tokens stand for (row by row,
each row its own single-head policy), ``step_rows`` on rows of different counts against
independent single-head policies, and ``select_rows`` against the rows picked out of
``state_dict()``.

Every C-path test runs twice: on the kernels this CPU runs by default (AVX2 where it has
it) and on the forced scalar kernels (``c_paths``), whose results must be identical.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from c_paths import BACKEND_PATHS, PATHS, base_backend, on_path, path_of
from conftest import BACKENDS, POLICY_NAMES, load_backend
from hypothesis import given, note, settings
from hypothesis import strategies as st

from scissorhands._shared import UINT32_MAX, merge_spans, pinned_outside
from scissorhands.options import SPECS

GRID = [i / 8 for i in range(9)]
HEAVY_NAMES = tuple(name for name, spec in SPECS.items() if spec.reads_attention)
#: Each per-slot score's lookup by position.
ACCESSORS = {"votes": "votes_of", "scores": "score_of"}


def plain(value: Any) -> Any:
    """Results as comparable plain data (arrays and tuples become lists)."""
    if isinstance(value, np.ndarray):
        return ("array", str(value.dtype), value.tolist())
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def outcome(fn, *args, **kwargs):
    """``("ok", result)`` or ``("raised", exception class name)``."""
    try:
        return ("ok", plain(fn(*args, **kwargs)))
    except (TypeError, ValueError, MemoryError) as exc:
        return ("raised", type(exc).__name__)


# ---------------------------------------------------------------- strategies


HISTORY_WINDOWS = st.none() | st.sampled_from([1, 2, 3, 64]) | st.integers(1, 64)
#: Head counts of most examples: one head twice as often.
SMALL_HEADS = st.sampled_from([1, 1, 2, 3])


@st.composite
def params_for(draw, policy: str, heads: st.SearchStrategy[int] = SMALL_HEADS, pools: bool = False):
    """Constructor parameters of a small policy (with sinks and a history window
    where the policy has them, each often left at its default)."""
    budget = draw(st.integers(1, 8))
    params: dict[str, Any] = {"heads": draw(heads)}
    if policy == "full":
        params["budget"] = draw(st.none() | st.just(budget))
    elif policy == "streaming-llm":
        params["budget"] = budget
        params["sinks"] = draw(st.integers(0, budget - 1))
    else:
        least = SPECS[policy].min_recent_window  # tova always keeps its newest position
        budget = max(budget, least + 1)
        params["budget"] = budget
        params["recent_window"] = draw(st.integers(least, budget - 1))
        sinks = draw(st.just(0) | st.integers(0, budget - 1 - params["recent_window"]))
        if sinks or draw(st.booleans()):
            params["sinks"] = sinks
        if policy == "scissorhands":
            window = draw(HISTORY_WINDOWS)
            if window is not None or draw(st.booleans()):
                params["history_window"] = window
            rate = draw(st.booleans())
            if rate or draw(st.booleans()):
                params["vote_rate"] = rate
        heads = params["heads"]
        if not pools or not SPECS[policy].takes("pool"):  # pooled policies evict only by _rows calls
            return params
        divisors = [d for d in range(1, heads + 1) if heads % d == 0]
        pool = draw(st.sampled_from([1, 1, heads]) | st.sampled_from(divisors))
        if pool != 1 or draw(st.booleans()):
            params["pool"] = pool
    return params


def protected(params: dict[str, Any]) -> int:
    """Positions a policy built with ``params`` never evicts: recent window + sinks."""
    return params.get("recent_window", 0) + params.get("sinks", 0)


@st.composite
def weight_rows(draw, heads: int, n: int):
    """``heads`` rows of ``n`` weights: grid, uniform, exact share, or one bad value."""
    if n == 0:
        return [[] for _ in range(heads)]
    mode = draw(st.sampled_from(["grid", "grid", "uniform", "share", "bad"]))
    if mode == "grid":
        rows = [[draw(st.sampled_from(GRID)) for _ in range(n)] for _ in range(heads)]
    elif mode == "uniform":
        rows = [[draw(st.floats(0, 1)) for _ in range(n)] for _ in range(heads)]
    elif mode == "share":
        rows = [[1.0 / n] * n for _ in range(heads)]
    else:
        rows = [[draw(st.sampled_from(GRID)) for _ in range(n)] for _ in range(heads)]
        h, i = draw(st.integers(0, heads - 1)), draw(st.integers(0, n - 1))
        rows[h][i] = draw(st.sampled_from([math.nan, math.inf, -0.125, -math.inf]))
    return rows


@st.composite
def attention(draw, heads: int, n: int):
    """One step's attention in some accepted form, or (rarely) a malformed one."""
    kind = draw(st.sampled_from(["valid"] * 8 + ["none", "length", "type", "rank"]))
    if kind == "none":
        return None
    if kind == "length":
        # One weight too few or too many (rows holding nothing can only get one too many).
        rows = draw(weight_rows(heads, n + draw(st.sampled_from([-1, 1]) if n else st.just(1))))
    elif kind == "type":
        return draw(st.sampled_from([[True] * n, ["x"] * n, np.zeros(n, dtype=bool),
                                     np.zeros(n, dtype=complex), "weights"]))
    else:
        rows = draw(weight_rows(heads, n))
    dtype = draw(st.sampled_from(["list", np.float32, np.float64]))
    arr: Any = rows if dtype == "list" else np.array(rows, dtype=dtype)
    if kind == "rank":
        return np.zeros((heads, n, 1)) if heads > 1 else np.zeros(())
    if heads == 1 and draw(st.booleans()):
        arr = arr[0]  # (n,) rather than (1, n)
    return arr


def positions(last: int):
    """Mostly the next positions; sometimes an invalid one."""
    return st.one_of(
        st.integers(last + 1, last + 3), st.integers(last + 1, last + 3),
        st.integers(last + 1, last + 3),
        st.sampled_from([last, 0, -1, 2**32, UINT32_MAX, True, 1.5]))


BUDGETS = st.one_of(st.none(), st.none(), st.integers(-1, 12), st.sampled_from([True, 2.0, 2**32]))


@st.composite
def prompts(draw, heads: int):
    """A (P, P) or (heads, P, P) lower-triangular prompt (P in 1..6), float32 or float64."""
    p = draw(st.integers(1, 6))
    grid = np.array([[[draw(st.sampled_from(GRID)) for _ in range(p)] for _ in range(p)]
                     for _ in range(heads)])
    grid = np.tril(grid, -1) + np.triu(np.full_like(grid, np.nan))  # above: never read
    grid = grid.astype(draw(st.sampled_from([np.float32, np.float64])))
    return grid[0] if heads == 1 and draw(st.booleans()) else grid


@st.composite
def chunks(draw, heads: int, base: int):
    """``extend``'s (attn, admit): ``(heads, C, base + C)`` grid weights, C in 1..4, float32
    or float64, now and then a bad value (read or not) or a wrong width; admit None or a
    random bool mask (as an array or lists)."""
    c = draw(st.integers(1, 4))
    width = base + c + draw(st.sampled_from([0] * 10 + [-1, 1]))
    grid = np.array([[[draw(st.sampled_from(GRID)) for _ in range(max(width, 0))] for _ in range(c)]
                     for _ in range(heads)]).reshape(heads, c, max(width, 0))
    if grid.size and draw(st.integers(0, 5)) == 0:
        h, i, j = (draw(st.integers(0, k - 1)) for k in grid.shape)
        grid[h, i, j] = draw(st.sampled_from([math.nan, math.inf, -0.125]))
    attn = grid.astype(draw(st.sampled_from([np.float32, np.float64])))
    admit = None
    if draw(st.booleans()):
        mask = np.array([[draw(st.booleans()) for _ in range(c)] for _ in range(heads)], dtype=bool)
        admit = mask.reshape(heads, c) if draw(st.booleans()) else mask.reshape(heads, c).tolist()
    return attn, admit


# ---------------------------------------------------------------- the differential driver


class Pair:
    """The same policy on both backends, operated in lockstep and compared after each call."""

    def __init__(self, policy: str, params: dict[str, Any]) -> None:
        self.backends = [load_backend(b) for b in BACKENDS]
        self.policy = policy
        self.objs = [b.POLICIES[policy](**params) for b in self.backends]

    @property
    def last(self) -> int:
        return self.objs[1].state_dict()["last_position"]

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        before = [o.state_dict() for o in self.objs]
        outs = [outcome(getattr(o, name), *args, **kwargs) for o in self.objs]
        note(f"{name}{args!r:.200} {kwargs} -> native {outs[0]!r:.200}, reference {outs[1]!r:.200}")
        assert outs[0] == outs[1], f"{name}{args!r} {kwargs}: native {outs[0]} != reference {outs[1]}"
        if outs[0][0] == "raised":
            for o, b in zip(self.objs, before):
                assert o.state_dict() == b, f"{type(o).__module__}: failed {name} changed the state"
        self.check()
        return outs[0]

    def check(self) -> None:
        native, ref = self.objs
        assert native.state_dict() == ref.state_dict()
        assert native.memory_bytes() == ref.memory_bytes()
        assert outcome(native.kept_count) == outcome(ref.kept_count)
        assert native.counts.tolist() == ref.counts.tolist()
        assert outcome(getattr, native, "kept") == outcome(getattr, ref, "kept")

    def round_trip(self) -> None:
        """Each backend loads the other's state."""
        states = [o.state_dict() for o in self.objs]
        self.objs = [b.POLICIES[self.policy].from_state_dict(s)
                     for b, s in zip(self.backends, reversed(states))]
        self.check()


@st.composite
def pins_for(draw, params: dict[str, Any]):
    """Spans a policy built with ``params`` accepts: a few short ones over the first
    positions, often overlapping, adjacent or covering the sinks, each kept only while
    the pinned positions outside the sinks leave something to evict."""
    budget = params.get("budget") or UINT32_MAX
    sinks = params.get("sinks", 0)
    room = budget - 1 - params.get("recent_window", 0) - sinks
    spans: list[tuple[int, int]] = []
    for start, length in draw(st.lists(st.tuples(st.integers(0, 24), st.integers(1, 5)), max_size=4)):
        merged = merge_spans(spans, [(start, start + length)])
        if pinned_outside(merged, sinks) <= room:
            spans = merged
    return spans


def span_args():
    """``pin()``'s arguments: mostly short spans over the first positions, sometimes
    empty, reversed, out of range or not integers."""
    return st.one_of(
        st.integers(0, 24).flatmap(lambda a: st.tuples(st.just(a), st.integers(a + 1, a + 6))),
        st.integers(0, 24).flatmap(lambda a: st.tuples(st.just(a), st.integers(a + 1, a + 6))),
        st.sampled_from([(3, 3), (5, 2), (-1, 2), (0, 2**32), (True, 2), (0, 2.0)]))


def run_operations(data, policy: str, params: dict[str, Any], max_ops: int = 30, pins: bool = False) -> None:
    pair = Pair(policy, params)
    heads = params["heads"]
    for _ in range(data.draw(st.integers(1, max_ops))):
        op = data.draw(st.sampled_from(
            ["decode"] * 4 + ["step"] * 4 + ["evict"] * 2 + ["prefill", "reset", "roundtrip", "query"]
            + ["extend"] * 2 + ["step_rows", "evict_rows", "select"] + ["pin"] * (2 if pins else 0)))
        heads = pair.objs[1].heads
        n = int(pair.objs[1].counts.max())
        if op == "pin":
            pair.call("pin", *data.draw(span_args()))
        elif op == "decode":
            pair.call("on_decode_step", data.draw(positions(pair.last)), data.draw(attention(heads, n)))
        elif op == "step":
            pair.call("step", data.draw(positions(pair.last)), data.draw(attention(heads, n)),
                      data.draw(BUDGETS), return_indices=data.draw(st.booleans()))
        elif op == "evict":
            pair.call("evict", data.draw(BUDGETS), return_indices=data.draw(st.booleans()))
        elif op == "prefill":
            pair.call("prefill", data.draw(prompts(heads)))
        elif op == "extend":
            state = pair.objs[1].state_dict()
            fresh = state["last_position"] == 0 and all(len(r) == 1 for r in state["kept"])
            attn, admit = data.draw(chunks(heads, 0 if fresh else n))
            pair.call("extend", attn, admit)
        elif op == "step_rows":
            pair.call("step_rows", data.draw(positions(pair.last)), data.draw(attention(heads, n)),
                      data.draw(BUDGETS))
        elif op == "evict_rows":
            pair.call("evict_rows", data.draw(BUDGETS))
        elif op == "select":
            pair.call("select_rows", data.draw(st.lists(st.integers(-1, heads), min_size=0, max_size=4)))
        elif op == "reset":
            pair.call("reset")
        elif op == "roundtrip":
            pair.round_trip()
        else:
            pos = data.draw(st.one_of(st.integers(-2, pair.last + 2),
                                      st.sampled_from([2**32, UINT32_MAX, True, 1.0])))
            # An invalid head with a valid pos only: with both invalid the order of the
            # two checks is pinned in test_semantics instead.
            valid_pos = isinstance(pos, int) and not isinstance(pos, bool)
            head = data.draw(st.integers(-1, heads) if valid_pos else st.integers(0, heads - 1))
            if policy in HEAVY_NAMES and data.draw(st.integers(0, 3)) == 0:
                pair.call("sink_count")
            elif SPECS[policy].score_key:
                pair.call(ACCESSORS[SPECS[policy].score_key], pos, head)
            elif policy == "streaming-llm":
                pair.call("sink_count")
            else:
                pair.call("kept_count")


# ---------------------------------------------------------------- properties


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize("c_path", PATHS)
@given(data=st.data())
def test_native_equals_reference(c_path, policy, data):
    """Random valid and invalid operation sequences give the same results, errors and state."""
    with on_path(c_path):
        run_operations(data, policy, data.draw(params_for(policy, pools=True)))


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize("c_path", PATHS)
@given(data=st.data())
def test_native_equals_reference_with_pins(c_path, policy, data):
    """With spans pinned at construction and by pin() between the operations, random
    valid and invalid sequences give the same results, errors and state."""
    with on_path(c_path):
        params = data.draw(params_for(policy, pools=True))
        params["pins"] = data.draw(pins_for(params))
        run_operations(data, policy, params, pins=True)


@pytest.mark.parametrize("policy", [name for name in POLICY_NAMES if SPECS[name].evicts])
@pytest.mark.parametrize("c_path", PATHS)
@given(data=st.data())
def test_pinned_decode_stream_agrees(c_path, policy, data):
    """A long decode stream with pinned spans, evicting every step (the single victim)
    and now and then to a smaller per-call budget (many victims at once), agrees."""
    with on_path(c_path):
        params = data.draw(params_for(policy, heads=st.sampled_from([1, 2])))
        params["budget"] = params["budget"] + 6  # room for spans besides the protected
        params["pins"] = data.draw(pins_for(params))
        pair = Pair(policy, params)
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
        dtype = data.draw(st.sampled_from([np.float32, np.float64]))
        for t in range(1, 80):
            n = int(pair.objs[1].counts.max())
            w = (rng.integers(0, 9, (params["heads"], n)) / 8).astype(dtype)
            budget = None if t % 9 else int(rng.integers(1, params["budget"] + 1))
            pair.call("step_rows", t, w, budget)


#: The long sequences: TOVA shares H2O's selection (and test_kernels holds its two kernel
#: paths to each other), so it runs on the default path only, keeping the slow test short.
LONG_CASES = [(c, p) for p in ("scissorhands", "h2o") for c in PATHS] + [("simd", "tova")]


@pytest.mark.slow
@pytest.mark.parametrize(("c_path", "policy"), LONG_CASES)
@given(data=st.data())
def test_native_equals_reference_long_sequences(c_path, policy, data):
    """Long sequences with eviction postponed: growth, batching and many ties agree."""
    with on_path(c_path):
        run_operations(data, policy, data.draw(params_for(policy, heads=st.just(2), pools=True)), max_ops=150)


@pytest.mark.parametrize("policy", HEAVY_NAMES)
@pytest.mark.parametrize("c_path", PATHS)
@given(data=st.data())
def test_decode_stream_agrees(c_path, policy, data):
    """A long valid decode stream (float32 or float64, grid or uniform) evicting every step agrees."""
    with on_path(c_path):
        params = data.draw(params_for(policy))
        pair = Pair(policy, params)
        dtype = data.draw(st.sampled_from([np.float32, np.float64]))
        grid = data.draw(st.booleans())
        seed = data.draw(st.integers(0, 2**32 - 1))
        rng = np.random.default_rng(seed)
        for t in range(1, 120):
            n = pair.objs[1].kept_count()
            w = (rng.integers(0, 9, (params["heads"], n)) / 8 if grid
                 else rng.random((params["heads"], n))).astype(dtype)
            results = [plain(o.step(t, w, return_indices=True)) for o in pair.objs]
            assert results[0] == results[1], f"step {t}"
            assert pair.objs[0].state_dict() == pair.objs[1].state_dict(), f"step {t}"
        pair.check()


@pytest.mark.parametrize("backend_name", BACKEND_PATHS)
@pytest.mark.parametrize("policy", POLICY_NAMES)
@given(data=st.data())
def test_heads_equal_independent_policies(backend_name, policy, data):
    """A heads=H policy behaves as H single-head policies, each fed its own row."""
    with on_path(path_of(backend_name)):
        backend = load_backend(base_backend(backend_name))
        params = data.draw(params_for(policy, heads=st.integers(2, 4)))
        heads = params.pop("heads")
        cls = backend.POLICIES[policy]
        multi = cls(heads=heads, **params)
        singles = [cls(**params) for _ in range(heads)]
        if data.draw(st.booleans()):
            prompt = data.draw(prompts(heads))
            multi.prefill(prompt)
            for h, s in enumerate(singles):
                s.prefill(prompt[h])
        pos = multi.state_dict()["last_position"]
        for _ in range(data.draw(st.integers(1, 40))):
            pos += data.draw(st.integers(1, 3))
            n = multi.kept_count()
            rows = data.draw(st.lists(st.lists(st.sampled_from(GRID), min_size=n, max_size=n),
                                      min_size=heads, max_size=heads))
            w = np.array(rows, dtype=data.draw(st.sampled_from([np.float32, np.float64])))
            floor = protected(params) + 1
            budget = data.draw(st.none() | st.integers(floor, 9))
            victims, slots = multi.step(pos, w, budget, return_indices=True)
            for h, s in enumerate(singles):
                v, sl = s.step(pos, w[h], budget, return_indices=True)
                assert victims[h].tolist() == v and slots[h].tolist() == sl
        state = multi.state_dict()
        for h, s in enumerate(singles):
            single = s.state_dict()
            for key in ("kept", "votes", "scores", "history"):
                if key in state:
                    assert state[key][h] == single[key][0]
            assert state["last_position"] == single["last_position"]


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize("c_path", PATHS)
@given(data=st.data())
def test_from_state_dict_agrees_on_mutated_states(c_path, policy, data):
    """Both backends accept or refuse (with the same class) a state with one corrupted value."""
    with on_path(c_path):
        params = data.draw(params_for(policy))
        pair = Pair(policy, params)
        for t in range(1, data.draw(st.integers(1, 12))):
            for o in pair.objs:
                n = o.kept_count()
                o.on_decode_step(t, np.full((params["heads"], n), 0.5) if t % 3 else
                                 np.eye(1, n, t % n).repeat(params["heads"], axis=0))
        state = pair.objs[1].state_dict()
        fields = ["kept", "last_position"] + [k for k in ("votes", "scores", "history", "steps_held")
                                              if k in state]
        if policy in HEAVY_NAMES:
            fields.append("params")
        field = data.draw(st.sampled_from(fields))
        if field == "last_position":
            state[field] = data.draw(st.sampled_from([-1, 0, 2**32, 1.0, None])
                                     | st.integers(0, state[field] + 2))
        elif field == "params":
            # The optional parameters: dropped (an older state), or set to any value.
            # TOVA's recent window too: 0 (or none) is refused by both.
            key = data.draw(st.sampled_from(["sinks", "history_window", "vote_rate"]
                                            if policy == "scissorhands" else
                                            ["sinks", "recent_window"] if policy == "tova" else ["sinks"]))
            if key in state["params"] and data.draw(st.booleans()):
                del state["params"][key]
            else:
                state["params"][key] = data.draw(
                    st.sampled_from([None, -1, 0, 1, 2, 64, 65, 2.0, True, False, 0.5]) | st.integers(0, 8))
        elif field in ("history", "steps_held"):
            h = data.draw(st.integers(0, params["heads"] - 1))
            i = data.draw(st.integers(0, len(state[field][h]) - 1))
            bad = st.sampled_from([-1, 2**64, 2**64 - 1, 2**32, 1.0, True, None]) | st.integers(0, 20)
            state[field][h][i] = data.draw(bad)
        else:
            h = data.draw(st.integers(0, params["heads"] - 1))
            i = data.draw(st.integers(0, len(state[field][h]) - 1))
            if field == "scores":
                bad = st.sampled_from([-0.5, math.nan, "1", None, 1]) | st.floats(0, 4)
            else:
                bad = st.sampled_from([-1, 2**32, UINT32_MAX, 1.0, True, None]) | st.integers(0, 20)
            state[field][h][i] = data.draw(bad)
        note(f"state: {state}")
        outs = []
        for b in pair.backends:
            try:
                outs.append(("ok", b.POLICIES[policy].from_state_dict(state).state_dict()))
            except (TypeError, ValueError) as exc:
                outs.append(("raised", type(exc).__name__))
        assert outs[0] == outs[1]


# ---------------------------------------------------------------- chunks, rows, selection


@st.composite
def fresh_prompts(draw, heads: int):
    """A ``(heads, P, P)`` causal prompt for ``prefill`` (P in 1..6), NaN above the
    diagonal (never read), float32 or float64."""
    p = draw(st.integers(1, 6))
    grid = np.array([[[draw(st.sampled_from(GRID)) for _ in range(p)] for _ in range(p)]
                     for _ in range(heads)]).reshape(heads, p, p)
    grid = np.tril(grid, -1) + np.triu(np.full_like(grid, np.nan))
    return grid.astype(draw(st.sampled_from([np.float32, np.float64])))


@pytest.mark.parametrize("backend_name", BACKEND_PATHS)
@pytest.mark.parametrize("policy", POLICY_NAMES)
@given(data=st.data())
def test_extend_on_a_fresh_policy_is_prefill(backend_name, policy, data):
    """On a fresh policy extend(attn) leaves exactly the state (and memory) prefill(attn) leaves."""
    with on_path(path_of(backend_name)):
        backend = load_backend(base_backend(backend_name))
        params = data.draw(params_for(policy, heads=st.integers(1, 3)))
        prompt = data.draw(fresh_prompts(params["heads"]))
        a, b = (backend.POLICIES[policy](**params) for _ in range(2))
        if data.draw(st.booleans()):  # fresh again after a reset
            for p in (a, b):
                p.on_decode_step(1, None)
                p.reset()
        a.prefill(prompt)
        b.extend(prompt)
        assert a.state_dict() == b.state_dict() and a.memory_bytes() == b.memory_bytes()


def _decode_steps_oracle(cls, params, state, attn, mask, fresh, unread=False):
    """What a chunk does to one row, written as the decode steps it stands for: a
    single-head policy loaded with the row's state takes on_decode_step for each token the
    row admits, over the weights of what the row holds at that moment (``unread``: with
    no weights)."""
    p = cls.from_state_dict(state)
    n = len(state["kept"][0])
    first = 0 if fresh else state["last_position"] + 1
    joined: list[int] = []
    for i in range(attn.shape[0]):
        if fresh and i == 0:
            if mask[0]:
                joined.append(0)
                continue
            st0 = p.state_dict()  # position 0 leaves the row
            for key in ("kept", "votes", "scores", "history", "steps_held"):
                if key in st0:
                    st0[key] = [[]]
            p = cls.from_state_dict(st0)
            continue
        if not mask[i]:
            continue
        cols = list(range(0 if fresh else n)) + [(0 if fresh else n) + j for j in joined]
        p.on_decode_step(first + i, None if unread else attn[i, cols])
        joined.append(i)
    return p


@pytest.mark.parametrize("backend_name", BACKEND_PATHS)
@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize("unread", [False, True])
@given(data=st.data())
def test_extend_equals_the_decode_steps_of_its_admitted_tokens(backend_name, policy, data, unread):
    """Each row after extend(attn, admit) holds what its admitted tokens' decode steps give;
    with unread=True, the steps without weights (no weight read: NaN everywhere is taken)."""
    with on_path(path_of(backend_name)):
        backend = load_backend(base_backend(backend_name))
        cls = backend.POLICIES[policy]
        params = data.draw(params_for(policy, heads=st.integers(1, 3)))
        heads = params["heads"]
        multi = cls(**params)
        for t in range(1, data.draw(st.integers(0, 6)) + 1):  # 0 steps: fresh
            n = multi.kept_count()
            multi.step(t, np.array([[data.draw(st.sampled_from(GRID)) for _ in range(n)] for _ in range(heads)])
                       if t % 2 else None)
        state = multi.state_dict()
        fresh = state["last_position"] == 0
        n = 0 if fresh else multi.kept_count()
        c = data.draw(st.integers(1, 5))
        attn = np.array([[[data.draw(st.sampled_from(GRID)) for _ in range(n + c)] for _ in range(c)]
                         for _ in range(heads)]).reshape(heads, c, n + c)
        mask = np.array([[data.draw(st.booleans()) for _ in range(c)] for _ in range(heads)], dtype=bool)
        multi.extend(np.full_like(attn, np.nan) if unread else attn, mask, unread=unread)
        got = multi.state_dict()
        single = dict(params, heads=1)
        for h in range(heads):
            row_state = {**state, "params": {**state["params"], "heads": 1},
                         **{k: [state[k][h]] for k in ("kept", "votes", "scores", "history", "steps_held")
                            if k in state}}
            want = _decode_steps_oracle(cls, single, row_state, attn[h], mask[h], fresh, unread).state_dict()
            for key in ("kept", "votes", "scores", "history", "steps_held"):
                if key in got:
                    assert got[key][h] == want[key][0], f"row {h} {key}"
        assert got["last_position"] == (c - 1 if fresh else state["last_position"] + c)


@pytest.mark.parametrize("backend_name", BACKEND_PATHS)
@pytest.mark.parametrize("policy", POLICY_NAMES)
@given(data=st.data())
def test_rows_of_different_counts_equal_independent_policies(backend_name, policy, data):
    """step_rows on rows of different counts gives, row by row, what independent single-head
    policies give (the same victims, slots and state)."""
    with on_path(path_of(backend_name)):
        backend = load_backend(base_backend(backend_name))
        cls = backend.POLICIES[policy]
        params = data.draw(params_for(policy, heads=st.integers(2, 4)))
        heads = params.pop("heads")
        multi = cls(heads=heads, **params)
        # Rows of different counts from a state: each row keeps some of positions 0..6.
        kept = [sorted(data.draw(st.sets(st.integers(0, 6), max_size=6))) for _ in range(heads)]
        state = multi.state_dict()
        state["kept"] = kept
        if "votes" in state:
            state["votes"] = [[0] * len(r) for r in kept]
        if "scores" in state:
            state["scores"] = [[0.0] * len(r) for r in kept]
        for key in ("history", "steps_held"):
            if key in state:
                state[key] = [[0] * len(r) for r in kept]
        state["last_position"] = 6
        multi = cls.from_state_dict(state)
        singles = []
        for h in range(heads):
            one = {**state, "params": {**state["params"], "heads": 1},
                   **{k: [state[k][h]] for k in ("kept", "votes", "scores", "history", "steps_held") if k in state}}
            singles.append(cls.from_state_dict(one))
        pos = 6
        for _ in range(data.draw(st.integers(1, 25))):
            pos += data.draw(st.integers(1, 3))
            counts = multi.counts.tolist()
            w = np.array([[data.draw(st.sampled_from(GRID)) for _ in range(max(counts))] for _ in range(heads)],
                         dtype=data.draw(st.sampled_from([np.float32, np.float64]))).reshape(heads, max(counts))
            budget = data.draw(st.none() | st.integers(protected(params) + 1, 9))
            if data.draw(st.integers(0, 3)) == 0:
                got = multi.evict_rows(budget)
                outs = [s.evict(budget, return_indices=True) for s in singles]
                pos -= 1
            else:
                got = multi.step_rows(pos, w, budget)
                outs = [s.step(pos, w[h, :counts[h]], budget, return_indices=True) for h, s in enumerate(singles)]
            assert got.counts.tolist() == [len(v) for v, _ in outs]
            assert got.victims.tolist() == [p for v, _ in outs for p in v]
            assert got.slots.tolist() == [i for _, sl in outs for i in sl]
        final = multi.state_dict()
        for h, s in enumerate(singles):
            one = s.state_dict()
            for key in ("kept", "votes", "scores", "history", "steps_held"):
                if key in final:
                    assert final[key][h] == one[key][0]


@pytest.mark.parametrize("backend_name", BACKEND_PATHS)
@pytest.mark.parametrize("policy", POLICY_NAMES)
@given(data=st.data())
def test_select_rows_picks_rows_out_of_the_state(backend_name, policy, data):
    """After select_rows(index), state_dict() holds old row index[i] as row i (every per-slot
    field), heads is len(index), and later steps behave as on a policy loaded with that state."""
    with on_path(path_of(backend_name)):
        backend = load_backend(base_backend(backend_name))
        cls = backend.POLICIES[policy]
        params = data.draw(params_for(policy, heads=st.integers(1, 3)))
        p = cls(**params)
        for t in range(1, data.draw(st.integers(0, 8)) + 1):
            n = int(p.counts.max())
            if data.draw(st.booleans()):
                p.step_rows(t, np.array([[data.draw(st.sampled_from(GRID)) for _ in range(n)]
                                         for _ in range(p.heads)]), None)
            else:  # a chunk that leaves tokens out of some rows: rows of different counts
                fresh = p.state_dict()["last_position"] == 0 and p.counts.tolist() == [1] * p.heads
                base = 0 if fresh else n
                p.extend(np.full((p.heads, 2, base + 2), 0.25),
                         np.array([[data.draw(st.booleans()) for _ in range(2)] for _ in range(p.heads)]))
                break
        before = p.state_dict()
        index = data.draw(st.lists(st.integers(0, p.heads - 1), min_size=1, max_size=5))
        p.select_rows(np.array(index) if data.draw(st.booleans()) else index)
        after = p.state_dict()
        assert after["params"] == {**before["params"], "heads": len(index)} and p.heads == len(index)
        for key in ("kept", "votes", "scores", "history", "steps_held"):
            if key in before:
                assert after[key] == [before[key][i] for i in index]
        loaded = cls.from_state_dict(after)
        t = after["last_position"] + 1
        w = np.full((len(index), int(p.counts.max())), 0.5)
        assert plain(p.step_rows(t, w, None)) == plain(loaded.step_rows(t, w, None))
        assert p.state_dict() == loaded.state_dict()


@pytest.mark.parametrize("c_path", PATHS)
@pytest.mark.parametrize(("policy", "heads", "pool"), [("scissorhands", 12, 12), ("scissorhands", 12, 4),
                                                       ("h2o", 6, 3), ("h2o", 12, 12)])
@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_large_pools_agree(c_path, policy, heads, pool, seed):
    """Pools whose evictions take the selection path (more than 8 victims per call: a
    chunk, and twelve rows admitting one position each), with many equal votes, give
    the reference's victims, slots and state."""
    rng = np.random.default_rng(seed)
    with on_path(c_path):
        pair = Pair(policy, {"budget": 10, "recent_window": 2, "sinks": 1, "heads": heads, "pool": pool})
        chunk = rng.choice([0.0, 0.01, 0.05, 0.2], size=(heads, 40, 40))
        pair.call("extend", chunk)
        pair.call("evict_rows")
        for t in range(40, 70):
            n = int(pair.objs[1].counts.max())
            pair.call("step_rows", t, rng.choice([0.0, 0.02, 0.1, 0.3], size=(heads, n)))


# ---------------------------------------------------------------- the observation window


#: pool_kernel values: small odd ones, 15 (the default), wider than any row, the largest,
#: and refused ones (even, 0, bool, float).
POOL_KERNELS = st.one_of(st.sampled_from([1, 1, 3, 3, 5, 7, 15, 101, UINT32_MAX]), st.integers(1, 9),
                         st.sampled_from([1, 3, 5, 0, 2, True, 3.0]))


@st.composite
def observation(draw, heads: int, n: int):
    """An observation window for rows of at most ``n``: ``(heads, W, n)`` (or ``(W, n)``),
    W in 1..n + 3 (taller than some rows or all), grid weights (many equal scores, more
    ties once max-pooled) or uniform ones, float32 or float64, now and then a bad value
    (read or not) or a wrong shape."""
    window = draw(st.integers(1, 3) | st.integers(1, 3) | st.integers(1, n + 3))
    width = n + draw(st.sampled_from([0] * 12 + [-1, 1]))
    if draw(st.integers(0, 20)) == 0:
        window = 0
    if draw(st.integers(0, 3)) == 0:
        grid = np.array([[[draw(st.floats(0, 1)) for _ in range(max(width, 0))] for _ in range(window)]
                         for _ in range(heads)])
    else:
        grid = np.array([[[draw(st.sampled_from(GRID[:3])) for _ in range(max(width, 0))]
                          for _ in range(window)] for _ in range(heads)])
    grid = grid.reshape(heads, window, max(width, 0))
    if grid.size and draw(st.integers(0, 10)) == 0:
        h, j, i = (draw(st.integers(0, k - 1)) for k in grid.shape)
        grid[h, j, i] = draw(st.sampled_from([math.nan, math.inf, -0.125]))
    attn = grid.astype(draw(st.sampled_from([np.float32, np.float64])))
    return attn[0] if heads == 1 and draw(st.booleans()) else attn


def grow_rows(data, pair: Pair) -> None:
    """Random valid history before the window: a chunk with an admission mask (rows of
    different counts), decode steps with grid weights, sometimes an eviction."""
    heads = pair.objs[1].heads
    chunk = data.draw(st.integers(1, 14))
    admit = np.array([[data.draw(st.integers(0, 4)) > 0 for _ in range(chunk)] for _ in range(heads)])
    weights = np.array([[[data.draw(st.sampled_from(GRID)) for _ in range(chunk)] for _ in range(chunk)]
                        for _ in range(heads)]).reshape(heads, chunk, chunk)
    pair.call("extend", weights, admit if data.draw(st.booleans()) else None)
    for _ in range(data.draw(st.integers(0, 6))):
        n = int(pair.objs[1].counts.max())
        w = np.array([[data.draw(st.sampled_from(GRID)) for _ in range(n)] for _ in range(heads)])
        pair.call("on_decode_step", pair.last + 1, w.reshape(heads, n))
    if data.draw(st.integers(0, 4)) == 0:
        pair.call("evict_rows", None)


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize("c_path", PATHS)
@given(data=st.data())
def test_evict_observed_agrees(c_path, policy, data):
    """evict_observed and evict_observed_rows give the reference's victims, slots, errors
    and state: ragged rows, windows taller than rows, ties (grid weights, max-pooling),
    kernels 1 to 2**32 - 1, float32 and float64, bad values and shapes, pooled policies."""
    with on_path(c_path):
        pair = Pair(policy, data.draw(params_for(policy, pools=True)))
        grow_rows(data, pair)
        for _ in range(data.draw(st.integers(1, 4))):
            heads = pair.objs[1].heads
            n = int(pair.objs[1].counts.max())
            attn = data.draw(observation(heads, n))
            budget = data.draw(st.one_of(BUDGETS, st.none(), st.integers(1, max(1, n - 1)),
                                         st.integers(1, max(1, n - 1))))
            kernel = data.draw(POOL_KERNELS)
            if data.draw(st.booleans()):
                pair.call("evict_observed_rows", attn, budget, kernel)
            else:
                pair.call("evict_observed", attn, budget, kernel, return_indices=data.draw(st.booleans()))
            if data.draw(st.booleans()):
                pair.call("on_decode_step", pair.last + 1, np.full((heads, int(pair.objs[1].counts.max())), 0.125))


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize("c_path", PATHS)
@given(data=st.data())
def test_evict_observed_with_pins_agrees(c_path, policy, data):
    """With pinned spans (at construction and pinned between the calls), evict_observed
    and evict_observed_rows protect the pinned positions and refuse rows they leave too
    few, exactly as the reference does."""
    with on_path(c_path):
        params = data.draw(params_for(policy, pools=True))
        params["pins"] = data.draw(pins_for(params))
        pair = Pair(policy, params)
        grow_rows(data, pair)
        for _ in range(data.draw(st.integers(1, 4))):
            if data.draw(st.booleans()):
                pair.call("pin", *data.draw(span_args()))
            heads = pair.objs[1].heads
            n = int(pair.objs[1].counts.max())
            attn = data.draw(observation(heads, n))
            budget = data.draw(st.one_of(BUDGETS, st.none(), st.integers(1, max(1, n - 1))))
            kernel = data.draw(POOL_KERNELS)
            if data.draw(st.booleans()):
                pair.call("evict_observed_rows", attn, budget, kernel)
            else:
                pair.call("evict_observed", attn, budget, kernel, return_indices=data.draw(st.booleans()))


@pytest.mark.parametrize("c_path", PATHS)
@pytest.mark.parametrize("policy", ("h2o", "scissorhands", "streaming-llm"))
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), kernel=st.sampled_from([1, 7, 15, 21]))
def test_evict_observed_agrees_on_long_rows(c_path, policy, seed, kernel):
    """Rows of a few hundred positions (a prompt's end) evicted to a quarter by a
    16-row window: the selection's radix passes over many candidates, equal pooled
    scores included, agree with the reference."""
    rng = np.random.default_rng(seed)
    with on_path(c_path):
        params: dict[str, Any] = {"budget": 64, "sinks": 4, "heads": 3}
        if policy != "streaming-llm":
            params["recent_window"] = 8
        pair = Pair(policy, params)
        n = 200 + int(rng.integers(0, 100))
        chunk = rng.choice([0.0, 0.01, 0.05, 0.2], size=(3, n, n)).astype(rng.choice([np.float32, np.float64]))
        pair.call("extend", chunk, rng.random((3, n)) > 0.1)
        width = int(pair.objs[1].counts.max())
        window = rng.choice([0.0, 0.001, 0.25, 1.0], size=(3, 16, width))
        pair.call("evict_observed_rows", window, None, kernel)


@pytest.mark.parametrize("c_path", PATHS)
@pytest.mark.parametrize(("policy", "heads", "pool"), [("scissorhands", 12, 4), ("h2o", 12, 12), ("tova", 6, 3)])
@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_large_pools_with_pins_agree(c_path, policy, heads, pool, seed):
    """Pooled evictions through the selection path (many victims a call) leave pinned
    positions alone and give the reference's victims, slots, refusals and state."""
    rng = np.random.default_rng(seed)
    with on_path(c_path):
        pair = Pair(policy, {"budget": 20, "recent_window": 2, "sinks": 1, "heads": heads, "pool": pool,
                             "pins": [(3, 9), (20, 24), (45, 47)]})
        chunk = rng.choice([0.0, 0.01, 0.05, 0.2], size=(heads, 40, 40))
        pair.call("extend", chunk)
        assert pair.call("evict_rows", 6)[0] == "raised"  # the pins leave each pool too few
        pair.call("evict_rows")
        for t in range(40, 70):
            n = int(pair.objs[1].counts.max())
            pair.call("step_rows", t, rng.choice([0.0, 0.02, 0.1, 0.3], size=(heads, n)),
                      None if t % 7 else 14)
        assert not {3, 4, 5, 6, 7, 8, 20, 21, 22, 23, 45, 46} - set(pair.objs[0].kept_row(0).tolist())
