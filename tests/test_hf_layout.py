"""The transformers layer's layout (docs/architecture.md): every module of
src/scissorhands/hf is one concern a reader can hold, no function in it is longer than a
screen of code, and its modules import each other without a cycle."""

from __future__ import annotations

import ast
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


def _package(name: str, path: pathlib.Path) -> list[str]:
    """The dotted package (under hf/) that relative imports in module ``name`` start from."""
    parts = name.split(".") if name else []
    return parts if path.name == "__init__.py" else parts[:-1]


def runtime_imports(name: str, path: pathlib.Path) -> set[str]:
    """The modules of hf/ that module ``name`` (at ``path``) imports when it is imported:
    its top-level ``from . import x``, ``from .x import ...``, ``from ..x import ...``
    (and ``from scissorhands.hf.x ...``), not those under ``if TYPE_CHECKING:``
    (annotations only) nor inside functions."""
    found: set[str] = set()
    ours = set(modules())
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if not isinstance(node, ast.ImportFrom):
            continue
        module = node.module or ""
        if node.level >= 1:
            package, up = _package(name, path), node.level - 1
            if up > len(package):
                continue  # above hf/: the library, not a room of hf
            base = package[:len(package) - up]
            target = [*base, *module.split(".")] if module else base
            candidates = [".".join(target)] if module else []
            candidates += [".".join([*target, alias.name]) for alias in node.names]
        elif module.startswith("scissorhands.hf."):
            target = module.split(".")[2:]
            candidates = [".".join(target)] + [".".join([*target, a.name]) for a in node.names]
        else:
            continue
        for c in candidates:
            while c and c not in ours:
                c = c.rpartition(".")[0]
            if c and c != name:
                found.add(c)
    return found & ours


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


def test_hf_modules_import_each_other_without_a_cycle():
    """The modules of hf/ form layers: following their imports (at import time) never
    leads back to where it started."""
    graph = {name: runtime_imports(name, path) for name, path in modules().items()}
    assert "storage" in graph["cache"] and "layer" in graph["forward"]  # the walk sees them
    assert "storage.masks" in graph["storage"] and "storage.arrays" in graph["storage.masks"]
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, " -> ".join((*path, name))
        if name in done:
            return
        for imported in sorted(graph[name]):
            visit(imported, (*path, name))
        done.add(name)

    for name in sorted(graph):
        visit(name, ())
