/*
 * test_json.c — the JSON reader (src/io/json.c): a Hugging Face
 * config.json with a nested rope_scaling object, every value type, escapes
 * and surrogate pairs, numbers in every JSON form, duplicate keys (the last
 * wins), and malformed texts, each failing with ATTN_ERR_FORMAT and a
 * message naming the byte; a file read; the allocation failure path of a
 * long text. Deterministic (no random inputs: the cases are the grammar's).
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, mkstemp, fdopen, unlink */

#include "attn.h"
#include "check.h"
#include "internal.h"
#include "io/json.h"
#include "utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static attn_json *parse(attn_ctx *ctx, const char *text) {
    attn_json *root = NULL;
    attn_status st = attn_json_parse(ctx, text, strlen(text), "test.json", &root);
    if (st != ATTN_OK) fprintf(stderr, "parse failed: %s\n", attn_ctx_last_error(ctx));
    return root;
}

static void check_config(attn_ctx *ctx) {
    const char *text =
        "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"hidden_size\": 2048,\n"
        "  \"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0,\n"
        "  \"rope_scaling\": {\"factor\": 32.0, \"high_freq_factor\": 4.0,\n"
        "    \"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192,\n"
        "    \"rope_type\": \"llama3\"},\n  \"tie_word_embeddings\": true, \"x\": null,\n"
        "  \"neg\": -0.5E+2, \"big\": 1.5e300, \"zero\": 0, \"frac\": 2.5 }";
    attn_json *root = parse(ctx, text);
    CHECK(root != NULL);
    if (!root) return;
    size_t n = 0;
    double d = 0;
    bool b = false;
    CHECK(root->type == ATTN_JSON_OBJECT && root->count == 11);
    CHECK(attn_json_as_size(attn_json_get(root, "hidden_size"), &n) && n == 2048);
    CHECK(attn_json_as_double(attn_json_get(root, "rms_norm_eps"), &d) && d == 1e-5);
    CHECK(attn_json_as_double(attn_json_get(root, "rope_theta"), &d) && d == 500000.0);
    const attn_json *rs = attn_json_get(root, "rope_scaling");
    CHECK(rs && rs->type == ATTN_JSON_OBJECT && rs->count == 5);
    CHECK(strcmp(attn_json_as_string(attn_json_get(rs, "rope_type")), "llama3") == 0);
    CHECK(attn_json_as_size(attn_json_get(rs, "original_max_position_embeddings"), &n) &&
          n == 8192);
    CHECK(attn_json_as_bool(attn_json_get(root, "tie_word_embeddings"), &b) && b);
    CHECK(attn_json_get(root, "x") && attn_json_get(root, "x")->type == ATTN_JSON_NULL);
    CHECK(attn_json_as_double(attn_json_get(root, "neg"), &d) && d == -50.0);
    CHECK(attn_json_as_double(attn_json_get(root, "big"), &d) && d == 1.5e300);
    CHECK(!attn_json_as_size(attn_json_get(root, "neg"), &n));   /* negative */
    CHECK(!attn_json_as_size(attn_json_get(root, "frac"), &n));  /* not integral */
    CHECK(!attn_json_as_size(attn_json_get(root, "big"), &n));   /* too large */
    CHECK(attn_json_as_size(attn_json_get(root, "zero"), &n) && n == 0);
    CHECK(!attn_json_as_bool(attn_json_get(root, "hidden_size"), &b));
    CHECK(attn_json_as_string(attn_json_get(root, "hidden_size")) == NULL);
    CHECK(attn_json_get(root, "missing") == NULL);
    CHECK(attn_json_get(rs, NULL) == NULL && attn_json_get(NULL, "a") == NULL);
    const attn_json *arch = attn_json_get(root, "architectures");
    CHECK(arch && arch->type == ATTN_JSON_ARRAY && arch->count == 1 &&
          strcmp(arch->items[0].string, "LlamaForCausalLM") == 0);
    attn_json_free(root);
}

static void check_strings(attn_ctx *ctx) {
    attn_json *root = parse(ctx, "[\"a\\\"b\\\\c\\/\\b\\f\\n\\r\\t\", \"\\u00e9\\u20ac\", "
                                 "\"\\ud83d\\ude00\", \"raw \xc3\xa9\", {\"k\": 1, \"k\": 2}, [], {}]");
    CHECK(root && root->type == ATTN_JSON_ARRAY && root->count == 7);
    if (!root) return;
    CHECK(strcmp(root->items[0].string, "a\"b\\c/\b\f\n\r\t") == 0);
    CHECK(strcmp(root->items[1].string, "\xc3\xa9\xe2\x82\xac") == 0);
    CHECK(strcmp(root->items[2].string, "\xf0\x9f\x98\x80") == 0);
    CHECK(strcmp(root->items[3].string, "raw \xc3\xa9") == 0);
    size_t n = 0;
    CHECK(attn_json_as_size(attn_json_get(&root->items[4], "k"), &n) && n == 2);
    CHECK(root->items[5].type == ATTN_JSON_ARRAY && root->items[5].count == 0);
    CHECK(root->items[6].type == ATTN_JSON_OBJECT && root->items[6].count == 0);
    attn_json_free(root);
}

static void check_bad(attn_ctx *ctx) {
    const char *bad[] = {"", "{", "{\"a\" 1}", "{\"a\": }", "[1, 2", "[1,]", "{\"a\": 1,}",
                         "01", "1.", "-", "1e", ".5", "tru", "nul", "\"abc", "\"\\x\"",
                         "\"\\u12\"", "\"\\ud83d\"", "\"\\u0000\"", "\"a\nb\"", "{} x",
                         "[1] [2]", "{1: 2}", "+1", "NaN", "Infinity"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        attn_json *root = (attn_json *)1;
        attn_status st = attn_json_parse(ctx, bad[i], strlen(bad[i]), "bad.json", &root);
        if (st != ATTN_ERR_FORMAT) fprintf(stderr, "accepted: %s\n", bad[i]);
        CHECK(st == ATTN_ERR_FORMAT && root == NULL);
        CHECK_MESSAGE(ctx, "bad.json");
    }
    /* nesting past the limit is an error, not a stack overflow */
    char deep[2 * ATTN_JSON_MAX_DEPTH + 8];
    size_t n = 0;
    for (int i = 0; i < ATTN_JSON_MAX_DEPTH + 2; i++) deep[n++] = '[';
    for (int i = 0; i < ATTN_JSON_MAX_DEPTH + 2; i++) deep[n++] = ']';
    attn_json *root = NULL;
    CHECK_STATUS(attn_json_parse(ctx, deep, n, "deep.json", &root), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "nested deeper");
    CHECK_STATUS(attn_json_parse(ctx, "[1] x", 5, "bad.json", &root), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "byte 4");
    CHECK_STATUS(attn_json_parse(ctx, NULL, 0, "x", &root), ATTN_ERR_NULL);
    CHECK_STATUS(attn_json_parse(ctx, "1", 1, "x", NULL), ATTN_ERR_NULL);
}

static void check_file(attn_ctx *ctx) {
    char path[] = "/tmp/attn_test_json_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    FILE *f = fdopen(fd, "w");
    /* longer than the reader's first chunk */
    fputs("{\"list\": [", f);
    for (int i = 0; i < 3000; i++) fprintf(f, "%s%d", i ? ", " : "", i);
    fputs("], \"n_embd\": 768}", f);
    fclose(f);
    attn_json *root = NULL;
    CHECK_STATUS(attn_json_read_file(ctx, path, &root), ATTN_OK);
    size_t n = 0;
    CHECK(root && attn_json_as_size(attn_json_get(root, "n_embd"), &n) && n == 768);
    const attn_json *list = attn_json_get(root, "list");
    CHECK(list && list->count == 3000 && list->items[2999].number == 2999.0);
    attn_json_free(root);
    unlink(path);
    CHECK_STATUS(attn_json_read_file(ctx, path, &root), ATTN_ERR_IO);
    CHECK_MESSAGE(ctx, path);
}

/* The token reader under the tree: positions (file offsets or line:column),
 * the UTF-8 and NUL options, and integers against their range. */
static void check_reader(attn_ctx *ctx) {
    attn_json_reader r;
    const char *text = "{\"a\\u0000b\": 7,\n \"\xc3\xa9\": 8}";
    attn_json_reader_init(&r, ctx, text, strlen(text), "v.json");
    r.lines = true;
    r.check_utf8 = true;
    r.allow_nul = true;
    char *s = NULL;
    size_t len = 0;
    uint64_t v = 0;
    CHECK_STATUS(attn_json_expect(&r, '{', "'{'"), ATTN_OK);
    CHECK_STATUS(attn_json_read_string(&r, "a key", &s, &len), ATTN_OK);
    CHECK(s && len == 3 && memcmp(s, "a\0b", 3) == 0);
    attn_free(s);
    CHECK_STATUS(attn_json_expect(&r, ':', "':'"), ATTN_OK);
    CHECK_STATUS(attn_json_read_uint(&r, 100, NULL, "an id", &v), ATTN_OK);
    CHECK(v == 7);
    CHECK(attn_json_accept(&r, ','));
    CHECK_STATUS(attn_json_read_string(&r, "a key", &s, &len), ATTN_OK);
    CHECK(s && len == 2 && strcmp(s, "\xc3\xa9") == 0);
    attn_free(s);
    CHECK_STATUS(attn_json_expect(&r, '}', "'}'"), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "v.json:2:6: not valid JSON: expected '}', found ':'");

    /* a file offset (base), a subject, a value past the range named */
    text = "[12, 345, 07, 1.5, -1]";
    attn_json_reader_init(&r, ctx, text, strlen(text), "f.bin");
    r.base = 8;
    r.subject = "header";
    CHECK(attn_json_accept(&r, '['));
    CHECK_STATUS(attn_json_read_uint(&r, 12, "tensor 'w'", "shape", &v), ATTN_OK);
    CHECK(v == 12);
    CHECK(attn_json_accept(&r, ','));
    CHECK_STATUS(attn_json_read_uint(&r, 300, "tensor 'w'", "shape", &v), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "f.bin: tensor 'w': shape 345 exceeds 300 at byte 13");
    CHECK(attn_json_accept(&r, ','));
    CHECK_STATUS(attn_json_read_uint(&r, 300, NULL, "shape", &v), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "f.bin: header is not valid JSON at byte 18: a number with a leading zero");
    CHECK(attn_json_accept(&r, ','));
    CHECK_STATUS(attn_json_read_uint(&r, 300, NULL, "shape", &v), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "shape holds a number that is not an integer at byte 22");
    r.p += 2; /* past ".5" */
    CHECK(attn_json_accept(&r, ','));
    CHECK_STATUS(attn_json_read_uint(&r, 300, NULL, "shape", &v), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "negative value in shape at byte 27");
    attn_json_reader_init(&r, ctx, "18446744073709551616", 20, "f.bin");
    CHECK_STATUS(attn_json_read_uint(&r, SIZE_MAX, NULL, "shape", &v), ATTN_ERR_OVERFLOW);
    CHECK_MESSAGE(ctx, "a value in shape overflows size_t (18446744073709551616)");
    attn_json_reader_init(&r, ctx, "18446744073709551615", 20, "f.bin");
    CHECK_STATUS(attn_json_read_uint(&r, UINT64_MAX, NULL, "n", &v), ATTN_OK);
    CHECK(v == UINT64_MAX);

    /* raw UTF-8: checked only when asked, NUL refused unless allowed */
    text = "\"a\xff\"";
    attn_json_reader_init(&r, ctx, text, strlen(text), "u.json");
    CHECK_STATUS(attn_json_read_string(&r, "a string", &s, NULL), ATTN_OK);
    attn_free(s);
    attn_json_reader_init(&r, ctx, text, strlen(text), "u.json");
    r.check_utf8 = true;
    CHECK_STATUS(attn_json_read_string(&r, "a string", &s, NULL), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "u.json: not UTF-8: bad byte 0xff at byte 2");
    CHECK(s == NULL);
    attn_json_reader_init(&r, ctx, "\"\\u0000\"", 8, "u.json");
    CHECK_STATUS(attn_json_read_string(&r, "a string", &s, NULL), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "NUL character");
    attn_json_reader_init(&r, ctx, " [1] ", 5, "e.json");
    CHECK(attn_json_accept(&r, '[') && !attn_json_accept(&r, ']'));
    r.p++;
    CHECK(attn_json_accept(&r, ']'));
    CHECK_STATUS(attn_json_end(&r, "the array"), ATTN_OK);
    uint32_t cp;
    CHECK(attn_utf8_decode((const unsigned char *)"\xed\xa0\x80", 3, &cp) == 0); /* surrogate */
    CHECK(attn_utf8_decode((const unsigned char *)"\xf0\x9f\x98\x80", 4, &cp) == 4 &&
          cp == 0x1f600);
    CHECK(attn_utf8_decode((const unsigned char *)"\xf0\x9f\x98", 3, &cp) == 0); /* cut */
    CHECK(attn_utf8_decode((const unsigned char *)"\xc0\x80", 2, &cp) == 0); /* overlong */
    CHECK(attn_utf8_decode((const unsigned char *)"\xf4\x90\x80\x80", 4, &cp) == 0);
    CHECK(attn_utf8_invalid_at((const unsigned char *)"ab\xc3\xa9\xff", 5) == 4);
    CHECK(attn_utf8_invalid_at((const unsigned char *)"ab\xc3\xa9", 4) == 4);
    for (uint32_t c = 0; c <= 0x10ffff; c += c < 0x800 ? 1 : 97) {
        unsigned char buf[4];
        size_t bytes = attn_utf8_encode(c, buf);
        uint32_t back = 0;
        CHECK((c >= 0xd800 && c <= 0xdfff) ? attn_utf8_decode(buf, bytes, &back) == 0
                                            : attn_utf8_decode(buf, bytes, &back) == bytes &&
                                                  back == c);
    }
}

int main(void) {
    attn_ctx *ctx = NULL;
    if (attn_ctx_new(&(attn_ctx_config){.num_threads = 1}, &ctx) != ATTN_OK) return 1;
    check_config(ctx);
    check_strings(ctx);
    check_bad(ctx);
    check_file(ctx);
    check_reader(ctx);
    attn_ctx_free(ctx);
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}
