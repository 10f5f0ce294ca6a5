"""The embedded SmolLM2 model: speculative greedy output equals plain greedy on real code, on its
quantized weights (the default) and dequantized to fp32."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
import torch

from speculative_complete.decoding.drafters import load_head_drafter, make_drafter
from speculative_complete.decoding.engine.loop import GenerationConfig, SpeculativeEngine
from speculative_complete.decoding.forward.llama import LlamaForward
from speculative_complete.decoding.models.loading import ModelLoadError, check_draft_compatible, load_model
from tests.support.stdlib_prompts import STDLIB, stdlib_prompts

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def bf16_draft(default_model):
    draft = load_model("default", device="cpu", dtype="bfloat16", quantization="none")
    check_draft_compatible(default_model, draft)
    return draft


@pytest.mark.parametrize("weights", ["quantized", "fp32"])
def test_every_drafter_reproduces_plain_greedy_on_20_real_code_prompts(
    weights, default_model, fp32_model, bf16_draft
):
    target = default_model if weights == "quantized" else fp32_model
    assert target.model is None  # both on the lean forward
    engine = SpeculativeEngine(target)
    # The shipped head, for the dequantized model too: same shape, norm and output rows.
    head = load_head_drafter(target, "auto", cost=engine.cost)
    assert head is not None
    drafters = {
        name: make_drafter(name, draft_model=bf16_draft, draft_head=head, cost=engine.cost)
        for name in ("ngram", "model", "auto")
    }
    if head is not None:
        drafters["head"] = make_drafter("head", draft_head=head, cost=engine.cost)
    config = GenerationConfig(max_new_tokens=20, stop_at_newline=True)
    drafted = dict.fromkeys(drafters, 0)
    for prompt in stdlib_prompts(20):
        ids = engine.encode(prompt)
        plain = engine.generate(ids, config)
        assert plain.stats.tokens_per_pass == 1.0
        for name, drafter in drafters.items():
            result = engine.generate(ids, config, drafter)
            assert result.token_ids == plain.token_ids, f"{name} differs on {prompt[-60:]!r}"
            assert result.text == plain.text
            drafted[name] += sum(s.proposed for s in result.stats.drafters.values())
    assert drafted["ngram"] > 0 and drafted["model"] > 0 and drafted.get("head", 1) > 0


def test_ngram_gets_several_tokens_per_pass_where_the_code_repeats(default_model):
    engine = SpeculativeEngine(default_model)
    source = (STDLIB / "shlex.py").read_text()
    chunk = source[source.index("    def read_token(self):") :][:1200]
    prompt = chunk + "\n\n# the same code again\n" + chunk[:600]
    ids = engine.encode(prompt)
    config = GenerationConfig(max_new_tokens=40)
    plain = engine.generate(ids, config)
    for name in ("ngram", "auto"):
        result = engine.generate(ids, config, make_drafter(name, cost=engine.cost))
        assert result.token_ids == plain.token_ids
        assert result.stats.tokens_per_pass > 2.0, result.stats.to_dict()
        assert result.stats.target_passes < plain.stats.target_passes / 2
        # the draft that rides on the prefill was kept: the prefill alone yielded several tokens
        assert result.stats.prefill_tokens > 1
        tokens, passes = result.stats.after_prefill
        assert tokens / passes > 2.0 and passes == result.stats.target_passes - 1


def test_edge_prompts_on_the_real_model(default_model):
    engine = SpeculativeEngine(default_model)
    empty = engine.generate_text("", GenerationConfig(max_new_tokens=4), make_drafter("auto"))
    assert empty.stats.new_tokens <= 4 and empty.stop_reason in {"max_tokens", "eos"}
    huge = "x = 1\n" * 6000  # ~12k tokens, beyond the 8192-token context
    config = GenerationConfig(max_new_tokens=4)
    result = engine.generate_text(huge, config, make_drafter("auto"))
    assert result.stats.trimmed_tokens > 0
    assert result.stats.prompt_tokens + 4 + config.max_draft_tokens + 1 == default_model.max_context


def test_mismatched_draft_model_is_refused(default_model):
    from tests.support.tiny_models import loaded, tiny_model

    with pytest.raises(ModelLoadError, match="vocabulary"):
        check_draft_compatible(default_model, loaded(tiny_model(0)))


def test_cli_batch_prints_one_json_object_per_prompt(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    lines = [{"id": "a", "prompt": "def add(a, b):\n    return"}, {"prompt": "import os\nimport"}]
    prompts.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "speculative_complete.decoding",
            "--prompts-jsonl",
            str(prompts),
            "--json",
            "--drafter",
            "auto",
            "--max-new-tokens",
            "8",
            "--stop-at-newline",
            "--device",
            "cpu",
            "--seed",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["id"] for r in records] == ["a", "1"]
    for record in records:
        assert set(record) >= {"id", "text", "token_ids", "stats"}
        assert "\n" not in record["text"] and len(record["token_ids"]) <= 8
        assert record["stats"]["target_passes"] >= 1
    assert records[0]["text"].strip() != ""


def test_cli_reports_bad_input_clearly(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt field"}\n')
    for args, message in [
        (["--prompt-file", str(tmp_path / "missing.txt")], "No such file"),
        (["--prompts-jsonl", str(bad)], "'prompt' field"),
        (["--prompt-file", str(bad), "--model", str(tmp_path / "no-model")], "not found"),
    ]:
        done = subprocess.run(
            [sys.executable, "-m", "speculative_complete.decoding", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 2 and message in done.stderr, done.stderr


def test_the_default_model_keeps_its_quantized_blocks(default_model, fp32_model):
    """``quantization: auto`` serves the GGUF's Q4_1/Q8_0 blocks; its greedy choices agree with the
    dequantized fp32 model's at nearly every position of real code (they differ only by the
    activations inside the quantized products: 8-bit blocks, as llama.cpp's, on the native
    kernels that serve the file where they are built; bf16 on torch's kernel elsewhere)."""
    assert default_model.quantization == "F32+Q4_1+Q8_0"
    assert default_model.forward.nbytes() < 150 * 2**20  # ~128 MB, against ~540 MB in fp32
    engine = SpeculativeEngine(default_model)
    ids = engine.encode((STDLIB / "textwrap.py").read_text()[:5000])[:400]
    quantized = default_model.forward(ids, default_model.forward.new_cache()).argmax(-1)
    dense = fp32_model.forward(ids, fp32_model.forward.new_cache()).argmax(-1)
    floor = 0.97 if default_model.forward.native is None else 0.95
    assert (quantized == dense).float().mean() > floor


@pytest.fixture(scope="module")
def torch_kernels_model():
    """The default model on torch's 4-bit kernel (``LSP_NATIVE=0``): what serves it where the
    native kernels are not built."""
    import os

    from speculative_complete.decoding.forward.native.serving import kernels

    saved = os.environ.get("LSP_NATIVE")
    os.environ["LSP_NATIVE"] = "0"
    kernels.cache_clear()
    try:
        model = load_model("default", device="cpu", dtype="float32")
        assert model.forward.native is None
        return model
    finally:
        if saved is None:
            del os.environ["LSP_NATIVE"]
        else:
            os.environ["LSP_NATIVE"] = saved
        kernels.cache_clear()


@pytest.mark.parametrize("weights", ["quantized", "fp32", "quantized on torch's kernel"])
def test_the_lean_forward_computes_each_row_the_same_in_any_pass(weights, request):
    """Bit for bit, whatever the passes a prompt is split into (a prefill, a verify pass, a step,
    a tail after KV reuse): what makes speculative greedy equal plain greedy on this model, on
    its quantized blocks and dequantized to fp32. The fp32 model runs on the lean forward's dense
    layers for this: transformers' forward picks its kernels by row count (a row differed by up
    to 1.4e-6 between a pass of one row and one of 2 to 16)."""
    fixture = {"quantized": "default_model", "fp32": "fp32_model"}.get(weights, "torch_kernels_model")
    model = request.getfixturevalue(fixture)
    assert isinstance(model.forward, LlamaForward) and model.model is None
    forward = model.forward
    rng = random.Random(3)
    tokens = [rng.randrange(model.vocab_size) for _ in range(700)]
    whole = forward(tokens, forward.new_cache())
    cache, rows, done = forward.new_cache(), [], 0
    for n in (300, 1, 17, 5, 200, 1, 9, 167):
        rows.append(forward(tokens[done : done + n], cache))
        done += n
    assert done == len(tokens)
    assert torch.equal(torch.cat(rows), whole)
