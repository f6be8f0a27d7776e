/*
 * gpt2_hf.c — one layer's attention of a Hugging Face GPT-2 checkpoint.
 *
 * transformers' GPT2Attention keeps its projections in Conv1D modules,
 * whose weight is (in_features, out_features): y = x @ W + b, the transpose
 * of nn.Linear's (out, in). In model.safetensors, layer N's attention is
 *   [transformer.]h.N.attn.c_attn.weight (C, 3C)   c_attn.bias (3C)
 *   [transformer.]h.N.attn.c_proj.weight (C, C)    c_proj.bias (C)
 * ("transformer." in GPT2LMHeadModel checkpoints, none in GPT2Model's).
 * attn's CausalSelfAttention stores c_attn.weight (3C, C) and c_proj.weight
 * (C, C) in nn.Linear layout, so loading and saving transpose the weights;
 * the biases are the same. The q, k, v column blocks of c_attn are in the
 * same order in both (split(C, dim=2)).
 */
#include "internal.h"

#include "io/safetensors_internal.h"
#include "modules/module.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { C_ATTN_WEIGHT, C_ATTN_BIAS, C_PROJ_WEIGHT, C_PROJ_BIAS, NUM_TENSORS };

static const char *const suffixes[NUM_TENSORS] = {"c_attn.weight", "c_attn.bias",
                                                  "c_proj.weight", "c_proj.bias"};

/* dst (cols, rows) = src (rows, cols)^T */
static void transpose(const float *src, float *dst, size_t rows, size_t cols) {
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) dst[c * rows + r] = src[r * cols + c];
}

/* The highest N with an h.N.attn.c_attn.weight, plus one (0: none). */
static size_t count_layers(attn_safetensors *st) {
    size_t layers = 0;
    for (size_t i = 0; i < attn_safetensors_count(st); i++) {
        attn_safetensors_info info;
        if (attn_safetensors_info_at(st, i, &info) != ATTN_OK) continue;
        const char *name = info.name;
        if (strncmp(name, "transformer.", 12) == 0) name += 12;
        if (strncmp(name, "h.", 2) != 0 || name[2] < '0' || name[2] > '9') continue;
        size_t n = 0;
        const char *p = name + 2;
        bool overflow = false;
        while (*p >= '0' && *p <= '9') {
            if (n > ((size_t)-1 - 9) / 10) overflow = true;
            else n = n * 10 + (size_t)(*p - '0');
            p++;
        }
        if (!overflow && strcmp(p, ".attn.c_attn.weight") == 0 && n + 1 > layers) layers = n + 1;
    }
    return layers;
}

static attn_status check_kind(attn_ctx *ctx, const attn_module *m, const char *what) {
    if (!m) return attn_fail(ctx, ATTN_ERR_NULL, "%s: module is NULL", what);
    if (m->ops->kind != ATTN_MODULE_GPT2)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: the module is a %s; GPT-2 checkpoints load into CausalSelfAttention",
                         what, m->ops->class_name);
    return ATTN_OK;
}

attn_status attn_gpt2_load_hf_from(attn_safetensors *st, attn_module *m, size_t layer) {
    if (!st) return ATTN_ERR_NULL;
    attn_ctx *ctx = attn_safetensors_ctx(st);
    attn_clear_error(ctx);
    attn_status s = check_kind(ctx, m, "attn_gpt2_load_hf");
    if (s != ATTN_OK) return s;
    const size_t C = m->d_in;
    char prefix[64], name[NUM_TENSORS][96];
    attn_safetensors_info info[NUM_TENSORS];
    const char *prefixes[2] = {"", "transformer."};
    bool found = false;
    for (size_t k = 0; k < 2 && !found; k++) {
        snprintf(prefix, sizeof prefix, "%sh.%zu.attn.", prefixes[k], layer);
        snprintf(name[0], sizeof name[0], "%s%s", prefix, suffixes[0]);
        found = attn_safetensors_find(st, name[0], &info[0]) == ATTN_OK;
    }
    if (!found) {
        size_t layers = count_layers(st);
        char have[64];
        if (layers) snprintf(have, sizeof have, "it has layers 0 to %zu", layers - 1);
        else snprintf(have, sizeof have, "it has no GPT-2 attention layers");
        return attn_fail(ctx, ATTN_ERR_NOT_FOUND,
                         "GPT-2 checkpoint: no layer %zu: neither h.%zu.attn.c_attn.weight nor "
                         "transformer.h.%zu.attn.c_attn.weight is in the file (%s)",
                         layer, layer, layer, have);
    }
    /* Conv1D shapes: (in, out). */
    const size_t want[NUM_TENSORS][2] = {{C, 3 * C}, {3 * C, 0}, {C, C}, {C, 0}};
    for (size_t t = 0; t < NUM_TENSORS; t++) {
        snprintf(name[t], sizeof name[t], "%s%s", prefix, suffixes[t]);
        if (t > 0 && attn_safetensors_find(st, name[t], &info[t]) != ATTN_OK)
            return attn_fail(ctx, ATTN_ERR_NOT_FOUND, "GPT-2 checkpoint: %s is not in the file",
                             name[t]);
        size_t ndim = want[t][1] ? 2 : 1;
        bool same = info[t].ndim == ndim && info[t].shape[0] == want[t][0] &&
                    (ndim == 1 || info[t].shape[1] == want[t][1]);
        if (!same) {
            char got[64] = "[";
            for (size_t d = 0; d < info[t].ndim && d < 4; d++)
                snprintf(got + strlen(got), sizeof got - strlen(got), d ? ", %zu" : "%zu",
                         info[t].shape[d]);
            snprintf(got + strlen(got), sizeof got - strlen(got), info[t].ndim > 4 ? ", ...]" : "]");
            char expect[48];
            if (ndim == 2) snprintf(expect, sizeof expect, "[%zu, %zu]", want[t][0], want[t][1]);
            else snprintf(expect, sizeof expect, "[%zu]", want[t][0]);
            return attn_fail(ctx, ATTN_ERR_SHAPE,
                             "GPT-2 checkpoint: %s has shape %s; a CausalSelfAttention with "
                             "n_embd %zu needs %s (Conv1D layout, (in, out))",
                             name[t], got, C, expect);
        }
    }
    /* Stage all four, transposing the weights, then commit. */
    float *raw = attn_alloc_floats(3 * C * C);
    float *staged = attn_alloc_floats(m->num_scalars);
    s = (raw && staged) ? ATTN_OK
                        : attn_fail(ctx, ATTN_ERR_NO_MEMORY,
                                                "GPT-2 checkpoint: out of memory for n_embd %zu", C);
    for (size_t t = 0; t < NUM_TENSORS && s == ATTN_OK; t++) {
        float *dst = staged + m->params[t].offset;
        bool weight = t == C_ATTN_WEIGHT || t == C_PROJ_WEIGHT;
        s = attn_safetensors_load(st, info[t].index, weight ? raw : dst, info[t].numel);
        if (s == ATTN_OK && weight) transpose(raw, dst, want[t][0], want[t][1]);
    }
    if (s == ATTN_OK) {
        memcpy(m->storage, staged, m->num_scalars * sizeof *staged);
        /* the last forward's activations belong to the old weights: a
         * backward now would mix the two */
        m->saved.valid = false;
    }
    attn_free(raw);
    attn_free(staged);
    return s;
}

attn_status attn_gpt2_load_hf(attn_ctx *ctx, attn_module *m, const char *path, size_t layer) {
    attn_safetensors *st;
    attn_status s = attn_safetensors_open(ctx, path, &st);
    if (s != ATTN_OK) return s;
    s = attn_gpt2_load_hf_from(st, m, layer);
    attn_safetensors_free(st);
    return s;
}

attn_status attn_gpt2_save_hf(attn_ctx *ctx, attn_module *m, const char *path, size_t layer) {
    attn_clear_error(ctx);
    attn_status s = check_kind(ctx, m, "attn_gpt2_save_hf");
    if (s != ATTN_OK) return s;
    const size_t C = m->d_in;
    float *c_attn = attn_alloc_floats(3 * C * C), *c_proj = attn_alloc_floats(C * C);
    if (!c_attn || !c_proj) {
        attn_free(c_attn);
        attn_free(c_proj);
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_gpt2_save_hf: out of memory for n_embd %zu",
                         C);
    }
    transpose(attn_module_data(m, C_ATTN_WEIGHT), c_attn, 3 * C, C);
    transpose(attn_module_data(m, C_PROJ_WEIGHT), c_proj, C, C);
    char name[NUM_TENSORS][96];
    for (size_t t = 0; t < NUM_TENSORS; t++)
        snprintf(name[t], sizeof name[t], "h.%zu.attn.%s", layer, suffixes[t]);
    attn_named_tensor tensors[NUM_TENSORS] = {
        {.name = name[0], .data = c_attn, .ndim = 2, .shape = {C, 3 * C}},
        {.name = name[1], .data = attn_module_data(m, C_ATTN_BIAS), .ndim = 1, .shape = {3 * C}},
        {.name = name[2], .data = c_proj, .ndim = 2, .shape = {C, C}},
        {.name = name[3], .data = attn_module_data(m, C_PROJ_BIAS), .ndim = 1, .shape = {C}},
    };
    attn_metadata_entry format = {"format", "pt"};
    s = attn_safetensors_write(ctx, path, tensors, NUM_TENSORS, &format, 1);
    attn_free(c_attn);
    attn_free(c_proj);
    return s;
}
