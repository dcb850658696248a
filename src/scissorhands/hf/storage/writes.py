"""One forward's slots in a storage (:mod:`scissorhands.hf.storage`): the plan of where
its tokens go (a single token to each row's free slot once anything was evicted, else
appended after the extent), undoing that plan when the forward fails, writing each
layer's keys and values where planned, the views of the buffers per KV head, and the new
tokens' columns and ranks (``positions="cache"``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...errors import InvalidInputError
from ._state import StorageState


def prepare(storage: StorageState, q: int) -> bool:
    """Before the plan of a forward of ``q`` tokens: a chunk is written per head, so
    buffers laid out shared are laid out per head.  Returns whether they were."""
    if storage.shared and q > 1:
        storage._relayout_per_head(storage.slots[:, : max(1, storage.most())].astype(np.int64), storage.counts.copy())
        return True
    return False


def plan_state(storage: StorageState, prepared: bool = False) -> tuple[Any, ...]:
    """What :meth:`unplan` restores: the extents, chunk start, ``q`` and widths, and
    whether :meth:`prepare` laid shared buffers out per head (``prepared``; undone
    by laying them out shared again, as narrow as what they hold allows)."""
    layer_extent = None if storage.layer_extent is None else storage.layer_extent.copy()
    return (storage.extent, storage.chunk_start, storage.q, storage.capacity, layer_extent, storage._layer_widths(),
            prepared)


def plan(storage: StorageState, q: int) -> int:
    """Decide where this forward's ``q`` tokens go; return the extent the layers will
    return (keys ``[0, extent)``). A single token goes to each row's free slot once
    anything was evicted; otherwise the tokens are appended after the extent."""
    storage.prepare(q)
    storage.q = q
    if q == 1 and not storage.aligned:
        extent = storage.single_extent()
        storage._grow(extent)
        if storage.layer_extent is not None:  # each layer's: past its own columns and tokens
            layer_extent = np.maximum(storage.layer_extent, storage.free.reshape(storage.layers, -1).max(axis=1) + 1)
            storage._grow_layers(layer_extent)
            storage.layer_extent = layer_extent
        rows = storage._row_index()
        storage.valid[rows, storage.free] = True
        if not storage._mask_stale:
            storage._note_valid(rows, storage.free.copy(), True)
        storage._plan_writes()
    else:
        storage.chunk_start = storage.extent
        extent = storage.extent + q
        storage._grow(extent)
    storage.extent = extent
    storage._masks = {}
    return extent


def _plan_writes(storage: StorageState) -> None:
    """A single token's write index per layer: each row's free slot as a flat index
    into its layer's keys viewed ``(batch * heads * capacity, head_dim)``, written
    into a buffer kept while the shape stays, whose per-layer views
    (``_write_index``) are made once."""
    kept = storage._write_plan
    widths = tuple(storage._layer_widths()) if storage.shared else ()
    shape = (storage.layers, storage.batch, storage.heads, storage.capacity, widths)
    if kept is None or kept[0] != shape:
        per_layer = storage.batch * storage.heads
        if storage.shared:  # a (sequence, head)'s slot is a column of its sequence's buffer
            sequence = np.repeat(np.arange(storage.batch, dtype=np.int64), storage.heads)
            base = np.concatenate([sequence * width for width in widths])
        else:
            base = np.tile(np.arange(per_layer, dtype=np.int64) * storage.capacity, storage.layers)
        buffer = np.empty(storage.rows, dtype=np.int64)
        views = torch.from_numpy(buffer).view(storage.layers, per_layer).unbind(0)
        kept = storage._write_plan = (shape, buffer, base, views)
    np.add(storage.free, kept[2], out=kept[1])
    storage._write_index = kept[3]


def unplan(storage: StorageState, state: tuple[Any, ...]) -> None:
    """Undo the last :meth:`plan` (its forward failed before the step): the slots it
    made valid are free again; the extents, chunk start, ``q`` and widths are those of
    ``state`` (:meth:`plan_state` before it: width the plan grew, which holds nothing,
    is given back, so that a refused chunk leaves the memory as it was)."""
    extent, chunk_start, q, capacity, layer_extent, widths, prepared = state
    if storage.q == 1 and not storage.aligned:
        rows = np.arange(storage.rows)
        storage.valid[rows, storage.free] = False
        storage._note_valid(rows, storage.free.copy(), False)
    storage.extent, storage.chunk_start, storage.q, storage.layer_extent = extent, chunk_start, q, layer_extent
    storage._masks = {}
    if capacity < storage.capacity:
        storage._shrink(capacity)
    if storage.shared:
        storage._narrow_layers(widths)
    elif prepared:
        storage.compact()


def _shrink(storage: StorageState, capacity: int) -> None:
    """Every row back to ``capacity`` slots (none past it holds a position)."""
    storage.slots = np.ascontiguousarray(storage.slots[:, :capacity])
    storage.rope = np.ascontiguousarray(storage.rope[:, :capacity])
    storage.valid = np.ascontiguousarray(storage.valid[:, :capacity])
    for store in (storage.keys, storage.values):
        for e, old in enumerate(store):
            if old is not None and old.shape[2] > capacity:
                store[e] = old[:, :, :capacity].clone()
    storage.capacity = capacity
    storage._mask_stale = True


def write(storage: StorageState, e: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Store layer ``e``'s new keys and values as planned; return ``[0, extent)``."""
    if key.dim() != 4 or value.dim() != 4 or key.shape[0] != storage.batch or key.shape[1] != storage.heads:
        raise InvalidInputError(
            f"the cache holds {storage.batch} sequences of {storage.heads} KV heads, the model "
            f"wrote keys {tuple(key.shape)} and values {tuple(value.shape)}: reset() the cache before a new batch")
    if key.shape[:3] != value.shape[:3] or key.shape[2] != storage.q:
        raise InvalidInputError(
            f"layer {e}'s keys {tuple(key.shape)} and values {tuple(value.shape)} are not "
            f"({storage.batch}, {storage.heads}, {storage.q}, head_dim) each ({storage.q} new tokens a sequence in "
            "this forward)")
    decode = storage.q == 1 and not storage.aligned
    for store, new in ((storage.keys, key.detach()), (storage.values, value.detach())):
        buffer = store[e]
        if buffer is None:
            buffer = store[e] = new.new_zeros((storage.batch, storage.heads, storage.capacity, new.shape[-1]))
        elif buffer.shape[-1] != new.shape[-1] or buffer.dtype is not new.dtype:
            raise InvalidInputError(
                f"layer {e} holds {'keys' if store is storage.keys else 'values'} of width {buffer.shape[-1]} "
                f"({buffer.dtype}); the model wrote width {new.shape[-1]} ({new.dtype}): reset() the cache "
                "before another model")
        if decode:
            key_ = (e, store is storage.keys)
            flat = storage._flat.get(key_)
            if flat is None or flat[0] is not buffer:
                flat = storage._flat[key_] = (buffer, buffer.view(-1, buffer.shape[-1]))
            flat[1].index_copy_(0, storage._write_index[e], new.reshape(-1, new.shape[-1]))
        else:
            buffer[:, :, storage.chunk_start:storage.chunk_start + storage.q] = new
    # The [0, extent) views, kept while the buffers and the extent stay (the steady state).
    cached = storage._views[e]
    keys, values = storage.keys[e], storage.values[e]
    extent = storage._layer_extent(e)
    if cached is None or cached[0] is not keys or cached[2] != extent:
        assert keys is not None and values is not None
        cached = storage._views[e] = (keys, storage._heads_view(keys[:, :, :extent]), extent,
                                   storage._heads_view(values[:, :, :extent]))
    return cached[1], cached[3]


def _heads_view(storage: StorageState, buffer: torch.Tensor) -> torch.Tensor:
    """``buffer`` as ``(batch, kv_heads, ...)``: itself, or (laid out shared) its one
    column space expanded to every KV head (a view)."""
    return buffer.expand(-1, storage.heads, -1, -1) if buffer.shape[1] != storage.heads else buffer


def layer_buffers(storage: StorageState, e: int) -> tuple[torch.Tensor, torch.Tensor] | tuple[None, None]:
    """Layer ``e``'s key and value buffers as ``(batch, kv_heads, capacity, head_dim)``
    (laid out shared: views of the one buffer its KV heads share), or None each
    before the first write."""
    keys, values = storage.keys[e], storage.values[e]
    if keys is None or values is None:
        return None, None
    return storage._heads_view(keys), storage._heads_view(values)


def new_columns(storage: StorageState) -> np.ndarray:
    """``(rows, q)`` the physical slots of this forward's tokens."""
    if storage.q == 1 and not storage.aligned:
        return storage.free[:, None].copy()
    return np.broadcast_to(np.arange(storage.chunk_start, storage.chunk_start + storage.q), (storage.rows, storage.q))


def ranks(storage: StorageState, admitted: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """``positions="cache"``: each slot's rank in its row's kept order ``(rows,
    extent)`` (the new tokens after the held ones, padding not counted), and the new
    tokens' ranks ``(rows, q)``."""
    rows = np.arange(storage.rows)[:, None]
    rank = np.zeros((storage.rows, storage.capacity), dtype=np.int64)
    width = int(storage.counts.max(initial=0))
    order = np.broadcast_to(np.arange(width), (storage.rows, width))
    held = order < storage.counts[:, None]
    rank[np.broadcast_to(rows, (storage.rows, width))[held], storage.slots[:, :width][held]] = order[held]
    steps = np.ones((storage.rows, storage.q), dtype=np.int64) if admitted is None else admitted.astype(np.int64)
    new_rank = storage.counts[:, None] + np.cumsum(steps, axis=1) - steps
    rank[np.broadcast_to(rows, (storage.rows, storage.q)), storage.new_columns()] = new_rank
    return rank[:, : storage.extent], new_rank
