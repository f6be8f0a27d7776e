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

/* The character at s (n > 0 bytes left) as a message writes it: well-formed
 * printable UTF-8 and printable ASCII as they are, \n, \t and \r as such,
 * any other byte (a control character, NUL, a byte that is not UTF-8) as
 * \xNN. Sets *piece (into s or esc) and *len; returns the bytes of s it
 * stands for. */
static size_t escaped_char(const unsigned char *s, size_t n, char esc[8], const char **piece,
                           size_t *len) {
    size_t utf8 = s[0] >= 0x80 ? utf8_printable(s, n) : 0;
    *piece = esc;
    if (utf8) {
        *piece = (const char *)s;
        *len = utf8;
        return utf8;
    }
    if (s[0] == '\n' || s[0] == '\t' || s[0] == '\r') {
        snprintf(esc, 8, "\\%c", s[0] == '\n' ? 'n' : s[0] == '\t' ? 't' : 'r');
        *len = 2;
    } else if (s[0] < 0x20 || s[0] >= 0x7f) {
        snprintf(esc, 8, "\\x%02x", (unsigned)s[0]);
        *len = 4;
    } else {
        *piece = (const char *)s;
        *len = 1;
    }
    return 1;
}

/* Copies n bytes of text into dst (cap bytes, NUL-terminated) as
 * escaped_char writes each: messages quote paths and names from callers and
 * files, and must be safe to print. An escape that does not fit is left out
 * whole; with mark_cut, text that does not fit ends in "...". Whether text
 * was cut. */
static bool copy_escaped(char *dst, size_t cap, const char *text, size_t n, bool mark_cut) {
    const unsigned char *s = (const unsigned char *)text;
    size_t out = 0, room = mark_cut && cap > 4 ? cap - 3 : cap;
    size_t i = 0;
    while (i < n) {
        char esc[8];
        const char *piece;
        size_t len, advance = escaped_char(s + i, n - i, esc, &piece, &len);
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

/* The bytes text[from, n) take escaped. */
static size_t escaped_length(const unsigned char *s, size_t from, size_t n) {
    size_t total = 0;
    for (size_t i = from; i < n;) {
        char esc[8];
        const char *piece;
        size_t len;
        i += escaped_char(s + i, n - i, esc, &piece, &len);
        total += len;
    }
    return total;
}

/* copy_escaped for a message (cap > 16) that leaves out its middle, not its
 * end, where it does not fit: its start, " ... ", then its end, about half
 * the room each. A message that starts with a long path then keeps the
 * reason it ends with. */
static void copy_message(char *dst, size_t cap, const char *text, size_t n) {
    const unsigned char *s = (const unsigned char *)text;
    if (escaped_length(s, 0, n) < cap) {
        copy_escaped(dst, cap, text, n, false);
        return;
    }
    static const char mark[] = " ... ";
    size_t room = cap - sizeof mark, head = room / 2, out = 0, i = 0;
    while (i < n) { /* the start: whole characters up to head bytes */
        char esc[8];
        const char *piece;
        size_t len, advance = escaped_char(s + i, n - i, esc, &piece, &len);
        if (out + len > head) break;
        memcpy(dst + out, piece, len);
        out += len;
        i += advance;
    }
    memcpy(dst + out, mark, sizeof mark - 1);
    out += sizeof mark - 1;
    /* the end: the fewest whole characters from i on that fit the rest */
    size_t tail = escaped_length(s, i, n), left = room - head;
    while (tail > left) {
        char esc[8];
        const char *piece;
        size_t len;
        i += escaped_char(s + i, n - i, esc, &piece, &len);
        tail -= len;
    }
    copy_escaped(dst + out, cap - out, text + i, n - i, false);
}

bool attn_escape_text(char *dst, size_t cap, const char *text, size_t n) {
    return cap ? copy_escaped(dst, cap, text, n, true) : n > 0;
}

attn_status attn_fail(attn_ctx *ctx, attn_status status, const char *fmt, ...) {
    if (!ctx) return status;
    char text[ATTN_ERROR_CAPACITY];
    va_list args, again;
    va_start(args, fmt);
    va_copy(again, args);
    int n = vsnprintf(text, sizeof text, fmt, args);
    va_end(args);
    if (n < 0) text[0] = '\0';
    /* a message past the capacity is formatted whole, so that its end is
     * kept (copy_message); where that cannot be had, its start is */
    char *whole = n >= (int)sizeof text ? attn_malloc((size_t)n + 1) : NULL;
    if (whole) vsnprintf(whole, (size_t)n + 1, fmt, again);
    va_end(again);
    const char *msg = whole ? whole : text;
    copy_message(ctx->error, sizeof ctx->error, msg, strlen(msg));
    attn_free(whole);
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
