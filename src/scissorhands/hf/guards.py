"""What keeps an evicting cache's bookkeeping out of ``torch.compile``'s graph (its entry
points run as plain Python, a layer's undoing the forward when it raises), and what the
cache refuses: keys and values that are not 4-D tensors or require grad, a forward whose
attention never reached it, calls from an observer that would change it, ``crop``,
assisted decoding and early initialization."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ..errors import InvalidInputError, InvalidTypeError

if TYPE_CHECKING:
    from ._cache_state import CacheState, LayerState


_OUT_OF_SYNC = (
    "the cache received keys and values whose attention never reached it: the model does not "
    "run the library's attention (build the cache with EvictingCache.from_model(model, ...), "
    "which installs it), a forward was interrupted, or keys and values were handed to "
    "update() by hand; that forward was undone (the cache is as it was before it), so the "
    "next forward runs as if it had not happened"
)


def _always_dynamo() -> object:
    return True


#: The frame callback dynamo installs while compiled code runs or is traced (None
#: outside); without the function (another torch), every call takes the disabled form.
_dynamo_callback: Callable[[], object] = getattr(getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None),
                                                 "get_eval_frame_callback", _always_dynamo)


_tracing = torch.compiler.is_compiling


def _outside_graph(method: Callable[..., Any]) -> Callable[..., Any]:
    """One of the cache's entry points (transformers' calls, the installed attention's),
    run as plain Python under ``torch.compile``: the bookkeeping (NumPy, the policies' C
    calls) stays out of the traced graph, which breaks around it (transformers'
    ``DynamicCache`` is traced; this cache is not, and says so with ``is_compileable =
    False``, so ``generate`` never compiles for it on its own).  Outside dynamo (no frame
    callback installed: no compiled code running or being traced) the method is called
    directly, since ``torch.compiler.disable``'s wrapper costs a decode step about 2 us on
    each of its 90-odd calls, where asking whether dynamo traces and for the callback
    costs a tenth of that."""
    disabled: Callable[..., Any] = torch.compiler.disable(method)

    @functools.wraps(method)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not _tracing() and _dynamo_callback() is None:  # dynamo, tracing, reads the first as True
            return method(*args, **kwargs)
        return disabled(*args, **kwargs)

    return run


def _layer_entry(method: Callable[..., Any]) -> Callable[..., Any]:
    """A layer's step of the forward (called by the installed attention), outside the
    graph as :func:`_outside_graph` says, that undoes the forward first when it raises:
    one wrapper, so that each of a decode step's 90-odd such calls pays one frame."""

    def undone(self: LayerState, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except BaseException:
            self.cache._rollback()
            raise

    disabled: Callable[..., Any] = torch.compiler.disable(undone)

    @functools.wraps(method)
    def run(self: LayerState, *args: Any, **kwargs: Any) -> Any:
        if not _tracing() and _dynamo_callback() is None:  # as in _outside_graph
            try:
                return method(self, *args, **kwargs)
            except BaseException:
                self.cache._rollback()
                raise
        return disabled(self, *args, **kwargs)

    return run


def _refuse_states(keys: Any, values: Any) -> None:
    """Refuse keys or values handed to :meth:`EvictingCache.update` that are not 4-D
    tensors, naming what was passed (:class:`InvalidTypeError`, :class:`InvalidInputError`)."""
    for name, states in (("key_states", keys), ("value_states", values)):
        if not isinstance(states, torch.Tensor):
            raise InvalidTypeError(f"update: {name} must be a torch.Tensor (batch, kv_heads, q, head_dim), "
                                   f"got {type(states).__name__}")
        if states.dim() != 4:
            raise InvalidInputError(f"update: {name} must be 4-D (batch, kv_heads, q, head_dim), "
                                    f"got shape {tuple(states.shape)}")


def _refuse_grad(cache: CacheState, layer_idx: int) -> None:
    """Refuse keys or values that require grad (a forward with gradients on and trainable
    projections): the cache stores detached copies, so the key/value path would drop out
    of autograd with no error.  The forward in flight is undone first."""
    if layer_idx:
        cache._rollback()
    raise InvalidInputError(
        "an EvictingCache holds keys and values outside autograd (its buffers are written in place and "
        "evicted from), so gradients through them would be silently wrong: run the forward under "
        "torch.no_grad() or torch.inference_mode() (as generate does); for gradients through the "
        f"attention use transformers' DynamicCache (layer {layer_idx}'s keys or values require grad; "
        "nothing changed)")


def _unchanged_by_observers(cache: CacheState, what: str) -> None:
    """Refuse ``what`` (a call that changes the cache) while an observer is being called."""
    if cache._observing:
        raise InvalidInputError(
            f"{what} was called by an attention observer mid-forward: an observer must not change the "
            "cache (the forward is undone: the cache is as it was before it)")


def crop(cache: CacheState, tokens_to_remove: int) -> None:
    """``crop(0)`` does nothing; anything else raises: an evicted position is gone."""
    if tokens_to_remove != 0:
        raise InvalidInputError("an EvictingCache cannot be cropped: the positions it evicted are gone")


def activate_past_recording(cache: CacheState) -> None:
    """Refused: transformers asks for it before the first forward of assisted
    decoding (``assistant_model=``) and prompt-lookup decoding
    (``prompt_lookup_num_tokens=``), which then ``crop`` the draft tokens the model did
    not accept; the policies have already evicted for those tokens, so they cannot be
    taken back.  Nothing has changed when this raises."""
    raise InvalidInputError(
        "an EvictingCache cannot take back tokens once its policies saw them, which assisted decoding "
        "(assistant_model=) and prompt-lookup decoding (prompt_lookup_num_tokens=) need to drop rejected "
        "drafts: generate without them, or with transformers' DynamicCache")


def early_initialization(cache: CacheState, *args: Any, **kwargs: Any) -> None:
    raise InvalidInputError("an EvictingCache sizes itself at the first forward; it has no early initialization")
