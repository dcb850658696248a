"""Pinned spans in the transformers cache: ``pins=`` and ``cache.pin()`` give every
(sequence, layer, KV head) row the policies' pins, so that a long generation with a small
budget keeps those positions (a system prompt) held; on the small random models of
``test_hf_dropin.py`` (no download).
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
pytest.importorskip("transformers", reason="transformers is not installed (pip install .[hf])")

from test_hf_dropin import VOCAB, _generate, _model, _prompts  # noqa: E402
from transformers import DynamicCache  # noqa: E402

from scissorhands import hf  # noqa: E402
from scissorhands.errors import InvalidInputError, InvalidTypeError  # noqa: E402

pytestmark = [pytest.mark.hf, pytest.mark.usefixtures("one_torch_thread")]

POLICIES = ("scissorhands", "h2o", "tova", "streaming-llm")



def _options(policy):
    return {"sinks": 1} if policy == "streaming-llm" else {"recent_window": 2, "sinks": 1}


def _held_everywhere(cache, positions):
    """Whether every (layer, sequence, KV head) row holds every position of ``positions``."""
    return all(set(positions) <= set(cache.kept_positions(layer, b, h).tolist())
               for layer in cache.observed_layers for b in range(cache.batch) for h in range(cache.num_kv_heads))


@pytest.mark.parametrize("backend", ["native", "reference"])
@pytest.mark.parametrize("policy", POLICIES)
def test_a_long_generation_keeps_the_pinned_span_held(policy, backend):
    """40 new tokens at budget 10 with positions 7..9 pinned: every row still holds them
    at the end (and within the budget); without the pin they are gone."""
    model = _model("llama", "sdpa")
    ids = torch.randint(2, VOCAB - 1, (2, 12), generator=torch.Generator().manual_seed(1))
    span = list(range(7, 10))
    pinned = hf.EvictingCache.from_model(model, policy, 10, backend=backend, pins=[(7, 10)], **_options(policy))
    plain = hf.EvictingCache.from_model(model, policy, 10, backend=backend, **_options(policy))
    for cache in (pinned, plain):
        _generate(model, cache, ids, None, do_sample=False, max_new_tokens=40, min_new_tokens=40)
    assert pinned.pins == [(7, 10)]
    assert _held_everywhere(pinned, span) and pinned.held_counts().max() <= 10
    assert not _held_everywhere(plain, span)


def test_pin_at_runtime_reaches_every_row_and_stays_through_reset_and_copies():
    """cache.pin() after the prompt, of positions ahead (10 and 11, decoded later),
    protects them from then on; a copy keeps it and reset() keeps the spans for the next
    prompt."""
    model = _model("llama", "eager")
    ids, mask = _prompts(batch=2, length=9, seed=3)
    cache = hf.EvictingCache.from_model(model, "h2o", 8, recent_window=2)
    hf.prefill(model, cache, ids, attention_mask=mask)
    cache.pin(10, 12)
    twin = copy.deepcopy(cache)
    for c in (cache, twin):
        for t in range(12):
            hf.decode_step(model, c, torch.tensor([3 + t, 4 + t]))
        assert _held_everywhere(c, [10, 11])
    cache.reset()
    assert cache.pins == [(10, 12)]
    hf.prefill(model, cache, ids, attention_mask=mask)
    for t in range(12):
        hf.decode_step(model, cache, torch.tensor([3 + t, 4]))
    assert _held_everywhere(cache, [10, 11]) and cache.held_counts().max() <= 8


def test_without_eviction_pins_change_nothing():
    """A budget above the length with a span pinned: the stock cache's tokens."""
    model = _model("llama", "sdpa")
    ids, mask = _prompts()
    stock = _generate(model, DynamicCache(config=model.config), ids, mask, do_sample=False)
    ours = _generate(model, hf.EvictingCache.from_model(model, "scissorhands", 64, pins=[(0, 4)]), ids, mask,
                     do_sample=False)
    assert torch.equal(stock, ours)


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    (dict(pins=[(0, 8)]), InvalidInputError, "nothing to evict"),
    (dict(pins=[(3, 3)]), InvalidInputError, "3"),
    (dict(pins=[(True, 3)]), InvalidTypeError, "True|bool|integer"),
    (dict(pins=[(1, 2, 3)]), InvalidTypeError, "pair"),
    (dict(pins=5), InvalidTypeError, "sequence of"),
    (dict(pins=[(0, 6)], prompt_aware=True, observation_window=4), InvalidInputError,
     "pins leave nothing to evict at the prompt's end"),
])
def test_bad_pins_are_refused_at_construction(kwargs, error, message):
    """Pins the policies refuse (or that leave nothing to evict at the prompt's end) raise
    before anything is built."""
    model = _model("llama", "eager")
    with pytest.raises(error, match=message):
        hf.EvictingCache.from_model(model, "h2o", 10, recent_window=2, sinks=1, **kwargs)


def test_a_refused_runtime_pin_changes_nothing():
    """cache.pin() that leaves nothing to evict raises and every row keeps its old pins."""
    model = _model("llama", "eager")
    ids, mask = _prompts(batch=2, length=9, seed=4)
    cache = hf.EvictingCache.from_model(model, "h2o", 8, recent_window=2, pins=[(0, 2)])
    hf.prefill(model, cache, ids, attention_mask=mask)
    with pytest.raises(InvalidInputError):
        cache.pin(2, 8)
    assert cache.pins == [(0, 2)] and all(p.pins == [(0, 2)] for p in cache.policies)


def test_pinned_positions_survive_the_prompt_end_eviction():
    """prompt_aware: the pinned span is held after the prompt's end as well as during decoding."""
    model = _model("llama", "eager")
    ids, mask = _prompts(batch=2, length=17, seed=5)
    cache = hf.EvictingCache.from_model(model, "scissorhands", 10, recent_window=2, sinks=1, prompt_aware=True,
                                        prefill_budget=32, observation_window=3, pool_kernel=3, pins=[(4, 7)])
    hf.prefill(model, cache, ids, attention_mask=mask)
    cache.end_prompt()
    assert cache.stats.prompt_ends == 1 and _held_everywhere(cache, [4, 5, 6])
    for t in range(10):
        hf.decode_step(model, cache, torch.tensor([3 + t, 4]))
    assert _held_everywhere(cache, [4, 5, 6]) and cache.held_counts().max() <= 10


@pytest.mark.parametrize("backend", ["native", "reference"])
def test_the_recommendation_pins_a_document_most_of_the_budget_long(backend):
    """The recommended window (0.75) shares what the pins and sinks leave: a pinned span of
    3/4 of the budget is accepted, kept through a long generation, and the rest still evicts."""
    model = _model("llama", "sdpa")
    ids = torch.randint(2, VOCAB - 1, (1, 40), generator=torch.Generator().manual_seed(2))
    cache = hf.EvictingCache.from_model(model, "recommended", 40, backend=backend, pins=[(0, 30)],
                                        observation_window=2)
    _generate(model, cache, ids, None, do_sample=False, max_new_tokens=30, min_new_tokens=30)
    assert cache.policies[0].state_dict()["params"]["recent_window"] == int(0.75 * (40 - 26 - 4))
    assert _held_everywhere(cache, range(30)) and int(cache.held_counts().max()) == 40
    assert cache.get_seq_length() == 69
