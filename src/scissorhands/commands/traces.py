"""Attention traces to replay through the harness: the canonical ``decode-4096`` and recorded ones.

A *trace* is one stream of decode steps: at step ``t`` (``t = 1 .. num_positions - 1``) the
new token at position ``t`` attends over positions ``0 .. t-1`` with the weights the trace
yields (``float32``, shape ``(t,)``, not necessarily summing to 1).  Anything with the
attributes of :class:`Trace` replays through :func:`scissorhands.commands.harness.replay`.

Canonical trace ``decode-4096`` (seed 7)
----------------------------------------
The seed system's benchmark, reproduced bit for bit (``DESIGN.md`` §5).  For each step the
components below are accumulated per position in float64 in this order, then each weight
is divided by the step's total (a left-to-right float64 sum over positions ``0 .. t-1``) and
rounded to float32:

1. sinks: 0.15 on positions 0..3, split ``[0.06, 0.045, 0.03, 0.015]`` (for ``t < 4`` the
   first ``t`` shares rescaled to sum to 0.15, as ``share * 0.15 / sum(shares)``);
2. local: 0.55 (0.80 while ``t < 128``) over offsets ``d = 1 .. min(64, t)`` back from ``t``,
   position ``t - d`` getting ``mass * (65 - d) / sum(65 - d)``;
3. heavy hitters: 0.25 over 32 distinct positions, the k-th drawn getting
   ``0.25 * (1 / k) / H32`` with ``H32 = 1 + 1/2 + ... + 1/32``; drawn at ``t == 128`` and
   redrawn at every ``t > 128`` with ``t % 512 == 0``; a draw is
   ``pos = rng.next_int(t - 68) + 4``, duplicates redrawn, first-appearance order kept;
4. noise: ``0.05 / t`` on every position.

The random numbers come from :class:`Xoshiro128StarStar` seeded by :func:`splitmix32`.
Parity data (``conformance/trace-prefix.json``): the float32 bits of the first 10 steps and
:func:`fnv1a_32` over the concatenation, for ``t = 1 .. 4095`` in order, of each step's
weights as little-endian float32 bytes (:func:`trace_hash`).

Recorded traces (``.npz``)
--------------------------
Real attention recorded from a model (``python -m scissorhands record``), one stream per
(layer, KV head).  Written by :func:`save_recorded_trace`, read by :func:`load_recorded_trace`,
a NumPy ``.npz`` (compressed) holding no pickled objects:

========================  ===========================  =======================================
key                       dtype, shape                 meaning
========================  ===========================  =======================================
``format``                str (0-d)                    ``"scissorhands.trace"``
``version``               int64 (0-d)                  ``1``
``weights``               float16 ``(S, T)``           every step's weights, steps concatenated:
                                                       row ``s`` is stream ``s``; step ``t``
                                                       (``t = 1 .. N-1``) is the slice
                                                       ``offsets[t-1] : offsets[t]`` of length
                                                       ``t``, over positions ``0 .. t-1``;
                                                       ``T = N (N - 1) / 2``
``offsets``               int64 ``(N,)``               ``offsets[i] = i (i + 1) / 2``
``layers``                int64 ``(S,)``               decoder layer of each stream
``heads``                 int64 ``(S,)``               KV head of each stream
``num_positions``         int64 (0-d)                  ``N``, the positions 0..N-1 of the text
``prompt_tokens``         int64 (0-d)                  ``P``: steps ``t < P`` come from the
                                                       prompt's (prefill) attention rows, the
                                                       others from decode steps
``model``                 str (0-d)                    the model's name or path
``metadata``              str (0-d)                    JSON object: anything else (text source,
                                                       how heads were reduced, versions, ...)
========================  ===========================  =======================================

Each step's weights are those the policy would see with a full cache: for the new token,
the mean over the query heads of the KV head's GQA group, the token's weight on itself
excluded, not renormalised (``DESIGN.md`` §6).  ``N = 512`` and 90 streams is about 24 MB.
"""

from __future__ import annotations

import json
import math
import os
import zipfile
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import cached_property
from typing import Any, Protocol, cast, runtime_checkable

import numpy as np
import numpy.typing as npt

from scissorhands._shared import UINT32_MAX, check_int
from scissorhands.errors import InvalidInputError, ScissorhandsError

__all__ = [
    "TRACE_FORMAT",
    "TRACE_VERSION",
    "DecodeTrace",
    "RecordedStream",
    "RecordedTrace",
    "Trace",
    "TraceFormatError",
    "Xoshiro128StarStar",
    "decode_trace",
    "fnv1a_32",
    "load_recorded_trace",
    "save_recorded_trace",
    "splitmix32",
    "step_offsets",
    "trace_hash",
]

_MASK32 = 0xFFFFFFFF

#: Value of the ``format`` key of a recorded trace file.
TRACE_FORMAT = "scissorhands.trace"
#: Version of the recorded trace layout written by :func:`save_recorded_trace`.
TRACE_VERSION = 1


class TraceFormatError(ScissorhandsError, ValueError):
    """A recorded trace file that is not in the documented layout."""


@runtime_checkable
class Trace(Protocol):
    """One stream of decode steps, as the replay harness consumes it.

    Attributes
    ----------
    name : str
        Human-readable name (``"decode-4096"``, ``"layer 3 / KV head 1"``).
    num_positions : int
        ``N``: the trace covers positions ``0 .. N-1``.
    steps : int
        Number of decode steps, ``N - 1`` (step ``t`` for ``t = 1 .. N-1``).

    Iterating yields ``(t, weights)`` in increasing ``t``: ``weights`` is a read-only
    ``float32`` array of shape ``(t,)``, the new token's attention over positions
    ``0 .. t-1``.
    """

    name: str
    num_positions: int
    steps: int

    def __iter__(self) -> Iterator[tuple[int, npt.NDArray[np.float32]]]: ...


# --------------------------------------------------------------------------------------
# Random numbers


def splitmix32(state: int) -> tuple[int, int]:
    """Advance a splitmix32 state once; return ``(new_state, output)``.

    The 32-bit variant used by the seed system: the state advances by the golden-ratio
    gamma ``0x9e3779b9``; the output mixes it with xor-shifts by 16, 15, 15 and the
    multipliers ``0x21f0aaad``, ``0x735a2d97`` (all arithmetic modulo 2**32).
    """
    state = (state + 0x9E3779B9) & _MASK32
    z = state
    z = ((z ^ (z >> 16)) * 0x21F0AAAD) & _MASK32
    z = ((z ^ (z >> 15)) * 0x735A2D97) & _MASK32
    z ^= z >> 15
    return state, z


def _rotl32(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _MASK32


class Xoshiro128StarStar:
    """xoshiro128** (Blackman & Vigna), four uint32 words seeded by splitmix32.

    Parameters
    ----------
    seed : int
        Taken modulo 2**32; the four state words are four successive splitmix32 outputs.
        If they are all zero, word 0 is set to 1 (xoshiro's state must not be all zero).

    Examples
    --------
    >>> rng = Xoshiro128StarStar(7)
    >>> bound = 60
    >>> 0 <= rng.next_int(bound) < bound
    True
    """

    __slots__ = ("_s",)

    def __init__(self, seed: int) -> None:
        state = int(seed) & _MASK32
        words = []
        for _ in range(4):
            state, word = splitmix32(state)
            words.append(word)
        if not any(words):
            words[0] = 1
        self._s = words

    @classmethod
    def from_state(cls, words: Sequence[int]) -> Xoshiro128StarStar:
        """A generator with the given four state words (no seeding); for known-answer tests."""
        if len(words) != 4 or not any(int(w) & _MASK32 for w in words):
            raise InvalidInputError("xoshiro128** needs four uint32 words, not all zero")
        rng = cls.__new__(cls)
        rng._s = [int(w) & _MASK32 for w in words]
        return rng

    @property
    def state(self) -> tuple[int, int, int, int]:
        """The four state words."""
        s = self._s
        return (s[0], s[1], s[2], s[3])

    def next_u32(self) -> int:
        """Next output, ``rotl(s1 * 5, 7) * 9`` modulo 2**32, then advance the state."""
        s = self._s
        result = (_rotl32((s[1] * 5) & _MASK32, 7) * 9) & _MASK32
        t = (s[1] << 9) & _MASK32
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = _rotl32(s[3], 11)
        return result

    def next_int(self, bound: int) -> int:
        """Uniform integer in ``[0, bound)``, unbiased by rejection.

        Outputs below ``(2**32 - bound) % bound`` are rejected; the first accepted output
        ``v`` gives ``v % bound``.
        """
        if bound < 1 or bound > 1 << 32:
            raise InvalidInputError(f"bound must be in [1, 2**32], got {bound}")
        threshold = ((1 << 32) - bound) % bound
        while True:
            value = self.next_u32()
            if value >= threshold:
                return value % bound


# --------------------------------------------------------------------------------------
# The canonical trace

_SINK_SHARES = (0.06, 0.045, 0.03, 0.015)
_SINK_MASS = 0.15
_LOCAL_MASS = 0.55
_LOCAL_MASS_EARLY = 0.80  # t < 128: the heavy-hitter mass folds into the local band
_LOCAL_SPAN = 64
_HEAVY_MASS = 0.25
_HEAVY_COUNT = 32
_HEAVY_START = 128
_HEAVY_EPOCH = 512
_NOISE_MASS = 0.05


def _sink_weights(t: int) -> list[float]:
    """Sink component for positions ``0 .. min(4, t) - 1``."""
    if t >= len(_SINK_SHARES):
        return list(_SINK_SHARES)
    total = 0.0
    for share in _SINK_SHARES[:t]:
        total += share
    return [share * _SINK_MASS / total for share in _SINK_SHARES[:t]]


def _local_weights(mass: float, span: int) -> npt.NDArray[np.float64]:
    """Local component for positions ``t - span .. t - 1`` (ascending position)."""
    norm = span * (129 - span) // 2  # sum of 65 - d for d = 1..span, exact
    ramp = np.arange(64, 64 - span, -1, dtype=np.float64)  # 65 - d for d = 1..span
    values = mass * ramp / norm  # (mass * (65 - d)) / norm, as written
    return values[::-1].copy()


def _heavy_weights() -> npt.NDArray[np.float64]:
    """Heavy-hitter component of the k-th drawn position, k = 1..32."""
    harmonic = 0.0
    for k in range(1, _HEAVY_COUNT + 1):
        harmonic += 1.0 / k
    return np.array([_HEAVY_MASS * (1.0 / k) / harmonic for k in range(1, _HEAVY_COUNT + 1)])


def _draw_heavy(rng: Xoshiro128StarStar, t: int) -> npt.NDArray[np.intp]:
    """Draw the 32 distinct heavy-hitter positions at step ``t``, first-appearance order."""
    drawn: list[int] = []
    seen: set[int] = set()
    while len(drawn) < _HEAVY_COUNT:
        pos = rng.next_int(t - 68) + 4
        if pos not in seen:
            seen.add(pos)
            drawn.append(pos)
    return np.array(drawn, dtype=np.intp)


class DecodeTrace:
    """The seed system's synthetic decode trace (``decode-4096``, seed 7 by default).

    Parameters
    ----------
    seed : int, default 7
        Seed of the heavy-hitter draws.
    num_positions : int, default 4096
        ``N``: steps ``t = 1 .. N-1``; must be at least 2.

    Notes
    -----
    The whole trace is generated once, on first use, into one packed ``float32`` array
    (``N (N - 1) / 2`` weights, 33.5 MB for ``N = 4096``, about 0.2 s); iteration yields
    read-only views into it.  See the module docstring for the construction.
    """

    def __init__(self, seed: int = 7, num_positions: int = 4096) -> None:
        self.seed = check_int("seed", seed, 0, UINT32_MAX)
        self.num_positions = check_int("num_positions", num_positions, 2)
        self.steps = self.num_positions - 1
        self.name = f"decode-{self.num_positions}"

    def __repr__(self) -> str:
        return f"DecodeTrace(seed={self.seed}, num_positions={self.num_positions})"

    @cached_property
    def offsets(self) -> npt.NDArray[np.int64]:
        """``offsets[i] = i (i + 1) / 2``: step ``t`` is ``packed[offsets[t-1]:offsets[t]]``."""
        return step_offsets(self.num_positions)

    @cached_property
    def packed(self) -> npt.NDArray[np.float32]:
        """All steps' float32 weights concatenated, ``t = 1 .. N-1`` (read-only)."""
        offsets = self.offsets
        out = np.empty(int(offsets[-1]), dtype=np.float32)
        rng = Xoshiro128StarStar(self.seed)
        local_early = {span: _local_weights(_LOCAL_MASS_EARLY, span) for span in range(1, 65)}
        local_late = _local_weights(_LOCAL_MASS, _LOCAL_SPAN)
        heavy_values = _heavy_weights()
        heavy_pos: npt.NDArray[np.intp] | None = None
        sinks_full = np.array(_SINK_SHARES)
        w = np.empty(self.num_positions, dtype=np.float64)
        for t in range(1, self.num_positions):
            row = w[:t]
            row[:] = 0.0
            if t >= 4:
                row[:4] += sinks_full
            else:
                row[:t] += _sink_weights(t)
            span = min(_LOCAL_SPAN, t)
            local = local_early[span] if t < _HEAVY_START else local_late
            row[t - span :] += local
            if t == _HEAVY_START or (t > _HEAVY_START and t % _HEAVY_EPOCH == 0):
                heavy_pos = _draw_heavy(rng, t)
            if heavy_pos is not None:
                row[heavy_pos] += heavy_values  # distinct positions: one addition each
            row += _NOISE_MASS / t
            total = np.cumsum(row)[-1]  # left-to-right, not pairwise
            out[offsets[t - 1] : offsets[t]] = row / total
        out.flags.writeable = False
        return out

    def weights(self, t: int) -> npt.NDArray[np.float32]:
        """Step ``t``'s weights over positions ``0 .. t-1`` (read-only float32 view)."""
        if not 1 <= t < self.num_positions:
            raise InvalidInputError(f"step must be in [1, {self.num_positions - 1}], got {t}")
        return self.packed[self.offsets[t - 1] : self.offsets[t]]

    def __iter__(self) -> Iterator[tuple[int, npt.NDArray[np.float32]]]:
        packed, offsets = self.packed, self.offsets.tolist()
        for t in range(1, self.num_positions):
            yield t, packed[offsets[t - 1] : offsets[t]]


def step_offsets(num_positions: int) -> npt.NDArray[np.int64]:
    """Where each step starts in a packed trace of ``num_positions`` positions.

    Returns the int64 array ``offsets`` of shape ``(N,)`` with ``offsets[i] = i (i + 1) / 2``:
    step ``t`` (``t = 1 .. N-1``) occupies ``[offsets[t-1], offsets[t])``, and
    ``offsets[-1] = N (N - 1) / 2`` is the packed length.  A recorder can preallocate
    ``np.empty((streams, offsets[-1]), np.float16)``, fill it step by step and hand it to
    :func:`save_recorded_trace`.
    """
    i = np.arange(check_int("num_positions", num_positions, 1), dtype=np.int64)
    return i * (i + 1) // 2


def decode_trace(seed: int = 7, num_positions: int = 4096) -> DecodeTrace:
    """The canonical ``decode-4096`` trace (seed 7); a shorthand for :class:`DecodeTrace`."""
    return DecodeTrace(seed=seed, num_positions=num_positions)


def fnv1a_32(data: bytes | bytearray | memoryview, h: int = 0x811C9DC5) -> int:
    """FNV-1a, 32 bits, over ``data``; pass a previous result as ``h`` to continue it.

    Pure Python: about 0.1 µs per byte (3 s for the 33.5 MB of ``decode-4096``).
    """
    prime = 0x01000193
    for byte in bytes(data):
        h = ((h ^ byte) * prime) & _MASK32
    return h


def trace_hash(trace: Trace) -> int:
    """The parity hash of a trace: FNV-1a-32 over every step's little-endian float32 bytes.

    The byte stream is the concatenation, for ``t = 1 .. N-1`` in order, of step ``t``'s
    ``t`` weights as little-endian float32.  For ``decode-4096`` (seed 7) it is 3136039440.
    """
    h = 0x811C9DC5
    for _, weights in trace:
        h = fnv1a_32(np.asarray(weights, dtype="<f4").tobytes(), h)
    return h


# --------------------------------------------------------------------------------------
# Recorded traces


class RecordedStream:
    """One (layer, KV head) stream of a :class:`RecordedTrace`; a :class:`Trace`.

    Iterating yields ``(t, weights)`` with ``weights`` widened to ``float32`` (exactly:
    every float16 is a float32) for ``t = 1 .. N-1``.
    """

    def __init__(self, trace: RecordedTrace, index: int) -> None:
        self._trace = trace
        self.index = index
        self.layer = int(trace.layers[index])
        self.head = int(trace.heads[index])
        self.num_positions = trace.num_positions
        self.steps = trace.steps
        self.name = f"layer {self.layer} / KV head {self.head}"

    def __repr__(self) -> str:
        return f"<RecordedStream {self.name} of {self._trace.name}>"

    def weights(self, t: int) -> npt.NDArray[np.float32]:
        """Step ``t``'s weights over positions ``0 .. t-1`` (float32 copy)."""
        if not 1 <= t < self.num_positions:
            raise InvalidInputError(f"step must be in [1, {self.num_positions - 1}], got {t}")
        offsets = self._trace.offsets
        return self._trace.weights16[self.index, offsets[t - 1] : offsets[t]].astype(np.float32)

    def __iter__(self) -> Iterator[tuple[int, npt.NDArray[np.float32]]]:
        # Widened once per iteration, not cached: a trace of N = 2048 positions and 90
        # streams would otherwise hold 0.75 GB of float32 copies.
        packed = self._trace.weights16[self.index].astype(np.float32)
        packed.flags.writeable = False
        offsets = self._trace.offsets.tolist()
        for t in range(1, self.num_positions):
            yield t, packed[offsets[t - 1] : offsets[t]]


class RecordedTrace:
    """A recorded real-model trace: several streams, one per (layer, KV head).

    Iterating yields the :class:`RecordedStream` of each stream, in file order.  Build
    one with :func:`load_recorded_trace` (from a file) or directly from arrays.

    Parameters
    ----------
    weights : array, float16, shape (S, N (N - 1) / 2)
        Every step's weights, steps concatenated (see the module docstring).
    layers, heads : sequence of int, length S
        Layer and KV head of each stream.
    prompt_tokens : int
        Tokens of the prompt (steps below it came from the prefill attention).
    model : str
        Model name or path.
    metadata : mapping, optional
        JSON-serialisable extras.
    name : str, optional
        Display name (default: the file name when loaded, else ``"recorded"``).
    """

    def __init__(
        self,
        weights: npt.ArrayLike,
        layers: Sequence[int],
        heads: Sequence[int],
        prompt_tokens: int = 0,
        model: str = "",
        metadata: Mapping[str, Any] | None = None,
        name: str = "recorded",
    ) -> None:
        w = np.asarray(weights)
        if w.ndim != 2:
            raise TraceFormatError(f"weights must be 2-D (streams, total), got shape {w.shape}")
        if w.dtype != np.float16:
            w = w.astype(np.float16)
        streams, total = w.shape
        n = _positions_for_total(total)
        layers_a = np.asarray(layers, dtype=np.int64).reshape(-1)
        heads_a = np.asarray(heads, dtype=np.int64).reshape(-1)
        if streams < 1:
            raise TraceFormatError("a recorded trace needs at least one stream")
        if layers_a.shape != (streams,) or heads_a.shape != (streams,):
            raise TraceFormatError(
                f"layers and heads must have one entry per stream ({streams}), "
                f"got {layers_a.size} and {heads_a.size}"
            )
        if not np.all(np.isfinite(w)) or np.any(w < 0):
            raise TraceFormatError("weights must be finite and non-negative")
        self.weights16 = w
        self.layers = layers_a
        self.heads = heads_a
        self.num_positions = n
        self.steps = n - 1
        self.prompt_tokens = int(prompt_tokens)
        self.model = str(model)
        self.metadata = dict(metadata or {})
        self.name = name
        self.offsets = step_offsets(n)

    def __repr__(self) -> str:
        return (
            f"<RecordedTrace {self.name!r}: {len(self)} streams, "
            f"{self.num_positions} positions, model {self.model!r}>"
        )

    def __len__(self) -> int:
        return int(self.weights16.shape[0])

    def stream(self, index: int) -> RecordedStream:
        """The ``index``-th stream."""
        if not 0 <= index < len(self):
            raise InvalidInputError(f"stream index must be in [0, {len(self)}), got {index}")
        return RecordedStream(self, index)

    @property
    def streams(self) -> list[RecordedStream]:
        """All streams, in file order."""
        return [RecordedStream(self, i) for i in range(len(self))]

    def __iter__(self) -> Iterator[RecordedStream]:
        return iter(self.streams)


def _positions_for_total(total: int) -> int:
    """``N`` with ``N (N - 1) / 2 == total``; raise if there is none."""
    n = (1 + math.isqrt(1 + 8 * total)) // 2
    if n * (n - 1) // 2 != total or n < 2:
        raise TraceFormatError(
            f"{total} weights per stream is not N(N-1)/2 for any N >= 2 (steps 1..N-1)"
        )
    return n


def _packed(weights: npt.ArrayLike | Iterable[npt.ArrayLike]) -> npt.NDArray[np.float16]:
    """``save_recorded_trace``'s weights as one float16 array: a 2-D or 3-D array as it
    is, the steps of an iterable concatenated after checking each one's shape."""
    if isinstance(weights, np.ndarray) and weights.ndim in (2, 3):
        return weights.astype(np.float16, copy=False)
    rows: list[npt.NDArray[np.float16]] = []
    for expected_t, step in enumerate(cast(Iterable[Any], weights), start=1):
        a = np.asarray(step)
        if a.ndim == 1:
            a = a[None, :]
        if a.shape[-1] != expected_t or (rows and a.shape[:-1] != rows[0].shape[:-1]):
            lead = rows[0].shape[:-1] if rows else a.shape[:-1]
            raise TraceFormatError(
                f"step {expected_t} must have shape {(*lead, expected_t)}, got {a.shape}"
            )
        rows.append(a.astype(np.float16))
    if not rows:
        raise TraceFormatError("a recorded trace needs at least one step")
    return np.concatenate(rows, axis=-1)


def _streams(packed: npt.NDArray[np.float16], layers: list[int],
             heads: Sequence[int] | None) -> tuple[npt.NDArray[np.float16], list[int], Sequence[int]]:
    """``(S, T)`` weights with the layer and KV head of each stream: ``(L, H, T)``
    weights flattened layer-major, heads defaulting to ``0 .. H-1``."""
    if packed.ndim == 3:
        n_layers, n_heads, total = packed.shape
        if len(layers) != n_layers:
            raise TraceFormatError(f"{n_layers} layers of weights but {len(layers)} layer ids")
        head_ids = list(range(n_heads)) if heads is None else [int(h) for h in heads]
        if len(head_ids) != n_heads:
            raise TraceFormatError(f"{n_heads} KV heads of weights but {len(head_ids)} head ids")
        return (packed.reshape(n_layers * n_heads, total), [layer for layer in layers for _ in head_ids],
                head_ids * n_layers)
    if packed.ndim != 2:
        raise TraceFormatError(f"weights must be (S, T) or (L, H, T), got shape {packed.shape}")
    if heads is None:
        raise TraceFormatError("heads (the KV head of each stream) is required with 2-D weights")
    return packed, layers, heads


def save_recorded_trace(
    path: str | os.PathLike[str],
    weights: npt.ArrayLike | Iterable[npt.ArrayLike],
    layers: Sequence[int],
    heads: Sequence[int] | None = None,
    *,
    prompt_tokens: int = 0,
    model: str = "",
    metadata: Mapping[str, Any] | None = None,
) -> None:
    """Write a recorded trace as a compressed ``.npz`` in the documented layout.

    Parameters
    ----------
    path : path-like
        Destination (NumPy appends ``.npz`` if missing).
    weights : array or iterable of arrays
        Every step's weights over positions ``0 .. t-1``, stored as float16, in one of
        these shapes (``T = N (N - 1) / 2``, step ``t`` at ``offsets[t-1]:offsets[t]``,
        see :func:`step_offsets`):

        * ``(S, T)``: packed, one row per stream (the cheapest form for long traces);
        * ``(L, H, T)``: packed, per layer and KV head; stored as ``S = L * H`` streams,
          layer-major (stream ``l * H + h``);
        * an iterable of the ``N - 1`` steps in order, step ``t`` of shape ``(S, t)``,
          ``(L, H, t)`` or, with one stream, ``(t,)``.
    layers : sequence of int
        Layer of each stream (length ``S``), or of each of the ``L`` layers with a 3-D
        ``weights``.
    heads : sequence of int, optional
        KV head of each stream (length ``S``; required with 2-D steps), or the ids of the
        ``H`` KV heads with a 3-D ``weights`` (default ``0 .. H-1``).
    prompt_tokens : int, default 0
        Prompt length ``P`` (steps ``t < P`` came from the prefill attention).
    model : str, default ""
        Model name or path.
    metadata : mapping, optional
        JSON-serialisable extras (text source, head reduction, versions, ...).

    Raises
    ------
    TraceFormatError
        Shapes inconsistent, a step of the wrong length, weights negative or not finite.
    """
    packed, layers, heads = _streams(_packed(weights), [int(i) for i in layers], heads)
    metadata_json = json.dumps(dict(metadata or {}), sort_keys=True)
    trace = RecordedTrace(packed, layers, heads, prompt_tokens, model, json.loads(metadata_json))
    np.savez_compressed(
        path,
        format=np.array(TRACE_FORMAT),
        version=np.array(TRACE_VERSION, dtype=np.int64),
        weights=trace.weights16,
        offsets=trace.offsets,
        layers=trace.layers,
        heads=trace.heads,
        num_positions=np.array(trace.num_positions, dtype=np.int64),
        prompt_tokens=np.array(trace.prompt_tokens, dtype=np.int64),
        model=np.array(trace.model),
        metadata=np.array(metadata_json),
    )


#: The keys of a recorded trace file.
_TRACE_KEYS = {"format", "version", "weights", "offsets", "layers", "heads", "num_positions", "prompt_tokens",
               "model", "metadata"}
#: What ``np.load`` and the zip and zlib layers beneath it raise on a file that is not a
#: readable ``.npz`` (a pickled array included, which is never loaded).
_UNREADABLE = (ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error)


def load_recorded_trace(path: str | os.PathLike[str]) -> RecordedTrace:
    """Read a recorded trace written by :func:`save_recorded_trace`.

    Nothing in the file is unpickled: a file that is not a ``.npz`` of plain arrays (a
    pickle, an archive holding object arrays, a truncated or foreign file) is refused
    as not a recorded trace.

    Raises
    ------
    OSError
        The file cannot be read.
    TraceFormatError
        The file is not a scissorhands trace of a known version, or is inconsistent.
    """
    where = os.fspath(path)
    with open(path, "rb") as handle:
        magic = handle.read(4)
    if magic != b"PK\x03\x04":  # a zip archive: every .npz, compressed or not, starts so
        raise TraceFormatError(f"{where}: not a recorded trace (a .npz archive written by 'record')")
    try:
        with np.load(path, allow_pickle=False) as data:
            return _read_trace(data, where)
    except _UNREADABLE as exc:
        if isinstance(exc, TraceFormatError):
            raise
        reason = ("it holds pickled (object) data, which is never loaded" if "pickle" in str(exc)
                  else f"{type(exc).__name__}: {exc}")
        raise TraceFormatError(f"{where}: not a readable recorded trace ({reason})") from None


def _read_trace(data: Any, where: str) -> RecordedTrace:
    """The trace in an open ``.npz`` archive ``data`` (a file named ``where``), checked."""
    missing = sorted(_TRACE_KEYS - set(data.files))
    if missing:
        raise TraceFormatError(f"{where}: missing keys {', '.join(missing)}")
    if str(data["format"]) != TRACE_FORMAT:
        raise TraceFormatError(f"{where}: format is {str(data['format'])!r}")
    if int(data["version"]) != TRACE_VERSION:
        raise TraceFormatError(f"{where}: trace version {int(data['version'])} is not supported")
    try:
        metadata = json.loads(str(data["metadata"]))
    except json.JSONDecodeError as exc:
        raise TraceFormatError(f"{where}: metadata is not JSON ({exc})") from None
    trace = RecordedTrace(
        data["weights"],
        data["layers"],
        data["heads"],
        prompt_tokens=int(data["prompt_tokens"]),
        model=str(data["model"]),
        metadata=metadata,
        name=os.path.basename(where),
    )
    if int(data["num_positions"]) != trace.num_positions or not np.array_equal(data["offsets"], trace.offsets):
        raise TraceFormatError(f"{where}: offsets do not match the weights")
    return trace
