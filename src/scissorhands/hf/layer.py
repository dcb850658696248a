"""One full-attention layer of an evicting cache (:class:`EvictingLayer`): its view of the
storage and its own part of the forward (write, mask, re-rotation, handing over its
weights); the cache's layers built from the model's layer types; which of a forward's
tokens are padding, read off transformers' mask."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from transformers.cache_utils import DYNAMIC_LAYER_TYPE_MAPPING, CacheLayerMixin, get_layer_types_and_kwargs

from ..errors import InvalidInputError
from . import attention
from .gqa import gather_group_mean
from .guards import _OUT_OF_SYNC, _layer_entry
from .positions import _rotate
from .rope import RankPlan
from .storage import NUMPY_FLOATS

if TYPE_CHECKING:
    from ._cache_state import CacheState
    from .flight import _Forward


class EvictingLayer(CacheLayerMixin):
    """One full-attention layer of an :class:`EvictingCache` (its ``index``-th evicting one,
    model layer ``layer``).

    Its keys and values are its view of the cache's storage (one buffer per layer; the
    slot layout is shared by every layer); what the installed attention asks of a layer
    (its mask, its keys re-rotated, handing over its weights) is done here, on the cache's
    forward in flight."""

    is_sliding = False
    is_compileable = False
    is_croppable = False

    def __init__(self, cache: CacheState, index: int, layer: int) -> None:
        super().__init__()
        self.cache = cache
        self.index = index
        self.layer = layer

    @property
    def keys(self) -> torch.Tensor | None:
        """The key buffer ``(batch, kv_heads, capacity, head_dim)``: slots, not kept order
        (:meth:`EvictingCache.kept_keys_values` gives kept order); under a shared budget
        once positions were evicted, a view of the one buffer the layer's KV heads share
        (each head's slots are its own columns of it)."""
        return self.cache.storage.layer_buffers(self.index)[0] if self.cache.storage.started() else None

    @keys.setter
    def keys(self, value: Any) -> None:
        if value is not None:
            raise InvalidInputError("an EvictingCache layer's keys are written by the model only")

    @property
    def values(self) -> torch.Tensor | None:
        return self.cache.storage.layer_buffers(self.index)[1] if self.cache.storage.started() else None

    @values.setter
    def values(self, value: Any) -> None:
        if value is not None:
            raise InvalidInputError("an EvictingCache layer's values are written by the model only")

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.is_initialized = True

    def _in_flight(self) -> _Forward:
        forward = self.cache._forward
        if forward is None:
            raise InvalidInputError(_OUT_OF_SYNC)
        return forward

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this forward's keys and values ``(batch, kv_heads, q, head_dim)`` where the
        storage planned them; return the held ones, ``[0, extent)`` of the buffers."""
        cache = self.cache
        if cache._observing:  # an attribute read on every layer's write; the call only when refused
            cache._unchanged_by_observers("update()")
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = time.perf_counter()
        forward = cache._begin(key_states) if self.index == 0 else self._in_flight()
        # The layer before handed over its attention before this one writes; when it did not
        # (the model's attention is no longer the library's), refused now, before the
        # forward's logits come back.
        if forward.written[self.index] or (self.index and not forward.observed[self.index - 1]):
            raise InvalidInputError(_OUT_OF_SYNC)
        forward.written[self.index] = True
        keys, values = cache.storage.write(self.index, key_states, value_states)
        cache.stats.update_seconds += time.perf_counter() - start
        setattr(keys, attention.LAYER_ATTRIBUTE, self)
        return keys, values

    def get_seq_length(self) -> int:
        return self.cache.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.cache._mask_sizes(query_length)

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.is_initialized = False

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:  # the cache moves every layer at once
        raise InvalidInputError("reorder an EvictingCache as a whole: cache.reorder_cache(beam_idx)")

    @_layer_entry
    def attention_mask(self, stock: Any, query: torch.Tensor, dtype: torch.dtype | None,
                       structured: bool = False) -> Any:
        """The mask this layer attends with (called by the installed attention): the one
        transformers built while the layout is still the one it expects, else the cache's
        own, additive in ``dtype`` (eager) or boolean (``dtype`` None, sdpa); with
        ``structured``, a chunk's as a :class:`~scissorhands.hf.storage.ChunkMask` where
        the storage gives one (float32 scores only)."""
        cache = self.cache
        forward = self._in_flight()
        kept = forward.masks  # a single token's, every layer's, once the first layer asked
        if kept is not None and kept[0] is dtype:
            # A list lookup, not timed (the two clock reads would cost more than it).
            return kept[1][self.index]
        if self.index != 0 and forward.q == 1 and cache.storage.aligned:
            return stock  # transformers' own, as the first layer found (not timed either)
        start = time.perf_counter()
        if self.index == 0:
            forward.pads = _pads_from(stock, int(query.shape[2]), int(query.shape[0]))
            if forward.window_rows and forward.pads is not None and forward.pads[:, -forward.window_rows:].any():
                forward.window_rows = 0  # padding among the last rows (right-padded): every row, as before
        storage = cache.storage
        mask: Any = None
        if structured and not storage.aligned and forward.q != 1:
            mask = storage.chunk_mask(self.index, forward.pads)
        if mask is None:
            mask = stock if storage.aligned else storage.mask(self.index, forward.pads, cache.groups,
                                                              int(query.shape[2]), dtype)
            every = storage.decode_masks(dtype) if forward.q == 1 and not storage.aligned else None
            if every is not None:
                forward.masks = (dtype, every)
        cache.stats.bookkeeping_seconds += time.perf_counter() - start
        return mask

    def window_rows(self) -> int:
        """How many of this forward's last query rows' weights the policies' step needs
        (0: every row; :meth:`EvictingCache._window_only`)."""
        forward = self.cache._forward
        return 0 if forward is None else forward.window_rows

    @_layer_entry
    def note_positions(self, query: torch.Tensor, kwargs: dict[str, Any]) -> None:
        """``positions="cache"``: at the forward's first evicting layer, remember the rotary
        position each new key was rotated with (``position_ids``, else the tokens seen)."""
        forward = self._in_flight()
        if self.index != 0 or forward.positions is not None:
            return
        cache = self.cache
        q = int(query.shape[2])
        positions = kwargs.get("position_ids")
        if positions is None:
            positions = torch.arange(cache.seen, cache.seen + q)[None]
        batch = cache.storage.batch
        positions = np.broadcast_to(np.asarray(positions.detach().cpu(), dtype=np.int64), (batch, q))
        per_row = np.broadcast_to(positions[None, :, None, :],
                                  (cache.evicting_layers, batch, cache.num_kv_heads, q)).reshape(-1, q)
        storage = cache.storage
        columns = storage.new_columns()
        rows = np.arange(storage.rows)[:, None]
        forward.rope = (columns, storage.rope[rows, columns].copy())
        storage.rope[rows, columns] = per_row
        forward.positions = positions

    @_layer_entry
    def rerotate(self, query: torch.Tensor, key: torch.Tensor,
                 kwargs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions="cache"``: the query and keys rotated to their ranks (called by the
        installed attention, once positions were evicted)."""
        cache = self.cache
        forward = self._in_flight()
        start = time.perf_counter()
        if forward.rotations is None:
            forward.rotations = cache._rotations(forward, query, key)
        if isinstance(forward.rotations, RankPlan):  # keys kept at their ranks: turn what moved
            query = forward.rotations.apply(self.index, cache.storage, query)
        else:
            cos, sin, cos_q, sin_q = forward.rotations
            key = _rotate(key, cos[self.index], sin[self.index])
            query = _rotate(query, cos_q, sin_q)
        cache.stats.rerotate_seconds += time.perf_counter() - start
        return query, key

    @_layer_entry
    def observe(self, weights: torch.Tensor | None) -> None:
        """This layer's attention weights ``(batch, heads, q, extent)`` of the forward
        (None when neither a policy of the cache nor an observer reads attention): handed
        to the observers, kept for the policies; after the last evicting layer, the
        cache's step."""
        cache = self.cache
        forward = self._in_flight()
        e = self.index
        if not forward.written[e]:
            raise InvalidInputError(_OUT_OF_SYNC)
        if weights is not None and cache._observers:
            cache._observing = True  # what an observer reads of the cache does not end the forward
            try:
                for observer in list(cache._observers):
                    observer(self.layer, weights.detach())
            finally:
                cache._observing = False
        # Timed as bookkeeping from here (the observers' time is theirs) to the step.
        start = time.perf_counter()
        if weights is not None and cache._policies_read and cache._decodes(forward):
            extent = cache.storage.extent
            if weights.shape[-1] < extent:  # a layer narrower than the widest (heads sharing a buffer)
                weights = torch.nn.functional.pad(weights, (0, extent - weights.shape[-1]))
            forward.pending.add(weights)  # a decode step's: all layers in one call at the last
        elif weights is not None and cache._policies_read:
            # Each chunk layer's rows are reduced to the policy heads and gathered into kept
            # order as the layer hands them in (one C pass, sh_gqa_gather), so that the
            # forward never holds every layer's full-head rows at once (30 layers x 9
            # heads x 256 x 1,280 float32 is 354 MB); per element the same arithmetic as
            # reducing them all together at the last layer, then gathering.
            if forward.window_rows and weights.shape[2] > forward.window_rows:  # every row came (eager): the last
                weights = weights[:, :, -forward.window_rows:]
            columns, held, gathered = cache._gather_target(forward)
            if weights.shape[2] != gathered.shape[1]:
                raise InvalidInputError(_OUT_OF_SYNC)
            per_layer = len(columns) // cache.evicting_layers
            part = slice(e * per_layer, (e + 1) * per_layer)
            first = forward.q - gathered.shape[1]  # the chunk's first row computed (0: every row)
            gather_group_mean(weights.detach().cpu(), cache.policy_heads, columns[part], held[part] + first,
                              gathered[part])
        forward.observed[e] = True
        cache.stats.bookkeeping_seconds += time.perf_counter() - start
        if e == cache.evicting_layers - 1:
            cache._finish(forward)


def _pads_from(stock: Any, q: int, batch: int) -> np.ndarray | None:
    """Which of the forward's ``q`` new tokens are padding, per sequence (``(batch, q)``
    bool), read off the mask transformers built: a padding token is masked even for
    itself (the diagonal of the new block). None when there is no padding."""
    if not isinstance(stock, torch.Tensor) or stock.dim() != 4:
        return None
    if q == 1 and stock.device.type == "cpu" and not stock.requires_grad and (
            stock.dtype is torch.bool or stock.dtype in NUMPY_FLOATS):
        # One token, read through NumPy's view of the mask (a few us a step less than
        # torch's small ops): the last column of the last row, per sequence.
        column = stock.numpy()[:, 0, -1, -1]
        padded = ~column if column.dtype == np.bool_ else column < 0
        return np.broadcast_to(padded, (batch,))[:, None].copy() if padded.any() else None
    if q == 1:  # one token: the last column of the last row, per sequence
        last = stock[:, 0, -1, -1]
        pad = ~last if last.dtype == torch.bool else last < 0
        if not bool(pad.any()):
            return None
        return pad.expand(batch).numpy()[:, None]
    block = stock[..., -q:]
    diagonal = block[:, 0, torch.arange(q), torch.arange(q)] if block.shape[-2] == q else block[:, 0, -1, -q:]
    masked = ~diagonal if diagonal.dtype == torch.bool else diagonal < 0
    pads = masked.expand(batch, q).cpu().numpy()
    return pads if pads.any() else None


def _build_layers(cache: CacheState, text: Any) -> tuple[list[Any], int]:
    """The cache's layers (evicting ones for full attention) and how many evict; refuses other kinds."""
    layer_types, per_layer_kwargs = get_layer_types_and_kwargs(text)
    layers: list[Any] = []
    evicting = 0
    for kind, kwargs in zip(layer_types, per_layer_kwargs):
        if kind == "full_attention":
            layers.append(EvictingLayer(cache, evicting, len(layers)))
            evicting += 1
        elif kind in ("sliding_attention", "chunked_attention"):
            layers.append(DYNAMIC_LAYER_TYPE_MAPPING[kind](**kwargs))
        else:
            raise InvalidInputError(f"an EvictingCache holds attention layers only, not {kind!r} layers")
    if not evicting:
        raise InvalidInputError("the model has no full-attention layer to evict from")
    return layers, evicting
