"""``kvCacheMb`` bounds both models' per-document KV caches together, and follows its changes.

The runtime is assembled by the server's own code (``assemble_runtime``) over tiny in-memory
models, and decodes through ``LocalRuntime.generate`` as a request does.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from speculative_complete.lsp_server.config import Settings
from speculative_complete.lsp_server.context import Prompt
from speculative_complete.lsp_server.ending import Ending
from speculative_complete.lsp_server.local.loading import assemble_runtime, kv_share
from speculative_complete.lsp_server.local.local_runtime import MB, LocalRuntime
from tests.support.tiny_models import loaded, tiny_model

PROMPT = tuple(range(1, 60))  # within the tiny tokenizer, with no line end (one line is decoded)


def runtime_with_draft(kv_cache_mb: int) -> LocalRuntime:
    settings = Settings(drafter="model", kv_cache_mb=kv_cache_mb, draft_head="none")
    target = loaded(tiny_model(41, layers=4, hidden=64))
    draft = loaded(tiny_model(42, layers=1))
    return assemble_runtime(settings, target, draft)


def decode(runtime: LocalRuntime, settings: Settings, document: str) -> None:
    prompt = Prompt(text="", ids=PROMPT + (hash(document) % 60,))
    runtime.generate(prompt, settings, Ending(), lambda: False, cache_key=document)


def budgets(runtime: LocalRuntime) -> tuple[int, int]:
    """(the target's, the draft model's) per-document cache budgets in bytes."""
    return runtime.engine.prefix_cache.budget_bytes, draft_drafter(runtime).sessions.budget_bytes


def draft_drafter(runtime: LocalRuntime):
    """The ``ModelDrafter``: the drafter itself, or ``auto``'s draft model."""
    return getattr(runtime.drafter, "model", runtime.drafter)


def test_the_setting_is_split_by_what_a_token_costs_each_model():
    """Four layers of 64 wide against one of 32: the draft's tokens cost an eighth of the
    target's, so it gets a ninth of the setting, and the two parts add up to the setting."""
    runtime = runtime_with_draft(9)
    assert kv_share(runtime.engine.target, runtime.draft_model) == pytest.approx(1 / 9)
    target_bytes, draft_bytes = budgets(runtime)
    assert target_bytes + draft_bytes == 9 * MB and draft_bytes == MB


def test_a_changed_setting_resizes_both_caches_and_evicts_at_once():
    settings = Settings(drafter="model", kv_cache_mb=9, draft_head="none")
    runtime = runtime_with_draft(settings.kv_cache_mb)
    for document in ("file:///a.py", "file:///b.py", "file:///c.py"):
        decode(runtime, settings, document)
    sessions = draft_drafter(runtime).sessions
    assert sessions.snapshot()["entries"] == 2  # a and b parked, c live
    smaller = replace(settings, kv_cache_mb=3)
    decode(runtime, smaller, "file:///c.py")
    assert budgets(runtime) == (3 * MB - MB // 3, MB // 3)
    turned_off = replace(settings, kv_cache_mb=0)
    decode(runtime, turned_off, "file:///c.py")
    assert budgets(runtime) == (0, 0)
    assert sessions.snapshot()["entries"] == 0 and sessions.snapshot()["bytes"] == 0
    # A drafter built later (another drafter setting) gets the current part too.
    runtime.drafter_for("auto")
    decode(runtime, replace(settings, drafter="auto", kv_cache_mb=9), "file:///a.py")
    assert budgets(runtime)[1] == MB
