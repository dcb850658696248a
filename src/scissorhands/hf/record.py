"""Recording a real model's full-cache attention as a trace (``record``).

The model runs with an :class:`~scissorhands.hf.cache.EvictingCache` of the ``full``
policy, which never evicts, so slot ``s`` holds position ``s``; what the installed
attention hands the cache each step is what a policy would see, and is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ..errors import InvalidInputError
from .cache import EvictingCache
from .drive import decode_step, prefill
from .gqa import group_mean

__all__ = ["record_attention"]


def record_attention(
    model: Any,
    input_ids: Any,
    *,
    layers: Sequence[int] | None = None,
    prompt_tokens: int = 64,
    progress: Callable[[int], Any] | None = None,
) -> np.ndarray:
    """Record the full-cache attention of every decode step, per (layer, KV head).

    The prompt (first ``prompt_tokens`` tokens) is consumed in one forward, then one
    token per step, with nothing evicted.  Step ``t`` (``t = 1 .. N-1``) is token ``t``'s
    attention over positions ``0 .. t-1``: the mean over the query heads of each GQA
    group, its weight on itself excluded, not renormalised (exactly what a policy sees).
    Any attention implementation the cache can wrap works (``eager`` gives its own
    weights; under ``sdpa`` they are computed from the query and the keys).

    Parameters
    ----------
    model : transformers causal LM
    input_ids : array-like of int
        ``(N,)`` or ``(1, N)``, ``N >= 2``.
    layers : sequence of int, optional
        The model layers to keep (default: all), in the order given; full-attention
        layers only.
    prompt_tokens : int, default 64
        Tokens consumed by the first forward (clipped to ``N``).
    progress : callable, optional
        Called with the number of tokens processed after each forward (a tqdm ``update``).

    Returns
    -------
    numpy.ndarray
        ``float16`` of shape ``(len(layers), num_kv_heads, N * (N - 1) // 2)``: the steps
        packed one after another, step ``t`` at offset ``t * (t - 1) // 2``, length ``t``.

    Raises
    ------
    InvalidInputError
        Batch > 1, fewer than two tokens, or a layer out of range or not full attention.
    """
    ids = torch.as_tensor(input_ids, dtype=torch.long).reshape(1, -1) if np.ndim(input_ids) <= 1 else \
        torch.as_tensor(input_ids, dtype=torch.long)
    if ids.shape[0] != 1:
        raise InvalidInputError(f"record_attention takes one sequence, got a batch of {ids.shape[0]}")
    n = int(ids.shape[1])
    if n < 2:
        raise InvalidInputError("recording needs at least two tokens")
    cache = EvictingCache(model.config, "full", None)
    num_layers = len(cache.layers)
    selected = list(range(num_layers)) if layers is None else [int(i) for i in layers]
    if not selected or any(i < 0 or i >= num_layers for i in selected):
        raise InvalidInputError(f"layers must be in [0, {num_layers}), got {selected}")
    kv_heads = cache.num_kv_heads
    full = set(cache.observed_layers)
    for i in selected:
        if i not in full:
            raise InvalidInputError(f"layer {i} is not one of the cache's full-attention layers")
    out = np.empty((len(selected), kv_heads, n * (n - 1) // 2), dtype=np.float16)
    seen: dict[int, np.ndarray] = {}
    wanted = set(selected)

    def keep(layer: int, weights: torch.Tensor) -> None:
        if layer in wanted:
            seen[layer] = group_mean(weights.cpu(), kv_heads)[0]  # (kv_heads, q, t + q)

    cache.add_observer(keep)
    prompt = max(1, min(int(prompt_tokens), n))
    prefill(model, cache, ids[:, :prompt])
    for row, layer in enumerate(selected):
        weights = seen[layer]
        for t in range(1, prompt):
            out[row, :, t * (t - 1) // 2 : t * (t + 1) // 2] = weights[:, t, :t]
    if progress is not None:
        progress(prompt)
    for t in range(prompt, n):
        decode_step(model, cache, ids[:, t])
        start = t * (t - 1) // 2
        for row, layer in enumerate(selected):
            out[row, :, start : start + t] = seen[layer][:, 0, :t]
        if progress is not None:
            progress(1)
    return out
