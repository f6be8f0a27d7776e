/* context.c — the attn_ctx, status names, error messages and the version. */
#include "internal.h"
#include "kernels/dispatch.h"

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
    }
    return "ATTN_ERR_UNKNOWN";
}

attn_status attn_ctx_new(const attn_ctx_config *cfg, attn_ctx **out) {
    if (!out) return ATTN_ERR_NULL;
    *out = NULL;
    attn_ctx_config defaults = {0};
    if (!cfg) cfg = &defaults;
    if (cfg->num_threads > ATTN_MAX_THREADS) return ATTN_ERR_INVALID;
    attn_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return ATTN_ERR_NO_MEMORY;
    attn_kernels kernels;
    attn_status st = attn_kernels_resolve(cfg->kernels, &kernels);
    if (st != ATTN_OK) {
        free(ctx);
        return st;
    }
    ctx->kernels = kernels;
    ctx->num_threads = cfg->num_threads ? cfg->num_threads : 1;
    ctx->trace = cfg->trace;
    ctx->trace_user = cfg->trace_user;
    *out = ctx;
    return ATTN_OK;
}

void attn_ctx_free(attn_ctx *ctx) {
    if (ctx) free(ctx->scratch.data);
    free(ctx);
}

void *attn_ctx_scratch(attn_ctx *ctx, size_t bytes) {
    if (bytes <= ctx->scratch.bytes) return ctx->scratch.data;
    /* aligned_alloc wants a multiple of the alignment */
    size_t rounded = bytes + 63;
    if (rounded < bytes) return NULL;
    rounded -= rounded % 64;
    void *data = aligned_alloc(64, rounded);
    if (!data) return NULL;
    free(ctx->scratch.data);
    ctx->scratch = (attn_ctx_buffer){data, rounded};
    return data;
}

const char *attn_ctx_last_error(const attn_ctx *ctx) { return ctx ? ctx->error : ""; }

attn_kernels attn_ctx_kernels(const attn_ctx *ctx) {
    return ctx ? ctx->kernels : ATTN_KERNELS_REFERENCE;
}

size_t attn_ctx_num_threads(const attn_ctx *ctx) { return ctx ? ctx->num_threads : 0; }

attn_status attn_fail(attn_ctx *ctx, attn_status status, const char *fmt, ...) {
    if (ctx) {
        va_list args;
        va_start(args, fmt);
        vsnprintf(ctx->error, sizeof ctx->error, fmt, args);
        va_end(args);
    }
    return status;
}

void attn_clear_error(attn_ctx *ctx) {
    if (ctx) ctx->error[0] = '\0';
}

float *attn_alloc_floats(size_t n) {
    if (n == 0) n = 1;
    if (n > (size_t)-1 / sizeof(float)) return NULL;
    return calloc(n, sizeof(float));
}

void attn_trace(attn_ctx *ctx, const char *module, const char *name, size_t ndim,
                const size_t *shape, const float *data) {
    if (ctx && ctx->trace) ctx->trace(ctx->trace_user, module, name, ndim, shape, data);
}
