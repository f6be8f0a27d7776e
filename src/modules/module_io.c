/*
 * module_io.c — a module's state_dict in a safetensors file, saved and
 * loaded through io's generic writer and reader (src/io/safetensors.c),
 * which know nothing of modules.
 */
#include "modules/module.h"

#include "io/safetensors_internal.h"

#include <stdio.h>
#include <string.h>

#define TEXT_MAX 64 /* a tensor's name as quoted in a message */

/*
 * PyTorch's state_dict holds the seeds' causal masks as buffers next to the
 * parameters: "mask" (T, T) = triu(ones, diagonal=1) in CausalAttention and
 * MultiHeadAttention, "heads.N.mask" in MultiHeadAttentionWrapper, and
 * "bias" (1, 1, T, T) = tril(ones) in GPT-2's CausalSelfAttention. Saving
 * writes them, so PyTorch's load_state_dict(strict=True) takes attn's files;
 * loading accepts them when present and checks they are those masks.
 */
typedef struct mask_buffers {
    size_t count;                /* buffers */
    size_t side;                 /* T */
    bool lower;                  /* tril (GPT-2) rather than triu(diagonal=1) */
    size_t ndim, shape[4];
    char (*names)[ATTN_PARAM_NAME_MAX];
    float *data;                 /* the mask, shared by every buffer */
} mask_buffers;

static void free_mask_buffers(mask_buffers *b) {
    attn_free(b->names);
    attn_free(b->data);
    memset(b, 0, sizeof *b);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static attn_status mask_buffers_of(attn_ctx *ctx, const attn_module *m, bool with_data,
                                   mask_buffers *b) {
    memset(b, 0, sizeof *b);
    size_t T = m->mask_buffer;
    if (T == 0) return ATTN_OK;
    attn_mask_buffers kind = m->ops->buffers;
    b->side = T;
    b->lower = kind == ATTN_BUFFERS_TRIL_BIAS;
    b->ndim = b->lower ? 4 : 2;
    size_t shape4[4] = {1, 1, T, T}, shape2[2] = {T, T};
    memcpy(b->shape, b->lower ? shape4 : shape2, b->ndim * sizeof(size_t));
    if (kind == ATTN_BUFFERS_HEAD_MASKS) {
        for (size_t i = 0; i < m->num_params; i++)
            if (ends_with(m->params[i].name, ".W_query.weight")) b->count++;
    } else {
        b->count = 1;
    }
    size_t area;
    /* only a save draws the buffer: a load checks the file's names and
     * shapes, so a context too long to hold one still loads */
    if (with_data && (!attn_mul_size(T, T, &area) || area > SIZE_MAX / sizeof(float)))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                         "%s: the %zu x %zu mask buffer of context_length %zu is past size_t",
                         m->ops->class_name, T, T, T);
    b->names = attn_calloc(b->count ? b->count : 1, sizeof *b->names);
    if (!b->names || (with_data && !(b->data = attn_alloc_floats(area)))) {
        free_mask_buffers(b);
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory for the %zu x %zu mask",
                         m->ops->class_name, T, T);
    }
    for (size_t i = 0; i < b->count; i++) {
        if (kind == ATTN_BUFFERS_HEAD_MASKS)
            snprintf(b->names[i], sizeof b->names[i], "heads.%zu.mask", i);
        else
            snprintf(b->names[i], sizeof b->names[i], "%s", b->lower ? "bias" : "mask");
    }
    if (with_data)
        for (size_t r = 0; r < T; r++)
            for (size_t c = 0; c < T; c++)
                b->data[r * T + c] = (b->lower ? c <= r : c > r) ? 1.0f : 0.0f;
    return ATTN_OK;
}

static bool is_mask_buffer(const mask_buffers *b, const char *name) {
    for (size_t i = 0; i < b->count; i++)
        if (strcmp(b->names[i], name) == 0) return true;
    return false;
}

attn_status attn_safetensors_save_module(attn_ctx *ctx, attn_module *m, const char *path) {
    attn_clear_error(ctx);
    if (!m) return attn_fail(ctx, ATTN_ERR_NULL, "attn_safetensors_save_module: module is NULL");
    mask_buffers b;
    attn_status s = mask_buffers_of(ctx, m, true, &b);
    if (s != ATTN_OK) return s;
    size_t count = m->num_params + b.count;
    attn_named_tensor *t = attn_calloc(count ? count : 1, sizeof *t);
    if (!t) {
        free_mask_buffers(&b);
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_safetensors_save_module: out of memory");
    }
    for (size_t i = 0; i < m->num_params; i++) {
        const attn_param_slot *slot = &m->params[i];
        t[i] = (attn_named_tensor){.name = slot->name, .data = attn_module_data(m, i),
                                   .ndim = slot->ndim, .shape = {slot->shape[0], slot->shape[1]}};
    }
    for (size_t i = 0; i < b.count; i++) {
        attn_named_tensor *e = &t[m->num_params + i];
        *e = (attn_named_tensor){.name = b.names[i], .data = b.data, .ndim = b.ndim};
        memcpy(e->shape, b.shape, b.ndim * sizeof(size_t));
    }
    attn_metadata_entry format = {"format", "pt"};
    s = attn_safetensors_write(ctx, path, t, count, &format, 1);
    attn_free(t);
    free_mask_buffers(&b);
    return s;
}

/* Checks a mask buffer found in the file: its shape and its ones and zeros. */
static attn_status check_mask_buffer(attn_safetensors *st, const attn_module *m,
                                     const mask_buffers *b, size_t index) {
    attn_ctx *ctx = attn_safetensors_ctx(st);
    const char *label = attn_safetensors_label(st);
    attn_safetensors_info info;
    attn_status s = attn_safetensors_info_at(st, index, &info);
    if (s != ATTN_OK) return s;
    const attn_safetensors_info *t = &info;
    char name[TEXT_MAX], got[160], want[80];
    attn_safetensors_printable(name, sizeof name, t->name);
    bool same = t->ndim == b->ndim;
    for (size_t d = 0; same && d < b->ndim; d++) same = t->shape[d] == b->shape[d];
    if (!same) {
        attn_safetensors_format_shape(got, sizeof got, t->ndim, t->shape);
        attn_safetensors_format_shape(want, sizeof want, b->ndim, b->shape);
        return attn_fail(ctx, ATTN_ERR_SHAPE,
                         "%s: tensor '%s' has shape %s; %s's causal mask buffer is %s", label,
                         name, got, m->ops->class_name, want);
    }
    float *data = attn_alloc_floats(t->numel);
    if (!data) return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory", label);
    s = attn_safetensors_load(st, index, data, t->numel);
    for (size_t i = 0; s == ATTN_OK && i < t->numel; i++) {
        size_t r = i / b->side, c = i % b->side;
        if (data[i] != ((b->lower ? c <= r : c > r) ? 1.0f : 0.0f))
            s = attn_fail(ctx, ATTN_ERR_FORMAT,
                          "%s: tensor '%s' is not the causal mask %s(ones(%zu, %zu)%s): element "
                          "(%zu, %zu) is %g",
                          label, name, b->lower ? "tril" : "triu", b->side, b->side,
                          b->lower ? "" : ", diagonal=1", r, c, (double)data[i]);
    }
    attn_free(data);
    return s;
}

/* Appends ", name" (or "name") to a message list, ending it with "..." when
 * it no longer fits. */
static void list_append(char *list, size_t cap, const char *name) {
    size_t len = strlen(list);
    if (len >= 3 && strcmp(list + len - 3, "...") == 0) return;
    char text[TEXT_MAX];
    attn_safetensors_printable(text, sizeof text, name);
    size_t need = strlen(text) + (len ? 2 : 0);
    if (len + need + 4 >= cap) {
        snprintf(list + len, cap - len, "%s...", len ? ", " : "");
        return;
    }
    snprintf(list + len, cap - len, "%s%s", len ? ", " : "", text);
}

attn_status attn_safetensors_load_module_from(attn_safetensors *st, attn_module *m,
                                              const char *prefix) {
    if (!st) return ATTN_ERR_NULL;
    attn_ctx *ctx = attn_safetensors_ctx(st);
    const char *label = attn_safetensors_label(st);
    size_t count = attn_safetensors_count(st);
    attn_clear_error(ctx);
    if (!m) return attn_fail(ctx, ATTN_ERR_NULL, "attn_safetensors_load_module: module is NULL");
    const char *cls = m->ops->class_name;
    size_t plen = prefix ? strlen(prefix) : 0;
    mask_buffers b;
    attn_status s = mask_buffers_of(ctx, m, false, &b);
    if (s != ATTN_OK) return s;
    char list[200] = "";
    size_t unexpected = 0;
    /* Every tensor (under the prefix) must be a parameter. */
    for (size_t i = 0; i < count; i++) {
        attn_safetensors_info info;
        if ((s = attn_safetensors_info_at(st, i, &info)) != ATTN_OK) break;
        const char *name = info.name;
        if (plen && strncmp(name, prefix, plen) != 0) continue;
        bool known = is_mask_buffer(&b, name + plen);
        for (size_t j = 0; j < m->num_params && !known; j++)
            known = strcmp(name + plen, m->params[j].name) == 0;
        if (!known) {
            unexpected++;
            list_append(list, sizeof list, name);
        }
    }
    if (s != ATTN_OK || unexpected) {
        free_mask_buffers(&b);
        if (s != ATTN_OK) return s;
        return attn_fail(ctx, ATTN_ERR_NOT_FOUND,
                         "%s: %zu tensor%s not in %s: %s", label, unexpected,
                         unexpected == 1 ? " is" : "s are", cls, list);
    }
    /* Every parameter must be there, with its shape and a float dtype. */
    size_t *index = attn_calloc(m->num_params ? m->num_params : 1, sizeof *index);
    if (!index) {
        free_mask_buffers(&b);
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory", label);
    }
    char *full = NULL;
    size_t missing = 0;
    for (size_t j = 0; j < m->num_params && s == ATTN_OK; j++) {
        const attn_param_slot *slot = &m->params[j];
        size_t n = plen + strlen(slot->name) + 1;
        char *grown = attn_realloc(full, n);
        if (!grown) {
            s = attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory", label);
            break;
        }
        full = grown;
        snprintf(full, n, "%s%s", plen ? prefix : "", slot->name);
        size_t i = attn_safetensors_index(st, full);
        index[j] = i;
        if (i == count) {
            missing++;
            list_append(list, sizeof list, full);
        }
    }
    if (s == ATTN_OK && missing)
        s = attn_fail(ctx, ATTN_ERR_NOT_FOUND, "%s: %zu parameter%s of %s %s missing: %s",
                      label, missing, missing == 1 ? "" : "s", cls,
                      missing == 1 ? "is" : "are", list);
    for (size_t j = 0; j < m->num_params && s == ATTN_OK; j++) {
        const attn_param_slot *slot = &m->params[j];
        attn_safetensors_info info;
        if ((s = attn_safetensors_info_at(st, index[j], &info)) != ATTN_OK) break;
        const attn_safetensors_info *t = &info;
        bool same = t->ndim == slot->ndim;
        for (size_t d = 0; same && d < t->ndim; d++) same = t->shape[d] == slot->shape[d];
        char name[TEXT_MAX];
        attn_safetensors_printable(name, sizeof name, t->name);
        if (!same) {
            char got[160], want[40];
            attn_safetensors_format_shape(got, sizeof got, t->ndim, t->shape);
            attn_safetensors_format_shape(want, sizeof want, slot->ndim, slot->shape);
            s = attn_fail(ctx, ATTN_ERR_SHAPE, "%s: tensor '%s' has shape %s; %s's %s is %s",
                          label, name, got, cls, slot->name, want);
        } else if (!attn_safetensors_dtype_loadable(t->dtype)) {
            s = attn_fail(ctx, ATTN_ERR_FORMAT,
                          "%s: tensor '%s' has dtype %s; only F32, F16, BF16 and F64 load as "
                          "float32",
                          label, name, attn_dtype_name(t->dtype));
        }
    }
    /* Mask buffers, when the file has them, must be the masks. */
    for (size_t i = 0; i < b.count && s == ATTN_OK; i++) {
        size_t n = plen + strlen(b.names[i]) + 1;
        char *grown = attn_realloc(full, n);
        if (!grown) {
            s = attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory", label);
            break;
        }
        full = grown;
        snprintf(full, n, "%s%s", plen ? prefix : "", b.names[i]);
        size_t at = attn_safetensors_index(st, full);
        if (at != count) s = check_mask_buffer(st, m, &b, at);
    }
    attn_free(full);
    free_mask_buffers(&b);
    /* Read everything before changing anything. */
    float *staged = NULL;
    if (s == ATTN_OK) {
        staged = attn_alloc_floats(m->num_scalars);
        if (!staged) s = attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: cannot allocate %zu floats",
                                   label, m->num_scalars);
    }
    for (size_t j = 0; j < m->num_params && s == ATTN_OK; j++)
        s = attn_safetensors_load(st, index[j], staged + m->params[j].offset,
                                          m->params[j].numel);
    if (s == ATTN_OK && m->num_scalars) {
        memcpy(m->storage, staged, m->num_scalars * sizeof *staged);
        /* the last forward's activations belong to the old weights: a
         * backward now would mix the two */
        m->saved.valid = false;
    }
    attn_free(staged);
    attn_free(index);
    return s;
}

attn_status attn_safetensors_load_module(attn_ctx *ctx, attn_module *m, const char *path,
                                         const char *prefix) {
    attn_safetensors *st;
    attn_status s = attn_safetensors_open(ctx, path, &st);
    if (s != ATTN_OK) return s;
    s = attn_safetensors_load_module_from(st, m, prefix);
    attn_safetensors_free(st);
    return s;
}
