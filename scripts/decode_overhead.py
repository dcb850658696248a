"""Policy plus bookkeeping per decode step at one held count, from the cache's own timers.

``python scripts/decode_overhead.py [--held 2048] [--batch 1] [--steps 24] [--repeats 2]``

SmolLM2-135M, one torch thread: ``--held`` + 8 tokens of the default text in chunks of
256 (a little over the budget), then ``--steps`` teacher-forced decode steps with ``EvictingCache.from_model(model,
"scissorhands", budget=held, recent_window=0.75, sinks=4)`` (one eviction a step), a
fresh cache for each of ``--repeats``.  Prints ms per step and the policy's and the
bookkeeping's ms per step (``CacheStats``) and, beside them, the step pass's memory
floor: what one core takes to read the bytes that pass cannot do without and write back
the state it changes, with numpy (the median of five passes, each after 128 MB were
written over the caches, as the model's weights stream through them between two
steps): a sum of every policy row's query-head weights over its held positions
(``group x (held + 1)`` float32 a row) and an in-place increment of two uint32 per held
slot (its vote and its slot-table entry).  As a share of the step it says how far below
the measured share one core's memory lets any single-threaded pass go.  Run it once per
build of the C core, alternately, to compare two builds on one machine (``python -m
bench.decode`` compares configurations within one build).  Refused before the model
loads: ``--held`` + 8 + ``--steps`` past the model's trained context (8,192 positions),
or keys, values and a prompt chunk's attention larger than half the machine's memory.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--held", type=int, default=2048, help="the budget, and so what each row holds (default 2048)")
    parser.add_argument("--batch", type=int, default=1, help="sequences, each the same text (default 1)")
    parser.add_argument("--steps", type=int, default=24, help="decode steps timed per cache (default 24)")
    parser.add_argument("--repeats", type=int, default=2, help="fresh caches, one line each (default 2)")
    args = parser.parse_args(argv)
    check_held(parser, args.held)
    if args.steps < 1 or args.repeats < 1 or args.batch < 1:
        parser.error(f"--steps, --repeats and --batch must be at least 1, got --steps {args.steps} --repeats "
                     f"{args.repeats} --batch {args.batch}")
    if args.held + 8 + args.steps > TRAINED_CONTEXT:
        parser.error(f"--held + 8 + --steps must stay within SmolLM2-135M's trained context of "
                     f"{TRAINED_CONTEXT} positions (the step measured is the model's own), "
                     f"got {args.held} + 8 + {args.steps}")
    check_fits(parser, footprint(args.batch, args.held + 8 + args.steps),
               f"--batch {args.batch} --held {args.held}", "keys, values and a prompt chunk's attention")

    import torch

    from bench.real_model import load_smollm2
    from scissorhands import hf

    torch.set_num_threads(1)
    model, _, ids = load_smollm2()
    ids = ids[0]
    prompt = args.held + 8  # a little over the budget: every decode step evicts
    for _ in range(args.repeats):
        cache = hf.EvictingCache.from_model(model, "scissorhands", budget=args.held, recent_window=0.75, sinks=4)
        with torch.no_grad():
            for start in range(0, prompt, 256):
                piece = ids[start:min(prompt, start + 256)][None].expand(args.batch, -1)
                model(input_ids=piece, cache=cache, use_cache=True)
            policy, book = cache.stats.policy_seconds, cache.stats.bookkeeping_seconds
            begin = time.perf_counter()
            for t in range(prompt, prompt + args.steps):
                model(input_ids=ids[t:t + 1][None].expand(args.batch, -1), cache=cache, use_cache=True)
            ms = 1e3 * (time.perf_counter() - begin) / args.steps
        floor = floor_ms(model.config, args.batch, args.held)
        policy = 1e3 * (cache.stats.policy_seconds - policy) / args.steps
        book = 1e3 * (cache.stats.bookkeeping_seconds - book) / args.steps
        print(f"held {args.held} batch {args.batch}: {ms:.2f} ms/step; policy {policy:.3f} ms + bookkeeping "
              f"{book:.3f} ms = {policy + book:.3f} ms ({100 * (policy + book) / ms:.2f}%); "
              f"memory floor {floor:.3f} ms ({100 * floor / ms:.2f}%)", flush=True)
    return 0


#: SmolLM2-135M's trained context (``max_position_embeddings``), and the shape of its
#: attention: layers, query heads, KV heads, head width.
TRAINED_CONTEXT = 8192
LAYERS, HEADS, KV_HEADS, HEAD_DIM = 30, 9, 3, 64


def footprint(batch: int, tokens: int) -> int:
    """Bytes the run's largest tensors take, about: every layer's keys and values for
    ``tokens`` positions (float32) and one layer's attention weights of a 256-token prompt
    chunk over them."""
    return batch * tokens * 4 * (LAYERS * KV_HEADS * HEAD_DIM * 2 + HEADS * 256)


def check_fits(parser: argparse.ArgumentParser, need: int, asked: str, what: str) -> None:
    """Exit through ``parser.error`` when ``need`` bytes (of ``what``, for the arguments
    ``asked``) are more than half the machine's memory (unknown: no check)."""
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else None
    if have is not None and need > have // 2:
        parser.error(f"{asked} needs about {need / 2**30:.1f} GiB of {what}, "
                     f"more than half of this machine's {have / 2**30:.1f} GiB")


def check_held(parser: argparse.ArgumentParser, held: int) -> None:
    """Exit through ``parser.error`` when ``--held`` leaves no room for the configuration's
    recent window (0.75 of the budget) plus its 4 sinks."""
    if held < 17:
        parser.error(f"--held must be at least 17 (a recent window of 0.75 of it plus 4 sinks), got {held}")


def floor_ms(config: Any, batch: int, held: int, repeats: int = 5) -> float:
    """The memory floor of a steady step's pass at ``held`` positions in a batch of
    ``batch``, in ms (the module docstring says what it reads and writes)."""
    import numpy as np

    layers, heads = int(config.num_hidden_layers), int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    rows = layers * batch * kv_heads
    weights = np.random.default_rng(0).random((rows, heads // kv_heads, held + 1), dtype=np.float32)
    state = np.zeros((rows, 2 * held), dtype=np.uint32)
    flush = np.zeros(32 << 20, dtype=np.float32)  # 128 MB: 4x the 32 MB last-level cache measured here
    times = []
    for _ in range(repeats):
        flush += 1.0
        begin = time.perf_counter()
        np.add.reduce(weights, axis=None)
        state += np.uint32(1)
        times.append(time.perf_counter() - begin)
    return 1e3 * float(np.median(times))


if __name__ == "__main__":
    sys.exit(main())
