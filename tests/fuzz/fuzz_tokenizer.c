/*
 * fuzz_tokenizer.c — libFuzzer target for the tokenizers' file readers and
 * encoder.
 *
 * An input is: a mode byte, the file part up to the first NUL, then text.
 *   mode & 3 == 0  a tiktoken file: 256 valid byte lines, then the file part
 *   mode & 3 == 1  GPT-2: a valid vocab.json (bytes + a few merged tokens),
 *                  merges.txt = "#version: 0.2\n" + the file part
 *   mode & 3 == 2  GPT-2: a vocabulary (fuzz.json) that is the file part,
 *                  beside a valid merges.txt
 *   mode & 3 == 3  a tiktoken file that is the file part alone
 * A load that fails must leave NULL; one that succeeds encodes the text,
 * and every encoding (of the loaded tokenizer and of the two fixed ones)
 * must decode to the text byte for byte, with count within the text's
 * length and the capacity rule honoured.
 */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static attn_ctx *ctx;
static char dir[64];
static attn_tokenizer *fixed_gpt2, *fixed_tiktoken;

static void write_file(const char *name, const void *a, size_t an, const void *b, size_t bn) {
    char path[128];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (an) fwrite(a, 1, an, f);
    if (bn) fwrite(b, 1, bn, f);
    fclose(f);
}

static size_t tiktoken_bytes(char *out, size_t cap) {
    static const char digits[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t n = 0;
    for (unsigned b = 0; b < 256; b++)
        n += (size_t)snprintf(out + n, cap - n, "%c%c== %u\n", digits[b >> 2],
                              digits[(b & 3) << 4], b);
    n += (size_t)snprintf(out + n, cap - n, "aGU= 256\nbGw= 257\nIHQ= 258\nIHRoZQ== 259\n");
    return n;
}

/* vocab.json with byte b as id b (GPT-2's bytes_to_unicode) and merges. */
static size_t gpt2_vocab(char *out, size_t cap) {
    size_t n = 0;
    out[n++] = '{';
    for (unsigned b = 0; b < 256; b++) {
        unsigned cp = ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) ? b
                      : b <= 32                                                   ? 256 + b
                      : b <= 160 ? 256 + 33 + (b - 127)
                                 : 256 + 67;
        n += (size_t)snprintf(out + n, cap - n, "\"\\u%04x\": %u, ", cp, b);
    }
    n += (size_t)snprintf(out + n, cap - n,
                          "\"he\": 256, \"\\u0120t\": 257, \"\\u0120the\": 258, \"ll\": 259}");
    return n;
}

static const char gpt2_merges[] = "#version: 0.2\nh e\n\xC4\xA0 t\n\xC4\xA0t he\nl l\n";

static attn_tokenizer *load(const char *name) {
    char path[128];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    attn_tokenizer *t = (attn_tokenizer *)&t;
    attn_status st = attn_tokenizer_load(ctx, path, &t);
    if ((st == ATTN_OK) != (t != NULL)) abort();
    return t;
}

/* The files and the fixed tokenizers, at exit. */
static void teardown(void) {
    static const char *const names[] = {"fixed.model", "vocab.json", "merges.txt", "f.model",
                                        "fuzz.json"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char path[128];
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        remove(path);
    }
    rmdir(dir);
    attn_tokenizer_free(fixed_gpt2);
    attn_tokenizer_free(fixed_tiktoken);
    attn_ctx_free(ctx);
}

static void setup(void) {
    static char buf[16384];
    if (attn_ctx_new(NULL, &ctx) != ATTN_OK) abort();
    snprintf(dir, sizeof(dir), "/tmp/attn_fuzz_tokenizer_XXXXXX");
    if (!mkdtemp(dir)) abort();
    write_file("fixed.model", buf, tiktoken_bytes(buf, sizeof(buf)), NULL, 0);
    write_file("vocab.json", buf, gpt2_vocab(buf, sizeof(buf)), NULL, 0);
    write_file("merges.txt", gpt2_merges, sizeof(gpt2_merges) - 1, NULL, 0);
    fixed_tiktoken = load("fixed.model");
    fixed_gpt2 = load("vocab.json");
    if (!fixed_tiktoken || !fixed_gpt2) abort();
    atexit(teardown);
}

/* text encodes within capacity rules and decodes back to itself. */
static void round_trip(attn_tokenizer *t, const char *text, size_t n) {
    size_t count = 0, again = 0, len = 0;
    int32_t *ids = malloc((n + 1) * sizeof(*ids));
    char *back = malloc(n + 1);
    if (!ids || !back) abort();
    attn_status st = attn_tokenizer_encode(t, text, n, NULL, 0, &count);
    if (st != (n ? ATTN_ERR_SHAPE : ATTN_OK) || count > n || (n && !count)) abort();
    if (attn_tokenizer_encode(t, text, n, ids, n + 1, &again) != ATTN_OK || again != count)
        abort();
    for (size_t i = 0; i < count; i++)
        if (ids[i] < 0 || (size_t)ids[i] >= attn_tokenizer_vocab_size(t)) abort();
    if (attn_tokenizer_decode(t, ids, count, back, n + 1, &len) != ATTN_OK || len != n ||
        (n && memcmp(back, text, n) != 0))
        abort();
    free(ids);
    free(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!ctx) setup();
    if (size == 0) return 0;
    unsigned mode = data[0] & 3;
    const char *rest = (const char *)data + 1;
    size_t rest_n = size - 1;
    const char *nul = memchr(rest, 0, rest_n);
    size_t file_n = nul ? (size_t)(nul - rest) : rest_n;
    const char *text = nul ? nul + 1 : rest + rest_n;
    size_t text_n = nul ? rest_n - file_n - 1 : 0;

    static char base[16384];
    attn_tokenizer *t = NULL;
    if (mode == 0) {
        write_file("f.model", base, tiktoken_bytes(base, sizeof(base)), rest, file_n);
        t = load("f.model");
    } else if (mode == 3) {
        write_file("f.model", rest, file_n, NULL, 0);
        t = load("f.model");
    } else if (mode == 1) {
        write_file("merges.txt", "#version: 0.2\n", 14, rest, file_n);
        t = load("vocab.json");
    } else {
        write_file("merges.txt", gpt2_merges, sizeof(gpt2_merges) - 1, NULL, 0);
        write_file("fuzz.json", rest, file_n, NULL, 0); /* beside merges.txt */
        t = load("fuzz.json");
    }
    if (t) {
        round_trip(t, text, text_n);
        attn_tokenizer_free(t);
    }
    round_trip(fixed_tiktoken, text, text_n);
    round_trip(fixed_gpt2, text, text_n);
    return 0;
}
