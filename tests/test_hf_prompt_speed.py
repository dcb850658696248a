"""Prompt-aware reading at the stock cache's cost: a chunk that evicts nothing computes only
its last ``observation_window`` rows' weights, beside the model's own attention, and the
policies read none of its rows; the prompt's end decides exactly as when every row was
computed (the rows it reads are the same, bit for bit)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
pytest.importorskip("transformers", reason="transformers is not installed (pip install .[hf])")

from test_hf_dropin import FAMILIES, _model, _prompts  # noqa: E402

from scissorhands import hf  # noqa: E402
from scissorhands.hf import cache as cache_module  # noqa: E402

pytestmark = [pytest.mark.hf, pytest.mark.usefixtures("one_torch_thread")]


def _kept_after_the_prompt(model, ids, mask, chunk, every_row, monkeypatch, **kwargs):
    """Every row's kept positions after reading ``ids`` in chunks and ending the prompt,
    with only the window's rows computed, or (``every_row``) every row, as before."""
    if every_row:
        monkeypatch.setattr(cache_module.EvictingCache, "_window_only", lambda self, q, fresh: 0)
    else:
        monkeypatch.undo()
    cache = hf.EvictingCache.from_model(model, prompt_aware=True, **kwargs)
    rows_seen = []
    with torch.no_grad():
        for start in range(0, ids.shape[1], chunk):
            model(input_ids=ids[:, start:start + chunk], attention_mask=mask[:, :start + chunk], cache=cache)
            rows_seen.append(cache._forward is None)
    window = None if cache._window is None else cache._window.copy()
    cache.end_prompt()
    kept = [cache.kept_positions(e, b, h).tolist() for e in cache.observed_layers
            for b in range(cache.batch) for h in range(cache.num_kv_heads)]
    return kept, window, cache


SDPA = [(f, "sdpa") for f in FAMILIES if f != "gemma2"]  # Gemma-2 runs eager only


@pytest.mark.parametrize(("family", "impl"), [*SDPA, ("llama", "eager"), ("gemma2", "eager")])
@pytest.mark.parametrize("policy", ["scissorhands", "h2o", "tova"])
def test_the_prompt_end_keeps_what_it_kept_when_every_row_was_computed(family, impl, policy, monkeypatch):
    """Left-padded batch, chunks shorter and longer than the window: the same window rows
    and the same kept positions either way, in both backends."""
    model = _model(family, impl)
    ids, mask = _prompts(batch=3, length=40, seed=4)
    for backend in ("native", "reference"):
        for chunk in (5, 16, 40):
            kwargs = dict(policy=policy, budget=24, backend=backend, recent_window=4, sinks=1, observation_window=8)
            old, old_window, _ = _kept_after_the_prompt(model, ids, mask, chunk, True, monkeypatch, **kwargs)
            new, new_window, cache = _kept_after_the_prompt(model, ids, mask, chunk, False, monkeypatch, **kwargs)
            assert np.array_equal(old_window, new_window)
            assert new == old
            assert cache.stats.prompt_ends == 1 and int(cache.held_counts().max()) <= 24


def test_the_policies_read_no_row_of_such_a_chunk(monkeypatch):
    """Only the window's rows are computed, and the prompt's positions join with a new
    position's state: no votes before the prompt's end."""
    model = _model("llama", "sdpa")
    ids, mask = _prompts(batch=2, length=30, seed=5)
    seen = []
    real = hf.attention.attention_rows

    def rows(module, query, key, m, kwargs):
        seen.append(int(query.shape[2]))
        return real(module, query, key, m, kwargs)

    monkeypatch.setattr(hf.attention, "attention_rows", rows)
    cache = hf.EvictingCache.from_model(model, "scissorhands", 64, prompt_aware=True, observation_window=8)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, cache=cache)
    assert seen and set(seen) == {8}
    policy = cache.policies[0]
    assert all(v == 0 for row in policy.state_dict()["votes"] for v in row)
