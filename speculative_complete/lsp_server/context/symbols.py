"""Definitions in the project's files: what the prompt shows of a name used near the cursor.

A call to a function defined in another file is where a small model guesses worst: it has never
seen the name, so it writes one of its own. Peers put the definitions of the names around the
cursor in the prompt (Continue and Tabby through the editor's language servers, Zed's edit
prediction from its symbol index); this server reads them itself, so it works in every editor and
without a language server.

Each file is parsed with its tree-sitter grammar (``languages.py``) and a query per language finds
its classes, functions, methods, types and module-level assignments. A definition keeps only what a
caller needs: its signature lines (up to the body) and, in Python, the first line of its docstring;
a class also lists its methods' signatures when it is shown. A file's definitions are kept per text
(``FileSymbols``), so an unchanged file costs a dictionary lookup; the table of names
(``SymbolTable``) is an immutable value, replaced whole when files change, that any thread may
read.

tree-sitter's queries are written by hand here because no maintained library ships definition
queries for these grammars as a Python package (the grammars' own ``tags.scm`` files are not in
their wheels, and ``tree-sitter-language-pack`` downloads its parsers at run time).
"""

from __future__ import annotations

import functools
import logging
import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from speculative_complete.lsp_server.context.languages import detect, grammar
from speculative_complete.lsp_server.context.syntax import to_bytes

log = logging.getLogger(__name__)

Kind = Literal["class", "function", "method", "variable", "type"]
MAX_SIGNATURE_LINES = 6
MAX_LINE_CHARS = 160
MAX_FILE_CHARS = 400_000  # larger files (generated, vendored) are not read for definitions
MAX_MEMBERS = 12  # methods listed under a class, at most

# One pattern per kind and language; each captures the definition as @def and its name as @name.
# Patterns a grammar's version does not know are dropped one by one (``_query``).
_EXPORTED_CONST = (
    "(program (export_statement (lexical_declaration (variable_declarator name: (identifier) @name)) @def))"
)
_C_FUNCTION = "(function_declarator declarator: (identifier) @name)"
_PATTERNS: dict[str, tuple[tuple[Kind, str], ...]] = {
    "python": (
        ("class", "(class_definition name: (identifier) @name) @def"),
        ("function", "(function_definition name: (identifier) @name) @def"),
        ("variable", "(module (expression_statement (assignment left: (identifier) @name)) @def)"),
    ),
    "javascript": (
        ("class", "(class_declaration name: (_) @name) @def"),
        ("function", "(function_declaration name: (identifier) @name) @def"),
        ("method", "(method_definition name: (property_identifier) @name) @def"),
        ("variable", "(program (lexical_declaration (variable_declarator name: (identifier) @name)) @def)"),
        ("variable", _EXPORTED_CONST),
    ),
    "typescript": (
        ("class", "(class_declaration name: (_) @name) @def"),
        ("function", "(function_declaration name: (identifier) @name) @def"),
        ("method", "(method_definition name: (property_identifier) @name) @def"),
        ("type", "(interface_declaration name: (type_identifier) @name) @def"),
        ("type", "(type_alias_declaration name: (type_identifier) @name) @def"),
        ("variable", "(program (lexical_declaration (variable_declarator name: (identifier) @name)) @def)"),
        ("variable", _EXPORTED_CONST),
    ),
    "go": (
        ("function", "(function_declaration name: (identifier) @name) @def"),
        ("method", "(method_declaration name: (field_identifier) @name) @def"),
        ("type", "(type_spec name: (type_identifier) @name) @def"),
    ),
    "rust": (
        ("function", "(function_item name: (identifier) @name) @def"),
        ("type", "(struct_item name: (type_identifier) @name) @def"),
        ("type", "(enum_item name: (type_identifier) @name) @def"),
        ("type", "(trait_item name: (type_identifier) @name) @def"),
    ),
    "java": (
        ("class", "(class_declaration name: (identifier) @name) @def"),
        ("type", "(interface_declaration name: (identifier) @name) @def"),
        ("method", "(method_declaration name: (identifier) @name) @def"),
    ),
    "c": (
        ("function", "(function_definition declarator: " + _C_FUNCTION + ") @def"),
        ("function", "(declaration declarator: " + _C_FUNCTION + ") @def"),
        ("type", "(struct_specifier name: (type_identifier) @name body: (_)) @def"),
        ("type", "(type_definition declarator: (type_identifier) @name) @def"),
    ),
}
_PATTERNS["tsx"] = _PATTERNS["typescript"]
_PATTERNS["cpp"] = (
    *_PATTERNS["c"],
    ("class", "(class_specifier name: (type_identifier) @name body: (_)) @def"),
)
_CLASS_TYPES = frozenset({"class_definition", "class_declaration", "class_specifier"})
_FUNCTION_TYPES = frozenset(
    {"function_definition", "function_declaration", "method_definition", "function_item", "arrow_function"}
)


@dataclass(frozen=True)
class Definition:
    name: str
    kind: Kind
    line: int  # 0-based, in its file
    text: str  # the signature lines as the file has them (indentation kept), docstring's first line
    container: str = ""  # the class a method belongs to

    @property
    def signature(self) -> str:
        """``text`` without its docstring's line, a signature over several lines joined into one:
        what a caller needs, where little room is left (each line's indentation and comment mark
        cost tokens too)."""
        head, _, last = self.text.rpartition("\n")
        lines = (head if head and last.lstrip().startswith(('"""', "'''")) else self.text).split("\n")
        if any("#" in line or "//" in line for line in lines):
            return "\n".join(lines)
        return _joined(lines)


def _joined(lines: list[str]) -> str:
    """A signature's lines as one: no space inside brackets, no comma before a closing one."""
    joined = lines[0].rstrip()
    for line in lines[1:]:
        part = line.strip()
        if joined.endswith(",") and part.startswith((")", "]")):
            joined = joined[:-1]
        glue = "" if joined.endswith(("(", "[", "{")) or part.startswith((")", "]", "}")) else " "
        joined += glue + part
    return joined


@dataclass(frozen=True)
class FileSymbols:
    """One file's definitions, in file order."""

    uri: str
    module: str  # the name an import would use: the file's stem, or its package's for __init__
    definitions: tuple[Definition, ...]
    text_hash: int = 0  # of the text they were read from: an unchanged file is not parsed again

    def members(self, container: str) -> list[Definition]:
        return [d for d in self.definitions if d.container == container]

    def top_level(self) -> list[Definition]:
        return [d for d in self.definitions if not d.container]


@dataclass(frozen=True)
class SymbolTable:
    """Every file's definitions, looked up by name or by module (immutable: replaced whole)."""

    files: Mapping[str, FileSymbols] = field(default_factory=dict)  # by URI
    by_name: Mapping[str, tuple[tuple[str, int], ...]] = field(default_factory=dict)  # (uri, index)
    by_module: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # module name -> URIs

    @classmethod
    def of(cls, files: Iterable[FileSymbols]) -> SymbolTable:
        table: dict[str, FileSymbols] = {f.uri: f for f in files}
        names: dict[str, list[tuple[str, int]]] = {}
        modules: dict[str, list[str]] = {}
        for uri in sorted(table):
            symbols = table[uri]
            modules.setdefault(symbols.module, []).append(uri)
            for index, definition in enumerate(symbols.definitions):
                names.setdefault(definition.name, []).append((uri, index))
        return cls(
            table,
            {name: tuple(found) for name, found in names.items()},
            {name: tuple(uris) for name, uris in modules.items()},
        )

    def __len__(self) -> int:
        return sum(len(f.definitions) for f in self.files.values())

    def definitions(self, name: str) -> list[tuple[FileSymbols, Definition]]:
        return [(self.files[uri], self.files[uri].definitions[i]) for uri, i in self.by_name.get(name, ())]


def module_name(uri: str) -> str:
    """What an import calls a file: ``pkg/ledger.py`` is ``ledger``, ``pkg/__init__.py`` is ``pkg``."""
    path = uri.rsplit("/", 2)
    stem = posixpath.splitext(path[-1])[0]
    if stem in ("__init__", "index", "mod") and len(path) > 1:
        return path[-2]
    return stem


@functools.cache
def _parser(language: str) -> Any | None:
    lang = grammar(language)
    if lang is None:
        return None
    import tree_sitter

    return tree_sitter.Parser(lang)


@functools.cache
def _queries(language: str) -> tuple[tuple[Kind, Any], ...]:
    """The language's compiled patterns; one a grammar does not know is left out, logged once."""
    lang = grammar(language)
    if lang is None:
        return ()
    import tree_sitter

    compiled = []
    for kind, pattern in _PATTERNS.get(language, ()):
        try:
            compiled.append((kind, tree_sitter.Query(lang, pattern)))
        except Exception as exc:  # a grammar version without that node type
            log.debug("definition pattern for %s does not compile (%s): %s", language, exc, pattern)
    return tuple(compiled)


def extract(uri: str, text: str, language: str) -> FileSymbols:
    """``text``'s definitions (none where the language has no grammar or the file is too large)."""
    parser = _parser(language)
    if parser is None or len(text) > MAX_FILE_CHARS:
        return FileSymbols(uri, module_name(uri), (), hash(text))
    source = to_bytes(text)
    try:
        root = parser.parse(source).root_node
    except Exception as exc:  # tree-sitter refusing input must not fail anything else
        log.warning("parsing %s for definitions failed: %s", uri, exc)
        return FileSymbols(uri, module_name(uri), (), hash(text))
    import tree_sitter

    found: dict[int, Definition] = {}
    for kind, query in _queries(language):
        for _, captures in tree_sitter.QueryCursor(query).matches(root):
            node, name = captures["def"][0], captures["name"][0]
            definition = _definition(kind, node, name, source, language)
            if definition is not None and node.start_byte not in found:
                found[node.start_byte] = definition
    ordered = tuple(found[start] for start in sorted(found))
    return FileSymbols(uri, module_name(uri), ordered, hash(text))


def _definition(kind: Kind, node: Any, name: Any, source: bytes, language: str) -> Definition | None:
    """A definition from its node, or None for one local to a function (not callable from outside)."""
    container = ""
    parent = node.parent
    while parent is not None:
        if parent.type in _FUNCTION_TYPES:
            return None
        if parent.type in _CLASS_TYPES:
            class_name = parent.child_by_field_name("name")
            container = _text(source, class_name) if class_name is not None else ""
            break
        parent = parent.parent
    if container and kind == "function":
        kind = "method"
    return Definition(
        name=_text(source, name),
        kind=kind,
        line=node.start_point[0],
        text=_signature(node, source, language),
        container=container,
    )


def _signature(node: Any, source: bytes, language: str) -> str:
    """The definition's lines up to its body (all of it, for one without a body), indented as in
    the file, at most ``MAX_SIGNATURE_LINES``; in Python, the docstring's first line after it."""
    body = node.child_by_field_name("body")
    end = body.start_byte if body is not None else node.end_byte
    line_start = source.rfind(b"\n", 0, node.start_byte) + 1
    if source[line_start : node.start_byte].strip():  # not first on its line: from the node on
        line_start = node.start_byte
    head = source[line_start:end].decode("utf-8", "replace").rstrip(" \t\r\n{")
    lines = [line[:MAX_LINE_CHARS].rstrip() for line in head.split("\n")[:MAX_SIGNATURE_LINES]]
    if language == "python" and body is not None:
        doc = _docstring(body, source)
        if doc:
            indent = _indent(lines[0]) + "    "
            lines.append(f'{indent}"""{doc}"""')
    return "\n".join(lines)


def _docstring(body: Any, source: bytes) -> str:
    """The first line of a Python body's docstring, or ""."""
    first = body.named_children[0] if body.named_children else None
    if first is None or first.type != "expression_statement" or not first.named_children:
        return ""
    string = first.named_children[0]
    if string.type != "string":
        return ""
    raw = _text(source, string)
    content = raw.lstrip("rRbBuUfF").strip("\"'").strip()
    return content.split("\n", 1)[0].strip()[:MAX_LINE_CHARS]


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _text(source: bytes, node: Any) -> str:
    return source[node.start_byte : node.end_byte].decode("utf-8", "replace")


class SymbolCache:
    """Open documents' definitions by text: an unchanged document is not parsed again, and the
    same documents give the same table without building it again (one thread)."""

    def __init__(self, max_files: int = 64) -> None:
        self._cache: dict[tuple[str, int, int], FileSymbols] = {}
        self.max_files = max_files
        self._table: tuple[tuple[int, ...], SymbolTable] = ((), SymbolTable())

    def table(self, documents: Iterable[Any]) -> SymbolTable:
        """The table of ``documents`` (``snippets.OpenDocument``s)."""
        files = [self.get(doc.uri, doc.text, detect(doc.language_id, doc.uri).name) for doc in documents]
        key = tuple(id(f) for f in files)
        if key != self._table[0]:
            self._table = (key, SymbolTable.of(files))
        return self._table[1]

    def get(self, uri: str, text: str, language: str) -> FileSymbols:
        key = (uri, len(text), hash(text))
        symbols = self._cache.get(key)
        if symbols is None:
            symbols = extract(uri, text, language)
            self._cache[key] = symbols
            while len(self._cache) > self.max_files:
                self._cache.pop(next(iter(self._cache)))
        return symbols
