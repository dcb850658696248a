"""Time to the first token of a long prompt: ``EvictingCache`` against ``DynamicCache``.

``python -m bench.ttft [--lengths 1024 2048] [--repeats 1] [--json PATH] [--profile PATH]``

Each length's prompt (the first tokens of :func:`scissorhands.evaluate.default_text`)
is generated from with ``max_new_tokens=1`` and ``prefill_chunk_size=256`` (what
``python -m scissorhands generate`` does) once with transformers' ``DynamicCache`` and
once with ``EvictingCache.from_model(model, "scissorhands", budget=512,
recent_window=0.75, sinks=4)``, alternately in one process (one torch thread), so that
their ratio is measured under the same load.  The cache's own stats (rows beside sdpa,
bookkeeping, policy calls) are reported beside.  ``--profile`` writes a cProfile of the
evicting runs.  ``--prompt-aware`` adds a third run per length,
``prompt_aware=True`` (the prompt held up to ``--prefill-budget`` while it is read, decided
at its end): its time to the first token, then the prompt-end eviction the first decode
step would run (``end_prompt()``, timed apart), and the positions and bytes held at the
prompt's end, before it.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import sys
import time
from typing import Any

from bench.real_model import check_json, load_smollm2

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ttft", description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--budget", type=int, default=512)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--profile", metavar="PATH")
    parser.add_argument("--prompt-aware", action="store_true", help="also time a prompt-aware cache")
    parser.add_argument("--prefill-budget", type=int, default=4096)
    args = parser.parse_args(argv)
    check_json(parser, args.json)

    import torch
    from transformers import DynamicCache

    from scissorhands import hf

    model, tokenizer, ids = load_smollm2()
    profiler = cProfile.Profile() if args.profile else None

    def run(length: int, evicting: bool, prompt_aware: bool = False) -> tuple[float, Any]:
        prompt = ids[:, :length]
        cache: Any
        if evicting:
            cache = hf.EvictingCache.from_model(model, "scissorhands", budget=args.budget,
                                                recent_window=0.75, sinks=4, prompt_aware=prompt_aware,
                                                prefill_budget=args.prefill_budget)
        else:
            hf.uninstall(model)
            cache = DynamicCache(config=model.config)
        start = time.perf_counter()
        if profiler is not None and evicting:
            profiler.enable()
        with torch.no_grad():
            model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=1, do_sample=False,
                           prefill_chunk_size=args.chunk, cache=cache,
                           pad_token_id=tokenizer.eos_token_id)
        if profiler is not None and evicting:
            profiler.disable()
        return time.perf_counter() - start, cache

    rows = []
    for length in args.lengths:
        for _ in range(args.repeats):
            stock, _ = run(length, False)
            ours, cache = run(length, True)
            s = cache.stats
            rows.append({"length": length, "dynamic_s": stock, "evicting_s": ours, "ratio": ours / stock,
                         "rows_s": s.rows_seconds, "bookkeeping_s": s.bookkeeping_seconds,
                         "policy_s": s.policy_seconds, "update_s": s.update_seconds})
            print(f"{length:6d} tokens: DynamicCache {stock:7.2f} s, EvictingCache {ours:7.2f} s "
                  f"({ours / stock:.2f}x); rows {s.rows_seconds:.2f} s, bookkeeping {s.bookkeeping_seconds:.2f} s, "
                  f"policy {s.policy_seconds:.2f} s", flush=True)
            if args.prompt_aware:
                aware, cache = run(length, True, prompt_aware=True)
                held, held_mb = int(cache.held_counts().max()), cache.memory_bytes() / 2**20
                start = time.perf_counter()
                cache.end_prompt()
                end = time.perf_counter() - start
                rows[-1].update({"prompt_aware_s": aware, "prompt_aware_ratio": aware / stock,
                                 "prompt_end_s": end, "prompt_held": held, "prompt_mb": held_mb,
                                 "after_held": int(cache.held_counts().max())})
                print(f"        prompt-aware {aware:7.2f} s ({aware / stock:.2f}x the DynamicCache, "
                      f"{aware / ours:.2f}x chunked eviction); prompt's end {end:.3f} s; held at the prompt's "
                      f"end {held} positions, {held_mb:.1f} MB, then {rows[-1]['after_held']}", flush=True)
    if profiler is not None:
        profiler.dump_stats(args.profile)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"budget": args.budget, "chunk": args.chunk, "prefill_budget": args.prefill_budget,
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
