"""The two HTTP APIs a remote engine may speak: the request each builds and what its events mean.

``openai``: ``POST {base}/completions`` (``/v1`` is added when the base URL lacks it), served by
vLLM, TGI, llama.cpp's server and Ollama; FIM through ``suffix`` where the engine supports it.
``llama.cpp``: its native ``POST /completion`` (``cache_prompt``: the slot keeps the prompt's KV
cache, so the next keystroke prefills only what changed) and ``POST /infill`` for a suffix, with
the cursor's line as its ``prompt``, as llama.vim sends it (documented to follow the middle marker,
where a keystroke leaves the prefix and the suffix cached; build 11434 appends it to the prefix).
Both stream server-sent events. Tokenizing is ``POST /tokenize`` at the server's root in both
(llama.cpp reads ``content``, vLLM ``prompt``; both are sent).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from speculative_complete.lsp_server.endpoint import BaseUrl
from speculative_complete.lsp_server.remote.gate import prefix_grammar
from speculative_complete.lsp_server.remote.request import RemoteRequest, StopReason


@dataclass
class Chunk:
    """What one streamed event says."""

    text: str = ""
    tokens: list[int] = field(default_factory=list)
    finish: StopReason | None = None  # set on the event that ends the generation
    new_tokens: int | None = None  # the engine's own count, where it gives one
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    error: str | None = None  # an error reported inside the stream


def _root(url: BaseUrl) -> str:
    """The server's root: the base URL without a trailing ``/v1``."""
    return url.with_path(url.path.removesuffix("/v1"))


def _stream_error(event: dict[str, Any]) -> str | None:
    error = event.get("error")
    if error is None:
        return None
    if isinstance(error, dict):
        return str(error.get("message") or error.get("type") or error)[:300]
    return str(error)[:300]


class OpenAIDialect:
    name = "openai"

    def completion(
        self, url: BaseUrl, request: RemoteRequest, model: str | None, use_suffix: bool
    ) -> tuple[str, dict[str, Any]]:
        path = url.path if url.path.endswith("/v1") else url.path + "/v1"
        body: dict[str, Any] = {
            "prompt": request.prompt if isinstance(request.prompt, str) else list(request.prompt),
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.temperature == 0:
            body["top_p"] = 1.0
        if request.stop and not request.required_prefix:  # else applied by the gate, after the prefix
            body["stop"] = list(request.stop)
        if model:
            body["model"] = model
        if use_suffix and request.suffix is not None:
            body["suffix"] = request.suffix
        return url.with_path(path) + "/completions", body

    def chunk(self, event: dict[str, Any]) -> Chunk:
        error = _stream_error(event)
        if error is not None:
            return Chunk(error=error)
        out = Chunk()
        choices = event.get("choices") or []
        if choices and isinstance(choices[0], dict):
            out.text = choices[0].get("text") or ""
            reason = choices[0].get("finish_reason")
            if reason:
                out.finish = "max_tokens" if reason == "length" else "stop"
        usage = event.get("usage")
        if isinstance(usage, dict):
            out.new_tokens = usage.get("completion_tokens")
            out.prompt_tokens = usage.get("prompt_tokens")
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict):
                out.cached_tokens = details.get("cached_tokens")
        return out

    def tokenize(self, url: BaseUrl, text: str, model: str | None) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {
            "content": text,
            "prompt": text,
            "add_special": False,
            "add_special_tokens": False,
        }
        if model:
            body["model"] = model
        return _root(url) + "/tokenize", body

    def detokenize(self, url: BaseUrl, ids: list[int], model: str | None) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {"tokens": ids}
        if model:
            body["model"] = model
        return _root(url) + "/detokenize", body


class LlamaCppDialect:
    name = "llama.cpp"

    def completion(
        self, url: BaseUrl, request: RemoteRequest, model: str | None, use_suffix: bool
    ) -> tuple[str, dict[str, Any]]:
        prompt = request.prompt if isinstance(request.prompt, str) else list(request.prompt)
        body: dict[str, Any] = {
            "n_predict": request.max_tokens,
            "temperature": request.temperature,
            "stream": True,
            "cache_prompt": True,
            "return_tokens": True,
        }
        if request.temperature == 0:
            body["top_k"] = 1
        if request.required_prefix:  # the engine itself keeps to the prefix; the gate applies the stops
            body["grammar"] = prefix_grammar(request.required_prefix)
        elif request.stop:
            body["stop"] = list(request.stop)
        if use_suffix and request.suffix is not None and isinstance(prompt, str):
            cut = len(prompt) - len(request.line) if prompt.endswith(request.line) else len(prompt)
            body.update(input_prefix=prompt[:cut], input_suffix=request.suffix, prompt=prompt[cut:])
            return _root(url) + "/infill", body
        body["prompt"] = prompt
        return _root(url) + "/completion", body

    def chunk(self, event: dict[str, Any]) -> Chunk:
        error = _stream_error(event)
        if error is not None:
            return Chunk(error=error)
        out = Chunk(text=event.get("content") or "")
        tokens = event.get("tokens")
        if isinstance(tokens, list):
            out.tokens = [t for t in tokens if isinstance(t, int)]
        if event.get("stop"):
            kind = event.get("stop_type")
            out.finish = {"eos": "eos", "limit": "max_tokens"}.get(kind, "stop")
            out.new_tokens = event.get("tokens_predicted")
            timings = event.get("timings")
            if isinstance(timings, dict):
                cached, evaluated = timings.get("cache_n"), timings.get("prompt_n")
                out.cached_tokens = cached
                if isinstance(cached, int) and isinstance(evaluated, int):
                    out.prompt_tokens = cached + evaluated
        return out

    def tokenize(self, url: BaseUrl, text: str, model: str | None) -> tuple[str, dict[str, Any]]:
        # with_pieces: each id's text comes back too, so healing can decode without /detokenize
        return _root(url) + "/tokenize", {"content": text, "add_special": False, "with_pieces": True}

    def detokenize(self, url: BaseUrl, ids: list[int], model: str | None) -> tuple[str, dict[str, Any]]:
        return _root(url) + "/detokenize", {"tokens": ids}


def dialect(name: str) -> OpenAIDialect | LlamaCppDialect:
    return LlamaCppDialect() if name == "llama.cpp" else OpenAIDialect()


def parse_tokens(body: Any) -> list[int] | None:
    """``{"tokens": [ids]}`` (llama.cpp, vLLM) or TGI's ``[{"id": ...}]``; None for anything else."""
    tokens = body.get("tokens") if isinstance(body, dict) else body
    if not isinstance(tokens, list):
        return None
    ids = [t if isinstance(t, int) else t.get("id") if isinstance(t, dict) else None for t in tokens]
    if any(not isinstance(i, int) or isinstance(i, bool) for i in ids):
        return None
    return ids  # type: ignore[return-value]


def parse_pieces(body: Any) -> dict[int, bytes]:
    """The bytes of each token in a ``/tokenize`` answer given ``with_pieces`` (llama.cpp): a
    piece is a string, or a list of byte values when it is not valid UTF-8 on its own."""
    tokens = body.get("tokens") if isinstance(body, dict) else None
    out: dict[int, bytes] = {}
    for token in tokens if isinstance(tokens, list) else ():
        if not isinstance(token, dict) or not isinstance(token.get("id"), int):
            continue
        piece = token.get("piece")
        if isinstance(piece, str):
            out[token["id"]] = piece.encode("utf-8")
        elif isinstance(piece, list) and all(isinstance(b, int) and 0 <= b < 256 for b in piece):
            out[token["id"]] = bytes(piece)
    return out


def parse_text(body: Any) -> str | None:
    """``/detokenize``'s answer: llama.cpp's ``{"content"}`` or vLLM's ``{"prompt"}``."""
    if not isinstance(body, dict):
        return None
    text = body.get("content", body.get("prompt"))
    return text if isinstance(text, str) else None
