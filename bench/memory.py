"""The cache's memory below its budget against ``DynamicCache``'s: ``python -m bench.memory``.

``python -m bench.memory [--budget 8192] [--lengths 14 15 64 300 1000 2000] [--policies scissorhands h2o]``

For each policy, one ``EvictingCache.from_model(model, policy, budget=B, recent_window=0.75,
sinks=4)`` and one transformers ``DynamicCache`` are fed the same tokens of
:func:`scissorhands.commands.evaluate.default_text` (SmolLM2-135M, one torch thread): the first
length as a prompt, then each next length's tokens (in chunks of 256; one token when the
next length is one more), and at each length ``memory_bytes()`` (keys, values and the policies' state) is
printed beside the stock cache's key and value bytes.  Every length must be below the
budget.

``python -m bench.memory --at-budget [--budget 256] [--prompt 1024] [--steps 64] [--policies scissorhands]``

At the budget, whatever the pooling: per policy, one cache per pool (``head``: the
uniform budget, ``layer``, ``model``; ``recent_window=0.75, sinks=4``) reads the first
``--prompt`` tokens of the text in chunks of 256 and then ``--steps`` more one per
forward (teacher-forced); the key and value bytes each holds are printed beside the
uniform budget's, and beside what buffers per KV head (as wide as a layer's fullest
head, the layout before heads shared one) hold, with the milliseconds per decode step of
each (the model loaded with sdpa, one torch thread: a ratio within one run).

``python -m bench.memory --archive [--budget 256] [--prompt 1024] [--steps 64]``

The recall tier: one prompt-aware Scissorhands cache (``recent_window=0.75, sinks=4``) per
archive mode (``float32``, ``int8``) reads the first ``--prompt`` tokens in chunks of 256,
then ``--steps`` more one per forward; printed: what attention reads (``memory_bytes()``),
the archive's bytes (``archive_bytes()``), the positions it holds and its bytes per
archived position and KV head, and int8's bytes against float32's.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from bench.real_model import load_smollm2

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=8192)
    parser.add_argument("--lengths", type=int, nargs="+", default=[14, 15, 64, 300, 1000, 2000])
    parser.add_argument("--policies", nargs="+", default=None,
                        help="default: scissorhands h2o (scissorhands with --at-budget)")
    parser.add_argument("--at-budget", action="store_true", help="the key and value bytes at the budget per pool")
    parser.add_argument("--prompt", type=int, default=1024, help="--at-budget: tokens read in chunks of 256")
    parser.add_argument("--steps", type=int, default=64, help="--at-budget: tokens read one per forward after it")
    parser.add_argument("--archive", action="store_true", help="the recall tier's bytes, float32 and int8")
    args = parser.parse_args(argv)
    for flag, on in (("--archive", args.archive), ("--at-budget", args.at_budget)):
        if not on:
            continue
        if args.budget == parser.get_default("budget"):
            args.budget = 256
        if not 1 <= args.budget < args.prompt or args.steps < 1:
            parser.error(f"{flag} needs 1 <= --budget < --prompt and --steps >= 1, got budget={args.budget}, "
                         f"prompt={args.prompt}, steps={args.steps}")
        if args.archive:
            return archive_bytes(args.budget, args.prompt, args.steps, parser)
        return at_budget(args.policies or ["scissorhands"], args.budget, args.prompt, args.steps, parser)
    args.policies = args.policies or ["scissorhands", "h2o"]
    lengths = sorted(args.lengths)
    if lengths[0] < 1 or lengths[-1] >= args.budget:
        parser.error(f"--lengths must be in [1, budget={args.budget}), got {lengths}")

    import torch
    from transformers import DynamicCache

    from scissorhands import hf

    model, _, ids = load_smollm2()
    if lengths[-1] > ids.shape[1]:
        parser.error(f"the text has {ids.shape[1]} tokens, --lengths asks for {lengths[-1]}")

    def stock_bytes(cache: DynamicCache) -> int:
        return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
                   if t is not None)

    for policy in args.policies:
        ours = hf.EvictingCache.from_model(model, policy, budget=args.budget, recent_window=0.75, sinks=4)
        stock = DynamicCache(config=model.config)
        done = 0
        for length in lengths:
            pieces = [(start, min(length, start + 256)) for start in range(done, length, 256)]
            with torch.no_grad():
                for begin, end in pieces:
                    hf.attention.install(model)
                    model(input_ids=ids[:, begin:end], cache=ours, use_cache=True)
                    hf.uninstall(model)
                    model(input_ids=ids[:, begin:end], cache=stock, use_cache=True)
            done = length
            mine, theirs = ours.memory_bytes(), stock_bytes(stock)
            print(f"{policy} budget {args.budget}: {length:6d} tokens: EvictingCache {mine / 1e6:8.3f} MB, "
                  f"DynamicCache {theirs / 1e6:8.3f} MB ({mine / theirs:.3f}x)", flush=True)
    return 0


def at_budget(policies: list[str], budget: int, prompt: int, steps: int, parser: argparse.ArgumentParser) -> int:
    """The ``--at-budget`` table (see the module docstring)."""
    import torch

    from scissorhands import hf

    model, _, ids = load_smollm2()
    if prompt + steps > ids.shape[1]:
        parser.error(f"the text has {ids.shape[1]} tokens, --prompt + --steps asks for {prompt + steps}")

    def held_bytes(policy: str, pool: str, share_heads: bool) -> tuple[int, Any, float]:
        cache = hf.EvictingCache.from_model(model, policy, budget=budget, recent_window=0.75, sinks=4, pool=pool)
        cache.storage.share_heads = share_heads  # False: the layout before heads shared a buffer
        with torch.no_grad():
            for begin in range(0, prompt, 256):
                model(input_ids=ids[:, begin:min(prompt, begin + 256)], cache=cache, use_cache=True)
            start = time.perf_counter()
            for t in range(prompt, prompt + steps):
                model(input_ids=ids[:, t:t + 1], cache=cache, use_cache=True)
            ms = 1e3 * (time.perf_counter() - start) / steps
        return cache.storage.nbytes(), cache.held_counts(), ms

    hf.attention.install(model)
    for policy in policies:
        uniform, _, uniform_ms = held_bytes(policy, "head", True)
        print(f"{policy} budget {budget} pool=head : keys and values {uniform / 1e6:7.3f} MB, "
              f"{uniform_ms:.1f} ms a step", flush=True)
        for pool in ("layer", "model"):
            mine, held, ms = held_bytes(policy, pool, True)
            per_head, _, per_head_ms = held_bytes(policy, pool, False)
            print(f"{policy} budget {budget} pool={pool:<5}: keys and values {mine / 1e6:7.3f} MB "
                  f"({mine / uniform:.3f}x the uniform budget's), {ms:.1f} ms a step; buffers per head "
                  f"{per_head / 1e6:7.3f} MB ({per_head / uniform:.3f}x), {per_head_ms:.1f} ms a step; "
                  f"{int(held.sum())} positions held, the fullest head {int(held.max())}", flush=True)
    hf.uninstall(model)
    return 0


def archive_bytes(budget: int, prompt: int, steps: int, parser: argparse.ArgumentParser) -> int:
    """The ``--archive`` table (see the module docstring)."""
    import torch

    from scissorhands import hf

    model, _, ids = load_smollm2()
    if prompt + steps > ids.shape[1]:
        parser.error(f"the text has {ids.shape[1]} tokens, --prompt + --steps asks for {prompt + steps}")
    per_position = {}
    for mode in ("float32", "int8"):
        cache = hf.EvictingCache.from_model(model, "scissorhands", budget=budget, recent_window=0.75, sinks=4,
                                            prompt_aware=True, archive=mode)
        with torch.no_grad():
            for begin in range(0, prompt, 256):
                model(input_ids=ids[:, begin:min(prompt, begin + 256)], cache=cache, use_cache=True)
            for t in range(prompt, prompt + steps):
                model(input_ids=ids[:, t:t + 1], cache=cache, use_cache=True)
        archived = sum(int(cache.archived_positions(e, 0, h).size) for e in range(cache.evicting_layers)
                       for h in range(cache.num_kv_heads))
        per_position[mode] = cache.archive_bytes() / archived
        print(f"archive={mode:<7} budget {budget}, {prompt + steps} tokens read: attention reads "
              f"{cache.memory_bytes() / 1e6:7.3f} MB; archive {cache.archive_bytes() / 1e6:7.3f} MB for {archived} "
              f"positions (every layer and KV head), {per_position[mode]:.1f} bytes allocated per position", flush=True)
    print(f"int8 / float32 bytes per archived position: {per_position['int8'] / per_position['float32']:.3f}")
    hf.uninstall(model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
