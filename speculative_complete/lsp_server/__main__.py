"""``lsp_server [--stdio | --tcp HOST:PORT] [--model M] ...``: start the completion server.

Under ``--stdio`` (the default) stdout is the LSP channel, so the process keeps a private copy of
it and points file descriptor 1 at stderr: a stray ``print`` or a native library's message can
never corrupt the protocol. ``--tcp`` serves one client and exits when it disconnects. Either
way the process ends with ``os._exit`` once the connection is over, because threads that can't
be interrupted (a decode step, a model load still reading weights) must not keep it alive or
crash in interpreter teardown.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from speculative_complete.lsp_server import __version__
from speculative_complete.lsp_server.config import DRAFTER_NAMES, Layered, SettingError, from_cli, validate
from speculative_complete.lsp_server.endpoint import API_NAMES, insecure_reason
from speculative_complete.lsp_server.request_log import LOG_FORMAT, RequestIdFilter

if TYPE_CHECKING:
    from speculative_complete.lsp_server.server import CompletionServer

log = logging.getLogger("speculative_complete.lsp_server")
M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)
REMOTE_FLAGS = (
    "endpoint",
    "endpoint_api",
    "endpoint_model",
    "api_key_env",
    "ca_bundle",
    "allow_insecure_endpoint",
)
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
QUIET_LIBRARIES = (
    "pygls",
    "transformers",
    "huggingface_hub",
    "urllib3",
    "filelock",
    "asyncio",
    "httpx2",
    "httpcore2",
)  # the remote engine's client logs every request at INFO


def host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (port 0-65535), got {value!r}")
    return host.strip("[]"), int(port)


def setting(name: str):
    """An argparse type that checks a value the way the setting ``name`` is checked."""

    def check(value: str) -> str:
        try:
            return validate(name, value)
        except SettingError as exc:
            raise argparse.ArgumentTypeError(f"{value!r}: {exc}") from None

    return check


def _remote_arguments(parser: argparse.ArgumentParser) -> None:
    """The remote engine's flags, in a group of their own."""
    remote = parser.add_argument_group("remote engine (nothing reaches the network without --endpoint)")
    remote.add_argument(
        "--endpoint",
        type=setting("endpoint"),
        help="decode on this inference server, e.g. http://127.0.0.1:8080 or https://gpu-box:8000/v1",
    )
    remote.add_argument(
        "--endpoint-api",
        choices=API_NAMES,
        help="openai (/v1/completions: vLLM, TGI, llama.cpp, Ollama) or llama.cpp "
        "(/completion, /infill); default openai",
    )
    remote.add_argument(
        "--endpoint-model", type=setting("endpoint_model"), help="the model name the server expects"
    )
    remote.add_argument(
        "--api-key-env",
        type=setting("api_key_env"),
        help="the NAME of an environment variable holding the bearer token",
    )
    remote.add_argument("--ca-bundle", type=setting("ca_bundle"), help="a PEM file of extra CA certificates")
    remote.add_argument(
        "--allow-insecure-endpoint",
        action="store_true",
        default=None,
        help="allow plain http:// to a host other than loopback",
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="lsp_server",
        description="Whole-line code completion over LSP, decoded with speculative decoding.",
    )
    transport = parser.add_mutually_exclusive_group()
    transport.add_argument("--stdio", action="store_true", help="talk LSP over stdin/stdout (the default)")
    transport.add_argument(
        "--tcp",
        metavar="HOST:PORT",
        type=host_port,
        help="listen on HOST:PORT for one client (port 0 picks a free port; it is logged)",
    )
    parser.add_argument(
        "--model",
        type=setting("model"),
        help="folder, .gguf file, cached hub id, 'default' (the embedded SmolLM2), an Ollama model "
        "(ollama:qwen2.5-coder:1.5b) or a GGUF that LM Studio or llama.cpp keeps (see --list-models)",
    )
    parser.add_argument(
        "--list-models",
        action="store_true",
        help="print the GGUF models found on this machine (Ollama, LM Studio, llama.cpp, the Hugging Face "
        "cache), the name to use as --model and whether each runs on the fast path, then exit",
    )
    parser.add_argument(
        "--draft-model", type=setting("draft_model"), help="a draft model sharing the target's vocabulary"
    )
    parser.add_argument("--drafter", choices=DRAFTER_NAMES, help="draft source (default: auto)")
    parser.add_argument(
        "--draft-head",
        type=setting("draft_head"),
        help="auto (the head shipped for the model), none, or a draft head's folder or hub id",
    )
    parser.add_argument(
        "--device", type=setting("device"), help="auto, cpu, cuda, cuda:N, mps (default: auto)"
    )
    parser.add_argument(
        "--dtype", type=setting("dtype"), help="auto, float32, float16, bfloat16 (default: auto)"
    )
    parser.add_argument(
        "--quantization",
        type=setting("quantization"),
        help="auto (a GGUF keeps its quantized weights on the CPU), none, int8, int4",
    )
    _remote_arguments(parser)
    parser.add_argument("--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS)
    parser.add_argument("--log-file", help="append logs to this file instead of stderr")
    parser.add_argument("--version", action="version", version=f"lsp_server {__version__}")
    args = parser.parse_args(argv)
    if args.drafter == "model" and not args.draft_model:
        parser.error("--drafter model needs --draft-model")
    reason = insecure_reason(args.endpoint, bool(args.allow_insecure_endpoint))
    if reason is not None:
        parser.error(f"--endpoint {args.endpoint}: {reason}")
    return args


def setup_logging(level_name: str, log_file: str | None) -> None:
    handler: logging.Handler = (
        logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    )
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.addFilter(RequestIdFilter())  # the request a line was logged for, if any
    root = logging.getLogger()
    root.handlers[:] = [handler]
    level = getattr(logging, level_name)
    root.setLevel(level)
    for name in QUIET_LIBRARIES:  # pygls alone logs every message body at INFO
        logging.getLogger(name).setLevel(max(level, logging.WARNING))


def offline_environment() -> None:
    """Read before huggingface_hub and transformers are imported, so set first."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download: models come from disk or the cache
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def one_malloc_arena() -> None:
    """One glibc malloc arena for every thread, set before any thread starts.

    By default each thread that allocates (the loader, the decode worker, the event loop) gets an
    arena of its own, and the model's load leaves two of them partly used for good; with one
    arena a ready server is smaller at the same decode step (the threads rarely allocate at once;
    figures: ``benchmarks/README.md``). No library sets this;
    ``MALLOC_ARENA_MAX`` in the environment wins, and it is a no-op off glibc."""
    if "MALLOC_ARENA_MAX" in os.environ or not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(M_ARENA_MAX, 1)


def serve_stdio(server: CompletionServer) -> None:
    from speculative_complete.lsp_server.protocol import Utf8RepairingStdin

    channel = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    server.start_io(stdin=Utf8RepairingStdin(sys.stdin.buffer), stdout=channel)


def serve_tcp(server: CompletionServer, host: str, port: int) -> None:
    from pygls.io_ import run_async

    from speculative_complete.lsp_server.protocol import Utf8RepairingReader, stop_with

    stop = threading.Event()
    stop_with(server, stop)

    async def serve() -> None:
        finished = asyncio.Event()
        taken = False

        async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal taken
            if taken:  # one editor per server process, like --stdio
                writer.close()
                return
            taken = True
            log.info("client connected from %s", writer.get_extra_info("peername"))
            server.protocol.set_writer(writer)
            try:
                await run_async(
                    stop_event=stop,
                    reader=Utf8RepairingReader(reader),
                    protocol=server.protocol,
                    logger=logging.getLogger("pygls.io_"),
                    error_handler=server.report_server_error,
                )
            finally:
                finished.set()

        listener = await asyncio.start_server(on_client, host, port)
        for sock in listener.sockets:  # on stderr whatever the log level: a client may need the port
            print(
                f"lsp_server: listening on {sock.getsockname()[0]}:{sock.getsockname()[1]}",
                file=sys.stderr,
                flush=True,
            )
        async with listener:
            await finished.wait()

    asyncio.run(serve())


def list_models() -> int:
    """``--list-models``: the models found on disk, one line each as its GGUF header is read (the
    only output this program writes to stdout outside LSP). Nothing is downloaded or loaded."""
    from speculative_complete.decoding.models.discovery import listing_lines

    for line in listing_lines():
        print(line, flush=True)
    return 0


def main(
    argv: list[str] | None = None, make_server: Callable[[Layered], CompletionServer] | None = None
) -> int:
    """Serve until the connection ends, then end the process; returns only on a command-line error
    or after ``--list-models``. ``make_server`` (default ``create_server``): a test's own server,
    e.g. the soak's with a decode that fails (``benchmarks/soak_server.py``)."""
    args = parse_args(argv)
    if args.list_models:
        setup_logging(args.log_level, args.log_file)
        offline_environment()
        return list_models()
    cli = from_cli(
        model=args.model,
        draft_model=args.draft_model,
        drafter=args.drafter,
        draft_head=args.draft_head,
        device=args.device,
        dtype=args.dtype,
        quantization=args.quantization,
        **{name: getattr(args, name) for name in REMOTE_FLAGS if getattr(args, name) is not None},
    )
    if cli.problems:  # parse_args checked every value already; this is a safety net
        print(f"lsp_server: error: {'; '.join(cli.problems)}", file=sys.stderr)
        return 2
    setup_logging(args.log_level, args.log_file)
    offline_environment()
    one_malloc_arena()
    # Importing torch takes seconds: the server starts it at 'initialize', once it knows the
    # settings (a remote endpoint never imports it), so the model load after 'initialized' is shorter.
    if make_server is None:
        from speculative_complete.lsp_server.server import create_server

        make_server = create_server
    server = make_server(cli)
    log.info(
        "lsp_server %s starting (%s), model %s",
        __version__,
        f"tcp {args.tcp[0]}:{args.tcp[1]}" if args.tcp else "stdio",
        cli.settings.model,
    )
    try:
        if args.tcp:
            serve_tcp(server, *args.tcp)
        else:
            serve_stdio(server)
    except (SystemExit, KeyboardInterrupt):  # pygls ends the loop with sys.exit on 'exit'
        pass
    except Exception:
        log.exception("the server stopped on an unexpected error")
        server.exit_code = 1
    finally:
        server.shutdown()
    code = server.exit_code if server.exit_code is not None else 0
    log.info("exiting with code %d", code)
    logging.shutdown()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
