"""``RemoteRuntime``: the runtime (``runtime_interface.EngineRuntime``) on an inference server.

What stays on this side, as for the local engine: the prompt
(``speculative_complete/lsp_server/context``, with the engine's tokenizer where it has one), token
healing (llama.cpp only: a grammar keeps its output to the healed text; an OpenAI-compatible engine
would only be checked, and strays, so it gets the prompt unhealed), where the suggestion ends (the
line end is sent as a stop, a block's end is cut with the same ``Ending`` as the stream comes in,
which closes it), the suffix through the engine's own FIM, typed-ahead reuse (``chains.py``), and a
result shaped like the local engine's, so post-processing, the memory and the stats work unchanged.
Nothing here imports torch. No idle-time work: the engine keeps its own caches, and nothing here is
worth working on between requests.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from speculative_complete.decoding.results import GenerationResult, GenerationStats
from speculative_complete.lsp_server.config import Settings
from speculative_complete.lsp_server.context import ContextBuilder, ContextRequest, Prompt
from speculative_complete.lsp_server.ending import Ending
from speculative_complete.lsp_server.endpoint import EndpointConfig
from speculative_complete.lsp_server.remote.chains import Chain, Chains
from speculative_complete.lsp_server.remote.engine import RemoteEngine
from speculative_complete.lsp_server.remote.health import Notice
from speculative_complete.lsp_server.remote.request import RemoteRequest, RemoteResult
from speculative_complete.lsp_server.remote.tokenizer import RemoteTokenizer, TokenizerUnavailable
from speculative_complete.lsp_server.runtime_interface import DraftIndexing, Renewal

log = logging.getLogger(__name__)
PROBE_TIMEOUT_S = 3.0
COMPLETE = ("stop", "eos")  # a continuation that ended by itself: worth keeping for typing along


@dataclass
class PromptCounts:
    engine: int = 0  # prompts built with the engine's tokenizer
    characters: int = 0  # by characters (no /tokenize, or it failed or was too slow)
    healed: int = 0
    from_chain: int = 0  # answered from the kept continuation, no request


class RemoteRuntime:
    kind = "remote"
    finishes_first_line = False  # a server that stalls must not hold the request past its budget

    def __init__(self, engine: RemoteEngine) -> None:
        self.engine = engine
        self.tokenizer = RemoteTokenizer(engine)
        self.chains = Chains()
        self.counts = PromptCounts()
        self._asked: dict[str, tuple[str, int]] = {}  # uri -> the document and cursor of its last prompt

    @classmethod
    def connect(cls, settings: Settings, on_notice: Callable[[Notice], None] | None = None) -> RemoteRuntime:
        """The runtime for ``settings.endpoint``; asks the engine's tokenizer once, so that an
        engine that is down says so now and one without ``/tokenize`` is known from the start.
        Raises EndpointError for a URL the security rules refuse."""
        config = EndpointConfig.from_settings(settings)
        assert config is not None, "connect needs an endpoint"
        runtime = cls(RemoteEngine(config, on_notice))
        runtime.engine.tokenize("\n", deadline=time.monotonic() + PROBE_TIMEOUT_S)
        return runtime

    @property
    def heals(self) -> bool:
        return self.engine.constrains_prefix and self.tokenizer.supported is not False

    # -- the prompt ----------------------------------------------------------------------------------
    def prompt(self, builder: ContextBuilder, request: ContextRequest, deadline: float | None) -> Prompt:
        along = self.chains.prompt_for(request.uri, request.text, request.offset)
        if along is not None:  # typing along the last continuation: no round trip at all
            return along
        self._asked[request.uri] = (request.text, request.offset)
        request = replace(
            request,
            fim_template="none",  # no vocabulary over HTTP: the engine's own FIM takes the suffix
            engine_suffix=self.engine.fim_available,
            heal=request.heal and self.heals,
        )
        if self.tokenizer.supported is not False:
            try:
                prompt = builder.build(request, self.tokenizer.tokens(deadline))
            except TokenizerUnavailable as exc:
                log.info("prompt built by characters this time: %s", exc)
            else:
                self.counts.engine += 1
                self.counts.healed += int(bool(prompt.healed))
                return prompt
        self.counts.characters += 1
        prompt = builder.build(replace(request, heal=False), self.tokenizer.characters())
        return replace(prompt, ids=None)  # its ids are only a length: send the text

    # -- decoding ------------------------------------------------------------------------------------
    def generate(
        self,
        prompt: Prompt,
        settings: Settings,
        ending: Ending,
        should_stop: Callable[[], bool],
        cache_key: str | None = None,
        deadline: float | None = None,
        answer_by: float | None = None,  # the whole block is streamed: no early answer here
    ) -> GenerationResult:
        asked = self._asked.pop(cache_key, None) if cache_key else None
        if not settings.type_ahead:
            self.chains.clear()
        elif cache_key is not None:
            known = self.chains.answer(cache_key, prompt, ending)
            if known is not None:
                self.counts.from_chain += 1
                return _from_chain(*known)
        cut = ending.cut if ending.multiline else None
        result = self.engine.complete(
            self._request(prompt, settings, ending, deadline),
            should_stop,
            (lambda text: cut(text) is not None) if cut is not None else None,
        )
        text = result.text
        where = cut(text) if cut is not None else None
        if where is not None:
            text = text[:where]
        reason = _stop_reason(result)
        if reason == "error":
            text = ""  # a broken stream's start is not an answer
        if settings.type_ahead and cache_key and asked is not None and reason in COMPLETE:
            source, offset = asked
            shown = prompt.text + prompt.healed
            self.chains.keep(cache_key, Chain(shown, text, ending, reason, source, offset, prompt))
        return GenerationResult(text, list(result.tokens), reason, _stats(result, prompt))

    def _request(
        self, prompt: Prompt, settings: Settings, ending: Ending, deadline: float | None
    ) -> RemoteRequest:
        suffix = prompt.suffix or None
        # /infill takes text; otherwise the ids exactly as built (budget and healing counted on them)
        as_text = prompt.ids is None or (suffix is not None and self.engine.fim_available)
        return RemoteRequest(
            prompt.text if as_text else list(prompt.ids or ()),
            suffix=suffix,
            line=prompt.line if as_text else "",
            max_tokens=settings.max_new_tokens,
            stop=("\n",) if ending.stop_at_newline else (),
            required_prefix=prompt.healed,
            deadline=deadline,
        )

    # -- idle-time work: none ------------------------------------------------------------------------
    def works_ahead(self, settings: Settings) -> bool:
        return False

    def draft_indexing(self, settings: Settings) -> DraftIndexing | None:
        return None

    def decode_ahead(
        self, uri: str, settings: Settings, should_stop: Callable[[], bool], rest: Ending | None = None
    ) -> GenerationResult | None:
        return None

    def renew(
        self,
        builder: ContextBuilder,
        request: ContextRequest,
        ending: Ending,
        settings: Settings,
        should_stop: Callable[[], bool],
    ) -> Renewal | None:
        return None

    # -- the rest of the interface -------------------------------------------------------------------
    def forget(self, uri: str) -> None:
        self.chains.forget(uri)
        self._asked.pop(uri, None)

    def close(self) -> None:
        self.engine.close()

    def snapshot(self) -> dict[str, Any]:
        """The ``endpoint`` block: the engine's counters, and how prompts were tokenized."""
        block = self.engine.snapshot()
        supported = self.tokenizer.supported
        block["prompts"] = {
            "tokenizer": "characters" if supported is False else "engine",
            "healing": self.heals,
            "by_engine_tokens": self.counts.engine,
            "by_characters": self.counts.characters,
            "healed": self.counts.healed,
            "from_chain": self.counts.from_chain,
        }
        if supported is False:
            block["prompts"]["note"] = (
                "the engine has no /tokenize: token budgets are estimated from characters and "
                "prompts are sent unhealed"
            )
        return block


def _stop_reason(result: RemoteResult) -> str:
    """The local engine's vocabulary: a passed deadline reads as a cancel (the scheduler counts the
    budget), a failed request as ``error`` (never remembered as an answer)."""
    if result.error is not None and result.stop_reason not in ("cancelled", "budget"):
        return "error"
    return {"budget": "cancelled", "error": "error"}.get(result.stop_reason, result.stop_reason)


def _stats(result: RemoteResult, prompt: Prompt) -> GenerationStats:
    first, last = result.ttft_ms or 0.0, result.ttlt_ms or 0.0
    return GenerationStats(
        prompt_tokens=result.prompt_tokens or len(prompt.ids or ()),
        new_tokens=result.new_tokens,
        produced_tokens=result.new_tokens,
        reused_tokens=result.cached_tokens or 0,
        prefill_ms=first,
        decode_ms=max(0.0, last - first),
    )


def _from_chain(rest: str, chain: Chain) -> GenerationResult:
    stats = GenerationStats(known_tokens=max(1, len(rest) // 4), new_tokens=0)
    return GenerationResult(rest, [], chain.stop_reason, stats)
