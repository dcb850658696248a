"""The policies' registry and options: one declaration each, taken whole by every caller.

Every policy is described once, by a :class:`PolicySpec` in :data:`SPECS`: its registry
name, the options it takes (in constructor order) and their defaults, and the paper.
Every option is described once, by an :class:`OptionSpec`: its constructor keyword,
its default (the seed's semantics: off), how a value is checked against a budget, how
it is written on the command line and in tables.  :class:`PolicyOptions` holds one
configuration's values; the CLI, the evaluation, the transformers cache and the bench
take it whole and ask :func:`make_policy` for a policy, so none of them re-declares an
option or decides by policy name which option applies.

Adding an option therefore means: the C core (``csrc/``), one :class:`OptionSpec` here
(and the field of :class:`PolicyOptions`), the constructor of the policy class in both
backends (:mod:`scissorhands.policies`, :mod:`scissorhands.reference`), and tests.

This module imports no native code and no torch: the reference backend uses it too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import itertools
import math
import numbers
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, TypeVar

import numpy as np

from ._shared import MAX_HEADS, MAX_HISTORY_WINDOW, check_flag, check_int, check_recent_window
from .errors import InvalidInputError, InvalidTypeError, ScissorhandsError, UnknownPolicyError

__all__ = [
    "BACKENDS",
    "MODEL_POLICIES",
    "OPTIONS",
    "POLICY_NAMES",
    "PRESETS",
    "RECOMMENDED",
    "SPECS",
    "DefaultRefusedError",
    "OptionSpec",
    "PolicyOptions",
    "PolicyRegistry",
    "PolicySpec",
    "Preset",
    "expand_preset",
    "flag_text",
    "make_policy",
    "parse_recent_window",
    "policy_classes",
    "preset",
    "spec_fraction",
    "sweep",
]

#: The two implementations of every policy: ``native`` (the C core) and ``reference``
#: (pure Python, :mod:`scissorhands.reference`).
BACKENDS = ("native", "reference")


# ----------------------------------------------------------------------------- recent window


def spec_fraction(spec: str) -> Fraction:
    """The fraction of the budget a recent-window spec written ``50%`` or ``0.5x`` asks
    for, exactly.

    Raises
    ------
    InvalidInputError
        ``spec`` is not a fraction with one of those suffixes, or is outside
        ``[0%, 100%)``.
    """
    raw = spec.strip().lower() if isinstance(spec, str) else ""
    if not raw.endswith(("%", "x")):
        raise InvalidInputError(f"{spec!r} is not a fraction like 50% or 0.5x")
    try:
        fraction = Fraction(raw[:-1].strip())
    except (ValueError, ZeroDivisionError):
        raise InvalidInputError(f"{spec!r} is not a fraction like 50% or 0.5x") from None
    if raw.endswith("%"):
        fraction /= 100
    if not 0 <= fraction < 1:
        raise InvalidInputError(f"{spec!r} is not in [0%, 100%) of the budget")
    return fraction


def parse_recent_window(text: str) -> int | str:
    """A recent window as written on the command line: an integer count of positions,
    or a fraction of each budget written ``50%`` or ``0.5x`` (kept as that normalised
    string, resolved per budget by :func:`resolve_recent_window`).

    Raises
    ------
    InvalidInputError
        Neither a non-negative integer nor a fraction in ``[0%, 100%)``.
    """
    raw = text.strip().lower()
    if raw.endswith(("%", "x")):
        spec_fraction(raw)
        return raw[:-1].strip() + raw[-1]
    try:
        return _parse_count(text)
    except InvalidInputError:
        if "." in raw:  # a bare fraction, as the Python API takes it
            raise InvalidInputError(f"{text!r} is not an integer: write a fraction of the budget "
                                    f"as {text.strip()}x or as a percentage") from None
        raise


def resolve_recent_window(value: Any, budget: int) -> int:
    """The recent window for ``budget``: a count as it is, a ``50%``/``0.5x`` spec or a
    float/``Fraction`` as ``floor(fraction * budget)`` (the constructors' rule,
    :func:`scissorhands._shared.check_recent_window`)."""
    if isinstance(value, str):
        try:
            fraction = spec_fraction(value)
        except InvalidInputError as exc:  # named: the spec may reach here from far away
            text = value.strip()
            number = _number(text)
            hint = ""
            if number is not None and number >= 1 and number == int(number):
                hint = f" (a count of positions is an integer: recent_window={int(number)})"
            elif number is not None and 0 <= number < 1:
                hint = f" (a fraction is a float, recent_window={text}, or a string with its suffix, '{text}x')"
            raise InvalidInputError(f"recent_window {exc}{hint}") from None
        return check_recent_window(fraction, budget)
    return check_recent_window(value, budget)


def _number(text: str) -> float | None:
    """``text`` as a finite number, or None when it does not read as one."""
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _parse_count(text: str) -> int:
    try:
        value = int(text.strip(), 10)
    except ValueError:
        raise InvalidInputError(f"{text!r} is not an integer") from None
    if value < 0:
        raise InvalidInputError(f"{value} is below the minimum 0")
    return value


def _parse_history_window(text: str) -> int | None:
    raw = text.strip().lower()
    if raw in ("none", "off"):
        return None
    try:
        value = int(raw, 10)
    except ValueError:
        raise InvalidInputError(f"{text!r} is not an integer or 'none'") from None
    if not 0 <= value <= MAX_HISTORY_WINDOW:
        raise InvalidInputError(f"{value} is not in [1, {MAX_HISTORY_WINDOW}] (or 0/none: off)")
    return value or None


def _parse_on_off(text: str) -> bool:
    raw = text.strip().lower()
    if raw in ("on", "true", "1", "yes"):
        return True
    if raw in ("off", "false", "0", "no"):
        return False
    raise InvalidInputError(f"{text!r} is not on or off")


# ----------------------------------------------------------------------------- options


@dataclass(frozen=True)
class OptionSpec:
    """One policy option, declared once.

    Attributes
    ----------
    name : str
        The constructor keyword, ``state_dict()["params"]`` key and JSON field.
    default : object
        The value that means "off": the seed system's semantics.
    check : callable
        ``check(value, budget) -> value``: the constructors' validation (raising
        ``InvalidTypeError``/``InvalidInputError``), returning the value kept.
    protects : bool
        The option counts positions that are never evicted; the sum of such options
        must stay below the budget.
    short, long : str
        Names in table labels (``rw=32``) and in settings (``recent window 32``).
    flag : str
        The command-line flag; where a command sweeps, it takes several values, each a
        run of its own.
    parse : callable
        ``parse(text) -> value`` for one command-line value (``InvalidInputError`` if bad).
    help : str
        The flag's help text; ``{sweep}`` marks where a sweeping command says so, and
        ``{policies}``, ``{defaults}``, ``{least}`` what the registry says
        (:meth:`help_text`).
    sweep : str
        What several values of the flag do, in a sweeping command's help.
    show_off : bool
        Labels show the option even at its default (``hw=off``); else only when set.
    """

    name: str
    default: Any
    check: Callable[[Any, int], Any]
    short: str
    long: str
    flag: str
    parse: Callable[[str], Any]
    help: str
    metavar: str
    protects: bool = False
    show_off: bool = True
    sweep: str = "several values run each"

    def help_text(self, several: bool) -> str:
        """The flag's help: with what several values do when ``several``, else without;
        ``{policies}`` (those taking the option), ``{defaults}`` (each one's default) and
        ``{least}`` (a policy's least recent window) come from the registry."""
        takers = [spec for spec in SPECS.values() if spec.takes(self.name)]
        groups: dict[str, list[str]] = {}
        for spec in takers:
            groups.setdefault(self.text(spec.default(self.name)), []).append(spec.name)
        least = "".join(f"; {spec.name} needs at least {spec.min_recent_window}"
                        for spec in takers if self is RECENT_WINDOW and spec.min_recent_window)
        return (self.help.replace("{sweep}", f"; {self.sweep}" if several else "")
                .replace("{policies}", _listed([spec.name for spec in takers]))
                .replace("{defaults}", ", ".join(f"{_listed(names)} {value}" for value, names in groups.items()))
                .replace("{least}", least))

    def text(self, value: Any) -> str:
        """``value`` as labels write it: ``off`` for None, the value otherwise."""
        return "off" if value is None else str(value)


def _listed(names: Sequence[str]) -> str:
    """``a, b and c``."""
    return " and ".join(filter(None, (", ".join(names[:-1]), names[-1] if names else "")))


def _check_history_window(value: Any, budget: int) -> int | None:
    return None if value is None else check_int("history_window", value, 1, MAX_HISTORY_WINDOW)


RECENT_WINDOW = OptionSpec(
    name="recent_window", default=32, check=check_recent_window, short="rw", long="recent window",
    flag="--recent-window", parse=parse_recent_window, metavar="R", protects=True,
    help="recent window of {policies}: the newest positions, never evicted; "
    "in positions or as a fraction of each budget (50%% or 0.5x, rounded down){sweep} "
    "(default: each policy's own, {defaults}{least})")
SINKS = OptionSpec(
    name="sinks", default=0, check=lambda v, b: check_int("sinks", v, 0, b - 1), short="sinks",
    long="sinks", flag="--sinks", parse=_parse_count, metavar="S", protects=True,
    help="attention sinks: the first positions held, never evicted, of every policy taking "
    "them{sweep} (default: each policy's own, {defaults})")
HISTORY_WINDOW = OptionSpec(
    name="history_window", default=None, check=_check_history_window, short="hw",
    long="history window", flag="--history-window", parse=_parse_history_window, metavar="W",
    help=f"{{policies}}' history window in decode steps (1-{MAX_HISTORY_WINDOW}; 0 or none: "
    "off){sweep} (default: none)")
VOTE_RATE = OptionSpec(
    name="vote_rate", default=False, check=lambda v, b: check_flag("vote_rate", v), short="rate",
    long="vote rate", flag="--vote-rate", parse=_parse_on_off, metavar="ON|OFF", show_off=False,
    sweep="'off on' runs both",
    help="{policies} evicts by votes per decode step held (on) or by votes (off){sweep} "
    "(default: off)")

#: What ``pool`` may name instead of a number of rows: each row its own budget (1), a
#: layer's KV heads sharing theirs, or every layer and KV head of a sequence sharing
#: theirs; the transformers cache turns the last two into numbers of rows.
POOL_SCOPES = ("head", "layer", "model")


def _check_pool(value: Any, budget: int) -> int | str:
    if isinstance(value, str):
        if value not in POOL_SCOPES:
            raise InvalidInputError(f"pool must be a number of rows or one of {', '.join(POOL_SCOPES)}, "
                                    f"got {value!r}")
        return 1 if value == "head" else value
    return check_int("pool", value, 1, MAX_HEADS)


def _parse_pool(text: str) -> int | str:
    raw = text.strip().lower()
    if raw in POOL_SCOPES:
        return 1 if raw == "head" else raw
    try:
        value = _parse_count(text)
    except InvalidInputError:  # not a count at all: the same message, which names the scopes
        value = 0
    if value < 1:
        raise InvalidInputError(f"{text!r} is not a number of rows >= 1 or one of {', '.join(POOL_SCOPES)}")
    return value


POOL = OptionSpec(
    name="pool", default=1, check=_check_pool, short="pool", long="budget pool", flag="--pool",
    parse=_parse_pool, metavar="P", show_off=False, sweep="several values run each",
    help="rows sharing one budget (Ada-KV), for {policies}: head (each KV head "
    "its own budget), layer (a layer's KV heads share theirs: the least-ranked evictable "
    "position among them goes), model (every layer and KV head of a sequence share "
    "theirs) or a number of consecutive rows{sweep} (default: head)")

#: Every option, in the order constructors take (and validate) them.
OPTIONS: tuple[OptionSpec, ...] = (RECENT_WINDOW, SINKS, HISTORY_WINDOW, VOTE_RATE, POOL)
_BY_NAME = {o.name: o for o in OPTIONS}


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
        Defaults that differ from the options' own (StreamingLLM's 4 sinks, TOVA's
        recent window of 1).
    min_recent_window : int
        The least recent window the policy allows (TOVA: 1, since the newest position
        has no score until a later token attends to it; else 0).
    evicts : bool
        False for the full cache, whose budget is never enforced.
    reads_attention : bool
        Whether the policy reads the attention weights at all.
    paper : str
        Where the behaviour comes from.
    module : str
        The module of :mod:`scissorhands.policies` defining the C-backed class, and of
        :mod:`scissorhands.reference` defining the reference's (named here, not
        imported: both packages import this module).
    kind : str
        The policy's kind in the C core: the name of its ``sh_kind`` constant
        (``SH_TOVA``), the ``kind`` of its ``sh_config``.
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


#: Every policy, by registry name, in the order tables list them: the one place a
#: policy is declared (see docs/adding-a-policy.md for what else a new one needs).
SPECS: dict[str, PolicySpec] = {
    "full": PolicySpec(
        "full", "Full", (), evicts=False, reads_attention=False,
        paper="the full cache (the baseline)",
        module="full", kind="SH_FULL", slot_bytes=4),
    "streaming-llm": PolicySpec(
        "streaming-llm", "StreamingLLM", (SINKS,), defaults={"sinks": 4}, reads_attention=False,
        paper="Xiao et al., ICLR 2024, arXiv 2309.17453",
        module="streaming_llm", kind="SH_STREAMING_LLM", slot_bytes=4, colour="tab:blue", marker="s"),
    "h2o": PolicySpec(
        "h2o", "H2O", (RECENT_WINDOW, SINKS, POOL),
        paper="Zhang et al., NeurIPS 2023, arXiv 2306.14048",
        module="h2o", kind="SH_H2O", slot_bytes=13, score_key="scores", colour="tab:orange", marker="^"),
    "tova": PolicySpec(
        "tova", "TOVA", (RECENT_WINDOW, SINKS, POOL), defaults={"recent_window": 1},
        min_recent_window=1,
        paper='Oren et al., 2024, arXiv 2401.06104 ("Transformers are Multi-State RNNs")',
        module="tova", kind="SH_TOVA", slot_bytes=13, score_key="scores", colour="tab:purple", marker="v"),
    "scissorhands": PolicySpec(
        "scissorhands", "Scissorhands", (RECENT_WINDOW, SINKS, HISTORY_WINDOW, VOTE_RATE, POOL),
        paper="Liu et al., NeurIPS 2023, arXiv 2305.17118",
        module="scissorhands", kind="SH_SCISSORHANDS", slot_bytes=9, score_key="votes",
        colour="tab:green", marker="o"),
}
#: The registry names, in table order.
POLICY_NAMES: tuple[str, ...] = tuple(SPECS)
#: What the real-model commands (``eval``, ``longctx``) run unless ``--policies`` says
#: otherwise: each configuration costs them a model sequence, and their documented
#: tables predate TOVA, which runs when named.
MODEL_POLICIES: tuple[str, ...] = ("full", "streaming-llm", "h2o", "scissorhands")


def policy_spec(name: str) -> PolicySpec:
    """The spec of registry name ``name``.

    Raises
    ------
    UnknownPolicyError
        Unknown name (an :class:`~scissorhands.errors.InvalidInputError`; the message
        lists the known ones).
    """
    try:
        return SPECS[name]
    except (KeyError, TypeError):
        raise _unknown_policy(name) from None


_P = TypeVar("_P")


def _unknown_policy(name: object) -> UnknownPolicyError:
    return UnknownPolicyError(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")


class PolicyRegistry(dict[str, _P]):
    """Registry name -> policy class (``POLICIES`` of :mod:`scissorhands.policies` and of
    :mod:`scissorhands.reference`): a plain ``dict`` whose lookup of an unknown name
    raises :class:`~scissorhands.errors.UnknownPolicyError` (a ``KeyError``) listing the
    known names."""

    def __missing__(self, name: str) -> _P:
        raise _unknown_policy(name)


# ----------------------------------------------------------------------------- one configuration


@dataclass(frozen=True)
class PolicyOptions:
    """The option values of one configuration, for any policy.

    A policy takes the options its :class:`PolicySpec` lists; an option set for a
    policy that does not take it is refused (:meth:`check_taken`), as its constructor
    refuses the keyword, so a value is never silently dropped.

    Parameters
    ----------
    recent_window : int, float, Fraction, str or None, default None
        Newest positions never evicted (H2O, TOVA, Scissorhands): a count, a fraction
        of the budget in ``[0, 1)``, or a ``"50%"``/``"0.5x"`` spec, rounded down; None:
        each policy's own default (H2O and Scissorhands 32, TOVA 1).
    sinks : int or None, default None
        First positions never evicted (StreamingLLM, H2O, TOVA, Scissorhands); None:
        each policy's own default (StreamingLLM 4, the others 0).
    history_window : int or None, default None
        Scissorhands: decode steps a vote counts for (1-64); None: forever.
    vote_rate : bool, default False
        Scissorhands: evict by votes per decode step held.
    pool : int or {"layer", "model"}, default 1
        H2O, TOVA, Scissorhands: consecutive rows sharing one budget (Ada-KV); ``"layer"``
        and ``"model"`` are resolved by the transformers cache (``pools``).
    """

    recent_window: int | float | Fraction | str | None = None
    sinks: int | None = None
    history_window: int | None = None
    vote_rate: bool = False
    pool: int | str = 1

    def __post_init__(self) -> None:
        # NumPy scalars kept as the Python numbers they equal (what a sweep's arrays give),
        # so that the options print, compare and serialise as the same options written by hand.
        for option in dataclasses.fields(self):
            value = getattr(self, option.name)
            if isinstance(value, np.generic):
                object.__setattr__(self, option.name, value.item())

    def values(self, policy: str, budget: int | None,
               pools: Mapping[str, int] | None = None) -> dict[str, Any]:
        """The constructor keywords of ``policy`` at ``budget``: only the options it
        takes, a recent-window spec resolved to positions, ``recent_window=None`` and
        ``sinks=None`` left out (the policy's default), a pool named by scope resolved
        by ``pools`` (scope -> rows).

        Raises
        ------
        InvalidTypeError
            An option set (not at this class's default) that ``policy`` does not take.
        InvalidInputError
            An unknown policy; a pool named by a scope that ``pools`` does not resolve.
        """
        spec = policy_spec(policy)
        self.check_taken(policy)
        out: dict[str, Any] = {}
        for option in spec.options:
            value = getattr(self, option.name)
            if option in (RECENT_WINDOW, SINKS) and value is None:
                continue
            if option is RECENT_WINDOW and isinstance(value, str):
                value = resolve_recent_window(value, budget if budget is not None else 0)
            if option is POOL and isinstance(value, str):
                value = _check_pool(value, 0)
                if isinstance(value, str):
                    if pools is None or value not in pools:
                        raise InvalidInputError(
                            f"pool {value!r} needs a model's layers and KV heads (the transformers "
                            "cache resolves it); a policy takes a number of rows")
                    value = pools[value]
            out[option.name] = value
        return out

    def given(self) -> dict[str, Any]:
        """The options set: those not at this class's defaults (which mean "each
        policy's own"), by the same test as :meth:`PolicySpec.is_default` (``pool=1``
        and ``"head"`` are the default; ``True`` or ``0`` for ``vote_rate`` are not)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not _same(value, f.default) and not (f.name == "pool" and value == "head"):
                out[f.name] = value
        return out

    def check_taken(self, policy: str) -> None:
        """Refuse options set for a policy that does not take them (the constructor
        would refuse the keyword; one configuration is one policy's).

        Raises
        ------
        InvalidTypeError
            The first such option, named with the policy and the options it takes.
        InvalidInputError
            Unknown policy.
        """
        spec = policy_spec(policy)
        for name, value in self.given().items():
            if not spec.takes(name):
                takes = ", ".join(o.name for o in spec.options) or "no options"
                raise InvalidTypeError(f"{policy} takes no {name} (it takes {takes}), got {name}={value!r}")

    def replace(self, **changes: Any) -> PolicyOptions:
        """A copy with some values changed."""
        return dataclasses.replace(self, **changes)


def policy_classes(backend: str = "native") -> Mapping[str, type]:
    """The registry of a backend: registry name -> class.

    Raises
    ------
    InvalidInputError
        Unknown backend.
    ScissorhandsError
        The native extension cannot be imported (not built).
    """
    if backend not in BACKENDS:
        raise InvalidInputError(f"backend must be 'native' or 'reference', got {backend!r}")
    module = "scissorhands.policies" if backend == "native" else "scissorhands.reference"
    try:
        registry: Mapping[str, type] = importlib.import_module(module).POLICIES
    except ImportError as exc:
        raise ScissorhandsError(
            f"the {backend} backend is not available ({exc}); build the extension "
            "(pip install -e .) or use the reference backend") from None
    return registry


def make_policy(name: str, budget: int | None, options: PolicyOptions | None = None, *,
                heads: int = 1, backend: str = "native", pools: Mapping[str, int] | None = None,
                pins: Any = ()) -> Any:
    """Build one policy of the registry, configured by ``options``.

    Parameters
    ----------
    name : {"full", "streaming-llm", "h2o", "tova", "scissorhands"}
    budget : int or None
        Positions held per row after each eviction; None only for ``full``.
    options : PolicyOptions, optional
        The option values (default: every option at its default); an option set that
        the policy does not take is refused.
    heads : int, default 1
        Independent rows in the policy object.
    backend : {"native", "reference"}
    pools : mapping, optional
        Rows per pool of each scope a ``pool`` option may name (``{"layer": 3,
        "model": 90}``); see :meth:`PolicyOptions.values`.
    pins : sequence of (start, stop), default ()
        Spans pinned at construction; a recent window given as a fraction (``0.75``,
        ``"75%"``) is then that fraction of what the pins and sinks leave of the budget.

    Raises
    ------
    InvalidInputError, InvalidTypeError
        Unknown name or backend, a missing budget, an option the policy does not take,
        or values the policy refuses; all before anything is built.
    """
    spec = policy_spec(name)
    options = options or PolicyOptions()
    if not isinstance(options, PolicyOptions):
        raise InvalidTypeError(f"options must be a PolicyOptions, not {type(options).__name__}")
    options.check_taken(name)
    cls = policy_classes(backend)[name]
    if not spec.evicts:
        return cls(budget=budget, heads=heads)
    if budget is None:
        raise InvalidInputError(f"policy {name!r} needs a budget")
    values = options.values(name, budget, pools)
    window = options.recent_window if spec.takes("recent_window") else None
    if pins and isinstance(window, str):  # a fraction stays one, to share what the pins leave
        with contextlib.suppress(InvalidInputError):  # a count written as text: resolved as it was
            values["recent_window"] = spec_fraction(window)
    return cls(budget=budget, heads=heads, **values, **({"pins": pins} if pins else {}))


# ----------------------------------------------------------------------------- labels


def _flag_text(option: OptionSpec, value: Any) -> str:
    """An option shown only when set: its short name for a flag turned on
    (``rate``), else ``short=value`` (``pool=layer``)."""
    return option.short if value is True else f"{option.short}={option.text(value)}"


def _shown(spec: PolicySpec, values: Mapping[str, Any]) -> list[tuple[OptionSpec, Any]]:
    return [(o, values.get(o.name, spec.default(o.name))) for o in spec.options]


def setting(policy: str, values: Mapping[str, Any]) -> str:
    """A configuration as the replay table names it: the policy's first option, then
    the others that are not at their default (``recent window 32, sinks 4``); ``-`` for
    a policy without options."""
    spec = policy_spec(policy)
    parts = [f"{o.long} {o.text(v)}" for i, (o, v) in enumerate(_shown(spec, values))
             if i == 0 or v != spec.default(o.name)]
    return ", ".join(parts) or "-"


def config_label(policy: str, values: Mapping[str, Any], window_spec: str | None = None) -> str:
    """A configuration as the eval table labels it: every option of the policy
    (``rw=51 (50%) sinks=0 hw=off``), a flag only when on; ``-`` without options.
    ``window_spec`` is the fraction the recent window came from, when given as one."""
    spec = policy_spec(policy)
    parts = []
    for option, value in _shown(spec, values):
        if not option.show_off:
            if value != spec.default(option.name):
                parts.append(_flag_text(option, value))
            continue
        text = f"{option.short}={option.text(value)}"
        if option is RECENT_WINDOW and window_spec is not None:
            text += f" ({window_spec})"
        parts.append(text)
    return " ".join(parts) or "-"


def series_label(policy: str, values: Mapping[str, Any], window_spec: str | None = None) -> str:
    """A configuration across budgets (a plot line, a report row): the policy and its
    options as given (a recent window given as a fraction stays that fraction), options
    off by default shown only when set (``scissorhands rw=50% sinks=4 hw=32 rate``)."""
    spec = policy_spec(policy)
    parts = [policy]
    for option, value in _shown(spec, values):
        if option is RECENT_WINDOW:
            parts.append(f"rw={value if window_spec is None else window_spec}")
        elif not option.show_off:
            if value != spec.default(option.name):
                parts.append(_flag_text(option, value))
        elif option.default is None and value is None:
            continue
        else:
            parts.append(f"{option.short}={option.text(value)}")
    return " ".join(parts)


# ----------------------------------------------------------------------------- sweeps


@dataclass(frozen=True)
class Run:
    """One configuration of a sweep: a policy at a budget (None: never evicts) with its
    option values, resolved (``values``), and the fraction a recent window came from."""

    policy: str
    budget: int | None
    values: Mapping[str, Any]
    window_spec: str | None = None
    #: The preset this configuration is (``"recommended"``), or None.
    preset: str | None = None

    @property
    def options(self) -> PolicyOptions:
        """The values as a :class:`PolicyOptions`."""
        return PolicyOptions(**self.values)

    def as_dict(self) -> dict[str, Any]:
        """Plain data: ``policy``, ``budget``, each option value (the recent window
        followed by ``recent_window_spec`` when it came from a fraction), and
        ``preset`` when the run is one."""
        out: dict[str, Any] = {"policy": self.policy, "budget": self.budget}
        for name, value in self.values.items():
            out[name] = value
            if name == "recent_window" and self.window_spec is not None:
                out["recent_window_spec"] = self.window_spec
        if self.preset is not None:
            out["preset"] = self.preset
        return out


def with_presets(runs: list[Run], presets: Sequence[Preset], budgets: Sequence[int],
                 notes: list[str]) -> list[Run]:
    """``runs`` (a :func:`sweep` by budget) with each preset's run at every budget,
    after that budget's runs; a run the sweep already has is marked as the preset
    instead of repeated, and a budget the preset does not fit is noted and skipped.

    Parameters
    ----------
    runs : list of Run
        The sweep's runs, the full cache first, then budget by budget.
    presets : sequence of Preset
        The presets to add (their ``prompt_aware`` is the caller's to apply or note).
    budgets : sequence of int
        The budgets the sweep ran at.
    notes : list of str
        Appended to: one line per budget a preset is skipped at, saying why.

    Returns
    -------
    list of Run
        A new list; each added run has ``preset`` set, its ``recent_window`` resolved
        at the budget and ``window_spec`` the fraction it came from (``"75%"``).
    """
    out = list(runs)
    for chosen in presets:
        spec = SPECS[chosen.policy]
        for budget in dict.fromkeys(budgets):
            try:
                resolved = spec.check(budget, chosen.options.values(chosen.policy, budget))
            except ScissorhandsError as exc:
                notes.append(f"skipped {chosen.name} at budget {budget}: {flag_text(exc)}")
                continue
            same = next((i for i, run in enumerate(out) if run.policy == chosen.policy and run.budget == budget
                         and dict(run.values) == resolved), None)
            window = chosen.values.get("recent_window")
            spec_text = f"{window:.0%}" if isinstance(window, float) else None
            if same is not None:
                out[same] = dataclasses.replace(out[same], preset=chosen.name)
                continue
            last = max((i for i, run in enumerate(out) if run.budget == budget), default=len(out) - 1)
            out.insert(last + 1, Run(chosen.policy, budget, resolved, spec_text, chosen.name))
    return out


def shown_values(policy: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The values a replay names (its first option, then those not at their default)."""
    spec = policy_spec(policy)
    return {o.name: v for i, (o, v) in enumerate(_shown(spec, values))
            if i == 0 or v != spec.default(o.name)}


def sweep(policies: Iterable[str], budgets: Sequence[int], values: Mapping[str, Sequence[Any] | None],
          *, by: str = "budget", strict: bool = False) -> tuple[list[Run], list[str]]:
    """Every configuration of a sweep, and notes on the combinations skipped.

    Each policy runs every combination of the values given for the options it takes
    (``values[name]``: a list, each value a run; None, empty or missing: the policy's
    default), at every budget.  A combination that repeats an earlier run (``50%`` and
    ``0.5x`` of the same budget) is skipped with a note, and so is one the policy
    refuses at a budget (``recent_window + sinks >= budget``), unless ``strict``.  What
    would silently run nothing of what was asked is refused: a value given for an option
    none of the policies takes, a value that runs with no policy at any budget, a
    policy that runs at no budget.

    Parameters
    ----------
    by : {"budget", "policy"}
        ``"budget"`` (eval): the full cache first, once, then budget by budget, each
        policy's configurations in turn.  ``"policy"`` (replay): policy by policy as
        listed (the full cache where listed), each configuration at every budget.
    strict : bool
        Raise the refusal (naming the policy, setting and budget) instead of noting it;
        a default the budget cannot hold is refused in the flags' words
        (:class:`DefaultRefusedError`).

    Raises
    ------
    InvalidInputError
        An unknown policy name; with ``strict``, a configuration a policy refuses;
        without, a value or policy that runs nowhere (the message names the flag or
        the policy, and why).
    """
    names = list(dict.fromkeys(policies))
    for name in names:
        policy_spec(name)
    state = _Sweep(values, strict)
    if by == "budget":
        state.runs.append(Run("full", None, {}))
        if "full" not in names:
            state.notes.append("full cache run anyway: it is the reference for agreement")
        for budget in dict.fromkeys(budgets):
            for name in names:
                if SPECS[name].evicts:
                    for combo in state.combos(name):
                        state.add(name, budget, combo)
    elif by == "policy":
        for name in names:
            if not SPECS[name].evicts:
                state.runs.append(Run(name, None, {}))
                continue
            for combo in state.combos(name):
                for budget in dict.fromkeys(budgets):
                    state.add(name, budget, combo)
    else:
        raise InvalidInputError(f"by must be 'budget' or 'policy', got {by!r}")
    _check_ran(names, budgets, values, state.ran, state.refusals)
    return state.runs, state.notes


class _Sweep:
    """The runs and notes of one :func:`sweep` as it is built, and what ran or was refused."""

    def __init__(self, values: Mapping[str, Sequence[Any] | None], strict: bool) -> None:
        self.values = values
        self.strict = strict
        self.runs: list[Run] = []
        self.notes: list[str] = []
        self.seen: set[tuple[Any, ...]] = set()
        self.refusals: dict[Any, str] = {}  # policy, or (option, value): why its first run was refused
        self.ran: set[Any] = set()  # the policies, and the (option, value) pairs, that run somewhere

    def combos(self, name: str) -> list[tuple[Any, ...]]:
        """Every combination of the values given (or the defaults) for ``name``'s options."""
        spec = SPECS[name]
        axes = [list(dict.fromkeys(self.values.get(o.name) or [spec.default(o.name)])) for o in spec.options]
        return list(itertools.product(*axes))

    def add(self, name: str, budget: int, combo: tuple[Any, ...]) -> None:
        """Add one run, or note (or, strict, raise) why it is skipped."""
        spec = SPECS[name]
        given = dict(zip((o.name for o in spec.options), combo))
        asked = [(o, v) for o, v in given.items() if _hashable(v) and v in (self.values.get(o) or ())]
        window_spec = given["recent_window"] if isinstance(given.get("recent_window"), str) else None
        try:
            if window_spec is not None:
                given["recent_window"] = resolve_recent_window(window_spec, budget)
            resolved = spec.check(budget, given)
        except ScissorhandsError as exc:
            if self.strict:
                where = f"{name} ({setting(name, given)}) at budget {budget}"
                if isinstance(exc, DefaultRefusedError):  # what to pass, as the commands take it
                    raise DefaultRefusedError(f"{where}: {exc.cli_message}", f"{where}: {exc.cli_message}") from None
                raise type(exc)(f"{where}: {exc}") from None
            self.notes.append(f"skipped {name} budget {budget} ({config_label(name, given, window_spec)}): "
                              f"{flag_text(exc)}")
            for key in (name, *asked):
                self.refusals.setdefault(key, (f"{name} at budget {budget}: " if key != name else "") + flag_text(exc))
            return
        self.ran.update((name, *asked))
        key = (name, budget, tuple(resolved.items()))
        if key in self.seen:
            if not self.strict:
                self.notes.append(f"skipped {name} budget {budget} ({config_label(name, resolved, window_spec)}): "
                                  "the same run as an earlier configuration")
            return
        self.seen.add(key)
        self.runs.append(Run(name, budget, resolved, window_spec))


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _check_ran(names: Sequence[str], budgets: Sequence[int], values: Mapping[str, Sequence[Any] | None],
               ran: set[Any], refusals: Mapping[Any, str]) -> None:
    """Refuse a sweep that would silently run nothing of what was asked: an option value
    given for policies none of which takes the option, a value that runs with no policy
    at any budget, or an evicting policy that runs at no budget (its every configuration
    refused).

    Raises
    ------
    InvalidInputError
        Naming the flag and value, or the policy, and the first refusal.
    """
    shown = ", ".join(map(str, dict.fromkeys(budgets)))
    for option in OPTIONS:
        given = [v for v in values.get(option.name) or () if _hashable(v)]
        takers = [n for n in names if SPECS[n].takes(option.name)]
        if given and not takers:
            owners = ", ".join(n for n, spec in SPECS.items() if spec.takes(option.name))
            raise InvalidInputError(f"{option.flag}: none of the policies {', '.join(names)} takes it "
                                    f"(it is an option of {owners})")
        for value in dict.fromkeys(given):
            if (option.name, value) not in ran and (option.name, value) in refusals:
                raise InvalidInputError(f"{option.flag} {option.text(value)} would run with no policy at "
                                        f"budgets {shown}: {refusals[(option.name, value)]}")
    for name in names:
        if SPECS[name].evicts and name not in ran and name in refusals:
            raise InvalidInputError(f"{name} would run at none of the budgets {shown}: {refusals[name]}")


# ----------------------------------------------------------------------------- presets


#: The budget a preset takes when none is given (the transformers cache's and
#: ``generate``'s default), said wherever it is used.
DEFAULT_BUDGET = 512


@dataclass(frozen=True)
class Preset:
    """A named configuration: a policy with explicit option values (and whether the
    prompt is held and decided at its end), chosen by measurements the docs cite.

    Attributes
    ----------
    name : str
        What callers pass where a policy name goes (``"recommended"``).
    policy : str
        The registry name it resolves to.
    values : mapping
        Option name -> value, as :class:`PolicyOptions` takes them.
    prompt_aware : bool
        Whether the transformers cache holds the prompt and evicts at its end.
    budget_rule : str
        How to choose the budget, in words (the preset does not fix one).
    source : str
        Where the measurements that chose it are.
    """

    name: str
    policy: str
    values: Mapping[str, Any]
    prompt_aware: bool
    budget_rule: str
    source: str

    @property
    def options(self) -> PolicyOptions:
        """The option values as a :class:`PolicyOptions`."""
        return PolicyOptions(**self.values)

    def describe(self, budget: int | None = None, *, defaulted: bool = False) -> str:
        """One line: the name, what it resolves to and the budget (said to be the
        default when ``defaulted``), e.g. ``recommended = scissorhands recent_window=0.75
        sinks=4 prompt_aware=True, budget 512 (the default)``."""
        parts = " ".join(f"{k}={v}" for k, v in self.values.items())
        text = f"{self.name} = {self.policy} {parts} prompt_aware={self.prompt_aware}"
        if budget is not None:
            text += f", budget {budget}" + (" (the default; pass a budget to change it)" if defaulted else "")
        return text

    def as_dict(self) -> dict[str, Any]:
        """Plain data for a result's JSON: ``preset``, ``policy``, the option values,
        ``prompt_aware``."""
        return {"preset": self.name, "policy": self.policy, **dict(self.values), "prompt_aware": self.prompt_aware}


#: The recommendation: Scissorhands with three quarters of the budget as its recent
#: window and 4 sinks (the best evicting configuration at 5x compression on both texts
#: of docs/configuration.md's perplexity sweep), holding the prompt and deciding at its
#: end (the fact a question in the prompt asks for: docs/tasks.md).  The seed's
#: defaults (``Scissorhands(...)``, ``--policy scissorhands``) are unchanged.
RECOMMENDED = Preset(
    name="recommended", policy="scissorhands", values={"recent_window": 0.75, "sinks": 4}, prompt_aware=True,
    budget_rule="a fifth of the tokens the cache will see (5x compression, where it was measured; at an "
    "eighth it loses more); at least 21, so that the observation window of 16 and the 4 sinks leave room",
    source="docs/configuration.md (perplexity), docs/tasks.md (retrieval)")

#: Every preset by name (a name no policy has).
PRESETS: dict[str, Preset] = {RECOMMENDED.name: RECOMMENDED}


def preset(name: Any) -> Preset | None:
    """The preset named ``name``, or None when ``name`` is not one (a policy's name)."""
    return PRESETS.get(name) if isinstance(name, str) else None


def expand_preset(policy: Any, options: PolicyOptions | None, option_values: Mapping[str, Any],
                  prompt_aware: bool | None) -> tuple[Any, PolicyOptions | None, dict[str, Any], bool]:
    """A policy name that may be a preset, resolved: ``(policy, options,
    option_values, prompt_aware)`` with the preset's values under whatever was given
    explicitly (an option keyword, ``options``, ``prompt_aware``); a policy name passes
    through, ``prompt_aware=None`` read as False and any other value as given (the
    cache checks it is a bool)."""
    chosen = preset(policy)
    if chosen is None:
        return policy, options, dict(option_values), False if prompt_aware is None else prompt_aware  # checked later
    values = dict(chosen.values)
    if options is not None and isinstance(options, PolicyOptions):
        values.update(options.given())
        options = None
    values.update(option_values)
    return chosen.policy, options, values, chosen.prompt_aware if prompt_aware is None else prompt_aware
