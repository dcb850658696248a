"""A saved state (``state_dict()``) checked field by field, before either backend builds
anything from it."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from ._limits import UINT32_MAX, check_int
from .errors import InvalidInputError, InvalidTypeError

# ----------------------------------------------------------------------------- state

#: ``state_dict()["format"]`` and ``["version"]``.
STATE_FORMAT = "scissorhands.policy"
STATE_VERSION = 1


class StateRows(NamedTuple):
    """Checked per-slot data of a state: row ``h`` holds ``counts[h]`` entries, and
    the arrays hold the rows one after another (``counts.sum()`` entries; C-contiguous,
    as ``sh_policy_import_rows`` takes them)."""

    counts: np.ndarray
    kept: np.ndarray
    scores: np.ndarray | None
    last: int

    def split(self, flat: np.ndarray) -> list[list[Any]]:
        """``flat`` (one of the arrays) as a list of rows of Python numbers."""
        values = flat.tolist()
        out, at = [], 0
        for n in self.counts.tolist():
            out.append(values[at:at + n])
            at += n
        return out


def _rows(state: Mapping[str, Any], key: str) -> list[list[Any]]:
    rows = state.get(key)
    if not isinstance(rows, (list, tuple)) or not all(isinstance(r, (list, tuple)) for r in rows):
        raise InvalidTypeError(f"state[{key!r}] must be a list of lists")
    return [list(r) for r in rows]


def _rows_like(state: Mapping[str, Any], key: str, counts: np.ndarray) -> list[list[Any]]:
    """``state[key]`` as rows, which must be as many and as long as kept's: one value
    per kept slot."""
    rows = _rows(state, key)
    if [len(r) for r in rows] != counts.tolist():
        raise InvalidInputError(f"state[{key!r}] row lengths {[len(r) for r in rows]} differ from "
                                f"kept's {counts.tolist()}")
    return rows


def _present_exactly_when(state: Mapping[str, Any], key: str, on: bool, option: str) -> bool:
    """Whether ``state`` holds ``key``, which it must exactly when ``params[option]`` is on."""
    if on and key not in state:
        raise InvalidInputError(f"state[{key!r}] is missing (params[{option!r}] is set)")
    if not on and key in state:
        raise InvalidInputError(f"state[{key!r}] needs params[{option!r}]")
    return on


def _int_rows(rows: list[list[Any]], key: str, high: int = UINT32_MAX,
              dtype: Any = np.uint32) -> np.ndarray:
    """Rows of integers in ``[0, high]``, one after another, as a C-contiguous
    ``dtype`` array."""
    flat = _numeric_rows(rows, (int,))
    if flat is not None and (flat.size == 0 or (int(flat.min()) >= 0 and int(flat.max()) <= high)):
        return np.ascontiguousarray(flat, dtype=dtype)
    for row in rows:  # the element that is refused, named
        for v in row:
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise InvalidTypeError(f"state[{key!r}] must hold integers, found {type(v).__name__}")
            if not 0 <= int(v) <= high:
                raise InvalidInputError(f"state[{key!r}] value {v} outside [0, {high}]")
    return np.array([int(v) for row in rows for v in row], dtype=dtype)


def _numeric_rows(rows: list[list[Any]], types: tuple[type, ...]) -> np.ndarray | None:
    """Every row as one flat array when each holds only Python numbers of exactly the
    ``types`` given (never bools: ``bool`` is a type of its own here), read at C speed;
    else None, and the element-wise check runs and names what it refuses."""
    parts: list[np.ndarray] = []
    for row in rows:
        if not isinstance(row, list) or not set(map(type, row)) <= set(types):
            return None
        if row:
            parts.append(np.array(row))
    if not parts:
        return np.zeros(0, dtype=np.int64)
    flat = np.concatenate(parts)
    return flat if flat.dtype.kind in "iuf" else None


def _float_rows(rows: list[list[Any]], key: str) -> np.ndarray:
    flat = _numeric_rows(rows, (int, float))
    if flat is not None and bool(np.isfinite(flat).all()) and bool((flat >= 0).all()):
        return flat.astype(np.float64) + 0.0
    for row in rows:  # the element that is refused, named
        for v in row:
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise InvalidTypeError(f"state[{key!r}] must hold real numbers, found {type(v).__name__}")
            if not (math.isfinite(float(v)) and float(v) >= 0):
                raise InvalidInputError(f"state[{key!r}] value {v} is not finite and >= 0")
    # + 0.0 turns -0.0 into 0.0: the C selection orders scores by their bits.
    return np.array([v for row in rows for v in row], dtype=np.float64) + 0.0


def _ascending_within_rows(flat: np.ndarray, counts: np.ndarray) -> bool:
    """Whether each row of ``flat`` (rows of ``counts`` entries) strictly ascends."""
    if flat.size < 2:
        return True
    rising = np.diff(flat.astype(np.int64)) > 0
    starts = np.cumsum(counts.astype(np.int64))[:-1]  # where rows 1.. begin
    starts = starts[(starts >= 1) & (starts <= flat.size - 1)]
    rising[starts - 1] = True  # the step from one row's last to the next row's first
    return bool(rising.all())


def parse_state(
    state: Any, name: str, score_name: str | None, param_names: tuple[str, ...],
    build: Callable[..., Any], optional_params: tuple[str, ...] = (),
    optional_keys: tuple[str, ...] = (),
) -> tuple[Any, StateRows]:
    """Check ``state`` against the ``state_dict()`` format for policy ``name`` and
    return ``(policy, rows)``, ``rows`` a :class:`StateRows` (positions and scores,
    row after row); the policy is ``build(**params)``, called as soon as the
    parameters are checked (order: format, version, policy, params, kept,
    last_position, scores).

    Rows may hold different counts, and a row may be empty. ``params`` must hold every
    name of ``param_names`` and may hold those of ``optional_params`` (states written
    before those existed lack them); the state may hold the keys of
    ``optional_keys``, which the caller checks. Any mapping is read.

    Raises
    ------
    InvalidTypeError
        ``state`` or a field of the wrong kind.
    InvalidInputError
        Wrong format, version or policy name; missing or unknown keys or parameters;
        not ``heads`` rows; positions not strictly ascending within a row or above
        ``last_position``; per-slot rows not as long as kept's; a vote out of the
        uint32 range; a score NaN, infinite or negative.
    """
    if not isinstance(state, Mapping):
        raise InvalidTypeError(f"state must be a dict, not {type(state).__name__}")
    keys = {"format", "version", "policy", "params", "kept", "last_position"}
    if score_name is not None:
        keys.add(score_name)
    if not keys <= set(state) <= keys | set(optional_keys):
        raise InvalidInputError(f"state keys must be {sorted(keys)}"
                                + (f" (optionally {sorted(optional_keys)})" if optional_keys else "")
                                + f", got {sorted(state)}")
    if state.get("format") != STATE_FORMAT:
        raise InvalidInputError(f"not a scissorhands policy state (format {state.get('format')!r})")
    check_int("version", state.get("version"), STATE_VERSION, STATE_VERSION)
    if state.get("policy") != name:
        raise InvalidInputError(f"state is of policy {state.get('policy')!r}, not {name!r}")
    params = state.get("params")
    if not isinstance(params, Mapping):
        raise InvalidTypeError("state['params'] must be a dict")
    if not set(param_names) <= set(params) <= set(param_names) | set(optional_params):
        raise InvalidInputError(f"state params must be {sorted(param_names)}"
                                + (f" (optionally {sorted(optional_params)})" if optional_params else "")
                                + f", got {sorted(params)}")
    policy = build(**params)
    rows = _rows(state, "kept")
    if len(rows) != policy.heads:
        raise InvalidInputError(f"state has {len(rows)} rows of positions, params say heads={policy.heads}")
    counts = np.array([len(r) for r in rows], dtype=np.uint32)
    kept = _int_rows(rows, "kept")
    if not _ascending_within_rows(kept, counts):
        raise InvalidInputError("state['kept'] rows must be strictly ascending")
    last = check_int("last_position", state.get("last_position"), 0, UINT32_MAX)
    if kept.size and int(kept.max()) > last:
        raise InvalidInputError("state['kept'] holds a position above last_position")
    scores = None
    if score_name is not None:
        rows = _rows_like(state, score_name, counts)
        scores = _int_rows(rows, "votes") if score_name == "votes" else _float_rows(rows, "scores")
    return policy, StateRows(counts, kept, scores, last)


def parse_history(state: Mapping[str, Any], window: int | None, rows: StateRows) -> np.ndarray | None:
    """The vote registers of a Scissorhands state (``state["history"]``), row after
    row as ``rows``' arrays, ``uint64``, or None for a policy without a history window.

    Present exactly when ``window`` is set; each register an integer below
    ``2**window`` whose popcount is the slot's vote count."""
    if not _present_exactly_when(state, "history", window is not None, "history_window") or window is None:
        return None
    values = _rows_like(state, "history", rows.counts)
    history = _int_rows(values, "history", (1 << window) - 1, np.uint64)
    bits = np.array([int(v).bit_count() for row in values for v in row], dtype=np.int64)
    votes = np.zeros(0, dtype=np.uint32) if rows.scores is None else rows.scores
    if np.any(bits != votes.astype(np.int64)):
        raise InvalidInputError("state['votes'] must equal the number of vote bits in state['history']")
    return history


def parse_held(state: Mapping[str, Any], vote_rate: bool, rows: StateRows,
               history: np.ndarray | None) -> np.ndarray | None:
    """The steps held of a Scissorhands state (``state["steps_held"]``), row after row
    as ``rows``' arrays, ``uint32``, or None for a policy without a vote rate.

    Present exactly when ``vote_rate`` is set; each slot has at least as many steps
    held as votes, and no register bit at or above its steps held (a slot votes only
    on steps it was held)."""
    if not _present_exactly_when(state, "steps_held", vote_rate, "vote_rate"):
        return None
    held = _int_rows(_rows_like(state, "steps_held", rows.counts), "steps_held")
    votes = np.zeros(0, dtype=np.uint32) if rows.scores is None else rows.scores
    if np.any(votes > held):
        raise InvalidInputError("a slot of state['votes'] has more votes than state['steps_held']")
    if history is not None:
        for register, steps in zip(history.tolist(), held.tolist()):
            if steps < 64 and register >> steps:
                raise InvalidInputError("a register of state['history'] has a vote bit older than "
                                        "its state['steps_held']")
    return held
