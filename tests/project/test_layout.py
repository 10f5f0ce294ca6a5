"""The product's module graph: imports run one way, from higher layers to lower ones, never in a
cycle, and ``speculative_complete.decoding`` never imports ``speculative_complete.lsp_server``.

A cycle works only by import order, and breaks when someone reorders imports; an import from a
lower layer to a higher one is how a cycle starts, and how a leaf (the drafter interface, the
acceptance rules) stops being one. ``LAYERS`` names the layers, lowest first.

Every import counts: at module level, under ``if TYPE_CHECKING:`` (a cycle in the types is
still a cycle in the design) and inside functions (an import put off to first use, as torch's
is on the worker threads, runs all the same: it is no way around a rule). The imports put off
to first use are held to ``LAZY_IMPORTS``, each with its reason, so a new one is a choice.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOP = "speculative_complete"  # the one top-level package; nothing but its two subpackages
DECODING = f"{TOP}.decoding"
LSP_SERVER = f"{TOP}.lsp_server"
PACKAGES = (TOP, DECODING, LSP_SERVER)  # root packages: each stands for its ``__init__`` only

# The layers, lowest first. A module may import its own unit (the package or module named here
# that holds it) and the units of lower layers; units side by side in one layer are independent of
# each other. A root package (``PACKAGES``) stands for its ``__init__`` only.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("speculative_complete",),  # a docstring: it imports nothing
    # -- decoding: the model side ---------------------------------------------------------------
    (  # names settings choose among; the heap
        "speculative_complete.decoding.choices",
        "speculative_complete.decoding.memory",
    ),
    ("speculative_complete.decoding.forward",),  # a model's forward pass (ModelPass), its layers, kernels
    ("speculative_complete.decoding.models",),  # finding and loading models and tokenizers
    # What the engine and the drafters share, below both so that neither imports the other.
    (
        "speculative_complete.decoding.verify",
        "speculative_complete.decoding.results",
        "speculative_complete.decoding.kv_cache",
        "speculative_complete.decoding.cost_model",
        "speculative_complete.decoding.corpus_index",
    ),
    # Draft, Drafter: what the engine calls a drafter through
    ("speculative_complete.decoding.drafter_interface",),
    ("speculative_complete.decoding.draft_head",),  # the head network, its precision and its training
    (  # the engine sees drafters only through the interface
        "speculative_complete.decoding.drafters",
        "speculative_complete.decoding.engine",
    ),
    (  # the command line; the package's lazy names
        "speculative_complete.decoding.__main__",
        "speculative_complete.decoding",
    ),
    # -- lsp_server: the protocol edge, above all of decoding ------------------------------------
    (  # leaves: no other lsp_server module
        "speculative_complete.lsp_server",
        "speculative_complete.lsp_server.brackets",
        "speculative_complete.lsp_server.documents",
        "speculative_complete.lsp_server.endpoint",
        "speculative_complete.lsp_server.per_document",
        "speculative_complete.lsp_server.request_log",
        "speculative_complete.lsp_server.reuse",
        "speculative_complete.lsp_server.scheduler",
        "speculative_complete.lsp_server.sources",
        "speculative_complete.lsp_server.stats",
    ),
    ("speculative_complete.lsp_server.context",),  # the prompt
    (
        "speculative_complete.lsp_server.ending",
        "speculative_complete.lsp_server.protocol",
        "speculative_complete.lsp_server.workspace",
    ),
    (  # the settings; the suggestion's text
        "speculative_complete.lsp_server.config",
        "speculative_complete.lsp_server.postprocess",
    ),
    ("speculative_complete.lsp_server.runtime_interface",),  # the runtime interface
    (  # the two runtimes
        "speculative_complete.lsp_server.local",
        "speculative_complete.lsp_server.remote",
    ),
    ("speculative_complete.lsp_server.model_host",),
    ("speculative_complete.lsp_server.idle", "speculative_complete.lsp_server.lifecycle"),
    ("speculative_complete.lsp_server.completion",),
    ("speculative_complete.lsp_server.server",),
    ("speculative_complete.lsp_server.__main__",),
)

# Every import of a project module inside a function, (importer, imported): why it waits for the
# first call. A new one fails the test until it is added here with its reason; one that is gone
# fails it until it is removed.
_TORCH_ON_THREADS = "decoding imports torch (seconds): only on the loader and worker threads"
_HTTP_CLIENT = "the HTTP client: only once an endpoint is configured"
_GGUF = "the gguf package: only when a GGUF header is read"
LAZY_IMPORTS: dict[tuple[str, str], str] = {
    (
        "speculative_complete.decoding.forward.model_pass",
        "speculative_complete.decoding.forward.growing_cache",
    ): "transformers' caches: their forward only",
    (
        "speculative_complete.decoding.models.discovery",
        "speculative_complete.decoding.forward.gguf_header",
    ): _GGUF,
    (
        "speculative_complete.decoding.models.discovery",
        "speculative_complete.decoding.forward.shapes",
    ): "a model's shape: to ask if a file runs lean",
    (
        "speculative_complete.decoding.models.loading",
        "speculative_complete.decoding.forward.gguf_header",
    ): _GGUF,
    (
        "speculative_complete.decoding.models.loading",
        "speculative_complete.decoding.forward.gguf_loader",
    ): "the lean forward's kernels: a GGUF it runs",
    (
        "speculative_complete.decoding.models.loading",
        "speculative_complete.decoding.forward.transformers_loader",
    ): "the lean forward: a model quantized at load",
    (
        "speculative_complete.decoding.models.loading",
        "speculative_complete.decoding.forward.graphed",
    ): "CUDA graphs: only on a GPU",
    (
        "speculative_complete.decoding.models.loading",
        "speculative_complete.decoding.models.tokenizer",
    ): "only for a cached tokenizer",
    (
        "speculative_complete.lsp_server.__main__",
        "speculative_complete.lsp_server.protocol",
    ): "pygls' transports: only when serving",
    (
        "speculative_complete.lsp_server.__main__",
        "speculative_complete.lsp_server.server",
    ): "the server: not for --help, --version, --list-models",
    (
        "speculative_complete.lsp_server.__main__",
        "speculative_complete.decoding.models.discovery",
    ): "only for --list-models",
    (
        "speculative_complete.lsp_server.context.token_healing",
        "speculative_complete.decoding.engine.healing",
    ): "only where a prompt is healed",
    ("speculative_complete.lsp_server.local.generation", "speculative_complete.decoding"): _TORCH_ON_THREADS,
    ("speculative_complete.lsp_server.local.loading", "speculative_complete.decoding"): _TORCH_ON_THREADS,
    (
        "speculative_complete.lsp_server.local.loading",
        "speculative_complete.decoding.drafters",
    ): _TORCH_ON_THREADS,
    (
        "speculative_complete.lsp_server.local.loading",
        "speculative_complete.decoding.kv_cache",
    ): "beside the engine it serves, on the loader thread",
    (
        "speculative_complete.lsp_server.local.loading",
        "speculative_complete.decoding.memory",
    ): _TORCH_ON_THREADS,
    (
        "speculative_complete.lsp_server.local.loading",
        "speculative_complete.decoding.models.loading",
    ): _TORCH_ON_THREADS,
    (
        "speculative_complete.lsp_server.local.local_runtime",
        "speculative_complete.decoding.drafters",
    ): _TORCH_ON_THREADS,
    (
        "speculative_complete.lsp_server.local.local_runtime",
        "speculative_complete.decoding.engine.transformers_peer",
    ): _TORCH_ON_THREADS,
    (
        "speculative_complete.lsp_server.model_host",
        "speculative_complete.lsp_server.remote.remote_runtime",
    ): _HTTP_CLIENT,
    (
        "speculative_complete.lsp_server.remote",
        "speculative_complete.lsp_server.remote.engine",
    ): _HTTP_CLIENT,
}


@dataclass(frozen=True)
class Import:
    """One import of a project module, and when it runs."""

    importer: str
    imported: str
    line: int
    function: str | None  # the function it sits in: run at its first call
    typing_only: bool  # under ``if TYPE_CHECKING:``: for the type checker alone
    package_first: bool = False  # a package whose ``__init__`` runs before the module imported

    @property
    def lazy(self) -> bool:
        """Put off to a function's first call: the statement's own module, not the packages
        that run on the way to it."""
        return self.function is not None and not self.typing_only and not self.package_first

    def __str__(self) -> str:
        if self.typing_only:
            where = "under TYPE_CHECKING"
        elif self.function is not None:
            where = f"inside {self.function}()"
        else:
            where = "at module level"
        return f"{self.importer} imports {self.imported} ({where}, line {self.line})"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def project_modules() -> dict[str, Path]:
    return {module_name(p): p for p in (ROOT / TOP).rglob("*.py")}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(
    node: ast.AST, function: str | None = None, typing_only: bool = False
) -> Iterator[tuple[ast.Import | ast.ImportFrom, str | None, bool]]:
    """Every import statement under ``node``, with the function it sits in and whether it is
    under ``if TYPE_CHECKING:`` (its ``else`` runs)."""
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node, function, typing_only
        return
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        function = node.name
    if isinstance(node, ast.If) and _is_type_checking(node.test):
        children = [(child, True) for child in node.body] + [(child, typing_only) for child in node.orelse]
    else:
        children = [(child, typing_only) for child in ast.iter_child_nodes(node)]
    for child, typing in children:
        yield from _import_nodes(child, function, typing)


def imported_names(node: ast.Import | ast.ImportFrom, modules: set[str]) -> list[str]:
    """The modules a statement imports; ``from p import m`` names the submodule ``p.m`` where that
    is one, else ``p``."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not node.module or node.level:
        return []
    return [
        f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names
    ]


def module_imports(name: str, path: Path) -> list[Import]:
    """The project modules ``name`` imports, each with the packages whose ``__init__`` runs first
    (a package's own modules do not run it again)."""
    modules = project_modules()
    found = []
    for node, function, typing_only in _import_nodes(ast.parse(path.read_text())):
        for imported in imported_names(node, set(modules)):
            if imported in modules and imported != name:
                found.append(Import(name, imported, node.lineno, function, typing_only))
            parts = imported.split(".")
            packages = (".".join(parts[:i]) for i in range(1, len(parts)))
            found.extend(
                Import(name, package, node.lineno, function, typing_only, package_first=True)
                for package in packages
                if package in modules and package != name and not name.startswith(package + ".")
            )
    return found


@functools.cache
def all_imports() -> tuple[Import, ...]:
    return tuple(i for name, path in sorted(project_modules().items()) for i in module_imports(name, path))


@functools.cache
def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in project_modules()}
    for found in all_imports():
        graph[found.importer].add(found.imported)
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


def unit_of(module: str) -> str | None:
    """The unit of ``LAYERS`` that holds ``module``: the longest one naming it or a package above
    it (a root package only itself); None where no layer does."""
    units = [unit for layer in LAYERS for unit in layer]
    holding = [u for u in units if module == u or (u not in PACKAGES and module.startswith(u + "."))]
    return max(holding, key=len, default=None)


def layer_of(unit: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if unit in layer)


def broken_rule(found: Import) -> str | None:
    """Why ``found`` breaks the layering, or None where it keeps it."""
    importer, imported = unit_of(found.importer), unit_of(found.imported)
    assert importer is not None and imported is not None, "every module has a layer (tested below)"
    if importer == imported:
        return None
    here, there = layer_of(importer), layer_of(imported)
    if there < here:
        return None
    if there == here:
        return (
            f"{found}: {imported} sits beside {importer} in one layer, and units side by side are independent"
        )
    return f"{found}: {imported} (LAYERS[{there}]) is above {importer} (LAYERS[{here}])"


def test_the_graph_sees_real_imports():
    graph = import_graph()
    assert f"{LSP_SERVER}.model_host" in graph[f"{LSP_SERVER}.completion"]
    assert f"{DECODING}.kv_cache" in graph[f"{DECODING}.engine.loop"]
    # inside a function: torch's laziness
    assert f"{DECODING}.models.discovery" in graph[f"{LSP_SERVER}.__main__"]


def test_the_scan_tells_when_each_import_runs():
    kinds = {(i.importer, i.imported): i for i in all_imports()}
    assert kinds[f"{DECODING}.engine.loop", f"{DECODING}.drafter_interface"].function is None
    assert kinds[f"{DECODING}.engine.healing", f"{DECODING}.kv_cache"].typing_only
    assert kinds[f"{LSP_SERVER}.__main__", f"{DECODING}.models.discovery"].lazy
    assert "inside list_models()" in str(kinds[f"{LSP_SERVER}.__main__", f"{DECODING}.models.discovery"])


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle or [])


@pytest.mark.parametrize(
    "module", sorted(m for m in import_graph() if m == DECODING or m.startswith(DECODING + "."))
)
def test_decoding_never_imports_lsp_server(module):
    assert not any(m == LSP_SERVER or m.startswith(LSP_SERVER + ".") for m in import_graph()[module])


def test_every_module_has_a_layer_and_every_layer_names_modules():
    homeless = sorted(m for m in project_modules() if unit_of(m) is None)
    assert homeless == [], f"modules in no layer of LAYERS (place each where it belongs): {homeless}"
    named = [unit for layer in LAYERS for unit in layer]
    assert len(named) == len(set(named)), "a unit named in two layers"
    stale = sorted(u for u in named if u not in project_modules())
    assert stale == [], f"LAYERS names what is no module or package: {stale}"


def test_imports_run_from_higher_layers_to_lower_ones():
    broken: dict[tuple[str, int, str | None], str] = {}  # one line per statement and unit imported
    for found in all_imports():
        if rule := broken_rule(found):
            broken.setdefault((found.importer, found.line, unit_of(found.imported)), rule)
    assert broken == {}, "imports against the layering (tests/test_layout.py, LAYERS):\n" + "\n".join(
        broken.values()
    )


def test_the_layering_refuses_an_import_upwards_or_sideways():
    def rule(importer: str, imported: str) -> str | None:
        return broken_rule(Import(importer, imported, 1, "f", False))

    assert rule(f"{DECODING}.engine.loop", f"{DECODING}.drafter_interface") is None
    assert "is above" in (rule(f"{DECODING}.verify", f"{DECODING}.engine.loop") or "")
    assert "beside" in (rule(f"{DECODING}.engine.loop", f"{DECODING}.drafters.ngram") or "")
    assert "is above" in (rule(f"{DECODING}.kv_cache", f"{LSP_SERVER}.config") or "")
    assert "is above" in (rule(f"{LSP_SERVER}.config", f"{LSP_SERVER}.remote.remote_runtime") or "")
    assert "is above" in (rule(TOP, f"{DECODING}.results") or ""), "the top package imports nothing"


def test_imports_put_off_to_first_use_are_the_listed_ones():
    lazy = {(i.importer, i.imported): i for i in all_imports() if i.lazy}
    new = [str(lazy[key]) for key in sorted(set(lazy) - set(LAZY_IMPORTS))]
    assert new == [], (
        "imports inside functions not in LAZY_IMPORTS (import at module level, or add each there with "
        "the reason it must wait):\n" + "\n".join(new)
    )
    gone = sorted(set(LAZY_IMPORTS) - set(lazy))
    assert gone == [], f"LAZY_IMPORTS lists imports no function makes any more: {gone}"
