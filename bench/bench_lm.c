/*
 * bench_lm.c — the whole-model rows of attn-bench's decode section: the
 * book's GPT-2 (124M config, random weights) generating greedily, batch 1,
 * with the contiguous KV cache, next to PyTorch running the book's cached
 * GPTModel (bench/lm_peer.py, in the peers' venv) in the same run.
 *
 * A decode step reads every weight once (about 494 MB: the twelve blocks'
 * 85M parameters and out_head's 38.6M; the embeddings only a row each), so
 * tokens/s times that is the memory bandwidth the step reached.
 */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROMPT_TOKENS 16
#define NEW_TOKENS 64

static const attn_lm_config gpt2_124m = {
    .arch = ATTN_LM_GPT2, .vocab_size = 50257, .context_length = 1024, .emb_dim = 768,
    .n_heads = 12, .n_layers = 12, .qkv_bias = true};

typedef struct lm_times {
    double prefill_s, decode_s;
} lm_times;

/* One greedy generation timed in two parts, as the peer times the book's
 * generate_text_simple_cached: the prompt's prefill, then NEW_TOKENS steps
 * of one token each. */
static attn_status time_generation(attn_ctx *ctx, attn_lm *m, attn_kv_cache *cache,
                                   const int32_t *prompt, size_t new_tokens, float *logits,
                                   lm_times *out) {
    attn_status st = attn_kv_cache_reset(cache);
    if (st != ATTN_OK) return st;
    attn_sampling greedy = {0};
    attn_lm_forward_args fwd = {.cache = cache, .tokens = prompt, .batch = 1,
                                .tokens_per_seq = PROMPT_TOKENS, .last_only = true,
                                .logits = logits};
    double t0 = bench_now();
    if ((st = attn_lm_forward(m, &fwd)) != ATTN_OK) return st;
    double t1 = bench_now();
    int32_t token = 0;
    fwd.tokens = &token;
    fwd.tokens_per_seq = 1;
    for (size_t i = 0; i < new_tokens; i++) {
        if ((st = attn_sample(ctx, logits, gpt2_124m.vocab_size, &greedy, NULL, &token)) != ATTN_OK)
            return st;
        if ((st = attn_lm_forward(m, &fwd)) != ATTN_OK) return st;
    }
    out->prefill_s = t1 - t0;
    out->decode_s = bench_now() - t1;
    return ATTN_OK;
}

/* tokens/s of attn at threads threads (median of runs), or a negative
 * number after printing why not. */
static int measure_attn(size_t threads, size_t runs, double *prefill_ms, double *tokens_per_s) {
    attn_ctx_config cc = {.num_threads = threads};
    attn_ctx *ctx = NULL;
    attn_rng *rng = NULL;
    attn_lm *m = NULL;
    attn_kv_cache *cache = NULL;
    float *logits = malloc(gpt2_124m.vocab_size * sizeof *logits);
    int32_t prompt[PROMPT_TOKENS];
    int rc = -1;
    double prefill[32], decode[32];
    if (runs > 32) runs = 32;
    if (!logits || attn_ctx_new(&cc, &ctx) != ATTN_OK || attn_rng_new(ctx, 123, &rng) != ATTN_OK)
        goto done;
    for (size_t i = 0; i < PROMPT_TOKENS; i++) prompt[i] = (int32_t)((i * 7919u) % 50257u);
    if (attn_lm_new(ctx, &gpt2_124m, rng, &m) != ATTN_OK ||
        attn_lm_cache_new(m, 1, PROMPT_TOKENS + NEW_TOKENS, ATTN_KV_CONTIGUOUS, 0, &cache) != ATTN_OK)
        goto done;
    lm_times t;
    if (time_generation(ctx, m, cache, prompt, 4, logits, &t) != ATTN_OK) goto done; /* warm-up */
    for (size_t r = 0; r < runs; r++) {
        if (time_generation(ctx, m, cache, prompt, NEW_TOKENS, logits, &t) != ATTN_OK) goto done;
        prefill[r] = t.prefill_s;
        decode[r] = t.decode_s;
    }
    *prefill_ms = 1e3 * bench_median(prefill, runs);
    *tokens_per_s = NEW_TOKENS / bench_median(decode, runs);
    rc = 0;
done:
    if (rc != 0) printf("  gpt2-124M: %s\n", ctx ? attn_ctx_last_error(ctx) : "out of memory");
    attn_kv_cache_free(cache);
    attn_lm_free(m);
    attn_rng_free(rng);
    attn_ctx_free(ctx);
    free(logits);
    return rc;
}

/* The peer's "threads=N prefill_ms=P decode_tokens_per_s=R" lines, by
 * thread count; false when the peer could not run. */
static bool run_peer(const bench_options *o, const char *python, double *prefill_ms,
                     double *tokens_per_s) {
    char threads[128] = "", command[1024];
    size_t used = 0;
    for (size_t i = 0; i < o->thread_counts && used < sizeof threads - 24; i++)
        used += (size_t)snprintf(threads + used, sizeof threads - used, "%s%zu", i ? "," : "",
                                 o->threads[i]);
    snprintf(command, sizeof command, "'%s' bench/lm_peer.py --threads %s --runs %zu --prompt %d --new %d",
             python, threads, o->runs, PROMPT_TOKENS, NEW_TOKENS);
    FILE *p = popen(command, "r");
    if (!p) return false;
    char line[512];
    bool any = false;
    while (fgets(line, sizeof line, p)) {
        size_t n;
        double prefill, rate;
        if (sscanf(line, "lm_peer threads=%zu prefill_ms=%lf decode_tokens_per_s=%lf", &n, &prefill,
                   &rate) == 3) {
            for (size_t i = 0; i < o->thread_counts; i++) {
                if (o->threads[i] == n) {
                    prefill_ms[i] = prefill;
                    tokens_per_s[i] = rate;
                    any = true;
                }
            }
        } else if (strncmp(line, "lm_peer", 7) == 0) {
            printf("  %s", line);
        }
    }
    return pclose(p) == 0 && any;
}

int bench_decode_model(const bench_options *o, const char *peer_python) {
    printf("\n== decode: the book's GPT-2 124M (random weights), batch 1, greedy, "
           "%d-token prompt, %d new tokens ==\n",
           PROMPT_TOKENS, NEW_TOKENS);
    double attn_prefill[BENCH_MAX_THREAD_COUNTS] = {0}, attn_rate[BENCH_MAX_THREAD_COUNTS] = {0};
    double peer_prefill[BENCH_MAX_THREAD_COUNTS] = {0}, peer_rate[BENCH_MAX_THREAD_COUNTS] = {0};
    int rc = CLI_OK;
    for (size_t i = 0; i < o->thread_counts; i++)
        if (measure_attn(o->threads[i], o->runs, &attn_prefill[i], &attn_rate[i]) != 0)
            rc = CLI_FAILED;
    bool peer = peer_python && run_peer(o, peer_python, peer_prefill, peer_rate);
    if (!peer) printf("  (PyTorch peer not run: %s)\n", peer_python ? "bench/lm_peer.py failed"
                                                                     : "no peers' python");
    printf("%8s %14s %14s %16s %14s %14s %12s\n", "threads", "attn prefill", "attn tok/s",
           "attn GB/s (wts)", "torch prefill", "torch tok/s", "attn/torch");
    const double weight_bytes = 4.0 * (85.0e6 + 38.6e6);
    for (size_t i = 0; i < o->thread_counts; i++) {
        printf("%8zu %11.2f ms %14.2f %16.1f", o->threads[i], attn_prefill[i], attn_rate[i],
               attn_rate[i] * weight_bytes / 1e9);
        if (peer && peer_rate[i] > 0)
            printf(" %11.2f ms %14.2f %11.2fx\n", peer_prefill[i], peer_rate[i],
                   attn_rate[i] / peer_rate[i]);
        else
            printf(" %14s %14s %12s\n", "-", "-", "-");
    }
    printf("  attn/torch > 1: attn generates faster (tokens/s ratio).\n");
    return rc;
}
