"""llama.cpp's kernels on the lean forward (``speculative_complete/decoding/forward/native``): every
GGUF type's product is the file's weights times the activations as llama.cpp quantizes them, each
output computed alone (bit for bit the same in any pass), attention each row alone, and the output
layer's greedy choice certified exact. The file's blocks are summed as ggml's vec_dot sums them (bit
for bit); Q4_K and Q6_K weights packed at load (``kpacked.c``) are summed in another order, within a
stated bound of the exact product, and a row in a pass of any size bit for bit as alone. CI builds
the kernels (``.ci/run``); elsewhere these tests need ``python -m
speculative_complete.decoding.forward.native --build``; with ``LSP_NATIVE_VARIANT=avx2`` they test
the AVX2 build (``--build --variant avx2``)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QType
from gguf import quants

from speculative_complete.decoding.forward.native.linear import NativeLinear
from speculative_complete.decoding.forward.native.output_layer import (
    DRAFT_ROWS,
    DraftOutputLayer,
    NativeOutputLayer,
)
from speculative_complete.decoding.forward.native.serving import built_kernels
from speculative_complete.decoding.forward.native.weights import Weight
from tests.support.quant_blocks import IN, INT4_KINDS, random_blocks

NATIVE = built_kernels(os.environ.get("LSP_NATIVE_VARIANT", "native"))
if NATIVE is None:
    if os.environ.get("CI"):
        raise RuntimeError(
            "CI builds the native kernels before the tests: "
            "python -m speculative_complete.decoding.forward.native --build"
        )
    pytest.skip(
        "the native kernels are not built (python -m speculative_complete.decoding.forward.native --build)",
        allow_module_level=True,
    )

KINDS = [*INT4_KINDS, QType.F16, QType.BF16, QType.F32]
PACKED_KINDS = [QType.Q4_K, QType.Q6_K, QType.Q5_0]  # packed at load where the build packs them (kpacked.c)
GROUP = NATIVE.lib.lsq_packed_rows()  # weight rows a packed group interleaves (0: none packed)


def packs(kind: QType) -> bool:
    """Whether this build packs ``kind`` (Q5_0: with AVX-512 VNNI only)."""
    return bool(GROUP) and bool(NATIVE.lib.lsq_packed_bytes(int(kind), GROUP, 256))


def k_quant_values(kind: QType, raw: np.ndarray, out: int, n_in: int) -> tuple[np.ndarray, np.ndarray]:
    """The exact weights (out, n_in) float64 of Q4_K, Q6_K or Q5_0 blocks, and the magnitudes of
    the parts a product adds for each (Q4_K: |d sc q| + |dmin m|; the others: |w|)."""
    if kind == QType.Q5_0:  # d (q - 16): exact in float32
        w = quants.dequantize(raw, kind).reshape(out, n_in).astype(np.float64)
        return w, np.abs(w)
    blocks = np.ascontiguousarray(raw).reshape(-1, quants.GGML_QUANT_SIZES[kind][1])

    def half(part: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(part).view(np.float16).astype(np.float64)

    if kind == QType.Q4_K:
        d, dmin = half(blocks[:, 0:2]), half(blocks[:, 2:4])
        sc, m = quants.Q4_K.get_scale_min(np.ascontiguousarray(blocks[:, 4:16]))
        qs = blocks[:, 16:144].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
        q = (qs & 0x0F).reshape(-1, 8, 32).astype(np.float64)  # sub-blocks of 32
        scaled = d[:, :, None] * sc.reshape(-1, 8, 1).astype(np.float64) * q
        offset = np.broadcast_to(dmin[:, :, None] * m.reshape(-1, 8, 1).astype(np.float64), scaled.shape)
        w, parts = scaled - offset, np.abs(scaled) + np.abs(offset)
    else:
        ql, qh = blocks[:, :128].astype(np.int64), blocks[:, 128:192].astype(np.int64)
        scales = np.ascontiguousarray(blocks[:, 192:208]).view(np.int8).astype(np.float64)
        q = np.empty((len(blocks), 256), dtype=np.int64)
        for h in range(2):
            low, high = ql[:, 64 * h : 64 * h + 64], qh[:, 32 * h : 32 * h + 32]
            for i, (nibbles, shift) in enumerate(
                ((low[:, :32] & 15, 0), (low[:, 32:] & 15, 2), (low[:, :32] >> 4, 4), (low[:, 32:] >> 4, 6))
            ):
                q[:, 128 * h + 32 * i : 128 * h + 32 * i + 32] = nibbles | (((high >> shift) & 3) << 4)
        w = half(blocks[:, 208:210]) * np.repeat(scales, 16, axis=1) * (q - 32)
        parts = np.abs(w)
    return w.reshape(out, n_in), parts.reshape(out, n_in)


def packed_rounding(kind: QType, n_in: int) -> float:
    """How many roundings of 2^-24 an output of a packed product may take, per unit of the sum of
    its parts' magnitudes times the activations' (kpacked.c): each block's one or two products of
    scales, integer conversions and fused adds."""
    blocks = n_in // (32 if kind == QType.Q5_0 else 256)
    return (2 * blocks + 2 if kind == QType.Q4_K else blocks + 2) * 2**-24 * 1.01


def weight(kind: QType, rng: np.random.Generator, out: int = 96) -> tuple[Weight, np.ndarray]:
    """A random (out, IN) weight of ``kind`` in its GGUF blocks, and its dequantized values."""
    if kind in (QType.F16, QType.BF16, QType.F32):
        values = rng.standard_normal((out, IN)).astype(np.float32)
        raw = quants.quantize(values, kind) if kind != QType.F32 else values
        raw = np.ascontiguousarray(raw).view(np.uint8).reshape(out, -1)
    else:
        raw = np.ascontiguousarray(random_blocks(kind, rng, out))
    return Weight(int(kind), raw, IN), quants.dequantize(raw, kind).reshape(out, IN)


@pytest.mark.parametrize("kind", KINDS, ids=str)
def test_each_type_multiplies_the_files_weights_and_each_row_alone(kind):
    rng = np.random.default_rng(int(kind))
    w, dense = weight(kind, rng)
    layer = NativeLinear(NATIVE, [w])
    x = torch.randn(40, IN)
    full = layer(x)
    want = x @ torch.from_numpy(dense).t()
    # Rounding enters only where llama.cpp's does: activations quantized per block (8 bits).
    assert ((full - want).abs() <= 0.02 * want.abs().max()).all(), (full - want).abs().max()
    for first, rows in ((0, 1), (3, 2), (7, 5), (12, 17), (39, 1)):
        assert torch.equal(layer(x[first : first + rows]), full[first : first + rows]), rows


@pytest.mark.parametrize("out", [24, 7])  # pairs of weight rows only, and an odd one after them
@pytest.mark.parametrize("kind", KINDS, ids=str)
def test_a_pass_of_any_row_count_gives_each_row_what_ggmls_vec_dot_gives_it_alone(kind, out):
    """A pass runs krows.c's kernels (four activation rows to a weight block, then the rest; the
    first four ask for the weights ahead, the rest do not; Q8_0 and Q8_1 activations' block
    scales read as floats converted once a pass) and, for Q4_K, Q6_K, Q4_0, Q4_1, Q5_0 and Q8_0 on
    AVX-512, kpairs.c's (two weight rows to a register, eight activation rows at a time), one row
    included: every row count from 1 to 9, rows of magnitudes 1e-3 to 1e3 (one value far above the rest)
    and long weight rows (24 blocks of 256) give each output exactly what ggml's own vec_dot
    gives it for that row alone."""
    rng = np.random.default_rng(100 + int(kind))
    n_in = 6144
    if kind in (QType.F16, QType.BF16, QType.F32):
        w, _ = weight(kind, rng, out)
        n_in = IN
    else:
        w = Weight(int(kind), np.ascontiguousarray(random_blocks(kind, rng, out, n_in)), n_in)
    layer = NativeLinear(NATIVE, [w])
    x = torch.randn(9, n_in, generator=torch.Generator().manual_seed(int(kind)))
    x *= torch.logspace(-3, 3, 9)[:, None]
    x[4, 11] = 3e4
    alone = torch.empty(9, out)
    for i in range(9):
        NATIVE.matmul(w.kind, w.blocks, x[i : i + 1], alone[i : i + 1], 0, reference=True)
    for rows in range(1, 10):
        assert torch.equal(layer(x[:rows]), alone[:rows]), rows


@pytest.mark.parametrize("kind", PACKED_KINDS, ids=str)
def test_packed_products_are_the_exact_sums_within_their_rounding_and_each_row_as_alone(kind):
    """Q4_K and Q6_K rows packed at load, eight or sixteen to a register, Q5_0 sixteen with AVX-512
    (kpacked.c): every output is within its bound of the exact product of the file's weights and
    the activations as quantized (float64), and bit for bit the same in a pass of 1 to 16 rows, a
    longer pass (a prefill's) and at any offset in it: each row by the same operations whatever
    its neighbours. Rows of magnitudes 1e-3 to 1e3, one value far above the rest, long weight
    rows (24 blocks of 256)."""
    if not packs(kind):
        pytest.skip(f"this build does not pack {kind.name}")
    rng = np.random.default_rng(200 + int(kind))
    out, n_in = 3 * GROUP, 6144
    raw = np.ascontiguousarray(random_blocks(kind, rng, out, n_in))
    packed = NATIVE.pack(Weight(int(kind), raw, n_in))
    assert packed.packed is not None
    layer = NativeLinear(NATIVE, [packed])
    x = torch.randn(40, n_in, generator=torch.Generator().manual_seed(int(kind)))
    x *= torch.logspace(-3, 3, 40)[:, None]
    x[4, 11] = 3e4
    whole = layer(x)
    seen = NATIVE.activation_rows(int(kind), x).double().numpy()
    w, parts = k_quant_values(kind, raw, out, n_in)
    assert np.allclose(w, quants.dequantize(raw, kind).reshape(out, n_in), rtol=2**-22, atol=0)
    error = np.abs(whole.double().numpy() - seen @ w.T)
    assert (error <= packed_rounding(kind, n_in) * (np.abs(seen) @ parts.T)).all()
    for rows in range(1, 17):
        assert torch.equal(layer(x[:rows]), whole[:rows]), rows
    for first, rows in ((3, 2), (7, 5), (12, 17), (21, 19), (39, 1)):
        assert torch.equal(layer(x[first : first + rows]), whole[first : first + rows]), (first, rows)


def test_weights_the_build_does_not_pack_keep_the_files_blocks():
    """Types without packed kernels, and rows that fill no whole group, stay on the file's blocks
    (summed as vec_dot sums them); a weight side by side with a packed one keeps its own kind."""
    rng = np.random.default_rng(9)
    for kind, out in ((QType.Q8_0, 64), (QType.Q4_K, max(GROUP, 8) + 4)):
        plain = Weight(int(kind), np.ascontiguousarray(random_blocks(kind, rng, out)), IN)
        assert NATIVE.pack(plain) is plain


@pytest.mark.parametrize("out", [1, 15, 17, 50, 337])
def test_every_output_is_written_whatever_the_threads_shares(out):
    """The threads split a weight's rows into contiguous shares of 16-row chunks, then help with
    what is left of the others': any row count (one chunk, a partial last one, shares of unequal
    length) comes out whole, into an output whose unwritten values would be NaN."""
    rng = np.random.default_rng(out)
    w, dense = weight(QType.Q4_K, rng, out)
    x = torch.from_numpy(rng.standard_normal((3, IN), dtype=np.float32))
    got = torch.full((3, out + 2), float("nan"))
    NATIVE.matmul(w.kind, w.blocks, x, got, 1)
    weights = torch.from_numpy(dense)
    want = x @ weights.t()
    assert got[:, 0].isnan().all() and got[:, -1].isnan().all()  # nothing outside its columns
    scale = x.norm(dim=1)[:, None] * weights.norm(dim=1)[None]  # |x||w|: the activations' rounding
    assert ((got[:, 1:-1] - want).abs() <= 0.02 * scale).all()


@pytest.mark.parametrize("groups", [1, 3, 21])
@pytest.mark.parametrize("kind", PACKED_KINDS, ids=str)
def test_every_packed_output_is_written_whatever_the_threads_shares(kind, groups):
    """The threads split a packed weight's groups as they split rows (in 16s), each group whole:
    any count of groups comes out whole, each output what the weight's product gives it alone."""
    if not packs(kind):
        pytest.skip(f"this build does not pack {kind.name}")
    rng = np.random.default_rng(groups)
    out = groups * GROUP
    packed = NATIVE.pack(Weight(int(kind), np.ascontiguousarray(random_blocks(kind, rng, out)), IN))
    x = torch.from_numpy(rng.standard_normal((5, IN), dtype=np.float32))
    got = torch.full((5, out + 2), float("nan"))
    NATIVE.product(packed.product_kind, packed.address, out, x, got, 1)
    assert got[:, 0].isnan().all() and got[:, -1].isnan().all()
    assert torch.equal(got[:, 1:-1], NativeLinear(NATIVE, [packed])(x))
    for row in range(5):
        assert torch.equal(NativeLinear(NATIVE, [packed])(x[row : row + 1])[0], got[row, 1:-1])


@pytest.mark.parametrize(
    "kinds", [(QType.Q4_K, QType.Q8_0, QType.Q6_K), (QType.Q5_0, QType.Q8_0, QType.Q5_0)], ids=str
)
def test_weights_side_by_side_fill_one_output(kinds):
    """q, k and v of different types (a Q4_K_M file keeps v in Q6_K; a 896-wide one Q5_0 and Q8_0)
    in one call, packed where the build packs them: the activations quantized again where a
    weight's activation type differs from the one before's (Q8_K, Q8_0, then Q8_K again), their
    extras for packed rows beside them; each output as the weight's own product gives it."""
    rng = np.random.default_rng(5)
    parts = [NATIVE.pack(weight(kind, rng, out)[0]) for kind, out in zip(kinds, (64, 32, 32), strict=True)]
    joined = NativeLinear(NATIVE, parts)
    x = torch.randn(6, IN)
    alone = torch.full((6, 128), float("nan"))
    for column, w in zip((0, 64, 96), parts, strict=True):
        NATIVE.product(w.product_kind, w.address, w.out_features, x, alone, column)
    assert torch.equal(joined(x), alone)


def test_q8_k_activations_are_ggmls_quantization_bit_for_bit():
    """kquant.c's vectorized Q8_K blocks are ggml's reference's: scale from the first value of
    the largest magnitude (a tie of +a and -a included), values rounded half to even at the
    float's rounding, clamped at 127; a block of zeros all zero."""
    rng = np.random.default_rng(0)
    blocks = [
        rng.standard_normal(256) * 3,
        rng.standard_normal(256) * 1e-30,  # a scale near the floats' smallest
        rng.standard_normal(256) * 1e30,
        np.zeros(256),
        np.round(rng.standard_normal(256) * 20) / 2,  # many halves and ties of magnitude
        np.concatenate([[-5.0], rng.uniform(-5, 5, 254), [5.0]]),  # -a first, +a last
        np.concatenate([rng.uniform(-5, 5, 100), [5.0, -5.0], rng.uniform(-5, 5, 154)]),
        (np.arange(256) - 128.0) * 0.25,
    ]
    for scale in (1.0, 0.1, 7.3):  # values landing on .5 steps for some of these
        blocks.append((np.arange(256) % 17 - 8) * scale)
    x = torch.tensor(np.concatenate(blocks), dtype=torch.float32)
    got = NATIVE.quantized_row(QType.Q8_K, x)
    assert got == NATIVE.quantized_row(QType.Q8_K, x, reference=True)
    assert got != bytes(len(got))
    with pytest.raises(ValueError):
        NATIVE.quantized_row(QType.Q8_K, x[:100])


def test_rms_norm_is_the_models_norm_and_each_row_alone():
    """One C call for the lean forward's norms: torch's norm to float rounding, and every row
    the same in a pass of any length."""
    torch.manual_seed(0)
    x = torch.randn(33, 576) * torch.logspace(-3, 3, 33)[:, None]
    w = torch.randn(576)
    got = NATIVE.rms_norm(x, w, 1e-5)
    want = torch.nn.functional.rms_norm(x, (576,), w, 1e-5)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    for first, rows in ((0, 1), (5, 3), (32, 1)):
        assert torch.equal(NATIVE.rms_norm(x[first : first + rows], w, 1e-5), got[first : first + rows])


@pytest.mark.parametrize("dim", [32, 64, 68, 128])  # eight-lane sums, and a tail past them
# Query heads a kv head serves: 3 (SmolLM2), 6 (Qwen2.5 1.5B), 7 (Qwen2.5 0.5B), 1 (no grouping).
@pytest.mark.parametrize(("heads", "kv_heads"), [(6, 2), (12, 2), (7, 1), (4, 4)])
def test_attention_rotates_caches_and_attends_each_row_alone(dim, heads, kv_heads):
    """One call a layer: q and k rotated (complex factors, q's scale in them), k and v written
    to the cache, softmax attention over each row's keys; a row the same in any pass."""
    torch.manual_seed(0)
    capacity, start, rows = 512, 300, 40
    cache = torch.randn(2 * kv_heads, capacity, dim)
    qkv = torch.randn(rows, heads + 2 * kv_heads, dim) * 0.5
    angles = torch.rand(rows, heads + kv_heads, dim // 2) * 6.3
    rotary = torch.polar(torch.rand(rows, heads + kv_heads, 1) + 0.1, angles)
    got = NATIVE.attention(qkv, rotary, cache, start)
    turned = torch.view_as_real(
        torch.view_as_complex(qkv[:, : heads + kv_heads].reshape(rows, -1, dim // 2, 2)) * rotary
    )
    q, k = turned[:, :heads].reshape(rows, heads, dim), turned[:, heads:].reshape(rows, kv_heads, dim)
    keys, values = cache[:kv_heads], cache[kv_heads:]
    assert torch.allclose(keys[:, start : start + rows], k.transpose(0, 1), atol=1e-5)
    assert torch.equal(values[:, start : start + rows], qkv[:, heads + kv_heads :].transpose(0, 1))
    for r in (0, 17, 39):
        for h in range(heads):
            n = start + r + 1
            kv = h // (heads // kv_heads)
            probs = torch.softmax(q[r, h] @ keys[kv, :n].t(), dim=-1)
            assert torch.allclose(got[r, h], probs @ values[kv, :n], atol=1e-5)
    for first, rows in ((0, 1), (5, 3), (20, 20)):
        alone = NATIVE.attention(
            qkv[first : first + rows], rotary[first : first + rows], cache, start + first
        )
        assert torch.equal(alone, got[first : first + rows]), rows


def test_swiglu_is_silu_of_gate_times_up_each_row_alone():
    torch.manual_seed(0)
    gate_up = torch.randn(9, 2 * 100) * 4
    got = NATIVE.swiglu(gate_up)
    gate, up = gate_up.split(100, dim=1)
    assert torch.allclose(got, torch.nn.functional.silu(gate) * up, rtol=1e-5, atol=1e-6)
    for first, rows in ((0, 1), (4, 5)):
        assert torch.equal(NATIVE.swiglu(gate_up[first : first + rows]), got[first : first + rows])


def test_top_is_torchs_topk_with_ties_to_the_lower_index():
    torch.manual_seed(0)
    x = torch.randn(5, 3000)
    x[1, 100:400] = 7.0  # ties across the cut
    x[2] = float("-inf")  # a row with no allowed token
    x[2, 17] = 1.0
    x[3, ::2] = float("-inf")
    got = NATIVE.top(x, 129)
    want = x.topk(129, dim=-1)
    assert torch.equal(got.values, want.values)
    assert torch.equal(got.indices[[0, 3, 4]], want.indices[[0, 3, 4]])
    assert got.indices[1, :129].tolist() == list(range(100, 229))
    assert got.indices[2].tolist() == [17, *(i for i in range(129) if i != 17)]
    assert torch.equal(NATIVE.top(x[4:], 129).indices, got.indices[4:])


def test_a_products_residual_is_added_in_the_same_call():
    rng = np.random.default_rng(3)
    w, _ = weight(QType.Q4_K, rng, 64)
    linear = NativeLinear(NATIVE, [w])
    x, residual = torch.randn(3, IN), torch.randn(3, 64)
    assert torch.equal(linear(x, residual), residual + linear(x))


@pytest.mark.parametrize(
    "arch,kind",
    [("qwen2", QType.Q8_0), ("llama", QType.Q4_0), ("qwen3", QType.F16)],
    ids=["qwen2", "llama", "qwen3"],
)
def test_every_layer_in_one_call_is_bit_for_bit_the_calls_one_by_one(arch, kind, tmp_path, monkeypatch):
    """``NativeLayers`` (shipped) against the per-call path over the same file, for a prefill,
    steps and a verification pass: the same logits and the same cache, bit for bit. Qwen2's q
    and k come in rotate-half order with biases; Qwen3's head norms keep it on the calls."""
    from speculative_complete.decoding.forward.gguf_loader import from_gguf
    from speculative_complete.decoding.forward.native.serving import kernels
    from tests.support.tiny_architectures import tiny, write_gguf

    monkeypatch.setenv("LSP_NATIVE", "1")
    kernels.cache_clear()
    path = tmp_path / f"{arch}.gguf"
    write_gguf(tiny(arch, seed=5), arch, path, kind)
    shipped, calls = from_gguf(str(path)), from_gguf(str(path))
    assert (shipped.native_layers is None) == (arch == "qwen3")
    calls.native_layers = None
    tokens = torch.randint(0, shipped.vocab_size, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    results = []
    for forward in (shipped, calls):
        cache = forward.new_cache()
        logits = [forward(tokens[:30], cache), forward(tokens[30:31], cache), forward(tokens[31:35], cache)]
        cache.crop(-2)
        logits.append(forward(tokens[35:40], cache))
        results.append((logits, cache.kv[:, :, : cache.length].clone()))
    (got, got_kv), (want, want_kv) = results
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert torch.equal(got_kv, want_kv)
    kernels.cache_clear()


@pytest.mark.parametrize("kind", KINDS, ids=str)
def test_each_rows_norm_is_its_dequantized_norm_never_short(kind):
    """The output layer's bound is a row's norm times the activations' error: the norms
    (``Kernels.row_norms``, split between threads) are the rows' own, rounded up, for every row."""
    w, dense = weight(kind, np.random.default_rng(int(kind) + 7), out=257)
    exact = np.linalg.norm(dense.astype(np.float64), axis=1)
    norms = NATIVE.row_norms(w.kind, w.blocks, w.width).double().numpy()
    assert (norms >= exact).all() and (norms <= exact * (1 + 2**-22)).all()


@pytest.mark.parametrize(
    "kind", [QType.Q8_0, QType.Q6_K, QType.Q4_K, QType.Q5_K, QType.F16], ids=lambda k: k.name
)
def test_the_native_output_layers_greedy_choice_is_exact_among_any_allowed_tokens(kind):
    """With two candidates a row's best token, or its best allowed one, is mostly outside them:
    the bound finds it and computes it exactly (against the gguf package's own dequantization)."""
    vocab = 1024
    rng = np.random.default_rng(12)
    w, dense = weight(kind, rng, vocab)
    assert NativeOutputLayer.fits(NATIVE, w)
    head = NativeOutputLayer(NATIVE, w)
    assert torch.equal(head.rows(torch.arange(vocab)), torch.from_numpy(dense))
    head.GREEDY_CANDIDATES = 2
    x = torch.randn(24, IN)
    fp32 = x @ torch.from_numpy(dense).t()
    allowed = [torch.from_numpy(rng.choice(vocab, size=n, replace=False)) for n in (1, 3, 40, 700) * 5]
    allowed += [None] * 4
    logits = head(x, allowed, greedy_only=True)
    for row, ids in enumerate(allowed):
        ids = torch.arange(vocab) if ids is None else ids
        assert ids[logits[row, ids].argmax()] == ids[fp32[row, ids].argmax()], row
        assert logits[row].argmax() == fp32[row].argmax(), row
    assert head.repaired > 0 or kind == QType.F16  # fp16 activations: the bound alone certifies
    for rows in (1, 5):
        assert torch.equal(head(x[:rows], greedy_only=True), head(x, greedy_only=True)[:rows])


@pytest.mark.parametrize("kind", [QType.Q8_0, QType.Q6_K], ids=lambda k: k.name)
def test_a_draft_output_layer_is_the_native_product_of_the_first_rows_and_the_special_ones(kind):
    """A draft model's output layer (``DraftOutputLayer``): the logits of its first rows and of
    its special tokens past them, bit for bit the products of those rows (packed where the build
    packs Q6_K and they fill whole groups), -inf between, a row alike in any pass; an allowed
    list keeps its own ids (those past the logits dropped); rows by id read every row."""
    vocab, kept, special = 1024, 512, [700, 1000, 3]  # 512 rows fill whole packed groups
    w, dense = weight(kind, np.random.default_rng(int(kind) + 3), vocab)
    full = NativeLinear(NATIVE, [NATIVE.pack(w)])
    x = torch.randn(9, IN)
    plain = DraftOutputLayer(NATIVE, w, kept)
    assert plain.out_features == kept and plain.packed == (kind == QType.Q6_K and GROUP > 0)
    assert torch.equal(plain(x), full(x)[:, :kept])
    head = DraftOutputLayer(NATIVE, w, kept, special)
    logits = head(x)
    assert logits.shape == (9, 1001) == (9, head.out_features)
    assert torch.equal(logits[:, :kept], full(x)[:, :kept])
    on_blocks = NativeLinear(NATIVE, [w])(x)  # the special rows fill no packed group: the file's blocks
    assert torch.equal(logits[:, [700, 1000]], on_blocks[:, [700, 1000]])
    assert torch.isinf(logits).sum() == 9 * (1001 - kept - 2)
    assert torch.equal(head(x[:1]), logits[:1])
    last = torch.tensor([0, vocab - 1])
    assert torch.equal(head.rows(last), torch.from_numpy(dense[last.numpy()]))
    restricted = head(x[:2], [torch.tensor([3, 700, 800, 1023]), None])
    assert torch.isfinite(restricted[0]).nonzero().flatten().tolist() == [3, 700]
    assert torch.equal(restricted[0, [3, 700]], logits[0, [3, 700]]) and torch.equal(restricted[1], logits[1])


def test_a_draft_model_from_a_file_computes_the_first_draft_rows_of_its_output_layer(tmp_path):
    """``from_gguf(draft=True)``: the same layers, an approximate output layer of ``DRAFT_ROWS``
    rows at most (the tiny model's are fewer: all of them), each logit the target's approximate
    product; the target's own stays certified."""
    from speculative_complete.decoding.forward.gguf_loader import from_gguf
    from tests.support.tiny_architectures import VOCAB, tiny, write_gguf

    path = tmp_path / "draft.gguf"
    write_gguf(tiny("qwen2", seed=9), "qwen2", path, QType.Q8_0)
    target, draft = from_gguf(str(path)), from_gguf(str(path), draft=True)
    assert isinstance(target.output_layer, NativeOutputLayer)
    assert isinstance(draft.output_layer, DraftOutputLayer)
    assert draft.output_layer.out_features == min(DRAFT_ROWS, VOCAB) == draft.vocab_size
    tokens = [(5 * i) % VOCAB for i in range(20)]
    logits = draft(tokens, draft.new_cache())
    assert logits.shape == (len(tokens), VOCAB)
    cache = target.new_cache()
    target(tokens, cache)  # the same layers: the same final rows, which the output layers read
    assert torch.equal(logits, target.output_layer.linear(cache.hidden[: len(tokens)]))


def test_types_whose_bound_cannot_be_told_keep_the_torch_output_layer():
    """Q4_1 and Q5_1 multiply with Q8_1 activations, whose block sums are rounded to fp16 again:
    no bound, so their output layer stays on the 4-bit kernel (``QuantizedOutputLayer``)."""
    w, _ = weight(QType.Q4_1, np.random.default_rng(1))
    assert not NativeOutputLayer.fits(NATIVE, w)


@pytest.mark.parametrize(
    "kind,setting,native",
    [
        (QType.Q8_0, None, True),  # the default model's types: llama.cpp's kernels too
        (QType.Q5_0, None, True),  # 5-bit blocks (and K-quants)
        (QType.Q5_0, "0", False),
        (QType.Q8_0, "0", False),  # torch's 4-bit kernel where asked for
        (QType.Q8_0, "1", True),
    ],
)
def test_every_file_takes_the_native_kernels_where_built_unless_asked_otherwise(
    kind, setting, native, tmp_path, monkeypatch
):
    """The choice is the build's and ``LSP_NATIVE``'s, never a timing nor the file's types:
    products, attention and output layer all on the chosen kernels, and the forward computes
    the model either way."""
    from speculative_complete.decoding.forward.gguf_loader import from_gguf
    from speculative_complete.decoding.forward.native.serving import kernels
    from tests.support.tiny_architectures import VOCAB, tiny, write_gguf

    if setting is None:
        monkeypatch.delenv("LSP_NATIVE", raising=False)
    else:
        monkeypatch.setenv("LSP_NATIVE", setting)
    kernels.cache_clear()
    model = tiny("qwen2", seed=5)
    path = tmp_path / f"{kind.name}.gguf"
    write_gguf(model, "qwen2", path, kind)
    forward = from_gguf(str(path))
    assert (forward.native is not None) == native
    products = [m for layer in forward.layers for m in vars(layer).values() if isinstance(m, torch.nn.Module)]
    assert len(products) == 4 * len(forward.layers)  # qkv, out, gate_up, down
    assert all(isinstance(m, NativeLinear) == native for m in products)
    tokens = [(7 * i) % VOCAB for i in range(40)]
    want = model(input_ids=torch.tensor([tokens])).logits[0]
    assert torch.allclose(forward(tokens, forward.new_cache()), want, atol=0.15)
    kernels.cache_clear()


@pytest.mark.parametrize("kind", [QType.Q4_K, QType.Q6_K, QType.Q5_0, QType.Q8_0], ids=lambda k: k.name)
def test_the_output_layers_bound_holds_for_every_logit(kind):
    """What the certificate rests on: every logit of the fast product (Q6_K and Q5_0 packed where
    the build packs them; Q4_K, whose two parts round by their own magnitudes, on ggml's sums)
    within its row's norm times its row's slack of the exact product of the file's weights and the
    activations (float64), whatever the activations' sizes."""
    vocab, n_in = 512, 1536
    rng = np.random.default_rng(30 + int(kind))
    raw = np.ascontiguousarray(random_blocks(kind, rng, vocab, n_in))
    head = NativeOutputLayer(NATIVE, Weight(int(kind), raw, n_in))
    assert (head.weight.packed is not None) == (kind != QType.Q4_K and packs(kind))
    if kind in PACKED_KINDS:
        w, _ = k_quant_values(kind, raw, vocab, n_in)
    else:
        w = quants.dequantize(raw, kind).reshape(vocab, n_in).astype(np.float64)
    x = torch.randn(6, n_in, generator=torch.Generator().manual_seed(2)) * torch.logspace(-2, 2, 6)[:, None]
    logits, slack = head._approximate(x)
    bound = head.norms.double().numpy()[None] * slack.double().numpy()
    assert (np.abs(logits.double().numpy() - x.double().numpy() @ w.T) <= bound).all()


def k_quant_gguf(path, layers: int = 2) -> None:
    """A Qwen2 GGUF of random K-quant blocks as a Q4_K_M file mixes them (Q4_K; Q6_K for v, every
    other down projection and the untied output layer), 256 wide so that every product packs."""
    from gguf import GGUFWriter

    rng = np.random.default_rng(11)
    dim, ffn, heads, kv_heads, vocab = 256, 512, 4, 2, 512
    writer = GGUFWriter(str(path), "qwen2")
    writer.add_block_count(layers)
    writer.add_context_length(1024)
    writer.add_embedding_length(dim)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1e6)

    def add(name: str, kind: QType, rows: int, width: int) -> None:
        writer.add_tensor(name, random_blocks(kind, rng, rows, width), raw_dtype=kind)

    def vector(name: str, size: int, around: float) -> None:
        writer.add_tensor(name, (around + 0.1 * rng.standard_normal(size)).astype(np.float32))

    add("token_embd.weight", QType.Q4_K, vocab, dim)
    add("output.weight", QType.Q6_K, vocab, dim)
    vector("output_norm.weight", dim, 1.0)
    kv = kv_heads * dim // heads
    for i in range(layers):
        for name, kind, rows, width in (
            ("attn_q", QType.Q4_K, dim, dim),
            ("attn_k", QType.Q4_K, kv, dim),
            ("attn_v", QType.Q6_K, kv, dim),
            ("attn_output", QType.Q4_K, dim, dim),
            ("ffn_gate", QType.Q4_K, ffn, dim),
            ("ffn_up", QType.Q4_K, ffn, dim),
            ("ffn_down", QType.Q6_K if i % 2 else QType.Q4_K, dim, ffn),
        ):
            add(f"blk.{i}.{name}.weight", kind, rows, width)
        for name, size in (("attn_q", dim), ("attn_k", kv), ("attn_v", kv)):
            vector(f"blk.{i}.{name}.bias", size, 0.0)
        vector(f"blk.{i}.attn_norm.weight", dim, 1.0)
        vector(f"blk.{i}.ffn_norm.weight", dim, 1.0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_k_quant_model_computes_each_row_the_same_in_any_pass(tmp_path, monkeypatch):
    """A model of packed Q4_K and Q6_K weights end to end: the logits of a prefill, steps, verify
    passes and a pass after a crop, bit for bit whatever the split, and the every-layer call
    bit for bit the calls one by one."""
    from speculative_complete.decoding.forward.gguf_loader import from_gguf
    from speculative_complete.decoding.forward.native.serving import kernels

    monkeypatch.setenv("LSP_NATIVE", "1")
    kernels.cache_clear()
    path = tmp_path / "k_quants.gguf"
    k_quant_gguf(path)
    shipped, calls = from_gguf(str(path)), from_gguf(str(path))
    products = [m for layer in shipped.layers for m in (layer.qkv, layer.out, layer.gate_up, layer.down)]
    assert all(w.packed is not None for m in products for w in m.weights) == bool(GROUP)
    assert shipped.native_layers is not None
    calls.native_layers = None
    tokens = torch.randint(0, shipped.vocab_size, (90,), generator=torch.Generator().manual_seed(1)).tolist()
    whole = shipped(tokens, shipped.new_cache())
    for forward in (shipped, calls):
        cache, rows, done = forward.new_cache(), [], 0
        for n in (40, 1, 2, 8, 1, 16, 3, 19):
            rows.append(forward(tokens[done : done + n], cache))
            done += n
        assert torch.equal(torch.cat(rows), whole)
        cache.crop(-5)
        assert torch.equal(forward(tokens[85:90], cache), whole[85:90])
    kernels.cache_clear()
