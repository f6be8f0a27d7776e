/*
 * test_safetensors.c — safetensors reading and writing: the exact bytes the
 * writer produces, round trips (NaN payloads, -0, infinities, subnormals),
 * F16/BF16/F64 conversion, every rejection of a malformed file with its
 * status and message, module save/load (strict names and shapes, prefixes,
 * nothing changed on failure), the Hugging Face GPT-2 layout, and a
 * mutation fuzz loop over valid images.
 *
 * The random parts are seeded from the clock and print their seed; pass a
 * seed as the first argument to repeat a run.
 */
#include "attn.h"
#include "check.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t rng_state;

static uint64_t next_u64(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static size_t below(size_t n) { return (size_t)(next_u64() % n); }

static void temp_path(char *buf, size_t cap, const char *name) {
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    snprintf(buf, cap, "%s/attn_test_st_%llu_%s", dir, (unsigned long long)rng_state, name);
}

static unsigned char *read_all(const char *path, size_t *size) {
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

static void write_all(const char *path, const void *bytes, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(bytes, 1, size, f);
    fclose(f);
}

/* An image: the 8-byte length of header, the header, then data_len bytes. */
static unsigned char *image(const char *header, const void *data, size_t data_len, size_t *size) {
    size_t n = strlen(header);
    *size = 8 + n + data_len;
    unsigned char *img = malloc(*size);
    for (int k = 0; k < 8; k++) img[k] = (unsigned char)((uint64_t)n >> (8 * k));
    memcpy(img + 8, header, n);
    if (data_len) memcpy(img + 8 + n, data, data_len);
    return img;
}

/* Parses header + data and expects status and a message fragment. */
static void expect_reject(attn_ctx *ctx, const char *header, size_t data_len, attn_status want,
                          const char *fragment) {
    unsigned char zeros[256] = {0};
    size_t size;
    unsigned char *img = image(header, zeros, data_len, &size);
    attn_safetensors *st = (attn_safetensors *)1;
    attn_status got = attn_safetensors_parse(ctx, img, size, &st);
    if (got != want || !strstr(attn_ctx_last_error(ctx), fragment)) {
        check_failed++;
        fprintf(stderr, "header %s: got %s \"%s\", want %s with \"%s\"\n", header,
                attn_status_name(got), attn_ctx_last_error(ctx), attn_status_name(want), fragment);
    } else {
        check_passed++;
    }
    CHECK(st == NULL);
    attn_safetensors_free(got == ATTN_OK ? st : NULL);
    free(img);
}

static bool same_bits(const float *a, const float *b, size_t n) {
    return memcmp(a, b, n * sizeof *a) == 0;
}

static void test_exact_bytes(attn_ctx *ctx) {
    /* What safetensors.numpy.save_file({"b": [[1, 2]], "a": [3]},
     * metadata={"format": "pt"}) writes: tensors sorted by name. */
    const float a[1] = {3.0f}, b[2] = {1.0f, 2.0f};
    attn_named_tensor t[2] = {{.name = "b", .data = b, .ndim = 2, .shape = {1, 2}},
                              {.name = "a", .data = a, .ndim = 1, .shape = {1}}};
    attn_metadata_entry meta = {"format", "pt"};
    char path[256];
    temp_path(path, sizeof path, "exact.safetensors");
    CHECK_STATUS(attn_safetensors_write(ctx, path, t, 2, &meta, 1), ATTN_OK);
    const char *header = "{\"__metadata__\":{\"format\":\"pt\"},"
                         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                         "\"b\":{\"dtype\":\"F32\",\"shape\":[1,2],\"data_offsets\":[4,12]}}";
    size_t hlen = strlen(header), padded = (hlen + 7) / 8 * 8, size = 0;
    unsigned char *bytes = read_all(path, &size);
    CHECK(bytes && size == 8 + padded + 12);
    if (bytes && size == 8 + padded + 12) {
        CHECK(bytes[0] == (unsigned char)padded && bytes[1] == 0 && bytes[7] == 0);
        CHECK(memcmp(bytes + 8, header, hlen) == 0);
        for (size_t i = hlen; i < padded; i++) CHECK(bytes[8 + i] == ' ');
        const unsigned char data[12] = {0, 0, 0x40, 0x40, 0, 0, 0x80, 0x3f, 0, 0, 0, 0x40};
        CHECK(memcmp(bytes + 8 + padded, data, 12) == 0);
    }
    free(bytes);
    remove(path);

    /* Escapes as serde_json writes them; a scalar; no metadata. */
    const float s = 5.0f;
    attn_named_tensor e = {.name = "q\"\\\n\x01/\xc3\xa9", .data = &s, .ndim = 0};
    CHECK_STATUS(attn_safetensors_write(ctx, path, &e, 1, NULL, 0), ATTN_OK);
    bytes = read_all(path, &size);
    const char *want = "{\"q\\\"\\\\\\n\\u0001/\xc3\xa9\":{\"dtype\":\"F32\",\"shape\":[],"
                       "\"data_offsets\":[0,4]}}";
    CHECK(bytes && size > 8 + strlen(want) && memcmp(bytes + 8, want, strlen(want)) == 0);
    free(bytes);
    attn_safetensors *st = NULL;
    CHECK_STATUS(attn_safetensors_open(ctx, path, &st), ATTN_OK);
    attn_safetensors_info info;
    CHECK_STATUS(attn_safetensors_find(st, e.name, &info), ATTN_OK);
    CHECK(info.ndim == 0 && info.numel == 1);
    float got = 0;
    CHECK_STATUS(attn_safetensors_load(st, info.index, &got, 1), ATTN_OK);
    CHECK(got == 5.0f);
    CHECK(attn_safetensors_metadata_count(st) == 0);
    attn_safetensors_free(st);
    remove(path);
}

static void test_round_trip(attn_ctx *ctx) {
    char path[256];
    temp_path(path, sizeof path, "trip.safetensors");
    for (int round = 0; round < 20; round++) {
        size_t count = 1 + below(6);
        attn_named_tensor t[6];
        char names[6][32];
        float *data[6];
        for (size_t i = 0; i < count; i++) {
            snprintf(names[i], sizeof names[i], "layer%zu.w%llu", i,
                     (unsigned long long)below(1000));
            t[i] = (attn_named_tensor){.name = names[i], .ndim = below(4)};
            size_t numel = 1;
            for (size_t d = 0; d < t[i].ndim; d++) numel *= (t[i].shape[d] = below(5));
            data[i] = malloc((numel ? numel : 1) * sizeof(float));
            for (size_t k = 0; k < numel; k++) {
                uint32_t u = (uint32_t)next_u64(); /* any bits: NaNs, infinities, subnormals */
                memcpy(&data[i][k], &u, 4);
            }
            t[i].data = data[i];
        }
        attn_metadata_entry meta[2] = {{"format", "pt"}, {"note", "round \"trip\""}};
        attn_status w = attn_safetensors_write(ctx, path, t, count, meta, 2);
        /* Random names can collide: then the writer must refuse. */
        bool dup = false;
        for (size_t i = 0; i < count; i++)
            for (size_t j = 0; j < i; j++) dup = dup || strcmp(names[i], names[j]) == 0;
        CHECK(w == (dup ? ATTN_ERR_INVALID : ATTN_OK));
        if (w == ATTN_OK) {
            attn_safetensors *st;
            CHECK_STATUS(attn_safetensors_open(ctx, path, &st), ATTN_OK);
            CHECK(attn_safetensors_count(st) == count);
            CHECK(strcmp(attn_safetensors_metadata_get(st, "note"), "round \"trip\"") == 0);
            CHECK(attn_safetensors_metadata_get(st, "missing") == NULL);
            for (size_t i = 0; i < count; i++) {
                attn_safetensors_info info;
                CHECK_STATUS(attn_safetensors_find(st, names[i], &info), ATTN_OK);
                CHECK(info.dtype == ATTN_DTYPE_F32 && info.ndim == t[i].ndim);
                float *back = malloc((info.numel ? info.numel : 1) * sizeof(float));
                CHECK_STATUS(attn_safetensors_load(st, info.index, back, info.numel), ATTN_OK);
                CHECK(same_bits(back, data[i], info.numel));
                free(back);
            }
            attn_safetensors_free(st);
        }
        for (size_t i = 0; i < count; i++) free(data[i]);
    }
    remove(path);
}

static void test_conversions(attn_ctx *ctx) {
    /* F16: 1, 2^-24 (smallest subnormal), 65504, -0, inf, -inf, 0.333...;
     * BF16: 1, -2; F64: 0.1, 2e301 (refused), 1e-50 (to 0). */
    const unsigned char data[] = {0x00, 0x3c, 0x01, 0x00, 0xff, 0x7b, 0x00, 0x80, 0x00, 0x7c,
                                  0x00, 0xfc, 0x55, 0x35, /* F16, 14 bytes */
                                  0x80, 0x3f, 0x00, 0xc0, /* BF16 */
                                  0x9a, 0x99, 0x99, 0x99, 0x99, 0x99, 0xb9, 0x3f, /* 0.1 */
                                  0x9c, 0x75, 0x88, 0x3c, 0xe4, 0x37, 0x7e, 0x7e, /* 2.02e301 */
                                  0x4b, 0x95, 0xc4, 0x74, 0x13, 0x52, 0x98, 0x35 /* 1e-50 */};
    const char *header = "{\"h\":{\"dtype\":\"F16\",\"shape\":[7],\"data_offsets\":[0,14]},"
                         "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[14,18]},"
                         "\"d\":{\"shape\":[3],\"dtype\":\"F64\",\"data_offsets\":[18,42]}}";
    size_t size;
    unsigned char *img = image(header, data, sizeof data, &size);
    attn_safetensors *st;
    CHECK_STATUS(attn_safetensors_parse(ctx, img, size, &st), ATTN_OK);
    free(img); /* the parsed file keeps its own copy */
    attn_safetensors_info info;
    float h[7], b[2], d[3];
    CHECK_STATUS(attn_safetensors_find(st, "h", &info), ATTN_OK);
    CHECK(info.dtype == ATTN_DTYPE_F16 && info.index == 0);
    CHECK_STATUS(attn_safetensors_load(st, info.index, h, 7), ATTN_OK);
    CHECK(h[0] == 1.0f && h[1] == 0x1p-24f && h[2] == 65504.0f);
    CHECK(h[3] == 0.0f && signbit(h[3]) && h[4] == INFINITY && h[5] == -INFINITY);
    CHECK(h[6] == 0x1.554p-2f);
    CHECK_STATUS(attn_safetensors_find(st, "b", &info), ATTN_OK);
    CHECK_STATUS(attn_safetensors_load(st, info.index, b, 2), ATTN_OK);
    CHECK(b[0] == 1.0f && b[1] == -2.0f);
    CHECK_STATUS(attn_safetensors_find(st, "d", &info), ATTN_OK);
    /* 2e301: refused by element, not an infinity (tensor.float()'s), and
     * the destination left as it was */
    d[0] = d[1] = d[2] = 7.0f;
    CHECK_STATUS(attn_safetensors_load(st, info.index, d, 3), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "tensor 'd' (F64) holds 2.0236997994750293e+301 at element 1, past "
                       "float32's range");
    CHECK(d[0] == 7.0f && d[1] == 7.0f && d[2] == 7.0f);
    {   /* the same from a file, the value past float's range in a later
         * chunk of the read than the first: nothing written either */
        enum { N = 5000, AT = 4500 };
        unsigned char *bytes = malloc(N * 8);
        for (size_t i = 0; i < N; i++) {
            double v = i == AT ? 1e300 : (double)i;
            uint64_t u;
            memcpy(&u, &v, 8);
            for (int k = 0; k < 8; k++) bytes[8 * i + k] = (unsigned char)(u >> (8 * k));
        }
        size_t n;
        unsigned char *img2 =
            image("{\"big\":{\"dtype\":\"F64\",\"shape\":[5000],\"data_offsets\":[0,40000]}}",
                  bytes, N * 8, &n);
        char path[512];
        temp_path(path, sizeof path, "f64_past.safetensors");
        write_all(path, img2, n);
        free(img2);
        free(bytes);
        attn_safetensors *st2;
        CHECK_STATUS(attn_safetensors_open(ctx, path, &st2), ATTN_OK);
        float *dst = malloc(N * sizeof *dst);
        for (size_t i = 0; i < N; i++) dst[i] = -3.0f;
        CHECK_STATUS(attn_safetensors_load(st2, 0, dst, N), ATTN_ERR_INVALID);
        CHECK_MESSAGE(ctx, "tensor 'big' (F64) holds 1.0000000000000001e+300 at element 4500");
        size_t changed = 0;
        for (size_t i = 0; i < N; i++) changed += dst[i] != -3.0f;
        CHECK(changed == 0);
        free(dst);
        attn_safetensors_free(st2);
        remove(path);
    }
    {   /* the in-range ones round to nearest: 0.1, and 1e-50 to 0 */
        const unsigned char in_range[] = {0x9a, 0x99, 0x99, 0x99, 0x99, 0x99, 0xb9, 0x3f,
                                          0x4b, 0x95, 0xc4, 0x74, 0x13, 0x52, 0x98, 0x35};
        size_t n;
        unsigned char *img2 =
            image("{\"e\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]}}",
                  in_range, sizeof in_range, &n);
        attn_safetensors *st2;
        CHECK_STATUS(attn_safetensors_parse(ctx, img2, n, &st2), ATTN_OK);
        free(img2);
        float e[2] = {1.0f, 1.0f};
        CHECK_STATUS(attn_safetensors_load(st2, 0, e, 2), ATTN_OK);
        CHECK(e[0] == 0.1f && e[1] == 0.0f);
        attn_safetensors_free(st2);
    }
    CHECK_STATUS(attn_safetensors_load(st, info.index, d, 2), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "tensor 'd' has 3 elements; the destination holds 2");
    CHECK_STATUS(attn_safetensors_find(st, "nope", &info), ATTN_ERR_NOT_FOUND);
    CHECK_MESSAGE(ctx, "<memory> has no tensor named 'nope'");
    CHECK_STATUS(attn_safetensors_info_at(st, 3, &info), ATTN_ERR_NOT_FOUND);
    attn_safetensors_free(st);

    /* Dtypes listed but not loadable. */
    const char *ints = "{\"i\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]}}";
    unsigned char zeros[16] = {0};
    img = image(ints, zeros, 16, &size);
    CHECK_STATUS(attn_safetensors_parse(ctx, img, size, &st), ATTN_OK);
    free(img);
    CHECK_STATUS(attn_safetensors_info_at(st, 0, &info), ATTN_OK);
    CHECK(info.dtype == ATTN_DTYPE_I64 && strcmp(attn_dtype_name(info.dtype), "I64") == 0);
    CHECK_STATUS(attn_safetensors_load(st, 0, d, 2), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "tensor 'i' has dtype I64; only F32, F16, BF16 and F64 load");
    attn_safetensors_free(st);
}

static void test_rejections(attn_ctx *ctx) {
    attn_safetensors *st = (attn_safetensors *)1;
    const unsigned char tiny[5] = {1, 2, 3, 4, 5};
    CHECK_STATUS(attn_safetensors_parse(ctx, tiny, sizeof tiny, &st), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "not a safetensors file: 5 bytes");
    CHECK(st == NULL);
    CHECK_STATUS(attn_safetensors_parse(ctx, NULL, 4, &st), ATTN_ERR_NULL);
    CHECK_STATUS(attn_safetensors_parse(ctx, tiny, 5, NULL), ATTN_ERR_NULL);

    unsigned char big[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    CHECK_STATUS(attn_safetensors_parse(ctx, big, sizeof big, &st), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "header length 18446744073709551615 exceeds the limit");
    unsigned char over[16] = {9, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    CHECK_STATUS(attn_safetensors_parse(ctx, over, 16, &st), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "header length 9 exceeds the 8 bytes after the length field");

    const char *f32 = "\"dtype\":\"F32\"";
    char h[512];
    expect_reject(ctx, "", 0, ATTN_ERR_FORMAT, "header is not a JSON object: it must start with '{' (the header is empty)");
    expect_reject(ctx, "[1, 2]", 0, ATTN_ERR_FORMAT, "header is not a JSON object");
    expect_reject(ctx, "{\"a\"", 0, ATTN_ERR_FORMAT, "it ends where ':' after a key was expected");
    expect_reject(ctx, "{\"a\":{\"dtype\":\"F32\",}}", 0, ATTN_ERR_FORMAT, "expected a quoted key, found '}'");
    expect_reject(ctx, "{} x", 0, ATTN_ERR_FORMAT, "unexpected text after the object at byte 11");
    expect_reject(ctx, "{\"a\":5}", 0, ATTN_ERR_FORMAT, "tensor 'a': its entry at byte 13 is not an object");
    expect_reject(ctx, "{\"a", 0, ATTN_ERR_FORMAT, "the string at byte 9 is not closed");
    expect_reject(ctx, "{\"a\xff\":{}}", 0, ATTN_ERR_FORMAT, "header is not UTF-8: bad byte 0xff at byte 11");
    expect_reject(ctx, "{\"a\xc0\x80\":{}}", 0, ATTN_ERR_FORMAT, "header is not UTF-8");
    expect_reject(ctx, "{\"\\q\":{}}", 0, ATTN_ERR_FORMAT, "bad escape sequence at byte 10");
    expect_reject(ctx, "{\"\\u0000\":{}}", 0, ATTN_ERR_FORMAT, "NUL character");
    expect_reject(ctx, "{\"\\ud800x\":{}}", 0, ATTN_ERR_FORMAT, "unpaired UTF-16 surrogate");
    expect_reject(ctx, "{\"a\nb\":{}}", 0, ATTN_ERR_FORMAT, "control byte 0x0a in a string");
    expect_reject(ctx, "{\"\":{}}", 0, ATTN_ERR_FORMAT, "a tensor has an empty name");

    snprintf(h, sizeof h, "{\"a\":{\"dtype\":\"Q8\",\"shape\":[1],\"data_offsets\":[0,1]}}");
    expect_reject(ctx, h, 1, ATTN_ERR_FORMAT, "tensor 'a': unknown dtype 'Q8'");
    snprintf(h, sizeof h, "{\"a\":{%s,\"shape\":[2],\"data_offsets\":[0,8],\"extra\":1}}", f32);
    expect_reject(ctx, h, 8, ATTN_ERR_FORMAT, "tensor 'a': unknown key 'extra'");
    snprintf(h, sizeof h, "{\"a\":{%s,%s,\"shape\":[2],\"data_offsets\":[0,8]}}", f32, f32);
    expect_reject(ctx, h, 8, ATTN_ERR_FORMAT, "tensor 'a': duplicate key 'dtype'");
    snprintf(h, sizeof h, "{\"a\":{%s,\"data_offsets\":[0,8]}}", f32);
    expect_reject(ctx, h, 8, ATTN_ERR_FORMAT, "tensor 'a' lacks 'shape'");
    snprintf(h, sizeof h, "{\"a\":{%s,\"shape\":[-2],\"data_offsets\":[0,8]}}", f32);
    expect_reject(ctx, h, 8, ATTN_ERR_FORMAT, "tensor 'a': negative value in shape");
    snprintf(h, sizeof h, "{\"a\":{%s,\"shape\":[2.0],\"data_offsets\":[0,8]}}", f32);
    expect_reject(ctx, h, 8, ATTN_ERR_FORMAT, "shape holds a number that is not an integer");
    snprintf(h, sizeof h, "{\"a\":{%s,\"shape\":[02],\"data_offsets\":[0,8]}}", f32);
    expect_reject(ctx, h, 8, ATTN_ERR_FORMAT, "a number with a leading zero");
    snprintf(h, sizeof h, "{\"a\":{%s,\"shape\":[99999999999999999999],\"data_offsets\":[0,8]}}", f32);
    expect_reject(ctx, h, 8, ATTN_ERR_OVERFLOW, "tensor 'a': a value in shape overflows size_t");
    snprintf(h, sizeof h, "{\"a\":{%s,\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", f32);
    expect_reject(ctx, h, 4, ATTN_ERR_FORMAT, "tensor 'a': shape has more than 8 entries");
    snprintf(h, sizeof h, "{\"a\":{%s,\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", f32);
    expect_reject(ctx, h, 8, ATTN_ERR_OVERFLOW, "tensor 'a': shape [4294967296, 4294967296] overflows size_t");
    /* a zero dimension anywhere: the others' product still checked, as .npy's */
    snprintf(h, sizeof h,
             "{\"a\":{%s,\"shape\":[0,4294967296,4294967296],\"data_offsets\":[0,0]}}", f32);
    expect_reject(ctx, h, 0, ATTN_ERR_OVERFLOW, "shape [0, 4294967296, 4294967296] overflows");
    snprintf(h, sizeof h,
             "{\"a\":{%s,\"shape\":[4294967296,4294967296,0],\"data_offsets\":[0,0]}}", f32);
    expect_reject(ctx, h, 0, ATTN_ERR_OVERFLOW, "shape [4294967296, 4294967296, 0] overflows");
    snprintf(h, sizeof h, "{\"a\":{%s,\"shape\":[2],\"data_offsets\":[0]}}", f32);
    expect_reject(ctx, h, 8, ATTN_ERR_FORMAT, "data_offsets has 1 entries, expected 2");
    snprintf(h, sizeof h, "{\"a\":{%s,\"shape\":[2],\"data_offsets\":[8,0]}}", f32);
    expect_reject(ctx, h, 8, ATTN_ERR_FORMAT, "tensor 'a': data_offsets [8, 0] end before they begin");
    snprintf(h, sizeof h, "{\"a\":{%s,\"shape\":[2,3],\"data_offsets\":[0,20]}}", f32);
    expect_reject(ctx, h, 20, ATTN_ERR_FORMAT, "data_offsets [0, 20] hold 20 bytes, but F32 shape [2, 3] needs 24");
    snprintf(h, sizeof h, "{\"a\":{%s,\"shape\":[2],\"data_offsets\":[0,8]}}", f32);
    expect_reject(ctx, h, 4, ATTN_ERR_FORMAT, "reach past the end of the data section (4 bytes)");
    expect_reject(ctx, h, 12, ATTN_ERR_FORMAT, "the data section has 12 bytes, but the tensors cover 8");
    snprintf(h, sizeof h,
             "{\"a\":{%s,\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{%s,\"shape\":[2],"
             "\"data_offsets\":[4,12]}}", f32, f32);
    expect_reject(ctx, h, 12, ATTN_ERR_FORMAT, "tensor 'b' data_offsets [4, 12] overlap tensor 'a' [0, 8]");
    snprintf(h, sizeof h,
             "{\"a\":{%s,\"shape\":[1],\"data_offsets\":[0,4]},\"b\":{%s,\"shape\":[1],"
             "\"data_offsets\":[8,12]}}", f32, f32);
    expect_reject(ctx, h, 12, ATTN_ERR_FORMAT, "gap in the data section: bytes [4, 8) belong to no tensor");
    snprintf(h, sizeof h,
             "{\"a\":{%s,\"shape\":[1],\"data_offsets\":[0,4]},\"a\":{%s,\"shape\":[1],"
             "\"data_offsets\":[4,8]}}", f32, f32);
    expect_reject(ctx, h, 8, ATTN_ERR_FORMAT, "duplicate tensor name 'a'");
    expect_reject(ctx, "{\"__metadata__\":{\"k\":1}}", 0, ATTN_ERR_FORMAT, "__metadata__ value of 'k' is not a string");
    expect_reject(ctx, "{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, ATTN_ERR_FORMAT, "duplicate key 'k' in __metadata__");
    expect_reject(ctx, "{\"__metadata__\":{},\"__metadata__\":{}}", 0, ATTN_ERR_FORMAT, "duplicate key '__metadata__'");
    expect_reject(ctx, "{\"__metadata__\":[]}", 0, ATTN_ERR_FORMAT, "expected '{' starting __metadata__");
    /* Names in messages are made printable. */
    snprintf(h, sizeof h, "{\"a\\u001b[31m\":{\"dtype\":\"X\",\"shape\":[],\"data_offsets\":[0,0]}}");
    expect_reject(ctx, h, 0, ATTN_ERR_FORMAT, "tensor 'a\\x1b[31m': unknown dtype 'X'");

    /* Accepted edge cases: empty header object, whitespace, zero-size
     * tensors sharing an offset, a leading space. */
    unsigned char nothing[1];
    size_t size;
    unsigned char *img = image("{}      ", nothing, 0, &size);
    CHECK_STATUS(attn_safetensors_parse(ctx, img, size, &st), ATTN_OK);
    CHECK(attn_safetensors_count(st) == 0);
    attn_safetensors_free(st);
    free(img);
    snprintf(h, sizeof h,
             " { \"e\" : { %s , \"shape\" : [ 0 , 3 ] , \"data_offsets\" : [ 0 , 0 ] } ,\n"
             "\"z\":{%s,\"shape\":[0],\"data_offsets\":[0,0]}}\t", f32, f32);
    img = image(h, nothing, 0, &size);
    CHECK_STATUS(attn_safetensors_parse(ctx, img, size, &st), ATTN_OK);
    CHECK(attn_safetensors_count(st) == 2);
    attn_safetensors_free(st);
    free(img);

    /* Many names in a large header: each costs its own length, not the rest
     * of the header (20,000 names in 1.3 MB). */
    size_t many = 20000, cap = many * 80 + 16, len = 0;
    char *many_header = malloc(cap);
    len += (size_t)snprintf(many_header + len, cap - len, "{");
    for (size_t i = 0; i < many; i++)
        len += (size_t)snprintf(many_header + len, cap - len,
                                "%s\"tensor.%06zu\":{%s,\"shape\":[0],\"data_offsets\":[0,0]}",
                                i ? "," : "", i, f32);
    snprintf(many_header + len, cap - len, "}");
    img = image(many_header, nothing, 0, &size);
    CHECK_STATUS(attn_safetensors_parse(ctx, img, size, &st), ATTN_OK);
    CHECK(attn_safetensors_count(st) == many);
    attn_safetensors_info last;
    CHECK_STATUS(attn_safetensors_find(st, "tensor.019999", &last), ATTN_OK);
    attn_safetensors_free(st);
    free(img);
    free(many_header);

    /* Files: missing, directory-free errors, truncated after opening. */
    CHECK_STATUS(attn_safetensors_open(ctx, "/nonexistent/x.safetensors", &st), ATTN_ERR_IO);
    CHECK_MESSAGE(ctx, "/nonexistent/x.safetensors: cannot open");
    char path[256];
    temp_path(path, sizeof path, "short.safetensors");
    write_all(path, tiny, 3);
    CHECK_STATUS(attn_safetensors_open(ctx, path, &st), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "not a safetensors file: 3 bytes");
    remove(path);

    /* Writer errors. */
    const float one = 1.0f;
    attn_named_tensor bad[2] = {{.name = "x", .data = &one, .ndim = 1, .shape = {1}},
                                {.name = "x", .data = &one, .ndim = 1, .shape = {1}}};
    temp_path(path, sizeof path, "bad.safetensors");
    CHECK_STATUS(attn_safetensors_write(ctx, path, bad, 2, NULL, 0), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "duplicate tensor name 'x'");
    bad[1].name = "__metadata__";
    CHECK_STATUS(attn_safetensors_write(ctx, path, bad, 2, NULL, 0), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "'__metadata__' is not a usable name");
    bad[1].name = "\xff";
    CHECK_STATUS(attn_safetensors_write(ctx, path, bad, 2, NULL, 0), ATTN_ERR_INVALID);
    bad[1].name = "y";
    bad[1].ndim = 9;
    CHECK_STATUS(attn_safetensors_write(ctx, path, bad, 2, NULL, 0), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "tensor 'y': ndim 9 exceeds ATTN_SAFETENSORS_MAX_DIMS (8)");
    bad[1].ndim = 1;
    bad[1].data = NULL;
    CHECK_STATUS(attn_safetensors_write(ctx, path, bad, 2, NULL, 0), ATTN_ERR_NULL);
    CHECK_STATUS(attn_safetensors_write(ctx, NULL, bad, 1, NULL, 0), ATTN_ERR_NULL);
    attn_metadata_entry meta[2] = {{"k", "v"}, {"k", "w"}};
    CHECK_STATUS(attn_safetensors_write(ctx, path, bad, 1, meta, 2), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "duplicate metadata key 'k'");
    CHECK_STATUS(attn_safetensors_write(ctx, "/nonexistent/dir/x.safetensors", bad, 1, NULL, 0),
                 ATTN_ERR_IO);
    CHECK_MESSAGE(ctx, "cannot open for writing");
    remove(path);
}

static void test_modules(attn_ctx *ctx) {
    attn_rng *rng;
    attn_rng_new(ctx, 123, &rng);
    attn_mha_config cfg = {.d_in = 6, .d_out = 4, .context_length = 5, .num_heads = 2,
                           .qkv_bias = true};
    attn_mha *a, *b;
    CHECK_STATUS(attn_mha_new(ctx, &cfg, rng, &a), ATTN_OK);
    CHECK_STATUS(attn_mha_new(ctx, &cfg, rng, &b), ATTN_OK); /* different weights */
    attn_module *ma = attn_mha_module(a), *mb = attn_mha_module(b);
    char path[256];
    temp_path(path, sizeof path, "mha.safetensors");
    CHECK_STATUS(attn_safetensors_save_module(ctx, ma, path), ATTN_OK);
    attn_safetensors *st;
    CHECK_STATUS(attn_safetensors_open(ctx, path, &st), ATTN_OK);
    CHECK(attn_safetensors_count(st) == attn_module_param_count(ma) + 1); /* + "mask" */
    attn_safetensors_info mask;
    CHECK_STATUS(attn_safetensors_find(st, "mask", &mask), ATTN_OK);
    CHECK(mask.ndim == 2 && mask.shape[0] == 5 && mask.shape[1] == 5);
    CHECK(strcmp(attn_safetensors_metadata_get(st, "format"), "pt") == 0);
    attn_safetensors_free(st);
    /* a load after a forward drops it: its activations are the old weights' */
    enum { T = 5 };
    float x[T * 6], y[T * 4], dx[T * 6];
    for (size_t i = 0; i < T * 6; i++) x[i] = 0.01f * (float)i;
    CHECK_STATUS(attn_module_set_training(mb, false), ATTN_OK);
    CHECK_STATUS(attn_module_forward(mb, x, 1, T, y, NULL), ATTN_OK);
    CHECK_STATUS(attn_safetensors_load_module(ctx, mb, path, NULL), ATTN_OK);
    CHECK_STATUS(attn_module_backward(mb, y, 1, T, dx), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "no forward to differentiate");
    for (size_t i = 0; i < attn_module_param_count(ma); i++) {
        attn_param pa, pb;
        attn_module_param_at(ma, i, &pa);
        attn_module_param_at(mb, i, &pb);
        CHECK(same_bits(pa.data, pb.data, pa.numel));
    }

    /* Wrong shape (qkv_bias missing in the other module): nothing changes. */
    attn_mha_config no_bias = cfg;
    no_bias.qkv_bias = false;
    attn_mha *c;
    CHECK_STATUS(attn_mha_new(ctx, &no_bias, rng, &c), ATTN_OK);
    attn_param before;
    attn_module_param(attn_mha_module(c), "W_query.weight", &before);
    float saved = before.data[0];
    CHECK_STATUS(attn_safetensors_load_module(ctx, attn_mha_module(c), path, NULL),
                 ATTN_ERR_NOT_FOUND);
    CHECK_MESSAGE(ctx, "3 tensors are not in MultiHeadAttention: W_key.bias, W_query.bias, W_value.bias");
    CHECK(before.data[0] == saved);
    attn_mha_config wider = cfg;
    wider.d_in = 7;
    attn_mha *d;
    CHECK_STATUS(attn_mha_new(ctx, &wider, rng, &d), ATTN_OK);
    CHECK_STATUS(attn_safetensors_load_module(ctx, attn_mha_module(d), path, NULL), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "has shape [4, 6]; MultiHeadAttention's W_query.weight is [4, 7]");

    /* A mask buffer that is not the mask. */
    float wrong_mask[25] = {0};
    attn_param q;
    attn_module_param(ma, "W_query.weight", &q);
    attn_named_tensor masked[2] = {{.name = "mask", .data = wrong_mask, .ndim = 2, .shape = {5, 5}},
                                   {.name = "W_query.weight", .data = q.data, .ndim = 2, .shape = {4, 6}}};
    CHECK_STATUS(attn_safetensors_write(ctx, path, masked, 2, NULL, 0), ATTN_OK);
    CHECK_STATUS(attn_safetensors_load_module(ctx, mb, path, NULL), ATTN_ERR_NOT_FOUND);
    CHECK_MESSAGE(ctx, "7 parameters of MultiHeadAttention are missing: W_query.bias, W_key.weight");
    CHECK_STATUS(attn_safetensors_save_module(ctx, ma, path), ATTN_OK);
    attn_safetensors *full;
    CHECK_STATUS(attn_safetensors_open(ctx, path, &full), ATTN_OK);
    size_t n_full = attn_safetensors_count(full);
    attn_named_tensor *copy = calloc(n_full, sizeof *copy);
    float *bufs[16] = {0};
    for (size_t i = 0; i < n_full && i < 16; i++) {
        attn_safetensors_info info;
        attn_safetensors_info_at(full, i, &info);
        bufs[i] = calloc(info.numel, sizeof(float));
        attn_safetensors_load(full, i, bufs[i], info.numel);
        if (strcmp(info.name, "mask") == 0) bufs[i][3] = 0.5f;
        copy[i] = (attn_named_tensor){.name = info.name, .data = bufs[i], .ndim = info.ndim,
                                      .shape = {info.shape[0], info.shape[1]}};
    }
    char path2[256];
    temp_path(path2, sizeof path2, "mask.safetensors");
    CHECK_STATUS(attn_safetensors_write(ctx, path2, copy, n_full, NULL, 0), ATTN_OK);
    CHECK_STATUS(attn_safetensors_load_module(ctx, mb, path2, NULL), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "tensor 'mask' is not the causal mask triu(ones(5, 5), diagonal=1): element (0, 3) is 0.5");
    for (size_t i = 0; i < n_full && i < 16; i++) free(bufs[i]);
    free(copy);
    attn_safetensors_free(full);
    remove(path2);

    /* Missing parameters, and a prefix. */
    attn_param p;
    attn_module_param(ma, "out_proj.weight", &p);
    attn_named_tensor only = {.name = "enc.out_proj.weight", .data = p.data, .ndim = 2,
                              .shape = {p.shape[0], p.shape[1]}};
    CHECK_STATUS(attn_safetensors_write(ctx, path, &only, 1, NULL, 0), ATTN_OK);
    CHECK_STATUS(attn_safetensors_load_module(ctx, mb, path, "enc."), ATTN_ERR_NOT_FOUND);
    CHECK_MESSAGE(ctx, "7 parameters of MultiHeadAttention are missing: enc.W_query.weight");
    CHECK_STATUS(attn_safetensors_load_module(ctx, mb, path, NULL), ATTN_ERR_NOT_FOUND);
    CHECK_MESSAGE(ctx, "1 tensor is not in MultiHeadAttention: enc.out_proj.weight");

    attn_param params[8];
    for (size_t i = 0; i < attn_module_param_count(ma); i++) attn_module_param_at(ma, i, &params[i]);
    CHECK_STATUS(attn_safetensors_write_params(ctx, path, params, attn_module_param_count(ma),
                                               "blocks.0.att."),
                 ATTN_OK);
    CHECK_STATUS(attn_safetensors_load_module(ctx, mb, path, "blocks.0.att."), ATTN_OK);
    CHECK_STATUS(attn_safetensors_load_module(ctx, mb, path, "blocks.1."), ATTN_ERR_NOT_FOUND);

    /* A module with no parameters round-trips through an empty file. */
    attn_simple *s;
    CHECK_STATUS(attn_simple_new(ctx, &(attn_simple_config){.d_in = 3}, &s), ATTN_OK);
    CHECK_STATUS(attn_safetensors_save_module(ctx, attn_simple_module(s), path), ATTN_OK);
    CHECK_STATUS(attn_safetensors_load_module(ctx, attn_simple_module(s), path, NULL), ATTN_OK);
    CHECK_STATUS(attn_safetensors_load_module(ctx, NULL, path, NULL), ATTN_ERR_NULL);
    attn_simple_free(s);

    /* a context too long for its (T, T) mask buffer to exist: a file
     * without the buffer loads (it was refused as out of memory), a save
     * is refused as an overflow naming the length */
    attn_mha_config huge = cfg;
    huge.context_length = ((size_t)1 << 33) + (size_t)rand() % 1000;
    attn_mha *e;
    CHECK_STATUS(attn_mha_new(ctx, &huge, rng, &e), ATTN_OK);
    CHECK_STATUS(attn_safetensors_write_params(ctx, path, params, attn_module_param_count(ma),
                                               NULL),
                 ATTN_OK);
    CHECK_STATUS(attn_safetensors_load_module(ctx, attn_mha_module(e), path, NULL), ATTN_OK);
    CHECK_STATUS(attn_safetensors_save_module(ctx, attn_mha_module(e), path), ATTN_ERR_OVERFLOW);
    char text[96];
    snprintf(text, sizeof text, "mask buffer of context_length %zu is past size_t",
             huge.context_length);
    CHECK_MESSAGE(ctx, text);
    attn_mha_free(e);

    attn_mha_free(a);
    attn_mha_free(b);
    attn_mha_free(c);
    attn_mha_free(d);
    attn_rng_free(rng);
    remove(path);
}

static void test_gpt2_hf(attn_ctx *ctx) {
    attn_rng *rng;
    attn_rng_new(ctx, 7, &rng);
    attn_gpt2_config cfg = {.n_embd = 8, .n_head = 2, .block_size = 4};
    attn_gpt2 *a, *b;
    CHECK_STATUS(attn_gpt2_new(ctx, &cfg, rng, &a), ATTN_OK);
    CHECK_STATUS(attn_gpt2_new(ctx, &cfg, rng, &b), ATTN_OK);
    char path[256];
    temp_path(path, sizeof path, "gpt2.safetensors");
    CHECK_STATUS(attn_gpt2_save_hf(ctx, attn_gpt2_module(a), path, 3), ATTN_OK);

    /* Conv1D layout: c_attn.weight (C, 3C) is the transpose. */
    attn_safetensors *st;
    CHECK_STATUS(attn_safetensors_open(ctx, path, &st), ATTN_OK);
    attn_safetensors_info info;
    CHECK_STATUS(attn_safetensors_find(st, "h.3.attn.c_attn.weight", &info), ATTN_OK);
    CHECK(info.ndim == 2 && info.shape[0] == 8 && info.shape[1] == 24);
    float conv[8 * 24];
    CHECK_STATUS(attn_safetensors_load(st, info.index, conv, 8 * 24), ATTN_OK);
    attn_param w;
    attn_module_param(attn_gpt2_module(a), "c_attn.weight", &w);
    bool transposed = true;
    for (size_t o = 0; o < 24; o++)
        for (size_t i = 0; i < 8; i++) transposed = transposed && conv[i * 24 + o] == w.data[o * 8 + i];
    CHECK(transposed);
    attn_safetensors_free(st);

    /* a load after a forward drops it: its activations are the old weights' */
    float x[3 * 8], y[3 * 8], dx[3 * 8];
    for (size_t i = 0; i < 3 * 8; i++) x[i] = 0.01f * (float)i;
    CHECK_STATUS(attn_gpt2_forward(b, x, 1, 3, y, NULL), ATTN_OK);
    CHECK_STATUS(attn_gpt2_load_hf(ctx, attn_gpt2_module(b), path, 3), ATTN_OK);
    CHECK_STATUS(attn_gpt2_backward(b, y, 1, 3, dx), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "no forward to differentiate");
    for (size_t i = 0; i < 4; i++) {
        attn_param pa, pb;
        attn_module_param_at(attn_gpt2_module(a), i, &pa);
        attn_module_param_at(attn_gpt2_module(b), i, &pb);
        CHECK(same_bits(pa.data, pb.data, pa.numel));
    }
    CHECK_STATUS(attn_gpt2_load_hf(ctx, attn_gpt2_module(b), path, 0), ATTN_ERR_NOT_FOUND);
    CHECK_MESSAGE(ctx, "no layer 0: neither h.0.attn.c_attn.weight nor transformer.h.0.attn.c_attn.weight");
    CHECK_MESSAGE(ctx, "it has layers 0 to 3");
    attn_gpt2_config wide = {.n_embd = 12, .n_head = 2, .block_size = 4};
    attn_gpt2 *c;
    CHECK_STATUS(attn_gpt2_new(ctx, &wide, rng, &c), ATTN_OK);
    CHECK_STATUS(attn_gpt2_load_hf(ctx, attn_gpt2_module(c), path, 3), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "h.3.attn.c_attn.weight has shape [8, 24]; a CausalSelfAttention with n_embd 12 needs [12, 36]");

    /* The transformer. prefix of GPT2LMHeadModel checkpoints. */
    attn_param params[4];
    for (size_t i = 0; i < 4; i++) attn_module_param_at(attn_gpt2_module(a), i, &params[i]);
    float t_attn[8 * 24], t_proj[8 * 8];
    for (size_t o = 0; o < 24; o++)
        for (size_t i = 0; i < 8; i++) t_attn[i * 24 + o] = params[0].data[o * 8 + i];
    for (size_t o = 0; o < 8; o++)
        for (size_t i = 0; i < 8; i++) t_proj[i * 8 + o] = params[2].data[o * 8 + i];
    attn_named_tensor lm[5] = {
        {.name = "transformer.h.0.attn.c_attn.weight", .data = t_attn, .ndim = 2, .shape = {8, 24}},
        {.name = "transformer.h.0.attn.c_attn.bias", .data = params[1].data, .ndim = 1, .shape = {24}},
        {.name = "transformer.h.0.attn.c_proj.weight", .data = t_proj, .ndim = 2, .shape = {8, 8}},
        {.name = "transformer.h.0.attn.c_proj.bias", .data = params[3].data, .ndim = 1, .shape = {8}},
        {.name = "transformer.wte.weight", .data = t_proj, .ndim = 2, .shape = {8, 8}},
    };
    CHECK_STATUS(attn_safetensors_write(ctx, path, lm, 5, NULL, 0), ATTN_OK);
    CHECK_STATUS(attn_gpt2_load_hf(ctx, attn_gpt2_module(c), path, 0), ATTN_ERR_SHAPE);
    attn_gpt2 *d;
    CHECK_STATUS(attn_gpt2_new(ctx, &cfg, rng, &d), ATTN_OK);
    CHECK_STATUS(attn_gpt2_load_hf(ctx, attn_gpt2_module(d), path, 0), ATTN_OK);
    for (size_t i = 0; i < 4; i++) {
        attn_param pd;
        attn_module_param_at(attn_gpt2_module(d), i, &pd);
        CHECK(same_bits(pd.data, params[i].data, pd.numel));
    }
    CHECK_STATUS(attn_safetensors_write(ctx, path, lm, 3, NULL, 0), ATTN_OK);
    CHECK_STATUS(attn_gpt2_load_hf(ctx, attn_gpt2_module(d), path, 0), ATTN_ERR_NOT_FOUND);
    CHECK_MESSAGE(ctx, "transformer.h.0.attn.c_proj.bias is not in the file");

    CHECK_STATUS(attn_gpt2_load_hf(ctx, NULL, path, 0), ATTN_ERR_NULL);
    attn_simple *s;
    attn_simple_new(ctx, &(attn_simple_config){.d_in = 8}, &s);
    CHECK_STATUS(attn_gpt2_save_hf(ctx, attn_simple_module(s), path, 0), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "the module is a SimplifiedSelfAttention; GPT-2 checkpoints load into CausalSelfAttention");
    attn_simple_free(s);
    attn_gpt2_free(a);
    attn_gpt2_free(b);
    attn_gpt2_free(c);
    attn_gpt2_free(d);
    attn_rng_free(rng);
    remove(path);
}

/* Random byte flips, insertions, truncations and length-field edits of
 * valid images: the parser must answer (OK, or an error with a message),
 * never crash; ASan and UBSan watch in the sanitized build. */
static void test_fuzz(attn_ctx *ctx) {
    const char *seeds[] = {
        "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
        "\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F16\",\"shape\":[1,2],\"data_offsets\":[8,12]}}",
        "{\"x\\u00e9\\n\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]},\"y\":{\"dtype\":"
        "\"BF16\",\"shape\":[2],\"data_offsets\":[8,12]}}",
    };
    const char alphabet[] = "{}[]\",:0123456789-.eE\\u \xff\x00";
    size_t ok = 0, rejected = 0;
    for (int iter = 0; iter < 4000; iter++) {
        const char *seed = seeds[below(2)];
        unsigned char data[12];
        for (int k = 0; k < 12; k++) data[k] = (unsigned char)next_u64();
        size_t size;
        unsigned char *img = image(seed, data, 12, &size);
        size_t edits = 1 + below(4);
        for (size_t e = 0; e < edits; e++) {
            size_t at = below(size);
            switch (below(4)) {
            case 0: img[at] = (unsigned char)alphabet[below(sizeof alphabet)]; break;
            case 1: img[at] ^= (unsigned char)(1u << below(8)); break;
            case 2: size = at ? at : size; break;                 /* truncate */
            default: img[below(8)] = (unsigned char)next_u64(); /* length field */
            }
        }
        attn_safetensors *st = NULL;
        attn_status s = attn_safetensors_parse(ctx, img, size, &st);
        if (s == ATTN_OK) {
            ok++;
            for (size_t i = 0; i < attn_safetensors_count(st); i++) {
                attn_safetensors_info info;
                attn_safetensors_info_at(st, i, &info);
                float buf[8];
                if (info.numel <= 8) attn_safetensors_load(st, i, buf, info.numel);
            }
            attn_safetensors_free(st);
        } else {
            rejected++;
            if (!attn_ctx_last_error(ctx)[0]) {
                check_failed++;
                fprintf(stderr, "fuzz: %s without a message\n", attn_status_name(s));
            }
            CHECK(st == NULL);
        }
        free(img);
    }
    printf("fuzz: %zu accepted, %zu rejected\n", ok, rejected);
    CHECK(rejected > 0);
}

int main(int argc, char **argv) {
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : (uint64_t)time(NULL);
    printf("test_safetensors seed %llu\n", (unsigned long long)seed);
    rng_state = seed;
    attn_ctx *ctx;
    attn_ctx_new(NULL, &ctx);
    test_exact_bytes(ctx);
    test_round_trip(ctx);
    test_conversions(ctx);
    test_rejections(ctx);
    test_modules(ctx);
    test_gpt2_hf(ctx);
    test_fuzz(ctx);
    attn_ctx_free(ctx);
    return check_summary();
}
