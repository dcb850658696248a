"""The one reduction every real-model number depends on: from query heads to KV heads.

A policy row sees, per KV head, the mean of its GQA group's query-head weights (or, in
``mean`` head mode, the mean over every query head of the layer), without the token's
weight on itself, not renormalised.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["group_mean"]


def group_mean(weights: torch.Tensor, rows: int) -> np.ndarray:
    """Mean over each group of query heads, as float32 NumPy.

    Parameters
    ----------
    weights : torch.Tensor
        ``(..., num_heads, q, kv)`` attention weights, any float dtype.
    rows : int
        Rows per leading index: the KV heads (``per-head``), or 1 (``mean``); must
        divide ``num_heads``, the heads of one row being consecutive.

    Returns
    -------
    numpy.ndarray
        ``(..., rows, q, kv)`` float32: the group's weights added in head order, then
        divided by the group's size (every weight widened exactly from its dtype first).
    """
    shape = weights.shape
    grouped = weights.detach().float().numpy().reshape(*shape[:-3], rows, -1, shape[-2], shape[-1])
    total = grouped[..., 0, :, :].copy()
    for head in range(1, grouped.shape[-3]):
        total += grouped[..., head, :, :]
    total /= np.float32(grouped.shape[-3])
    return total
