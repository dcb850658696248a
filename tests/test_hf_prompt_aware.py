"""Prompt-aware eviction in the transformers cache: the prompt held up to its cap, its last
rows' attention kept over chunk boundaries, and every row evicted to the budget by the
observation-window rule when the first decode step begins.

On the small random models of ``test_hf_dropin.py`` (no download).  The window the cache
hands the rule is checked against one built independently from what an observer sees;
without eviction the cache equals the stock ``DynamicCache``.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
pytest.importorskip("transformers", reason="transformers is not installed (pip install .[hf])")

from test_hf_dropin import MODES, PAD, VOCAB, _generate, _model, _prompts  # noqa: E402
from transformers import DynamicCache  # noqa: E402

from scissorhands import hf  # noqa: E402
from scissorhands.errors import InvalidInputError, InvalidTypeError  # noqa: E402

pytestmark = [pytest.mark.hf, pytest.mark.usefixtures("one_torch_thread")]

#: A prompt-aware configuration that evicts on these tiny prompts.
AWARE = dict(prompt_aware=True, prefill_budget=64, observation_window=3, pool_kernel=3, sinks=1)
BACKENDS = ("reference", "native")



def _cache(model, policy="scissorhands", budget=8, backend="native", **kwargs):
    options = {**AWARE, **kwargs}
    if policy != "scissorhands" and "recent_window" not in options:
        options["recent_window"] = 2 if policy == "h2o" else 1
    if policy == "scissorhands":
        options.setdefault("recent_window", 2)
    return hf.EvictingCache.from_model(model, policy, budget, backend=backend, **options)


# ----------------------------------------------------------------------------- construction


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    (dict(prompt_aware=True, prefill_budget=4), InvalidInputError, "prefill_budget 4 < budget 8"),
    (dict(prompt_aware=True, observation_window=7, sinks=1), InvalidInputError,
     "observation_window 7 \\+ sinks 1 >= budget 8"),
    (dict(prompt_aware=True, pool_kernel=4), InvalidInputError, "pool_kernel must be odd"),
    (dict(prompt_aware=True, pool_kernel=0), InvalidInputError, "pool_kernel must be at least 1"),
    (dict(prompt_aware=True, observation_window=0), InvalidInputError, "observation_window must be at least 1"),
    (dict(prompt_aware=True, observation_window=True), InvalidTypeError, "observation_window must be an integer"),
    (dict(prompt_aware=True, prefill_budget=10.0), InvalidTypeError, "prefill_budget must be an integer"),
    (dict(prompt_aware="yes"), InvalidTypeError, "prompt_aware must be True or False"),
    (dict(prompt_aware=True, pool="layer"), InvalidInputError, "pooled budgets"),
    (dict(prompt_aware=True, prefill_budget=2**32), InvalidInputError, "prefill_budget must be at most 2\\*\\*32 - 1"),
    (dict(prompt_aware=True, pool_kernel=2**32 + 1), InvalidInputError, "pool_kernel must be at most"),
    (dict(pool_kernel=3), InvalidInputError, "pool_kernel=3 applies only with prompt_aware=True"),
    (dict(prefill_budget=512, observation_window=8), InvalidInputError,
     "prefill_budget=512, observation_window=8 applies only with prompt_aware=True"),
])
def test_bad_prompt_aware_settings_are_refused_before_the_model_is_touched(kwargs, error, message):
    """Each bad setting raises the library's error naming it, before anything is built."""
    model = _model("llama", "eager")
    hf.uninstall(model)
    with pytest.raises(error, match=message):
        hf.EvictingCache.from_model(model, "scissorhands", 8, **{"recent_window": 2, **kwargs})
    assert hf.installed(model) is None


@pytest.mark.parametrize("policy", ["streaming-llm", "full"])
def test_policies_that_read_no_attention_refuse_prompt_aware(policy):
    """StreamingLLM reads no attention and Full never evicts: prompt_aware is refused, naming them."""
    model = _model("llama", "eager")
    with pytest.raises(InvalidInputError, match=f"prompt_aware needs a policy that reads attention.*{policy}"):
        hf.EvictingCache.from_model(model, policy, 8 if policy != "full" else None, prompt_aware=True)


def test_prompt_aware_refuses_one_configuration_per_sequence():
    """configs= (eval's batch of configurations) with prompt_aware is refused."""
    model = _model("llama", "eager")
    configs = [hf.PolicyConfig("h2o", 64)]
    with pytest.raises(InvalidInputError, match="configs="):
        hf.EvictingCache(model.config, configs=configs, prompt_aware=True)


# ----------------------------------------------------------------------------- without eviction


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("mode", list(MODES))
def test_without_eviction_generate_equals_the_stock_cache(impl, mode, backend):
    """With a budget above the length, a prompt-aware cache (chunked prefill, a ragged
    batch, every decoding mode) gives exactly the DynamicCache's tokens."""
    model = _model("llama", impl)
    ids, mask = _prompts()
    stock = _generate(model, DynamicCache(config=model.config), ids, mask, prefill_chunk_size=4, **MODES[mode])
    cache = hf.EvictingCache.from_model(model, "scissorhands", 64, prompt_aware=True, prefill_budget=64,
                                        backend=backend)
    ours = _generate(model, cache, ids, mask, prefill_chunk_size=4, **MODES[mode])
    assert torch.equal(stock, ours)
    assert cache.stats.prompt_ends == 1 and cache.stats.compactions == 0


# ----------------------------------------------------------------------------- the window


class _Rows:
    """An independent record of the rows the rule should see: per (layer, sequence, KV
    head) row, the GQA-mean attention of each held position read in a chunk, over
    positions, forgotten when the position is no longer among the row's last W held."""

    def __init__(self, cache, window):
        self.cache, self.window = cache, window
        self.rows: list[dict[int, dict[int, float]]] = []
        self.before: list[np.ndarray] = []
        self.pending: list[tuple[int, torch.Tensor]] = []
        cache.add_observer(lambda layer, weights: self.pending.append((layer, weights.double())))

    def before_forward(self):
        """Remember which position each slot held (the observer's columns are slots)."""
        c = self.cache
        self.seen = c.seen
        self.slot_positions = {}
        if c.batch:
            for e, layer in enumerate(c.observed_layers):
                for b in range(c.batch):
                    for h in range(c.num_kv_heads):
                        row = (e * c.batch + b) * c.num_kv_heads + h
                        count = c.storage.counts[row]
                        slots = c.storage.slots[row, :count]
                        self.slot_positions[row] = dict(zip(slots.tolist(), c.kept_positions(layer, b, h).tolist()))
        self.pending = []

    def after_chunk(self, q):
        c = self.cache
        groups = c.groups
        if not self.rows:
            self.rows = [{} for _ in range(c.evicting_layers * c.batch * c.num_kv_heads)]
        for e, (_, weights) in enumerate(self.pending):
            mean = weights.reshape(c.batch, c.num_kv_heads, groups, q, -1).mean(dim=2)
            for b in range(c.batch):
                for h in range(c.num_kv_heads):
                    row = (e * c.batch + b) * c.num_kv_heads + h
                    positions = self.slot_positions.get(row, {})
                    held = c.kept_positions(c.observed_layers[e], b, h).tolist()
                    for j in range(q):
                        p = self.seen + j
                        if p not in held:
                            continue
                        self.rows[row][p] = {}
                        for s in range(mean.shape[-1]):
                            col = positions.get(s, self.seen + s - c.storage.chunk_start
                                                if s >= c.storage.chunk_start else None)
                            if col is not None and col < p:
                                self.rows[row][p][col] = float(mean[b, h, j, s])
                    last = held[-self.window:]
                    self.rows[row] = {k: v for k, v in self.rows[row].items() if k in last}

    def expected(self):
        """``(rows, W, N)`` as the rule reads it: row j = kept index count - W + j."""
        c = self.cache
        out = np.zeros((len(self.rows), self.window, int(c.storage.counts.max())))
        for e, layer in enumerate(c.observed_layers):
            for b in range(c.batch):
                for h in range(c.num_kv_heads):
                    row = (e * c.batch + b) * c.num_kv_heads + h
                    held = c.kept_positions(layer, b, h).tolist()
                    for j in range(self.window):
                        t = len(held) - self.window + j
                        if t < 0 or held[t] not in self.rows[row]:
                            continue
                        weights = self.rows[row][held[t]]
                        for i, p in enumerate(held[:t]):
                            out[row, j, i] = weights.get(p, 0.0)
        return out


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("cap", [64, 9])
def test_the_window_is_the_last_rows_over_held_positions_across_chunks(cap, padded):
    """After chunks of 5 (the last of 2, shorter than the window of 3), with or without
    left padding and with or without evictions to the cap: the window the cache keeps
    equals one built from the observer's weights, row for held position, column for held
    position, zeros where the cache no longer has a row."""
    model = _model("llama", "eager")
    ids, mask = _prompts(batch=2, length=17, seed=5)
    if not padded:
        mask = torch.ones_like(mask)
        ids = ids.masked_fill(ids == PAD, 7)
    cache = _cache(model, budget=8, prefill_budget=cap, recent_window=1)
    record = _Rows(cache, 3)
    for start in range(0, 17, 5):
        stop = min(start + 5, 17)
        record.before_forward()
        hf.prefill(model, cache, ids[:, start:stop], attention_mask=mask[:, :stop])
        record.after_chunk(stop - start)
    assert cache.held_counts().max() <= cap
    window = cache._window
    assert window is not None
    expected = record.expected()
    # What the rule reads: row j's weights on the held positions before its own.
    counts = cache.storage.counts[:, None, None]
    t = counts - 3 + np.arange(3)[None, :, None]
    read = np.arange(expected.shape[2])[None, None, :] < t
    np.testing.assert_allclose(np.where(read, window[:, :, : expected.shape[2]], 0.0), expected, rtol=1e-5,
                               atol=1e-7)
    assert (expected != 0).sum() > 100  # the rows are there, not all zero


def _rule(kept: list[int], rows: np.ndarray, budget: int, sinks: int, kernel: int) -> list[int]:
    """The observation-window rule (SPEC A) on one row, written out: the positions kept."""
    n, w = len(kept), rows.shape[0]
    if n <= budget:
        return kept
    score = np.zeros(n)
    for j in range(w):
        t = n - w + j
        for i in range(max(t, 0)):
            score[i] += rows[j, i]
    r = kernel // 2
    pooled = [score[max(0, i - r):min(n, i + r + 1)].max() for i in range(n)]
    protected = set(range(min(sinks, n))) | set(range(n - min(w, n), n))
    order = sorted((i for i in range(n) if i not in protected), key=lambda i: (pooled[i], i))
    gone = set(order[: n - budget])
    return [p for i, p in enumerate(kept) if i not in gone]


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("policy", ["scissorhands", "h2o", "tova"])
def test_the_first_decode_step_evicts_every_row_by_the_rule_before_attending(policy, backend):
    """When the first decode step's mask is sized, every row holds what the rule keeps
    from the prompt's window (sinks and the window's own positions among them), and the
    step attends over exactly that: its logits equal a cache rebuilt to hold it."""
    model = _model("llama", "eager")
    ids, mask = _prompts(batch=2, length=17, seed=8)
    cache = _cache(model, policy, budget=8, backend=backend)
    for start in range(0, 17, 5):
        hf.prefill(model, cache, ids[:, start:start + 5], attention_mask=mask[:, :min(start + 5, 17)])
    assert cache.stats.prompt_ends == 0 and cache.held_counts().max() > 8
    window = cache._window.copy()
    before = {(layer, b, h): cache.kept_positions(layer, b, h).tolist() for layer in cache.observed_layers
              for b in range(2) for h in range(cache.num_kv_heads)}
    twin = copy.deepcopy(cache)
    cache.get_mask_sizes(1, 0)  # what transformers asks first in a decode step
    assert cache.stats.prompt_ends == 1 and cache._window is None
    for e, layer in enumerate(cache.observed_layers):
        for b in range(2):
            for h in range(cache.num_kv_heads):
                row = (e * 2 + b) * cache.num_kv_heads + h
                kept = before[(layer, b, h)]
                want = _rule(kept, window[row, :, : len(kept)].astype(np.float64), 8, 1, 3)
                assert cache.kept_positions(layer, b, h).tolist() == want
                assert want[0] == kept[0] and want[-3:] == kept[-3:]
    # the step itself: the same logits as the twin, whose eviction happens inside its own step
    token = torch.tensor([5, 6])
    assert torch.equal(hf.decode_step(model, cache, token), hf.decode_step(model, twin, token))
    assert twin.stats.prompt_ends == 1
    assert (cache.held_counts() == twin.held_counts()).all() and cache.held_counts().max() <= 8


class _Watch:
    """After every forward: no row holds more than the cap (prompt) or the budget (decode)."""

    def __init__(self, cache, budget, cap):
        self.cache, self.budget, self.cap, self.decodes = cache, budget, cap, 0

    def __call__(self, module, args, kwargs, output):
        ids = kwargs.get("input_ids")
        held = self.cache.held_counts().max()
        if ids.shape[1] == 1:
            self.decodes += 1
            assert held <= self.budget
        else:
            assert held <= self.cap


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("positions", ["original", "cache"])
def test_generate_equals_a_forward_loop_and_keeps_the_cap_then_the_budget(positions, impl):
    """A ragged batch with chunked prefill: model.generate gives the tokens of a plain loop
    of forwards on a prompt-aware cache; while the prompt is read rows hold at most the
    cap, from the first decode step at most the budget (``positions="cache"`` too)."""
    model = _model("llama", impl)
    ids, mask = _prompts(batch=3, length=21, seed=2)
    kwargs = dict(budget=8, prefill_budget=12, positions=positions)
    cache = _cache(model, **kwargs)
    watch = _Watch(cache, 8, 12)
    handle = model.register_forward_hook(watch, with_kwargs=True)
    try:
        out = _generate(model, cache, ids, mask, do_sample=False, max_new_tokens=10, prefill_chunk_size=6)
    finally:
        handle.remove()
    assert watch.decodes == 9 and cache.stats.prompt_ends == 1
    loop = _cache(model, **kwargs)
    for start in range(0, 21, 6):
        logits = hf.prefill(model, loop, ids[:, start:start + 6], attention_mask=mask[:, :min(start + 6, 21)])[:, -1]
    tokens = []
    for _ in range(10):
        token = logits.argmax(-1)
        tokens.append(token)
        logits = hf.decode_step(model, loop, token)
    expected = torch.stack(tokens, 1)
    finished = (expected == VOCAB - 1).cumsum(1) - (expected == VOCAB - 1).long() > 0
    assert torch.equal(out[:, 21:], expected.masked_fill(finished, PAD))


def test_a_new_turn_after_decoding_is_a_prompt_again():
    """A chat: the second turn is read up to the cap and its end evicts by the rule again
    at the next decode step (two prompt ends), the first turn's window long gone."""
    model = _model("llama", "sdpa")
    cache = _cache(model, budget=8, prefill_budget=30)
    ids = torch.randint(2, VOCAB - 1, (1, 14), generator=torch.Generator().manual_seed(3))
    first = _generate(model, cache, ids, None, do_sample=False, max_new_tokens=5)
    assert cache.stats.prompt_ends == 1 and cache.held_counts().max() <= 8
    turn = torch.randint(2, VOCAB - 1, (1, 9), generator=torch.Generator().manual_seed(4))
    hf.prefill(model, cache, torch.cat([first[:, -1:], turn], 1))  # the last answer token, then the turn
    assert cache.held_counts().max() == 8 + 10 and cache._window is not None
    hf.decode_step(model, cache, 5)
    assert cache.stats.prompt_ends == 2 and cache.held_counts().max() <= 8


def test_beams_reorder_the_window_with_their_sequences():
    """Swapping the two sequences between the prompt and the first step (what beam search
    does) gives each the positions a cache that read them in swapped order keeps; beam
    search itself runs within the budget."""
    model = _model("llama", "eager")
    ids, mask = _prompts(batch=2, length=15, seed=9)
    cache, swapped = _cache(model), _cache(model)
    hf.prefill(model, cache, ids, attention_mask=mask)
    hf.prefill(model, swapped, ids.flip(0), attention_mask=mask.flip(0))
    cache.reorder_cache(torch.tensor([1, 0]))
    for c in (cache, swapped):
        c.get_mask_sizes(1, 0)
    for layer in cache.observed_layers:
        for b in range(2):
            for h in range(cache.num_kv_heads):
                assert cache.kept_positions(layer, b, h).tolist() == swapped.kept_positions(layer, b, h).tolist()
    beams = _cache(model)
    _generate(model, beams, ids, mask, num_beams=3, do_sample=False, max_new_tokens=6)
    assert beams.stats.prompt_ends == 1 and beams.held_counts().max() <= 8


def test_a_copy_continues_identically_and_reset_forgets_the_window():
    """copy.deepcopy between the prompt and the first step: both continue identically and
    independently; reset() forgets the window (the next prompt decides on its own)."""
    model = _model("llama", "eager")
    ids, mask = _prompts(batch=2, length=15, seed=10)
    cache = _cache(model)
    hf.prefill(model, cache, ids, attention_mask=mask)
    twin = copy.deepcopy(cache)
    token = torch.tensor([3, 4])
    assert torch.equal(hf.decode_step(model, cache, token), hf.decode_step(model, twin, token))
    assert cache._window is None and twin._window is None and twin.stats.prompt_ends == 1
    cache.reset()
    fresh = _cache(model)
    other, other_mask = _prompts(batch=1, length=13, seed=11)
    a = hf.prefill(model, cache, other, attention_mask=other_mask)
    b = hf.prefill(model, fresh, other, attention_mask=other_mask)
    assert torch.equal(a, b)
    assert torch.equal(hf.decode_step(model, cache, 3), hf.decode_step(model, fresh, 3))


def test_a_failed_first_decode_step_keeps_the_prompt_end_eviction():
    """A first decode step that raises after its mask was sized: the prompt's end stays
    decided (rows at the budget, one prompt end), the step is undone, and running it again
    gives an untouched twin's logits."""
    model = _model("llama", "sdpa")
    ids, mask = _prompts(batch=2, length=15, seed=12)
    cache = _cache(model)
    hf.prefill(model, cache, ids, attention_mask=mask)
    twin = copy.deepcopy(cache)
    last = cache.observed_layers[-1]

    class Boom(Exception):
        pass

    def observer(layer, weights):
        if layer == last:
            raise Boom

    handle = cache.add_observer(observer)
    with pytest.raises(Boom):
        hf.decode_step(model, cache, torch.tensor([3, 4]))
    handle.remove()
    assert cache.stats.prompt_ends == 1 and cache.held_counts().max() == 8 and cache.seen == 15
    token = torch.tensor([3, 4])
    assert torch.equal(hf.decode_step(model, cache, token), hf.decode_step(model, twin, token))


def test_a_prompt_with_no_decode_step_is_left_as_read():
    """A prompt read and never decoded: nothing more happens (the cap, not the budget)."""
    model = _model("llama", "eager")
    ids, mask = _prompts(batch=2, length=15, seed=13)
    cache = _cache(model)
    hf.prefill(model, cache, ids, attention_mask=mask)
    assert cache.stats.prompt_ends == 0 and cache.held_counts().max() == 15


@pytest.mark.slow  # compiling takes about 20 s (eager backend) on two cores
def test_a_compiled_forward_drives_a_prompt_aware_cache_like_an_uncompiled_one():
    """torch.compile(model.forward) (eager backend) with a prompt-aware cache: the tokens
    of the uncompiled forward, the prompt's end evicting outside the traced graph."""
    from test_hf_state import _compiled_and_plain

    model = _model("llama", "sdpa")
    ids = torch.randint(2, 90, (1, 14), generator=torch.Generator().manual_seed(15))
    plain, compiled, _, cache = _compiled_and_plain(model, lambda: _cache(model), ids)
    assert torch.equal(compiled, plain)
    assert cache.stats.prompt_ends == 1 and cache.held_counts().max() == 8


def test_the_settings_are_true_exactly_when_prompt_aware_is_on():
    """``if cache.prompt_aware:`` reads the switch, not the settings object's existence."""
    from scissorhands.prompt_aware import PromptAware

    assert not PromptAware() and not PromptAware(False, 512, 8, 3)
    assert PromptAware(True)
    model = _model("llama", "eager")
    assert not hf.EvictingCache.from_model(model, "scissorhands", 8, recent_window=2).prompt_aware
    assert hf.EvictingCache.from_model(model, "scissorhands", 8, recent_window=2, prompt_aware=True,
                                       observation_window=3, sinks=1).prompt_aware
