/*
 * json.h — the library's one JSON reader (RFC 8259). Configuration files
 * (config.json of a Hugging Face checkpoint, the book's cfg dicts) are
 * parsed whole into a tree the caller walks and frees; a safetensors header
 * and a tokenizer's vocabulary are read token by token through the reader
 * underneath it (attn_json_reader), into their own structures.
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
#include <stdint.h>

#define ATTN_JSON_MAX_DEPTH 64
/* attn_json_read_file reads configs, kilobytes each: a file past this is
 * refused when the bound is reached, so an endless one (/dev/zero) ends. */
#define ATTN_JSON_MAX_FILE ((size_t)16 << 20)

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

/* ---- the reader underneath ------------------------------------------------
 *
 * A cursor over JSON text, for formats read straight into their own
 * structures as they are scanned (a safetensors header of thousands of
 * tensors, a tokenizer's vocabulary of 100,000 tokens) rather than into a
 * tree first; the tree parser below is built on it, so every JSON text the
 * library reads goes through these functions. Each function that reads a
 * token skips the whitespace before it. Errors are ATTN_ERR_FORMAT (or
 * ATTN_ERR_OVERFLOW, ATTN_ERR_NO_MEMORY) with messages that start with the
 * label and give the position: "at byte N" (a file offset: base is where
 * the text starts in its file), or "label:line:column:" when lines is set.
 *
 *   attn_json_reader r;
 *   attn_json_reader_init(&r, ctx, text, len, "vocab.json");
 *   r.lines = true;
 *   if ((st = attn_json_expect(&r, '{', "'{'")) != ATTN_OK) ...
 */
typedef struct attn_json_reader {
    attn_ctx *ctx;
    const char *label;   /* names the text in messages */
    const char *subject; /* e.g. "header": "label: header is not valid JSON ..." */
    const unsigned char *begin, *p, *end;
    size_t base;         /* the file offset of begin */
    bool lines;          /* positions as line:column (text files people edit) */
    bool check_utf8;     /* strings' raw bytes must be well-formed UTF-8 */
    bool allow_nul;      /* \u0000 decodes to a NUL byte (strings are counted) */
} attn_json_reader;

/* A reader at the start of text, the options off (set them after). */
void attn_json_reader_init(attn_json_reader *r, attn_ctx *ctx, const void *text, size_t len,
                           const char *label);
/* The file offset of the cursor (base + bytes read). */
size_t attn_json_offset(const attn_json_reader *r);
void attn_json_skip_space(attn_json_reader *r);
/* Skips whitespace; whether the next byte is c (not consumed). */
bool attn_json_peek(attn_json_reader *r, char c);
/* Skips whitespace; consumes c and returns true when it is next. */
bool attn_json_accept(attn_json_reader *r, char c);
/* Skips whitespace and consumes c, or fails: "expected <what>, found ...". */
attn_status attn_json_expect(attn_json_reader *r, char c, const char *what);
/* The failure "expected <what>" at the cursor, naming what was found. */
attn_status attn_json_expected(attn_json_reader *r, const char *what);
/* A failure of the caller's schema at the text's byte at (r->p - r->begin
 * for the cursor): "label: <message> at byte N", or "label:L:C: <message>". */
#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
attn_status attn_json_fail_at(attn_json_reader *r, size_t at, attn_status status,
                              const char *fmt, ...);
/* A string (what names it in "expected ..."), decoded into a new
 * NUL-terminated buffer of *len bytes (len may be NULL): escapes and
 * surrogate pairs decoded, raw UTF-8 checked when check_utf8 is set, \u0000
 * refused unless allow_nul is set. Free it with attn_free. */
attn_status attn_json_read_string(attn_json_reader *r, const char *what, char **out,
                                  size_t *len);
/* A non-negative integer no larger than max: digits without sign, leading
 * zero, fraction or exponent. Messages name owner (may be NULL, e.g.
 * "tensor 'w'") and what ("shape"); past max is ATTN_ERR_OVERFLOW when max
 * is SIZE_MAX ("overflows size_t"), else ATTN_ERR_FORMAT, naming the digits. */
attn_status attn_json_read_uint(attn_json_reader *r, uint64_t max, const char *owner,
                                const char *what, uint64_t *out);
/* Any JSON number, converted by strtod (out of range: +-HUGE_VAL or 0, as
 * Python reads it), its '.' the point whatever the caller's LC_NUMERIC. */
attn_status attn_json_read_number(attn_json_reader *r, double *out);
/* x as JSON writes a number, "%.17g" with '.' whatever the caller's
 * LC_NUMERIC (a comma locale would write "1,5"), into buf of size bytes. */
void attn_json_format_double(char *buf, size_t size, double x);
/* Skips whitespace; fails unless the text ends there ("unexpected text
 * after <after>"). */
attn_status attn_json_end(attn_json_reader *r, const char *after);

/* ---- the tree --------------------------------------------------------------- */

/* Parses len bytes of text; label names it in messages ("config.json").
 * ATTN_ERR_FORMAT names the byte offset and what was expected there;
 * ATTN_ERR_NO_MEMORY. */
attn_status attn_json_parse(attn_ctx *ctx, const char *text, size_t len, const char *label,
                            attn_json **out);
/* Reads and parses the file at path (ATTN_ERR_IO when it cannot be read;
 * ATTN_ERR_FORMAT past ATTN_JSON_MAX_FILE bytes). */
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
