// Quantized products of several activation rows at once (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K),
// each output summed as ggml's vec_dot sums it.
//
// Why by hand: ggml's vec_dot multiplies one weight row with one activation row, so a pass of many
// rows (a prefill, a verify pass) unpacks every weight block once per row; llama.cpp's own faster
// paths for many rows (its repacked and tiled products) sum an output in another order than its
// single-row product, which would make a row's logits depend on its pass. Here each weight block is
// unpacked once for up to LSQ_ROWS activation rows, and every output goes through exactly the float
// operations of ggml's AVX2 vec_dot (the x86 build's path for these types, AVX-512 included): the
// same integer lanes (exact), the same fused multiply-adds into the same accumulators, the same
// final sums. So a row's output is bit for bit the one vec_dot gives it alone
// (tests/decoding/forward/test_native.py compares every row count with vec_dot's single rows), and lsqmm.c runs
// one-row passes here too: unlike vec_dot, these kernels ask for the weights ahead (lsq_ahead),
// for the first rows of a pass only. The activations' block scales come converted to floats once
// a pass (lsqmm.c's block_scales) rather than once a weight row: half to float is exact, so the
// products are the same. Without AVX2 there is none: lsqmm.c keeps vec_dot.

#include "krows.h"

#if defined(__AVX2__) && defined(__F16C__)

#include "kblocks.h"

// ggml's get_scale_shuffle_k4(i): the 16-bit scale i in every 16-bit lane.
static ALWAYS_INLINE __m256i scale_shuffle_k4(int i) { return _mm256_set1_epi16((short) (0x0202 * i + 0x0100)); }

// ggml's get_scale_shuffle(i): byte 2i in the low eight bytes, byte 2i + 1 in the high eight.
static ALWAYS_INLINE __m128i scale_shuffle(int i) {
    return _mm_set_epi64x((long long) (0x0101010101010101ULL * (2 * i + 1)),
                          (long long) (0x0101010101010101ULL * (2 * i)));
}

// ggml_vec_dot_q4_K_q8_K's AVX2 branch, for nr activation rows against one weight row.
static ALWAYS_INLINE void q4_K_rows(int n, const void *vw, const char *xq, size_t xq_bytes, const float *yd,
                                    const int nr, const int ahead, float *s, size_t ls) {
    const block_q4_K *x = vw;
    const int nb = n / QK_K;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m256 acc[LSQ_ROWS];
    __m128 acc_m[LSQ_ROWS];
    for (int r = 0; r < nr; r++) {
        acc[r] = _mm256_setzero_ps();
        acc_m[r] = _mm_setzero_ps();
    }
    for (int i = 0; i < nb; ++i) {
        if (ahead) lsq_ahead(x + i, sizeof(block_q4_K));
        const float xd = half(x[i].d), xmin = half(x[i].dmin);
        const __m256i mins_and_scales = q4_K_mins_and_scales(x + i);
        const __m128i mins = _mm256_extracti128_si256(mins_and_scales, 1);
        const __m128i sc128 = _mm256_extracti128_si256(mins_and_scales, 0);
        const __m256i scales = SET_M128I(sc128, sc128);
        __m256i sumi[LSQ_ROWS];
        for (int r = 0; r < nr; r++) sumi[r] = _mm256_setzero_si256();
        const uint8_t *q4 = x[i].qs;
        for (int j = 0; j < QK_K / 64; ++j) {
            const __m256i scale_l =
                _mm256_shuffle_epi8(scales, scale_shuffle_k4(2 * j));
            const __m256i scale_h =
                _mm256_shuffle_epi8(scales, scale_shuffle_k4(2 * j + 1));
            const __m256i q4bits = _mm256_loadu_si256((const __m256i *) (q4 + 32 * j));
            const __m256i q4l = _mm256_and_si256(q4bits, m4);
            const __m256i q4h = _mm256_and_si256(_mm256_srli_epi16(q4bits, 4), m4);
            for (int r = 0; r < nr; r++) {
                const int8_t *q8 = row_block(xq, xq_bytes, r, i)->qs + 64 * j;
                const __m256i p16l =
                    _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(q4l, _mm256_loadu_si256((const __m256i *) q8)));
                const __m256i p16h = _mm256_madd_epi16(
                    scale_h, _mm256_maddubs_epi16(q4h, _mm256_loadu_si256((const __m256i *) (q8 + 32))));
                sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(p16l, p16h));
                in_register(&sumi[r]);
            }
        }
        for (int r = 0; r < nr; r++) {
            // y->d, then the hadd of y->bsums' halves (lsqmm.c's q8_K_sums).
            const float *sums = yd + LSQ_Q8_K_SUMS * (r * nb + i);
            const float d = sums[0] * xd;
            const float dmin = -sums[0] * xmin;
            const __m128i prod = _mm_madd_epi16(mins, _mm_loadu_si128((const __m128i *) (sums + 4)));
            acc_m[r] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m[r]);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
        }
    }
    for (int r = 0; r < nr; r++) {
        __m128 m = _mm_add_ps(acc_m[r], _mm_movehl_ps(acc_m[r], acc_m[r]));
        m = _mm_add_ss(m, _mm_movehdup_ps(m));
        s[r * ls] = hsum_float_8(acc[r]) + _mm_cvtss_f32(m);
    }
}

// ggml's unpacking of a Q6_K block's 32 weights q4_k of half j (k = 0..3), as unsigned bytes
// (before the subtraction of 32, which ggml's AVX2 vec_dot takes from the bsums).
static ALWAYS_INLINE __m256i q6_K_quarter(const block_q6_K *x, int j, int k) {
    const __m256i m15 = _mm256_set1_epi8(15);
    const __m256i low = _mm256_loadu_si256((const __m256i *) (x->ql + 64 * j + 32 * (k & 1)));
    const __m256i bits_h = _mm256_loadu_si256((const __m256i *) (x->qh + 32 * j));
    const __m256i nibbles = k < 2 ? _mm256_and_si256(low, m15) : _mm256_and_si256(_mm256_srli_epi16(low, 4), m15);
    // Bits 2k, 2k + 1 of qh to bits 4, 5.
    const __m256i high = _mm256_and_si256(k == 0 ? _mm256_slli_epi16(bits_h, 4)
                                          : k == 1 ? _mm256_slli_epi16(bits_h, 2)
                                          : k == 2 ? bits_h
                                                   : _mm256_srli_epi16(bits_h, 2),
                                          _mm256_set1_epi8(48));
    return _mm256_or_si256(nibbles, high);
}

// ggml_vec_dot_q6_K_q8_K's AVX2 branch, for nr activation rows against one weight row.
static ALWAYS_INLINE void q6_K_rows(int n, const void *vw, const char *xq, size_t xq_bytes, const float *yd,
                                    const int nr, const int ahead, float *s, size_t ls) {
    const block_q6_K *x = vw;
    const int nb = n / QK_K;
    __m256 acc[LSQ_ROWS];
    for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    for (int i = 0; i < nb; ++i) {
        if (ahead) lsq_ahead(x + i, sizeof(block_q6_K));
        const float xd = half(x[i].d);
        const __m128i scales = _mm_loadu_si128((const __m128i *) x[i].scales);
        const __m256i scales_16 = _mm256_cvtepi8_epi16(scales);
        __m256i sumi[LSQ_ROWS];
        for (int r = 0; r < nr; r++) sumi[r] = _mm256_setzero_si256();
        for (int j = 0; j < QK_K / 128; ++j) {
            // Quarter k of 32 weights at a time, each row's product added as it comes (the same
            // integer sums as ggml's grouping: exact), so that few registers hold weights.
            for (int k = 0; k < 4; ++k) {
                const __m256i q4 = q6_K_quarter(x + i, j, k);
                const __m256i scale = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, scale_shuffle(4 * j + k)));
                for (int r = 0; r < nr; r++) {
                    const __m256i *q8 = (const __m256i *) (row_block(xq, xq_bytes, r, i)->qs + 128 * j);
                    const __m256i p16 = _mm256_madd_epi16(scale, _mm256_maddubs_epi16(q4, _mm256_loadu_si256(q8 + k)));
                    sumi[r] = _mm256_add_epi32(sumi[r], p16);
                    in_register(&sumi[r]);
                }
            }
        }
        for (int r = 0; r < nr; r++) {
            const block_q8_K *y = row_block(xq, xq_bytes, r, i);
            const float d = y->d * xd;
            const __m256i q8sums = _mm256_loadu_si256((const __m256i *) y->bsums);
            const __m256i q8sclsub = _mm256_slli_epi32(_mm256_madd_epi16(q8sums, scales_16), 5);
            sumi[r] = _mm256_sub_epi32(sumi[r], q8sclsub);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
        }
    }
    for (int r = 0; r < nr; r++) s[r * ls] = hsum_float_8(acc[r]);
}

// ggml's mul_sum_us8_pairs_float and mul_sum_i8_pairs_float (arch/x86/quants.c), with the same
// choice of instructions for the build's instruction sets (the integer lanes are the same in all
// of them but where maddubs saturates, so the same choice keeps even those).
static ALWAYS_INLINE __m256 mul_sum_us8_pairs_float(const __m256i ax, const __m256i sy) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy));
#elif defined(__AVXVNNI__)
    return _mm256_cvtepi32_ps(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), ax, sy));
#else
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_set1_epi16(1), _mm256_maddubs_epi16(ax, sy)));
#endif
}

static ALWAYS_INLINE __m256 mul_sum_i8_pairs_float(const __m256i x, const __m256i y) {
#if __AVXVNNIINT8__
    return _mm256_cvtepi32_ps(_mm256_dpbssd_epi32(_mm256_setzero_si256(), x, y));
#else
    return mul_sum_us8_pairs_float(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
#endif
}

// ggml_vec_dot_{q4_0,q5_0,q8_0}_q8_0's AVX2 branch, for nr activation rows against one weight row.
#define SIGNED_BLOCKS_ROWS(name, block_t, unpack)                                                       \
    static ALWAYS_INLINE void name(int n, const void *vw, const char *xq, size_t xq_bytes, const float *yd, \
                                   const int nr, const int ahead, float *s, size_t ls) {                \
        const block_t *x = vw;                                                                          \
        __m256 acc[LSQ_ROWS];                                                                           \
        for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();                                      \
        for (int ib = 0; ib < n / QK8_0; ++ib) {                                                        \
            if (ahead) lsq_ahead(x + ib, sizeof(block_t));                                              \
            const __m256 xd = _mm256_set1_ps(half(x[ib].d));                                            \
            const __m256i qx = unpack(x + ib);                                                          \
            for (int r = 0; r < nr; r++) {                                                              \
                const block_q8_0 *y = (const block_q8_0 *) (xq + r * xq_bytes) + ib;                    \
                const __m256 d = _mm256_mul_ps(xd, _mm256_broadcast_ss(yd + r * (n / QK8_0) + ib));     \
                const __m256i qy = _mm256_loadu_si256((const __m256i *) y->qs);                         \
                acc[r] = _mm256_fmadd_ps(d, mul_sum_i8_pairs_float(qx, qy), acc[r]);                    \
            }                                                                                           \
        }                                                                                               \
        for (int r = 0; r < nr; r++) s[r * ls] = hsum_float_8(acc[r]);                                 \
    }

SIGNED_BLOCKS_ROWS(q4_0_rows, block_q4_0, q4_0_bytes)
SIGNED_BLOCKS_ROWS(q5_0_rows, block_q5_0, q5_0_bytes)
SIGNED_BLOCKS_ROWS(q8_0_rows, block_q8_0, q8_0_bytes)

// ggml_vec_dot_q4_1_q8_1's AVX2 branch, for nr activation rows against one weight row. Its scalar
// sum of m * s runs for the rows in the lanes of one vector: the same sum of the same floats in
// each lane (m * s, a product of two halves, is exact in fp32, so fused or not the sum is the same),
// one instruction where each row took its own, a fifth of a block's float work here.
_Static_assert(LSQ_ROWS <= 4, "q4_1_rows keeps the rows' sums of m * s in one 4-lane vector");
static ALWAYS_INLINE void q4_1_rows(int n, const void *vw, const char *xq, size_t xq_bytes, const float *yd,
                                    const int nr, const int ahead, float *s, size_t ls) {
    const block_q4_1 *x = vw;
    const int nb = n / QK8_1;
    __m256 acc[LSQ_ROWS];
    __m128 summs = _mm_setzero_ps();  // row r's in lane r
    for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    for (int ib = 0; ib < nb; ++ib) {
        if (ahead) lsq_ahead(x + ib, sizeof(block_q4_1));
        const float d0 = half(x[ib].d);
        const __m256i qx = bytes_from_nibbles_32(x[ib].qs);
        for (int r = 0; r < nr; r++) {
            const block_q8_1 *y = (const block_q8_1 *) (xq + r * xq_bytes) + ib;
            const float *ds = yd + 2 * (r * nb + ib);  // y->d and y->s as floats
            const __m256 d0d1 = _mm256_mul_ps(_mm256_set1_ps(d0), _mm256_broadcast_ss(ds));
            const __m256 xy = mul_sum_us8_pairs_float(qx, _mm256_loadu_si256((const __m256i *) y->qs));
            acc[r] = _mm256_fmadd_ps(d0d1, xy, acc[r]);
        }
        const float *s_of = yd + 2 * ib + 1;  // row 0's y->s; row r's 2 * nb * r floats on
        const __m128 row_s = _mm_set_ps(nr > 3 ? s_of[6 * nb] : 0, nr > 2 ? s_of[4 * nb] : 0,
                                        nr > 1 ? s_of[2 * nb] : 0, s_of[0]);
        summs = _mm_fmadd_ps(_mm_set1_ps(half(x[ib].m)), row_s, summs);
    }
    float sums[4];
    _mm_storeu_ps(sums, summs);
    for (int r = 0; r < nr; r++) s[r * ls] = hsum_float_8(acc[r]) + sums[r];
}

// One function per row count and prefetch choice, so that each is compiled with its loops unrolled
// and the accumulators in registers.
#define ROWS_FUNCTION(kernel, rows, ahead)                                                               \
    static void kernel##_##rows##_##ahead(int n, const void *w, const char *xq, size_t b, const float *yd, \
                                          float *s, size_t ls) {                                       \
        kernel(n, w, xq, b, yd, rows, ahead, s, ls);                                                   \
    }
#define ROWS_FUNCTIONS(kernel)                                                                          \
    ROWS_FUNCTION(kernel, 1, 0) ROWS_FUNCTION(kernel, 2, 0) ROWS_FUNCTION(kernel, 3, 0)                 \
    ROWS_FUNCTION(kernel, 4, 0) ROWS_FUNCTION(kernel, 1, 1) ROWS_FUNCTION(kernel, 2, 1)                 \
    ROWS_FUNCTION(kernel, 3, 1) ROWS_FUNCTION(kernel, 4, 1)                                             \
    static const lsq_rows_kernel_t kernel##_by_rows[2][LSQ_ROWS + 1] = {                                \
        {NULL, kernel##_1_0, kernel##_2_0, kernel##_3_0, kernel##_4_0},                                 \
        {NULL, kernel##_1_1, kernel##_2_1, kernel##_3_1, kernel##_4_1}};

ROWS_FUNCTIONS(q4_K_rows)
ROWS_FUNCTIONS(q6_K_rows)
ROWS_FUNCTIONS(q4_0_rows)
ROWS_FUNCTIONS(q4_1_rows)
ROWS_FUNCTIONS(q5_0_rows)
ROWS_FUNCTIONS(q8_0_rows)

const lsq_rows_kernel_t *lsq_rows_kernels(int type, int ahead) {
    ahead = ahead != 0;
    switch (type) {
        case GGML_TYPE_Q4_K: return q4_K_rows_by_rows[ahead];
        case GGML_TYPE_Q6_K: return q6_K_rows_by_rows[ahead];
        case GGML_TYPE_Q4_0: return q4_0_rows_by_rows[ahead];
        case GGML_TYPE_Q4_1: return q4_1_rows_by_rows[ahead];
        case GGML_TYPE_Q5_0: return q5_0_rows_by_rows[ahead];
        case GGML_TYPE_Q8_0: return q8_0_rows_by_rows[ahead];
        default: return NULL;
    }
}

#else

const lsq_rows_kernel_t *lsq_rows_kernels(int type, int ahead) {
    (void) type;
    (void) ahead;
    return NULL;
}

#endif
