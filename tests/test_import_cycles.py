"""No import cycles among crosshost's own modules: each module's place in the layout (docs/architecture.md)
is its role, and a cycle means two modules share one job. Imports inside functions count too (a lazy
import only hides a cycle); ``from package import module`` is an import of that module alone."""

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


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
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
