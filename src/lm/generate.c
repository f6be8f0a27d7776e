/*
 * generate.c — token by token, as the book's generate_text_simple with its
 * KV cache (llms-from-scratch kv_cache/generate.py), for one sequence:
 *   prompt (P tokens, cut to its last context_length as the book's
 *   idx[:, -ctx_len:])  --prefill-->  logits of its last token
 *   repeat: token = sample(logits); stop at a stop token (not written);
 *           write it, tell on_token; feed it back (1 token, with the cache)
 * The model sees the prompt and every new token but the last, so the
 * P + max_new_tokens - 1 positions must fit context_length (and the
 * cache): checked before any work, so a run never stops half-way for it.
 */
#include "generate/kv_cache.h"
#include "lm/sample.h"
#include "lm/lm_internal.h"

#include <stdint.h>

static bool is_stop(const attn_generate_args *a, int32_t token) {
    for (size_t i = 0; i < a->num_stop_tokens; i++)
        if (a->stop_tokens[i] == token) return true;
    return false;
}

/* The first of ids[0 .. n) outside [0, vocab), or n. */
static size_t outside_vocabulary(const int32_t *ids, size_t n, size_t vocab) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (size_t)ids[i] >= vocab) return i;
    return n;
}

static attn_status check_args(attn_ctx *ctx, const attn_lm_config *cfg,
                              const attn_generate_args *a) {
    if (!a->out || !a->count || (!a->prompt && a->prompt_len > 0) ||
        (!a->stop_tokens && a->num_stop_tokens > 0))
        return attn_fail(ctx, ATTN_ERR_NULL,
                         "attn_lm_generate: out, count, prompt (prompt_len %zu) and stop_tokens "
                         "(num_stop_tokens %zu) must not be NULL",
                         a->prompt_len, a->num_stop_tokens);
    if (a->prompt_len == 0)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "attn_lm_generate: the prompt is empty (prompt_len 0): at least one "
                         "token is needed");
    size_t at = outside_vocabulary(a->prompt, a->prompt_len, cfg->vocab_size);
    if (at < a->prompt_len)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "attn_lm_generate: prompt[%zu] = %d is not a token id of the "
                         "vocabulary (0 .. %zu)",
                         at, (int)a->prompt[at], cfg->vocab_size - 1);
    /* an id outside the vocabulary is never sampled: a stop it names
     * would never stop the run */
    at = outside_vocabulary(a->stop_tokens, a->num_stop_tokens, cfg->vocab_size);
    if (at < a->num_stop_tokens)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "attn_lm_generate: stop_tokens[%zu] = %d is not a token id of the "
                         "vocabulary (0 .. %zu), so it could never stop the run",
                         at, (int)a->stop_tokens[at], cfg->vocab_size - 1);
    return attn_sampling_check(ctx, "attn_lm_generate", &a->sampling, cfg->vocab_size,
                               a->rng);
}

/* The cache to use, reset: the caller's (checked against the model and the
 * positions the run needs, before the reset) or a new one for them (*own
 * set). */
static attn_status ready_cache(attn_lm *m, attn_ctx *ctx, const attn_generate_args *a,
                               size_t prompt_len, size_t positions, attn_kv_cache **cache,
                               bool *own) {
    *own = false;
    *cache = a->cache;
    if (!a->cache) {
        attn_status st = attn_lm_cache_new(m, 1, positions, ATTN_KV_CONTIGUOUS, 0, cache);
        *own = st == ATTN_OK;
        return st;
    }
    attn_kv_cache_config kc = attn_kv_cache_get_config(a->cache);
    if (kc.batch != 1)
        return attn_fail(ctx, ATTN_ERR_SHAPE,
                         "attn_lm_generate: the cache holds %zu sequences; generate runs one "
                         "(batch 1)",
                         kc.batch);
    /* before the reset: a refused call leaves the caller's cache as it was */
    attn_status st = attn_lm_check_cache(m, "attn_lm_generate", a->cache, 1);
    if (st != ATTN_OK) return st;
    if (kc.max_len < positions)
        return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                         "attn_lm_generate: the cache holds %zu tokens, but the prompt (%zu "
                         "tokens) and max_new_tokens %zu need %zu",
                         kc.max_len, positions + 1 - a->max_new_tokens, a->max_new_tokens,
                         positions);
    /* a paged pool too small for the run would fail it half-way, the
     * cache reset and tokens written */
    for (size_t l = 0; l < kc.num_layers; l++) {
        size_t need, have;
        attn_kv_cache_run_pages(a->cache, l, 0, prompt_len, positions, &need, &have);
        if (need > have)
            return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                             "attn_lm_generate: the page pool of layer %zu is out of pages: the "
                             "prompt (%zu tokens) and max_new_tokens %zu need %zu pages of %zu "
                             "tokens, the pool holds %zu",
                             l, prompt_len, a->max_new_tokens, need, kc.page_size, have);
    }
    return attn_lm_cache_status(ctx, a->cache, attn_kv_cache_reset(a->cache));
}

/* Feeds tokens (n of them) through m with the cache; logits receive the
 * last one's. */
static attn_status feed(attn_lm *m, attn_kv_cache *cache, const int32_t *tokens, size_t n,
                        float *logits) {
    attn_lm_forward_args f = {.cache = cache, .tokens = tokens, .batch = 1,
                              .tokens_per_seq = n, .last_only = true, .logits = logits};
    return attn_lm_forward(m, &f);
}

/* The loop, once the cache is ready: prompt -> logits -> tokens. */
static attn_status run(attn_lm *m, attn_ctx *ctx, const attn_generate_args *a,
                       const int32_t *prompt, size_t prompt_len, attn_kv_cache *cache,
                       float *logits, void *scratch, size_t vocab_size) {
    attn_status st = feed(m, cache, prompt, prompt_len, logits);
    for (size_t step = 0; st == ATTN_OK && step < a->max_new_tokens; step++) {
        int32_t token;
        st = attn_sample_into(ctx, logits, vocab_size, &a->sampling, a->rng, scratch, &token);
        if (st != ATTN_OK || is_stop(a, token)) break;
        a->out[step] = token;
        *a->count = step + 1;
        if (a->on_token && !a->on_token(a->user, token)) break;
        if (step + 1 < a->max_new_tokens) st = feed(m, cache, &token, 1, logits);
    }
    return st;
}

attn_status attn_lm_generate(attn_lm *m, const attn_generate_args *a) {
    if (!m) return ATTN_ERR_NULL;
    attn_ctx *ctx = m->ctx;
    attn_clear_error(ctx);
    if (!a) return attn_fail(ctx, ATTN_ERR_NULL, "attn_lm_generate: args is NULL");
    if (a->count) *a->count = 0;
    attn_lm_config cfg = attn_lm_get_config(m);
    attn_status st = check_args(ctx, &cfg, a);
    if (st != ATTN_OK || a->max_new_tokens == 0) return st;

    /* the book's idx[:, -ctx_len:] */
    size_t prompt_len = a->prompt_len < cfg.context_length ? a->prompt_len : cfg.context_length;
    const int32_t *prompt = a->prompt + (a->prompt_len - prompt_len);
    size_t positions = prompt_len + a->max_new_tokens - 1;
    if (positions < prompt_len || positions > cfg.context_length) {
        /* the caller's lengths, as given, and what fits */
        size_t fits = cfg.context_length - prompt_len + 1;
        if (a->prompt_len > prompt_len)
            return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                             "attn_lm_generate: the prompt (%zu tokens, cut to its last %zu) "
                             "and max_new_tokens %zu do not fit the model's context_length "
                             "%zu: at most %zu new tokens do",
                             a->prompt_len, prompt_len, a->max_new_tokens, cfg.context_length,
                             fits);
        return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                         "attn_lm_generate: the prompt (%zu tokens) and max_new_tokens %zu do "
                         "not fit the model's context_length %zu: at most %zu new tokens do",
                         a->prompt_len, a->max_new_tokens, cfg.context_length, fits);
    }

    float *logits = attn_alloc_floats(cfg.vocab_size);
    void *scratch = NULL;
    if (a->sampling.temperature > 0.0) {
        size_t bytes = attn_sample_scratch_bytes(cfg.vocab_size);
        scratch = bytes ? attn_malloc(bytes) : NULL;
    }
    if (!logits || (a->sampling.temperature > 0.0 && !scratch)) {
        attn_free(logits);
        attn_free(scratch);
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY,
                         "attn_lm_generate: no memory for the logits of %zu tokens",
                         cfg.vocab_size);
    }
    attn_kv_cache *cache;
    bool own_cache;
    st = ready_cache(m, ctx, a, prompt_len, positions, &cache, &own_cache);
    if (st == ATTN_OK)
        st = run(m, ctx, a, prompt, prompt_len, cache, logits, scratch, cfg.vocab_size);
    if (own_cache) attn_kv_cache_free(cache);
    attn_free(logits);
    attn_free(scratch);
    return st;
}
