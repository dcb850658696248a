"""The library's own decode loop: a prompt in one forward, then one token per step.

:func:`prefill`, :func:`decode_step` and :func:`generate` drive a model with an
:class:`~scissorhands.hf.cache.EvictingCache` on eager attention, handing the weights
the model returns to the cache; :func:`evaluate_policy` is the teacher-forced run of
``eval``.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..errors import InvalidInputError
from ..options import PolicyOptions
from .cache import EvictingCache

__all__ = ["check_model", "decode_step", "evaluate_policy", "generate", "prefill"]



def check_model(model: Any) -> None:
    """Raise unless ``model`` uses eager attention (the only one that returns weights).

    Raises
    ------
    InvalidInputError
        ``model.config._attn_implementation`` is not ``"eager"``.
    """
    impl = getattr(model.config, "_attn_implementation", None)
    if impl != "eager":
        raise InvalidInputError(
            f"KV-cache eviction needs the attention weights, which only eager attention returns: "
            f"load the model with attn_implementation='eager' (got {impl!r})"
        )


def cache_keyword(model: Any) -> str:
    """The forward keyword for the cache: ``cache`` (transformers >= 5.x) or ``past_key_values``."""
    keyword = getattr(model, "_scissorhandscache_keyword", None)
    if keyword is None:
        parameters = inspect.signature(model.forward).parameters
        keyword = "cache" if "cache" in parameters else "past_key_values"
        with contextlib.suppress(AttributeError):  # exotic wrappers: look it up each time
            model._scissorhandscache_keyword = keyword
    return keyword


def as_batch_of_one(input_ids: Any) -> torch.Tensor:
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.dim() == 0:
        ids = ids.reshape(1, 1)
    elif ids.dim() == 1:
        ids = ids[None, :]
    if ids.dim() != 2:
        raise InvalidInputError(f"input_ids must be (batch, length), got shape {tuple(ids.shape)}")
    if ids.shape[0] != 1:
        raise InvalidInputError(
            f"batch size {ids.shape[0]} is not supported: each sequence keeps its own "
            "positions, run one EvictingCache per sequence"
        )
    if ids.shape[1] == 0:
        raise InvalidInputError("input_ids is empty")
    return ids


def _forward(model: Any, cache: EvictingCache, ids: torch.Tensor, positions: torch.Tensor) -> Any:
    kwargs = {cache_keyword(model): cache}
    return model(
        input_ids=ids,
        position_ids=positions,
        use_cache=True,
        output_attentions=True,
        **kwargs,
    )


def prefill(model: Any, cache: EvictingCache, input_ids: Any) -> torch.Tensor:
    """Consume a prompt in one forward, prefill the policies and evict to the budget.

    Parameters
    ----------
    model : transformers causal LM, eager attention
    cache : EvictingCache
        Fresh (nothing seen yet).
    input_ids : array-like of int
        ``(P,)`` or ``(1, P)``.

    Returns
    -------
    torch.Tensor
        Logits ``(P, vocab)``, float32: row ``i`` predicts token ``i + 1``.

    Raises
    ------
    InvalidInputError
        Non-eager attention, batch > 1, empty prompt, or a cache that is not fresh.
    """
    check_model(model)
    ids = as_batch_of_one(input_ids)
    if cache.next_position != 0:
        raise InvalidInputError("prefill needs a fresh cache (nothing seen yet)")
    positions = torch.arange(ids.shape[1], dtype=torch.long)[None, :]
    with torch.no_grad():
        t0 = time.perf_counter()
        out = _forward(model, cache, ids, positions)
        forward_s = time.perf_counter() - t0
        cache.forward_seconds += forward_s
        cache.prefill_seconds["forward"] += forward_s
        cache.observe_prefill(out.attentions)
    return out.logits[0].float()


def decode_step(model: Any, cache: EvictingCache, token: Any) -> torch.Tensor:
    """Run one token at the next true position, update the policies and evict.

    Parameters
    ----------
    model : transformers causal LM, eager attention
    cache : EvictingCache
        Already prefilled.
    token : int or array-like
        One token id (``int``, ``(1,)`` or ``(1, 1)``).

    Returns
    -------
    torch.Tensor
        Logits ``(vocab,)``, float32, predicting the following token.

    Raises
    ------
    InvalidInputError
        Non-eager attention, batch > 1, more than one token, or no prefill yet.
    """
    check_model(model)
    ids = as_batch_of_one(token)
    if ids.shape[1] != 1:
        raise InvalidInputError(f"decode_step takes one token, got {ids.shape[1]}")
    if cache.next_position == 0:
        raise InvalidInputError("decode before prefill: run prefill on the prompt first")
    positions = torch.tensor([[cache.next_position]], dtype=torch.long)
    with torch.no_grad():
        t0 = time.perf_counter()
        out = _forward(model, cache, ids, positions)
        cache.forward_seconds += time.perf_counter() - t0
        cache.observe_decode(out.attentions)
    return out.logits[0, -1].float()


def generate(
    model: Any,
    cache: EvictingCache,
    input_ids: Any,
    max_new_tokens: int,
    *,
    eos_token_id: int | None = None,
) -> list[int]:
    """Greedy generation with eviction: prefill the prompt, then decode step by step.

    Returns
    -------
    list of int
        The generated token ids (without the prompt), stopping early at ``eos_token_id``.
    """
    logits = prefill(model, cache, input_ids)[-1]
    generated: list[int] = []
    while len(generated) < max_new_tokens:
        token = int(torch.argmax(logits))
        generated.append(token)
        if (eos_token_id is not None and token == eos_token_id) or len(generated) == max_new_tokens:
            break
        logits = decode_step(model, cache, token)
    return generated


def evaluate_policy(
    model: Any,
    ids: Sequence[int],
    policy: str,
    budget: int | None,
    options: PolicyOptions | None = None,
    *,
    prompt_tokens: int = 64,
    head_mode: str = "per-head",
    cache_mode: str = "reuse",
    backend: str = "native",
    progress: Any = None,
) -> dict[str, Any]:
    """Run one policy teacher-forced over ``ids``; return per-target arrays and timings.

    Returns
    -------
    dict
        ``nll`` (float64, ``(N-1,)``: row ``r`` is the negative log-likelihood of token
        ``r + 1``), ``argmax`` (int64, ``(N-1,)``), ``held`` (int64, ``(steps, layers)``:
        positions held per layer after each decode step), ``decode_steps``, and seconds:
        ``policy_seconds``, ``bookkeeping_seconds``, ``forward_seconds`` (decode steps
        only), ``update_seconds`` (the part of the forward spent writing keys and values
        into the cache, decode steps only), ``prefill_seconds`` (a dict of policy,
        bookkeeping and forward for the prefill) and ``compactions``.

    ``options`` configure the policy (:class:`scissorhands.options.PolicyOptions`;
    default: every option at the policy's default).
    """
    cache = EvictingCache.from_policy(model.config, policy, budget, options, head_mode=head_mode,
                                      cache_mode=cache_mode, backend=backend)
    tokens = torch.tensor(ids, dtype=torch.long)
    n = len(ids)
    nll = np.empty(n - 1, dtype=np.float64)
    argmax = np.empty(n - 1, dtype=np.int64)
    logits = prefill(model, cache, tokens[:prompt_tokens])
    rows = min(prompt_tokens, n - 1)
    logp = torch.log_softmax(logits[:rows].double(), dim=-1)
    nll[:rows] = (-logp.gather(1, tokens[1 : rows + 1, None])[:, 0]).numpy()
    argmax[:rows] = logits[:rows].argmax(dim=-1).numpy()
    held = []
    after_prefill = (
        cache.policy_seconds,
        cache.bookkeeping_seconds,
        cache.forward_seconds,
        cache.update_seconds,
    )
    if progress is not None:
        progress(1)
    for t in range(prompt_tokens, n - 1):
        logits = decode_step(model, cache, int(ids[t]))
        nll[t] = -float(torch.log_softmax(logits.double(), dim=-1)[ids[t + 1]])
        argmax[t] = int(logits.argmax())
        held.append(cache.held_counts())
        if progress is not None:
            progress(1)
    return {
        "nll": nll,
        "argmax": argmax,
        "held": np.array(held, dtype=np.int64).reshape(len(held), cache.num_layers),
        "decode_steps": cache.decode_steps,
        "policy_seconds": cache.policy_seconds - after_prefill[0],
        "bookkeeping_seconds": cache.bookkeeping_seconds - after_prefill[1],
        "forward_seconds": cache.forward_seconds - after_prefill[2],
        "update_seconds": cache.update_seconds - after_prefill[3],
        "prefill_seconds": dict(cache.prefill_seconds),
        "compactions": cache.compactions,
    }
