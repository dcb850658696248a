"""The recall tier: what the policies evict is archived, and each prompt's end may bring it back.

With ``EvictingCache(..., prompt_aware=True, archive="float32")`` (or ``"int8"``) a
position a policy evicts is not dropped: its key (as it was attended, rotated at its
true position) and its value move into an :class:`~scissorhands.hf.archive.Archive` beside the cache, in host
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

from ..options import policy_spec
from .archive import Archive, held_positions

__all__ = ["WindowQueries", "recall", "restore", "restored_kept"]


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


def _union_state(state: dict[str, Any], layout: _Merge, score_name: str | None) -> dict[str, Any]:
    """The policy state of the union: held slots keep theirs, recalled ones a new
    position's (0 votes, score 0.0, empty registers, no steps held)."""
    state = dict(state)
    state["kept"] = [u.tolist() for u in layout.union]
    for key in (score_name, "history", "steps_held"):
        if key is not None and key in state:
            flat = np.asarray([v for row in state[key] for v in row])  # exact: ints stay ints, floats float64
            state[key] = layout.rows_of(flat, 0.0 if key == "scores" else 0)
    return state


class _Merge:
    """Where each row's held positions (kept order, ascending) and archived ones go in
    their union, in position order, for every row at once: ``order`` ``(rows, width)``
    indexes the padded columns ``[held (max_held) | archived (max_archived)]``."""

    def __init__(self, held_counts: np.ndarray, held_flat: np.ndarray, archive: Archive) -> None:
        rows = len(held_counts)
        self.held_counts = held_counts
        self.archived = archive.counts if archive.rows == rows else np.zeros(rows, dtype=np.int64)
        self.max_held = int(held_counts.max(initial=0))
        self.max_archived = int(self.archived.max(initial=0))
        self.held_mask = np.arange(self.max_held)[None, :] < held_counts[:, None]
        archived_mask = np.arange(self.max_archived)[None, :] < self.archived[:, None]
        #: Padded columns, at least one (the width of a union of empty rows).
        self.columns = max(self.max_held + self.max_archived, 1)
        padded = np.full((rows, self.columns), np.iinfo(np.int64).max, dtype=np.int64)
        padded[:, :self.max_held][self.held_mask] = held_flat
        if self.max_archived:
            archived = archive.positions[:, :self.max_archived]
            padded[:, self.max_held:self.max_held + self.max_archived] = np.where(archived_mask, archived,
                                                                                  np.iinfo(np.int64).max)
        self.counts = held_counts + self.archived
        self.width = int(self.counts.max(initial=1))
        self.order = np.argsort(padded, axis=1, kind="stable")[:, :self.width]
        self.positions = np.take_along_axis(padded, self.order, axis=1)  # past a count: the largest int64
        self.valid = np.arange(self.width)[None, :] < self.counts[:, None]
        self.union = [self.positions[r, :self.counts[r]] for r in range(rows)]
        self.sources = [archive.positions[r, :self.archived[r]].copy() if self.archived[r] else
                        np.zeros(0, dtype=np.int64) for r in range(rows)]

    def rows_of(self, held_flat: np.ndarray, zero: Any) -> list[list[Any]]:
        """A per-slot value of the held positions (flat, row after row) in union order,
        ``zero`` for the archived ones, as one list per row."""
        dtype = held_flat.dtype if held_flat.size else np.dtype(type(zero))
        padded = np.full((len(self.held_counts), self.columns), zero, dtype=dtype)
        padded[:, :self.max_held][self.held_mask] = held_flat
        merged = np.take_along_axis(padded, self.order, axis=1)
        return [merged[r, :self.counts[r]].tolist() for r in range(len(self.counts))]

    def tensors(self, held: torch.Tensor, archived: torch.Tensor | None, rows: slice) -> torch.Tensor:
        """One layer's union ``(n, width, head_dim)`` float32 (zero past each count) from
        its held ``(n, max_held, head_dim)`` and archived ``(n, >= max_archived, head_dim)``."""
        n, dim = held.shape[0], held.shape[-1]
        parts = [held.to(torch.float32)]
        if self.max_archived and archived is not None:
            parts.append(archived[:, :self.max_archived])
        padded = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
        columns = padded.shape[1]
        flat = torch.cat((padded.reshape(n * columns, dim), padded.new_zeros((1, dim))))  # the last: zero
        index = self.order[rows] + (np.arange(n) * columns)[:, None]
        index = np.where(self.valid[rows], index, n * columns)
        return flat.index_select(0, torch.from_numpy(index.reshape(-1))).reshape(n, self.width, dim)


class _Union:
    """Every row's held and archived positions together, in position order: the policy
    state of the union, its keys and values per layer ``(batch, kv_heads, width,
    head_dim)`` float32, its positions, counts, and which came from the archive."""

    def __init__(self, cache: Any) -> None:
        bank, storage, archive = cache.bank, cache.storage, cache._archive
        self.policy = bank.policies[0]
        state = self.policy.state_dict()
        self.held_counts = np.asarray(storage.counts, dtype=np.int64).copy()
        held_flat = np.asarray([p for k in state["kept"] for p in k], dtype=np.int64)
        merge = _Merge(self.held_counts, held_flat, archive)
        self.union, self.sources, self.counts, self.width = merge.union, merge.sources, merge.counts, merge.width
        self.dtype = next(k.dtype for k in storage.keys if k is not None)
        per_layer, heads = storage.batch * storage.heads, storage.heads
        archived_keys, archived_values = archive.decoded(merge.max_archived)
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        #: Each layer's union positions, ``int64 (batch * kv_heads, width)``, past a count the largest int64.
        self.positions: list[np.ndarray] = []
        b = torch.arange(storage.batch).repeat_interleave(heads)[:, None]
        h = torch.arange(heads).repeat(storage.batch)[:, None]
        for e in range(storage.layers):
            rows = slice(e * per_layer, (e + 1) * per_layer)
            k_buf, v_buf = storage.layer_buffers(e)
            slots = np.where(merge.held_mask[rows], storage.slots[rows, :merge.max_held], 0)
            s = torch.from_numpy(slots.astype(np.int64))
            for out, buf, archived in ((self.keys, k_buf, archived_keys), (self.values, v_buf, archived_values)):
                mine = None if archived is None else archived[rows]
                merged = merge.tensors(buf[b, h, s], mine, rows)
                out.append(merged.reshape(storage.batch, heads, merge.width, buf.shape[-1]))
            self.positions.append(merge.positions[rows])
        score_key = policy_spec(state["policy"]).score_key
        self.state = _union_state(state, merge, score_key)

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
