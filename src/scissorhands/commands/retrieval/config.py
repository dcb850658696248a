"""One cache configuration as lm-eval's ``--model_args`` give it, checked before any model
loads.

``policy=scissorhands,budget=256,recent_window=0.75,sinks=4`` arrives from lm-eval as a
dict (``simple_parse_args_string`` has already turned ``256`` into an int, ``0.75`` into
a float and ``none`` into None); text values are parsed by the option's own parser
(:attr:`scissorhands.options.OptionSpec.parse`, so ``recent_window=50%`` works as
``--recent-window 50%`` does), and the whole is checked by the policy's
:meth:`~scissorhands.options.PolicySpec.check`.  No option is declared here.

This module imports neither torch nor lm-eval.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from scissorhands.errors import InvalidInputError, ScissorhandsError
from scissorhands.options import BACKENDS, OPTIONS, SPECS, PolicyOptions, config_label, policy_spec, preset
from scissorhands.prompt_aware import PromptAware, parse_flag

__all__ = ["CACHE_ARGS", "CacheConfig", "pop_cache_config"]

#: The ``--model_args`` keys this model takes beside the policy options and lm-eval's own.
CACHE_ARGS = ("policy", "budget", "prefill_chunk", "backend", "head_mode", "positions", "attention", "prompt_aware",
              "prefill_budget", "observation_window", "pool_kernel", "archive")
#: What ``archive=`` takes (``none``/``off``: no recall tier).
ARCHIVE_VALUES = ("none", "off", "float32", "int8")
#: The prompt-aware settings among them (:class:`~scissorhands.prompt_aware.PromptAware`).
PROMPT_ARGS = ("prefill_budget", "observation_window", "pool_kernel")
#: Prompt tokens per forward while an evicting cache reads a prompt (None: one forward).
DEFAULT_PREFILL_CHUNK = 64


@dataclass(frozen=True)
class CacheConfig:
    """What every request's fresh :class:`~scissorhands.hf.EvictingCache` is built from.

    Attributes
    ----------
    policy : str
        A registry name (see :data:`scissorhands.options.SPECS`).
    budget : int or None
        Positions each (layer, KV head) holds after every forward; None for ``full``.
    values : mapping
        The options given (by option name), as the policy's constructor will take them.
    prefill_chunk : int or None, default 64
        Tokens per forward while an evicting cache reads a prompt or a scored
        continuation (transformers' ``prefill_chunk_size`` in generation), the cache
        evicting after each; None: one forward.  A cache that never evicts always reads
        in one forward, as the stock model does.
    backend, head_mode, positions : str
        As :class:`~scissorhands.hf.EvictingCache` takes them (the last two checked by
        :func:`scissorhands.commands.retrieval.model.check_modes`, which needs torch).
    attention : {"sdpa", "eager"}
        The implementation the model is loaded with (when this model loads it).
    prompt : PromptAware
        ``prompt_aware``, ``prefill_budget``, ``observation_window``, ``pool_kernel``
        (checked against the policy and budget).
    archive : {None, "float32", "int8"}
        The recall tier (:mod:`scissorhands.hf.recall`; needs ``prompt_aware``).
    preset : str or None
        The preset named as the policy (``policy=recommended``), resolved into the
        fields above; None for a policy's name.
    """

    policy: str = "full"
    budget: int | None = None
    values: Mapping[str, Any] = field(default_factory=dict)
    prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK
    backend: str = "native"
    head_mode: str = "per-head"
    positions: str = "original"
    attention: str = "sdpa"
    prompt: PromptAware = field(default_factory=PromptAware)
    archive: str | None = None
    preset: str | None = None

    @property
    def evicts(self) -> bool:
        """Whether the policy ever evicts (False for ``full``)."""
        return SPECS[self.policy].evicts

    @property
    def options(self) -> PolicyOptions:
        """The option values as a :class:`~scissorhands.options.PolicyOptions`."""
        return PolicyOptions(**self.values)

    def label(self) -> str:
        """``h2o budget=128 rw=32 sinks=0 pool=...``: the policy, budget and options."""
        if not self.evicts:
            return self.policy
        resolved = SPECS[self.policy].check(self.budget or 0, self.options.values(self.policy, self.budget))
        aware = f" {self.prompt.label()}" if self.prompt.enabled else ""
        if self.archive is not None:
            aware += f" archive={self.archive}"
        return f"{self.policy} budget={self.budget} {config_label(self.policy, resolved)}{aware}"

    def prompt_args(self) -> dict[str, Any]:
        """The prompt-aware model arguments (empty when off), as ``--model_args`` take them."""
        if not self.prompt.enabled:
            return {}
        prompt = self.prompt
        args = {"prompt_aware": True, "prefill_budget": prompt.prefill_budget,
                "observation_window": prompt.observation_window, "pool_kernel": prompt.pool_kernel}
        return args if self.archive is None else {**args, "archive": self.archive}

    def cache_kwargs(self) -> dict[str, Any]:
        """Keywords of :meth:`scissorhands.hf.EvictingCache.from_model`."""
        kwargs = {"policy": self.policy, "budget": self.budget, "options": self.options, "backend": self.backend,
                  "head_mode": self.head_mode, "positions": self.positions}
        if self.prompt.enabled:
            kwargs.update(prompt_aware=True, prefill_budget=self.prompt.prefill_budget,
                          observation_window=self.prompt.observation_window, pool_kernel=self.prompt.pool_kernel)
        if self.archive is not None:
            kwargs["archive"] = self.archive
        return kwargs


def _value(option: Any, raw: Any) -> Any:
    """One option's value: text through the option's parser, anything else as given
    (the constructor checks it)."""
    if isinstance(raw, str):
        try:
            return option.parse(raw)
        except ScissorhandsError as exc:
            raise InvalidInputError(f"{option.name}={raw}: {exc}") from None
    return raw


def _positive_or_none(name: str, raw: Any) -> int | None:
    if raw is None or (isinstance(raw, str) and raw.strip().lower() in ("none", "off", "0")):
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise InvalidInputError(f"{name} must be a positive integer or none, got {raw!r}")
    return raw


def _integer(name: str, raw: Any) -> Any:
    """A prompt-aware count: text parsed as a base-10 integer, anything else as given
    (:meth:`~scissorhands.prompt_aware.PromptAware.check` checks it)."""
    if isinstance(raw, str):
        try:
            return int(raw.strip(), 10)
        except ValueError:
            raise InvalidInputError(f"{name} must be an integer, got {raw!r}") from None
    return raw


def _prompt_aware(args: MutableMapping[str, Any], policy: str, budget: Any,
                  values: Mapping[str, Any]) -> PromptAware:
    """Take the prompt-aware keys out of ``args``, checked against the policy."""
    enabled = parse_flag("prompt_aware", args.pop("prompt_aware", False))
    given = {name: _integer(name, args.pop(name)) for name in PROMPT_ARGS if name in args}
    if given and not enabled:
        raise InvalidInputError(f"{', '.join(given)} {'apply' if len(given) > 1 else 'applies'} only with "
                                "prompt_aware=true")
    return PromptAware(enabled, **given).check(policy, budget, PolicyOptions(**values))


def _archive(raw: Any, prompt_aware: bool, policy: str) -> str | None:
    """``archive=``: none/off, float32 or int8, with ``prompt_aware=true`` and a policy
    that evicts by attention (the rest is checked when the cache is built)."""
    if raw is None:
        return None
    text = str(raw).strip().lower()
    if text not in ARCHIVE_VALUES:
        raise InvalidInputError(f"archive must be one of {', '.join(ARCHIVE_VALUES)}, got {raw!r}")
    if text in ("none", "off"):
        return None
    if not prompt_aware:
        raise InvalidInputError(f"archive={text} needs prompt_aware=true (what is archived comes back at a "
                                "prompt's end)")
    spec = SPECS[policy]
    if not (spec.evicts and spec.reads_attention):
        by_attention = ", ".join(s.name for s in SPECS.values() if s.evicts and s.reads_attention)
        raise InvalidInputError(f"archive={text} needs a policy that evicts by attention ({by_attention}), "
                                f"not {policy!r}")
    return text


def pop_cache_config(args: MutableMapping[str, Any]) -> CacheConfig:
    """Take this model's keys (:data:`CACHE_ARGS` and every policy option) out of
    ``args`` and return the checked configuration; the other keys stay for lm-eval.
    A preset's name as the policy (``policy=recommended``) stands for its policy, option
    values and ``prompt_aware``, each under the keys given explicitly.

    Raises
    ------
    InvalidInputError, InvalidTypeError
        An unknown policy, a missing or bad budget, an option the policy does not take,
        or values the policy refuses (``recent_window + sinks >= budget``, ...), each
        named as given.
    """
    policy = str(args.pop("policy", "full")).strip().lower()
    chosen = preset(policy)
    if chosen is not None:
        policy = chosen.policy
        args.setdefault("prompt_aware", chosen.prompt_aware)
    spec = policy_spec(policy)
    budget = args.pop("budget", None)
    values: dict[str, Any] = {}
    for option in OPTIONS:
        if option.name in args:
            raw = args.pop(option.name)
            if not spec.takes(option.name):
                raise InvalidInputError(f"policy {policy} takes no {option.name} (it takes "
                                        f"{', '.join(o.name for o in spec.options) or 'no option'})")
            values[option.name] = _value(option, raw)
    if chosen is not None:
        values = {**chosen.values, **values}
    if spec.evicts:
        if budget is None:
            raise InvalidInputError(f"policy {policy} needs a budget (budget=N positions per layer and KV head)")
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise InvalidInputError(f"budget must be a positive integer, got {budget!r}")
        spec.check(budget, PolicyOptions(**values).values(policy, budget))
    elif budget is not None:
        budget = None  # the full cache keeps everything: a budget means nothing to it
    prompt = _prompt_aware(args, policy, budget, values)
    archive = _archive(args.pop("archive", None), prompt.enabled, policy)
    chunk = _positive_or_none("prefill_chunk", args.pop("prefill_chunk", DEFAULT_PREFILL_CHUNK))
    config = CacheConfig(
        policy=policy, budget=budget, values=values, prefill_chunk=chunk,
        backend=str(args.pop("backend", "native")), head_mode=str(args.pop("head_mode", "per-head")),
        positions=str(args.pop("positions", "original")), attention=str(args.pop("attention", "sdpa")),
        prompt=prompt, archive=archive, preset=None if chosen is None else chosen.name)
    if config.backend not in BACKENDS:
        raise InvalidInputError(f"backend must be one of {', '.join(BACKENDS)}, got {config.backend!r}")
    return config
