"""kvpress presses on the package's retrieval tasks: peer rows for ``scissorhands tasks``.

UNTESTED: this script has not been run (kvpress was not installed where it was written);
read it as a plan with working parts, and check its first rows by hand.

kvpress (NVIDIA, ``pip install kvpress==0.5.5``) pins ``transformers<5.3``, which this
package's ``[hf]`` extra does not allow, so it runs in a separate virtual environment
and is no dependency of the package::

    python -m venv .kvpress-venv
    .kvpress-venv/bin/pip install torch==2.13.0  # the CPU build, pinned as the README installs it
    .kvpress-venv/bin/pip install kvpress==0.5.5 datasets
    PYTHONPATH=src HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 .kvpress-venv/bin/python scripts/kvpress_peer.py \\
        --model DIR --tasks sh_fact_once,sh_prose_needle --lengths 512 --budgets 1/4 1/2 --samples 10 \\
        --json kvpress.json

``DIR`` is a transformers checkpoint directory (a GGUF converted once, e.g. by
``scissorhands.hf.load_model`` and ``save_pretrained``).  The prompts are the package's
own (:func:`scissorhands.retrieval.data.generate`, the same seed, so the same samples as
``scissorhands tasks``): kvpress's pipeline takes the context and the question apart,
compresses the context's cache after its prefill (the question is not seen by the press,
kvpress's default), then reads the question and generates greedily; its chat template is
kvpress's rendering of the same turns, so the token counts differ slightly from the
lm-eval prompts.  ``sh_later_turn``'s two turns become one context here.  The budget is
kvpress's ``compression_ratio = 1 - budget / length``.  RULER's tasks are not run here
(they need lm-eval in this environment too).

The output is a ``scissorhands tasks --json``-like document (``format`` ``kvpress.peer``)
whose rows carry ``config`` = the press's name; ``scissorhands report`` does not read it.
"""

from __future__ import annotations

import argparse
import json
import sys
from fractions import Fraction

PRESSES = ("snapkv", "tova", "streaming-llm", "observed-attention", "expected-attention", "knorm")


def make_press(name: str, ratio: float):
    """The kvpress press of ``name`` at ``compression_ratio=ratio``."""
    import kvpress

    if name == "snapkv":
        return kvpress.SnapKVPress(compression_ratio=ratio)
    if name == "tova":
        return kvpress.TOVAPress(compression_ratio=ratio)
    if name == "streaming-llm":
        return kvpress.StreamingLLMPress(compression_ratio=ratio, n_sink=4)
    if name == "observed-attention":  # needs the model's eager attention (--attention eager)
        return kvpress.ObservedAttentionPress(compression_ratio=ratio)
    if name == "expected-attention":
        return kvpress.ExpectedAttentionPress(compression_ratio=ratio)
    if name == "knorm":
        return kvpress.KnormPress(compression_ratio=ratio)
    raise SystemExit(f"unknown press {name!r}; choose from {', '.join(PRESSES)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a transformers checkpoint directory")
    parser.add_argument("--tasks", default="sh_fact_once,sh_fact_restated,sh_later_turn,sh_prose_needle")
    parser.add_argument("--presses", default=",".join(PRESSES))
    parser.add_argument("--lengths", type=int, nargs="+", default=[512])
    parser.add_argument("--budgets", type=Fraction, nargs="+", default=[Fraction(1, 4), Fraction(1, 2)])
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--attention", default="eager", choices=("eager", "sdpa"))
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    from scissorhands.retrieval.data import INTRO, generate, score

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation=args.attention)
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer, device="cpu")
    rows = []
    for task in args.tasks.split(","):
        for length in args.lengths:
            for sample in generate(task, tokenizer, [length], args.samples, args.seed):
                context = f"{INTRO}\n\n{sample['document']}"
                runs = [("full", None, None)] + [(p, b, make_press(p, float(1 - b)))
                                                 for b in args.budgets for p in args.presses.split(",")]
                for name, budget, press in runs:
                    out = pipe(context, question=f"\n\n{sample['question']}", answer_prefix=sample["answer_start"],
                               press=press, max_new_tokens=args.max_new_tokens)
                    answer = out["answer"]
                    rows.append({"task": task, "length": length, "config": name,
                                 "fraction": None if budget is None else str(budget), "index": sample["index"],
                                 "depth": sample["depth"], "response": answer, "score": score(sample, answer)})
                    print(f"{task} {length} {name} {budget} #{sample['index']}: {rows[-1]['score']}", file=sys.stderr)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"format": "kvpress.peer", "model": args.model, "rows": rows}, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
