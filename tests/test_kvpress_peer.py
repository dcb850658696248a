"""``scripts/kvpress_peer.py`` without kvpress: its prompts are the package's, character
for character, its compression ratio keeps exactly the package's budget, and bad
arguments fail before anything loads."""

from __future__ import annotations

import importlib.util
import os

import pytest

pytest.importorskip("transformers", reason="transformers is not installed (pip install .[hf])")

from conftest import chat_bpe_tokenizer

from scissorhands.commands.retrieval import data

SCRIPT = os.path.join(os.path.dirname(__file__), os.pardir, "scripts", "kvpress_peer.py")


@pytest.fixture(scope="module")
def peer():
    """The script, imported as a module."""
    spec = importlib.util.spec_from_file_location("kvpress_peer", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tokenizer():
    """A byte-level BPE tokenizer trained on the built-in text, with a chat template."""
    return chat_bpe_tokenizer(400, 60_000)


@pytest.mark.parametrize("mode", ["compressed", "after"])
@pytest.mark.parametrize("task", ["sh_fact_once", "sh_fact_restated", "sh_prose_needle"])
def test_the_pipeline_prompt_is_the_package_prompt(peer, tokenizer, task, mode):
    """The pipeline's compressed text plus what it reads after is the package's prompt, for both splits."""
    for sample in data.generate(task, tokenizer, [512], 3):
        context, question = peer.split_prompt(sample, mode)
        head, tail = peer.pipeline_text(tokenizer, context, question, sample["answer_start"])
        assert head + tail == sample["input"]
        assert (sample["question"] in head) == (mode == "compressed")


def test_the_ratio_keeps_exactly_the_budget(peer):
    """kvpress keeps int(n * (1 - ratio)) positions: the script's ratio makes that the budget, never more than n."""
    for positions in range(1, 700, 7):
        for budget in (1, 16, 64, 128, 256, 400):
            kept = int(positions * (1 - peer.ratio_for(budget, positions)))
            assert kept == min(budget, positions)


@pytest.mark.parametrize("argv, flag", [(["--model", "x", "--tasks", "sh_later_turn"], "--tasks"),
                                        (["--model", "x", "--budgets", "3/2"], "--budgets")])
def test_bad_arguments_fail_before_loading(peer, argv, flag):
    """A multi-turn task or a budget outside (0, 1) stops the script naming the flag, before kvpress is imported."""
    with pytest.raises(SystemExit, match=flag):
        peer.main(argv)
