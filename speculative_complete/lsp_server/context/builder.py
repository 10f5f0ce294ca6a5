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
prompt's last token is backed up over (``speculative_complete.decoding.engine.healing.back_up``) and
``Prompt.healed`` holds the text removed; the engine makes the output start with it and returns only
what follows it. A line after the middle marker is healed alone (it may be backed up over whole; at
a line start there is nothing to heal).

This module lays the prompt out; its pieces are modules of their own: ``cursor.py`` (the window
and the outline around the cursor), ``cross_file.py`` (the other files' excerpts, the repository
layout), ``after_cursor.py`` (the suffix), ``sticky_rows.py`` (``Shown``: the rows kept),
``token_healing.py`` (the healed end), ``text.py`` and ``request.py`` (``ContextRequest``, ``Prompt``).
"""

from __future__ import annotations

import logging

from speculative_complete.lsp_server.context import definitions, fim
from speculative_complete.lsp_server.context.after_cursor import after_cursor
from speculative_complete.lsp_server.context.budget import render, select_rows
from speculative_complete.lsp_server.context.cross_file import CrossFile, repo_layout
from speculative_complete.lsp_server.context.cursor import cursor_outline
from speculative_complete.lsp_server.context.languages import detect
from speculative_complete.lsp_server.context.outline import Outline
from speculative_complete.lsp_server.context.request import ContextRequest, Prompt
from speculative_complete.lsp_server.context.snippets import OpenDocument, SnippetIndex
from speculative_complete.lsp_server.context.sticky_rows import (
    RESERVE_STEP,
    STICKY_SLACK,
    Shown,
    kept_rows,
    remember,
)
from speculative_complete.lsp_server.context.symbols import SymbolCache
from speculative_complete.lsp_server.context.syntax import ParseCache, Window
from speculative_complete.lsp_server.context.text import clean, fit_exact
from speculative_complete.lsp_server.context.token_healing import Above, healed_end
from speculative_complete.lsp_server.context.tokens import Tokens

log = logging.getLogger(__name__)


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
        The answer memory keys on it (``speculative_complete.lsp_server.reuse``); the event loop may
        read it, as it is a frozen value replaced whole."""
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
        window, outline, lines, row, cursor_text = cursor_outline(
            self.parses, request.uri, request.text, offset, spec, budget
        )

        template = fim.resolve(request.fim_template, tokens)
        excerpts = CrossFile(self.snippets, self.symbols, self.definitions)
        layout = repo_layout(request, template, spec, tokens, budget)
        if template is not None and layout is None:
            template = fim.file_only(template)
        suffix, suffix_ids, overhead = after_cursor(request, template, offset, tokens, budget)

        header: list[int] = []  # the repository layout's ids, before the FIM prompt
        if template is not None and layout is not None:
            chosen, files = excerpts.as_repo_files(request, lines, row, layout, tokens, budget)
            name = layout.repository.name
            header = fim.repo_ids(template, name, files, layout.path, tokens)
            snippet_text, key = "", fim.repo_text(template, name, files, layout.path)
        else:
            chosen, snippet_text = excerpts.as_comments(request, lines, row, spec, tokens, budget)
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
            above = Above(*fit_exact(above.text, tokens, max(room, 0)))
            line_ids = None  # what is left of it stays in the prefix slot

        end = healed_end(above, line, line_ids, request, tokens)
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
    ) -> Above:
        """The prompt's text before the cursor with ``rows`` shown, and its ids: one encoding, or,
        where the cursor's line is encoded apart (``line_ids``), the rows' above ``middle_row``,
        then those from it on (every one of them shown), then the line's."""
        snippet_text, cursor_text = head
        first = min(rows, default=row)
        if line_ids is None:
            prefix = clean(snippet_text + render(rows, lines, first, row) + cursor_text)
            return Above(prefix, tokens.encode(prefix))
        above = clean(snippet_text + render(rows, lines, min(first, middle_row), middle_row))
        middle = "".join(lines[middle_row:row])
        middle_ids = tokens.ids(middle) + line_ids
        return Above(
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
    ) -> tuple[set[int], Above]:
        """The rows shown above the cursor, and the prompt's text before it and its ids: the rows
        the document's last prompt showed where they still fit (``Shown``) and what came before
        them (``key``) is unchanged, else rows chosen afresh (``budget.select_rows``), asking for
        less where the pieces merged into more tokens than ``room``."""
        uri, slack = request.uri, int(max(rows_budget, 0) * STICKY_SLACK)
        # A renewal keeps the rows an earlier one chose, while its prefill is not yet done.
        shown = self.renewing if request.renew_rows else self.shown
        last = shown.get(uri) if uri else None
        kept = kept_rows(last, window, lines, row, key)
        if kept is not None and last is not None:
            middle_row = row if line_ids is None else last.middle_row - window.first_row
            above = self._render(kept, lines, row, head, tokens, line_ids, middle_row)
            if len(above.ids) <= room:
                remember(
                    uri, window, lines, (row, middle_row), kept, key, (room - len(above.ids), slack), shown
                )
                return kept, above
        if kept is not None or request.renew_rows:
            rows_budget -= slack  # typing outgrew them (or soon would): room to grow
            log.debug("%s: rows chosen again (%s)", uri, "renewed" if request.renew_rows else "outgrown")
        rows: set[int] = set()
        above = Above("", [])
        for _ in range(4):
            rows = select_rows(outline, lines, tokens.count, max(rows_budget, 0))
            above = self._render(rows, lines, row, head, tokens, line_ids, row)
            if len(above.ids) <= room:
                break
            rows_budget -= len(above.ids) - room + 8  # pieces merged differently: ask for less
        if not request.renew_rows:
            self.renewing.pop(uri, None)  # outgrown first: what was renewed is older than these rows
        remember(uri, window, lines, (row, row), rows, key, (room - len(above.ids), slack), shown)
        return rows, above


__all__ = [
    "ContextBuilder",
    "ContextRequest",
    "OpenDocument",
    "Prompt",
]
