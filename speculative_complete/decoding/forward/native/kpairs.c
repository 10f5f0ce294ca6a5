// Q4_K, Q6_K, Q4_0, Q4_1, Q5_0 and Q8_0 products of two weight rows at once on AVX-512, each output
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
// single row as well (tests/decoding/forward/test_native.py compares them with ggml's vec_dot).
// What bounds a pass of many rows is the count of 512-bit operations (two ports take them), so the
// work shared by the rows (a block's unpacking, its scales) is done once for eight rows, the
// activations' per-block sums once a pass (lsqmm.c's block_scales), and the K-quants' scaled
// products take three multiplying operations and a shuffle per 64 bytes where ggml's take four
// multiplying ones (scaled_pair, with VNNI: the multiplies share one port).

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

#if defined(__AVX512VNNI__)
// sum + scale_ab . (a_k, b_k) in each 32-bit lane k, where a_k = the four products of lane k of
// (ua, sa) and b_k those of (ub, sb), scale_ab's low 16 bits scaling a_k and its high ones b_k:
// exactly the integers that ggml's madd(scale, maddubs(u, s)) adds for the two (a pair of
// products fits 16 bits unsaturated, four of them as well: |a_k| <= 4 * 63 * 128 < 2^15). One
// multiplying instruction per 32 bytes and one for the scales of 64, where maddubs then madd take
// two per 32 bytes. b_k's low 16 bits move into the high half of a_k's lane (a masked shuffle).
static ALWAYS_INLINE __m512i scaled_pair(const __m512i sum, const __m512i scale_ab, const __m512i ua,
                                         const __m512i sa, const __m512i ub, const __m512i sb) {
    const __m512i lift = _mm512_broadcast_i32x4(_mm_set_epi32(0x0d0c0000, 0x09080000, 0x05040000, 0x01000000));
    const __m512i a = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ua, sa);
    const __m512i b = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ub, sb);
    return _mm512_dpwssd_epi32(sum, scale_ab, _mm512_mask_shuffle_epi8(a, (__mmask64) 0xCCCCCCCCCCCCCCCCULL, b, lift));
}
#endif

// ggml_vec_dot_q4_K_q8_K's AVX2 branch for weight rows w and w + row_bytes, nr activation rows:
// outputs s[r * ls] and s[r * ls + 1].
static ALWAYS_INLINE void q4_K_pair(int n, const void *vw, size_t row_bytes, const char *xq, size_t xq_bytes,
                                    const float *yd, const int nr, float *s, size_t ls) {
    const block_q4_K *x0 = vw, *x1 = (const block_q4_K *) ((const char *) vw + row_bytes);
    const int nb = n / QK_K;
    const __m512i m4 = _mm512_set1_epi8(0xF);
    __m512 acc[LSQ_PAIR_ROWS];
    __m256 acc_m[LSQ_PAIR_ROWS];
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
        __m512i sumi[LSQ_PAIR_ROWS];  // exact integer sums per row
        for (int r = 0; r < nr; r++) sumi[r] = _mm512_setzero_si512();
        for (int j = 0; j < QK_K / 64; ++j) {
            const __m512i q4bits = join_loads(x0[i].qs + 32 * j, x1[i].qs + 32 * j);
            const __m512i q4l = _mm512_and_si512(q4bits, m4);
            const __m512i q4h = _mm512_and_si512(_mm512_srli_epi16(q4bits, 4), m4);
#if defined(__AVX512VNNI__)
            // Scales 2j and 2j + 1 as the two 16-bit halves of every 32-bit lane.
            const __m512i scale_ab = _mm512_shuffle_epi8(scales, _mm512_set1_epi32(0x03020100 + 0x04040404 * j));
            for (int r = 0; r < nr; r++) {
                const int8_t *q8 = row_block(xq, xq_bytes, r, i)->qs + 64 * j;
                sumi[r] = scaled_pair(sumi[r], scale_ab, q4l, broadcast_load(q8), q4h, broadcast_load(q8 + 32));
            }
#else
            const __m512i scale_l = _mm512_shuffle_epi8(scales, _mm512_set1_epi16((short) (0x0202 * (2 * j) + 0x0100)));
            const __m512i scale_h =
                _mm512_shuffle_epi8(scales, _mm512_set1_epi16((short) (0x0202 * (2 * j + 1) + 0x0100)));
            for (int r = 0; r < nr; r++) {
                const int8_t *q8 = row_block(xq, xq_bytes, r, i)->qs + 64 * j;
                sumi[r] = add_products(sumi[r], scale_l, _mm512_maddubs_epi16(q4l, broadcast_load(q8)));
                sumi[r] = add_products(sumi[r], scale_h, _mm512_maddubs_epi16(q4h, broadcast_load(q8 + 32)));
            }
#endif
        }
        for (int r = 0; r < nr; r++) {
            // y->d, then the hadd of y->bsums' halves (lsqmm.c's q8_K_sums).
            const float *sums = yd + LSQ_Q8_K_SUMS * (r * nb + i);
            const __m256i q8s = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *) (sums + 4)));
            const __m256i prod = _mm256_madd_epi16(mins, q8s);
            // ggml adds (-y->d * xmin) * prod: the same single rounding as subtracting (y->d * xmin) * prod.
            const __m256 dmins = _mm256_mul_ps(_mm256_set1_ps(sums[0]), xmin);
            acc_m[r] = _mm256_fnmadd_ps(dmins, _mm256_cvtepi32_ps(prod), acc_m[r]);
            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(sums[0]), xd), _mm512_cvtepi32_ps(sumi[r]), acc[r]);
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
                                    const float *yd, const int nr, float *s, size_t ls) {
    (void) yd;
    const block_q6_K *x0 = vw, *x1 = (const block_q6_K *) ((const char *) vw + row_bytes);
    const int nb = n / QK_K;
    const __m512i m3 = _mm512_set1_epi8(3), m15 = _mm512_set1_epi8(15);
    __m512 acc[LSQ_PAIR_ROWS];
    for (int r = 0; r < nr; r++) acc[r] = _mm512_setzero_ps();
    for (int i = 0; i < nb; ++i) {
        lsq_ahead(x0 + i, sizeof(block_q6_K));
        lsq_ahead(x1 + i, sizeof(block_q6_K));
        const __m512 xd = join_floats(half(x0[i].d), half(x1[i].d));
        const __m128i scales0 = _mm_loadu_si128((const __m128i *) x0[i].scales);
        const __m128i scales1 = _mm_loadu_si128((const __m128i *) x1[i].scales);
        const __m256i scales = _mm256_inserti128_si256(_mm256_castsi128_si256(scales0), scales1, 1);
        const __m512i scales_16 = join(_mm256_cvtepi8_epi16(scales0), _mm256_cvtepi8_epi16(scales1));
        __m512i sumi[LSQ_PAIR_ROWS];  // exact integer sums per row
        for (int r = 0; r < nr; r++) sumi[r] = _mm512_setzero_si512();
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
#if defined(__AVX512VNNI__)
            // Each scale is the same in both 16-bit halves of a 32-bit lane: the first's low half
            // beside the second's high half pairs the scales of two 32-byte runs.
            const __m512i scale_01 = _mm512_mask_blend_epi16((__mmask32) 0xAAAAAAAA, scale_0, scale_1);
            const __m512i scale_23 = _mm512_mask_blend_epi16((__mmask32) 0xAAAAAAAA, scale_2, scale_3);
            for (int r = 0; r < nr; r++) {
                const int8_t *q8 = row_block(xq, xq_bytes, r, i)->qs + 128 * j;
                sumi[r] = scaled_pair(sumi[r], scale_01, q4_0, broadcast_load(q8), q4_1, broadcast_load(q8 + 32));
                sumi[r] = scaled_pair(sumi[r], scale_23, q4_2, broadcast_load(q8 + 64), q4_3, broadcast_load(q8 + 96));
            }
#else
            for (int r = 0; r < nr; r++) {
                const int8_t *q8 = row_block(xq, xq_bytes, r, i)->qs + 128 * j;
                sumi[r] = add_products(sumi[r], scale_0, _mm512_maddubs_epi16(q4_0, broadcast_load(q8)));
                sumi[r] = add_products(sumi[r], scale_1, _mm512_maddubs_epi16(q4_1, broadcast_load(q8 + 32)));
                sumi[r] = add_products(sumi[r], scale_2, _mm512_maddubs_epi16(q4_2, broadcast_load(q8 + 64)));
                sumi[r] = add_products(sumi[r], scale_3, _mm512_maddubs_epi16(q4_3, broadcast_load(q8 + 96)));
            }
#endif
        }
        for (int r = 0; r < nr; r++) {
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

// ggml's mul_sum_us8_pairs_float on both halves: per 32-bit lane, the four products of unsigned
// ax with signed sy, summed exactly, as float.
static ALWAYS_INLINE __m512 unsigned_products(const __m512i ax, const __m512i sy) {
#if defined(__AVX512VNNI__)
    return _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ax, sy));
#else
    return _mm512_cvtepi32_ps(_mm512_madd_epi16(_mm512_set1_epi16(1), _mm512_maddubs_epi16(ax, sy)));
#endif
}

// ggml's mul_sum_i8_pairs_float on both halves: per 32-bit lane, the four products of |x| with y
// carrying x's sign, summed exactly (AVX-512 has no sign_epi8; where x is 0 the product is 0
// either way), as float. dpbusd and maddubs + madd give the same integers here (a pair of
// products is at most 2 * 128 * 128 in size), so the choice follows ggml's for the build.
static ALWAYS_INLINE __m512 signed_products(const __m512i ax, const __mmask64 negative, const __m512i y) {
    return unsigned_products(ax, _mm512_mask_sub_epi8(y, negative, _mm512_setzero_si512(), y));
}

// ggml_vec_dot_{q4_0,q5_0,q8_0}_q8_0's AVX2 branch for weight rows w and w + row_bytes (as
// q4_K_pair). xd * y->d is one IEEE product in either order.
#define SIGNED_BLOCKS_PAIR(name, block_t, unpack)                                                          \
    static ALWAYS_INLINE void name(int n, const void *vw, size_t row_bytes, const char *xq, size_t xq_bytes, \
                                   const float *yd, const int nr, float *s, size_t ls) {                   \
        const block_t *x0 = vw, *x1 = (const block_t *) ((const char *) vw + row_bytes);                   \
        __m512 acc[LSQ_PAIR_ROWS];                                                                         \
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
                const __m512 d = _mm512_mul_ps(xd, _mm512_set1_ps(yd[r * (n / QK8_0) + ib]));              \
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

// ggml_vec_dot_q4_1_q8_1's AVX2 branch for weight rows w and w + row_bytes (as q4_K_pair). yd: each
// activation block's d and s as floats (lsqmm.c's block_scales); each weight row's sum of m * s
// is one fused multiply-add a block, as ggml's compiled loop adds it, in lane 0 or 1 of summs.
static ALWAYS_INLINE void q4_1_pair(int n, const void *vw, size_t row_bytes, const char *xq, size_t xq_bytes,
                                    const float *yd, const int nr, float *s, size_t ls) {
    const block_q4_1 *x0 = vw, *x1 = (const block_q4_1 *) ((const char *) vw + row_bytes);
    const int nb = n / QK8_1;
    __m512 acc[LSQ_PAIR_ROWS];
    __m128 summs[LSQ_PAIR_ROWS];
    for (int r = 0; r < nr; r++) {
        acc[r] = _mm512_setzero_ps();
        summs[r] = _mm_setzero_ps();
    }
    for (int ib = 0; ib < nb; ++ib) {
        lsq_ahead(x0 + ib, sizeof(block_q4_1));
        lsq_ahead(x1 + ib, sizeof(block_q4_1));
        const __m512 d0 = join_floats(half(x0[ib].d), half(x1[ib].d));
        const __m128 m = _mm_setr_ps(half(x0[ib].m), half(x1[ib].m), 0.0f, 0.0f);
        const __m512i qx = join(bytes_from_nibbles_32(x0[ib].qs), bytes_from_nibbles_32(x1[ib].qs));
        for (int r = 0; r < nr; r++) {
            const block_q8_1 *y = (const block_q8_1 *) (xq + r * xq_bytes) + ib;
            const float *ds = yd + 2 * (r * nb + ib);  // y->d and y->s as floats
            summs[r] = _mm_fmadd_ps(m, _mm_set1_ps(ds[1]), summs[r]);
            const __m512 d0d1 = _mm512_mul_ps(d0, _mm512_set1_ps(ds[0]));
            acc[r] = _mm512_fmadd_ps(d0d1, unsigned_products(qx, broadcast_load(y->qs)), acc[r]);
        }
    }
    for (int r = 0; r < nr; r++) {
        s[r * ls] = hsum_float_8(half_of(acc[r], 0)) + _mm_cvtss_f32(summs[r]);
        s[r * ls + 1] = hsum_float_8(half_of(acc[r], 1)) + _mm_cvtss_f32(_mm_movehdup_ps(summs[r]));
    }
}

// One function per row count, so that each is compiled with its loops unrolled and the
// accumulators in registers.
#define PAIR_FUNCTION(kernel, rows)                                                                    \
    static void kernel##_##rows(int n, const void *w, size_t rb, const char *xq, size_t b, const float *yd, \
                                float *s, size_t ls) {                                                 \
        kernel(n, w, rb, xq, b, yd, rows, s, ls);                                                      \
    }
#define PAIR_FUNCTIONS(kernel)                                                                          \
    PAIR_FUNCTION(kernel, 1) PAIR_FUNCTION(kernel, 2) PAIR_FUNCTION(kernel, 3) PAIR_FUNCTION(kernel, 4) \
    PAIR_FUNCTION(kernel, 5) PAIR_FUNCTION(kernel, 6) PAIR_FUNCTION(kernel, 7) PAIR_FUNCTION(kernel, 8) \
    static const lsq_pair_kernel_t kernel##_by_rows[LSQ_PAIR_ROWS + 1] = {                              \
        NULL, kernel##_1, kernel##_2, kernel##_3, kernel##_4, kernel##_5, kernel##_6, kernel##_7, kernel##_8};

PAIR_FUNCTIONS(q4_K_pair)
PAIR_FUNCTIONS(q6_K_pair)
PAIR_FUNCTIONS(q4_0_pair)
PAIR_FUNCTIONS(q4_1_pair)
PAIR_FUNCTIONS(q5_0_pair)
PAIR_FUNCTIONS(q8_0_pair)

const lsq_pair_kernel_t *lsq_pair_kernels(int type) {
    switch (type) {
        case GGML_TYPE_Q4_K: return q4_K_pair_by_rows;
        case GGML_TYPE_Q6_K: return q6_K_pair_by_rows;
        case GGML_TYPE_Q4_0: return q4_0_pair_by_rows;
        case GGML_TYPE_Q4_1: return q4_1_pair_by_rows;
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
