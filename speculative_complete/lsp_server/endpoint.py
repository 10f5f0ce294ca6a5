"""Where a remote engine lives and what may be sent there: the URL rules of the security model.

Kept free of any HTTP library, and outside ``speculative_complete.lsp_server.remote``, so that
``speculative_complete.lsp_server.config`` can validate settings with it: the settings sit below the
remote engines, which read them. The rules: ``http`` or ``https`` only; no user or password in the
URL (a key belongs in the environment variable named by ``apiKeyEnv``, never in a setting); plain
``http://`` only to a loopback address unless the user says otherwise, because a bearer token and
the user's code would cross the network in clear text.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from urllib.parse import urlsplit

API_NAMES = ("openai", "llama.cpp")  # the wire dialects (``speculative_complete.lsp_server.remote.dialects``)
LOOPBACK_NAMES = ("localhost", "localhost.")


class EndpointError(ValueError):
    """An endpoint URL this server will not talk to; the message says why and what it accepts."""


@dataclass(frozen=True)
class BaseUrl:
    """A checked base URL, without a trailing slash."""

    scheme: str
    host: str  # without brackets for IPv6
    port: int | None
    path: str  # "" or "/v1" ..., no trailing slash

    @property
    def text(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        port = f":{self.port}" if self.port is not None else ""
        return f"{self.scheme}://{host}{port}{self.path}"

    @property
    def origin(self) -> tuple[str, str, int]:
        """What a redirect must keep to be followed: scheme, host and port."""
        return self.scheme, self.host.lower(), self.port or (443 if self.scheme == "https" else 80)

    def with_path(self, path: str) -> str:
        return BaseUrl(self.scheme, self.host, self.port, path).text


def parse_base_url(text: str) -> BaseUrl:
    """``text`` checked as an endpoint base URL; raises EndpointError."""
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise EndpointError(f"not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise EndpointError("expected an http:// or https:// URL such as https://gpu-box:8000/v1")
    if not parts.hostname:
        raise EndpointError("expected a host name in the URL")
    if parts.username is not None or parts.password is not None:
        raise EndpointError(
            "a user or password in the URL is not accepted: put the key in an "
            "environment variable and name it with apiKeyEnv"
        )
    if parts.query or parts.fragment:
        raise EndpointError("expected a base URL without ?query or #fragment")
    return BaseUrl(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))


def is_loopback(host: str) -> bool:
    """Loopback by its literal form only: a name is not resolved (DNS could point it anywhere)."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def insecure_reason(endpoint: str | None, allow_insecure: bool) -> str | None:
    """Why ``endpoint`` may not be used as it is, or None when it may."""
    if endpoint is None:
        return None
    try:
        url = parse_base_url(endpoint)
    except EndpointError as exc:
        return str(exc)
    if url.scheme == "http" and not allow_insecure and not is_loopback(url.host):
        return (
            "plain http:// is only used to a loopback address (127.0.0.1, ::1, localhost): use "
            "https://, or set allowInsecureEndpoint to true to send code (and a key) unencrypted"
        )
    return None


@dataclass(frozen=True)
class EndpointConfig:
    """Everything a ``RemoteEngine`` is built from; equal configs can share one engine.

    The key itself is not here: only the name of the variable holding it, read at each request so
    that a rotated key works without a restart, and so that it never sits in settings or stats.
    """

    url: BaseUrl
    api: str = "openai"  # one of API_NAMES
    model: str | None = None
    api_key_env: str | None = None
    ca_bundle: str | None = None
    allow_insecure: bool = False

    @classmethod
    def create(
        cls,
        endpoint: str,
        api: str = "openai",
        model: str | None = None,
        api_key_env: str | None = None,
        ca_bundle: str | None = None,
        allow_insecure: bool = False,
    ) -> EndpointConfig:
        """A checked config; raises EndpointError for a URL the rules above refuse."""
        if api not in API_NAMES:
            raise EndpointError(f"endpointApi must be one of {', '.join(API_NAMES)}, not {api!r}")
        reason = insecure_reason(endpoint, allow_insecure)
        if reason is not None:
            raise EndpointError(reason)
        return cls(parse_base_url(endpoint), api, model, api_key_env, ca_bundle, allow_insecure)

    @classmethod
    def from_settings(cls, settings: object) -> EndpointConfig | None:
        """From a ``config.Settings``; None when no endpoint is set (the local engine)."""
        endpoint = getattr(settings, "endpoint", None)
        if endpoint is None:
            return None
        return cls.create(
            endpoint,
            settings.endpoint_api,
            settings.endpoint_model,  # type: ignore[attr-defined]
            settings.api_key_env,
            settings.ca_bundle,  # type: ignore[attr-defined]
            settings.allow_insecure_endpoint,
        )  # type: ignore[attr-defined]

    def api_key(self) -> str | None:
        """The bearer token, read now (a rotated key takes effect at the next request)."""
        if not self.api_key_env:
            return None
        return os.environ.get(self.api_key_env) or None
