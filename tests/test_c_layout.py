"""The C core's layout (docs/architecture.md, docs/adding-a-policy.md): every file is
built, each calls only the files before it in ``SOURCES`` (no circle; the kinds' table
the build generates stands after the policy files), the kinds are the files of
``csrc/policies/`` with their fixed numbers, no C file names a kind's constant, a policy
in a file of its own is named in no other, and no function is longer than a screen."""

from __future__ import annotations

import functools
import pathlib
import re
import runpy
import shutil
import subprocess
from typing import Any

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
CSRC = ROOT / "csrc"
BUILD = ROOT / "src" / "scissorhands" / "_build_native.py"
#: A screen of code: the longest a C function may be, its signature and braces included.
SCREEN_LINES = 60
#: The kinds' numbers: part of the ABI (``sh_config.kind``), never to change.
KIND_NUMBERS = {"full": 0, "streaming_llm": 1, "h2o": 2, "scissorhands": 3, "tova": 4}
#: Kinds whose C is their file alone: named (any case) in no other file of csrc/. The
#: older kinds' names also stand for the shared code's float64 keys (``sh_h2o_key``)
#: and the project itself (``scissorhands.h``); a new policy joins this list.
ONE_FILE_KINDS = ("tova",)
#: The name the generated kinds' table has in the file order.
TABLE = "<the kinds' table>"


@functools.cache
def build() -> dict[str, Any]:
    """The build script's globals (it declares the cdef but compiles nothing)."""
    return runpy.run_path(str(BUILD))


def sources() -> list[str]:
    """``SOURCES`` of the build script, paths relative to csrc/."""
    return list(build()["SOURCES"])


def c_files() -> list[pathlib.Path]:
    """Every C source file under csrc/."""
    return sorted(CSRC.rglob("*.c"))


def ordered(tmp_path: pathlib.Path) -> list[tuple[str, pathlib.Path]]:
    """(name, path) of every translation unit of the build in its order: SOURCES with
    the generated kinds' table (written to tmp_path) after the last policy file."""
    table = tmp_path / "kinds_table.c"
    table.write_text(build()["kind_table"](build()["KINDS"]), encoding="utf-8")
    order = [(name, CSRC / name) for name in sources()]
    last = max(i for i, (name, _) in enumerate(order) if name.startswith("policies/"))
    return order[:last + 1] + [(TABLE, table)] + order[last + 1:]


def nm_rows(source: pathlib.Path, obj: pathlib.Path) -> list[list[str]]:
    """The rows of ``nm`` for ``source`` compiled (-O2, csrc/ on the include path)."""
    subprocess.run(["gcc", "-std=c11", "-O2", "-c", str(source), "-I", str(CSRC), "-o", str(obj)],
                   check=True, capture_output=True)
    out = subprocess.run(["nm", str(obj)], check=True, capture_output=True, text=True).stdout
    return [line.split() for line in out.splitlines()]


def without_comments(text: str) -> str:
    """C source ``text`` with its ``/* */`` and ``//`` comments removed."""
    return re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.DOTALL)


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
    """SOURCES lists exactly the C files under csrc/ (the policy files included)."""
    assert sorted(sources()) == sorted(p.relative_to(CSRC).as_posix() for p in c_files())


def test_the_kinds_are_the_policy_files_with_their_numbers():
    """The build's kinds are the files of csrc/policies/, each with the number its
    sh-kind line gives, and Python reads them as ``lib.SH_<NAME>`` with those numbers."""
    from scissorhands._native import lib

    assert build()["KINDS"] == KIND_NUMBERS
    assert sorted(KIND_NUMBERS) == sorted(p.stem for p in (CSRC / "policies").glob("*.c"))
    assert {name: getattr(lib, "SH_" + name.upper()) for name in KIND_NUMBERS} == KIND_NUMBERS


def test_a_kind_number_comes_from_its_file(tmp_path):
    """A policy file's number is its sh-kind line's, not its place among the files;
    a file without one, or two files with one number, are refused."""
    kinds = build()["policy_kinds"]
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "a.c").write_text("/* sh-kind: 7 */\n", encoding="utf-8")
    (tmp_path / "policies" / "b.c").write_text("/* sh-kind: 2 */\n", encoding="utf-8")
    assert kinds(tmp_path) == {"a": 7, "b": 2}
    table = build()["kind_table"](kinds(tmp_path))
    assert "[2] = &sh_kind_b," in table and "[7] = &sh_kind_a," in table and "sh_kind_count = 8;" in table
    (tmp_path / "policies" / "c.c").write_text("/* sh-kind: 7 */\n", encoding="utf-8")
    with pytest.raises(ValueError, match="taken"):
        kinds(tmp_path)
    (tmp_path / "policies" / "c.c").write_text("/* no number */\n", encoding="utf-8")
    with pytest.raises(ValueError, match="sh-kind"):
        kinds(tmp_path)


@pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("nm") is None, reason="needs gcc and nm")
def test_each_c_file_uses_only_the_files_before_it(tmp_path):
    """Every symbol a C file uses that another C file defines comes from a file before
    it in SOURCES, the generated kinds' table standing after the policy files: the files
    form no circle. Each policy file defines its kind's entry, which the table uses."""
    order = ordered(tmp_path)
    names = [name for name, _ in order]
    defined: dict[str, str] = {}
    used: dict[str, set[str]] = {}
    for i, (name, path) in enumerate(order):
        rows = nm_rows(path, tmp_path / f"{i}.o")
        used[name] = {r[-1] for r in rows if r[-2] == "U"}
        for r in rows:
            if r[-2] in "TDRB":
                defined[r[-1]] = name
    late = {name: sorted({defined[s] for s in used[name] if s in defined and names.index(defined[s]) >= i})
            for i, name in enumerate(names)}
    assert {name: files for name, files in late.items() if files} == {}
    assert {defined.get(f"sh_kind_{kind}") for kind in KIND_NUMBERS} == {f"policies/{k}.c" for k in KIND_NUMBERS}
    assert {f"sh_kind_{kind}" for kind in KIND_NUMBERS} <= used[TABLE]
    assert defined["sh_kinds"] == TABLE and "sh_kinds" in used["policy.c"]


#: The first line of a header's inline function: ``static inline``, after any attributes
#: (``AVX2 static inline``, ``__attribute__((...)) static inline``).
INLINE_START = re.compile(r"^(?:(?:[A-Z][A-Z0-9_]*|__attribute__\(\(.*?\)\))\s+)*static\s+inline\b")


def _inline_calls(text: str) -> set[str]:
    """Every name called inside the bodies of the ``static inline`` functions of header
    ``text``, those with attributes before ``static`` included."""
    called: set[str] = set()
    depth, inside = 0, False
    for line in text.splitlines():
        if INLINE_START.match(line):
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
    for i, (_, path) in enumerate(ordered(tmp_path)):
        defined |= {r[-1] for r in nm_rows(path, tmp_path / f"{i}.o") if r[-2] == "T"}
    headers = sorted(CSRC.rglob("*.h"))
    calls = {h.name: sorted(_inline_calls(h.read_text(encoding="utf-8")) & defined) for h in headers}
    assert {h: names for h, names in calls.items() if names} == {}
    seen = {h.name: _inline_calls(h.read_text(encoding="utf-8")) for h in headers}
    assert seen["sh_internal.h"] and not seen["scissorhands.h"]  # the parser sees bodies (the API has none)
    assert {"_mm256_min_epu32", "store8"} <= seen["sh_avx2.h"]  # attributed ones too


def test_no_c_file_names_a_kind():
    """No C code (comments aside) names a kind's SH_ constant: the shared code reads the
    kind's entry in sh_kinds, and the constants exist only in the cdef the build
    generates."""
    pattern = re.compile(r"\bSH_(" + "|".join(name.upper() for name in KIND_NUMBERS) + r")\b")
    code = {p.relative_to(CSRC).as_posix(): without_comments(p.read_text(encoding="utf-8"))
            for p in sorted(CSRC.rglob("*.[ch]"))}
    named = {name: sorted(set(pattern.findall(text))) for name, text in code.items()}
    assert {name: kinds for name, kinds in named.items() if kinds} == {}


@pytest.mark.parametrize("kind", ONE_FILE_KINDS)
def test_a_policy_file_is_the_only_one_naming_its_policy(kind):
    """The C of a kind in ONE_FILE_KINDS is its file alone: no other file of csrc/
    names it, in any case, even in a comment."""
    pattern = re.compile(kind, re.IGNORECASE)
    naming = sorted(p.relative_to(CSRC).as_posix() for p in CSRC.rglob("*") if p.is_file()
                    and pattern.search(p.read_text(encoding="utf-8")))
    assert naming == [f"policies/{kind}.c"]


def test_no_c_function_is_longer_than_a_screen():
    """Every C function fits in SCREEN_LINES lines."""
    long = {f"{p.relative_to(CSRC)}:{fn}": n for p in c_files()
            for fn, n in functions(p.read_text(encoding="utf-8")) if n > SCREEN_LINES}
    assert long == {}
    assert len([f for p in c_files() for f in functions(p.read_text(encoding="utf-8"))]) > 100
