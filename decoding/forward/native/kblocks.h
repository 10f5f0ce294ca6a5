// What krows.c and kpairs.c both take from ggml's AVX2 vec_dot (arch/x86/quants.c): the block
// layouts, the final sum's order and the unpacking of a Q4_K block's scales. One copy, so the two
// kernels' outputs cannot drift apart.
#pragma once

#include <immintrin.h>
#include <string.h>

#include "ggml.h"
#define GGML_COMMON_DECL_C
#include "ggml-common.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))

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
