// Q4_K, Q6_K and (AVX-512 only) Q5_0 weights packed at load into groups of interleaved rows, and
// their products.
//
// Why: a decode step reads every weight once, and on the file's own blocks (one row's 256 values
// after another's) each output is a sum across a vector's lanes, its 6-bit scales unpacked row by
// row: ggml's vec_dot (and krows.c and kpairs.c, which sum as it does) ran at two thirds of the
// memory's rate on the 2-core Zen 4, where this machine's llama.cpp packs Q4_K rows eight to a
// register (repack.cpp). Here a group of G rows (16 with AVX-512 VNNI, 8 with AVX2) is packed so
// that each 32-bit lane of a register holds one row's weights for four adjacent inputs: one
// multiply-add instruction takes four inputs of every row of the group, each lane is one output,
// and no sum crosses lanes. Scales and mins are unpacked to a byte each at load. Q5_0 (the layers
// 896 wide of a Qwen2.5 0.5B Q4_K_M, which K-quants' 256-value blocks do not divide) ran at two
// thirds of the memory's rate on vec_dot's fifth-bit shuffles; packed, its fifth bits are masks.
//
// Batch invariance, by construction as everywhere in the lean forward: an output (activation row
// r, weight row o) is computed by the same operations in any pass. The integer sums are exact
// (their order does not matter); the float operations are, for each 256-value block b in order,
//     acc = fma(d_o * dx_rb, (float) isum_rb, acc)        (Q4_K then: acc = fnma(dmin_o * dx_rb, (float) msum_rb, acc))
// (Q5_0: the same per 32-value block, without the mins) from acc = 0, each row its own
// accumulators, whatever rows or threads share the pass (a thread computes whole groups). This
// file is compiled without contraction (-ffp-contract=off), so only these written fused
// operations fuse, alike in every kernel.
// The order differs from ggml's vec_dot (which sums eight lanes of partial products), so outputs
// are no longer bit for bit vec_dot's: tests/decoding/forward/test_native.py compares them with the exact product
// of the file's weights and the quantized activations (within the bound below) and each row of a
// pass with the same row alone.
// Rounding: each product d * dx, each conversion of an integer above 2^24 and each fused add
// rounds once, so an output differs from the exact sum of its weights times the quantized
// activations by at most (2 nb + 2) 2^-24 (Q6_K and Q5_0: nb + 2; nb = n / 256 blocks, Q5_0's
// n / 32) of the sum of its terms' magnitudes (Q6_K, Q5_0: |w x| summed; Q4_K: |d sc q x| +
// |dmin m x|, its two parts). For Q6_K and Q5_0 that is well inside the (n / 32 + 8) 2^-22 |w| |x|
// NativeOutputLayer's bound allows for the products' float sums; Q4_K's parts can outweigh |w|,
// so that layer packs no Q4_K rows.

#include "kpacked.h"

#include <string.h>

#include "ggml.h"
#define GGML_COMMON_DECL_C
#include "ggml-common.h"
#include "krows.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define LSQ_G 16
#define PACKED_512 1
#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define LSQ_G 8
#define PACKED_256 1
#else
#define LSQ_G 0
#endif

// Q4_K group block (per 256 inputs): d[G] and dmin[G] as fp16, the 8 sub-blocks' scales [8][G]
// and mins in pairs [4][G][2] as bytes, then the weights: [8 sub-blocks][4][G lanes][4 bytes],
// each byte one input of sub-block j's first 16 (low nibble) and the input 16 after it (high).
#define Q4K_D 0
#define Q4K_DMIN (2 * LSQ_G)
#define Q4K_SC (4 * LSQ_G)
#define Q4K_MIN (12 * LSQ_G)
#define Q4K_QS (20 * LSQ_G)
#define Q4K_BLOCK (148 * LSQ_G)
// Q6_K group block: d[G] as fp32, the 16 sub-blocks' scales as bytes ([16][G] with AVX-512, in
// pairs [8][G][2] with AVX2), the low 4 bits [16 sub-blocks][2][G][4] (a sub-block's inputs
// 0-3 and 4-7 in the low and high nibbles of the first, 8-11 and 12-15 of the second) and the
// high 2 bits [16][G][4] (inputs 0-3, 4-7, 8-11, 12-15 in bits 0-1, 2-3, 4-5, 6-7).
#define Q6K_D 0
#define Q6K_SC (4 * LSQ_G)
#define Q6K_QL (20 * LSQ_G)
#define Q6K_QH (148 * LSQ_G)
#define Q6K_BLOCK (212 * LSQ_G)
// Q5_0 group block (per 32 inputs; AVX-512 only): the low 4 bits [4][G][4] (inputs 4t..4t+3 of
// each row in the low nibbles of register t, the inputs 16 after them in the high nibbles), the
// fifth bits as eight 64-bit masks (one per register those unpack to: bit 4l + i is lane l's byte
// i), then d[G] as fp16. 22 bytes a row, as the file's blocks.
#define Q50_QS 0
#define Q50_QH (16 * LSQ_G)
#define Q50_D (20 * LSQ_G)
#define Q50_BLOCK (22 * LSQ_G)

int lsq_packed_rows(void) { return LSQ_G; }

size_t lsq_packed_group_bytes(int type, int64_t n) {
    if (LSQ_G == 0 || n % ggml_blck_size((enum ggml_type) type)) return 0;
    switch (type) {
        case GGML_TYPE_Q4_K: return (size_t) (n / QK_K) * Q4K_BLOCK;
        case GGML_TYPE_Q6_K: return (size_t) (n / QK_K) * Q6K_BLOCK;
#if defined(PACKED_512)
        case GGML_TYPE_Q5_0: return (size_t) (n / QK5_0) * Q50_BLOCK;
#endif
        default: return 0;
    }
}

size_t lsq_packed_bytes(int type, int64_t rows, int64_t n) {
    if (LSQ_G == 0 || rows % LSQ_G) return 0;
    return (size_t) (rows / LSQ_G) * lsq_packed_group_bytes(type, n);
}

// ggml's get_scale_min_k4: sub-block j's 6-bit scale and min.
static void scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
    }
}

// Lane l of group block `out` from the file's Q4_K block x.
static void pack_q4_K(const block_q4_K *x, int l, uint8_t *out) {
    uint8_t q[QK_K];
    for (int c = 0; c < 4; c++) {  // as ggml lays them: 32 bytes of sub-blocks 2c (low) and 2c + 1 (high)
        for (int i = 0; i < 32; i++) {
            q[64 * c + i] = x->qs[32 * c + i] & 0xF;
            q[64 * c + 32 + i] = x->qs[32 * c + i] >> 4;
        }
    }
    memcpy(out + Q4K_D + 2 * l, &x->d, 2);
    memcpy(out + Q4K_DMIN + 2 * l, &x->dmin, 2);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        scale_min_k4(j, x->scales, &sc, &m);
        out[Q4K_SC + j * LSQ_G + l] = sc;
        out[Q4K_MIN + (j / 2) * 2 * LSQ_G + 2 * l + (j & 1)] = m;
        for (int t = 0; t < 4; t++) {
            uint8_t *to = out + Q4K_QS + ((j * 4 + t) * LSQ_G + l) * 4;
            for (int i = 0; i < 4; i++) to[i] = q[32 * j + 4 * t + i] | (q[32 * j + 16 + 4 * t + i] << 4);
        }
    }
}

// Lane l of group block `out` from the file's Q6_K block x.
static void pack_q6_K(const block_q6_K *x, int l, uint8_t *out) {
    uint8_t q[QK_K];  // 0..63, as ggml's dequantize_row_q6_K reads them
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = x->ql + 64 * h, *qh = x->qh + 32 * h;
        for (int i = 0; i < 32; i++) {
            q[128 * h + i] = (ql[i] & 0xF) | (((qh[i] >> 0) & 3) << 4);
            q[128 * h + i + 32] = (ql[i + 32] & 0xF) | (((qh[i] >> 2) & 3) << 4);
            q[128 * h + i + 64] = (ql[i] >> 4) | (((qh[i] >> 4) & 3) << 4);
            q[128 * h + i + 96] = (ql[i + 32] >> 4) | (((qh[i] >> 6) & 3) << 4);
        }
    }
    const float d = ggml_fp16_to_fp32(x->d);
    memcpy(out + Q6K_D + 4 * l, &d, 4);
    for (int k = 0; k < 16; k++) {
#if defined(PACKED_512)
        out[Q6K_SC + k * LSQ_G + l] = (uint8_t) x->scales[k];
#else
        out[Q6K_SC + (k / 2) * 2 * LSQ_G + 2 * l + (k & 1)] = (uint8_t) x->scales[k];
#endif
        const uint8_t *p = q + 16 * k;
        for (int i = 0; i < 4; i++) {
            out[Q6K_QL + ((2 * k * LSQ_G) + l) * 4 + i] = (p[i] & 0xF) | ((p[4 + i] & 0xF) << 4);
            out[Q6K_QL + (((2 * k + 1) * LSQ_G) + l) * 4 + i] = (p[8 + i] & 0xF) | ((p[12 + i] & 0xF) << 4);
            out[Q6K_QH + (k * LSQ_G + l) * 4 + i] =
                (p[i] >> 4) | ((p[4 + i] >> 4) << 2) | ((p[8 + i] >> 4) << 4) | ((p[12 + i] >> 4) << 6);
        }
    }
}

// Lane l of group block `out` from the file's Q5_0 block x (lane 0 first: it clears the masks).
static void pack_q5_0(const block_q5_0 *x, int l, uint8_t *out) {
    uint8_t q[QK5_0];  // 0..31, as ggml's dequantize_row_q5_0 reads them (less 16)
    uint32_t qh;
    memcpy(&qh, x->qh, 4);
    for (int j = 0; j < 16; j++) {
        q[j] = (x->qs[j] & 0xF) | (((qh >> j) & 1) << 4);
        q[j + 16] = (x->qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
    }
    memcpy(out + Q50_D + 2 * l, &x->d, 2);
    uint64_t masks[8];
    if (l == 0) memset(out + Q50_QH, 0, sizeof(masks));
    memcpy(masks, out + Q50_QH, sizeof(masks));
    for (int t = 0; t < 4; t++) {
        for (int i = 0; i < 4; i++) {
            const uint8_t lo = q[4 * t + i], hi = q[16 + 4 * t + i];
            out[Q50_QS + (t * LSQ_G + l) * 4 + i] = (lo & 0xF) | ((hi & 0xF) << 4);
            masks[2 * t] |= (uint64_t) (lo >> 4) << (4 * l + i);
            masks[2 * t + 1] |= (uint64_t) (hi >> 4) << (4 * l + i);
        }
    }
    memcpy(out + Q50_QH, masks, sizeof(masks));
}

int lsq_pack(int type, const void *src, int64_t rows, int64_t n, int64_t first, int64_t count, void *dst) {
    const size_t group_bytes = lsq_packed_group_bytes(type, n);
    if (!group_bytes || !lsq_packed_bytes(type, rows, n) || first < 0 || first + count > rows / LSQ_G) return -1;
    const size_t row_bytes = ggml_row_size((enum ggml_type) type, n), block_bytes = ggml_type_size((enum ggml_type) type);
    const int64_t nb = n / ggml_blck_size((enum ggml_type) type);
    const size_t packed_block = group_bytes / (size_t) nb;
    for (int64_t g = first; g < first + count; g++) {
        uint8_t *group = (uint8_t *) dst + g * group_bytes;
        for (int l = 0; l < LSQ_G; l++) {
            const char *row = (const char *) src + (g * LSQ_G + l) * row_bytes;
            for (int64_t b = 0; b < nb; b++) {
                const void *x = row + b * block_bytes;
                uint8_t *to = group + b * packed_block;
                if (type == GGML_TYPE_Q4_K) pack_q4_K(x, l, to);
                else if (type == GGML_TYPE_Q6_K) pack_q6_K(x, l, to);
                else pack_q5_0(x, l, to);
            }
        }
    }
    return 0;
}

int64_t lsq_packed_extras_row(int dot_type, int64_t n) {
    if (LSQ_G == 0) return 0;
    if (dot_type == GGML_TYPE_Q8_K) return n / QK_K * LSQ_PACKED_EXTRAS;
    if (dot_type == GGML_TYPE_Q8_0 && lsq_packed_group_bytes(GGML_TYPE_Q5_0, QK5_0)) return n / QK8_0 * LSQ_PACKED_EXTRAS_Q8_0;
    return 0;
}

void lsq_packed_extras(int dot_type, const void *xq, int64_t blocks, int32_t *out) {
    if (dot_type == GGML_TYPE_Q8_0) {
        const block_q8_0 *y = xq;
        for (int64_t b = 0; b < blocks; b++) {
            int32_t sum = 0;
            for (int i = 0; i < QK8_0; i++) sum += y[b].qs[i];
            const float d = ggml_fp16_to_fp32(y[b].d);
            out[b * LSQ_PACKED_EXTRAS_Q8_0] = -16 * sum;
            memcpy(out + b * LSQ_PACKED_EXTRAS_Q8_0 + 1, &d, 4);
        }
        return;
    }
    const block_q8_K *y = xq;
    for (int64_t b = 0; b < blocks; b++) {
        int32_t *e = out + b * LSQ_PACKED_EXTRAS;
        for (int k = 0; k < 32; k++) {
            int32_t sum = 0;
            for (int i = 0; i < 8; i++) sum += y[b].qs[8 * k + i];
            e[k] = -32 * sum;
        }
        int16_t pairs[8];  // sub-block j's sum: its two sums of 16 (at most 32 * 128: exact)
        for (int j = 0; j < 8; j++) pairs[j] = (int16_t) (y[b].bsums[2 * j] + y[b].bsums[2 * j + 1]);
        memcpy(e + LSQ_PACKED_PAIRS, pairs, sizeof(pairs));
    }
}

#if LSQ_G

#include <immintrin.h>

#define ALWAYS_INLINE inline __attribute__((always_inline))

static ALWAYS_INLINE int32_t load_i32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

// Activation row r's Q8_K block b.
static ALWAYS_INLINE const block_q8_K *act(const char *xq, size_t xq_bytes, int r, int b) {
    return (const block_q8_K *) (xq + r * xq_bytes) + b;
}

// Ask for slice i of n of the group block at p, LSQ_PREFETCH_BYTES ahead (krows.h's distance): one
// slice per sub-block, so that the requests keep pace with the sums. All of a block's asked for at
// its start left the memory idle while the rows of a verify pass were being summed.
static ALWAYS_INLINE void ahead_of(const uint8_t *p, size_t block, int i, int n) {
    lsq_ahead(p + i * (block / n), block / n);
}

#if defined(PACKED_512)

// One Q4_K group (16 weight rows) against nr activation rows. Per sub-block of 32 inputs, each
// register of 64 weight bytes gives two registers of 16 rows x 4 inputs (low and high nibbles);
// the sub-block's eight are unpacked once for every row, each multiplied with the row's 4
// activations broadcast (dpbusd: exact int32 sums); the sub-block's two halves times its scale
// (one dpwssd, the halves put side by side by a byte shuffle off the multiply-adds' port: a
// mullo there, ten cycles of latency on each row's chain, held the passes of several rows well
// below what the multiply-adds allow); the mins' sum of pairs (dpwssd); two fused float
// operations a block.
static ALWAYS_INLINE void q4_K_group(int n, const uint8_t *w, const char *xq, size_t xq_bytes, const int32_t *ex,
                                     size_t ex_row, const int nr, const int ahead, float *y, size_t ldy) {
    const int nb = n / QK_K;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    // A byte shuffle's indices (within 16 bytes) that give each 32-bit lane its bytes 0-1 twice:
    // under a mask of bytes 2-3, a lane's low 16 bits to its high ones.
    const __m512i to_high = _mm512_set4_epi32(0x0D0C0D0C, 0x09080908, 0x05040504, 0x01000100);
    __m512 acc[LSQ_PACKED_ACT_ROWS];
    for (int r = 0; r < nr; r++) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t) b * Q4K_BLOCK;
        __m512i isum[LSQ_PACKED_ACT_ROWS];
        for (int r = 0; r < nr; r++) isum[r] = _mm512_setzero_si512();
        for (int j = 0; j < 8; j++) {
            if (ahead) ahead_of(blk, Q4K_BLOCK, j, 8);
            __m512i q[8];
            for (int t = 0; t < 4; t++) {
                const __m512i v = _mm512_load_si512(blk + Q4K_QS + (j * 4 + t) * 64);
                q[2 * t] = _mm512_and_si512(v, m4);
                q[2 * t + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            }
            // The scale in both 16-bit halves of its row's lane.
            const __m512i sc32 = _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *) (blk + Q4K_SC + 16 * j)));
            const __m512i sc = _mm512_or_si512(sc32, _mm512_slli_epi32(sc32, 16));
            for (int r = 0; r < nr; r++) {
                const int8_t *x = act(xq, xq_bytes, r, b)->qs + 32 * j;
                __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
                for (int t = 0; t < 4; t++) {
                    s0 = _mm512_dpbusd_epi32(s0, q[2 * t], _mm512_set1_epi32(load_i32(x + 4 * t)));
                    s1 = _mm512_dpbusd_epi32(s1, q[2 * t + 1], _mm512_set1_epi32(load_i32(x + 16 + 4 * t)));
                }
                // Each half's sum of 16 inputs fits 16 bits (|s| <= 16 * 15 * 128): both in one lane,
                // times the scale and added by one dpwssd.
                const __m512i halves = _mm512_mask_shuffle_epi8(s0, 0xCCCCCCCCCCCCCCCCull, s1, to_high);
                isum[r] = _mm512_dpwssd_epi32(isum[r], halves, sc);
            }
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *) (blk + Q4K_D)));
        const __m512 dmin = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *) (blk + Q4K_DMIN)));
        __m512i mins[4];
        for (int k = 0; k < 4; k++) mins[k] = _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i *) (blk + Q4K_MIN + 32 * k)));
        for (int r = 0; r < nr; r++) {
            const int32_t *pairs = ex + r * ex_row + b * LSQ_PACKED_EXTRAS + LSQ_PACKED_PAIRS;
            __m512i msum = _mm512_setzero_si512();
            for (int k = 0; k < 4; k++) msum = _mm512_dpwssd_epi32(msum, mins[k], _mm512_set1_epi32(pairs[k]));
            const __m512 dx = _mm512_set1_ps(act(xq, xq_bytes, r, b)->d);
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(isum[r]), acc[r]);
            acc[r] = _mm512_fnmadd_ps(_mm512_mul_ps(dmin, dx), _mm512_cvtepi32_ps(msum), acc[r]);
        }
    }
    for (int r = 0; r < nr; r++) _mm512_storeu_ps(y + r * ldy, acc[r]);
}

// One Q6_K group (16 weight rows) against nr activation rows. Per sub-block of 16 inputs: the
// 6-bit weights of 16 rows x 4 inputs from a low-nibble register and the high-bit register (a
// bitwise select, vpternlog), unsigned; each half of a row's sum (8 inputs) starts at -32 times
// its activations' sum (the weights' offset: ggml's too) and takes two dpbusd, then both halves
// are times the sub-block's scale by one dpwssd (a mullo there took two of the multiply-adds'
// port's cycles and ten of latency).
static ALWAYS_INLINE void q6_K_group(int n, const uint8_t *w, const char *xq, size_t xq_bytes, const int32_t *ex,
                                     size_t ex_row, const int nr, const int ahead, float *y, size_t ldy) {
    const int nb = n / QK_K;
    const __m512i low = _mm512_set1_epi8(0x0F);
    const __m512i m33 = _mm512_set1_epi8(0x33), mcc = _mm512_set1_epi8((char) 0xCC);
    const __m512i to_high = _mm512_set4_epi32(0x0D0C0D0C, 0x09080908, 0x05040504, 0x01000100);  // q4_K_group's
    __m512 acc[LSQ_PACKED_ACT_ROWS];
    for (int r = 0; r < nr; r++) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t) b * Q6K_BLOCK;
        __m512i isum[LSQ_PACKED_ACT_ROWS];
        for (int r = 0; r < nr; r++) isum[r] = _mm512_setzero_si512();
        for (int k = 0; k < 16; k++) {
            if (ahead) ahead_of(blk, Q6K_BLOCK, k, 16);
            const __m512i l0 = _mm512_load_si512(blk + Q6K_QL + (2 * k) * 64);
            const __m512i l1 = _mm512_load_si512(blk + Q6K_QL + (2 * k + 1) * 64);
            const __m512i h = _mm512_load_si512(blk + Q6K_QH + k * 64);
            // Inputs 0-3 take bits 0-1 of h to bits 4-5, 4-7 bits 2-3, 8-11 bits 4-5, 12-15 bits 6-7;
            // h & 0x33 and h & 0xCC shifted leave zeros in bits 6-7 (what a shift brings over from
            // the next byte lands in bits 0-3, which the select takes from the low nibbles).
            const __m512i h02 = _mm512_and_si512(h, m33), h13 = _mm512_and_si512(h, mcc);
            // 0xE4: bits of the first operand where the third is 1, else of the second.
            const __m512i w0 = _mm512_ternarylogic_epi32(l0, _mm512_slli_epi16(h02, 4), low, 0xE4);
            const __m512i w1 = _mm512_ternarylogic_epi32(_mm512_srli_epi16(l0, 4), _mm512_slli_epi16(h13, 2), low, 0xE4);
            const __m512i w2 = _mm512_ternarylogic_epi32(l1, h02, low, 0xE4);
            const __m512i w3 = _mm512_ternarylogic_epi32(_mm512_srli_epi16(l1, 4), _mm512_srli_epi16(h13, 2), low, 0xE4);
            const __m512i sc32 = _mm512_cvtepi8_epi32(_mm_load_si128((const __m128i *) (blk + Q6K_SC + 16 * k)));
            const __m512i sc = _mm512_mask_shuffle_epi8(sc32, 0xCCCCCCCCCCCCCCCCull, sc32, to_high);
            for (int r = 0; r < nr; r++) {
                const int8_t *x = act(xq, xq_bytes, r, b)->qs + 16 * k;
                const int32_t *e = ex + r * ex_row + b * LSQ_PACKED_EXTRAS + 2 * k;
                __m512i s0 = _mm512_set1_epi32(e[0]), s1 = _mm512_set1_epi32(e[1]);
                s0 = _mm512_dpbusd_epi32(s0, w0, _mm512_set1_epi32(load_i32(x)));
                s0 = _mm512_dpbusd_epi32(s0, w1, _mm512_set1_epi32(load_i32(x + 4)));
                s1 = _mm512_dpbusd_epi32(s1, w2, _mm512_set1_epi32(load_i32(x + 8)));
                s1 = _mm512_dpbusd_epi32(s1, w3, _mm512_set1_epi32(load_i32(x + 12)));
                // Each half's sum of 8 inputs fits 16 bits (|s| <= 8 * 32 * 127): both in one lane,
                // times the scale and added by one dpwssd.
                const __m512i halves = _mm512_mask_shuffle_epi8(s0, 0xCCCCCCCCCCCCCCCCull, s1, to_high);
                isum[r] = _mm512_dpwssd_epi32(isum[r], halves, sc);
            }
        }
        const __m512 d = _mm512_load_ps((const float *) (blk + Q6K_D));
        for (int r = 0; r < nr; r++) {
            const __m512 dx = _mm512_set1_ps(act(xq, xq_bytes, r, b)->d);
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(isum[r]), acc[r]);
        }
    }
    for (int r = 0; r < nr; r++) _mm512_storeu_ps(y + r * ldy, acc[r]);
}

// One Q5_0 group (16 weight rows) against nr activation rows (Q8_0 blocks). Per block of 32
// inputs: four registers of low nibbles give eight of 16 rows x 4 inputs, each given its fifth
// bits by a masked byte add; each row's sum starts at -16 times its activations' sum (the
// weights' offset, as in Q6_K), takes eight dpbusd (two chains), then one fused float operation.
static ALWAYS_INLINE void q5_0_group(int n, const uint8_t *w, const char *xq, size_t xq_bytes, const int32_t *ex,
                                     size_t ex_row, const int nr, const int ahead, float *y, size_t ldy) {
    const int nb = n / QK5_0;
    const __m512i m4 = _mm512_set1_epi8(0x0F), fifth = _mm512_set1_epi8(0x10);
    __m512 acc[LSQ_PACKED_ACT_ROWS];
    for (int r = 0; r < nr; r++) acc[r] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t) b * Q50_BLOCK;
        if (ahead) lsq_ahead(blk, Q50_BLOCK);
        __m512i q[8];
        for (int t = 0; t < 4; t++) {
            const __m512i v = _mm512_loadu_si512(blk + Q50_QS + 64 * t);
            q[2 * t] = _mm512_and_si512(v, m4);
            q[2 * t + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        }
        for (int k = 0; k < 8; k++) {
            uint64_t bits;
            memcpy(&bits, blk + Q50_QH + 8 * k, 8);
            q[k] = _mm512_mask_add_epi8(q[k], (__mmask64) bits, q[k], fifth);
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (blk + Q50_D)));
        for (int r = 0; r < nr; r++) {
            const int8_t *x = ((const block_q8_0 *) (xq + r * xq_bytes) + b)->qs;
            const int32_t *e = ex + r * ex_row + b * LSQ_PACKED_EXTRAS_Q8_0;
            __m512i s0 = _mm512_set1_epi32(e[0]), s1 = _mm512_setzero_si512();
            for (int t = 0; t < 4; t++) {
                s0 = _mm512_dpbusd_epi32(s0, q[2 * t], _mm512_set1_epi32(load_i32(x + 4 * t)));
                s1 = _mm512_dpbusd_epi32(s1, q[2 * t + 1], _mm512_set1_epi32(load_i32(x + 16 + 4 * t)));
            }
            float dx;
            memcpy(&dx, e + 1, 4);
            const __m512 isum = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(dx)), isum, acc[r]);
        }
    }
    for (int r = 0; r < nr; r++) _mm512_storeu_ps(y + r * ldy, acc[r]);
}

#else  // PACKED_256

// One Q4_K group (8 weight rows) against nr activation rows, without VNNI: per sub-block its
// eight registers of weights unpacked once, then row by row eight maddubs summed in 16 bits (at
// most 8 * 2 * 15 * 128 = 30720: exact) and one madd with the scale (repeated in both halves of
// each 32-bit lane). Row by row, so that a row's sum is done before the next one's starts: with
// every row's eight products in flight at once (the loops the other way round) the compiler kept
// them on the stack, 16 registers being too few.
static ALWAYS_INLINE void q4_K_group(int n, const uint8_t *w, const char *xq, size_t xq_bytes, const int32_t *ex,
                                     size_t ex_row, const int nr, const int ahead, float *y, size_t ldy) {
    const int nb = n / QK_K;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[LSQ_PACKED_ACT_ROWS];
    for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t) b * Q4K_BLOCK;
        __m256i isum[LSQ_PACKED_ACT_ROWS];
        for (int r = 0; r < nr; r++) isum[r] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            if (ahead) ahead_of(blk, Q4K_BLOCK, j, 8);
            __m256i q[8];
            for (int t = 0; t < 4; t++) {
                const __m256i v = _mm256_load_si256((const __m256i *) (blk + Q4K_QS + (j * 4 + t) * 32));
                q[2 * t] = _mm256_and_si256(v, m4);
                q[2 * t + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            }
            const __m128i sc8 = _mm_loadl_epi64((const __m128i *) (blk + Q4K_SC + 8 * j));
            const __m256i sc = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(sc8, sc8));
            for (int r = 0; r < nr; r++) {
                const int8_t *x = act(xq, xq_bytes, r, b)->qs + 32 * j;
                __m256i p[4];
                for (int t = 0; t < 4; t++)
                    p[t] = _mm256_add_epi16(_mm256_maddubs_epi16(q[2 * t], _mm256_set1_epi32(load_i32(x + 4 * t))),
                                            _mm256_maddubs_epi16(q[2 * t + 1], _mm256_set1_epi32(load_i32(x + 16 + 4 * t))));
                const __m256i s = _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3]));
                isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(s, sc));
            }
        }
        const __m256 d = _mm256_cvtph_ps(_mm_load_si128((const __m128i *) (blk + Q4K_D)));
        const __m256 dmin = _mm256_cvtph_ps(_mm_load_si128((const __m128i *) (blk + Q4K_DMIN)));
        for (int r = 0; r < nr; r++) {
            const int32_t *pairs = ex + r * ex_row + b * LSQ_PACKED_EXTRAS + LSQ_PACKED_PAIRS;
            __m256i msum = _mm256_setzero_si256();
            for (int k = 0; k < 4; k++) {
                const __m256i mins = _mm256_cvtepu8_epi16(_mm_load_si128((const __m128i *) (blk + Q4K_MIN + 16 * k)));
                msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mins, _mm256_set1_epi32(pairs[k])));
            }
            const __m256 dx = _mm256_set1_ps(act(xq, xq_bytes, r, b)->d);
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(isum[r]), acc[r]);
            acc[r] = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(msum), acc[r]);
        }
    }
    for (int r = 0; r < nr; r++) _mm256_storeu_ps(y + r * ldy, acc[r]);
}

// One Q6_K group (8 weight rows) against nr activation rows, without VNNI: per sub-block two
// 16-bit sums of two maddubs each (at most 2 * 2 * 63 * 128 = 32256: exact), each madd with the
// sub-block's scale; the weights' offset of 32 taken off per pair of sub-blocks as ggml's AVX2
// vec_dot takes it (32 times the scales times the activations' sums of 16).
static ALWAYS_INLINE void q6_K_group(int n, const uint8_t *w, const char *xq, size_t xq_bytes, const int32_t *ex,
                                     size_t ex_row, const int nr, const int ahead, float *y, size_t ldy) {
    (void) ex;
    (void) ex_row;
    const int nb = n / QK_K;
    const __m256i low = _mm256_set1_epi8(0x0F), high = _mm256_set1_epi8(0x30);
    const __m128i first = _mm_set_epi8(14, 14, 12, 12, 10, 10, 8, 8, 6, 6, 4, 4, 2, 2, 0, 0);
    const __m128i second = _mm_add_epi8(first, _mm_set1_epi8(1));
    __m256 acc[LSQ_PACKED_ACT_ROWS];
    for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t) b * Q6K_BLOCK;
        __m256i isum[LSQ_PACKED_ACT_ROWS];
        for (int r = 0; r < nr; r++) isum[r] = _mm256_setzero_si256();
        for (int m = 0; m < 8; m++) {
            if (ahead) ahead_of(blk, Q6K_BLOCK, m, 8);
            // The pair's scales per lane: (sc_2m, sc_2m + 1), and each repeated in both halves.
            const __m128i raw = _mm_load_si128((const __m128i *) (blk + Q6K_SC + 16 * m));
            const __m256i pair = _mm256_cvtepi8_epi16(raw);
            const __m256i sc_of[2] = {_mm256_cvtepi8_epi16(_mm_shuffle_epi8(raw, first)),
                                      _mm256_cvtepi8_epi16(_mm_shuffle_epi8(raw, second))};
            __m256i q[2][4];  // the pair's weights, unpacked once for every row
            for (int kk = 0; kk < 2; kk++) {
                const int k = 2 * m + kk;
                const __m256i l0 = _mm256_load_si256((const __m256i *) (blk + Q6K_QL + (2 * k) * 32));
                const __m256i l1 = _mm256_load_si256((const __m256i *) (blk + Q6K_QL + (2 * k + 1) * 32));
                const __m256i h = _mm256_load_si256((const __m256i *) (blk + Q6K_QH + k * 32));
                q[kk][0] = _mm256_or_si256(_mm256_and_si256(l0, low), _mm256_and_si256(_mm256_slli_epi16(h, 4), high));
                q[kk][1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low),
                                           _mm256_and_si256(_mm256_slli_epi16(h, 2), high));
                q[kk][2] = _mm256_or_si256(_mm256_and_si256(l1, low), _mm256_and_si256(h, high));
                q[kk][3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low),
                                           _mm256_and_si256(_mm256_srli_epi16(h, 2), high));
            }
            // Row by row, as q4_K_group (why there).
            for (int r = 0; r < nr; r++) {
                const int8_t *x = act(xq, xq_bytes, r, b)->qs + 32 * m;
                __m256i sum = _mm256_setzero_si256();
                for (int kk = 0; kk < 2; kk++) {
                    const int8_t *xk = x + 16 * kk;
                    const __m256i p01 = _mm256_add_epi16(_mm256_maddubs_epi16(q[kk][0], _mm256_set1_epi32(load_i32(xk))),
                                                         _mm256_maddubs_epi16(q[kk][1], _mm256_set1_epi32(load_i32(xk + 4))));
                    const __m256i p23 = _mm256_add_epi16(_mm256_maddubs_epi16(q[kk][2], _mm256_set1_epi32(load_i32(xk + 8))),
                                                         _mm256_maddubs_epi16(q[kk][3], _mm256_set1_epi32(load_i32(xk + 12))));
                    sum = _mm256_add_epi32(sum, _mm256_add_epi32(_mm256_madd_epi16(p01, sc_of[kk]), _mm256_madd_epi16(p23, sc_of[kk])));
                }
                const int32_t sums = load_i32(act(xq, xq_bytes, r, b)->bsums + 2 * m);
                const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(pair, _mm256_set1_epi32(sums)), 5);
                isum[r] = _mm256_add_epi32(isum[r], _mm256_sub_epi32(sum, offset));
            }
        }
        const __m256 d = _mm256_load_ps((const float *) (blk + Q6K_D));
        for (int r = 0; r < nr; r++) {
            const __m256 dx = _mm256_set1_ps(act(xq, xq_bytes, r, b)->d);
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(isum[r]), acc[r]);
        }
    }
    for (int r = 0; r < nr; r++) _mm256_storeu_ps(y + r * ldy, acc[r]);
}

#endif

// One function per row count and prefetch choice, so that each is compiled with its loops
// unrolled and its sums in registers.
#define GROUP_FUNCTION(kernel, rows, ahead)                                                                  \
    static void kernel##_##rows##_##ahead(int n, const void *w, const char *xq, size_t xb, const int32_t *ex, \
                                          size_t er, float *y, size_t ldy) {                                \
        kernel(n, w, xq, xb, ex, er, rows, ahead, y, ldy);                                                  \
    }
#define GROUP_PAIR(kernel, rows) GROUP_FUNCTION(kernel, rows, 0) GROUP_FUNCTION(kernel, rows, 1)
#define GROUP_FUNCTIONS(kernel)                                                                             \
    GROUP_PAIR(kernel, 1) GROUP_PAIR(kernel, 2) GROUP_PAIR(kernel, 3) GROUP_PAIR(kernel, 4)                 \
    GROUP_PAIR(kernel, 5) GROUP_PAIR(kernel, 6) GROUP_PAIR(kernel, 7) GROUP_PAIR(kernel, 8)                 \
    static const lsq_packed_kernel_t kernel##_by_rows[2][LSQ_PACKED_ACT_ROWS + 1] = {                       \
        {NULL, kernel##_1_0, kernel##_2_0, kernel##_3_0, kernel##_4_0, kernel##_5_0, kernel##_6_0,           \
         kernel##_7_0, kernel##_8_0},                                                                       \
        {NULL, kernel##_1_1, kernel##_2_1, kernel##_3_1, kernel##_4_1, kernel##_5_1, kernel##_6_1,           \
         kernel##_7_1, kernel##_8_1}};

GROUP_FUNCTIONS(q4_K_group)
GROUP_FUNCTIONS(q6_K_group)
#if defined(PACKED_512)
GROUP_FUNCTIONS(q5_0_group)
#endif

const lsq_packed_kernel_t *lsq_packed_kernels(int type, int ahead) {
    ahead = ahead != 0;
    switch (type) {
        case GGML_TYPE_Q4_K: return q4_K_group_by_rows[ahead];
        case GGML_TYPE_Q6_K: return q6_K_group_by_rows[ahead];
#if defined(PACKED_512)
        case GGML_TYPE_Q5_0: return q5_0_group_by_rows[ahead];
#endif
        default: return NULL;
    }
}

#else

const lsq_packed_kernel_t *lsq_packed_kernels(int type, int ahead) {
    (void) type;
    (void) ahead;
    return NULL;
}

#endif
