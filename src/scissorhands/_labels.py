"""A configuration in words: as the replay table names it (:func:`setting`), as the eval
table labels it (:func:`config_label`), across budgets (:func:`series_label`), and the
values a replay or a state names (:func:`shown_values`).  Re-exported by
:mod:`scissorhands.options`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._option_specs import RECENT_WINDOW, OptionSpec
from ._policy_spec import PolicySpec
from ._registry import policy_spec

__all__ = ["config_label", "series_label", "setting", "shown_values"]


def _flag_text(option: OptionSpec, value: Any) -> str:
    """An option shown only when set: its short name for a flag turned on
    (``rate``), else ``short=value`` (``pool=layer``)."""
    return option.short if value is True else f"{option.short}={option.text(value)}"


def _shown(spec: PolicySpec, values: Mapping[str, Any]) -> list[tuple[OptionSpec, Any]]:
    return [(o, values.get(o.name, spec.default(o.name))) for o in spec.options]


def setting(policy: str, values: Mapping[str, Any]) -> str:
    """A configuration as the replay table names it: the policy's first option, then
    the others that are not at their default (``recent window 32, sinks 4``); ``-`` for
    a policy without options."""
    spec = policy_spec(policy)
    parts = [f"{o.long} {o.text(v)}" for i, (o, v) in enumerate(_shown(spec, values))
             if i == 0 or v != spec.default(o.name)]
    return ", ".join(parts) or "-"


def config_label(policy: str, values: Mapping[str, Any], window_spec: str | None = None) -> str:
    """A configuration as the eval table labels it: every option of the policy
    (``rw=51 (50%) sinks=0 hw=off``), a flag only when on; ``-`` without options.
    ``window_spec`` is the fraction the recent window came from, when given as one."""
    spec = policy_spec(policy)
    parts = []
    for option, value in _shown(spec, values):
        if not option.show_off:
            if value != spec.default(option.name):
                parts.append(_flag_text(option, value))
            continue
        text = f"{option.short}={option.text(value)}"
        if option is RECENT_WINDOW and window_spec is not None:
            text += f" ({window_spec})"
        parts.append(text)
    return " ".join(parts) or "-"


def series_label(policy: str, values: Mapping[str, Any], window_spec: str | None = None) -> str:
    """A configuration across budgets (a plot line, a report row): the policy and its
    options as given (a recent window given as a fraction stays that fraction), options
    off by default shown only when set (``scissorhands rw=50% sinks=4 hw=32 rate``)."""
    spec = policy_spec(policy)
    parts = [policy]
    for option, value in _shown(spec, values):
        if option is RECENT_WINDOW:
            parts.append(f"rw={value if window_spec is None else window_spec}")
        elif not option.show_off:
            if value != spec.default(option.name):
                parts.append(_flag_text(option, value))
        elif option.default is None and value is None:
            continue
        else:
            parts.append(f"{option.short}={option.text(value)}")
    return " ".join(parts)


def shown_values(policy: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The values a replay names (its first option, then those not at their default)."""
    spec = policy_spec(policy)
    return {o.name: v for i, (o, v) in enumerate(_shown(spec, values))
            if i == 0 or v != spec.default(o.name)}
