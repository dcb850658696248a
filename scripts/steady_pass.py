"""The cache's steady decode step alone, on cold synthetic rows: its C call's time beside its memory floor.

``python scripts/steady_pass.py [--batch 8] [--held 2048] [--steps 30]``

Times ``sh_cache_step_steady`` (the gather of each row's query-head weights into kept
order, the Scissorhands vote, the victim and the slot table's step, in one C call) over
SmolLM2-135M's shape: 30 layers, 3 KV heads of 3 query heads each, ``--batch``
sequences, every row holding ``--held`` positions in a scrambled slot table (as after
many evictions) and evicting one a step, ``budget=held, recent_window=0.75, sinks=4``.
Before each step 128 MB are written over the caches, as the model's weights stream
through them between two steps, so the rows come from memory as they do in the model.
No model is loaded: the weights are random rows summing to 1.  Prints the median and
fastest step in ms beside the memory floor of ``scripts/decode_overhead.py`` for the
same shape, and their ratio (median step / floor); the first two steps warm up and are
not counted.  Run it once per build of the C core, alternately, to compare two builds
without the model's own noise.

``--per-layer`` adds, in the same run, the pass a design voting inside each layer's
attention would make: every layer its own policy and slot table, its call made right
after its weights are written (as the attention writes them) and after a layer's share
of the model's weights (18 MB) went through the caches, so that the weights are read
from the core's caches and the rows' state from memory; the step is the sum of the 30
calls' own times (measured inside C).  Prints its median beside the one call's and their
ratio.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_overhead import HEADS, KV_HEADS, LAYERS, check_fits, check_held, floor_ms

GROUP = HEADS // KV_HEADS


def footprint(batch: int, held: int) -> int:
    """Bytes of the arrays a run allocates, about: every layer's weights (all query heads,
    float32), the slot table (int32) and validity, and the policy's votes and positions
    (uint32 each, room for twice the held count)."""
    rows = LAYERS * batch * KV_HEADS
    return rows * (held + 1) * (GROUP * 4 + 4 + 1) + rows * 2 * held * 8


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8, help="sequences: 90 rows each (default 8)")
    parser.add_argument("--held", type=int, default=2048, help="positions every row holds (default 2048)")
    parser.add_argument("--steps", type=int, default=30,
                        help="decode steps timed; the first two, warming up, are not counted (default 30)")
    parser.add_argument("--per-layer", action="store_true",
                        help="also time the pass one layer at a time, as inside each layer's attention")
    args = parser.parse_args(argv)
    check_held(parser, args.held)
    if args.batch < 1 or args.steps < 3:
        parser.error(f"--batch must be at least 1 and --steps at least 3, got {args.batch} and {args.steps}")
    check_fits(parser, footprint(args.batch, args.held) * (2 if args.per_layer else 1),
               f"--batch {args.batch} --held {args.held}", "arrays")

    times, inside = time_steps(Rows(LAYERS, args.batch, args.held), args.steps)
    ms = 1e3 * np.asarray(times[2:])
    config = SimpleNamespace(num_hidden_layers=LAYERS, num_attention_heads=KV_HEADS * GROUP,
                             num_key_value_heads=KV_HEADS)
    floor = floor_ms(config, args.batch, args.held)
    print(f"batch {args.batch}, {args.held} held, {LAYERS * args.batch * KV_HEADS} rows: steady step "
          f"{np.median(ms):.3f} ms (fastest {ms.min():.3f} ms) over {len(ms)} steps; memory floor {floor:.3f} ms "
          f"({np.median(ms) / floor:.2f}x)", flush=True)
    if args.per_layer:
        per_layer = 1e3 * np.asarray(time_layer_by_layer([Rows(1, args.batch, args.held, seed=1 + e)
                                                          for e in range(LAYERS)], args.steps)[2:])
        one_call = 1e3 * float(np.median(inside[2:]))
        print(f"layer by layer, each call after its layer's weights were written: {np.median(per_layer):.3f} ms "
              f"(fastest {per_layer.min():.3f} ms) a step, {np.median(per_layer) / one_call:.2f}x the one call's "
              f"{one_call:.3f} ms (both measured inside C)", flush=True)
    return 0


class Rows:
    """``layers`` layers' rows of SmolLM2-135M's shape at ``held`` positions in a batch of
    ``batch``, in one policy, slot table and set of C views: every row holds ``held``
    positions in a scrambled slot table (as after many evictions) and evicts one a step."""

    def __init__(self, layers: int, batch: int, held: int, seed: int = 0) -> None:
        from scissorhands import Scissorhands
        from scissorhands._native import ffi

        self.layers, self.per_layer, self.held = layers, batch * KV_HEADS, held
        rows = layers * self.per_layer
        rng = np.random.default_rng(seed)
        self.policy = policy = Scissorhands(budget=held, recent_window=0.75, sinks=4, heads=rows)
        for pos in range(1, held + 4):  # to the budget, then a few steps of votes
            n = policy.kept_count()
            attn = None if pos < held else rng.random((rows, n), dtype=np.float32)
            policy.step(pos, None if attn is None else attn / attn.sum(1, keepdims=True))
        self.count = count = policy.kept_count()
        self.extent = extent = count + 1  # the slot table's width: the held slots and one free
        self.slots = np.empty((rows, extent), dtype=np.int32)
        self.free = np.empty(rows, dtype=np.int64)
        self.valid = np.zeros((rows, extent), dtype=np.uint8)
        for r in range(rows):
            order = rng.permutation(extent).astype(np.int32)
            self.slots[r, :count], self.free[r] = order[:count], order[count]
            self.valid[r, order[:count]] = 1
        self.counts = np.full(rows, count, dtype=np.int64)
        self.weights = []
        for _ in range(layers):
            w = rng.random((batch, KV_HEADS * GROUP, 1, extent), dtype=np.float32) ** 8
            self.weights.append(w / w.sum(-1, keepdims=True))
        self.written = [w.copy() for w in self.weights]  # what the attention writes, each step
        self.addresses = ffi.new("const float *[]", [ffi.cast("const float *", w.ctypes.data) for w in self.weights])
        self.gathered = np.empty(rows * count, dtype=np.float32)
        self.victims, self.victim_slots = np.empty(rows, np.uint32), np.empty(rows, np.int64)
        self.freed = np.empty(rows, np.int64)
        self.n_victims, self.done, self.seconds = ffi.new("size_t *"), ffi.new("int *"), ffi.new("double *")

        def at(array: np.ndarray, kind: str) -> object:
            return ffi.cast(kind, array.ctypes.data)

        self.views = (at(self.slots, "int32_t *"), at(self.counts, "int64_t *"), at(self.free, "int64_t *"),
                      at(self.valid, "uint8_t *"), at(self.gathered, "float *"), at(self.victims, "uint32_t *"),
                      at(self.victim_slots, "int64_t *"), at(self.freed, "int64_t *"))

    def step(self, step: int) -> float:
        """One steady step (``sh_cache_step_steady``); its time in seconds as the C call
        measured it (the pass, not the call's way in from Python)."""
        from scissorhands._native import lib

        slots, counts, free, valid, gathered, victims, victim_slots, freed = self.views
        rc = lib.sh_cache_step_steady(
            self.addresses, self.layers, self.per_layer, GROUP, self.extent, slots, self.extent, self.count, counts,
            free, valid, self.extent, gathered, self.policy._ptr, self.held + 4 + step, self.held, victims,
            victim_slots, len(self.free), self.n_victims, freed, self.done, self.seconds)
        if rc != 0 or self.done[0] != 2:
            raise SystemExit(f"the steady step was not taken (rc {rc}, done {self.done[0]})")
        self.free[:] = self.freed  # the victim's slot is the next token's
        return float(self.seconds[0])


#: 128 MB: 4x the 32 MB last-level cache measured here.
FLUSH_FLOATS = 32 << 20


def time_steps(rows: Rows, steps: int) -> tuple[list[float], list[float]]:
    """``steps`` steps of ``rows``, each after 128 MB were written over the caches (the
    model's weights streaming through them between two steps); each step's seconds,
    timed around the call and inside it."""
    flush = np.zeros(FLUSH_FLOATS, dtype=np.float32)
    times, inside = [], []
    for step in range(steps):
        flush += 1.0
        begin = time.perf_counter()
        inside.append(rows.step(step))
        times.append(time.perf_counter() - begin)
    return times, inside


def time_layer_by_layer(layers: list[Rows], steps: int) -> list[float]:
    """``steps`` steps of one layer's rows after another, each layer's call right after
    a layer's share of SmolLM2-135M's float32 weights (18 MB) went through the caches
    and its weights were written; each step's seconds, the sum of its calls' own."""
    flush = np.zeros(FLUSH_FLOATS // 7, dtype=np.float32)
    times = []
    for step in range(steps):
        total = 0.0
        for layer in layers:
            flush += 1.0
            for w, written in zip(layer.weights, layer.written):
                np.copyto(w, written)
            total += layer.step(step)
        times.append(total)
    return times


if __name__ == "__main__":
    sys.exit(main())
