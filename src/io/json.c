/* json.c — the JSON reader of json.h: recursive descent over the text,
 * each container's items gathered in a growing array. */
#include "io/json.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct json_parser {
    attn_ctx *ctx;
    const char *label;
    const unsigned char *begin, *p, *end;
} json_parser;

static size_t offset_of(const json_parser *j) { return (size_t)(j->p - j->begin); }

static void skip_space(json_parser *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static attn_status expected(json_parser *j, const char *what) {
    if (j->p >= j->end)
        return attn_fail(j->ctx, ATTN_ERR_FORMAT,
                         "%s: not valid JSON: the text ends at byte %zu where %s was expected",
                         j->label, offset_of(j), what);
    return attn_fail(j->ctx, ATTN_ERR_FORMAT,
                     "%s: not valid JSON at byte %zu: expected %s, found '%c'", j->label,
                     offset_of(j), what, *j->p >= 0x20 && *j->p < 0x7f ? *j->p : '?');
}

static attn_status out_of_memory(json_parser *j) {
    return attn_fail(j->ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory reading JSON", j->label);
}

static void free_value(attn_json *v) {
    if (v->type == ATTN_JSON_STRING) attn_free(v->string);
    if (v->type == ATTN_JSON_ARRAY || v->type == ATTN_JSON_OBJECT) {
        for (size_t i = 0; i < v->count; i++) {
            free_value(&v->items[i]);
            if (v->keys) attn_free(v->keys[i]);
        }
        attn_free(v->items);
        attn_free(v->keys);
    }
    *v = (attn_json){0};
}

/* ---- strings ----------------------------------------------------------- */

static int hex_digit(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool hex4(const unsigned char *p, const unsigned char *end, uint32_t *out) {
    if (end - p < 4) return false;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        int d = hex_digit(p[i]);
        if (d < 0) return false;
        v = v * 16 + (uint32_t)d;
    }
    *out = v;
    return true;
}

static size_t utf8_encode(uint32_t cp, unsigned char *out) {
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xc0 | (cp >> 6));
        out[1] = (unsigned char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xe0 | (cp >> 12));
        out[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (unsigned char)(0xf0 | (cp >> 18));
    out[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

/* The escape after a backslash at j->p (which points past the 'u' or the
 * letter on success), its code point's UTF-8 appended to buf. */
static attn_status parse_escape(json_parser *j, unsigned char *buf, size_t *len) {
    size_t at = offset_of(j) - 1;
    if (j->p >= j->end) return expected(j, "an escape sequence");
    unsigned char e = *j->p++;
    static const char letters[] = "\"\\/bfnrt", decoded[] = "\"\\/\b\f\n\r\t";
    const char *simple = e ? strchr(letters, e) : NULL;
    if (simple) {
        buf[(*len)++] = (unsigned char)decoded[simple - letters];
        return ATTN_OK;
    }
    uint32_t cp;
    if (e != 'u' || !hex4(j->p, j->end, &cp))
        return attn_fail(j->ctx, ATTN_ERR_FORMAT,
                         "%s: not valid JSON: bad escape sequence at byte %zu", j->label, at);
    j->p += 4;
    if (cp >= 0xd800 && cp <= 0xdbff) {
        uint32_t low;
        if (j->end - j->p >= 6 && j->p[0] == '\\' && j->p[1] == 'u' &&
            hex4(j->p + 2, j->end, &low) && low >= 0xdc00 && low <= 0xdfff) {
            cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
            j->p += 6;
        }
    }
    if (cp >= 0xd800 && cp <= 0xdfff)
        return attn_fail(j->ctx, ATTN_ERR_FORMAT,
                         "%s: not valid JSON: unpaired UTF-16 surrogate escape at byte %zu",
                         j->label, at);
    if (cp == 0)
        return attn_fail(j->ctx, ATTN_ERR_FORMAT,
                         "%s: a string holds a NUL character (\\u0000) at byte %zu", j->label,
                         at);
    *len += utf8_encode(cp, buf + *len);
    return ATTN_OK;
}

/* A string at j->p (its opening quote), decoded into a new C string. Raw
 * bytes are copied as they are (the text's UTF-8 is not re-checked). */
static attn_status parse_string(json_parser *j, char **out) {
    *out = NULL;
    if (j->p >= j->end || *j->p != '"') return expected(j, "a string");
    size_t start = offset_of(j);
    j->p++;
    /* decoding never lengthens: the raw length bounds the decoded one */
    const unsigned char *q = j->p;
    while (q < j->end && *q != '"') q += (*q == '\\' && q + 1 < j->end) ? 2 : 1;
    unsigned char *buf = attn_malloc((size_t)(q - j->p) + 1);
    if (!buf) return out_of_memory(j);
    size_t len = 0;
    attn_status st = ATTN_OK;
    for (;;) {
        if (j->p >= j->end) {
            st = attn_fail(j->ctx, ATTN_ERR_FORMAT,
                           "%s: not valid JSON: the string at byte %zu is not closed", j->label,
                           start);
            break;
        }
        unsigned char c = *j->p++;
        if (c == '"') break;
        if (c < 0x20) {
            st = attn_fail(j->ctx, ATTN_ERR_FORMAT,
                           "%s: not valid JSON: control byte 0x%02x in a string at byte %zu",
                           j->label, (unsigned)c, offset_of(j) - 1);
            break;
        }
        if (c != '\\') {
            buf[len++] = c;
            continue;
        }
        if ((st = parse_escape(j, buf, &len)) != ATTN_OK) break;
    }
    if (st != ATTN_OK) {
        attn_free(buf);
        return st;
    }
    buf[len] = '\0';
    *out = (char *)buf;
    return ATTN_OK;
}

/* ---- numbers and literals -------------------------------------------- */

static bool is_digit(const json_parser *j) {
    return j->p < j->end && *j->p >= '0' && *j->p <= '9';
}

/* A number by JSON's grammar (-? int frac? exp?), converted by strtod. */
static attn_status parse_number(json_parser *j, double *out) {
    const unsigned char *start = j->p;
    if (j->p < j->end && *j->p == '-') j->p++;
    if (!is_digit(j)) return expected(j, "a digit");
    if (*j->p == '0')
        j->p++;
    else
        while (is_digit(j)) j->p++;
    if (j->p < j->end && *j->p == '.') {
        j->p++;
        if (!is_digit(j)) return expected(j, "a digit after '.'");
        while (is_digit(j)) j->p++;
    }
    if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
        j->p++;
        if (j->p < j->end && (*j->p == '+' || *j->p == '-')) j->p++;
        if (!is_digit(j)) return expected(j, "a digit in the exponent");
        while (is_digit(j)) j->p++;
    }
    char small[64];
    size_t n = (size_t)(j->p - start);
    char *text = n < sizeof small ? small : attn_malloc(n + 1);
    if (!text) return out_of_memory(j);
    memcpy(text, start, n);
    text[n] = '\0';
    *out = strtod(text, NULL); /* out of range: +-HUGE_VAL or 0, as Python reads it */
    if (text != small) attn_free(text);
    return ATTN_OK;
}

static bool literal(json_parser *j, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, word, n) != 0) return false;
    j->p += n;
    return true;
}

/* ---- values -------------------------------------------------------------- */

static attn_status parse_value(json_parser *j, attn_json *v, size_t depth);

/* Appends a zeroed item (and key slot) to v's arrays, growing them. */
static attn_status push_item(json_parser *j, attn_json *v, size_t *capacity, bool keyed) {
    if (v->count == *capacity) {
        size_t grown = *capacity ? *capacity * 2 : 4;
        attn_json *items = attn_realloc(v->items, grown * sizeof *items);
        if (!items) return out_of_memory(j);
        v->items = items;
        if (keyed) {
            char **keys = attn_realloc(v->keys, grown * sizeof *keys);
            if (!keys) return out_of_memory(j);
            v->keys = keys;
        }
        *capacity = grown;
    }
    v->items[v->count] = (attn_json){0};
    if (keyed) v->keys[v->count] = NULL;
    v->count++;
    return ATTN_OK;
}

/* An array or an object at j->p (its bracket): v's items (and keys). On
 * failure v holds what was parsed so far, for the caller to free. */
static attn_status parse_container(json_parser *j, attn_json *v, size_t depth, bool object) {
    v->type = object ? ATTN_JSON_OBJECT : ATTN_JSON_ARRAY;
    if (depth >= ATTN_JSON_MAX_DEPTH)
        return attn_fail(j->ctx, ATTN_ERR_FORMAT,
                         "%s: JSON nested deeper than %d levels at byte %zu", j->label,
                         ATTN_JSON_MAX_DEPTH, offset_of(j));
    char close = object ? '}' : ']';
    j->p++;
    skip_space(j);
    if (j->p < j->end && *j->p == close) {
        j->p++;
        return ATTN_OK;
    }
    size_t capacity = 0;
    for (;;) {
        attn_status st = push_item(j, v, &capacity, object);
        if (st != ATTN_OK) return st;
        size_t i = v->count - 1;
        skip_space(j);
        if (object) {
            if ((st = parse_string(j, &v->keys[i])) != ATTN_OK) return st;
            skip_space(j);
            if (j->p >= j->end || *j->p != ':') return expected(j, "':'");
            j->p++;
            skip_space(j);
        }
        if ((st = parse_value(j, &v->items[i], depth + 1)) != ATTN_OK) return st;
        skip_space(j);
        if (j->p < j->end && *j->p == ',') {
            j->p++;
            continue;
        }
        if (j->p < j->end && *j->p == close) {
            j->p++;
            return ATTN_OK;
        }
        return expected(j, object ? "',' or '}'" : "',' or ']'");
    }
}

static attn_status parse_value(json_parser *j, attn_json *v, size_t depth) {
    *v = (attn_json){0};
    if (j->p >= j->end) return expected(j, "a value");
    switch (*j->p) {
    case '{': return parse_container(j, v, depth, true);
    case '[': return parse_container(j, v, depth, false);
    case '"':
        v->type = ATTN_JSON_STRING;
        return parse_string(j, &v->string);
    case 't':
    case 'f':
        v->type = ATTN_JSON_BOOL;
        v->boolean = *j->p == 't';
        if (literal(j, v->boolean ? "true" : "false")) return ATTN_OK;
        return expected(j, "a value");
    case 'n':
        if (literal(j, "null")) return ATTN_OK;
        return expected(j, "a value");
    default:
        if (*j->p == '-' || (*j->p >= '0' && *j->p <= '9')) {
            v->type = ATTN_JSON_NUMBER;
            return parse_number(j, &v->number);
        }
        return expected(j, "a value");
    }
}

attn_status attn_json_parse(attn_ctx *ctx, const char *text, size_t len, const char *label,
                            attn_json **out) {
    if (!out) return attn_fail(ctx, ATTN_ERR_NULL, "attn_json_parse: out is NULL");
    *out = NULL;
    if (!text) return attn_fail(ctx, ATTN_ERR_NULL, "attn_json_parse: text is NULL");
    json_parser j = {ctx, label ? label : "<json>", (const unsigned char *)text,
                     (const unsigned char *)text, (const unsigned char *)text + len};
    attn_json *root = attn_calloc(1, sizeof *root);
    if (!root) return out_of_memory(&j);
    skip_space(&j);
    attn_status st = parse_value(&j, root, 0);
    if (st == ATTN_OK) {
        skip_space(&j);
        if (j.p != j.end) st = expected(&j, "the end of the text");
    }
    if (st != ATTN_OK) {
        attn_json_free(root);
        return st;
    }
    *out = root;
    return ATTN_OK;
}

attn_status attn_json_read_file(attn_ctx *ctx, const char *path, attn_json **out) {
    if (!out) return attn_fail(ctx, ATTN_ERR_NULL, "attn_json_read_file: out is NULL");
    *out = NULL;
    if (!path) return attn_fail(ctx, ATTN_ERR_NULL, "attn_json_read_file: path is NULL");
    FILE *f = fopen(path, "rb");
    if (!f)
        return attn_fail(ctx, ATTN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    /* read to the end in growing chunks (ftell is meaningless for pipes) */
    size_t len = 0, cap = 4096;
    char *text = attn_malloc(cap);
    attn_status st = text ? ATTN_OK : attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory", path);
    while (st == ATTN_OK) {
        if (len == cap) {
            char *grown = cap <= ((size_t)-1) / 2 ? attn_realloc(text, cap * 2) : NULL;
            if (!grown) {
                st = attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory reading %zu bytes",
                               path, len);
                break;
            }
            text = grown;
            cap *= 2;
        }
        size_t got = fread(text + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) st = attn_fail(ctx, ATTN_ERR_IO, "%s: read failed", path);
            break;
        }
    }
    fclose(f);
    if (st == ATTN_OK) st = attn_json_parse(ctx, text, len, path, out);
    attn_free(text);
    return st;
}

void attn_json_free(attn_json *root) {
    if (!root) return;
    free_value(root);
    attn_free(root);
}

const attn_json *attn_json_get(const attn_json *obj, const char *key) {
    if (!obj || obj->type != ATTN_JSON_OBJECT || !key) return NULL;
    for (size_t i = obj->count; i-- > 0;)
        if (strcmp(obj->keys[i], key) == 0) return &obj->items[i];
    return NULL;
}

bool attn_json_as_double(const attn_json *v, double *out) {
    if (!v || v->type != ATTN_JSON_NUMBER) return false;
    *out = v->number;
    return true;
}

bool attn_json_as_size(const attn_json *v, size_t *out) {
    if (!v || v->type != ATTN_JSON_NUMBER) return false;
    double d = v->number;
    /* 2^64 is the first double past SIZE_MAX on 64-bit targets */
    if (!(d >= 0.0) || d != floor(d) || d >= 18446744073709551616.0 || d > (double)SIZE_MAX)
        return false;
    *out = (size_t)d;
    return true;
}

bool attn_json_as_bool(const attn_json *v, bool *out) {
    if (!v || v->type != ATTN_JSON_BOOL) return false;
    *out = v->boolean;
    return true;
}

const char *attn_json_as_string(const attn_json *v) {
    return v && v->type == ATTN_JSON_STRING ? v->string : NULL;
}
