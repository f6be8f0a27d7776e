/*
 * ab_attention.c — two or more builds of libattn.so timed against each other
 * in one process: each build is dlopen'ed on its own, and their calls
 * alternate round by round on the same tensors, so that a host whose speed
 * drifts within minutes (a shared virtual machine's does) moves them
 * alike. A kernel change that keeps the bits shows the same hash of the
 * outputs for every build. Only include/attn.h's API is called, so that an
 * old build and a new one load side by side.
 *
 *   ab_attention [options] OLD.so NEW.so [MORE.so ...]
 *     --tokens T    sequence length, queries and keys (default 1024)
 *     --heads H     query heads (12), --kv-heads (H: one per query head),
 *                   --head-dim D (64), --batch B (1)
 *     --causal      causal (top-left; default none)
 *     --window W    a sliding window: query i sees keys i - W + 1 .. i + W - 1
 *                   (window_left = window_right = W - 1; with --causal the
 *                   book's sliding_window_size W); with --decode or
 *                   --prefill, a cache layer that keeps its last W tokens
 *     --softcap C   softcap C (Gemma 2); --alibi: ALiBi slopes 2^(-8 (h + 1) / H);
 *     --sinks       one sink logit per head, 0.5 (gpt-oss)
 *     --varlen      cu_seqlens: the B sequences packed, sequence b of
 *                   T - b * T / (2B) tokens (T the longest), layout bthd
 *     --threads N   the ctx's threads (1)
 *     --rounds R    timed rounds of each build (21), after one warm-up
 *     --mode M      fwd, fwdbwd or bwd (the backward alone; its forward
 *                   runs untimed before it)
 *     --layout L    peers: q, k, v (B, H, T, D), out and dout (B, T, H, D),
 *                   as bench/peers.py gives PyTorch's tensors (default);
 *                   bthd: every tensor (B, T, H, D), as the modules' are
 *   and instead of attn_sdpa_forward / attn_sdpa_backward on floats:
 *     --layer       the GPT-2 attention layer (attn_gpt2: projections, the
 *                   causal attention through the module's own workspace)
 *                   of n_embd H x D
 *     --bf16        attn_sdpa_forward_16 / attn_sdpa_backward_16 on bf16
 *                   tensors (the float inputs rounded to nearest even),
 *                   with the process's AMX tiles asked for first
 *                   (attn_cpu_request_amx), as bench/peers.py does
 *     --f64         attn_sdpa_forward_f64 / attn_sdpa_backward_f64 on double
 *                   tensors (the float inputs widened; reference loops, so
 *                   keep T small)
 *     --decode L    a KV cache of one layer (attn_kv_cache_*) of B sequences
 *                   holding L positions of random K and V, appended untimed
 *                   in chunks; the timed call is one attn_kv_cache_attend of
 *                   one new token per sequence (q heads H, KV heads
 *                   --kv-heads, head_dim D). Attend appends that token, so
 *                   before every round the cache is reset and refilled to L
 *                   (untimed): every round, of every build, is the same call
 *     --prefill N   attend N new tokens per sequence instead of one (alone:
 *                   on an empty cache, the prompt's path)
 *     --paged       the cache's paged layout, --page-size P tokens (16);
 *                   else contiguous
 *     --kv-dtype T  the cache's K and V type: f32 (default), bf16, f16,
 *                   fp8, int8 or int4
 *                   (with --decode and --prefill the AMX tiles are asked
 *                   for, as with --bf16: bf16 keys are scored on them)
 *
 * Prints, per build, the median and the fastest round in ms and the first
 * build's over this one's (above 1: this build is faster), and a hash of
 * the last round's out, dq, dk and dv (with --layer: y and dx; with --bf16
 * and --f64: their bits; with --decode and --prefill: out). Inputs are
 * uniform in [-1, 1] from a fixed seed, as are the layer's weights (attn_rng
 * seed 1).
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */
#include "attn.h"

#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_BUILDS 8

typedef attn_status (*ctx_new_fn)(const attn_ctx_config *, attn_ctx **);
typedef void (*ctx_free_fn)(attn_ctx *);
typedef const char *(*last_error_fn)(const attn_ctx *);
typedef attn_status (*forward_fn)(attn_ctx *, const attn_sdpa_config *, const float *,
                                  const float *, const float *, float *, float *, attn_rng *,
                                  attn_sdpa_dropout *);
typedef attn_status (*backward_fn)(attn_ctx *, const attn_sdpa_config *, const float *,
                                   const float *, const float *, const float *, const float *,
                                   const float *, float *, float *, float *,
                                   const attn_sdpa_dropout *);

typedef attn_status (*forward16_fn)(attn_ctx *, const attn_sdpa_config *, attn_dtype,
                                    const void *, const void *, const void *, void *, float *,
                                    attn_rng *, attn_sdpa_dropout *);
typedef attn_status (*backward16_fn)(attn_ctx *, const attn_sdpa_config *, attn_dtype,
                                     const void *, const void *, const void *, const void *,
                                     const float *, const void *, void *, void *, void *,
                                     const attn_sdpa_dropout *);
typedef attn_status (*request_amx_fn)(void);

typedef attn_status (*forward64_fn)(attn_ctx *, const attn_sdpa_config *, const double *,
                                    const double *, const double *, double *, double *,
                                    attn_rng *, attn_sdpa_dropout *);
typedef attn_status (*backward64_fn)(attn_ctx *, const attn_sdpa_config *, const double *,
                                     const double *, const double *, const double *,
                                     const double *, const double *, double *, double *,
                                     double *, const attn_sdpa_dropout *);

typedef attn_status (*rng_new_fn)(attn_ctx *, uint64_t, attn_rng **);
typedef void (*rng_free_fn)(attn_rng *);
typedef attn_status (*layer_new_fn)(attn_ctx *, const attn_gpt2_config *, attn_rng *,
                                    attn_gpt2 **);
typedef attn_status (*layer_forward_fn)(attn_gpt2 *, const float *, size_t, size_t, float *,
                                        attn_rng *);
typedef attn_status (*layer_backward_fn)(attn_gpt2 *, const float *, size_t, size_t, float *);
typedef void (*layer_free_fn)(attn_gpt2 *);

typedef attn_status (*cache_new_fn)(attn_ctx *, const attn_kv_cache_config *, attn_kv_cache **);
typedef void (*cache_free_fn)(attn_kv_cache *);
typedef attn_status (*cache_reset_fn)(attn_kv_cache *);
typedef attn_status (*cache_append_fn)(attn_kv_cache *, size_t, const size_t *, size_t,
                                       const float *, const float *);
typedef attn_status (*cache_attend_fn)(attn_kv_cache *, const attn_kv_attend_args *);

/* The call each round times. */
typedef enum path { PATH_F32, PATH_BF16, PATH_F64, PATH_LAYER, PATH_CACHE } path;

typedef struct build {
    const char *path;
    void *handle;
    attn_ctx *ctx;
    ctx_free_fn ctx_free;
    last_error_fn last_error;
    forward_fn forward;
    backward_fn backward;
    forward16_fn forward16;
    backward16_fn backward16;
    forward64_fn forward64;
    backward64_fn backward64;
    attn_gpt2 *layer; /* with --layer */
    layer_forward_fn layer_forward;
    layer_backward_fn layer_backward;
    layer_free_fn layer_free;
    attn_kv_cache *cache; /* with --decode, --prefill */
    cache_free_fn cache_free;
    cache_reset_fn cache_reset;
    cache_append_fn cache_append;
    cache_attend_fn cache_attend;
    double *ms; /* per round */
    uint64_t hash;
} build;

/* The tensors of the SDPA paths, each path's in its own element type. */
enum { Q, K, V, OUT, DOUT, DQ, DK, DV, LSE, NUM_TENSORS };

/* What every build runs: the same call on the same tensors. */
typedef struct job {
    path path;
    int forward, backward;
    size_t batch, tokens;           /* the layer's x */
    attn_sdpa_config cfg;
    size_t size[NUM_TENSORS];       /* elements of each tensor */
    float *f[NUM_TENSORS];          /* floats; the cache's q, k_new, v_new and out too */
    uint16_t *h[NUM_TENSORS];       /* --bf16: q .. dv; lse stays float (f[LSE]) */
    double *d[NUM_TENSORS];         /* --f64 */
    size_t cached;                  /* --decode: positions in the cache before the call */
    float *k_cached, *v_cached;     /* (B, cached, kv_heads, head_dim) */
    attn_kv_attend_args attend;
} job;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* FNV-1a over size bytes of x, continued from h. */
static uint64_t hash_bytes(uint64_t h, const void *x, size_t size) {
    const unsigned char *c = (const unsigned char *)x;
    for (size_t i = 0; i < size; i++) h = (h ^ c[i]) * 1099511628211ull;
    return h;
}

static uint64_t hash_bits(uint64_t h, const uint16_t *x, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ x[i]) * 1099511628211ull;
    return h;
}

/* x rounded to bf16, to nearest even (the inputs are finite). */
static void to_bf16(const float *x, size_t n, uint16_t *out) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        out[i] = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    }
}

/* n values uniform in [-1, 1] from the xorshift64 state. */
static void fill_uniform(uint64_t *state, float *x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        x[i] = (float)((double)(*state >> 11) / (double)(1ull << 52) - 1.0);
    }
}

static void *symbol(build *b, const char *name) {
    return dlsym(b->handle, name);
}

/* The layer of cfg in build b, its weights from attn_rng seed 1. */
static int load_layer(build *b, const attn_gpt2_config *cfg) {
    rng_new_fn rng_new = (rng_new_fn)(uintptr_t)symbol(b, "attn_rng_new");
    rng_free_fn rng_free = (rng_free_fn)(uintptr_t)symbol(b, "attn_rng_free");
    layer_new_fn layer_new = (layer_new_fn)(uintptr_t)symbol(b, "attn_gpt2_new");
    b->layer_forward = (layer_forward_fn)(uintptr_t)symbol(b, "attn_gpt2_forward");
    b->layer_backward = (layer_backward_fn)(uintptr_t)symbol(b, "attn_gpt2_backward");
    b->layer_free = (layer_free_fn)(uintptr_t)symbol(b, "attn_gpt2_free");
    attn_rng *rng = NULL;
    if (!rng_new || !rng_free || !layer_new || !b->layer_forward || !b->layer_backward ||
        !b->layer_free || rng_new(b->ctx, 1, &rng) != ATTN_OK) {
        fprintf(stderr, "ab_attention: %s lacks the GPT-2 layer's API\n", b->path);
        return 1;
    }
    attn_status st = layer_new(b->ctx, cfg, rng, &b->layer);
    rng_free(rng);
    if (st != ATTN_OK) {
        fprintf(stderr, "ab_attention: %s made no layer: %s\n", b->path, b->last_error(b->ctx));
        return 1;
    }
    return 0;
}

/* The KV cache of cfg in build b. */
static int load_cache(build *b, const attn_kv_cache_config *cfg) {
    cache_new_fn cache_new = (cache_new_fn)(uintptr_t)symbol(b, "attn_kv_cache_new");
    b->cache_free = (cache_free_fn)(uintptr_t)symbol(b, "attn_kv_cache_free");
    b->cache_reset = (cache_reset_fn)(uintptr_t)symbol(b, "attn_kv_cache_reset");
    b->cache_append = (cache_append_fn)(uintptr_t)symbol(b, "attn_kv_cache_append");
    b->cache_attend = (cache_attend_fn)(uintptr_t)symbol(b, "attn_kv_cache_attend");
    if (!cache_new || !b->cache_free || !b->cache_reset || !b->cache_append ||
        !b->cache_attend) {
        fprintf(stderr, "ab_attention: %s lacks the KV cache's API\n", b->path);
        return 1;
    }
    if (cache_new(b->ctx, cfg, &b->cache) != ATTN_OK) {
        fprintf(stderr, "ab_attention: %s made no KV cache: %s\n", b->path,
                b->last_error(b->ctx));
        return 1;
    }
    return 0;
}

static int load(build *b, size_t threads, path p) {
    b->handle = dlopen(b->path, RTLD_NOW | RTLD_LOCAL);
    if (!b->handle) {
        fprintf(stderr, "ab_attention: %s\n", dlerror());
        return 1;
    }
    ctx_new_fn ctx_new = (ctx_new_fn)(uintptr_t)symbol(b, "attn_ctx_new");
    b->ctx_free = (ctx_free_fn)(uintptr_t)symbol(b, "attn_ctx_free");
    b->last_error = (last_error_fn)(uintptr_t)symbol(b, "attn_ctx_last_error");
    b->forward = (forward_fn)(uintptr_t)symbol(b, "attn_sdpa_forward");
    b->backward = (backward_fn)(uintptr_t)symbol(b, "attn_sdpa_backward");
    b->forward16 = (forward16_fn)(uintptr_t)symbol(b, "attn_sdpa_forward_16");
    b->backward16 = (backward16_fn)(uintptr_t)symbol(b, "attn_sdpa_backward_16");
    b->forward64 = (forward64_fn)(uintptr_t)symbol(b, "attn_sdpa_forward_f64");
    b->backward64 = (backward64_fn)(uintptr_t)symbol(b, "attn_sdpa_backward_f64");
    attn_ctx_config config = {.num_threads = threads};
    if (!ctx_new || !b->ctx_free || !b->last_error || !b->forward || !b->backward ||
        ctx_new(&config, &b->ctx) != ATTN_OK) {
        fprintf(stderr, "ab_attention: %s lacks the attn API or made no ctx\n", b->path);
        return 1;
    }
    if ((p == PATH_BF16 && (!b->forward16 || !b->backward16)) ||
        (p == PATH_F64 && (!b->forward64 || !b->backward64))) {
        fprintf(stderr, "ab_attention: %s has no attn_sdpa_*_%s\n", b->path,
                p == PATH_BF16 ? "16" : "f64");
        return 1;
    }
    return 0;
}

/* Every sequence of x's cache back to the job's cached positions, appended
 * in chunks of at most 512 tokens, one sequence at a time. */
static attn_status refill(build *x, const job *j) {
    attn_status st = x->cache_reset(x->cache);
    size_t B = j->cfg.batch, row = j->cfg.kv_heads * j->cfg.head_dim, chunk = 512;
    size_t *new_lens = calloc(B, sizeof *new_lens);
    if (!new_lens) return ATTN_ERR_NO_MEMORY;
    for (size_t s = 0; s < B && st == ATTN_OK; s++)
        for (size_t t = 0; t < j->cached && st == ATTN_OK; t += chunk) {
            size_t at = (s * j->cached + t) * row;
            new_lens[s] = j->cached - t < chunk ? j->cached - t : chunk;
            st = x->cache_append(x->cache, 0, new_lens, 0, j->k_cached + at, j->v_cached + at);
            new_lens[s] = 0;
        }
    free(new_lens);
    return st;
}

/* One round of build x: its untimed setup, then the timed call, its time
 * into *ms. */
static attn_status run_round(build *x, const job *j, double *ms) {
    const attn_sdpa_config *cfg = &j->cfg;
    float *const *f = j->f;
    attn_status st = ATTN_OK;
    double t0 = 0.0;
    switch (j->path) {
    case PATH_LAYER: /* x = q and dy = dout, (B, T, H x D); y into out, dx into dq */
        if (!j->forward) st = x->layer_forward(x->layer, f[Q], j->batch, j->tokens, f[OUT], NULL);
        t0 = now_ms();
        if (j->forward && st == ATTN_OK)
            st = x->layer_forward(x->layer, f[Q], j->batch, j->tokens, f[OUT], NULL);
        if (j->backward && st == ATTN_OK)
            st = x->layer_backward(x->layer, f[DOUT], j->batch, j->tokens, f[DQ]);
        break;
    case PATH_BF16: {
        const attn_dtype bf = ATTN_DTYPE_BF16;
        uint16_t *const *h = j->h;
        if (!j->forward)
            st = x->forward16(x->ctx, cfg, bf, h[Q], h[K], h[V], h[OUT], f[LSE], NULL, NULL);
        t0 = now_ms();
        if (j->forward && st == ATTN_OK)
            st = x->forward16(x->ctx, cfg, bf, h[Q], h[K], h[V], h[OUT], f[LSE], NULL, NULL);
        if (j->backward && st == ATTN_OK)
            st = x->backward16(x->ctx, cfg, bf, h[Q], h[K], h[V], h[OUT], f[LSE], h[DOUT], h[DQ],
                               h[DK], h[DV], NULL);
        break;
    }
    case PATH_F64: {
        double *const *d = j->d;
        if (!j->forward)
            st = x->forward64(x->ctx, cfg, d[Q], d[K], d[V], d[OUT], d[LSE], NULL, NULL);
        t0 = now_ms();
        if (j->forward && st == ATTN_OK)
            st = x->forward64(x->ctx, cfg, d[Q], d[K], d[V], d[OUT], d[LSE], NULL, NULL);
        if (j->backward && st == ATTN_OK)
            st = x->backward64(x->ctx, cfg, d[Q], d[K], d[V], d[OUT], d[LSE], d[DOUT], d[DQ],
                               d[DK], d[DV], NULL);
        break;
    }
    case PATH_CACHE:
        st = refill(x, j);
        t0 = now_ms();
        if (st == ATTN_OK) st = x->cache_attend(x->cache, &j->attend);
        break;
    case PATH_F32:
        if (!j->forward)
            st = x->forward(x->ctx, cfg, f[Q], f[K], f[V], f[OUT], f[LSE], NULL, NULL);
        t0 = now_ms();
        if (j->forward && st == ATTN_OK)
            st = x->forward(x->ctx, cfg, f[Q], f[K], f[V], f[OUT], f[LSE], NULL, NULL);
        if (j->backward && st == ATTN_OK)
            st = x->backward(x->ctx, cfg, f[Q], f[K], f[V], f[OUT], f[LSE], f[DOUT], f[DQ], f[DK],
                             f[DV], NULL);
        break;
    }
    *ms = now_ms() - t0;
    return st;
}

/* The hash of the outputs the last call left. */
static uint64_t hash_outputs(const job *j) {
    uint64_t h = 1469598103934665603ull;
    const size_t *n = j->size;
    switch (j->path) {
    case PATH_BF16:
        h = hash_bits(h, j->h[OUT], n[OUT]);
        for (int t = DQ; t <= DV && j->backward; t++) h = hash_bits(h, j->h[t], n[t]);
        return h;
    case PATH_F64:
        h = hash_bytes(h, j->d[OUT], n[OUT] * sizeof(double));
        for (int t = DQ; t <= DV && j->backward; t++)
            h = hash_bytes(h, j->d[t], n[t] * sizeof(double));
        return h;
    case PATH_LAYER:
        h = hash_bytes(h, j->f[OUT], n[OUT] * sizeof(float));
        return j->backward ? hash_bytes(h, j->f[DQ], n[DQ] * sizeof(float)) : h;
    case PATH_CACHE:
        return hash_bytes(h, j->f[OUT], n[OUT] * sizeof(float));
    case PATH_F32:
        break;
    }
    h = hash_bytes(h, j->f[OUT], n[OUT] * sizeof(float));
    for (int t = DQ; t <= DV && j->backward; t++) h = hash_bytes(h, j->f[t], n[t] * sizeof(float));
    return h;
}

static void print_job(const job *j, size_t threads, size_t rounds, int peers_layout,
                      int paged, size_t page_size, size_t window, const char *kv_dtype) {
    const attn_sdpa_config *c = &j->cfg;
    const char *mode = !j->forward ? "backward alone"
                       : j->backward ? "forward+backward"
                                     : "forward";
    const char *plural = threads == 1 ? "" : "s";
    if (j->path == PATH_LAYER) {
        printf("GPT-2 layer B=%zu T=%zu n_embd=%zu n_head=%zu, %zu thread%s, %s, %zu rounds\n",
               j->batch, j->tokens, c->heads * c->head_dim, c->heads, threads, plural, mode,
               rounds);
        return;
    }
    if (j->path == PATH_CACHE) {
        printf("KV cache B=%zu L=%zu new=%zu Hq=%zu Hkv=%zu hd=%zu, %s", c->batch, j->cached,
               j->attend.new_tokens, c->heads, c->kv_heads, c->head_dim,
               paged ? "paged" : "contiguous");
        if (paged) printf(" (page %zu)", page_size);
        printf(", K and V %s", kv_dtype);
        if (window) printf(", window %zu", window);
        printf(", %zu thread%s, %zu rounds\n", threads, plural, rounds);
        return;
    }
    printf("B=%zu T=%zu H=%zu Hkv=%zu hd=%zu %s", c->batch, c->q_tokens, c->heads, c->kv_heads,
           c->head_dim, c->causal ? "causal" : "no mask");
    if (window) printf(" window %zu", window);
    if (c->cu_seqlens_q) printf(" varlen");
    if (c->softcap > 0.0) printf(" softcap %g", c->softcap);
    if (c->alibi_slopes) printf(" alibi");
    if (c->sinks) printf(" sinks");
    printf(", %zu thread%s, %s%s, %zu rounds, layout %s\n", threads, plural,
           j->path == PATH_BF16  ? "bf16 "
           : j->path == PATH_F64 ? "f64 "
                                 : "",
           mode, rounds, peers_layout ? "peers" : "bthd");
}

static int usage(void) {
    fprintf(stderr, "usage: ab_attention [--tokens T] [--heads H] [--kv-heads HKV] "
                    "[--head-dim D] [--batch B] [--causal] [--window W] [--softcap C] [--alibi] "
                    "[--sinks] [--varlen] "
                    "[--threads N] [--rounds R] [--mode fwd|fwdbwd|bwd] [--layout peers|bthd] "
                    "[--layer | --bf16 | --f64 | [--decode L] [--prefill N] [--paged] [--kv-dtype T] "
                    "[--page-size P]] OLD.so NEW.so [MORE.so ...]\n");
    return 2;
}

int main(int argc, char **argv) {
    size_t T = 1024, H = 12, HKV = 0, B = 1, D = 64, threads = 1, rounds = 21, count = 0;
    size_t window = 0, cached = 0, new_rows = 0, page_size = 16;
    int causal = 0, peers_layout = 1, varlen = 0, paged = 0, cache = 0, paths = 0, mode = 0;
    int alibi = 0, sinks = 0;
    double softcap = 0.0;
    const char *kv_dtype = "f32";
    job j = {.path = PATH_F32, .forward = 1};
    build builds[MAX_BUILDS] = {{0}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--causal")) causal = 1;
        else if (!strcmp(a, "--varlen")) varlen = 1;
        else if (!strcmp(a, "--alibi")) alibi = 1;
        else if (!strcmp(a, "--sinks")) sinks = 1;
        else if (!strcmp(a, "--paged")) paged = 1;
        else if (!strcmp(a, "--layer")) j.path = PATH_LAYER, paths++;
        else if (!strcmp(a, "--bf16")) j.path = PATH_BF16, paths++;
        else if (!strcmp(a, "--f64")) j.path = PATH_F64, paths++;
        else if (a[0] == '-' && a[1] == '-' && !value) return usage();
        else if (!strcmp(a, "--tokens")) T = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(a, "--heads")) H = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(a, "--kv-heads")) HKV = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(a, "--batch")) B = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(a, "--head-dim")) D = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(a, "--threads")) threads = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(a, "--rounds")) rounds = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(a, "--window")) window = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(a, "--softcap")) softcap = strtod(argv[++i], NULL);
        else if (!strcmp(a, "--decode")) cached = strtoul(argv[++i], NULL, 10), cache = 1;
        else if (!strcmp(a, "--prefill")) new_rows = strtoul(argv[++i], NULL, 10), cache = 1;
        else if (!strcmp(a, "--page-size")) page_size = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(a, "--kv-dtype")) kv_dtype = argv[++i];
        else if (!strcmp(a, "--mode")) {
            i++;
            if (strcmp(value, "fwd") && strcmp(value, "fwdbwd") && strcmp(value, "bwd"))
                return usage();
            j.forward = strcmp(value, "bwd") != 0;
            j.backward = strcmp(value, "fwd") != 0;
            mode = 1;
        } else if (!strcmp(a, "--layout")) {
            i++;
            peers_layout = !strcmp(value, "peers");
            if (!peers_layout && strcmp(value, "bthd")) return usage();
        } else if (a[0] == '-') return usage();
        else if (count < MAX_BUILDS) builds[count++].path = a;
        else return usage();
    }
    if (HKV == 0) HKV = H;
    if (cache) {
        j.path = PATH_CACHE;
        paths++;
        if (new_rows == 0) new_rows = 1;
    }
    if (count < 2 || T == 0 || H == 0 || D == 0 || B == 0 || H % HKV || threads == 0 ||
        rounds == 0 || paths > 1 || page_size == 0 || (paged && !cache) ||
        (cache && (mode || varlen)) || (varlen && j.path == PATH_LAYER) ||
        (window && j.path == PATH_LAYER))
        return usage();
    if (varlen) peers_layout = 0; /* packed rows: (total, H, D) */
    static const struct {
        const char *name;
        attn_dtype dtype;
    } kv_types[] = {{"f32", ATTN_DTYPE_F32}, {"bf16", ATTN_DTYPE_BF16}, {"f16", ATTN_DTYPE_F16},
                    {"fp8", ATTN_DTYPE_F8_E4M3}, {"int8", ATTN_DTYPE_I8}, {"int4", ATTN_DTYPE_I4}};
    attn_dtype kv_type = ATTN_DTYPE_F32;
    size_t kv_known = 0;
    for (size_t t = 0; t < sizeof kv_types / sizeof kv_types[0]; t++)
        if (!strcmp(kv_dtype, kv_types[t].name)) kv_type = kv_types[t].dtype, kv_known = 1;
    if (!kv_known || (strcmp(kv_dtype, "f32") && !cache)) return usage();

    /* the sizes; varlen packs the sequences, T the longest */
    j.batch = B;
    j.tokens = T;
    int32_t *cu_seqlens = NULL;
    size_t rows = B * T; /* query (and key) rows of all sequences */
    if (varlen) {
        if (!(cu_seqlens = malloc((B + 1) * sizeof *cu_seqlens))) return 1;
        cu_seqlens[0] = 0;
        for (size_t b = 0; b < B; b++)
            cu_seqlens[b + 1] = cu_seqlens[b] + (int32_t)(T - b * T / (2 * B));
        rows = (size_t)cu_seqlens[B];
    }
    if (cache) rows = B * new_rows;
    size_t n = rows * H * D, nk = rows * HKV * D;
    size_t sizes[NUM_TENSORS] = {n, nk, nk, n, n, n, nk, nk, (cache ? B * new_rows : rows) * H};
    memcpy(j.size, sizes, sizeof sizes);
    for (int t = 0; t < NUM_TENSORS; t++)
        if (!(j.f[t] = malloc(j.size[t] * sizeof(float)))) return 1;
    uint64_t state = 0x9E3779B97F4A7C15ull; /* xorshift64: inputs uniform in [-1, 1] */
    const int inputs[4] = {Q, K, V, DOUT};
    for (int t = 0; t < 4; t++) fill_uniform(&state, j.f[inputs[t]], j.size[inputs[t]]);
    if (j.path == PATH_BF16) {
        for (int t = Q; t <= DV; t++)
            if (!(j.h[t] = malloc(j.size[t] * sizeof(uint16_t)))) return 1;
        for (int t = 0; t < 4; t++) to_bf16(j.f[inputs[t]], j.size[inputs[t]], j.h[inputs[t]]);
    }
    if (j.path == PATH_F64) {
        for (int t = 0; t < NUM_TENSORS; t++)
            if (!(j.d[t] = malloc(j.size[t] * sizeof(double)))) return 1;
        for (int t = 0; t < 4; t++)
            for (size_t i = 0; i < j.size[inputs[t]]; i++)
                j.d[inputs[t]][i] = j.f[inputs[t]][i];
    }
    if (cache) {
        j.cached = cached;
        size_t nc = B * cached * HKV * D;
        j.k_cached = malloc((nc + 1) * sizeof(float));
        j.v_cached = malloc((nc + 1) * sizeof(float));
        if (!j.k_cached || !j.v_cached) return 1;
        fill_uniform(&state, j.k_cached, nc);
        fill_uniform(&state, j.v_cached, nc);
        j.attend = (attn_kv_attend_args){.layer = 0, .new_tokens = new_rows, .q_heads = H,
                                         .q = j.f[Q], .k_new = j.f[K], .v_new = j.f[V],
                                         .out = j.f[OUT]};
    }

    j.cfg = (attn_sdpa_config){.batch = B, .heads = H, .kv_heads = HKV, .q_tokens = T,
                               .kv_tokens = T, .head_dim = D, .causal = causal,
                               .align = ATTN_ALIGN_TOP_LEFT};
    if (window) {
        j.cfg.window = true;
        j.cfg.window_left = j.cfg.window_right = (long long)window - 1;
    }
    if (varlen) j.cfg.cu_seqlens_q = j.cfg.cu_seqlens_kv = cu_seqlens;
    j.cfg.softcap = softcap;
    if (alibi || sinks) {
        float *per_head = calloc(3 * H, sizeof *per_head);
        if (!per_head) return 1;
        for (size_t h = 0; h < H; h++) {
            per_head[h] = (float)pow(2.0, -8.0 * (double)(h + 1) / (double)H);
            per_head[H + h] = 0.5f;
        }
        if (alibi) j.cfg.alibi_slopes = per_head;
        if (sinks) {
            j.cfg.sinks = per_head + H;
            j.cfg.sinks_grad = per_head + 2 * H;
        }
    }
    if (peers_layout) {
        size_t bhtd[3] = {H * T * D, D, T * D}, bthd[3] = {T * H * D, H * D, D};
        size_t kv_bhtd[3] = {HKV * T * D, D, T * D};
        memcpy(j.cfg.q_strides, bhtd, sizeof bhtd);
        memcpy(j.cfg.kv_strides, kv_bhtd, sizeof kv_bhtd);
        memcpy(j.cfg.out_strides, bthd, sizeof bthd);
    }
    attn_gpt2_config layer_cfg = {.n_embd = H * D, .n_head = H, .block_size = T};
    attn_kv_cache_config cache_cfg = {.num_layers = 1, .batch = B, .kv_heads = HKV,
                                      .head_dim = D, .max_len = cached + new_rows,
                                      .layout = paged ? ATTN_KV_PAGED : ATTN_KV_CONTIGUOUS,
                                      .page_size = page_size, .windows = window ? &window : NULL,
                                      .k_dtype = kv_type, .v_dtype = kv_type};
    for (size_t b = 0; b < count; b++) {
        build *x = &builds[b];
        if (load(x, threads, j.path) || (j.path == PATH_LAYER && load_layer(x, &layer_cfg)) ||
            (cache && load_cache(x, &cache_cfg)))
            return 1;
        if (!(x->ms = calloc(rounds, sizeof(double)))) return 1;
    }
    if (j.path == PATH_BF16 || cache) { /* process-wide: every build sees it */
        request_amx_fn request =
            (request_amx_fn)(uintptr_t)symbol(&builds[0], "attn_cpu_request_amx");
        printf("AMX tiles: %s\n", request && request() == ATTN_OK ? "granted" : "not granted");
    }

    for (size_t r = 0; r <= rounds; r++) /* round 0: the warm-up */
        for (size_t b = 0; b < count; b++) {
            build *x = &builds[b];
            double ms = 0.0;
            attn_status st = run_round(x, &j, &ms);
            if (st != ATTN_OK) {
                fprintf(stderr, "ab_attention: %s failed (status %d): %s\n", x->path, (int)st,
                        x->last_error(x->ctx));
                return 1;
            }
            if (r > 0) x->ms[r - 1] = ms;
            if (r == rounds) x->hash = hash_outputs(&j);
        }

    print_job(&j, threads, rounds, peers_layout, paged, page_size, window, kv_dtype);
    double first_median = 0, first_fastest = 0;
    for (size_t b = 0; b < count; b++) {
        build *x = &builds[b];
        qsort(x->ms, rounds, sizeof(double), by_value);
        double median = x->ms[rounds / 2], fastest = x->ms[0];
        if (b == 0) {
            first_median = median;
            first_fastest = fastest;
        }
        printf("  %-36s median %9.3f ms  x %.3f   fastest %9.3f ms  x %.3f   hash %016llx\n",
               x->path, median, first_median / median, fastest, first_fastest / fastest,
               (unsigned long long)x->hash);
        if (x->layer) x->layer_free(x->layer);
        if (x->cache) x->cache_free(x->cache);
        x->ctx_free(x->ctx);
        free(x->ms);
    }
    for (int t = 0; t < NUM_TENSORS; t++) {
        free(j.f[t]);
        free(j.h[t]);
        free(j.d[t]);
    }
    free(j.k_cached);
    free(j.v_cached);
    free(cu_seqlens);
    return 0;
}
