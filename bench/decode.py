"""What a decode step costs the cache beside the model: ``python -m bench.decode``.

``python -m bench.decode [--held 512 1024] [--steps 32] [--batch 1] [--json PATH]``

For each held count ``H``: the first ``H`` tokens of
:func:`scissorhands.commands.evaluate.default_text` in chunks of 256, then ``--steps`` decode
steps (one token per forward, teacher-forced), with transformers' ``DynamicCache`` and
with ``EvictingCache.from_model(model, "scissorhands", budget=H, recent_window=0.75,
sinks=4)`` in both position modes (``original``, ``cache``: at the budget, every step
evicts) and with budget ``4 H`` (``unevicted``: nothing evicted yet, the rows computed
beside sdpa); with ``--archive``, also ``prompt_aware=True`` after a prompt of ``5 H``
tokens, without (``aware``) and with the recall tier (``archive``: ``archive="float32"``,
``4 H`` positions archived at the prompt's end), their first decode step (the prompt's
end) untimed; alternately in one process, one torch thread.  ``--batch B`` runs ``B``
copies of the text as one batch.  Reported per configuration:
ms per step, the policy calls and the cache's bookkeeping as a share of the step, the
rows beside sdpa and the re-rotation (``positions="cache"``) in ms per step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from bench.real_model import check_json, load_smollm2

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _run(model: Any, ids: Any, args: argparse.Namespace, held: int, kind: str) -> dict[str, Any]:
    """One configuration's row: ``kind``'s cache at ``held`` positions, its prompt, then
    ``args.steps`` timed decode steps."""
    import torch
    from transformers import DynamicCache

    from scissorhands import hf

    cache: Any
    if kind == "dynamic":
        hf.uninstall(model)
        cache = DynamicCache(config=model.config)
    elif kind in ("aware", "archive"):
        cache = hf.EvictingCache.from_model(model, "scissorhands", budget=held, recent_window=0.75, sinks=4,
                                            prompt_aware=True, archive="float32" if kind == "archive" else None)
    else:
        budget = 4 * held if kind == "unevicted" else held
        cache = hf.EvictingCache.from_model(model, "scissorhands", budget=budget, recent_window=0.75, sinks=4,
                                            positions="cache" if kind == "cache" else "original")
    # A little over the budget, the decode steps evicting; prompt-aware: 5x, so that the
    # prompt's end (the first, untimed step) archives 4x the budget.
    prompt = 5 * held + 1 if kind in ("aware", "archive") else held + 8
    with torch.no_grad():
        end = prompt - 1 if kind in ("aware", "archive") else prompt
        for start in range(0, end, args.chunk):
            piece = ids[start:min(end, start + args.chunk)][None].expand(args.batch, -1)
            model(input_ids=piece, cache=cache, use_cache=True)
        if end < prompt:  # the prompt's end
            model(input_ids=ids[end:prompt][None].expand(args.batch, -1), cache=cache, use_cache=True)
        before = None if kind == "dynamic" else (cache.stats.policy_seconds, cache.stats.bookkeeping_seconds,
                                                 cache.stats.rows_seconds, cache.stats.rerotate_seconds)
        start_time = time.perf_counter()
        for t in range(prompt, prompt + args.steps):
            model(input_ids=ids[t:t + 1][None].expand(args.batch, -1), cache=cache, use_cache=True)
        seconds = time.perf_counter() - start_time
    ms = 1e3 * seconds / args.steps
    row: dict[str, Any] = {"held": held, "batch": args.batch, "cache": kind, "ms_per_step": ms}
    if before is not None:
        s = cache.stats
        policy = (s.policy_seconds - before[0]) * 1e3 / args.steps
        book = (s.bookkeeping_seconds - before[1]) * 1e3 / args.steps
        row.update(policy_ms=policy, bookkeeping_ms=book, overhead_percent=100 * (policy + book) / ms,
                   rows_ms=(s.rows_seconds - before[2]) * 1e3 / args.steps,
                   rerotate_ms=(s.rerotate_seconds - before[3]) * 1e3 / args.steps)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.decode", description=__doc__.splitlines()[0])
    parser.add_argument("--held", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--archive", action="store_true",
                        help="also prompt-aware without and with an archive of 4x the budget")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    check_json(parser, args.json)

    model, _, ids = load_smollm2()
    ids = ids[0]

    print("per held count: dynamic = transformers' DynamicCache; unevicted = budget 4x held, nothing evicted yet "
          "(rows computed beside sdpa); original / cache = budget held, one eviction a step, true positions / "
          "positions='cache'; % = policy + bookkeeping as a share of that step; the configurations run one after "
          "another, so steps a few per cent apart (or a cache faster than DynamicCache) are the machine's noise: "
          "use --steps 24 or more", flush=True)
    rows = []
    for held in args.held:
        kinds = ("dynamic", "unevicted", "original", "cache") + (("aware", "archive") if args.archive else ())
        for kind in kinds:
            row = _run(model, ids, args, held, kind)
            rows.append(row)
            extra = "" if kind == "dynamic" else (
                f"; policy {row['policy_ms']:.2f} ms + bookkeeping {row['bookkeeping_ms']:.2f} ms "
                f"= {row['overhead_percent']:.2f}%, rerotate {row['rerotate_ms']:.2f} ms")
            print(f"held {held:5d} batch {args.batch} {kind:8s}: {row['ms_per_step']:7.2f} ms/step{extra}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": args.steps, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
