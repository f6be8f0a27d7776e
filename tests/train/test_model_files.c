/*
 * Hostile training files: attn_model_load on every kind of damage a saved
 * model can take. The file is one attn_model_save wrote; each case changes
 * its bytes (truncated at many lengths, every header byte replaced, the
 * header's fields edited one at a time, tensors dropped, added, renamed,
 * reshaped, retyped, moved) and loads it into a model of the saved config.
 * Each load either fails, with a status other than ATTN_OK, a one-line
 * message, and every parameter as it was, or succeeds with exactly the
 * saved weights (a change the format does not see, such as a space in the
 * header's JSON). Run under make sanitize too, where ASan and UBSan watch
 * every case.
 */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "check.h"

#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

static unsigned char *file_bytes(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static int write_bytes(const char *path, const unsigned char *buf, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(buf, 1, len, f);
    return fclose(f) == 0 && w == len ? 0 : -1;
}

/* Every parameter's data, in state_dict order, end to end. */
static float *snapshot(attn_model *m, size_t *n) {
    const attn_param *params;
    size_t count;
    if (attn_model_params(m, &params, &count) != ATTN_OK) return NULL;
    size_t total = 0;
    for (size_t i = 0; i < count; i++) total += params[i].numel;
    float *out = malloc(total * sizeof *out);
    size_t at = 0;
    for (size_t i = 0; out && i < count; i++) {
        memcpy(out + at, params[i].data, params[i].numel * sizeof *out);
        at += params[i].numel;
    }
    *n = total;
    return out;
}

static int cases, refused, accepted;

/* Loads bytes into m; m holds `before` (and the file's weights are `saved`). */
static void load_case(attn_ctx *ctx, attn_model *m, const char *path, const unsigned char *buf,
                      size_t len, const float *before, const float *saved, size_t n,
                      const char *what) {
    if (write_bytes(path, buf, len) != 0) {
        CHECK(!"cannot write the case's file");
        return;
    }
    cases++;
    attn_status st = attn_model_load(m, path);
    char msg[512]; /* before any other call on the model clears it */
    snprintf(msg, sizeof msg, "%s", attn_ctx_last_error(ctx));
    size_t got_n;
    float *now = snapshot(m, &got_n);
    CHECK(now != NULL && got_n == n);
    if (!now) return;
    if (st != ATTN_OK) {
        refused++;
        bool one_line = msg[0] != '\0' && strchr(msg, '\n') == NULL;
        bool untouched = memcmp(now, before, n * sizeof *now) == 0;
        if (!one_line || !untouched)
            fprintf(stderr, "%s: refused (%s) but %s: \"%s\"\n", what, attn_status_name(st),
                    !untouched ? "the weights changed" : "the message is not one line", msg);
        CHECK(one_line);
        CHECK(untouched);
    } else {
        accepted++;
        bool exact = memcmp(now, saved, n * sizeof *now) == 0;
        if (!exact) fprintf(stderr, "%s: loaded, but not the saved weights\n", what);
        CHECK(exact);
        /* back to `before` for the next case */
        const attn_param *params;
        size_t count, at = 0;
        attn_model_params(m, &params, &count);
        for (size_t i = 0; i < count; i++) {
            memcpy(params[i].data, before + at, params[i].numel * sizeof *before);
            at += params[i].numel;
        }
    }
    free(now);
}

/* buf with the first occurrence of `from` in its header replaced by `to`
 * (the header's length field fixed up); NULL when `from` is absent. */
static unsigned char *edit_header(const unsigned char *buf, size_t len, const char *from,
                                  const char *to, size_t *out_len) {
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];
    char *header = malloc(hlen + 1);
    memcpy(header, buf + 8, hlen);
    header[hlen] = '\0';
    char *at = strstr(header, from);
    if (!at) {
        free(header);
        return NULL;
    }
    size_t fl = strlen(from), tl = strlen(to);
    uint64_t new_hlen = hlen - fl + tl;
    unsigned char *out = malloc(8 + new_hlen + (len - 8 - hlen));
    for (int i = 0; i < 8; i++) out[i] = (unsigned char)(new_hlen >> (8 * i));
    size_t pre = (size_t)(at - header);
    memcpy(out + 8, header, pre);
    memcpy(out + 8 + pre, to, tl);
    memcpy(out + 8 + pre + tl, at + fl, hlen - pre - fl);
    memcpy(out + 8 + new_hlen, buf + 8 + hlen, len - 8 - hlen);
    *out_len = 8 + new_hlen + (len - 8 - hlen);
    free(header);
    return out;
}

int main(void) {
    attn_ctx *ctx;
    attn_ctx_new(&(attn_ctx_config){.num_threads = 1}, &ctx);
    attn_rng *rng_a, *rng_b;
    attn_rng_new(ctx, 1, &rng_a);
    attn_rng_new(ctx, 2, &rng_b);
    attn_model_config cfg = {.vocab_size = 11, .context_length = 8, .d_model = 8,
                             .n_layers = 2, .n_heads = 2, .attention = ATTN_MODULE_MHA,
                             .mlp = true};
    attn_model *saved_model, *m;
    CHECK_STATUS(attn_model_new(ctx, &cfg, rng_a, &saved_model), ATTN_OK);
    CHECK_STATUS(attn_model_new(ctx, &cfg, rng_b, &m), ATTN_OK);

    char dir[] = "/tmp/attn-model-files-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char good[512], path[512];
    snprintf(good, sizeof good, "%s/good.safetensors", dir);
    snprintf(path, sizeof path, "%s/case.safetensors", dir);
    CHECK_STATUS(attn_model_save(saved_model, good), ATTN_OK);

    size_t len = 0, n = 0, n2 = 0;
    unsigned char *buf = file_bytes(good, &len);
    float *saved = snapshot(saved_model, &n);
    float *before = snapshot(m, &n2);
    CHECK(buf && saved && before && n == n2 && len > 8);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];

    /* the file itself loads, exactly */
    load_case(ctx, m, path, buf, len, before, saved, n, "the saved file");
    CHECK(accepted == 1);

    /* truncated: every length through the header, then every 37th byte */
    for (size_t cut = 0; cut < len; cut += cut < 8 + hlen ? 1 : 37) {
        char what[64];
        snprintf(what, sizeof what, "truncated to %zu bytes", cut);
        load_case(ctx, m, path, buf, cut, before, saved, n, what);
    }
    /* longer: bytes past the last tensor */
    unsigned char *longer = calloc(len + 16, 1);
    memcpy(longer, buf, len);
    load_case(ctx, m, path, longer, len + 16, before, saved, n, "16 bytes appended");
    free(longer);

    /* every byte of the length field and the header, replaced by each of a
     * few values that matter to a JSON parser or a length */
    static const unsigned char values[] = {0x00, 0xff, '"', '}', ']', ',', '9', ' '};
    unsigned char *copy = malloc(len);
    for (size_t at = 0; at < 8 + hlen; at++) {
        for (size_t v = 0; v < sizeof values; v++) {
            if (buf[at] == values[v]) continue;
            memcpy(copy, buf, len);
            copy[at] = values[v];
            char what[64];
            snprintf(what, sizeof what, "byte %zu set to 0x%02x", at, values[v]);
            load_case(ctx, m, path, copy, len, before, saved, n, what);
        }
    }
    free(copy);

    /* the header's fields edited */
    static const char *const edits[][2] = {
        {"\"F32\"", "\"F16\""},
        {"\"F32\"", "\"F64\""},
        {"\"F32\"", "\"I32\""},
        {"\"F32\"", "\"BOOL\""},
        {"\"F32\"", "\"f32\""},
        {"[11,8]", "[8,11]"},
        {"[11,8]", "[88]"},
        {"[11,8]", "[11,8,1]"},
        {"[11,8]", "[11,-8]"},
        {"[11,8]", "[11,18446744073709551615]"},
        {"[11,8]", "[]"},
        {"\"tok_emb.weight\"", "\"tok_emb.weights\""},
        {"\"tok_emb.weight\"", "\"blocks.9.attn.W_query.weight\""},
        {"\"tok_emb.weight\"", "\"blocks.999999999999.ln1.weight\""},
        {"\"head.weight\"", "\"head.bias\""},
        {"\"data_offsets\":[0,", "\"data_offsets\":[4,"},
        {"\"data_offsets\":[0,", "\"data_offsets\":[-1,"},
        {"\"format\":\"attn-lm\"", "\"format\":\"pt\""},
        {"\"n_layers\":\"2\"", "\"n_layers\":\"3\""},
        {"\"n_layers\":\"2\"", "\"n_layers\":\"1000000000\""},
        {"\"n_heads\":\"2\"", "\"n_heads\":\"4\""},
        {"\"attention\":\"mha\"", "\"attention\":\"gpt2\""},
        {"\"mlp\":\"1\"", "\"mlp\":\"0\""},
        {"\"d_model\":\"8\"", "\"d_model\":\"-8\""},
        {"\"vocab_size\":\"11\"", "\"vocab_size\":\"1e999\""},
        {"\"__metadata__\"", "\"__metadata_\""},
        {"{", "{\"extra\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"},
    };
    int edited = 0;
    for (size_t e = 0; e < sizeof edits / sizeof edits[0]; e++) {
        size_t elen;
        unsigned char *ebuf = edit_header(buf, len, edits[e][0], edits[e][1], &elen);
        if (!ebuf) continue;
        edited++;
        char what[160];
        snprintf(what, sizeof what, "%s -> %s", edits[e][0], edits[e][1]);
        load_case(ctx, m, path, ebuf, elen, before, saved, n, what);
        free(ebuf);
    }
    /* the edits must find their targets, or the test checks nothing */
    CHECK(edited >= 20);

    /* a missing file, a directory, an empty file */
    CHECK(attn_model_load(m, dir) != ATTN_OK);
    snprintf(path, sizeof path, "%s/missing.safetensors", dir);
    CHECK(attn_model_load(m, path) != ATTN_OK);

    fprintf(stderr, "%d hostile files: %d refused, %d loaded the saved weights exactly "
                    "(%d header edits)\n", cases, refused, accepted, edited);
    CHECK(refused > 1000);

    snprintf(path, sizeof path, "%s/case.safetensors", dir);
    unlink(path);
    unlink(good);
    rmdir(dir);
    free(buf);
    free(saved);
    free(before);
    attn_model_free(saved_model);
    attn_model_free(m);
    attn_rng_free(rng_a);
    attn_rng_free(rng_b);
    attn_ctx_free(ctx);
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}
