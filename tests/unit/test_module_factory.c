/*
 * test_module_factory.c — attn_module_new and the table of kinds: every
 * kind from its name and back, the errors (a bad name, a bad kind, NULLs,
 * a d_out that GPT-2 or simple cannot have), and, for every kind, that the
 * factory's module is the kind's own constructor's module: from the same
 * seed the same parameter names, shapes and weight bits, the same rng state
 * after, and the same output bits in eval mode and, with dropout, in
 * training mode.
 */
#include "attn.h"
#include "check.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The names and classes the table must give, in enum order. */
static const struct {
    attn_module_kind kind;
    const char *name, *class_name;
} expected[] = {
    {ATTN_MODULE_SIMPLE, "simple", "SimplifiedSelfAttention"},
    {ATTN_MODULE_SA_V1, "sa1", "SelfAttention_v1"},
    {ATTN_MODULE_SA_V2, "sa2", "SelfAttention_v2"},
    {ATTN_MODULE_CAUSAL, "causal", "CausalAttention"},
    {ATTN_MODULE_MHA_WRAPPER, "mha-wrapper", "MultiHeadAttentionWrapper"},
    {ATTN_MODULE_MHA, "mha", "MultiHeadAttention"},
    {ATTN_MODULE_GPT2, "gpt2", "CausalSelfAttention"},
    {ATTN_MODULE_GQA, "gqa", "GroupedQueryAttention"},
    {ATTN_MODULE_MLA, "mla", "MultiHeadLatentAttention"},
    {ATTN_MODULE_SWA, "swa", "MultiHeadAttentionWithSWA"},
};
#define EXPECTED (sizeof expected / sizeof expected[0])

static void test_names(attn_ctx *ctx) {
    CHECK(EXPECTED == ATTN_MODULE_KIND_COUNT);
    for (size_t i = 0; i < EXPECTED; i++) {
        attn_module_kind kind = expected[i].kind;
        CHECK(strcmp(attn_module_kind_name(kind), expected[i].name) == 0);
        CHECK(strcmp(attn_module_kind_class_name(kind), expected[i].class_name) == 0);
        attn_module_kind got = (attn_module_kind)-1;
        CHECK_STATUS(attn_module_kind_from_name(ctx, expected[i].name, &got), ATTN_OK);
        CHECK(got == kind);
        CHECK(strcmp(attn_ctx_last_error(ctx), "") == 0);
    }
    /* no kind past the table, nor below it */
    CHECK(strcmp(attn_module_kind_name((attn_module_kind)ATTN_MODULE_KIND_COUNT), "") == 0);
    CHECK(strcmp(attn_module_kind_name((attn_module_kind)-1), "") == 0);
    CHECK(strcmp(attn_module_kind_class_name((attn_module_kind)ATTN_MODULE_KIND_COUNT), "") == 0);
}

static void test_bad_names(attn_ctx *ctx) {
    const char *bad[] = {"mha2", "MHA", "", "sa_v1", "MultiHeadAttention", "gpt2 "};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        attn_module_kind got = ATTN_MODULE_MLA;
        CHECK_STATUS(attn_module_kind_from_name(ctx, bad[i], &got), ATTN_ERR_NOT_FOUND);
        CHECK(got == ATTN_MODULE_MLA); /* untouched */
        char quoted[64];
        snprintf(quoted, sizeof quoted, "no module kind named '%s'", bad[i]);
        CHECK_MESSAGE(ctx, quoted);
        /* the message lists the kinds, from the table */
        CHECK_MESSAGE(ctx, "(simple, sa1, sa2, causal, mha-wrapper, mha, gpt2, gqa, mla, swa)");
    }
    attn_module_kind got;
    CHECK_STATUS(attn_module_kind_from_name(ctx, NULL, &got), ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "attn_module_kind_from_name: name is NULL");
    CHECK_STATUS(attn_module_kind_from_name(ctx, "mha", NULL), ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "attn_module_kind_from_name: out is NULL");
    /* no ctx: the status alone */
    CHECK_STATUS(attn_module_kind_from_name(NULL, "nope", &got), ATTN_ERR_NOT_FOUND);
    CHECK_STATUS(attn_module_kind_from_name(NULL, "gqa", &got), ATTN_OK);
    CHECK(got == ATTN_MODULE_GQA);
}

static void test_factory_errors(attn_ctx *ctx) {
    attn_rng *rng;
    CHECK_STATUS(attn_rng_new(ctx, 1, &rng), ATTN_OK);
    attn_module_config cfg = {.d_in = 6, .d_out = 6, .context_length = 4, .num_heads = 2};
    attn_module *m = (attn_module *)&cfg; /* any non-NULL: failures set it NULL */

    CHECK_STATUS(attn_module_new(ctx, (attn_module_kind)ATTN_MODULE_KIND_COUNT, &cfg, rng, &m),
                 ATTN_ERR_INVALID);
    CHECK(m == NULL);
    CHECK_MESSAGE(ctx, "attn_module_new: kind 10 is no module kind (0 to 9)");
    CHECK_STATUS(attn_module_new(ctx, (attn_module_kind)-3, &cfg, rng, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "kind -3 is no module kind");

    CHECK_STATUS(attn_module_new(NULL, ATTN_MODULE_MHA, &cfg, rng, &m), ATTN_ERR_NULL);
    CHECK_STATUS(attn_module_new(ctx, ATTN_MODULE_MHA, NULL, rng, &m), ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "attn_module_new: cfg is NULL");
    CHECK_STATUS(attn_module_new(ctx, ATTN_MODULE_MHA, &cfg, rng, NULL), ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "attn_module_new: out is NULL");
    m = (attn_module *)&cfg;
    CHECK_STATUS(attn_module_new(ctx, ATTN_MODULE_MHA, &cfg, NULL, &m), ATTN_ERR_NULL);
    CHECK(m == NULL);
    CHECK_MESSAGE(ctx, "attn_module_new: init_rng is NULL (MultiHeadAttention draws its weights");

    /* simple draws nothing: no rng is fine */
    CHECK_STATUS(attn_module_new(ctx, ATTN_MODULE_SIMPLE, &cfg, NULL, &m), ATTN_OK);
    CHECK(m && attn_module_get_kind(m) == ATTN_MODULE_SIMPLE && attn_module_d_out(m) == 6);
    attn_module_free(m);

    /* GPT-2 and simple keep their width: d_out 0 or d_in, nothing else */
    attn_module_config narrow = {.d_in = 6, .d_out = 5, .context_length = 4, .num_heads = 2};
    CHECK_STATUS(attn_module_new(ctx, ATTN_MODULE_GPT2, &narrow, rng, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "attn_module_new: CausalSelfAttention's d_out (5) must be 0 or d_in (6)");
    CHECK_STATUS(attn_module_new(ctx, ATTN_MODULE_SIMPLE, &narrow, rng, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "SimplifiedSelfAttention's d_out (5) must be 0 or d_in (6)");
    narrow.d_out = 0;
    CHECK_STATUS(attn_module_new(ctx, ATTN_MODULE_GPT2, &narrow, rng, &m), ATTN_OK);
    CHECK(m && attn_module_d_out(m) == 6);
    attn_module_free(m);

    /* the constructor's own checks come through, naming the values */
    attn_module_config heads = {.d_in = 6, .d_out = 6, .context_length = 4, .num_heads = 4};
    CHECK_STATUS(attn_module_new(ctx, ATTN_MODULE_MHA, &heads, rng, &m), ATTN_ERR_INVALID);
    CHECK(m == NULL);
    CHECK_MESSAGE(ctx, "(6)");
    CHECK_MESSAGE(ctx, "(4)");
    attn_module_config groups = {.d_in = 8, .d_out = 8, .num_heads = 4};
    CHECK_STATUS(attn_module_new(ctx, ATTN_MODULE_GQA, &groups, rng, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "num_kv_groups must be positive");
    attn_rng_free(rng);
}

/* The same module built by the kind's own constructor. */
static attn_status build_old(attn_ctx *ctx, attn_module_kind kind, const attn_module_config *c,
                             attn_rng *rng, attn_module **out) {
    attn_status st = ATTN_ERR_INVALID;
    *out = NULL;
    switch (kind) {
    case ATTN_MODULE_SIMPLE: {
        attn_simple *m = NULL;
        st = attn_simple_new(ctx, &(attn_simple_config){.d_in = c->d_in}, &m);
        *out = attn_simple_module(m);
        break;
    }
    case ATTN_MODULE_SA_V1: {
        attn_sa_v1 *m = NULL;
        attn_sa_v1_config cfg = {c->d_in, c->d_out, c->scale};
        st = attn_sa_v1_new(ctx, &cfg, rng, &m);
        *out = attn_sa_v1_module(m);
        break;
    }
    case ATTN_MODULE_SA_V2: {
        attn_sa_v2 *m = NULL;
        attn_sa_v2_config cfg = {c->d_in, c->d_out, c->qkv_bias, c->scale};
        st = attn_sa_v2_new(ctx, &cfg, rng, &m);
        *out = attn_sa_v2_module(m);
        break;
    }
    case ATTN_MODULE_CAUSAL: {
        attn_causal *m = NULL;
        attn_causal_config cfg = {c->d_in,     c->d_out,  c->context_length, c->dropout,
                                  c->qkv_bias, c->scale, c->mask};
        st = attn_causal_new(ctx, &cfg, rng, &m);
        *out = attn_causal_module(m);
        break;
    }
    case ATTN_MODULE_MHA_WRAPPER: {
        attn_mha_wrapper *m = NULL;
        attn_mha_wrapper_config cfg = {c->d_in,    c->d_out,    c->context_length,
                                       c->num_heads, c->dropout, c->qkv_bias,
                                       c->scale,   c->mask};
        st = attn_mha_wrapper_new(ctx, &cfg, rng, &m);
        *out = attn_mha_wrapper_module(m);
        break;
    }
    case ATTN_MODULE_MHA: {
        attn_mha *m = NULL;
        attn_mha_config cfg = {c->d_in,     c->d_out,  c->context_length, c->num_heads,
                               c->dropout, c->qkv_bias, c->scale,        c->mask};
        st = attn_mha_new(ctx, &cfg, rng, &m);
        *out = attn_mha_module(m);
        break;
    }
    case ATTN_MODULE_GPT2: {
        attn_gpt2 *m = NULL;
        attn_gpt2_config cfg = {c->d_in, c->num_heads, c->context_length, c->dropout, c->scale};
        st = attn_gpt2_new(ctx, &cfg, rng, &m);
        *out = attn_gpt2_module(m);
        break;
    }
    case ATTN_MODULE_GQA: {
        attn_gqa *m = NULL;
        attn_gqa_config cfg = {c->d_in,    c->d_out,    c->num_heads, c->num_kv_groups,
                               c->dropout, c->qkv_bias, c->scale};
        st = attn_gqa_new(ctx, &cfg, rng, &m);
        *out = attn_gqa_module(m);
        break;
    }
    case ATTN_MODULE_MLA: {
        attn_mla *m = NULL;
        attn_mla_config cfg = {c->d_in,    c->d_out,    c->num_heads, c->latent_dim,
                               c->dropout, c->qkv_bias, c->scale};
        st = attn_mla_new(ctx, &cfg, rng, &m);
        *out = attn_mla_module(m);
        break;
    }
    case ATTN_MODULE_SWA: {
        attn_swa *m = NULL;
        attn_swa_config cfg = {c->d_in,    c->d_out,    c->num_heads, c->sliding_window_size,
                               c->dropout, c->qkv_bias, c->scale};
        st = attn_swa_new(ctx, &cfg, rng, &m);
        *out = attn_swa_module(m);
        break;
    }
    }
    return st;
}

/* Every field set away from its default, where the kind reads it. */
static attn_module_config config_of(attn_module_kind kind) {
    attn_module_config c = {.d_in = 6, .d_out = 4, .context_length = 7, .num_heads = 2,
                            .num_kv_groups = 1, .latent_dim = 3, .sliding_window_size = 2,
                            .dropout = 0.25, .qkv_bias = true, .scale = 0.7,
                            .mask = ATTN_MASK_NONE}; /* a mask dropped on the way shows in y */
    if (kind == ATTN_MODULE_SIMPLE || kind == ATTN_MODULE_GPT2) c.d_out = c.d_in;
    if (kind == ATTN_MODULE_MHA_WRAPPER) c.num_heads = 3;
    return c;
}

static bool same_params(attn_module *a, attn_module *b) {
    size_t n = attn_module_param_count(a);
    bool same = n == attn_module_param_count(b) &&
                attn_module_num_scalars(a) == attn_module_num_scalars(b);
    for (size_t i = 0; same && i < n; i++) {
        attn_param pa, pb;
        same = attn_module_param_at(a, i, &pa) == ATTN_OK &&
               attn_module_param_at(b, i, &pb) == ATTN_OK && strcmp(pa.name, pb.name) == 0 &&
               pa.ndim == pb.ndim && pa.shape[0] == pb.shape[0] && pa.shape[1] == pb.shape[1] &&
               pa.numel == pb.numel && memcmp(pa.data, pb.data, pa.numel * sizeof(float)) == 0;
    }
    return same;
}

/* y of both modules for the same x (and, training, the same dropout seed):
 * true when every bit agrees. */
static bool same_output(attn_ctx *ctx, attn_module *a, attn_module *b, bool training) {
    const size_t B = 2, T = 5;
    size_t nx = B * T * attn_module_d_in(a), ny = B * T * attn_module_d_out(a);
    float *x = malloc(nx * sizeof *x), *ya = malloc(ny * sizeof *ya);
    float *yb = malloc(ny * sizeof *yb);
    attn_rng *data, *da, *db;
    bool ok = x && ya && yb && attn_rng_new(ctx, 99, &data) == ATTN_OK;
    if (ok) {
        ok = attn_rng_randn(data, x, nx) == ATTN_OK && attn_rng_new(ctx, 5, &da) == ATTN_OK &&
             attn_rng_new(ctx, 5, &db) == ATTN_OK;
        attn_rng_free(data);
    }
    if (ok) {
        ok = attn_module_set_training(a, training) == ATTN_OK &&
             attn_module_set_training(b, training) == ATTN_OK &&
             attn_module_forward(a, x, B, T, ya, da) == ATTN_OK &&
             attn_module_forward(b, x, B, T, yb, db) == ATTN_OK &&
             memcmp(ya, yb, ny * sizeof *ya) == 0;
        attn_rng_free(da);
        attn_rng_free(db);
    }
    free(x);
    free(ya);
    free(yb);
    return ok;
}

static void test_factory_equals_constructors(attn_ctx *ctx) {
    for (size_t i = 0; i < EXPECTED; i++) {
        attn_module_kind kind = expected[i].kind;
        attn_module_config cfg = config_of(kind);
        attn_rng *ra, *rb;
        CHECK_STATUS(attn_rng_new(ctx, 123 + i, &ra), ATTN_OK);
        CHECK_STATUS(attn_rng_new(ctx, 123 + i, &rb), ATTN_OK);
        attn_module *made = NULL, *old = NULL;
        CHECK_STATUS(attn_module_new(ctx, kind, &cfg, ra, &made), ATTN_OK);
        CHECK_STATUS(build_old(ctx, kind, &cfg, rb, &old), ATTN_OK);
        if (!made || !old) {
            fprintf(stderr, "%s: %s\n", expected[i].name, attn_ctx_last_error(ctx));
        } else {
            CHECK(attn_module_get_kind(made) == kind);
            CHECK(strcmp(attn_module_class_name(made), expected[i].class_name) == 0);
            CHECK(attn_module_d_in(made) == attn_module_d_in(old) &&
                  attn_module_d_out(made) == attn_module_d_out(old));
            if (!same_params(made, old))
                fprintf(stderr, "%s: parameters differ\n", expected[i].name);
            CHECK(same_params(made, old));
            /* both drew as many numbers: the next draws agree */
            float na, nb;
            CHECK(attn_rng_rand(ra, &na, 1) == ATTN_OK && attn_rng_rand(rb, &nb, 1) == ATTN_OK);
            CHECK(memcmp(&na, &nb, sizeof na) == 0);
            if (!same_output(ctx, made, old, false))
                fprintf(stderr, "%s: eval outputs differ\n", expected[i].name);
            CHECK(same_output(ctx, made, old, false));
            CHECK(same_output(ctx, made, old, true));
        }
        attn_module_free(made);
        attn_module_free(old);
        attn_rng_free(ra);
        attn_rng_free(rb);
    }
}

int main(void) {
    attn_ctx *ctx;
    if (attn_ctx_new(NULL, &ctx) != ATTN_OK) return 1;
    test_names(ctx);
    test_bad_names(ctx);
    test_factory_errors(ctx);
    test_factory_equals_constructors(ctx);
    attn_ctx_free(ctx);
    return check_summary();
}
