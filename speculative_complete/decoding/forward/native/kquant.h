// Activations quantized for the products (kquant.c).
#pragma once

#include <stdint.h>

// k floats at x (a multiple of 256) to Q8_K blocks at out, bit for bit as ggml's
// quantize_row_q8_K_ref (but a block of zeros: its sums zero too).
void lsq_quantize_q8_K(const float *x, void *out, int64_t k);
