/*
 * lm_load.c — the book's GPT-2 and Llama 3 from files: safetensors with the
 * book's state_dict names or Hugging Face's, the config from config.json
 * (Hugging Face's keys or the book's cfg dict) or from the tensors' shapes;
 * and saving under the book's names.
 *
 * Hugging Face's names, mapped onto the book's (attn.h lists them):
 *   GPT2LMHeadModel ([transformer.] prefix or none), Conv1D weights stored
 *   (in, out), the transpose of nn.Linear's:
 *     wte, wpe                   -> tok_emb, pos_emb
 *     h.N.ln_1 / ln_2 weight,bias -> norm1 / norm2 scale,shift
 *     h.N.attn.c_attn (C, 3C)    -> W_query | W_key | W_value (column thirds)
 *     h.N.attn.c_proj (C, C)     -> out_proj
 *     h.N.mlp.c_fc (C, 4C)       -> ff.layers.0;  h.N.mlp.c_proj -> ff.layers.2
 *     ln_f                       -> final_norm;   lm_head (or wte: tied) -> out_head
 *   LlamaForCausalLM, nn.Linear layout:
 *     model.embed_tokens -> tok_emb; model.layers.N.self_attn.q_proj/k_proj/
 *     v_proj/o_proj -> W_query/W_key/W_value/out_proj; mlp.gate_proj/up_proj/
 *     down_proj -> fc1/fc2/fc3; input_layernorm/post_attention_layernorm ->
 *     norm1/norm2; model.norm -> final_norm; lm_head (or tied) -> out_head
 */
#include "lm/lm_internal.h"

#include "half.h"
#include "io/json.h"
#include "io/safetensors_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef enum lm_names { NAMES_BOOK, NAMES_HF_GPT2, NAMES_HF_LLAMA } lm_names;

/* Where the tensors are and how they are named. */
typedef struct lm_source {
    attn_ctx *ctx;
    attn_safetensors *st;
    const char *path;
    lm_names names;
    const char *prefix; /* HF GPT-2: "" or "transformer." */
    float *scratch;     /* a tensor read as float: a Conv1D one, transposed from, or */
    size_t scratch_floats; /* one bound for 16-bit storage                          */
    float *row;         /* one transposed row of a Conv1D tensor, for 16-bit storage */
    size_t row_floats;
} lm_source;

/* ---- finding tensors -------------------------------------------------------- */

static bool has(lm_source *s, const char *name) {
    attn_safetensors_info info;
    return attn_safetensors_find(s->st, name, &info) == ATTN_OK;
}

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static char *name_of(char *buf, size_t size, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, size, fmt, ap);
    va_end(ap);
    return buf;
}

/* The tensor name (info) has shape (rows, cols) (cols 0: a vector of
 * rows), else a refusal naming both. */
/* Where the tensor called name lies, for a message: the file, or in a
 * sharded checkpoint the shard with the index it was found through. */
static const char *file_of(lm_source *s, const char *name, char *buf, size_t cap) {
    size_t index = attn_safetensors_index(s->st, name);
    const char *file = attn_safetensors_file_of(s->st, index);
    if (file == attn_safetensors_label(s->st)) return s->path;
    snprintf(buf, cap, "%s (a shard of %s)", file, s->path);
    return buf;
}

static attn_status check_shape(lm_source *s, const char *name, const attn_safetensors_info *info,
                               size_t rows, size_t cols) {
    bool ok = cols ? info->ndim == 2 && info->shape[0] == rows && info->shape[1] == cols
                   : info->ndim == 1 && info->shape[0] == rows;
    if (ok) return ATTN_OK;
    char got[96] = "(";
    for (size_t d = 0; d < info->ndim && d < 4; d++)
        snprintf(got + strlen(got), sizeof got - strlen(got), d ? ", %zu" : "%zu",
                 info->shape[d]);
    snprintf(got + strlen(got), sizeof got - strlen(got), info->ndim > 4 ? ", ...)" : ")");
    char where[ATTN_ERROR_CAPACITY];
    const char *file = file_of(s, name, where, sizeof where);
    if (cols)
        return attn_fail(s->ctx, ATTN_ERR_SHAPE,
                         "attn_lm_load: %s: tensor '%s' is %s, the config needs (%zu, %zu)",
                         file, name, got, rows, cols);
    return attn_fail(s->ctx, ATTN_ERR_SHAPE,
                     "attn_lm_load: %s: tensor '%s' is %s, the config needs (%zu)", file, name,
                     got, rows);
}

/* The tensor called name, which must have shape (rows, cols) (cols 0: a
 * vector of rows). */
static attn_status find_shaped(lm_source *s, const char *name, size_t rows, size_t cols,
                               attn_safetensors_info *info) {
    if (attn_safetensors_find(s->st, name, info) != ATTN_OK)
        return attn_fail(s->ctx, ATTN_ERR_NOT_FOUND, "attn_lm_load: %s has no tensor '%s'",
                         s->path, name);
    return check_shape(s, name, info, rows, cols);
}

/* *buf holds at least n floats (grown, its contents lost). */
static attn_status grow_buffer(lm_source *s, const char *name, float **buf, size_t *capacity,
                               size_t n) {
    if (n <= *capacity) return ATTN_OK;
    float *grown = attn_alloc_floats(n);
    if (!grown)
        return attn_fail(s->ctx, ATTN_ERR_NO_MEMORY, "attn_lm_load: out of memory for tensor '%s'",
                         name);
    attn_free(*buf);
    *buf = grown;
    *capacity = n;
    return ATTN_OK;
}

static bool is_half(attn_dtype d) { return d == ATTN_DTYPE_BF16 || d == ATTN_DTYPE_F16; }

/* arch as the messages name the model. */
static const char *model_label(attn_lm_arch arch) {
    return arch == ATTN_LM_GPT2      ? "GPT-2"
           : arch == ATTN_LM_GPT_GQA ? "GPT (GroupedQueryAttention)"
           : arch == ATTN_LM_GPT_MLA ? "GPT (MultiHeadLatentAttention)"
                                     : "Llama 3";
}

/* The refusal of x, element at of the tensor name (the file's dtype from),
 * which the 16-bit dtype to cannot hold: exactly (exact), or within its
 * range. */
static attn_status refuse_element(lm_source *s, const char *name, attn_dtype from,
                                  attn_dtype to, bool exact, float x, size_t at) {
    /* what holds it: the file's own 16-bit dtype, or for a float32 file past
     * f16's range bf16's wider one; float32 always */
    const char *holds = from == ATTN_DTYPE_BF16                       ? "bf16 or f32"
                        : from == ATTN_DTYPE_F16                      ? "f16 or f32"
                        : to == ATTN_DTYPE_F16 && fabsf(x) <= 3.38e38f ? "bf16 or f32"
                                                                      : "f32";
    char where[ATTN_ERROR_CAPACITY];
    return attn_fail(s->ctx, ATTN_ERR_INVALID,
                     "attn_lm_load: %s: tensor '%s' (%s) holds %.9g at element %zu, "
                     "which %s cannot hold %s: load it as %s",
                     file_of(s, name, where, sizeof where), name, attn_dtype_name(from),
                     (double)x, at,
                     to == ATTN_DTYPE_BF16 ? "bf16" : "f16",
                     exact ? "exactly" : "(past its range)", holds);
}

/* Whether narrowing x gave h = infinity from a finite x: past the 16-bit
 * dtype's range (a NaN stays a NaN, an infinity an infinity). */
static inline bool past_range(float x, uint16_t h, uint16_t inf) {
    return ((h & 0x7FFFu) == inf) & ((attn_bits_of_float(x) & 0x7F800000u) != 0x7F800000u);
}

/* dst's elements [at, at + n) = src (float) in dst's dtype. from is the
 * file's dtype of the tensor: from one 16-bit type into the other every
 * value must be held exactly; from float a finite value must not pass the
 * 16-bit range (attn_lm_load_as). From float, one loop per dtype that the
 * compiler vectorises, with the range check as a flag; the element at
 * fault is looked for only when it is set, and named by its place in the
 * file's tensor: src[i] is its element file_at + i file_step. */
static attn_status store(lm_source *s, const char *name, attn_dtype from, const float *src,
                         size_t n, attn_lm_stored dst, size_t at, size_t file_at,
                         size_t file_step) {
    if (dst.dtype == ATTN_DTYPE_F32) {
        memcpy((float *)dst.data + at, src, n * sizeof *src);
        return ATTN_OK;
    }
    uint16_t *h = (uint16_t *)dst.data + at;
    if (is_half(from) && from != dst.dtype) {
        for (size_t i = 0; i < n; i++) {
            h[i] = attn_float_to_half(dst.dtype, src[i]);
            float back = attn_half_to_float(dst.dtype, h[i]);
            if (!(back == src[i] || (isnan(back) && isnan(src[i]))))
                return refuse_element(s, name, from, dst.dtype, true, src[i],
                                      file_at + i * file_step);
        }
        return ATTN_OK;
    }
    uint16_t inf = dst.dtype == ATTN_DTYPE_BF16 ? 0x7F80u : 0x7C00u;
    unsigned past = 0;
    if (dst.dtype == ATTN_DTYPE_BF16)
        for (size_t i = 0; i < n; i++) {
            h[i] = attn_float_to_bf16(src[i]);
            past |= past_range(src[i], h[i], inf);
        }
    else
        for (size_t i = 0; i < n; i++) {
            h[i] = attn_float_to_f16(src[i]);
            past |= past_range(src[i], h[i], inf);
        }
    for (size_t i = 0; past && i < n; i++)
        if (past_range(src[i], h[i], inf))
            return refuse_element(s, name, from, dst.dtype, false, src[i],
                                  file_at + i * file_step);
    return ATTN_OK;
}

/* dst (rows, cols) = the tensor name, as stored. */
static attn_status load_plain(lm_source *s, const char *name, attn_lm_stored dst, size_t rows,
                              size_t cols) {
    attn_safetensors_info info;
    attn_status st = find_shaped(s, name, rows, cols, &info);
    if (st != ATTN_OK) return st;
    if (dst.dtype == ATTN_DTYPE_F32)
        return attn_safetensors_load(s->st, info.index, dst.data, info.numel);
    if ((st = grow_buffer(s, name, &s->scratch, &s->scratch_floats, info.numel)) != ATTN_OK ||
        (st = attn_safetensors_load(s->st, info.index, s->scratch, info.numel)) != ATTN_OK)
        return st;
    return store(s, name, info.dtype, s->scratch, info.numel, dst, 0, 0, 1);
}

/* dst (out, in) = columns [first, first + out) of the Conv1D weight name
 * (in, total), transposed into nn.Linear's layout. */
static attn_status load_conv1d(lm_source *s, const char *name, attn_lm_stored dst, size_t in,
                               size_t total, size_t first, size_t out) {
    attn_safetensors_info info;
    attn_status st = find_shaped(s, name, in, total, &info);
    if (st != ATTN_OK) return st;
    if ((st = grow_buffer(s, name, &s->scratch, &s->scratch_floats, info.numel)) != ATTN_OK ||
        (st = grow_buffer(s, name, &s->row, &s->row_floats, in)) != ATTN_OK ||
        (st = attn_safetensors_load(s->st, info.index, s->scratch, info.numel)) != ATTN_OK)
        return st;
    for (size_t o = 0; o < out && st == ATTN_OK; o++) {
        for (size_t i = 0; i < in; i++) s->row[i] = s->scratch[i * total + first + o];
        st = store(s, name, info.dtype, s->row, in, dst, o * in, first + o, total);
    }
    return st;
}

/* dst (n) = entries [first, first + n) of the vector name (total). */
static attn_status load_slice(lm_source *s, const char *name, float *dst, size_t total,
                              size_t first, size_t n) {
    attn_lm_stored whole = {dst, ATTN_DTYPE_F32};
    if (first == 0 && n == total) return load_plain(s, name, whole, n, 0);
    attn_safetensors_info info;
    attn_status st = find_shaped(s, name, total, 0, &info);
    if (st != ATTN_OK) return st;
    if ((st = grow_buffer(s, name, &s->scratch, &s->scratch_floats, total)) != ATTN_OK ||
        (st = attn_safetensors_load(s->st, info.index, s->scratch, total)) != ATTN_OK)
        return st;
    memcpy(dst, s->scratch + first, n * sizeof *dst);
    return ATTN_OK;
}

/* A linear layer's weight (the model's weights dtype), a float tensor. */
static attn_lm_stored weight(const attn_lm *m, void *data) {
    return (attn_lm_stored){data, m->cfg.weights_dtype};
}

static attn_lm_stored floats(float *data) { return (attn_lm_stored){data, ATTN_DTYPE_F32}; }

/* ---- the weights, by naming scheme ------------------------------------------ */

static attn_status load_book(lm_source *s, attn_lm *m) {
    for (size_t i = 0; i < m->num_params; i++) {
        attn_param *p = &m->params[i];
        if (i > 0 && m->stored[i].data == m->tok_emb) continue; /* a tied out_head */
        attn_status st = load_plain(s, p->name, m->stored[i], p->shape[0],
                                    p->ndim == 2 ? p->shape[1] : 0);
        if (st != ATTN_OK) return st;
    }
    return ATTN_OK;
}

static attn_status load_hf_gpt2(lm_source *s, attn_lm *m) {
    const attn_lm_config *c = &m->cfg;
    size_t C = c->emb_dim, H = m->hidden;
    const char *x = s->prefix;
    char n[160];
    attn_status st = load_plain(s, name_of(n, sizeof n, "%swte.weight", x),
                                weight(m, m->tok_emb), c->vocab_size, C);
    if (st == ATTN_OK)
        st = load_plain(s, name_of(n, sizeof n, "%swpe.weight", x), floats(m->pos_emb),
                        c->context_length, C);
    for (size_t i = 0; i < c->n_layers && st == ATTN_OK; i++) {
        attn_lm_block *k = &m->blocks[i];
        void *w3[3] = {k->wq, k->wk, k->wv};
        float *b3[3] = {k->bq, k->bk, k->bv};
        for (size_t j = 0; j < 3 && st == ATTN_OK; j++) {
            st = load_conv1d(s, name_of(n, sizeof n, "%sh.%zu.attn.c_attn.weight", x, i),
                             weight(m, w3[j]), C, 3 * C, j * C, C);
            if (st == ATTN_OK && b3[j])
                st = load_slice(s, name_of(n, sizeof n, "%sh.%zu.attn.c_attn.bias", x, i), b3[j],
                                3 * C, j * C, C);
        }
        const struct { const char *name; attn_lm_stored dst; size_t rows, cols; bool conv; } t[] = {
            {"attn.c_proj.weight", weight(m, k->wo), C, C, true},
            {"attn.c_proj.bias", floats(k->bo), C, 0, false},
            {"mlp.c_fc.weight", weight(m, k->fc1_w), C, H, true},
            {"mlp.c_fc.bias", floats(k->fc1_b), H, 0, false},
            {"mlp.c_proj.weight", weight(m, k->fc2_w), H, C, true},
            {"mlp.c_proj.bias", floats(k->fc2_b), C, 0, false},
            {"ln_1.weight", floats(k->norm1_w), C, 0, false},
            {"ln_1.bias", floats(k->norm1_b), C, 0, false},
            {"ln_2.weight", floats(k->norm2_w), C, 0, false},
            {"ln_2.bias", floats(k->norm2_b), C, 0, false}};
        for (size_t j = 0; j < sizeof t / sizeof t[0] && st == ATTN_OK; j++) {
            name_of(n, sizeof n, "%sh.%zu.%s", x, i, t[j].name);
            st = t[j].conv ? load_conv1d(s, n, t[j].dst, t[j].rows, t[j].cols, 0, t[j].cols)
                           : load_plain(s, n, t[j].dst, t[j].rows, 0);
        }
    }
    if (st == ATTN_OK)
        st = load_plain(s, name_of(n, sizeof n, "%sln_f.weight", x), floats(m->final_w), C, 0);
    if (st == ATTN_OK)
        st = load_plain(s, name_of(n, sizeof n, "%sln_f.bias", x), floats(m->final_b), C, 0);
    if (st == ATTN_OK && !c->tie_embeddings)
        st = load_plain(s, "lm_head.weight", weight(m, m->out_head), c->vocab_size, C);
    return st;
}

static attn_status load_hf_llama(lm_source *s, attn_lm *m) {
    const attn_lm_config *c = &m->cfg;
    size_t C = c->emb_dim, H = m->hidden, kvw = m->kv_heads * m->head_dim;
    char n[160];
    attn_status st = load_plain(s, "model.embed_tokens.weight", weight(m, m->tok_emb),
                                c->vocab_size, C);
    for (size_t i = 0; i < c->n_layers && st == ATTN_OK; i++) {
        attn_lm_block *k = &m->blocks[i];
        const struct { const char *name; attn_lm_stored dst; size_t rows, cols; } t[] = {
            {"self_attn.q_proj.weight", weight(m, k->wq), C, C},
            {"self_attn.k_proj.weight", weight(m, k->wk), kvw, C},
            {"self_attn.v_proj.weight", weight(m, k->wv), kvw, C},
            {"self_attn.o_proj.weight", weight(m, k->wo), C, C},
            {"mlp.gate_proj.weight", weight(m, k->fc1_w), H, C},
            {"mlp.up_proj.weight", weight(m, k->fc2_w), H, C},
            {"mlp.down_proj.weight", weight(m, k->fc3_w), C, H},
            {"input_layernorm.weight", floats(k->norm1_w), C, 0},
            {"post_attention_layernorm.weight", floats(k->norm2_w), C, 0}};
        for (size_t j = 0; j < sizeof t / sizeof t[0] && st == ATTN_OK; j++)
            st = load_plain(s, name_of(n, sizeof n, "model.layers.%zu.%s", i, t[j].name), t[j].dst,
                            t[j].rows, t[j].cols);
    }
    if (st == ATTN_OK) st = load_plain(s, "model.norm.weight", floats(m->final_w), C, 0);
    if (st == ATTN_OK && !c->tie_embeddings)
        st = load_plain(s, "lm_head.weight", weight(m, m->out_head), c->vocab_size, C);
    return st;
}

/* A tied model's head that the file holds anyway must be its embedding,
 * element for element: transformers loads such a file with the head's
 * values in both, the book's model with the embedding's, so a file where
 * they differ is no tied model, and either reading of it gives other
 * logits than the other. */
static attn_status check_tied_head(lm_source *s, attn_lm *m) {
    const char *head = s->names == NAMES_BOOK ? "out_head.weight" : "lm_head.weight";
    attn_safetensors_info info;
    if (!m->cfg.tie_embeddings || attn_safetensors_find(s->st, head, &info) != ATTN_OK)
        return ATTN_OK;
    attn_status st = grow_buffer(s, head, &s->scratch, &s->scratch_floats, info.numel);
    if (st == ATTN_OK) st = attn_safetensors_load(s->st, info.index, s->scratch, info.numel);
    if (st != ATTN_OK) return st;
    attn_dtype dtype = m->cfg.weights_dtype;
    for (size_t i = 0; i < info.numel; i++) {
        float x = s->scratch[i], e;
        bool same;
        if (dtype == ATTN_DTYPE_F32) {
            e = ((const float *)m->tok_emb)[i];
            same = attn_bits_of_float(x) == attn_bits_of_float(e);
        } else {
            uint16_t h = ((const uint16_t *)m->tok_emb)[i];
            e = attn_half_to_float(dtype, h);
            same = attn_float_to_half(dtype, x) == h;
        }
        if (!same) {
            char where[ATTN_ERROR_CAPACITY];
            return attn_fail(s->ctx, ATTN_ERR_INVALID,
                             "attn_lm_load: %s: the config ties the head to the embedding, but "
                             "the file's '%s' holds %.9g at element %zu where the embedding "
                             "holds %.9g: untie it (%s false) to use the file's head",
                             file_of(s, head, where, sizeof where), head, (double)x, i,
                             (double)e,
                             s->names == NAMES_BOOK ? "tie_embeddings" : "tie_word_embeddings");
        }
    }
    return ATTN_OK;
}

/* ---- the config --------------------------------------------------------------- */

/* A config being read: tie is -1 until something says. */
typedef struct lm_config_read {
    attn_lm_config cfg;
    int tie;
    attn_lm_config_keys keys; /* the keys its values were read under */
} lm_config_read;

/* Hugging Face's GPT2Config and LlamaConfig keys, for messages on their
 * values (the book's cfg keys are attn_lm_config's field names). */
static const attn_lm_config_keys hf_gpt2_keys = {
    .vocab_size = "vocab_size", .context_length = "n_positions", .emb_dim = "n_embd",
    .n_heads = "n_head", .n_layers = "n_layer", .hidden_dim = "n_inner",
    .n_kv_groups = "n_kv_groups", .qkv_bias = "qkv_bias", .rope_base = "rope_base",
    .rope_scaling = "rope_freq", .rope_original_context_length = "original_context_length",
    .norm_eps = "layer_norm_epsilon"};
static const attn_lm_config_keys hf_llama_keys = {
    .vocab_size = "vocab_size", .context_length = "max_position_embeddings",
    .emb_dim = "hidden_size", .n_heads = "num_attention_heads",
    .n_layers = "num_hidden_layers", .hidden_dim = "intermediate_size",
    .n_kv_groups = "num_key_value_heads", .qkv_bias = "attention_bias",
    .rope_base = "rope_theta", .rope_scaling = "rope_scaling",
    .rope_original_context_length = "original_max_position_embeddings",
    .norm_eps = "rms_norm_eps"};

/* A size that attn_json_as_size refused, named with its value. */
static attn_status size_refused(attn_ctx *ctx, const char *path, const char *key,
                                const attn_json *v) {
    /* past 2^53 a JSON number is held as the nearest double: the one quoted
     * may not be the file's digits (18446744073709551615 reads as 2^64) */
    if (v->type == ATTN_JSON_NUMBER)
        return attn_fail(ctx, ATTN_ERR_FORMAT,
                         "attn_lm_load: %s: \"%s\" (%.17g%s) must be a whole number from 0 to "
                         "2^64 - 1", path, key, v->number,
                         fabs(v->number) > 0x1p53 ? " as read: past 2^53 a number keeps 17 digits"
                                                   : "");
    return attn_fail(ctx, ATTN_ERR_FORMAT,
                     "attn_lm_load: %s: \"%s\" must be a non-negative integer, not a %s", path,
                     key, v->type == ATTN_JSON_STRING ? "string"
                          : v->type == ATTN_JSON_BOOL ? "boolean"
                          : v->type == ATTN_JSON_NULL ? "null"
                                                      : "list or object");
}

static attn_status need_size(attn_ctx *ctx, const char *path, const attn_json *root,
                             const char *key, size_t *out) {
    const attn_json *v = attn_json_get(root, key);
    if (!v)
        return attn_fail(ctx, ATTN_ERR_FORMAT, "attn_lm_load: %s has no \"%s\"", path, key);
    if (!attn_json_as_size(v, out)) return size_refused(ctx, path, key, v);
    return ATTN_OK;
}

/* An optional number (kept as it is when absent). */
static attn_status opt_double(attn_ctx *ctx, const char *path, const attn_json *obj,
                              const char *key, double *out) {
    const attn_json *v = attn_json_get(obj, key);
    if (!v || v->type == ATTN_JSON_NULL) return ATTN_OK;
    if (!attn_json_as_double(v, out))
        return attn_fail(ctx, ATTN_ERR_FORMAT, "attn_lm_load: %s: \"%s\" must be a number", path,
                         key);
    return ATTN_OK;
}

/* An optional norm epsilon: a written 0 is kept as 0 (-0.0 in the config,
 * which attn_lm_config tells from +0.0, "not given"); a negative or
 * non-finite one is refused by name. */
static attn_status opt_eps(attn_ctx *ctx, const char *path, const attn_json *obj,
                           const char *key, double *out) {
    const attn_json *v = attn_json_get(obj, key);
    if (!v || v->type == ATTN_JSON_NULL) return ATTN_OK;
    double eps;
    attn_status st = opt_double(ctx, path, obj, key, &eps);
    if (st != ATTN_OK) return st;
    if (!(eps >= 0.0) || !isfinite(eps))
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "attn_lm_load: %s: \"%s\" (%g) must be a finite number >= 0", path, key,
                         eps);
    *out = eps == 0.0 ? -0.0 : eps;
    return ATTN_OK;
}

/* An optional number that must be positive and finite when written (a RoPE
 * base, whose 0 makes 0^x frequencies; a scaling factor): refused by name,
 * never replaced by a default. */
static attn_status opt_positive(attn_ctx *ctx, const char *path, const attn_json *obj,
                                const char *key, double *out) {
    const attn_json *v = attn_json_get(obj, key);
    if (!v || v->type == ATTN_JSON_NULL) return ATTN_OK;
    double x;
    attn_status st = opt_double(ctx, path, obj, key, &x);
    if (st != ATTN_OK) return st;
    if (!(x > 0.0) || !isfinite(x))
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "attn_lm_load: %s: \"%s\" (%g) must be a finite number > 0", path, key,
                         x);
    *out = x;
    return ATTN_OK;
}

static attn_status opt_size(attn_ctx *ctx, const char *path, const attn_json *obj,
                            const char *key, size_t *out) {
    const attn_json *v = attn_json_get(obj, key);
    if (!v || v->type == ATTN_JSON_NULL) return ATTN_OK;
    if (!attn_json_as_size(v, out)) return size_refused(ctx, path, key, v);
    return ATTN_OK;
}

/* An optional count whose 0 means "not given" to the caller: absent (or
 * null) leaves *out; a given 0 is refused, not read as absent, the
 * message saying why (why_zero) and what leaving it out gives (absent). */
static attn_status opt_count(attn_ctx *ctx, const char *path, const attn_json *obj,
                             const char *key, size_t *out, const char *why_zero,
                             const char *absent) {
    attn_status st = opt_size(ctx, path, obj, key, out);
    if (st == ATTN_OK && attn_json_get(obj, key) &&
        attn_json_get(obj, key)->type != ATTN_JSON_NULL && *out == 0)
        return attn_fail(ctx, ATTN_ERR_FORMAT,
                         "attn_lm_load: %s: \"%s\" is 0, %s: give a positive count, or leave "
                         "it out for %s",
                         path, key, why_zero, absent);
    return st;
}

/* A count of KV heads (0: one a head): no head fits in 0 groups (the
 * book's GroupedQueryAttention divides by it). */
static attn_status opt_groups(attn_ctx *ctx, const char *path, const attn_json *obj,
                              const char *key, size_t *out) {
    return opt_count(ctx, path, obj, key, out, "which holds no head (a count that divides the "
                     "heads)", "one a head");
}

static attn_status opt_bool(attn_ctx *ctx, const char *path, const attn_json *obj,
                            const char *key, int *out) {
    const attn_json *v = attn_json_get(obj, key);
    if (!v || v->type == ATTN_JSON_NULL) return ATTN_OK;
    bool b;
    if (!attn_json_as_bool(v, &b))
        return attn_fail(ctx, ATTN_ERR_FORMAT, "attn_lm_load: %s: \"%s\" must be true or false",
                         path, key);
    *out = b;
    return ATTN_OK;
}

/* A flag of a Hugging Face config that changes the model's arithmetic,
 * refused unless it is absent or has the book's value: loading the
 * weights and ignoring it would give other logits without a word. */
static attn_status book_flag(attn_ctx *ctx, const char *path, const attn_json *j,
                             const char *key, bool book) {
    int value = book;
    attn_status st = opt_bool(ctx, path, j, key, &value);
    if (st == ATTN_OK && value != (int)book)
        st = attn_fail(ctx, ATTN_ERR_INVALID,
                       "attn_lm_load: %s: \"%s\": %s is not the book's model (%s)", path, key,
                       value ? "true" : "false", book ? "true" : "false");
    return st;
}

/* A JSON value's kind, for a message. */
static const char *json_kind(const attn_json *v) {
    static const char *const kinds[] = {"null", "a boolean", "a number", "a string", "a list",
                                        "an object"};
    return v->type <= ATTN_JSON_OBJECT ? kinds[v->type] : "?";
}

/* An optional string: NULL when absent; any other value, null included,
 * is refused by name (transformers fails on it too). */
static attn_status opt_string(attn_ctx *ctx, const char *path, const attn_json *obj,
                              const char *key, const char **out) {
    *out = NULL;
    const attn_json *v = attn_json_get(obj, key);
    if (v && !(*out = attn_json_as_string(v)))
        return attn_fail(ctx, ATTN_ERR_FORMAT, "attn_lm_load: %s: \"%s\" must be a string, not %s",
                         path, key, json_kind(v));
    return ATTN_OK;
}

/* The config's string value of key, when it is one of the values the book's
 * model has (or absent); any other is refused naming it and them. */
static attn_status book_string(attn_ctx *ctx, const char *path, const attn_json *j,
                               const char *key, const char *const *book, size_t count,
                               const char *what) {
    const char *value;
    attn_status st = opt_string(ctx, path, j, key, &value);
    if (st != ATTN_OK || !value) return st;
    for (size_t i = 0; i < count; i++)
        if (strcmp(value, book[i]) == 0) return ATTN_OK;
    char shown[64];
    attn_safetensors_printable(shown, sizeof shown, value);
    return attn_fail(ctx, ATTN_ERR_INVALID, "attn_lm_load: %s: %s \"%s\" is not %s", path, key,
                     shown, what);
}

/* Features of other models' configs that the book's models lack: refused
 * when written with a value that changes the arithmetic, since the tensors
 * alone would load and give other logits without a word. */
static attn_status no_softcap_or_partial_rope(attn_ctx *ctx, const char *path,
                                              const attn_json *j) {
    static const char *const softcaps[] = {"attn_logit_softcapping", "final_logit_softcapping"};
    for (size_t i = 0; i < 2; i++) {
        const attn_json *v = attn_json_get(j, softcaps[i]);
        if (v && v->type != ATTN_JSON_NULL) {
            char shown[32];
            if (v->type == ATTN_JSON_NUMBER) snprintf(shown, sizeof shown, "%g", v->number);
            else snprintf(shown, sizeof shown, "%s", json_kind(v));
            return attn_fail(ctx, ATTN_ERR_INVALID,
                             "attn_lm_load: %s: \"%s\" %s (Gemma 2's logit soft-capping) is "
                             "not in the book's models", path, softcaps[i], shown);
        }
    }
    double partial = 1.0;
    attn_status st = opt_double(ctx, path, j, "partial_rotary_factor", &partial);
    if (st == ATTN_OK && partial != 1.0)
        st = attn_fail(ctx, ATTN_ERR_INVALID,
                       "attn_lm_load: %s: \"partial_rotary_factor\" (%g): the book's Llama 3 "
                       "rotates every dimension (1)", path, partial);
    return st;
}

/* Hugging Face's GPT2Config. */
static attn_status read_hf_gpt2(attn_ctx *ctx, const char *path, const attn_json *j,
                                lm_config_read *r) {
    attn_lm_config *c = &r->cfg;
    c->arch = ATTN_LM_GPT2;
    c->qkv_bias = true;
    r->tie = 1; /* GPT2LMHeadModel ties lm_head to wte unless told not to */
    r->keys = hf_gpt2_keys;
    /* the context is n_positions' where both are written */
    if (attn_json_get(j, "n_ctx") && !attn_json_get(j, "n_positions"))
        r->keys.context_length = "n_ctx";
    attn_status st = need_size(ctx, path, j, "n_embd", &c->emb_dim);
    if (st == ATTN_OK) st = need_size(ctx, path, j, "n_layer", &c->n_layers);
    if (st == ATTN_OK) st = need_size(ctx, path, j, "n_head", &c->n_heads);
    if (st == ATTN_OK) st = need_size(ctx, path, j, "vocab_size", &c->vocab_size);
    if (st == ATTN_OK)
        st = opt_count(ctx, path, j, "n_ctx", &c->context_length, "a context of no token",
                       "n_positions");
    if (st == ATTN_OK)
        st = opt_count(ctx, path, j, "n_positions", &c->context_length,
                       "a context of no token", "n_ctx");
    /* transformers builds a feed-forward of n_inner units when it is given,
     * 0 too: a layer of no units is no GPT-2, not the 4 * n_embd default */
    if (st == ATTN_OK)
        st = opt_count(ctx, path, j, "n_inner", &c->hidden_dim, "a feed-forward of no units",
                       "4 * n_embd");
    /* the book's FeedForward is 4 * n_embd wide, as transformers' default */
    if (st == ATTN_OK && c->hidden_dim &&
        (c->hidden_dim % 4 != 0 || c->hidden_dim / 4 != c->emb_dim))
        st = attn_fail(ctx, ATTN_ERR_INVALID,
                       "attn_lm_load: %s: \"n_inner\" (%zu) is not 4 * n_embd (%zu): the book's "
                       "GPT-2 has no other feed-forward width", path, c->hidden_dim, c->emb_dim);
    if (st == ATTN_OK) st = opt_eps(ctx, path, j, "layer_norm_epsilon", &c->norm_eps);
    if (st == ATTN_OK) st = opt_bool(ctx, path, j, "tie_word_embeddings", &r->tie);
    if (st == ATTN_OK && c->context_length == 0)
        st = attn_fail(ctx, ATTN_ERR_FORMAT, "attn_lm_load: %s has no \"n_positions\"", path);
    static const char *const gelu[] = {"gelu_new", "gelu_pytorch_tanh"};
    if (st == ATTN_OK)
        st = book_string(ctx, path, j, "activation_function", gelu, 2,
                         "the book's GELU (tanh form: gelu_new)");
    static const char *const gpt2[] = {"gpt2"};
    if (st == ATTN_OK)
        st = book_string(ctx, path, j, "model_type", gpt2, 1, "the book's GPT-2 (\"gpt2\")");
    if (st == ATTN_OK) st = book_flag(ctx, path, j, "scale_attn_weights", true);
    if (st == ATTN_OK) st = book_flag(ctx, path, j, "scale_attn_by_inverse_layer_idx", false);
    return st;
}

/* RoPE's frequencies in a Hugging Face LlamaConfig: "rope_scaling" (of
 * type "llama3" or "default"), or transformers 5's "rope_parameters", which
 * holds rope_theta and the same fields in one object. */
static attn_status read_rope_object(attn_ctx *ctx, const char *path, const attn_json *j,
                                    const char *key, lm_config_read *r) {
    attn_lm_config *c = &r->cfg;
    const attn_json *rs = attn_json_get(j, key);
    if (!rs || rs->type == ATTN_JSON_NULL) return ATTN_OK;
    if (rs->type != ATTN_JSON_OBJECT)
        return attn_fail(ctx, ATTN_ERR_FORMAT, "attn_lm_load: %s: \"%s\" must be an object", path,
                         key);
    attn_status st = opt_positive(ctx, path, rs, "rope_theta", &c->rope_base);
    if (st == ATTN_OK) st = no_softcap_or_partial_rope(ctx, path, rs);
    const char *type = NULL;
    if (st == ATTN_OK) st = opt_string(ctx, path, rs, "rope_type", &type);
    if (st == ATTN_OK && !type) st = opt_string(ctx, path, rs, "type", &type);
    if (st != ATTN_OK || (type && strcmp(type, "default") == 0)) return st;
    if (type && strcmp(type, "llama3") == 0) r->keys.rope_scaling = key;
    if (!type || strcmp(type, "llama3") != 0) {
        char shown[64];
        attn_safetensors_printable(shown, sizeof shown, type ? type : "(none)");
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "attn_lm_load: %s: %s of type \"%s\" is not supported (only \"llama3\" "
                         "and \"default\")", path, key, shown);
    }
    /* all four, as transformers' llama3 rope asks: without its factor the
     * scaling would read as none */
    static const char *const needed[] = {"factor", "low_freq_factor", "high_freq_factor",
                                         "original_max_position_embeddings"};
    for (size_t i = 0; i < sizeof needed / sizeof needed[0]; i++)
        if (!attn_json_get(rs, needed[i]))
            return attn_fail(ctx, ATTN_ERR_INVALID,
                             "attn_lm_load: %s: %s of type \"llama3\" has no \"%s\"", path, key,
                             needed[i]);
    st = opt_positive(ctx, path, rs, "factor", &c->rope_factor);
    if (st == ATTN_OK) st = opt_double(ctx, path, rs, "low_freq_factor", &c->rope_low_freq_factor);
    if (st == ATTN_OK) st = opt_double(ctx, path, rs, "high_freq_factor", &c->rope_high_freq_factor);
    if (st == ATTN_OK)
        st = opt_size(ctx, path, rs, "original_max_position_embeddings",
                      &c->rope_original_context_length);
    return st;
}

/* Hugging Face's LlamaConfig. */
static attn_status read_hf_llama(attn_ctx *ctx, const char *path, const attn_json *j,
                                 lm_config_read *r) {
    attn_lm_config *c = &r->cfg;
    c->arch = ATTN_LM_LLAMA3;
    r->tie = 0;               /* LlamaConfig's defaults */
    r->keys = hf_llama_keys;
    c->rope_base = 10000.0;
    c->norm_eps = 1e-6;
    attn_status st = need_size(ctx, path, j, "hidden_size", &c->emb_dim);
    if (st == ATTN_OK) st = need_size(ctx, path, j, "num_hidden_layers", &c->n_layers);
    if (st == ATTN_OK) st = need_size(ctx, path, j, "num_attention_heads", &c->n_heads);
    if (st == ATTN_OK) st = need_size(ctx, path, j, "vocab_size", &c->vocab_size);
    if (st == ATTN_OK) st = need_size(ctx, path, j, "intermediate_size", &c->hidden_dim);
    if (st == ATTN_OK) st = need_size(ctx, path, j, "max_position_embeddings", &c->context_length);
    if (st == ATTN_OK) st = opt_groups(ctx, path, j, "num_key_value_heads", &c->n_kv_groups);
    if (st == ATTN_OK) st = opt_positive(ctx, path, j, "rope_theta", &c->rope_base);
    if (st == ATTN_OK) st = opt_eps(ctx, path, j, "rms_norm_eps", &c->norm_eps);
    if (st == ATTN_OK) st = opt_bool(ctx, path, j, "tie_word_embeddings", &r->tie);
    if (st == ATTN_OK) st = read_rope_object(ctx, path, j, "rope_scaling", r);
    if (st == ATTN_OK) st = read_rope_object(ctx, path, j, "rope_parameters", r);
    if (st == ATTN_OK) st = no_softcap_or_partial_rope(ctx, path, j);
    size_t head_dim = 0;
    if (st == ATTN_OK) st = opt_size(ctx, path, j, "head_dim", &head_dim);
    if (st == ATTN_OK && head_dim && c->n_heads && head_dim * c->n_heads != c->emb_dim)
        st = attn_fail(ctx, ATTN_ERR_INVALID,
                       "attn_lm_load: %s: head_dim %zu is not hidden_size (%zu) / "
                       "num_attention_heads (%zu), which the book's model needs",
                       path, head_dim, c->emb_dim, c->n_heads);
    /* each flag alone: a false one does not undo a true one, whose biases
     * a non-strict load would leave out */
    if (st == ATTN_OK) st = book_flag(ctx, path, j, "attention_bias", false);
    if (st == ATTN_OK) st = book_flag(ctx, path, j, "mlp_bias", false);
    static const char *const silu[] = {"silu"};
    if (st == ATTN_OK)
        st = book_string(ctx, path, j, "hidden_act", silu, 1, "the book's SiLU (\"silu\")");
    /* Mistral's tensors and arithmetic are Llama's, but for its window */
    static const char *const llama[] = {"llama", "mistral"};
    if (st == ATTN_OK)
        st = book_string(ctx, path, j, "model_type", llama, 2,
                         "the book's Llama 3 (\"llama\", or \"mistral\" without a window)");
    /* Mistral's window: MistralConfig's 4096 where the file has no
     * sliding_window, none where it is null; transformers' Llama reads no
     * window at all, nor Mistral use_sliding_window (Qwen2's key) */
    const char *type = attn_json_as_string(attn_json_get(j, "model_type"));
    bool mistral = type && strcmp(type, "mistral") == 0;
    const attn_json *sw = attn_json_get(j, "sliding_window");
    size_t window = mistral && !sw ? 4096 : 0;
    if (st == ATTN_OK && mistral) st = opt_size(ctx, path, j, "sliding_window", &window);
    if (st == ATTN_OK && window && window < c->context_length)
        st = attn_fail(ctx, ATTN_ERR_INVALID,
                       "attn_lm_load: %s: sliding_window %zu (below max_position_embeddings "
                       "%zu): the book's Llama 3 attends to every earlier position",
                       path, window, c->context_length);
    return st;
}

/* The book's sliding-window keys (gpt_with_kv_swa.py's cfg): the window
 * size, and the stride K whose 0 means no window (the C config's 0 size)
 * and whose negative values mean every layer (the C config's 0 stride). */
static attn_status read_book_window(attn_ctx *ctx, const char *path, const attn_json *j,
                                    attn_lm_config *c) {
    const attn_json *size = attn_json_get(j, "sliding_window_size");
    const attn_json *stride = attn_json_get(j, "sliding_window_stride");
    if (!size || size->type == ATTN_JSON_NULL) {
        if (stride && stride->type != ATTN_JSON_NULL)
            return attn_fail(ctx, ATTN_ERR_INVALID,
                             "attn_lm_load: %s: \"sliding_window_stride\" without a "
                             "\"sliding_window_size\"", path);
        return ATTN_OK;
    }
    attn_status st = opt_count(ctx, path, j, "sliding_window_size", &c->sliding_window_size,
                               "a window that holds no position", "no window");
    if (st != ATTN_OK) return st;
    double K = 0.0;
    bool given = stride && stride->type != ATTN_JSON_NULL;
    if (given && stride->type != ATTN_JSON_NUMBER)
        return attn_fail(ctx, ATTN_ERR_FORMAT,
                         "attn_lm_load: %s: \"sliding_window_stride\" must be an integer, not "
                         "a %s", path, stride->type == ATTN_JSON_STRING ? "string"
                                       : stride->type == ATTN_JSON_BOOL ? "boolean"
                                                                        : "list or object");
    if (given && (!attn_json_as_double(stride, &K) || K != floor(K) ||
                  !(fabs(K) <= 9007199254740992.0)))
        return attn_fail(ctx, ATTN_ERR_FORMAT,
                         "attn_lm_load: %s: \"sliding_window_stride\" (%.17g) must be a whole "
                         "number from -2^53 to 2^53", path, stride->number);
    if (!given)
        return attn_fail(ctx, ATTN_ERR_FORMAT,
                         "attn_lm_load: %s: \"sliding_window_size\" needs an integer "
                         "\"sliding_window_stride\" (the book's GPTModel reads it: K > 0, K "
                         "windowed layers then one without; 0 none; negative every layer)",
                         path);
    if (K == 0.0) c->sliding_window_size = 0;
    c->sliding_window_stride = K > 0.0 ? (size_t)K : 0;
    return ATTN_OK;
}

/* The book's cfg dict (GPT_CONFIG_124M, LLAMA32_CONFIG_1B, ...): Llama 3
 * when it has hidden_dim or rope_base, else the GPT with
 * MultiHeadLatentAttention (gpt_with_kv_mla.py's) when it has latent_dim
 * (null for the module's default), or with GroupedQueryAttention
 * (gpt_with_kv_gqa.py's) when it has n_kv_groups, else GPT-2; any of them
 * with gpt_with_kv_swa.py's sliding window keys. */
static attn_status read_book(attn_ctx *ctx, const char *path, const attn_json *j,
                             lm_config_read *r) {
    attn_lm_config *c = &r->cfg;
    bool llama = attn_json_get(j, "hidden_dim") || attn_json_get(j, "rope_base");
    bool mla = !llama && attn_json_get(j, "latent_dim");
    bool gqa = !llama && !mla && attn_json_get(j, "n_kv_groups");
    c->arch = llama ? ATTN_LM_LLAMA3
              : mla ? ATTN_LM_GPT_MLA
              : gqa ? ATTN_LM_GPT_GQA
                    : ATTN_LM_GPT2;
    attn_status st = need_size(ctx, path, j, "vocab_size", &c->vocab_size);
    if (st == ATTN_OK) st = need_size(ctx, path, j, "context_length", &c->context_length);
    if (st == ATTN_OK) st = need_size(ctx, path, j, "emb_dim", &c->emb_dim);
    if (st == ATTN_OK) st = need_size(ctx, path, j, "n_heads", &c->n_heads);
    if (st == ATTN_OK) st = need_size(ctx, path, j, "n_layers", &c->n_layers);
    int qkv_bias = 0;
    if (st == ATTN_OK) st = opt_bool(ctx, path, j, "qkv_bias", &qkv_bias);
    c->qkv_bias = qkv_bias;
    if (st == ATTN_OK) st = opt_bool(ctx, path, j, "tie_embeddings", &r->tie);
    if (st == ATTN_OK) st = opt_eps(ctx, path, j, "norm_eps", &c->norm_eps);
    if (st == ATTN_OK && gqa) st = opt_groups(ctx, path, j, "n_kv_groups", &c->n_kv_groups);
    if (st == ATTN_OK && mla)
        st = opt_count(ctx, path, j, "latent_dim", &c->latent_dim, "a latent of no width",
                       "the module's max(16, emb_dim / 8)");
    if (st == ATTN_OK) st = read_book_window(ctx, path, j, c);
    if (llama) {
        if (st == ATTN_OK) st = need_size(ctx, path, j, "hidden_dim", &c->hidden_dim);
        if (st == ATTN_OK) st = opt_groups(ctx, path, j, "n_kv_groups", &c->n_kv_groups);
        if (st == ATTN_OK) st = opt_positive(ctx, path, j, "rope_base", &c->rope_base);
        const attn_json *f = attn_json_get(j, "rope_freq");
        /* None, or the book's dict with all four: compute_rope_params reads
         * each, and a dict without its factor would read as no scaling */
        static const char *const needed[] = {"factor", "low_freq_factor", "high_freq_factor",
                                             "original_context_length"};
        bool dict = f && f->type == ATTN_JSON_OBJECT;
        if (st == ATTN_OK && f && !dict && f->type != ATTN_JSON_NULL)
            st = attn_fail(ctx, ATTN_ERR_FORMAT,
                           "attn_lm_load: %s: \"rope_freq\" must be an object or null", path);
        for (size_t i = 0; st == ATTN_OK && dict && i < sizeof needed / sizeof needed[0]; i++)
            if (!attn_json_get(f, needed[i]))
                st = attn_fail(ctx, ATTN_ERR_INVALID,
                               "attn_lm_load: %s: \"rope_freq\" has no \"%s\"", path, needed[i]);
        if (st == ATTN_OK && dict) {
            st = opt_positive(ctx, path, f, "factor", &c->rope_factor);
            if (st == ATTN_OK) st = opt_double(ctx, path, f, "low_freq_factor", &c->rope_low_freq_factor);
            if (st == ATTN_OK)
                st = opt_double(ctx, path, f, "high_freq_factor", &c->rope_high_freq_factor);
            if (st == ATTN_OK)
                st = opt_size(ctx, path, f, "original_context_length",
                              &c->rope_original_context_length);
        }
    }
    return st;
}

/* The config in the JSON file at path, in whichever dialect it is written. */
static attn_status read_config(attn_ctx *ctx, const char *path, lm_config_read *r) {
    attn_json *root;
    attn_status st = attn_json_read_file(ctx, path, &root);
    if (st != ATTN_OK) return st;
    *r = (lm_config_read){.tie = -1, .keys = attn_lm_config_fields};
    if (root->type != ATTN_JSON_OBJECT)
        st = attn_fail(ctx, ATTN_ERR_FORMAT, "attn_lm_load: %s is not a JSON object", path);
    else if (attn_json_get(root, "emb_dim"))
        st = read_book(ctx, path, root, r);
    else if (attn_json_get(root, "n_embd"))
        st = read_hf_gpt2(ctx, path, root, r);
    else if (attn_json_get(root, "hidden_size"))
        st = read_hf_llama(ctx, path, root, r);
    else
        st = attn_fail(ctx, ATTN_ERR_FORMAT,
                       "attn_lm_load: %s has neither the book's cfg keys (emb_dim, ...) nor "
                       "Hugging Face's GPT-2 (n_embd, ...) or Llama (hidden_size, ...) keys",
                       path);
    attn_json_free(root);
    return st;
}

static attn_status name_config_file(attn_ctx *ctx, attn_status st, const char *from);

attn_status attn_lm_config_read(attn_ctx *ctx, const char *config_json, attn_lm_config *out) {
    if (!ctx || !config_json || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_lm_config_read: %s is NULL",
                         !ctx ? "ctx" : !config_json ? "config_json" : "out");
    attn_clear_error(ctx);
    lm_config_read r;
    attn_status st = read_config(ctx, config_json, &r);
    if (st != ATTN_OK) return st;
    r.cfg.tie_embeddings = r.tie == 1;
    /* its values checked as attn_lm_load checks them, named by the file's
     * keys (hidden_size, ...), not by the struct's fields later */
    attn_lm_config resolved;
    st = attn_lm_config_resolve(ctx, "attn_lm_config_read", &r.cfg, &r.keys, &resolved);
    if (st != ATTN_OK) return name_config_file(ctx, st, config_json);
    *out = r.cfg;
    return ATTN_OK;
}

/* Which names the file uses, by its embedding's name. */
static attn_status detect_names(lm_source *s) {
    s->prefix = "";
    if (has(s, "tok_emb.weight")) {
        s->names = NAMES_BOOK;
    } else if (has(s, "model.embed_tokens.weight")) {
        s->names = NAMES_HF_LLAMA;
    } else if (has(s, "wte.weight") || has(s, "transformer.wte.weight")) {
        s->names = NAMES_HF_GPT2;
        if (!has(s, "wte.weight")) s->prefix = "transformer.";
    } else {
        return attn_fail(s->ctx, ATTN_ERR_NOT_FOUND,
                         "attn_lm_load: %s has no token embedding: neither the book's "
                         "'tok_emb.weight' nor Hugging Face's 'wte.weight' "
                         "('transformer.wte.weight') or 'model.embed_tokens.weight'",
                         s->path);
    }
    return ATTN_OK;
}

/* The highest N + 1 of tensors named <before>N<after>. */
static size_t count_layers(lm_source *s, const char *before, const char *after) {
    size_t layers = 0, nb = strlen(before);
    for (size_t i = 0; i < attn_safetensors_count(s->st); i++) {
        attn_safetensors_info info;
        if (attn_safetensors_info_at(s->st, i, &info) != ATTN_OK) continue;
        if (strncmp(info.name, before, nb) != 0) continue;
        const char *p = info.name + nb;
        size_t n = 0, digits = 0;
        for (; *p >= '0' && *p <= '9' && digits < 9; p++, digits++) n = n * 10 + (size_t)(*p - '0');
        if (digits && strcmp(p, after) == 0 && n + 1 > layers) layers = n + 1;
    }
    return layers;
}

/* The config of a file attn_model_save wrote for the book's Llama3Model
 * ("format": "attn-llama3") or for one of chapter 4's bonus GPTs
 * ("attn-gpt" with their keys): its metadata holds the cfg dict's keys,
 * each a JSON value (rope_freq the dict, or null), read as a book's
 * config.json. keys[0 .. needed) must be there, the rest are taken where
 * they are. Each value is parsed alone first, so that the object they are
 * put together into has exactly these keys. */
static attn_status read_metadata_config(lm_source *s, lm_config_read *r, const char *format,
                                        const char *const *keys, size_t needed, size_t count) {
    size_t length = 3; /* {, }, NUL */
    for (size_t i = 0; i < count; i++) {
        const char *text = attn_safetensors_metadata_get(s->st, keys[i]);
        if (!text && i >= needed) continue;
        if (!text)
            return attn_fail(s->ctx, ATTN_ERR_FORMAT,
                             "attn_lm_load: %s: its metadata (\"format\": \"%s\") has "
                             "no \"%s\"", s->path, format, keys[i]);
        char label[512];
        snprintf(label, sizeof label, "attn_lm_load: %.400s: metadata \"%s\"", s->path,
                 keys[i]);
        attn_json *value;
        attn_status st = attn_json_parse(s->ctx, text, strlen(text), label, &value);
        if (st != ATTN_OK) return st;
        attn_json_free(value);
        length += strlen(keys[i]) + strlen(text) + 6; /* "key": value, */
    }
    char *json = attn_malloc(length);
    if (!json)
        return attn_fail(s->ctx, ATTN_ERR_NO_MEMORY,
                         "attn_lm_load: out of memory for %s's metadata", s->path);
    size_t used = (size_t)snprintf(json, length, "{");
    for (size_t i = 0; i < count; i++) {
        const char *text = attn_safetensors_metadata_get(s->st, keys[i]);
        if (text)
            used += (size_t)snprintf(json + used, length - used, "%s\"%s\": %s",
                                     used > 1 ? ", " : "", keys[i], text);
    }
    snprintf(json + used, length - used, "}");
    attn_json *root;
    attn_status st = attn_json_parse(s->ctx, json, strlen(json), "the metadata", &root);
    attn_free(json);
    if (st != ATTN_OK) return st;
    st = read_book(s->ctx, s->path, root, r);
    attn_json_free(root);
    return st;
}

static attn_status read_llama3_metadata(lm_source *s, lm_config_read *r) {
    static const char *const keys[] = {"vocab_size", "context_length", "emb_dim",
                                       "n_heads",    "n_layers",       "hidden_dim",
                                       "n_kv_groups", "rope_base",     "rope_freq"};
    enum { KEYS = sizeof keys / sizeof keys[0] };
    return read_metadata_config(s, r, "attn-llama3", keys, KEYS, KEYS);
}

/* The keys chapter 4's bonus GPTs add to an "attn-gpt" file's metadata. */
static const char *const gpt_variant_keys[] = {"n_kv_groups", "latent_dim", "sliding_window_size",
                                               "sliding_window_stride"};
enum { GPT_VARIANT_KEYS = sizeof gpt_variant_keys / sizeof gpt_variant_keys[0] };

static bool has_gpt_variant_metadata(const lm_source *s) {
    for (size_t i = 0; i < GPT_VARIANT_KEYS; i++)
        if (attn_safetensors_metadata_get(s->st, gpt_variant_keys[i])) return true;
    return false;
}

static attn_status read_gpt_variant_metadata(lm_source *s, lm_config_read *r) {
    static const char *const keys[] = {"vocab_size", "context_length", "emb_dim", "n_heads",
                                       "n_layers", "qkv_bias", "n_kv_groups", "latent_dim",
                                       "sliding_window_size", "sliding_window_stride"};
    enum { KEYS = sizeof keys / sizeof keys[0] };
    return read_metadata_config(s, r, "attn-gpt", keys, KEYS - GPT_VARIANT_KEYS, KEYS);
}

/* A GPT-2 config from the tensors alone: n_heads = emb_dim / 64 (GPT-2's
 * head size); Llama cannot be guessed (heads, KV heads, RoPE base), unless
 * attn_model_save wrote the file with its config. */
static attn_status infer_config(lm_source *s, lm_config_read *r) {
    *r = (lm_config_read){.tie = -1, .keys = attn_lm_config_fields};
    attn_lm_config *c = &r->cfg;
    const char *format = attn_safetensors_metadata_get(s->st, "format");
    if (s->names == NAMES_BOOK && !has(s, "pos_emb.weight") && format &&
        strcmp(format, "attn-llama3") == 0)
        return read_llama3_metadata(s, r);
    if (s->names == NAMES_BOOK && has(s, "pos_emb.weight") && format &&
        strcmp(format, "attn-gpt") == 0 && has_gpt_variant_metadata(s))
        return read_gpt_variant_metadata(s, r);
    if (s->names == NAMES_HF_LLAMA ||
        (s->names == NAMES_BOOK && !has(s, "pos_emb.weight")))
        return attn_fail(s->ctx, ATTN_ERR_INVALID,
                         "attn_lm_load: %s holds a Llama model, whose config (n_heads, "
                         "n_kv_groups, rope_base, ...) its tensors do not give: pass a config "
                         "(config.json beside it, or a config path)", s->path);
    c->arch = ATTN_LM_GPT2;
    const char *x = s->names == NAMES_BOOK ? "" : s->prefix;
    char tok[96], pos[96];
    bool book = s->names == NAMES_BOOK;
    name_of(tok, sizeof tok, book ? "%stok_emb.weight" : "%swte.weight", x);
    name_of(pos, sizeof pos, book ? "%spos_emb.weight" : "%swpe.weight", x);
    attn_safetensors_info ti, pi;
    if (attn_safetensors_find(s->st, tok, &ti) != ATTN_OK ||
        attn_safetensors_find(s->st, pos, &pi) != ATTN_OK || ti.ndim != 2 || pi.ndim != 2)
        return attn_fail(s->ctx, ATTN_ERR_FORMAT,
                         "attn_lm_load: %s: '%s' and '%s' must be matrices", s->path, tok, pos);
    c->vocab_size = ti.shape[0];
    c->emb_dim = ti.shape[1];
    c->context_length = pi.shape[0];
    if (book) {
        attn_safetensors_info ki;
        if (attn_safetensors_find(s->st, "trf_blocks.0.att.W_key.weight", &ki) == ATTN_OK &&
            ki.ndim == 2 && ki.shape[0] != c->emb_dim)
            return attn_fail(s->ctx, ATTN_ERR_INVALID,
                             "attn_lm_load: %s holds a GPT whose W_key has %zu rows, not emb_dim "
                             "%zu (GroupedQueryAttention): its n_heads and n_kv_groups are not in "
                             "its shapes; pass a config", s->path, ki.shape[0], c->emb_dim);
        /* GroupedQueryAttention's out_proj has no bias (MultiHeadAttention's
         * has): with n_kv_groups = n_heads its shapes are GPT-2's */
        if (has(s, "trf_blocks.0.att.W_key.weight") &&
            has(s, "trf_blocks.0.att.out_proj.weight") &&
            !has(s, "trf_blocks.0.att.out_proj.bias"))
            return attn_fail(s->ctx, ATTN_ERR_INVALID,
                             "attn_lm_load: %s holds a GPT whose out_proj has no bias "
                             "(GroupedQueryAttention): its n_heads and n_kv_groups are not in its "
                             "shapes; pass a config", s->path);
        c->n_layers = count_layers(s, "trf_blocks.", ".att.W_query.weight");
        c->qkv_bias = has(s, "trf_blocks.0.att.W_query.bias");
        if (has(s, "trf_blocks.0.att.W_DKV.weight"))
            return attn_fail(s->ctx, ATTN_ERR_INVALID,
                             "attn_lm_load: %s holds a GPT with MultiHeadLatentAttention (W_DKV), "
                             "whose n_heads is not in its shapes; pass a config", s->path);
    } else {
        char before[32];
        c->n_layers = count_layers(s, name_of(before, sizeof before, "%sh.", x), ".attn.c_attn.weight");
        c->qkv_bias = true;
    }
    r->tie = !has(s, book ? "out_head.weight" : "lm_head.weight");
    /* attn_model_save writes the book's GPTModel with its cfg as metadata:
     * n_heads, which the shapes do not give, comes from there. */
    const char *heads = attn_safetensors_metadata_get(s->st, "n_heads");
    if (book && format && strcmp(format, "attn-gpt") == 0 && heads) {
        char *end;
        unsigned long long h = strtoull(heads, &end, 10);
        if (*heads < '0' || *heads > '9' || *end != '\0' || h == 0 || h > c->emb_dim ||
            c->emb_dim % h != 0)
            return attn_fail(s->ctx, ATTN_ERR_FORMAT,
                             "attn_lm_load: %s: its metadata's n_heads \"%.24s\" does not divide "
                             "emb_dim %zu", s->path, heads, c->emb_dim);
        c->n_heads = (size_t)h;
        return ATTN_OK;
    }
    if (c->emb_dim % 64 != 0)
        return attn_fail(s->ctx, ATTN_ERR_INVALID,
                         "attn_lm_load: %s: without a config n_heads is emb_dim / 64, but emb_dim "
                         "is %zu: pass a config", s->path, c->emb_dim);
    c->n_heads = c->emb_dim / 64;
    return ATTN_OK;
}

/* The file's tensor names must be the config's architecture's. */
static attn_status check_names(lm_source *s, const attn_lm_config *c) {
    bool gpt2_names = s->names == NAMES_HF_GPT2 ||
                      (s->names == NAMES_BOOK && has(s, "pos_emb.weight"));
    if (attn_lm_is_gpt(c->arch) != gpt2_names)
        return attn_fail(s->ctx, ATTN_ERR_FORMAT,
                         "attn_lm_load: the config is %s's but %s holds a %s model",
                         model_label(c->arch), s->path, gpt2_names ? "GPT-2" : "Llama");
    if ((c->arch == ATTN_LM_GPT_GQA || c->arch == ATTN_LM_GPT_MLA) && s->names != NAMES_BOOK)
        return attn_fail(s->ctx, ATTN_ERR_FORMAT,
                         "attn_lm_load: the config is the %s's, which has the book's names "
                         "only, but %s holds Hugging Face's GPT-2",
                         model_label(c->arch), s->path);
    return ATTN_OK;
}

static bool is_directory(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static bool has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* path/name in a new string. */
static char *join(const char *dir, const char *name) {
    size_t nd = strlen(dir), nn = strlen(name);
    char *out = attn_malloc(nd + nn + 2);
    if (out) {
        memcpy(out, dir, nd);
        out[nd] = '/';
        memcpy(out + nd + 1, name, nn + 1);
    }
    return out;
}

/* Whether the file carries its config, as attn_model_save writes it. */
static bool has_own_config(const lm_source *s) {
    const char *format = attn_safetensors_metadata_get(s->st, "format");
    return format && (strcmp(format, "attn-gpt") == 0 || strcmp(format, "attn-llama3") == 0);
}

/* The config and whether out_head is tied, the file's naming known: cfg,
 * else the JSON file at config_path, else the file's own metadata, else
 * the config.json beside the file (beside, or NULL), else the tensors'
 * shapes. *from: the file it was read from (NULL for cfg); *keys: the
 * names its values were read under. */
static attn_status choose_config(lm_source *s, const char *config_path, const char *beside,
                                 const attn_lm_config *cfg, attn_lm_config *out,
                                 const char **from, attn_lm_config_keys *keys) {
    lm_config_read r = {.tie = -1, .keys = attn_lm_config_fields};
    attn_status st;
    *from = NULL;
    if (cfg) {
        r.cfg = *cfg;
        r.tie = cfg->tie_embeddings ? 1 : 0;
        st = ATTN_OK;
    } else if (config_path) {
        st = read_config(s->ctx, *from = config_path, &r);
    } else if (beside && !has_own_config(s)) {
        /* a file's shapes give neither GPT-2's heads nor Llama's config */
        st = read_config(s->ctx, *from = beside, &r);
    } else {
        *from = s->path;
        st = infer_config(s, &r);
    }
    if (st != ATTN_OK) return st;
    if ((st = check_names(s, &r.cfg)) != ATTN_OK) return st;
    const char *head = s->names == NAMES_BOOK ? "out_head.weight" : "lm_head.weight";
    if (r.tie < 0) r.tie = !has(s, head); /* no head stored: tied (save_pretrained drops it) */
    r.cfg.tie_embeddings = r.tie == 1;
    *out = r.cfg;
    *keys = r.keys;
    return ATTN_OK;
}

/* The dtype the file's token embedding is stored in, as a weights dtype:
 * BF16 or F16 as it is, anything else F32. */
static attn_dtype file_dtype(lm_source *s) {
    const char *names[] = {"tok_emb.weight", "model.embed_tokens.weight", "wte.weight",
                           "transformer.wte.weight"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        attn_safetensors_info info;
        if (attn_safetensors_find(s->st, names[i], &info) == ATTN_OK)
            return is_half(info.dtype) ? info.dtype : ATTN_DTYPE_F32;
    }
    return ATTN_DTYPE_F32;
}

/* ---- the file's tensors against the config ---------------------------------- */

/* The file's tensor names the loader reads for c, in the file's naming,
 * each told to visit with the shape the loader reads it as (tied: a head
 * the file may leave out) until it returns false. */
static void list_file_names(lm_source *s, const attn_lm_config *c, attn_lm_name_fn visit,
                            void *user) {
    if (s->names == NAMES_BOOK) {
        attn_lm_list_names(c, visit, user);
        return;
    }
    char n[160];
    bool gpt2 = s->names == NAMES_HF_GPT2;
    const char *x = gpt2 ? s->prefix : "model.";
    size_t C = c->emb_dim, H = c->hidden_dim, kvw = c->n_kv_groups * (C / c->n_heads);
    typedef struct { const char *name; size_t rows, cols; } file_tensor;
    /* GPT-2's Conv1D weights are stored (in, out) */
    const file_tensor gpt2_block[] = {
        {"attn.c_attn.weight", C, 3 * C}, {"attn.c_attn.bias", 3 * C, 0},
        {"attn.c_proj.weight", C, C},     {"attn.c_proj.bias", C, 0},
        {"mlp.c_fc.weight", C, H},        {"mlp.c_fc.bias", H, 0},
        {"mlp.c_proj.weight", H, C},      {"mlp.c_proj.bias", C, 0},
        {"ln_1.weight", C, 0},            {"ln_1.bias", C, 0},
        {"ln_2.weight", C, 0},            {"ln_2.bias", C, 0}};
    const file_tensor llama_block[] = {
        {"self_attn.q_proj.weight", C, C},   {"self_attn.k_proj.weight", kvw, C},
        {"self_attn.v_proj.weight", kvw, C}, {"self_attn.o_proj.weight", C, C},
        {"mlp.gate_proj.weight", H, C},      {"mlp.up_proj.weight", H, C},
        {"mlp.down_proj.weight", C, H},      {"input_layernorm.weight", C, 0},
        {"post_attention_layernorm.weight", C, 0}};
    const file_tensor *block = gpt2 ? gpt2_block : llama_block;
    size_t per_block = gpt2 ? sizeof gpt2_block / sizeof *gpt2_block
                            : sizeof llama_block / sizeof *llama_block;
    if (!visit(user, name_of(n, sizeof n, gpt2 ? "%swte.weight" : "%sembed_tokens.weight", x),
               false, c->vocab_size, C))
        return;
    if (gpt2 && !visit(user, name_of(n, sizeof n, "%swpe.weight", x), false, c->context_length,
                       C))
        return;
    for (size_t i = 0; i < c->n_layers; i++)
        for (size_t j = 0; j < per_block; j++) {
            if (gpt2 && j == 1 && !c->qkv_bias) continue;
            if (!visit(user, name_of(n, sizeof n, gpt2 ? "%sh.%zu.%s" : "%slayers.%zu.%s", x, i,
                                     block[j].name),
                       false, block[j].rows, block[j].cols))
                return;
        }
    if (!visit(user, name_of(n, sizeof n, gpt2 ? "%sln_f.weight" : "%snorm.weight", x), false, C,
               0) ||
        (gpt2 && !visit(user, name_of(n, sizeof n, "%sln_f.bias", x), false, C, 0)))
        return;
    visit(user, "lm_head.weight", c->tie_embeddings, c->vocab_size, C);
}

/* Tensors a checkpoint carries that are not parameters, which
 * load_state_dict never sees either: GPT-2's causal-mask buffers
 * (h.N.attn.bias, h.N.attn.masked_bias, saved by older transformers),
 * Llama's RoPE table (rotary_emb.inv_freq) and the book's causal mask
 * (trf_blocks.N.att.mask, a buffer its state_dict holds). */
static bool is_buffer(const lm_source *s, const char *name) {
    static const char *const gpt2[] = {".attn.bias", ".attn.masked_bias"};
    static const char *const llama[] = {".rotary_emb.inv_freq"};
    static const char *const book[] = {".att.mask"};
    const char *const *ends = s->names == NAMES_HF_GPT2   ? gpt2
                              : s->names == NAMES_HF_LLAMA ? llama
                                                           : book;
    size_t count = s->names == NAMES_HF_GPT2 ? 2 : 1;
    size_t n = strlen(name);
    for (size_t i = 0; i < count; i++) {
        size_t e = strlen(ends[i]);
        if (n > e && strcmp(name + n - e, ends[i]) == 0) return true;
    }
    return false;
}

typedef struct tensor_check {
    lm_source *s;
    bool *used;       /* per tensor of the file */
    char missing[160];
    bool found_all;
    attn_status shape; /* the first tensor of another shape, refused */
} tensor_check;

static bool expect_tensor(void *user, const char *name, bool tied, size_t rows, size_t cols) {
    tensor_check *t = user;
    attn_safetensors_info info;
    if (attn_safetensors_find(t->s->st, name, &info) == ATTN_OK) {
        t->used[info.index] = true;
        /* a tied head the file holds anyway must be the embedding
         * (check_tied_head): of its shape first */
        t->shape = check_shape(t->s, name, &info, rows, cols);
        return t->shape == ATTN_OK;
    }
    if (tied) return true;
    snprintf(t->missing, sizeof t->missing, "%s", name);
    t->found_all = false;
    return false;
}

/* Every tensor c needs is in the file, of the shape c gives it, and
 * (strict) the file holds no other, but for the buffers above and a tied
 * head: checked by name and shape before the model is allocated, so that
 * a config or a file naming more layers than the file holds, or sizes
 * that its tensors do not have, is refused at once. The listing stops at
 * the first name missing or of another shape, and each name found is a
 * distinct tensor of the file, so it visits at most the file's count plus
 * two names, whatever n_layers says. */
static attn_status check_tensors(lm_source *s, const attn_lm_config *c,
                                 const attn_lm_config_keys *keys, bool strict) {
    size_t count = attn_safetensors_count(s->st);
    tensor_check t = {.s = s, .used = attn_calloc(count ? count : 1, sizeof(bool)),
                      .found_all = true};
    if (!t.used)
        return attn_fail(s->ctx, ATTN_ERR_NO_MEMORY, "attn_lm_load: out of memory for %zu "
                         "tensor names", count);
    list_file_names(s, c, expect_tensor, &t);
    attn_status st = t.shape; /* a tensor of another shape: refused, named */
    if (st == ATTN_OK && !t.found_all) {
        st = attn_fail(s->ctx, ATTN_ERR_NOT_FOUND,
                       "attn_lm_load: %s has no tensor '%s', which a %s model of %s %zu "
                       "needs (the file holds %zu tensors)",
                       s->path, t.missing, model_label(c->arch), keys->n_layers,
                       c->n_layers, count);
    } else if (st == ATTN_OK && strict) {
        size_t unused = 0;
        char names[256] = "";
        for (size_t i = 0; i < count; i++) {
            attn_safetensors_info info;
            if (t.used[i] || attn_safetensors_info_at(s->st, i, &info) != ATTN_OK ||
                is_buffer(s, info.name))
                continue;
            if (++unused > 3) continue;
            char name[64]; /* whole characters, a cut marked */
            attn_escape_text(name, sizeof name, info.name, strlen(info.name));
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s'%s'",
                     unused > 1 ? ", " : "", name);
        }
        if (unused > 3)
            snprintf(names + strlen(names), sizeof names - strlen(names), " and %zu more",
                     unused - 3);
        if (unused)
            st = attn_fail(s->ctx, ATTN_ERR_FORMAT,
                           "attn_lm_load: %s holds %zu tensor%s the %s model of %s %zu "
                           "does not use: %s (non-strict loading ignores them)",
                           s->path, unused, unused > 1 ? "s" : "",
                           model_label(c->arch), keys->n_layers, c->n_layers, names);
    }
    attn_free(t.used);
    return st;
}

/* A file attn_model_save wrote (attn train --save): another family of
 * model, which these names and this loader do not describe. */
static attn_status refuse_train_model(lm_source *s) {
    const char *format = attn_safetensors_metadata_get(s->st, "format");
    if (!format || strcmp(format, "attn-lm") != 0) return ATTN_OK;
    const char *attention = attn_safetensors_metadata_get(s->st, "attention");
    const char *layers = attn_safetensors_metadata_get(s->st, "n_layers");
    const char *width = attn_safetensors_metadata_get(s->st, "d_model");
    return attn_fail(s->ctx, ATTN_ERR_FORMAT,
                     "attn_lm_load: %s holds a model saved by attn_model_save (attn train "
                     "--save; \"format\": \"attn-lm\", attention %.16s, d_model %.24s, "
                     "n_layers %.24s), not the book's GPT-2 or Llama 3: load it with "
                     "attn_model_load into an attn_model of that config",
                     s->path, attention ? attention : "?", width ? width : "?",
                     layers ? layers : "?");
}

/* st, the refusal of a config's values, which attn_lm_config_resolve
 * names by the file's keys, with the file they were read from. */
static attn_status name_config_file(attn_ctx *ctx, attn_status st, const char *from) {
    char said[ATTN_ERROR_CAPACITY];
    snprintf(said, sizeof said, "%s", attn_ctx_last_error(ctx));
    return attn_fail(ctx, st, "%s (the config read from %s)", said, from);
}

/* attn_lm_load (file_dtype: weights_dtype ignored, the file's taken) and
 * attn_lm_load_as. */
static attn_status load(attn_ctx *ctx, const char *who, const char *path, const char *config_json,
                        const attn_lm_config *cfg, bool file_dtype_wanted,
                        attn_dtype weights_dtype, bool strict, attn_lm **out) {
    if (!ctx || !path || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: %s is NULL", who,
                         !ctx ? "ctx" : !path ? "path" : "out");
    attn_clear_error(ctx);
    *out = NULL;
    char *weights_path = NULL, *dir_config = NULL;
    const char *weights = path, *config_path = cfg ? NULL : config_json, *beside = NULL;
    /* a sharded checkpoint: its index, given or in the directory */
    bool sharded = false;
    if (is_directory(path)) {
        weights_path = join(path, "model.safetensors");
        dir_config = join(path, "config.json");
        if (weights_path && !is_file(weights_path)) {
            char *index = join(path, "model.safetensors.index.json");
            if (index && is_file(index)) {
                attn_free(weights_path);
                weights_path = index;
                sharded = true;
            } else {
                attn_free(index);
            }
        }
        if (!weights_path || !dir_config) {
            attn_free(weights_path);
            attn_free(dir_config);
            return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_lm_load: out of memory");
        }
        weights = weights_path;
        if (!cfg && !config_path && is_file(dir_config)) config_path = dir_config;
    } else {
        sharded = has_suffix(path, ".safetensors.index.json");
        /* the config.json beside the index, as in a directory of them, or
         * beside a file (choose_config) */
        const char *slash = strrchr(path, '/');
        size_t n = slash ? (size_t)(slash - path) : 1;
        if (!cfg && !config_path) {
            char *dir = attn_malloc(n + 1);
            if (dir) {
                memcpy(dir, slash ? path : ".", n);
                dir[n] = '\0';
                dir_config = join(dir, "config.json");
                attn_free(dir);
            }
            if (!dir_config) return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory", who);
        }
        if (dir_config && is_file(dir_config)) {
            if (sharded) config_path = dir_config;
            else beside = dir_config;
        }
    }
    lm_source s = {.ctx = ctx, .path = weights};
    const char *from = NULL;
    attn_lm *m = NULL;
    attn_lm_config c;
    attn_lm_config_keys keys = attn_lm_config_fields;
    attn_status st = sharded ? attn_safetensors_open_index(ctx, weights, &s.st)
                             : attn_safetensors_open(ctx, weights, &s.st);
    if (st == ATTN_OK) st = refuse_train_model(&s);
    if (st == ATTN_OK) st = detect_names(&s);
    if (st == ATTN_OK)
        st = choose_config(&s, config_path, beside, cfg, &c, &from, &keys);
    if (st == ATTN_OK) {
        c.weights_dtype = file_dtype_wanted ? file_dtype(&s) : weights_dtype;
        attn_lm_config resolved;
        st = attn_lm_config_resolve(ctx, who, &c, &keys, &resolved);
        if (st != ATTN_OK && from) st = name_config_file(ctx, st, from);
        if (st == ATTN_OK) st = check_tensors(&s, &resolved, &keys, strict);
        if (st == ATTN_OK) st = attn_lm_create(ctx, who, &c, &m);
    }
    if (st == ATTN_OK) {
        st = s.names == NAMES_BOOK       ? load_book(&s, m)
             : s.names == NAMES_HF_GPT2 ? load_hf_gpt2(&s, m)
                                         : load_hf_llama(&s, m);
        if (st == ATTN_OK) st = check_tied_head(&s, m);
    }
    attn_safetensors_free(s.st);
    attn_free(s.scratch);
    attn_free(s.row);
    attn_free(weights_path);
    attn_free(dir_config);
    if (st != ATTN_OK) {
        attn_lm_free(m);
        return st;
    }
    *out = m;
    return ATTN_OK;
}

attn_status attn_lm_load(attn_ctx *ctx, const char *path, const char *config_json,
                         const attn_lm_config *cfg, attn_lm **out) {
    return load(ctx, "attn_lm_load", path, config_json, cfg, true, ATTN_DTYPE_F32, true, out);
}

attn_status attn_lm_load_as(attn_ctx *ctx, const char *path, const char *config_json,
                            const attn_lm_config *cfg, attn_dtype weights_dtype, attn_lm **out) {
    return load(ctx, "attn_lm_load_as", path, config_json, cfg, false, weights_dtype, true, out);
}

attn_status attn_lm_load_ex(attn_ctx *ctx, const char *path, const char *config_json,
                            const attn_lm_config *cfg, attn_dtype weights_dtype, unsigned flags,
                            attn_lm **out) {
    const unsigned known = ATTN_LM_LOAD_FILE_DTYPE | ATTN_LM_LOAD_NON_STRICT;
    if (flags & ~known) {
        if (out) *out = NULL;
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "attn_lm_load_ex: flags 0x%x has bits past ATTN_LM_LOAD_FILE_DTYPE | "
                         "ATTN_LM_LOAD_NON_STRICT (0x%x)", flags, known);
    }
    return load(ctx, "attn_lm_load_ex", path, config_json, cfg,
                (flags & ATTN_LM_LOAD_FILE_DTYPE) != 0, weights_dtype,
                (flags & ATTN_LM_LOAD_NON_STRICT) == 0, out);
}

attn_status attn_lm_save(attn_lm *m, const char *path) {
    if (!m) return ATTN_ERR_NULL;
    attn_clear_error(m->ctx);
    if (!path) return attn_fail(m->ctx, ATTN_ERR_NULL, "attn_lm_save: path is NULL");
    if (m->cfg.weights_dtype == ATTN_DTYPE_F32)
        return attn_safetensors_write_params(m->ctx, path, m->params, m->num_params, NULL);
    /* the writer takes float32: the 16-bit tensors widened (exactly) into
     * one block beside the model's, for the call */
    attn_param *params = attn_calloc(m->num_params, sizeof *params);
    float *wide = attn_alloc_floats(m->num_weights16 ? m->num_weights16 : 1);
    if (!params || !wide) {
        attn_free(params);
        attn_free(wide);
        return attn_fail(m->ctx, ATTN_ERR_NO_MEMORY,
                         "attn_lm_save: out of memory widening %zu 16-bit weights",
                         m->num_weights16);
    }
    for (size_t i = 0; i < m->num_params; i++) {
        params[i] = m->params[i];
        if (m->stored[i].dtype == ATTN_DTYPE_F32) continue;
        size_t at = (size_t)((const uint16_t *)m->stored[i].data - m->weights16);
        const uint16_t *h = m->stored[i].data;
        for (size_t j = 0; j < params[i].numel; j++)
            wide[at + j] = attn_half_to_float(m->stored[i].dtype, h[j]);
        params[i].data = wide + at;
    }
    attn_status st = attn_safetensors_write_params(m->ctx, path, params, m->num_params, NULL);
    attn_free(params);
    attn_free(wide);
    return st;
}
