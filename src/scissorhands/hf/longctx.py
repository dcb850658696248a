"""One long-context run: a text read to growing lengths, a window decoded at each.

The text is consumed in chunks (a prompt in bounded memory: the cache evicts after each
chunk) up to ``length - window``; then ``window`` tokens are decoded one per forward,
teacher-forced, and measured: milliseconds per decode step, the window's perplexity,
the KV bytes held, the process's resident memory.  The next length continues from
there, so one run covers every length at the cost of the longest.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache

from ..errors import InvalidInputError
from ..options import PolicyOptions
from .cache import EvictingCache

__all__ = ["long_context_run", "resident_bytes"]


def resident_bytes() -> int:
    """The process's resident memory now (Linux ``/proc/self/statm``; 0 elsewhere)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            pages = int(handle.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    import resource

    return pages * resource.getpagesize()


def _dynamic_bytes(cache: DynamicCache) -> tuple[int, int]:
    """(positions held, bytes of keys and values) of a stock cache."""
    held, total = 0, 0
    for layer in cache.layers:
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if keys is None or values is None or keys.numel() == 0:
            continue
        held = max(held, int(keys.shape[-2]))
        total += keys.numel() * keys.element_size() + values.numel() * values.element_size()
    return held, total


def long_context_run(model: Any, ids: Sequence[int], lengths: Sequence[int], *, policy: str = "full",
                     budget: int | None = None, options: PolicyOptions | None = None, positions: str = "original",
                     window: int = 128, chunk: int = 256, backend: str = "native",
                     progress: Callable[[int], Any] | None = None) -> list[dict[str, Any]]:
    """Measure one configuration at every length of ``lengths`` (ascending).

    ``policy="full"`` runs transformers' own ``DynamicCache`` (the baseline); any other
    policy an :class:`EvictingCache` (installed in ``model``).

    Returns
    -------
    list of dict
        Per length: ``length``, ``ms_per_step`` (mean over the window), ``perplexity``
        (the window's tokens, teacher-forced), ``kv_positions`` (held per layer and KV
        head at the window's end), ``kv_bytes``, ``rss_bytes`` (resident memory at the
        window's end) and, for an evicting cache, ``policy_ms_per_step``,
        ``bookkeeping_ms_per_step`` and ``rerotate_ms_per_step``.

    Raises
    ------
    InvalidInputError
        Lengths not ascending, shorter than the window, or beyond the text.
    """
    lengths = [int(n) for n in lengths]
    if lengths != sorted(set(lengths)) or lengths[0] <= window or lengths[-1] > len(ids):
        raise InvalidInputError(f"lengths must ascend, exceed the window ({window}) and fit the text "
                                f"({len(ids)} tokens), got {lengths}")
    tokens = torch.tensor(list(ids[: lengths[-1]]), dtype=torch.long)[None]
    evicting = policy != "full"
    if evicting:
        cache: Any = EvictingCache.from_model(model, policy, budget, options, positions=positions, backend=backend)
    else:
        cache = DynamicCache(config=model.config)
    seen = 0
    out = []

    def forward(piece: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return model(input_ids=piece, cache=cache, use_cache=True).logits[0].float()

    for length in lengths:
        target = length - window
        while seen < target:
            step = min(chunk, target - seen)
            forward(tokens[:, seen : seen + step])
            seen += step
            if progress is not None:
                progress(step)
        before = None if not evicting else (cache.stats.policy_seconds, cache.stats.bookkeeping_seconds,
                                            cache.stats.rerotate_seconds)
        nll = []
        start = time.perf_counter()
        for t in range(seen, length):
            logits = forward(tokens[:, t : t + 1])[-1]
            if t + 1 < tokens.shape[1]:
                nll.append(float(-torch.log_softmax(logits.double(), -1)[tokens[0, t + 1]]))
            if progress is not None:
                progress(1)
        seconds = time.perf_counter() - start
        seen = length
        steps = length - target
        row: dict[str, Any] = {"length": length, "ms_per_step": 1e3 * seconds / steps,
                               "perplexity": math.exp(float(np.mean(nll))) if nll else None,
                               "rss_bytes": resident_bytes()}
        if evicting:
            held = int(cache.held_counts().max(initial=0))
            row.update(kv_positions=held, kv_bytes=cache.kv_bytes(held))
            stats = cache.stats
            assert before is not None
            row.update(policy_ms_per_step=1e3 * (stats.policy_seconds - before[0]) / steps,
                       bookkeeping_ms_per_step=1e3 * (stats.bookkeeping_seconds - before[1]) / steps,
                       rerotate_ms_per_step=1e3 * (stats.rerotate_seconds - before[2]) / steps)
        else:
            held, size = _dynamic_bytes(cache)
            row.update(kv_positions=held, kv_bytes=size)
        out.append(row)
    return out
