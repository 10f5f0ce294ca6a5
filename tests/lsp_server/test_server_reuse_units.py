"""The event-loop side of reuse: the answer memory and typed-ahead recognition, and the bounded
draft sources, each on its own."""

from __future__ import annotations

from speculative_complete.lsp_server.reuse import SuggestionMemory
from speculative_complete.lsp_server.sources import DocumentSnapshot, DraftSources

DOC = "def f(x):\n    return x)\n"
CURSOR = DOC.index("x)")  # before the auto-inserted ")"


def test_an_identical_request_finds_its_answer_and_anything_else_does_not():
    memory = SuggestionMemory(size=2)
    key = memory.key("a", DOC, CURSOR, ("settings",))
    assert memory.result(key) == (False, None)
    memory.remember(key, "a", DOC, CURSOR, "x + 1)")
    assert memory.result(memory.key("a", DOC, CURSOR, ("settings",))) == (True, "x + 1)")
    assert memory.result(memory.key("a", DOC, CURSOR + 1, ("settings",)))[0] is False
    assert memory.result(memory.key("a", DOC, CURSOR, ("other settings",)))[0] is False
    assert memory.result(memory.key("a", DOC.replace("f", "g"), CURSOR, ("settings",)))[0] is False
    # "no suggestion" is an answer too; the oldest entry goes when the memory is full.
    memory.remember(memory.key("b", DOC, 0, ()), "b", DOC, 0, None)
    memory.remember(memory.key("c", DOC, 0, ()), "c", DOC, 0, None)
    assert memory.result(memory.key("b", DOC, 0, ())) == (True, None)
    assert memory.result(key)[0] is False


def test_typing_the_start_of_the_shown_suggestion_is_recognised():
    memory = SuggestionMemory()
    memory.remember(memory.key("a", DOC, CURSOR, ()), "a", DOC, CURSOR, "x + 1)")
    typed = DOC[:CURSOR] + "x " + DOC[CURSOR:]
    assert memory.typed_ahead("a", typed, CURSOR + 2) == "+ 1)"
    assert memory.typed_ahead("b", typed, CURSOR + 2) is None  # another document
    wrong = DOC[:CURSOR] + "y " + DOC[CURSOR:]
    assert memory.typed_ahead("a", wrong, CURSOR + 2) is None
    elsewhere = "#" + typed  # the same keystrokes, but the text before changed too
    assert memory.typed_ahead("a", elsewhere, CURSOR + 3) is None
    after_changed = DOC[:CURSOR] + "x " + DOC[CURSOR:] + "more"
    assert memory.typed_ahead("a", after_changed, CURSOR + 2) is None
    everything = DOC[:CURSOR] + "x + 1)" + DOC[CURSOR:]
    assert memory.typed_ahead("a", everything, CURSOR + 6) is None  # nothing left to show
    memory.forget("a")
    assert memory.typed_ahead("a", typed, CURSOR + 2) is None


class RecordingNgram:
    """Stands in for the n-gram drafter's source interface, recording what it is given."""

    def __init__(self) -> None:
        self.sources: dict[str, list[int]] = {}
        self.accepted: list[list[int]] = []

    def set_source(self, name, tokens):
        self.sources[name] = list(tokens)

    def remove_source(self, name):
        self.sources.pop(name, None)

    def add_accepted(self, tokens):
        self.accepted.append(list(tokens))


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_draft_sources_follow_the_open_documents_within_their_budget():
    sources = DraftSources(max_doc_tokens=50, max_total_tokens=120)
    ngram = RecordingNgram()
    docs = {f"doc{i}": DocumentSnapshot(1, f"{i}" * 80) for i in range(4)}
    sources.sync(ngram, docs, exclude="doc0", encode=encode, should_stop=lambda: False)
    # doc0 is the one being completed; each document is capped; the oldest go over the total.
    assert "doc0" not in ngram.sources
    assert all(len(tokens) == 50 for tokens in ngram.sources.values())
    assert sources.total_tokens <= 120 and set(ngram.sources) == {"doc2", "doc3"}
    docs["doc3"] = DocumentSnapshot(2, "changed")
    del docs["doc2"]
    sources.accepted("x = 1")
    sources.sync(ngram, docs, exclude="doc0", encode=encode, should_stop=lambda: False)
    assert ngram.sources["doc3"] == encode("changed") and "doc2" not in ngram.sources
    assert ngram.accepted == [encode("x = 1")] and sources.snapshot()["accepted_tokens"] == 5
    # A request arriving stops the indexing between documents.
    fresh = RecordingNgram()
    sources.sync(fresh, docs, exclude=None, encode=encode, should_stop=lambda: True)
    assert fresh.sources == {}


def test_draft_sources_reindex_into_the_drafter_a_reload_builds():
    """A reload frees the old drafter and builds a new one (which CPython may put at the freed
    one's address: the sources know their drafter by a weak reference, not by ``id()``)."""
    sources = DraftSources()
    docs = {"doc1": DocumentSnapshot(1, "def helper(): pass")}
    old = RecordingNgram()
    sources.sync(old, docs, exclude=None, encode=encode, should_stop=lambda: False)
    sources.sync(old, docs, exclude=None, encode=encode, should_stop=lambda: False)
    del old
    new = RecordingNgram()
    assert sources.sync(new, docs, exclude=None, encode=encode, should_stop=lambda: False) == 1
    assert new.sources == {"doc1": encode("def helper(): pass")}
    assert sources.sync(new, docs, exclude=None, encode=encode, should_stop=lambda: False) == 0


def test_a_closed_document_stops_being_a_draft_source():
    sources = DraftSources()
    ngram = RecordingNgram()
    docs = {"doc1": DocumentSnapshot(1, "one"), "doc2": DocumentSnapshot(1, "two")}
    sources.sync(ngram, docs, exclude=None, encode=encode, should_stop=lambda: False)
    sources.forget("doc1")
    assert sources.snapshot()["documents"] == 1
