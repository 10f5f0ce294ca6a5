"""``RemoteEngine``: completions decoded by an inference server, with the local engine's contract.

Called synchronously on the scheduler's worker thread, like the local engine: ``complete`` polls
``should_stop`` while text streams in and returns a ``RemoteResult`` (text, stop reason, tokens,
time to first and last token). It never raises and never outlives the request's deadline: any
failure is an empty (or partial) result with ``error`` set, counted in the stats and fed to the
outage/recovery state (``health``), whose notices the server shows once per outage.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import httpx2 as httpx

from speculative_complete.lsp_server.endpoint import EndpointConfig
from speculative_complete.lsp_server.remote import transport
from speculative_complete.lsp_server.remote.dialects import (
    Chunk,
    dialect,
    parse_pieces,
    parse_text,
    parse_tokens,
)
from speculative_complete.lsp_server.remote.gate import Gate
from speculative_complete.lsp_server.remote.health import Health, Notice
from speculative_complete.lsp_server.remote.request import RemoteRequest, RemoteResult
from speculative_complete.lsp_server.remote.sse import DONE, MalformedEvent, parse_line
from speculative_complete.lsp_server.remote.stats import EndpointStats
from speculative_complete.lsp_server.remote.transport import TransportError

log = logging.getLogger(__name__)
T = TypeVar("T")
POLL_S = 0.01  # how often a waiting caller looks at should_stop: the cancel latency
TOKENIZE_TIMEOUT_S = 5.0
UNSUPPORTED = (404, 405, 501)  # an endpoint the engine doesn't have, not an outage


class RemoteEngine:
    """One endpoint, one connection pool; safe to call from several threads at once."""

    def __init__(self, config: EndpointConfig, on_notice: Callable[[Notice], None] | None = None) -> None:
        self.config = config
        self.dialect = dialect(config.api)
        self.health = Health(f"endpoint {config.url.text}", on_notice)
        self.stats = EndpointStats()
        self._use_suffix = True  # until the engine refuses one
        self._io = transport.LoopThread(config)

    @property
    def constrains_prefix(self) -> bool:
        """Whether the engine itself keeps to a required prefix (a llama.cpp grammar). Elsewhere a
        healed prompt is only checked, and mostly strays: send such engines the prompt unhealed."""
        return self.config.api == "llama.cpp"

    def close(self) -> None:
        """Closes the pool and its loop thread; later calls answer with an error."""
        self._io.close()

    def snapshot(self) -> dict[str, Any]:
        """The ``endpoint`` block of ``lsp_server/stats`` (no key, no headers)."""
        return self.stats.snapshot(
            self.config.url.text, self.config.api, self.health.status, self.health.outages
        )

    # -- completions ---------------------------------------------------------------------------------
    def complete(
        self,
        request: RemoteRequest,
        should_stop: Callable[[], bool] = lambda: False,
        on_text: Callable[[str], bool] | None = None,
    ) -> RemoteResult:
        """The engine's completion of ``request``; partial when stopped.

        ``on_text`` gets the text so far after each streamed piece, on this thread; returning True
        ends the generation there (stop reason "stop"), e.g. where a block ends.
        """
        self.stats.record(requests=1)
        unusable = self._unusable()
        if unusable is not None:
            self.stats.record(errors=1, last_error=unusable)
            return RemoteResult(error=unusable)
        refused = self.health.admit()
        if refused is not None:  # down and backing off: no network; last_error keeps the real cause
            self.stats.record(errors=1, backed_off=1)
            return RemoteResult(error=refused)
        try:
            result = self._complete(request, should_stop, on_text)
        except Exception as exc:  # a bug must not reach the caller: answer empty, log it
            log.exception("remote completion failed unexpectedly")
            result = RemoteResult(error=f"internal error: {type(exc).__name__}")
            self.stats.record(last_error=result.error)
        self._account(result)
        return result

    def _unusable(self) -> str | None:
        """Why no request can be made at all (not an outage: nothing to retry)."""
        if self._io.closed:
            return "the remote engine was closed"
        return self._io.setup_error

    def _complete(
        self, request: RemoteRequest, should_stop: Callable[[], bool], on_text: Callable[[str], bool] | None
    ) -> RemoteResult:
        use_suffix = self._use_suffix and request.suffix is not None
        url, body = self.dialect.completion(self.config.url, request, self.config.model, use_suffix)
        result = self._stream(url, body, request, should_stop, on_text)
        refused = result.error and result.new_tokens == 0 and result.http_status in (*UNSUPPORTED, 400)
        if use_suffix and refused:
            # the engine has no FIM (llama.cpp answers /infill with 501 for such a model): go without
            log.info("the endpoint refused a suffix (%s); sending prompts without one", result.error)
            self._use_suffix = False
            self.stats.record(fim_unsupported=True)
            url, body = self.dialect.completion(self.config.url, request, self.config.model, False)
            return self._stream(url, body, request, should_stop, on_text)
        result.used_suffix = use_suffix
        return result

    def _stream(
        self,
        url: str,
        body: dict[str, Any],
        request: RemoteRequest,
        should_stop: Callable[[], bool],
        on_text: Callable[[str], bool] | None,
    ) -> RemoteResult:
        """Runs the stream on the loop thread and follows it from here until it ends or must stop."""
        events: queue.SimpleQueue = queue.SimpleQueue()
        started = time.monotonic()
        remaining = None if request.deadline is None else request.deadline - started
        timeout = transport.timeout_for(remaining)
        future = self._io.run(self._read(url, body, timeout, events.put))
        result, gate = RemoteResult(stop_reason="error"), Gate(request.required_prefix, request.stop)
        try:
            while True:
                if should_stop():
                    result.stop_reason = "cancelled"
                    break
                if request.deadline is not None and time.monotonic() >= request.deadline:
                    result.stop_reason = "budget"
                    break
                try:
                    event = events.get(timeout=POLL_S)
                except queue.Empty:
                    continue
                if self._apply(event, result, started):
                    break
                if self._gated(event, gate, result, on_text):
                    break
        finally:
            future.cancel()  # closes the stream at once if it is still open
        result.text, result.prefix_met = gate.answer, gate.prefix_met
        return result

    @staticmethod
    def _gated(event: tuple, gate: Gate, result: RemoteResult, on_text: Callable[[str], bool] | None) -> bool:
        """Passes a chunk's text through the gate and ``on_text``; True when the answer is complete."""
        if event[0] != "chunk" or not event[1].text:
            return False
        before = gate.answer
        verdict = gate.feed(event[1].text)
        if verdict != "go":
            result.stop_reason = "stop"  # a stop string (client-side), or healing unmet (empty)
            return True
        if on_text is not None and gate.answer != before and on_text(gate.answer):
            result.stop_reason = "stop"  # the caller's own end (a block's end)
            return True
        return False

    async def _read(
        self, url: str, body: dict[str, Any], timeout: httpx.Timeout, emit: Callable[[tuple], None]
    ) -> None:
        """On the loop thread: POST, then one event per streamed JSON object, then ("end",)."""
        try:
            async with contextlib.AsyncExitStack() as stack:
                assert self._io.client is not None
                response = await transport.open_stream(
                    self._io.client, self.config, url, body, transport.bearer(self.config), timeout, stack
                )
                done = False
                async for line in response.aiter_lines():
                    parsed = parse_line(line)
                    if parsed is DONE:
                        done = True
                        break
                    if parsed is not None:
                        emit(("chunk", self.dialect.chunk(parsed)))  # type: ignore[arg-type]
            emit(("end", done))
        except MalformedEvent as exc:
            emit(("error", TransportError(str(exc))))
        except Exception as exc:  # every failure becomes an answer
            emit(("error", transport.describe(exc)))

    def _apply(self, event: tuple, result: RemoteResult, started: float) -> bool:
        """Adds one event to the result; True when the generation is over."""
        now_ms = (time.monotonic() - started) * 1000
        if event[0] == "error":
            error: TransportError = event[1]
            result.error, result.stop_reason = str(error), "error"
            result.http_status, result.slow = error.status, not error.hard
            return True
        if event[0] == "end":
            if result.stop_reason == "error" and event[1]:  # [DONE] without a finish reason: a clean end
                result.stop_reason = "stop"
            elif result.stop_reason == "error":  # cut off without saying why
                result.error = "the stream ended without a final event"
            return True
        chunk: Chunk = event[1]
        if chunk.error is not None:
            result.error, result.stop_reason = f"engine error: {chunk.error}", "error"
            return True
        if chunk.text:
            result.ttft_ms = result.ttft_ms if result.ttft_ms is not None else round(now_ms, 2)
            result.ttlt_ms = round(now_ms, 2)
            result.new_tokens += max(1, len(chunk.tokens))
        result.tokens.extend(chunk.tokens)
        for name in ("prompt_tokens", "cached_tokens"):
            if getattr(chunk, name) is not None:
                setattr(result, name, getattr(chunk, name))
        if chunk.new_tokens is not None:
            result.new_tokens = chunk.new_tokens
        if chunk.finish is not None:
            result.stop_reason = chunk.finish  # the stream ends next ("end"); OpenAI's usage may come first
        return False

    # -- tokenizer -----------------------------------------------------------------------------------
    def tokenize(self, text: str, deadline: float | None = None) -> list[int] | None:
        """The engine's token ids for ``text`` (no special tokens), for token healing; None where the
        engine has no ``/tokenize`` (remembered: not asked again) or it failed."""
        url, body = self.dialect.tokenize(self.config.url, text, self.config.model)
        return self._tokenizer_call(url, body, deadline, parse_tokens)

    def tokenize_pieces(
        self, text: str, deadline: float | None = None
    ) -> tuple[list[int], dict[int, bytes]] | None:
        """``tokenize``, plus each token's bytes where the engine sends them (llama.cpp's
        ``with_pieces``; empty elsewhere)."""
        url, body = self.dialect.tokenize(self.config.url, text, self.config.model)

        def parse(answer: Any) -> tuple[list[int], dict[int, bytes]] | None:
            ids = parse_tokens(answer)
            return None if ids is None else (ids, parse_pieces(answer))

        return self._tokenizer_call(url, body, deadline, parse)

    @property
    def fim_available(self) -> bool:
        """Whether a suffix is still sent (until the engine refuses one: no FIM in its model)."""
        return self._use_suffix

    def detokenize(self, ids: Sequence[int], deadline: float | None = None) -> str | None:
        """The text of ``ids`` by the engine's ``/detokenize`` (llama.cpp, vLLM): what healing needs
        to know which text a backed-up token held; None where there is none or it failed."""
        url, body = self.dialect.detokenize(self.config.url, list(ids), self.config.model)
        return self._tokenizer_call(url, body, deadline, parse_text)

    def _tokenizer_call(
        self, url: str, body: dict[str, Any], deadline: float | None, parse: Callable[[Any], T | None]
    ) -> T | None:
        """One small JSON request; the engine's tokenizer endpoints count as one capability."""
        if self.stats.tokenize_supported is False or self._unusable() or self.health.admit():
            return None
        self.stats.record(tokenize_requests=1)
        remaining = TOKENIZE_TIMEOUT_S if deadline is None else max(0.05, deadline - time.monotonic())
        future = self._io.run(self._post_json(url, body, transport.timeout_for(remaining)))
        try:
            status, answer = future.result(timeout=remaining + 0.5)
        except TransportError as exc:
            status, answer = None, None
            self.stats.record(last_error=str(exc))
            self.health.failure(str(exc), hard=exc.hard)
        except Exception as exc:  # a timeout of the future, or a bug: no answer, never an exception
            future.cancel()
            status, answer = None, None
            log.warning("endpoint %s: %s failed: %s", self.config.url.text, url, type(exc).__name__)
        value = parse(answer) if status == 200 else None
        if status == 200 or status in UNSUPPORTED:
            self.health.success()  # it answered: a probe that got through ends an outage too
        elif status is not None:
            error = f"{transport.status_text(status)} from /{url.rsplit('/', 1)[-1]}"
            self.stats.record(last_error=error)
            self.health.failure(error, hard=True)
        if status in UNSUPPORTED or (status == 200 and value is None):
            self.stats.record(tokenize_supported=False)
        elif value is not None:
            self.stats.record(tokenize_supported=True)
        if value is None:
            self.stats.record(tokenize_failed=1)
        return value

    async def _post_json(self, url: str, body: dict[str, Any], timeout: httpx.Timeout) -> tuple[int, Any]:
        try:
            assert self._io.client is not None
            response = await self._io.client.post(
                url, json=body, headers=transport.bearer(self.config), timeout=timeout
            )
        except Exception as exc:
            raise transport.describe(exc) from None
        if response.status_code != 200:
            return response.status_code, None
        try:
            return 200, response.json()
        except ValueError:
            return 200, None

    def _account(self, result: RemoteResult) -> None:
        """Stats and the outage state for one finished request."""
        key = self.config.api_key()
        if result.error and key and key in result.error:  # an engine that echoes what it was sent
            result.error = result.error.replace(key, "(key not shown)")
        if result.stop_reason == "cancelled":
            self.stats.record(cancelled=1)
        elif result.stop_reason == "budget":
            self.stats.record(budget=1)
        self.stats.record(tokens=result.new_tokens, ttft_ms=result.ttft_ms)
        if result.error is None:
            if result.stop_reason not in ("cancelled", "budget"):
                self.stats.record(ttlt_ms=result.ttlt_ms)
            if result.new_tokens or result.stop_reason not in ("cancelled", "budget"):
                self.health.success()
            return
        self.stats.record(errors=1, last_error=result.error)
        log.warning("endpoint %s: %s", self.config.url.text, result.error)
        self.health.failure(result.error, hard=not result.slow)
