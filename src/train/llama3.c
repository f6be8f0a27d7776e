/*
 * llama3.c — the book's Llama3Model (llms_from_scratch.llama3), trainable:
 * forward, loss and backward for an attn_model made by
 * attn_model_new_llama3 (attn.h, attn_llama3_config). With N = B * T rows,
 * C = emb_dim, H heads of D = C / H, G = n_kv_groups KV heads, F =
 * hidden_dim:
 *
 *   x (N, C)        = tok_emb[tokens]
 *   per block:
 *     h1 (N, C)     = RMSNorm(x; norm1)
 *     q (N, H D)    = RoPE(h1 @ W_query^T)    k (N, G D) = RoPE(h1 @ W_key^T)
 *     v (N, G D)    = h1 @ W_value^T
 *     att (N, C)    = causal SDPA(q, k, v), query head h on KV head h / (H / G)
 *     x             = x + att @ out_proj^T
 *     h2 (N, C)     = RMSNorm(x; norm2)
 *     gate, up (N, F) = h2 @ fc1^T, h2 @ fc2^T
 *     act (N, F)    = silu(gate) * up
 *     x             = x + act @ fc3^T
 *   hf (N, C)       = RMSNorm(x; final_norm)
 *   logits (N, V)   = hf @ out_head^T
 *   loss            = cross_entropy(logits, targets, ignore_index=-100)
 *
 * The linear layers run on the library's kernels (the ctx's choice), the
 * attention on the fused SDPA (attn_sdpa_forward / _backward, GQA through
 * kv_heads), the rest on layers_impl.h's layers. The forward keeps every
 * activation the backward reads, in buffers sized for the largest B * T
 * seen; the backward walks the same steps in reverse with one dresidual
 * buffer (N, C) that each branch adds into.
 */
#include "internal.h"
#include "kernels/dispatch.h"
#include "ops/rope.h"
#include "train/layers.h"
#include "train/llama3.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define LLAMA3_NAME_MAX 64

/* One block's parameter indices and activations (capacity rows each). */
typedef struct llama3_block {
    size_t w_key, w_value, w_query, out_proj, fc1, fc2, fc3, norm1, norm2;
    float *x_in;          /* (N, C) the residual entering (the previous x_out) */
    float *h1;            /* (N, C) */
    double *rstd1;        /* (N) */
    float *q, *k, *v;     /* (N, C), (N, G D), (N, G D); q and k after RoPE */
    float *att;           /* (N, C) the attention's output, heads side by side */
    float *lse;           /* (B, H, T) its rows' log-sum-exp */
    float *x_mid;         /* (N, C) after the attention's shortcut */
    float *h2;            /* (N, C) */
    double *rstd2;        /* (N) */
    float *gate, *up, *act; /* (N, F) */
    float *x_out;         /* (N, C) after the feed-forward's shortcut */
} llama3_block;

struct attn_llama3 {
    attn_ctx *ctx;
    attn_llama3_config cfg;
    size_t head_dim, kv_width; /* D, G * D */

    /* parameters in state_dict order, in storage and grad_storage */
    size_t count, scalars;
    attn_param *params;
    char (*names)[LLAMA3_NAME_MAX];
    float *storage, *grad_storage;
    size_t tok_emb, final_norm, out_head;
    llama3_block *blocks;
    float *cosines, *sines; /* (context_length, D / 2) */

    /* activations, for up to `rows` = B * T rows */
    size_t rows;
    float *farena;
    double *darena;
    int32_t *tokens, *targets; /* (N) the last forward's */
    float *emb;                /* (N, C) the first residual */
    float *hf;                 /* (N, C) */
    double *rstdf;             /* (N) */
    float *logits;             /* (N, V) */
    /* backward scratch */
    float *dres, *dtmp;        /* (N, C) */
    float *dq_rot, *dq;        /* (N, C) before and after RoPE's backward */
    float *dk_rot, *dk, *dv;   /* (N, G D) */
    float *dgate, *dup, *dact; /* (N, F) */
    float *dlogits;            /* (N, V) */

    size_t batch, seq; /* the last forward's */
};

/* ---- the config ------------------------------------------------------------- */

attn_status attn_llama3_check_config(attn_ctx *ctx, const char *who,
                                     const attn_llama3_config *c) {
    if (c->vocab_size == 0 || c->vocab_size > (size_t)INT32_MAX)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: vocab_size (%zu) must be in [1, %d]", who,
                         c->vocab_size, INT32_MAX);
    if (c->context_length == 0 || c->n_layers == 0 || c->hidden_dim == 0)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: context_length (%zu), n_layers (%zu) and hidden_dim (%zu) must be "
                         "positive", who, c->context_length, c->n_layers, c->hidden_dim);
    if (c->n_heads == 0 || c->emb_dim == 0 || c->emb_dim % c->n_heads != 0 ||
        (c->emb_dim / c->n_heads) % 2 != 0)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: emb_dim (%zu) must be a positive multiple of n_heads (%zu) with an "
                         "even head_dim (RoPE rotates pairs)", who, c->emb_dim, c->n_heads);
    if (c->n_kv_groups == 0 || c->n_heads % c->n_kv_groups != 0)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: n_kv_groups (%zu) must be positive and divide n_heads (%zu)", who,
                         c->n_kv_groups, c->n_heads);
    attn_status st = attn_rope_check_base(ctx, who, "rope_base", c->rope_base);
    if (st != ATTN_OK) return st;
    if (c->rope_factor != 0.0 &&
        (!(c->rope_factor > 0.0) || !isfinite(c->rope_factor) ||
         !(c->rope_low_freq_factor > 0.0) || !(c->rope_high_freq_factor > 0.0) ||
         !isfinite(c->rope_low_freq_factor) || !isfinite(c->rope_high_freq_factor) ||
         c->rope_high_freq_factor == c->rope_low_freq_factor ||
         c->rope_original_context_length == 0))
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: rope_factor %g needs positive finite rope_low_freq_factor (%g) and "
                         "rope_high_freq_factor (%g) that differ and a positive "
                         "rope_original_context_length (%zu); rope_factor 0 is no scaling",
                         who, c->rope_factor, c->rope_low_freq_factor, c->rope_high_freq_factor,
                         c->rope_original_context_length);
    /* Every size below is at most a small multiple of these products. */
    size_t vc, tc, cc, cf, layer, all;
    if (!attn_mul_size(c->vocab_size, c->emb_dim, &vc) ||
        !attn_mul_size(c->context_length, c->emb_dim, &tc) ||
        !attn_mul_size(c->emb_dim, c->emb_dim, &cc) ||
        !attn_mul_size(c->emb_dim, c->hidden_dim, &cf) || !attn_add_size(4 * cc, 3 * cf, &layer) ||
        cc > (size_t)-1 / 8 || cf > (size_t)-1 / 8 || !attn_mul_size(c->n_layers, layer, &all) ||
        all > (size_t)-1 / 64 || vc > (size_t)-1 / 64 || tc > (size_t)-1 / 64 ||
        c->n_layers > (size_t)-1 / 64)
        return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                         "%s: vocab_size %zu, context_length %zu, emb_dim %zu, hidden_dim %zu, "
                         "n_layers %zu overflow size_t",
                         who, c->vocab_size, c->context_length, c->emb_dim, c->hidden_dim,
                         c->n_layers);
    return ATTN_OK;
}

/* ---- RoPE's tables ------------------------------------------------------------ */

/* RoPE's inverse frequencies of c (compute_rope_params'). */
static void rope_frequencies(const attn_llama3_config *c, size_t head_dim, float *inv_freq) {
    attn_rope_scaling scaling = {c->rope_factor, c->rope_low_freq_factor,
                                 c->rope_high_freq_factor, c->rope_original_context_length};
    attn_rope_inv_freq(c->rope_base, &scaling, head_dim, inv_freq);
}

/* cosines, sines (context_length, D / 2): position t's angles t * inv_freq
 * in float32, as compute_rope_params' angles; each cos and sin the float
 * nearest the angle's. */
static void rope_tables(const attn_llama3_config *c, size_t head_dim, float *inv_freq,
                        float *cosines, float *sines) {
    size_t half = head_dim / 2;
    rope_frequencies(c, head_dim, inv_freq);
    for (size_t t = 0; t < c->context_length; t++)
        for (size_t i = 0; i < half; i++) {
            float angle = (float)t * inv_freq[i];
            cosines[t * half + i] = (float)cos((double)angle);
            sines[t * half + i] = (float)sin((double)angle);
        }
}

attn_status attn_llama3_rope_tables(attn_ctx *ctx, const attn_llama3_config *cfg, float *cos,
                                    float *sin) {
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!cfg || !cos || !sin)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_llama3_rope_tables: %s is NULL",
                         !cfg ? "cfg" : !cos ? "cos" : "sin");
    attn_status st = attn_llama3_check_config(ctx, "attn_llama3_rope_tables", cfg);
    if (st != ATTN_OK) return st;
    size_t D = cfg->emb_dim / cfg->n_heads, half = D / 2, T = cfg->context_length;
    float *inv = attn_alloc_floats(half);
    float *c = attn_alloc_floats(T * half), *s = attn_alloc_floats(T * half);
    if (!inv || !c || !s) {
        attn_free(inv);
        attn_free(c);
        attn_free(s);
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY,
                         "attn_llama3_rope_tables: out of memory for (%zu, %zu) tables", T, D);
    }
    rope_tables(cfg, D, inv, c, s);
    /* the book's (context_length, D): cat([angles, angles]) */
    for (size_t t = 0; t < T; t++)
        for (size_t i = 0; i < half; i++) {
            cos[t * D + i] = cos[t * D + half + i] = c[t * half + i];
            sin[t * D + i] = sin[t * D + half + i] = s[t * half + i];
        }
    attn_free(inv);
    attn_free(c);
    attn_free(s);
    return ATTN_OK;
}

/* ---- construction ---------------------------------------------------------- */

/* Declares the next parameter: name printf'd with the layer, shape (rows)
 * or (rows, cols). */
static size_t declare(attn_llama3 *m, size_t ndim, size_t rows, size_t cols, const char *fmt,
                      size_t layer) {
    size_t index = m->count++;
    attn_param *p = &m->params[index];
    snprintf(m->names[index], LLAMA3_NAME_MAX, fmt, layer);
    p->name = m->names[index];
    p->ndim = ndim;
    p->shape[0] = rows;
    p->shape[1] = ndim == 2 ? cols : 0;
    p->numel = ndim == 2 ? rows * cols : rows;
    m->scalars += p->numel;
    return index;
}

/* The book's state_dict order: a module's parameters come in the order its
 * submodules are assigned (GroupedQueryAttention: W_key, W_value, W_query,
 * out_proj; TransformerBlock: att, ff, norm1, norm2). */
static void declare_params(attn_llama3 *m) {
    const attn_llama3_config *c = &m->cfg;
    size_t V = c->vocab_size, C = c->emb_dim, F = c->hidden_dim, KV = m->kv_width;
    m->tok_emb = declare(m, 2, V, C, "tok_emb.weight", 0);
    for (size_t l = 0; l < c->n_layers; l++) {
        llama3_block *b = &m->blocks[l];
        b->w_key = declare(m, 2, KV, C, "trf_blocks.%zu.att.W_key.weight", l);
        b->w_value = declare(m, 2, KV, C, "trf_blocks.%zu.att.W_value.weight", l);
        b->w_query = declare(m, 2, C, C, "trf_blocks.%zu.att.W_query.weight", l);
        b->out_proj = declare(m, 2, C, C, "trf_blocks.%zu.att.out_proj.weight", l);
        b->fc1 = declare(m, 2, F, C, "trf_blocks.%zu.ff.fc1.weight", l);
        b->fc2 = declare(m, 2, F, C, "trf_blocks.%zu.ff.fc2.weight", l);
        b->fc3 = declare(m, 2, C, F, "trf_blocks.%zu.ff.fc3.weight", l);
        b->norm1 = declare(m, 1, C, 0, "trf_blocks.%zu.norm1.weight", l);
        b->norm2 = declare(m, 1, C, 0, "trf_blocks.%zu.norm2.weight", l);
    }
    m->final_norm = declare(m, 1, C, 0, "final_norm.weight", 0);
    m->out_head = declare(m, 2, V, C, "out_head.weight", 0);
}

static float *pdata(attn_llama3 *m, size_t index) { return m->params[index].data; }
static float *pgrad(attn_llama3 *m, size_t index) { return m->params[index].grad; }

static void fill_ones(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = 1.0f;
}

/* nn.Linear(in, out, bias=False)'s kaiming uniform into param index. */
static attn_status draw_linear(attn_llama3 *m, attn_rng *rng, size_t index) {
    const attn_param *p = &m->params[index];
    return attn_rng_linear_init(rng, p->data, NULL, p->shape[0], p->shape[1]);
}

attn_status attn_llama3_new(attn_ctx *ctx, const attn_llama3_config *cfg, attn_rng *init_rng,
                            attn_llama3 **out) {
    const char *who = "attn_model_new_llama3";
    size_t n = 3 + 9 * cfg->n_layers, D = cfg->emb_dim / cfg->n_heads;
    attn_llama3 *m = attn_calloc(1, sizeof *m);
    if (!m) return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory", who);
    m->ctx = ctx;
    m->cfg = *cfg;
    m->head_dim = D;
    m->kv_width = cfg->n_kv_groups * D;
    m->blocks = attn_calloc(cfg->n_layers, sizeof *m->blocks);
    m->params = attn_calloc(n, sizeof *m->params);
    m->names = attn_calloc(n, sizeof *m->names);
    m->cosines = attn_alloc_floats(cfg->context_length * (D / 2));
    m->sines = attn_alloc_floats(cfg->context_length * (D / 2));
    float *inv_freq = attn_alloc_floats(D / 2);
    if (!m->blocks || !m->params || !m->names || !m->cosines || !m->sines || !inv_freq) {
        attn_free(inv_freq);
        attn_llama3_free(m);
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory for %zu parameter tensors",
                         who, n);
    }
    rope_tables(cfg, D, inv_freq, m->cosines, m->sines);
    attn_free(inv_freq);
    declare_params(m);
    m->storage = attn_alloc_floats(m->scalars);
    m->grad_storage = attn_alloc_floats(m->scalars);
    if (!m->storage || !m->grad_storage) {
        size_t scalars = m->scalars;
        attn_llama3_free(m);
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: cannot allocate %zu parameters", who,
                         scalars);
    }
    memset(m->grad_storage, 0, m->scalars * sizeof(float));
    size_t offset = 0;
    for (size_t i = 0; i < m->count; i++) {
        m->params[i].data = m->storage + offset;
        m->params[i].grad = m->grad_storage + offset;
        offset += m->params[i].numel;
    }

    /* The draws, in Llama3Model's constructor order: nn.Embedding's
     * normal_(0, 1); per block GroupedQueryAttention (W_key, W_value,
     * W_query, out_proj), FeedForward (fc1, fc2, fc3), RMSNorm's ones (no
     * draws); final_norm; out_head. Every allocation comes first, so a
     * model that cannot be made leaves the rng where it was (the draws
     * themselves fail only on arguments checked above). */
    size_t C = cfg->emb_dim;
    attn_status st = attn_rng_randn(init_rng, pdata(m, m->tok_emb), cfg->vocab_size * C);
    for (size_t l = 0; st == ATTN_OK && l < cfg->n_layers; l++) {
        llama3_block *b = &m->blocks[l];
        const size_t linear[] = {b->w_key, b->w_value, b->w_query, b->out_proj,
                                 b->fc1,   b->fc2,     b->fc3};
        for (size_t i = 0; st == ATTN_OK && i < sizeof linear / sizeof linear[0]; i++)
            st = draw_linear(m, init_rng, linear[i]);
        fill_ones(pdata(m, b->norm1), C);
        fill_ones(pdata(m, b->norm2), C);
    }
    fill_ones(pdata(m, m->final_norm), C);
    if (st == ATTN_OK) st = draw_linear(m, init_rng, m->out_head);
    if (st != ATTN_OK) {
        attn_llama3_free(m);
        return st;
    }
    *out = m;
    return ATTN_OK;
}

static void free_activations(attn_llama3 *m) {
    attn_free(m->farena);
    attn_free(m->darena);
    attn_free(m->tokens);
    attn_free(m->targets);
    m->farena = NULL;
    m->darena = NULL;
    m->tokens = m->targets = NULL;
    m->rows = 0;
}

void attn_llama3_free(attn_llama3 *m) {
    if (!m) return;
    free_activations(m);
    attn_free(m->blocks);
    attn_free(m->params);
    attn_free(m->names);
    attn_free(m->storage);
    attn_free(m->grad_storage);
    attn_free(m->cosines);
    attn_free(m->sines);
    attn_free(m);
}

attn_param *attn_llama3_params(attn_llama3 *m, size_t *count, size_t *scalars) {
    *count = m->count;
    *scalars = m->scalars;
    return m->params;
}

void attn_llama3_zero_grad(attn_llama3 *m) {
    memset(m->grad_storage, 0, m->scalars * sizeof(float));
}

/* ---- activations ------------------------------------------------------------ */

/* Counts the floats and doubles of every activation buffer for N rows (each
 * a multiple of N) and, when place, carves the arenas into them. */
static void layout_activations(attn_llama3 *m, size_t N, bool place, size_t *nf, size_t *nd) {
    const attn_llama3_config *c = &m->cfg;
    size_t C = c->emb_dim, V = c->vocab_size, F = c->hidden_dim, KV = m->kv_width;
    size_t H = c->n_heads;
    size_t f = 0, d = 0;
#define TAKE_F(ptr, count) (place ? (void)((ptr) = m->farena + f) : (void)0, f += (count))
#define TAKE_D(ptr, count) (place ? (void)((ptr) = m->darena + d) : (void)0, d += (count))
    TAKE_F(m->emb, N * C);
    for (size_t l = 0; l < c->n_layers; l++) {
        llama3_block *b = &m->blocks[l];
        if (place) b->x_in = l ? m->blocks[l - 1].x_out : m->emb;
        TAKE_F(b->h1, N * C);
        TAKE_D(b->rstd1, N);
        TAKE_F(b->q, N * C);
        TAKE_F(b->k, N * KV);
        TAKE_F(b->v, N * KV);
        TAKE_F(b->att, N * C);
        TAKE_F(b->lse, N * H);
        TAKE_F(b->x_mid, N * C);
        TAKE_F(b->h2, N * C);
        TAKE_D(b->rstd2, N);
        TAKE_F(b->gate, N * F);
        TAKE_F(b->up, N * F);
        TAKE_F(b->act, N * F);
        TAKE_F(b->x_out, N * C);
    }
    TAKE_F(m->hf, N * C);
    TAKE_D(m->rstdf, N);
    TAKE_F(m->logits, N * V);
    TAKE_F(m->dres, N * C);
    TAKE_F(m->dtmp, N * C);
    TAKE_F(m->dq_rot, N * C);
    TAKE_F(m->dq, N * C);
    TAKE_F(m->dk_rot, N * KV);
    TAKE_F(m->dk, N * KV);
    TAKE_F(m->dv, N * KV);
    TAKE_F(m->dgate, N * F);
    TAKE_F(m->dup, N * F);
    TAKE_F(m->dact, N * F);
    TAKE_F(m->dlogits, N * V);
#undef TAKE_F
#undef TAKE_D
    *nf = f;
    *nd = d;
}

/* Buffers for N rows: kept when they are big enough. */
static attn_status ensure_rows(attn_llama3 *m, size_t N) {
    if (N <= m->rows) return ATTN_OK;
    /* per row: the config check bounds these counts well inside size_t */
    size_t per_row_f, per_row_d, nf, nd;
    layout_activations(m, 1, false, &per_row_f, &per_row_d);
    if (!attn_mul_size(N, per_row_f, &nf) || !attn_floats_fit(nf) ||
        !attn_mul_size(N, per_row_d, &nd) || nd > (size_t)-1 / sizeof(double))
        return attn_fail(m->ctx, ATTN_ERR_OVERFLOW,
                         "attn_model_forward: activations for %zu rows overflow size_t", N);
    free_activations(m);
    m->farena = attn_alloc_floats(nf);
    m->darena = attn_calloc(nd, sizeof(double));
    m->tokens = attn_calloc(N, sizeof *m->tokens);
    m->targets = attn_calloc(N, sizeof *m->targets);
    if (!m->farena || !m->darena || !m->tokens || !m->targets) {
        free_activations(m);
        return attn_fail(m->ctx, ATTN_ERR_NO_MEMORY,
                         "attn_model_forward: cannot allocate activations for %zu rows", N);
    }
    layout_activations(m, N, true, &nf, &nd);
    m->rows = N;
    return ATTN_OK;
}

/* ---- forward -------------------------------------------------------------------- */

/* The attention of a (B, T) batch: q (B, T, H, D), k and v (B, T, G, D),
 * causal, scale 1 / sqrt(D). */
static attn_sdpa_config attention_config(const attn_llama3 *m, size_t B, size_t T) {
    attn_sdpa_config sc = {.batch = B, .heads = m->cfg.n_heads, .q_tokens = T, .kv_tokens = T,
                           .head_dim = m->head_dim, .causal = true,
                           .kv_heads = m->cfg.n_kv_groups};
    return sc;
}

attn_status attn_llama3_forward(attn_llama3 *m, const int32_t *tokens, const int32_t *targets,
                                size_t batch, size_t seq, float *logits, float *loss) {
    const attn_llama3_config *c = &m->cfg;
    size_t B = batch, T = seq, N = B * T, C = c->emb_dim, V = c->vocab_size;
    size_t F = c->hidden_dim, KV = m->kv_width, H = c->n_heads, G = c->n_kv_groups;
    size_t D = m->head_dim;
    attn_status st = ensure_rows(m, N);
    if (st != ATTN_OK) return st;
    attn_sdpa_config sc = attention_config(m, B, T);

    memcpy(m->tokens, tokens, N * sizeof *tokens);
    attn_workers w = attn_ctx_workers(m->ctx);
    attn_layer_embedding_forward(m->emb, tokens, pdata(m, m->tok_emb), NULL, B, T, C);
    for (size_t l = 0; l < c->n_layers; l++) {
        llama3_block *b = &m->blocks[l];
        attn_layer_rmsnorm_forward(w, b->h1, b->rstd1, b->x_in, pdata(m, b->norm1), N, C,
                                   ATTN_RMSNORM_EPS);
        attn_k_linear(m->ctx, b->h1, pdata(m, b->w_query), NULL, b->q, N, C, C);
        attn_k_linear(m->ctx, b->h1, pdata(m, b->w_key), NULL, b->k, N, C, KV);
        attn_k_linear(m->ctx, b->h1, pdata(m, b->w_value), NULL, b->v, N, C, KV);
        attn_layer_rope_forward(b->q, b->q, m->cosines, m->sines, B, T, H, D);
        attn_layer_rope_forward(b->k, b->k, m->cosines, m->sines, B, T, G, D);
        st = attn_sdpa_forward(m->ctx, &sc, b->q, b->k, b->v, b->att, b->lse, NULL, NULL);
        if (st != ATTN_OK) return st;
        attn_k_linear(m->ctx, b->att, pdata(m, b->out_proj), NULL, b->x_mid, N, C, C);
        attn_layer_residual_forward(w, b->x_mid, b->x_in, b->x_mid, N * C);
        attn_layer_rmsnorm_forward(w, b->h2, b->rstd2, b->x_mid, pdata(m, b->norm2), N, C,
                                   ATTN_RMSNORM_EPS);
        attn_k_linear(m->ctx, b->h2, pdata(m, b->fc1), NULL, b->gate, N, C, F);
        attn_k_linear(m->ctx, b->h2, pdata(m, b->fc2), NULL, b->up, N, C, F);
        attn_layer_swiglu_forward(w, b->act, b->gate, b->up, N * F);
        attn_k_linear(m->ctx, b->act, pdata(m, b->fc3), NULL, b->x_out, N, F, C);
        attn_layer_residual_forward(w, b->x_out, b->x_mid, b->x_out, N * C);
    }
    const float *x = m->blocks[c->n_layers - 1].x_out;
    attn_layer_rmsnorm_forward(w, m->hf, m->rstdf, x, pdata(m, m->final_norm), N, C,
                               ATTN_RMSNORM_EPS);
    attn_k_linear(m->ctx, m->hf, pdata(m, m->out_head), NULL, m->logits, N, C, V);
    if (logits) memcpy(logits, m->logits, N * V * sizeof *logits);
    if (targets) {
        size_t scored;
        double mean = attn_layer_crossentropy_forward(w, m->logits, targets, N, V,
                                                      ATTN_IGNORE_INDEX, &scored,
                                                      attn_k_crossentropy_row(m->ctx));
        if (loss) *loss = (float)mean;
        memcpy(m->targets, targets, N * sizeof *targets);
    }
    m->batch = B;
    m->seq = T;
    return ATTN_OK;
}

/* ---- backward ------------------------------------------------------------------- */

attn_status attn_llama3_backward(attn_llama3 *m) {
    const attn_llama3_config *c = &m->cfg;
    size_t B = m->batch, T = m->seq, N = B * T, C = c->emb_dim, V = c->vocab_size;
    size_t F = c->hidden_dim, KV = m->kv_width, H = c->n_heads, G = c->n_kv_groups;
    size_t D = m->head_dim;
    attn_workers w = attn_ctx_workers(m->ctx);
    attn_sdpa_config sc = attention_config(m, B, T);

    /* loss = cross_entropy(logits, targets): dloss = 1 */
    memset(m->dlogits, 0, N * V * sizeof(float));
    attn_layer_crossentropy_backward(w, m->dlogits, m->logits, m->targets, N, V, ATTN_IGNORE_INDEX,
                                     1.0, attn_k_crossentropy_backward_row(m->ctx));
    /* logits = hf @ out_head^T */
    attn_k_linear_backward(m->ctx, m->hf, pdata(m, m->out_head), m->dlogits, m->dtmp, false,
                           pgrad(m, m->out_head), NULL, N, C, V);
    /* hf = RMSNorm(x): dres becomes dL/dx of the last residual */
    memset(m->dres, 0, N * C * sizeof(float));
    attn_layer_rmsnorm_backward(w, m->dres, pgrad(m, m->final_norm), m->dtmp,
                                m->blocks[c->n_layers - 1].x_out, pdata(m, m->final_norm),
                                m->rstdf, N, C);
    for (size_t l = c->n_layers; l-- > 0;) {
        llama3_block *b = &m->blocks[l];
        /* x_out = x_mid + fc3(silu(fc1(h2)) * fc2(h2)), h2 = RMSNorm(x_mid) */
        attn_k_linear_backward(m->ctx, b->act, pdata(m, b->fc3), m->dres, m->dact, false,
                               pgrad(m, b->fc3), NULL, N, F, C);
        memset(m->dgate, 0, N * F * sizeof(float));
        memset(m->dup, 0, N * F * sizeof(float));
        attn_layer_swiglu_backward(w, m->dgate, m->dup, b->gate, b->up, m->dact, N * F);
        attn_k_linear_backward(m->ctx, b->h2, pdata(m, b->fc1), m->dgate, m->dtmp, false,
                               pgrad(m, b->fc1), NULL, N, C, F);
        attn_k_linear_backward(m->ctx, b->h2, pdata(m, b->fc2), m->dup, m->dtmp, true,
                               pgrad(m, b->fc2), NULL, N, C, F);
        attn_layer_rmsnorm_backward(w, m->dres, pgrad(m, b->norm2), m->dtmp, b->x_mid,
                                    pdata(m, b->norm2), b->rstd2, N, C);
        /* x_mid = x_in + out_proj(SDPA(RoPE(W_query h1), RoPE(W_key h1), W_value h1)),
         * h1 = RMSNorm(x_in) */
        attn_k_linear_backward(m->ctx, b->att, pdata(m, b->out_proj), m->dres, m->dtmp, false,
                               pgrad(m, b->out_proj), NULL, N, C, C);
        attn_status st = attn_sdpa_backward(m->ctx, &sc, b->q, b->k, b->v, b->att, b->lse,
                                            m->dtmp, m->dq_rot, m->dk_rot, m->dv, NULL);
        if (st != ATTN_OK) return st;
        memset(m->dq, 0, N * C * sizeof(float));
        memset(m->dk, 0, N * KV * sizeof(float));
        attn_layer_rope_backward(m->dq, m->dq_rot, m->cosines, m->sines, B, T, H, D);
        attn_layer_rope_backward(m->dk, m->dk_rot, m->cosines, m->sines, B, T, G, D);
        attn_k_linear_backward(m->ctx, b->h1, pdata(m, b->w_query), m->dq, m->dtmp, false,
                               pgrad(m, b->w_query), NULL, N, C, C);
        attn_k_linear_backward(m->ctx, b->h1, pdata(m, b->w_key), m->dk, m->dtmp, true,
                               pgrad(m, b->w_key), NULL, N, C, KV);
        attn_k_linear_backward(m->ctx, b->h1, pdata(m, b->w_value), m->dv, m->dtmp, true,
                               pgrad(m, b->w_value), NULL, N, C, KV);
        attn_layer_rmsnorm_backward(w, m->dres, pgrad(m, b->norm1), m->dtmp, b->x_in,
                                    pdata(m, b->norm1), b->rstd1, N, C);
    }
    /* emb = tok_emb[tokens] */
    attn_layer_embedding_backward(w, pgrad(m, m->tok_emb), NULL, m->dres, m->tokens, B, T, C, V);
    return ATTN_OK;
}
