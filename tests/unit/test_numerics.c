/*
 * test_numerics.c — numerics at the edges that need no PyTorch to check
 * (tests/conformance/test_numerics.py holds the comparisons with it):
 *   - a query row that sees no key (causal with more queries than keys,
 *     as masks and windows make) outputs zeros, not NaN, in the forward
 *     and sends no gradient back, for both causal masks;
 *   - finite inputs whose intermediates overflow float32 (inputs at 3e19,
 *     rows near 1e38) give finite outputs from every module;
 *   - the renormalising mask equals the neg-inf mask even where a future
 *     score dwarfs the kept ones beyond float64's exp range;
 *   - the fused kernels' scan, or the forward's own measuring, finds a NaN
 *     anywhere in q, k, v or dout, in every layout, and hands the call to
 *     the reference;
 *   - a scale that rounds to 0 in float gives uniform weights and zero dq
 *     and dk, not NaN;
 *   - a key too far below its row for the fast kernels' exp2 (2^-125) but
 *     with a value large enough to count matches the float64 call.
 */
#include "attn.h"
#include "check.h"
#include "attention/attention.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return false;
    return true;
}

/* T = 5 queries over S = 2 keys, causal bottom-right: queries 0, 1 and 2
 * see no key. Run on the reference backend directly. */
static void test_rows_that_see_no_key(attn_ctx *ctx) {
    enum { T = 5, S = 2, D = 3 };
    const attn_attention_backend *ref = &attn_attention_reference;
    float q[T * D], k[S * D], v[S * D], out[T * D], lse[T];
    for (int i = 0; i < T * D; i++) q[i] = 0.1f * (float)(i % 7) - 0.2f;
    for (int i = 0; i < S * D; i++) {
        k[i] = 0.3f * (float)(i % 5) - 0.5f;
        v[i] = 0.7f - 0.1f * (float)i;
    }
    for (int m = 0; m < 2; m++) {
        /* q, out (1, 1, T, D), k, v (1, 1, S, D), contiguous */
        attn_attention_problem p = {
            .batch = 1, .q_heads = 1, .kv_heads = 1, .q_len = T, .kv_len = S,
            .head_dim = D, .v_head_dim = D,
            .q = attn_view_f32(q, (attn_view_strides){T * D, D, D}),
            .k = attn_view_f32(k, (attn_view_strides){S * D, D, D}),
            .v = attn_view_f32(v, (attn_view_strides){S * D, D, D}),
            .out = attn_view_f32(out, (attn_view_strides){T * D, D, D}),
            .lse = lse, .scale = 0.5f, .causal = true,
            .renormalize = m == 1,
        };
        attn_attention_dropout none = {.kind = ATTN_DROP_NONE};
        void *work = malloc(ref->forward_bytes(ctx, &p, NULL));
        for (int i = 0; i < T * D; i++) out[i] = NAN;
        ref->forward(ctx, &p, &none, NULL, work);
        free(work);
        for (int i = 0; i < T - S; i++) {
            for (int d = 0; d < D; d++) CHECK(out[i * D + d] == 0.0f); /* zeros, not NaN */
            CHECK(isinf(lse[i]) && lse[i] < 0);
        }
        CHECK(all_finite(out, T * D));
        /* The last row sees every key: a weighted mean of v. */
        CHECK(out[(T - 1) * D] > -1.0f && out[(T - 1) * D] < 1.0f);

        /* Backward: no gradient flows through a row that saw nothing. */
        float dout[T * D], dq[T * D], dk[S * D], dv[S * D];
        for (int i = 0; i < T * D; i++) dout[i] = 1.0f;
        attn_attention_grads g = {.dout = dout, .dq = dq, .dk = dk, .dv = dv};
        work = malloc(ref->backward_bytes(ctx, &p));
        ref->backward(ctx, &p, &none, &g, work);
        free(work);
        for (int i = 0; i < (T - S) * D; i++) CHECK(dq[i] == 0.0f);
        CHECK(all_finite(dq, T * D) && all_finite(dk, S * D) && all_finite(dv, S * D));
    }
}

/* A scale that rounds to 0 in float (1e-300): every weight 1/S, out the
 * mean of v, dq and dk zero (scale times a sum), dv the mean of dout; on
 * (batch, heads) enough for the fused backward's one pass, where q packed
 * times the scale left dk 0 / 0 = NaN. */
static void test_scale_rounding_to_zero(attn_ctx *ctx) {
    enum { B = 2, H = 3, T = 5, S = 7, D = 8 };
    static float q[B * T * H * D], k[B * S * H * D], v[B * S * H * D], out[B * T * H * D];
    static float dout[B * T * H * D], dq[B * T * H * D], dk[B * S * H * D], dv[B * S * H * D];
    float lse[B * H * T];
    for (int i = 0; i < B * T * H * D; i++) {
        q[i] = (float)sin(0.3 * i);
        dout[i] = (float)cos(0.7 * i);
    }
    for (int i = 0; i < B * S * H * D; i++) {
        k[i] = (float)cos(0.5 * i);
        v[i] = (float)sin(1.1 * i);
    }
    attn_sdpa_config cfg = {.batch = B, .heads = H, .q_tokens = T, .kv_tokens = S,
                            .head_dim = D, .scale = 1e-300};
    CHECK_STATUS(attn_sdpa_forward(ctx, &cfg, q, k, v, out, lse, NULL, NULL), ATTN_OK);
    CHECK_STATUS(attn_sdpa_backward(ctx, &cfg, q, k, v, out, lse, dout, dq, dk, dv, NULL),
                 ATTN_OK);
    /* (B, T, H, D) rows */
    double worst = 0.0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int d = 0; d < D; d++) {
                double mean_v = 0.0, mean_dout = 0.0;
                for (int j = 0; j < S; j++) mean_v += v[((b * S + j) * H + h) * D + d] / S;
                for (int i = 0; i < T; i++) mean_dout += dout[((b * T + i) * H + h) * D + d] / S;
                for (int i = 0; i < T; i++)
                    worst = check_worse(worst, fabs(out[((b * T + i) * H + h) * D + d] - mean_v));
                for (int j = 0; j < S; j++)
                    worst = check_worse(worst, fabs(dv[((b * S + j) * H + h) * D + d] - mean_dout));
            }
    CHECK(worst < 1e-5);
    for (int i = 0; i < B * T * H * D; i++) CHECK(dq[i] == 0.0f);
    for (int i = 0; i < B * S * H * D; i++) CHECK(dk[i] == 0.0f);
}

static attn_module *build_mha(attn_ctx *ctx, attn_rng *rng, size_t d, attn_mask_method mask) {
    attn_mha *m = NULL;
    attn_mha_config cfg = {.d_in = d, .d_out = d, .context_length = 8, .num_heads = 2,
                           .qkv_bias = true, .mask = mask};
    attn_rng_manual_seed(rng, 5);
    CHECK_STATUS(attn_mha_new(ctx, &cfg, rng, &m), ATTN_OK);
    return attn_mha_module(m);
}

/* Finite inputs at 3e19 (scores past float32's range) and rows near 1e38
 * (SimplifiedSelfAttention's x x^T is 1e76): finite outputs. */
static void test_overflowing_intermediates(attn_ctx *ctx, attn_rng *rng) {
    enum { B = 2, T = 6, C = 8 };
    float x[B * T * C], y[B * T * C];
    for (int i = 0; i < B * T * C; i++) x[i] = (float)(3e19 * sin(1.0 + i));
    attn_module *m = build_mha(ctx, rng, C, ATTN_MASK_NEG_INF);
    attn_module_set_training(m, false);
    CHECK_STATUS(attn_module_forward(m, x, B, T, y, NULL), ATTN_OK);
    CHECK(all_finite(y, B * T * C));
    attn_module_free(m);

    attn_gpt2 *g;
    attn_gpt2_config gcfg = {.n_embd = C, .n_head = 2, .block_size = T};
    CHECK_STATUS(attn_gpt2_new(ctx, &gcfg, rng, &g), ATTN_OK);
    CHECK_STATUS(attn_gpt2_forward(g, x, B, T, y, NULL), ATTN_OK);
    CHECK(all_finite(y, B * T * C));
    attn_gpt2_free(g);

    attn_simple *s;
    CHECK_STATUS(attn_simple_new(ctx, &(attn_simple_config){.d_in = C}, &s), ATTN_OK);
    for (int i = 0; i < B * T * C; i++) x[i] = (float)(1e38 * (0.5 + 0.5 * fabs(sin(2.0 + i))));
    CHECK_STATUS(attn_simple_forward(s, x, B, T, y), ATTN_OK);
    CHECK(all_finite(y, B * T * C));
    attn_simple_free(s);
}

/* Inputs scaled so that future scores exceed the kept ones by far more than
 * 745 (exp underflows even in double): renormalising still equals neg-inf. */
static void test_renormalize_without_underflow(attn_ctx *ctx, attn_rng *rng) {
    enum { B = 2, T = 6, C = 8 };
    float x[B * T * C], y_renorm[B * T * C], y_neg_inf[B * T * C];
    attn_module *renorm = build_mha(ctx, rng, C, ATTN_MASK_RENORMALIZE);
    attn_module *neg_inf = build_mha(ctx, rng, C, ATTN_MASK_NEG_INF);
    attn_module_set_training(renorm, false);
    attn_module_set_training(neg_inf, false);
    for (double factor = 1.0; factor <= 1e4; factor *= 10.0) {
        for (int i = 0; i < B * T * C; i++) x[i] = (float)(factor * sin(0.7 * i + 0.3));
        CHECK_STATUS(attn_module_forward(renorm, x, B, T, y_renorm, NULL), ATTN_OK);
        CHECK_STATUS(attn_module_forward(neg_inf, x, B, T, y_neg_inf, NULL), ATTN_OK);
        double diff = 0.0, norm = 0.0;
        for (int i = 0; i < B * T * C; i++) {
            diff += ((double)y_renorm[i] - y_neg_inf[i]) * ((double)y_renorm[i] - y_neg_inf[i]);
            norm += (double)y_neg_inf[i] * y_neg_inf[i];
        }
        CHECK(all_finite(y_renorm, B * T * C));
        if (!(sqrt(diff) <= 1e-6 * sqrt(norm)))
            fprintf(stderr, "  factor %g: renormalize vs neg-inf rel %g\n", factor,
                    sqrt(diff / norm));
        CHECK(sqrt(diff) <= 1e-6 * sqrt(norm));
    }
    attn_module_free(renorm);
    attn_module_free(neg_inf);
}

/* One NaN at a time, first, middle or last in q, k, v or dout: the fused
 * ctx (a scan of every input, or the kernels' measuring of them as they read
 * them, then the reference for non-finite ones) must give the reference
 * ctx's bits, NaNs included. Every layout here runs the backward's one
 * pass (B x KV heads = 4), which measures q and dO as it packs them and
 * each key block of k and v. The layouts: (B, T, H, D), where the forward
 * measures the rows it packs, (B, H, T, D), where the forward measures the
 * rows as its blocks read them in place, packed
 * sequences, and (B, H, T, D) causal top-left with 150 queries, whose
 * blocks read only keys 0-149: the forward measures the rest at the end,
 * as a NaN value there still reaches the reference's out (0 * NaN; a NaN
 * key there is masked and reaches nothing), and (B, H, T, D) causal, whose
 * first query block reads keys 0-287 and whose second block alone reads
 * the rest (each key measured by the first block that reads it). T = 300
 * leaves a partial block, and GQA a KV head count of its own. */
static void test_scan_finds_every_nan(void) {
    enum { B = 2, T = 300, H = 4, HKV = 2, D = 8, NQ = B * T * H * D, NK = B * T * HKV * D };
    attn_ctx *fused, *ref;
    CHECK_STATUS(attn_ctx_new(&(attn_ctx_config){.num_threads = 2}, &fused), ATTN_OK);
    attn_ctx_config ref_config = {.num_threads = 2, .kernels = ATTN_KERNELS_REFERENCE};
    CHECK_STATUS(attn_ctx_new(&ref_config, &ref), ATTN_OK);
    enum { INPUTS = 2 * NQ + 2 * NK, OUTPUTS = 2 * NQ + 2 * NK + B * H * T };
    float *in = malloc(sizeof(float) * INPUTS), *got = malloc(sizeof(float) * 2 * OUTPUTS);
    float *q = in, *k = q + NQ, *v = k + NK, *dout = v + NK;
    float *outs[2][5]; /* per ctx: out, dq, dk, dv, lse */
    for (int c = 0; c < 2; c++) {
        float *at = got + c * OUTPUTS;
        outs[c][0] = at;
        outs[c][1] = at + NQ;
        outs[c][2] = at + 2 * NQ;
        outs[c][3] = at + 2 * NQ + NK;
        outs[c][4] = at + 2 * NQ + 2 * NK;
    }
    static const int32_t cu[B + 1] = {0, 113, 2 * T};
    for (int layout = 0; layout < 5; layout++) {
        size_t TQ = layout == 3 ? T / 2 : T;
        attn_sdpa_config cfg = {.batch = B, .heads = H, .kv_heads = HKV, .q_tokens = TQ,
                                .kv_tokens = T, .head_dim = D};
        if (layout == 1 || layout >= 3) { /* (B, H, T, D) */
            size_t qs[3] = {H * TQ * D, D, TQ * D}, ks[3] = {HKV * T * D, D, T * D};
            memcpy(cfg.q_strides, qs, sizeof qs);
            memcpy(cfg.out_strides, qs, sizeof qs);
            memcpy(cfg.kv_strides, ks, sizeof ks);
        } else if (layout == 2) { /* sequences of 113 and 487 tokens */
            cfg.cu_seqlens_q = cfg.cu_seqlens_kv = cu;
            cfg.q_tokens = cfg.kv_tokens = 487;
        }
        if (layout == 3) {
            cfg.causal = true;
            cfg.align = ATTN_ALIGN_TOP_LEFT;
        }
        if (layout == 4) cfg.causal = true;
        for (int tensor = 0; tensor < 4; tensor++)
            for (int where = 0; where < 3; where++) {
                for (int i = 0; i < INPUTS; i++) in[i] = (float)(0.5 * sin(0.37 * i + layout));
                memset(got, 0, sizeof(float) * 2 * OUTPUTS);
                size_t n = tensor == 1 || tensor == 2 ? NK : B * TQ * H * D;
                float *x = tensor == 0 ? q : tensor == 1 ? k : tensor == 2 ? v : dout;
                x[where == 0 ? 0 : where == 1 ? n / 2 + 3 : n - 1] = NAN;
                /* both backwards read the reference's out and lse (a NaN
                 * in dout leaves the fused forward its own bits) */
                for (int c = 1; c >= 0; c--) {
                    attn_ctx *ctx = c == 0 ? fused : ref;
                    float **o = outs[c];
                    CHECK_STATUS(attn_sdpa_forward(ctx, &cfg, q, k, v, o[0], o[4], NULL, NULL),
                                 ATTN_OK);
                    CHECK_STATUS(attn_sdpa_backward(ctx, &cfg, q, k, v, outs[1][0], outs[1][4],
                                                    dout, o[1], o[2], o[3], NULL),
                                 ATTN_OK);
                    if (tensor == 3 && c == 0) { /* and only the gradients compare */
                        memcpy(o[0], outs[1][0], sizeof(float) * NQ);
                        memcpy(o[4], outs[1][4], sizeof(float) * B * H * T);
                    }
                }
                size_t nan = 0;
                bool same = memcmp(outs[0][0], outs[1][0], sizeof(float) * OUTPUTS) == 0;
                for (size_t i = 0; i < 2 * NQ + 2 * NK; i++) nan += isnan(outs[0][0][i]);
                bool masked = layout == 3 && tensor == 1 && where == 2; /* the last key */
                if (!same || (nan == 0) != masked)
                    fprintf(stderr, "layout %d, NaN in input %d at %d: fused %s the reference, "
                            "%zu NaNs\n", layout, tensor, where, same ? "equals" : "differs from",
                            nan);
                CHECK(same && (nan == 0) == masked);
            }
    }
    free(in);
    free(got);
    attn_ctx_free(fused);
    attn_ctx_free(ref);
}

/* A key weighing under 2^-125 of its row's largest, whose value is large
 * enough that its share still counts (2^-125 x 1e37 is 0.2): the fast
 * kernels' exp2 gives 0 below -125 (fused and block-map alike), so such
 * values go to the reference, and out, dq, dk and dv agree with the
 * float64 call within 1e-5. Each
 * query row is e_0, key j's first element its score: key 3 scores L, the
 * others within [-1, 1]; key 3's value is V. */
static void test_far_key_huge_value(attn_ctx *ctx) {
    enum { T = 4, S = 40, D = 16 };
    /* values below FLT_MAX / 16 / S, which the sums' own range admits */
    const double cases[][2] = {{-88.0, 4e35}, {-88.0, 4e35}, {-92.0, 4e35}, {-92.0, 4e35},
                               {-86.5, 2e35}, {-80.0, 4e35}, {-88.0, 1e30}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float q[T * D] = {0}, k[S * D] = {0}, v[S * D], dout[T * D];
        double qd[T * D], kd[S * D], vd[S * D], dd[T * D];
        for (size_t i = 0; i < T; i++) q[i * D] = 1.0f;
        for (size_t j = 0; j < S; j++) {
            k[j * D] = j == 3 ? (float)cases[c][0] : (float)sin(1.7 * (double)j);
            for (size_t d = 0; d < D; d++)
                v[j * D + d] = j == 3 ? (float)(cases[c][1] * (d % 2 ? -1.0 : 1.0))
                                      : (float)cos(0.3 * (double)(j * D + d));
        }
        for (size_t i = 0; i < T * D; i++) dout[i] = (float)sin(0.7 * (double)i);
        for (size_t i = 0; i < T * D; i++) qd[i] = q[i], dd[i] = dout[i];
        for (size_t i = 0; i < S * D; i++) kd[i] = k[i], vd[i] = v[i];
        /* odd cases through a chain (a scale of 1): the block-map kernels' check */
        attn_score_mod unit = {.kind = ATTN_SCORE_SCALE, .value = 1.0};
        attn_sdpa_config cfg = {.batch = 1, .heads = 1, .q_tokens = T, .kv_tokens = S,
                                .head_dim = D, .scale = 1.0, .score_mods = c % 2 ? &unit : NULL,
                                .score_mod_count = c % 2};
        float out[T * D], lse[T], dq[T * D], dk[S * D], dv[S * D];
        double outd[T * D], lsed[T], dqd[T * D], dkd[S * D], dvd[S * D];
        CHECK_STATUS(attn_sdpa_forward(ctx, &cfg, q, k, v, out, lse, NULL, NULL), ATTN_OK);
        CHECK_STATUS(attn_sdpa_backward(ctx, &cfg, q, k, v, out, lse, dout, dq, dk, dv, NULL),
                     ATTN_OK);
        CHECK_STATUS(attn_sdpa_forward_f64(ctx, &cfg, qd, kd, vd, outd, lsed, NULL, NULL), ATTN_OK);
        CHECK_STATUS(attn_sdpa_backward_f64(ctx, &cfg, qd, kd, vd, outd, lsed, dd, dqd, dkd, dvd,
                                            NULL),
                     ATTN_OK);
        const float *got[4] = {out, dq, dk, dv};
        const double *want[4] = {outd, dqd, dkd, dvd};
        const size_t n[4] = {T * D, T * D, S * D, S * D};
        for (int t = 0; t < 4; t++) {
            double num = 0, den = 0;
            for (size_t i = 0; i < n[t]; i++) {
                num += ((double)got[t][i] - want[t][i]) * ((double)got[t][i] - want[t][i]);
                den += want[t][i] * want[t][i];
            }
            double e = den > 0 ? sqrt(num / den) : sqrt(num);
            CHECK(e <= 1e-5);
            if (e > 1e-5)
                printf("FAIL far key L %g, V %g: %s rel L2 %.3g (%s)\n", cases[c][0], cases[c][1],
                       (const char *[]){"out", "dq", "dk", "dv"}[t], e, attn_ctx_last_explain(ctx));
        }
    }
}

int main(void) {
    attn_ctx *ctx;
    attn_rng *rng;
    if (attn_ctx_new(NULL, &ctx) != ATTN_OK || attn_rng_new(ctx, 1, &rng) != ATTN_OK) return 1;
    test_rows_that_see_no_key(ctx);
    test_overflowing_intermediates(ctx, rng);
    test_renormalize_without_underflow(ctx, rng);
    test_scale_rounding_to_zero(ctx);
    test_scan_finds_every_nan();
    test_far_key_huge_value(ctx);
    attn_rng_free(rng);
    attn_ctx_free(ctx);
    return check_summary();
}
