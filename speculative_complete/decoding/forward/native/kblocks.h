// What krows.c and kpairs.c both take from ggml's AVX2 vec_dot (arch/x86/quants.c): the block
// layouts, the final sum's order, the unpacking of a Q4_K block's scales and of the 32-value
// blocks' weights. One copy, so the two kernels' outputs cannot drift apart.
#pragma once

#include <immintrin.h>
#include <string.h>

#include "ggml.h"
#define GGML_COMMON_DECL_C
#include "ggml-common.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))
#define SET_M128I(a, b) _mm256_insertf128_si256(_mm256_castsi128_si256(b), (a), 1)

// An empty asm that takes v in a register and gives it back: the compiler then sums each row's
// products into it as they come. Without it, gcc regrouped the integer sums of a block (exact, so
// free to) into a tree over all of them, which spilled products to the stack with AVX2's 16
// registers.
static ALWAYS_INLINE void in_register(__m256i *v) { __asm__("" : "+x"(*v)); }

static ALWAYS_INLINE float half(ggml_half h) { return _cvtsh_ss(h); }

// ggml's hsum_float_8, the order of the final sum.
static ALWAYS_INLINE float hsum_float_8(const __m256 x) {
    __m128 res = _mm256_extractf128_ps(x, 1);
    res = _mm_add_ps(res, _mm256_castps256_ps128(x));
    res = _mm_add_ps(res, _mm_movehl_ps(res, res));
    res = _mm_add_ss(res, _mm_movehdup_ps(res));
    return _mm_cvtss_f32(res);
}

// Block i of activation row r (rows xq_bytes apart, quantized to Q8_K).
static ALWAYS_INLINE const block_q8_K *row_block(const char *xq, size_t xq_bytes, int r, int i) {
    return (const block_q8_K *) (xq + r * xq_bytes) + i;
}

// ggml's unpacking of a Q4_K block's 6-bit scales and mins: 8 scales then 8 mins, 16-bit.
static ALWAYS_INLINE __m256i q4_K_mins_and_scales(const block_q4_K *x) {
    static const uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    uint32_t utmp[4];
    memcpy(utmp, x->scales, 12);
    utmp[3] = ((utmp[2] >> 4) & kmask2) | (((utmp[1] >> 6) & kmask3) << 4);
    const uint32_t uaux = utmp[1] & kmask1;
    utmp[1] = (utmp[2] & kmask2) | (((utmp[0] >> 6) & kmask3) << 4);
    utmp[2] = uaux;
    utmp[0] &= kmask1;
    return _mm256_cvtepu8_epi16(_mm_set_epi32(utmp[3], utmp[2], utmp[1], utmp[0]));
}

// ggml's bytes_from_nibbles_32: 32 4-bit fields as bytes in [0, 15].
static ALWAYS_INLINE __m256i bytes_from_nibbles_32(const uint8_t *rsi) {
    const __m128i tmp = _mm_loadu_si128((const __m128i *) rsi);
    return _mm256_and_si256(_mm256_set1_epi8(0xF), SET_M128I(_mm_srli_epi16(tmp, 4), tmp));
}

// ggml's bytes_from_bits_32: 32 bits as bytes 0x00 or 0xFF.
static ALWAYS_INLINE __m256i bytes_from_bits_32(const uint8_t *x) {
    uint32_t x32;
    memcpy(&x32, x, sizeof(uint32_t));
    const __m256i shuf_mask =
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32), shuf_mask);
    bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

// The weights of one 32-value block as signed bytes, as ggml's vec_dot unpacks them.
static ALWAYS_INLINE __m256i q4_0_bytes(const block_q4_0 *x) {
    return _mm256_sub_epi8(bytes_from_nibbles_32(x->qs), _mm256_set1_epi8(8));
}

static ALWAYS_INLINE __m256i q5_0_bytes(const block_q5_0 *x) {
    const __m256i bxhi = _mm256_andnot_si256(bytes_from_bits_32(x->qh), _mm256_set1_epi8((char) 0xF0));
    return _mm256_or_si256(bytes_from_nibbles_32(x->qs), bxhi);
}

static ALWAYS_INLINE __m256i q8_0_bytes(const block_q8_0 *x) { return _mm256_loadu_si256((const __m256i *) x->qs); }
