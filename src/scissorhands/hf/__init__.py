"""KV-cache eviction inside a Hugging Face transformers model.

This package is the only part of the library that imports ``torch`` and
``transformers``; importing :mod:`scissorhands` never loads them.  Its modules, by role:
:mod:`.loading` (models, offline), :mod:`.gqa` (query heads to KV heads), :mod:`.rows`
(the bank of policy rows), :mod:`.storage` (how a layer keeps its keys and values),
:mod:`.cache` (:class:`EvictingCache`), :mod:`.drive` (the decode loop and the
teacher-forced ``eval`` run) and :mod:`.record` (attention traces).

How it works
------------
:class:`EvictingCache` is a :class:`transformers.DynamicCache` whose layers hand the model
the held keys and values.  After each forward, :func:`prefill` / :func:`decode_step` give
the attention weights the model returned (``output_attentions=True``, eager attention)
to the policies and drop the victims' keys and values:

* per layer and KV head, the new token's weights over the kept positions are the mean
  over the query heads of that GQA group, without the token's weight on itself, **not
  renormalised**;
* ``policy.step(pos, attn, budget, return_indices=True)`` returns each victim's slot
  index in the kept order; by default (:meth:`EvictingCache.from_policy`) one policy
  object holds every layer's heads as independent rows, so one call serves all layers;
* keys keep their original RoPE rotation (as H2O does) and the model is given the true
  ``position_ids``: once the cache has evicted, its length is no longer the position.

Two cache modes give the same logits (up to float summation order) and the same victims:

* ``cache_mode="reuse"`` (default): each layer has buffers of ``budget + 1`` slots per KV
  head.  The decode token's key and value are written (in the layer's ``update``) into
  the slot the last victim freed, which differs per KV head in per-head mode, so a step
  moves nothing but the new token.  The model attends over the slots in physical order
  (attention is permutation-invariant over keys), and the cache gathers its weights back
  into the policy's kept order through a per-(layer, head) slot map.  A step with
  several victims (the prefill, evicting down to the budget) compacts the buffers.
* ``cache_mode="compact"``: the ``DynamicCache`` way, keys appended by ``torch.cat`` and
  the survivors gathered after every eviction (the whole cache copied every step).

With ``head_mode="per-head"`` (default) each layer's KV heads are policy rows of their
own; with ``head_mode="mean"`` each layer has one row that sees the mean over all query
heads, and all its KV heads keep the same positions.

Examples
--------
>>> from scissorhands.hf import load_model, EvictingCache, prefill, decode_step
>>> model, tokenizer = load_model()                      # SmolLM2-135M GGUF, eager
>>> ids = tokenizer("The cat sat on", return_tensors="pt").input_ids
>>> cache = EvictingCache.from_policy(model.config, "scissorhands", budget=64)
>>> logits = prefill(model, cache, ids)                  # (P, vocab)
>>> logits = decode_step(model, cache, int(logits[-1].argmax()))   # (vocab,)

Scissorhands: Liu et al., NeurIPS 2023, arXiv 2305.17118.  H2O: Zhang et al.,
NeurIPS 2023, arXiv 2306.14048.  StreamingLLM: Xiao et al., ICLR 2024, arXiv 2309.17453.
"""

from __future__ import annotations

from .cache import HEAD_MODES, EvictingCache
from .drive import check_model, decode_step, evaluate_policy, generate, prefill
from .loading import (
    GGUF_FILE,
    GGUF_PACKAGE,
    ModelNotFoundError,
    default_gguf_path,
    environment,
    load_model,
    model_info,
)
from .record import record_attention
from .rows import PolicyRows
from .storage import CACHE_MODES

__all__ = [
    "CACHE_MODES",
    "GGUF_FILE",
    "GGUF_PACKAGE",
    "HEAD_MODES",
    "EvictingCache",
    "ModelNotFoundError",
    "PolicyRows",
    "check_model",
    "decode_step",
    "default_gguf_path",
    "environment",
    "evaluate_policy",
    "generate",
    "load_model",
    "model_info",
    "prefill",
    "record_attention",
]
