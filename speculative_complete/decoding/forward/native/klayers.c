// A pass through every layer of a llama-family model in one call: the norms, the products, the
// attention and the SwiGLU are the library's own functions, called in the order and on the
// buffers the Python path gives them, so each row comes out bit for bit as it does there (and as
// it would alone). Why one call: a decode step of a small model is some 250 calls on one short
// row, and from Python each costs a few microseconds of its own before any work is done.

#include <stddef.h>
#include <stdint.h>

#include "kpool.h"

int lsq_rms_norm(const float *x, const float *w, int64_t rows, int64_t n, float eps, float *out);
int lsq_matmul_many(int count, const int *types, const void *const *ws, const int64_t *n_outs, int64_t n_in,
                    const float *x, int64_t rows, float *y, int64_t ldy, void *scratch, const float *residual);
int lsq_attention(const float *qkv, const float *rotary, float *keys, float *values, int64_t capacity, int64_t rows,
                  int64_t start, int heads, int kv_heads, int dim, float *out, float *q_scratch, float *scratch);
int lsq_swiglu(const float *gate_up, int64_t rows, int64_t ffn, float *out);

// Weights side by side, as lsq_matmul_many takes them; n_out: their rows together.
typedef struct {
    int count;
    const int *types;
    const void *const *ws;
    const int64_t *n_outs;
    int64_t n_out;
} lsq_group;

// One layer: its four products, its norms' weights, q, k and v's biases (NULL: none) and the
// order taking the q/k/v product's columns to adjacent rotary pairs (NULL: in order already).
typedef struct {
    lsq_group qkv, out, gate_up, down;
    const float *attn_norm, *ffn_norm, *qkv_bias;
    const int64_t *qkv_order;
} lsq_layer;

typedef struct {
    int64_t dim, heads, kv_heads, head_dim, ffn;
    float eps;
} lsq_dims;

// Floats of work lsq_layers needs for a pass of rows rows.
int64_t lsq_layers_work(const lsq_dims *d, int64_t rows) {
    const int64_t qkv = (d->heads + 2 * d->kv_heads) * d->head_dim, attention = d->heads * d->head_dim;
    return rows * (d->dim * 2 + qkv * 2 + attention * 2 + d->ffn * 3);
}

static int product(const lsq_group *g, const float *x, int64_t n_in, int64_t rows, float *y, void *scratch,
                   const float *residual) {
    return lsq_matmul_many(g->count, g->types, g->ws, g->n_outs, n_in, x, rows, y, g->n_out, scratch, residual);
}

typedef struct {
    const lsq_layer *l;
    const float *raw;
    int64_t n;
    float *qkv;
} arrange_t;

// Row r of arrange_heads.
static void arrange_row(void *ctx, int64_t r) {
    const arrange_t *a = ctx;
    const float *from = a->raw + r * a->n;
    float *to = a->qkv + r * a->n;
    for (int64_t c = 0; c < a->n; c++) to[c] = a->l->qkv_order ? from[a->l->qkv_order[c]] : from[c];
    if (a->l->qkv_bias) {
        for (int64_t c = 0; c < a->n; c++) to[c] = to[c] + a->l->qkv_bias[c];
    }
}

// The projected heads: raw's columns in the layer's order, plus its biases (one float add each,
// as torch adds them).
static void arrange_heads(const lsq_layer *l, const float *raw, int64_t rows, int64_t n, float *qkv) {
    arrange_t a = {l, raw, n, qkv};
    lsq_for_each_row(arrange_row, &a, rows);
}

// h (rows, dim) through layers[0..count), in place; the pass's positions start at start.
// rotary: (rows, heads + kv_heads, head_dim / 2) complex factors (lsq_attention's); cache:
// (count, 2 kv_heads, capacity, head_dim), each layer's keys then values; work: lsq_layers_work
// floats; scratch: room for rows activation rows quantized for any product (lsq_matmul's);
// scores: lsq_attention's. 0, or the first failing call's code.
int lsq_layers(const lsq_layer *layers, int count, const lsq_dims *d, float *h, int64_t rows, int64_t start,
               const float *rotary, float *cache, int64_t capacity, float *work, void *scratch, float *scores) {
    const int64_t n_qkv = (d->heads + 2 * d->kv_heads) * d->head_dim, n_attention = d->heads * d->head_dim;
    float *mid = work, *normed = mid + rows * d->dim, *raw = normed + rows * d->dim, *qkv = raw + rows * n_qkv;
    float *q = qkv + rows * n_qkv, *attended = q + rows * n_attention, *gate_up = attended + rows * n_attention;
    float *act = gate_up + rows * 2 * d->ffn;
    const int64_t layer_floats = 2 * d->kv_heads * capacity * d->head_dim;
    for (int i = 0; i < count; i++) {
        const lsq_layer *l = layers + i;
        float *keys = cache + i * layer_floats, *values = keys + layer_floats / 2;
        int done = lsq_rms_norm(h, l->attn_norm, rows, d->dim, d->eps, normed);
        const int arranged = l->qkv_order || l->qkv_bias;
        if (!done) done = product(&l->qkv, normed, d->dim, rows, arranged ? raw : qkv, scratch, NULL);
        if (!done && arranged) arrange_heads(l, raw, rows, n_qkv, qkv);
        if (!done)
            done = lsq_attention(qkv, rotary, keys, values, capacity, rows, start, (int) d->heads,
                                 (int) d->kv_heads, (int) d->head_dim, attended, q, scores);
        if (!done) done = product(&l->out, attended, n_attention, rows, mid, scratch, h);
        if (!done) done = lsq_rms_norm(mid, l->ffn_norm, rows, d->dim, d->eps, normed);
        if (!done) done = product(&l->gate_up, normed, d->dim, rows, gate_up, scratch, NULL);
        if (!done) done = lsq_swiglu(gate_up, rows, d->ffn, act);
        if (!done) done = product(&l->down, act, d->ffn, rows, h, scratch, mid);
        if (done) return done;
    }
    return 0;
}
