"""``python -m scissorhands.retrieval``: lm-eval's own command line (``lm_eval``), with the
``scissorhands`` model registered and the package's tasks on the include path.

lm-eval 0.4.13 finds a model only by name in its own table or in a module already
imported (``@register_model`` runs at import); its registry reads no installed entry
points, so ``lm_eval --model scissorhands`` itself cannot see this package.  This command
imports :mod:`scissorhands.retrieval.model` first, adds ``--include_path`` with
:data:`scissorhands.retrieval.TASKS_DIR` (unless one is given), sets ``HF_HUB_OFFLINE=1``
and ``HF_DATASETS_OFFLINE=1`` unless set, and hands every argument to lm-eval::

    python -m scissorhands.retrieval --model scissorhands \\
        --model_args policy=scissorhands,budget=128,recent_window=0.75,sinks=4 \\
        --tasks niah_single_1,sh_prose_needle --metadata '{"max_seq_lengths": [512], "tokenizer": "DIR"}'
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

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


def main(argv: Sequence[str] | None = None) -> None:
    """Run lm-eval's command line with the model registered (exits as lm-eval does)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    from lm_eval.__main__ import cli_evaluate

    from . import model  # noqa: F401  (registers "scissorhands")

    sys.argv = ["lm-eval", *lm_eval_argv(sys.argv[1:] if argv is None else argv)]
    cli_evaluate()


if __name__ == "__main__":
    main()
