"""What the storage's modules (:mod:`.masks`, :mod:`.writes`, :mod:`.steps`,
:mod:`.layout`) read and call of the storage they serve: :class:`StorageState`, a
protocol that :class:`~scissorhands.hf.storage.SlotStorage` satisfies structurally, so
that those modules name it in their annotations without importing the storage back."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch

#: A single token's write index kept from step to step: the shape it was made for
#: (layers, batch, heads, capacity), its buffer, each row's base and per-layer views.
_WritePlan = tuple[tuple[int, int, int, int, tuple[int, ...]], np.ndarray, np.ndarray, tuple[torch.Tensor, ...]]


class StorageState(Protocol):
    """A slot storage as its modules use it (the attributes are documented where
    :class:`~scissorhands.hf.storage.SlotStorage` sets them)."""

    #: Evicting layers, sequences, KV heads per sequence.
    layers: int
    batch: int
    heads: int
    #: Slots per row of the slot table and buffers; the slots ``[0, extent)`` attended over.
    capacity: int
    extent: int
    #: Whether slot ``s`` of every row still holds padded position ``s`` (nothing evicted).
    aligned: bool
    #: Whether evictions lay a layer's KV heads out as one buffer (pools), and whether now.
    share_heads: bool
    shared: bool
    #: Each layer's extent while shared (int64 ``(layers,)``), else None.
    layer_extent: np.ndarray | None
    #: Per evicting layer, the key and value buffers (None before the first write).
    keys: list[torch.Tensor | None]
    values: list[torch.Tensor | None]
    #: Per row: the slot of each held position in kept order (int32 ``(rows, capacity)``).
    slots: np.ndarray[tuple[int, int], np.dtype[np.int32]]
    #: Per row: positions held, and the slot its next decode token goes to (int64 ``(rows,)``).
    counts: np.ndarray[tuple[int], np.dtype[np.int64]]
    free: np.ndarray[tuple[int], np.dtype[np.int64]]
    #: Per row and slot: held (or the token being written), bool ``(rows, capacity)``.
    valid: np.ndarray[tuple[int, int], np.dtype[Any]]
    #: Per row and slot: the rotary position its key was rotated with (int64 ``(rows, capacity)``).
    rope: np.ndarray[tuple[int, int], np.dtype[np.int64]]
    #: The forward in flight's tokens per row and, for a chunk, its first column.
    q: int
    chunk_start: int
    #: Compactions so far; whether every eviction compacts (``cache_mode="compact"``).
    compactions: int
    compact_every_step: bool
    #: Derived caches, rebuilt on demand (:data:`SlotStorage._DERIVED`).
    _write_index: tuple[torch.Tensor, ...]
    _write_plan: _WritePlan | None
    _masks: dict[torch.dtype | None, list[torch.Tensor | None]]
    _mask_store: torch.Tensor | None
    _mask_stale: bool
    _mask_changes: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
    _mask_views: tuple[list[int], list[torch.Tensor]] | None
    _views: list[tuple[Any, ...] | None]
    _flat: dict[tuple[int, bool], tuple[torch.Tensor, torch.Tensor]]
    _rows_cache: np.ndarray | None
    _count_range_of: tuple[np.ndarray, int, int] | None
    _free_extent: tuple[np.ndarray, int, int] | None
    _steady_ready: tuple[Any, ...] | None
    _spare_free: tuple[np.ndarray, Any] | None

    @property
    def rows(self) -> int: ...  # layers * batch * heads

    # The storage's own (its __init__.py).
    def most(self) -> int: ...
    def least(self) -> int: ...
    def single_extent(self) -> int: ...
    def valid4(self) -> np.ndarray: ...

    # masks.py
    def _note_valid(self, rows: np.ndarray, slots: np.ndarray, valid: bool) -> None: ...

    # writes.py
    def prepare(self, q: int) -> bool: ...
    def _plan_writes(self) -> None: ...
    def _shrink(self, capacity: int) -> None: ...
    def _heads_view(self, buffer: torch.Tensor) -> torch.Tensor: ...
    def new_columns(self) -> np.ndarray: ...

    # steps.py
    def c_array(self, name: str, dtype: Any) -> np.ndarray: ...
    def steady_layout(self) -> tuple[Any, ...] | None: ...
    def stepped_steady(self, freed: np.ndarray, freed_c: Any = None) -> None: ...
    def apply_steady(self, slots: np.ndarray) -> bool: ...
    def _row_index(self) -> np.ndarray: ...
    def _apply_one_each(self, slots: np.ndarray, new_slot: np.ndarray) -> None: ...
    def _apply_ragged(self, victims: np.ndarray, slots: np.ndarray, new_slot: np.ndarray) -> None: ...
    def _free_where(self, free: np.ndarray, needs: np.ndarray) -> np.ndarray: ...
    def _first_free(self) -> np.ndarray: ...
    def evict(self, victims: np.ndarray, slots: np.ndarray) -> None: ...
    def _apply_general(self, victims: np.ndarray, slots: np.ndarray, new: list[np.ndarray]) -> None: ...

    # layout.py
    def _grow(self, need: int) -> None: ...
    def _layer_widths(self) -> list[int]: ...
    def _grow_layers(self, need: np.ndarray) -> None: ...
    def _narrow_layers(self, widths: list[int]) -> None: ...
    def _layer_extent(self, e: int) -> int: ...
    def compact(self) -> None: ...
    def _relayout(self, index: np.ndarray, counts: np.ndarray) -> None: ...
    def _relayout_shared(self, index: np.ndarray, counts: np.ndarray) -> None: ...
    def _after_step(self) -> None: ...
    def _relayout_when_wide(self) -> None: ...
    def _relayout_per_head(self, index: np.ndarray, counts: np.ndarray) -> None: ...
