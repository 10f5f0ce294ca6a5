"""The prompt: what the model sees of the document, within a token budget.

``ContextBuilder.build`` turns a document, a cursor and the model's tokenizer into a ``Prompt``
whose token ids are fed as they are. It runs on the decode worker thread (it counts real tokens),
never on the event loop. The layout, first to last:

1. excerpts of other files, as comments, each kind within its share of the budget: the
   definitions of the names used above the cursor (``definitions.py``, from the workspace's
   symbol table, ``symbols.py``, and the open documents'), snippets of other open documents that
   resemble the code above the cursor (``snippets.py``), and the regions just edited in other
   documents (``edits.py``);
2. rows of the document before the cursor, chosen by syntax (``outline.py``, ``budget.py``):
   the imports, the chain of enclosing headers, the nearest sibling code, distant definitions
   dropped whole;
3. the cursor's line up to the cursor.

A model trained on a repository layout (``fim.py``'s ``qwen-repo``) gets the snippets as the
other files' own text instead, each under its path, then the current file's path, before its FIM
prompt (names from ``repo.py``); the rows and the cursor's line fill the prefix slot as above.

Stable parts come first and the cursor-local part last, and nothing before the cursor's line
depends on the cursor's column: the rows are chosen for a budget that reserves room for the
cursor's line in steps of ``RESERVE_STEP`` tokens, and the snippets are chosen by the lines above
it. So consecutive keystrokes on one line give prompts that share all their tokens but the last
few, which is what KV-cache reuse needs.

Across lines the rows are kept too (``Shown``): rows chosen afresh for each new line would often
drop a distant unit to make room for the line just typed, and the prompt would then differ from
its first rows on, a prefill of the whole prompt (the slowest thing a request does) at the moment the
user pauses at a line's start. So while typing goes on below the rows the last prompt showed and
leaves them as they were, the next prompt shows the same rows plus those typed since; only when
that no longer fits are the rows chosen again, for ``STICKY_SLACK`` less than the budget, which
leaves room for the next few lines. That choice, and the prefill it makes, would fall on a
keystroke; where little room is left (``needs_renewal``), the server's idle-time work makes it at
the pause before (``ContextRequest.renew_rows``). Those rows wait apart (``renewing``) while their
prompt is prefilled, which may take more than one pause: keystrokes meanwhile keep the rows whose
prompt is in the cache, until the renewed ones are adopted (``adopt_renewal``) or typing outgrows
the old ones first.

Models with fill-in-the-middle tokens (``fim.py``) also get the text after the cursor, within
``SUFFIX_SHARE`` of the budget, and the cursor's line goes after the middle marker, encoded apart
(``FimTemplate.line_in_middle``), so that a keystroke leaves the suffix's tokens as they were. The
rows typed below the kept ones go there too, before the line (``Shown.middle_row``): at the prefix
slot's end each new line would change the prompt before the suffix, whose tokens would then be
prefilled again at each line's first keystroke; so the prefix slot changes only when the rows are
chosen again. The model is asked for the middles that begin with those rows, as FIM training cuts
middles of any length.
The repository layout's own cost (the repository's name and the current file's path, with their
markers) is counted like the FIM markers, outside the snippets' share; where it is over
``REPO_SHARE`` of the budget the prompt is the plain FIM one instead.

Token healing: when the cursor is mid-word, after a space or indentation, or at a line start, the
prompt's last token is backed up over (``decoding.engine.healing.back_up``) and ``Prompt.healed``
holds the text removed; the engine makes the output start with it and returns only what follows it.
A line after the middle marker is healed alone (it may be backed up over whole; at a line start
there is nothing to heal).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, replace

from lsp_server.context import definitions, fim
from lsp_server.context.budget import render, select_rows
from lsp_server.context.languages import LanguageSpec, detect, grammar
from lsp_server.context.outline import Outline, SyntaxOutline, text_outline
from lsp_server.context.repo import Repository, repository_for
from lsp_server.context.snippets import OpenDocument, Snippet, SnippetIndex, file_body
from lsp_server.context.snippets import render as render_snippet
from lsp_server.context.symbols import SymbolCache, SymbolTable
from lsp_server.context.syntax import ParseCache, Window, to_bytes, window_for
from lsp_server.context.tokens import Tokens

log = logging.getLogger(__name__)

MAX_CHARS_PER_TOKEN = 8  # generous: code averages ~3-4 characters per token
HEALABLE = (" ", "\t", "\n")  # after a space, indentation, or at a line start
RESERVE_STEP = 32  # tokens: the room kept for the cursor's line grows in these steps
SNIPPET_SHARE = 0.2
DEFINITION_SHARE = 0.2
EDIT_SHARE = 0.1
MIN_SNIPPET_LINES = 4
SUFFIX_SHARE = 0.25
REPO_SHARE = 0.1  # the most the repository's name and the current file's path may cost
QUERY_LINES = 20
STICKY_SLACK = 0.2  # of the rows' budget: left free when rows are chosen again while typing goes on
STICKY_ROWS = 8  # the most rows the cursor may move down and still keep the rows shown above it
_WORD_END = re.compile(r"\w\Z")
NO_SYMBOLS = SymbolTable()


@dataclass(frozen=True)
class ContextRequest:
    """What a context builder may look at (a snapshot taken on the event loop)."""

    text: str  # the whole document
    offset: int  # the cursor, in code points
    budget_tokens: int
    uri: str = ""
    language_id: str | None = None
    others: tuple[OpenDocument, ...] = ()  # the other open documents
    fim_template: str = "auto"  # a fim.STYLES name, "auto", "none", or a template string
    neighbor_snippets: int = 2
    heal: bool = True
    language: LanguageSpec | None = None  # when the caller has detected it already
    # The engine takes the suffix as text (a remote engine's own FIM: OpenAI ``suffix``, llama.cpp
    # ``/infill``): ``Prompt.suffix`` is filled without a template, within the same share.
    engine_suffix: bool = False
    # The editor's workspace folders (URIs): the repository layout names files relative to the one
    # that holds the document (``repo.py``); without them, the nearest folder with a ``.git``.
    workspace_folders: tuple[str, ...] = ()
    # Context from the rest of the project: definitions of the names near the cursor (the
    # workspace's ``symbols`` and the open documents') and other documents' recent edits.
    cross_file: bool = True
    symbols: SymbolTable | None = None
    recent_edits: tuple[Snippet, ...] = ()  # newest first (``edits.EditRing.others``)
    # Choose the rows afresh, leaving ``STICKY_SLACK`` free, though the shown ones still fit
    # (``ContextBuilder.needs_renewal``: idle-time work, before typing outgrows them).
    renew_rows: bool = False


@dataclass(frozen=True)
class Shown:
    """The rows a document's last prompt showed above its cursor (document rows), and their text
    then: the next prompt keeps them while they are unchanged and the cursor has moved at most
    ``STICKY_ROWS`` down."""

    rows: frozenset[int]
    text: str
    cursor_row: int
    # the snippet text (or the repository layout's text) the prompt began with: another one
    # changes the start anyway
    snippets: str
    # FIM with the cursor's line after the middle marker: the first row that goes there too, set
    # where the rows were chosen (the rows typed below them since follow the marker)
    middle_row: int = 0
    headroom: int = 0  # tokens the prompt could still grow by before its rows are chosen again
    renew_below: int = 0  # less headroom than this: worth choosing them again while idle


@dataclass(frozen=True)
class RepoLayout:
    """Where a request's prompt is in the repository layout: the repository and the current file's
    path in it (``repo.py``)."""

    repository: Repository
    path: str


@dataclass(frozen=True)
class Prompt:
    text: str  # the prompt's text before the cursor, minus ``healed``
    healed: str = ""  # backed up from the end; the completion must start with it
    start: int = 0  # where the document text shown starts, in code points
    ids: tuple[int, ...] | None = None  # what the model is fed; None: tokenize ``text`` (plain window)
    suffix: str = ""  # FIM: the text after the cursor that the prompt shows
    # FIM: the end of ``text`` that follows the middle marker (the rows typed below the kept ones
    # and the cursor's line so far, minus ``healed``; ``fim.FimTemplate.line_in_middle``), or the
    # cursor's line that an engine's own FIM takes after its marker (llama.cpp's ``/infill``
    # ``prompt``)
    line: str = ""
    fim: str | None = None  # the FIM template's name, when one is used
    stop_strings: tuple[str, ...] = ()
    language: str = "text"
    snippets: tuple[Snippet, ...] = ()


def clean(text: str) -> str:
    """Lone surrogates (possible in JSON strings) would make the tokenizer raise; each becomes one
    "?", so offsets do not move."""
    return text.encode("utf-8", "replace").decode("utf-8")


def split_rows(text: str) -> list[str]:
    """Rows as tree-sitter counts them: broken after each ``\\n`` only, the break kept."""
    rows = text.split("\n")
    return [row + "\n" for row in rows[:-1]] + [rows[-1]]


def fit_exact(text: str, tokens: Tokens, budget: int) -> tuple[str, list[int]]:
    """The longest end of ``text`` that starts at a line start (or, for one over-long line, at a
    character) and encodes to at most ``budget`` tokens; the ids are exactly its encoding."""
    ids = tokens.encode(text)
    while len(ids) > budget and text:
        keep = max(int(len(text) * budget / len(ids) * 0.95), 0)
        cut = text[len(text) - keep :] if keep else ""
        newline = cut.find("\n")
        if 0 <= newline < len(cut) - 1 and newline < len(cut) // 2:
            cut = cut[newline + 1 :]
        text = cut if len(cut) < len(text) else text[1:]
        ids = tokens.encode(text)
    return text, ids


# -- the syntax-aware builder ---------------------------------------------------------------------


class ContextBuilder:
    """Builds prompts; keeps the parse trees and snippet windows between requests (one thread)."""

    def __init__(self) -> None:
        self.parses = ParseCache()
        self.snippets = SnippetIndex()
        self.symbols = SymbolCache()  # the open documents' definitions, by text
        self.definitions = definitions.Chooser()  # each document's last choice of them
        self.shown: dict[str, Shown] = {}  # by document
        self.renewing: dict[str, Shown] = {}  # rows chosen again at a pause, not yet adopted

    def state(self, uri: str) -> Shown | None:
        """What besides the request decides ``uri``'s next prompt: the rows its last prompt showed.

        The same request built from the same state gives the same prompt, and a prompt whose rows
        fit leaves the state that builds it again (its rows, kept as they are); one that did not
        fit leaves none, and the same request then chooses its rows afresh, perhaps otherwise.
        The answer memory keys on it (``lsp_server.reuse``); the event loop may read it, as it is
        a frozen value replaced whole."""
        return self.shown.get(uri) if uri else None

    def needs_renewal(self, uri: str) -> bool:
        """Whether ``uri``'s rows have less room left than the next line may take
        (``RESERVE_STEP`` tokens, or a third of what choosing them again frees where that is
        more, never more than it frees): that line would likely make a keystroke choose them
        (and prefill the prompt from its first changed row), which a pause can do instead (worker
        thread). Not sooner: each renewal is such a prefill, if at a pause."""
        shown = self.shown.get(uri) if uri else None
        return shown is not None and shown.headroom < shown.renew_below

    def forget(self, uri: str) -> None:
        """``uri`` was closed: its parse tree, snippet windows and shown rows are dropped (worker
        thread)."""
        self.parses.forget(uri)
        self.snippets.forget(uri)
        self.definitions.forget(uri)
        self.shown.pop(uri, None)
        self.renewing.pop(uri, None)

    def adopt_renewal(self, uri: str) -> bool:
        """The rows chosen again for ``uri`` (``renew_rows``) become its shown rows, once their
        prompt is in the cache; whether there were any (worker thread)."""
        renewed = self.renewing.pop(uri, None)
        if renewed is not None:
            self.shown[uri] = renewed
        return renewed is not None

    def build(self, request: ContextRequest, tokens: Tokens) -> Prompt:
        """The prompt for ``request``: at most ``budget_tokens`` ids, exactly the encoding of its
        text (healing only removes whole tokens from the end)."""
        budget = max(int(request.budget_tokens), 1)
        spec = request.language or detect(request.language_id, request.uri)
        offset = max(0, min(request.offset, len(request.text)))
        window, outline, lines, row, cursor_text = self._outline(
            request.uri, request.text, offset, spec, budget
        )

        template = fim.resolve(request.fim_template, tokens)
        layout = self._layout(request, template, spec, tokens, budget)
        if template is not None and layout is None:
            template = fim.file_only(template)
        suffix, suffix_ids, overhead = self._after_cursor(request, template, offset, tokens, budget)

        header: list[int] = []  # the repository layout's ids, before the FIM prompt
        if template is not None and layout is not None:
            chosen, files = self._repo_files(request, lines, row, layout, tokens, budget)
            name = layout.repository.name
            header = fim.repo_ids(template, name, files, layout.path, tokens)
            snippet_text, key = "", fim.repo_text(template, name, files, layout.path)
        else:
            chosen, snippet_text = self._snippets(request, lines, row, spec, tokens, budget)
            key = snippet_text
        room = budget - overhead - len(suffix_ids) - len(header)
        reserve = (tokens.count(clean(cursor_text)) // RESERVE_STEP + 1) * RESERVE_STEP
        rows_budget = room - reserve - tokens.count(snippet_text)

        line = clean(cursor_text)
        line_ids = tokens.encode(line) if template is not None and template.line_in_middle else None
        head = snippet_text, cursor_text
        rows, above = self._rows(
            request, window, outline, lines, row, head, key, tokens, rows_budget, room, line_ids
        )
        first_row = min(rows, default=row)
        if len(above.ids) > room:  # the cursor's own line (or the headers) is more than the budget
            above = _Above(*fit_exact(above.text, tokens, max(room, 0)))
            line_ids = None  # what is left of it stays in the prefix slot

        end = _healed_end(above, line, line_ids, request, tokens)
        ids = end.ids
        stops: tuple[str, ...] = ()
        if template is not None:
            ids = header + fim.assemble(template, end.ids, suffix_ids, tokens, end.middle)
            stops = template.stops
        return Prompt(
            text=end.text,
            healed=end.healed,
            start=window.start + sum(len(shown) for shown in lines[:first_row]),
            ids=tuple(ids),
            suffix=suffix,
            line=end.line,
            fim=template.name if template else None,
            stop_strings=stops,
            language=spec.name,
            snippets=tuple(chosen),
        )

    # -- pieces ---------------------------------------------------------------------------------
    @staticmethod
    def _render(
        rows: set[int],
        lines: list[str],
        row: int,
        head: tuple[str, str],
        tokens: Tokens,
        line_ids: list[int] | None,
        middle_row: int,
    ) -> _Above:
        """The prompt's text before the cursor with ``rows`` shown, and its ids: one encoding, or,
        where the cursor's line is encoded apart (``line_ids``), the rows' above ``middle_row``,
        then those from it on (every one of them shown), then the line's."""
        snippet_text, cursor_text = head
        first = min(rows, default=row)
        if line_ids is None:
            prefix = clean(snippet_text + render(rows, lines, first, row) + cursor_text)
            return _Above(prefix, tokens.encode(prefix))
        above = clean(snippet_text + render(rows, lines, min(first, middle_row), middle_row))
        middle = "".join(lines[middle_row:row])
        middle_ids = tokens.ids(middle) + line_ids
        return _Above(
            above + middle + clean(cursor_text), tokens.ids(above) + middle_ids, middle, len(middle_ids)
        )

    def _rows(
        self,
        request: ContextRequest,
        window: Window,
        outline: Outline,
        lines: list[str],
        row: int,
        head: tuple[str, str],
        key: str,
        tokens: Tokens,
        rows_budget: int,
        room: int,
        line_ids: list[int] | None,
    ) -> tuple[set[int], _Above]:
        """The rows shown above the cursor, and the prompt's text before it and its ids: the rows
        the document's last prompt showed where they still fit (``Shown``) and what came before
        them (``key``) is unchanged, else rows chosen afresh (``budget.select_rows``), asking for
        less where the pieces merged into more tokens than ``room``."""
        uri, slack = request.uri, int(max(rows_budget, 0) * STICKY_SLACK)
        # A renewal keeps the rows an earlier one chose, while its prefill is not yet done.
        shown = self.renewing if request.renew_rows else self.shown
        last = shown.get(uri) if uri else None
        kept = self._kept_rows(last, window, lines, row, key)
        if kept is not None and last is not None:
            middle_row = row if line_ids is None else last.middle_row - window.first_row
            above = self._render(kept, lines, row, head, tokens, line_ids, middle_row)
            if len(above.ids) <= room:
                self._remember(
                    uri, window, lines, (row, middle_row), kept, key, (room - len(above.ids), slack), shown
                )
                return kept, above
        if kept is not None or request.renew_rows:
            rows_budget -= slack  # typing outgrew them (or soon would): room to grow
            log.debug("%s: rows chosen again (%s)", uri, "renewed" if request.renew_rows else "outgrown")
        rows: set[int] = set()
        above = _Above("", [])
        for _ in range(4):
            rows = select_rows(outline, lines, tokens.count, max(rows_budget, 0))
            above = self._render(rows, lines, row, head, tokens, line_ids, row)
            if len(above.ids) <= room:
                break
            rows_budget -= len(above.ids) - room + 8  # pieces merged differently: ask for less
        if not request.renew_rows:
            self.renewing.pop(uri, None)  # outgrown first: what was renewed is older than these rows
        self._remember(uri, window, lines, (row, row), rows, key, (room - len(above.ids), slack), shown)
        return rows, above

    @staticmethod
    def _kept_rows(
        shown: Shown | None, window: Window, lines: list[str], row: int, snippet_text: str
    ) -> set[int] | None:
        """The rows a prompt showed (``shown``: the document's last, or its pending renewal's) and
        the rows typed below them since (window rows), where that prompt's rows are unchanged
        and the cursor moved at most ``STICKY_ROWS`` down; else None."""
        if shown is None or shown.snippets != snippet_text:
            return None
        cursor_row = window.first_row + row
        if (
            not window.first_row
            <= shown.middle_row
            <= shown.cursor_row
            <= cursor_row
            <= shown.cursor_row + STICKY_ROWS
        ):
            return None
        kept = {r - window.first_row for r in shown.rows}
        if any(r < 0 for r in kept) or "".join(lines[r] for r in sorted(kept)) != shown.text:
            return None
        return kept | set(range(shown.cursor_row - window.first_row, row))

    def _remember(
        self,
        uri: str,
        window: Window,
        lines: list[str],
        rows_at: tuple[int, int],
        rows: set[int],
        snippets: str,
        room: tuple[int, int],
        shown: dict[str, Shown],
    ) -> None:
        """Keeps the rows shown in ``shown`` (``rows_at``: the cursor's row and the middle's first;
        ``room``: the prompt's headroom, and what choosing its rows again would free); none where
        they did not fit."""
        (row, middle_row), (headroom, slack) = rows_at, room
        if not uri or headroom < 0:
            shown.pop(uri, None)
            return
        above = sorted(r for r in rows if r < row)
        shown[uri] = Shown(
            rows=frozenset(window.first_row + r for r in above),
            text="".join(lines[r] for r in above),
            cursor_row=window.first_row + row,
            snippets=snippets,
            headroom=headroom,
            renew_below=min(slack, max(slack // 3, RESERVE_STEP)),
            middle_row=window.first_row + middle_row,
        )

    def _outline(
        self, uri: str, text: str, offset: int, spec: LanguageSpec, budget: int
    ) -> tuple[Window, Outline, list[str], int, str]:
        """The window around the cursor, its rows, the cursor's row and the text before the cursor
        on it, and the outline of the rows above (from the syntax tree when there is one).

        The tree is parsed with the cursor's line replaced by its indentation (plus ``pass`` in
        Python, so that an empty body stays a body): what the user is typing on that line, often
        unfinished and unbalanced, then cannot reshape the tree, and every keystroke on one line
        sees the same tree (and the parse cache returns it without parsing).
        """
        grammar_ok = spec.module is not None and grammar(spec.name) is not None
        if grammar_ok:
            window = window_for(text, offset)
        elif len(text) > budget * MAX_CHARS_PER_TOKEN * 4:
            start = max(0, offset - budget * MAX_CHARS_PER_TOKEN * 4)
            newline = text.find("\n", start, offset)
            start = newline + 1 if start > 0 and newline >= 0 else start
            window = Window(start, offset, text.count("\n", 0, start))
        else:
            window = Window(0, len(text), 0)
        local = clean(text[window.start : window.end])  # same length: a lone surrogate becomes "?"
        cursor = offset - window.start
        lines = split_rows(local)
        row = local.count("\n", 0, cursor)
        line_start = local.rfind("\n", 0, cursor) + 1
        cursor_text = local[line_start:cursor]
        if not grammar_ok:
            return window, text_outline(lines, row), lines, row, cursor_text
        line_end = local.find("\n", cursor)
        line_end = len(local) if line_end < 0 else line_end
        indent = cursor_text[: len(cursor_text) - len(cursor_text.lstrip(" \t"))]
        placeholder = indent + ("pass" if spec.name == "python" else "")
        parsed = self.parses.parse(
            uri or "untitled:", local[:line_start] + placeholder + local[line_end:], window, spec.name
        )
        if parsed is None:
            return window, text_outline(lines, row), lines, row, cursor_text
        col = len(to_bytes(indent))
        outline = SyntaxOutline(parsed.tree, lines, spec.name).outline(row, col)
        return window, outline, lines, row, cursor_text

    def _suffix(self, text: str, offset: int, tokens: Tokens, budget: int) -> tuple[str, list[int]]:
        """The text after the cursor for a FIM prompt: whole lines, nearest first, within budget."""
        end = offset
        while end < len(text) and end - offset < budget * MAX_CHARS_PER_TOKEN:
            newline = text.find("\n", end)
            end = len(text) if newline < 0 else newline + 1
        suffix = clean(text[offset:end])
        ids = tokens.ids(suffix)
        while len(ids) > budget and suffix:
            cut = suffix.rstrip("\n").rfind("\n")
            suffix = suffix[: cut + 1] if cut >= 0 else ""
            ids = tokens.ids(suffix)
        return suffix, ids

    def _after_cursor(
        self,
        request: ContextRequest,
        template: fim.FimTemplate | None,
        offset: int,
        tokens: Tokens,
        budget: int,
    ) -> tuple[str, list[int], int]:
        """The text after the cursor the prompt shows, its ids (those a FIM template fills in), and
        the tokens it and the template cost: nothing without FIM or an engine's own FIM."""
        share = int(budget * SUFFIX_SHARE)
        if template is not None:
            suffix, suffix_ids = self._suffix(request.text, offset, tokens, share)
            return suffix, suffix_ids, fim.overhead(template, tokens)
        if request.engine_suffix:
            suffix = self._suffix_text(request.text, offset, tokens, share)
            return suffix, [], tokens.count(suffix)
        return "", [], 0

    @staticmethod
    def _suffix_text(text: str, offset: int, tokens: Tokens, budget: int) -> str:
        """The suffix for an engine's own FIM: whole lines, nearest first, within ``budget`` as
        counted (estimated, for a remote tokenizer)."""
        end, kept = offset, offset
        while end < len(text) and end - offset < budget * MAX_CHARS_PER_TOKEN:
            newline = text.find("\n", end)
            end = len(text) if newline < 0 else newline + 1
            if tokens.count(clean(text[offset:end])) > budget:
                break
            kept = end
        return clean(text[offset:kept])

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

    def _cross_file(
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

    def _snippets(
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
        for found, left in self._cross_file(request, lines, row, tokens, budget):
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

    @staticmethod
    def _layout(
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

    def _repo_files(
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
        for found, left in self._cross_file(request, lines, row, tokens, budget):
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


__all__ = [
    "ContextBuilder",
    "ContextRequest",
    "OpenDocument",
    "Prompt",
]


@dataclass(frozen=True)
class _Above:
    """The prompt's text before the cursor and its ids; where the cursor's line goes after the
    middle marker, the rows that go there before it: their text, and how many ids the middle
    holds (the end of ``ids``: those rows', then the line's)."""

    text: str
    ids: list[int]
    middle: str = ""
    middle_ids: int = 0


@dataclass(frozen=True)
class _End:
    """The prompt's end, healed: the text before the cursor and the ids of the prefix slot, the
    ids after the middle marker and the line they hold, and the text healing backed up over."""

    text: str
    ids: list[int]
    middle: list[int]
    line: str
    healed: str


def _healed_end(
    above: _Above, line: str, line_ids: list[int] | None, request: ContextRequest, tokens: Tokens
) -> _End:
    """Heal the prompt's end: the cursor's ``line`` alone where it goes after the middle marker
    (``line_ids``, the end of ``above.ids``), else the whole prefix; ``line`` is kept for an
    engine's own FIM, which takes the cursor's line apart."""
    prefix, ids = above.text, above.ids
    if line_ids is not None:
        start = len(ids) - above.middle_ids
        before = prefix[: len(prefix) - len(line)]
        line, middle, healed = (
            _healed(line, line_ids, tokens, whole=True) if request.heal else (line, line_ids, "")
        )
        rows = ids[start : len(ids) - len(line_ids)]
        return _End(before + line, ids[:start], rows + middle, above.middle + line, healed)
    line_start = len(prefix) - len(line)
    prefix, ids, healed = _healed(prefix, ids, tokens) if request.heal else (prefix, ids, "")
    line = prefix[min(max(line_start, 0), len(prefix)) :] if request.engine_suffix else ""
    return _End(prefix, ids, [], line, healed)


def _healed(prefix: str, ids: list[int], tokens: Tokens, whole: bool = False) -> tuple[str, list[int], str]:
    """The prompt backed up over its last token where the cursor is mid-word or after whitespace
    (token healing): its text, its ids, and the text removed, which the output must begin with.
    ``whole``: the text may be backed up over entirely (a FIM middle: the prompt goes on before it)."""
    if not prefix or not (prefix.endswith(HEALABLE) or _WORD_END.search(prefix)):
        return prefix, ids, ""
    from decoding.engine.healing import back_up

    cut = back_up(ids, prefix, tokens.decode, tokens.healing_index)
    if cut.removed and (len(cut.removed) < len(prefix) or whole):
        return prefix[: -len(cut.removed)], cut.ids, cut.removed
    return prefix, ids, ""


def _fewest_lines(snippet: Snippet) -> int:
    """An excerpt cut from its end keeps at least this many lines: a few for a window of code (less
    says nothing), one for definitions (each line is a signature of its own)."""
    return 1 if snippet.kind == "definition" else min(snippet.text.count("\n") + 1, MIN_SNIPPET_LINES)


def _mostly_held(text: str, held: str) -> bool:
    """Whether most of ``text``'s lines (whitespace aside) are lines of ``held`` already."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    have = {line.strip() for line in held.splitlines()}
    return not lines or sum(line in have for line in lines) * 2 >= len(lines)
