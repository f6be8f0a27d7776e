/* module.c — the generic attn_module: parameters by name, training mode,
 * dispatch, and the checks every variant shares. */
#include "modules/module.h"

#include "fingerprint.h"
#include "kernels/dispatch.h"

#include "overlap.h"
#include "parallel.h"

#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void attn_module_init(attn_module *m, const attn_module_ops *ops, attn_ctx *ctx, size_t d_in,
                      size_t d_out) {
    memset(m, 0, sizeof *m);
    m->ops = ops;
    m->ctx = ctx;
    m->d_in = d_in;
    m->d_out = d_out;
    m->training = true;     /* nn.Module starts in training mode */
    m->grad_enabled = true; /* parameters require grad */
}

attn_status attn_module_reserve(attn_module *m, size_t count) {
    if (count <= m->capacity) return ATTN_OK;
    attn_param_slot *grown =
        count > (size_t)-1 / sizeof *grown ? NULL : attn_realloc(m->params, count * sizeof *grown);
    if (!grown)
        return attn_fail(m->ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory for %zu parameter tensors",
                         m->ops->class_name, count);
    m->params = grown;
    m->capacity = count;
    return ATTN_OK;
}

attn_status attn_module_declare(attn_module *m, size_t ndim, const size_t shape[2],
                                const char *name_fmt, ...) {
    if (m->num_params == m->capacity) {
        attn_status st = attn_module_reserve(m, m->capacity ? 2 * m->capacity : 8);
        if (st != ATTN_OK) return st;
    }
    attn_param_slot *slot = &m->params[m->num_params];
    memset(slot, 0, sizeof *slot);
    va_list args;
    va_start(args, name_fmt);
    vsnprintf(slot->name, sizeof slot->name, name_fmt, args);
    va_end(args);
    slot->ndim = ndim;
    slot->shape[0] = shape[0];
    slot->shape[1] = ndim == 2 ? shape[1] : 0;
    size_t numel = shape[0];
    if (ndim == 2 && !attn_mul_size(shape[0], shape[1], &numel))
        return attn_fail(m->ctx, ATTN_ERR_OVERFLOW, "%s: %s (%zu x %zu) overflows size_t",
                         m->ops->class_name, slot->name, shape[0], shape[1]);
    if (m->num_scalars > (size_t)-1 - numel)
        return attn_fail(m->ctx, ATTN_ERR_OVERFLOW,
                         "%s: %s (%zu scalars) after %zu earlier scalars overflows size_t",
                         m->ops->class_name, slot->name, numel, m->num_scalars);
    slot->numel = numel;
    slot->offset = m->num_scalars;
    m->num_scalars += numel;
    m->num_params++;
    return ATTN_OK;
}

attn_status attn_module_declare_linear(attn_module *m, const char *prefix, size_t in, size_t out,
                                       bool bias) {
    attn_status st = attn_module_declare(m, 2, (size_t[2]){out, in}, "%s.weight", prefix);
    if (st == ATTN_OK && bias) st = attn_module_declare(m, 1, (size_t[2]){out, 0}, "%s.bias", prefix);
    return st;
}

attn_status attn_module_alloc(attn_module *m) {
    /* data and grad for every scalar: the declarations checked num_scalars
     * against size_t, the doubling is checked here. */
    if (m->num_scalars > (size_t)-1 / 2 / sizeof(float))
        return attn_fail(m->ctx, ATTN_ERR_OVERFLOW,
                         "%s: %zu parameters and as many gradients overflow size_t bytes",
                         m->ops->class_name, m->num_scalars);
    m->storage = attn_alloc_floats(2 * m->num_scalars);
    m->versions = attn_calloc(3 * (m->num_params ? m->num_params : 1), sizeof *m->versions);
    if (!m->storage || !m->versions) {
        attn_free(m->storage);
        attn_free(m->versions);
        m->storage = NULL;
        m->versions = NULL;
        return attn_fail(m->ctx, ATTN_ERR_NO_MEMORY,
                         "%s: cannot allocate %zu parameters and their gradients",
                         m->ops->class_name, m->num_scalars);
    }
    return ATTN_OK;
}

/* Brings every parameter's version up to date: one more for each whose
 * data differs from the fingerprint of its version. The first call only
 * takes the fingerprints. A write through a pointer leaves no trace but
 * the data, so the data's fingerprint is what tells that it changed. */
static void observe_versions(attn_module *m) {
    size_t n = m->num_params;
    uint64_t *version = m->versions, *fingerprint = m->versions + n;
    for (size_t i = 0; i < n; i++) {
        uint64_t f = attn_fingerprint_floats(attn_module_data(m, i), m->params[i].numel);
        if (m->versions_seen && f != fingerprint[i]) version[i]++;
        fingerprint[i] = f;
    }
    m->versions_seen = true;
}

const uint64_t *attn_module_versions(attn_module *m) {
    observe_versions(m);
    return m->versions;
}

attn_status attn_module_check_versions(attn_module *m, const char *who) {
    return attn_module_check_versions_at(m, who, m->versions + 2 * m->num_params);
}

attn_status attn_module_check_versions_at(attn_module *m, const char *who,
                                          const uint64_t *at_forward) {
    size_t n = m->num_params;
    const uint64_t *version = attn_module_versions(m);
    for (size_t i = 0; i < n; i++)
        if (version[i] != at_forward[i])
            return attn_fail(m->ctx, ATTN_ERR_INVALID,
                             "%s: parameter %s was modified after the forward (version %llu at "
                             "the forward, %llu now): its gradient would mix the new weights with "
                             "the old activations; run the forward again",
                             who, m->params[i].name, (unsigned long long)at_forward[i],
                             (unsigned long long)version[i]);
    return ATTN_OK;
}

float *attn_module_data(attn_module *m, size_t index) {
    return m->storage + m->params[index].offset;
}

float *attn_module_grad(attn_module *m, size_t index) {
    return m->storage + m->num_scalars + m->params[index].offset;
}

attn_status attn_module_init_linear(attn_module *m, attn_rng *rng, size_t *index, bool bias,
                                    size_t in, size_t out) {
    float *w = attn_module_data(m, *index);
    float *b = bias ? attn_module_data(m, *index + 1) : NULL;
    *index += bias ? 2 : 1;
    return attn_rng_linear_init(rng, w, b, out, in);
}

attn_module_identity *attn_module_identity_of(attn_module *m) {
    if (!m->cp_id && (m->cp_id = attn_malloc(sizeof *m->cp_id)))
        atomic_init(&m->cp_id->holders, 1);
    return m->cp_id;
}

void attn_module_identity_hold(attn_module_identity *id) {
    atomic_fetch_add(&id->holders, 1);
}

void attn_module_identity_release(attn_module_identity *id) {
    if (id && atomic_fetch_sub(&id->holders, 1) == 1) attn_free(id);
}

void attn_module_release(attn_module *m) {
    attn_module_identity_release(m->cp_id);
    m->cp_id = NULL;
    attn_free(m->params);
    attn_free(m->storage);
    attn_free(m->versions);
    m->versions = NULL;
    attn_free(m->saved.x);
    attn_free(m->saved.acts);
    attn_free(m->saved.keep_bits);
    attn_attention_release(m);
    m->params = NULL;
    m->storage = NULL;
    memset(&m->saved, 0, sizeof m->saved);
}

/* ---- the generic view ---------------------------------------------------- */

attn_module_kind attn_module_get_kind(const attn_module *m) {
    return m ? m->ops->kind : ATTN_MODULE_SIMPLE;
}
const char *attn_module_class_name(const attn_module *m) { return m ? m->ops->class_name : ""; }
size_t attn_module_d_in(const attn_module *m) { return m ? m->d_in : 0; }
size_t attn_module_d_out(const attn_module *m) { return m ? m->d_out : 0; }
size_t attn_module_param_count(const attn_module *m) { return m ? m->num_params : 0; }
size_t attn_module_num_scalars(const attn_module *m) { return m ? m->num_scalars : 0; }
bool attn_module_training(const attn_module *m) { return m && m->training; }

static void fill_param(attn_module *m, size_t index, attn_param *out) {
    const attn_param_slot *slot = &m->params[index];
    *out = (attn_param){.name = slot->name,
                        .data = attn_module_data(m, index),
                        .grad = attn_module_grad(m, index),
                        .ndim = slot->ndim,
                        .shape = {slot->shape[0], slot->shape[1]},
                        .numel = slot->numel};
}

attn_status attn_module_param_at(attn_module *m, size_t index, attn_param *out) {
    if (!m) return ATTN_ERR_NULL;
    attn_clear_error(m->ctx);
    if (!out) return attn_fail(m->ctx, ATTN_ERR_NULL, "attn_module_param_at: out is NULL");
    if (index >= m->num_params)
        return attn_fail(m->ctx, ATTN_ERR_NOT_FOUND, "%s has %zu parameters; index %zu is out of range",
                         m->ops->class_name, m->num_params, index);
    fill_param(m, index, out);
    return ATTN_OK;
}

attn_status attn_module_param(attn_module *m, const char *name, attn_param *out) {
    if (!m) return ATTN_ERR_NULL;
    attn_clear_error(m->ctx);
    if (!name || !out)
        return attn_fail(m->ctx, ATTN_ERR_NULL, "attn_module_param: %s is NULL",
                         !name ? "name" : "out");
    for (size_t i = 0; i < m->num_params; i++) {
        if (strcmp(m->params[i].name, name) == 0) {
            fill_param(m, i, out);
            return ATTN_OK;
        }
    }
    return attn_fail(m->ctx, ATTN_ERR_NOT_FOUND, "%s has no parameter named '%s'",
                     m->ops->class_name, name);
}

attn_status attn_module_set_training(attn_module *m, bool training) {
    if (!m) return ATTN_ERR_NULL;
    attn_clear_error(m->ctx);
    m->training = training;
    return ATTN_OK;
}

attn_status attn_module_forward(attn_module *m, const float *x, size_t batch, size_t tokens,
                                float *y, attn_rng *rng) {
    if (!m) return ATTN_ERR_NULL;
    return m->ops->forward(m, x, batch, tokens, y, rng);
}

attn_status attn_module_set_grad_enabled(attn_module *m, bool enabled) {
    if (!m) return ATTN_ERR_NULL;
    attn_clear_error(m->ctx);
    m->grad_enabled = enabled;
    return ATTN_OK;
}

bool attn_module_grad_enabled(const attn_module *m) { return m && m->grad_enabled; }

attn_status attn_module_zero_grad(attn_module *m) {
    if (!m) return ATTN_ERR_NULL;
    attn_clear_error(m->ctx);
    if (m->num_scalars) memset(m->storage + m->num_scalars, 0, m->num_scalars * sizeof(float));
    return ATTN_OK;
}

attn_status attn_module_backward(attn_module *m, const float *dy, size_t batch, size_t tokens,
                                 float *dx) {
    if (!m) return ATTN_ERR_NULL;
    attn_clear_error(m->ctx);
    const char *name = m->ops->class_name;
    if (!dy) return attn_fail(m->ctx, ATTN_ERR_NULL, "%s backward: dy is NULL", name);
    if (!m->saved.valid)
        return attn_fail(m->ctx, ATTN_ERR_INVALID,
                         "%s backward: no forward to differentiate (call forward first, with "
                         "gradients enabled)",
                         name);
    if (batch != m->saved.batch || tokens != m->saved.tokens)
        return attn_fail(m->ctx, ATTN_ERR_SHAPE,
                         "%s backward: dy is (%zu, %zu, %zu) but the forward's output was "
                         "(%zu, %zu, %zu)",
                         name, batch, tokens, m->d_out, m->saved.batch, m->saved.tokens, m->d_out);
    /* sizes of the forward's, which fit; dx is written while dy is read */
    char who[96];
    snprintf(who, sizeof who, "%s backward", name);
    attn_status st = attn_module_check_spans(m, who, true, "dy", dy, "dx", dx, batch * tokens);
    if (st == ATTN_OK) st = attn_module_check_versions(m, who);
    if (st != ATTN_OK) return st;
    return m->ops->backward(m, dy, dx);
}

void attn_module_free(attn_module *m) {
    if (!m) return;
    attn_module_release(m);
    attn_free(m); /* the base is the first member of every variant */
}

/* ---- shared checks --------------------------------------------------------- */

attn_status attn_check_width(attn_ctx *ctx, const char *module, const char *name, size_t value) {
    if (value == 0) return attn_fail(ctx, ATTN_ERR_INVALID, "%s: %s must be positive, got 0", module, name);
    return ATTN_OK;
}

attn_status attn_check_dropout(attn_ctx *ctx, const char *module, double p) {
    char number[ATTN_NUMBER_CHARS];
    if (!(p >= 0.0 && p <= 1.0))
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: dropout (%s) must be in [0, 1]", module,
                         attn_number_text(p, number));
    return ATTN_OK;
}

attn_status attn_check_scale(attn_ctx *ctx, const char *module, double scale) {
    if (!isfinite(scale))
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: scale (%g) must be finite", module, scale);
    /* At FLT_MAX plus half an ulp, rounding to float gives infinity. */
    if (fabs(scale) >= 0x1.ffffffp127)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: scale (%.9g) is beyond float32's range (largest %.9g)", module,
                         scale, (double)FLT_MAX);
    return ATTN_OK;
}

attn_status attn_check_mask(attn_ctx *ctx, const char *module, attn_mask_method mask) {
    if (mask != ATTN_MASK_NEG_INF && mask != ATTN_MASK_RENORMALIZE && mask != ATTN_MASK_NONE)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: unknown mask method %d", module, (int)mask);
    return ATTN_OK;
}

attn_status attn_check_heads(attn_ctx *ctx, const char *module, size_t d_out, size_t num_heads) {
    if (num_heads == 0)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: num_heads must be positive, got 0", module);
    if (d_out % num_heads != 0)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: d_out (%zu) must be divisible by num_heads (%zu)",
                         module, d_out, num_heads);
    return ATTN_OK;
}

float attn_default_scale(double cfg_scale, size_t head_dim) {
    return cfg_scale != 0.0 ? (float)cfg_scale : (float)(1.0 / sqrt((double)head_dim));
}

attn_status attn_check_forward(attn_module *m, const float *x, size_t batch, size_t tokens,
                               const float *y, size_t context_length, size_t max_width,
                               bool needs_rng, const attn_rng *rng) {
    attn_clear_error(m->ctx);
    const char *name = m->ops->class_name;
    if (!x || !y)
        return attn_fail(m->ctx, ATTN_ERR_NULL, "%s forward: %s is NULL", name, !x ? "x" : "y");
    if (batch == 0 || tokens == 0)
        return attn_fail(m->ctx, ATTN_ERR_SHAPE, "%s forward: batch (%zu) and tokens (%zu) must be positive",
                         name, batch, tokens);
    if (context_length && tokens > context_length)
        return attn_fail(m->ctx, ATTN_ERR_SHAPE,
                         "%s forward: sequence length (%zu) exceeds context_length (%zu)", name,
                         tokens, context_length);
    /* Activations (B, T, width) and the traced (B, H, T, T) scores must fit. */
    size_t activations, scores;
    if (!attn_mul3_size(batch, tokens, max_width, &activations) ||
        !attn_mul3_size(batch, tokens, tokens, &scores) || !attn_floats_fit(activations) ||
        !attn_floats_fit(scores) || !attn_floats_fit(4 * attn_max_size(activations, scores)))
        return attn_fail(m->ctx, ATTN_ERR_OVERFLOW,
                         "%s forward: batch (%zu) x tokens (%zu) x width (%zu) activations, or "
                         "batch x tokens x tokens scores: the count overflows a float buffer",
                         name, batch, tokens, max_width);
    if (needs_rng && !rng)
        return attn_fail(m->ctx, ATTN_ERR_NULL,
                         "%s forward: training mode with dropout needs an rng (or set eval mode)",
                         name);
    /* the projections read x while y is written (widths within max_width) */
    char who[96];
    snprintf(who, sizeof who, "%s forward", name);
    return attn_module_check_spans(m, who, false, "x", x, "y", y, batch * tokens);
}

attn_status attn_module_check_spans(const attn_module *m, const char *who, bool backward,
                                    const char *in_name, const float *in, const char *out_name,
                                    const float *out, size_t rows) {
    /* backward: dy in (d_out wide), dx out (d_in); the gradients written,
     * the parameters read. forward: x in (d_in), y out (d_out); neither
     * the parameters nor their gradients written over */
    size_t params = m->num_scalars * sizeof(float);
    size_t in_width = backward ? m->d_out : m->d_in, out_width = backward ? m->d_in : m->d_out;
    attn_span outs[] = {{out_name, out, rows * out_width * sizeof(float)},
                        {"the module's gradients", m->storage + m->num_scalars, params}};
    attn_span ins[] = {{in_name, in, rows * in_width * sizeof(float)},
                       {backward ? "the module's parameters" : "the module's parameters and gradients",
                        m->storage, backward ? params : 2 * params}};
    return attn_check_overlap(m->ctx, who, outs, backward ? 2 : 1, ins, 2);
}

float *attn_scratch(attn_module *m, size_t n, attn_status *status) {
    float *p = attn_alloc_floats(n);
    *status = p ? ATTN_OK
                : attn_fail(m->ctx, ATTN_ERR_NO_MEMORY, "%s: cannot allocate %zu floats",
                            m->ops->class_name, n);
    return p;
}

/* Grows *buf to hold n floats (contents not kept). */
static bool reserve_floats(float **buf, size_t *cap, size_t n) {
    if (n <= *cap && *buf) return true;
    float *grown = attn_alloc_floats(n ? n : 1);
    if (!grown) return false;
    attn_free(*buf);
    *buf = grown;
    *cap = n;
    return true;
}

attn_status attn_forward_prepare(attn_module *m, size_t batch, size_t tokens, size_t n_acts,
                                 size_t n_bits, float **acts, uint8_t **keep_bits) {
    attn_saved *s = &m->saved;
    s->valid = false;
    s->has_mask = false;
    s->philox = false;
    s->drop_all = false;
    *keep_bits = NULL;
    if (!m->grad_enabled) {
        attn_status st;
        *acts = attn_scratch(m, n_acts, &st);
        return st;
    }
    size_t n_x = batch * tokens * m->d_in; /* checked by attn_check_forward */
    if (!reserve_floats(&s->x, &s->x_cap, n_x))
        return attn_fail(m->ctx, ATTN_ERR_NO_MEMORY, "%s: cannot keep the input (%zu floats)",
                         m->ops->class_name, n_x);
    if (!reserve_floats(&s->acts, &s->acts_cap, n_acts))
        return attn_fail(m->ctx, ATTN_ERR_NO_MEMORY, "%s: cannot keep %zu activations",
                         m->ops->class_name, n_acts);
    *acts = s->acts;
    if (n_bits) {
        size_t bytes = n_bits / 8 + 1;
        if (bytes > s->bits_cap) {
            uint8_t *grown = attn_calloc(bytes, 1);
            if (!grown)
                return attn_fail(m->ctx, ATTN_ERR_NO_MEMORY, "%s: cannot keep a dropout mask of %zu bits",
                                 m->ops->class_name, n_bits);
            attn_free(s->keep_bits);
            s->keep_bits = grown;
            s->bits_cap = bytes;
        }
        memset(s->keep_bits, 0, bytes);
        *keep_bits = s->keep_bits;
        s->has_mask = true;
    }
    return ATTN_OK;
}

attn_status attn_forward_keep(attn_module *m, const float *x, size_t batch, size_t tokens,
                              float kept_scale) {
    attn_saved *s = &m->saved;
    size_t n = batch * tokens * m->d_in; /* checked by attn_check_forward */
    /* attn_forward_prepare made the room: nothing to allocate here */
    if (!reserve_floats(&s->x, &s->x_cap, n))
        return attn_fail(m->ctx, ATTN_ERR_NO_MEMORY, "%s: cannot keep the input (%zu floats)",
                         m->ops->class_name, n);
    memcpy(s->x, x, n * sizeof *x);
    /* the versions of the weights this forward read, for its backward */
    observe_versions(m);
    if (m->num_params) /* a module without parameters has no versions */
        memcpy(m->versions + 2 * m->num_params, m->versions,
               m->num_params * sizeof *m->versions);
    s->batch = batch;
    s->tokens = tokens;
    s->kept_scale = kept_scale;
    s->valid = true;
    return ATTN_OK;
}

void attn_forward_release(attn_module *m, float *acts) {
    if (acts != m->saved.acts) attn_free(acts);
    attn_attention_release(m);
}

/* ---- the attention ------------------------------------------------------ */

attn_attention_problem attn_heads_problem(size_t batch, size_t tokens, size_t q_heads,
                                          size_t kv_heads, size_t head_dim, const float *q,
                                          const float *k, const float *v, float *out,
                                          float *lse, float scale, bool causal,
                                          attn_mask_method mask) {
    size_t q_width = q_heads * head_dim, kv_width = kv_heads * head_dim;
    attn_view_strides qs = {tokens * q_width, q_width, head_dim};
    attn_view_strides kvs = {tokens * kv_width, kv_width, head_dim};
    return (attn_attention_problem){
        .batch = batch, .q_heads = q_heads, .kv_heads = kv_heads, .q_len = tokens,
        .kv_len = tokens, .head_dim = head_dim, .v_head_dim = head_dim,
        .q = attn_view_f32(q, qs), .k = attn_view_f32(k, kvs), .v = attn_view_f32(v, kvs),
        .out = attn_view_f32(out, qs), .lse = lse,
        .scale = scale, .causal = causal && mask != ATTN_MASK_NONE,
        .renormalize = causal && mask == ATTN_MASK_RENORMALIZE,
    };
}

/* The trace wants the (B, Hq, T, S) scores, weights and dropped weights:
 * their floats each (0: no trace), or false when they overflow. */
static bool traced_floats(const attn_module *m, const attn_attention_problem *p, size_t *n) {
    *n = 0;
    if (!attn_trace_wants_data(m->ctx)) return true;
    return attn_mul3_size(p->batch * p->q_heads, p->q_len, p->kv_len, n) &&
           *n <= ((size_t)-1 / 4) / sizeof(float);
}

/* Bytes of a forward's workspace: the runner's, then the trace's copies. */
static attn_status forward_bytes(attn_module *m, const attn_attention_problem *p,
                                 bool mask_in_workspace, size_t *bytes, size_t *traced) {
    if (!traced_floats(m, p, traced))
        return attn_fail(m->ctx, ATTN_ERR_OVERFLOW,
                         "%s forward: tracing (%zu, %zu, %zu, %zu) scores overflows size_t",
                         m->ops->class_name, p->batch, p->q_heads, p->q_len, p->kv_len);
    size_t runner = attn_attention_forward_bytes(m->ctx, p, mask_in_workspace, *traced != 0);
    runner = (runner + 7) / 8 * 8; /* the trace's floats start aligned */
    if (runner > (size_t)-1 - 3 * *traced * sizeof(float))
        return attn_fail(m->ctx, ATTN_ERR_OVERFLOW, "%s forward: the attention workspace overflows",
                         m->ops->class_name);
    *bytes = runner + 3 * *traced * sizeof(float);
    return ATTN_OK;
}

static attn_status grow_work(attn_module *m, size_t bytes, const char *pass) {
    if (bytes <= m->work_bytes && m->work) return ATTN_OK;
    /* on whole lines, as the ctx's (attn_ctx_workspace): calloc's large
     * blocks come from mmap 16 bytes past a line */
    void *grown = attn_aligned_alloc(64, bytes);
    if (!grown)
        return attn_fail(m->ctx, ATTN_ERR_NO_MEMORY,
                         "%s %s: cannot allocate %zu bytes of attention workspace",
                         m->ops->class_name, pass, bytes);
    attn_free(m->work);
    m->work = grown;
    m->work_bytes = bytes;
    return ATTN_OK;
}

/* Whether a forward whose dropout draws from rng draws a serial
 * (PyTorch-ordered) mask, which lives as bits; Philox is redrawn. */
static bool serial_dropout(const attn_rng *rng) {
    return rng && attn_rng_bernoulli(rng) != ATTN_BERNOULLI_PHILOX;
}

bool attn_keeps_attention_mask(const attn_module *m, const attn_rng *rng) {
    return m->grad_enabled && serial_dropout(rng);
}

attn_status attn_attention_reserve(attn_module *m, const attn_attention_problem *p,
                                   bool backward, const attn_rng *dropout_rng) {
    if (backward) return grow_work(m, attn_attention_backward_bytes(m->ctx, p), "backward");
    /* without gradients a serial mask is drawn into the workspace */
    bool mask_in_workspace = serial_dropout(dropout_rng) && !m->grad_enabled;
    size_t bytes = 0, traced = 0;
    attn_status st = forward_bytes(m, p, mask_in_workspace, &bytes, &traced);
    return st == ATTN_OK ? grow_work(m, bytes, "forward") : st;
}

void attn_attention_release(attn_module *m) {
    attn_free(m->work);
    m->work = NULL;
    m->work_bytes = 0;
}

attn_status attn_run_attention_backward(attn_module *m, const attn_attention_problem *p,
                                        const attn_attention_grads *g, size_t call,
                                        const uint8_t *keep_bits) {
    const attn_saved *s = &m->saved;
    attn_attention_dropout drop = {.kind = ATTN_DROP_NONE, .kept_scale = s->kept_scale,
                                   .kept_scale_f64 = s->kept_scale};
    if (s->drop_all) {
        drop.kind = ATTN_DROP_PHILOX; /* p = 1, as the forward ran it: no draw is under 0 */
    } else if (keep_bits) {
        drop.kind = ATTN_DROP_BITS;
        drop.keep_bits = keep_bits;
    } else if (s->philox) {
        drop.kind = ATTN_DROP_PHILOX;
        drop.seed = s->philox_seed;
        drop.offset = s->philox_offset + call;
        drop.keep_threshold = s->keep_threshold;
    }
    bool reserved = m->work && m->work_bytes >= attn_attention_backward_bytes(m->ctx, p);
    return attn_attention_backward(m->ctx, m->ops->class_name, p, &drop, g,
                                   reserved ? m->work : NULL);
}

attn_status attn_run_attention(attn_module *m, const attn_attention_problem *p,
                               attn_dropout_stream *dropout, uint8_t *keep_bits) {
    attn_saved *s = &m->saved;
    bool drawn = dropout && !dropout->passthrough && !dropout->drop_all;
    bool serial = drawn && dropout->method != ATTN_BERNOULLI_PHILOX;
    size_t bytes = 0, traced = 0;
    attn_status st = forward_bytes(m, p, serial && !keep_bits, &bytes, &traced);
    if (st != ATTN_OK) return st;
    /* the pass reserved the workspace, or it is allocated here, before the
     * stream is drawn from and before out is written */
    bool reserved = m->work && m->work_bytes >= bytes;
    if (!reserved && (st = grow_work(m, bytes, "forward")) != ATTN_OK) return st;
    if (dropout && !dropout->passthrough && dropout->drop_all) s->drop_all = true;
    if (drawn && !serial && !s->philox) {
        s->philox = true; /* the forward's first Philox call */
        s->philox_seed = dropout->philox_seed;
        s->philox_offset = dropout->philox_offset;
        s->keep_threshold = dropout->keep_threshold;
    }
    attn_attention_trace trace = {0};
    if (traced) {
        float *copies = (float *)((char *)m->work + (bytes - 3 * traced * sizeof(float)));
        trace = (attn_attention_trace){copies, copies + traced, dropout ? copies + 2 * traced : NULL};
    }
    st = attn_attention_forward(m->ctx, m->ops->class_name, p, dropout, keep_bits, &trace, NULL,
                                m->work);
    if (st == ATTN_OK && m->ctx->trace) {
        const char *name = m->ops->class_name;
        size_t shape[4] = {p->batch, p->q_heads, p->q_len, p->kv_len};
        attn_trace(m->ctx, name, "attn_scores", 4, shape, trace.scores);
        attn_trace(m->ctx, name, "attn_weights", 4, shape, trace.weights);
        if (dropout) attn_trace(m->ctx, name, "attn_weights (dropout)", 4, shape, trace.dropped);
    }
    if (!reserved) attn_attention_release(m);
    return st;
}

void attn_trace_btc(attn_module *m, const char *name, size_t batch, size_t tokens, size_t width,
                    const float *data) {
    size_t shape[3] = {batch, tokens, width};
    attn_trace(m->ctx, m->ops->class_name, name, 3, shape, data);
}

void attn_project_qkv(attn_module *m, const attn_qkv_weights *w, const float *x, size_t batch,
                      size_t tokens, size_t d_out, float *q, float *k, float *v) {
    size_t rows = batch * tokens, d_in = m->d_in;
    if (w->linear) {
        attn_k_linear(m->ctx, x, w->wq, w->bq, q, rows, d_in, d_out);
        attn_k_linear(m->ctx, x, w->wk, w->bk, k, rows, d_in, d_out);
        attn_k_linear(m->ctx, x, w->wv, w->bv, v, rows, d_in, d_out);
    } else {
        attn_k_matmul(m->ctx, x, w->wq, q, rows, d_in, d_out, false, false);
        attn_k_matmul(m->ctx, x, w->wk, k, rows, d_in, d_out, false, false);
        attn_k_matmul(m->ctx, x, w->wv, v, rows, d_in, d_out, false, false);
    }
    attn_trace_btc(m, "queries", batch, tokens, d_out, q);
    attn_trace_btc(m, "keys", batch, tokens, d_out, k);
    attn_trace_btc(m, "values", batch, tokens, d_out, v);
}

void attn_project_qkv_backward(attn_module *m, const attn_qkv_weights *w,
                               const attn_qkv_grads *grad, const float *x, size_t rows,
                               size_t d_out, const float *dq, const float *dk, const float *dv,
                               float *dx) {
    size_t d_in = m->d_in;
    const float *weights[3] = {w->wq, w->wk, w->wv}, *biases[3] = {w->bq, w->bk, w->bv};
    float *dweights[3] = {grad->wq, grad->wk, grad->wv}, *dbiases[3] = {grad->bq, grad->bk, grad->bv};
    const float *dys[3] = {dq, dk, dv};
    for (int p = 0; p < 3; p++) {
        if (w->linear) {
            /* forward: q (rows, d_out) = x @ W^T + b, W (d_out, d_in) */
            attn_k_linear_backward(m->ctx, x, weights[p], dys[p], dx, true, dweights[p],
                                     biases[p] ? dbiases[p] : NULL, rows, d_in, d_out);
        } else {
            /* forward: q (rows, d_out) = x @ W, W (d_in, d_out):
             * dx += dq @ W^T, dW += x^T @ dq */
            if (dx) attn_k_matmul(m->ctx, dys[p], weights[p], dx, rows, d_out, d_in, true, true);
            attn_k_matmul_tn_acc(m->ctx, x, dys[p], dweights[p], rows, d_in, d_out);
        }
    }
}

attn_status attn_qkv_declare(attn_module *m, const char *prefix, size_t d_in, size_t d_out,
                             bool bias) {
    static const char *const names[3] = {"W_query", "W_key", "W_value"};
    char full[ATTN_PARAM_NAME_MAX];
    for (int i = 0; i < 3; i++) {
        snprintf(full, sizeof full, "%s%s", prefix, names[i]);
        attn_status st = attn_module_declare_linear(m, full, d_in, d_out, bias);
        if (st != ATTN_OK) return st;
    }
    return ATTN_OK;
}

attn_status attn_qkv_init(attn_module *m, size_t *index, size_t d_in, size_t d_out, bool bias,
                          attn_rng *rng) {
    attn_status st = ATTN_OK;
    for (int i = 0; i < 3 && st == ATTN_OK; i++)
        st = attn_module_init_linear(m, rng, index, bias, d_in, d_out);
    return st;
}

attn_qkv_grads attn_qkv_linear_grads(attn_module *m, size_t first, bool bias) {
    size_t stride = bias ? 2 : 1;
    attn_qkv_grads g = {0};
    g.wq = attn_module_grad(m, first);
    g.wk = attn_module_grad(m, first + stride);
    g.wv = attn_module_grad(m, first + 2 * stride);
    if (bias) {
        g.bq = attn_module_grad(m, first + 1);
        g.bk = attn_module_grad(m, first + stride + 1);
        g.bv = attn_module_grad(m, first + 2 * stride + 1);
    }
    return g;
}

attn_qkv_weights attn_qkv_linear_weights(attn_module *m, size_t first, bool bias) {
    size_t stride = bias ? 2 : 1;
    attn_qkv_weights w = {.linear = true};
    w.wq = attn_module_data(m, first);
    w.wk = attn_module_data(m, first + stride);
    w.wv = attn_module_data(m, first + 2 * stride);
    if (bias) {
        w.bq = attn_module_data(m, first + 1);
        w.bk = attn_module_data(m, first + stride + 1);
        w.bv = attn_module_data(m, first + 2 * stride + 1);
    }
    return w;
}

attn_status attn_qkv_build(attn_module *m, size_t d_in, size_t d_out, bool bias, attn_rng *rng) {
    attn_status st = attn_qkv_declare(m, "", d_in, d_out, bias);
    if (st == ATTN_OK) st = attn_module_alloc(m);
    size_t index = 0;
    if (st == ATTN_OK) st = attn_qkv_init(m, &index, d_in, d_out, bias, rng);
    return st;
}
