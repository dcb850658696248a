"""What an evicting cache shows of itself: the positions, keys and values each (layer,
sequence, KV head) holds, the bytes of its buffers, policies and archive, and the checks
of the layer, sequence and head indices they are asked for."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .._shared import check_int
from ..errors import InvalidInputError
from .layer import EvictingLayer

if TYPE_CHECKING:
    from ._cache_state import CacheState


def _holds(cache: CacheState) -> bool:
    """Whether a forward ever finished since the cache was built or reset (the first
    one in flight, or interrupted, holds nothing yet)."""
    return cache.storage.started() and not (cache._forward is not None and cache._forward.fresh)


def _row(cache: CacheState, layer: int, sequence: int, head: int) -> int:
    if not cache._holds():
        raise InvalidInputError("the cache holds nothing yet")
    e = cache._evicting_index(layer)
    for name, value, bound in (("sequence", sequence, cache.batch), ("head", head, cache.num_kv_heads)):
        value = check_int(name, value, -(1 << 62), 1 << 62)
        if not 0 <= value < bound:
            raise InvalidInputError(f"{name} must be in [0, {bound}), got {value}")
    return (e * cache.batch + sequence) * cache.num_kv_heads + head


def _layer_index(cache: CacheState, name: str, value: Any) -> int:
    """``value`` as one of the cache's layer indices.

    Raises
    ------
    InvalidTypeError
        Not an integer (or a bool).
    InvalidInputError
        Outside ``[0, len(layers))``.
    """
    index = check_int(name, value, -(1 << 62), 1 << 62)
    if not 0 <= index < len(cache.layers):
        raise InvalidInputError(f"{name} must be in [0, {len(cache.layers)}) (the cache's layers), got {index}")
    return index


def _evicting_index(cache: CacheState, layer: int) -> int:
    layer = check_int("layer", layer, -(1 << 62), 1 << 62)
    if not 0 <= layer < len(cache.layers) or not isinstance(cache.layers[layer], EvictingLayer):
        raise InvalidInputError(f"layer {layer} is not one of the cache's full-attention layers")
    evicting = cache.layers[layer]
    assert isinstance(evicting, EvictingLayer)
    return evicting.index


def held_counts(cache: CacheState) -> np.ndarray:
    """Positions held per (layer, sequence, KV head): ``int64 (evicting layers, batch,
    kv_heads)``."""
    if not cache._holds():
        return np.zeros((cache.evicting_layers, 0, cache.num_kv_heads), dtype=np.int64)
    return cache.storage.counts.reshape(cache.evicting_layers, cache.batch, cache.num_kv_heads).copy()


def kept_positions(cache: CacheState, layer: int, sequence: int = 0, head: int = 0) -> np.ndarray:
    """The positions held by one (layer, sequence, KV head), ascending, as the policy
    counts them (padded positions: the index in the batch's padded token sequence)."""
    row = cache._row(layer, sequence, head)
    assert cache.bank is not None
    policy_row = row if cache.head_mode == "per-head" else row // cache.num_kv_heads
    return cache.bank.kept_row(policy_row)


def kept_keys_values(cache: CacheState, layer: int, sequence: int = 0,
                     head: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """One (layer, sequence, KV head)'s held keys and values in kept order,
    ``(n, head_dim)`` each (copies)."""
    row = cache._row(layer, sequence, head)
    e = cache._evicting_index(layer)
    slots = torch.from_numpy(cache.storage.slots[row, : cache.storage.counts[row]].astype(np.int64))
    keys, values = cache.storage.layer_buffers(e)
    assert keys is not None and values is not None
    return keys[sequence, head, slots], values[sequence, head, slots]


def kv_bytes(cache: CacheState, positions: int) -> int:
    """Bytes of keys and values for ``positions`` positions in every (evicting layer,
    sequence, KV head): what a cache holding that many positions stores.

    Raises
    ------
    InvalidTypeError
        ``positions`` is not an integer.
    InvalidInputError
        ``positions`` is negative."""
    positions = check_int("positions", positions, 0, 1 << 62)
    storage = cache.storage
    per_position = sum((k.shape[-1] + v.shape[-1]) * k.element_size()
                       for k, v in zip(storage.keys, storage.values) if k is not None and v is not None)
    return positions * cache.batch * cache.num_kv_heads * per_position


def memory_bytes(cache: CacheState) -> int:
    """Bytes of the held key and value buffers plus the policies' own state.  A
    refused forward gives back what it grew; one interrupted between the model's
    layers holds what it wrote until the next call on the cache undoes it."""
    if not cache._holds():
        return 0
    return cache.storage.nbytes() + sum(int(p.memory_bytes()) for p in cache.policies)


def archive_bytes(cache: CacheState) -> int:
    """Bytes of the recall tier's archive (``archive``; 0 without one): archived keys
    and values (float32, or int8 with a float32 scale each), and their positions."""
    return 0 if cache._archive is None else cache._archive.nbytes()


def archived_positions(cache: CacheState, layer: int, sequence: int = 0, head: int = 0) -> np.ndarray:
    """The positions one (layer, sequence, KV head) has archived, ascending (empty
    without an archive)."""
    row = cache._row(layer, sequence, head)
    if cache._archive is None:
        return np.zeros(0, dtype=np.int64)
    return np.sort(cache._archive.row_entries(row)[0])
