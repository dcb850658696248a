"""Replaying a known-answer vector step on a policy: how ``vectors/*.json`` is read.

The tests replay every case with :func:`check_case` on both backends; the generator
(``vectors/generate.py``) runs the same function on the reference before it writes a
file, so the format is read in exactly one way.  The format is described in
``vectors/README.md``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

FORMAT = "scissorhands-vectors"
VERSION = 1

#: Index of the attention argument in ``args``, for the calls that take one.
ATTN_ARG = {"on_decode_step": 1, "step": 1, "step_rows": 1, "prefill": 0, "extend": 0,
            "evict_observed": 0, "evict_observed_rows": 0}


def make_policy(module: Any, policy: str, case: dict[str, Any]) -> Any:
    """Build the case's starting policy: ``Cls(**params)`` or ``Cls.from_state_dict(state)``."""
    cls = module.POLICIES[policy]
    if "state" in case:
        return cls.from_state_dict(json.loads(json.dumps(case["state"])))
    return cls(**case["params"])


def arguments(step: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """The step's positional and keyword arguments; ``dtype`` makes the attention an array."""
    args = list(step.get("args", []))
    if "dtype" in step:
        i = ATTN_ARG[step["call"]]
        args[i] = np.asarray(args[i], dtype=step["dtype"])
    return args, dict(step.get("kwargs", {}))


def plain(value: Any) -> Any:
    """A call's result as JSON-comparable data (arrays and tuples become lists)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, np.generic):
        return value.item()
    return value


def call(policy: Any, step: dict[str, Any]) -> Any:
    """Apply one step (a method call, or a property read) and return its plain result."""
    args, kwargs = arguments(step)
    attr = getattr(policy, step["call"])
    return plain(attr(*args, **kwargs) if callable(attr) else attr)


class VectorError(AssertionError):
    """The reference disagrees with a hand-written answer."""


def check_case(module: Any, errors: Any, policy: str, c: dict[str, Any]) -> None:
    """Replay one case on ``module``'s classes; raise VectorError on any disagreement."""
    where = f"{policy}: {c['name']}"
    if "raises" in c:
        try:
            make_policy(module, policy, c)
        except getattr(errors, c["raises"]):
            return
        raise VectorError(f"{where}: construction did not raise {c['raises']}")
    p = make_policy(module, policy, c)
    for i, step in enumerate(c["steps"]):
        if "raises" in step:
            before = p.state_dict()
            try:
                call(p, step)
            except getattr(errors, step["raises"]):
                if p.state_dict() != before:
                    raise VectorError(f"{where}: step {i} {step} changed the state") from None
                continue
            raise VectorError(f"{where}: step {i} {step} did not raise {step['raises']}")
        got = call(p, step)
        if got != step["expect"]:
            raise VectorError(f"{where}: step {i} {step}: got {got!r}")
