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

from scissorhands import hf  # noqa: E402
from scissorhands.errors import InvalidTypeError  # noqa: E402
from scissorhands.options import PolicyOptions  # noqa: E402

pytestmark = pytest.mark.hf


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One torch thread (tiny models; two threads on a shared machine are slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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
    options = PolicyOptions(recent_window=2, sinks=1)
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
