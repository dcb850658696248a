"""Retrieval through lm-eval (``scissorhands.commands.retrieval``), on a tiny random Llama with a
byte-level BPE tokenizer trained here (no model file, no hub): the ``scissorhands``
lm-eval model with the full cache gives the stock ``hf`` model's results sample for
sample, an evicting one holds its budget, bad arguments fail before any model loads,
the package's generators are seeded and sized, ``tasks`` runs a grid and ``report``
merges its parts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from fractions import Fraction

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
pytest.importorskip("transformers", reason="transformers is not installed (pip install .[hf])")
pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install .[tasks])")

from conftest import chat_bpe_tokenizer  # noqa: E402

from scissorhands import hf  # noqa: E402
from scissorhands.commands import cli  # noqa: E402
from scissorhands.commands.retrieval import TASKS_DIR, data, driver  # noqa: E402
from scissorhands.commands.retrieval.__main__ import lm_eval_argv  # noqa: E402
from scissorhands.commands.retrieval.config import pop_cache_config  # noqa: E402
from scissorhands.errors import InvalidInputError, ScissorhandsError  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 2-layer random Llama (GQA) and a byte-level BPE tokenizer with a chat template,
    saved as one checkpoint directory (what ``--model`` and ``tokenizer=`` take)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    tokenizer = chat_bpe_tokenizer(600, 200_000)
    path = tmp_path_factory.mktemp("tiny-tasks")
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture
def loaded(tiny):
    """The tiny model and tokenizer, loaded as the library loads a checkpoint."""
    return hf.load_model(tiny, progress=False)


def _instances(kind, pairs):
    from lm_eval.api.instance import Instance

    return [Instance(kind, {}, pair, i) for i, pair in enumerate(pairs)]


TEXTS = ["The cache keeps what the question needs. " * k for k in (2, 5, 9)]


def test_full_cache_equals_the_stock_hf_model_request_for_request(loaded):
    """policy=full: every log-likelihood (value and greedy flag) and every generation is the stock HFLM's, exactly."""
    from lm_eval.models.huggingface import HFLM

    from scissorhands.commands.retrieval.model import ScissorhandsLM

    model, tokenizer = loaded
    likelihoods = _instances("loglikelihood", [(t, " and nothing else") for t in TEXTS])
    generations = _instances("generate_until", [(t, {"until": ["\n"], "max_gen_toks": 6, "do_sample": False})
                                                for t in TEXTS])
    stock = HFLM(pretrained=model, tokenizer=tokenizer, device="cpu")
    expected = (stock.loglikelihood(likelihoods), stock.generate_until(generations))
    ours = ScissorhandsLM(pretrained=model, tokenizer=tokenizer, policy="full", quiet=True)
    assert (ours.loglikelihood(likelihoods), ours.generate_until(generations)) == expected


def test_full_cache_equals_the_stock_hf_model_sample_for_sample_through_simple_evaluate(loaded, tiny):
    """Through simple_evaluate on a package task: every sample's response and score is the stock model's."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from scissorhands.commands.retrieval.model import ScissorhandsLM

    model, tokenizer = loaded
    manager = TaskManager(include_path=TASKS_DIR, metadata={"max_seq_lengths": [320], "tokenizer": tiny,
                                                             "num_samples": 3})
    task = manager.load(["sh_prose_needle"])["tasks"]["sh_prose_needle"]

    def samples(lm):
        out = lm_eval.simple_evaluate(model=lm, tasks=[task], limit=3, log_samples=True, task_manager=manager,
                                      gen_kwargs={"max_gen_toks": 4}, verbosity="ERROR", bootstrap_iters=0)
        return [(s["doc_id"], s["filtered_resps"], s["score"]) for s in out["samples"]["sh_prose_needle"]]

    expected = samples(HFLM(pretrained=model, tokenizer=tokenizer, device="cpu"))
    assert len(expected) == 3
    assert samples(ScissorhandsLM(pretrained=model, tokenizer=tokenizer, policy="full", quiet=True)) == expected


def _caches_of_every_request(ours, monkeypatch):
    """Run a log-likelihood and a generation request per text through ``ours``; return
    the cache each request got, in order."""
    caches = []
    fresh = ours.fresh_cache
    monkeypatch.setattr(ours, "fresh_cache", lambda: caches.append(fresh()) or caches[-1])
    ours.loglikelihood(_instances("loglikelihood", [(t, " and nothing else") for t in TEXTS]))
    ours.generate_until(_instances("generate_until", [(t, {"until": ["\n"], "max_gen_toks": 4}) for t in TEXTS]))
    return caches


def test_an_evicting_cache_holds_its_budget_in_every_request(loaded, monkeypatch):
    """h2o at budget 24 with prompts of 20-90 tokens: each request has its own cache, none holds more than 24."""
    from scissorhands.commands.retrieval.model import ScissorhandsLM

    model, tokenizer = loaded
    ours = ScissorhandsLM(pretrained=model, tokenizer=tokenizer, policy="h2o", budget=24, recent_window=8,
                          prefill_chunk=16, quiet=True)
    caches = _caches_of_every_request(ours, monkeypatch)
    assert len(caches) == 2 * len(TEXTS)
    assert len({id(c) for c in caches}) == len(caches)
    seen = [c.get_seq_length() for c in caches]
    assert max(seen) > 24
    assert all(int(c.held_counts().max()) <= 24 for c in caches)


@pytest.mark.parametrize(("args", "message"), [
    ({"policy": "h2o"}, "needs a budget"),
    ({"policy": "lru", "budget": 64}, "unknown policy"),
    ({"policy": "h2o", "budget": 64, "recent_window": 64}, "recent_window"),
    ({"policy": "streaming-llm", "budget": 64, "recent_window": 8}, "takes no recent_window"),
    ({"policy": "scissorhands", "budget": 64, "recent_window": "150%"}, "recent_window=150%"),
    ({"policy": "scissorhands", "budget": 64, "head_mode": "sideways"}, "head_mode"),
    ({"policy": "full", "batch_size": 4}, "batch_size must be 1"),
    ({"policy": "h2o", "budget": 128, "recnt_window": 4}, "unknown model argument recnt_window"),
    ({"policy": "h2o", "budget": 128, "prompt_aware": "maybe"}, "prompt_aware must be true or false"),
    ({"policy": "h2o", "budget": 128, "prefill_budget": 512}, "prefill_budget applies only with prompt_aware"),
    ({"policy": "h2o", "budget": 128, "prompt_aware": "true", "prefill_budget": 64}, "prefill_budget 64 < budget"),
    ({"policy": "h2o", "budget": 128, "prompt_aware": "true", "pool_kernel": "4"}, "pool_kernel must be odd"),
    ({"policy": "h2o", "budget": 128, "prompt_aware": "true", "observation_window": "x"},
     "observation_window must be an integer"),
    ({"policy": "streaming-llm", "budget": 64, "prompt_aware": True}, "streaming-llm reads no attention"),
])
def test_bad_model_args_fail_before_the_model_loads(monkeypatch, args, message):
    """Each bad --model_args value raises the library's error naming it, and no model is loaded."""
    from scissorhands.commands.retrieval.model import ScissorhandsLM

    monkeypatch.setattr(hf, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(InvalidInputError, match=message):
        ScissorhandsLM(pretrained="no-such-model", **args)


def test_model_args_are_parsed_by_the_options_own_parsers():
    """recent_window=50% and history_window=none arrive as text and are parsed as the CLI flags parse them."""
    args = {"policy": "scissorhands", "budget": 128, "recent_window": "50%", "sinks": 4, "history_window": None,
            "vote_rate": "on", "dtype": "float32"}
    config = pop_cache_config(args)
    assert args == {"dtype": "float32"}
    assert dict(config.values) == {"recent_window": "50%", "sinks": 4, "history_window": None, "vote_rate": True}
    assert config.label() == "scissorhands budget=128 rw=64 sinks=4 hw=off rate"


def test_prompt_aware_model_args_are_parsed_and_reach_the_cache():
    """prompt_aware=true with its settings as text: parsed, labelled, and handed to the cache."""
    args = {"policy": "scissorhands", "budget": 128, "recent_window": "0.75x", "sinks": 4, "prompt_aware": "true",
            "prefill_budget": "1024", "observation_window": 8, "pool_kernel": "21"}
    config = pop_cache_config(args)
    assert args == {}
    kwargs = config.cache_kwargs()
    assert (kwargs["prompt_aware"], kwargs["prefill_budget"], kwargs["observation_window"],
            kwargs["pool_kernel"]) == (True, 1024, 8, 21)
    assert config.label().endswith("pa cap=1024 w=8 k=21")
    assert "prompt_aware" not in pop_cache_config({"policy": "h2o", "budget": 64}).cache_kwargs()


def test_the_archive_model_arg_is_parsed_and_reaches_the_cache():
    """archive=int8 with prompt_aware: labelled and handed to the cache; none is no archive; refused without it."""
    args = {"policy": "scissorhands", "budget": 128, "prompt_aware": "true", "archive": "INT8"}
    config = pop_cache_config(args)
    assert args == {}
    assert config.cache_kwargs()["archive"] == "int8" and config.label().endswith("archive=int8")
    assert config.prompt_args()["archive"] == "int8"
    off = pop_cache_config({"policy": "scissorhands", "budget": 128, "prompt_aware": "true", "archive": "none"})
    assert "archive" not in off.cache_kwargs()
    with pytest.raises(InvalidInputError, match="archive=float32 needs prompt_aware=true"):
        pop_cache_config({"policy": "h2o", "budget": 64, "archive": "float32"})
    with pytest.raises(InvalidInputError, match="archive must be one of none, off, float32, int8, got 'float16'"):
        pop_cache_config({"policy": "h2o", "budget": 64, "prompt_aware": True, "archive": "float16"})


def test_a_prompt_aware_cache_decides_at_the_prompts_end_in_every_request(loaded, monkeypatch):
    """prompt_aware: every request's cache holds the whole prompt while reading it (cap
    above it), then evicts to the budget at the prompt's end: before the first generated
    token's forward, and before a scored continuation."""
    from scissorhands.commands.retrieval.model import ScissorhandsLM

    model, tokenizer = loaded
    ours = ScissorhandsLM(pretrained=model, tokenizer=tokenizer, policy="h2o", budget=24, recent_window=8,
                          prefill_chunk=16, quiet=True, prompt_aware=True, prefill_budget=256)
    caches = _caches_of_every_request(ours, monkeypatch)
    assert len(caches) == 2 * len(TEXTS)
    long = [c for c in caches if c.get_seq_length() > 40]
    assert long and all(c.stats.prompt_ends == 1 for c in long)
    assert all(int(c.held_counts().max()) <= 24 + 16 for c in caches)  # the continuation read after the end


def test_the_prompt_aware_configurations_take_the_prompt_flags():
    """tasks --configs scissorhands+pa --prefill-budget ... builds prompt-aware caches with those
    settings (the others unchanged), under the recommendation's name (scissorhands+pa is its earlier
    one); a bad --pool-kernel is refused by the parser."""
    args = cli.build_parser().parse_args(["tasks", "--configs", "scissorhands+pa,h2o", "--lengths", "512",
                                          "--budgets", "1/4", "--prefill-budget", "600", "--pool-kernel", "21"])
    grid = driver.plan(args)
    aware, plain = (run.config(512, 64, grid["prompt"]) for run in grid["runs"])
    assert aware.prompt.enabled and (aware.prompt.prefill_budget, aware.prompt.pool_kernel) == (600, 21)
    assert [run.name for run in grid["runs"]] == ["recommended", "h2o"]
    assert aware.values["recent_window"] == 0.75 and aware.values["sinks"] == 4 and aware.budget == 128
    assert not plain.prompt.enabled


def test_generators_are_seeded_sized_and_offline(loaded):
    """One seed gives the same samples, another seed others; each fits its length; restated shares once's sample."""
    _, tokenizer = loaded
    once = data.generate("sh_fact_once", tokenizer, [400, 600], 4, seed=7)
    assert once == data.generate("sh_fact_once", tokenizer, [400, 600], 4, seed=7)
    assert once != data.generate("sh_fact_once", tokenizer, [400, 600], 4, seed=8)
    restated = data.generate("sh_fact_restated", tokenizer, [400, 600], 4, seed=7)
    for a, b in zip(once, restated):
        fact = f"The special magic number for {a['key']} is {a['outputs'][0]}."
        assert (a["key"], a["outputs"]) == (b["key"], b["outputs"])
        assert a["input"].count(fact) == 1 and b["input"].count(fact) == data.RESTATEMENTS
        assert a["length"] <= a["max_length"] and b["length"] <= b["max_length"]
        assert len(tokenizer(a["input"]).input_ids) + data.ANSWER_ROOM == a["length"]
    turn = data.generate("sh_later_turn", tokenizer, [600], 1)[0]["input"]
    assert turn.index("<|assistant|>") < turn.rindex("<|user|>") < turn.rindex("What is the special magic number")
    needles = data.generate("sh_prose_needle", tokenizer, [600], 5)
    assert [n["depth"] for n in needles] == list(data.DEPTHS)
    with pytest.raises(InvalidInputError, match="no room"):
        data.generate("sh_prose_needle", tokenizer, [130], 1)


def test_score_is_the_share_of_answers_found():
    """A sample's score is the share of its answers in the response, case-insensitive."""
    assert data.score({"outputs": ["4829137"]}, " 4829137.") == 1.0
    assert data.score({"outputs": ["4829137", "AbC"]}, "abc only") == 0.5


def test_lm_eval_command_line_gets_the_package_tasks_on_its_include_path():
    """The launcher adds --include_path to run and ls (and to a bare --model ...), never twice."""
    assert lm_eval_argv(["--model", "scissorhands"]) == ["run", "--include_path", TASKS_DIR, "--model", "scissorhands"]
    assert lm_eval_argv(["ls", "tasks"]) == ["ls", "--include_path", TASKS_DIR, "tasks"]
    assert lm_eval_argv(["run", "--include_path", "x"]) == ["run", "--include_path", "x"]
    assert lm_eval_argv(["validate", "--tasks", "a"]) == ["validate", "--tasks", "a"]


@pytest.mark.parametrize(("argv", "status", "message"), [
    (["--budgets", "2"], 2, "not a fraction of the length"),
    (["--configs", "lru"], 2, "unknown configuration"),
    (["--tasks", "niah_multikey_1"], 2, "unknown task"),
    (["--lengths", "100"], 2, "leaves no prompt"),
    (["--budgets", "1/64", "--lengths", "256"], 2, "--budgets 1/64 of --lengths 256"),
    (["--pool-kernel", "4"], 2, "--pool-kernel: must be odd"),
    (["--configs", "h2o+pa", "--budgets", "1/4", "--lengths", "512", "--prefill-budget", "100"], 2,
     "--prefill-budget 100 < budget 128"),
])
def test_tasks_refuses_bad_flags_before_the_model_loads(monkeypatch, capsys, argv, status, message):
    """Bad tasks flags exit with a message naming the flag, before any model loads."""
    monkeypatch.setattr(hf, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert cli.main(["tasks", *argv]) == status
    assert message in capsys.readouterr().err


def test_tasks_runs_a_grid_and_writes_every_sample(tiny, tmp_path, capsys):
    """A 2-task, 2-configuration grid: every sample scored and written, the full cache first, budgets of the length."""
    out = tmp_path / "part.json"
    argv = ["tasks", "--model", tiny, "--tasks", "niah_single_1,sh_fact_once", "--lengths", "320",
            "--budgets", "1/4", "--configs", "full,streaming-llm", "--samples", "2", "--max-gen-toks", "3",
            "--no-progress", "--json", str(out)]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "niah_single_1: full cache: 320:" in printed and "streaming-llm" in printed
    doc = json.loads(out.read_text())
    assert doc["format"] == driver.FORMAT
    rows = doc["rows"]
    assert len(rows) == 2 * 2 * 2
    assert {(r["config"], r["budget"]) for r in rows} == {("full", None), ("streaming-llm", 80)}
    assert all(0.0 <= r["score"] <= 1.0 for r in rows)


def _doc(rows, seed=1234):
    return {"format": driver.FORMAT, "model": {"architecture": "llama", "layers": 2, "kv_heads": 2},
            "grid": {"seed": seed, "prefill_chunk": 64, "max_gen_toks": 32}, "rows": rows}


def _row(config, fraction, index, score, task="sh_fact_once", length=512, depth=0.0):
    return {"task": task, "length": length, "config": config, "fraction": fraction, "index": index,
            "score": score, "depth": depth}


def test_report_merges_parts_and_ranks_only_where_the_full_cache_answers(tmp_path, capsys):
    """Parts merge (a repeated sample kept once); shares are of the full cache's accuracy, not ranked below half."""
    part1 = _doc([_row("full", None, 0, 1.0), _row("full", None, 1, 1.0), _row("h2o", "1/4", 0, 1.0),
                  _row("full", None, 0, 0.0, task="sh_later_turn"), _row("h2o", "1/4", 0, 1.0, task="sh_later_turn")])
    part2 = _doc([_row("h2o", "1/4", 0, 0.0), _row("h2o", "1/4", 1, 0.0)])
    cells = {(c["task"], c["config"]): c for c in driver.summarize(driver.merge_documents([part1, part2]))}
    assert cells[("sh_fact_once", "h2o")]["n"] == 2
    assert cells[("sh_fact_once", "h2o")]["share"] == pytest.approx(0.5)
    assert cells[("sh_later_turn", "h2o")]["share"] is None
    paths = []
    for i, part in enumerate((part1, part2)):
        paths.append(tmp_path / f"p{i}.json")
        paths[-1].write_text(json.dumps(part))
    assert cli.main(["report", *map(str, paths)]) == 0
    text = capsys.readouterr().out
    assert "sh_fact_once: full cache: 512: 1.00 (n=2)" in text and "0.50 (50%)" in text
    assert "fails: not ranked" in text
    with pytest.raises(ScissorhandsError, match="seed"):
        driver.merge_documents([part1, _doc([], seed=1)])


def test_plot_draws_accuracy_and_the_depth_heat_map(tmp_path):
    """--plot writes the accuracy figure and, from samples with a needle depth, the heat map beside it."""
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install .[plot])")
    rows = [_row(c, f, i, float(i % 2), task="sh_prose_needle", length=n, depth=d)
            for c, f in (("full", None), ("h2o", "1/4")) for n in (512, 1024) for i, d in enumerate((0.0, 0.5, 1.0))]
    written = driver.plot_tasks([_doc(rows)], tmp_path / "grid.png")
    assert written == [str(tmp_path / "grid.png"), str(tmp_path / "grid-depth.png")]
    assert all(os.path.getsize(p) > 0 for p in written)


def test_quick_grid_plan_is_small():
    """--quick: two tasks at one length and budget, five samples, every configuration (the full cache once)."""
    args = cli.build_parser().parse_args(["tasks", "--quick"])
    grid = driver.plan(args)
    assert (grid["tasks"], grid["lengths"], grid["budgets"], grid["samples"]) == (
        ["niah_single_1", "sh_prose_needle"], [512], [Fraction(1, 4)], 5)
    assert [r.name for r in grid["runs"]] == list(driver.CONFIGS)


@pytest.mark.slow
def test_the_documented_lm_eval_command_runs_from_a_shell(tiny, tmp_path):
    """python -m scissorhands.commands.retrieval --model scissorhands ... runs offline and prints lm-eval's table."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "scissorhands.commands.retrieval", "--model", "scissorhands", "--model_args",
               f"pretrained={tiny},policy=scissorhands,budget=64,recent_window=0.75,sinks=4", "--tasks",
               "niah_single_1,sh_prose_needle", "--metadata",
               json.dumps({"max_seq_lengths": [320], "tokenizer": tiny, "num_samples": 2}),
               "--limit", "2", "--device", "cpu", "--gen_kwargs", "max_gen_toks=3"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "niah_single_1" in done.stdout and "sh_prose_needle" in done.stdout


def test_a_part_without_the_full_cache_says_so_and_ranks_nothing():
    """A --configs part that left `full` out prints why it has no shares, instead of an
    empty full-cache heading, and merging the full cache's part gives the shares."""
    model = {"architecture": "llama", "layers": 2, "kv_heads": 1}
    grid = {"seed": 1234, "prefill_chunk": 64, "max_gen_toks": 32}

    def doc(config, fraction, scores):
        rows = [{"task": "sh_fact_once", "length": 512, "config": config, "fraction": fraction, "index": i,
                 "score": s} for i, s in enumerate(scores)]
        return {"format": driver.FORMAT, "model": model, "grid": grid, "rows": rows}

    part = doc("h2o", "1/4", [1.0, 0.0])
    alone = driver.format_tasks([part])
    assert "full cache: not run at 512" in alone and "(-)" in alone
    merged = driver.format_tasks([part, doc("full", None, [1.0, 1.0])])
    assert "full cache: 512: 1.00 (n=2)" in merged and "0.50 (50%)" in merged


def test_the_recommendation_by_name_resolves_to_its_options_under_those_given():
    """policy=recommended is Scissorhands with the preset's window, sinks and prompt_aware; a key given wins."""
    config = pop_cache_config({"policy": "recommended", "budget": 128})
    assert (config.policy, config.preset, dict(config.values), config.prompt.enabled) == (
        "scissorhands", "recommended", {"recent_window": 0.75, "sinks": 4}, True)
    assert config.label().startswith("scissorhands budget=128 rw=96 sinks=4")
    config = pop_cache_config({"policy": "recommended", "budget": 128, "sinks": 0, "prompt_aware": "false"})
    assert (dict(config.values), config.prompt.enabled) == ({"recent_window": 0.75, "sinks": 0}, False)


def test_the_wrapper_loads_a_model_without_lm_evals_loaded_model_warnings(loaded, caplog):
    """HFLM's 'pretrained is not of type str' and 'already-initialized model' warnings, which every construction
    of this model caused, are not logged; a loading argument HFLM would ignore is refused instead."""
    import logging

    from scissorhands.commands.retrieval.model import ScissorhandsLM

    model, tokenizer = loaded
    with caplog.at_level(logging.INFO):
        ScissorhandsLM(pretrained=model, tokenizer=tokenizer, policy="recommended", budget=64, quiet=True)
    said = " ".join(record.getMessage() for record in caplog.records)
    assert "not of type `str`" not in said and "already-initialized" not in said
    with pytest.raises(InvalidInputError, match="dtype='float16' is one of lm-eval's HFLM loading arguments"):
        ScissorhandsLM(pretrained=model, tokenizer=tokenizer, policy="full", dtype="float16")


def test_quiet_lm_eval_keeps_git_off_stderr_and_drops_rulers_unasked_lengths(tmp_path, monkeypatch, capfd):
    """Outside a git checkout lm-eval's git lookup printed 'fatal: not a git repository'; RULER's 4096 metric of
    no sample (-1) made a phantom row. Within quiet_lm_eval neither, the asked length kept, both restored after."""
    import lm_eval
    import lm_eval.evaluator as evaluator

    from scissorhands.commands.retrieval.model import quiet_lm_eval

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    original = evaluator.get_git_commit_hash
    faked = {"results": {"niah_single_1": {"alias": "niah_single_1", "512,none": 1.0, "512_stderr,none": "N/A",
                                           "4096,none": -1, "4096_stderr,none": "N/A"}}}
    monkeypatch.setattr(evaluator, "simple_evaluate", lambda **kwargs: faked)
    with quiet_lm_eval():
        assert evaluator.get_git_commit_hash() is None
        out = lm_eval.simple_evaluate(model="x")
    assert "fatal" not in capfd.readouterr().err
    assert out["results"]["niah_single_1"] == {"alias": "niah_single_1", "512,none": 1.0, "512_stderr,none": "N/A"}
    assert evaluator.get_git_commit_hash is original and "simple_evaluate" not in vars(lm_eval)


@pytest.mark.slow
def test_the_command_finds_the_tokenizer_by_the_model_and_says_no_false_error(tiny, tmp_path):
    """python -m scissorhands.commands.retrieval with policy=recommended, no tokenizer in --metadata, outside a git
    checkout: RULER gets the model's tokenizer, and stderr has no git error, no HFLM loaded-model warning, stdout no
    -1 row."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "GIT_CEILING_DIRECTORIES": str(tmp_path.parent)}
    command = [sys.executable, "-m", "scissorhands.commands.retrieval", "--model", "scissorhands", "--model_args",
               f"pretrained={tiny},policy=recommended,budget=64", "--tasks", "niah_single_1",
               "--metadata", json.dumps({"max_seq_lengths": [320]}), "--limit", "1", "--device", "cpu",
               "--gen_kwargs", "max_gen_toks=3"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "|niah_single_1|" in done.stdout.replace(" ", "") and "|320|" in done.stdout.replace(" ", "")
    assert "-1|" not in done.stdout.replace(" ", "")
    for noise in ("fatal:", "not of type `str`", "already-initialized", "Traceback"):
        assert noise not in done.stderr


def test_the_command_line_adds_the_models_tokenizer_to_the_metadata_unless_one_is_named(tiny):
    """--metadata without a tokenizer gets the model's, saved to a folder that lasts the run; one named is kept."""
    from scissorhands.commands.retrieval.__main__ import with_tokenizer

    args = ["run", "--model", "scissorhands", "--model_args", f"pretrained={tiny},policy=recommended,budget=64",
            "--metadata", '{"max_seq_lengths": [320]}']
    with with_tokenizer(args) as out:
        metadata = json.loads(out[out.index("--metadata") + 1])
        assert metadata["max_seq_lengths"] == [320]
        assert os.path.isfile(os.path.join(metadata["tokenizer"], "tokenizer_config.json"))
    assert not os.path.exists(metadata["tokenizer"])
    named = [*args[:-1], json.dumps({"max_seq_lengths": [320], "tokenizer": tiny})]
    with with_tokenizer(named) as out:
        assert out == named
    with with_tokenizer(["run", "--model", "hf", "--tasks", "x"]) as out:
        assert out == ["run", "--model", "hf", "--tasks", "x"]
