"""``python -m scissorhands.commands.retrieval``: lm-eval's own command line (``lm_eval``), with the
``scissorhands`` model registered and the package's tasks on the include path, run
without lm-eval's lines that read as errors and are not
(:func:`scissorhands.commands.retrieval.model.quiet_lm_eval`).

lm-eval 0.4.13 finds a model only by name in its own table or in a module already
imported (``@register_model`` runs at import); its registry reads no installed entry
points, so ``lm_eval --model scissorhands`` itself cannot see this package.  This command
imports :mod:`scissorhands.commands.retrieval.model` first, adds ``--include_path`` with
:data:`scissorhands.commands.retrieval.TASKS_DIR` (unless one is given), sets ``HF_HUB_OFFLINE=1``
and ``HF_DATASETS_OFFLINE=1`` unless set, gives the tasks the model's own tokenizer (the
``tokenizer`` RULER's tasks and the package's read from ``--metadata``, saved to a
temporary folder from ``pretrained``, or the default model, unless given), and hands
every argument to lm-eval::

    python -m scissorhands.commands.retrieval --model scissorhands --model_args policy=recommended,budget=128 \\
        --tasks niah_single_1,sh_prose_needle --metadata '{"max_seq_lengths": [512]}'
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence

from . import TASKS_DIR

#: lm-eval's subcommands that take ``--include_path``.
_WITH_INCLUDE = ("run", "ls")


def lm_eval_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` as lm-eval's command line gets it: ``--include_path`` with the package's
    tasks added to a ``run`` or ``ls`` (or a bare ``--model ...``, which lm-eval reads as
    ``run``) that gives none."""
    args = list(argv)
    if not args or any(a == "--include_path" or a.startswith("--include_path=") for a in args):
        return args
    if args[0] in _WITH_INCLUDE:
        return [args[0], "--include_path", TASKS_DIR, *args[1:]]
    if args[0].startswith("-") and args[0] not in ("-h", "--help"):
        return ["run", "--include_path", TASKS_DIR, *args]
    return args


def _flag(args: Sequence[str], name: str) -> tuple[int, str] | None:
    """Where ``name`` is given in ``args`` (its index) and its value, or None."""
    for index, arg in enumerate(args):
        if arg == name and index + 1 < len(args):
            return index, args[index + 1]
        if arg.startswith(name + "="):
            return index, arg[len(name) + 1:]
    return None


def _model_args(text: str) -> dict[str, str]:
    """``--model_args`` as text (``a=1,b=x``), values unparsed."""
    pairs = (item.split("=", 1) for item in text.split(",") if "=" in item)
    return {key.strip(): value.strip() for key, value in pairs}


@contextlib.contextmanager
def with_tokenizer(args: Sequence[str]) -> Iterator[list[str]]:
    """``args`` with ``"tokenizer"`` in ``--metadata`` for a run of the ``scissorhands``
    model that names none there or in ``--model_args``: the tokenizer of its
    ``pretrained`` model (or the default), saved to a folder that lives as long as the
    block.  RULER's tasks size their prompts with it, and they would otherwise look
    ``pretrained`` up on the Hub, where a registry name or a GGUF file is not."""
    out = list(args)
    model = _flag(out, "--model")
    if model is None or model[1] != "scissorhands" or any(a in ("-h", "--help") for a in out):
        yield out
        return
    given = _flag(out, "--model_args")
    model_args = _model_args(given[1]) if given else {}
    found = _flag(out, "--metadata")
    try:
        metadata = json.loads(found[1]) if found else {}
    except ValueError:
        metadata = None  # not JSON (a file path): lm-eval reads it, as given
    if not isinstance(metadata, dict) or "tokenizer" in metadata or "tokenizer" in model_args:
        yield out
        return
    from scissorhands.hf.loading import load_tokenizer

    tokenizer = load_tokenizer(model_args.get("pretrained") or None)
    with tempfile.TemporaryDirectory(prefix="scissorhands-tokenizer-") as folder:
        tokenizer.save_pretrained(folder)
        text = json.dumps({**metadata, "tokenizer": folder})
        if found:
            out[found[0]:found[0] + (1 if out[found[0]].startswith("--metadata=") else 2)] = ["--metadata", text]
        else:
            out += ["--metadata", text]
        yield out


def main(argv: Sequence[str] | None = None) -> None:
    """Run lm-eval's command line with the model registered (exits as lm-eval does)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    from lm_eval.__main__ import cli_evaluate

    from .model import quiet_lm_eval  # registers "scissorhands"

    with quiet_lm_eval(), with_tokenizer(lm_eval_argv(sys.argv[1:] if argv is None else argv)) as args:
        sys.argv = ["lm-eval", *args]
        cli_evaluate()


if __name__ == "__main__":
    main()
