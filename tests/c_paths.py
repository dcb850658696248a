"""The C core's two kernel paths, for the suites that run on both.

The hot loops have a portable scalar form and an AVX2 form chosen at run time; their
results must be bit-identical. ``lib.sh_set_simd(0)`` forces the scalar form for the
calls that start after it (a process-wide switch, for tests), ``lib.sh_set_simd(1)``
gives the AVX2 form back where the CPU has it. The vector, differential and semantics
suites run the C-backed policies once on each path:

* ``BACKEND_PATHS`` replaces the two backends of ``conftest`` by three: ``native``
  (the kernels this CPU runs by default), ``native-scalar`` (forced scalar) and
  ``reference``; a suite overrides its ``backend`` fixture with :func:`backend_on`.
* ``PATHS`` (``simd``, ``scalar``) parametrises tests that drive both backends at once.

On a CPU without AVX2 both paths are the scalar one, and the tests still pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
from conftest import load_backend

from scissorhands._native import lib

#: The kernel paths: the default (AVX2 where the CPU has it) and forced scalar.
PATHS = ("simd", "scalar")
#: The backends of the suites that run the C path on both kernel paths.
BACKEND_PATHS = ("native", "native-scalar", "reference")


@contextmanager
def on_path(path: str) -> Iterator[None]:
    """Run the body with the C kernels of ``path`` (``simd`` or ``scalar``), then
    restore the previous setting."""
    if path not in PATHS:
        raise ValueError(f"unknown kernel path {path!r}")
    before = lib.sh_set_simd(1 if path == "simd" else 0)
    try:
        yield
    finally:
        lib.sh_set_simd(before)


@contextmanager
def backend_on(name: str) -> Iterator[SimpleNamespace]:
    """The backend ``name`` of :data:`BACKEND_PATHS`, its C calls on the matching path."""
    if name not in BACKEND_PATHS:
        raise ValueError(f"unknown backend {name!r}")
    with on_path(path_of(name)):
        yield load_backend(base_backend(name))


@pytest.fixture(params=BACKEND_PATHS, name="backend")
def backend_fixture(request: pytest.FixtureRequest) -> Iterator[SimpleNamespace]:
    """Each backend in turn, the C path twice: on the kernels this CPU runs by default
    (AVX2 where it has it) and on the forced scalar kernels (their results must be
    identical). A suite imports it to replace ``conftest``'s ``backend`` fixture."""
    with backend_on(request.param) as b:
        yield b


def path_of(backend_name: str) -> str:
    """The kernel path a :data:`BACKEND_PATHS` name runs on (the reference's is moot)."""
    return "scalar" if backend_name == "native-scalar" else "simd"


def base_backend(backend_name: str) -> str:
    """The ``conftest`` backend (``native`` or ``reference``) of a :data:`BACKEND_PATHS` name."""
    return "reference" if backend_name == "reference" else "native"
