// Weights packed at load into groups of interleaved rows, and their products (kpacked.c): Q4_K
// and Q6_K; Q5_0 with AVX-512 VNNI.
#pragma once

#include <stddef.h>
#include <stdint.h>

// Added to a GGML type id: the weight's rows are packed (lsq_pack), not the file's blocks.
#define LSQ_PACKED 0x10000

// Activation rows a packed kernel takes at once (the rest of a pass in further calls): a verify
// pass of up to eight rows walks the weights once. AVX-512's 32 registers hold eight rows' sums;
// AVX2's 16 do not, and its compiler keeps some in L1 instead, which cost less than walking the
// weights four times, two rows at a time (benchmarks/README.md, models_bench).
#define LSQ_PACKED_ACT_ROWS 8

// int32s a packed product reads per Q8_K activation block beside the block itself
// (lsq_packed_extras): -32 times each of its 32 sums of 8 values (Q6_K's offset), then, from
// LSQ_PACKED_PAIRS on, its 8 sums of 32 values as int16 pairs (Q4_K's mins).
#define LSQ_PACKED_PAIRS 32
#define LSQ_PACKED_EXTRAS 36

// Weight rows in one packed group (16 with AVX-512 VNNI, 8 with AVX2; 0: nothing is packed).
int lsq_packed_rows(void);

// Bytes of `rows` rows of n values of `type` packed; 0 where the type is not packed by this build
// or the rows do not fill whole groups.
size_t lsq_packed_bytes(int type, int64_t rows, int64_t n);

// Packs groups [first, first + count) of the rows at src (the file's blocks, `rows` of n values of
// `type`) into dst (lsq_packed_bytes); callers may split the groups between threads. 0 on success.
int lsq_pack(int type, const void *src, int64_t rows, int64_t n, int64_t first, int64_t count, void *dst);

// int32s a packed product reads per Q8_0 activation block (Q5_0's): -16 times the sum of its
// values (the weights' offset), then its scale as a float's bits.
#define LSQ_PACKED_EXTRAS_Q8_0 2

// int32s of extras per activation row of n values quantized to `dot_type` (GGML_TYPE_Q8_K or
// GGML_TYPE_Q8_0); 0 where no packed kernel of this build reads that type.
int64_t lsq_packed_extras_row(int dot_type, int64_t n);

// The extras of `blocks` blocks of `dot_type` at xq into out (lsq_packed_extras_row's per block).
void lsq_packed_extras(int dot_type, const void *xq, int64_t blocks, int32_t *out);

// y[r * ldy + 0 .. lsq_packed_rows()) = one packed group at w (n inputs) times activation row r
// (Q8_K blocks at xq, Q8_0 for Q5_0, xq_bytes apart; their extras at ex, ex_row int32s apart),
// for the kernel's fixed count of rows. `ahead`: the kernel asks for the weights ahead of their use.
typedef void (*lsq_packed_kernel_t)(int n, const void *w, const char *xq, size_t xq_bytes, const int32_t *ex,
                                    size_t ex_row, float *y, size_t ldy);

// The kernels for 0..LSQ_PACKED_ACT_ROWS rows (entry 0 is NULL), asking ahead or not; NULL where
// `type` is not packed by this build.
const lsq_packed_kernel_t *lsq_packed_kernels(int type, int ahead);

// Bytes of one packed group's blocks for n inputs (the stride between groups).
size_t lsq_packed_group_bytes(int type, int64_t n);
