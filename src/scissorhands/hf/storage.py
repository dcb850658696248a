"""Where an evicting cache keeps its keys and values, and which slot holds what.

Every evicting layer has buffers ``(batch, kv_heads, capacity, head_dim)``; a *row* is
one (layer, sequence, KV head), layer-major.  Per row the storage knows the physical
slot of each held position in kept order (``slots[row, :count]``), which slots are
valid (held, or the token being written), and where its next decode token goes
(``free``).  The model attends over the slots ``[0, extent)`` of every layer; an
invalid slot is masked.

Two strategies share that bookkeeping:

* :class:`SlotStorage` (``"reuse"``): a decode token's key and value go into the slot
  its row's last victim freed, so a step writes one token and moves nothing; a chunk
  (several tokens) is appended and the layout compacted after its eviction.
* :class:`CompactStorage` (``"compact"``): the same, then every row is gathered back
  into kept order after every step (the whole cache copied each step: the simple
  layout, kept as a reference for the slot-reusing one).

While nothing has ever been evicted, slot ``s`` of every row holds padded position
``s`` (padding included, masked by transformers' own mask): the layout transformers
expects, so the mask it builds is used as it is (``aligned``).

Under a shared budget (``pool``, Ada-KV) a layer's KV heads hold different counts, and
buffers as wide as the fullest head would hold up to several times what the pool holds.
Such a storage (``share_heads``) lays each layer out, once positions were evicted, as
one buffer ``(batch, 1, capacity, head_dim)`` whose columns the layer's KV heads share:
each column holds one head's key and value, each head's mask hides the others' columns,
and the model sees the buffer expanded to ``kv_heads`` (a view).  Each layer has its own
width and extent (``layer_extent``; the slot table is as wide as the widest): the most a
layer of one sequence holds over all its heads plus a token a head, as a uniform
budget's is, whatever the pool (a pool across layers moves budget between them).  A
layer's buffer grows when its heads need more columns; when the buffers are more than a
sixteenth wider than what the layers hold, they are laid out anew.  A chunk read once
positions were evicted is written into the per-head layout, which the eviction after it
lays out shared again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._native import check, ffi, lib
from ..errors import InvalidInputError

__all__ = ["CACHE_MODES", "ChunkMask", "CompactStorage", "SlotStorage", "make_storage"]

#: ``reuse``: a decode token takes the last victim's slot; ``compact``: gather every step.
CACHE_MODES = ("reuse", "compact")
#: The slot table's dtype: 4 bytes a held position, read (and partly moved) by every
#: decode step's C passes; a row's slots are below its capacity, at most 2**31 - 1.
SLOT_DTYPE = np.int32
_MAX_CAPACITY = 2**31 - 1


#: A layer's mask not built yet in this forward (``None`` means: no mask needed).
_UNBUILT: Any = object()

_TRIANGLE: dict[int, torch.Tensor] = {}


def _int64_p(array: np.ndarray) -> Any:
    """A C-contiguous int64 array's data as ``int64_t *``."""
    return ffi.from_buffer("int64_t[]", array)


def _int32_p(array: np.ndarray) -> Any:
    """A C-contiguous int32 array's data as ``int32_t *`` (the slot table)."""
    return ffi.from_buffer("int32_t[]", array)


#: The float dtypes NumPy shares with torch (a CPU tensor's ``.numpy()`` is a view).
NUMPY_FLOATS = (torch.float16, torch.float32, torch.float64)


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


#: A single token's write index kept from step to step: the shape it was made for
#: (layers, batch, heads, capacity), its buffer, each row's base and per-layer views.
_WritePlan = tuple[tuple[int, int, int, int, tuple[int, ...]], np.ndarray, np.ndarray, tuple[torch.Tensor, ...]]


class SlotStorage:
    """The slot layout of one cache (see the module docstring).

    Parameters
    ----------
    layers : int
        Evicting layers.
    capacity : int
        Slots per row the budget needs (the budget plus the decode token's slot): a
        hint only.  The buffers are sized by what is held, never by it: they grow to
        what a forward needs, by at least a thirty-second at a time, and a compaction
        leaves room for exactly the next decode token, so that the keys and values
        take at most 1/32 more than the positions held (a stock ``DynamicCache``
        holds exactly them) and a huge budget costs nothing until it is used.
    """

    compact_every_step = False

    def __init__(self, layers: int, capacity: int, share_heads: bool = False) -> None:
        self.layers = layers
        self.hint = max(1, capacity)
        #: Whether evictions lay each layer out as one buffer the KV heads share (pools).
        self.share_heads = share_heads
        #: Whether the buffers are laid out so now ``(batch, 1, width, head_dim)``, and then
        #: each layer's extent (int64 ``(layers,)``; None when not shared).
        self.shared = False
        self.layer_extent: np.ndarray | None = None
        self.keys: list[torch.Tensor | None] = [None] * layers
        self.values: list[torch.Tensor | None] = [None] * layers
        self.batch = 0
        self.heads = 0
        self.capacity = 0
        self.extent = 0
        self.aligned = True
        self.slots = np.zeros((0, 0), dtype=SLOT_DTYPE)
        self.counts = np.zeros(0, dtype=np.int64)
        self.free = np.zeros(0, dtype=np.int64)
        self.valid = np.zeros((0, 0), dtype=bool)
        # The write of the forward in flight: decode (one token per row at `free`) or a
        # chunk at columns [chunk_start, chunk_start + q).
        self.q = 0
        self.chunk_start = 0
        self.compactions = 0
        self._write_index: tuple[torch.Tensor, ...] = ()
        self._write_plan: _WritePlan | None = None
        self._masks: dict[torch.dtype | None, list[torch.Tensor | None]] = {}
        self._mask_store: torch.Tensor | None = None
        self._mask_stale = True
        self._mask_changes: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._mask_views: tuple[list[int], list[torch.Tensor]] | None = None
        self._views: list[tuple[Any, ...] | None] = []
        self._flat: dict[tuple[int, bool], tuple[torch.Tensor, torch.Tensor]] = {}
        self._rows_cache: np.ndarray | None = None
        # Facts about `counts` and `free` kept while they are the same arrays (every
        # change to either assigns a new one): the least and largest counts, the
        # single-token extent.
        self._count_range_of: tuple[np.ndarray, int, int] | None = None
        self._free_extent: tuple[np.ndarray, int, int] | None = None
        # The slot table, validity, counts and free slots steady_layout last found ready
        # for C, their common count, and C views of the four (slots, counts, free, valid).
        self._steady_ready: tuple[Any, ...] | None = None
        # The array (and its C view) the next steady step writes the slots it frees to.
        self._spare_free: tuple[np.ndarray, Any] | None = None

    # ------------------------------------------------------------------ shape

    @property
    def rows(self) -> int:
        return self.layers * self.batch * self.heads

    def started(self) -> bool:
        return self.batch > 0

    def start(self, batch: int, heads: int) -> None:
        """Size the bookkeeping for ``batch`` sequences of ``heads`` KV heads (the
        buffers are allocated at the first write, when dtype and head size are known)."""
        self.batch, self.heads = batch, heads
        self.capacity = 0  # grown by the first forward's plan
        self.extent = 0
        self.aligned = True
        self.slots = np.zeros((self.rows, self.capacity), dtype=SLOT_DTYPE)
        self.counts = np.zeros(self.rows, dtype=np.int64)
        self.free = np.zeros(self.rows, dtype=np.int64)
        # Per row, which slots hold a position (or the token in flight); C-contiguous, so
        # that the 4-D view of valid4() is a view.
        self.valid = np.zeros((self.rows, self.capacity), dtype=bool)
        # The rotary position each slot's key was rotated with (positions="cache").
        self.rope = np.zeros((self.rows, self.capacity), dtype=np.int64)
        self.keys = [None] * self.layers
        self.values = [None] * self.layers
        self.shared = False
        self.layer_extent = None
        self._views = [None] * self.layers
        self._flat = {}
        self._mask_stale = True
        self.compactions = 0

    #: Derived caches (views, kept masks), rebuilt on demand: not part of a copy.
    _DERIVED = ("_views", "_flat", "_mask_store", "_mask_views", "_masks", "_write_index", "_write_plan",
                "_mask_changes", "_rows_cache", "_count_range_of", "_free_extent", "_steady_ready", "_spare_free")

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in self._DERIVED}
        state["_mask_stale"] = True
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._views = [None] * self.layers
        self._flat = {}
        self._mask_store = None
        self._mask_views = None
        self._masks = {}
        self._mask_changes = []
        self._write_index = ()
        self._write_plan = None
        self._rows_cache = None
        self._count_range_of = None
        self._free_extent = None
        self._steady_ready = None
        self._spare_free = None

    def most(self) -> int:
        """The largest count of a row (0 without rows)."""
        return self._count_range()[1]

    def least(self) -> int:
        """The smallest count of a row (0 without rows)."""
        return self._count_range()[0]

    def _count_range(self) -> tuple[int, int]:
        seen = self._count_range_of
        if seen is None or seen[0] is not self.counts:
            counts = self.counts
            seen = self._count_range_of = (counts, int(counts.min()) if counts.size else 0, int(counts.max(initial=0)))
        return seen[1], seen[2]

    def single_extent(self) -> int:
        """The extent a single-token forward returns once positions were evicted: each
        row's token goes to its free slot, so the extent reaches past the largest."""
        seen = self._free_extent
        if seen is None or seen[0] is not self.free or seen[1] != self.extent:
            seen = self._free_extent = (self.free, self.extent, max(self.extent, int(self.free.max(initial=0)) + 1))
        return seen[2]

    def valid4(self) -> np.ndarray:
        """``valid`` as ``(layers, batch, kv_heads, capacity)`` (a view)."""
        return self.valid.reshape(self.layers, self.batch, self.heads, self.capacity)

    def clear(self) -> None:
        """Forget everything (``reset``)."""
        self.batch = self.heads = 0
        self.start(0, 0)

    def _grow(self, need: int) -> None:
        """Make every row hold at least ``need`` slots (by at least a thirty-second, so that
        growing one token at a time copies each key a bounded number of times), keeping
        the contents."""
        if need <= self.capacity:
            return
        if need > _MAX_CAPACITY:
            raise InvalidInputError(
                f"a row of the cache would hold {need} slots; at most {_MAX_CAPACITY} fit its slot table")
        capacity = min(_MAX_CAPACITY, max(need, self.capacity + self.capacity // 32))
        pad = capacity - self.capacity
        self.slots = np.pad(self.slots, ((0, 0), (0, pad)))
        self.rope = np.pad(self.rope, ((0, 0), (0, pad)))
        self.valid = np.pad(self.valid, ((0, 0), (0, pad)))
        for e in range(self.layers if not self.shared else 0):  # shared: each layer's own (_grow_layers)
            for store in (self.keys, self.values):
                old = store[e]
                if old is not None:
                    new = old.new_zeros((*old.shape[:2], capacity, old.shape[3]))
                    new[:, :, : self.capacity] = old
                    store[e] = new
        self.capacity = capacity
        self._mask_stale = True

    def _layer_widths(self) -> list[int]:
        """Each layer's buffer width (0 before its first write)."""
        return [0 if k is None else int(k.shape[2]) for k in self.keys]

    def _grow_layers(self, need: np.ndarray) -> None:
        """Laid out shared: make layer ``e``'s buffers at least ``need[e]`` wide (by at
        least a thirty-second), keeping the contents."""
        for e, width in enumerate(self._layer_widths()):
            if need[e] <= width:
                continue
            wider = min(self.capacity, max(int(need[e]), width + width // 32))
            for store in (self.keys, self.values):
                old = store[e]
                assert old is not None
                new = old.new_zeros((*old.shape[:2], wider, old.shape[3]))
                new[:, :, :width] = old
                store[e] = new

    def _narrow_layers(self, widths: list[int]) -> None:
        """Laid out shared: layer ``e``'s buffers back to ``widths[e]`` (none past it holds
        a position)."""
        for e, width in enumerate(widths):
            for store in (self.keys, self.values):
                old = store[e]
                if old is not None and old.shape[2] > width:
                    store[e] = old[:, :, :width].clone()

    def _layer_extent(self, e: int) -> int:
        return self.extent if self.layer_extent is None else int(self.layer_extent[e])

    # ------------------------------------------------------------------ one forward

    def prepare(self, q: int) -> bool:
        """Before the plan of a forward of ``q`` tokens: a chunk is written per head, so
        buffers laid out shared are laid out per head.  Returns whether they were."""
        if self.shared and q > 1:
            self._relayout_per_head(self.slots[:, : max(1, self.most())].astype(np.int64), self.counts.copy())
            return True
        return False

    def plan_state(self, prepared: bool = False) -> tuple[Any, ...]:
        """What :meth:`unplan` restores: the extents, chunk start, ``q`` and widths, and
        whether :meth:`prepare` laid shared buffers out per head (``prepared``; undone
        by laying them out shared again, as narrow as what they hold allows)."""
        layer_extent = None if self.layer_extent is None else self.layer_extent.copy()
        return (self.extent, self.chunk_start, self.q, self.capacity, layer_extent, self._layer_widths(),
                prepared)

    def plan(self, q: int) -> int:
        """Decide where this forward's ``q`` tokens go; return the extent the layers will
        return (keys ``[0, extent)``). A single token goes to each row's free slot once
        anything was evicted; otherwise the tokens are appended after the extent."""
        self.prepare(q)
        self.q = q
        if q == 1 and not self.aligned:
            extent = self.single_extent()
            self._grow(extent)
            if self.layer_extent is not None:  # each layer's: past its own columns and tokens
                layer_extent = np.maximum(self.layer_extent, self.free.reshape(self.layers, -1).max(axis=1) + 1)
                self._grow_layers(layer_extent)
                self.layer_extent = layer_extent
            rows = self._row_index()
            self.valid[rows, self.free] = True
            if not self._mask_stale:
                self._note_valid(rows, self.free.copy(), True)
            self._plan_writes()
        else:
            self.chunk_start = self.extent
            extent = self.extent + q
            self._grow(extent)
        self.extent = extent
        self._masks = {}
        return extent

    def _plan_writes(self) -> None:
        """A single token's write index per layer: each row's free slot as a flat index
        into its layer's keys viewed ``(batch * heads * capacity, head_dim)``, written
        into a buffer kept while the shape stays, whose per-layer views
        (``_write_index``) are made once."""
        kept = self._write_plan
        widths = tuple(self._layer_widths()) if self.shared else ()
        shape = (self.layers, self.batch, self.heads, self.capacity, widths)
        if kept is None or kept[0] != shape:
            per_layer = self.batch * self.heads
            if self.shared:  # a (sequence, head)'s slot is a column of its sequence's buffer
                sequence = np.repeat(np.arange(self.batch, dtype=np.int64), self.heads)
                base = np.concatenate([sequence * width for width in widths])
            else:
                base = np.tile(np.arange(per_layer, dtype=np.int64) * self.capacity, self.layers)
            buffer = np.empty(self.rows, dtype=np.int64)
            views = torch.from_numpy(buffer).view(self.layers, per_layer).unbind(0)
            kept = self._write_plan = (shape, buffer, base, views)
        np.add(self.free, kept[2], out=kept[1])
        self._write_index = kept[3]

    def unplan(self, state: tuple[Any, ...]) -> None:
        """Undo the last :meth:`plan` (its forward failed before the step): the slots it
        made valid are free again; the extents, chunk start, ``q`` and widths are those of
        ``state`` (:meth:`plan_state` before it: width the plan grew, which holds nothing,
        is given back, so that a refused chunk leaves the memory as it was)."""
        extent, chunk_start, q, capacity, layer_extent, widths, prepared = state
        if self.q == 1 and not self.aligned:
            rows = np.arange(self.rows)
            self.valid[rows, self.free] = False
            self._note_valid(rows, self.free.copy(), False)
        self.extent, self.chunk_start, self.q, self.layer_extent = extent, chunk_start, q, layer_extent
        self._masks = {}
        if capacity < self.capacity:
            self._shrink(capacity)
        if self.shared:
            self._narrow_layers(widths)
        elif prepared:
            self.compact()

    def _shrink(self, capacity: int) -> None:
        """Every row back to ``capacity`` slots (none past it holds a position)."""
        self.slots = np.ascontiguousarray(self.slots[:, :capacity])
        self.rope = np.ascontiguousarray(self.rope[:, :capacity])
        self.valid = np.ascontiguousarray(self.valid[:, :capacity])
        for store in (self.keys, self.values):
            for e, old in enumerate(store):
                if old is not None and old.shape[2] > capacity:
                    store[e] = old[:, :, :capacity].clone()
        self.capacity = capacity
        self._mask_stale = True

    def write(self, e: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store layer ``e``'s new keys and values as planned; return ``[0, extent)``."""
        if key.dim() != 4 or value.dim() != 4 or key.shape[0] != self.batch or key.shape[1] != self.heads:
            raise InvalidInputError(
                f"the cache holds {self.batch} sequences of {self.heads} KV heads, the model "
                f"wrote keys {tuple(key.shape)} and values {tuple(value.shape)}: reset() the cache before a new batch")
        if key.shape[:3] != value.shape[:3] or key.shape[2] != self.q:
            raise InvalidInputError(
                f"layer {e}'s keys {tuple(key.shape)} and values {tuple(value.shape)} are not "
                f"({self.batch}, {self.heads}, {self.q}, head_dim) each ({self.q} new tokens a sequence in "
                "this forward)")
        decode = self.q == 1 and not self.aligned
        for store, new in ((self.keys, key.detach()), (self.values, value.detach())):
            buffer = store[e]
            if buffer is None:
                buffer = store[e] = new.new_zeros((self.batch, self.heads, self.capacity, new.shape[-1]))
            elif buffer.shape[-1] != new.shape[-1] or buffer.dtype is not new.dtype:
                raise InvalidInputError(
                    f"layer {e} holds {'keys' if store is self.keys else 'values'} of width {buffer.shape[-1]} "
                    f"({buffer.dtype}); the model wrote width {new.shape[-1]} ({new.dtype}): reset() the cache "
                    "before another model")
            if decode:
                key_ = (e, store is self.keys)
                flat = self._flat.get(key_)
                if flat is None or flat[0] is not buffer:
                    flat = self._flat[key_] = (buffer, buffer.view(-1, buffer.shape[-1]))
                flat[1].index_copy_(0, self._write_index[e], new.reshape(-1, new.shape[-1]))
            else:
                buffer[:, :, self.chunk_start:self.chunk_start + self.q] = new
        # The [0, extent) views, kept while the buffers and the extent stay (the steady state).
        cached = self._views[e]
        keys, values = self.keys[e], self.values[e]
        extent = self._layer_extent(e)
        if cached is None or cached[0] is not keys or cached[2] != extent:
            assert keys is not None and values is not None
            cached = self._views[e] = (keys, self._heads_view(keys[:, :, :extent]), extent,
                                       self._heads_view(values[:, :, :extent]))
        return cached[1], cached[3]

    def _heads_view(self, buffer: torch.Tensor) -> torch.Tensor:
        """``buffer`` as ``(batch, kv_heads, ...)``: itself, or (laid out shared) its one
        column space expanded to every KV head (a view)."""
        return buffer.expand(-1, self.heads, -1, -1) if buffer.shape[1] != self.heads else buffer

    def layer_buffers(self, e: int) -> tuple[torch.Tensor, torch.Tensor] | tuple[None, None]:
        """Layer ``e``'s key and value buffers as ``(batch, kv_heads, capacity, head_dim)``
        (laid out shared: views of the one buffer its KV heads share), or None each
        before the first write."""
        keys, values = self.keys[e], self.values[e]
        if keys is None or values is None:
            return None, None
        return self._heads_view(keys), self._heads_view(values)

    def mask(
        self, e: int, pads: np.ndarray | None, groups: int, q: int, dtype: torch.dtype | None
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
        masks = self._masks.get(dtype)
        if masks is None:
            if q == 1 and dtype is not None and not self.aligned:
                # Every slot of the extent holds a key (nothing to mask) when each row's held
                # slots and its token's, all distinct and inside the extent, are as many as
                # the extent (the steady state); else the slots say.
                if self.least() + 1 >= self.extent or self.valid[:, : self.extent].all():
                    self._mask_stale = True
                    masks = self._masks[dtype] = [None] * self.layers
                else:
                    masks = self._masks[dtype] = list(self._decode_masks(groups, dtype))
            else:  # built layer by layer as asked: one layer's chunk mask at a time in memory
                masks = self._masks[dtype] = [_UNBUILT] * self.layers
        mask = masks[e]
        if mask is _UNBUILT:
            masks[:] = [_UNBUILT] * self.layers  # one layer's at a time: a chunk's are large
            mask = masks[e] = self._layer_mask(pads, groups, q, dtype, e)[0]
        return mask

    def decode_masks(self, dtype: torch.dtype | None) -> list[Any] | None:
        """Every layer's mask of this forward in ``dtype``, as :meth:`mask` gives them,
        when its first call built them all (a single token's); else None."""
        masks = self._masks.get(dtype)
        if masks is None or any(m is _UNBUILT for m in masks):
            return None
        return masks

    def chunk_mask(self, e: int, pads: np.ndarray | None) -> ChunkMask | None:
        """Layer ``e``'s mask of a chunk once positions were evicted, as a
        :class:`ChunkMask`; None (use :meth:`mask`) for a single token, a layout still
        aligned, or a chunk with padding."""
        if self.q == 1 or self.aligned or pads is not None:
            return None
        start = self.chunk_start
        valid = self.valid4()[e, :, :, :start]
        held = None
        if not valid.all():
            held = torch.zeros(valid.shape, dtype=torch.float32).masked_fill_(
                torch.from_numpy(~valid), torch.finfo(torch.float32).min)[:, :, None, None, :]
        return ChunkMask(start, self.q, held)

    def _decode_masks(self, groups: int, dtype: torch.dtype) -> list[torch.Tensor]:
        """The additive masks of a single-token forward, one view per layer of a store
        ``(layers, batch, heads * groups, capacity)`` that mirrors ``valid``: rebuilt when
        the layout, shape or dtype changed, else updated at the slots changed since."""
        store = self._mask_store
        shape = (self.layers, self.batch, self.heads * groups, self.capacity)
        if store is None or store.dtype != dtype or tuple(store.shape) != shape or self._mask_stale:
            valid = torch.from_numpy(self.valid4()).repeat_interleave(groups, dim=2)
            store = torch.zeros(shape, dtype=dtype).masked_fill_(~valid, torch.finfo(dtype).min)
            self._mask_store, self._mask_stale = store, False
            self._mask_views = None
            self._mask_changes = []
        else:
            changed = self._mask_changes
            if changed:
                flat = store.view(-1, self.capacity)
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
        self._mask_changes = []
        views = self._mask_views
        extents = [self._layer_extent(e) for e in range(self.layers)]
        if views is None or views[0] != extents:
            views = self._mask_views = (extents, [store[e, :, :, None, :extents[e]] for e in range(self.layers)])
        return views[1]

    def _note_valid(self, rows: np.ndarray, slots: np.ndarray, valid: bool) -> None:
        """Record slots made valid or invalid, for the kept additive masks (when kept)."""
        if not self._mask_stale:
            self._mask_changes.append((rows, slots, np.full(len(rows), valid)))

    def _layer_mask(self, pads: np.ndarray | None, groups: int, q: int, dtype: torch.dtype | None,
                   layer: int) -> torch.Tensor:
        """Layer ``layer``'s mask, as ``(1, batch, heads * groups, q, extent)`` (the layer's)."""
        extent = self._layer_extent(layer)
        valid = torch.from_numpy(self.valid4()[layer : layer + 1, :, :, :extent])  # (1, batch, heads, extent)
        if q == 1 and not self.aligned:
            mask = valid[:, :, :, None, None, :]
        else:
            start = self.chunk_start
            held = valid[:, :, :, None, :start].expand(-1, -1, -1, q, -1)
            chunk = torch.ones(q, q, dtype=torch.bool).tril()[None].expand(self.batch, -1, -1).clone()
            if pads is not None:
                pad = torch.from_numpy(pads)
                chunk &= ~pad[:, None, :]
                chunk |= torch.eye(q, dtype=torch.bool)[None] & pad[:, :, None]  # no row all masked
            chunk = chunk[None, :, None].expand(1, -1, self.heads, -1, -1)
            mask = torch.cat((held, chunk), dim=-1)[:, :, :, None]
        mask = mask.expand(-1, -1, -1, groups, -1, -1).reshape(1, self.batch, self.heads * groups, q, extent)
        if dtype is not None:
            mask = torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, torch.finfo(dtype).min)
        return mask

    def new_columns(self) -> np.ndarray:
        """``(rows, q)`` the physical slots of this forward's tokens."""
        if self.q == 1 and not self.aligned:
            return self.free[:, None].copy()
        return np.broadcast_to(np.arange(self.chunk_start, self.chunk_start + self.q), (self.rows, self.q))

    def ranks(self, admitted: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """``positions="cache"``: each slot's rank in its row's kept order ``(rows,
        extent)`` (the new tokens after the held ones, padding not counted), and the new
        tokens' ranks ``(rows, q)``."""
        rows = np.arange(self.rows)[:, None]
        rank = np.zeros((self.rows, self.capacity), dtype=np.int64)
        width = int(self.counts.max(initial=0))
        order = np.broadcast_to(np.arange(width), (self.rows, width))
        held = order < self.counts[:, None]
        rank[np.broadcast_to(rows, (self.rows, width))[held], self.slots[:, :width][held]] = order[held]
        steps = np.ones((self.rows, self.q), dtype=np.int64) if admitted is None else admitted.astype(np.int64)
        new_rank = self.counts[:, None] + np.cumsum(steps, axis=1) - steps
        rank[np.broadcast_to(rows, (self.rows, self.q)), self.new_columns()] = new_rank
        return rank[:, : self.extent], new_rank

    # ------------------------------------------------------------------ after the policies

    def chunk_columns(self, width: int) -> np.ndarray:
        """``(rows, width)`` physical columns in ``extend``'s layout: a row's held slots,
        then chunk token ``j`` at column ``count + j``."""
        col = np.arange(width)[None, :]
        counts = self.counts[:, None]
        chunk = self.chunk_start + col - counts
        held = np.take_along_axis(self.slots, np.minimum(col, self.capacity - 1).repeat(self.rows, 0), axis=1)
        out = np.where(col < counts, held, chunk)
        return np.clip(out, 0, self.extent - 1)

    def c_array(self, name: str, dtype: Any) -> np.ndarray:
        """The array ``name`` (``slots``, ``valid``, ``counts``, ``free``, ``rope``) as the C
        kernels read and write it in place: C-contiguous of ``dtype`` (the slot table's is
        :data:`SLOT_DTYPE`), made so first when it is not."""
        array = getattr(self, name)
        if array.dtype != dtype or not array.flags.c_contiguous:
            array = np.ascontiguousarray(array, dtype=dtype)
            setattr(self, name, array)
        return array

    def steady_layout(self) -> tuple[Any, ...] | None:
        """When a single token's step can be the steady one (positions were evicted, every
        row holds the same count), what ``sh_slots_step_steady`` reads and writes: ``(count,
        freed, slots, counts, free, valid, freed_c)``, the count, the int64 ``freed`` array
        for the slots the step frees (the free slots before the last steady step, else a
        new one) and C views of the slot table, counts, free slots, validity and ``freed``
        (each made C-contiguous, the table int32, counts and free slots int64, first when
        not); else None."""
        if self.aligned or self.compact_every_step:
            return None
        ready = self._steady_ready  # what was found ready last time, while the arrays are the same
        if (ready is None or ready[0] is not self.slots or ready[1] is not self.valid or ready[2] is not self.counts
                or ready[3] is not self.free):
            if not self.rows:
                return None
            count = self.least()
            if count != self.most():
                return None
            slots, valid = self.c_array("slots", SLOT_DTYPE), self.c_array("valid", np.bool_)
            counts, free = self.c_array("counts", np.int64), self.c_array("free", np.int64)
            ready = self._steady_ready = (slots, valid, counts, free, count, _int32_p(slots), _int64_p(counts),
                                          _int64_p(free), ffi.from_buffer("uint8_t[]", valid))
        # The array the last steady step freed its slots from (its free slots before it)
        # takes this step's: the free slots alternate between two arrays and their views.
        spare = self._spare_free
        if spare is None or spare[0] is self.free or len(spare[0]) != self.rows:
            freed = np.empty(self.rows, dtype=np.int64)
            spare = (freed, _int64_p(freed))
        self._spare_free = None
        return ready[4], spare[0], ready[5], ready[6], ready[7], ready[8], spare[1]

    def aligned_layout(self) -> tuple[int, Any, Any] | None:
        """While nothing was ever evicted and every row holds the same count (each row's
        slot table then counts its slots up from 0): that count and C views of the slot
        table and counts for a decode step's gather (``sh_cache_step_steady`` without the
        slot table's step, which :meth:`apply_step` then does); else None."""
        if not self.aligned or not self.rows:
            return None
        count = self.least()
        if count != self.most():
            return None
        return count, _int32_p(self.c_array("slots", SLOT_DTYPE)), _int64_p(self.c_array("counts", np.int64))

    def stepped_aligned(self) -> None:
        """:meth:`apply_step` evicting nothing while aligned and every row holds the same
        count (what :meth:`aligned_layout` found): each row's token, at the last column of
        the extent, goes last in its kept order."""
        width = int(self.counts[0]) + 1
        column = self.extent - 1
        self._grow(width)
        self.valid[:, column] = True
        self.slots[:, width - 1] = column
        self.counts = self.counts + 1
        self._count_range_of = (self.counts, width, width)  # every count one more
        self.free = np.full(self.rows, self.extent, dtype=np.int64)

    def stepped_steady(self, freed: np.ndarray, freed_c: Any = None) -> None:
        """After ``sh_slots_step_steady`` changed the slot table and validity in place:
        ``freed`` (each row's slot freed; ``freed_c`` its C view from
        :meth:`steady_layout`) is the next token's, the kept masks learn it."""
        if not self._mask_stale:  # a copy: the array is written again two steps on
            self._mask_changes.append((self._row_index(), freed.copy(), np.zeros(self.rows, dtype=bool)))
        ready = self._steady_ready
        if ready is not None and ready[3] is self.free:  # freed is as ready as the free slots were
            self._steady_ready = (*ready[:3], freed, ready[4], ready[5], ready[6],
                                  _int64_p(freed) if freed_c is None else freed_c, ready[8])
            # Nothing else keeps the free slots before this step (what reads them copies):
            # they are the next steady step's freed.
            self._spare_free = (ready[3], ready[7])
        self.free = freed
        # Every freed slot held a position, inside the extent: the next token's extent is this one.
        self._free_extent = (freed, self.extent, self.extent)

    def apply_steady(self, slots: np.ndarray) -> bool:
        """The steady state of :meth:`apply_step`, in one C pass (``sh_slots_step_steady``):
        every row held the same count, took its token at ``free`` and evicted exactly one
        kept index (``slots``, one per row). Returns False (nothing done) when that is not
        the case."""
        layout = self.steady_layout() if len(slots) == self.rows else None
        if layout is None:
            return False
        count, freed, slots_c, counts_c, free_c, valid_c, freed_c = layout
        index = slots if slots.dtype == np.int64 and slots.flags.c_contiguous else np.ascontiguousarray(
            slots, dtype=np.int64)
        # Each row's token into its kept order, its victim out of it (the later slots one
        # left) and its slot freed.
        rc = lib.sh_slots_step_steady(slots_c, self.rows, self.slots.shape[1], count, counts_c, free_c,
                                      _int64_p(index), valid_c, self.valid.shape[1], freed_c)
        if rc == lib.SH_ERR_LENGTH:
            return False
        check(rc, "apply_steady")
        self.stepped_steady(freed, freed_c)
        return True

    def _row_index(self) -> np.ndarray:
        index = self._rows_cache
        if index is None or len(index) != self.rows:
            index = self._rows_cache = np.arange(self.rows)
        return index

    def apply_step(self, victims: np.ndarray, slots: np.ndarray) -> None:
        """After a decode step: each row admitted its token (at ``free``, or appended
        while aligned) and evicted ``victims[row]`` positions whose kept-order indices
        (before the eviction, the new token last) are ``slots``, row after row."""
        if len(slots) == self.rows and self.apply_steady(slots):
            return
        rows = np.arange(self.rows)
        n = self.counts
        new_slot = np.full(self.rows, self.extent - 1, dtype=np.int64) if self.aligned else self.free.copy()
        if not victims.any():  # nothing evicted (below the budget): each row's token goes last
            width = self.most() + 1
            self._grow(width)
            self.valid[rows, new_slot] = True
            self.slots[rows, n] = new_slot
            least = self.least()
            self.counts = n + 1
            self._count_range_of = (self.counts, least + 1, width)  # every count one more
            self.free = np.full(self.rows, self.extent, dtype=np.int64) if self.aligned else \
                self._free_where(np.zeros(self.rows, dtype=np.int64), np.ones(self.rows, dtype=bool))
            return
        if self.aligned:  # (something is evicted from here on)
            self._apply_general(victims, slots, [new_slot[r:r + 1] for r in rows.tolist()])
            return
        if (victims > 1).any():  # rows sharing a budget (pools): any number per row
            self._apply_ragged(victims, slots, new_slot)
            return
        # No row evicted more than one: as many victims as rows is one in every row.
        if len(slots) == self.rows:
            self._apply_one_each(slots, new_slot)
            return
        # Some rows evicted one, the others none: the former drop their victim (the later
        # kept indices one left), the latter keep the token last.
        width = self.most() + 1
        self._grow(width)
        flat_valid = self.valid
        flat_valid[rows, new_slot] = True
        self.slots[rows, n] = new_slot  # the new token, last in kept order
        one = victims == 1
        layout = self.slots[:, :width].copy()
        victim = np.zeros(self.rows, dtype=np.int64)
        victim[one] = slots  # one slot per evicting row, in row order
        freed = layout[rows, victim].astype(np.int64)
        cols = np.arange(width - 1)[None, :]
        shifted = np.where(cols < victim[:, None], layout[:, :-1], layout[:, 1:])
        self.slots[:, : width - 1] = np.where(one[:, None], shifted, layout[:, :-1])
        self.slots[~one, width - 1] = layout[~one, width - 1]
        flat_valid[rows[one], freed[one]] = False
        self._note_valid(rows[one], freed[one], False)
        self.counts = n + 1 - victims
        self.free = self._free_where(freed, ~one)
        self._after_step()

    def _apply_one_each(self, slots: np.ndarray, new_slot: np.ndarray) -> None:
        """:meth:`apply_step` when every row evicted exactly one position (``slots``, its
        kept-order index, one per row) whatever it held, once positions were evicted: one
        C pass (``sh_slots_step_rows``) over the rows' own counts, where rows of several
        configurations or budgets (``eval``'s batch) hold different counts (the table is
        grown first to take every row's token)."""
        rows = self._row_index()
        self._grow(self.most() + 1)
        self.valid[rows, new_slot] = True
        table, valid = self.c_array("slots", SLOT_DTYPE), self.c_array("valid", np.bool_)
        counts, free = self.c_array("counts", np.int64), np.ascontiguousarray(new_slot, dtype=np.int64)
        index = np.ascontiguousarray(slots, dtype=np.int64)
        freed = np.empty(self.rows, dtype=np.int64)
        rc = lib.sh_slots_step_rows(_int32_p(table), self.rows, table.shape[1], _int64_p(counts), _int64_p(free),
                                    _int64_p(index), ffi.from_buffer("uint8_t[]", valid), valid.shape[1],
                                    _int64_p(freed))
        check(rc, "apply_step")
        self._note_valid(rows, freed, False)
        self.free = freed  # the counts stay: one token in, one position out, every row
        self._after_step()

    def _apply_ragged(self, victims: np.ndarray, slots: np.ndarray, new_slot: np.ndarray) -> None:
        """:meth:`apply_step` for any number of victims per row (rows sharing a budget),
        without moving a key: each row's kept order drops its victims (its survivors to
        the front, in order: one C pass over the rows that evict, ``sh_slots_evict_rows``),
        their slots become holes, and the row's next token takes the slot of its first
        victim, or its lowest hole when it evicted none."""
        rows = self._row_index()
        n = self.counts
        width = int(n.max(initial=0)) + 1
        self._grow(width)
        self.valid[rows, new_slot] = True
        self.slots[rows, n] = new_slot  # the new token, last in kept order
        table, valid = self.c_array("slots", SLOT_DTYPE), self.c_array("valid", np.bool_)
        held = np.ascontiguousarray(n + 1, dtype=np.int64)
        counts = np.ascontiguousarray(victims, dtype=np.int64)
        index = np.ascontiguousarray(slots, dtype=np.int64)
        freed = np.empty(len(index), dtype=np.int64)
        check(lib.sh_slots_evict_rows(_int32_p(table), self.rows, table.shape[1], _int64_p(held), _int64_p(counts),
                                      _int64_p(index), len(index), ffi.from_buffer("uint8_t[]", valid),
                                      valid.shape[1], _int64_p(freed)), "apply_step")
        owner = np.repeat(rows, victims)
        self._note_valid(owner, freed, False)
        self.counts = n + 1 - victims
        evicted = victims > 0
        first = np.concatenate(([0], np.cumsum(victims)[:-1]))
        free = np.zeros(self.rows, dtype=np.int64)
        free[evicted] = freed[first[evicted]]
        self.free = self._free_where(free, ~evicted) if not evicted.all() else free
        self._after_step()

    def _free_where(self, free: np.ndarray, needs: np.ndarray) -> np.ndarray:
        """``free`` (each row's next token's slot; a row's first victim's) with the rows
        ``needs`` (which freed none) given a slot: per head its lowest invalid slot, or
        the capacity when none is; laid out shared, the lowest columns that no KV head of
        its (layer, sequence) holds or was given, head after head."""
        if not self.shared:
            free = free.copy()
            free[needs] = self._first_free()[needs]
            return free
        heads = self.heads
        taken = np.zeros((self.rows // heads, self.capacity + heads), dtype=bool)
        taken[:, : self.capacity] = self.valid.reshape(-1, heads, self.capacity).any(axis=1)
        groups = np.arange(self.rows) // heads
        given = ~needs
        taken[groups[given], free[given]] = True  # a first victim's slot is its own head's
        free = free.copy()
        for h in range(heads):
            rows = np.flatnonzero(needs[h::heads]) * heads + h
            if rows.size:
                columns = np.argmin(taken[groups[rows]], axis=1)  # the padding columns are never all taken
                taken[groups[rows], columns] = True
                free[rows] = columns
        return free

    def _first_free(self) -> np.ndarray:
        """Each row's lowest invalid slot (the extent when none is)."""
        flat_valid = self.valid
        first = np.argmin(flat_valid, axis=1)
        full = flat_valid[np.arange(self.rows), first]
        return np.where(full, self.capacity, first)

    def apply_chunk(self, admit: np.ndarray | None, victims: np.ndarray, slots: np.ndarray) -> None:
        """After a chunk of ``q`` tokens at columns ``[chunk_start, chunk_start + q)``: each
        row admitted the tokens ``admit[row]`` allows, then evicted."""
        q = self.q
        columns = np.arange(self.chunk_start, self.chunk_start + q)
        new = [columns if admit is None else columns[admit[r]] for r in range(self.rows)]
        if not victims.any() and self.aligned:
            # Still the layout transformers expects: every token in its column.
            for r in range(self.rows):
                k = len(new[r])
                self._grow(int(self.counts[r]) + k)
                self.slots[r, self.counts[r]:self.counts[r] + k] = new[r]
                self.valid[r, new[r]] = True
            self.counts = self.counts + np.array([len(x) for x in new], dtype=np.int64)
            self.free = np.full(self.rows, self.extent, dtype=np.int64)  # a new array: kept facts follow it
            self._mask_stale = True
            return
        self._apply_general(victims, slots, new)

    def evict(self, victims: np.ndarray, slots: np.ndarray) -> None:
        """Between forwards: each row loses ``victims[row]`` held positions, whose
        kept-order indices are ``slots`` (row after row); their slots are freed and the
        layout compacted (nothing when no row loses any)."""
        if not victims.any():
            return
        empty = np.zeros(0, dtype=np.int64)
        self._apply_general(victims, slots, [empty] * self.rows)

    def drop_tail(self, dropped: np.ndarray, extent: int) -> None:
        """Between forwards: each row forgets its last ``dropped[row]`` held positions in
        kept order (those at or after a prompt's common prefix with what was read), so
        that ``extent`` tokens count as seen.  While nothing was ever evicted the layout
        stays the one transformers expects (slot ``s`` position ``s``, ``[0, extent)``,
        the buffers narrowed to it and the next token's slot); else the rows lose them
        as an eviction's victims and are compacted."""
        if not self.aligned:
            if not dropped.any():
                return
            starts = self.counts - dropped
            within = np.arange(int(dropped.sum())) - np.repeat(np.cumsum(dropped) - dropped, dropped)
            self.evict(dropped, np.repeat(starts, dropped) + within)
            return
        self.counts = self.counts - self.valid[:, extent:].sum(axis=1)
        self.valid[:, extent:] = False
        self.free = np.full(self.rows, extent, dtype=np.int64)
        self.extent = extent
        self._masks = {}
        if self.capacity > extent + 1:
            self._shrink(extent + 1)
        self._mask_stale = True

    def _apply_general(self, victims: np.ndarray, slots: np.ndarray, new: list[np.ndarray]) -> None:
        """Any admission and eviction, then a compaction into kept order."""
        offsets = np.concatenate(([0], np.cumsum(victims)))
        kept = []
        for r in range(self.rows):
            combined = np.concatenate((self.slots[r, : self.counts[r]], new[r]))
            keep = np.ones(len(combined), dtype=bool)
            keep[slots[offsets[r]:offsets[r + 1]]] = False
            kept.append(combined[keep])
        counts = np.array([len(k) for k in kept], dtype=np.int64)
        width = int(counts.max(initial=0))
        index = np.zeros((self.rows, max(width, 1)), dtype=np.int64)
        for r, k in enumerate(kept):
            index[r, : len(k)] = k
        self.aligned = False
        self._relayout(index, counts)

    def compact(self) -> None:
        """Gather every row's held slots into kept order at ``[0, count)``."""
        self._relayout(self.slots[:, : max(1, int(self.counts.max(initial=0)))].astype(np.int64),
                       self.counts.copy())

    def _relayout(self, index: np.ndarray, counts: np.ndarray) -> None:
        """Rebuild the buffers: row ``r`` keeps physical slots ``index[r, :counts[r]]``,
        in that order; per head (each row's moved to ``[0, counts[r])``) or, once
        positions were evicted under a shared budget with several KV heads, shared."""
        if self.share_heads and self.heads > 1 and not self.aligned:
            self._relayout_shared(index, counts)
        else:
            self._relayout_per_head(index, counts)

    def _relayout_shared(self, index: np.ndarray, counts: np.ndarray) -> None:
        """:meth:`_relayout` into one buffer ``(batch, 1, capacity, head_dim)`` a layer:
        a (layer, sequence)'s heads one after the other, head ``h``'s kept positions at
        columns ``[start, start + count)`` (``start`` what the heads before it hold); the
        capacity is the most a (layer, sequence) holds plus a token a head, which go to
        the columns after its held ones."""
        heads, batch = self.heads, self.batch
        grouped = counts.reshape(-1, heads)
        totals = grouped.sum(axis=1)  # per (layer, sequence)
        start = (np.cumsum(grouped, axis=1) - grouped).reshape(-1)  # each row's first column
        layer_extent = totals.reshape(self.layers, batch).max(axis=1).astype(np.int64)
        width = int(layer_extent.max(initial=0))
        capacity = width + heads
        held = np.arange(index.shape[1])[None, :] < counts[:, None]  # (rows, width of index)
        row_of, order = np.nonzero(held)
        target = start[row_of] + order
        source = index[row_of, order]
        for e in range(self.layers):
            first, last = np.searchsorted(row_of, [e * batch * heads, (e + 1) * batch * heads])
            rows = row_of[first:last] - e * batch * heads
            sequence = torch.from_numpy(rows // heads)
            column = torch.from_numpy(target[first:last])
            head, slot = torch.from_numpy(rows % heads), torch.from_numpy(source[first:last])
            for store in (self.keys, self.values):
                old = store[e]
                if old is None:
                    continue
                buffer = old.new_zeros((batch, 1, int(layer_extent[e]) + heads, old.shape[-1]))
                buffer[sequence, 0, column] = self._heads_view(old)[sequence, head, slot]
                store[e] = buffer
        rope = np.zeros((self.rows, capacity), dtype=np.int64)
        rope[row_of, target] = self.rope[row_of, source]
        self.rope = rope
        slots = np.zeros((self.rows, capacity), dtype=SLOT_DTYPE)
        slots[row_of, order] = target
        self.slots = slots
        valid = np.zeros((self.rows, capacity), dtype=bool)
        valid[row_of, target] = True
        self.valid = valid
        self.counts = counts
        # Each head's next token after every held column of its (layer, sequence).
        self.free = np.repeat(totals, heads) + np.tile(np.arange(heads, dtype=np.int64), len(totals))
        self.capacity = capacity
        self.extent = width
        self.layer_extent = layer_extent
        self.shared = True
        self.compactions += 1
        self._mask_stale = True

    def _after_step(self) -> None:
        """After a decode step's slot changes: the compact strategy gathers every row into
        kept order; buffers laid out shared are laid out anew when too wide."""
        if self.compact_every_step:
            self.compact()
        elif self.shared:
            self._relayout_when_wide()

    def _relayout_when_wide(self) -> None:
        """Laid out shared, after a step: lay the buffers out anew when they are more than
        a sixteenth wider than the layers' held columns and a token a head (a pool across
        layers shrinks some layers and grows others; a layer's buffer never narrows)."""
        need = self.counts.reshape(self.layers, self.batch, self.heads).sum(axis=2).max(axis=1).sum()
        need += self.layers * self.heads
        if 16 * sum(self._layer_widths()) > 17 * need:
            self.compact()

    def _relayout_per_head(self, index: np.ndarray, counts: np.ndarray) -> None:
        """:meth:`_relayout` per head: row ``r``'s kept slots moved to ``[0, counts[r])``;
        the capacity becomes what they need and the next decode token."""
        width = index.shape[1]
        capacity = width + 1
        for e in range(self.layers):
            rows = slice(e * self.batch * self.heads, (e + 1) * self.batch * self.heads)
            gather = torch.from_numpy(index[rows].reshape(self.batch, self.heads, width))
            for store in (self.keys, self.values):
                old = store[e]
                if old is None:
                    continue
                dim = old.shape[-1]
                old = self._heads_view(old)
                moved = old.gather(2, gather.to(old.device)[..., None].expand(-1, -1, -1, dim))
                buffer = old.new_zeros((self.batch, self.heads, capacity, dim))
                buffer[:, :, :width] = moved
                store[e] = buffer
        self.capacity = capacity
        rope = np.zeros((self.rows, capacity), dtype=np.int64)
        rope[:, :width] = np.take_along_axis(self.rope, index, axis=1)
        self.rope = rope
        self.slots = np.zeros((self.rows, capacity), dtype=SLOT_DTYPE)
        self.slots[:, :width] = np.arange(width)[None, :]
        self.counts = counts
        self.valid = np.ascontiguousarray(np.arange(capacity)[None, :] < counts[:, None])
        self.free = counts.copy()
        self.extent = width
        self.shared = False
        self.layer_extent = None
        self.compactions += 1
        self._mask_stale = True

    def load_rows(self, keys: list[torch.Tensor], values: list[torch.Tensor], counts: np.ndarray) -> None:
        """Lay the buffers out anew from keys and values given in kept order: layer ``e``'s
        ``(batch, kv_heads, width, head_dim)`` each, row ``r`` holding ``counts[r]`` (the
        recall tier's union at a prompt's end); per head, as :meth:`_relayout_per_head`
        leaves them."""
        width = int(keys[0].shape[2])
        capacity = width + 1
        for e in range(self.layers):
            for store, given in ((self.keys, keys[e]), (self.values, values[e])):
                buffer = given.new_zeros((self.batch, self.heads, capacity, given.shape[-1]))
                buffer[:, :, :width] = given
                store[e] = buffer
        self.capacity = capacity
        self.rope = np.zeros((self.rows, capacity), dtype=np.int64)
        self.slots = np.zeros((self.rows, capacity), dtype=SLOT_DTYPE)
        self.slots[:, :width] = np.arange(width)[None, :]
        self.counts = np.asarray(counts, dtype=np.int64).copy()
        self.valid = np.ascontiguousarray(np.arange(capacity)[None, :] < self.counts[:, None])
        self.free = self.counts.copy()
        self.extent = width
        self.shared = False
        self.layer_extent = None
        self.aligned = False
        self.compactions += 1
        self._mask_stale = True

    def select(self, index: np.ndarray) -> None:
        """Sequences become ``index`` (old sequence numbers; beams, copies, subsets)."""
        grid = np.arange(self.rows).reshape(self.layers, self.batch, self.heads)
        rows = grid[:, index].reshape(-1)
        self.slots = np.ascontiguousarray(self.slots[rows])
        self.rope = np.ascontiguousarray(self.rope[rows])
        self.counts = self.counts[rows]
        self.free = self.free[rows]
        self.valid = np.ascontiguousarray(self.valid[rows])
        torch_index = torch.from_numpy(np.asarray(index, dtype=np.int64))
        for store in (self.keys, self.values):
            for e, old in enumerate(store):
                if old is not None:
                    store[e] = old.index_select(0, torch_index.to(old.device))
        self.batch = len(index)
        self._mask_stale = True

    def nbytes(self) -> int:
        """Bytes of the key and value buffers."""
        return sum(t.numel() * t.element_size() for store in (self.keys, self.values) for t in store
                   if t is not None)


class CompactStorage(SlotStorage):
    """:class:`SlotStorage` gathered back into kept order after every eviction."""

    compact_every_step = True


def make_storage(mode: str, layers: int, capacity: int, share_heads: bool = False) -> SlotStorage:
    """The storage of cache mode ``mode`` (``"reuse"`` or ``"compact"``); ``share_heads``:
    lay a layer's KV heads out in one buffer once positions were evicted (pools)."""
    if mode not in CACHE_MODES:
        raise InvalidInputError(f"cache_mode must be one of {', '.join(CACHE_MODES)}, got {mode!r}")
    return (SlotStorage if mode == "reuse" else CompactStorage)(layers, capacity, share_heads)
