/*
 * test_npy.c — .npy reading, parsing and writing: random round trips,
 * hand-built headers of every version and byte order, every error path with
 * its status and message, and a mutation fuzz loop over valid images.
 *
 * The random parts are seeded from the clock and print their seed; pass a
 * seed as the first argument to repeat a run.
 */
#include "attn.h"
#include "check.h"

#include <errno.h>
#include <float.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t rng_state;

/* splitmix64: small, good enough, and the same on every platform. */
static uint64_t next_u64(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static size_t below(size_t n) { return (size_t)(next_u64() % n); }

/* A file name in $TMPDIR (or /tmp) unique to this run. */
static void temp_path(char *buf, size_t cap, const char *name) {
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    snprintf(buf, cap, "%s/attn_test_npy_%llu_%s", dir, (unsigned long long)rng_state, name);
}

static unsigned char *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, len = 0;
    unsigned char *buf = malloc(cap);
    for (;;) {
        if (len == cap) buf = realloc(buf, cap *= 2);
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0) break;
    }
    fclose(f);
    *size = len;
    return buf;
}

static void write_file(const char *path, const void *bytes, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(bytes, 1, size, f);
    fclose(f);
}

/*
 * A .npy image of the given version: magic, version, length field, the dict
 * text padded with spaces to 64 bytes (when pad) and ended with '\n', then
 * the data bytes. Returns malloc'd memory of exactly *size bytes.
 */
static unsigned char *build_image(int major, const char *dict, bool pad, const void *data,
                                  size_t data_len, size_t *size) {
    size_t prefix = major == 1 ? 10 : 12;
    size_t text = strlen(dict);
    size_t header_len = text + (pad ? 1 : 0);
    if (pad)
        while ((prefix + header_len) % 64 != 0) header_len++;
    *size = prefix + header_len + data_len;
    unsigned char *img = malloc(*size ? *size : 1);
    memcpy(img, "\x93NUMPY", 6);
    img[6] = (unsigned char)major;
    img[7] = 0;
    for (size_t i = 0; i < prefix - 8; i++) img[8 + i] = (unsigned char)(header_len >> (8 * i));
    memcpy(img + prefix, dict, text);
    if (pad) {
        memset(img + prefix + text, ' ', header_len - text);
        img[prefix + header_len - 1] = '\n';
    }
    if (data_len) memcpy(img + prefix + header_len, data, data_len);
    return img;
}

static void store_le32(unsigned char *dst, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    for (int k = 0; k < 4; k++) dst[k] = (unsigned char)(u >> (8 * k));
}

static void store_be32(unsigned char *dst, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    for (int k = 0; k < 4; k++) dst[k] = (unsigned char)(u >> (24 - 8 * k));
}

static void store_64(unsigned char *dst, double d, bool big) {
    uint64_t u;
    memcpy(&u, &d, 8);
    for (int k = 0; k < 8; k++) dst[big ? 7 - k : k] = (unsigned char)(u >> (8 * k));
}

/* Parses an image built from a dict with six little-endian float32 zeros
 * and returns the status, leaving the message in ctx. */
static attn_status parse_dict(attn_ctx *ctx, const char *dict, size_t data_len) {
    unsigned char data[64] = {0};
    size_t size;
    unsigned char *img = build_image(1, dict, true, data, data_len, &size);
    attn_npy npy;
    attn_status st = attn_npy_parse(ctx, img, size, &npy);
    if (st == ATTN_OK) attn_npy_free(&npy);
    else CHECK(npy.data == NULL && npy.ndim == 0 && npy.numel == 0);
    free(img);
    return st;
}

static bool same_bits(const float *a, const float *b, size_t n) {
    return n == 0 || memcmp(a, b, n * sizeof *a) == 0;
}

static void test_round_trip(attn_ctx *ctx) {
    char path[512];
    temp_path(path, sizeof path, "round_trip.npy");
    for (int iter = 0; iter < 200; iter++) {
        size_t ndim = below(5), shape[4], numel = 1;
        for (size_t i = 0; i < ndim; i++) {
            shape[i] = below(iter % 10 == 0 ? 3 : 7); /* sometimes an empty array */
            numel *= shape[i];
        }
        float *data = malloc((numel ? numel : 1) * sizeof *data);
        for (size_t i = 0; i < numel; i++) {
            if (iter % 4 == 0) {
                /* Any bit pattern: NaN payloads, infinities, denormals, -0. */
                uint32_t u = (uint32_t)next_u64();
                memcpy(&data[i], &u, 4);
            } else {
                data[i] = (float)((double)(int64_t)(next_u64() >> 11) / 9007199254740992.0 * 200.0 - 100.0);
            }
        }
        CHECK_STATUS(attn_npy_write(ctx, path, data, ndim, shape), ATTN_OK);

        attn_npy npy;
        CHECK_STATUS(attn_npy_read(ctx, path, &npy), ATTN_OK);
        CHECK(npy.ndim == ndim);
        CHECK(npy.numel == numel);
        CHECK(npy.data != NULL);
        for (size_t i = 0; i < ndim; i++) CHECK(npy.shape[i] == shape[i]);
        CHECK(same_bits(npy.data, data, numel));
        CHECK(strcmp(attn_ctx_last_error(ctx), "") == 0);
        attn_npy_free(&npy);

        size_t size;
        unsigned char *img = read_file(path, &size);
        CHECK(img != NULL);
        if (!img) break;
        CHECK(size >= 10 && memcmp(img, "\x93NUMPY\x01\x00", 8) == 0);
        size_t header_len = (size_t)img[8] | (size_t)img[9] << 8;
        CHECK((10 + header_len) % 64 == 0);
        CHECK(img[10 + header_len - 1] == '\n');
        CHECK(size == 10 + header_len + numel * 4);
        /* The data is little-endian whatever the host. */
        if (numel > 0) {
            unsigned char want[4];
            store_le32(want, data[0]);
            CHECK(memcmp(img + 10 + header_len, want, 4) == 0);
        }
        CHECK_STATUS(attn_npy_parse(ctx, img, size, &npy), ATTN_OK);
        CHECK(npy.ndim == ndim && npy.numel == numel);
        CHECK(same_bits(npy.data, data, numel));
        attn_npy_free(&npy);
        free(img);
        free(data);
    }
    remove(path);
}

/* The header text is NumPy's, shape in Python repr form. */
static void test_write_header(attn_ctx *ctx) {
    static const struct {
        size_t ndim;
        size_t shape[3];
        const char *text;
    } cases[] = {
        {0, {0}, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }"},
        {1, {3}, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }"},
        {2, {4, 5}, "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 5), }"},
        {3, {2, 6, 3}, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 6, 3), }"},
    };
    char path[512];
    temp_path(path, sizeof path, "header.npy");
    float data[36] = {0};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        CHECK_STATUS(attn_npy_write(ctx, path, data, cases[c].ndim, cases[c].shape), ATTN_OK);
        size_t size;
        unsigned char *img = read_file(path, &size);
        CHECK(img && size == 128 + 4 * (c == 0 ? 1 : c == 1 ? 3 : c == 2 ? 20 : 36));
        if (img) {
            size_t n = strlen(cases[c].text);
            CHECK(memcmp(img + 10, cases[c].text, n) == 0);
            for (size_t i = 10 + n; i < 127; i++) CHECK(img[i] == ' ');
            CHECK(img[127] == '\n');
        }
        free(img);
    }
    /* An empty array needs no data pointer. */
    size_t zero = 0;
    CHECK_STATUS(attn_npy_write(ctx, path, NULL, 1, &zero), ATTN_OK);
    attn_npy npy;
    CHECK_STATUS(attn_npy_read(ctx, path, &npy), ATTN_OK);
    CHECK(npy.ndim == 1 && npy.shape[0] == 0 && npy.numel == 0);
    attn_npy_free(&npy);
    remove(path);
}

static void test_parse_versions(attn_ctx *ctx) {
    const float values[6] = {1.5f, -2.25f, 3.0f, 0.0f, -0.0f, 1e-40f};
    unsigned char le[24], be[24];
    for (int i = 0; i < 6; i++) {
        store_le32(le + 4 * i, values[i]);
        store_be32(be + 4 * i, values[i]);
    }
    static const struct {
        int major;
        bool big;
        bool pad;
        const char *dict;
    } cases[] = {
        {1, false, true, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"},
        {2, false, true, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"},
        {3, false, true, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"},
        {1, true, true, "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }"},
        {2, true, true, "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }"},
        /* Any key order, double quotes, no trailing comma, newlines, no '\n' end. */
        {1, false, false, "{\"shape\": (2,3), \"fortran_order\": False, \"descr\": \"<f4\"}"},
        {1, false, true, "  {\n 'shape' : ( 2 , 3 , ) ,\n'descr':'<f4','fortran_order':False}"},
        {1, false, true, "{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t size;
        unsigned char *img =
            build_image(cases[c].major, cases[c].dict, cases[c].pad, cases[c].big ? be : le, 24, &size);
        attn_npy npy;
        CHECK_STATUS(attn_npy_parse(ctx, img, size, &npy), ATTN_OK);
        CHECK(npy.ndim == 2 && npy.shape[0] == 2 && npy.shape[1] == 3 && npy.numel == 6);
        CHECK(npy.data && same_bits(npy.data, values, 6));
        attn_npy_free(&npy);
        free(img);
    }

    /* float64 of both orders, rounded to nearest float32; infinities stay. */
    const double wide[5] = {1.0 / 3.0, 0.1, -INFINITY, -1e-50, (double)FLT_MAX};
    const float narrow[5] = {1.0f / 3.0f, 0.1f, -INFINITY, -0.0f, FLT_MAX};
    for (int big = 0; big < 2; big++) {
        unsigned char bytes[40];
        for (int i = 0; i < 5; i++) store_64(bytes + 8 * i, wide[i], big);
        size_t size;
        unsigned char *img = build_image(1,
                                         big ? "{'descr': '>f8', 'fortran_order': False, 'shape': (5,), }"
                                             : "{'descr': '<f8', 'fortran_order': False, 'shape': (5,), }",
                                         true, bytes, 40, &size);
        attn_npy npy;
        CHECK_STATUS(attn_npy_parse(ctx, img, size, &npy), ATTN_OK);
        CHECK(npy.ndim == 1 && npy.numel == 5);
        CHECK(npy.data && same_bits(npy.data, narrow, 5));
        free(img);
        attn_npy_free(&npy);
    }
    /* Just below the rounding boundary stays finite; at it, a finite value
     * float32 cannot hold is refused by its index and value (it would read
     * as an infinity the file does not hold), of either sign, in memory and
     * from a file whose float64 data takes several read chunks. */
    {
        unsigned char bytes[32];
        store_64(bytes, 0x1.fffffefffffffp127, false);
        store_64(bytes + 8, INFINITY, false);
        store_64(bytes + 16, NAN, false);
        size_t size;
        unsigned char *img = build_image(
            2, "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", true, bytes, 24, &size);
        attn_npy npy;
        CHECK_STATUS(attn_npy_parse(ctx, img, size, &npy), ATTN_OK);
        if (npy.data) {
            CHECK(npy.data[0] == FLT_MAX);
            CHECK(npy.data[1] == INFINITY);
            CHECK(isnan(npy.data[2]));
        }
        free(img);
        attn_npy_free(&npy);
        const double past[3] = {0x1.ffffffp127, -0x1.ffffffp127, -DBL_MAX};
        const char *named[3] = {"element 2 (3.40282e+38) is beyond float32's range",
                                "element 2 (-3.40282e+38) is beyond float32's range",
                                "element 2 (-1.79769e+308) is beyond float32's range"};
        for (int i = 0; i < 3; i++) {
            store_64(bytes + 16, past[i], false);
            img = build_image(2, "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }",
                              true, bytes, 24, &size);
            memset(&npy, 0xab, sizeof npy);
            CHECK_STATUS(attn_npy_parse(ctx, img, size, &npy), ATTN_ERR_FORMAT);
            CHECK_MESSAGE(ctx, named[i]);
            CHECK(npy.data == NULL && npy.numel == 0);
            free(img);
        }
    }

    /* Scalars, empty arrays and trailing bytes. */
    {
        size_t size;
        unsigned char *img =
            build_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", true, le, 4, &size);
        attn_npy npy;
        CHECK_STATUS(attn_npy_parse(ctx, img, size, &npy), ATTN_OK);
        CHECK(npy.ndim == 0 && npy.numel == 1 && npy.data && npy.data[0] == 1.5f);
        attn_npy_free(&npy);
        CHECK(npy.data == NULL && npy.numel == 0);
        free(img);

        img = build_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0,), }", true, NULL, 0, &size);
        CHECK_STATUS(attn_npy_parse(ctx, img, size, &npy), ATTN_OK);
        CHECK(npy.ndim == 1 && npy.shape[0] == 0 && npy.numel == 0);
        attn_npy_free(&npy);
        free(img);

        img = build_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 0, 3), }", true, NULL, 0, &size);
        CHECK_STATUS(attn_npy_parse(ctx, img, size, &npy), ATTN_OK);
        CHECK(npy.ndim == 3 && npy.numel == 0);
        attn_npy_free(&npy);
        free(img);

        /* Trailing bytes after the data are ignored, as numpy.load does. */
        img = build_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }", true, le, 24, &size);
        CHECK_STATUS(attn_npy_parse(ctx, img, size, &npy), ATTN_OK);
        CHECK(npy.numel == 5 && npy.data && same_bits(npy.data, values, 5));
        attn_npy_free(&npy);
        free(img);
    }
    /* The reader takes big-endian and float64 files too. */
    {
        char path[512];
        temp_path(path, sizeof path, "be.npy");
        size_t size;
        unsigned char *img =
            build_image(2, "{'descr': '>f4', 'fortran_order': False, 'shape': (3, 2), }", true, be, 24, &size);
        write_file(path, img, size);
        free(img);
        attn_npy npy;
        CHECK_STATUS(attn_npy_read(ctx, path, &npy), ATTN_OK);
        CHECK(npy.ndim == 2 && npy.shape[0] == 3 && npy.data && same_bits(npy.data, values, 6));
        attn_npy_free(&npy);

        /* Enough float64 elements to take several read chunks. */
        size_t n = 5000;
        unsigned char *bytes = malloc(n * 8);
        float *want = malloc(n * sizeof *want);
        for (size_t i = 0; i < n; i++) {
            double d = (double)i / 7.0 - 300.0;
            store_64(bytes + 8 * i, d, true);
            want[i] = (float)d;
        }
        img = build_image(1, "{'descr': '>f8', 'fortran_order': False, 'shape': (50, 100), }", true, bytes, n * 8, &size);
        write_file(path, img, size);
        CHECK_STATUS(attn_npy_read(ctx, path, &npy), ATTN_OK);
        CHECK(npy.numel == n && npy.data && same_bits(npy.data, want, n));
        attn_npy_free(&npy);

        /* Truncated in the middle of the float64 data. */
        write_file(path, img, size - 100);
        CHECK_STATUS(attn_npy_read(ctx, path, &npy), ATTN_ERR_FORMAT);
        CHECK_MESSAGE(ctx, "truncated data: expected 40000 bytes, got 39900");
        CHECK_MESSAGE(ctx, path);
        CHECK(npy.data == NULL);
        free(img);
        free(bytes);
        free(want);
        remove(path);
    }
}

static void test_header_errors(attn_ctx *ctx) {
    static const struct {
        const char *dict;
        attn_status status;
        const char *fragment;
    } cases[] = {
        {"{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", ATTN_ERR_FORMAT,
         "fortran_order True is not supported"},
        {"{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }", ATTN_ERR_FORMAT,
         "<memory>: dtype '<i4' is not float32 or float64"},
        {"{'descr': '<f2', 'fortran_order': False, 'shape': (2, 3), }", ATTN_ERR_FORMAT, "'<f2'"},
        {"{'descr': 'f4', 'fortran_order': False, 'shape': (2, 3), }", ATTN_ERR_FORMAT, "'f4'"},
        {"{'descr': '<f4x', 'fortran_order': False, 'shape': (2, 3), }", ATTN_ERR_FORMAT, "'<f4x'"},
        {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", ATTN_ERR_FORMAT,
         "structured dtypes"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776, 1099511627776, "
         "1099511627776), }",
         ATTN_ERR_OVERFLOW, "overflows size_t"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (123456789012345678901234567890,), }",
         ATTN_ERR_OVERFLOW, "dimension 123456789012345678901234567890 in 'shape' overflows"},
        {"{'descr': '<f4', 'fortran_order': False, }", ATTN_ERR_FORMAT,
         "header lacks the 'shape' key"},
        {"{'fortran_order': False, 'shape': (2, 3), }", ATTN_ERR_FORMAT,
         "header lacks the 'descr' key"},
        {"{'descr': '<f4', 'shape': (2, 3), }", ATTN_ERR_FORMAT,
         "header lacks the 'fortran_order' key"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), ", ATTN_ERR_FORMAT,
         "unterminated"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3", ATTN_ERR_FORMAT,
         "unterminated"},
        {"{'descr': '<f4", ATTN_ERR_FORMAT, "closing quote"},
        {"", ATTN_ERR_FORMAT, "unterminated"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 1), }",
         ATTN_ERR_FORMAT, "shape has 9 dimensions, more than ATTN_NPY_MAX_DIMS (8)"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }", ATTN_ERR_FORMAT,
         "negative dimension"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (6), }", ATTN_ERR_FORMAT,
         "'shape' (6) is not a tuple"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3], }", ATTN_ERR_FORMAT,
         "expected a tuple '(' for 'shape', found '['"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,, 3), }", ATTN_ERR_FORMAT,
         "expected a dimension in 'shape', found ','"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2 3), }", ATTN_ERR_FORMAT,
         "expected ',' or ')' in 'shape', found '3'"},
        {"{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 3), }", ATTN_ERR_FORMAT,
         "True or False for 'fortran_order'"},
        {"{'descr': '<f4', 'fortran_order': Falsey, 'shape': (2, 3), }", ATTN_ERR_FORMAT,
         "True or False"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'extra': 1}", ATTN_ERR_FORMAT,
         "unexpected key 'extra'"},
        {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}",
         ATTN_ERR_FORMAT, "duplicate key 'descr'"},
        {"{'descr' '<f4', 'fortran_order': False, 'shape': (2, 3)}", ATTN_ERR_FORMAT,
         "expected ':' after a key"},
        {"{descr: '<f4', 'fortran_order': False, 'shape': (2, 3)}", ATTN_ERR_FORMAT,
         "expected a quoted key or '}', found 'd'"},
        {"{'descr': '<f4' 'fortran_order': False, 'shape': (2, 3)}", ATTN_ERR_FORMAT,
         "expected ',' or '}' after a value"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)} x", ATTN_ERR_FORMAT,
         "unexpected text after the header dict"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}}", ATTN_ERR_FORMAT,
         "unexpected text after the header dict"},
        {"{'de\\x63r': '<f4', 'fortran_order': False, 'shape': (2, 3)}", ATTN_ERR_FORMAT,
         "escape sequence"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'a\x01\x7f': 1}",
         ATTN_ERR_FORMAT, "unexpected key 'a\\x01\\x7f'"},
        /* UTF-8 kept as it is, named whole */
        {"{'descr': '<f4\xc3\xa9', 'fortran_order': False, 'shape': (2, 3)}", ATTN_ERR_FORMAT,
         "'<f4\xc3\xa9'"},
        {"('descr', '<f4')", ATTN_ERR_FORMAT, "expected '{' starting the header dict, found '('"},
        /* Six elements declared, five present. */
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }", ATTN_ERR_FORMAT,
         "truncated data: expected 24 bytes, got 20"},
        {"{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", ATTN_ERR_FORMAT,
         "truncated data: expected 24 bytes, got 20"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        CHECK_STATUS(parse_dict(ctx, cases[c].dict, 20), cases[c].status);
        CHECK_MESSAGE(ctx, cases[c].fragment);
        if (cases[c].status == ATTN_ERR_FORMAT || cases[c].status == ATTN_ERR_OVERFLOW)
            CHECK_MESSAGE(ctx, "<memory>: ");
    }
    /* a NUL in a string never passes for the name before it, and is named */
    {
        unsigned char data[24] = {0};
        size_t size;
        unsigned char *img = build_image(
            1, "{'descr': '<f4@', 'fortran_order': False, 'shape': (2, 3)}", true, data,
            sizeof data, &size);
        *(unsigned char *)memchr(img, '@', size) = 0;
        attn_npy npy;
        CHECK_STATUS(attn_npy_parse(ctx, img, size, &npy), ATTN_ERR_FORMAT);
        CHECK_MESSAGE(ctx, "dtype '<f4\\x00'");
        free(img);
    }
    /* A long descr is named, cut short. */
    CHECK_STATUS(parse_dict(ctx,
                            "{'descr': '<f4aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                            "aaaaaa', 'fortran_order': False, 'shape': (2, 3), }",
                            24),
                 ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "dtype '<f4aaaa");
    CHECK_MESSAGE(ctx, "...'");

    /* Element count times itemsize overflowing, with each dimension fine. */
    if (SIZE_MAX == UINT64_MAX) {
        CHECK_STATUS(parse_dict(ctx,
                                "{'descr': '<f8', 'fortran_order': False, 'shape': "
                                "(4611686018427387904,), }",
                                0),
                     ATTN_ERR_OVERFLOW);
        CHECK_MESSAGE(ctx, "4611686018427387904 elements of 8 bytes overflow size_t");
        /* A zero dimension does not excuse an overflowing product. */
        CHECK_STATUS(parse_dict(ctx,
                                "{'descr': '<f4', 'fortran_order': False, 'shape': (0, "
                                "4294967296, 4294967296), }",
                                0),
                     ATTN_ERR_OVERFLOW);
        /* A huge declared array with little data fails before allocating. */
        CHECK_STATUS(parse_dict(ctx,
                                "{'descr': '<f4', 'fortran_order': False, 'shape': "
                                "(1099511627776,), }",
                                20),
                     ATTN_ERR_FORMAT);
        CHECK_MESSAGE(ctx, "truncated data: expected 4398046511104 bytes, got 20");
    }
}

static void test_prefix_errors(attn_ctx *ctx) {
    attn_npy npy;
    const char *dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
    unsigned char data[8] = {0};
    size_t size;
    unsigned char *good = build_image(1, dict, true, data, 8, &size);

    /* Bad magic, including a file that is too short to hold all of it. */
    unsigned char *img = malloc(size);
    memcpy(img, good, size);
    img[1] = 'n';
    CHECK_STATUS(attn_npy_parse(ctx, img, size, &npy), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "not a .npy file: bad magic (starts with 93 6e 55 4d 50 59");
    CHECK_STATUS(attn_npy_parse(ctx, "\x89PNG", 4, &npy), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "bad magic (starts with 89 50 4e 47,");
    CHECK_STATUS(attn_npy_parse(ctx, "", 0, &npy), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "truncated header: expected at least 10 bytes, got 0");

    /* Truncated prefix and header. */
    for (size_t n = 1; n < 10; n++) {
        CHECK_STATUS(attn_npy_parse(ctx, good, n, &npy), ATTN_ERR_FORMAT);
        CHECK_MESSAGE(ctx, "truncated header");
    }
    CHECK_STATUS(attn_npy_parse(ctx, good, 9, &npy), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "expected 10 bytes, got 9");
    CHECK_STATUS(attn_npy_parse(ctx, good, 30, &npy), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "truncated header: expected 128 bytes, got 30");

    /* Versions. */
    memcpy(img, good, size);
    img[6] = 4;
    CHECK_STATUS(attn_npy_parse(ctx, img, size, &npy), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "unsupported .npy format version 4.0");
    img[6] = 1;
    img[7] = 1;
    CHECK_STATUS(attn_npy_parse(ctx, img, size, &npy), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "version 1.1");
    img[6] = 0;
    img[7] = 0;
    CHECK_STATUS(attn_npy_parse(ctx, img, size, &npy), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "version 0.0");

    /* Huge header lengths: v1's largest, and v2's over the cap. */
    memcpy(img, good, size);
    img[8] = 0xff;
    img[9] = 0xff;
    CHECK_STATUS(attn_npy_parse(ctx, img, size, &npy), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "truncated header: expected 65545 bytes, got 136");
    free(img);
    unsigned char *v2 = build_image(2, dict, true, data, 8, &size);
    v2[8] = v2[9] = v2[10] = v2[11] = 0xff;
    CHECK_STATUS(attn_npy_parse(ctx, v2, size, &npy), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "header length 4294967295 exceeds the limit");
    v2[11] = 0;
    v2[10] = 0x20; /* 2 MiB */
    CHECK_STATUS(attn_npy_parse(ctx, v2, size, &npy), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "exceeds the limit of 1048576 bytes");

    /* A zero-length header is an empty dict text. */
    v2[8] = v2[9] = v2[10] = v2[11] = 0;
    CHECK_STATUS(attn_npy_parse(ctx, v2, size, &npy), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "unterminated");
    free(v2);

    /* A NUL inside the header is reported as a byte, not text. */
    img = build_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)\x01}", true, data, 8, &size);
    CHECK_STATUS(attn_npy_parse(ctx, img, size, &npy), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "found byte 0x01");
    free(img);

    /* Truncated data: one byte short. */
    CHECK_STATUS(attn_npy_parse(ctx, good, 128 + 7, &npy), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "truncated data: expected 8 bytes, got 7");
    CHECK(npy.data == NULL);
    free(good);
}

static void test_null_and_io(attn_ctx *ctx) {
    attn_npy npy;
    unsigned char byte = 0;
    size_t shape[2] = {2, 2};
    float data[4] = {1, 2, 3, 4};

    CHECK_STATUS(attn_npy_parse(ctx, NULL, 10, &npy), ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "bytes is NULL");
    CHECK_STATUS(attn_npy_parse(ctx, &byte, 1, NULL), ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "out is NULL");
    CHECK_STATUS(attn_npy_read(ctx, NULL, &npy), ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "path is NULL");
    CHECK_STATUS(attn_npy_read(ctx, "x.npy", NULL), ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "out is NULL");
    CHECK_STATUS(attn_npy_write(ctx, NULL, data, 2, shape), ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "path is NULL");

    char path[512];
    temp_path(path, sizeof path, "null.npy");
    CHECK_STATUS(attn_npy_write(ctx, path, data, 2, NULL), ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "shape is NULL for ndim 2");
    CHECK_STATUS(attn_npy_write(ctx, path, NULL, 2, shape), ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "data is NULL for 4 elements");
    size_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    CHECK_STATUS(attn_npy_write(ctx, path, data, 9, nine), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "ndim 9 exceeds ATTN_NPY_MAX_DIMS (8)");
    size_t huge[3] = {(size_t)1 << 40, (size_t)1 << 40, (size_t)1 << 40};
    if (SIZE_MAX == UINT64_MAX) {
        CHECK_STATUS(attn_npy_write(ctx, path, data, 3, huge), ATTN_ERR_OVERFLOW);
        CHECK_MESSAGE(ctx, "overflows size_t");
    }

    /* A NULL ctx still gets the status. */
    CHECK_STATUS(attn_npy_parse(NULL, NULL, 0, &npy), ATTN_ERR_NULL);
    CHECK_STATUS(attn_npy_parse(NULL, "\x93NUMPZ", 6, &npy), ATTN_ERR_FORMAT);
    CHECK_STATUS(attn_npy_read(NULL, "/nonexistent/dir/x.npy", &npy), ATTN_ERR_IO);
    CHECK_STATUS(attn_npy_write(NULL, path, data, 2, shape), ATTN_OK);
    CHECK_STATUS(attn_npy_read(NULL, path, &npy), ATTN_OK);
    CHECK(npy.numel == 4 && npy.data && npy.data[3] == 4.0f);
    attn_npy_free(&npy);

    /* Files that are missing, unwritable, directories, short or empty. */
    CHECK_STATUS(attn_npy_read(ctx, "/nonexistent/dir/x.npy", &npy), ATTN_ERR_IO);
    CHECK_MESSAGE(ctx, "/nonexistent/dir/x.npy: cannot open: ");
    CHECK_MESSAGE(ctx, strerror(ENOENT));
    CHECK(npy.data == NULL);
    CHECK_STATUS(attn_npy_write(ctx, "/nonexistent/dir/x.npy", data, 2, shape), ATTN_ERR_IO);
    CHECK_MESSAGE(ctx, "/nonexistent/dir/x.npy: cannot open for writing: ");
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    CHECK_STATUS(attn_npy_read(ctx, dir, &npy), ATTN_ERR_IO);
    CHECK_MESSAGE(ctx, dir);

    CHECK_STATUS(attn_npy_write(ctx, path, data, 2, shape), ATTN_OK);
    size_t size;
    unsigned char *img = read_file(path, &size);
    CHECK(img && size == 128 + 16);
    if (img) {
        write_file(path, img, size - 1);
        CHECK_STATUS(attn_npy_read(ctx, path, &npy), ATTN_ERR_FORMAT);
        CHECK_MESSAGE(ctx, "truncated data: expected 16 bytes, got 15");
        CHECK_MESSAGE(ctx, path);
        write_file(path, img, 40);
        CHECK_STATUS(attn_npy_read(ctx, path, &npy), ATTN_ERR_FORMAT);
        CHECK_MESSAGE(ctx, "truncated header: expected 128 bytes, got 40");
        write_file(path, img, 9);
        CHECK_STATUS(attn_npy_read(ctx, path, &npy), ATTN_ERR_FORMAT);
        CHECK_MESSAGE(ctx, "truncated header: expected 10 bytes, got 9");
        write_file(path, img, 3);
        CHECK_STATUS(attn_npy_read(ctx, path, &npy), ATTN_ERR_FORMAT);
        CHECK_MESSAGE(ctx, "expected at least 10 bytes, got 3");
        write_file(path, img, 0);
        CHECK_STATUS(attn_npy_read(ctx, path, &npy), ATTN_ERR_FORMAT);
        CHECK_MESSAGE(ctx, "got 0");
        write_file(path, "hello, world", 12);
        CHECK_STATUS(attn_npy_read(ctx, path, &npy), ATTN_ERR_FORMAT);
        CHECK_MESSAGE(ctx, "bad magic");
        /* A huge declared array in a small file fails before allocating. */
        unsigned char *big = build_image(
            1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }", true,
            data, 16, &size);
        write_file(path, big, size);
        CHECK_STATUS(attn_npy_read(ctx, path, &npy), ATTN_ERR_FORMAT);
        if (SIZE_MAX == UINT64_MAX) CHECK_MESSAGE(ctx, "expected 4398046511104 bytes, got 16");
        free(big);
        /* Header errors name the file. */
        big = build_image(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (4,), }", true,
                          data, 16, &size);
        write_file(path, big, size);
        CHECK_STATUS(attn_npy_read(ctx, path, &npy), ATTN_ERR_FORMAT);
        CHECK_MESSAGE(ctx, path);
        CHECK_MESSAGE(ctx, ": dtype '<i4' is not float32 or float64");
        free(big);
        big = build_image(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", true,
                          data, 16, &size);
        write_file(path, big, size);
        CHECK_STATUS(attn_npy_read(ctx, path, &npy), ATTN_ERR_FORMAT);
        CHECK_MESSAGE(ctx, "fortran_order True");
        free(big);
        big = build_image(2, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", true,
                          data, 16, &size);
        big[10] = 0x10; /* 1 MiB + 64 */
        write_file(path, big, size);
        CHECK_STATUS(attn_npy_read(ctx, path, &npy), ATTN_ERR_FORMAT);
        CHECK_MESSAGE(ctx, "exceeds the limit");
        free(big);
    }
    free(img);
    remove(path);

    /* free is safe on NULL, on a zeroed struct and twice. */
    attn_npy_free(NULL);
    attn_npy zeroed = {0};
    attn_npy_free(&zeroed);
    CHECK(zeroed.data == NULL && zeroed.ndim == 0);
    CHECK_STATUS(attn_npy_write(ctx, path, data, 2, shape), ATTN_OK);
    CHECK_STATUS(attn_npy_read(ctx, path, &npy), ATTN_OK);
    attn_npy_free(&npy);
    attn_npy_free(&npy);
    CHECK(npy.data == NULL && npy.numel == 0 && npy.shape[0] == 0);
    remove(path);

    /* A failure leaves out zeroed even when it held garbage. */
    memset(&npy, 0xab, sizeof npy);
    CHECK_STATUS(attn_npy_parse(ctx, "nope", 4, &npy), ATTN_ERR_FORMAT);
    CHECK(npy.data == NULL && npy.ndim == 0 && npy.numel == 0);
}

/* Mutates valid images at random; every result must be a clean status with
 * a message, or a consistent array. Run under ASan/UBSan to mean anything. */
static void test_fuzz(attn_ctx *ctx) {
    unsigned char f4[64], f8[64];
    for (int i = 0; i < 16; i++) store_le32(f4 + 4 * i, (float)i - 3.5f);
    for (int i = 0; i < 8; i++) store_64(f8 + 8 * i, (double)i * 1e37, true);
    size_t sizes[3];
    unsigned char *seeds[3] = {
        build_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }", true, f4, 48, &sizes[0]),
        build_image(2, "{'descr': '>f8', 'fortran_order': False, 'shape': (2, 1, 4), }", true, f8, 64, &sizes[1]),
        build_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", false, f4, 4, &sizes[2]),
    };
    static const char interesting[] = "(){}[],:'\" \n-0123456789LTrueFalse<>|=f48\x93\xff";
    size_t ok = 0, failed = 0;
    for (int iter = 0; iter < 100000; iter++) {
        size_t s = below(3), size = sizes[s];
        unsigned char *img = malloc(size);
        memcpy(img, seeds[s], size);
        size_t mutations = 1 + below(4);
        for (size_t m = 0; m < mutations; m++) {
            size_t at = below(size);
            switch (below(6)) {
            case 0: img[at] ^= (unsigned char)(1u << below(8)); break;
            case 1: img[at] = (unsigned char)next_u64(); break;
            case 2: img[at] = (unsigned char)interesting[below(sizeof interesting - 1)]; break;
            case 3: img[8 + below(4)] = (unsigned char)next_u64(); break; /* length field */
            case 4: /* delete a byte */
                memmove(img + at, img + at + 1, size - at - 1);
                break;
            default: break;
            }
        }
        /* Truncate, into a buffer of exactly that size so ASan sees over-reads. */
        size_t len = below(4) == 0 ? below(size + 1) : size;
        unsigned char *exact = malloc(len ? len : 1);
        memcpy(exact, img, len);
        free(img);
        attn_npy npy;
        attn_ctx *use = below(8) == 0 ? NULL : ctx;
        attn_status st = attn_npy_parse(use, exact, len, &npy);
        if (st == ATTN_OK) {
            ok++;
            size_t numel = 1;
            for (size_t i = 0; i < npy.ndim; i++) numel *= npy.shape[i];
            CHECK(npy.ndim <= ATTN_NPY_MAX_DIMS && npy.numel == numel && npy.data != NULL);
            if (npy.numel) {
                volatile float sink = npy.data[npy.numel - 1];
                (void)sink;
            }
            attn_npy_free(&npy);
        } else {
            failed++;
            CHECK(st == ATTN_ERR_FORMAT || st == ATTN_ERR_OVERFLOW || st == ATTN_ERR_NO_MEMORY);
            CHECK(npy.data == NULL);
            if (use) CHECK(attn_ctx_last_error(ctx)[0] != '\0');
        }
        free(exact);
    }
    printf("fuzz: %zu parsed, %zu rejected\n", ok, failed);
    CHECK(ok > 0 && failed > 0);
    for (int i = 0; i < 3; i++) free(seeds[i]);
}

/* Stores v in size bytes (4 or 8) of dst, little- or big-endian, two's
 * complement. */
static void store_int(unsigned char *dst, int64_t v, size_t size, bool big) {
    uint64_t u = (uint64_t)v;
    for (size_t i = 0; i < size; i++)
        dst[big ? size - 1 - i : i] = (unsigned char)(u >> (8 * i));
}

/* A 1-D integer image of values, descr e.g. "<i8", written then parsed
 * (from memory and from a file): both must succeed with values back. */
static void check_int_image(attn_ctx *ctx, const char *descr, const char *fortran,
                            const int64_t *values, size_t n) {
    size_t size = (size_t)(descr[2] - '0'), bytes = n * size;
    bool big = descr[0] == '>';
    unsigned char data[64];
    for (size_t i = 0; i < n; i++) store_int(data + i * size, values[i], size, big);
    char dict[160];
    snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': %s, 'shape': (%zu,), }", descr,
             fortran, n);
    size_t img_size;
    unsigned char *img = build_image(1, dict, true, data, bytes, &img_size);
    attn_npy_i32 a;
    CHECK_STATUS(attn_npy_parse_i32(ctx, img, img_size, &a), ATTN_OK);
    CHECK(a.ndim == 1 && a.shape[0] == n && a.numel == n);
    for (size_t i = 0; i < n && a.data; i++) CHECK(a.data[i] == values[i]);
    attn_npy_i32_free(&a);
    CHECK(a.data == NULL && a.numel == 0);
    char path[256];
    temp_path(path, sizeof path, "ints.npy");
    write_file(path, img, img_size);
    CHECK_STATUS(attn_npy_read_i32(ctx, path, &a), ATTN_OK);
    CHECK(a.ndim == 1 && a.numel == n);
    for (size_t i = 0; i < n && a.data; i++) CHECK(a.data[i] == values[i]);
    attn_npy_i32_free(&a);
    remove(path);
    free(img);
}

/* Parses dict + data as integers from memory and from a file: both fail
 * with status, naming want, and leave out zeroed. */
static void expect_int_reject(attn_ctx *ctx, int major, const char *dict, const void *data,
                              size_t data_len, attn_status status, const char *want) {
    size_t img_size;
    unsigned char *img = build_image(major, dict, true, data, data_len, &img_size);
    attn_npy_i32 a;
    CHECK_STATUS(attn_npy_parse_i32(ctx, img, img_size, &a), status);
    CHECK_MESSAGE(ctx, want);
    CHECK(a.data == NULL && a.ndim == 0);
    char path[256];
    temp_path(path, sizeof path, "bad_ints.npy");
    write_file(path, img, img_size);
    CHECK_STATUS(attn_npy_read_i32(ctx, path, &a), status);
    CHECK_MESSAGE(ctx, want);
    CHECK(a.data == NULL);
    remove(path);
    free(img);
}

static void test_ints(attn_ctx *ctx) {
    const int64_t values[] = {0, 5, -7, INT32_MAX, INT32_MIN, 65536, 10};
    const size_t n = sizeof values / sizeof values[0];
    check_int_image(ctx, "<i4", "False", values, n);
    check_int_image(ctx, ">i4", "False", values, n);
    check_int_image(ctx, "<i8", "False", values, n);
    check_int_image(ctx, ">i8", "False", values, n);
    check_int_image(ctx, "<i8", "True", values, n); /* 1-D: Fortran order is C order */
    check_int_image(ctx, "|i4", "False", values, 0);
    /* one-byte masks: bool, uint8 and int8, widened */
    const int64_t bools[] = {1, 0, 0, 1, 1}, bytes_u[] = {0, 255, 7, 128}, bytes_i[] = {-128, 127, -1, 0};
    check_int_image(ctx, "|b1", "False", bools, 5);
    check_int_image(ctx, "|u1", "False", bytes_u, 4);
    check_int_image(ctx, "|i1", "False", bytes_i, 4);

    /* 2-D, and a version 2.0 header */
    unsigned char data[64];
    for (int i = 0; i < 6; i++) store_int(data + 4 * i, 100 * i - 3, 4, false);
    size_t img_size;
    unsigned char *img = build_image(
        2, "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }", true, data, 24,
        &img_size);
    attn_npy_i32 a;
    CHECK_STATUS(attn_npy_parse_i32(ctx, img, img_size, &a), ATTN_OK);
    CHECK(a.ndim == 2 && a.shape[0] == 2 && a.shape[1] == 3 && a.numel == 6);
    for (int i = 0; i < 6 && a.data; i++) CHECK(a.data[i] == 100 * i - 3);
    attn_npy_i32_free(&a);
    free(img);

    /* bad inputs, each naming the value at fault */
    memset(data, 0, sizeof data);
    expect_int_reject(ctx, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", data,
                      8, ATTN_ERR_FORMAT, "dtype '<f4' is not an integer or bool");
    expect_int_reject(ctx, 1, "{'descr': '<u4', 'fortran_order': False, 'shape': (2,), }", data,
                      8, ATTN_ERR_FORMAT, "dtype '<u4' is not an integer or bool");
    expect_int_reject(ctx, 1, "{'descr': '<i2', 'fortran_order': False, 'shape': (2,), }", data,
                      8, ATTN_ERR_FORMAT, "dtype '<i2'");
    expect_int_reject(ctx, 1, "{'descr': 'xi4', 'fortran_order': False, 'shape': (2,), }", data,
                      8, ATTN_ERR_FORMAT, "dtype 'xi4'");
    expect_int_reject(ctx, 1, "{'descr': '<i4', 'fortran_order': True, 'shape': (2, 2), }",
                      data, 16, ATTN_ERR_FORMAT, "fortran_order True");
    int64_t big_values[3] = {0, 5, (int64_t)1 << 40};
    unsigned char big_le[24], big_be[24];
    for (int i = 0; i < 3; i++) {
        store_int(big_le + 8 * i, big_values[i], 8, false);
        store_int(big_be + 8 * i, big_values[i], 8, true);
    }
    expect_int_reject(ctx, 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }",
                      big_le, 24, ATTN_ERR_FORMAT,
                      "element 2 (1099511627776) does not fit int32");
    expect_int_reject(ctx, 1, "{'descr': '>i8', 'fortran_order': False, 'shape': (3,), }",
                      big_be, 24, ATTN_ERR_FORMAT,
                      "element 2 (1099511627776) does not fit int32");
    store_int(big_le, (int64_t)INT32_MIN - 1, 8, false);
    expect_int_reject(ctx, 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }",
                      big_le, 24, ATTN_ERR_FORMAT, "element 0 (-2147483649) does not fit int32");
    expect_int_reject(ctx, 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }",
                      big_le, 23, ATTN_ERR_FORMAT, "truncated data: expected 24 bytes, got 23");
    expect_int_reject(ctx, 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }", data,
                      0, ATTN_ERR_FORMAT, "truncated data: expected 12 bytes, got 0");
    /* a header cut short */
    img = build_image(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", true, data,
                      8, &img_size);
    CHECK_STATUS(attn_npy_parse_i32(ctx, img, 40, &a), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "truncated header: expected 128 bytes, got 40");
    CHECK(a.data == NULL);
    free(img);
    CHECK_STATUS(attn_npy_read_i32(ctx, "/nonexistent/x.npy", &a), ATTN_ERR_IO);
    CHECK_MESSAGE(ctx, "/nonexistent/x.npy: cannot open");
    CHECK_STATUS(attn_npy_read_i32(ctx, NULL, &a), ATTN_ERR_NULL);
    CHECK_STATUS(attn_npy_read_i32(ctx, "x", NULL), ATTN_ERR_NULL);
    CHECK_STATUS(attn_npy_parse_i32(ctx, NULL, 0, &a), ATTN_ERR_NULL);
    attn_npy_i32_free(NULL);
    /* the float reader still refuses integers, and Fortran order in 1-D */
    attn_npy f;
    img = build_image(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", true, data,
                      8, &img_size);
    CHECK_STATUS(attn_npy_parse(ctx, img, img_size, &f), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "dtype '<i4' is not float32 or float64");
    free(img);
    img = build_image(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", true, data,
                      8, &img_size);
    CHECK_STATUS(attn_npy_parse(ctx, img, img_size, &f), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "fortran_order True is not supported");
    free(img);
}

int main(int argc, char **argv) {
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : (uint64_t)time(NULL);
    printf("test_npy seed %llu\n", (unsigned long long)seed);
    rng_state = seed;

    attn_ctx *ctx = NULL;
    CHECK_STATUS(attn_ctx_new(NULL, &ctx), ATTN_OK);
    if (!ctx) return check_summary();
    test_round_trip(ctx);
    test_write_header(ctx);
    test_parse_versions(ctx);
    test_header_errors(ctx);
    test_prefix_errors(ctx);
    test_null_and_io(ctx);
    test_ints(ctx);
    test_fuzz(ctx);
    attn_ctx_free(ctx);
    return check_summary();
}
