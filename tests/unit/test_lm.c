/*
 * test_lm.c — attn_lm (the book's GPT-2 and Llama 3) through its C API,
 * beside the PyTorch conformance test (tests/conformance/test_lm_vs_book.py):
 *   - config checks, each naming the wrong values; NULL arguments;
 *   - the parameter list: counts, names in state_dict order, lookup;
 *   - the no-cache forward gives the same bits on 1, 2 and 3 threads, also
 *     with a prompt wide enough that the row-wise steps split its rows;
 *   - decoding with a cache (matrix-vector kernels, split-KV attention)
 *     agrees with the no-cache forward of the whole sequence (SGEMM, fused
 *     attention) within 1e-5 relative L2, step after step, on every kernel
 *     set; tied embeddings read tok_emb; gpt-mla's cache holds its latent
 *     once, the bytes of the latent alone;
 *   - attn_lm_save then attn_lm_load give back the same logits bit for
 *     bit; GPT-2's config from the shapes; Llama's needs one;
 *   - with -DATTN_ALLOC_FAILURE_INJECTION=ON: attn_lm_new, attn_lm_load and
 *     attn_lm_forward with each allocation failed in turn return
 *     ATTN_ERR_NO_MEMORY, set *out to NULL, and leave the model usable.
 * Fresh random weights each run: the seed is printed; argv[1] replays it.
 */
#define _POSIX_C_SOURCE 200809L /* mkstemp, unlink */

#include "attn.h"
#include "check.h"
#include "internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static attn_lm_config gpt2_cfg(void) {
    return (attn_lm_config){.arch = ATTN_LM_GPT2, .vocab_size = 61, .context_length = 40,
                            .emb_dim = 64, .n_heads = 4, .n_layers = 2, .qkv_bias = true};
}

/* gpt_with_kv_gqa.py's GPTModel: 8 heads over 2 KV heads */
static attn_lm_config gqa_cfg(void) {
    return (attn_lm_config){.arch = ATTN_LM_GPT_GQA, .vocab_size = 59, .context_length = 40,
                            .emb_dim = 64, .n_heads = 8, .n_layers = 2, .n_kv_groups = 2,
                            .qkv_bias = true};
}

/* gpt_with_kv_mla.py's GPTModel: a latent of 24 */
static attn_lm_config mla_cfg(void) {
    return (attn_lm_config){.arch = ATTN_LM_GPT_MLA, .vocab_size = 53, .context_length = 40,
                            .emb_dim = 64, .n_heads = 4, .n_layers = 2, .latent_dim = 24,
                            .qkv_bias = true};
}

/* gpt_with_kv_swa.py's GPTModel: windows of 3 on layers 0 and 1, none on
 * layer 2 (stride 2) */
static attn_lm_config swa_cfg(void) {
    attn_lm_config c = gpt2_cfg();
    c.n_layers = 3;
    c.sliding_window_size = 3;
    c.sliding_window_stride = 2;
    return c;
}

static attn_lm_config llama_cfg(void) {
    return (attn_lm_config){.arch = ATTN_LM_LLAMA3, .vocab_size = 67, .context_length = 48,
                            .emb_dim = 64, .n_heads = 8, .n_layers = 2, .n_kv_groups = 2,
                            .hidden_dim = 80, .rope_base = 10000.0, .rope_factor = 8.0,
                            .rope_low_freq_factor = 1.0, .rope_high_freq_factor = 4.0,
                            .rope_original_context_length = 16};
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

static double rel_l2(const float *a, const float *b, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)b[i] * b[i];
    }
    return sqrt(d / (s + 1e-300));
}

static attn_status forward(attn_lm *m, attn_kv_cache *cache, const int32_t *tokens, size_t batch,
                           size_t n, bool last_only, float *logits) {
    attn_lm_forward_args a = {.cache = cache, .tokens = tokens, .batch = batch,
                              .tokens_per_seq = n, .last_only = last_only, .logits = logits};
    return attn_lm_forward(m, &a);
}

static void check_config_errors(attn_ctx *ctx) {
    attn_lm *m = (attn_lm *)1;
    attn_lm_config c = gpt2_cfg();
    c.arch = 0;
    CHECK_STATUS(attn_lm_new(ctx, &c, NULL, &m), ATTN_ERR_INVALID);
    CHECK(m == NULL);
    CHECK_MESSAGE(ctx, "arch (0)");
    c = gpt2_cfg();
    c.n_heads = 5;
    CHECK_STATUS(attn_lm_new(ctx, &c, NULL, &m), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "n_heads (5) must divide emb_dim (64)");
    c = gpt2_cfg();
    c.hidden_dim = 100;
    CHECK_STATUS(attn_lm_new(ctx, &c, NULL, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "hidden_dim (100)");
    c = llama_cfg();
    c.n_kv_groups = 3;
    CHECK_STATUS(attn_lm_new(ctx, &c, NULL, &m), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "n_kv_groups (3) must divide n_heads (8)");
    c = gqa_cfg();
    c.n_kv_groups = 3;
    CHECK_STATUS(attn_lm_new(ctx, &c, NULL, &m), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "n_kv_groups (3) must divide n_heads (8)");
    c = gpt2_cfg();
    c.n_kv_groups = 2;
    CHECK_STATUS(attn_lm_new(ctx, &c, NULL, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "gpt2 has one KV head per head: n_kv_groups (2)");
    c = gpt2_cfg();
    c.arch = 5;
    CHECK_STATUS(attn_lm_new(ctx, &c, NULL, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "arch (5) is not ATTN_LM_GPT2 (1), ATTN_LM_LLAMA3 (2), ATTN_LM_GPT_GQA");
    c = gpt2_cfg();
    c.latent_dim = 8;
    CHECK_STATUS(attn_lm_new(ctx, &c, NULL, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "latent_dim (8) is gpt-mla's; gpt2 has none");
    c = mla_cfg();
    c.n_kv_groups = 2;
    CHECK_STATUS(attn_lm_new(ctx, &c, NULL, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "gpt-mla has one KV head per head: n_kv_groups (2)");
    c = swa_cfg();
    c.sliding_window_size = 0;
    CHECK_STATUS(attn_lm_new(ctx, &c, NULL, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "sliding_window_stride (2) without a sliding_window_size (0)");
    c = llama_cfg();
    c.emb_dim = 72; /* head_dim 9 */
    CHECK_STATUS(attn_lm_new(ctx, &c, NULL, &m), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "even head_dim");
    c = llama_cfg();
    c.hidden_dim = 0;
    CHECK_STATUS(attn_lm_new(ctx, &c, NULL, &m), ATTN_ERR_INVALID);
    c = llama_cfg();
    c.rope_high_freq_factor = c.rope_low_freq_factor;
    CHECK_STATUS(attn_lm_new(ctx, &c, NULL, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "low_freq_factor (1)");
    c = gpt2_cfg();
    c.vocab_size = (size_t)1 << 40;
    c.emb_dim = (size_t)1 << 40;
    CHECK_STATUS(attn_lm_new(ctx, &c, NULL, &m), ATTN_ERR_OVERFLOW);
    CHECK_STATUS(attn_lm_new(ctx, NULL, NULL, &m), ATTN_ERR_NULL);
    CHECK_STATUS(attn_lm_load(ctx, "/nonexistent/model.safetensors", NULL, NULL, &m), ATTN_ERR_IO);
    CHECK(m == NULL);
    CHECK_STATUS(attn_lm_forward(NULL, NULL), ATTN_ERR_NULL);
    attn_lm_free(NULL);
}

static void check_params(attn_ctx *ctx) {
    attn_lm_config g = gpt2_cfg(), l = llama_cfg();
    attn_lm *mg = new_model(ctx, &g, 1), *ml = new_model(ctx, &l, 1);
    CHECK(mg && ml);
    if (!mg || !ml) return;
    /* tok_emb, pos_emb, 16 a block, final_norm scale/shift, out_head */
    CHECK(attn_lm_param_count(mg) == 2 + 16 * 2 + 3);
    /* tok_emb, 9 a block, final_norm, out_head */
    CHECK(attn_lm_param_count(ml) == 1 + 9 * 2 + 2);
    attn_param p;
    CHECK_STATUS(attn_lm_param_at(ml, 1, &p), ATTN_OK);
    CHECK(strcmp(p.name, "trf_blocks.0.att.W_key.weight") == 0 && p.shape[0] == 16 &&
          p.shape[1] == 64);
    CHECK_STATUS(attn_lm_param(mg, "trf_blocks.1.ff.layers.2.weight", &p), ATTN_OK);
    CHECK(p.ndim == 2 && p.shape[0] == 64 && p.shape[1] == 256);
    CHECK_STATUS(attn_lm_param(mg, "trf_blocks.1.norm2.shift", &p), ATTN_OK);
    CHECK(p.ndim == 1 && p.numel == 64 && p.data[0] == 0.0f);
    CHECK_STATUS(attn_lm_param(ml, "trf_blocks.0.norm1.weight", &p), ATTN_OK);
    CHECK(p.data[3] == 1.0f);
    CHECK_STATUS(attn_lm_param(mg, "nope", &p), ATTN_ERR_NOT_FOUND);
    CHECK_MESSAGE(ctx, "'nope'");
    CHECK_STATUS(attn_lm_param_at(mg, 999, &p), ATTN_ERR_NOT_FOUND);
    /* GroupedQueryAttention's order: W_key, W_value, W_query, out_proj
     * without bias */
    attn_lm_config q = gqa_cfg();
    attn_lm *mq = new_model(ctx, &q, 1);
    CHECK(mq != NULL);
    if (mq) {
        /* tok_emb, pos_emb, 15 a block, final_norm scale/shift, out_head */
        CHECK(attn_lm_param_count(mq) == 2 + 15 * 2 + 3);
        static const char *const order[] = {
            "trf_blocks.0.att.W_key.weight",   "trf_blocks.0.att.W_key.bias",
            "trf_blocks.0.att.W_value.weight", "trf_blocks.0.att.W_value.bias",
            "trf_blocks.0.att.W_query.weight", "trf_blocks.0.att.W_query.bias",
            "trf_blocks.0.att.out_proj.weight", "trf_blocks.0.ff.layers.0.weight"};
        for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
            CHECK(attn_lm_param_at(mq, 2 + i, &p) == ATTN_OK && strcmp(p.name, order[i]) == 0);
        CHECK(attn_lm_param(mq, "trf_blocks.1.att.W_value.weight", &p) == ATTN_OK &&
              p.shape[0] == 16 && p.shape[1] == 64);
        CHECK_STATUS(attn_lm_param(mq, "trf_blocks.0.att.out_proj.bias", &p), ATTN_ERR_NOT_FOUND);
        CHECK_MESSAGE(ctx, "the gpt-gqa model has no parameter");
        attn_lm_free(mq);
    }
    /* MultiHeadLatentAttention's order, its latent's default width */
    attn_lm_config a = mla_cfg();
    a.latent_dim = 0;
    attn_lm *ma = new_model(ctx, &a, 1);
    CHECK(ma != NULL);
    if (ma) {
        CHECK(attn_lm_get_config(ma).latent_dim == 16); /* max(16, 64 / 8) */
        /* tok_emb, pos_emb, 18 a block, final_norm scale/shift, out_head */
        CHECK(attn_lm_param_count(ma) == 2 + 18 * 2 + 3);
        static const char *const order[] = {
            "trf_blocks.0.att.W_query.weight", "trf_blocks.0.att.W_query.bias",
            "trf_blocks.0.att.W_DKV.weight",   "trf_blocks.0.att.W_DKV.bias",
            "trf_blocks.0.att.W_UK.weight",    "trf_blocks.0.att.W_UK.bias",
            "trf_blocks.0.att.W_UV.weight",    "trf_blocks.0.att.W_UV.bias",
            "trf_blocks.0.att.out_proj.weight", "trf_blocks.0.att.out_proj.bias"};
        for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
            CHECK(attn_lm_param_at(ma, 2 + i, &p) == ATTN_OK && strcmp(p.name, order[i]) == 0);
        CHECK(attn_lm_param(ma, "trf_blocks.1.att.W_UK.weight", &p) == ATTN_OK &&
              p.shape[0] == 64 && p.shape[1] == 16);
        attn_lm_free(ma);
    }
    attn_lm_config got = attn_lm_get_config(ml);
    CHECK(got.norm_eps == 1e-5 && got.n_kv_groups == 2 && got.rope_factor == 8.0);
    /* tied: out_head is tok_emb's storage */
    attn_lm_config t = l;
    t.tie_embeddings = true;
    attn_lm *mt = new_model(ctx, &t, 2);
    attn_param head, tok;
    CHECK(mt && attn_lm_param(mt, "out_head.weight", &head) == ATTN_OK &&
          attn_lm_param(mt, "tok_emb.weight", &tok) == ATTN_OK && head.data == tok.data);
    attn_lm_free(mt);
    attn_lm_free(mg);
    attn_lm_free(ml);
}

/* The no-cache forward on 1, 2, 3 threads; decoding against it. */
static void check_forward(const attn_lm_config *cfg, attn_kernels kernels, uint64_t seed) {
    enum { B = 2, T = 13, P = 5 };
    size_t V = cfg->vocab_size;
    int32_t tokens[B * T];
    for (size_t i = 0; i < B * T; i++) tokens[i] = (int32_t)((seed + i * 7919) % V);
    float *base = malloc(B * T * V * sizeof(float)), *other = malloc(B * T * V * sizeof(float));
    float *step = malloc(B * 2 * V * sizeof(float));
    if (!base || !other || !step) abort();
    for (size_t threads = 1; threads <= 3; threads++) {
        attn_ctx *ctx = new_ctx(threads, kernels);
        attn_lm *m = ctx ? new_model(ctx, cfg, seed) : NULL;
        CHECK(m != NULL);
        if (!m) break;
        CHECK_STATUS(forward(m, NULL, tokens, B, T, false, threads == 1 ? base : other), ATTN_OK);
        if (threads > 1) CHECK(memcmp(base, other, B * T * V * sizeof(float)) == 0);
        if (threads == 2) {
            /* prefill P tokens, then one token a step, against base's rows */
            attn_kv_cache *cache = NULL;
            CHECK_STATUS(attn_lm_cache_new(m, B, T, ATTN_KV_PAGED, 4, &cache), ATTN_OK);
            int32_t prompt[B * P];
            for (size_t b = 0; b < B; b++) memcpy(prompt + b * P, tokens + b * T, P * 4);
            CHECK_STATUS(forward(m, cache, prompt, B, P, true, step), ATTN_OK);
            double worst = 0;
            for (size_t b = 0; b < B; b++)
                worst = check_worse(worst, rel_l2(step + b * V, base + (b * T + P - 1) * V, V));
            for (size_t t = P; t < T; t++) {
                int32_t next[B] = {tokens[t], tokens[T + t]};
                CHECK_STATUS(forward(m, cache, next, B, 1, false, step), ATTN_OK);
                for (size_t b = 0; b < B; b++)
                    worst = check_worse(worst, rel_l2(step + b * V, base + (b * T + t) * V, V));
            }
            if (worst > 1e-5) fprintf(stderr, "%s: decode vs full: %.3g\n",
                                      attn_kernels_name(kernels), worst);
            CHECK(worst <= 1e-5);
            /* past max_len (T): a clean error, nothing appended */
            int32_t one[B] = {0, 0};
            CHECK_STATUS(forward(m, cache, one, B, 1, true, step), ATTN_ERR_OVERFLOW);
            size_t len = 0;
            CHECK(attn_kv_cache_length(cache, 1, 0, &len) == ATTN_OK && len == T);
            attn_kv_cache_free(cache);
        }
        attn_lm_free(m);
        attn_ctx_free(ctx);
    }
    free(base), free(other), free(step);
}

/* gpt-mla's cache holds the latent once (one KV head of latent_dim, values
 * the keys): its bytes are the latent's; a cache storing the latent twice
 * gives the same bits; a prompt into it, the bits of the forward without a
 * cache; a cache's windows hold for a model without (its prompt too); a
 * cache of its keys' and values' shape is refused, naming the latent. (Its
 * decode steps against the forward without a cache: check_forward.) */
static void check_latent_cache(attn_ctx *ctx, const attn_lm_config *cfg, uint64_t seed) {
    enum { T = 7 };
    size_t V = cfg->vocab_size;
    attn_lm *m = new_model(ctx, cfg, seed);
    float *logits = malloc(2 * T * V * sizeof(float));
    CHECK(m && logits);
    if (!m || !logits) {
        attn_lm_free(m);
        free(logits);
        return;
    }
    attn_kv_cache_config c;
    CHECK_STATUS(attn_lm_cache_config(m, 1, 0, &c), ATTN_OK);
    CHECK(c.kv_heads == 1 && c.head_dim == cfg->latent_dim && c.values_are_keys);
    int32_t ids[T] = {3, 1, 4, 1, 5, 9, 2};
    for (int twice = 0; twice < 2; twice++) {
        attn_kv_cache *cache = NULL;
        c.values_are_keys = !twice;
        CHECK_STATUS(attn_kv_cache_new(ctx, &c, &cache), ATTN_OK);
        size_t latent_bytes = cfg->n_layers * cfg->latent_dim * sizeof(float);
        CHECK(attn_kv_cache_token_bytes(cache) == (twice ? 2 : 1) * latent_bytes);
        CHECK_STATUS(forward(m, cache, ids, 1, 3, false, logits + twice * T * V), ATTN_OK);
        for (size_t t = 3; t < T; t++)
            CHECK_STATUS(forward(m, cache, ids + t, 1, 1, false, logits + (twice * T + t) * V),
                         ATTN_OK);
        attn_kv_cache_free(cache);
    }
    CHECK(memcmp(logits, logits + T * V, T * V * sizeof(float)) == 0);
    /* a prompt into an empty cache runs as the forward without one */
    CHECK_STATUS(forward(m, NULL, ids, 1, 3, false, logits + T * V), ATTN_OK);
    CHECK(memcmp(logits, logits + T * V, 3 * V * sizeof(float)) == 0);
    /* a cache with windows of 2 on a model without: its windows rule, the
     * prompt's too, as the same model with windows of 2 on its layers */
    attn_lm_config wcfg = *cfg;
    wcfg.sliding_window_size = 2;
    wcfg.sliding_window_stride = 0;
    attn_lm *w = new_model(ctx, &wcfg, seed);
    CHECK(w != NULL);
    for (int windowed = 0; w && windowed < 2; windowed++) {
        attn_kv_cache_config wc;
        CHECK_STATUS(attn_lm_cache_config(w, 1, 0, &wc), ATTN_OK);
        CHECK(wc.windows && wc.windows[0] == 2);
        attn_kv_cache *cache = NULL;
        CHECK_STATUS(attn_kv_cache_new(ctx, &wc, &cache), ATTN_OK);
        attn_lm *run = windowed ? w : m;
        float *out = logits + windowed * T * V;
        CHECK_STATUS(forward(run, cache, ids, 1, 3, false, out), ATTN_OK);
        for (size_t t = 3; t < T; t++)
            CHECK_STATUS(forward(run, cache, ids + t, 1, 1, false, out + t * V), ATTN_OK);
        attn_kv_cache_free(cache);
    }
    CHECK(rel_l2(logits, logits + T * V, T * V) <= 1e-6);
    attn_lm_free(w);
    attn_kv_cache *cache = NULL;
    c.kv_heads = cfg->n_heads;
    c.head_dim = cfg->emb_dim / cfg->n_heads;
    c.values_are_keys = false;
    CHECK_STATUS(attn_kv_cache_new(ctx, &c, &cache), ATTN_OK);
    CHECK_STATUS(forward(m, cache, ids, 1, 3, false, logits), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "does not fit the model and call (layers 2, batch 1, kv_heads 1, "
                       "head_dim 24: gpt-mla's latent)");
    attn_kv_cache_free(cache);
    attn_lm_free(m);
    free(logits);
}

/* A cache whose values are its keys (gpt-mla's shape of cache) on a model
 * whose values are not: attn_lm_forward and attn_lm_generate refuse it as a
 * cache that does not fit, before the generate resets it, its tokens kept. */
static void check_values_are_keys_refused(attn_ctx *ctx, const attn_lm_config *cfg,
                                          uint64_t seed) {
    attn_lm *m = new_model(ctx, cfg, seed);
    CHECK(m != NULL);
    if (!m) return;
    attn_kv_cache_config c;
    CHECK_STATUS(attn_lm_cache_config(m, 1, 0, &c), ATTN_OK);
    CHECK(!c.values_are_keys);
    attn_kv_cache *good = NULL, *cache = NULL;
    CHECK_STATUS(attn_kv_cache_new(ctx, &c, &good), ATTN_OK);
    c.values_are_keys = true;
    CHECK_STATUS(attn_kv_cache_new(ctx, &c, &cache), ATTN_OK);
    int32_t ids[3] = {1, 2, 3}, out[2] = {-1, -1};
    float *logits = malloc(3 * cfg->vocab_size * sizeof(float));
    CHECK(logits && good && cache);
    if (!logits || !good || !cache) {
        free(logits);
        attn_kv_cache_free(good);
        attn_kv_cache_free(cache);
        attn_lm_free(m);
        return;
    }
    /* its tokens put there by hand: what a refused call must keep */
    const size_t kv = c.kv_heads * c.head_dim;
    float *rows = calloc(2 * kv, sizeof(float));
    size_t two[1] = {2}, len = 0;
    for (size_t l = 0; rows && l < c.num_layers; l++)
        CHECK_STATUS(attn_kv_cache_append(cache, l, two, 0, rows, NULL), ATTN_OK);
    free(rows);
    const char *why = "the cache's values are its keys (values_are_keys), where ";
    CHECK_STATUS(forward(m, cache, ids, 1, 3, false, logits), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "attn_lm_forward: ");
    CHECK_MESSAGE(ctx, why);
    CHECK_MESSAGE(ctx, "'s values are not its keys (attn_lm_cache_config gives its cache)");
    size_t count = 7;
    attn_generate_args g = {.prompt = ids, .prompt_len = 3, .max_new_tokens = 2,
                            .cache = cache, .out = out, .count = &count};
    CHECK_STATUS(attn_lm_generate(m, &g), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "attn_lm_generate: ");
    CHECK_MESSAGE(ctx, why);
    CHECK(count == 0 && out[0] == -1);
    for (size_t l = 0; l < c.num_layers; l++) {
        CHECK_STATUS(attn_kv_cache_length(cache, l, 0, &len), ATTN_OK);
        CHECK(len == 2);
    }
    /* the model's own cache runs */
    CHECK_STATUS(forward(m, good, ids, 1, 3, false, logits), ATTN_OK);
    free(logits);
    attn_kv_cache_free(good);
    attn_kv_cache_free(cache);
    attn_lm_free(m);
}

/* A windowed model: a position past the window no longer moves a windowed
 * layer (the logits of the last token are the same for any token before
 * its window where every layer has one), and a cache without the model's
 * windows is refused. */
static void check_windows(attn_ctx *ctx, const attn_lm_config *cfg, uint64_t seed) {
    attn_lm_config every = *cfg;
    every.sliding_window_stride = 0; /* a window on every layer */
    enum { T = 9 };
    size_t V = cfg->vocab_size;
    int32_t a[T] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, b[T];
    memcpy(b, a, sizeof a);
    b[0] = 11; /* 8 positions before the last: past every window of 3 ... */
    float *la = malloc(V * sizeof(float)), *lb = malloc(V * sizeof(float));
    attn_lm *m = new_model(ctx, &every, seed), *mixed = new_model(ctx, cfg, seed);
    CHECK(m && mixed && la && lb);
    if (m && mixed && la && lb) {
        CHECK_STATUS(forward(m, NULL, a, 1, T, true, la), ATTN_OK);
        CHECK_STATUS(forward(m, NULL, b, 1, T, true, lb), ATTN_OK);
        CHECK(memcmp(la, lb, V * sizeof(float)) == 0);
        /* ... but within layer 2's reach, which has none */
        CHECK_STATUS(forward(mixed, NULL, a, 1, T, true, la), ATTN_OK);
        CHECK_STATUS(forward(mixed, NULL, b, 1, T, true, lb), ATTN_OK);
        CHECK(memcmp(la, lb, V * sizeof(float)) != 0);
        attn_kv_cache_config c;
        attn_kv_cache *cache = NULL;
        CHECK_STATUS(attn_lm_cache_config(mixed, 1, 0, &c), ATTN_OK);
        CHECK(c.windows && c.windows[0] == 3 && c.windows[1] == 3 && c.windows[2] == 0);
        c.windows = NULL;
        CHECK_STATUS(attn_kv_cache_new(ctx, &c, &cache), ATTN_OK);
        CHECK_STATUS(forward(mixed, cache, a, 1, T, true, la), ATTN_ERR_SHAPE);
        CHECK_MESSAGE(ctx, "layer 0 of the cache has window 0, the model's has 3");
        attn_kv_cache_free(cache);
    }
    /* windows at or past context_length (up to SIZE_MAX, past int64) see
     * every position: the logits of the model without windows, bit for
     * bit, with and without a cache */
    attn_lm_config none = *cfg;
    none.sliding_window_size = 0;
    none.sliding_window_stride = 0;
    attn_lm *plain = new_model(ctx, &none, seed);
    float *want = malloc(T * V * sizeof(float)), *got = malloc(T * V * sizeof(float));
    CHECK(plain && want && got);
    const size_t wide[] = {cfg->context_length, (size_t)1 << 63, SIZE_MAX};
    for (size_t i = 0; plain && want && got && i < sizeof wide / sizeof wide[0]; i++) {
        attn_lm_config w = every;
        w.sliding_window_size = wide[i];
        attn_lm *mw = new_model(ctx, &w, seed);
        attn_kv_cache *cache = NULL;
        CHECK(mw != NULL);
        if (!mw) continue;
        CHECK_STATUS(forward(plain, NULL, a, 1, T, false, want), ATTN_OK);
        CHECK_STATUS(forward(mw, NULL, a, 1, T, false, got), ATTN_OK);
        CHECK(memcmp(want, got, T * V * sizeof(float)) == 0);
        CHECK_STATUS(attn_lm_cache_new(mw, 1, 0, ATTN_KV_CONTIGUOUS, 0, &cache), ATTN_OK);
        CHECK_STATUS(forward(mw, cache, a, 1, T, false, got), ATTN_OK);
        CHECK(rel_l2(got, want, T * V) <= 1e-5);
        attn_kv_cache_free(cache);
        attn_lm_free(mw);
    }
    attn_lm_free(plain);
    free(want), free(got);
    attn_lm_free(m);
    attn_lm_free(mixed);
    free(la), free(lb);
}

/* Saved and loaded back: the same logits, bit for bit. */
static void check_save_load(attn_ctx *ctx, const attn_lm_config *cfg, uint64_t seed,
                            bool with_config) {
    char path[] = "/tmp/attn_test_lm_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    close(fd);
    attn_lm *m = new_model(ctx, cfg, seed), *back = NULL;
    CHECK(m != NULL);
    if (!m) return;
    CHECK_STATUS(attn_lm_save(m, path), ATTN_OK);
    CHECK_STATUS(attn_lm_load(ctx, path, NULL, cfg, &back), ATTN_OK);
    if (!with_config) {
        /* GPT-2 from the shapes alone: n_heads = emb_dim / 64 */
        attn_lm *guessed = NULL;
        CHECK_STATUS(attn_lm_load(ctx, path, NULL, NULL, &guessed), ATTN_OK);
        attn_lm_config c = attn_lm_get_config(guessed);
        CHECK(c.n_heads == cfg->emb_dim / 64 && c.n_layers == cfg->n_layers &&
              c.qkv_bias == cfg->qkv_bias && c.context_length == cfg->context_length &&
              c.vocab_size == cfg->vocab_size && !c.tie_embeddings);
        attn_lm_free(guessed);
        attn_lm *none = (attn_lm *)1;
        attn_lm_config l = llama_cfg();
        /* a GPT-2 file with a Llama config */
        CHECK_STATUS(attn_lm_load(ctx, path, NULL, &l, &none), ATTN_ERR_FORMAT);
        CHECK(none == NULL);
    }
    int32_t tokens[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    size_t V = cfg->vocab_size;
    float *a = malloc(9 * V * sizeof(float)), *b = malloc(9 * V * sizeof(float));
    if (!a || !b) abort();
    if (back) {
        CHECK_STATUS(forward(m, NULL, tokens, 1, 9, false, a), ATTN_OK);
        CHECK_STATUS(forward(back, NULL, tokens, 1, 9, false, b), ATTN_OK);
        CHECK(memcmp(a, b, 9 * V * sizeof(float)) == 0);
        attn_lm_config c = attn_lm_get_config(back);
        CHECK(c.n_heads == cfg->n_heads && c.n_layers == cfg->n_layers);
    }
    if (cfg->arch != ATTN_LM_GPT2) {
        /* neither Llama's config nor GQA's heads are in the shapes */
        attn_lm *none = (attn_lm *)1;
        CHECK_STATUS(attn_lm_load(ctx, path, NULL, NULL, &none), ATTN_ERR_INVALID);
        CHECK_MESSAGE(ctx, "pass a config");
        CHECK(none == NULL);
    }
    free(a), free(b);
    attn_lm_free(back);
    attn_lm_free(m);
    unlink(path);
}

#ifdef ATTN_ALLOC_FAILURE_INJECTION
/* Each allocation of the call failed in turn, until the call succeeds. */
static void sweep(attn_ctx *ctx, const attn_lm_config *cfg, uint64_t seed) {
    char path[] = "/tmp/attn_test_lm_sweep_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return;
    close(fd);
    attn_lm *m = new_model(ctx, cfg, seed);
    CHECK(m && attn_lm_save(m, path) == ATTN_OK);
    int32_t tokens[6] = {1, 2, 3, 4, 5, 6};
    size_t V = cfg->vocab_size;
    float *want = malloc(6 * V * sizeof(float)), *got = malloc(6 * V * sizeof(float));
    if (!want || !got || !m) abort();
    CHECK_STATUS(forward(m, NULL, tokens, 2, 3, false, want), ATTN_OK);
    for (int op = 0; op < 3; op++) {
        attn_status st = ATTN_ERR_NO_MEMORY;
        size_t n;
        for (n = 1; st != ATTN_OK && n < 5000; n++) {
            attn_lm *fresh = (attn_lm *)1;
            attn_alloc_fail_at(n);
            if (op == 0) {
                st = attn_lm_new(ctx, cfg, NULL, &fresh);
            } else if (op == 1) {
                st = attn_lm_load(ctx, path, NULL, cfg->arch == ATTN_LM_GPT2 ? NULL : cfg, &fresh);
            } else {
                attn_lm *cold = NULL;
                attn_alloc_fail_at(0);
                if (attn_lm_load(ctx, path, NULL, cfg, &cold) != ATTN_OK) abort();
                attn_alloc_fail_at(n);
                st = forward(cold, NULL, tokens, 2, 3, false, got);
                attn_alloc_fail_at(0);
                if (st != ATTN_OK) {
                    /* usable after the failure */
                    CHECK_STATUS(forward(cold, NULL, tokens, 2, 3, false, got), ATTN_OK);
                }
                CHECK(memcmp(got, want, 6 * V * sizeof(float)) == 0);
                attn_lm_free(cold);
                fresh = NULL;
            }
            attn_alloc_fail_at(0);
            if (st != ATTN_OK) {
                CHECK(st == ATTN_ERR_NO_MEMORY || st == ATTN_ERR_IO);
                CHECK(fresh == NULL);
            } else {
                attn_lm_free(fresh);
            }
        }
        CHECK(st == ATTN_OK);
        printf("allocation sweep, op %d: %zu allocations\n", op, n - 1);
    }
    free(want), free(got);
    attn_lm_free(m);
    unlink(path);
}
#endif

/* A prompt wide enough that the row-wise steps (norms, RoPE, GELU or
 * SwiGLU, residual adds) split its rows over 2 and 3 threads (lm.c: parts
 * of at least 16384 floats): the same logits as one thread, bit for bit. */
static void check_row_split(const attn_lm_config *narrow, attn_kernels kernels, uint64_t seed) {
    attn_lm_config cfg = *narrow;
    cfg.emb_dim = 512;
    cfg.context_length = 64;
    if (cfg.arch == ATTN_LM_LLAMA3) cfg.hidden_dim = 1536;
    enum { B = 2, T = 40 };
    size_t V = cfg.vocab_size;
    int32_t tokens[B * T];
    for (size_t i = 0; i < B * T; i++) tokens[i] = (int32_t)((seed + i * 104729) % V);
    float *base = malloc(B * T * V * sizeof(float)), *other = malloc(B * T * V * sizeof(float));
    if (!base || !other) abort();
    for (size_t threads = 1; threads <= 3; threads++) {
        attn_ctx *ctx = new_ctx(threads, kernels);
        attn_lm *m = ctx ? new_model(ctx, &cfg, seed) : NULL;
        CHECK(m != NULL);
        if (!m) break;
        CHECK_STATUS(forward(m, NULL, tokens, B, T, false, threads == 1 ? base : other), ATTN_OK);
        if (threads > 1) {
            bool same = memcmp(base, other, B * T * V * sizeof(float)) == 0;
            if (!same)
                fprintf(stderr, "%s %s: %zu threads differ from one\n",
                        cfg.arch == ATTN_LM_GPT2 ? "gpt2" : "llama3", attn_kernels_name(kernels),
                        threads);
            CHECK(same);
        }
        attn_lm_free(m);
        attn_ctx_free(ctx);
    }
    free(base);
    free(other);
}

int main(int argc, char **argv) {
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : (uint64_t)time(NULL);
    printf("seed %llu\n", (unsigned long long)seed);
    attn_ctx *ctx = new_ctx(1, ATTN_KERNELS_AUTO);
    if (!ctx) return 1;
    check_config_errors(ctx);
    check_params(ctx);
    const attn_kernels sets[] = {ATTN_KERNELS_REFERENCE, ATTN_KERNELS_PORTABLE,
                                 ATTN_KERNELS_AVX2, ATTN_KERNELS_AVX512};
    for (size_t s = 0; s < sizeof sets / sizeof sets[0]; s++) {
        if (!attn_kernels_supported(sets[s])) continue;
        attn_lm_config g = gpt2_cfg(), l = llama_cfg(), q = gqa_cfg();
        check_forward(&g, sets[s], seed);
        check_forward(&q, sets[s], seed + 5);
        attn_lm_config a = mla_cfg(), w = swa_cfg();
        check_forward(&a, sets[s], seed + 6);
        check_forward(&w, sets[s], seed + 7);
        check_forward(&l, sets[s], seed + 1);
        l.tie_embeddings = true;
        l.n_kv_groups = 1;
        check_forward(&l, sets[s], seed + 2);
        check_row_split(&g, sets[s], seed + 3);
        check_row_split(&l, sets[s], seed + 4);
    }
    attn_lm_config g = gpt2_cfg(), l = llama_cfg(), q = gqa_cfg();
    check_save_load(ctx, &g, seed, false);
    check_save_load(ctx, &q, seed, true);
    q.n_kv_groups = q.n_heads; /* GPT-2's shapes, but out_proj has no bias */
    check_save_load(ctx, &q, seed, true);
    attn_lm_config a = mla_cfg(), w = swa_cfg();
    check_save_load(ctx, &a, seed, true);
    check_latent_cache(ctx, &a, seed);
    attn_lm_config gq = gqa_cfg();
    check_values_are_keys_refused(ctx, &g, seed);
    check_values_are_keys_refused(ctx, &gq, seed);
    check_values_are_keys_refused(ctx, &l, seed);
    check_windows(ctx, &w, seed);
    check_save_load(ctx, &l, seed, true);
#ifdef ATTN_ALLOC_FAILURE_INJECTION
    sweep(ctx, &g, seed);
    sweep(ctx, &l, seed);
#endif
    attn_ctx_free(ctx);
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}
