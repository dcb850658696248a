"""Validation of ``state_dict()`` data for the C-backed policies."""

from __future__ import annotations

import math
import numbers
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


def _int_rows(rows: list[list[Any]], key: str) -> np.ndarray:
    for row in rows:
        for v in row:
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise InvalidTypeError(f"state[{key!r}] must hold integers, found {type(v).__name__}")
            if not 0 <= v <= UINT32_MAX:
                raise InvalidInputError(f"state[{key!r}] value {v} outside [0, 2**32 - 1]")
    return np.ascontiguousarray(np.array(rows, dtype=np.uint32))


def _float_rows(rows: list[list[Any]], key: str) -> np.ndarray:
    for row in rows:
        for v in row:
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise InvalidTypeError(f"state[{key!r}] must hold real numbers, found {type(v).__name__}")
            if not (math.isfinite(v) and v >= 0):
                raise InvalidInputError(f"state[{key!r}] value {v} is not finite and >= 0")
    return np.ascontiguousarray(np.array(rows, dtype=np.float64))


def parse_state(
    state: Any, name: str, score_name: str | None, param_names: tuple[str, ...]
) -> tuple[dict[str, Any], np.ndarray, np.ndarray | None, int]:
    """Check ``state`` against the ``state_dict()`` format for policy ``name`` and
    return ``(params, kept, scores, last_position)``, arrays ``(heads, n)``."""
    if not isinstance(state, dict):
        raise InvalidTypeError(f"state must be a dict, not {type(state).__name__}")
    keys = {"format", "version", "policy", "params", "kept", "last_position"}
    if score_name is not None:
        keys.add(score_name)
    if set(state) != keys:
        raise InvalidInputError(f"state keys must be {sorted(keys)}, got {sorted(state)}")
    if state.get("format") != STATE_FORMAT:
        raise InvalidInputError(f"not a scissorhands policy state (format {state.get('format')!r})")
    if state.get("version") != STATE_VERSION:
        raise InvalidInputError(f"unsupported state version {state.get('version')!r}")
    if state.get("policy") != name:
        raise InvalidInputError(f"state is of policy {state.get('policy')!r}, not {name!r}")
    params = state.get("params")
    if not isinstance(params, dict):
        raise InvalidTypeError("state['params'] must be a dict")
    if set(params) != set(param_names):
        raise InvalidInputError(f"state params must be {sorted(param_names)}, got {sorted(params)}")
    kept = _int_rows(_rows(state, "kept"), "kept")
    scores = None
    if score_name == "votes":
        scores = _int_rows(_rows(state, "votes"), "votes")
    elif score_name == "scores":
        scores = _float_rows(_rows(state, "scores"), "scores")
    if scores is not None and scores.shape != kept.shape:
        raise InvalidInputError(f"state[{score_name!r}] shape {scores.shape} differs from kept {kept.shape}")
    last = check_int("last_position", state.get("last_position"), 0, UINT32_MAX)
    if kept.shape[1] < 1:
        raise InvalidInputError("state must hold at least one position per row")
    if np.any(np.diff(kept.astype(np.int64), axis=1) <= 0) or int(kept.max()) > last:
        raise InvalidInputError("state['kept'] rows must be strictly ascending and <= last_position")
    return dict(params), kept, scores, last
