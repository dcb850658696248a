"""One configuration's option values, :class:`PolicyOptions`, taken whole by every
caller, and :func:`make_policy`, which builds a policy of either backend from them.
Re-exported by :mod:`scissorhands.options`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from ._option_specs import POOL, RECENT_WINDOW, SINKS, _check_pool, resolve_recent_window, spec_fraction
from ._policy_spec import _same
from ._registry import policy_classes, policy_spec
from .errors import InvalidInputError, InvalidTypeError

__all__ = ["PolicyOptions", "make_policy"]


@dataclass(frozen=True)
class PolicyOptions:
    """The option values of one configuration, for any policy.

    A policy takes the options its :class:`PolicySpec` lists; an option set for a
    policy that does not take it is refused (:meth:`check_taken`), as its constructor
    refuses the keyword, so a value is never silently dropped.

    Parameters
    ----------
    recent_window : int, float, Fraction, str or None, default None
        Newest positions never evicted (the policies ranking positions): a count, a
        fraction of the budget in ``[0, 1)``, or a ``"50%"``/``"0.5x"`` spec, rounded
        down; None: each policy's own default (:meth:`PolicySpec.default`: 32, or 1 for
        a policy with a least recent window of 1).
    sinks : int or None, default None
        First positions never evicted (every evicting policy); None: each policy's own
        default (StreamingLLM 4, the others 0).
    history_window : int or None, default None
        Scissorhands: decode steps a vote counts for (1-64); None: forever.
    vote_rate : bool, default False
        Scissorhands: evict by votes per decode step held.
    pool : int or {"layer", "model"}, default 1
        The policies ranking positions: consecutive rows sharing one budget (Ada-KV);
        ``"layer"`` and ``"model"`` are resolved by the transformers cache (``pools``).
    """

    recent_window: int | float | Fraction | str | None = None
    sinks: int | None = None
    history_window: int | None = None
    vote_rate: bool = False
    pool: int | str = 1

    def __post_init__(self) -> None:
        # NumPy scalars kept as the Python numbers they equal (what a sweep's arrays give),
        # so that the options print, compare and serialise as the same options written by hand.
        for option in dataclasses.fields(self):
            value = getattr(self, option.name)
            if isinstance(value, np.generic):
                object.__setattr__(self, option.name, value.item())

    def values(self, policy: str, budget: int | None,
               pools: Mapping[str, int] | None = None) -> dict[str, Any]:
        """The constructor keywords of ``policy`` at ``budget``: only the options it
        takes, a recent-window spec resolved to positions, ``recent_window=None`` and
        ``sinks=None`` left out (the policy's default), a pool named by scope resolved
        by ``pools`` (scope -> rows).

        Raises
        ------
        InvalidTypeError
            An option set (not at this class's default) that ``policy`` does not take.
        InvalidInputError
            An unknown policy; a pool named by a scope that ``pools`` does not resolve.
        """
        spec = policy_spec(policy)
        self.check_taken(policy)
        out: dict[str, Any] = {}
        for option in spec.options:
            value = getattr(self, option.name)
            if option in (RECENT_WINDOW, SINKS) and value is None:
                continue
            if option is RECENT_WINDOW and isinstance(value, str):
                value = resolve_recent_window(value, budget if budget is not None else 0)
            if option is POOL and isinstance(value, str):
                value = _check_pool(value, 0)
                if isinstance(value, str):
                    if pools is None or value not in pools:
                        raise InvalidInputError(
                            f"pool {value!r} needs a model's layers and KV heads (the transformers "
                            "cache resolves it); a policy takes a number of rows")
                    value = pools[value]
            out[option.name] = value
        return out

    def given(self) -> dict[str, Any]:
        """The options set: those not at this class's defaults (which mean "each
        policy's own"), by the same test as :meth:`PolicySpec.is_default` (``pool=1``
        and ``"head"`` are the default; ``True`` or ``0`` for ``vote_rate`` are not)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not _same(value, f.default) and not (f.name == "pool" and value == "head"):
                out[f.name] = value
        return out

    def check_taken(self, policy: str) -> None:
        """Refuse options set for a policy that does not take them (the constructor
        would refuse the keyword; one configuration is one policy's).

        Raises
        ------
        InvalidTypeError
            The first such option, named with the policy and the options it takes.
        InvalidInputError
            Unknown policy.
        """
        spec = policy_spec(policy)
        for name, value in self.given().items():
            if not spec.takes(name):
                takes = ", ".join(o.name for o in spec.options) or "no options"
                raise InvalidTypeError(f"{policy} takes no {name} (it takes {takes}), got {name}={value!r}")

    def replace(self, **changes: Any) -> PolicyOptions:
        """A copy with some values changed."""
        return dataclasses.replace(self, **changes)


def make_policy(name: str, budget: int | None, options: PolicyOptions | None = None, *,
                heads: int = 1, backend: str = "native", pools: Mapping[str, int] | None = None,
                pins: Any = ()) -> Any:
    """Build one policy of the registry, configured by ``options``.

    Parameters
    ----------
    name : str
        A registry name (a key of :data:`~scissorhands._registry.SPECS`).
    budget : int or None
        Positions held per row after each eviction; None only for ``full``.
    options : PolicyOptions, optional
        The option values (default: every option at its default); an option set that
        the policy does not take is refused.
    heads : int, default 1
        Independent rows in the policy object.
    backend : {"native", "reference"}
    pools : mapping, optional
        Rows per pool of each scope a ``pool`` option may name (``{"layer": 3,
        "model": 90}``); see :meth:`PolicyOptions.values`.
    pins : sequence of (start, stop), default ()
        Spans pinned at construction; a recent window given as a fraction (``0.75``,
        ``"75%"``) is then that fraction of what the pins and sinks leave of the budget.

    Raises
    ------
    InvalidInputError, InvalidTypeError
        Unknown name or backend, a missing budget, an option the policy does not take,
        or values the policy refuses; all before anything is built.
    """
    spec = policy_spec(name)
    options = options or PolicyOptions()
    if not isinstance(options, PolicyOptions):
        raise InvalidTypeError(f"options must be a PolicyOptions, not {type(options).__name__}")
    options.check_taken(name)
    cls = policy_classes(backend)[name]
    if not spec.evicts:
        return cls(budget=budget, heads=heads)
    if budget is None:
        raise InvalidInputError(f"policy {name!r} needs a budget")
    values = options.values(name, budget, pools)
    window = options.recent_window if spec.takes("recent_window") else None
    if pins and isinstance(window, str):  # a fraction stays one, to share what the pins leave
        with contextlib.suppress(InvalidInputError):  # a count written as text: resolved as it was
            values["recent_window"] = spec_fraction(window)
    return cls(budget=budget, heads=heads, **values, **({"pins": pins} if pins else {}))

