"""Observers of an evicting cache's attention (:meth:`EvictingCache.add_observer`): what
they are called with and the handle that detaches one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import InvalidTypeError
from ._cache_state import AttentionObserver

if TYPE_CHECKING:
    from ._cache_state import CacheState


class ObserverHandle:
    """What :meth:`EvictingCache.add_observer` returns: :meth:`remove` detaches the observer."""

    def __init__(self, observers: list[Any], fn: Any) -> None:
        self._observers = observers
        self._fn = fn

    def remove(self) -> None:
        """Stop calling the observer (nothing if already removed)."""
        if self._fn in self._observers:
            self._observers.remove(self._fn)


def add_observer(cache: CacheState, fn: AttentionObserver) -> ObserverHandle:
    """Call ``fn(layer, weights)`` with every evicting layer's attention, every forward.

    ``layer`` is the model's layer index (one of :attr:`observed_layers`); ``weights``
    is the new query rows' attention over the cache's slots, a detached tensor
    ``(batch, heads, q, extent)`` (``heads`` the query heads, ``q`` the forward's
    tokens per sequence, ``extent`` the slots the layer attends over, the new tokens'
    included): float32, or the model's dtype where the model's own eager attention
    computed it.  While nothing was ever evicted slot ``s`` holds position ``s`` (the
    padded sequence's); afterwards a row's slots are in
    ``storage.slots[row, :count]`` (kept order).  Masked slots (padding, freed slots,
    later tokens of a chunk) weigh 0.

    Called in layer order, as each layer's attention is computed and before the cache
    uses the weights; after the last layer's observers the policies step.  During the
    calls ``cache.seen`` (and ``get_seq_length()``) is the position of the forward's
    first token, and the inspection methods give the cache as it was before the
    forward.  An observer must not change the cache (``reset()``, ``update()``,
    ``pin()``, a batch reshuffle, ``end_prompt()`` called from one raise
    ``InvalidInputError``); an exception it raises propagates out of the forward
    (which is undone).
    Observers are not copied with the cache (``copy.deepcopy``, pickling).

    Returns
    -------
    ObserverHandle
        ``handle.remove()`` detaches ``fn``.

    Raises
    ------
    InvalidTypeError
        ``fn`` is not callable.
    """
    if not callable(fn):
        raise InvalidTypeError(f"an observer must be callable, not {type(fn).__name__}")
    cache._observers.append(fn)
    return ObserverHandle(cache._observers, fn)
