"""The protocol edge: an LSP server (pygls, asyncio) that serves whole-line code completions."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("lsp-speculative-complete")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
