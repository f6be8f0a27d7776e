/*
 * module.h — what every module shares: the generic attn_module (kind,
 * sizes, training flag, parameters in state_dict order, one allocation for
 * all weights) and the checks and attention core the variants have in
 * common. Each variant file embeds an attn_module as its first member.
 */
#ifndef ATTN_MODULE_H
#define ATTN_MODULE_H

#include "internal.h"
#include "attention/attention.h"
#include "kernels/kernels.h"
#include "rng/dropout.h"

#define ATTN_PARAM_NAME_MAX 64

/* The causal-mask buffers PyTorch's class keeps in its state_dict, each
 * (T, T) for T = attn_module.mask_buffer; module_io.c saves and checks them. */
typedef enum attn_mask_buffers {
    ATTN_BUFFERS_NONE = 0,   /* none */
    ATTN_BUFFERS_MASK,       /* "mask" = triu(ones, diagonal=1) */
    ATTN_BUFFERS_HEAD_MASKS, /* "heads.N.mask", one per head's W_query */
    ATTN_BUFFERS_TRIL_BIAS   /* GPT-2's "bias" (1, 1, T, T) = tril(ones) */
} attn_mask_buffers;

typedef struct attn_module_ops {
    attn_module_kind kind;
    const char *class_name;
    attn_status (*forward)(attn_module *m, const float *x, size_t batch, size_t tokens,
                           float *y, attn_rng *rng);
    /* dy (B, T, d_out) -> dx (B, T, d_in) (may be NULL) and grads +=, for
     * the saved forward; called after attn_module_backward's checks. */
    attn_status (*backward)(attn_module *m, const float *dy, float *dx);
    attn_mask_buffers buffers;
} attn_module_ops;

/* Each variant's ops, defined in its file; the factory (factory.c) names
 * the class of a kind through them. */
extern const attn_module_ops attn_simple_ops, attn_sa_v1_ops, attn_sa_v2_ops, attn_causal_ops,
    attn_mha_wrapper_ops, attn_mha_ops, attn_gpt2_ops, attn_gqa_ops, attn_mla_ops, attn_swa_ops;

typedef struct attn_param_slot {
    char name[ATTN_PARAM_NAME_MAX];
    size_t ndim;
    size_t shape[2];
    size_t numel;
    size_t offset; /* into storage */
} attn_param_slot;

/* What a forward keeps for its backward while gradients are enabled. */
typedef struct attn_saved {
    bool valid; /* the last forward succeeded and kept what follows */
    size_t batch, tokens;
    float *x;    /* (B, T, d_in): a copy of the input */
    float *acts; /* activations, laid out by each module */
    uint8_t *keep_bits; /* dropout masks drawn, one bit per element */
    bool has_mask;      /* the saved forward drew dropout (keep_bits is its) */
    float kept_scale;   /* 1/(1-p) as the forward's dropout applied it */
    /* Philox dropout: the key and the offset of the forward's first dropout
     * call (later calls of the same forward take the next offsets) */
    bool philox;
    uint64_t philox_seed, philox_offset, keep_threshold;
    bool drop_all; /* the forward's dropout had p = 1: every weight dropped, nothing drawn */
    size_t x_cap, acts_cap, bits_cap; /* floats, floats, bytes allocated */
} attn_saved;

/* A module's identity: a small block held by the module and by every
 * group that keeps one of its forwards, freed when the last lets go. A
 * group knows the module whose forward it keeps by address and identity;
 * while the group holds the identity no other lies at its address, so a
 * module allocated where a freed one lay (with another identity, or none)
 * never claims the freed one's forward, in any group. */
typedef struct attn_module_identity {
    _Atomic size_t holders;
} attn_module_identity;

/* m's identity, made on the first ask (NULL: out of memory). */
attn_module_identity *attn_module_identity_of(attn_module *m);
/* One more holder of id; and one fewer (id NULL: nothing), the last freeing it. */
void attn_module_identity_hold(attn_module_identity *id);
void attn_module_identity_release(attn_module_identity *id);

struct attn_module {
    const attn_module_ops *ops;
    attn_ctx *ctx;
    size_t d_in, d_out;
    /* The side of the causal-mask buffer PyTorch keeps in this module's
     * state_dict ("mask", "heads.N.mask" or GPT-2's "bias"); 0: none.
     * safetensors files carry it as torch's state_dict does. */
    size_t mask_buffer;
    bool training;
    bool grad_enabled;
    size_t num_params, capacity;
    attn_param_slot *params;
    size_t num_scalars;
    float *storage; /* every parameter in state_dict order, then every gradient */
    attn_saved saved;
    /* Per parameter, num_params each (NULL before attn_module_alloc): its
     * version, the count of changes to its data the module has seen
     * (PyTorch's _version); the fingerprint of the data at that version;
     * and the version the saved forward read. A backward whose parameters
     * moved on since its forward is refused, as PyTorch refuses it. */
    uint64_t *versions;
    bool versions_seen; /* the fingerprints have been taken once */
    void *work;        /* the attention workspace of the pass under way */
    size_t work_bytes; /* allocated */
    /* The module's identity to the context-parallel groups (mpi/modules.c),
     * made at its first forward with gradients; NULL: none yet. */
    attn_module_identity *cp_id;
};

/* Sets up the base; free it with attn_module_release. */
void attn_module_init(attn_module *m, const attn_module_ops *ops, attn_ctx *ctx, size_t d_in,
                      size_t d_out);
/* Makes room for count parameter tensors up front. */
attn_status attn_module_reserve(attn_module *m, size_t count);
/* Declares a parameter; shape[1] is ignored for ndim 1. Call before
 * attn_module_alloc. The name is printf-formatted. */
#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
attn_status attn_module_declare(attn_module *m, size_t ndim, const size_t shape[2],
                                const char *name_fmt, ...);
/* Allocates storage for every declared parameter (zeroed). */
attn_status attn_module_alloc(attn_module *m);
/* The data of parameter i, and its gradient. */
float *attn_module_data(attn_module *m, size_t index);
float *attn_module_grad(attn_module *m, size_t index);
/* The bias that follows weight index when there is one (bias), else NULL;
 * and its gradient. */
static inline const float *attn_module_bias(attn_module *m, size_t weight_index, bool bias) {
    return bias ? attn_module_data(m, weight_index + 1) : NULL;
}
static inline float *attn_module_bias_grad(attn_module *m, size_t weight_index, bool bias) {
    return bias ? attn_module_grad(m, weight_index + 1) : NULL;
}
/* Refuses (ATTN_ERR_INVALID, "<who>: parameter <name> was modified after
 * the forward (version <v> at the forward, <w> now) ...") when a parameter
 * the saved forward read has changed since; brings the versions up to date. */
attn_status attn_module_check_versions(attn_module *m, const char *who);
/* The same for a forward kept elsewhere (the MPI layer's): its versions,
 * num_params of them, taken from attn_module_versions at that forward,
 * which brings the versions up to date and gives them. */
attn_status attn_module_check_versions_at(attn_module *m, const char *who,
                                          const uint64_t *at_forward);
const uint64_t *attn_module_versions(attn_module *m);
/* Frees what the base owns (not the module struct itself). */
void attn_module_release(attn_module *m);

/* Declares an nn.Linear prefix.weight (out, in) and optional prefix.bias. */
attn_status attn_module_declare_linear(attn_module *m, const char *prefix, size_t in, size_t out,
                                       bool bias);
/* nn.Linear init of the linear whose weight is parameter *index (bias, if
 * any, follows it); *index moves past it. */
attn_status attn_module_init_linear(attn_module *m, attn_rng *rng, size_t *index, bool bias,
                                    size_t in, size_t out);

static inline size_t attn_max_size(size_t a, size_t b) { return a > b ? a : b; }

/* MultiHeadLatentAttention's latent width: latent_dim, or where it is 0
 * (the book's None) the module's default, max(16, d_out // 8). */
static inline size_t attn_mla_latent_width(size_t d_out, size_t latent_dim) {
    return latent_dim ? latent_dim : attn_max_size(16, d_out / 8);
}

/* Config checks shared by the variants; each names the offending values. */
attn_status attn_check_width(attn_ctx *ctx, const char *module, const char *name, size_t value);
attn_status attn_check_dropout(attn_ctx *ctx, const char *module, double p);
attn_status attn_check_scale(attn_ctx *ctx, const char *module, double scale);
attn_status attn_check_mask(attn_ctx *ctx, const char *module, attn_mask_method mask);
attn_status attn_check_heads(attn_ctx *ctx, const char *module, size_t d_out, size_t num_heads);
/* The checks of CausalAttention's config, shared by the wrapper. */
attn_status attn_check_causal_config(attn_ctx *ctx, const char *name, size_t d_in, size_t d_out,
                                     size_t context_length, double dropout, double scale,
                                     attn_mask_method mask);
/* The score scale: cfg_scale rounded to float (checked by attn_check_scale),
 * or 1/sqrt(head_dim) when it is 0. */
float attn_default_scale(double cfg_scale, size_t head_dim);

/* Forward-call checks: NULLs, batch and tokens >= 1, tokens <= context
 * (context 0: unlimited), sizes that fit size_t for widths up to max_width,
 * and an rng when dropout will draw. */
attn_status attn_check_forward(attn_module *m, const float *x, size_t batch, size_t tokens,
                               const float *y, size_t context_length, size_t max_width,
                               bool needs_rng, const attn_rng *rng);
/* ATTN_ERR_INVALID naming both spans where the call's output over rows
 * rows overlaps its input, or the module's own storage: forward, in x (rows
 * of d_in) and out y (d_out), over the parameters or their gradients;
 * backward, in dy (d_out) and out dx (d_in, may be NULL), dy or dx over the
 * gradients the backward writes, dx over the parameters. The names are the
 * caller's for its arguments. */
attn_status attn_module_check_spans(const attn_module *m, const char *who, bool backward,
                                    const char *in_name, const float *in, const char *out_name,
                                    const float *out, size_t rows);

/* Scratch for one forward or backward: n floats (zeroed), freed with attn_free(). */
float *attn_scratch(attn_module *m, size_t n, attn_status *status);

/*
 * Failure leaves no trace: every forward and backward allocates all it
 * needs (activations, scratch, the attention workspace) before it writes
 * anything its caller sees (y, dx, the gradients) or draws from the rng,
 * so a pass that fails (ATTN_ERR_NO_MEMORY) leaves them as they were.
 * tests/unit/test_alloc_failure.c fails each allocation in turn to hold
 * every pass to this.
 *
 * A forward's activations. attn_forward_prepare forgets the last saved
 * forward and gives acts (n_acts floats) and, when dropout draws, keep_bits
 * (n_bits bits, zeroed): the module's saved buffers when gradients are
 * enabled (with room for the copy of x (B, T, d_in) that attn_forward_keep
 * makes), else scratch acts and no bits. attn_forward_keep, after a
 * successful forward, copies x and marks the forward saved;
 * attn_forward_release frees acts unless they are the saved ones, and the
 * attention workspace.
 */
attn_status attn_forward_prepare(attn_module *m, size_t batch, size_t tokens, size_t n_acts,
                                 size_t n_bits, float **acts, uint8_t **keep_bits);
attn_status attn_forward_keep(attn_module *m, const float *x, size_t batch, size_t tokens,
                              float kept_scale);
void attn_forward_release(attn_module *m, float *acts);

/* The saved forward's dropout mask, or NULL when it drew none. */
static inline const uint8_t *attn_saved_mask(const attn_saved *s) {
    return s->has_mask ? s->keep_bits : NULL;
}

/* The heads of (B, T, width) projection buffers as an attention problem:
 * q and out hold q_heads heads of head_dim, k and v kv_heads (element
 * (b, t, h, d) at b*T*width + t*width + h*head_dim + d); self-attention
 * (S = T), causal by mask unless that is ATTN_MASK_NONE. Callers add the
 * modifiers they use (window, ...). */
attn_attention_problem attn_heads_problem(size_t batch, size_t tokens, size_t q_heads,
                                          size_t kv_heads, size_t head_dim, const float *q,
                                          const float *k, const float *v, float *out,
                                          float *lse, float scale, bool causal,
                                          attn_mask_method mask);

/* Allocates, before a pass touches its outputs, the workspace its
 * attention call (the largest, when it makes several alike) needs: for the
 * forward (backward false) over p, whose dropout draws from dropout_rng
 * (NULL: none), or for the backward. Kept until attn_attention_release; the
 * attn_run_attention calls of the pass then allocate nothing. */
attn_status attn_attention_reserve(attn_module *m, const attn_attention_problem *p,
                                   bool backward, const attn_rng *dropout_rng);
void attn_attention_release(attn_module *m);

/* Runs the attention backward of the forward over p (its out and lse set):
 * g's dout in, dq, dk, dv (and dsinks) out. The dropout of the saved
 * forward's call number `call` (0: its first dropout call) comes from
 * keep_bits when non-NULL, else from its Philox key. */
attn_status attn_run_attention_backward(attn_module *m, const attn_attention_problem *p,
                                        const attn_attention_grads *g, size_t call,
                                        const uint8_t *keep_bits);

/* Runs the attention forward over p (attention/attention.h's runner), with
 * the ctx's trace. dropout is NULL when no dropout applies; keep_bits
 * (zeroed, (B, Hq, T, S) bits) receives a serial stream's mask when the
 * backward needs it, else NULL. */
attn_status attn_run_attention(attn_module *m, const attn_attention_problem *p,
                               attn_dropout_stream *dropout, uint8_t *keep_bits);
/* Whether a forward with dropout drawn from rng must keep its attention
 * mask as bits for the backward: not when the fused kernels draw Philox,
 * which the backward draws again. */
bool attn_keeps_attention_mask(const attn_module *m, const attn_rng *rng);

/* The three projections of x (rows, d_in) into q, k, v, each (rows, d_out):
 * x @ W for SelfAttention_v1 weights (d_in, d_out) when linear is false,
 * nn.Linear (weight (d_out, d_in), optional bias) when true. Traced as
 * "queries", "keys", "values" with shape (B, T, d_out). */
typedef struct attn_qkv_weights {
    const float *wq, *bq, *wk, *bk, *wv, *bv;
    bool linear;
} attn_qkv_weights;
/* The gradients of those weights, pointer for pointer. */
typedef struct attn_qkv_grads {
    float *wq, *bq, *wk, *bk, *wv, *bv;
} attn_qkv_grads;
void attn_project_qkv(attn_module *m, const attn_qkv_weights *w, const float *x, size_t batch,
                      size_t tokens, size_t d_out, float *q, float *k, float *v);
/* Its backward: dx (rows, d_in) += dq W_q + dk W_k + dv W_v (the transposes
 * for SelfAttention_v1 weights), and each weight's (and bias's) gradient +=.
 * The gradient pointers mirror w's. */
void attn_project_qkv_backward(attn_module *m, const attn_qkv_weights *w,
                               const attn_qkv_grads *grad, const float *x, size_t rows,
                               size_t d_out, const float *dq, const float *dk, const float *dv,
                               float *dx);

/* Traces a (B, T, C) tensor. */
void attn_trace_btc(attn_module *m, const char *name, size_t batch, size_t tokens, size_t width,
                    const float *data);

/* Declares the nn.Linear projections <prefix>W_query, W_key, W_value
 * (d_in -> d_out, bias if asked), in the seeds' registration order. */
attn_status attn_qkv_declare(attn_module *m, const char *prefix, size_t d_in, size_t d_out,
                             bool bias);
/* Initialises them as PyTorch's constructor does; *index is that of
 * W_query.weight, and moves past the last. */
attn_status attn_qkv_init(attn_module *m, size_t *index, size_t d_in, size_t d_out, bool bias,
                          attn_rng *rng);
/* Declares, allocates and initialises W_query, W_key, W_value as a
 * module's only parameters (SelfAttention_v2, CausalAttention). */
attn_status attn_qkv_build(attn_module *m, size_t d_in, size_t d_out, bool bias, attn_rng *rng);
/* Pointers to them, and to their gradients. */
attn_qkv_weights attn_qkv_linear_weights(attn_module *m, size_t first, bool bias);
attn_qkv_grads attn_qkv_linear_grads(attn_module *m, size_t first, bool bias);

/* One head over projected q, k, v — the forward of SelfAttention_v1/v2 and
 * CausalAttention, and of each MultiHeadAttentionWrapper head:
 *   acts (attn_single_head_acts floats) receive q, k, v, the output and
 *   each row's log-sum-exp, kept for the backward;
 *   y (B, T, d_out) at row stride y_stride = dropout(softmax(mask(q k^T
 *   * scale))) v. dropout_p > 0 with rng draws one dropout call, its mask
 *   set in keep_bits (B, T, T) when that is non-NULL. */
typedef struct attn_head_spec {
    size_t d_out;
    float scale;
    bool causal;
    attn_mask_method mask;
    double dropout_p; /* 0 unless training */
} attn_head_spec;
size_t attn_single_head_acts(size_t batch, size_t tokens, size_t d_out);
attn_status attn_single_head_forward(attn_module *m, const attn_qkv_weights *w,
                                     const attn_head_spec *spec, const float *x, size_t batch,
                                     size_t tokens, float *acts, uint8_t *keep_bits, float *y,
                                     size_t y_stride, attn_rng *rng);
/* Reserves the attention workspace of one such head's forward or backward
 * (attn_attention_reserve), for passes that run several alike. */
attn_status attn_single_head_reserve(attn_module *m, const attn_head_spec *spec, size_t batch,
                                     size_t tokens, bool backward, const attn_rng *dropout_rng);
/* Its backward from dy (B, T, d_out) at row stride dy_stride, given the
 * forward's x, acts and dropout (keep_bits, or else the saved forward's
 * Philox call number `call`): dx (B, T, d_in) += and the projections'
 * gradients (pointers in grad) +=. scratch holds 4 (B, T, d_out) floats,
 * and the workspace is reserved (attn_single_head_reserve): this writes
 * from its first step on. */
attn_status attn_single_head_backward(attn_module *m, const attn_qkv_weights *w,
                                      const attn_qkv_grads *grad, const attn_head_spec *spec,
                                      const float *x, size_t batch, size_t tokens, float *acts,
                                      const uint8_t *keep_bits, size_t call, const float *dy,
                                      size_t dy_stride, float *scratch, float *dx);
/* The whole backward of a module that is one such head over its saved
 * forward (SelfAttention_v1/v2, CausalAttention): allocates, then sets dx
 * (B, T, d_in) and adds the projections' gradients. */
attn_status attn_one_head_backward(attn_module *m, const attn_qkv_weights *w,
                                   const attn_qkv_grads *grad, const attn_head_spec *spec,
                                   const float *dy, float *dx);

/*
 * Projected multi-head attention (heads.c) — the path MultiHeadAttention
 * (mha.c), MultiHeadAttentionWithSWA (swa.c), GroupedQueryAttention (gqa.c)
 * and MultiHeadLatentAttention (mla.c) share:
 *   q (B, T, d_out), k, v (B, T, kv_width) = the projections of x
 *     viewed as (B, Hq, T, hd) and (B, Hkv, T, hd), kv_width = Hkv * hd
 *   context (B, T, d_out) = dropout(softmax(mask(q k^T * scale))) v, per
 *     head (attn_run_attention; query head h reads KV head h / (Hq / Hkv))
 *   y (B, T, d_out) = context @ W_out^T (+ b_out)
 * The backward walks these steps in reverse from the activations the
 * forward kept: q, k, v, context, each row's log-sum-exp and the dropout.
 */
typedef struct attn_heads_acts {
    float *q, *k, *v, *context; /* (rows, d_out), (rows, kv_width) x 2, (rows, d_out) */
    float *lse, *lse_lo;        /* (rows, Hq) each: lse and its rounding error */
    float *row_stats;           /* (rows, Hq, 2): the forward's row statistics */
    float *extra;               /* (rows, spec.extra): the projection's own (MLA's latent) */
} attn_heads_acts;

typedef struct attn_heads_spec {
    size_t q_heads, kv_heads, head_dim; /* q_heads * head_dim = d_out */
    float scale;
    attn_mask_method mask;      /* causal by this method */
    size_t window;              /* query i sees keys i - W + 1 .. i; 0: no window */
    size_t context_length;      /* the longest sequence a forward takes; 0: unlimited */
    size_t check_width;         /* the row width attn_check_forward bounds */
    double dropout;             /* on the attention weights, in training mode */
    /* weight indices in state_dict order (each bias, if any, follows) */
    bool qkv_bias;
    size_t query_index, key_index, value_index;
    size_t out_index;
    bool out_bias;
    /* A K/V path of the module's own (MLA): extra floats per row kept with
     * the activations (and as many of scratch for their gradient in the
     * backward), and the projection and its backward; NULL: the nn.Linear
     * W_query, W_key, W_value of x, traced as queries, keys, values. */
    size_t extra;
    void (*project)(attn_module *m, const float *x, size_t batch, size_t tokens,
                    const attn_heads_acts *a);
    /* dq, dk, dv (and dextra, scratch) in: dx (rows, d_in) set when non-NULL
     * (not added to) and the projections' gradients +=. */
    void (*project_backward)(attn_module *m, const float *x, size_t rows,
                             const attn_heads_acts *a, const float *dq, const float *dk,
                             const float *dv, float *dextra, float *dx);
} attn_heads_spec;

/* A module on this path: the variant's struct embeds it first. */
typedef struct attn_heads_module {
    attn_module base;
    attn_heads_spec spec;
} attn_heads_module;

/* Allocates a variant's struct (bytes, zeroed), its base set up; NULL
 * (ATTN_ERR_NO_MEMORY, "<fn>: out of memory") on failure. */
attn_heads_module *attn_heads_alloc(attn_ctx *ctx, const attn_module_ops *ops, size_t bytes,
                                    size_t d_in, size_t d_out, const char *fn);
/* The config checks of the chapter-4 modules: d_in, d_out, num_heads,
 * dropout, scale, in that order. */
attn_status attn_check_heads_config(attn_ctx *ctx, const char *name, size_t d_in, size_t d_out,
                                    size_t num_heads, double dropout, double scale);
/* MultiHeadAttention's parameters — W_query, W_key, W_value (bias if
 * qkv_bias), out_proj (with bias) — declared, allocated and initialised in
 * its order; sets the spec's indices and biases. On failure it frees the
 * module (attn_module_free). */
attn_status attn_heads_build_mha(attn_heads_module *h, size_t d_in, size_t d_out, bool qkv_bias,
                                 attn_rng *init_rng);
/* The module ops' forward and backward of an attn_heads_module. */
attn_status attn_heads_forward(attn_module *m, const float *x, size_t batch, size_t tokens,
                               float *y, attn_rng *rng);
attn_status attn_heads_backward(attn_module *m, const float *dy, float *dx);

/* The scratch budget (floats) that sizes the GPT-2 backward's head groups
 * (default 32 Mi, 128 MiB): a smaller one gives smaller groups, down to one
 * head. Internal: the tests set it to take the grouped path on small
 * shapes. */
void attn_gpt2_set_backward_scratch(attn_gpt2 *m, size_t floats);

/* The attention of a MultiHeadAttention or GPT-2 CausalSelfAttention, for
 * the MPI layer (src/mpi), which runs it across ranks around the module's
 * own weights: false (out untouched) for the other kinds. */
typedef struct attn_module_attention {
    size_t heads, head_dim;
    float scale;
    bool causal;   /* MultiHeadAttention with ATTN_MASK_NONE: false */
    double dropout; /* the config's probability */
    bool qkv_bias;  /* MultiHeadAttention's W_query/W_key/W_value biases */
} attn_module_attention;
bool attn_mha_attention(const attn_module *m, attn_module_attention *out);
bool attn_gpt2_attention(const attn_module *m, attn_module_attention *out);

#endif /* ATTN_MODULE_H */
