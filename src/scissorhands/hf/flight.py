"""What one forward of an evicting cache owns (:class:`_Forward`), from its first
evicting layer's write to the policies' step (:mod:`scissorhands.hf.forward` begins,
settles and rolls it back)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .gqa import DecodeWeights
from .rope import RankPlan


class _Forward:
    """What one forward owns, from its first evicting layer's write to the policies' step.

    Created by :meth:`EvictingCache._begin` (the first evicting layer's write) and dropped
    by :meth:`EvictingCache._finish` (after the step) or :meth:`EvictingCache._rollback`
    (a failed or interrupted forward, ``reset()``): nowhere else.  ``q``: its tokens per
    sequence; per evicting layer, whether it was ``written`` and ``observed``;
    ``gathered``: every policy row's weights, reduced to the policy heads and in kept
    order as the layers handed them in; ``pads``: which new tokens are padding
    (``(batch, q)`` bool, None without padding); ``positions="cache"``: the rotary
    ``positions`` of the new keys (``(batch, q)`` int64) and the ``rotations`` to the
    ranks, computed once at the first layer that needs them."""

    __slots__ = ("columns", "fresh", "gathered", "held", "masks", "observed", "pads", "pending", "plan", "positions",
                 "q", "rope", "rotations", "window_rows", "written")

    def __init__(
        self, layers: int, q: int, fresh: bool, plan: tuple[Any, ...], pending: DecodeWeights
    ) -> None:
        self.q = q
        #: What undoes it (:meth:`EvictingCache._rollback`): whether the cache held nothing
        #: before it, the storage's plan before it, the rotary positions it overwrote.
        self.fresh = fresh
        self.plan = plan
        self.rope: tuple[np.ndarray, np.ndarray] | None = None
        self.written = [False] * layers
        self.observed = [False] * layers
        self.pads: np.ndarray | None = None
        #: A single token's masks once positions were evicted: ``(dtype, every layer's)``.
        self.masks: tuple[torch.dtype | None, list[Any]] | None = None
        self.positions: np.ndarray | None = None
        self.rotations: RankPlan | tuple[torch.Tensor, ...] | None = None
        #: Every policy row's weights in kept order, ``(rows, q, width)`` float32, filled
        #: layer by layer as the layers hand theirs in, and the columns they come from.
        self.gathered: np.ndarray | None = None
        self.columns: np.ndarray | None = None
        self.held: np.ndarray | None = None
        #: A decode step's weights, layer by layer, gathered together after the last (the
        #: cache's reusable collector, started at each forward).
        self.pending = pending
        pending.start()
        #: ``prompt_aware``, a chunk that evicts nothing: only its last ``window_rows``
        #: query rows' weights are computed (the prompt's end reads no others) and the
        #: policies read none (:meth:`EvictingCache._window_only`); 0 otherwise.
        self.window_rows = 0
