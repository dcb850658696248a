"""The hindsight reference on a real model: the full run's attention in, a schedule replayed.

``eval --hindsight W`` (see :mod:`scissorhands.hindsight` for the rule) needs two things
of the transformers layer:

* :func:`tap_attention`: during the full-cache run, each decode step's attention per
  (layer, KV head) row, as a policy would see it, handed to a callback (the
  :class:`~scissorhands.hindsight.HindsightScheduler` that decides the victims once the
  next ``W`` steps are in);
* :class:`HindsightConfig`: one configuration of ``eval``'s batch whose rows replay a
  :class:`~scissorhands.hindsight.HindsightSchedule` (a
  :class:`~scissorhands.hindsight.ScheduledPolicy` in the policy bank).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import InvalidInputError, InvalidTypeError
from ..hindsight import HindsightSchedule, ScheduledPolicy
from .gqa import group_mean
from .rows import PolicyConfig

__all__ = ["AttentionTap", "HindsightConfig", "tap_attention"]


@dataclass(frozen=True)
class HindsightConfig(PolicyConfig):
    """A configuration of ``eval``'s batch whose rows replay ``schedule``.

    Build it with :meth:`of`.  ``policy`` is ``"hindsight"`` (not a registry name: the
    name eval's results give it); the cache's rows of it are a
    :class:`~scissorhands.hindsight.ScheduledPolicy` (:meth:`build`); ``evicts`` is True,
    ``reads_attention`` False and the budget is the schedule's.  Two configurations are
    equal only when they hold the same schedule object.
    """

    schedule: HindsightSchedule | None = None

    @classmethod
    def of(cls, schedule: HindsightSchedule, backend: str = "native") -> HindsightConfig:
        """The configuration replaying ``schedule`` (``backend``: the one the stand-in
        object is built with, that of the other configurations).

        Raises
        ------
        InvalidTypeError
            ``schedule`` is not a :class:`~scissorhands.hindsight.HindsightSchedule`.
        """
        config = cls("hindsight", getattr(schedule, "budget", None), backend=backend, schedule=schedule)
        config.check()
        return config

    def check(self) -> None:
        """Raises :class:`InvalidTypeError` without a schedule, :class:`InvalidInputError`
        when the budget is not the schedule's."""
        if not isinstance(self.schedule, HindsightSchedule):
            raise InvalidTypeError(f"a HindsightConfig needs a HindsightSchedule, not {type(self.schedule).__name__}")
        if self.budget != self.schedule.budget:
            raise InvalidInputError(f"budget {self.budget} is not the schedule's ({self.schedule.budget})")

    def build(self, rows: int, pools: dict[str, int], pins: Any = ()) -> ScheduledPolicy:
        """The replay of the schedule over ``rows`` rows (one sequence's; ``pins`` as
        the cache's, which the schedule's replay keeps by its own pin()).

        Raises
        ------
        InvalidInputError
            ``rows`` is not the schedule's (the configuration shared by several
            sequences: a schedule replays one sequence's rows).
        """
        assert self.schedule is not None
        return ScheduledPolicy(self.schedule, rows)

    @property
    def evicts(self) -> bool:
        return True

    @property
    def pooled(self) -> bool:
        return False

    @property
    def reads_attention(self) -> bool:
        return False


class AttentionTap:
    """What :func:`tap_attention` attached: ``seconds`` spent in the tap (the GQA mean
    and the callback), ``steps`` handed over, and :meth:`remove`."""

    def __init__(self, cache: Any, handle: Any) -> None:
        self.cache = cache
        self.seconds = 0.0
        self.steps = 0
        self._handle = handle

    def remove(self) -> None:
        """Detach the tap from the cache (its observer)."""
        self._handle.remove()


def tap_attention(cache: Any, sink: Callable[[int, np.ndarray], Any]) -> AttentionTap:
    """Hand ``sink(position, weights)`` the attention of every single-token forward of a
    cache that never evicts (the full cache: slot ``s`` holds position ``s``).

    ``weights`` is ``float32`` ``(rows, position)``: the new token's weights on
    positions ``0 .. position-1`` per (layer, sequence, policy head) row, layer-major,
    the GQA mean over each row's query heads (``mean`` head mode: over all), its weight
    on itself excluded, not renormalised (what a policy sees).  Chunks (the prompt) are
    not handed over.  The tap is an observer of the cache
    (:meth:`~scissorhands.hf.cache.EvictingCache.add_observer`), which behaves as it does
    untapped (under ``sdpa``, which computes no rows for a cache whose policies read none,
    the rows are computed for the tap, in ``stats.rows_seconds``).

    Raises
    ------
    InvalidInputError
        The cache has a configuration that evicts (its slots would not be positions).
    """
    if any(c.evicts for c in cache.configs):
        raise InvalidInputError("tap_attention reads a cache that never evicts (the full cache)")
    layers = cache.observed_layers
    last = layers[-1]
    pending: dict[int, torch.Tensor] = {}

    def keep(layer: int, weights: torch.Tensor) -> None:
        if weights.shape[-2] == 1:
            pending[layer] = weights
        if layer != last:
            return
        if len(pending) == len(layers):
            start = time.perf_counter()
            position = cache.seen
            stacked = torch.stack([pending[i] for i in layers]).cpu()
            means = group_mean(stacked, cache.policy_heads)  # (layers, batch, heads, 1, position + 1)
            rows = means[..., 0, :position].reshape(-1, position)
            pending.clear()
            sink(position, rows)
            tap.seconds += time.perf_counter() - start
            tap.steps += 1
        else:
            pending.clear()

    tap = AttentionTap(cache, None)
    tap._handle = cache.add_observer(keep)
    return tap
