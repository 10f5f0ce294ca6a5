"""The engine's raw text turned into the answer, as it streams: token healing's required prefix
checked and removed, and stop strings applied on this side.

Why on this side: a healed prompt backs up over its last token, so the answer must begin with the
removed text (``required_prefix``), which may itself hold a stop string (a healed line start holds
the newline). An engine told to stop at "\\n" would stop inside that prefix, so with a required
prefix the stops are not sent; the gate finds them and the caller closes the stream there, which
ends the engine's generation. llama.cpp also gets a grammar that forces the prefix; an
OpenAI-compatible engine has no portable constraint, so there the gate only checks it, and a
generation that strays from it ends at once, empty (as the local engine's failed healing does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Verdict = Literal["go", "stop", "unmet"]


@dataclass
class Gate:
    required_prefix: str = ""
    stops: tuple[str, ...] = ()
    raw: list[str] = field(default_factory=list)
    answer: str = ""  # the text after the required prefix, cut before the first stop
    verdict: Verdict = "go"

    def feed(self, piece: str) -> Verdict:
        """Adds a streamed piece; "stop" once a stop string appeared, "unmet" once the text
        strayed from the required prefix (the answer is then empty)."""
        if self.verdict != "go":
            return self.verdict
        self.raw.append(piece)
        text = "".join(self.raw)
        prefix = self.required_prefix
        if len(text) < len(prefix):
            if not prefix.startswith(text):
                self.verdict, self.answer = "unmet", ""
            return self.verdict
        if not text.startswith(prefix):
            self.verdict, self.answer = "unmet", ""
            return self.verdict
        body = text[len(prefix) :]
        cuts = [i for i in (body.find(s) for s in self.stops if s) if i >= 0]
        if cuts:
            self.verdict, body = "stop", body[: min(cuts)]
        self.answer = body
        return self.verdict

    @property
    def prefix_met(self) -> bool | None:
        """None without a required prefix; else whether the text began with it."""
        if not self.required_prefix:
            return None
        return self.verdict != "unmet" and len("".join(self.raw)) >= len(self.required_prefix)


def gbnf_literal(text: str) -> str:
    """``text`` as a GBNF string literal (llama.cpp's grammar format)."""
    escaped = []
    for char in text:
        if char in '"\\':
            escaped.append("\\" + char)
        elif char == "\n":
            escaped.append("\\n")
        elif char == "\r":
            escaped.append("\\r")
        elif char == "\t":
            escaped.append("\\t")
        elif ord(char) < 0x20:
            escaped.append(f"\\x{ord(char):02x}")
        else:
            escaped.append(char)
    return '"' + "".join(escaped) + '"'


def prefix_grammar(prefix: str) -> str:
    """A grammar whose sentences are ``prefix`` followed by anything; after a prefix that ends in
    whitespace (the user's indentation, space or line break), not by more whitespace, as the local
    engine's healing constraint rules (``speculative_complete.decoding.engine.healing``): two typed
    spaces never become six."""
    if prefix[-1:] in (" ", "\t", "\n", "\r"):
        return f"root ::= {gbnf_literal(prefix)} ([^ \\t\\n\\r\\x00] [^\\x00]*)?"
    return f"root ::= {gbnf_literal(prefix)} [^\\x00]*"
