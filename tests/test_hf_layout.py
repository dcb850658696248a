"""The transformers layer's layout (docs/architecture.md): every module of
src/scissorhands/hf is one concern a reader can hold and no function in it is longer than
a screen of code (its modules' imports form no circle: tests/test_py_cycles.py, for the
whole package)."""

from __future__ import annotations

import pathlib

from test_py_layout import MODULE_LINES, ROOT, SCREEN_LINES, function_lengths

HF = ROOT / "src" / "scissorhands" / "hf"


def modules() -> dict[str, pathlib.Path]:
    """The modules of src/scissorhands/hf by dotted name under it (``cache``,
    ``storage`` for its package's ``__init__``, ``storage.masks``, ...)."""
    found = {}
    for p in sorted(HF.rglob("*.py")):
        parts = p.relative_to(HF).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name:
            found[name] = p
    return found


def test_no_hf_module_is_too_long():
    """Every module of src/scissorhands/hf has at most MODULE_LINES lines."""
    sizes = {str(p.relative_to(HF)): len(p.read_text(encoding="utf-8").splitlines()) for p in modules().values()}
    assert {n: size for n, size in sizes.items() if size > MODULE_LINES} == {}
    assert {"cache.py", "storage/__init__.py", "storage/masks.py", "layer.py", "forward.py"} <= set(sizes)


def test_no_hf_function_is_longer_than_a_screen():
    """Every function of src/scissorhands/hf has at most SCREEN_LINES lines of code."""
    long = {f"{p.name}:{line} {name}": n for p in modules().values()
            for name, line, n in function_lengths(p.read_text(encoding="utf-8")) if n > SCREEN_LINES}
    assert long == {}
