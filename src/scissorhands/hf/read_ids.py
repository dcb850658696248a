"""The token ids an evicting cache has read, per sequence (:class:`TokenIds`), which
:mod:`scissorhands.hf.prefix` compares a new prompt with."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

#: The id recorded for a padding position (never admitted).
PAD_ID = -1


class TokenIds:
    """The token ids a cache has read: ``ids[b, j]`` is sequence ``b``'s id at padded
    position ``j`` (:data:`PAD_ID` for padding) for ``j < known``.  ``known`` equals
    the tokens seen unless a forward came without ids; from there on nothing is known.

    ``pending``: the ids the forward pre-hook saw for the forward under way, with the
    tokens seen when it saw them; recorded by :meth:`commit` at the forward's end."""

    __slots__ = ("ids", "known", "pending")

    def __init__(self) -> None:
        self.ids = np.zeros((0, 0), dtype=np.int64)
        self.known = 0
        self.pending: tuple[int, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"ids": self.ids[:, : self.known].copy(), "known": self.known}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.ids, self.known, self.pending = state["ids"], state["known"], None

    def clear(self) -> None:
        """Nothing read (``reset``)."""
        self.ids = np.zeros((0, 0), dtype=np.int64)
        self.known = 0
        self.pending = None

    def note(self, seen: int, ids: Any) -> None:
        """The forward pre-hook's call: the ids of the forward about to run at ``seen``."""
        self.pending = (seen, ids)

    def commit(self, seen: int, q: int, batch: int, pads: np.ndarray | None) -> None:
        """At the end of a forward of ``q`` tokens a sequence read at ``seen``: record its
        ids (those :meth:`note` saw for it; ``pads`` ``(batch, q)`` bool marks padding),
        or, when there are none of that shape, stop knowing."""
        pending, self.pending = self.pending, None
        if self.known != seen or pending is None or pending[0] != seen:
            return
        ids = pending[1]
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or tuple(ids.shape) != (batch, q):
            return
        if seen == 0:
            self.ids = np.empty((batch, max(q, 64)), dtype=np.int64)
        elif self.ids.shape[0] != batch:
            return
        end = seen + q
        if end > self.ids.shape[1]:
            grown = np.empty((batch, max(end, 2 * self.ids.shape[1])), dtype=np.int64)
            grown[:, :seen] = self.ids[:, :seen]
            self.ids = grown
        self.ids[:, seen:end] = ids.detach().cpu().numpy()
        if pads is not None:
            self.ids[:, seen:end][pads] = PAD_ID
        self.known = end

    def select(self, index: np.ndarray) -> None:
        """Sequences become ``index`` (beams, copies, subsets), as the cache's rows do."""
        self.ids = self.ids[index, : self.known]

    def common(self, ids: np.ndarray) -> np.ndarray:
        """Each sequence's longest common prefix with ``ids`` ``(batch, L)`` (padding
        :data:`PAD_ID`), over the known positions: ``int64 (batch,)``, O(batch * L)."""
        m = min(self.known, ids.shape[1])
        differ = self.ids[:, :m] != ids[:, :m]
        return np.where(differ.any(axis=1), differ.argmax(axis=1), m).astype(np.int64)
