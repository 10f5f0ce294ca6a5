"""The product's module graph: no import cycles (a cycle works only by import order, and breaks
when someone reorders imports), and ``decoding`` never imports ``lsp_server``.

Every import counts: at module level, under ``if TYPE_CHECKING:`` (a cycle in the types is
still a cycle in the design) and inside functions (an import put off to first use, as torch's
is on the worker threads, runs all the same: a cycle through it is one too).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("decoding", "lsp_server")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(tree: ast.Module, modules: set[str]) -> list[str]:
    """Modules imported anywhere in the module; ``from p import m`` names the submodule ``p.m``
    where that is one, else ``p``."""
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.append(submodule if submodule in modules else node.module)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for imported in imports(ast.parse(path.read_text()), set(modules)):
            if imported in modules and imported != name:
                edges.add(imported)
            # importing a submodule runs its package's __init__ first
            parts = imported.split(".")
            edges.update(
                ".".join(parts[:i])
                for i in range(1, len(parts))
                if ".".join(parts[:i]) in modules
                and ".".join(parts[:i]) != name
                and not name.startswith(".".join(parts[:i]) + ".")
            )
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_sees_real_imports():
    graph = import_graph()
    assert "lsp_server.model_host" in graph["lsp_server.completion"]
    assert "decoding.kv_cache" in graph["decoding.engine.loop"]
    assert "decoding.models.discovery" in graph["lsp_server.__main__"]  # inside a function: torch's laziness


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle or [])


@pytest.mark.parametrize("module", sorted(m for m in import_graph() if m.startswith("decoding")))
def test_decoding_never_imports_lsp_server(module):
    assert not any(m.startswith("lsp_server") for m in import_graph()[module])
