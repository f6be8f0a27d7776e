/*
 * tensor_print.c — a C rendering of torch/_tensor_str.py (PyTorch 1.13) for
 * dense float32 CPU tensors with no autograd history, under the default
 * print options. The structure mirrors the Python source:
 *
 *   _Formatter                  -> fmt_init / fmt_value
 *   get_summarized_data         -> the index selection in sel_count/sel_index
 *   _vector_str                 -> emit_vector
 *   _tensor_str_with_formatter  -> emit_block
 *   _str_intern/_add_suffixes   -> emit_tensor
 *
 * Python formats each value with "{:.4f}", "{:.4e}" or "{:.0f}" applied to the
 * double that float.item() yields; C's printf conversions of the same double
 * produce the same digits (both round the exact binary value correctly), so
 * finite values go through snprintf. Non-finite values are spelled the way
 * Python spells them ("inf", "-inf", "nan" — never "-nan").
 */
#include "tensor_print.h"

#include <math.h>
#include <string.h>

/* torch's default PRINT_OPTS. */
enum {
    PRINT_PRECISION = 4,
    PRINT_THRESHOLD = 1000,
    PRINT_EDGEITEMS = 3,
    PRINT_LINEWIDTH = 80,
};

/* Length of "tensor(": the indent of the outermost bracket. */
#define TENSOR_PREFIX "tensor("
#define TENSOR_INDENT 7

/* Room for any single formatted float32 ("%.4f" of FLT_MAX is 46 chars). */
#define VALUE_BUF 128

/* ---- output sink: a FILE, or a bounded buffer with snprintf semantics ---- */

typedef struct {
    FILE *file;  /* when non-NULL, text goes here */
    char *buf;   /* otherwise here, up to cap - 1 bytes */
    size_t cap;
    size_t len;  /* total length of the text produced so far */
} sink;

static void sink_write(sink *s, const char *text, size_t n) {
    if (n == 0) return;
    if (s->file) {
        fwrite(text, 1, n, s->file);
    } else if (s->buf && s->cap > 0 && s->len < s->cap - 1) {
        size_t room = s->cap - 1 - s->len;
        memcpy(s->buf + s->len, text, n < room ? n : room);
    }
    s->len += n;
}

static void sink_puts(sink *s, const char *text) { sink_write(s, text, strlen(text)); }

static void sink_spaces(sink *s, size_t n) {
    static const char spaces[] = "                                ";
    while (n > 0) {
        size_t k = n < sizeof spaces - 1 ? n : sizeof spaces - 1;
        sink_write(s, spaces, k);
        n -= k;
    }
}

static void sink_char(sink *s, char c, size_t n) {
    for (size_t i = 0; i < n; i++) sink_write(s, &c, 1);
}

static void sink_size(sink *s, size_t v) {
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%zu", v);
    if (n > 0) sink_write(s, tmp, (size_t)n);
}

static void sink_finish(sink *s) {
    if (!s->file && s->buf && s->cap > 0) s->buf[s->len < s->cap ? s->len : s->cap - 1] = '\0';
}

/* ---- the tensor being printed ---- */

typedef struct {
    const float *data;
    size_t ndim;
    const size_t *shape;
    int summarize;
} tensor_view;

/* Row-major stride of dimension d, in elements. */
static size_t stride_of(const tensor_view *t, size_t d) {
    size_t acc = 1;
    for (size_t i = d + 1; i < t->ndim; i++) acc *= t->shape[i];
    return acc;
}

/* How many entries of a dimension of size n are shown, and which ones
 * (the first and last edgeitems when summarizing a dimension > 2*edgeitems). */
static size_t sel_count(const tensor_view *t, size_t n) {
    return (t->summarize && n > 2 * PRINT_EDGEITEMS) ? 2 * PRINT_EDGEITEMS : n;
}

static size_t sel_index(const tensor_view *t, size_t n, size_t i) {
    if (t->summarize && n > 2 * PRINT_EDGEITEMS && i >= PRINT_EDGEITEMS)
        return n - 2 * PRINT_EDGEITEMS + i;
    return i;
}

/* True where a "..." entry follows entry i of a dimension of size n. */
static int sel_gap_after(const tensor_view *t, size_t n, size_t i) {
    return t->summarize && n > 2 * PRINT_EDGEITEMS && i == PRINT_EDGEITEMS - 1;
}

/* ---- _Formatter ---- */

typedef struct {
    int int_mode;
    int sci_mode;
    size_t max_width;
    /* scan state */
    size_t nonzero_finite;
    double abs_min, abs_max;
} formatter;

/* Python's "{:.Nf}" / "{:.Ne}" / "{:.0f}" of a double; returns the length. */
static size_t format_plain(char *out, double v, int sci, int int_mode) {
    int n;
    if (isnan(v)) {
        n = snprintf(out, VALUE_BUF, "nan");
    } else if (isinf(v)) {
        n = snprintf(out, VALUE_BUF, "%s", v < 0 ? "-inf" : "inf");
    } else if (sci) {
        n = snprintf(out, VALUE_BUF, "%.*e", PRINT_PRECISION, v);
    } else if (int_mode) {
        n = snprintf(out, VALUE_BUF, "%.0f", v);
    } else {
        n = snprintf(out, VALUE_BUF, "%.*f", PRINT_PRECISION, v);
    }
    if (n < 0) {
        out[0] = '\0';
        return 0;
    }
    return (size_t)n < VALUE_BUF ? (size_t)n : VALUE_BUF - 1;
}

typedef void (*value_fn)(formatter *f, float v);

/* Visits every value that will be printed (get_summarized_data). */
static void visit(const tensor_view *t, size_t d, size_t offset, formatter *f, value_fn fn) {
    size_t n = t->shape[d];
    size_t count = sel_count(t, n);
    size_t stride = stride_of(t, d);
    for (size_t i = 0; i < count; i++) {
        size_t off = offset + sel_index(t, n, i) * stride;
        if (d + 1 == t->ndim) fn(f, t->data[off]);
        else visit(t, d + 1, off, f, fn);
    }
}

static int nonzero_finite(float v) { return isfinite(v) && v != 0.0f; }

static void scan_stats(formatter *f, float v) {
    if (!nonzero_finite(v)) return;
    double a = fabs((double)v);
    if (f->nonzero_finite == 0 || a < f->abs_min) f->abs_min = a;
    if (f->nonzero_finite == 0 || a > f->abs_max) f->abs_max = a;
    f->nonzero_finite++;
    if (v != ceilf(v)) f->int_mode = 0;
}

static void scan_width(formatter *f, float v) {
    if (!nonzero_finite(v)) return;
    char tmp[VALUE_BUF];
    size_t len = format_plain(tmp, (double)v, f->sci_mode, f->int_mode);
    if (f->int_mode && !f->sci_mode) len += 1; /* the trailing "." */
    if (len > f->max_width) f->max_width = len;
}

static void fmt_init(formatter *f, const tensor_view *t) {
    f->int_mode = 1;
    f->sci_mode = 0;
    f->max_width = 1;
    f->nonzero_finite = 0;
    f->abs_min = f->abs_max = 0.0;
    if (t->ndim == 0) scan_stats(f, t->data[0]);
    else visit(t, 0, 0, f, scan_stats);
    if (f->nonzero_finite == 0) return; /* no valid number: defaults stand */

    double ratio = f->abs_max / f->abs_min;
    if (f->int_mode) {
        f->sci_mode = ratio > 1000.0 || f->abs_max > 1.0e8;
    } else {
        f->sci_mode = ratio > 1000.0 || f->abs_max > 1.0e8 || f->abs_min < 1.0e-4;
    }
    if (t->ndim == 0) scan_width(f, t->data[0]);
    else visit(t, 0, 0, f, scan_width);
}

/* _Formatter.format: the value, right-aligned to max_width. */
static void fmt_value(sink *s, const formatter *f, float v) {
    char tmp[VALUE_BUF + 1];
    size_t len = format_plain(tmp, (double)v, f->sci_mode, f->int_mode);
    if (f->int_mode && !f->sci_mode && isfinite(v)) tmp[len++] = '.';
    if (len < f->max_width) sink_spaces(s, f->max_width - len);
    sink_write(s, tmp, len);
}

/* ---- _vector_str / _tensor_str_with_formatter ---- */

static void emit_vector(sink *s, const tensor_view *t, const formatter *f, size_t offset,
                        size_t indent) {
    size_t n = t->shape[t->ndim - 1];
    size_t element_length = f->max_width + 2;
    /* max(1, floor((linewidth - indent) / element_length)) */
    size_t per_line = 1;
    if (indent < PRINT_LINEWIDTH) {
        per_line = (PRINT_LINEWIDTH - indent) / element_length;
        if (per_line < 1) per_line = 1;
    }

    size_t count = sel_count(t, n);
    size_t item = 0; /* position in the data list, " ..." included */
    sink_puts(s, "[");
    for (size_t i = 0; i < count; i++) {
        for (int gap = 0; gap < 2; gap++) {
            if (gap == 1 && !sel_gap_after(t, n, i)) break;
            if (item > 0) {
                if (item % per_line == 0) {
                    sink_puts(s, ",\n");
                    sink_spaces(s, indent + 1);
                } else {
                    sink_puts(s, ", ");
                }
            }
            if (gap == 0) fmt_value(s, f, t->data[offset + sel_index(t, n, i)]);
            else sink_puts(s, " ...");
            item++;
        }
    }
    sink_puts(s, "]");
}

static void emit_block(sink *s, const tensor_view *t, const formatter *f, size_t d,
                       size_t offset, size_t indent) {
    if (d + 1 == t->ndim) {
        emit_vector(s, t, f, offset, indent);
        return;
    }
    size_t dim = t->ndim - d; /* rank of this block */
    size_t n = t->shape[d];
    size_t count = sel_count(t, n);
    size_t stride = stride_of(t, d);
    sink_puts(s, "[");
    for (size_t i = 0; i < count; i++) {
        if (i > 0) {
            sink_puts(s, ",");
            sink_char(s, '\n', dim - 1);
            sink_spaces(s, indent + 1);
        }
        emit_block(s, t, f, d + 1, offset + sel_index(t, n, i) * stride, indent + 1);
        if (sel_gap_after(t, n, i)) {
            sink_puts(s, ",");
            sink_char(s, '\n', dim - 1);
            sink_spaces(s, indent + 1);
            sink_puts(s, "...");
        }
    }
    sink_puts(s, "]");
}

/* ---- _str_intern ---- */

static void emit_tensor(sink *s, const float *data, size_t ndim, const size_t *shape) {
    tensor_view t;
    size_t numel = 1;
    int empty = 0;
    for (size_t i = 0; i < ndim; i++) {
        if (shape[i] == 0) empty = 1;
    }
    if (!empty) {
        for (size_t i = 0; i < ndim; i++) numel *= shape[i];
    } else {
        numel = 0;
    }

    sink_puts(s, TENSOR_PREFIX);
    if (numel == 0) {
        sink_puts(s, "[]");
        if (ndim != 1) {
            /* size=(d0, d1, ...) — Python's str(tuple) */
            char tmp[32];
            size_t suffix_len = strlen("size=()");
            for (size_t i = 0; i < ndim; i++) {
                suffix_len += (size_t)snprintf(tmp, sizeof tmp, "%zu", shape[i]);
                if (i > 0) suffix_len += 2;
            }
            /* _add_suffixes: len(tensor_str) - rfind("\n") + 1 with no newline */
            size_t last_line_len = strlen(TENSOR_PREFIX "[]") + 2;
            if (last_line_len + suffix_len + 2 > PRINT_LINEWIDTH) {
                sink_puts(s, ",\n");
                sink_spaces(s, TENSOR_INDENT);
            } else {
                sink_puts(s, ", ");
            }
            sink_puts(s, "size=(");
            for (size_t i = 0; i < ndim; i++) {
                if (i > 0) sink_puts(s, ", ");
                sink_size(s, shape[i]);
            }
            sink_puts(s, ")");
        }
        sink_puts(s, ")\n");
        return;
    }

    t.data = data;
    t.ndim = ndim;
    t.shape = shape;
    t.summarize = numel > PRINT_THRESHOLD;

    formatter f;
    fmt_init(&f, &t);
    if (ndim == 0) fmt_value(s, &f, data[0]);
    else emit_block(s, &t, &f, 0, 0, TENSOR_INDENT);
    sink_puts(s, ")\n");
}

void attn_print_tensor(FILE *out, const float *data, size_t ndim, const size_t *shape) {
    sink s = {out, NULL, 0, 0};
    emit_tensor(&s, data, ndim, shape);
}

size_t attn_format_tensor(char *buf, size_t cap, const float *data, size_t ndim,
                          const size_t *shape) {
    sink s = {NULL, buf, cap, 0};
    emit_tensor(&s, data, ndim, shape);
    sink_finish(&s);
    return s.len;
}

void attn_print_size(FILE *out, size_t ndim, const size_t *shape) {
    sink s = {out, NULL, 0, 0};
    sink_puts(&s, "torch.Size([");
    for (size_t i = 0; i < ndim; i++) {
        if (i > 0) sink_puts(&s, ", ");
        sink_size(&s, shape[i]);
    }
    sink_puts(&s, "])\n");
}
