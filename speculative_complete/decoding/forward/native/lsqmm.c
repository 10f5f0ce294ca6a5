// Row-by-row quantized products on ggml's own CPU kernels, for the lean forward.
//
// Why: torch's 4-bit kernel is the only quantized product torch has on the CPU, and on AVX2 it is
// no faster than fp32 (it unpacks weights to floats); llama.cpp's kernels multiply the file's
// blocks with int8-quantized activations. This file calls them (ggml_get_type_traits_cpu:
// from_float quantizes an activation row, vec_dot multiplies it with one weight row), one output
// at a time, so every output is computed the same whatever the rows of the pass: batch-invariant
// by construction. Where the type has them, krows.c's kernels take any pass (each weight block
// unpacked once for up to four rows, the weights asked for ahead of the first rows' use) and, on
// AVX-512, kpairs.c's (two weight rows to a register, up to eight rows); both sum every output
// exactly as vec_dot sums it.
// Weight rows are split among a small pool of threads that spin between calls (a decode step is
// ~120 products ~20-100 us apart), as ggml's own threadpool does; each thread
// reads its own contiguous share of the rows, as ggml's mul_mat does, since threads taking turns
// over small chunks of one stream read memory at half the rate on the 2-core machine.

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sched.h>
#include <math.h>
#if defined(__AVX__)
#include <immintrin.h>  // fma8 and the AVX-512 weighted values
#endif

#include "ggml.h"
#include "ggml-cpu.h"
#define GGML_COMMON_DECL_C
#include "ggml-common.h"
#include "kpacked.h"
#include "kpool.h"
#include "kquant.h"
#include "krows.h"

#define MAX_THREADS 64
#define CHUNK_ROWS 16     // weight rows a thread takes at a time
#define SPIN_ROUNDS 200000 // pause-loop rounds a worker spins before sleeping

typedef struct {
    const char *w;          // weight rows, row_bytes apart
    size_t row_bytes;
    const char *xq;         // activation rows quantized to vec_dot_type, xq_bytes apart
    size_t xq_bytes;
    const float *yd;        // the activations' block scales as floats (fill_scales), or NULL
    int64_t yd_row;         // floats of yd per activation row
    ggml_vec_dot_t vec_dot;
    const lsq_rows_kernel_t *rows_kernels;  // several rows at once (krows.c), or NULL: vec_dot
    const lsq_rows_kernel_t *cached_rows_kernels;  // the same without asking for the weights ahead
    const lsq_pair_kernel_t *pair_kernels;  // two weight rows at once (kpairs.c), or NULL
    const lsq_packed_kernel_t *packed_kernels;  // packed groups of rows (kpacked.c), or NULL
    const lsq_packed_kernel_t *cached_packed_kernels;  // the same without asking for the weights ahead
    size_t group_bytes;     // bytes of one packed group
    const int32_t *extras;  // the activations' extras for packed products (lsq_packed_extras)
    int64_t extras_row;     // int32s of extras per activation row
    int64_t n_in, n_out, rows;
    float *y;               // (rows, ldy): outputs of this weight at columns 0..n_out
    int64_t ldy;
    int64_t chunks;
    int64_t share;          // chunks per thread: thread t owns chunks [t * share, (t + 1) * share)
    struct {
        _Alignas(64) atomic_int_fast64_t chunk;
    } next[MAX_THREADS];    // each share's next chunk, on a cache line of its own
} job_t;

typedef struct attention_s attention_t;
static void run_attention(attention_t *a, int slot);
static struct attention_s attention_job;

// Work done row by row (lsq_for_each_row): fn(ctx, r) for every row r, each by whichever thread
// takes it.
typedef struct {
    void (*fn)(void *ctx, int64_t row);
    void *ctx;
    int64_t rows;
    atomic_int_fast64_t next;
} rows_job_t;

static struct {
    int threads;
    pthread_t workers[MAX_THREADS];
    atomic_int generation;     // bumped for every job
    atomic_int finished;       // workers done with the current job
    atomic_int stop;
    atomic_int sleepers;
    pthread_mutex_t mutex;
    pthread_cond_t wake;
    job_t job;
    rows_job_t rows_job;
    int task;  // 0: the matmul job, 1: the attention job, 2: the rows job
    int ready;
} pool;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

// Weight rows [first, last) two at a time against LSQ_PAIR_ROWS activation rows (kpairs.c), and
// any weight row left over (or all, where the type has no pair kernels) against LSQ_ROWS at a
// time (krows.c): each weight block unpacked once for them all.
static void run_rows(job_t *job, int64_t first, int64_t last) {
    const int64_t paired = job->pair_kernels ? first + ((last - first) & ~(int64_t) 1) : first;
    for (int64_t r = 0; paired > first && r < job->rows; r += LSQ_PAIR_ROWS) {
        int nr = job->rows - r < LSQ_PAIR_ROWS ? (int) (job->rows - r) : LSQ_PAIR_ROWS;
        const float *yd = job->yd ? job->yd + r * job->yd_row : NULL;
        for (int64_t o = first; o < paired; o += 2) {
            job->pair_kernels[nr]((int) job->n_in, job->w + o * job->row_bytes, job->row_bytes,
                                  job->xq + r * job->xq_bytes, job->xq_bytes, yd, job->y + r * job->ldy + o,
                                  (size_t) job->ldy);
        }
    }
    for (int64_t r = 0; paired < last && r < job->rows; r += LSQ_ROWS) {
        int nr = job->rows - r < LSQ_ROWS ? (int) (job->rows - r) : LSQ_ROWS;
        // The first rows bring a chunk's weights into cache, the rows after them find them there.
        lsq_rows_kernel_t kernel = (r == 0 ? job->rows_kernels : job->cached_rows_kernels)[nr];
        const float *yd = job->yd ? job->yd + r * job->yd_row : NULL;
        for (int64_t o = paired; o < last; o++) {
            kernel((int) job->n_in, job->w + o * job->row_bytes, job->xq + r * job->xq_bytes, job->xq_bytes, yd,
                   job->y + r * job->ldy + o, (size_t) job->ldy);
        }
    }
}

// Packed groups of weight rows [first, last) (whole groups) against every activation row,
// LSQ_PACKED_ACT_ROWS at a time (kpacked.c): the first rows stream a group's weights from memory,
// the rows after them find them in cache.
static void run_packed(job_t *job, int64_t first, int64_t last) {
    const int g_rows = lsq_packed_rows();
    for (int64_t o = first; o < last; o += g_rows) {
        const void *w = job->w + (o / g_rows) * job->group_bytes;
        for (int64_t r = 0; r < job->rows; r += LSQ_PACKED_ACT_ROWS) {
            int nr = job->rows - r < LSQ_PACKED_ACT_ROWS ? (int) (job->rows - r) : LSQ_PACKED_ACT_ROWS;
            lsq_packed_kernel_t kernel = (r == 0 ? job->packed_kernels : job->cached_packed_kernels)[nr];
            kernel((int) job->n_in, w, job->xq + r * job->xq_bytes, job->xq_bytes, job->extras + r * job->extras_row,
                   (size_t) job->extras_row, job->y + r * job->ldy + o, (size_t) job->ldy);
        }
    }
}

// The chunks of one share, in order, while any is left (its owner and a thread done with its own
// share may take turns).
static void run_share(job_t *job, int share) {
    int64_t end = (share + 1) * job->share < job->chunks ? (share + 1) * job->share : job->chunks;
    for (;;) {
        int64_t chunk = atomic_fetch_add(&job->next[share].chunk, 1);
        if (chunk >= end) return;
        int64_t first = chunk * CHUNK_ROWS;
        int64_t last = first + CHUNK_ROWS < job->n_out ? first + CHUNK_ROWS : job->n_out;
        if (job->packed_kernels) {
            run_packed(job, first, last);
            continue;
        }
        if (job->rows_kernels) {
            run_rows(job, first, last);
            continue;
        }
        // Each activation row against this chunk's weight rows: the rows stay in cache.
        for (int64_t r = 0; r < job->rows; r++) {
            const char *x = job->xq + r * job->xq_bytes;
            float *out = job->y + r * job->ldy;
            for (int64_t o = first; o < last; o++) {
                job->vec_dot((int) job->n_in, out + o, 0, job->w + o * job->row_bytes, 0, x, 0, 1);
            }
        }
    }
}

// Each thread first streams its own contiguous share of the weight rows, then helps with the
// shares still running (a thread that woke late does not hold up the product).
static void run_chunks(job_t *job, int slot) {
    int threads = pool.threads;
    for (int i = 0; i < threads; i++) run_share(job, (slot + i) % threads);
}

static void run_rows_job(rows_job_t *job) {
    for (;;) {
        const int64_t r = atomic_fetch_add(&job->next, 1);
        if (r >= job->rows) return;
        job->fn(job->ctx, r);
    }
}

// This thread's part of the current task (``pool.task``).
static void run_task(int slot) {
    if (pool.task == 0) run_chunks(&pool.job, slot);
    else if (pool.task == 1) run_attention(&attention_job, slot);
    else run_rows_job(&pool.rows_job);
}

static void *worker(void *arg) {
    (void) arg;
    int seen = atomic_load(&pool.generation);
    for (;;) {
        int spins = 0;
        while (atomic_load_explicit(&pool.generation, memory_order_acquire) == seen) {
            if (atomic_load(&pool.stop)) return NULL;
            if (++spins < SPIN_ROUNDS) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&pool.mutex);
            atomic_fetch_add(&pool.sleepers, 1);
            while (atomic_load(&pool.generation) == seen && !atomic_load(&pool.stop)) {
                pthread_cond_wait(&pool.wake, &pool.mutex);
            }
            atomic_fetch_sub(&pool.sleepers, 1);
            pthread_mutex_unlock(&pool.mutex);
            spins = 0;
        }
        if (atomic_load(&pool.stop)) return NULL;
        seen = atomic_load(&pool.generation);
        run_task((int) (intptr_t) arg);
        atomic_fetch_add_explicit(&pool.finished, 1, memory_order_release);
    }
}


// Hand the current task (``pool.task``) to the workers, do a share of it, wait for the rest.
static void post_and_join(void) {
    int helpers = pool.threads - 1;
    atomic_store(&pool.finished, 0);
    atomic_fetch_add_explicit(&pool.generation, 1, memory_order_release);
    if (atomic_load(&pool.sleepers) > 0) {
        pthread_mutex_lock(&pool.mutex);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.mutex);
    }
    run_task(0);
    while (atomic_load_explicit(&pool.finished, memory_order_acquire) < helpers) cpu_relax();
}

// Start the pool (threads in all, the caller included); 0 on success. Idempotent.
int lsq_init(int threads) {
    if (pool.ready) return 0;
    ggml_cpu_init();
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    pool.threads = threads;
    pthread_mutex_init(&pool.mutex, NULL);
    pthread_cond_init(&pool.wake, NULL);
    for (int i = 0; i < threads - 1; i++) {
        if (pthread_create(&pool.workers[i], NULL, worker, (void *) (intptr_t) (i + 1)) != 0) {
            pool.threads = i + 1;
            break;
        }
    }
    pool.ready = 1;
    return 0;
}

int lsq_threads(void) { return pool.threads; }

void lsq_for_each_row(void (*fn)(void *ctx, int64_t row), void *ctx, int64_t rows) {
    if (rows < 2 || pool.threads < 2 || !pool.ready) {
        for (int64_t r = 0; r < rows; r++) fn(ctx, r);
        return;
    }
    pool.rows_job.fn = fn;
    pool.rows_job.ctx = ctx;
    pool.rows_job.rows = rows;
    atomic_store(&pool.rows_job.next, 0);
    pool.task = 2;
    post_and_join();
}

// Bytes of one row of n values of ggml type `type`.
size_t lsq_row_bytes(int type, int64_t n) { return ggml_row_size((enum ggml_type) (type & ~LSQ_PACKED), n); }

// The type activations are quantized to for products with `type`'s rows.
int lsq_vec_dot_type(int type) {
    const struct ggml_type_traits_cpu *traits = ggml_get_type_traits_cpu((enum ggml_type) (type & ~LSQ_PACKED));
    return traits->vec_dot ? (int) traits->vec_dot_type : -1;
}

// Whether the CPU backend multiplies rows of `type` (and can quantize activations for them).
int lsq_supports(int type) {
    const struct ggml_type_traits_cpu *traits = ggml_get_type_traits_cpu((enum ggml_type) type);
    if (!traits->vec_dot) return 0;
    const struct ggml_type_traits_cpu *x = ggml_get_type_traits_cpu(traits->vec_dot_type);
    return traits->vec_dot_type == GGML_TYPE_F32 || x->from_float != NULL;
}

// The block scales of Q8_0 activations (d) and Q8_1 ones (d, s) as floats, converted once for all
// the weight rows that read them (exact: every half is a float); krows.c's kernels read them.
static struct {
    float *d;
    int64_t capacity;
} scales;

// Floats per activation block in `scales` for activations of type t.
static int scale_floats(enum ggml_type t) {
    switch (t) {
        case GGML_TYPE_Q8_0: return 1;
        case GGML_TYPE_Q8_1: return 2;
        case GGML_TYPE_Q8_K: return LSQ_Q8_K_SUMS;
        default: return 0;
    }
}

// A Q8_K block's d, then its sixteen sums of 16 values added in adjacent pairs (int16, exact: each
// is at most 32 * 128), which ggml's Q4_K vec_dot adds (hadd) for every weight row it meets.
static void q8_K_sums(const block_q8_K *y, float *out) {
    int16_t pairs[8];
    for (int k = 0; k < 8; k++) pairs[k] = (int16_t) (y->bsums[2 * k] + y->bsums[2 * k + 1]);
    out[0] = y->d;
    out[1] = out[2] = out[3] = 0.0f;
    memcpy(out + 4, pairs, sizeof(pairs));
}

// `scales` with room for `floats`; NULL if it cannot grow.
static float *scales_room(int64_t floats) {
    if (floats > scales.capacity) {
        float *d = realloc(scales.d, (size_t) floats * sizeof(float));
        if (!d) return NULL;
        scales.d = d;
        scales.capacity = floats;
    }
    return scales.d;
}

// The scales of `blocks` blocks of type t (Q8_0, Q8_1 or Q8_K) at xq into out, scale_floats(t) each.
static void fill_scales(enum ggml_type t, const char *xq, int64_t blocks, float *out) {
    const int per_block = scale_floats(t);
    if (t == GGML_TYPE_Q8_K) {
        for (int64_t b = 0; b < blocks; b++) q8_K_sums((const block_q8_K *) xq + b, out + b * per_block);
        return;
    }
    const size_t block_bytes = ggml_type_size(t);  // each block starts with its halves: d (then s)
    for (int64_t b = 0; b < blocks; b++) {
        const ggml_fp16_t *h = (const ggml_fp16_t *) (xq + b * block_bytes);
        for (int k = 0; k < per_block; k++) out[b * per_block + k] = ggml_fp16_to_fp32(h[k]);
    }
}

// The extras of activation rows for packed products (lsq_packed_extras), kept between calls.
static struct {
    int32_t *e;
    int64_t capacity;
} extras;

// `extras` with room for `size` int32s; NULL if it cannot grow.
static int32_t *extras_room(int64_t size) {
    if (size > extras.capacity) {
        int32_t *e = realloc(extras.e, (size_t) size * sizeof(int32_t));
        if (!e) return NULL;
        extras.e = e;
        extras.capacity = size;
    }
    return extras.e;
}

// What quantizes an activation row to dot_type: ggml's, or for Q8_K kquant.c's (the same values,
// vectorized where ggml's x86 build is not).
static ggml_from_float_t quantizer(enum ggml_type dot_type) {
    if (dot_type == GGML_TYPE_Q8_K) return lsq_quantize_q8_K;
    return ggml_get_type_traits_cpu(dot_type)->from_float;
}

// x (n floats) quantized to dot_type at out as the products quantize it, or with `reference`
// by ggml's own function (what the tests compare kquant.c's with). -1 for a type ggml cannot make.
int lsq_quantize_row(int dot_type, const float *x, int64_t n, void *out, int reference) {
    if (dot_type < 0 || dot_type >= GGML_TYPE_COUNT) return -1;
    ggml_from_float_t quantize = reference ? ggml_get_type_traits_cpu((enum ggml_type) dot_type)->from_float
                                           : quantizer((enum ggml_type) dot_type);
    if (!quantize || n % ggml_blck_size((enum ggml_type) dot_type)) return -1;
    quantize(x, out, n);
    return 0;
}

typedef struct {
    ggml_from_float_t quantize;
    enum ggml_type dot_type;
    const float *x;
    int64_t n_in, blocks;  // blocks: a row's
    char *xq;
    size_t xq_bytes;
    float *scales;    // the rows' block scales (fill_scales'), or NULL
    int32_t *extras;  // the rows' extras for packed products (lsq_packed_extras'), or NULL
    int64_t extras_row;
} prepare_t;

// One activation row of quantized_rows: quantized, then its scales and extras from its blocks.
static void prepare_row(void *ctx, int64_t r) {
    const prepare_t *p = ctx;
    char *q = p->xq + r * p->xq_bytes;
    p->quantize(p->x + r * p->n_in, q, p->n_in);
    if (p->scales) fill_scales(p->dot_type, q, p->blocks, p->scales + r * p->blocks * scale_floats(p->dot_type));
    if (p->extras) lsq_packed_extras(p->dot_type, q, p->blocks, p->extras + r * p->extras_row);
}

// The activation rows x (rows, n_in) as products with `type`'s rows read them: quantized to its
// vec_dot_type into scratch (rows * lsq_row_bytes(that type, n_in) bytes), or x itself for F32;
// *yd: their block scales as floats where the type has them (fill_scales), else NULL; *ex: with
// `with_extras`, their extras for packed products (lsq_packed_extras), else NULL. The rows are split
// between the threads (lsq_for_each_row).
static const char *quantized_rows(int type, int64_t n_in, const float *x, int64_t rows, void *scratch,
                                  const float **yd, int with_extras, const int32_t **ex) {
    enum ggml_type dot_type = ggml_get_type_traits_cpu((enum ggml_type) (type & ~LSQ_PACKED))->vec_dot_type;
    *yd = NULL;
    *ex = NULL;
    if (dot_type == GGML_TYPE_F32) return (const char *) x;
    prepare_t p = {quantizer(dot_type), dot_type, x, n_in, n_in / ggml_blck_size(dot_type), scratch,
                   ggml_row_size(dot_type, n_in), NULL, NULL, lsq_packed_extras_row(dot_type, n_in)};
    if (!p.quantize) return NULL;
    if (scale_floats(dot_type)) {
        p.scales = scales_room(p.blocks * rows * scale_floats(dot_type));
        if (!p.scales) return NULL;
    }
    if (with_extras) {
        p.extras = extras_room(rows * p.extras_row);
        if (!p.extras) return NULL;
    }
    lsq_for_each_row(prepare_row, &p, rows);
    *yd = p.scales;
    *ex = p.extras;
    return (const char *) scratch;
}

// y[r][0..n_out) = the activation rows xq (quantized by quantized_rows, yd their scales, ex their
// extras) times the n_out weight rows of type `type` at w, transposed; y's rows are ldy floats
// apart (a column slice of a wider output). A type with LSQ_PACKED: w holds the rows packed
// (lsq_pack). `reference`: ggml's vec_dot for every output, on the calling thread (what the tests
// compare the file's blocks' faster kernels with).
static void product(int packed_type, const void *w, int64_t n_out, int64_t n_in, const char *xq, const float *yd,
                    const int32_t *ex, int64_t rows, float *y, int64_t ldy, int reference) {
    const int type = packed_type & ~LSQ_PACKED, packed = packed_type != type;
    const struct ggml_type_traits_cpu *traits = ggml_get_type_traits_cpu((enum ggml_type) type);
    job_t *job = &pool.job;
    job->w = (const char *) w;
    job->row_bytes = ggml_row_size((enum ggml_type) type, n_in);
    job->packed_kernels = packed ? lsq_packed_kernels(type, 1) : NULL;
    job->cached_packed_kernels = packed ? lsq_packed_kernels(type, 0) : NULL;
    job->group_bytes = packed ? lsq_packed_group_bytes(type, n_in) : 0;
    job->extras = ex;
    job->extras_row = lsq_packed_extras_row(traits->vec_dot_type, n_in);
    job->xq = xq;
    job->xq_bytes = ggml_row_size(traits->vec_dot_type, n_in);
    job->yd = yd;
    job->yd_row = yd ? scale_floats(traits->vec_dot_type) * (n_in / ggml_blck_size(traits->vec_dot_type)) : 0;
    job->vec_dot = traits->vec_dot;
    // krows.c's and kpairs.c's kernels where the type has them, one row included (they ask for
    // the weights ahead, which vec_dot does not); else, and for `reference`, ggml's own vec_dot.
    job->rows_kernels = reference || packed ? NULL : lsq_rows_kernels(type, 1);
    job->cached_rows_kernels = reference || packed ? NULL : lsq_rows_kernels(type, 0);
    job->pair_kernels = job->rows_kernels ? lsq_pair_kernels(type) : NULL;
    job->n_in = n_in;
    job->n_out = n_out;
    job->rows = rows;
    job->y = y;
    job->ldy = ldy;
    job->chunks = (n_out + CHUNK_ROWS - 1) / CHUNK_ROWS;
    if (job->chunks < 2 || pool.threads < 2 || reference) {
        job->share = job->chunks;
        atomic_store(&job->next[0].chunk, 0);
        run_share(job, 0);
        return;
    }
    job->share = (job->chunks + pool.threads - 1) / pool.threads;
    for (int t = 0; t < pool.threads; t++) atomic_store(&job->next[t].chunk, t * job->share);
    pool.task = 0;
    post_and_join();
}

typedef struct {
    float *y;
    const float *residual;
    int64_t ldy, n;
} residual_t;

// Row r of y (n of its ldy floats) plus the same of residual's.
static void add_residual_row(void *ctx, int64_t r) {
    const residual_t *a = ctx;
    for (int64_t c = 0; c < a->n; c++) a->y[r * a->ldy + c] += a->residual[r * a->ldy + c];
}

// Several weights side by side (q, k and v; gate and up) in one call: weight i's n_outs[i] rows
// of types[i] at ws[i] fill y's next n_outs[i] columns. x (rows, n_in) is quantized once for
// weights whose activation type is the one before's into scratch (at least rows *
// lsq_row_bytes(lsq_vec_dot_type(type), n_in) bytes). Each output is the same as lsq_matmul's for
// its weight alone, plus residual's element where residual is not NULL (rows, ldy: a layer's
// input, which its output adds to). 0, or a negative code (-3: a packed type that this build does
// not pack, or `reference` asked of one).
static int matmul_many(int count, const int *types, const void *const *ws, const int64_t *n_outs, int64_t n_in,
                       const float *x, int64_t rows, float *y, int64_t ldy, void *scratch, const float *residual,
                       int reference) {
    if (!pool.ready) return -1;
    int quantized_for = -1;
    const char *xq = NULL;
    const float *yd = NULL;
    const int32_t *ex = NULL;
    float *first = y;
    for (int i = 0; i < count; i++) {
        const int type = types[i] & ~LSQ_PACKED;
        const struct ggml_type_traits_cpu *traits = ggml_get_type_traits_cpu((enum ggml_type) type);
        if (!traits->vec_dot) return -1;
        if (type != types[i] && (reference || !lsq_packed_kernels(type, 0) || n_outs[i] % lsq_packed_rows())) return -3;
        if ((int) traits->vec_dot_type != quantized_for) {  // the extras only packed kernels read
            xq = quantized_rows(type, n_in, x, rows, scratch, &yd, type != types[i], &ex);
            if (!xq) return -2;
            quantized_for = (int) traits->vec_dot_type;
        }
        if (type != types[i] && !ex) {  // a packed weight after one not packed, of one activation type
            int32_t *room = extras_room(rows * lsq_packed_extras_row(traits->vec_dot_type, n_in));
            if (!room) return -2;
            lsq_packed_extras(traits->vec_dot_type, xq, rows * (n_in / ggml_blck_size(traits->vec_dot_type)), room);
            ex = room;
        }
        product(types[i], ws[i], n_outs[i], n_in, xq, yd, ex, rows, y, ldy, reference);
        y += n_outs[i];
    }
    if (residual) {
        residual_t a = {first, residual, ldy, y - first};
        lsq_for_each_row(add_residual_row, &a, rows);
    }
    return 0;
}

int lsq_matmul_many(int count, const int *types, const void *const *ws, const int64_t *n_outs, int64_t n_in,
                    const float *x, int64_t rows, float *y, int64_t ldy, void *scratch, const float *residual) {
    return matmul_many(count, types, ws, n_outs, n_in, x, rows, y, ldy, scratch, residual, 0);
}

// y[r][0..n_out) = x (rows, n_in) times the n_out weight rows of type `type` at w, transposed.
static int matmul(int type, const void *w, int64_t n_out, int64_t n_in, const float *x, int64_t rows,
                  float *y, int64_t ldy, void *scratch, int reference) {
    return matmul_many(1, &type, &w, &n_out, n_in, x, rows, y, ldy, scratch, NULL, reference);
}

typedef struct {
    const float *x, *w;
    int64_t n;
    float eps;
    float *out;
} rms_norm_t;

// One row of lsq_rms_norm: its sum of squares in four lanes (double: each square exact, the
// lanes added in a fixed order), so that the adds are not one chain of latencies.
static void rms_norm_row(void *ctx, int64_t r) {
    const rms_norm_t *a = ctx;
    const float *row = a->x + r * a->n;
    double lanes[4] = {0.0, 0.0, 0.0, 0.0};
    int64_t i = 0;
    for (; i + 4 <= a->n; i += 4) {
        for (int k = 0; k < 4; k++) lanes[k] += (double) row[i + k] * (double) row[i + k];
    }
    for (; i < a->n; i++) lanes[0] += (double) row[i] * (double) row[i];
    const double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    const float scale = (float) (1.0 / sqrt(sum / (double) a->n + (double) a->eps));
    float *o = a->out + r * a->n;
    for (i = 0; i < a->n; i++) o[i] = row[i] * scale * a->w[i];
}

// out (rows, n) = each row of x (rows, n) over its root mean square, times w: the sum of squares
// in one fixed order, so a row comes out the same in any pass (and on any thread).
int lsq_rms_norm(const float *x, const float *w, int64_t rows, int64_t n, float eps, float *out) {
    rms_norm_t a = {x, w, n, eps, out};
    lsq_for_each_row(rms_norm_row, &a, rows);
    return 0;
}

int lsq_matmul(int type, const void *w, int64_t n_out, int64_t n_in, const float *x, int64_t rows, float *y,
               int64_t ldy, void *scratch) {
    return matmul(type, w, n_out, n_in, x, rows, y, ldy, scratch, 0);
}

int lsq_matmul_reference(int type, const void *w, int64_t n_out, int64_t n_in, const float *x, int64_t rows,
                         float *y, int64_t ldy, void *scratch) {
    return matmul(type, w, n_out, n_in, x, rows, y, ldy, scratch, 1);
}

// out (count, n) = the weight rows `ids` of type `type` at w, dequantized to fp32 as ggml does.
int lsq_rows(int type, const void *w, int64_t n, const int64_t *ids, int64_t count, float *out) {
    const struct ggml_type_traits *traits = ggml_get_type_traits((enum ggml_type) type);
    size_t row_bytes = ggml_row_size((enum ggml_type) type, n);
    if (type == GGML_TYPE_F32) {
        for (int64_t i = 0; i < count; i++) memcpy(out + i * n, (const char *) w + ids[i] * row_bytes, row_bytes);
        return 0;
    }
    if (!traits->to_float) return -1;
    for (int64_t i = 0; i < count; i++) {
        traits->to_float((const char *) w + ids[i] * row_bytes, out + i * n, n);
    }
    return 0;
}

// The Euclidean norm of each of rows [first, first + count), dequantized as ``lsq_rows`` does, into
// out: summed in double and rounded up to float, so that a bound made of it is never short (the
// output layer's, ``NativeOutputLayer``); no fp32 copy of the rows is made. Callers split the rows
// between threads of their own (the call holds no shared state).
int lsq_row_norms(int type, const void *w, int64_t n, int64_t first, int64_t count, float *out) {
    size_t row_bytes = ggml_row_size((enum ggml_type) type, n);
    const struct ggml_type_traits *traits = ggml_get_type_traits((enum ggml_type) type);
    if (type != GGML_TYPE_F32 && !traits->to_float) return -1;
    float *row = malloc(n * sizeof(float));
    if (!row) return -2;
    for (int64_t i = 0; i < count; i++) {
        const char *src = (const char *) w + (first + i) * row_bytes;
        if (type == GGML_TYPE_F32) memcpy(row, src, row_bytes);
        else traits->to_float(src, row, n);
        double lanes[8] = {0};  // independent sums, so the loop is not one long chain of adds
        int64_t j = 0;
        for (; j + 8 <= n; j += 8)
            for (int k = 0; k < 8; k++) lanes[k] += (double) row[j + k] * (double) row[j + k];
        for (; j < n; j++) lanes[0] += (double) row[j] * (double) row[j];
        double sum = 0.0;
        for (int k = 0; k < 8; k++) sum += lanes[k];
        const double exact = sqrt(sum);
        const float norm = (float) exact;
        out[i] = (double) norm < exact ? nextafterf(norm, INFINITY) : norm;
    }
    free(row);
    return 0;
}

// ggml-quants.c's dequantization of Q8_K, which its type table does not list.
extern void dequantize_row_q8_K(const void *x, float *y, int64_t k);

// x quantized as type `t` (an activation type: Q8_0, Q8_K, F16, BF16, ...) back to floats.
static int restore(enum ggml_type t, const char *q, float *out, int64_t n) {
    if (t == GGML_TYPE_Q8_0) {  // blocks of an fp16 scale and 32 int8 values
        for (int64_t b = 0; b < n / 32; b++) {
            const char *block = q + b * 34;
            float d = ggml_fp16_to_fp32(*(const ggml_fp16_t *) block);
            for (int i = 0; i < 32; i++) out[b * 32 + i] = d * (float) ((const int8_t *) (block + 2))[i];
        }
        return 0;
    }
    if (t == GGML_TYPE_Q8_K) {
        dequantize_row_q8_K(q, out, n);
        return 0;
    }
    const struct ggml_type_traits *traits = ggml_get_type_traits(t);
    if (!traits->to_float) return -1;
    traits->to_float(q, out, n);
    return 0;
}

// For each of `rows` activation rows: the norm of (x less x as the products with `type`'s rows
// see it: quantized to their activation type and back), what a product's error bound needs.
// -1 where that type cannot be restored (Q8_1, whose block sums are rounded to fp16 besides).
int lsq_activation_error(int type, const float *x, int64_t n, int64_t rows, float *out, void *scratch,
                         float *restored) {
    enum ggml_type dot_type = ggml_get_type_traits_cpu((enum ggml_type) type)->vec_dot_type;
    if (dot_type == GGML_TYPE_F32) {
        for (int64_t r = 0; r < rows; r++) out[r] = 0.0f;
        return 0;
    }
    ggml_from_float_t quantize = quantizer(dot_type);
    if (!quantize || dot_type == GGML_TYPE_Q8_1) return -1;
    for (int64_t r = 0; r < rows; r++) {
        quantize(x + r * n, scratch, n);
        if (restore(dot_type, scratch, restored, n) != 0) return -1;
        double sum = 0.0;
        for (int64_t i = 0; i < n; i++) {
            double d = (double) x[r * n + i] - (double) restored[i];
            sum += d * d;
        }
        out[r] = (float) __builtin_sqrt(sum);
    }
    return 0;
}

// Each of `rows` activation rows as the products with `type`'s rows see it: quantized to their
// activation type and back into out (rows, n). -1 where that type cannot be restored.
int lsq_activation_rows(int type, const float *x, int64_t n, int64_t rows, float *out, void *scratch) {
    enum ggml_type dot_type = ggml_get_type_traits_cpu((enum ggml_type) (type & ~LSQ_PACKED))->vec_dot_type;
    if (dot_type == GGML_TYPE_F32) {
        for (int64_t i = 0; i < rows * n; i++) out[i] = x[i];
        return 0;
    }
    ggml_from_float_t quantize = quantizer(dot_type);
    if (!quantize || dot_type == GGML_TYPE_Q8_1) return -1;
    for (int64_t r = 0; r < rows; r++) {
        quantize(x + r * n, scratch, n);
        if (restore(dot_type, scratch, out + r * n, n) != 0) return -1;
    }
    return 0;
}

// Attention for `rows` query rows at positions start, start+1, ...: row r attends to keys
// 0..start+r. q: (rows, heads, dim) fp32, rotated and scaled; keys, values: (kv_heads, capacity,
// dim) fp32, the layer's cache; out: (rows, heads, dim). Each (row, head) is computed by the same
// operations whatever else is computed beside it: each score and each output value summed in an
// order fixed by dim and the row's own key count, so a row comes out the same in any pass:
// batch-invariant by construction. The queries that share a kv head (its grouped query heads, in
// every row of the pass) are taken up to QUERIES_AT_ONCE at a time, so that each key and value
// read from the cache serves them all; the keys all of them attend to are summed together, each
// query's further keys (a later row's) after, its sums carried on. Items go kv head by kv head,
// so that the threads read one kv head's keys and values while they fit their caches. One head
// at a time, the loops were bound by their loads (each key and value read once per head), not by
// their multiply-adds.
struct attention_s {
    const float *q, *keys, *values;
    float *out;
    int64_t capacity, rows, start;
    int heads, kv_heads, group, dim;
    int64_t queries;  // queries a kv head serves: rows * group
    int64_t chunks;   // items per kv head: its queries split into this many near-equal parts
    atomic_int_fast64_t next;
    int64_t total;
    float *scratch;  // (threads, QUERIES_AT_ONCE, capacity) scores
};

// ggml-cpu's vectorized exponentials (vec.h), compiled for this build's ISA: its sum runs in an
// order fixed by the length alone.
extern double ggml_vec_soft_max_f32(const int n, float *y, const float *x, float max);

// Eight floats as one vector: GCC and Clang lower these to the widest registers the build's ISA
// has (an AVX register, two SSE or NEON ones), without intrinsics for each.
typedef float lsq_v8 __attribute__((vector_size(32), aligned(4)));
typedef int32_t lsq_i8 __attribute__((vector_size(32), aligned(4)));
// Queries taken at a time: what AVX2's 16 registers hold of their sums; AVX-512's 32 hold twice as
// many, so a pass of several rows reads each kv head's keys and values half as often.
#if defined(__AVX512F__)
#define QUERIES_AT_ONCE 8
#else
#define QUERIES_AT_ONCE 4
#endif
// Keys whose scores are summed at once, and eight-value chunks of each query's output summed at
// once: with four queries, sums that fit AVX2's 16 registers beside what they read (AVX-512's
// 32 took twice as many and were no faster). Neither changes any sum's operations.
#define KEYS_AT_ONCE 2
#define VALUE_CHUNKS 2
// Cache rows asked for this many rows ahead of their use. A pass's keys and values come from memory
// (each layer's weights in between push them out of the caches), and the loops below stalled on
// each row's first load: the hardware's prefetcher did not run far enough ahead of them. Asking
// changes no sum.
#define ROWS_AHEAD 8

#define ALWAYS_INLINE inline __attribute__((always_inline))

static ALWAYS_INLINE lsq_v8 load8(const float *p) { return *(const lsq_v8 *) p; }

// Ask for row j of rows (dim floats each) ahead of its use, where there is one (j < n).
static ALWAYS_INLINE void row_ahead(const float *rows, int64_t j, int64_t n, int dim) {
    if (j >= n) return;
    const char *row = (const char *) (rows + j * dim);
    for (int b = 0; b < dim * (int) sizeof(float); b += 64) __builtin_prefetch(row + b, 0, 3);
}

// a * b + c rounded once, lane by lane, whatever the compiler would contract: every score and
// output value takes the same operations in every loop below.
static ALWAYS_INLINE lsq_v8 fma8(lsq_v8 a, lsq_v8 b, lsq_v8 c) {
#if defined(__FMA__) && defined(__AVX__)
    return (lsq_v8) _mm256_fmadd_ps((__m256) a, (__m256) b, (__m256) c);
#else
    lsq_v8 r;
    for (int i = 0; i < 8; i++) r[i] = fmaf(a[i], b[i], c[i]);
    return r;
#endif
}

// The lanes of v summed in a fixed tree.
static inline float lanes_sum(lsq_v8 v) {
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

#if defined(__AVX__)
// Level one of lanes_sum's tree for x and y: [x0+x4, x1+x5, x2+x6, x3+x7, y0+y4, ...].
static ALWAYS_INLINE __m256 halves_sum(lsq_v8 x, lsq_v8 y) {
    return _mm256_add_ps(_mm256_permute2f128_ps((__m256) x, (__m256) y, 0x20),
                         _mm256_permute2f128_ps((__m256) x, (__m256) y, 0x31));
}

// lanes_sum of each of v[0..8), as one vector in that order: the same tree for every lane,
// levels two and three shuffled across eight sums at once (float addition commutes exactly).
// One at a time, their lane extractions and scalar adds were a large part of attention's time.
static ALWAYS_INLINE __m256 lanes_sums(const lsq_v8 v[8]) {
    const __m256 a = halves_sum(v[0], v[4]), b = halves_sum(v[1], v[5]);
    const __m256 c = halves_sum(v[2], v[6]), d = halves_sum(v[3], v[7]);
    const __m256 ab = _mm256_add_ps(_mm256_shuffle_ps(a, b, 0x44), _mm256_shuffle_ps(a, b, 0xEE));
    const __m256 cd = _mm256_add_ps(_mm256_shuffle_ps(c, d, 0x44), _mm256_shuffle_ps(c, d, 0xEE));
    return _mm256_add_ps(_mm256_shuffle_ps(ab, cd, 0x88), _mm256_shuffle_ps(ab, cd, 0xDD));
}
#endif

// qn queries of one kv head: query i at q[i] (dim floats), attending to its first n[i] keys;
// its scores at scores + i * capacity, its output at out[i].
typedef struct {
    const float *q[QUERIES_AT_ONCE];
    float *out[QUERIES_AT_ONCE];
    int64_t n[QUERIES_AT_ONCE];
    int64_t common;  // keys every one of them attends to: the least n
} queries_t;

// Query q's score for key k: eight lanes over dim / 8 chunks, the lanes in a fixed tree (the
// dim % 8 tail added after, by key_scores).
static ALWAYS_INLINE float one_score(const float *q, const float *k, int chunks) {
    lsq_v8 acc = {0};
    for (int c = 0; c < chunks; c++) acc = fma8(load8(q + 8 * c), load8(k + 8 * c), acc);
    return lanes_sum(acc);
}

// scores[i * capacity + j] = q_i . keys[j] for j < n_i, for the qn queries of qs. Each score is
// summed alike (one_score's order, then the dim % 8 tail); the keys all of them attend to
// KEYS_AT_ONCE at a time, so that each chunk of a key, read once, serves every query and their
// sums overlap in the pipeline.
static ALWAYS_INLINE void key_scores(const queries_t *qs, const int qn, const float *keys, int dim, float *scores,
                                     int64_t capacity) {
    const int chunks = dim / 8;
    const int64_t n = qs->common;
    int64_t j = 0;
    for (; j + KEYS_AT_ONCE <= n; j += KEYS_AT_ONCE) {
        for (int t = 0; t < KEYS_AT_ONCE; t++) row_ahead(keys, j + ROWS_AHEAD + t, n, dim);
        lsq_v8 acc[KEYS_AT_ONCE][QUERIES_AT_ONCE] = {{{0}}};
        for (int c = 0; c < chunks; c++) {
            lsq_v8 k[KEYS_AT_ONCE];
            for (int t = 0; t < KEYS_AT_ONCE; t++) k[t] = load8(keys + (j + t) * dim + 8 * c);
            for (int i = 0; i < qn; i++) {
                const lsq_v8 qc = load8(qs->q[i] + 8 * c);
                for (int t = 0; t < KEYS_AT_ONCE; t++) acc[t][i] = fma8(qc, k[t], acc[t][i]);
            }
        }
#if defined(__AVX__) && KEYS_AT_ONCE == 2 && QUERIES_AT_ONCE % 4 == 0
        // Four queries at a time, query i's two scores in lanes 2i, 2i + 1 (a missing query's sums
        // are zeros, not stored).
        for (int f = 0; f < qn; f += 4) {
            const lsq_v8 order[8] = {acc[0][f],     acc[1][f],     acc[0][f + 1], acc[1][f + 1],
                                     acc[0][f + 2], acc[1][f + 2], acc[0][f + 3], acc[1][f + 3]};
            const __m256 sums = lanes_sums(order);
            const __m128 low = _mm256_castps256_ps128(sums), high = _mm256_extractf128_ps(sums, 1);
            float *to = scores + f * capacity + j;
            _mm_storel_pi((__m64 *) to, low);
            if (qn > f + 1) _mm_storeh_pi((__m64 *) (to + capacity), low);
            if (qn > f + 2) _mm_storel_pi((__m64 *) (to + 2 * capacity), high);
            if (qn > f + 3) _mm_storeh_pi((__m64 *) (to + 3 * capacity), high);
        }
#else
        for (int i = 0; i < qn; i++) {
            for (int t = 0; t < KEYS_AT_ONCE; t++) scores[i * capacity + j + t] = lanes_sum(acc[t][i]);
        }
#endif
    }
    for (int i = 0; i < qn; i++) {
        for (int64_t jj = j; jj < qs->n[i]; jj++) scores[i * capacity + jj] = one_score(qs->q[i], keys + jj * dim, chunks);
    }
    for (int d = 8 * chunks; d < dim; d++) {
        for (int i = 0; i < qn; i++) {
            for (int64_t jj = 0; jj < qs->n[i]; jj++)
                scores[i * capacity + jj] = fmaf(qs->q[i][d], keys[jj * dim + d], scores[i * capacity + jj]);
        }
    }
}

// Query i's output (dim floats at qs->out[i]) = scale[i] times the values weighted by its scores
// (at scores + i * capacity) of its n_i keys: each output value sums its keys in order, one fused
// multiply-add a key, from +0; VALUE_CHUNKS * 8 values of every query at a time (then 8, then one;
// first 32 with AVX-512) so that their sums stay in registers and each value read serves every
// query; a query's keys past the common ones carry its sums on.
static ALWAYS_INLINE void weighted_values(const float *scores, int64_t capacity, const queries_t *qs, const int qn,
                                          const float *values, int dim, const float *scale) {
    const int64_t n = qs->common;
    int d0 = 0;
#if defined(__AVX512F__)
    // The same sums 32 values at a time in two AVX-512 registers: half the instructions and loads.
    for (; d0 + 32 <= dim; d0 += 32) {
        __m512 acc[QUERIES_AT_ONCE][2];
        for (int i = 0; i < QUERIES_AT_ONCE; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
        for (int64_t j = 0; j < n; j++) {
            if (d0 == 0) row_ahead(values, j + ROWS_AHEAD, n, dim);  // whole rows: later d0 find them
            const __m512 v0 = _mm512_loadu_ps(values + j * dim + d0), v1 = _mm512_loadu_ps(values + j * dim + d0 + 16);
            for (int i = 0; i < qn; i++) {
                const __m512 p = _mm512_set1_ps(scores[i * capacity + j]);
                acc[i][0] = _mm512_fmadd_ps(p, v0, acc[i][0]);
                acc[i][1] = _mm512_fmadd_ps(p, v1, acc[i][1]);
            }
        }
        for (int i = 0; i < qn; i++) {
            for (int64_t j = n; j < qs->n[i]; j++) {
                const __m512 p = _mm512_set1_ps(scores[i * capacity + j]);
                acc[i][0] = _mm512_fmadd_ps(p, _mm512_loadu_ps(values + j * dim + d0), acc[i][0]);
                acc[i][1] = _mm512_fmadd_ps(p, _mm512_loadu_ps(values + j * dim + d0 + 16), acc[i][1]);
            }
            _mm512_storeu_ps(qs->out[i] + d0, _mm512_mul_ps(acc[i][0], _mm512_set1_ps(scale[i])));
            _mm512_storeu_ps(qs->out[i] + d0 + 16, _mm512_mul_ps(acc[i][1], _mm512_set1_ps(scale[i])));
        }
    }
#endif
    for (; d0 + 8 * VALUE_CHUNKS <= dim; d0 += 8 * VALUE_CHUNKS) {
        lsq_v8 acc[QUERIES_AT_ONCE][VALUE_CHUNKS] = {{{0}}};
        for (int64_t j = 0; j < n; j++) {
            if (d0 == 0) row_ahead(values, j + ROWS_AHEAD, n, dim);
            lsq_v8 v[VALUE_CHUNKS];
            for (int c = 0; c < VALUE_CHUNKS; c++) v[c] = load8(values + j * dim + d0 + 8 * c);
            for (int i = 0; i < qn; i++) {
                const float s = scores[i * capacity + j];
                const lsq_v8 p = {s, s, s, s, s, s, s, s};
                for (int c = 0; c < VALUE_CHUNKS; c++) acc[i][c] = fma8(p, v[c], acc[i][c]);
            }
        }
        for (int i = 0; i < qn; i++) {
            for (int64_t j = n; j < qs->n[i]; j++) {
                const float s = scores[i * capacity + j];
                const lsq_v8 p = {s, s, s, s, s, s, s, s};
                for (int c = 0; c < VALUE_CHUNKS; c++) acc[i][c] = fma8(p, load8(values + j * dim + d0 + 8 * c), acc[i][c]);
            }
            for (int c = 0; c < VALUE_CHUNKS; c++) *(lsq_v8 *) (qs->out[i] + d0 + 8 * c) = acc[i][c] * scale[i];
        }
    }
    for (; d0 + 8 <= dim; d0 += 8) {
        for (int i = 0; i < qn; i++) {
            lsq_v8 acc = {0};
            for (int64_t j = 0; j < qs->n[i]; j++) {
                const float s = scores[i * capacity + j];
                const lsq_v8 p = {s, s, s, s, s, s, s, s};
                acc = fma8(p, load8(values + j * dim + d0), acc);
            }
            *(lsq_v8 *) (qs->out[i] + d0) = acc * scale[i];
        }
    }
    for (; d0 < dim; d0++) {
        for (int i = 0; i < qn; i++) {
            float sum = 0.0f;
            for (int64_t j = 0; j < qs->n[i]; j++) sum = fmaf(scores[i * capacity + j], values[j * dim + d0], sum);
            qs->out[i][d0] = sum * scale[i];
        }
    }
}

// The largest of the n scores (each lane keeps its own largest, then the lanes are compared:
// the same value as one pass in order, max being exact).
static float largest(const float *scores, int64_t n) {
    lsq_v8 best = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const lsq_v8 s = *(const lsq_v8 *) (scores + j);
        const lsq_i8 above = s > best;  // all ones where s is the larger (NaN never is)
        best = (lsq_v8) ((above & (lsq_i8) s) | (~above & (lsq_i8) best));
    }
    float most = -INFINITY;
    for (int k = 0; k < 8; k++) most = best[k] > most ? best[k] : most;
    for (; j < n; j++) most = scores[j] > most ? scores[j] : most;
    return most;
}

// qn queries of one kv head over its keys and values; scores: QUERIES_AT_ONCE rows of capacity floats.
static ALWAYS_INLINE void attend_queries(const queries_t *qs, const int qn, const float *keys, const float *values,
                                         int dim, float *scores, int64_t capacity) {
    key_scores(qs, qn, keys, dim, scores, capacity);
    float scale[QUERIES_AT_ONCE];
    for (int i = 0; i < qn; i++) {
        float *row = scores + i * capacity;
        scale[i] = (float) (1.0 / ggml_vec_soft_max_f32((int) qs->n[i], row, row, largest(row, qs->n[i])));
    }
    weighted_values(scores, capacity, qs, qn, values, dim, scale);
}

// Item `item`: kv head g and part c of the queries it serves (query k: row k / group, that row's
// query head g * group + k % group).
static void attend_one(attention_t *a, int64_t item, float *scores) {
    const int g = (int) (item / a->chunks);
    const int64_t c = item % a->chunks, base = a->queries / a->chunks, extra = a->queries % a->chunks;
    const int64_t first = c * base + (c < extra ? c : extra);
    const int qn = (int) (base + (c < extra));
    queries_t qs;
    qs.common = a->capacity;
    for (int i = 0; i < qn; i++) {
        const int64_t r = (first + i) / a->group, h = g * a->group + (first + i) % a->group;
        qs.q[i] = a->q + (r * a->heads + h) * a->dim;
        qs.out[i] = a->out + (r * a->heads + h) * a->dim;
        qs.n[i] = a->start + r + 1;
        if (qs.n[i] < qs.common) qs.common = qs.n[i];
    }
    const float *keys = a->keys + (int64_t) g * a->capacity * a->dim;
    const float *values = a->values + (int64_t) g * a->capacity * a->dim;
    switch (qn) {  // each count its own loops, unrolled, their sums in registers
        case 1: attend_queries(&qs, 1, keys, values, a->dim, scores, a->capacity); break;
        case 2: attend_queries(&qs, 2, keys, values, a->dim, scores, a->capacity); break;
        case 3: attend_queries(&qs, 3, keys, values, a->dim, scores, a->capacity); break;
#if QUERIES_AT_ONCE == 8
        case 4: attend_queries(&qs, 4, keys, values, a->dim, scores, a->capacity); break;
        case 5: attend_queries(&qs, 5, keys, values, a->dim, scores, a->capacity); break;
        case 6: attend_queries(&qs, 6, keys, values, a->dim, scores, a->capacity); break;
        case 7: attend_queries(&qs, 7, keys, values, a->dim, scores, a->capacity); break;
        default: attend_queries(&qs, 8, keys, values, a->dim, scores, a->capacity); break;
#else
        default: attend_queries(&qs, 4, keys, values, a->dim, scores, a->capacity); break;
#endif
    }
}

static void run_attention(attention_t *a, int slot) {
    float *scores = a->scratch + (int64_t) slot * QUERIES_AT_ONCE * a->capacity;
    for (;;) {
        int64_t item = atomic_fetch_add(&a->next, 1);
        if (item >= a->total) return;
        attend_one(a, item, scores);
    }
}

// Floats of scratch lsq_attention needs for a cache of capacity positions.
int64_t lsq_attention_scratch(int64_t capacity) { return (int64_t) pool.threads * QUERIES_AT_ONCE * capacity; }

// x (pairs of floats, as complex numbers) times the complex factors f, into y.
static void rotate(const float *x, const float *f, int pairs, float *y) {
    for (int i = 0; i < pairs; i++) {
        const float a = x[2 * i], b = x[2 * i + 1], c = f[2 * i], d = f[2 * i + 1];
        y[2 * i] = a * c - b * d;
        y[2 * i + 1] = a * d + b * c;
    }
}

typedef struct {
    const float *qkv, *rotary;
    float *keys, *values, *q;
    int64_t capacity, start;
    int heads, kv_heads, dim;
} rotation_t;

// Row r of rotate_into_cache.
static void rotate_row(void *ctx, int64_t r) {
    const rotation_t *a = ctx;
    const int all = a->heads + 2 * a->kv_heads, rotated = a->heads + a->kv_heads, dim = a->dim;
    const float *row = a->qkv + r * all * dim, *factors = a->rotary + r * rotated * dim;
    for (int h = 0; h < a->heads; h++) rotate(row + h * dim, factors + h * dim, dim / 2, a->q + (r * a->heads + h) * dim);
    for (int h = 0; h < a->kv_heads; h++) {
        const int64_t at = ((int64_t) h * a->capacity + a->start + r) * dim;
        rotate(row + (a->heads + h) * dim, factors + (a->heads + h) * dim, dim / 2, a->keys + at);
        memcpy(a->values + at, row + (rotated + h) * dim, dim * sizeof(float));
    }
}

// A pass's projected heads qkv (rows, heads + 2 kv_heads, dim), q and k not yet rotated: each q
// and k head times its row's rotary factors (rotary: rows, heads + kv_heads, dim / 2 complex,
// the query heads' scale in theirs) into q (rows, heads, dim) and the cache's keys at positions
// start.., v copied to the cache's values as is. Each value is its own element's alone.
static void rotate_into_cache(const float *qkv, const float *rotary, float *keys, float *values,
                              int64_t capacity, int64_t rows, int64_t start, int heads, int kv_heads, int dim,
                              float *q) {
    rotation_t a = {qkv, rotary, keys, values, q, capacity, start, heads, kv_heads, dim};
    lsq_for_each_row(rotate_row, &a, rows);
}

// A layer's attention for a pass (see attend_one), from its projected heads (see
// rotate_into_cache); q_scratch holds rows * heads * dim floats, scratch lsq_attention_scratch(capacity).
int lsq_attention(const float *qkv, const float *rotary, float *keys, float *values, int64_t capacity, int64_t rows,
                  int64_t start, int heads, int kv_heads, int dim, float *out, float *q_scratch, float *scratch) {
    if (!pool.ready || kv_heads < 1 || heads % kv_heads || dim % 2 || start + rows > capacity) return -1;
    rotate_into_cache(qkv, rotary, keys, values, capacity, rows, start, heads, kv_heads, dim, q_scratch);
    attention_t *a = &attention_job;
    a->q = q_scratch;
    a->keys = keys;
    a->values = values;
    a->out = out;
    a->capacity = capacity;
    a->rows = rows;
    a->start = start;
    a->heads = heads;
    a->kv_heads = kv_heads;
    a->group = heads / kv_heads;
    a->queries = rows * a->group;
    a->chunks = (a->queries + QUERIES_AT_ONCE - 1) / QUERIES_AT_ONCE;
    a->dim = dim;
    a->total = kv_heads * a->chunks;
    a->scratch = scratch;
    atomic_store(&a->next, 0);
    if (pool.threads < 2) {
        run_attention(a, 0);
        return 0;
    }
    pool.task = 1;
    post_and_join();
    return 0;
}
