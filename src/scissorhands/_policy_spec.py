"""A policy's declaration, :class:`PolicySpec` (its options and their defaults, its
classes, C kind, bytes per slot, score key and plot style), the check of one
configuration's values against a budget, and the refusals it raises in the API's and
the command line's words (:class:`DefaultRefusedError`, :func:`flag_text`,
:func:`protected_message`).  Re-exported by :mod:`scissorhands.options`.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._option_specs import _BY_NAME, OPTIONS, RECENT_WINDOW, OptionSpec
from .errors import InvalidInputError

__all__ = ["DefaultRefusedError", "PolicySpec", "flag_text", "protected_message"]

@dataclass(frozen=True)
class PolicySpec:
    """One policy, declared once: what the registry, the constructors, the CLI, the
    evaluation and the cache know of it.

    Attributes
    ----------
    name : str
        Registry name (``state_dict()["policy"]``, ``--policies``).
    class_name : str
        The class of both backends (``scissorhands.X`` and ``scissorhands.reference.X``).
    options : tuple of OptionSpec
        The options its constructor takes, in order.
    defaults : mapping
        Defaults that differ from the options' own (StreamingLLM's 4 sinks, the
        latest-attention policy's recent window of 1).
    min_recent_window : int
        The least recent window the policy allows (1 for a policy whose score is the
        latest step's attention, as the latest-attention policy's: the newest position
        has no score until a later token attends to it; else 0).
    evicts : bool
        False for the full cache, whose budget is never enforced.
    reads_attention : bool
        Whether the policy reads the attention weights at all.
    paper : str
        Where the behaviour comes from.
    module : str
        The module of :mod:`scissorhands.policies` defining the C-backed class and
        declaring this spec as its ``SPEC``, and of :mod:`scissorhands.reference`
        defining the reference's class.
    kind : str
        The policy's kind in the C core: the name of its ``sh_kind`` constant
        (``SH_H2O``), the ``kind`` of its ``sh_config``.
    slot_bytes : int
        Bytes of state per slot, options off (``memory_bytes()``): the uint32
        position, then the per-slot score (uint32 votes, a float64 score) and one byte
        of selection scratch.
    score_key : str or None
        The per-slot scores' property and ``state_dict()`` key (``"votes"``,
        ``"scores"``), None for a policy that keeps none.
    colour, marker : str
        Plot style: the replay plot's colour and the eval plot's marker (matplotlib
        names; empty for the full cache, drawn as a line of its own).
    order : int
        The policy's place in every table (:data:`~scissorhands._registry.SPECS` lists
        the policies by ascending order; the full cache, 0, first); unique.
    model_runs : bool
        Whether the real-model commands (``eval``, ``longctx``) run the policy when
        ``--policies`` is not given (:data:`~scissorhands._registry.MODEL_POLICIES`); a
        policy that is off still runs when named.
    """

    name: str
    class_name: str
    options: tuple[OptionSpec, ...]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    min_recent_window: int = 0
    evicts: bool = True
    reads_attention: bool = True
    paper: str = ""
    module: str = ""
    kind: str = ""
    slot_bytes: int = 4
    score_key: str | None = None
    colour: str = ""
    marker: str = ""
    order: int = 0
    model_runs: bool = True

    def default(self, option: str) -> Any:
        """This policy's default value of ``option``."""
        return self.defaults.get(option, _BY_NAME[option].default)

    def takes(self, option: str) -> bool:
        """Whether the constructor takes ``option``."""
        return any(o.name == option for o in self.options)

    def check(self, budget: int, values: Mapping[str, Any]) -> dict[str, Any]:
        """Validate this policy's option ``values`` against ``budget``, in constructor
        order (each option, then, after the last option that protects positions, their
        sum against the budget); return every option's kept value.

        Raises
        ------
        InvalidTypeError, InvalidInputError
            An option of the wrong kind or out of range, a recent window below the
            policy's least (:attr:`min_recent_window`), or protected positions (recent
            window plus sinks) not below the budget.  When the policy's default (H2O's
            recent window of 32) is what the budget cannot hold, a
            :class:`DefaultRefusedError` says so and how to pass a smaller value.
        """
        out: dict[str, Any] = {}
        protecting = [o for o in self.options if o.protects]
        for option in self.options:
            value = values.get(option.name, self.default(option.name))
            try:
                if option is RECENT_WINDOW and self.min_recent_window:
                    out[option.name] = self._check_min_window(value, budget)
                else:
                    out[option.name] = option.check(value, budget)
            except InvalidInputError:
                if option.protects and self.is_default(option.name, value) and budget > self._least(option):
                    raise self._default_refused(f"{{name}} {value} (the {self.name} default) needs a "
                                                f"budget above {value}, got budget {budget}", option) from None
                raise
            if protecting and option is protecting[-1]:
                protected = sum(out[o.name] for o in protecting)
                if protected >= budget:
                    message = protected_message({o.name: out[o.name] for o in protecting}, budget)
                    defaulted = next((o for o in protecting if out[o.name] > self._least(o)
                                      and self.is_default(o.name, values.get(o.name, self.default(o.name)))), None)
                    if defaulted is None:
                        raise InvalidInputError(message)
                    raise self._default_refused(
                        f"{message}; {{name}} {out[defaulted.name]} is the {self.name} default", defaulted)
        return out

    def _least(self, option: OptionSpec) -> int:
        """The smallest value this policy allows for a protecting ``option``."""
        return self.min_recent_window if option is RECENT_WINDOW else 0

    def is_default(self, option: str, value: Any) -> bool:
        """Whether ``value`` is this policy's default of ``option`` (the same value of the
        same kind: ``32`` or ``np.int64(32)``, not ``32.0`` or ``True`` for ``1``)."""
        return _same(value, self.default(option))

    def _default_refused(self, template: str, option: OptionSpec) -> InvalidInputError:
        """The refusal of a budget too small for the policy's default of ``option``:
        ``template`` (``{name}`` where the option is named) and how to give a smaller
        value, in the API's words, and in the command line's for :func:`flag_text`."""
        base = template.replace("{name}", option.name)
        fraction = option is RECENT_WINDOW
        return DefaultRefusedError(
            base + f": pass a smaller {option.name}=..." + (" (or a fraction of the budget such as 0.75)"
                                                           if fraction else ""),
            _flags(base) + f": pass a smaller {option.flag} " + ("(a count, or a fraction of the budget "
                                                                "such as 75%)" if fraction else "count"))

    def _check_min_window(self, value: Any, budget: int) -> int:
        """The recent window of a policy that needs at least :attr:`min_recent_window`
        positions in it: checked as usual, then against that least."""
        least = self.min_recent_window
        why = (f"{self.name} needs recent_window >= {least} (the newest position has no score "
               "until a later token attends to it, so it is always kept)")
        try:
            window = RECENT_WINDOW.check(value, budget)
        except InvalidInputError:
            if budget <= least and isinstance(value, numbers.Integral):  # no count fits: say why
                raise InvalidInputError(f"{why}, and so a budget above {least}, got budget {budget}") from None
            raise
        if window < least:
            given = "" if window == value else f" ({value!r} of budget {budget})"
            raise InvalidInputError(f"{why}, got {window}{given}")
        return window


def _same(value: Any, default: Any) -> bool:
    """Whether ``value`` is ``default`` itself: None and flags by identity, an integer
    default by any integer (not bool) equal to it, anything else by type and value."""
    if default is None or isinstance(default, bool):
        return value is default
    if isinstance(default, numbers.Integral):
        return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value == default
    return type(value) is type(default) and value == default


class DefaultRefusedError(InvalidInputError):
    """A budget too small for a policy's default option value (the recent window of 32 at
    a budget of 32 or less): the message says the value is the default and how to pass
    another; ``cli_message`` says it in the command line's flags."""

    def __init__(self, message: str, cli_message: str | None = None) -> None:
        super().__init__(message)
        self.cli_message = _flags(message) if cli_message is None else cli_message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.cli_message))


def _flags(message: str) -> str:
    """``message`` with each option named by its flag (whole words only)."""
    for option in OPTIONS:
        message = re.sub(rf"\b{option.name}\b", option.flag, message)
    return message


def flag_text(error: BaseException) -> str:
    """``error``'s message in the command line's words: its ``cli_message`` when it has
    one, else the message with each option named by its flag (``--recent-window``)."""
    message = getattr(error, "cli_message", None)
    return message if isinstance(message, str) else _flags(str(error))


def protected_message(protected: Mapping[str, int], budget: int) -> str:
    """Why ``budget`` is refused for these protected counts (recent window, sinks): the
    counts that are set, named (``recent_window + sinks (32 + 4)``)."""
    shown = {k: v for k, v in protected.items() if v} or dict(list(protected.items())[:1])
    names = " + ".join(shown)
    values = " + ".join(str(v) for v in shown.values())
    return f"budget must be greater than {names} ({values}), got {budget}"

