/*
 * bench_attention.c — the attention sections of attn-bench.
 *
 * attention: attn_sdpa_forward / _backward (the fused kernels) for B = 1,
 *   H = 12, hd = 64, T = S in {256, 1024, 4096, 16384}, causal and not, on
 *   each thread count; the reference kernels too where they finish in
 *   seconds (T <= 1024). GFLOP/s counts the useful work: 4 B H T^2 hd for a
 *   forward, half that when causal, and 3.5x the forward's for forward +
 *   backward (the backward counted as 2.5 forwards). "of sgemm" is that
 *   rate over the same run's OpenBLAS SGEMM 2048^3 on as many threads (our
 *   own SGEMM when OpenBLAS is missing); "peak" is that rate over the FMA
 *   peak on as many threads (bench_peak.c). dropout is the time with p = 0.1
 *   (Philox, in the kernel) over the time without. Memory is the peak
 *   resident growth during the call, beyond the inputs and outputs.
 * layer: the whole GPT-2-small attention module (C = 768, 12 heads:
 *   projections included) forward in eval mode and forward + backward,
 *   with the memory beyond its inputs, weights, kept activations and
 *   gradients.
 * dropout: the mha module (C = 768, 12 heads, causal, B = 1) in training
 *   mode with attention dropout 0.1, under each mask the rng can draw
 *   (attn_bernoulli_method), next to the same module without dropout.
 */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"
#include "cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HEADS 12
#define HEAD_DIM 64

/* ---- memory: the resident peak, reset through /proc ----------------------- */

static long proc_status_kib(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long value = -1;
    size_t len = strlen(field);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, field, len) == 0) value = strtol(line + len, NULL, 10);
    fclose(f);
    return value;
}

/* Resets the resident peak (Linux: clear_refs 5) and returns the resident
 * size now, in KiB; -1 when this system cannot tell. */
static long peak_reset(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return -1;
    fputs("5", f);
    fclose(f);
    return proc_status_kib("VmRSS:");
}

/* MiB the resident size peaked above base since peak_reset. */
static double peak_growth_mib(long base) {
    long hwm = proc_status_kib("VmHWM:");
    if (base < 0 || hwm < 0) return NAN;
    return hwm > base ? (double)(hwm - base) / 1024.0 : 0.0;
}

/* ---- timing ------------------------------------------------------------------ */

/* bench_time_median, and the calls' peak resident growth in *mib (every
 * call does the same work, so the peak is the first call's). */
static double time_median(bench_fn fn, void *arg, size_t runs, double *mib) {
    long base = peak_reset();
    double t = bench_time_median(fn, arg, runs);
    if (mib) *mib = peak_growth_mib(base);
    return t;
}

/* ---- attention ---------------------------------------------------------------- */

typedef struct sdpa_case {
    attn_ctx *ctx;
    attn_rng *rng;
    attn_sdpa_config cfg;
    float *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv;
    attn_sdpa_dropout drawn;
    bool failed;
} sdpa_case;

static void run_forward(void *arg) {
    sdpa_case *c = arg;
    if (attn_sdpa_forward(c->ctx, &c->cfg, c->q, c->k, c->v, c->out, c->lse, c->rng, &c->drawn) !=
        ATTN_OK)
        c->failed = true;
}

static void run_forward_backward(void *arg) {
    sdpa_case *c = arg;
    run_forward(c);
    if (attn_sdpa_backward(c->ctx, &c->cfg, c->q, c->k, c->v, c->out, c->lse, c->dout, c->dq,
                           c->dk, c->dv, &c->drawn) != ATTN_OK)
        c->failed = true;
}

/* GFLOP/s of 2048^3 SGEMM on threads threads into *rate: OpenBLAS, else
 * attn_gemm. CLI_OK, or CLI_FAILED with the error printed. */
static int sgemm_peak(const bench_blas *blas, size_t threads, size_t runs, const char **who,
                      double *rate) {
    size_t n = 2048;
    float *a = bench_random(n * n, 1), *b = bench_random(n * n, 2), *c = bench_random(n * n, 3);
    int rc = CLI_OK;
    attn_ctx *ctx = NULL;
    *rate = NAN;
    *who = blas->handle ? "OpenBLAS" : "attn";
    if (!a || !b || !c ||
        attn_ctx_new(&(attn_ctx_config){.num_threads = threads}, &ctx) != ATTN_OK) {
        rc = cli_failure("bench: out of memory for the %zu^3 SGEMM", n);
    } else {
        double times[16];
        if (runs > 16) runs = 16;
        for (size_t r = 0; r <= runs && rc == CLI_OK; r++) {
            double t0 = bench_now();
            if (blas->handle)
                bench_blas_sgemm(blas, threads, false, false, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
            else if (attn_gemm(ctx, false, false, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n) != ATTN_OK)
                rc = cli_library_error(ctx, "bench SGEMM");
            if (r) times[r - 1] = bench_now() - t0;
        }
        if (rc == CLI_OK) *rate = 2.0 * n * n * n / bench_median(times, runs) / 1e9;
    }
    attn_ctx_free(ctx);
    free(a);
    free(b);
    free(c);
    return rc;
}

/* Outputs, written beforehand (with values: zeros would let the compiler
 * turn malloc and memset into calloc, whose pages stay untouched), so that
 * their pages are resident and a measured call's peak counts only what it
 * allocates itself. */
static float *resident(size_t n, unsigned seed) { return bench_random(n, seed); }

static bool alloc_case(sdpa_case *c, size_t T) {
    size_t n = (size_t)HEADS * T * HEAD_DIM;
    c->q = bench_random(n, 11);
    c->k = bench_random(n, 12);
    c->v = bench_random(n, 13);
    c->dout = bench_random(n, 14);
    c->out = resident(n, 15);
    c->dq = resident(n, 16);
    c->dk = resident(n, 17);
    c->dv = resident(n, 18);
    c->lse = resident((size_t)HEADS * T, 19);
    return c->q && c->k && c->v && c->dout && c->out && c->dq && c->dk && c->dv && c->lse;
}

static void free_case(sdpa_case *c) {
    free(c->q);
    free(c->k);
    free(c->v);
    free(c->dout);
    free(c->out);
    free(c->dq);
    free(c->dk);
    free(c->dv);
    free(c->lse);
}

int bench_attention(const bench_options *o, const bench_blas *blas) {
    static const size_t own_tokens[] = {256, 1024, 4096, 16384};
    const size_t *all_tokens;
    size_t token_counts = bench_tokens(o, own_tokens, 4, 2, &all_tokens);
    printf("attention: fused scaled dot-product attention, B=1 H=%d hd=%d, T=S\n", HEADS, HEAD_DIM);
    printf("  GF/s over the SGEMM's (sgemm) and over the FMA peak (peak; attn-bench --section "
           "peak)\n");
    printf("%6s %-6s %3s | %9s %7s %5s %5s | %9s %7s %5s %5s | %7s %7s | %11s | %10s\n", "T",
           "mask", "thr", "fwd ms", "GF/s", "sgemm", "peak", "f+b ms", "GF/s", "sgemm", "peak",
           "drop f", "drop fb", "MiB f / f+b", "ref fwd ms");
    int rc = CLI_OK;
    for (size_t ti = 0; ti < o->thread_counts && rc == CLI_OK; ti++) {
        size_t threads = o->threads[ti];
        const char *who;
        double sgemm;
        if ((rc = sgemm_peak(blas, threads, o->runs, &who, &sgemm)) != CLI_OK) break;
        unsigned bits;
        double fma = bench_fma_peak(threads, o->runs, &bits);
        printf("  %zu thread%s: SGEMM 2048^3 through %s %.1f GFLOP/s", threads,
               threads == 1 ? "" : "s", who, sgemm);
        if (isnan(fma)) printf("; no FMA peak measured here\n");
        else printf("; FMA peak (%u-bit) %.1f GFLOP/s, the SGEMM at %.2f of it\n", bits, fma, sgemm / fma);
        for (size_t i = 0; i < token_counts && rc == CLI_OK; i++) {
            size_t T = all_tokens[i];
            /* T = 16384: causal only, once (a non-causal pass takes minutes) */
            for (int causal = 1; causal >= (T >= 16384 ? 1 : 0) && rc == CLI_OK; causal--) {
                sdpa_case c = {0};
                c.cfg = (attn_sdpa_config){.batch = 1, .heads = HEADS, .q_tokens = T,
                                           .kv_tokens = T, .head_dim = HEAD_DIM,
                                           .causal = causal};
                attn_ctx *ref = NULL;
                if (!alloc_case(&c, T) ||
                    attn_ctx_new(&(attn_ctx_config){.num_threads = threads,
                                                    .kernels = o->kernels[0]},
                                 &c.ctx) != ATTN_OK ||
                    attn_rng_new(c.ctx, 1, &c.rng) != ATTN_OK ||
                    attn_rng_set_bernoulli_method(c.rng, ATTN_BERNOULLI_PHILOX) != ATTN_OK) {
                    rc = cli_usage_error("bench: out of memory for T = %zu", T);
                } else {
                    double flops = 4.0 * HEADS * T * T * HEAD_DIM * (causal ? 0.5 : 1.0);
                    size_t runs = T >= 16384 ? 1 : o->runs;
                    double mib_f, mib_fb;
                    double t_f = time_median(run_forward, &c, runs, &mib_f);
                    double t_fb = time_median(run_forward_backward, &c, runs, &mib_fb);
                    c.cfg.dropout = 0.1;
                    double d_f = time_median(run_forward, &c, runs, NULL);
                    double d_fb = time_median(run_forward_backward, &c, runs, NULL);
                    c.cfg.dropout = 0.0;
                    char ref_ms[32] = "-";
                    if (T <= 1024 && attn_ctx_new(&(attn_ctx_config){.num_threads = threads,
                                                                    .kernels = ATTN_KERNELS_REFERENCE},
                                                  &ref) == ATTN_OK) {
                        attn_ctx *fast = c.ctx;
                        c.ctx = ref;
                        snprintf(ref_ms, sizeof ref_ms, "%.1f", 1e3 * time_median(run_forward, &c, 1, NULL));
                        c.ctx = fast;
                    }
                    if (c.failed) rc = cli_library_error(c.ctx, "bench attention");
                    double rate_f = flops / t_f / 1e9, rate_fb = 3.5 * flops / t_fb / 1e9;
                    printf("%6zu %-6s %3zu | %9.2f %7.1f %5.2f %5.2f | %9.2f %7.1f %5.2f %5.2f | "
                           "%7.2f %7.2f | %5.1f/%5.1f | %10s\n",
                           T, causal ? "causal" : "none", threads, 1e3 * t_f, rate_f, rate_f / sgemm,
                           rate_f / fma, 1e3 * t_fb, rate_fb, rate_fb / sgemm, rate_fb / fma,
                           d_f / t_f, d_fb / t_fb, mib_f, mib_fb, ref_ms);
                    fflush(stdout);
                }
                attn_ctx_free(ref);
                attn_rng_free(c.rng);
                attn_ctx_free(c.ctx);
                free_case(&c);
            }
        }
    }
    return rc;
}

/* ---- the GPT-2-small attention layer ------------------------------------------ */

typedef struct layer_case {
    attn_gpt2 *m;
    attn_ctx *ctx;
    size_t T;
    float *x, *y, *dy, *dx;
    bool failed;
} layer_case;

static void layer_forward(void *arg) {
    layer_case *c = arg;
    if (attn_gpt2_forward(c->m, c->x, 1, c->T, c->y, NULL) != ATTN_OK) c->failed = true;
}

static void layer_forward_backward(void *arg) {
    layer_case *c = arg;
    layer_forward(c);
    if (attn_gpt2_backward(c->m, c->dy, 1, c->T, c->dx) != ATTN_OK) c->failed = true;
}

int bench_layer(const bench_options *o, const bench_blas *blas) {
    (void)blas;
    static const size_t own_tokens[] = {1024, 4096, 16384};
    const size_t *all_tokens;
    size_t token_counts = bench_tokens(o, own_tokens, 3, 1, &all_tokens), C = 768;
    printf("layer: GPT-2-small attention (CausalSelfAttention: c_attn, attention, c_proj), "
           "C=%zu, %d heads, B=1\n", C, HEADS);
    printf("%6s %3s | %9s | %9s | %s\n", "T", "thr", "fwd ms", "f+b ms",
           "MiB beyond inputs, weights, activations, gradients (f+b)");
    int rc = CLI_OK;
    for (size_t ti = 0; ti < o->thread_counts && rc == CLI_OK; ti++) {
        for (size_t i = 0; i < token_counts && rc == CLI_OK; i++) {
            layer_case c = {.T = all_tokens[i]};
            size_t n = c.T * C;
            attn_rng *rng = NULL;
            c.x = bench_random(n, 21);
            c.dy = bench_random(n, 22);
            c.y = resident(n, 23);
            c.dx = resident(n, 24);
            attn_gpt2_config cfg = {.n_embd = C, .n_head = HEADS, .block_size = c.T};
            if (!c.x || !c.dy || !c.y || !c.dx ||
                attn_ctx_new(&(attn_ctx_config){.num_threads = o->threads[ti],
                                                .kernels = o->kernels[0]},
                             &c.ctx) != ATTN_OK ||
                attn_rng_new(c.ctx, 123, &rng) != ATTN_OK ||
                attn_gpt2_new(c.ctx, &cfg, rng, &c.m) != ATTN_OK ||
                attn_module_set_training(attn_gpt2_module(c.m), false) != ATTN_OK) {
                rc = cli_usage_error("bench: cannot set up the layer at T = %zu", c.T);
            } else {
                attn_module *m = attn_gpt2_module(c.m);
                size_t runs = c.T >= 16384 ? 1 : o->runs;
                double t_f = NAN, t_fb = NAN, mib = NAN;
                /* the forward alone keeps nothing for a backward */
                c.failed = attn_module_set_grad_enabled(m, false) != ATTN_OK;
                if (!c.failed) t_f = time_median(layer_forward, &c, runs, NULL);
                if (!c.failed) c.failed = attn_module_set_grad_enabled(m, true) != ATTN_OK;
                if (!c.failed) t_fb = time_median(layer_forward_backward, &c, runs, &mib);
                /* kept by the module for its backward: x, qkv, y, lse */
                double kept = (double)(n * 5 + c.T * HEADS) * sizeof(float) / 1048576.0;
                if (c.failed)
                    rc = cli_library_error(c.ctx, "bench layer");
                else
                    printf("%6zu %3zu | %9.1f | %9.1f | %.1f (peak growth %.1f, of which "
                           "activations %.1f)\n",
                           c.T, o->threads[ti], 1e3 * t_f, 1e3 * t_fb, mib - kept, mib, kept);
                fflush(stdout);
            }
            attn_gpt2_free(c.m);
            attn_rng_free(rng);
            attn_ctx_free(c.ctx);
            free(c.x);
            free(c.dy);
            free(c.y);
            free(c.dx);
        }
    }
    return rc;
}

/* ---- dropout: what each mask costs in a module ------------------------------- */

typedef struct mha_case {
    attn_mha *m;
    attn_rng *drop; /* NULL: no dropout */
    size_t T;
    float *x, *y, *dy, *dx;
    bool failed;
} mha_case;

static void mha_forward(void *arg) {
    mha_case *c = arg;
    if (attn_mha_forward(c->m, c->x, 1, c->T, c->y, c->drop) != ATTN_OK) c->failed = true;
}

static void mha_forward_backward(void *arg) {
    mha_case *c = arg;
    mha_forward(c);
    if (attn_mha_backward(c->m, c->dy, 1, c->T, c->dx) != ATTN_OK) c->failed = true;
}

/* Median forward and forward+backward seconds of the mha module at T tokens,
 * with dropout p drawn by method (p = 0: none); false when it cannot run. */
static bool time_mha(const bench_options *o, size_t threads, size_t T, double p,
                     attn_bernoulli_method method, double *t_f, double *t_fb) {
    const size_t C = 768;
    mha_case c = {.T = T};
    attn_ctx *ctx = NULL;
    attn_rng *init = NULL;
    c.x = bench_random(T * C, 31);
    c.dy = bench_random(T * C, 32);
    c.y = resident(T * C, 33);
    c.dx = resident(T * C, 34);
    attn_mha_config cfg = {.d_in = C, .d_out = C, .context_length = T, .num_heads = HEADS,
                           .dropout = p, .mask = ATTN_MASK_NEG_INF};
    bool ok = c.x && c.dy && c.y && c.dx &&
              attn_ctx_new(&(attn_ctx_config){.num_threads = threads, .kernels = o->kernels[0]},
                           &ctx) == ATTN_OK &&
              attn_rng_new(ctx, 123, &init) == ATTN_OK &&
              attn_mha_new(ctx, &cfg, init, &c.m) == ATTN_OK &&
              attn_module_set_training(attn_mha_module(c.m), true) == ATTN_OK &&
              (p == 0.0 || (attn_rng_new(ctx, 7, &c.drop) == ATTN_OK &&
                            attn_rng_set_bernoulli_method(c.drop, method) == ATTN_OK));
    if (ok) {
        *t_f = time_median(mha_forward, &c, o->runs, NULL);
        *t_fb = time_median(mha_forward_backward, &c, o->runs, NULL);
        ok = !c.failed;
    }
    attn_mha_free(c.m);
    attn_rng_free(c.drop);
    attn_rng_free(init);
    attn_ctx_free(ctx);
    free(c.x);
    free(c.dy);
    free(c.y);
    free(c.dx);
    return ok;
}

int bench_dropout(const bench_options *o, const bench_blas *blas) {
    (void)blas;
    static const size_t own_tokens[] = {1024, 4096};
    static const struct {
        const char *name;
        attn_bernoulli_method method;
    } masks[] = {{"philox", ATTN_BERNOULLI_PHILOX},
                 {"mt19937", ATTN_BERNOULLI_MT19937},
                 {"mkl-mcg31", ATTN_BERNOULLI_MKL_MCG31}};
    const size_t *all_tokens;
    size_t token_counts = bench_tokens(o, own_tokens, 2, 1, &all_tokens);
    printf("dropout: the mha module, C=768, %d heads, causal, B=1, training mode, "
           "attention dropout 0.1 (ms: fwd / f+b)\n", HEADS);
    printf("%6s %3s | %17s | %17s | %17s | %17s\n", "T", "thr", "no dropout", masks[0].name,
           masks[1].name, masks[2].name);
    for (size_t ti = 0; ti < o->thread_counts; ti++) {
        for (size_t i = 0; i < token_counts; i++) {
            size_t T = all_tokens[i], threads = o->threads[ti];
            double t_f, t_fb;
            if (!time_mha(o, threads, T, 0.0, ATTN_BERNOULLI_PHILOX, &t_f, &t_fb))
                return cli_usage_error("bench: cannot run the mha module at T = %zu", T);
            printf("%6zu %3zu | %7.1f / %7.1f", T, threads, 1e3 * t_f, 1e3 * t_fb);
            for (size_t k = 0; k < sizeof masks / sizeof masks[0]; k++) {
                if (!time_mha(o, threads, T, 0.1, masks[k].method, &t_f, &t_fb))
                    return cli_usage_error("bench: cannot run the mha module with %s dropout",
                                           masks[k].name);
                printf(" | %7.1f / %7.1f", 1e3 * t_f, 1e3 * t_fb);
            }
            printf("\n");
            fflush(stdout);
        }
    }
    return CLI_OK;
}
