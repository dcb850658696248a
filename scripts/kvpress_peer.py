"""kvpress presses on the package's retrieval tasks: peer rows for ``scissorhands tasks``.

kvpress (NVIDIA, ``pip install kvpress==0.5.5``) pins ``transformers<5.3``, which this
package's ``[hf]`` extra does not allow, so it runs in a separate virtual environment
and is no dependency of the package::

    python -m venv .kvpress-venv
    .kvpress-venv/bin/pip install torch==2.13.0  # the CPU build, pinned as the README installs it
    .kvpress-venv/bin/pip install kvpress==0.5.5 cffi   # cffi: this package's C core, imported for its tasks
    python -c "from scissorhands import hf; m, t = hf.load_model(progress=False); \\
        m.save_pretrained('smollm2-ckpt'); t.save_pretrained('smollm2-ckpt')"   # in the package's environment
    PYTHONPATH=src HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 .kvpress-venv/bin/python scripts/kvpress_peer.py \\
        --model smollm2-ckpt --tasks sh_fact_once,sh_prose_needle --lengths 512 --budgets 1/4 1/2 \\
        --samples 10 --json kvpress.json

(``python setup.py build_ext --inplace`` first, so that ``src`` holds the C core.)  The
prompts are the package's own (:func:`scissorhands.commands.retrieval.data.generate`, the same
seed and tokenizer, so the same samples and the same text as ``scissorhands tasks``):
kvpress's pipeline renders the chat template around a context and appends a question,
the template's assistant header and the answer's start; the script splits the package's
prompt there and checks that the pipeline's text is the package's prompt, character for
character (it stops otherwise).  Only the single-turn tasks run (``sh_later_turn``'s two
user turns do not fit the pipeline's one), and only with a chat template.

Where the prompt is split (``--question``):

* ``compressed`` (default): the question is part of the compressed context, so the
  press's scores see it, as the package's caches read the whole prompt under their
  budget; only the template's assistant header and the answer's start (about 15
  tokens) are read after the compression;
* ``after``: kvpress's own convention: the document is compressed, the question read
  after it, uncompressed.

The budget is the package's, ``int(fraction * length)`` positions, and what it counts
is ``--budget-of``: ``prompt`` (default) every prompt position the cache holds when the
answer starts, as the package's caches count it, so the press keeps the budget less the
positions read after the compression; ``compressed``: the budget kept of the
compressed part alone, the positions read after it held on top (about 16 more).
kvpress's ``compression_ratio`` is set per sample to keep exactly that many; each row
records the positions kept.  The full cache (no press) runs first,
to check that this environment answers as the package's full cache does.  Answers are
greedy, at most ``--max-new-tokens``, cut at the first newline (the tasks' ``until``).

The output is a ``scissorhands tasks --json``-like document (``format``
``kvpress.peer``) whose rows carry ``config`` = the press's name, plus the wall and CPU
seconds of the run; ``scissorhands report`` does not read it: ``--markdown`` prints its
table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from fractions import Fraction
from typing import Any

PRESSES = ("snapkv", "tova", "streaming-llm", "observed-attention", "expected-attention", "knorm")
SINGLE_TURN = ("sh_fact_once", "sh_fact_restated", "sh_prose_needle")


def make_press(name: str, ratio: float) -> Any:
    """The kvpress press of ``name`` at ``compression_ratio=ratio``."""
    import kvpress

    if name == "snapkv":
        return kvpress.SnapKVPress(compression_ratio=ratio)
    if name == "tova":
        return kvpress.TOVAPress(compression_ratio=ratio)
    if name == "streaming-llm":
        return kvpress.StreamingLLMPress(compression_ratio=ratio, n_sink=4)
    if name == "observed-attention":  # needs eager attention (--attention eager, the default)
        return kvpress.ObservedAttentionPress(compression_ratio=ratio)
    if name == "expected-attention":
        return kvpress.ExpectedAttentionPress(compression_ratio=ratio)
    if name == "knorm":
        return kvpress.KnormPress(compression_ratio=ratio)
    raise SystemExit(f"--presses: unknown press {name!r}; choose from {', '.join(PRESSES)}")


def split_prompt(sample: dict[str, Any], mode: str) -> tuple[str, str]:
    """The pipeline's ``context`` and ``question`` for ``sample`` under ``--question mode``."""
    from scissorhands.commands.retrieval.data import INTRO

    if mode == "compressed":
        return f"{INTRO}\n\n{sample['document']}\n\n{sample['question']}", ""
    return f"{INTRO}\n\n{sample['document']}\n\n", sample["question"]


def pipeline_text(tokenizer: Any, context: str, question: str, answer_prefix: str) -> tuple[str, str]:
    """The compressed text and the text read after it, as kvpress 0.5.5's pipeline renders
    them (its ``preprocess``, with a chat template)."""
    separator = "#" * (len(context) + 10)
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": context + separator}],
                                             add_generation_prompt=True, tokenize=False)
    head, suffix = rendered.split(separator)
    return head, question + suffix + answer_prefix


def ratio_for(budget: int, positions: int) -> float:
    """kvpress's ``compression_ratio`` that keeps ``budget`` of ``positions``
    (its presses keep ``int(positions * (1 - ratio))``)."""
    if budget >= positions:
        return 0.0
    return 1.0 - (budget + 0.5) / positions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--model", required=True, help="a transformers checkpoint directory")
    parser.add_argument("--tasks", default="sh_fact_once,sh_prose_needle",
                        help=f"comma-separated, of {', '.join(SINGLE_TURN)}")
    parser.add_argument("--presses", default=",".join(PRESSES))
    parser.add_argument("--lengths", type=int, nargs="+", default=[512])
    parser.add_argument("--budgets", type=Fraction, nargs="+", default=[Fraction(1, 4), Fraction(1, 2)])
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--question", choices=("compressed", "after"), default="compressed",
                        help="the question inside the compressed part (default) or read after it")
    parser.add_argument("--budget-of", choices=("prompt", "compressed"), default="prompt",
                        help="the budget counts the whole prompt (default) or the compressed part only")
    parser.add_argument("--attention", default="eager", choices=("eager", "sdpa"))
    parser.add_argument("--no-full", action="store_true", help="skip the full-cache rows")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = parser.parse_args(argv)
    tasks = [t for t in args.tasks.split(",") if t]
    for task in tasks:
        if task not in SINGLE_TURN:
            raise SystemExit(f"--tasks: {task!r} is not one of the single-turn tasks {', '.join(SINGLE_TURN)}")
    presses = [p for p in args.presses.split(",") if p]
    for name in presses:
        if name not in PRESSES:
            raise SystemExit(f"--presses: unknown press {name!r}; choose from {', '.join(PRESSES)}")
    for budget in args.budgets:
        if not 0 < budget < 1:
            raise SystemExit(f"--budgets: {budget} is not a fraction of the length in (0, 1)")

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import kvpress
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, pipeline

    from scissorhands.commands.retrieval.data import generate, score

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    wall, cpu = time.perf_counter(), time.process_time()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if not getattr(tokenizer, "chat_template", None):
        raise SystemExit(f"--model {args.model}: its tokenizer has no chat template; the pipeline's plain-text "
                         "rendering differs from the package's prompts")
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation=args.attention)
    model.eval()
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer, device="cpu")
    runs: list[tuple[str, Fraction | None]] = [] if args.no_full else [("full", None)]
    runs += [(p, b) for b in args.budgets for p in presses]
    rows = []
    with torch.inference_mode():
        for task in tasks:
            for length in args.lengths:
                for sample in generate(task, tokenizer, [length], args.samples, args.seed):
                    context, question = split_prompt(sample, args.question)
                    head, tail = pipeline_text(tokenizer, context, question, sample["answer_start"])
                    if head + tail != sample["input"]:
                        raise SystemExit(f"{task} #{sample['index']}: the pipeline's prompt is not the package's "
                                         f"({len(head + tail)} against {len(sample['input'])} characters)")
                    compressed = len(tokenizer.encode(head, add_special_tokens=False))
                    after = len(tokenizer.encode(tail, add_special_tokens=False))
                    for name, fraction in runs:
                        budget = None if fraction is None else int(fraction * length)
                        keep = None if budget is None else budget - (after if args.budget_of == "prompt" else 0)
                        if keep is not None and keep < 1:
                            raise SystemExit(f"--budgets {fraction}: {budget} positions leave none for the "
                                             f"context after the {after} read after it")
                        press = None if keep is None else make_press(name, ratio_for(keep, compressed))
                        cache = DynamicCache()
                        out = pipe(context, question=question, answer_prefix=sample["answer_start"], press=press,
                                   max_new_tokens=args.max_new_tokens, cache=cache)
                        answer = out["answer"].split("\n")[0]
                        rows.append({"task": task, "length": length, "config": name,
                                     "fraction": None if fraction is None else str(fraction), "budget": budget,
                                     "index": sample["index"], "depth": sample["depth"],
                                     "mentions": sample["mentions"],
                                     "prompt_tokens": sample["length"],
                                     "package_prompt_tokens": len(tokenizer(sample["input"]).input_ids),
                                     "compressed_tokens": compressed, "after_tokens": after,
                                     "kept": cache.get_seq_length(), "answer": sample["outputs"],
                                     "response": answer, "score": score(sample, answer)})
                        print(f"{task} {length} {name} {fraction or ''} #{sample['index']} kept "
                              f"{rows[-1]['kept']}/{compressed}: {rows[-1]['score']} {answer[:40]!r}",
                              file=sys.stderr, flush=True)
    seconds = {"wall": round(time.perf_counter() - wall, 1), "cpu": round(time.process_time() - cpu, 1)}
    print(format_rows(rows, args.markdown))
    print(f"{len(rows)} answers: {seconds['wall']} s wall, {seconds['cpu']} s CPU", file=sys.stderr)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"format": "kvpress.peer", "version": 1, "model": os.path.basename(os.path.normpath(args.model)),
                       "kvpress": getattr(kvpress, "__version__", "0.5.5"), "transformers": transformers.__version__,
                       "torch": torch.__version__, "question": args.question, "budget_of": args.budget_of,
                       "attention": args.attention,
                       "seed": args.seed, "max_new_tokens": args.max_new_tokens, "seconds": seconds,
                       "rows": rows}, handle, indent=1)
    return 0


def format_rows(rows: list[dict[str, Any]], markdown: bool = False) -> str:
    """Accuracy per press (a row) and task x budget (a column), the full cache first;
    each cell the accuracy and (in brackets) its share of the full cache's."""
    cells: dict[tuple[Any, ...], list[float]] = {}
    for row in rows:
        cells.setdefault((row["config"], row["task"], row["length"], row["fraction"]), []).append(row["score"])
    columns = sorted({(r["task"], r["length"], r["fraction"]) for r in rows if r["fraction"] is not None},
                     key=lambda c: (c[0], c[1], Fraction(c[2])))
    configs = list(dict.fromkeys(r["config"] for r in rows))
    out = [["press", *(f"{t} {n} @ {f}" for t, n, f in columns)]]
    if "full" in configs:
        out.append(["full", *(_mean(cells.get(("full", t, n, None))) for t, n, _ in columns)])
    for config in (c for c in configs if c != "full"):
        line = [config]
        for task, length, fraction in columns:
            scores = cells.get((config, task, length, fraction))
            full = cells.get(("full", task, length, None))
            if not scores:
                line.append("")
                continue
            accuracy = sum(scores) / len(scores)
            share = (f" ({100 * accuracy / (sum(full) / len(full)):.0f}%)"
                     if full and sum(full) / len(full) >= 0.5 else "")
            line.append(f"{accuracy:.2f}{share}")
        out.append(line)
    if markdown:
        return "\n".join(["| " + " | ".join(out[0]) + " |", "|" + "---|" * len(out[0]),
                          *("| " + " | ".join(r) + " |" for r in out[1:])])
    widths = [max(len(r[i]) for r in out) for i in range(len(out[0]))]
    return "\n".join("  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip() for r in out)


def _mean(scores: list[float] | None) -> str:
    return "" if not scores else f"{sum(scores) / len(scores):.2f} (n={len(scores)})"


if __name__ == "__main__":
    raise SystemExit(main())
