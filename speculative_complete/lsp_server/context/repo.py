"""Names for the repository-level prompt layout: the repository's name and each file's path in it.

Qwen2.5-Coder was trained on whole repositories written as ``<|repo_name|>`` and a name, then
``<|file_sep|>`` and a path before each file (``fim.py``). The model reads those names as part of
the code: a path says which language and which module a file is, so it should be what the user
sees, relative to the project, and never change while the user types (a different name would
change the prompt from its first tokens and cost a prefill of all of it).

The repository is, first match wins:

1. the deepest workspace folder the editor named that holds the document;
2. the nearest folder above the document that has a ``.git`` (a local ``file:`` document only;
   looked up once per folder and kept for the process, so a repository created later is seen
   after a restart, never in the middle of a session);
3. the document's own folder.

Its name is that folder's last component. Paths are relative to it; a file outside it is named by
its last two path components (as the comment snippets name it), never with ``..``. A document
without a path (``untitled:Untitled-1``) is named by what its URI has, with its language's
extension added, so the model still sees a ``.py``.
"""

from __future__ import annotations

import functools
import os
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

from speculative_complete.lsp_server.context.languages import EXTENSIONS, LanguageSpec

FALLBACK_NAME = "project"  # when no folder gives a name (a document at "/", an untitled one)
MAX_GIT_DEPTH = 64  # folders walked up looking for .git
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # a name is one line of the prompt: no line breaks in it
_DRIVE = re.compile(r"/[A-Za-z]:")


@dataclass(frozen=True)
class Location:
    """Where a URI points: its scheme and its slash-separated path (percent-decoded)."""

    scheme: str
    path: str  # "" when the URI has no hierarchical path (untitled:Untitled-1 has "Untitled-1")

    @property
    def hierarchical(self) -> bool:
        return self.path.startswith("/")


@dataclass(frozen=True)
class Repository:
    """The repository a document is shown in: its root folder (a path in ``scheme``) and name."""

    scheme: str
    root: str | None  # None: the document has no folder (an untitled one)
    name: str

    def path_of(self, uri: str, language: LanguageSpec | None = None) -> str:
        """The name ``uri`` gets in the layout: relative to the root when it is inside it, else its
        last two components; an untitled document's name gets ``language``'s extension."""
        where = locate(uri)
        if not where.hierarchical:
            return _untitled_name(uri, where, language)
        if self.root is not None and where.scheme == self.scheme:
            relative = _relative(where.path, self.root)
            if relative:
                return one_line(relative)
        parts = [p for p in where.path.split("/") if p]
        return one_line(posixpath.join(*parts[-2:])) if parts else FALLBACK_NAME


def locate(uri: str) -> Location:
    """A URI's scheme and path. A plain path (no scheme) is taken as a local file's."""
    if uri.startswith("/"):
        return Location("file", uri)
    try:
        parsed = urlparse(uri)
    except ValueError:
        return Location("", "")
    return Location(parsed.scheme.lower(), unquote(parsed.path))


def repository_for(uri: str, workspace_folders: Sequence[str] = ()) -> Repository:
    """The repository ``uri`` is shown in (see the module's docstring for the order)."""
    where = locate(uri)
    folders = [locate(f) for f in workspace_folders]
    if not where.hierarchical:
        first = next((f for f in folders if f.hierarchical), None)
        if first is None:
            return Repository(where.scheme, None, FALLBACK_NAME)
        return Repository(first.scheme, _folder(first.path), _name(first.path))
    holding = [
        _folder(f.path)
        for f in folders
        if f.scheme == where.scheme and f.hierarchical and _relative(where.path, _folder(f.path))
    ]
    if holding:
        root = max(holding, key=len)
    else:
        parent = posixpath.dirname(where.path)
        root = (git_root(parent) if where.scheme == "file" else None) or parent
    return Repository(where.scheme, root, _name(root))


@functools.lru_cache(maxsize=1024)
def git_root(folder: str) -> str | None:
    """The nearest folder at or above ``folder`` (a local path) that has a ``.git`` (a folder, or
    the file a worktree or submodule has), or None."""
    current = folder or "/"
    for _ in range(MAX_GIT_DEPTH):
        local = current[1:] if _DRIVE.match(current) else current  # file:///c:/x is C:\x on Windows
        if os.path.exists(os.path.join(local, ".git")):
            return current
        parent = posixpath.dirname(current)
        if parent == current:
            return None
        current = parent
    return None


def one_line(name: str) -> str:
    """A name as one line of the prompt: control characters (a newline would end it) become "?"."""
    return _CONTROL.sub("?", name)


def _folder(path: str) -> str:
    """A folder's path without a trailing slash ("/" stays "/")."""
    stripped = path.rstrip("/")
    return stripped or "/"


def _relative(path: str, root: str) -> str:
    """``path`` relative to the folder ``root``, or "" when it is not inside it."""
    prefix = root if root.endswith("/") else root + "/"
    return path[len(prefix) :] if path.startswith(prefix) and len(path) > len(prefix) else ""


def _name(root: str) -> str:
    return one_line(posixpath.basename(_folder(root))) or FALLBACK_NAME


def _untitled_name(uri: str, where: Location, language: LanguageSpec | None) -> str:
    """``untitled:Untitled-1`` in Python: ``Untitled-1.py``."""
    name = posixpath.basename(where.path.rstrip("/")) or posixpath.basename(uri.rstrip("/")) or "untitled"
    name = one_line(name)
    if language is not None and not posixpath.splitext(name)[1]:
        extension = _EXTENSION.get(language.name)
        if extension:
            name += extension
    return name


# The first extension listed for each language: what an untitled document's name gets.
_EXTENSION: dict[str, str] = {}
for _ext, _language in EXTENSIONS.items():
    _EXTENSION.setdefault(_language, _ext)
