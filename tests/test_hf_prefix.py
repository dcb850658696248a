"""A used cache given a prompt that does not continue what it read: prefix reuse.

On the small random models of ``test_hf_dropin.py``: without eviction each prompt of any
sequence on one cache gives a fresh cache's tokens; with eviction the common prefix's kept
positions are reused and nothing past it; ``prefix="refuse"`` raises with nothing changed.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
pytest.importorskip("transformers", reason="transformers is not installed (pip install .[hf])")

from test_hf_dropin import MODES, VOCAB, _generate, _model, _prompts  # noqa: E402

from scissorhands import hf  # noqa: E402
from scissorhands.errors import InvalidInputError  # noqa: E402

pytestmark = [pytest.mark.hf, pytest.mark.usefixtures("one_torch_thread")]


def _ids(length: int, seed: int) -> torch.Tensor:
    return torch.randint(2, VOCAB - 1, (1, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("family", "impl"), [("llama", "sdpa"), ("llama", "eager"), ("gemma2", "eager")])
def test_any_sequence_of_prompts_on_one_cache_gives_each_a_fresh_caches_tokens(family, impl):
    """Without eviction: an unrelated shorter and longer prompt, one sharing a prefix, the
    same twice, each equal to a fresh cache's tokens."""
    model = _model(family, impl)
    a = _ids(10, 5)
    prompts = [a, _ids(5, 6), _ids(30, 7), torch.cat([a[:, :7], _ids(6, 8)], 1)]
    prompts += [prompts[-1], a]
    cache = hf.EvictingCache.from_model(model, "scissorhands", budget=64)
    for prompt in prompts:
        fresh = hf.EvictingCache.from_model(model, "scissorhands", budget=64)
        assert torch.equal(_generate(model, cache, prompt, None, do_sample=False),
                           _generate(model, fresh, prompt, None, do_sample=False))


@pytest.mark.parametrize("mode", list(MODES))
def test_left_padded_batches_and_beams_on_one_cache_give_a_fresh_caches_tokens(mode):
    """Ragged batches (per row, the batch restarting at the shortest common prefix) and
    beams: each generate equals a fresh cache's."""
    model = _model("llama", "sdpa")
    ids, mask = _prompts(batch=3, length=9, seed=0)
    other, other_mask = _prompts(batch=3, length=12, seed=2)
    shared = ids.clone()
    shared[:, 7:] = 5
    cache = hf.EvictingCache.from_model(model, "h2o", budget=64)
    for prompt, m in [(ids, mask), (shared, mask), (other, other_mask), (ids, mask)]:
        fresh = hf.EvictingCache.from_model(model, "h2o", budget=64)
        assert torch.equal(_generate(model, cache, prompt, m, **MODES[mode]),
                           _generate(model, fresh, prompt, m, **MODES[mode]))


def test_with_eviction_the_common_prefixs_kept_positions_are_reused_and_nothing_past_it():
    """After eviction, a prompt sharing 20 positions keeps exactly the held positions
    below 20, with their policy state, and counts 20 tokens as seen."""
    model = _model("llama", "eager")
    first = _ids(40, 9)
    cache = hf.EvictingCache.from_model(model, "scissorhands", 8, recent_window=2)
    _generate(model, cache, first, None, do_sample=False, max_new_tokens=4)
    before = {(layer, h): cache.kept_positions(layer, 0, h) for layer in (0, 1) for h in (0, 1)}
    votes = {k: {int(p): cache.policies[0].votes_of(int(p), (k[0] * 2 + k[1])) for p in v} for k, v in before.items()}
    prompt = torch.cat([first[:, :20], _ids(5, 10)], 1)
    assert cache.reuse_prefix(prompt) == 20
    assert cache.get_seq_length() == 20
    for (layer, h), kept in before.items():
        after = cache.kept_positions(layer, 0, h)
        assert after.tolist() == kept[kept < 20].tolist()
        assert all(cache.policies[0].votes_of(int(p), layer * 2 + h) == votes[(layer, h)][int(p)] for p in after)
    out = _generate(model, cache, prompt, None, do_sample=False, max_new_tokens=4)
    assert out.shape[1] == 29 and int(cache.held_counts().max()) <= 8


def test_refuse_mode_raises_naming_the_position_with_nothing_changed():
    """prefix="refuse": a prompt that differs at position 3 raises naming it and reset(),
    the cache unchanged; one that continues is read as before."""
    model = _model("llama", "sdpa")
    a = _ids(10, 5)
    cache = hf.EvictingCache.from_model(model, "scissorhands", budget=64, prefix="refuse")
    out = _generate(model, cache, a, None, do_sample=False, max_new_tokens=4)
    twin = copy.deepcopy(cache)
    other = a.clone()
    other[0, 3] = (other[0, 3] + 1) % (VOCAB - 2) + 2
    with pytest.raises(InvalidInputError, match=r"position 3.*reset\(\)"):
        _generate(model, cache, other, None, do_sample=False)
    assert cache.seen == twin.seen and np.array_equal(cache.held_counts(), twin.held_counts())
    more = torch.cat([out, _ids(3, 11)], 1)
    assert torch.equal(_generate(model, cache, more, None, do_sample=False),
                       _generate(model, twin, more, None, do_sample=False))


def test_two_unrelated_generate_calls_with_one_cache_give_what_they_give_without_one():
    """Two unrelated prompts (the second shorter) on one cache: each generate gives the
    tokens generate gives with no cache passed."""
    model = _model("llama", "sdpa")
    cache = hf.EvictingCache.from_model(model, "scissorhands", budget=64)
    for prompt in (_ids(10, 5), _ids(4, 6)):
        assert torch.equal(_generate(model, cache, prompt, None, do_sample=False),
                           _generate(model, None, prompt, None, do_sample=False))


def test_the_text_generation_pipeline_with_one_cache_answers_each_call_as_without_one(smollm2):
    """The pipeline called twice with one bounded cache (SmolLM2, chat messages): each call's answer is the
    one it gives with no cache handed in; the second is not a continuation of the first."""
    from transformers import pipeline

    model, tokenizer = smollm2
    model.set_attn_implementation("sdpa")
    pipe = pipeline("text-generation", model=model, tokenizer=tokenizer)
    questions = ["Name three colours.", "Name three fruits."]
    kwargs = dict(max_new_tokens=10, do_sample=False, return_full_text=False)
    try:
        cache = hf.EvictingCache.from_model(model, "scissorhands", budget=512)
        ours = [pipe([{"role": "user", "content": q}], cache=cache, **kwargs)[0]["generated_text"] for q in questions]
        hf.uninstall(model)
        stock = [pipe([{"role": "user", "content": q}], **kwargs)[0]["generated_text"] for q in questions]
    finally:
        hf.uninstall(model)
    assert ours == stock
    assert ours[0] != ours[1]
