"""Full: the baseline that never evicts."""

from __future__ import annotations

from typing import Any

from scissorhands._policy_spec import PolicySpec
from scissorhands._shared import UINT32_MAX, check_int
from scissorhands.policies._base import NativePolicy

#: The full cache's declaration (:mod:`scissorhands._registry` finds it): first in every
#: table, the baseline the others are compared with.
SPEC = PolicySpec(
    "full", "Full", (), evicts=False, reads_attention=False,
    paper="the full cache (the baseline)",
    module="full", kind="SH_FULL", slot_bytes=4, order=0)


class Full(NativePolicy):
    """The full cache: holds every position, never evicts (the baseline).

    Parameters
    ----------
    budget : int, optional
        Accepted for the shared constructor shape (validated, ``>= 1``) and never
        enforced; :meth:`evict` always returns no victims.
    rng : object, optional
        Accepted and ignored.
    heads : int, default 1
        Independent rows held in one object.
    pins : sequence of (int, int), default ()
        Pinned spans ``(start, stop)``, checked and kept as :meth:`pin` keeps them;
        they change nothing here, since the full cache never evicts.

    Notes
    -----
    4 bytes per slot; storage doubles as positions arrive.
    """

    name = "full"

    def __init__(self, budget: int | None = None, rng: Any = None, heads: int = 1, pins: Any = ()) -> None:
        self._configured = None if budget is None else check_int("budget", budget, 1)
        super().__init__(budget=UINT32_MAX, heads=heads, pins=pins)

    def _params(self) -> dict[str, Any]:
        params: dict[str, Any] = {"budget": self._configured, "heads": self._heads}
        if self._pins:
            params["pins"] = [list(span) for span in self._pins]
        return params

    @property
    def budget(self) -> int | None:  # type: ignore[override]
        """The budget given at construction (never enforced), or None."""
        return self._configured
