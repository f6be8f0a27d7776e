/*
 * model.c — a small GPT-style language model around the library's attention
 * modules (include/attn.h, "A small language model"):
 *
 *   x (B, T, C)      = dropout(tok_emb[tokens] + pos_emb[t])
 *   per block l:
 *     ln1 (B, T, C)  = LayerNorm(x)
 *     a   (B, T, C)  = attn(ln1)            MultiHeadAttention or GPT-2's
 *                                           CausalSelfAttention, via
 *                                           attn_module_forward / _backward
 *     x              = x + shortcut_dropout(a)    (the dropout: mha only)
 *     if mlp:
 *       ln2 (B, T, C)  = LayerNorm(x)
 *       fc  (B, T, 4C) = ln2 @ fc.weight^T + fc.bias
 *       h   (B, T, 4C) = GELU(fc)
 *       m   (B, T, C)  = dropout(h @ proj.weight^T + proj.bias)
 *       x              = x + m
 *   lnf (B, T, C)    = LayerNorm(x)
 *   logits (B, T, V) = lnf @ head.weight^T
 *   loss             = cross_entropy(logits, targets, ignore_index=-100)
 *
 * The book's GPTModel (attn_model_new_gpt) is this model with mha and the
 * MLP under the book's names and state_dict order, its GELU the tanh form;
 * chapter 4's bonus GPTs put GroupedQueryAttention, MultiHeadLatentAttention
 * or MultiHeadAttentionWithSWA (a window per layer) where mha is, the
 * shortcut dropout as mha's.
 *
 * The linear layers (mlp.fc, mlp.proj, head) run on the library's kernels
 * (dispatch.h: the ctx's choice, reference or fast); the other layers are
 * layers_impl.h's. The forward keeps every activation the backward needs, in buffers sized
 * for the largest B * T seen; the backward walks the same steps in reverse
 * with one dresidual buffer (B, T, C) that each branch adds into.
 */
#include "fingerprint.h"
#include "kernels/dispatch.h"
#include "overlap.h"
#include "modules/module.h"
#include "train/layers.h"
#include "train/llama3.h"
#include "train/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MODEL_NAME_MAX 96

/* Parameter indices of one block's own tensors (the attention module's are
 * listed between ln1 and ln2). */
typedef struct block {
    attn_module *attn;
    size_t ln1_w, ln1_b, attn_first, ln2_w, ln2_b, fc_w, fc_b, proj_w, proj_b;
    /* activations, capacity rows each */
    float *ln1;                  /* (N, C) */
    double *ln1_mean, *ln1_rstd; /* (N) */
    float *attn_out;             /* (N, C) after the shortcut dropout */
    uint8_t *attn_keep;          /* (N, C) the shortcut dropout's mask */
    float *ln2;                  /* (N, C) */
    double *ln2_mean, *ln2_rstd; /* (N) */
    float *fc, *gelu;            /* (N, 4C) */
    float *mlp_out;              /* (N, C) after the dropout */
    uint8_t *mlp_keep;           /* (N, C) */
    float *resid_in, *resid_mid, *resid_out; /* (N, C) each; mid == out without mlp */
} block;

struct attn_model {
    attn_ctx *ctx;
    attn_model_config cfg;
    /* The book's GPTModel (attn_model_new_gpt): its names, its state_dict
     * order and its tanh GELU; the layers and dropout sites are the mha
     * model's with an MLP (gpt_cfg.attention: the module in mha's place). */
    bool gpt;
    attn_gpt_config gpt_cfg;
    /* The book's Llama3Model (attn_model_new_llama3): the whole body is
     * llama3.c's; params points into it and blocks is NULL. */
    attn_llama3 *llama;
    attn_llama3_config llama_cfg;
    bool training, grad_enabled;

    /* parameters in state_dict order; the model's own tensors live in
     * storage (data) and grad_storage, the modules' in the modules */
    size_t count;
    attn_param *params;
    char (*names)[MODEL_NAME_MAX];
    bool *own; /* params[i] lives in storage */
    size_t own_scalars, num_scalars;
    float *storage, *grad_storage;
    size_t tok_emb, pos_emb, lnf_w, lnf_b, head;
    block *blocks;

    /* activations, for up to `rows` = B * T rows */
    size_t rows;
    float *farena;
    double *darena;
    uint8_t *barena;
    int32_t *tokens, *targets; /* (N) copies of the last forward's */
    float *emb;                /* (N, C) the first residual slot */
    uint8_t *emb_keep;         /* (N, C) */
    float *lnf;                /* (N, C) */
    double *lnf_mean, *lnf_rstd;
    float *logits;             /* (N, V) */
    /* backward scratch */
    float *dres, *dtmp, *dbranch; /* (N, C) */
    float *d4a, *d4b;             /* (N, 4C) */
    float *dlogits;               /* (N, V) */

    /* the last forward */
    size_t batch, seq;
    double dropout_p; /* the dropout it applied (0 in eval mode) */
    bool backward_ready;
    /* Per parameter, count each (NULL before the first forward): its
     * version, its data's fingerprint at that version, the version the
     * last forward read, and room for fresh fingerprints; as the modules
     * keep theirs (module.h): the backward is refused where a parameter
     * changed since the forward. */
    uint64_t *versions;
    bool versions_seen;
};

/* ---- construction ---------------------------------------------------------- */

/* book: the attention may also be one of chapter 4's bonus modules (GQA,
 * MLA, SWA), which attn_model_new_gpt alone builds. */
static attn_status check_config(attn_ctx *ctx, const attn_model_config *c, bool book) {
    const char *who = "attn_model";
    if (c->vocab_size == 0 || c->vocab_size > (size_t)INT32_MAX)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: vocab_size (%zu) must be in [1, %d]", who,
                         c->vocab_size, INT32_MAX);
    if (c->context_length == 0)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: context_length must be positive, got 0", who);
    if (c->d_model == 0)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: d_model must be positive, got 0", who);
    if (c->n_layers == 0)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: n_layers must be positive, got 0", who);
    if (c->n_heads == 0)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: n_heads must be positive, got 0", who);
    if (c->d_model % c->n_heads != 0)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: d_model (%zu) must be divisible by n_heads (%zu)",
                         who, c->d_model, c->n_heads);
    bool bonus = c->attention == ATTN_MODULE_GQA || c->attention == ATTN_MODULE_MLA ||
                 c->attention == ATTN_MODULE_SWA;
    if (c->attention != ATTN_MODULE_MHA && c->attention != ATTN_MODULE_GPT2 && !(book && bonus))
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: attention must be ATTN_MODULE_MHA or ATTN_MODULE_GPT2, got %d", who,
                         (int)c->attention);
    char number[ATTN_NUMBER_CHARS];
    if (!(c->dropout >= 0.0 && c->dropout <= 1.0))
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: dropout (%s) must be in [0, 1]", who,
                         attn_number_text(c->dropout, number));
    /* Every size below is at most a small multiple of these products. */
    size_t vc, tc, cc, layers_cc;
    if (!attn_mul_size(c->vocab_size, c->d_model, &vc) ||
        !attn_mul_size(c->context_length, c->d_model, &tc) ||
        !attn_mul_size(c->d_model, c->d_model, &cc) ||
        !attn_mul_size(c->n_layers, cc, &layers_cc) || layers_cc > (size_t)-1 / 64 ||
        vc > (size_t)-1 / 64 || tc > (size_t)-1 / 64 || c->n_layers > (size_t)-1 / 64)
        return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                         "%s: vocab_size %zu, context_length %zu, d_model %zu, n_layers %zu "
                         "overflow size_t",
                         who, c->vocab_size, c->context_length, c->d_model, c->n_layers);
    return ATTN_OK;
}

/* The number of parameter tensors of one attention module. */
static size_t attention_params(const attn_model_config *c) {
    if (c->attention == ATTN_MODULE_GPT2) return 4;  /* c_attn, c_proj: weight, bias */
    if (c->attention == ATTN_MODULE_GQA)             /* W_key, W_value, W_query; out_proj */
        return (c->qkv_bias ? 6 : 3) + 1;            /* without bias */
    if (c->attention == ATTN_MODULE_MLA)             /* W_query, W_DKV, W_UK, W_UV, out_proj */
        return (c->qkv_bias ? 8 : 4) + 2;
    return (c->qkv_bias ? 6 : 3) + 2;                /* W_query, W_key, W_value, out_proj */
}

static size_t expected_params(const attn_model_config *c) {
    size_t per_block = 2 + attention_params(c) + (c->mlp ? 6 : 0);
    return 2 + c->n_layers * per_block + 3;
}

/* Declares one of the model's own tensors at the next index (name printf'd
 * with the layer); its data and grad come from place_own_params. */
static size_t declare(attn_model *m, size_t ndim, size_t rows, size_t cols, const char *fmt,
                      size_t layer) {
    size_t index = m->count++;
    attn_param *p = &m->params[index];
    snprintf(m->names[index], MODEL_NAME_MAX, fmt, layer);
    p->name = m->names[index];
    p->ndim = ndim;
    p->shape[0] = rows;
    p->shape[1] = ndim == 2 ? cols : 0;
    p->numel = ndim == 2 ? rows * cols : rows;
    m->own[index] = true;
    m->own_scalars += p->numel;
    return index;
}

/* Every own tensor gets its slice of storage and grad_storage. */
static attn_status place_own_params(attn_model *m) {
    m->storage = attn_alloc_floats(m->own_scalars);
    m->grad_storage = attn_alloc_floats(m->own_scalars);
    if (!m->storage || !m->grad_storage)
        return attn_fail(m->ctx, ATTN_ERR_NO_MEMORY, "attn_model_new: cannot allocate %zu "
                         "parameters", m->own_scalars);
    size_t offset = 0;
    for (size_t i = 0; i < m->count; i++) {
        if (!m->own[i]) continue;
        m->params[i].data = m->storage + offset;
        m->params[i].grad = m->grad_storage + offset;
        offset += m->params[i].numel;
    }
    return ATTN_OK;
}

/* Fills the slots [first, first + count) with the module's parameters,
 * named blocks.<layer>.attn.<name>. */
static attn_status adopt_module_params(attn_model *m, attn_module *mod, size_t layer,
                                       size_t first, size_t count) {
    if (attn_module_param_count(mod) != count)
        return attn_fail(m->ctx, ATTN_ERR_INVALID,
                         "attn_model_new: %s has %zu parameter tensors, the model expected %zu",
                         attn_module_class_name(mod), attn_module_param_count(mod), count);
    for (size_t i = 0; i < count; i++) {
        attn_param p;
        attn_status st = attn_module_param_at(mod, i, &p);
        if (st != ATTN_OK) return st;
        snprintf(m->names[first + i], MODEL_NAME_MAX,
                 m->gpt ? "trf_blocks.%zu.att.%s" : "blocks.%zu.attn.%s", layer, p.name);
        p.name = m->names[first + i];
        m->params[first + i] = p;
    }
    return ATTN_OK;
}

static float *pdata(attn_model *m, size_t index) { return m->params[index].data; }
static float *pgrad(attn_model *m, size_t index) { return m->params[index].grad; }

static void fill(float *x, size_t n, float value) {
    for (size_t i = 0; i < n; i++) x[i] = value;
}

/* The window of layer l of gpt_with_kv_swa.py's GPTModel (0: none): with
 * the stride K > 0, K windowed layers then one without; K < 0 every layer;
 * K = 0 none. */
static size_t gpt_layer_window(const attn_gpt_config *g, size_t layer) {
    if (g->attention != ATTN_GPT_SWA || g->sliding_window_stride == 0) return 0;
    if (g->sliding_window_stride < 0) return g->sliding_window_size;
    uint64_t k = (uint64_t)g->sliding_window_stride;
    return (uint64_t)layer % (k + 1) < k ? g->sliding_window_size : 0;
}

static attn_status new_attention(attn_model *m, size_t layer, attn_rng *rng, attn_module **out) {
    const attn_model_config *c = &m->cfg;
    attn_module_config mc = {.d_in = c->d_model, .d_out = c->d_model,
                             .context_length = c->context_length, .num_heads = c->n_heads,
                             .dropout = c->dropout, .qkv_bias = c->qkv_bias};
    if (m->gpt) {
        mc.num_kv_groups = m->gpt_cfg.n_kv_groups;
        mc.latent_dim = m->gpt_cfg.latent_dim;
        mc.sliding_window_size = gpt_layer_window(&m->gpt_cfg, layer);
    }
    return attn_module_new(m->ctx, c->attention, &mc, rng, out);
}

/* The small model's own tensors in its state_dict order (names and draws of
 * attn.h's "A small language model"). */
static void declare_small(attn_model *m, size_t n_attn) {
    const attn_model_config *cfg = &m->cfg;
    size_t V = cfg->vocab_size, T = cfg->context_length, C = cfg->d_model;
    m->tok_emb = declare(m, 2, V, C, "tok_emb.weight", 0);
    m->pos_emb = declare(m, 2, T, C, "pos_emb.weight", 0);
    for (size_t l = 0; l < cfg->n_layers; l++) {
        block *b = &m->blocks[l];
        b->ln1_w = declare(m, 1, C, 0, "blocks.%zu.ln1.weight", l);
        b->ln1_b = declare(m, 1, C, 0, "blocks.%zu.ln1.bias", l);
        b->attn_first = m->count;
        m->count += n_attn;
        if (cfg->mlp) {
            b->ln2_w = declare(m, 1, C, 0, "blocks.%zu.ln2.weight", l);
            b->ln2_b = declare(m, 1, C, 0, "blocks.%zu.ln2.bias", l);
            b->fc_w = declare(m, 2, 4 * C, C, "blocks.%zu.mlp.fc.weight", l);
            b->fc_b = declare(m, 1, 4 * C, 0, "blocks.%zu.mlp.fc.bias", l);
            b->proj_w = declare(m, 2, C, 4 * C, "blocks.%zu.mlp.proj.weight", l);
            b->proj_b = declare(m, 1, C, 0, "blocks.%zu.mlp.proj.bias", l);
        }
    }
    m->lnf_w = declare(m, 1, C, 0, "ln_f.weight", 0);
    m->lnf_b = declare(m, 1, C, 0, "ln_f.bias", 0);
    m->head = declare(m, 2, V, C, "head.weight", 0);
}

/* The book's GPTModel's tensors in its state_dict order: a module's
 * parameters come in the order its submodules are assigned (TransformerBlock:
 * att, ff, norm1, norm2), which is not the order of the forward. */
static void declare_gpt(attn_model *m, size_t n_attn) {
    const attn_model_config *cfg = &m->cfg;
    size_t V = cfg->vocab_size, T = cfg->context_length, C = cfg->d_model;
    m->tok_emb = declare(m, 2, V, C, "tok_emb.weight", 0);
    m->pos_emb = declare(m, 2, T, C, "pos_emb.weight", 0);
    for (size_t l = 0; l < cfg->n_layers; l++) {
        block *b = &m->blocks[l];
        b->attn_first = m->count;
        m->count += n_attn;
        b->fc_w = declare(m, 2, 4 * C, C, "trf_blocks.%zu.ff.layers.0.weight", l);
        b->fc_b = declare(m, 1, 4 * C, 0, "trf_blocks.%zu.ff.layers.0.bias", l);
        b->proj_w = declare(m, 2, C, 4 * C, "trf_blocks.%zu.ff.layers.2.weight", l);
        b->proj_b = declare(m, 1, C, 0, "trf_blocks.%zu.ff.layers.2.bias", l);
        b->ln1_w = declare(m, 1, C, 0, "trf_blocks.%zu.norm1.scale", l);
        b->ln1_b = declare(m, 1, C, 0, "trf_blocks.%zu.norm1.shift", l);
        b->ln2_w = declare(m, 1, C, 0, "trf_blocks.%zu.norm2.scale", l);
        b->ln2_b = declare(m, 1, C, 0, "trf_blocks.%zu.norm2.shift", l);
    }
    m->lnf_w = declare(m, 1, C, 0, "final_norm.scale", 0);
    m->lnf_b = declare(m, 1, C, 0, "final_norm.shift", 0);
    m->head = declare(m, 2, V, C, "out_head.weight", 0);
}

/* attn_model_new and attn_model_new_gpt once cfg is checked; gpt (the
 * book's config, or NULL) selects the book's GPTModel. */
static attn_status model_new(attn_ctx *ctx, const attn_model_config *cfg,
                             const attn_gpt_config *gpt, attn_rng *init_rng, attn_model **out) {
    attn_status st;
    /* The attention modules allocate between draws: a failure puts the rng
     * back where it was. */
    attn_rng *rng_before = attn_rng_snapshot(init_rng);
    attn_model *m = rng_before ? attn_calloc(1, sizeof *m) : NULL;
    if (!m) {
        attn_rng_free(rng_before);
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_model_new: out of memory");
    }
    m->ctx = ctx;
    m->cfg = *cfg;
    m->gpt = gpt != NULL;
    if (gpt) m->gpt_cfg = *gpt;
    m->training = true;
    m->grad_enabled = true;
    size_t n = expected_params(cfg);
    m->blocks = attn_calloc(cfg->n_layers, sizeof *m->blocks);
    m->params = attn_calloc(n, sizeof *m->params);
    m->names = attn_calloc(n, sizeof *m->names);
    m->own = attn_calloc(n, sizeof *m->own);
    if (!m->blocks || !m->params || !m->names || !m->own) {
        attn_model_free(m);
        attn_rng_free(rng_before);
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_model_new: out of memory for %zu "
                         "parameter tensors", n);
    }
    size_t V = cfg->vocab_size, T = cfg->context_length, C = cfg->d_model;
    size_t n_attn = attention_params(cfg);

    /* 1. The state_dict: the model's own tensors, with a slot for each of
     *    the attention modules' (filled when the module is made). */
    if (gpt)
        declare_gpt(m, n_attn);
    else
        declare_small(m, n_attn);
    if ((st = place_own_params(m)) != ATTN_OK) goto fail;

    /* 2. The draws, in the PyTorch constructor's order (the same for both:
     *    the book's TransformerBlock makes att before ff). nn.Embedding:
     *    normal_(0, 1); LayerNorm: ones and zeros, no draws; the attention
     *    module: its own constructor; nn.Linear: kaiming_uniform_ + bias. */
    if ((st = attn_rng_randn(init_rng, pdata(m, m->tok_emb), V * C)) != ATTN_OK ||
        (st = attn_rng_randn(init_rng, pdata(m, m->pos_emb), T * C)) != ATTN_OK)
        goto fail;
    for (size_t l = 0; l < cfg->n_layers; l++) {
        block *b = &m->blocks[l];
        fill(pdata(m, b->ln1_w), C, 1.0f);
        if ((st = new_attention(m, l, init_rng, &b->attn)) != ATTN_OK ||
            (st = adopt_module_params(m, b->attn, l, b->attn_first, n_attn)) != ATTN_OK)
            goto fail;
        if (cfg->mlp) {
            fill(pdata(m, b->ln2_w), C, 1.0f);
            if ((st = attn_rng_linear_init(init_rng, pdata(m, b->fc_w), pdata(m, b->fc_b),
                                           4 * C, C)) != ATTN_OK ||
                (st = attn_rng_linear_init(init_rng, pdata(m, b->proj_w), pdata(m, b->proj_b),
                                           C, 4 * C)) != ATTN_OK)
                goto fail;
        }
    }
    fill(pdata(m, m->lnf_w), C, 1.0f);
    if ((st = attn_rng_linear_init(init_rng, pdata(m, m->head), NULL, V, C)) != ATTN_OK)
        goto fail;
    for (size_t i = 0; i < m->count; i++) m->num_scalars += m->params[i].numel;
    attn_rng_free(rng_before);
    *out = m;
    return ATTN_OK;
fail:
    attn_model_free(m);
    attn_rng_restore(init_rng, rng_before);
    attn_rng_free(rng_before);
    return st;
}

attn_status attn_model_new(attn_ctx *ctx, const attn_model_config *cfg, attn_rng *init_rng,
                           attn_model **out) {
    if (out) *out = NULL; /* on any failure, as attn.h promises */
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!cfg || !init_rng || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_model_new: %s is NULL",
                         !cfg ? "cfg" : !init_rng ? "init_rng" : "out");
    attn_status st = check_config(ctx, cfg, false);
    if (st != ATTN_OK) return st;
    return model_new(ctx, cfg, NULL, init_rng, out);
}

attn_model_config attn_model_config_of_gpt(const attn_gpt_config *g) {
    attn_module_kind kind = g->attention == ATTN_GPT_GQA   ? ATTN_MODULE_GQA
                            : g->attention == ATTN_GPT_MLA ? ATTN_MODULE_MLA
                            : g->attention == ATTN_GPT_SWA ? ATTN_MODULE_SWA
                                                           : ATTN_MODULE_MHA;
    attn_model_config c = {.vocab_size = g->vocab_size, .context_length = g->context_length,
                           .d_model = g->emb_dim, .n_layers = g->n_layers, .n_heads = g->n_heads,
                           .attention = kind, .mlp = true, .dropout = g->drop_rate,
                           .qkv_bias = g->qkv_bias};
    return c;
}

attn_lm_config attn_model_lm_config_of_gpt(const attn_gpt_config *g) {
    attn_lm_config c = {.arch = g->attention == ATTN_GPT_GQA   ? ATTN_LM_GPT_GQA
                                : g->attention == ATTN_GPT_MLA ? ATTN_LM_GPT_MLA
                                                               : ATTN_LM_GPT2,
                        .vocab_size = g->vocab_size,
                        .context_length = g->context_length,
                        .emb_dim = g->emb_dim,
                        .n_heads = g->n_heads,
                        .n_layers = g->n_layers,
                        .n_kv_groups = g->attention == ATTN_GPT_GQA ? g->n_kv_groups : g->n_heads,
                        .qkv_bias = g->qkv_bias,
                        .weights_dtype = ATTN_DTYPE_F32,
                        .latent_dim = g->attention == ATTN_GPT_MLA ? g->latent_dim : 0};
    /* attn_lm_config's stride 0 is every layer; the book's is none */
    if (g->attention == ATTN_GPT_SWA && g->sliding_window_stride != 0) {
        c.sliding_window_size = g->sliding_window_size;
        c.sliding_window_stride =
            g->sliding_window_stride > 0 ? (size_t)g->sliding_window_stride : 0;
    }
    return c;
}

/* The variant's fields: each attention's own in range, the others' 0. */
static attn_status check_gpt_variant(attn_ctx *ctx, const attn_gpt_config *cfg) {
    const char *who = "attn_model_new_gpt";
    static const char *const names[] = {"ATTN_GPT_MHA", "ATTN_GPT_GQA", "ATTN_GPT_MLA",
                                        "ATTN_GPT_SWA"};
    if ((unsigned)cfg->attention > ATTN_GPT_SWA)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: attention (%d) must be ATTN_GPT_MHA, ATTN_GPT_GQA, ATTN_GPT_MLA or "
                         "ATTN_GPT_SWA", who, (int)cfg->attention);
    const char *name = names[cfg->attention];
    attn_gpt_attention a = cfg->attention;
    if (a != ATTN_GPT_GQA && cfg->n_kv_groups != 0)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: n_kv_groups (%zu) is ATTN_GPT_GQA's; "
                         "attention is %s", who, cfg->n_kv_groups, name);
    if (a != ATTN_GPT_MLA && cfg->latent_dim != 0)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: latent_dim (%zu) is ATTN_GPT_MLA's; "
                         "attention is %s", who, cfg->latent_dim, name);
    if (a != ATTN_GPT_SWA && (cfg->sliding_window_size != 0 || cfg->sliding_window_stride != 0))
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: sliding_window_size (%zu) and "
                         "sliding_window_stride (%lld) are ATTN_GPT_SWA's; attention is %s",
                         who, cfg->sliding_window_size, (long long)cfg->sliding_window_stride,
                         name);
    if (a == ATTN_GPT_GQA && (cfg->n_kv_groups == 0 || cfg->n_heads % cfg->n_kv_groups != 0))
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: n_kv_groups (%zu) must be a positive "
                         "divisor of n_heads (%zu)", who, cfg->n_kv_groups, cfg->n_heads);
    if (a == ATTN_GPT_SWA && cfg->sliding_window_size == 0)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: sliding_window_size (0) must be at least 1 "
                         "(ATTN_GPT_SWA)", who);
    return ATTN_OK;
}

attn_status attn_model_new_gpt(attn_ctx *ctx, const attn_gpt_config *cfg, attn_rng *init_rng,
                               attn_model **out) {
    if (out) *out = NULL;
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!cfg || !init_rng || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_model_new_gpt: %s is NULL",
                         !cfg ? "cfg" : !init_rng ? "init_rng" : "out");
    /* The book's names for the values check_config would call otherwise. */
    if (cfg->emb_dim == 0 || cfg->n_heads == 0 || cfg->emb_dim % cfg->n_heads != 0)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "attn_model_new_gpt: emb_dim (%zu) must be a positive multiple of "
                         "n_heads (%zu)", cfg->emb_dim, cfg->n_heads);
    char number[ATTN_NUMBER_CHARS];
    if (!(cfg->drop_rate >= 0.0 && cfg->drop_rate <= 1.0))
        return attn_fail(ctx, ATTN_ERR_INVALID, "attn_model_new_gpt: drop_rate (%s) must be in "
                         "[0, 1]", attn_number_text(cfg->drop_rate, number));
    attn_status st = check_gpt_variant(ctx, cfg);
    if (st != ATTN_OK) return st;
    attn_model_config c = attn_model_config_of_gpt(cfg);
    if ((st = check_config(ctx, &c, true)) != ATTN_OK) return st;
    return model_new(ctx, &c, cfg, init_rng, out);
}

bool attn_model_is_gpt(const attn_model *m) { return m && m->gpt; }
bool attn_model_is_llama3(const attn_model *m) { return m && m->llama; }

attn_model_config attn_model_config_of_llama3(const attn_llama3_config *l) {
    attn_model_config c = {.vocab_size = l->vocab_size, .context_length = l->context_length,
                           .d_model = l->emb_dim, .n_layers = l->n_layers, .n_heads = l->n_heads,
                           .attention = ATTN_MODULE_GQA, .mlp = true, .dropout = 0.0,
                           .qkv_bias = false};
    return c;
}

attn_status attn_model_new_llama3(attn_ctx *ctx, const attn_llama3_config *cfg,
                                  attn_rng *init_rng, attn_model **out) {
    if (out) *out = NULL;
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!cfg || !init_rng || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_model_new_llama3: %s is NULL",
                         !cfg ? "cfg" : !init_rng ? "init_rng" : "out");
    attn_status st = attn_llama3_check_config(ctx, "attn_model_new_llama3", cfg);
    if (st != ATTN_OK) return st;
    attn_model *m = attn_calloc(1, sizeof *m);
    if (!m) return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_model_new_llama3: out of memory");
    if ((st = attn_llama3_new(ctx, cfg, init_rng, &m->llama)) != ATTN_OK) {
        attn_free(m);
        return st;
    }
    m->ctx = ctx;
    m->cfg = attn_model_config_of_llama3(cfg);
    m->llama_cfg = *cfg;
    m->training = true;
    m->grad_enabled = true;
    m->params = attn_llama3_params(m->llama, &m->count, &m->num_scalars);
    *out = m;
    return ATTN_OK;
}

attn_status attn_model_get_llama3_config(const attn_model *m, attn_llama3_config *out) {
    if (!m) return ATTN_ERR_NULL;
    attn_clear_error(m->ctx);
    if (!out)
        return attn_fail(m->ctx, ATTN_ERR_NULL, "attn_model_get_llama3_config: out is NULL");
    if (!m->llama)
        return attn_fail(m->ctx, ATTN_ERR_INVALID, "attn_model_get_llama3_config: the model was "
                         "made by %s, not attn_model_new_llama3",
                         m->gpt ? "attn_model_new_gpt" : "attn_model_new");
    *out = m->llama_cfg;
    return ATTN_OK;
}

attn_status attn_model_get_gpt_config(const attn_model *m, attn_gpt_config *out) {
    if (!m) return ATTN_ERR_NULL;
    attn_clear_error(m->ctx);
    if (!out) return attn_fail(m->ctx, ATTN_ERR_NULL, "attn_model_get_gpt_config: out is NULL");
    if (!m->gpt)
        return attn_fail(m->ctx, ATTN_ERR_INVALID, "attn_model_get_gpt_config: the model was made "
                         "by %s, not attn_model_new_gpt",
                         m->llama ? "attn_model_new_llama3" : "attn_model_new");
    *out = m->gpt_cfg;
    return ATTN_OK;
}

static void free_activations(attn_model *m) {
    attn_free(m->farena);
    attn_free(m->darena);
    attn_free(m->barena);
    attn_free(m->tokens);
    attn_free(m->targets);
    m->farena = NULL;
    m->darena = NULL;
    m->barena = NULL;
    m->tokens = m->targets = NULL;
    m->rows = 0;
}

void attn_model_free(attn_model *m) {
    if (!m) return;
    if (m->llama) {
        attn_llama3_free(m->llama); /* its params with it */
        attn_free(m->versions);
        attn_free(m);
        return;
    }
    if (m->blocks)
        for (size_t l = 0; l < m->cfg.n_layers; l++) attn_module_free(m->blocks[l].attn);
    free_activations(m);
    attn_free(m->blocks);
    attn_free(m->params);
    attn_free(m->names);
    attn_free(m->own);
    attn_free(m->storage);
    attn_free(m->grad_storage);
    attn_free(m->versions);
    attn_free(m);
}

/* ---- the generic view ------------------------------------------------------ */

attn_ctx *attn_model_ctx(const attn_model *m) { return m ? m->ctx : NULL; }

attn_model_config attn_model_get_config(const attn_model *m) {
    attn_model_config none = {0};
    return m ? m->cfg : none;
}
size_t attn_model_param_count(const attn_model *m) { return m ? m->count : 0; }
size_t attn_model_num_scalars(const attn_model *m) { return m ? m->num_scalars : 0; }

attn_status attn_model_param_at(attn_model *m, size_t index, attn_param *out) {
    if (!m) return ATTN_ERR_NULL;
    attn_clear_error(m->ctx);
    if (!out) return attn_fail(m->ctx, ATTN_ERR_NULL, "attn_model_param_at: out is NULL");
    if (index >= m->count)
        return attn_fail(m->ctx, ATTN_ERR_NOT_FOUND,
                         "the model has %zu parameters; index %zu is out of range", m->count,
                         index);
    *out = m->params[index];
    return ATTN_OK;
}

attn_status attn_model_param(attn_model *m, const char *name, attn_param *out) {
    if (!m) return ATTN_ERR_NULL;
    attn_clear_error(m->ctx);
    if (!name || !out)
        return attn_fail(m->ctx, ATTN_ERR_NULL, "attn_model_param: %s is NULL",
                         !name ? "name" : "out");
    for (size_t i = 0; i < m->count; i++) {
        if (strcmp(m->params[i].name, name) == 0) {
            *out = m->params[i];
            return ATTN_OK;
        }
    }
    return attn_fail(m->ctx, ATTN_ERR_NOT_FOUND, "the model has no parameter named '%s'", name);
}

attn_status attn_model_params(attn_model *m, const attn_param **params, size_t *count) {
    if (!m) return ATTN_ERR_NULL;
    attn_clear_error(m->ctx);
    if (!params || !count)
        return attn_fail(m->ctx, ATTN_ERR_NULL, "attn_model_params: %s is NULL",
                         !params ? "params" : "count");
    *params = m->params;
    *count = m->count;
    return ATTN_OK;
}

attn_status attn_model_set_training(attn_model *m, bool training) {
    if (!m) return ATTN_ERR_NULL;
    attn_clear_error(m->ctx);
    for (size_t l = 0; !m->llama && l < m->cfg.n_layers; l++) {
        attn_status st = attn_module_set_training(m->blocks[l].attn, training);
        if (st != ATTN_OK) return st;
    }
    m->training = training; /* the book's Llama3Model has no dropout */
    return ATTN_OK;
}

attn_status attn_model_set_grad_enabled(attn_model *m, bool enabled) {
    if (!m) return ATTN_ERR_NULL;
    attn_clear_error(m->ctx);
    for (size_t l = 0; !m->llama && l < m->cfg.n_layers; l++) {
        attn_status st = attn_module_set_grad_enabled(m->blocks[l].attn, enabled);
        if (st != ATTN_OK) return st;
    }
    /* the last forward's backward stands, as PyTorch's graph does */
    m->grad_enabled = enabled;
    return ATTN_OK;
}

attn_status attn_model_zero_grad(attn_model *m) {
    if (!m) return ATTN_ERR_NULL;
    attn_clear_error(m->ctx);
    if (m->llama) {
        attn_llama3_zero_grad(m->llama);
        return ATTN_OK;
    }
    memset(m->grad_storage, 0, m->own_scalars * sizeof(float));
    for (size_t l = 0; l < m->cfg.n_layers; l++) {
        attn_status st = attn_module_zero_grad(m->blocks[l].attn);
        if (st != ATTN_OK) return st;
    }
    return ATTN_OK;
}

/* ---- activations ------------------------------------------------------------ */

/* Carves the arenas into every activation buffer for N rows; with arenas
 * NULL it only counts (floats, doubles, bytes). */
static void layout_activations(attn_model *m, size_t N, size_t *nf, size_t *nd, size_t *nb) {
    size_t C = m->cfg.d_model, V = m->cfg.vocab_size, L = m->cfg.n_layers;
    bool mlp = m->cfg.mlp;
    size_t f = 0, d = 0, b = 0;
#define TAKE_F(ptr, count) ((ptr) = m->farena ? m->farena + f : NULL, f += (count))
#define TAKE_D(ptr, count) ((ptr) = m->darena ? m->darena + d : NULL, d += (count))
#define TAKE_B(ptr, count) ((ptr) = m->barena ? m->barena + b : NULL, b += (count))
    TAKE_F(m->emb, N * C);
    TAKE_B(m->emb_keep, N * C);
    float *resid = m->emb;
    for (size_t l = 0; l < L; l++) {
        block *k = &m->blocks[l];
        k->resid_in = resid;
        TAKE_F(k->ln1, N * C);
        TAKE_D(k->ln1_mean, N);
        TAKE_D(k->ln1_rstd, N);
        TAKE_F(k->attn_out, N * C);
        TAKE_B(k->attn_keep, N * C);
        TAKE_F(k->resid_mid, N * C);
        k->resid_out = k->resid_mid;
        if (mlp) {
            TAKE_F(k->ln2, N * C);
            TAKE_D(k->ln2_mean, N);
            TAKE_D(k->ln2_rstd, N);
            TAKE_F(k->fc, N * 4 * C);
            TAKE_F(k->gelu, N * 4 * C);
            TAKE_F(k->mlp_out, N * C);
            TAKE_B(k->mlp_keep, N * C);
            TAKE_F(k->resid_out, N * C);
        }
        resid = k->resid_out;
    }
    TAKE_F(m->lnf, N * C);
    TAKE_D(m->lnf_mean, N);
    TAKE_D(m->lnf_rstd, N);
    TAKE_F(m->logits, N * V);
    TAKE_F(m->dres, N * C);
    TAKE_F(m->dtmp, N * C);
    TAKE_F(m->dbranch, N * C);
    TAKE_F(m->d4a, mlp ? N * 4 * C : 0);
    TAKE_F(m->d4b, mlp ? N * 4 * C : 0);
    TAKE_F(m->dlogits, N * V);
#undef TAKE_F
#undef TAKE_D
#undef TAKE_B
    *nf = f;
    *nd = d;
    *nb = b;
}

/* Buffers for N rows: kept when they are big enough. */
static attn_status ensure_rows(attn_model *m, size_t N) {
    if (N <= m->rows) return ATTN_OK;
    size_t C = m->cfg.d_model, V = m->cfg.vocab_size, L = m->cfg.n_layers;
    /* Per row at most 14 C floats per block, 13 C + 2 V besides, 4 L + 2
     * doubles and (2 L + 1) C bytes (layout_activations). */
    size_t per_row, total, doubles, bytes;
    if (!attn_mul3_size(L, 14, C, &per_row) || !attn_add_size(per_row, 13 * C, &per_row) ||
        !attn_add_size(per_row, 2 * V, &per_row) || !attn_mul_size(N, per_row, &total) ||
        !attn_floats_fit(total) || !attn_mul_size(N, 4 * L + 2, &doubles) ||
        doubles > (size_t)-1 / sizeof(double) || !attn_mul3_size(N, 2 * L + 1, C, &bytes))
        return attn_fail(m->ctx, ATTN_ERR_OVERFLOW,
                         "attn_model forward: activations for %zu rows overflow size_t", N);
    free_activations(m);
    size_t nf, nd, nb;
    layout_activations(m, N, &nf, &nd, &nb);
    m->farena = attn_alloc_floats(nf);
    m->darena = attn_calloc(nd ? nd : 1, sizeof(double));
    m->barena = attn_calloc(nb ? nb : 1, 1);
    m->tokens = attn_calloc(N, sizeof *m->tokens);
    m->targets = attn_calloc(N, sizeof *m->targets);
    if (!m->farena || !m->darena || !m->barena || !m->tokens || !m->targets) {
        free_activations(m);
        return attn_fail(m->ctx, ATTN_ERR_NO_MEMORY,
                         "attn_model forward: cannot allocate activations for %zu rows", N);
    }
    layout_activations(m, N, &nf, &nd, &nb);
    m->rows = N;
    return ATTN_OK;
}

/* ---- dropout ------------------------------------------------------------------ */

/* x (n) = dropout(x) in place, the mask kept for the backward. */
static void dropout_forward(attn_rng *rng, double p, float *x, uint8_t *keep, size_t n) {
    attn_dropout_stream s;
    attn_dropout_stream_begin(&s, rng, p, n);
    attn_dropout_stream_apply(&s, x, x, n, keep);
}

/* in the forward pass this was: y = x * keep / (1 - p), so
 * dx (n) = dy * keep / (1 - p), the scale as PyTorch's float. */
static void dropout_backward(float *dx, const float *dy, const uint8_t *keep, double p,
                             size_t n) {
    float scale = attn_dropout_kept_scale(p);
    for (size_t i = 0; i < n; i++) dx[i] = keep[i] ? dy[i] * scale : 0.0f;
}

/* ---- forward -------------------------------------------------------------------- */

static attn_status check_ids(attn_model *m, const char *what, const int32_t *ids, size_t batch,
                             size_t seq, bool allow_ignore) {
    int32_t V = (int32_t)m->cfg.vocab_size;
    for (size_t n = 0; n < batch * seq; n++) {
        int32_t id = ids[n];
        if ((id >= 0 && id < V) || (allow_ignore && id == ATTN_IGNORE_INDEX)) continue;
        return attn_fail(m->ctx, ATTN_ERR_INVALID, "attn_model_forward: %s[%zu, %zu] = %d is "
                         "outside [0, %d)%s",
                         what, n / seq, n % seq, (int)id, (int)V,
                         allow_ignore ? " and is not the ignore_index -100" : "");
    }
    return ATTN_OK;
}

/* The forward writes logits (N, V) and *loss last, after reading the
 * tokens, the targets and every parameter: none of them may share their
 * memory, nor the gradients a backward would write. */
static attn_status check_outputs(attn_model *m, const int32_t *tokens, const int32_t *targets,
                                 size_t N, const float *logits, const float *loss) {
    const char *who = "attn_model_forward";
    size_t logit_bytes;
    if (logits && (!attn_mul_size(N, m->cfg.vocab_size, &logit_bytes) ||
                   !attn_mul_size(logit_bytes, sizeof(float), &logit_bytes)))
        return attn_fail(m->ctx, ATTN_ERR_OVERFLOW, "%s: logits of (%zu, %zu) overflow", who, N,
                         m->cfg.vocab_size);
    attn_span outs[] = {{"logits", logits, logits ? logit_bytes : 0},
                        {"loss", loss, loss ? sizeof(float) : 0}};
    attn_span ins[] = {{"tokens", tokens, N * sizeof(int32_t)},
                       {"targets", targets, targets ? N * sizeof(int32_t) : 0}};
    attn_status st = attn_check_overlap(m->ctx, who, outs, 2, ins, 2);
    for (size_t i = 0; st == ATTN_OK && i < m->count; i++) {
        const attn_param *p = &m->params[i];
        char data_name[MODEL_NAME_MAX + 16], grad_name[MODEL_NAME_MAX + 32];
        snprintf(data_name, sizeof data_name, "parameter %s", p->name);
        snprintf(grad_name, sizeof grad_name, "the gradient of %s", p->name);
        attn_span param[] = {{data_name, p->data, p->numel * sizeof(float)},
                             {grad_name, p->grad, p->grad ? p->numel * sizeof(float) : 0}};
        st = attn_check_overlap(m->ctx, who, outs, 2, param, 2);
    }
    return st;
}

/* The parameters' fingerprints, a share of them per thread. */
typedef struct versions_job {
    const attn_param *params;
    uint64_t *fingerprints;
} versions_job;

static void fingerprint_params(void *arg, size_t begin, size_t end) {
    const versions_job *j = arg;
    for (size_t i = begin; i < end; i++)
        j->fingerprints[i] = attn_fingerprint_floats(j->params[i].data, j->params[i].numel);
}

/* Brings every parameter's version up to date: one more for each whose
 * data differs from its version's fingerprint (the first call takes the
 * fingerprints). */
static void observe_versions(attn_model *m) {
    size_t n = m->count;
    uint64_t *version = m->versions, *fingerprint = m->versions + n, *fresh = m->versions + 3 * n;
    attn_workers w = attn_ctx_workers(m->ctx);
    versions_job job = {m->params, fresh};
    attn_pool_for(w.pool, w.threads, n, 1, fingerprint_params, &job);
    for (size_t i = 0; i < n; i++) {
        if (m->versions_seen && fresh[i] != fingerprint[i]) version[i]++;
        fingerprint[i] = fresh[i];
    }
    m->versions_seen = true;
}

/* The versions of the parameters a forward read, for its backward. */
static void keep_versions(attn_model *m) {
    observe_versions(m);
    memcpy(m->versions + 2 * m->count, m->versions, m->count * sizeof *m->versions);
}

attn_status attn_model_forward(attn_model *m, const int32_t *tokens, const int32_t *targets,
                               size_t batch, size_t seq, float *logits, float *loss,
                               attn_rng *dropout_rng) {
    if (!m) return ATTN_ERR_NULL;
    attn_clear_error(m->ctx);
    const attn_model_config *c = &m->cfg;
    if (!tokens) return attn_fail(m->ctx, ATTN_ERR_NULL, "attn_model_forward: tokens is NULL");
    if (!targets && loss)
        return attn_fail(m->ctx, ATTN_ERR_INVALID, "attn_model_forward: a loss needs targets");
    if (!targets && !logits)
        return attn_fail(m->ctx, ATTN_ERR_INVALID,
                         "attn_model_forward: neither targets nor logits: nothing to compute");
    if (batch == 0 || seq == 0)
        return attn_fail(m->ctx, ATTN_ERR_INVALID,
                         "attn_model_forward: batch (%zu) and sequence length (%zu) must be positive",
                         batch, seq);
    if (seq > c->context_length)
        return attn_fail(m->ctx, ATTN_ERR_SHAPE,
                         "attn_model_forward: sequence length (%zu) exceeds context_length (%zu)",
                         seq, c->context_length);
    double p = m->training ? c->dropout : 0.0;
    if (p > 0.0 && !dropout_rng)
        return attn_fail(m->ctx, ATTN_ERR_NULL,
                         "attn_model_forward: dropout %g in training mode needs dropout_rng", p);
    size_t N;
    if (!attn_mul_size(batch, seq, &N))
        return attn_fail(m->ctx, ATTN_ERR_OVERFLOW, "attn_model_forward: (%zu, %zu) overflows",
                         batch, seq);
    attn_status st = check_ids(m, "tokens", tokens, batch, seq, false);
    if (st == ATTN_OK && targets) st = check_ids(m, "targets", targets, batch, seq, true);
    if (st == ATTN_OK) st = check_outputs(m, tokens, targets, N, logits, loss);
    if (st == ATTN_OK && !m->versions &&
        !(m->versions = attn_calloc(4 * m->count, sizeof *m->versions)))
        st = attn_fail(m->ctx, ATTN_ERR_NO_MEMORY,
                       "attn_model_forward: out of memory for %zu parameter versions", m->count);
    if (st != ATTN_OK) return st; /* refused: the last forward's backward stands */
    m->backward_ready = false;    /* from here its buffers change */
    if (m->llama) {
        st = attn_llama3_forward(m->llama, tokens, targets, batch, seq, logits, loss);
        m->backward_ready = st == ATTN_OK && targets && m->grad_enabled;
        if (m->backward_ready) keep_versions(m);
        return st;
    }
    st = ensure_rows(m, N);
    if (st != ATTN_OK) return st;
    /* The attention modules allocate between dropout draws: a failure puts
     * the dropout rng back where it was (logits and loss are written last). */
    attn_rng *rng_before = NULL;
    if (p > 0.0 && !(rng_before = attn_rng_snapshot(dropout_rng)))
        return attn_fail(m->ctx, ATTN_ERR_NO_MEMORY, "attn_model_forward: out of memory");

    size_t C = c->d_model, V = c->vocab_size;
    memcpy(m->tokens, tokens, N * sizeof *tokens);
    attn_workers w = attn_ctx_workers(m->ctx);
    attn_layer_embedding_forward(m->emb, tokens, pdata(m, m->tok_emb), pdata(m, m->pos_emb),
                                 batch, seq, C);
    if (p > 0.0) dropout_forward(dropout_rng, p, m->emb, m->emb_keep, N * C);
    for (size_t l = 0; l < c->n_layers; l++) {
        block *b = &m->blocks[l];
        attn_layer_layernorm_forward(w, b->ln1, b->ln1_mean, b->ln1_rstd, b->resid_in,
                                     pdata(m, b->ln1_w), pdata(m, b->ln1_b), N, C,
                                     ATTN_LAYERNORM_EPS);
        st = attn_module_forward(b->attn, b->ln1, batch, seq, b->attn_out, dropout_rng);
        if (st != ATTN_OK) {
            if (rng_before) attn_rng_restore(dropout_rng, rng_before);
            attn_rng_free(rng_before);
            return st;
        }
        if (p > 0.0 && c->attention != ATTN_MODULE_GPT2)
            dropout_forward(dropout_rng, p, b->attn_out, b->attn_keep, N * C);
        attn_layer_residual_forward(w, b->resid_mid, b->resid_in, b->attn_out, N * C);
        if (!c->mlp) continue;
        attn_layer_layernorm_forward(w, b->ln2, b->ln2_mean, b->ln2_rstd, b->resid_mid,
                                     pdata(m, b->ln2_w), pdata(m, b->ln2_b), N, C,
                                     ATTN_LAYERNORM_EPS);
        attn_k_linear(m->ctx, b->ln2, pdata(m, b->fc_w), pdata(m, b->fc_b), b->fc, N, C, 4 * C);
        if (m->gpt) {
            if (!attn_k_gelu_tanh(m->ctx, b->fc, b->gelu, N * 4 * C))
                attn_layer_gelu_tanh_forward(w, b->gelu, b->fc, N * 4 * C);
        } else
            attn_layer_gelu_forward(w, b->gelu, b->fc, N * 4 * C);
        attn_k_linear(m->ctx, b->gelu, pdata(m, b->proj_w), pdata(m, b->proj_b), b->mlp_out, N,
                      4 * C, C);
        if (p > 0.0) dropout_forward(dropout_rng, p, b->mlp_out, b->mlp_keep, N * C);
        attn_layer_residual_forward(w, b->resid_out, b->resid_mid, b->mlp_out, N * C);
    }
    const float *x = m->blocks[c->n_layers - 1].resid_out;
    attn_layer_layernorm_forward(w, m->lnf, m->lnf_mean, m->lnf_rstd, x, pdata(m, m->lnf_w),
                                 pdata(m, m->lnf_b), N, C, ATTN_LAYERNORM_EPS);
    attn_k_linear(m->ctx, m->lnf, pdata(m, m->head), NULL, m->logits, N, C, V);
    if (logits) memcpy(logits, m->logits, N * V * sizeof *logits);
    if (targets) {
        size_t scored;
        double mean = attn_layer_crossentropy_forward(w, m->logits, targets, N, V,
                                                      ATTN_IGNORE_INDEX, &scored,
                                                      attn_k_crossentropy_row(m->ctx));
        if (loss) *loss = (float)mean;
        memcpy(m->targets, targets, N * sizeof *targets);
    }
    m->batch = batch;
    m->seq = seq;
    m->dropout_p = p;
    m->backward_ready = targets && m->grad_enabled;
    if (m->backward_ready) keep_versions(m);
    attn_rng_free(rng_before);
    return ATTN_OK;
}

/* ---- backward ------------------------------------------------------------------- */

void attn_model_forget_forward(attn_model *m) { m->backward_ready = false; }

attn_status attn_model_backward(attn_model *m) {
    if (!m) return ATTN_ERR_NULL;
    attn_clear_error(m->ctx);
    if (!m->backward_ready)
        return attn_fail(m->ctx, ATTN_ERR_INVALID,
                         "attn_model_backward: needs a forward with targets and gradients enabled "
                         "first (and after any load of the weights)");
    observe_versions(m);
    for (size_t i = 0; i < m->count; i++) {
        uint64_t now = m->versions[i], then = m->versions[2 * m->count + i];
        if (now != then)
            return attn_fail(m->ctx, ATTN_ERR_INVALID,
                             "attn_model_backward: parameter %s was modified after the forward "
                             "(version %llu at the forward, %llu now): its gradient would mix "
                             "the new weights with the old activations; run the forward again",
                             m->params[i].name, (unsigned long long)then,
                             (unsigned long long)now);
    }
    if (m->llama) return attn_llama3_backward(m->llama);
    const attn_model_config *c = &m->cfg;
    size_t B = m->batch, T = m->seq, N = B * T, C = c->d_model, V = c->vocab_size;
    attn_workers w = attn_ctx_workers(m->ctx);
    double p = m->dropout_p;

    /* loss = cross_entropy(logits, targets): dloss = 1 */
    memset(m->dlogits, 0, N * V * sizeof(float));
    attn_layer_crossentropy_backward(w, m->dlogits, m->logits, m->targets, N, V, ATTN_IGNORE_INDEX,
                                     1.0, attn_k_crossentropy_backward_row(m->ctx));
    /* logits = lnf @ head^T: dtmp = dlogits @ head, dhead += dlogits^T @ lnf */
    attn_k_linear_backward(m->ctx, m->lnf, pdata(m, m->head), m->dlogits, m->dtmp, false,
                           pgrad(m, m->head), NULL, N, C, V);
    /* lnf = LayerNorm(x): dres becomes dL/dx of the last residual */
    memset(m->dres, 0, N * C * sizeof(float));
    attn_layer_layernorm_backward(w, m->dres, pgrad(m, m->lnf_w), pgrad(m, m->lnf_b),
                                  m->dtmp, m->blocks[c->n_layers - 1].resid_out,
                                  pdata(m, m->lnf_w), m->lnf_mean, m->lnf_rstd, N, C);
    for (size_t l = c->n_layers; l-- > 0;) {
        block *b = &m->blocks[l];
        if (c->mlp) {
            /* resid_out = resid_mid + dropout(proj(gelu(fc(ln2(resid_mid))))) */
            const float *dmlp = m->dres;
            if (p > 0.0) {
                dropout_backward(m->dbranch, m->dres, b->mlp_keep, p, N * C);
                dmlp = m->dbranch;
            }
            attn_k_linear_backward(m->ctx, b->gelu, pdata(m, b->proj_w), dmlp, m->d4a, false,
                                   pgrad(m, b->proj_w), pgrad(m, b->proj_b), N, 4 * C, C);
            memset(m->d4b, 0, N * 4 * C * sizeof(float));
            if (m->gpt) {
                if (!attn_k_gelu_tanh_backward(m->ctx, b->fc, m->d4a, m->d4b, N * 4 * C))
                    attn_layer_gelu_tanh_backward(w, m->d4b, b->fc, m->d4a, N * 4 * C);
            } else
                attn_layer_gelu_backward(w, m->d4b, b->fc, m->d4a, N * 4 * C);
            attn_k_linear_backward(m->ctx, b->ln2, pdata(m, b->fc_w), m->d4b, m->dtmp, false,
                                   pgrad(m, b->fc_w), pgrad(m, b->fc_b), N, C, 4 * C);
            attn_layer_layernorm_backward(w, m->dres, pgrad(m, b->ln2_w),
                                          pgrad(m, b->ln2_b), m->dtmp, b->resid_mid,
                                          pdata(m, b->ln2_w), b->ln2_mean, b->ln2_rstd, N, C);
        }
        /* resid_mid = resid_in + shortcut_dropout(attn(ln1(resid_in))) */
        const float *dattn = m->dres;
        if (p > 0.0 && c->attention != ATTN_MODULE_GPT2) {
            dropout_backward(m->dbranch, m->dres, b->attn_keep, p, N * C);
            dattn = m->dbranch;
        }
        attn_status st = attn_module_backward(b->attn, dattn, B, T, m->dtmp);
        if (st != ATTN_OK) return st;
        attn_layer_layernorm_backward(w, m->dres, pgrad(m, b->ln1_w), pgrad(m, b->ln1_b),
                                      m->dtmp, b->resid_in, pdata(m, b->ln1_w), b->ln1_mean,
                                      b->ln1_rstd, N, C);
    }
    /* emb = dropout(tok_emb[tokens] + pos_emb[t]) */
    const float *demb = m->dres;
    if (p > 0.0) {
        dropout_backward(m->dbranch, m->dres, m->emb_keep, p, N * C);
        demb = m->dbranch;
    }
    attn_layer_embedding_backward(w, pgrad(m, m->tok_emb), pgrad(m, m->pos_emb), demb,
                                  m->tokens, B, T, C, V);
    return ATTN_OK;
}
