"""How a cache layer stores the held keys and values: two strategies with one interface.

* :class:`SlotLayer` (``cache_mode="reuse"``): preallocated slots; a decode token's key
  and value go into the slot the last victim freed, so a step writes one token.
* :class:`CompactLayer` (``cache_mode="compact"``): the ``DynamicCache`` way, keys
  appended by ``torch.cat`` and the survivors gathered after every eviction.

Both refuse a second write before the cache has observed the first (the model was
called outside the cache's own driving functions), through the :class:`Sync` they share
with their cache, and time their own ``update``.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

from ..errors import InvalidInputError

__all__ = ["CACHE_MODES", "OUT_OF_SYNC", "CompactLayer", "SlotLayer", "Sync"]

#: ``reuse``: a decode token takes the last victim's slot; ``compact``: gather every step.
CACHE_MODES = ("reuse", "compact")

OUT_OF_SYNC = (
    "the cache received keys and values the policies never saw (the model was called "
    "outside prefill()/decode_step()): drive the model with decode_step()"
)


class Sync:
    """State shared by a cache and its layers: held count, observation epoch, writes."""

    __slots__ = ("epoch", "held", "writes")

    def __init__(self) -> None:
        self.held = 0
        self.epoch = 0
        self.writes = 0


class CompactLayer(DynamicLayer):
    """A ``DynamicLayer`` (keys and values appended by ``torch.cat``) that refuses a second
    write before the cache has observed the first, and times its own ``update``."""

    def __init__(self, sync: Sync) -> None:
        super().__init__()
        self.sync = sync
        self.written_epoch = -1
        self.update_seconds = 0.0

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        start = time.perf_counter()
        sync = self.sync
        if self.written_epoch == sync.epoch:
            raise InvalidInputError(OUT_OF_SYNC)
        keys, values = super().update(key_states, value_states)
        self.written_epoch = sync.epoch
        sync.writes += 1
        self.update_seconds += time.perf_counter() - start
        return keys, values


class SlotLayer(DynamicLayer):
    """Keys and values in preallocated slots; a decode token is written into a free slot.

    ``keys``/``values`` are buffers ``(1, kv_heads, capacity, dim)``.  Between two
    forwards the layer holds ``sync.held`` positions per KV head in ``held`` of the slots
    ``0 .. held``, and the remaining one is free (the last victim's slot, or slot
    ``held`` when nothing was evicted); ``write_index`` (kept up to date by the cache)
    holds, per KV head, the flat index ``h * capacity + free[h]``.  ``update`` writes the
    token there with one ``index_copy_`` per tensor and returns ``[..., :held + 1, :]``:
    the model attends over the held keys in slot order, which is exact because attention
    is permutation-invariant over keys (each key keeps its RoPE rotation and the query
    its true position) and every slot in that range is a held key or the new token's.
    The cache maps the returned weights back to the policy's kept order.
    """

    def __init__(self, sync: Sync, capacity_hint: int, write_index: torch.Tensor) -> None:
        super().__init__()
        self.sync = sync
        self.capacity_hint = capacity_hint
        self.write_index = write_index
        self.written_epoch = -1
        self.written = 0
        self.update_seconds = 0.0
        self._flat: tuple[torch.Tensor, torch.Tensor] | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.is_initialized = True

    def set_buffers(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Install new slot buffers (contiguous, ``(1, kv_heads, capacity, dim)``)."""
        self.keys, self.values = keys, values
        self._flat = (keys.view(-1, keys.shape[-1]), values.view(-1, values.shape[-1]))

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        start = time.perf_counter()
        sync = self.sync
        if self.written_epoch == sync.epoch:
            raise InvalidInputError(OUT_OF_SYNC)
        q = key_states.shape[-2]
        held = sync.held
        if held == 0:  # fresh: the prompt, laid out in order
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            batch, heads, _, dim = key_states.shape
            capacity = max(self.capacity_hint, q + 1)
            self.set_buffers(
                key_states.new_empty((batch, heads, capacity, dim)),
                value_states.new_empty((batch, heads, capacity, value_states.shape[-1])),
            )
            self.keys[:, :, :q] = key_states
            self.values[:, :, :q] = value_states
        elif q == 1 and self._flat is not None:
            keys, values = self._flat
            keys.index_copy_(0, self.write_index, key_states.reshape(-1, keys.shape[1]))
            values.index_copy_(0, self.write_index, value_states.reshape(-1, values.shape[1]))
        else:
            raise InvalidInputError(
                f"{q} tokens at once into a cache that already holds positions: the "
                "slot-reusing cache takes the prompt on a fresh cache (prefill()) and then "
                "one token per decode_step()"
            )
        self.written_epoch = sync.epoch
        self.written = q
        sync.writes += 1
        n = held + q
        if n == self.keys.shape[-2]:
            out = self.keys, self.values
        else:
            out = self.keys[:, :, :n], self.values[:, :, :n]
        self.update_seconds += time.perf_counter() - start
        return out

    def get_seq_length(self) -> int:
        sync = self.sync
        return sync.held + (self.written if self.written_epoch == sync.epoch else 0)

    def crop(self, tokens_to_remove: int) -> None:
        raise InvalidInputError("an EvictingCache cannot be cropped")
