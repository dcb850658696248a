"""A question in a later ``generate`` call, after its document was decided: what a chat meets.

``sh_later_turn`` (``python -m scissorhands tasks``) renders its two turns as one prompt, so
the question is read before the prompt's end and prompt-aware eviction sees it.  A chat
does not: the document is one prompt, the model answers it, and the question comes in the
next call, after the cache has already decided what to keep.  This script runs that, on the
same samples (``scissorhands.commands.retrieval.data``, same seed), with the model's own ``generate``
twice on one cache, as ``examples/chat.py`` does:

1. the document turn (system prompt, the user's document) -> the model's reply (greedy,
   ``--reply-tokens``);
2. the question turn after it -> the answer (greedy, 16 tokens), scored as the tasks are.

Configurations: ``full``; ``recommended`` at ``--fraction`` of the length (the
recommended recent window 0.75 and 4 sinks, prompt-aware); ``archive`` and
``archive-int8``: the same with the recall tier (``archive="float32"``/``"int8"``: what
turn 1 evicted comes back when turn 2's question asks for it); ``reread``: the same
without an archive, turn 2's whole conversation read into a fresh cache (the re-read the
recall tier stands in for); and ``pinned``: the same
policy with the first turn's tokens pinned (``pins=[(0, turn)]``), a recent window of
16, and a budget of the pinned tokens plus ``--room``: what it costs to keep a document for
later questions.  Prints a Markdown table and the most positions held::

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/later_turn.py --samples 10
"""

from __future__ import annotations

import argparse
import time
from fractions import Fraction
from typing import Any


def _ids(tokenizer: Any, messages: list[dict[str, str]], answer_start: str = "") -> Any:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + answer_start
    return tokenizer(text, return_tensors="pt").input_ids


def run(model: Any, tokenizer: Any, sample: dict[str, Any], config: str, fraction: Fraction, room: int,
        reply_tokens: int) -> tuple[float, str, int]:
    """One sample through two ``generate`` calls on one cache; returns its score, the
    answer and the most positions any (layer, KV head) held."""
    import torch

    from scissorhands.commands.retrieval.data import INTRO, score
    from scissorhands.hf import EvictingCache

    turn1 = [{"role": "user", "content": f"{INTRO}\n\n{sample['document']}"}]
    first = _ids(tokenizer, turn1)
    if config == "full":
        cache = EvictingCache.from_model(model, "full", budget=None)
    elif config == "pinned":
        pinned = int(first.shape[1])
        cache = EvictingCache.from_model(model, "scissorhands", budget=pinned + room, recent_window=16, sinks=4,
                                         prompt_aware=True, pins=[(0, pinned)])
    else:
        budget = int(sample["max_length"] * fraction)
        archive = {"archive": "float32", "archive-int8": "int8"}.get(config)
        cache = EvictingCache.from_model(model, "scissorhands", budget=budget, recent_window=0.75, sinks=4,
                                         prompt_aware=True, archive=archive)
    with torch.no_grad():
        out = model.generate(first, attention_mask=torch.ones_like(first), cache=cache,
                             max_new_tokens=reply_tokens, do_sample=False)
        reply = tokenizer.decode(out[0, first.shape[1]:], skip_special_tokens=True)
        turn2 = [*turn1, {"role": "assistant", "content": reply}, {"role": "user", "content": sample["question"]}]
        second = _ids(tokenizer, turn2, sample["answer_start"])
        if config == "reread":  # the whole conversation as one prompt into a fresh cache
            cache = EvictingCache.from_model(model, "scissorhands", budget=budget, recent_window=0.75, sinks=4,
                                             prompt_aware=True)
        out = model.generate(second, attention_mask=torch.ones_like(second), cache=cache, max_new_tokens=16,
                             do_sample=False)
    answer = tokenizer.decode(out[0, second.shape[1]:], skip_special_tokens=True)
    return score(sample, answer), answer, int(cache.held_counts().max())


CONFIGS = ("full", "recommended", "archive", "archive-int8", "reread", "pinned")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1234, help="the samples' seed (default: 1234, the tasks' own)")
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--fraction", type=Fraction, default=Fraction(1, 4))
    parser.add_argument("--room", type=int, default=48, help="pinned: budget = pinned tokens + this")
    parser.add_argument("--reply-tokens", type=int, default=24)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS,
                        help="the configurations to run, in order (default: all)")
    args = parser.parse_args()

    from scissorhands.commands.retrieval.data import generate
    from scissorhands.hf import load_model

    model, tokenizer = load_model(progress=False)
    samples = generate("sh_later_turn", tokenizer, [args.length], args.samples, seed=args.seed)
    print(f"| configuration | right (of {len(samples)}) | most held | seconds |\n|---|---|---|---|")
    for config in args.configs:
        start = time.perf_counter()
        results = [run(model, tokenizer, s, config, args.fraction, args.room, args.reply_tokens) for s in samples]
        right = sum(r[0] for r in results)
        print(f"| {config} | {right:g} | {max(r[2] for r in results)} | {time.perf_counter() - start:.0f} |",
              flush=True)


if __name__ == "__main__":
    main()
