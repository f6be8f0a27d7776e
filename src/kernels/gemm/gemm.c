/*
 * gemm.c — the portable SGEMM framework: the loops around a kernel set's
 * microkernel (see gemm.h), edge tiles, threads and the workspace.
 * Nothing here depends on the instruction set; the kernel set brings its
 * microkernel, its packing and its block sizes (gemm_config.c).
 */
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/gemm16.h"

#include "internal.h"
#include "parallel.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Work (2*m*n*k flops) per thread below which starting another thread
 * costs more than it saves: a thread start is some 20-50 us, in which one
 * core does some 4-8 Mflop. */
#define GEMM_MIN_FLOPS_PER_THREAD ((size_t)1 << 23)

/* Chunks per thread the split side is cut into, so that a thread slowed
 * down (by the machine's other work) leaves its chunks to the others. */
#define GEMM_CHUNKS_PER_THREAD 4

/* Floats of the shared operand packed per task of the first phase. */
#define GEMM_PACK_FLOATS_PER_TASK ((size_t)1 << 16)

/* Buffers within the workspace start on 64-byte lines (16 floats). */
#define GEMM_ALIGN_FLOATS 16

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }
static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }
static size_t round_up(size_t a, size_t b) { return ceil_div(a, b) * b; }

/* Blocks of at most block (a multiple of unit) covering n, as even as the
 * unit allows: no thin last block. */
static size_t even_block(size_t n, size_t block, size_t unit) {
    size_t blocks = ceil_div(n, block);
    return min_size(block, round_up(ceil_div(n, blocks), unit));
}

/*
 * How a call runs. The larger side of C (rows, or columns) is split into
 * chunks; the other operand is shared: B when rows are split, A when
 * columns are. Phase 1 packs the shared operand whole, once, its panels
 * divided among the threads. Phase 2 hands out the chunks: a thread takes
 * the next one, packs its own slice of the other operand, and runs the
 * microkernel over it. Which thread computes a chunk changes nothing in
 * the arithmetic, so the result is the same for any thread count. When
 * the shared operand is large (k large), both phases run per super-block
 * of k, in order.
 */
typedef struct gemm_plan {
    bool split_rows;
    size_t parts;          /* threads */
    size_t kc;             /* the k blocks: they depend on k alone */
    size_t super_k;        /* k per super-block: a multiple of kc */
    size_t chunk, chunks;  /* rows (split_rows) or columns per chunk, and how many */
    size_t shared_width;   /* rows of A (or columns of B) packed, padded to the tile */
    size_t shared_floats;  /* the packed shared operand */
    size_t chunk_floats;   /* one thread's slice of the other operand */
    size_t tile_floats;    /* one thread's edge tile */
} gemm_plan;

static bool make_plan(const attn_gemm_kernel *uk, size_t threads, size_t m, size_t n, size_t k,
                      gemm_plan *plan) {
    plan->split_rows = m >= n;
    size_t split = plan->split_rows ? m : n, unit = plan->split_rows ? uk->mr : uk->nr;
    size_t block = plan->split_rows ? uk->mc : uk->nc;
    size_t units = ceil_div(split ? split : 1, unit);
    size_t parts = threads > 1 ? attn_parallel_parts(threads) : 1;
    /* 2mnk in double: no overflow for any size that fits in memory. */
    double flops = 2.0 * (double)m * (double)n * (double)k;
    double by_work = flops / (double)GEMM_MIN_FLOPS_PER_THREAD;
    if ((double)parts > by_work) parts = by_work < 1.0 ? 1 : (size_t)by_work;
    if (parts > units) parts = units;
    if (parts == 0) parts = 1;
    plan->parts = parts;
    plan->kc = even_block(k ? k : 1, uk->kc, 1);
    /* One thread: the cache block. More: GEMM_CHUNKS_PER_THREAD chunks a
     * thread, no larger than the cache block. */
    size_t per_chunk = ceil_div(split ? split : 1, parts * GEMM_CHUNKS_PER_THREAD);
    size_t chunk = parts == 1 ? block : round_up(per_chunk, unit);
    plan->chunk = even_block(split ? split : 1, min_size(chunk, block), unit);
    plan->chunks = ceil_div(split ? split : 1, plan->chunk);
    size_t other = plan->split_rows ? n : m, other_unit = plan->split_rows ? uk->nr : uk->mr;
    plan->shared_width = round_up(other ? other : 1, other_unit);
    plan->tile_floats = round_up(uk->mr * uk->nr, GEMM_ALIGN_FLOATS);
    /* At most uk->shared_max floats of the shared operand are packed at a
     * time: beyond it, k is taken in super-blocks of whole kc blocks, each
     * packed and then computed, so the workspace stays bounded for any k. */
    size_t kc_per_super = uk->shared_max / plan->shared_width / plan->kc;
    plan->super_k = (kc_per_super ? kc_per_super : 1) * plan->kc;
    size_t shared, slice;
    if (!attn_mul_size(plan->shared_width, min_size(k ? k : 1, plan->super_k), &shared) ||
        !attn_mul_size(plan->chunk, plan->kc, &slice) || !attn_floats_fit(shared) ||
        !attn_floats_fit(slice))
        return false;
    plan->shared_floats = round_up(shared, GEMM_ALIGN_FLOATS);
    plan->chunk_floats = round_up(slice, GEMM_ALIGN_FLOATS);
    return true;
}

size_t attn_sgemm_parts(const attn_gemm_kernel *uk, size_t threads, size_t m, size_t n,
                        size_t k) {
    gemm_plan plan;
    return make_plan(uk, threads, m, n, k, &plan) ? plan.parts : 1;
}

size_t attn_sgemm_workspace(const attn_gemm_kernel *uk, size_t threads, size_t m, size_t n,
                            size_t k) {
    gemm_plan plan;
    size_t per_part, all_parts, total;
    if (!make_plan(uk, threads, m, n, k, &plan) ||
        !attn_add_size(plan.chunk_floats, plan.tile_floats, &per_part) ||
        !attn_mul_size(per_part, plan.parts, &all_parts) ||
        !attn_add_size(all_parts, plan.shared_floats, &total) || !attn_floats_fit(total))
        return 0;
    return total;
}

typedef struct gemm_call {
    const attn_gemm_kernel *uk;
    bool trans_a, trans_b;
    size_t m, n, k;
    float alpha, beta;
    const float *a, *b;
    const uint16_t *b16;          /* or B in 16 bits (b NULL) ... */
    attn_gemm16_pack_fn *pack_b16; /* ... packed by this: widened into uk's panels, or ... */
    attn_sgemm_micro_b16_fn *micro_b16; /* ... kept in 16 bits for this tile (else NULL) */
    attn_dtype b16_dtype;
    size_t lda, ldb;
    float *c;
    size_t ldc;
    const float *bias; /* n floats added to every row of C, or NULL */
    attn_pool *pool;   /* the workers of the plan's parts, or NULL */
    gemm_plan plan;
    size_t k0, k1;           /* the super-block of k at work */
    float *shared;           /* its packed shared operand: kc block after kc block */
    float *part_buffers;     /* per part: chunk slice, then edge tile */
    size_t pack_groups;      /* phase 1 tasks */
    atomic_size_t next_chunk;
} gemm_call;

/* Element e of packed B's buffer at base: floats, or 16-bit elements where
 * the tile widens them (micro_b16), in the same order and half the bytes. */
static void *packed_b_at(const gemm_call *g, void *base, size_t e) {
    return g->micro_b16 ? (void *)((uint16_t *)base + e) : (void *)((float *)base + e);
}

/* The shared operand's packed kc block that starts at pc: A's floats, or
 * B's panels (split_rows). */
static void *shared_block(const gemm_call *g, size_t pc) {
    size_t e = (pc - g->k0) * g->plan.shared_width;
    return g->plan.split_rows ? packed_b_at(g, g->shared, e) : (void *)(g->shared + e);
}

/* Columns [j, j + len) of op(B), kcb deep from p, packed into dst: float
 * B by the kernel's pack_b, 16-bit B by pack_b16 (widened into the same
 * panels, or in its 16 bits for micro_b16). */
static void pack_b_block(const gemm_call *g, size_t kcb, size_t p, size_t j, size_t len,
                         void *dst) {
    size_t at = g->trans_b ? j * g->ldb + p : p * g->ldb + j;
    if (g->b16)
        g->pack_b16(g->b16_dtype, kcb, len, g->b16 + at, g->ldb, g->trans_b, dst);
    else
        g->uk->pack_b(kcb, len, g->b + at, g->ldb, g->trans_b, dst);
}

/* Phase 1: panels [begin, end) of the pack groups, every kc block. */
static void pack_shared(void *arg, size_t begin, size_t end) {
    const gemm_call *g = arg;
    const attn_gemm_kernel *uk = g->uk;
    size_t width = g->plan.split_rows ? uk->nr : uk->mr;
    size_t total = g->plan.split_rows ? g->n : g->m, panels = ceil_div(total, width);
    size_t first = panels * begin / g->pack_groups, last = panels * end / g->pack_groups;
    size_t v0 = first * width, len = min_size(last * width, total) - v0;
    if (len == 0) return;
    for (size_t pc = g->k0; pc < g->k1; pc += g->plan.kc) {
        size_t kcb = min_size(g->plan.kc, g->k1 - pc);
        if (g->plan.split_rows)
            pack_b_block(g, kcb, pc, v0, len, packed_b_at(g, shared_block(g, pc), v0 * kcb));
        else
            uk->pack_a(kcb, len, g->trans_a ? g->a + pc * g->lda + v0 : g->a + v0 * g->lda + pc,
                       g->lda, g->trans_a, (float *)shared_block(g, pc) + v0 * kcb);
    }
}

/* The microkernel of the call on a tile: uk's, or micro_b16 on 16-bit
 * panels of B. */
static void micro(const gemm_call *g, size_t kc, const float *pa, const void *pb, float *c,
                  size_t ldc, float beta, const float *bias) {
    if (g->micro_b16)
        g->micro_b16(kc, pa, pb, c, ldc, g->alpha, beta, bias);
    else
        g->uk->micro(kc, pa, pb, c, ldc, g->alpha, beta, bias);
}

/* An edge tile (rows x cols of c, short of MR x NR): the microkernel runs on
 * a scratch tile holding c's values, and on the bias's cols padded to NR,
 * so it rounds as a full tile would. */
static void edge_tile(const gemm_call *g, size_t kc, const float *pa, const void *pb, float *c,
                      size_t ldc, size_t rows, size_t cols, float beta, const float *bias,
                      float *tile) {
    const attn_gemm_kernel *uk = g->uk;
    size_t nr = uk->nr;
    float bias_row[ATTN_GEMM_NR_MAX] = {0};
    if (bias) memcpy(bias_row, bias, cols * sizeof *bias);
    memset(tile, 0, uk->mr * nr * sizeof *tile);
    if (beta != 0.0f)
        for (size_t i = 0; i < rows; i++) memcpy(tile + i * nr, c + i * ldc, cols * sizeof *c);
    micro(g, kc, pa, pb, tile, nr, beta, bias ? bias_row : NULL);
    for (size_t i = 0; i < rows; i++) memcpy(c + i * ldc, tile + i * nr, cols * sizeof *c);
}

/* The microkernel over rows [i0, i1) x columns [j0, j1) of C, both packed
 * (pa: panels from row i0; pb: panels from column j0), kcb deep, with the
 * bias where given (the first kc block: no copy of the bias rows into C,
 * and no read of them back). A micro-panel of A
 * stays in L1 while the B micro-panels stream past it. */
static void macro_kernel(const gemm_call *g, size_t kcb, float beta, const float *bias,
                         const float *pa, void *pb, size_t i0, size_t i1, size_t j0, size_t j1,
                         float *tile) {
    const attn_gemm_kernel *uk = g->uk;
    size_t mr = uk->mr, nr = uk->nr, ldc = g->ldc;
    for (size_t i = i0; i < i1; i += mr) {
        size_t rows = min_size(mr, i1 - i);
        const float *pa_i = pa + (i - i0) * kcb;
        float *c_row = g->c + i * ldc;
        for (size_t j = j0; j < j1; j += nr) {
            size_t cols = min_size(nr, j1 - j);
            const void *pb_j = packed_b_at(g, pb, (j - j0) * kcb);
            const float *bias_j = bias ? bias + j : NULL;
            if (rows == mr && cols == nr)
                micro(g, kcb, pa_i, pb_j, c_row + j, ldc, beta, bias_j);
            else
                edge_tile(g, kcb, pa_i, pb_j, c_row + j, ldc, rows, cols, beta, bias_j, tile);
        }
    }
}

/* Phase 2, one chunk: rows (split_rows) or columns [s0, s1) of C. */
static void run_chunk(const gemm_call *g, size_t s0, size_t s1, float *slice, float *tile) {
    const attn_gemm_kernel *uk = g->uk;
    for (size_t pc = g->k0; pc < g->k1; pc += g->plan.kc) {
        size_t kcb = min_size(g->plan.kc, g->k1 - pc);
        /* The first kc block applies beta and the bias, the later ones
         * add to c. */
        float beta = pc == 0 ? g->beta : 1.0f;
        const float *bias = pc == 0 ? g->bias : NULL;
        void *shared = shared_block(g, pc);
        if (g->plan.split_rows) {
            /* A slice (rows s0..s1) in L3; B in nc-column blocks from L2 */
            uk->pack_a(kcb, s1 - s0, g->trans_a ? g->a + pc * g->lda + s0 : g->a + s0 * g->lda + pc,
                       g->lda, g->trans_a, slice);
            size_t nc = even_block(g->n, uk->nc, uk->nr);
            for (size_t jc = 0; jc < g->n; jc += nc)
                macro_kernel(g, kcb, beta, bias, slice, packed_b_at(g, shared, jc * kcb), s0, s1,
                             jc, min_size(jc + nc, g->n), tile);
        } else {
            /* B slice (columns s0..s1, at most nc) in L2; A micro-panels
             * from the shared block, in mc-row blocks */
            pack_b_block(g, kcb, pc, s0, s1 - s0, slice);
            size_t mc = even_block(g->m, uk->mc, uk->mr);
            for (size_t ic = 0; ic < g->m; ic += mc)
                macro_kernel(g, kcb, beta, bias, (const float *)shared + ic * kcb, slice, ic,
                             min_size(ic + mc, g->m), s0, s1, tile);
        }
    }
}

/* Phase 2: part takes chunks until none is left. */
static void run_chunks(void *arg, size_t part, size_t begin, size_t end) {
    (void)begin;
    (void)end;
    gemm_call *g = arg;
    float *slice = g->part_buffers + part * (g->plan.chunk_floats + g->plan.tile_floats);
    float *tile = slice + g->plan.chunk_floats;
    size_t split = g->plan.split_rows ? g->m : g->n;
    for (;;) {
        size_t chunk = atomic_fetch_add(&g->next_chunk, 1);
        if (chunk >= g->plan.chunks) break;
        size_t s0 = chunk * g->plan.chunk;
        run_chunk(g, s0, min_size(s0 + g->plan.chunk, split), slice, tile);
    }
}

/* k == 0: C = beta * C (alpha times an empty sum), + bias: with beta == 0,
 * the bias itself (as a C preset to it and scaled by 1). */
static void scale_c(size_t m, size_t n, float beta, float *c, size_t ldc, const float *bias) {
    for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < n; j++) {
            float *c_ij = &c[i * ldc + j];
            if (beta == 0.0f)
                *c_ij = bias ? bias[j] : 0.0f;
            else
                *c_ij = bias ? beta * *c_ij + bias[j] : beta * *c_ij;
        }
}

/* The call g on w's threads and the workspace. */
static void run(gemm_call *g, attn_workers w, float *workspace) {
    const attn_gemm_kernel *uk = g->uk;
    size_t m = g->m, n = g->n, k = g->k;
    if (m == 0 || n == 0) return;
    if (k == 0) {
        scale_c(m, n, g->beta, g->c, g->ldc, g->bias);
        return;
    }
    if (!make_plan(uk, w.threads, m, n, k, &g->plan)) return;
    g->shared = workspace;
    g->part_buffers = workspace + g->plan.shared_floats;
    atomic_init(&g->next_chunk, 0);
    size_t width = g->plan.split_rows ? uk->nr : uk->mr;
    size_t panels = ceil_div(g->plan.split_rows ? n : m, width);
    for (g->k0 = 0; g->k0 < k; g->k0 = g->k1) {
        g->k1 = min_size(k, g->k0 + g->plan.super_k);
        /* Phase 1: the shared operand, in groups of panels. */
        size_t per_group = ceil_div(GEMM_PACK_FLOATS_PER_TASK, width * (g->k1 - g->k0));
        g->pack_groups = ceil_div(panels, per_group);
        attn_pool_for(g->pool, g->plan.parts, g->pack_groups, 1, pack_shared, g);
        /* Phase 2: the chunks, taken by whichever thread is free. */
        atomic_store(&g->next_chunk, 0);
        attn_pool_for_parts(g->pool, g->plan.parts, g->plan.parts, 1, run_chunks, g);
    }
}

void attn_sgemm_run(const attn_gemm_kernel *uk, attn_workers w, bool trans_a, bool trans_b,
                    size_t m, size_t n, size_t k, float alpha, const float *a, size_t lda,
                    const float *b, size_t ldb, float beta, float *c, size_t ldc,
                    const float *bias, float *workspace) {
    gemm_call g = {.uk = uk, .trans_a = trans_a, .trans_b = trans_b, .m = m, .n = n, .k = k,
                   .alpha = alpha, .beta = beta, .a = a, .b = b, .lda = lda, .ldb = ldb,
                   .c = c, .ldc = ldc, .bias = bias, .pool = w.pool};
    run(&g, w, workspace);
}

void attn_sgemm_run_b16(const attn_gemm_kernel *uk, attn_gemm16_pack_fn *pack_b,
                        attn_sgemm_micro_b16_fn *micro_b16, attn_dtype dtype, attn_workers w,
                        bool trans_a, bool trans_b, size_t m, size_t n, size_t k, float alpha,
                        const float *a, size_t lda, const uint16_t *b, size_t ldb, float beta,
                        float *c, size_t ldc, const float *bias, float *workspace) {
    gemm_call g = {.uk = uk, .trans_a = trans_a, .trans_b = trans_b, .m = m, .n = n, .k = k,
                   .alpha = alpha, .beta = beta, .a = a, .b16 = b, .pack_b16 = pack_b,
                   .micro_b16 = micro_b16, .b16_dtype = dtype, .lda = lda, .ldb = ldb, .c = c, .ldc = ldc, .bias = bias,
                   .pool = w.pool};
    run(&g, w, workspace);
}

bool attn_sgemm(const attn_gemm_kernel *uk, size_t threads, bool trans_a, bool trans_b, size_t m,
                size_t n, size_t k, float alpha, const float *a, size_t lda, const float *b,
                size_t ldb, float beta, float *c, size_t ldc, const float *bias) {
    if (m == 0 || n == 0 || k == 0) {
        attn_sgemm_run(uk, (attn_workers){threads, NULL}, trans_a, trans_b, m, n, k, alpha, a, lda,
                       b, ldb, beta, c, ldc, bias, NULL);
        return true;
    }
    size_t floats = attn_sgemm_workspace(uk, threads, m, n, k);
    if (floats == 0) return false;
    size_t bytes = round_up(floats * sizeof(float), 64);
    float *ws = attn_aligned_alloc_or_fallback(64, bytes); /* NULL: the caller's fallback */
    if (!ws) return false;
    attn_sgemm_run(uk, (attn_workers){threads, NULL}, trans_a, trans_b, m, n, k, alpha, a, lda, b,
                   ldb, beta, c, ldc, bias, ws);
    attn_free(ws);
    return true;
}
