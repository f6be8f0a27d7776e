/*
 * test_tokenizer.c — attn_tokenizer_* on tiny hand-written files in a
 * temporary directory: known encodings for GPT-2's files (both names of
 * the pair, a directory or either file) and a tiktoken file, Llama 3's
 * special tokens by id, the capacity rule of encode and decode, invalid
 * UTF-8 kept byte for byte, random byte strings round-tripping (the seed is
 * printed), and every malformed-file error naming the file and line.
 * (tests/conformance/test_tokenizer_vs_tiktoken.py holds the comparisons
 * with tiktoken and transformers.)
 */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "check.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- files in a temporary directory, removed at the end ---------------- */

static char tmp_dir[64];
static char made[64][160];
static bool made_is_dir[64];
static size_t made_count;

static const char *tmp_path(const char *name) {
    char *path = made[made_count];
    snprintf(path, sizeof(made[0]), "%s/%s", tmp_dir, name);
    return path;
}

static const char *make_dir(const char *name) {
    const char *path = tmp_path(name);
    mkdir(path, 0700);
    made_is_dir[made_count++] = true;
    return path;
}

static const char *write_file(const char *name, const void *bytes, size_t len) {
    const char *path = tmp_path(name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(bytes, 1, len, f) != len) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    fclose(f);
    made_is_dir[made_count++] = false;
    return path;
}

static const char *write_text(const char *name, const char *text) {
    return write_file(name, text, strlen(text));
}

static void remove_all(void) {
    for (size_t i = made_count; i-- > 0;) {
        if (made_is_dir[i]) rmdir(made[i]);
        else remove(made[i]);
    }
    rmdir(tmp_dir);
}

/* ---- the files ---------------------------------------------------------- */

/* GPT-2's bytes_to_unicode, as UTF-8. */
static size_t byte_char(unsigned b, char out[2]) {
    unsigned cp;
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) cp = b;
    else if (b <= 32) cp = 256 + b;
    else if (b <= 160) cp = 256 + 33 + (b - 127);
    else cp = 256 + 67;
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* A vocab.json: byte b is id b (escaped where JSON needs it), then extra. */
static const char *write_gpt2_vocab(const char *name, const char *extra) {
    static char json[16384];
    size_t n = 0;
    json[n++] = '{';
    for (unsigned b = 0; b < 256; b++) {
        char ch[2];
        size_t len = byte_char(b, ch);
        json[n++] = '"';
        if (ch[0] == '"' || ch[0] == '\\') json[n++] = '\\';
        memcpy(json + n, ch, len);
        n += len;
        n += (size_t)snprintf(json + n, sizeof(json) - n, "\": %u,\n", b);
    }
    n += (size_t)snprintf(json + n, sizeof(json) - n, "%s}", extra);
    return write_file(name, json, n);
}

/* Merges to " the" and "ll" (\xC4\xA0, U+0120, is the space's character). */
static const char gpt2_extra[] =
    "\"he\": 256, \"\xC4\xA0t\": 257, \"\xC4\xA0the\": 258, \"ll\": 259, \"<|endoftext|>\": 260";
static const char gpt2_merges[] = "#version: 0.2\nh e\n\xC4\xA0 t\n\xC4\xA0t he\nl l\n";

/* A tiktoken file: byte b has rank b, then "he" 256, "ll" 257, " t" 258,
 * " the" 259; plus extra lines. */
static const char *write_tiktoken(const char *name, const char *extra) {
    static const char digits[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    static char text[8192];
    size_t n = 0;
    for (unsigned b = 0; b < 256; b++)
        n += (size_t)snprintf(text + n, sizeof(text) - n, "%c%c== %u\n", digits[b >> 2],
                              digits[(b & 3) << 4], b);
    n += (size_t)snprintf(text + n, sizeof(text) - n, "aGU= 256\nbGw= 257\nIHQ= 258\nIHRoZQ== 259\n%s",
                          extra);
    return write_file(name, text, n);
}

/* ---- helpers ------------------------------------------------------------ */

static attn_tokenizer *load_ok(attn_ctx *ctx, const char *path) {
    attn_tokenizer *t = NULL;
    attn_status st = attn_tokenizer_load(ctx, path, &t);
    if (st != ATTN_OK) {
        fprintf(stderr, "loading %s: %s: %s\n", path, attn_status_name(st),
                attn_ctx_last_error(ctx));
        check_failed++;
        return NULL;
    }
    check_passed++;
    return t;
}

/* text's ids are want (n of them), and decode back to text. */
static void check_encode(attn_tokenizer *t, const char *text, const int32_t *want, size_t n) {
    int32_t ids[64];
    size_t count = 0;
    CHECK_STATUS(attn_tokenizer_encode(t, text, strlen(text), ids, 64, &count), ATTN_OK);
    bool same = count == n;
    for (size_t i = 0; same && i < n; i++) same = ids[i] == want[i];
    if (!same) {
        fprintf(stderr, "encode(\"%s\") gave", text);
        for (size_t i = 0; i < count && i < 64; i++) fprintf(stderr, " %d", (int)ids[i]);
        fprintf(stderr, "\n");
    }
    CHECK(same);
    char back[256];
    size_t len = 0;
    CHECK_STATUS(attn_tokenizer_decode(t, ids, count, back, sizeof(back), &len), ATTN_OK);
    CHECK(len == strlen(text) && memcmp(back, text, len) == 0);
}

static void check_decode(attn_tokenizer *t, const int32_t *ids, size_t n, const char *want) {
    char text[256];
    size_t len = 0;
    CHECK_STATUS(attn_tokenizer_decode(t, ids, n, text, sizeof(text), &len), ATTN_OK);
    CHECK(len == strlen(want) && memcmp(text, want, len) == 0);
}

/* Loading path fails with status and a message holding fragment. */
static void check_load_fails(attn_ctx *ctx, const char *path, attn_status status,
                             const char *fragment) {
    attn_tokenizer *t = (attn_tokenizer *)&t; /* must come back NULL */
    CHECK_STATUS(attn_tokenizer_load(ctx, path, &t), status);
    CHECK(t == NULL);
    CHECK_MESSAGE(ctx, fragment);
}

/* ---- the tests ---------------------------------------------------------- */

static void test_gpt2(attn_ctx *ctx) {
    const char *dir = make_dir("hf");
    write_gpt2_vocab("hf/vocab.json", gpt2_extra);
    write_text("hf/merges.txt", gpt2_merges);
    make_dir("openai");
    write_gpt2_vocab("openai/encoder.json", gpt2_extra);
    const char *bpe = write_text("openai/vocab.bpe", gpt2_merges);
    char paths[5][200];
    snprintf(paths[0], sizeof(paths[0]), "%s", dir);
    snprintf(paths[1], sizeof(paths[1]), "%s/vocab.json", dir);
    snprintf(paths[2], sizeof(paths[2]), "%s/merges.txt", dir);
    snprintf(paths[3], sizeof(paths[3]), "%s/openai", tmp_dir);
    snprintf(paths[4], sizeof(paths[4]), "%s", bpe);
    for (size_t k = 0; k < 5; k++) {
        attn_tokenizer *t = load_ok(ctx, paths[k]);
        if (!t) continue;
        CHECK(attn_tokenizer_vocab_size(t) == 261);
        /* " the": h e, Ġ t, Ġt he; " hello": h e, l l */
        check_encode(t, " the hello", (const int32_t[]){258, 32, 256, 259, 111}, 5);
        /* the pattern: "it" "'s" " " " a"; no merge applies */
        check_encode(t, "it's  a", (const int32_t[]){105, 116, 39, 115, 32, 32, 97}, 7);
        /* GPT-2's contractions are lower case: "'" "S" */
        check_encode(t, "'S", (const int32_t[]){39, 83}, 2);
        /* a special token's name in text is text */
        check_encode(t, "<|endoftext|>",
                     (const int32_t[]){60, 124, 101, 110, 100, 111, 102, 116, 101, 120, 116, 124,
                                       62},
                     13);
        check_decode(t, (const int32_t[]){260, 258}, 2, "<|endoftext|> the");
        check_encode(t, "", NULL, 0);
        attn_tokenizer_free(t);
    }
}

static void test_tiktoken(attn_ctx *ctx) {
    const char *path = write_tiktoken("tok.model", "");
    attn_tokenizer *t = load_ok(ctx, path);
    if (!t) return;
    /* 260 ranks, then Llama 3's 256 special tokens */
    CHECK(attn_tokenizer_vocab_size(t) == 516);
    /* " the" is a token; " hello": he (256) before ll (257) */
    check_encode(t, " the hello", (const int32_t[]){259, 32, 256, 257, 111}, 5);
    /* Llama 3's contractions ignore case: "'S" is one piece, "'" + "S" */
    check_encode(t, "'S", (const int32_t[]){39, 83}, 2);
    check_decode(t, (const int32_t[]){260, 261, 262, 266, 267, 268, 269, 515},  8,
                 "<|begin_of_text|><|end_of_text|><|reserved_0|><|start_header_id|>"
                 "<|end_header_id|><|reserved_6|><|eot_id|><|reserved_253|>");
    /* decoding: an id out of range, or negative; nothing written, even the
     * bytes of the valid ids before it */
    char text[64];
    memset(text, 'X', sizeof text);
    size_t len = 7;
    CHECK_STATUS(attn_tokenizer_decode(t, (const int32_t[]){104, 516}, 2, text, 64, &len),
                 ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "ids[1] = 516");
    CHECK(text[0] == 'X' && text[63] == 'X' && len == 7);
    CHECK_STATUS(attn_tokenizer_decode(t, (const int32_t[]){-1}, 1, text, 64, &len),
                 ATTN_ERR_INVALID);
    CHECK(len == 7);
    attn_tokenizer_free(t);
    /* in a directory, as tokenizer.model */
    make_dir("llama");
    write_tiktoken("llama/tokenizer.model", "");
    t = load_ok(ctx, made[made_count - 2]);
    if (t) check_encode(t, " the", (const int32_t[]){259}, 1);
    attn_tokenizer_free(t);
}

/* encode and decode: too small a capacity is ATTN_ERR_SHAPE with the full
 * count and the first capacity entries written, nothing past them. */
static void test_capacity(attn_ctx *ctx) {
    attn_tokenizer *t = load_ok(ctx, tmp_path("tok.model"));
    if (!t) return;
    const char *text = " the hello world";
    size_t full = 0;
    CHECK_STATUS(attn_tokenizer_encode(t, text, strlen(text), NULL, 0, &full), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "capacity 0");
    int32_t all[32], some[32];
    size_t count = 0;
    CHECK_STATUS(attn_tokenizer_encode(t, text, strlen(text), all, 32, &count), ATTN_OK);
    CHECK(count == full && full == 11);
    for (size_t cap = 1; cap < full; cap++) {
        for (size_t i = 0; i < 32; i++) some[i] = -7;
        CHECK_STATUS(attn_tokenizer_encode(t, text, strlen(text), some, cap, &count),
                     ATTN_ERR_SHAPE);
        CHECK(count == full);
        CHECK(memcmp(some, all, cap * sizeof(int32_t)) == 0 && some[cap] == -7);
    }
    char out[32];
    size_t len = 0;
    CHECK_STATUS(attn_tokenizer_decode(t, all, full, NULL, 0, &len), ATTN_ERR_SHAPE);
    CHECK(len == strlen(text));
    memset(out, '#', sizeof(out));
    CHECK_STATUS(attn_tokenizer_decode(t, all, full, out, 5, &len), ATTN_ERR_SHAPE);
    CHECK(len == strlen(text) && memcmp(out, text, 5) == 0 && out[5] == '#');
    /* NULL where a pointer is needed: refused, the counts left as they were */
    count = len = 99;
    CHECK_STATUS(attn_tokenizer_encode(t, NULL, 3, all, 32, &count), ATTN_ERR_NULL);
    CHECK_STATUS(attn_tokenizer_encode(t, text, 3, NULL, 32, &count), ATTN_ERR_NULL);
    CHECK_STATUS(attn_tokenizer_encode(t, text, 3, all, 32, NULL), ATTN_ERR_NULL);
    CHECK_STATUS(attn_tokenizer_encode(NULL, text, 3, all, 32, &count), ATTN_ERR_NULL);
    CHECK_STATUS(attn_tokenizer_decode(t, NULL, 2, out, 32, &len), ATTN_ERR_NULL);
    CHECK_STATUS(attn_tokenizer_decode(t, all, 2, NULL, 32, &len), ATTN_ERR_NULL);
    CHECK(count == 99 && len == 99);
    CHECK_STATUS(attn_tokenizer_decode(t, all, 2, out, 32, NULL), ATTN_ERR_NULL);
    attn_tokenizer *none = t;
    CHECK_STATUS(attn_tokenizer_load(ctx, NULL, &none), ATTN_ERR_NULL);
    CHECK(none == NULL);
    CHECK_STATUS(attn_tokenizer_load(ctx, tmp_path("tok.model"), NULL), ATTN_ERR_NULL);
    /* a device is not read: /dev/zero would grow the buffer without end */
    CHECK_STATUS(attn_tokenizer_load(ctx, "/dev/zero", &none), ATTN_ERR_IO);
    CHECK_MESSAGE(ctx, "/dev/zero: not a regular file");
    CHECK(none == NULL);
    attn_tokenizer_free(t);
    attn_tokenizer_free(NULL);
}

/* Invalid UTF-8 and random bytes come back byte for byte, in both kinds;
 * the ids cover the text (each a token of the vocabulary). */
static void test_round_trip(attn_ctx *ctx, unsigned seed) {
    const char *paths[] = {tmp_path("hf"), NULL};
    char hf[200];
    snprintf(hf, sizeof(hf), "%s", paths[0]);
    paths[0] = hf;
    paths[1] = tmp_path("tok.model");
    srand(seed);
    for (size_t k = 0; k < 2; k++) {
        attn_tokenizer *t = load_ok(ctx, paths[k]);
        if (!t) continue;
        static const char invalid[] = "\xff\xfe a\xc3 \xe2\x82 \xed\xa0\x80 \xf4\x90\x80\x80"
                                      "\xc0\xaf x\xc3\xa9";
        int32_t ids[4096];
        char back[4096];
        size_t count = 0, len = 0;
        size_t n = sizeof(invalid) - 1;
        CHECK_STATUS(attn_tokenizer_encode(t, invalid, n, ids, 4096, &count), ATTN_OK);
        CHECK_STATUS(attn_tokenizer_decode(t, ids, count, back, 4096, &len), ATTN_OK);
        CHECK(len == n && memcmp(back, invalid, n) == 0);
        bool all_equal = true;
        for (int trial = 0; trial < 300; trial++) {
            char text[512];
            size_t m = (size_t)(rand() % 512);
            for (size_t i = 0; i < m; i++) {
                int r = rand() % 8;
                text[i] = r < 3 ? " the hello"[rand() % 10] : r < 4 ? "\n\r\t'sS0"[rand() % 7]
                                                                    : (char)(rand() & 0xFF);
            }
            if (attn_tokenizer_encode(t, text, m, ids, 4096, &count) != ATTN_OK ||
                attn_tokenizer_decode(t, ids, count, back, 4096, &len) != ATTN_OK || len != m ||
                memcmp(back, text, m) != 0) {
                all_equal = false;
                fprintf(stderr, "round trip %zu: trial %d (seed %u) differs\n", k, trial, seed);
                break;
            }
        }
        CHECK(all_equal);
        attn_tokenizer_free(t);
    }
}

static void test_errors(attn_ctx *ctx) {
    check_load_fails(ctx, tmp_path("no-such-file"), ATTN_ERR_IO, "no-such-file");
    check_load_fails(ctx, make_dir("empty-dir"), ATTN_ERR_IO, "empty-dir");
    /* JSON: the line and column */
    make_dir("j1");
    write_text("j1/vocab.json", "{\"a\": 1,\n \"b\" 2}");
    write_text("j1/merges.txt", "#version: 0.2\n");
    check_load_fails(ctx, made[made_count - 3], ATTN_ERR_FORMAT, "vocab.json:2:6");
    make_dir("j2");
    write_text("j2/vocab.json", "{\"a\": 1.5}");
    write_text("j2/merges.txt", "");
    check_load_fails(ctx, made[made_count - 3], ATTN_ERR_FORMAT, "not an integer");
    make_dir("j3");
    write_text("j3/vocab.json", "{\"a\": 1, \"b\": 1}");
    write_text("j3/merges.txt", "");
    check_load_fails(ctx, made[made_count - 3], ATTN_ERR_FORMAT, "id 1 is given twice");
    make_dir("j4");
    write_text("j4/vocab.json", "{\"a\": 1, \"b\": 2}");
    write_text("j4/merges.txt", "");
    check_load_fails(ctx, made[made_count - 3], ATTN_ERR_FORMAT, "no token for byte 0x00");
    /* merges: the line */
    make_dir("m1");
    write_gpt2_vocab("m1/vocab.json", gpt2_extra);
    write_text("m1/merges.txt", "#version: 0.2\nh e\nl l x\n");
    check_load_fails(ctx, made[made_count - 3], ATTN_ERR_FORMAT, "merges.txt:3");
    make_dir("m2");
    write_gpt2_vocab("m2/vocab.json", gpt2_extra);
    write_text("m2/merges.txt", "#version: 0.2\nh e\n\no o\n");
    check_load_fails(ctx, made[made_count - 3], ATTN_ERR_FORMAT, "merges.txt:4: the merge's token \"oo\"");
    make_dir("m3");
    write_gpt2_vocab("m3/vocab.json", gpt2_extra);
    check_load_fails(ctx, made[made_count - 2], ATTN_ERR_IO, "merges.txt");
    /* a token holding NUL is quoted whole, its NUL escaped */
    make_dir("m4");
    write_gpt2_vocab("m4/vocab.json", gpt2_extra);
    write_file("m4/merges.txt", "#version: 0.2\nh\0 e\n", 19);
    check_load_fails(ctx, made[made_count - 3], ATTN_ERR_FORMAT,
                     "merges.txt:2: the merge's token \"h\\x00\" is not in the vocabulary");
    /* tiktoken: the line */
    check_load_fails(ctx, write_tiktoken("t1.model", "a*b= 260\n"), ATTN_ERR_FORMAT,
                     "t1.model:261");
    check_load_fails(ctx, write_tiktoken("t2.model", "YWJj 17\n"), ATTN_ERR_FORMAT,
                     "t2.model:261: id 17 is given twice (first on line 18)");
    check_load_fails(ctx, write_tiktoken("t3.model", "YWJj\n"), ATTN_ERR_FORMAT, "t3.model:261");
    check_load_fails(ctx, write_tiktoken("t4.model", "YWJj 1x\n"), ATTN_ERR_FORMAT,
                     "t4.model:261: the rank \"1x\"");
    check_load_fails(ctx, write_tiktoken("t5.model", "aGU= 300\n"), ATTN_ERR_FORMAT,
                     "t5.model:261: the token of id 300 is given twice (first as id 256 on line 257)");
    check_load_fails(ctx, write_text("t6.model", "aGU= 256\n"), ATTN_ERR_FORMAT,
                     "no token for the byte 0x00");
    check_load_fails(ctx, write_text("t7.model", ""), ATTN_ERR_FORMAT, "t7.model: no tokens");
    /* an id far past the tokens (the table is laid out by id: 2.8 GB asked
     * for by a fuzzer's 40-byte file) */
    check_load_fails(ctx, write_tiktoken("t8.model", "YWJj 355555556\n"), ATTN_ERR_FORMAT,
                     "t8.model: token ids reach 355555556 with 261 tokens");
}

#ifdef ATTN_ALLOC_FAILURE_INJECTION
#include "internal.h" /* attn_alloc_fail_at */

/* Each allocation of a load and an encode failing in turn: ATTN_ERR_NO_MEMORY
 * (leaks show under the sanitizers). */
static void test_allocation_failures(attn_ctx *ctx) {
    char hf[200];
    snprintf(hf, sizeof(hf), "%s", tmp_path("hf"));
    const char *paths[] = {hf, tmp_path("tok.model")};
    for (size_t k = 0; k < 2; k++) {
        bool all_no_memory = true;
        for (size_t n = 1;; n++) {
            attn_tokenizer *t = NULL;
            attn_alloc_fail_at(n);
            attn_status st = attn_tokenizer_load(ctx, paths[k], &t);
            attn_alloc_fail_at(0);
            if (st == ATTN_OK) {
                const char text[] = " the hello world, the hello";
                int32_t ids[64];
                size_t count;
                for (size_t m = 1;; m++) {
                    attn_alloc_fail_at(m);
                    st = attn_tokenizer_encode(t, text, sizeof(text) - 1, ids, 64, &count);
                    attn_alloc_fail_at(0);
                    if (st == ATTN_OK) break;
                    all_no_memory = all_no_memory && st == ATTN_ERR_NO_MEMORY;
                }
                attn_tokenizer_free(t);
                break;
            }
            all_no_memory = all_no_memory && st == ATTN_ERR_NO_MEMORY && t == NULL;
        }
        CHECK(all_no_memory);
    }
}
#endif

int main(void) {
    snprintf(tmp_dir, sizeof(tmp_dir), "/tmp/attn_tokenizer_XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
    printf("seed %u\n", seed);
    attn_ctx *ctx = NULL;
    if (attn_ctx_new(NULL, &ctx) != ATTN_OK) return 1;
    test_gpt2(ctx);
    test_tiktoken(ctx);
    test_capacity(ctx);
    test_round_trip(ctx, seed);
    test_errors(ctx);
#ifdef ATTN_ALLOC_FAILURE_INJECTION
    test_allocation_failures(ctx);
#endif
    attn_ctx_free(ctx);
    remove_all();
    return check_summary();
}
