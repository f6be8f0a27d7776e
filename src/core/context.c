/* context.c — the attn_ctx, status names, error messages and the version. */
#include "cpu_info.h"
#include "internal.h"
#include "parallel.h"
#include "utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A ctx with more threads than this is a caller's mistake, not a machine. */
#define ATTN_MAX_THREADS 4096

const char *attn_version(void) { return ATTN_VERSION_STRING; }

const char *attn_status_name(attn_status status) {
    switch (status) {
    case ATTN_OK: return "ATTN_OK";
    case ATTN_ERR_NULL: return "ATTN_ERR_NULL";
    case ATTN_ERR_INVALID: return "ATTN_ERR_INVALID";
    case ATTN_ERR_SHAPE: return "ATTN_ERR_SHAPE";
    case ATTN_ERR_OVERFLOW: return "ATTN_ERR_OVERFLOW";
    case ATTN_ERR_NO_MEMORY: return "ATTN_ERR_NO_MEMORY";
    case ATTN_ERR_NOT_FOUND: return "ATTN_ERR_NOT_FOUND";
    case ATTN_ERR_IO: return "ATTN_ERR_IO";
    case ATTN_ERR_FORMAT: return "ATTN_ERR_FORMAT";
    case ATTN_ERR_UNSUPPORTED: return "ATTN_ERR_UNSUPPORTED";
    }
    return "ATTN_ERR_UNKNOWN";
}

attn_status attn_ctx_alloc(const attn_ctx_config *cfg, attn_kernels kernels, attn_ctx **out) {
    if (cfg->num_threads > ATTN_MAX_THREADS) return ATTN_ERR_INVALID;
    attn_ctx *ctx = attn_calloc(1, sizeof *ctx);
    if (!ctx) return ATTN_ERR_NO_MEMORY;
    ctx->kernels = kernels;
    attn_cpu_info cpu;
    if (attn_cpu_info_get(&cpu) == ATTN_OK) {
        ctx->l2_bytes = cpu.l2_bytes;
        ctx->l3_bytes = cpu.l3_bytes;
    }
    ctx->num_threads = cfg->num_threads ? cfg->num_threads : 1;
    ctx->trace = cfg->trace;
    ctx->trace_user = cfg->trace_user;
    ctx->trace_shapes_only = cfg->trace_shapes_only;
    *out = ctx;
    return ATTN_OK;
}

bool attn_ctx_amx_usable(const attn_ctx *ctx) {
    return ctx->ks.flash16_amx && attn_cpu_amx_permitted();
}

void attn_ctx_free(attn_ctx *ctx) {
    if (ctx) {
        attn_pool_free(ctx->pool);
        attn_free(ctx->scratch.data);
        attn_free(ctx->workspace.data);
    }
    attn_free(ctx);
}

attn_pool *attn_ctx_pool(attn_ctx *ctx) {
    if (!ctx || ctx->num_threads <= 1) return NULL;
    if (!ctx->pool_tried) {
        ctx->pool_tried = true;
        ctx->pool = attn_pool_new(ctx->num_threads - 1);
    }
    return ctx->pool;
}

attn_workers attn_ctx_workers(attn_ctx *ctx) {
    return (attn_workers){ctx->num_threads, attn_ctx_pool(ctx)};
}

/* buf grown to bytes by alloc (64-byte aligned); NULL, buf kept, when
 * alloc fails. */
static void *grow(attn_ctx_buffer *buf, size_t bytes, void *(*alloc)(size_t, size_t)) {
    void *data = alloc(64, bytes);
    if (!data) return NULL;
    attn_free(buf->data);
    *buf = (attn_ctx_buffer){data, bytes};
    return data;
}

void *attn_ctx_scratch(attn_ctx *ctx, size_t bytes) {
    if (bytes <= ctx->scratch.bytes) return ctx->scratch.data;
    /* its one caller, the SGEMM, runs the reference kernel without it */
    return grow(&ctx->scratch, bytes, attn_aligned_alloc_or_fallback);
}

void *attn_ctx_workspace(attn_ctx *ctx, size_t bytes) {
    if (bytes <= ctx->workspace.bytes && ctx->workspace.data) return ctx->workspace.data;
    return grow(&ctx->workspace, bytes, attn_aligned_alloc);
}

const char *attn_ctx_last_error(const attn_ctx *ctx) { return ctx ? ctx->error : ""; }

const char *attn_ctx_last_explain(const attn_ctx *ctx) { return ctx ? ctx->explain : ""; }

attn_kernels attn_ctx_kernels(const attn_ctx *ctx) {
    return ctx ? ctx->kernels : ATTN_KERNELS_REFERENCE;
}

size_t attn_ctx_num_threads(const attn_ctx *ctx) { return ctx ? ctx->num_threads : 0; }

/* The length of the UTF-8 character at s (n bytes left) when it is well
 * formed and printable (not a C1 control), else 0. */
static size_t utf8_printable(const unsigned char *s, size_t n) {
    uint32_t cp;
    size_t len = attn_utf8_decode(s, n, &cp);
    return cp >= 0xa0 ? len : 0;
}

/* Copies n bytes of text into dst (cap bytes, NUL-terminated) with control
 * characters, NUL and bytes that are not UTF-8 written as \n, \t, \r or
 * \xNN: messages quote paths and names from callers and files, and must be
 * safe to print. An escape that does not fit is left out whole; with
 * mark_cut, text that does not fit ends in "...". Whether text was cut. */
static bool copy_escaped(char *dst, size_t cap, const char *text, size_t n, bool mark_cut) {
    const unsigned char *s = (const unsigned char *)text;
    size_t out = 0, room = mark_cut && cap > 4 ? cap - 3 : cap;
    size_t i = 0;
    for (; i < n;) {
        char esc[8];
        const char *piece = esc;
        size_t len = s[i] >= 0x80 ? utf8_printable(s + i, n - i) : 0, advance = 1;
        if (len) {
            piece = (const char *)s + i;
            advance = len;
        } else if (s[i] == '\n' || s[i] == '\t' || s[i] == '\r') {
            snprintf(esc, sizeof esc, "\\%c", s[i] == '\n' ? 'n' : s[i] == '\t' ? 't' : 'r');
            len = 2;
        } else if (s[i] < 0x20 || s[i] >= 0x7f) {
            snprintf(esc, sizeof esc, "\\x%02x", (unsigned)s[i]);
            len = 4;
        } else {
            piece = (const char *)s + i;
            len = 1;
        }
        if (out + len >= room) break;
        memcpy(dst + out, piece, len);
        out += len;
        i += advance;
    }
    if (i < n && room < cap) {
        memcpy(dst + out, "...", 3);
        out += 3;
    }
    dst[out] = '\0';
    return i < n;
}

bool attn_escape_text(char *dst, size_t cap, const char *text, size_t n) {
    return cap ? copy_escaped(dst, cap, text, n, true) : n > 0;
}

attn_status attn_fail(attn_ctx *ctx, attn_status status, const char *fmt, ...) {
    if (ctx) {
        char text[ATTN_ERROR_CAPACITY];
        va_list args;
        va_start(args, fmt);
        vsnprintf(text, sizeof text, fmt, args);
        va_end(args);
        copy_escaped(ctx->error, sizeof ctx->error, text, strlen(text), false);
    }
    return status;
}

const char *attn_number_text(double x, char buf[ATTN_NUMBER_CHARS]) {
    for (int digits = 6; digits <= 17; digits++) {
        snprintf(buf, ATTN_NUMBER_CHARS, "%.*g", digits, x);
        if (x != x || strtod(buf, NULL) == x) break; /* 17 digits always read back */
    }
    return buf;
}

void attn_clear_error(attn_ctx *ctx) {
    if (ctx) ctx->error[0] = '\0';
}


void attn_trace(attn_ctx *ctx, const char *module, const char *name, size_t ndim,
                const size_t *shape, const float *data) {
    if (ctx && ctx->trace)
        ctx->trace(ctx->trace_user, module, name, ndim, shape, ctx->trace_shapes_only ? NULL : data);
}
