"""Scenarios shared by the policies that rank by attention (every registry policy that reads
it): their accessors', constructors' and states' refusals, and their options' (sinks,
history window)."""

from __future__ import annotations

from typing import Any

from vector_cases.writing import IIE, ITE, case, on, s, state

# --------------------------------------------------------------------------------------
# Scenarios shared by the policies that rank by attention.
# --------------------------------------------------------------------------------------


def _heavy_hitter_errors(accessor: str, missing: Any) -> list[dict[str, Any]]:
    """Every bad call a policy that ranks by attention refuses, holding {0, 1}, budget 3, window 1."""
    return [
        on(1, [1.0]),
        on(1, [1.0, 0.0], raises=IIE),               # not above the last position
        on(0, None, raises=IIE),
        on(-1, None, raises=IIE),
        on(2**32, None, raises=IIE),
        on(True, [0.5, 0.5], raises=ITE),
        on(2.0, [0.5, 0.5], raises=ITE),
        on("2", [0.5, 0.5], raises=ITE),
        on(1, "garbage", raises=IIE),                 # the position is checked first
        on(2, [0.5], raises=IIE),                     # too short
        on(2, [0.5, 0.25, 0.25], raises=IIE),         # too long
        on(2, [[0.5, 0.5], [0.5, 0.5]], raises=IIE),  # two rows for one head
        on(2, [[[0.5, 0.5]]], raises=IIE),            # rank 3
        on(2, 0.5, raises=IIE),                       # rank 0
        on(2, [True, 0.5], raises=ITE),
        on(2, ["0.5", 0.5], raises=ITE),
        on(2, "ab", raises=ITE),
        on(2, ["a"], raises=ITE),                     # the type is checked before the length
        on(2, [0.5, -0.25], raises=IIE),
        on(2, [-0.25], raises=IIE),
        s("evict", 0, raises=IIE),
        s("evict", 1, raises=IIE),                    # = recent_window, with nothing to evict
        s("evict", True, raises=ITE),
        s("evict", 2.0, raises=ITE),
        s("evict", 2**32, raises=IIE),
        s("step", 2, [0.5, 0.5], 1, raises=IIE),
        s("step", 2, [True], 1, raises=IIE),          # the budget is checked before the weights
        s("step", 2, [0.5], 2, raises=IIE),           # a bad step admits nothing
        s("step", 1, [0.5, 0.5], 2, raises=IIE),
        s("prefill", [[1.0]], raises=IIE),            # not fresh
        s(accessor, 1.0, raises=ITE),
        s(accessor, True, raises=ITE),
        s(accessor, "0", raises=ITE),
        s(accessor, 0, 1, raises=IIE),                # head out of range
        s(accessor, 0, -1, raises=IIE),
        s(accessor, 0, True, raises=ITE),
        s(accessor, -1, expect=missing),
        s(accessor, 2**32, expect=missing),
        s(accessor, 2**32 - 1, expect=missing),
        s(accessor, 2, expect=missing),               # never admitted
        s("kept", expect=[0, 1]),
        on(2, [[0.5, 0.5]]),                          # (1, n) is accepted for one head
        s("kept", expect=[0, 1, 2]),
    ]


def _constructor_errors(window: str) -> list[dict[str, Any]]:
    """Bad constructor parameters, for a policy whose protected count is ``window``."""
    bad = [
        ("budget 0 is refused", IIE, {"budget": 0, window: 0}),
        ("budget above 2**32-1 is refused", IIE, {"budget": 2**32, window: 0}),
        ("a bool budget is refused", ITE, {"budget": True, window: 0}),
        ("a float budget is refused", ITE, {"budget": 4.0, window: 0}),
        (f"{window} equal to the budget is refused", IIE, {"budget": 4, window: 4}),
        (f"a negative {window} is refused", IIE, {"budget": 4, window: -1}),
        *([("a float recent_window of 1 or more is refused (a fraction must be in [0, 1))", IIE,
            {"budget": 4, window: 1.0}),
           ("a negative fraction recent_window is refused", IIE, {"budget": 4, window: -0.25}),
           ("a string recent_window is refused", ITE, {"budget": 4, window: "1"})]
          if window == "recent_window" else
          [(f"a float {window} is refused", ITE, {"budget": 4, window: 1.0})]),
        ("heads 0 is refused", IIE, {"budget": 4, window: 1, "heads": 0}),
        ("heads above 65536 is refused", IIE, {"budget": 4, window: 1, "heads": 65537}),
        ("a bool heads is refused", ITE, {"budget": 4, window: 1, "heads": True}),
    ]
    return [case(f"constructor: {name}", "Construction validates every integer parameter.",
                 [], raises=err, **params) for name, err, params in bad]


def _state_errors(policy: str, params: dict[str, Any], key: str | None, good: Any,
                  bad_score: Any) -> list[dict[str, Any]]:
    """Bad state dicts ``from_state_dict`` refuses (``good``/``bad_score``: a score value)."""
    def st(kept: Any, last: Any = 5, scores: Any = None, **over: Any) -> dict[str, Any]:
        extra = {} if key is None else {key: scores if scores is not None
                                        else [[good] * len(r) for r in kept]}
        d = state(policy, dict(params), kept, last, **extra)
        d.update(over)
        return d

    heads2 = dict(params, heads=2)
    bad: list[tuple[str, str, dict[str, Any]]] = [
        ("positions not ascending", IIE, st([[0, 3, 2]])),
        ("a repeated position", IIE, st([[0, 2, 2]])),
        ("a position above last_position", IIE, st([[0, 2, 6]])),
        ("a negative position", IIE, st([[-1, 2]])),
        ("a float position", ITE, st([[0, 2.0]])),
        ("rows not a list of lists", ITE, st([0, 2], scores=[[good, good]])),
        ("more rows than heads", IIE, st([[0], [0]])),
        ("fewer rows than heads", IIE, dict(st([[0, 1]]), params=heads2)),
        ("a row ascending but the next row not", IIE, dict(st([[0, 1], [3, 2]]), params=heads2)),
        ("a bool last_position", ITE, st([[0, 2]], last=True)),
        ("the wrong format", IIE, st([[0, 2]], format="scissorhands.other")),
        ("an unknown version", IIE, st([[0, 2]], version=2)),
        ("another policy's name", IIE, st([[0, 2]], policy="full" if policy != "full" else "h2o")),
        ("an unknown parameter", IIE, st([[0, 2]], params=dict(params, window=3))),
        ("a missing parameter", IIE,
         st([[0, 2]], params={k: v for k, v in params.items() if k != "heads"})),
        ("an out-of-range parameter", IIE, st([[0, 2]], params=dict(params, budget=0))),
    ]
    if key is not None:
        bad += [
            (f"{key} of the wrong length", IIE, st([[0, 2]], scores=[[good]])),
            (f"a {key} value out of range", IIE, st([[0, 2]], scores=[[good, bad_score]])),
            (f"a string in {key}", ITE, st([[0, 2]], scores=[[good, "1"]])),
            (f"a bool in {key}", ITE, st([[0, 2]], scores=[[good, True]])),
            (f"{key} rows not as long as kept's rows", IIE,
             dict(st([[0, 1], [0]], scores=[[good, good], [good, good]]), params=heads2)),
            (f"{key} with a row for an empty kept row", IIE,
             dict(st([[0, 1], []], scores=[[good, good], [good]]), params=heads2)),
        ]
        missing = st([[0, 2]])
        del missing[key]
        bad.append((f"{key} missing", IIE, missing))
    return [case(f"from_state_dict: {name}", "Loading validates every field of the state.",
                 [], raises=err, state=d) for name, err, d in bad]


# --------------------------------------------------------------------------------------
# The options of the attention-driven policies: sinks (both), history_window (Scissorhands).
# --------------------------------------------------------------------------------------


def _sinks_option_errors(policy: str, key: str, good: Any) -> list[dict[str, Any]]:
    """Bad ``sinks`` in a constructor or a state of a policy that ranks by attention (recent window 1,
    budget 4, so sinks may be 0..2); ``good`` is a valid score value."""
    bad_ctor = [
        ("a negative sinks is refused", IIE, {"sinks": -1}),
        ("a float sinks is refused", ITE, {"sinks": 1.0}),
        ("a bool sinks is refused", ITE, {"sinks": True}),
        ("recent_window + sinks equal to the budget is refused", IIE, {"sinks": 3}),
        ("sinks equal to the budget is refused", IIE, {"sinks": 4, "recent_window": 0}),
    ]
    out = [case(f"constructor: {name}", "sinks is an integer with recent_window + sinks < budget.",
                [], raises=err, **{"budget": 4, "recent_window": 1, **params})
           for name, err, params in bad_ctor]
    for name, err, sinks in (("sinks making recent_window + sinks reach the budget", IIE, 3),
                             ("a float sinks", ITE, 1.0)):
        out.append(case(f"from_state_dict: {name}", "Loading validates the optional parameters too.",
                        [], raises=err,
                        state=state(policy, {"budget": 4, "recent_window": 1, "heads": 1, "sinks": sinks},
                                    [[0, 2]], 5, **{key: [[good, good]]})))
    return out


def _history_errors() -> list[dict[str, Any]]:
    """Bad history windows and vote registers Scissorhands refuses (window 2: registers 0..3)."""
    params = {"budget": 4, "recent_window": 1, "heads": 1, "history_window": 2}
    bad_ctor = [
        ("history_window 0 is refused", IIE, 0),
        ("history_window 65 is refused", IIE, 65),
        ("a negative history_window is refused", IIE, -1),
        ("a float history_window is refused", ITE, 2.0),
        ("a bool history_window is refused", ITE, True),
        ("a string history_window is refused", ITE, "4"),
    ]
    out = [case(f"constructor: {name}", "history_window is None or an integer in [1, 64].",
                [], raises=err, budget=4, recent_window=1, history_window=w)
           for name, err, w in bad_ctor]

    def st(votes: Any = None, history: Any = None, **over: Any) -> dict[str, Any]:
        d = state("scissorhands", dict(params), [[0, 2]], 5, votes=votes or [[1, 0]],
                  history=history or [[1, 0]])
        d.update(over)
        return d

    no_history = st()
    del no_history["history"]
    no_window = st()
    del no_window["params"]["history_window"]
    bad: list[tuple[str, str, dict[str, Any]]] = [
        ("history missing although history_window is set", IIE, no_history),
        ("history without a history_window", IIE, no_window),
        ("a register with a bit at or above the window", IIE, st(history=[[4, 0]])),
        ("votes that are not the register's number of bits", IIE, st(votes=[[1, 0]], history=[[3, 0]])),
        ("a negative register", IIE, st(history=[[-1, 0]])),
        ("a float register", ITE, st(history=[[1.0, 0]])),
        ("a bool register", ITE, st(history=[[True, 0]])),
        ("history of the wrong length", IIE, st(history=[[1]])),
        ("history not a list of lists", ITE, st(history=[1, 0])),
        ("history_window 0", IIE, st(params=dict(params, history_window=0))),
        ("history_window 65", IIE, st(params=dict(params, history_window=65))),
        ("a float history_window", ITE, st(params=dict(params, history_window=2.0))),
    ]
    return out + [case(f"from_state_dict: {name}", "Loading checks the registers against the "
                       "window and the votes.", [], raises=err, state=d) for name, err, d in bad]
