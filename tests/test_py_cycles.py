"""The package's modules form no import circle (docs/architecture.md, "Floors"): every
import a module makes, at its top, inside a function or under ``if TYPE_CHECKING:``,
goes to a module that never imports it back, directly or through others.  Type-only
imports count too (a circle through them ties the modules together all the same, and
mypy checks them as one): the cache's and the slot storage's modules name what they
serve by a protocol in a module below them (``hf._cache_state``, ``hf.storage._state``),
not by the class."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "scissorhands"


def module_name(path: pathlib.Path) -> str:
    """``scissorhands.hf.cache`` for src/scissorhands/hf/cache.py (a package: its name)."""
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: pathlib.Path, modules: set[str]) -> set[str]:
    """The package's modules the file at ``path`` imports: ``import x``, ``from x import
    y`` (``y`` itself when it is a module), relative imports resolved, wherever they
    stand (under ``if TYPE_CHECKING:`` too)."""
    name = module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            subs = {f"{module}.{a.name}" for a in node.names} & modules
            found |= subs
            if len(subs) < len(node.names) and module in modules:
                found.add(module)
    return found - {name}


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    paths = {module_name(p): p for p in SRC.rglob("*.py")}
    return {name: imports(path, set(paths)) for name, path in paths.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_scan_sees_imports_at_the_top_inside_functions_type_only_and_relative():
    """The graph holds top-level, relative, function-level and type-only imports."""
    graph = import_graph()
    assert len(graph) > 60
    assert {"scissorhands.hf.layer", "scissorhands.hf.storage"} <= graph["scissorhands.hf.cache"]
    assert "scissorhands.errors" in graph["scissorhands._limits"]
    # prefix imports EvictingLayer inside a function; guards names the cache's protocol for types only
    assert "scissorhands.hf.layer" in graph["scissorhands.hf.prefix"]
    assert "scissorhands.hf._cache_state" in graph["scissorhands.hf.guards"]
    assert "scissorhands.hf.cache" not in graph["scissorhands.hf.layer"]


def test_circles_are_found():
    """The search reports a circle, however long, and nothing else."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert circles(graph) == [["a", "b", "c"]]


def test_no_module_imports_itself_back():
    """No circle among the package's modules, counting every import, type-only ones too."""
    assert circles(import_graph()) == []
