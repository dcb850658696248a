"""The policies' options, each declared once by an :class:`OptionSpec`, and the parsers
and checks of their values: the recent window (a count or a fraction of the budget), the
sinks, the history window, the vote rate and the budget pool.

An :class:`OptionSpec` holds the constructor keyword, the default (the seed's
semantics: off), how a value is checked against a budget, and how it is written on the
command line and in tables.  :data:`OPTIONS` lists them in constructor order.  Re-exported
by :mod:`scissorhands.options`; imports no native code and no torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from ._shared import MAX_HEADS, MAX_HISTORY_WINDOW, check_flag, check_int, check_recent_window
from .errors import InvalidInputError

__all__ = ["HISTORY_WINDOW", "OPTIONS", "POOL", "POOL_SCOPES", "RECENT_WINDOW", "SINKS", "VOTE_RATE", "OptionSpec",
           "parse_recent_window", "resolve_recent_window", "spec_fraction"]


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
        (:func:`scissorhands._labels.flag_help`).
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
