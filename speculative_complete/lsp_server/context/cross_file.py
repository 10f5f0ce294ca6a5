"""Excerpts of other files that a prompt shows before the document's rows, each kind within its
share of the budget: the definitions of the names used above the cursor (``definitions.py``, from
the workspace's symbol table and the open documents'), snippets of other open documents that
resemble the code above the cursor (``snippets.py``), and the regions just edited in other
documents (``edits.py``); as comments in the current file's language, or as the other files of a
repository layout (``fim.py``'s ``qwen-repo``, names from ``repo.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from speculative_complete.lsp_server.context import definitions, fim
from speculative_complete.lsp_server.context.languages import LanguageSpec, detect
from speculative_complete.lsp_server.context.repo import Repository, repository_for
from speculative_complete.lsp_server.context.request import ContextRequest
from speculative_complete.lsp_server.context.snippets import Snippet, SnippetIndex, file_body
from speculative_complete.lsp_server.context.snippets import render as render_snippet
from speculative_complete.lsp_server.context.symbols import SymbolCache, SymbolTable
from speculative_complete.lsp_server.context.text import clean
from speculative_complete.lsp_server.context.tokens import Tokens

SNIPPET_SHARE = 0.2
DEFINITION_SHARE = 0.2
EDIT_SHARE = 0.1
MIN_SNIPPET_LINES = 4
REPO_SHARE = 0.1  # the most the repository's name and the current file's path may cost
QUERY_LINES = 20
NO_SYMBOLS = SymbolTable()


@dataclass(frozen=True)
class RepoLayout:
    """Where a request's prompt is in the repository layout: the repository and the current file's
    path in it (``repo.py``)."""

    repository: Repository
    path: str


def repo_layout(
    request: ContextRequest,
    template: fim.FimTemplate | None,
    spec: LanguageSpec,
    tokens: Tokens,
    budget: int,
) -> RepoLayout | None:
    """The repository layout for this request, where the template has one and the repository's
    name and the current file's path cost at most ``REPO_SHARE`` of the budget."""
    if template is None or not template.repo_level:
        return None
    repository = repository_for(request.uri, request.workspace_folders)
    path = clean(repository.path_of(request.uri, spec))
    repository = replace(repository, name=clean(repository.name))
    if fim.repo_cost(repository.name, path, tokens) > budget * REPO_SHARE:
        return None
    return RepoLayout(repository, path)


@dataclass(frozen=True)
class CrossFile:
    """Where the excerpts come from: the open documents' snippet windows and definitions, and the
    chooser of definitions that remembers each document's last choice (a builder's own, lent for
    one prompt)."""

    snippets: SnippetIndex
    symbols: SymbolCache
    definitions: definitions.Chooser

    def _found(self, request: ContextRequest, lines: list[str], row: int) -> list[Snippet]:
        """The snippets for the lines above the cursor's, best first, before any is cut to fit."""
        if request.neighbor_snippets <= 0 or not request.others:
            return []
        query = "".join(lines[max(0, row - QUERY_LINES) : row])
        nearby = "".join(lines[max(0, row - 200) : row])
        return self.snippets.choose(query, request.others, request.neighbor_snippets, exclude=nearby)

    def _definitions(
        self, request: ContextRequest, lines: list[str], row: int, tokens: Tokens, budget: int
    ) -> list[Snippet]:
        """The definitions of the names used above the cursor, from other files (``definitions.py``)."""
        overlay = self.symbols.table(request.others)
        if request.symbols is None and not len(overlay):
            return []
        project = definitions.Project(request.symbols or NO_SYMBOLS, overlay)
        names = definitions.names_near(lines, row)
        return self.definitions.choose(project, request.uri, names, tokens.count, budget)

    def _by_kind(
        self, request: ContextRequest, lines: list[str], row: int, tokens: Tokens, budget: int
    ) -> list[tuple[list[Snippet], int]]:
        """The other files' excerpts the prompt may show, by kind, most specific first, each kind
        with its share of the budget: definitions, snippets that resemble the code, recent edits
        (those whose lines mostly repeat the lines above the cursor or a snippet left out)."""
        found = self._found(request, lines, row)
        if not request.cross_file:
            return [(found, int(budget * SNIPPET_SHARE))]
        share = int(budget * DEFINITION_SHARE)
        defined = self._definitions(request, lines, row, tokens, share)
        edits: list[Snippet] = []
        if request.recent_edits:
            held = "".join(lines[max(0, row - 200) : row]) + "\n".join(s.text for s in found)
            edits = [s for s in request.recent_edits if not _mostly_held(s.text, held)]
        return [(defined, share), (found, int(budget * SNIPPET_SHARE)), (edits, int(budget * EDIT_SHARE))]

    def as_comments(
        self,
        request: ContextRequest,
        lines: list[str],
        row: int,
        spec: LanguageSpec,
        tokens: Tokens,
        budget: int,
    ) -> tuple[list[Snippet], str]:
        """The other files' excerpts as comments in the current file's language, each cut from its
        end to fit what is left of its kind's share of the budget."""
        kept, parts = [], []
        for found, left in self._by_kind(request, lines, row, tokens, budget):
            for snippet in found:
                size = snippet.text.count("\n") + 1
                for shown in range(size, _fewest_lines(snippet) - 1, -1):  # cut from its end
                    part = clean(render_snippet(snippet, spec.comment, shown))
                    cost = tokens.count(part)
                    if cost <= left:
                        kept.append(snippet)
                        parts.append(part)
                        left -= cost
                        break
        return kept, "".join(parts)

    def as_repo_files(
        self,
        request: ContextRequest,
        lines: list[str],
        row: int,
        layout: RepoLayout,
        tokens: Tokens,
        budget: int,
    ) -> tuple[list[Snippet], list[fim.RepoFile]]:
        """The other files' excerpts as files of the repository layout: a file's excerpts under its
        one path, files in the order of their best excerpt, each excerpt cut from its end to fit
        what is left of its kind's share of the budget (a file's path and marker counted with it)."""
        languages = {doc.uri: doc.language_id for doc in request.others}
        parts: dict[str, list[tuple[Snippet, int]]] = {}
        paths: dict[str, str] = {}
        costs: dict[str, int] = {}
        kept: list[Snippet] = []
        for found, left in self._by_kind(request, lines, row, tokens, budget):
            for snippet in found:
                uri = snippet.uri
                if uri not in paths:
                    paths[uri] = clean(layout.repository.path_of(uri, detect(languages.get(uri), uri)))
                before = costs.get(uri, 0)
                size = snippet.text.count("\n") + 1
                for shown in range(size, _fewest_lines(snippet) - 1, -1):  # cut from its end
                    trial = [*parts.get(uri, []), (snippet, shown)]
                    cost = fim.file_cost(paths[uri], clean(file_body(trial)), tokens)
                    if cost - before <= left:
                        parts[uri], costs[uri] = trial, cost
                        kept.append(snippet)
                        left -= cost - before
                        break
        files = [fim.RepoFile(paths[uri], clean(file_body(part))) for uri, part in parts.items()]
        return kept, files


def _fewest_lines(snippet: Snippet) -> int:
    """An excerpt cut from its end keeps at least this many lines: a few for a window of code (less
    says nothing), one for definitions (each line is a signature of its own)."""
    return 1 if snippet.kind == "definition" else min(snippet.text.count("\n") + 1, MIN_SNIPPET_LINES)


def _mostly_held(text: str, held: str) -> bool:
    """Whether most of ``text``'s lines (whitespace aside) are lines of ``held`` already."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    have = {line.strip() for line in held.splitlines()}
    return not lines or sum(line in have for line in lines) * 2 >= len(lines)
