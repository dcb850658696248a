"""Pure-Python reference of the KV-cache eviction policies: the spec you can read.

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

Each policy is one module of this package, whose docstring and class state its rule and
cite its paper: a count of votes for a weight above the fair share ``1 / len(attn)``
(:class:`Scissorhands`, Liu et al., NeurIPS 2023, arXiv:2305.17118, optionally over the
last ``history_window`` steps), the weights summed in float64 (:class:`H2O`), the latest
step's weight alone; each of these may pin its first ``sinks`` positions, as
:class:`StreamingLLM` does, which keeps them and the most recent ones and ignores
attention; :class:`Full` never evicts: the baseline.

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
per policy defining its class, which :data:`POLICIES` takes from the module its spec names
(:func:`scissorhands._registry.backend_registry`, as :mod:`scissorhands.policies` does).
"""

from __future__ import annotations

from scissorhands._registry import PolicyRegistry, backend_registry
from scissorhands.reference._base import _Policy
from scissorhands.reference._core import DBL_MAX as DBL_MAX
from scissorhands.reference._core import _locked as _locked
from scissorhands.reference._core import _weights_or_shape as _weights_or_shape
from scissorhands.reference._core import _widen as _widen
from scissorhands.reference._heavy import _HeavyHitters as _HeavyHitters

#: Registry: name -> class, the same names as the C-backed package, in the registry's
#: order, each the class its spec names in this package's module of the same name; an
#: unknown name raises :class:`~scissorhands.errors.UnknownPolicyError`.
POLICIES: PolicyRegistry[type[_Policy]] = backend_registry(__name__)
# Every registry class is an attribute of the package (``scissorhands.reference.<Class>``),
# found in its module, so a policy added later needs no edit to this file.
globals().update({cls.__name__: cls for cls in POLICIES.values()})

__all__ = sorted(["POLICIES", *(cls.__name__ for cls in POLICIES.values())])
