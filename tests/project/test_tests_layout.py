"""The tests' own layout: folders that mirror the packages, and helpers in one place.

The tests of ``speculative_complete/decoding/`` and ``speculative_complete/lsp_server/`` live in
``tests/decoding/`` and ``tests/lsp_server/``, folder for folder below them: a newcomer looking
for the tests of ``speculative_complete/decoding/verify.py`` finds them in
``tests/decoding/engine/``; whatever two test modules share lives in ``tests/support/``, so that
no test module imports another (an import of a test module also collects its tests a second
time under another name, and ties two files' fixtures together by accident). Every import
counts, inside functions too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
PACKAGE_ROOT = ROOT / "speculative_complete"  # the installed top-level package
MIRRORED = ("decoding", "lsp_server")  # folders under tests/ that mirror the subpackage of that name
TOP_LEVEL = {*MIRRORED, "e2e", "benchmarks", "project", "support"}
SUPPORT = "tests.support"


def folders() -> list[Path]:
    return sorted(
        p for p in TESTS.rglob("*") if p.is_dir() and p.name != "__pycache__" and not p.name.startswith(".")
    )


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> list[str]:
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    return imports_in(path.read_text(), package)


def imports_in(source: str, package: str) -> list[str]:
    """Every module ``source`` (of ``package``) imports, anywhere in it, relative imports made
    absolute; for ``from p import m`` both ``p`` and ``p.m`` (``m`` may be a module or a name)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = parts[: len(parts) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.append(module)
            found.extend(f"{module}.{alias.name}" for alias in node.names)
    return found


def is_test_module(name: str) -> bool:
    """A module of the tests that is not a shared helper: a test module, or ``tests.conftest``."""
    return name.startswith("tests.") and not (name == SUPPORT or name.startswith(SUPPORT + "."))


def test_the_scan_sees_real_imports():
    greedy = imported_modules(TESTS / "decoding" / "engine" / "test_engine_greedy.py")
    assert "tests.support.greedy_cases" in greedy
    assert "speculative_complete.decoding.engine.loop" in greedy
    assert "tests.support.lsp" in imports_in("from tests.support import lsp as h", "tests.e2e")
    inside = imports_in("def f():\n    from ..forward.test_quant import IN", "tests.decoding.engine")
    assert "tests.decoding.forward.test_quant" in inside
    assert is_test_module("tests.decoding.engine.test_verify") and is_test_module("tests.conftest")
    assert not is_test_module("tests.support.tiny_models")
    assert not is_test_module("speculative_complete.decoding.engine")


def test_no_test_module_imports_another_test_module():
    """Only ``tests.support`` is shared: not test modules, not ``tests.conftest`` (pytest hands
    its fixtures to every test; its helpers belong in ``tests/support``)."""
    offenders = {
        str(path.relative_to(ROOT)): bad
        for path in sorted(TESTS.rglob("*.py"))
        if (bad := [m for m in imported_modules(path) if is_test_module(m) and m != "tests"])
    }
    assert offenders == {}, "import shared helpers from tests/support instead"


def test_no_test_module_is_left_at_the_top_level():
    assert sorted(p.name for p in TESTS.glob("test_*.py")) == []


def test_the_top_level_folders_are_the_packages_and_the_named_few():
    assert sorted(p.name for p in folders() if p.parent == TESTS and p.name not in TOP_LEVEL) == []


def test_every_mirrored_folder_is_a_package_of_the_same_path():
    """tests/decoding/engine <-> speculative_complete/decoding/engine/: a folder for a package
    that was renamed or removed is caught here."""
    mirrors = [p for p in folders() if p.relative_to(TESTS).parts[0] in MIRRORED]
    assert mirrors, "no mirrored folders found"
    missing = [
        str(p.relative_to(TESTS))
        for p in mirrors
        if not (PACKAGE_ROOT / p.relative_to(TESTS) / "__init__.py").is_file()
    ]
    assert missing == [], "tests/ folders whose package does not exist"


def test_every_folder_is_a_package():
    assert [str(p.relative_to(ROOT)) for p in folders() if not (p / "__init__.py").is_file()] == []


def test_only_test_modules_live_outside_support():
    """A helper put beside the tests that use it is one the next test would import from there."""
    strays = [
        str(p.relative_to(ROOT))
        for p in TESTS.rglob("*.py")
        if not p.is_relative_to(TESTS / "support")
        and not p.name.startswith("test_")
        and p.name not in ("__init__.py", "conftest.py")
    ]
    assert strays == []
