"""Retrieval measured the field's way: lm-evaluation-harness with an evicting cache.

Three parts, each importable on its own:

:mod:`.config`
    A cache configuration as ``--model_args`` give it (``policy=h2o,budget=256,...``),
    parsed and checked through :mod:`scissorhands.options` before any model loads; no
    lm-eval, no torch.
:mod:`.data`
    The package's own tasks' generators (a question in a later turn, a fact stated once
    against the same fact restated, needles in real prose): seeded, offline, plain
    Python; :data:`TASKS_DIR` holds their lm-eval task YAMLs.
:mod:`.model`
    The lm-eval model ``scissorhands`` (a subclass of lm-eval's ``HFLM``): every request,
    generation and log-likelihood alike, runs with a fresh
    :class:`~scissorhands.hf.EvictingCache`.  Importing it registers the model; it is the
    only module that imports lm-eval (the ``tasks`` extra: ``pip install
    'scissorhands[tasks]'``).

``python -m scissorhands.commands.retrieval`` is lm-eval's own command line (``lm_eval``) with the
model registered and :data:`TASKS_DIR` on its include path; ``python -m scissorhands
tasks`` runs the published grid (:mod:`.driver`).  See ``docs/tasks.md``.
"""

from __future__ import annotations

import os

__all__ = ["NLTK_DIR", "TASKS_DIR"]

#: The package's lm-eval task YAMLs (``--include_path``).
TASKS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tasks")
#: An NLTK data directory holding only the name ``tokenizers/punkt_tab``: lm-eval's RULER
#: generators look that resource up at import and download it when absent, though only
#: the essay haystacks (which download essays too, and are not run here) use it.
NLTK_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nltk_data")
