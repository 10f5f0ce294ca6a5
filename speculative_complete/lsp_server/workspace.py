"""The workspace's source files as a draft source for the n-gram drafter.

Code is written after the code around it: a call, a signature or a whole block typed in one file
usually exists in another file of the same project. At ``initialize`` the workspace folders are
walked (in ``.gitignore``'s sense, through ``pathspec``, git's own matching rules, and within
``WorkspaceLimits``), their source files read on a thread of their own and kept as text; saves
and ``workspace/didChangeWatchedFiles`` re-read or drop single files.

Tokenizing runs on the decode worker as idle-time jobs, like the open documents' indexing in
``sources.py``: the tokenizer is the engine's and is not shared across threads, and any request
pre-empts the job between files. The index
(``speculative_complete.decoding.corpus_index.CorpusIndex``, a suffix array,
``benchmarks/corpus_bench.py``) is then built on a thread of its own, so that a request arriving
meanwhile does not wait for it, and replaces the drafter's old one whole; until then the old one
serves.

The same texts give the prompt the project's definitions (``context.symbols``): each file is parsed
for them on the thread that read it, and ``symbols`` is replaced whole after each scan or change,
so the worker reads a consistent table without a lock. Nothing here touches the network, and a
remote engine (no local drafter) skips all of it.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from speculative_complete.decoding.corpus_index import CorpusIndex  # numpy only: no torch
from speculative_complete.lsp_server.context import FileSymbols, SymbolTable, extract
from speculative_complete.lsp_server.context.languages import EXTENSIONS

if TYPE_CHECKING:  # decoding imports torch: the worker thread loads it
    from speculative_complete.decoding.drafter_interface import DocumentSources

log = logging.getLogger(__name__)

SKIPPED_DIRS = frozenset({"node_modules", "__pycache__", "site-packages", "dist-packages"})
BINARY_PROBE_BYTES = 8192
WATCHED_GLOB = "**/*{" + ",".join(sorted(EXTENSIONS)) + "}"  # what the client is asked to watch


@dataclass(frozen=True)
class WorkspaceLimits:
    max_bytes: int = 8 << 20  # all files together (``workspaceIndexMb``); 0: no workspace index
    max_files: int = 5000
    max_file_bytes: int = 256 << 10  # larger files are generated or data, not code to copy from
    max_dirs: int = 20000  # a root at a home folder must not walk the whole disk


def _ignore_spec(directory: Path) -> Any | None:
    """The directory's own ``.gitignore`` as a matcher, or None."""
    path = directory / ".gitignore"
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    import pathspec

    return pathspec.GitIgnoreSpec.from_lines(lines)


def _ignored(path: Path, is_dir: bool, specs: Sequence[tuple[Path, Any]]) -> bool:
    """Whether a ``.gitignore`` of ``path``'s directory or one above it excludes ``path``."""
    for base, spec in specs:
        relative = path.relative_to(base).as_posix() + ("/" if is_dir else "")
        if spec.match_file(relative):
            return True
    return False


def excluded(path: Path, root: Path) -> bool:
    """Whether the walk from ``root`` would leave ``path`` out (for a single changed file)."""
    relative = path.relative_to(root)
    if any(part.startswith(".") or part in SKIPPED_DIRS for part in relative.parts):
        return True
    if path.suffix.lower() not in EXTENSIONS:
        return True
    specs: list[tuple[Path, Any]] = []
    directory = root
    for part in relative.parts:
        own = _ignore_spec(directory)
        specs = [*specs, (directory, own)] if own is not None else specs
        directory = directory / part
        if _ignored(directory, directory != path, specs):
            return True
    return False


def source_files(roots: Iterable[Path], limits: WorkspaceLimits) -> Iterator[Path]:
    """Source files under ``roots`` that git would track, in a stable order, hidden folders and
    dependency folders left out; at most ``limits.max_files``."""
    count = dirs = 0
    for root in roots:
        stack: list[tuple[Path, list[tuple[Path, Any]]]] = [(root, [])]
        while stack:
            directory, specs = stack.pop()
            dirs += 1
            if dirs > limits.max_dirs:
                return
            own = _ignore_spec(directory)
            specs = [*specs, (directory, own)] if own is not None else specs
            try:
                entries = sorted(os.scandir(directory), key=lambda e: e.name)
            except OSError:
                continue
            subdirs = []
            for entry in entries:
                path = Path(entry.path)
                if entry.name.startswith(".") or entry.is_symlink():
                    continue
                if entry.is_dir():
                    if entry.name not in SKIPPED_DIRS and not _ignored(path, True, specs):
                        subdirs.append((path, specs))
                elif Path(entry.name).suffix.lower() in EXTENSIONS and not _ignored(path, False, specs):
                    yield path
                    count += 1
                    if count >= limits.max_files:
                        return
            stack.extend(reversed(subdirs))


def read_source(path: Path, limits: WorkspaceLimits) -> str | None:
    """The file's text, or None where it is too large, binary, or unreadable."""
    try:
        if path.stat().st_size > limits.max_file_bytes:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data[:BINARY_PROBE_BYTES]:
        return None
    return data.decode("utf-8", errors="replace")


class WorkspaceIndex:
    """The workspace's files: text on any thread, tokens and index on the worker, the index built
    on a thread of its own.

    A plain class, not a dataclass: it owns a lock and a thread, and comparing or copying it
    field by field would mean nothing. ``_lock`` guards what more than one thread writes or reads
    together: the texts and what is stale (scans and file changes, on their own threads), and the
    builder's state, which the builder thread writes when it ends and the worker and the stats
    read (which build is under way, the version it was built from, its size).
    """

    def __init__(self, limits: WorkspaceLimits | None = None) -> None:
        self.limits = limits or WorkspaceLimits()
        self.roots: list[Path] = []
        self.scans = 0
        self.index_tokens = 0
        self.index_bytes = 0  # the index and the per-file tokens it is rebuilt from
        self._lock = threading.Lock()
        self._texts: dict[Path, str] = {}  # what is on disk now, within the limits
        self._stale: set[Path] = set()  # texts not tokenized since they changed
        self._scan_generation = 0
        self._tokens: dict[Path, np.ndarray] = {}  # int32; worker only
        self._version = 0  # bumped whenever ``_tokens`` changes (worker only)
        self._drafter: weakref.ref | None = None  # worker only
        self._built_version = 0  # the ``_version`` the drafter's index was built from
        self._builder: threading.Thread | None = None  # the build under way
        self.symbols = SymbolTable()  # the files' definitions, replaced whole (any thread reads it)
        self.symbols_version = 0  # bumped with each new table: part of a request's identity
        self._definitions: dict[Path, FileSymbols] = {}  # per file; under ``_lock``

    # -- any thread ----------------------------------------------------------------------------------
    def scan(self, roots: Iterable[Path], limits: WorkspaceLimits) -> int:
        """Walk ``roots`` and replace every text with what is on disk; how many files are kept.
        Blocking (the file system): run it on a thread of its own. A later scan's result wins
        over an earlier one still running."""
        with self._lock:
            self._scan_generation += 1
            generation = self._scan_generation
        roots = [Path(root) for root in roots] if limits.max_bytes > 0 else []
        found: dict[Path, str] = {}
        total = 0
        for path in source_files(roots, limits):
            text = read_source(path, limits)
            if text is None or total + len(text) > limits.max_bytes:
                continue
            found[path], total = text, total + len(text)
        with self._lock:
            if generation != self._scan_generation:
                return 0
            self.roots, self.limits = roots, limits
            self._stale |= {p for p, t in found.items() if self._texts.get(p) != t}
            self._stale |= self._texts.keys() - found.keys()
            self._texts = found
            self.scans += 1
        self._update_symbols(found.keys(), replace=True)
        log.info("workspace: %d source files, %d KB, under %s", len(found), total >> 10, roots)
        return len(found)

    def changed(self, paths: Iterable[Path]) -> int:
        """Files saved, created, changed or deleted: re-read those under a root (blocking: a
        thread of its own). How many files this changed."""
        updates: dict[Path, str | None] = {}
        for path in paths:
            root = next((root for root in self.roots if path.is_relative_to(root)), None)
            if root is None or excluded(path, root):
                continue
            updates[path] = read_source(path, self.limits) if path.is_file() else None
        changed = 0
        with self._lock:
            for path, text in updates.items():
                if self._texts.get(path) == text:
                    continue
                room = self.limits.max_bytes - self._total_chars() + len(self._texts.get(path, ""))
                if text is None or len(text) > room:
                    self._texts.pop(path, None)
                else:
                    self._texts[path] = text
                self._stale.add(path)
                changed += 1
        self._update_symbols(updates.keys())
        return changed

    def _update_symbols(self, paths: Iterable[Path], replace: bool = False) -> None:
        """Parse ``paths``' texts for definitions where they changed, and publish a new table (all
        of it from the current texts when ``replace``)."""
        with self._lock:
            texts = {path: self._texts.get(path) for path in paths}
            known = dict(self._definitions)
        fresh: dict[Path, FileSymbols] = {}
        for path, text in texts.items():
            old = known.get(path)
            if text is not None and (old is None or old.text_hash != hash(text)):
                fresh[path] = extract(path.as_uri(), text, EXTENSIONS[path.suffix.lower()])
        with self._lock:
            for path, text in texts.items():
                if text is None or self._texts.get(path) != text:
                    self._definitions.pop(path, None)
            self._definitions.update((p, f) for p, f in fresh.items() if self._texts.get(p) is not None)
            if replace:
                self._definitions = {p: f for p, f in self._definitions.items() if p in self._texts}
            self.symbols = SymbolTable.of(self._definitions.values())
            self.symbols_version += 1

    def _total_chars(self) -> int:
        return sum(len(text) for text in self._texts.values())

    @property
    def pending(self) -> bool:
        """Whether the worker has files to tokenize or an index to build (for a new model too)."""
        new_model = self._drafter is None or self._drafter() is None
        with self._lock:
            return bool(self._stale) or self._built_version != self._version or new_model

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            files, chars = len(self._texts), self._total_chars()
            tokens, index_bytes = self.index_tokens, self.index_bytes
        return {
            "roots": [str(root) for root in self.roots],
            "files": files,
            "bytes": chars,
            "max_bytes": self.limits.max_bytes,
            "tokens": tokens,
            "index_bytes": index_bytes,
            "pending": self.pending,  # files to tokenize or an index to build
            "scanned": self.scans > 0,
            "definitions": len(self.symbols),  # in the prompt's symbol table (``context.symbols``)
            **self._drafts(),
        }

    def _drafts(self) -> dict[str, int]:
        """How the index's drafts fared (counters the worker bumps; a stale read is harmless)."""
        ngram: DocumentSources | None = self._drafter() if self._drafter is not None else None
        if ngram is None:
            return {"drafts": 0, "proposed": 0, "accepted": 0}
        counts = ngram.corpus_counts
        return {"drafts": counts.drafts, "proposed": counts.proposed, "accepted": counts.accepted}

    # -- worker --------------------------------------------------------------------------------------
    def sync(
        self,
        ngram: DocumentSources | None,
        encode: Callable[[str], Sequence[int]],
        should_stop: Callable[[], bool],
    ) -> bool:
        """Tokenize changed files and give ``ngram`` a new index once all are; whether it did.

        Stops between files when ``should_stop`` says so; the rest is picked up next time."""
        if ngram is None:
            return False
        if self._drafter is None or self._drafter() is not ngram:  # a new model: its own tokens
            self._drafter, self._tokens = weakref.ref(ngram), {}
            self._version += 1
            with self._lock:
                self._stale |= self._texts.keys()
        while not should_stop():
            with self._lock:
                path = next(iter(self._stale), None)
                if path is None:
                    break
                self._stale.discard(path)
                text = self._texts.get(path)
            if text is None:
                self._tokens.pop(path, None)
            else:
                self._tokens[path] = np.asarray(encode(text), dtype=np.int32)
            self._version += 1
        if should_stop():
            return False
        with self._lock:
            if self._builder is not None or self._built_version == self._version or self._stale:
                return False
            documents = [self._tokens[path] for path in sorted(self._tokens)]
            build = functools.partial(self._build, ngram, documents, self._version)
            self._builder = threading.Thread(target=build, name="workspace-index", daemon=True)
            self._builder.start()  # its end waits for the lock, so it always finds itself there
        return True

    # -- the builder thread ------------------------------------------------------------------------
    def _build(self, ngram: DocumentSources, documents: list[np.ndarray], version: int) -> None:
        """Build the index and hand it to ``ngram`` (a reference swap its lookups read once)."""
        try:
            index = CorpusIndex(documents)
            ngram.corpus = index if len(index) else None
            cached = sum(tokens.nbytes for tokens in documents)  # kept for the next rebuild
            with self._lock:
                self.index_tokens, self.index_bytes = len(index), index.nbytes + cached
        except Exception:  # a bug must not retry forever: logged, and the old index stays
            log.exception("building the workspace index failed")
        finally:
            with self._lock:
                self._built_version, self._builder = version, None

    def wait_built(self, timeout: float | None = None) -> None:
        """Wait for a build under way (tests; the server never waits)."""
        with self._lock:
            builder = self._builder
        if builder is not None:
            builder.join(timeout)


def workspace_roots(folders: Iterable[str], root_uri: str | None) -> list[Path]:
    """Local folders from the workspace folders' URIs, else the root URI (only ``file:`` ones)."""
    from pygls.uris import to_fs_path, uri_scheme

    uris = list(folders) or ([root_uri] if root_uri else [])
    roots = []
    for uri in uris:
        path = to_fs_path(uri) if uri_scheme(uri) == "file" else None
        if path and Path(path).is_dir():
            roots.append(Path(path))
    return roots


def uri_paths(uris: Iterable[str]) -> list[Path]:
    """Local paths of ``file:`` URIs (others are not in any workspace folder)."""
    from pygls.uris import to_fs_path, uri_scheme

    paths = (to_fs_path(uri) if uri_scheme(uri) == "file" else None for uri in uris)
    return [Path(path) for path in paths if path]
