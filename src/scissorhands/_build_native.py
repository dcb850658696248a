"""cffi build script for the C core (``setup.py``'s ``cffi_modules`` hook).

The cdef is ``csrc/scissorhands.h`` itself with its preprocessor lines removed, so the
header stays the single description of the C API. Extra compiler flags for a
warnings-as-errors or sanitizer build come from ``SCISSORHANDS_CFLAGS``.
"""

from __future__ import annotations

import os
import pathlib
import shlex
import sys

from cffi import FFI

CSRC = pathlib.Path(__file__).resolve().parent.parent.parent / "csrc"
#: The C core, one file per role (csrc/sh_internal.h maps them); each uses only those
#: before it in this list.
SOURCES = ["kernels.c", "simd.c", "pins.c", "scissorhands.c", "h2o.c", "streaming_llm.c", "select.c",
           "kinds.c", "policy.c", "state.c", "parallel.c", "step.c", "pools.c", "observe.c",
           "extend.c", "gqa.c", "layout.c"]
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
ffibuilder.cdef(read_cdef(CSRC / "scissorhands.h"))
ffibuilder.set_source(
    "scissorhands._sh_cffi",
    '#include "scissorhands.h"',
    # Relative to the project root, where setuptools runs this hook.
    sources=[f"csrc/{name}" for name in SOURCES],
    include_dirs=["csrc"],
    # The baseline instruction set: the AVX2 kernels (csrc/simd.c) carry their own target
    # attribute and are chosen at run time, so no -march flag belongs here.
    extra_compile_args=["-O3", "-std=c11", *THREADS] + shlex.split(os.environ.get("SCISSORHANDS_CFLAGS", "")),
    extra_link_args=THREADS + shlex.split(os.environ.get("SCISSORHANDS_LDFLAGS", "")),
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
