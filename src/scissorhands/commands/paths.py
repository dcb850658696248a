"""The commands' paths, checked before any work: every file a command reads must be a
readable file, every file it writes must go into an existing, writable directory, and a
plot's file name must end in a format matplotlib writes.

Each check returns why the path cannot work, naming the flag and the path the user
gave, or None; :func:`check_inputs_and_outputs` raises the first problem as a
:class:`~scissorhands.errors.ScissorhandsError`.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable
from typing import Any

from scissorhands.errors import ScissorhandsError

__all__ = ["check_inputs_and_outputs", "input_problem", "output_problem", "plot_problem"]


def input_problem(flag: str, path: str | os.PathLike[str] | None, *, text: bool = False) -> str | None:
    """Why the file ``path`` (given as ``flag``) cannot be read, or None.

    With ``text``, the file must also decode as UTF-8 and hold more than whitespace.
    """
    if path is None:
        return None
    shown = f"{flag} {os.fspath(path)}" if flag else os.fspath(path)
    if not os.path.exists(path):
        return f"{shown}: no such file"
    if os.path.isdir(path):
        return f"{shown}: a directory, not a file"
    if not os.access(path, os.R_OK):
        return f"{shown}: not readable"
    if not text:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            content = handle.read()
    except UnicodeDecodeError as exc:
        return f"{shown}: not UTF-8 text ({exc.reason} at byte {exc.start})"
    except OSError as exc:
        return f"{shown}: cannot be read ({exc.strerror or exc})"
    if not content.strip():
        return f"{shown}: the file is empty" if not content else f"{shown}: the file holds only whitespace"
    return None


def output_problem(flag: str, path: str | os.PathLike[str] | None) -> str | None:
    """Why ``path`` (given as ``flag``) cannot be written, or None: its directory must
    exist and be writable, and the path must not be a directory."""
    if path is None:
        return None
    shown = f"{flag} {os.fspath(path)}"
    if os.path.isdir(path):
        return f"{shown}: a directory, not a file"
    directory = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(directory):
        return f"{shown}: the directory {directory} does not exist"
    if not os.access(directory, os.W_OK):
        return f"{shown}: cannot write in {directory}"
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return f"{shown}: the file exists and is not writable"
    return None


def plot_problem(flag: str, path: str | os.PathLike[str] | None) -> str | None:
    """Why ``path`` cannot take a plot, or None: :func:`output_problem`, matplotlib
    importable, and a file name ending in a format it writes (none: PNG)."""
    problem = output_problem(flag, path)
    if problem or path is None:
        return problem
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        return f"{flag} needs matplotlib: pip install 'scissorhands[plot]'"
    extension = os.path.splitext(os.fspath(path))[1].lstrip(".").lower()
    formats = FigureCanvasBase.get_supported_filetypes()
    if extension and extension not in formats:
        return f"{flag} {os.fspath(path)}: matplotlib writes {', '.join(sorted(formats))}, not {extension!r}"
    return None


def check_inputs_and_outputs(inputs: Iterable[tuple[str, Any]] = (), outputs: Iterable[tuple[str, Any]] = (),
                             plots: Iterable[tuple[str, Any]] = (), texts: Iterable[tuple[str, Any]] = ()) -> None:
    """Check every ``(flag, path)`` pair (None paths skipped): ``texts`` as UTF-8 text
    files with content, ``inputs`` as readable files, ``outputs`` as writable files,
    ``plots`` as :func:`plot_problem` does.

    Raises
    ------
    ScissorhandsError
        The first problem found, naming the flag and the path.
    """
    problems = itertools.chain((input_problem(flag, path, text=True) for flag, path in texts),
                               (input_problem(flag, path) for flag, path in inputs),
                               (output_problem(flag, path) for flag, path in outputs),
                               (plot_problem(flag, path) for flag, path in plots))
    for problem in problems:
        if problem:
            raise ScissorhandsError(problem)
