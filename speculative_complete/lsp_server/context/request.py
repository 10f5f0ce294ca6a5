"""What the context builder is asked (``ContextRequest``) and what it answers (``Prompt``)."""

from __future__ import annotations

from dataclasses import dataclass

from speculative_complete.lsp_server.context.languages import LanguageSpec
from speculative_complete.lsp_server.context.snippets import OpenDocument, Snippet
from speculative_complete.lsp_server.context.symbols import SymbolTable


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
