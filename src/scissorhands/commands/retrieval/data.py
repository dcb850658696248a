"""The package's own retrieval tasks, generated offline from a seed: what RULER lacks.

Each sample hides a *fact* -- ``The special magic number for crimson-otter is
4829137.`` -- in real prose (:func:`scissorhands.commands.evaluate.default_text`, Python's own
documentation, shipped with every CPython), and asks for it at the end; the score is
whether the answer holds the number (RULER's ``string_match_all``).  Four tasks:

``sh_later_turn``
    The document (the fact at a depth of 0, 25, 50, 75 or 100%, in turn) in one user
    turn, an assistant reply, the question in the next user turn (SCBench's multi-turn
    setting, Li et al., 2024, arXiv 2412.10319).
``sh_fact_once`` / ``sh_fact_restated``
    The same samples (same prose, key and number) with the fact stated once, or stated
    at the same place and restated three more times, all in the first 70% of the
    document: the seed's contrast between a one-off fact and a restated one.
``sh_prose_needle``
    One fact at a depth of the document (0, 25, 50, 75 or 100%, in turn), asked at the
    end: needle-in-a-haystack in real prose, not in repeated filler.

Lengths are RULER's: a sample of length ``L`` has a prompt of at most ``L - 128`` tokens
(RULER keeps 128 for the answer), filled with whole sentences to close to that.  With a
chat template the prompt is the tokenizer's chat (the ``tokenizer`` given), else plain
text with ``User:``/``Assistant:`` turns; either way it ends with the answer's start
(``The special magic number for crimson-otter is``), so the answer is the number.

The generators take lm-eval's ``--metadata`` keys: ``max_seq_lengths`` (a list),
``tokenizer`` (a directory or name ``AutoTokenizer`` loads offline; ``pretrained`` is
tried next, as RULER does), ``num_samples`` (per length, default 50) and ``seed``
(default 1234).  The same seed gives the same samples on every machine with the same
Python (whose documentation is the prose) and tokenizer.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from scissorhands.errors import InvalidInputError

__all__ = ["ANSWER_ROOM", "DEPTHS", "GENERATORS", "generate", "score"]

#: Tokens of each length kept for the answer (RULER's ``tokens_to_generate``).
ANSWER_ROOM = 128
#: The needle depths of ``sh_prose_needle``, in turn over the samples (fractions of the document).
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
#: Where ``sh_fact_once`` states its fact, in turn; ``sh_fact_restated`` restates it at
#: ``RESTATE_STEP`` intervals after that.
ONCE_DEPTHS = (0.0, 0.1, 0.2, 0.3)
RESTATE_STEP = 0.13
RESTATEMENTS = 4
DEFAULT_SAMPLES = 50
#: The most sentences of prose one document takes (about 35,000 tokens: lengths beyond that are not filled).
_MAX_SENTENCES = 1024
DEFAULT_SEED = 1234

_ADJECTIVES = ("crimson", "silent", "amber", "hollow", "brisk", "gentle", "copper", "frozen", "lucky", "velvet",
               "rapid", "misty", "golden", "quiet", "scarlet", "humble", "bright", "wild", "rusty", "pale")
_NOUNS = ("otter", "lantern", "harbor", "falcon", "meadow", "anchor", "violin", "glacier", "pepper", "compass",
          "orchid", "badger", "canyon", "marble", "willow", "comet", "thistle", "beacon", "walrus", "saddle")
_INTRO = "Read the document below carefully; I will ask you about it afterwards."
#: The first words of every document prompt (also the peer script's context).
INTRO = _INTRO
_REPLY = "I have read the document carefully. What would you like to know about it?"


def _fact(key: str, value: str) -> str:
    return f"The special magic number for {key} is {value}."


def _question(key: str) -> str:
    return f"What is the special magic number for {key} mentioned in the document?"


def _answer_start(key: str) -> str:
    return f"The special magic number for {key} is"


@functools.lru_cache(maxsize=1)
def _sentences() -> tuple[str, ...]:
    """The prose as sentences: the built-in text, whitespace folded, split after . ! ?"""
    from ..evaluate import default_text

    text = re.sub(r"\s+", " ", default_text())
    return tuple(s for s in re.split(r"(?<=[.!?]) (?=[A-Z])", text) if 20 <= len(s) <= 400)


def _render(tokenizer: Any, turns: Sequence[tuple[str, str]], answer_start: str) -> str:
    """The prompt: the chat template when the tokenizer has one, else plain turns."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": role, "content": content} for role, content in turns]
        chat = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return str(chat) + answer_start
    names = {"user": "User", "assistant": "Assistant"}
    return "".join(f"{names[role]}: {content}\n\n" for role, content in turns) + f"Assistant: {answer_start}"


def _document(sentences: Sequence[str], facts: Sequence[tuple[int, str]]) -> str:
    """The sentences with each fact inserted before the sentence of its index (at the
    end for the index ``len(sentences)``); facts at one index keep their order."""
    out: list[str] = []
    for i in range(len(sentences) + 1):
        out.extend(fact for at, fact in facts if at == i)
        if i < len(sentences):
            out.append(sentences[i])
    return " ".join(out)


def _sample(task: str, index: int, length: int, tokenizer: Any, rng: random.Random) -> dict[str, Any]:
    """One sample of ``task`` at ``length`` (the random draws are the same for every task,
    so ``sh_fact_once`` and ``sh_fact_restated`` share prose, key and number)."""
    pool = _sentences()
    start = rng.randrange(len(pool) - _MAX_SENTENCES)
    key = f"{rng.choice(_ADJECTIVES)}-{rng.choice(_NOUNS)}"
    value = str(rng.randrange(1_000_000, 10_000_000))
    fact = _fact(key, value)
    if task == "sh_prose_needle":
        depths: tuple[float, ...] = (DEPTHS[index % len(DEPTHS)],)
    elif task == "sh_fact_restated":
        first = ONCE_DEPTHS[index % len(ONCE_DEPTHS)]
        depths = tuple(first + RESTATE_STEP * j for j in range(RESTATEMENTS))
    else:
        depths = (ONCE_DEPTHS[index % len(ONCE_DEPTHS)],) if task == "sh_fact_once" else (DEPTHS[index % len(DEPTHS)],)

    def document_of(n: int) -> str:
        return _document(pool[start:start + n], [(min(round(d * n), n), fact) for d in depths])

    def prompt(n: int) -> str:
        document = document_of(n)
        if task == "sh_later_turn":
            turns = [("user", f"{_INTRO}\n\n{document}"), ("assistant", _REPLY), ("user", _question(key))]
        else:
            turns = [("user", f"{_INTRO}\n\n{document}\n\n{_question(key)}")]
        return _render(tokenizer, turns, _answer_start(key))

    limit = length - ANSWER_ROOM
    if _count(tokenizer, prompt(0)) > limit:
        raise InvalidInputError(f"length {length} leaves no room for a document (the prompt alone is longer "
                                f"than {limit} tokens); use a longer length")
    low, high = 0, 1
    while high <= _MAX_SENTENCES and _count(tokenizer, prompt(high)) <= limit:  # the most sentences that fit
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if _count(tokenizer, prompt(mid)) <= limit else (low, mid)
    text = prompt(low)
    return {"index": index, "input": text, "outputs": [value], "key": key, "depth": depths[0],
            "document": document_of(low), "question": _question(key), "answer_start": _answer_start(key),
            "mentions": len(depths), "max_length": length, "length": _count(tokenizer, text) + ANSWER_ROOM}


def _count(tokenizer: Any, text: str) -> int:
    return len(tokenizer(text).input_ids)


def generate(task: str, tokenizer: Any, lengths: Sequence[int], num_samples: int = DEFAULT_SAMPLES,
             seed: int = DEFAULT_SEED) -> list[dict[str, Any]]:
    """Every sample of ``task`` at every length, in order (length by length).

    Parameters
    ----------
    task : str
        One of :data:`GENERATORS`.
    tokenizer : transformers tokenizer
        Sizes the prompts and renders the chat template.
    lengths : sequence of int
        RULER's lengths: prompt plus :data:`ANSWER_ROOM` tokens.
    num_samples : int, default 50
    seed : int, default 1234
        Sample ``i`` at length ``L`` draws from ``random.Random(f"{seed}:{L}:{i}")``.

    Returns
    -------
    list of dict
        ``input`` (the prompt), ``outputs`` (the number, in a list), ``key``, ``depth``
        (of the first statement, a fraction of the document), ``mentions``,
        ``max_length``, ``length``, ``index``, and the prompt's parts: ``document``,
        ``question``, ``answer_start`` (for a peer that compresses the context before
        the question, ``scripts/kvpress_peer.py``).

    Raises
    ------
    InvalidInputError
        An unknown task, no length, a length too short for a document, or a count below 1.
    """
    if task not in GENERATORS:
        raise InvalidInputError(f"unknown task {task!r}; known: {', '.join(GENERATORS)}")
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise InvalidInputError(f"num_samples must be a positive integer, got {num_samples!r}")
    if not lengths:
        raise InvalidInputError("max_seq_lengths names no length")
    out = []
    for length in lengths:
        if isinstance(length, bool) or not isinstance(length, int) or length <= ANSWER_ROOM:
            raise InvalidInputError(f"each length must be an integer above {ANSWER_ROOM}, got {length!r}")
        for i in range(num_samples):
            out.append(_sample(task, i, length, tokenizer, random.Random(f"{seed}:{length}:{i}")))
    return out


def score(doc: Mapping[str, Any], prediction: str) -> float:
    """The share of the sample's answers found in the prediction, case-insensitive
    (RULER's ``string_match_all`` for one sample)."""
    answers = list(doc["outputs"])
    return sum(a.lower() in prediction.strip().lower() for a in answers) / len(answers)


#: The package's tasks, by lm-eval task name.
GENERATORS: tuple[str, ...] = ("sh_later_turn", "sh_fact_once", "sh_fact_restated", "sh_prose_needle")


def from_metadata(task: str) -> Callable[..., Any]:
    """lm-eval's ``custom_dataset`` for ``task``: it is called with the task's metadata
    (``--metadata`` and ``--model_args``) and returns ``{"test": datasets.Dataset}``."""

    def build(**metadata: Any) -> dict[str, Any]:
        import datasets
        from transformers import AutoTokenizer

        name = next((metadata[k] for k in ("tokenizer", "pretrained") if isinstance(metadata.get(k), str)), None)
        if name is None:
            raise InvalidInputError(f"{task} sizes its prompts with a tokenizer: give one with --metadata "
                                    "'{\"tokenizer\": DIR}' or --model_args tokenizer=DIR")
        tokenizer = AutoTokenizer.from_pretrained(name)
        lengths = list(metadata.get("max_seq_lengths") or [1024])
        rows = generate(task, tokenizer, lengths, int(metadata.get("num_samples", DEFAULT_SAMPLES)),
                        int(metadata.get("seed", DEFAULT_SEED)))
        return {"test": datasets.Dataset.from_list(rows, split=datasets.Split.TEST)}

    build.__name__ = task
    return build
