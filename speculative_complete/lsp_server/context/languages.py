"""Which language a document is in, and what the context builder needs to know about it.

The language comes from the LSP ``languageId`` the client sent with ``didOpen``, then from the
file extension in the URI, then plain text. Grammars are the per-language PyPI wheels
(``tree-sitter-python`` ...), loaded lazily on first use: ``tree-sitter-language-pack`` would
download its parsers at run time, which cannot work offline. A grammar that fails to load (a
missing wheel, an ABI the installed ``tree-sitter`` cannot read) makes the language plain text,
logged once, never an error.

What each language adds is small data, not code: its line-comment marker (for snippets from
other files), whether blocks are delimited by indentation or braces (where a multi-line
suggestion ends), and a tree-sitter query for its imports (what the prompt keeps first).
"""

from __future__ import annotations

import functools
import importlib
import logging
import posixpath
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import unquote, urlparse

log = logging.getLogger(__name__)

BlockStyle = Literal["indent", "braces"]

_REQUIRE = (
    "(lexical_declaration (variable_declarator value: (call_expression function: (identifier) @_f"
    ' (#eq? @_f "require")))) @import '
    "(variable_declaration (variable_declarator value: (call_expression function: (identifier) @_g"
    ' (#eq? @_g "require")))) @import'
)


@dataclass(frozen=True)
class LanguageSpec:
    name: str
    module: str | None  # the grammar wheel's module; None: plain text
    entry: str = "language"  # the function in it that returns the grammar
    comment: str = "#"
    blocks: BlockStyle = "braces"
    imports: str = ""  # a tree-sitter query; every @import capture is an import unit


SPECS: dict[str, LanguageSpec] = {
    spec.name: spec
    for spec in [
        LanguageSpec(
            "python",
            "tree_sitter_python",
            comment="#",
            blocks="indent",
            imports="(import_statement) @import (import_from_statement) @import "
            "(future_import_statement) @import",
        ),
        LanguageSpec(
            "javascript",
            "tree_sitter_javascript",
            comment="//",
            imports="(import_statement) @import " + _REQUIRE,
        ),
        LanguageSpec(
            "typescript",
            "tree_sitter_typescript",
            "language_typescript",
            comment="//",
            imports="(import_statement) @import " + _REQUIRE,
        ),
        LanguageSpec(
            "tsx",
            "tree_sitter_typescript",
            "language_tsx",
            comment="//",
            imports="(import_statement) @import " + _REQUIRE,
        ),
        LanguageSpec(
            "go",
            "tree_sitter_go",
            comment="//",
            imports="(package_clause) @import (import_declaration) @import",
        ),
        LanguageSpec(
            "rust",
            "tree_sitter_rust",
            comment="//",
            imports="(use_declaration) @import (extern_crate_declaration) @import",
        ),
        LanguageSpec(
            "java",
            "tree_sitter_java",
            comment="//",
            imports="(package_declaration) @import (import_declaration) @import",
        ),
        LanguageSpec("c", "tree_sitter_c", comment="//", imports="(preproc_include) @import"),
        LanguageSpec(
            "cpp",
            "tree_sitter_cpp",
            comment="//",
            imports="(preproc_include) @import (using_declaration) @import",
        ),
        LanguageSpec("text", None, comment="#", blocks="indent"),
    ]
}
PLAIN = SPECS["text"]

# LSP language identifiers (the spec's list, plus common editor aliases) -> our names.
LANGUAGE_IDS: dict[str, str] = {
    "python": "python",
    "py": "python",
    "javascript": "javascript",
    "javascriptreact": "javascript",
    "js": "javascript",
    "jsx": "javascript",
    "typescript": "typescript",
    "ts": "typescript",
    "typescriptreact": "tsx",
    "tsx": "tsx",
    "go": "go",
    "golang": "go",
    "rust": "rust",
    "rs": "rust",
    "java": "java",
    "c": "c",
    "cpp": "cpp",
    "c++": "cpp",
    "cuda-cpp": "cpp",
    "cuda": "cpp",
}
EXTENSIONS: dict[str, str] = {
    ".py": "python",
    ".pyi": "python",
    ".pyw": "python",
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".jsx": "javascript",
    ".ts": "typescript",
    ".mts": "typescript",
    ".cts": "typescript",
    ".tsx": "tsx",
    ".go": "go",
    ".rs": "rust",
    ".java": "java",
    ".c": "c",
    ".h": "c",
    ".cc": "cpp",
    ".cpp": "cpp",
    ".cxx": "cpp",
    ".c++": "cpp",
    ".hpp": "cpp",
    ".hh": "cpp",
    ".hxx": "cpp",
    ".cu": "cpp",
    ".cuh": "cpp",
    ".ipp": "cpp",
    ".inl": "cpp",
}


def uri_path(uri: str) -> str:
    """The path part of a URI (percent-decoded); a plain path or an unparsable URI as it is."""
    try:
        return unquote(urlparse(uri).path) if "://" in uri else uri
    except ValueError:
        return uri


def detect(language_id: str | None, uri: str = "") -> LanguageSpec:
    """The language for a document: its languageId, else its extension, else plain text."""
    if language_id:
        name = LANGUAGE_IDS.get(language_id.strip().lower())
        if name:
            return SPECS[name]
    ext = posixpath.splitext(uri_path(uri).lower())[1]
    return SPECS.get(EXTENSIONS.get(ext, "text"), PLAIN)


@functools.cache
def grammar(name: str) -> Any | None:
    """The tree-sitter ``Language`` for ``name``, or None (plain text) when it cannot be loaded."""
    spec = SPECS.get(name)
    if spec is None or spec.module is None:
        return None
    try:
        import tree_sitter

        module = importlib.import_module(spec.module)
        return tree_sitter.Language(getattr(module, spec.entry)())
    except Exception as exc:  # a missing wheel or an incompatible ABI: plain text, said once
        log.warning(
            "no tree-sitter grammar for %s (%s: %s); treating it as plain text", name, type(exc).__name__, exc
        )
        return None


@functools.cache
def import_query(name: str) -> Any | None:
    """The compiled import query for ``name``, or None."""
    lang, spec = grammar(name), SPECS.get(name)
    if lang is None or spec is None or not spec.imports:
        return None
    try:
        import tree_sitter

        return tree_sitter.Query(lang, spec.imports)
    except Exception as exc:
        log.warning("the import query for %s does not compile: %s", name, exc)
        return None


# Nodes whose named children are statements or members: the units the prompt may drop whole.
# Type names are each grammar's own; the same name means the same thing across these grammars.
BLOCK_TYPES = frozenset(
    {
        "module",
        "block",
        "program",
        "source_file",
        "translation_unit",  # files and plain blocks
        "statement_block",
        "class_body",
        "interface_body",
        "enum_body",
        "object_type",  # JS / TS / Java
        "constructor_body",
        "switch_body",
        "annotation_type_body",
        "record_body",
        "statement_list",
        "field_declaration_list",
        "declaration_list",  # Go, Rust, C, C++
        "compound_statement",
        "enumerator_list",
        "preproc_ifdef",
        "preproc_if",
        "preproc_else",
        "preproc_elif",  # C headers wrap everything in these
    }
)
