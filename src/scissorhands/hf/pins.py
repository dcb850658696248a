"""Pinned spans of an evicting cache: the spans given to the constructor or to
:meth:`EvictingCache.pin`, merged and checked by a one-row policy of every configuration
(as its rows will pin them), refused when they leave nothing to evict at a prompt's end,
and handed to every policy row."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import InvalidInputError, InvalidTypeError
from ..options import policy_spec
from ..prompt_aware import PromptAware
from .rows import PolicyConfig

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._cache_state import CacheState


def _spans(pins: Any) -> list[tuple[int, int]]:
    """``pins`` as a list of ``(start, stop)`` pairs (each checked by the policies)."""
    if isinstance(pins, (str, bytes)) or not hasattr(pins, "__iter__"):
        raise InvalidTypeError(f"pins must be a sequence of (start, stop) pairs, got {pins!r}")
    out = []
    for span in pins:
        if isinstance(span, (str, bytes)) or not hasattr(span, "__len__") or len(span) != 2:
            raise InvalidTypeError(f"each pinned span must be a (start, stop) pair, got {span!r}")
        out.append((span[0], span[1]))
    return out


def _checked_pins(configs: Sequence[PolicyConfig], held: list[tuple[int, int]],
                  new: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The spans ``held`` plus ``new``, merged, checked by a one-row policy of every
    configuration (as its rows will pin them); raises what ``pin`` refuses."""
    if not new:
        return list(held)
    merged: list[tuple[int, int]] = list(held)
    for config in configs:
        one = config if not config.pooled else \
            PolicyConfig(config.policy, config.budget, config.options.replace(pool=1), config.backend)
        if not held:  # the constructor's spans: a fractional recent window shares what they leave
            probe = one.build(1, {"layer": 1, "model": 1}, new)
        else:  # spans pinned later: the window as the rows resolved it
            probe = one.build(1, {"layer": 1, "model": 1}, held)
            for start, stop in new:
                probe.pin(start, stop)
        merged = [(int(a), int(b)) for a, b in probe.pins]
    return merged


def _check_pins_leave_room(spans: list[tuple[int, int]], settings: PromptAware,
                           configs: Sequence[PolicyConfig]) -> None:
    """``prompt_aware``: the pinned positions, the sinks and the observation window are
    all protected at the prompt's end; refuse spans that leave nothing to evict there."""
    if not settings.enabled or not spans:
        return
    config = configs[0]
    assert config.budget is not None
    resolved = policy_spec(config.policy).check(config.budget, config.options.values(config.policy, config.budget))
    sinks = int(resolved.get("sinks", 0))
    pinned = sum(max(0, stop - max(start, sinks)) for start, stop in spans)
    if pinned + settings.observation_window + sinks >= config.budget:
        raise InvalidInputError(
            f"pins leave nothing to evict at the prompt's end: {pinned} pinned + observation_window "
            f"{settings.observation_window} + sinks {sinks} >= budget {config.budget}")


def pin(cache: CacheState, start: int, stop: int) -> None:
    """Pin positions ``start <= p < stop`` in every (sequence, layer, KV head) row:
    no eviction takes them (the policies' ``pin``; a span may lie ahead of what was
    read, and an evicted position does not come back).  Positions count as
    :meth:`kept_positions` does (a padded sequence's padded positions).  The spans
    stay through ``reset()`` and are copied with the cache.

    Raises
    ------
    InvalidTypeError, InvalidInputError
        What the policy's ``pin`` refuses (a bad span; pins that leave nothing to
        evict: pinned plus recent window plus sinks reaching the budget), checked
        before anything changes; or the call comes from an observer mid-forward.
    """
    cache._unchanged_by_observers("pin()")
    spans = _checked_pins(cache.configs, cache._pins, [(start, stop)])
    _check_pins_leave_room(spans, cache.prompt_aware, cache.configs)
    if cache.bank is not None:
        for policy in cache.bank.policies:
            policy.pin(start, stop)
    cache._pins = spans
