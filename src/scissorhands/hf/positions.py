"""Positions in an evicting cache: the tokens seen (``get_seq_length``), the mask sizes
over the held slots (``get_mask_sizes``), and ``positions="cache"``'s rotations of each
forward (the plan of :mod:`scissorhands.hf.rope` for float32, else the turns from each
key's stored rotation to its rank, applied to copies)."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np
import torch
from transformers.cache_utils import Cache

from ..errors import InvalidInputError
from .guards import _outside_graph
from .rope import RankPlan, rank_plan, rank_rotatable, turns

if TYPE_CHECKING:
    from ._cache_state import CacheState
    from .flight import _Forward


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary rotation by the angles of ``cos``/``sin`` (in ``x``'s dtype) of the first
    ``cos.shape[-1]`` dimensions (the rotate-half layout transformers' models use; the
    rest pass)."""
    width = cos.shape[-1]
    rot, rest = x[..., :width], x[..., width:]
    half = width // 2
    turned = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
    out = torch.addcmul(rot * cos, turned, sin)
    return torch.cat((out, rest), dim=-1) if rest.shape[-1] else out


def _mask_sizes(cache: CacheState, q: int) -> tuple[int, int]:
    storage = cache.storage
    if not storage.started() or storage.aligned:
        return cache.seen + q, 0
    if q == 1:
        extent = storage.single_extent()
    else:
        extent = storage.extent + q
    return extent, cache.seen + q - extent


def _rotations(cache: CacheState, forward: _Forward, query: torch.Tensor,
               key: torch.Tensor) -> RankPlan | tuple[torch.Tensor, ...]:
    """``positions="cache"``: the forward's rotations.  For float32 keys and queries a
    :class:`~scissorhands.hf.rope.RankPlan` (the keys kept at their ranks, only those
    whose rank changed turned in place); else every layer's keys ``(layers, batch,
    kv_heads, extent, width)`` and the query ``(batch, 1, q, width)`` (cos and sin
    each), from the stored rotations to the ranks, applied to copies."""
    storage = cache.storage
    q = int(query.shape[2])
    layers, batch, heads = cache.evicting_layers, storage.batch, cache.num_kv_heads
    admitted = None
    if forward.pads is not None:
        admitted = np.broadcast_to((~forward.pads)[None, :, None, :], (layers, batch, heads, q)).reshape(-1, q)
    assert forward.positions is not None
    inv_freq = getattr(cache.rotary, cache._rope_freq, None)
    if isinstance(inv_freq, torch.Tensor) and rank_rotatable(query, key):
        return rank_plan(storage, admitted, forward.positions, inv_freq.detach().cpu().double().numpy(),
                         cache.groups, int(key.shape[-1]))
    if not isinstance(inv_freq, torch.Tensor):
        raise InvalidInputError("positions='cache' turns keys with the model's rotary embedding: build the cache "
                                "with EvictingCache.from_model(model, ...)")
    rank, new_rank = storage.ranks(admitted)
    delta_keys = rank - storage.rope[:, : storage.extent]  # (rows, extent)
    delta_query = new_rank[: batch * heads: heads] - forward.positions  # (batch, q)
    # The rotary embedding of each angle in the deltas' range once (a few hundred to a
    # few thousand), then gathered: the same values as embedding every slot's (each
    # angle is one product of a frequency and a position), without sorting the deltas.
    deltas = np.concatenate((delta_keys.reshape(-1), delta_query.reshape(-1)))
    low = int(deltas.min())
    cos_d, sin_d = turns(inv_freq, torch.arange(low, int(deltas.max()) + 1, device=query.device), query.dtype)
    index = torch.from_numpy(deltas - low)
    cos_all, sin_all = cos_d[0].index_select(0, index), sin_d[0].index_select(0, index)
    width = cos_all.shape[-1]
    keys_end = delta_keys.size
    shape = (layers, batch, heads, storage.extent, width)
    cos, sin = cos_all[:keys_end].reshape(shape), sin_all[:keys_end].reshape(shape)
    cos_q = cos_all[keys_end:].reshape(batch, 1, q, width)
    sin_q = sin_all[keys_end:].reshape(batch, 1, q, width)
    return cos, sin, cos_q, sin_q


@_outside_graph
def get_seq_length(cache: CacheState, layer_idx: int = 0) -> int:
    """Tokens seen so far (padding included): the true position of the next token.

    transformers asks before every forward's layers run: a forward that did not
    finish is undone here (or, when none of its layers handed over attention,
    refused), so that every layer's mask is sized for the cache as it was before it."""
    if type(layer_idx) is not int or not 0 <= layer_idx < len(cache.layers):
        cache._layer_index("layer_idx", layer_idx)
    if not cache._observing:  # an observer's call, mid-forward: the position before it
        cache._settle()
    return cache.seen


@_outside_graph
def get_mask_sizes(cache: CacheState, query_length: int, layer_idx: int) -> tuple[int, int]:
    """The mask's key length and offset for layer ``layer_idx`` (transformers' call,
    before the layers run; a forward that did not finish is undone first).  With
    ``prompt_aware``, a single token after a prompt is the first decode step: the
    prompt's end evicts here, so that the sizes are those the step attends over."""
    if type(layer_idx) is not int or not 0 <= layer_idx < len(cache.layers):
        layer_idx = cache._layer_index("layer_idx", layer_idx)
    if not cache._observing:  # an observer's call, mid-forward, changes nothing
        cache._settle()
        if query_length == 1:
            cache._prompt_end()
        else:
            cache._prompt_start(query_length)
    return Cache.get_mask_sizes(cast(Cache, cache), query_length, layer_idx)  # an EvictingCache, a Cache
