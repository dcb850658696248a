"""The transformers cache whose layers keep only the positions their policies hold.

:class:`EvictingCache` is a transformers ``Cache`` that ``model.generate`` (or a plain
``model(...)`` forward) drives like any other; :meth:`EvictingCache.from_model` also
installs what the model needs so that the cache sees each new query row's attention
(:mod:`scissorhands.hf.attention`).  Per forward:

1. transformers asks the cache for the tokens seen (``get_seq_length``: the true
   position of the next token, so positions need no help from the caller) and the mask
   sizes (the held slots);
2. every full-attention layer writes its new keys and values into the cache
   (:mod:`scissorhands.hf.storage`) and attends over the held ones, with the cache's own
   mask per (sequence, KV head) once positions have been evicted;
3. the attention weights of the new query rows reach the cache; after the last layer,
   one call per configuration (one for a plain cache) hands every row's weights to the
   policies (the GQA mean over each KV head's query heads, without the token's weight
   on itself, not renormalised): ``step_rows`` for one token, ``extend`` then
   ``evict_rows`` for several (a prompt, a new turn); the victims' slots are freed.

What one forward owns (which layers wrote and handed over their weights, the weights
gathered, which new tokens are padding, the rotary positions and rotations of
``positions="cache"``) is one object, created at the first evicting layer's write and
dropped after the step or by ``reset()``; observers (:meth:`EvictingCache.add_observer`)
see every layer's weights as they come.

Keys keep their original rotary rotation and the model its true positions (as H2O
does), unless ``positions="cache"``.  Padding is never admitted: a left-padded sequence's rows hold fewer positions.
Sliding-window layers (Gemma-2's every other layer) are transformers' own, already
bounded, and not evicted.

Scissorhands: Liu et al., NeurIPS 2023, arXiv 2305.17118.  H2O: Zhang et al., NeurIPS
2023, arXiv 2306.14048.  TOVA: Oren et al., 2024, arXiv 2401.06104.  StreamingLLM: Xiao
et al., ICLR 2024, arXiv 2309.17453.
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers.cache_utils import DYNAMIC_LAYER_TYPE_MAPPING, Cache, CacheLayerMixin, get_layer_types_and_kwargs

from .._native import ffi, lib
from .._shared import check_int, partial_repr
from ..errors import InvalidInputError, InvalidTypeError
from ..options import PolicyOptions, expand_preset, policy_spec, preset
from ..prompt_aware import DEFAULT_OBSERVATION_WINDOW, DEFAULT_POOL_KERNEL, DEFAULT_PREFILL_BUDGET, PromptAware
from . import attention
from . import prefix as _prefix
from .gqa import DecodeWeights, gather_group_mean, gather_layers
from .recall import (
    Archive,
    WindowQueries,
    archive_step,
    archive_victims,
    check_archive,
    held_positions,
    recall,
    restore,
    restored_kept,
)
from .rope import RankPlan, rank_plan, rank_rotatable, rotary_frequencies, turns
from .rows import PolicyConfig, PolicyRows, check_pools
from .shape import ModelShape, check_write, shape_of
from .storage import CACHE_MODES, NUMPY_FLOATS, SLOT_DTYPE, make_storage

__all__ = ["HEAD_MODES", "POSITION_MODES", "AttentionObserver", "CacheStats", "EvictingCache", "EvictingLayer",
           "ObserverHandle"]

#: ``per-head``: one policy row per KV head; ``mean``: one row per layer, fed the mean
#: over all its query heads, whose decisions every KV head follows.
HEAD_MODES = ("per-head", "mean")
#: ``original``: keys keep their rotary rotation and tokens their true positions (as H2O
#: does); ``cache``: per row the held keys sit at ranks 0..n-1 in position order and the
#: query at rank n (StreamingLLM, Xiao et al., ICLR 2024, §3.2), so no distance exceeds
#: the budget, past the trained context too.
POSITION_MODES = ("original", "cache")

#: ``fn(layer, weights)``: see :meth:`EvictingCache.add_observer`.
AttentionObserver = Callable[[int, torch.Tensor], Any]

_OUT_OF_SYNC = (
    "the cache received keys and values whose attention never reached it: the model does not "
    "run the library's attention (build the cache with EvictingCache.from_model(model, ...), "
    "which installs it), a forward was interrupted, or keys and values were handed to "
    "update() by hand; that forward was undone (the cache is as it was before it), so the "
    "next forward runs as if it had not happened"
)


@dataclass
class CacheStats:
    """Where a cache's time went, in seconds, and how often it acted.

    ``policy_seconds``: the policy calls (a steady decode step's measured inside its one
    C call, ``sh_cache_step_steady``, where for plain Scissorhands votes it includes
    gathering each row's weights and stepping its slot table row, done row by row in the
    policy's pass); ``bookkeeping_seconds``: the cache's own work
    around them (each layer's hand-over of its attention weights, GQA mean, gathering
    weights into kept order, masks, freeing slots, compactions; not, from a decode
    step's second layer on, handing over the mask its first layer built or
    transformers' own); ``rows_seconds``: computing the attention rows that the wrapped
    implementation does not return (``sdpa``); ``update_seconds``: planning the
    forward's slots and writing keys and values; ``rerotate_seconds``: moving keys and queries to their ranks
    (``positions="cache"``).  ``steps``: single-token forwards; ``chunks``: several-token forwards;
    ``compactions``: rebuilt layouts; ``prompt_ends``: prompt-end evictions
    (``prompt_aware``: the first decode step after a prompt), their time in
    ``policy_seconds`` and ``bookkeeping_seconds``; ``recalled``: archived positions
    held after a prompt's end (``archive``: brought back when the prompt began, or chosen
    over held ones at its end)."""

    policy_seconds: float = 0.0
    bookkeeping_seconds: float = 0.0
    rows_seconds: float = 0.0
    update_seconds: float = 0.0
    rerotate_seconds: float = 0.0
    steps: int = 0
    chunks: int = 0
    compactions: int = 0
    prompt_ends: int = 0
    recalled: int = 0


#: The library's own decode-step call of the policies (the steady step runs it in C).
_OWN_STEP = PolicyRows.step


def _always_dynamo() -> object:
    return True


#: The frame callback dynamo installs while compiled code runs or is traced (None
#: outside); without the function (another torch), every call takes the disabled form.
_dynamo_callback: Callable[[], object] = getattr(getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None),
                                                 "get_eval_frame_callback", _always_dynamo)
_tracing = torch.compiler.is_compiling


def _outside_graph(method: Callable[..., Any]) -> Callable[..., Any]:
    """One of the cache's entry points (transformers' calls, the installed attention's),
    run as plain Python under ``torch.compile``: the bookkeeping (NumPy, the policies' C
    calls) stays out of the traced graph, which breaks around it (transformers'
    ``DynamicCache`` is traced; this cache is not, and says so with ``is_compileable =
    False``, so ``generate`` never compiles for it on its own).  Outside dynamo (no frame
    callback installed: no compiled code running or being traced) the method is called
    directly, since ``torch.compiler.disable``'s wrapper costs a decode step about 2 us on
    each of its 90-odd calls, where asking whether dynamo traces and for the callback
    costs a tenth of that."""
    disabled: Callable[..., Any] = torch.compiler.disable(method)

    @functools.wraps(method)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not _tracing() and _dynamo_callback() is None:  # dynamo, tracing, reads the first as True
            return method(*args, **kwargs)
        return disabled(*args, **kwargs)

    return run


def _layer_entry(method: Callable[..., Any]) -> Callable[..., Any]:
    """A layer's step of the forward (called by the installed attention), outside the
    graph as :func:`_outside_graph` says, that undoes the forward first when it raises:
    one wrapper, so that each of a decode step's 90-odd such calls pays one frame."""

    def undone(self: EvictingLayer, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except BaseException:
            self.cache._rollback()
            raise

    disabled: Callable[..., Any] = torch.compiler.disable(undone)

    @functools.wraps(method)
    def run(self: EvictingLayer, *args: Any, **kwargs: Any) -> Any:
        if not _tracing() and _dynamo_callback() is None:  # as in _outside_graph
            try:
                return method(self, *args, **kwargs)
            except BaseException:
                self.cache._rollback()
                raise
        return disabled(self, *args, **kwargs)

    return run


class _Forward:
    """What one forward owns, from its first evicting layer's write to the policies' step.

    Created by :meth:`EvictingCache._begin` (the first evicting layer's write) and dropped
    by :meth:`EvictingCache._finish` (after the step) or :meth:`EvictingCache._rollback`
    (a failed or interrupted forward, ``reset()``): nowhere else.  ``q``: its tokens per
    sequence; per evicting layer, whether it was ``written`` and ``observed``;
    ``gathered``: every policy row's weights, reduced to the policy heads and in kept
    order as the layers handed them in; ``pads``: which new tokens are padding
    (``(batch, q)`` bool, None without padding); ``positions="cache"``: the rotary
    ``positions`` of the new keys (``(batch, q)`` int64) and the ``rotations`` to the
    ranks, computed once at the first layer that needs them."""

    __slots__ = ("columns", "fresh", "gathered", "held", "masks", "observed", "pads", "pending", "plan", "positions",
                 "q", "rope", "rotations", "window_rows", "written")

    def __init__(
        self, layers: int, q: int, fresh: bool, plan: tuple[Any, ...], pending: DecodeWeights
    ) -> None:
        self.q = q
        #: What undoes it (:meth:`EvictingCache._rollback`): whether the cache held nothing
        #: before it, the storage's plan before it, the rotary positions it overwrote.
        self.fresh = fresh
        self.plan = plan
        self.rope: tuple[np.ndarray, np.ndarray] | None = None
        self.written = [False] * layers
        self.observed = [False] * layers
        self.pads: np.ndarray | None = None
        #: A single token's masks once positions were evicted: ``(dtype, every layer's)``.
        self.masks: tuple[torch.dtype | None, list[Any]] | None = None
        self.positions: np.ndarray | None = None
        self.rotations: RankPlan | tuple[torch.Tensor, ...] | None = None
        #: Every policy row's weights in kept order, ``(rows, q, width)`` float32, filled
        #: layer by layer as the layers hand theirs in, and the columns they come from.
        self.gathered: np.ndarray | None = None
        self.columns: np.ndarray | None = None
        self.held: np.ndarray | None = None
        #: A decode step's weights, layer by layer, gathered together after the last (the
        #: cache's reusable collector, started at each forward).
        self.pending = pending
        pending.start()
        #: ``prompt_aware``, a chunk that evicts nothing: only its last ``window_rows``
        #: query rows' weights are computed (the prompt's end reads no others) and the
        #: policies read none (:meth:`EvictingCache._window_only`); 0 otherwise.
        self.window_rows = 0


class ObserverHandle:
    """What :meth:`EvictingCache.add_observer` returns: :meth:`remove` detaches the observer."""

    def __init__(self, observers: list[Any], fn: Any) -> None:
        self._observers = observers
        self._fn = fn

    def remove(self) -> None:
        """Stop calling the observer (nothing if already removed)."""
        if self._fn in self._observers:
            self._observers.remove(self._fn)


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

    def __init__(self, cache: EvictingCache, index: int, layer: int) -> None:
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


def _refuse_states(keys: Any, values: Any) -> None:
    """Refuse keys or values handed to :meth:`EvictingCache.update` that are not 4-D
    tensors, naming what was passed (:class:`InvalidTypeError`, :class:`InvalidInputError`)."""
    for name, states in (("key_states", keys), ("value_states", values)):
        if not isinstance(states, torch.Tensor):
            raise InvalidTypeError(f"update: {name} must be a torch.Tensor (batch, kv_heads, q, head_dim), "
                                   f"got {type(states).__name__}")
        if states.dim() != 4:
            raise InvalidInputError(f"update: {name} must be 4-D (batch, kv_heads, q, head_dim), "
                                    f"got shape {tuple(states.shape)}")


def _refuse_grad(cache: EvictingCache, layer_idx: int) -> None:
    """Refuse keys or values that require grad (a forward with gradients on and trainable
    projections): the cache stores detached copies, so the key/value path would drop out
    of autograd with no error.  The forward in flight is undone first."""
    if layer_idx:
        cache._rollback()
    raise InvalidInputError(
        "an EvictingCache holds keys and values outside autograd (its buffers are written in place and "
        "evicted from), so gradients through them would be silently wrong: run the forward under "
        "torch.no_grad() or torch.inference_mode() (as generate does); for gradients through the "
        f"attention use transformers' DynamicCache (layer {layer_idx}'s keys or values require grad; "
        "nothing changed)")


def _check_modes(positions: str, head_mode: str, cache_mode: str) -> None:
    """Refuse an unknown positions, head or cache mode (:class:`InvalidInputError`)."""
    if positions not in POSITION_MODES:
        raise InvalidInputError(f"positions must be one of {', '.join(POSITION_MODES)}, got {positions!r}")
    if head_mode not in HEAD_MODES:
        raise InvalidInputError(f"head_mode must be one of {', '.join(HEAD_MODES)}, got {head_mode!r}")
    if cache_mode not in CACHE_MODES:
        raise InvalidInputError(f"cache_mode must be one of {', '.join(CACHE_MODES)}, got {cache_mode!r}")


def _policy_configs(policy: str, budget: int | None, options: PolicyOptions | None, backend: str,
                    positions: str, configs: Sequence[PolicyConfig] | None,
                    option_values: Mapping[str, Any]) -> tuple[list[PolicyConfig], bool]:
    """The checked policy configurations (one per sequence, or one for all) and whether per sequence."""
    if configs is not None:
        if options is not None or option_values:
            raise InvalidInputError("give either configs or a policy with its options, not both")
        configs = list(configs)
        if not configs or not all(isinstance(c, PolicyConfig) for c in configs):
            raise InvalidTypeError("configs must be a non-empty sequence of PolicyConfig")
        per_sequence = True
    else:
        if options is not None and not isinstance(options, PolicyOptions):
            raise InvalidTypeError(f"options must be a PolicyOptions, not {type(options).__name__}")
        try:
            options = (options or PolicyOptions()).replace(**option_values)
        except TypeError:
            known = ", ".join(f.name for f in PolicyOptions.__dataclass_fields__.values())
            raise InvalidTypeError(f"unknown option among {sorted(option_values)}; options are {known}") from None
        configs = [PolicyConfig(policy, budget, options, backend)]
        per_sequence = False
    for c in configs:
        c.check()
        if positions == "cache" and c.pooled:
            raise InvalidInputError("positions='cache' gives each sequence one query rank, which rows of a "
                                    "shared budget (pool) do not have: use positions='original' with pool")
    return configs, per_sequence


def _spans(pins: Any) -> list[tuple[int, int]]:
    """``pins`` as a list of ``(start, stop)`` pairs (each checked by the policies)."""
    if isinstance(pins, (str, bytes)) or not hasattr(pins, "__iter__"):
        raise InvalidTypeError(f"pins must be a sequence of (start, stop) pairs, got {pins!r}")
    out = []
    for span in pins:
        if isinstance(span, (str, bytes)) or not hasattr(span, "__len__") or len(span) != 2:
            raise InvalidTypeError(f"each pinned span must be a (start, stop) pair, got {span!r}")
        out.append((span[0], span[1]))
    return out


def _checked_pins(configs: Sequence[PolicyConfig], held: list[tuple[int, int]],
                  new: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The spans ``held`` plus ``new``, merged, checked by a one-row policy of every
    configuration (as its rows will pin them); raises what ``pin`` refuses."""
    if not new:
        return list(held)
    merged: list[tuple[int, int]] = list(held)
    for config in configs:
        one = config if not config.pooled else \
            PolicyConfig(config.policy, config.budget, config.options.replace(pool=1), config.backend)
        if not held:  # the constructor's spans: a fractional recent window shares what they leave
            probe = one.build(1, {"layer": 1, "model": 1}, new)
        else:  # spans pinned later: the window as the rows resolved it
            probe = one.build(1, {"layer": 1, "model": 1}, held)
            for start, stop in new:
                probe.pin(start, stop)
        merged = [(int(a), int(b)) for a, b in probe.pins]
    return merged


def _check_pins_leave_room(spans: list[tuple[int, int]], settings: PromptAware,
                           configs: Sequence[PolicyConfig]) -> None:
    """``prompt_aware``: the pinned positions, the sinks and the observation window are
    all protected at the prompt's end; refuse spans that leave nothing to evict there."""
    if not settings.enabled or not spans:
        return
    config = configs[0]
    assert config.budget is not None
    resolved = policy_spec(config.policy).check(config.budget, config.options.values(config.policy, config.budget))
    sinks = int(resolved.get("sinks", 0))
    pinned = sum(max(0, stop - max(start, sinks)) for start, stop in spans)
    if pinned + settings.observation_window + sinks >= config.budget:
        raise InvalidInputError(
            f"pins leave nothing to evict at the prompt's end: {pinned} pinned + observation_window "
            f"{settings.observation_window} + sinks {sinks} >= budget {config.budget}")


def _prompt_settings(enabled: Any, prefill_budget: int | None, observation_window: int | None,
                     pool_kernel: int | None) -> PromptAware:
    """The prompt-aware settings of the cache's keywords (None: the default); a setting
    given without ``prompt_aware=True`` is refused rather than silently unused."""
    values = {"prefill_budget": prefill_budget, "observation_window": observation_window, "pool_kernel": pool_kernel}
    given: dict[str, int] = {name: value for name, value in values.items() if value is not None}
    if enabled is not True and given:
        raise InvalidInputError(f"{', '.join(f'{n}={v!r}' for n, v in given.items())} applies only with "
                                f"prompt_aware=True (got prompt_aware={enabled!r})")
    return PromptAware(enabled, given.get("prefill_budget", DEFAULT_PREFILL_BUDGET),
                       given.get("observation_window", DEFAULT_OBSERVATION_WINDOW),
                       given.get("pool_kernel", DEFAULT_POOL_KERNEL))


def _check_prompt_aware(settings: PromptAware, configs: Sequence[PolicyConfig], per_sequence: bool) -> PromptAware:
    """The prompt-aware settings checked against the cache's one configuration
    (:meth:`~scissorhands.prompt_aware.PromptAware.check`); refused with one
    configuration per sequence."""
    config = configs[0]
    if settings.enabled is True and per_sequence:
        raise InvalidInputError("prompt_aware takes one policy configuration, not configs= (one per sequence)")
    return settings.check(config.policy, config.budget, config.options)


class EvictingCache(Cache):
    """A transformers cache that keeps, per (sequence, layer, KV head), only the
    positions an eviction policy holds.

    Use :meth:`from_model`, which also installs the attention the cache needs::

        cache = EvictingCache.from_model(model, "scissorhands", budget=256, recent_window=0.75, sinks=4)
        out = model.generate(**inputs, cache=cache, max_new_tokens=200)

    Parameters
    ----------
    config : transformers.PretrainedConfig
        The model's configuration (layers, layer types, query and KV heads).
    policy : str, default "scissorhands"
        A registry name: ``full``, ``streaming-llm``, ``h2o``, ``tova``, ``scissorhands``;
        or a preset (:data:`scissorhands.options.PRESETS`): ``"recommended"`` is
        Scissorhands with ``recent_window=0.75, sinks=4, prompt_aware=True``, any of which
        a keyword given beside it overrides.
    budget : int or None, default 512
        Positions each (sequence, layer, KV head) holds after every step; above the
        recent window plus the sinks, so at least 33 with the default recent window of
        32 (``DefaultRefusedError``, an ``InvalidInputError``, says so and how to pass
        a smaller one, such as ``recent_window=0.75``).  ``full`` never evicts: it
        takes None, or an integer checked as the others check theirs (>= 1).
    options : PolicyOptions, optional
        The policy's options; or give them as keywords (``recent_window=0.75``, ...).
    head_mode : {"per-head", "mean"}, default "per-head"
    cache_mode : {"reuse", "compact"}, default "reuse"
        How the keys and values are laid out (:mod:`scissorhands.hf.storage`); both keep
        the same positions.
    backend : {"native", "reference"}, default "native"
    positions : {"original", "cache"}, default "original"
        ``original``: keys keep their rotary rotation, tokens their true positions;
        ``cache``: per row the held keys at ranks 0..n-1 and the query at n (see Notes).
    configs : sequence of PolicyConfig, optional
        One configuration per sequence of the batch instead (``eval`` runs every
        configuration as one batch); excludes ``policy``/``budget``/``options``.
    prompt_aware : bool or None, default None
        (None: False, or the preset's.) Hold the prompt and decide at its end (see Notes): H2O, TOVA and Scissorhands
        only (StreamingLLM reads no attention, Full never evicts), not with pooled
        budgets nor ``configs``.
    prefill_budget : int, default 4096
        ``prompt_aware``: positions each (sequence, layer, KV head) may hold while a
        prompt is read, at least ``budget``; each chunk evicts to it by the policy's
        own rule (memory is bounded by it, not by the prompt).
    observation_window : int, default 16
        ``prompt_aware``: the prompt's last rows whose attention scores the held
        positions at its end; with the policy's sinks below ``budget``.
    pool_kernel : int, default 15
        ``prompt_aware``: the max-pooling kernel over held positions (odd, >= 1; 1: no
        pooling).  Defaults measured in ``docs/prompt-aware-research.md``.  These three
        are refused without ``prompt_aware=True`` (rather than silently unused).
    pins : sequence of (start, stop), default ()
        Spans of positions no row ever evicts (a system prompt; :meth:`pin`), checked
        by the policies' ``pin`` at construction.
    prefix : {"reuse", "refuse"}, default "reuse"
        A prompt that does not continue the token ids the cache has read: reuse the
        longest common prefix, dropping what is held from the first difference on, or
        refuse it, nothing changed (:meth:`reuse_prefix`).
    archive : {None, "float32", "int8"}, default None
        The recall tier (:mod:`scissorhands.hf.recall`): what the policies evict is
        archived (host memory, never attended) and, at every prompt's end, the window
        scores held and archived positions together, so that a later turn's question
        can bring back what an earlier prompt's end dropped.  Needs
        ``prompt_aware=True``, ``positions="original"``, ``head_mode="per-head"``,
        one unpooled configuration of H2O, TOVA or Scissorhands.  Its bytes:
        :meth:`archive_bytes` (not in :meth:`memory_bytes`, which is what attention reads).

    Raises
    ------
    InvalidInputError, InvalidTypeError
        Before anything is built: a ``config`` that is not a transformers model config,
        an unknown policy, head or cache mode, a budget or option the policy refuses, a
        model without a full-attention layer or with layers the cache cannot hold.

    Notes
    -----
    ``get_seq_length()`` is the number of tokens seen (padding included), so
    transformers derives each token's true position itself; ``get_mask_sizes`` reports
    the held slots.  ``reorder_cache`` (beam search), ``batch_repeat_interleave`` and
    ``batch_select_indices`` move the policy rows with the keys and values;
    ``copy.deepcopy`` gives an independent cache; ``reset()`` makes it ready for a new
    prompt.

    A forward that raises leaves the cache as it was before it: at once when the
    exception comes from the cache's own work (a policy refusing non-finite attention,
    an observer), else when transformers next asks for the length or the mask sizes, at
    the next write, ``reset`` or change of the batch (reads in between show what was
    held before it).  A sequence whose attention is not finite while others' are
    (an inf or NaN in a padded token's embedding spreads through its sequence) hands
    its policies zero attention and the batch goes on, as the stock cache's does;
    attention finite in no sequence is refused.

    ``crop`` (other than ``crop(0)``) and ``early_initialization`` raise: an evicted
    position is gone.

    ``prompt_aware`` (SnapKV's observation window, Li et al., 2024, arXiv 2404.14469):
    a *prompt* is every forward of more than one token (the first forward too, and a
    new turn after decode steps); its chunks evict to ``prefill_budget`` instead of the
    budget.  The cache keeps the GQA-reduced attention (as the policies get it) of the
    last ``observation_window`` held positions' rows, over each row's held positions in
    kept order, across chunk boundaries (a last chunk shorter than the window takes
    rows of the chunks before; padding is never a row; a position whose row the cache
    no longer has, such as a decode token before a new turn, gives a zero row).  When
    the first decode step begins (a forward of one token: at its ``get_mask_sizes``, or
    its first write, before its attention is computed), every row evicts to the budget
    by the policy's ``evict_observed_rows`` (the window's summed attention, max-pooled
    over ``pool_kernel`` held positions; the sinks and the window's own positions
    protected) and the victims' slots are freed; decoding then goes on by the policy's
    own rule (``stats.prompt_ends`` counts these evictions).  A prompt never followed
    by a decode step stays as read.  A chunked prefill whose last chunk is a single
    token reads that token as the first decode step.  Beams, ``batch_select_indices``
    and ``batch_repeat_interleave`` move the window with their sequences;
    ``copy.deepcopy`` copies it, ``reset()`` forgets it.  A first decode step that fails
    after its mask was sized keeps the prompt-end eviction (it is not part of the
    forward) and undoes only the step.

    ``positions="cache"`` (needs :meth:`from_model`, which finds the model's rotary
    embedding) puts, once positions were evicted, each held key at its rank and the
    query at the rank after them, in the installed attention (``stats.rerotate_seconds``).
    Float32 keys are kept rotated at their ranks (plus one offset per row, which the
    logits do not see) and only those whose rank changed turn, in place
    (:mod:`scissorhands.hf.rope`: after a one-victim step, the keys before the victim,
    none of the recent window); other dtypes are turned from their stored rotation each
    step, on copies.  Either way the attention logits equal those of keys rotated at
    their ranks from scratch to float32 rounding (about 1e-6 relative).
    """

    def __init__(self, config: Any, policy: str = "scissorhands", budget: int | None = 512,
                 options: PolicyOptions | None = None, *, head_mode: str = "per-head",
                 cache_mode: str = "reuse", backend: str = "native", positions: str = "original",
                 configs: Sequence[PolicyConfig] | None = None, prompt_aware: bool | None = None,
                 prefill_budget: int | None = None, observation_window: int | None = None,
                 pool_kernel: int | None = None, pins: Sequence[tuple[int, int]] = (), prefix: str = "reuse",
                 archive: str | None = None, **option_values: Any) -> None:
        _check_modes(positions, head_mode, cache_mode)
        #: What a prompt that does not continue what the cache read does (:meth:`reuse_prefix`).
        self.prefix = _prefix.check_mode(prefix)
        #: The preset the policy was named by (``"recommended"``), or None.
        self.preset = preset(policy) if configs is None else None
        policy, options, option_values, prompt_aware = expand_preset(policy, options, option_values, prompt_aware)
        configs, self.per_sequence = _policy_configs(policy, budget, options, backend, positions, configs,
                                                     option_values)
        self.prompt_aware = _check_prompt_aware(
            _prompt_settings(prompt_aware, prefill_budget, observation_window, pool_kernel), configs,
            self.per_sequence)
        #: ``archive``: what the policies evict is kept here and recalled at a prompt's end.
        self.archive = check_archive(archive, prompt_aware=self.prompt_aware.enabled, positions=positions,
                                     head_mode=head_mode, configs=configs, per_sequence=self.per_sequence)
        #: The pinned spans every policy row gets, merged (:meth:`pin`).
        self._pins: list[tuple[int, int]] = _checked_pins(configs, [], _spans(pins))
        #: The spans given to the constructor: every row's policy is built with them.
        self._initial_pins = list(self._pins)
        _check_pins_leave_room(self._pins, self.prompt_aware, configs)
        # The options first (the command line checks them with no model yet), then the model.
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        if not isinstance(getattr(text, "num_attention_heads", None), int):
            raise InvalidTypeError(f"EvictingCache needs the model's transformers config (model.config), not "
                                   f"{type(config).__name__}; EvictingCache.from_model(model, ...) passes it")
        self.num_heads = int(text.num_attention_heads)
        self.num_kv_heads = int(getattr(text, "num_key_value_heads", None) or self.num_heads)
        if self.num_heads % self.num_kv_heads:
            raise InvalidInputError(f"{self.num_heads} query heads do not split into {self.num_kv_heads} KV heads")
        self.groups = self.num_heads // self.num_kv_heads
        layers, evicting = self._build_layers(text)
        super().__init__(layers=layers)
        #: The model's shape the cache is laid out for (:mod:`scissorhands.hf.shape`).
        self.shape: ModelShape = shape_of(text)
        self.configs = configs
        #: Whether any policy reads attention (else the cache gathers no weights).
        self._policies_read = any(c.reads_attention for c in configs)
        self.positions = positions
        self.rotary: Any = None  # the model's rotary embedding (positions="cache"; from_model)
        self.head_mode = head_mode
        self.cache_mode = cache_mode
        self.evicting_layers = evicting
        self.policy_heads = self.num_kv_heads if head_mode == "per-head" else 1
        check_pools(configs, evicting, self.policy_heads)
        budgets = [c.budget for c in configs if c.evicts and c.budget is not None]
        # Pools let a layer's KV heads hold different counts: they share one buffer a layer.
        share = self.policy_heads > 1 and any(c.pooled for c in configs)
        self.storage = make_storage(cache_mode, evicting, (max(budgets) + 1) if budgets else 64, share)
        self.bank: PolicyRows | None = None
        self.seen = 0
        self.stats = CacheStats()
        #: The forward in flight (None between forwards): what it owns, dropped whole.
        self._forward: _Forward | None = None
        #: transformers' own layers (sliding windows) as they were before this forward
        #: wrote to them: model layer index -> (keys, values, tokens seen, initialized).
        self._slid: dict[int, tuple[Any, ...]] = {}
        self._observers: list[AttentionObserver] = []
        #: Where a decode step's gathered weights go (flat float32, and its C view), kept
        #: from step to step and grown only when the rows' count outgrows it.
        self._gathered: tuple[np.ndarray, Any] | None = None
        #: What collects a forward's weights layer by layer (reused from forward to forward).
        self._pending: DecodeWeights | None = None
        #: The steady step's outputs (how far it went, the policy's seconds).
        self._steady_out = (ffi.new("int *"), ffi.new("double *"))
        #: ``prompt_aware``: the attention of the last held positions' rows, ``(rows,
        #: observation_window, width)`` float32 over each policy row's held positions in
        #: kept order (row ``j`` is kept index ``count - window + j``; zeros where the
        #: cache has no row), kept from the prompt's chunks until the first decode step
        #: consumes it; None otherwise.
        self._window: np.ndarray | None = None
        #: The token ids read, per sequence (:mod:`scissorhands.hf.prefix`).
        self._read_ids = _prefix.TokenIds()
        #: ``archive``: the evicted keys and values, and the prompt's last query rows per layer.
        self._archive = None if self.archive is None else Archive(self.archive)
        #: Per row, the positions :func:`~scissorhands.hf.recall.restore` brought back at this prompt's start.
        self._restored: list[np.ndarray] | None = None
        self._queries = (None if self.archive is None else
                         WindowQueries(evicting, self.prompt_aware.observation_window))

    def _build_layers(self, text: Any) -> tuple[list[Any], int]:
        """The cache's layers (evicting ones for full attention) and how many evict; refuses other kinds."""
        layer_types, per_layer_kwargs = get_layer_types_and_kwargs(text)
        layers: list[Any] = []
        evicting = 0
        for kind, kwargs in zip(layer_types, per_layer_kwargs):
            if kind == "full_attention":
                layers.append(EvictingLayer(self, evicting, len(layers)))
                evicting += 1
            elif kind in ("sliding_attention", "chunked_attention"):
                layers.append(DYNAMIC_LAYER_TYPE_MAPPING[kind](**kwargs))
            else:
                raise InvalidInputError(f"an EvictingCache holds attention layers only, not {kind!r} layers")
        if not evicting:
            raise InvalidInputError("the model has no full-attention layer to evict from")
        return layers, evicting

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_model(cls, model: Any, policy: str = "scissorhands", budget: int | None = 512,
                   options: PolicyOptions | None = None, **kwargs: Any) -> EvictingCache:
        """Build a cache for ``model`` and install the library's attention in it (see
        :mod:`scissorhands.hf.attention`: an implementation registered with transformers,
        wrapping the model's ``sdpa`` or ``eager`` one and selected with
        ``model.set_attn_implementation``).  Under ``eager`` it costs nothing beyond the
        model's own attention.  Under ``sdpa`` it costs one matmul and a softmax per layer
        beside sdpa until the first eviction (``stats.rows_seconds``), then computes the
        attention itself, eager's arithmetic per KV head's group of query heads, whose
        weights come with the output (about sdpa's cost at one query row on a CPU;
        measured in ``docs/longctx.md``).  Undo it with
        ``model.set_attn_implementation("sdpa")`` or :func:`scissorhands.hf.uninstall`.

        The parameters are the constructor's; the cache is checked before the model is
        touched.

        Raises
        ------
        InvalidInputError
            What the constructor refuses; with ``positions="cache"``, a model without a
            rotary embedding, or whose rotary type is not one of
            :data:`scissorhands.hf.rope.EXACT_ROPE_TYPES` (``dynamic``, ``longrope``:
            their frequencies change with the length, so keys cannot be turned exactly).
        """
        if not hasattr(getattr(model, "config", None), "get_text_config"):
            raise InvalidTypeError(f"from_model needs a transformers model (one with a .config), "
                                   f"got {type(model).__name__}")
        cache = cls(model.config, policy, budget, options, **kwargs)
        if cache.positions == "cache":
            cache.rotary = next((m for name, m in model.named_modules() if name.endswith("rotary_emb")), None)
            if cache.rotary is None:
                raise InvalidInputError(f"positions='cache' needs a rotary embedding; {type(model).__name__} has none")
            cache._rope_freq = rotary_frequencies(cache.rotary)
        attention.install(model)
        _prefix.install(model)
        return cache

    # ------------------------------------------------------------------ pinned spans

    @property
    def pins(self) -> list[tuple[int, int]]:
        """The pinned spans ``(start, stop)`` (half-open, merged, ascending) every row
        of every configuration holds pinned."""
        return list(self._pins)

    def pin(self, start: int, stop: int) -> None:
        """Pin positions ``start <= p < stop`` in every (sequence, layer, KV head) row:
        no eviction takes them (the policies' ``pin``; a span may lie ahead of what was
        read, and an evicted position does not come back).  Positions count as
        :meth:`kept_positions` does (a padded sequence's padded positions).  The spans
        stay through ``reset()`` and are copied with the cache.

        Raises
        ------
        InvalidTypeError, InvalidInputError
            What the policy's ``pin`` refuses (a bad span; pins that leave nothing to
            evict: pinned plus recent window plus sinks reaching the budget), checked
            before anything changes; or the call comes from an observer mid-forward.
        """
        self._unchanged_by_observers("pin()")
        spans = _checked_pins(self.configs, self._pins, [(start, stop)])
        _check_pins_leave_room(spans, self.prompt_aware, self.configs)
        if self.bank is not None:
            for policy in self.bank.policies:
                policy.pin(start, stop)
        self._pins = spans

    # ------------------------------------------------------------------ observers

    @property
    def reads_attention(self) -> bool:
        """Whether the installed attention must hand this cache each evicting layer's
        weights: a policy reads them, or an observer is attached (under ``sdpa`` the rows
        are then computed beside it, in ``stats.rows_seconds``)."""
        return self._policies_read or bool(self._observers)

    @property
    def observed_layers(self) -> list[int]:
        """The model layer indices an observer is called with (the full-attention layers),
        in the order it is called within a forward."""
        return [layer.layer for layer in self.layers if isinstance(layer, EvictingLayer)]

    #: Whether an observer is being called (its reads of the cache leave the forward be).
    _observing = False

    def _unchanged_by_observers(self, what: str) -> None:
        """Refuse ``what`` (a call that changes the cache) while an observer is being called."""
        if self._observing:
            raise InvalidInputError(
                f"{what} was called by an attention observer mid-forward: an observer must not change the "
                "cache (the forward is undone: the cache is as it was before it)")

    def add_observer(self, fn: AttentionObserver) -> ObserverHandle:
        """Call ``fn(layer, weights)`` with every evicting layer's attention, every forward.

        ``layer`` is the model's layer index (one of :attr:`observed_layers`); ``weights``
        is the new query rows' attention over the cache's slots, a detached tensor
        ``(batch, heads, q, extent)`` (``heads`` the query heads, ``q`` the forward's
        tokens per sequence, ``extent`` the slots the layer attends over, the new tokens'
        included): float32, or the model's dtype where the model's own eager attention
        computed it.  While nothing was ever evicted slot ``s`` holds position ``s`` (the
        padded sequence's); afterwards a row's slots are in
        ``storage.slots[row, :count]`` (kept order).  Masked slots (padding, freed slots,
        later tokens of a chunk) weigh 0.

        Called in layer order, as each layer's attention is computed and before the cache
        uses the weights; after the last layer's observers the policies step.  During the
        calls ``cache.seen`` (and ``get_seq_length()``) is the position of the forward's
        first token, and the inspection methods give the cache as it was before the
        forward.  An observer must not change the cache (``reset()``, ``update()``,
        ``pin()``, a batch reshuffle, ``end_prompt()`` called from one raise
        ``InvalidInputError``); an exception it raises propagates out of the forward
        (which is undone).
        Observers are not copied with the cache (``copy.deepcopy``, pickling).

        Returns
        -------
        ObserverHandle
            ``handle.remove()`` detaches ``fn``.

        Raises
        ------
        InvalidTypeError
            ``fn`` is not callable.
        """
        if not callable(fn):
            raise InvalidTypeError(f"an observer must be callable, not {type(fn).__name__}")
        self._observers.append(fn)
        return ObserverHandle(self._observers, fn)

    #: The last model config found to fit :attr:`shape` (:func:`~scissorhands.hf.shape.check_module`).
    _fitted: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_observers"] = []
        state.pop("_observing", None)  # a copy made by an observer calls none
        state.pop("_fitted", None)
        state["_gathered"] = state["_pending"] = state["_steady_out"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._gathered, self._pending = None, None  # C views: made again
        self._steady_out = (ffi.new("int *"), ffi.new("double *"))

    # ------------------------------------------------------------------ inspection

    @property
    def policies(self) -> list[Any]:
        """The policy objects (one per configuration; built at the first forward)."""
        return [] if self.bank is None or not self._holds() else self.bank.policies

    @property
    def batch(self) -> int:
        """Sequences held (0 before the first forward)."""
        return self.storage.batch if self._holds() else 0

    def _holds(self) -> bool:
        """Whether a forward ever finished since the cache was built or reset (the first
        one in flight, or interrupted, holds nothing yet)."""
        return self.storage.started() and not (self._forward is not None and self._forward.fresh)

    def _row(self, layer: int, sequence: int, head: int) -> int:
        if not self._holds():
            raise InvalidInputError("the cache holds nothing yet")
        e = self._evicting_index(layer)
        for name, value, bound in (("sequence", sequence, self.batch), ("head", head, self.num_kv_heads)):
            value = check_int(name, value, -(1 << 62), 1 << 62)
            if not 0 <= value < bound:
                raise InvalidInputError(f"{name} must be in [0, {bound}), got {value}")
        return (e * self.batch + sequence) * self.num_kv_heads + head

    def _layer_index(self, name: str, value: Any) -> int:
        """``value`` as one of the cache's layer indices.

        Raises
        ------
        InvalidTypeError
            Not an integer (or a bool).
        InvalidInputError
            Outside ``[0, len(layers))``.
        """
        index = check_int(name, value, -(1 << 62), 1 << 62)
        if not 0 <= index < len(self.layers):
            raise InvalidInputError(f"{name} must be in [0, {len(self.layers)}) (the cache's layers), got {index}")
        return index

    def _evicting_index(self, layer: int) -> int:
        layer = check_int("layer", layer, -(1 << 62), 1 << 62)
        if not 0 <= layer < len(self.layers) or not isinstance(self.layers[layer], EvictingLayer):
            raise InvalidInputError(f"layer {layer} is not one of the cache's full-attention layers")
        evicting = self.layers[layer]
        assert isinstance(evicting, EvictingLayer)
        return evicting.index

    def held_counts(self) -> np.ndarray:
        """Positions held per (layer, sequence, KV head): ``int64 (evicting layers, batch,
        kv_heads)``."""
        if not self._holds():
            return np.zeros((self.evicting_layers, 0, self.num_kv_heads), dtype=np.int64)
        return self.storage.counts.reshape(self.evicting_layers, self.batch, self.num_kv_heads).copy()

    def kept_positions(self, layer: int, sequence: int = 0, head: int = 0) -> np.ndarray:
        """The positions held by one (layer, sequence, KV head), ascending, as the policy
        counts them (padded positions: the index in the batch's padded token sequence)."""
        row = self._row(layer, sequence, head)
        assert self.bank is not None
        policy_row = row if self.head_mode == "per-head" else row // self.num_kv_heads
        return self.bank.kept_row(policy_row)

    def kept_keys_values(self, layer: int, sequence: int = 0, head: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """One (layer, sequence, KV head)'s held keys and values in kept order,
        ``(n, head_dim)`` each (copies)."""
        row = self._row(layer, sequence, head)
        e = self._evicting_index(layer)
        slots = torch.from_numpy(self.storage.slots[row, : self.storage.counts[row]].astype(np.int64))
        keys, values = self.storage.layer_buffers(e)
        assert keys is not None and values is not None
        return keys[sequence, head, slots], values[sequence, head, slots]

    def kv_bytes(self, positions: int) -> int:
        """Bytes of keys and values for ``positions`` positions in every (evicting layer,
        sequence, KV head): what a cache holding that many positions stores.

        Raises
        ------
        InvalidTypeError
            ``positions`` is not an integer.
        InvalidInputError
            ``positions`` is negative."""
        positions = check_int("positions", positions, 0, 1 << 62)
        storage = self.storage
        per_position = sum((k.shape[-1] + v.shape[-1]) * k.element_size()
                           for k, v in zip(storage.keys, storage.values) if k is not None and v is not None)
        return positions * self.batch * self.num_kv_heads * per_position

    def memory_bytes(self) -> int:
        """Bytes of the held key and value buffers plus the policies' own state.  A
        refused forward gives back what it grew; one interrupted between the model's
        layers holds what it wrote until the next call on the cache undoes it."""
        if not self._holds():
            return 0
        return self.storage.nbytes() + sum(int(p.memory_bytes()) for p in self.policies)

    def archive_bytes(self) -> int:
        """Bytes of the recall tier's archive (``archive``; 0 without one): archived keys
        and values (float32, or int8 with a float32 scale each), and their positions."""
        return 0 if self._archive is None else self._archive.nbytes()

    def archived_positions(self, layer: int, sequence: int = 0, head: int = 0) -> np.ndarray:
        """The positions one (layer, sequence, KV head) has archived, ascending (empty
        without an archive)."""
        row = self._row(layer, sequence, head)
        if self._archive is None:
            return np.zeros(0, dtype=np.int64)
        return np.sort(self._archive.row_entries(row)[0])

    # ------------------------------------------------------------------ the forward

    def _start(self, batch: int) -> None:
        if self.per_sequence and batch != len(self.configs):
            raise InvalidInputError(f"the cache has one configuration per sequence ({len(self.configs)}), "
                                    f"the model wrote a batch of {batch}")
        configs: list[PolicyConfig] = []
        counts: list[int] = []
        for config, size in zip(self.configs, [1] * batch if self.per_sequence else [batch]):
            if configs and configs[-1] == config:  # consecutive equal configurations share rows
                counts[-1] += size
            else:
                configs.append(config)
                counts.append(size)
        self.bank = PolicyRows(configs, counts, self.evicting_layers, self.policy_heads, self._initial_pins)
        for policy in self.bank.policies:  # the spans pinned after construction
            for start, stop in self._pins:
                policy.pin(start, stop)
        self.storage.start(batch, self.num_kv_heads)

    def _begin(self, key: torch.Tensor) -> _Forward:
        """The first evicting layer's write: the forward's state, its tokens' slots planned."""
        self._settle()
        storage = self.storage
        fresh = not storage.started()
        if key.shape[2] < 1:  # before anything changes
            raise InvalidInputError(f"the model wrote keys {tuple(key.shape)}: a forward needs at least one token")
        if fresh and (key.shape[0] < 1 or key.shape[1] != self.num_kv_heads):
            raise InvalidInputError(
                f"the model wrote keys {tuple(key.shape)} to an empty cache built for {self.num_kv_heads} KV heads: "
                + ("a forward needs at least one sequence" if key.shape[0] < 1 else
                   f"{int(key.shape[1])} KV heads is not the configuration's (build the cache from the model "
                   "that runs it)"))
        q = int(key.shape[2])
        if q == 1:
            self._prompt_end()
        else:
            self._prompt_start(q)
        plan = storage.plan_state(not fresh and storage.prepare(q))
        pending = self._pending
        if pending is None or pending.size != self.evicting_layers:
            pending = self._pending = DecodeWeights(self.evicting_layers)
        self._forward = _Forward(self.evicting_layers, q, fresh, plan, pending)
        try:
            if fresh:
                self._start(int(key.shape[0]))
            self._forward.window_rows = self._window_only(q, fresh)
            storage.plan(q)
        except BaseException:
            self._rollback()
            raise
        return self._forward

    def _window_only(self, q: int, fresh: bool) -> int:
        """``prompt_aware``: how many of a chunk's last query rows' weights are computed
        when it evicts nothing (every row's count plus ``q`` within ``prefill_budget``),
        nothing evicted before it (the model's own attention reads the prompt) and no
        observer reads the weights: ``min(q, observation_window)``, the only rows the
        prompt's end reads, the policies reading none of the chunk's (its positions join
        with a new position's state, ``extend(..., unread=True)``); 0 (every row, as
        before) otherwise."""
        aware = self.prompt_aware
        if not aware.enabled or q < 2 or self._observers or not self._policies_read:
            return 0
        storage = self.storage
        if not fresh and not storage.aligned:
            return 0
        held = 0 if fresh else int(storage.counts.max(initial=0))
        if held + q > aware.prefill_budget:
            return 0
        return min(q, aware.observation_window)

    def _settle(self) -> None:
        """Before a new forward (or a change of the batch): a forward that did not finish
        is undone.  When none of its layers handed over attention, the model does not run
        the library's attention: refused, the cache as it was before that forward."""
        forward = self._forward
        if forward is None:
            return
        self._rollback()
        if not any(forward.observed):
            raise InvalidInputError(_OUT_OF_SYNC)

    def _rollback(self) -> None:
        """Undo the forward in flight, if any: the cache as it was before it (the policies
        act only at its end, so they are untouched; its keys and values sit in slots that
        are free again; transformers' own layers get their tensors back)."""
        forward = self._forward
        self._forward = None
        slid, self._slid = self._slid, {}
        if forward is None:
            return
        for index, state in slid.items():
            _restore_layer(self.layers[index], state)
        if forward.fresh:
            self.storage.clear()
            self.bank = None
            for layer in self.layers:
                if isinstance(layer, EvictingLayer):
                    layer.reset()
            return
        storage = self.storage
        if forward.rope is not None:
            columns, old = forward.rope
            storage.rope[np.arange(storage.rows)[:, None], columns] = old
        storage.unplan(forward.plan)

    @_outside_graph
    def reuse_prefix(self, input_ids: Any, attention_mask: Any = None) -> int:
        """Compare a prompt's full ids with what the cache has read, per sequence, and
        return how many of its tokens the cache holds: the caller reads
        ``input_ids[:, n:]`` next (with the full ``attention_mask``).  ``generate`` calls
        it for every prompt once :meth:`from_model` installed the comparison
        (:mod:`scissorhands.hf.prefix`); a hand-written loop serving requests calls it.

        A prompt that continues what was read (every sequence's ids, padding included,
        equal over every position read, and longer) returns ``get_seq_length()`` and
        changes nothing.  Otherwise, with ``prefix="reuse"``: the sequences' longest
        common prefix ``p`` with what was read, the shortest over the batch and at most
        the prompt's length minus one (its last token is read again for its logits),
        stays; every (sequence, layer, KV head) row forgets what it holds from ``p`` on,
        its policy state and what it archived with it (the positions before keep theirs, votes and scores
        included), and ``p`` tokens count as seen.  Nothing is reused (the cache is
        ``reset()``, 0 returned) when ``p < 2``, the batch differs, the prompt comes
        without ids, or a sliding-window layer no longer holds what ``p`` needs.  With
        ``prefix="refuse"`` such a prompt raises instead, nothing changed.

        Parameters
        ----------
        input_ids : array-like of int
            ``(batch, L)`` or ``(L,)``: every token of the prompt, from position 0.
        attention_mask : array-like, optional
            ``(batch, L)``, 0 for padding (compared as padding, not as its token id).

        Returns
        -------
        int
            The positions reused: tokens the cache now counts as seen.

        Raises
        ------
        InvalidTypeError
            ``input_ids`` are not integers.
        InvalidInputError
            A shape that is not ``(batch, L)`` with ``L >= 1``, a mask of another shape;
            with ``prefix="refuse"`` a prompt that does not continue what was read,
            naming the sequence, the first differing position and ``reset()``; a cache
            with one configuration per sequence given another batch.  Nothing changes.
        """
        return _prefix.reuse_prefix(self, input_ids, attention_mask)

    @_outside_graph
    def end_prompt(self) -> None:
        """``prompt_aware``: end the prompt now, as the first decode step would (every row
        evicted to the budget by the observation-window rule), for a caller whose next
        forward is not a single token (lm-eval's scored continuation).  Nothing when no
        prompt awaits its end (or the cache is not prompt-aware).

        Raises
        ------
        InvalidInputError
            The policy refuses the window (the cache as it was).
        """
        self._unchanged_by_observers("end_prompt()")
        self._settle()
        self._prompt_end()

    def _prompt_end(self) -> None:
        """``prompt_aware``: when a prompt was read and the first decode step begins (no
        forward in flight), evict every row to the budget with the policy's
        ``evict_observed_rows`` over the prompt's last rows, and free the victims'
        slots; nothing otherwise.  Refused by the policy: the cache as it was, the
        window kept."""
        window = self._window
        if window is None or self._forward is not None or self.bank is None or not self.storage.started():
            return
        start = time.perf_counter()
        bank, storage = self.bank, self.storage
        archive = self._archive
        if archive is not None and self._queries is not None and self._queries.ready() and archive.total():
            self.stats.recalled += recall(self)
            self._window = None
            self._queries.clear()
            self.stats.prompt_ends += 1
            self.stats.compactions = storage.compactions
            self.stats.bookkeeping_seconds += time.perf_counter() - start
            return
        repeat = self.num_kv_heads // self.policy_heads
        before = None if archive is None else held_positions(bank.policies[0])
        t0 = time.perf_counter()
        victims, slots = bank.evict_observed(window, self.prompt_aware.pool_kernel)
        policy_seconds = time.perf_counter() - t0
        self._window = None
        if repeat > 1:
            victims, slots = _repeat_rows(victims, slots, repeat)
        if archive is not None and before is not None:  # nothing archived yet, or all of it restored
            none = [np.zeros(0, dtype=np.int64)] * storage.rows
            archive_victims(archive, storage, before, victims, slots, none, none)
            if self._queries is not None:
                self._queries.clear()
        storage.evict(victims, slots)
        if archive is not None and self._restored is not None:
            self.stats.recalled += restored_kept(self)
        self.stats.prompt_ends += 1
        self.stats.compactions = storage.compactions
        self.stats.policy_seconds += policy_seconds
        self.stats.bookkeeping_seconds += time.perf_counter() - start - policy_seconds

    def _prompt_start(self, q: int) -> None:
        """``archive``: a new prompt (``q`` tokens, the first forward after decode steps or
        a prompt's end) on a used cache reads over the archived positions too
        (:func:`~scissorhands.hf.recall.restore`); not part of the forward (a forward that
        fails keeps it, as it keeps a prompt's end)."""
        if self._archive is None or self._window is not None or self._forward is not None:
            return
        if self.bank is None or not self.storage.started():
            return
        start = time.perf_counter()
        restore(self, q)
        self.stats.compactions = self.storage.compactions
        self.stats.bookkeeping_seconds += time.perf_counter() - start

    def _mask_sizes(self, q: int) -> tuple[int, int]:
        storage = self.storage
        if not storage.started() or storage.aligned:
            return self.seen + q, 0
        if q == 1:
            extent = storage.single_extent()
        else:
            extent = storage.extent + q
        return extent, self.seen + q - extent

    #: The rotary module's attribute holding the frequencies the keys turn with (from_model).
    _rope_freq = "inv_freq"

    def _rotations(self, forward: _Forward, query: torch.Tensor,
                   key: torch.Tensor) -> RankPlan | tuple[torch.Tensor, ...]:
        """``positions="cache"``: the forward's rotations.  For float32 keys and queries a
        :class:`~scissorhands.hf.rope.RankPlan` (the keys kept at their ranks, only those
        whose rank changed turned in place); else every layer's keys ``(layers, batch,
        kv_heads, extent, width)`` and the query ``(batch, 1, q, width)`` (cos and sin
        each), from the stored rotations to the ranks, applied to copies."""
        storage = self.storage
        q = int(query.shape[2])
        layers, batch, heads = self.evicting_layers, storage.batch, self.num_kv_heads
        admitted = None
        if forward.pads is not None:
            admitted = np.broadcast_to((~forward.pads)[None, :, None, :], (layers, batch, heads, q)).reshape(-1, q)
        assert forward.positions is not None
        inv_freq = getattr(self.rotary, self._rope_freq, None)
        if isinstance(inv_freq, torch.Tensor) and rank_rotatable(query, key):
            return rank_plan(storage, admitted, forward.positions, inv_freq.detach().cpu().double().numpy(),
                             self.groups, int(key.shape[-1]))
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

    def _decodes(self, forward: _Forward) -> bool:
        """Whether the forward is a decode step for the policies (one token after others,
        no padding); else a chunk (a prompt, even of one token)."""
        return forward.q == 1 and self.seen != 0 and (forward.pads is None or not forward.pads.any())

    def _decode_buffer(self, size: int) -> tuple[np.ndarray, Any]:
        """The flat float32 buffer (and its C view) a decode step's gathered weights go
        to, at least ``size`` long: the last step's while it is long enough (written by
        the gather, read only by this step's policies), else one a thirty-second longer."""
        gathered = self._gathered
        if gathered is None or len(gathered[0]) < size:
            flat = np.empty(size + size // 32, dtype=np.float32)
            gathered = self._gathered = (flat, ffi.from_buffer("float[]", flat))
        return gathered

    def _decode_target(self, forward: _Forward) -> np.ndarray:
        """A decode step's ``(rows, 1, width)`` float32 array for every policy row's
        weights in kept order (width the largest count), a view of
        :meth:`_decode_buffer`."""
        rows, width = self.evicting_layers * self.storage.batch * self.policy_heads, self.storage.most()
        kept = self._decode_buffer(rows * width)[0][: rows * width].reshape(rows, 1, width)
        forward.gathered = kept
        return kept

    def _gather_target(self, forward: _Forward) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A chunk's physical columns per policy row in the policies' order, ``(rows,
        width)`` (each row's held slots in kept order, then the chunk's tokens, in
        ``extend``'s layout), the positions each row held before it, and the ``(rows, q,
        width)`` float32 array their weights go to; made at the first layer that hands
        weights in (a decode step's is :meth:`_decode_target`)."""
        if forward.gathered is None or forward.columns is None or forward.held is None:
            storage = self.storage
            repeat = self.num_kv_heads // self.policy_heads
            fresh = self.seen == 0
            columns = storage.chunk_columns((0 if fresh else storage.most()) + forward.q)[::repeat]
            held = np.zeros(len(columns), dtype=np.int64) if fresh else storage.counts[::repeat].copy()
            forward.columns, forward.held = columns, held
            # The rows computed: the chunk's last window_rows under prompt-aware reading, else all.
            forward.gathered = np.empty((len(columns), forward.window_rows or forward.q, columns.shape[1]),
                                        dtype=np.float32)
        return forward.columns, forward.held, forward.gathered

    def _finish(self, forward: _Forward) -> None:
        """After the last evicting layer: hand every row's weights to the policies, free
        the victims' slots, drop the forward."""
        start = time.perf_counter()
        storage, bank = self.storage, self.bank
        assert bank is not None
        q = storage.q
        if not all(forward.observed):
            raise InvalidInputError(_OUT_OF_SYNC)
        rows = self.evicting_layers * self.storage.batch * self.policy_heads
        if self._decodes(forward) and forward.pending.tensors:
            # The steady state (every row holds the same count): gather, policy and slot
            # table in one C call; None when it is not that case (nothing changed).
            steady = self._steady_step(forward)
            if steady is not None:
                self.stats.steps += 1
                self._finished(q, start, steady)
                return
        finite = False  # known finite (checked by the decode step's gather)
        if self._policies_read and forward.pending.tensors:  # a decode step: every layer in one C call
            out = self._decode_target(forward)
            # Each policy row's held slots in kept order: every repeat-th row of the slot table.
            finite = gather_layers(forward.pending.tensors, self.policy_heads, storage.c_array("slots", SLOT_DTYPE),
                                   self.num_kv_heads // self.policy_heads, out.shape[2], out)
        gathered = forward.gathered if self._policies_read else None  # (rows, q, width), kept order
        repeat = self.num_kv_heads // self.policy_heads
        pads = forward.pads
        policy_seconds = 0.0
        fresh = self.seen == 0
        if self._decodes(forward):
            weights = None if gathered is None else gathered.reshape(rows, -1)
            if weights is not None and not finite:
                weights = self._contained(weights)
            before = None if self._archive is None else held_positions(bank.policies[0])
            t0 = time.perf_counter()
            victims, slots = bank.step(self.seen, weights)
            policy_seconds = time.perf_counter() - t0
            if before is not None and self._archive is not None:
                new_slot = np.full(storage.rows, storage.chunk_start) if storage.aligned else storage.free
                archive_victims(self._archive, storage, before, victims, slots, [np.array([self.seen])] * storage.rows,
                                [new_slot[r:r + 1] for r in range(storage.rows)])
            if repeat > 1:
                victims, slots = _repeat_rows(victims, slots, repeat)
            # One victim in every row: the storage's steady path, else the general one.
            if len(slots) != storage.rows or not storage.apply_steady(slots):
                storage.apply_step(victims, slots)
            self.stats.steps += 1
        else:
            chunk_weights = gathered
            admit = None
            if pads is not None and pads.any():
                per_sequence = ~pads  # (batch, q)
                shape = (self.evicting_layers, self.storage.batch, self.policy_heads, q)
                admit = np.broadcast_to(per_sequence[None, :, None, :], shape).reshape(rows, q)
                if chunk_weights is not None:
                    chunk_weights = _without_padding(chunk_weights, admit, storage.counts[::repeat],
                                                     q - chunk_weights.shape[1])
            if chunk_weights is not None:
                chunk_weights = self._contained(chunk_weights)
            aware = self.prompt_aware.enabled
            before = None if self._archive is None or fresh else held_positions(bank.policies[0])
            t0 = time.perf_counter()
            if aware:  # the prompt is held up to its cap; its window's rows only: no policy reads them
                victims, slots = bank.extend(chunk_weights, admit, fresh, q, cap=self.prompt_aware.prefill_budget,
                                             unread=forward.window_rows > 0)
            else:
                victims, slots = bank.extend(chunk_weights, admit, fresh, q)
            policy_seconds = time.perf_counter() - t0
            if aware:
                assert chunk_weights is not None and forward.held is not None
                self._window = _next_window(self._window, chunk_weights, admit, forward.held, victims, slots,
                                            self.prompt_aware.observation_window, q)
            storage_admit = None if admit is None else np.repeat(admit, repeat, axis=0)
            if self._archive is not None:
                self._archive_chunk(before, victims, slots, admit, q)
            if repeat > 1:
                victims, slots = _repeat_rows(victims, slots, repeat)
            storage.apply_chunk(storage_admit, victims, slots)
            self.stats.chunks += 1
        self._finished(q, start, policy_seconds)

    def _archive_chunk(self, before: tuple[np.ndarray, np.ndarray] | None, victims: np.ndarray,
                       slots: np.ndarray, admit: np.ndarray | None, q: int) -> None:
        """``archive``: a chunk's victims archived before their slots are freed."""
        assert self._archive is not None
        storage = self.storage
        if before is None:  # the first chunk: nothing was held before it
            before = (np.zeros(storage.rows, dtype=np.int64), np.zeros(0, dtype=np.int64))
        tokens = np.arange(q)
        joined = [tokens if admit is None else tokens[admit[r]] for r in range(storage.rows)]
        archive_victims(self._archive, storage, before, victims, slots, [self.seen + j for j in joined],
                        [storage.chunk_start + j for j in joined])

    def _finished(self, q: int, start: float, policy_seconds: float) -> None:
        """The end of a forward's step: ``q`` tokens seen, the forward dropped, its times
        (from ``start``, ``policy_seconds`` of it in the policies) counted."""
        self.stats.compactions = self.storage.compactions
        forward = self._forward
        self._read_ids.commit(self.seen, q, self.storage.batch, None if forward is None else forward.pads)
        self.seen += q
        if forward is not None:
            # A decode step's weights let go now, while what freeing them touches is still
            # in the caches the step just read them through: at the next forward's start
            # it is not (about 70 us a step at batch 1 with 2,048 held there, 30-50 here).
            forward.pending.start()
        self._forward = None
        self.stats.policy_seconds += policy_seconds
        self.stats.bookkeeping_seconds += time.perf_counter() - start - policy_seconds

    def _steady_step(self, forward: _Forward) -> float | None:
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
        storage = self.storage
        # PolicyRows.step is where a decode step's weights reach the policies: replaced
        # (an experiment's budget, a test recording what the policies see), it is called.
        if self.num_kv_heads != self.policy_heads or self.bank is None or type(self.bank).step is not _OWN_STEP:
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
        out_c = self._decode_buffer(storage.rows * count)[1]
        stride, valid_stride = storage.slots.shape[1], storage.valid.shape[1]
        done, seconds = self._steady_out

        def call(state: Any, pos: int, budget: int, victims: Any, victim_slots: Any, capacity: int,
                 n_victims: Any) -> tuple[int, float]:
            lib.sh_cache_step_steady(addresses, len(layers), batch * self.policy_heads, heads // self.policy_heads,
                                     extent, slots_c, stride, count, counts_c, free_c, valid_c, valid_stride,
                                     out_c, state, pos, budget, victims, victim_slots, capacity, n_victims, freed_c,
                                     done, seconds)
            return done[0], seconds[0]

        got = self.bank.step_with(self.seen, call)
        if got is None:
            return None
        stepped, policy_seconds, victims, victim_slots, positions = got
        if stepped == 2:
            assert freed is not None
            if self._archive is not None:  # one victim a row, its key and value still in the freed slot
                archive_step(self._archive, storage, positions, freed)
            storage.stepped_steady(freed, freed_c)
        else:  # the policy stepped, the slot table did not (not one victim a row): the general path
            assert victims is not None and victim_slots is not None
            if self._archive is not None and victim_slots.size:
                rows = np.repeat(np.arange(storage.rows), victims)
                index = victim_slots.astype(np.int64)
                admitted = index >= storage.counts[rows]  # the step's own token (kept index count)
                new_slot = np.full(storage.rows, storage.chunk_start) if storage.aligned else storage.free
                held = np.where(admitted, new_slot[rows],
                                storage.slots[rows, np.minimum(index, storage.slots.shape[1] - 1)])
                archive_step(self._archive, storage, positions, held.astype(np.int64), victims)
            if freed is None and not victim_slots.size:  # before the first eviction, none now
                storage.stepped_aligned()
            else:
                storage.apply_step(victims, victim_slots)
        return policy_seconds

    def _contained(self, weights: np.ndarray) -> np.ndarray:
        """The weights the policies get (rows layer-major, then sequence): as they are when
        finite (the policies refuse anything else).  A sequence whose weights are not
        finite (what an inf or NaN in a padded token's embedding spreads into the rest of
        its sequence: the stock cache gives that sequence non-finite logits and the others
        go on) hands its policies zero attention, so that the batch's other sequences go
        on; when no sequence's are finite (a broken model), the forward is refused."""
        if np.isfinite(weights.sum()):
            return weights
        view = weights.reshape(self.evicting_layers, self.storage.batch, -1)
        finite = np.isfinite(view).all(axis=(0, 2))
        if not finite.any():
            raise InvalidInputError(
                "the model's attention weights are not finite (NaN or inf) in any sequence of the batch: "
                "its outputs are not numbers (a NaN or inf weight or input?); the cache is as it was before "
                "this forward")
        view = view.copy()
        view[:, ~finite] = 0.0
        return view.reshape(weights.shape)

    # ------------------------------------------------------------------ the Cache API

    @_outside_graph
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer_idx``'s new keys and values (transformers' call, every layer of every
        forward).  At layer 0 a forward that did not finish is undone first; transformers'
        own layers are remembered as they were, so that a forward failing before its step
        leaves every layer as it was."""
        if self._observing:  # as in EvictingLayer.update: before layer 0's settling
            self._unchanged_by_observers("update()")
        if type(layer_idx) is not int or not 0 <= layer_idx < len(self.layers):
            layer_idx = self._layer_index("layer_idx", layer_idx)
        if not (isinstance(key_states, torch.Tensor) and isinstance(value_states, torch.Tensor)
                and key_states.dim() == 4 and value_states.dim() == 4):
            _refuse_states(key_states, value_states)
        if key_states.requires_grad or value_states.requires_grad:
            _refuse_grad(self, layer_idx)
        layer: Any = self.layers[layer_idx]
        if isinstance(layer, EvictingLayer):
            check_write(self, layer_idx, key_states, value_states)
        if layer_idx == 0:
            self._settle()
            self._slid = {}
        if not isinstance(layer, EvictingLayer):
            self._slid.setdefault(layer_idx, (layer.keys, layer.values, getattr(layer, "cumulative_length", None),
                                              layer.is_initialized))
        try:
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)
        except BaseException:
            self._rollback()
            raise

    @_outside_graph
    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens seen so far (padding included): the true position of the next token.

        transformers asks before every forward's layers run: a forward that did not
        finish is undone here (or, when none of its layers handed over attention,
        refused), so that every layer's mask is sized for the cache as it was before it."""
        if type(layer_idx) is not int or not 0 <= layer_idx < len(self.layers):
            self._layer_index("layer_idx", layer_idx)
        if not self._observing:  # an observer's call, mid-forward: the position before it
            self._settle()
        return self.seen

    @_outside_graph
    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        """The mask's key length and offset for layer ``layer_idx`` (transformers' call,
        before the layers run; a forward that did not finish is undone first).  With
        ``prompt_aware``, a single token after a prompt is the first decode step: the
        prompt's end evicts here, so that the sizes are those the step attends over."""
        if type(layer_idx) is not int or not 0 <= layer_idx < len(self.layers):
            layer_idx = self._layer_index("layer_idx", layer_idx)
        if not self._observing:  # an observer's call, mid-forward, changes nothing
            self._settle()
            if query_length == 1:
                self._prompt_end()
            else:
                self._prompt_start(query_length)
        return super().get_mask_sizes(query_length, layer_idx)

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1

    def reset(self) -> None:
        """Forget everything: the cache is ready for a new prompt (of any batch size)."""
        self._unchanged_by_observers("reset()")
        for layer in self.layers:
            layer.reset()
        self.storage.clear()
        self.bank = None
        self.seen = 0
        self.stats = CacheStats()
        self._forward = None
        self._slid = {}
        self._window = None
        self._read_ids.clear()
        self._restored = None
        if self._archive is not None and self._queries is not None:
            self._archive.clear()
            self._queries.clear()

    def _select(self, index: Any, what: str, name: str = "indices", one_each: bool = False) -> None:
        """Sequences become ``index`` (old sequence numbers, ``name`` in ``what``'s
        arguments; with ``one_each``, one per sequence), checked before anything moves."""
        self._unchanged_by_observers(f"{what}()")
        try:
            ndim = index.dim() if isinstance(index, torch.Tensor) else np.ndim(index)
        except ValueError:  # a ragged list
            ndim = -1
        if not isinstance(index, (torch.Tensor, np.ndarray, list, tuple, range)) or ndim != 1:
            raise InvalidTypeError(f"{what}: {name} must be a 1-D sequence of sequence indices, "
                                   f"got {type(index).__name__} {index!r:.60}")
        self._rollback()  # a forward that did not finish: undone first
        if not self.storage.started():
            return
        if one_each and len(index) != self.storage.batch:
            raise InvalidInputError(f"{what}: {name} has {len(index)} indices for {self.storage.batch} sequences")
        if self.per_sequence:
            raise InvalidInputError(f"{what}: a cache with one configuration per sequence cannot "
                                    "reorder its batch")
        array = np.asarray(index.detach().cpu() if isinstance(index, torch.Tensor) else index)
        if array.ndim != 1 or array.dtype.kind not in "iu" or array.size == 0:
            raise InvalidInputError(f"{what}: the sequence indices must be a non-empty 1-D integer "
                                    f"array, got {array.dtype} of shape {array.shape}")
        if array.min() < 0 or array.max() >= self.storage.batch:
            raise InvalidInputError(f"{what}: sequence indices must be in [0, {self.storage.batch}), "
                                    f"got {array.min()}..{array.max()}")
        array = array.astype(np.int64)
        assert self.bank is not None
        self.bank.select(array)
        if self._window is not None:  # the prompt's rows follow their sequences (layer-major rows)
            shape = (self.evicting_layers, self.storage.batch, self.policy_heads, *self._window.shape[1:])
            self._window = np.ascontiguousarray(self._window.reshape(shape)[:, array].reshape(-1, *shape[3:]))
        if self._archive is not None and self._queries is not None:  # the archive's rows follow too
            grid = np.arange(self.evicting_layers * self.storage.batch * self.num_kv_heads).reshape(
                self.evicting_layers, self.storage.batch, self.num_kv_heads)
            self._archive.select(grid[:, array].reshape(-1))
            self._queries.select(array)
        self.storage.select(array)
        self._read_ids.select(array)
        for layer in self.layers:
            if not isinstance(layer, EvictingLayer):
                layer.batch_select_indices(torch.from_numpy(array))  # type: ignore[union-attr]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: sequence ``i`` becomes a copy of sequence ``beam_idx[i]`` (keys,
        values and policy rows); ``beam_idx`` holds one index per sequence."""
        self._select(beam_idx, "reorder_cache", "beam_idx", one_each=True)

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Each sequence repeated ``repeats`` times in place (``[a, b]`` -> ``[a, a, b, b]``)."""
        if isinstance(repeats, bool) or not isinstance(repeats, (int, np.integer)) or repeats < 1:
            raise InvalidInputError(f"batch_repeat_interleave: repeats must be a positive integer, got {repeats!r}")
        self._select(np.repeat(np.arange(self.storage.batch), int(repeats)), "batch_repeat_interleave")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the sequences ``indices`` (in that order)."""
        self._select(indices, "batch_select_indices")

    def crop(self, tokens_to_remove: int) -> None:
        """``crop(0)`` does nothing; anything else raises: an evicted position is gone."""
        if tokens_to_remove != 0:
            raise InvalidInputError("an EvictingCache cannot be cropped: the positions it evicted are gone")

    def activate_past_recording(self) -> None:
        """Refused: transformers asks for it before the first forward of assisted
        decoding (``assistant_model=``) and prompt-lookup decoding
        (``prompt_lookup_num_tokens=``), which then ``crop`` the draft tokens the model did
        not accept; the policies have already evicted for those tokens, so they cannot be
        taken back.  Nothing has changed when this raises."""
        raise InvalidInputError(
            "an EvictingCache cannot take back tokens once its policies saw them, which assisted decoding "
            "(assistant_model=) and prompt-lookup decoding (prompt_lookup_num_tokens=) need to drop rejected "
            "drafts: generate without them, or with transformers' DynamicCache")

    def early_initialization(self, *args: Any, **kwargs: Any) -> None:
        raise InvalidInputError("an EvictingCache sizes itself at the first forward; it has no early initialization")

    @property
    def is_compileable(self) -> bool:
        return False

    def __copy__(self) -> EvictingCache:
        """``copy.copy``: an independent copy, as ``copy.deepcopy`` gives (the layers, the
        storage and the policies' state copied; observers not).  A shallow copy sharing
        the layers would advance the original while reporting its own length."""
        return copy.deepcopy(self)

    def __repr__(self) -> str:
        """Never raises (also for a cache whose constructor was refused part-way)."""
        try:
            names = ", ".join(f"{c.policy}@{c.budget}" for c in self.configs)
            return (f"EvictingCache({names}, layers={self.evicting_layers}, batch={self.batch}, "
                    f"seen={self.seen}, head_mode={self.head_mode!r}, cache_mode={self.cache_mode!r})")
        except Exception:  # a partly built object: what it has
            return partial_repr(self)


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


def _restore_layer(layer: Any, state: tuple[Any, ...]) -> None:
    """Put one of transformers' own layers back as :meth:`EvictingCache.update` found it
    (its updates replace the tensors, never write into them)."""
    layer.keys, layer.values, length, layer.is_initialized = state
    if length is not None:
        layer.cumulative_length = length


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


def _repeat_rows(victims: np.ndarray, slots: np.ndarray, repeat: int) -> tuple[np.ndarray, np.ndarray]:
    """Victims of policy rows applied to ``repeat`` storage rows each (``mean`` head mode)."""
    offsets = np.concatenate(([0], np.cumsum(victims)))
    parts = [slots[offsets[r]:offsets[r + 1]] for r in range(len(victims)) for _ in range(repeat)]
    return np.repeat(victims, repeat), (np.concatenate(parts) if parts else slots)


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
