"""Remote engines: completions decoded by an inference server (vLLM, llama.cpp's server, TGI,
Ollama) instead of the local torch engine. Nothing here touches the network unless an endpoint is
configured and a ``RemoteEngine`` is built for it; the HTTP library itself is imported only then
(``speculative_complete.lsp_server.config`` validates URLs with ``endpoint`` and must stay light).

    engine = RemoteEngine(EndpointConfig.create("http://127.0.0.1:8080", api="llama.cpp"))
    result = engine.complete(RemoteRequest("def add(a, b):\\n", max_tokens=32, stop=("\\n",)),
                             should_stop=cancelled.is_set)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from speculative_complete.lsp_server.endpoint import EndpointConfig, EndpointError
from speculative_complete.lsp_server.remote.health import Notice
from speculative_complete.lsp_server.remote.request import RemoteRequest, RemoteResult

if TYPE_CHECKING:
    from speculative_complete.lsp_server.remote.engine import RemoteEngine

__all__ = ["EndpointConfig", "EndpointError", "Notice", "RemoteEngine", "RemoteRequest", "RemoteResult"]


def __getattr__(name: str) -> Any:
    if name == "RemoteEngine":  # imports the HTTP client: only when an engine is wanted
        from speculative_complete.lsp_server.remote.engine import RemoteEngine

        return RemoteEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
