"""What a cache has read, and a new prompt's longest common prefix with it.

An :class:`~scissorhands.hf.cache.EvictingCache` keeps the token ids it has read beside
its state (:class:`TokenIds`: per sequence of the batch, one id per position, padding
as -1), as llama.cpp's server keeps each slot's tokens beside its KV.  A prompt that
continues them is read from where the cache stands.  One that does not (another
request, the same one again, a conversation re-rendered with a different ending) either
reuses the longest common prefix, every row forgetting what it holds from the first
difference on, or, with ``prefix="refuse"``, is refused before anything changes
(:func:`reuse_prefix`).

``generate`` hands the model only the tokens past ``get_seq_length()``, so the
comparison has to happen before it asks: :func:`install` (called by
:meth:`~scissorhands.hf.cache.EvictingCache.from_model`) sets two things on the model,
both undone by :func:`uninstall` (which is :func:`scissorhands.hf.uninstall`):

* ``model._prefill``, an instance attribute over transformers' own method (the first
  forward of every ``generate`` call, pinned transformers 5.24): with an evicting cache
  and the library's attention selected, the prompt's full ids are compared with what
  the cache has read before the original runs (it then asks the cache for its length
  and hands the model the rest).  Any other cache, or a model switched to another
  attention, goes straight to the original.
* a forward pre-hook on the model's base model (``model.base_model``) that hands an
  evicting cache the ``input_ids`` of each forward; the cache records them when the
  forward's step ends (a failed forward records nothing).  A forward without ids
  (``inputs_embeds``) leaves the record short: what was read from there on is
  unknown, and no later prompt reuses it.

A plain ``model(...)`` forward passes only its own new tokens: they are appended to
the record, never compared (such a forward always continues the cache, at position
``get_seq_length()``).  A hand-written loop serving requests calls
:meth:`~scissorhands.hf.cache.EvictingCache.reuse_prefix` with each request's full ids
and feeds the model the part past the count it returns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from transformers.cache_utils import DynamicSlidingWindowLayer

from ..errors import InvalidInputError, InvalidTypeError
from . import attention
from .read_ids import PAD_ID, TokenIds

if TYPE_CHECKING:
    from ._cache_state import CacheState

__all__ = ["PREFIX_MODES", "TokenIds", "install", "installed", "reuse_prefix", "uninstall"]

#: ``reuse``: a prompt that does not continue what the cache read reuses the longest
#: common prefix; ``refuse``: it is refused, nothing changed.
PREFIX_MODES = ("reuse", "refuse")

#: Fewer common positions than this are not reused: a policy holding only position 0
#: with nothing admitted after it reads as fresh, so the prompt is read from scratch.
_LEAST_REUSED = 2


def check_mode(prefix: Any) -> str:
    """``prefix`` checked as one of :data:`PREFIX_MODES` (:class:`InvalidInputError`)."""
    if prefix not in PREFIX_MODES:
        raise InvalidInputError(f"prefix must be one of {', '.join(PREFIX_MODES)}, got {prefix!r}")
    return str(prefix)


def _prompt_ids(input_ids: Any, attention_mask: Any) -> np.ndarray:
    """A prompt's ids ``(batch, L)`` int64 with padding (``attention_mask`` 0) as
    :data:`PAD_ID`; raises what :meth:`EvictingCache.reuse_prefix` documents."""
    if isinstance(input_ids, torch.Tensor):
        array = input_ids.detach().cpu().numpy()
    else:
        try:
            array = np.asarray(input_ids)
        except (TypeError, ValueError) as exc:
            raise InvalidTypeError(f"input_ids must be token ids, got {type(input_ids).__name__}: {exc}") from None
    if array.dtype.kind not in "iu":
        raise InvalidTypeError(f"input_ids must be integer token ids, got dtype {array.dtype}")
    if array.ndim == 1:
        array = array[None]
    if array.ndim != 2 or array.shape[1] == 0 or array.shape[0] == 0:
        raise InvalidInputError(f"input_ids must be (batch, length) with length >= 1, got shape {array.shape}")
    ids = array.astype(np.int64)
    if attention_mask is None:
        return ids
    mask = attention_mask.detach().cpu().numpy() if isinstance(attention_mask, torch.Tensor) else \
        np.asarray(attention_mask)
    if mask.ndim == 1:
        mask = mask[None]
    if mask.shape != ids.shape:
        raise InvalidInputError(f"attention_mask must be shaped as input_ids {ids.shape}, got {mask.shape}")
    return np.where(mask == 0, PAD_ID, ids)


def _refusal(what: str) -> InvalidInputError:
    return InvalidInputError(
        f"the prompt does not continue what the cache has read: {what}; reset() the cache before an unrelated "
        "prompt, or build it with prefix='reuse' (the default) to reuse the longest common prefix")


def reuse_prefix(cache: CacheState, input_ids: Any, attention_mask: Any = None) -> int:
    """:meth:`EvictingCache.reuse_prefix <scissorhands.hf.cache.EvictingCache.reuse_prefix>`:
    ``input_ids`` None is a prompt given without ids (``inputs_embeds``)."""
    cache._unchanged_by_observers("reuse_prefix()")
    ids = None if input_ids is None else _prompt_ids(input_ids, attention_mask)
    cache._settle()
    seen = cache.seen
    if seen == 0 or not cache._holds():
        return 0
    record = cache._read_ids
    batch = cache.storage.batch
    if ids is None:
        why, reused = "it comes without token ids (inputs_embeds), which the cache cannot compare", 0
    elif ids.shape[0] != batch:
        why, reused = f"it has {ids.shape[0]} sequences, the cache holds {batch}", 0
    else:
        common = record.common(ids)
        first = int(common.min())
        length = ids.shape[1]
        if first >= seen and length > seen:
            return seen  # it continues what was read
        reused = min(first, length - 1)
        row = int(np.argmin(common))
        if first < min(record.known, length):
            why = (f"sequence {row} differs at position {first} (token {int(ids[row, first])} where the cache "
                   f"read {int(record.ids[row, first])}; -1 is padding)")
        elif first < seen and first == record.known:
            why = f"the cache read positions {record.known}..{seen - 1} without token ids (inputs_embeds)"
        else:
            why = f"the prompt's {length} tokens end within the {seen} the cache has read"
    if cache.prefix == "refuse":
        raise _refusal(why)
    if ids is not None and cache.per_sequence and ids.shape[0] != len(cache.configs):
        raise InvalidInputError(f"the cache has one configuration per sequence ({len(cache.configs)}), "
                                f"the prompt has {ids.shape[0]} sequences")
    if reused >= _LEAST_REUSED and _truncate(cache, reused):
        return reused
    cache.reset()
    return 0


def _croppable(layer: Any, position: int) -> bool:
    """Whether one of transformers' own layers (a sliding window) can forget every
    position at or after ``position`` exactly: it still holds every token it read."""
    if not getattr(layer, "is_initialized", False):
        return True
    return (type(layer) is DynamicSlidingWindowLayer and layer.cumulative_length < layer.sliding_window
            and layer.keys is not None and layer.keys.shape[-2] == layer.cumulative_length)


def _truncate(cache: CacheState, position: int) -> bool:
    """Every row of ``cache`` forgets what it holds at or after ``position`` (its policy
    state with it; the positions before keep theirs), transformers' own layers are
    cropped, and ``position`` tokens count as seen.  False, nothing changed, when that
    cannot be exact: a sliding-window layer that no longer holds the positions before
    ``position`` it would need, or policy rows that keep no state (a hindsight
    schedule)."""
    from .layer import EvictingLayer

    own: list[Any] = [layer for layer in cache.layers if not isinstance(layer, EvictingLayer)]
    if cache.bank is None or not all(_croppable(layer, position) for layer in own):
        return False
    built = cache.bank.truncated(position)
    if built is None:
        return False
    policies, dropped = built
    cache.bank.replace(policies)
    cache.storage.drop_tail(np.repeat(dropped, cache.num_kv_heads // cache.policy_heads), position)
    for layer in own:
        if layer.is_initialized:
            layer.keys = layer.keys[:, :, :position]
            layer.values = layer.values[:, :, :position]
            layer.cumulative_length = position
    cache.seen = position
    cache._window = None  # prompt-aware: the rows of the prompt that was read are not this one's
    if cache._archive is not None and cache._queries is not None:  # the recall tier forgets the same tail
        cache._archive.drop_from(position)
        cache._queries.clear()
        cache._restored = None
    cache._read_ids.known = min(cache._read_ids.known, position)
    cache.stats.compactions = cache.storage.compactions
    return True


# ---------------------------------------------------------------------- what the model gets


def _note_ids(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """The base model's forward pre-hook: an evicting cache's forward's ``input_ids``."""
    cache: Any = kwargs.get("cache")
    if cache is None:
        cache = kwargs.get("past_key_values")
    record = getattr(cache, "_read_ids", None)
    if type(record) is TokenIds:
        record.note(cache.seen, kwargs.get("input_ids", args[0] if args else None))


class _Prefill:
    """``model._prefill`` while installed: an evicting cache compares the prompt of a
    ``generate`` call with what it has read before transformers' ``_prefill`` asks for
    its length (see the module docstring)."""

    __slots__ = ("model",)

    def __init__(self, model: Any) -> None:
        self.model = model

    def __call__(self, input_ids: torch.Tensor, generation_config: Any, model_kwargs: dict[str, Any], *args: Any,
                 **kwargs: Any) -> Any:
        model = self.model
        cache: Any = model_kwargs.get("cache")
        first = kwargs.get("is_first_iteration", args[0] if args else True)
        if first and type(getattr(cache, "_read_ids", None)) is TokenIds and attention.installed(model) is not None:
            if model_kwargs.get("inputs_embeds") is not None:
                cache.reuse_prefix(None)  # the whole prompt, as embeddings: nothing to compare
            else:
                mask = model_kwargs.get("attention_mask")
                length = mask.shape[1] if mask is not None else getattr(generation_config, "_mask_length", -1)
                if length == input_ids.shape[1]:  # the full prompt (else only new tokens: they continue)
                    cache.reuse_prefix(input_ids, mask if mask is not None and mask.dim() == 2 else None)
        return type(model)._prefill(model, input_ids, generation_config, model_kwargs, *args, **kwargs)


def installed(model: Any) -> bool:
    """Whether :func:`install` set its prompt comparison on ``model``."""
    return isinstance(getattr(model, "__dict__", {}).get("_prefill"), _Prefill)


def install(model: Any) -> None:
    """Set on ``model`` what compares a ``generate`` call's prompt with what an evicting
    cache has read and records each forward's ids (see the module docstring); nothing
    when already set, or (the comparison) when transformers has no ``_prefill``."""
    base = getattr(model, "base_model", model)
    hooks = getattr(base, "_forward_pre_hooks", None)
    if hooks is not None and not any(hook is _note_ids for hook in hooks.values()):
        base.register_forward_pre_hook(_note_ids, with_kwargs=True)
    if not installed(model) and callable(getattr(type(model), "_prefill", None)):
        model.__dict__["_prefill"] = _Prefill(model)


def uninstall(model: Any) -> None:
    """Undo :meth:`EvictingCache.from_model` on ``model``: remove what :func:`install` set
    (nothing if not set), then switch the model back to the attention implementation ours
    wrapped (:func:`scissorhands.hf.attention.uninstall`). This is
    :func:`scissorhands.hf.uninstall`."""
    _remove(model)
    attention.uninstall(model)


def _remove(model: Any) -> None:
    """Remove what :func:`install` set on ``model`` (nothing if not set)."""
    base = getattr(model, "base_model", model)
    hooks = getattr(base, "_forward_pre_hooks", None)
    if hooks is not None:
        for key in [key for key, hook in hooks.items() if hook is _note_ids]:
            del hooks[key]
            getattr(base, "_forward_pre_hooks_with_kwargs", {}).pop(key, None)
    if installed(model):
        del model.__dict__["_prefill"]
