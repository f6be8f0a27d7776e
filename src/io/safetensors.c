/*
 * safetensors.c — Hugging Face's safetensors format, read and written.
 *
 *   bytes [0, 8)        N, the header length, u64 little-endian
 *   bytes [8, 8 + N)    JSON: {"__metadata__": {"k": "v", ...},
 *                              "name": {"dtype": "F32", "shape": [2, 3],
 *                                       "data_offsets": [begin, end]}, ...}
 *   bytes [8 + N, ...)  the data section; a tensor's bytes are
 *                       [begin, end) of it, row-major, little-endian
 *
 * The reader treats its input as hostile. The header is read token by token
 * with the library's JSON reader (io/json.h), accepting exactly that schema
 * (UTF-8 checked, escapes decoded, integers without sign, fraction or
 * exponent) straight into the tensor table, and then checked
 * as the reference implementation checks it: each tensor's byte count is
 * its shape's element count times its dtype's size, and the tensors' ranges,
 * in offset order, tile the data section with no overlap, gap or remainder.
 * Every size product and sum is checked for overflow. No tensor data is read
 * until it is asked for, so opening a 500 MB checkpoint reads its header.
 *
 * The writer produces what the reference writer produces for F32 tensors:
 * the tensors sorted by name, "__metadata__" first, serde_json's compact
 * spelling and escapes, the header padded with spaces to a multiple of 8.
 */
#define _XOPEN_SOURCE 700 /* fstat, fileno */
#include "half.h"
#include "internal.h"
#include "utf8.h"
#include "io/file.h"

#include "io/json.h"
#include "io/safetensors_internal.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

_Static_assert(sizeof(float) == 4, "float must be IEEE binary32");
_Static_assert(sizeof(double) == 8, "double must be IEEE binary64");

#define ST_TEXT_MAX 64     /* a name as quoted in a message */
#define ST_CHUNK 16384     /* bytes read per step when converting */

static const char *const memory_label = "<memory>";

/* ---- dtypes -------------------------------------------------------------- */

typedef struct dtype_desc {
    const char *name;
    attn_dtype dtype;
    size_t size;
} dtype_desc;

static const dtype_desc dtypes[] = {
    {"F32", ATTN_DTYPE_F32, 4},         {"F16", ATTN_DTYPE_F16, 2},
    {"BF16", ATTN_DTYPE_BF16, 2},       {"F64", ATTN_DTYPE_F64, 8},
    {"BOOL", ATTN_DTYPE_BOOL, 1},       {"U8", ATTN_DTYPE_U8, 1},
    {"I8", ATTN_DTYPE_I8, 1},           {"I16", ATTN_DTYPE_I16, 2},
    {"U16", ATTN_DTYPE_U16, 2},         {"I32", ATTN_DTYPE_I32, 4},
    {"U32", ATTN_DTYPE_U32, 4},         {"I64", ATTN_DTYPE_I64, 8},
    {"U64", ATTN_DTYPE_U64, 8},         {"F8_E4M3", ATTN_DTYPE_F8_E4M3, 1},
    {"F8_E5M2", ATTN_DTYPE_F8_E5M2, 1},
};
#define NUM_DTYPES (sizeof dtypes / sizeof dtypes[0])

const char *attn_dtype_name(attn_dtype dtype) {
    if (dtype == ATTN_DTYPE_I4) return "I4"; /* a KV cache's, not a safetensors dtype */
    for (size_t i = 0; i < NUM_DTYPES; i++)
        if (dtypes[i].dtype == dtype) return dtypes[i].name;
    return "?";
}

static size_t dtype_size(attn_dtype dtype) {
    for (size_t i = 0; i < NUM_DTYPES; i++)
        if (dtypes[i].dtype == dtype) return dtypes[i].size;
    return 0;
}

static bool dtype_loadable(attn_dtype d) {
    return d == ATTN_DTYPE_F32 || d == ATTN_DTYPE_F16 || d == ATTN_DTYPE_BF16 ||
           d == ATTN_DTYPE_F64;
}

/* ---- the parsed file ----------------------------------------------------- */

typedef struct st_tensor {
    char *name;
    attn_dtype dtype;
    size_t ndim;
    size_t shape[ATTN_SAFETENSORS_MAX_DIMS];
    size_t numel;
    size_t begin, end;
    size_t shard, shard_index; /* a sharded checkpoint's: where the tensor lies */
} st_tensor;

struct attn_safetensors {
    attn_ctx *ctx;
    char *label;                /* the path, or "<memory>" */
    FILE *file;                 /* when opened from a path */
    unsigned char *image;       /* when parsed from memory: the data section */
    size_t data_start;          /* 8 + N: where the data section starts */
    size_t data_size;
    st_tensor *tensors;         /* sorted by data offsets */
    size_t count, capacity;
    size_t *by_name;            /* indices into tensors, sorted by name */
    attn_metadata_entry *meta;  /* strings owned here */
    size_t meta_count, meta_capacity;
    /* a sharded checkpoint (attn_safetensors_open_index): the files its
     * tensors lie in, each tensor's data read from its own, with one file
     * open at a time (open_shard; shard_count: none), so that a model of
     * hundreds of shards holds one descriptor */
    attn_safetensors **shards;
    size_t shard_count, open_shard;
    /* a file opened from a path: which file it is, to know it again when
     * it is opened again (a shard's) */
    dev_t device;
    ino_t inode;
};

/* Untrusted text (a name, a key) for a message, escaped as messages quote
 * it (attn_escape_text). */
static void printable(char *dst, size_t cap, const char *src) {
    attn_escape_text(dst, cap, src, strlen(src));
}

/* Writes "[2, 3]" for a shape into buf. */
static void format_shape(char *buf, size_t cap, size_t ndim, const size_t *shape) {
    size_t len = 0;
    len += (size_t)snprintf(buf + len, cap - len, "[");
    for (size_t i = 0; i < ndim && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, i ? ", %zu" : "%zu", shape[i]);
    if (len < cap) snprintf(buf + len, cap - len, "]");
}

/* ---- reading the header ---------------------------------------------------- */

/* "tensor 'name'" for messages, the name made printable. */
static void tensor_owner(char *buf, size_t cap, const char *tensor) {
    char name[ST_TEXT_MAX];
    printable(name, sizeof name, tensor);
    snprintf(buf, cap, "tensor '%s'", name);
}

/* [a, b, ...] of sizes; at most max of them. */
static attn_status read_size_array(attn_json_reader *c, size_t *values, size_t max, size_t *count,
                                   const char *what, const char *tensor) {
    attn_status st = attn_json_expect(c, '[', "'['");
    if (st != ATTN_OK) return st;
    *count = 0;
    if (attn_json_accept(c, ']')) return ATTN_OK;
    char owner[ST_TEXT_MAX + 16];
    tensor_owner(owner, sizeof owner, tensor);
    for (;;) {
        uint64_t v = 0;
        if ((st = attn_json_read_uint(c, SIZE_MAX, owner, what, &v)) != ATTN_OK) return st;
        if (*count == max)
            return attn_fail(c->ctx, ATTN_ERR_FORMAT, "%s: %s: %s has more than %zu entries",
                             c->label, owner, what, max);
        values[(*count)++] = (size_t)v;
        if (attn_json_accept(c, ',')) continue;
        return attn_json_expect(c, ']', "',' or ']'");
    }
}

/* ---- building the parsed file ------------------------------------------- */

static attn_status grow(attn_ctx *ctx, const char *label, void **items, size_t *capacity,
                        size_t count, size_t item_size) {
    if (count < *capacity) return ATTN_OK;
    size_t cap = *capacity ? 2 * *capacity : 16;
    void *grown = cap > (size_t)-1 / item_size ? NULL : attn_realloc(*items, cap * item_size);
    if (!grown) return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory for the header", label);
    *items = grown;
    *capacity = cap;
    return ATTN_OK;
}

static attn_status parse_dtype(attn_json_reader *c, const char *tensor, attn_dtype *out) {
    char *text;
    attn_status st = attn_json_read_string(c, "a dtype string", &text, NULL);
    if (st != ATTN_OK) return st;
    for (size_t i = 0; i < NUM_DTYPES; i++) {
        if (strcmp(text, dtypes[i].name) == 0) {
            *out = dtypes[i].dtype;
            attn_free(text);
            return ATTN_OK;
        }
    }
    char name[ST_TEXT_MAX], dtype[ST_TEXT_MAX];
    printable(name, sizeof name, tensor);
    printable(dtype, sizeof dtype, text);
    attn_free(text);
    return attn_fail(c->ctx, ATTN_ERR_FORMAT,
                     "%s: tensor '%s': unknown dtype '%s' (safetensors dtypes: F64, F32, F16, "
                     "BF16, I64, I32, I16, I8, U64, U32, U16, U8, BOOL, F8_E4M3, F8_E5M2)",
                     c->label, name, dtype);
}

/* {"dtype": ..., "shape": [...], "data_offsets": [b, e]} */
static attn_status parse_tensor(attn_json_reader *c, st_tensor *t) {
    char name[ST_TEXT_MAX];
    printable(name, sizeof name, t->name);
    if (!attn_json_accept(c, '{')) {
        if (c->p >= c->end) return attn_json_expected(c, "'{' starting a tensor's entry");
        return attn_fail(c->ctx, ATTN_ERR_FORMAT,
                         "%s: tensor '%s': its entry at byte %zu is not an object {\"dtype\", "
                         "\"shape\", \"data_offsets\"}",
                         c->label, name, attn_json_offset(c));
    }
    bool have_dtype = false, have_shape = false, have_offsets = false;
    attn_status st;
    if (!attn_json_accept(c, '}')) {
        for (;;) {
            char *key;
            if ((st = attn_json_read_string(c, "a quoted key", &key, NULL)) != ATTN_OK) return st;
            if ((st = attn_json_expect(c, ':', "':' after a key")) != ATTN_OK) {
                attn_free(key);
                return st;
            }
            bool *seen = strcmp(key, "dtype") == 0          ? &have_dtype
                         : strcmp(key, "shape") == 0        ? &have_shape
                         : strcmp(key, "data_offsets") == 0 ? &have_offsets
                                                            : NULL;
            if (!seen || *seen) {
                char k[ST_TEXT_MAX];
                printable(k, sizeof k, key);
                attn_free(key);
                return attn_fail(c->ctx, ATTN_ERR_FORMAT,
                                 seen ? "%s: tensor '%s': duplicate key '%s'"
                                      : "%s: tensor '%s': unknown key '%s' (expected dtype, shape, "
                                        "data_offsets)",
                                 c->label, name, k);
            }
            attn_free(key);
            *seen = true;
            if (seen == &have_dtype) {
                st = parse_dtype(c, t->name, &t->dtype);
            } else if (seen == &have_shape) {
                st = read_size_array(c, t->shape, ATTN_SAFETENSORS_MAX_DIMS, &t->ndim, "shape",
                                     t->name);
            } else {
                size_t offsets[2] = {0, 0}, n = 0;
                st = read_size_array(c, offsets, 2, &n, "data_offsets", t->name);
                if (st == ATTN_OK && n != 2)
                    st = attn_fail(c->ctx, ATTN_ERR_FORMAT,
                                   "%s: tensor '%s': data_offsets has %zu entries, expected 2 "
                                   "[begin, end]",
                                   c->label, name, n);
                t->begin = offsets[0];
                t->end = n == 2 ? offsets[1] : 0;
            }
            if (st != ATTN_OK) return st;
            if (attn_json_accept(c, ',')) continue;
            if ((st = attn_json_expect(c, '}', "',' or '}'")) != ATTN_OK) return st;
            break;
        }
    }
    const char *missing = !have_dtype ? "dtype" : !have_shape ? "shape" : !have_offsets ? "data_offsets" : NULL;
    if (missing)
        return attn_fail(c->ctx, ATTN_ERR_FORMAT, "%s: tensor '%s' lacks '%s'", c->label, name,
                         missing);
    return ATTN_OK;
}

/* "__metadata__": {"key": "value", ...} */
static attn_status parse_metadata(attn_json_reader *c, attn_safetensors *st) {
    attn_status s = attn_json_expect(c, '{', "'{' starting __metadata__");
    if (s != ATTN_OK) return s;
    if (attn_json_accept(c, '}')) return ATTN_OK;
    for (;;) {
        if ((s = grow(st->ctx, st->label, (void **)&st->meta, &st->meta_capacity, st->meta_count,
                      sizeof *st->meta)) != ATTN_OK)
            return s;
        attn_metadata_entry *e = &st->meta[st->meta_count];
        char *key = NULL, *value = NULL;
        if ((s = attn_json_read_string(c, "a quoted key in __metadata__", &key, NULL)) != ATTN_OK)
            return s;
        if ((s = attn_json_expect(c, ':', "':' after a key")) == ATTN_OK) {
            attn_json_skip_space(c);
            if (c->p < c->end && *c->p != '"') {
                char k[ST_TEXT_MAX];
                printable(k, sizeof k, key);
                s = attn_fail(st->ctx, ATTN_ERR_FORMAT,
                              "%s: __metadata__ value of '%s' is not a string (byte %zu)",
                              st->label, k, attn_json_offset(c));
            } else {
                s = attn_json_read_string(c, "a string value in __metadata__", &value, NULL);
            }
        }
        if (s == ATTN_OK) {
            for (size_t i = 0; i < st->meta_count; i++) {
                if (strcmp(st->meta[i].key, key) == 0) {
                    char k[ST_TEXT_MAX];
                    printable(k, sizeof k, key);
                    s = attn_fail(st->ctx, ATTN_ERR_FORMAT,
                                  "%s: duplicate key '%s' in __metadata__", st->label, k);
                    break;
                }
            }
        }
        if (s != ATTN_OK) {
            attn_free(key);
            attn_free(value);
            return s;
        }
        e->key = key;
        e->value = value;
        st->meta_count++;
        if (attn_json_accept(c, ',')) continue;
        return attn_json_expect(c, '}', "',' or '}' in __metadata__");
    }
}

/* The header, read as it is scanned (UTF-8 checked; offsets in messages are
 * file offsets, the header starting at byte 8). */
static attn_status parse_header(attn_safetensors *st, const unsigned char *text, size_t len) {
    attn_json_reader cur;
    attn_json_reader_init(&cur, st->ctx, text, len, st->label);
    cur.subject = "header";
    cur.base = 8;
    cur.check_utf8 = true;
    attn_json_reader *c = &cur;
    attn_status s;
    bool have_metadata = false;
    if (!attn_json_accept(c, '{'))
        return attn_fail(st->ctx, ATTN_ERR_FORMAT,
                         "%s: header is not a JSON object: it must start with '{'%s", st->label,
                         len == 0 ? " (the header is empty)" : "");
    if (!attn_json_accept(c, '}')) {
        for (;;) {
            char *key;
            if ((s = attn_json_read_string(c, "a quoted tensor name or '}'", &key, NULL)) !=
                ATTN_OK)
                return s;
            if ((s = attn_json_expect(c, ':', "':' after a key")) != ATTN_OK) {
                attn_free(key);
                return s;
            }
            if (strcmp(key, "__metadata__") == 0) {
                attn_free(key);
                if (have_metadata)
                    return attn_fail(st->ctx, ATTN_ERR_FORMAT, "%s: duplicate key '__metadata__'",
                                     st->label);
                have_metadata = true;
                if ((s = parse_metadata(c, st)) != ATTN_OK) return s;
            } else {
                if ((s = grow(st->ctx, st->label, (void **)&st->tensors, &st->capacity, st->count,
                              sizeof *st->tensors)) != ATTN_OK) {
                    attn_free(key);
                    return s;
                }
                st_tensor *t = &st->tensors[st->count++];
                memset(t, 0, sizeof *t);
                t->name = key;
                if (key[0] == '\0')
                    return attn_fail(st->ctx, ATTN_ERR_FORMAT, "%s: a tensor has an empty name",
                                     st->label);
                if ((s = parse_tensor(c, t)) != ATTN_OK) return s;
            }
            if (attn_json_accept(c, ',')) continue;
            if ((s = attn_json_expect(c, '}', "',' or '}'")) != ATTN_OK) return s;
            break;
        }
    }
    return attn_json_end(c, "the object");
}

/* ---- checks of the parsed header ----------------------------------------- */

static int compare_offsets(const void *a, const void *b) {
    const st_tensor *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* qsort has no user pointer, so each index carries the tensor array. */
typedef struct name_index {
    const st_tensor *tensors;
    size_t index;
} name_index;

static int compare_names(const void *a, const void *b) {
    const name_index *x = a, *y = b;
    return strcmp(x->tensors[x->index].name, y->tensors[y->index].name);
}

static attn_status sort_names(attn_safetensors *st);

static attn_status check_tensors(attn_safetensors *st) {
    attn_ctx *ctx = st->ctx;
    for (size_t i = 0; i < st->count; i++) {
        st_tensor *t = &st->tensors[i];
        char name[ST_TEXT_MAX], shape[160];
        printable(name, sizeof name, t->name);
        format_shape(shape, sizeof shape, t->ndim, t->shape);
        size_t numel = 0;
        if (attn_shape_numel(t->ndim, t->shape, NULL, &numel) < t->ndim)
            return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                             "%s: tensor '%s': shape %s overflows size_t", st->label, name,
                             shape);
        size_t bytes;
        if (!attn_mul_size(numel, dtype_size(t->dtype), &bytes))
            return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                             "%s: tensor '%s': %s shape %s overflows size_t in bytes", st->label,
                             name, attn_dtype_name(t->dtype), shape);
        t->numel = numel;
        if (t->end < t->begin)
            return attn_fail(ctx, ATTN_ERR_FORMAT,
                             "%s: tensor '%s': data_offsets [%zu, %zu] end before they begin",
                             st->label, name, t->begin, t->end);
        if (t->end - t->begin != bytes)
            return attn_fail(ctx, ATTN_ERR_FORMAT,
                             "%s: tensor '%s': data_offsets [%zu, %zu] hold %zu bytes, but %s "
                             "shape %s needs %zu",
                             st->label, name, t->begin, t->end, t->end - t->begin,
                             attn_dtype_name(t->dtype), shape, bytes);
        if (t->end > st->data_size)
            return attn_fail(ctx, ATTN_ERR_FORMAT,
                             "%s: tensor '%s': data_offsets [%zu, %zu] reach past the end of the "
                             "data section (%zu bytes)",
                             st->label, name, t->begin, t->end, st->data_size);
    }
    if (st->count) qsort(st->tensors, st->count, sizeof *st->tensors, compare_offsets);
    size_t covered = 0;
    for (size_t i = 0; i < st->count; i++) {
        const st_tensor *t = &st->tensors[i];
        char name[ST_TEXT_MAX];
        printable(name, sizeof name, t->name);
        if (t->begin < covered) {
            const st_tensor *prev = &st->tensors[i - 1];
            char other[ST_TEXT_MAX];
            printable(other, sizeof other, prev->name);
            return attn_fail(ctx, ATTN_ERR_FORMAT,
                             "%s: tensor '%s' data_offsets [%zu, %zu] overlap tensor '%s' [%zu, %zu]",
                             st->label, name, t->begin, t->end, other, prev->begin, prev->end);
        }
        if (t->begin > covered)
            return attn_fail(ctx, ATTN_ERR_FORMAT,
                             "%s: gap in the data section: bytes [%zu, %zu) belong to no tensor "
                             "(tensor '%s' begins at %zu)",
                             st->label, covered, t->begin, name, t->begin);
        covered = t->end;
    }
    if (covered != st->data_size)
        return attn_fail(ctx, ATTN_ERR_FORMAT,
                         "%s: the data section has %zu bytes, but the tensors cover %zu (%zu "
                         "bytes belong to no tensor)",
                         st->label, st->data_size, covered, st->data_size - covered);

    return sort_names(st);
}

/* The names sorted for lookup (by_name), duplicates rejected (in a
 * sharded checkpoint, naming both shards). */
static attn_status sort_names(attn_safetensors *st) {
    attn_ctx *ctx = st->ctx;
    name_index *idx = st->count ? attn_malloc(st->count * sizeof *idx) : NULL;
    st->by_name = st->count ? attn_malloc(st->count * sizeof *st->by_name) : NULL;
    if (st->count && (!idx || !st->by_name)) {
        attn_free(idx);
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory for %zu names", st->label,
                         st->count);
    }
    for (size_t i = 0; i < st->count; i++) idx[i] = (name_index){st->tensors, i};
    if (st->count) qsort(idx, st->count, sizeof *idx, compare_names);
    attn_status s = ATTN_OK;
    for (size_t i = 0; i < st->count; i++) {
        st->by_name[i] = idx[i].index;
        if (i > 0 && strcmp(st->tensors[idx[i].index].name, st->tensors[idx[i - 1].index].name) == 0 &&
            s == ATTN_OK) {
            char name[ST_TEXT_MAX];
            const st_tensor *t = &st->tensors[idx[i].index], *u = &st->tensors[idx[i - 1].index];
            printable(name, sizeof name, t->name);
            if (st->shards)
                s = attn_fail(ctx, ATTN_ERR_FORMAT, "%s: tensor '%s' is in two shards, %s and %s",
                              st->label, name, st->shards[u->shard]->label,
                              st->shards[t->shard]->label);
            else
                s = attn_fail(ctx, ATTN_ERR_FORMAT, "%s: duplicate tensor name '%s'", st->label,
                              name);
        }
    }
    attn_free(idx);
    return s;
}

/* ---- opening ------------------------------------------------------------- */

static attn_safetensors *new_file(attn_ctx *ctx, const char *label) {
    attn_safetensors *st = attn_calloc(1, sizeof *st);
    if (!st) return NULL;
    st->ctx = ctx;
    size_t n = strlen(label) + 1;
    st->label = attn_malloc(n);
    if (!st->label) {
        attn_free(st);
        return NULL;
    }
    memcpy(st->label, label, n);
    return st;
}

void attn_safetensors_free(attn_safetensors *st) {
    if (!st) return;
    for (size_t i = 0; i < st->count; i++) attn_free(st->tensors[i].name);
    for (size_t i = 0; i < st->meta_count; i++) {
        attn_free((char *)st->meta[i].key);
        attn_free((char *)st->meta[i].value);
    }
    for (size_t i = 0; i < st->shard_count; i++) attn_safetensors_free(st->shards[i]);
    attn_free(st->shards);
    attn_free(st->tensors);
    attn_free(st->by_name);
    attn_free(st->meta);
    attn_free(st->image);
    attn_free(st->label);
    if (st->file) fclose(st->file);
    attn_free(st);
}

static uint64_t read_u64_le(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* Checks N against the limit and the bytes available after the 8-byte
 * prefix, and sets the data section's place and size. */
static attn_status header_size(attn_safetensors *st, uint64_t n, size_t total, size_t *len) {
    if (n > ATTN_SAFETENSORS_MAX_HEADER)
        return attn_fail(st->ctx, ATTN_ERR_FORMAT,
                         "%s: header length %llu exceeds the limit of %zu bytes (not a "
                         "safetensors file?)",
                         st->label, (unsigned long long)n, ATTN_SAFETENSORS_MAX_HEADER);
    if (n > total - 8)
        return attn_fail(st->ctx, ATTN_ERR_FORMAT,
                         "%s: header length %llu exceeds the %zu bytes after the length field",
                         st->label, (unsigned long long)n, total - 8);
    *len = (size_t)n;
    st->data_start = 8 + (size_t)n;
    st->data_size = total - st->data_start;
    return ATTN_OK;
}

static attn_status too_short(attn_safetensors *st, size_t total) {
    return attn_fail(st->ctx, ATTN_ERR_FORMAT,
                     "%s: not a safetensors file: %zu bytes, fewer than the 8-byte header length",
                     st->label, total);
}

attn_status attn_safetensors_parse(attn_ctx *ctx, const void *bytes, size_t size,
                                   attn_safetensors **out) {
    attn_clear_error(ctx);
    if (!out) return attn_fail(ctx, ATTN_ERR_NULL, "attn_safetensors_parse: out is NULL");
    *out = NULL;
    if (!bytes && size) return attn_fail(ctx, ATTN_ERR_NULL, "attn_safetensors_parse: bytes is NULL");
    attn_safetensors *st = new_file(ctx, memory_label);
    if (!st) return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_safetensors_parse: out of memory");
    const unsigned char *p = bytes;
    size_t len = 0;
    attn_status s = size < 8 ? too_short(st, size) : header_size(st, read_u64_le(p), size, &len);
    if (s == ATTN_OK) s = parse_header(st, p + 8, len);
    if (s == ATTN_OK) s = check_tensors(st);
    if (s == ATTN_OK) {
        st->image = attn_malloc(st->data_size ? st->data_size : 1);
        if (!st->image) s = attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory for %zu data bytes",
                                      st->label, st->data_size);
        else if (st->data_size) memcpy(st->image, p + st->data_start, st->data_size);
    }
    if (s != ATTN_OK) {
        attn_safetensors_free(st);
        return s;
    }
    *out = st;
    return ATTN_OK;
}

attn_status attn_safetensors_open(attn_ctx *ctx, const char *path, attn_safetensors **out) {
    attn_clear_error(ctx);
    if (!out) return attn_fail(ctx, ATTN_ERR_NULL, "attn_safetensors_open: out is NULL");
    *out = NULL;
    if (!path) return attn_fail(ctx, ATTN_ERR_NULL, "attn_safetensors_open: path is NULL");
    attn_safetensors *st = new_file(ctx, path);
    if (!st) return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_safetensors_open: out of memory");
    attn_status s = ATTN_OK;
    unsigned char *text = NULL;
    st->file = attn_file_open_read(path);
    if (!st->file) s = attn_fail(ctx, ATTN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    /* a device such as /dev/zero seeks to an end of 0 bytes: its size is no size */
    struct stat info;
    if (s == ATTN_OK && fstat(fileno(st->file), &info) == 0) {
        if (!S_ISREG(info.st_mode))
            s = attn_fail(ctx, ATTN_ERR_IO, "%s: not a regular file (a safetensors file is read "
                          "by its size)", path);
        st->device = info.st_dev;
        st->inode = info.st_ino;
    }
    long end = -1;
    if (s == ATTN_OK && (fseek(st->file, 0, SEEK_END) != 0 || (end = ftell(st->file)) < 0 ||
                         fseek(st->file, 0, SEEK_SET) != 0))
        s = attn_fail(ctx, ATTN_ERR_IO, "%s: cannot find the file's size (not a regular file?)",
                      path);
    unsigned char prefix[8];
    size_t total = end < 0 ? 0 : (size_t)end, len = 0;
    if (s == ATTN_OK) {
        if (total < 8) s = too_short(st, total);
        else if (fread(prefix, 1, 8, st->file) != 8)
            s = attn_fail(ctx, ATTN_ERR_IO, "%s: read failed: %s", path, strerror(errno));
        else s = header_size(st, read_u64_le(prefix), total, &len);
    }
    if (s == ATTN_OK) {
        text = attn_malloc(len ? len : 1);
        if (!text) s = attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory for a %zu-byte header",
                                 path, len);
        else if (fread(text, 1, len, st->file) != len)
            s = attn_fail(ctx, ATTN_ERR_IO, "%s: read failed in the header: %s", path,
                          strerror(errno));
    }
    if (s == ATTN_OK) s = parse_header(st, text, len);
    attn_free(text);
    if (s == ATTN_OK) s = check_tensors(st);
    if (s != ATTN_OK) {
        attn_safetensors_free(st);
        return s;
    }
    *out = st;
    return ATTN_OK;
}

/* ---- sharded checkpoints ------------------------------------------------- */

/* Whether an index's shard name is a plain file name, which lies in the
 * index's own directory (an index cannot point elsewhere). */
static bool plain_file_name(const char *name) {
    return name[0] && strcmp(name, ".") != 0 && strcmp(name, "..") != 0 && !strchr(name, '/');
}

/* Shard k's file open, the one open before it closed: the same file the
 * index's opening read (device, inode and size), or ATTN_ERR_IO naming it. */
static attn_status open_shard(attn_safetensors *st, size_t k) {
    if (st->open_shard == k) return ATTN_OK;
    if (st->open_shard < st->shard_count) {
        attn_safetensors *was = st->shards[st->open_shard];
        fclose(was->file);
        was->file = NULL;
        st->open_shard = st->shard_count;
    }
    attn_safetensors *shard = st->shards[k];
    FILE *f = attn_file_open_read(shard->label);
    if (!f)
        return attn_fail(st->ctx, ATTN_ERR_IO, "%s: cannot open again: %s", shard->label,
                         strerror(errno));
    struct stat info;
    if (fstat(fileno(f), &info) != 0 || info.st_dev != shard->device ||
        info.st_ino != shard->inode || info.st_size < 0 ||
        (size_t)info.st_size != shard->data_start + shard->data_size) {
        fclose(f);
        return attn_fail(st->ctx, ATTN_ERR_IO,
                         "%s: the file changed since the index %s was read", shard->label,
                         st->label);
    }
    shard->file = f;
    st->open_shard = k;
    return ATTN_OK;
}

/* Whether item i of a JSON object is its key's last, the one Python's
 * json keeps (and attn_json_get finds) where a key repeats. */
static bool last_of_key(const attn_json *obj, size_t i) {
    return attn_json_get(obj, obj->keys[i]) == &obj->items[i];
}

/* The shards' tensors, in the order of the shards and of their data,
 * each with the shard and the index it has there. */
static attn_status gather_shards(attn_safetensors *st) {
    size_t total = 0;
    for (size_t k = 0; k < st->shard_count; k++)
        if (!attn_add_size(total, st->shards[k]->count, &total))
            return attn_fail(st->ctx, ATTN_ERR_OVERFLOW, "%s: too many tensors", st->label);
    st->tensors = attn_calloc(total ? total : 1, sizeof *st->tensors);
    if (!st->tensors)
        return attn_fail(st->ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory for %zu tensors",
                         st->label, total);
    st->capacity = total;
    for (size_t k = 0; k < st->shard_count; k++) {
        const attn_safetensors *shard = st->shards[k];
        for (size_t j = 0; j < shard->count; j++) {
            st_tensor *t = &st->tensors[st->count];
            *t = shard->tensors[j];
            size_t n = strlen(t->name) + 1;
            if (!(t->name = attn_malloc(n)))
                return attn_fail(st->ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory", st->label);
            memcpy(t->name, shard->tensors[j].name, n);
            t->shard = k;
            t->shard_index = j;
            st->count++;
        }
    }
    return ATTN_OK;
}

attn_status attn_safetensors_open_index(attn_ctx *ctx, const char *index_path,
                                        attn_safetensors **out) {
    const char *who = "attn_safetensors_open_index";
    attn_clear_error(ctx);
    if (!out) return attn_fail(ctx, ATTN_ERR_NULL, "%s: out is NULL", who);
    *out = NULL;
    if (!index_path) return attn_fail(ctx, ATTN_ERR_NULL, "%s: index_path is NULL", who);
    attn_json *root = NULL;
    attn_status s = attn_json_read_file(ctx, index_path, &root);
    if (s != ATTN_OK) return s;
    attn_safetensors *st = new_file(ctx, index_path);
    const attn_json *map = root->type == ATTN_JSON_OBJECT ? attn_json_get(root, "weight_map") : NULL;
    const char **names = map && map->type == ATTN_JSON_OBJECT
                             ? attn_calloc(map->count ? map->count : 1, sizeof *names)
                             : NULL;
    if (!st || (map && map->type == ATTN_JSON_OBJECT && !names))
        s = attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory", who);
    else if (!map || map->type != ATTN_JSON_OBJECT)
        s = attn_fail(ctx, ATTN_ERR_FORMAT,
                      "%s: no \"weight_map\" object (a sharded checkpoint's index names each "
                      "tensor's file there)", index_path);
    /* the shards, each named once, in the order the map first names them */
    size_t n_names = 0;
    for (size_t i = 0; s == ATTN_OK && i < map->count; i++) {
        if (!last_of_key(map, i)) continue;
        const char *file = map->items[i].type == ATTN_JSON_STRING ? map->items[i].string : NULL;
        if (!file || !plain_file_name(file)) {
            char key[ST_TEXT_MAX], value[ST_TEXT_MAX];
            printable(key, sizeof key, map->keys[i]);
            printable(value, sizeof value, file ? file : "(not a string)");
            s = attn_fail(ctx, ATTN_ERR_FORMAT,
                          "%s: weight_map[\"%s\"] is %s%s%s: it must be the name of a file "
                          "beside the index", index_path, key, file ? "\"" : "", value,
                          file ? "\"" : "");
            break;
        }
        size_t k = 0;
        while (k < n_names && strcmp(names[k], file) != 0) k++;
        if (k == n_names) names[n_names++] = file;
    }
    if (s == ATTN_OK) {
        st->shards = attn_calloc(n_names ? n_names : 1, sizeof *st->shards);
        if (!st->shards) s = attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory", who);
    }
    const char *slash = strrchr(index_path, '/');
    size_t dir_len = slash ? (size_t)(slash - index_path) + 1 : 0;
    for (size_t k = 0; s == ATTN_OK && k < n_names; k++) {
        size_t n = strlen(names[k]);
        char *path = attn_malloc(dir_len + n + 1);
        if (!path) {
            s = attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory", who);
            break;
        }
        memcpy(path, index_path, dir_len);
        memcpy(path + dir_len, names[k], n + 1);
        s = attn_safetensors_open(ctx, path, &st->shards[k]);
        attn_free(path);
        if (s == ATTN_OK) {
            /* read again when a tensor of it is loaded (open_shard) */
            fclose(st->shards[k]->file);
            st->shards[k]->file = NULL;
            st->shard_count++;
        }
    }
    if (st) st->open_shard = st->shard_count; /* none */
    if (s == ATTN_OK) s = gather_shards(st);
    if (s == ATTN_OK) s = sort_names(st);
    /* every tensor the map names lies in the shard it names */
    for (size_t i = 0; s == ATTN_OK && i < map->count; i++) {
        if (!last_of_key(map, i)) continue;
        size_t k = 0;
        while (strcmp(names[k], map->items[i].string) != 0) k++;
        if (attn_safetensors_index(st->shards[k], map->keys[i]) == st->shards[k]->count) {
            char key[ST_TEXT_MAX];
            printable(key, sizeof key, map->keys[i]);
            s = attn_fail(ctx, ATTN_ERR_FORMAT,
                          "%s: weight_map puts '%s' in %s, which holds no such tensor",
                          index_path, key, st->shards[k]->label);
        }
    }
    attn_free(names);
    attn_json_free(root);
    if (s != ATTN_OK) {
        attn_safetensors_free(st);
        return s;
    }
    *out = st;
    return ATTN_OK;
}

/* ---- queries ------------------------------------------------------------- */

attn_ctx *attn_safetensors_ctx(const attn_safetensors *st) { return st ? st->ctx : NULL; }

size_t attn_safetensors_count(const attn_safetensors *st) { return st ? st->count : 0; }

static void fill_info(const attn_safetensors *st, size_t index, attn_safetensors_info *out) {
    const st_tensor *t = &st->tensors[index];
    memset(out, 0, sizeof *out);
    out->index = index;
    out->name = t->name;
    out->dtype = t->dtype;
    out->ndim = t->ndim;
    memcpy(out->shape, t->shape, sizeof out->shape);
    out->numel = t->numel;
    out->data_begin = t->begin;
    out->data_end = t->end;
}

attn_status attn_safetensors_info_at(attn_safetensors *st, size_t index,
                                     attn_safetensors_info *out) {
    if (!st) return ATTN_ERR_NULL;
    attn_clear_error(st->ctx);
    if (!out) return attn_fail(st->ctx, ATTN_ERR_NULL, "attn_safetensors_info_at: out is NULL");
    if (index >= st->count)
        return attn_fail(st->ctx, ATTN_ERR_NOT_FOUND, "%s has %zu tensors; index %zu is out of range",
                         st->label, st->count, index);
    fill_info(st, index, out);
    return ATTN_OK;
}

/* The index of name, or st->count. */
static size_t find_index(const attn_safetensors *st, const char *name) {
    size_t lo = 0, hi = st->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(st->tensors[st->by_name[mid]].name, name);
        if (c == 0) return st->by_name[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return st->count;
}

attn_status attn_safetensors_find(attn_safetensors *st, const char *name,
                                  attn_safetensors_info *out) {
    if (!st) return ATTN_ERR_NULL;
    attn_clear_error(st->ctx);
    if (!name || !out)
        return attn_fail(st->ctx, ATTN_ERR_NULL, "attn_safetensors_find: %s is NULL",
                         !name ? "name" : "out");
    size_t i = find_index(st, name);
    if (i == st->count) {
        char text[ST_TEXT_MAX];
        printable(text, sizeof text, name);
        return attn_fail(st->ctx, ATTN_ERR_NOT_FOUND, "%s has no tensor named '%s'", st->label, text);
    }
    fill_info(st, i, out);
    return ATTN_OK;
}

size_t attn_safetensors_metadata_count(const attn_safetensors *st) {
    return st ? st->meta_count : 0;
}

attn_status attn_safetensors_metadata_at(attn_safetensors *st, size_t index,
                                         attn_metadata_entry *out) {
    if (!st) return ATTN_ERR_NULL;
    attn_clear_error(st->ctx);
    if (!out) return attn_fail(st->ctx, ATTN_ERR_NULL, "attn_safetensors_metadata_at: out is NULL");
    if (index >= st->meta_count)
        return attn_fail(st->ctx, ATTN_ERR_NOT_FOUND,
                         "%s has %zu metadata entries; index %zu is out of range", st->label,
                         st->meta_count, index);
    *out = st->meta[index];
    return ATTN_OK;
}

const char *attn_safetensors_metadata_get(const attn_safetensors *st, const char *key) {
    if (!st || !key) return NULL;
    for (size_t i = 0; i < st->meta_count; i++)
        if (strcmp(st->meta[i].key, key) == 0) return st->meta[i].value;
    return NULL;
}

/* ---- loading data -------------------------------------------------------- */

/* Round to nearest, without the undefined behaviour ISO C gives a double
 * outside float's range: from FLT_MAX + half an ulp it is infinity, which
 * *past notes for a finite d. */
static float narrow_double(double d, bool *past) {
    const double limit = 0x1.ffffffp127;
    if (d >= limit || d <= -limit) {
        *past |= isfinite(d);
        return d > 0 ? INFINITY : -INFINITY;
    }
    return (float)d;
}

/* Element i of little-endian F64 bytes. */
static double f64_at(const unsigned char *src, size_t i) {
    uint64_t u = 0;
    for (int k = 7; k >= 0; k--) u = u << 8 | src[8 * i + (size_t)k];
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

/* The first of count F64 elements of src that is finite past float's range
 * (SIZE_MAX: none), and its value. */
static size_t first_past_float(const unsigned char *src, size_t count, double *value) {
    for (size_t i = 0; i < count; i++) {
        bool past = false;
        narrow_double(f64_at(src, i), &past);
        if (past) {
            *value = f64_at(src, i);
            return i;
        }
    }
    return SIZE_MAX;
}

/* dst = count elements of src (little-endian, dtype), as float. One loop
 * per dtype, each of which the compiler vectorises: the file's bytes are
 * assembled explicitly, so a big-endian host reads them the same. Returns
 * false where an F64 element is finite past float's range (it would read
 * as an infinity). */
static bool convert(attn_dtype dtype, const unsigned char *src, size_t count, float *dst) {
    switch (dtype) {
    case ATTN_DTYPE_F32:
        for (size_t i = 0; i < count; i++) {
            const unsigned char *e = src + 4 * i;
            uint32_t u = (uint32_t)e[0] | (uint32_t)e[1] << 8 | (uint32_t)e[2] << 16 |
                         (uint32_t)e[3] << 24;
            dst[i] = attn_float_of_bits(u);
        }
        return true;
    case ATTN_DTYPE_F16:
        for (size_t i = 0; i < count; i++)
            dst[i] = attn_f16_to_float((uint16_t)(src[2 * i] | src[2 * i + 1] << 8));
        return true;
    case ATTN_DTYPE_BF16:
        for (size_t i = 0; i < count; i++)
            dst[i] = attn_bf16_to_float((uint16_t)(src[2 * i] | src[2 * i + 1] << 8));
        return true;
    default: { /* F64 */
        bool past = false;
        for (size_t i = 0; i < count; i++) dst[i] = narrow_double(f64_at(src, i), &past);
        return !past;
    }
    }
}

/* The refusal of an F64 tensor of weights holding a finite value past
 * float's range, among the count elements from element first, read from
 * src: as an infinity it would turn every logit NaN. */
static attn_status refuse_past_float(attn_safetensors *st, const char *name,
                                     const unsigned char *src, size_t count, size_t first) {
    double value = 0.0;
    size_t at = first_past_float(src, count, &value);
    return attn_fail(st->ctx, ATTN_ERR_INVALID,
                     "%s: tensor '%s' (F64) holds %.17g at element %zu, past float32's range",
                     st->label, name, value, first + at);
}

static attn_status read_tensor(attn_safetensors *st, const st_tensor *t, const char *name,
                               float *dst, bool write);

/* An F64 element finite past float's range is refused, where
 * tensor.float() makes it an infinity. */
attn_status attn_safetensors_load(attn_safetensors *st, size_t index, float *dst, size_t numel) {
    if (!st) return ATTN_ERR_NULL;
    attn_clear_error(st->ctx);
    if (index >= st->count)
        return attn_fail(st->ctx, ATTN_ERR_NOT_FOUND, "%s has %zu tensors; index %zu is out of range",
                         st->label, st->count, index);
    const st_tensor *t = &st->tensors[index];
    if (st->shards) {
        attn_status s = open_shard(st, t->shard);
        return s != ATTN_OK ? s
                            : attn_safetensors_load(st->shards[t->shard], t->shard_index, dst,
                                                    numel);
    }
    char name[ST_TEXT_MAX];
    printable(name, sizeof name, t->name);
    if (!dtype_loadable(t->dtype))
        return attn_fail(st->ctx, ATTN_ERR_FORMAT,
                         "%s: tensor '%s' has dtype %s; only F32, F16, BF16 and F64 load as "
                         "float32",
                         st->label, name, attn_dtype_name(t->dtype));
    if (numel != t->numel)
        return attn_fail(st->ctx, ATTN_ERR_SHAPE,
                         "%s: tensor '%s' has %zu elements; the destination holds %zu", st->label,
                         name, t->numel, numel);
    if (numel && !dst) return attn_fail(st->ctx, ATTN_ERR_NULL, "attn_safetensors_load: dst is NULL");
    /* An F64 tensor is checked whole before dst is written: a refused load
     * leaves the caller's buffer as it was. */
    const bool check_first = t->dtype == ATTN_DTYPE_F64;
    if (st->image) {
        double value;
        if (check_first && first_past_float(st->image + t->begin, numel, &value) != SIZE_MAX)
            return refuse_past_float(st, name, st->image + t->begin, numel, 0);
        convert(t->dtype, st->image + t->begin, numel, dst);
        return ATTN_OK;
    }
    if (check_first) {
        attn_status s = read_tensor(st, t, name, dst, false);
        if (s != ATTN_OK) return s;
    }
    return read_tensor(st, t, name, dst, true);
}

/* Reads tensor t from the file in chunks: with write, converted into dst
 * (numel floats); without, only checked for an F64 element finite past
 * float's range (refused naming it), dst untouched. */
static attn_status read_tensor(attn_safetensors *st, const st_tensor *t, const char *name,
                               float *dst, bool write) {
    size_t size = dtype_size(t->dtype), numel = t->numel;
    size_t at = st->data_start + t->begin;
    if (at > (size_t)LONG_MAX || fseek(st->file, (long)at, SEEK_SET) != 0)
        return attn_fail(st->ctx, ATTN_ERR_IO, "%s: cannot seek to byte %zu", st->label, at);
    unsigned char chunk[ST_CHUNK];
    size_t per_chunk = sizeof chunk / size;
    for (size_t done = 0; done < numel;) {
        size_t n = numel - done < per_chunk ? numel - done : per_chunk;
        if (fread(chunk, size, n, st->file) != n)
            return attn_fail(st->ctx, ATTN_ERR_IO, "%s: read failed in tensor '%s'%s", st->label,
                             name, feof(st->file) ? " (the file shrank after it was opened)" : "");
        double value;
        if (!write) {
            if (first_past_float(chunk, n, &value) != SIZE_MAX)
                return refuse_past_float(st, name, chunk, n, done);
        } else if (!convert(t->dtype, chunk, n, dst + done)) {
            /* the file changed between the check and this read */
            return refuse_past_float(st, name, chunk, n, done);
        }
        done += n;
    }
    return ATTN_OK;
}

/* ---- writing ------------------------------------------------------------- */

typedef struct text_buf {
    char *data;
    size_t len, cap;
    bool failed;
} text_buf;

static void buf_put(text_buf *b, const char *s, size_t n) {
    if (b->failed) return;
    if (n > (size_t)-1 - b->len - 1) {
        b->failed = true;
        return;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap = cap > (size_t)-1 / 2 ? b->len + n + 1 : cap * 2;
        char *grown = attn_realloc(b->data, cap);
        if (!grown) {
            b->failed = true;
            return;
        }
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

static void buf_str(text_buf *b, const char *s) { buf_put(b, s, strlen(s)); }

/* A JSON string as serde_json writes it: '"' and '\\' escaped, the control
 * characters with short escapes where JSON has them, else \u00xx. */
static void buf_json_string(text_buf *b, const char *s) {
    buf_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        switch (*p) {
        case '"': buf_put(b, "\\\"", 2); break;
        case '\\': buf_put(b, "\\\\", 2); break;
        case '\b': buf_put(b, "\\b", 2); break;
        case '\f': buf_put(b, "\\f", 2); break;
        case '\n': buf_put(b, "\\n", 2); break;
        case '\r': buf_put(b, "\\r", 2); break;
        case '\t': buf_put(b, "\\t", 2); break;
        default:
            if (*p < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", (unsigned)*p);
                buf_put(b, esc, 6);
            } else {
                buf_put(b, (const char *)p, 1);
            }
        }
    }
    buf_put(b, "\"", 1);
}

static bool valid_utf8(const char *s) {
    size_t n = strlen(s);
    return attn_utf8_invalid_at((const unsigned char *)s, n) == n;
}

static int compare_tensor_names(const void *a, const void *b) {
    const attn_named_tensor *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

attn_status attn_safetensors_write(attn_ctx *ctx, const char *path,
                                   const attn_named_tensor *tensors, size_t count,
                                   const attn_metadata_entry *metadata, size_t metadata_count) {
    attn_clear_error(ctx);
    if (!path) return attn_fail(ctx, ATTN_ERR_NULL, "attn_safetensors_write: path is NULL");
    attn_file *f = NULL;
    attn_status s = attn_file_open(ctx, path, &f);
    if (s == ATTN_OK) s = attn_safetensors_write_to(ctx, f, path, tensors, count, metadata,
                                                    metadata_count);
    if (s == ATTN_OK) return attn_file_commit(ctx, f);
    attn_file_discard(f);
    return s;
}

attn_status attn_safetensors_write_to(attn_ctx *ctx, attn_file *f, const char *path,
                                      const attn_named_tensor *tensors, size_t count,
                                      const attn_metadata_entry *metadata,
                                      size_t metadata_count) {
    if (count && !tensors)
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: tensors is NULL for %zu tensors", path, count);
    if (metadata_count && !metadata)
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: metadata is NULL for %zu entries", path,
                         metadata_count);
    if (count > (size_t)-1 / sizeof(attn_named_tensor *))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: %zu tensors overflow size_t", path, count);
    for (size_t i = 0; i < metadata_count; i++) {
        const attn_metadata_entry *e = &metadata[i];
        if (!e->key || !e->value)
            return attn_fail(ctx, ATTN_ERR_NULL, "%s: metadata entry %zu has a NULL %s", path, i,
                             !e->key ? "key" : "value");
        if (!valid_utf8(e->key) || !valid_utf8(e->value))
            return attn_fail(ctx, ATTN_ERR_INVALID, "%s: metadata entry %zu is not valid UTF-8",
                             path, i);
        for (size_t j = 0; j < i; j++)
            if (strcmp(metadata[j].key, e->key) == 0) {
                char k[ST_TEXT_MAX];
                printable(k, sizeof k, e->key);
                return attn_fail(ctx, ATTN_ERR_INVALID, "%s: duplicate metadata key '%s'", path, k);
            }
    }
    size_t total_bytes = 0;
    for (size_t i = 0; i < count; i++) {
        const attn_named_tensor *t = &tensors[i];
        if (!t->name) return attn_fail(ctx, ATTN_ERR_NULL, "%s: tensor %zu has a NULL name", path, i);
        char name[ST_TEXT_MAX];
        printable(name, sizeof name, t->name);
        if (!t->name[0] || strcmp(t->name, "__metadata__") == 0 || !valid_utf8(t->name))
            return attn_fail(ctx, ATTN_ERR_INVALID,
                             "%s: tensor %zu: '%s' is not a usable name (empty, \"__metadata__\" "
                             "or not UTF-8)",
                             path, i, name);
        if (t->ndim > ATTN_SAFETENSORS_MAX_DIMS)
            return attn_fail(ctx, ATTN_ERR_INVALID,
                             "%s: tensor '%s': ndim %zu exceeds ATTN_SAFETENSORS_MAX_DIMS (%d)",
                             path, name, t->ndim, ATTN_SAFETENSORS_MAX_DIMS);
        size_t numel = 0, bytes;
        if (attn_shape_numel(t->ndim, t->shape, NULL, &numel) < t->ndim)
            return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: tensor '%s': shape overflows size_t",
                             path, name);
        if (!attn_mul_size(numel, 4, &bytes) || !attn_add_size(total_bytes, bytes, &total_bytes))
            return attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: tensor '%s': byte size overflows size_t",
                             path, name);
        if (numel && !t->data)
            return attn_fail(ctx, ATTN_ERR_NULL, "%s: tensor '%s': data is NULL for %zu elements",
                             path, name, numel);
    }

    const attn_named_tensor **order = attn_malloc((count ? count : 1) * sizeof *order);
    if (!order) return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory", path);
    for (size_t i = 0; i < count; i++) order[i] = &tensors[i];
    if (count) qsort(order, count, sizeof *order, compare_tensor_names);
    for (size_t i = 1; i < count; i++)
        if (strcmp(order[i]->name, order[i - 1]->name) == 0) {
            char name[ST_TEXT_MAX];
            printable(name, sizeof name, order[i]->name);
            attn_free(order);
            return attn_fail(ctx, ATTN_ERR_INVALID, "%s: duplicate tensor name '%s'", path, name);
        }

    text_buf h = {0};
    buf_str(&h, "{");
    if (metadata_count) {
        buf_str(&h, "\"__metadata__\":{");
        for (size_t i = 0; i < metadata_count; i++) {
            if (i) buf_str(&h, ",");
            buf_json_string(&h, metadata[i].key);
            buf_str(&h, ":");
            buf_json_string(&h, metadata[i].value);
        }
        buf_str(&h, "}");
    }
    size_t offset = 0;
    for (size_t i = 0; i < count; i++) {
        const attn_named_tensor *t = order[i];
        if (i || metadata_count) buf_str(&h, ",");
        buf_json_string(&h, t->name);
        buf_str(&h, ":{\"dtype\":\"F32\",\"shape\":[");
        size_t numel = 1;
        for (size_t d = 0; d < t->ndim; d++) {
            char num[32];
            snprintf(num, sizeof num, d ? ",%zu" : "%zu", t->shape[d]);
            buf_str(&h, num);
            numel *= t->shape[d];
        }
        char offsets[80];
        snprintf(offsets, sizeof offsets, "],\"data_offsets\":[%zu,%zu]}", offset, offset + 4 * numel);
        buf_str(&h, offsets);
        offset += 4 * numel;
    }
    buf_str(&h, "}");
    while (!h.failed && h.len % 8 != 0) buf_str(&h, " ");
    if (h.failed) {
        attn_free(h.data);
        attn_free(order);
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory for the header", path);
    }

    attn_status s = ATTN_OK;
    unsigned char prefix[8];
    for (int k = 0; k < 8; k++) prefix[k] = (unsigned char)((uint64_t)h.len >> (8 * k));
    if (s == ATTN_OK) s = attn_file_write(ctx, f, prefix, 8);
    if (s == ATTN_OK) s = attn_file_write(ctx, f, h.data, h.len);
    for (size_t i = 0; s == ATTN_OK && i < count; i++) {
        size_t numel = 1;
        for (size_t d = 0; d < order[i]->ndim; d++) numel *= order[i]->shape[d];
        s = attn_file_write_f32le(ctx, f, order[i]->data, numel);
    }
    attn_free(h.data);
    attn_free(order);
    return s;
}

attn_status attn_safetensors_write_params(attn_ctx *ctx, const char *path,
                                          const attn_param *params, size_t count,
                                          const char *prefix) {
    attn_clear_error(ctx);
    if (count && !params)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_safetensors_write_params: params is NULL");
    if (!prefix) prefix = "";
    size_t prefix_len = strlen(prefix);
    attn_named_tensor *t = attn_calloc(count ? count : 1, sizeof *t);
    char **names = attn_calloc(count ? count : 1, sizeof *names);
    attn_status s = (t && names) ? ATTN_OK
                                 : attn_fail(ctx, ATTN_ERR_NO_MEMORY,
                                             "attn_safetensors_write_params: out of memory");
    for (size_t i = 0; s == ATTN_OK && i < count; i++) {
        const attn_param *p = &params[i];
        if (!p->name) {
            s = attn_fail(ctx, ATTN_ERR_NULL, "attn_safetensors_write_params: parameter %zu has a "
                                              "NULL name", i);
            break;
        }
        if (p->ndim > 2) {
            s = attn_fail(ctx, ATTN_ERR_INVALID, "attn_safetensors_write_params: parameter '%s' "
                                                 "has ndim %zu (at most 2)", p->name, p->ndim);
            break;
        }
        size_t n = strlen(p->name);
        names[i] = attn_malloc(prefix_len + n + 1);
        if (!names[i]) {
            s = attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_safetensors_write_params: out of memory");
            break;
        }
        memcpy(names[i], prefix, prefix_len);
        memcpy(names[i] + prefix_len, p->name, n + 1);
        t[i].name = names[i];
        t[i].data = p->data;
        t[i].ndim = p->ndim;
        for (size_t d = 0; d < p->ndim; d++) t[i].shape[d] = p->shape[d];
    }
    if (s == ATTN_OK) {
        attn_metadata_entry format = {"format", "pt"};
        s = attn_safetensors_write(ctx, path, t, count, &format, 1);
    }
    for (size_t i = 0; names && i < count; i++) attn_free(names[i]);
    attn_free(names);
    attn_free(t);
    return s;
}

/* ---- for the readers beside io (safetensors_internal.h) ----------------- */

const char *attn_safetensors_label(const attn_safetensors *st) { return st->label; }

const char *attn_safetensors_file_of(const attn_safetensors *st, size_t index) {
    if (st->shards && index < st->count) return st->shards[st->tensors[index].shard]->label;
    return st->label;
}

size_t attn_safetensors_index(const attn_safetensors *st, const char *name) {
    return find_index(st, name);
}

bool attn_safetensors_dtype_loadable(attn_dtype dtype) { return dtype_loadable(dtype); }

void attn_safetensors_printable(char *dst, size_t cap, const char *src) {
    printable(dst, cap, src);
}

void attn_safetensors_format_shape(char *buf, size_t cap, size_t ndim, const size_t *shape) {
    format_shape(buf, cap, ndim, shape);
}
