"""The reference's :class:`_Policy`, the last layer: what a policy shows of its rows
(counts, kept positions, a position's slot) and its plain-data state (``state_dict``,
``from_state_dict``, pickling, ``repr``).  The layers below it, each subclassing the one
before: :mod:`._object`, :mod:`._evict`, :mod:`._steps`, :mod:`._observed`,
:mod:`._chunks`.
"""

from __future__ import annotations

import bisect
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from scissorhands._shared import (
    STATE_FORMAT,
    STATE_VERSION,
    check_int,
    parse_held,
    parse_history,
    parse_state,
    partial_repr,
    ragged_counts_error,
)
from scissorhands.errors import InvalidTypeError
from scissorhands.options import SPECS, shown_values
from scissorhands.reference._chunks import _Chunks
from scissorhands.reference._core import _locked


class _Policy(_Chunks):
    """What every policy shares: kept rows, admission, validation, growth, state.

    A subclass sets the class attributes of :class:`~._object._PolicyObject` and overrides
    :meth:`_update` (how the attention changes the per-position scores) and
    :meth:`_victim_slots` (which slots an eviction drops).
    """

    # -- inspection -----------------------------------------------------------------

    def kept_count(self) -> int:
        """Number of positions held per head (every head holds the same number).

        Raises
        ------
        InvalidInputError
            The rows hold different counts (read ``counts``, ``kept_row(head)`` or
            ``state_dict()``).
        """
        counts = self._counts()
        if any(n != counts[0] for n in counts):
            raise ragged_counts_error("kept_count()")
        return counts[0]

    @property
    def counts(self) -> np.ndarray:
        """Positions held by each row: uint32, shape ``(heads,)``."""
        return np.array(self._counts(), dtype=np.uint32)

    def kept_row(self, head: int) -> np.ndarray:
        """Positions held by row ``head``, ascending: uint32, shape ``(counts[head],)``.

        Raises
        ------
        InvalidTypeError
            ``head`` is not an integer.
        InvalidInputError
            ``head`` is outside ``[0, heads)``.
        """
        head = check_int("head", head, 0, self.heads - 1)
        return np.array(self._kept[head], dtype=np.uint32)

    @property
    def kept(self) -> np.ndarray:
        """Held positions, uint32, ascending: shape ``(n,)``, or ``(heads, n)`` if heads > 1.

        Raises
        ------
        InvalidInputError
            The rows hold different counts.
        """
        return self._as_array(self._kept, np.uint32, "kept")

    def _as_array(self, rows: list[list[Any]], dtype: Any, name: str) -> np.ndarray:
        """Rows of one count as ``(n,)`` or ``(heads, n)``; rows of different counts raise."""
        counts = self._counts()
        if any(n != counts[0] for n in counts):
            raise ragged_counts_error(name)
        arr = np.array(rows, dtype=dtype).reshape(self.heads, counts[0])
        return arr[0] if self.heads == 1 else arr

    def _slot_of(self, pos: Any, head: Any) -> int | None:
        """Slot of ``pos`` in row ``head``, or None when it is not held."""
        if isinstance(pos, (bool, np.bool_)) or not isinstance(pos, numbers.Integral):
            raise InvalidTypeError(f"pos must be an integer, not {type(pos).__name__}")
        head = check_int("head", head, 0, self.heads - 1)
        row = self._kept[head]
        i = bisect.bisect_left(row, int(pos))
        return i if i < len(row) and row[i] == pos else None

    # -- plain-data state -----------------------------------------------------------

    def _params(self) -> dict[str, Any]:
        """``state_dict()["params"]``: budget, the first option, heads, then the other
        options not at their default (the C-backed classes record the same)."""
        shown = shown_values(self.name, self._options)
        first = dict(list(shown.items())[:1])
        params = {"budget": self.budget, **first, "heads": self.heads,
                  **{k: v for k, v in shown.items() if k not in first}}
        if self._pins:
            params["pins"] = [list(span) for span in self._pins]
        return params

    @_locked
    def state_dict(self) -> dict[str, Any]:
        """The state as plain data (JSON-ready), loadable by either backend.

        Returns
        -------
        dict
            ``{"format": "scissorhands.policy", "version": 1, "policy": name, "params":
            {...}, "kept": [[int]*n]*heads, "last_position": int}`` plus ``"votes"``
            (Scissorhands) or ``"scores"`` (a float64 score): the spec's ``score_key``,
            shaped like ``"kept"``; and for a Scissorhands policy with a history window
            ``"history"``: each slot's vote register (bit ``j`` = the vote of the step ``j``
            steps back), also shaped like ``"kept"``.  Rows may differ in length (a row
            may be empty).
        """
        state: dict[str, Any] = {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "policy": self.name,
            "params": self._params(),
            "kept": [list(row) for row in self._kept],
        }
        if self._score_key is not None:
            state[self._score_key] = [list(row) for row in self._scores]
        if self._history is not None:
            state["history"] = [list(row) for row in self._history]
        if self._held is not None:
            state["steps_held"] = [list(row) for row in self._held]
        state["last_position"] = self._last
        return state

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> Any:
        """Rebuild a policy from :meth:`state_dict` output (of either backend).

        Every field is validated; capacity grows from its initial value, one doubling at
        a time, until the state fits.  ``params`` may lack the optional parameters
        (``sinks`` of the policies scoring positions, ``history_window`` of Scissorhands), as
        states written before they existed do: they take their defaults.  ``history``
        is present exactly when ``params`` sets a history window.

        Raises
        ------
        InvalidTypeError
            ``state`` or a field has the wrong kind (not a dict, not a list, a non-integer
            position or vote, a non-real score).
        InvalidInputError
            Wrong format, version or policy name; missing or unknown keys; parameters out
            of range; not ``heads`` rows, or per-slot rows not as long as kept's (rows may
            differ in length, and may be empty); positions not strictly ascending within
            a row, out of range or above ``last_position``; votes out of range; scores NaN,
            infinite or negative; ``history`` missing or unexpected, a register with a bit
            at or above the window, or a vote count that is not its register's number of
            bits.
        """
        spec = SPECS[cls.name]
        names = [o.name for o in spec.options]
        keeps_registers = spec.takes("history_window")
        policy, rows = parse_state(
            state, cls.name, cls._score_key, ("budget", *names[:1], "heads"), cls, (*names[1:], "pins"),
            ("history", "steps_held") if keeps_registers else ())
        if rows.scores is not None:
            policy._scores = rows.split(rows.scores)
        if keeps_registers:
            history = parse_history(state, policy._options["history_window"], rows)
            held = parse_held(state, policy._options["vote_rate"], rows, history)
            policy._history = None if history is None else rows.split(history)
            policy._held = None if held is None else rows.split(held)
        policy._kept = rows.split(rows.kept)
        policy._last = rows.last
        policy._grow_to(int(rows.counts.max()))
        return policy

    def __reduce__(self) -> tuple[Any, ...]:
        # pickle and copy.deepcopy go through the state dict.
        return (type(self).from_state_dict, (self.state_dict(),))

    def __repr__(self) -> str:
        """Never raises (also for a policy whose constructor was refused part-way)."""
        try:
            params = ", ".join(f"{k}={v}" for k, v in self._params().items())
            counts = self._counts()
            held = str(counts[0]) if min(counts) == max(counts) else f"{min(counts)}..{max(counts)}"
        except Exception:  # a partly built object: what it has
            return partial_repr(self)
        return f"{type(self).__name__}({params}, held={held})"
