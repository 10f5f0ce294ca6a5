"""Shape-true replicas (``benchmarks.replicas``): the tiny Qwen2.5-Coder replica made end to end by
llama.cpp's own converter and ``llama-quantize``, its GGUFs read back, and the rebuilt tokenizer
checked token for token against ``llama-server``'s ``/tokenize`` on the same file.

The llama.cpp tools are the cached build of ``benchmarks.llama_server`` (``.ci/run`` builds both
``llama-server`` and ``llama-quantize`` before the tests); a machine that has only an older cached
``llama-server`` builds ``llama-quantize`` here, and one without cmake or a C++ compiler skips.
The replica itself is cached by ``benchmarks.replicas`` too, so only a first run pays for it.
"""

from __future__ import annotations

import json
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks import llama_server, replicas

THREADS = 1  # two shared cores: see tests/support/llama_server.py

# What the tokenizer check covers: code (indentation, tabs, CRLF, digits one at a time, operators),
# text in other scripts and emoji (byte-level pieces of multi-byte characters), and the added tokens
# in the layouts a completion prompt uses them (FIM and repository level).
TEXTS = (
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n"
    "    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "for (let i = 0; i < 10000; i++) {\r\n\tconsole.log(`${i}`);\r\n}\r\n",
    "x = 3.14159 + 271828 ** 2  # comment with    spaces\n\n\n   \t\n",
    "naïve café, 我想在apple工作1314151天～, нещо на Български, 🦙🦙 🚀 😶\u200d🌫️ ✅ كود",
    "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n\nprint(add(1, 2))<|fim_middle|>",
    "<|repo_name|>my-project\n<|file_sep|>src/util.py\nimport os\n<|file_sep|>src/main.py\n",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<tool_call>{}</tool_call><|endoftext|>",
    "I've been 'told he's there, 'RE you sure? We'Ve a'lL ------======= ......!!!!!!",
)


def tools_or_skip() -> None:
    """llama-quantize and llama-server, built here if missing; a skip where they cannot be built."""
    try:
        llama_server.llama_quantize_binary(build=False)
        llama_server.llama_server_binary(build=False)
        return
    except llama_server.LlamaServerError:
        pass
    if not (shutil.which("cmake") and any(shutil.which(c) for c in ("c++", "g++", "clang++"))):
        pytest.skip("llama.cpp is not built here and cannot be: apt-get install -y cmake build-essential")
    llama_server.llama_quantize_binary()  # beside a cached llama-server: see the module's docstring
    llama_server.llama_server_binary()


@pytest.fixture(scope="module")
def tiny() -> dict[str, Path]:
    tools_or_skip()
    return {qtype: replicas.replica(replicas.TINY, qtype) for qtype in ("Q4_K_M", "Q8_0")}


@pytest.fixture(scope="module")
def server(tiny: dict[str, Path]) -> Iterator[llama_server.LlamaServer]:
    with llama_server.LlamaServer(tiny["Q8_0"], threads=THREADS, context=512) as running:
        yield running


def test_the_converter_takes_the_tokenizer_as_qwen2_and_keeps_the_real_shapes(tiny: dict[str, Path]) -> None:
    shape = replicas.SHAPES[replicas.TINY]
    for path in tiny.values():
        meta = replicas.metadata(
            path,
            (
                "general.architecture",
                "tokenizer.ggml.model",
                "tokenizer.ggml.pre",
                "qwen2.block_count",
                "qwen2.embedding_length",
                "qwen2.feed_forward_length",
                "qwen2.attention.head_count",
                "qwen2.attention.head_count_kv",
                "qwen2.rope.freq_base",
                "qwen2.context_length",
                "tokenizer.ggml.eos_token_id",
                "tokenizer.ggml.add_bos_token",
            ),
        )
        assert meta["general.architecture"] == "qwen2"
        # the converter names a pre-tokenizer only when the hash of its fixed text's tokens is one it
        # knows: "qwen2" means the rebuilt tokenizer splits that text exactly as Qwen's own does
        assert meta["tokenizer.ggml.model"] == "gpt2"
        assert meta["tokenizer.ggml.pre"] == "qwen2"
        assert meta["qwen2.block_count"] == shape.layers
        assert meta["qwen2.embedding_length"] == shape.hidden
        assert meta["qwen2.feed_forward_length"] == shape.ffn
        assert meta["qwen2.attention.head_count"] == shape.heads
        assert meta["qwen2.attention.head_count_kv"] == shape.kv_heads
        assert meta["qwen2.rope.freq_base"] == shape.rope_theta
        assert meta["qwen2.context_length"] == shape.max_positions
        assert meta["tokenizer.ggml.eos_token_id"] == replicas.QWEN_BPE_RANKS  # <|endoftext|>
        assert meta["tokenizer.ggml.add_bos_token"] is False
        types = replicas.tensor_types(path)
        assert "output.weight" not in types  # tied: the output layer is the token embedding
        for layer in range(shape.layers):
            for bias in ("attn_q.bias", "attn_k.bias", "attn_v.bias"):
                assert types[f"blk.{layer}.{bias}"] == "F32"


def test_the_quantized_files_hold_the_types_llama_cpp_chose(tiny: dict[str, Path]) -> None:
    q8 = replicas.tensor_types(tiny["Q8_0"])
    for name, kind in q8.items():
        assert kind == ("F32" if name.endswith(("norm.weight", ".bias")) else "Q8_0"), name
    summary = replicas.type_summary(tiny["Q4_K_M"])
    print(json.dumps(summary, indent=1))  # what the README reports: pytest -s shows it
    kinds = {kind for counts in summary.values() for kind in counts}
    assert {"Q4_K", "Q6_K"} <= kinds  # the M mix: most matrices Q4_K, the sensitive ones Q6_K
    assert kinds == {"Q4_K", "Q6_K", "F32"}  # 256-wide rows: no fallback to 32-blocks
    assert summary["token_embd.weight"] == {"Q6_K": 1}  # tied: quantized as the output layer is
    for role in ("attn_q.weight", "attn_k.weight", "attn_output.weight", "ffn_gate.weight", "ffn_up.weight"):
        assert summary[role] == {"Q4_K": 2}, role
    # attn_v and ffn_down get Q6_K in the layers llama.cpp's use_more_bits picks: of two, the second
    assert summary["attn_v.weight"] == summary["ffn_down.weight"] == {"Q4_K": 1, "Q6_K": 1}
    assert tiny["Q4_K_M"].stat().st_size < tiny["Q8_0"].stat().st_size


def test_the_rebuilt_tokenizer_matches_llama_server_on_the_same_file(
    tiny: dict[str, Path], server: llama_server.LlamaServer
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(replicas.hf_replica(replicas.TINY))
    for offset, (content, _special) in enumerate(replicas.QWEN25_CODER_ADDED_TOKENS):
        assert tokenizer.convert_tokens_to_ids(content) == replicas.QWEN_BPE_RANKS + offset
    assert tokenizer.convert_tokens_to_ids("<|fim_prefix|>") == 151659
    assert tokenizer.convert_tokens_to_ids("<|file_sep|>") == 151664
    for text in TEXTS:
        ours = tokenizer.encode(text, add_special_tokens=False)
        theirs = tokenize(server, text)
        assert ours == theirs, text
        assert tokenizer.decode(ours) == text


def test_a_qwen_gguf_tokenizes_as_llama_server_when_first_loaded_and_from_the_cache(
    tiny: dict[str, Path], server: llama_server.LlamaServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first load builds the tokenizer from the GGUF through transformers and caches it; later
    loads read the cache on ``tokenizers`` alone. Both tokenize as llama-server does, decomposed
    accents included: transformers' Qwen2Tokenizer class would rebuild its pipeline with an NFC
    normalizer that neither the file nor llama.cpp has (``save_plain``)."""
    from speculative_complete.decoding.models.loading import load_model
    from speculative_complete.decoding.models.tokenizer import LeanTokenizer

    monkeypatch.setenv("DECODING_CACHE_DIR", str(tmp_path))
    first = load_model(str(tiny["Q8_0"])).tokenizer
    again = load_model(str(tiny["Q8_0"])).tokenizer
    assert isinstance(again, LeanTokenizer) and not isinstance(first, LeanTokenizer)
    for text in (*TEXTS, "cafe\u0301 A\u030a \u212b \ufb01"):
        theirs = tokenize(server, text)
        assert first.encode(text, add_special_tokens=False) == theirs, text
        assert again.encode(text, add_special_tokens=False) == theirs, text
        assert first.decode(theirs) == again.decode(theirs) == text


def test_the_replica_is_a_working_transformers_model() -> None:
    """The safetensors folder loads in transformers without remote code and gives finite logits."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = replicas.hf_replica(replicas.TINY)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    shape = replicas.SHAPES[replicas.TINY]
    assert model.config.model_type == "qwen2" and model.config.vocab_size == shape.vocab
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied
    assert model.model.layers[0].self_attn.q_proj.bias is not None
    with torch.no_grad():
        logits = model(torch.tensor([[151659, 750, 282, 2075, 1648, 151661, 151660]])).logits
    assert torch.isfinite(logits).all()
    assert 0.01 < float(model.model.layers[1].mlp.down_proj.weight.detach().float().std()) < 0.03


def tokenize(server: llama_server.LlamaServer, text: str) -> list[int]:
    body = json.dumps({"content": text, "add_special": False, "parse_special": True}).encode()
    request = urllib.request.Request(
        f"{server.url}/tokenize", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())["tokens"]


def test_each_llama_cpp_build_variant_is_cached_apart(tmp_path, monkeypatch):
    """The AVX2-only llama-server (the same-ISA peer of ``models_bench --isa avx2``) is a build of
    its own: its folder, its options, and a message that says how to make it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("LLAMA_SERVER_BIN", raising=False)
    native, avx2 = llama_server.cache_dir(), llama_server.cache_dir(variant="avx2")
    assert avx2 != native and avx2.name == f"{native.name}-avx2"
    assert "-DGGML_NATIVE=OFF" in llama_server.VARIANTS["avx2"]
    assert not any("AVX512" in option for option in llama_server.VARIANTS["avx2"])
    with pytest.raises(llama_server.LlamaServerError, match="--variant avx2"):
        llama_server.llama_server_binary(build=False, variant="avx2")
    with pytest.raises(llama_server.LlamaServerError, match="unknown variant"):
        llama_server.build_llama_cpp([llama_server.SERVER], variant="avx512")


def test_a_k_quant_file_goes_to_a_gpu_as_its_own_4bit_blocks(tiny: dict[str, Path]) -> None:
    """What a GPU loads for a Q4_K_M file (``from_gguf_on_device`` in bf16; eager here on the
    CPU, on the CPU's variant of the 4-bit kernel): Q4_K tensors as 4-bit groups of 32 with their
    sub-blocks' scales and mins, Q6_K ones (and a q/k/v whose v is Q6_K) dense; Qwen2's biases and
    rotate-half rows as the lean forward has them. Its logits are the lean forward's on the same
    file up to bf16, and so is its fingerprint (a head trained for the file finds it)."""
    import random

    import torch

    from speculative_complete.decoding.forward.gguf_loader import from_gguf
    from speculative_complete.decoding.forward.graphed import from_gguf_on_device
    from speculative_complete.decoding.forward.graphed_weights import DenseProduct, Int4Product

    path = str(tiny["Q4_K_M"])
    graphed = from_gguf_on_device(path, torch.device("cpu"), torch.bfloat16, capacity=256)
    first, second = graphed.weights.layers
    assert isinstance(first.down, Int4Product) and isinstance(second.down, DenseProduct)
    assert isinstance(first.qkv, Int4Product) and isinstance(second.qkv, DenseProduct)
    assert all(isinstance(layer.gate_up, Int4Product) for layer in (first, second))
    assert first.qkv_bias is not None and isinstance(graphed.weights.output, DenseProduct)
    lean = from_gguf(path)
    assert graphed.fingerprint == lean.fingerprint
    rng = random.Random(0)
    tokens = [rng.randrange(200, 30000) for _ in range(100)]
    want = lean(tokens, lean.new_cache())
    got = graphed(tokens, graphed.new_cache())
    similar = torch.nn.functional.cosine_similarity(got, want, dim=-1)
    assert similar.min().item() > 0.99, similar.min()
