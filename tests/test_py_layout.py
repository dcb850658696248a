"""The Python layout (docs/architecture.md): no function in the policies, the reference,
the benchmarks or the vectors' generator is longer than a screen of code, and the
policies' shared machinery is split by concern into modules a reader can hold."""

from __future__ import annotations

import ast
import io
import pathlib
import tokenize

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: The directories and files held to the rule (the commands and the transformers cache
#: are not yet).
CHECKED = [ROOT / "src" / "scissorhands" / "policies", *sorted((ROOT / "src" / "scissorhands").glob("reference*.py")),
           ROOT / "bench", ROOT / "vectors"]
#: A screen of code: the most lines of code a function may have, its docstring, comments
#: and blank lines not counted (a nested function counts in its parent too).
SCREEN_LINES = 60
#: The most lines a module of src/scissorhands/policies may have.
MODULE_LINES = 500


def python_files() -> list[pathlib.Path]:
    """Every Python file under CHECKED."""
    return sorted(f for p in CHECKED for f in ([p] if p.is_file() else p.rglob("*.py")))


def function_lengths(text: str) -> list[tuple[str, int, int]]:
    """(name, first line, lines of code) of every function in Python source ``text``."""
    tree = ast.parse(text)
    code: set[int] = set()
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in skip:
            code.update(range(tok.start[0], tok.end[0] + 1))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = set(range(node.lineno, (node.end_lineno or node.lineno) + 1)) & code
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                lines -= set(range(first.lineno, (first.end_lineno or first.lineno) + 1))
            found.append((node.name, node.lineno, len(lines)))
    return found


def test_no_python_function_is_longer_than_a_screen():
    """Every function of the policies, the reference, bench/ and vectors/ has at most
    SCREEN_LINES lines of code."""
    files = python_files()
    long = {f"{f.relative_to(ROOT)}:{line} {name}": n for f in files
            for name, line, n in function_lengths(f.read_text(encoding="utf-8")) if n > SCREEN_LINES}
    assert long == {}
    assert sum(len(function_lengths(f.read_text(encoding="utf-8"))) for f in files) > 300  # the walk sees them


def test_function_lengths_count_code_only():
    """The measure counts a function's code lines: not its docstring, comments or blanks."""
    text = 'def f():\n    """Doc.\n\n    More."""\n    # a comment\n\n    x = (1,\n         2)\n    return x\n'
    assert function_lengths(text) == [("f", 1, 4)]


def test_no_policies_module_is_too_long():
    """Every module of src/scissorhands/policies has at most MODULE_LINES lines."""
    sizes = {p.name: len(p.read_text(encoding="utf-8").splitlines())
             for p in (ROOT / "src" / "scissorhands" / "policies").glob("*.py")}
    assert {name: n for name, n in sizes.items() if n > MODULE_LINES} == {}
