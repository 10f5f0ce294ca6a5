"""The workspace folders as a draft source, through the real server process: indexed after the
model loads, kept current on saves, watched-file events, folder and settings changes; and on the
real model, drafts from the workspace that leave the suggestion exactly as it is without them."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types
from pygls.uris import from_fs_path

from tests.support import lsp as h

pytestmark = pytest.mark.asyncio

LIBRARY = (
    "def checksum_of_records(records, seed):\n"
    "    total = seed\n"
    "    for record in records:\n"
    "        total = (total * 31 + len(record.name) + record.size) % 1000003\n"
    "    return total\n"
)


async def start_in(
    root: Path, options: Any = None, model: Any = None, wait: bool = True
) -> tuple[Any, list[Any], Any]:
    """The server with ``root`` as its workspace folder and a client that watches files; the
    registrations it receives, and the initialize result."""
    client = await h.start(model=model)
    registrations: list[Any] = []

    @client.feature(types.CLIENT_REGISTER_CAPABILITY)
    def register(params: types.RegistrationParams) -> None:
        registrations.extend(params.registrations)

    capabilities = h.capabilities()
    capabilities.workspace.did_change_watched_files = types.DidChangeWatchedFilesClientCapabilities(
        dynamic_registration=True
    )
    capabilities.workspace.workspace_folders = True
    uri = from_fs_path(str(root))
    result = await asyncio.wait_for(
        client.initialize_session(
            types.InitializeParams(
                capabilities=capabilities,
                root_uri=uri,
                workspace_folders=[types.WorkspaceFolder(uri=uri, name=root.name)],
                initialization_options=options,
            )
        ),
        h.ANSWER_TIMEOUT_S,
    )
    if wait:
        await h.wait_model(client)
    return client, registrations, result


async def index_stats(client, done) -> dict[str, Any]:
    """Poll the stats until ``done(workspace_index)`` holds (the index waits for an idle worker)."""
    deadline = time.monotonic() + h.LOAD_TIMEOUT_S
    while True:
        current = (await h.stats(client))["workspace_index"]
        if done(current):
            return current
        assert time.monotonic() < deadline, f"the workspace index never got there: {current}"
        await asyncio.sleep(0.1)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "library.py").write_text(LIBRARY)
    (root / "pkg" / "other.py").write_text("VALUE = 1\n")
    (root / ".gitignore").write_text("ignored/\n")
    (root / "ignored").mkdir()
    (root / "ignored" / "junk.py").write_text("JUNK = 1\n" * 10)
    return root


async def test_the_workspace_is_indexed_and_follows_saves_watched_files_and_folders(project, tmp_path):
    client, registrations, result = await start_in(project)
    try:
        assert result.capabilities.text_document_sync.save  # the client is asked to send didSave
        first = await index_stats(client, lambda s: s["files"] == 2 and s["tokens"] > 0 and not s["pending"])
        assert first["roots"] == [str(project)] and first["index_bytes"] > 0
        watched = [r for r in registrations if r.method == types.WORKSPACE_DID_CHANGE_WATCHED_FILES]
        options = h.plain(watched[0].register_options) if watched else {}
        assert len(watched) == 1 and ".py" in options["watchers"][0]["globPattern"]

        # A save re-reads the file.
        (project / "pkg" / "other.py").write_text("VALUE = 1\n" + "OTHER = VALUE + 1\n" * 20)
        uri = from_fs_path(str(project / "pkg" / "other.py"))
        client.text_document_did_save(
            types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri))
        )
        grown = await index_stats(client, lambda s: s["tokens"] > first["tokens"])
        assert grown["files"] == 2

        # A file created and one deleted outside the editor, as the watcher reports them.
        (project / "pkg" / "new.py").write_text("NEW = 2\n")
        (project / "pkg" / "library.py").unlink()
        changes = [
            types.FileEvent(
                uri=from_fs_path(str(project / "pkg" / "new.py")), type=types.FileChangeType.Created
            ),
            types.FileEvent(
                uri=from_fs_path(str(project / "pkg" / "library.py")), type=types.FileChangeType.Deleted
            ),
            types.FileEvent(  # ignored by .gitignore: not indexed
                uri=from_fs_path(str(project / "ignored" / "junk.py")), type=types.FileChangeType.Changed
            ),
        ]
        client.workspace_did_change_watched_files(types.DidChangeWatchedFilesParams(changes=changes))
        after = await index_stats(client, lambda s: s["tokens"] < grown["tokens"] and not s["pending"])
        assert after["files"] == 2

        # Another folder joins the workspace.
        second = tmp_path / "second"
        second.mkdir()
        (second / "more.py").write_text(LIBRARY)
        folder = types.WorkspaceFolder(uri=from_fs_path(str(second)), name="second")
        client.workspace_did_change_workspace_folders(
            types.DidChangeWorkspaceFoldersParams(
                event=types.WorkspaceFoldersChangeEvent(added=[folder], removed=[])
            )
        )
        joined = await index_stats(client, lambda s: s["files"] == 3 and not s["pending"])
        assert sorted(joined["roots"]) == sorted([str(project), str(second)])

        # Turned off by a setting: nothing kept.
        client.workspace_did_change_configuration(
            types.DidChangeConfigurationParams(settings={"lspServer": {"workspaceIndexMb": 0}})
        )
        await index_stats(client, lambda s: s["files"] == 0 and s["tokens"] == 0 and s["index_bytes"] == 0)
        assert (await h.stats(client))["failed"] == 0
    finally:
        await h.stop(client)


async def test_requests_are_answered_while_the_workspace_is_indexed(tmp_path):
    root = tmp_path / "big"
    root.mkdir()
    for i in range(40):
        (root / f"module_{i}.py").write_text(LIBRARY.replace("checksum", f"checksum_{i}") * 20)
    client, _, _ = await start_in(root)
    try:
        h.open_document(client, h.SAMPLE)
        lines = h.SAMPLE.splitlines()
        for _ in range(5):
            result = await h.inline(client, len(lines) - 1, len(lines[-1]))
            assert isinstance(result, types.InlineCompletionList)
        done = await index_stats(client, lambda s: s["files"] == 40 and not s["pending"] and s["tokens"] > 0)
        assert done["bytes"] == sum(len(path.read_text()) for path in root.glob("*.py"))
        stats = await h.stats(client)
        assert stats["answered"] == stats["requests"] == 5 and stats["failed"] == 0
    finally:
        await h.stop(client)


async def test_with_a_remote_engine_no_workspace_file_is_read(project):
    # Nothing listens on port 9: the engine stays down, and nothing local drafts.
    client, _, _ = await start_in(project, options={"endpoint": "http://127.0.0.1:9"}, wait=False)
    try:
        index = await index_stats(client, lambda s: s["scanned"])
        assert index["files"] == 0 and index["bytes"] == 0 and index["roots"] == []
    finally:
        await h.stop(client)


@pytest.mark.real_model
async def test_on_the_real_model_workspace_drafts_are_verified_and_change_nothing(project):
    """A line of a workspace file retyped in a new document: the drafter proposes its rest from
    the workspace index, and the suggestion is token for token the one without the index."""
    typed = LIBRARY.splitlines()
    document = "import math\n\n\n" + "\n".join(typed[:3]) + "\n        total = (total"
    line, character = document.count("\n"), len(document.splitlines()[-1])
    answers, drafts = [], []
    for mb in (8, 0):
        client, _, _ = await start_in(
            # The draft head off: it competes for the same steps, and this is about the corpus's
            # drafts. Cross-file context off, as shipped: the index's definitions would change the
            # prompt (``test_on_the_real_model_a_function_from_another_file...`` turns them on).
            project,
            options={
                "workspaceIndexMb": mb,
                "timeBudgetMs": 60000,
                "draftHead": "none",
                "crossFileContext": False,
            },
            model=h.DEFAULT,
        )
        try:
            await index_stats(client, lambda s, mb=mb: not s["pending"] and (s["tokens"] > 0) == (mb > 0))
            h.open_document(client, document, uri="file:///work/retyped.py")
            (item,) = (await h.inline(client, line, character, uri="file:///work/retyped.py")).items
            answers.append(item.insert_text)
            drafts.append((await h.stats(client))["workspace_index"])
        finally:
            await h.stop(client)
    assert answers[0] == answers[1] and answers[0].strip()
    assert drafts[0]["drafts"] > 0 and drafts[0]["accepted"] > 0 and drafts[1]["drafts"] == 0


LEDGER = (
    "def settle_quorum_ember(ledger_limit, harbor_count, ember_ratio):\n"
    '    """Settle the quorum of an ember."""\n'
    "    return ledger_limit * harbor_count * ember_ratio\n"
)
CALLER = "import spindle_cobalt_0\n\n\ndef run(rows):\n    result = spindle_cobalt_0.settle"


async def test_definitions_from_the_workspace_and_edits_elsewhere_reach_the_prompt(tmp_path):
    """Through the server: as shipped (``crossFileContext`` off) no other file reaches the prompt;
    turned on, a workspace file's definitions (read from disk, not open) and a region just edited in
    another open document are in the prompt (the answered prompts' excerpts)."""
    (tmp_path / "spindle_cobalt_0.py").write_text(LEDGER)
    client, _, _ = await start_in(tmp_path, options={"neighborSnippets": 0})
    try:
        await index_stats(client, lambda s: s["definitions"] == 1)
        caller = from_fs_path(str(tmp_path / "main.py"))
        h.open_document(client, CALLER, uri=caller)
        await h.inline(client, CALLER.count("\n"), len(CALLER.splitlines()[-1]), uri=caller)
        assert (await h.stats(client))["excerpts"] == {"definition": 0, "similar": 0, "edit": 0}

        await h.configure(client, {"lspServer": {"crossFileContext": True}})
        await h.inline(client, CALLER.count("\n"), len(CALLER.splitlines()[-1]), uri=caller)
        assert (await h.stats(client))["excerpts"] == {"definition": 1, "similar": 0, "edit": 0}

        notes = from_fs_path(str(tmp_path / "notes.py"))
        h.open_document(client, "x = 1\n", uri=notes)
        h.edit(client, notes, 2, (1, 0), (1, 0), "def tally_receipts(batch):\n    return len(batch)\n")
        await h.inline(client, CALLER.count("\n"), len(CALLER.splitlines()[-1]), uri=caller)
        assert (await h.stats(client))["excerpts"] == {"definition": 2, "similar": 0, "edit": 1}

        await h.configure(client, {"lspServer": {"crossFileContext": False}})
        await h.inline(client, CALLER.count("\n"), len(CALLER.splitlines()[-1]), uri=caller)
        stats = await h.stats(client)
        assert stats["excerpts"] == {"definition": 2, "similar": 0, "edit": 1} and stats["failed"] == 0
    finally:
        await h.stop(client)


@pytest.mark.real_model
async def test_on_the_real_model_a_function_from_another_file_is_called_by_its_name(tmp_path):
    """The issue's example: with the definition in the prompt the default model completes the
    name it has never seen; without it, it writes one of its own."""
    (tmp_path / "spindle_cobalt_0.py").write_text(LEDGER)
    answers = []
    for cross_file in (True, False):
        options = {"crossFileContext": cross_file, "timeBudgetMs": 60000, "multiline": "never"}
        client, _, _ = await start_in(tmp_path, options=options, model=h.DEFAULT)
        try:
            await index_stats(client, lambda s: s["definitions"] == 1)
            caller = from_fs_path(str(tmp_path / "main.py"))
            h.open_document(client, CALLER, uri=caller)
            answer = await h.inline(client, CALLER.count("\n"), len(CALLER.splitlines()[-1]), uri=caller)
            answers.append(answer.items[0].insert_text if answer.items else "")
        finally:
            await h.stop(client)
    assert answers[0].startswith("_quorum_ember("), answers
    assert not answers[1].startswith("_quorum_ember"), answers
