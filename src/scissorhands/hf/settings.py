"""What an :class:`~scissorhands.hf.cache.EvictingCache`'s constructor checks before
anything is built: the positions, head and cache modes, the policy configurations (one
for all sequences or one per sequence), the pinned spans (merged, checked by the
policies' own ``pin``, leaving something to evict at a prompt's end) and the
prompt-aware settings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import InvalidInputError, InvalidTypeError
from ..options import PolicyOptions
from ..prompt_aware import DEFAULT_OBSERVATION_WINDOW, DEFAULT_POOL_KERNEL, DEFAULT_PREFILL_BUDGET, PromptAware
from .rows import PolicyConfig
from .storage import CACHE_MODES

#: ``per-head``: one policy row per KV head; ``mean``: one row per layer, fed the mean
#: over all its query heads, whose decisions every KV head follows.
HEAD_MODES = ("per-head", "mean")


#: ``original``: keys keep their rotary rotation and tokens their true positions (as H2O
#: does); ``cache``: per row the held keys sit at ranks 0..n-1 in position order and the
#: query at rank n (StreamingLLM, Xiao et al., ICLR 2024, §3.2), so no distance exceeds
#: the budget, past the trained context too.
POSITION_MODES = ("original", "cache")


def _check_modes(positions: str, head_mode: str, cache_mode: str) -> None:
    """Refuse an unknown positions, head or cache mode (:class:`InvalidInputError`)."""
    if positions not in POSITION_MODES:
        raise InvalidInputError(f"positions must be one of {', '.join(POSITION_MODES)}, got {positions!r}")
    if head_mode not in HEAD_MODES:
        raise InvalidInputError(f"head_mode must be one of {', '.join(HEAD_MODES)}, got {head_mode!r}")
    if cache_mode not in CACHE_MODES:
        raise InvalidInputError(f"cache_mode must be one of {', '.join(CACHE_MODES)}, got {cache_mode!r}")


def _policy_configs(policy: str, budget: int | None, options: PolicyOptions | None, backend: str,
                    positions: str, configs: Sequence[PolicyConfig] | None,
                    option_values: Mapping[str, Any]) -> tuple[list[PolicyConfig], bool]:
    """The checked policy configurations (one per sequence, or one for all) and whether per sequence."""
    if configs is not None:
        if options is not None or option_values:
            raise InvalidInputError("give either configs or a policy with its options, not both")
        configs = list(configs)
        if not configs or not all(isinstance(c, PolicyConfig) for c in configs):
            raise InvalidTypeError("configs must be a non-empty sequence of PolicyConfig")
        per_sequence = True
    else:
        if options is not None and not isinstance(options, PolicyOptions):
            raise InvalidTypeError(f"options must be a PolicyOptions, not {type(options).__name__}")
        try:
            options = (options or PolicyOptions()).replace(**option_values)
        except TypeError:
            fields = list(PolicyOptions.__dataclass_fields__)
            unknown = ", ".join(repr(name) for name in option_values if name not in fields)
            raise InvalidTypeError(
                f"unknown option {unknown}: the policy options are {', '.join(fields)}; the cache's own "
                "settings (archive, prompt_aware, pins, positions, ...) are EvictingCache's keyword "
                "arguments (help(EvictingCache))") from None
        configs = [PolicyConfig(policy, budget, options, backend)]
        per_sequence = False
    for c in configs:
        c.check()
        if positions == "cache" and c.pooled:
            raise InvalidInputError("positions='cache' gives each sequence one query rank, which rows of a "
                                    "shared budget (pool) do not have: use positions='original' with pool")
    return configs, per_sequence


def _prompt_settings(enabled: Any, prefill_budget: int | None, observation_window: int | None,
                     pool_kernel: int | None) -> PromptAware:
    """The prompt-aware settings of the cache's keywords (None: the default); a setting
    given without ``prompt_aware=True`` is refused rather than silently unused."""
    values = {"prefill_budget": prefill_budget, "observation_window": observation_window, "pool_kernel": pool_kernel}
    given: dict[str, int] = {name: value for name, value in values.items() if value is not None}
    if enabled is not True and given:
        raise InvalidInputError(f"{', '.join(f'{n}={v!r}' for n, v in given.items())} applies only with "
                                f"prompt_aware=True (got prompt_aware={enabled!r})")
    return PromptAware(enabled, given.get("prefill_budget", DEFAULT_PREFILL_BUDGET),
                       given.get("observation_window", DEFAULT_OBSERVATION_WINDOW),
                       given.get("pool_kernel", DEFAULT_POOL_KERNEL))


def _check_prompt_aware(settings: PromptAware, configs: Sequence[PolicyConfig], per_sequence: bool) -> PromptAware:
    """The prompt-aware settings checked against the cache's one configuration
    (:meth:`~scissorhands.prompt_aware.PromptAware.check`); refused with one
    configuration per sequence."""
    config = configs[0]
    if settings.enabled is True and per_sequence:
        raise InvalidInputError("prompt_aware takes one policy configuration, not configs= (one per sequence)")
    return settings.check(config.policy, config.budget, config.options)
