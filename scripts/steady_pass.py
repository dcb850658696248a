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
    args = parser.parse_args(argv)
    check_held(parser, args.held)
    if args.batch < 1 or args.steps < 3:
        parser.error(f"--batch must be at least 1 and --steps at least 3, got {args.batch} and {args.steps}")
    check_fits(parser, footprint(args.batch, args.held), f"--batch {args.batch} --held {args.held}", "arrays")

    from scissorhands import Scissorhands
    from scissorhands._native import ffi, lib

    rows_per_layer = args.batch * KV_HEADS
    rows = LAYERS * rows_per_layer
    rng = np.random.default_rng(0)
    policy = Scissorhands(budget=args.held, recent_window=0.75, sinks=4, heads=rows)
    for pos in range(1, args.held + 4):  # to the budget, then a few steps of votes
        n = policy.kept_count()
        attn = None if pos < args.held else rng.random((rows, n), dtype=np.float32)
        policy.step(pos, None if attn is None else attn / attn.sum(1, keepdims=True))
    count = policy.kept_count()
    extent = count + 1  # the slot table's width: the held slots and one free
    slots = np.empty((rows, extent), dtype=np.int32)
    free = np.empty(rows, dtype=np.int64)
    valid = np.zeros((rows, extent), dtype=np.uint8)
    for r in range(rows):
        order = rng.permutation(extent).astype(np.int32)
        slots[r, :count], free[r] = order[:count], order[count]
        valid[r, order[:count]] = 1
    counts = np.full(rows, count, dtype=np.int64)
    weights = []
    for _ in range(LAYERS):
        w = rng.random((args.batch, KV_HEADS * GROUP, 1, extent), dtype=np.float32) ** 8
        weights.append(w / w.sum(-1, keepdims=True))
    addresses = ffi.new("const float *[]", [ffi.cast("const float *", w.ctypes.data) for w in weights])
    gathered = np.empty(rows * count, dtype=np.float32)
    victims, victim_slots, freed = np.empty(rows, np.uint32), np.empty(rows, np.int64), np.empty(rows, np.int64)
    n_victims, done, seconds = ffi.new("size_t *"), ffi.new("int *"), ffi.new("double *")
    flush = np.zeros(32 << 20, dtype=np.float32)

    def at(array: np.ndarray, kind: str) -> object:
        return ffi.cast(kind, array.ctypes.data)

    times = []
    for step in range(args.steps):
        flush += 1.0
        begin = time.perf_counter()
        rc = lib.sh_cache_step_steady(
            addresses, LAYERS, rows_per_layer, GROUP, extent, at(slots, "int32_t *"), extent, count,
            at(counts, "int64_t *"), at(free, "int64_t *"), at(valid, "uint8_t *"), extent, at(gathered, "float *"),
            policy._ptr, args.held + 4 + step, args.held, at(victims, "uint32_t *"), at(victim_slots, "int64_t *"),
            rows, n_victims, at(freed, "int64_t *"), done, seconds)
        times.append(time.perf_counter() - begin)
        if rc != 0 or done[0] != 2:
            raise SystemExit(f"the steady step was not taken (rc {rc}, done {done[0]})")
        free[:] = freed  # the victim's slot is the next token's
    ms = 1e3 * np.asarray(times[2:])
    config = SimpleNamespace(num_hidden_layers=LAYERS, num_attention_heads=KV_HEADS * GROUP,
                             num_key_value_heads=KV_HEADS)
    floor = floor_ms(config, args.batch, args.held)
    print(f"batch {args.batch}, {args.held} held, {rows} rows: steady step {np.median(ms):.3f} ms "
          f"(fastest {ms.min():.3f} ms) over {len(ms)} steps; memory floor {floor:.3f} ms "
          f"({np.median(ms) / floor:.2f}x)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
