"""What the cache's modules (forward, step, positions, prompt_end, copies, inspection,
pins, observers, guards, layer, prefix) read and call of the cache they serve:
:class:`CacheState`, a protocol that :class:`~scissorhands.hf.cache.EvictingCache`
satisfies structurally, so that those modules name it in their annotations without
importing the cache back; :class:`LayerState`, an evicting layer as the guards see it;
and :data:`AttentionObserver`, what the cache's observers are."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    import numpy as np
    from transformers.cache_utils import CacheLayerMixin, DummyLayer, LinearAttentionCacheLayerMixin

    from ..prompt_aware import PromptAware
    from .archive import Archive
    from .flight import _Forward
    from .gqa import DecodeWeights
    from .read_ids import TokenIds
    from .recall import WindowQueries
    from .rope import RankPlan
    from .rows import PolicyConfig, PolicyRows
    from .stats import CacheStats
    from .storage import SlotStorage

#: ``fn(layer, weights)``: see :meth:`EvictingCache.add_observer`.
AttentionObserver = Callable[[int, torch.Tensor], Any]


class CacheState(Protocol):
    """An evicting cache as its modules use it (the attributes are documented where
    :class:`~scissorhands.hf.cache.EvictingCache` sets them)."""

    #: transformers' layers: an ``EvictingLayer`` per full-attention layer, its own others.
    layers: list[CacheLayerMixin | LinearAttentionCacheLayerMixin | DummyLayer]
    #: KV heads, query heads per KV head, policy heads per row (KV heads, or 1 under ``mean``).
    num_kv_heads: int
    groups: int
    policy_heads: int
    #: Full-attention layers (the evicting ones).
    evicting_layers: int
    #: ``"per-head"`` or ``"mean"``; ``"reuse"`` or ``"refuse"`` (a prompt that does not continue).
    head_mode: str
    prefix: str
    #: The policy configurations; whether one per sequence; the prompt-aware settings.
    configs: list[PolicyConfig]
    per_sequence: bool
    prompt_aware: PromptAware
    #: The keys, values and slot layout; the policy rows (None before the first forward).
    storage: SlotStorage
    bank: PolicyRows | None
    #: Tokens seen (padding included); what the cache counts.
    seen: int
    stats: CacheStats
    #: ``positions="cache"``: the model's rotary embedding and its frequencies' attribute.
    rotary: Any
    _rope_freq: str
    #: The forward in flight (None between forwards); transformers' own layers before it.
    _forward: _Forward | None
    _slid: dict[int, tuple[Any, ...]]
    #: The observers, and whether one is being called.
    _observers: list[AttentionObserver]
    _observing: bool
    #: Whether a policy reads attention; the pinned spans, and those given at construction.
    _policies_read: bool
    _pins: list[tuple[int, int]]
    _initial_pins: list[tuple[int, int]]
    #: A decode step's gathered weights and C view; the collector; the steady step's outputs.
    _gathered: tuple[np.ndarray, Any] | None
    _pending: DecodeWeights | None
    _steady_out: tuple[Any, Any]
    #: ``prompt_aware``: the prompt's last rows (``(rows, window, width)`` float32) or None.
    _window: np.ndarray | None
    #: The token ids read, per sequence.
    _read_ids: TokenIds
    #: ``archive``: the archive, the prompt's last query rows, the positions restored.
    _archive: Archive | None
    _queries: WindowQueries | None
    _restored: list[np.ndarray] | None

    @property
    def batch(self) -> int: ...  # sequences held (0 before the first forward)
    @property
    def policies(self) -> list[Any]: ...  # one policy object per configuration

    # forward.py
    def _start(self, batch: int) -> None: ...
    def _begin(self, key: torch.Tensor) -> _Forward: ...
    def _settle(self) -> None: ...
    def _rollback(self) -> None: ...

    # guards.py
    def _unchanged_by_observers(self, what: str) -> None: ...

    # positions.py
    def _mask_sizes(self, q: int) -> tuple[int, int]: ...
    def _rotations(self, forward: _Forward, query: torch.Tensor,
                   key: torch.Tensor) -> RankPlan | tuple[torch.Tensor, ...]: ...

    # prompt_end.py
    def _prompt_end(self) -> None: ...
    def _prompt_start(self, q: int) -> None: ...
    def _window_only(self, q: int, fresh: bool) -> int: ...

    # step.py
    def _decodes(self, forward: _Forward) -> bool: ...
    def _decode_buffer(self, size: int) -> tuple[np.ndarray, Any]: ...
    def _decode_target(self, forward: _Forward) -> np.ndarray: ...
    def _gather_target(self, forward: _Forward) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...
    def _finish(self, forward: _Forward) -> None: ...
    def _archive_chunk(self, before: tuple[np.ndarray, np.ndarray] | None, victims: np.ndarray,
                       slots: np.ndarray, admit: np.ndarray | None, q: int) -> None: ...
    def _finished(self, q: int, start: float, policy_seconds: float) -> None: ...
    def _steady_step(self, forward: _Forward) -> float | None: ...
    def _contained(self, weights: np.ndarray) -> np.ndarray: ...

    # copies.py
    def reset(self) -> None: ...
    def _select(self, index: Any, what: str, name: str = "indices", one_each: bool = False) -> None: ...

    # inspection.py
    def _holds(self) -> bool: ...
    def _row(self, layer: int, sequence: int, head: int) -> int: ...
    def _layer_index(self, name: str, value: Any) -> int: ...
    def _evicting_index(self, layer: int) -> int: ...


class LayerState(Protocol):
    """An evicting layer as the guards see it: the cache it belongs to."""

    @property
    def cache(self) -> CacheState: ...
