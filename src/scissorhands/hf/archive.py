"""The recall tier's store: what the policies evict, key and value, kept beside the
cache in host memory and never attended (:class:`Archive`, float32 or int8 with one
float32 scale per position), the checks of ``archive=``, and what each eviction archives
(a steady decode step's victims read from the slot table, a chunk's or a prompt's end's
from the policies' victims) before the storage frees their slots.  What brings archived
positions back is :mod:`scissorhands.hf.recall`."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..errors import InvalidInputError
from ..prompt_aware import PROMPT_AWARE_POLICIES

__all__ = ["ARCHIVE_MODES", "Archive", "archive_step", "archive_victims", "check_archive", "held_positions"]


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
        keys, values = self._decode((row, slice(0, n)))
        return self.positions[row, :n].copy(), keys, values

    def decoded(self, width: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Every row's first ``width`` keys and values ``(rows, width, head_dim)``
        float32 (int8 decoded; past a row's count whatever the buffers hold), or
        ``(None, None)`` when nothing is archived."""
        if width == 0 or self.keys is None or self.values is None:
            return None, None
        return self._decode((slice(None), slice(0, width)))

    def _decode(self, index: tuple[Any, slice]) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values at ``index`` (rows, columns) as float32, int8 times its scale."""
        assert self.keys is not None and self.values is not None
        keys, values = self.keys[index].to(torch.float32), self.values[index].to(torch.float32)
        if self.mode == "int8":
            assert self.key_scales is not None and self.value_scales is not None
            keys = keys * self.key_scales[index][..., None]
            values = values * self.value_scales[index][..., None]
        return keys, values

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
