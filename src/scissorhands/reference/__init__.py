"""Pure-Python reference of the five KV-cache eviction policies: the spec you can read.

This module is the executable statement of what :mod:`scissorhands` computes.  It has
the public API of the C-backed classes (same names, arguments, return types, errors and
``state_dict`` format) and is written to be read in one sitting: clarity over speed.
Every behaviour of the C path is checked against it.

Each policy holds, per row (KV head), ``kept``: the cached positions in ascending order;
rows may hold different counts, and a row may be empty.  A new policy holds position 0.
A decode step shows the policy the new token's attention over the kept positions
(index-aligned with ``kept``, not renormalised); the policy updates its per-position
score, then admits the new position.  ``evict(budget)`` drops positions until
at most ``budget`` remain and returns the victims in ascending order.  ``extend`` applies a
chunk of tokens as the decode steps they stand for (with per-row admission), and
``select_rows`` copies rows into a new set (beams, batch changes).

* :class:`Scissorhands` counts votes: a position earns one on each step where its weight
  strictly exceeds the fair share ``1 / len(attn)`` (Liu et al., NeurIPS 2023,
  arXiv:2305.17118); optionally only over the last ``history_window`` steps.
* :class:`H2O` sums the weights in float64 (Zhang et al., NeurIPS 2023, arXiv:2306.14048).
* :class:`TOVA` keeps only the latest step's weight, in float64, and always keeps the
  newest position (Oren et al., 2024, arXiv:2401.06104).
  All three may pin their first ``sinks`` positions, as StreamingLLM does.
* :class:`StreamingLLM` keeps the first ``sinks`` positions and the most recent ones,
  ignoring attention (Xiao et al., ICLR 2024, arXiv:2309.17453).
* :class:`Full` never evicts: the baseline.

Every class also evicts by an observation window (``evict_observed``,
``evict_observed_rows``: SnapKV, Li et al., 2024, arXiv:2404.14469): the window's rows'
attention summed per held position, max-pooled over kept order, the least pooled
scores evicted outside the sinks and the window's own positions.  It reads the window it
is given and changes nothing but which positions are held.

It imports nothing of the package but :mod:`scissorhands._shared` (what both backends
share), :mod:`scissorhands.options` (the specs) and :mod:`scissorhands.errors`; NumPy only
reads array input and builds the array properties.

The package is split by concern: :mod:`._core` (helpers), the layers of the machinery
every policy shares (:mod:`._object`, :mod:`._evict`, :mod:`._steps`,
:mod:`._observed`, :mod:`._chunks`, each subclassing the one before, and :mod:`._base`
with ``_Policy``), :mod:`._heavy` (the score-based policies' eviction), and one module
per policy defining its class, which :data:`POLICIES` finds by listing the package.
"""

from __future__ import annotations

import importlib
import pkgutil

from scissorhands.options import POLICY_NAMES, PolicyRegistry
from scissorhands.reference._base import _Policy
from scissorhands.reference._core import DBL_MAX as DBL_MAX
from scissorhands.reference._core import _locked as _locked
from scissorhands.reference._core import _weights_or_shape as _weights_or_shape
from scissorhands.reference._core import _widen as _widen
from scissorhands.reference._heavy import _HeavyHitters as _HeavyHitters
from scissorhands.reference.full import Full as Full
from scissorhands.reference.h2o import H2O as H2O
from scissorhands.reference.scissorhands import Scissorhands as Scissorhands
from scissorhands.reference.streaming_llm import StreamingLLM as StreamingLLM
from scissorhands.reference.tova import TOVA as TOVA


def _registry() -> PolicyRegistry[type[_Policy]]:
    """The registry, from every policy module of this package (each module whose name does
    not start with ``_``): the classes each defines that set a registry ``name``, in the
    order of :data:`~scissorhands.options.POLICY_NAMES`."""
    found: dict[str, type[_Policy]] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, _Policy) and "name" in value.__dict__ \
                    and value.__module__ == module.__name__:
                found[value.name] = value
    return PolicyRegistry((name, found[name]) for name in POLICY_NAMES)


#: Registry: name -> class, the same names as the C-backed package, in the registry's
#: order, each the class a policy module of this package defines under that name; an
#: unknown name raises :class:`~scissorhands.errors.UnknownPolicyError`.
POLICIES: PolicyRegistry[type[_Policy]] = _registry()
# The documented classes are imported by name above, for type checkers; every registry
# class is an attribute here too (``scissorhands.reference.<Class>``), so a policy added
# later needs no edit to this file.
globals().update({cls.__name__: cls for cls in POLICIES.values()})

__all__ = sorted(["POLICIES", *(cls.__name__ for cls in POLICIES.values())])
