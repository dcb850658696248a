"""``positions="cache"`` without a pass over every held key: keys kept at their ranks.

Per row (layer, sequence, KV head) the stored keys are kept rotated at ``rank + offset``
(``rank`` the key's index in the row's kept order, ``offset`` one integer per row), and
the query is turned to ``n + offset`` (``n`` the row's held count): the attention logits
depend only on the distance ``n - rank`` (RoPE's relative property), so they are those
of keys rotated at ranks ``0..n-1`` and a query at ``n`` (StreamingLLM, Xiao et al.,
ICLR 2024, §3.2).  ``storage.rope[row, slot]`` records the rotation each stored key has.

At each forward (its first evicting layer) :func:`rank_plan` compares, per held key, the
rotation it has with the one it needs; the offset of a row is chosen so that its last
held key needs none.  After a step that evicted one key in the older part of a row
(a policy with a recent window; StreamingLLM's victim next to its
sinks), only the keys before the victim turn, by one step; the newest keys, the recent
window, never move.  A new token's key turns once, from the position the model rotated
it with to its rank.  Each layer then turns its keys in place, records their rotations
and turns a copy of its query, in one C call (:meth:`RankPlan.apply`: ``sh_rope_layer``,
in double, rounded once to float32).

A failed forward needs no undoing here: what it turned is what the next forward would
turn (the plan depends only on what the cache held after the last step), and
``storage.rope`` always says what each key holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._native import check, ffi, lib
from ..errors import InvalidInputError, ScissorhandsError
from .storage import SLOT_DTYPE, SlotStorage

__all__ = ["EXACT_ROPE_TYPES", "RankPlan", "rank_plan", "rank_rotatable", "rotary_frequencies", "turns"]

#: The rotary types (``rope_type``) whose rotation is ``cos``/``sin`` of one fixed frequency
#: table times the position, times one constant (``attention_scaling``): a key rotated at
#: ``p`` turns to ``r`` exactly by the unscaled rotation of ``r - p``.  ``dynamic`` and
#: ``longrope`` change their frequencies with the longest position seen, so keys rotated
#: before and after a change cannot be turned to their ranks: refused.
EXACT_ROPE_TYPES = ("default", "linear", "yarn", "llama3", "proportional")


def rotary_frequencies(rotary: Any) -> str:
    """The name of ``rotary``'s attribute holding the frequencies of the full-attention
    layers (``inv_freq``; ``full_attention_inv_freq`` for a rotary module with one table
    per layer type, as Gemma-3's), read at each forward (it follows ``model.to``).

    Raises
    ------
    InvalidInputError
        The rotary type is not one of :data:`EXACT_ROPE_TYPES`, or the module has no such
        frequency table.
    """
    kind: Any = getattr(rotary, "rope_type", "default")
    name = "inv_freq"
    if isinstance(kind, dict):  # one rotary module for several layer types
        kind, name = kind.get("full_attention", "default"), "full_attention_inv_freq"
    if kind not in EXACT_ROPE_TYPES:
        raise InvalidInputError(
            f"positions='cache' turns keys to their ranks with one fixed frequency table; the model's rotary "
            f"embedding is {kind!r} ({type(rotary).__name__}), which it cannot turn exactly (it does "
            f"{', '.join(EXACT_ROPE_TYPES)}): build the cache with positions='original'")
    if not isinstance(getattr(rotary, name, None), torch.Tensor):
        raise InvalidInputError(f"positions='cache': the model's rotary embedding ({type(rotary).__name__}) has no "
                                f"{name} to turn keys with: build the cache with positions='original'")
    return name


def turns(inv_freq: torch.Tensor, angles: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` ``(1, n, 2 * half)`` in ``dtype`` of the turns by ``angles``
    ``(n,)`` positions: the rotary module's arithmetic (float32 products and cos/sin,
    rounded once to ``dtype``) without its ``attention_scaling``, which the keys and
    query it turns already carry."""
    freqs = angles[None, :, None].float() * inv_freq.to(device=angles.device, dtype=torch.float)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)

#: A table of every angle between the smallest and the largest turn while it has at most
#: this many rows more than the turns it serves; else the distinct turns only.
_RANGE_SLACK = 4096


def rank_rotatable(query: torch.Tensor, key: torch.Tensor) -> bool:
    """Whether the keys can be kept at their ranks (float32 CPU tensors outside autograd);
    else the cache turns every held key each step from the rotation it has."""
    return (query.dtype == torch.float32 and key.dtype == torch.float32 and key.device.type == "cpu"
            and query.device.type == "cpu" and not (query.requires_grad or key.requires_grad))


@dataclass
class RankPlan:
    """One forward's turns, every layer's (see the module docstring).

    ``cos``/``sin``: ``(turns, half)`` float64, one row per distinct turn; per key entry
    (rows layer-major, ``bounds[e]:bounds[e + 1]`` layer ``e``'s): its storage ``row``,
    ``slot``, element ``offset`` in its layer's key buffer, table row ``which`` and the
    rotation it ends at (``target``), its index in ``storage.rope`` flattened
    (``rope_index``, for rows ``rope_width`` wide); ``query_which``: ``(layers, batch *
    heads * q)`` the table row of every query vector (the vectors one after another)."""

    cos: np.ndarray
    sin: np.ndarray
    bounds: np.ndarray
    row: np.ndarray
    slot: np.ndarray
    offset: np.ndarray
    which: np.ndarray
    target: np.ndarray
    query_which: np.ndarray
    half: int
    rope_index: np.ndarray
    rope_width: int

    def __post_init__(self) -> None:
        # The arrays' addresses, taken once: each layer's call points into them.
        self._at: dict[str, int] = {}
        for name in ("cos", "sin", "offset", "which", "target", "query_which", "rope_index"):
            array = np.ascontiguousarray(getattr(self, name), dtype=np.float64 if name in ("cos", "sin") else np.int64)
            setattr(self, name, array)
            self._at[name] = array.ctypes.data

    def _i64(self, name: str, start: int) -> Any:
        """A C pointer to element ``start`` of the int64 array ``name``."""
        return ffi.cast("int64_t *", self._at[name] + 8 * start)

    def apply(self, e: int, storage: SlotStorage, query: torch.Tensor) -> torch.Tensor:
        """Turn layer ``e``'s stored keys in place (recording their rotations in
        ``storage.rope``) and return its query ``(batch, heads, q, head_dim)`` turned, a
        new contiguous tensor (one C call: ``sh_rope_layer``)."""
        keys = storage.keys[e]
        assert keys is not None and keys.is_contiguous()
        lo, hi = int(self.bounds[e]), int(self.bounds[e + 1])
        rope = storage.c_array("rope", np.int64)
        index = None  # the turned keys' places in rope, when it is no longer as wide as planned
        if rope.shape[1] != self.rope_width:
            index = np.ascontiguousarray(self.row[lo:hi] * rope.shape[1] + self.slot[lo:hi])
        source = query if query.is_contiguous() else query.contiguous()
        turned = torch.empty_like(source, memory_format=torch.contiguous_format)
        head_dim = int(source.shape[-1])
        count = self.query_which.shape[1]
        check(lib.sh_rope_layer(ffi.cast("float *", keys.data_ptr()), keys.numel(), self._i64("offset", lo),
                                self._i64("which", lo), hi - lo, ffi.cast("int64_t *", rope.ctypes.data), rope.size,
                                self._i64("rope_index", lo) if index is None
                                else ffi.cast("int64_t *", index.ctypes.data), self._i64("target", lo),
                                ffi.cast("const float *", source.data_ptr()), ffi.cast("float *", turned.data_ptr()),
                                source.numel(), head_dim, self._i64("query_which", e * count), count,
                                ffi.cast("const double *", self._at["cos"]),
                                ffi.cast("const double *", self._at["sin"]), len(self.cos), self.half),
              "rerotate")
        return turned


def rank_plan(storage: SlotStorage, admitted: np.ndarray | None, positions: np.ndarray, inv_freq: np.ndarray,
              groups: int, head_dim: int) -> RankPlan:
    """The turns of a forward whose new tokens sit at ``storage.new_columns()``.

    Parameters
    ----------
    storage : SlotStorage
        The cache's layout, the forward planned (its new keys' rotations in ``rope``).
    admitted : numpy.ndarray or None
        ``(rows, q)`` bool: the new tokens that take a rank (padding does not); None: all.
    positions : numpy.ndarray
        ``(batch, q)`` int64: the rotary positions the model rotated the new tokens with.
    inv_freq : numpy.ndarray
        ``(half,)``: the rotary embedding's frequencies (radians per position).
    groups : int
        Query heads per KV head.
    head_dim : int
        Elements per key and query vector.
    """
    rows, batch, heads, layers = storage.rows, storage.batch, storage.heads, storage.layers
    per_layer = batch * heads
    q = storage.q
    counts = np.ascontiguousarray(storage.counts, dtype=np.int64)
    slots, rope = storage.c_array("slots", SLOT_DTYPE), storage.c_array("rope", np.int64)
    steps = np.ones((rows, q), dtype=np.int64) if admitted is None else admitted.astype(np.int64)
    new_rank = np.ascontiguousarray(counts[:, None] + np.cumsum(steps, axis=1) - steps)  # (rows, q)
    new_slots = np.ascontiguousarray(storage.new_columns(), dtype=np.int64)
    # Which keys turn, row after row (one C pass over the held slots): sh_rope_turns.
    room = int(counts.sum()) + rows * q
    offset = np.empty(rows, dtype=np.int64)
    out = np.empty((4, max(room, 1)), dtype=np.int64)
    i64 = "int64_t *"
    n = lib.sh_rope_turns(ffi.from_buffer("int32_t[]", slots), slots.shape[1], ffi.cast(i64, counts.ctypes.data),
                          ffi.cast(i64, rope.ctypes.data), rope.shape[1], rows,
                          ffi.cast(i64, new_slots.ctypes.data), ffi.cast(i64, new_rank.ctypes.data), q,
                          ffi.cast(i64, offset.ctypes.data), *(ffi.cast(i64, out[k].ctypes.data) for k in range(4)),
                          room)
    if n < 0:
        raise ScissorhandsError("positions='cache': the cache's slot table is inconsistent (sh_rope_turns)")
    row, slot, key_turn, target = (out[k, :n] for k in range(4))
    per_row = np.broadcast_to(positions[None, :, None, :], (layers, batch, heads, q)).reshape(rows, q)
    new_turn = new_rank + offset[:, None] - per_row
    query_turn = np.repeat(new_turn.reshape(layers, batch, heads, 1, q), groups, axis=3).reshape(layers, -1)
    every = np.concatenate((key_turn, query_turn.reshape(-1)))
    low, high = int(every.min()), int(every.max())
    if high - low <= every.size + _RANGE_SLACK:
        angles = np.arange(low, high + 1, dtype=np.float64)
        which = every - low
    else:
        angles, which = np.unique(every, return_inverse=True)
        angles = angles.astype(np.float64)
    which = np.ascontiguousarray(which, dtype=np.int64).reshape(-1)
    theta = angles[:, None] * np.asarray(inv_freq, dtype=np.float64)[None, :]
    capacity = storage.capacity
    return RankPlan(
        cos=np.ascontiguousarray(np.cos(theta)), sin=np.ascontiguousarray(np.sin(theta)),
        bounds=np.searchsorted(row, np.arange(layers + 1) * per_layer),
        row=row, slot=slot, offset=((row % per_layer) * capacity + slot) * head_dim,
        which=np.ascontiguousarray(which[: len(key_turn)]), target=target,
        query_which=np.ascontiguousarray(which[len(key_turn):].reshape(layers, -1)),
        half=int(theta.shape[1]), rope_index=row * rope.shape[1] + slot, rope_width=int(rope.shape[1]))
