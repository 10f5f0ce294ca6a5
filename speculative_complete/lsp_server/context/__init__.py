"""The prompt: what the model sees of a document, within a token budget.

A closed group that needs only a tokenizer: ``builder.py`` (the prompt's layout) turns a
``ContextRequest`` into a ``Prompt`` (``request.py``) over ``cursor.py`` (the window and rows
around the cursor), ``sticky_rows.py`` (the rows kept across keystrokes), ``cross_file.py`` (the
other files' excerpts and their shares), ``after_cursor.py`` (the suffix), ``token_healing.py``
(the healed end), ``text.py``, ``syntax.py`` (tree-sitter trees), ``outline.py`` and ``budget.py``
(which rows fit), ``snippets.py`` (other open documents), ``symbols.py`` and ``definitions.py``
(the definitions of the names near the cursor, from the workspace's files and the open
documents), ``edits.py`` (the ring of recent edits across documents), ``fim.py``
(fill-in-the-middle templates, Qwen2.5-Coder's repository layout), ``repo.py`` (the repository's
name and the paths in that layout), ``languages.py`` (grammars and comment markers) and
``tokens.py`` (the tokenizer as counted). The rest of the server uses only what this module
exports.
"""

from speculative_complete.lsp_server.context.builder import ContextBuilder
from speculative_complete.lsp_server.context.edits import EditRing
from speculative_complete.lsp_server.context.fim import SETTING_NAMES as FIM_SETTINGS
from speculative_complete.lsp_server.context.fim import is_valid_setting as is_fim_setting
from speculative_complete.lsp_server.context.languages import LanguageSpec, detect, uri_path
from speculative_complete.lsp_server.context.request import ContextRequest, Prompt
from speculative_complete.lsp_server.context.snippets import OpenDocument
from speculative_complete.lsp_server.context.symbols import FileSymbols, SymbolTable, extract
from speculative_complete.lsp_server.context.tokens import Tokens

__all__ = [
    "FIM_SETTINGS",
    "ContextBuilder",
    "ContextRequest",
    "EditRing",
    "FileSymbols",
    "LanguageSpec",
    "OpenDocument",
    "Prompt",
    "SymbolTable",
    "Tokens",
    "detect",
    "extract",
    "is_fim_setting",
    "uri_path",
]
