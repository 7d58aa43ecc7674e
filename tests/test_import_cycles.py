"""No import cycles among crosshost's own modules: each module's place in the layout (docs/architecture.md)
is its role, and a cycle means two modules share one job. Imports inside functions count too (a lazy
import only hides a cycle); ``from package import module`` is an import of that module alone; an
import under ``if TYPE_CHECKING:`` is for annotations only and never runs, so it is not one."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("orchestrator", "agent_runner")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node but those under ``if TYPE_CHECKING:``."""
    found: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        found.append(node)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return found


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _runtime_nodes(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges[name] |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, up level - 1
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parent + ([base] if base else []))
                subs = {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules}
                edges[name] |= subs
                if len(subs) < len(node.names) and base in modules:
                    edges[name].add(base)
        edges[name].discard(name)
    return edges


def _cycle_through(start: str, edges: dict[str, set[str]]) -> list[str] | None:
    """A shortest import path from ``start`` back to itself, if any."""
    paths = {start: [start]}
    todo = [start]
    while todo:
        here = todo.pop(0)
        for there in sorted(edges[here]):
            if there == start:
                return paths[here] + [start]
            if there not in paths:
                paths[there] = paths[here] + [there]
                todo.append(there)
    return None


def test_no_module_imports_itself_through_others() -> None:
    edges = _imports(_modules())
    cycles = {tuple(c) for name in edges if (c := _cycle_through(name, edges))}
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in sorted(cycles))


def test_a_cycle_is_found_and_a_chain_is_not() -> None:
    edges = {"p.a": {"p.b"}, "p.b": {"p.a"}, "p.c": {"p.a"}}
    assert _cycle_through("p.a", edges) == ["p.a", "p.b", "p.a"]
    assert _cycle_through("p.c", edges) is None


def test_an_import_for_annotations_only_is_not_a_runtime_import() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import p.b\nimport p.c\n")
    assert {a.name for n in _runtime_nodes(tree) if isinstance(n, ast.Import) for a in n.names} == {"p.c"}
