"""The recall tier: what the policies evict is archived, and each prompt's end may bring it back.

With ``EvictingCache(..., prompt_aware=True, archive="float32")`` (or ``"int8"``) a
position a policy evicts is not dropped: its key (as it was attended, rotated at its
true position) and its value move into an :class:`Archive` beside the cache, in host
memory, never attended.  At every prompt's end (the first decode step after a forward
of several tokens, each new turn of a chat, or ``end_prompt()``) the observation-window
rule of prompt-aware eviction (SnapKV's, the policies' ``evict_observed_rows``) scores
the held positions *and the archived ones together*: the window's queries (the prompt's
last ``observation_window`` tokens, kept per layer as the model computed them) attend
over the union of held and archived keys of each (layer, sequence, KV head), with the
model's own scaling and a float32 softmax, the query heads of a KV head's group
averaged; the union, in position order, is evicted to the budget by that rule (sinks,
pins and the window's own positions protected), so that the best positions enter the
budget and the displaced ones go to the archive.

A recalled position keeps its true position and its key as it was attended; its policy
state on return is that of a position just admitted: 0 votes, score 0.0, empty vote
registers and no steps held.  The union's policy state is made through the policies'
own ``state_dict``/``from_state_dict`` (either backend) and the eviction is their own
``evict_observed_rows``, so the rule is exactly the one both backends share.  Decode
steps only add to the archive, never read it: its cost is paid at a prompt's end.

``int8`` stores each archived key and value as int8 with one float32 scale per (row,
position) (the largest magnitude over the head dimension / 127, round to nearest), a
quarter of float32's bytes plus the scales.

The field's recall idea: ArkVale (Chen et al., NeurIPS 2024), Quest (Tang et al., ICML
2024), ShadowKV (Sun et al., ICML 2025, arXiv 2410.21465); the window rule: SnapKV (Li
et al., 2024, arXiv 2404.14469).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..errors import InvalidInputError
from ..options import policy_spec
from ..prompt_aware import PROMPT_AWARE_POLICIES

__all__ = ["ARCHIVE_MODES", "Archive", "WindowQueries", "archive_victims", "check_archive", "held_positions", "recall",
           "restore"]

#: What an archive stores its keys and values as.
ARCHIVE_MODES = ("float32", "int8")


def check_archive(archive: Any, *, prompt_aware: bool, positions: str, head_mode: str, configs: Any,
                  per_sequence: bool) -> str | None:
    """``archive`` checked against the cache's other settings; returns the mode or None.

    Raises
    ------
    InvalidInputError
        ``archive`` not None, ``"float32"`` or ``"int8"``; given without
        ``prompt_aware=True`` (recall happens at a prompt's end, by its window); with
        ``positions="cache"``, ``head_mode="mean"``, pooled budgets, ``configs=``, or a
        policy that reads no attention or never evicts.
    """
    if archive is None or archive is False:
        return None
    if not isinstance(archive, str) or archive not in ARCHIVE_MODES:
        raise InvalidInputError(f"archive must be None, {' or '.join(repr(m) for m in ARCHIVE_MODES)}, "
                                f"got {archive!r}")
    refusals = [
        (prompt_aware is not True, "needs prompt_aware=True (what is archived comes back at a prompt's end, "
                                   "chosen by the prompt's last tokens)"),
        (positions != "original", f"takes positions='original' only, not {positions!r}"),
        (head_mode != "per-head", f"takes head_mode='per-head' only, not {head_mode!r}"),
        (per_sequence, "takes one policy configuration, not configs= (one per sequence)"),
    ]
    for refused, why in refusals:
        if refused:
            raise InvalidInputError(f"archive={archive!r} {why}")
    config = configs[0]
    if config.pooled:
        raise InvalidInputError(f"archive={archive!r} does not take pooled budgets (pool={config.options.pool})")
    if not (config.evicts and config.reads_attention):
        raise InvalidInputError(f"archive={archive!r} needs a policy that evicts by attention "
                                f"({', '.join(PROMPT_AWARE_POLICIES)}), not {config.policy!r}")
    return archive


class Archive:
    """The evicted keys and values of every policy row, in host memory.

    Row ``r`` is the cache's row (layer-major: ``(layer * batch + sequence) * kv_heads +
    head``).  ``positions`` ``int64 (rows, capacity)``, ``counts`` ``int64 (rows,)``;
    ``keys``/``values`` ``(rows, capacity, head_dim)`` float32, or int8 with
    ``key_scales``/``value_scales`` float32 ``(rows, capacity)``.  A row's entries are
    in no particular order.

    Parameters
    ----------
    mode : {"float32", "int8"}
    """

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.clear()

    def clear(self) -> None:
        """Forget everything (``reset``, or a new batch)."""
        self.rows = 0
        self.positions = np.zeros((0, 0), dtype=np.int64)
        self.counts = np.zeros(0, dtype=np.int64)
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.key_scales: torch.Tensor | None = None
        self.value_scales: torch.Tensor | None = None

    @property
    def capacity(self) -> int:
        return int(self.positions.shape[1])

    def total(self) -> int:
        """Positions archived, over every row."""
        return int(self.counts.sum())

    def nbytes(self) -> int:
        """Bytes of the archived keys, values, their scales and positions."""
        tensors = (self.keys, self.values, self.key_scales, self.value_scales)
        return int(self.positions.nbytes) + sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def bytes_per_position(self, head_dim: int) -> int:
        """Bytes one archived position costs (key and value, their scales, its position)."""
        if self.mode == "int8":
            return 2 * head_dim + 2 * 4 + 8
        return 2 * 4 * head_dim + 8

    def _ensure(self, rows: int, need: int, dim: int) -> None:
        if self.rows != rows:
            self.clear()
            self.rows = rows
            self.positions = np.zeros((rows, 0), dtype=np.int64)
            self.counts = np.zeros(rows, dtype=np.int64)
        if self.keys is not None and self.keys.shape[2] != dim:
            raise InvalidInputError(f"the archive holds keys of width {self.keys.shape[2]}, the cache evicted "
                                    f"width {dim}: reset() the cache before another model")
        if need <= self.capacity and (self.keys is not None or need == 0):
            return
        capacity = max(need, self.capacity + self.capacity // 4, 16)  # a quarter more: the archive is the larger part
        pad = capacity - self.capacity
        self.positions = np.pad(self.positions, ((0, 0), (0, pad)))
        dtype = torch.int8 if self.mode == "int8" else torch.float32
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = torch.zeros((rows, capacity, dim), dtype=dtype)
            if old is not None:
                new[:, : old.shape[1]] = old
            setattr(self, name, new)
        if self.mode == "int8":
            for name in ("key_scales", "value_scales"):
                old = getattr(self, name)
                new = torch.zeros((rows, capacity), dtype=torch.float32)
                if old is not None:
                    new[:, : old.shape[1]] = old
                setattr(self, name, new)

    def _encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = x.detach().to(torch.float32)
        if self.mode != "int8":
            return x, None
        scale = x.abs().amax(dim=-1) / 127.0
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        return torch.round(x / safe[..., None]).clamp_(-127, 127).to(torch.int8), scale

    def add(self, rows: np.ndarray, positions: np.ndarray, keys: torch.Tensor, values: torch.Tensor,
            total_rows: int) -> None:
        """Archive ``len(rows)`` positions: entry ``i`` is position ``positions[i]`` of row
        ``rows[i]`` with its key and value ``keys[i]``/``values[i]`` ``(head_dim,)``."""
        if len(rows) == 0:
            return
        rows = np.asarray(rows, dtype=np.int64)
        order = np.argsort(rows, kind="stable")
        rows, positions = rows[order], np.asarray(positions, dtype=np.int64)[order]
        index = torch.from_numpy(order)
        keys, values = keys[index], values[index]
        adds = np.bincount(rows, minlength=total_rows)
        self._ensure(total_rows, 0, int(keys.shape[-1]))  # the rows first
        self._ensure(total_rows, int((self.counts + adds).max(initial=0)), int(keys.shape[-1]))
        within = np.arange(len(rows)) - np.repeat(np.cumsum(adds) - adds, adds)[: len(rows)]
        column = self.counts[rows] + within
        self.positions[rows, column] = positions
        r, c = torch.from_numpy(rows), torch.from_numpy(column)
        for name, scale_name, x in (("keys", "key_scales", keys), ("values", "value_scales", values)):
            encoded, scale = self._encode(x)
            getattr(self, name)[r, c] = encoded
            if scale is not None:
                getattr(self, scale_name)[r, c] = scale
        self.counts = self.counts + adds

    def row_entries(self, row: int) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
        """Row ``row``'s positions ``int64 (n,)`` and its keys and values ``(n, head_dim)``
        float32 (int8 decoded)."""
        n = int(self.counts[row]) if row < self.rows else 0
        if n == 0 or self.keys is None or self.values is None:
            empty = torch.zeros((0, 0), dtype=torch.float32)
            return np.zeros(0, dtype=np.int64), empty, empty
        keys, values = self.keys[row, :n].to(torch.float32), self.values[row, :n].to(torch.float32)
        if self.mode == "int8":
            assert self.key_scales is not None and self.value_scales is not None
            keys = keys * self.key_scales[row, :n, None]
            values = values * self.value_scales[row, :n, None]
        return self.positions[row, :n].copy(), keys, values

    def drop_from(self, position: int) -> None:
        """Forget every archived position at or after ``position`` (a prompt that reuses
        only the prefix before it: :mod:`scissorhands.hf.prefix`)."""
        if self.rows == 0 or self.keys is None:
            return
        for r in range(self.rows):
            n = int(self.counts[r])
            keep = np.nonzero(self.positions[r, :n] < position)[0]
            if len(keep) == n:
                continue
            self.positions[r, : len(keep)] = self.positions[r, keep]
            index = torch.from_numpy(keep)
            for name in ("keys", "values", "key_scales", "value_scales"):
                t = getattr(self, name)
                if t is not None:
                    t[r, : len(keep)] = t[r, index]
            self.counts[r] = len(keep)

    def select(self, index: np.ndarray) -> None:
        """Rows become ``index`` (old row numbers): beams, copies, subsets of the batch."""
        if self.rows == 0:
            return
        index = np.asarray(index, dtype=np.int64)
        self.positions = np.ascontiguousarray(self.positions[index])
        self.counts = self.counts[index]
        self.rows = len(index)
        t = torch.from_numpy(index)
        for name in ("keys", "values", "key_scales", "value_scales"):
            old = getattr(self, name)
            if old is not None:
                setattr(self, name, old.index_select(0, t))


class WindowQueries:
    """The last ``size`` query rows of the prompt being read, per evicting layer, as the
    model computed them (post-rotation, ``(batch, heads, n, head_dim)``), with the
    attention's ``scaling`` and ``softcap``; kept across a prompt's chunks."""

    def __init__(self, layers: int, size: int) -> None:
        self.size = size
        self.queries: list[torch.Tensor | None] = [None] * layers
        self.scaling: list[float] = [1.0] * layers
        self.softcap: list[float | None] = [None] * layers

    def note(self, e: int, query: torch.Tensor, scaling: float, softcap: float | None) -> None:
        query = query.detach()
        old = self.queries[e]
        if old is not None and old.shape[:2] == query.shape[:2] and old.shape[-1] == query.shape[-1]:
            query = torch.cat((old, query), dim=2)
        self.queries[e] = query[:, :, -self.size:].to(torch.float32).clone()
        self.scaling[e] = float(scaling)
        self.softcap[e] = softcap

    def clear(self) -> None:
        self.queries = [None] * len(self.queries)

    def ready(self) -> bool:
        return all(q is not None for q in self.queries)

    def select(self, index: np.ndarray) -> None:
        t = torch.from_numpy(np.asarray(index, dtype=np.int64))
        self.queries = [None if q is None else q.index_select(0, t) for q in self.queries]


def held_positions(policy: Any) -> tuple[np.ndarray, np.ndarray]:
    """Every row's held positions: counts ``int64 (rows,)`` and the positions, row after
    row in kept order, ``int64`` (either backend)."""
    export = getattr(policy, "_export", None)
    if export is not None:  # the C path: one export
        counts, positions = export()[:2]
        return np.asarray(counts, dtype=np.int64), np.asarray(positions, dtype=np.int64)
    kept = policy.state_dict()["kept"]
    counts = np.array([len(k) for k in kept], dtype=np.int64)
    flat = np.array([p for k in kept for p in k], dtype=np.int64)
    return counts, flat


def _gather(storage: Any, rows: np.ndarray, physical: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values ``(n, head_dim)`` at physical slot ``physical[i]`` of row ``rows[i]``."""
    per_layer = storage.batch * storage.heads
    dim = next(k.shape[-1] for k in storage.keys if k is not None)
    keys = torch.empty((len(rows), dim), dtype=torch.float32)
    values = torch.empty((len(rows), dim), dtype=torch.float32)
    layer = rows // per_layer
    for e in np.unique(layer):
        mine = np.nonzero(layer == e)[0]
        k, v = storage.layer_buffers(int(e))
        within = rows[mine] % per_layer
        b = torch.from_numpy(within // storage.heads)
        h = torch.from_numpy(within % storage.heads)
        s = torch.from_numpy(physical[mine].astype(np.int64))
        m = torch.from_numpy(mine)
        keys[m] = k[b, h, s].to(torch.float32)
        values[m] = v[b, h, s].to(torch.float32)
    return keys, values


def archive_step(archive: Archive, storage: Any, positions: np.ndarray, physical: np.ndarray,
                 counts: np.ndarray | None = None) -> None:
    """A steady decode step's victims archived before the storage frees them:
    ``positions`` row after row (``counts`` per row; None: one each) at physical slots
    ``physical``, read straight from the slot table and the policy's victims."""
    if len(positions) == 0:
        return
    rows = (np.arange(storage.rows, dtype=np.int64) if counts is None
            else np.repeat(np.arange(storage.rows, dtype=np.int64), counts))
    keys, values = _gather(storage, rows, np.asarray(physical, dtype=np.int64))
    archive.add(rows, np.asarray(positions, dtype=np.int64), keys, values, storage.rows)


def archive_victims(archive: Archive, storage: Any, before: tuple[np.ndarray, np.ndarray],
                    victims: np.ndarray, slots: np.ndarray, new_positions: list[np.ndarray],
                    new_physical: list[np.ndarray]) -> None:
    """Before the storage frees them: archive the positions a step or chunk evicted.

    ``before``: :func:`held_positions` before the step; ``victims`` (per row) and
    ``slots`` (kept-order indices, row after row) as the policies returned them, in the
    kept order of the held positions followed by the admitted ones, whose positions
    and physical slots are ``new_positions[r]``/``new_physical[r]``."""
    if not victims.any():
        return
    counts, flat = before
    starts = np.concatenate(([0], np.cumsum(counts)))
    offsets = np.concatenate(([0], np.cumsum(victims)))
    rows_out, pos_out, phys_out = [], [], []
    for r in np.nonzero(victims)[0]:
        k = slots[offsets[r]:offsets[r + 1]]
        n = int(counts[r])
        held_pos = flat[starts[r]:starts[r + 1]]
        positions = np.concatenate((held_pos, new_positions[r]))
        physical = np.concatenate((storage.slots[r, :n].astype(np.int64), new_physical[r]))
        rows_out.append(np.full(len(k), r, dtype=np.int64))
        pos_out.append(positions[k])
        phys_out.append(physical[k])
    rows = np.concatenate(rows_out)
    keys, values = _gather(storage, rows, np.concatenate(phys_out))
    archive.add(rows, np.concatenate(pos_out), keys, values, storage.rows)


def _window_over(queries: WindowQueries, e: int, keys: torch.Tensor, positions: np.ndarray,
                 counts: np.ndarray, first: int) -> torch.Tensor:
    """Layer ``e``'s window rows over its union keys: ``(batch, kv_heads, n, width)``
    float32 (``n`` query rows at positions ``first ..``), each row's columns past its
    count and past the query's position zero; the query heads of a group averaged."""
    query = queries.queries[e]
    assert query is not None
    batch, heads, n, dim = query.shape
    kv_heads, width = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    scores = torch.matmul(query.reshape(batch, kv_heads, group * n, dim), keys.transpose(2, 3))
    scores = scores.reshape(batch, kv_heads, group, n, width) * queries.scaling[e]
    softcap = queries.softcap[e]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    query_pos = first + np.arange(n)
    held = np.arange(width)[None, :] < counts[:, None]  # (batch * kv_heads, width)
    visible = held[:, None, :] & (positions[:, None, :] <= query_pos[None, :, None])
    mask = torch.from_numpy(visible.reshape(batch, kv_heads, 1, n, width))
    scores = scores.masked_fill(~mask, torch.finfo(torch.float32).min)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).mean(dim=2)
    return weights.masked_fill(~mask[:, :, 0], 0.0)


def _union_state(state: dict[str, Any], held_counts: np.ndarray, orders: list[np.ndarray],
                 union: list[np.ndarray], score_name: str | None) -> dict[str, Any]:
    """The policy state of the union: held slots keep theirs, recalled ones a new
    position's (0 votes, score 0.0, empty registers, no steps held)."""
    state = dict(state)
    state["kept"] = [u.tolist() for u in union]
    for key in (score_name, "history", "steps_held"):
        if key is None or key not in state:
            continue
        zero = 0.0 if key == "scores" else 0
        rows = []
        for r, order in enumerate(orders):
            values = list(state[key][r]) + [zero] * (len(order) - int(held_counts[r]))
            rows.append([values[i] for i in order])
        state[key] = rows
    return state


class _Union:
    """Every row's held and archived positions together, in position order: the policy
    state of the union, its keys and values per layer ``(batch, kv_heads, width,
    head_dim)`` float32, its positions, counts, and which came from the archive."""

    def __init__(self, cache: Any) -> None:
        bank, storage, archive = cache.bank, cache.storage, cache._archive
        self.policy = bank.policies[0]
        state = self.policy.state_dict()
        self.held_counts = np.asarray(storage.counts, dtype=np.int64).copy()
        rows, per_layer, heads = storage.rows, storage.batch * storage.heads, storage.heads
        entries = [archive.row_entries(r) for r in range(rows)]
        self.union, self.orders, self.sources = [], [], []
        for r in range(rows):
            combined = np.concatenate((np.asarray(state["kept"][r], dtype=np.int64), entries[r][0]))
            order = np.argsort(combined, kind="stable")
            self.union.append(combined[order])
            self.orders.append(order)
            self.sources.append(entries[r][0])
        self.counts = np.array([len(u) for u in self.union], dtype=np.int64)
        width = self.width = int(self.counts.max(initial=1))
        self.dtype = next(k.dtype for k in storage.keys if k is not None)
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        #: Each layer's union positions, ``int64 (batch * kv_heads, width)``, past a count the largest int64.
        self.positions: list[np.ndarray] = []
        for e in range(storage.layers):
            k_buf, v_buf = storage.layer_buffers(e)
            dim = k_buf.shape[-1]
            keys = torch.zeros((storage.batch, heads, width, dim), dtype=torch.float32)
            values = torch.zeros((storage.batch, heads, width, dim), dtype=torch.float32)
            pos = np.full((per_layer, width), np.iinfo(np.int64).max, dtype=np.int64)
            for i in range(per_layer):
                r = e * per_layer + i
                b, h = divmod(i, heads)
                held = torch.from_numpy(storage.slots[r, : self.held_counts[r]].astype(np.int64))
                _, ak, av = entries[r]
                by_position = torch.from_numpy(self.orders[r])
                keys[b, h, : self.counts[r]] = torch.cat((k_buf[b, h, held].to(torch.float32),
                                                          ak.reshape(-1, dim)))[by_position]
                values[b, h, : self.counts[r]] = torch.cat((v_buf[b, h, held].to(torch.float32),
                                                            av.reshape(-1, dim)))[by_position]
                pos[i, : self.counts[r]] = self.union[r]
            self.keys.append(keys)
            self.values.append(values)
            self.positions.append(pos)
        score_key = policy_spec(state["policy"]).score_key
        self.state = _union_state(state, self.held_counts, self.orders, self.union, score_key)

    def install(self, cache: Any) -> Any:
        """The union's policy into the bank (returns the policy it replaced)."""
        bank = cache.bank
        old = bank.policies[0]
        bank.policies[0] = type(old).from_state_dict(self.state)
        bank._each_of = None
        return old

    def lay_out(self, cache: Any) -> None:
        """The union's keys and values into the storage, in kept order."""
        cache.storage.load_rows([k.to(self.dtype) for k in self.keys], [v.to(self.dtype) for v in self.values],
                                self.counts)


def restore(cache: Any, q: int) -> int:
    """A new prompt of ``q`` tokens begins on a cache with an archive: every archived
    position re-enters what attention reads while the prompt is read (as held ones, with
    a new position's policy state), so that the prompt is read over everything the
    conversation said, as a fresh cache reading it whole would; its end then evicts to
    the budget by the window rule.  Nothing when the archive is empty or the union and
    the prompt would pass ``prefill_budget`` (then the prompt's end alone recalls).
    Returns how many positions re-entered."""
    archive = cache._archive
    if archive.total() == 0:
        return 0
    if int((cache.storage.counts + archive.counts).max(initial=0)) + q > cache.prompt_aware.prefill_budget:
        return 0
    union = _Union(cache)
    union.install(cache)
    union.lay_out(cache)
    total = archive.total()
    rows = archive.rows
    dim = int(union.keys[0].shape[-1])
    archive.clear()
    archive._ensure(rows, 0, dim)
    cache._restored = union.sources
    return total


def restored_kept(cache: Any) -> int:
    """After a prompt's end: how many of the positions :func:`restore` brought back at
    its start are still held (over every row); forgets which they were."""
    restored, cache._restored = cache._restored, None
    counts, flat = held_positions(cache.bank.policies[0])
    starts = np.concatenate(([0], np.cumsum(counts)))
    return sum(int(np.isin(flat[starts[r]:starts[r + 1]], restored[r]).sum()) for r in range(len(restored)))


def recall(cache: Any) -> int:
    """The prompt's end with an archive: the window scores the held and archived
    positions of every row together and the union is evicted to the budget by the
    policy's observation-window rule; the displaced positions are archived.  Returns
    how many archived positions entered the budget (over every row), counting those
    :func:`restore` brought back at the prompt's start.

    Raises
    ------
    InvalidInputError
        The policy refuses the window (the cache as it was)."""
    bank, storage, archive, queries = cache.bank, cache.storage, cache._archive, cache._queries
    rows, per_layer, heads = storage.rows, storage.batch * storage.heads, storage.heads
    size = cache.prompt_aware.observation_window
    n_query = int(queries.queries[0].shape[2])
    first = cache.seen - n_query
    union = _Union(cache)
    restored, cache._restored = cache._restored, None
    window = np.zeros((rows, size, union.width), dtype=np.float32)
    for e in range(storage.layers):
        mine = union.counts[e * per_layer:(e + 1) * per_layer]
        weights = _window_over(queries, e, union.keys[e], union.positions[e], mine, first)
        rows_e = weights.reshape(per_layer, n_query, union.width).numpy()
        for i in range(per_layer):
            r = e * per_layer + i
            t = np.arange(int(union.counts[r]) - size, int(union.counts[r]))
            j = np.nonzero(t >= 0)[0]
            q = union.union[r][t[j]] - first  # the query row of the position at slot t, if it has one
            has = (q >= 0) & (q < n_query)
            window[r, j[has]] = rows_e[i, q[has]]
    old = union.install(cache)
    try:
        victims, slots = bank.evict_observed(window, cache.prompt_aware.pool_kernel)
    except BaseException:
        bank.policies[0] = old
        bank._each_of = None
        raise
    union.lay_out(cache)
    # The displaced: every row's victims, from the union (held or recalled alike).
    offsets = np.concatenate(([0], np.cumsum(victims)))
    out_rows, out_pos, out_k, out_v = [], [], [], []
    entered = 0
    for r in range(rows):
        k = slots[offsets[r]:offsets[r + 1]]
        e, i = divmod(r, per_layer)
        b, h = divmod(i, heads)
        out_rows.append(np.full(len(k), r, dtype=np.int64))
        out_pos.append(union.union[r][k])
        gone = torch.from_numpy(k.astype(np.int64))
        out_k.append(union.keys[e][b, h, gone])
        out_v.append(union.values[e][b, h, gone])
        sources = union.sources[r] if restored is None else np.concatenate((union.sources[r], restored[r]))
        from_archive = np.isin(union.union[r], sources)
        from_archive[k] = False
        entered += int(from_archive.sum())
    archive.clear()
    archive._ensure(rows, 0, int(union.keys[0].shape[-1]))
    archive.add(np.concatenate(out_rows), np.concatenate(out_pos), torch.cat(out_k), torch.cat(out_v), rows)
    storage.evict(victims, slots)
    return entered
