"""Recording a real model's full-cache attention as a trace (``record``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache

from ..errors import InvalidInputError
from .drive import as_batch_of_one, cache_keyword, check_model
from .gqa import group_mean

__all__ = ["record_attention"]


def record_attention(
    model: Any,
    input_ids: Any,
    *,
    layers: Sequence[int] | None = None,
    prompt_tokens: int = 64,
    progress: Any = None,
) -> np.ndarray:
    """Record the full-cache attention of every decode step, per (layer, KV head).

    The prompt (first ``prompt_tokens`` tokens) is consumed in one forward, then one
    token per step, with nothing evicted.  Step ``t`` (``t = 1 .. N-1``) is token ``t``'s
    attention over positions ``0 .. t-1``: the mean over the query heads of each GQA
    group, its weight on itself excluded, not renormalised (exactly what a policy sees).

    Parameters
    ----------
    model : transformers causal LM, eager attention
    input_ids : array-like of int
        ``(N,)`` or ``(1, N)``, ``N >= 2``.
    layers : sequence of int, optional
        The layers to keep (default: all), in the order given.
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
        Non-eager attention, batch > 1, fewer than two tokens, or a layer out of range.
    """
    check_model(model)
    ids = as_batch_of_one(input_ids)
    n = int(ids.shape[1])
    if n < 2:
        raise InvalidInputError("recording needs at least two tokens")
    text_config = model.config.get_text_config(decoder=True)
    num_layers = int(text_config.num_hidden_layers)
    num_heads = int(text_config.num_attention_heads)
    kv_heads = int(getattr(text_config, "num_key_value_heads", None) or num_heads)
    selected = list(range(num_layers)) if layers is None else [int(i) for i in layers]
    if not selected or any(i < 0 or i >= num_layers for i in selected):
        raise InvalidInputError(f"layers must be in [0, {num_layers}), got {selected}")
    prompt = max(1, min(int(prompt_tokens), n))
    out = np.empty((len(selected), kv_heads, n * (n - 1) // 2), dtype=np.float16)
    cache = DynamicCache(config=model.config)
    keyword = cache_keyword(model)

    def grouped(weights: torch.Tensor) -> np.ndarray:
        return group_mean(weights, kv_heads)  # (heads, q, kv) -> (kv_heads, q, kv)

    with torch.no_grad():
        result = model(
            input_ids=ids[:, :prompt],
            position_ids=torch.arange(prompt)[None, :],
            use_cache=True,
            output_attentions=True,
            **{keyword: cache},
        )
        if result.attentions is None or any(a is None for a in result.attentions):
            raise InvalidInputError(
                "the model returned no attention weights (eager attention needed)"
            )
        for row, layer in enumerate(selected):
            weights = grouped(result.attentions[layer][0])
            for t in range(1, prompt):
                out[row, :, t * (t - 1) // 2 : t * (t + 1) // 2] = weights[:, t, :t]
        if progress is not None:
            progress(prompt)
        for t in range(prompt, n):
            result = model(
                input_ids=ids[:, t : t + 1],
                position_ids=torch.tensor([[t]]),
                use_cache=True,
                output_attentions=True,
                **{keyword: cache},
            )
            start = t * (t - 1) // 2
            for row, layer in enumerate(selected):
                out[row, :, start : start + t] = grouped(result.attentions[layer][0])[:, 0, :t]
            if progress is not None:
                progress(1)
    return out
