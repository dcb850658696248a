"""The cache's memory below its budget against ``DynamicCache``'s: ``python -m bench.memory``.

``python -m bench.memory [--budget 8192] [--lengths 14 15 64 300 1000 2000] [--policies scissorhands h2o]``

For each policy, one ``EvictingCache.from_model(model, policy, budget=B, recent_window=0.75,
sinks=4)`` and one transformers ``DynamicCache`` are fed the same tokens of
:func:`scissorhands.evaluate.default_text` (SmolLM2-135M, one torch thread): the first
length as a prompt, then each next length's tokens (in chunks of 256; one token when the
next length is one more), and at each length ``memory_bytes()`` (keys, values and the policies' state) is
printed beside the stock cache's key and value bytes.  Every length must be below the
budget.
"""

from __future__ import annotations

import argparse
import os
import sys

from bench.real_model import load_smollm2

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=8192)
    parser.add_argument("--lengths", type=int, nargs="+", default=[14, 15, 64, 300, 1000, 2000])
    parser.add_argument("--policies", nargs="+", default=["scissorhands", "h2o"])
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
