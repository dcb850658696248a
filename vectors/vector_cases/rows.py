"""Rows of different counts, chunks (extend) and row selection, on every policy."""

from __future__ import annotations

from typing import Any

from vector_cases.writing import IIE, ITE, RAGGED_NOTE, U32, case, on, s, state

# --------------------------------------------------------------------------------------
# Rows of different counts, chunks (extend) and row selection, on every policy.
# --------------------------------------------------------------------------------------



def _scissorhands_rows_cases_1(two: Any, x: Any) -> list[dict[str, Any]]:
    """Part 1 of :func:`_scissorhands_rows_cases`'s cases, in order."""
    return [
        case("rows of different counts: a state loads them; each row reads its own count of weights",
             "Rows [0,2,5] (votes [1,0,0]) and [2,5] (votes [2,0]). kept_count, kept, votes and "
             "sink_count need equal counts and raise; counts and kept_row answer. Step 6 gives "
             "(2, 3) weights: row 0 reads 3 (share 1/3: 0.5 votes position 0), row 1 its first 2 "
             "(share 1/2: 0.75 votes position 2) and never reads the -1. Holding [4, 3], step 7 "
             "at budget 3 would evict 2 and 1, and evict() 1 and 0: both raise before any change; "
             "evict(4) evicts 0 from each, the (2, 0) array. step_rows(7): row 0 (share 1/4) "
             "votes 6 -> [2,0,0,1,0] and drops the two 0-vote positions 2, 5 (slots 1, 2) of "
             "slots 0..3; row 1 (share 1/3) votes 6 -> [3,0,1,0] and drops 5 (slot 1). Five "
             "positions outgrow the 4 slots: 8. The rows now hold 3 each and step returns the "
             "(2, 1) array again: row 0 votes 7 -> [2,1,1,0], drops 6; row 1 votes 2, 6 -> "
             "[4,2,0,0], drops 7. " + RAGGED_NOTE,
             [s("counts", expect=[3, 2]), s("kept_row", 0, expect=[0, 2, 5]),
              s("kept_row", 1, expect=[2, 5]), s("kept_row", 2, raises=IIE),
              s("kept_row", -1, raises=IIE), s("kept_row", True, raises=ITE),
              s("kept_row", 1.0, raises=ITE), s("kept_count", raises=IIE), s("kept", raises=IIE),
              s("votes", raises=IIE), s("sink_count", raises=IIE),
              s("votes_of", 2, 1, expect=2), s("votes_of", 0, 1, expect=-1), s("votes_of", 0, 0, expect=1),
              s("memory_bytes", expect=64 + 2 * 4 + 4 * 2 * 9),
              on(6, [[0.5, 0.25, 0.25], [0.75, 0.25, x]]),
              s("state_dict", expect=state("scissorhands", two, [[0, 2, 5, 6], [2, 5, 6]], 6,
                                           votes=[[2, 0, 0, 0], [3, 0, 0]])),
              on(7, [[0.25] * 3, [0.25] * 3], raises=IIE),
              s("step", 7, [[0.25] * 4, [0.25, 0.25, 0.5, x]], raises=IIE),
              s("evict", raises=IIE), s("evict", 4, expect=[[], []]),
              s("step_rows", 7, [[0.25, 0.25, 0.125, 0.375], [0.25, 0.25, 0.5, x]],
                expect=[[2, 1], [2, 5, 5], [1, 2, 1]]),
              s("memory_bytes", expect=64 + 2 * 4 + 8 * 2 * 9),
              s("kept", expect=[[0, 6, 7], [2, 6, 7]]), s("votes", expect=[[2, 1, 0], [3, 1, 0]]),
              s("kept_count", expect=3), s("evict_rows", expect=[[0, 0], [], []]),
              s("step", 8, [[0.0, 0.0, 1.0], [0.5, 0.5, 0.0]], expect=[[6], [7]]),
              s("state_dict", expect=state("scissorhands", two, [[0, 7, 8], [2, 6, 8]], 8,
                                           votes=[[2, 1, 0], [4, 2, 0]]))],
             state=state("scissorhands", two, [[0, 2, 5], [2, 5]], 5, votes=[[1, 0, 0], [2, 0]])),
    ]


def _scissorhands_rows_cases_2(x: Any) -> list[dict[str, Any]]:
    """Part 2 of :func:`_scissorhands_rows_cases`'s cases, in order."""
    return [
        case("rows of different counts: an empty row votes nothing and admits as usual",
             "Row 0 holds nothing, row 1 [0, 3] (votes [1, 0]). Step 4: row 0 reads no weight "
             "(its -5 and 7 are never read); row 1 (share 1/2) votes 0. Step 5 with step_rows: "
             "row 0 [4] reads 1.0 (share 1: no vote) and holds 2, the budget; row 1 (share 1/3) "
             "votes 4 -> [2,0,1,0] and drops the 0-vote 3 and 5 (slots 1, 3). Four positions "
             "outgrow the 3 slots: 6. " + RAGGED_NOTE,
             [s("counts", expect=[0, 2]), s("kept_row", 0, expect=[]), s("kept_count", raises=IIE),
              on(4, [[-5.0, 7.0], [0.75, 0.25]]),
              s("state_dict", expect=state("scissorhands", {"budget": 2, "recent_window": 0, "heads": 2},
                                           [[4], [0, 3, 4]], 4, votes=[[0], [2, 0, 0]])),
              s("step_rows", 5, [[1.0, x, x], [0.0, 0.0, 1.0]], expect=[[0, 2], [3, 5], [1, 3]]),
              s("kept", expect=[[4, 5], [0, 4]]), s("votes", expect=[[0, 0], [2, 1]]),
              s("memory_bytes", expect=64 + 2 * 4 + 6 * 2 * 9)],
             state=state("scissorhands", {"budget": 2, "recent_window": 0, "heads": 2},
                         [[], [0, 3]], 3, votes=[[], [1, 0]])),
        case("evict_rows and step_rows with one head return the victims row by row",
             "Votes [5,2,0,1,4,0]: the three fewest of slots 0..4 are 5, 7, 2 -> counts [3], "
             "victims [2,5,7], slots [1,2,3]. Then step 10 (share 1/3) votes 0 -> [6,4,0,0]; "
             "budget 2 drops 8 and 9. Bad positions, budgets and shapes raise as for step.",
             [s("evict_rows", expect=[[3], [2, 5, 7], [1, 2, 3]]), s("kept", expect=[0, 8, 9]),
              s("counts", expect=[3]), s("step_rows", 10, [0.5, 0.25], raises=IIE),
              s("step_rows", 9, [0.5, 0.25, 0.25], raises=IIE),
              s("step_rows", 10, [0.5, 0.25, 0.25], 1, raises=IIE),
              s("step_rows", 10, [True, 0.25, 0.25], raises=ITE), s("evict_rows", True, raises=ITE),
              s("evict_rows", 0, raises=IIE),
              s("step_rows", 10, [0.5, 0.25, 0.25], 2, expect=[[2], [8, 9], [1, 2]]),
              s("kept", expect=[0, 10]), s("votes", expect=[6, 0])],
             state=state("scissorhands", {"budget": 3, "recent_window": 1, "heads": 1},
                         [[0, 2, 5, 7, 8, 9]], 9, votes=[[5, 2, 0, 1, 4, 0]])),
    ]


def _scissorhands_rows_cases_3(four: Any, later: Any, pad: Any, padded: Any, prompt: Any,
                               x: Any) -> list[dict[str, Any]]:
    """Part 3 of :func:`_scissorhands_rows_cases`'s cases, in order."""
    return [
        case("extend on a fresh policy is prefill; then a chunk after the held positions",
             "Fresh, the chunk's tokens are positions 0..3 and token 0 is the position 0 already "
             "held: rows 2 and 3 vote 0, as prefill gives ([2,0,0,0]; the -1 entries are never "
             "read). A second chunk of 2 tokens takes positions 4 and 5 with width 4 + 2: token "
             "4 reads columns 0..3 (share 1/4: no vote), token 5 columns 0..4 (share 1/5: 0.5 "
             "votes 4). Six positions outgrow the 5 slots: 10. evict drops 1 and 2 (0 votes).",
             [s("extend", prompt, dtype="float32"), s("votes", expect=[2, 0, 0, 0]),
              s("state_dict", expect=state("scissorhands", four, [[0, 1, 2, 3]], 3, votes=[[2, 0, 0, 0]])),
              s("memory_bytes", expect=64 + 5 * 9), s("prefill", prompt, raises=IIE),
              s("extend", [[0.25, 0.25, 0.25, 0.25, x, x], [0.125, 0.125, 0.125, 0.125, 0.5, x]]),
              s("votes", expect=[2, 0, 0, 0, 1, 0]), s("kept", expect=[0, 1, 2, 3, 4, 5]),
              s("memory_bytes", expect=64 + 10 * 9), on(5, None, raises=IIE),
              s("evict", expect=[1, 2]), s("kept", expect=[0, 3, 4, 5])],
             **four),
        case("extend with admit: a left-padded prompt keeps its padding out of its row",
             "Row 0 has two padding tokens (positions 0, 1), row 1 none. Row 0: position 0 "
             "leaves, token 1 is skipped, token 2 joins an empty row (no vote), token 3 reads "
             "only column 2 (share 1: no vote). Row 1 is prefill: [1,1,0,0]. Step 4 reads 2 "
             "weights in row 0 (0.75 votes 2) and 4 in row 1 (0.625 votes 3). A chunk of 2 "
             "(width 5 + 2): row 0 (3 held) token 5 reads columns 0..2 (0.5 votes 2), token 6 "
             "columns 0..3 (no vote); row 1 skips token 5, whose weights are never read, and "
             "token 6 reads columns 0..4, not 5 (0.5 votes 4). evict_rows(4): row 0 drops 3 "
             "(slot 1, 0 votes), row 1 drops 2 (0 votes) and 0 (1 vote, the lowest of four). "
             + RAGGED_NOTE,
             [s("extend", padded, admit=[[False, False, True, True], [True, True, True, True]]),
              s("counts", expect=[2, 4]), s("kept_row", 0, expect=[2, 3]),
              s("kept_row", 1, expect=[0, 1, 2, 3]),
              s("state_dict", expect=state("scissorhands", pad, [[2, 3], [0, 1, 2, 3]], 3,
                                           votes=[[0, 0], [1, 1, 0, 0]])),
              on(4, [[0.75, 0.25, x, x], [0.125, 0.125, 0.125, 0.625]]),
              s("extend", later, admit=[[True, True], [False, True]]),
              s("state_dict", expect=state("scissorhands", pad, [[2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 6]], 6,
                                           votes=[[2, 0, 0, 0, 0], [1, 1, 0, 1, 1, 0]])),
              s("evict_rows", 4, expect=[[1, 2], [3, 0, 2], [1, 0, 2]]),
              s("kept", expect=[[2, 4, 5, 6], [1, 3, 4, 6]]), s("votes", expect=[[2, 0, 0, 0], [1, 1, 1, 0]]),
              s("memory_bytes", expect=64 + 2 * 4 + 9 * 2 * 9)],
             **pad),
    ]


def _scissorhands_rows_cases_4(four: Any, four2: Any, good: Any, x: Any) -> list[dict[str, Any]]:
    """Part 4 of :func:`_scissorhands_rows_cases`'s cases, in order."""
    return [
        case("extend: a first token left out drops position 0, and the policy is no longer fresh",
             "A one-token chunk on a fresh policy: row 0 does not admit it, so it holds nothing; "
             "row 1 keeps position 0. prefill then refuses (not fresh), and the next chunk takes "
             "position 1 with width 1 + 1: row 0 reads nothing, row 1 reads column 0 (share 1: "
             "no vote).",
             [s("extend", [[[5.0]], [[5.0]]], admit=[[False], [True]]), s("counts", expect=[0, 1]),
              s("state_dict", expect=state("scissorhands", four2, [[], [0]], 0, votes=[[], [0]])),
              s("prefill", [[[0.0]], [[0.0]]], raises=IIE), s("extend", [[[0.5]], [[0.5]]], raises=IIE),
              s("extend", [[[x, 7.0]], [[0.5, x]]]),
              s("state_dict", expect=state("scissorhands", four2, [[1], [0, 1]], 1, votes=[[0], [0, 0]]))],
             **four2),
        case("extend: a one-token chunk on a fresh policy leaves it fresh",
             "Token 0 is position 0, held already; nothing is read. prefill is still allowed.",
             [s("extend", [[[9.0]]]), s("kept", expect=[0]), s("prefill", [[0.0, 0.0], [1.0, 0.0]]),
              s("kept", expect=[0, 1])],
             **four),
        case("extend refuses bad chunks and changes nothing; unread weights are not checked",
             "Rows [0,2] and [1,2,3]: the width is 3 + C. Shapes, bool weights, admit of the "
             "wrong kind or shape, and a negative weight a vote reads are refused. Row 1 leaving "
             "out the token never reads its -0.5; row 0 (share 1/2) votes no one.",
             [s("extend", [[[0.5] * 3], [[0.5] * 3]], raises=IIE),
              s("extend", [[[0.5] * 4]], raises=IIE), s("extend", [[0.5] * 4], raises=IIE),
              s("extend", [[[0.5] * 5], [[0.5] * 5]], raises=IIE),
              s("extend", [[[True, 0.5, 0.5, 0.5]], [[0.5] * 4]], raises=ITE),
              s("extend", [[["x"] * 4], [["x"] * 4]], raises=ITE),
              s("extend", good, admit=[[1], [1]], raises=ITE),
              s("extend", good, admit="yes", raises=ITE),
              s("extend", good, admit=[[True, False], [True, True]], raises=IIE),
              s("extend", good, admit=[[True], [True, False]], raises=IIE),
              s("extend", good, admit=[True, True], raises=IIE),
              s("extend", [[[0.5, -0.5, x, x]], [[0.25, 0.25, 0.5, x]]], raises=IIE),
              s("extend", [[[0.5, 0.5, x, x]], [[0.25, 0.25, -0.5, x]]], admit=[[True], [False]]),
              s("state_dict", expect=state("scissorhands", four2, [[0, 2, 4], [1, 2, 3]], 4,
                                           votes=[[0, 0, 0], [0, 0, 0]]))],
             state=state("scissorhands", four2, [[0, 2], [1, 2, 3]], 3, votes=[[0, 0], [0, 0, 0]])),
    ]


def _scissorhands_rows_cases_5(four: Any, x: Any) -> list[dict[str, Any]]:
    """Part 5 of :func:`_scissorhands_rows_cases`'s cases, in order."""
    return [
        case("extend: the chunk's positions must stay within 2**32 - 1",
             "Last position 2**32-2: two tokens would reach 2**32 and raise; one takes 2**32-1 "
             "(share 1/2: no vote), after which no chunk fits. admit is checked before the "
             "positions.",
             [s("extend", [[0.5] * 4, [0.5] * 4], raises=IIE), s("extend", [[0.5, 0.5, x]]),
              s("extend", [[0.5] * 4], admit=[[1]], raises=ITE), s("extend", [[0.5] * 4], raises=IIE),
              on(0, None, raises=IIE), s("kept", expect=[0, U32 - 1, U32])],
             state=state("scissorhands", four, [[0, U32 - 1]], U32 - 1, votes=[[0, 0]])),
        case("select_rows: reorder, repeat, shrink",
             "Votes [[1,0,0],[0,1,0]]. [1,0] swaps the rows; [0,0,1,1] makes four; step 3 "
             "then votes and evicts in each row on its own: row 0 votes 2 and drops 0, row 1 "
             "votes 1 and drops 0, row 2 votes 0 and drops 1, row 3 votes 0, 1 and drops 2. "
             "[3] keeps the last row alone. Memory follows the rows (4 slots each). Bad "
             "indices raise and change nothing.",
             [on(1, [[1.0], [1.0]]), on(2, [[0.75, 0.25], [0.25, 0.75]]),
              s("votes", expect=[[1, 0, 0], [0, 1, 0]]), s("memory_bytes", expect=64 + 2 * 4 + 4 * 2 * 9),
              s("select_rows", [1, 0]), s("votes", expect=[[0, 1, 0], [1, 0, 0]]),
              s("select_rows", [0, 0, 1, 1]), s("heads", expect=4),
              s("votes", expect=[[0, 1, 0], [0, 1, 0], [1, 0, 0], [1, 0, 0]]),
              s("memory_bytes", expect=64 + 4 * 4 + 4 * 4 * 9),
              s("step", 3, [[0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.5, 0.5, 0.0]],
                expect=[[0], [0], [1], [2]]),
              s("select_rows", [3]), s("kept", expect=[0, 1, 3]), s("votes", expect=[2, 1, 0]),
              s("memory_bytes", expect=64 + 4 * 9),
              s("state_dict", expect=state("scissorhands", {"budget": 3, "recent_window": 1, "heads": 1},
                                           [[0, 1, 3]], 3, votes=[[2, 1, 0]])),
              s("select_rows", [], raises=IIE), s("select_rows", [1], raises=IIE),
              s("select_rows", [-1], raises=IIE), s("select_rows", [True], raises=ITE),
              s("select_rows", [0.0], raises=ITE), s("select_rows", [[0]], raises=IIE),
              s("select_rows", 0, raises=IIE), s("select_rows", "0", raises=ITE),
              s("select_rows", None, raises=ITE), s("kept", expect=[0, 1, 3])],
             budget=3, recent_window=1, heads=2),
    ]


def _scissorhands_rows_cases_6(rated: Any, x: Any) -> list[dict[str, Any]]:
    """Part 6 of :func:`_scissorhands_rows_cases`'s cases, in order."""
    return [
        case("select_rows copies registers, steps held and counts",
             "Window 3 with a vote rate: rows [0,2,3] and [1,3]. [1,1,0] makes three rows. "
             "step_rows 4: row 0 (share 1/2) votes 3: registers 3<<1 = 6, 2<<1|1 = 5 (2 votes "
             "each), steps held [4,3]; row 1 votes no one: registers 6, 4; row 2 (share 1/3) "
             "votes 0: register 3. None is over budget 4. evict_rows(2): row 0's rates 2/3 and "
             "2/3 (steps capped at 3) tie and the lower, 1, goes; row 1's 2/3 and 1/3: 3 goes; "
             "row 2's 2/3, 0/2, 0/1: 2 and 3 go. 21 bytes a slot, 5 slots a row. "
             + RAGGED_NOTE,
             [s("memory_bytes", expect=64 + 2 * 4 + 5 * 2 * 21), s("select_rows", [1, 1, 0]),
              s("state_dict", expect=state("scissorhands", dict(rated, heads=3), [[1, 3], [1, 3], [0, 2, 3]], 3,
                                           votes=[[2, 1], [2, 1], [1, 0, 0]],
                                           history=[[3, 2], [3, 2], [1, 0, 0]],
                                           steps_held=[[3, 2], [3, 2], [2, 1, 0]])),
              s("counts", expect=[2, 2, 3]), s("memory_bytes", expect=64 + 3 * 4 + 5 * 3 * 21),
              s("step_rows", 4, [[0.25, 0.75, x], [0.5, 0.5, x], [0.5, 0.25, 0.25]],
                expect=[[0, 0, 0], [], []]),
              s("evict_rows", 2, expect=[[1, 1, 2], [1, 3, 2, 3], [0, 1, 1, 2]]),
              s("state_dict", expect=state("scissorhands", dict(rated, heads=3), [[3, 4], [1, 4], [0, 4]], 4,
                                           votes=[[2, 0], [2, 0], [2, 0]], history=[[5, 0], [6, 0], [3, 0]],
                                           steps_held=[[3, 0], [4, 0], [3, 0]]))],
             state=state("scissorhands", rated, [[0, 2, 3], [1, 3]], 3, votes=[[1, 0, 0], [2, 1]],
                         history=[[1, 0, 0], [3, 2]], steps_held=[[2, 1, 0], [3, 2]])),
    ]


def _scissorhands_rows_cases() -> list[dict[str, Any]]:
    """Scissorhands with rows of different counts, chunks and row selection."""
    two = {"budget": 3, "recent_window": 1, "heads": 2}
    pad = {"budget": 8, "recent_window": 1, "heads": 2}
    four = {"budget": 4, "recent_window": 1, "heads": 1}
    four2 = dict(four, heads=2)
    rated = {"budget": 4, "recent_window": 1, "heads": 2, "history_window": 3, "vote_rate": True}
    prompt = [[-1.0, -1.0, -1.0, -1.0],
              [1.0, -1.0, -1.0, -1.0],
              [0.75, 0.25, -1.0, -1.0],
              [0.5, 0.25, 0.25, -1.0]]
    x = -1.0  # a weight no step reads: negative, so that reading it would raise
    padded = [[[x] * 4, [x] * 4, [x] * 4, [x, x, 1.0, x]],
              [[x] * 4, [1.0, x, x, x], [0.25, 0.75, x, x], [0.5, 0.25, 0.25, x]]]
    later = [[[0.5, 0.25, 0.25, x, x, x, x], [0.25, 0.25, 0.25, 0.25, x, x, x]],
             [[x] * 7, [0.125, 0.125, 0.125, 0.125, 0.5, x, x]]]
    good = [[[0.5, 0.5, x, x]], [[0.25, 0.25, 0.5, x]]]
    return (
        _scissorhands_rows_cases_1(two, x)
        + _scissorhands_rows_cases_2(x)
        + _scissorhands_rows_cases_3(four, later, pad, padded, prompt, x)
        + _scissorhands_rows_cases_4(four, four2, good, x)
        + _scissorhands_rows_cases_5(four, x)
        + _scissorhands_rows_cases_6(rated, x)
    )


def _h2o_rows_cases() -> list[dict[str, Any]]:
    """H2O with rows of different counts and chunks."""
    two = {"budget": 2, "recent_window": 0, "heads": 2}
    x = -1.0
    return [
        case("rows of different counts: evict refuses, evict_rows evicts each row on its own",
             "Rows [0,1,2] (scores [0.5,0.25,0]) and [1] (1.0). evict() would take 1 and 0: it "
             "raises; evict_rows drops the lowest score of row 0 (2). step_rows 3: row 0 adds "
             "[0.5,0.5] -> [1,0.75,0] and drops 3; row 1 reads its one weight (1.25) and holds "
             "2, the budget. " + RAGGED_NOTE,
             [s("counts", expect=[3, 1]), s("scores", raises=IIE), s("sink_count", raises=IIE),
              s("score_of", 1, 1, expect=1.0), s("evict", raises=IIE),
              s("evict_rows", expect=[[1, 0], [2], [2]]),
              s("state_dict", expect=state("h2o", two, [[0, 1], [1]], 2, scores=[[0.5, 0.25], [1.0]])),
              s("step_rows", 3, [[0.5, 0.5], [0.25, x]], expect=[[1, 0], [3], [2]]),
              s("kept", expect=[[0, 1], [1, 3]]), s("scores", expect=[[1.0, 0.75], [1.25, 0.0]]),
              s("memory_bytes", expect=64 + 2 * 4 + 3 * 2 * 13)],
             state=state("h2o", two, [[0, 1, 2], [1]], 2, scores=[[0.5, 0.25, 0.0], [1.0]])),
        case("extend: prefill's scores, then a chunk whose first token is left out",
             "Fresh: [1.75, 0.25, 0] as prefill gives. A chunk of 2 (width 3 + 2) with admit "
             "(C,) = [False, True]: position 3 is skipped and never read; token 4 adds columns "
             "0..2 only. step 5 then adds 0.25 to each and drops the lowest, 4 (0.25).",
             [s("extend", [[x, x, x], [1.0, x, x], [0.75, 0.25, x]], dtype="float32"),
              s("scores", expect=[1.75, 0.25, 0.0]),
              s("extend", [[x] * 5, [0.5, 0.25, 0.25, x, x]], admit=[False, True]),
              s("kept", expect=[0, 1, 2, 4]), s("scores", expect=[2.25, 0.5, 0.25, 0.0]),
              on(4, None, raises=IIE), s("step", 5, [0.25] * 4, expect=[4]),
              s("kept", expect=[0, 1, 2, 5])],
             budget=4, recent_window=1),
    ]


def _streaming_rows_cases() -> list[dict[str, Any]]:
    """StreamingLLM with rows of different counts and chunks (attention never read)."""
    x = -1.0
    return [
        case("extend with admit: each row's sinks are the first positions it holds",
             "Row 0 leaves out position 0, so its sink is 1; row 1 holds 0..4. evict would take "
             "1 and 2: it raises; evict_rows drops 2 from row 0 and 1, 2 from row 1. A chunk of "
             "one (width 3 + 1) is read for its shape only (strings are fine). Five positions "
             "outgrew the 4 slots: 8. " + RAGGED_NOTE,
             [s("extend", [[[x] * 5] * 5, [[x] * 5] * 5], admit=[[False, True, True, True, True], [True] * 5]),
              s("counts", expect=[4, 5]), s("kept_row", 0, expect=[1, 2, 3, 4]),
              s("sink_count", raises=IIE), s("evict", raises=IIE),
              s("evict_rows", expect=[[1, 2], [2, 1, 2], [1, 1, 2]]),
              s("kept", expect=[[1, 3, 4], [0, 3, 4]]), s("sink_count", expect=1),
              s("extend", [[[0.0] * 4, [0.0] * 4]], raises=IIE),
              s("extend", [[["a", "b", "c", "d"]], [["a", "b", "c", "d"]]]),
              s("memory_bytes", expect=64 + 2 * 4 + 8 * 2 * 4),
              s("state_dict", expect=state("streaming-llm", {"budget": 3, "sinks": 1, "heads": 2},
                                           [[1, 3, 4, 5], [0, 3, 4, 5]], 5)),
              s("step", 6, None, expect=[[3, 4], [3, 4]])],
             budget=3, sinks=1, heads=2),
        case("rows of different counts: a state with an empty row loads and steps",
             "Rows [0,5] and []. Step 6 joins both; step_rows 7: row 0 holds 4, keeps sink 0 "
             "and drops 5, 6; row 1 holds 2, the budget. " + RAGGED_NOTE,
             [s("counts", expect=[2, 0]), s("kept", raises=IIE), on(6, "garbage"),
              s("step_rows", 7, None, expect=[[2, 0], [5, 6], [1, 2]]),
              s("kept", expect=[[0, 7], [6, 7]]), s("memory_bytes", expect=64 + 2 * 4 + 6 * 2 * 4)],
             state=state("streaming-llm", {"budget": 2, "sinks": 1, "heads": 2}, [[0, 5], []], 5)),
    ]


def _full_rows_cases() -> list[dict[str, Any]]:
    """Full with rows of different counts, chunks and row selection."""
    return [
        case("extend with admit, then rows of different counts never evict",
             "Row 0 leaves out position 0. evict and step evict nothing from any row, so they "
             "return (2, 0) arrays even with different counts; evict_rows and step_rows return "
             "zero counts. select_rows([1]) keeps row 1 alone. " + RAGGED_NOTE,
             [s("counts", expect=[1, 1]),
              s("extend", [[[0.0] * 3] * 3, [[0.0] * 3] * 3], admit=[[False, True, True], [True] * 3]),
              s("counts", expect=[2, 3]), s("kept", raises=IIE), s("kept_count", raises=IIE),
              s("evict", expect=[[], []]), s("step", 3, "x", expect=[[], []]),
              s("evict_rows", expect=[[0, 0], [], []]), s("step_rows", 4, None, 1, expect=[[0, 0], [], []]),
              s("state_dict", expect=state("full", {"budget": None, "heads": 2},
                                           [[1, 2, 3, 4], [0, 1, 2, 3, 4]], 4)),
              s("memory_bytes", expect=64 + 2 * 4 + 64 * 2 * 4), s("select_rows", [1]),
              s("kept", expect=[0, 1, 2, 3, 4]), s("memory_bytes", expect=64 + 64 * 4)],
             heads=2),
    ]
