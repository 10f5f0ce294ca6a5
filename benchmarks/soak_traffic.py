"""What the soak sends: real source files as documents, typing into them (non-ASCII and astral
characters included, positions in UTF-16 code units as LSP's default says), and bad traffic.

Every document is mirrored here, so each incremental edit and each request position is computed
against the text the server should have; a server that drifted would answer InvalidParams for
positions that are valid, and the soak counts those.
"""

from __future__ import annotations

import json
import random
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.soak_wire import frame

# What the user types: mostly code characters, some non-ASCII, some astral (two UTF-16 units).
TYPED = list("abcdefghijklmnopqrstuvwxyz_ ().,:=+[]{}'\"0123456789") + [
    "é",
    "ß",
    "中",
    "→",
    "😀",
    "𝔘",
    "🐍",
    "\t",
    "\n",
]
LANGUAGES = {
    ".py": "python",
    ".js": "javascript",
    ".ts": "typescript",
    ".c": "c",
    ".h": "c",
    ".go": "go",
    ".rs": "rust",
    ".java": "java",
    ".cpp": "cpp",
}
OTHER_ROOTS = ("/usr/include", "/usr/share", "/usr/lib/node_modules", "/usr/lib/go")
MAX_FILE_BYTES = 200_000


def _candidates(root: Path, suffix: str, limit: int) -> list[Path]:
    found: list[Path] = []
    if not root.is_dir():
        return found
    for path in sorted(root.rglob(f"*{suffix}")):
        try:
            if path.is_file() and 2_000 <= path.stat().st_size <= MAX_FILE_BYTES:
                found.append(path)
        except OSError:
            continue
        if len(found) >= limit:
            break
    return found


def corpus(count: int, seed: int) -> list[Path]:
    """``count`` real source files on this machine: the Python standard library, plus C, JavaScript,
    TypeScript and Go files where the system has some (a quarter of the corpus at most)."""
    rng = random.Random(seed)
    others: list[Path] = []
    for suffix in (".c", ".h", ".js", ".ts", ".go"):
        for root in OTHER_ROOTS:
            others += _candidates(Path(root), suffix, 40)
    rng.shuffle(others)
    others = others[: count // 4]
    stdlib = _candidates(Path(sysconfig.get_paths()["stdlib"]), ".py", 2000)
    rng.shuffle(stdlib)
    return sorted(stdlib[: count - len(others)] + others)


def utf16(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


@dataclass
class Doc:
    """A document as the server should have it: LF-only lines and a cursor (in characters)."""

    uri: str
    language_id: str
    lines: list[str]
    version: int = 1
    row: int = 0
    col: int = 0
    open: bool = False

    @classmethod
    def from_text(cls, uri: str, language_id: str, text: str) -> Doc:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
        return cls(uri, language_id, text.split("\n"))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def position(self, row: int, col: int) -> dict[str, int]:
        return {"line": row, "character": utf16(self.lines[row][:col])}

    def cursor(self) -> dict[str, int]:
        return self.position(self.row, self.col)

    def item(self) -> dict[str, Any]:
        return {"uri": self.uri, "languageId": self.language_id, "version": self.version, "text": self.text}

    def replace(self, start: tuple[int, int], end: tuple[int, int], new: str) -> dict[str, Any]:
        """Apply an edit here; the didChange content change that says the same."""
        change = {"range": {"start": self.position(*start), "end": self.position(*end)}, "text": new}
        head, tail = self.lines[start[0]][: start[1]], self.lines[end[0]][end[1] :]
        inserted = (head + new + tail).split("\n")
        self.lines[start[0] : end[0] + 1] = inserted
        last = inserted[-1]
        self.row, self.col = start[0] + len(inserted) - 1, len(last) - len(tail)
        self.version += 1
        return change


@dataclass
class Typist:
    """Seeded edits as a user makes them: typing at the cursor, backspace, a jump, a paste."""

    rng: random.Random
    counts: dict[str, int] = field(default_factory=dict)

    def edit(self, doc: Doc) -> dict[str, Any]:
        roll = self.rng.random()
        if roll < 0.08 or doc.row >= len(doc.lines):  # jump somewhere else
            doc.row = self.rng.randrange(len(doc.lines))
            doc.col = self.rng.randint(0, len(doc.lines[doc.row]))
        kind = "type" if roll < 0.75 else "backspace" if roll < 0.9 else "paste"
        self.counts[kind] = self.counts.get(kind, 0) + 1
        here = (doc.row, doc.col)
        if kind == "backspace":
            start = (
                (doc.row, doc.col - 1)
                if doc.col
                else (max(doc.row - 1, 0), len(doc.lines[max(doc.row - 1, 0)]))
            )
            return doc.replace(start, here, "")
        if kind == "paste":
            row = self.rng.randrange(len(doc.lines))
            text = "\n".join(doc.lines[row : row + self.rng.randint(1, 4)]) + "  # 😀 é\n"
            return doc.replace(here, here, text)
        return doc.replace(here, here, "".join(self.rng.choices(TYPED, k=self.rng.randint(1, 3))))


def inline_params(doc: Doc, trigger: int) -> dict[str, Any]:
    return {"textDocument": {"uri": doc.uri}, "position": doc.cursor(), "context": {"triggerKind": trigger}}


# -- bad traffic ----------------------------------------------------------------------------------
# Each returns (frame bytes, whether the server can answer it, whether it is a completion request
# that reaches the handler, whether that one is answered with an LSP error).


def bad_requests(doc: Doc, msg_id: int, rng: random.Random) -> list[tuple[str, dict[str, Any], str]]:
    """Parseable requests whose params are wrong: (label, message, expected outcome), where the
    outcome is "invalid" (InvalidParams before the handler), "error" (InvalidParams from the
    handler: counted), "answer" (a result: counted) or "not_found"."""
    method = "textDocument/inlineCompletion"
    good = inline_params(doc, 1)
    past_end = {**good, "position": {"line": len(doc.lines) + rng.randint(1, 50), "character": 0}}
    wide = {**good, "position": {"line": doc.row, "character": 10**6}}
    cases = [
        ("line past the end", past_end, "error"),
        ("character past the line's end", wide, "answer"),
        ("negative line", {**good, "position": {"line": -1, "character": 0}}, "invalid"),
        ("line of the wrong type", {**good, "position": {"line": "two", "character": 0}}, "invalid"),
        ("textDocument of the wrong type", {**good, "textDocument": [doc.uri]}, "invalid"),
        ("missing position", {"textDocument": {"uri": doc.uri}, "context": {"triggerKind": 1}}, "invalid"),
        ("null params", None, "invalid"),
        ("params absent", "ABSENT", "invalid"),
        ("unknown document", {**good, "textDocument": {"uri": "file:///nowhere/x.py"}}, "answer"),
    ]
    label, params, outcome = rng.choice(cases)
    message = {"jsonrpc": "2.0", "id": msg_id, "method": method}
    if params != "ABSENT":
        message["params"] = params
    if rng.random() < 0.15:
        message = {"jsonrpc": "2.0", "id": msg_id, "method": f"soak/unknown{rng.randint(0, 9)}", "params": {}}
        label, outcome = "unknown method", "not_found"
    return [(label, message, outcome)]


def bad_frames(rng: random.Random, doc: Doc, msg_id: int) -> tuple[str, bytes, bool]:
    """A frame no server can take as it is: (label, bytes, whether ``msg_id`` is answered).
    Each leaves the stream at a frame boundary, so the next frame is read as sent."""
    good = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": msg_id,
            "method": "textDocument/inlineCompletion",
            "params": inline_params(doc, 1),
        }
    ).encode()
    choice = rng.randrange(7)
    if choice == 0:
        return "truncated body", frame(good[: len(good) // 2]), False
    if choice == 1:
        return "not JSON", frame(b"this is not JSON {"), False
    if choice == 2:
        return "not UTF-8, not JSON", frame(bytes(rng.randrange(128, 256) for _ in range(40))), False
    if choice == 3:  # invalid bytes inside a string: repaired, answered (an unknown document)
        body = good.replace(doc.uri.encode(), b"file:///caf\xe9\xff.py")
        return "not UTF-8 inside a string", frame(body), True
    if choice == 4:  # a Content-Length too long: the filler it swallows is junk, not a frame
        extra = rng.randint(1, 30)
        return "Content-Length too long", frame(good, len(good) + extra) + b"x" * extra, False
    if choice == 5:  # too short: the rest of the body spills into the next header line
        return "Content-Length too short", frame(good, len(good) - rng.randint(1, 20)), False
    return "JSON that is not a message", frame(rng.choice([b"[1, 2]", b'"text"', b"null", b"{}"])), False
