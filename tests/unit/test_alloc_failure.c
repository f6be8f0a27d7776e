/*
 * test_alloc_failure.c — every allocation the library makes, failed in turn.
 *
 * Built only with -DATTN_ALLOC_FAILURE_INJECTION=ON (make sanitize builds it
 * so, under ASan + UBSan, whose leak checker runs at exit). For each
 * operation below, the sweep runs it with the allocator's n-th call failing,
 * for n = 1, 2, ... until a run makes fewer than n calls and succeeds. Every
 * failed run must:
 *   - return ATTN_ERR_NO_MEMORY with a message that says what could not be
 *     allocated (and a constructor must set *out to NULL);
 *   - leave what the caller sees as it was: y, dx and every gradient
 *     bit for bit, the rng's position (the next draws are those of an rng
 *     that was never passed), a module's weights, an attn_npy zeroed;
 *   - leave the object usable: the same call without a failure then gives
 *     the results of a fresh object;
 *   - leak nothing (LeakSanitizer, at exit).
 * The operations: constructing every module, its forward (eval without
 * gradients; training with dropout and gradients; traced), its backward,
 * attn_sdpa_forward/backward (and their float64 twins) over the attention
 * contract's options (GQA/MQA, v_head_dim, alignments, window, softcap,
 * ALiBi, sinks with sinks_grad, varlen, strides, Philox dropout), the
 * .npy and safetensors readers and writers, attn_ctx_new and attn_rng_new,
 * and the training model (construction, forward, backward) and optimizer,
 * mask descriptions and block maps (from a description, from lists, from a
 * dense bool or additive mask, from a callback); attn_sdpa_forward_16 and
 * attn_sdpa_backward_16 (bf16), attn_sdpa_backward_dlse (float32, bf16), a
 * bias tensor and a relative table with their gradients; the generating
 * models: attn_lm_load, _load_as and _load_ex (float32, bf16 and f16 files,
 * a directory with config.json), attn_lm_save over a file, their caches
 * (attn_lm_cache_new; bf16, int8, f8 K/V), attn_lm_forward (no cache,
 * last_only, a prefill, a paged int8 decode: a layer that fails may leave
 * the earlier layers appended, as attn.h says); the KV cache's coded
 * appends (int8, int4, bf16), draft trees and verified branches; the
 * tokenizer (load, encode), attn_text_dataset_new and _encode,
 * attn_data_loader_new, pretraining (attn_pretrain_new; _next at a step,
 * an evaluation and a sample, after which a failed run resumes from the
 * checkpoint before it; _save over a checkpoint; _resume), attn_model_save
 * and _load, the int32 .npy readers, attn_safetensors_write and
 * _write_params over a file, attn_file_open / _write / _commit, attn_gemm,
 * attn_matmul and attn_gemm_16 (whose pack buffers have a fallback),
 * attn_sample (top_p) and attn_sample_book. The rng's randperm and
 * multinomial, the tokenizer's decode and the loader's begin and batch
 * allocate nothing and are not swept.
 * The closing table gives the allocations swept per operation.
 */
#define _POSIX_C_SOURCE 200809L

#include "attn.h"
#include "check.h"
#include "internal.h"
#include "half.h"
#include "mask/mask_internal.h"

#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef ATTN_ALLOC_FAILURE_INJECTION
#error "build with -DATTN_ALLOC_FAILURE_INJECTION=ON"
#endif

#define SENTINEL 1234.5f
#define MAX_CALLS 10000 /* a runaway sweep is a failure, not a hang */

static attn_ctx *g_ctx;
static char g_dir[64];

/* ---- the sweep ------------------------------------------------------------ */

/* One operation under test: setup (not counted), run (swept), verify after a
 * failed run, teardown. state is the operation's own. */
typedef struct sweep_op {
    const char *name;
    void (*setup)(void *state);
    attn_status (*run)(void *state);
    void (*verify_failed)(void *state); /* outputs untouched, object usable */
    void (*verify_ok)(void *state);     /* the run that succeeded */
    void (*teardown)(void *state);
    void *state;
    attn_ctx **ctx; /* where the message goes (read after the run); NULL: g_ctx */
    bool no_ctx;   /* the operation has no ctx to report in (attn_ctx_new) */
} sweep_op;

typedef struct sweep_row {
    char name[96];
    size_t calls;
} sweep_row;

static sweep_row g_rows[256];
static size_t g_num_rows;

static bool message_says_memory(const char *msg) {
    return strstr(msg, "memory") || strstr(msg, "allocate") || strstr(msg, "cannot keep");
}

/* Set while verifying a run in which an allocation with a fallback failed:
 * the SGEMM then ran on the reference kernel, whose sums are rounded
 * otherwise, so results are compared within a tolerance, not bit for bit. */
static bool g_fell_back;
static size_t g_fallbacks;

static void sweep(const sweep_op *op) {
    size_t n = 1, calls = 0;
    for (; n < MAX_CALLS; n++) {
        if (op->setup) op->setup(op->state);
        attn_alloc_fail_at(n);
        attn_status st = op->run(op->state);
        attn_ctx *ctx = op->ctx ? *op->ctx : g_ctx;
        calls = attn_alloc_calls();
        g_fell_back = attn_alloc_failed_with_fallback();
        attn_alloc_fail_at(0);
        if (calls < n || g_fell_back) {
            /* no call failed, or one whose caller falls back: the operation
             * must have succeeded */
            CHECK_STATUS(st, ATTN_OK);
            if (st != ATTN_OK)
                fprintf(stderr, "  %s: %s with allocation %zu failed%s: %s\n", op->name,
                        attn_status_name(st), n, g_fell_back ? " (it has a fallback)" : "",
                        attn_ctx_last_error(ctx));
            if (op->verify_ok) op->verify_ok(op->state);
            if (op->teardown) op->teardown(op->state);
            g_fallbacks += g_fell_back;
            g_fell_back = false;
            if (calls < n) break;
            continue;
        }
        const char *msg = op->no_ctx ? "(no ctx: memory)" : attn_ctx_last_error(ctx);
        if (st != ATTN_ERR_NO_MEMORY || !message_says_memory(msg))
            fprintf(stderr, "  %s: allocation %zu failed: %s \"%s\"\n", op->name, n,
                    attn_status_name(st), msg);
        CHECK_STATUS(st, ATTN_ERR_NO_MEMORY);
        CHECK(message_says_memory(msg));
        if (op->verify_failed) op->verify_failed(op->state);
        if (op->teardown) op->teardown(op->state);
    }
    CHECK(n < MAX_CALLS);
    CHECK(calls > 0); /* every operation here allocates */
    if (g_num_rows < sizeof g_rows / sizeof g_rows[0]) {
        sweep_row *row = &g_rows[g_num_rows++];
        snprintf(row->name, sizeof row->name, "%s", op->name);
        row->calls = calls;
    }
}

/* ---- modules ------------------------------------------------------------- */

typedef struct spec {
    attn_module_kind kind;
    const char *label;
    size_t d_in, d_out, context, heads;
    double dropout;
    bool bias;
    attn_mask_method mask;
} spec;

static const spec specs[] = {
    {ATTN_MODULE_SIMPLE, "simple", 4, 4, 0, 0, 0.0, false, ATTN_MASK_NEG_INF},
    {ATTN_MODULE_SA_V1, "sa_v1", 4, 3, 0, 0, 0.0, false, ATTN_MASK_NEG_INF},
    {ATTN_MODULE_SA_V2, "sa_v2", 4, 3, 0, 0, 0.0, true, ATTN_MASK_NEG_INF},
    {ATTN_MODULE_CAUSAL, "causal", 4, 3, 5, 0, 0.25, true, ATTN_MASK_RENORMALIZE},
    {ATTN_MODULE_MHA_WRAPPER, "mha_wrapper", 4, 2, 5, 3, 0.25, true, ATTN_MASK_NEG_INF},
    {ATTN_MODULE_MHA, "mha", 4, 6, 5, 2, 0.25, false, ATTN_MASK_NEG_INF},
    {ATTN_MODULE_GPT2, "gpt2", 6, 6, 5, 3, 0.25, true, ATTN_MASK_NEG_INF},
    {ATTN_MODULE_GQA, "gqa", 4, 8, 0, 4, 0.25, true, ATTN_MASK_NEG_INF},
    {ATTN_MODULE_MLA, "mla", 4, 6, 0, 2, 0.25, true, ATTN_MASK_NEG_INF},
    {ATTN_MODULE_SWA, "swa", 4, 6, 0, 3, 0.25, false, ATTN_MASK_NEG_INF},
};
#define NUM_SPECS (sizeof specs / sizeof specs[0])

static attn_status build(attn_ctx *ctx, attn_rng *rng, const spec *s, attn_module **out) {
    attn_status st = ATTN_ERR_INVALID;
    switch (s->kind) {
    case ATTN_MODULE_SIMPLE: {
        attn_simple *m = (attn_simple *)&g_ctx; /* stale: the constructor must clear it */
        st = attn_simple_new(ctx, &(attn_simple_config){.d_in = s->d_in}, &m);
        *out = attn_simple_module(m);
        break;
    }
    case ATTN_MODULE_SA_V1: {
        attn_sa_v1 *m = (attn_sa_v1 *)&g_ctx;
        st = attn_sa_v1_new(ctx, &(attn_sa_v1_config){.d_in = s->d_in, .d_out = s->d_out}, rng, &m);
        *out = attn_sa_v1_module(m);
        break;
    }
    case ATTN_MODULE_SA_V2: {
        attn_sa_v2 *m = (attn_sa_v2 *)&g_ctx;
        attn_sa_v2_config cfg = {.d_in = s->d_in, .d_out = s->d_out, .qkv_bias = s->bias};
        st = attn_sa_v2_new(ctx, &cfg, rng, &m);
        *out = attn_sa_v2_module(m);
        break;
    }
    case ATTN_MODULE_CAUSAL: {
        attn_causal *m = (attn_causal *)&g_ctx;
        attn_causal_config cfg = {.d_in = s->d_in, .d_out = s->d_out, .context_length = s->context,
                                  .dropout = s->dropout, .qkv_bias = s->bias, .mask = s->mask};
        st = attn_causal_new(ctx, &cfg, rng, &m);
        *out = attn_causal_module(m);
        break;
    }
    case ATTN_MODULE_MHA_WRAPPER: {
        attn_mha_wrapper *m = (attn_mha_wrapper *)&g_ctx;
        attn_mha_wrapper_config cfg = {.d_in = s->d_in, .d_out = s->d_out,
                                       .context_length = s->context, .num_heads = s->heads,
                                       .dropout = s->dropout, .qkv_bias = s->bias,
                                       .mask = s->mask};
        st = attn_mha_wrapper_new(ctx, &cfg, rng, &m);
        *out = attn_mha_wrapper_module(m);
        break;
    }
    case ATTN_MODULE_MHA: {
        attn_mha *m = (attn_mha *)&g_ctx;
        attn_mha_config cfg = {.d_in = s->d_in, .d_out = s->d_out, .context_length = s->context,
                               .num_heads = s->heads, .dropout = s->dropout,
                               .qkv_bias = s->bias, .mask = s->mask};
        st = attn_mha_new(ctx, &cfg, rng, &m);
        *out = attn_mha_module(m);
        break;
    }
    case ATTN_MODULE_GPT2: {
        attn_gpt2 *m = (attn_gpt2 *)&g_ctx;
        attn_gpt2_config cfg = {.n_embd = s->d_in, .n_head = s->heads, .block_size = s->context,
                                .dropout = s->dropout};
        st = attn_gpt2_new(ctx, &cfg, rng, &m);
        *out = attn_gpt2_module(m);
        break;
    }
    case ATTN_MODULE_GQA: { /* two query heads per KV head */
        attn_gqa *m = (attn_gqa *)&g_ctx;
        attn_gqa_config cfg = {.d_in = s->d_in, .d_out = s->d_out, .num_heads = s->heads,
                               .num_kv_groups = s->heads / 2, .dropout = s->dropout,
                               .qkv_bias = s->bias};
        st = attn_gqa_new(ctx, &cfg, rng, &m);
        *out = attn_gqa_module(m);
        break;
    }
    case ATTN_MODULE_MLA: { /* the default latent_dim, 16 */
        attn_mla *m = (attn_mla *)&g_ctx;
        attn_mla_config cfg = {.d_in = s->d_in, .d_out = s->d_out, .num_heads = s->heads,
                               .dropout = s->dropout, .qkv_bias = s->bias};
        st = attn_mla_new(ctx, &cfg, rng, &m);
        *out = attn_mla_module(m);
        break;
    }
    case ATTN_MODULE_SWA: { /* a window of 2 of the 4 tokens */
        attn_swa *m = (attn_swa *)&g_ctx;
        attn_swa_config cfg = {.d_in = s->d_in, .d_out = s->d_out, .num_heads = s->heads,
                               .sliding_window_size = 2, .dropout = s->dropout,
                               .qkv_bias = s->bias};
        st = attn_swa_new(ctx, &cfg, rng, &m);
        *out = attn_swa_module(m);
        break;
    }
    }
    return st;
}

enum { B = 2, T = 4, MAX_W = 8 };

typedef enum pass_mode {
    MODE_EVAL,  /* eval mode, gradients disabled: nothing kept */
    MODE_TRAIN, /* training mode with dropout, gradients enabled */
    MODE_TRACE, /* training mode, traced with data */
} pass_mode;

typedef struct module_state {
    const spec *s;
    pass_mode mode;
    attn_ctx_config ctx_cfg; /* each run gets a fresh ctx of this config, so
                              * the ctx's SGEMM scratch is allocated in it */
    attn_ctx *ctx;
    attn_rng *rng;   /* init and dropout draws */
    attn_module *m;  /* under test */
    attn_module *ref; /* built and run the same way, never failed */
    float x[B * T * MAX_W], y[B * T * MAX_W], dy[B * T * MAX_W], dx[B * T * MAX_W];
    float want_y[B * T * MAX_W], want_dx[B * T * MAX_W];
    float *grads_before; /* every gradient, before the swept backward */
    attn_status built;
} module_state;

static size_t out_width(const module_state *st) { return attn_module_d_out(st->m); }

static void fill(float *v, size_t n, float base) {
    for (size_t i = 0; i < n; i++) v[i] = base + 0.37f * (float)(i % 7) - 0.11f * (float)(i % 3);
}

/* The rng's next draws equal those of a fresh rng seeded with seed that drew
 * `drawn` values: it is where it should be. */
static bool rng_at(attn_rng *rng, uint64_t seed, size_t drawn) {
    attn_rng *fresh;
    if (attn_rng_new(NULL, seed, &fresh) != ATTN_OK) return false;
    uint32_t a = 0, b = 0;
    for (size_t i = 0; i < drawn; i++) attn_rng_next_u32(fresh, &b);
    bool same = true;
    for (int i = 0; i < 4; i++) {
        attn_rng_next_u32(rng, &a);
        attn_rng_next_u32(fresh, &b);
        same = same && a == b;
    }
    attn_rng_free(fresh);
    return same;
}

/* a == b bit for bit, or within 1e-4 relative after a fallback. */
static bool same_floats(const float *a, const float *b, size_t n) {
    if (!g_fell_back) return memcmp(a, b, n * sizeof *a) == 0;
    double diff = 0.0, norm = 0.0;
    for (size_t i = 0; i < n; i++) {
        diff += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        norm += (double)b[i] * b[i];
    }
    return sqrt(diff) <= 1e-4 * sqrt(norm) + 1e-30;
}

static void set_mode(attn_module *m, pass_mode mode) {
    attn_module_set_training(m, mode != MODE_EVAL);
    attn_module_set_grad_enabled(m, mode != MODE_EVAL);
}

static size_t all_grads(attn_module *m, float *out) {
    size_t n = 0;
    for (size_t i = 0; i < attn_module_param_count(m); i++) {
        attn_param p;
        attn_module_param_at(m, i, &p);
        if (out) memcpy(out + n, p.grad, p.numel * sizeof *out);
        n += p.numel;
    }
    return n;
}

static bool same_weights(attn_module *a, attn_module *b) {
    for (size_t i = 0; i < attn_module_param_count(a); i++) {
        attn_param p, q;
        attn_module_param_at(a, i, &p);
        attn_module_param_at(b, i, &q);
        if (p.numel != q.numel || memcmp(p.data, q.data, p.numel * sizeof *p.data) != 0) return false;
    }
    return true;
}

static void trace_sink(void *user, const char *module, const char *name, size_t ndim,
                       const size_t *shape, const float *data) {
    (void)user, (void)module, (void)name, (void)ndim, (void)shape, (void)data;
}

/* -- construction -- */

static void construct_setup(void *p) {
    module_state *st = p;
    attn_rng_manual_seed(st->rng, 5);
    st->m = NULL;
}

static attn_status construct_run(void *p) {
    module_state *st = p;
    return build(g_ctx, st->rng, st->s, &st->m);
}

static void construct_failed(void *p) {
    module_state *st = p;
    CHECK(st->m == NULL);
    CHECK(rng_at(st->rng, 5, 0)); /* no weight drawn */
}

static void construct_ok(void *p) {
    module_state *st = p;
    attn_module *fresh = NULL;
    attn_rng *rng;
    attn_rng_new(NULL, 5, &rng);
    CHECK_STATUS(build(g_ctx, rng, st->s, &fresh), ATTN_OK);
    CHECK(st->m && fresh && same_weights(st->m, fresh));
    attn_module_free(fresh);
    attn_rng_free(rng);
}

static void module_teardown(void *p) {
    module_state *st = p;
    attn_module_free(st->m);
    attn_module_free(st->ref);
    if (st->ctx != g_ctx) attn_ctx_free(st->ctx);
    st->ctx = g_ctx;
    free(st->grads_before);
    st->m = st->ref = NULL;
    st->grads_before = NULL;
}

/* -- forward -- */

static void forward_setup(void *p) {
    module_state *st = p;
    CHECK_STATUS(attn_ctx_new(&st->ctx_cfg, &st->ctx), ATTN_OK);
    attn_rng_manual_seed(st->rng, 9);
    CHECK_STATUS(build(st->ctx, st->rng, st->s, &st->m), ATTN_OK);
    attn_rng_manual_seed(st->rng, 9);
    CHECK_STATUS(build(st->ctx, st->rng, st->s, &st->ref), ATTN_OK);
    set_mode(st->m, st->mode);
    set_mode(st->ref, st->mode);
    fill(st->x, B * T * st->s->d_in, 0.2f);
    for (size_t i = 0; i < B * T * MAX_W; i++) st->y[i] = SENTINEL;
    attn_rng_manual_seed(st->rng, 77); /* dropout draws from here */
}

static attn_status forward_run(void *p) {
    module_state *st = p;
    return attn_module_forward(st->m, st->x, B, T, st->y, st->rng);
}

/* The reference forward: the result a forward must give from seed 77. */
static void reference_forward(module_state *st) {
    attn_rng *rng;
    attn_rng_new(NULL, 77, &rng);
    CHECK_STATUS(attn_module_forward(st->ref, st->x, B, T, st->want_y, rng), ATTN_OK);
    attn_rng_free(rng);
}

static void forward_failed(void *p) {
    module_state *st = p;
    bool untouched = true;
    for (size_t i = 0; i < B * T * MAX_W; i++) untouched = untouched && st->y[i] == SENTINEL;
    CHECK(untouched);
    CHECK(rng_at(st->rng, 77, 0)); /* no dropout drawn */
    /* A failed forward leaves nothing to differentiate. */
    if (st->mode != MODE_EVAL)
        CHECK_STATUS(attn_module_backward(st->m, st->dy, B, T, NULL), ATTN_ERR_INVALID);
    /* The module works afterwards, as a fresh one does. */
    attn_rng_manual_seed(st->rng, 77);
    CHECK_STATUS(attn_module_forward(st->m, st->x, B, T, st->y, st->rng), ATTN_OK);
    reference_forward(st);
    CHECK(memcmp(st->y, st->want_y, B * T * out_width(st) * sizeof(float)) == 0);
}

static void forward_ok(void *p) {
    module_state *st = p;
    reference_forward(st);
    CHECK(same_floats(st->y, st->want_y, B * T * out_width(st)));
}

/* -- backward -- */

static void backward_setup(void *p) {
    module_state *st = p;
    forward_setup(p);
    CHECK_STATUS(attn_module_forward(st->m, st->x, B, T, st->y, st->rng), ATTN_OK);
    fill(st->dy, B * T * out_width(st), -0.3f);
    for (size_t i = 0; i < B * T * MAX_W; i++) st->dx[i] = SENTINEL;
    /* gradients that a backward adds to: not zero, to see any partial sum */
    for (size_t i = 0; i < attn_module_param_count(st->m); i++) {
        attn_param q;
        attn_module_param_at(st->m, i, &q);
        for (size_t j = 0; j < q.numel; j++) q.grad[j] = 0.5f + (float)j;
    }
    size_t n = all_grads(st->m, NULL);
    st->grads_before = malloc((n ? n : 1) * sizeof(float));
    all_grads(st->m, st->grads_before);
}

static attn_status backward_run(void *p) {
    module_state *st = p;
    return attn_module_backward(st->m, st->dy, B, T, st->dx);
}

static bool grads_unchanged(module_state *st) {
    size_t n = all_grads(st->m, NULL);
    float *now = malloc((n ? n : 1) * sizeof *now);
    if (!now) return false;
    all_grads(st->m, now);
    bool same = memcmp(now, st->grads_before, n * sizeof *now) == 0;
    free(now);
    return same;
}

/* The reference backward: what a backward adds, from the same forward. */
static void reference_backward(module_state *st, float *ref_grads) {
    attn_rng *rng;
    attn_rng_new(NULL, 77, &rng);
    CHECK_STATUS(attn_module_forward(st->ref, st->x, B, T, st->want_y, rng), ATTN_OK);
    attn_rng_free(rng);
    for (size_t i = 0; i < attn_module_param_count(st->ref); i++) {
        attn_param q;
        attn_module_param_at(st->ref, i, &q);
        for (size_t j = 0; j < q.numel; j++) q.grad[j] = 0.5f + (float)j;
    }
    CHECK_STATUS(attn_module_backward(st->ref, st->dy, B, T, st->want_dx), ATTN_OK);
    all_grads(st->ref, ref_grads);
}

static void backward_compare(module_state *st) {
    size_t n = all_grads(st->m, NULL);
    float *got = malloc((n ? n : 1) * sizeof *got), *want = malloc((n ? n : 1) * sizeof *want);
    if (!got || !want) {
        CHECK(false);
    } else {
        reference_backward(st, want);
        all_grads(st->m, got);
        CHECK(same_floats(got, want, n));
        CHECK(same_floats(st->dx, st->want_dx, B * T * st->s->d_in));
    }
    free(got);
    free(want);
}

static void backward_failed(void *p) {
    module_state *st = p;
    bool untouched = true;
    for (size_t i = 0; i < B * T * MAX_W; i++) untouched = untouched && st->dx[i] == SENTINEL;
    CHECK(untouched);
    CHECK(grads_unchanged(st));
    /* The saved forward is still there: the backward runs now, and adds
     * what a fresh module's backward adds. */
    CHECK_STATUS(attn_module_backward(st->m, st->dy, B, T, st->dx), ATTN_OK);
    backward_compare(st);
}

static void backward_ok(void *p) { backward_compare(p); }

static void sweep_modules(void) {
    for (size_t k = 0; k < NUM_SPECS; k++) {
        module_state *st = calloc(1, sizeof *st);
        st->s = &specs[k];
        st->ctx = g_ctx;
        attn_rng_new(g_ctx, 1, &st->rng);
        char name[80];

        snprintf(name, sizeof name, "%s: construct", st->s->label);
        sweep(&(sweep_op){.name = name, .setup = construct_setup, .run = construct_run,
                          .verify_failed = construct_failed, .verify_ok = construct_ok,
                          .teardown = module_teardown, .state = st});

        /* the fast kernels (a ctx's default) and the reference ones */
        for (int kernels = 0; kernels < 2; kernels++) {
            attn_ctx_config cfg = {.kernels = kernels ? ATTN_KERNELS_REFERENCE : ATTN_KERNELS_AUTO};
            const char *set = kernels ? "reference" : "fast";
            static const char *const mode_names[] = {"forward (eval, no grad)",
                                                     "forward (train, dropout, grad)",
                                                     "forward (traced)"};
            for (pass_mode mode = MODE_EVAL; mode <= MODE_TRACE; mode++) {
                if (mode == MODE_TRACE && kernels) continue; /* tracing runs the reference */
                st->mode = mode;
                st->ctx_cfg = cfg;
                if (mode == MODE_TRACE) st->ctx_cfg.trace = trace_sink;
                snprintf(name, sizeof name, "%s: %s%s%s", st->s->label, mode_names[mode],
                         mode == MODE_TRACE ? "" : ", ", mode == MODE_TRACE ? "" : set);
                sweep(&(sweep_op){.name = name, .setup = forward_setup, .run = forward_run,
                                  .verify_failed = forward_failed, .verify_ok = forward_ok,
                                  .teardown = module_teardown, .state = st, .ctx = &st->ctx});
            }
            st->mode = MODE_TRAIN;
            st->ctx_cfg = cfg;
            snprintf(name, sizeof name, "%s: backward, %s", st->s->label, set);
            sweep(&(sweep_op){.name = name, .setup = backward_setup, .run = backward_run,
                              .verify_failed = backward_failed, .verify_ok = backward_ok,
                              .teardown = module_teardown, .state = st, .ctx = &st->ctx});
        }
        attn_rng_free(st->rng);
        free(st);
    }
}

/* ---- attn_sdpa_forward / attn_sdpa_backward: the attention contract ------- */

/* Three configs of the contract's options, each swept on the fused and the
 * reference kernels, and through the float64 calls: forward (out, lse, the rng's Philox offset, the drawn
 * record untouched by a failure) and backward (dq, dk, dv, sinks_grad). */
enum { SDPA_MAX = 256, SDPA_HEADS = 4 };

typedef struct sdpa_state {
    int variant;
    attn_ctx_config ctx_cfg;
    attn_ctx *ctx;
    attn_rng *rng; /* Philox: dropout draws */
    attn_sdpa_config cfg;
    int32_t cu_q[3], cu_kv[3];
    size_t nq, nk, nv, nout, nlse; /* floats in each tensor */
    float q[SDPA_MAX], k[SDPA_MAX], v[SDPA_MAX], dout[SDPA_MAX];
    float alibi[SDPA_HEADS], sinks[SDPA_HEADS];
    float out[SDPA_MAX], lse[SDPA_MAX], dq[SDPA_MAX], dk[SDPA_MAX], dv[SDPA_MAX];
    float dsinks[SDPA_HEADS];
    attn_sdpa_dropout drawn;
    float want_out[SDPA_MAX], want_lse[SDPA_MAX], want_dq[SDPA_MAX], want_dk[SDPA_MAX],
        want_dv[SDPA_MAX], want_dsinks[SDPA_HEADS];
    attn_sdpa_dropout want_drawn;
} sdpa_state;

static const char *const sdpa_variant_names[] = {
    "gqa+v_head_dim+window+softcap+alibi+sinks+dropout",
    "varlen+mqa+q_offset+window+sinks+dropout",
    "top-left+causal+softcap+alibi+strides",
};
#define SDPA_VARIANTS (sizeof sdpa_variant_names / sizeof sdpa_variant_names[0])
static const attn_sdpa_dropout SDPA_DRAWN_SENTINEL = {0x5eed5eed5eedULL, 0x0ff5e70ff5e7ULL};

static void sdpa_configure(sdpa_state *st) {
    attn_sdpa_config *c = &st->cfg;
    *c = (attn_sdpa_config){0};
    size_t H = SDPA_HEADS, Hkv, D = 4, Dv, total_q, total_kv;
    if (st->variant == 0) {
        /* dense (B, T, H, hd) contiguous: zero strides */
        Hkv = 2, Dv = 3;
        *c = (attn_sdpa_config){.batch = 2, .heads = H, .kv_heads = Hkv, .q_tokens = 5,
                                .kv_tokens = 7, .head_dim = D, .v_head_dim = Dv, .causal = true,
                                .window = true, .window_left = 3, .window_right = 1,
                                .softcap = 2.5, .alibi_slopes = st->alibi, .sinks = st->sinks,
                                .dropout = 0.2};
        total_q = 2 * 5, total_kv = 2 * 7;
    } else if (st->variant == 1) {
        /* packed: (total, H, hd), explicit strides */
        Hkv = 1, Dv = D;
        st->cu_q[0] = 0, st->cu_q[1] = 3, st->cu_q[2] = 8;
        st->cu_kv[0] = 0, st->cu_kv[1] = 6, st->cu_kv[2] = 10;
        *c = (attn_sdpa_config){.batch = 2, .heads = H, .kv_heads = Hkv, .q_tokens = 5,
                                .kv_tokens = 6, .head_dim = D, .align = ATTN_ALIGN_OFFSET,
                                .q_offset = 1, .window = true, .window_left = 2,
                                .window_right = -1, .sinks = st->sinks, .dropout = 0.3,
                                .cu_seqlens_q = st->cu_q, .cu_seqlens_kv = st->cu_kv};
        c->q_strides[1] = H * D, c->q_strides[2] = D;
        c->kv_strides[1] = Hkv * D, c->kv_strides[2] = D;
        c->v_strides[1] = Hkv * Dv, c->v_strides[2] = Dv;
        c->out_strides[1] = H * Dv, c->out_strides[2] = Dv;
        total_q = 8, total_kv = 10;
    } else {
        /* (B, H, T, hd) as (b, t, h) strides, as attn sdpa passes them */
        Hkv = H, Dv = D;
        size_t nb = 2, nt = 4, ns = 6;
        *c = (attn_sdpa_config){.batch = nb, .heads = H, .q_tokens = nt, .kv_tokens = ns,
                                .head_dim = D, .align = ATTN_ALIGN_TOP_LEFT, .causal = true,
                                .softcap = 1.5, .alibi_slopes = st->alibi, .scale = 0.7};
        c->q_strides[0] = H * nt * D, c->q_strides[1] = D, c->q_strides[2] = nt * D;
        c->kv_strides[0] = H * ns * D, c->kv_strides[1] = D, c->kv_strides[2] = ns * D;
        c->out_strides[0] = H * nt * D, c->out_strides[1] = D, c->out_strides[2] = nt * D;
        total_q = nb * nt, total_kv = nb * ns;
    }
    st->nq = total_q * H * D;
    st->nk = total_kv * Hkv * D;
    st->nv = total_kv * Hkv * Dv;
    st->nout = total_q * H * Dv;
    st->nlse = total_q * H;
    CHECK(st->nq <= SDPA_MAX && st->nk <= SDPA_MAX && st->nout <= SDPA_MAX);
    fill(st->q, st->nq, -0.4f);
    fill(st->k, st->nk, -0.3f);
    fill(st->v, st->nv, 0.1f);
    fill(st->dout, st->nout, -0.2f);
    for (size_t h = 0; h < H; h++) {
        st->alibi[h] = 0.5f / (float)(1u << h);
        st->sinks[h] = -0.5f + 0.4f * (float)h;
    }
}

static void sentinels(float *v, size_t n) {
    for (size_t i = 0; i < n; i++) v[i] = SENTINEL;
}

static bool all_sentinel(const float *v, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (v[i] != SENTINEL) return false;
    return true;
}

static bool same_drawn(attn_sdpa_dropout a, attn_sdpa_dropout b) {
    return a.seed == b.seed && a.offset == b.offset;
}

static attn_status sdpa_forward_into(sdpa_state *st, attn_rng *rng, float *out, float *lse,
                                     attn_sdpa_dropout *drawn) {
    return attn_sdpa_forward(st->ctx, &st->cfg, st->q, st->k, st->v, out, lse, rng, drawn);
}

static attn_status sdpa_backward_into(sdpa_state *st, const float *out, const float *lse,
                                      const attn_sdpa_dropout *drawn, float *dq, float *dk,
                                      float *dv, float *dsinks) {
    attn_sdpa_config c = st->cfg;
    c.sinks_grad = c.sinks ? dsinks : NULL;
    return attn_sdpa_backward(st->ctx, &c, st->q, st->k, st->v, out, lse, st->dout, dq, dk, dv,
                              c.dropout > 0.0 ? drawn : NULL);
}

/* What a forward (and backward) gives from a fresh Philox rng seeded 77:
 * the want_* buffers, never failed. */
static void sdpa_reference(sdpa_state *st, bool backward) {
    attn_rng *rng;
    CHECK_STATUS(attn_rng_new(NULL, 77, &rng), ATTN_OK);
    attn_rng_set_bernoulli_method(rng, ATTN_BERNOULLI_PHILOX);
    sentinels(st->want_out, SDPA_MAX);
    sentinels(st->want_lse, SDPA_MAX);
    st->want_drawn = SDPA_DRAWN_SENTINEL;
    CHECK_STATUS(sdpa_forward_into(st, rng, st->want_out, st->want_lse, &st->want_drawn), ATTN_OK);
    attn_rng_free(rng);
    if (!backward) return;
    sentinels(st->want_dq, SDPA_MAX);
    sentinels(st->want_dk, SDPA_MAX);
    sentinels(st->want_dv, SDPA_MAX);
    sentinels(st->want_dsinks, SDPA_HEADS);
    CHECK_STATUS(sdpa_backward_into(st, st->want_out, st->want_lse, &st->want_drawn, st->want_dq,
                                    st->want_dk, st->want_dv, st->want_dsinks),
                 ATTN_OK);
}

static void sdpa_forward_setup(void *p) {
    sdpa_state *st = p;
    CHECK_STATUS(attn_ctx_new(&st->ctx_cfg, &st->ctx), ATTN_OK);
    sdpa_configure(st);
    attn_rng_manual_seed(st->rng, 77); /* Philox offset 0 */
    sentinels(st->out, SDPA_MAX);
    sentinels(st->lse, SDPA_MAX);
    st->drawn = SDPA_DRAWN_SENTINEL;
}

static attn_status sdpa_forward_run(void *p) {
    sdpa_state *st = p;
    return sdpa_forward_into(st, st->cfg.dropout > 0.0 ? st->rng : NULL, st->out, st->lse,
                             &st->drawn);
}

static void sdpa_forward_compare(sdpa_state *st) {
    sdpa_reference(st, false);
    CHECK(same_floats(st->out, st->want_out, SDPA_MAX));
    CHECK(same_floats(st->lse, st->want_lse, SDPA_MAX));
    CHECK(same_drawn(st->drawn, st->want_drawn));
}

static void sdpa_forward_failed(void *p) {
    sdpa_state *st = p;
    CHECK(all_sentinel(st->out, SDPA_MAX));
    CHECK(all_sentinel(st->lse, SDPA_MAX));
    CHECK(same_drawn(st->drawn, SDPA_DRAWN_SENTINEL));
    /* The rng did not move: the same call now draws what a fresh rng's
     * first call draws (Philox offset 0), and gives its results. */
    CHECK_STATUS(sdpa_forward_run(st), ATTN_OK);
    sdpa_forward_compare(st);
}

static void sdpa_forward_ok(void *p) { sdpa_forward_compare(p); }

static void sdpa_backward_setup(void *p) {
    sdpa_state *st = p;
    sdpa_forward_setup(p);
    CHECK_STATUS(sdpa_forward_run(st), ATTN_OK);
    /* a fresh ctx, whose workspace the backward takes itself: the forward's
     * may already be large enough for it, on some kernel sets */
    attn_ctx_free(st->ctx);
    CHECK_STATUS(attn_ctx_new(&st->ctx_cfg, &st->ctx), ATTN_OK);
    sentinels(st->dq, SDPA_MAX);
    sentinels(st->dk, SDPA_MAX);
    sentinels(st->dv, SDPA_MAX);
    sentinels(st->dsinks, SDPA_HEADS);
}

static attn_status sdpa_backward_run(void *p) {
    sdpa_state *st = p;
    return sdpa_backward_into(st, st->out, st->lse, &st->drawn, st->dq, st->dk, st->dv,
                              st->dsinks);
}

static void sdpa_backward_compare(sdpa_state *st) {
    sdpa_reference(st, true);
    CHECK(same_floats(st->dq, st->want_dq, SDPA_MAX));
    CHECK(same_floats(st->dk, st->want_dk, SDPA_MAX));
    CHECK(same_floats(st->dv, st->want_dv, SDPA_MAX));
    CHECK(same_floats(st->dsinks, st->want_dsinks, SDPA_HEADS));
}

static void sdpa_backward_failed(void *p) {
    sdpa_state *st = p;
    CHECK(all_sentinel(st->dq, SDPA_MAX));
    CHECK(all_sentinel(st->dk, SDPA_MAX));
    CHECK(all_sentinel(st->dv, SDPA_MAX));
    CHECK(all_sentinel(st->dsinks, SDPA_HEADS));
    /* The forward's out, lse and drawn record are inputs: untouched too. */
    CHECK_STATUS(sdpa_backward_run(st), ATTN_OK);
    sdpa_backward_compare(st);
}

static void sdpa_backward_ok(void *p) { sdpa_backward_compare(p); }

static void sdpa_teardown(void *p) {
    sdpa_state *st = p;
    attn_ctx_free(st->ctx);
    st->ctx = NULL;
}

/* The float64 calls (always the reference loops): the same configs on the
 * same values widened, the same checks. */
typedef struct sdpa64_state {
    sdpa_state *s; /* the config and the float inputs */
    double q[SDPA_MAX], k[SDPA_MAX], v[SDPA_MAX], dout[SDPA_MAX];
    double out[SDPA_MAX], lse[SDPA_MAX], dq[SDPA_MAX], dk[SDPA_MAX], dv[SDPA_MAX];
    float dsinks[SDPA_HEADS];
    attn_sdpa_dropout drawn;
    double want_out[SDPA_MAX], want_lse[SDPA_MAX], want_dq[SDPA_MAX], want_dk[SDPA_MAX],
        want_dv[SDPA_MAX];
    float want_dsinks[SDPA_HEADS];
    attn_sdpa_dropout want_drawn;
} sdpa64_state;

#define SENTINEL64 1234.5

static void sentinels64(double *v, size_t n) {
    for (size_t i = 0; i < n; i++) v[i] = SENTINEL64;
}

static bool all_sentinel64(const double *v, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (v[i] != SENTINEL64) return false;
    return true;
}

static attn_status sdpa64_forward_into(sdpa64_state *t, attn_rng *rng, double *out, double *lse,
                                       attn_sdpa_dropout *drawn) {
    sdpa_state *st = t->s;
    return attn_sdpa_forward_f64(st->ctx, &st->cfg, t->q, t->k, t->v, out, lse,
                                 st->cfg.dropout > 0.0 ? rng : NULL, drawn);
}

static attn_status sdpa64_backward_into(sdpa64_state *t, const double *out, const double *lse,
                                        const attn_sdpa_dropout *drawn, double *dq, double *dk,
                                        double *dv, float *dsinks) {
    sdpa_state *st = t->s;
    attn_sdpa_config c = st->cfg;
    c.sinks_grad = c.sinks ? dsinks : NULL;
    return attn_sdpa_backward_f64(st->ctx, &c, t->q, t->k, t->v, out, lse, t->dout, dq, dk, dv,
                                  c.dropout > 0.0 ? drawn : NULL);
}

static void sdpa64_reference(sdpa64_state *t, bool backward) {
    attn_rng *rng;
    CHECK_STATUS(attn_rng_new(NULL, 77, &rng), ATTN_OK);
    attn_rng_set_bernoulli_method(rng, ATTN_BERNOULLI_PHILOX);
    sentinels64(t->want_out, SDPA_MAX);
    sentinels64(t->want_lse, SDPA_MAX);
    t->want_drawn = SDPA_DRAWN_SENTINEL;
    CHECK_STATUS(sdpa64_forward_into(t, rng, t->want_out, t->want_lse, &t->want_drawn), ATTN_OK);
    attn_rng_free(rng);
    if (!backward) return;
    sentinels64(t->want_dq, SDPA_MAX);
    sentinels64(t->want_dk, SDPA_MAX);
    sentinels64(t->want_dv, SDPA_MAX);
    sentinels(t->want_dsinks, SDPA_HEADS);
    CHECK_STATUS(sdpa64_backward_into(t, t->want_out, t->want_lse, &t->want_drawn, t->want_dq,
                                      t->want_dk, t->want_dv, t->want_dsinks),
                 ATTN_OK);
}

static void sdpa64_forward_setup(void *p) {
    sdpa64_state *t = p;
    sdpa_forward_setup(t->s);
    const float *from[] = {t->s->q, t->s->k, t->s->v, t->s->dout};
    double *to[] = {t->q, t->k, t->v, t->dout};
    for (size_t a = 0; a < 4; a++)
        for (size_t i = 0; i < SDPA_MAX; i++) to[a][i] = (double)from[a][i];
    sentinels64(t->out, SDPA_MAX);
    sentinels64(t->lse, SDPA_MAX);
    t->drawn = SDPA_DRAWN_SENTINEL;
}

static attn_status sdpa64_forward_run(void *p) {
    sdpa64_state *t = p;
    return sdpa64_forward_into(t, t->s->rng, t->out, t->lse, &t->drawn);
}

static void sdpa64_forward_compare(sdpa64_state *t) {
    sdpa64_reference(t, false);
    CHECK(memcmp(t->out, t->want_out, sizeof t->out) == 0);
    CHECK(memcmp(t->lse, t->want_lse, sizeof t->lse) == 0);
    CHECK(same_drawn(t->drawn, t->want_drawn));
}

static void sdpa64_forward_failed(void *p) {
    sdpa64_state *t = p;
    CHECK(all_sentinel64(t->out, SDPA_MAX));
    CHECK(all_sentinel64(t->lse, SDPA_MAX));
    CHECK(same_drawn(t->drawn, SDPA_DRAWN_SENTINEL));
    CHECK_STATUS(sdpa64_forward_run(t), ATTN_OK); /* the rng did not move */
    sdpa64_forward_compare(t);
}

static void sdpa64_forward_ok(void *p) { sdpa64_forward_compare(p); }

static void sdpa64_backward_setup(void *p) {
    sdpa64_state *t = p;
    sdpa64_forward_setup(p);
    CHECK_STATUS(sdpa64_forward_run(t), ATTN_OK);
    sentinels64(t->dq, SDPA_MAX);
    sentinels64(t->dk, SDPA_MAX);
    sentinels64(t->dv, SDPA_MAX);
    sentinels(t->dsinks, SDPA_HEADS);
}

static attn_status sdpa64_backward_run(void *p) {
    sdpa64_state *t = p;
    return sdpa64_backward_into(t, t->out, t->lse, &t->drawn, t->dq, t->dk, t->dv, t->dsinks);
}

static void sdpa64_backward_compare(sdpa64_state *t) {
    sdpa64_reference(t, true);
    CHECK(memcmp(t->dq, t->want_dq, sizeof t->dq) == 0);
    CHECK(memcmp(t->dk, t->want_dk, sizeof t->dk) == 0);
    CHECK(memcmp(t->dv, t->want_dv, sizeof t->dv) == 0);
    CHECK(memcmp(t->dsinks, t->want_dsinks, sizeof t->dsinks) == 0);
}

static void sdpa64_backward_failed(void *p) {
    sdpa64_state *t = p;
    CHECK(all_sentinel64(t->dq, SDPA_MAX));
    CHECK(all_sentinel64(t->dk, SDPA_MAX));
    CHECK(all_sentinel64(t->dv, SDPA_MAX));
    CHECK(all_sentinel(t->dsinks, SDPA_HEADS));
    CHECK_STATUS(sdpa64_backward_run(t), ATTN_OK);
    sdpa64_backward_compare(t);
}

static void sdpa64_backward_ok(void *p) { sdpa64_backward_compare(p); }

static void sdpa64_teardown(void *p) { sdpa_teardown(((sdpa64_state *)p)->s); }

static void sweep_sdpa(void) {
    sdpa_state *st = calloc(1, sizeof *st);
    CHECK_STATUS(attn_rng_new(g_ctx, 77, &st->rng), ATTN_OK);
    CHECK_STATUS(attn_rng_set_bernoulli_method(st->rng, ATTN_BERNOULLI_PHILOX), ATTN_OK);
    for (int variant = 0; variant < (int)SDPA_VARIANTS; variant++) {
        st->variant = variant;
        for (int kernels = 0; kernels < 2; kernels++) {
            st->ctx_cfg = (attn_ctx_config){
                .kernels = kernels ? ATTN_KERNELS_REFERENCE : ATTN_KERNELS_AUTO};
            const char *set = kernels ? "reference" : "fused";
            char name[200];
            snprintf(name, sizeof name, "sdpa forward, %s: %s", set, sdpa_variant_names[variant]);
            sweep(&(sweep_op){.name = name, .setup = sdpa_forward_setup, .run = sdpa_forward_run,
                              .verify_failed = sdpa_forward_failed, .verify_ok = sdpa_forward_ok,
                              .teardown = sdpa_teardown, .state = st, .ctx = &st->ctx});
            snprintf(name, sizeof name, "sdpa backward, %s: %s", set, sdpa_variant_names[variant]);
            sweep(&(sweep_op){.name = name, .setup = sdpa_backward_setup,
                              .run = sdpa_backward_run, .verify_failed = sdpa_backward_failed,
                              .verify_ok = sdpa_backward_ok, .teardown = sdpa_teardown,
                              .state = st, .ctx = &st->ctx});
        }
        sdpa64_state *t = calloc(1, sizeof *t);
        t->s = st;
        st->ctx_cfg = (attn_ctx_config){0};
        char name[200];
        snprintf(name, sizeof name, "sdpa forward f64: %s", sdpa_variant_names[variant]);
        sweep(&(sweep_op){.name = name, .setup = sdpa64_forward_setup, .run = sdpa64_forward_run,
                          .verify_failed = sdpa64_forward_failed, .verify_ok = sdpa64_forward_ok,
                          .teardown = sdpa64_teardown, .state = t, .ctx = &st->ctx});
        snprintf(name, sizeof name, "sdpa backward f64: %s", sdpa_variant_names[variant]);
        sweep(&(sweep_op){.name = name, .setup = sdpa64_backward_setup,
                          .run = sdpa64_backward_run, .verify_failed = sdpa64_backward_failed,
                          .verify_ok = sdpa64_backward_ok, .teardown = sdpa64_teardown,
                          .state = t, .ctx = &st->ctx});
        free(t);
    }
    attn_rng_free(st->rng);
    free(st);
}

/* ---- files ---------------------------------------------------------------- */

typedef struct file_state {
    char path[128];
    unsigned char *bytes;
    size_t size;
    attn_npy npy;
    attn_safetensors *st;
    attn_module *m, *other; /* m receives a load; other was saved */
    attn_gpt2 *gpt2;
    float *weights_before;
} file_state;

static unsigned char *read_all(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char *buf = malloc(1 << 20);
    *size = buf ? fread(buf, 1, 1 << 20, f) : 0;
    fclose(f);
    return buf;
}

static attn_status npy_read_run(void *p) {
    file_state *fs = p;
    return attn_npy_read(g_ctx, fs->path, &fs->npy);
}

static attn_status npy_parse_run(void *p) {
    file_state *fs = p;
    return attn_npy_parse(g_ctx, fs->bytes, fs->size, &fs->npy);
}

static void npy_failed(void *p) {
    file_state *fs = p;
    attn_npy zero = {0};
    CHECK(memcmp(&fs->npy, &zero, sizeof zero) == 0);
}

static void npy_ok(void *p) {
    file_state *fs = p;
    CHECK(fs->npy.ndim == 3 && fs->npy.numel == 24 && fs->npy.data && fs->npy.data[5] == 5.0f);
    attn_npy_free(&fs->npy);
}

static void npy_prepare(void *p) {
    file_state *fs = p;
    memset(&fs->npy, 0x5a, sizeof fs->npy); /* stale: a failure must zero it */
}

/* attn_npy_write over an existing file (x.npy, 24 floats) with 6 new ones:
 * a failure leaves the old file byte for byte and no temporary beside it. */
static attn_status npy_write_run(void *p) {
    file_state *fs = p;
    float data[6] = {10, 11, 12, 13, 14, 15};
    return attn_npy_write(g_ctx, fs->path, data, 2, (size_t[]){2, 3});
}

static void npy_write_restore(void *p) {
    file_state *fs = p;
    FILE *f = fopen(fs->path, "wb");
    CHECK(f && fwrite(fs->bytes, 1, fs->size, f) == fs->size);
    if (f) fclose(f);
}

static size_t temporaries_in(const char *dir) {
    DIR *d = opendir(dir);
    size_t n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strstr(e->d_name, ".attn-tmp") != NULL;
    if (d) closedir(d);
    return n;
}

static void npy_write_failed(void *p) {
    file_state *fs = p;
    size_t size;
    unsigned char *now = read_all(fs->path, &size);
    CHECK(now && size == fs->size && memcmp(now, fs->bytes, size) == 0);
    CHECK(temporaries_in(g_dir) == 0);
    free(now);
}

static void npy_write_ok(void *p) {
    file_state *fs = p;
    attn_npy y;
    CHECK_STATUS(attn_npy_read(g_ctx, fs->path, &y), ATTN_OK);
    CHECK(y.ndim == 2 && y.numel == 6 && y.data && y.data[5] == 15.0f);
    attn_npy_free(&y);
    CHECK(temporaries_in(g_dir) == 0);
}

static attn_status st_parse_run(void *p) {
    file_state *fs = p;
    return attn_safetensors_parse(g_ctx, fs->bytes, fs->size, &fs->st);
}

static attn_status st_open_run(void *p) {
    file_state *fs = p;
    return attn_safetensors_open(g_ctx, fs->path, &fs->st);
}

static void st_prepare(void *p) {
    file_state *fs = p;
    fs->st = (attn_safetensors *)&g_ctx; /* stale: a failure must clear it */
}

static void st_failed(void *p) {
    file_state *fs = p;
    CHECK(fs->st == NULL);
}

static void st_ok(void *p) {
    file_state *fs = p;
    /* every parameter, and the module files' causal-mask buffers */
    CHECK(fs->st && attn_safetensors_count(fs->st) >= attn_module_param_count(fs->other));
    attn_safetensors_free(fs->st);
    fs->st = NULL;
}

static void weights_snapshot(file_state *fs) {
    size_t n = attn_module_num_scalars(fs->m), at = 0;
    free(fs->weights_before);
    fs->weights_before = malloc(n * sizeof(float));
    for (size_t i = 0; i < attn_module_param_count(fs->m); i++) {
        attn_param q;
        attn_module_param_at(fs->m, i, &q);
        memcpy(fs->weights_before + at, q.data, q.numel * sizeof(float));
        at += q.numel;
    }
}

static bool weights_unchanged(file_state *fs) {
    size_t at = 0;
    bool same = true;
    for (size_t i = 0; i < attn_module_param_count(fs->m); i++) {
        attn_param q;
        attn_module_param_at(fs->m, i, &q);
        same = same && memcmp(fs->weights_before + at, q.data, q.numel * sizeof(float)) == 0;
        at += q.numel;
    }
    return same;
}

static attn_status load_module_run(void *p) {
    file_state *fs = p;
    return attn_safetensors_load_module(g_ctx, fs->m, fs->path, NULL);
}

static void load_failed(void *p) {
    file_state *fs = p;
    CHECK(weights_unchanged(fs));
}

static void load_ok(void *p) {
    file_state *fs = p;
    CHECK(same_weights(fs->m, fs->other));
    /* back to the weights it had, for the next sweep step */
    size_t at = 0;
    for (size_t i = 0; i < attn_module_param_count(fs->m); i++) {
        attn_param q;
        attn_module_param_at(fs->m, i, &q);
        memcpy(q.data, fs->weights_before + at, q.numel * sizeof(float));
        at += q.numel;
    }
}

static attn_status save_module_run(void *p) {
    file_state *fs = p;
    char out[160];
    snprintf(out, sizeof out, "%s.out.safetensors", fs->path);
    return attn_safetensors_save_module(g_ctx, fs->other, out);
}

static attn_status save_hf_run(void *p) {
    file_state *fs = p;
    return attn_gpt2_save_hf(g_ctx, attn_gpt2_module(fs->gpt2), fs->path, 1);
}

static attn_status load_hf_run(void *p) {
    file_state *fs = p;
    return attn_gpt2_load_hf(g_ctx, attn_gpt2_module(fs->gpt2), fs->path, 1);
}

static void sweep_files(void) {
    file_state *fs = calloc(1, sizeof *fs);
    /* .npy */
    snprintf(fs->path, sizeof fs->path, "%s/x.npy", g_dir);
    float data[24];
    for (int i = 0; i < 24; i++) data[i] = (float)i;
    CHECK_STATUS(attn_npy_write(g_ctx, fs->path, data, 3, (size_t[]){2, 3, 4}), ATTN_OK);
    fs->bytes = read_all(fs->path, &fs->size);
    sweep(&(sweep_op){.name = "npy: attn_npy_read", .setup = npy_prepare, .run = npy_read_run, .verify_failed = npy_failed, .verify_ok = npy_ok, .teardown = NULL, .state = fs});
    sweep(&(sweep_op){.name = "npy: attn_npy_parse", .setup = npy_prepare, .run = npy_parse_run, .verify_failed = npy_failed, .verify_ok = npy_ok, .teardown = NULL, .state = fs});
    sweep(&(sweep_op){.name = "npy: attn_npy_write over a file", .setup = npy_write_restore, .run = npy_write_run, .verify_failed = npy_write_failed, .verify_ok = npy_write_ok, .teardown = NULL, .state = fs});
    free(fs->bytes);

    /* safetensors: a MultiHeadAttention saved, then parsed, opened, loaded */
    attn_rng *rng;
    attn_rng_new(g_ctx, 3, &rng);
    CHECK_STATUS(build(g_ctx, rng, &specs[5], &fs->other), ATTN_OK);
    CHECK_STATUS(build(g_ctx, rng, &specs[5], &fs->m), ATTN_OK);
    snprintf(fs->path, sizeof fs->path, "%s/mha.safetensors", g_dir);
    CHECK_STATUS(attn_safetensors_save_module(g_ctx, fs->other, fs->path), ATTN_OK);
    fs->bytes = read_all(fs->path, &fs->size);
    sweep(&(sweep_op){.name = "safetensors: attn_safetensors_parse", .setup = st_prepare, .run = st_parse_run, .verify_failed = st_failed, .verify_ok = st_ok, .teardown = NULL, .state = fs});
    sweep(&(sweep_op){.name = "safetensors: attn_safetensors_open", .setup = st_prepare, .run = st_open_run, .verify_failed = st_failed, .verify_ok = st_ok, .teardown = NULL, .state = fs});
    weights_snapshot(fs);
    sweep(&(sweep_op){.name = "safetensors: attn_safetensors_load_module", .setup = NULL, .run = load_module_run, .verify_failed = load_failed, .verify_ok = load_ok, .teardown = NULL, .state = fs});
    sweep(&(sweep_op){.name = "safetensors: attn_safetensors_save_module", .setup = NULL, .run = save_module_run, .verify_failed = NULL, .verify_ok = NULL, .teardown = NULL, .state = fs});
    free(fs->bytes);

    /* Hugging Face GPT-2 layers */
    attn_gpt2 *saved_layer;
    attn_gpt2_config gcfg = {.n_embd = 6, .n_head = 3, .block_size = 5};
    CHECK_STATUS(attn_gpt2_new(g_ctx, &gcfg, rng, &saved_layer), ATTN_OK);
    CHECK_STATUS(attn_gpt2_new(g_ctx, &gcfg, rng, &fs->gpt2), ATTN_OK);
    snprintf(fs->path, sizeof fs->path, "%s/gpt2.safetensors", g_dir);
    attn_gpt2 *keep = fs->gpt2;
    fs->gpt2 = saved_layer;
    sweep(&(sweep_op){.name = "safetensors: attn_gpt2_save_hf", .setup = NULL, .run = save_hf_run, .verify_failed = NULL, .verify_ok = NULL, .teardown = NULL, .state = fs});
    fs->gpt2 = keep;
    attn_module_free(fs->m);
    attn_module_free(fs->other);
    fs->m = attn_gpt2_module(fs->gpt2);
    fs->other = attn_gpt2_module(saved_layer);
    weights_snapshot(fs);
    sweep(&(sweep_op){.name = "safetensors: attn_gpt2_load_hf", .setup = NULL, .run = load_hf_run, .verify_failed = load_failed, .verify_ok = load_ok, .teardown = NULL, .state = fs});
    attn_gpt2_free(fs->gpt2);
    attn_gpt2_free(saved_layer);
    attn_rng_free(rng);
    free(fs->weights_before);
    free(fs);
}

/* ---- the training model ------------------------------------------------- */

typedef struct model_state {
    attn_model_config cfg;
    const attn_gpt_config *gpt; /* the book's GPTModel (attn_model_new_gpt) when set */
    const attn_llama3_config *llama; /* the book's Llama3Model (attn_model_new_llama3) */
    attn_rng *rng;
    attn_model *m;
    attn_optimizer *opt;
    int32_t tokens[2 * 6], targets[2 * 6];
    float logits[2 * 6 * 11], loss;
    float *grads_before, *weights_before;
    size_t scalars;
} model_state;

enum { MB = 2, MT = 6 };

static void model_snapshot(model_state *ms, float *grads, float *weights) {
    const attn_param *p;
    size_t count, at = 0;
    attn_model_params(ms->m, &p, &count);
    for (size_t i = 0; i < count; i++) {
        if (grads) memcpy(grads + at, p[i].grad, p[i].numel * sizeof(float));
        if (weights) memcpy(weights + at, p[i].data, p[i].numel * sizeof(float));
        at += p[i].numel;
    }
}

static void model_build(model_state *ms) {
    attn_rng_manual_seed(ms->rng, 4);
    CHECK_STATUS(ms->llama ? attn_model_new_llama3(g_ctx, ms->llama, ms->rng, &ms->m)
                 : ms->gpt ? attn_model_new_gpt(g_ctx, ms->gpt, ms->rng, &ms->m)
                           : attn_model_new(g_ctx, &ms->cfg, ms->rng, &ms->m),
                 ATTN_OK);
    for (int i = 0; i < MB * MT; i++) {
        ms->tokens[i] = (int32_t)((i * 7 + 3) % 11);
        ms->targets[i] = (int32_t)((i * 5 + 1) % 11);
    }
    ms->scalars = attn_model_num_scalars(ms->m);
    free(ms->grads_before);
    free(ms->weights_before);
    ms->grads_before = calloc(ms->scalars, sizeof(float));
    ms->weights_before = calloc(ms->scalars, sizeof(float));
}

static void model_construct_setup(void *p) {
    model_state *ms = p;
    attn_rng_manual_seed(ms->rng, 4);
    ms->m = NULL;
}

static attn_status model_construct_run(void *p) {
    model_state *ms = p;
    ms->m = (attn_model *)&g_ctx; /* stale: the constructor must clear it */
    if (ms->llama) return attn_model_new_llama3(g_ctx, ms->llama, ms->rng, &ms->m);
    return ms->gpt ? attn_model_new_gpt(g_ctx, ms->gpt, ms->rng, &ms->m)
                   : attn_model_new(g_ctx, &ms->cfg, ms->rng, &ms->m);
}

static void model_construct_failed(void *p) {
    model_state *ms = p;
    CHECK(ms->m == NULL);
    CHECK(rng_at(ms->rng, 4, 0));
}

static void model_teardown(void *p) {
    model_state *ms = p;
    attn_optimizer_free(ms->opt);
    attn_model_free(ms->m);
    ms->opt = NULL;
    ms->m = NULL;
}

static void model_forward_setup(void *p) {
    model_state *ms = p;
    model_build(ms);
    attn_model_set_training(ms->m, true);
    for (size_t i = 0; i < sizeof ms->logits / sizeof ms->logits[0]; i++) ms->logits[i] = SENTINEL;
    ms->loss = SENTINEL;
    attn_rng_manual_seed(ms->rng, 77);
}

static attn_status model_forward_run(void *p) {
    model_state *ms = p;
    return attn_model_forward(ms->m, ms->tokens, ms->targets, MB, MT, ms->logits, &ms->loss,
                              ms->rng);
}

static void model_forward_failed(void *p) {
    model_state *ms = p;
    bool untouched = ms->loss == SENTINEL;
    for (size_t i = 0; i < sizeof ms->logits / sizeof ms->logits[0]; i++)
        untouched = untouched && ms->logits[i] == SENTINEL;
    CHECK(untouched);
    CHECK(rng_at(ms->rng, 77, 0));
    CHECK_STATUS(attn_model_backward(ms->m), ATTN_ERR_INVALID); /* nothing to differentiate */
}

static void model_backward_setup(void *p) {
    model_state *ms = p;
    model_forward_setup(p);
    CHECK_STATUS(model_forward_run(p), ATTN_OK);
    model_snapshot(ms, ms->grads_before, NULL);
}

static attn_status model_backward_run(void *p) { return attn_model_backward(((model_state *)p)->m); }

/* The model's backward may leave later layers' gradients added (attn.h):
 * after zero_grad the same backward runs, from the forward still kept. */
static void model_backward_failed(void *p) {
    model_state *ms = p;
    CHECK_STATUS(attn_model_zero_grad(ms->m), ATTN_OK);
    CHECK_STATUS(attn_model_backward(ms->m), ATTN_OK);
}

static void model_optimizer_setup(void *p) {
    model_state *ms = p;
    model_build(ms);
    ms->opt = NULL;
}

static attn_status model_optimizer_run(void *p) {
    model_state *ms = p;
    const attn_param *params;
    size_t count;
    attn_model_params(ms->m, &params, &count);
    attn_optimizer_config oc = attn_optimizer_defaults(ATTN_OPTIMIZER_SGD);
    oc.lr = 0.1;
    oc.momentum = 0.9;
    ms->opt = (attn_optimizer *)&g_ctx;
    return attn_optimizer_new(g_ctx, &oc, params, count, &ms->opt);
}

static void model_optimizer_failed(void *p) { CHECK(((model_state *)p)->opt == NULL); }

static void sweep_model(void) {
    static const attn_gpt_config book = {.vocab_size = 11, .context_length = MT, .emb_dim = 8,
                                         .n_heads = 2, .n_layers = 2, .drop_rate = 0.1,
                                         .qkv_bias = true};
    static const attn_llama3_config llama = {
        .vocab_size = 11, .context_length = MT, .emb_dim = 8, .n_heads = 2, .n_layers = 2,
        .hidden_dim = 12, .n_kv_groups = 1, .rope_base = 500000.0, .rope_factor = 8.0,
        .rope_low_freq_factor = 1.0, .rope_high_freq_factor = 4.0,
        .rope_original_context_length = 16};
    /* chapter 4's bonus GPTs: GQA, MLA, SWA (windows on layer 0) */
    attn_gpt_config bonus[3] = {book, book, book};
    bonus[0].attention = ATTN_GPT_GQA, bonus[0].n_kv_groups = 1;
    bonus[1].attention = ATTN_GPT_MLA, bonus[1].latent_dim = 4;
    bonus[2].attention = ATTN_GPT_SWA, bonus[2].sliding_window_size = 2;
    bonus[2].sliding_window_stride = 1;
    static const char *const bonus_kind[3] = {"model (the GQA GPTModel)",
                                              "model (the MLA GPTModel)",
                                              "model (the SWA GPTModel)"};
    for (int a = 0; a < 7; a++) {
        model_state *ms = calloc(1, sizeof *ms);
        ms->cfg = (attn_model_config){.vocab_size = 11, .context_length = MT, .d_model = 8,
                                      .n_layers = 2, .n_heads = 2, .mlp = true, .dropout = 0.1,
                                      .attention = a == 1 ? ATTN_MODULE_GPT2 : ATTN_MODULE_MHA};
        ms->gpt = a == 2 ? &book : a >= 4 ? &bonus[a - 4] : NULL;
        ms->llama = a == 3 ? &llama : NULL;
        attn_rng_new(g_ctx, 1, &ms->rng);
        const char *kind = a >= 4   ? bonus_kind[a - 4]
                           : a == 3 ? "model (the book's Llama3Model)"
                           : a == 2 ? "model (the book's GPTModel)"
                           : a == 1 ? "model (gpt2 blocks)"
                                    : "model (mha blocks)";
        char name[96];
        snprintf(name, sizeof name, "%s: construct", kind);
        sweep(&(sweep_op){.name = name, .setup = model_construct_setup,
                          .run = model_construct_run, .verify_failed = model_construct_failed,
                          .teardown = model_teardown, .state = ms});
        snprintf(name, sizeof name, "%s: forward with targets (train)", kind);
        sweep(&(sweep_op){.name = name, .setup = model_forward_setup, .run = model_forward_run,
                          .verify_failed = model_forward_failed, .teardown = model_teardown,
                          .state = ms});
        /* The Llama3Model's backward allocates nothing of its own: only
         * what the SDPA backward needs beyond the workspace its forward left
         * in the ctx, which is nothing at this shape. */
        snprintf(name, sizeof name, "%s: backward", kind);
        if (!ms->llama)
            sweep(&(sweep_op){.name = name, .setup = model_backward_setup,
                              .run = model_backward_run, .verify_failed = model_backward_failed,
                              .teardown = model_teardown, .state = ms});
        snprintf(name, sizeof name, "%s: attn_optimizer_new (sgd)", kind);
        sweep(&(sweep_op){.name = name, .setup = model_optimizer_setup,
                          .run = model_optimizer_run, .verify_failed = model_optimizer_failed,
                          .teardown = model_teardown, .state = ms});
        free(ms->grads_before);
        free(ms->weights_before);
        attn_rng_free(ms->rng);
        free(ms);
    }
}

/* ---- ctx and rng ----------------------------------------------------------- */

static attn_ctx *g_new_ctx;
static attn_rng *g_new_rng;

static attn_status ctx_new_run(void *p) {
    (void)p;
    g_new_ctx = (attn_ctx *)&g_ctx;
    attn_status st = attn_ctx_new(NULL, &g_new_ctx);
    if (st != ATTN_OK) CHECK(g_new_ctx == NULL);
    return st;
}

static void ctx_teardown(void *p) {
    (void)p;
    attn_ctx_free(g_new_ctx);
    g_new_ctx = NULL;
}

static attn_status rng_new_run(void *p) {
    (void)p;
    g_new_rng = (attn_rng *)&g_ctx;
    return attn_rng_new(g_ctx, 1, &g_new_rng);
}

static void rng_failed(void *p) {
    (void)p;
    CHECK(g_new_rng == NULL);
}

static void rng_teardown(void *p) {
    (void)p;
    attn_rng_free(g_new_rng);
    g_new_rng = NULL;
}

/* ---- the KV cache ----------------------------------------------------------- */

/* A paged cache with a window layer, two sequences with history; the run is
 * one ragged attend (a decode token, a chunk) on 2 threads. */
enum { KV_H = 4, KV_KH = 2, KV_D = 8, KV_ROWS = 6 };
typedef struct kv_state {
    attn_ctx *ctx;
    attn_kv_cache *cache;
    float q[KV_ROWS * KV_H * KV_D], k[KV_ROWS * KV_KH * KV_D], v[KV_ROWS * KV_KH * KV_D];
    float out[KV_ROWS * KV_H * KV_D], want[KV_ROWS * KV_H * KV_D];
    bool have_want;
} kv_state;

static const size_t kv_windows[2] = {0, 5};
static const size_t kv_lens[2] = {1, 5};

static attn_status kv_new(kv_state *st, attn_kv_cache **out) {
    attn_kv_cache_config cfg = {.num_layers = 2, .batch = 2, .kv_heads = KV_KH,
                                .head_dim = KV_D, .max_len = 600, .layout = ATTN_KV_PAGED,
                                .page_size = 3, .windows = kv_windows};
    *out = (attn_kv_cache *)st; /* must become NULL on failure */
    attn_status status = attn_kv_cache_new(st->ctx, &cfg, out);
    if (status != ATTN_OK) CHECK(*out == NULL);
    return status;
}

/* The cache's history: 293 and 7 tokens in layer 1, appended (so that the
 * run's attend grows the cache's working memory). */
static void kv_fill(kv_state *st, attn_kv_cache *c) {
    static float k[300 * KV_KH * KV_D];
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) k[i] = (float)((i * 11) % 19) / 19.0f;
    size_t lens[2] = {293, 7};
    CHECK_STATUS(attn_kv_cache_append(c, 1, lens, 0, k, k), ATTN_OK);
    (void)st;
}

static attn_status kv_attend(kv_state *st, attn_kv_cache *c) {
    attn_kv_attend_args a = {.layer = 1, .new_lens = kv_lens, .q_heads = KV_H, .q = st->q,
                             .k_new = st->k, .v_new = st->v, .out = st->out};
    return attn_kv_cache_attend(c, &a);
}

static void kv_new_setup(void *p) {
    kv_state *st = p;
    if (!st->ctx) attn_ctx_new(&(attn_ctx_config){.num_threads = 2}, &st->ctx);
}

static attn_status kv_new_run(void *p) {
    kv_state *st = p;
    return kv_new(st, &st->cache);
}

static void kv_teardown(void *p) {
    kv_state *st = p;
    attn_kv_cache_free(st->cache);
    st->cache = NULL;
}

static void kv_attend_setup(void *p) {
    kv_state *st = p;
    kv_new_setup(p);
    for (size_t i = 0; i < sizeof st->q / sizeof st->q[0]; i++) st->q[i] = (float)(i % 13) / 7.0f;
    for (size_t i = 0; i < sizeof st->k / sizeof st->k[0]; i++) {
        st->k[i] = (float)(i % 7) / 5.0f;
        st->v[i] = (float)(i % 5) / 3.0f - 0.5f;
    }
    if (!st->have_want) {
        attn_kv_cache *c;
        CHECK_STATUS(kv_new(st, &c), ATTN_OK);
        kv_fill(st, c);
        CHECK_STATUS(kv_attend(st, c), ATTN_OK);
        memcpy(st->want, st->out, sizeof st->out);
        attn_kv_cache_free(c);
        st->have_want = true;
    }
    CHECK_STATUS(kv_new(st, &st->cache), ATTN_OK);
    kv_fill(st, st->cache);
    for (size_t i = 0; i < sizeof st->out / sizeof st->out[0]; i++) st->out[i] = SENTINEL;
}

static attn_status kv_attend_run(void *p) {
    kv_state *st = p;
    return kv_attend(st, st->cache);
}

static void kv_attend_ok(void *p) {
    kv_state *st = p;
    CHECK(memcmp(st->out, st->want, sizeof st->out) == 0);
}

/* Nothing written, nothing appended; the same call then gives the results. */
static void kv_attend_failed(void *p) {
    kv_state *st = p;
    bool untouched = true;
    for (size_t i = 0; i < sizeof st->out / sizeof st->out[0]; i++)
        untouched &= st->out[i] == SENTINEL;
    CHECK(untouched);
    size_t len0 = 0, len1 = 0;
    CHECK_STATUS(attn_kv_cache_length(st->cache, 1, 0, &len0), ATTN_OK);
    CHECK_STATUS(attn_kv_cache_length(st->cache, 1, 1, &len1), ATTN_OK);
    CHECK(len0 == 293 && len1 == 7);
    CHECK_STATUS(kv_attend(st, st->cache), ATTN_OK);
    kv_attend_ok(p);
}

static void sweep_kv_cache(void) {
    static kv_state st;
    sweep(&(sweep_op){.name = "attn_kv_cache_new (paged, a window layer)", .setup = kv_new_setup, .run = kv_new_run, .verify_failed = NULL, .verify_ok = NULL, .teardown = kv_teardown, .state = &st, .ctx = &st.ctx});
    sweep(&(sweep_op){.name = "attn_kv_cache_attend (paged, window, ragged)", .setup = kv_attend_setup, .run = kv_attend_run, .verify_failed = kv_attend_failed, .verify_ok = kv_attend_ok, .teardown = kv_teardown, .state = &st, .ctx = &st.ctx});
    attn_ctx_free(st.ctx);
}

/* ---- generation: attn_lm_generate ----------------------------------------- */

/* A tiny Llama 3 (GQA, RoPE) generating with top-k/top-p sampling and a
 * cache of its own: the cache, its pages of scratch and the sampler's are
 * allocated inside the swept call (the model's buffers grew in the setup's
 * first run). */
#define GEN_NEW 6
typedef struct gen_state {
    attn_lm *lm;
    attn_rng *rng;
    int32_t want[GEN_NEW], out[GEN_NEW];
    size_t want_count, count;
} gen_state;

static const int32_t gen_prompt[5] = {3, 1, 4, 1, 5};

static attn_status gen_run_with(gen_state *st, int32_t *out, size_t *count) {
    attn_rng_manual_seed(st->rng, 7);
    attn_generate_args a = {.prompt = gen_prompt, .prompt_len = 5, .max_new_tokens = GEN_NEW,
                            .sampling = {.temperature = 0.9, .top_k = 20, .top_p = 0.9},
                            .rng = st->rng, .out = out, .count = count};
    return attn_lm_generate(st->lm, &a);
}

static void gen_setup(void *p) {
    gen_state *st = p;
    if (st->lm) return;
    attn_lm_config cfg = {.arch = ATTN_LM_LLAMA3, .vocab_size = 41, .context_length = 16,
                          .emb_dim = 16, .n_heads = 4, .n_layers = 2, .n_kv_groups = 2,
                          .hidden_dim = 24, .rope_base = 10000.0};
    attn_rng *init;
    CHECK_STATUS(attn_rng_new(g_ctx, 5, &init), ATTN_OK);
    CHECK_STATUS(attn_lm_new(g_ctx, &cfg, init, &st->lm), ATTN_OK);
    attn_rng_free(init);
    CHECK_STATUS(attn_rng_new(g_ctx, 7, &st->rng), ATTN_OK);
    CHECK_STATUS(gen_run_with(st, st->want, &st->want_count), ATTN_OK);
    CHECK(st->want_count == GEN_NEW);
}

static attn_status gen_run(void *p) {
    gen_state *st = p;
    return gen_run_with(st, st->out, &st->count);
}

/* The same tokens as a run that never failed. */
static void gen_ok(void *p) {
    gen_state *st = p;
    CHECK(st->count == st->want_count);
    CHECK(memcmp(st->out, st->want, sizeof st->want) == 0);
}

/* *count says what was written; the model still generates the same tokens. */
static void gen_failed(void *p) {
    gen_state *st = p;
    CHECK(st->count <= GEN_NEW);
    CHECK(memcmp(st->out, st->want, st->count * sizeof *st->out) == 0);
    CHECK_STATUS(gen_run(st), ATTN_OK);
    gen_ok(st);
}

static void sweep_generate(void) {
    static gen_state st;
    sweep(&(sweep_op){.name = "attn_lm_generate (llama3, sampled, own cache)", .setup = gen_setup, .run = gen_run, .verify_failed = gen_failed, .verify_ok = gen_ok, .teardown = NULL, .state = &st});
    attn_rng_free(st.rng);
    attn_lm_free(st.lm);
}

/* ---- programmable attention: masks and block maps ---------------------------- */

/* Documents AND causal OR global tokens, with lists over the same shape;
 * the run builds one description or map, compared on success with one
 * built without failures (counts and drawings). */
#define BM_T 150
typedef struct bm_state {
    int32_t ids[2 * BM_T];
    attn_mask *docs, *causal, *tree, *made;
    attn_block_mask *want, *got;
    attn_block_mask_config cfg;
    int32_t num[2 * 3], idx[2 * 3 * 3], full_num[2 * 3], full_idx[2 * 3 * 3];
    attn_block_mask *whole; /* the map slice cuts from */
    int which; /* 0 document, 1 prefix-LM, 2 AND (deep copies), 3 from_mask, 4 from_kv_blocks,
                  5 a slice of 3's map at offsets off the block edges */
} bm_state;

static attn_status bm_build(bm_state *st, attn_block_mask **out) {
    if (st->which == 3) return attn_block_mask_from_mask(g_ctx, &st->cfg, st->tree, out);
    if (st->which == 5)
        return attn_block_map_slice(g_ctx, "slice", attn_block_mask_map(st->whole), 0, 1, 37,
                                    140, 21, 133, out);
    return attn_block_mask_from_kv_blocks(g_ctx, &st->cfg, st->num, st->idx, 3, st->full_num,
                                          st->full_idx, 3, st->tree, out);
}

static void bm_setup(void *p) {
    bm_state *st = p;
    if (st->tree) return;
    for (size_t i = 0; i < 2 * BM_T; i++) st->ids[i] = (int32_t)(i % BM_T / 40);
    attn_mask *global = NULL, *both = NULL;
    CHECK_STATUS(attn_mask_new_document(g_ctx, st->ids, NULL, 2, BM_T, 0, &st->docs), ATTN_OK);
    CHECK_STATUS(attn_mask_new_causal(g_ctx, 0, &st->causal), ATTN_OK);
    CHECK_STATUS(attn_mask_new_global(g_ctx, 3, &global), ATTN_OK);
    CHECK_STATUS(attn_mask_new_and(g_ctx, st->docs, st->causal, &both), ATTN_OK);
    CHECK_STATUS(attn_mask_new_or(g_ctx, both, global, &st->tree), ATTN_OK);
    attn_mask_free(global);
    attn_mask_free(both);
    st->cfg = (attn_block_mask_config){2, 1, BM_T, BM_T, 64, 64};
    CHECK_STATUS(attn_block_mask_from_mask(g_ctx, &st->cfg, st->tree, &st->whole), ATTN_OK);
    /* query block qb lists key blocks below it as full, its own as partial */
    for (size_t r = 0; r < 6; r++) {
        size_t qb = r % 3;
        st->num[r] = 1;
        st->idx[r * 3] = (int32_t)qb;
        st->full_num[r] = (int32_t)qb;
        for (size_t k = 0; k < qb; k++) st->full_idx[r * 3 + k] = (int32_t)k;
    }
}

static attn_status bm_run(void *p) {
    bm_state *st = p;
    int64_t prefix[2] = {5, 17};
    st->made = (attn_mask *)&g_ctx;
    st->got = (attn_block_mask *)&g_ctx;
    switch (st->which) {
    case 0: return attn_mask_new_document(g_ctx, st->ids, st->ids, 2, BM_T, BM_T, &st->made);
    case 1: return attn_mask_new_prefix_lm(g_ctx, prefix, 2, &st->made);
    case 2: return attn_mask_new_and(g_ctx, st->tree, st->docs, &st->made);
    default: return bm_build(st, &st->got);
    }
}

static void bm_failed(void *p) {
    bm_state *st = p;
    CHECK(st->which < 3 ? st->made == NULL : st->got == NULL);
}

static bool same_drawing(const attn_block_mask *a, const attn_block_mask *b) {
    attn_block_mask_info x, y;
    char da[64], db[64];
    if (attn_block_mask_get_info(a, &x) != ATTN_OK || attn_block_mask_get_info(b, &y) != ATTN_OK)
        return false;
    for (size_t bb = 0; bb < 2; bb++)
        if (attn_block_mask_to_string(a, bb, 0, da, sizeof da, NULL) != ATTN_OK ||
            attn_block_mask_to_string(b, bb, 0, db, sizeof db, NULL) != ATTN_OK || strcmp(da, db))
            return false;
    return x.full_blocks == y.full_blocks && x.partial_blocks == y.partial_blocks &&
           x.row_intervals == y.row_intervals;
}

static void bm_ok(void *p) {
    bm_state *st = p;
    if (st->which >= 3) {
        if (!st->want) CHECK_STATUS(bm_build(st, &st->want), ATTN_OK);
        CHECK(st->want && st->got && same_drawing(st->want, st->got));
        return;
    }
    /* a description made under the sweep reads as one made without it */
    bool ok = st->made != NULL;
    for (size_t q = 0; ok && q < BM_T; q += 7)
        for (size_t k = 0; ok && k < BM_T; k += 5) {
            bool v = false, w = false;
            ok = attn_mask_visible(g_ctx, st->made, 1, 0, q, k, &v) == ATTN_OK;
            if (st->which == 0) w = st->ids[q] == st->ids[k];
            if (st->which == 1) w = k <= q || k < 17;
            if (st->which == 2) w = st->ids[q] == st->ids[k] && (k <= q || q < 3 || k < 3);
            ok = ok && v == w;
        }
    CHECK(ok);
}

static void bm_teardown(void *p) {
    bm_state *st = p;
    if (st->made != (attn_mask *)&g_ctx) attn_mask_free(st->made);
    if (st->got != (attn_block_mask *)&g_ctx) attn_block_mask_free(st->got);
    st->made = NULL;
    st->got = NULL;
}

static void sweep_block_masks(void) {
    static bm_state st;
    static const char *const names[] = {
        "attn_mask_new_document", "attn_mask_new_prefix_lm",
        "attn_mask_new_and (deep copies of a tree)", "attn_block_mask_from_mask",
        "attn_block_mask_from_kv_blocks (with a mask)", "attn_block_map_slice"};
    for (int w = 0; w < 6; w++) {
        st.which = w;
        attn_block_mask_free(st.want);
        st.want = NULL;
        sweep(&(sweep_op){.name = names[w], .setup = bm_setup, .run = bm_run, .verify_failed = bm_failed, .verify_ok = bm_ok, .teardown = bm_teardown, .state = &st});
    }
    attn_block_mask_free(st.want);
    attn_block_mask_free(st.whole);
    attn_mask_free(st.docs);
    attn_mask_free(st.causal);
    attn_mask_free(st.tree);
}

/* ---- the 16-bit calls, the lse's gradient, score modifiers' gradients ----- */

/* On the first config (GQA, v_head_dim, window, sinks, Philox dropout):
 * attn_sdpa_forward_16 and attn_sdpa_backward_16 in bf16, attn_sdpa_backward_dlse
 * in float32 and bf16, and a bias tensor and a relative table (softcap and
 * ALiBi off: a chain replaces them) forward and backward with their
 * gradients. Every output starts as a byte pattern: a failure leaves it. */
enum { SX_OUTS = 6, SX_BYTES = SDPA_MAX * 4, SX_BIAS = 4 * 5 * 7, SX_TABLE = 4 * 8 };
typedef enum sx_kind {
    SX_FORWARD_16, SX_BACKWARD_16, SX_DLSE_F32, SX_DLSE_16, SX_FLEX_FORWARD, SX_FLEX_BACKWARD
} sx_kind;

typedef struct sx_state {
    sdpa_state *s;
    sx_kind kind;
    uint16_t q16[SDPA_MAX], k16[SDPA_MAX], v16[SDPA_MAX], dout16[SDPA_MAX];
    /* the forward the backward kinds start from: float32 and bf16 */
    float out[SDPA_MAX], lse[SDPA_MAX], dlse[SDPA_MAX];
    uint16_t out16[SDPA_MAX];
    attn_sdpa_dropout fwd_drawn;
    float bias[SX_BIAS], table[SX_TABLE];
    attn_score_mod mods[2];
    unsigned char outs[SX_OUTS][SX_BYTES], want[SX_OUTS][SX_BYTES];
    attn_sdpa_dropout drawn, want_drawn;
} sx_state;

static const char *const sx_names[] = {
    "attn_sdpa_forward_16 (bf16)", "attn_sdpa_backward_16 (bf16)",
    "attn_sdpa_backward_dlse (f32)", "attn_sdpa_backward_dlse (bf16)",
    "sdpa forward: a bias tensor + a relative table",
    "sdpa backward: a bias tensor's + a relative table's gradients"};

static bool sx_flex(const sx_state *x) {
    return x->kind == SX_FLEX_FORWARD || x->kind == SX_FLEX_BACKWARD;
}

/* The config of the kind: variant 0's, with the chain for the flex kinds. */
static attn_sdpa_config sx_config(sx_state *x, float *sinks_grad, float *bias_grad,
                                  float *table_grad) {
    attn_sdpa_config c = x->s->cfg;
    c.sinks_grad = sinks_grad;
    if (sx_flex(x)) {
        c.softcap = 0.0;
        c.alibi_slopes = NULL;
        x->mods[0] = (attn_score_mod){.kind = ATTN_SCORE_BIAS, .tensor = x->bias,
                                      .tensor_grad = bias_grad, .strides = {0, 35, 7, 1}};
        x->mods[1] = (attn_score_mod){.kind = ATTN_SCORE_REL_TABLE, .tensor = x->table,
                                      .tensor_grad = table_grad, .buckets = 8};
        c.score_mods = x->mods;
        c.score_mod_count = 2;
    }
    return c;
}

/* The kind's call into outs, from rng (forward kinds) or the forward's record. */
static attn_status sx_call(sx_state *x, attn_ctx *ctx, attn_rng *rng,
                           unsigned char (*o)[SX_BYTES], attn_sdpa_dropout *drawn) {
    sdpa_state *s = x->s;
    const attn_sdpa_dropout *rec = &x->fwd_drawn;
    switch (x->kind) {
    case SX_FORWARD_16: {
        attn_sdpa_config c = sx_config(x, NULL, NULL, NULL);
        return attn_sdpa_forward_16(ctx, &c, ATTN_DTYPE_BF16, x->q16, x->k16, x->v16, o[0],
                                    (float *)o[1], rng, drawn);
    }
    case SX_BACKWARD_16: {
        attn_sdpa_config c = sx_config(x, (float *)o[3], NULL, NULL);
        return attn_sdpa_backward_16(ctx, &c, ATTN_DTYPE_BF16, x->q16, x->k16, x->v16, x->out16,
                                     x->lse, x->dout16, o[0], o[1], o[2], rec);
    }
    case SX_DLSE_F32: {
        attn_sdpa_config c = sx_config(x, (float *)o[3], NULL, NULL);
        return attn_sdpa_backward_dlse(ctx, &c, ATTN_DTYPE_F32, s->q, s->k, s->v, x->out, x->lse,
                                       s->dout, x->dlse, o[0], o[1], o[2], rec);
    }
    case SX_DLSE_16: {
        attn_sdpa_config c = sx_config(x, (float *)o[3], NULL, NULL);
        return attn_sdpa_backward_dlse(ctx, &c, ATTN_DTYPE_BF16, x->q16, x->k16, x->v16,
                                       x->out16, x->lse, x->dout16, x->dlse, o[0], o[1], o[2],
                                       rec);
    }
    case SX_FLEX_FORWARD: {
        attn_sdpa_config c = sx_config(x, NULL, NULL, NULL);
        return attn_sdpa_forward(ctx, &c, s->q, s->k, s->v, (float *)o[0], (float *)o[1], rng,
                                 drawn);
    }
    case SX_FLEX_BACKWARD: {
        attn_sdpa_config c = sx_config(x, (float *)o[3], (float *)o[4], (float *)o[5]);
        return attn_sdpa_backward(ctx, &c, s->q, s->k, s->v, x->out, x->lse, s->dout,
                                  (float *)o[0], (float *)o[1], (float *)o[2], rec);
    }
    }
    return ATTN_ERR_INVALID;
}

static bool sx_forward_kind(const sx_state *x) {
    return x->kind == SX_FORWARD_16 || x->kind == SX_FLEX_FORWARD;
}

/* The inputs, and for the backward kinds the forward they differentiate
 * (float32 or bf16, the same chain), run without failures. */
static void sx_inputs(sx_state *x) {
    sdpa_state *s = x->s;
    s->variant = 0;
    sdpa_configure(s);
    for (size_t i = 0; i < SDPA_MAX; i++) {
        x->q16[i] = (uint16_t)attn_float_to_half(ATTN_DTYPE_BF16, s->q[i]);
        x->k16[i] = (uint16_t)attn_float_to_half(ATTN_DTYPE_BF16, s->k[i]);
        x->v16[i] = (uint16_t)attn_float_to_half(ATTN_DTYPE_BF16, s->v[i]);
        x->dout16[i] = (uint16_t)attn_float_to_half(ATTN_DTYPE_BF16, s->dout[i]);
        x->dlse[i] = 0.25f - 0.05f * (float)(i % 11);
    }
    fill(x->bias, SX_BIAS, -0.6f);
    fill(x->table, SX_TABLE, -0.2f);
    if (sx_forward_kind(x)) return;
    attn_rng *rng;
    CHECK_STATUS(attn_rng_new(NULL, 31, &rng), ATTN_OK);
    attn_rng_set_bernoulli_method(rng, ATTN_BERNOULLI_PHILOX);
    sx_kind kind = x->kind;
    x->kind = kind == SX_FLEX_BACKWARD ? SX_FLEX_FORWARD : SX_FORWARD_16;
    attn_sdpa_config c = sx_config(x, NULL, NULL, NULL);
    x->kind = kind;
    if (kind == SX_BACKWARD_16 || kind == SX_DLSE_16)
        CHECK_STATUS(attn_sdpa_forward_16(s->ctx, &c, ATTN_DTYPE_BF16, x->q16, x->k16, x->v16,
                                          x->out16, x->lse, rng, &x->fwd_drawn), ATTN_OK);
    else
        CHECK_STATUS(attn_sdpa_forward(s->ctx, &c, s->q, s->k, s->v, x->out, x->lse, rng,
                                       &x->fwd_drawn), ATTN_OK);
    attn_rng_free(rng);
}

static void sx_setup(void *p) {
    sx_state *x = p;
    sdpa_state *s = x->s;
    CHECK_STATUS(attn_ctx_new(&s->ctx_cfg, &s->ctx), ATTN_OK);
    sx_inputs(x);
    /* the forward's workspace stays in this ctx: the swept call takes its own */
    attn_ctx_free(s->ctx);
    CHECK_STATUS(attn_ctx_new(&s->ctx_cfg, &s->ctx), ATTN_OK);
    attn_rng_manual_seed(s->rng, 77);
    memset(x->outs, 0x5a, sizeof x->outs);
    x->drawn = SDPA_DRAWN_SENTINEL;
}

static attn_status sx_run(void *p) {
    sx_state *x = p;
    return sx_call(x, x->s->ctx, x->s->rng, x->outs, &x->drawn);
}

/* The call on a fresh ctx and rng, never failed. */
static void sx_compare(sx_state *x) {
    attn_ctx *ctx;
    attn_rng *rng;
    CHECK_STATUS(attn_ctx_new(&x->s->ctx_cfg, &ctx), ATTN_OK);
    CHECK_STATUS(attn_rng_new(NULL, 77, &rng), ATTN_OK);
    attn_rng_set_bernoulli_method(rng, ATTN_BERNOULLI_PHILOX);
    memset(x->want, 0x5a, sizeof x->want);
    x->want_drawn = SDPA_DRAWN_SENTINEL;
    CHECK_STATUS(sx_call(x, ctx, rng, x->want, &x->want_drawn), ATTN_OK);
    attn_rng_free(rng);
    attn_ctx_free(ctx);
    bool same = true;
    for (size_t i = 0; i < SX_OUTS; i++)
        same = same && (g_fell_back ? same_floats((const float *)x->outs[i],
                                                  (const float *)x->want[i], SDPA_MAX)
                                    : memcmp(x->outs[i], x->want[i], SX_BYTES) == 0);
    CHECK(same);
    CHECK(same_drawn(x->drawn, x->want_drawn));
}

static void sx_failed(void *p) {
    sx_state *x = p;
    bool untouched = true;
    for (size_t i = 0; i < SX_OUTS; i++)
        for (size_t j = 0; j < SX_BYTES; j++) untouched = untouched && x->outs[i][j] == 0x5a;
    CHECK(untouched);
    CHECK(same_drawn(x->drawn, SDPA_DRAWN_SENTINEL));
    /* the rng did not move: the same call now draws a fresh rng's draws */
    CHECK_STATUS(sx_run(x), ATTN_OK);
    sx_compare(x);
}

static void sx_ok(void *p) { sx_compare(p); }

static void sx_teardown(void *p) { sdpa_teardown(((sx_state *)p)->s); }

static void sweep_sdpa_more(void) {
    sdpa_state *s = calloc(1, sizeof *s);
    sx_state *x = calloc(1, sizeof *x);
    x->s = s;
    CHECK_STATUS(attn_rng_new(g_ctx, 77, &s->rng), ATTN_OK);
    CHECK_STATUS(attn_rng_set_bernoulli_method(s->rng, ATTN_BERNOULLI_PHILOX), ATTN_OK);
    static const sx_kind kinds[] = {SX_FORWARD_16, SX_BACKWARD_16, SX_DLSE_F32, SX_DLSE_16,
                                    SX_FLEX_FORWARD, SX_FLEX_BACKWARD};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        int kind = kinds[i];
        x->kind = kinds[i];
        for (int kernels = 0; kernels < 2; kernels++) {
            s->ctx_cfg = (attn_ctx_config){
                .kernels = kernels ? ATTN_KERNELS_REFERENCE : ATTN_KERNELS_AUTO};
            char name[160];
            snprintf(name, sizeof name, "%s, %s", sx_names[kind], kernels ? "reference" : "fused");
            sweep(&(sweep_op){.name = name, .setup = sx_setup, .run = sx_run,
                              .verify_failed = sx_failed, .verify_ok = sx_ok,
                              .teardown = sx_teardown, .state = x,
                              .ctx = &s->ctx});
        }
    }
    attn_rng_free(s->rng);
    free(x);
    free(s);
}

/* ---- the generating models: load, save, caches, forward -------------------- */

/* A GPT-2 and a Llama 3 (GQA, RoPE) of a few units: loaded from float32
 * (attn_lm_save's), bf16 and f16 files, from a directory with config.json;
 * saved over a file; their caches (float32, bf16, int8, int4); their
 * forward without a cache, a prefill into a contiguous cache and a decode
 * into a paged int8 one. A model a sweep loads or a forward runs on is
 * compared with one that never failed, by its logits, bit for bit. */
enum { LM_B = 2, LM_T = 5, LM_V = 29 };
static const attn_lm_config lm_gpt2 = {.arch = ATTN_LM_GPT2, .vocab_size = LM_V,
                                       .context_length = 12, .emb_dim = 8, .n_heads = 2,
                                       .n_layers = 2, .qkv_bias = true};
static const attn_lm_config lm_llama = {.arch = ATTN_LM_LLAMA3, .vocab_size = LM_V,
                                        .context_length = 12, .emb_dim = 16, .n_heads = 4,
                                        .n_layers = 2, .n_kv_groups = 2, .hidden_dim = 24,
                                        .rope_base = 10000.0};
static const int32_t lm_tokens[LM_B * LM_T] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
static const size_t lm_lens[LM_B] = {5, 3};

typedef enum lm_kind {
    LM_LOAD_GPT2, LM_LOAD_LLAMA_BF16, LM_LOAD_AS_BF16, LM_LOAD_EX_DIR, LM_SAVE, LM_CACHE_NEW,
    LM_CACHE_BF16, LM_CACHE_I8, LM_CACHE_F8, LM_FORWARD, LM_FORWARD_LAST, LM_PREFILL,
    LM_DECODE_PAGED_I8, LM_KINDS
} lm_kind;
static const char *const lm_names[] = {
    "attn_lm_load (gpt2, float32, a cfg)", "attn_lm_load (llama3, a bf16 file)",
    "attn_lm_load_as (gpt2 float32 as bf16)",
    "attn_lm_load_ex (llama3 f16 directory, config.json)", "attn_lm_save over a file (bf16)",
    "attn_lm_cache_new (paged)", "attn_kv_cache_new (the lm's, bf16 K/V)",
    "attn_kv_cache_new (the lm's, int8 K/V)", "attn_kv_cache_new (the lm's, f8_e4m3 K/V)",
    "attn_lm_forward (llama3 bf16, no cache, ragged)", "attn_lm_forward (gpt2, last_only)",
    "attn_lm_forward (llama3, prefill a cache)", "attn_lm_forward (llama3, decode, paged int8)"};

typedef struct lm_state {
    lm_kind kind;
    attn_lm *gpt2, *llama, *llama16; /* the sources: float32, and bf16 weights */
    char gpt2_path[128], llama_path[128], dir[128], save_path[128];
    attn_lm *got;
    attn_kv_cache *cache;
    float logits[LM_B * LM_T * LM_V], want[LM_B * LM_T * LM_V];
    unsigned char *bytes;
    size_t size;
} lm_state;

static attn_lm *lm_make(const attn_lm_config *cfg, attn_dtype dtype) {
    attn_lm_config c = *cfg;
    c.weights_dtype = dtype;
    attn_rng *rng;
    attn_lm *m = NULL;
    CHECK_STATUS(attn_rng_new(g_ctx, 5, &rng), ATTN_OK);
    CHECK_STATUS(attn_lm_new(g_ctx, &c, rng, &m), ATTN_OK);
    attn_rng_free(rng);
    return m;
}

/* m's parameters as a safetensors file of dtype tensors in its order. */
static void lm_write_16(attn_lm *m, const char *path, attn_dtype dtype) {
    size_t n = attn_lm_param_count(m), len = 0, offset = 0;
    static char header[16384];
    len += (size_t)snprintf(header, sizeof header, "{");
    for (size_t i = 0; i < n; i++) {
        attn_param p;
        CHECK_STATUS(attn_lm_param_at(m, i, &p), ATTN_OK);
        len += (size_t)snprintf(header + len, sizeof header - len,
                                "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", p.name,
                                attn_dtype_name(dtype));
        len += (size_t)snprintf(header + len, sizeof header - len,
                                p.ndim == 2 ? "%zu,%zu" : "%zu", p.shape[0], p.shape[1]);
        len += (size_t)snprintf(header + len, sizeof header - len,
                                "],\"data_offsets\":[%zu,%zu]}", offset, offset + 2 * p.numel);
        offset += 2 * p.numel;
    }
    len += (size_t)snprintf(header + len, sizeof header - len, "}");
    while (len % 8) header[len++] = ' ';
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    for (int k = 0; k < 8; k++) fputc((int)(((uint64_t)len >> (8 * k)) & 0xFF), f);
    fwrite(header, 1, len, f);
    for (size_t i = 0; i < n; i++) {
        attn_param p;
        attn_lm_param_at(m, i, &p);
        for (size_t j = 0; j < p.numel; j++) {
            uint16_t h = attn_float_to_half(dtype, p.data[j]);
            fputc(h & 0xFF, f);
            fputc(h >> 8, f);
        }
    }
    fclose(f);
}

/* Logits of the ragged batch without a cache. */
static attn_status lm_logits(attn_lm *m, float *logits) {
    attn_lm_forward_args a = {.tokens = lm_tokens, .batch = LM_B, .lens = lm_lens,
                              .logits = logits};
    return attn_lm_forward(m, &a);
}

static bool lm_same_logits(attn_lm *a, attn_lm *b) {
    static float x[LM_B * LM_T * LM_V], y[LM_B * LM_T * LM_V];
    memset(x, 0, sizeof x);
    memset(y, 0, sizeof y);
    return a && b && lm_logits(a, x) == ATTN_OK && lm_logits(b, y) == ATTN_OK &&
           memcmp(x, y, sizeof x) == 0;
}

static attn_lm *lm_source(lm_state *st) {
    return st->kind == LM_FORWARD_LAST || st->kind == LM_LOAD_GPT2 ? st->gpt2
           : st->kind == LM_FORWARD || st->kind == LM_SAVE        ? st->llama16
                                                                   : st->llama;
}

static attn_status lm_cache_of(lm_state *st, attn_lm *m, attn_kv_cache **out) {
    if (st->kind == LM_CACHE_NEW) return attn_lm_cache_new(m, LM_B, 0, ATTN_KV_PAGED, 4, out);
    attn_kv_cache_config c;
    CHECK_STATUS(attn_lm_cache_config(m, LM_B, 0, &c), ATTN_OK);
    attn_dtype d = st->kind == LM_CACHE_BF16 ? ATTN_DTYPE_BF16
                   : st->kind == LM_CACHE_F8 ? ATTN_DTYPE_F8_E4M3
                   : st->kind == LM_CACHE_I8 || st->kind == LM_DECODE_PAGED_I8 ? ATTN_DTYPE_I8
                                                                                : ATTN_DTYPE_F32;
    c.k_dtype = c.v_dtype = d;
    if (st->kind == LM_DECODE_PAGED_I8) {
        c.layout = ATTN_KV_PAGED;
        c.page_size = 2;
    }
    return attn_kv_cache_new(g_ctx, &c, out);
}

/* The forward the kind sweeps, into logits: for a cache, after the setup's
 * prefill (decode) or on an empty one (prefill). */
static attn_status lm_forward_of(lm_state *st, attn_lm *m, attn_kv_cache *cache, float *logits) {
    attn_lm_forward_args a = {.cache = cache, .tokens = lm_tokens, .batch = LM_B,
                              .lens = lm_lens, .logits = logits};
    if (st->kind == LM_FORWARD_LAST) a.last_only = true;
    if (st->kind == LM_DECODE_PAGED_I8) {
        a.lens = NULL;
        a.tokens_per_seq = 1;
        a.tokens = lm_tokens + 7;
    }
    return attn_lm_forward(m, &a);
}

/* For caches: the logits of a prefill (and for a decode, a decode) on c. */
static attn_status lm_prefill(lm_state *st, attn_lm *m, attn_kv_cache *c, float *logits) {
    attn_lm_forward_args a = {.cache = c, .tokens = lm_tokens, .batch = LM_B, .lens = lm_lens,
                              .logits = logits};
    attn_status s = attn_lm_forward(m, &a);
    if (s == ATTN_OK && st->kind == LM_DECODE_PAGED_I8) s = lm_forward_of(st, m, c, logits);
    return s;
}

static void lm_setup(void *p) {
    lm_state *st = p;
    st->got = NULL;
    st->cache = NULL;
    for (size_t i = 0; i < sizeof st->logits / sizeof st->logits[0]; i++)
        st->logits[i] = SENTINEL;
    if (st->kind == LM_SAVE) {
        FILE *f = fopen(st->save_path, "wb");
        CHECK(f && fwrite(st->bytes, 1, st->size, f) == st->size);
        if (f) fclose(f);
    }
    if (st->kind >= LM_FORWARD)
        st->got = lm_make(st->kind == LM_FORWARD_LAST ? &lm_gpt2 : &lm_llama,
                          st->kind == LM_FORWARD ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F32);
    if (st->kind == LM_PREFILL || st->kind == LM_DECODE_PAGED_I8) {
        CHECK_STATUS(lm_cache_of(st, st->llama, &st->cache), ATTN_OK);
        if (st->kind == LM_DECODE_PAGED_I8) {
            attn_lm_forward_args a = {.cache = st->cache, .tokens = lm_tokens, .batch = LM_B,
                                      .lens = lm_lens, .logits = st->want};
            CHECK_STATUS(attn_lm_forward(st->got, &a), ATTN_OK);
        }
    }
}

static attn_status lm_run(void *p) {
    lm_state *st = p;
    attn_lm **got = &st->got;
    static const char config[] =
        "{\"vocab_size\": 29, \"context_length\": 12, \"emb_dim\": 16, \"n_heads\": 4, "
        "\"n_layers\": 2, \"hidden_dim\": 24, \"n_kv_groups\": 2, \"rope_base\": 10000.0, "
        "\"rope_freq\": null}";
    switch (st->kind) {
    case LM_LOAD_GPT2:
        *got = (attn_lm *)&g_ctx;
        return attn_lm_load(g_ctx, st->gpt2_path, NULL, &lm_gpt2, got);
    case LM_LOAD_LLAMA_BF16:
        *got = (attn_lm *)&g_ctx;
        return attn_lm_load(g_ctx, st->llama_path, NULL, &lm_llama, got);
    case LM_LOAD_AS_BF16:
        *got = (attn_lm *)&g_ctx;
        return attn_lm_load_as(g_ctx, st->gpt2_path, NULL, &lm_gpt2, ATTN_DTYPE_BF16, got);
    case LM_LOAD_EX_DIR: {
        char path[160];
        snprintf(path, sizeof path, "%s/config.json", st->dir);
        FILE *f = fopen(path, "wb");
        CHECK(f && fwrite(config, 1, sizeof config - 1, f) == sizeof config - 1);
        if (f) fclose(f);
        *got = (attn_lm *)&g_ctx;
        return attn_lm_load_ex(g_ctx, st->dir, NULL, NULL, ATTN_DTYPE_F32,
                               ATTN_LM_LOAD_FILE_DTYPE | ATTN_LM_LOAD_NON_STRICT, got);
    }
    case LM_SAVE: return attn_lm_save(st->llama16, st->save_path);
    case LM_CACHE_NEW:
    case LM_CACHE_BF16:
    case LM_CACHE_I8:
    case LM_CACHE_F8:
        st->cache = (attn_kv_cache *)&g_ctx;
        return lm_cache_of(st, st->llama, &st->cache);
    default: return lm_forward_of(st, st->got, st->cache, st->logits);
    }
}

/* What the run made equals what one never failed makes. */
static void lm_ok(void *p) {
    lm_state *st = p;
    switch (st->kind) {
    case LM_LOAD_GPT2:
    case LM_LOAD_LLAMA_BF16:
    case LM_LOAD_AS_BF16:
    case LM_LOAD_EX_DIR: {
        attn_lm *fresh = NULL;
        attn_status (*again)(void *) = lm_run;
        attn_lm *keep = st->got;
        CHECK_STATUS(again(st), ATTN_OK);
        fresh = st->got;
        st->got = keep;
        CHECK(st->got && fresh);
        if (st->got && fresh) {
            attn_lm_config a = attn_lm_get_config(st->got), b = attn_lm_get_config(fresh);
            CHECK(a.arch == b.arch && a.n_layers == b.n_layers && a.emb_dim == b.emb_dim &&
                  a.weights_dtype == b.weights_dtype);
            CHECK(lm_same_logits(st->got, fresh));
        }
        /* and the file's model: bf16 files hold the bf16 source's weights */
        if (st->kind == LM_LOAD_LLAMA_BF16) {
            attn_lm *m16 = lm_make(&lm_llama, ATTN_DTYPE_BF16);
            CHECK(lm_same_logits(st->got, m16));
            attn_lm_free(m16);
        }
        if (st->kind == LM_LOAD_GPT2) CHECK(lm_same_logits(st->got, st->gpt2));
        attn_lm_free(fresh);
        break;
    }
    case LM_SAVE: {
        attn_lm *back = NULL;
        CHECK_STATUS(attn_lm_load_as(g_ctx, st->save_path, NULL, &lm_llama, ATTN_DTYPE_BF16,
                                     &back),
                     ATTN_OK);
        CHECK(lm_same_logits(back, st->llama16));
        attn_lm_free(back);
        CHECK(temporaries_in(g_dir) == 0);
        break;
    }
    case LM_CACHE_NEW:
    case LM_CACHE_BF16:
    case LM_CACHE_I8:
    case LM_CACHE_F8: {
        attn_kv_cache *fresh = NULL;
        CHECK_STATUS(lm_cache_of(st, st->llama, &fresh), ATTN_OK);
        static float a[LM_B * LM_T * LM_V], b[LM_B * LM_T * LM_V];
        CHECK_STATUS(lm_prefill(st, st->llama, st->cache, a), ATTN_OK);
        CHECK_STATUS(lm_prefill(st, st->llama, fresh, b), ATTN_OK);
        CHECK(memcmp(a, b, sizeof a) == 0);
        attn_kv_cache_free(fresh);
        break;
    }
    default: {
        /* a fresh cache (prefilled alike) and the same forward */
        attn_kv_cache *fresh = NULL;
        if (st->cache) {
            CHECK_STATUS(lm_cache_of(st, st->llama, &fresh), ATTN_OK);
            if (st->kind == LM_DECODE_PAGED_I8) {
                attn_lm_forward_args a = {.cache = fresh, .tokens = lm_tokens, .batch = LM_B,
                                          .lens = lm_lens, .logits = st->want};
                CHECK_STATUS(attn_lm_forward(st->llama, &a), ATTN_OK);
            }
        }
        for (size_t i = 0; i < sizeof st->want / sizeof st->want[0]; i++) st->want[i] = SENTINEL;
        CHECK_STATUS(lm_forward_of(st, lm_source(st), fresh, st->want), ATTN_OK);
        CHECK(same_floats(st->logits, st->want, sizeof st->want / sizeof st->want[0]));
        for (size_t l = 0; fresh && l < 2; l++)
            for (size_t s = 0; s < LM_B; s++) {
                size_t a = 0, b = 1;
                attn_kv_cache_length(st->cache, l, s, &a);
                attn_kv_cache_length(fresh, l, s, &b);
                CHECK(a == b);
            }
        attn_kv_cache_free(fresh);
        break;
    }
    }
}

static void lm_failed(void *p) {
    lm_state *st = p;
    switch (st->kind) {
    case LM_LOAD_GPT2:
    case LM_LOAD_LLAMA_BF16:
    case LM_LOAD_AS_BF16:
    case LM_LOAD_EX_DIR: CHECK(st->got == NULL); return;
    case LM_SAVE: {
        size_t size = 0;
        unsigned char *now = read_all(st->save_path, &size);
        CHECK(now && size == st->size && memcmp(now, st->bytes, size) == 0);
        CHECK(temporaries_in(g_dir) == 0);
        free(now);
        return;
    }
    case LM_CACHE_NEW:
    case LM_CACHE_BF16:
    case LM_CACHE_I8:
    case LM_CACHE_F8: CHECK(st->cache == NULL); return;
    default: break;
    }
    bool untouched = true;
    for (size_t i = 0; i < sizeof st->logits / sizeof st->logits[0]; i++)
        untouched = untouched && st->logits[i] == SENTINEL;
    CHECK(untouched);
    if (st->cache) {
        /* a layer's attention may fail after the earlier layers appended
         * (attn.h): layer 0 first, every sequence as before or appended */
        size_t before = st->kind == LM_DECODE_PAGED_I8;
        for (size_t s = 0; s < LM_B; s++) {
            size_t l0 = 0, l1 = 0, had = before ? lm_lens[s] : 0;
            size_t now = had + (before ? 1 : lm_lens[s]);
            attn_kv_cache_length(st->cache, 0, s, &l0);
            attn_kv_cache_length(st->cache, 1, s, &l1);
            CHECK((l0 == had || l0 == now) && (l1 == had || l1 == now) && (l1 <= l0));
        }
        /* reset, filled again: the forward then gives the results */
        CHECK_STATUS(attn_kv_cache_reset(st->cache), ATTN_OK);
        if (st->kind == LM_DECODE_PAGED_I8) {
            attn_lm_forward_args a = {.cache = st->cache, .tokens = lm_tokens, .batch = LM_B,
                                      .lens = lm_lens, .logits = st->want};
            CHECK_STATUS(attn_lm_forward(st->got, &a), ATTN_OK);
        }
    }
    CHECK_STATUS(lm_forward_of(st, st->got, st->cache, st->logits), ATTN_OK);
    lm_ok(st);
}

static void lm_teardown(void *p) {
    lm_state *st = p;
    if (st->got != (attn_lm *)&g_ctx) attn_lm_free(st->got);
    if (st->cache != (attn_kv_cache *)&g_ctx) attn_kv_cache_free(st->cache);
    st->got = NULL;
    st->cache = NULL;
}

static void sweep_lm(void) {
    lm_state *st = calloc(1, sizeof *st);
    st->gpt2 = lm_make(&lm_gpt2, ATTN_DTYPE_F32);
    st->llama = lm_make(&lm_llama, ATTN_DTYPE_F32);
    st->llama16 = lm_make(&lm_llama, ATTN_DTYPE_BF16);
    snprintf(st->gpt2_path, sizeof st->gpt2_path, "%s/gpt2.lm.safetensors", g_dir);
    snprintf(st->llama_path, sizeof st->llama_path, "%s/llama.bf16.safetensors", g_dir);
    snprintf(st->dir, sizeof st->dir, "%s/llama", g_dir);
    snprintf(st->save_path, sizeof st->save_path, "%s/saved.safetensors", g_dir);
    CHECK(mkdir(st->dir, 0700) == 0);
    CHECK_STATUS(attn_lm_save(st->gpt2, st->gpt2_path), ATTN_OK);
    lm_write_16(st->llama, st->llama_path, ATTN_DTYPE_BF16);
    char path[160];
    snprintf(path, sizeof path, "%s/model.safetensors", st->dir);
    lm_write_16(st->llama, path, ATTN_DTYPE_F16);
    /* the file a save replaces: the float32 Llama's */
    CHECK_STATUS(attn_lm_save(st->llama, st->save_path), ATTN_OK);
    st->bytes = read_all(st->save_path, &st->size);
    for (int k = 0; k < LM_KINDS; k++) {
        st->kind = (lm_kind)k;
        sweep(&(sweep_op){.name = lm_names[k], .setup = lm_setup, .run = lm_run,
                          .verify_failed = lm_failed, .verify_ok = lm_ok,
                          .teardown = lm_teardown, .state = st});
    }
    free(st->bytes);
    attn_lm_free(st->gpt2);
    attn_lm_free(st->llama);
    attn_lm_free(st->llama16);
    free(st);
}

/* ---- the KV cache: coded appends, draft trees, verified branches ----------- */

/* A contiguous cache (float32, or K/V coded int8, int4, bf16) with history;
 * the run appends two ragged sequences, attends a tree of 4 drafts, or
 * appends a branch of them. After a failure the lengths are as before, and
 * an attend then gives what it gives on a cache never failed. */
enum { KX_H = 4, KX_KH = 2, KX_D = 32, KX_ROWS = 6, KX_DRAFTS = 4 };
typedef enum kx_kind { KX_APPEND_I8, KX_APPEND_I4, KX_APPEND_BF16, KX_TREE, KX_TREE_I8,
                       KX_BRANCH, KX_KINDS } kx_kind;
static const char *const kx_names[] = {
    "attn_kv_cache_append (int8 K/V)", "attn_kv_cache_append (int4 K/V)",
    "attn_kv_cache_append (bf16 K/V)", "attn_kv_cache_attend_tree (float32)",
    "attn_kv_cache_attend_tree (int8 K/V, sinks)", "attn_kv_cache_append_branch"};
static const size_t kx_lens[2] = {2, 4};
static const int32_t kx_parents[KX_DRAFTS] = {-1, 0, 0, 2};
static const int32_t kx_branch[3] = {0, 2, 3};

typedef struct kx_state {
    kx_kind kind;
    attn_kv_cache *cache;
    float q[KX_ROWS * KX_H * KX_D], k[KX_ROWS * KX_KH * KX_D], v[KX_ROWS * KX_KH * KX_D];
    float sinks[KX_H];
    float out[KX_ROWS * KX_H * KX_D], want[KX_ROWS * KX_H * KX_D];
} kx_state;

static attn_kv_cache *kx_new(kx_state *st) {
    attn_dtype d = st->kind == KX_APPEND_I8 || st->kind == KX_TREE_I8 ? ATTN_DTYPE_I8
                   : st->kind == KX_APPEND_I4                         ? ATTN_DTYPE_I4
                   : st->kind == KX_APPEND_BF16                       ? ATTN_DTYPE_BF16
                                                                      : ATTN_DTYPE_F32;
    attn_kv_cache_config cfg = {.num_layers = 2, .batch = 2, .kv_heads = KX_KH,
                                .head_dim = KX_D, .max_len = 64, .k_dtype = d, .v_dtype = d};
    attn_kv_cache *c = NULL;
    CHECK_STATUS(attn_kv_cache_new(g_ctx, &cfg, &c), ATTN_OK);
    static float hist[(9 + 14) * KX_KH * KX_D];
    for (size_t i = 0; i < sizeof hist / sizeof hist[0]; i++)
        hist[i] = (float)((i * 7) % 23) / 11.0f - 1.0f;
    size_t lens[2] = {9, 5};
    CHECK_STATUS(attn_kv_cache_append(c, 1, lens, 0, hist, hist + 9 * KX_KH * KX_D), ATTN_OK);
    return c;
}

static attn_status kx_call(kx_state *st, attn_kv_cache *c, float *out) {
    switch (st->kind) {
    case KX_TREE:
    case KX_TREE_I8: {
        attn_kv_tree_args a = {.layer = 1, .seq = 1, .draft_tokens = KX_DRAFTS,
                               .parents = kx_parents, .q_heads = KX_H, .q = st->q,
                               .k_new = st->k, .v_new = st->v, .out = out,
                               .sinks = st->kind == KX_TREE_I8 ? st->sinks : NULL};
        return attn_kv_cache_attend_tree(c, &a);
    }
    case KX_BRANCH: return attn_kv_cache_append_branch(c, 1, 0, kx_branch, 3, st->k, st->v);
    default: return attn_kv_cache_append(c, 1, kx_lens, 0, st->k, st->v);
    }
}

/* An attend of one token each on layer 1: reads every row appended. */
static void kx_probe(kx_state *st, attn_kv_cache *c, float *out) {
    attn_kv_attend_args a = {.layer = 1, .new_tokens = 1, .q_heads = KX_H, .q = st->q,
                             .k_new = st->k, .v_new = st->v, .out = out};
    CHECK_STATUS(attn_kv_cache_attend(c, &a), ATTN_OK);
}

static void kx_setup(void *p) {
    kx_state *st = p;
    fill(st->q, sizeof st->q / sizeof st->q[0], -0.5f);
    fill(st->k, sizeof st->k / sizeof st->k[0], -0.3f);
    fill(st->v, sizeof st->v / sizeof st->v[0], 0.2f);
    for (size_t h = 0; h < KX_H; h++) st->sinks[h] = 0.3f * (float)h - 0.4f;
    st->cache = kx_new(st);
    for (size_t i = 0; i < sizeof st->out / sizeof st->out[0]; i++) st->out[i] = SENTINEL;
}

static attn_status kx_run(void *p) {
    kx_state *st = p;
    return kx_call(st, st->cache, st->out);
}

static void kx_ok(void *p) {
    kx_state *st = p;
    attn_kv_cache *fresh = kx_new(st);
    for (size_t i = 0; i < sizeof st->want / sizeof st->want[0]; i++) st->want[i] = SENTINEL;
    CHECK_STATUS(kx_call(st, fresh, st->want), ATTN_OK);
    CHECK(memcmp(st->out, st->want, sizeof st->out) == 0);
    for (size_t s = 0; s < 2; s++) {
        size_t a = 0, b = 1;
        attn_kv_cache_length(st->cache, 1, s, &a);
        attn_kv_cache_length(fresh, 1, s, &b);
        CHECK(a == b);
    }
    static float x[KX_ROWS * KX_H * KX_D], y[KX_ROWS * KX_H * KX_D];
    kx_probe(st, st->cache, x);
    kx_probe(st, fresh, y);
    CHECK(memcmp(x, y, 2 * KX_H * KX_D * sizeof(float)) == 0);
    attn_kv_cache_free(fresh);
}

static void kx_failed(void *p) {
    kx_state *st = p;
    bool untouched = true;
    for (size_t i = 0; i < sizeof st->out / sizeof st->out[0]; i++)
        untouched = untouched && st->out[i] == SENTINEL;
    CHECK(untouched);
    size_t a = 0, b = 0;
    CHECK_STATUS(attn_kv_cache_length(st->cache, 1, 0, &a), ATTN_OK);
    CHECK_STATUS(attn_kv_cache_length(st->cache, 1, 1, &b), ATTN_OK);
    CHECK(a == 9 && b == 5);
    CHECK_STATUS(kx_run(st), ATTN_OK);
    kx_ok(st);
}

static void kx_teardown(void *p) {
    kx_state *st = p;
    attn_kv_cache_free(st->cache);
    st->cache = NULL;
}

static void sweep_kv_more(void) {
    static kx_state st;
    for (int k = 0; k < KX_KINDS; k++) {
        st.kind = (kx_kind)k;
        sweep(&(sweep_op){.name = kx_names[k], .setup = kx_setup, .run = kx_run,
                          .verify_failed = kx_failed, .verify_ok = kx_ok,
                          .teardown = kx_teardown, .state = &st});
    }
}

/* ---- text: the tokenizer, datasets, loaders, pretraining -------------------- */

/* A GPT-2 tokenizer of 261 tokens (the 256 bytes, four merges, the end of
 * text) as vocab.json + merges.txt in a directory, and a tiny GPTModel of
 * its vocabulary pretrained on a short text. */
#define TX_VOCAB 261
#define TX_MAX_IDS 512
static const char tx_text[] =
    "I had always thought Jack Gisburn rather a cheap genius--though a good fellow enough--so it "
    "was no great surprise to me to hear that, in the height of his glory, he had dropped his "
    "painting, married a rich widow, and established himself in a villa on the Riviera. <|endof"
    "text|> The height of his glory: that was what the women called it.";

typedef struct tx_state {
    int which;
    char dir[96], ckpt[128];
    attn_tokenizer *tok, *made_tok;
    int32_t ids[TX_MAX_IDS], want_ids[TX_MAX_IDS];
    size_t n_ids, count, want_count;
    char text[1024], want_text[1024];
    attn_text_dataset *data, *want_data;
    attn_data_loader *loader;
    /* pretraining */
    attn_model *model;
    attn_rng *rng;
    attn_pretrain *run;
    size_t events;        /* events taken in the setup before the swept one */
    attn_pretrain_event want_ev[40];
    size_t want_events;
    float *weights;       /* the model's weights before the swept call */
    unsigned char *rng_state;
    unsigned char *model_bytes, *state_bytes;
    size_t model_size, state_size;
} tx_state;

static const attn_gpt_config tx_gpt = {.vocab_size = TX_VOCAB, .context_length = 8,
                                       .emb_dim = 8, .n_heads = 2, .n_layers = 1,
                                       .drop_rate = 0.1, .qkv_bias = false};

/* GPT-2's bytes_to_unicode, as UTF-8 */
static size_t tx_byte_char(unsigned b, char out[2]) {
    unsigned cp = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174 ? b
                  : b <= 32                                                 ? 256 + b
                  : b <= 160                                                ? 256 + 33 + (b - 127)
                                                                            : 256 + 67;
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

static void tx_write(const char *path, const char *bytes, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(bytes, 1, n, f) == n);
    if (f) fclose(f);
}

static void tx_files(tx_state *st) {
    snprintf(st->dir, sizeof st->dir, "%s/tok", g_dir);
    CHECK(mkdir(st->dir, 0700) == 0);
    static char json[8192];
    size_t n = 0;
    json[n++] = '{';
    for (unsigned b = 0; b < 256; b++) {
        char ch[2];
        size_t len = tx_byte_char(b, ch);
        json[n++] = '"';
        if (ch[0] == '"' || ch[0] == '\\') json[n++] = '\\';
        memcpy(json + n, ch, len);
        n += len;
        n += (size_t)snprintf(json + n, sizeof json - n, "\": %u, ", b);
    }
    n += (size_t)snprintf(json + n, sizeof json - n,
                          "\"he\": 256, \"\xC4\xA0t\": 257, \"\xC4\xA0the\": 258, \"ll\": 259, "
                          "\"<|endoftext|>\": 260}");
    char path[160];
    snprintf(path, sizeof path, "%s/vocab.json", st->dir);
    tx_write(path, json, n);
    static const char merges[] = "#version: 0.2\nh e\n\xC4\xA0 t\n\xC4\xA0t he\nl l\n";
    snprintf(path, sizeof path, "%s/merges.txt", st->dir);
    tx_write(path, merges, sizeof merges - 1);
}

static attn_pretrain_options tx_options(void) {
    attn_pretrain_options o = attn_pretrain_defaults();
    o.epochs = 2;
    o.batch_size = 4;
    o.max_length = 8;
    o.stride = 8;
    o.eval_freq = 4;
    o.eval_iter = 2;
    o.sample_tokens = 3;
    return o;
}

/* A fresh model, rng and run (seed 123), advanced by `events` events. */
static void tx_run_new(tx_state *st, attn_model **model, attn_rng **rng, attn_pretrain **run,
                       size_t events) {
    attn_pretrain_options o = tx_options();
    CHECK_STATUS(attn_rng_new(g_ctx, 123, rng), ATTN_OK);
    CHECK_STATUS(attn_model_new_gpt(g_ctx, &tx_gpt, *rng, model), ATTN_OK);
    CHECK_STATUS(attn_pretrain_new(g_ctx, *model, st->tok, tx_text, sizeof tx_text - 1, &o, *rng,
                                   run),
                 ATTN_OK);
    attn_pretrain_event ev;
    for (size_t i = 0; i < events; i++) CHECK_STATUS(attn_pretrain_next(*run, &ev), ATTN_OK);
}

static bool tx_same_event(const attn_pretrain_event *a, const attn_pretrain_event *b) {
    return a->kind == b->kind && a->epoch == b->epoch && a->step == b->step &&
           a->tokens_seen == b->tokens_seen &&
           memcmp(&a->step_loss, &b->step_loss, sizeof a->step_loss) == 0 &&
           memcmp(&a->train_loss, &b->train_loss, sizeof a->train_loss) == 0 &&
           memcmp(&a->val_loss, &b->val_loss, sizeof a->val_loss) == 0 &&
           a->sample_length == b->sample_length;
}

/* The events from here to the end equal those of the run never failed
 * (want_ev, recorded from event st->events on). */
static void tx_check_rest(tx_state *st, size_t from) {
    attn_pretrain_event ev;
    bool same = true;
    for (size_t i = from; i < st->want_events; i++)
        same = same && attn_pretrain_next(st->run, &ev) == ATTN_OK &&
               tx_same_event(&ev, &st->want_ev[i]);
    CHECK(same);
}

static float *tx_weights(attn_model *m) {
    const attn_param *p;
    size_t count, at = 0;
    attn_model_params(m, &p, &count);
    float *w = malloc(attn_model_num_scalars(m) * sizeof *w);
    for (size_t i = 0; w && i < count; i++) {
        memcpy(w + at, p[i].data, p[i].numel * sizeof *w);
        at += p[i].numel;
    }
    return w;
}

static bool tx_same_weights(tx_state *st) {
    float *now = tx_weights(st->model);
    bool same = now && memcmp(now, st->weights, attn_model_num_scalars(st->model) * 4) == 0;
    free(now);
    return same;
}

enum { TX_LOAD, TX_ENCODE, TX_DATASET_NEW, TX_DATASET_ENCODE, TX_LOADER_NEW,
       TX_PRETRAIN_NEW, TX_NEXT_STEP, TX_NEXT_EVAL, TX_NEXT_SAMPLE, TX_SAVE, TX_RESUME,
};
static const char *const tx_names[] = {
    "attn_tokenizer_load (gpt2 pair)", "attn_tokenizer_encode",
    "attn_text_dataset_new", "attn_text_dataset_encode", "attn_data_loader_new",
    "attn_pretrain_new", "attn_pretrain_next (the first step)", "attn_pretrain_next (eval)",
    "attn_pretrain_next (sample)", "attn_pretrain_save over a checkpoint",
    "attn_pretrain_resume"};
/* events before the swept one: step, step, step (eval follows), ... the
 * first epoch's sample follows its last step */
static size_t tx_first_event(const tx_state *st) {
    switch (st->which) {
    case TX_NEXT_STEP: return 0;
    case TX_NEXT_EVAL: return 1;
    case TX_SAVE:
    case TX_RESUME: return 3;
    default: break;
    }
    /* the first SAMPLE event */
    for (size_t i = 0; i < st->want_events; i++)
        if (st->want_ev[i].kind == ATTN_PRETRAIN_SAMPLE) return i;
    return 0;
}

static void tx_setup(void *p) {
    tx_state *st = p;
    st->made_tok = NULL;
    memset(st->ids, 0x5a, sizeof st->ids);
    memset(st->text, 0x5a, sizeof st->text);
    st->count = 12345;
    if (st->which < TX_PRETRAIN_NEW) return;
    st->events = st->which == TX_PRETRAIN_NEW ? 0 : tx_first_event(st);
    if (st->which == TX_PRETRAIN_NEW) {
        CHECK_STATUS(attn_rng_new(g_ctx, 123, &st->rng), ATTN_OK);
        CHECK_STATUS(attn_model_new_gpt(g_ctx, &tx_gpt, st->rng, &st->model), ATTN_OK);
        st->run = NULL;
    } else {
        tx_run_new(st, &st->model, &st->rng, &st->run, st->events);
    }
    free(st->weights);
    st->weights = tx_weights(st->model);
    free(st->rng_state);
    st->rng_state = malloc(attn_rng_state_size());
    CHECK_STATUS(attn_rng_get_state(st->rng, st->rng_state, attn_rng_state_size()), ATTN_OK);
    if (st->which == TX_NEXT_STEP || st->which == TX_NEXT_EVAL || st->which == TX_NEXT_SAMPLE) {
        /* the checkpoint a failed run resumes from; the one a save replaces */
        CHECK_STATUS(attn_pretrain_save(st->run, st->ckpt), ATTN_OK);
    }
    if (st->which == TX_RESUME) {
        /* a checkpoint two events later, resumed into a run at event 3 */
        attn_model *m2;
        attn_rng *r2;
        attn_pretrain *run2;
        tx_run_new(st, &m2, &r2, &run2, 5);
        CHECK_STATUS(attn_pretrain_save(run2, st->ckpt), ATTN_OK);
        attn_pretrain_free(run2);
        attn_model_free(m2);
        attn_rng_free(r2);
    }
    if (st->which == TX_SAVE) {
        /* the files the save replaces: a checkpoint of another point */
        attn_model *m2;
        attn_rng *r2;
        attn_pretrain *run2;
        tx_run_new(st, &m2, &r2, &run2, 1);
        CHECK_STATUS(attn_pretrain_save(run2, st->ckpt), ATTN_OK);
        attn_pretrain_free(run2);
        attn_model_free(m2);
        attn_rng_free(r2);
        char spath[160];
        snprintf(spath, sizeof spath, "%s.state", st->ckpt);
        free(st->model_bytes);
        free(st->state_bytes);
        st->model_bytes = read_all(st->ckpt, &st->model_size);
        st->state_bytes = read_all(spath, &st->state_size);
    }
}

static attn_status tx_run(void *p) {
    tx_state *st = p;
    attn_pretrain_event ev;
    switch (st->which) {
    case TX_LOAD:
        st->made_tok = (attn_tokenizer *)&g_ctx;
        return attn_tokenizer_load(g_ctx, st->dir, &st->made_tok);
    case TX_ENCODE:
        return attn_tokenizer_encode(st->tok, tx_text, sizeof tx_text - 1, st->ids, TX_MAX_IDS,
                                     &st->count);
    case TX_DATASET_NEW:
        st->data = (attn_text_dataset *)&g_ctx;
        return attn_text_dataset_new(g_ctx, st->want_ids, st->want_count, 8, 5, &st->data);
    case TX_DATASET_ENCODE:
        st->data = (attn_text_dataset *)&g_ctx;
        return attn_text_dataset_encode(g_ctx, st->tok, tx_text, sizeof tx_text - 1, 8, 5,
                                        &st->data);
    case TX_LOADER_NEW:
        st->loader = (attn_data_loader *)&g_ctx;
        return attn_data_loader_new(g_ctx, 37, 4, true, false, &st->loader);
    case TX_PRETRAIN_NEW: {
        attn_pretrain_options o = tx_options();
        st->run = (attn_pretrain *)&g_ctx;
        return attn_pretrain_new(g_ctx, st->model, st->tok, tx_text, sizeof tx_text - 1, &o,
                                 st->rng, &st->run);
    }
    case TX_SAVE: return attn_pretrain_save(st->run, st->ckpt);
    case TX_RESUME: return attn_pretrain_resume(st->run, st->ckpt);
    default: return attn_pretrain_next(st->run, &ev);
    }
}

static void tx_ok(void *p) {
    tx_state *st = p;
    switch (st->which) {
    case TX_LOAD: {
        int32_t ids[TX_MAX_IDS];
        size_t n = 0;
        CHECK(st->made_tok && attn_tokenizer_vocab_size(st->made_tok) == TX_VOCAB);
        CHECK_STATUS(attn_tokenizer_encode(st->made_tok, tx_text, sizeof tx_text - 1, ids,
                                           TX_MAX_IDS, &n), ATTN_OK);
        CHECK(n == st->want_count && memcmp(ids, st->want_ids, n * sizeof *ids) == 0);
        break;
    }
    case TX_ENCODE:
        CHECK(st->count == st->want_count &&
              memcmp(st->ids, st->want_ids, st->count * sizeof *st->ids) == 0);
        break;
    case TX_DATASET_NEW:
    case TX_DATASET_ENCODE: {
        attn_text_dataset *want = st->want_data;
        if (st->which == TX_DATASET_ENCODE)
            CHECK_STATUS(attn_text_dataset_encode(g_ctx, st->tok, tx_text, sizeof tx_text - 1, 8,
                                                  5, &want),
                         ATTN_OK);
        size_t n = attn_text_dataset_num_ids(st->data);
        CHECK(st->data && attn_text_dataset_len(st->data) == attn_text_dataset_len(want));
        CHECK(n == attn_text_dataset_num_ids(want) && n > 100 &&
              memcmp(attn_text_dataset_ids(st->data), attn_text_dataset_ids(want),
                     n * sizeof(int32_t)) == 0);
        if (want != st->want_data) attn_text_dataset_free(want);
        break;
    }
    case TX_LOADER_NEW: {
        CHECK(st->loader && attn_data_loader_len(st->loader) == 10);
        attn_rng *rng;
        size_t idx[4], count = 0;
        attn_rng_new(NULL, 3, &rng);
        CHECK_STATUS(attn_data_loader_begin(st->loader, rng), ATTN_OK);
        CHECK_STATUS(attn_data_loader_batch(st->loader, 9, idx, &count), ATTN_OK);
        CHECK(count == 1);
        attn_rng_free(rng);
        break;
    }
    case TX_PRETRAIN_NEW:
        CHECK(st->run != NULL);
        tx_check_rest(st, 0);
        break;
    case TX_SAVE: {
        /* the new pair resumes into a fresh run and continues as this one */
        attn_model *m2;
        attn_rng *r2;
        attn_pretrain *keep = st->run, *run2;
        tx_run_new(st, &m2, &r2, &run2, 0);
        CHECK_STATUS(attn_pretrain_resume(run2, st->ckpt), ATTN_OK);
        st->run = run2;
        tx_check_rest(st, st->events);
        st->run = keep;
        attn_pretrain_free(run2);
        attn_model_free(m2);
        attn_rng_free(r2);
        CHECK(temporaries_in(g_dir) == 0);
        break;
    }
    case TX_RESUME: tx_check_rest(st, 5); break;
    default: tx_check_rest(st, st->events + 1); break;
    }
}

static void tx_failed(void *p) {
    tx_state *st = p;
    bool untouched = true;
    for (size_t i = 0; i < sizeof st->ids; i++) untouched &= ((unsigned char *)st->ids)[i] == 0x5a;
    for (size_t i = 0; i < sizeof st->text; i++) untouched &= (unsigned char)st->text[i] == 0x5a;
    CHECK(untouched);
    switch (st->which) {
    case TX_LOAD: CHECK(st->made_tok == NULL); return;
    case TX_ENCODE:
        CHECK(st->count == 12345);
        CHECK_STATUS(tx_run(st), ATTN_OK);
        tx_ok(st);
        return;
    case TX_DATASET_NEW:
    case TX_DATASET_ENCODE: CHECK(st->data == NULL); return;
    case TX_LOADER_NEW: CHECK(st->loader == NULL); return;
    default: break;
    }
    /* pretraining: the model's weights and the generator as they were */
    unsigned char *now = malloc(attn_rng_state_size());
    CHECK_STATUS(attn_rng_get_state(st->rng, now, attn_rng_state_size()), ATTN_OK);
    bool rng_same = memcmp(now, st->rng_state, attn_rng_state_size()) == 0;
    free(now);
    if (st->which == TX_PRETRAIN_NEW) {
        CHECK(st->run == NULL);
        CHECK(rng_same && tx_same_weights(st));
        return;
    }
    if (st->which == TX_SAVE) {
        char spath[160];
        size_t a = 0, b = 0;
        snprintf(spath, sizeof spath, "%s.state", st->ckpt);
        unsigned char *model = read_all(st->ckpt, &a), *state = read_all(spath, &b);
        CHECK(model && a == st->model_size && memcmp(model, st->model_bytes, a) == 0);
        CHECK(state && b == st->state_size && memcmp(state, st->state_bytes, b) == 0);
        CHECK(temporaries_in(g_dir) == 0);
        free(model);
        free(state);
        CHECK(rng_same && tx_same_weights(st));
        /* the run goes on as if never saved */
        tx_check_rest(st, st->events);
        return;
    }
    if (st->which == TX_RESUME) {
        CHECK(rng_same && tx_same_weights(st));
        /* the run goes on from where it stood */
        tx_check_rest(st, st->events);
        return;
    }
    /* a failed step fails the run (later calls repeat the error); the
     * checkpoint taken before it resumes, and the run goes on as one that
     * never failed */
    attn_pretrain_event ev;
    CHECK_STATUS(attn_pretrain_next(st->run, &ev), ATTN_ERR_NO_MEMORY);
    CHECK_STATUS(attn_pretrain_resume(st->run, st->ckpt), ATTN_OK);
    tx_check_rest(st, st->events);
}

static void tx_teardown(void *p) {
    tx_state *st = p;
    if (st->made_tok != (attn_tokenizer *)&g_ctx) attn_tokenizer_free(st->made_tok);
    st->made_tok = NULL;
    if (st->which == TX_DATASET_NEW || st->which == TX_DATASET_ENCODE) {
        if (st->data != (attn_text_dataset *)&g_ctx) attn_text_dataset_free(st->data);
        st->data = NULL;
    }
    if (st->which == TX_LOADER_NEW) {
        if (st->loader != (attn_data_loader *)&g_ctx) attn_data_loader_free(st->loader);
        st->loader = NULL;
    }
    if (st->which >= TX_PRETRAIN_NEW) {
        if (st->run != (attn_pretrain *)&g_ctx) attn_pretrain_free(st->run);
        attn_model_free(st->model);
        attn_rng_free(st->rng);
        st->run = NULL;
        st->model = NULL;
        st->rng = NULL;
    }
}

static void sweep_text(void) {
    tx_state *st = calloc(1, sizeof *st);
    tx_files(st);
    snprintf(st->ckpt, sizeof st->ckpt, "%s/run.safetensors", g_dir);
    CHECK_STATUS(attn_tokenizer_load(g_ctx, st->dir, &st->tok), ATTN_OK);
    CHECK_STATUS(attn_tokenizer_encode(st->tok, tx_text, sizeof tx_text - 1, st->want_ids,
                                       TX_MAX_IDS, &st->want_count), ATTN_OK);
    CHECK(st->want_count > 100 && st->want_count < TX_MAX_IDS);
    CHECK_STATUS(attn_text_dataset_new(g_ctx, st->want_ids, st->want_count, 8, 5,
                                       &st->want_data), ATTN_OK);
    /* the whole run, never failed */
    attn_model *m;
    attn_rng *r;
    attn_pretrain *run;
    tx_run_new(st, &m, &r, &run, 0);
    attn_pretrain_event ev;
    while (st->want_events < 40 && attn_pretrain_next(run, &ev) == ATTN_OK &&
           ev.kind != ATTN_PRETRAIN_DONE)
        st->want_ev[st->want_events++] = ev;
    CHECK(ev.kind == ATTN_PRETRAIN_DONE && tx_first_event(st) > 5);
    attn_pretrain_free(run);
    attn_model_free(m);
    attn_rng_free(r);
    static const int kinds[] = {TX_LOAD, TX_ENCODE, TX_DATASET_NEW, TX_DATASET_ENCODE,
                                TX_LOADER_NEW, TX_PRETRAIN_NEW, TX_NEXT_STEP, TX_NEXT_EVAL,
                                TX_NEXT_SAMPLE, TX_SAVE, TX_RESUME};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        st->which = kinds[i];
        sweep(&(sweep_op){.name = tx_names[kinds[i]], .setup = tx_setup, .run = tx_run,
                          .verify_failed = tx_failed, .verify_ok = tx_ok,
                          .teardown = tx_teardown, .state = st});
    }
    attn_text_dataset_free(st->want_data);
    attn_tokenizer_free(st->tok);
    free(st->weights);
    free(st->rng_state);
    free(st->model_bytes);
    free(st->state_bytes);
    free(st);
}

/* ---- block maps from dense masks and callbacks ------------------------------- */

/* Documents AND causal over (2, 1, 150, 150), as a bool tensor, an additive
 * one (0 and -inf) and a callback; compared with a map built unfailed. */
typedef struct bx_state {
    int which; /* 0 bool, 1 additive, 2 callback */
    attn_block_mask_config cfg;
    uint8_t *bits;
    float *add;
    attn_block_mask *got, *want;
} bx_state;

static int bx_visible(void *user, size_t b, size_t h, size_t q, size_t k) {
    (void)user, (void)h;
    return (q + b) / 40 == (k + b) / 40 && k <= q;
}

static attn_status bx_build(bx_state *st, attn_block_mask **out) {
    static const size_t strides[4] = {BM_T * BM_T, 0, BM_T, 1};
    if (st->which == 0) return attn_block_mask_from_bool(g_ctx, &st->cfg, st->bits, strides, out);
    if (st->which == 1)
        return attn_block_mask_from_additive(g_ctx, &st->cfg, st->add, strides, out);
    return attn_block_mask_from_fn(g_ctx, &st->cfg, bx_visible, NULL, out);
}

static attn_status bx_run(void *p) {
    bx_state *st = p;
    st->got = (attn_block_mask *)&g_ctx;
    return bx_build(st, &st->got);
}

static void bx_failed(void *p) { CHECK(((bx_state *)p)->got == NULL); }

static void bx_ok(void *p) {
    bx_state *st = p;
    if (!st->want) CHECK_STATUS(bx_build(st, &st->want), ATTN_OK);
    CHECK(st->got && st->want && same_drawing(st->got, st->want));
}

static void bx_teardown(void *p) {
    bx_state *st = p;
    if (st->got != (attn_block_mask *)&g_ctx) attn_block_mask_free(st->got);
    st->got = NULL;
}

static void sweep_block_maps_dense(void) {
    static const char *const names[] = {"attn_block_mask_from_bool",
                                        "attn_block_mask_from_additive",
                                        "attn_block_mask_from_fn"};
    bx_state *st = calloc(1, sizeof *st);
    st->cfg = (attn_block_mask_config){2, 1, BM_T, BM_T, 64, 64};
    st->bits = malloc(2 * BM_T * BM_T);
    st->add = malloc(2 * BM_T * BM_T * sizeof(float));
    for (size_t b = 0; b < 2; b++)
        for (size_t q = 0; q < BM_T; q++)
            for (size_t k = 0; k < BM_T; k++) {
                size_t at = (b * BM_T + q) * BM_T + k;
                st->bits[at] = (uint8_t)bx_visible(NULL, b, 0, q, k);
                st->add[at] = st->bits[at] ? 0.25f * (float)(k % 3) : -INFINITY;
            }
    for (st->which = 0; st->which < 3; st->which++) {
        attn_block_mask_free(st->want);
        st->want = NULL;
        sweep(&(sweep_op){.name = names[st->which], .run = bx_run, .verify_failed = bx_failed,
                          .verify_ok = bx_ok, .teardown = bx_teardown, .state = st});
    }
    attn_block_mask_free(st->want);
    free(st->bits);
    free(st->add);
    free(st);
}

static bool weights_of_model_unchanged(attn_model *m, const float *w) {
    float *now = tx_weights(m);
    bool same = now && memcmp(now, w, attn_model_num_scalars(m) * sizeof *now) == 0;
    free(now);
    return same;
}

/* ---- files: int32 .npy, safetensors writers, models, the committed writer ----- */

typedef enum mf_kind {
    MF_NPY_READ_I32, MF_NPY_PARSE_I32, MF_ST_WRITE, MF_ST_WRITE_PARAMS, MF_MODEL_SAVE,
    MF_MODEL_LOAD, MF_FILE_COMMIT, MF_KINDS
} mf_kind;
static const char *const mf_names[] = {
    "npy: attn_npy_read_i32 (int64, big-endian)", "npy: attn_npy_parse_i32 (bool)",
    "safetensors: attn_safetensors_write over a file",
    "safetensors: attn_safetensors_write_params over a file",
    "model: attn_model_save over a file", "model: attn_model_load",
    "attn_file_open, _write, _commit over a file"};

typedef struct mf_state {
    mf_kind kind;
    char path[128];
    unsigned char *bytes, *image; /* the file replaced; an .npy image */
    size_t size, image_size;
    attn_npy_i32 npy;
    attn_model *m, *other; /* other was saved; m loads it */
    float *weights;
} mf_state;

static const float mf_a[6] = {1, -2, 3.5f, 4, 5, 6}, mf_b[3] = {0.25f, -0.5f, 8};

/* An .npy image of `count` values: int64 big-endian or bool. */
static unsigned char *mf_npy_image(bool boolean, size_t *size) {
    char header[128];
    int n = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, "
                     "'shape': (2, 5), }", boolean ? "|b1" : ">i8");
    while ((n + 11) % 64) header[n++] = ' ';
    header[n - 1] = '\n';
    size_t each = boolean ? 1 : 8, total = 10 + (size_t)n + 10 * each;
    unsigned char *img = calloc(1, total);
    memcpy(img, "\x93NUMPY\x01\x00", 8);
    img[8] = (unsigned char)n;
    memcpy(img + 10, header, (size_t)n);
    for (size_t i = 0; i < 10; i++) {
        unsigned char *at = img + 10 + n + i * each;
        if (boolean) *at = (unsigned char)(i % 3 == 0);
        else at[7] = (unsigned char)(i * 9), at[6] = (unsigned char)i;
    }
    *size = total;
    return img;
}

static void mf_restore(mf_state *st) {
    FILE *f = fopen(st->path, "wb");
    CHECK(f && fwrite(st->bytes, 1, st->size, f) == st->size);
    if (f) fclose(f);
}

static void mf_setup(void *p) {
    mf_state *st = p;
    memset(&st->npy, 0x5a, sizeof st->npy);
    if (st->kind >= MF_ST_WRITE && st->kind != MF_MODEL_LOAD) mf_restore(st);
}

static attn_status mf_run(void *p) {
    mf_state *st = p;
    switch (st->kind) {
    case MF_NPY_READ_I32: return attn_npy_read_i32(g_ctx, st->path, &st->npy);
    case MF_NPY_PARSE_I32: return attn_npy_parse_i32(g_ctx, st->image, st->image_size, &st->npy);
    case MF_ST_WRITE: {
        attn_named_tensor t[2] = {{"a", mf_a, 2, {2, 3}}, {"b", mf_b, 1, {3}}};
        attn_metadata_entry md[1] = {{"format", "pt"}};
        return attn_safetensors_write(g_ctx, st->path, t, 2, md, 1);
    }
    case MF_ST_WRITE_PARAMS: {
        const attn_param *params;
        size_t count;
        attn_model_params(st->other, &params, &count);
        return attn_safetensors_write_params(g_ctx, st->path, params, count, "model.");
    }
    case MF_MODEL_SAVE: return attn_model_save(st->other, st->path);
    case MF_MODEL_LOAD: return attn_model_load(st->m, st->path);
    case MF_FILE_COMMIT: {
        attn_file *f = NULL;
        attn_status s = attn_file_open(g_ctx, st->path, &f);
        if (s == ATTN_OK) s = attn_file_write(g_ctx, f, "new bytes", 9);
        if (s == ATTN_OK) return attn_file_commit(g_ctx, f);
        attn_file_discard(f);
        return s;
    }
    default: return ATTN_ERR_INVALID;
    }
}

static void mf_ok(void *p) {
    mf_state *st = p;
    switch (st->kind) {
    case MF_NPY_READ_I32:
        CHECK(st->npy.ndim == 2 && st->npy.numel == 10 && st->npy.data &&
              st->npy.data[7] == 7 * 256 + 63);
        attn_npy_i32_free(&st->npy);
        break;
    case MF_NPY_PARSE_I32:
        CHECK(st->npy.ndim == 2 && st->npy.numel == 10 && st->npy.data &&
              st->npy.data[6] == 1 && st->npy.data[7] == 0);
        attn_npy_i32_free(&st->npy);
        break;
    case MF_ST_WRITE: {
        attn_safetensors *s = NULL;
        float got[6] = {0};
        attn_safetensors_info info;
        CHECK_STATUS(attn_safetensors_open(g_ctx, st->path, &s), ATTN_OK);
        CHECK_STATUS(attn_safetensors_find(s, "a", &info), ATTN_OK);
        CHECK_STATUS(attn_safetensors_load(s, info.index, got, 6), ATTN_OK);
        CHECK(memcmp(got, mf_a, sizeof mf_a) == 0);
        attn_safetensors_free(s);
        break;
    }
    case MF_ST_WRITE_PARAMS:
    case MF_MODEL_SAVE: {
        /* the file holds other's weights */
        attn_safetensors *s = NULL;
        const attn_param *params;
        size_t count;
        bool same = true;
        attn_model_params(st->other, &params, &count);
        CHECK_STATUS(attn_safetensors_open(g_ctx, st->path, &s), ATTN_OK);
        for (size_t i = 0; s && i < count; i++) {
            char name[128];
            attn_safetensors_info info;
            snprintf(name, sizeof name, "%s%s", st->kind == MF_MODEL_SAVE ? "" : "model.",
                     params[i].name);
            float *got = malloc(params[i].numel * sizeof *got);
            same = same && attn_safetensors_find(s, name, &info) == ATTN_OK &&
                   attn_safetensors_load(s, info.index, got, params[i].numel) == ATTN_OK &&
                   memcmp(got, params[i].data, params[i].numel * sizeof *got) == 0;
            free(got);
        }
        CHECK(same);
        attn_safetensors_free(s);
        break;
    }
    case MF_MODEL_LOAD: {
        const attn_param *a, *b;
        size_t na, nb;
        bool same = true;
        attn_model_params(st->m, &a, &na);
        attn_model_params(st->other, &b, &nb);
        for (size_t i = 0; i < na && na == nb; i++)
            same = same && memcmp(a[i].data, b[i].data, a[i].numel * sizeof(float)) == 0;
        CHECK(same && na == nb);
        /* back to its own weights for the next step */
        size_t at = 0;
        for (size_t i = 0; i < na; i++) {
            memcpy(a[i].data, st->weights + at, a[i].numel * sizeof(float));
            at += a[i].numel;
        }
        break;
    }
    case MF_FILE_COMMIT: {
        size_t size = 0;
        unsigned char *now = read_all(st->path, &size);
        CHECK(now && size == 9 && memcmp(now, "new bytes", 9) == 0);
        free(now);
        break;
    }
    default: break;
    }
    CHECK(temporaries_in(g_dir) == 0);
}

static void mf_failed(void *p) {
    mf_state *st = p;
    if (st->kind <= MF_NPY_PARSE_I32) {
        attn_npy_i32 zero = {0};
        CHECK(memcmp(&st->npy, &zero, sizeof zero) == 0);
        return;
    }
    if (st->kind == MF_MODEL_LOAD) {
        CHECK(weights_of_model_unchanged(st->m, st->weights));
        return;
    }
    size_t size = 0;
    unsigned char *now = read_all(st->path, &size);
    CHECK(now && size == st->size && memcmp(now, st->bytes, size) == 0);
    CHECK(temporaries_in(g_dir) == 0);
    free(now);
}

static void sweep_more_files(void) {
    mf_state *st = calloc(1, sizeof *st);
    attn_rng *rng;
    CHECK_STATUS(attn_rng_new(g_ctx, 8, &rng), ATTN_OK);
    static const attn_gpt_config book = {.vocab_size = 11, .context_length = 6, .emb_dim = 8,
                                         .n_heads = 2, .n_layers = 1, .drop_rate = 0.1,
                                         .qkv_bias = true};
    CHECK_STATUS(attn_model_new_gpt(g_ctx, &book, rng, &st->other), ATTN_OK);
    CHECK_STATUS(attn_model_new_gpt(g_ctx, &book, rng, &st->m), ATTN_OK);
    st->weights = tx_weights(st->m);
    size_t size;
    unsigned char *img = mf_npy_image(false, &size);
    snprintf(st->path, sizeof st->path, "%s/i64.npy", g_dir);
    FILE *f = fopen(st->path, "wb");
    CHECK(f && fwrite(img, 1, size, f) == size);
    if (f) fclose(f);
    free(img);
    st->image = mf_npy_image(true, &st->image_size);
    for (int k = 0; k < MF_KINDS; k++) {
        st->kind = (mf_kind)k;
        if (k == MF_ST_WRITE) {
            /* every writer replaces this file; the load reads the saved model */
            snprintf(st->path, sizeof st->path, "%s/old.safetensors", g_dir);
            attn_named_tensor t = {"old", mf_b, 1, {3}};
            CHECK_STATUS(attn_safetensors_write(g_ctx, st->path, &t, 1, NULL, 0), ATTN_OK);
            st->bytes = read_all(st->path, &st->size);
        }
        if (k == MF_MODEL_LOAD) CHECK_STATUS(attn_model_save(st->other, st->path), ATTN_OK);
        if (k == MF_FILE_COMMIT) mf_restore(st);
        sweep(&(sweep_op){.name = mf_names[k], .setup = mf_setup, .run = mf_run,
                          .verify_failed = mf_failed, .verify_ok = mf_ok, .state = st});
    }
    free(st->image);
    free(st->bytes);
    free(st->weights);
    attn_model_free(st->m);
    attn_model_free(st->other);
    attn_rng_free(rng);
    free(st);
}

/* ---- products and sampling ---------------------------------------------------- */

/* attn_gemm, attn_matmul and attn_gemm_16 (bf16) on a fresh ctx (their
 * pack buffers allocated in the call: each has the reference kernel as its
 * fallback, so every run succeeds); attn_sample with nucleus sampling and
 * attn_sample_book, whose failures leave out and the rng as they were. */
enum { GX_M = 37, GX_N = 45, GX_K = 70 };
typedef struct gx_state {
    int which; /* 0 gemm, 1 matmul, 2 gemm_16, 3 sample (top_p), 4 sample_book */
    attn_ctx *ctx;
    attn_rng *rng;
    float a[GX_M * GX_K], b[GX_K * GX_N], c[GX_M * GX_N], want[GX_M * GX_N];
    uint16_t a16[GX_M * GX_K], b16[GX_K * GX_N];
    int32_t token;
} gx_state;

static attn_status gx_call(gx_state *st, attn_ctx *ctx, attn_rng *rng, float *c, int32_t *tok) {
    switch (st->which) {
    case 0:
        return attn_gemm(ctx, false, true, GX_M, GX_N, GX_K, 0.5f, st->a, GX_K, st->b, GX_K,
                         0.25f, c, GX_N);
    case 1: return attn_matmul(ctx, st->a, st->b, c, GX_M, GX_K, GX_N, false);
    case 2:
        return attn_gemm_16(ctx, ATTN_DTYPE_BF16, false, false, GX_M, GX_N, GX_K, 1.0f, st->a16,
                            GX_K, st->b16, GX_N, 0.0f, c, GX_N);
    case 3: {
        attn_sampling s = {.temperature = 0.8, .top_k = 30, .top_p = 0.9};
        return attn_sample(ctx, st->a, 50, &s, rng, tok);
    }
    default: return attn_sample_book(ctx, st->a, 50, 1.3, 20, rng, tok);
    }
}

static void gx_setup(void *p) {
    gx_state *st = p;
    fill(st->a, GX_M * GX_K, -0.7f);
    fill(st->b, GX_K * GX_N, 0.2f);
    for (size_t i = 0; i < GX_M * GX_K; i++)
        st->a16[i] = attn_float_to_half(ATTN_DTYPE_BF16, st->a[i]);
    for (size_t i = 0; i < GX_K * GX_N; i++)
        st->b16[i] = attn_float_to_half(ATTN_DTYPE_BF16, st->b[i]);
    fill(st->c, GX_M * GX_N, 1.0f);
    st->token = -7;
    CHECK_STATUS(attn_ctx_new(NULL, &st->ctx), ATTN_OK);
    attn_rng_manual_seed(st->rng, 41);
}

static attn_status gx_run(void *p) {
    gx_state *st = p;
    return gx_call(st, st->ctx, st->rng, st->c, &st->token);
}

static void gx_ok(void *p) {
    gx_state *st = p;
    attn_ctx *ctx;
    attn_rng *rng;
    int32_t tok = -7;
    CHECK_STATUS(attn_ctx_new(NULL, &ctx), ATTN_OK);
    CHECK_STATUS(attn_rng_new(NULL, 41, &rng), ATTN_OK);
    fill(st->want, GX_M * GX_N, 1.0f);
    CHECK_STATUS(gx_call(st, ctx, rng, st->want, &tok), ATTN_OK);
    CHECK(same_floats(st->c, st->want, GX_M * GX_N));
    CHECK(tok == st->token);
    attn_rng_free(rng);
    attn_ctx_free(ctx);
}

static void gx_failed(void *p) {
    gx_state *st = p;
    CHECK(st->token == -7);
    CHECK(rng_at(st->rng, 41, 0));
    attn_rng_manual_seed(st->rng, 41);
    CHECK_STATUS(gx_run(st), ATTN_OK);
    gx_ok(st);
}

static void gx_teardown(void *p) {
    gx_state *st = p;
    attn_ctx_free(st->ctx);
    st->ctx = NULL;
}

static void sweep_products(void) {
    static const char *const names[] = {"attn_gemm (a fresh ctx)", "attn_matmul (a fresh ctx)",
                                        "attn_gemm_16 (bf16, a fresh ctx)",
                                        "attn_sample (top_k, top_p)", "attn_sample_book"};
    gx_state *st = calloc(1, sizeof *st);
    CHECK_STATUS(attn_rng_new(g_ctx, 41, &st->rng), ATTN_OK);
    for (st->which = 0; st->which < 5; st->which++)
        sweep(&(sweep_op){.name = names[st->which], .setup = gx_setup, .run = gx_run,
                          .verify_failed = gx_failed, .verify_ok = gx_ok,
                          .teardown = gx_teardown, .state = st, .ctx = &st->ctx});
    attn_rng_free(st->rng);
    free(st);
}

int main(void) {
    if (attn_ctx_new(NULL, &g_ctx) != ATTN_OK) return 1;
    snprintf(g_dir, sizeof g_dir, "/tmp/attn_alloc_XXXXXX");
    if (!mkdtemp(g_dir)) return 1;

    sweep(&(sweep_op){.name = "attn_ctx_new", .setup = NULL, .run = ctx_new_run, .verify_failed = NULL, .verify_ok = NULL, .teardown = ctx_teardown, .state = NULL, .no_ctx = true});
    sweep(&(sweep_op){.name = "attn_rng_new", .setup = NULL, .run = rng_new_run, .verify_failed = rng_failed, .verify_ok = NULL, .teardown = rng_teardown, .state = NULL});
    sweep_modules();
    sweep_sdpa();
    sweep_files();
    sweep_model();
    sweep_kv_cache();
    sweep_generate();
    sweep_block_masks();
    sweep_sdpa_more();
    sweep_lm();
    sweep_kv_more();
    sweep_text();
    sweep_block_maps_dense();
    sweep_more_files();
    sweep_products();

    size_t total = 0;
    printf("allocations failed in turn, per operation:\n");
    for (size_t i = 0; i < g_num_rows; i++) {
        printf("  %-58s %4zu\n", g_rows[i].name, g_rows[i].calls);
        total += g_rows[i].calls;
    }
    printf("  %-58s %4zu\n", "total", total);
    printf("  (%zu of them had a fallback: the SGEMM ran on the reference kernel)\n", g_fallbacks);

    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    attn_ctx_free(g_ctx);
    return check_summary();
}
