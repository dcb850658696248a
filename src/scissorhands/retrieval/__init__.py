"""Moved to :mod:`scissorhands.commands.retrieval`; this old name re-exports it, and its
``python -m``, ``.model`` and ``.data`` run and are the new modules."""

from scissorhands.commands.retrieval import NLTK_DIR, TASKS_DIR

__all__ = ["NLTK_DIR", "TASKS_DIR"]
