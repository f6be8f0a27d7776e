/*
 * gemm16.c — the loops around a 16-bit kernel set's microkernel (see
 * gemm16.h): the SGEMM's plan (gemm.c) on 16-bit sources and packed panels
 * of any element size. Phase 1 packs the shared operand (B when rows of C
 * are split, A when columns are) once, whole; phase 2 hands chunks of the
 * split side to whichever thread is free, each packing its slice of the
 * other operand. The k blocks depend on k alone (and are whole pairs for
 * the bf16 kernels, so a pair never straddles two blocks), hence every
 * element of C sums in the same order on any number of threads.
 */
#include "kernels/gemm/gemm16.h"

#include "internal.h"
#include "parallel.h"

#include <stdatomic.h>

/* As gemm.c: work per extra thread, chunks per thread, packing tasks. */
#define GEMM16_MIN_FLOPS_PER_THREAD ((size_t)1 << 23)
#define GEMM16_CHUNKS_PER_THREAD 4
#define GEMM16_PACK_ELEMENTS_PER_TASK ((size_t)1 << 16)
#define GEMM16_ALIGN_BYTES 64

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }
static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }
static size_t round_up(size_t a, size_t b) { return ceil_div(a, b) * b; }

/* Blocks of at most block (a multiple of unit) covering n, as even as the
 * unit allows. */
static size_t even_block(size_t n, size_t block, size_t unit) {
    size_t blocks = ceil_div(n, block);
    return min_size(block, round_up(ceil_div(n, blocks), unit));
}

typedef struct gemm16_plan {
    bool split_rows;
    size_t parts;
    size_t kc;            /* elements of k per block: a multiple of k_unit */
    size_t super_k;       /* k per super-block: a multiple of kc */
    size_t chunk, chunks; /* rows (split_rows) or columns per chunk */
    size_t shared_width;  /* the shared operand's vectors, padded to its tile */
    size_t shared_bytes, chunk_bytes, tile_bytes;
} gemm16_plan;

static bool make_plan(const attn_gemm16_kernel *uk, size_t threads, size_t m, size_t n, size_t k,
                      gemm16_plan *plan) {
    plan->split_rows = m >= n;
    size_t split = plan->split_rows ? m : n, unit = plan->split_rows ? uk->mr : uk->nr;
    size_t block = plan->split_rows ? uk->mc : uk->nc;
    size_t units = ceil_div(split ? split : 1, unit);
    size_t parts = threads > 1 ? attn_parallel_parts(threads) : 1;
    double by_work = 2.0 * (double)m * (double)n * (double)k / (double)GEMM16_MIN_FLOPS_PER_THREAD;
    if ((double)parts > by_work) parts = by_work < 1.0 ? 1 : (size_t)by_work;
    if (parts > units) parts = units;
    if (parts == 0) parts = 1;
    plan->parts = parts;
    plan->kc = even_block(k ? k : 1, uk->kc, uk->k_unit);
    size_t per_chunk = ceil_div(split ? split : 1, parts * GEMM16_CHUNKS_PER_THREAD);
    size_t chunk = parts == 1 ? block : round_up(per_chunk, unit);
    plan->chunk = even_block(split ? split : 1, min_size(chunk, block), unit);
    plan->chunks = ceil_div(split ? split : 1, plan->chunk);
    size_t other = plan->split_rows ? n : m, other_unit = plan->split_rows ? uk->nr : uk->mr;
    plan->shared_width = round_up(other ? other : 1, other_unit);
    size_t kc_per_super = uk->shared_max / plan->shared_width / plan->kc;
    plan->super_k = (kc_per_super ? kc_per_super : 1) * plan->kc;
    /* the last block of k is padded to the step */
    size_t shared_k = round_up(min_size(k ? k : 1, plan->super_k), uk->k_unit);
    size_t shared, slice, tile;
    if (!attn_mul3_size(plan->shared_width, shared_k, uk->packed_bytes, &shared) ||
        !attn_mul3_size(plan->chunk, plan->kc, uk->packed_bytes, &slice) ||
        !attn_mul3_size(uk->mr, uk->nr, sizeof(float), &tile) ||
        shared > (size_t)-1 - GEMM16_ALIGN_BYTES || slice > (size_t)-1 - GEMM16_ALIGN_BYTES)
        return false;
    plan->shared_bytes = round_up(shared, GEMM16_ALIGN_BYTES);
    plan->chunk_bytes = round_up(slice, GEMM16_ALIGN_BYTES);
    plan->tile_bytes = round_up(tile, GEMM16_ALIGN_BYTES);
    return true;
}

size_t attn_gemm16_parts(const attn_gemm16_kernel *uk, size_t threads, size_t m, size_t n,
                         size_t k) {
    gemm16_plan plan;
    return make_plan(uk, threads, m, n, k, &plan) ? plan.parts : 1;
}

size_t attn_gemm16_workspace(const attn_gemm16_kernel *uk, size_t threads, size_t m, size_t n,
                             size_t k) {
    gemm16_plan plan;
    size_t per_part, all_parts, total;
    if (!make_plan(uk, threads, m, n, k, &plan) ||
        !attn_add_size(plan.chunk_bytes, plan.tile_bytes, &per_part) ||
        !attn_mul_size(per_part, plan.parts, &all_parts) ||
        !attn_add_size(all_parts, plan.shared_bytes, &total))
        return 0;
    return total;
}

typedef struct gemm16_call {
    const attn_gemm16_kernel *uk;
    attn_dtype dtype;
    bool trans_a, trans_b;
    size_t m, n, k;
    float alpha, beta;
    const uint16_t *a, *b;
    size_t lda, ldb;
    float *c;
    size_t ldc;
    attn_pool *pool; /* the workers of the plan's parts, or NULL */
    gemm16_plan plan;
    size_t k0, k1;          /* the super-block of k at work */
    unsigned char *shared;  /* its packed shared operand, kc block after kc block */
    unsigned char *part_buffers; /* per part: chunk slice, then edge tile */
    size_t pack_groups;
    atomic_size_t next_chunk;
} gemm16_call;

/* Elements of k a block [pc, pc + kcb) packs into: padded to the step. */
static size_t padded_k(const gemm16_call *g, size_t kcb) { return round_up(kcb, g->uk->k_unit); }

/* The packed shared block that starts at pc (pc - k0: whole steps). */
static unsigned char *shared_block(const gemm16_call *g, size_t pc) {
    return g->shared + (pc - g->k0) * g->plan.shared_width * g->uk->packed_bytes;
}

/* The stored element of op(A)(i, p) and op(B)(p, j): where a block starts. */
static const uint16_t *a_at(const gemm16_call *g, size_t i, size_t p) {
    return g->trans_a ? g->a + p * g->lda + i : g->a + i * g->lda + p;
}
static const uint16_t *b_at(const gemm16_call *g, size_t p, size_t j) {
    return g->trans_b ? g->b + j * g->ldb + p : g->b + p * g->ldb + j;
}

/* Phase 1: panels of pack groups [begin, end), every kc block. */
static void pack_shared(void *arg, size_t begin, size_t end) {
    const gemm16_call *g = arg;
    const attn_gemm16_kernel *uk = g->uk;
    size_t width = g->plan.split_rows ? uk->nr : uk->mr;
    size_t total = g->plan.split_rows ? g->n : g->m, panels = ceil_div(total, width);
    size_t first = panels * begin / g->pack_groups, last = panels * end / g->pack_groups;
    size_t v0 = first * width, len = min_size(last * width, total) - v0;
    if (len == 0) return;
    for (size_t pc = g->k0; pc < g->k1; pc += g->plan.kc) {
        size_t kcb = min_size(g->plan.kc, g->k1 - pc);
        unsigned char *dst = shared_block(g, pc) + v0 * padded_k(g, kcb) * uk->packed_bytes;
        if (g->plan.split_rows)
            uk->pack_b(g->dtype, kcb, len, b_at(g, pc, v0), g->ldb, g->trans_b, dst);
        else
            uk->pack_a(g->dtype, kcb, len, a_at(g, v0, pc), g->lda, g->trans_a, dst);
    }
}

/* An edge tile (rows x cols, short of MR x NR): the microkernel on a
 * scratch tile holding c's values, so that it rounds as a full tile. */
static void edge_tile(const attn_gemm16_kernel *uk, size_t steps, const void *pa, const void *pb,
                      float *c, size_t ldc, size_t rows, size_t cols, float alpha, float beta,
                      float *tile) {
    size_t nr = uk->nr;
    memset(tile, 0, uk->mr * nr * sizeof *tile);
    if (beta != 0.0f)
        for (size_t i = 0; i < rows; i++) memcpy(tile + i * nr, c + i * ldc, cols * sizeof *c);
    uk->micro(steps, pa, pb, tile, nr, alpha, beta);
    for (size_t i = 0; i < rows; i++) memcpy(c + i * ldc, tile + i * nr, cols * sizeof *c);
}

/* The microkernel over rows [i0, i1) x columns [j0, j1) of C, kp deep
 * (padded), pa: panels from row i0, pb: panels from column j0. */
static void macro_kernel(const gemm16_call *g, size_t kp, float beta, const unsigned char *pa,
                         const unsigned char *pb, size_t i0, size_t i1, size_t j0, size_t j1,
                         float *tile) {
    const attn_gemm16_kernel *uk = g->uk;
    size_t mr = uk->mr, nr = uk->nr, ldc = g->ldc, steps = kp / uk->k_unit;
    size_t stride = kp * uk->packed_bytes; /* bytes per vector of a panel */
    for (size_t i = i0; i < i1; i += mr) {
        size_t rows = min_size(mr, i1 - i);
        const unsigned char *pa_i = pa + (i - i0) * stride;
        float *c_row = g->c + i * ldc;
        for (size_t j = j0; j < j1; j += nr) {
            size_t cols = min_size(nr, j1 - j);
            const unsigned char *pb_j = pb + (j - j0) * stride;
            if (rows == mr && cols == nr)
                uk->micro(steps, pa_i, pb_j, c_row + j, ldc, g->alpha, beta);
            else
                edge_tile(uk, steps, pa_i, pb_j, c_row + j, ldc, rows, cols, g->alpha, beta, tile);
        }
    }
}

/* Phase 2, one chunk: rows (split_rows) or columns [s0, s1) of C. */
static void run_chunk(const gemm16_call *g, size_t s0, size_t s1, unsigned char *slice,
                      float *tile) {
    const attn_gemm16_kernel *uk = g->uk;
    for (size_t pc = g->k0; pc < g->k1; pc += g->plan.kc) {
        size_t kcb = min_size(g->plan.kc, g->k1 - pc), kp = padded_k(g, kcb);
        float beta = pc == 0 ? g->beta : 1.0f; /* later blocks add to c */
        const unsigned char *shared = shared_block(g, pc);
        size_t elem = kp * uk->packed_bytes;
        if (g->plan.split_rows) {
            uk->pack_a(g->dtype, kcb, s1 - s0, a_at(g, s0, pc), g->lda, g->trans_a, slice);
            size_t nc = even_block(g->n, uk->nc, uk->nr);
            for (size_t jc = 0; jc < g->n; jc += nc)
                macro_kernel(g, kp, beta, slice, shared + jc * elem, s0, s1, jc,
                             min_size(jc + nc, g->n), tile);
        } else {
            uk->pack_b(g->dtype, kcb, s1 - s0, b_at(g, pc, s0), g->ldb, g->trans_b, slice);
            size_t mc = even_block(g->m, uk->mc, uk->mr);
            for (size_t ic = 0; ic < g->m; ic += mc)
                macro_kernel(g, kp, beta, shared + ic * elem, slice, ic, min_size(ic + mc, g->m),
                             s0, s1, tile);
        }
    }
}

static void run_chunks(void *arg, size_t part, size_t begin, size_t end) {
    (void)begin;
    (void)end;
    gemm16_call *g = arg;
    unsigned char *slice = g->part_buffers + part * (g->plan.chunk_bytes + g->plan.tile_bytes);
    float *tile = (float *)(void *)(slice + g->plan.chunk_bytes);
    size_t split = g->plan.split_rows ? g->m : g->n;
    for (;;) {
        size_t chunk = atomic_fetch_add(&g->next_chunk, 1);
        if (chunk >= g->plan.chunks) break;
        size_t s0 = chunk * g->plan.chunk;
        run_chunk(g, s0, min_size(s0 + g->plan.chunk, split), slice, tile);
    }
}

void attn_gemm16_run(const attn_gemm16_kernel *uk, attn_workers w, attn_dtype dtype, bool trans_a,
                     bool trans_b, size_t m, size_t n, size_t k, float alpha, const uint16_t *a,
                     size_t lda, const uint16_t *b, size_t ldb, float beta, float *c, size_t ldc,
                     void *workspace) {
    if (m == 0 || n == 0) return;
    if (k == 0) {
        /* alpha times an empty sum */
        for (size_t i = 0; i < m; i++)
            for (size_t j = 0; j < n; j++)
                c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
        return;
    }
    gemm16_call g = {.uk = uk, .dtype = dtype, .trans_a = trans_a, .trans_b = trans_b, .m = m,
                     .n = n, .k = k, .alpha = alpha, .beta = beta, .a = a, .b = b, .lda = lda,
                     .ldb = ldb, .c = c, .ldc = ldc, .pool = w.pool};
    if (!make_plan(uk, w.threads, m, n, k, &g.plan)) return;
    g.shared = workspace;
    g.part_buffers = g.shared + g.plan.shared_bytes;
    atomic_init(&g.next_chunk, 0);
    size_t width = g.plan.split_rows ? uk->nr : uk->mr;
    size_t panels = ceil_div(g.plan.split_rows ? n : m, width);
    for (g.k0 = 0; g.k0 < k; g.k0 = g.k1) {
        g.k1 = min_size(k, g.k0 + g.plan.super_k);
        size_t per_group = ceil_div(GEMM16_PACK_ELEMENTS_PER_TASK, width * (g.k1 - g.k0));
        g.pack_groups = ceil_div(panels, per_group);
        attn_pool_for(g.pool, g.plan.parts, g.pack_groups, 1, pack_shared, &g);
        atomic_store(&g.next_chunk, 0);
        attn_pool_for_parts(g.pool, g.plan.parts, g.plan.parts, 1, run_chunks, &g);
    }
}
