"""The machinery every C-backed policy shares, in layers by concern, each a module
that subclasses the one before: input conversion (:mod:`._weights`), the object, its
lock, pins, validation and inspection (:mod:`._core`), the decode loop (:mod:`._decode`),
row-wise and observed evictions (:mod:`._rows`), chunks, the prompt and row selection
(:mod:`._chunks`), and here plain-data state.

A subclass names its C kind, its constructor parameters and its score array; all the
behaviour lives in these modules and in ``csrc/``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from scissorhands._labels import shown_values
from scissorhands._native import check, ffi, lib
from scissorhands._registry import policy_spec
from scissorhands._shared import (
    STATE_FORMAT,
    STATE_VERSION,
    parse_held,
    parse_history,
    parse_state,
    partial_repr,
)
from scissorhands.policies._chunks import _ChunkCalls
from scissorhands.policies._weights import _DTYPE_CODES as _DTYPE_CODES  # re-exported
from scissorhands.policies._weights import _NULL
from scissorhands.policies._weights import as_weights as as_weights  # re-exported


class NativePolicy(_ChunkCalls):
    """Base of the C-backed policies; see the subclasses for the public API."""

    # ------------------------------------------------------------ state

    def _params(self) -> dict[str, Any]:
        """The constructor parameters but rng, as ``state_dict()["params"]`` records
        them: budget, the policy's first option, heads, then its other options that are
        not at their default (so that a default configuration's state is as it was
        before those options existed)."""
        shown = shown_values(self.name, self._options)
        first = dict(list(shown.items())[:1])
        params = {"budget": self._budget, **first, "heads": self._heads,
                  **{k: v for k, v in shown.items() if k not in first}}
        if self._pins:
            params["pins"] = [list(span) for span in self._pins]
        return params

    def _sink_count(self) -> int:
        return min(self._options["sinks"], self.kept_count())

    def state_dict(self) -> dict[str, Any]:
        """The policy as plain data (ints, floats, lists, str), loadable by
        :meth:`from_state_dict` of either backend; versioned. A Scissorhands policy
        with a history window adds ``"history"`` (its vote registers) and one with a
        vote rate ``"steps_held"``, both shaped like ``"kept"``. Rows may hold
        different counts (a row may be empty): each list is then as long as its row."""
        counts, positions, scores, history, held, last = self._export(with_history=True)
        ends = np.cumsum(counts, dtype=np.int64)[:-1]

        def rows(flat: np.ndarray) -> list[list[Any]]:
            return [part.tolist() for part in np.split(flat, ends)]

        state: dict[str, Any] = {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "policy": self.name,
            "params": self._params(),
            "kept": rows(positions),
        }
        if self._score_name is not None and scores is not None:
            state[self._score_name] = rows(scores)
        if history is not None:
            state["history"] = rows(history)
        if held is not None:
            state["steps_held"] = rows(held)
        state["last_position"] = last  # read under the same lock as the arrays
        return state

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> NativePolicy:
        """Rebuild a policy from :meth:`state_dict` output (of either backend).

        Raises
        ------
        InvalidInputError
            Wrong format, version or policy name; not ``heads`` rows; positions
            not strictly ascending within a row or above ``last_position``; per-slot
            rows not as long as kept's; scores out of range;
            ``history`` missing although ``params`` sets a history window (or present
            although none is set), a register with a bit at or above the window, or
            votes that are not the registers' popcounts; ``steps_held`` missing
            although ``params`` sets ``vote_rate`` (or present although not), or a
            slot with more votes (or register bits) than steps held.
        InvalidTypeError
            A field of the wrong kind.

        Rows may hold different counts, and a row may be empty. A state without the
        optional parameters (``sinks`` of the ranking policies, ``history_window``
        and ``vote_rate`` of Scissorhands: states written before they existed) loads
        with their defaults.
        """
        spec = policy_spec(cls.name)
        names = [o.name for o in spec.options]
        required = ("budget", *names[:1], "heads")
        keeps_registers = spec.takes("history_window")
        optional_keys = ("history", "steps_held") if keeps_registers else ()
        policy, rows = parse_state(state, cls.name, cls._score_name, required, cls, (*names[1:], "pins"),
                                   optional_keys)
        history = held = None
        if keeps_registers:
            history = parse_history(state, policy._options["history_window"], rows)
            held = parse_held(state, policy._options["vote_rate"], rows, history)
        votes_ptr = scores_ptr = ffi.NULL
        if cls._score_name == "votes":
            votes_ptr = ffi.from_buffer("uint32_t[]", rows.scores)
        elif cls._score_name == "scores":
            scores_ptr = ffi.from_buffer("double[]", rows.scores)
        rc = lib.sh_policy_import_rows(
            policy._ptr, policy._heads, ffi.from_buffer("uint32_t[]", rows.counts),
            ffi.from_buffer("uint32_t[]", rows.kept), votes_ptr, scores_ptr,
            _NULL if history is None else ffi.from_buffer("uint64_t[]", history),
            _NULL if held is None else ffi.from_buffer("uint32_t[]", held), rows.last)
        check(rc, cls.__name__)
        with policy._lock:
            policy._last = rows.last
            policy._sync()
        return policy

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        return (type(self).from_state_dict, (self.state_dict(),))

    def __repr__(self) -> str:
        """Never raises (also for a policy whose constructor was refused part-way)."""
        try:
            params = ", ".join(f"{k}={v}" for k, v in self._params().items())
            with self._lock:
                held = f"{int(self._counts_locked().min())}..{self._n}" if self._ragged else str(self._n)
        except Exception:  # a partly built object: what it has
            return partial_repr(self)
        return f"{type(self).__name__}({params}, held={held})"



class RankingPolicy(NativePolicy):
    """Base of the policies that rank positions by a per-slot key and protect sinks and a
    recent window (every policy that reads attention and evicts), as
    ``reference._HeavyHitters`` is."""

    @property
    def recent_window(self) -> int:
        """The most recent positions that are never evicted."""
        return self._options["recent_window"]

    @property
    def sinks(self) -> int:
        """The first positions held that are never evicted."""
        return self._options["sinks"]

    def sink_count(self) -> int:
        """Sinks held: ``min(sinks, kept_count())``."""
        return self._sink_count()
