"""The policies' registry and options: one declaration each, taken whole by every caller.

Every policy is described once, by a :class:`PolicySpec`, the ``SPEC`` of its own module
of :mod:`scissorhands.policies`, gathered in :data:`SPECS`: its registry name, the
options it takes (in constructor order) and their defaults, and the paper.
Every option is described once, by an :class:`OptionSpec`: its constructor keyword,
its default (the seed's semantics: off), how a value is checked against a budget, how
it is written on the command line and in tables.  :class:`PolicyOptions` holds one
configuration's values; the CLI, the evaluation, the transformers cache and the bench
take it whole and ask :func:`make_policy` for a policy, so none of them re-declares an
option or decides by policy name which option applies.

This module is the public face; each concern lives in a module of its own, all
re-exported here under the names they always had:

- :mod:`scissorhands._option_specs`: :class:`OptionSpec`, the five options, their
  parsers and checks (the recent window as a count or a fraction of the budget);
- :mod:`scissorhands._policy_spec`: :class:`PolicySpec`, the check of a configuration
  against a budget and its refusals (:class:`DefaultRefusedError`, :func:`flag_text`);
- :mod:`scissorhands._registry`: :data:`SPECS`, :data:`POLICY_NAMES`,
  :data:`MODEL_POLICIES` (each policy's spec found in its module of
  :mod:`scissorhands.policies`), :func:`policy_spec`, :class:`PolicyRegistry`,
  :func:`policy_classes`;
- :mod:`scissorhands._policy_options`: :class:`PolicyOptions` and :func:`make_policy`;
- :mod:`scissorhands._labels`: a configuration in words (``setting``, ``config_label``,
  ``series_label``, ``shown_values``);
- :mod:`scissorhands._sweep`: :class:`Run`, :func:`sweep`, :func:`with_presets`;
- :mod:`scissorhands._presets`: :class:`Preset`, :data:`RECOMMENDED`, :func:`expand_preset`.

Adding an option therefore means: the C core (``csrc/``), one :class:`OptionSpec` in
:mod:`scissorhands._option_specs` (and the field of :class:`PolicyOptions`), the
constructor of the policy class in both backends (:mod:`scissorhands.policies`,
:mod:`scissorhands.reference`), and tests.

None of these modules imports native code or torch: the reference backend uses them too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _registry

# Every name is re-exported: those of ``__all__`` and those the package and its tests import.
from ._labels import config_label, flag_help, series_label, setting, shown_values  # noqa: F401
from ._option_specs import (  # noqa: F401
    HISTORY_WINDOW,
    OPTIONS,
    POOL,
    POOL_SCOPES,
    RECENT_WINDOW,
    SINKS,
    VOTE_RATE,
    OptionSpec,
    parse_recent_window,
    resolve_recent_window,
    spec_fraction,
)
from ._policy_options import PolicyOptions, make_policy
from ._policy_spec import DefaultRefusedError, PolicySpec, flag_text, protected_message  # noqa: F401
from ._presets import DEFAULT_BUDGET, PRESETS, RECOMMENDED, Preset, expand_preset, preset  # noqa: F401
from ._registry import BACKENDS, PolicyRegistry, policy_classes, policy_spec  # noqa: F401
from ._sweep import Run, sweep, with_presets  # noqa: F401

if TYPE_CHECKING:
    from ._registry import MODEL_POLICIES, POLICY_NAMES, SPECS

__all__ = [
    "BACKENDS",
    "MODEL_POLICIES",
    "OPTIONS",
    "POLICY_NAMES",
    "PRESETS",
    "RECOMMENDED",
    "SPECS",
    "DefaultRefusedError",
    "OptionSpec",
    "PolicyOptions",
    "PolicyRegistry",
    "PolicySpec",
    "Preset",
    "expand_preset",
    "flag_text",
    "make_policy",
    "parse_recent_window",
    "policy_classes",
    "preset",
    "spec_fraction",
    "sweep",
]


def __getattr__(name: str) -> Any:
    """:data:`SPECS`, :data:`POLICY_NAMES` and :data:`MODEL_POLICIES`: the registry's, read
    from :mod:`scissorhands._registry` at each use (which discovers them on the first).

    Raises
    ------
    AttributeError
        Any other name.
    """
    if name in _registry.DISCOVERED:
        return getattr(_registry, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """This module's names, the registry's tables among them."""
    return sorted({*globals(), *_registry.DISCOVERED})
