"""The hindsight reference: eviction decided by the attention still to come.

Not a serving policy (it reads the future), but a reference for ``eval``: how good
eviction can get on this model and text when the victim is the held position that the
next ``W`` decode steps attend to least.  Everything here is NumPy; the full-cache run
that supplies the attention, and the cache that replays the schedule, are
:mod:`scissorhands.hf.hindsight`'s.

The rule (one schedule per budget; rows are (layer, KV head) rows, each independent)
---------------------------------------------------------------------------------------
* ``a_s(h)`` is the attention of the decode step at position ``s`` on position ``h < s``
  in the **full-cache** run of the same teacher-forced tokens, per row: the weights a
  policy sees (the GQA group mean, the token's weight on itself excluded, not
  renormalised).  The decode steps are positions ``P .. L`` (``P`` the prompt's
  length, ``L`` the last position fed to the model).
* The future attention of position ``h`` at step ``t`` is
  ``F_t(h) = sum of a_s(h) for s = t+1 .. min(t+W, L)``, added in float64 in
  increasing ``s`` (each weight widened exactly): the steps that exist, so near the end
  of the text fewer, and none after the last step.
* Prompt (positions ``0 .. P-1``, one chunk, decided at ``t = P - 1``): when ``P`` exceeds
  the budget ``B``, the ``P - B`` positions of least ``F_{P-1}`` are evicted, ties
  evicting the lower position.
* Decode step ``t`` (``P <= t <= L``): position ``t`` joins the row; when the row then
  holds more than ``B``, the one held position of least ``F_t`` is evicted (the new
  position ``t`` is a candidate like any other; no recent window, no sinks), ties
  evicting the lower position, as the library's policies break them.

It is greedy (each victim is chosen for the next ``W`` steps, not for the run), so its
perplexity is no bound: a policy may beat it.  :func:`gap_closed_percent` compares a
configuration with it: the share of StreamingLLM's gap to hindsight a configuration
closes.
"""

from __future__ import annotations

import math
import numbers
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ._shared import RowVictims, check_int
from .errors import InvalidInputError, InvalidTypeError

__all__ = [
    "HindsightSchedule",
    "HindsightScheduler",
    "ScheduledPolicy",
    "gap_closed",
    "gap_closed_percent",
    "hindsight_schedule",
]


class HindsightSchedule:
    """The victims of one budget's hindsight eviction, per row: what
    :class:`ScheduledPolicy` replays.  Built by :class:`HindsightScheduler`; compared by
    identity.

    Attributes
    ----------
    budget : int
        Positions each row holds after every eviction.
    window : int
        ``W``: decode steps of future attention each decision adds up.
    prompt_tokens : int
        ``P``: the prompt's length (positions ``0 .. P-1``, one chunk).
    rows : int
        Independent rows (evicting layers x KV heads of one sequence, layer-major).
    prompt_victims : numpy.ndarray
        ``int64`` ``(rows, max(0, P - budget))``: the positions evicted after the
        prompt, each row ascending.
    step_victims : numpy.ndarray
        ``int64`` ``(steps, rows)``: ``step_victims[i, r]`` is the position row ``r``
        evicts at the decode step of position ``P + i``, or ``-1`` (the row was not
        over the budget).
    """

    def __init__(self, budget: int, window: int, prompt_tokens: int, prompt_victims: np.ndarray,
                 step_victims: np.ndarray) -> None:
        self.budget = budget
        self.window = window
        self.prompt_tokens = prompt_tokens
        self.prompt_victims = prompt_victims
        self.step_victims = step_victims
        self.rows = int(prompt_victims.shape[0])

    @property
    def steps(self) -> int:
        """Decode steps scheduled: positions ``P .. P + steps - 1``."""
        return int(self.step_victims.shape[0])

    def held(self, position: int) -> np.ndarray:
        """The positions every row holds after the step at ``position`` (``P - 1``: after
        the prompt's eviction), ``int64`` ``(rows, n)``, each row ascending.

        Raises
        ------
        InvalidInputError
            ``position`` outside ``[P - 1, P + steps - 1]``.
        """
        last = self.prompt_tokens + self.steps - 1
        position = check_int("position", position, 0, 2**62)
        if not self.prompt_tokens - 1 <= position <= last:
            raise InvalidInputError(f"position must be in [{self.prompt_tokens - 1}, {last}], got {position}")
        held = _remove(np.broadcast_to(np.arange(self.prompt_tokens), (self.rows, self.prompt_tokens)),
                       self.prompt_victims)
        for t in range(self.prompt_tokens, position + 1):
            held = np.concatenate((held, np.full((self.rows, 1), t)), axis=1)
            victims = self.step_victims[t - self.prompt_tokens]
            if victims[0] >= 0:
                held = _remove(held, victims[:, None])
        return held

    def __repr__(self) -> str:
        return (f"HindsightSchedule(budget={self.budget}, window={self.window}, prompt_tokens="
                f"{self.prompt_tokens}, rows={self.rows}, steps={self.steps})")


def _remove(held: np.ndarray, victims: np.ndarray) -> np.ndarray:
    """``held`` ``(rows, n)`` without each row's ``victims`` ``(rows, k)`` (all held)."""
    if victims.shape[1] == 0:
        return np.array(held)
    keep = ~(held[:, :, None] == victims[:, None, :]).any(axis=2)
    return held[keep].reshape(held.shape[0], held.shape[1] - victims.shape[1])


class HindsightScheduler:
    """Computes the hindsight schedules of several budgets from a full-cache run's
    attention, fed one decode step at a time (:meth:`push`), holding only the last
    ``window`` steps.

    Each decision waits until the ``window`` steps after it have arrived (the prompt's
    until step ``P - 1 + window``), so memory stays at ``window`` steps of attention:
    ``window x rows x N`` float32 at most, plus one float64 ``(rows, N)`` sum.

    Parameters
    ----------
    budgets : iterable of int
        Budgets to schedule, each >= 1 (duplicates are one).
    window : int
        ``W`` >= 1: decode steps of future attention per decision.
    prompt_tokens : int
        ``P`` >= 1: positions of the prompt chunk; the decode steps start at ``P``.
    last_position : int
        ``L`` >= ``P - 1``: the last decode step's position (``L = P - 1``: no decode step).

    Raises
    ------
    InvalidTypeError, InvalidInputError
        A value that is not an integer, or out of range (no budget given included).
    """

    def __init__(self, budgets: Iterable[int], window: int, prompt_tokens: int, last_position: int) -> None:
        self.window = check_int("window", window, 1, 2**31)
        self.prompt_tokens = check_int("prompt_tokens", prompt_tokens, 1, 2**31)
        self.last_position = check_int("last_position", last_position, self.prompt_tokens - 1, 2**31)
        self.budgets = sorted({check_int("budget", b, 1, 2**32 - 1) for b in budgets})
        if not self.budgets:
            raise InvalidInputError("at least one budget is needed")
        self.rows: int | None = None
        self._next = self.prompt_tokens  # the next position push() takes
        self._decided = self.prompt_tokens - 1  # the next decision: the prompt's
        self._steps: deque[tuple[int, np.ndarray]] = deque()
        self._held: dict[int, np.ndarray] = {}
        self._prompt_victims: dict[int, np.ndarray] = {}
        self._step_victims: dict[int, np.ndarray] = {}
        self._done = False

    def push(self, position: int, weights: Any) -> None:
        """The attention of the decode step at ``position``: ``weights`` ``(rows,
        position)`` (any real dtype; float32 as a policy sees it), column ``h`` the
        weight on position ``h``.  Steps come in order, ``P`` first; every decision
        whose window is complete is made.

        Raises
        ------
        InvalidInputError
            A position out of order or past ``last_position``, a shape other than
            ``(rows, position)`` (rows fixed by the first call), or weights that are
            NaN, infinite or negative; nothing changes then.
        InvalidTypeError
            Weights that are not real numbers.
        """
        if self._done or position != self._next or position > self.last_position:
            raise InvalidInputError(f"push: expected the step at position {self._next} (last "
                                    f"{self.last_position}), got {position}")
        array = np.asarray(weights)
        if array.dtype.kind not in "fiu" or array.dtype == np.bool_:
            raise InvalidTypeError(f"weights must be real numbers, got {array.dtype}")
        rows = array.shape[0] if array.ndim == 2 else -1
        if array.ndim != 2 or array.shape[1] != position or rows < 1 or (self.rows is not None and rows != self.rows):
            expected = f"({'rows' if self.rows is None else self.rows}, {position})"
            raise InvalidInputError(f"weights must be {expected}, got shape {array.shape}")
        if array.size and not (np.isfinite(array).all() and array.min() >= 0):
            raise InvalidInputError(f"the weights of step {position} hold NaN, infinite or negative values")
        if self.rows is None:
            self.rows = rows
            steps = self.last_position - self.prompt_tokens + 1
            for budget in self.budgets:
                self._step_victims[budget] = np.full((steps, rows), -1, dtype=np.int64)
        self._steps.append((position, array.copy()))
        self._next += 1
        while self._decided + self.window <= position:
            self._decide()

    def finish(self) -> dict[int, HindsightSchedule]:
        """Make the remaining decisions (their windows cut at the last step) and return
        each budget's schedule.

        Raises
        ------
        InvalidInputError
            Not every decode step up to ``last_position`` was pushed (with no decode
            step at all, ``rows`` is unknown), or ``finish`` was called before.
        """
        if self._done or self._next != self.last_position + 1 or self.rows is None:
            raise InvalidInputError(f"finish: the steps up to position {self.last_position} are needed, "
                                    f"the next expected is {self._next}")
        while self._decided <= self.last_position:
            self._decide()
        self._done = True
        self._steps.clear()
        return {budget: HindsightSchedule(budget, self.window, self.prompt_tokens,
                                          self._prompt_victims[budget], self._step_victims[budget])
                for budget in self.budgets}

    def _future(self, t: int) -> np.ndarray:
        """``F_t`` over positions ``0 .. t``: float64 ``(rows, t + 1)``."""
        assert self.rows is not None
        total = np.zeros((self.rows, t + 1), dtype=np.float64)
        for position, weights in self._steps:  # in increasing position
            if position > t + self.window:
                break
            if position > t:
                total += weights[:, : t + 1]
        return total

    def _decide(self) -> None:
        t = self._decided
        assert self.rows is not None
        future = self._future(t)
        rows = self.rows
        every = np.arange(rows)
        for budget in self.budgets:
            if t == self.prompt_tokens - 1:
                over = max(0, self.prompt_tokens - budget)
                # Stable: equal sums keep position order, so the lower position goes first.
                order = np.argsort(future, axis=1, kind="stable")
                self._prompt_victims[budget] = np.sort(order[:, :over], axis=1)
                self._held[budget] = np.sort(order[:, over:], axis=1)
                continue
            held = np.concatenate((self._held[budget], np.full((rows, 1), t, dtype=np.int64)), axis=1)
            if held.shape[1] > budget:
                # argmin takes the first least sum: the lowest position (rows ascend).
                slot = np.take_along_axis(future, held, axis=1).argmin(axis=1)
                self._step_victims[budget][t - self.prompt_tokens] = held[every, slot]
                keep = np.ones(held.shape, dtype=bool)
                keep[every, slot] = False
                held = held[keep].reshape(rows, -1)
            self._held[budget] = held
        self._decided += 1
        while self._steps and self._steps[0][0] <= self._decided:
            self._steps.popleft()  # no later decision reads a step at or before its own


def hindsight_schedule(attention: Any, budgets: Iterable[int], window: int,
                       prompt_tokens: int) -> dict[int, HindsightSchedule]:
    """Each budget's schedule from a whole attention array at once (tests, small traces).

    Parameters
    ----------
    attention : array-like
        ``(rows, T, T)`` real: ``attention[r, s, h]`` is row ``r``'s weight of the
        decode step at position ``s`` on position ``h``; read only for
        ``prompt_tokens <= s <= T - 1`` and ``h < s`` (the decode steps are positions
        ``P .. T - 1``).
    budgets, window, prompt_tokens
        As :class:`HindsightScheduler` takes them (``T >= P``).

    Raises
    ------
    InvalidInputError, InvalidTypeError
        What :class:`HindsightScheduler` refuses; a shape that is not ``(rows, T, T)``
        with ``T >= prompt_tokens``, or no decode step.
    """
    array = np.asarray(attention)
    prompt = check_int("prompt_tokens", prompt_tokens, 1, 2**31)
    if array.ndim != 3 or array.shape[1] != array.shape[2] or array.shape[1] <= prompt:
        raise InvalidInputError(f"attention must be (rows, T, T) with T > prompt_tokens ({prompt}), "
                                f"got shape {array.shape}")
    scheduler = HindsightScheduler(budgets, window, prompt, array.shape[1] - 1)
    for s in range(prompt, array.shape[1]):
        scheduler.push(s, array[:, s, :s])
    return scheduler.finish()


# ----------------------------------------------------------------------------- the replay


class ScheduledPolicy:
    """A schedule replayed through the calls a policy bank makes
    (:class:`scissorhands.hf.rows.PolicyRows`): the rows of one sequence, each holding
    its positions ascending (kept order), evicting exactly the scheduled victims.

    Duck-typed like the library's policies for what the bank uses: ``extend`` (only
    the prompt chunk, on a fresh object), ``evict_rows``, ``step_rows``, ``counts``,
    ``kept_row``, ``reset``, ``memory_bytes``; ``select_rows`` refuses.  The attention
    handed in is never read (its shape only where ``extend`` needs the chunk's length).

    Parameters
    ----------
    schedule : HindsightSchedule
    heads : int
        Rows of the object; must equal ``schedule.rows``.

    Raises
    ------
    InvalidTypeError
        ``schedule`` is not a :class:`HindsightSchedule`.
    InvalidInputError
        ``heads`` is not ``schedule.rows``.
    """

    def __init__(self, schedule: HindsightSchedule, heads: int) -> None:
        if not isinstance(schedule, HindsightSchedule):
            raise InvalidTypeError(f"schedule must be a HindsightSchedule, not {type(schedule).__name__}")
        heads = check_int("heads", heads, 1, 2**31)
        if heads != schedule.rows:
            raise InvalidInputError(f"the schedule has {schedule.rows} rows, the policy was asked for {heads}: "
                                    "a hindsight schedule replays one sequence's rows")
        self.schedule = schedule
        self.budget = schedule.budget
        self.heads = heads
        self.reset()

    def reset(self) -> None:
        """Fresh again: every row holds position 0, nothing admitted."""
        self._kept = np.zeros((self.heads, 1), dtype=np.int64)
        self._last = 0
        self._fresh = True
        self._prompt_pending = False

    @property
    def counts(self) -> np.ndarray:
        """Positions held per row, ``uint32`` ``(heads,)`` (every row holds as many)."""
        return np.full(self.heads, self._kept.shape[1], dtype=np.uint32)

    def kept_row(self, head: int) -> np.ndarray:
        """Row ``head``'s positions, ascending, ``uint32`` (a copy).

        Raises
        ------
        InvalidTypeError, InvalidInputError
            ``head`` not an integer in ``[0, heads)``.
        """
        head = check_int("head", head, 0, self.heads - 1)
        return self._kept[head].astype(np.uint32)

    def memory_bytes(self) -> int:
        """Bytes of the held positions (the schedule itself is not counted)."""
        return int(self._kept.nbytes)

    def _check_budget(self, budget: int | None) -> None:
        if budget is not None and budget != self.budget:
            raise InvalidInputError(f"the schedule was computed for budget {self.budget}, got {budget}")

    def extend(self, attn: Any, admit: Any = None) -> None:
        """The prompt chunk on a fresh object: positions ``0 .. P-1`` join every row.

        Raises
        ------
        InvalidInputError
            Not fresh, a chunk other than the schedule's prompt (``attn`` of shape
            ``(heads, P, W)``), or tokens left out by ``admit``.
        """
        shape = np.shape(attn)
        prompt = self.schedule.prompt_tokens
        if not self._fresh or len(shape) != 3 or shape[0] != self.heads or shape[1] != prompt:
            raise InvalidInputError(f"a hindsight schedule replays one prompt of {prompt} tokens on a fresh "
                                    f"policy of {self.heads} rows, got a chunk of shape {shape}"
                                    + ("" if self._fresh else " after the prompt"))
        if admit is not None and not np.asarray(admit).all():
            raise InvalidInputError("a hindsight schedule admits every token (no padding)")
        self._kept = np.broadcast_to(np.arange(prompt, dtype=np.int64), (self.heads, prompt)).copy()
        self._last = prompt - 1
        self._fresh = False
        self._prompt_pending = True

    def evict_rows(self, budget: int | None = None) -> RowVictims:
        """After the prompt: the scheduled prompt victims; at any other time nothing.

        Raises
        ------
        InvalidInputError
            ``budget`` other than the schedule's.
        """
        self._check_budget(budget)
        if not self._prompt_pending:
            return _victims(np.zeros((self.heads, 0), dtype=np.int64), np.zeros((self.heads, 0), dtype=np.int64))
        self._prompt_pending = False
        victims = self.schedule.prompt_victims
        slots = victims  # the prompt's rows hold 0 .. P-1: a position is its slot
        self._kept = _remove(self._kept, victims)
        return _victims(victims, slots)

    def step_rows(self, pos: int, attn: Any = None, budget: int | None = None) -> RowVictims:
        """Decode step ``pos``: the position joins every row, then each row evicts its
        scheduled victim (if any). ``attn`` is not read.

        Raises
        ------
        InvalidInputError
            ``pos`` is not the next position or is past the schedule, ``budget`` is
            not the schedule's, or a scheduled victim is not held (the schedule belongs
            to other rows); nothing changes then.
        """
        pos = check_int("pos", pos, 0, 2**62)
        self._check_budget(budget)
        first, steps = self.schedule.prompt_tokens, self.schedule.steps
        if self._fresh or pos != self._last + 1 or pos >= first + steps:
            raise InvalidInputError(f"step_rows: the schedule covers positions {first}..{first + steps - 1} "
                                    f"after its prompt, one at a time; expected {self._last + 1}, got {pos}")
        held = np.concatenate((self._kept, np.full((self.heads, 1), pos, dtype=np.int64)), axis=1)
        victims = self.schedule.step_victims[pos - first]
        evicting = victims >= 0
        if evicting.any():
            if not evicting.all():
                raise InvalidInputError(f"step {pos}: the schedule evicts in some rows only")
            slots = (held < victims[:, None]).sum(axis=1)
            if not (held[np.arange(self.heads), np.minimum(slots, held.shape[1] - 1)] == victims).all():
                raise InvalidInputError(f"step {pos}: a scheduled victim is not held; the schedule "
                                        "belongs to other rows")
            keep = np.ones(held.shape, dtype=bool)
            keep[np.arange(self.heads), slots] = False
            self._kept = held[keep].reshape(self.heads, -1)
            self._last = pos
            return _victims(victims[:, None], slots[:, None])
        self._kept = held
        self._last = pos
        return _victims(np.zeros((self.heads, 0), dtype=np.int64), np.zeros((self.heads, 0), dtype=np.int64))

    def select_rows(self, index: Any) -> None:
        """Refused: a schedule replays the rows it was computed for.

        Raises
        ------
        InvalidInputError
            Always.
        """
        raise InvalidInputError("a hindsight schedule replays the rows it was computed for; "
                                "it cannot be reordered or copied")

    def __repr__(self) -> str:
        return f"ScheduledPolicy({self.schedule!r}, held={self._kept.shape[1]})"


def _victims(victims: np.ndarray, slots: np.ndarray) -> RowVictims:
    """``(rows, k)`` victims and their kept-order slots as a :class:`RowVictims`."""
    rows, k = victims.shape
    return RowVictims(np.full(rows, k, dtype=np.uint32), victims.reshape(-1).astype(np.uint32),
                      slots.reshape(-1).astype(np.int64))


# ----------------------------------------------------------------------------- comparing with it


def gap_closed(perplexity: float, streaming: float | None, hindsight: float | None) -> float | None:
    """The share of StreamingLLM's gap to hindsight that ``perplexity`` closes, in percent:
    ``100 * (streaming - perplexity) / (streaming - hindsight)``.

    100 is as good as hindsight, 0 as good as StreamingLLM; above 100 is possible
    (hindsight is greedy, no bound), and so is below 0.  None when either reference is
    missing or ``streaming - hindsight <= 0`` (hindsight no better than StreamingLLM).
    """
    if streaming is None or hindsight is None:
        return None
    gap = streaming - hindsight
    if not gap > 0 or not math.isfinite(gap):
        return None
    return 100.0 * (streaming - perplexity) / gap


def _is_default_streaming(result: Mapping[str, Any]) -> bool:
    return result.get("sinks") in (None, 4)


def gap_closed_percent(results: Sequence[Mapping[str, Any]]) -> list[float | None]:
    """:func:`gap_closed` of every result row of one run (one ``eval --json`` file's
    ``results``), in order: each evicting row against the StreamingLLM row and the
    hindsight row of its budget in the same rows.

    The StreamingLLM reference is its default configuration (4 sinks) when present,
    else the first StreamingLLM row of the budget; the hindsight reference is the first
    hindsight row of the budget.  None for the full cache, and where :func:`gap_closed`
    gives none.
    """
    streaming: dict[int, float] = {}
    hindsight: dict[int, float] = {}
    default: set[int] = set()  # budgets whose reference is StreamingLLM's default
    for r in results:
        budget, ppl = r.get("budget"), r.get("perplexity")
        if budget is None or isinstance(ppl, bool) or not isinstance(ppl, numbers.Real):
            continue
        if r.get("policy") == "streaming-llm" and budget not in default:
            if budget not in streaming or _is_default_streaming(r):
                streaming[budget] = float(ppl)
            if _is_default_streaming(r):
                default.add(budget)
        elif r.get("policy") == "hindsight":
            hindsight.setdefault(budget, float(ppl))
    out: list[float | None] = []
    for r in results:
        budget = r.get("budget")
        if budget is None or r.get("policy") == "full" or not isinstance(r.get("perplexity"), numbers.Real):
            out.append(None)
            continue
        out.append(gap_closed(float(r["perplexity"]), streaming.get(budget), hindsight.get(budget)))
    return out
