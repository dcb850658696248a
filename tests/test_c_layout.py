"""The C core's layout (docs/architecture.md, docs/adding-a-policy.md): every file is
built, each calls only the files before it in ``SOURCES`` (no circle), only
``kinds.c`` names the policy kinds, and no function is longer than a screen."""

from __future__ import annotations

import ast
import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
CSRC = ROOT / "csrc"
BUILD = ROOT / "src" / "scissorhands" / "_build_native.py"
#: A screen of code: the longest a C function may be, its signature and braces included.
SCREEN_LINES = 60
KINDS = ("SH_FULL", "SH_STREAMING_LLM", "SH_H2O", "SH_SCISSORHANDS", "SH_TOVA")


def sources() -> list[str]:
    """``SOURCES`` of the build script, read without running it."""
    for node in ast.walk(ast.parse(BUILD.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SOURCES" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError("no SOURCES in the build script")


def functions(text: str) -> list[tuple[str, int]]:
    """(name, lines) of every function defined in C source ``text``: from its signature's
    first line at column 0 to its closing brace at column 0."""
    found = []
    start, name = None, ""
    for i, line in enumerate(text.splitlines()):
        if start is None:
            m = re.match(r"[A-Za-z_].*?(\w+)\s*\(", line)
            if m and not line.rstrip().endswith(";") and not line.startswith(("typedef", "#")):
                start, name = i, m.group(1)
        elif line.startswith("}"):
            found.append((name, i - start + 1))
            start = None
    return found


def test_every_c_file_is_built():
    """SOURCES lists exactly the C files in csrc/."""
    assert sorted(sources()) == sorted(p.name for p in CSRC.glob("*.c"))


@pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("nm") is None, reason="needs gcc and nm")
def test_each_c_file_uses_only_the_files_before_it(tmp_path):
    """Every symbol a C file uses that another C file defines comes from a file before
    it in SOURCES: the files form no circle."""
    order = sources()
    defined: dict[str, str] = {}
    used: dict[str, set[str]] = {}
    for name in order:
        obj = tmp_path / (name + ".o")
        subprocess.run(["gcc", "-std=c11", "-O2", "-c", str(CSRC / name), "-I", str(CSRC), "-o", str(obj)],
                       check=True, capture_output=True)
        rows = [line.split() for line in subprocess.run(["nm", str(obj)], check=True, capture_output=True,
                                                        text=True).stdout.splitlines()]
        used[name] = {r[-1] for r in rows if r[-2] == "U"}
        for r in rows:
            if r[-2] in "TDRB":
                defined[r[-1]] = name
    late = {name: sorted({defined[s] for s in used[name] if s in defined and order.index(defined[s]) >= i})
            for i, name in enumerate(order)}
    assert {name: files for name, files in late.items() if files} == {}


def _inline_calls(text: str) -> set[str]:
    """Every name called inside the bodies of the ``static inline`` functions of header
    ``text``."""
    called: set[str] = set()
    depth, inside = 0, False
    for line in text.splitlines():
        if line.startswith("static inline"):
            inside = True
        if inside:
            if depth:
                called.update(re.findall(r"\b(\w+)\s*\(", line))
            depth += line.count("{") - line.count("}")
            if depth == 0 and "}" in line:
                inside = False
    return called


@pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("nm") is None, reason="needs gcc and nm")
def test_no_header_calls_a_function_of_a_c_file(tmp_path):
    """A header's inline functions call no function a C file defines: every file that
    includes the header would use that file, wherever it stands in SOURCES (the circle
    nm does not see: pins.c -> sh_internal.h -> policy.c -> pins.c)."""
    defined = set()
    for name in sources():
        obj = tmp_path / (name + ".o")
        subprocess.run(["gcc", "-std=c11", "-O2", "-c", str(CSRC / name), "-I", str(CSRC), "-o", str(obj)],
                       check=True, capture_output=True)
        defined |= {r[-1] for r in (line.split() for line in subprocess.run(
            ["nm", str(obj)], check=True, capture_output=True, text=True).stdout.splitlines()) if r[-2] == "T"}
    calls = {h.name: sorted(_inline_calls(h.read_text(encoding="utf-8")) & defined) for h in CSRC.glob("*.h")}
    assert {h: names for h, names in calls.items() if names} == {}
    assert any(_inline_calls(h.read_text(encoding="utf-8")) for h in CSRC.glob("*.h"))  # the parser sees bodies


def test_only_the_kind_table_names_the_kinds():
    """No C file but kinds.c tests or names a policy kind: the shared code reads the
    kind's entry in sh_kinds instead."""
    pattern = re.compile(r"\b(" + "|".join(KINDS) + r")\b")
    named = {p.name: sorted(set(pattern.findall(p.read_text(encoding="utf-8"))))
             for p in CSRC.glob("*.c") if p.name != "kinds.c"}
    assert {name: kinds for name, kinds in named.items() if kinds} == {}


def test_no_c_function_is_longer_than_a_screen():
    """Every C function fits in SCREEN_LINES lines."""
    long = {f"{p.name}:{fn}": n for p in CSRC.glob("*.c")
            for fn, n in functions(p.read_text(encoding="utf-8")) if n > SCREEN_LINES}
    assert long == {}
    assert len([f for p in CSRC.glob("*.c") for f in functions(p.read_text(encoding="utf-8"))]) > 100
