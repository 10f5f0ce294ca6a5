"""What the request pipeline needs from whatever decodes: the engine-runtime interface.

Two implementations: the local torch engine (``local.runtime.LocalRuntime``) and an inference
server (``remote.runtime.RemoteRuntime``). ``completion.py`` holds one runtime from a request's
prompt to its answer and knows nothing else about it, so switching ``endpoint`` swaps the whole
runtime (like a model reload) and a request in flight finishes on the one it started with.

Why the runtime builds the prompt (``prompt``) rather than only lending its tokenizer: a remote
tokenizer is a round trip per call, may be missing (then budgets are counted in characters and the
prompt goes unhealed), and must give up at the request's deadline; the local one is exact and
instant. Each runtime decides how its tokens are counted; the layout itself stays in
``lsp_server/context``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from decoding.results import GenerationResult
    from lsp_server.config import Settings
    from lsp_server.context import ContextBuilder, ContextRequest, Prompt
    from lsp_server.ending import Ending

StopCheck = Callable[[], bool]


class EngineRuntime(Protocol):
    """Used on the scheduler's worker thread only (``close`` excepted: any thread)."""

    kind: str  # "local" or "remote": shown in the model status
    # True: a request's prefill and its first line are always finished (only a newer keystroke or
    # a cancel stops them) and ``timeBudgetMs`` ends a block at a line's end; the work a cold
    # prompt costs is the answer the user paused for, and a line cut mid-way is a wrong one.
    # False: the budget closes the request wherever it is (a remote engine that may stall).
    finishes_first_line: bool

    def prompt(self, builder: ContextBuilder, request: ContextRequest, deadline: float | None) -> Prompt:
        """The prompt for ``request``, with this runtime's tokenizer, ready by ``deadline``
        (``time.monotonic()``; None: no budget)."""
        ...

    def generate(
        self,
        prompt: Prompt,
        settings: Settings,
        ending: Ending,
        should_stop: StopCheck,
        cache_key: str | None = None,
        deadline: float | None = None,
        answer_by: float | None = None,
    ) -> GenerationResult:
        """Decode after ``prompt`` until ``ending`` says the suggestion is over; ``cache_key`` (the
        document) selects what is kept across requests (KV cache, greedy chain, streamed text).
        ``answer_by`` (``time.monotonic()``): from then on a multi-line suggestion may be answered
        with the whole lines it has (stop reason "partial") where the runtime keeps the rest for
        the next request; a runtime that cannot ignores it. ``deadline``: the request's budget,
        which a runtime that ``finishes_first_line`` applies at a block's line ends only. Never
        raises for an engine's failure: an empty result says it."""
        ...

    def forget(self, uri: str) -> None:
        """``uri`` was closed: drop what was kept for it."""
        ...

    def close(self) -> None:
        """Release the engine (connections, threads); the runtime is not used afterwards."""
        ...

    def snapshot(self) -> dict[str, Any] | None:
        """The runtime's own block of ``lsp_server/stats`` (``endpoint`` for a remote), or None."""
        ...
