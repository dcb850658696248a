"""What the library installs in a model so that its cache sees the attention.

An :class:`~scissorhands.hf.cache.EvictingCache` needs, at every forward, each new query
row's attention over the keys it holds.  transformers lets a library add an attention
implementation by registration (``AttentionInterface``), with the mask function that
goes with it (``AttentionMaskInterface``, without which no mask is built), and select it
with ``model.set_attn_implementation``: no model code is patched.  :func:`install` does
exactly that, under the name ``"scissorhands_<impl>"``, wrapping the implementation the
model had (``sdpa`` or ``eager``):

* the mask function *is* the wrapped implementation's, so the mask is built as before;
* the attention function receives the post-RoPE query, the keys and values the cache
  returned and ``module.layer_idx``.  For a layer whose cache is not evicting it calls
  the wrapped implementation unchanged.  For an evicting layer it asks the cache for the
  mask (the one built above while the cache is laid out as transformers expects, its
  own per (sequence, KV head) mask once positions were evicted) and hands the cache the
  attention weights of the new query rows.  Under ``eager`` the model's eager function
  returns them.  Under ``sdpa``, while nothing has been evicted, sdpa computes the
  output (so that it equals the stock cache's bit for bit) and the rows are computed
  beside it from the query and the held keys (one matmul and a softmax per layer: the
  cost the cache reports as ``rows_seconds``); once positions were evicted, the library
  computes the attention itself (:func:`grouped_attention`: eager's arithmetic per KV
  head's group of query heads, whose weights come with the output; at one query row on a
  CPU it costs about what sdpa does, and a quarter of what the model's eager function
  does, which copies the keys and values for every query head).  A layer whose KV heads
  share one buffer (a shared budget's, once positions were evicted) takes
  :func:`grouped_attention` under ``eager`` as well: every query head's products over
  the one buffer at once, the other heads' columns masked, where eager's copies for
  every query head would copy every head's columns.

Switching back (``model.set_attn_implementation("sdpa")``, or :func:`uninstall`)
removes it: the functions stay registered but are no longer selected.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ..errors import InvalidInputError
from .shape import check_module
from .storage import ChunkMask, causal_triangle

__all__ = ["PREFIX", "WRAPPED", "attention_rows", "grouped_attention", "install", "installed", "uninstall"]

#: Our implementations are named ``PREFIX + <the wrapped implementation>``.
PREFIX = "scissorhands_"
#: The implementations that can be wrapped.
WRAPPED = ("sdpa", "eager")
#: The attribute on a key tensor that names the cache layer which returned it.
LAYER_ATTRIBUTE = "_scissorhands_layer"

_EAGER: dict[type, Callable[..., Any]] = {}


def _eager_for(module: Any) -> Callable[..., Any]:
    """The model's own eager attention function (softcap and all), found in the module
    that defines its attention class, as transformers' models fall back to it."""
    kind = type(module)
    function = _EAGER.get(kind)
    if function is None:
        function = getattr(sys.modules.get(kind.__module__), "eager_attention_forward", None)
        if function is None:
            raise InvalidInputError(
                f"{kind.__name__} has no eager_attention_forward beside it: its eager attention "
                "cannot be wrapped (load the model with attn_implementation='sdpa')")
        _EAGER[kind] = function
    return function


#: The last causal mask compared against, by shape.
_CAUSAL: dict[tuple[int, int], torch.Tensor] = {}


def _is_causal(mask: torch.Tensor, q: int, kv: int) -> bool:
    """Whether a boolean ``(batch, 1, q, kv)`` mask is sdpa's causal one (query ``i``
    sees keys up to ``kv - q + i``) in every sequence."""
    if mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1 or tuple(mask.shape[2:]) != (q, kv):
        return False
    causal = _CAUSAL.get((q, kv))
    if causal is None:
        _CAUSAL.clear()
        causal = _CAUSAL[(q, kv)] = torch.ones(q, kv, dtype=torch.bool).tril(kv - q)
    return bool(torch.equal(mask, causal.expand(mask.shape)))


def _one_space(buffer: torch.Tensor) -> torch.Tensor:
    """Keys or values a layer's KV heads share (a shared budget's layout: one buffer
    expanded to every head, each head's columns masked from the others') as the one
    buffer ``(batch, 1, kv, head_dim)``, whose products every query head then takes at
    once; any other as they are."""
    if buffer.shape[1] > 1 and buffer.stride(1) == 0:
        return buffer[:, :1]
    return buffer


def attention_rows(module: Any, query: torch.Tensor, key: torch.Tensor, mask: Any,
                   kwargs: dict[str, Any]) -> torch.Tensor:
    """The attention weights of the query rows over the keys, as eager attention computes
    them (scaled dot products, softcap when the model has one, the mask, a float32
    softmax), for implementations that do not return them.

    ``mask``: None (sdpa's ``is_causal`` when ``q > 1``), boolean (True: attend),
    additive, or a :class:`~scissorhands.hf.storage.ChunkMask`.  A float16 query and
    keys are widened to float32 first (the products of large logits overflow float16
    where sdpa, which accumulates in float32, stays finite).  Masked scores become
    float32's lowest plus the score, which the softmax turns into exactly 0 as it does
    the lowest itself: the weights are those of every form of the same mask.

    Returns ``(batch, heads, q, kv)`` float32."""
    batch, heads, q, dim = query.shape
    key = _one_space(key)
    kv_heads = key.shape[1]
    group = heads // kv_heads
    scaling = kwargs.get("scaling")
    if scaling is None:
        scaling = module.head_dim**-0.5
    if query.dtype == torch.float16:
        query, key = query.float(), key.float()
    softcap = kwargs.get("softcap")
    exact = softcap is None and scaling > 0 and math.frexp(scaling)[0] == 0.5
    if exact:  # a power of two: scaling the query first gives the same products
        scores = torch.matmul((query * scaling).reshape(batch, kv_heads, group * q, dim), key.transpose(2, 3))
        scores = scores.reshape(batch, heads, q, -1)
    else:
        scores = torch.matmul(query.reshape(batch, kv_heads, group * q, dim), key.transpose(2, 3))
        scores = scores.reshape(batch, heads, q, -1) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    kv = scores.shape[-1]
    if isinstance(mask, ChunkMask):
        mask.apply_(scores.view(batch, kv_heads, group, q, kv))
        mask = None
    elif q > 1 and scores.dtype == torch.float32 and (mask is None or _is_causal(mask, q, kv)):
        scores[..., kv - q:] += causal_triangle(q)  # causal: only the last q columns are masked
        mask = None
    elif q > 1 and mask is None:
        mask = torch.ones(q, kv, dtype=torch.bool, device=scores.device).tril(kv - q)
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        elif mask.dtype != scores.dtype:  # a float16 mask's lowest does not mask float32 scores
            scores = (scores + mask).masked_fill_(mask <= torch.finfo(mask.dtype).min, torch.finfo(scores.dtype).min)
        else:
            scores = scores + mask
    return torch.softmax(scores, dim=-1, dtype=torch.float32)


def grouped_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      mask: torch.Tensor | None, kwargs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention computed per KV head for its group of query heads: the weights of
    :func:`attention_rows`, then their product with the values, without the copies of
    the keys and values for every query head that eager attention makes (at 1,024 held
    positions and one query row, a fifth of its time here).

    Returns the output ``(batch, q, heads, head_dim)`` in the query's dtype and the
    weights ``(batch, heads, q, kv)`` float32."""
    weights = attention_rows(module, query, key, mask, kwargs)
    batch, heads, q, kv = weights.shape
    value = _one_space(value)
    kv_heads = value.shape[1]
    grouped = weights.to(value.dtype).reshape(batch, kv_heads, heads // kv_heads * q, kv)
    output = torch.matmul(grouped, value).reshape(batch, heads, q, -1)
    return output.transpose(1, 2).contiguous(), weights


def _last_rows(mask: Any, q: int, w: int) -> Any:
    """A chunk's mask for its last ``w`` query rows of ``q`` (None, sdpa's causal, stays
    None: :func:`attention_rows` masks the last ``w`` columns' triangle then)."""
    if mask is None or not isinstance(mask, torch.Tensor) or mask.dim() < 2 or mask.shape[-2] != q:
        return mask
    return mask[..., q - w:, :]


def _make_attention(wrapped: str) -> Callable[..., Any]:
    def attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        layer = getattr(key, LAYER_ATTRIBUTE, None)
        if layer is None:  # not an evicting cache layer: the wrapped implementation, as it was
            inner = _eager_for(module) if wrapped == "eager" else ALL_ATTENTION_FUNCTIONS[wrapped]
            return inner(module, query, key, value, attention_mask, **kwargs)
        cache = layer.cache
        if layer.index == 0:  # a model of another shape than the cache's: refused, the forward undone
            check_module(cache, module)
        if cache.positions == "cache":
            layer.note_positions(query, kwargs)
        if cache._queries is not None and query.shape[2] > 1:  # archive: the prompt's last query rows
            scaling = kwargs.get("scaling")
            cache._queries.note(layer.index, query, module.head_dim**-0.5 if scaling is None else scaling,
                                kwargs.get("softcap"))
        if wrapped == "eager" or not cache.storage.aligned:
            # Weights that come with the output: the model's own eager attention when the
            # model was loaded with it; once positions were evicted under sdpa (whose
            # outputs then need not match the stock cache's bit for bit), the same
            # arithmetic per KV head's group, without eager's copies of the keys and
            # values for every query head.
            # float16 rows are computed in float32, with a float32 mask (float16's lowest
            # does not mask float32 scores); the model's own eager attention takes its dtype.
            # A layer whose KV heads share one buffer (a shared budget's) takes grouped_attention
            # under eager too: eager's copies of the keys and values for every query head
            # would copy every head's columns for each.
            ours = (wrapped != "eager" or cache.storage.shared) and not module.training  # float32 scores
            widen = ours and query.dtype == torch.float16
            mask = layer.attention_mask(attention_mask, query, torch.float32 if widen else query.dtype,
                                        structured=ours and query.dtype in (torch.float32, torch.float16))
            if cache.positions == "cache" and not cache.storage.aligned:
                query, key = layer.rerotate(query, key, kwargs)
            if not ours:
                output, weights = _eager_for(module)(module, query, key, value, mask, **kwargs)
            else:
                output, weights = grouped_attention(module, query, key, value, mask, kwargs)
            layer.observe(weights)
            # The weights returned as the wrapped implementation returns them (sdpa: none),
            # before and after positions were evicted, as transformers documents for it.
            return output, (weights if wrapped == "eager" else None)
        # Nothing evicted yet: sdpa itself, so that outputs equal the stock cache's, and
        # the rows computed beside it.
        mask = layer.attention_mask(attention_mask, query, None)
        output, weights = ALL_ATTENTION_FUNCTIONS[wrapped](module, query, key, value, mask, **kwargs)
        if not cache.reads_attention:  # no policy of this cache reads attention: no rows
            layer.observe(None)
            return output, weights
        start = time.perf_counter()
        w = layer.window_rows()
        if w:  # prompt-aware reading: only the rows the prompt's end reads (the chunk's last w)
            rows = attention_rows(module, query[:, :, -w:], key, _last_rows(mask, query.shape[2], w), kwargs)
        else:
            rows = attention_rows(module, query, key, mask, kwargs)
        cache.stats.rows_seconds += time.perf_counter() - start
        layer.observe(rows)
        return output, weights

    attention.__name__ = f"{PREFIX}{wrapped}_attention"
    attention.__qualname__ = attention.__name__
    return attention


_MASKS: dict[str, Callable[..., Any]] = {"sdpa": sdpa_mask, "eager": eager_mask}
for _wrapped in WRAPPED:
    AttentionInterface.register(PREFIX + _wrapped, _make_attention(_wrapped))
    AttentionMaskInterface.register(PREFIX + _wrapped, _MASKS[_wrapped])


def installed(model: Any) -> str | None:
    """The implementation ours wraps in ``model`` (``"sdpa"``, ``"eager"``), or None when
    the model does not run ours."""
    impl = getattr(model.config, "_attn_implementation", None)
    if isinstance(impl, str) and impl.startswith(PREFIX):
        return impl[len(PREFIX):]
    return None


def install(model: Any) -> str:
    """Select the library's attention implementation in ``model``, wrapping the one it
    was loaded with; return the wrapped one's name (what :func:`uninstall` restores).

    Raises
    ------
    InvalidInputError
        The model's implementation is not ``sdpa`` or ``eager`` (flash and flex
        attention take no per-head mask), or the model cannot switch implementations.
    """
    current = installed(model)
    if current is not None:
        return current
    impl = getattr(model.config, "_attn_implementation", None)
    if impl not in WRAPPED:
        raise InvalidInputError(
            f"the model runs attn_implementation={impl!r}; an EvictingCache wraps "
            f"{' or '.join(repr(w) for w in WRAPPED)} (load the model with one of them)")
    if not getattr(model, "_can_set_attn_implementation", lambda: True)():
        raise InvalidInputError(
            f"{type(model).__name__} cannot switch its attention implementation, so the cache "
            "cannot see its attention")
    model.set_attn_implementation(PREFIX + impl)
    if installed(model) is None:  # pragma: no cover - transformers refused silently
        raise InvalidInputError(f"{type(model).__name__} did not take the attention implementation")
    return impl


def uninstall(model: Any) -> None:
    """Switch ``model`` back to the implementation ours wrapped (nothing if not installed).
    :func:`scissorhands.hf.uninstall` (:func:`scissorhands.hf.prefix.uninstall`) also
    removes the prompt comparison; this module never imports that one."""
    wrapped = installed(model)
    if wrapped is not None:
        model.set_attn_implementation(wrapped)
