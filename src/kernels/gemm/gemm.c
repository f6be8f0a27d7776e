/*
 * gemm.c — the portable SGEMM framework: the five loops around a kernel
 * set's microkernel (see gemm.h), edge tiles, threads and the workspace.
 * Nothing here depends on the instruction set; the kernel set brings its
 * microkernel, its packing and its block sizes (gemm_config.c).
 */
#include "kernels/gemm/gemm.h"

#include "internal.h"
#include "parallel.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Work (2*m*n*k flops) per thread below which starting another thread
 * costs more than it saves: a thread start is some 20-50 us, in which one
 * core does some 4-8 Mflop. */
#define GEMM_MIN_FLOPS_PER_THREAD ((size_t)1 << 23)

/* Buffers within the workspace start on 64-byte lines (16 floats). */
#define GEMM_ALIGN_FLOATS 16

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }
static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }
static size_t round_up(size_t a, size_t b) { return ceil_div(a, b) * b; }

/* How a call is cut among threads: parts over units of mr rows of C
 * (split_rows) or of nr columns. */
typedef struct gemm_plan {
    bool split_rows;
    size_t units, unit, parts;
    size_t part_m, part_n; /* the largest part's sizes */
} gemm_plan;

static gemm_plan make_plan(const attn_gemm_kernel *uk, size_t threads, size_t m, size_t n,
                           size_t k) {
    gemm_plan plan;
    /* Split the larger side: each thread packs all of the other operand,
     * so duplicating the smaller one costs least. */
    plan.split_rows = m >= n;
    plan.unit = plan.split_rows ? uk->mr : uk->nr;
    plan.units = ceil_div(plan.split_rows ? m : n, plan.unit);
    size_t parts = threads > 1 ? attn_parallel_parts(threads) : 1;
    /* 2mnk in double: no overflow for any size that fits in memory. */
    double flops = 2.0 * (double)m * (double)n * (double)k;
    double by_work = flops / (double)GEMM_MIN_FLOPS_PER_THREAD;
    if ((double)parts > by_work) parts = by_work < 1.0 ? 1 : (size_t)by_work;
    if (parts > plan.units) parts = plan.units;
    if (parts == 0) parts = 1;
    plan.parts = parts;
    size_t part_units = ceil_div(plan.units, parts);
    plan.part_m = plan.split_rows ? min_size(m, part_units * uk->mr) : m;
    plan.part_n = plan.split_rows ? n : min_size(n, part_units * uk->nr);
    return plan;
}

size_t attn_sgemm_parts(const attn_gemm_kernel *uk, size_t threads, size_t m, size_t n,
                        size_t k) {
    return make_plan(uk, threads, m, n, k).parts;
}

/* Floats of one part's buffers: the A block, the B block, an edge tile. */
typedef struct part_layout {
    size_t a_floats, b_floats, tile_floats, total;
} part_layout;

static bool part_layout_for(const attn_gemm_kernel *uk, size_t part_m, size_t part_n, size_t k,
                            part_layout *out) {
    size_t kc = min_size(uk->kc, k ? k : 1);
    size_t mc = min_size(uk->mc, round_up(part_m ? part_m : 1, uk->mr));
    size_t nc = min_size(uk->nc, round_up(part_n ? part_n : 1, uk->nr));
    size_t a, b, tile = round_up(uk->mr * uk->nr, GEMM_ALIGN_FLOATS);
    if (!attn_mul_size(mc, kc, &a) || !attn_mul_size(nc, kc, &b)) return false;
    a = round_up(a, GEMM_ALIGN_FLOATS);
    b = round_up(b, GEMM_ALIGN_FLOATS);
    out->a_floats = a;
    out->b_floats = b;
    out->tile_floats = tile;
    return attn_add_size(a, b, &out->total) && attn_add_size(out->total, tile, &out->total);
}

size_t attn_sgemm_workspace(const attn_gemm_kernel *uk, size_t threads, size_t m, size_t n,
                            size_t k) {
    gemm_plan plan = make_plan(uk, threads, m, n, k);
    part_layout layout;
    size_t total;
    if (!part_layout_for(uk, plan.part_m, plan.part_n, k, &layout) ||
        !attn_mul_size(layout.total, plan.parts, &total) || !attn_floats_fit(total))
        return 0;
    return total;
}

typedef struct gemm_call {
    const attn_gemm_kernel *uk;
    bool trans_a, trans_b;
    size_t m, n, k;
    float alpha, beta;
    const float *a, *b;
    size_t lda, ldb;
    float *c;
    size_t ldc;
    float *workspace;
    part_layout layout;
    gemm_plan plan;
} gemm_call;

/* An edge tile (rows x cols of c, short of MR x NR): the microkernel runs on
 * a scratch tile holding c's values, so it rounds as a full tile would. */
static void edge_tile(const attn_gemm_kernel *uk, size_t kc, const float *pa, const float *pb,
                      float *c, size_t ldc, size_t rows, size_t cols, float alpha, float beta,
                      float *tile) {
    size_t nr = uk->nr;
    memset(tile, 0, uk->mr * nr * sizeof *tile);
    if (beta != 0.0f)
        for (size_t i = 0; i < rows; i++) memcpy(tile + i * nr, c + i * ldc, cols * sizeof *c);
    uk->micro(kc, pa, pb, tile, nr, alpha, beta);
    for (size_t i = 0; i < rows; i++) memcpy(c + i * ldc, tile + i * nr, cols * sizeof *c);
}

/* Blocks of at most block (a multiple of unit) covering n, as even as the
 * unit allows: no thin last block that would pay for a whole repacking. */
static size_t even_block(size_t n, size_t block, size_t unit) {
    size_t blocks = ceil_div(n, block);
    return min_size(block, round_up(ceil_div(n, blocks), unit));
}

/* The loops over one part: C (m, n) of the call's sizes, a, b, c already
 * offset to the part. The kc blocks depend on k alone, so every part sums
 * in the same order. */
static void gemm_part(const gemm_call *g, size_t m, size_t n, const float *a, const float *b,
                      float *c, float *ws) {
    const attn_gemm_kernel *uk = g->uk;
    size_t mr = uk->mr, nr = uk->nr, k = g->k;
    size_t lda = g->lda, ldb = g->ldb, ldc = g->ldc;
    size_t mc = even_block(m, uk->mc, mr), kc = even_block(k, uk->kc, 1);
    size_t nc = even_block(n, uk->nc, nr);
    float *pa = ws, *pb = ws + g->layout.a_floats, *tile = pb + g->layout.b_floats;
    for (size_t ic = 0; ic < m; ic += mc) {
        size_t mcb = min_size(mc, m - ic);
        for (size_t pc = 0; pc < k; pc += kc) {
            size_t kcb = min_size(kc, k - pc);
            /* The first kc block applies beta, the later ones add to c. */
            float beta = pc == 0 ? g->beta : 1.0f;
            uk->pack_a(kcb, mcb, g->trans_a ? a + pc * lda + ic : a + ic * lda + pc, lda,
                       g->trans_a, pa);
            for (size_t jc = 0; jc < n; jc += nc) {
                size_t ncb = min_size(nc, n - jc);
                uk->pack_b(kcb, ncb, g->trans_b ? b + jc * ldb + pc : b + pc * ldb + jc, ldb,
                           g->trans_b, pb);
                for (size_t ir = 0; ir < mcb; ir += mr) {
                    size_t rows = min_size(mr, mcb - ir);
                    const float *pa_ir = pa + ir * kcb;
                    float *c_row = c + (ic + ir) * ldc + jc;
                    for (size_t jr = 0; jr < ncb; jr += nr) {
                        size_t cols = min_size(nr, ncb - jr);
                        if (rows == mr && cols == nr)
                            uk->micro(kcb, pa_ir, pb + jr * kcb, c_row + jr, ldc, g->alpha, beta);
                        else
                            edge_tile(uk, kcb, pa_ir, pb + jr * kcb, c_row + jr, ldc, rows, cols,
                                      g->alpha, beta, tile);
                    }
                }
            }
        }
    }
}

static void gemm_range(void *arg, size_t part, size_t begin, size_t end) {
    const gemm_call *g = arg;
    float *ws = g->workspace + part * g->layout.total;
    if (g->plan.split_rows) {
        size_t row0 = begin * g->uk->mr, rows = min_size(end * g->uk->mr, g->m) - row0;
        const float *a = g->trans_a ? g->a + row0 : g->a + row0 * g->lda;
        gemm_part(g, rows, g->n, a, g->b, g->c + row0 * g->ldc, ws);
    } else {
        size_t col0 = begin * g->uk->nr, cols = min_size(end * g->uk->nr, g->n) - col0;
        const float *b = g->trans_b ? g->b + col0 * g->ldb : g->b + col0;
        gemm_part(g, g->m, cols, g->a, b, g->c + col0, ws);
    }
}

/* k == 0: C = beta * C (alpha times an empty sum). */
static void scale_c(size_t m, size_t n, float beta, float *c, size_t ldc) {
    for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < n; j++) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
}

void attn_sgemm_run(const attn_gemm_kernel *uk, size_t threads, bool trans_a, bool trans_b,
                    size_t m, size_t n, size_t k, float alpha, const float *a, size_t lda,
                    const float *b, size_t ldb, float beta, float *c, size_t ldc,
                    float *workspace) {
    if (m == 0 || n == 0) return;
    if (k == 0) {
        scale_c(m, n, beta, c, ldc);
        return;
    }
    gemm_call g = {.uk = uk, .trans_a = trans_a, .trans_b = trans_b, .m = m, .n = n, .k = k,
                   .alpha = alpha, .beta = beta, .a = a, .b = b, .lda = lda, .ldb = ldb,
                   .c = c, .ldc = ldc, .workspace = workspace};
    g.plan = make_plan(uk, threads, m, n, k);
    if (!part_layout_for(uk, g.plan.part_m, g.plan.part_n, k, &g.layout)) return;
    attn_parallel_for_parts(g.plan.parts, g.plan.units, 1, gemm_range, &g);
}

bool attn_sgemm(const attn_gemm_kernel *uk, size_t threads, bool trans_a, bool trans_b, size_t m,
                size_t n, size_t k, float alpha, const float *a, size_t lda, const float *b,
                size_t ldb, float beta, float *c, size_t ldc) {
    if (m == 0 || n == 0 || k == 0) {
        attn_sgemm_run(uk, threads, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
                       ldc, NULL);
        return true;
    }
    size_t floats = attn_sgemm_workspace(uk, threads, m, n, k);
    if (floats == 0) return false;
    size_t bytes = round_up(floats * sizeof(float), 64);
    float *ws = aligned_alloc(64, bytes);
    if (!ws) return false;
    attn_sgemm_run(uk, threads, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                   ws);
    free(ws);
    return true;
}
