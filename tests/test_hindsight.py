"""The hindsight reference without a model: its schedule on hand-made attention (exact
victims, ties to the lower position, the window cut at the end of the text), the online
scheduler against a brute-force statement of the rule, the replay policy, the gap-closed
arithmetic, eval's table and report's merge with hindsight rows."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scissorhands.commands.evaluate import format_table
from scissorhands.commands.report import combine_reports, format_report, run_report
from scissorhands.errors import InvalidInputError, InvalidTypeError
from scissorhands.hindsight import (
    HindsightScheduler,
    ScheduledPolicy,
    gap_closed,
    gap_closed_percent,
    hindsight_schedule,
)

PROMPT = 3


def _hand_made() -> np.ndarray:
    """Two rows, decode steps at positions 3..6 (dyadic weights: every sum exact).
    Row 1 attends to nothing: every decision is a tie."""
    a = np.zeros((2, 7, 7), dtype=np.float32)
    a[0, 3, :3] = [0.5, 0.25, 0.25]
    a[0, 4, :4] = [0.5, 0, 0.25, 0.25]
    a[0, 5, :5] = [0.25, 0.25, 0, 0.25, 0.25]
    a[0, 6, :6] = [0, 0, 0, 0.5, 0.25, 0.25]
    return a


def test_schedule_on_hand_made_attention():
    """Budget 2, W = 2.  Row 0: after the prompt F(0, 1, 2) = (1.0, 0.25, 0.5) over steps
    3-4: evict 1; step 3: F(0, 2, 3) = (0.75, 0.25, 0.5): 2; step 4: F(0, 3, 4) = (0.25,
    0.75, 0.5): 0; step 5 sees only step 6 (the window cut at the end): F(3, 4, 5) =
    (0.5, 0.25, 0.25), a tie: the lower, 4; step 6 sees nothing: all 0, the lowest, 3.
    Row 1 (no attention): always the lowest position held."""
    schedule = hindsight_schedule(_hand_made(), [2], window=2, prompt_tokens=PROMPT)[2]
    assert schedule.prompt_victims.tolist() == [[1], [0]]
    assert schedule.step_victims.T.tolist() == [[2, 0, 4, 3], [1, 2, 3, 4]]
    assert schedule.held(2).tolist() == [[0, 2], [1, 2]]
    assert schedule.held(6).tolist() == [[5, 6], [5, 6]]
    # A window past the end reads every step there is: the prompt's F = (1.25, 0.5, 0.5),
    # a tie evicting 1; the rest as with W = 2 on this array.
    wide = hindsight_schedule(_hand_made(), [2], window=100, prompt_tokens=PROMPT)[2]
    assert wide.prompt_victims.tolist() == [[1], [0]]
    assert wide.step_victims.T.tolist() == [[2, 0, 4, 3], [1, 2, 3, 4]]


def test_schedule_under_a_budget_above_the_prompt():
    """Budget 4: nothing after the prompt nor at step 3 (4 held); then one victim a step,
    the newest position a candidate like any other."""
    schedule = hindsight_schedule(_hand_made(), [4], window=2, prompt_tokens=PROMPT)[4]
    assert schedule.prompt_victims.shape == (2, 0)
    assert schedule.step_victims.T.tolist() == [[-1, 2, 0, 1], [-1, 0, 1, 2]]
    # The newest position goes when the future ignores it (step 3); at the last step
    # nothing is left to read: the lowest goes.
    a = np.zeros((1, 5, 5))
    a[0, 3, :3] = [0.5, 0.5, 0]
    a[0, 4, :4] = [0.5, 0.25, 0.25, 0]
    newest = hindsight_schedule(a, [3], window=1, prompt_tokens=PROMPT)[3]
    assert newest.step_victims.T.tolist() == [[3, 0]]


def _brute(a: np.ndarray, budget: int, window: int, prompt: int) -> tuple[list, list]:
    """The rule as stated, per row, in plain Python."""
    rows, total, _ = a.shape
    last = total - 1
    prompt_victims, steps = [], []
    for r in range(rows):
        def future(t, h, r=r):
            return sum(float(a[r, s, h]) for s in range(t + 1, min(t + window, last) + 1))
        order = sorted(range(prompt), key=lambda h: (future(prompt - 1, h), h))
        over = max(0, prompt - budget)
        prompt_victims.append(sorted(order[:over]))
        held = sorted(order[over:])
        mine = []
        for t in range(prompt, total):
            held.append(t)
            if len(held) > budget:
                victim = min(held, key=lambda h, t=t: (future(t, h), h))
                held.remove(victim)
                mine.append(victim)
            else:
                mine.append(-1)
        steps.append(mine)
    return prompt_victims, steps


@pytest.mark.parametrize("seed", range(4))
def test_online_scheduler_states_the_rule(seed):
    """Random dyadic attention (many ties), several budgets, windows and prompts: the
    scheduler fed step by step decides what the rule says."""
    rng = np.random.default_rng(seed)
    rows, total = 3, 24
    a = rng.integers(0, 4, size=(rows, total, total)) / 8.0
    for window in (1, 3, 7, 40):
        for prompt in (1, 5, 9):
            budgets = [1, 4, 8, 12]
            schedules = hindsight_schedule(a.astype(np.float32), budgets, window, prompt)
            for budget in budgets:
                want_prompt, want_steps = _brute(a, budget, window, prompt)
                got = schedules[budget]
                assert got.prompt_victims.tolist() == want_prompt, (window, prompt, budget)
                assert got.step_victims.T.tolist() == want_steps, (window, prompt, budget)


def test_scheduler_refuses_bad_input_and_changes_nothing():
    with pytest.raises(InvalidInputError, match="window must be in"):
        HindsightScheduler([4], 0, 3, 6)
    with pytest.raises(InvalidTypeError, match="window must be an integer"):
        HindsightScheduler([4], 2.0, 3, 6)
    with pytest.raises(InvalidInputError, match="at least one budget"):
        HindsightScheduler([], 2, 3, 6)
    scheduler = HindsightScheduler([2], 2, 3, 6)
    with pytest.raises(InvalidInputError, match="expected the step at position 3"):
        scheduler.push(4, np.zeros((2, 4)))
    with pytest.raises(InvalidInputError, match=r"weights must be \(rows, 3\)"):
        scheduler.push(3, np.zeros((2, 4)))
    with pytest.raises(InvalidInputError, match="NaN, infinite or negative"):
        scheduler.push(3, np.array([[0.5, np.nan, 0], [0, 0, 0]]))
    with pytest.raises(InvalidTypeError, match="real numbers"):
        scheduler.push(3, np.array([[True, False, True]]))
    with pytest.raises(InvalidInputError, match="the steps up to position 6 are needed"):
        scheduler.finish()
    a = _hand_made()
    for s in range(3, 7):
        scheduler.push(s, a[:, s, :s])
        if s == 3:
            with pytest.raises(InvalidInputError, match=r"weights must be \(2, 4\)"):
                scheduler.push(4, np.zeros((3, 4)))
    assert scheduler.finish()[2].step_victims.T.tolist() == [[2, 0, 4, 3], [1, 2, 3, 4]]


def test_scheduled_policy_replays_the_schedule_exactly():
    """extend + evict_rows for the prompt, step_rows per step: the scheduled victims at
    their kept-order slots, the rows then holding what the schedule says."""
    schedule = hindsight_schedule(_hand_made(), [2], 2, PROMPT)[2]
    policy = ScheduledPolicy(schedule, 2)
    assert policy.counts.tolist() == [1, 1] and policy.kept_row(0).tolist() == [0]
    policy.extend(np.zeros((2, 3, 3), dtype=np.float32))
    assert policy.counts.tolist() == [3, 3]
    victims = policy.evict_rows(2)
    assert victims.counts.tolist() == [1, 1] and victims.victims.tolist() == [1, 0]
    assert victims.slots.tolist() == [1, 0] and victims.victims.dtype == np.uint32
    for t in range(3, 7):
        before = [policy.kept_row(r).tolist() + [t] for r in range(2)]
        step = policy.step_rows(t, None, 2)
        for r in range(2):
            assert before[r][step.slots[r]] == step.victims[r] == schedule.step_victims[t - 3, r]
            assert policy.kept_row(r).tolist() == schedule.held(t)[r].tolist()
    with pytest.raises(InvalidInputError, match=r"covers positions 3\.\.6"):
        policy.step_rows(7, None, 2)
    with pytest.raises(InvalidInputError, match="cannot be reordered"):
        policy.select_rows([0, 1])
    policy.reset()
    with pytest.raises(InvalidInputError, match="one prompt of 3 tokens"):
        policy.extend(np.zeros((2, 4, 4)))
    policy.extend(np.zeros((2, 3, 3)))
    with pytest.raises(InvalidInputError, match="computed for budget 2, got 3"):
        policy.evict_rows(3)
    with pytest.raises(InvalidInputError, match="expected 3, got 4"):
        policy.step_rows(4, None, 2)
    with pytest.raises(InvalidInputError, match="has 2 rows, the policy was asked for 4"):
        ScheduledPolicy(schedule, 4)


def _row(policy, budget, ppl, **extra):
    return {"policy": policy, "budget": budget, "perplexity": ppl, "label": "-", **extra}


def test_gap_closed_arithmetic():
    assert gap_closed(11.0, 12.0, 10.0) == 50.0
    assert gap_closed(9.5, 12.0, 10.0) == 125.0  # better than hindsight
    assert gap_closed(13.0, 12.0, 10.0) == -50.0
    assert gap_closed(11.0, 12.0, 12.0) is None and gap_closed(11.0, 12.0, 12.5) is None
    assert gap_closed(11.0, None, 10.0) is None and gap_closed(11.0, 12.0, None) is None
    results = [
        _row("full", None, 9.0),
        _row("streaming-llm", 8, 14.0, sinks=0),
        _row("streaming-llm", 8, 12.0, sinks=4),  # the default configuration is the reference
        _row("h2o", 8, 11.0),
        _row("hindsight", 8, 10.0, hindsight_window=32),
        _row("h2o", 16, 10.5),
        _row("streaming-llm", 16, 11.0, sinks=4),  # no hindsight at 16
        _row("scissorhands", 32, 9.75),
        _row("streaming-llm", 32, 10.0, sinks=0),  # only a non-default one: it is the reference
        _row("hindsight", 32, 9.5, hindsight_window=32),
    ]
    assert gap_closed_percent(results) == [None, -100.0, 0.0, 50.0, 100.0, None, None, 50.0, 0.0, 100.0]


def _full_row(policy, budget, ppl, label, **extra):
    return {"policy": policy, "budget": budget, "label": label, "perplexity": ppl,
            "next_token_agreement": 0.9, "top1_accuracy": 0.5, "kv_positions_held_max": budget or 63,
            "kv_positions_held_mean": 10.0, "policy_ms_per_step": 0.1, "bookkeeping_ms_per_step": 0.2,
            "forward_ms_per_step": 50.0, "overhead_percent_of_forward": 0.6, **extra}


def test_eval_table_adds_the_gap_column_only_with_hindsight():
    rows = [_full_row("full", None, 10.0, "-"), _full_row("streaming-llm", 8, 12.0, "sinks=4", sinks=4),
            _full_row("h2o", 8, 11.5, "rw=4 sinks=0")]
    plain = format_table(rows).splitlines()
    assert plain[0].endswith("ovh %") and "gap" not in plain[0]
    assert plain[2] == ("full               - -                10.000     +0.0%  0.900  0.500     63    "
                        "10.0     0.100    0.200     50.0   0.60")
    with_reference = format_table([*rows, _full_row("hindsight", 8, 10.0, "W=32", hindsight_window=32)])
    lines = with_reference.splitlines()
    assert lines[0].endswith("ovh %  gap %")
    assert lines[2].endswith("   0.60      -") and lines[2].startswith(plain[2])
    assert lines[3].endswith("   0.0") and lines[4].endswith("  25.0") and lines[5].endswith(" 100.0")


def _document(results, tokens=64):
    return {"format": "scissorhands.eval", "version": 1,
            "config": {"tokens": tokens, "prompt_tokens": 8, "head_mode": "per-head", "scored_positions": [16, 63],
                       "model": {"path": "/m/tiny"}, "text": {"source": "t.txt", "token_ids_sha256": "ab" * 32}},
            "results": results}


def test_report_merges_hindsight_rows_and_their_gap(tmp_path, capsys):
    """A file with streaming-llm, h2o and hindsight at 8 and 16 (hindsight at 8 only) and
    a file with scissorhands alone: the gap column after budget 8, each cell from its
    own file (none for scissorhands: its file has no references)."""
    first = _document([_row("full", None, 10.0), _row("streaming-llm", 8, 12.0, sinks=4),
                       _row("h2o", 8, 11.0, recent_window=4, sinks=0),
                       _row("hindsight", 8, 10.4, hindsight_window=32),
                       _row("streaming-llm", 16, 11.0, sinks=4)])
    second = _document([_row("full", None, 10.0),
                        _row("scissorhands", 8, 10.8, recent_window=4, sinks=0, history_window=None,
                             vote_rate=False)])
    report = combine_reports([first, second])
    assert report["rows"][-1] == "hindsight W=32" and report["gap_columns"] == [("t.txt", 8)]
    h2o = next(label for label in report["rows"] if label.startswith("h2o "))
    assert report["gaps"][(h2o, ("t.txt", 8))] == pytest.approx(62.5)
    text = format_report(report, markdown=True).splitlines()
    assert text[0] == "| configuration | t.txt @8 | gap @8 | t.txt @16 |"
    assert text[2] == "| full cache | 10.000 | - | 10.000 |"
    rows = {line.split(" | ")[0][2:].split(" ")[0]: line for line in text[3:]}
    assert rows["streaming-llm"].endswith(" | 12.000 (+20.0%) | 0.0% | **11.000 (+10.0%)** |")
    assert rows["h2o"].endswith(" | 11.000 (+10.0%) | 62.5% | - |")
    # The best of the column is a policy's, never the reference's.
    assert rows["scissorhands"].endswith(" | **10.800 (+8.0%)** | - | - |")
    assert text[-1] == "| hindsight W=32 | 10.400 (+4.0%) | 100.0% | - |"
    # Without hindsight rows, no gap column.
    assert "gap" not in format_report(combine_reports([second])).splitlines()[0]

    paths = []
    for index, doc in enumerate((first, second)):
        paths.append(tmp_path / f"{index}.json")
        paths[-1].write_text(json.dumps(doc))
    plot = tmp_path / "report.png"
    pytest.importorskip("matplotlib")
    assert run_report([str(p) for p in paths], plot=str(plot)) == 0
    out = capsys.readouterr().out
    assert "note: gap @budget" in out and plot.stat().st_size > 0
    bad = _document([_row("full", None, 10.0), _row("hindsight", 8, 10.4, hindsight_window=0)])
    with pytest.raises(Exception, match="hindsight window 0 is not a positive integer"):
        combine_reports([bad])
