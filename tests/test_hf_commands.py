"""The ``generate`` and ``longctx`` commands, end to end, on a small random Llama saved
with SmolLM2's tokenizer (a checkpoint directory, as ``--model`` takes one): the text
``generate`` streams is exactly the stock cache's while nothing is evicted, the prompt
comes from an argument, a file or stdin, the summary line says what was held; a
``longctx`` run measures every length, holds the budget, and ``report`` merges its parts.
"""

from __future__ import annotations

import io
import json
import re

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
pytest.importorskip("transformers", reason="transformers is not installed (pip install .[hf])")

from scissorhands import hf  # noqa: E402
from scissorhands.generate import GenerateRequest, run_generate  # noqa: E402
from scissorhands.longctx import LongContextRequest, run_longctx  # noqa: E402
from scissorhands.report import run_report  # noqa: E402

pytestmark = pytest.mark.hf

PROMPT = "The three primary colours are"
SUMMARY = re.compile(
    r"^(\d+) tokens in [\d.]+ s: the first after [\d.]+ s \(prompt of (\d+) tokens\), then ([\d.]+ tokens/s|-); "
    r"KV held: (\d+) of (\d+) positions per layer and KV head, [\d.]+ [KMG]?B against a full cache's "
    r"[\d.]+ [KMG]?B; peak RSS [\d.]+ [KMG]?B$")


@pytest.fixture(scope="module")
def tiny_model(smollm2, tmp_path_factory):
    """A 2-layer random Llama (GQA) with SmolLM2's tokenizer and chat template, saved."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    _, tokenizer = smollm2
    path = tmp_path_factory.mktemp("tiny-llama")
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=96,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def _stock_text(path, prompt, chat=False, max_new_tokens=12):
    """What the model's own generate with transformers' DynamicCache produces."""
    model, tokenizer = hf.load_model(path, progress=False)
    if chat:
        inputs = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                               return_tensors="pt", return_dict=True)
    else:
        inputs = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.eos_token_id)
    return tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)


def _generate(capsys, **kwargs):
    stdin = io.StringIO(kwargs.pop("stdin", ""))
    stdout = io.StringIO()
    request = GenerateRequest(**{"max_new_tokens": 12, "progress": False, **kwargs})
    status = run_generate(request, stdin=stdin, stdout=stdout)
    return status, stdout.getvalue(), capsys.readouterr().err


@pytest.mark.parametrize("source", ["argument", "file", "stdin"])
def test_generate_streams_the_stock_caches_text_without_eviction(tiny_model, tmp_path, capsys, source):
    """Budget above the total: the streamed text is the stock cache's, from any prompt source."""
    kwargs = {"argument": dict(prompt=PROMPT), "stdin": dict(stdin=PROMPT)}.get(source)
    if kwargs is None:
        (tmp_path / "prompt.txt").write_text(PROMPT, encoding="utf-8")
        kwargs = dict(file=str(tmp_path / "prompt.txt"))
    status, text, err = _generate(capsys, model=tiny_model, budget=64, **kwargs)
    assert status == 0
    assert text.rstrip("\n") == _stock_text(tiny_model, PROMPT)
    summary = SUMMARY.match(err.strip().splitlines()[-1])
    assert summary is not None, err
    new, prompt, _, held, seen = (summary.group(i) for i in range(1, 6))
    assert int(held) == int(seen) == int(prompt) + int(new) - 1


def test_generate_with_the_chat_template_equals_the_stock_cache(tiny_model, capsys):
    status, text, _ = _generate(capsys, model=tiny_model, budget=96, prompt=PROMPT, chat=True)
    assert status == 0
    assert text.rstrip("\n") == _stock_text(tiny_model, PROMPT, chat=True)


def test_generate_holds_the_budget_through_a_long_prompt(tiny_model, capsys):
    """A prompt longer than the budget is consumed in chunks, evicting after each."""
    status, _, err = _generate(capsys, model=tiny_model, budget=20, values={"recent_window": 0.75, "sinks": 4},
                               prompt=" ".join(["colour"] * 40), prefill_chunk=8, max_new_tokens=6)
    assert status == 0
    summary = SUMMARY.match(err.strip().splitlines()[-1])
    assert summary is not None, err
    assert int(summary.group(4)) == 20 and int(summary.group(5)) > 40


def test_generate_shows_the_progress_of_a_long_prompt(tiny_model, capsys):
    """A prompt longer than one chunk gets a progress bar on stderr, which reaches the
    prompt's length; the text is unchanged by it."""
    prompt = " ".join(["colour"] * 40)
    kwargs = dict(model=tiny_model, budget=20, values={"recent_window": 0.75, "sinks": 4}, prompt=prompt,
                  prefill_chunk=8, max_new_tokens=6)
    _, quiet_text, _ = _generate(capsys, **kwargs)
    status, text, err = _generate(capsys, progress=True, **kwargs)
    assert status == 0 and text == quiet_text
    summary = SUMMARY.match(err.strip().splitlines()[-1])
    assert summary is not None, err
    prompt_tokens = summary.group(2)
    assert "prompt: 100%" in err and f"{prompt_tokens}/{prompt_tokens}" in err, err


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(prompt="  "), "the prompt is empty"),
    (dict(file="missing-prompt.txt"), "missing-prompt.txt"),
    (dict(prompt="x", model="missing-model-dir"), "--model missing-model-dir"),
    (dict(prompt="x", policy="streaming-llm", recent_window=3), "streaming-llm takes no --recent-window"),
    (dict(prompt="x", budget=0), "budget"),
    (dict(prompt="x", sample=True, temperature=0.0), "--temperature must be a positive number, got 0.0"),
    (dict(prompt="x", sample=True, top_p=2.0), "--top-p must be in (0, 1], got 2.0"),
    (dict(prompt="x", temperature=0.7), "--temperature needs --sample"),
    (dict(prompt="x", budget=64, recent_window=64), "--recent-window must be in [0, 63], got 64 (--budget 64)"),
])
def test_generate_refuses_bad_arguments_before_loading(monkeypatch, capsys, kwargs, message):
    def refuse(*args, **kw):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(hf, "load_model", refuse)
    values = {k: kwargs.pop(k) for k in ("recent_window",) if k in kwargs}
    status, text, err = _generate(capsys, values=values, **kwargs)
    assert status == 2 and text == ""
    assert message in err


def test_longctx_measures_every_length_and_report_merges_its_parts(tiny_model, tmp_path, capsys):
    """Two parts (the full cache; a policy in both position modes), merged by report. The
    full cache stops at the trained context (96 positions here) with a note."""
    text = tmp_path / "long.txt"
    text.write_text(" ".join(f"word{i % 50}" for i in range(400)), encoding="utf-8")
    common = dict(lengths=(48, 80, 120), window=8, chunk=16, text=str(text), model=tiny_model, progress=False)
    full = tmp_path / "full.json"
    assert run_longctx(LongContextRequest(policies=("full",), json_path=str(full), **common)) == 0
    part = tmp_path / "policy.json"
    assert run_longctx(LongContextRequest(policies=("scissorhands",), budgets=(24,),
                                          values={"recent_window": [0.75], "sinks": [4]},
                                          positions=("original", "cache"), json_path=str(part), **common)) == 0
    out = capsys.readouterr().out
    assert "trained context 96" in out

    full_doc = json.loads(full.read_text())
    (full_run,) = full_doc["results"]
    assert [r["length"] for r in full_run["rows"]] == [48, 80]  # 120 exceeds the trained context
    assert [r["kv_positions"] for r in full_run["rows"]] == [48, 80]
    runs = json.loads(part.read_text())["results"]
    assert [r["positions"] for r in runs] == ["original", "cache"]
    for run in runs:
        assert [r["length"] for r in run["rows"]] == [48, 80, 120]
        assert all(r["kv_positions"] == 24 for r in run["rows"])
        assert all(r["perplexity"] > 1 and r["ms_per_step"] > 0 for r in run["rows"])
    assert runs[0]["rows"][0]["rerotate_ms_per_step"] == 0 < runs[1]["rows"][0]["rerotate_ms_per_step"]

    assert run_report([str(full), str(part)]) == 0
    table = capsys.readouterr().out
    assert table.count("full cache") == 2 and table.count("positions=cache") == 3
