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
#include "attn.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static float *rnd(size_t n) { float *x = malloc(n * 4); for (size_t i = 0; i < n; i++) x[i] = (float)rand() / RAND_MAX - 0.5f; return x; }
int main(int argc, char **argv) {
    size_t T = argc > 1 ? strtoul(argv[1], NULL, 10) : 2048, H = 12, D = 64, n = T * H * D;
    int steep = argc > 2 ? atoi(argv[2]) : 0; /* table -slope*e */
    int withgrad = argc > 3 ? atoi(argv[3]) : 1;
    attn_ctx *ctx;
    attn_ctx_config cc = {.num_threads = 1};
    if (attn_ctx_new(&cc, &ctx) != ATTN_OK) return 1;
    float *q = rnd(n), *k = rnd(n), *v = rnd(n), *dout = rnd(n), *out = malloc(n * 4), *lse = malloc(H * T * 4);
    float *dq = malloc(n * 4), *dk = malloc(n * 4), *dv = malloc(n * 4);
    size_t nb = T; float *table = malloc(H * nb * 4), *tg = malloc(H * nb * 4);
    for (size_t h = 0; h < H; h++) for (size_t e = 0; e < nb; e++) table[h * nb + e] = steep ? -(float)pow(2.0, -8.0 * (h + 1) / H) * (float)e : 0.01f * (float)(e % 7);
    attn_score_mod mod = {.kind = ATTN_SCORE_REL_TABLE, .tensor = table, .tensor_grad = withgrad ? tg : NULL, .buckets = nb};
    attn_sdpa_config cfg = {.batch = 1, .heads = H, .q_tokens = T, .kv_tokens = T, .head_dim = D, .causal = true, .align = ATTN_ALIGN_TOP_LEFT, .score_mods = &mod, .score_mod_count = 1};
    double best_f = 1e9, best_b = 1e9;
    for (int r = 0; r < 4; r++) {
        double t0 = now();
        if (attn_sdpa_forward(ctx, &cfg, q, k, v, out, lse, NULL, NULL)) { printf("%s\n", attn_ctx_last_error(ctx)); return 1; }
        double t1 = now();
        if (attn_sdpa_backward(ctx, &cfg, q, k, v, out, lse, dout, dq, dk, dv, NULL)) { printf("%s\n", attn_ctx_last_error(ctx)); return 1; }
        double t2 = now();
        if (t1 - t0 < best_f) best_f = t1 - t0;
        if (t2 - t1 < best_b) best_b = t2 - t1;
    }
    printf("T %zu steep %d grad %d: fwd %.1f ms bwd %.1f ms  [%s]\n", T, steep, withgrad, best_f * 1e3, best_b * 1e3, attn_ctx_last_explain(ctx));
    return 0;
}
