"""TOVA: evict the positions the current token attends to least."""

from __future__ import annotations

from typing import Any

import numpy as np

from scissorhands._native import lib
from scissorhands._option_specs import POOL, RECENT_WINDOW, SINKS
from scissorhands._policy_spec import PolicySpec
from scissorhands.policies._base import RankingPolicy

#: TOVA's declaration (:mod:`scissorhands._registry` finds it).  Its recent window is at
#: least 1 (the newest position has no score until a later token reads it), and the
#: real-model commands (``eval``, ``longctx``) run it only when ``--policies`` names it:
#: each configuration costs them a model sequence, and their documented tables predate it.
SPEC = PolicySpec(
    "tova", "TOVA", (RECENT_WINDOW, SINKS, POOL), defaults={"recent_window": 1},
    min_recent_window=1,
    paper='Oren et al., 2024, arXiv 2401.06104 ("Transformers are Multi-State RNNs")',
    module="tova", kind="SH_TOVA", slot_bytes=13, score_key="scores", colour="tab:purple", marker="v",
    order=30, model_runs=False)


class TOVA(RankingPolicy):
    """Token Omission Via Attention (Oren et al., 2024, arXiv 2401.06104,
    "Transformers are Multi-State RNNs").

    Each decode step that carries attention *sets* every held position's score to that
    step's weight, widened exactly to float64 (H2O adds it instead; ``-0.0`` is stored
    as ``0.0``); the new position then joins with a score of 0. A step with
    ``attn=None`` changes no score. :meth:`prefill` and :meth:`extend` apply each
    token as a decode step, so after a chunk a position's score is the weight of the
    last token that read it. Over budget, the lowest-scored positions outside the sinks
    and the recent window are evicted; equal scores evict the lower position (H2O's
    selection, shared).

    The weights of a step never include the new token's weight on itself, so the newest
    position has no score yet: TOVA needs ``recent_window >= 1`` and keeps it (as
    kvpress's ``TOVAPress`` keeps the last token). With several heads, give each row the
    attention averaged over the query heads it serves (the paper's rule).

    Parameters
    ----------
    budget : int, default 512
        Positions kept per head after :meth:`evict`, in ``[2, 2**32 - 1]`` (above the
        recent window and the sinks).
    recent_window : int or float, default 1
        The most recent positions never evicted: an int in ``[1, budget - 1]``, or a
        float (or ``Fraction``) in ``[0, 1)`` taken as that fraction of the budget,
        rounded down (a float read as the decimal it prints as), which must come to at
        least 1; ``self.recent_window`` and the state keep the resolved count.
    rng : object, optional
        Accepted and ignored (the policy is deterministic).
    heads : int, default 1
        Independent rows (KV heads) held in one object, ``[1, 65536]``.
    sinks : int, default 0
        The first positions held (as StreamingLLM's attention sinks), never evicted;
        ``recent_window + sinks < budget``. 0 = none.
    pool : int, default 1
        Consecutive rows sharing one budget (Ada-KV, Feng et al., 2024, arXiv
        2407.11550), as :class:`~scissorhands.Scissorhands` takes it: must divide
        ``heads``; with ``pool > 1`` only ``step_rows``/``evict_rows`` evict.

    pins : sequence of (int, int), default ()
        Pinned spans ``(start, stop)``, half-open: positions ``start <= pos < stop``
        that no eviction takes, in any row, merged as :meth:`pin` merges them and
        refused as it refuses them (``InvalidTypeError``, ``InvalidInputError``).
        Sinks are the span ``(0, sinks)``; :meth:`reset` keeps these spans.
    Raises
    ------
    InvalidTypeError
        A parameter is not an integer (bools included; ``recent_window`` may also be
        a float fraction).
    InvalidInputError
        ``budget < 1``, ``recent_window`` outside ``[0, budget - 1]`` (a fraction
        outside ``[0, 1)``), ``recent_window`` below 1 (``"tova needs recent_window
        >= 1 ..."``; so ``budget`` must be at least 2), ``sinks < 0`` or
        ``recent_window + sinks >= budget``.

    Notes
    -----
    13 bytes per slot: 4 position + 8 float64 score + 1 selection scratch (as H2O).
    """

    name = "tova"

    def __init__(self, budget: int = 512, recent_window: int = 1, rng: Any = None, heads: int = 1,
                 sinks: int = 0, pool: int = 1, pins: Any = ()) -> None:
        super().__init__(budget=budget, recent_window=recent_window, sinks=sinks, heads=heads, pool=pool, pins=pins)

    @property
    def scores(self) -> np.ndarray:
        """The latest decode step's attention, index-aligned with :attr:`kept`:
        ``float64``, ``(n,)`` or ``(heads, n)`` (0 for a position no step has read yet).

        Raises
        ------
        InvalidInputError
            The rows hold different counts (read :meth:`state_dict` instead).
        """
        return self._equal_rows("scores", 2)

    def score_of(self, pos: int, head: int = 0) -> float:
        """The score of ``pos`` in ``head``'s row (the weight the latest decode step with
        attention gave it), or ``-1.0`` when it is not held (also for ``pos < 0`` or
        ``pos > 2**32 - 1``).

        Raises
        ------
        InvalidTypeError
            ``pos`` or ``head`` is not an integer.
        InvalidInputError
            ``head`` is outside ``[0, heads)``.
        """
        return float(self._lookup(pos, head, lib.sh_policy_score_of, -1.0))
