/*
 * test_lm16.c — attn_lm with 16-bit weights (attn_lm_config's
 * weights_dtype) against the float32 model holding the same weights
 * widened, which is its oracle: widening is exact and the products sum in
 * float32 as the float model's do, so the logits must be equal bit for bit.
 *   - a bf16 (and an f16) checkpoint loaded as itself and as f32: equal
 *     logits without a cache (rows past the matrix-vector kernels: the
 *     SGEMM widening W as it packs it; the reference set's sums on widened
 *     panels), with a cache prefilled past them, and one
 *     token a step (the 16-bit matrix-vector kernels), GPT-2 and Llama 3,
 *     on every kernel set, 2 threads;
 *   - attn_lm_new in bf16 holds the float model's draws rounded to nearest
 *     even, tied head included, and gives its logits;
 *   - loading refuses what the weights dtype cannot hold, naming the tensor:
 *     bf16 -> f16 past 65504 or below f16's precision, f32 -> f16 past
 *     65504; f32 -> bf16 rounds to nearest even;
 *   - attn_lm_save of a 16-bit model writes float32 that loads back to the
 *     same bits; weight bytes about halve; bad weights_dtype is refused.
 * Fresh random weights each run: the seed is printed; argv[1] replays it.
 */
#define _POSIX_C_SOURCE 200809L /* mkstemp, unlink */

#include "attn.h"
#include "check.h"
#include "half.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static attn_lm_config gpt2_cfg(void) {
    return (attn_lm_config){.arch = ATTN_LM_GPT2, .vocab_size = 61, .context_length = 40,
                            .emb_dim = 64, .n_heads = 4, .n_layers = 2, .qkv_bias = true};
}

static attn_lm_config llama_cfg(void) {
    return (attn_lm_config){.arch = ATTN_LM_LLAMA3, .vocab_size = 67, .context_length = 48,
                            .emb_dim = 64, .n_heads = 8, .n_layers = 2, .n_kv_groups = 2,
                            .hidden_dim = 80, .rope_base = 10000.0};
}

static attn_ctx *new_ctx(size_t threads, attn_kernels kernels) {
    attn_ctx *ctx = NULL;
    attn_ctx_config c = {.num_threads = threads, .kernels = kernels};
    return attn_ctx_new(&c, &ctx) == ATTN_OK ? ctx : NULL;
}

static attn_lm *new_model(attn_ctx *ctx, const attn_lm_config *cfg, uint64_t seed) {
    attn_rng *rng = NULL;
    attn_lm *m = NULL;
    if (attn_rng_new(ctx, seed, &rng) != ATTN_OK) return NULL;
    attn_status st = attn_lm_new(ctx, cfg, rng, &m);
    attn_rng_free(rng);
    return st == ATTN_OK ? m : NULL;
}

static attn_status forward(attn_lm *m, attn_kv_cache *cache, const int32_t *tokens, size_t batch,
                           size_t n, bool last_only, float *logits) {
    attn_lm_forward_args a = {.cache = cache, .tokens = tokens, .batch = batch,
                              .tokens_per_seq = n, .last_only = last_only, .logits = logits};
    return attn_lm_forward(m, &a);
}

static void temp_path(char *path) {
    int fd = mkstemp(path);
    if (fd < 0) abort();
    close(fd);
}

/* m's parameters (a float model) as a safetensors file of dtype tensors
 * (F32, BF16 or F16; values rounded to nearest even), in state_dict order,
 * as torch's save_file writes a checkpoint of that dtype. */
static void write_checkpoint(attn_lm *m, const char *path, attn_dtype dtype) {
    size_t n = attn_lm_param_count(m), bytes = dtype == ATTN_DTYPE_F32 ? 4 : 2;
    size_t cap = 256 * n + 64, len = 0, offset = 0;
    char *header = malloc(cap);
    if (!header) abort();
    len += (size_t)snprintf(header + len, cap - len, "{");
    for (size_t i = 0; i < n; i++) {
        attn_param p;
        if (attn_lm_param_at(m, i, &p) != ATTN_OK) abort();
        len += (size_t)snprintf(header + len, cap - len, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                                i ? "," : "", p.name, attn_dtype_name(dtype));
        len += (size_t)snprintf(header + len, cap - len, p.ndim == 2 ? "%zu,%zu" : "%zu",
                                p.shape[0], p.shape[1]);
        len += (size_t)snprintf(header + len, cap - len, "],\"data_offsets\":[%zu,%zu]}", offset,
                                offset + p.numel * bytes);
        offset += p.numel * bytes;
    }
    len += (size_t)snprintf(header + len, cap - len, "}");
    while (len % 8) header[len++] = ' ';
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    for (int k = 0; k < 8; k++) fputc((int)(((uint64_t)len >> (8 * k)) & 0xFF), f);
    fwrite(header, 1, len, f);
    for (size_t i = 0; i < n; i++) {
        attn_param p;
        attn_lm_param_at(m, i, &p);
        for (size_t j = 0; j < p.numel; j++) {
            uint32_t u = dtype == ATTN_DTYPE_F32 ? attn_bits_of_float(p.data[j])
                                                 : attn_float_to_half(dtype, p.data[j]);
            for (size_t k = 0; k < bytes; k++) fputc((int)((u >> (8 * k)) & 0xFF), f);
        }
    }
    fclose(f);
    free(header);
}

/* Logits of a and b equal bit for bit: without a cache (B * T rows), and
 * with one prefilled with P tokens a sequence, then one token a step. */
static void check_same_logits(attn_lm *a, attn_lm *b, const char *what) {
    enum { B = 2, T = 9, P = 5 };
    size_t V = attn_lm_get_config(a).vocab_size;
    int32_t tokens[B * T];
    for (size_t i = 0; i < B * T; i++) tokens[i] = (int32_t)((i * 7919 + 3) % V);
    float *la = malloc(B * T * V * sizeof(float)), *lb = malloc(B * T * V * sizeof(float));
    if (!la || !lb) abort();
    CHECK_STATUS(forward(a, NULL, tokens, B, T, false, la), ATTN_OK);
    CHECK_STATUS(forward(b, NULL, tokens, B, T, false, lb), ATTN_OK);
    bool prefill = memcmp(la, lb, B * T * V * sizeof(float)) == 0;
    attn_kv_cache *ca = NULL, *cb = NULL;
    CHECK_STATUS(attn_lm_cache_new(a, B, T, ATTN_KV_CONTIGUOUS, 0, &ca), ATTN_OK);
    CHECK_STATUS(attn_lm_cache_new(b, B, T, ATTN_KV_CONTIGUOUS, 0, &cb), ATTN_OK);
    int32_t prompt[B * P];
    for (size_t s = 0; s < B; s++) memcpy(prompt + s * P, tokens + s * T, P * sizeof *prompt);
    CHECK_STATUS(forward(a, ca, prompt, B, P, true, la), ATTN_OK);
    CHECK_STATUS(forward(b, cb, prompt, B, P, true, lb), ATTN_OK);
    bool cached = memcmp(la, lb, B * V * sizeof(float)) == 0;
    bool decode = true;
    for (size_t t = P; t < T; t++) {
        int32_t next[B] = {tokens[t], tokens[T + t]};
        CHECK_STATUS(forward(a, ca, next, B, 1, false, la), ATTN_OK);
        CHECK_STATUS(forward(b, cb, next, B, 1, false, lb), ATTN_OK);
        decode = decode && memcmp(la, lb, B * V * sizeof(float)) == 0;
    }
    if (!prefill || !cached || !decode)
        fprintf(stderr, "%s: logits differ (no cache %d, cached prefill %d, decode %d)\n", what,
                prefill, cached, decode);
    CHECK(prefill && cached && decode);
    attn_kv_cache_free(ca);
    attn_kv_cache_free(cb);
    free(la), free(lb);
}

/* A dtype checkpoint loaded as itself (the default) and as f32. */
static void check_checkpoint(const attn_lm_config *cfg, attn_dtype dtype, attn_kernels kernels,
                             uint64_t seed) {
    attn_ctx *ctx = new_ctx(2, kernels);
    attn_lm *source = ctx ? new_model(ctx, cfg, seed) : NULL;
    CHECK(source != NULL);
    if (!source) return;
    char path[] = "/tmp/attn_test_lm16_XXXXXX";
    temp_path(path);
    write_checkpoint(source, path, dtype);
    attn_lm *half = NULL, *wide = NULL;
    CHECK_STATUS(attn_lm_load(ctx, path, NULL, cfg, &half), ATTN_OK);
    CHECK_STATUS(attn_lm_load_as(ctx, path, NULL, cfg, ATTN_DTYPE_F32, &wide), ATTN_OK);
    if (half && wide) {
        CHECK(attn_lm_get_config(half).weights_dtype == dtype);
        CHECK(attn_lm_get_config(wide).weights_dtype == ATTN_DTYPE_F32);
        char what[96];
        snprintf(what, sizeof what, "%s %s checkpoint on %s",
                 cfg->arch == ATTN_LM_GPT2 ? "gpt2" : "llama3", attn_dtype_name(dtype),
                 attn_kernels_name(kernels));
        check_same_logits(half, wide, what);
    }
    attn_lm_free(half);
    attn_lm_free(wide);
    attn_lm_free(source);
    attn_ctx_free(ctx);
    unlink(path);
}

/* attn_lm_new in bf16: the float model's draws rounded, and its logits
 * once the float model holds them rounded too. */
static void check_new(const attn_lm_config *cfg, uint64_t seed) {
    attn_ctx *ctx = new_ctx(2, ATTN_KERNELS_AUTO);
    attn_lm_config c16 = *cfg;
    c16.weights_dtype = ATTN_DTYPE_BF16;
    attn_lm *f = ctx ? new_model(ctx, cfg, seed) : NULL, *h = ctx ? new_model(ctx, &c16, seed) : NULL;
    CHECK(f && h);
    if (!f || !h) return;
    size_t halves = 0, same = 0;
    for (size_t i = 0; i < attn_lm_param_count(f); i++) {
        attn_param pf, ph;
        attn_dtype dtype;
        const void *data;
        attn_lm_param_at(f, i, &pf);
        attn_lm_param_at(h, i, &ph);
        CHECK_STATUS(attn_lm_param_data(h, i, &dtype, &data), ATTN_OK);
        if (dtype == ATTN_DTYPE_F32) {
            CHECK(ph.data == data && memcmp(pf.data, ph.data, pf.numel * sizeof(float)) == 0);
            continue;
        }
        CHECK(dtype == ATTN_DTYPE_BF16 && ph.data == NULL);
        halves++;
        bool rounded = true;
        for (size_t j = 0; j < pf.numel; j++) {
            uint16_t want = attn_float_to_bf16(pf.data[j]);
            rounded = rounded && ((const uint16_t *)data)[j] == want;
            pf.data[j] = attn_bf16_to_float(want); /* f now holds the same weights */
        }
        same += rounded;
    }
    /* the linear layers, the embedding and the head */
    size_t per_block = cfg->arch == ATTN_LM_GPT2 ? 6 : 7;
    CHECK(halves == per_block * cfg->n_layers + 2 && same == halves);
    check_same_logits(h, f, "attn_lm_new bf16");
    attn_lm_free(f);
    attn_lm_free(h);
    attn_ctx_free(ctx);
}

/* A tensor's element set to value in a float model, which is written as a
 * dtype checkpoint and loaded as want: refused, naming the tensor (or, for
 * f32 -> bf16, rounded). */
static void check_refusal(attn_dtype file, attn_dtype want, const char *tensor, float value,
                          const char *fragment) {
    attn_ctx *ctx = new_ctx(1, ATTN_KERNELS_AUTO);
    attn_lm_config cfg = llama_cfg();
    attn_lm *m = ctx ? new_model(ctx, &cfg, 7) : NULL, *got = (attn_lm *)1;
    attn_param p;
    CHECK(m && attn_lm_param(m, tensor, &p) == ATTN_OK);
    if (!m) return;
    /* every other value held by bf16 and f16 alike (nothing below f16's
     * normal range): the clean checkpoint loads as want */
    for (size_t i = 0; i < attn_lm_param_count(m); i++) {
        attn_param q;
        attn_lm_param_at(m, i, &q);
        for (size_t j = 0; j < q.numel; j++)
            q.data[j] = fabsf(q.data[j]) < 0x1p-14f ? 0.0f
                                                    : attn_bf16_to_float(attn_float_to_bf16(q.data[j]));
    }
    char path[] = "/tmp/attn_test_lm16_XXXXXX";
    temp_path(path);
    write_checkpoint(m, path, file);
    attn_lm *clean = NULL;
    CHECK_STATUS(attn_lm_load_as(ctx, path, NULL, &cfg, want, &clean), ATTN_OK);
    attn_lm_free(clean);
    p.data[p.numel - 2] = value;
    write_checkpoint(m, path, file);
    CHECK_STATUS(attn_lm_load_as(ctx, path, NULL, &cfg, want, &got), ATTN_ERR_INVALID);
    CHECK(got == NULL);
    CHECK_MESSAGE(ctx, tensor);
    CHECK_MESSAGE(ctx, fragment);
    attn_lm_free(m);
    attn_ctx_free(ctx);
    unlink(path);
}

/* f32 -> bf16 and f32 -> f16: every weight rounded to nearest even. */
static void check_rounding(attn_dtype want) {
    attn_ctx *ctx = new_ctx(1, ATTN_KERNELS_AUTO);
    attn_lm_config cfg = gpt2_cfg();
    attn_lm *m = ctx ? new_model(ctx, &cfg, 11) : NULL, *got = NULL;
    CHECK(m != NULL);
    if (!m) return;
    char path[] = "/tmp/attn_test_lm16_XXXXXX";
    temp_path(path);
    write_checkpoint(m, path, ATTN_DTYPE_F32);
    CHECK_STATUS(attn_lm_load_as(ctx, path, NULL, &cfg, want, &got), ATTN_OK);
    bool rounded = got != NULL;
    for (size_t i = 0; got && i < attn_lm_param_count(m); i++) {
        attn_param p;
        attn_dtype dtype;
        const void *data;
        attn_lm_param_at(m, i, &p);
        attn_lm_param_data(got, i, &dtype, &data);
        for (size_t j = 0; j < p.numel; j++)
            rounded = rounded && (dtype == ATTN_DTYPE_F32
                                      ? ((const float *)data)[j] == p.data[j]
                                      : ((const uint16_t *)data)[j] ==
                                            attn_float_to_half(want, p.data[j]));
    }
    CHECK(rounded);
    /* saved (widened to float32) and loaded back in want: the same bits */
    attn_lm *back = NULL;
    CHECK_STATUS(attn_lm_save(got, path), ATTN_OK);
    CHECK_STATUS(attn_lm_load_as(ctx, path, NULL, &cfg, want, &back), ATTN_OK);
    for (size_t i = 0; back && got && i < attn_lm_param_count(m); i++) {
        attn_param p;
        attn_dtype d1, d2;
        const void *a, *b;
        attn_lm_param_at(m, i, &p);
        attn_lm_param_data(got, i, &d1, &a);
        attn_lm_param_data(back, i, &d2, &b);
        CHECK(d1 == d2 && memcmp(a, b, p.numel * (d1 == ATTN_DTYPE_F32 ? 4 : 2)) == 0);
    }
    attn_lm *plain = NULL; /* the saved file is float32: attn_lm_load keeps it so */
    CHECK_STATUS(attn_lm_load(ctx, path, NULL, &cfg, &plain), ATTN_OK);
    CHECK(plain && attn_lm_get_config(plain).weights_dtype == ATTN_DTYPE_F32);
    attn_lm_free(plain);
    attn_lm_free(back);
    attn_lm_free(got);
    attn_lm_free(m);
    attn_ctx_free(ctx);
    unlink(path);
}

static void check_bytes_and_errors(void) {
    attn_ctx *ctx = new_ctx(1, ATTN_KERNELS_AUTO);
    if (!ctx) abort();
    attn_lm_config f = llama_cfg(), h = llama_cfg();
    h.weights_dtype = ATTN_DTYPE_BF16;
    attn_lm *mf = NULL, *mh = NULL;
    CHECK_STATUS(attn_lm_new(ctx, &f, NULL, &mf), ATTN_OK);
    CHECK_STATUS(attn_lm_new(ctx, &h, NULL, &mh), ATTN_OK);
    /* float: every parameter; bf16: the norms (5 * 64 floats) stay float */
    size_t bf = attn_lm_weight_bytes(mf), bh = attn_lm_weight_bytes(mh);
    CHECK(bf == (bh - 5 * 64 * 4) * 2 + 5 * 64 * 4);
    CHECK(attn_lm_weight_bytes(NULL) == 0);
    attn_lm_free(mf);
    attn_lm_free(mh);
    attn_lm *m = (attn_lm *)1;
    h.weights_dtype = ATTN_DTYPE_F64;
    CHECK_STATUS(attn_lm_new(ctx, &h, NULL, &m), ATTN_ERR_INVALID);
    CHECK(m == NULL);
    CHECK_MESSAGE(ctx, "weights_dtype (3, F64)");
    CHECK_STATUS(attn_lm_load_as(ctx, "/nonexistent.safetensors", NULL, NULL, ATTN_DTYPE_BF16,
                                 &m),
                 ATTN_ERR_IO);
    CHECK_STATUS(attn_lm_param_data(NULL, 0, NULL, NULL), ATTN_ERR_NULL);
    attn_ctx_free(ctx);
}

int main(int argc, char **argv) {
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : (uint64_t)time(NULL);
    printf("seed %llu\n", (unsigned long long)seed);
    const attn_kernels sets[] = {ATTN_KERNELS_REFERENCE, ATTN_KERNELS_PORTABLE,
                                 ATTN_KERNELS_AVX2, ATTN_KERNELS_AVX512};
    for (size_t s = 0; s < sizeof sets / sizeof sets[0]; s++) {
        if (!attn_kernels_supported(sets[s])) continue;
        attn_lm_config g = gpt2_cfg(), l = llama_cfg();
        check_checkpoint(&g, ATTN_DTYPE_BF16, sets[s], seed);
        check_checkpoint(&l, ATTN_DTYPE_BF16, sets[s], seed + 1);
        check_checkpoint(&l, ATTN_DTYPE_F16, sets[s], seed + 2);
        check_checkpoint(&g, ATTN_DTYPE_F16, sets[s], seed + 3);
    }
    attn_lm_config g = gpt2_cfg(), l = llama_cfg();
    check_new(&g, seed);
    l.tie_embeddings = true;
    check_new(&l, seed + 1);
    check_refusal(ATTN_DTYPE_BF16, ATTN_DTYPE_F16, "trf_blocks.1.att.W_value.weight", 1e5f,
                  "cannot hold exactly");
    check_refusal(ATTN_DTYPE_BF16, ATTN_DTYPE_F16, "trf_blocks.0.ff.fc3.weight", 3e-6f,
                  "cannot hold exactly");
    check_refusal(ATTN_DTYPE_F32, ATTN_DTYPE_F16, "tok_emb.weight", 7e4f,
                  "past its range): load it as bf16 or f32");
    /* past bf16's range too: f32 alone holds it */
    check_refusal(ATTN_DTYPE_F32, ATTN_DTYPE_BF16, "tok_emb.weight", 3.4e38f,
                  "past its range): load it as f32");
    check_refusal(ATTN_DTYPE_BF16, ATTN_DTYPE_F16, "tok_emb.weight", 1e5f,
                  "load it as bf16 or f32");
    check_rounding(ATTN_DTYPE_BF16);
    check_rounding(ATTN_DTYPE_F16);
    check_bytes_and_errors();
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}
