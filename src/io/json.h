/*
 * json.h — a small JSON reader (RFC 8259) for configuration files:
 * config.json of a Hugging Face checkpoint, the book's cfg dicts. The whole
 * text is parsed into a tree the caller walks and frees.
 *
 *   attn_json *root;
 *   if (attn_json_read_file(ctx, "config.json", &root) != ATTN_OK) ...
 *   size_t n;
 *   if (attn_json_as_size(attn_json_get(root, "n_layer"), &n)) ...
 *   attn_json_free(root);
 *
 * Strings are decoded to UTF-8 (escapes and surrogate pairs; \u0000 is
 * rejected, so every string is a C string). Duplicate keys are kept; the
 * lookup returns the last, as Python's json does. Nesting is limited to
 * ATTN_JSON_MAX_DEPTH levels.
 */
#ifndef ATTN_IO_JSON_H
#define ATTN_IO_JSON_H

#include "internal.h"

#include <stdbool.h>
#include <stddef.h>

#define ATTN_JSON_MAX_DEPTH 64

typedef enum attn_json_type {
    ATTN_JSON_NULL = 0,
    ATTN_JSON_BOOL,
    ATTN_JSON_NUMBER,
    ATTN_JSON_STRING,
    ATTN_JSON_ARRAY,
    ATTN_JSON_OBJECT
} attn_json_type;

typedef struct attn_json attn_json;
struct attn_json {
    attn_json_type type;
    bool boolean;      /* ATTN_JSON_BOOL */
    double number;     /* ATTN_JSON_NUMBER */
    char *string;      /* ATTN_JSON_STRING: NUL-terminated UTF-8 */
    size_t count;      /* ARRAY, OBJECT: how many items */
    attn_json *items;  /* ARRAY, OBJECT: count values, in text order */
    char **keys;       /* OBJECT: count keys, keys[i] naming items[i] */
};

/* Parses len bytes of text; label names it in messages ("config.json").
 * ATTN_ERR_FORMAT names the byte offset and what was expected there;
 * ATTN_ERR_NO_MEMORY. */
attn_status attn_json_parse(attn_ctx *ctx, const char *text, size_t len, const char *label,
                            attn_json **out);
/* Reads and parses the file at path (ATTN_ERR_IO when it cannot be read). */
attn_status attn_json_read_file(attn_ctx *ctx, const char *path, attn_json **out);
void attn_json_free(attn_json *root);

/* The value of key in obj (the last one of that name), or NULL when obj is
 * NULL, not an object or has no such key. */
const attn_json *attn_json_get(const attn_json *obj, const char *key);
/* The value as a double (a number); false for NULL or another type. */
bool attn_json_as_double(const attn_json *v, double *out);
/* The value as a size (a non-negative integral number that fits). */
bool attn_json_as_size(const attn_json *v, size_t *out);
/* The value as a bool (true/false); false for NULL or another type. */
bool attn_json_as_bool(const attn_json *v, bool *out);
/* The string, or NULL for NULL or another type. */
const char *attn_json_as_string(const attn_json *v);

#endif /* ATTN_IO_JSON_H */
