/*
 * bench_masks.c — the masks section of attn-bench: what a block map whose
 * rows are single key intervals costs on the fused kernels against the
 * fixed feature it equals, as ratios in the same run (attn_sdpa_forward /
 * _backward, B = 1, H = 12, hd = 64, fp32, T = 4096; --quick 1024). Each
 * map is built once (attn_block_mask_from_fn), outside the timing; the
 * two of a pair run in turn, run after run, and each reports its median.
 *
 *   prefix-LM  prefix 0 as a map (kv <= q or kv < 0) against cfg.causal.
 *   window     kv in [q - 512, q] as a map against cfg.causal with
 *              cfg.window (512, 0).
 *   documents  4 documents of T / 4 tokens, causal within each, as a map
 *              against the same documents as a varlen batch (cu_seqlens).
 * The target is a ratio of at most 1.05: the maps run the tuned kernels.
 * A third row per case runs the same map built once per head, which is
 * not row intervals and so runs on the block-map (flex) kernels: the two
 * kernel families side by side on the same attention (its ratio is to
 * the fixed feature timed beside it).
 */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>

#define HEAD_DIM 64
#define HEADS 12
#define WINDOW 512
#define DOCUMENTS 4

typedef struct mask_case {
    attn_ctx *ctx;
    attn_sdpa_config cfg;
    float *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv;
    bool failed;
} mask_case;

typedef enum bench_mask { PREFIX_NONE, WINDOW_MAP, DOCUMENT_MAP } bench_mask;

typedef struct mask_spec {
    bench_mask kind;
    size_t T;
} mask_spec;

static int visible(void *user, size_t b, size_t h, size_t q, size_t kv) {
    (void)b, (void)h;
    const mask_spec *m = user;
    switch (m->kind) {
    case PREFIX_NONE: return kv <= q; /* kv <= q or kv < prefix 0 */
    case WINDOW_MAP: return kv <= q && kv + WINDOW >= q;
    case DOCUMENT_MAP: return kv <= q && kv / (m->T / DOCUMENTS) == q / (m->T / DOCUMENTS);
    }
    return 0;
}

static void forward(mask_case *c) {
    if (attn_sdpa_forward(c->ctx, &c->cfg, c->q, c->k, c->v, c->out, c->lse, NULL, NULL) != ATTN_OK)
        c->failed = true;
}

static void forward_backward(mask_case *c) {
    forward(c);
    if (attn_sdpa_backward(c->ctx, &c->cfg, c->q, c->k, c->v, c->out, c->lse, c->dout, c->dq,
                           c->dk, c->dv, NULL) != ATTN_OK)
        c->failed = true;
}

/* Median seconds of fn on the fixed feature's config and on the map's,
 * runs each after a warm-up, interleaved (fixed, map, fixed, ...) so that
 * both see the same load on the machine. */
static void median_pair(void (*fn)(mask_case *), mask_case *c, const attn_sdpa_config *fixed,
                        const attn_sdpa_config *mapped, size_t runs, double *t_fixed,
                        double *t_map) {
    double times[2][32];
    if (runs > 32) runs = 32;
    if (runs == 0) runs = 1;
    const attn_sdpa_config *cfgs[2] = {fixed, mapped};
    for (int x = 0; x < 2; x++) {
        c->cfg = *cfgs[x];
        fn(c);
    }
    for (size_t r = 0; r < runs; r++)
        for (int x = 0; x < 2; x++) {
            c->cfg = *cfgs[x];
            double t0 = bench_now();
            fn(c);
            times[x][r] = bench_now() - t0;
        }
    *t_fixed = bench_median(times[0], runs);
    *t_map = bench_median(times[1], runs);
}

typedef struct timing {
    double fwd, fb;
} timing;

static void print_row(const char *name, size_t threads, timing t, timing base) {
    printf("%-28s %3zu | %9.2f %6.3f | %9.2f %6.3f\n", name, threads, 1e3 * t.fwd,
           t.fwd / base.fwd, 1e3 * t.fb, t.fb / base.fb);
    fflush(stdout);
}

/* The fixed feature (c->cfg as given) and the same attention as the map
 * of kind, timed in turn; then the fixed feature and the map built per
 * head (the flex kernels). */
static int compare(mask_case *c, const bench_options *o, size_t threads, const char *fixed_name,
                   const char *map_name, bench_mask kind) {
    size_t T = c->cfg.q_tokens * c->cfg.batch;
    mask_spec spec = {kind, T};
    attn_block_mask_config mc = {.batch = 1, .heads = 1, .q_len = T, .kv_len = T};
    attn_block_mask *map = NULL, *per_head = NULL;
    if (attn_block_mask_from_fn(c->ctx, &mc, visible, &spec, &map) != ATTN_OK)
        return cli_library_error(c->ctx, "bench masks");
    mc.heads = HEADS;
    if (attn_block_mask_from_fn(c->ctx, &mc, visible, &spec, &per_head) != ATTN_OK) {
        attn_block_mask_free(map);
        return cli_library_error(c->ctx, "bench masks");
    }
    attn_sdpa_config fixed = c->cfg;
    attn_sdpa_config mapped = {.batch = 1, .heads = HEADS, .q_tokens = T, .kv_tokens = T,
                               .head_dim = HEAD_DIM, .align = ATTN_ALIGN_TOP_LEFT,
                               .block_mask = map};
    attn_sdpa_config flex = mapped;
    flex.block_mask = per_head;
    timing f, m, f2, x;
    median_pair(forward, c, &fixed, &mapped, o->runs, &f.fwd, &m.fwd);
    median_pair(forward_backward, c, &fixed, &mapped, o->runs, &f.fb, &m.fb);
    median_pair(forward, c, &fixed, &flex, o->runs, &f2.fwd, &x.fwd);
    median_pair(forward_backward, c, &fixed, &flex, o->runs, &f2.fb, &x.fb);
    print_row(fixed_name, threads, f, f);
    print_row(map_name, threads, m, f);
    print_row("  the map per head (flex)", threads, x, f2);
    c->cfg = fixed;
    attn_block_mask_free(map);
    attn_block_mask_free(per_head);
    return c->failed ? cli_library_error(c->ctx, "bench masks") : CLI_OK;
}

int bench_masks(const bench_options *o, const bench_blas *blas) {
    (void)blas;
    size_t T = o->quick ? 1024 : 4096, n = HEADS * T * HEAD_DIM;
    printf("masks: row-interval block maps against the fixed feature they equal, fp32, B=1 "
           "H=%d hd=%d T=%zu; ratio = time / the row above\n", HEADS, HEAD_DIM, T);
    printf("%-28s %3s | %9s %6s | %9s %6s\n", "case", "thr", "fwd ms", "ratio", "f+b ms", "ratio");
    int rc = CLI_OK;
    mask_case c = {0};
    float **bufs[] = {&c.q, &c.k, &c.v, &c.out, &c.dout, &c.dq, &c.dk, &c.dv};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) *bufs[i] = bench_random(n, 50 + (unsigned)i);
    c.lse = bench_random(HEADS * T, 60);
    bool ok = c.lse != NULL;
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) ok = ok && *bufs[i];
    if (!ok) rc = cli_usage_error("bench: out of memory for the masks section (T = %zu)", T);
    int32_t cu[DOCUMENTS + 1];
    for (size_t d = 0; d <= DOCUMENTS; d++) cu[d] = (int32_t)(d * (T / DOCUMENTS));
    for (size_t ti = 0; ti < o->thread_counts && rc == CLI_OK; ti++) {
        size_t threads = o->threads[ti];
        if (attn_ctx_new(&(attn_ctx_config){.num_threads = threads, .kernels = o->kernels[0]},
                         &c.ctx) != ATTN_OK) {
            rc = cli_usage_error("bench: cannot make a ctx of %zu threads", threads);
            break;
        }
        attn_sdpa_config base = {.batch = 1, .heads = HEADS, .q_tokens = T, .kv_tokens = T,
                                 .head_dim = HEAD_DIM, .align = ATTN_ALIGN_TOP_LEFT};
        c.cfg = base;
        c.cfg.causal = true;
        rc = compare(&c, o, threads, "causal", "prefix-LM, prefix 0 (map)", PREFIX_NONE);
        c.cfg = base;
        c.cfg.causal = c.cfg.window = true;
        c.cfg.window_left = WINDOW;
        c.cfg.window_right = 0;
        if (rc == CLI_OK) rc = compare(&c, o, threads, "window 512", "window 512 (map)", WINDOW_MAP);
        c.cfg = base;
        c.cfg.batch = DOCUMENTS;
        c.cfg.q_tokens = c.cfg.kv_tokens = T / DOCUMENTS;
        c.cfg.causal = true;
        c.cfg.cu_seqlens_q = c.cfg.cu_seqlens_kv = cu;
        if (rc == CLI_OK)
            rc = compare(&c, o, threads, "4 documents (varlen)", "4 documents (map)", DOCUMENT_MAP);
        attn_ctx_free(c.ctx);
        c.ctx = NULL;
    }
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(*bufs[i]);
    free(c.lse);
    return rc;
}
