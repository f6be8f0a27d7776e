/*
 * flex_backward_table.c — the block-map (flex) kernels' forward and
 * backward on a relative table with its gradient (which sends the chain to
 * them), T x T causal, 12 heads of 64, one thread: best of 4 calls each.
 * steep 1: the table falls with distance as ALiBi's slopes 2^-(8 (h + 1) /
 * 12) do (far keys' weights and dS subnormal without flush-to-zero);
 * steep 0: small values.
 *
 *   cc -O2 -Iinclude bench/micro/flex_backward_table.c -Lbuild -lattn -lm -o /tmp/fbt
 *   LD_LIBRARY_PATH=build /tmp/fbt [T 2048] [steep 0|1] [gradient 1|0]
 *
 * Two builds side by side: LD_LIBRARY_PATH at each one's directory, in
 * turns (bench/results/flex-backward-table-ab-*.txt). Not part of the build.
 */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static float *uniform_floats(size_t n) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; x && i < n; i++) x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    return x;
}

int main(int argc, char **argv) {
    size_t T = argc > 1 ? strtoul(argv[1], NULL, 10) : 2048, H = 12, D = 64, n = T * H * D;
    int steep = argc > 2 ? atoi(argv[2]) : 0, gradient = argc > 3 ? atoi(argv[3]) : 1;
    attn_ctx *ctx;
    attn_ctx_config cc = {.num_threads = 1};
    if (attn_ctx_new(&cc, &ctx) != ATTN_OK) return 1;
    float *q = uniform_floats(n), *k = uniform_floats(n), *v = uniform_floats(n);
    float *dout = uniform_floats(n), *out = malloc(n * sizeof *out);
    float *lse = malloc(H * T * sizeof *lse), *dq = malloc(n * sizeof *dq);
    float *dk = malloc(n * sizeof *dk), *dv = malloc(n * sizeof *dv);
    float *table = malloc(H * T * sizeof *table), *table_grad = malloc(H * T * sizeof *table);
    if (!q || !k || !v || !dout || !out || !lse || !dq || !dk || !dv || !table || !table_grad)
        return 1;
    /* element e of head h's row: distance e = q_idx - kv_idx */
    for (size_t h = 0; h < H; h++) {
        float slope = (float)pow(2.0, -8.0 * (double)(h + 1) / (double)H);
        for (size_t e = 0; e < T; e++)
            table[h * T + e] = steep ? -slope * (float)e : 0.01f * (float)(e % 7);
    }
    attn_score_mod mod = {.kind = ATTN_SCORE_REL_TABLE, .tensor = table,
                          .tensor_grad = gradient ? table_grad : NULL, .buckets = T};
    attn_sdpa_config cfg = {.batch = 1, .heads = H, .q_tokens = T, .kv_tokens = T,
                            .head_dim = D, .causal = true, .align = ATTN_ALIGN_TOP_LEFT,
                            .score_mods = &mod, .score_mod_count = 1};
    double best_forward = 1e9, best_backward = 1e9;
    for (int r = 0; r < 4; r++) {
        double t0 = now();
        attn_status st = attn_sdpa_forward(ctx, &cfg, q, k, v, out, lse, NULL, NULL);
        double t1 = now();
        if (st == ATTN_OK)
            st = attn_sdpa_backward(ctx, &cfg, q, k, v, out, lse, dout, dq, dk, dv, NULL);
        double t2 = now();
        if (st != ATTN_OK) {
            printf("%s\n", attn_ctx_last_error(ctx));
            return 1;
        }
        best_forward = fmin(best_forward, t1 - t0);
        best_backward = fmin(best_backward, t2 - t1);
    }
    printf("T %zu steep %d grad %d: fwd %.1f ms bwd %.1f ms  [%s]\n", T, steep, gradient,
           best_forward * 1e3, best_backward * 1e3, attn_ctx_last_explain(ctx));
    attn_ctx_free(ctx);
    return 0;
}
