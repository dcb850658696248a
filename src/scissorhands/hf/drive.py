"""Driving a model with an evicting cache without ``generate``: a forward per call, and
the teacher-forced batch that ``eval`` measures.

``model.generate(**inputs, cache=cache)`` is the way to generate; :func:`prefill` and
:func:`decode_step` are the two forwards a hand-written loop needs, and
:func:`evaluate_batch` runs every configuration of an ``eval`` as one batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ..errors import InvalidInputError
from . import attention
from .cache import EvictingCache
from .hindsight import tap_attention
from .rows import PolicyConfig

__all__ = ["decode_step", "evaluate_batch", "prefill"]


def _ids(input_ids: Any, what: str) -> tuple[torch.Tensor, bool]:
    """``input_ids`` as a ``(batch, length)`` long tensor, and whether it came 1-D."""
    try:
        ids = torch.as_tensor(input_ids, dtype=torch.long)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise InvalidInputError(f"{what} must be token ids, got {type(input_ids).__name__}: {exc}") from None
    single = ids.dim() <= 1
    ids = ids.reshape(1, -1) if single else ids
    if ids.dim() != 2 or ids.shape[1] == 0:
        raise InvalidInputError(f"{what} must be (batch, length) with length >= 1, got shape {tuple(ids.shape)}")
    return ids, single


def _forward(model: Any, cache: EvictingCache, ids: torch.Tensor, attention_mask: Any) -> torch.Tensor:
    attention.install(model)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=attention_mask, cache=cache, use_cache=True)
    return out.logits.float()


def prefill(model: Any, cache: EvictingCache, input_ids: Any, attention_mask: Any = None) -> torch.Tensor:
    """Run a prompt (or a new turn) through ``model`` with ``cache``; the policies see its
    causal attention and the cache evicts down to the budget.

    Parameters
    ----------
    input_ids : array-like of int
        ``(P,)`` or ``(batch, P)``.
    attention_mask : array-like, optional
        ``(batch, tokens seen + P)``, 0 for padding (never admitted).

    Returns
    -------
    torch.Tensor
        Logits, float32: ``(P, vocab)`` for 1-D ids, else ``(batch, P, vocab)``.
    """
    ids, single = _ids(input_ids, "input_ids")
    logits = _forward(model, cache, ids, attention_mask)
    return logits[0] if single else logits


def decode_step(model: Any, cache: EvictingCache, tokens: Any) -> torch.Tensor:
    """One token per sequence at the next position. ``tokens``: an int, ``(batch,)`` or
    ``(batch, 1)``. Returns logits ``(vocab,)`` for an int, else ``(batch, vocab)``.

    Raises
    ------
    InvalidInputError
        More than one token per sequence, or nothing in the cache yet.
    """
    if cache.seen == 0:
        raise InvalidInputError("decode before prefill: run prefill on the prompt first")
    single = isinstance(tokens, (int, np.integer))
    ids = torch.as_tensor(tokens, dtype=torch.long).reshape(-1, 1) if not single else torch.tensor([[int(tokens)]])
    if ids.shape[1] != 1:
        raise InvalidInputError(f"decode_step takes one token per sequence, got shape {tuple(ids.shape)}")
    logits = _forward(model, cache, ids, None)[:, -1]
    return logits[0] if single else logits


def evaluate_batch(model: Any, ids: Sequence[int], configs: Sequence[PolicyConfig], *,
                   prompt_tokens: int = 64, head_mode: str = "per-head", cache_mode: str = "reuse",
                   progress: Callable[[int], Any] | None = None,
                   attention_sink: Callable[[int, np.ndarray], Any] | None = None) -> list[dict[str, Any]]:
    """Run every configuration teacher-forced over the same ``ids``, as one batch.

    Sequence ``i`` of the batch is ``ids`` with configuration ``configs[i]``: the first
    ``prompt_tokens`` in one forward (the policies' prompt chunk), then one token per
    forward.  A :class:`~scissorhands.hf.hindsight.HindsightConfig` replays its schedule.

    Parameters
    ----------
    attention_sink : callable, optional
        Only with configurations that never evict (the full cache): called after each
        decode step with the step's position ``t`` and its attention, ``float32`` ``(rows,
        t)`` (:func:`~scissorhands.hf.hindsight.tap_attention`); the time it takes (and,
        under ``sdpa``, computing the rows for it) is ``tap_seconds``, left out of
        ``forward_seconds``.

    Raises
    ------
    InvalidInputError
        ``attention_sink`` with a configuration that evicts.

    Returns
    -------
    list of dict
        Per configuration: ``nll`` (float64 ``(N-1,)``, row ``r`` the negative
        log-likelihood of token ``r + 1``), ``argmax`` (int64 ``(N-1,)``), ``held``
        (int64 ``(steps, layers)``: positions held per layer after each decode step, the
        largest over its KV heads), ``decode_steps``, and seconds over the decode steps:
        ``policy_seconds`` (the batch's policy calls), ``bookkeeping_seconds``,
        ``rows_seconds``, ``forward_seconds`` (the batch's forwards, policy and cache
        included) and ``update_seconds``; ``prefill_seconds`` (policy, bookkeeping,
        forward), ``compactions`` and ``tap_seconds`` (0 without ``attention_sink``).
    """
    n = len(ids)
    batch = len(configs)
    cache = EvictingCache(model.config, configs=configs, head_mode=head_mode, cache_mode=cache_mode)
    tap = None if attention_sink is None else tap_attention(cache, attention_sink)
    tokens = torch.tensor(list(ids), dtype=torch.long)
    nll = np.empty((batch, n - 1), dtype=np.float64)
    argmax = np.empty((batch, n - 1), dtype=np.int64)
    held: list[np.ndarray] = []  # per decode step, (layers, batch)
    start = time.perf_counter()
    logits = prefill(model, cache, tokens[:prompt_tokens].expand(batch, -1))
    prefill_forward = time.perf_counter() - start
    rows = min(prompt_tokens, n - 1)
    logp = torch.log_softmax(logits[:, :rows].double(), dim=-1)
    nll[:, :rows] = (-logp.gather(2, tokens[1 : rows + 1].expand(batch, -1)[..., None])[..., 0]).numpy()
    argmax[:, :rows] = logits[:, :rows].argmax(dim=-1).numpy()
    stats = cache.stats
    after_prefill = (stats.policy_seconds, stats.bookkeeping_seconds, stats.rows_seconds, stats.update_seconds)
    assert cache.bank is not None
    bank = cache.bank
    policy_after_prefill = list(bank.seconds)
    if progress is not None:
        progress(1)
    forward = _decode_all(model, cache, tokens, ids, prompt_tokens, nll, argmax, held, progress)
    tapped = 0.0
    if tap is not None:
        tap.remove()
        # The tap's work (and the rows sdpa computed only for it) is not the full cache's.
        tapped = tap.seconds + (stats.rows_seconds - after_prefill[2])
        forward -= tapped
    steps = len(held)
    held_array = np.stack(held, axis=0) if held else np.zeros((0, cache.evicting_layers, batch), dtype=np.int64)
    out = []
    for i in range(batch):
        g = bank.group_of(i)
        out.append({
            "nll": nll[i],
            "argmax": argmax[i],
            "held": held_array[:, :, i],
            "decode_steps": steps,
            "batch": batch,
            "policy_seconds": bank.seconds[g] - policy_after_prefill[g],
            "bookkeeping_seconds": stats.bookkeeping_seconds - after_prefill[1],
            "rows_seconds": stats.rows_seconds - after_prefill[2],
            "forward_seconds": forward,
            "update_seconds": stats.update_seconds - after_prefill[3],
            "prefill_seconds": {"policy": policy_after_prefill[g], "bookkeeping": after_prefill[1],
                                "forward": prefill_forward},
            "compactions": stats.compactions,
            "tap_seconds": tapped,
        })
    return out


def _decode_all(model: Any, cache: EvictingCache, tokens: torch.Tensor, ids: Sequence[int], prompt_tokens: int,
                nll: np.ndarray, argmax: np.ndarray, held: list[np.ndarray],
                progress: Callable[[int], Any] | None) -> float:
    """Teacher-force the tokens after the prompt one forward each, filling ``nll``,
    ``argmax`` and ``held`` in place; returns the forwards' seconds."""
    batch = nll.shape[0]
    forward = 0.0
    for t in range(prompt_tokens, len(ids) - 1):
        step_start = time.perf_counter()
        logits = decode_step(model, cache, tokens[t].expand(batch))
        forward += time.perf_counter() - step_start
        logp = torch.log_softmax(logits.double(), dim=-1)
        nll[:, t] = -logp[:, ids[t + 1]].numpy()
        argmax[:, t] = logits.argmax(dim=-1).numpy()
        held.append(cache.held_counts().max(axis=2))  # (layers, batch)
        if progress is not None:
            progress(1)
    return forward
