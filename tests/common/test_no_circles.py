"""No import circle among the ``streamrec`` modules, hidden ones included.

The graph is built from every module's AST: imports at module level AND inside functions
(an import moved into a function to dodge a circle still is one). Imports under
``if TYPE_CHECKING:`` are left out: they never run, so they close no circle at run time.
A package is not implied by importing its submodule (Python has it loaded already).
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _modules() -> dict[str, Path]:
    """Every ``streamrec`` module name -> its source file (pyproject's package-dir)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping: dict[str, str] = pyproject["tool"]["setuptools"]["package-dir"]
    out: dict[str, Path] = {}
    for package, folder in mapping.items():
        for source in (ROOT / folder).glob("*.py"):
            out[package if source.stem == "__init__" else f"{package}.{source.stem}"] = source
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The ``known`` modules that ``tree`` (module ``module``) imports, anywhere in it."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            # ``from pkg import sub`` imports the submodule; ``from mod import name`` the module
            subs = {f"{base}.{alias.name}" for alias in node.names} & known
            found.update(subs if subs else {base})
        todo.extend(ast.iter_child_nodes(node))
    return {name for name in found if name in known and name != module}


def import_graph() -> dict[str, set[str]]:
    """module -> the streamrec modules it imports (module level and inside functions)."""
    modules = _modules()
    known = set(modules)
    return {
        name: _imported(
            ast.parse(path.read_text(), str(path)), name, path.stem == "__init__", known
        )
        for name, path in modules.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (``a -> b -> ... -> a``) per strongly connected component of two or more
    modules (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
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
                    components.append(sorted(component))
    return [_a_cycle(graph, set(c)) for c in components]


def _a_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle through the first module of ``component`` (breadth first)."""
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & component):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle in the component {sorted(component)}")


def test_the_graph_sees_imports_inside_functions():
    graph = import_graph()
    # a known import made inside a function (the store loads its CUDA build lazily)
    assert len(graph) > 100 and "streamrec.embedding_store.store" in graph
    assert any(graph.values())


def test_cycles_are_found_and_printed():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"x": {"y"}, "y": set()}) == []


def test_function_level_and_type_checking_imports():
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import b\n"
        "if TYPE_CHECKING:\n"
        "    from pkg import c\n"
        "def f():\n"
        "    from pkg.d import thing\n"
        "    import pkg.e\n"
    )
    known = {"pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.d", "pkg.e"}
    assert _imported(ast.parse(source), "pkg.a", False, known) == {"pkg.b", "pkg.d", "pkg.e"}


#: Circles still to break (each hidden by an import inside a function); the list only shrinks:
#: none left. A new circle is broken by moving what both sides share into a module below them.
KNOWN: set[tuple[str, ...]] = set()


def test_no_import_circle_in_streamrec():
    found = cycles(import_graph())
    new = [c for c in found if tuple(sorted(set(c))) not in KNOWN]
    assert not new, "import circles:\n" + "\n".join(" -> ".join(c) for c in new)
    broken = KNOWN - {tuple(sorted(set(c))) for c in found}
    assert not broken, f"circles broken, take them off KNOWN: {sorted(broken)}"
