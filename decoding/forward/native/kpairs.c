// Q4_K, Q6_K, Q4_0, Q5_0 and Q8_0 products of two weight rows at once on AVX-512, each output
// summed as ggml's vec_dot sums it.
//
// Why: a product of these types is bound by instruction count on many rows (a prefill, a verify
// pass), and for the K-quants on one row as well (ggml's vec_dot and krows.c run 256-bit lanes).
// Here the two weight rows share one 512-bit register: the low half holds the first row's 32
// bytes, the high half the second's, and each activation block is broadcast to both halves.
// Every lane of a half runs exactly the operations
// that lane of ggml's AVX2 vec_dot runs (krows.c's copy of it): the same integer lanes, the same
// fused multiply-adds into the same accumulators, the same final sums. So each output is bit for
// bit what vec_dot gives it alone, whatever the rows of the pass, and lsqmm.c can use these for a
// single row as well (tests/test_native.py compares them with ggml's vec_dot).

#include "krows.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__F16C__)

#include "kblocks.h"

// The first row's 256 bits in the low half, the second's in the high half.
static ALWAYS_INLINE __m512i join(const __m256i first, const __m256i second) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(first), second, 1);
}

static ALWAYS_INLINE __m512i join_loads(const void *first, const void *second) {
    return join(_mm256_loadu_si256((const __m256i *) first), _mm256_loadu_si256((const __m256i *) second));
}

static ALWAYS_INLINE __m512i broadcast_load(const void *p) {
    return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *) p));
}

static ALWAYS_INLINE __m512 join_floats(float first, float second) {
    return _mm512_mask_blend_ps((__mmask16) 0xFF00, _mm512_set1_ps(first), _mm512_set1_ps(second));
}

static ALWAYS_INLINE __m256 half_of(const __m512 x, int second) {
    return second ? _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)) : _mm512_castps512_ps256(x);
}

// sum + a . b over each 32-bit lane's two 16-bit pairs: exact integers, as madd_epi16 then add_epi32.
static ALWAYS_INLINE __m512i add_products(const __m512i sum, const __m512i a, const __m512i b) {
#if defined(__AVX512VNNI__)
    return _mm512_dpwssd_epi32(sum, a, b);
#else
    return _mm512_add_epi32(sum, _mm512_madd_epi16(a, b));
#endif
}

// ggml_vec_dot_q4_K_q8_K's AVX2 branch for weight rows w and w + row_bytes, nr activation rows:
// outputs s[r * ls] and s[r * ls + 1].
static ALWAYS_INLINE void q4_K_pair(int n, const void *vw, size_t row_bytes, const char *xq, size_t xq_bytes,
                                    const int nr, float *s, size_t ls) {
    const block_q4_K *x0 = vw, *x1 = (const block_q4_K *) ((const char *) vw + row_bytes);
    const int nb = n / QK_K;
    const __m512i m4 = _mm512_set1_epi8(0xF);
    __m512 acc[LSQ_ROWS];
    __m256 acc_m[LSQ_ROWS];
    for (int r = 0; r < nr; r++) {
        acc[r] = _mm512_setzero_ps();
        acc_m[r] = _mm256_setzero_ps();
    }
    for (int i = 0; i < nb; ++i) {
        lsq_ahead(x0 + i, sizeof(block_q4_K));
        lsq_ahead(x1 + i, sizeof(block_q4_K));
        // y->d * xd and -y->d * xmin below are one IEEE product each, whichever way it is written.
        const __m512 xd = join_floats(half(x0[i].d), half(x1[i].d));
        const __m256 xmin = _mm256_blend_ps(_mm256_set1_ps(half(x0[i].dmin)), _mm256_set1_ps(half(x1[i].dmin)), 0xF0);
        // [scales0, mins0, scales1, mins1] in 128-bit lanes -> [scales0, scales0, scales1, scales1]
        const __m512i both = join(q4_K_mins_and_scales(x0 + i), q4_K_mins_and_scales(x1 + i));
        const __m512i scales = _mm512_shuffle_i64x2(both, both, 0xA0);
        const __m256i mins = _mm512_castsi512_si256(_mm512_shuffle_i64x2(both, both, 0xDD));
        __m512i sumi[LSQ_ROWS], sumi_h[LSQ_ROWS];  // two chains of exact integer sums per row
        for (int r = 0; r < nr; r++) sumi[r] = sumi_h[r] = _mm512_setzero_si512();
        for (int j = 0; j < QK_K / 64; ++j) {
            const __m512i scale_l = _mm512_shuffle_epi8(scales, _mm512_set1_epi16((short) (0x0202 * (2 * j) + 0x0100)));
            const __m512i scale_h =
                _mm512_shuffle_epi8(scales, _mm512_set1_epi16((short) (0x0202 * (2 * j + 1) + 0x0100)));
            const __m512i q4bits = join_loads(x0[i].qs + 32 * j, x1[i].qs + 32 * j);
            const __m512i q4l = _mm512_and_si512(q4bits, m4);
            const __m512i q4h = _mm512_and_si512(_mm512_srli_epi16(q4bits, 4), m4);
            for (int r = 0; r < nr; r++) {
                const int8_t *q8 = row_block(xq, xq_bytes, r, i)->qs + 64 * j;
                sumi[r] = add_products(sumi[r], scale_l, _mm512_maddubs_epi16(q4l, broadcast_load(q8)));
                sumi_h[r] = add_products(sumi_h[r], scale_h, _mm512_maddubs_epi16(q4h, broadcast_load(q8 + 32)));
            }
        }
        for (int r = 0; r < nr; r++) {
            sumi[r] = _mm512_add_epi32(sumi[r], sumi_h[r]);
            const block_q8_K *y = row_block(xq, xq_bytes, r, i);
            const __m256i q8sums = _mm256_loadu_si256((const __m256i *) y->bsums);
            const __m128i q8s =
                _mm_hadd_epi16(_mm256_extracti128_si256(q8sums, 0), _mm256_extracti128_si256(q8sums, 1));
            const __m256i prod = _mm256_madd_epi16(mins, _mm256_broadcastsi128_si256(q8s));
            const __m256 dmins = _mm256_mul_ps(_mm256_set1_ps(-y->d), xmin);
            acc_m[r] = _mm256_fmadd_ps(dmins, _mm256_cvtepi32_ps(prod), acc_m[r]);
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(y->d), xd), _mm512_cvtepi32_ps(sumi[r]), acc[r]);
        }
    }
    for (int r = 0; r < nr; r++) {
        for (int w = 0; w < 2; w++) {
            const __m128 am = w ? _mm256_extractf128_ps(acc_m[r], 1) : _mm256_castps256_ps128(acc_m[r]);
            __m128 m = _mm_add_ps(am, _mm_movehl_ps(am, am));
            m = _mm_add_ss(m, _mm_movehdup_ps(m));
            s[r * ls + w] = hsum_float_8(half_of(acc[r], w)) + _mm_cvtss_f32(m);
        }
    }
}

// ggml's get_scale_shuffle(i) in both 128-bit lanes: byte 2i in the low eight bytes of each, byte
// 2i + 1 in the high eight.
static ALWAYS_INLINE __m256i scale_shuffle_both(int i) {
    const __m128i one = _mm_set_epi64x((long long) (0x0101010101010101ULL * (2 * i + 1)),
                                       (long long) (0x0101010101010101ULL * (2 * i)));
    return _mm256_broadcastsi128_si256(one);
}

// ggml_vec_dot_q6_K_q8_K's AVX2 branch for weight rows w and w + row_bytes (as q4_K_pair).
static ALWAYS_INLINE void q6_K_pair(int n, const void *vw, size_t row_bytes, const char *xq, size_t xq_bytes,
                                    const int nr, float *s, size_t ls) {
    const block_q6_K *x0 = vw, *x1 = (const block_q6_K *) ((const char *) vw + row_bytes);
    const int nb = n / QK_K;
    const __m512i m3 = _mm512_set1_epi8(3), m15 = _mm512_set1_epi8(15);
    __m512 acc[LSQ_ROWS];
    for (int r = 0; r < nr; r++) acc[r] = _mm512_setzero_ps();
    for (int i = 0; i < nb; ++i) {
        lsq_ahead(x0 + i, sizeof(block_q6_K));
        lsq_ahead(x1 + i, sizeof(block_q6_K));
        const __m512 xd = join_floats(half(x0[i].d), half(x1[i].d));
        const __m128i scales0 = _mm_loadu_si128((const __m128i *) x0[i].scales);
        const __m128i scales1 = _mm_loadu_si128((const __m128i *) x1[i].scales);
        const __m256i scales = _mm256_inserti128_si256(_mm256_castsi128_si256(scales0), scales1, 1);
        const __m512i scales_16 = join(_mm256_cvtepi8_epi16(scales0), _mm256_cvtepi8_epi16(scales1));
        __m512i sumi[LSQ_ROWS], sumi_h[LSQ_ROWS];  // two chains of exact integer sums per row
        for (int r = 0; r < nr; r++) sumi[r] = sumi_h[r] = _mm512_setzero_si512();
        for (int j = 0; j < QK_K / 128; ++j) {
            const __m512i q4bits1 = join_loads(x0[i].ql + 64 * j, x1[i].ql + 64 * j);
            const __m512i q4bits2 = join_loads(x0[i].ql + 64 * j + 32, x1[i].ql + 64 * j + 32);
            const __m512i q4bitsH = join_loads(x0[i].qh + 32 * j, x1[i].qh + 32 * j);
            const __m512i q4h_0 = _mm512_slli_epi16(_mm512_and_si512(q4bitsH, m3), 4);
            const __m512i q4h_1 = _mm512_slli_epi16(_mm512_and_si512(q4bitsH, _mm512_set1_epi8(12)), 2);
            const __m512i q4h_2 = _mm512_and_si512(q4bitsH, _mm512_set1_epi8(48));
            const __m512i q4h_3 = _mm512_srli_epi16(_mm512_and_si512(q4bitsH, _mm512_set1_epi8(-64)), 2);
            const __m512i q4_0 = _mm512_or_si512(_mm512_and_si512(q4bits1, m15), q4h_0);
            const __m512i q4_1 = _mm512_or_si512(_mm512_and_si512(q4bits2, m15), q4h_1);
            const __m512i q4_2 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(q4bits1, 4), m15), q4h_2);
            const __m512i q4_3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(q4bits2, 4), m15), q4h_3);
            const __m512i scale_0 = _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(scales, scale_shuffle_both(4 * j + 0)));
            const __m512i scale_1 = _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(scales, scale_shuffle_both(4 * j + 1)));
            const __m512i scale_2 = _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(scales, scale_shuffle_both(4 * j + 2)));
            const __m512i scale_3 = _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(scales, scale_shuffle_both(4 * j + 3)));
            for (int r = 0; r < nr; r++) {
                const int8_t *q8 = row_block(xq, xq_bytes, r, i)->qs + 128 * j;
                sumi[r] = add_products(sumi[r], scale_0, _mm512_maddubs_epi16(q4_0, broadcast_load(q8)));
                sumi_h[r] = add_products(sumi_h[r], scale_1, _mm512_maddubs_epi16(q4_1, broadcast_load(q8 + 32)));
                sumi[r] = add_products(sumi[r], scale_2, _mm512_maddubs_epi16(q4_2, broadcast_load(q8 + 64)));
                sumi_h[r] = add_products(sumi_h[r], scale_3, _mm512_maddubs_epi16(q4_3, broadcast_load(q8 + 96)));
            }
        }
        for (int r = 0; r < nr; r++) {
            sumi[r] = _mm512_add_epi32(sumi[r], sumi_h[r]);
            const block_q8_K *y = row_block(xq, xq_bytes, r, i);
            const __m512i q8sums = broadcast_load(y->bsums);
            const __m512i q8sclsub = _mm512_slli_epi32(_mm512_madd_epi16(q8sums, scales_16), 5);
            sumi[r] = _mm512_sub_epi32(sumi[r], q8sclsub);
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(y->d), xd), _mm512_cvtepi32_ps(sumi[r]), acc[r]);
        }
    }
    for (int r = 0; r < nr; r++) {
        s[r * ls] = hsum_float_8(half_of(acc[r], 0));
        s[r * ls + 1] = hsum_float_8(half_of(acc[r], 1));
    }
}

// ggml's mul_sum_i8_pairs_float on both halves: per 32-bit lane, the four products of |x| with y
// carrying x's sign, summed exactly (AVX-512 has no sign_epi8; where x is 0 the product is 0
// either way), as float. dpbusd and maddubs + madd give the same integers here (a pair of
// products is at most 2 * 128 * 128 in size), so the choice follows ggml's for the build.
static ALWAYS_INLINE __m512 signed_products(const __m512i ax, const __mmask64 negative, const __m512i y) {
    const __m512i sy = _mm512_mask_sub_epi8(y, negative, _mm512_setzero_si512(), y);
#if defined(__AVX512VNNI__)
    return _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ax, sy));
#else
    return _mm512_cvtepi32_ps(_mm512_madd_epi16(_mm512_set1_epi16(1), _mm512_maddubs_epi16(ax, sy)));
#endif
}

// ggml_vec_dot_{q4_0,q5_0,q8_0}_q8_0's AVX2 branch for weight rows w and w + row_bytes (as
// q4_K_pair). xd * y->d is one IEEE product in either order.
#define SIGNED_BLOCKS_PAIR(name, block_t, unpack)                                                          \
    static ALWAYS_INLINE void name(int n, const void *vw, size_t row_bytes, const char *xq, size_t xq_bytes, \
                                   const int nr, float *s, size_t ls) {                                    \
        const block_t *x0 = vw, *x1 = (const block_t *) ((const char *) vw + row_bytes);                   \
        __m512 acc[LSQ_ROWS];                                                                              \
        for (int r = 0; r < nr; r++) acc[r] = _mm512_setzero_ps();                                         \
        for (int ib = 0; ib < n / QK8_0; ++ib) {                                                           \
            lsq_ahead(x0 + ib, sizeof(block_t));                                                           \
            lsq_ahead(x1 + ib, sizeof(block_t));                                                           \
            const __m512 xd = join_floats(half(x0[ib].d), half(x1[ib].d));                                 \
            const __m512i qx = join(unpack(x0 + ib), unpack(x1 + ib));                                     \
            const __m512i ax = _mm512_abs_epi8(qx);                                                        \
            const __mmask64 negative = _mm512_movepi8_mask(qx);                                            \
            for (int r = 0; r < nr; r++) {                                                                 \
                const block_q8_0 *y = (const block_q8_0 *) (xq + r * xq_bytes) + ib;                       \
                const __m512 d = _mm512_mul_ps(xd, _mm512_set1_ps(half(y->d)));                            \
                acc[r] = _mm512_fmadd_ps(d, signed_products(ax, negative, broadcast_load(y->qs)), acc[r]); \
            }                                                                                              \
        }                                                                                                  \
        for (int r = 0; r < nr; r++) {                                                                     \
            s[r * ls] = hsum_float_8(half_of(acc[r], 0));                                                  \
            s[r * ls + 1] = hsum_float_8(half_of(acc[r], 1));                                              \
        }                                                                                                  \
    }

SIGNED_BLOCKS_PAIR(q4_0_pair, block_q4_0, q4_0_bytes)
SIGNED_BLOCKS_PAIR(q5_0_pair, block_q5_0, q5_0_bytes)
SIGNED_BLOCKS_PAIR(q8_0_pair, block_q8_0, q8_0_bytes)

// One function per row count, so that each is compiled with its loops unrolled and the
// accumulators in registers.
#define PAIR_FUNCTIONS(kernel)                                                                               \
    static void kernel##_1(int n, const void *w, size_t rb, const char *xq, size_t b, float *s, size_t ls) { \
        kernel(n, w, rb, xq, b, 1, s, ls);                                                                   \
    }                                                                                                        \
    static void kernel##_2(int n, const void *w, size_t rb, const char *xq, size_t b, float *s, size_t ls) { \
        kernel(n, w, rb, xq, b, 2, s, ls);                                                                   \
    }                                                                                                        \
    static void kernel##_3(int n, const void *w, size_t rb, const char *xq, size_t b, float *s, size_t ls) { \
        kernel(n, w, rb, xq, b, 3, s, ls);                                                                   \
    }                                                                                                        \
    static void kernel##_4(int n, const void *w, size_t rb, const char *xq, size_t b, float *s, size_t ls) { \
        kernel(n, w, rb, xq, b, 4, s, ls);                                                                   \
    }                                                                                                        \
    static const lsq_pair_kernel_t kernel##_by_rows[LSQ_ROWS + 1] = {NULL, kernel##_1, kernel##_2,           \
                                                                     kernel##_3, kernel##_4};

PAIR_FUNCTIONS(q4_K_pair)
PAIR_FUNCTIONS(q6_K_pair)
PAIR_FUNCTIONS(q4_0_pair)
PAIR_FUNCTIONS(q5_0_pair)
PAIR_FUNCTIONS(q8_0_pair)

const lsq_pair_kernel_t *lsq_pair_kernels(int type) {
    switch (type) {
        case GGML_TYPE_Q4_K: return q4_K_pair_by_rows;
        case GGML_TYPE_Q6_K: return q6_K_pair_by_rows;
        case GGML_TYPE_Q4_0: return q4_0_pair_by_rows;
        case GGML_TYPE_Q5_0: return q5_0_pair_by_rows;
        case GGML_TYPE_Q8_0: return q8_0_pair_by_rows;
        default: return NULL;
    }
}

#else

const lsq_pair_kernel_t *lsq_pair_kernels(int type) {
    (void) type;
    return NULL;
}

#endif
