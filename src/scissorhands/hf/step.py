"""The step that hands the policies their rows after a forward's last evicting layer: a
decode step's weights gathered for every layer in one C call (the steady step's gather,
policy and slot table in one), a chunk's (padding zeroed, the prompt's last rows carried
to the prompt's end), non-finite sequences contained, the victims archived and their
slots freed, the forward dropped and its times counted."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from .._native import ffi, lib
from ..errors import InvalidInputError
from .archive import archive_step, archive_victims, held_positions
from .gqa import gather_layers
from .guards import _OUT_OF_SYNC
from .prompt_end import _next_window
from .rows import PolicyRows
from .storage import SLOT_DTYPE
from .storage.steps import _repeat_rows

if TYPE_CHECKING:
    from ._cache_state import CacheState
    from .flight import _Forward


#: The library's own decode-step call of the policies (the steady step runs it in C).
_OWN_STEP = PolicyRows.step


def _without_padding(weights: np.ndarray, admit: np.ndarray, counts: np.ndarray, first: int = 0) -> np.ndarray:
    """A chunk's weights ``(rows, q, width)`` (``extend``'s layout: a row's ``counts`` held
    positions, then the chunk's tokens) with padding's entries zero: the rows of padding
    tokens and the columns of padding keys, which no policy reads (padding is never
    admitted, and attends and is attended with weight 0) but which hold whatever an inf
    or NaN in a padded token's embedding made of them."""
    rows, _, width = weights.shape  # the chunk's rows from ``first`` on (all of them when 0)
    q = admit.shape[1]
    token = np.arange(width)[None, :] - counts[:, None]  # the chunk token of each column, (rows, width)
    inside = (token >= 0) & (token < q)
    padding_key = np.zeros((rows, width), dtype=bool)
    padding_key[inside] = ~admit[np.nonzero(inside)[0], token[inside]]
    drop = padding_key[:, None, :] | ~admit[:, first:, None]
    return np.where(drop, np.float32(0.0), weights) if drop.any() else weights


def _decodes(cache: CacheState, forward: _Forward) -> bool:
    """Whether the forward is a decode step for the policies (one token after others,
    no padding); else a chunk (a prompt, even of one token)."""
    return forward.q == 1 and cache.seen != 0 and (forward.pads is None or not forward.pads.any())


def _decode_buffer(cache: CacheState, size: int) -> tuple[np.ndarray, Any]:
    """The flat float32 buffer (and its C view) a decode step's gathered weights go
    to, at least ``size`` long: the last step's while it is long enough (written by
    the gather, read only by this step's policies), else one a thirty-second longer."""
    gathered = cache._gathered
    if gathered is None or len(gathered[0]) < size:
        flat = np.empty(size + size // 32, dtype=np.float32)
        gathered = cache._gathered = (flat, ffi.from_buffer("float[]", flat))
    return gathered


def _decode_target(cache: CacheState, forward: _Forward) -> np.ndarray:
    """A decode step's ``(rows, 1, width)`` float32 array for every policy row's
    weights in kept order (width the largest count), a view of
    :meth:`_decode_buffer`."""
    rows, width = cache.evicting_layers * cache.storage.batch * cache.policy_heads, cache.storage.most()
    kept = cache._decode_buffer(rows * width)[0][: rows * width].reshape(rows, 1, width)
    forward.gathered = kept
    return kept


def _gather_target(cache: CacheState, forward: _Forward) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A chunk's physical columns per policy row in the policies' order, ``(rows,
    width)`` (each row's held slots in kept order, then the chunk's tokens, in
    ``extend``'s layout), the positions each row held before it, and the ``(rows, q,
    width)`` float32 array their weights go to; made at the first layer that hands
    weights in (a decode step's is :meth:`_decode_target`)."""
    if forward.gathered is None or forward.columns is None or forward.held is None:
        storage = cache.storage
        repeat = cache.num_kv_heads // cache.policy_heads
        fresh = cache.seen == 0
        columns = storage.chunk_columns((0 if fresh else storage.most()) + forward.q)[::repeat]
        held = np.zeros(len(columns), dtype=np.int64) if fresh else storage.counts[::repeat].copy()
        forward.columns, forward.held = columns, held
        # The rows computed: the chunk's last window_rows under prompt-aware reading, else all.
        forward.gathered = np.empty((len(columns), forward.window_rows or forward.q, columns.shape[1]),
                                    dtype=np.float32)
    return forward.columns, forward.held, forward.gathered


def _finish(cache: CacheState, forward: _Forward) -> None:
    """After the last evicting layer: hand every row's weights to the policies, free
    the victims' slots, drop the forward."""
    start = time.perf_counter()
    storage, bank = cache.storage, cache.bank
    assert bank is not None
    q = storage.q
    if not all(forward.observed):
        raise InvalidInputError(_OUT_OF_SYNC)
    rows = cache.evicting_layers * cache.storage.batch * cache.policy_heads
    if cache._decodes(forward) and forward.pending.tensors:
        # The steady state (every row holds the same count): gather, policy and slot
        # table in one C call; None when it is not that case (nothing changed).
        steady = cache._steady_step(forward)
        if steady is not None:
            cache.stats.steps += 1
            cache._finished(q, start, steady)
            return
    finite = False  # known finite (checked by the decode step's gather)
    if cache._policies_read and forward.pending.tensors:  # a decode step: every layer in one C call
        out = cache._decode_target(forward)
        # Each policy row's held slots in kept order: every repeat-th row of the slot table.
        finite = gather_layers(forward.pending.tensors, cache.policy_heads, storage.c_array("slots", SLOT_DTYPE),
                               cache.num_kv_heads // cache.policy_heads, out.shape[2], out)
    gathered = forward.gathered if cache._policies_read else None  # (rows, q, width), kept order
    repeat = cache.num_kv_heads // cache.policy_heads
    if cache._decodes(forward):
        policy_seconds = _step_decode(cache, gathered, finite, rows, repeat)
    else:
        policy_seconds = _step_chunk(cache, forward, gathered, rows, repeat, q)
    cache._finished(q, start, policy_seconds)


def _step_decode(cache: CacheState, gathered: np.ndarray | None, finite: bool, rows: int, repeat: int) -> float:
    """:func:`_finish` of a decode step off the steady path: the policies' step over the
    gathered weights (``finite``: known finite), the victims archived and their slots
    freed.  Returns the seconds spent in the policies."""
    storage, bank = cache.storage, cache.bank
    assert bank is not None
    weights = None if gathered is None else gathered.reshape(rows, -1)
    if weights is not None and not finite:
        weights = cache._contained(weights)
    before = None if cache._archive is None else held_positions(bank.policies[0])
    t0 = time.perf_counter()
    victims, slots = bank.step(cache.seen, weights)
    policy_seconds = time.perf_counter() - t0
    if before is not None and cache._archive is not None:
        new_slot = np.full(storage.rows, storage.chunk_start) if storage.aligned else storage.free
        archive_victims(cache._archive, storage, before, victims, slots, [np.array([cache.seen])] * storage.rows,
                        [new_slot[r:r + 1] for r in range(storage.rows)])
    if repeat > 1:
        victims, slots = _repeat_rows(victims, slots, repeat)
    # One victim in every row: the storage's steady path, else the general one.
    if len(slots) != storage.rows or not storage.apply_steady(slots):
        storage.apply_step(victims, slots)
    cache.stats.steps += 1
    return policy_seconds


def _step_chunk(cache: CacheState, forward: _Forward, gathered: np.ndarray | None, rows: int, repeat: int,
                q: int) -> float:
    """:func:`_finish` of a chunk (several tokens, or a prompt's one): padding's weights
    zeroed, the policies' ``extend`` (up to ``prefill_budget`` with ``prompt_aware``, the
    prompt's last rows carried), the victims archived and their slots freed.  Returns the
    seconds spent in the policies."""
    storage, bank = cache.storage, cache.bank
    assert bank is not None
    pads = forward.pads
    fresh = cache.seen == 0
    chunk_weights = gathered
    admit = None
    if pads is not None and pads.any():
        per_sequence = ~pads  # (batch, q)
        shape = (cache.evicting_layers, cache.storage.batch, cache.policy_heads, q)
        admit = np.broadcast_to(per_sequence[None, :, None, :], shape).reshape(rows, q)
        if chunk_weights is not None:
            chunk_weights = _without_padding(chunk_weights, admit, storage.counts[::repeat],
                                             q - chunk_weights.shape[1])
    if chunk_weights is not None:
        chunk_weights = cache._contained(chunk_weights)
    aware = cache.prompt_aware.enabled
    before = None if cache._archive is None or fresh else held_positions(bank.policies[0])
    t0 = time.perf_counter()
    if aware:  # the prompt is held up to its cap; its window's rows only: no policy reads them
        victims, slots = bank.extend(chunk_weights, admit, fresh, q, cap=cache.prompt_aware.prefill_budget,
                                     unread=forward.window_rows > 0)
    else:
        victims, slots = bank.extend(chunk_weights, admit, fresh, q)
    policy_seconds = time.perf_counter() - t0
    if aware:
        assert chunk_weights is not None and forward.held is not None
        cache._window = _next_window(cache._window, chunk_weights, admit, forward.held, victims, slots,
                                     cache.prompt_aware.observation_window, q)
    storage_admit = None if admit is None else np.repeat(admit, repeat, axis=0)
    if cache._archive is not None:
        cache._archive_chunk(before, victims, slots, admit, q)
    if repeat > 1:
        victims, slots = _repeat_rows(victims, slots, repeat)
    storage.apply_chunk(storage_admit, victims, slots)
    cache.stats.chunks += 1
    return policy_seconds


def _archive_chunk(cache: CacheState, before: tuple[np.ndarray, np.ndarray] | None, victims: np.ndarray,
                   slots: np.ndarray, admit: np.ndarray | None, q: int) -> None:
    """``archive``: a chunk's victims archived before their slots are freed."""
    assert cache._archive is not None
    storage = cache.storage
    if before is None:  # the first chunk: nothing was held before it
        before = (np.zeros(storage.rows, dtype=np.int64), np.zeros(0, dtype=np.int64))
    tokens = np.arange(q)
    joined = [tokens if admit is None else tokens[admit[r]] for r in range(storage.rows)]
    archive_victims(cache._archive, storage, before, victims, slots, [cache.seen + j for j in joined],
                    [storage.chunk_start + j for j in joined])


def _finished(cache: CacheState, q: int, start: float, policy_seconds: float) -> None:
    """The end of a forward's step: ``q`` tokens seen, the forward dropped, its times
    (from ``start``, ``policy_seconds`` of it in the policies) counted."""
    cache.stats.compactions = cache.storage.compactions
    forward = cache._forward
    cache._read_ids.commit(cache.seen, q, cache.storage.batch, None if forward is None else forward.pads)
    cache.seen += q
    if forward is not None:
        # A decode step's weights let go now, while what freeing them touches is still
        # in the caches the step just read them through: at the next forward's start
        # it is not (about 70 us a step at batch 1 with 2,048 held there, 30-50 here).
        forward.pending.start()
    cache._forward = None
    cache.stats.policy_seconds += policy_seconds
    cache.stats.bookkeeping_seconds += time.perf_counter() - start - policy_seconds


def _steady_step(cache: CacheState, forward: _Forward) -> float | None:
    """A decode step in the steady state, when the policies are one C policy of per-head
    rows reading attention and every row holds the same count: the gather, the
    policy's step and the slot table's in one C call (``sh_cache_step_steady``), with
    no Python between them (before the first eviction, the slot table's step is
    :meth:`SlotStorage.apply_step`'s); the same weights, victims and slots as the
    general path (the calls it makes, in order).  Returns the seconds spent in the policy, or None
    (nothing changed: the general path then runs, and raises what it raises) when it
    is not that case, a gathered weight is not finite or the policy refuses, or when
    :meth:`PolicyRows.step <scissorhands.hf.rows.PolicyRows.step>` is not the library's
    own."""
    storage = cache.storage
    # PolicyRows.step is where a decode step's weights reach the policies: replaced
    # (an experiment's budget, a test recording what the policies see), it is called.
    if cache.num_kv_heads != cache.policy_heads or cache.bank is None or type(cache.bank).step is not _OWN_STEP:
        return None
    layout = storage.steady_layout()
    if layout is not None:
        count, freed, slots_c, counts_c, free_c, valid_c, freed_c = layout
    else:  # before the first eviction: the gather and the policy's step in C, the slots here
        aligned = storage.aligned_layout()
        if aligned is None:
            return None
        count, slots_c, counts_c = aligned
        freed, free_c, valid_c, freed_c = None, ffi.NULL, ffi.NULL, ffi.NULL
    try:
        layers, addresses = forward.pending.layers()
    except ValueError:
        return None
    batch, heads, _, extent = layers[0].shape
    out_c = cache._decode_buffer(storage.rows * count)[1]
    stride, valid_stride = storage.slots.shape[1], storage.valid.shape[1]
    done, seconds = cache._steady_out

    def call(state: Any, pos: int, budget: int, victims: Any, victim_slots: Any, capacity: int,
             n_victims: Any) -> tuple[int, float]:
        lib.sh_cache_step_steady(addresses, len(layers), batch * cache.policy_heads, heads // cache.policy_heads,
                                 extent, slots_c, stride, count, counts_c, free_c, valid_c, valid_stride,
                                 out_c, state, pos, budget, victims, victim_slots, capacity, n_victims, freed_c,
                                 done, seconds)
        return done[0], seconds[0]

    got = cache.bank.step_with(cache.seen, call)
    if got is None:
        return None
    stepped, policy_seconds, victims, victim_slots, positions = got
    if stepped == 2:
        assert freed is not None
        if cache._archive is not None:  # one victim a row, its key and value still in the freed slot
            archive_step(cache._archive, storage, positions, freed)
        storage.stepped_steady(freed, freed_c)
    else:  # the policy stepped, the slot table did not (not one victim a row): the general path
        assert victims is not None and victim_slots is not None
        if cache._archive is not None and victim_slots.size:
            rows = np.repeat(np.arange(storage.rows), victims)
            index = victim_slots.astype(np.int64)
            admitted = index >= storage.counts[rows]  # the step's own token (kept index count)
            new_slot = np.full(storage.rows, storage.chunk_start) if storage.aligned else storage.free
            held = np.where(admitted, new_slot[rows],
                            storage.slots[rows, np.minimum(index, storage.slots.shape[1] - 1)])
            archive_step(cache._archive, storage, positions, held.astype(np.int64), victims)
        if freed is None and not victim_slots.size:  # before the first eviction, none now
            storage.stepped_aligned()
        else:
            storage.apply_step(victims, victim_slots)
    return policy_seconds


def _contained(cache: CacheState, weights: np.ndarray) -> np.ndarray:
    """The weights the policies get (rows layer-major, then sequence): as they are when
    finite (the policies refuse anything else).  A sequence whose weights are not
    finite (what an inf or NaN in a padded token's embedding spreads into the rest of
    its sequence: the stock cache gives that sequence non-finite logits and the others
    go on) hands its policies zero attention, so that the batch's other sequences go
    on; when no sequence's are finite (a broken model), the forward is refused."""
    if np.isfinite(weights.sum()):
        return weights
    view = weights.reshape(cache.evicting_layers, cache.storage.batch, -1)
    finite = np.isfinite(view).all(axis=(0, 2))
    if not finite.any():
        raise InvalidInputError(
            "the model's attention weights are not finite (NaN or inf) in any sequence of the batch: "
            "its outputs are not numbers (a NaN or inf weight or input?); the cache is as it was before "
            "this forward")
    view = view.copy()
    view[:, ~finite] = 0.0
    return view.reshape(weights.shape)
