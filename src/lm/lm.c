/*
 * lm.c — the book's GPT-2 (kv_cache/gpt2.py's GPTModel, and ch04's with
 * GroupedQueryAttention) and Llama 3 (kv_cache/llama3.py's Llama3Model) for
 * inference: the model's tensors,
 * their initialisation, and the forward with and without a KV cache.
 *
 * Forward, for the packed rows of a batch (x is (rows, C)):
 *   x = tok_emb[ids] (+ pos_emb[position], gpt2 and gpt-gqa: "gpt" below)
 *   per block:
 *     h = norm1(x)                         LayerNorm (gpt) / RMSNorm (llama3)
 *     q, k, v = h Wq^T (+bq), h Wk^T (+bk), h Wv^T (+bv)
 *                                          (rows, C), (rows, kv_heads * head_dim)
 *     q, k = rope(q), rope(k)              llama3, at each row's position
 *     a = attention(q, k, v)               causal within each sequence, or
 *                                          against the cache (then appended)
 *     x = x + a Wo^T (+bo, gpt2)
 *     h = norm2(x)
 *     x = x + fc2(gelu(fc1(h)))            gpt
 *     x = x + fc3(silu(fc1(h)) * fc2(h))   llama3
 *   logits = out_head(final_norm(x))       (only each sequence's last row
 *                                           with last_only)
 * Dropout is off (inference).
 */
#include "lm/lm_internal.h"

#include "attention/attention.h"
#include "generate/kv_cache.h"
#include "half.h"
#include "kernels/dispatch.h"
#include "kernels/gemv/linear16.h"
#include "modules/module.h"
#include "ops/rope.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* positions (size_t) share the activation buffer, two floats each */
_Static_assert(sizeof(size_t) <= 2 * sizeof(float), "a size_t fits in two floats");

/* ---- configuration ------------------------------------------------------ */

const attn_lm_config_keys attn_lm_config_fields = {
    .vocab_size = "vocab_size", .context_length = "context_length", .emb_dim = "emb_dim",
    .n_heads = "n_heads", .n_layers = "n_layers", .hidden_dim = "hidden_dim",
    .n_kv_groups = "n_kv_groups", .qkv_bias = "qkv_bias", .rope_base = "rope_base",
    .rope_scaling = "rope_freq", .rope_original_context_length = "original_context_length",
    .norm_eps = "norm_eps"};

attn_status attn_lm_config_resolve(attn_ctx *ctx, const char *who, const attn_lm_config *cfg,
                                   const attn_lm_config_keys *keys, attn_lm_config *out) {
    const attn_lm_config_keys *k = keys ? keys : &attn_lm_config_fields;
    attn_lm_config c = *cfg;
    if (c.arch != ATTN_LM_GPT2 && c.arch != ATTN_LM_LLAMA3 && c.arch != ATTN_LM_GPT_GQA &&
        c.arch != ATTN_LM_GPT_MLA)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: arch (%d) is not ATTN_LM_GPT2 (1), "
                         "ATTN_LM_LLAMA3 (2), ATTN_LM_GPT_GQA (3) or ATTN_LM_GPT_MLA (4)", who,
                         (int)c.arch);
    bool gpt = attn_lm_is_gpt(c.arch);
    if (!c.vocab_size || !c.context_length || !c.emb_dim || !c.n_heads || !c.n_layers)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: %s (%zu), %s (%zu), %s (%zu), %s (%zu) and %s (%zu) must be "
                         "positive", who, k->vocab_size, c.vocab_size, k->context_length,
                         c.context_length, k->emb_dim, c.emb_dim, k->n_heads, c.n_heads,
                         k->n_layers, c.n_layers);
    if (c.emb_dim % c.n_heads != 0)
        return attn_fail(ctx, ATTN_ERR_SHAPE, "%s: %s (%zu) must divide %s (%zu)", who,
                         k->n_heads, c.n_heads, k->emb_dim, c.emb_dim);
    if ((c.arch == ATTN_LM_GPT2 || c.arch == ATTN_LM_GPT_MLA) && c.n_kv_groups != 0 &&
        c.n_kv_groups != c.n_heads)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: %s has one KV head per head: %s (%zu) must be 0 or %s (%zu)", who,
                         attn_lm_arch_name(c.arch), k->n_kv_groups, c.n_kv_groups, k->n_heads,
                         c.n_heads);
    if (c.arch == ATTN_LM_GPT_MLA && c.latent_dim == 0)
        c.latent_dim = attn_mla_latent_width(c.emb_dim, 0);
    if (c.arch != ATTN_LM_GPT_MLA && c.latent_dim != 0)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: latent_dim (%zu) is gpt-mla's; %s has none (0)", who, c.latent_dim,
                         attn_lm_arch_name(c.arch));
    if (c.sliding_window_size == 0 && c.sliding_window_stride != 0)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: sliding_window_stride (%zu) without a sliding_window_size (0)", who,
                         c.sliding_window_stride);
    if (c.n_kv_groups == 0) c.n_kv_groups = c.n_heads;
    if (c.n_heads % c.n_kv_groups != 0)
        return attn_fail(ctx, ATTN_ERR_SHAPE, "%s: %s (%zu) must divide %s (%zu)", who,
                         k->n_kv_groups, c.n_kv_groups, k->n_heads, c.n_heads);
    if (gpt) {
        if (c.hidden_dim == 0 && !attn_mul_size(4, c.emb_dim, &c.hidden_dim))
            return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: 4 %s (%zu) overflows", who, k->emb_dim,
                             c.emb_dim);
        if (c.hidden_dim != 4 * c.emb_dim)
            return attn_fail(ctx, ATTN_ERR_INVALID,
                             "%s: the GPT FeedForward is 4 %s wide: %s (%zu) must be 0 or "
                             "%zu", who, k->emb_dim, k->hidden_dim, c.hidden_dim, 4 * c.emb_dim);
        c.rope_base = c.rope_factor = c.rope_low_freq_factor = c.rope_high_freq_factor = 0.0;
        c.rope_original_context_length = 0;
    } else {
        if ((c.emb_dim / c.n_heads) % 2 != 0)
            return attn_fail(ctx, ATTN_ERR_SHAPE,
                             "%s: RoPE needs an even head_dim: %s (%zu) / %s (%zu) is %zu", who,
                             k->emb_dim, c.emb_dim, k->n_heads, c.n_heads,
                             c.emb_dim / c.n_heads);
        if (c.hidden_dim == 0)
            return attn_fail(ctx, ATTN_ERR_INVALID, "%s: llama3 needs %s (0 given)", who,
                             k->hidden_dim);
        if (c.qkv_bias) return attn_fail(ctx, ATTN_ERR_INVALID, "%s: llama3 has no %s", who,
                                         k->qkv_bias);
        if (c.rope_base == 0.0) c.rope_base = 500000.0;
        attn_status st = attn_rope_check_base(ctx, who, k->rope_base, c.rope_base);
        if (st != ATTN_OK) return st;
        if (c.rope_factor != 0.0 &&
            (!(c.rope_factor > 0.0) || !isfinite(c.rope_factor) ||
             !(c.rope_low_freq_factor > 0.0) || !(c.rope_high_freq_factor > 0.0) ||
             !isfinite(c.rope_low_freq_factor) || !isfinite(c.rope_high_freq_factor) ||
             c.rope_high_freq_factor == c.rope_low_freq_factor ||
             c.rope_original_context_length == 0))
            return attn_fail(ctx, ATTN_ERR_INVALID,
                             "%s: the Llama 3 RoPE scaling (%s) needs factor (%g) > 0, positive "
                             "low_freq_factor (%g) and high_freq_factor (%g) that differ, and "
                             "%s (%zu) > 0",
                             who, k->rope_scaling, c.rope_factor, c.rope_low_freq_factor,
                             c.rope_high_freq_factor, k->rope_original_context_length,
                             c.rope_original_context_length);
    }
    if (c.weights_dtype != ATTN_DTYPE_F32 && c.weights_dtype != ATTN_DTYPE_BF16 &&
        c.weights_dtype != ATTN_DTYPE_F16)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: weights_dtype (%d, %s) must be ATTN_DTYPE_F32, ATTN_DTYPE_BF16 or "
                         "ATTN_DTYPE_F16", who, (int)c.weights_dtype,
                         attn_dtype_name(c.weights_dtype));
    /* +0.0 is "not given" (a zeroed config); -0.0 is an epsilon of exactly
     * 0, kept as it is: x + -0.0 is x, so the norms compute with 0 */
    if (c.norm_eps == 0.0 && !signbit(c.norm_eps)) c.norm_eps = 1e-5;
    if (!(c.norm_eps >= 0.0) || !isfinite(c.norm_eps))
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: %s (%g) must be positive, or -0.0 for an epsilon of 0", who,
                         k->norm_eps, c.norm_eps);
    /* every tensor's size, and positions, fit in size_t and int32 rows */
    size_t vc, hc, pc, lc;
    if (!attn_mul_size(c.vocab_size, c.emb_dim, &vc) || !attn_mul_size(c.hidden_dim, c.emb_dim, &hc) ||
        !attn_mul_size(c.context_length, c.emb_dim, &pc) ||
        !attn_mul_size(c.latent_dim, c.emb_dim, &lc) || !attn_floats_fit(vc) ||
        !attn_floats_fit(hc) || !attn_floats_fit(pc) || !attn_floats_fit(lc) ||
        c.context_length > INT32_MAX || c.vocab_size > INT32_MAX)
        return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                         "%s: %s (%zu), %s (%zu), %s (%zu), %s (%zu), latent_dim (%zu) make "
                         "tensors too large",
                         who, k->vocab_size, c.vocab_size, k->context_length, c.context_length,
                         k->emb_dim, c.emb_dim, k->hidden_dim, c.hidden_dim, c.latent_dim);
    *out = c;
    return ATTN_OK;
}

/* ---- the tensors ---------------------------------------------------------- */

/* Lists the model's tensors in state_dict order, twice: first counting
 * (floats, 16-bit elements, names), then placing each in its block: the
 * linear layers' weights and the token embedding in the weights dtype,
 * the rest (norms, biases, GPT-2's positions) in float. */
typedef struct param_builder {
    attn_lm *m;
    bool place;
    bool overflow;
    size_t count, floats, halves, name_bytes;
    attn_lm_name_fn visit; /* when set: called with each name instead, until false */
    void *user;
    bool stop;
} param_builder;

/* One tensor: typed says it takes the weights dtype; tied, that it is
 * tok_emb's storage (a tied head), neither counted nor placed apart. */
static void add_tensor(param_builder *b, void **slot, bool typed, bool tied, size_t rows,
                       size_t cols, const char *fmt, va_list ap) {
    if (b->stop) return;
    char name[128];
    int len = vsnprintf(name, sizeof name, fmt, ap);
    if (b->visit) {
        b->stop = !b->visit(b->user, name, tied, rows, cols);
        return;
    }
    size_t numel = cols ? rows * cols : rows; /* checked by attn_lm_config_resolve */
    bool half = typed && b->m->cfg.weights_dtype != ATTN_DTYPE_F32;
    if (b->place) {
        attn_lm *m = b->m;
        char *dst = m->names + b->name_bytes;
        memcpy(dst, name, (size_t)len + 1);
        void *data = tied   ? m->tok_emb
                     : half ? (void *)(m->weights16 + b->halves)
                            : (void *)(m->weights + b->floats);
        *slot = data;
        m->params[b->count] = (attn_param){.name = dst, .data = half ? NULL : data,
                                           .grad = NULL, .ndim = cols ? 2 : 1,
                                           .shape = {rows, cols}, .numel = numel};
        m->stored[b->count] = (attn_lm_stored){
            .data = data, .dtype = half ? m->cfg.weights_dtype : ATTN_DTYPE_F32};
    }
    b->count++;
    b->name_bytes += (size_t)len + 1;
    size_t *total = half ? &b->halves : &b->floats;
    if (!tied && !attn_add_size(*total, numel, total)) b->overflow = true;
}

#if defined(__GNUC__)
__attribute__((format(printf, 5, 6)))
#endif
static void add_param(param_builder *b, float **slot, size_t rows, size_t cols, const char *fmt,
                      ...) {
    void *data = NULL;
    va_list ap;
    va_start(ap, fmt);
    add_tensor(b, &data, false, false, rows, cols, fmt, ap);
    va_end(ap);
    if (b->place) *slot = data;
}

#if defined(__GNUC__)
__attribute__((format(printf, 6, 7)))
#endif
static void add_weight(param_builder *b, void **slot, bool tied, size_t rows, size_t cols,
                       const char *fmt, ...) {
    void *data = NULL;
    va_list ap;
    va_start(ap, fmt);
    add_tensor(b, &data, true, tied, rows, cols, fmt, ap);
    va_end(ap);
    if (b->place) *slot = data;
}

static void list_params(param_builder *b) {
    attn_lm *m = b->m;
    const attn_lm_config *c = &m->cfg;
    size_t C = c->emb_dim, V = c->vocab_size, H = m->hidden, kvw = m->kv_heads * m->head_dim;
    size_t L = m->latent;
    bool gpt = attn_lm_is_gpt(c->arch), gqa = c->arch == ATTN_LM_GPT_GQA;
    bool mla = c->arch == ATTN_LM_GPT_MLA;
    add_weight(b, &m->tok_emb, false, V, C, "tok_emb.weight");
    if (gpt) add_param(b, &m->pos_emb, c->context_length, C, "pos_emb.weight");
    for (size_t i = 0; i < c->n_layers && !b->stop; i++) {
        attn_lm_block *k = b->place ? &m->blocks[i] : &(attn_lm_block){0};
        if (gpt) {
            /* the attention's projections in the order its module registers
             * them: MultiHeadAttention W_query, W_key, W_value;
             * GroupedQueryAttention W_key and W_value first;
             * MultiHeadLatentAttention W_query, then the latent's down
             * projection and its two up projections */
            const struct { void **w; float **b; size_t out, in; const char *name; } lin[] = {
                {&k->wq, &k->bq, C, C, "W_query"},    {&k->wk, &k->bk, kvw, C, "W_key"},
                {&k->wv, &k->bv, kvw, C, "W_value"},  {&k->wdkv, &k->bdkv, L, C, "W_DKV"},
                {&k->wuk, &k->buk, C, L, "W_UK"},     {&k->wuv, &k->buv, C, L, "W_UV"}};
            static const size_t mha[] = {0, 1, 2}, gqa_order[] = {1, 2, 0},
                                mla_order[] = {0, 3, 4, 5};
            const size_t *order = mla ? mla_order : gqa ? gqa_order : mha;
            for (size_t j = 0; j < (mla ? 4u : 3u); j++) {
                size_t at = order[j];
                add_weight(b, lin[at].w, false, lin[at].out, lin[at].in,
                           "trf_blocks.%zu.att.%s.weight", i, lin[at].name);
                if (c->qkv_bias)
                    add_param(b, lin[at].b, lin[at].out, 0, "trf_blocks.%zu.att.%s.bias", i,
                              lin[at].name);
            }
            add_weight(b, &k->wo, false, C, C, "trf_blocks.%zu.att.out_proj.weight", i);
            if (!gqa) add_param(b, &k->bo, C, 0, "trf_blocks.%zu.att.out_proj.bias", i);
            add_weight(b, &k->fc1_w, false, H, C, "trf_blocks.%zu.ff.layers.0.weight", i);
            add_param(b, &k->fc1_b, H, 0, "trf_blocks.%zu.ff.layers.0.bias", i);
            add_weight(b, &k->fc2_w, false, C, H, "trf_blocks.%zu.ff.layers.2.weight", i);
            add_param(b, &k->fc2_b, C, 0, "trf_blocks.%zu.ff.layers.2.bias", i);
            add_param(b, &k->norm1_w, C, 0, "trf_blocks.%zu.norm1.scale", i);
            add_param(b, &k->norm1_b, C, 0, "trf_blocks.%zu.norm1.shift", i);
            add_param(b, &k->norm2_w, C, 0, "trf_blocks.%zu.norm2.scale", i);
            add_param(b, &k->norm2_b, C, 0, "trf_blocks.%zu.norm2.shift", i);
        } else {
            add_weight(b, &k->wk, false, kvw, C, "trf_blocks.%zu.att.W_key.weight", i);
            add_weight(b, &k->wv, false, kvw, C, "trf_blocks.%zu.att.W_value.weight", i);
            add_weight(b, &k->wq, false, C, C, "trf_blocks.%zu.att.W_query.weight", i);
            add_weight(b, &k->wo, false, C, C, "trf_blocks.%zu.att.out_proj.weight", i);
            add_weight(b, &k->fc1_w, false, H, C, "trf_blocks.%zu.ff.fc1.weight", i);
            add_weight(b, &k->fc2_w, false, H, C, "trf_blocks.%zu.ff.fc2.weight", i);
            add_weight(b, &k->fc3_w, false, C, H, "trf_blocks.%zu.ff.fc3.weight", i);
            add_param(b, &k->norm1_w, C, 0, "trf_blocks.%zu.norm1.weight", i);
            add_param(b, &k->norm2_w, C, 0, "trf_blocks.%zu.norm2.weight", i);
        }
    }
    if (gpt) {
        add_param(b, &m->final_w, C, 0, "final_norm.scale");
        add_param(b, &m->final_b, C, 0, "final_norm.shift");
    } else {
        add_param(b, &m->final_w, C, 0, "final_norm.weight");
    }
    add_weight(b, &m->out_head, c->tie_embeddings, V, C, "out_head.weight");
}

/* RoPE's inverse frequencies of c (compute_rope_params'). */
static void rope_frequencies(const attn_lm_config *c, size_t head_dim, float *inv_freq) {
    attn_rope_scaling scaling = {c->rope_factor, c->rope_low_freq_factor,
                                 c->rope_high_freq_factor, c->rope_original_context_length};
    attn_rope_inv_freq(c->rope_base, &scaling, head_dim, inv_freq);
}

void attn_lm_list_names(const attn_lm_config *cfg, attn_lm_name_fn visit, void *user) {
    /* a model that is only its config: enough for list_params to name */
    attn_lm m = {.cfg = *cfg, .head_dim = cfg->emb_dim / cfg->n_heads,
                 .kv_heads = cfg->n_kv_groups, .hidden = cfg->hidden_dim,
                 .latent = cfg->latent_dim};
    param_builder b = {.m = &m, .visit = visit, .user = user};
    list_params(&b);
}

/* Bytes per parameter record beside the weights: its attn_param, its
 * attn_lm_stored and its name (the longest is under 48 bytes). */
#define RECORD_BYTES (sizeof(attn_param) + sizeof(attn_lm_stored) + 48)

/* *total += a * b, false on overflow (then *total is past use). */
static bool add_product(size_t *total, size_t a, size_t b) {
    size_t ab;
    return attn_mul_size(a, b, &ab) && attn_add_size(*total, ab, total);
}

/* The bytes a model of c (resolved) takes, weights and records, from its
 * sizes alone (no loop over the layers, which a wrong n_layers makes
 * endless), refused past size_t or this machine's memory before anything
 * is allocated. */
static attn_status check_budget(attn_ctx *ctx, const char *who, const attn_lm_config *c) {
    size_t C = c->emb_dim, V = c->vocab_size, H = c->hidden_dim, T = c->context_length;
    size_t kvw = c->n_kv_groups * (C / c->n_heads); /* <= C */
    bool gpt = attn_lm_is_gpt(c->arch); /* gpt-gqa's narrower W_key, W_value: within it;
                                         * gpt-mla's W_query and out_proj, besides its three */
    size_t w = c->weights_dtype == ATTN_DTYPE_F32 ? sizeof(float) : sizeof(uint16_t);
    size_t f = sizeof(float);
    /* one block: its linear weights (weights dtype), norms and biases
     * (float), its tensors' records */
    size_t block = sizeof(attn_lm_block);
    /* every factor below fits: resolve bounds V C, H C and T C by size_t / 4 */
    size_t L = c->latent_dim; /* 0 but for gpt-mla */
    bool ok = gpt ? add_product(&block, C * w, 4 * C) &&    /* W_query .. out_proj */
                        add_product(&block, L * w, 3 * C) &&    /* W_DKV, W_UK, W_UV */
                        add_product(&block, H * w, 2 * C) &&    /* the FeedForward */
                        add_product(&block, f * C, c->qkv_bias ? 9 : 6) &&
                        add_product(&block, f, H + L) &&
                        add_product(&block, c->qkv_bias ? 18 : 14, RECORD_BYTES)
                  : add_product(&block, kvw * w, 2 * C) &&  /* W_key, W_value */
                        add_product(&block, C * w, 2 * C) &&    /* W_query, out_proj */
                        add_product(&block, H * w, C) && add_product(&block, H * w, C) &&
                        add_product(&block, H * w, C) &&        /* fc1, fc2, fc3 */
                        add_product(&block, f * C, 2) && add_product(&block, 9, RECORD_BYTES);
    size_t total = 0;
    /* the blocks; the embedding, the head unless tied, pos_emb or RoPE's
     * frequencies, the final norm and their records */
    ok = ok && add_product(&total, block, c->n_layers) && add_product(&total, V * w, C) &&
         (c->tie_embeddings || add_product(&total, V * w, C)) &&
         add_product(&total, f, gpt ? T * C : C / 2 + 1) && add_product(&total, f * C, 2) &&
         add_product(&total, 5, RECORD_BYTES);
    if (!ok)
        return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                         "%s: n_layers (%zu) of emb_dim (%zu), hidden_dim (%zu), vocab_size "
                         "(%zu): the model's bytes overflow size_t",
                         who, c->n_layers, C, H, V);
    size_t limit = attn_physical_memory();
    if (limit && total > limit)
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY,
                         "%s: n_layers (%zu) of emb_dim (%zu), hidden_dim (%zu), vocab_size "
                         "(%zu) take %zu bytes, past this machine's memory (%zu bytes)",
                         who, c->n_layers, C, H, V, total, limit);
    return ATTN_OK;
}

/* The widest input of m's linear layers: emb_dim, the FeedForward's, or
 * the latent's. */
static size_t widest_in(const attn_lm *m) {
    size_t in = m->hidden > m->cfg.emb_dim ? m->hidden : m->cfg.emb_dim;
    return m->latent > in ? m->latent : in;
}

attn_status attn_lm_create(attn_ctx *ctx, const char *who, const attn_lm_config *cfg,
                           attn_lm **out) {
    attn_lm_config c;
    attn_status st = attn_lm_config_resolve(ctx, who, cfg, NULL, &c);
    if (st == ATTN_OK) st = check_budget(ctx, who, &c);
    if (st != ATTN_OK) return st;
    attn_lm *m = attn_calloc(1, sizeof *m);
    if (!m) return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory", who);
    m->ctx = ctx;
    m->cfg = c;
    m->matmul_dtype = ATTN_DTYPE_F32;
    m->head_dim = c.emb_dim / c.n_heads;
    m->kv_heads = c.n_kv_groups;
    m->hidden = c.hidden_dim;
    m->latent = c.latent_dim;
    param_builder count = {.m = m};
    list_params(&count);
    if (count.overflow || !attn_floats_fit(count.floats) || !attn_floats_fit(count.halves)) {
        attn_free(m);
        return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: the model's weights overflow size_t", who);
    }
    m->num_params = count.count;
    m->num_weights = count.floats;
    m->num_weights16 = count.halves;
    m->params = attn_calloc(count.count, sizeof *m->params);
    m->stored = attn_calloc(count.count, sizeof *m->stored);
    m->names = attn_malloc(count.name_bytes);
    m->blocks = attn_calloc(c.n_layers, sizeof *m->blocks);
    m->weights = attn_floats_fit(count.floats) ? attn_calloc_large(count.floats, sizeof(float))
                                               : NULL;
    m->inv_freq = attn_alloc_floats(m->head_dim / 2 + 1);
    m->windows = attn_calloc(c.n_layers, sizeof *m->windows);
    bool half = c.weights_dtype != ATTN_DTYPE_F32;
    if (half) {
        size_t in = widest_in(m);
        m->weights16 = attn_calloc_large(count.halves, sizeof *m->weights16);
        m->buf.panel = attn_alloc_floats(attn_k_linear16_panel_floats(in));
    }
    if (!m->params || !m->stored || !m->names || !m->blocks || !m->weights || !m->inv_freq ||
        !m->windows || (half && (!m->weights16 || !m->buf.panel))) {
        attn_lm_free(m);
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory for %zu weights", who,
                         count.floats + count.halves);
    }
    param_builder place = {.m = m, .place = true};
    list_params(&place);
    for (size_t i = 0; i < c.n_layers; i++) m->windows[i] = attn_lm_layer_window(&c, i);
    if (c.arch == ATTN_LM_LLAMA3) rope_frequencies(&m->cfg, m->head_dim, m->inv_freq);
    *out = m;
    return ATTN_OK;
}

static void fill(float *x, size_t n, float value) {
    for (size_t i = 0; i < n; i++) x[i] = value;
}

/* A tensor drawn into draw (floats), stored into dst in the weights
 * dtype: kept as drawn for float, else rounded to nearest even (a model of
 * 16-bit weights holds the drawn weights rounded). */
typedef struct init_state {
    attn_lm *m;
    attn_rng *rng;
    float *draw; /* the largest 16-bit tensor's floats (NULL for float) */
} init_state;

static float *draw_target(init_state *s, void *dst) {
    return s->draw ? s->draw : (float *)dst;
}

static void store_drawn(init_state *s, void *dst, size_t n) {
    if (!s->draw) return;
    uint16_t *h = dst;
    for (size_t i = 0; i < n; i++) h[i] = attn_float_to_half(s->m->cfg.weights_dtype, s->draw[i]);
}

/* nn.Linear's kaiming uniform weight (out, in) then bias. */
static attn_status init_linear(init_state *s, void *w, float *bias, size_t out, size_t in) {
    attn_status st = attn_rng_linear_init(s->rng, draw_target(s, w), bias, out, in);
    if (st == ATTN_OK) store_drawn(s, w, out * in);
    return st;
}

/* The weights as the book's constructors draw them, in construction order
 * (which is the state_dict's): nn.Embedding N(0, 1), nn.Linear's kaiming
 * uniform weight then bias, norms ones (and zero shifts). */
static attn_status init_weights(init_state *s) {
    attn_lm *m = s->m;
    const attn_lm_config *c = &m->cfg;
    size_t C = c->emb_dim, V = c->vocab_size, H = m->hidden, kvw = m->kv_heads * m->head_dim;
    attn_status st = attn_rng_randn(s->rng, draw_target(s, m->tok_emb), V * C);
    if (st == ATTN_OK) store_drawn(s, m->tok_emb, V * C);
    if (st == ATTN_OK && m->pos_emb)
        st = attn_rng_randn(s->rng, m->pos_emb, c->context_length * C);
    for (size_t i = 0; i < c->n_layers && st == ATTN_OK; i++) {
        attn_lm_block *k = &m->blocks[i];
        if (attn_lm_is_gpt(c->arch)) {
            /* construction order: GroupedQueryAttention makes W_key and
             * W_value before W_query (and its out_proj has no bias) */
            bool gqa = c->arch == ATTN_LM_GPT_GQA, mla = c->arch == ATTN_LM_GPT_MLA;
            size_t L = m->latent;
            const struct { void *w; float *b; size_t out, in; } lin[] = {
                {k->wq, k->bq, C, C},          {k->wk, k->bk, kvw, C},
                {k->wv, k->bv, kvw, C},        {k->wo, k->bo, C, C},
                {k->fc1_w, k->fc1_b, H, C},    {k->fc2_w, k->fc2_b, C, H},
                {k->wdkv, k->bdkv, L, C},      {k->wuk, k->buk, C, L},
                {k->wuv, k->buv, C, L}};
            /* MultiHeadLatentAttention makes W_query, W_DKV, W_UK, W_UV,
             * out_proj; MultiHeadAttention W_query, W_key, W_value */
            static const size_t mha[] = {0, 1, 2, 3, 4, 5}, gqa_order[] = {1, 2, 0, 3, 4, 5},
                                mla_order[] = {0, 6, 7, 8, 3, 4, 5};
            const size_t *order = mla ? mla_order : gqa ? gqa_order : mha;
            size_t n = mla ? 7 : 6;
            for (size_t j = 0; j < n && st == ATTN_OK; j++)
                st = init_linear(s, lin[order[j]].w, lin[order[j]].b, lin[order[j]].out,
                                 lin[order[j]].in);
            fill(k->norm1_b, C, 0.0f);
            fill(k->norm2_b, C, 0.0f);
        } else {
            const struct { void *w; size_t out, in; } lin[] = {
                {k->wk, kvw, C}, {k->wv, kvw, C}, {k->wq, C, C}, {k->wo, C, C},
                {k->fc1_w, H, C}, {k->fc2_w, H, C}, {k->fc3_w, C, H}};
            for (size_t j = 0; j < 7 && st == ATTN_OK; j++)
                st = init_linear(s, lin[j].w, NULL, lin[j].out, lin[j].in);
        }
        fill(k->norm1_w, C, 1.0f);
        fill(k->norm2_w, C, 1.0f);
    }
    fill(m->final_w, C, 1.0f);
    if (m->final_b) fill(m->final_b, C, 0.0f);
    if (st == ATTN_OK && !c->tie_embeddings) st = init_linear(s, m->out_head, NULL, V, C);
    return st;
}

/* Elements of the largest tensor in the weights dtype. */
static size_t largest_weight(const attn_lm *m) {
    size_t most = 0;
    for (size_t i = 0; i < m->num_params; i++)
        if (m->stored[i].dtype != ATTN_DTYPE_F32 && m->params[i].numel > most)
            most = m->params[i].numel;
    return most;
}

attn_status attn_lm_new(attn_ctx *ctx, const attn_lm_config *cfg, attn_rng *init_rng,
                        attn_lm **out) {
    if (!ctx || !cfg || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_lm_new: %s is NULL",
                         !ctx ? "ctx" : !cfg ? "cfg" : "out");
    attn_clear_error(ctx);
    *out = NULL;
    attn_lm *m;
    attn_status st = attn_lm_create(ctx, "attn_lm_new", cfg, &m);
    if (st != ATTN_OK) return st;
    if (init_rng) {
        init_state s = {.m = m, .rng = init_rng};
        if (m->cfg.weights_dtype != ATTN_DTYPE_F32 &&
            !(s.draw = attn_alloc_floats(largest_weight(m)))) {
            attn_lm_free(m);
            return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_lm_new: out of memory");
        }
        st = init_weights(&s);
        attn_free(s.draw);
        if (st != ATTN_OK) {
            attn_lm_free(m);
            return st;
        }
    }
    *out = m;
    return ATTN_OK;
}

void attn_lm_free(attn_lm *m) {
    if (!m) return;
    attn_free(m->weights);
    attn_free(m->weights16);
    attn_free(m->params);
    attn_free(m->stored);
    attn_free(m->buf.panel);
    attn_free(m->names);
    attn_free(m->blocks);
    attn_free(m->inv_freq);
    attn_free(m->windows);
    attn_free(m->buf.rounded);
    attn_free(m->buf.floats);
    attn_free(m->buf.attention);
    attn_free(m->buf.cu_seqlens);
    attn_free(m->buf.starts);
    attn_free(m);
}

attn_status attn_lm_set_matmul_dtype(attn_lm *m, attn_dtype dtype) {
    if (!m) return ATTN_ERR_NULL;
    attn_clear_error(m->ctx);
    if (dtype != ATTN_DTYPE_F32 && dtype != ATTN_DTYPE_BF16)
        return attn_fail(m->ctx, ATTN_ERR_INVALID,
                         "attn_lm_set_matmul_dtype: dtype %s (%d) is not F32 or BF16",
                         attn_dtype_name(dtype), (int)dtype);
    if (dtype == ATTN_DTYPE_BF16 && m->cfg.weights_dtype != ATTN_DTYPE_BF16)
        return attn_fail(m->ctx, ATTN_ERR_INVALID,
                         "attn_lm_set_matmul_dtype: BF16 products need bf16 weights; the model "
                         "holds %s (load it with weights_dtype BF16)",
                         attn_dtype_name(m->cfg.weights_dtype));
    m->matmul_dtype = dtype;
    return ATTN_OK;
}

attn_dtype attn_lm_get_matmul_dtype(const attn_lm *m) {
    return m ? m->matmul_dtype : ATTN_DTYPE_F32;
}

attn_lm_config attn_lm_get_config(const attn_lm *m) {
    return m ? m->cfg : (attn_lm_config){0};
}

size_t attn_lm_param_count(const attn_lm *m) { return m ? m->num_params : 0; }

attn_status attn_lm_param_at(attn_lm *m, size_t index, attn_param *out) {
    if (!m || !out) return m ? attn_fail(m->ctx, ATTN_ERR_NULL, "attn_lm_param_at: out is NULL")
                             : ATTN_ERR_NULL;
    attn_clear_error(m->ctx);
    if (index >= m->num_params)
        return attn_fail(m->ctx, ATTN_ERR_NOT_FOUND,
                         "attn_lm_param_at: index %zu is past the model's %zu parameters", index,
                         m->num_params);
    *out = m->params[index];
    return ATTN_OK;
}

attn_status attn_lm_param_data(attn_lm *m, size_t index, attn_dtype *dtype, const void **data) {
    if (!m || !dtype || !data)
        return m ? attn_fail(m->ctx, ATTN_ERR_NULL, "attn_lm_param_data: %s is NULL",
                             !dtype ? "dtype" : "data")
                 : ATTN_ERR_NULL;
    attn_clear_error(m->ctx);
    if (index >= m->num_params)
        return attn_fail(m->ctx, ATTN_ERR_NOT_FOUND,
                         "attn_lm_param_data: index %zu is past the model's %zu parameters",
                         index, m->num_params);
    *dtype = m->stored[index].dtype;
    *data = m->stored[index].data;
    return ATTN_OK;
}

size_t attn_lm_weight_bytes(const attn_lm *m) {
    return m ? m->num_weights * sizeof(float) + m->num_weights16 * sizeof(uint16_t) : 0;
}

attn_status attn_lm_param(attn_lm *m, const char *name, attn_param *out) {
    if (!m || !name || !out)
        return m ? attn_fail(m->ctx, ATTN_ERR_NULL, "attn_lm_param: %s is NULL",
                             !name ? "name" : "out")
                 : ATTN_ERR_NULL;
    attn_clear_error(m->ctx);
    for (size_t i = 0; i < m->num_params; i++)
        if (strcmp(m->params[i].name, name) == 0) {
            *out = m->params[i];
            return ATTN_OK;
        }
    return attn_fail(m->ctx, ATTN_ERR_NOT_FOUND, "attn_lm_param: the %s model has no parameter "
                     "'%s'", attn_lm_arch_name(m->cfg.arch), name);
}

/* The KV heads and head_dim of m's cache: gpt-mla caches its latent, one
 * row of latent_dim a token, read as keys and as values (values_are_keys),
 * as the book's model caches it (latent_attend); the others their keys and
 * values. */
static void cache_shape(const attn_lm *m, size_t *kv_heads, size_t *head_dim) {
    *kv_heads = m->latent ? 1 : m->kv_heads;
    *head_dim = m->latent ? m->latent : m->head_dim;
}

attn_status attn_lm_cache_config(const attn_lm *m, size_t batch, size_t max_len,
                                 attn_kv_cache_config *out) {
    if (!m || !out)
        return m ? attn_fail(m->ctx, ATTN_ERR_NULL, "attn_lm_cache_config: out is NULL")
                 : ATTN_ERR_NULL;
    attn_clear_error(m->ctx);
    if (max_len == 0) max_len = m->cfg.context_length;
    if (max_len > m->cfg.context_length)
        return attn_fail(m->ctx, ATTN_ERR_INVALID,
                         "attn_lm_cache_config: max_len (%zu) is past the model's "
                         "context_length (%zu)", max_len, m->cfg.context_length);
    bool windowed = m->cfg.sliding_window_size != 0;
    size_t kv_heads, head_dim;
    cache_shape(m, &kv_heads, &head_dim);
    *out = (attn_kv_cache_config){.num_layers = m->cfg.n_layers, .batch = batch,
                                  .kv_heads = kv_heads, .head_dim = head_dim,
                                  .max_len = max_len, .windows = windowed ? m->windows : NULL,
                                  .values_are_keys = m->latent != 0};
    return ATTN_OK;
}

attn_status attn_lm_check_cache(attn_lm *m, const char *who, const attn_kv_cache *cache,
                                size_t batch) {
    attn_kv_cache_config c = attn_kv_cache_get_config(cache);
    size_t kv_heads, head_dim;
    cache_shape(m, &kv_heads, &head_dim);
    if (c.num_layers != m->cfg.n_layers || c.kv_heads != kv_heads || c.head_dim != head_dim ||
        c.batch != batch)
        return attn_fail(m->ctx, ATTN_ERR_SHAPE,
                         "%s: the cache (layers %zu, batch %zu, kv_heads %zu, head_dim %zu) "
                         "does not fit the model and call (layers %zu, batch %zu, kv_heads "
                         "%zu, head_dim %zu%s)",
                         who, c.num_layers, c.batch, c.kv_heads, c.head_dim, m->cfg.n_layers,
                         batch, kv_heads, head_dim, m->latent ? ": gpt-mla's latent" : "");
    /* such a cache takes one array of rows, where this model's keys and
     * values differ: every attend would refuse its values */
    if (c.values_are_keys && !m->latent)
        return attn_fail(m->ctx, ATTN_ERR_SHAPE,
                         "%s: the cache's values are its keys (values_are_keys), where %s's "
                         "values are not its keys (attn_lm_cache_config gives its cache)",
                         who, attn_lm_arch_name(m->cfg.arch));
    /* the cache's windows decide what a layer attends to: a windowed
     * model's must be its own (a window at or past max_len sees everything,
     * as none does); a model without windows takes the caller's */
    for (size_t i = 0; m->cfg.sliding_window_size && i < c.num_layers; i++) {
        size_t have = c.windows && c.windows[i] < c.max_len ? c.windows[i] : 0;
        size_t want = m->windows[i] < c.max_len ? m->windows[i] : 0;
        if (have != want)
            return attn_fail(m->ctx, ATTN_ERR_SHAPE,
                             "%s: layer %zu of the cache has window %zu, the model's has %zu "
                             "(attn_lm_cache_config gives the model's windows)",
                             who, i, have, want);
    }
    return ATTN_OK;
}

attn_status attn_lm_cache_status(attn_ctx *ctx, const attn_kv_cache *cache, attn_status st) {
    attn_ctx *own = attn_kv_cache_ctx(cache);
    if (st == ATTN_OK || !own || own == ctx) return st;
    return attn_fail(ctx, st, "%s", attn_ctx_last_error(own));
}

attn_status attn_lm_cache_new(attn_lm *m, size_t batch, size_t max_len, attn_kv_layout layout,
                              size_t page_size, attn_kv_cache **out) {
    if (out) *out = NULL;
    if (!m || !out)
        return m ? attn_fail(m->ctx, ATTN_ERR_NULL, "attn_lm_cache_new: out is NULL")
                 : ATTN_ERR_NULL;
    attn_kv_cache_config c;
    attn_status st = attn_lm_cache_config(m, batch, max_len, &c);
    if (st != ATTN_OK) return st;
    c.layout = layout;
    c.page_size = page_size;
    return attn_kv_cache_new(m->ctx, &c, out);
}

/* ---- the layers ----------------------------------------------------------- */

/* One matrix of linear_n: y (rows, out) = x @ w^T (+ bias), w in the
 * weights dtype. */
typedef struct lm_part {
    const void *w;
    const float *bias;
    float *y;
    size_t out;
} lm_part;

/* The n (<= 4) parts on the same x (rows, in): matrix-vector products when
 * rows are few (decoding), else the SGEMM; on 16-bit weights the same
 * sums on the widened weights, or with bf16 products x rounded to bf16 and
 * the 16-bit GEMM (kernels/gemv/linear16.h). */
static void linear_n(attn_lm *m, const float *x, size_t rows, size_t in, const lm_part *parts,
                     size_t n) {
    if (m->cfg.weights_dtype == ATTN_DTYPE_F32) {
        attn_k_linear_part p[4];
        for (size_t i = 0; i < n; i++) p[i] = (attn_k_linear_part){parts[i].w, parts[i].bias,
                                                                   parts[i].y, parts[i].out};
        attn_k_linear_small_n(m->ctx, x, rows, in, p, n);
        return;
    }
    attn_k_linear16_part p[4];
    for (size_t i = 0; i < n; i++)
        p[i] = (attn_k_linear16_part){parts[i].w, parts[i].bias, parts[i].y, parts[i].out};
    if (m->matmul_dtype == ATTN_DTYPE_BF16)
        attn_k_linear16_bf16_n(m->ctx, x, rows, in, p, n, m->buf.rounded, m->buf.panel);
    else
        attn_k_linear16_n(m->ctx, m->cfg.weights_dtype, x, rows, in, p, n, m->buf.panel);
}

/* y (rows, out) = x (rows, in) @ w^T (+ bias). */
static void linear(attn_lm *m, const float *x, const void *w, const float *bias, float *y,
                   size_t rows, size_t in, size_t out) {
    lm_part part = {w, bias, y, out};
    linear_n(m, x, rows, in, &part, 1);
}

/* out (rows, C) = LayerNorm(x): (x - mean) / sqrt(var + eps) * scale + shift,
 * var biased; in double. */
static void layer_norm(float *out, const float *x, const float *scale, const float *shift,
                       size_t rows, size_t C, double eps) {
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * C;
        double mean = 0.0, var = 0.0;
        for (size_t i = 0; i < C; i++) mean += xr[i];
        mean /= (double)C;
        for (size_t i = 0; i < C; i++) var += ((double)xr[i] - mean) * ((double)xr[i] - mean);
        double rstd = 1.0 / sqrt(var / (double)C + eps);
        for (size_t i = 0; i < C; i++)
            out[r * C + i] = (float)(((double)xr[i] - mean) * rstd * scale[i] + shift[i]);
    }
}

/* out (rows, C) = x * rsqrt(mean(x^2) + eps) * weight (RMSNorm); in double. */
static void rms_norm(float *out, const float *x, const float *weight, size_t rows, size_t C,
                     double eps) {
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * C;
        double ms = 0.0;
        for (size_t i = 0; i < C; i++) ms += (double)xr[i] * xr[i];
        double rs = 1.0 / sqrt(ms / (double)C + eps);
        for (size_t i = 0; i < C; i++) out[r * C + i] = (float)((double)xr[i] * rs * weight[i]);
    }
}

static void norm(const attn_lm *m, float *out, const float *x, const float *w, const float *b,
                 size_t rows) {
    if (attn_lm_is_gpt(m->cfg.arch))
        layer_norm(out, x, w, b, rows, m->cfg.emb_dim, m->cfg.norm_eps);
    else
        rms_norm(out, x, w, rows, m->cfg.emb_dim, m->cfg.norm_eps);
}

/* x = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), the book's GELU
 * (its sqrt(2 / pi) a float32 tensor) */
static void gelu(float *x, size_t n) {
    const double c = (double)sqrtf((float)(2.0 / 3.14159265358979323846));
    for (size_t i = 0; i < n; i++) {
        double v = x[i];
        x[i] = (float)(0.5 * v * (1.0 + tanh(c * (v + 0.044715 * v * v * v))));
    }
}

/* gate = silu(gate) * up */
static void swiglu(float *gate, const float *up, size_t n) {
    for (size_t i = 0; i < n; i++) {
        double g = gate[i];
        gate[i] = (float)(g / (1.0 + exp(-g)) * up[i]);
    }
}

static void add_into(float *x, const float *a, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += a[i];
}

/* cos, sin (rows, head_dim / 2) of each row's angles position * inv_freq,
 * the angle rounded to float32 as the book's table is. */
static void rope_tables(const attn_lm *m, const size_t *positions, size_t rows, float *cosines,
                        float *sines) {
    size_t half = m->head_dim / 2;
    for (size_t r = 0; r < rows; r++)
        for (size_t i = 0; i < half; i++) {
            float angle = (float)positions[r] * m->inv_freq[i];
            cosines[r * half + i] = (float)cos((double)angle);
            sines[r * half + i] = (float)sin((double)angle);
        }
}

/* x (rows, heads, head_dim) rotated: for i < half, with x1 = x[i], x2 =
 * x[i + half]: x[i] = x1 cos - x2 sin, x[i + half] = x2 cos + x1 sin
 * (apply_rope: x * cos + cat(-x2, x1) * sin). */
static void apply_rope(float *x, size_t rows, size_t heads, size_t head_dim, const float *cosines,
                       const float *sines) {
    size_t half = head_dim / 2;
    for (size_t r = 0; r < rows; r++)
        for (size_t h = 0; h < heads; h++) {
            float *v = x + (r * heads + h) * head_dim;
            const float *c = cosines + r * half, *s = sines + r * half;
            for (size_t i = 0; i < half; i++) {
                float x1 = v[i], x2 = v[i + half];
                v[i] = x1 * c[i] + -x2 * s[i];
                v[i + half] = x2 * c[i] + x1 * s[i];
            }
        }
}

/* ---- the row-wise steps, over the ctx's threads ----------------------------- */

/* A layer's row-wise steps (norms, RoPE, activations, residual adds): each
 * row's arithmetic is its own, so any split of the rows gives the same
 * bits. A prompt's rows are shared out over the ctx's threads; a part
 * takes at least ROW_STEP_FLOATS floats, so that a token's steps
 * (decoding) stay on the calling thread, where waking a worker would cost
 * more than the step. */
#define ROW_STEP_FLOATS ((size_t)1 << 14)

typedef enum { STEP_NORM, STEP_ROPE, STEP_GELU, STEP_SWIGLU, STEP_ADD } step_kind;

typedef struct row_step {
    step_kind kind;
    const attn_lm *m;
    float *x;           /* the rows written, width floats each */
    const float *a;     /* norm's input, swiglu's up, the addend (width a row) */
    const float *w, *b; /* norm's weight and shift */
    size_t width;
    size_t heads; /* RoPE: x's heads a row */
    const float *cosines, *sines;
} row_step;

static void row_step_rows(void *arg, size_t r0, size_t r1) {
    const row_step *s = arg;
    size_t rows = r1 - r0, at = r0 * s->width, half = s->m->head_dim / 2;
    switch (s->kind) {
    case STEP_NORM: norm(s->m, s->x + at, s->a + at, s->w, s->b, rows); break;
    case STEP_ROPE:
        apply_rope(s->x + at, rows, s->heads, s->m->head_dim, s->cosines + r0 * half,
                   s->sines + r0 * half);
        break;
    case STEP_GELU: gelu(s->x + at, rows * s->width); break;
    case STEP_SWIGLU: swiglu(s->x + at, s->a + at, rows * s->width); break;
    case STEP_ADD: add_into(s->x + at, s->a + at, rows * s->width); break;
    }
}

static void run_rows(const attn_lm *m, row_step s, size_t rows) {
    attn_pool_for(attn_ctx_pool(m->ctx), m->ctx->num_threads, rows,
                  ROW_STEP_FLOATS / s.width + 1, row_step_rows, &s);
}

/* ---- the forward ------------------------------------------------------------ */

/* The activations of one forward, carved from the model's buffer. */
typedef struct lm_acts {
    float *x, *h, *q, *k, *v, *att, *f1, *f2, *lat, *cosines, *sines, *last;
    float *q_lat, *att_lat; /* gpt-mla with a cache: (rows, n_heads * latent) */
    size_t *positions;
} lm_acts;

static size_t acts_floats(const attn_lm *m, size_t rows, size_t batch, bool *overflow) {
    size_t C = m->cfg.emb_dim, kvw = m->kv_heads * m->head_dim;
    /* per row: x, h, q, att (C each), k, v, f1, f2, the latent, the heads'
     * latent queries and outputs, cos, sin, a position */
    size_t per_row = 4 * C + 2 * kvw + 2 * m->hidden + (1 + 2 * m->cfg.n_heads) * m->latent +
                     m->head_dim + 2;
    size_t a = 0, b = 0, total = 0;
    *overflow = !attn_mul_size(rows, per_row, &a) || !attn_mul_size(batch, C, &b) ||
                !attn_add_size(a, b, &total) || !attn_floats_fit(total);
    return total;
}

static lm_acts acts_at(const attn_lm *m, float *f, size_t rows) {
    size_t C = m->cfg.emb_dim, kvw = m->kv_heads * m->head_dim, half = m->head_dim / 2;
    lm_acts a;
    a.positions = (size_t *)(void *)f; /* first, so aligned; 2 floats per size_t */
    a.x = f + 2 * rows;
    a.h = a.x + rows * C;
    a.q = a.h + rows * C;
    a.att = a.q + rows * C;
    a.k = a.att + rows * C;
    a.v = a.k + rows * kvw;
    a.f1 = a.v + rows * kvw;
    a.f2 = a.f1 + rows * m->hidden;
    a.lat = a.f2 + rows * m->hidden;
    a.q_lat = a.lat + rows * m->latent;
    a.att_lat = a.q_lat + rows * m->cfg.n_heads * m->latent;
    a.cosines = a.att_lat + rows * m->cfg.n_heads * m->latent;
    a.sines = a.cosines + rows * half;
    a.last = a.sines + rows * half;
    return a;
}

/* The activations for rows rows of a batch of batch. */
static attn_status grow_floats(attn_lm *m, size_t rows, size_t batch) {
    attn_lm_buffers *b = &m->buf;
    bool overflow;
    size_t floats = acts_floats(m, rows, batch, &overflow);
    if (overflow)
        return attn_fail(m->ctx, ATTN_ERR_OVERFLOW,
                         "attn_lm_forward: %zu rows of batch %zu overflow the activations", rows,
                         batch);
    if (floats <= b->capacity) return ATTN_OK;
    float *grown = attn_alloc_floats(floats);
    if (!grown)
        return attn_fail(m->ctx, ATTN_ERR_NO_MEMORY,
                         "attn_lm_forward: out of memory for %zu rows of activations", rows);
    attn_free(b->floats);
    b->floats = grown;
    b->capacity = floats;
    return ATTN_OK;
}

/* With bf16 products, room for rows rows of the widest input rounded. */
static attn_status grow_rounded(attn_lm *m, size_t rows) {
    attn_lm_buffers *b = &m->buf;
    size_t in = widest_in(m), elements = 0;
    if (m->matmul_dtype != ATTN_DTYPE_BF16) return ATTN_OK;
    if (!attn_mul_size(rows, in, &elements) || !attn_floats_fit(elements))
        return attn_fail(m->ctx, ATTN_ERR_OVERFLOW,
                         "attn_lm_forward: %zu rows of %zu overflow the rounded activations",
                         rows, in);
    if (elements <= b->rounded_capacity) return ATTN_OK;
    uint16_t *grown = attn_malloc(elements * sizeof *grown);
    if (!grown)
        return attn_fail(m->ctx, ATTN_ERR_NO_MEMORY,
                         "attn_lm_forward: out of memory for %zu rows of rounded activations",
                         rows);
    attn_free(b->rounded);
    b->rounded = grown;
    b->rounded_capacity = elements;
    return ATTN_OK;
}

/* The per-sequence arrays (cu_seqlens, starts) for a batch of batch. */
static attn_status grow_batch(attn_lm *m, size_t batch) {
    attn_lm_buffers *b = &m->buf;
    if (batch <= b->batch_capacity) return ATTN_OK;
    int32_t *cu = attn_calloc(batch + 1, sizeof *cu);
    size_t *starts = attn_calloc(batch, sizeof *starts);
    if (!cu || !starts) {
        attn_free(cu);
        attn_free(starts);
        return attn_fail(m->ctx, ATTN_ERR_NO_MEMORY,
                         "attn_lm_forward: out of memory for a batch of %zu", batch);
    }
    attn_free(b->cu_seqlens);
    attn_free(b->starts);
    b->cu_seqlens = cu;
    b->starts = starts;
    b->batch_capacity = batch;
    return ATTN_OK;
}

/* The new tokens of sequence s. */
static size_t seq_len(const attn_lm_forward_args *a, size_t s) {
    return a->lens ? a->lens[s] : a->tokens_per_seq;
}

/* Without a cache: each sequence attends causally within its own rows
 * (packed, cu_seqlens), through the attention runner. */
static attn_attention_problem within_problem(const attn_lm *m, const lm_acts *a, size_t layer,
                                             size_t batch, size_t rows, size_t longest) {
    size_t C = m->cfg.emb_dim, hd = m->head_dim, kvw = m->kv_heads * hd, W = m->windows[layer];
    /* a window of context_length or more already sees every position a
     * sequence reaches: none, rather than a window_left past int64 */
    if (W >= m->cfg.context_length) W = 0;
    return (attn_attention_problem){
        .batch = batch, .q_heads = m->cfg.n_heads, .kv_heads = m->kv_heads, .q_len = longest,
        .kv_len = longest, .head_dim = hd, .v_head_dim = hd,
        .q = attn_view_f32(a->q, (attn_view_strides){0, C, hd}),
        .k = attn_view_f32(a->k, (attn_view_strides){0, kvw, hd}),
        .v = attn_view_f32(a->v, (attn_view_strides){0, kvw, hd}),
        .out = attn_view_f32(a->att, (attn_view_strides){0, C, hd}),
        .scale = (float)(1.0 / sqrt((double)hd)), .causal = true,
        .diagonal = ATTN_DIAGONAL_TOP_LEFT, .cu_seqlens_q = m->buf.cu_seqlens,
        .cu_seqlens_kv = m->buf.cu_seqlens, .total_q = rows,
        /* a windowed layer: positions p - W + 1 .. p */
        .window = W != 0, .window_left = W ? (int64_t)(W - 1) : -1, .window_right = -1};
}

/* The attention's workspace, in hand before anything is computed (so that
 * a failure changes nothing). */
static attn_status reserve_attention(attn_lm *m, const attn_attention_problem *p) {
    size_t bytes = attn_attention_forward_bytes(m->ctx, p, false, false);
    attn_lm_buffers *b = &m->buf;
    if (bytes <= b->attention_bytes && b->attention) return ATTN_OK;
    void *grown = attn_malloc(bytes);
    if (!grown)
        return attn_fail(m->ctx, ATTN_ERR_NO_MEMORY,
                         "attn_lm_forward: out of memory for %zu bytes of attention workspace",
                         bytes);
    attn_free(b->attention);
    b->attention = grown;
    b->attention_bytes = bytes;
    return ATTN_OK;
}

/*
 * gpt-mla against its cache of latents. The book's model caches the latent
 * c of each token and up-projects all of them at every step; per head h of
 * head_dim, with W_UK_h and W_UV_h its rows of W_UK and W_UV (head_dim,
 * latent):
 *   q_h . (W_UK_h c + b_UK_h) = (W_UK_h^T q_h) . c + q_h . b_UK_h
 * whose last term is the same for every key of the row, so the softmax
 * drops it, and, the weights p_j of a row summing to 1,
 *   sum_j p_j (W_UV_h c_j + b_UV_h) = W_UV_h (sum_j p_j c_j) + b_UV_h.
 * So each head's query goes down to the latent (latent_queries), attends
 * to the cached latents as one KV head of latent_dim, keys and values
 * alike, at 1 / sqrt(head_dim), and its output comes back up
 * (latent_outputs): the cache keeps latent_dim floats a token and layer,
 * and a step reads them, where keys and values take 2 emb_dim. A cache
 * that stores the latent twice (not values_are_keys) runs the same.
 */
typedef struct latent_heads {
    const attn_lm *m;
    const void *w;      /* W_UK or W_UV (emb_dim, latent) in the weights dtype */
    const float *bias;  /* b_UV or NULL */
    const float *in;    /* q (rows, emb_dim), or the heads' latent outputs */
    float *out;         /* the heads' latent queries (rows, n_heads latent), or (rows, emb_dim) */
    size_t rows;
} latent_heads;

/* Weights [at, at + n) of w, widened to float32 into buf (n <= LATENT_TILE)
 * unless they are float32 already. */
#define LATENT_TILE 64
static const float *weights_at(const attn_lm *m, const void *w, size_t at, size_t n, float *buf) {
    attn_dtype dt = m->cfg.weights_dtype;
    if (dt == ATTN_DTYPE_F32) return (const float *)w + at;
    const uint16_t *h = (const uint16_t *)w + at;
    for (size_t i = 0; i < n; i++) buf[i] = attn_half_to_float(dt, h[i]);
    return buf;
}

/* Heads [h0, h1): q_lat[r, h, :] = W_UK_h^T q[r, h] (a sum over head_dim in
 * order). */
static void latent_queries(void *arg, size_t h0, size_t h1) {
    const latent_heads *a = arg;
    size_t hd = a->m->head_dim, L = a->m->latent, C = a->m->cfg.emb_dim, HL = a->m->cfg.n_heads * L;
    float buf[LATENT_TILE];
    for (size_t h = h0; h < h1; h++)
        for (size_t l0 = 0; l0 < L; l0 += LATENT_TILE) {
            size_t n = L - l0 < LATENT_TILE ? L - l0 : LATENT_TILE;
            for (size_t r = 0; r < a->rows; r++)
                memset(a->out + r * HL + h * L + l0, 0, n * sizeof(float));
            for (size_t i = 0; i < hd; i++) {
                const float *w = weights_at(a->m, a->w, (h * hd + i) * L + l0, n, buf);
                for (size_t r = 0; r < a->rows; r++) {
                    float x = a->in[r * C + h * hd + i], *y = a->out + r * HL + h * L + l0;
                    for (size_t l = 0; l < n; l++) y[l] += x * w[l];
                }
            }
        }
}

/* Heads [h0, h1): att[r, h] = W_UV_h att_lat[r, h] + b_UV_h (a sum over the
 * latent in order). */
static void latent_outputs(void *arg, size_t h0, size_t h1) {
    const latent_heads *a = arg;
    size_t hd = a->m->head_dim, L = a->m->latent, C = a->m->cfg.emb_dim, HL = a->m->cfg.n_heads * L;
    float buf[LATENT_TILE];
    for (size_t h = h0; h < h1; h++)
        for (size_t i = 0; i < hd; i++) {
            size_t o = h * hd + i;
            for (size_t r = 0; r < a->rows; r++) a->out[r * C + o] = 0.0f;
            for (size_t l0 = 0; l0 < L; l0 += LATENT_TILE) {
                size_t n = L - l0 < LATENT_TILE ? L - l0 : LATENT_TILE;
                const float *w = weights_at(a->m, a->w, o * L + l0, n, buf);
                for (size_t r = 0; r < a->rows; r++) {
                    const float *x = a->in + r * HL + h * L + l0;
                    float s = a->out[r * C + o];
                    for (size_t l = 0; l < n; l++) s += w[l] * x[l];
                    a->out[r * C + o] = s;
                }
            }
            if (a->bias)
                for (size_t r = 0; r < a->rows; r++) a->out[r * C + o] += a->bias[o];
        }
}

/* Whether a gpt-mla call against a cache is a prompt: every sequence with
 * new tokens starts at position 0 (m->buf.starts, check_forward), so that
 * its keys are its own rows. It then runs as the forward without a cache
 * (keys and values up-projected, the fused attention among the rows, in
 * float32), and its latents are appended after. */
static bool latent_prompt(const attn_lm *m, const attn_lm_forward_args *args) {
    if (!m->latent || !args->cache) return false;
    for (size_t s = 0; s < args->batch; s++)
        if (seq_len(args, s) && m->buf.starts[s] != 0) return false;
    /* the forward without a cache takes the model's windows; a model
     * without any attends with the cache's, which must then be none */
    attn_kv_cache_config c = attn_kv_cache_get_config(args->cache);
    for (size_t i = 0; c.windows && i < c.num_layers; i++) {
        size_t have = c.windows[i] < c.max_len ? c.windows[i] : 0;
        size_t want = m->windows[i] < c.max_len ? m->windows[i] : 0;
        if (have != want) return false;
    }
    return true;
}

/* The attention of a gpt-mla block against args->cache: a->q and a->lat in,
 * a->att out (the latents appended). */
static attn_status latent_attend(attn_lm *m, size_t layer, const lm_acts *a,
                                 const attn_lm_forward_args *args, size_t rows) {
    const attn_lm_block *k = &m->blocks[layer];
    size_t H = m->cfg.n_heads;
    attn_pool *pool = attn_ctx_pool(m->ctx);
    latent_heads down = {m, k->wuk, NULL, a->q, a->q_lat, rows};
    attn_pool_for(pool, m->ctx->num_threads, H, 1, latent_queries, &down);
    attn_kv_attend_args at = {.layer = layer, .new_lens = args->lens,
                              .new_tokens = args->tokens_per_seq, .q_heads = H,
                              .scale = 1.0 / sqrt((double)m->head_dim), .q = a->q_lat,
                              .k_new = a->lat, .v_new = a->lat, .out = a->att_lat};
    attn_status st =
        attn_lm_cache_status(m->ctx, args->cache, attn_kv_cache_attend(args->cache, &at));
    if (st != ATTN_OK) return st;
    latent_heads up = {m, k->wuv, k->buv, a->att_lat, a->att, rows};
    attn_pool_for(pool, m->ctx->num_threads, H, 1, latent_outputs, &up);
    return ATTN_OK;
}

/* One transformer block on x (rows, C), in place; prompt: latent_prompt's
 * answer for the call. */
static attn_status block_forward(attn_lm *m, size_t layer, const lm_acts *a,
                                 const attn_lm_forward_args *args, size_t rows, size_t longest,
                                 bool prompt) {
    const attn_lm_block *k = &m->blocks[layer];
    size_t C = m->cfg.emb_dim, H = m->hidden, kvw = m->kv_heads * m->head_dim;
    bool gpt = attn_lm_is_gpt(m->cfg.arch);

    run_rows(m, (row_step){.kind = STEP_NORM, .m = m, .x = a->h, .a = a->x, .w = k->norm1_w,
                           .b = k->norm1_b, .width = C},
             rows);
    if (m->latent) {
        /* latent attention: q and the latent from h; without a cache or
         * for a prompt, k and v from the latent (else latent_attend) */
        const lm_part down[2] = {{k->wq, k->bq, a->q, C}, {k->wdkv, k->bdkv, a->lat, m->latent}};
        linear_n(m, a->h, rows, C, down, 2);
        if (!args->cache || prompt) {
            const lm_part up[2] = {{k->wuk, k->buk, a->k, kvw}, {k->wuv, k->buv, a->v, kvw}};
            linear_n(m, a->lat, rows, m->latent, up, 2);
        }
    } else {
        const lm_part qkv[3] = {
            {k->wq, k->bq, a->q, C}, {k->wk, k->bk, a->k, kvw}, {k->wv, k->bv, a->v, kvw}};
        linear_n(m, a->h, rows, C, qkv, 3);
    }
    if (!gpt) {
        size_t nh = m->cfg.n_heads;
        run_rows(m, (row_step){.kind = STEP_ROPE, .m = m, .x = a->q, .width = nh * m->head_dim,
                               .heads = nh, .cosines = a->cosines, .sines = a->sines},
                 rows);
        run_rows(m, (row_step){.kind = STEP_ROPE, .m = m, .x = a->k, .width = kvw,
                               .heads = m->kv_heads, .cosines = a->cosines, .sines = a->sines},
                 rows);
    }
    attn_status st;
    if (prompt) {
        attn_attention_problem p = within_problem(m, a, layer, args->batch, rows, longest);
        st = attn_attention_forward(m->ctx, "attn_lm_forward", &p, NULL, NULL, NULL, NULL,
                                    m->buf.attention);
        if (st == ATTN_OK)
            st = attn_lm_cache_status(m->ctx, args->cache,
                                      attn_kv_cache_append(args->cache, layer, args->lens,
                                                           args->tokens_per_seq, a->lat, a->lat));
    } else if (args->cache && m->latent) {
        st = latent_attend(m, layer, a, args, rows);
    } else if (args->cache) {
        attn_kv_attend_args at = {.layer = layer, .new_lens = args->lens,
                                  .new_tokens = args->tokens_per_seq,
                                  .q_heads = m->cfg.n_heads, .scale = 0.0, .q = a->q,
                                  .k_new = a->k, .v_new = a->v, .out = a->att};
        st = attn_lm_cache_status(m->ctx, args->cache, attn_kv_cache_attend(args->cache, &at));
    } else {
        attn_attention_problem p = within_problem(m, a, layer, args->batch, rows, longest);
        st = attn_attention_forward(m->ctx, "attn_lm_forward", &p, NULL, NULL, NULL, NULL,
                                    m->buf.attention);
    }
    if (st != ATTN_OK) return st;
    linear(m, a->att, k->wo, k->bo, a->h, rows, C, C);
    const row_step residual = {.kind = STEP_ADD, .m = m, .x = a->x, .a = a->h, .width = C};
    run_rows(m, residual, rows);

    run_rows(m, (row_step){.kind = STEP_NORM, .m = m, .x = a->h, .a = a->x, .w = k->norm2_w,
                           .b = k->norm2_b, .width = C},
             rows);
    if (gpt) {
        linear(m, a->h, k->fc1_w, k->fc1_b, a->f1, rows, C, H);
        run_rows(m, (row_step){.kind = STEP_GELU, .m = m, .x = a->f1, .width = H}, rows);
        linear(m, a->f1, k->fc2_w, k->fc2_b, a->h, rows, H, C);
    } else {
        const lm_part gate_up[2] = {{k->fc1_w, NULL, a->f1, H}, {k->fc2_w, NULL, a->f2, H}};
        linear_n(m, a->h, rows, C, gate_up, 2);
        run_rows(m, (row_step){.kind = STEP_SWIGLU, .m = m, .x = a->f1, .a = a->f2, .width = H},
                 rows);
        linear(m, a->f1, k->fc3_w, NULL, a->h, rows, H, C);
    }
    run_rows(m, residual, rows);
    return ATTN_OK;
}

/* Checks args against the model (and its cache), and finds each sequence's
 * first position (m->buf.starts) and the packed offsets (cu_seqlens). */
static attn_status check_forward(attn_lm *m, const attn_lm_forward_args *a, size_t *rows,
                                 size_t *longest) {
    attn_ctx *ctx = m->ctx;
    const char *who = "attn_lm_forward";
    if (!a->logits || (!a->tokens && (a->lens || a->tokens_per_seq)))
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: %s is NULL", who,
                         !a->logits ? "logits" : "tokens");
    if (a->batch == 0) return attn_fail(ctx, ATTN_ERR_INVALID, "%s: batch is 0", who);
    if (a->batch >= INT32_MAX)
        return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: batch (%zu) is too large", who, a->batch);
    attn_status st = a->cache ? attn_lm_check_cache(m, who, a->cache, a->batch) : ATTN_OK;
    if (st != ATTN_OK) return st;
    st = grow_batch(m, a->batch);
    if (st != ATTN_OK) return st;
    size_t total = 0, most = 0;
    for (size_t s = 0; s < a->batch; s++) {
        size_t n = seq_len(a, s), start = 0;
        if (a->cache && (st = attn_lm_cache_status(ctx, a->cache, attn_kv_cache_length(
                             a->cache, 0, s, &start))) != ATTN_OK)
            return st;
        /* every layer's rows hold the same positions (a prefix appended
         * into the cache by hand may not): the model's positions are
         * layer 0's */
        for (size_t l = 1; a->cache && l < m->cfg.n_layers; l++) {
            size_t at = 0;
            if ((st = attn_lm_cache_status(ctx, a->cache, attn_kv_cache_length(
                     a->cache, l, s, &at))) != ATTN_OK)
                return st;
            if (at != start)
                return attn_fail(ctx, ATTN_ERR_INVALID,
                                 "%s: sequence %zu of the cache holds %zu tokens in layer 0 but "
                                 "%zu in layer %zu", who, s, start, at, l);
        }
        if (n > m->cfg.context_length || start > m->cfg.context_length - n)
            return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                             "%s: sequence %zu at position %zu with %zu new tokens would pass the "
                             "context_length (%zu)", who, s, start, n, m->cfg.context_length);
        if (a->cache) {
            size_t max_len = attn_kv_cache_get_config(a->cache).max_len;
            if (start + n > max_len)
                return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                                 "%s: sequence %zu at position %zu with %zu new tokens would pass "
                                 "the cache's max_len (%zu)", who, s, start, n, max_len);
        }
        if (!attn_add_size(total, n, &total) || total >= INT32_MAX)
            return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: too many tokens (past sequence %zu)",
                             who, s);
        m->buf.starts[s] = start;
        m->buf.cu_seqlens[s + 1] = (int32_t)total;
        if (n > most) most = n;
    }
    m->buf.cu_seqlens[0] = 0;
    for (size_t r = 0; r < total; r++)
        if (a->tokens[r] < 0 || (size_t)a->tokens[r] >= m->cfg.vocab_size)
            return attn_fail(ctx, ATTN_ERR_INVALID,
                             "%s: token %zu is %ld, outside the vocabulary [0, %zu)", who, r,
                             (long)a->tokens[r], m->cfg.vocab_size);
    /* every layer's room for the call (a paged layer's free pages differ
     * from layer to layer: a window layer's ring reuses its pages), before
     * the first layer appends */
    for (size_t l = 0; a->cache && l < m->cfg.n_layers; l++)
        if ((st = attn_lm_cache_status(ctx, a->cache, attn_kv_cache_check_append(
                 a->cache, who, l, a->lens, a->tokens_per_seq))) != ATTN_OK)
            return st;
    *rows = total;
    *longest = most;
    return ATTN_OK;
}

/* x (rows, C) = tok_emb[tokens] (+ pos_emb[position]); positions filled. */
static void embed(const attn_lm *m, const lm_acts *a, const attn_lm_forward_args *args) {
    size_t C = m->cfg.emb_dim, r = 0;
    for (size_t s = 0; s < args->batch; s++)
        for (size_t i = 0; i < seq_len(args, s); i++, r++) a->positions[r] = m->buf.starts[s] + i;
    attn_dtype dtype = m->cfg.weights_dtype;
    for (r = 0; r < (size_t)m->buf.cu_seqlens[args->batch]; r++) {
        size_t row = (size_t)args->tokens[r] * C;
        float *x = a->x + r * C;
        const float *tok = x;
        if (dtype == ATTN_DTYPE_F32) {
            tok = (const float *)m->tok_emb + row;
        } else {
            /* the row widened into x, which then takes pos as a float row */
            const uint16_t *h = (const uint16_t *)m->tok_emb + row;
            for (size_t i = 0; i < C; i++) x[i] = attn_half_to_float(dtype, h[i]);
        }
        if (m->pos_emb) {
            const float *pos = m->pos_emb + a->positions[r] * C;
            for (size_t i = 0; i < C; i++) x[i] = tok[i] + pos[i];
        } else if (tok != x) {
            memcpy(x, tok, C * sizeof *x);
        }
    }
}

/* logits from the final rows: every row, or each sequence's last row
 * ((batch, V), zeros for a sequence with no new tokens). */
static void head(attn_lm *m, const lm_acts *a, const attn_lm_forward_args *args, size_t rows) {
    size_t C = m->cfg.emb_dim, V = m->cfg.vocab_size;
    if (!args->last_only) {
        norm(m, a->h, a->x, m->final_w, m->final_b, rows);
        linear(m, a->h, m->out_head, NULL, args->logits, rows, C, V);
        return;
    }
    const int32_t *cu = m->buf.cu_seqlens;
    size_t kept = 0;
    for (size_t s = 0; s < args->batch; s++)
        if (cu[s + 1] > cu[s])
            memcpy(a->last + kept++ * C, a->x + (size_t)(cu[s + 1] - 1) * C, C * sizeof(float));
    norm(m, a->h, a->last, m->final_w, m->final_b, kept);
    linear(m, a->h, m->out_head, NULL, args->logits, kept, C, V);
    /* spread the kept rows to their sequences, from the last (its slot is
     * at or after its compact row) */
    for (size_t s = args->batch; s-- > 0;) {
        float *dst = args->logits + s * V;
        if (cu[s + 1] > cu[s])
            memmove(dst, args->logits + --kept * V, V * sizeof(float));
        else
            memset(dst, 0, V * sizeof(float));
    }
}

attn_status attn_lm_forward(attn_lm *m, const attn_lm_forward_args *args) {
    if (!m) return ATTN_ERR_NULL;
    attn_clear_error(m->ctx);
    if (!args) return attn_fail(m->ctx, ATTN_ERR_NULL, "attn_lm_forward: args is NULL");
    size_t rows = 0, longest = 0;
    attn_status st = check_forward(m, args, &rows, &longest);
    if (st == ATTN_OK) st = grow_floats(m, rows, args->batch);
    if (st == ATTN_OK) st = grow_rounded(m, rows);
    if (st != ATTN_OK) return st;
    if (rows == 0) {
        memset(args->logits, 0, (args->last_only ? args->batch : 0) * m->cfg.vocab_size *
                                    sizeof(float));
        return ATTN_OK;
    }
    lm_acts a = acts_at(m, m->buf.floats, rows);
    /* each distinct window's problem checked, its workspace in hand */
    bool prompt = latent_prompt(m, args), within = !args->cache || prompt;
    for (size_t layer = 0; within && layer < m->cfg.n_layers; layer++) {
        if (layer && m->windows[layer] == m->windows[layer - 1]) continue;
        attn_attention_problem p = within_problem(m, &a, layer, args->batch, rows, longest);
        if ((st = attn_attention_check(m->ctx, "attn_lm_forward", &p)) != ATTN_OK ||
            (st = reserve_attention(m, &p)) != ATTN_OK)
            return st;
    }
    embed(m, &a, args);
    if (m->cfg.arch == ATTN_LM_LLAMA3) rope_tables(m, a.positions, rows, a.cosines, a.sines);
    for (size_t layer = 0; layer < m->cfg.n_layers; layer++)
        if ((st = block_forward(m, layer, &a, args, rows, longest, prompt)) != ATTN_OK)
            return st;
    head(m, &a, args, rows);
    return ATTN_OK;
}
