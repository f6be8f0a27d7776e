/* mask_options.c — the mask options of attn sdpa and attn mask, parsed and
 * built into one block map (see mask_options.h). */
#define _POSIX_C_SOURCE 200809L
#include "mask_options.h"

#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool cli_parse_ll(const char *text, long long *out) {
    const char *digits = text[0] == '-' ? text + 1 : text;
    if (*digits < '0' || *digits > '9') return false;
    errno = 0;
    char *end;
    long long value = strtoll(text, &end, 10);
    if (errno || *end) return false;
    *out = value;
    return true;
}

int cli_parse_offset(const char *opt, const char *text, long long *out) {
    const long long limit = 1LL << 62;
    if (!cli_parse_ll(text, out) || *out > limit || *out < -limit)
        return cli_usage_error("%s: expected an integer within +-2^62, got '%s'", opt, text);
    return CLI_OK;
}

int cli_parse_window(const char *opt, const char *text, long long *left, long long *right) {
    const char *comma = strchr(text, ',');
    char first[32];
    size_t n = comma ? (size_t)(comma - text) : 0;
    bool ok = comma && n > 0 && n < sizeof first && cli_parse_ll(comma + 1, right);
    if (ok) {
        memcpy(first, text, n);
        first[n] = '\0';
        ok = cli_parse_ll(first, left);
    }
    if (!ok)
        return cli_usage_error("%s: expected L,R (two integers, -1 unbounded), got '%s'", opt,
                               text);
    if (*left < -1 || *right < -1)
        return cli_usage_error("%s: bounds (%lld, %lld) must be -1 (unbounded) or more", opt,
                               *left, *right);
    return CLI_OK;
}

int cli_mask_take(cli_mask_options *m, const char *opt, const char *value, bool *taken) {
    *taken = true;
    if (strcmp(opt, "--mask") == 0) {
        m->mask = value;
    } else if (strcmp(opt, "--doc-ids") == 0) {
        m->doc_ids = value;
    } else if (strcmp(opt, "--block-topk") == 0) {
        m->block_topk = value;
    } else if (strcmp(opt, "--prefix-lm") == 0) {
        /* the library's bound on positions, a usage error here */
        long long n;
        if (!cli_parse_ll(value, &n) || n < 0 || n > (1LL << 62))
            return cli_usage_error("--prefix-lm: expected an integer from 0 to 2^62, got '%s'",
                                   value);
        m->prefix = (int64_t)n;
        m->prefix_given = true;
    } else if (strcmp(opt, "--chunk") == 0) {
        if (!cli_parse_size(value, &m->chunk) || m->chunk == 0 || m->chunk > ((size_t)1 << 62))
            return cli_usage_error("--chunk: expected an integer from 1 to 2^62, got '%s'", value);
        m->chunk_given = true;
    } else if (strcmp(opt, "--block-size") == 0) {
        size_t n = 0;
        if (!cli_parse_size(value, &n) || n < 16 || n > 256 || (n & (n - 1)))
            return cli_usage_error("--block-size: expected a power of two from 16 to 256, got "
                                   "'%s'",
                                   value);
        m->block_size = n;
    } else {
        *taken = false;
    }
    return CLI_OK;
}

/* The first mask description given, for messages. */
static const char *description_option(const cli_mask_options *m) {
    return m->prefix_given ? "--prefix-lm" : m->doc_ids ? "--doc-ids" : m->chunk_given ? "--chunk"
                                                                                        : NULL;
}

int cli_mask_check(const cli_mask_options *m) {
    if (m->mask && m->block_topk)
        return cli_usage_error("--mask and --block-topk: one map per call, give one of them");
    const char *description = description_option(m);
    if (m->mask && description)
        return cli_usage_error("--mask and %s: one map per call, a dense mask is not ANDed with "
                               "a description",
                               description);
    return CLI_OK;
}

bool cli_mask_wanted(const cli_mask_options *m) {
    return m->mask || m->block_topk || description_option(m);
}

void cli_mask_inputs(const cli_mask_options *m, const char *opts[3], const char *paths[3],
                     size_t *count) {
    opts[0] = "--mask", paths[0] = m->mask;
    opts[1] = "--doc-ids", paths[1] = m->doc_ids;
    opts[2] = "--block-topk", paths[2] = m->block_topk;
    *count = 3;
}

int cli_broadcast_strides(const char *opt, size_t rank, const size_t *shape,
                          const size_t target[4], size_t strides[4]) {
    bool ok = rank <= 4;
    size_t full[4] = {1, 1, 1, 1};
    for (size_t d = 0; ok && d < rank; d++) {
        full[4 - rank + d] = shape[d];
        ok = shape[d] == 1 || shape[d] == target[4 - rank + d];
    }
    if (!ok) {
        char got[128], want[128];
        cli_format_shape(got, sizeof got, rank, shape);
        cli_format_shape(want, sizeof want, 4, target);
        return cli_usage_error("%s: shape %s does not broadcast to (B, H, T, S) = %s", opt, got,
                               want);
    }
    /* C order over the padded shape; a dimension of 1 repeats (stride 0) */
    size_t step = 1;
    for (size_t d = 4; d-- > 0;) {
        strides[d] = full[d] == 1 ? 0 : step;
        step *= full[d];
    }
    return CLI_OK;
}

/* ---- building -------------------------------------------------------------- */

/* *acc = *acc AND next (next consumed, freed whatever happens). */
static attn_status and_into(attn_ctx *ctx, attn_mask **acc, attn_mask *next) {
    if (!*acc) {
        *acc = next;
        return ATTN_OK;
    }
    attn_mask *both = NULL;
    attn_status st = attn_mask_new_and(ctx, *acc, next, &both);
    attn_mask_free(next);
    if (st != ATTN_OK) return st;
    attn_mask_free(*acc);
    *acc = both;
    return ATTN_OK;
}

/* The mask descriptions given (and, for attn mask, causal and window) ANDed
 * into *out (NULL when none); *batch the map's batch they need. */
static int build_description(attn_ctx *ctx, const cli_mask_options *m, const cli_mask_geometry *g,
                             attn_mask **out, size_t *batch) {
    *out = NULL;
    *batch = 1;
    attn_mask *next = NULL;
    attn_status st = ATTN_OK;
    const char *what = NULL;
    if (m->prefix_given) {
        what = "--prefix-lm";
        if ((st = attn_mask_new_prefix_lm(ctx, &m->prefix, 1, &next)) == ATTN_OK)
            st = and_into(ctx, out, next);
    }
    if (st == ATTN_OK && m->doc_ids) {
        attn_npy_i32 ids = {0};
        if (attn_npy_read_i32(ctx, m->doc_ids, &ids) != ATTN_OK)
            return cli_library_error(ctx, "--doc-ids");
        size_t rows = ids.ndim == 2 ? ids.shape[0] : 1;
        bool shaped = (ids.ndim == 1 || ids.ndim == 2) && ids.shape[ids.ndim - 1] == g->q_len &&
                      (rows == 1 || rows == g->batch);
        if (!shaped || g->q_len != g->kv_len) {
            char got[128];
            cli_format_shape(got, sizeof got, ids.ndim, ids.shape);
            attn_npy_i32_free(&ids);
            if (g->q_len != g->kv_len)
                return cli_usage_error("--doc-ids: the same ids for queries and keys need T == "
                                       "S, got T %zu and S %zu",
                                       g->q_len, g->kv_len);
            return cli_usage_error("--doc-ids: shape %s must be (T,) = (%zu,) or (B, T) = "
                                   "(%zu, %zu)",
                                   got, g->q_len, g->batch, g->q_len);
        }
        what = "--doc-ids";
        st = attn_mask_new_document(ctx, ids.data, NULL, rows, g->q_len, g->kv_len, &next);
        attn_npy_i32_free(&ids);
        if (st == ATTN_OK) st = and_into(ctx, out, next);
        *batch = rows;
    }
    if (st == ATTN_OK && m->chunk_given) {
        what = "--chunk";
        if ((st = attn_mask_new_chunked(ctx, m->chunk, g->offset, &next)) == ATTN_OK)
            st = and_into(ctx, out, next);
    }
    if (st == ATTN_OK && g->causal) {
        what = "--causal";
        if ((st = attn_mask_new_causal(ctx, g->offset, &next)) == ATTN_OK)
            st = and_into(ctx, out, next);
    }
    if (st == ATTN_OK && g->window) {
        what = "--window";
        if ((st = attn_mask_new_window(ctx, g->window_left, g->window_right, g->offset, &next)) ==
            ATTN_OK)
            st = and_into(ctx, out, next);
    }
    if (st != ATTN_OK) {
        attn_mask_free(*out);
        *out = NULL;
        return cli_library_error(ctx, what);
    }
    return CLI_OK;
}

/* A dense mask with causal and window drawn into it (attn mask): each
 * element read through the strides (floats already checked: finite or
 * -inf), then the closed forms. */
typedef struct dense_source {
    const int32_t *ints;
    const float *floats;
    size_t strides[4];
    const cli_mask_geometry *g;
} dense_source;

static int dense_visible(void *user, size_t b, size_t h, size_t q_idx, size_t kv_idx) {
    const dense_source *d = user;
    size_t at = b * d->strides[0] + h * d->strides[1] + q_idx * d->strides[2] +
                kv_idx * d->strides[3];
    bool visible = d->floats ? d->floats[at] != -INFINITY : d->ints[at] != 0;
    int64_t pos = (int64_t)q_idx + d->g->offset, j = (int64_t)kv_idx;
    if (d->g->causal && j > pos) visible = false;
    if (d->g->window && d->g->window_left >= 0 && j < pos - d->g->window_left) visible = false;
    if (d->g->window && d->g->window_right >= 0 && j > pos + d->g->window_right) visible = false;
    return visible;
}

/* --mask: read as integers (bool, uint8, int8, int32, int64) or, when that
 * fails, as floats; when both fail, the float reader's message stands where
 * the integer reader refused the dtype (a float file that is truncated, say),
 * else the integer reader's. */
static int build_dense(attn_ctx *ctx, const cli_mask_options *m, const cli_mask_geometry *g,
                       const attn_block_mask_config *base, cli_mask_built *out) {
    attn_npy_i32 ints = {0};
    bool is_int = attn_npy_read_i32(ctx, m->mask, &ints) == ATTN_OK;
    bool not_int = !is_int && strstr(attn_ctx_last_error(ctx), "is not an integer or bool");
    if (!is_int && attn_npy_read(ctx, m->mask, &out->values) != ATTN_OK) {
        /* both readers refused the dtype: name it once, with every dtype a
         * mask may have */
        const char *dtype = strstr(attn_ctx_last_error(ctx), "dtype '");
        if (not_int && dtype && strstr(dtype, "is not float32 or float64")) {
            int len = (int)strcspn(dtype + 7, "'");
            return cli_failure("--mask: '%s': dtype '%.*s' is none of a mask's: bool, int8, "
                               "uint8, int32, int64 (0 hides), float32, float64 (-inf hides)",
                               m->mask, len, dtype + 7);
        }
        if (not_int) return cli_library_error(ctx, "--mask");
        attn_status again = attn_npy_read_i32(ctx, m->mask, &ints);
        attn_npy_i32_free(&ints);
        if (again == ATTN_OK) return cli_failure("--mask: '%s' changed while it was read", m->mask);
        return cli_library_error(ctx, "--mask");
    }
    int rc = is_int ? CLI_OK : cli_finite_additive("--mask", m->mask, &out->values);
    if (rc != CLI_OK) return rc;
    size_t rank = is_int ? ints.ndim : out->values.ndim;
    const size_t *shape = is_int ? ints.shape : out->values.shape;
    size_t target[4] = {g->batch, g->heads, g->q_len, g->kv_len};
    rc = cli_broadcast_strides("--mask", rank, shape, target, out->strides);
    if (rc != CLI_OK) {
        attn_npy_i32_free(&ints);
        return rc;
    }
    attn_block_mask_config cfg = *base;
    cfg.batch = out->strides[0] ? g->batch : 1;
    cfg.heads = out->strides[1] ? g->heads : 1;
    attn_status st;
    if (g->causal || g->window) {
        dense_source d = {.ints = is_int ? ints.data : NULL,
                          .floats = is_int ? NULL : out->values.data, .g = g};
        memcpy(d.strides, out->strides, sizeof d.strides);
        st = attn_block_mask_from_fn(ctx, &cfg, dense_visible, &d, &out->map);
    } else if (is_int) {
        /* nonzero visible: the int32 values as bytes 0/1 */
        uint8_t *bytes = malloc(ints.numel ? ints.numel : 1);
        if (!bytes) {
            attn_npy_i32_free(&ints);
            return cli_failure("out of memory for --mask (%zu bytes)", ints.numel);
        }
        for (size_t i = 0; i < ints.numel; i++) bytes[i] = ints.data[i] != 0;
        st = attn_block_mask_from_bool(ctx, &cfg, bytes, out->strides, &out->map);
        free(bytes);
    } else {
        st = attn_block_mask_from_additive(ctx, &cfg, out->values.data, out->strides, &out->map);
    }
    attn_npy_i32_free(&ints);
    if (st != ATTN_OK) return cli_library_error(ctx, "--mask");
    out->additive = !is_int;
    return CLI_OK;
}

/* --block-topk: the kept key blocks of each (b, h, query block), negative
 * entries dropped, as partial blocks whose elements desc leaves visible. */
static int build_topk(attn_ctx *ctx, const cli_mask_options *m, const cli_mask_geometry *g,
                      const attn_block_mask_config *base, const attn_mask *desc,
                      size_t desc_batch, cli_mask_built *out) {
    attn_npy_i32 topk = {0};
    if (attn_npy_read_i32(ctx, m->block_topk, &topk) != ATTN_OK)
        return cli_library_error(ctx, "--block-topk");
    size_t block = base->block_q ? base->block_q : 64;
    size_t q_blocks = (g->q_len + block - 1) / block;
    bool shaped = topk.ndim == 4 && (topk.shape[0] == 1 || topk.shape[0] == g->batch) &&
                  (topk.shape[1] == 1 || topk.shape[1] == g->heads) &&
                  topk.shape[2] == q_blocks;
    if (!shaped) {
        char got[128];
        cli_format_shape(got, sizeof got, topk.ndim, topk.shape);
        attn_npy_i32_free(&topk);
        return cli_usage_error("--block-topk: shape %s must be (B|1, H|1, QB, K) with B %zu, H "
                               "%zu and QB %zu (T %zu in blocks of %zu)",
                               got, g->batch, g->heads, q_blocks, g->q_len, block);
    }
    /* a key block out of range is named where it sits in the file: the
     * library sees the lists with their padding taken out */
    size_t kv_block = base->block_kv ? base->block_kv : 64;
    size_t kv_blocks = (g->kv_len + kv_block - 1) / kv_block, K = topk.shape[3];
    for (size_t e = 0; e < topk.numel; e++) {
        int32_t x = topk.data[e];
        if (x < 0 || (size_t)x < kv_blocks) continue;
        size_t list = e / K, qb = list % q_blocks, h = list / q_blocks % topk.shape[1];
        size_t b = list / q_blocks / topk.shape[1];
        attn_npy_i32_free(&topk);
        return cli_failure("--block-topk: '%s' holds %d at [%zu, %zu, %zu, %zu], past the key "
                           "blocks 0 .. %zu (S %zu in blocks of %zu; a negative entry pads)",
                           m->block_topk, (int)x, b, h, qb, e % K, kv_blocks - 1, g->kv_len,
                           kv_block);
    }
    attn_block_mask_config cfg = *base;
    cfg.batch = topk.shape[0] > desc_batch ? topk.shape[0] : desc_batch;
    cfg.heads = topk.shape[1];
    size_t lists = topk.shape[0] * topk.shape[1] * q_blocks, max = topk.shape[3];
    size_t rows = cfg.batch * cfg.heads * q_blocks;
    int32_t *num = malloc(rows * sizeof *num);
    size_t entries = rows * max;
    int32_t *indices = malloc((entries ? entries : 1) * sizeof *indices);
    if (!num || !indices) {
        free(num);
        free(indices);
        attn_npy_i32_free(&topk);
        return cli_failure("out of memory for --block-topk (%zu lists)", rows);
    }
    /* row (b, h, qb) of the map reads list (b or 0, h, qb) of the file */
    for (size_t r = 0; r < rows; r++) {
        size_t b = r / (cfg.heads * q_blocks), rest = r % (cfg.heads * q_blocks);
        size_t from = (topk.shape[0] == 1 ? 0 : b) * cfg.heads * q_blocks + rest;
        int32_t kept = 0;
        for (size_t k = 0; k < max && from < lists; k++) {
            int32_t index = topk.data[from * max + k];
            if (index >= 0) indices[r * max + (size_t)kept++] = index;
        }
        num[r] = kept;
    }
    attn_status st = attn_block_mask_from_kv_blocks(ctx, &cfg, num, indices, max, NULL, NULL, 0,
                                                    desc, &out->map);
    free(num);
    free(indices);
    attn_npy_i32_free(&topk);
    return st == ATTN_OK ? CLI_OK : cli_library_error(ctx, "--block-topk");
}

int cli_mask_build(attn_ctx *ctx, const cli_mask_options *m, const cli_mask_geometry *g,
                   cli_mask_built *out) {
    *out = (cli_mask_built){0};
    attn_block_mask_config base = {.batch = 1, .heads = 1, .q_len = g->q_len,
                                   .kv_len = g->kv_len, .block_q = m->block_size,
                                   .block_kv = m->block_size};
    if (m->mask) return build_dense(ctx, m, g, &base, out);
    attn_mask *desc = NULL;
    size_t desc_batch = 1;
    int rc = build_description(ctx, m, g, &desc, &desc_batch);
    if (rc != CLI_OK) return rc;
    if (m->block_topk) {
        rc = build_topk(ctx, m, g, &base, desc, desc_batch, out);
    } else if (desc) {
        base.batch = desc_batch;
        if (attn_block_mask_from_mask(ctx, &base, desc, &out->map) != ATTN_OK)
            rc = cli_library_error(ctx, description_option(m) ? description_option(m)
                                                               : "--causal");
    }
    attn_mask_free(desc);
    return rc;
}

void cli_mask_built_free(cli_mask_built *b) {
    attn_block_mask_free(b->map);
    attn_npy_free(&b->values);
    *b = (cli_mask_built){0};
}
