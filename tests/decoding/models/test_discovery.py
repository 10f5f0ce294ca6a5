"""Models the user already has: Ollama names, LM Studio / llama.cpp / hub-cache GGUF files, and
``lsp_server --list-models``, on fake stores under ``tmp_path`` holding real (tiny) GGUF files."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType, quants

from speculative_complete.decoding.models import discovery
from speculative_complete.decoding.models.discovery import ModelNotFound, gguf_facts, resolve_model_spec
from speculative_complete.decoding.models.loading import default_gguf_path, load_model

REPO = Path(__file__).resolve().parents[3]
ENV_KEYS = (
    "OLLAMA_MODELS",
    "LLAMA_CACHE",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "HF_HOME",
    "XDG_CACHE_HOME",
    "DECODING_CACHE_DIR",
)
LAYER = (
    "attn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
)


def write_tiny_gguf(path: Path, arch: str = "llama", seed: int = 0) -> Path:
    """A real GGUF of two layers (dim 32, vocabulary 64): its embedding in Q8_0, the rest F32.
    ``seed`` changes the weights, so two files differ (Ollama names blobs by their sha256)."""
    rng = np.random.default_rng(seed)
    dim, ffn, vocab = 32, 64, 64
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(2)
    writer.add_context_length(128)
    writer.add_embedding_length(dim)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(LlamaFileType.MOSTLY_Q8_0)
    embedding = rng.standard_normal((vocab, dim), dtype=np.float32)
    writer.add_tensor(
        "token_embd.weight",
        quants.quantize(embedding, GGMLQuantizationType.Q8_0),
        raw_dtype=GGMLQuantizationType.Q8_0,
    )
    writer.add_tensor("output_norm.weight", np.ones(dim, dtype=np.float32))
    shapes = {
        "attn_k": (dim // 2, dim),
        "attn_v": (dim // 2, dim),
        "ffn_gate": (ffn, dim),
        "ffn_up": (ffn, dim),
    }
    shapes |= {"ffn_down": (dim, ffn), "attn_norm": (dim,), "ffn_norm": (dim,)}
    for i in range(2):
        for name in LAYER:
            writer.add_tensor(
                f"blk.{i}.{name}.weight", rng.standard_normal(shapes.get(name, (dim, dim)), dtype=np.float32)
            )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def digest_of(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def put_blob(store: Path, source: Path) -> str:
    """``source`` as Ollama keeps it: ``blobs/sha256-<hex>``, named by its content."""
    digest = digest_of(source)
    blob = store / "blobs" / digest.replace(":", "-")
    blob.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, blob)
    return digest


def ollama_manifest(
    store: Path, parts: tuple[str, str, str, str], source: Path, base: str = "manifests"
) -> Path:
    """A manifest as ``ollama pull`` writes it (config, weights, template layers), for
    ``host/namespace/model/tag`` = ``parts``; returns the weights' blob."""
    weights = put_blob(store, source)
    template = store / "template.txt"
    template.write_text("{{ .Prompt }}")
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {
            "mediaType": "application/vnd.docker.container.image.v1+json",
            "digest": "sha256:" + "0" * 64,
        },
        "layers": [
            {
                "mediaType": "application/vnd.ollama.image.model",
                "digest": weights,
                "size": source.stat().st_size,
            },
            {
                "mediaType": "application/vnd.ollama.image.template",
                "digest": put_blob(store, template),
                "size": 13,
            },
        ],
    }
    path = store.joinpath(base, *parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return store / "blobs" / weights.replace(":", "-")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty home directory, and no variable or system folder that points elsewhere."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for key in ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(discovery, "OLLAMA_SYSTEM_ROOTS", ())
    return home


@pytest.fixture
def ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("ggufs")
    return {
        "llama": write_tiny_gguf(folder / "llama-a.gguf", seed=1),
        "llama-b": write_tiny_gguf(folder / "llama-b.gguf", seed=2),
        "mamba": write_tiny_gguf(folder / "mamba.gguf", arch="mamba", seed=3),
    }


def library(name: str, tag: str) -> tuple[str, str, str, str]:
    return ("registry.ollama.ai", "library", name, tag)


def test_an_ollama_name_resolves_to_its_weights_blob_tag_latest_by_default(home, ggufs):
    store = home / ".ollama" / "models"
    latest = ollama_manifest(store, library("qwen2.5-coder", "latest"), ggufs["llama"])
    small = ollama_manifest(store, library("qwen2.5-coder", "1.5b"), ggufs["llama-b"])
    assert latest != small
    assert resolve_model_spec("ollama:qwen2.5-coder") == latest
    assert resolve_model_spec("ollama:qwen2.5-coder:1.5b") == small
    assert resolve_model_spec("ollama:Qwen2.5-Coder:1.5B") == small  # Ollama's names ignore case


def test_other_namespaces_and_hosts_resolve_through_their_own_folders(home, ggufs, monkeypatch):
    store = home / "elsewhere"
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    from_hf = ollama_manifest(store, ("hf.co", "bartowski", "Qwen2.5-Coder-GGUF", "Q4_K_M"), ggufs["llama"])
    from_user = ollama_manifest(store, ("registry.ollama.ai", "someone", "coder", "latest"), ggufs["llama-b"])
    assert resolve_model_spec("ollama:hf.co/bartowski/Qwen2.5-Coder-GGUF:Q4_K_M") == from_hf
    assert resolve_model_spec("ollama:someone/coder") == from_user


def test_a_missing_tag_names_the_tags_that_exist(home, ggufs):
    store = home / ".ollama" / "models"
    ollama_manifest(store, library("qwen2.5-coder", "latest"), ggufs["llama"])
    ollama_manifest(store, library("qwen2.5-coder", "1.5b"), ggufs["llama-b"])
    with pytest.raises(ModelNotFound) as error:
        resolve_model_spec("ollama:qwen2.5-coder:7b")
    message = str(error.value)
    assert "no tag '7b' of qwen2.5-coder" in message
    assert "tags here: 1.5b, latest" in message


def test_a_missing_model_names_the_models_that_exist(home, ggufs):
    ollama_manifest(home / ".ollama" / "models", library("qwen2.5-coder", "1.5b"), ggufs["llama"])
    with pytest.raises(
        ModelNotFound, match=r"no model 'starcoder2' here \(models here: qwen2.5-coder:1.5b\)"
    ):
        resolve_model_spec("ollama:starcoder2:3b")


def test_without_ollama_the_error_says_where_it_looked(home, tmp_path, monkeypatch):
    with pytest.raises(ModelNotFound, match="model store was not found") as error:
        resolve_model_spec("ollama:qwen2.5-coder")
    assert str(home / ".ollama" / "models") in str(error.value)
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "nowhere"))
    with pytest.raises(ModelNotFound, match="OLLAMA_MODELS") as error:
        load_model("ollama:qwen2.5-coder", device="cpu")
    assert str(tmp_path / "nowhere") in str(error.value)


def test_a_missing_blob_is_reported_with_the_pull_that_completes_it(home, ggufs):
    blob = ollama_manifest(home / ".ollama" / "models", library("coder", "1b"), ggufs["llama"])
    blob.unlink()
    with pytest.raises(ModelNotFound, match=r"weights for coder:1b are missing .*`ollama pull coder:1b`"):
        resolve_model_spec("ollama:coder:1b")


def test_a_v2_manifest_list_resolves_to_its_gguf_child(home, ggufs):
    """Newer Ollama links manifests-v2/ollama.com/... to a blob holding a manifest list; its GGUF
    child may be a reference to another blob."""
    store = home / ".ollama" / "models"
    child = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "layers": [
            {"mediaType": "application/vnd.ollama.image.model", "digest": put_blob(store, ggufs["llama"])}
        ],
    }
    child_file = store / "child.json"
    child_file.write_text(json.dumps(child))
    listing = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.ollama.manifest.list.v2+json",
        "manifests": [
            {"mediaType": child["mediaType"], "runner": "mlx", "format": "safetensors", "layers": [{"x": 1}]},
            {
                "mediaType": child["mediaType"],
                "digest": put_blob(store, child_file),
                "runner": "ollama",
                "format": "gguf",
            },
        ],
    }
    listing_file = store / "list.json"
    listing_file.write_text(json.dumps(listing))
    link = store / "manifests-v2" / "ollama.com" / "library" / "coder" / "latest"
    link.parent.mkdir(parents=True)
    link.symlink_to(store / "blobs" / put_blob(store, listing_file).replace(":", "-"))
    assert resolve_model_spec("ollama:coder") == store / "blobs" / digest_of(ggufs["llama"]).replace(":", "-")
    assert [m.name for m in discovery.list_ollama()] == ["ollama:coder:latest"]


def lmstudio_llamacpp_hub(home: Path, ggufs: dict[str, Path]) -> dict[str, Path]:
    """One file in each of LM Studio's folder, llama.cpp's flat cache and the hub cache (the
    last two under the same repo file name, to make a bare name ambiguous)."""
    lmstudio = (
        home / ".lmstudio" / "models" / "lmstudio-community" / "Qwen2.5-Coder-GGUF" / "coder-Q4_K_M.gguf"
    )
    llamacpp = home / ".cache" / "llama.cpp" / "ggml-org_Coder-GGUF_coder-q8_0.gguf"
    repo = home / ".cache" / "huggingface" / "hub" / "models--ggml-org--Coder-GGUF"
    hub = repo / "snapshots" / ("c" * 40) / "coder-q8_0.gguf"
    for target, source in ((lmstudio, "llama"), (llamacpp, "llama-b"), (hub, "mamba")):
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ggufs[source], target)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("c" * 40)
    return {"lmstudio": lmstudio, "llama.cpp": llamacpp, "hub": hub}


def test_lmstudio_llamacpp_and_hub_files_answer_to_their_names_and_short_forms(home, ggufs):
    files = lmstudio_llamacpp_hub(home, ggufs)
    found = {m.name: m.path for m in discovery.discover()}
    assert found == {
        "lmstudio:lmstudio-community/Qwen2.5-Coder-GGUF/coder-Q4_K_M.gguf": files["lmstudio"],
        "llama.cpp:ggml-org_Coder-GGUF_coder-q8_0.gguf": files["llama.cpp"],
        "hf:ggml-org/Coder-GGUF/coder-q8_0.gguf": files["hub"],
    }
    for name, path in found.items():
        assert resolve_model_spec(name) == path
    assert resolve_model_spec("lmstudio:lmstudio-community/Qwen2.5-Coder-GGUF") == files["lmstudio"]
    assert (
        resolve_model_spec("llama.cpp:ggml-org/Coder-GGUF:Q8_0") == files["llama.cpp"]
    )  # llama.cpp's -hf form
    assert resolve_model_spec("hf:ggml-org/Coder-GGUF") == files["hub"]
    assert resolve_model_spec("coder-Q4_K_M.gguf") == files["lmstudio"]  # a bare name, unique
    with pytest.raises(ModelNotFound, match=r"is the name of 2 files; choose one: llama\.cpp:.*, hf:"):
        resolve_model_spec("coder-q8_0.gguf")
    with pytest.raises(ModelNotFound, match=r"hf:ggml-org/Coder-GGUF:Q2_K was not found; there are: hf:"):
        resolve_model_spec("hf:ggml-org/Coder-GGUF:Q2_K")


def test_other_specs_are_left_as_they_were(home, tmp_path):
    assert resolve_model_spec("Qwen/Qwen2.5-Coder-0.5B") == Path("Qwen/Qwen2.5-Coder-0.5B")  # a hub id
    folder = tmp_path / "ollama:odd-but-real"
    folder.mkdir()
    assert resolve_model_spec(str(folder)) == folder  # an existing path wins over any prefix
    with pytest.raises(ModelNotFound, match=r"model file not found: gone\.gguf"):
        resolve_model_spec("gone.gguf")


def test_the_fast_path_is_the_lean_forwards_own_answer(ggufs):
    llama, mamba = gguf_facts(ggufs["llama"]), gguf_facts(ggufs["mamba"])
    assert (llama.architecture, llama.file_type, llama.tensor_types) == ("llama", "Q8_0", ("F32", "Q8_0"))
    assert llama.fast and llama.reason == ""
    assert mamba.architecture == "mamba" and not mamba.fast
    assert "architecture 'mamba'" in mamba.reason
    assert not gguf_facts(ggufs["llama"].with_suffix(".missing")).fast


@pytest.mark.real_model
def test_load_model_reads_an_ollama_blob_like_the_file_it_is(home, tmp_path, monkeypatch, default_model):
    """A real load of the default model's GGUF through a fake Ollama manifest: its blob has no
    .gguf suffix and a fresh cache makes transformers read config and tokenizer from it."""
    monkeypatch.setenv("DECODING_CACHE_DIR", str(tmp_path / "cache"))
    blob = ollama_manifest(home / ".ollama" / "models", library("smollm2", "135m"), default_gguf_path())
    loaded = load_model("ollama:smollm2:135m", device="cpu", dtype="float32")
    assert loaded.source == str(blob)
    assert loaded.model is None and loaded.quantization == default_model.quantization  # the lean forward
    tokens = default_model.tokenizer.encode("def add(a, b):\n    return")
    assert loaded.tokenizer.encode("def add(a, b):\n    return") == tokens
    got = loaded.forward(tokens, loaded.forward.new_cache())
    want = default_model.forward(tokens, default_model.forward.new_cache())
    assert torch.equal(got, want)


def list_models(env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ENV_KEYS}
    return subprocess.run(
        [sys.executable, "-m", "speculative_complete.lsp_server", "--list-models"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=clean | env,
    )


def test_list_models_prints_each_model_and_whether_it_runs_on_the_fast_path(tmp_path, ggufs):
    home, store = tmp_path / "home", tmp_path / "ollama"
    blob = ollama_manifest(store, library("qwen2.5-coder", "1.5b"), ggufs["llama"])
    lmstudio = home / ".lmstudio" / "models" / "someone" / "Mamba-GGUF" / "mamba-Q8_0.gguf"
    lmstudio.parent.mkdir(parents=True)
    shutil.copyfile(ggufs["mamba"], lmstudio)
    done = list_models({"HOME": str(home), "OLLAMA_MODELS": str(store)})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["SOURCE", "MODEL", "FILE", "SIZE", "ARCH", "QUANTIZATION", "FAST", "PATH"]
    rows = {line.split()[1]: line for line in lines[1:-1]}
    assert set(rows) == {
        "default",
        "ollama:qwen2.5-coder:1.5b",
        "lmstudio:someone/Mamba-GGUF/mamba-Q8_0.gguf",
    }
    ollama = rows["ollama:qwen2.5-coder:1.5b"]
    assert ollama.split()[:3] == ["ollama", "ollama:qwen2.5-coder:1.5b", str(blob)]
    assert "llama" in ollama and "Q8_0 (F32,Q8_0)" in ollama and ollama.endswith("yes (lean forward)")
    mamba = rows["lmstudio:someone/Mamba-GGUF/mamba-Q8_0.gguf"]
    assert str(lmstudio) in mamba and "mamba" in mamba
    assert "no: architecture 'mamba'" in mamba and mamba.endswith("runs transformers' forward")
    assert lines[-1] == "Use a MODEL as the `model` setting or --model."


def test_list_models_says_so_when_it_finds_nothing(tmp_path):
    empty = tmp_path / "empty-ollama"
    empty.mkdir()
    done = list_models({"HOME": str(tmp_path / "home"), "OLLAMA_MODELS": str(empty)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].startswith(
        f"No Ollama, LM Studio, llama.cpp or Hugging Face cache models found (looked in {empty}, "
    )
    assert "Traceback" not in done.stderr
