/*
 * save.c — attn_model_save: the model's parameters as a safetensors file
 * (https://huggingface.co/docs/safetensors), readable by
 * safetensors.torch.load_file and loadable into the equivalent PyTorch
 * model with load_state_dict:
 *
 *   bytes 0..7   N, the header's length, unsigned 64-bit little-endian
 *   bytes 8..    the JSON header, N bytes, padded with spaces to a multiple
 *                of 8:
 *                {"__metadata__": {"format": "attn-lm", "vocab_size": "32",
 *                 ...every attn_model_config field, as strings...},
 *                 "tok_emb.weight": {"dtype": "F32", "shape": [32, 32],
 *                                    "data_offsets": [0, 4096]}, ...}
 *   then         the data: every tensor's float32 values, little-endian,
 *                row-major, in state_dict order; data_offsets count from
 *                the first byte after the header.
 */
#include "internal.h"
#include "train/model.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A growing text buffer for the header. */
typedef struct text {
    char *data;
    size_t len, cap;
    bool failed;
} text;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void append(text *t, const char *fmt, ...) {
    if (t->failed) return;
    for (;;) {
        va_list args;
        va_start(args, fmt);
        int n = vsnprintf(t->data ? t->data + t->len : NULL, t->data ? t->cap - t->len : 0, fmt,
                          args);
        va_end(args);
        if (n < 0) {
            t->failed = true;
            return;
        }
        if (t->data && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = t->cap ? t->cap : 1024;
        while (cap <= t->len + (size_t)n) cap *= 2;
        char *grown = realloc(t->data, cap);
        if (!grown) {
            t->failed = true;
            return;
        }
        t->data = grown;
        t->cap = cap;
    }
}

/* A JSON string: quotes, backslashes and control characters escaped. */
static void append_json_string(text *t, const char *s) {
    append(t, "\"");
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') append(t, "\\%c", ch);
        else if (ch < 0x20) append(t, "\\u%04x", ch);
        else append(t, "%c", ch);
    }
    append(t, "\"");
}

static void append_meta(text *t, const char *key, const char *value, bool first) {
    append(t, first ? "" : ", ");
    append_json_string(t, key);
    append(t, ": ");
    append_json_string(t, value);
}

static void put_u64_le(unsigned char *out, uint64_t v) {
    for (int i = 0; i < 8; i++) out[i] = (unsigned char)(v >> (8 * i));
}

/* Writes n floats little-endian, whatever the host's byte order. */
static bool write_floats_le(FILE *f, const float *x, size_t n) {
    unsigned char buf[4096];
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &x[i], sizeof bits);
        for (int k = 0; k < 4; k++) buf[used++] = (unsigned char)(bits >> (8 * k));
        if (used == sizeof buf) {
            if (fwrite(buf, 1, used, f) != used) return false;
            used = 0;
        }
    }
    return used == 0 || fwrite(buf, 1, used, f) == used;
}

static attn_status build_header(attn_ctx *ctx, const attn_model_config *c,
                                const attn_param *params, size_t count, text *h) {
    char value[64];
    append(h, "{\"__metadata__\": {");
    append_meta(h, "format", "attn-lm", true);
#define META_SIZE(field)                                  \
    snprintf(value, sizeof value, "%zu", c->field);       \
    append_meta(h, #field, value, false)
    META_SIZE(vocab_size);
    META_SIZE(context_length);
    META_SIZE(d_model);
    META_SIZE(n_layers);
    META_SIZE(n_heads);
#undef META_SIZE
    append_meta(h, "attention", c->attention == ATTN_MODULE_GPT2 ? "gpt2" : "mha", false);
    append_meta(h, "mlp", c->mlp ? "true" : "false", false);
    append_meta(h, "qkv_bias", c->qkv_bias ? "true" : "false", false);
    snprintf(value, sizeof value, "%.17g", c->dropout);
    append_meta(h, "dropout", value, false);
    append(h, "}");
    size_t offset = 0;
    for (size_t i = 0; i < count; i++) {
        const attn_param *p = &params[i];
        size_t bytes;
        if (!attn_mul_size(p->numel, sizeof(float), &bytes) || !attn_add_size(offset, bytes, &bytes))
            return attn_fail(ctx, ATTN_ERR_OVERFLOW, "attn_model_save: %s overflows the file", p->name);
        append(h, ", ");
        append_json_string(h, p->name);
        if (p->ndim == 2)
            append(h, ": {\"dtype\": \"F32\", \"shape\": [%zu, %zu], ", p->shape[0], p->shape[1]);
        else
            append(h, ": {\"dtype\": \"F32\", \"shape\": [%zu], ", p->shape[0]);
        append(h, "\"data_offsets\": [%zu, %zu]}", offset, bytes);
        offset = bytes;
    }
    append(h, "}");
    while (!h->failed && h->len % 8 != 0) append(h, " ");
    if (h->failed)
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_model_save: out of memory for the header");
    return ATTN_OK;
}

attn_status attn_model_save(attn_model *m, const char *path) {
    if (!m) return ATTN_ERR_NULL;
    attn_ctx *ctx = attn_model_ctx(m);
    attn_clear_error(ctx);
    if (!path) return attn_fail(ctx, ATTN_ERR_NULL, "attn_model_save: path is NULL");
    const attn_param *params;
    size_t count;
    attn_status st = attn_model_params(m, &params, &count);
    if (st != ATTN_OK) return st;
    attn_model_config c = attn_model_get_config(m);
    text h = {0};
    if ((st = build_header(ctx, &c, params, count, &h)) != ATTN_OK) {
        free(h.data);
        return st;
    }
    FILE *f = fopen(path, "wb");
    if (!f) {
        int err = errno;
        free(h.data);
        return attn_fail(ctx, ATTN_ERR_IO, "attn_model_save: cannot open '%s' for writing: %s",
                         path, strerror(err));
    }
    unsigned char len[8];
    put_u64_le(len, (uint64_t)h.len);
    bool ok = fwrite(len, 1, 8, f) == 8 && fwrite(h.data, 1, h.len, f) == h.len;
    for (size_t i = 0; ok && i < count; i++) ok = write_floats_le(f, params[i].data, params[i].numel);
    ok = fclose(f) == 0 && ok;
    free(h.data);
    if (!ok) return attn_fail(ctx, ATTN_ERR_IO, "attn_model_save: writing '%s' failed", path);
    return ATTN_OK;
}
