// Per-row vector work of the lean forward's native path, each a single C call where torch runs
// several ops (a decode step's own time is mostly calls on one short row):
// the SwiGLU of a feed-forward, and the output layer's leading logits.
// Every row is computed alone, so every result is batch-invariant by construction.

#include <math.h>
#include <stdint.h>

#include "kpool.h"

// ggml-cpu's vectorized SwiGLU (vec.h): y = silu(x) * g, each element alone.
extern void ggml_vec_swiglu_f32(const int n, float *y, const float *x, const float *g);

typedef struct {
    const float *gate_up;
    int64_t ffn;
    float *out;
} swiglu_t;

static void swiglu_row(void *ctx, int64_t r) {
    const swiglu_t *a = ctx;
    const float *gate = a->gate_up + r * 2 * a->ffn;
    ggml_vec_swiglu_f32((int) a->ffn, a->out + r * a->ffn, gate, gate + a->ffn);
}

// out (rows, ffn) = silu(gate) * up for gate_up (rows, 2 ffn): each row's gate, then its up; the
// rows split between the library's threads.
int lsq_swiglu(const float *gate_up, int64_t rows, int64_t ffn, float *out) {
    swiglu_t a = {gate_up, ffn, out};
    lsq_for_each_row(swiglu_row, &a, rows);
    return 0;
}

// Whether entry (va, ia) ranks below (vb, ib): a lower value, or an equal one at a higher index.
static inline int below(float va, int64_t ia, float vb, int64_t ib) { return va < vb || (va == vb && ia > ib); }

// Restore the min-heap (the lowest-ranked entry at 0) below slot i.
static void sift_down(float *v, int64_t *ix, int64_t k, int64_t i) {
    for (;;) {
        int64_t least = i, left = 2 * i + 1, right = left + 1;
        if (left < k && below(v[left], ix[left], v[least], ix[least])) least = left;
        if (right < k && below(v[right], ix[right], v[least], ix[least])) least = right;
        if (least == i) return;
        float tv = v[i];
        int64_t ti = ix[i];
        v[i] = v[least], ix[i] = ix[least];
        v[least] = tv, ix[least] = ti;
        i = least;
    }
}

typedef float kvec_v8 __attribute__((vector_size(32), aligned(4)));
typedef int kvec_i8 __attribute__((vector_size(32), aligned(4)));
#define CHUNK 64

// The highest of x[0..CHUNK), eight lanes at a time (NaN never taken, as consider never takes it).
static inline float chunk_max(const float *x) {
    kvec_v8 most = (kvec_v8){0} - INFINITY;
    for (int c = 0; c < CHUNK; c += 8) {
        const kvec_v8 u = *(const kvec_v8 *) (x + c);
        const kvec_i8 above = u > most;
        most = (kvec_v8) (((kvec_i8) u & above) | ((kvec_i8) most & ~above));
    }
    float best = most[0];
    for (int lane = 1; lane < 8; lane++) best = most[lane] > best ? most[lane] : best;
    return best;
}

// x[i] into the heap of the k best where it beats the least (an equal value comes later, so
// ranks below it).
static inline void consider(const float *x, int64_t i, float *v, int64_t *ix, int64_t k) {
    if (x[i] > v[0]) {
        v[0] = x[i], ix[0] = i;
        sift_down(v, ix, k, 0);
    }
}

// The k highest of a row of n, highest first, equal values by lower index: one pass keeping the
// k best in a min-heap, where torch's topk sorted a partition of the whole row. Most values fall
// below the heap's least, a chunk of them at a time.
static void top_of_row(const float *x, int64_t n, int64_t k, float *v, int64_t *ix) {
    for (int64_t i = 0; i < k; i++) v[i] = x[i], ix[i] = i;
    for (int64_t i = k / 2 - 1; i >= 0; i--) sift_down(v, ix, k, i);
    int64_t i = k;
    for (; i < n && i % CHUNK; i++) consider(x, i, v, ix, k);
    for (; i + CHUNK <= n; i += CHUNK) {  // a chunk whose highest falls below the least: skipped
        if (chunk_max(x + i) > v[0]) {
            for (int64_t j = i; j < i + CHUNK; j++) consider(x, j, v, ix, k);
        }
    }
    for (; i < n; i++) consider(x, i, v, ix, k);
    for (int64_t last = k - 1; last > 0; last--) {  // pop the least to the end, each in turn
        float tv = v[0];
        int64_t ti = ix[0];
        v[0] = v[last], ix[0] = ix[last];
        v[last] = tv, ix[last] = ti;
        sift_down(v, ix, last, 0);
    }
}

// values, indices (rows, k): each row of x (rows, n)'s k highest (k <= n).
int lsq_top(const float *x, int64_t rows, int64_t n, int64_t k, float *values, int64_t *indices) {
    if (k < 1 || k > n) return -1;
    for (int64_t r = 0; r < rows; r++) top_of_row(x + r * n, n, k, values + r * k, indices + r * k);
    return 0;
}


// The tokens of a row whose logit could reach best: ids (room for n) of each t with
// row[t] + (norms[t] * slack + 1e-6) >= best, above -inf, in token order; their count. The
// tight bound of NativeOutputLayer._contenders (__init__.py), in fp32: its margins cover
// the last bit a fused multiply-add may round otherwise. Eight lanes at a time, a chunk's
// highest bound tested before its tokens are (nearly every chunk has none above best).
int64_t lsq_contenders(const float *row, const float *norms, float slack, float best, int64_t n, int64_t *ids) {
    int64_t count = 0, t = 0;
    float upper[CHUNK];
    for (; t + CHUNK <= n; t += CHUNK) {
        kvec_v8 most = (kvec_v8){0} - INFINITY;
        for (int c = 0; c < CHUNK; c += 8) {
            const kvec_v8 u = *(const kvec_v8 *) (row + t + c) + (*(const kvec_v8 *) (norms + t + c) * slack + 1e-6f);
            *(kvec_v8 *) (upper + c) = u;
            const kvec_i8 above = u > most;
            most = (kvec_v8) (((kvec_i8) u & above) | ((kvec_i8) most & ~above));
        }
        int reached = 0;
        for (int lane = 0; lane < 8; lane++) reached |= most[lane] >= best;
        if (!reached) continue;
        for (int c = 0; c < CHUNK; c++) {
            if (upper[c] >= best && upper[c] > -INFINITY) ids[count++] = t + c;
        }
    }
    for (; t < n; t++) {
        const float u = row[t] + (norms[t] * slack + 1e-6f);
        if (u >= best && u > -INFINITY) ids[count++] = t;
    }
    return count;
}
