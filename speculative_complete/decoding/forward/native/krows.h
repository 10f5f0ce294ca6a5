// Quantized products of up to LSQ_ROWS activation rows against one weight row (krows.c).
#pragma once

#include <stddef.h>
#include <stdint.h>

#define LSQ_ROWS 4

// How far ahead of the weight bytes in use the kernels ask for the next ones. A product of few
// rows streams its weights from memory once, and without the requests a core waits on each miss
// between its sums (half the memory's rate on the 2-core machine); 4-16 KB measured alike there.
#define LSQ_PREFETCH_BYTES 8192

// Ask for the weight bytes LSQ_PREFETCH_BYTES past [p, p + size), one request per cache line,
// into the second-level cache, not the first: a pass of eight rows keeps their quantized
// activations in the first (8 rows of 1536 values take 21 KB of its 32 with their extras), and
// the requests into it pushed them out, and products of several rows then ran well below their
// rate on weights already in cache (CHANGELOG.md, 2026-12-07, evening).
static inline void lsq_ahead(const void *p, size_t size) {
    const char *c = (const char *) p + LSQ_PREFETCH_BYTES;
    const uintptr_t last = ((uintptr_t) c + size - 1) & ~(uintptr_t) 63;
    for (uintptr_t line = (uintptr_t) c & ~(uintptr_t) 63; line <= last; line += 64) {
        __builtin_prefetch((const void *) line, 0, 1);
    }
}

// Floats of yd per Q8_K activation block: its d, three of padding, then the eight int16 sums of
// its bsums' adjacent pairs (lsqmm.c's q8_K_sums).
#define LSQ_Q8_K_SUMS 8

// s[r * ls] = weight row w (n values of the kernel's type) times activation row r, for the nr rows
// of xq (quantized to the type's vec_dot_type, xq_bytes apart); nr is fixed per kernel. For Q8_0
// activations yd holds each row's block scales as floats (n / 32 a row), for Q8_1 ones each block's
// d and s (2n / 32 a row): converted once for all the weight rows, where each weight row converted
// them again. For Q8_K ones (the K-quants') yd holds LSQ_Q8_K_SUMS floats a block: Q4_K's kernels
// read its d and pair sums there, where each weight row added the pairs again; Q6_K's ignore yd.
typedef void (*lsq_rows_kernel_t)(int n, const void *w, const char *xq, size_t xq_bytes, const float *yd,
                                  float *s, size_t ls);

// The kernels for 0..LSQ_ROWS rows (entry 0 is NULL), or NULL where `type` has none here. With
// `ahead`, they ask for the weights ahead of their use (lsq_ahead): for the first rows of a pass,
// which stream the weights from memory; the rows after them find the weights in cache, where the
// requests only cost instructions.
const lsq_rows_kernel_t *lsq_rows_kernels(int type, int ahead);

// Activation rows a pair kernel takes at once: AVX-512's 32 registers hold eight rows' sums, and
// each weight block's unpacking, shared by the rows, is then a smaller part of the work.
#define LSQ_PAIR_ROWS 8

// Two weight rows (w and w + row_bytes) against nr (1..LSQ_PAIR_ROWS) activation rows: s[r * ls]
// and s[r * ls + 1] (kpairs.c; NULL where the type or the CPU has none).
typedef void (*lsq_pair_kernel_t)(int n, const void *w, size_t row_bytes, const char *xq, size_t xq_bytes,
                                  const float *yd, float *s, size_t ls);

// The kernels for 0..LSQ_PAIR_ROWS rows (entry 0 is NULL).
const lsq_pair_kernel_t *lsq_pair_kernels(int type);
