"""Evictions by an observation window's pooled attention, on every policy."""

from __future__ import annotations

from typing import Any

from vector_cases.writing import IIE, ITE, case, on, s


def _observed_params(policy: str, **over: Any) -> dict[str, Any]:
    """A small policy for the observation-window cases: sinks 1 (Full: none), recent
    window 1 where it has one (the rule does not use it)."""
    if policy == "full":
        params: dict[str, Any] = {"budget": 6}
    elif policy == "streaming-llm":
        params = {"budget": 6, "sinks": 1}
    else:
        params = {"budget": 6, "recent_window": 1, "sinks": 1}
    params.update(over)
    return params


def _observed_cases_1(evicts: Any, nothing: Any, order: Any, policy: Any, spike: Any) -> list[dict[str, Any]]:
    """Part 1 of :func:`observed_cases`'s cases, in order."""
    return [
        case("evict_observed: a pooled spike keeps its neighbours, equal pooled scores evict the lower",
             "First, holding {0} with a 5-row window: nothing to evict. Then 0..9 held, W = 3 (slots "
             "7, 8, 9, each reading the slots before it), every row weighting slot 4: its score is 3, "
             "every other 0. pool_kernel 3 gives slots 3, 4, 5 the pooled 3. Budget 6 evicts 4 of "
             "the candidates 1..6 (sink 0 and the window protected): 1, 2, 6 (pooled 0), then the "
             "lowest of the tie 3, 4, 5: 3. Full evicts nothing.",
             [s("evict_observed_rows", [[0.0]] * 5, expect=nothing)]
             + [on(i) for i in range(1, 10)]
             + [s("evict_observed_rows", spike, None, 3,
                  expect=[[4], [1, 2, 3, 6], [1, 2, 3, 6]] if evicts else nothing),
                s("kept", expect=[0, 4, 5, 7, 8, 9] if evicts else list(range(10)))],
             **_observed_params(policy)),
        case("evict_observed: window scores add row after row in double (float32 window)",
             "0..6 held, W = 3 (slots 4, 5, 6 read slots 0..3, 0..4, 0..5). Slot 1 scores 1.0 + 2**-53 "
             "+ 2**-53 added in row order: 1.0 at each addition (ties to even), equal to slot 2's 1.0; "
             "slot 3 scores 15. pool_kernel 1: no pooling. Budget 6 evicts one of the candidates 1, 2, "
             "3: the tie 1, 2 goes to the lower, 1 (added in another order slot 1 would be 1 + 2**-52 "
             "and slot 2 would go). The float32 values are exact.",
             [on(i) for i in range(1, 7)]
             + [s("evict_observed", order, None, 1, return_indices=True, dtype="float32",
                  expect=[[1], [1]] if evicts else [[], []])],
             **_observed_params(policy)),
    ]


def _observed_cases_2(bad: Any, evicts: Any, nothing: Any, policy: Any) -> list[dict[str, Any]]:
    """Part 2 of :func:`observed_cases`'s cases, in order."""
    return [
        case("evict_observed: refusals leave the state, unread weights are not checked",
             "0..9 held, budget 6: every refusal is checked before anything changes: budget 0, an "
             "even or bool pool_kernel, a width that is not the 10 held, no window rows. A 9-row "
             "window and the sink leave 0 candidates where 4 must go; a negative weight at slot 3 "
             "of a row that reads it is refused. Full checks only the arguments and the shape. A "
             "negative weight a row does not read (window row 0 is slot 8: its own weight, slot 8) "
             "is never read: slots 0..7 score 0, so the lowest candidates 1..4 go.",
             [on(i) for i in range(1, 10)]
             + [s("evict_observed_rows", [[0.0] * 10] * 2, 0, raises=IIE),
                s("evict_observed_rows", [[0.0] * 10] * 2, None, 2, raises=IIE),
                s("evict_observed_rows", [[0.0] * 10] * 2, None, True, raises=ITE),
                s("evict_observed_rows", [[0.0] * 9] * 2, raises=IIE),
                s("evict_observed_rows", [], raises=IIE),
                s("evict_observed_rows", [[0.0] * 10] * 9, **({"raises": IIE} if evicts else {"expect": nothing})),
                s("evict_observed_rows", [[0.0] * 10, [0.0, 0.0, 0.0, bad] + [0.0] * 6],
                  **({"raises": IIE} if evicts else {"expect": nothing})),
                s("evict_observed_rows", [[0.0] * 8 + [bad, bad], [0.0] * 9 + [bad]], None, 1,
                  expect=[[4], [1, 2, 3, 4], [1, 2, 3, 4]] if evicts else nothing)],
             **_observed_params(policy)),
        case("evict_observed_rows: rows of different counts read their own window rows",
             "A fresh chunk of 8 (row 1 leaves out positions 2 and 5: it holds 0 1 3 4 6 7). W = 2. "
             "Row 0 (8 held, protected 0, 6, 7) weights slot 1 twice: 4 go from 1..5, the zeros 2..5. "
             "Row 1 (6 held, protected slots 0, 4, 5) weights slot 3 (position 4): 2 go from slots "
             "1..3, slots 1, 2 (positions 1, 3). evict_observed refuses rows evicting 4 and 2.",
             [s("extend", [[[0.125] * 8] * 8] * 2, admit=[[True] * 8, [True, True, False, True, True, False,
                                                                        True, True]]),
              s("counts", expect=[8, 6]),
              s("evict_observed", [[[0.0, 1.0] + [0.0] * 6] * 2, [[0.0] * 3 + [1.0] + [0.0] * 4] * 2], None, 1,
                **({"raises": IIE} if evicts else {"expect": [[], []]})),
              s("evict_observed_rows", [[[0.0, 1.0] + [0.0] * 6] * 2, [[0.0] * 3 + [1.0] + [0.0] * 4] * 2], None, 1,
                expect=[[4, 2], [2, 3, 4, 5, 1, 3], [2, 3, 4, 5, 1, 2]] if evicts else [[0, 0], [], []]),
              s("kept_row", 1, expect=[0, 4, 6, 7] if evicts else [0, 1, 3, 4, 6, 7])],
             **_observed_params(policy, budget=4, heads=2)),
    ]


def observed_cases(policy: str) -> list[dict[str, Any]]:
    """evict_observed / evict_observed_rows (SnapKV's pooled window scores), the same
    rule for every policy that evicts; Full checks the arguments and evicts nothing."""
    evicts = policy != "full"
    nothing = [[0], [], []]
    spike = [[0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]] * 3
    tiny = 2.0**-53
    order = [[0.0, 1.0, 1.0, 5.0, 0.0, 0.0, 0.0], [0.0, tiny, 0.0, 5.0, 0.0, 0.0, 0.0],
             [0.0, tiny, 0.0, 5.0, 0.0, 0.0, 0.0]]
    bad = -1.0  # JSON holds no NaN: a negative weight is the refused value
    cases = (
        _observed_cases_1(evicts, nothing, order, policy, spike)
        + _observed_cases_2(bad, evicts, nothing, policy)
    )
    from scissorhands.options import POOL, SPECS

    if POOL in SPECS[policy].options:
        cases.append(case(
            "evict_observed refuses pooled budgets",
            "pool=2: the rows of a pool share a budget, which the rule does not take.",
            [on(i) for i in range(1, 8)]
            + [s("evict_observed_rows", [[[0.0] * 8]] * 2, raises=IIE),
               s("evict_observed", [[[0.0] * 8]] * 2, raises=IIE)],
            **_observed_params(policy, budget=4, heads=2, pool=2)))
    return cases

