"""The masks a storage's layers attend with (:mod:`scissorhands.hf.storage`): a chunk's
as a :class:`ChunkMask` (what it is made of, without building it), any layer's as a
tensor built layer by layer as the layers ask, and a single token's additive masks kept
from step to step and changed only where a slot was filled or freed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ._state import StorageState
from .arrays import NUMPY_FLOATS

#: A layer's mask not built yet in this forward (``None`` means: no mask needed).
_UNBUILT: Any = object()


_TRIANGLE: dict[int, torch.Tensor] = {}


def causal_triangle(q: int) -> torch.Tensor:
    """``(q, q)`` float32: 0 on and below the diagonal, float32's lowest above it (the
    additive form of a chunk's causal block; the last one built is kept)."""
    tri = _TRIANGLE.get(q)
    if tri is None:
        _TRIANGLE.clear()
        low = torch.finfo(torch.float32).min
        tri = _TRIANGLE[q] = torch.zeros(q, q).masked_fill_(torch.ones(q, q, dtype=torch.bool).triu(1), low)
    return tri


@dataclass(frozen=True)
class ChunkMask:
    """A chunk's mask (no padding) as what it is made of, for float32 scores: the held
    slots ``[0, start)`` (those a row does not hold masked) and the chunk's ``q`` tokens
    at ``[start, start + q)``, each seeing the earlier ones and itself.  Applying it adds
    float32's lowest to every masked score, as the additive form of :meth:`SlotStorage.mask`
    does, without building that ``(batch, heads, q, extent)`` mask.

    ``held``: ``(batch, kv_heads, 1, 1, start)`` float32, 0 where the row holds the slot
    and float32's lowest where not; None when every row holds every held slot."""

    start: int
    q: int
    held: torch.Tensor | None

    def apply_(self, scores: torch.Tensor) -> None:
        """Mask ``scores`` ``(batch, kv_heads, group, q, start + q)`` float32 in place."""
        scores[..., self.start:] += causal_triangle(self.q)
        if self.held is not None:
            scores[..., : self.start] += self.held


def mask(
    storage, e: int, pads: np.ndarray | None, groups: int, q: int, dtype: torch.dtype | None
) -> torch.Tensor | None:
    """Layer ``e``'s attention mask ``(batch, kv_heads * groups, q, extent)``: every
    held slot, and within a chunk the earlier tokens and itself, padding never.
    Boolean (True: attend) for ``dtype`` None, else additive in ``dtype``. A
    chunk's masks are built layer by layer as the layers ask, one held at a time
    (every layer's at once would be 30 x 9 x 256 x 2,304 float32, 637 MB, at budget
    2,048 on SmolLM2); a single token's additive
    masks are kept from step to step and changed only where a slot was filled or
    freed (:meth:`_decode_masks`), and are None when every slot of the extent holds
    a key (the steady state: the new token takes the slot the last victim freed)."""
    masks = storage._masks.get(dtype)
    if masks is None:
        if q == 1 and dtype is not None and not storage.aligned:
            # Every slot of the extent holds a key (nothing to mask) when each row's held
            # slots and its token's, all distinct and inside the extent, are as many as
            # the extent (the steady state); else the slots say.
            if storage.least() + 1 >= storage.extent or storage.valid[:, : storage.extent].all():
                storage._mask_stale = True
                masks = storage._masks[dtype] = [None] * storage.layers
            else:
                masks = storage._masks[dtype] = list(storage._decode_masks(groups, dtype))
        else:  # built layer by layer as asked: one layer's chunk mask at a time in memory
            masks = storage._masks[dtype] = [_UNBUILT] * storage.layers
    mask = masks[e]
    if mask is _UNBUILT:
        masks[:] = [_UNBUILT] * storage.layers  # one layer's at a time: a chunk's are large
        mask = masks[e] = storage._layer_mask(pads, groups, q, dtype, e)[0]
    return mask


def decode_masks(storage: StorageState, dtype: torch.dtype | None) -> list[Any] | None:
    """Every layer's mask of this forward in ``dtype``, as :meth:`mask` gives them,
    when its first call built them all (a single token's); else None."""
    masks = storage._masks.get(dtype)
    if masks is None or any(m is _UNBUILT for m in masks):
        return None
    return masks


def chunk_mask(storage: StorageState, e: int, pads: np.ndarray | None) -> ChunkMask | None:
    """Layer ``e``'s mask of a chunk once positions were evicted, as a
    :class:`ChunkMask`; None (use :meth:`mask`) for a single token, a layout still
    aligned, or a chunk with padding."""
    if storage.q == 1 or storage.aligned or pads is not None:
        return None
    start = storage.chunk_start
    valid = storage.valid4()[e, :, :, :start]
    held = None
    if not valid.all():
        held = torch.zeros(valid.shape, dtype=torch.float32).masked_fill_(
            torch.from_numpy(~valid), torch.finfo(torch.float32).min)[:, :, None, None, :]
    return ChunkMask(start, storage.q, held)


def _decode_masks(storage: StorageState, groups: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """The additive masks of a single-token forward, one view per layer of a store
    ``(layers, batch, heads * groups, capacity)`` that mirrors ``valid``: rebuilt when
    the layout, shape or dtype changed, else updated at the slots changed since."""
    store = storage._mask_store
    shape = (storage.layers, storage.batch, storage.heads * groups, storage.capacity)
    if store is None or store.dtype != dtype or tuple(store.shape) != shape or storage._mask_stale:
        valid = torch.from_numpy(storage.valid4()).repeat_interleave(groups, dim=2)
        store = torch.zeros(shape, dtype=dtype).masked_fill_(~valid, torch.finfo(dtype).min)
        storage._mask_store, storage._mask_stale = store, False
        storage._mask_views = None
        storage._mask_changes = []
    else:
        changed = storage._mask_changes
        if changed:
            flat = store.view(-1, storage.capacity)
            rows = np.concatenate([c[0] for c in changed])
            slots = np.concatenate([c[1] for c in changed])
            values = np.concatenate([c[2] for c in changed])
            expanded = (rows[:, None] * groups + np.arange(groups)[None, :]).reshape(-1)
            columns = np.repeat(slots, groups)
            fill = np.where(np.repeat(values, groups), 0.0, torch.finfo(dtype).min)
            if dtype in NUMPY_FLOATS:  # through NumPy's view of the store: a tenth of torch's indexing
                flat.numpy()[expanded, columns] = fill  # the same rounding as .to(dtype)
            else:
                flat[torch.from_numpy(expanded), torch.from_numpy(columns)] = torch.from_numpy(fill).to(dtype)
    storage._mask_changes = []
    views = storage._mask_views
    extents = [storage._layer_extent(e) for e in range(storage.layers)]
    if views is None or views[0] != extents:
        views = storage._mask_views = (extents, [store[e, :, :, None, :extents[e]] for e in range(storage.layers)])
    return views[1]


def _note_valid(storage: StorageState, rows: np.ndarray, slots: np.ndarray, valid: bool) -> None:
    """Record slots made valid or invalid, for the kept additive masks (when kept)."""
    if not storage._mask_stale:
        storage._mask_changes.append((rows, slots, np.full(len(rows), valid)))


def _layer_mask(storage: StorageState, pads: np.ndarray | None, groups: int, q: int, dtype: torch.dtype | None,
               layer: int) -> torch.Tensor:
    """Layer ``layer``'s mask, as ``(1, batch, heads * groups, q, extent)`` (the layer's)."""
    extent = storage._layer_extent(layer)
    valid = torch.from_numpy(storage.valid4()[layer : layer + 1, :, :, :extent])  # (1, batch, heads, extent)
    if q == 1 and not storage.aligned:
        mask = valid[:, :, :, None, None, :]
    else:
        start = storage.chunk_start
        held = valid[:, :, :, None, :start].expand(-1, -1, -1, q, -1)
        chunk = torch.ones(q, q, dtype=torch.bool).tril()[None].expand(storage.batch, -1, -1).clone()
        if pads is not None:
            pad = torch.from_numpy(pads)
            chunk &= ~pad[:, None, :]
            chunk |= torch.eye(q, dtype=torch.bool)[None] & pad[:, :, None]  # no row all masked
        chunk = chunk[None, :, None].expand(1, -1, storage.heads, -1, -1)
        mask = torch.cat((held, chunk), dim=-1)[:, :, :, None]
    mask = mask.expand(-1, -1, -1, groups, -1, -1).reshape(1, storage.batch, storage.heads * groups, q, extent)
    if dtype is not None:
        mask = torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, torch.finfo(dtype).min)
    return mask
