"""Time to the first token of a long prompt: ``EvictingCache`` against ``DynamicCache``.

``python -m bench.ttft [--lengths 1024 2048] [--repeats 1] [--json PATH] [--profile PATH]``

Each length's prompt (the first tokens of :func:`scissorhands.commands.evaluate.default_text`)
is generated from with ``max_new_tokens=2`` (the second token's forward runs a
prompt-aware cache's prompt end) and ``prefill_chunk_size=256`` (what ``python -m
scissorhands generate`` does) with transformers' ``DynamicCache``, with chunked eviction
(``EvictingCache.from_model(model, "scissorhands", budget=512, recent_window=0.75,
sinks=4)``) and, with ``--prompt-aware``, the same with ``prompt_aware=True`` (the prompt
held up to ``--prefill-budget``, decided at its end), one after another in one process
(one torch thread), so that their ratios are measured under the same load.  Each is split
into its parts: the model's forward (the rest), the attention weights computed beside it,
the policy calls and the cache's bookkeeping (the cache's stats).  ``--profile`` writes a
cProfile of the evicting runs.
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


def _parser() -> argparse.ArgumentParser:
    """The command's arguments."""
    parser = argparse.ArgumentParser(prog="python -m bench.ttft", description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--budget", type=int, default=512)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--profile", metavar="PATH")
    parser.add_argument("--prompt-aware", action="store_true", help="also time a prompt-aware cache")
    parser.add_argument("--prefill-budget", type=int, default=4096)
    return parser


def _parts(seconds: float, cache: Any) -> dict[str, float]:
    """A run's seconds split into model, weights, policy and bookkeeping."""
    from transformers import DynamicCache

    if isinstance(cache, DynamicCache):
        return {"seconds": seconds, "model_s": seconds, "weights_s": 0.0, "policy_s": 0.0, "bookkeeping_s": 0.0}
    s = cache.stats
    ours = s.rows_seconds + s.policy_seconds + s.bookkeeping_seconds
    return {"seconds": seconds, "model_s": seconds - ours, "weights_s": s.rows_seconds,
            "policy_s": s.policy_seconds, "bookkeeping_s": s.bookkeeping_seconds}


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    check_json(parser, args.json)

    import torch
    from transformers import DynamicCache

    from scissorhands import hf

    model, tokenizer, ids = load_smollm2()
    profiler = cProfile.Profile() if args.profile else None

    def run(length: int, kind: str) -> tuple[float, Any]:
        prompt = ids[:, :length]
        cache: Any
        if kind == "dynamic":
            hf.uninstall(model)
            cache = DynamicCache(config=model.config)
        else:
            aware = {"prompt_aware": True, "prefill_budget": args.prefill_budget} if kind == "aware" else {}
            cache = hf.EvictingCache.from_model(model, "scissorhands", budget=args.budget,
                                                recent_window=0.75, sinks=4, **aware)
        start = time.perf_counter()
        if profiler is not None and kind != "dynamic":
            profiler.enable()
        with torch.no_grad():  # two tokens: the second's forward runs the prompt's end
            model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=2, do_sample=False,
                           prefill_chunk_size=args.chunk, cache=cache,
                           pad_token_id=tokenizer.eos_token_id)
        if profiler is not None and kind != "dynamic":
            profiler.disable()
        return time.perf_counter() - start, cache

    kinds = ("dynamic", "chunked") + (("aware",) if args.prompt_aware else ())
    names = {"dynamic": "DynamicCache", "chunked": "chunked eviction", "aware": "prompt-aware"}
    rows = []
    for length in args.lengths:
        for _ in range(args.repeats):
            row: dict[str, Any] = {"length": length}
            for kind in kinds:
                seconds, cache = run(length, kind)
                row[kind] = _parts(seconds, cache)
                if kind == "aware":
                    row[kind]["prompt_ends"] = cache.stats.prompt_ends
                    row[kind]["held_after"] = int(cache.held_counts().max())
            stock = row["dynamic"]["seconds"]
            rows.append(row)
            for kind in kinds:
                p = row[kind]
                print(f"{length:6d} tokens, {names[kind]:<17}: {p['seconds']:7.2f} s ({p['seconds'] / stock:.2f}x "
                      f"the DynamicCache): model {p['model_s']:.2f} s, weights {p['weights_s']:.2f} s, policy "
                      f"{p['policy_s']:.2f} s, bookkeeping {p['bookkeeping_s']:.2f} s", flush=True)
    if profiler is not None:
        profiler.dump_stats(args.profile)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"budget": args.budget, "chunk": args.chunk, "prefill_budget": args.prefill_budget,
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
