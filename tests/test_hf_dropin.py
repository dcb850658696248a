"""The drop-in cache on small randomly initialised models of five families (no download).

Llama (GQA), Qwen2, Mistral (MHA), Phi-3 and Gemma-2 (eager only, with its softcap and
its sliding-window layers), under ``sdpa`` and ``eager``: the model's own ``generate``
with the cache gives exactly the stock ``DynamicCache``'s tokens while nothing is
evicted; with eviction the cache keeps its invariants and hands the policies exactly
the attention a full forward computes.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install .[hf])")

from transformers import AutoModelForCausalLM, DynamicCache  # noqa: E402

from scissorhands import hf  # noqa: E402
from scissorhands.errors import InvalidInputError, InvalidTypeError  # noqa: E402
from scissorhands.options import SPECS, PolicyOptions  # noqa: E402

pytestmark = [pytest.mark.hf, pytest.mark.usefixtures("one_torch_thread")]

VOCAB = 97
PAD = 0


def _config(family: str) -> object:
    from transformers import Gemma2Config, LlamaConfig, MistralConfig, Phi3Config, Qwen2Config

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  max_position_embeddings=512, pad_token_id=PAD, bos_token_id=1, eos_token_id=VOCAB - 1)
    if family == "llama":
        return LlamaConfig(num_attention_heads=4, num_key_value_heads=2, **common)
    if family == "qwen2":
        return Qwen2Config(num_attention_heads=4, num_key_value_heads=2, **common)
    if family == "mistral":
        return MistralConfig(num_attention_heads=4, num_key_value_heads=4, head_dim=16, sliding_window=None,
                             **common)
    if family == "phi3":
        return Phi3Config(num_attention_heads=4, num_key_value_heads=2, **common)
    if family == "gemma2":
        return Gemma2Config(num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=4,
                            sliding_window=8, query_pre_attn_scalar=16, attn_logit_softcapping=50.0,
                            **{k: v for k, v in common.items() if k != "num_hidden_layers"})
    raise ValueError(family)



FAMILIES = ("llama", "qwen2", "mistral", "phi3", "gemma2")
CASES = [(f, impl) for f in FAMILIES for impl in (("eager",) if f == "gemma2" else ("sdpa", "eager"))]
_MODELS: dict[str, object] = {}


def _model(family: str, impl: str, dtype: torch.dtype = torch.float32) -> object:
    """A small random model of ``family`` (built once), set to attention ``impl``."""
    key = f"{family}/{dtype}"
    if key not in _MODELS:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(_config(family), attn_implementation="eager", dtype=dtype)
        _MODELS[key] = model.eval()
    model = _MODELS[key]
    model.set_attn_implementation(impl)
    return model


def _prompts(batch: int = 3, length: int = 9, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts of different lengths, and their attention mask."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB - 1, (batch, length), generator=gen)
    mask = torch.ones_like(ids)
    for b in range(batch):
        pad = (2 * b) % (length - 2)
        ids[b, :pad] = PAD
        mask[b, :pad] = 0
    return ids, mask


def _generate(model, cache, ids, mask, **kwargs):
    torch.manual_seed(1)
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=mask, cache=cache, pad_token_id=PAD,
                              max_new_tokens=kwargs.pop("max_new_tokens", 12), **kwargs)


MODES = {
    "greedy": dict(do_sample=False),
    "sampling": dict(do_sample=True, top_k=20),
    "beams": dict(num_beams=3, do_sample=False),
    "num_return_sequences": dict(do_sample=True, num_return_sequences=2),
}


@pytest.mark.parametrize(("family", "impl"), CASES)
@pytest.mark.parametrize("mode", list(MODES))
def test_without_eviction_generate_equals_the_stock_cache(family, impl, mode):
    """With a budget above the length, generate gives exactly the DynamicCache's tokens."""
    model = _model(family, impl)
    ids, mask = _prompts()
    stock = _generate(model, DynamicCache(config=model.config), ids, mask, **MODES[mode])
    cache = hf.EvictingCache.from_model(model, "scissorhands", budget=64)
    ours = _generate(model, cache, ids, mask, **MODES[mode])
    assert torch.equal(stock, ours)
    assert hf.installed(model) == impl


@pytest.mark.parametrize(("family", "impl"), CASES)
def test_without_eviction_a_two_turn_chat_equals_the_stock_cache(family, impl):
    """A second generate on the same cache with the conversation so far continues exactly
    as the stock cache does (the new turn reaches the policies as a chunk)."""
    model = _model(family, impl)
    ids = torch.randint(2, VOCAB - 1, (1, 6), generator=torch.Generator().manual_seed(3))
    turn = torch.randint(2, VOCAB - 1, (1, 5), generator=torch.Generator().manual_seed(4))
    outs = []
    for cache in (DynamicCache(config=model.config), hf.EvictingCache.from_model(model, "h2o", budget=64)):
        first = _generate(model, cache, ids, None, do_sample=False, max_new_tokens=6)
        second = _generate(model, cache, torch.cat([first, turn], 1), None, do_sample=False, max_new_tokens=6)
        outs.append((first, second))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def test_bfloat16_without_eviction_equals_the_stock_cache():
    """A bfloat16 model: the same tokens as the stock cache, and eviction runs (the
    weights reach the policies widened exactly)."""
    model = _model("llama", "sdpa", torch.bfloat16)
    ids, mask = _prompts()
    stock = _generate(model, DynamicCache(config=model.config), ids, mask, do_sample=False)
    ours = _generate(model, hf.EvictingCache.from_model(model, "scissorhands", budget=64), ids, mask,
                     do_sample=False)
    assert torch.equal(stock, ours)
    cache = hf.EvictingCache.from_model(model, "scissorhands", budget=6, recent_window=2)
    _generate(model, cache, ids, mask, do_sample=False)
    assert cache.held_counts().max() <= 6


class _Watch:
    """Checks after every forward that no row holds more than the budget."""

    def __init__(self, cache, budget):
        self.cache, self.budget, self.forwards = cache, budget, 0

    def __call__(self, module, args, kwargs, output):
        self.forwards += 1
        assert self.cache.held_counts().max() <= self.budget


@pytest.mark.parametrize(("family", "impl"), CASES)
@pytest.mark.parametrize("policy", ["scissorhands", "h2o", "streaming-llm"])
def test_with_eviction_generate_equals_a_forward_loop_and_stays_within_budget(family, impl, policy):
    """Evicting, model.generate (greedy, a ragged batch) gives the tokens of a plain loop of
    forwards on the same kind of cache, and no (sequence, layer, KV head) ever holds
    more than the budget."""
    model = _model(family, impl)
    ids, mask = _prompts()
    budget = 6
    options = PolicyOptions(recent_window=2 if SPECS[policy].takes("recent_window") else None, sinks=1)
    cache = hf.EvictingCache.from_model(model, policy, budget, options)
    watch = _Watch(cache, budget)
    handle = model.register_forward_hook(watch, with_kwargs=True)
    try:
        out = _generate(model, cache, ids, mask, do_sample=False, max_new_tokens=14)
    finally:
        handle.remove()
    assert watch.forwards == 14
    loop_cache = hf.EvictingCache.from_model(model, policy, budget, options)
    logits = hf.prefill(model, loop_cache, ids, attention_mask=mask)[:, -1]
    tokens = []
    with torch.no_grad():
        for _ in range(14):
            token = logits.argmax(-1)
            tokens.append(token)
            logits = hf.decode_step(model, loop_cache, token)
    expected = torch.stack(tokens, 1)
    finished = (expected == VOCAB - 1).cumsum(1) - (expected == VOCAB - 1).long() > 0  # after the EOS
    assert torch.equal(out[:, ids.shape[1]:], expected.masked_fill(finished, PAD))
    held = cache.held_counts()
    assert held.max() <= budget and (held == loop_cache.held_counts()).all()


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_tova_in_the_cache_generates_as_a_forward_loop(impl):
    """TOVA (recent window 2, a sink) in the cache: generate equals a loop of forwards and
    stays within budget (one family: its path through the cache is H2O's)."""
    test_with_eviction_generate_equals_a_forward_loop_and_stays_within_budget("llama", impl, "tova")


@pytest.mark.parametrize(("family", "impl"), CASES)
def test_policies_see_exactly_the_attention_of_a_full_forward(family, impl, monkeypatch):
    """At every chunk and decode step, the layer-0 weights each row hands its policy are a
    full forward's attention over the positions it holds, renormalised over those and the
    token itself, GQA-averaged (layer 0's keys do not depend on what was evicted)."""
    model = _model(family, impl)
    ids, mask = _prompts(batch=2, length=20, seed=5)
    calls = []
    original_step, original_extend = hf.rows.PolicyRows.step, hf.rows.PolicyRows.extend

    def step(self, pos, weights):
        calls.append(("step", pos, weights.copy(), self.counts().copy(), [self.kept_row(r) for r in range(self.rows)]))
        return original_step(self, pos, weights)

    def extend(self, weights, admit, fresh, q):
        calls.append(("extend", weights.copy(), None if admit is None else admit.copy(), fresh,
                      self.counts().copy(), [self.kept_row(r) for r in range(self.rows)]))
        return original_extend(self, weights, admit, fresh, q)

    monkeypatch.setattr(hf.rows.PolicyRows, "step", step)
    monkeypatch.setattr(hf.rows.PolicyRows, "extend", extend)
    eager = _model(family, "eager")
    with torch.no_grad():
        full = eager(input_ids=ids, attention_mask=mask, output_attentions=True)
    model = _model(family, impl)
    cache = hf.EvictingCache.from_model(model, "scissorhands", budget=7, recent_window=2)
    first_full = next(i for i, layer in enumerate(cache.layers) if isinstance(layer, hf.cache.EvictingLayer))
    attn = full.attentions[first_full].double()  # (batch, heads, T, T)
    hf.prefill(model, cache, ids[:, :8], attention_mask=mask[:, :8])
    for t in range(8, 13):
        hf.decode_step(model, cache, ids[:, t])
    hf.prefill(model, cache, ids[:, 13:18], attention_mask=mask[:, :18])
    heads, kv = cache.num_heads, cache.num_kv_heads
    group = heads // kv
    worst, checked = 0.0, 0
    for call in calls:
        if call[0] == "step":
            _, pos, weights, counts, kept = call
            queries = [(pos, None)]
        else:
            _, weights, admit, fresh, counts, kept = call
            start = 0 if fresh else int(max(k.max() for k in kept if len(k))) + 1
            queries = [(start + i, i) for i in range(weights.shape[1])]
        assert [len(k) for k in kept] == list(counts)
        for b in range(2):
            for h in range(kv):
                r = b * kv + h  # layer 0's rows come first
                held = [] if (call[0] == "extend" and fresh) else [int(p) for p in kept[r]]
                n0 = len(held)
                admitted = []
                for pos, i in queries:
                    if call[0] == "extend" and admit is not None and not admit[r, i]:
                        continue
                    now = held + [queries[0][0] + j for j in admitted]
                    if now:
                        row = attn[b, h * group:(h + 1) * group, pos]
                        sub = row[:, now]
                        expect = (sub / (sub.sum(-1, keepdim=True) + row[:, pos:pos + 1])).mean(0).numpy()
                        if call[0] == "step":
                            got = weights[r, : len(now)]
                        else:
                            got = weights[r, i, list(range(n0)) + [n0 + j for j in admitted]]
                        worst = max(worst, float(np.abs(expect - got).max()))
                        checked += 1
                    if call[0] == "extend":
                        admitted.append(i)
    assert checked > 50
    assert worst < 1e-5


def test_streaming_llm_logits_equal_a_masked_one_shot_forward():
    """StreamingLLM's held set is known in advance (the sinks and the newest positions):
    each decode step's logits equal one forward over the whole sequence whose mask lets
    every token see exactly what the cache held when it was decoded."""
    model = _model("llama", "sdpa")
    gen = torch.Generator().manual_seed(9)
    ids = torch.randint(2, VOCAB - 1, (1, 24), generator=gen)
    budget, sinks, prompt = 8, 2, 5
    cache = hf.EvictingCache.from_model(model, "streaming-llm", budget, PolicyOptions(sinks=sinks))
    rows = [hf.prefill(model, cache, ids[:, :prompt])[:, -1]]
    for t in range(prompt, ids.shape[1] - 1):
        rows.append(hf.decode_step(model, cache, ids[:, t]))
    n = ids.shape[1]
    allowed = torch.zeros(n, n, dtype=torch.bool)
    for t in range(n):
        # What the cache held when token t arrived: everything while under budget, then
        # the sinks and the newest budget - sinks positions.
        held = list(range(t)) if t <= budget else list(range(sinks)) + list(range(t - (budget - sinks), t))
        allowed[t, held + [t]] = True
    model = _model("llama", "eager")
    mask = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)[None, None]
    with torch.no_grad():
        one_shot = model(input_ids=ids, attention_mask=mask).logits[0]
    ours = torch.cat(rows)
    assert torch.allclose(ours, one_shot[prompt - 1 : n - 1], atol=1e-4)


#: positions="cache" re-rotates stored keys in float32: attention logits within this
#: relative error of the exact ones (measured: below 1e-6).
RANK_TOLERANCE = 1e-5


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("policy", ["scissorhands", "h2o", "streaming-llm"])
def test_positions_cache_logits_equal_keys_rotated_at_their_ranks(policy, impl, monkeypatch):
    """positions="cache" (StreamingLLM's rotation, the SinkCache bug class): after
    evictions in the middle of the cache, every (sequence, KV head)'s attention logits
    equal those computed from scratch with the held keys rotated at ranks 0..n-1 (in
    position order, padding not counted) and the query at rank n."""
    from transformers.models.llama import modeling_llama

    model = _model("llama", impl)
    captured = []
    original = hf.attention._eager_for

    def capturing(module):
        function = original(module)

        def attention(module, query, key, value, mask, **kwargs):
            if module.layer_idx == 0:
                captured.append((query.detach().clone(), key.detach().clone()))
            return function(module, query, key, value, mask, **kwargs)

        return attention

    monkeypatch.setattr(hf.attention, "_eager_for", capturing)
    grouped = hf.attention.grouped_attention

    def capturing_grouped(module, query, key, value, mask, kwargs):  # sdpa once positions were evicted
        if module.layer_idx == 0:
            captured.append((query.detach().clone(), key.detach().clone()))
        return grouped(module, query, key, value, mask, kwargs)

    monkeypatch.setattr(hf.attention, "grouped_attention", capturing_grouped)
    batch, total, kv, group = 2, 22, 2, 2
    ids, mask = _prompts(batch=batch, length=total, seed=4)  # the second sequence left-padded
    options = PolicyOptions(recent_window=2 if SPECS[policy].takes("recent_window") else None, sinks=1)
    cache = hf.EvictingCache.from_model(model, policy, 6, options, positions="cache")
    hf.prefill(model, cache, ids[:, :7], attention_mask=mask[:, :7])
    for t in range(7, total - 1):
        hf.decode_step(model, cache, ids[:, t])
    storage = cache.storage
    held = {(b, h): cache.kept_positions(0, b, h) for b in range(batch) for h in range(kv)}
    slots = {(b, h): storage.slots[b * kv + h, : storage.counts[b * kv + h]].copy()
             for b in range(batch) for h in range(kv)}
    free = storage.free.copy()
    assert any(np.any(np.diff(k) > 1) and k[0] == 0 for k in held.values())  # a gap in the middle
    captured.clear()
    hf.decode_step(model, cache, ids[:, total - 1])
    query, key = captured[-1]

    layer = model.model.layers[0]
    with torch.no_grad():
        hidden = layer.input_layernorm(model.model.embed_tokens(ids))
        q_raw = layer.self_attn.q_proj(hidden).view(batch, total, -1, 16).transpose(1, 2)
        k_raw = layer.self_attn.k_proj(hidden).view(batch, total, -1, 16).transpose(1, 2)

    def rotate(x, ranks):
        cos, sin = model.model.rotary_emb(x, torch.tensor(ranks)[None])
        return x * cos + modeling_llama.rotate_half(x) * sin

    worst = 0.0
    for (b, h), kept in held.items():
        order = np.append(kept, total - 1).astype(np.int64)
        n = len(order) - 1
        keys = rotate(k_raw[b, h, torch.from_numpy(order)], np.arange(n + 1))[0]
        row_slots = torch.from_numpy(np.append(slots[(b, h)], free[b * kv + h]))
        for g in range(group):
            head = h * group + g
            expect = keys @ rotate(q_raw[b, head, total - 1 : total], [n]).reshape(-1)
            got = key[b, h, row_slots] @ query[b, head, 0]
            worst = max(worst, float((expect - got).abs().max() / expect.abs().max()))
    assert 0 <= worst < RANK_TOLERANCE


def test_a_forward_without_position_ids_lands_at_the_true_position():
    """After eviction the cache reports the tokens seen, so a forward without position_ids
    gives the logits of one with the true position."""
    model = _model("llama", "sdpa")
    ids, _ = _prompts(batch=1, length=12)
    cache = hf.EvictingCache.from_model(model, "scissorhands", budget=5, recent_window=1)
    with torch.no_grad():
        model(input_ids=ids, cache=cache)
        twin = copy.deepcopy(cache)
        assert cache.get_seq_length() == 12 and cache.held_counts().max() == 5
        plain = model(input_ids=torch.tensor([[7]]), cache=cache).logits
        explicit = model(input_ids=torch.tensor([[7]]), position_ids=torch.tensor([[12]]), cache=twin).logits
    assert torch.equal(plain, explicit)


def test_batch_rows_equal_their_solo_runs():
    """Each sequence of a batch decides and generates as it would alone (greedy); a
    difference is only allowed where batched and solo float arithmetic differ, and on
    this model there is none."""
    model = _model("qwen2", "sdpa")
    ids, mask = _prompts(batch=3, length=10, seed=11)
    budget = 6
    batched_cache = hf.EvictingCache.from_model(model, "scissorhands", budget, recent_window=2)
    batched = _generate(model, batched_cache, ids, mask, do_sample=False, max_new_tokens=12)
    for b in range(3):
        keep = mask[b].bool()
        solo_cache = hf.EvictingCache.from_model(model, "scissorhands", budget, recent_window=2)
        solo = _generate(model, solo_cache, ids[b : b + 1, keep], None, do_sample=False, max_new_tokens=12)
        assert torch.equal(batched[b, ids.shape[1]:], solo[0, int(keep.sum()):])


# ----------------------------------------------------------------------------- the Cache API


def _prefilled(policy="scissorhands", budget=5, batch=2):
    model = _model("llama", "sdpa")
    ids, mask = _prompts(batch=batch, length=9, seed=2)
    cache = hf.EvictingCache.from_model(model, policy, budget, recent_window=1)
    hf.prefill(model, cache, ids, attention_mask=mask)
    return model, cache, ids, mask


def _state(cache):
    return (cache.seen, cache.held_counts().tolist(),
            [p.state_dict() for p in cache.policies], [k.clone() for k in cache.storage.keys])


def _same(a, b):
    return a[:3] == b[:3] and all(torch.equal(x, y) for x, y in zip(a[3], b[3]))


def test_copies_continue_identically_and_independently():
    """copy.deepcopy gives a cache that continues exactly as the original, and changing one
    leaves the other as it was."""
    model, cache, _, _ = _prefilled()
    twin = copy.deepcopy(cache)
    before = _state(twin)
    a = hf.decode_step(model, cache, torch.tensor([5, 6]))
    assert _same(_state(twin), before)
    b = hf.decode_step(model, twin, torch.tensor([5, 6]))
    assert torch.equal(a, b) and _same(_state(cache), _state(twin))


def test_batch_select_and_repeat_move_policy_rows_with_keys():
    """batch_select_indices keeps a sequence whose next step equals the original's row;
    batch_repeat_interleave duplicates rows so both copies decode alike; reorder_cache
    with the identity changes nothing."""
    model, cache, _, _ = _prefilled()
    reference = copy.deepcopy(cache)
    expected = hf.decode_step(model, reference, torch.tensor([5, 6]))
    picked = copy.deepcopy(cache)
    picked.batch_select_indices(torch.tensor([1]))
    assert picked.batch == 1 and picked.held_counts().tolist()[0][0] == cache.held_counts().tolist()[0][1]
    assert torch.allclose(hf.decode_step(model, picked, torch.tensor([6]))[0], expected[1], atol=1e-5)
    repeated = copy.deepcopy(cache)
    repeated.batch_repeat_interleave(2)
    out = hf.decode_step(model, repeated, torch.tensor([5, 5, 6, 6]))
    assert torch.allclose(out[0], out[1]) and torch.allclose(out[2], out[3])
    assert torch.allclose(out[::2], expected, atol=1e-5)
    same = copy.deepcopy(cache)
    same.reorder_cache(torch.tensor([0, 1]))
    assert torch.equal(hf.decode_step(model, same, torch.tensor([5, 6])), expected)
    swapped = copy.deepcopy(cache)
    swapped.reorder_cache(torch.tensor([1, 0]))
    assert torch.allclose(hf.decode_step(model, swapped, torch.tensor([6, 5])), expected.flip(0), atol=1e-5)


@pytest.mark.parametrize("call", [
    lambda c: c.reorder_cache(torch.tensor([0])),
    lambda c: c.reorder_cache(torch.tensor([0, 0, 1])),
    lambda c: c.reorder_cache(torch.tensor([0, 2])),
    lambda c: c.reorder_cache(torch.tensor([0.0, 1.0])),
    lambda c: c.batch_select_indices(torch.tensor([-1])),
    lambda c: c.batch_select_indices(torch.tensor([], dtype=torch.long)),
    lambda c: c.batch_repeat_interleave(0),
    lambda c: c.batch_repeat_interleave(True),
    lambda c: c.crop(-2),
    lambda c: c.crop(3),
    lambda c: c.early_initialization(2, 2, 16, torch.float32, "cpu"),
])
def test_bad_cache_calls_raise_before_changing_anything(call):
    """Indices of the wrong length, range or type, crop and early initialisation raise a
    library error and the cache continues exactly as before."""
    model, cache, _, _ = _prefilled()
    twin = copy.deepcopy(cache)
    before = _state(cache)
    with pytest.raises(InvalidInputError):
        call(cache)
    assert _same(_state(cache), before)
    assert torch.equal(hf.decode_step(model, cache, torch.tensor([5, 6])),
                       hf.decode_step(model, twin, torch.tensor([5, 6])))


def test_reset_makes_the_cache_reusable_for_a_new_prompt():
    """After reset() (even mid-way, after a decode step), the cache takes a new prompt of
    another batch size and generates exactly as a new cache would."""
    model, cache, _, _ = _prefilled()
    hf.decode_step(model, cache, torch.tensor([5, 6]))
    cache.reset()
    assert cache.seen == 0 and cache.batch == 0
    fresh = hf.EvictingCache.from_model(model, "scissorhands", 5, recent_window=1)
    one, _ = _prompts(batch=1, length=7, seed=8)
    assert torch.equal(_generate(model, cache, one, None, do_sample=False),
                       _generate(model, fresh, one, None, do_sample=False))


def test_crop_zero_does_nothing_and_the_length_is_tokens_seen():
    """crop(0) is accepted as a no-op; get_seq_length counts tokens seen, padding included."""
    _, cache, ids, _ = _prefilled()
    cache.crop(0)
    assert cache.get_seq_length() == ids.shape[1] and cache.get_max_length() == -1


@pytest.mark.parametrize("when", ["prompt", "step"])
def test_a_model_without_the_installed_attention_is_refused(when):
    """A cache driven by a model that does not run the library's attention (never
    installed, or switched away from with ``set_attn_implementation`` on a cache in use)
    raises a library error naming the fix in that forward, before its logits come back,
    and holds what it held; back on the library's attention, the forward gives an
    untouched twin's logits."""
    model = _model("llama", "sdpa")
    ids = torch.tensor([[3, 4, 5, 6, 7, 8, 9, 10, 11, 12]])
    if when == "prompt":
        cache = hf.EvictingCache(model.config, "scissorhands", 8, recent_window=2)
    else:
        cache = hf.EvictingCache.from_model(model, "scissorhands", 8, recent_window=2)
        hf.prefill(model, cache, ids)
    twin = copy.deepcopy(cache)
    installed = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    with torch.no_grad(), pytest.raises(InvalidInputError, match="from_model"):
        model(input_ids=ids[:, :3] if when == "prompt" else torch.tensor([[6]]), cache=cache)
    assert cache.get_seq_length() == twin.get_seq_length()
    assert cache.held_counts().tolist() == twin.held_counts().tolist()
    if when == "step":
        model.set_attn_implementation(installed)
        step = torch.tensor([6])
        assert torch.equal(hf.decode_step(model, cache, step), hf.decode_step(model, twin, step))


@pytest.mark.parametrize(("args", "kwargs", "error"), [
    (("lru", 8), {}, InvalidInputError),
    (("scissorhands", 8), {"recent_window": 8}, InvalidInputError),
    (("scissorhands", 0), {}, InvalidInputError),
    (("scissorhands", 8.0), {}, InvalidTypeError),
    (("scissorhands", 8), {"recnt_window": 2}, InvalidTypeError),
    (("scissorhands", 8), {"head_mode": "all"}, InvalidInputError),
    (("scissorhands", 8), {"cache_mode": "gather"}, InvalidInputError),
])
def test_from_model_refuses_bad_arguments_before_touching_the_model(args, kwargs, error):
    """A bad policy, budget, option or mode raises before the model's attention changes."""
    model = _model("llama", "sdpa")
    with pytest.raises(error):
        hf.EvictingCache.from_model(model, *args, **kwargs)
    assert hf.installed(model) is None


def test_a_mistyped_option_is_named_alone_beside_a_preset():
    """With the recommendation, whose preset fills in recent_window and sinks, a mistyped
    keyword is the one named as unknown, and the message points at the cache's own
    keyword arguments (where archive and prompt_aware live)."""
    with pytest.raises(InvalidTypeError) as raised:
        hf.EvictingCache(_config("llama"), "recommended", 64, archiv="float32")
    message = str(raised.value)
    assert message.startswith("unknown option 'archiv':") and "'sinks'" not in message
    assert "archive" in message and "EvictingCache" in message


def test_switching_back_removes_the_installed_attention():
    """set_attn_implementation back to the original (or uninstall) restores it."""
    model = _model("llama", "sdpa")
    hf.EvictingCache.from_model(model, "full", None)
    assert model.config._attn_implementation == "scissorhands_sdpa"
    hf.uninstall(model)
    assert model.config._attn_implementation == "sdpa" and hf.installed(model) is None


# ----------------------------------------------------------------------------- pooled budgets


def _sharp_model(impl: str) -> object:
    """The llama model with its queries scaled by 8: attention peaked enough for KV heads
    to differ in what they attend to (the random model's is nearly uniform)."""
    key = "llama/sharp"
    if key not in _MODELS:
        model = copy.deepcopy(_model("llama", "eager"))
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_proj.weight.mul_(8)
        _MODELS[key] = model
    model = _MODELS[key]
    model.set_attn_implementation(impl)
    return model


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize(("policy", "pool"), [("scissorhands", "layer"), ("scissorhands", "model"), ("h2o", 2)])
def test_pooled_budgets_generate_equals_a_forward_loop_and_each_pool_keeps_its_share(policy, pool, impl):
    """With a budget shared by a layer's KV heads (or by every row of a sequence),
    model.generate on a ragged batch gives the tokens of a plain loop of forwards; every
    pool of every sequence holds at most its rows x budget, Scissorhands' rows coming to
    hold different counts; the reference backend keeps exactly the same positions."""
    model = _sharp_model(impl)
    ids, mask = _prompts()
    budget = 6
    options = PolicyOptions(recent_window=1, sinks=1, pool=pool)
    cache = hf.EvictingCache.from_model(model, policy, budget, options)
    out = _generate(model, cache, ids, mask, do_sample=False, max_new_tokens=14)
    loops = [hf.EvictingCache.from_model(model, policy, budget, options, backend=b) for b in ("native", "reference")]
    logits = [hf.prefill(model, c, ids, attention_mask=mask)[:, -1] for c in loops]
    tokens = []
    with torch.no_grad():
        for _ in range(14):
            token = logits[0].argmax(-1)
            tokens.append(token)
            logits = [hf.decode_step(model, c, token) for c in loops]
    expected = torch.stack(tokens, 1)
    finished = (expected == VOCAB - 1).cumsum(1) - (expected == VOCAB - 1).long() > 0
    assert torch.equal(out[:, ids.shape[1]:], expected.masked_fill(finished, PAD))
    # (The counts of generate's cache may differ from the loop's: after an EOS it feeds padding.)
    held = cache.held_counts()  # (layers, batch, KV heads)
    assert (loops[0].held_counts() == loops[1].held_counts()).all()
    layers, batch, heads = held.shape
    for layer in range(layers):
        for b in range(batch):
            for h in range(heads):
                assert (loops[0].kept_positions(layer, b, h) == loops[1].kept_positions(layer, b, h)).all()
    if pool == "model":
        assert (held.sum(axis=(0, 2)) <= layers * heads * budget).all()
    else:
        size = heads if pool == "layer" else pool
        assert (held.reshape(layers, batch, heads // size, size).sum(axis=3) <= size * budget).all()
    if policy == "scissorhands":  # H2O's least cumulative score is each row's newest: shares stay
        assert held.max() > budget and held.min() < budget  # the shares moved between rows


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("mode", ["reuse", "compact"])
@pytest.mark.parametrize("pool", ["layer", "model", 2])
def test_pooled_heads_sharing_one_buffer_keep_what_buffers_per_head_keep_in_the_uniform_budgets_memory(
        pool, mode, impl):
    """Under a shared budget a layer's KV heads, once positions were evicted, share one
    buffer (each head's columns masked from the others'): through decode steps, a second
    turn read as a chunk and more steps, every row keeps the positions it keeps with a
    buffer per head, and the logits and kept keys and values agree to float32's
    rounding (the products are summed over more, masked, columns); with pool='layer' the
    keys and values take exactly the bytes of the uniform budget's, and with any pool
    fewer than buffers per head (as wide as the fullest head)."""
    model = _sharp_model(impl)
    ids, mask = _prompts(batch=3, length=9)
    budget = 6
    options = PolicyOptions(recent_window=1, sinks=1, pool=pool)
    shared, per_head = (hf.EvictingCache.from_model(model, "scissorhands", budget, options, cache_mode=mode)
                        for _ in range(2))
    per_head.storage.share_heads = False
    uniform = hf.EvictingCache.from_model(model, "scissorhands", budget, recent_window=1, sinks=1, cache_mode=mode)
    caches = (shared, per_head, uniform)
    logits = [hf.prefill(model, c, ids, attention_mask=mask)[:, -1] for c in caches]
    turn = torch.randint(2, VOCAB - 1, (3, 5), generator=torch.Generator().manual_seed(7))
    for part in range(2):
        for _ in range(12):
            token = logits[0].argmax(-1)
            logits = [hf.decode_step(model, c, token) for c in caches]
            assert torch.allclose(logits[0], logits[1], atol=1e-5, rtol=0)
        if part == 0:
            full = torch.cat((mask, torch.ones(3, 12 + 5, dtype=mask.dtype)), dim=1)
            logits = [hf.prefill(model, c, turn, attention_mask=full)[:, -1] for c in caches]
    assert shared.storage.shared and not per_head.storage.shared
    assert (shared.held_counts() == per_head.held_counts()).all()
    layers, batch, heads = shared.held_counts().shape
    for layer in range(layers):
        for b in range(batch):
            for h in range(heads):
                assert (shared.kept_positions(layer, b, h) == per_head.kept_positions(layer, b, h)).all()
                kept = [c.kept_keys_values(layer, b, h) for c in (shared, per_head)]
                assert torch.allclose(kept[0][0], kept[1][0], atol=1e-5, rtol=0)
                assert torch.allclose(kept[0][1], kept[1][1], atol=1e-5, rtol=0)
    assert shared.storage.nbytes() < per_head.storage.nbytes()
    if pool == "layer":
        assert shared.storage.nbytes() == uniform.storage.nbytes()
    assert shared.layers[0].keys.shape[:2] == (batch, heads)


def test_pooled_cache_refuses_a_pool_spanning_sequences_and_moves_rows_with_beams():
    """A pool of rows that does not divide a sequence's rows is refused when the cache is
    built; a pooled cache's rows follow batch_select_indices."""
    model = _model("llama", "sdpa")
    with pytest.raises(InvalidInputError, match="pool must divide the rows of a sequence"):
        hf.EvictingCache.from_model(model, "scissorhands", 6, recent_window=1, pool=3)
    ids, mask = _prompts(batch=2, length=9, seed=2)
    cache = hf.EvictingCache.from_model(model, "scissorhands", 5, recent_window=1, pool="model")
    hf.prefill(model, cache, ids, attention_mask=mask)
    for _ in range(6):
        hf.decode_step(model, cache, torch.tensor([5, 6]))
    reference = copy.deepcopy(cache)
    expected = hf.decode_step(model, reference, torch.tensor([5, 6]))
    picked = copy.deepcopy(cache)
    picked.batch_select_indices(torch.tensor([1]))
    assert (picked.held_counts()[:, 0] == cache.held_counts()[:, 1]).all()
    assert torch.allclose(hf.decode_step(model, picked, torch.tensor([6]))[0], expected[1], atol=1e-5)


def test_pooled_cache_refuses_cache_positions():
    """positions='cache' ranks each sequence's query once; pooled rows hold different
    counts, so the combination is refused when the cache is built."""
    with pytest.raises(InvalidInputError, match="positions='cache'"):
        hf.EvictingCache.from_model(_model("llama", "sdpa"), "scissorhands", 6, recent_window=1, pool="layer",
                                    positions="cache")
