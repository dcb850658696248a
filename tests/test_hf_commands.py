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

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
pytest.importorskip("transformers", reason="transformers is not installed (pip install .[hf])")

from scissorhands import hf  # noqa: E402
from scissorhands.commands.generate import GenerateRequest, run_generate  # noqa: E402
from scissorhands.commands.longctx import LongContextRequest, run_longctx  # noqa: E402
from scissorhands.commands.report import run_report  # noqa: E402
from scissorhands.errors import ScissorhandsError  # noqa: E402

pytestmark = pytest.mark.hf

PROMPT = "The three primary colours are"
SUMMARY = re.compile(
    r"^(\d+) tokens? in [\d.]+ s: the first after [\d.]+ s \(prompt of (\d+) tokens?\), then ([\d.]+ tokens/s|-); "
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
    status, text, err = _generate(capsys, model=tiny_model, budget=64, chat=False, **kwargs)
    assert status == 0
    assert text.rstrip("\n") == _stock_text(tiny_model, PROMPT)
    summary = SUMMARY.match(err.strip().splitlines()[-1])
    assert summary is not None, err
    new, prompt, _, held, seen = (summary.group(i) for i in range(1, 6))
    assert int(held) == int(seen) == int(prompt) + int(new) - 1


def test_generate_takes_a_one_token_prompt(tiny_model, capsys):
    """``generate "hi"``: a prompt of one token streams the stock cache's text."""
    status, text, err = _generate(capsys, model=tiny_model, budget=64, prompt="hi", chat=False)
    assert status == 0, err
    summary = SUMMARY.match(err.strip().splitlines()[-1])
    assert summary is not None and summary.group(2) == "1", err
    assert text.rstrip("\n") == _stock_text(tiny_model, "hi")


def test_generate_with_the_chat_template_equals_the_stock_cache(tiny_model, capsys):
    """--chat, and the default with a tokenizer that has a chat template: the prompt as a
    user message, the stock cache's answer."""
    for chat in (True, None):
        status, text, _ = _generate(capsys, model=tiny_model, budget=96, prompt=PROMPT, chat=chat)
        assert status == 0
        assert text.rstrip("\n") == _stock_text(tiny_model, PROMPT, chat=True)


@pytest.fixture(scope="module")
def tiny_model_without_template(tiny_model, tmp_path_factory):
    """The tiny model with a tokenizer that has no chat template (a base model's)."""
    import shutil

    path = tmp_path_factory.mktemp("tiny-base")
    shutil.copytree(tiny_model, path, dirs_exist_ok=True)
    (path / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return str(path)


def test_generate_without_a_chat_template_sends_the_prompt_as_written(tiny_model_without_template, capsys):
    """A tokenizer without a chat template: the default is the prompt as written (the
    stock cache's text); --chat is refused, under generate's name and usage."""
    status, text, _ = _generate(capsys, model=tiny_model_without_template, budget=64, prompt=PROMPT)
    assert status == 0
    assert text.rstrip("\n") == _stock_text(tiny_model_without_template, PROMPT)
    status = run_generate(GenerateRequest(prompt=PROMPT, model=tiny_model_without_template, chat=True,
                                          progress=False), usage="usage: scissorhands generate [-h]\n")
    err = capsys.readouterr().err
    assert status == 2
    assert err == ("usage: scissorhands generate [-h]\n"
                   "scissorhands generate: error: --chat: the tokenizer has no chat template\n")


def test_generate_says_why_nothing_came(smollm2):
    """When every generated token is special (an instruct model ending its turn at
    once on a raw prompt), a note says so and what to pass; otherwise no note."""
    from scissorhands.commands.generate import _nothing_came

    _, tokenizer = smollm2
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    raw = _nothing_came(tokenizer, [end], chat=False)
    assert raw is not None and "<|im_end|>" in raw and "drop --no-chat" in raw
    assert "--no-chat to continue" in (_nothing_came(tokenizer, [end], chat=True) or "")
    assert _nothing_came(tokenizer, tokenizer("Once upon")["input_ids"], chat=False) is None


def test_generate_holds_the_budget_through_a_long_prompt(tiny_model, capsys):
    """A prompt longer than the budget is consumed in chunks, evicting after each."""
    status, _, err = _generate(capsys, model=tiny_model, budget=20, values={"recent_window": 0.75, "sinks": 4},
                               prompt=" ".join(["colour"] * 40), prefill_chunk=8, max_new_tokens=6)
    assert status == 0
    summary = SUMMARY.match(err.strip().splitlines()[-1])
    assert summary is not None, err
    assert int(summary.group(4)) == 20 and int(summary.group(5)) > 40


def test_generate_prompt_aware_equals_the_stock_cache_without_eviction(tiny_model, capsys):
    """--prompt-aware with a budget above the total: the stock cache's text."""
    status, text, err = _generate(capsys, model=tiny_model, budget=64, chat=False, prompt=PROMPT, prompt_aware=True,
                                  prefill_budget=64)
    assert status == 0, err
    assert text.rstrip("\n") == _stock_text(tiny_model, PROMPT)


def test_generate_prompt_aware_holds_the_prompt_then_the_budget(tiny_model, capsys, monkeypatch):
    """--prompt-aware on a prompt longer than the budget, read in chunks: the cache held
    the whole prompt (every chunk under the cap), evicted once at its end, and ends at
    the budget."""
    caches = []
    build = hf.EvictingCache.from_model
    monkeypatch.setattr(hf.EvictingCache, "from_model", lambda *a, **k: caches.append(build(*a, **k)) or caches[-1])
    status, _, err = _generate(capsys, model=tiny_model, budget=20, values={"recent_window": 0.75, "sinks": 4},
                               prompt=" ".join(["colour"] * 40), prefill_chunk=8, max_new_tokens=6,
                               prompt_aware=True, observation_window=4, pool_kernel=3)
    assert status == 0, err
    summary = SUMMARY.match(err.strip().splitlines()[-1])
    assert summary is not None, err
    assert int(summary.group(4)) == 20 and int(summary.group(5)) > 40
    (cache,) = caches
    assert cache.stats.prompt_ends == 1 and cache.prompt_aware.pool_kernel == 3


def test_generate_runs_the_recommendation_by_name_and_says_so(tiny_model, capsys, monkeypatch):
    """policy="recommended" builds Scissorhands rw 0.75 sinks 4 prompt-aware, and says the default budget."""
    caches = []
    build = hf.EvictingCache.from_model
    monkeypatch.setattr(hf.EvictingCache, "from_model", lambda *a, **k: caches.append(build(*a, **k)) or caches[-1])
    status, _, err = _generate(capsys, model=tiny_model, policy="recommended", budget=32, budget_defaulted=True,
                               prompt=" ".join(["colour"] * 40), prefill_chunk=8, max_new_tokens=4)
    assert status == 0, err
    assert ("configuration: recommended = --policy scissorhands --recent-window 75% --sinks 4 --prompt-aware, "
            "budget 32 (the default; --budget N to change it)") in err
    (cache,) = caches
    assert cache.configs[0].policy == "scissorhands" and cache.prompt_aware.enabled is True
    assert (cache.configs[0].options.recent_window, cache.configs[0].options.sinks) == (0.75, 4)


def test_pin_system_keeps_the_system_prompt_through_a_long_generation(tiny_model, capsys, monkeypatch):
    """--pin-system: the template's system message (and the user turn's header) is pinned
    and every row still holds it after a long prompt and answer at a small budget."""
    from scissorhands.commands.generate import system_span

    _, tokenizer = hf.load_model(tiny_model, progress=False)
    start, stop = system_span(tokenizer)
    text = tokenizer.decode(_chat_ids(tokenizer, "0")[start:stop])
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>user\n")
    caches = []
    build = hf.EvictingCache.from_model
    monkeypatch.setattr(hf.EvictingCache, "from_model", lambda *a, **k: caches.append(build(*a, **k)) or caches[-1])
    budget = stop + 12
    status, _, err = _generate(capsys, model=tiny_model, budget=budget, values={"recent_window": 4, "sinks": 1},
                               prompt=" ".join(["colour"] * 40), prefill_chunk=8, max_new_tokens=30,
                               pin_system=True)
    assert status == 0, err
    (cache,) = caches
    assert cache.pins == [(0, stop)] and cache.held_counts().max() <= budget
    for layer in cache.observed_layers:
        for h in range(cache.num_kv_heads):
            assert set(range(stop)) <= set(cache.kept_positions(layer, 0, h).tolist())


def _chat_ids(tokenizer, prompt):
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                         return_tensors="pt", return_dict=True)["input_ids"][0].tolist()


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(pin_system=True, chat=False), "--pin-system pins the chat template's system message: drop --no-chat"),
    (dict(prefill_budget=100), "--prefill-budget needs --prompt-aware"),
    (dict(prompt_aware=True, policy="streaming-llm"), "streaming-llm reads no attention"),
    (dict(prompt_aware=True, budget=128, prefill_budget=100), "--prefill-budget 100 < budget 128"),
    (dict(prompt_aware=True, budget=20, values={"recent_window": 4, "sinks": 4}, observation_window=16),
     "--observation-window 16 \\+ --sinks 4 >= budget 20"),
])
def test_generate_refuses_bad_prompt_aware_flags_before_the_model_loads(monkeypatch, capsys, kwargs, message):
    """Each bad prompt-aware flag: one error line naming it, exit 2, no model loaded."""
    monkeypatch.setattr(hf, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    status, _, err = _generate(capsys, prompt="hi", **kwargs)
    assert status == 2
    assert re.search(message, err), err


def test_generate_progress_reaches_the_end_of_a_prompt_with_a_short_last_chunk(tiny_model, capsys):
    """A prompt of five full chunks and a last one of a single token: the bar still
    reaches the prompt's length (tqdm's adaptive redraw count skipped the short last
    chunk, leaving the bar at 5/6 of it)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    words = 41
    prompt = " ".join(["colour"] * words)
    prompt_tokens = len(tokenizer(prompt)["input_ids"])
    assert prompt_tokens % 8 == 1 and prompt_tokens > 5 * 8, prompt_tokens
    status, _, err = _generate(capsys, model=tiny_model, budget=20, values={"recent_window": 0.75, "sinks": 4},
                               prompt=prompt, chat=False, prefill_chunk=8, max_new_tokens=2, progress=True)
    assert status == 0
    assert f"{prompt_tokens - 1}/{prompt_tokens}" in err and f"{prompt_tokens}/{prompt_tokens}" in err, err


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
    (dict(prompt="x", budget=64, recent_window=64),
     "--recent-window must be below the budget (64): in [0, 63], got 64 (or a budget above 64) (--budget 64)"),
    (dict(prompt="x", policy="h2o", budget=16, recent_window=4, pool="layer", positions="cache"), "positions='cache'"),
])
def test_generate_refuses_bad_arguments_before_loading(monkeypatch, capsys, kwargs, message):
    def refuse(*args, **kw):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(hf, "load_model", refuse)
    values = {k: kwargs.pop(k) for k in ("recent_window", "pool") if k in kwargs}
    status, text, err = _generate(capsys, values=values, **kwargs)
    assert status == 2 and text == ""
    assert message in err and err.startswith("scissorhands generate: error: ") and err.count("\n") == 1, err


def test_generate_takes_a_pool_by_scope_and_checks_a_pool_of_rows_before_loading(tiny_model, monkeypatch, capsys):
    """--pool layer and model pass the pre-load check and run (the cache resolves them);
    a pool of rows that does not divide a sequence's rows (2 layers x 2 KV heads) is
    refused before the model loads, from the checkpoint's configuration."""
    for pool in ("layer", "model", 2):
        status, text, err = _generate(capsys, model=tiny_model, policy="h2o", budget=20, prompt=PROMPT,
                                      values={"recent_window": 4, "pool": pool}, chat=False)
        assert status == 0 and text, (pool, err)
    monkeypatch.setattr(hf, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    status, _, err = _generate(capsys, model=tiny_model, policy="h2o", budget=20, prompt=PROMPT,
                               values={"recent_window": 4, "pool": 3})
    assert status == 2 and "--pool must divide the rows of a sequence (2 layers x 2 KV heads = 4), got --pool=3" in err


def test_every_generate_error_prints_usage_under_one_name(tiny_model, capsys):
    """An argparse error and the command's own checks both print the usage, then one
    line under 'scissorhands generate:'."""
    from scissorhands.commands.cli import main

    for argv in (["--top-k", "0", "x"], ["--model", "missing-model-dir", "x"], ["--temperature", "0.5", "x"],
                 ["--model", tiny_model, "--policy", "h2o", "--pool", "3", "--budget", "20", "x"]):
        assert main(["generate", "--no-progress", *argv]) == 2, argv
        err = capsys.readouterr().err
        lines = err.splitlines()
        assert lines[0].startswith("usage: scissorhands generate ") and err.count("scissorhands generate: error: ") == 1
        assert lines[-1].startswith("scissorhands generate: error: ") and "scissorhands: error" not in err, err


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


# ----------------------------------------------------------------------------- eval --hindsight


def test_eval_refuses_a_bad_hindsight_window_before_loading(monkeypatch, capsys):
    """--hindsight below 1 (or not a whole number, through the API) stops before the model
    loads, naming the flag and the value."""
    from scissorhands.commands.cli import main
    from scissorhands.commands.evaluate import EvalRequest, run_eval

    monkeypatch.setattr(hf, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    for value in ("0", "-3"):
        assert main(["eval", "--no-progress", "--hindsight", value]) == 2
        assert f"argument --hindsight: {value} is below the minimum 1" in capsys.readouterr().err
    assert main(["eval", "--no-progress", "--hindsight", "x"]) == 2
    assert "argument --hindsight: 'x' is not an integer" in capsys.readouterr().err
    for value in (0, 2.5, True):
        with pytest.raises(ScissorhandsError) as refused:
            run_eval(EvalRequest(tokens=64, prompt_tokens=8, hindsight=value, progress=False))
        assert f"--hindsight must be a whole number of decode steps, at least 1, got {value!r}" in str(refused.value)
    assert main(["eval", "--no-progress", "--hindsight", "4", "--tokens", "9", "--prompt-tokens", "8",
                 "--budgets", "4"]) == 2
    assert "--hindsight 4 reads the decode steps, and --tokens 9 leaves none" in capsys.readouterr().err


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_hindsight_schedule_from_the_full_run_is_what_the_batch_holds(tiny_model, attention):
    """The full run's tapped rows are record_attention's; the scheduler fed them online
    decides what the whole array decides; a batch mixing two hindsight sequences with an
    H2O one holds, after the prompt and after every step, exactly the schedule's
    positions in every (layer, KV head)."""
    from scissorhands.hindsight import HindsightScheduler, hindsight_schedule
    from scissorhands.options import PolicyOptions

    model, _ = hf.load_model(tiny_model, progress=False, attn_implementation=attention)
    n, prompt, budgets = 40, 8, (6, 10)
    ids = [int(i) for i in np.random.default_rng(1).integers(0, model.config.vocab_size, n)]
    scheduler = HindsightScheduler(budgets, 3, prompt, n - 2)
    steps: list[np.ndarray] = []

    def sink(position, weights):
        assert position == prompt + len(steps) and weights.dtype == np.float32
        steps.append(weights.copy())
        scheduler.push(position, weights)

    (full,) = hf.evaluate_batch(model, ids, [hf.PolicyConfig("full", None)], prompt_tokens=prompt,
                                attention_sink=sink)
    assert len(steps) == n - 1 - prompt == full["decode_steps"] and full["tap_seconds"] > 0
    layers, kv = model.config.num_hidden_layers, model.config.num_key_value_heads
    recorded = hf.record_attention(model, ids, prompt_tokens=prompt).reshape(layers * kv, -1)
    for t in (prompt, n - 2):
        want = recorded[:, t * (t - 1) // 2: t * (t + 1) // 2].astype(np.float32)
        assert np.allclose(steps[t - prompt], want, atol=2e-3)
    schedules = scheduler.finish()
    dense = np.zeros((layers * kv, n - 1, n - 1), dtype=np.float32)
    for t, weights in enumerate(steps, start=prompt):
        dense[:, t, :t] = weights
    offline = hindsight_schedule(dense, budgets, 3, prompt)
    for b in budgets:
        assert np.array_equal(offline[b].step_victims, schedules[b].step_victims)
        assert np.array_equal(offline[b].prompt_victims, schedules[b].prompt_victims)

    configs = [hf.HindsightConfig.of(schedules[6]), hf.PolicyConfig("h2o", 6, PolicyOptions(recent_window=2)),
               hf.HindsightConfig.of(schedules[10])]
    cache = hf.EvictingCache(model.config, configs=configs)
    tokens = torch.tensor(ids)

    def check(position):
        for sequence, budget in ((0, 6), (2, 10)):
            held = schedules[budget].held(position)
            for layer in range(layers):
                for head in range(kv):
                    got = cache.kept_positions(layer, sequence, head).tolist()
                    assert got == held[layer * kv + head].tolist(), (position, sequence, layer, head)
        assert cache.held_counts()[:, 1].max() <= 6

    hf.prefill(model, cache, tokens[:prompt].expand(3, -1))
    check(prompt - 1)
    for t in range(prompt, n - 1):
        hf.decode_step(model, cache, tokens[t].expand(3))
        check(t)


def test_eval_hindsight_adds_a_row_per_budget_and_report_merges_it(tiny_model, tmp_path, capsys):
    """eval --hindsight 4: a hindsight row after each budget's configurations, holding the
    budget; the gap column in the table and the JSON, consistent with the perplexities;
    the plot; report's table with the hindsight row and its gap column."""
    from scissorhands.commands.evaluate import EvalRequest, run_eval
    from scissorhands.hindsight import gap_closed

    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"word{i % 37} thing{i % 11}" for i in range(200)), encoding="utf-8")
    out, plot = tmp_path / "eval.json", tmp_path / "eval.png"
    request = EvalRequest(tokens=48, prompt_tokens=8, budgets=[12, 20], policies=["streaming-llm", "h2o"],
                          values={"recent_window": [4]}, hindsight=4, text=str(text), model=tiny_model,
                          json_path=str(out), plot=str(plot), progress=False)
    assert run_eval(request) == 0
    printed = capsys.readouterr().out
    assert "6 configurations in one batch; hindsight W=4;" in printed  # 2 policies x 2 budgets + 2
    header = next(line for line in printed.splitlines() if line.startswith("policy"))
    assert header.endswith("ovh %  gap %")
    assert "note: hindsight W=4: its schedule" in printed and "gap %: the share" in printed
    document = json.loads(out.read_text())
    assert document["config"]["hindsight"] == 4
    rows = document["results"]
    assert [(r["policy"], r["budget"]) for r in rows] == [
        ("full", None), ("streaming-llm", 12), ("h2o", 12), ("hindsight", 12),
        ("streaming-llm", 20), ("h2o", 20), ("hindsight", 20)]
    for r in rows[1:]:
        assert r["kv_positions_held_max"] == r["budget"]
        streaming = next(o["perplexity"] for o in rows if o["policy"] == "streaming-llm" and o["budget"] == r["budget"])
        hindsight = next(o for o in rows if o["policy"] == "hindsight" and o["budget"] == r["budget"])
        assert r["gap_closed_percent"] == gap_closed(r["perplexity"], streaming, hindsight["perplexity"])
    hindsight_row = rows[3]
    assert hindsight_row["label"] == "W=4" and hindsight_row["hindsight_window"] == 4
    assert hindsight_row["schedule_ms_per_step"] > 0 and plot.stat().st_size > 0

    assert run_report([str(out)], markdown=True) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0] == "| configuration | text.txt @12 | gap @12 | text.txt @20 | gap @20 |"
    assert any(line.startswith("| hindsight W=4 | ") for line in table)


def test_eval_refuses_a_pool_and_a_huge_hindsight_before_loading(tiny_model, monkeypatch, capsys):
    """--pool 7 (which does not divide the checkpoint's 2 layers x 2 KV heads) and a
    --hindsight above the scheduler's limit stop before the model loads, naming the
    flag, never an internal name."""
    from scissorhands.commands.cli import main

    monkeypatch.setattr(hf, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    common = ["eval", "--model", tiny_model, "--tokens", "64", "--prompt-tokens", "8", "--budgets", "16",
              "--no-progress"]
    assert main([*common, "--policies", "h2o", "--recent-window", "4", "--pool", "7"]) == 2
    assert "--pool must divide the rows of a sequence (2 layers x 2 KV heads = 4), got --pool=7" in \
        capsys.readouterr().err
    assert main([*common, "--hindsight", str(2**31 + 1)]) == 2
    message = capsys.readouterr().err.rpartition("scissorhands eval: error: ")[2]  # after the usage
    assert f"--hindsight must be at most {2**31} decode steps, got {2**31 + 1}" in message and "window" not in message


def test_eval_checks_the_pool_right_after_loading_a_model_without_a_config_file(tiny_model, monkeypatch, capsys):
    """A model whose configuration comes only with it (a GGUF file): the pool is checked
    after it loads, before the full-cache run."""
    from scissorhands.commands import evaluate
    from scissorhands.commands.cli import main

    monkeypatch.setattr(evaluate, "_checkpoint_config", lambda model: None)
    monkeypatch.setattr(hf, "evaluate_batch", lambda *a, **k: pytest.fail("a run started"))
    assert main(["eval", "--model", tiny_model, "--tokens", "64", "--prompt-tokens", "8", "--budgets", "16",
                 "--policies", "h2o", "--recent-window", "4", "--pool", "3", "--no-progress"]) == 2
    assert "got --pool=3" in capsys.readouterr().err


def test_longctx_and_record_check_the_model_before_loading_and_before_any_part(tiny_model, monkeypatch, capsys):
    """longctx: a pool that does not divide the rows, or a pool with --positions cache,
    stops before the model loads (a checkpoint directory) or right after it, before the
    full cache's part; record: --layers beyond the checkpoint's layers before it loads."""
    from scissorhands.commands import longctx
    from scissorhands.commands.cli import main

    long = ["longctx", "--model", tiny_model, "--lengths", "48", "--window", "8", "--budgets", "24",
            "--policies", "full,h2o", "--recent-window", "4", "--no-progress"]
    real_load = hf.load_model
    monkeypatch.setattr(hf, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main([*long, "--pool", "3"]) == 2
    assert "got --pool=3" in capsys.readouterr().err
    assert main([*long, "--pool", "layer", "--positions", "cache"]) == 2
    assert "positions='cache'" in capsys.readouterr().err
    assert main(["record", "--model", tiny_model, "--layers", "2", "--no-progress"]) == 2
    assert "--layers must be in [0, 1], got [2]" in capsys.readouterr().err
    monkeypatch.setattr(hf, "load_model", real_load)
    monkeypatch.setattr(longctx, "_checkpoint_config", lambda model: None)
    monkeypatch.setattr(hf, "long_context_run", lambda *a, **k: pytest.fail("a part ran"))
    assert main([*long, "--pool", "3"]) == 2
    assert "got --pool=3" in capsys.readouterr().err


def test_the_main_job_shows_the_recommendation_beside_the_seeds_defaults(tiny_model, tmp_path, capsys):
    """eval without option flags adds the recommended row at every budget, says which row to read, prints the
    next commands, and stores the preset in the JSON."""
    from scissorhands.commands.cli import main

    out = tmp_path / "eval.json"
    assert main(["eval", "--model", tiny_model, "--tokens", "64", "--prompt-tokens", "8", "--budgets", "24", "40",
                 "--no-progress", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = [line.split()[:2] for line in printed.splitlines() if line.startswith(("recommended ", "scissorhands "))]
    said = " ".join(printed.split())  # the lines under the table wrap to the terminal
    # The seed's recent window of 32 does not fit budget 24: only the recommendation runs there.
    assert rows == [["recommended", "24"], ["scissorhands", "40"], ["recommended", "40"]]
    assert "read: row recommended at budget 40, column perplexity" in said
    assert "against streaming-llm " in said and "the seed's scissorhands rw=32 sinks=0 " in said
    assert "next: python -m scissorhands generate" in printed
    document = json.loads(out.read_text())
    assert document["config"]["presets"]["recommended"]["prompt_aware"] is True
    ours = [r for r in document["results"] if r.get("preset") == "recommended"]
    assert [(r["policy"], r["budget"], r["recent_window"], r["sinks"]) for r in ours] == [
        ("scissorhands", 24, 18, 4), ("scissorhands", 40, 30, 4)]


def test_generate_past_the_trained_context_is_refused_naming_positions_cache(tiny_model, capsys):
    """A prompt past the model's trained context (96 here) with true positions is refused with the library's error
    naming --positions cache, before generating; with --positions cache it runs."""
    prompt = " ".join(["colour"] * 100)
    status, out, err = _generate(capsys, model=tiny_model, budget=20, values={"recent_window": 0.75, "sinks": 4},
                                 prompt=prompt, prefill_chunk=8, max_new_tokens=6)
    assert status == 2 and out == ""
    assert "tokens) is past the model's trained context of 96" in err and "--positions cache" in err
    status, _, err = _generate(capsys, model=tiny_model, budget=20, values={"recent_window": 0.75, "sinks": 4},
                               prompt=prompt, prefill_chunk=8, max_new_tokens=6, positions="cache")
    assert status == 0, err


def _stock_chat(path, turns, max_new_tokens=12):
    """Each turn's answer by the model's own generate on a fresh DynamicCache, the whole conversation each turn."""
    model, tokenizer = hf.load_model(path, progress=False)
    messages, answers = [], []
    for turn in turns:
        messages.append({"role": "user", "content": turn})
        inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                               return_dict=True)
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.eos_token_id)
        answers.append(tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
        messages.append({"role": "assistant", "content": answers[-1]})
    return answers


@pytest.mark.parametrize("archive", [None, "float32"])
def test_generate_chat_turns_on_one_cache_answer_as_fresh_stock_caches(tiny_model, capsys, archive):
    """--chat-turns: without eviction every turn's answer is the stock cache's on the whole conversation."""
    turns = ["Name a colour.", "Name another one."]
    status, text, err = _generate(capsys, model=tiny_model, budget=90, prompt=turns[0], chat_turns=turns[1:],
                                  prompt_aware=True, archive=archive)
    assert status == 0, err
    first, second = _stock_chat(tiny_model, turns)
    assert text == f"{first}\n\n>>> {turns[1]}\n{second}\n"
    assert len([line for line in err.splitlines() if SUMMARY.match(line)]) == 2


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(chat_turns=["again"], chat=False), "--chat-turns renders the conversation through the chat template"),
    (dict(chat_turns=["  "]), "--chat-turns: turn 2 is empty"),
    (dict(policy="scissorhands", archive="int8"), "--archive int8 needs --prompt-aware"),
])
def test_generate_refuses_chat_turns_and_archives_it_cannot_run(tiny_model, capsys, kwargs, message, monkeypatch):
    """Refused before the model loads, naming the flag."""
    monkeypatch.setattr(hf, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    status, _, err = _generate(capsys, model=tiny_model, budget=64, prompt=PROMPT, **kwargs)
    assert status == 2 and message in err


def test_eval_refuses_a_text_past_the_trained_context_before_any_run():
    """--tokens past the model's max_position_embeddings is refused once the model's
    config is known, before the batch runs, naming the command that measures long texts."""
    from types import SimpleNamespace

    from transformers import LlamaConfig

    from scissorhands.commands import evaluate

    plan = SimpleNamespace(tokens=9000, batch=[], hf=None)
    problem = evaluate._check_batch(plan, LlamaConfig(max_position_embeddings=8192), None)
    assert problem is not None and problem.startswith("--tokens 9000 is past the model's trained context (8192")
    assert "longctx" in problem
    assert evaluate._check_batch(SimpleNamespace(tokens=8192, batch=[], hf=None),
                                 LlamaConfig(max_position_embeddings=8192), None) is None

