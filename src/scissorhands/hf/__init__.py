"""KV-cache eviction inside a Hugging Face transformers model: the drop-in cache.

::

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from scissorhands.hf import EvictingCache

    model = AutoModelForCausalLM.from_pretrained(path)          # sdpa, the default
    cache = EvictingCache.from_model(model, "scissorhands", budget=256, recent_window=0.75, sinks=4)
    out = model.generate(**tokenizer(prompt, return_tensors="pt"), cache=cache, max_new_tokens=200)

:meth:`EvictingCache.from_model` builds the cache and installs, by registration with
transformers (no model code is patched), the attention that hands the cache each new
query row's weights; ``model.generate`` then drives it like any cache: greedy,
sampling, beams, ``num_return_sequences``, streamers, stopping criteria, batches of
left-padded prompts, and follow-up turns on the same cache; a forward that raises
leaves the cache as it was.  Every (sequence, layer,
KV head) holds at most the budget; without eviction the tokens are exactly those of
transformers' ``DynamicCache``.

This package is the only part of the library that imports ``torch`` and
``transformers``; importing :mod:`scissorhands` never loads them.  Its modules, by role:
:mod:`.loading` (models, offline), :mod:`.attention` (what is installed in the model),
:mod:`.gqa` (query heads to KV heads), :mod:`.rows` (the bank of policy rows),
:mod:`.storage` (where keys and values live, slot by slot), :mod:`.cache`
(:class:`EvictingCache`: the state of each forward, the observer hook
``add_observer``), :mod:`.drive` (forwards without ``generate``, and ``eval``'s
teacher-forced batch), :mod:`.record` (attention traces) and :mod:`.hindsight` (the
full run's attention tapped, a hindsight schedule replayed).

Scissorhands: Liu et al., NeurIPS 2023, arXiv 2305.17118; every other policy's paper is
its registry entry's ``paper`` (:data:`scissorhands.options.SPECS`).
"""

from __future__ import annotations

from .attention import WRAPPED, install, installed
from .cache import HEAD_MODES, POSITION_MODES, CacheStats, EvictingCache
from .drive import decode_step, evaluate_batch, prefill
from .hindsight import HindsightConfig, tap_attention
from .loading import (
    GGUF_FILE,
    GGUF_PACKAGE,
    MODEL_NAMES,
    ModelNotFoundError,
    checkpoint_dir,
    default_gguf_path,
    environment,
    load_model,
    model_info,
    resolve_model,
    set_threads,
)
from .longctx import long_context_run
from .prefix import uninstall
from .record import record_attention
from .rows import PolicyConfig
from .storage import CACHE_MODES

__all__ = [
    "CACHE_MODES",
    "GGUF_FILE",
    "GGUF_PACKAGE",
    "HEAD_MODES",
    "MODEL_NAMES",
    "POSITION_MODES",
    "WRAPPED",
    "CacheStats",
    "EvictingCache",
    "HindsightConfig",
    "ModelNotFoundError",
    "PolicyConfig",
    "checkpoint_dir",
    "decode_step",
    "default_gguf_path",
    "environment",
    "evaluate_batch",
    "install",
    "installed",
    "load_model",
    "long_context_run",
    "model_info",
    "prefill",
    "record_attention",
    "resolve_model",
    "set_threads",
    "tap_attention",
    "uninstall",
]
