/*
 * bench_variants.c — the variants section of attn-bench: what each score
 * modifier of the attention contract costs on the fused kernels, as ratios
 * to the plain case in the same run (attn_sdpa_forward / _backward, B = 1,
 * hd = 64, fp32).
 *
 *   window  causal sliding window (W - 1, 0) against full causal at the same
 *           T: the band's tiles only, so the time should fall as W / T.
 *   gqa     32 query heads over 4 KV heads (8:1) and 1 (MQA) against 32 (MHA):
 *           no slower, and K/V read once per group.
 *   softcap, alibi, sinks: each alone on causal attention, against causal.
 *   varlen  4 packed sequences of uneven lengths (cu_seqlens) against the
 *           same 4 padded to the longest in a dense batch.
 */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"
#include "cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HEAD_DIM 64

typedef struct variant_case {
    attn_ctx *ctx;
    attn_sdpa_config cfg;
    float *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv, *sinks_grad;
    bool failed;
} variant_case;

static void forward(variant_case *c) {
    if (attn_sdpa_forward(c->ctx, &c->cfg, c->q, c->k, c->v, c->out, c->lse, NULL, NULL) != ATTN_OK)
        c->failed = true;
}

static void forward_backward(variant_case *c) {
    forward(c);
    c->cfg.sinks_grad = c->sinks_grad;
    if (attn_sdpa_backward(c->ctx, &c->cfg, c->q, c->k, c->v, c->out, c->lse, c->dout, c->dq,
                           c->dk, c->dv, NULL) != ATTN_OK)
        c->failed = true;
}

/* Median seconds of runs calls after a warm-up. */
static double median_seconds(void (*fn)(variant_case *), variant_case *c, size_t runs) {
    double times[32];
    if (runs > 32) runs = 32;
    if (runs == 0) runs = 1;
    fn(c);
    for (size_t r = 0; r < runs; r++) {
        double t0 = bench_now();
        fn(c);
        times[r] = bench_now() - t0;
    }
    return bench_median(times, runs);
}

/* Buffers for Hq query heads of T rows and Hkv KV heads of S rows. */
static bool alloc_variant(variant_case *c, size_t Hq, size_t Hkv, size_t T, size_t S) {
    size_t nq = Hq * T * HEAD_DIM, nkv = Hkv * S * HEAD_DIM;
    c->q = bench_random(nq, 31);
    c->k = bench_random(nkv, 32);
    c->v = bench_random(nkv, 33);
    c->dout = bench_random(nq, 34);
    c->out = bench_random(nq, 35);
    c->dq = bench_random(nq, 36);
    c->dk = bench_random(nkv, 37);
    c->dv = bench_random(nkv, 38);
    c->lse = bench_random(Hq * T, 39);
    c->sinks_grad = bench_random(Hq, 40);
    return c->q && c->k && c->v && c->dout && c->out && c->dq && c->dk && c->dv && c->lse &&
           c->sinks_grad;
}

static void free_variant(variant_case *c) {
    float *all[] = {c->q, c->k, c->v, c->out, c->lse, c->dout, c->dq, c->dk, c->dv, c->sinks_grad};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    attn_ctx_free(c->ctx);
}

typedef struct timing {
    double fwd, fb;
} timing;

static timing time_case(variant_case *c, size_t runs) {
    return (timing){median_seconds(forward, c, runs), median_seconds(forward_backward, c, runs)};
}

static void print_row(const char *name, const char *shape, size_t threads, timing t, timing base) {
    printf("%-9s %-26s %3zu | %9.2f %6.3f | %9.2f %6.3f\n", name, shape, threads, 1e3 * t.fwd,
           t.fwd / base.fwd, 1e3 * t.fb, t.fb / base.fb);
    fflush(stdout);
}

static bool new_ctx(variant_case *c, const bench_options *o, size_t threads) {
    return attn_ctx_new(&(attn_ctx_config){.num_threads = threads, .kernels = o->kernels[0]},
                        &c->ctx) == ATTN_OK;
}

/* window W against full causal at T. */
static int bench_window(const bench_options *o, size_t threads, size_t T, size_t W) {
    variant_case c = {0};
    if (!alloc_variant(&c, 12, 12, T, T) || !new_ctx(&c, o, threads)) {
        free_variant(&c);
        return cli_usage_error("bench: out of memory for the window case (T = %zu)", T);
    }
    size_t runs = T >= 16384 ? 3 : o->runs;
    c.cfg = (attn_sdpa_config){.batch = 1, .heads = 12, .q_tokens = T, .kv_tokens = T,
                               .head_dim = HEAD_DIM, .causal = true};
    timing base = time_case(&c, runs);
    char shape[64];
    snprintf(shape, sizeof shape, "H=12 T=%zu causal", T);
    print_row("causal", shape, threads, base, base);
    c.cfg.window = true;
    c.cfg.window_left = (long long)W - 1;
    c.cfg.window_right = 0;
    timing t = time_case(&c, runs);
    snprintf(shape, sizeof shape, "H=12 T=%zu W=%zu", T, W);
    print_row("window", shape, threads, t, base);
    int rc = c.failed ? cli_library_error(c.ctx, "bench variants") : CLI_OK;
    free_variant(&c);
    return rc;
}

/* 32 query heads over kv_heads against MHA. */
static int bench_gqa(const bench_options *o, size_t threads, size_t T, timing *mha,
                     size_t kv_heads) {
    variant_case c = {0};
    if (!alloc_variant(&c, 32, kv_heads, T, T) || !new_ctx(&c, o, threads)) {
        free_variant(&c);
        return cli_usage_error("bench: out of memory for the GQA case (T = %zu)", T);
    }
    c.cfg = (attn_sdpa_config){.batch = 1, .heads = 32, .kv_heads = kv_heads, .q_tokens = T,
                               .kv_tokens = T, .head_dim = HEAD_DIM, .causal = true};
    timing t = time_case(&c, o->runs);
    if (kv_heads == 32) *mha = t;
    char shape[64];
    snprintf(shape, sizeof shape, "Hq=32 Hkv=%zu T=%zu causal", kv_heads, T);
    print_row(kv_heads == 32 ? "mha" : kv_heads == 1 ? "mqa" : "gqa", shape, threads, t, *mha);
    int rc = c.failed ? cli_library_error(c.ctx, "bench variants") : CLI_OK;
    free_variant(&c);
    return rc;
}

/* softcap, ALiBi and sinks, each alone, against plain causal. */
static int bench_modifiers(const bench_options *o, size_t threads, size_t T) {
    variant_case c = {0};
    float *slopes = bench_random(12, 41), *sinks = bench_random(12, 42);
    if (!slopes || !sinks || !alloc_variant(&c, 12, 12, T, T) || !new_ctx(&c, o, threads)) {
        free(slopes);
        free(sinks);
        free_variant(&c);
        return cli_usage_error("bench: out of memory for the modifier cases (T = %zu)", T);
    }
    for (size_t h = 0; h < 12; h++) slopes[h] = exp2f(-(float)(h + 1) * 8.0f / 12.0f);
    attn_sdpa_config plain = {.batch = 1, .heads = 12, .q_tokens = T, .kv_tokens = T,
                              .head_dim = HEAD_DIM, .causal = true};
    c.cfg = plain;
    timing base = time_case(&c, o->runs);
    char shape[64];
    snprintf(shape, sizeof shape, "H=12 T=%zu causal", T);
    print_row("causal", shape, threads, base, base);
    const char *names[] = {"softcap", "alibi", "sinks"};
    for (int which = 0; which < 3; which++) {
        c.cfg = plain;
        if (which == 0) c.cfg.softcap = 30.0;
        if (which == 1) c.cfg.alibi_slopes = slopes;
        if (which == 2) c.cfg.sinks = sinks;
        print_row(names[which], shape, threads, time_case(&c, o->runs), base);
    }
    int rc = c.failed ? cli_library_error(c.ctx, "bench variants") : CLI_OK;
    free(slopes);
    free(sinks);
    free_variant(&c);
    return rc;
}

/* 4 packed sequences of uneven lengths against the same padded. */
static int bench_varlen(const bench_options *o, size_t threads, size_t longest) {
    size_t lengths[4] = {longest, longest / 2, longest / 4, longest / 8};
    int32_t cu[5] = {0};
    for (size_t b = 0; b < 4; b++) cu[b + 1] = cu[b] + (int32_t)lengths[b];
    variant_case c = {0};
    if (!alloc_variant(&c, 12, 12, 4 * longest, 4 * longest) || !new_ctx(&c, o, threads)) {
        free_variant(&c);
        return cli_usage_error("bench: out of memory for the varlen case (T = %zu)", longest);
    }
    c.cfg = (attn_sdpa_config){.batch = 4, .heads = 12, .q_tokens = longest, .kv_tokens = longest,
                               .head_dim = HEAD_DIM, .causal = true};
    timing padded = time_case(&c, o->runs);
    char shape[64];
    snprintf(shape, sizeof shape, "B=4 H=12 T=%zu padded", longest);
    print_row("padded", shape, threads, padded, padded);
    c.cfg.cu_seqlens_q = cu;
    c.cfg.cu_seqlens_kv = cu;
    snprintf(shape, sizeof shape, "%zu+%zu+%zu+%zu packed", lengths[0], lengths[1], lengths[2],
             lengths[3]);
    print_row("varlen", shape, threads, time_case(&c, o->runs), padded);
    int rc = c.failed ? cli_library_error(c.ctx, "bench variants") : CLI_OK;
    free_variant(&c);
    return rc;
}

int bench_variants(const bench_options *o, const bench_blas *blas) {
    (void)blas;
    size_t T_window = o->quick ? 4096 : 16384, T = o->quick ? 1024 : 4096;
    printf("variants: the attention contract's modifiers on the fused kernels, fp32, hd=%d; "
           "ratio = time / the first row of its group\n", HEAD_DIM);
    printf("%-9s %-26s %3s | %9s %6s | %9s %6s\n", "case", "shape", "thr", "fwd ms", "ratio",
           "f+b ms", "ratio");
    int rc = CLI_OK;
    for (size_t ti = 0; ti < o->thread_counts && rc == CLI_OK; ti++) {
        size_t threads = o->threads[ti];
        rc = bench_window(o, threads, T_window, 1024);
        timing mha = {1, 1};
        static const size_t kv_heads[] = {32, 4, 1};
        for (size_t i = 0; i < 3 && rc == CLI_OK; i++) rc = bench_gqa(o, threads, T, &mha, kv_heads[i]);
        if (rc == CLI_OK) rc = bench_modifiers(o, threads, T);
        if (rc == CLI_OK) rc = bench_varlen(o, threads, T);
    }
    return rc;
}
