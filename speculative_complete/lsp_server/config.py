"""One settings dataclass and the rules for layering it: defaults < CLI < initializationOptions <
workspace/didChangeConfiguration.

Each layer is a plain mapping with the LSP (camelCase) names. A payload may be flat or nested
under ``"lspServer"``; ``workspace/didChangeConfiguration`` carries the client's whole section, so
a key missing there falls back to the layers below it. A value that fails validation never takes
effect: the setting keeps the value it had, and the caller shows the returned problem to the user.

This module imports from ``decoding`` only ``speculative_complete.decoding.choices``, which is pure
Python: the rest pulls in torch, seconds of import on the event loop.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from speculative_complete.decoding.choices import DRAFTER_NAMES, QUANTIZATIONS, DrafterName, Quantization
from speculative_complete.lsp_server.context import FIM_SETTINGS as FIM_STYLES
from speculative_complete.lsp_server.context import is_fim_setting
from speculative_complete.lsp_server.ending import MULTILINE_MODES
from speculative_complete.lsp_server.endpoint import API_NAMES, EndpointError, insecure_reason, parse_base_url

SECTION = "lspServer"
DTYPE_NAMES = ("auto", "float32", "fp32", "float16", "fp16", "bfloat16", "bf16")
DECODER_NAMES = ("speculative", "transformers")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DEVICE_RE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?|xpu(:\d+)?)$")


@dataclass(frozen=True)
class Settings:
    """Everything a user can set; the README's settings table says what each field means, and
    ``tests/project/test_readme.py`` keeps its names and defaults equal to these."""

    model: str = "default"
    draft_model: str | None = None
    draft_head: str = "auto"  # auto: the head shipped for the model, if any; none; a folder or hub id
    drafter: DrafterName = "auto"
    device: str = "auto"
    dtype: str = "auto"
    quantization: Quantization = "auto"  # auto: a GGUF's blocks stay on the CPU; none: dequantize
    max_new_tokens: int = 64
    context_tokens: int = 512  # a cold prefill's cost grows with it (benchmarks/README.md)
    # 0: editors debounce their own requests (VS Code, the Neovim plugin), and a newer request stops
    # an older decode within one pass; a server-side wait only delayed every answer and made more
    # of them stale (the keystroke replay: benchmarks/README.md, "Measurements behind design
    # choices"). Worth raising for a shared remote engine.
    debounce_ms: int = 0
    # Per request: a block's whole lines by then, the rest decoded ahead; the local engine always
    # finishes a prompt's prefill and first line (the answer the user paused for; a line cut
    # mid-way is a wrong one), a remote engine's stream is closed (``runtime.finishes_first_line``).
    time_budget_ms: int = 2000
    # A multi-line body is answered with the lines ready this long after the request came (as
    # llama.vim's t_max_predict_ms); the rest is decoded ahead for the next request. 0: the whole body.
    first_answer_ms: int = 250
    enabled: bool = True
    multiline: str = "auto"  # auto: a block body where the cursor opens an empty one; never; always
    kv_cache_mb: int = 256  # per-document KV caches kept for reuse across keystrokes; 0: no reuse
    type_ahead: bool = True  # typed-ahead and repeated requests answered without decoding anew
    prefetch: bool = True  # when idle, decode the next line (or renew the prompt's rows: idle.py)
    decoder: str = "speculative"  # "transformers": model.generate() as a peer path, for comparisons
    max_lines: int = 12  # the most lines a multi-line suggestion spans
    fim_template: str = "auto"  # a style, auto (from the tokenizer), none, or "...{prefix}...{suffix}..."
    neighbor_snippets: int = 2  # snippets from other open documents in the prompt
    # Definitions of the names near the cursor and other files' recent edits: off, since on the
    # real Qwen2.5-Coder-1.5B and the default model they cost more exact lines than they bring
    # at this context size (benchmarks/README.md, repo_quality.py).
    cross_file_context: bool = False
    token_healing: bool = True
    workspace_index_mb: int = 8  # the workspace's files as a draft source (MB of text); 0: off
    # A remote engine (speculative_complete/lsp_server/remote): None decodes locally; nothing
    # reaches the network otherwise.
    endpoint: str | None = None  # base URL, e.g. "http://gpu-box:8000/v1"
    endpoint_api: str = "openai"  # "openai": /v1/completions; "llama.cpp": /completion and /infill
    endpoint_model: str | None = None  # the model name the server expects (OpenAI "model")
    api_key_env: str | None = None  # the NAME of an environment variable holding a bearer token
    ca_bundle: str | None = None  # a PEM file of extra CA certificates (added to the system's)
    allow_insecure_endpoint: bool = False  # plain http:// to a host other than loopback

    def model_key(self) -> tuple:
        """What identifies the loaded weights, or the remote engine and how it is reached: a
        change here means a reload (a new endpoint's runtime replaces the old one, which is
        closed). With an endpoint, the local model's settings don't matter."""
        if self.endpoint is not None:
            return (
                "remote",
                self.endpoint,
                self.endpoint_api,
                self.endpoint_model,
                self.api_key_env,
                self.ca_bundle,
                self.allow_insecure_endpoint,
            )
        return (self.model, self.draft_model, self.draft_head, self.device, self.dtype, self.quantization)

    def to_lsp(self) -> dict[str, Any]:
        return {_CAMEL[f.name]: getattr(self, f.name) for f in fields(self)}


class SettingError(ValueError):
    """A value a setting can't take; the message says what it accepts."""


def _string(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise SettingError("expected a non-empty string")
    return value.strip()


def _optional_string(value: Any) -> str | None:
    if value is None or value == "":
        return None
    return _string(value)


def _choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or value not in options:
            raise SettingError(f"expected one of {', '.join(options)}")
        return value

    return check


def _device(value: Any) -> str:
    if not isinstance(value, str) or not _DEVICE_RE.match(value):
        raise SettingError("expected auto, cpu, cuda, cuda:N, mps or xpu")
    return value


def _int_range(low: int, high: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        # JSON has one number type: accept 50.0 but not 50.5, and never a bool (a Python int).
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
            raise SettingError(f"expected an integer from {low} to {high}")
        if not low <= int(value) <= high:
            raise SettingError(f"expected an integer from {low} to {high}")
        return int(value)

    return check


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise SettingError("expected true or false")
    return value


def _multiline(value: Any) -> str:
    """A mode name; the booleans of the first version still mean always / never."""
    if isinstance(value, bool):
        return "always" if value else "never"
    if isinstance(value, str) and value in MULTILINE_MODES:
        return value
    raise SettingError(f"expected one of {', '.join(MULTILINE_MODES)} (or true / false)")


def _endpoint(value: Any) -> str | None:
    """A base URL; the scheme/host rules that depend on another setting are checked in ``layer``."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise SettingError("expected a URL such as http://127.0.0.1:8080 or https://gpu-box:8000/v1, or null")
    try:
        return parse_base_url(value.strip()).text
    except EndpointError as exc:
        raise SettingError(str(exc)) from None


def _env_name(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not _ENV_NAME_RE.match(value):
        raise SettingError(
            "expected the name of an environment variable (letters, digits, _), not the key itself"
        )
    return value


def _fim_template(value: Any) -> str:
    if isinstance(value, str) and is_fim_setting(value):
        return value
    raise SettingError(
        f"expected one of {', '.join(FIM_STYLES)}, or a template with {{prefix}} and {{suffix}}"
    )


_VALIDATORS: dict[str, Callable[[Any], Any]] = {
    "model": _string,
    "draft_model": _optional_string,
    "draft_head": _string,
    "drafter": _choice(DRAFTER_NAMES),
    "device": _device,
    "dtype": _choice(DTYPE_NAMES),
    "quantization": _choice(QUANTIZATIONS),
    "max_new_tokens": _int_range(1, 4096),
    "context_tokens": _int_range(16, 131072),
    "debounce_ms": _int_range(0, 10000),
    "time_budget_ms": _int_range(0, 600000),  # 0: no budget
    "first_answer_ms": _int_range(0, 600000),  # 0: wait for the whole block
    "enabled": _bool,
    "multiline": _multiline,
    "kv_cache_mb": _int_range(0, 1 << 20),
    "type_ahead": _bool,
    "prefetch": _bool,
    "decoder": _choice(DECODER_NAMES),
    "max_lines": _int_range(1, 1000),
    "fim_template": _fim_template,
    "neighbor_snippets": _int_range(0, 10),
    "cross_file_context": _bool,
    "token_healing": _bool,
    "workspace_index_mb": _int_range(0, 1024),
    "endpoint": _endpoint,
    "endpoint_api": _choice(API_NAMES),
    "endpoint_model": _optional_string,
    "api_key_env": _env_name,
    "ca_bundle": _optional_string,
    "allow_insecure_endpoint": _bool,
}
_CAMEL = {name: re.sub(r"_(\w)", lambda m: m.group(1).upper(), name) for name in _VALIDATORS}
_BY_CAMEL = {camel: name for name, camel in _CAMEL.items()}


def validate(name: str, value: Any) -> Any:
    """``value`` checked and converted for the setting ``name`` (a field name); raises SettingError."""
    return _VALIDATORS[name](value)


def section(payload: Any) -> tuple[Mapping[str, Any], list[str]]:
    """The settings mapping inside an initializationOptions / didChangeConfiguration payload."""
    if payload is None:
        return {}, []
    if not isinstance(payload, Mapping):
        return {}, [f"settings must be an object (flat or under {SECTION!r}), got {type(payload).__name__}"]
    nested = payload.get(SECTION)
    if nested is None:
        return payload, []
    if not isinstance(nested, Mapping):
        return {}, [f"settings {SECTION!r} must be an object, got {type(nested).__name__}"]
    return nested, []


@dataclass
class Layered:
    settings: Settings
    problems: list[str] = field(default_factory=list)  # rejected values: worth a message to the user
    unknown: list[str] = field(default_factory=list)  # unknown keys: worth a log line


def layer(current: Settings, lower: Settings, payload: Any) -> Layered:
    """``lower`` overlaid with ``payload``; an invalid value keeps its ``current`` value.

    Problems are full sentences naming the setting, the value given, what it accepts and the
    value kept.
    """
    values, problems = section(payload)
    out = Layered(lower, problems)
    for key, raw in values.items():
        name = _BY_CAMEL.get(key)
        if name is None:
            out.unknown.append(f"unknown setting {key!r} ignored; known settings: {', '.join(_BY_CAMEL)}")
            continue
        try:
            out.settings = replace(out.settings, **{name: _VALIDATORS[name](raw)})
        except SettingError as exc:
            kept = getattr(current, name)
            out.settings = replace(out.settings, **{name: kept})
            shown = _show_given(name, raw)
            out.problems.append(f"setting {key} = {shown} ignored: {exc}; keeping {_show(kept)}")
    if out.settings.drafter == "model" and out.settings.draft_model is None:
        kept = current.drafter if current.drafter != "model" or current.draft_model else "auto"
        out.problems.append(f"setting drafter = 'model' needs draftModel to be set; keeping {_show(kept)}")
        out.settings = replace(out.settings, drafter=kept)
    _check_endpoint_scheme(current, out)
    return out


def _check_endpoint_scheme(current: Settings, out: Layered) -> None:
    """Plain http:// only to loopback unless allowInsecureEndpoint: a key or code sent in clear text
    over a network is readable by anyone on the path."""
    reason = insecure_reason(out.settings.endpoint, out.settings.allow_insecure_endpoint)
    if reason is None:
        return
    kept = current.endpoint
    if insecure_reason(kept, out.settings.allow_insecure_endpoint) is not None:
        kept = None
    out.problems.append(
        f"setting endpoint = {_show(out.settings.endpoint)} ignored: {reason}; keeping {_show(kept)}"
    )
    out.settings = replace(out.settings, endpoint=kept)


def from_cli(
    model: str | None = None,
    draft_model: str | None = None,
    drafter: str | None = None,
    draft_head: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    quantization: str | None = None,
    **remote: Any,
) -> Layered:
    """Defaults overlaid with the command line's flags (None: not given); ``remote`` takes the
    endpoint settings by field name (``endpoint``, ``endpoint_api``, ...)."""
    given = {
        "model": model,
        "draftModel": draft_model,
        "drafter": drafter,
        "draftHead": draft_head,
        "device": device,
        "dtype": dtype,
        "quantization": quantization,
        **{_CAMEL[name]: value for name, value in remote.items()},
    }
    defaults = Settings()
    return layer(defaults, defaults, {k: v for k, v in given.items() if v is not None})


def _show_given(name: str, value: Any) -> str:
    """A rejected value as it may be shown and logged: a key pasted where its variable's name
    belongs, or a password in a URL, is not repeated."""
    if name == "api_key_env":
        return "(value not shown)"
    if name == "endpoint" and isinstance(value, str) and "@" in value:
        return repr(re.sub(r"//[^/@]*@", "//(credentials not shown)@", value))
    return _show(value)


def _show(value: Any) -> str:
    return "null" if value is None else repr(value)
