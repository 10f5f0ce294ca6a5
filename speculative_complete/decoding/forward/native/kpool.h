// The library's threads (lsqmm.c) for work outside its products and attention.
#pragma once

#include <stdint.h>

// fn(ctx, r) for r in [0, rows), the rows split between the pool's threads where there are
// several (each row's work its own, so its result is the same whichever thread does it); on the
// calling thread alone for one row. Not to be called from inside such work.
void lsq_for_each_row(void (*fn)(void *ctx, int64_t row), void *ctx, int64_t rows);
