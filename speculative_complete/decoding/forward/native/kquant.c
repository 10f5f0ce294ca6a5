// Activation rows quantized to Q8_K blocks as ggml quantizes them (quantize_row_q8_K_ref), bit for
// bit, eight values at a time.
//
// Why: ggml's x86 build has no vectorized Q8_K quantization (its quantize_row_q8_K calls the
// scalar reference), and every product with K-quant weights quantizes each activation row of
// its pass on the calling thread while the other threads wait: a verify pass of several rows of
// a real model spent as long on it as on its attention's softmax and norms together.
// The operations on each value are the reference's: the block's largest magnitude and the first
// value that has it, the scale -127 / that value, each value times the scale rounded to a float,
// then to the nearest integer by adding 1.5 * 2^23 (round half to even), at most 127; the block's
// scale 1 / that scale. This file is compiled without contraction (CMakeLists.txt), so the
// product and the add round apart, as the reference's do. A block of zeros (or NaNs) gets d = 0
// and zero values and sums (the reference leaves its sums as they were).

#include "kquant.h"

#include <string.h>

#include "ggml.h"
#define GGML_COMMON_DECL_C
#include "ggml-common.h"

typedef float lsq_f8 __attribute__((vector_size(32), aligned(4)));
typedef int32_t lsq_n8 __attribute__((vector_size(32), aligned(4)));

// The block's largest magnitude (0 for none) and the index of the first value that has it.
static float largest_magnitude(const float *x, int *first) {
    lsq_f8 best = {0};
    lsq_n8 at = {0, 1, 2, 3, 4, 5, 6, 7}, where = {0};
    for (int c = 0; c < QK_K / 8; c++, at += 8) {
        const lsq_f8 a = (lsq_f8) (*(const lsq_n8 *) (x + 8 * c) & 0x7fffffff);
        const lsq_n8 above = a > best;  // all ones where a is the larger (NaN never is): the first stays
        best = (lsq_f8) ((above & (lsq_n8) a) | (~above & (lsq_n8) best));
        where = (above & at) | (~above & where);
    }
    float amax = 0.0f;
    for (int l = 0; l < 8; l++) amax = best[l] > amax ? best[l] : amax;
    *first = QK_K;
    for (int l = 0; l < 8; l++) {
        if (best[l] == amax && where[l] < *first) *first = where[l];
    }
    return amax;
}

void lsq_quantize_q8_K(const float *x, void *out, int64_t k) {
    block_q8_K *y = out;
    for (int64_t b = 0; b < k / QK_K; b++, x += QK_K) {
        int first;
        if (!largest_magnitude(x, &first)) {
            memset(&y[b], 0, sizeof(y[b]));
            continue;
        }
        const float iscale = -127.f / x[first];
        const lsq_f8 scale = {iscale, iscale, iscale, iscale, iscale, iscale, iscale, iscale};
        const lsq_f8 magic = {12582912.f, 12582912.f, 12582912.f, 12582912.f,
                              12582912.f, 12582912.f, 12582912.f, 12582912.f};
        for (int c = 0; c < QK_K / 8; c++) {
            const lsq_f8 rounded = *(const lsq_f8 *) (x + 8 * c) * scale + magic;
            lsq_n8 v = ((lsq_n8) rounded & 0x007fffff) - 0x00400000;
            const lsq_n8 over = v > 127;
            v = (over & 127) | (~over & v);
            for (int l = 0; l < 8; l++) y[b].qs[8 * c + l] = (int8_t) v[l];
        }
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int i = 0; i < 16; i++) sum += y[b].qs[16 * j + i];
            y[b].bsums[j] = (int16_t) sum;
        }
        y[b].d = 1 / iscale;
    }
}
