/* json.c — the JSON reader of json.h: a cursor that reads one token at a
 * time (strings decoded, integers range-checked), and the tree parser, a
 * recursive descent over it that gathers each container's items in a
 * growing array. */
#include "io/json.h"
#include "utf8.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_MESSAGE_MAX 512
#define JSON_DETAIL_MAX 256 /* a message's detail: what was expected, found */
#define JSON_DIGITS_MAX 24 /* digits of a too-large number quoted in a message */

/* ---- the cursor and its messages ------------------------------------------ */

void attn_json_reader_init(attn_json_reader *r, attn_ctx *ctx, const void *text, size_t len,
                           const char *label) {
    *r = (attn_json_reader){.ctx = ctx, .label = label ? label : "<json>"};
    r->begin = r->p = text;
    r->end = r->begin + len;
}

size_t attn_json_offset(const attn_json_reader *r) { return r->base + (size_t)(r->p - r->begin); }

static size_t pos_of(const attn_json_reader *r) { return (size_t)(r->p - r->begin); }

void attn_json_skip_space(attn_json_reader *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
        r->p++;
}

bool attn_json_peek(attn_json_reader *r, char c) {
    attn_json_skip_space(r);
    return r->p < r->end && *r->p == (unsigned char)c;
}

bool attn_json_accept(attn_json_reader *r, char c) {
    if (!attn_json_peek(r, c)) return false;
    r->p++;
    return true;
}

/* "label: <head> at byte N<tail>", or "label:L:C: <head><tail>" with lines:
 * the position sits where the message reads best in each form. */
static attn_status fail_split(attn_json_reader *r, size_t at, attn_status status,
                              const char *head, const char *tail) {
    if (r->lines) {
        size_t line = 1, line_start = 0;
        for (size_t i = 0; i < at; i++)
            if (r->begin[i] == '\n') line++, line_start = i + 1;
        return attn_fail(r->ctx, status, "%s:%zu:%zu: %s%s", r->label, line, at - line_start + 1,
                         head, tail);
    }
    return attn_fail(r->ctx, status, "%s: %s at byte %zu%s", r->label, head, r->base + at, tail);
}

attn_status attn_json_fail_at(attn_json_reader *r, size_t at, attn_status status,
                              const char *fmt, ...) {
    char head[JSON_MESSAGE_MAX];
    va_list args;
    va_start(args, fmt);
    vsnprintf(head, sizeof head, fmt, args);
    va_end(args);
    return fail_split(r, at, status, head, "");
}

/* "header is not valid JSON" (with a subject) or "not valid JSON", then
 * detail, into buf. */
static const char *invalid(const attn_json_reader *r, char *buf, size_t cap, const char *what,
                           const char *detail) {
    snprintf(buf, cap, "%.100s%snot %.32s%.256s", r->subject ? r->subject : "",
             r->subject ? " is " : "", what, detail);
    return buf;
}

attn_status attn_json_expected(attn_json_reader *r, const char *what) {
    char head[JSON_MESSAGE_MAX], tail[JSON_DETAIL_MAX], ends[JSON_DETAIL_MAX];
    if (r->p >= r->end) {
        snprintf(ends, sizeof ends, ": it ends where %.200s was expected", what);
        return fail_split(r, pos_of(r), ATTN_ERR_FORMAT,
                          invalid(r, head, sizeof head, "valid JSON", ends), "");
    }
    unsigned char c = *r->p;
    if (c >= 0x20 && c < 0x7f)
        snprintf(tail, sizeof tail, ": expected %.200s, found '%c'", what, (char)c);
    else
        snprintf(tail, sizeof tail, ": expected %.200s, found byte 0x%02x", what, (unsigned)c);
    return fail_split(r, pos_of(r), ATTN_ERR_FORMAT,
                      invalid(r, head, sizeof head, "valid JSON", ""), tail);
}

attn_status attn_json_expect(attn_json_reader *r, char c, const char *what) {
    if (attn_json_accept(r, c)) return ATTN_OK;
    return attn_json_expected(r, what);
}

/* A lexical error at the text's byte at: "<not valid JSON>: detail". */
static attn_status not_json(attn_json_reader *r, size_t at, const char *detail,
                            const char *tail) {
    char head[JSON_MESSAGE_MAX];
    return fail_split(r, at, ATTN_ERR_FORMAT, invalid(r, head, sizeof head, "valid JSON", detail),
                      tail);
}

static attn_status out_of_memory(attn_json_reader *r) {
    return attn_fail(r->ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory reading JSON", r->label);
}

attn_status attn_json_end(attn_json_reader *r, const char *after) {
    attn_json_skip_space(r);
    if (r->p == r->end) return ATTN_OK;
    char detail[JSON_DETAIL_MAX];
    snprintf(detail, sizeof detail, ": unexpected text after %.200s", after);
    return not_json(r, pos_of(r), detail, "");
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

/* The escape whose backslash is at r->p, its code point's UTF-8 appended
 * to buf. */
static attn_status parse_escape(attn_json_reader *r, unsigned char *buf, size_t *len) {
    size_t at = pos_of(r);
    r->p++;
    if (r->p >= r->end) return attn_json_expected(r, "an escape sequence");
    unsigned char e = *r->p++;
    static const char letters[] = "\"\\/bfnrt", decoded[] = "\"\\/\b\f\n\r\t";
    const char *simple = e ? strchr(letters, e) : NULL;
    if (simple) {
        buf[(*len)++] = (unsigned char)decoded[simple - letters];
        return ATTN_OK;
    }
    uint32_t cp;
    if (e != 'u' || !hex4(r->p, r->end, &cp))
        return not_json(r, at, ": bad escape sequence", "");
    r->p += 4;
    if (cp >= 0xd800 && cp <= 0xdbff) {
        uint32_t low;
        if (r->end - r->p >= 6 && r->p[0] == '\\' && r->p[1] == 'u' &&
            hex4(r->p + 2, r->end, &low) && low >= 0xdc00 && low <= 0xdfff) {
            cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
            r->p += 6;
        }
    }
    if (cp >= 0xd800 && cp <= 0xdfff)
        return not_json(r, at, ": unpaired UTF-16 surrogate escape", "");
    if (cp == 0 && !r->allow_nul)
        return attn_json_fail_at(r, at, ATTN_ERR_FORMAT,
                                 "a string holds a NUL character (\\u0000)");
    *len += attn_utf8_encode(cp, buf + *len);
    return ATTN_OK;
}

attn_status attn_json_read_string(attn_json_reader *r, const char *what, char **out,
                                  size_t *out_len) {
    *out = NULL;
    if (!attn_json_peek(r, '"')) return attn_json_expected(r, what);
    size_t start = pos_of(r);
    r->p++;
    /* decoding never lengthens: the raw length bounds the decoded one */
    const unsigned char *q = r->p;
    while (q < r->end && *q != '"') q += (*q == '\\' && q + 1 < r->end) ? 2 : 1;
    unsigned char *buf = attn_malloc((size_t)(q - r->p) + 1);
    if (!buf) return out_of_memory(r);
    size_t len = 0;
    attn_status st = ATTN_OK;
    for (;;) {
        if (r->p >= r->end) {
            st = not_json(r, start, ": the string", " is not closed");
            break;
        }
        unsigned char c = *r->p;
        if (c == '"') {
            r->p++;
            break;
        }
        if (c < 0x20) {
            char tail[64];
            snprintf(tail, sizeof tail, ": control byte 0x%02x in a string", (unsigned)c);
            st = not_json(r, pos_of(r), "", tail);
            break;
        }
        if (c == '\\') {
            if ((st = parse_escape(r, buf, &len)) != ATTN_OK) break;
            continue;
        }
        uint32_t ignored;
        size_t n = r->check_utf8 ? attn_utf8_decode(r->p, (size_t)(r->end - r->p), &ignored)
                                 : 1;
        if (n == 0) {
            char head[JSON_MESSAGE_MAX], detail[32];
            snprintf(detail, sizeof detail, ": bad byte 0x%02x", (unsigned)c);
            st = fail_split(r, pos_of(r), ATTN_ERR_FORMAT,
                            invalid(r, head, sizeof head, "UTF-8", detail), "");
            break;
        }
        memcpy(buf + len, r->p, n);
        len += n;
        r->p += n;
    }
    if (st != ATTN_OK) {
        attn_free(buf);
        return st;
    }
    buf[len] = '\0';
    *out = (char *)buf;
    if (out_len) *out_len = len;
    return ATTN_OK;
}

/* ---- numbers ------------------------------------------------------------- */

static bool is_digit(const attn_json_reader *r) {
    return r->p < r->end && *r->p >= '0' && *r->p <= '9';
}

attn_status attn_json_read_uint(attn_json_reader *r, uint64_t max, const char *owner,
                                const char *what, uint64_t *out) {
    attn_json_skip_space(r);
    char head[JSON_MESSAGE_MAX];
    const char *sep = owner ? ": " : "";
    owner = owner ? owner : "";
    size_t start = pos_of(r);
    if (r->p < r->end && *r->p == '-')
        return attn_json_fail_at(r, start, ATTN_ERR_FORMAT, "%s%snegative value in %s", owner,
                                 sep, what);
    if (!is_digit(r)) return attn_json_expected(r, "an integer");
    uint64_t value = 0;
    bool over = false;
    while (is_digit(r)) {
        uint64_t digit = (uint64_t)(*r->p - '0');
        if (digit > max || value > (max - digit) / 10) over = true;
        else value = value * 10 + digit;
        r->p++;
    }
    if (r->p < r->end && (*r->p == '.' || *r->p == 'e' || *r->p == 'E'))
        return attn_json_fail_at(r, start, ATTN_ERR_FORMAT,
                                 "%s%s%s holds a number that is not an integer", owner, sep, what);
    size_t digits = pos_of(r) - start;
    if (digits > 1 && r->begin[start] == '0')
        return fail_split(r, start, ATTN_ERR_FORMAT,
                          invalid(r, head, sizeof head, "valid JSON", ""),
                          ": a number with a leading zero");
    if (over) {
        int shown = digits > JSON_DIGITS_MAX ? JSON_DIGITS_MAX : (int)digits;
        const char *cut = digits > JSON_DIGITS_MAX ? "..." : "";
        const char *text = (const char *)r->begin + start;
        if (max == SIZE_MAX)
            return attn_json_fail_at(r, start, ATTN_ERR_OVERFLOW,
                                     "%s%sa value in %s overflows size_t (%.*s%s)", owner, sep,
                                     what, shown, text, cut);
        return attn_json_fail_at(r, start, ATTN_ERR_FORMAT,
                                 "%s%s%s %.*s%s exceeds %llu", owner, sep, what, shown, text, cut,
                                 (unsigned long long)max);
    }
    *out = value;
    return ATTN_OK;
}

/* The C library's decimal point under the caller's LC_NUMERIC ("." or ","
 * or another, possibly of several bytes), as printf writes it: strtod and
 * printf follow the locale a program set with setlocale, and JSON's point
 * is always '.'. */
static void locale_point(char point[8]) {
    char half[16];
    int n = snprintf(half, sizeof half, "%.1f", 0.5); /* "0", the point, "5" */
    size_t len = n > 2 && n < 10 ? (size_t)n - 2 : 0;
    memcpy(point, len ? half + 1 : ".", len ? len : 1);
    point[len ? len : 1] = '\0';
}

void attn_json_format_double(char *buf, size_t size, double x) {
    char text[64], point[8];
    snprintf(text, sizeof text, "%.17g", x);
    locale_point(point);
    char *at = strcmp(point, ".") ? strstr(text, point) : NULL;
    if (at) { /* the locale's point back to '.' */
        *at = '.';
        memmove(at + 1, at + strlen(point), strlen(at + strlen(point)) + 1);
    }
    snprintf(buf, size, "%s", text);
}

/* A number by JSON's grammar (-? int frac? exp?), converted by strtod with
 * its '.' as the locale's point. */
attn_status attn_json_read_number(attn_json_reader *r, double *out) {
    attn_json_skip_space(r);
    const unsigned char *start = r->p;
    if (r->p < r->end && *r->p == '-') r->p++;
    if (!is_digit(r)) return attn_json_expected(r, "a digit");
    if (*r->p == '0')
        r->p++;
    else
        while (is_digit(r)) r->p++;
    if (r->p < r->end && *r->p == '.') {
        r->p++;
        if (!is_digit(r)) return attn_json_expected(r, "a digit after '.'");
        while (is_digit(r)) r->p++;
    }
    if (r->p < r->end && (*r->p == 'e' || *r->p == 'E')) {
        r->p++;
        if (r->p < r->end && (*r->p == '+' || *r->p == '-')) r->p++;
        if (!is_digit(r)) return attn_json_expected(r, "a digit in the exponent");
        while (is_digit(r)) r->p++;
    }
    char small[64], point[8] = ".";
    size_t n = (size_t)(r->p - start);
    const unsigned char *dot = memchr(start, '.', n);
    if (dot) locale_point(point);
    /* the digits with the locale's point for '.', which may be wider */
    size_t head = dot ? (size_t)(dot - start) : n, width = dot ? strlen(point) : 0;
    size_t tail = dot ? n - head - 1 : 0;
    char *text = head + width + tail < sizeof small ? small : attn_malloc(head + width + tail + 1);
    if (!text) return out_of_memory(r);
    memcpy(text, start, head);
    memcpy(text + head, point, width);
    if (dot) memcpy(text + head + width, dot + 1, tail);
    text[head + width + tail] = '\0';
    *out = strtod(text, NULL); /* out of range: +-HUGE_VAL or 0, as Python reads it */
    if (text != small) attn_free(text);
    return ATTN_OK;
}

static bool literal(attn_json_reader *r, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(r->end - r->p) < n || memcmp(r->p, word, n) != 0) return false;
    r->p += n;
    return true;
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

/* ---- the tree ------------------------------------------------------------- */

static attn_status parse_value(attn_json_reader *r, attn_json *v, size_t depth);

/* Appends a zeroed item (and key slot) to v's arrays, growing them. */
static attn_status push_item(attn_json_reader *r, attn_json *v, size_t *capacity, bool keyed) {
    if (v->count == *capacity) {
        size_t grown = *capacity ? *capacity * 2 : 4;
        attn_json *items = attn_realloc(v->items, grown * sizeof *items);
        if (!items) return out_of_memory(r);
        v->items = items;
        if (keyed) {
            char **keys = attn_realloc(v->keys, grown * sizeof *keys);
            if (!keys) return out_of_memory(r);
            v->keys = keys;
        }
        *capacity = grown;
    }
    v->items[v->count] = (attn_json){0};
    if (keyed) v->keys[v->count] = NULL;
    v->count++;
    return ATTN_OK;
}

/* An array or an object at r->p (its bracket): v's items (and keys). On
 * failure v holds what was parsed so far, for the caller to free. */
static attn_status parse_container(attn_json_reader *r, attn_json *v, size_t depth, bool object) {
    v->type = object ? ATTN_JSON_OBJECT : ATTN_JSON_ARRAY;
    if (depth >= ATTN_JSON_MAX_DEPTH)
        return attn_json_fail_at(r, pos_of(r), ATTN_ERR_FORMAT, "JSON nested deeper than %d levels",
                                 ATTN_JSON_MAX_DEPTH);
    char close = object ? '}' : ']';
    r->p++;
    if (attn_json_accept(r, close)) return ATTN_OK;
    size_t capacity = 0;
    for (;;) {
        attn_status st = push_item(r, v, &capacity, object);
        if (st != ATTN_OK) return st;
        size_t i = v->count - 1;
        if (object) {
            if ((st = attn_json_read_string(r, "a string", &v->keys[i], NULL)) != ATTN_OK)
                return st;
            if ((st = attn_json_expect(r, ':', "':'")) != ATTN_OK) return st;
        }
        if ((st = parse_value(r, &v->items[i], depth + 1)) != ATTN_OK) return st;
        if (attn_json_accept(r, ',')) continue;
        if (attn_json_accept(r, close)) return ATTN_OK;
        return attn_json_expected(r, object ? "',' or '}'" : "',' or ']'");
    }
}

static attn_status parse_value(attn_json_reader *r, attn_json *v, size_t depth) {
    *v = (attn_json){0};
    attn_json_skip_space(r);
    if (r->p >= r->end) return attn_json_expected(r, "a value");
    switch (*r->p) {
    case '{': return parse_container(r, v, depth, true);
    case '[': return parse_container(r, v, depth, false);
    case '"':
        v->type = ATTN_JSON_STRING;
        return attn_json_read_string(r, "a string", &v->string, NULL);
    case 't':
    case 'f':
        v->type = ATTN_JSON_BOOL;
        v->boolean = *r->p == 't';
        if (literal(r, v->boolean ? "true" : "false")) return ATTN_OK;
        return attn_json_expected(r, "a value");
    case 'n':
        if (literal(r, "null")) return ATTN_OK;
        return attn_json_expected(r, "a value");
    default:
        if (*r->p == '-' || (*r->p >= '0' && *r->p <= '9')) {
            v->type = ATTN_JSON_NUMBER;
            return attn_json_read_number(r, &v->number);
        }
        return attn_json_expected(r, "a value");
    }
}

attn_status attn_json_parse(attn_ctx *ctx, const char *text, size_t len, const char *label,
                            attn_json **out) {
    if (!out) return attn_fail(ctx, ATTN_ERR_NULL, "attn_json_parse: out is NULL");
    *out = NULL;
    if (!text) return attn_fail(ctx, ATTN_ERR_NULL, "attn_json_parse: text is NULL");
    attn_json_reader r;
    attn_json_reader_init(&r, ctx, text, len, label);
    attn_json *root = attn_calloc(1, sizeof *root);
    if (!root) return out_of_memory(&r);
    attn_status st = parse_value(&r, root, 0);
    if (st == ATTN_OK) st = attn_json_end(&r, "the value");
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
        if (len > ATTN_JSON_MAX_FILE) {
            st = attn_fail(ctx, ATTN_ERR_FORMAT, "%s: more than %zu bytes, the most a JSON "
                           "config may hold", path, ATTN_JSON_MAX_FILE);
            break;
        }
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
