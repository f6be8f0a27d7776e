/*
 * save.c — the small model's parameters in a safetensors file, through the
 * library's safetensors writer and reader (src/io/safetensors.c):
 *   tensors   every parameter under its state_dict name, float32, in the
 *             layout safetensors.torch.save_file gives (sorted by name);
 *   metadata  "format": "attn-lm" and the attn_model_config, as strings
 *             (vocab_size, context_length, d_model, n_layers, n_heads,
 *             attention "mha"|"gpt2", mlp, qkv_bias, dropout); for the
 *             book's GPTModel "format": "attn-gpt" and the book's cfg
 *             keys (vocab_size, context_length, emb_dim, n_heads, n_layers,
 *             drop_rate, qkv_bias), which src/lm's loader reads as the config,
 *             and the book's mask buffers (trf_blocks.N.att.mask (T, T),
 *             ones above the diagonal), which GPTModel's state_dict holds
 *             and load_state_dict(strict=True) wants; chapter 4's bonus
 *             GPTs add their cfg keys (n_kv_groups; latent_dim, null for
 *             the module's default; sliding_window_size and
 *             sliding_window_stride) and have no mask buffers; for the book's
 *             Llama3Model "format": "attn-llama3" and its cfg keys
 *             (vocab_size, context_length, emb_dim, n_heads, n_layers,
 *             hidden_dim, n_kv_groups, rope_base, rope_freq: the book's dict
 *             as JSON, or null), no buffers (its cos and sin are not
 *             persistent, its mask is made in the forward).
 * PyTorch reads it with safetensors.torch.load_file and load_state_dict.
 */
#include "internal.h"
#include "io/json.h"
#include "io/safetensors_internal.h"
#include "modules/module.h"
#include "train/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { META_COUNT = 10, GPT_META_COUNT = 8, GPT_VARIANT_META = 2, LLAMA3_META_COUNT = 10,
       META_MAX = 10 };
_Static_assert(META_COUNT <= META_MAX && GPT_META_COUNT + GPT_VARIANT_META <= META_MAX &&
                   LLAMA3_META_COUNT <= META_MAX,
               "META_MAX holds every kind's metadata");

typedef struct meta_values {
    char vocab_size[24], context_length[24], d_model[24], n_layers[24], n_heads[24];
    char dropout[32];
    char hidden_dim[24], n_kv_groups[24], rope_base[32], rope_freq[256];
    char latent_dim[24], window[24], stride[24];
} meta_values;

/* The numbers both kinds of file carry, as the metadata's strings. */
static void format_values(meta_values *v, size_t vocab_size, size_t context_length,
                          size_t width, size_t n_layers, size_t n_heads, double dropout) {
    snprintf(v->vocab_size, sizeof v->vocab_size, "%zu", vocab_size);
    snprintf(v->context_length, sizeof v->context_length, "%zu", context_length);
    snprintf(v->d_model, sizeof v->d_model, "%zu", width);
    snprintf(v->n_layers, sizeof v->n_layers, "%zu", n_layers);
    snprintf(v->n_heads, sizeof v->n_heads, "%zu", n_heads);
    attn_json_format_double(v->dropout, sizeof v->dropout, dropout);
}

/* The metadata entries of the book's GPTModel; their strings live in v. */
static size_t describe_gpt(const attn_gpt_config *c, meta_values *v, attn_metadata_entry *out) {
    format_values(v, c->vocab_size, c->context_length, c->emb_dim, c->n_layers, c->n_heads,
                  c->drop_rate);
    attn_metadata_entry entries[GPT_META_COUNT] = {
        {"format", "attn-gpt"},
        {"vocab_size", v->vocab_size},
        {"context_length", v->context_length},
        {"emb_dim", v->d_model},
        {"n_heads", v->n_heads},
        {"n_layers", v->n_layers},
        {"drop_rate", v->dropout},
        {"qkv_bias", c->qkv_bias ? "true" : "false"},
    };
    memcpy(out, entries, sizeof entries);
    size_t n = GPT_META_COUNT;
    if (c->attention == ATTN_GPT_GQA) {
        snprintf(v->n_kv_groups, sizeof v->n_kv_groups, "%zu", c->n_kv_groups);
        out[n++] = (attn_metadata_entry){"n_kv_groups", v->n_kv_groups};
    } else if (c->attention == ATTN_GPT_MLA) {
        if (c->latent_dim)
            snprintf(v->latent_dim, sizeof v->latent_dim, "%zu", c->latent_dim);
        else
            snprintf(v->latent_dim, sizeof v->latent_dim, "null");
        out[n++] = (attn_metadata_entry){"latent_dim", v->latent_dim};
    } else if (c->attention == ATTN_GPT_SWA) {
        snprintf(v->window, sizeof v->window, "%zu", c->sliding_window_size);
        snprintf(v->stride, sizeof v->stride, "%lld", (long long)c->sliding_window_stride);
        out[n++] = (attn_metadata_entry){"sliding_window_size", v->window};
        out[n++] = (attn_metadata_entry){"sliding_window_stride", v->stride};
    }
    return n;
}

/* The metadata entries of the book's Llama3Model; their strings live in v. */
static size_t describe_llama3(const attn_llama3_config *c, meta_values *v,
                              attn_metadata_entry *out) {
    format_values(v, c->vocab_size, c->context_length, c->emb_dim, c->n_layers, c->n_heads, 0.0);
    snprintf(v->hidden_dim, sizeof v->hidden_dim, "%zu", c->hidden_dim);
    snprintf(v->n_kv_groups, sizeof v->n_kv_groups, "%zu", c->n_kv_groups);
    attn_json_format_double(v->rope_base, sizeof v->rope_base, c->rope_base);
    if (c->rope_factor > 0.0) {
        char factor[32], low[32], high[32];
        attn_json_format_double(factor, sizeof factor, c->rope_factor);
        attn_json_format_double(low, sizeof low, c->rope_low_freq_factor);
        attn_json_format_double(high, sizeof high, c->rope_high_freq_factor);
        snprintf(v->rope_freq, sizeof v->rope_freq,
                 "{\"factor\": %s, \"low_freq_factor\": %s, \"high_freq_factor\": %s, "
                 "\"original_context_length\": %zu}",
                 factor, low, high, c->rope_original_context_length);
    } else {
        snprintf(v->rope_freq, sizeof v->rope_freq, "null");
    }
    attn_metadata_entry entries[LLAMA3_META_COUNT] = {
        {"format", "attn-llama3"},
        {"vocab_size", v->vocab_size},
        {"context_length", v->context_length},
        {"emb_dim", v->d_model},
        {"n_heads", v->n_heads},
        {"n_layers", v->n_layers},
        {"hidden_dim", v->hidden_dim},
        {"n_kv_groups", v->n_kv_groups},
        {"rope_base", v->rope_base},
        {"rope_freq", v->rope_freq},
    };
    memcpy(out, entries, sizeof entries);
    return LLAMA3_META_COUNT;
}

/* The metadata entries of cfg; their strings live in v. */
static void describe(const attn_model_config *c, meta_values *v, attn_metadata_entry *out) {
    format_values(v, c->vocab_size, c->context_length, c->d_model, c->n_layers, c->n_heads,
                  c->dropout);
    attn_metadata_entry entries[META_COUNT] = {
        {"format", "attn-lm"},
        {"vocab_size", v->vocab_size},
        {"context_length", v->context_length},
        {"d_model", v->d_model},
        {"n_layers", v->n_layers},
        {"n_heads", v->n_heads},
        {"attention", attn_module_kind_name(c->attention)},
        {"mlp", c->mlp ? "true" : "false"},
        {"qkv_bias", c->qkv_bias ? "true" : "false"},
        {"dropout", v->dropout},
    };
    memcpy(out, entries, sizeof entries);
}

/* The metadata entries of m's config (at most META_MAX); their strings
 * live in v. Returns how many. */
static size_t describe_model(const attn_model *m, meta_values *v, attn_metadata_entry *out) {
    attn_gpt_config g;
    if (attn_model_is_gpt(m) && attn_model_get_gpt_config(m, &g) == ATTN_OK)
        return describe_gpt(&g, v, out);
    attn_llama3_config l;
    if (attn_model_is_llama3(m) && attn_model_get_llama3_config(m, &l) == ATTN_OK)
        return describe_llama3(&l, v, out);
    attn_model_config cfg = attn_model_get_config(m);
    describe(&cfg, v, out);
    return META_COUNT;
}

/* The book's MultiHeadAttention's mask buffer: torch.triu(torch.ones(T, T),
 * diagonal=1). */
static float *new_causal_mask(size_t T) {
    float *mask = attn_alloc_floats(T * T);
    if (mask)
        for (size_t i = 0; i < T; i++)
            for (size_t j = 0; j < T; j++) mask[i * T + j] = j > i ? 1.0f : 0.0f;
    return mask;
}

/* How many mask buffers m's file holds: one a block for the book's
 * GPTModel with MultiHeadAttention, whose mask is a persistent buffer; the
 * bonus GPTs make theirs in the forward. */
static size_t mask_buffers(const attn_model *m) {
    attn_gpt_config g;
    if (!attn_model_is_gpt(m) || attn_model_get_gpt_config(m, &g) != ATTN_OK ||
        g.attention != ATTN_GPT_MHA)
        return 0;
    return g.n_layers;
}

/* The name of layer l's mask buffer. */
static void mask_name(char *buf, size_t size, size_t layer) {
    snprintf(buf, size, "trf_blocks.%zu.att.mask", layer);
}

enum { MASK_NAME_MAX = 48 };

attn_status attn_model_save(attn_model *m, const char *path) {
    return attn_model_save_to(m, NULL, path);
}

attn_status attn_model_save_to(attn_model *m, attn_file *file, const char *path) {
    if (!m) return ATTN_ERR_NULL;
    attn_ctx *ctx = attn_model_ctx(m);
    attn_clear_error(ctx);
    if (!path) return attn_fail(ctx, ATTN_ERR_NULL, "attn_model_save: path is NULL");
    const attn_param *params;
    size_t count;
    attn_status st = attn_model_params(m, &params, &count);
    if (st != ATTN_OK) return st;
    attn_model_config cfg = attn_model_get_config(m);
    size_t masks = mask_buffers(m), T = cfg.context_length;
    attn_named_tensor *tensors = attn_calloc(count + masks, sizeof *tensors);
    char (*names)[MASK_NAME_MAX] = attn_calloc(masks ? masks : 1, sizeof *names);
    float *mask = masks ? new_causal_mask(T) : NULL;
    if (!tensors || !names || (masks && !mask)) {
        attn_free(tensors);
        attn_free(names);
        attn_free(mask);
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_model_save: out of memory");
    }
    for (size_t i = 0; i < count; i++) {
        tensors[i] = (attn_named_tensor){.name = params[i].name, .data = params[i].data,
                                         .ndim = params[i].ndim};
        for (size_t d = 0; d < params[i].ndim; d++) tensors[i].shape[d] = params[i].shape[d];
    }
    for (size_t l = 0; l < masks; l++) {
        mask_name(names[l], MASK_NAME_MAX, l);
        tensors[count + l] = (attn_named_tensor){.name = names[l], .data = mask, .ndim = 2,
                                                 .shape = {T, T}};
    }
    meta_values values;
    attn_metadata_entry meta[META_MAX];
    size_t n_meta = describe_model(m, &values, meta);
    st = file ? attn_safetensors_write_to(ctx, file, path, tensors, count + masks, meta, n_meta)
              : attn_safetensors_write(ctx, path, tensors, count + masks, meta, n_meta);
    attn_free(tensors);
    attn_free(names);
    attn_free(mask);
    return st;
}

/* "(16, 17)": a shape, cut where buf ends. */
static void shape_text(char *buf, size_t size, size_t ndim, const size_t *shape) {
    size_t used = (size_t)snprintf(buf, size, "(");
    for (size_t d = 0; d < ndim && used < size; d++)
        used += (size_t)snprintf(buf + used, size - used, d ? ", %zu" : "%zu", shape[d]);
    if (used < size) snprintf(buf + used, size - used, ")");
}

/* The width a "latent_dim" entry stands for: null is the book's default,
 * max(16, emb_dim / 8), which a model built with latent_dim 0 also takes. */
static bool latent_width(const char *value, size_t emb_dim, size_t *width) {
    if (strcmp(value, "null") == 0) {
        *width = attn_mla_latent_width(emb_dim, 0);
        return true;
    }
    char *end;
    unsigned long long n = strtoull(value, &end, 10);
    if (end == value || *end != '\0' || value[0] == '-') return false;
    *width = (size_t)n;
    return *width == n;
}

/* Whether the file's metadata value got says what this model's want says:
 * the same string, or for latent_dim the same width (the book's cfg may name
 * the default as null or as its number). */
static bool metadata_agrees(const attn_model *m, const char *key, const char *got,
                            const char *want) {
    if (strcmp(got, want) == 0) return true;
    if (strcmp(key, "latent_dim") != 0) return false;
    size_t emb_dim = attn_model_get_config(m).d_model, a, b;
    return latent_width(got, emb_dim, &a) && latent_width(want, emb_dim, &b) && a == b;
}

/* attn_model_load, and where dropout_too the dropout rate must agree as
 * well (attn_model_load_run). */
static attn_status load(attn_model *m, const char *path, bool dropout_too) {
    if (!m) return ATTN_ERR_NULL;
    attn_ctx *ctx = attn_model_ctx(m);
    attn_clear_error(ctx);
    if (!path) return attn_fail(ctx, ATTN_ERR_NULL, "attn_model_load: path is NULL");
    const attn_param *params;
    size_t count;
    attn_status st = attn_model_params(m, &params, &count);
    if (st != ATTN_OK) return st;
    attn_safetensors *file;
    if ((st = attn_safetensors_open(ctx, path, &file)) != ATTN_OK) return st;

    /* A file that says it is an attn model must describe this one: shapes
     * alone do not tell n_heads or the attention kind apart. */
    meta_values values;
    attn_metadata_entry want[META_MAX];
    size_t n_meta = describe_model(m, &values, want);
    const char *format = attn_safetensors_metadata_get(file, "format");
    for (size_t i = 1; format && strcmp(format, want[0].value) == 0 && i < n_meta; i++) {
        const char *got = attn_safetensors_metadata_get(file, want[i].key);
        /* not part of the weights */
        if (!dropout_too &&
            (strcmp(want[i].key, "dropout") == 0 || strcmp(want[i].key, "drop_rate") == 0))
            continue;
        if (got && !metadata_agrees(m, want[i].key, got, want[i].value)) {
            /* the message first: got belongs to the file */
            st = attn_fail(ctx, ATTN_ERR_SHAPE,
                           "attn_model_load: '%s' holds a model with %s %s, this model has %s",
                           path, want[i].key, got, want[i].value);
            attn_safetensors_free(file);
            return st;
        }
    }
    /* load_state_dict(strict=True): every parameter, with its shape, and
     * nothing else; nothing changes unless all of it loads. */
    size_t total = attn_model_num_scalars(m);
    float *staged = attn_alloc_floats(total);
    if (!staged) {
        attn_safetensors_free(file);
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_model_load: out of memory");
    }
    /* the book's GPTModel's file also holds its mask buffers, which
     * load_state_dict would copy in: one that is not the causal mask would
     * make PyTorch's model attend otherwise than this one */
    attn_model_config mc = attn_model_get_config(m);
    size_t masks = mask_buffers(m), T = mc.context_length, TT = 0;
    if (masks && (!attn_mul_size(T, T, &TT) || !attn_floats_fit(TT)))
        st = attn_fail(ctx, ATTN_ERR_OVERFLOW,
                       "attn_model_load: the mask buffers (%zu, %zu) overflow size_t", T, T);
    float *mask = masks && st == ATTN_OK ? attn_alloc_floats(TT) : NULL;
    if (masks && st == ATTN_OK && !mask)
        st = attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_model_load: out of memory");
    for (size_t l = 0; st == ATTN_OK && l < masks; l++) {
        char name[MASK_NAME_MAX];
        mask_name(name, sizeof name, l);
        attn_safetensors_info info;
        if (attn_safetensors_find(file, name, &info) != ATTN_OK || info.ndim != 2 ||
            info.shape[0] != T || info.shape[1] != T) {
            st = attn_fail(ctx, ATTN_ERR_SHAPE,
                           "attn_model_load: '%s' has no tensor '%s' of shape (%zu, %zu)", path,
                           name, T, T);
            break;
        }
        st = attn_safetensors_load(file, info.index, mask, TT);
        for (size_t i = 0; st == ATTN_OK && i < TT; i++)
            if (mask[i] != (i % T > i / T ? 1.0f : 0.0f))
                st = attn_fail(ctx, ATTN_ERR_FORMAT,
                               "attn_model_load: '%s': %s is not the causal mask "
                               "triu(ones(%zu, %zu), diagonal=1): element (%zu, %zu) is %g",
                               path, name, T, T, i / T, i % T, (double)mask[i]);
    }
    attn_free(mask);
    size_t offset = 0;
    for (size_t i = 0; st == ATTN_OK && i < count; i++) {
        const attn_param *p = &params[i];
        attn_safetensors_info info;
        if ((st = attn_safetensors_find(file, p->name, &info)) != ATTN_OK) {
            st = attn_fail(ctx, ATTN_ERR_NOT_FOUND, "attn_model_load: '%s' has no tensor '%s'",
                           path, p->name);
            break;
        }
        bool same = info.ndim == p->ndim;
        for (size_t d = 0; same && d < p->ndim; d++) same = info.shape[d] == p->shape[d];
        if (!same) {
            char has[96], model_shape[96];
            shape_text(has, sizeof has, info.ndim, info.shape);
            shape_text(model_shape, sizeof model_shape, p->ndim, p->shape);
            st = attn_fail(ctx, ATTN_ERR_SHAPE,
                           "attn_model_load: '%s': %s has shape %s, the model's is %s", path,
                           p->name, has, model_shape);
            break;
        }
        st = attn_safetensors_load(file, info.index, staged + offset, p->numel);
        offset += p->numel;
    }
    /* every parameter there: a tensor more is one the model does not have */
    for (size_t i = 0; st == ATTN_OK && attn_safetensors_count(file) != count + masks &&
                       i < attn_safetensors_count(file);
         i++) {
        attn_safetensors_info info;
        if (attn_safetensors_info_at(file, i, &info) != ATTN_OK) continue;
        bool known = false;
        for (size_t k = 0; !known && k < count; k++) known = strcmp(info.name, params[k].name) == 0;
        for (size_t l = 0; !known && l < masks; l++) {
            char name[MASK_NAME_MAX];
            mask_name(name, sizeof name, l);
            known = strcmp(info.name, name) == 0;
        }
        if (!known)
            st = attn_fail(ctx, ATTN_ERR_SHAPE,
                           "attn_model_load: '%s' holds '%s', which the model has not (%zu "
                           "tensors, the model %zu parameters%s)",
                           path, info.name, attn_safetensors_count(file), count,
                           masks ? " and a mask buffer per block" : "");
    }
    if (st == ATTN_OK) {
        offset = 0;
        for (size_t i = 0; i < count; i++) {
            memcpy(params[i].data, staged + offset, params[i].numel * sizeof(float));
            offset += params[i].numel;
        }
        attn_model_forget_forward(m);
    }
    attn_free(staged);
    attn_safetensors_free(file);
    return st;
}

attn_status attn_model_load(attn_model *m, const char *path) { return load(m, path, false); }

attn_status attn_model_load_run(attn_model *m, const char *path) { return load(m, path, true); }
