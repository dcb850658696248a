"""The policies' victims applied to a storage's slot table (:mod:`scissorhands.hf.storage`):
a decode step's (the steady step in C, one victim in every row; any other in C or
NumPy), a chunk's admission and eviction, a prompt's end, dropping a row's tail (a reused
prefix), and the C-contiguous arrays the C passes read and write; the victims of policy
rows repeated over the KV heads that follow them (``mean`` head mode)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..._native import check, ffi, lib
from ._state import StorageState
from .arrays import SLOT_DTYPE, _int32_p, _int64_p


def chunk_columns(storage: StorageState, width: int) -> np.ndarray:
    """``(rows, width)`` physical columns in ``extend``'s layout: a row's held slots,
    then chunk token ``j`` at column ``count + j``."""
    col = np.arange(width)[None, :]
    counts = storage.counts[:, None]
    chunk = storage.chunk_start + col - counts
    held = np.take_along_axis(storage.slots, np.minimum(col, storage.capacity - 1).repeat(storage.rows, 0), axis=1)
    out = np.where(col < counts, held, chunk)
    return np.clip(out, 0, storage.extent - 1)


def c_array(storage: StorageState, name: str, dtype: Any) -> np.ndarray:
    """The array ``name`` (``slots``, ``valid``, ``counts``, ``free``, ``rope``) as the C
    kernels read and write it in place: C-contiguous of ``dtype`` (the slot table's is
    :data:`SLOT_DTYPE`), made so first when it is not."""
    array = getattr(storage, name)
    if array.dtype != dtype or not array.flags.c_contiguous:
        array = np.ascontiguousarray(array, dtype=dtype)
        setattr(storage, name, array)
    return array


def steady_layout(storage: StorageState) -> tuple[Any, ...] | None:
    """When a single token's step can be the steady one (positions were evicted, every
    row holds the same count), what ``sh_slots_step_steady`` reads and writes: ``(count,
    freed, slots, counts, free, valid, freed_c)``, the count, the int64 ``freed`` array
    for the slots the step frees (the free slots before the last steady step, else a
    new one) and C views of the slot table, counts, free slots, validity and ``freed``
    (each made C-contiguous, the table int32, counts and free slots int64, first when
    not); else None."""
    if storage.aligned or storage.compact_every_step:
        return None
    ready = storage._steady_ready  # what was found ready last time, while the arrays are the same
    if (ready is None or ready[0] is not storage.slots or ready[1] is not storage.valid
            or ready[2] is not storage.counts or ready[3] is not storage.free):
        if not storage.rows:
            return None
        count = storage.least()
        if count != storage.most():
            return None
        slots, valid = storage.c_array("slots", SLOT_DTYPE), storage.c_array("valid", np.bool_)
        counts, free = storage.c_array("counts", np.int64), storage.c_array("free", np.int64)
        ready = storage._steady_ready = (slots, valid, counts, free, count, _int32_p(slots), _int64_p(counts),
                                      _int64_p(free), ffi.from_buffer("uint8_t[]", valid))
    # The array the last steady step freed its slots from (its free slots before it)
    # takes this step's: the free slots alternate between two arrays and their views.
    spare = storage._spare_free
    if spare is None or spare[0] is storage.free or len(spare[0]) != storage.rows:
        freed = np.empty(storage.rows, dtype=np.int64)
        spare = (freed, _int64_p(freed))
    storage._spare_free = None
    return ready[4], spare[0], ready[5], ready[6], ready[7], ready[8], spare[1]


def aligned_layout(storage: StorageState) -> tuple[int, Any, Any] | None:
    """While nothing was ever evicted and every row holds the same count (each row's
    slot table then counts its slots up from 0): that count and C views of the slot
    table and counts for a decode step's gather (``sh_cache_step_steady`` without the
    slot table's step, which :meth:`apply_step` then does); else None."""
    if not storage.aligned or not storage.rows:
        return None
    count = storage.least()
    if count != storage.most():
        return None
    return count, _int32_p(storage.c_array("slots", SLOT_DTYPE)), _int64_p(storage.c_array("counts", np.int64))


def stepped_aligned(storage: StorageState) -> None:
    """:meth:`apply_step` evicting nothing while aligned and every row holds the same
    count (what :meth:`aligned_layout` found): each row's token, at the last column of
    the extent, goes last in its kept order."""
    width = int(storage.counts[0]) + 1
    column = storage.extent - 1
    storage._grow(width)
    storage.valid[:, column] = True
    storage.slots[:, width - 1] = column
    storage.counts = storage.counts + 1
    storage._count_range_of = (storage.counts, width, width)  # every count one more
    storage.free = np.full(storage.rows, storage.extent, dtype=np.int64)


def stepped_steady(storage: StorageState, freed: np.ndarray, freed_c: Any = None) -> None:
    """After ``sh_slots_step_steady`` changed the slot table and validity in place:
    ``freed`` (each row's slot freed; ``freed_c`` its C view from
    :meth:`steady_layout`) is the next token's, the kept masks learn it."""
    if not storage._mask_stale:  # a copy: the array is written again two steps on
        storage._mask_changes.append((storage._row_index(), freed.copy(), np.zeros(storage.rows, dtype=bool)))
    ready = storage._steady_ready
    if ready is not None and ready[3] is storage.free:  # freed is as ready as the free slots were
        storage._steady_ready = (*ready[:3], freed, ready[4], ready[5], ready[6],
                              _int64_p(freed) if freed_c is None else freed_c, ready[8])
        # Nothing else keeps the free slots before this step (what reads them copies):
        # they are the next steady step's freed.
        storage._spare_free = (ready[3], ready[7])
    storage.free = freed
    # Every freed slot held a position, inside the extent: the next token's extent is this one.
    storage._free_extent = (freed, storage.extent, storage.extent)


def apply_steady(storage: StorageState, slots: np.ndarray) -> bool:
    """The steady state of :meth:`apply_step`, in one C pass (``sh_slots_step_steady``):
    every row held the same count, took its token at ``free`` and evicted exactly one
    kept index (``slots``, one per row). Returns False (nothing done) when that is not
    the case."""
    layout = storage.steady_layout() if len(slots) == storage.rows else None
    if layout is None:
        return False
    count, freed, slots_c, counts_c, free_c, valid_c, freed_c = layout
    index = slots if slots.dtype == np.int64 and slots.flags.c_contiguous else np.ascontiguousarray(
        slots, dtype=np.int64)
    # Each row's token into its kept order, its victim out of it (the later slots one
    # left) and its slot freed.
    rc = lib.sh_slots_step_steady(slots_c, storage.rows, storage.slots.shape[1], count, counts_c, free_c,
                                  _int64_p(index), valid_c, storage.valid.shape[1], freed_c)
    if rc == lib.SH_ERR_LENGTH:
        return False
    check(rc, "apply_steady")
    storage.stepped_steady(freed, freed_c)
    return True


def _row_index(storage: StorageState) -> np.ndarray:
    index = storage._rows_cache
    if index is None or len(index) != storage.rows:
        index = storage._rows_cache = np.arange(storage.rows)
    return index


def apply_step(storage: StorageState, victims: np.ndarray, slots: np.ndarray) -> None:
    """After a decode step: each row admitted its token (at ``free``, or appended
    while aligned) and evicted ``victims[row]`` positions whose kept-order indices
    (before the eviction, the new token last) are ``slots``, row after row."""
    if len(slots) == storage.rows and storage.apply_steady(slots):
        return
    rows = np.arange(storage.rows)
    n = storage.counts
    new_slot = np.full(storage.rows, storage.extent - 1, dtype=np.int64) if storage.aligned else storage.free.copy()
    if not victims.any():  # nothing evicted (below the budget): each row's token goes last
        width = storage.most() + 1
        storage._grow(width)
        storage.valid[rows, new_slot] = True
        storage.slots[rows, n] = new_slot
        least = storage.least()
        storage.counts = n + 1
        storage._count_range_of = (storage.counts, least + 1, width)  # every count one more
        storage.free = np.full(storage.rows, storage.extent, dtype=np.int64) if storage.aligned else \
            storage._free_where(np.zeros(storage.rows, dtype=np.int64), np.ones(storage.rows, dtype=bool))
        return
    if storage.aligned:  # (something is evicted from here on)
        storage._apply_general(victims, slots, [new_slot[r:r + 1] for r in rows.tolist()])
        return
    if (victims > 1).any():  # rows sharing a budget (pools): any number per row
        storage._apply_ragged(victims, slots, new_slot)
        return
    # No row evicted more than one: as many victims as rows is one in every row.
    if len(slots) == storage.rows:
        storage._apply_one_each(slots, new_slot)
        return
    # Some rows evicted one, the others none: the former drop their victim (the later
    # kept indices one left), the latter keep the token last.
    width = storage.most() + 1
    storage._grow(width)
    flat_valid = storage.valid
    flat_valid[rows, new_slot] = True
    storage.slots[rows, n] = new_slot  # the new token, last in kept order
    one = victims == 1
    layout = storage.slots[:, :width].copy()
    victim = np.zeros(storage.rows, dtype=np.int64)
    victim[one] = slots  # one slot per evicting row, in row order
    freed = layout[rows, victim].astype(np.int64)
    cols = np.arange(width - 1)[None, :]
    shifted = np.where(cols < victim[:, None], layout[:, :-1], layout[:, 1:])
    storage.slots[:, : width - 1] = np.where(one[:, None], shifted, layout[:, :-1])
    storage.slots[~one, width - 1] = layout[~one, width - 1]
    flat_valid[rows[one], freed[one]] = False
    storage._note_valid(rows[one], freed[one], False)
    storage.counts = n + 1 - victims
    storage.free = storage._free_where(freed, ~one)
    storage._after_step()


def _apply_one_each(storage: StorageState, slots: np.ndarray, new_slot: np.ndarray) -> None:
    """:meth:`apply_step` when every row evicted exactly one position (``slots``, its
    kept-order index, one per row) whatever it held, once positions were evicted: one
    C pass (``sh_slots_step_rows``) over the rows' own counts, where rows of several
    configurations or budgets (``eval``'s batch) hold different counts (the table is
    grown first to take every row's token)."""
    rows = storage._row_index()
    storage._grow(storage.most() + 1)
    storage.valid[rows, new_slot] = True
    table, valid = storage.c_array("slots", SLOT_DTYPE), storage.c_array("valid", np.bool_)
    counts, free = storage.c_array("counts", np.int64), np.ascontiguousarray(new_slot, dtype=np.int64)
    index = np.ascontiguousarray(slots, dtype=np.int64)
    freed = np.empty(storage.rows, dtype=np.int64)
    rc = lib.sh_slots_step_rows(_int32_p(table), storage.rows, table.shape[1], _int64_p(counts), _int64_p(free),
                                _int64_p(index), ffi.from_buffer("uint8_t[]", valid), valid.shape[1],
                                _int64_p(freed))
    check(rc, "apply_step")
    storage._note_valid(rows, freed, False)
    storage.free = freed  # the counts stay: one token in, one position out, every row
    storage._after_step()


def _apply_ragged(storage: StorageState, victims: np.ndarray, slots: np.ndarray, new_slot: np.ndarray) -> None:
    """:meth:`apply_step` for any number of victims per row (rows sharing a budget),
    without moving a key: each row's kept order drops its victims (its survivors to
    the front, in order: one C pass over the rows that evict, ``sh_slots_evict_rows``),
    their slots become holes, and the row's next token takes the slot of its first
    victim, or its lowest hole when it evicted none."""
    rows = storage._row_index()
    n = storage.counts
    width = int(n.max(initial=0)) + 1
    storage._grow(width)
    storage.valid[rows, new_slot] = True
    storage.slots[rows, n] = new_slot  # the new token, last in kept order
    table, valid = storage.c_array("slots", SLOT_DTYPE), storage.c_array("valid", np.bool_)
    held = np.ascontiguousarray(n + 1, dtype=np.int64)
    counts = np.ascontiguousarray(victims, dtype=np.int64)
    index = np.ascontiguousarray(slots, dtype=np.int64)
    freed = np.empty(len(index), dtype=np.int64)
    check(lib.sh_slots_evict_rows(_int32_p(table), storage.rows, table.shape[1], _int64_p(held), _int64_p(counts),
                                  _int64_p(index), len(index), ffi.from_buffer("uint8_t[]", valid),
                                  valid.shape[1], _int64_p(freed)), "apply_step")
    owner = np.repeat(rows, victims)
    storage._note_valid(owner, freed, False)
    storage.counts = n + 1 - victims
    evicted = victims > 0
    first = np.concatenate(([0], np.cumsum(victims)[:-1]))
    free = np.zeros(storage.rows, dtype=np.int64)
    free[evicted] = freed[first[evicted]]
    storage.free = storage._free_where(free, ~evicted) if not evicted.all() else free
    storage._after_step()


def _free_where(storage: StorageState, free: np.ndarray, needs: np.ndarray) -> np.ndarray:
    """``free`` (each row's next token's slot; a row's first victim's) with the rows
    ``needs`` (which freed none) given a slot: per head its lowest invalid slot, or
    the capacity when none is; laid out shared, the lowest columns that no KV head of
    its (layer, sequence) holds or was given, head after head."""
    if not storage.shared:
        free = free.copy()
        free[needs] = storage._first_free()[needs]
        return free
    heads = storage.heads
    taken = np.zeros((storage.rows // heads, storage.capacity + heads), dtype=bool)
    taken[:, : storage.capacity] = storage.valid.reshape(-1, heads, storage.capacity).any(axis=1)
    groups = np.arange(storage.rows) // heads
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


def _first_free(storage: StorageState) -> np.ndarray:
    """Each row's lowest invalid slot (the extent when none is)."""
    flat_valid = storage.valid
    first = np.argmin(flat_valid, axis=1)
    full = flat_valid[np.arange(storage.rows), first]
    return np.where(full, storage.capacity, first)


def apply_chunk(storage: StorageState, admit: np.ndarray | None, victims: np.ndarray, slots: np.ndarray) -> None:
    """After a chunk of ``q`` tokens at columns ``[chunk_start, chunk_start + q)``: each
    row admitted the tokens ``admit[row]`` allows, then evicted."""
    q = storage.q
    columns = np.arange(storage.chunk_start, storage.chunk_start + q)
    new = [columns if admit is None else columns[admit[r]] for r in range(storage.rows)]
    if not victims.any() and storage.aligned:
        # Still the layout transformers expects: every token in its column.
        for r in range(storage.rows):
            k = len(new[r])
            storage._grow(int(storage.counts[r]) + k)
            storage.slots[r, storage.counts[r]:storage.counts[r] + k] = new[r]
            storage.valid[r, new[r]] = True
        storage.counts = storage.counts + np.array([len(x) for x in new], dtype=np.int64)
        storage.free = np.full(storage.rows, storage.extent, dtype=np.int64)  # a new array: kept facts follow it
        storage._mask_stale = True
        return
    storage._apply_general(victims, slots, new)


def evict(storage: StorageState, victims: np.ndarray, slots: np.ndarray) -> None:
    """Between forwards: each row loses ``victims[row]`` held positions, whose
    kept-order indices are ``slots`` (row after row); their slots are freed and the
    layout compacted (nothing when no row loses any)."""
    if not victims.any():
        return
    empty = np.zeros(0, dtype=np.int64)
    storage._apply_general(victims, slots, [empty] * storage.rows)


def drop_tail(storage: StorageState, dropped: np.ndarray, extent: int) -> None:
    """Between forwards: each row forgets its last ``dropped[row]`` held positions in
    kept order (those at or after a prompt's common prefix with what was read), so
    that ``extent`` tokens count as seen.  While nothing was ever evicted the layout
    stays the one transformers expects (slot ``s`` position ``s``, ``[0, extent)``,
    the buffers narrowed to it and the next token's slot); else the rows lose them
    as an eviction's victims and are compacted."""
    if not storage.aligned:
        if not dropped.any():
            return
        starts = storage.counts - dropped
        within = np.arange(int(dropped.sum())) - np.repeat(np.cumsum(dropped) - dropped, dropped)
        storage.evict(dropped, np.repeat(starts, dropped) + within)
        return
    storage.counts = storage.counts - storage.valid[:, extent:].sum(axis=1)
    storage.valid[:, extent:] = False
    storage.free = np.full(storage.rows, extent, dtype=np.int64)
    storage.extent = extent
    storage._masks = {}
    if storage.capacity > extent + 1:
        storage._shrink(extent + 1)
    storage._mask_stale = True


def _apply_general(storage: StorageState, victims: np.ndarray, slots: np.ndarray, new: list[np.ndarray]) -> None:
    """Any admission and eviction, then a compaction into kept order."""
    offsets = np.concatenate(([0], np.cumsum(victims)))
    kept = []
    for r in range(storage.rows):
        combined = np.concatenate((storage.slots[r, : storage.counts[r]], new[r]))
        keep = np.ones(len(combined), dtype=bool)
        keep[slots[offsets[r]:offsets[r + 1]]] = False
        kept.append(combined[keep])
    counts = np.array([len(k) for k in kept], dtype=np.int64)
    width = int(counts.max(initial=0))
    index = np.zeros((storage.rows, max(width, 1)), dtype=np.int64)
    for r, k in enumerate(kept):
        index[r, : len(k)] = k
    storage.aligned = False
    storage._relayout(index, counts)


def _repeat_rows(victims: np.ndarray, slots: np.ndarray, repeat: int) -> tuple[np.ndarray, np.ndarray]:
    """Victims of policy rows applied to ``repeat`` storage rows each (``mean`` head mode)."""
    offsets = np.concatenate(([0], np.cumsum(victims)))
    parts = [slots[offsets[r]:offsets[r + 1]] for r in range(len(victims)) for _ in range(repeat)]
    return np.repeat(victims, repeat), (np.concatenate(parts) if parts else slots)
