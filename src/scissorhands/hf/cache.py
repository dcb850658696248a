"""The transformers cache whose layers keep only the positions their policies hold."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache

from ..errors import InvalidInputError
from ..options import PolicyOptions
from .gqa import group_mean
from .rows import PolicyRows
from .storage import CACHE_MODES, OUT_OF_SYNC, CompactLayer, SlotLayer, Sync

__all__ = ["HEAD_MODES", "EvictingCache"]

#: ``per-head``: one policy row per KV head; ``mean``: one row per layer, shared by all heads.
HEAD_MODES = ("per-head", "mean")


class EvictingCache(DynamicCache):
    """A ``DynamicCache`` whose layers keep only the positions their policies hold.

    Parameters
    ----------
    config : transformers.PretrainedConfig
        The model's configuration (layer count, query and KV head counts).
    policies : sequence of policies, or one policy
        Either one fresh policy object per layer (any backend, duck-typed: ``prefill``,
        ``step(..., return_indices=True)``, ``evict(..., return_indices=True)``,
        ``kept_count``, ``kept``), with ``heads == num_key_value_heads`` in
        ``head_mode="per-head"`` and ``heads == 1`` in ``head_mode="mean"``; or one
        fresh policy whose rows are all the layers' heads, layer-major (row
        ``layer * heads_per_layer + head``, ``heads == num_layers * heads_per_layer``):
        rows are independent, so it decides exactly as the per-layer policies would, in
        one call per step instead of one per layer (what :meth:`from_policy` builds).
    head_mode : {"per-head", "mean"}, default "per-head"
    budget : int, optional
        Per-call budget passed to every ``evict``/``step``; None uses each policy's own.
    cache_mode : {"reuse", "compact"}, default "reuse"
        ``"reuse"``: per-layer buffers of ``budget + 1`` slots; each decode token's key
        and value go into the slot the last victim freed (per KV head), so a step copies
        nothing but the new token, and the model's weights (in slot order) are gathered
        back into the policy's kept order.  A step evicting several positions (the
        prefill) compacts the buffers.  ``"compact"``: keys and values appended by
        ``torch.cat`` and the survivors gathered after every eviction (the whole cache
        copied each step).  Both give the same logits up to float summation order, and
        the same victims.

    Attributes
    ----------
    policies : list
        The policy objects: one per layer, or the single fused one (``fused`` True).
    next_position : int
        The true position of the next token (tokens seen so far).
    policy_seconds, bookkeeping_seconds, forward_seconds : float
        Time spent in policy calls; in the cache's own work after the forward (GQA mean,
        numpy conversion, reordering, victim-slot arithmetic, gathers); in the model's
        forward (accumulated by :func:`prefill`/:func:`decode_step`).  Prefill is
        included; see ``prefill_seconds`` to subtract it.  ``update_seconds``: the part
        of the forward spent in the layers' ``update`` (writing the new keys/values).
    prefill_seconds : dict
        The same three figures for the prefill alone.
    decode_steps, compactions : int
        Decode steps run so far; buffer compactions (``"reuse"``: evictions of several
        positions at once).

    Notes
    -----
    ``get_seq_length()`` is the number of held positions, which is what the model's mask
    construction needs; positions come from ``position_ids``, which
    :func:`prefill`/:func:`decode_step` pass explicitly.  Use those two functions (or
    :func:`generate`) to drive the model: a plain ``model(...)`` call or
    ``model.generate`` writes keys the policies never see, and the next forward raises.
    In ``"reuse"`` mode ``layers[i].keys`` is the slot buffer, not in position order:
    :meth:`kept_keys_values` reads a layer's keys and values in kept order.
    """

    def __init__(
        self,
        config: Any,
        policies: Sequence[Any] | Any,
        *,
        head_mode: str = "per-head",
        budget: int | None = None,
        cache_mode: str = "reuse",
    ) -> None:
        super().__init__(config=config)
        text_config = (
            config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        )
        if head_mode not in HEAD_MODES:
            raise InvalidInputError(f"head_mode must be one of {HEAD_MODES}, got {head_mode!r}")
        if cache_mode not in CACHE_MODES:
            raise InvalidInputError(f"cache_mode must be one of {CACHE_MODES}, got {cache_mode!r}")
        self.num_layers = int(text_config.num_hidden_layers)
        self.num_heads = int(text_config.num_attention_heads)
        self.num_kv_heads = int(getattr(text_config, "num_key_value_heads", None) or self.num_heads)
        if self.num_heads % self.num_kv_heads:
            raise InvalidInputError(
                f"{self.num_heads} query heads do not split into {self.num_kv_heads} KV heads"
            )
        self.group_size = self.num_heads // self.num_kv_heads
        for layer in self.layers:
            if getattr(layer, "is_sliding", False) or not hasattr(layer, "keys"):
                raise InvalidInputError(
                    f"EvictingCache supports full-attention layers only, got {type(layer).__name__}"
                )
        self.head_mode = head_mode
        self.cache_mode = cache_mode
        self.policy_heads = self.num_kv_heads if head_mode == "per-head" else 1
        self.bank = PolicyRows(policies, self.num_layers, self.policy_heads, budget=budget,
                               head_mode=head_mode)
        self.budget = budget
        # Slots per layer: the budget plus one for the incoming token (grown when needed).
        known = [b for b in self.bank.budgets() if isinstance(b, int)]
        self.capacity_hint = max(known) + 1 if known else 64
        self._sync = Sync()
        # Slot bookkeeping ("reuse"), rows = (layer, policy head) layer-major.
        self._rows = self.num_layers * self.policy_heads
        self._row_index = np.arange(self._rows)
        # Flat indices into the (rows, held + 1) weights of the next step: the kept
        # positions' slots (kept order) and the new token's; see _evict_slots.
        self._gather: np.ndarray | None = None
        self._free_flat: np.ndarray | None = None
        self._write_table: np.ndarray | None = None
        self._steady_columns: np.ndarray | None = None
        self._write_index = torch.zeros((self.num_layers, self.num_kv_heads), dtype=torch.long)
        self._write_np = self._write_index.numpy()
        self._kv_offsets = np.arange(self.num_kv_heads, dtype=np.int64)
        self.layers = [
            SlotLayer(self._sync, self.capacity_hint, self._write_index[index])
            if cache_mode == "reuse"
            else CompactLayer(self._sync)
            for index in range(self.num_layers)
        ]
        self.next_position = 0
        self.decode_steps = 0
        self.compactions = 0
        self.policy_seconds = 0.0
        self.bookkeeping_seconds = 0.0
        self.forward_seconds = 0.0
        self.prefill_seconds = {"policy": 0.0, "bookkeeping": 0.0, "forward": 0.0}

    @classmethod
    def from_policy(
        cls,
        config: Any,
        policy: str,
        budget: int | None,
        options: PolicyOptions | None = None,
        *,
        head_mode: str = "per-head",
        cache_mode: str = "reuse",
        fused: bool = True,
        backend: str = "native",
    ) -> EvictingCache:
        """Build a cache for registry policy ``policy`` configured by ``options``
        (:class:`scissorhands.options.PolicyOptions`; default: the policy's defaults).

        ``fused`` (default): one policy object whose rows are every layer's heads (one
        call per step); otherwise one policy object per layer.  Same decisions.
        """
        if head_mode not in HEAD_MODES:
            raise InvalidInputError(f"head_mode must be one of {HEAD_MODES}, got {head_mode!r}")
        text_config = (
            config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        )
        heads = int(
            getattr(text_config, "num_key_value_heads", None) or text_config.num_attention_heads
        )
        bank = PolicyRows.build(policy, budget, options, num_layers=int(text_config.num_hidden_layers),
                                heads_per_layer=heads if head_mode == "per-head" else 1,
                                fused=fused, backend=backend, head_mode=head_mode)
        return cls(config, bank.policies[0] if bank.fused else bank.policies, head_mode=head_mode,
                   budget=budget, cache_mode=cache_mode)

    @property
    def policies(self) -> list[Any]:
        """The policy objects: one per layer, or the single fused one (``fused`` True)."""
        return self.bank.policies

    @property
    def fused(self) -> bool:
        """Whether one policy object holds every layer's rows."""
        return self.bank.fused

    # ---- inspection

    @property
    def update_seconds(self) -> float:
        """Seconds spent in the layers' ``update`` (inside the forward)."""
        return float(sum(getattr(layer, "update_seconds", 0.0) for layer in self.layers))

    def held_counts(self) -> list[int]:
        """Positions held per layer (every KV head holds the same count)."""
        return [layer.get_seq_length() for layer in self.layers]

    def kept_positions(self, layer: int) -> np.ndarray:
        """Positions held by ``layer``: ``uint32``, ``(num_kv_heads, n)``, in kept order
        (the policy's order: ascending)."""
        kept = self.bank.kept(layer)
        if self.policy_heads != self.num_kv_heads:
            kept = np.repeat(kept, self.num_kv_heads, axis=0)
        return kept

    def physical_slots(self, layer: int) -> np.ndarray:
        """The slot of each kept position of ``layer``: ``int64``, ``(num_kv_heads, n)``,
        aligned with :meth:`kept_positions` (``arange(n)`` in ``"compact"`` mode)."""
        if self.cache_mode == "compact" or self._gather is None:
            n = self.layers[layer].get_seq_length()
            return np.tile(np.arange(n, dtype=np.int64), (self.num_kv_heads, 1))
        held = self._sync.held
        slots = self._gather - (self._row_index * (held + 1))[:, None]
        slots = slots.reshape(self.num_layers, self.policy_heads, held)[layer]
        if self.policy_heads != self.num_kv_heads:
            slots = np.repeat(slots, self.num_kv_heads, axis=0)
        return slots.copy()

    def kept_keys_values(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``layer``'s held keys and values in kept order, ``(1, num_kv_heads, n, dim)``
        each (copies in ``"reuse"`` mode)."""
        cache_layer = self.layers[layer]
        if self.cache_mode == "compact" or self._gather is None:
            return cache_layer.keys, cache_layer.values
        index = torch.from_numpy(self.physical_slots(layer))[None, :, :, None]
        keys = cache_layer.keys.gather(2, index.expand(-1, -1, -1, cache_layer.keys.shape[-1]))
        values = cache_layer.values.gather(
            2, index.expand(-1, -1, -1, cache_layer.values.shape[-1])
        )
        return keys, values

    # ---- observation (called after each forward)

    def _check_attentions(self, attentions: Sequence[Any] | None, q: int) -> None:
        if (
            attentions is None
            or len(attentions) != self.num_layers
            or any(a is None for a in attentions)
        ):
            raise InvalidInputError(
                "the model returned no attention weights: load it with "
                "attn_implementation='eager' and call it with output_attentions=True"
            )
        for a in attentions:
            if a.dim() != 4 or a.shape[0] != 1 or a.shape[1] != self.num_heads or a.shape[2] != q:
                raise InvalidInputError(
                    f"unexpected attention shape {tuple(a.shape)}: "
                    f"expected (1, {self.num_heads}, {q}, kv)"
                )

    def _take_writes(self) -> None:
        """Check that every layer received exactly one write since the last observation."""
        sync = self._sync
        if sync.writes != self.num_layers:
            raise InvalidInputError(
                f"{sync.writes} layer writes for {self.num_layers} layers: " + OUT_OF_SYNC
            )
        sync.writes = 0
        sync.epoch += 1

    def _evict_compact(self, victims: np.ndarray) -> None:
        """Drop, in every layer, the keys/values at the victim slots (kept order = cache order).

        ``victims`` is ``(rows, k)`` (in ``mean`` mode a layer's one row applies to every
        KV head).  The survivors keep their order; one flat ``index_select`` per tensor.
        """
        k = victims.shape[1]
        if k == 0:
            return
        batch, heads, n, dim = self.layers[0].keys.shape
        layers = self.num_layers
        keep = np.ones((self._rows, n), dtype=bool)
        keep[self._row_index[:, None], victims] = False
        keep = keep.reshape(layers, self.policy_heads, n)
        if self.policy_heads != heads:
            keep = np.broadcast_to(keep, (layers, heads, n))
        # Row l: the flat indices h * n + j of layer l's survivors, head-major.
        survivors = torch.from_numpy(np.nonzero(keep.reshape(layers, heads * n))[1])
        survivors = survivors.view(layers, heads * (n - k)).to(self.layers[0].keys.device)
        for layer, index in zip(self.layers, survivors):
            vdim = layer.values.shape[-1]
            layer.keys = (
                layer.keys.reshape(heads * n, dim)
                .index_select(0, index)
                .view(batch, heads, n - k, dim)
            )
            layer.values = (
                layer.values.reshape(heads * n, vdim)
                .index_select(0, index)
                .view(batch, heads, n - k, vdim)
            )

    def _kv_rows(self, per_row: np.ndarray) -> np.ndarray:
        """``(rows, ...)`` -> ``(layers, num_kv_heads, ...)`` (``mean`` mode: repeated)."""
        shaped = per_row.reshape(self.num_layers, self.policy_heads, *per_row.shape[1:])
        if self.policy_heads == self.num_kv_heads:
            return shaped
        return np.broadcast_to(shaped, (self.num_layers, self.num_kv_heads, *per_row.shape[1:]))

    def _evict_slots(self, layout: np.ndarray, victims: np.ndarray) -> None:
        """Apply the victims in ``"reuse"`` mode (any count).

        ``layout`` ``(rows, m)``: the slot of each of the ``m`` positions the policies
        held before evicting (kept order, new tokens last); ``victims`` ``(rows, k)``:
        indices into it.  ``k == 0``: the next token goes to slot ``m``; ``k == 1``: into
        the victim's slot; ``k > 1``: the buffers are compacted.  (The steady state, one
        victim and the held count unchanged, takes the shorter path in
        :meth:`observe_decode`.)
        """
        rows, m = layout.shape
        k = victims.shape[1]
        held = m - k
        capacity = self.layers[0].keys.shape[-2]
        if k == 0:
            slots, free = layout, np.full(rows, m, dtype=np.int64)
        elif k == 1:
            victim = victims[:, 0]
            free = layout[self._row_index, victim]
            # Drop column `victim` of each row: the entries after it shift left by one.
            slots = np.where(np.arange(held) < victim[:, None], layout[:, :-1], layout[:, 1:])
        else:  # several victims (the prefill): gather the survivors into fresh buffers
            keep = np.ones(layout.shape, dtype=bool)
            keep[self._row_index[:, None], victims] = False
            survivors = layout[keep].reshape(rows, held)
            flat = self._kv_rows(survivors) + (self._kv_offsets * capacity)[:, None]
            flat_t = torch.from_numpy(flat.reshape(self.num_layers, -1))
            capacity = max(self.capacity_hint, held + 1)
            for layer, index in zip(self.layers, flat_t):
                new = []
                for old in (layer.keys, layer.values):
                    batch, heads, _, dim = old.shape
                    buffer = old.new_empty((batch, heads, capacity, dim))
                    buffer[:, :, :held] = (
                        old.view(-1, dim).index_select(0, index).view(batch, heads, held, dim)
                    )
                    new.append(buffer)
                layer.set_buffers(*new)
            self.compactions += 1
            slots = np.broadcast_to(np.arange(held, dtype=np.int64), (rows, held))
            free = np.full(rows, held, dtype=np.int64)
        if held + 1 > capacity:  # a policy holding more than its budget: grow
            capacity = max(2 * capacity, held + 1)
            for layer in self.layers:
                new = []
                for old in (layer.keys, layer.values):
                    buffer = old.new_empty((*old.shape[:2], capacity, old.shape[3]))
                    buffer[:, :, : old.shape[2]] = old
                    new.append(buffer)
                layer.set_buffers(*new)
        # Next step's weights are (rows, held + 1): keep the slots as flat indices into
        # them (`_gather`, `_free_flat`), and the table turning a free flat index into
        # the layer's write index h * capacity + slot.
        row_offsets = self._row_index * (held + 1)
        self._gather = slots + row_offsets[:, None]
        self._free_flat = free + row_offsets
        self._write_table = (self._kv_offsets * capacity)[None, :] - row_offsets.reshape(
            self.num_layers, self.policy_heads
        )
        np.add(
            self._free_flat.reshape(self.num_layers, self.policy_heads),
            self._write_table,
            out=self._write_np,
        )
        self._steady_columns = np.arange(held)
        self._sync.held = held

    def _evict_compacting(self, victims: np.ndarray) -> None:
        self._evict_compact(victims)
        self._sync.held = self.layers[0].keys.shape[-2]

    def observe_prefill(self, attentions: Sequence[Any]) -> None:
        """Feed the prompt's attention to every layer's policy, then evict to the budget.

        Parameters
        ----------
        attentions : sequence of torch.Tensor
            Per layer ``(1, num_heads, P, P)`` (the model's ``output_attentions``); each
            policy's ``prefill`` gets the ``(heads, P, P)`` group mean, lower-triangular,
            the diagonal ignored.

        Raises
        ------
        InvalidInputError
            Attention missing or of the wrong shape, cache not fresh, or out of sync.
        """
        if self.next_position != 0:
            raise InvalidInputError("prefill needs a fresh cache (nothing seen yet)")
        q = int(attentions[0].shape[-2]) if attentions and attentions[0] is not None else 0
        self._check_attentions(attentions, q)
        start = time.perf_counter()
        for index, layer in enumerate(self.layers):
            if layer.get_seq_length() != q:
                raise InvalidInputError(
                    f"layer {index} is not fresh: prefill needs a new cache and new policies"
                )
        if not self.bank.fresh():
            raise InvalidInputError("prefill needs new policies (holding only position 0)")
        self._take_writes()
        stacked = torch.cat([a.detach() for a in attentions], dim=0)  # (layers, heads, P, P)
        means = group_mean(stacked, self.policy_heads).reshape(self._rows, q, q)
        t0 = time.perf_counter()
        self.bank.prefill(means)
        victims = self.bank.call("evict")
        policy_s = time.perf_counter() - t0
        if self.cache_mode == "reuse":
            layout = np.broadcast_to(np.arange(q, dtype=np.int64), (self._rows, q))
            self._evict_slots(layout, victims)
        else:
            self._evict_compacting(victims)
        total = time.perf_counter() - start
        self.next_position = q
        self.policy_seconds += policy_s
        self.bookkeeping_seconds += total - policy_s
        self.prefill_seconds["policy"] += policy_s
        self.prefill_seconds["bookkeeping"] += total - policy_s

    def observe_decode(self, attentions: Sequence[Any]) -> None:
        """Feed one decode step's attention to every layer's policy and evict.

        Parameters
        ----------
        attentions : sequence of torch.Tensor
            Per layer ``(1, num_heads, 1, n + 1)``: the new token's weights over the
            ``n`` held positions and itself, in the cache's physical order (``"compact"``:
            kept order, the token last; ``"reuse"``: slot order).  Each policy gets the
            ``(heads, n)`` group mean in kept order without the token's own weight, not
            renormalised.

        Raises
        ------
        InvalidInputError
            Attention missing or of the wrong shape, or the cache out of sync with its
            policies (the model was called outside :func:`decode_step`).
        """
        if self.next_position == 0:
            raise InvalidInputError("decode before prefill: run prefill on the prompt first")
        start = time.perf_counter()
        n = self._sync.held
        try:  # one op for all layers (they all hold the same count)
            stacked = torch.cat(attentions, dim=0)
        except (TypeError, RuntimeError, ValueError):
            stacked = None
        if stacked is None or stacked.shape != (self.num_layers, self.num_heads, 1, n + 1):
            self._check_attentions(attentions, 1)
            raise InvalidInputError(
                f"attention over {attentions[0].shape[-1]} keys for {n} held positions plus "
                "the new token: " + OUT_OF_SYNC
            )
        self._take_writes()
        # Group mean: (rows, n + 1), in NumPy from here on.
        means = group_mean(stacked, self.policy_heads).reshape(self._rows, n + 1)
        if self.cache_mode == "reuse":
            # Slot order -> kept order; the token's own slot is not in the map.
            weights = np.take(means, self._gather)
        else:
            weights = np.ascontiguousarray(means[:, :n])
        pos = self.next_position
        t0 = time.perf_counter()
        victims = self.bank.call("step", pos, weights)
        policy_s = time.perf_counter() - t0
        if self.cache_mode == "compact":
            self._evict_compacting(victims)
        else:
            # Flat indices into this step's (rows, n + 1) weights, the new token last.
            layout = np.concatenate((self._gather, self._free_flat[:, None]), axis=1)
            if victims.shape[1] == 1:  # steady state: the token takes the victim's slot
                victim = victims[:, 0]
                self._free_flat = layout[self._row_index, victim]
                self._gather = np.where(
                    self._steady_columns < victim[:, None], layout[:, :-1], layout[:, 1:]
                )
                np.add(
                    self._free_flat.reshape(self.num_layers, self.policy_heads),
                    self._write_table,
                    out=self._write_np,
                )
            else:
                self._evict_slots(layout - (self._row_index * (n + 1))[:, None], victims)
        total = time.perf_counter() - start
        self.next_position = pos + 1
        self.decode_steps += 1
        self.policy_seconds += policy_s
        self.bookkeeping_seconds += total - policy_s
