"""Prompt-aware eviction: the settings of a cache that holds the whole prompt and decides
at its end, checked before anything is built.

With ``prompt_aware`` a :class:`~scissorhands.hf.EvictingCache` reads a prompt (every
forward of more than one token, and the first forward) holding up to ``prefill_budget``
positions per (sequence, layer, KV head), each chunk evicting to that cap by the policy's
own rule; it keeps the GQA-reduced attention of the prompt's last ``observation_window``
rows, and when the first decode step begins it evicts every row to the budget with the
policy's ``evict_observed_rows`` (the last rows' summed attention, max-pooled over
``pool_kernel`` held positions; SnapKV, Li et al., 2024, arXiv 2404.14469), then decodes
with the policy's own rule.  The measurements behind the defaults are in
``docs/prompt-aware-research.md``; the options in ``docs/configuration.md``.

This module imports neither torch nor the model: the command line and the lm-eval model
check these settings before any model loads.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

from .errors import InvalidInputError, InvalidTypeError
from .options import SPECS, PolicyOptions, policy_spec

__all__ = ["DEFAULT_OBSERVATION_WINDOW", "DEFAULT_POOL_KERNEL", "DEFAULT_PREFILL_BUDGET", "PROMPT_AWARE_POLICIES",
           "PromptAware", "parse_flag", "parse_odd"]

#: Positions a row may hold while a prompt is read (the cap; memory is bounded by it).
DEFAULT_PREFILL_BUDGET = 4096
#: The prompt's last rows whose attention decides at its end.
DEFAULT_OBSERVATION_WINDOW = 16
#: The max-pooling kernel over held positions (odd; 1: no pooling).
DEFAULT_POOL_KERNEL = 15
#: The policies the rule applies to: those that evict and read attention, in the
#: registry's order.  StreamingLLM reads none (the cache computes no attention for it)
#: and the full cache never evicts, so both refuse ``prompt_aware``.
PROMPT_AWARE_POLICIES: tuple[str, ...] = tuple(name for name, spec in SPECS.items()
                                               if spec.evicts and spec.reads_attention)


#: The most any count may be: positions and budgets are uint32 in the C core.
_MOST = 2**32 - 1


def _count(name: str, value: Any, least: int) -> int:
    """``value`` as an int in ``[least, 2**32 - 1]`` (not a bool), or the error naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidTypeError(f"{name} must be an integer, got {value!r}")
    if int(value) < least:
        raise InvalidInputError(f"{name} must be at least {least}, got {value}")
    if int(value) > _MOST:
        raise InvalidInputError(f"{name} must be at most 2**32 - 1 = {_MOST}, got {value}")
    return int(value)


@dataclass(frozen=True)
class PromptAware:
    """The prompt-aware settings of one cache.

    Attributes
    ----------
    enabled : bool, default False
        Hold the prompt and decide at its end (see the module's docstring); False: every
        chunk evicts to the budget, as before (the other settings are then unused, but
        still checked for their kind).
    prefill_budget : int, default 4096
        Positions each (sequence, layer, KV head) may hold while a prompt is read; at
        least the budget.
    observation_window : int, default 16
        The prompt's last rows whose attention scores the held positions (the last rows
        read, over chunk boundaries); with the policy's sinks, below the budget.
    pool_kernel : int, default 15
        Max-pooling kernel over held positions in kept order, odd, at least 1.
    """

    enabled: bool = False
    prefill_budget: int = DEFAULT_PREFILL_BUDGET
    observation_window: int = DEFAULT_OBSERVATION_WINDOW
    pool_kernel: int = DEFAULT_POOL_KERNEL

    def check(self, policy: str, budget: int | None, options: PolicyOptions | None = None) -> PromptAware:
        """This configuration checked against ``policy`` at ``budget`` with ``options``;
        returns it with plain ints.

        Raises
        ------
        InvalidTypeError
            ``enabled`` not a bool; a count not an integer (bools refused).
        InvalidInputError
            A count out of range (below its least or above ``2**32 - 1``), an even
            ``pool_kernel``; with ``enabled``: a policy that reads no attention
            (``full``, ``streaming-llm``), a pooled budget (``pool``),
            ``prefill_budget`` below the budget, or ``observation_window`` plus the
            policy's sinks not below the budget.
        """
        if not isinstance(self.enabled, bool):
            raise InvalidTypeError(f"prompt_aware must be True or False, got {self.enabled!r}")
        prefill = _count("prefill_budget", self.prefill_budget, 1)
        window = _count("observation_window", self.observation_window, 1)
        kernel = _count("pool_kernel", self.pool_kernel, 1)
        if kernel % 2 == 0:
            raise InvalidInputError(f"pool_kernel must be odd (a window centred on each position), got {kernel}")
        checked = PromptAware(self.enabled, prefill, window, kernel)
        if not self.enabled:
            return checked
        spec = policy_spec(policy)
        if spec.name not in PROMPT_AWARE_POLICIES:
            why = "never evicts" if not spec.evicts else "reads no attention"
            raise InvalidInputError(f"prompt_aware needs a policy that reads attention "
                                    f"({', '.join(PROMPT_AWARE_POLICIES)}): {spec.name} {why}")
        options = options or PolicyOptions()
        if options.pool != 1 and options.pool != "head":
            raise InvalidInputError(f"prompt_aware does not take pooled budgets (pool={options.pool!r}): "
                                    "the prompt's end evicts each row to the budget on its own")
        assert budget is not None
        if prefill < budget:
            raise InvalidInputError(f"prefill_budget must be at least the budget: prefill_budget {prefill} < "
                                    f"budget {budget} (pass a larger prefill_budget)")
        resolved = spec.check(budget, options.values(spec.name, budget))
        sinks = int(resolved.get("sinks", 0))
        if window + sinks >= budget:
            raise InvalidInputError(f"observation_window {window} + sinks {sinks} >= budget {budget}: the window's "
                                    "rows and the sinks are never evicted at the prompt's end, so they must leave "
                                    "room in the budget")
        return checked

    def __bool__(self) -> bool:
        """Whether prompt-aware eviction is on (``if cache.prompt_aware:``)."""
        return self.enabled

    def label(self) -> str:
        """``pa`` settings as a table label writes them (empty when off)."""
        if not self.enabled:
            return ""
        return f"pa cap={self.prefill_budget} w={self.observation_window} k={self.pool_kernel}"


def parse_flag(name: str, raw: Any) -> bool:
    """A boolean setting as lm-eval's model arguments give it (``true``/``false``, 1/0,
    ``on``/``off``, or a bool).

    Raises
    ------
    InvalidInputError
        Anything else, naming ``name``.
    """
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("true", "1", "on", "yes"):
        return True
    if text in ("false", "0", "off", "no"):
        return False
    raise InvalidInputError(f"{name} must be true or false, got {raw!r}")


def parse_odd(text: str) -> int:
    """A pool kernel from the command line: an odd integer at least 1.

    Raises
    ------
    InvalidInputError
        Not an integer, below 1, or even.
    """
    try:
        value = int(str(text).strip(), 10)
    except ValueError:
        raise InvalidInputError(f"{text!r} is not an integer") from None
    try:
        return PromptAware(pool_kernel=value).check("full", None).pool_kernel
    except InvalidInputError as exc:  # the flag's name is argparse's to say ("argument --pool-kernel: ...")
        raise InvalidInputError(str(exc).removeprefix("pool_kernel ")) from None
