"""Writing scenarios: a step, a decode step, a case, a state, float32 rounding, and the
names and notes the cases share."""

from __future__ import annotations

from typing import Any

import numpy as np
from vector_runner import ATTN_ARG

U32 = 2**32 - 1
IIE = "InvalidInputError"
ITE = "InvalidTypeError"

# --------------------------------------------------------------------------------------
# Writing scenarios.
# --------------------------------------------------------------------------------------

_NONE_CALLS = {"on_decode_step", "prefill", "reset", "extend", "select_rows"}


def s(call_name: str, *args: Any, expect: Any = ..., raises: str | None = None,
      dtype: str | None = None, **kwargs: Any) -> dict[str, Any]:
    """One step.  ``expect`` is the hand-written answer (None for the calls returning None)."""
    step: dict[str, Any] = {"call": call_name, "args": list(args)}
    if kwargs:
        step["kwargs"] = kwargs
    if dtype is not None:
        step["dtype"] = dtype
        i = ATTN_ARG[call_name]
        # Write the float32 values exactly (as their widening to double) so that
        # np.asarray(values, dtype="float32") reproduces them bit for bit.
        step["args"][i] = np.asarray(args[i], dtype=dtype).astype(np.float64).tolist()
    if raises is not None:
        step["raises"] = raises
    elif expect is not ...:
        step["expect"] = expect
    elif call_name in _NONE_CALLS:
        step["expect"] = None
    else:
        raise ValueError(f"step {call_name}{args} needs a hand-written expect or raises")
    return step


def on(pos: Any, attn: Any = None, **kw: Any) -> dict[str, Any]:
    """``on_decode_step(pos, attn)``."""
    return s("on_decode_step", pos, attn, **kw)


def case(name: str, note: str, steps: list[dict[str, Any]], raises: str | None = None,
         state: dict[str, Any] | None = None, **params: Any) -> dict[str, Any]:
    """A case: a name, why its answers are right, a starting policy and its steps."""
    c: dict[str, Any] = {"name": name, "note": note}
    if state is not None:
        c["state"] = state
    else:
        c["params"] = params
    if raises is not None:
        c["raises"] = raises
    c["steps"] = steps
    return c


def state(policy: str, params: dict[str, Any], kept: list[list[int]], last: int,
          **scores: list[list[Any]]) -> dict[str, Any]:
    """A ``state_dict()`` literal."""
    d: dict[str, Any] = {"format": "scissorhands.policy", "version": 1, "policy": policy,
                         "params": params, "kept": kept}
    d.update(scores)
    d["last_position"] = last
    return d


def f32(x: float) -> float:
    """``x`` rounded to float32 and widened back to double, exactly."""
    return float(np.float32(x))


RAGGED_NOTE = ("Memory counts 4 bytes for each row's count when there are several rows: "
               "64 + 4 * heads + capacity * heads * bytes per slot.")
