"""The transformers cache's state across forwards: what one forward owns, what a failed or
interrupted forward leaves behind, the observer hook, and what generate may ask of it.

On the small random models of ``test_hf_dropin.py`` (no download), the stock
``DynamicCache`` beside the cache wherever the claim is "the stock cache does X".
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
pytest.importorskip("transformers", reason="transformers is not installed (pip install .[hf])")

from test_hf_dropin import PAD, _model, _prompts  # noqa: E402
from transformers import DynamicCache  # noqa: E402

from scissorhands import hf  # noqa: E402
from scissorhands.errors import InvalidInputError, InvalidTypeError  # noqa: E402
from scissorhands.options import SPECS, PolicyOptions  # noqa: E402

pytestmark = [pytest.mark.hf, pytest.mark.usefixtures("one_torch_thread")]



class _Interrupt(Exception):
    """Raised by a hook in the middle of a forward."""


def _interrupting(model, layer: int = -1):
    """A pre-hook raising at decoder layer ``layer``: the forward stops after the layers
    before it ran (and handed their attention to the cache)."""

    def hook(module, args, kwargs):
        raise _Interrupt

    return model.model.layers[layer].register_forward_pre_hook(hook, with_kwargs=True)


def _run(model, cache, ids, mask=None, steps=4):
    """A prompt then ``steps`` teacher-forced decode steps; every forward's logits."""
    out = [hf.prefill(model, cache, ids, attention_mask=mask)[:, -1]]
    for t in range(steps):
        out.append(hf.decode_step(model, cache, torch.full((ids.shape[0],), 3 + t)))
    return torch.stack(out)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("policy", ["streaming-llm", "h2o"])
def test_reset_after_an_interrupted_forward_leaves_the_next_prompts_rotary_positions_right(policy, impl):
    """positions="cache": a forward interrupted after its first layers, then the reset the
    cache's error message recommends, and the next prompt (longer than the budget, so that
    keys are re-rotated) gives exactly a fresh cache's logits."""
    model = _model("llama", impl)
    options = PolicyOptions(sinks=1) if policy == "streaming-llm" else PolicyOptions(recent_window=2, sinks=1)
    first, _ = _prompts(batch=1, length=9, seed=3)
    second, _ = _prompts(batch=1, length=11, seed=4)
    cache = hf.EvictingCache.from_model(model, policy, 6, options, positions="cache")
    _run(model, cache, first, steps=2)
    handle = _interrupting(model)
    try:
        with pytest.raises(_Interrupt):
            hf.decode_step(model, cache, torch.tensor([5]))
    finally:
        handle.remove()
    cache.reset()
    fresh = hf.EvictingCache.from_model(model, policy, 6, options, positions="cache")
    assert torch.equal(_run(model, cache, second), _run(model, fresh, second))


def _rank_run(model, cache, ids, mask):
    """Every forward's logits over a long run of ``cache`` (budget 6): a left-padded prompt,
    24 steps, a beam reorder, an interrupted step, a new turn of 3 tokens, 24 more steps."""
    out = [hf.prefill(model, cache, ids, attention_mask=mask)[:, -1]]
    batch = ids.shape[0]
    for t in range(24):
        out.append(hf.decode_step(model, cache, torch.full((batch,), 3 + t % 7)))
    cache.reorder_cache(torch.tensor([1, 1, 0]))
    handle = _interrupting(model)
    try:
        with pytest.raises(_Interrupt):
            hf.decode_step(model, cache, torch.full((batch,), 4))
    finally:
        handle.remove()
    turn = torch.tensor([[5, 6, 7]] * batch)
    seen = torch.ones(batch, cache.seen + 3, dtype=mask.dtype)
    seen[:, : mask.shape[1]] = mask[torch.tensor([1, 1, 0])]
    out.append(hf.prefill(model, cache, turn, attention_mask=seen)[:, -1])
    for t in range(24):
        out.append(hf.decode_step(model, cache, torch.full((batch,), 2 + t % 5)))
    return torch.stack(out)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("policy", ["scissorhands", "tova", "streaming-llm"])
def test_keys_kept_at_their_ranks_give_the_logits_of_keys_turned_from_scratch(policy, impl, monkeypatch):
    """positions="cache" keeps float32 keys at their ranks and turns in place only those
    whose rank changed: over 50 forwards with evictions every step, left padding, a beam
    reorder, an interrupted step and a new turn, every forward's logits equal (float32
    rounding) those of turning every held key from its stored rotation at each step."""
    from scissorhands.hf import positions as positions_module

    model = _model("llama", impl)
    takes = SPECS[policy].takes
    options = PolicyOptions(recent_window=2 if takes("recent_window") else None, sinks=1 if takes("sinks") else None)
    ids, mask = _prompts(batch=3, length=9, seed=5)
    ours = _rank_run(model, hf.EvictingCache.from_model(model, policy, 6, options, positions="cache"), ids, mask)
    monkeypatch.setattr(positions_module, "rank_rotatable", lambda query, key: False)
    scratch = _rank_run(model, hf.EvictingCache.from_model(model, policy, 6, options, positions="cache"), ids, mask)
    assert torch.isfinite(ours).all()
    assert torch.allclose(ours, scratch, rtol=1e-5, atol=1e-5), float((ours - scratch).abs().max())


# ----------------------------------------------------------------------------- the observer hook


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_an_observer_sees_every_layers_attention_as_a_full_forward_computes_it(impl):
    """A full cache's observer is called once per full-attention layer per forward, in
    layer order, with the new rows' weights ``(batch, heads, q, extent)`` over slots that
    are positions: a one-shot eager forward's attention, for the prompt and each step."""
    model = _model("llama", impl)
    ids, _ = _prompts(batch=1, length=9, seed=6)
    cache = hf.EvictingCache.from_model(model, "full", None)
    calls = []
    handle = cache.add_observer(lambda layer, weights: calls.append((layer, cache.seen, weights.clone())))
    hf.prefill(model, cache, ids[:, :5])
    for t in range(5, 9):
        hf.decode_step(model, cache, ids[:, t])
    handle.remove()
    hf.decode_step(model, cache, torch.tensor([4]))
    with torch.no_grad():
        full = _model("llama", "eager")(input_ids=ids, output_attentions=True).attentions
    model.set_attn_implementation(impl)
    layers = cache.observed_layers
    assert [c[0] for c in calls] == layers * 5 and [c[1] for c in calls] == [0, 0, 5, 5, 6, 6, 7, 7, 8, 8]
    for layer, seen, weights in calls:
        q = 5 if seen == 0 else 1
        assert weights.shape == (1, 4, q, seen + q) and weights.dtype == torch.float32
        expect = full[layer][:, :, seen:seen + q, : seen + q]
        assert torch.allclose(weights, expect, atol=1e-6)


def test_an_observer_changes_nothing_and_is_not_copied():
    """Generating with an observer attached (an evicting cache, sdpa, which then computes
    rows it would anyway) gives the tokens and policy states of a cache without one; a
    copy of the cache carries no observer; a removed observer is not called again."""
    model = _model("qwen2", "sdpa")
    ids, mask = _prompts(batch=2, length=9, seed=7)
    caches = [hf.EvictingCache.from_model(model, "h2o", 6, recent_window=2) for _ in range(2)]
    seen = []
    handle = caches[0].add_observer(lambda layer, weights: seen.append(layer))
    outs = [model.generate(input_ids=ids, attention_mask=mask, cache=c, pad_token_id=PAD, do_sample=False,
                           max_new_tokens=8) for c in caches]
    assert torch.equal(outs[0], outs[1]) and len(seen) == 8 * len(caches[0].observed_layers)
    assert [p.state_dict() for p in caches[0].policies] == [p.state_dict() for p in caches[1].policies]
    twin = copy.deepcopy(caches[0])
    hf.decode_step(model, twin, torch.tensor([3, 4]))
    assert len(seen) == 8 * 2
    handle.remove()
    handle.remove()
    hf.decode_step(model, caches[0], torch.tensor([3, 4]))
    assert len(seen) == 8 * 2
    with pytest.raises(InvalidTypeError):
        caches[0].add_observer("not callable")


# ----------------------------------------------------------------------------- failed forwards

POLICIES = ("full", "streaming-llm", "h2o", "tova", "scissorhands")


def _policy_cache(model, policy, **kwargs):
    """A cache of ``policy`` that evicts on these prompts (budget 6), except ``full``."""
    if policy == "full":
        return hf.EvictingCache.from_model(model, "full", None, **kwargs)
    if policy == "streaming-llm":
        return hf.EvictingCache.from_model(model, policy, 6, sinks=1, **kwargs)
    return hf.EvictingCache.from_model(model, policy, 6, recent_window=2, **kwargs)


def _held(cache):
    """Everything a cache holds that decides what comes next: tokens seen, held counts,
    the policies' state, every row's held keys and values in kept order."""
    if cache.batch == 0:
        return cache.seen, cache.held_counts().tolist(), cache.policies, []
    rows = [cache.kept_keys_values(layer, b, h) for layer in cache.observed_layers
            for b in range(cache.batch) for h in range(cache.num_kv_heads)]
    return cache.seen, cache.held_counts().tolist(), [p.state_dict() for p in cache.policies], rows


def _same_held(a, b):
    return a[:3] == b[:3] and len(a[3]) == len(b[3]) and all(
        torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a[3], b[3]))


def _failing(model, cache, failure):
    """The model (and a way to undo the fault) whose next forward with ``cache`` raises
    ``failure``'s way; the exception it raises."""
    if failure == "interrupt":  # an exception in the model between two layers
        handle = _interrupting(model)
        return model, handle.remove, _Interrupt
    if failure == "observer":  # an exception from the cache's own call-outs, at the last layer
        last = cache.observed_layers[-1]

        def observer(layer, weights):
            if layer == last:
                raise _Interrupt

        handle = cache.add_observer(observer)
        return model, handle.remove, _Interrupt
    broken = copy.deepcopy(model)  # a NaN weight in the last layer: every sequence's attention NaN
    with torch.no_grad():
        broken.model.layers[-1].self_attn.q_proj.weight[0, 0] = float("nan")
    return broken, lambda: None, InvalidInputError


def _fail_then_match_a_twin(model, cache, failure, forward, check=lambda: True) -> tuple[int, int]:
    """``forward(model, cache)`` made to fail ``failure``'s way: the cache holds what it
    held (and ``check()`` holds once transformers' first call of a forward undid it); the
    same forward and a step after then give an untouched twin's logits.  Returns the
    cache's memory before and right after the failure."""
    twin = copy.deepcopy(cache)
    before, memory = _held(twin), cache.memory_bytes()
    failing, undo, error = _failing(model, cache, failure)
    try:
        with pytest.raises(error):
            forward(failing, cache)
    finally:
        undo()
    assert _same_held(_held(cache), before)
    cache.get_seq_length()  # transformers' first call of a forward: an interrupted one is undone here
    assert check()
    after = cache.memory_bytes()
    assert torch.equal(forward(model, cache), forward(model, twin))
    step = torch.tensor([3, 4])
    assert torch.equal(hf.decode_step(model, cache, step), hf.decode_step(model, twin, step))
    assert _same_held(_held(cache), _held(twin))
    return memory, after


CASES = [(family, policy, failure) for family in ("llama", "gemma2") for policy in POLICIES
         for failure in ("interrupt", "observer", "nan")
         if not (failure == "nan" and policy in ("full", "streaming-llm"))]  # these read no attention


@pytest.mark.parametrize("when", ["prompt", "step", "chunk"])
@pytest.mark.parametrize(("family", "policy", "failure"), CASES)
def test_a_failed_forward_leaves_the_cache_as_it_was(family, policy, failure, when):
    """A forward that raises (an exception between the model's layers, from an observer,
    or a NaN weight the policies refuse), at the first prompt, a decode step or a new
    turn, of a left-padded batch: the cache holds exactly what it held before, the same
    forward then runs without complaint and gives an untouched twin's logits, and so
    does the step after (Gemma-2: its sliding-window layers too).  Its memory is what it
    was: what the forward's tokens grew is given back."""
    model = _model(family, "eager" if family == "gemma2" else "sdpa")
    ids, mask = _prompts(batch=2, length=9, seed=12)
    cache = _policy_cache(model, policy)
    if when != "prompt":
        hf.prefill(model, cache, ids, attention_mask=mask)
        hf.decode_step(model, cache, torch.tensor([5, 6]))

    def forward(m, c):
        if when == "prompt":
            return hf.prefill(m, c, ids, attention_mask=mask)
        if when == "step":
            return hf.decode_step(m, c, torch.tensor([7, 8]))
        turn = torch.tensor([[7, 8, 9], [10, 11, 12]])
        return hf.prefill(m, c, turn, attention_mask=torch.cat([mask, torch.ones(2, 4, dtype=mask.dtype)], 1))

    memory = _fail_then_match_a_twin(model, cache, failure, forward)
    assert memory[1] == memory[0]  # nothing the forward grew stays allocated


@pytest.mark.parametrize("when", ["step", "chunk"])
@pytest.mark.parametrize("failure", ["interrupt", "observer"])
@pytest.mark.parametrize("pool", ["layer", "model"])
def test_a_failed_forward_of_a_pooled_cache_leaves_what_it_held_in_no_more_memory(pool, failure, when):
    """A pooled cache whose KV heads share a buffer a layer (positions were evicted): a
    decode step or a new turn that raises leaves every row holding what it held, in the
    memory it took (a turn laid the shared buffers out per head: they are laid out
    shared again, never wider), and the same forward and the step after then give an
    untouched twin's logits."""
    model = _model("llama", "sdpa")
    ids, mask = _prompts(batch=2, length=9, seed=12)
    cache = hf.EvictingCache.from_model(model, "scissorhands", 6, recent_window=2, pool=pool)
    hf.prefill(model, cache, ids, attention_mask=mask)
    for token in range(5, 9):
        hf.decode_step(model, cache, torch.tensor([token, token + 1]))
    assert cache.storage.shared

    def forward(m, c):
        if when == "step":
            return hf.decode_step(m, c, torch.tensor([7, 8]))
        turn = torch.tensor([[7, 8, 9], [10, 11, 12]])
        return hf.prefill(m, c, turn, attention_mask=torch.cat([mask, torch.ones(2, 7, dtype=mask.dtype)], 1))

    memory = _fail_then_match_a_twin(model, cache, failure, forward, lambda: cache.storage.shared)
    assert memory[1] <= memory[0]


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("policy", POLICIES)
def test_garbage_in_padding_does_not_abort_the_batchs_other_sequences(policy, impl):
    """An inf in the padding token's embedding: the stock cache gives the padded sequences
    non-finite logits and generates on; so does the cache (the same tokens without
    eviction), and with eviction the unpadded sequence generates exactly what it does
    with a clean embedding."""
    clean = _model("llama", impl)
    model = copy.deepcopy(clean)
    with torch.no_grad():
        model.model.embed_tokens.weight[PAD] = float("inf")
    ids, mask = _prompts(batch=3, length=9, seed=13)
    assert mask[0].all() and not mask[1:].all()

    def generate(m, cache):
        with torch.no_grad():
            return m.generate(input_ids=ids, attention_mask=mask, cache=cache, pad_token_id=PAD,
                              do_sample=False, max_new_tokens=8)

    stock = generate(model, DynamicCache(config=model.config))
    assert torch.equal(stock, generate(model, hf.EvictingCache.from_model(model, policy, 64)))
    evicting = generate(model, _policy_cache(model, policy))
    assert torch.equal(evicting[0], generate(clean, _policy_cache(clean, policy))[0])


# ----------------------------------------------------------------------------- one-token prompts


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("policy", POLICIES)
def test_a_one_token_prompt_generates_the_stock_caches_tokens(policy, batch, impl):
    """A prompt of one token (alone, or a batch of one-token prompts) is a prompt, not a
    decode step: generate gives the DynamicCache's tokens; with eviction (budget 4) it
    runs and holds the budget."""
    model = _model("llama", impl)
    ids = torch.tensor([[5], [7], [9]][:batch])

    def generate(cache):
        with torch.no_grad():
            return model.generate(input_ids=ids, cache=cache, pad_token_id=PAD, do_sample=False, max_new_tokens=8)

    stock = generate(DynamicCache(config=model.config))
    assert torch.equal(generate(hf.EvictingCache.from_model(model, policy, None if policy == "full" else 64)), stock)
    if policy != "full":
        options = {"sinks": 1} if policy == "streaming-llm" else {"recent_window": 1}
        cache = hf.EvictingCache.from_model(model, policy, 4, **options)
        assert generate(cache).shape == stock.shape
        assert cache.held_counts().max() == 4 and cache.seen == 8


# ----------------------------------------------------------------------------- assisted decoding

ASSISTED = {"assistant": lambda model: {"assistant_model": model},
            "prompt-lookup": lambda model: {"prompt_lookup_num_tokens": 3}}


@pytest.mark.parametrize("turn", ["first", "second"])
@pytest.mark.parametrize("mode", list(ASSISTED))
@pytest.mark.parametrize("policy", POLICIES)
def test_assisted_and_prompt_lookup_decoding_are_refused_before_the_first_forward(policy, mode, turn):
    """Assisted and prompt-lookup decoding (which crop the drafts the model rejects, where
    the stock cache can and an evicting one cannot) are refused with a library error
    before any forward, on a new cache or one that holds a first turn: the cache holds
    what it held, and generating without them then gives an untouched twin's tokens."""
    model = _model("llama", "sdpa")
    ids = torch.randint(2, 90, (1, 12), generator=torch.Generator().manual_seed(14))
    stock = model.generate(input_ids=ids, cache=DynamicCache(config=model.config), pad_token_id=PAD,
                           do_sample=False, max_new_tokens=6, **ASSISTED[mode](_model("llama", "sdpa")))
    assert stock.shape[1] > ids.shape[1]  # the stock cache runs it
    cache = _policy_cache(model, policy)
    if turn == "second":
        ids = model.generate(input_ids=ids, cache=cache, pad_token_id=PAD, do_sample=False, max_new_tokens=4)
    twin = copy.deepcopy(cache)
    before = _held(twin)
    with pytest.raises(InvalidInputError, match="assistant_model"):
        model.generate(input_ids=ids, cache=cache, pad_token_id=PAD, do_sample=False, max_new_tokens=6,
                       **ASSISTED[mode](model))
    assert _same_held(_held(cache), before)
    generate = dict(pad_token_id=PAD, do_sample=False, max_new_tokens=6)
    assert torch.equal(model.generate(input_ids=ids, cache=cache, **generate),
                       model.generate(input_ids=ids, cache=twin, **generate))


# ----------------------------------------------------------------------------- torch.compile


def _compiled_and_plain(model, make_cache, ids):
    """Greedy tokens of ``model.forward`` and of ``torch.compile(model.forward)`` (eager
    backend), each on a cache of ``make_cache()``: ``(plain, compiled, plain_cache, cache)``."""
    plain_cache = make_cache()
    plain = _greedy_loop(model.forward, plain_cache, ids)
    torch._dynamo.reset()
    try:
        cache = make_cache()
        compiled = _greedy_loop(torch.compile(model.forward, backend="eager"), cache, ids)
    finally:
        torch._dynamo.reset()
    return plain, compiled, plain_cache, cache


def _greedy_loop(forward, cache, ids, steps=6):
    """Greedy tokens from a loop of ``forward`` calls (the prompt, then one token each)."""
    tokens = []
    with torch.no_grad():
        logits = forward(input_ids=ids, cache=cache, use_cache=True).logits[:, -1]
        for _ in range(steps):
            token = logits.argmax(-1, keepdim=True)
            tokens.append(token)
            logits = forward(input_ids=token, cache=cache, use_cache=True).logits[:, -1]
    return torch.cat(tokens, 1)


@pytest.mark.slow  # compiling takes 20 s (eager backend) to 3 min (inductor) on two cores
@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_a_compiled_forward_drives_the_cache_like_the_stock_cache(backend):
    """torch.compile(model.forward) with the stock cache and with an evicting one gives
    the tokens of the uncompiled forward (the cache's bookkeeping runs outside the
    traced graph)."""
    model = _model("llama", "sdpa")
    ids = torch.randint(2, 90, (1, 8), generator=torch.Generator().manual_seed(15))
    for make in (lambda: DynamicCache(config=model.config),
                 lambda: hf.EvictingCache.from_model(model, "h2o", 5, recent_window=1)):
        plain = _greedy_loop(model.forward, make(), ids)
        torch._dynamo.reset()
        try:
            cache = make()
            compiled = _greedy_loop(torch.compile(model.forward, backend=backend), cache, ids)
        finally:
            torch._dynamo.reset()
        assert torch.equal(compiled, plain)
    assert cache.held_counts().max() == 5


@pytest.mark.parametrize("thing", [object(), None, "smollm2-135m"])
def test_from_model_refuses_what_is_not_a_model(thing):
    """from_model on something without a transformers config raises the library's
    InvalidTypeError naming what was passed, not a raw AttributeError."""
    from scissorhands.errors import InvalidTypeError

    with pytest.raises(InvalidTypeError, match=f"got {type(thing).__name__}"):
        hf.EvictingCache.from_model(thing, "h2o", budget=8)
