"""The fixed-width forward of ``speculative_complete/decoding/forward/graphed.py``: eager on the CPU
here, CUDA graphs on a GPU.

Every test runs on the CPU (the pass without graphs), and again on CUDA where a GPU is present
(graphs, bf16 and fp32): batch invariance bit for bit, speculative greedy equal to the model's own
plain greedy over 200 cases per drafter, the context limit, and the real default model.
"""

from __future__ import annotations

import random

import pytest
import torch

from speculative_complete.decoding.drafters import load_head_drafter, make_drafter
from speculative_complete.decoding.engine.loop import GenerationConfig, SpeculativeEngine
from speculative_complete.decoding.forward.graphed import (
    DRAFT_WIDTHS,
    WIDTH,
    GraphedCache,
    GraphedForward,
    from_gguf_on_device,
)
from speculative_complete.decoding.forward.graphed_weights import (
    DenseProduct,
    Int4Product,
    device_product,
    int4_kernel_works,
)
from speculative_complete.decoding.forward.transformers_loader import from_transformers
from speculative_complete.decoding.models.loading import LoadedModel
from tests.support.draft_heads import trained_tiny_head
from tests.support.greedy_cases import (
    MAX_NEW,
    assert_speculative_greedy_is_plain_greedy,
    expected_output,
    make_case,
    perturbed_copy,
)
from tests.support.lean_forward import plain_greedy_pass
from tests.support.tiny_models import TinyTokenizer, tiny_config, tiny_model

CUDA = torch.cuda.is_available()
SETUPS = [("cpu", torch.float32)] + ([("cuda", torch.bfloat16), ("cuda", torch.float32)] if CUDA else [])
SETUP_IDS = [f"{device}-{str(dtype).removeprefix('torch.')}" for device, dtype in SETUPS]


def graphed(model, device: str, dtype: torch.dtype, **kwargs) -> GraphedForward:
    return GraphedForward.from_lean(from_transformers(model, 0), torch.device(device), dtype, **kwargs)


def graphed_loaded(forward: GraphedForward, eos: int | None = None) -> LoadedModel:
    return LoadedModel(
        model=None,
        tokenizer=TinyTokenizer(),
        device=forward.device,
        dtype=forward.dtype,
        source="tiny",
        forward=forward,
        config=tiny_config(eos_token_id=eos, max_positions=1024),
        quantization=forward.formats,
    )


def test_the_fixed_width_pass_is_transformers_forward_in_fp32():
    model = tiny_model(5, layers=3, max_positions=1024)
    forward = graphed(model, "cpu", torch.float32)
    tokens = [random.Random(1).randrange(64) for _ in range(70)]
    want = model(input_ids=torch.tensor([tokens])).logits[0]
    cache = forward.new_cache()
    got = torch.cat([forward(tokens[:37], cache), forward(tokens[37:38], cache), forward(tokens[38:], cache)])
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
    assert cache.get_seq_length() == len(tokens)


@pytest.mark.parametrize(("device", "dtype"), SETUPS, ids=SETUP_IDS)
def test_every_split_of_a_sequence_gives_the_same_bits(device, dtype):
    """Logits, keys and hidden states do not depend on how the tokens were split into passes."""
    forward = graphed(tiny_model(6, layers=3, max_positions=1024), device, dtype)
    rng = random.Random(3)
    tokens = [rng.randrange(64) for _ in range(300)]
    one_pass = forward.new_cache()
    whole = forward(tokens, one_pass)
    assert whole.shape == (len(tokens), forward.vocab_size) and whole.dtype == torch.float32
    for trial in range(5):
        cache, rows, done = forward.new_cache(), [], 0
        while done < len(tokens):
            n = rng.choice([1, 1, 2, 3, 5, 9, 15, 16, 17, 40, 100]) if trial else 1
            rows.append(forward(tokens[done : done + n], cache))
            done += n
        n = len(tokens)
        assert torch.equal(torch.cat(rows), whole), trial
        assert torch.equal(cache.keys[:, :, :n], one_pass.keys[:, :, :n])
        assert torch.equal(cache.hidden[:n], one_pass.hidden[:n])


@pytest.mark.parametrize(("device", "dtype"), SETUPS, ids=SETUP_IDS)
def test_the_cache_crops_keeps_the_last_rows_and_stops_at_its_capacity(device, dtype):
    forward = graphed(tiny_model(8, max_positions=1024), device, dtype, capacity=64)
    assert forward.capacity == 64 and forward.max_context == 64 - forward.width
    cache = forward.new_cache()
    assert isinstance(cache, GraphedCache)
    tokens = [random.Random(2).randrange(64) for _ in range(40)]
    logits = forward(tokens, cache)
    assert torch.equal(
        forward(tokens[-5:], forward.new_cache(), keep=2), forward(tokens[-5:], forward.new_cache())[-2:]
    )
    cache.crop(-10)  # the transformers convention
    assert cache.get_seq_length() == 30
    assert torch.equal(forward(tokens[30:], cache, keep=3), logits[-3:])
    assert forward([], cache).shape == (0, forward.vocab_size)
    with pytest.raises(ValueError, match="context"):
        forward([1] * (forward.max_context - cache.length + 1), cache)
    cache.crop(5)
    assert cache.get_seq_length() == 5
    assert cache.nbytes() == cache.keys.nbytes * 2 + cache.hidden.nbytes
    assert graphed_loaded(forward).max_context == forward.max_context


@pytest.fixture(scope="module", params=SETUPS, ids=SETUP_IDS)
def graphed_pairs(request):
    device, dtype = request.param
    targets = [
        tiny_model(seed, layers=2, logit_scale=scale, max_positions=1024)
        for seed, scale in [(11, 1.0), (12, 8.0), (13, 20.0), (14, 40.0)]
    ]
    # drafts as a draft model is built: a one-row step beside the full width (``DRAFT_WIDTHS``)
    near = [
        graphed(perturbed_copy(t, i, 0.3), device, dtype, widths=DRAFT_WIDTHS) for i, t in enumerate(targets)
    ]
    return [graphed(t, device, dtype) for t in targets], near


@pytest.mark.parametrize("drafter_name", ["ngram", "model", "auto"])
def test_speculative_greedy_equals_the_graphed_models_plain_greedy(graphed_pairs, drafter_name):
    """200 prompt/stop cases per drafter, as for the fp32 and quantized forwards."""
    assert_speculative_greedy_is_plain_greedy(*graphed_pairs, drafter_name, graphed_loaded)


@pytest.mark.parametrize(("device", "dtype"), SETUPS, ids=SETUP_IDS)
def test_a_draft_head_drafts_beside_the_graphed_forward_and_greedy_stays_exact(tmp_path, device, dtype):
    """A head trained on the lean forward loads for its graphed copy (the lean forward's
    fingerprint), runs dense on the graphed forward's device reading its cache's hidden states,
    and 100 prompt/stop cases with it equal the graphed model's own plain greedy."""
    lean = from_transformers(tiny_model(41, layers=2, logit_scale=3.0, max_positions=1024), 0)
    trained_tiny_head(lean).save(tmp_path / "head")
    forward = GraphedForward.from_lean(lean, torch.device(device), dtype)
    assert forward.fingerprint == lean.fingerprint
    head = load_head_drafter(
        graphed_loaded(forward), str(tmp_path / "head"), bits=4 if device == "cpu" else None
    )
    assert head.device.type == device and next(head.head.parameters()).device.type == device
    assert (head.bits is None) == (device != "cpu")
    proposed = accepted = 0
    for i in range(100):
        rng, prompt, variant = make_case(i)
        kwargs, eos, want_tokens, want_text = expected_output(
            plain_greedy_pass(forward, prompt, MAX_NEW), variant, rng
        )
        engine = SpeculativeEngine(graphed_loaded(forward, eos))
        head.confident = i % 4 == 0  # mostly full-length drafts (the tiny head is rarely sure)
        result = engine.generate(prompt, GenerationConfig(**kwargs), make_drafter("head", draft_head=head))
        assert result.token_ids == want_tokens, f"case {i}: the head diverged from greedy"
        assert result.text == want_text
        stats = result.stats.drafters.get("head")
        if stats is not None:
            proposed, accepted = proposed + stats.proposed, accepted + stats.accepted
    assert proposed > 100 and 0 < accepted < proposed
    sampled = SpeculativeEngine(graphed_loaded(forward)).generate(
        [1, 2, 3],
        GenerationConfig(max_new_tokens=8, temperature=0.8, seed=3),
        make_drafter("head", draft_head=head),
    )
    # a sampled draft's q is made on the CPU, beside the engine's generator: the head drafted here
    assert len(sampled.token_ids) == 8 and sampled.stats.drafters["head"].proposed > 0


@pytest.mark.real_model
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_default_model_runs_graphed_on_cuda_and_every_drafter_stays_exact(dtype):
    from speculative_complete.decoding.models.loading import check_draft_compatible, load_model
    from tests.support.stdlib_prompts import stdlib_prompts

    target = load_model("default", device="cuda", dtype=dtype)
    assert isinstance(target.forward, GraphedForward) and target.forward.warmup_s > 0
    assert target.quantization.endswith(f"as {dtype} on cuda") and target.model is None
    assert target.forward.widths == (WIDTH,)
    four_bit = isinstance(target.forward.weights.layers[0].gate_up, Int4Product)
    assert four_bit == (dtype == "bfloat16")  # the file's Q4_1 blocks as they are, in bf16
    draft = load_model("default", device="cuda", dtype="bfloat16", draft=True)
    check_draft_compatible(target, draft)
    assert isinstance(draft.forward, GraphedForward) and draft.forward.widths == DRAFT_WIDTHS
    engine = SpeculativeEngine(target)
    drafters = {
        name: make_drafter(name, draft_model=draft, cost=engine.cost) for name in ("ngram", "model", "auto")
    }
    config = GenerationConfig(max_new_tokens=20, stop_at_newline=True)
    drafted = dict.fromkeys(drafters, 0)
    for prompt in stdlib_prompts(20):
        ids = engine.encode(prompt)
        plain = engine.generate(ids, config)
        assert plain.stats.tokens_per_pass == 1.0
        for name, drafter in drafters.items():
            result = engine.generate(ids, config, drafter)
            assert result.token_ids == plain.token_ids, f"{name} differs on {prompt[-60:]!r}"
            drafted[name] += sum(s.proposed for s in result.stats.drafters.values())
    assert drafted["ngram"] > 0 and drafted["model"] > 0


@pytest.fixture(scope="module")
def dense_default():
    """The default GGUF dequantized for the graphed forward (``from_gguf(dense=True)``), on the
    CPU in fp32."""
    from speculative_complete.decoding.forward.gguf_loader import from_gguf
    from speculative_complete.decoding.models.loading import default_gguf_path

    return GraphedForward.from_lean(
        from_gguf(str(default_gguf_path()), dense=True), torch.device("cpu"), torch.float32, capacity=512
    )


def with_default_tokenizer(forward: GraphedForward, default_model: LoadedModel) -> LoadedModel:
    """A graphed copy of the default model, served with its tokenizer and config."""
    return LoadedModel.on_lean(
        forward,
        default_model.tokenizer,
        default_model.config,
        forward.device,
        forward.dtype,
        "default, graphed",
        forward.formats,
    )


@pytest.mark.real_model
def test_the_default_models_dense_blocks_compute_what_its_quantized_forward_does(
    default_model, dense_default, monkeypatch
):
    """The dense GGUF run on the CPU in fp32 picks the quantized lean forward's greedy token on
    real code (on torch's kernel, as here, they differ only by its bf16 activations; llama.cpp's
    kernels, which serve the file where built, quantize them to 8 bits): the weights' layout,
    rotary order and tied table are right."""
    from speculative_complete.decoding.forward.gguf_loader import from_gguf
    from speculative_complete.decoding.models.loading import default_gguf_path
    from tests.support.stdlib_prompts import stdlib_prompts

    dense = dense_default
    assert dense.formats == "F32+Q4_1+Q8_0 as float32 on cpu"
    tokens = default_model.tokenizer(stdlib_prompts(1, prompt_chars=1200)[0])["input_ids"][:300]
    monkeypatch.setenv("LSP_NATIVE", "0")
    quantized = from_gguf(str(default_gguf_path()))
    assert quantized.native is None
    want = quantized(tokens, quantized.new_cache())
    got = dense(tokens, dense.new_cache())
    agree = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    assert agree >= 0.95, agree
    assert torch.allclose(torch.softmax(got, -1), torch.softmax(want, -1), atol=0.05)


@pytest.mark.real_model
def test_the_shipped_head_drafts_for_the_default_model_on_the_graphed_forward(default_model, dense_default):
    """What a GPU would run, on the CPU: ``auto`` finds the shipped head for the graphed default
    model (the same fingerprint as its quantized forward), it runs dense (no 4-bit kernel off the
    CPU's lean path is needed), greedy output with it is the graphed model's own, and most of its
    drafts on held-out code are kept."""
    from benchmarks.decode_bench import stdlib_files

    assert dense_default.fingerprint == default_model.forward.fingerprint
    loaded = with_default_tokenizer(dense_default, default_model)
    head = load_head_drafter(loaded, "auto", bits=None)
    assert head is not None and head.folder.endswith("smollm2-135m-instruct")
    engine = SpeculativeEngine(loaded)
    agree = total = 0
    for rel, path in stdlib_files()[5:35:10]:
        text = path.read_text(encoding="utf-8")
        ids = engine.encode(text[: len(text) // 2])[-200:]
        cache = dense_default.new_cache()
        greedy = dense_default(ids, cache).argmax(-1).tolist()
        head.attach(cache)
        for j in range(100, len(ids) - 1):  # the head's first draft after ids[: j + 1]
            agree += head.propose_exactly(ids[: j + 1], 1).tokens == greedy[j : j + 1]
            total += 1
        config = GenerationConfig(max_new_tokens=16)
        with_head = engine.generate(ids, config, make_drafter("head", draft_head=head, cost=engine.cost))
        assert with_head.token_ids == engine.generate(ids, config).token_ids, rel
    assert agree >= 0.45 * total, (agree, total)  # held-out: ~0.6; an untrained head: ~0


@pytest.mark.parametrize(("device", "dtype"), SETUPS, ids=SETUP_IDS)
def test_a_draft_forwards_one_row_step_computes_the_full_width_pass(device, dtype):
    """A draft model's one-token steps replay a one-row graph; its logits and cache are those of
    the full-width pass up to rounding (drafts need no batch invariance, only the target does)."""
    model = tiny_model(7, layers=2, max_positions=1024)
    full = graphed(model, device, dtype)
    draft = graphed(model, device, dtype, widths=DRAFT_WIDTHS)
    assert draft.widths == (1, WIDTH) and full.widths == (WIDTH,)
    tokens = [random.Random(2).randrange(64) for _ in range(40)]
    want = full(tokens, full.new_cache())
    cache = draft.new_cache()
    got = torch.cat([draft(tokens[:30], cache)] + [draft([t], cache) for t in tokens[30:]])
    assert set(cache.graphs) == (set(DRAFT_WIDTHS) if device == "cuda" else set())
    tolerance = 1e-4 if dtype == torch.float32 else 0.1
    assert torch.allclose(got, want, atol=tolerance), (got - want).abs().max()
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.fixture(scope="module")
def default_blocks():
    """The default GGUF's blocks as ``speculative_complete/decoding/forward/graphed_weights.py``
    takes them."""
    from speculative_complete.decoding.forward.gguf_loader import GgufWeights
    from speculative_complete.decoding.models.loading import default_gguf_path

    return GgufWeights(str(default_gguf_path()), dense=False, kernels=False)


DEVICES = ["cpu"] + (["cuda"] if CUDA else [])


@pytest.mark.real_model
@pytest.mark.parametrize("device", DEVICES)
def test_a_ggufs_4bit_blocks_go_to_the_device_as_they_are(default_blocks, device):
    """Q4_1 blocks become the 4-bit kernel's groups of 32 with their own scales (rounded to bf16)
    and multiply as the block's values do; Q8_0 (two 4-bit terms) and fp32 stay dense, as does any
    dtype but bf16."""
    place = torch.device(device)
    assert int4_kernel_works(place)
    gate = default_blocks.weight("gate", 0)
    assert gate.kind == "Q4_1"
    product = device_product(gate, place, torch.bfloat16)
    assert isinstance(product, Int4Product)
    assert product.nbytes() < gate.shape[0] * gate.shape[1] // 2 + gate.shape[0] * gate.shape[1] // 8 + 1
    term = gate.terms[0]
    rounded = torch.from_numpy(term.q.astype("float32") - 8).reshape(gate.shape[0], -1, 32)
    scale = torch.from_numpy(term.scale).bfloat16().float()[..., None]
    zero = torch.from_numpy(term.zero).bfloat16().float()[..., None]
    weights = (rounded * scale + zero).reshape(gate.shape)
    x = torch.randn(WIDTH, gate.shape[1], generator=torch.Generator().manual_seed(0)).bfloat16()
    want = x.float() @ weights.T
    got = product(x.to(place)).float().cpu()
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert torch.allclose(got, want, rtol=0.02, atol=0.05 * want.abs().max().item()), (got - want).abs().max()
    assert isinstance(device_product(gate, place, torch.float32), DenseProduct)
    assert isinstance(device_product(default_blocks.weight("o", 0), place, torch.bfloat16), Int4Product)


@pytest.mark.real_model
@pytest.mark.parametrize("device", DEVICES)
def test_the_default_gguf_on_the_device_path_is_its_quantized_model_and_stays_exact(default_model, device):
    """``from_gguf_on_device`` in bf16, as a GPU loads the default model (eager here on the CPU):
    the Q4_1 layers on the 4-bit kernel, the Q8_0 output layer dense; the lean forward's
    fingerprint (the shipped head finds it); its greedy tokens on real code mostly those of the
    quantized lean forward; every split of a sequence gives the same bits; speculative greedy
    with each drafter equals its own plain greedy."""
    from speculative_complete.decoding.models.loading import default_gguf_path
    from tests.support.stdlib_prompts import stdlib_prompts

    forward = from_gguf_on_device(
        str(default_gguf_path()), torch.device(device), torch.bfloat16, capacity=512
    )
    assert forward.formats == f"F32+Q4_1+Q8_0 as bfloat16 on {device}"
    layer = forward.weights.layers[0]
    assert all(isinstance(p, Int4Product) for p in (layer.qkv, layer.out, layer.gate_up, layer.down))
    assert isinstance(forward.weights.output, DenseProduct)
    assert forward.fingerprint == default_model.forward.fingerprint
    tokens = default_model.tokenizer(stdlib_prompts(1, prompt_chars=1200)[0])["input_ids"][:200]
    want = default_model.forward(tokens, default_model.forward.new_cache())
    cache = forward.new_cache()
    got = forward(tokens, cache)
    agree = (got.argmax(-1).cpu() == want.argmax(-1)).float().mean().item()
    assert agree >= 0.9, agree
    split = forward.new_cache()
    pieces = torch.cat(
        [forward(tokens[:37], split), forward(tokens[37:38], split), forward(tokens[38:], split)]
    )
    assert torch.equal(pieces, got)
    assert torch.equal(split.keys[:, :, :200], cache.keys[:, :, :200])
    loaded = with_default_tokenizer(forward, default_model)
    engine = SpeculativeEngine(loaded)
    config = GenerationConfig(max_new_tokens=24)
    for prompt in stdlib_prompts(3, prompt_chars=800):
        ids = engine.encode(prompt)[-150:]
        plain = engine.generate(ids, config)
        for name in ("ngram", "head", "auto"):
            head = load_head_drafter(loaded, "auto", bits=None) if name != "ngram" else None
            result = engine.generate(ids, config, make_drafter(name, draft_head=head, cost=engine.cost))
            assert result.token_ids == plain.token_ids, name


@pytest.mark.parametrize("device", DEVICES)
def test_a_model_quantized_to_4_bits_at_load_stays_exact_under_speculation(device):
    """``int4`` for a safetensors Llama on the graphed forward (what ``load_model`` builds on CUDA):
    every layer's products Q4_1 blocks on the 4-bit kernel, the output layer dense; its greedy
    tokens mostly the dense model's; 200 prompt/stop cases with a 4-bit draft model (one-row
    steps) and n-grams equal its own plain greedy."""
    place, bf16 = torch.device(device), torch.bfloat16
    targets = [tiny_model(seed, layers=2, logit_scale=8.0, max_positions=1024) for seed in (21, 22)]
    four = [GraphedForward.from_lean(from_transformers(t, 0), place, bf16, bits=4) for t in targets]
    layer = four[0].weights.layers[0]
    assert all(isinstance(p, Int4Product) for p in (layer.qkv, layer.out, layer.gate_up, layer.down))
    assert isinstance(four[0].weights.output, DenseProduct) and four[0].formats.startswith("Q4_1 at load")
    tokens = [random.Random(3).randrange(64) for _ in range(64)]
    dense = graphed(targets[0], device, bf16)
    got, want = four[0](tokens, four[0].new_cache()), dense(tokens, dense.new_cache())
    assert (got.argmax(-1) == want.argmax(-1)).float().mean().item() >= 0.8
    near = [
        GraphedForward.from_lean(
            from_transformers(perturbed_copy(t, i, 0.3), 0), place, bf16, bits=4, widths=DRAFT_WIDTHS
        )
        for i, t in enumerate(targets)
    ]
    assert_speculative_greedy_is_plain_greedy(four, near, "auto", graphed_loaded)
