/*
 * test_backward.c — every module's backward against central finite
 * differences, and the backward's errors as values.
 *
 * The loss is L = sum(y * dy) accumulated in double, so dL/dx = backward(dy).
 * For a sample of coordinates of x and of every parameter, the analytic
 * gradient must match (L(v + h) - L(v - h)) / (2h), h = 1e-2 (the float
 * step actually taken), within 1% of the gradient's scale plus what the
 * difference cannot resolve: L is a float32 forward, rounded to a few ulps
 * of sum |y * dy|, and that rounding divided by 2h is the difference's
 * noise (the key bias's gradient is analytically zero, and a difference of
 * 2e-5 there was that noise, not a wrong gradient). Dropout modules
 * run in training mode with the rng reseeded before every forward, so each
 * evaluation draws the same mask. Fresh random inputs each run (the seed is
 * printed; pass it as argv[1] to replay).
 */
#include "attn.h"
#include "check.h"

#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { B = 2, T = 5, D_IN = 6, HEADS = 2, SAMPLES = 12 };

typedef struct fd_case {
    const char *label;
    attn_module *m;
    attn_rng *rng; /* NULL: no dropout draws */
    uint64_t dropout_seed;
} fd_case;

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double uniform(uint64_t *s) { return (double)(splitmix(s) >> 11) / 9007199254740992.0; }

/* L = sum(module(x) * dy) in double. */
static double loss(fd_case *c, const float *x, const float *dy, float *y) {
    if (c->rng) attn_rng_manual_seed(c->rng, c->dropout_seed);
    if (attn_module_forward(c->m, x, B, T, y, c->rng) != ATTN_OK) return NAN;
    size_t n = (size_t)B * T * attn_module_d_out(c->m);
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += (double)y[i] * dy[i];
    return sum;
}

static double rms(const float *v, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)v[i] * v[i];
    return sqrt(s / (double)(n ? n : 1));
}

/* Central difference of the loss in coordinate *v, restoring it. */
static double central_difference(fd_case *c, float *v, const float *x, const float *dy, float *y) {
    float saved = *v;
    float up = saved + 1e-2f, down = saved - 1e-2f;
    *v = up;
    double l_up = loss(c, x, dy, y);
    *v = down;
    double l_down = loss(c, x, dy, y);
    *v = saved;
    return (l_up - l_down) / ((double)up - (double)down);
}

static void check_tensor(fd_case *c, const char *name, float *values, const float *grads, size_t n,
                         const float *x, const float *dy, float *y, double fd_noise,
                         uint64_t *seed) {
    double scale = rms(grads, n) + 1e-3;
    int bad = 0;
    for (int s = 0; s < SAMPLES && s < (int)n; s++) {
        size_t i = (size_t)(uniform(seed) * (double)n) % n;
        double fd = central_difference(c, &values[i], x, dy, y);
        if (!(fabs(fd - grads[i]) <= 1e-2 * scale + 1e-2 * fabs(grads[i]) + fd_noise)) {
            if (bad++ < 3)
                fprintf(stderr, "%s %s[%zu]: backward %.7g, finite difference %.7g\n", c->label,
                        name, i, (double)grads[i], fd);
        }
    }
    CHECK(bad == 0);
}

static void finite_differences(fd_case *c, uint64_t *seed) {
    size_t d_in = attn_module_d_in(c->m), d_out = attn_module_d_out(c->m);
    size_t nx = (size_t)B * T * d_in, ny = (size_t)B * T * d_out;
    float *x = malloc(nx * sizeof *x), *dx = malloc(nx * sizeof *dx);
    float *y = malloc(ny * sizeof *y), *dy = malloc(ny * sizeof *dy);
    for (size_t i = 0; i < nx; i++) x[i] = (float)(2.0 * uniform(seed) - 1.0);
    for (size_t i = 0; i < ny; i++) dy[i] = (float)(2.0 * uniform(seed) - 1.0);

    CHECK(!isnan(loss(c, x, dy, y)));
    double magnitude = 0.0; /* sum |y * dy|: the scale of L's rounding */
    for (size_t i = 0; i < ny; i++) magnitude += fabs((double)y[i] * dy[i]);
    double fd_noise = 2.0 * FLT_EPSILON * magnitude / 2e-2;
    CHECK_STATUS(attn_module_zero_grad(c->m), ATTN_OK);
    CHECK_STATUS(attn_module_backward(c->m, dy, B, T, dx), ATTN_OK);
    check_tensor(c, "input", x, dx, nx, x, dy, y, fd_noise, seed);
    for (size_t p = 0; p < attn_module_param_count(c->m); p++) {
        attn_param param;
        attn_module_param_at(c->m, p, &param);
        check_tensor(c, param.name, param.data, param.grad, param.numel, x, dy, y, fd_noise, seed);
    }
    free(x);
    free(dx);
    free(y);
    free(dy);
}

static void fd_all_modules(attn_ctx *ctx, uint64_t *seed) {
    attn_rng *init, *drop;
    attn_rng_new(ctx, splitmix(seed), &init);
    attn_rng_new(ctx, 0, &drop);
    const attn_mask_method masks[] = {ATTN_MASK_NEG_INF, ATTN_MASK_RENORMALIZE, ATTN_MASK_NONE};
    const char *mask_names[] = {"neg-inf", "renormalize", "none"};

    attn_simple *simple;
    attn_simple_new(ctx, &(attn_simple_config){.d_in = D_IN}, &simple);
    finite_differences(&(fd_case){"simple", attn_simple_module(simple), NULL, 0}, seed);
    attn_simple_free(simple);

    attn_sa_v1 *sa1;
    attn_sa_v1_new(ctx, &(attn_sa_v1_config){.d_in = D_IN, .d_out = 4, .scale = 0.3f}, init, &sa1);
    finite_differences(&(fd_case){"sa_v1", attn_sa_v1_module(sa1), NULL, 0}, seed);
    attn_sa_v1_free(sa1);

    attn_sa_v2 *sa2;
    attn_sa_v2_new(ctx, &(attn_sa_v2_config){.d_in = D_IN, .d_out = 4, .qkv_bias = true}, init, &sa2);
    finite_differences(&(fd_case){"sa_v2", attn_sa_v2_module(sa2), NULL, 0}, seed);
    attn_sa_v2_free(sa2);

    for (int k = 0; k < 3; k++) {
        char label[64];
        attn_causal *causal;
        attn_causal_config cc = {.d_in = D_IN, .d_out = 4, .context_length = T + 2,
                                 .dropout = 0.3, .qkv_bias = k != 1, .mask = masks[k]};
        attn_causal_new(ctx, &cc, init, &causal);
        snprintf(label, sizeof label, "causal[%s, dropout]", mask_names[k]);
        finite_differences(&(fd_case){label, attn_causal_module(causal), drop, splitmix(seed)}, seed);
        attn_causal_free(causal);

        attn_mha_wrapper *wrapper;
        attn_mha_wrapper_config wc = {.d_in = D_IN, .d_out = 3, .context_length = T,
                                      .num_heads = HEADS, .dropout = 0.2, .qkv_bias = true,
                                      .mask = masks[k]};
        attn_mha_wrapper_new(ctx, &wc, init, &wrapper);
        snprintf(label, sizeof label, "mha_wrapper[%s, dropout]", mask_names[k]);
        finite_differences(&(fd_case){label, attn_mha_wrapper_module(wrapper), drop, splitmix(seed)},
                           seed);
        attn_mha_wrapper_free(wrapper);

        attn_mha *mha;
        attn_mha_config mc = {.d_in = D_IN, .d_out = 4, .context_length = T, .num_heads = HEADS,
                              .dropout = k == 2 ? 0.0 : 0.25, .qkv_bias = k == 0, .mask = masks[k]};
        attn_mha_new(ctx, &mc, init, &mha);
        snprintf(label, sizeof label, "mha[%s]", mask_names[k]);
        finite_differences(&(fd_case){label, attn_mha_module(mha), drop, splitmix(seed)}, seed);
        attn_mha_free(mha);
    }

    /* dropout p = 1 under every Bernoulli method: every weight dropped, so
     * the attention's gradients are zero (the Philox method's backward ran
     * as if nothing were dropped) */
    for (int method = 0; method < 3; method++) {
        attn_rng *all;
        attn_rng_new(ctx, 0, &all);
        CHECK_STATUS(attn_rng_set_bernoulli_method(all, (attn_bernoulli_method)method), ATTN_OK);
        char label[64];
        attn_causal *causal;
        attn_causal_config cc = {.d_in = D_IN, .d_out = 4, .context_length = T,
                                 .dropout = 1.0, .qkv_bias = true, .mask = masks[method]};
        attn_causal_new(ctx, &cc, init, &causal);
        snprintf(label, sizeof label, "causal[dropout 1, bernoulli %d]", method);
        finite_differences(&(fd_case){label, attn_causal_module(causal), all, splitmix(seed)},
                           seed);
        attn_causal_free(causal);
        attn_mha *mha;
        attn_mha_config mc = {.d_in = D_IN, .d_out = 4, .context_length = T, .num_heads = HEADS,
                              .dropout = 1.0, .qkv_bias = true, .mask = masks[method]};
        attn_mha_new(ctx, &mc, init, &mha);
        snprintf(label, sizeof label, "mha[dropout 1, bernoulli %d]", method);
        finite_differences(&(fd_case){label, attn_mha_module(mha), all, splitmix(seed)}, seed);
        attn_mha_free(mha);
        attn_rng_free(all);
    }

    attn_gpt2 *gpt2;
    attn_gpt2_new(ctx, &(attn_gpt2_config){.n_embd = D_IN, .n_head = HEADS, .block_size = T,
                                           .dropout = 0.2},
                  init, &gpt2);
    finite_differences(&(fd_case){"gpt2[dropout]", attn_gpt2_module(gpt2), drop, splitmix(seed)}, seed);
    attn_module_set_training(attn_gpt2_module(gpt2), false);
    finite_differences(&(fd_case){"gpt2[eval]", attn_gpt2_module(gpt2), NULL, 0}, seed);
    attn_gpt2_free(gpt2);

    attn_rng_free(init);
    attn_rng_free(drop);
}

/* The backward's failures: statuses and messages that name the values. */
static void errors(attn_ctx *ctx) {
    attn_rng *rng;
    attn_rng_new(ctx, 7, &rng);
    attn_mha *mha;
    attn_mha_config cfg = {.d_in = 4, .d_out = 4, .context_length = 8, .num_heads = 2};
    CHECK_STATUS(attn_mha_new(ctx, &cfg, rng, &mha), ATTN_OK);
    attn_module *m = attn_mha_module(mha);
    float x[2 * 3 * 4], y[2 * 3 * 4], dy[2 * 3 * 4], dx[2 * 3 * 4];
    for (int i = 0; i < 24; i++) x[i] = dy[i] = (float)(i % 7) * 0.25f - 0.5f;

    CHECK_STATUS(attn_module_backward(NULL, dy, 2, 3, dx), ATTN_ERR_NULL);
    CHECK_STATUS(attn_mha_backward(NULL, dy, 2, 3, dx), ATTN_ERR_NULL);
    CHECK_STATUS(attn_module_backward(m, dy, 2, 3, dx), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "no forward to differentiate");

    CHECK_STATUS(attn_module_forward(m, x, 2, 3, y, NULL), ATTN_OK);
    CHECK_STATUS(attn_module_backward(m, NULL, 2, 3, dx), ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "dy is NULL");
    CHECK_STATUS(attn_module_backward(m, dy, 3, 2, dx), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "dy is (3, 2, 4) but the forward's output was (2, 3, 4)");
    CHECK_STATUS(attn_module_backward(m, dy, 2, 4, dx), ATTN_ERR_SHAPE);

    /* dx NULL: parameter gradients only */
    attn_param w;
    attn_module_param(m, "out_proj.weight", &w);
    CHECK_STATUS(attn_module_zero_grad(m), ATTN_OK);
    CHECK_STATUS(attn_module_backward(m, dy, 2, 3, NULL), ATTN_OK);
    double norm = 0.0;
    for (size_t i = 0; i < w.numel; i++) norm += fabs(w.grad[i]);
    CHECK(norm > 0.0);

    /* a failed forward forgets the last one: no stale backward */
    CHECK_STATUS(attn_module_forward(m, x, 2, 9, y, NULL), ATTN_ERR_SHAPE);
    CHECK_STATUS(attn_module_forward(m, x, 2, 3, y, NULL), ATTN_OK);
    CHECK_STATUS(attn_module_backward(m, dy, 2, 3, dx), ATTN_OK);

    /* an optimizer step between a forward and its backward: refused, as
     * PyTorch's version counter refuses it, naming the parameter and the
     * versions, and nothing written */
    size_t count = attn_module_param_count(m);
    attn_param params[8];
    for (size_t i = 0; i < count && i < 8; i++) attn_module_param_at(m, i, &params[i]);
    attn_optimizer_config sgd = attn_optimizer_defaults(ATTN_OPTIMIZER_SGD);
    sgd.lr = 0.1;
    attn_optimizer *opt = NULL;
    CHECK_STATUS(attn_optimizer_new(ctx, &sgd, params, count, &opt), ATTN_OK);
    CHECK_STATUS(attn_module_forward(m, x, 2, 3, y, NULL), ATTN_OK);
    CHECK_STATUS(attn_optimizer_step(opt), ATTN_OK);
    float grad_before = w.grad[1], dx_before = dx[2];
    CHECK_STATUS(attn_module_backward(m, dy, 2, 3, dx), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "MultiHeadAttention backward: parameter W_query.weight was modified after "
                       "the forward (version 0 at the forward, 1 now)");
    CHECK(w.grad[1] == grad_before && dx[2] == dx_before);
    /* a new forward reads the new weights: its backward runs */
    CHECK_STATUS(attn_module_forward(m, x, 2, 3, y, NULL), ATTN_OK);
    CHECK_STATUS(attn_module_backward(m, dy, 2, 3, dx), ATTN_OK);
    /* a write through the data pointer counts too; one put back does not */
    CHECK_STATUS(attn_module_forward(m, x, 2, 3, y, NULL), ATTN_OK);
    float kept = w.data[3];
    w.data[3] = kept + 1.0f;
    CHECK_STATUS(attn_module_backward(m, dy, 2, 3, dx), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "parameter out_proj.weight was modified after the forward (version 1 at "
                       "the forward, 2 now)");
    w.data[3] = kept; /* the forward's weights again, at a later version */
    CHECK_STATUS(attn_module_backward(m, dy, 2, 3, dx), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "(version 1 at the forward, 3 now)");
    CHECK_STATUS(attn_module_forward(m, x, 2, 3, y, NULL), ATTN_OK);
    w.data[3] = kept + 1.0f;
    w.data[3] = kept;
    CHECK_STATUS(attn_module_backward(m, dy, 2, 3, dx), ATTN_OK);
    attn_optimizer_free(opt);

    /* gradients disabled: forward keeps nothing, backward refuses */
    CHECK(attn_module_grad_enabled(m));
    CHECK_STATUS(attn_module_set_grad_enabled(m, false), ATTN_OK);
    CHECK(!attn_module_grad_enabled(m));
    CHECK_STATUS(attn_module_forward(m, x, 2, 3, y, NULL), ATTN_OK);
    CHECK_STATUS(attn_module_backward(m, dy, 2, 3, dx), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "gradients enabled");
    CHECK_STATUS(attn_module_set_grad_enabled(NULL, true), ATTN_ERR_NULL);
    CHECK_STATUS(attn_module_zero_grad(NULL), ATTN_ERR_NULL);
    attn_mha_free(mha);
    attn_rng_free(rng);
}

static void ignore_trace(void *user, const char *module, const char *name, size_t ndim,
                         const size_t *shape, const float *data) {
    (void)user, (void)module, (void)name, (void)ndim, (void)shape, (void)data;
}

/* A traced forward runs on the reference kernels (scores in double); its
 * backward must not take the fused kernels' scores against the
 * reference's lse (dx was off by 1e-2 at x ~ 3e3, by 1e26 at 3e4), nor
 * their own lse pass, which on AVX-512 rounds unlike the fused forward
 * (dx 1e-4 from the untraced pass at x ~ 100): it runs on the reference
 * kernels too. Fresh inputs; dx against the reference ctx's, within 1e-5
 * of the largest. x (4 bits times a power of 2) and the weights (multiples
 * of 1/64) lie on a grid where every projection is exact in any summation
 * order, so the traced pass's attention sees the reference ctx's q, k and
 * v bit for bit: off the grid, the GEMMs' rounding alone moves nearly tied
 * rows of scores near 1e5 by 1e-2 of dx, whatever the backward does. The
 * fused pass's distance from the reference is printed beside. */
static void traced_forward_fused_backward(uint64_t *seed) {
    enum { TT = 16, CC = 16 };
    float x[TT * CC], dy[TT * CC], y[TT * CC], dx[3][TT * CC];
    double s = ldexp(1.0, 4 + (int)(10.0 * uniform(seed))); /* 8 s: 1e2 .. 1e5 */
    for (int i = 0; i < TT * CC; i++) x[i] = (float)(s * (floor(17.0 * uniform(seed)) - 8.0));
    for (int i = 0; i < TT * CC; i++) dy[i] = (float)(2.0 * uniform(seed) - 1.0);
    uint64_t init = splitmix(seed);
    for (int run = 0; run < 3; run++) { /* the reference; fused; traced, then fused */
        attn_ctx_config cc = {.num_threads = 2,
                              .kernels = run ? ATTN_KERNELS_AUTO : ATTN_KERNELS_REFERENCE,
                              .trace = run == 2 ? ignore_trace : NULL};
        attn_ctx *ctx;
        CHECK_STATUS(attn_ctx_new(&cc, &ctx), ATTN_OK);
        attn_rng *rng;
        attn_rng_new(ctx, init, &rng);
        attn_mha *mha;
        attn_mha_config mc = {.d_in = CC, .d_out = CC, .context_length = TT, .num_heads = 2};
        CHECK_STATUS(attn_mha_new(ctx, &mc, rng, &mha), ATTN_OK);
        attn_module *m = attn_mha_module(mha);
        for (size_t p = 0; p < attn_module_param_count(m); p++) {
            attn_param w;
            CHECK_STATUS(attn_module_param_at(m, p, &w), ATTN_OK);
            for (size_t i = 0; i < w.numel; i++) w.data[i] = roundf(w.data[i] * 64.0f) / 64.0f;
        }
        CHECK_STATUS(attn_module_forward(m, x, 1, TT, y, NULL), ATTN_OK);
        CHECK_STATUS(attn_module_backward(m, dy, 1, TT, dx[run]), ATTN_OK);
        attn_mha_free(mha);
        attn_rng_free(rng);
        attn_ctx_free(ctx);
    }
    double traced = 0.0, fused = 0.0, top = 0.0;
    for (int i = 0; i < TT * CC; i++) {
        traced = check_worse(traced, fabs((double)dx[2][i] - dx[0][i]));
        fused = check_worse(fused, fabs((double)dx[1][i] - dx[0][i]));
        top = fmax(top, fabs((double)dx[1][i]));
    }
    CHECK(traced <= 1e-5 * top);
    printf("  traced forward (reference) + its backward, |x| <= %.3g: dx within %.2g of the "
           "reference ctx's (the fused pass within %.2g of it)\n", 8 * s, traced / top,
           fused / top);
}

/* An integer in [-16, 16] times 2^p. */
static float on_grid(int p, uint64_t *seed) {
    return (float)ldexp(floor(33.0 * uniform(seed)) - 16.0, p);
}

static double relative_l2(const float *got, const float *want, size_t n) {
    double err = 0.0, norm = 0.0;
    for (size_t i = 0; i < n; i++) {
        err += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        norm += (double)want[i] * want[i];
    }
    return sqrt(err / norm);
}

/* attn_sdpa_backward given a forward's lse alone (the public calls keep no
 * lse_lo): past |lse| 64 the fused backward takes its own, so that a
 * weight recomputed against it is not off by |lse| 2^-24 in its exponent
 * (dv was 3e-5 off at q, k ~ 30, 5e-2 at 1e3, 5e24 at 3e4, for a head_dim
 * whose scale is not a power of 2). Fresh inputs; dv against the reference
 * ctx's, whose scores are summed in double. q and k are integers up to 16
 * times 2^p: their dot products are exact in float32 and distinct ones lie
 * at least 2^2p apart, so no two keys nearly tie, where any float32
 * rounding of a score moves dv by more than the bound checked. */
static void public_lse_alone(uint64_t *seed) {
    enum { NB = 1, NH = 2, NT = 7, NS = 13 };
    const size_t dims[] = {65, 96};
    const int pows[] = {4, 6, 11}; /* q, k ~ 2.6e2, 1e3, 3.3e4 */
    for (size_t id = 0; id < 2; id++)
        for (size_t ia = 0; ia < 3; ia++) {
            size_t D = dims[id], nq = (size_t)NB * NH * NT * D, nk = (size_t)NB * NH * NS * D;
            float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4),
                  *dout = malloc(nq * 4), *out = malloc(nq * 4), *dq = malloc(nq * 4),
                  *dk = malloc(nk * 4),
                  *dv[2] = {malloc(nk * 4), malloc(nk * 4)};
            float lse[NB * NH * NT];
            for (size_t i = 0; i < nq; i++) q[i] = on_grid(pows[ia], seed);
            for (size_t i = 0; i < nk; i++) k[i] = on_grid(pows[ia], seed);
            for (size_t i = 0; i < nk; i++) v[i] = (float)(2.0 * uniform(seed) - 1.0);
            for (size_t i = 0; i < nq; i++) dout[i] = (float)(2.0 * uniform(seed) - 1.0);
            attn_sdpa_config cfg = {.batch = NB, .heads = NH, .q_tokens = NT, .kv_tokens = NS,
                                    .head_dim = D};
            for (int run = 0; run < 2; run++) { /* the reference; the default kernels */
                attn_ctx *ctx;
                attn_ctx_config cc = {.num_threads = 2,
                                      .kernels = run ? ATTN_KERNELS_AUTO : ATTN_KERNELS_REFERENCE};
                CHECK_STATUS(attn_ctx_new(&cc, &ctx), ATTN_OK);
                CHECK_STATUS(attn_sdpa_forward(ctx, &cfg, q, k, v, out, lse, NULL, NULL), ATTN_OK);
                CHECK_STATUS(attn_sdpa_backward(ctx, &cfg, q, k, v, out, lse, dout, dq, dk, dv[run],
                                                NULL),
                             ATTN_OK);
                attn_ctx_free(ctx);
            }
            double rel = relative_l2(dv[1], dv[0], nk);
            if (!(rel <= 1e-5))
                printf("FAIL public backward, lse alone: D %zu, q, k ~ 2^%d 16: dv %.3g off\n", D,
                       pows[ia], rel);
            CHECK(rel <= 1e-5);
            free(q), free(k), free(v), free(dout), free(out), free(dq), free(dk), free(dv[0]),
                free(dv[1]);
        }
}

/* The gradients of L = sum(dout * out) + sum(dlse * lse) in double, for
 * causal attention of (TT, H, D) tensors with GQA and per-head sinks:
 * dS_ij = P_ij (dP_ij - delta_i + dlse_i), the sink's weight in P's
 * denominator and dsinks_h = -sum_i P_sink (delta_i - dlse_i). */
static void dlse_oracle(const float *q, const float *k, const float *v, const float *dout,
                        const float *dlse, const float *sinks, size_t TT, size_t H, size_t KH,
                        size_t D, double scale, double *dq, double *dk, double *dv,
                        double *dsinks) {
    double P[64], dP[64];
    size_t G = H / KH;
    memset(dq, 0, TT * H * D * sizeof *dq), memset(dk, 0, TT * KH * D * sizeof *dk);
    memset(dv, 0, TT * KH * D * sizeof *dv), memset(dsinks, 0, H * sizeof *dsinks);
    for (size_t h = 0; h < H; h++)
        for (size_t i = 0; i < TT; i++) {
            const float *qi = q + (i * H + h) * D, *doi = dout + (i * H + h) * D;
            double top = sinks[h], sum = 0.0, delta = 0.0;
            for (size_t j = 0; j <= i; j++) {
                const float *kj = k + (j * KH + h / G) * D;
                double s = 0.0;
                for (size_t c = 0; c < D; c++) s += (double)qi[c] * kj[c];
                P[j] = s * scale;
                top = fmax(top, P[j]);
            }
            for (size_t j = 0; j <= i; j++) sum += (P[j] = exp(P[j] - top));
            double sink = exp(sinks[h] - top) / (sum + exp(sinks[h] - top));
            for (size_t j = 0; j <= i; j++) {
                P[j] /= sum + exp(sinks[h] - top);
                const float *vj = v + (j * KH + h / G) * D;
                dP[j] = 0.0;
                for (size_t c = 0; c < D; c++) dP[j] += (double)doi[c] * vj[c];
                delta += P[j] * dP[j];
            }
            double g = dlse[h * TT + i];
            dsinks[h] -= sink * (delta - g);
            for (size_t j = 0; j <= i; j++) {
                double dS = P[j] * (dP[j] - delta + g) * scale;
                const float *kj = k + (j * KH + h / G) * D;
                for (size_t c = 0; c < D; c++) {
                    dq[(i * H + h) * D + c] += dS * kj[c];
                    dk[(j * KH + h / G) * D + c] += dS * qi[c];
                    dv[(j * KH + h / G) * D + c] += P[j] * doi[c];
                }
            }
        }
}

/* bf16 of each float, rounded to nearest even (finite inputs). */
static void to_bf16(const float *x, uint16_t *out, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &x[i], 4);
        out[i] = (uint16_t)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
    }
}

static double rel_l2_double(const float *got, const double *want, size_t n) {
    double err = 0.0, norm = 0.0;
    for (size_t i = 0; i < n; i++) {
        err += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        norm += want[i] * want[i];
    }
    return sqrt(err / norm);
}

/* attn_sdpa_backward_dlse against the oracle above on every kernel set,
 * in float, float64 and bf16 storage; and its refusals. Fresh inputs. */
static void backward_with_dlse(uint64_t *seed) {
    enum { NT = 37, H = 4, KH = 2, D = 24 };
    size_t nq = NT * H * D, nk = NT * KH * D;
    float q[NT * H * D], k[NT * KH * D], v[NT * KH * D], dout[NT * H * D], dlse[H * NT], sinks[H];
    float out[NT * H * D], lse[H * NT], dq[NT * H * D], dk[NT * KH * D], dv[NT * KH * D], dsinks[H];
    double wq[NT * H * D], wk[NT * KH * D], wv[NT * KH * D], wsinks[H];
    for (size_t i = 0; i < nq; i++) q[i] = (float)(2.0 * uniform(seed) - 1.0);
    for (size_t i = 0; i < nk; i++) k[i] = (float)(2.0 * uniform(seed) - 1.0);
    for (size_t i = 0; i < nk; i++) v[i] = (float)(2.0 * uniform(seed) - 1.0);
    for (size_t i = 0; i < nq; i++) dout[i] = (float)(2.0 * uniform(seed) - 1.0);
    for (size_t i = 0; i < H * NT; i++) dlse[i] = (float)(2.0 * uniform(seed) - 1.0);
    for (size_t h = 0; h < H; h++) sinks[h] = (float)(2.0 * uniform(seed) - 1.0);
    /* the float calls round the scale to float, the float64 ones do not */
    dlse_oracle(q, k, v, dout, dlse, sinks, NT, H, KH, D, (double)(float)(1.0 / sqrt(D)), wq,
                wk, wv, wsinks);
    attn_sdpa_config cfg = {.batch = 1, .heads = H, .kv_heads = KH, .q_tokens = NT,
                            .kv_tokens = NT, .head_dim = D, .causal = true, .sinks = sinks,
                            .sinks_grad = dsinks};
    const attn_kernels sets[] = {ATTN_KERNELS_REFERENCE, ATTN_KERNELS_AUTO, ATTN_KERNELS_AUTO};
    for (int run = 0; run < 3; run++) {
        attn_ctx *ctx;
        attn_ctx_config cc = {.num_threads = 2, .kernels = sets[run]};
        CHECK_STATUS(attn_ctx_new(&cc, &ctx), ATTN_OK);
        attn_mask *causal = NULL;
        attn_block_mask *map = NULL;
        if (run == 2) { /* causal as a mask's block map (row intervals) */
            attn_block_mask_config mc = {.batch = 1, .heads = 1, .q_len = NT, .kv_len = NT,
                                         .block_q = 16, .block_kv = 16};
            CHECK_STATUS(attn_mask_new_causal(ctx, 0, &causal), ATTN_OK);
            CHECK_STATUS(attn_block_mask_from_mask(ctx, &mc, causal, &map), ATTN_OK);
            cfg.causal = false, cfg.block_mask = map;
            /* and no sinks: a row that sees one key still has dS = dlse */
            cfg.sinks = NULL, cfg.sinks_grad = NULL;
            for (size_t h = 0; h < H; h++) sinks[h] = -INFINITY;
            dlse_oracle(q, k, v, dout, dlse, sinks, NT, H, KH, D, (double)(float)(1.0 / sqrt(D)),
                        wq, wk, wv, wsinks);
        }
        CHECK_STATUS(attn_sdpa_forward(ctx, &cfg, q, k, v, out, lse, NULL, NULL), ATTN_OK);
        CHECK_STATUS(attn_sdpa_backward_dlse(ctx, &cfg, ATTN_DTYPE_F32, q, k, v, out, lse, dout,
                                             dlse, dq, dk, dv, NULL),
                     ATTN_OK);
        double e[4] = {rel_l2_double(dq, wq, nq), rel_l2_double(dk, wk, nk),
                       rel_l2_double(dv, wv, nk), rel_l2_double(dsinks, wsinks, H)};
        for (int t = 0; t < (cfg.sinks ? 4 : 3); t++) CHECK(e[t] <= 1e-5);
        printf("  backward with dlse (%s kernels%s): dq, dk, dv, dsinks %.2g %.2g %.2g %.2g "
               "from float64\n", run ? "default" : "reference",
               run == 2 ? ", a block map, no sinks" : "", e[0], e[1], e[2], cfg.sinks ? e[3] : 0.0);
        if (run == 0) { /* float64: the oracle's own sums */
            double q64[NT * H * D], k64[NT * KH * D], v64[NT * KH * D], do64[NT * H * D];
            double o64[NT * H * D], l64[H * NT], g64[H * NT], dq64[NT * H * D], dk64[NT * KH * D],
                dv64[NT * KH * D];
            for (size_t i = 0; i < nq; i++) q64[i] = q[i], do64[i] = dout[i];
            for (size_t i = 0; i < nk; i++) k64[i] = k[i], v64[i] = v[i];
            for (size_t i = 0; i < H * NT; i++) g64[i] = dlse[i];
            CHECK_STATUS(attn_sdpa_forward_f64(ctx, &cfg, q64, k64, v64, o64, l64, NULL, NULL),
                         ATTN_OK);
            CHECK_STATUS(attn_sdpa_backward_dlse(ctx, &cfg, ATTN_DTYPE_F64, q64, k64, v64, o64,
                                                 l64, do64, g64, dq64, dk64, dv64, NULL),
                         ATTN_OK);
            double xq[NT * H * D], xk[NT * KH * D], xv[NT * KH * D], xs[H], worst = 0.0;
            dlse_oracle(q, k, v, dout, dlse, sinks, NT, H, KH, D, 1.0 / sqrt((double)D), xq, xk,
                        xv, xs);
            for (size_t i = 0; i < nq; i++) worst = check_worse(worst, fabs(dq64[i] - xq[i]));
            for (size_t i = 0; i < nk; i++)
                worst = check_worse(worst, fmax(fabs(dk64[i] - xk[i]), fabs(dv64[i] - xv[i])));
            CHECK(worst <= 1e-12);
            /* refusals: NULL dlse, dlse under an output, another dtype */
            CHECK_STATUS(attn_sdpa_backward_dlse(ctx, &cfg, ATTN_DTYPE_F32, q, k, v, out, lse,
                                                 dout, NULL, dq, dk, dv, NULL),
                         ATTN_ERR_NULL);
            CHECK_MESSAGE(ctx, "attn_sdpa_backward_dlse: dlse is NULL");
            CHECK_STATUS(attn_sdpa_backward_dlse(ctx, &cfg, ATTN_DTYPE_F32, q, k, v, out, lse,
                                                 dout, dq + 5, dq, dk, dv, NULL),
                         ATTN_ERR_INVALID);
            CHECK_MESSAGE(ctx, "overlaps dlse [");
            CHECK_STATUS(attn_sdpa_backward_dlse(ctx, &cfg, ATTN_DTYPE_I8, q, k, v, out, lse,
                                                 dout, dlse, dq, dk, dv, NULL),
                         ATTN_ERR_INVALID);
            CHECK_MESSAGE(ctx, "dtype (I8");
        } else if (run == 1) { /* bf16 storage: widened to float, within bf16's rounding */
            uint16_t q16[NT * H * D], k16[NT * KH * D], v16[NT * KH * D], do16[NT * H * D],
                o16[NT * H * D], dq16[NT * H * D], dk16[NT * KH * D], dv16[NT * KH * D];
            to_bf16(q, q16, nq), to_bf16(dout, do16, nq), to_bf16(k, k16, nk), to_bf16(v, v16, nk);
            CHECK_STATUS(attn_sdpa_forward_16(ctx, &cfg, ATTN_DTYPE_BF16, q16, k16, v16, o16, lse,
                                              NULL, NULL),
                         ATTN_OK);
            CHECK_STATUS(attn_sdpa_backward_dlse(ctx, &cfg, ATTN_DTYPE_BF16, q16, k16, v16, o16,
                                                 lse, do16, dlse, dq16, dk16, dv16, NULL),
                         ATTN_OK);
            for (size_t i = 0; i < nq; i++) {
                uint32_t bits = (uint32_t)dq16[i] << 16;
                memcpy(&dq[i], &bits, 4);
            }
            CHECK(rel_l2_double(dq, wq, nq) <= 3e-2);
        }
        attn_block_mask_free(map);
        attn_mask_free(causal);
        attn_ctx_free(ctx);
    }
}

/* A row that sees no key (bottom-right, T > S: query 0 sits before key
 * 0) holds the sink alone, weight 1, lse = sink: dL/dsink = dlse_0 there,
 * on every kernel set and in float64 (the reference gave 0 for such rows). */
static void sink_alone_with_dlse(uint64_t *seed) {
    const attn_kernels sets[] = {ATTN_KERNELS_REFERENCE, ATTN_KERNELS_AUTO};
    double g = 2.0 * uniform(seed) - 1.0;
    for (size_t s = 0; s < 2; s++) {
        attn_ctx *ctx;
        attn_ctx_new(&(attn_ctx_config){.num_threads = 1, .kernels = sets[s]}, &ctx);
        float q[2] = {0.5f, -0.25f}, k[1] = {0.75f}, v[1] = {2.0f}, out[2], lse[2];
        float dout[2] = {0, 0}, dlse[2] = {(float)g, 0}, dq[2], dk[1], dv[1];
        float sinks[1] = {0.0f}, ds[1] = {-99}, ds64[1] = {-99};
        attn_sdpa_config c = {.batch = 1, .heads = 1, .q_tokens = 2, .kv_tokens = 1,
                              .head_dim = 1, .causal = true, .sinks = sinks, .sinks_grad = ds};
        CHECK_STATUS(attn_sdpa_forward(ctx, &c, q, k, v, out, lse, NULL, NULL), ATTN_OK);
        CHECK_STATUS(attn_sdpa_backward_dlse(ctx, &c, ATTN_DTYPE_F32, q, k, v, out, lse, dout,
                                             dlse, dq, dk, dv, NULL),
                     ATTN_OK);
        double q64[2] = {0.5, -0.25}, k64[1] = {0.75}, v64[1] = {2.0}, o64[2], l64[2];
        double do64[2] = {0, 0}, dl64[2] = {g, 0}, dq64[2], dk64[1], dv64[1];
        c.sinks_grad = ds64;
        CHECK_STATUS(attn_sdpa_forward_f64(ctx, &c, q64, k64, v64, o64, l64, NULL, NULL),
                     ATTN_OK);
        CHECK_STATUS(attn_sdpa_backward_dlse(ctx, &c, ATTN_DTYPE_F64, q64, k64, v64, o64, l64,
                                             do64, dl64, dq64, dk64, dv64, NULL),
                     ATTN_OK);
        CHECK_NEAR(ds[0], (float)g, 1e-6);
        CHECK_NEAR(ds64[0], (float)g, 1e-6);
        attn_ctx_free(ctx);
    }
}

int main(int argc, char **argv) {
    struct timespec now;
    timespec_get(&now, TIME_UTC);
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10)
                             : (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
    printf("seed %llu\n", (unsigned long long)seed);
    attn_ctx *ctx;
    attn_ctx_new(&(attn_ctx_config){.num_threads = 2}, &ctx);
    fd_all_modules(ctx, &seed);
    errors(ctx);
    for (int i = 0; i < 4; i++) traced_forward_fused_backward(&seed);
    public_lse_alone(&seed);
    backward_with_dlse(&seed);
    sink_alone_with_dlse(&seed);
    attn_ctx_free(ctx);
    return check_summary();
}
