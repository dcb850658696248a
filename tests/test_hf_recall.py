"""The recall tier (``archive=``): what the policies evict is archived, and every prompt's end
scores held and archived positions together, so a later turn can bring back what an earlier
prompt's end dropped.

On the small random models of ``test_hf_dropin.py`` (no download).
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
pytest.importorskip("transformers", reason="transformers is not installed (pip install .[hf])")

from test_hf_dropin import _generate, _model, _prompts  # noqa: E402

from scissorhands import hf  # noqa: E402
from scissorhands.errors import InvalidInputError  # noqa: E402
from scissorhands.hf import prompt_end as prompt_end_module  # noqa: E402
from scissorhands.hf.archive import Archive  # noqa: E402
from scissorhands.hf.recall import restore  # noqa: E402

pytestmark = [pytest.mark.hf, pytest.mark.usefixtures("one_torch_thread")]

AWARE = dict(prompt_aware=True, prefill_budget=64, observation_window=3, pool_kernel=3, sinks=1, recent_window=4)
BUDGET = 12


def _cache(model, archive="float32", backend="native", policy="scissorhands", budget=BUDGET, **kwargs):
    options = {**AWARE, **kwargs}
    if policy != "scissorhands":
        options["recent_window"] = 2
    return hf.EvictingCache.from_model(model, policy, budget, backend=backend, archive=archive, **options)


def _two_turns(model, cache, new_tokens=6, seed=3, **kwargs):
    """A left-padded batch's first prompt and answer, then a second turn on the same cache."""
    ids, mask = _prompts(batch=2, length=30)
    out = _generate(model, cache, ids, mask, max_new_tokens=new_tokens, do_sample=False, **kwargs)
    gen = torch.Generator().manual_seed(seed)
    extra = torch.randint(2, 90, (out.shape[0], 10), generator=gen)
    ids2 = torch.cat([out, extra], dim=1)
    mask = mask.repeat_interleave(out.shape[0] // mask.shape[0], dim=0)
    mask2 = torch.cat([mask, torch.ones(out.shape[0], ids2.shape[1] - mask.shape[1], dtype=mask.dtype)], dim=1)
    second = _generate(model, cache, ids2, mask2, max_new_tokens=new_tokens, do_sample=False, **kwargs)
    return second, mask2


def _rows(cache):
    for layer in (0, 1):
        for sequence in range(cache.batch):
            for head in range(cache.num_kv_heads):
                yield layer, sequence, head


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(archive="float16"), "archive must be None, 'float32' or 'int8', got 'float16'"),
    (dict(archive="float32", prompt_aware=False), "needs prompt_aware=True"),
    (dict(archive="int8", positions="cache"), "takes positions='original' only"),
    (dict(archive="int8", head_mode="mean"), "takes head_mode='per-head' only"),
    (dict(archive="float32", pool="layer"), "pooled budgets"),
])
def test_an_archive_the_cache_cannot_keep_is_refused_when_built(kwargs, message):
    """Each setting the recall tier does not take is refused by name before anything is built."""
    model = _model("llama", "sdpa")
    options = {**AWARE, **kwargs}
    if options.get("prompt_aware") is False:
        options = {k: v for k, v in options.items() if k not in ("prefill_budget", "observation_window",
                                                                 "pool_kernel")}
    with pytest.raises(InvalidInputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        hf.EvictingCache.from_model(model, "scissorhands", BUDGET, **options)


def test_a_policy_that_reads_no_attention_takes_no_archive():
    """StreamingLLM evicts by age, not by attention: an archive is refused by its name."""
    model = _model("llama", "sdpa")
    with pytest.raises(InvalidInputError, match=r"prompt_aware|not 'streaming-llm'"):
        hf.EvictingCache.from_model(model, "streaming-llm", BUDGET, prompt_aware=True, archive="float32")


@pytest.mark.parametrize("archive", ["float32", "int8"])
@pytest.mark.parametrize("backend", ["native", "reference"])
def test_nothing_evicted_is_lost_held_and_archived_cover_every_position(archive, backend):
    """After two turns every admitted position is held or archived, never both, and the budget holds."""
    model = _model("llama", "sdpa")
    cache = _cache(model, archive, backend)
    _, mask = _two_turns(model, cache)
    assert cache.held_counts().max() <= BUDGET
    assert cache.stats.prompt_ends == 2
    for layer, sequence, head in _rows(cache):
        held = set(cache.kept_positions(layer, sequence, head).tolist())
        archived = set(cache.archived_positions(layer, sequence, head).tolist())
        assert not held & archived
        pads = int((mask[sequence] == 0).sum())
        # Every position read, padding aside; the last generated token was never written.
        assert held | archived == set(range(pads, cache.seen))


@pytest.mark.parametrize("archive", ["float32", "int8"])
def test_the_c_path_and_the_reference_recall_the_same_positions(archive):
    """Both backends recall and keep exactly the same positions, and generate the same tokens."""
    model = _model("llama", "sdpa")
    results = []
    for backend in ("native", "reference"):
        cache = _cache(model, archive, backend)
        out, _ = _two_turns(model, cache)
        kept = [cache.kept_positions(*row).tolist() for row in _rows(cache)]
        archived = [cache.archived_positions(*row).tolist() for row in _rows(cache)]
        results.append((out.tolist(), kept, archived, cache.stats.recalled))
    assert results[0] == results[1]
    assert results[0][3] > 0


def test_a_later_prompt_brings_back_positions_an_earlier_prompt_end_archived(monkeypatch):
    """A new prompt reads over the archive: at its start every archived position is held
    again with a new position's state (no votes); its end keeps some and counts them."""
    model = _model("llama", "sdpa")
    cache = _cache(model)
    ids, mask = _prompts(batch=2, length=30)
    out = _generate(model, cache, ids, mask, max_new_tokens=6, do_sample=False)
    archived = {row: set(cache.archived_positions(*row).tolist()) for row in _rows(cache)}
    held = {row: set(cache.kept_positions(*row).tolist()) for row in _rows(cache)}
    assert all(archived.values())
    extra = torch.randint(2, 90, (2, 10), generator=torch.Generator().manual_seed(3))
    ids2 = torch.cat([out, extra], dim=1)
    mask2 = torch.cat([mask, torch.ones(2, ids2.shape[1] - mask.shape[1], dtype=mask.dtype)], dim=1)
    at_start = []

    def restore_and_look(c, q):
        n = restore(c, q)
        policy = c.policies[0]
        for row in _rows(c) if n else ():
            layer, sequence, head = row
            policy_row = (layer * c.batch + sequence) * c.num_kv_heads + head
            at_start.append((row, set(c.kept_positions(*row).tolist()), c.archived_positions(*row).size,
                             [policy.votes_of(p, policy_row) for p in sorted(archived[row])]))
        return n

    monkeypatch.setattr(prompt_end_module, "restore", restore_and_look)
    with torch.no_grad():
        model(input_ids=ids2[:, cache.get_seq_length():], attention_mask=mask2, cache=cache)
    assert len(at_start) == len(archived)
    for row, kept, left, votes in at_start:
        assert kept == archived[row] | held[row]
        assert left == 0
        assert votes == [0] * len(archived[row])
    cache.end_prompt()
    back = [set(cache.kept_positions(*row).tolist()) & archived[row] for row in _rows(cache)]
    assert sum(len(b) for b in back) == cache.stats.recalled > 0
    assert int(cache.held_counts().max()) <= BUDGET


def test_without_eviction_an_archive_changes_nothing():
    """With a budget above the length the archive stays empty and the tokens are the same."""
    model = _model("llama", "sdpa")
    outs = []
    for archive in (None, "float32"):
        cache = _cache(model, archive, budget=60, prefill_budget=64)
        out, _ = _two_turns(model, cache)
        outs.append(out.tolist())
        assert cache.archive_bytes() == 0 or cache._archive.total() == 0
    assert outs[0] == outs[1]


def test_the_first_prompt_end_keeps_what_it_keeps_without_an_archive():
    """With an empty archive, the first prompt's end keeps the positions prompt-aware eviction keeps."""
    model = _model("llama", "sdpa")
    ids, mask = _prompts(batch=2, length=30)
    kept = []
    for archive in (None, "float32"):
        cache = _cache(model, archive)
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, cache=cache)
        cache.end_prompt()
        kept.append([cache.kept_positions(*row).tolist() for row in _rows(cache)])
    assert kept[0] == kept[1]


def test_beams_move_the_archive_with_their_sequences():
    """Beam search reorders the archive as it reorders held rows: nothing lost, nothing shared."""
    model = _model("llama", "sdpa")
    cache = _cache(model)
    _two_turns(model, cache, num_beams=2)
    for layer, sequence, head in _rows(cache):
        held = set(cache.kept_positions(layer, sequence, head).tolist())
        archived = set(cache.archived_positions(layer, sequence, head).tolist())
        assert not held & archived
        assert cache.held_counts().max() <= BUDGET


def test_reset_copies_and_pickles_keep_or_forget_the_archive():
    """reset() empties the archive; deepcopy and pickle carry it whole."""
    model = _model("llama", "sdpa")
    cache = _cache(model)
    _two_turns(model, cache)
    assert cache.archive_bytes() > 0
    for other in (copy.deepcopy(cache), pickle.loads(pickle.dumps(cache))):
        assert other.archive_bytes() == cache.archive_bytes()
        assert other.archived_positions(0, 1, 1).tolist() == cache.archived_positions(0, 1, 1).tolist()
    cache.reset()
    assert cache.archive_bytes() == 0


def test_int8_archives_a_quarter_of_the_bytes_within_its_rounding():
    """int8 keeps each value within half a scale step and costs at most 0.3x float32's bytes."""
    gen = torch.Generator().manual_seed(0)
    keys = torch.randn(40, 64, generator=gen)
    values = torch.randn(40, 64, generator=gen)
    rows = np.repeat(np.arange(4), 10)
    positions = np.tile(np.arange(10), 4)
    stores = {}
    for mode in ("float32", "int8"):
        archive = Archive(mode)
        archive.add(rows, positions, keys, values, 4)
        stores[mode] = archive
        got_pos, got_k, got_v = archive.row_entries(2)
        assert got_pos.tolist() == list(range(10))
        step = keys[20:30].abs().amax(dim=1, keepdim=True) / 127
        if mode == "float32":
            assert torch.equal(got_k, keys[20:30]) and torch.equal(got_v, values[20:30])
        else:
            assert ((got_k - keys[20:30]).abs() <= step / 2 + 1e-7).all()
    ratio = stores["int8"].bytes_per_position(64) / stores["float32"].bytes_per_position(64)
    assert ratio <= 0.3
    assert stores["int8"].nbytes() < 0.3 * stores["float32"].nbytes() + 4 * 16 * 8


def test_a_prompt_reusing_a_prefix_forgets_what_was_archived_past_it():
    """Prefix reuse drops archived positions from the first difference on, as it drops held ones."""
    model = _model("llama", "sdpa")
    cache = _cache(model)
    ids, mask = _prompts(batch=2, length=30)
    out = _generate(model, cache, ids, mask, max_new_tokens=6, do_sample=False)
    assert any(cache.archived_positions(*row).size and cache.archived_positions(*row).max() >= 20
               for row in _rows(cache))
    other = out.clone()
    other[:, 20:] = (other[:, 20:] + 1) % 90 + 2
    full_mask = torch.cat([mask, torch.ones(2, other.shape[1] - mask.shape[1], dtype=mask.dtype)], dim=1)
    reused = cache.reuse_prefix(other, full_mask)
    assert reused == 20
    for row in _rows(cache):
        assert set(cache.archived_positions(*row).tolist()) | set(cache.kept_positions(*row).tolist()) \
            == set(range(int((mask[row[1]] == 0).sum()), 20))


def test_past_prefill_budget_the_prompt_end_scores_held_and_archived_together(monkeypatch):
    """When held, archived and the new prompt pass prefill_budget nothing is restored at its start; its end
    scores both (both backends alike), keeps the budget and loses nothing."""
    model = _model("llama", "sdpa")
    restored = []
    monkeypatch.setattr(prompt_end_module, "restore", lambda c, q: restored.append(restore(c, q)) or restored[-1])
    results = []
    for b in ("native", "reference"):
        cache = _cache(model, backend=b, prefill_budget=40)
        out, mask = _two_turns(model, cache)
        assert cache.held_counts().max() <= BUDGET and cache.stats.recalled > 0
        for layer, sequence, head in _rows(cache):
            held = set(cache.kept_positions(layer, sequence, head).tolist())
            archived = set(cache.archived_positions(layer, sequence, head).tolist())
            assert not held & archived
            assert held | archived == set(range(int((mask[sequence] == 0).sum()), cache.seen))
        results.append((out.tolist(), [cache.kept_positions(*row).tolist() for row in _rows(cache)]))
    assert not any(restored)
    assert results[0] == results[1]


@pytest.mark.slow  # compiling takes about 20 s (eager backend) on two cores
def test_a_compiled_forward_drives_an_archive_like_an_uncompiled_one():
    """torch.compile(model.forward) (eager backend) with an archive: the uncompiled forward's tokens and archive."""
    from test_hf_state import _compiled_and_plain

    model = _model("llama", "sdpa")
    ids = torch.randint(2, 90, (1, 30), generator=torch.Generator().manual_seed(15))
    plain, compiled, plain_cache, cache = _compiled_and_plain(model, lambda: _cache(model), ids)
    assert torch.equal(compiled, plain)
    assert cache.archive_bytes() > 0
    for row in _rows(cache):
        assert cache.archived_positions(*row).tolist() == plain_cache.archived_positions(*row).tolist()
