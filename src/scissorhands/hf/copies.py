"""Beams, copies, reset and serialisation of an evicting cache: sequences selected or
repeated with their policy rows, prompt window and archive (``reorder_cache``,
``batch_repeat_interleave``, ``batch_select_indices``), ``copy``/``deepcopy``/pickling
(observers and C views not copied), and ``reset``."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from .._native import ffi
from ..errors import InvalidInputError, InvalidTypeError
from .layer import EvictingLayer
from .stats import CacheStats

if TYPE_CHECKING:
    from ._cache_state import CacheState

#: A cache (what :func:`copy_of` copies, and returns the type of).
_Cache = TypeVar("_Cache", bound="CacheState")


def state_of(cache: CacheState) -> dict[str, Any]:
    state = cache.__dict__.copy()
    state["_observers"] = []
    state.pop("_observing", None)  # a copy made by an observer calls none
    state.pop("_fitted", None)
    state["_gathered"] = state["_pending"] = state["_steady_out"] = None
    return state


def set_state(cache: CacheState, state: dict[str, Any]) -> None:
    cache.__dict__.update(state)
    cache._gathered, cache._pending = None, None  # C views: made again
    cache._steady_out = (ffi.new("int *"), ffi.new("double *"))


def reset(cache: CacheState) -> None:
    """Forget everything: the cache is ready for a new prompt (of any batch size)."""
    cache._unchanged_by_observers("reset()")
    for layer in cache.layers:
        layer.reset()
    cache.storage.clear()
    cache.bank = None
    cache.seen = 0
    cache.stats = CacheStats()
    cache._forward = None
    cache._slid = {}
    cache._window = None
    cache._read_ids.clear()
    cache._restored = None
    if cache._archive is not None and cache._queries is not None:
        cache._archive.clear()
        cache._queries.clear()


def _select(cache: CacheState, index: Any, what: str, name: str = "indices", one_each: bool = False) -> None:
    """Sequences become ``index`` (old sequence numbers, ``name`` in ``what``'s
    arguments; with ``one_each``, one per sequence), checked before anything moves."""
    cache._unchanged_by_observers(f"{what}()")
    try:
        ndim = index.dim() if isinstance(index, torch.Tensor) else np.ndim(index)
    except ValueError:  # a ragged list
        ndim = -1
    if not isinstance(index, (torch.Tensor, np.ndarray, list, tuple, range)) or ndim != 1:
        raise InvalidTypeError(f"{what}: {name} must be a 1-D sequence of sequence indices, "
                               f"got {type(index).__name__} {index!r:.60}")
    cache._rollback()  # a forward that did not finish: undone first
    if not cache.storage.started():
        return
    if one_each and len(index) != cache.storage.batch:
        raise InvalidInputError(f"{what}: {name} has {len(index)} indices for {cache.storage.batch} sequences")
    if cache.per_sequence:
        raise InvalidInputError(f"{what}: a cache with one configuration per sequence cannot "
                                "reorder its batch")
    array = np.asarray(index.detach().cpu() if isinstance(index, torch.Tensor) else index)
    if array.ndim != 1 or array.dtype.kind not in "iu" or array.size == 0:
        raise InvalidInputError(f"{what}: the sequence indices must be a non-empty 1-D integer "
                                f"array, got {array.dtype} of shape {array.shape}")
    if array.min() < 0 or array.max() >= cache.storage.batch:
        raise InvalidInputError(f"{what}: sequence indices must be in [0, {cache.storage.batch}), "
                                f"got {array.min()}..{array.max()}")
    array = array.astype(np.int64)
    assert cache.bank is not None
    cache.bank.select(array)
    if cache._window is not None:  # the prompt's rows follow their sequences (layer-major rows)
        shape = (cache.evicting_layers, cache.storage.batch, cache.policy_heads, *cache._window.shape[1:])
        cache._window = np.ascontiguousarray(cache._window.reshape(shape)[:, array].reshape(-1, *shape[3:]))
    if cache._archive is not None and cache._queries is not None:  # the archive's rows follow too
        grid = np.arange(cache.evicting_layers * cache.storage.batch * cache.num_kv_heads).reshape(
            cache.evicting_layers, cache.storage.batch, cache.num_kv_heads)
        cache._archive.select(grid[:, array].reshape(-1))
        cache._queries.select(array)
    cache.storage.select(array)
    cache._read_ids.select(array)
    for layer in cache.layers:
        if not isinstance(layer, EvictingLayer):
            layer.batch_select_indices(torch.from_numpy(array))  # type: ignore[union-attr]


def reorder_cache(cache: CacheState, beam_idx: torch.LongTensor) -> None:
    """Beam search: sequence ``i`` becomes a copy of sequence ``beam_idx[i]`` (keys,
    values and policy rows); ``beam_idx`` holds one index per sequence."""
    cache._select(beam_idx, "reorder_cache", "beam_idx", one_each=True)


def batch_repeat_interleave(cache: CacheState, repeats: int) -> None:
    """Each sequence repeated ``repeats`` times in place (``[a, b]`` -> ``[a, a, b, b]``)."""
    if isinstance(repeats, bool) or not isinstance(repeats, (int, np.integer)) or repeats < 1:
        raise InvalidInputError(f"batch_repeat_interleave: repeats must be a positive integer, got {repeats!r}")
    cache._select(np.repeat(np.arange(cache.storage.batch), int(repeats)), "batch_repeat_interleave")


def batch_select_indices(cache: CacheState, indices: torch.Tensor) -> None:
    """Keep the sequences ``indices`` (in that order)."""
    cache._select(indices, "batch_select_indices")


def copy_of(cache: _Cache) -> _Cache:
    """``copy.copy``: an independent copy, as ``copy.deepcopy`` gives (the layers, the
    storage and the policies' state copied; observers not).  A shallow copy sharing
    the layers would advance the original while reporting its own length."""
    return copy.deepcopy(cache)
