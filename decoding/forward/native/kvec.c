// Per-row vector work of the lean forward's native path, each a single C call where torch runs
// several ops (a decode step's own time is mostly calls on one short row):
// the SwiGLU of a feed-forward, and the output layer's leading logits.
// Every row is computed alone, so every result is batch-invariant by construction.

#include <stdint.h>

// ggml-cpu's vectorized SwiGLU (vec.h): y = silu(x) * g, each element alone.
extern void ggml_vec_swiglu_f32(const int n, float *y, const float *x, const float *g);

// out (rows, ffn) = silu(gate) * up for gate_up (rows, 2 ffn): each row's gate, then its up.
int lsq_swiglu(const float *gate_up, int64_t rows, int64_t ffn, float *out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *gate = gate_up + r * 2 * ffn;
        ggml_vec_swiglu_f32((int) ffn, out + r * ffn, gate, gate + ffn);
    }
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

// The k highest of a row of n, highest first, equal values by lower index: one pass keeping the
// k best in a min-heap, where torch's topk sorted a partition of the whole row. Most values fall
// below the heap's least and cost one comparison.
static void top_of_row(const float *x, int64_t n, int64_t k, float *v, int64_t *ix) {
    for (int64_t i = 0; i < k; i++) v[i] = x[i], ix[i] = i;
    for (int64_t i = k / 2 - 1; i >= 0; i--) sift_down(v, ix, k, i);
    for (int64_t i = k; i < n; i++) {
        if (x[i] > v[0]) {  // an equal value comes later, so ranks below the least
            v[0] = x[i], ix[0] = i;
            sift_down(v, ix, k, 0);
        }
    }
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
