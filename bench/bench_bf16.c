/*
 * bench_bf16.c — the bf16 section of attn-bench: attn_sdpa_forward_16 /
 * _backward_16 on bf16 tensors against attn_sdpa_forward / _backward on
 * the same values in float32, B = 1, H = 12, hd = 64, T = S in {1024,
 * 4096, 16384} (16384 causal only and once, as the attention section; not
 * with --quick), causal and not, on each thread count.
 *
 * Columns: milliseconds (median of --runs after a warm-up) of the forward
 * and of forward + backward, fp32 and bf16, and fp32 time / bf16 time (the
 * speedup; the aim is >= 1.6 on avx512_bf16 CPUs). "bf16 err" is
 * ||out_bf16 - out_fp32|| / ||out_fp32||, a check that the bf16 run
 * computed the same attention (bf16's precision: a few 1e-3). The kernel
 * line says whether the bf16 calls run on AMX tiles, vdpbf16ps or widen to
 * float. The table runs first as the library does by itself (no AMX);
 * then, where the CPU has AMX, the section asks for the tile data
 * (attn_cpu_request_amx), as an application that wants attn's AMX kernels
 * does, and runs it again.
 */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"
#include "cli.h"
/* the library's one float <-> bf16 conversion (header-only, no internals) */
#include "../src/core/half.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HEADS 12
#define HEAD_DIM 64

typedef struct bf16_case {
    attn_ctx *ctx;
    attn_sdpa_config cfg;
    float *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv;          /* fp32 */
    uint16_t *q16, *k16, *v16, *out16, *dout16, *dq16, *dk16, *dv16; /* bf16 */
    float *lse16;
    bool failed;
} bf16_case;

static void fp32_forward(void *arg) {
    bf16_case *c = arg;
    if (attn_sdpa_forward(c->ctx, &c->cfg, c->q, c->k, c->v, c->out, c->lse, NULL, NULL) != ATTN_OK)
        c->failed = true;
}

static void fp32_forward_backward(void *arg) {
    bf16_case *c = arg;
    fp32_forward(c);
    if (attn_sdpa_backward(c->ctx, &c->cfg, c->q, c->k, c->v, c->out, c->lse, c->dout, c->dq,
                           c->dk, c->dv, NULL) != ATTN_OK)
        c->failed = true;
}

static void bf16_forward(void *arg) {
    bf16_case *c = arg;
    if (attn_sdpa_forward_16(c->ctx, &c->cfg, ATTN_DTYPE_BF16, c->q16, c->k16, c->v16, c->out16,
                             c->lse16, NULL, NULL) != ATTN_OK)
        c->failed = true;
}

static void bf16_forward_backward(void *arg) {
    bf16_case *c = arg;
    bf16_forward(c);
    if (attn_sdpa_backward_16(c->ctx, &c->cfg, ATTN_DTYPE_BF16, c->q16, c->k16, c->v16, c->out16,
                              c->lse16, c->dout16, c->dq16, c->dk16, c->dv16, NULL) != ATTN_OK)
        c->failed = true;
}

/* Inputs random in [-1, 1), rounded to bf16, and the fp32 copies of the
 * same values; outputs written once so that their pages are resident. */
static bool alloc_case(bf16_case *c, size_t T) {
    size_t n = (size_t)HEADS * T * HEAD_DIM;
    float **f32[9] = {&c->q, &c->k, &c->v, &c->dout, &c->out, &c->dq, &c->dk, &c->dv, &c->lse};
    uint16_t **b16[8] = {&c->q16, &c->k16, &c->v16, &c->dout16, &c->out16, &c->dq16, &c->dk16,
                         &c->dv16};
    bool ok = true;
    for (int i = 0; i < 9; i++) ok = (*f32[i] = bench_random(i == 8 ? (size_t)HEADS * T : n, 31 + (unsigned)i)) && ok;
    for (int i = 0; i < 8; i++) ok = (*b16[i] = malloc(n * sizeof(uint16_t))) && ok;
    ok = (c->lse16 = bench_random((size_t)HEADS * T, 41)) && ok;
    if (!ok) return false;
    for (int i = 0; i < 8; i++)
        for (size_t e = 0; e < n; e++) {
            (*b16[i])[e] = attn_float_to_bf16((*f32[i])[e]);
            if (i < 4) (*f32[i])[e] = attn_bf16_to_float((*b16[i])[e]); /* the same values in fp32 */
        }
    return true;
}

static void free_case(bf16_case *c) {
    float *f32[10] = {c->q, c->k, c->v, c->dout, c->out, c->dq, c->dk, c->dv, c->lse, c->lse16};
    uint16_t *b16[8] = {c->q16, c->k16, c->v16, c->dout16, c->out16, c->dq16, c->dk16, c->dv16};
    for (int i = 0; i < 10; i++) free(f32[i]);
    for (int i = 0; i < 8; i++) free(b16[i]);
}

/* ||bf16 out - fp32 out|| / ||fp32 out||. */
static double out_error(const bf16_case *c, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t e = 0; e < n; e++) {
        double d = (double)attn_bf16_to_float(c->out16[e]) - c->out[e];
        num += d * d;
        den += (double)c->out[e] * c->out[e];
    }
    return den > 0.0 ? sqrt(num / den) : NAN;
}

/* The kernels the bf16 calls take on this CPU now (sdpa16.c's choice). */
static const char *bf16_kernels_here(const bench_options *o, const attn_cpu_info *cpu) {
    if (!cpu->avx512_bf16 || o->kernels[0] != ATTN_KERNELS_AVX512)
        return "none here: bf16 widened to float, fp32 kernels";
    if (cpu->amx_bf16) return "AMX tiles (amx_bf16; head_dim 64 here)";
    if (strcmp(cpu->vendor, "GenuineIntel") == 0)
        return "widened to float, fp32 kernels (vdpbf16ps issues at half the FMA's rate on "
               "Intel's cores; their fast bf16 is AMX)";
    return "vdpbf16ps (avx512_bf16)";
}

/* One table: every T, mask and thread count. */
static int bf16_table(const bench_options *o) {
    static const size_t own_tokens[] = {1024, 4096, 16384};
    const size_t *all_tokens;
    size_t token_counts = bench_tokens(o, own_tokens, 3, 2, &all_tokens);
    printf("%6s %-6s %3s | %9s %9s %6s | %9s %9s %6s | %8s\n", "T", "mask", "thr", "fp32 fwd",
           "bf16 fwd", "x", "fp32 f+b", "bf16 f+b", "x", "bf16 err");
    int rc = CLI_OK;
    for (size_t ti = 0; ti < o->thread_counts && rc == CLI_OK; ti++) {
        size_t threads = o->threads[ti];
        for (size_t i = 0; i < token_counts && rc == CLI_OK; i++) {
            size_t T = all_tokens[i];
            for (int causal = 1; causal >= (T >= 16384 ? 1 : 0) && rc == CLI_OK; causal--) {
                bf16_case c = {0};
                c.cfg = (attn_sdpa_config){.batch = 1, .heads = HEADS, .q_tokens = T,
                                           .kv_tokens = T, .head_dim = HEAD_DIM,
                                           .causal = causal};
                if (!alloc_case(&c, T) ||
                    attn_ctx_new(&(attn_ctx_config){.num_threads = threads,
                                                    .kernels = o->kernels[0]},
                                 &c.ctx) != ATTN_OK) {
                    rc = cli_usage_error("bench: out of memory for T = %zu", T);
                } else {
                    size_t runs = T >= 16384 ? 1 : o->runs;
                    double f32_f = bench_time_median(fp32_forward, &c, runs);
                    double b16_f = bench_time_median(bf16_forward, &c, runs);
                    double f32_fb = bench_time_median(fp32_forward_backward, &c, runs);
                    double b16_fb = bench_time_median(bf16_forward_backward, &c, runs);
                    if (c.failed) rc = cli_library_error(c.ctx, "bench bf16");
                    printf("%6zu %-6s %3zu | %9.2f %9.2f %6.2f | %9.2f %9.2f %6.2f | %8.1e\n", T,
                           causal ? "causal" : "none", threads, 1e3 * f32_f, 1e3 * b16_f,
                           f32_f / b16_f, 1e3 * f32_fb, 1e3 * b16_fb, f32_fb / b16_fb,
                           out_error(&c, (size_t)HEADS * T * HEAD_DIM));
                    fflush(stdout);
                }
                attn_ctx_free(c.ctx);
                free_case(&c);
            }
        }
    }
    return rc;
}

int bench_bf16(const bench_options *o, const bench_blas *blas) {
    (void)blas;
    attn_cpu_info cpu = {0};
    if (attn_cpu_info_get(&cpu) != ATTN_OK)
        return cli_failure("bench: cannot read the CPU's features");
    printf("bf16: attn_sdpa_*_16 on bf16 vs attn_sdpa_* on fp32 (same values), B=1 H=%d hd=%d, "
           "T=S\n  bf16 kernels: %s\n",
           HEADS, HEAD_DIM, bf16_kernels_here(o, &cpu));
    int rc = bf16_table(o);
    /* then AMX, where the CPU has it: the tiles an application asks for */
    if (rc != CLI_OK || attn_cpu_request_amx() != ATTN_OK) return rc;
    if (attn_cpu_info_get(&cpu) != ATTN_OK)
        return cli_failure("bench: cannot read the CPU's features");
    printf("  AMX tile data granted (attn_cpu_request_amx); bf16 kernels: %s\n",
           bf16_kernels_here(o, &cpu));
    return bf16_table(o);
}
