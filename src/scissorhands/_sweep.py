r"""Sweeps: every configuration of several policies, option values and budgets as
:class:`Run`\ s (:func:`sweep`), the notes on what was skipped, the refusal of a sweep
that would run nothing of what was asked, and the presets' runs added at each budget
(:func:`with_presets`).  Re-exported by :mod:`scissorhands.options`.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import _registry
from ._labels import config_label, setting
from ._option_specs import OPTIONS, resolve_recent_window
from ._policy_options import PolicyOptions
from ._policy_spec import DefaultRefusedError, flag_text
from ._registry import policy_spec
from .errors import InvalidInputError, ScissorhandsError

if TYPE_CHECKING:
    from ._presets import Preset

__all__ = ["Run", "sweep", "with_presets"]


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
        spec = _registry.SPECS[chosen.policy]
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
                if _registry.SPECS[name].evicts:
                    for combo in state.combos(name):
                        state.add(name, budget, combo)
    elif by == "policy":
        for name in names:
            if not _registry.SPECS[name].evicts:
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
        spec = _registry.SPECS[name]
        axes = [list(dict.fromkeys(self.values.get(o.name) or [spec.default(o.name)])) for o in spec.options]
        return list(itertools.product(*axes))

    def add(self, name: str, budget: int, combo: tuple[Any, ...]) -> None:
        """Add one run, or note (or, strict, raise) why it is skipped."""
        spec = _registry.SPECS[name]
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
        takers = [n for n in names if _registry.SPECS[n].takes(option.name)]
        if given and not takers:
            owners = ", ".join(n for n, spec in _registry.SPECS.items() if spec.takes(option.name))
            raise InvalidInputError(f"{option.flag}: none of the policies {', '.join(names)} takes it "
                                    f"(it is an option of {owners})")
        for value in dict.fromkeys(given):
            if (option.name, value) not in ran and (option.name, value) in refusals:
                raise InvalidInputError(f"{option.flag} {option.text(value)} would run with no policy at "
                                        f"budgets {shown}: {refusals[(option.name, value)]}")
    for name in names:
        if _registry.SPECS[name].evicts and name not in ran and name in refusals:
            raise InvalidInputError(f"{name} would run at none of the budgets {shown}: {refusals[name]}")

