/*
 * test_train.c — the training API's contracts in C: the tasks' layouts,
 * and every error as a value (bad configs, mismatched shapes, wrong
 * parameter counts, calls out of order), each with a message that names the
 * values at fault.
 */
#include "attn.h"
#include "check.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- tasks ------------------------------------------------------------------ */

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The copy-like layouts: x (n tokens), 0, f(x); answers exactly f(x). */
static void check_copy_like(attn_ctx *ctx, attn_task_kind kind, size_t V, size_t T) {
    enum { B = 6 };
    int32_t tokens[B * 40], targets[B * 40];
    attn_rng *rng;
    attn_rng_new(ctx, 7, &rng);
    size_t answers = 0;
    CHECK_STATUS(attn_task_batch(ctx, kind, V, T, rng, B, tokens, targets, &answers), ATTN_OK);
    size_t n = T / 2;
    CHECK(answers == B * n);
    for (size_t b = 0; b < B; b++) {
        const int32_t *s = tokens + b * T, *y = targets + b * T;
        int32_t want[40];
        for (size_t i = 0; i < n; i++) {
            CHECK(s[i] >= 1 && (size_t)s[i] < V);
            want[i] = kind == ATTN_TASK_REVERSE ? s[n - 1 - i] : s[i];
        }
        if (kind == ATTN_TASK_SORT) qsort(want, n, sizeof *want, cmp_i32);
        CHECK(s[n] == 0);
        for (size_t t = 0; t < T; t++) {
            bool answer = t >= n && t < 2 * n;
            CHECK(answer ? y[t] == want[t - n] : y[t] == ATTN_IGNORE_INDEX);
            /* the next input is the target: teacher forcing */
            if (answer && t + 1 < T) CHECK(s[t + 1] == y[t]);
        }
    }
    attn_rng_free(rng);
}

static void test_tasks(attn_ctx *ctx) {
    for (attn_task_kind k = ATTN_TASK_COPY; k <= ATTN_TASK_SORT; k++) {
        check_copy_like(ctx, k, 10, 16);
        check_copy_like(ctx, k, 3, 9); /* odd T: a pad at the end */
    }
    /* induction: 0, p (distinct, L in [Lmax/2, Lmax]), repeated; answers after the second 0 */
    enum { B = 200, T = 32, V = 20 };
    static int32_t tokens[B * T], targets[B * T];
    attn_rng *rng;
    attn_rng_new(ctx, 11, &rng);
    size_t answers = 0, seen_l[T] = {0};
    CHECK_STATUS(attn_task_batch(ctx, ATTN_TASK_INDUCTION, V, T, rng, B, tokens, targets, &answers),
                 ATTN_OK);
    size_t counted = 0;
    for (size_t b = 0; b < B; b++) {
        const int32_t *s = tokens + b * T, *y = targets + b * T;
        CHECK(s[0] == 0);
        size_t L = 1;
        while (L < T && s[L] != 0) L++;
        L -= 1; /* s[L + 1] is the second separator */
        CHECK(L >= 7 && L <= 15);
        seen_l[L]++;
        for (size_t i = 1; i <= L; i++)
            for (size_t k = 1; k < i; k++) CHECK(s[i] != s[k]);
        for (size_t t = 0; t < T; t++) {
            CHECK(s[t] == s[t % (L + 1)]);
            if (t >= L + 1) {
                /* the token that followed s[t] one period earlier */
                CHECK(y[t] == s[t - L]);
                counted++;
            } else {
                CHECK(y[t] == ATTN_IGNORE_INDEX);
            }
        }
    }
    CHECK(answers == counted);
    CHECK(seen_l[7] > 0 && seen_l[15] > 0);
    /* reproducible: the same seed draws the same batch, another seed another */
    static int32_t again[B * T], again_targets[B * T];
    attn_rng_manual_seed(rng, 11);
    attn_task_batch(ctx, ATTN_TASK_INDUCTION, V, T, rng, B, again, again_targets, NULL);
    CHECK(memcmp(again, tokens, sizeof tokens) == 0);
    attn_rng_manual_seed(rng, 12);
    attn_task_batch(ctx, ATTN_TASK_INDUCTION, V, T, rng, B, again, again_targets, NULL);
    CHECK(memcmp(again, tokens, sizeof tokens) != 0);

    /* errors */
    attn_task_kind kind;
    CHECK_STATUS(attn_task_find(ctx, "induction", &kind), ATTN_OK);
    CHECK(kind == ATTN_TASK_INDUCTION && strcmp(attn_task_name(kind), "induction") == 0);
    CHECK_STATUS(attn_task_find(ctx, "copies", &kind), ATTN_ERR_NOT_FOUND);
    CHECK_MESSAGE(ctx, "'copies'");
    CHECK(strcmp(attn_task_name((attn_task_kind)9), "") == 0);
    CHECK_STATUS(attn_task_check(ctx, ATTN_TASK_COPY, 1, 8), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "vocab_size (1)");
    CHECK_STATUS(attn_task_check(ctx, ATTN_TASK_SORT, 8, 1), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "context_length (1)");
    CHECK_STATUS(attn_task_check(ctx, ATTN_TASK_INDUCTION, 10, 32), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "up to 15 distinct tokens, but vocab_size 10 has 9");
    CHECK_STATUS(attn_task_check(ctx, (attn_task_kind)7, 10, 32), ATTN_ERR_INVALID);
    CHECK_STATUS(attn_task_batch(ctx, ATTN_TASK_COPY, 10, 8, NULL, 1, tokens, targets, NULL),
                 ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "rng is NULL");
    CHECK_STATUS(attn_task_batch(ctx, ATTN_TASK_COPY, 10, 8, rng, 0, tokens, targets, NULL),
                 ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "batch must be positive");
    attn_rng_free(rng);
}

/* ---- optimizers --------------------------------------------------------------- */

static void test_optimizer_errors(attn_ctx *ctx) {
    float w[6] = {1, 2, 3, 4, 5, 6}, gw[6] = {0}, b[3] = {0}, gb[3] = {0};
    attn_param params[2] = {
        {.name = "w", .data = w, .grad = gw, .ndim = 2, .shape = {2, 3}, .numel = 6},
        {.name = "b", .data = b, .grad = gb, .ndim = 1, .shape = {3, 0}, .numel = 3},
    };
    attn_optimizer *opt = NULL;
    attn_optimizer_config sgd = attn_optimizer_defaults(ATTN_OPTIMIZER_SGD);
    attn_optimizer_config adamw = attn_optimizer_defaults(ATTN_OPTIMIZER_ADAMW);
    /* PyTorch's defaults */
    CHECK(isnan(sgd.lr) && sgd.momentum == 0.0 && sgd.dampening == 0.0 &&
          sgd.weight_decay == 0.0 && !sgd.nesterov);
    CHECK(adamw.lr == 1e-3 && adamw.beta1 == 0.9 && adamw.beta2 == 0.999 && adamw.eps == 1e-8 &&
          adamw.weight_decay == 1e-2 && !adamw.amsgrad);

    CHECK_STATUS(attn_optimizer_new(NULL, &adamw, params, 2, &opt), ATTN_ERR_NULL);
    CHECK_STATUS(attn_optimizer_new(ctx, NULL, params, 2, &opt), ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "cfg is NULL");
    CHECK_STATUS(attn_optimizer_new(ctx, &sgd, params, 2, &opt), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "SGD: lr is required");
    CHECK(opt == NULL);

    struct {
        attn_optimizer_config cfg;
        const char *message;
    } bad[] = {
        {{.kind = ATTN_OPTIMIZER_SGD, .lr = -0.1}, "lr (-0.1) must be finite and >= 0"},
        {{.kind = ATTN_OPTIMIZER_SGD, .lr = INFINITY}, "lr (inf)"},
        {{.kind = ATTN_OPTIMIZER_SGD, .lr = 0.1, .momentum = -0.5}, "momentum (-0.5)"},
        {{.kind = ATTN_OPTIMIZER_SGD, .lr = 0.1, .weight_decay = -1}, "weight_decay (-1)"},
        {{.kind = ATTN_OPTIMIZER_SGD, .lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true},
         "nesterov needs momentum > 0 and dampening 0 (got momentum 0.9, dampening 0.1)"},
        {{.kind = ATTN_OPTIMIZER_SGD, .lr = 0.1, .nesterov = true}, "got momentum 0,"},
        {{.kind = ATTN_OPTIMIZER_ADAMW, .lr = 1e-3, .beta1 = 1.0, .beta2 = 0.9}, "beta1 (1) must be in [0, 1)"},
        {{.kind = ATTN_OPTIMIZER_ADAMW, .lr = 1e-3, .beta1 = 1.0000001, .beta2 = 0.9},
         "beta1 (1.0000001) must be in [0, 1)"},
        {{.kind = ATTN_OPTIMIZER_ADAMW, .lr = 1e-3, .beta1 = 0.9, .beta2 = 1.0 + 0x1p-52},
         "beta2 (1.0000000000000002)"},
        {{.kind = ATTN_OPTIMIZER_ADAMW, .lr = 1e-3, .beta1 = 0.9, .beta2 = -0.1}, "beta2 (-0.1)"},
        {{.kind = ATTN_OPTIMIZER_ADAMW, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.9, .eps = -1e-8}, "eps (-1e-08)"},
        {{.kind = (attn_optimizer_kind)5, .lr = 1e-3}, "unknown kind 5"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_STATUS(attn_optimizer_new(ctx, &bad[i].cfg, params, 2, &opt), ATTN_ERR_INVALID);
        CHECK_MESSAGE(ctx, bad[i].message);
    }
    /* the parameter list */
    CHECK_STATUS(attn_optimizer_new(ctx, &adamw, params, 0, &opt), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "empty parameter list");
    CHECK_STATUS(attn_optimizer_new(ctx, &adamw, NULL, 2, &opt), ATTN_ERR_NULL);
    attn_param broken[2] = {params[0], params[1]};
    broken[1].grad = NULL;
    CHECK_STATUS(attn_optimizer_new(ctx, &adamw, broken, 2, &opt), ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "parameter 1 (b) has no grad");
    broken[1] = params[1];
    broken[0].numel = 7; /* a wrong count */
    CHECK_STATUS(attn_optimizer_new(ctx, &adamw, broken, 2, &opt), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "parameter 0 (w) has numel 7 but its shape holds 6");
    broken[0] = params[0];
    broken[0].ndim = 3;
    CHECK_STATUS(attn_optimizer_new(ctx, &adamw, broken, 2, &opt), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "ndim 3");
    broken[0] = params[0];
    broken[0].shape[0] = SIZE_MAX;
    CHECK_STATUS(attn_optimizer_new(ctx, &adamw, broken, 2, &opt), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "parameter 0 (w) has shape (18446744073709551615, 3), which overflows");
    broken[0] = params[0];
    broken[1] = params[0];
    CHECK_STATUS(attn_optimizer_new(ctx, &adamw, broken, 2, &opt), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "parameters 0 and 1 (w) are the same tensor");
    /* spans that share memory without the same start: views of one buffer */
    float shared[12] = {0}, shared_grad[12] = {0};
    attn_param views[2] = {
        {.name = "a", .data = shared, .grad = shared_grad, .ndim = 1, .shape = {8}, .numel = 8},
        {.name = "b", .data = shared + 4, .grad = shared_grad + 8, .ndim = 1, .shape = {4},
         .numel = 4}};
    CHECK_STATUS(attn_optimizer_new(ctx, &adamw, views, 2, &opt), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "parameters 0 (a) and 1 (b) share memory (data)");
    views[1].data = shared + 8;
    views[1].grad = shared_grad + 4;
    CHECK_STATUS(attn_optimizer_new(ctx, &adamw, views, 2, &opt), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "share memory (grad)");
    views[1].grad = shared + 4;
    views[1].data = shared_grad + 8;
    CHECK_STATUS(attn_optimizer_new(ctx, &adamw, views, 2, &opt), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "share memory (data and grad)");
    views[0].grad = shared + 4;
    views[1] = views[0];
    CHECK_STATUS(attn_optimizer_new(ctx, &adamw, views, 1, &opt), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "parameter 0 (a): data and grad share memory");
    views[0].grad = shared_grad;
    views[1] = (attn_param){.name = "b", .data = shared + 8, .grad = shared_grad + 8, .ndim = 1,
                            .shape = {4}, .numel = 4};
    CHECK_STATUS(attn_optimizer_new(ctx, &adamw, views, 2, &opt), ATTN_OK);
    attn_optimizer_free(opt);

    /* a good one: steps, lr, zero_grad */
    sgd.lr = 0.5;
    CHECK_STATUS(attn_optimizer_new(ctx, &sgd, params, 2, &opt), ATTN_OK);
    gw[0] = 2.0f;
    CHECK_STATUS(attn_optimizer_step(opt), ATTN_OK);
    CHECK(w[0] == 0.0f && w[1] == 2.0f && attn_optimizer_steps(opt) == 1);
    CHECK_STATUS(attn_optimizer_set_lr(opt, -1.0), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "SGD: lr (-1)");
    CHECK_STATUS(attn_optimizer_set_lr(opt, 0.25), ATTN_OK);
    CHECK(attn_optimizer_lr(opt) == 0.25);
    CHECK_STATUS(attn_optimizer_zero_grad(opt), ATTN_OK);
    CHECK(gw[0] == 0.0f);
    attn_optimizer_free(opt);
    CHECK_STATUS(attn_optimizer_step(NULL), ATTN_ERR_NULL);
    CHECK(isnan(attn_optimizer_lr(NULL)) && attn_optimizer_steps(NULL) == 0);

    /* clip_grad_norm_: |(3, 4)| = 5 clipped to 1 */
    float total = 0.0f;
    gw[0] = 3.0f;
    gb[2] = 4.0f;
    CHECK_STATUS(attn_clip_grad_norm(ctx, params, 2, 1.0, &total), ATTN_OK);
    CHECK(total == 5.0f);
    CHECK_NEAR(gw[0], 0.6, 1e-6);
    CHECK_NEAR(gb[2], 0.8, 1e-6);
    CHECK_STATUS(attn_clip_grad_norm(ctx, params, 2, 10.0, &total), ATTN_OK); /* no clip */
    CHECK_NEAR(gw[0], 0.6, 1e-6);
    CHECK_STATUS(attn_clip_grad_norm(ctx, params, 2, -1.0, &total), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "max_norm (-1)");
    CHECK_STATUS(attn_clip_grad_norm(ctx, params, 2, NAN, &total), ATTN_ERR_INVALID);
    /* max_norm inf: the norm read, nothing clipped (clip_grad_norm_(p, inf)) */
    float before_w = gw[0], before_b = gb[2];
    total = -1.0f;
    CHECK_STATUS(attn_clip_grad_norm(ctx, params, 2, INFINITY, &total), ATTN_OK);
    CHECK_NEAR(total, 1.0, 1e-6);
    CHECK(gw[0] == before_w && gb[2] == before_b);
    CHECK_STATUS(attn_clip_grad_norm(ctx, params, 2, -INFINITY, &total), ATTN_ERR_INVALID);
    /* an infinite gradient under max_norm inf: NaN everywhere, as PyTorch's
     * inf / (inf + 1e-6) */
    gw[0] = INFINITY;
    CHECK_STATUS(attn_clip_grad_norm(ctx, params, 2, INFINITY, &total), ATTN_OK);
    CHECK(isinf(total) && isnan(gw[0]) && isnan(gb[2]));
    gw[0] = before_w;
    gb[2] = before_b;
    /* no parameters: a norm of 0, as clip_grad_norm_([]) gives */
    total = -1.0f;
    CHECK_STATUS(attn_clip_grad_norm(ctx, NULL, 0, 1.0, &total), ATTN_OK);
    CHECK(total == 0.0f);
    CHECK_STATUS(attn_clip_grad_norm(ctx, NULL, 0, -1.0, &total), ATTN_ERR_INVALID);
    CHECK_STATUS(attn_clip_grad_norm(ctx, NULL, 2, 1.0, &total), ATTN_ERR_NULL);
    CHECK_STATUS(attn_clip_grad_norm(NULL, params, 2, 1.0, &total), ATTN_ERR_NULL);
}

/* AdamW against PyTorch 2.15's torch.optim.AdamW (the CPU default, the
 * single-tensor path, exp_avg.lerp_), committed as float bits after 20
 * steps on exactly representable data, for a lerp weight below 0.5 (beta1
 * 0.9), above it (0.3) and at it (0.5, with amsgrad); sizes 19 and 5 run
 * the vector loop and its tail. The moments, exp_avg and exp_avg_sq, are
 * PyTorch's bit for bit (PyTorch 1.13's mul_ and add_ differ from these
 * exp_avg in 2 to 18 of each config's 24 values). The parameters pass
 * through sqrt(exp_avg_sq), which PyTorch 2.15's CPU build rounds within 1
 * ulp rather than correctly, so they agree within 4 ulps, or 2^-20 lr a
 * step for values near 0. */
static void test_adamw_pytorch2(attn_ctx *ctx) {
    enum { N0 = 19, N1 = 5, N = N0 + N1, STEPS = 20 };
    static const uint32_t want[3][3][N] = { /* exp_avg, exp_avg_sq, the parameters */
        {
            {
              0xbf3e9346, 0x3e431b74, 0x3d706fc1, 0x3f2a4bc2, 0xbf03581d, 0xbeb92659,
              0x3f065f77, 0x3e029754, 0x3f670339, 0xbf2cc392, 0xbe66dbfc, 0xbc6f198a,
              0x3ea7eecb, 0xbe8dae1e, 0xbf19d1cf, 0x3dc236b8, 0x3ebc8768, 0x3f11cbbb,
              0x3d9eaf8a, 0xbeea2666, 0x3edbbee0, 0x3d025ce6, 0x3f4e8333, 0xbf41f7ce,
            },
            {
              0x3daaa819, 0x3d9fa680, 0x3df77c7f, 0x3de501b9, 0x3df3dfd6, 0x3d918094,
              0x3dc6f48b, 0x3df0ac2f, 0x3df7f661, 0x3dd4bd68, 0x3d8bb438, 0x3ddceb25,
              0x3de6fbeb, 0x3df6fb67, 0x3db265e7, 0x3d98ff32, 0x3df104ac, 0x3de31464,
              0x3df36bca, 0x3d95c2c3, 0x3dbb210a, 0x3df61d5d, 0x3df1d2ca, 0x3de05045,
            },
            {
              0xbf19f5b3, 0xbd068a72, 0x3f0a527b, 0xbee847ca, 0x3e00dd22, 0x3f34ec1f,
              0xbe99f03d, 0x3e8f4af3, 0xbf37a37a, 0xbe07ae58, 0x3ee163a7, 0xbf10d583,
              0x3c5774e1, 0x3f17e93f, 0xbecd5be5, 0x3e2f484a, 0x3f3e3376, 0xbe7ff971,
              0x3ea8580d, 0xbf06c419, 0x3d3377bd, 0x3f1fc474, 0xbebf001d, 0x3e54cce3,
            },
        },
        {
            {
              0xc045b3d8, 0xbee53f5e, 0x400d2218, 0x409c65a7, 0xc09698d3, 0xc010df4c,
              0x3ec164f8, 0x4041f6a3, 0x40b6cf35, 0xc0785e24, 0xbfbcb21f, 0x3f96b053,
              0x4076c19f, 0xc084603a, 0xc052e8d3, 0xbf27743b, 0x40002cb5, 0x4095cb15,
              0xc053ebe9, 0xc01e146f, 0x3e2f77c2, 0x4034c180, 0x40b034a3, 0xc082c9a3,
            },
            {
              0x403e4e1b, 0x4028a991, 0x4073f973, 0x4082952a, 0x408f21aa, 0x401f6d69,
              0x40517bf1, 0x407017d4, 0x4096648d, 0x40734b61, 0x4015f429, 0x4062c4b6,
              0x40717129, 0x4096b83f, 0x40480188, 0x40220081, 0x406f5a91, 0x407e8420,
              0x40905828, 0x4024eac4, 0x404512ca, 0x407312a0, 0x40908a59, 0x4080a63e,
            },
            {
              0xbf164b65, 0xbd18cd5e, 0x3f076944, 0xbeebbd02, 0x3e02da40, 0x3f34f2c7,
              0xbe9e8bde, 0x3e8aad30, 0xbf38a120, 0xbdfc881b, 0x3ee2bc3b, 0xbf116591,
              0x3ba54c25, 0x3f167c96, 0xbeca2f58, 0x3e2bdd90, 0x3f39e093, 0xbe835f97,
              0x3ea53e0d, 0xbf047fe9, 0x3d0e2805, 0x3f1d3c25, 0xbec14c9b, 0x3e5af15e,
            },
        },
        {
            {
              0xc0212655, 0xbeddaff0, 0x3fc06f2e, 0x406e3eca, 0xc0650dcb, 0xbfea4cb0,
              0x3e8240ba, 0x400c33c4, 0x408d00c5, 0xc03987d2, 0xbfa19bf5, 0x3f341e6a,
              0x40373fc2, 0xc0220db8, 0xc02c07d4, 0xbf1ad7f5, 0x3fb20f30, 0x40633ecb,
              0xbfec1b94, 0xc0002657, 0x3da90300, 0x400133c5, 0x408780c6, 0xc04487cd,
            },
            {
              0x408cded4, 0x40677a1a, 0x40a1d26b, 0x40cf52c1, 0x40e310fa, 0x4065acff,
              0x408fd1cc, 0x40a4257c, 0x40fb4132, 0x40ba9ad8, 0x4051c7de, 0x4099866f,
              0x40af8b84, 0x40fb274f, 0x40953009, 0x405ecca1, 0x409f3f10, 0x40c6de1f,
              0x40e7e24c, 0x406f5f60, 0x408726d2, 0x40a3ca1b, 0x40eecaa2, 0x40c64178,
            },
            {
              0xbf0ca9a4, 0xbd3b0eae, 0x3f01395a, 0xbef4862f, 0x3e0a9492, 0x3f3aa03c,
              0xbeac1905, 0x3e85aa18, 0xbf3b49a6, 0xbda7b87c, 0x3eed36d3, 0xbf158f4b,
              0xbc3ea277, 0x3f15fb66, 0xbebed33c, 0x3e2ac072, 0x3f3225e6, 0xbe89734f,
              0x3ea58f16, 0xbefea16c, 0x3c81141f, 0x3f1c1f02, 0xbec3ae60, 0x3e771e4c,
            },
        },
    };
    const struct {
        double lr, beta1, beta2, eps, weight_decay;
        bool amsgrad;
    } configs[3] = {{1e-3, 0.9, 0.999, 1e-8, 1e-2, false},
                    {3e-3, 0.3, 0.95, 1e-6, 0.1, false},
                    {1e-2, 0.5, 0.9, 1e-8, 0.0, true}};
    const size_t sizes[2] = {N0, N1}, offsets[2] = {0, N0};
    for (int c = 0; c < 3; c++) {
        float data[N], grad[N], state[3 * N];
        for (int t = 0; t < 2; t++)
            for (size_t i = 0; i < sizes[t]; i++)
                data[offsets[t] + i] =
                    (float)((int)((i * 37 + 11 + 5 * (size_t)t) % 101) - 50) / 64.0f;
        attn_param params[2] = {
            {.name = "p0", .data = data, .grad = grad, .ndim = 1, .shape = {N0}, .numel = N0},
            {.name = "p1", .data = data + N0, .grad = grad + N0, .ndim = 1, .shape = {N1},
             .numel = N1}};
        attn_optimizer_config oc = attn_optimizer_defaults(ATTN_OPTIMIZER_ADAMW);
        oc.lr = configs[c].lr;
        oc.beta1 = configs[c].beta1;
        oc.beta2 = configs[c].beta2;
        oc.eps = configs[c].eps;
        oc.weight_decay = configs[c].weight_decay;
        oc.amsgrad = configs[c].amsgrad;
        attn_optimizer *opt = NULL;
        CHECK_STATUS(attn_optimizer_new(ctx, &oc, params, 2, &opt), ATTN_OK);
        if (!opt) continue;
        for (size_t s = 0; s < STEPS; s++) {
            float scale = ldexpf(1.0f, (int)(s % 5) - 2);
            for (int t = 0; t < 2; t++)
                for (size_t i = 0; i < sizes[t]; i++)
                    grad[offsets[t] + i] =
                        (float)((int)((i * 13 + s * 7 + 5 + 3 * (size_t)t) % 61) - 30) / 16.0f *
                        scale;
            CHECK_STATUS(attn_optimizer_step(opt), ATTN_OK);
        }
        size_t n_state = attn_optimizer_state_size(opt), steps = 0;
        CHECK(n_state == (configs[c].amsgrad ? 3u : 2u) * N);
        CHECK_STATUS(attn_optimizer_get_state(opt, state, n_state, &steps), ATTN_OK);
        attn_optimizer_free(opt);
        /* the state: per parameter exp_avg, exp_avg_sq (and max_exp_avg_sq) */
        int differ = 0;
        size_t at = 0;
        for (int t = 0; t < 2; t++) {
            for (int k = 0; k < 2; k++)
                for (size_t i = 0; i < sizes[t]; i++) {
                    uint32_t bits;
                    memcpy(&bits, &state[at + k * sizes[t] + i], sizeof bits);
                    if (bits != want[c][k][offsets[t] + i] && differ++ < 3)
                        fprintf(stderr, "AdamW config %d, %s[%zu]: 0x%08x, PyTorch 2.15 0x%08x\n",
                                c, k ? "exp_avg_sq" : "exp_avg", offsets[t] + i, (unsigned)bits,
                                (unsigned)want[c][k][offsets[t] + i]);
                }
            at += (configs[c].amsgrad ? 3 : 2) * sizes[t];
        }
        CHECK(differ == 0);
        for (size_t i = 0; i < N; i++) {
            float torch;
            memcpy(&torch, &want[c][2][i], sizeof torch);
            double ulp = ldexp(1.0, ilogb(torch) - 23);
            double tol = fmax(4.0 * ulp, ldexp(configs[c].lr * STEPS, -20));
            if (!(fabs((double)data[i] - torch) <= tol)) {
                fprintf(stderr, "AdamW config %d, parameter %zu: %.9g, PyTorch 2.15 %.9g\n", c,
                        i, (double)data[i], (double)torch);
                CHECK(false);
            }
        }
    }
}

/* ---- the model -------------------------------------------------------------- */

static attn_model_config small_config(void) {
    return (attn_model_config){.vocab_size = 11, .context_length = 8, .d_model = 8,
                               .n_layers = 2, .n_heads = 2, .attention = ATTN_MODULE_MHA,
                               .mlp = true};
}

static void test_model_config_errors(attn_ctx *ctx, attn_rng *rng) {
    attn_model *m = NULL;
    attn_model_config c = small_config();
    CHECK_STATUS(attn_model_new(NULL, &c, rng, &m), ATTN_ERR_NULL);
    CHECK_STATUS(attn_model_new(ctx, &c, NULL, &m), ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "init_rng is NULL");
    attn_model_config bad;
    bad = c, bad.vocab_size = 0;
    CHECK_STATUS(attn_model_new(ctx, &bad, rng, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "vocab_size (0)");
    bad = c, bad.context_length = 0;
    CHECK_STATUS(attn_model_new(ctx, &bad, rng, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "context_length must be positive");
    bad = c, bad.d_model = 0;
    CHECK_STATUS(attn_model_new(ctx, &bad, rng, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "d_model must be positive");
    bad = c, bad.n_layers = 0;
    CHECK_STATUS(attn_model_new(ctx, &bad, rng, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "n_layers must be positive");
    bad = c, bad.n_heads = 0;
    CHECK_STATUS(attn_model_new(ctx, &bad, rng, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "n_heads must be positive");
    bad = c, bad.n_heads = 3;
    CHECK_STATUS(attn_model_new(ctx, &bad, rng, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "d_model (8) must be divisible by n_heads (3)");
    bad = c, bad.attention = ATTN_MODULE_SA_V1;
    CHECK_STATUS(attn_model_new(ctx, &bad, rng, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "attention must be ATTN_MODULE_MHA or ATTN_MODULE_GPT2, got 1");
    bad = c, bad.dropout = 1.5;
    CHECK_STATUS(attn_model_new(ctx, &bad, rng, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "dropout (1.5)");
    bad = c, bad.vocab_size = (size_t)1 << 30, bad.d_model = (size_t)1 << 40;
    bad.n_heads = 1;
    CHECK_STATUS(attn_model_new(ctx, &bad, rng, &m), ATTN_ERR_OVERFLOW);
    CHECK(m == NULL);
}

/* Parameter counts: the names and numbers PyTorch's state_dict has. */
static void test_model_params(attn_ctx *ctx, attn_rng *rng) {
    attn_model_config c = small_config();
    attn_model *m;
    CHECK_STATUS(attn_model_new(ctx, &c, rng, &m), ATTN_OK);
    /* 2 embeddings + 2 x (ln1 2 + mha 5 + ln2 2 + mlp 4) + ln_f 2 + head */
    CHECK(attn_model_param_count(m) == 2 + 2 * 13 + 3);
    size_t C = 8, V = 11, T = 8;
    size_t per_block = 2 * C + (3 * C * C + C * C + C) + 2 * C + (4 * C * C + 4 * C) + (4 * C * C + C);
    CHECK(attn_model_num_scalars(m) == V * C + T * C + 2 * per_block + 2 * C + V * C);
    attn_param p;
    CHECK_STATUS(attn_model_param_at(m, 0, &p), ATTN_OK);
    CHECK(strcmp(p.name, "tok_emb.weight") == 0 && p.shape[0] == V && p.shape[1] == C);
    CHECK_STATUS(attn_model_param(m, "blocks.1.attn.out_proj.bias", &p), ATTN_OK);
    CHECK(p.ndim == 1 && p.numel == C && p.grad != NULL);
    CHECK_STATUS(attn_model_param(m, "blocks.0.mlp.fc.weight", &p), ATTN_OK);
    CHECK(p.shape[0] == 4 * C && p.shape[1] == C);
    CHECK_STATUS(attn_model_param(m, "head.weight", &p), ATTN_OK);
    CHECK_STATUS(attn_model_param(m, "head.bias", &p), ATTN_ERR_NOT_FOUND);
    CHECK_MESSAGE(ctx, "no parameter named 'head.bias'");
    CHECK_STATUS(attn_model_param_at(m, 99, &p), ATTN_ERR_NOT_FOUND);
    CHECK_MESSAGE(ctx, "index 99 is out of range");
    CHECK_STATUS(attn_model_param_at(m, 0, NULL), ATTN_ERR_NULL);
    attn_model_free(m);

    c.attention = ATTN_MODULE_GPT2;
    c.mlp = false;
    CHECK_STATUS(attn_model_new(ctx, &c, rng, &m), ATTN_OK);
    CHECK(attn_model_param_count(m) == 2 + 2 * 6 + 3);
    CHECK_STATUS(attn_model_param(m, "blocks.0.attn.c_attn.weight", &p), ATTN_OK);
    CHECK(p.shape[0] == 3 * C && p.shape[1] == C);
    attn_model_free(m);
}

/* attn_model_new_gpt refuses by the book's names; the config comes back. */
static void test_gpt_model(attn_ctx *ctx, attn_rng *rng) {
    attn_gpt_config g = {.vocab_size = 11, .context_length = 8, .emb_dim = 8, .n_heads = 2,
                         .n_layers = 2, .drop_rate = 0.1, .qkv_bias = false};
    attn_model *m = (attn_model *)ctx;
    CHECK_STATUS(attn_model_new_gpt(NULL, &g, rng, &m), ATTN_ERR_NULL);
    CHECK(m == NULL);
    CHECK_STATUS(attn_model_new_gpt(ctx, NULL, rng, &m), ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "cfg is NULL");
    CHECK_STATUS(attn_model_new_gpt(ctx, &g, NULL, &m), ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "init_rng is NULL");
    attn_gpt_config bad = g;
    bad.n_heads = 3;
    CHECK_STATUS(attn_model_new_gpt(ctx, &bad, rng, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "emb_dim (8) must be a positive multiple of n_heads (3)");
    bad = g, bad.emb_dim = 0;
    CHECK_STATUS(attn_model_new_gpt(ctx, &bad, rng, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "emb_dim (0)");
    bad = g, bad.drop_rate = -0.5;
    CHECK_STATUS(attn_model_new_gpt(ctx, &bad, rng, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "drop_rate (-0.5)");
    bad = g, bad.n_layers = 0;
    CHECK_STATUS(attn_model_new_gpt(ctx, &bad, rng, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "n_layers must be positive");
    CHECK(m == NULL);

    CHECK_STATUS(attn_model_new_gpt(ctx, &g, rng, &m), ATTN_OK);
    /* 2 embeddings + 2 x (att 5 + ff 4 + norms 4) + final_norm 2 + out_head */
    CHECK(attn_model_param_count(m) == 2 + 2 * 13 + 3);
    attn_param p;
    CHECK_STATUS(attn_model_param_at(m, 2, &p), ATTN_OK);
    CHECK(strcmp(p.name, "trf_blocks.0.att.W_query.weight") == 0);
    CHECK_STATUS(attn_model_param(m, "trf_blocks.1.norm2.shift", &p), ATTN_OK);
    CHECK(p.numel == 8 && p.data[0] == 0.0f);
    CHECK_STATUS(attn_model_param(m, "trf_blocks.1.norm2.scale", &p), ATTN_OK);
    CHECK(p.data[7] == 1.0f);
    CHECK_STATUS(attn_model_param(m, "trf_blocks.0.ff.layers.2.weight", &p), ATTN_OK);
    CHECK(p.shape[0] == 8 && p.shape[1] == 32);
    CHECK_STATUS(attn_model_param(m, "out_head.weight", &p), ATTN_OK);
    attn_gpt_config back;
    CHECK_STATUS(attn_model_get_gpt_config(m, &back), ATTN_OK);
    CHECK(back.emb_dim == 8 && back.n_heads == 2 && back.drop_rate == 0.1 && !back.qkv_bias);
    attn_model_config mc = attn_model_get_config(m);
    CHECK(mc.d_model == 8 && mc.attention == ATTN_MODULE_MHA && mc.mlp && mc.dropout == 0.1);
    CHECK_STATUS(attn_model_get_gpt_config(m, NULL), ATTN_ERR_NULL);
    /* the file's mask buffers must be the causal mask, which PyTorch's
     * load_state_dict would copy into the book's model */
    size_t n = attn_model_param_count(m);
    attn_named_tensor t[2 + 2 * 13 + 3 + 2];
    for (size_t i = 0; i < n; i++) {
        attn_model_param_at(m, i, &p);
        t[i] = (attn_named_tensor){.name = p.name, .data = p.data, .ndim = p.ndim,
                                   .shape = {p.shape[0], p.shape[1]}};
    }
    float causal[8 * 8], zeros[8 * 8] = {0};
    for (size_t i = 0; i < 64; i++) causal[i] = i % 8 > i / 8 ? 1.0f : 0.0f;
    t[n] = (attn_named_tensor){.name = "trf_blocks.0.att.mask", .data = causal, .ndim = 2,
                               .shape = {8, 8}};
    t[n + 1] = (attn_named_tensor){.name = "trf_blocks.1.att.mask", .data = zeros, .ndim = 2,
                                   .shape = {8, 8}};
    char path[64];
    snprintf(path, sizeof path, "/tmp/attn_test_gpt_mask_%ld.safetensors", (long)getpid());
    CHECK_STATUS(attn_safetensors_write(ctx, path, t, n + 2, NULL, 0), ATTN_OK);
    CHECK_STATUS(attn_model_load(m, path), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "trf_blocks.1.att.mask is not the causal mask");
    CHECK_MESSAGE(ctx, "element (0, 1) is 0");
    t[n + 1].data = causal;
    CHECK_STATUS(attn_safetensors_write(ctx, path, t, n + 2, NULL, 0), ATTN_OK);
    CHECK_STATUS(attn_model_load(m, path), ATTN_OK);
    remove(path);
    attn_model_free(m);

    attn_model_config c = small_config();
    CHECK_STATUS(attn_model_new(ctx, &c, rng, &m), ATTN_OK);
    CHECK_STATUS(attn_model_get_gpt_config(m, &back), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "not attn_model_new_gpt");
    attn_model_free(m);
    CHECK_STATUS(attn_model_get_gpt_config(NULL, &back), ATTN_ERR_NULL);
}

/* The next draw of rng, to tell whether a refused call drew from it. */
static uint32_t next_draw(attn_rng *rng) {
    uint32_t v = 0;
    CHECK_STATUS(attn_rng_next_u32(rng, &v), ATTN_OK);
    return v;
}

/* attn_model_new_gpt with one refused variant config: nothing made, the
 * message names the values, no draw taken. */
static void expect_variant_refused(attn_ctx *ctx, const attn_gpt_config *cfg, const char *words) {
    attn_rng *a, *b;
    CHECK_STATUS(attn_rng_new(ctx, 99, &a), ATTN_OK);
    CHECK_STATUS(attn_rng_new(ctx, 99, &b), ATTN_OK);
    attn_model *m = (attn_model *)ctx;
    CHECK_STATUS(attn_model_new_gpt(ctx, cfg, a, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, words);
    CHECK(m == NULL);
    CHECK(next_draw(a) == next_draw(b));
    attn_rng_free(a);
    attn_rng_free(b);
}

/* The name and shape of parameter index of m. */
static void expect_param(attn_model *m, size_t index, const char *name, size_t rows,
                         size_t cols) {
    attn_param p;
    CHECK_STATUS(attn_model_param_at(m, index, &p), ATTN_OK);
    CHECK(strcmp(p.name, name) == 0);
    CHECK(p.shape[0] == rows && p.shape[1] == cols);
    if (strcmp(p.name, name) != 0) fprintf(stderr, "  param %zu is %s, not %s\n", index, p.name,
                                           name);
}

/* Chapter 4's bonus GPTs: refused configs name their values; each
 * attention's parameters in its script's state_dict order; the saved file
 * has no mask buffers, its metadata the cfg's keys, and attn_lm_load reads
 * it as the same model (the values against the scripts: pretrain_vs_book). */
/* A model of cfg refuses path's file by its metadata, with message. */
static void expect_load_refused(attn_ctx *ctx, attn_rng *rng, const attn_gpt_config *cfg,
                                const char *path, const char *message) {
    attn_model *m;
    CHECK_STATUS(attn_model_new_gpt(ctx, cfg, rng, &m), ATTN_OK);
    CHECK_STATUS(attn_model_load(m, path), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, message);
    attn_model_free(m);
}

static void test_gpt_variants(attn_ctx *ctx, attn_rng *rng) {
    attn_gpt_config g = {.vocab_size = 11, .context_length = 8, .emb_dim = 8, .n_heads = 2,
                         .n_layers = 3, .drop_rate = 0.1};
    attn_gpt_config bad = g;
    bad.attention = (attn_gpt_attention)7;
    expect_variant_refused(ctx, &bad, "attention (7) must be ATTN_GPT_MHA");
    bad = g, bad.n_kv_groups = 2;
    expect_variant_refused(ctx, &bad, "n_kv_groups (2) is ATTN_GPT_GQA's; attention is "
                                      "ATTN_GPT_MHA");
    bad = g, bad.attention = ATTN_GPT_GQA, bad.n_kv_groups = 0;
    expect_variant_refused(ctx, &bad, "n_kv_groups (0) must be a positive divisor of n_heads (2)");
    bad.n_kv_groups = 3;
    expect_variant_refused(ctx, &bad, "n_kv_groups (3) must be a positive divisor of n_heads (2)");
    bad = g, bad.attention = ATTN_GPT_GQA, bad.n_kv_groups = 1, bad.latent_dim = 4;
    expect_variant_refused(ctx, &bad, "latent_dim (4) is ATTN_GPT_MLA's; attention is "
                                      "ATTN_GPT_GQA");
    bad = g, bad.attention = ATTN_GPT_MLA, bad.sliding_window_stride = -1;
    expect_variant_refused(ctx, &bad, "sliding_window_size (0) and sliding_window_stride (-1) "
                                      "are ATTN_GPT_SWA's; attention is ATTN_GPT_MLA");
    bad = g, bad.attention = ATTN_GPT_SWA, bad.sliding_window_stride = 1;
    expect_variant_refused(ctx, &bad, "sliding_window_size (0) must be at least 1");

    /* GroupedQueryAttention: W_key, W_value (one KV head of 4), W_query,
     * out_proj without bias, then ff and the norms */
    attn_model *m;
    attn_gpt_config gqa = g;
    gqa.attention = ATTN_GPT_GQA, gqa.n_kv_groups = 1;
    CHECK_STATUS(attn_model_new_gpt(ctx, &gqa, rng, &m), ATTN_OK);
    CHECK(attn_model_param_count(m) == 2 + 3 * 12 + 3);
    expect_param(m, 2, "trf_blocks.0.att.W_key.weight", 4, 8);
    expect_param(m, 3, "trf_blocks.0.att.W_value.weight", 4, 8);
    expect_param(m, 4, "trf_blocks.0.att.W_query.weight", 8, 8);
    expect_param(m, 5, "trf_blocks.0.att.out_proj.weight", 8, 8);
    expect_param(m, 6, "trf_blocks.0.ff.layers.0.weight", 32, 8);
    attn_model_config mc = attn_model_get_config(m);
    CHECK(mc.attention == ATTN_MODULE_GQA);
    attn_gpt_config back;
    CHECK_STATUS(attn_model_get_gpt_config(m, &back), ATTN_OK);
    CHECK(back.attention == ATTN_GPT_GQA && back.n_kv_groups == 1);
    attn_model_free(m);

    /* MultiHeadLatentAttention, latent_dim 0: the module's max(16, 8 / 8) */
    attn_gpt_config mla = g;
    mla.attention = ATTN_GPT_MLA, mla.qkv_bias = true;
    CHECK_STATUS(attn_model_new_gpt(ctx, &mla, rng, &m), ATTN_OK);
    CHECK(attn_model_param_count(m) == 2 + 3 * (10 + 8) + 3);
    expect_param(m, 2, "trf_blocks.0.att.W_query.weight", 8, 8);
    expect_param(m, 4, "trf_blocks.0.att.W_DKV.weight", 16, 8);
    expect_param(m, 6, "trf_blocks.0.att.W_UK.weight", 8, 16);
    expect_param(m, 8, "trf_blocks.0.att.W_UV.weight", 8, 16);
    expect_param(m, 11, "trf_blocks.0.att.out_proj.bias", 8, 0);
    CHECK(attn_model_get_config(m).attention == ATTN_MODULE_MLA);
    /* its file says latent_dim null, the book's None: a model built with the
     * width that stands for loads it, and its file loads back into this one;
     * another width is refused */
    char mla_path[64], named_path[64];
    snprintf(mla_path, sizeof mla_path, "/tmp/attn_test_gpt_mla_%ld.safetensors", (long)getpid());
    snprintf(named_path, sizeof named_path, "/tmp/attn_test_gpt_mla16_%ld.safetensors",
             (long)getpid());
    CHECK_STATUS(attn_model_save(m, mla_path), ATTN_OK);
    attn_model *named;
    mla.latent_dim = 16;
    CHECK_STATUS(attn_model_new_gpt(ctx, &mla, rng, &named), ATTN_OK);
    CHECK_STATUS(attn_model_save(named, named_path), ATTN_OK);
    CHECK_STATUS(attn_model_load(named, mla_path), ATTN_OK);
    CHECK_STATUS(attn_model_load(m, named_path), ATTN_OK);
    attn_model_free(named);
    mla.latent_dim = 24;
    expect_load_refused(ctx, rng, &mla, mla_path, "latent_dim null, this model has 24");
    remove(mla_path);
    remove(named_path);
    attn_model_free(m);

    /* MultiHeadAttentionWithSWA, windows of 3 on layers 0 and 2 (stride 1):
     * the file holds no mask buffer, attn_lm_load reads the windows back */
    attn_gpt_config swa = g;
    swa.attention = ATTN_GPT_SWA, swa.sliding_window_size = 3, swa.sliding_window_stride = 1;
    CHECK_STATUS(attn_model_new_gpt(ctx, &swa, rng, &m), ATTN_OK);
    CHECK(attn_model_param_count(m) == 2 + 3 * 13 + 3);
    expect_param(m, 2, "trf_blocks.0.att.W_query.weight", 8, 8);
    CHECK(attn_model_get_config(m).attention == ATTN_MODULE_SWA);
    char path[64];
    snprintf(path, sizeof path, "/tmp/attn_test_gpt_swa_%ld.safetensors", (long)getpid());
    CHECK_STATUS(attn_model_save(m, path), ATTN_OK);
    attn_safetensors *file;
    CHECK_STATUS(attn_safetensors_open(ctx, path, &file), ATTN_OK);
    CHECK(attn_safetensors_count(file) == attn_model_param_count(m));
    const char *w = attn_safetensors_metadata_get(file, "sliding_window_size");
    const char *k = attn_safetensors_metadata_get(file, "sliding_window_stride");
    CHECK(w && strcmp(w, "3") == 0 && k && strcmp(k, "1") == 0);
    attn_safetensors_free(file);
    attn_lm *lm;
    CHECK_STATUS(attn_lm_load(ctx, path, NULL, NULL, &lm), ATTN_OK);
    attn_lm_config lc = attn_lm_get_config(lm);
    CHECK(lc.arch == ATTN_LM_GPT2 && lc.sliding_window_size == 3 &&
          lc.sliding_window_stride == 1 && lc.n_layers == 3 && lc.n_heads == 2);
    attn_lm_free(lm);
    /* attn_model_load takes it back; a model of another window refuses it */
    CHECK_STATUS(attn_model_load(m, path), ATTN_OK);
    swa.sliding_window_stride = -1;
    expect_load_refused(ctx, rng, &swa, path, "sliding_window_stride 1, this model has -1");
    remove(path);
    attn_model_free(m);
}

/* attn_model_new_llama3 refuses by the book's names; the config comes
 * back; the generic calls run on it (the values: book_llama3_vs_torch). */
static void test_llama3_model(attn_ctx *ctx, attn_rng *rng) {
    attn_llama3_config l = {.vocab_size = 11, .context_length = 8, .emb_dim = 16, .n_heads = 4,
                            .n_layers = 2, .hidden_dim = 24, .n_kv_groups = 2,
                            .rope_base = 500000.0};
    attn_model *m = (attn_model *)ctx;
    CHECK_STATUS(attn_model_new_llama3(NULL, &l, rng, &m), ATTN_ERR_NULL);
    CHECK(m == NULL);
    CHECK_STATUS(attn_model_new_llama3(ctx, NULL, rng, &m), ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "cfg is NULL");
    CHECK_STATUS(attn_model_new_llama3(ctx, &l, NULL, &m), ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "init_rng is NULL");
    attn_llama3_config bad = l;
    bad.n_kv_groups = 3;
    CHECK_STATUS(attn_model_new_llama3(ctx, &bad, rng, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "n_kv_groups (3) must be positive and divide n_heads (4)");
    bad = l, bad.n_heads = 5;
    CHECK_STATUS(attn_model_new_llama3(ctx, &bad, rng, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "emb_dim (16) must be a positive multiple of n_heads (5)");
    bad = l, bad.emb_dim = 12, bad.n_heads = 4; /* head_dim 3 */
    CHECK_STATUS(attn_model_new_llama3(ctx, &bad, rng, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "even head_dim");
    bad = l, bad.rope_base = 0.0;
    CHECK_STATUS(attn_model_new_llama3(ctx, &bad, rng, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "rope_base (0)");
    bad = l, bad.rope_base = 1e-300; /* 0 in float32, where the frequencies are made */
    CHECK_STATUS(attn_model_new_llama3(ctx, &bad, rng, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "rope_base (1e-300) is outside float32's range");
    bad = l, bad.rope_factor = 8.0, bad.rope_low_freq_factor = 1.0;
    bad.rope_high_freq_factor = 4.0; /* no original_context_length */
    CHECK_STATUS(attn_model_new_llama3(ctx, &bad, rng, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "rope_original_context_length (0)");
    bad = l, bad.hidden_dim = 0;
    CHECK_STATUS(attn_model_new_llama3(ctx, &bad, rng, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "hidden_dim (0)");
    bad = l, bad.vocab_size = 0;
    CHECK_STATUS(attn_model_new_llama3(ctx, &bad, rng, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "vocab_size (0)");
    CHECK(m == NULL);

    CHECK_STATUS(attn_model_new_llama3(ctx, &l, rng, &m), ATTN_OK);
    /* tok_emb + 2 x (att 4 + ff 3 + norms 2) + final_norm + out_head */
    CHECK(attn_model_param_count(m) == 1 + 2 * 9 + 2);
    attn_param p;
    CHECK_STATUS(attn_model_param_at(m, 1, &p), ATTN_OK);
    CHECK(strcmp(p.name, "trf_blocks.0.att.W_key.weight") == 0);
    CHECK(p.shape[0] == 8 && p.shape[1] == 16); /* 2 KV heads of 4 */
    CHECK_STATUS(attn_model_param(m, "trf_blocks.1.ff.fc3.weight", &p), ATTN_OK);
    CHECK(p.shape[0] == 16 && p.shape[1] == 24);
    CHECK_STATUS(attn_model_param(m, "trf_blocks.1.norm2.weight", &p), ATTN_OK);
    CHECK(p.numel == 16 && p.data[15] == 1.0f);
    CHECK_STATUS(attn_model_param(m, "final_norm.weight", &p), ATTN_OK);
    CHECK(attn_model_num_scalars(m) ==
          11 * 16 + 2 * (2 * 8 * 16 + 2 * 16 * 16 + 3 * 16 * 24 + 2 * 16) + 16 + 11 * 16);
    attn_llama3_config back;
    CHECK_STATUS(attn_model_get_llama3_config(m, &back), ATTN_OK);
    CHECK(back.emb_dim == 16 && back.n_kv_groups == 2 && back.rope_base == 500000.0 &&
          back.rope_factor == 0.0);
    attn_model_config mc = attn_model_get_config(m);
    CHECK(mc.vocab_size == 11 && mc.context_length == 8 && mc.d_model == 16 &&
          mc.n_layers == 2 && mc.n_heads == 4 && mc.attention == ATTN_MODULE_GQA && mc.mlp &&
          mc.dropout == 0.0 && !mc.qkv_bias);
    attn_gpt_config gpt;
    CHECK_STATUS(attn_model_get_gpt_config(m, &gpt), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "made by attn_model_new_llama3, not attn_model_new_gpt");
    CHECK_STATUS(attn_model_get_llama3_config(m, NULL), ATTN_ERR_NULL);

    /* the generic calls: forward with and without targets, backward, modes */
    int32_t tokens[2 * 8], targets[2 * 8];
    for (int i = 0; i < 16; i++) tokens[i] = i % 11, targets[i] = (i * 7) % 11;
    targets[3] = ATTN_IGNORE_INDEX;
    float logits[2 * 8 * 11], loss = 0.0f;
    CHECK_STATUS(attn_model_set_training(m, true), ATTN_OK);
    CHECK_STATUS(attn_model_backward(m), ATTN_ERR_INVALID); /* no forward yet */
    CHECK_STATUS(attn_model_zero_grad(m), ATTN_OK);
    /* a (1, 4) batch, then a (2, 8) one in grown buffers: causal, so the
     * first row's first 4 positions see the same tokens */
    float first[4 * 11];
    CHECK_STATUS(attn_model_forward(m, tokens, NULL, 1, 4, first, NULL, NULL), ATTN_OK);
    CHECK_STATUS(attn_model_forward(m, tokens, targets, 2, 8, logits, &loss, NULL), ATTN_OK);
    for (size_t i = 0; i < 4 * 11; i++) CHECK_NEAR(first[i], logits[i], 1e-5);
    CHECK(loss > 1.0f && loss < 5.0f); /* near log(11) for a fresh model */
    CHECK_STATUS(attn_model_backward(m), ATTN_OK);
    CHECK_STATUS(attn_model_param(m, "tok_emb.weight", &p), ATTN_OK);
    bool any = false;
    for (size_t i = 0; i < p.numel; i++) any |= p.grad[i] != 0.0f;
    CHECK(any);
    CHECK_STATUS(attn_model_zero_grad(m), ATTN_OK);
    CHECK(p.grad[0] == 0.0f);
    tokens[5] = 11;
    CHECK_STATUS(attn_model_forward(m, tokens, NULL, 2, 8, logits, NULL, NULL), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "tokens[0, 5] = 11 is outside [0, 11)");
    tokens[5] = 0;
    CHECK_STATUS(attn_model_forward(m, tokens, NULL, 1, 9, logits, NULL, NULL), ATTN_ERR_SHAPE);
    CHECK_STATUS(attn_model_set_grad_enabled(m, false), ATTN_OK);
    CHECK_STATUS(attn_model_forward(m, tokens, targets, 2, 8, NULL, &loss, NULL), ATTN_OK);
    CHECK_STATUS(attn_model_backward(m), ATTN_ERR_INVALID);
    CHECK_STATUS(attn_model_set_grad_enabled(m, true), ATTN_OK);
    CHECK_STATUS(attn_model_set_training(m, false), ATTN_OK);
    attn_model_free(m);

    attn_model_config c = small_config();
    CHECK_STATUS(attn_model_new(ctx, &c, rng, &m), ATTN_OK);
    CHECK_STATUS(attn_model_get_llama3_config(m, &back), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "made by attn_model_new, not attn_model_new_llama3");
    attn_model_free(m);
    CHECK_STATUS(attn_model_get_llama3_config(NULL, &back), ATTN_ERR_NULL);

    /* the RoPE tables: position 0 is the identity, position t the angle t
     * * inv_freq (no scaling: rope_base^(-2i / head_dim)) */
    float cosines[8 * 4], sines[8 * 4];
    CHECK_STATUS(attn_llama3_rope_tables(ctx, &l, cosines, sines), ATTN_OK);
    CHECK(cosines[0] == 1.0f && sines[3] == 0.0f);
    CHECK(cosines[5 * 4 + 1] == cosines[5 * 4 + 3]); /* the halves are equal */
    CHECK_NEAR(sines[5 * 4 + 1], sin(5.0 * pow(500000.0, -0.5)), 1e-6);
    CHECK_STATUS(attn_llama3_rope_tables(ctx, &l, NULL, sines), ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "cos is NULL");
    CHECK_STATUS(attn_llama3_rope_tables(ctx, &bad, cosines, sines), ATTN_ERR_INVALID);
}

static void test_model_calls(attn_ctx *ctx, attn_rng *rng) {
    attn_model_config c = small_config();
    c.dropout = 0.1;
    attn_model *m;
    CHECK_STATUS(attn_model_new(ctx, &c, rng, &m), ATTN_OK);
    enum { B = 2, T = 6, V = 11 };
    int32_t tokens[B * T], targets[B * T];
    for (int i = 0; i < B * T; i++) tokens[i] = i % V, targets[i] = i % 3 ? (i + 1) % V : -100;
    float logits[B * T * V], loss;

    CHECK_STATUS(attn_model_backward(m), ATTN_ERR_INVALID); /* before any forward */
    CHECK_MESSAGE(ctx, "needs a forward with targets");
    CHECK_STATUS(attn_model_forward(m, NULL, targets, B, T, logits, &loss, rng), ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "tokens is NULL");
    CHECK_STATUS(attn_model_forward(m, tokens, NULL, B, T, logits, &loss, rng), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "a loss needs targets");
    CHECK_STATUS(attn_model_forward(m, tokens, NULL, B, T, NULL, NULL, rng), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "nothing to compute");
    CHECK_STATUS(attn_model_forward(m, tokens, targets, 0, T, logits, &loss, rng), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "batch (0)");
    CHECK_STATUS(attn_model_forward(m, tokens, targets, 1, 9, logits, &loss, rng), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "sequence length (9) exceeds context_length (8)");
    tokens[7] = 11;
    CHECK_STATUS(attn_model_forward(m, tokens, targets, B, T, logits, &loss, rng), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "tokens[1, 1] = 11 is outside [0, 11)");
    tokens[7] = 7;
    targets[3] = -1;
    CHECK_STATUS(attn_model_forward(m, tokens, targets, B, T, logits, &loss, rng), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "targets[0, 3] = -1 is outside [0, 11) and is not the ignore_index -100");
    targets[3] = 4;
    CHECK_STATUS(attn_model_forward(m, tokens, targets, B, T, logits, &loss, NULL), ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "needs dropout_rng");
    /* logits or the loss over a parameter, its gradient or the targets:
     * refused before anything is written */
    attn_param emb;
    CHECK_STATUS(attn_model_param(m, "tok_emb.weight", &emb), ATTN_OK);
    float emb0 = emb.data[5], grad0 = emb.grad[5];
    CHECK_STATUS(attn_model_forward(m, tokens, targets, 1, T, emb.data, NULL, rng),
                 ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "logits");
    CHECK_MESSAGE(ctx, "overlaps parameter tok_emb.weight");
    CHECK_STATUS(attn_model_forward(m, tokens, targets, 1, T, NULL, emb.grad + 5, rng),
                 ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "overlaps the gradient of tok_emb.weight");
    CHECK(emb.data[5] == emb0 && emb.grad[5] == grad0);
    CHECK_STATUS(attn_model_forward(m, tokens, targets, B, T, NULL, (float *)(void *)targets, rng),
                 ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "loss");
    CHECK_MESSAGE(ctx, "overlaps targets");

    /* training: backward adds; twice gives twice */
    CHECK_STATUS(attn_model_zero_grad(m), ATTN_OK);
    CHECK_STATUS(attn_model_forward(m, tokens, targets, B, T, logits, &loss, rng), ATTN_OK);
    CHECK(isfinite(loss) && loss > 0.0f);
    CHECK_STATUS(attn_model_backward(m), ATTN_OK);
    attn_param head, wq;
    attn_model_param(m, "head.weight", &head);
    attn_model_param(m, "blocks.0.attn.W_query.weight", &wq);
    float once_head = head.grad[5], once_wq = wq.grad[3];
    CHECK(once_head != 0.0f && once_wq != 0.0f);
    CHECK_STATUS(attn_model_backward(m), ATTN_OK);
    CHECK_NEAR(head.grad[5], 2.0 * once_head, 1e-6 * fabs(once_head));
    CHECK_NEAR(wq.grad[3], 2.0 * once_wq, 1e-6 * fabs(once_wq) + 1e-12);
    /* a refused forward and set_grad_enabled leave the last forward's
     * backward, as PyTorch's graph stays: a third backward adds a third */
    tokens[7] = 11;
    CHECK_STATUS(attn_model_forward(m, tokens, targets, B, T, logits, &loss, rng), ATTN_ERR_INVALID);
    tokens[7] = 7;
    CHECK_STATUS(attn_model_set_grad_enabled(m, true), ATTN_OK);
    CHECK_STATUS(attn_model_backward(m), ATTN_OK);
    CHECK_NEAR(head.grad[5], 3.0 * once_head, 1e-6 * fabs(once_head));
    CHECK_STATUS(attn_model_zero_grad(m), ATTN_OK);
    CHECK(head.grad[5] == 0.0f && wq.grad[3] == 0.0f);
    /* an optimizer step between a forward and its backward: refused before
     * any gradient is written, naming the first parameter it changed */
    {
        const attn_param *all;
        size_t n_all;
        CHECK_STATUS(attn_model_params(m, &all, &n_all), ATTN_OK);
        attn_optimizer_config ac = attn_optimizer_defaults(ATTN_OPTIMIZER_ADAMW);
        attn_optimizer *step_opt = NULL;
        CHECK_STATUS(attn_optimizer_new(ctx, &ac, all, n_all, &step_opt), ATTN_OK);
        CHECK_STATUS(attn_model_forward(m, tokens, targets, B, T, logits, &loss, rng), ATTN_OK);
        CHECK_STATUS(attn_optimizer_step(step_opt), ATTN_OK); /* weight decay moves them all */
        CHECK_STATUS(attn_model_backward(m), ATTN_ERR_INVALID);
        CHECK_MESSAGE(ctx, "attn_model_backward: parameter tok_emb.weight was modified after the "
                           "forward (version 0 at the forward, 1 now)");
        CHECK(head.grad[5] == 0.0f && wq.grad[3] == 0.0f);
        CHECK_STATUS(attn_model_forward(m, tokens, targets, B, T, logits, &loss, rng), ATTN_OK);
        CHECK_STATUS(attn_model_backward(m), ATTN_OK);
        CHECK(head.grad[5] != 0.0f && wq.grad[3] != 0.0f);
        attn_optimizer_free(step_opt);
        CHECK_STATUS(attn_model_zero_grad(m), ATTN_OK);
    }

    /* eval mode: no rng needed, deterministic; no grad: no backward */
    CHECK_STATUS(attn_model_set_training(m, false), ATTN_OK);
    CHECK_STATUS(attn_model_set_grad_enabled(m, false), ATTN_OK);
    float again[B * T * V];
    CHECK_STATUS(attn_model_forward(m, tokens, targets, B, T, logits, &loss, NULL), ATTN_OK);
    CHECK_STATUS(attn_model_forward(m, tokens, NULL, B, T, again, NULL, NULL), ATTN_OK);
    CHECK(memcmp(logits, again, sizeof logits) == 0);
    CHECK_STATUS(attn_model_backward(m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "gradients enabled");
    CHECK_STATUS(attn_model_set_grad_enabled(m, true), ATTN_OK);

    /* every target ignored: NaN loss (0 / 0, as PyTorch), zero gradients */
    int32_t ignored[B * T];
    for (int i = 0; i < B * T; i++) ignored[i] = ATTN_IGNORE_INDEX;
    CHECK_STATUS(attn_model_forward(m, tokens, ignored, B, T, NULL, &loss, NULL), ATTN_OK);
    CHECK(isnan(loss));
    CHECK_STATUS(attn_model_backward(m), ATTN_OK);
    CHECK(head.grad[5] == 0.0f);

    /* a larger batch after a smaller one regrows the buffers */
    int32_t big[6 * 8];
    for (int i = 0; i < 48; i++) big[i] = (i * 7) % V;
    float big_logits[6 * 8 * V];
    CHECK_STATUS(attn_model_forward(m, big, NULL, 6, 8, big_logits, NULL, NULL), ATTN_OK);
    CHECK_STATUS(attn_model_forward(m, big, NULL, 2, 6, big_logits, NULL, NULL), ATTN_OK);

    /* save and load */
    char path[64];
    snprintf(path, sizeof path, "/tmp/attn_test_train_%ld.safetensors", (long)getpid());
    CHECK_STATUS(attn_model_save(m, NULL), ATTN_ERR_NULL);
    CHECK_STATUS(attn_model_save(m, "/nonexistent-dir/x.safetensors"), ATTN_ERR_IO);
    CHECK_STATUS(attn_model_save(m, path), ATTN_OK);
    attn_model *twin;
    CHECK_STATUS(attn_model_new(ctx, &c, rng, &twin), ATTN_OK); /* other weights */
    /* a load after a forward drops it: its activations are the old weights' */
    CHECK_STATUS(attn_model_forward(twin, tokens, targets, B, T, logits, &loss, rng), ATTN_OK);
    CHECK_STATUS(attn_model_load(twin, path), ATTN_OK);
    CHECK_STATUS(attn_model_backward(twin), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "after any load of the weights");
    attn_param a, b;
    for (size_t i = 0; i < attn_model_param_count(m); i++) {
        attn_model_param_at(m, i, &a);
        attn_model_param_at(twin, i, &b);
        CHECK(memcmp(a.data, b.data, a.numel * sizeof(float)) == 0);
    }
    attn_model_free(twin);
    attn_model_config other = c;
    other.n_heads = 4; /* same shapes: the metadata tells */
    CHECK_STATUS(attn_model_new(ctx, &other, rng, &twin), ATTN_OK);
    CHECK_STATUS(attn_model_load(twin, path), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "n_heads 2, this model has 4");
    attn_model_free(twin);
    other = c;
    other.d_model = 16;
    CHECK_STATUS(attn_model_new(ctx, &other, rng, &twin), ATTN_OK);
    CHECK_STATUS(attn_model_load(twin, path), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "d_model 8, this model has 16");
    attn_model_free(twin);
    other = c;
    other.mlp = false;
    CHECK_STATUS(attn_model_new(ctx, &other, rng, &twin), ATTN_OK);
    CHECK_STATUS(attn_model_load(twin, path), ATTN_ERR_SHAPE);
    attn_model_free(twin);
    CHECK_STATUS(attn_model_load(m, "/nonexistent-dir/x.safetensors"), ATTN_ERR_IO);
    /* a file without the model's metadata: the message names the tensor at
     * fault, its shape, a missing one or one the model has not */
    size_t n = attn_model_param_count(m);
    attn_named_tensor *t = calloc(n + 1, sizeof *t);
    CHECK(t != NULL);
    for (size_t i = 0; t && i < n; i++) {
        attn_model_param_at(m, i, &a);
        t[i] = (attn_named_tensor){.name = a.name, .data = a.data, .ndim = a.ndim};
        memcpy(t[i].shape, a.shape, a.ndim * sizeof(size_t));
    }
    if (t && n > 0 && t[0].ndim == 2) {
        attn_model_param_at(m, 0, &a);
        size_t rows = t[0].shape[0], cols = t[0].shape[1];
        t[0].shape[0] = cols, t[0].shape[1] = rows; /* the same numel, transposed */
        CHECK_STATUS(attn_safetensors_write(ctx, path, t, n, NULL, 0), ATTN_OK);
        CHECK_STATUS(attn_model_load(m, path), ATTN_ERR_SHAPE);
        char want[160];
        snprintf(want, sizeof want, "%s has shape (%zu, %zu), the model's is (%zu, %zu)",
                 a.name, cols, rows, rows, cols);
        CHECK_MESSAGE(ctx, want);
        t[0].shape[0] = rows, t[0].shape[1] = cols;
        t[n] = t[0];
        t[n].name = "extra.weight";
        CHECK_STATUS(attn_safetensors_write(ctx, path, t, n + 1, NULL, 0), ATTN_OK);
        CHECK_STATUS(attn_model_load(m, path), ATTN_ERR_SHAPE);
        CHECK_MESSAGE(ctx, "holds 'extra.weight', which the model has not");
        CHECK_STATUS(attn_safetensors_write(ctx, path, t + 1, n - 1, NULL, 0), ATTN_OK);
        CHECK_STATUS(attn_model_load(m, path), ATTN_ERR_NOT_FOUND);
        snprintf(want, sizeof want, "has no tensor '%s'", a.name);
        CHECK_MESSAGE(ctx, want);
    }
    free(t);
    remove(path);

    /* the optimizer over the model's parameters */
    const attn_param *params;
    size_t count;
    CHECK_STATUS(attn_model_params(m, &params, &count), ATTN_OK);
    CHECK_STATUS(attn_model_params(m, NULL, &count), ATTN_ERR_NULL);
    attn_optimizer_config oc = attn_optimizer_defaults(ATTN_OPTIMIZER_ADAMW);
    attn_optimizer *opt;
    CHECK_STATUS(attn_optimizer_new(ctx, &oc, params, count, &opt), ATTN_OK);
    attn_optimizer_free(opt);
    attn_model_free(m);
    CHECK_STATUS(attn_model_forward(NULL, tokens, targets, B, T, logits, &loss, rng), ATTN_ERR_NULL);
    CHECK_STATUS(attn_model_backward(NULL), ATTN_ERR_NULL);
    CHECK(attn_model_param_count(NULL) == 0);
}

int main(void) {
    attn_ctx *ctx;
    attn_rng *rng;
    if (attn_ctx_new(&(attn_ctx_config){.num_threads = 2}, &ctx) != ATTN_OK ||
        attn_rng_new(ctx, 5, &rng) != ATTN_OK)
        return 1;
    test_tasks(ctx);
    test_optimizer_errors(ctx);
    test_adamw_pytorch2(ctx);
    test_model_config_errors(ctx, rng);
    test_model_params(ctx, rng);
    test_gpt_model(ctx, rng);
    test_gpt_variants(ctx, rng);
    test_llama3_model(ctx, rng);
    test_model_calls(ctx, rng);
    attn_rng_free(rng);
    attn_ctx_free(ctx);
    return check_summary();
}
