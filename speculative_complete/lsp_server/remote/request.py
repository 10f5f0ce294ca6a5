"""What is asked of a remote engine and what comes back: plain data, no HTTP."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

# eos: the model ended; max_tokens: the limit; stop: a stop string (OpenAI's "stop" also covers eos);
# cancelled: should_stop said so; budget: the deadline passed; error: nothing usable came (see error)
StopReason = Literal["eos", "max_tokens", "stop", "cancelled", "budget", "error"]


@dataclass(frozen=True)
class RemoteRequest:
    """One completion; the prompt is text, or token ids from the engine's own tokenizer (as
    ``RemoteEngine.tokenize`` gives them), which both APIs accept and which keeps a healed
    prompt exactly as built."""

    prompt: str | Sequence[int]
    suffix: str | None = None  # fill-in-the-middle: sent only when the engine is asked to use it
    # fill-in-the-middle: the end of a text prompt that is the cursor's line so far, which
    # llama.cpp's ``/infill`` takes as its ``prompt`` (documented to follow the middle marker)
    line: str = ""
    max_tokens: int = 64
    stop: tuple[str, ...] = ()  # e.g. ("\n",): the engine stops there and leaves the string out
    temperature: float = 0.0  # greedy
    # Token healing: the generated text must begin with this (the text the prompt backed up over);
    # the result's text is what follows it, and the stops apply there (see gate.py).
    required_prefix: str = ""
    deadline: float | None = None  # time.monotonic() after which the request gives up (its budget)


@dataclass
class RemoteResult:
    """The text generated (possibly partial: cancelled, budget), and how it went.

    A failed request is an empty (or partial) text with ``error`` set, never an exception."""

    text: str = ""
    stop_reason: StopReason = "error"
    tokens: list[int] = field(default_factory=list)  # ids where the API sends them (llama.cpp native)
    new_tokens: int = 0  # chunks (tokens) received, or the engine's own count when it sends one
    ttft_ms: float | None = None  # request sent -> first text
    ttlt_ms: float | None = None  # request sent -> last text
    prompt_tokens: int | None = None  # the engine's count, where it reports one
    cached_tokens: int | None = None  # of those, served from the engine's prompt cache
    error: str | None = None
    http_status: int | None = None  # of a failed request, where the engine answered one
    slow: bool = False  # the error was a timeout: the engine may only be slow, not gone
    used_suffix: bool = False  # the engine was given the suffix (FIM)
    # None: no required prefix; False: not spelled out (the engine strayed, or it stopped first)
    prefix_met: bool | None = None

    @property
    def ok(self) -> bool:
        return self.error is None
