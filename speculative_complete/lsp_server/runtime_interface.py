"""What the request pipeline and the idle-time work need from whatever decodes: ``EngineRuntime``.

Two implementations: the local torch engine (``local.local_runtime.LocalRuntime``) and an inference
server (``remote.remote_runtime.RemoteRuntime``). ``completion.py`` holds one runtime from a
request's prompt to its answer and knows nothing else about it, so switching ``endpoint`` swaps the
whole runtime (like a model reload) and a request in flight finishes on the one it started with.

Why the runtime builds the prompt (``prompt``) rather than only lending its tokenizer: a remote
tokenizer is a round trip per call, may be missing (then budgets are counted in characters and the
prompt goes unhealed), and must give up at the request's deadline; the local one is exact and
instant. Each runtime decides how its tokens are counted; the layout itself stays in
``speculative_complete/lsp_server/context``.

The idle-time work (``idle.py``) decides when to work ahead; what working ahead means (a document's
greedy chain decoded further, a prompt prefilled again on rows chosen again, other documents
indexed as draft sources) is the runtime's, because only a runtime that keeps such state between
requests can do it. ``works_ahead`` says whether one does: the remote one keeps nothing here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from speculative_complete.decoding.drafter_interface import DocumentSources
    from speculative_complete.decoding.results import GenerationResult
    from speculative_complete.lsp_server.config import Settings
    from speculative_complete.lsp_server.context import ContextBuilder, ContextRequest, Prompt
    from speculative_complete.lsp_server.ending import Ending

StopCheck = Callable[[], bool]


@dataclass(frozen=True)
class DraftIndexing:
    """Where idle-time work puts other documents' text for the drafter: the n-gram drafter's extra
    sources, and the tokenizer their text is counted in (the target's: drafts are its tokens)."""

    sources: DocumentSources
    encode: Callable[[str], Sequence[int]]


@dataclass(frozen=True)
class Renewal:
    """A request decoded again on rows chosen again (``EngineRuntime.renew``)."""

    result: GenerationResult
    adopted: bool  # the document took the new rows and their prefilled prompt


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

    # -- idle-time work (``idle.py``) ---------------------------------------------------------------
    def works_ahead(self, settings: Settings) -> bool:
        """Whether idle-time work has anything to work on under ``settings``: the three methods
        below do nothing (return None) where it has not."""
        ...

    def draft_indexing(self, settings: Settings) -> DraftIndexing | None:
        """Where other documents go as draft sources for the drafter ``settings`` choose (built
        now if new); None where that drafter takes none."""
        ...

    def decode_ahead(
        self, uri: str, settings: Settings, should_stop: StopCheck, rest: Ending | None = None
    ) -> GenerationResult | None:
        """Decode further along ``uri``'s greedy chain, for the next request to answer from: to
        where ``rest`` ends a block answered early, else the line after the suggestion. None when
        nothing was decoded (no chain kept, or it already reaches that far)."""
        ...

    def renew(
        self,
        builder: ContextBuilder,
        request: ContextRequest,
        ending: Ending,
        settings: Settings,
        should_stop: StopCheck,
    ) -> Renewal | None:
        """``request`` (the one answered last) decoded again on rows chosen again
        (``ContextRequest.renew_rows``), its prompt prefilled apart from the document's cache,
        which goes on serving keystrokes on the old rows; once the new prompt is whole in the
        cache the document adopts both. None where no chain is kept to renew."""
        ...

    # -- the rest ------------------------------------------------------------------------------------
    def forget(self, uri: str) -> None:
        """``uri`` was closed: drop what was kept for it."""
        ...

    def close(self) -> None:
        """Release the engine (connections, threads); the runtime is not used afterwards."""
        ...

    def snapshot(self) -> dict[str, Any] | None:
        """The runtime's own block of ``lsp_server/stats`` (``endpoint`` for a remote), or None."""
        ...
