"""What one forward owns (:class:`~scissorhands.hf.flight._Forward`: created at the first evicting layer's write,
dropped after the step or rolled back whole when the forward fails), its beginning (the
policy rows built at a cache's first forward, the tokens' slots planned), settling a
forward that did not finish, and its rollback (the cache as it was before it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from transformers.cache_utils import Cache

from ..errors import InvalidInputError
from .flight import _Forward
from .gqa import DecodeWeights
from .guards import _OUT_OF_SYNC, _outside_graph, _refuse_grad, _refuse_states
from .layer import EvictingLayer
from .rows import PolicyConfig, PolicyRows
from .shape import check_write

if TYPE_CHECKING:
    from ._cache_state import CacheState


def _restore_layer(layer: Any, state: tuple[Any, ...]) -> None:
    """Put one of transformers' own layers back as :meth:`EvictingCache.update` found it
    (its updates replace the tensors, never write into them)."""
    layer.keys, layer.values, length, layer.is_initialized = state
    if length is not None:
        layer.cumulative_length = length


def _start(cache: CacheState, batch: int) -> None:
    if cache.per_sequence and batch != len(cache.configs):
        raise InvalidInputError(f"the cache has one configuration per sequence ({len(cache.configs)}), "
                                f"the model wrote a batch of {batch}")
    configs: list[PolicyConfig] = []
    counts: list[int] = []
    for config, size in zip(cache.configs, [1] * batch if cache.per_sequence else [batch]):
        if configs and configs[-1] == config:  # consecutive equal configurations share rows
            counts[-1] += size
        else:
            configs.append(config)
            counts.append(size)
    cache.bank = PolicyRows(configs, counts, cache.evicting_layers, cache.policy_heads, cache._initial_pins)
    for policy in cache.bank.policies:  # the spans pinned after construction
        for start, stop in cache._pins:
            policy.pin(start, stop)
    cache.storage.start(batch, cache.num_kv_heads)


def _begin(cache: CacheState, key: torch.Tensor) -> _Forward:
    """The first evicting layer's write: the forward's state, its tokens' slots planned."""
    cache._settle()
    storage = cache.storage
    fresh = not storage.started()
    if key.shape[2] < 1:  # before anything changes
        raise InvalidInputError(f"the model wrote keys {tuple(key.shape)}: a forward needs at least one token")
    if fresh and (key.shape[0] < 1 or key.shape[1] != cache.num_kv_heads):
        raise InvalidInputError(
            f"the model wrote keys {tuple(key.shape)} to an empty cache built for {cache.num_kv_heads} KV heads: "
            + ("a forward needs at least one sequence" if key.shape[0] < 1 else
               f"{int(key.shape[1])} KV heads is not the configuration's (build the cache from the model "
               "that runs it)"))
    q = int(key.shape[2])
    if q == 1:
        cache._prompt_end()
    else:
        cache._prompt_start(q)
    plan = storage.plan_state(not fresh and storage.prepare(q))
    pending = cache._pending
    if pending is None or pending.size != cache.evicting_layers:
        pending = cache._pending = DecodeWeights(cache.evicting_layers)
    cache._forward = _Forward(cache.evicting_layers, q, fresh, plan, pending)
    try:
        if fresh:
            cache._start(int(key.shape[0]))
        cache._forward.window_rows = cache._window_only(q, fresh)
        storage.plan(q)
    except BaseException:
        cache._rollback()
        raise
    return cache._forward


def _settle(cache: CacheState) -> None:
    """Before a new forward (or a change of the batch): a forward that did not finish
    is undone.  When none of its layers handed over attention, the model does not run
    the library's attention: refused, the cache as it was before that forward."""
    forward = cache._forward
    if forward is None:
        return
    cache._rollback()
    if not any(forward.observed):
        raise InvalidInputError(_OUT_OF_SYNC)


def _rollback(cache: CacheState) -> None:
    """Undo the forward in flight, if any: the cache as it was before it (the policies
    act only at its end, so they are untouched; its keys and values sit in slots that
    are free again; transformers' own layers get their tensors back)."""
    forward = cache._forward
    cache._forward = None
    slid, cache._slid = cache._slid, {}
    if forward is None:
        return
    for index, state in slid.items():
        _restore_layer(cache.layers[index], state)
    if forward.fresh:
        cache.storage.clear()
        cache.bank = None
        for layer in cache.layers:
            if isinstance(layer, EvictingLayer):
                layer.reset()
        return
    storage = cache.storage
    if forward.rope is not None:
        columns, old = forward.rope
        storage.rope[np.arange(storage.rows)[:, None], columns] = old
    storage.unplan(forward.plan)


@_outside_graph
def update(cache: CacheState, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
           **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer ``layer_idx``'s new keys and values (transformers' call, every layer of every
    forward).  At layer 0 a forward that did not finish is undone first; transformers'
    own layers are remembered as they were, so that a forward failing before its step
    leaves every layer as it was."""
    if cache._observing:  # as in EvictingLayer.update: before layer 0's settling
        cache._unchanged_by_observers("update()")
    if type(layer_idx) is not int or not 0 <= layer_idx < len(cache.layers):
        layer_idx = cache._layer_index("layer_idx", layer_idx)
    if not (isinstance(key_states, torch.Tensor) and isinstance(value_states, torch.Tensor)
            and key_states.dim() == 4 and value_states.dim() == 4):
        _refuse_states(key_states, value_states)
    if key_states.requires_grad or value_states.requires_grad:
        _refuse_grad(cache, layer_idx)
    layer: Any = cache.layers[layer_idx]
    if isinstance(layer, EvictingLayer):
        check_write(cache, layer_idx, key_states, value_states)
    if layer_idx == 0:
        cache._settle()
        cache._slid = {}
    if not isinstance(layer, EvictingLayer):
        cache._slid.setdefault(layer_idx, (layer.keys, layer.values, getattr(layer, "cumulative_length", None),
                                          layer.is_initialized))
    try:
        # The stock update: every CacheState these modules serve is an EvictingCache, a Cache.
        return Cache.update(cast(Cache, cache), key_states, value_states, layer_idx, *args, **kwargs)
    except BaseException:
        cache._rollback()
        raise
