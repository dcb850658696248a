"""The lm-eval model ``scissorhands``: lm-eval's ``HFLM`` with a fresh evicting cache per
request.

Importing this module registers the model with lm-eval's registry (``@register_model``;
importing patches nothing of lm-eval), so that ``lm_eval.simple_evaluate(model="scissorhands",
model_args="policy=h2o,budget=128")`` and ``python -m scissorhands.commands.retrieval --model
scissorhands ...`` find it.  (The command line and ``tasks`` run lm-eval inside
:func:`quiet_lm_eval`, which swaps two of its functions for the block only, to keep
lines that read as errors off the output.)  It overrides only what an evicting cache changes:

* generation (``generate_until``): the model's own ``generate`` runs with a fresh
  :class:`~scissorhands.hf.EvictingCache` for the request, the prompt read in forwards of
  ``prefill_chunk`` tokens (transformers' ``prefill_chunk_size``), the cache evicting
  after each, and every generated token one more forward;
* log-likelihood (``loglikelihood``, ``loglikelihood_rolling``): the context is read as a
  prompt (in forwards of ``prefill_chunk`` tokens, evicting after each), then the
  continuation that is scored (in forwards of ``prefill_chunk`` tokens), its logits
  those of the cache as it then holds; lm-eval's own code scores them.  With
  ``prompt_aware`` the context's end is the prompt's end (:meth:`EvictingCache.end_prompt
  <scissorhands.hf.EvictingCache.end_prompt>`), before the continuation is read.

A cache that never evicts (``policy=full``) reads every request in one forward, as the
stock model does, so that its results are the stock ``hf`` model's sample for sample
(``tests/test_tasks.py`` checks it).  Requests run one at a time (``batch_size=1``; a
fresh cache is a cache per request).

Model arguments (``--model_args``): ``pretrained`` (what
:func:`scissorhands.hf.load_model` takes: a GGUF file, a checkpoint directory or a model
name; default SmolLM2-135M-Instruct; or a loaded model object with ``tokenizer``),
``policy``, ``budget``, every option of :data:`scissorhands.options.OPTIONS`
(``recent_window``, ``sinks``, ``history_window``, ``vote_rate``, ``pool``) by its
name, ``prefill_chunk`` (default 64; ``none``: one forward), ``backend``, ``head_mode``,
``positions``, ``attention`` (sdpa or eager), ``prompt_aware`` (true/false) with
``prefill_budget``, ``observation_window`` and ``pool_kernel`` (:mod:`scissorhands.prompt_aware`),
``archive`` (none, float32 or int8: the recall tier, :mod:`scissorhands.hf.recall`; each
request is one prompt on a fresh cache, so it changes what is held only where a request's
context is read as several prompts), ``quiet`` (no progress bars), and any of ``HFLM``'s own.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from scissorhands.errors import InvalidInputError

from . import NLTK_DIR
from .config import CacheConfig, pop_cache_config

__all__ = ["ScissorhandsLM", "check_modes", "quiet_lm_eval", "use_offline_nltk"]

#: What lm-eval's HFLM takes by name; any other model argument left after the cache's own
#: would go to its ``**kwargs``, which a loaded model ignores, so a misspelt option would
#: pass unseen.
_HFLM_ARGUMENTS = frozenset(inspect.signature(HFLM.__init__).parameters) - {"self", "kwargs"}


def use_offline_nltk() -> None:
    """Put :data:`scissorhands.commands.retrieval.NLTK_DIR` last on NLTK's data path, so that
    lm-eval's RULER generators find ``punkt_tab`` without downloading it (NLTK's own,
    where installed, comes first)."""
    import nltk

    if NLTK_DIR not in nltk.data.path:
        nltk.data.path.append(NLTK_DIR)


#: What lm-eval's HFLM logs when handed a loaded model, which this model always hands it
#: (it loads the model itself, through :func:`scissorhands.hf.load_model`): true of HFLM's
#: loading arguments, which this model refuses (:data:`_LOADING_ARGUMENTS`), not of the
#: cache's, which it reads itself.
_LOADED_MODEL_WARNINGS = ("`pretrained` model kwarg is not of type `str`",
                          "Passed an already-initialized model through `pretrained`")
#: HFLM's arguments that only load a model (ignored for a loaded one).
_LOADING_ARGUMENTS = ("revision", "subfolder", "dtype", "trust_remote_code", "parallelize", "max_memory_per_gpu",
                      "max_cpu_memory", "offload_folder", "tp_plan", "peft", "delta", "autogptq", "gptqmodel",
                      "gguf_file")


class _DropLoadedModelWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_LOADED_MODEL_WARNINGS)


def _git_commit_hash() -> str | None:
    """lm-eval's ``get_git_commit_hash`` without git's ``fatal: not a git repository``
    on stderr outside a checkout: the same value (``git describe --always``, else the
    working directory's ``.git``), git's complaint discarded."""
    from lm_eval.loggers.utils import get_commit_from_path

    try:
        return subprocess.check_output(["git", "describe", "--always"],
                                       stderr=subprocess.DEVNULL).strip().decode()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return get_commit_from_path(os.getcwd())


def _asked_lengths_only(simple_evaluate: Callable[..., Any]) -> Callable[..., Any]:
    """``simple_evaluate`` whose results drop RULER's unasked lengths: its tasks score
    every sample at 4096 as ``-1`` too (lm-eval's ``DEFAULT_SEQ_LENGTHS``), which
    aggregates to ``-1`` with no samples, a row ``4096 | -1 | N/A`` beside the lengths
    asked for."""
    def run(*args: Any, **kwargs: Any) -> Any:
        out = simple_evaluate(*args, **kwargs)
        for metrics in (out or {}).get("results", {}).values():
            for key in [k for k, v in metrics.items() if v == -1 and k.split(",")[0].isdigit()]:
                metrics.pop(key)
                metrics.pop(key.replace(",", "_stderr,", 1), None)
        return out

    return run


@contextlib.contextmanager
def quiet_lm_eval() -> Iterator[None]:
    """Within the block, lm-eval's runs print no line that reads as an error and
    is not one: its git lookup (for the results' ``git_hash``) keeps git's ``fatal:
    not a git repository`` off stderr, and ``lm_eval.simple_evaluate`` (what its command
    line calls) drops RULER's per-length metrics at lengths no sample has (``-1``).
    Every other value is lm-eval's own; both are restored on leaving."""
    import lm_eval
    import lm_eval.evaluator as evaluator

    git_hash = evaluator.get_git_commit_hash
    had_own = "simple_evaluate" in vars(lm_eval)
    saved = lm_eval.simple_evaluate
    evaluator.get_git_commit_hash = _git_commit_hash
    lm_eval.simple_evaluate = _asked_lengths_only(evaluator.simple_evaluate)
    try:
        yield
    finally:
        evaluator.get_git_commit_hash = git_hash
        if had_own:
            lm_eval.simple_evaluate = saved
        else:
            del lm_eval.simple_evaluate


def check_modes(config: CacheConfig) -> None:
    """The cache's head mode, position mode and attention, checked before any model loads.

    Raises
    ------
    InvalidInputError
        A value the cache does not take, named as given.
    """
    from scissorhands.hf import HEAD_MODES, POSITION_MODES, WRAPPED

    for name, value, known in (("head_mode", config.head_mode, HEAD_MODES),
                               ("positions", config.positions, POSITION_MODES),
                               ("attention", config.attention, WRAPPED)):
        if value not in known:
            raise InvalidInputError(f"{name} must be one of {', '.join(known)}, got {value!r}")


@register_model("scissorhands")
class ScissorhandsLM(HFLM):
    """lm-eval's ``HFLM`` whose every request runs with a fresh
    :class:`~scissorhands.hf.EvictingCache` (see the module's docstring).

    Parameters
    ----------
    pretrained : str, PathLike, transformers model or None
        A model for :func:`scissorhands.hf.load_model` (None: its default), or a loaded
        model (then give ``tokenizer``).
    **kwargs
        The cache's configuration (:func:`scissorhands.commands.retrieval.config.pop_cache_config`)
        and ``HFLM``'s own arguments.

    Raises
    ------
    InvalidInputError, InvalidTypeError
        A bad cache configuration or a batch size other than 1, before any model loads.
    """

    def __init__(self, pretrained: Any = None, **kwargs: Any) -> None:
        args = dict(kwargs)
        quiet = bool(args.pop("quiet", False))
        config = pop_cache_config(args)
        check_modes(config)
        batch_size = args.pop("batch_size", 1)
        if str(batch_size) != "1":
            raise InvalidInputError(f"the scissorhands model runs one request at a time (a fresh cache each): "
                                    f"batch_size must be 1, got {batch_size!r}")
        unknown = sorted(set(args) - _HFLM_ARGUMENTS)
        if unknown:
            raise InvalidInputError(f"unknown model argument{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: "
                                    "neither a cache option (policy, budget, the policy's options, prefill_chunk, "
                                    "backend, head_mode, positions, attention, prompt_aware, prefill_budget, "
                                    "observation_window, pool_kernel, archive; docs/tasks.md) nor an argument of "
                                    "lm-eval's HFLM")
        loading = [name for name in _LOADING_ARGUMENTS if name in args]
        if loading:
            raise InvalidInputError(f"model argument {loading[0]}={args[loading[0]]!r} is one of lm-eval's HFLM "
                                    "loading arguments, which this model does not use: it loads the model with "
                                    "scissorhands.hf.load_model (CPU, float32); pass pretrained=NAME_OR_PATH")
        if pretrained is None or isinstance(pretrained, (str, os.PathLike)):
            from scissorhands.hf import load_model

            pretrained, args["tokenizer"] = load_model(pretrained, attn_implementation=config.attention,
                                                       progress=False)
        args.setdefault("device", "cpu")
        hf_logger = logging.getLogger(HFLM.__module__)
        drop = _DropLoadedModelWarnings()
        hf_logger.addFilter(drop)
        try:
            super().__init__(pretrained=pretrained, batch_size=1, **args)
        finally:
            hf_logger.removeFilter(drop)
        self.cache_config = config
        self.quiet = quiet
        self._splits: dict[tuple[int, ...], int] | None = None

    # ------------------------------------------------------------------ the cache

    def fresh_cache(self) -> Any:
        """A new :class:`~scissorhands.hf.EvictingCache` for one request (and the
        library's attention installed in the model)."""
        from scissorhands.hf import EvictingCache

        return EvictingCache.from_model(self.model, **self.cache_config.cache_kwargs())

    def get_model_info(self) -> dict[str, Any]:
        """lm-eval's model facts, and the cache's configuration."""
        info = super().get_model_info()
        config = self.cache_config
        info["scissorhands_cache"] = {"label": config.label(), "policy": config.policy, "budget": config.budget,
                                      **dict(config.values), "prefill_chunk": config.prefill_chunk}
        if config.preset is not None:
            info["scissorhands_cache"]["preset"] = config.preset
        if config.prompt.enabled:
            prompt = config.prompt
            info["scissorhands_cache"].update(prompt_aware=True, prefill_budget=prompt.prefill_budget,
                                              observation_window=prompt.observation_window,
                                              pool_kernel=prompt.pool_kernel)
        if config.archive is not None:
            info["scissorhands_cache"]["archive"] = config.archive
        return info

    # ------------------------------------------------------------------ generation

    def generate_until(self, requests: Any, disable_tqdm: bool = False) -> Any:
        return super().generate_until(requests, disable_tqdm=disable_tqdm or self.quiet)

    def _model_generate(self, context: Any, max_length: int, stop: list[str], **generation_kwargs: Any) -> Any:
        generation_kwargs["cache"] = self.fresh_cache()
        if self.cache_config.evicts and self.cache_config.prefill_chunk is not None:
            generation_kwargs["prefill_chunk_size"] = self.cache_config.prefill_chunk
        return super()._model_generate(context, max_length, stop, **generation_kwargs)

    # ------------------------------------------------------------------ log-likelihood

    def loglikelihood(self, requests: Any, disable_tqdm: bool = False) -> Any:
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm or self.quiet)

    def _loglikelihood_tokens(self, requests: Any, disable_tqdm: bool = False, override_bs: Any = None) -> Any:
        # lm-eval hands the model only context + continuation[:-1]; record where each
        # input's context ends, so that the context is read before the continuation.
        splits: dict[tuple[int, ...], int] = {}
        for _, context, continuation in requests:
            whole = (list(context) + list(continuation))[-(self.max_length + 1):][:-1]
            split = max(len(whole) - len(continuation) + 1, 1)
            key = tuple(whole)
            splits[key] = min(splits.get(key, split), split)  # one input, several splits: the longest continuation
        self._splits = splits
        try:
            return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, override_bs=override_bs)
        finally:
            self._splits = None

    def _model_call(self, inps: torch.Tensor, attn_mask: Any = None, labels: Any = None) -> torch.Tensor:
        if attn_mask is not None or labels is not None:  # an encoder-decoder's call: no cache of ours
            return super()._model_call(inps, attn_mask=attn_mask, labels=labels)
        cache = self.fresh_cache()
        config = self.cache_config
        if not config.evicts:
            pieces = [inps]
        else:
            split = (self._splits or {}).get(tuple(inps[0].tolist()), inps.shape[1]) if inps.shape[0] == 1 \
                else inps.shape[1]
            chunk = config.prefill_chunk or inps.shape[1]
            pieces = [inps[:, start:min(start + chunk, end)]
                      for begin, end in ((0, split), (split, inps.shape[1]))
                      for start in range(begin, end, chunk)]
        # prompt_aware: the context's end is the prompt's end (the continuation is what is
        # scored, as decode steps would read it): evicted there, before the continuation.
        context_pieces = -(-split // chunk) if config.evicts and config.prompt.enabled else None
        logits = []
        with (torch.no_grad(),
              torch.autocast(device_type=self.device.type, dtype=self.mixed_precision_dtype,
                             enabled=self.mixed_precision_dtype is not None)):
            for index, piece in enumerate(pieces):
                if index == context_pieces:
                    cache.end_prompt()
                logits.append(self.model(piece, cache=cache, use_cache=True).logits)
        return logits[0] if len(logits) == 1 else torch.cat(logits, dim=1)


use_offline_nltk()
