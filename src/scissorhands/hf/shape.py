"""The shape of the model an :class:`~scissorhands.hf.cache.EvictingCache` was built for,
and the refusals of a forward that does not fit it.

A cache is laid out for one model: one layer object per model layer (an evicting one for
each full-attention layer), one buffer per evicting layer of its KV heads' keys and
values.  It records, when built, what of the model that layout depends on
(:class:`ModelShape`: the layer types in order, the KV heads, the head size) and refuses
a forward of another model before anything changes (the forward in flight undone,
``seen`` and every layer as they were), naming both shapes: ``reset()`` empties a cache
but does not lay it out for another model, so the error says to build one with
``EvictingCache.from_model(other)``.  The model's shape is read off ``module.config``
(the attention module's) at the first evicting layer's attention of each forward, once
per config object; the keys a layer writes are checked against the cache's KV heads and
against the width the layer holds.  The dtype is the one exception: a used cache refuses
keys of another dtype (its buffers hold one), a reset cache takes any (a model cast after
the cache was built).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transformers.cache_utils import get_layer_types_and_kwargs

from ..errors import InvalidInputError

__all__ = ["ModelShape", "check_module", "check_write", "shape_of"]


@dataclass(frozen=True)
class ModelShape:
    """What of a model a cache's layout depends on.

    ``kinds``: transformers' layer type of each layer, in order (``"full_attention"``
    layers evict); ``kv_heads``: key/value heads per layer; ``head_dim``: elements per
    key (the config's ``head_dim``, else ``hidden_size // num_attention_heads``)."""

    kinds: tuple[str, ...]
    kv_heads: int
    head_dim: int

    @property
    def evicting(self) -> int:
        """The full-attention (evicting) layers."""
        return sum(kind == "full_attention" for kind in self.kinds)

    def describe(self) -> str:
        """One line: ``"2 layers (2 evicting), 2 KV heads of size 16"``."""
        n = len(self.kinds)
        return (f"{n} layer{'s' if n != 1 else ''} ({self.evicting} evicting), {self.kv_heads} KV heads "
                f"of size {self.head_dim}")


def shape_of(config: Any) -> ModelShape:
    """The :class:`ModelShape` a transformers config describes (its text config's)."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = getattr(text, "head_dim", None)
    if not isinstance(head_dim, int):
        head_dim = int(text.hidden_size) // heads
    kinds, _ = get_layer_types_and_kwargs(text)
    return ModelShape(tuple(str(kind) for kind in kinds), kv_heads, int(head_dim))


def _refused(cache: Any, running: str) -> InvalidInputError:
    return InvalidInputError(
        f"this EvictingCache was built for a model of {cache.shape.describe()}; the model running it "
        f"{running}: a cache fits the model it was built for, before and after reset(); build one for "
        "this model with EvictingCache.from_model(model, ...) (nothing changed)")


def check_module(cache: Any, module: Any) -> None:
    """Refuse a forward whose attention ``module`` belongs to a model of another shape
    than ``cache``'s (called at the first evicting layer's attention, the forward in
    flight): the forward is undone, then :class:`InvalidInputError` names both shapes.
    A config already found to fit is not read again; a module without a config is not
    checked."""
    config = getattr(module, "config", None)
    if config is None or config is cache._fitted:
        return
    try:
        running = shape_of(config)
    except (AttributeError, TypeError, ValueError):  # not a config this can read: not checked
        return
    if running != cache.shape:
        cache._rollback()
        raise _refused(cache, f"has {running.describe()}")
    cache._fitted = config


def check_write(cache: Any, layer_idx: int, key: Any, value: Any) -> None:
    """Refuse keys and values ``(batch, kv_heads, q, head_dim)`` written to evicting
    layer ``layer_idx`` with other KV heads than the cache's, or another width than the
    layer holds, before they are written (the forward in flight undone, when a layer
    before wrote)."""
    layer = cache.layers[layer_idx]
    storage = cache.storage
    heads = cache.num_kv_heads
    held = (storage.keys[layer.index], storage.values[layer.index]) if storage.started() else (None, None)
    widths = [None if buffer is None else int(buffer.shape[-1]) for buffer in held]
    if (key.shape[1] == heads and value.shape[1] == heads and widths[0] in (None, key.shape[-1])
            and widths[1] in (None, value.shape[-1])):
        return
    if layer_idx:  # the layers before wrote: this forward is undone
        cache._rollback()
    wrote = f"wrote keys {tuple(key.shape)} and values {tuple(value.shape)} to layer {layer_idx}"
    if key.shape[1] == heads and value.shape[1] == heads:  # the width differs from the one the layer holds
        wrote = (f"wrote keys of width {int(key.shape[-1])} and values of width {int(value.shape[-1])} where "
                 f"layer {layer_idx} holds {widths[0]} and {widths[1]} ({wrote})")
    if not storage.started() and key.shape[1] != heads:  # the words an empty cache has always used
        wrote = (f"wrote keys {tuple(key.shape)} to an empty cache built for {heads} KV heads: "
                 f"{int(key.shape[1])} KV heads is not the configuration's ({wrote})")
    raise _refused(cache, wrote)
