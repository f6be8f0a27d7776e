/*
 * npy.c — NumPy .npy files: float32 (or float64, narrowed) arrays in C order,
 * and int32 (or int64, range-checked; bool and bytes widened) arrays for
 * offsets, indices and masks.
 *
 * Reading accepts format versions 1.0, 2.0 and 3.0 and the descrs '<f4',
 * '>f4', '<f8', '>f8' for floats, '<i4', '>i4', '<i8', '>i8' for integers
 * and the one-byte '|b1' (bool), '|u1', '|i1' (masks)
 * ('|' and '=' mean the host's byte order, as in NumPy). Fortran order is
 * read where it is the same bytes as C order: arrays of one dimension or
 * none (the integer reader's cu_seqlens are such; a float array with
 * fortran_order True is refused).
 * The header is parsed as the small subset of Python dict literals that
 * NumPy writes: quoted keys and strings without escapes, True/False, and a
 * tuple of non-negative decimal integers (an old Python 2 'L' suffix is
 * tolerated). Everything else is rejected with ATTN_ERR_FORMAT, as are
 * unknown and duplicate keys. The '\n' that ends NumPy's padding is not
 * required, and bytes after the data are ignored, as numpy.load does (it
 * lets several arrays be saved back to back into one file).
 *
 * The parser treats its input as hostile: it never reads outside the bytes it
 * is given, checks every size product for overflow and checks that the data
 * is present before it allocates for it. Messages start with the path, or
 * "<memory>" for attn_npy_parse. On failure *out is left zeroed.
 *
 * Writing produces version 1.0, '<f4', fortran_order False, with the header
 * padded so the data starts on a 64-byte boundary, as current NumPy does,
 * through an attn_file (file.c): the file is replaced whole or not at all.
 */
#include "internal.h"
#include "io/file.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(float) == 4, "float must be IEEE binary32");
_Static_assert(sizeof(double) == 8, "double must be IEEE binary64");

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
/* Magic, two version bytes and the shortest (v1) length field. */
#define NPY_MIN_PREFIX 10
/* Real headers are a few hundred bytes; the cap stops a hostile length field
 * from making attn_npy_read allocate gigabytes before it sees a short file. */
#define NPY_MAX_HEADER_LEN ((size_t)1 << 20)
#define NPY_WRITE_ALIGN 64
/* Longest key or descr kept for comparison and messages. */
#define NPY_TEXT_MAX 48
/* Bytes converted or written per step when data cannot go straight through. */
#define NPY_CHUNK 16384

static const char *const memory_label = "<memory>";

typedef struct npy_header {
    size_t ndim;
    size_t shape[ATTN_NPY_MAX_DIMS];
    size_t numel;
    char kind;       /* 'f' or 'i', as the reader asks */
    size_t itemsize; /* 4 or 8; for integers also 1 */
    bool is_unsigned; /* a one-byte integer: bool or uint8 */
    bool big_endian; /* byte order of the stored data */
    size_t data_bytes;
} npy_header;

/* A position in the header text; offsets in messages are file offsets. */
typedef struct npy_cursor {
    attn_ctx *ctx;
    const char *label;
    const unsigned char *begin, *p, *end;
    size_t base;
} npy_cursor;

/* n bytes of untrusted text for a message or a comparison: escaped as
 * messages quote it (attn_escape_text), so that a control byte or a NUL
 * never passes for a name we know. Whether it was cut. */
static bool printable(char *dst, size_t cap, const unsigned char *src, size_t n) {
    return attn_escape_text(dst, cap, (const char *)src, n);
}

static size_t cursor_offset(const npy_cursor *c) { return c->base + (size_t)(c->p - c->begin); }

static void skip_space(npy_cursor *c) {
    while (c->p < c->end &&
           (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r' || *c->p == '\f'))
        c->p++;
}

static attn_status syntax_error(npy_cursor *c, const char *expected) {
    if (c->p >= c->end)
        return attn_fail(c->ctx, ATTN_ERR_FORMAT,
                         "%s: header dict is unterminated: it ends where %s was expected",
                         c->label, expected);
    unsigned char ch = *c->p;
    if (ch >= 0x20 && ch < 0x7f)
        return attn_fail(c->ctx, ATTN_ERR_FORMAT,
                         "%s: malformed header at byte %zu: expected %s, found '%c'", c->label,
                         cursor_offset(c), expected, (char)ch);
    return attn_fail(c->ctx, ATTN_ERR_FORMAT,
                     "%s: malformed header at byte %zu: expected %s, found byte 0x%02x", c->label,
                     cursor_offset(c), expected, (unsigned)ch);
}

static attn_status expect_char(npy_cursor *c, char ch, const char *expected) {
    if (c->p >= c->end || *c->p != (unsigned char)ch) return syntax_error(c, expected);
    c->p++;
    return ATTN_OK;
}

/* A quoted string without escapes; text longer than the buffer is cut and
 * flagged, so that it compares unequal to every name we know. */
static attn_status read_string(npy_cursor *c, char buf[NPY_TEXT_MAX], bool *cut,
                               const char *expected) {
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return syntax_error(c, expected);
    unsigned char quote = *c->p++;
    const unsigned char *start = c->p;
    while (c->p < c->end && *c->p != quote) {
        if (*c->p == '\\')
            return attn_fail(c->ctx, ATTN_ERR_FORMAT,
                             "%s: escape sequence in a header string at byte %zu is not supported",
                             c->label, cursor_offset(c));
        if (*c->p == '\n') break; /* Python strings do not span lines */
        c->p++;
    }
    if (c->p >= c->end || *c->p != quote) return syntax_error(c, "the closing quote of a string");
    size_t n = (size_t)(c->p - start);
    c->p++;
    *cut = printable(buf, NPY_TEXT_MAX, start, n);
    return ATTN_OK;
}

static attn_status read_bool(npy_cursor *c, bool *out) {
    const unsigned char *start = c->p;
    while (c->p < c->end && (*c->p == '_' || (*c->p >= 'a' && *c->p <= 'z') ||
                             (*c->p >= 'A' && *c->p <= 'Z') || (*c->p >= '0' && *c->p <= '9')))
        c->p++;
    size_t n = (size_t)(c->p - start);
    if (n == 4 && memcmp(start, "True", 4) == 0) {
        *out = true;
        return ATTN_OK;
    }
    if (n == 5 && memcmp(start, "False", 5) == 0) {
        *out = false;
        return ATTN_OK;
    }
    c->p = start;
    return syntax_error(c, "True or False for 'fortran_order'");
}

/* One dimension: decimal digits, no sign. */
static attn_status read_dim(npy_cursor *c, size_t *out) {
    if (c->p < c->end && *c->p == '-')
        return attn_fail(c->ctx, ATTN_ERR_FORMAT, "%s: negative dimension in 'shape' at byte %zu",
                         c->label, cursor_offset(c));
    if (c->p >= c->end || *c->p < '0' || *c->p > '9')
        return syntax_error(c, "a dimension in 'shape'");
    const unsigned char *start = c->p;
    size_t value = 0;
    bool overflow = false;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
        size_t digit = (size_t)(*c->p - '0');
        if (value > ((size_t)-1 - digit) / 10) overflow = true;
        else value = value * 10 + digit;
        c->p++;
    }
    if (overflow) {
        char text[NPY_TEXT_MAX];
        printable(text, sizeof text, start, (size_t)(c->p - start));
        return attn_fail(c->ctx, ATTN_ERR_OVERFLOW, "%s: dimension %s in 'shape' overflows size_t",
                         c->label, text);
    }
    if (c->p < c->end && *c->p == 'L') c->p++; /* Python 2 long */
    *out = value;
    return ATTN_OK;
}

/* A tuple of dimensions: "()", "(3,)", "(2, 6, 3)", trailing comma allowed. */
static attn_status read_shape(npy_cursor *c, npy_header *h) {
    attn_status st = expect_char(c, '(', "a tuple '(' for 'shape'");
    if (st != ATTN_OK) return st;
    skip_space(c);
    size_t count = 0;
    bool comma = false;
    if (c->p < c->end && *c->p == ')') {
        c->p++;
    } else {
        for (;;) {
            size_t dim = 0;
            if ((st = read_dim(c, &dim)) != ATTN_OK) return st;
            if (count < ATTN_NPY_MAX_DIMS) h->shape[count] = dim;
            count++;
            skip_space(c);
            if (c->p < c->end && *c->p == ',') {
                comma = true;
                c->p++;
                skip_space(c);
                if (c->p < c->end && *c->p == ')') {
                    c->p++;
                    break;
                }
            } else if (c->p < c->end && *c->p == ')') {
                c->p++;
                break;
            } else {
                return syntax_error(c, "',' or ')' in 'shape'");
            }
        }
    }
    /* "(3)" is the integer 3 in Python, which numpy.load rejects too. */
    if (count == 1 && !comma)
        return attn_fail(c->ctx, ATTN_ERR_FORMAT,
                         "%s: 'shape' (%zu) is not a tuple: a 1-D shape is written (%zu,)",
                         c->label, h->shape[0], h->shape[0]);
    if (count > ATTN_NPY_MAX_DIMS)
        return attn_fail(c->ctx, ATTN_ERR_FORMAT,
                         "%s: shape has %zu dimensions, more than ATTN_NPY_MAX_DIMS (%d)", c->label,
                         count, ATTN_NPY_MAX_DIMS);
    h->ndim = count;
    return ATTN_OK;
}

/* '<f4' and friends (h->kind in place of 'f'): sets itemsize and byte
 * order, or returns false. */
static bool decode_descr(const char *descr, npy_header *h) {
    /* one-byte integers (a boolean mask, uint8, int8) have no byte order */
    if (h->kind == 'i' && strlen(descr) == 3 && strchr("|<>=", descr[0]) && descr[2] == '1' &&
        (descr[1] == 'b' || descr[1] == 'u' || descr[1] == 'i')) {
        h->itemsize = 1;
        h->is_unsigned = descr[1] != 'i';
        h->big_endian = false;
        return true;
    }
    if (strlen(descr) != 3 || descr[1] != h->kind || (descr[2] != '4' && descr[2] != '8'))
        return false;
    switch (descr[0]) {
    case '<': h->big_endian = false; break;
    case '>': h->big_endian = true; break;
    case '|': /* NumPy reads both as the host's order */
    case '=': h->big_endian = attn_host_is_big_endian(); break;
    default: return false;
    }
    h->itemsize = descr[2] == '4' ? 4 : 8;
    return true;
}

/* The shape's element count and byte size (attn_shape_numel's overflow
 * rule: a zero dimension counts as one for it). */
static attn_status shape_size(attn_ctx *ctx, const char *label, size_t ndim, const size_t *shape,
                              size_t itemsize, size_t *numel, size_t *bytes) {
    size_t product = 0, count = 0, at = attn_shape_numel(ndim, shape, &product, &count);
    if (at < ndim)
        return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                         "%s: shape product overflows size_t at dimension %zu (%zu)", label, at,
                         shape[at]);
    size_t total;
    if (!attn_mul_size(product, itemsize, &total))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                         "%s: %zu elements of %zu bytes overflow size_t", label, product, itemsize);
    *numel = count;
    *bytes = count ? total : 0;
    return ATTN_OK;
}

/* Parses the header dict text [text, text + len), found at file offset base,
 * for an array of kind ('f' or 'i'). */
static attn_status parse_header(attn_ctx *ctx, const char *label, const unsigned char *text,
                                size_t len, size_t base, char kind, npy_header *h) {
    npy_cursor cur = {ctx, label, text, text, text + len, base};
    npy_cursor *c = &cur;
    char descr[NPY_TEXT_MAX] = "";
    bool descr_cut = false, fortran = false;
    bool have_descr = false, have_fortran = false, have_shape = false;
    attn_status st;

    memset(h, 0, sizeof *h);
    h->kind = kind;
    skip_space(c);
    if ((st = expect_char(c, '{', "'{' starting the header dict")) != ATTN_OK) return st;
    for (;;) {
        skip_space(c);
        if (c->p < c->end && *c->p == '}') {
            c->p++;
            break;
        }
        char key[NPY_TEXT_MAX];
        bool key_cut;
        size_t key_at = cursor_offset(c);
        if ((st = read_string(c, key, &key_cut, "a quoted key or '}'")) != ATTN_OK) return st;
        skip_space(c);
        if ((st = expect_char(c, ':', "':' after a key")) != ATTN_OK) return st;
        skip_space(c);

        bool *seen;
        if (!key_cut && strcmp(key, "descr") == 0) seen = &have_descr;
        else if (!key_cut && strcmp(key, "fortran_order") == 0) seen = &have_fortran;
        else if (!key_cut && strcmp(key, "shape") == 0) seen = &have_shape;
        else
            return attn_fail(ctx, ATTN_ERR_FORMAT,
                             "%s: unexpected key '%s' in the header at byte %zu (only 'descr', "
                             "'fortran_order' and 'shape' are allowed)",
                             label, key, key_at);
        if (*seen)
            return attn_fail(ctx, ATTN_ERR_FORMAT, "%s: duplicate key '%s' in the header", label,
                             key);
        *seen = true;

        if (seen == &have_descr) {
            if (c->p < c->end && (*c->p == '[' || *c->p == '{'))
                return attn_fail(ctx, ATTN_ERR_FORMAT,
                                 "%s: structured dtypes are not supported ('descr' is not a "
                                 "string)",
                                 label);
            st = read_string(c, descr, &descr_cut, "a quoted string for 'descr'");
        } else if (seen == &have_fortran) {
            st = read_bool(c, &fortran);
        } else {
            st = read_shape(c, h);
        }
        if (st != ATTN_OK) return st;

        skip_space(c);
        if (c->p < c->end && *c->p == ',') {
            c->p++;
            continue;
        }
        if ((st = expect_char(c, '}', "',' or '}' after a value")) != ATTN_OK) return st;
        break;
    }
    skip_space(c);
    if (c->p < c->end) {
        char text_after[NPY_TEXT_MAX];
        printable(text_after, sizeof text_after, c->p, (size_t)(c->end - c->p));
        return attn_fail(ctx, ATTN_ERR_FORMAT,
                         "%s: unexpected text after the header dict at byte %zu: '%s'", label,
                         cursor_offset(c), text_after);
    }

    if (!have_descr) return attn_fail(ctx, ATTN_ERR_FORMAT, "%s: header lacks the 'descr' key", label);
    if (!have_fortran)
        return attn_fail(ctx, ATTN_ERR_FORMAT, "%s: header lacks the 'fortran_order' key", label);
    if (!have_shape) return attn_fail(ctx, ATTN_ERR_FORMAT, "%s: header lacks the 'shape' key", label);

    if ((descr_cut || !decode_descr(descr, h)) && kind == 'f')
        return attn_fail(ctx, ATTN_ERR_FORMAT,
                         "%s: dtype '%s' is not float32 or float64 (read: '<f4', '>f4', '<f8', "
                         "'>f8')",
                         label, descr);
    if (descr_cut || !decode_descr(descr, h))
        return attn_fail(ctx, ATTN_ERR_FORMAT,
                         "%s: dtype '%s' is not an integer or bool (read: '<i4', '>i4', '<i8', "
                         "'>i8', '|i1', '|u1', '|b1')",
                         label, descr);
    if (fortran && (kind == 'f' || h->ndim > 1))
        return attn_fail(ctx, ATTN_ERR_FORMAT,
                         "%s: fortran_order True is not supported; save a C-order array "
                         "(numpy.ascontiguousarray)",
                         label);
    return shape_size(ctx, label, h->ndim, h->shape, h->itemsize, &h->numel, &h->data_bytes);
}

/*
 * Checks the magic and version in the first avail bytes of p and returns the
 * size of the header length field (2 for v1, 4 for v2 and v3). Reads at
 * most 8 bytes; fewer give bad magic or truncation.
 */
static attn_status parse_magic(attn_ctx *ctx, const char *label, const unsigned char *p,
                               size_t avail, size_t *len_field) {
    size_t n = avail < NPY_MAGIC_LEN ? avail : NPY_MAGIC_LEN;
    if (memcmp(p, NPY_MAGIC, n) != 0) {
        char hex[NPY_MAGIC_LEN * 3 + 1] = "";
        for (size_t i = 0; i < n; i++) snprintf(hex + 3 * i, 4, " %02x", (unsigned)p[i]);
        return attn_fail(ctx, ATTN_ERR_FORMAT,
                         "%s: not a .npy file: bad magic (starts with%s, want 93 4e 55 4d 50 59)",
                         label, hex);
    }
    if (avail < 8)
        return attn_fail(ctx, ATTN_ERR_FORMAT,
                         "%s: truncated header: expected at least %d bytes, got %zu", label,
                         NPY_MIN_PREFIX, avail);
    unsigned major = p[6], minor = p[7];
    if (minor != 0 || major < 1 || major > 3)
        return attn_fail(ctx, ATTN_ERR_FORMAT,
                         "%s: unsupported .npy format version %u.%u (read: 1.0, 2.0, 3.0)", label,
                         major, minor);
    *len_field = major == 1 ? 2 : 4;
    return ATTN_OK;
}

/* The little-endian header length field; checked against the cap. */
static attn_status header_length(attn_ctx *ctx, const char *label, const unsigned char *p,
                                 size_t len_field, size_t *out) {
    uint32_t len = (uint32_t)p[0] | (uint32_t)p[1] << 8;
    if (len_field == 4) len |= (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    if (len > NPY_MAX_HEADER_LEN)
        return attn_fail(ctx, ATTN_ERR_FORMAT,
                         "%s: header length %lu exceeds the limit of %zu bytes", label,
                         (unsigned long)len, NPY_MAX_HEADER_LEN);
    *out = len;
    return ATTN_OK;
}

/* Converts count stored elements at src (elements first.. of the array) to
 * floats at dst. dst may alias src when itemsize is 4: each element is
 * loaded before it is stored. A float64 rounds to the nearest float; a
 * finite one that float32 cannot hold (its magnitude rounds past FLT_MAX)
 * is an error naming it and its index, not an infinity that a later check
 * would report as a value the file does not hold. */
static attn_status decode_floats(attn_ctx *ctx, const char *label, const unsigned char *src,
                                 size_t count, const npy_header *h, size_t first, float *dst) {
    const double limit = 0x1.ffffffp127; /* FLT_MAX plus half an ulp: rounds to inf */
    for (size_t i = 0; i < count; i++) {
        const unsigned char *e = src + i * h->itemsize;
        if (h->itemsize == 4) {
            uint32_t u = h->big_endian ? (uint32_t)e[0] << 24 | (uint32_t)e[1] << 16 |
                                             (uint32_t)e[2] << 8 | (uint32_t)e[3]
                                       : (uint32_t)e[3] << 24 | (uint32_t)e[2] << 16 |
                                             (uint32_t)e[1] << 8 | (uint32_t)e[0];
            float f;
            memcpy(&f, &u, sizeof f);
            dst[i] = f;
        } else {
            uint64_t u = 0;
            for (int k = 0; k < 8; k++) u = u << 8 | e[h->big_endian ? k : 7 - k];
            double d;
            memcpy(&d, &u, sizeof d);
            if (isfinite(d) && fabs(d) >= limit)
                return attn_fail(ctx, ATTN_ERR_FORMAT,
                                 "%s: element %zu (%g) is beyond float32's range (+-%g); "
                                 "the array is read as float32",
                                 label, first + i, d, (double)FLT_MAX);
            dst[i] = (float)d; /* in range, or inf or NaN: no undefined conversion */
        }
    }
    return ATTN_OK;
}

static attn_status truncated_data(attn_ctx *ctx, const char *label, size_t expected, size_t got) {
    return attn_fail(ctx, ATTN_ERR_FORMAT, "%s: truncated data: expected %zu bytes, got %zu", label,
                     expected, got);
}

static attn_status alloc_data(attn_ctx *ctx, const char *label, const npy_header *h, float **out) {
    *out = attn_alloc_floats(h->numel);
    if (!*out)
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: cannot allocate %zu floats for the data",
                         label, h->numel);
    return ATTN_OK;
}

static void fill_result(const npy_header *h, float *data, attn_npy *out) {
    out->ndim = h->ndim;
    memcpy(out->shape, h->shape, sizeof out->shape);
    out->numel = h->numel;
    out->data = data;
}

/* Checks an in-memory image's magic, header and data length for an array
 * of kind ('f' or 'i'); *data points at its first element. */
static attn_status parse_image(attn_ctx *ctx, const char *label, const unsigned char *p,
                               size_t size, char kind, npy_header *h,
                               const unsigned char **data) {
    size_t len_field = 0, header_len = 0;
    attn_status st = parse_magic(ctx, label, p, size, &len_field);
    if (st != ATTN_OK) return st;
    size_t prefix = 8 + len_field;
    if (size < prefix)
        return attn_fail(ctx, ATTN_ERR_FORMAT, "%s: truncated header: expected %zu bytes, got %zu",
                         label, prefix, size);
    if ((st = header_length(ctx, label, p + 8, len_field, &header_len)) != ATTN_OK) return st;
    if (size - prefix < header_len)
        return attn_fail(ctx, ATTN_ERR_FORMAT,
                         "%s: truncated header: expected %zu bytes, got %zu", label,
                         prefix + header_len, size);
    if ((st = parse_header(ctx, label, p + prefix, header_len, prefix, kind, h)) != ATTN_OK)
        return st;
    size_t offset = prefix + header_len;
    if (size - offset < h->data_bytes)
        return truncated_data(ctx, label, h->data_bytes, size - offset);
    *data = p + offset;
    return ATTN_OK;
}

attn_status attn_npy_parse(attn_ctx *ctx, const void *bytes, size_t size, attn_npy *out) {
    attn_clear_error(ctx);
    if (!out) return attn_fail(ctx, ATTN_ERR_NULL, "attn_npy_parse: out is NULL");
    memset(out, 0, sizeof *out);
    if (!bytes) return attn_fail(ctx, ATTN_ERR_NULL, "attn_npy_parse: bytes is NULL");

    npy_header h = {0};
    const unsigned char *stored;
    attn_status st = parse_image(ctx, memory_label, bytes, size, 'f', &h, &stored);
    if (st != ATTN_OK) return st;
    float *data;
    if ((st = alloc_data(ctx, memory_label, &h, &data)) != ATTN_OK) return st;
    if ((st = decode_floats(ctx, memory_label, stored, h.numel, &h, 0, data)) != ATTN_OK) {
        attn_free(data);
        return st;
    }
    fill_result(&h, data, out);
    return ATTN_OK;
}

/* Reads exactly n bytes or reports why not: ATTN_ERR_IO for a read error,
 * ATTN_ERR_FORMAT (truncated, naming what) for an early end of file. */
static attn_status read_exact(attn_ctx *ctx, const char *path, FILE *f, void *dst, size_t n,
                              size_t expected_total, size_t already, const char *what) {
    size_t got = n ? fread(dst, 1, n, f) : 0;
    if (got == n) return ATTN_OK;
    if (ferror(f))
        return attn_fail(ctx, ATTN_ERR_IO, "%s: read failed: %s", path, strerror(errno));
    return attn_fail(ctx, ATTN_ERR_FORMAT, "%s: truncated %s: expected %zu bytes, got %zu", path,
                     what, expected_total, already + got);
}

/* Bytes left in f from the current position, or (size_t)-1 when the stream
 * cannot seek (a pipe); used to reject short files before allocating. */
static size_t remaining_bytes(FILE *f) {
    long here = ftell(f);
    if (here < 0 || fseek(f, 0, SEEK_END) != 0) return (size_t)-1;
    long end = ftell(f);
    if (fseek(f, here, SEEK_SET) != 0 || end < here) return (size_t)-1;
    return (size_t)(end - here);
}

/* Reads f's magic and header for an array of kind ('f' or 'i'), leaving f
 * at the data, which is checked to be long enough where f can seek. */
static attn_status read_stream_header(attn_ctx *ctx, const char *path, FILE *f, char kind,
                                      npy_header *h) {
    unsigned char prefix[12];
    size_t got = fread(prefix, 1, 8, f);
    if (got < 8 && ferror(f))
        return attn_fail(ctx, ATTN_ERR_IO, "%s: read failed: %s", path, strerror(errno));
    size_t len_field = 0, header_len = 0;
    attn_status st = parse_magic(ctx, path, prefix, got, &len_field);
    if (st != ATTN_OK) return st;
    if ((st = read_exact(ctx, path, f, prefix + 8, len_field, 8 + len_field, 8, "header")) != ATTN_OK)
        return st;
    if ((st = header_length(ctx, path, prefix + 8, len_field, &header_len)) != ATTN_OK) return st;

    unsigned char *text = attn_malloc(header_len ? header_len : 1);
    if (!text)
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: cannot allocate %zu header bytes", path,
                         header_len);
    size_t offset = 8 + len_field;
    st = read_exact(ctx, path, f, text, header_len, offset + header_len, offset, "header");
    if (st == ATTN_OK) st = parse_header(ctx, path, text, header_len, offset, kind, h);
    attn_free(text);
    if (st != ATTN_OK) return st;

    size_t left = remaining_bytes(f);
    if (left != (size_t)-1 && left < h->data_bytes)
        return truncated_data(ctx, path, h->data_bytes, left);
    return ATTN_OK;
}

static attn_status read_stream(attn_ctx *ctx, const char *path, FILE *f, attn_npy *out) {
    npy_header h = {0};
    attn_status st = read_stream_header(ctx, path, f, 'f', &h);
    if (st != ATTN_OK) return st;
    float *data;
    if ((st = alloc_data(ctx, path, &h, &data)) != ATTN_OK) return st;
    if (h.itemsize == 4) {
        /* Straight into the result, then fixed up in place. */
        st = read_exact(ctx, path, f, data, h.data_bytes, h.data_bytes, 0, "data");
        if (st == ATTN_OK)
            st = decode_floats(ctx, path, (const unsigned char *)data, h.numel, &h, 0, data);
    } else {
        unsigned char chunk[NPY_CHUNK];
        const size_t per_chunk = sizeof chunk / 8;
        for (size_t done = 0; done < h.numel && st == ATTN_OK;) {
            size_t n = h.numel - done < per_chunk ? h.numel - done : per_chunk;
            st = read_exact(ctx, path, f, chunk, n * 8, h.data_bytes, done * 8, "data");
            if (st == ATTN_OK) st = decode_floats(ctx, path, chunk, n, &h, done, data + done);
            done += n;
        }
    }
    if (st != ATTN_OK) {
        attn_free(data);
        return st;
    }
    fill_result(&h, data, out);
    return ATTN_OK;
}

attn_status attn_npy_read(attn_ctx *ctx, const char *path, attn_npy *out) {
    attn_clear_error(ctx);
    if (!out) return attn_fail(ctx, ATTN_ERR_NULL, "attn_npy_read: out is NULL");
    memset(out, 0, sizeof *out);
    if (!path) return attn_fail(ctx, ATTN_ERR_NULL, "attn_npy_read: path is NULL");
    FILE *f = fopen(path, "rb");
    if (!f) return attn_fail(ctx, ATTN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    attn_status st = read_stream(ctx, path, f, out);
    fclose(f); /* read-only: nothing to lose if closing fails */
    return st;
}

/* ---- int32 (and int64) arrays ------------------------------------------- */

/* Converts count stored integers at src, elements first.. of the array, to
 * int32 at dst; a value outside int32 is an error naming it and its index. */
static attn_status decode_ints(attn_ctx *ctx, const char *label, const unsigned char *src,
                               size_t count, const npy_header *h, size_t first, int32_t *dst) {
    for (size_t i = 0; i < count; i++) {
        const unsigned char *e = src + i * h->itemsize;
        uint64_t u = 0;
        for (size_t k = 0; k < h->itemsize; k++)
            u = u << 8 | e[h->big_endian ? k : h->itemsize - 1 - k];
        /* two's complement, sign-extended from the stored width */
        int64_t v = h->itemsize == 1 ? (h->is_unsigned ? (int64_t)u : (int64_t)(int8_t)(uint8_t)u)
                    : h->itemsize == 4 ? (int64_t)(int32_t)(uint32_t)u
                                       : (u >> 63 ? -(int64_t)(~u) - 1 : (int64_t)u);
        if (v < INT32_MIN || v > INT32_MAX)
            return attn_fail(ctx, ATTN_ERR_FORMAT,
                             "%s: element %zu (%lld) does not fit int32", label, first + i,
                             (long long)v);
        dst[i] = (int32_t)v;
    }
    return ATTN_OK;
}

static attn_status alloc_ints(attn_ctx *ctx, const char *label, const npy_header *h,
                              int32_t **out) {
    *out = attn_calloc(h->numel ? h->numel : 1, sizeof **out);
    if (!*out)
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: cannot allocate %zu int32 for the data",
                         label, h->numel);
    return ATTN_OK;
}

static void fill_ints(const npy_header *h, int32_t *data, attn_npy_i32 *out) {
    out->ndim = h->ndim;
    memcpy(out->shape, h->shape, sizeof out->shape);
    out->numel = h->numel;
    out->data = data;
}

attn_status attn_npy_parse_i32(attn_ctx *ctx, const void *bytes, size_t size, attn_npy_i32 *out) {
    attn_clear_error(ctx);
    if (!out) return attn_fail(ctx, ATTN_ERR_NULL, "attn_npy_parse_i32: out is NULL");
    memset(out, 0, sizeof *out);
    if (!bytes) return attn_fail(ctx, ATTN_ERR_NULL, "attn_npy_parse_i32: bytes is NULL");

    npy_header h = {0};
    const unsigned char *stored;
    attn_status st = parse_image(ctx, memory_label, bytes, size, 'i', &h, &stored);
    if (st != ATTN_OK) return st;
    int32_t *data;
    if ((st = alloc_ints(ctx, memory_label, &h, &data)) != ATTN_OK) return st;
    if ((st = decode_ints(ctx, memory_label, stored, h.numel, &h, 0, data)) != ATTN_OK) {
        attn_free(data);
        return st;
    }
    fill_ints(&h, data, out);
    return ATTN_OK;
}

static attn_status read_stream_i32(attn_ctx *ctx, const char *path, FILE *f, attn_npy_i32 *out) {
    npy_header h = {0};
    attn_status st = read_stream_header(ctx, path, f, 'i', &h);
    if (st != ATTN_OK) return st;
    int32_t *data;
    if ((st = alloc_ints(ctx, path, &h, &data)) != ATTN_OK) return st;
    unsigned char chunk[NPY_CHUNK];
    const size_t per_chunk = sizeof chunk / h.itemsize;
    for (size_t done = 0; done < h.numel && st == ATTN_OK;) {
        size_t n = h.numel - done < per_chunk ? h.numel - done : per_chunk;
        st = read_exact(ctx, path, f, chunk, n * h.itemsize, h.data_bytes, done * h.itemsize,
                        "data");
        if (st == ATTN_OK) st = decode_ints(ctx, path, chunk, n, &h, done, data + done);
        done += n;
    }
    if (st != ATTN_OK) {
        attn_free(data);
        return st;
    }
    fill_ints(&h, data, out);
    return ATTN_OK;
}

attn_status attn_npy_read_i32(attn_ctx *ctx, const char *path, attn_npy_i32 *out) {
    attn_clear_error(ctx);
    if (!out) return attn_fail(ctx, ATTN_ERR_NULL, "attn_npy_read_i32: out is NULL");
    memset(out, 0, sizeof *out);
    if (!path) return attn_fail(ctx, ATTN_ERR_NULL, "attn_npy_read_i32: path is NULL");
    FILE *f = fopen(path, "rb");
    if (!f) return attn_fail(ctx, ATTN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    attn_status st = read_stream_i32(ctx, path, f, out);
    fclose(f); /* read-only: nothing to lose if closing fails */
    return st;
}

void attn_npy_i32_free(attn_npy_i32 *npy) {
    if (!npy) return;
    attn_free(npy->data);
    memset(npy, 0, sizeof *npy);
}

/* Appends text to buf, which the caller has sized for the largest header. */
static void append(char *buf, size_t cap, size_t *len, const char *text) {
    size_t n = strlen(text);
    if (*len + n < cap) {
        memcpy(buf + *len, text, n);
        *len += n;
        buf[*len] = '\0';
    }
}

/* Checks the arguments and builds the header (len bytes of header, which
 * holds 512); label names the destination in messages. */
static attn_status prepare_write(attn_ctx *ctx, const char *label, const float *data, size_t ndim,
                                 const size_t *shape, char header[512], size_t *len,
                                 size_t *numel) {
    if (ndim > ATTN_NPY_MAX_DIMS)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: ndim %zu exceeds ATTN_NPY_MAX_DIMS (%d)", label, ndim,
                         ATTN_NPY_MAX_DIMS);
    if (ndim > 0 && !shape)
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: shape is NULL for ndim %zu", label, ndim);
    size_t bytes;
    attn_status st = shape_size(ctx, label, ndim, shape, sizeof(float), numel, &bytes);
    if (st != ATTN_OK) return st;
    if (*numel > 0 && !data)
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: data is NULL for %zu elements", label, *numel);

    /* 10 prefix bytes, ~60 of dict, 8 dimensions of at most 20 digits and
     * ", ", and up to 63 bytes of padding fit easily. */
    const size_t cap = 512;
    *len = NPY_MIN_PREFIX;
    header[*len] = '\0';
    append(header, cap, len, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
    for (size_t i = 0; i < ndim; i++) {
        char dim[32];
        snprintf(dim, sizeof dim, i ? ", %zu" : "%zu", shape[i]);
        append(header, cap, len, dim);
    }
    append(header, cap, len, ndim == 1 ? ",), }" : "), }");
    /* Spaces up to the byte before the boundary, which holds the '\n'. */
    while ((*len + 1) % NPY_WRITE_ALIGN != 0) header[(*len)++] = ' ';
    header[(*len)++] = '\n';
    memcpy(header, NPY_MAGIC, NPY_MAGIC_LEN);
    header[6] = 1;
    header[7] = 0;
    size_t header_len = *len - NPY_MIN_PREFIX;
    header[8] = (char)(header_len & 0xff);
    header[9] = (char)(header_len >> 8);
    return ATTN_OK;
}

attn_status attn_npy_write_file(attn_ctx *ctx, attn_file *file, const float *data, size_t ndim,
                                const size_t *shape) {
    attn_clear_error(ctx);
    if (!file) return attn_fail(ctx, ATTN_ERR_NULL, "attn_npy_write_file: file is NULL");
    char header[512];
    size_t len, numel;
    attn_status s = prepare_write(ctx, file->path, data, ndim, shape, header, &len, &numel);
    if (s == ATTN_OK) s = attn_file_write(ctx, file, header, len);
    if (s == ATTN_OK) s = attn_file_write_f32le(ctx, file, data, numel);
    return s;
}

attn_status attn_npy_write(attn_ctx *ctx, const char *path, const float *data, size_t ndim,
                           const size_t *shape) {
    attn_clear_error(ctx);
    if (!path) return attn_fail(ctx, ATTN_ERR_NULL, "attn_npy_write: path is NULL");
    char header[512];
    size_t len, numel;
    attn_status s = prepare_write(ctx, path, data, ndim, shape, header, &len, &numel);
    if (s != ATTN_OK) return s;
    attn_file *f;
    if ((s = attn_file_open(ctx, path, &f)) != ATTN_OK) return s;
    if ((s = attn_file_write(ctx, f, header, len)) == ATTN_OK &&
        (s = attn_file_write_f32le(ctx, f, data, numel)) == ATTN_OK)
        return attn_file_commit(ctx, f);
    attn_file_discard(f);
    return s;
}

void attn_npy_free(attn_npy *npy) {
    if (!npy) return;
    attn_free(npy->data);
    memset(npy, 0, sizeof *npy);
}
