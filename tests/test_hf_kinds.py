"""Kinds of misuse and model variants the cache refuses or handles exactly: a cache driven
by a model of another shape, a grad-enabled forward, rotary variants under
``positions="cache"``, ``output_attentions`` under sdpa, ``copy.copy`` of a used cache,
and ``repr`` of a part-built cache.

On small random models built here and in ``test_hf_dropin.py`` (no download).
"""

from __future__ import annotations

import copy
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
pytest.importorskip("transformers", reason="transformers is not installed (pip install .[hf])")

from test_hf_dropin import PAD, VOCAB, _model, _prompts  # noqa: E402
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

from scissorhands import hf  # noqa: E402
from scissorhands.errors import InvalidInputError  # noqa: E402
from scissorhands.options import PolicyOptions  # noqa: E402

pytestmark = [pytest.mark.hf, pytest.mark.usefixtures("one_torch_thread")]

_BUILT: dict[str, object] = {}


def _llama(layers: int = 2, kv: int = 2, head_dim: int | None = None, rope: dict | None = None,
           dtype: torch.dtype = torch.float32, impl: str = "sdpa") -> object:
    """A small random Llama (built once per shape), set to ``impl``."""
    key = f"{layers}/{kv}/{head_dim}/{rope}/{dtype}"
    if key not in _BUILT:
        torch.manual_seed(0)
        extra = {} if rope is None else {"rope_parameters": rope}
        config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                             num_attention_heads=4, num_key_value_heads=kv, head_dim=head_dim,
                             max_position_embeddings=512, pad_token_id=PAD, **extra)
        _BUILT[key] = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=dtype).eval()
    model = _BUILT[key]
    model.set_attn_implementation(impl)
    return model


def _forward(model, cache, ids):
    with torch.no_grad():
        return model(input_ids=ids, cache=cache, use_cache=True).logits[:, -1]


def _state(cache, memory: bool = True):
    """What a refusal must leave as it was (a copy's buffers may be sized otherwise: ``memory``)."""
    return (cache.seen, cache.batch, cache.held_counts().tolist(), cache.memory_bytes() if memory else None,
            [cache.kept_positions(layer).tolist() for layer in cache.observed_layers] if cache.batch else [])


# ----------------------------------------------------------------------------- another model

OTHERS = {"more layers": dict(layers=3), "fewer layers": dict(layers=1), "another head size": dict(head_dim=8),
          "more KV heads": dict(kv=4), "fewer KV heads": dict(kv=1)}


@pytest.mark.parametrize("reset", [False, True])
@pytest.mark.parametrize("other", list(OTHERS))
def test_a_model_of_another_shape_is_refused_naming_both_and_changes_nothing(other, reset):
    """A cache built for one model, driven by a model of another shape (used, or reset),
    refuses before anything changes, naming both shapes and from_model; its own model
    then continues exactly as a twin that never saw the other."""
    model = _llama()
    ids, _ = _prompts(batch=1, length=9, seed=2)
    cache = hf.EvictingCache.from_model(model, "h2o", 6, recent_window=2)
    _forward(model, cache, ids)
    for t in range(3):
        _forward(model, cache, torch.tensor([[3 + t]]))
    if reset:
        cache.reset()
    twin = copy.deepcopy(cache)
    before = _state(cache)
    stranger = _llama(**OTHERS[other])
    hf.attention.install(stranger)
    for step in (ids, torch.tensor([[5]])):
        with pytest.raises(InvalidInputError, match=r"built for a model of 2 layers \(2 evicting\), 2 KV heads of "
                                                    r"size 16; the model running it .*EvictingCache\.from_model"):
            _forward(stranger, cache, step)
        assert _state(cache) == before
    step = ids if reset else torch.tensor([[7]])
    assert torch.equal(_forward(model, cache, step), _forward(model, twin, step))
    assert _state(cache, memory=False) == _state(twin, memory=False)


def test_the_refusal_of_another_shape_names_the_other_models_layers():
    """The refusal of a three-layer model by a two-layer cache says "3 layers"."""
    cache = hf.EvictingCache.from_model(_llama(), "h2o", 6, recent_window=2)
    stranger = _llama(layers=3)
    hf.attention.install(stranger)
    with pytest.raises(InvalidInputError, match="the model running it has 3 layers"):
        _forward(stranger, cache, torch.tensor([[3, 4, 5]]))
    assert cache.seen == 0 and cache.batch == 0


# ----------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("used", [False, True])
def test_a_grad_enabled_forward_is_refused_before_anything_changes(used):
    """A forward with gradients on (keys and values requiring grad) is refused with a
    clear error, the cache as it was; no_grad and inference_mode forwards then give a
    twin's logits."""
    model = _llama()
    ids, _ = _prompts(batch=1, length=9, seed=2)
    cache = hf.EvictingCache.from_model(model, "h2o", 6, recent_window=2)
    if used:
        _forward(model, cache, ids)
    twin = copy.deepcopy(cache)
    before = _state(cache)
    with torch.enable_grad(), pytest.raises(InvalidInputError, match=r"outside autograd.*no_grad.*require grad"):
        model(input_ids=torch.tensor([[4, 5]]), cache=cache, use_cache=True)
    assert _state(cache) == before
    step = torch.tensor([[6]])
    assert torch.equal(_forward(model, cache, step), _forward(model, twin, step))
    with torch.inference_mode():
        ours = model(input_ids=torch.tensor([[8]]), cache=cache, use_cache=True).logits
        theirs = model(input_ids=torch.tensor([[8]]), cache=twin, use_cache=True).logits
    assert torch.equal(ours, theirs)


# ----------------------------------------------------------------------------- rotary variants

ROPES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
    # An attention factor well away from 1, so that scaling the keys twice shows in bf16.
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128,
             "attention_factor": 2.0},
    "longrope": {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8,
                 "long_factor": [2.0] * 8, "original_max_position_embeddings": 128},
    "llama3": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 128},
    "proportional": {"rope_type": "proportional", "rope_theta": 10000.0},
}


#: The rotary types re-rotated exactly (one fixed frequency table); the others are refused.
EXACT = ("default", "linear", "yarn", "llama3", "proportional")


def _from_scratch_run(model, cache, steps: int = 10) -> float:
    """StreamingLLM (one sink) on a one-layer model: at every decode step after an
    eviction, the largest difference between the cache's logits and a from-scratch
    forward over the kept tokens at ranks 0..n-1 and the new token at n (one layer: a
    key depends only on its token and its rotation)."""
    gen = torch.Generator().manual_seed(7)
    tokens = torch.randint(2, VOCAB - 1, (1, 8 + steps), generator=gen)
    worst = 0.0
    _forward(model, cache, tokens[:, :8])
    for t in range(8, 8 + steps):
        kept = cache.kept_positions(0)
        ours = _forward(model, cache, tokens[:, t:t + 1])
        scratch = torch.cat((tokens[0, torch.from_numpy(kept.astype('int64'))], tokens[0, t:t + 1]))[None]
        with torch.no_grad():
            theirs = model(input_ids=scratch, use_cache=False).logits[:, -1]
        if len(kept) < t:  # positions were evicted: the keys were turned to their ranks
            worst = max(worst, float((ours.float() - theirs.float()).abs().max()))
    return worst


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rope", sorted(set(ROPE_INIT_FUNCTIONS) | {"default"}))
def test_each_rotary_type_turns_exactly_to_the_ranks_or_is_refused_when_built(rope, dtype):
    """positions="cache": every rotary type transformers ships either gives, at each step
    after an eviction, a from-scratch forward's logits at the kept ranks (float32
    rounding; bf16 within its own noise), or is refused by from_model naming the type."""
    assert rope in ROPES, f"a rotary type transformers ships is not exercised here: {rope!r}"
    model = _llama(layers=1, rope=ROPES[rope], dtype=dtype)
    build = lambda: hf.EvictingCache.from_model(model, "streaming-llm", 6, PolicyOptions(sinks=1),  # noqa: E731
                                                positions="cache")
    if rope not in EXACT:
        with pytest.raises(InvalidInputError, match=rf"rotary embedding is '{rope}'.*positions='original'"):
            build()
        return
    worst = _from_scratch_run(model, build())
    assert worst < (1e-4 if dtype == torch.float32 else 0.02), worst


def _gemma3(dtype: torch.dtype) -> object:
    key = f"gemma3/{dtype}"
    if key not in _BUILT:
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig

        torch.manual_seed(0)
        config = Gemma3TextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                  layer_types=["full_attention"], max_position_embeddings=512, pad_token_id=PAD,
                                  query_pre_attn_scalar=16)
        _BUILT[key] = Gemma3ForCausalLM(config).to(dtype).eval()
    model = _BUILT[key]
    model.set_attn_implementation("sdpa")
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemma3s_rotary_module_turns_keys_to_their_ranks(dtype):
    """positions="cache" on Gemma-3 (a rotary module with one table per layer type):
    decode steps after an eviction run, and give a from-scratch forward's logits at the
    kept ranks."""
    model = _gemma3(dtype)
    cache = hf.EvictingCache.from_model(model, "streaming-llm", 6, PolicyOptions(sinks=1), positions="cache")
    worst = _from_scratch_run(model, cache)
    assert worst < (1e-4 if dtype == torch.float32 else 0.02), worst


# ----------------------------------------------------------------------------- output_attentions


def _attentions(model, cache, ids, mask):
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, cache=cache, pad_token_id=PAD,
                             max_new_tokens=8, do_sample=False, output_attentions=True,
                             return_dict_in_generate=True)
    return [[a is None for a in step] for step in out.attentions]


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_output_attentions_are_returned_as_the_implementation_returns_them_before_and_after_eviction(impl):
    """generate(output_attentions=True): each step's attention weights are returned (eager)
    or not (sdpa) exactly as with DynamicCache, before and after eviction starts."""
    model = _model("llama", impl)
    ids, mask = _prompts(batch=2, length=5, seed=3)
    cache = hf.EvictingCache.from_model(model, "h2o", 8, recent_window=2)
    ours = _attentions(model, cache, ids, mask)
    assert cache.held_counts().max() < cache.seen  # eviction started within the call
    assert ours == _attentions(model, DynamicCache(config=model.config), ids, mask)


# ----------------------------------------------------------------------------- copy.copy


def test_a_shallow_copy_of_a_used_cache_is_independent():
    """copy.copy of a used cache is an independent copy: stepping it leaves the original
    as it was (its next step equals a deep copy's), and the copy reports its own length."""
    model = _model("llama", "sdpa")
    ids, _ = _prompts(batch=1, length=9, seed=2)
    cache = hf.EvictingCache.from_model(model, "h2o", 6, recent_window=2)
    _forward(model, cache, ids)
    shallow, deep = copy.copy(cache), copy.deepcopy(cache)
    for t in range(3):
        assert torch.equal(_forward(model, shallow, torch.tensor([[3 + t]])),
                           _forward(model, deep, torch.tensor([[3 + t]])))
    assert shallow.seen == shallow.get_seq_length() == cache.seen + 3
    assert _state(cache, memory=False) != _state(shallow, memory=False)
    twin = hf.EvictingCache.from_model(model, "h2o", 6, recent_window=2)
    _forward(model, twin, ids)
    assert torch.equal(_forward(model, cache, torch.tensor([[9]])), _forward(model, twin, torch.tensor([[9]])))


# ----------------------------------------------------------------------------- repr


def _frames_self(error: BaseException) -> list[object]:
    """The ``self`` of every frame the error passed through (what --showlocals renders)."""
    found, tb = [], error.__traceback__
    while tb is not None:
        if "self" in tb.tb_frame.f_locals:
            found.append(tb.tb_frame.f_locals["self"])
        tb = tb.tb_next
    return found


def test_repr_never_raises_even_for_an_object_whose_constructor_was_refused():
    """repr of an EvictingCache or EvictingLayer whose constructor did not finish (or
    never ran) returns a string naming the class."""
    model = _model("llama", "sdpa")
    try:
        hf.EvictingCache.from_model(model, "h2o", 6, recent_window=99)
    except InvalidInputError as error:
        selves = _frames_self(error)
    else:  # pragma: no cover
        pytest.fail("the constructor took a recent window past the budget")
    selves = [o for o in selves if type(o).__module__.startswith("scissorhands.hf")]
    objects = [*selves, hf.EvictingCache.__new__(hf.EvictingCache),
               sys.modules["scissorhands.hf.cache"].EvictingLayer.__new__(
                   sys.modules["scissorhands.hf.cache"].EvictingLayer)]
    assert any(isinstance(o, hf.EvictingCache) for o in objects)
    for obj in objects:
        assert type(obj).__name__ in repr(obj)
