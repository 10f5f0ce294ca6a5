"""Quantized weights and the lean forward: GGUF blocks decode to the gguf package's own values,
the layers and the whole forward are batch-invariant bit for bit, and speculative greedy
decoding on the quantized model equals that model's own plain greedy decoding."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QType
from gguf import quants

from speculative_complete.decoding.engine.loop import GenerationConfig, SpeculativeEngine
from speculative_complete.decoding.forward.llama import (
    MAX_ATTENTION_ROWS,
    KVCache,
    LlamaForward,
    attention_row_floor,
)
from speculative_complete.decoding.forward.quant.gguf_blocks import (
    GROUP,
    decode_tensor,
    quantize_dense,
    supports_int4,
)
from speculative_complete.decoding.forward.quant.layers import (
    DenseLinear,
    Int4Linear,
    QuantizedOutputLayer,
    SmallLinear,
    linear_for,
    quantize_linears,
    ranked_terms,
)
from speculative_complete.decoding.forward.transformers_loader import from_transformers
from tests.support.greedy_cases import (
    assert_speculative_greedy_is_plain_greedy,
    perturbed_copy,
)
from tests.support.lean_forward import lean_loaded
from tests.support.quant_blocks import IN, INT4_KINDS, OUT, random_blocks
from tests.support.tiny_models import tiny_model


@pytest.mark.parametrize("kind", [*INT4_KINDS, QType.F16])
def test_gguf_blocks_decode_to_the_gguf_packages_own_values(kind):
    rng = np.random.default_rng(int(kind))
    raw = (
        rng.standard_normal((OUT, IN)).astype(np.float16).view(np.uint8)
        if kind == QType.F16
        else random_blocks(kind, rng)
    )
    tensor = decode_tensor(raw, kind, (OUT, IN))
    want = quants.dequantize(raw, kind).reshape(OUT, IN)
    assert (tensor.terms is not None) == supports_int4(kind)
    if tensor.terms is not None:
        assert all(t.q.min() >= 0 and t.q.max() <= 15 for t in tensor.terms)
        assert len(tensor.terms) == INT4_KINDS[kind]
    # The terms' values are the file's: equal, up to one rounding of zero = m + 8d or 8 d sc - dmin m.
    np.testing.assert_allclose(tensor.dense(), want, rtol=0, atol=float(np.abs(want).max()) * 2**-22)
    if kind in (QType.Q4_0, QType.Q8_0, QType.F16):
        assert np.array_equal(tensor.dense(), want)  # no zero term to round: exact


def kernel_weights(layer: Int4Linear) -> torch.Tensor:
    """What the kernel really multiplies with: the identity matrix through the layer."""
    return layer(torch.eye(layer.in_features)).float().t()


@pytest.mark.parametrize("kind", list(INT4_KINDS))
def test_int4_layer_multiplies_with_the_files_values_up_to_bf16_scales(kind):
    rng = np.random.default_rng(7)
    tensor = decode_tensor(random_blocks(kind, rng), kind, (OUT, IN))
    layer = linear_for(tensor)
    assert isinstance(layer, Int4Linear)
    want = torch.from_numpy(tensor.dense())
    # Rounding enters where the doc says: scales and zeros in bf16, the output in bf16.
    scale = want.abs().amax(dim=1, keepdim=True)
    assert ((kernel_weights(layer) - want).abs() <= scale * 2**-6).all()
    x = torch.randn(5, IN)
    close = torch.from_numpy(tensor.dense()) @ x.t()
    assert torch.allclose(layer(x).float(), close.t(), rtol=0.05, atol=0.05 * close.abs().max().item())


@pytest.mark.parametrize("make", ["int4", "int8", "dense", "Q6_K", "Q5_K", "Q2_K"])
def test_every_row_is_computed_as_if_it_were_alone(make):
    rng = np.random.default_rng(3)
    weight = rng.standard_normal((OUT * 3, IN)).astype(np.float32)
    if make == "dense":
        layer = DenseLinear(torch.from_numpy(weight))
    elif make in ("int4", "int8"):
        layer = linear_for(quantize_dense(weight, 4 if make == "int4" else 8))
    else:  # K-quants: two padded terms, two plain ones, one padded, each one fused product
        kind = QType[make]
        layer = linear_for(decode_tensor(random_blocks(kind, rng, OUT * 3), kind, (OUT * 3, IN)))
    x = torch.randn(256, IN)
    full = layer(x)
    for rows in (1, 2, 3, 4, 5, 8, 9, 16, 17, 33, 100):
        start = int(rng.integers(0, 256 - rows))
        assert torch.equal(layer(x[start : start + rows]), full[start : start + rows]), rows


@pytest.mark.parametrize("threads", [1, 2])
def test_a_dense_layer_is_batch_invariant_whatever_torchs_threads(threads):
    """With two threads MKL splits the sums of some shapes between them by the row count (the
    default model's 576x1536 down projection differed at 100 and 167 rows against 300): the
    dense layer runs its product on one thread, and leaves torch's thread count as it was."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        layer = DenseLinear(torch.randn(576, 1536, generator=torch.Generator().manual_seed(0)))
        x = torch.randn(300, 1536, generator=torch.Generator().manual_seed(1))
        whole = layer(x)
        for rows in (1, 5, 9, 17, 100, 167, 200):
            assert torch.equal(layer(x[:rows]), whole[:rows]), rows
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("kind", [QType.Q8_0, QType.Q4_1, QType.Q4_K, QType.Q6_K, QType.Q5_K])
def test_the_quantized_head_gives_exact_logits_for_the_likely_tokens(kind):
    vocab = 1024  # more tokens than candidates
    rng = np.random.default_rng(11)
    tensor = decode_tensor(random_blocks(kind, rng, vocab), kind, (vocab, IN))
    head = QuantizedOutputLayer(tensor)
    exact_rows = head.rows(torch.arange(vocab))
    dense = torch.from_numpy(tensor.dense())  # up to one rounding of each group's zero
    assert torch.allclose(exact_rows, dense, rtol=0, atol=dense.abs().max().item() * 2**-22)
    if kind == QType.Q8_0:  # the int8 values and their scales again: exact
        raw = random_blocks(kind, np.random.default_rng(11), vocab)
        assert torch.equal(exact_rows, torch.from_numpy(quants.dequantize(raw, kind).reshape(vocab, IN)))
    x = torch.randn(40, IN)
    fp32 = x @ exact_rows.t()
    scale = fp32.abs().max().item()
    for greedy_only in (False, True):
        logits = head(x, greedy_only=greedy_only)
        # the candidates (greedy_only: the first half of its few, whose order near the last
        # one's may differ from the layer's own sum of the product's parts)
        count = QuantizedOutputLayer.CANDIDATES
        if greedy_only:
            count = QuantizedOutputLayer.GREEDY_CANDIDATES // 2
        top = head.approx(x).float().topk(count, dim=-1).indices
        assert torch.allclose(logits.gather(1, top), fp32.gather(1, top), rtol=0, atol=scale * 1e-5)
        assert torch.equal(logits.argmax(-1), fp32.argmax(-1))  # the greedy choice is the fp32 layer's
        for rows in (1, 2, 3, 7, 17):
            assert torch.equal(head(x[:rows], greedy_only=greedy_only), logits[:rows])
        # every logit within the kernel's bf16 rounding: what sampling sees
        assert torch.allclose(logits, fp32, rtol=0, atol=scale * 2**-6)
    parts = head.approx.parts(x)  # each kernel logit within its error bound of the exact one
    total = parts[0] + parts[1] if len(parts) == 2 else parts[0]
    bound = head._error_bound(x, head._magnitudes(parts, total), head.kernel_error, head.kernel_norm)
    assert ((total.float() - fp32).abs() <= bound).all()


@pytest.mark.parametrize("kind", [QType.Q8_0, QType.Q4_1, QType.Q4_K, QType.Q6_K])
def test_the_quantized_heads_greedy_choice_is_exact_among_any_allowed_tokens(kind):
    """With two candidates a row's best token, or its best allowed one (token healing's
    constraint), is mostly outside them: the error bound finds it, and it is computed exactly."""
    vocab = 1024
    rng = np.random.default_rng(12)
    head = QuantizedOutputLayer(decode_tensor(random_blocks(kind, rng, vocab), kind, (vocab, IN)))
    head.GREEDY_CANDIDATES = 2
    x = torch.randn(24, IN)
    fp32 = x @ head.rows(torch.arange(vocab)).t()
    allowed = [torch.from_numpy(rng.choice(vocab, size=n, replace=False)) for n in (1, 3, 40, 700) * 5]
    allowed += [None] * 4
    logits = head(x, allowed, greedy_only=True)
    for row, ids in enumerate(allowed):
        ids = torch.arange(vocab) if ids is None else ids
        assert ids[logits[row, ids].argmax()] == ids[fp32[row, ids].argmax()], row
        assert logits[row].argmax() == fp32[row].argmax(), row  # and the row's own best token
    assert head.repaired > 0


def test_a_two_term_weight_keeps_its_sum_with_the_group_means_moved_into_the_leading_term():
    rng = np.random.default_rng(5)
    kind = QType.Q8_0
    tensor = decode_tensor(random_blocks(kind, rng), kind, (OUT, IN))
    hi, lo = tensor.terms
    leading, rest = ranked_terms(tensor.terms)
    assert np.array_equal(leading.q, hi.q) and np.array_equal(rest.q, lo.q)
    np.testing.assert_allclose(leading.dense() + rest.dense(), tensor.dense(), rtol=0, atol=1e-6)
    error = (leading.dense() - tensor.dense()).reshape(OUT, IN // GROUP, GROUP)
    step = np.repeat(lo.scale[:, :, None], GROUP, axis=2)
    assert np.all(np.abs(error) <= 15 * step + 1e-6)  # off by at most the other term's span
    np.testing.assert_allclose(error.mean(-1), 0, atol=1e-6)  # and right on average in each group
    (only,) = decode_tensor(random_blocks(QType.Q4_1, rng), QType.Q4_1, (OUT, IN)).terms
    (same,) = ranked_terms([only])
    assert np.array_equal(same.dense(), only.dense())


@pytest.mark.parametrize("bits,tolerance", [(4, 0.1), (8, 0.01)])
def test_a_small_layer_on_the_4_bit_kernel_is_its_dense_layer_up_to_its_blocks(bits, tolerance):
    """A draft head's layers: any leading dimensions, the bias added, within what Q4_1 / Q8_0
    blocks and bf16 activations allow of the fp32 product."""
    torch.manual_seed(0)
    dense = torch.nn.Linear(64, 48, bias=True)
    small = SmallLinear(dense.weight, dense.bias, bits)
    x = torch.randn(2, 5, 64)
    want, got = dense(x), small(x)
    assert got.shape == (2, 5, 48) and got.dtype == torch.bfloat16
    assert float((got.float() - want).norm() / want.norm()) < tolerance
    assert small.nbytes() < dense.weight.numel() * 2  # fewer bytes than bf16


def test_only_the_layers_the_kernel_takes_are_quantized():
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 24), torch.nn.Linear(24, 16))
    assert quantize_linears(model, 4) == 1  # 24 output rows are not whole 16s; 24 inputs no group
    assert isinstance(model[0], SmallLinear) and type(model[1]) is torch.nn.Linear
    assert type(model[2]) is torch.nn.Linear


def lean(seed: int, bits: int, layers: int = 2):
    return from_transformers(tiny_model(seed, layers=layers, max_positions=1024), bits)


def test_the_lean_forward_is_transformers_forward_when_nothing_is_quantized():
    model = tiny_model(5, layers=3)
    forward = from_transformers(model, bits=0)
    tokens = [random.Random(1).randrange(64) for _ in range(40)]
    want = model(input_ids=torch.tensor([tokens])).logits[0]
    cache = forward.new_cache()
    got = torch.cat([forward(tokens[:25], cache), forward(tokens[25:26], cache), forward(tokens[26:], cache)])
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()


@pytest.mark.parametrize("bits", [4, 8])
def test_the_lean_forward_is_batch_invariant_bit_for_bit(bits, kernel_backend):
    """Logits and caches do not depend on how the tokens were split into passes (attention on
    either backend)."""
    forward = lean(6, bits, layers=3)
    rng = random.Random(bits)
    tokens = [rng.randrange(64) for _ in range(600)]  # three key blocks of attention
    one_pass = forward.new_cache()
    whole = forward(tokens, one_pass)
    for trial in range(6):
        cache, rows, done = forward.new_cache(), [], 0
        while done < len(tokens):
            n = rng.choice([1, 1, 2, 3, 5, 9, 17, 40, 255, 300]) if trial else 1
            rows.append(forward(tokens[done : done + n], cache))
            done += n
        assert torch.equal(torch.cat(rows)[: len(tokens)], whole), trial
        assert torch.equal(cache.keys[:, :, : len(tokens)], one_pass.keys[:, :, : len(tokens)])


def test_the_cache_crops_by_moving_its_index_and_grows_when_full():
    forward = lean(8, 4)
    cache = forward.new_cache()
    assert isinstance(cache, KVCache) and cache.capacity == KVCache.SPARE
    tokens = [random.Random(2).randrange(64) for _ in range(KVCache.SPARE + 10)]
    logits = forward(tokens, cache)
    assert cache.get_seq_length() == len(tokens) and cache.capacity >= len(tokens)
    cache.crop(-10)  # the transformers convention
    assert cache.get_seq_length() == KVCache.SPARE
    again = forward(tokens[-10:], cache)
    assert torch.equal(again, logits[-10:])
    cache.crop(5)
    assert cache.get_seq_length() == 5 and cache.nbytes() == cache.keys.nbytes * 2 + cache.hidden.nbytes


@pytest.fixture(scope="module")
def quantized_pairs():
    targets = [
        tiny_model(seed, layers=2, logit_scale=scale)
        for seed, scale in [(11, 1.0), (12, 8.0), (13, 20.0), (14, 40.0)]
    ]
    near = [from_transformers(perturbed_copy(t, i, 0.3), 4) for i, t in enumerate(targets)]
    return [from_transformers(t, 4) for t in targets], near


@pytest.mark.parametrize("drafter_name", ["ngram", "model", "auto"])
def test_speculative_greedy_equals_the_quantized_models_plain_greedy(quantized_pairs, drafter_name):
    """200 prompt/stop cases per drafter, as for the fp32 models in test_engine_greedy."""
    assert_speculative_greedy_is_plain_greedy(*quantized_pairs, drafter_name, lean_loaded)


class RecordedPass:
    """A real lean forward that records the ``greedy_only`` each pass was asked with."""

    def __init__(self, forward) -> None:
        self.forward, self.asked = forward, []
        self.vocab_size, self.cost_prior, self.fingerprint = forward.vocab_size, forward.cost_prior, None
        self.max_context = forward.max_context

    def new_cache(self):
        return self.forward.new_cache()

    def output_rows(self, ids):
        return self.forward.output_rows(ids)

    def __call__(self, tokens, cache, keep=0, allowed=None, greedy_only=False):
        self.asked.append(greedy_only)
        return self.forward(tokens, cache, keep, allowed, greedy_only=greedy_only)


def test_the_engine_asks_for_certified_greedy_choices_with_each_pass_of_a_greedy_generation_only():
    """``greedy_only`` travels with the pass, never as state on a forward that several
    generations (a greedy completion, a sampled one, an idle prefill) share."""
    forward = lean(9, 4)
    assert (
        isinstance(forward.output_layer, QuantizedOutputLayer)
        and len(forward.output_layer.approx.packed) == 2
    )  # Q8_0
    recorded = RecordedPass(forward)
    engine = SpeculativeEngine(lean_loaded(recorded))
    engine.generate([1, 2, 3], GenerationConfig(max_new_tokens=3))
    greedy_passes, recorded.asked = recorded.asked, []
    engine.generate([1, 2, 3], GenerationConfig(max_new_tokens=3, temperature=0.8, seed=1))
    assert greedy_passes and all(greedy_passes)
    assert recorded.asked and not any(recorded.asked)


def test_the_transformers_peer_refuses_a_model_outside_transformers():
    from speculative_complete.decoding.engine.transformers_peer import TransformersDecoder

    engine = SpeculativeEngine(lean_loaded(lean(9, 4)))
    with pytest.raises(ValueError, match="quantization"):
        TransformersDecoder(engine)


def test_attention_pads_only_as_far_as_this_cpu_needs():
    """The probe's floor holds on data and spans it did not try (every row count from it up is
    computed as in a long pass), and is tight (one row fewer is computed otherwise)."""
    kv_heads, head_dim = 3, 64
    floor = attention_row_floor(kv_heads, head_dim)
    assert 1 <= floor <= MAX_ATTENTION_ROWS
    generator = torch.Generator().manual_seed(7)
    cache = torch.randn(2, kv_heads, 1536, head_dim, generator=generator)
    queries = torch.randn(kv_heads, 300, head_dim, generator=generator)
    differs = []
    for span in (256, 768, 1280):
        keys, values = cache[0, :, :span], cache[1, :, :span]
        scores = torch.matmul(queries, keys.transpose(1, 2))
        weighted = LlamaForward._weighted_values(torch.softmax(scores, dim=-1), values)
        for rows in range(max(floor - 1, 1), 41):
            few = torch.matmul(queries[:, :rows].contiguous(), keys.transpose(1, 2))
            probs = torch.softmax(few, dim=-1)
            same = torch.equal(few, scores[:, :rows]) and torch.equal(
                LlamaForward._weighted_values(probs, values), weighted[:, :rows]
            )
            if rows >= floor:
                assert same, (rows, span, floor)
            else:
                differs.append(not same)
    assert floor == 1 or any(differs)
