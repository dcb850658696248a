"""How a storage's buffers are laid out (:mod:`scissorhands.hf.storage`): growing them (by
at least a thirty-second), compacting every row into kept order, per head or, under a
shared budget, into one buffer a layer's KV heads share (and anew when it grows too wide),
loading rows given in kept order (the recall tier), and selecting sequences (beams,
copies, subsets)."""

from __future__ import annotations

import numpy as np
import torch

from ...errors import InvalidInputError
from ._state import StorageState
from .arrays import _MAX_CAPACITY, SLOT_DTYPE


def _grow(storage: StorageState, need: int) -> None:
    """Make every row hold at least ``need`` slots (by at least a thirty-second, so that
    growing one token at a time copies each key a bounded number of times), keeping
    the contents."""
    if need <= storage.capacity:
        return
    if need > _MAX_CAPACITY:
        raise InvalidInputError(
            f"a row of the cache would hold {need} slots; at most {_MAX_CAPACITY} fit its slot table")
    capacity = min(_MAX_CAPACITY, max(need, storage.capacity + storage.capacity // 32))
    pad = capacity - storage.capacity
    storage.slots = np.pad(storage.slots, ((0, 0), (0, pad)))
    storage.rope = np.pad(storage.rope, ((0, 0), (0, pad)))
    storage.valid = np.pad(storage.valid, ((0, 0), (0, pad)))
    for e in range(storage.layers if not storage.shared else 0):  # shared: each layer's own (_grow_layers)
        for store in (storage.keys, storage.values):
            old = store[e]
            if old is not None:
                new = old.new_zeros((*old.shape[:2], capacity, old.shape[3]))
                new[:, :, : storage.capacity] = old
                store[e] = new
    storage.capacity = capacity
    storage._mask_stale = True


def _layer_widths(storage: StorageState) -> list[int]:
    """Each layer's buffer width (0 before its first write)."""
    return [0 if k is None else int(k.shape[2]) for k in storage.keys]


def _grow_layers(storage: StorageState, need: np.ndarray) -> None:
    """Laid out shared: make layer ``e``'s buffers at least ``need[e]`` wide (by at
    least a thirty-second), keeping the contents."""
    for e, width in enumerate(storage._layer_widths()):
        if need[e] <= width:
            continue
        wider = min(storage.capacity, max(int(need[e]), width + width // 32))
        for store in (storage.keys, storage.values):
            old = store[e]
            assert old is not None
            new = old.new_zeros((*old.shape[:2], wider, old.shape[3]))
            new[:, :, :width] = old
            store[e] = new


def _narrow_layers(storage: StorageState, widths: list[int]) -> None:
    """Laid out shared: layer ``e``'s buffers back to ``widths[e]`` (none past it holds
    a position)."""
    for e, width in enumerate(widths):
        for store in (storage.keys, storage.values):
            old = store[e]
            if old is not None and old.shape[2] > width:
                store[e] = old[:, :, :width].clone()


def _layer_extent(storage: StorageState, e: int) -> int:
    return storage.extent if storage.layer_extent is None else int(storage.layer_extent[e])


def compact(storage: StorageState) -> None:
    """Gather every row's held slots into kept order at ``[0, count)``."""
    storage._relayout(storage.slots[:, : max(1, int(storage.counts.max(initial=0)))].astype(np.int64),
                   storage.counts.copy())


def _relayout(storage: StorageState, index: np.ndarray, counts: np.ndarray) -> None:
    """Rebuild the buffers: row ``r`` keeps physical slots ``index[r, :counts[r]]``,
    in that order; per head (each row's moved to ``[0, counts[r])``) or, once
    positions were evicted under a shared budget with several KV heads, shared."""
    if storage.share_heads and storage.heads > 1 and not storage.aligned:
        storage._relayout_shared(index, counts)
    else:
        storage._relayout_per_head(index, counts)


def _relayout_shared(storage: StorageState, index: np.ndarray, counts: np.ndarray) -> None:
    """:meth:`_relayout` into one buffer ``(batch, 1, capacity, head_dim)`` a layer:
    a (layer, sequence)'s heads one after the other, head ``h``'s kept positions at
    columns ``[start, start + count)`` (``start`` what the heads before it hold); the
    capacity is the most a (layer, sequence) holds plus a token a head, which go to
    the columns after its held ones."""
    heads, batch = storage.heads, storage.batch
    grouped = counts.reshape(-1, heads)
    totals = grouped.sum(axis=1)  # per (layer, sequence)
    start = (np.cumsum(grouped, axis=1) - grouped).reshape(-1)  # each row's first column
    layer_extent = totals.reshape(storage.layers, batch).max(axis=1).astype(np.int64)
    width = int(layer_extent.max(initial=0))
    capacity = width + heads
    held = np.arange(index.shape[1])[None, :] < counts[:, None]  # (rows, width of index)
    row_of, order = np.nonzero(held)
    target = start[row_of] + order
    source = index[row_of, order]
    for e in range(storage.layers):
        first, last = np.searchsorted(row_of, [e * batch * heads, (e + 1) * batch * heads])
        rows = row_of[first:last] - e * batch * heads
        sequence = torch.from_numpy(rows // heads)
        column = torch.from_numpy(target[first:last])
        head, slot = torch.from_numpy(rows % heads), torch.from_numpy(source[first:last])
        for store in (storage.keys, storage.values):
            old = store[e]
            if old is None:
                continue
            buffer = old.new_zeros((batch, 1, int(layer_extent[e]) + heads, old.shape[-1]))
            buffer[sequence, 0, column] = storage._heads_view(old)[sequence, head, slot]
            store[e] = buffer
    rope = np.zeros((storage.rows, capacity), dtype=np.int64)
    rope[row_of, target] = storage.rope[row_of, source]
    storage.rope = rope
    slots = np.zeros((storage.rows, capacity), dtype=SLOT_DTYPE)
    slots[row_of, order] = target
    storage.slots = slots
    valid = np.zeros((storage.rows, capacity), dtype=bool)
    valid[row_of, target] = True
    storage.valid = valid
    storage.counts = counts
    # Each head's next token after every held column of its (layer, sequence).
    storage.free = np.repeat(totals, heads) + np.tile(np.arange(heads, dtype=np.int64), len(totals))
    storage.capacity = capacity
    storage.extent = width
    storage.layer_extent = layer_extent
    storage.shared = True
    storage.compactions += 1
    storage._mask_stale = True


def _after_step(storage: StorageState) -> None:
    """After a decode step's slot changes: the compact strategy gathers every row into
    kept order; buffers laid out shared are laid out anew when too wide."""
    if storage.compact_every_step:
        storage.compact()
    elif storage.shared:
        storage._relayout_when_wide()


def _relayout_when_wide(storage: StorageState) -> None:
    """Laid out shared, after a step: lay the buffers out anew when they are more than
    a sixteenth wider than the layers' held columns and a token a head (a pool across
    layers shrinks some layers and grows others; a layer's buffer never narrows)."""
    need = storage.counts.reshape(storage.layers, storage.batch, storage.heads).sum(axis=2).max(axis=1).sum()
    need += storage.layers * storage.heads
    if 16 * sum(storage._layer_widths()) > 17 * need:
        storage.compact()


def _relayout_per_head(storage: StorageState, index: np.ndarray, counts: np.ndarray) -> None:
    """:meth:`_relayout` per head: row ``r``'s kept slots moved to ``[0, counts[r])``;
    the capacity becomes what they need and the next decode token."""
    width = index.shape[1]
    capacity = width + 1
    for e in range(storage.layers):
        rows = slice(e * storage.batch * storage.heads, (e + 1) * storage.batch * storage.heads)
        gather = torch.from_numpy(index[rows].reshape(storage.batch, storage.heads, width))
        for store in (storage.keys, storage.values):
            old = store[e]
            if old is None:
                continue
            dim = old.shape[-1]
            old = storage._heads_view(old)
            moved = old.gather(2, gather.to(old.device)[..., None].expand(-1, -1, -1, dim))
            buffer = old.new_zeros((storage.batch, storage.heads, capacity, dim))
            buffer[:, :, :width] = moved
            store[e] = buffer
    storage.capacity = capacity
    rope = np.zeros((storage.rows, capacity), dtype=np.int64)
    rope[:, :width] = np.take_along_axis(storage.rope, index, axis=1)
    storage.rope = rope
    storage.slots = np.zeros((storage.rows, capacity), dtype=SLOT_DTYPE)
    storage.slots[:, :width] = np.arange(width)[None, :]
    storage.counts = counts
    storage.valid = np.ascontiguousarray(np.arange(capacity)[None, :] < counts[:, None])
    storage.free = counts.copy()
    storage.extent = width
    storage.shared = False
    storage.layer_extent = None
    storage.compactions += 1
    storage._mask_stale = True


def load_rows(storage: StorageState, keys: list[torch.Tensor], values: list[torch.Tensor], counts: np.ndarray) -> None:
    """Lay the buffers out anew from keys and values given in kept order: layer ``e``'s
    ``(batch, kv_heads, width, head_dim)`` each, row ``r`` holding ``counts[r]`` (the
    recall tier's union at a prompt's end); per head, as :meth:`_relayout_per_head`
    leaves them."""
    width = int(keys[0].shape[2])
    capacity = width + 1
    for e in range(storage.layers):
        for store, given in ((storage.keys, keys[e]), (storage.values, values[e])):
            buffer = given.new_zeros((storage.batch, storage.heads, capacity, given.shape[-1]))
            buffer[:, :, :width] = given
            store[e] = buffer
    storage.capacity = capacity
    storage.rope = np.zeros((storage.rows, capacity), dtype=np.int64)
    storage.slots = np.zeros((storage.rows, capacity), dtype=SLOT_DTYPE)
    storage.slots[:, :width] = np.arange(width)[None, :]
    storage.counts = np.asarray(counts, dtype=np.int64).copy()
    storage.valid = np.ascontiguousarray(np.arange(capacity)[None, :] < storage.counts[:, None])
    storage.free = storage.counts.copy()
    storage.extent = width
    storage.shared = False
    storage.layer_extent = None
    storage.aligned = False
    storage.compactions += 1
    storage._mask_stale = True


def select(storage: StorageState, index: np.ndarray) -> None:
    """Sequences become ``index`` (old sequence numbers; beams, copies, subsets)."""
    grid = np.arange(storage.rows).reshape(storage.layers, storage.batch, storage.heads)
    rows = grid[:, index].reshape(-1)
    storage.slots = np.ascontiguousarray(storage.slots[rows])
    storage.rope = np.ascontiguousarray(storage.rope[rows])
    storage.counts = storage.counts[rows]
    storage.free = storage.free[rows]
    storage.valid = np.ascontiguousarray(storage.valid[rows])
    torch_index = torch.from_numpy(np.asarray(index, dtype=np.int64))
    for store in (storage.keys, storage.values):
        for e, old in enumerate(store):
            if old is not None:
                store[e] = old.index_select(0, torch_index.to(old.device))
    storage.batch = len(index)
    storage._mask_stale = True


def nbytes(storage: StorageState) -> int:
    """Bytes of the key and value buffers."""
    return sum(t.numel() * t.element_size() for store in (storage.keys, storage.values) for t in store
               if t is not None)
