"""Replay a trace through an eviction policy and measure what the cache keeps.

The harness of the seed system's benchmark (``DESIGN.md`` §5).  The cache starts holding
position 0.  At each decode step ``t``:

1. the policy is shown the step's weights of the positions it holds, gathered by position
   from the full weights (ascending position, **not renormalised**);
2. before the policy acts, two things are measured on the full weights:

   * **retained attention mass**: the sum of the held positions' weights;
   * **heavy-hitter recall**: how many of the ``k = min(32, t)`` heaviest positions are
     held (ties go to the lower position, as a stable sort on ``-weight`` would);

3. ``policy.on_decode_step(t, attn)``; position ``t`` joins the cache;
4. if the cache now holds more than ``budget`` positions, ``policy.evict(budget)`` runs
   (one *eviction call*); every victim must be held, none repeated, and the cache must
   end within budget, else :class:`HarnessError`.

Retained mass is reported as the mean over steps; heavy-hitter recall pools the steps, held
heavy hitters summed over steps divided by ``sum(min(32, t))`` (so a step with ``t < 32``
counts for ``t / 32`` of a full one), as the seed system computes it.  Both are rounded to
6 decimals half up (``floor(x * 1e6 + 0.5) / 1e6``, the seed's ``Math.round``).  The
per-step mass is a float64 sum of the float32 weights (NumPy's pairwise summation; the seed
adds left to right, a difference near 1e-16 per step that 6-decimal means do not show, for
a third of the cost).  On ``decode-4096`` the
seed system publishes, for Scissorhands (retained mass / heavy-hitter recall):
256: 0.641318 / 0.882339, 512: 0.711377 / 0.906047, 1024: 0.784746 / 0.945091.

Any object with ``on_decode_step(pos, attn)`` and ``evict(budget)`` replays (duck typing):
the C-backed policies, the pure-Python reference, or your own.  If it also has
``kept_count()`` and ``kept``, the harness checks that the policy starts fresh and that
its own view of the cache agrees with the harness's at the end.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from scissorhands.errors import ScissorhandsError
from scissorhands.options import SPECS

from .traces import Trace

__all__ = [
    "HEAVY_HITTERS",
    "HarnessError",
    "PreparedTrace",
    "ReplayResult",
    "heavy_hitters",
    "prepare",
    "replay",
    "round6",
]

#: How many of the heaviest positions heavy-hitter recall looks at (fewer while ``t < 32``).
HEAVY_HITTERS = 32

_PROGRESS_EVERY = 256

_REGISTRY_NAMES = {spec.class_name: name for name, spec in SPECS.items()}


class HarnessError(ScissorhandsError):
    """A policy broke the replay contract: evicted a position it did not hold, named a
    victim twice, stayed over budget, or disagrees with the harness about what it holds."""


@dataclass(frozen=True)
class ReplayResult:
    """Outcome of one replay.

    Attributes
    ----------
    policy : str
        Registry name of the policy (``"scissorhands"``), or its class name.
    budget : int or None
        Cache budget in positions; ``None`` replays without ever evicting.
    retained_mass : float
        Mean over steps of the attention mass the held positions carry, 6 decimals.
    heavy_hitter_recall : float
        Held heavy hitters over all steps divided by ``sum(min(32, t))`` over all steps
        (the top ``min(32, t)`` positions of each step), 6 decimals.
    eviction_calls : int
        How many times ``evict`` ran (``num_positions - budget`` for a policy that keeps
        exactly ``budget``).
    steps : int
        Decode steps replayed.
    policy_seconds : float
        Wall time spent inside the policy's ``on_decode_step`` and ``evict``.
    trace : str
        Name of the trace replayed.
    """

    policy: str
    budget: int | None
    retained_mass: float
    heavy_hitter_recall: float
    eviction_calls: int
    steps: int
    policy_seconds: float
    trace: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The result as plain JSON-serialisable data."""
        return asdict(self)


def heavy_hitters(weights: npt.ArrayLike, k: int = HEAVY_HITTERS) -> npt.NDArray[np.intp]:
    """Positions of the ``min(k, n)`` heaviest weights, ascending; ties to the lower position.

    The first ``k`` entries of a stable sort on ``-weights`` (the seed system finds the
    same set with a threshold and a left-to-right tie count), sorted ascending.

    Parameters
    ----------
    weights : array_like, shape (n,)
        Non-negative real weights (NaN not allowed).
    k : int, default 32
    """
    w = np.asarray(weights)
    k = max(0, min(k, w.shape[0]))
    return np.sort(np.argsort(-w, kind="stable")[:k])


class PreparedTrace:
    """A trace with each step's weights and heavy hitters computed once.

    Replaying a :class:`~scissorhands.commands.traces.Trace` prepares it first; prepare it yourself
    (:func:`prepare`) to replay it through several policies or budgets without redoing
    that work.  It is itself a trace (same attributes, same iteration).
    """

    def __init__(self, trace: Trace, k: int = HEAVY_HITTERS) -> None:
        self.name = str(getattr(trace, "name", "trace"))
        self.num_positions = int(trace.num_positions)
        self.steps = int(trace.steps)
        self.k = k
        weights: list[npt.NDArray[np.float32]] = [np.empty(0, np.float32)]  # index by t
        top: list[npt.NDArray[np.intp]] = [np.empty(0, np.intp)]
        for expected, (t, w) in enumerate(trace, start=1):
            w = np.ascontiguousarray(w, dtype=np.float32)
            if t != expected or w.shape != (t,):
                raise HarnessError(
                    f"trace {self.name!r}: step {expected} yielded t={t} with shape {w.shape}; "
                    f"expected t={expected} with {expected} weights"
                )
            weights.append(w)
            top.append(heavy_hitters(w, k))
        if len(weights) - 1 != self.steps:
            raise HarnessError(
                f"trace {self.name!r} yielded {len(weights) - 1} steps, announced {self.steps}"
            )
        self._weights = weights
        self._top = top

    def __repr__(self) -> str:
        return f"<PreparedTrace {self.name!r}: {self.steps} steps>"

    def weights(self, t: int) -> npt.NDArray[np.float32]:
        """Step ``t``'s float32 weights over positions ``0 .. t-1``."""
        return self._weights[t]

    def heavy_hitters(self, t: int) -> npt.NDArray[np.intp]:
        """Step ``t``'s ``min(k, t)`` heaviest positions, ascending."""
        return self._top[t]

    def __iter__(self) -> Iterator[tuple[int, npt.NDArray[np.float32]]]:
        for t in range(1, self.steps + 1):
            yield t, self._weights[t]


def prepare(trace: Trace, k: int = HEAVY_HITTERS) -> PreparedTrace:
    """Compute each step's weights and heavy hitters once (no-op on a prepared trace)."""
    if isinstance(trace, PreparedTrace) and trace.k == k:
        return trace
    return PreparedTrace(trace, k)


def round6(x: float) -> float:
    """Round to 6 decimals, halves up, as the seed system's ``Math.round(x * 1e6) / 1e6``."""
    return math.floor(x * 1e6 + 0.5) / 1e6


def _policy_name(policy: Any) -> str:
    name = getattr(policy, "name", None)
    if isinstance(name, str):
        return name
    cls = type(policy).__name__
    return _REGISTRY_NAMES.get(cls, cls)


def replay(
    policy: Any,
    trace: Trace,
    budget: int | None,
    *,
    name: str | None = None,
    progress: Callable[[int], object] | None = None,
) -> ReplayResult:
    """Replay ``trace`` through ``policy`` at ``budget`` and measure it.

    Parameters
    ----------
    policy : object
        A fresh policy (holding position 0 only) with ``on_decode_step(pos, attn)`` and
        ``evict(budget)``; ``attn`` is given as a contiguous float32 array.
    trace : Trace or PreparedTrace
        One stream of decode steps; prepared on the fly if it is not already.
    budget : int or None
        Positions the cache may hold after each step; ``None`` never calls ``evict`` (the
        full-cache baseline).
    name : str, optional
        Name to report (default: the registry name of the policy's class).
    progress : callable, optional
        Called with the number of steps done since the previous call (for a progress bar).

    Returns
    -------
    ReplayResult

    Raises
    ------
    HarnessError
        The policy is not fresh, evicts a position it does not hold or twice in one call,
        ends an eviction over budget, or ends holding other positions than it reported.
    ScissorhandsError
        Whatever the policy raises (e.g. a budget not above its recent window).
    """
    if budget is not None and (
        isinstance(budget, bool) or not isinstance(budget, numbers.Integral) or budget < 1
    ):
        raise HarnessError(f"budget must be a positive integer or None, got {budget!r}")
    prepared = prepare(trace)
    label = name if name is not None else _policy_name(policy)

    kept_count = getattr(policy, "kept_count", None)
    if callable(kept_count) and kept_count() != 1:
        raise HarnessError(f"{label}: the policy must start fresh, holding position 0 only")

    tally, order = _replay_steps(policy, prepared, budget, label, progress)
    mass_total, heavy_hits, heavy_possible, policy_seconds, eviction_calls = tally
    n = len(order)
    kept = getattr(policy, "kept", None)
    if kept is not None and not callable(kept) and not np.array_equal(np.asarray(kept).ravel(), order):
        raise HarnessError(
            f"{label}: after the replay the policy holds {np.asarray(kept).size} positions "
            f"that differ from the {n} its evictions leave"
        )

    steps = prepared.steps
    return ReplayResult(
        policy=label,
        budget=None if budget is None else int(budget),
        retained_mass=round6(mass_total / steps),
        heavy_hitter_recall=round6(heavy_hits / heavy_possible),
        eviction_calls=eviction_calls,
        steps=steps,
        policy_seconds=policy_seconds,
        trace=prepared.name,
    )


def _replay_steps(
    policy: Any,
    prepared: PreparedTrace,
    budget: int | None,
    label: str,
    progress: Callable[[int], object] | None,
) -> tuple[tuple[float, int, int, float, int], npt.NDArray[np.intp]]:
    """Every decode step of ``prepared`` through ``policy``, measured before the policy
    acts: ``((mass, heavy hits, heavy possible, policy seconds, eviction calls), held
    positions ascending)``."""
    n_pos = prepared.num_positions
    steps = prepared.steps
    held = bytearray(n_pos)  # held[p] == 1: position p is in the cache
    held_np = np.frombuffer(held, dtype=np.bool_)  # the same memory, for fancy indexing
    order = np.empty(n_pos, dtype=np.intp)  # order[:n]: held positions, ascending
    held[0] = 1
    order[0] = 0
    n = 1

    on_decode_step = policy.on_decode_step
    evict = policy.evict
    weights, tops = prepared._weights, prepared._top
    clock = time.perf_counter
    mass_total = 0.0
    heavy_hits = 0
    heavy_possible = 0
    policy_seconds = 0.0
    eviction_calls = 0
    reported = 0

    for t in range(1, steps + 1):
        w = weights[t]
        attn = w[order[:n]]
        mass_total += float(attn.sum(dtype=np.float64))
        top = tops[t]
        heavy_hits += int(np.count_nonzero(held_np[top]))
        heavy_possible += top.size

        start = clock()
        on_decode_step(t, attn)
        policy_seconds += clock() - start
        order[n] = t
        held[t] = 1
        n += 1

        if budget is not None and n > budget:
            start = clock()
            victims = evict(budget)
            policy_seconds += clock() - start
            eviction_calls += 1
            n = _remove_victims(label, t, budget, victims, held, order, n)

        if progress is not None and t % _PROGRESS_EVERY == 0:
            progress(t - reported)
            reported = t
    if progress is not None and steps > reported:
        progress(steps - reported)
    return (mass_total, heavy_hits, heavy_possible, policy_seconds, eviction_calls), order[:n]


def _remove_victims(
    label: str,
    t: int,
    budget: int,
    victims: Any,
    held: bytearray,
    order: npt.NDArray[np.intp],
    n: int,
) -> int:
    """Validate ``victims`` against the cache, drop them, return the new count.

    ``held`` is indexed by position (1 = in the cache); ``order[:n]`` lists the held
    positions ascending.  A victim named twice is found the second time as not held.
    """
    if isinstance(victims, np.ndarray):
        victims = victims.ravel().tolist()
    elif not isinstance(victims, list):
        victims = list(victims)
    for index, v in enumerate(victims):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise HarnessError(
                f"{label}: evict({budget}) at step {t} returned {v!r}, not a position"
            )
        if not 0 <= v <= t or not held[v]:
            what = "twice" if v in victims[:index] else "which the cache does not hold"
            raise HarnessError(f"{label}: evict({budget}) at step {t} evicted position {v}, {what}")
        held[v] = 0
    k = len(victims)
    if 0 < k <= 4:
        for v in sorted(victims, reverse=True):
            i = int(np.searchsorted(order[:n], v))
            order[i : n - 1] = order[i + 1 : n]
            n -= 1
    elif k:
        keep = order[:n][np.frombuffer(held, dtype=np.bool_)[order[:n]]]
        n = keep.size
        order[:n] = keep
    if n > budget:
        raise HarnessError(
            f"{label}: evict({budget}) at step {t} left {n} positions, over the budget"
        )
    return n
