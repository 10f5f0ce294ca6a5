// Quantized products of up to LSQ_ROWS activation rows against one weight row (krows.c).
#pragma once

#include <stddef.h>

#define LSQ_ROWS 4

// s[r * ls] = weight row w (n values of the kernel's type) times activation row r, for the nr rows
// of xq (quantized to the type's vec_dot_type, xq_bytes apart); nr is fixed per kernel.
typedef void (*lsq_rows_kernel_t)(int n, const void *w, const char *xq, size_t xq_bytes, float *s, size_t ls);

// The kernels for 0..LSQ_ROWS rows (entry 0 is NULL), or NULL where `type` has none here.
const lsq_rows_kernel_t *lsq_rows_kernels(int type);
