/*
 * lm_internal.h — what lm.c (the model and its forward) and lm_load.c (files
 * and configs) share: the model's layout.
 *
 * Weights live in two blocks, float32 and (with a 16-bit weights_dtype)
 * bf16/f16 for the linear layers and the token embedding, each tensor in
 * nn.Linear layout (out, in) and listed in the book's state_dict order
 * (attn_lm_param_at; attn_lm_stored says where each lives):
 *   gpt2:   tok_emb, pos_emb, per block att.W_query (+bias), W_key, W_value,
 *           out_proj (+bias), ff.layers.0 (+bias), ff.layers.2 (+bias),
 *           norm1.scale/.shift, norm2.scale/.shift; final_norm.scale/.shift,
 *           out_head
 *   gpt-gqa: as gpt2, but per block att.W_key (+bias), W_value (+bias),
 *           W_query (+bias), out_proj (no bias), then as gpt2
 *   gpt-mla: as gpt2, but per block att.W_query (+bias), W_DKV (+bias),
 *           W_UK (+bias), W_UV (+bias), out_proj (+bias), then as gpt2
 *   llama3: tok_emb, per block att.W_key, W_value, W_query, out_proj, ff.fc1,
 *           fc2, fc3, norm1.weight, norm2.weight; final_norm.weight, out_head
 * (GroupedQueryAttention registers W_key and W_value before W_query.) With
 * tied embeddings out_head.weight is listed but is tok_emb's storage.
 */
#ifndef ATTN_LM_INTERNAL_H
#define ATTN_LM_INTERNAL_H

#include "internal.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One transformer block's tensors (NULL where the architecture has none).
 * The linear layers' weights (void *) are in the model's weights dtype
 * (float, or bf16/f16 bits: attn_lm_config's weights_dtype); norms and
 * biases are float. */
typedef struct attn_lm_block {
    void *wq, *wk, *wv;                 /* (C, C) / (kv_width, C)                */
    float *bq, *bk, *bv;                /* gpt2 with qkv_bias: (out)             */
    void *wdkv, *wuk, *wuv;             /* gpt-mla: (L, C), (C, L), (C, L)       */
    float *bdkv, *buk, *buv;            /* gpt-mla with qkv_bias: (out)          */
    void *wo;                           /* out_proj (C, C)                       */
    float *bo;                          /* gpt2, gpt-mla: (C)                    */
    float *norm1_w, *norm1_b;           /* (C): LayerNorm scale/shift, RMSNorm weight */
    float *norm2_w, *norm2_b;
    void *fc1_w;                        /* gpt2 layers.0 (4C, C); llama fc1 (H, C) */
    float *fc1_b;
    void *fc2_w;                        /* gpt2 layers.2 (C, 4C); llama fc2 (H, C) */
    float *fc2_b;
    void *fc3_w;                        /* llama fc3 (C, H)                      */
} attn_lm_block;

/* Activations of one forward, grown to the largest call seen (so decoding
 * allocates nothing per token). */
typedef struct attn_lm_buffers {
    float *floats;
    size_t capacity;      /* floats */
    void *attention;      /* the no-cache attention's workspace */
    size_t attention_bytes;
    int32_t *cu_seqlens;  /* (batch + 1) */
    size_t *starts;       /* (batch) first position of each sequence */
    size_t batch_capacity;
    float *panel;         /* 16-bit weights: widened panels (linear16.h) */
    uint16_t *rounded;    /* bf16 products: the activations rounded to bf16 */
    size_t rounded_capacity; /* elements */
} attn_lm_buffers;

/* Where a tensor lives: data in dtype (float, or bf16/f16 bits). */
typedef struct attn_lm_stored {
    void *data;
    attn_dtype dtype;
} attn_lm_stored;

struct attn_lm {
    attn_ctx *ctx;
    attn_lm_config cfg;                 /* defaults filled in (attn_lm_config_resolve) */
    size_t head_dim, kv_heads, hidden;  /* hidden: the FeedForward width        */
    size_t latent;                      /* gpt-mla: latent_dim; else 0           */
    size_t *windows;                    /* per layer: its window W, or 0         */
    float *weights;                     /* the float tensors but a tied out_head */
    size_t num_weights;                 /* floats */
    uint16_t *weights16;                /* the 16-bit ones (cfg.weights_dtype)   */
    size_t num_weights16;               /* elements */
    attn_param *params;                 /* data NULL for a 16-bit tensor         */
    attn_lm_stored *stored;             /* each param's storage                  */
    size_t num_params;
    char *names;                        /* the params' names, NUL-separated      */
    attn_lm_block *blocks;
    void *tok_emb;                      /* (V, C), in the weights dtype          */
    float *pos_emb;                     /* gpt2 (context_length, C)              */
    float *final_w, *final_b;
    void *out_head;                     /* (V, C), in the weights dtype          */
    float *inv_freq;                    /* llama3 (head_dim / 2): RoPE frequencies */
    attn_dtype matmul_dtype;            /* the products' activations: F32 or BF16 */
    attn_lm_buffers buf;
};

/* Whether arch is one of the book's GPT models (pos_emb, LayerNorm, GELU):
 * GPT-2's, or the one with GroupedQueryAttention or latent attention. */
static inline bool attn_lm_is_gpt(attn_lm_arch arch) {
    return arch == ATTN_LM_GPT2 || arch == ATTN_LM_GPT_GQA || arch == ATTN_LM_GPT_MLA;
}

/* The window of layer i of c (resolved): sliding_window_size where the
 * stride gives layer i one, else 0. */
static inline size_t attn_lm_layer_window(const attn_lm_config *c, size_t i) {
    size_t K = c->sliding_window_stride, W = c->sliding_window_size;
    if (K == 0 || K == SIZE_MAX) return W; /* SIZE_MAX: K + 1 wraps, and i < K anyway */
    return i % (K + 1) < K ? W : 0;
}

/* arch as the CLI and messages name it. */
static inline const char *attn_lm_arch_name(attn_lm_arch arch) {
    return arch == ATTN_LM_GPT2      ? "gpt2"
           : arch == ATTN_LM_GPT_GQA ? "gpt-gqa"
           : arch == ATTN_LM_GPT_MLA ? "gpt-mla"
           : arch == ATTN_LM_LLAMA3  ? "llama3"
                                     : "unknown";
}

/* What a message calls each of attn_lm_config's fields: their own names
 * (attn_lm_config_fields, also the book's cfg keys), or the keys of the
 * config file they were read from (hidden_size, n_embd, ...), so that a
 * refused value is named as the file writes it. rope_scaling names the
 * object holding the RoPE scaling's factors. */
typedef struct attn_lm_config_keys {
    const char *vocab_size, *context_length, *emb_dim, *n_heads, *n_layers, *hidden_dim,
        *n_kv_groups, *qkv_bias, *rope_base, *rope_scaling, *rope_original_context_length,
        *norm_eps;
} attn_lm_config_keys;
extern const attn_lm_config_keys attn_lm_config_fields;

/* cfg with its zero fields given their defaults (norm_eps: +0.0 only;
 * -0.0 is an epsilon of 0), checked: a message names the wrong values by
 * keys (NULL: attn_lm_config_fields) (ATTN_ERR_INVALID, ATTN_ERR_SHAPE,
 * ATTN_ERR_OVERFLOW). */
attn_status attn_lm_config_resolve(attn_ctx *ctx, const char *who, const attn_lm_config *cfg,
                                   const attn_lm_config_keys *keys, attn_lm_config *out);

/* Called with each tensor name of a model, in state_dict order, with the
 * shape the model needs, (rows, cols) or (rows) where cols is 0; tied says
 * the tensor is another's storage (out_head tied to tok_emb). Returning
 * false stops the listing. */
typedef bool (*attn_lm_name_fn)(void *user, const char *name, bool tied, size_t rows,
                                size_t cols);

/* The tensor names of a model of cfg (resolved), as attn_lm_param_at lists
 * them, without allocating: the listing stops when visit says so, so a
 * caller checking them against a file stops at the first one missing. */
void attn_lm_list_names(const attn_lm_config *cfg, attn_lm_name_fn visit, void *user);

/* st of a call on cache, with the cache's message copied into ctx when the
 * cache was made on another ctx (where the caller of a model's function,
 * reading the model's ctx, would find none). */
attn_status attn_lm_cache_status(attn_ctx *ctx, const attn_kv_cache *cache, attn_status st);

/* ATTN_ERR_SHAPE, named for who, where cache does not fit m (its layers,
 * kv_heads, head_dim, and values_are_keys on a model whose values are not
 * its keys) and a call of batch sequences; it reads the cache
 * alone, so a caller checks it before it changes the cache. */
attn_status attn_lm_check_cache(attn_lm *m, const char *who, const attn_kv_cache *cache,
                                size_t batch);

/* A model of cfg with all weights zero (lm.c; used by attn_lm_new and the
 * loader). */
attn_status attn_lm_create(attn_ctx *ctx, const char *who, const attn_lm_config *cfg,
                           attn_lm **out);

#endif /* ATTN_LM_INTERNAL_H */
