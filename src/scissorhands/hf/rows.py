"""The bank of policy rows a cache drives: one row per (layer, sequence, KV head).

Rows are layer-major: row ``(layer * batch + sequence) * heads + head`` (``heads`` = the
KV heads, or 1 in ``mean`` head mode).  Sequences that share a configuration share one
policy object (its rows are theirs, in the same order), so a step is one call per
configuration: one for a plain cache, one per configuration for ``eval``'s batch.  A
configuration whose budget is pooled (``pool``: ``layer``, ``model`` or a number of
rows) orders its policy's rows sequence-major instead, ``(sequence, layer, head)``, so
that each pool is consecutive rows of one sequence: ``layer`` is ``heads`` rows,
``model`` every layer's.  The policies are duck-typed: either backend, with
``step_rows``, ``extend``, ``evict_rows``, ``select_rows``, ``counts`` and ``reset``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InvalidInputError
from ..options import POOL, PolicyOptions, make_policy, policy_spec

__all__ = ["PolicyConfig", "PolicyRows", "check_pools"]


@dataclass(frozen=True)
class PolicyConfig:
    """One configuration of the rows of some sequences: a registry policy, its budget
    (None only for ``full``) and its options."""

    policy: str
    budget: int | None
    options: PolicyOptions = field(default_factory=PolicyOptions)
    backend: str = "native"

    def __post_init__(self) -> None:
        if isinstance(self.budget, np.integer):  # a NumPy budget kept as the int it equals
            object.__setattr__(self, "budget", int(self.budget))

    def check(self) -> None:
        """Build a one-row policy (its pool checked on its own: the cache checks that it
        divides a sequence's rows), so that a bad name, budget or option raises now.

        Raises
        ------
        InvalidInputError, InvalidTypeError
            What the policy's constructor refuses.
        """
        options = self.options
        if policy_spec(self.policy).takes("pool"):  # checked here, divided by the cache
            POOL.check(options.pool, 0)
            options = options.replace(pool=1)
        make_policy(self.policy, self.budget, options, backend=self.backend)

    def build(self, rows: int, pools: dict[str, int], pins: Any = ()) -> Any:
        """The policy object behind ``rows`` rows of this configuration (``pools``: the
        rows each pool scope stands for, :func:`check_pools`; ``pins``: spans pinned at
        construction, which a fractional recent window shares the budget with)."""
        return make_policy(self.policy, self.budget, self.options, heads=rows, backend=self.backend, pools=pools,
                           pins=pins)

    @property
    def pooled(self) -> bool:
        """Whether rows share budgets (a ``pool`` option other than 1)."""
        return policy_spec(self.policy).takes("pool") and self.options.pool != 1

    @property
    def evicts(self) -> bool:
        return policy_spec(self.policy).evicts

    @property
    def reads_attention(self) -> bool:
        """Whether the rows' policy reads attention (else none is computed for it)."""
        return policy_spec(self.policy).reads_attention


def check_pools(configs: Sequence[PolicyConfig], layers: int, heads: int) -> dict[str, int]:
    """The rows each pool scope stands for with ``layers`` evicting layers of ``heads``
    policy rows each, after checking that every pooled configuration's pool given as a
    number of rows divides a sequence's ``layers * heads`` rows.

    Raises
    ------
    InvalidInputError
        A pool of rows that would span two sequences.
    """
    for c in configs:
        pool = c.options.pool
        if c.pooled and isinstance(pool, int) and (layers * heads) % pool:
            raise InvalidInputError(
                f"pool must divide the rows of a sequence ({layers} layers x {heads} KV heads = "
                f"{layers * heads}), got pool={pool}")
    return {"layer": heads, "model": layers * heads}


class PolicyRows:
    """The policy objects behind every row, grouped by configuration.

    Parameters
    ----------
    configs : sequence of PolicyConfig
        One per group of sequences, with ``sizes``.
    sizes : sequence of int
        Sequences per group, in batch order.
    layers, heads : int
        Evicting layers, and policy rows per layer and sequence.
    pins : sequence of (start, stop), default ()
        Spans every row pins from construction (:meth:`PolicyConfig.build`).
    """

    def __init__(self, configs: Sequence[PolicyConfig], sizes: Sequence[int], layers: int,
                 heads: int, pins: Sequence[tuple[int, int]] = ()) -> None:
        self.configs = list(configs)
        self.sizes = [int(s) for s in sizes]
        self.layers = layers
        self.heads = heads
        self.batch = sum(self.sizes)
        self.starts = np.cumsum([0, *self.sizes])
        pools = check_pools(self.configs, layers, heads)
        self.policies = [c.build(layers * n * heads, pools, list(pins)) for c, n in zip(self.configs, self.sizes)]
        for policy in self.policies:  # their state grows with what they hold, as the keys and values do
            fit = getattr(policy, "fit_capacity", None)  # duck-typed rows (a schedule's) may have none
            if fit is not None:
                fit(1)
        #: The single policy's rows are the global rows, in order (the fast paths).
        self._plain = len(self.policies) == 1 and not self.configs[0].pooled
        #: Seconds spent in each group's policy calls.
        self.seconds = [0.0] * len(self.policies)
        self._counts_of: tuple[int, np.ndarray] | None = None
        self._each_of: tuple[int, list[tuple[int, Any, np.ndarray, PolicyConfig]]] | None = None
        self._turn = 0  # decode steps of several groups so far (the group each starts at)

    @property
    def rows(self) -> int:
        return self.layers * self.batch * self.heads

    def _group_rows(self, g: int) -> np.ndarray:
        """The global row numbers of group ``g``'s rows, in its policy's order:
        layer-major, or sequence-major for pooled budgets."""
        grid = np.arange(self.rows).reshape(self.layers, self.batch, self.heads)
        mine = grid[:, self.starts[g]:self.starts[g + 1]]
        if self.configs[g].pooled:
            mine = mine.transpose(1, 0, 2)
        return mine.reshape(-1)

    def _each(self) -> list[tuple[int, Any, np.ndarray, PolicyConfig]]:
        """Each group's number, policy, global rows (:meth:`_group_rows`) and
        configuration: made once per batch shape, read every step."""
        kept = self._each_of
        if kept is None or kept[0] != self.batch:
            if self._plain:
                each = [(0, self.policies[0], np.arange(self.rows), self.configs[0])]
            else:
                each = [(g, p, self._group_rows(g), c) for g, (p, c) in enumerate(zip(self.policies, self.configs))]
            for _, _, rows, _ in each:
                rows.flags.writeable = False  # shared from step to step
            kept = self._each_of = (self.batch, each)
        return kept[1]

    def group_of(self, sequence: int) -> int:
        """The group holding sequence ``sequence``."""
        return int(np.searchsorted(self.starts, sequence, side="right")) - 1

    def counts(self) -> np.ndarray:
        """Positions held per row, ``int64 (rows,)``."""
        out = np.empty(self.rows, dtype=np.int64)
        for _, policy, rows, _ in self._each():
            out[rows] = np.asarray(policy.counts, dtype=np.int64)
        return out

    def kept_row(self, row: int) -> np.ndarray:
        """The positions row ``row`` holds, ascending."""
        for _, policy, rows, _ in self._each():
            hit = np.nonzero(rows == row)[0]
            if hit.size:
                return np.asarray(policy.kept_row(int(hit[0])), dtype=np.uint32)
        raise InvalidInputError(f"row {row} is not in [0, {self.rows})")

    def _merge(self, parts: list[tuple[np.ndarray, Any]]) -> tuple[np.ndarray, np.ndarray]:
        """Each group's ``RowVictims`` (its rows in its policy's order) as one
        ``(counts (rows,), kept-order slots (total,))`` pair in global row order."""
        if self._plain:
            victims = parts[0][1]
            return (np.asarray(victims.counts, dtype=np.int64), np.asarray(victims.slots, dtype=np.int64))
        counts = np.zeros(self.rows, dtype=np.int64)
        for rows, victims in parts:
            counts[rows] = np.asarray(victims.counts, dtype=np.int64)
        if (counts == 1).all():  # one victim a row (every decode step past the budget): its slot is its row's
            flat = np.empty(self.rows, dtype=np.int64)
            for rows, victims in parts:
                flat[rows] = np.asarray(victims.slots, dtype=np.int64)
            return counts, flat
        offsets = np.concatenate(([0], np.cumsum(counts)))
        flat = np.empty(int(offsets[-1]), dtype=np.int64)
        for rows, victims in parts:
            mine = np.asarray(victims.counts, dtype=np.int64)
            starts = np.repeat(offsets[rows], mine)
            within = np.arange(int(mine.sum())) - np.repeat(np.concatenate(([0], np.cumsum(mine)[:-1])), mine)
            flat[starts + within] = np.asarray(victims.slots, dtype=np.int64)
        return counts, flat

    def _every_row(self, k: int) -> np.ndarray:
        """``(rows,)`` int64 all ``k``, read-only (kept from step to step)."""
        kept = self._counts_of
        if kept is None or kept[0] != k or len(kept[1]) != self.rows:
            counts = np.full(self.rows, k, dtype=np.int64)
            counts.flags.writeable = False
            kept = self._counts_of = (k, counts)
        return kept[1]

    def step(self, pos: int, weights: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """One decode step on every row: ``weights`` ``(rows, W)`` over each row's held
        positions (kept order, W = the largest count), or None for policies that read no
        attention; returns each row's victim count and their kept-order slots, row after
        row (when every row evicted the same number, a read-only count array and the slots
        as a view of a buffer that the next step overwrites)."""
        if self._plain:  # the weights are the one policy's, already (rows, largest count)
            start = time.perf_counter()
            policy = self.policies[0]
            # The C policies' steady form (every row evicts the same number) is one C call
            # into reusable buffers; anything else, and any refusal, is step_rows'.
            fast = getattr(policy, "_step_slots", None)
            done = None if fast is None else fast(pos, weights, self.configs[0].budget)
            victims = policy.step_rows(pos, weights, self.configs[0].budget) if done is None else None
            self.seconds[0] += time.perf_counter() - start
            if done is not None:
                return self._every_row(done[0]), done[1]
            return self._merge([(np.arange(self.rows), victims)])
        parts = []
        each = self._each()
        # Each step starts at the next group: the first call after the model's forward runs
        # cold (about three times a later one's time), a cost every group then shares
        # alike in its seconds instead of the first group alone.
        first = self._turn % len(each)
        self._turn += 1
        for g, policy, rows, config in each[first:] + each[:first]:
            width = int(np.asarray(policy.counts).max(initial=0))
            w = None if weights is None else weights[rows, :width]  # one copy, C-contiguous
            start = time.perf_counter()
            victims = policy.step_rows(pos, w, config.budget)
            self.seconds[g] += time.perf_counter() - start
            parts.append((rows, victims))
        return self._merge(parts)

    def step_with(self, pos: int, call: Callable[..., tuple[int, float]]
                  ) -> tuple[int, float, np.ndarray | None, np.ndarray | None, np.ndarray] | None:
        """:meth:`step` run inside the cache's own C call (``sh_cache_step_steady``, which
        gathers the weights and steps the slot table around the policy's step), for one C
        policy whose rows are the global rows: ``call`` as the policy's ``_step_with``
        takes it.  Returns ``(done, policy_seconds, counts, slots, positions)``, the
        victims as :meth:`step` returns them (None when ``done`` is 2: the call took them
        to the slot table) and their positions row after row (``uint32``, a buffer the
        next step overwrites), or None when that is not the case or nothing changed (then
        :meth:`step` is the way)."""
        if not self._plain:
            return None
        fused = getattr(self.policies[0], "_step_with", None)
        got = None if fused is None else fused(pos, self.configs[0].budget, call)
        if got is None:
            return None
        done, seconds, k, slots, victims = got
        self.seconds[0] += seconds
        positions = victims[: self.rows * k]
        if done == 2:  # the cache's C call took the victims to the slot table itself
            return done, seconds, None, None, positions
        return done, seconds, self._every_row(k), slots[: self.rows * k], positions

    def extend(self, weights: np.ndarray | None, admit: np.ndarray | None, fresh: bool,
               q: int, cap: int | None = None, unread: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """A chunk of ``q`` tokens on every row (``weights`` ``(rows, q, W)`` in
        ``extend``'s layout, or None for policies that read no attention or, ``unread``,
        a chunk whose weights no policy reads; ``admit`` ``(rows, q)`` or None;
        ``fresh``: nothing admitted yet), then eviction to each budget (or to ``cap``
        positions instead, when given: a prompt read by a prompt-aware cache); returns
        what :meth:`step` returns."""
        parts = []
        for g, policy, rows, config in self._each():
            before = int(np.asarray(policy.counts).max(initial=0))
            width = (0 if fresh else before) + q
            a = None if admit is None else (admit if self._plain else admit[rows])
            if weights is None or unread:  # only the shape is read
                w: Any = np.broadcast_to(np.float32(0.0), (len(rows), q, width))
            else:
                w = weights if self._plain else weights[rows]
                w = np.ascontiguousarray(w[:, :, :width])
            start = time.perf_counter()
            if unread:
                policy.extend(w, a, unread=True)
            else:
                policy.extend(w, a)
            victims = policy.evict_rows(config.budget if cap is None else cap)
            self.seconds[g] += time.perf_counter() - start
            parts.append((rows, victims))
        return self._merge(parts)

    def evict_observed(self, window: np.ndarray, pool_kernel: int) -> tuple[np.ndarray, np.ndarray]:
        """Every row evicted to its budget by the policy's observation-window rule
        (``evict_observed_rows``): ``window`` ``(rows, W, N)`` float32, row ``j`` of row
        ``r`` the attention of its held position at kept index ``count - W + j`` over its
        held positions in kept order (``N`` at least the largest count); returns what
        :meth:`step` returns."""
        parts = []
        for g, policy, rows, config in self._each():
            width = int(np.asarray(policy.counts).max(initial=0))
            w = window if self._plain else window[rows]
            w = np.ascontiguousarray(w[:, :, :width], dtype=np.float32)
            start = time.perf_counter()
            victims = policy.evict_observed_rows(w, config.budget, pool_kernel)
            self.seconds[g] += time.perf_counter() - start
            parts.append((rows, victims))
        return self._merge(parts)

    def truncated(self, position: int) -> tuple[list[Any], np.ndarray] | None:
        """The policies as they would be after forgetting every held position at or
        after ``position`` (a prompt's common prefix with what was read: its state
        dropped with it, the positions before keep theirs, and the next position
        admitted may be ``position``), built from each policy's ``state_dict()``
        without changing the bank; with how many positions each global row drops,
        ``int64 (rows,)``.  None when a policy keeps no state to rebuild it from (the
        rows of a hindsight schedule).  :meth:`replace` installs them."""
        dropped = np.zeros(self.rows, dtype=np.int64)
        built = []
        for _, policy, rows, _ in self._each():
            if not (hasattr(policy, "state_dict") and hasattr(type(policy), "from_state_dict")):
                return None
            state = policy.state_dict()
            per_slot = [k for k in ("votes", "scores", "history", "steps_held") if k in state]
            for r, kept in enumerate(state["kept"]):
                n = int(np.searchsorted(np.asarray(kept, dtype=np.int64), position))
                dropped[rows[r]] = len(kept) - n
                state["kept"][r] = kept[:n]
                for key in per_slot:
                    state[key][r] = state[key][r][:n]
            state["last_position"] = min(int(state["last_position"]), position - 1)
            twin = type(policy).from_state_dict(state)
            twin.threads = policy.threads
            twin.fit_capacity(max(1, int(np.asarray(twin.counts).max(initial=1))))
            built.append(twin)
        return built, dropped

    def replace(self, policies: list[Any]) -> None:
        """Put ``policies`` (one per group, as :meth:`truncated` built them) in place."""
        if len(policies) != len(self.policies):
            raise InvalidInputError(f"{len(policies)} policies for {len(self.policies)} groups")
        self.policies = list(policies)
        self._each_of = None

    def select(self, index: np.ndarray) -> None:
        """Sequences become ``index`` (old sequence numbers): each policy's rows follow."""
        if len(self.policies) != 1:
            raise InvalidInputError("a cache holding several configurations cannot reorder its batch")
        index = np.asarray(index)
        if self.configs[0].pooled:  # sequence-major: each sequence's rows are one block
            block = self.layers * self.heads
            self.policies[0].select_rows((index[:, None] * block + np.arange(block)).reshape(-1))
        else:
            grid = np.arange(self.rows).reshape(self.layers, self.batch, self.heads)
            self.policies[0].select_rows(grid[:, index].reshape(-1))
        self.batch = len(index)
        self.sizes = [self.batch]
        self.starts = np.array([0, self.batch])

    def budgets(self) -> list[int | None]:
        return [c.budget for c in self.configs]
