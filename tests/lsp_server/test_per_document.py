"""The per-document registry: one ``forget`` reaches every owner, on the right thread, and the
least recently used documents are forgotten beyond the limit."""

from __future__ import annotations

from speculative_complete.lsp_server.per_document import DocumentRegistry


def registry_with_owners(max_documents: int = 64) -> tuple[DocumentRegistry, list[str], list[str]]:
    registry = DocumentRegistry(max_documents)
    at_once: list[str] = []
    on_worker: list[str] = []
    registry.owner(at_once.append)
    registry.owner(on_worker.append, worker=True)
    return registry, at_once, on_worker


def test_forget_tells_loop_owners_at_once_and_worker_owners_on_the_worker():
    registry, at_once, on_worker = registry_with_owners()
    registry.touch("file:///a.py")
    registry.forget("file:///a.py")
    assert at_once == ["file:///a.py"] and on_worker == []
    assert registry.forget_on_worker() == 1
    assert on_worker == ["file:///a.py"]
    assert registry.forget_on_worker() == 0 and on_worker == ["file:///a.py"]  # told once


def test_a_generation_tells_whether_the_document_was_forgotten_meanwhile():
    registry, _, _ = registry_with_owners()
    first = registry.touch("file:///a.py")
    assert registry.touch("file:///a.py") == first and registry.current("file:///a.py", first)
    registry.forget("file:///a.py")
    assert not registry.current("file:///a.py", first)
    reopened = registry.touch("file:///a.py")
    assert reopened != first and registry.current("file:///a.py", reopened)


def test_beyond_the_limit_the_least_recently_used_document_is_forgotten():
    registry, at_once, _ = registry_with_owners(max_documents=2)
    registry.touch("file:///a.py")
    registry.touch("file:///b.py")
    registry.touch("file:///a.py")  # b is now the least recently used
    registry.touch("file:///c.py")
    assert at_once == ["file:///b.py"] and registry.tracked == 2
    registry.forget_on_worker()
