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

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ...errors import InvalidInputError
from . import layout, masks, steps, writes
from ._state import StorageState, _WritePlan
from .arrays import NUMPY_FLOATS, SLOT_DTYPE
from .masks import ChunkMask, causal_triangle

__all__ = ["CACHE_MODES", "NUMPY_FLOATS", "SLOT_DTYPE", "ChunkMask", "CompactStorage", "SlotStorage", "causal_triangle",
           "make_storage"]

#: ``reuse``: a decode token takes the last victim's slot; ``compact``: gather every step.
CACHE_MODES = ("reuse", "compact")


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


    # Masks: masks.py.
    mask = masks.mask
    decode_masks = masks.decode_masks
    chunk_mask = masks.chunk_mask
    _decode_masks = masks._decode_masks
    _note_valid = masks._note_valid
    _layer_mask = masks._layer_mask

    # A forward's slots and its writes: writes.py.
    prepare = writes.prepare
    plan_state = writes.plan_state
    plan = writes.plan
    _plan_writes = writes._plan_writes
    unplan = writes.unplan
    _shrink = writes._shrink
    write = writes.write
    _heads_view = writes._heads_view
    layer_buffers = writes.layer_buffers
    new_columns = writes.new_columns
    ranks = writes.ranks

    # The policies' victims applied to the slot table: steps.py.
    chunk_columns = steps.chunk_columns
    c_array = steps.c_array
    steady_layout = steps.steady_layout
    aligned_layout = steps.aligned_layout
    stepped_aligned = steps.stepped_aligned
    stepped_steady = steps.stepped_steady
    apply_steady = steps.apply_steady
    _row_index = steps._row_index
    apply_step = steps.apply_step
    _apply_one_each = steps._apply_one_each
    _apply_ragged = steps._apply_ragged
    _free_where = steps._free_where
    _first_free = steps._first_free
    apply_chunk = steps.apply_chunk
    evict = steps.evict
    drop_tail = steps.drop_tail
    _apply_general = steps._apply_general

    # Growing, compacting and selecting rows: layout.py.
    _grow = layout._grow
    _layer_widths = layout._layer_widths
    _grow_layers = layout._grow_layers
    _narrow_layers = layout._narrow_layers
    _layer_extent = layout._layer_extent
    compact = layout.compact
    _relayout = layout._relayout
    _relayout_shared = layout._relayout_shared
    _after_step = layout._after_step
    _relayout_when_wide = layout._relayout_when_wide
    _relayout_per_head = layout._relayout_per_head
    load_rows = layout.load_rows
    select = layout.select
    nbytes = layout.nbytes


class CompactStorage(SlotStorage):
    """:class:`SlotStorage` gathered back into kept order after every eviction."""

    compact_every_step = True


def make_storage(mode: str, layers: int, capacity: int, share_heads: bool = False) -> SlotStorage:
    """The storage of cache mode ``mode`` (``"reuse"`` or ``"compact"``); ``share_heads``:
    lay a layer's KV heads out in one buffer once positions were evicted (pools)."""
    if mode not in CACHE_MODES:
        raise InvalidInputError(f"cache_mode must be one of {', '.join(CACHE_MODES)}, got {mode!r}")
    return (SlotStorage if mode == "reuse" else CompactStorage)(layers, capacity, share_heads)


if TYPE_CHECKING:  # what the storage's modules take: mypy checks that a storage is one
    _STATE: type[StorageState] = SlotStorage
