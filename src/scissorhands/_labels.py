"""A configuration in words: as the replay table names it (:func:`setting`), as the eval
table labels it (:func:`config_label`), across budgets (:func:`series_label`), the
values a replay or a state names (:func:`shown_values`), and an option's flag help as
the registry fills it in (:func:`flag_help`).  Re-exported by :mod:`scissorhands.options`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import _registry
from ._option_specs import RECENT_WINDOW, OptionSpec, _listed
from ._policy_spec import PolicySpec
from ._registry import policy_spec

__all__ = ["config_label", "flag_help", "series_label", "setting", "shown_values"]


def flag_help(option: OptionSpec, several: bool) -> str:
    """``option``'s flag help: with what several values do when ``several``, else without;
    ``{policies}`` (those taking the option), ``{defaults}`` (each one's default) and
    ``{least}`` (a policy's least recent window) come from the registry."""
    takers = [spec for spec in _registry.SPECS.values() if spec.takes(option.name)]
    groups: dict[str, list[str]] = {}
    for spec in takers:
        groups.setdefault(option.text(spec.default(option.name)), []).append(spec.name)
    least = "".join(f"; {spec.name} needs at least {spec.min_recent_window}"
                    for spec in takers if option is RECENT_WINDOW and spec.min_recent_window)
    return (option.help.replace("{sweep}", f"; {option.sweep}" if several else "")
            .replace("{policies}", _listed([spec.name for spec in takers]))
            .replace("{defaults}", ", ".join(f"{_listed(names)} {value}" for value, names in groups.items()))
            .replace("{least}", least))


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
