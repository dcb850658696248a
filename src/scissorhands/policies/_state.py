"""Validation of ``state_dict()`` data for the C-backed policies."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from scissorhands.errors import UINT32_MAX, InvalidInputError, InvalidTypeError, check_int

STATE_FORMAT = "scissorhands.policy"
STATE_VERSION = 1


def _rows(state: dict[str, Any], key: str) -> list[list[Any]]:
    rows = state.get(key)
    if not isinstance(rows, (list, tuple)) or not all(isinstance(r, (list, tuple)) for r in rows):
        raise InvalidTypeError(f"state[{key!r}] must be a list of lists")
    if not rows or len({len(r) for r in rows}) != 1:
        raise InvalidInputError(f"state[{key!r}] must hold one or more rows of equal length")
    return rows


def _rows_like(state: dict[str, Any], key: str, shape: tuple[int, ...]) -> list[list[Any]]:
    """``state[key]`` as rows, which must have ``shape``: one value per kept slot."""
    rows = _rows(state, key)
    if (len(rows), len(rows[0])) != shape:
        raise InvalidInputError(f"state[{key!r}] shape {(len(rows), len(rows[0]))} differs from kept {shape}")
    return rows


def _present_exactly_when(state: dict[str, Any], key: str, on: bool, option: str) -> bool:
    """Whether ``state`` holds ``key``, which it must exactly when ``params[option]`` is on."""
    if on and key not in state:
        raise InvalidInputError(f"state[{key!r}] is missing (params[{option!r}] is set)")
    if not on and key in state:
        raise InvalidInputError(f"state[{key!r}] needs params[{option!r}]")
    return on


def _int_rows(rows: list[list[Any]], key: str, high: int = UINT32_MAX,
              dtype: Any = np.uint32) -> np.ndarray:
    """Rows of integers in ``[0, high]`` as a C-contiguous ``dtype`` array."""
    for row in rows:
        for v in row:
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise InvalidTypeError(f"state[{key!r}] must hold integers, found {type(v).__name__}")
            if not 0 <= v <= high:
                raise InvalidInputError(f"state[{key!r}] value {v} outside [0, {high}]")
    return np.ascontiguousarray(np.array([[int(v) for v in row] for row in rows], dtype=dtype))


def _float_rows(rows: list[list[Any]], key: str) -> np.ndarray:
    for row in rows:
        for v in row:
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise InvalidTypeError(f"state[{key!r}] must hold real numbers, found {type(v).__name__}")
            if not (math.isfinite(v) and v >= 0):
                raise InvalidInputError(f"state[{key!r}] value {v} is not finite and >= 0")
    return np.ascontiguousarray(np.array(rows, dtype=np.float64))


def parse_state(
    state: Any, name: str, score_name: str | None, param_names: tuple[str, ...],
    build: Callable[..., Any], optional_params: tuple[str, ...] = (),
    optional_keys: tuple[str, ...] = (),
) -> tuple[Any, np.ndarray, np.ndarray | None, int]:
    """Check ``state`` against the ``state_dict()`` format for policy ``name`` and
    return ``(policy, kept, scores, last_position)``, arrays ``(heads, n)``; the
    policy is ``build(**params)``, called as soon as the parameters are checked (the
    reference's order: format, version, policy, params, kept, last_position, scores).

    ``params`` must hold every name of ``param_names`` and may hold those of
    ``optional_params`` (states written before those existed lack them); the state may
    hold the keys of ``optional_keys``, which the caller checks. Any mapping is read."""
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
    if len(rows[0]) < 1:
        raise InvalidInputError("state must hold at least one position per row")
    kept = _int_rows(rows, "kept")
    if np.any(np.diff(kept.astype(np.int64), axis=1) <= 0):
        raise InvalidInputError("state['kept'] rows must be strictly ascending")
    last = check_int("last_position", state.get("last_position"), 0, UINT32_MAX)
    if int(kept.max()) > last:
        raise InvalidInputError("state['kept'] holds a position above last_position")
    scores = None
    if score_name is not None:
        rows = _rows_like(state, score_name, kept.shape)
        scores = _int_rows(rows, "votes") if score_name == "votes" else _float_rows(rows, "scores")
    return policy, kept, scores, last


def parse_history(state: dict[str, Any], window: int | None, votes: np.ndarray) -> np.ndarray | None:
    """The vote registers of a Scissorhands state (``state["history"]``), as a
    ``(heads, n)`` ``uint64`` array, or None for a policy without a history window.

    Present exactly when ``window`` is set; each register an integer below
    ``2**window`` whose popcount is the slot's vote count."""
    if not _present_exactly_when(state, "history", window is not None, "history_window"):
        return None
    rows = _rows_like(state, "history", votes.shape)
    history = _int_rows(rows, "history", (1 << window) - 1, np.uint64)
    counts = np.array([[int(v).bit_count() for v in row] for row in rows], dtype=np.int64)
    if np.any(counts != votes.astype(np.int64)):
        raise InvalidInputError("state['votes'] must equal the number of vote bits in state['history']")
    return history


def parse_held(state: dict[str, Any], vote_rate: bool, votes: np.ndarray,
               history: np.ndarray | None) -> np.ndarray | None:
    """The steps held of a Scissorhands state (``state["steps_held"]``), as a
    ``(heads, n)`` ``uint32`` array, or None for a policy without a vote rate.

    Present exactly when ``vote_rate`` is set; each slot has at least as many steps
    held as votes, and no register bit at or above its steps held (a slot votes only
    on steps it was held)."""
    if not _present_exactly_when(state, "steps_held", vote_rate, "vote_rate"):
        return None
    held = _int_rows(_rows_like(state, "steps_held", votes.shape), "steps_held")
    if np.any(votes > held):
        raise InvalidInputError("a slot of state['votes'] has more votes than state['steps_held']")
    if history is not None:
        for register, steps in zip(history.ravel().tolist(), held.ravel().tolist()):
            if steps < 64 and register >> steps:
                raise InvalidInputError("a register of state['history'] has a vote bit older than "
                                        "its state['steps_held']")
    return held
