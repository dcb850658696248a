"""The prompt's end (``prompt_aware``): which chunks compute only their last query rows,
the prompt's last rows kept across chunks, the eviction to the budget at the first decode
step (or ``end_prompt()``), and the recall tier's part at a prompt's start and end
(:mod:`scissorhands.hf.recall`)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from .archive import archive_victims, held_positions
from .guards import _outside_graph
from .recall import recall, restore, restored_kept
from .storage.steps import _repeat_rows

if TYPE_CHECKING:
    from ._cache_state import CacheState


def _next_window(window: np.ndarray | None, weights: np.ndarray, admit: np.ndarray | None, held: np.ndarray,
                 victims: np.ndarray, slots: np.ndarray, size: int, q: int | None = None) -> np.ndarray:
    """``prompt_aware``: the rows of the last ``size`` held positions after a chunk.

    ``window``: the same before the chunk (None: no rows kept, a fresh prompt or a new
    turn after decode steps); ``weights``: the chunk's ``(rows, q, width)`` in
    ``extend``'s layout (a row's ``held`` positions, then chunk token ``j`` at column
    ``held + j``); ``admit``: ``(rows, q)`` or None; ``victims``/``slots``: the chunk's
    eviction (kept-order indices after admission, row after row).  Returns ``(rows,
    size, width')`` float32, ``width'`` the most positions a row holds after the
    eviction: row ``j`` of row ``r`` is the attention, over ``r``'s held positions in
    kept order, of the position at kept index ``count - size + j``; rows the cache does
    not have (a position read before the kept rows, or before the row held ``size``) are
    zero, columns past a row's count are zero.  ``q``: the chunk's tokens, when
    ``weights`` holds only its last rows (at least the last ``size`` admitted ones')."""
    rows, computed, _ = weights.shape
    q = computed if q is None else q
    first = q - computed  # chunk row t is weights' row t - first
    counts = held.astype(np.int64)
    admitted = np.full(rows, q, dtype=np.int64) if admit is None else admit.sum(axis=1).astype(np.int64)
    after = counts + admitted - victims
    out_width = int(after.max(initial=0))
    out = np.zeros((rows, size, out_width), dtype=np.float32)
    if admit is None and not victims.any():
        # No padding, no eviction: kept order is extend's layout, row by row, and each
        # row's last `size` rows end at its own count (the chunk's last token).
        if q >= size:
            out[:] = weights[:, q - size - first:, :out_width]
        else:
            out[:, size - q:] = weights[:, :, :out_width]
            if window is not None:  # the rows before the chunk, shifted up by q
                take = min(window.shape[2], out_width)
                out[:, : size - q, :take] = window[:, q:, :take]
        tail = np.arange(out_width)[None, None, :] >= after[:, None, None]
        out[np.broadcast_to(tail, out.shape)] = 0.0
        return out
    offsets = np.concatenate(([0], np.cumsum(victims)))
    for r in range(rows):
        n = int(counts[r])
        joined = np.arange(q) if admit is None else np.nonzero(admit[r])[0]
        m = n + len(joined)
        keep = np.ones(m, dtype=bool)
        keep[slots[offsets[r]:offsets[r + 1]]] = False
        survivors = np.nonzero(keep)[0]
        last = survivors[-size:]
        columns = np.concatenate((np.arange(n), n + joined))  # kept index -> extend's column
        block = np.zeros((len(last), m), dtype=np.float32)
        new = last >= n
        if new.any():
            computed_row = joined[last[new] - n] - first
            assert (computed_row >= 0).all(), "a window row of the chunk was not computed"
            block[new] = weights[r, computed_row][:, columns]
        old = (~new) & (last >= n - size)
        if window is not None and old.any():
            previous = window[r, last[old] - (n - size)]
            reach = min(n, previous.shape[1])
            block[np.nonzero(old)[0], :reach] = previous[:, :reach]
        out[r, size - len(last):, : len(survivors)] = block[:, survivors]
    return out


@_outside_graph
def end_prompt(cache: CacheState) -> None:
    """``prompt_aware``: end the prompt now, as the first decode step would (every row
    evicted to the budget by the observation-window rule), for a caller whose next
    forward is not a single token (lm-eval's scored continuation).  Nothing when no
    prompt awaits its end (or the cache is not prompt-aware).

    Raises
    ------
    InvalidInputError
        The policy refuses the window (the cache as it was).
    """
    cache._unchanged_by_observers("end_prompt()")
    cache._settle()
    cache._prompt_end()


def _prompt_end(cache: CacheState) -> None:
    """``prompt_aware``: when a prompt was read and the first decode step begins (no
    forward in flight), evict every row to the budget with the policy's
    ``evict_observed_rows`` over the prompt's last rows, and free the victims'
    slots; nothing otherwise.  Refused by the policy: the cache as it was, the
    window kept."""
    window = cache._window
    if window is None or cache._forward is not None or cache.bank is None or not cache.storage.started():
        return
    start = time.perf_counter()
    bank, storage = cache.bank, cache.storage
    archive = cache._archive
    if archive is not None and cache._queries is not None and cache._queries.ready() and archive.total():
        cache.stats.recalled += recall(cache)
        cache._window = None
        cache._queries.clear()
        cache.stats.prompt_ends += 1
        cache.stats.compactions = storage.compactions
        cache.stats.bookkeeping_seconds += time.perf_counter() - start
        return
    repeat = cache.num_kv_heads // cache.policy_heads
    before = None if archive is None else held_positions(bank.policies[0])
    t0 = time.perf_counter()
    victims, slots = bank.evict_observed(window, cache.prompt_aware.pool_kernel)
    policy_seconds = time.perf_counter() - t0
    cache._window = None
    if repeat > 1:
        victims, slots = _repeat_rows(victims, slots, repeat)
    if archive is not None and before is not None:  # nothing archived yet, or all of it restored
        none = [np.zeros(0, dtype=np.int64)] * storage.rows
        archive_victims(archive, storage, before, victims, slots, none, none)
        if cache._queries is not None:
            cache._queries.clear()
    storage.evict(victims, slots)
    if archive is not None and cache._restored is not None:
        cache.stats.recalled += restored_kept(cache)
    cache.stats.prompt_ends += 1
    cache.stats.compactions = storage.compactions
    cache.stats.policy_seconds += policy_seconds
    cache.stats.bookkeeping_seconds += time.perf_counter() - start - policy_seconds


def _prompt_start(cache: CacheState, q: int) -> None:
    """``archive``: a new prompt (``q`` tokens, the first forward after decode steps or
    a prompt's end) on a used cache reads over the archived positions too
    (:func:`~scissorhands.hf.recall.restore`); not part of the forward (a forward that
    fails keeps it, as it keeps a prompt's end)."""
    if cache._archive is None or cache._window is not None or cache._forward is not None:
        return
    if cache.bank is None or not cache.storage.started():
        return
    start = time.perf_counter()
    restore(cache, q)
    cache.stats.compactions = cache.storage.compactions
    cache.stats.bookkeeping_seconds += time.perf_counter() - start


def _window_only(cache: CacheState, q: int, fresh: bool) -> int:
    """``prompt_aware``: how many of a chunk's last query rows' weights are computed
    when it evicts nothing (every row's count plus ``q`` within ``prefill_budget``),
    nothing evicted before it (the model's own attention reads the prompt) and no
    observer reads the weights: ``min(q, observation_window)``, the only rows the
    prompt's end reads, the policies reading none of the chunk's (its positions join
    with a new position's state, ``extend(..., unread=True)``); 0 (every row, as
    before) otherwise."""
    aware = cache.prompt_aware
    if not aware.enabled or q < 2 or cache._observers or not cache._policies_read:
        return 0
    storage = cache.storage
    if not fresh and not storage.aligned:
        return 0
    held = 0 if fresh else int(storage.counts.max(initial=0))
    if held + q > aware.prefill_budget:
        return 0
    return min(q, aware.observation_window)
