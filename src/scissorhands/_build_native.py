"""cffi build script for the C core (``setup.py``'s ``cffi_modules`` hook).

The cdef is ``csrc/scissorhands.h`` itself with its preprocessor lines removed, so the
header stays the single description of the C API, plus what the build generates from
the policy files ``csrc/policies/<name>.c`` (one per kind, each giving its number on a
``/* sh-kind: N */`` line): ``enum sh_kind`` (``SH_<NAME> = N``, Python's
``lib.SH_<NAME>``), in the cdef and the module's source, and the kinds' table
``sh_kinds`` (csrc/sh_internal.h) in the module's source. Nothing generated is written
to a file of the repository. Extra compiler flags for a warnings-as-errors or sanitizer
build come from ``SCISSORHANDS_CFLAGS``.
"""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import sys

from cffi import FFI

CSRC = pathlib.Path(__file__).resolve().parent.parent.parent / "csrc"
#: The shared C every policy file may use, in order (csrc/sh_internal.h maps the files).
BEFORE_POLICIES = ["kernels.c", "simd.c", "pins.c", "select.c"]
#: The shared C that reads the kinds' table (sh_kinds), after the policies, in order.
AFTER_POLICIES = ["policy.c", "state.c", "parallel.c", "step.c", "pools.c", "observe.c", "extend.c", "gqa.c",
                  "layout.c"]
#: The line of a policy file that gives its kind's number: ``/* sh-kind: 4 */``, on a line
#: of its own. The number is part of the ABI (``sh_config.kind``, ``lib.SH_<NAME>``): a
#: kind keeps it for good, and the build never derives it from the files' order.
KIND_MARKER = re.compile(r"^/\* sh-kind: (\d+) \*/$", re.MULTILINE)
#: The largest kind number: the object keeps its kind in an int8_t.
MAX_KIND = 127


def policy_kinds(csrc: pathlib.Path = CSRC) -> dict[str, int]:
    """The policy kinds: each file ``csrc/policies/<name>.c`` (sorted by name) and the
    number its ``sh-kind`` line gives; its kind is ``SH_<NAME>`` (``name`` upper-cased),
    its operations the ``const sh_kind_ops sh_kind_<name>`` the file defines.

    Raises
    ------
    ValueError
        A file whose name is not a lower-case C identifier, without exactly one
        ``sh-kind`` line, with a number above ``MAX_KIND``, or two files with one number.
    """
    kinds: dict[str, int] = {}
    for path in sorted((csrc / "policies").glob("*.c")):
        marks = KIND_MARKER.findall(path.read_text(encoding="utf-8"))
        if not re.fullmatch(r"[a-z][a-z0-9_]*", path.stem) or len(marks) != 1 or int(marks[0]) > MAX_KIND:
            raise ValueError(f"{path}: needs a lower-case C identifier as its name and one line "
                             f"'/* sh-kind: N */' with N <= {MAX_KIND}, found {marks}")
        if int(marks[0]) in kinds.values():
            raise ValueError(f"{path}: kind number {marks[0]} is taken already")
        kinds[path.stem] = int(marks[0])
    return kinds


def kind_enum(kinds: dict[str, int]) -> str:
    """``enum sh_kind``, one ``SH_<NAME> = number`` per kind in number order: the cdef's
    and the cffi source's (what Python reads as ``lib.SH_<NAME>``)."""
    by_number = sorted(kinds.items(), key=lambda kv: kv[1])
    items = ",\n".join(f"    SH_{name.upper()} = {number}" for name, number in by_number)
    return f"/* Policy kinds (csrc/policies/). */\nenum sh_kind {{\n{items}\n}};\n"


def kind_table(kinds: dict[str, int]) -> str:
    """The C of ``sh_kinds`` and ``sh_kind_count`` (csrc/sh_internal.h): entry ``number``
    of each kind points at its ``sh_kind_<name>``, a number no kind has is NULL, and the
    count is one more than the largest number."""
    count = max(kinds.values(), default=-1) + 1
    lines = ['#include "sh_internal.h"', ""]
    lines += [f"extern const sh_kind_ops sh_kind_{name};" for name in kinds]
    lines += ["", f"const int32_t sh_kind_count = {count};",
              f"const sh_kind_ops *const sh_kinds[{max(count, 1)}] = {{"]
    lines += [f"    [{number}] = &sh_kind_{name}," for name, number in sorted(kinds.items(), key=lambda kv: kv[1])]
    lines += ["};", ""]
    return "\n".join(lines)


KINDS = policy_kinds()
#: The C core, one file per role; each uses only those before it in this list, and the
#: kinds' table (generated into the cffi module) stands between the policies and
#: AFTER_POLICIES.
SOURCES = BEFORE_POLICIES + [f"policies/{name}.c" for name in KINDS] + AFTER_POLICIES
#: POSIX threads for a step's rows (csrc/parallel.c); nothing extra on Windows, where the
#: parts of a step run one after another.
THREADS = [] if sys.platform == "win32" else ["-pthread"]


def read_cdef(header: pathlib.Path) -> str:
    """Return ``header`` as a cdef: without its ``#`` lines (cffi rejects them) and
    without the C++ ``extern "C" { ... }`` guard those lines enclose."""
    keep = []
    for line in header.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or stripped in ('extern "C" {', "}"):
            continue
        keep.append(line)
    return "\n".join(keep)


ffibuilder = FFI()
ffibuilder.cdef(read_cdef(CSRC / "scissorhands.h") + "\n" + kind_enum(KINDS))
ffibuilder.set_source(
    "scissorhands._sh_cffi",
    '#include "scissorhands.h"\n' + kind_enum(KINDS) + kind_table(KINDS),
    # Relative to the project root, where setuptools runs this hook.
    sources=[f"csrc/{name}" for name in SOURCES],
    include_dirs=["csrc"],
    # The baseline instruction set: the AVX2 kernels (csrc/simd.c, csrc/policies/) carry their own target
    # attribute and are chosen at run time, so no -march flag belongs here.
    extra_compile_args=["-O3", "-std=c11", *THREADS] + shlex.split(os.environ.get("SCISSORHANDS_CFLAGS", "")),
    extra_link_args=THREADS + shlex.split(os.environ.get("SCISSORHANDS_LDFLAGS", "")),
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
