"""The workspace as a draft source: the suffix-array index against brute force, the n-gram
drafter's use of it, and the walk of a workspace folder (``.gitignore``, limits, changes)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from speculative_complete.decoding.corpus_index import MAX_MATCH, CorpusIndex
from speculative_complete.decoding.drafters.ngram import NgramDrafter
from speculative_complete.lsp_server.workspace import WorkspaceIndex, WorkspaceLimits, excluded, source_files


# -- the index against brute force -------------------------------------------------------------------
def brute_force(documents: list[list[int]], sequence: list[int]) -> tuple[int, dict[int, list[list[int]]]]:
    """The longest match of the sequence's tail (<= MAX_MATCH) at a place something follows it,
    and the continuations found after a match of each length."""
    tail = sequence[-MAX_MATCH:]
    best, follows = 0, {}
    for doc in documents:
        for end in range(1, len(doc)):  # a match ends before doc[end], which follows it
            n = 0
            while n < len(tail) and n < end and doc[end - 1 - n] == tail[-1 - n]:
                n += 1
            best = max(best, n)
            follows.setdefault(n, []).append(doc[end:])
    return best, follows


def random_corpus(rng: random.Random, alphabet: int) -> list[list[int]]:
    """Documents over a small alphabet, some copying from one another (long matches)."""
    documents = [
        [rng.randrange(alphabet) for _ in range(rng.randint(0, 80))] for _ in range(rng.randint(1, 6))
    ]
    for _ in range(rng.randint(0, 3)):
        source = rng.choice(documents)
        if source:
            start = rng.randrange(len(source))
            documents.append(source[start : start + rng.randint(1, 90)] + [rng.randrange(alphabet)])
    return documents


def random_query(rng: random.Random, documents: list[list[int]], alphabet: int) -> list[int]:
    source = rng.choice(documents)
    if source and rng.random() < 0.7:
        end = rng.randint(1, len(source))
        query = source[max(0, end - rng.randint(1, 100)) : end]
    else:
        query = []
    return [rng.randrange(alphabet) for _ in range(rng.randint(0, 3))] * rng.randint(0, 1) + query or [0]


@pytest.mark.parametrize("seed", range(40))
def test_the_longest_match_and_its_continuation_agree_with_brute_force(seed):
    rng = random.Random(seed)
    alphabet = rng.choice([2, 3, 5, 50, 70000])  # 70000: past uint16, the wider suffix-array path
    documents = random_corpus(rng, alphabet)
    index = CorpusIndex(documents)
    assert len(index) == sum(len(d) for d in documents) and index.documents == sum(1 for d in documents if d)
    for _ in range(25):
        query = random_query(rng, documents, alphabet)
        max_len = rng.randint(1, 12)
        want, follows = brute_force(documents, query)
        found = index.longest(query, max_len)
        if want == 0:
            assert found is None
            continue
        assert found is not None and found.length == want, (query, documents)
        # What follows is what follows some match of that length, cut at the document's end.
        assert any(found.tokens == rest[:max_len] for rest in follows[want]), (found, follows[want])
        # min_length above the longest match: nothing.
        assert index.longest(query, max_len, min_length=want + 1) is None


def test_long_repeats_are_capped_at_max_match_and_never_cross_a_document():
    repeated = list(range(100))
    index = CorpusIndex([repeated + [7, 8, 9], repeated])
    found = index.longest(repeated, 5)
    assert found is not None and found.length == MAX_MATCH and found.tokens == [7, 8, 9]
    assert CorpusIndex([[1, 2, 3], [4, 5]]).longest([2, 3], 4) is None  # [2, 3] ends its document
    assert CorpusIndex([]).longest([1, 2], 4) is None and CorpusIndex([[1, 2]]).longest([], 4) is None


# -- the drafter ---------------------------------------------------------------------------------------
def test_the_drafter_proposes_from_the_corpus_where_the_prompt_has_no_longer_match():
    drafter = NgramDrafter(max_draft=8)
    drafter.corpus = CorpusIndex([[40, 41, 42, 43, 44, 45, 46], [90, 91]])
    match = drafter.lookup([1, 2, 40, 41, 42], 4)
    assert match is not None and match.source == "corpus" and match.tokens == [43, 44, 45, 46]
    # The live stream has the same 3-token suffix earlier: it wins the tie.
    match = drafter.lookup([40, 41, 42, 7, 40, 41, 42], 4)
    assert match is not None and match.source == "live"
    # One token alone in a large corpus is no evidence.
    assert drafter.lookup([5, 6, 90], 4) is None
    draft = drafter.propose([1, 2, 40, 41, 42], 4)
    assert draft.origin == "corpus" and draft.tokens and draft.tokens == [43, 44, 45, 46][: len(draft)]
    drafter.observe(draft, 1)
    assert (drafter.corpus_counts.drafts, drafter.corpus_counts.accepted) == (1, 1)


# -- the workspace folder ------------------------------------------------------------------------------
def write(root: Path, name: str, text: str | bytes) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    write(tmp_path, ".gitignore", "build/\n*.gen.py\n!keep.gen.py\n")
    write(tmp_path, "app/main.py", "def main():\n    return run_the_application(verbose=True)\n")
    write(tmp_path, "app/util.ts", "export const answer = 42;\n")
    write(tmp_path, "app/.gitignore", "secret.py\n")
    write(tmp_path, "app/secret.py", "TOKEN = 'x'\n")
    write(tmp_path, "app/skip.gen.py", "generated = 1\n")
    write(tmp_path, "app/keep.gen.py", "kept = 1\n")
    write(tmp_path, "build/out.py", "built = 1\n")
    write(tmp_path, ".venv/lib.py", "hidden = 1\n")
    write(tmp_path, "node_modules/dep/index.js", "module.exports = 1;\n")
    write(tmp_path, "README.md", "# not code\n")
    write(tmp_path, "blob.py", b"\x00\x01binary")
    write(tmp_path, "big.py", "x = 1\n" * 1000)
    return tmp_path


def test_the_walk_keeps_source_files_that_git_would_track(project):
    limits = WorkspaceLimits(max_file_bytes=4096)
    found = {p.relative_to(project).as_posix() for p in source_files([project], limits)}
    assert found == {"app/main.py", "app/util.ts", "app/keep.gen.py", "blob.py", "big.py"}
    for path in project.rglob("*"):
        if path.is_file():  # a single changed file is judged as the walk judges it
            rel = path.relative_to(project).as_posix()
            assert excluded(path, project) == (rel not in found), rel
    assert len(list(source_files([project], WorkspaceLimits(max_files=2)))) == 2


def test_scan_and_sync_give_the_drafter_an_index_that_follows_changes(project):
    index = WorkspaceIndex()
    assert index.scan([project], WorkspaceLimits(max_file_bytes=4096)) == 3  # binary and big left out
    drafter = NgramDrafter()

    def encode(text: str) -> list[int]:
        return list(text.encode())

    assert index.pending and index.sync(drafter, encode, lambda: False)
    index.wait_built()  # built on a thread of its own
    assert not index.pending and drafter.corpus is not None
    assert index.snapshot()["files"] == 3 and index.snapshot()["tokens"] == len(drafter.corpus) > 0
    match = drafter.lookup(encode("x = run_the_"), 11)
    assert match is not None and bytes(match.tokens) == b"application"

    # A save changes one file, a delete drops one: the next sync indexes what is on disk.
    write(project, "app/main.py", "def main():\n    return run_the_tests(quick=True)\n")
    (project / "app/util.ts").unlink()
    assert index.changed([project / "app/main.py", project / "app/util.ts", project / "build/out.py"]) == 2
    assert index.pending and index.sync(drafter, encode, lambda: False)
    index.wait_built()
    assert bytes(drafter.lookup(encode("x = run_the_"), 5).tokens) == b"tests"
    gone = drafter.lookup(encode("export const answer = "), 2)
    assert (gone is None or bytes(gone.tokens) != b"42") and index.snapshot()["files"] == 2

    # A stop request between files leaves the rest for later; a new drafter starts over.
    write(project, "app/new.py", "fresh = 1\n")
    index.changed([project / "app/new.py"])
    assert not index.sync(drafter, encode, lambda: True) and index.pending
    other = NgramDrafter()
    assert index.sync(other, encode, lambda: False)
    index.wait_built()
    assert other.corpus is not None
    kept = ["app/main.py", "app/keep.gen.py", "app/new.py"]
    assert len(other.corpus) == sum(len((project / name).read_bytes()) for name in kept)


def test_limits_bound_what_is_kept_and_zero_turns_it_off(project):
    index = WorkspaceIndex()
    # keep.gen.py (9 bytes) fits, main.py (54) would pass 60, util.ts (26) fits after it.
    assert index.scan([project], WorkspaceLimits(max_bytes=60, max_file_bytes=4096)) == 2
    assert index.snapshot()["bytes"] == 35
    assert index.scan([project], WorkspaceLimits(max_bytes=0)) == 0 and index.snapshot()["roots"] == []
