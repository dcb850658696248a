"""Presets: named configurations chosen by measurements the docs cite
(:data:`RECOMMENDED`), their lookup by name and their expansion where a policy name goes
(:func:`expand_preset`).  Re-exported by :mod:`scissorhands.options`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._policy_options import PolicyOptions

__all__ = ["DEFAULT_BUDGET", "PRESETS", "RECOMMENDED", "Preset", "expand_preset", "preset"]


#: The budget a preset takes when none is given (the transformers cache's and
#: ``generate``'s default), said wherever it is used.
DEFAULT_BUDGET = 512


@dataclass(frozen=True)
class Preset:
    """A named configuration: a policy with explicit option values (and whether the
    prompt is held and decided at its end), chosen by measurements the docs cite.

    Attributes
    ----------
    name : str
        What callers pass where a policy name goes (``"recommended"``).
    policy : str
        The registry name it resolves to.
    values : mapping
        Option name -> value, as :class:`PolicyOptions` takes them.
    prompt_aware : bool
        Whether the transformers cache holds the prompt and evicts at its end.
    budget_rule : str
        How to choose the budget, in words (the preset does not fix one).
    source : str
        Where the measurements that chose it are.
    """

    name: str
    policy: str
    values: Mapping[str, Any]
    prompt_aware: bool
    budget_rule: str
    source: str

    @property
    def options(self) -> PolicyOptions:
        """The option values as a :class:`PolicyOptions`."""
        return PolicyOptions(**self.values)

    def describe(self, budget: int | None = None, *, defaulted: bool = False) -> str:
        """One line: the name, what it resolves to and the budget (said to be the
        default when ``defaulted``), e.g. ``recommended = scissorhands recent_window=0.75
        sinks=4 prompt_aware=True, budget 512 (the default)``."""
        parts = " ".join(f"{k}={v}" for k, v in self.values.items())
        text = f"{self.name} = {self.policy} {parts} prompt_aware={self.prompt_aware}"
        if budget is not None:
            text += f", budget {budget}" + (" (the default; pass a budget to change it)" if defaulted else "")
        return text

    def as_dict(self) -> dict[str, Any]:
        """Plain data for a result's JSON: ``preset``, ``policy``, the option values,
        ``prompt_aware``."""
        return {"preset": self.name, "policy": self.policy, **dict(self.values), "prompt_aware": self.prompt_aware}


#: The recommendation: Scissorhands with three quarters of the budget as its recent
#: window and 4 sinks (the best evicting configuration at 5x compression on both texts
#: of docs/configuration.md's perplexity sweep), holding the prompt and deciding at its
#: end (the fact a question in the prompt asks for: docs/tasks.md).  The seed's
#: defaults (``Scissorhands(...)``, ``--policy scissorhands``) are unchanged.
RECOMMENDED = Preset(
    name="recommended", policy="scissorhands", values={"recent_window": 0.75, "sinks": 4}, prompt_aware=True,
    budget_rule="a fifth of the tokens the cache will see (5x compression, where it was measured; at an "
    "eighth it loses more); at least 21, so that the observation window of 16 and the 4 sinks leave room",
    source="docs/configuration.md (perplexity), docs/tasks.md (retrieval)")

#: Every preset by name (a name no policy has).
PRESETS: dict[str, Preset] = {RECOMMENDED.name: RECOMMENDED}


def preset(name: Any) -> Preset | None:
    """The preset named ``name``, or None when ``name`` is not one (a policy's name)."""
    return PRESETS.get(name) if isinstance(name, str) else None


def expand_preset(policy: Any, options: PolicyOptions | None, option_values: Mapping[str, Any],
                  prompt_aware: bool | None) -> tuple[Any, PolicyOptions | None, dict[str, Any], bool]:
    """A policy name that may be a preset, resolved: ``(policy, options,
    option_values, prompt_aware)`` with the preset's values under whatever was given
    explicitly (an option keyword, ``options``, ``prompt_aware``); a policy name passes
    through, ``prompt_aware=None`` read as False and any other value as given (the
    cache checks it is a bool)."""
    chosen = preset(policy)
    if chosen is None:
        return policy, options, dict(option_values), False if prompt_aware is None else prompt_aware  # checked later
    values = dict(chosen.values)
    if options is not None and isinstance(options, PolicyOptions):
        values.update(options.given())
        options = None
    values.update(option_values)
    return chosen.policy, options, values, chosen.prompt_aware if prompt_aware is None else prompt_aware
