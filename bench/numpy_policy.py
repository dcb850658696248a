"""The numpy-vectorised baseline: the same policies, written as a competent numpy user would.

This is what the C core has to beat to be worth its build step. It does the same work
as the C path, vectorised over the held positions (and over the heads):

* validation of ``pos`` (an integer above every admitted position) and of the weights
  (shape, then finite and non-negative, by a ``min``/``max`` pair of reductions that
  also catches NaN);
* the score update: Scissorhands compares in double, ``attn.astype(float64) > 1 / n``,
  and adds the boolean mask to the ``uint32`` votes (saturating); H2O adds
  ``attn.astype(float64)`` to ``float64`` scores; StreamingLLM ignores attention;
* admission into preallocated ``(heads, capacity)`` buffers (grown by doubling);
* selection of the least-scored slots of the evictable prefix, ties to the lower
  position: ``argmin`` (the first minimum) for one victim per row, a stable ``argsort``
  otherwise; victims ascending;
* compaction: one slice shift for a single victim, a boolean mask otherwise.

The interface is the duck-typed policy interface of :mod:`scissorhands` (``step``,
``on_decode_step``, ``evict``, ``kept_count``, ``kept``, ``memory_bytes``,
``from_state_dict``), so :func:`scissorhands.commands.harness.replay` runs it unchanged.
"""

from __future__ import annotations

import operator
from typing import Any, ClassVar

import numpy as np

__all__ = ["NUMPY_POLICIES", "NumpyH2O", "NumpyPolicy", "NumpyScissorhands", "NumpyStreamingLLM"]

UINT32_MAX = 2**32 - 1


class NumpyPolicy:
    """Shared machinery of the numpy baselines; see the subclasses."""

    name: ClassVar[str]
    #: dtype of the per-slot score, or None (StreamingLLM keeps none).
    _score_dtype: ClassVar[Any] = None
    #: Key of the scores in a ``state_dict()`` (``"votes"``, ``"scores"``), or None.
    _score_key: ClassVar[str | None] = None
    _reads_attention: ClassVar[bool] = False

    def __init__(self, budget: int = 512, *, recent_window: int = 0, sinks: int = 0, heads: int = 1) -> None:
        budget, recent_window, sinks, heads = (operator.index(v) for v in (budget, recent_window, sinks, heads))
        if budget < 1 or heads < 1 or recent_window < 0 or sinks < 0 or recent_window + sinks >= budget:
            raise ValueError("need budget >= 1, heads >= 1 and 0 <= recent_window + sinks < budget")
        self.budget, self.recent_window, self.sinks, self.heads = budget, recent_window, sinks, heads
        capacity = min(budget + 1, 4096)
        self._pos = np.zeros((heads, capacity), dtype=np.uint32)
        self._score = None if self._score_dtype is None else np.zeros((heads, capacity), dtype=self._score_dtype)
        self._n = 1  # every row holds position 0
        self._last = 0

    # ------------------------------------------------------------ state

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> NumpyPolicy:
        """A policy holding a ``state_dict()`` of either scissorhands backend."""
        policy = cls(**state["params"])
        policy.load(np.asarray(state["kept"], dtype=np.uint32),
                    None if cls._score_dtype is None else np.asarray(state[cls._score_key], dtype=cls._score_dtype),
                    int(state["last_position"]))
        return policy

    def load(self, kept: np.ndarray, scores: np.ndarray | None, last: int) -> None:
        """Replace the state with ``(heads, n)`` arrays of positions and scores."""
        n = kept.shape[1]
        self._reserve(n)
        self._pos[:, :n] = kept
        if self._score is not None:
            self._score[:, :n] = scores
        self._n = n
        self._last = last

    def _reserve(self, n: int) -> None:
        capacity = self._pos.shape[1]
        if n <= capacity:
            return
        while capacity < n:
            capacity = min(2 * capacity, self.budget + 1) if capacity < self.budget + 1 else 2 * capacity
        pos = np.zeros((self.heads, capacity), dtype=np.uint32)
        pos[:, : self._n] = self._pos[:, : self._n]
        self._pos = pos
        if self._score is not None:
            score = np.zeros((self.heads, capacity), dtype=self._score.dtype)
            score[:, : self._n] = self._score[:, : self._n]
            self._score = score

    def kept_count(self) -> int:
        """Positions held per row."""
        return self._n

    @property
    def kept(self) -> np.ndarray:
        """Held positions, ``(n,)`` for one head, ``(heads, n)`` otherwise (a copy)."""
        out = self._pos[:, : self._n].copy()
        return out[0] if self.heads == 1 else out

    @property
    def scores_array(self) -> np.ndarray | None:
        """Per-slot scores, shaped like :attr:`kept` (a copy), or None."""
        if self._score is None:
            return None
        out = self._score[:, : self._n].copy()
        return out[0] if self.heads == 1 else out

    def memory_bytes(self) -> int:
        """Bytes of the numpy buffers (positions and scores, the whole capacity)."""
        return self._pos.nbytes + (0 if self._score is None else self._score.nbytes)

    # ------------------------------------------------------------ decode loop

    def _check_pos(self, pos: Any) -> int:
        pos = operator.index(pos)
        if not self._last < pos <= UINT32_MAX:
            raise ValueError(f"pos must be in ({self._last}, 2**32 - 1], got {pos}")
        return pos

    def _weights(self, attn: Any) -> np.ndarray | None:
        if attn is None or not self._reads_attention:
            return None
        a = np.asarray(attn)
        if a.dtype.kind not in "iuf":
            raise TypeError(f"attention weights must be real numbers, not {a.dtype}")
        if a.shape != (self.heads, self._n) and not (self.heads == 1 and a.shape == (self._n,)):
            raise ValueError(f"attn must have shape ({self.heads}, {self._n}), got {a.shape}")
        lo, hi = a.min(), a.max()  # NaN propagates and fails both tests
        if not (lo >= 0 and hi <= np.finfo(np.float64).max):
            raise ValueError("attention weights must be finite and >= 0")
        return a

    def _update(self, a: np.ndarray) -> None:
        """Apply one step's validated weights to the scores of the held slots."""

    def _admit(self, pos: int, a: np.ndarray | None) -> None:
        if a is not None:
            self._update(a)
        n = self._n
        self._reserve(n + 1)
        self._pos[:, n] = pos
        if self._score is not None:
            self._score[:, n] = 0
        self._n = n + 1
        self._last = pos

    def _select(self, lo: int, hi: int, k: int) -> np.ndarray:
        """``(heads, k)`` slots to evict from ``[lo, hi)``, ascending per row."""
        raise NotImplementedError

    def _evict(self, budget: int | None) -> Any:
        budget = self.budget if budget is None else operator.index(budget)
        if budget <= self.recent_window + self.sinks:
            raise ValueError("budget must be greater than recent_window + sinks")
        n = self._n
        k = n - budget
        h = self.heads
        if k <= 0:
            return [] if h == 1 else np.empty((h, 0), dtype=np.uint32)
        slots = self._select(min(self.sinks, n), n - self.recent_window, k)
        pos = self._pos
        if h == 1 and k == 1:  # the steady state: one victim, one slice shift
            s = int(slots[0, 0])
            victim = int(pos[0, s])
            pos[0, s : n - 1] = pos[0, s + 1 : n]
            if self._score is not None:
                self._score[0, s : n - 1] = self._score[0, s + 1 : n]
            self._n = n - 1
            return [victim]
        victims = np.take_along_axis(pos[:, :n], slots, axis=1)
        keep = np.ones((h, n), dtype=bool)
        np.put_along_axis(keep, slots, False, axis=1)
        pos[:, : n - k] = pos[:, :n][keep].reshape(h, n - k)
        if self._score is not None:
            self._score[:, : n - k] = self._score[:, :n][keep].reshape(h, n - k)
        self._n = n - k
        return victims[0].tolist() if h == 1 else victims

    def on_decode_step(self, pos: int, attn: Any) -> None:
        """Update the scores from ``attn`` (or not, when None), then admit ``pos``."""
        pos = self._check_pos(pos)
        self._admit(pos, self._weights(attn))

    def evict(self, budget: int | None = None) -> Any:
        """Evict down to ``budget`` per row: a list for one head, ``(heads, k)`` array otherwise."""
        return self._evict(budget)

    def step(self, pos: int, attn: Any, budget: int | None = None) -> Any:
        """:meth:`on_decode_step` then :meth:`evict`."""
        pos = self._check_pos(pos)
        if budget is not None and operator.index(budget) <= self.recent_window + self.sinks:
            raise ValueError("budget must be greater than recent_window + sinks")
        self._admit(pos, self._weights(attn))
        return self._evict(budget)


class _NumpyHeavyHitters(NumpyPolicy):
    """Least score in the evictable prefix goes first, ties to the lower position."""

    _reads_attention = True

    def __init__(self, budget: int = 512, recent_window: int = 32, rng: Any = None, heads: int = 1) -> None:
        super().__init__(budget, recent_window=recent_window, heads=heads)

    def _select(self, lo: int, hi: int, k: int) -> np.ndarray:
        scores = self._score[:, lo:hi]
        if k == 1:  # argmin returns the first minimum: the lower position on a tie
            return scores.argmin(axis=1)[:, None] + lo
        order = np.argsort(scores, axis=1, kind="stable")[:, :k]
        order.sort(axis=1)
        return order + lo


class NumpyScissorhands(_NumpyHeavyHitters):
    """Scissorhands (arXiv 2305.17118) in numpy: one vote per weight above ``1 / n``."""

    name = "scissorhands"
    _score_dtype = np.uint32
    _score_key = "votes"

    def _update(self, a: np.ndarray) -> None:
        n = self._n
        votes = self._score[:, :n]
        votes += (a.astype(np.float64).reshape(self.heads, n) > 1.0 / n) & (votes != UINT32_MAX)


class NumpyH2O(_NumpyHeavyHitters):
    """H2O (arXiv 2306.14048) in numpy: float64 cumulative attention."""

    name = "h2o"
    _score_dtype = np.float64
    _score_key = "scores"

    def _update(self, a: np.ndarray) -> None:
        n = self._n
        self._score[:, :n] += a.astype(np.float64).reshape(self.heads, n)


class NumpyStreamingLLM(NumpyPolicy):
    """StreamingLLM (arXiv 2309.17453) in numpy: sinks plus the most recent positions."""

    name = "streaming-llm"

    def __init__(self, budget: int = 512, sinks: int = 4, rng: Any = None, heads: int = 1) -> None:
        super().__init__(budget, sinks=sinks, heads=heads)

    def _select(self, lo: int, hi: int, k: int) -> np.ndarray:
        return np.broadcast_to(np.arange(lo, lo + k), (self.heads, k))


#: Registry name -> numpy baseline class.
NUMPY_POLICIES: dict[str, type[NumpyPolicy]] = {
    "scissorhands": NumpyScissorhands,
    "h2o": NumpyH2O,
    "streaming-llm": NumpyStreamingLLM,
}
