/*
 * ab_attention.c — two or more builds of libattn.so timed against each other
 * in one process: each build is dlopen'ed on its own, and their calls
 * alternate round by round on the same tensors, so that a host whose speed
 * drifts within minutes (a shared virtual machine's does) moves them
 * alike. A kernel change that keeps the bits shows the same hash of the
 * outputs for every build.
 *
 *   ab_attention [options] OLD.so NEW.so [MORE.so ...]
 *     --tokens T    sequence length, queries and keys (default 1024)
 *     --heads H     query heads (12), --kv-heads (H: one per query head),
 *                   --head-dim D (64), --batch B (1)
 *     --causal      causal (top-left; default none)
 *     --threads N   the ctx's threads (1)
 *     --rounds R    timed rounds of each build (21), after one warm-up
 *     --mode M      fwd, fwdbwd or bwd (the backward alone; its forward
 *                   runs untimed before it)
 *     --layout L    peers: q, k, v (B, H, T, D), out and dout (B, T, H, D),
 *                   as bench/peers.py gives PyTorch's tensors (default);
 *                   bthd: every tensor (B, T, H, D), as the modules' are
 *     --layer       the GPT-2 attention layer (attn_gpt2: projections, the
 *                   causal attention through the module's own workspace)
 *                   of n_embd H x D instead of attn_sdpa_*
 *     --bf16        attn_sdpa_forward_16 / attn_sdpa_backward_16 on bf16
 *                   tensors (the float inputs rounded to nearest even),
 *                   with the process's AMX tiles asked for first
 *                   (attn_cpu_request_amx), as bench/peers.py does
 *
 * Prints, per build, the median and the fastest round in ms and the first
 * build's over this one's (above 1: this build is faster), and a hash of
 * out, dq, dk and dv (with --layer: y and dx; with --bf16: their bits).
 * Inputs are uniform in [-1, 1] from a fixed seed, as are the layer's
 * weights (attn_rng seed 1).
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */
#include "attn.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_BUILDS 8

typedef attn_status (*ctx_new_fn)(const attn_ctx_config *, attn_ctx **);
typedef void (*ctx_free_fn)(attn_ctx *);
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

typedef attn_status (*rng_new_fn)(attn_ctx *, uint64_t, attn_rng **);
typedef void (*rng_free_fn)(attn_rng *);
typedef attn_status (*layer_new_fn)(attn_ctx *, const attn_gpt2_config *, attn_rng *,
                                    attn_gpt2 **);
typedef attn_status (*layer_forward_fn)(attn_gpt2 *, const float *, size_t, size_t, float *,
                                        attn_rng *);
typedef attn_status (*layer_backward_fn)(attn_gpt2 *, const float *, size_t, size_t, float *);
typedef void (*layer_free_fn)(attn_gpt2 *);

typedef struct build {
    const char *path;
    void *handle;
    attn_ctx *ctx;
    ctx_free_fn ctx_free;
    forward_fn forward;
    backward_fn backward;
    forward16_fn forward16;
    backward16_fn backward16;
    attn_gpt2 *layer; /* with --layer */
    layer_forward_fn layer_forward;
    layer_backward_fn layer_backward;
    layer_free_fn layer_free;
    double *ms; /* per round */
    uint64_t hash;
} build;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* FNV-1a over the bytes of n floats, continued from h. */
static uint64_t hash_floats(uint64_t h, const float *x, size_t n) {
    const unsigned char *c = (const unsigned char *)x;
    for (size_t i = 0; i < n * sizeof *x; i++) h = (h ^ c[i]) * 1099511628211ull;
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

/* The layer of cfg in build b, its weights from attn_rng seed 1. */
static int load_layer(build *b, const attn_gpt2_config *cfg) {
    rng_new_fn rng_new = (rng_new_fn)(uintptr_t)dlsym(b->handle, "attn_rng_new");
    rng_free_fn rng_free = (rng_free_fn)(uintptr_t)dlsym(b->handle, "attn_rng_free");
    layer_new_fn layer_new = (layer_new_fn)(uintptr_t)dlsym(b->handle, "attn_gpt2_new");
    b->layer_forward = (layer_forward_fn)(uintptr_t)dlsym(b->handle, "attn_gpt2_forward");
    b->layer_backward = (layer_backward_fn)(uintptr_t)dlsym(b->handle, "attn_gpt2_backward");
    b->layer_free = (layer_free_fn)(uintptr_t)dlsym(b->handle, "attn_gpt2_free");
    attn_rng *rng = NULL;
    if (!rng_new || !rng_free || !layer_new || !b->layer_forward || !b->layer_backward ||
        !b->layer_free || rng_new(b->ctx, 1, &rng) != ATTN_OK) {
        fprintf(stderr, "ab_attention: %s lacks the GPT-2 layer's API\n", b->path);
        return 1;
    }
    attn_status st = layer_new(b->ctx, cfg, rng, &b->layer);
    rng_free(rng);
    if (st != ATTN_OK) {
        fprintf(stderr, "ab_attention: %s made no layer (status %d)\n", b->path, (int)st);
        return 1;
    }
    return 0;
}

static int load(build *b, size_t threads) {
    b->handle = dlopen(b->path, RTLD_NOW | RTLD_LOCAL);
    if (!b->handle) {
        fprintf(stderr, "ab_attention: %s\n", dlerror());
        return 1;
    }
    ctx_new_fn ctx_new = (ctx_new_fn)(uintptr_t)dlsym(b->handle, "attn_ctx_new");
    b->ctx_free = (ctx_free_fn)(uintptr_t)dlsym(b->handle, "attn_ctx_free");
    b->forward = (forward_fn)(uintptr_t)dlsym(b->handle, "attn_sdpa_forward");
    b->backward = (backward_fn)(uintptr_t)dlsym(b->handle, "attn_sdpa_backward");
    b->forward16 = (forward16_fn)(uintptr_t)dlsym(b->handle, "attn_sdpa_forward_16");
    b->backward16 = (backward16_fn)(uintptr_t)dlsym(b->handle, "attn_sdpa_backward_16");
    attn_ctx_config config = {.num_threads = threads};
    if (!ctx_new || !b->ctx_free || !b->forward || !b->backward ||
        ctx_new(&config, &b->ctx) != ATTN_OK) {
        fprintf(stderr, "ab_attention: %s lacks the attn API or made no ctx\n", b->path);
        return 1;
    }
    return 0;
}

static int usage(void) {
    fprintf(stderr, "usage: ab_attention [--tokens T] [--heads H] [--kv-heads HKV] "
                    "[--head-dim D] [--batch B] [--causal] [--threads N] [--rounds R] "
                    "[--mode fwd|fwdbwd|bwd] [--layout peers|bthd] [--layer | --bf16] "
                    "OLD.so NEW.so [MORE.so ...]\n");
    return 2;
}

int main(int argc, char **argv) {
    size_t T = 1024, H = 12, HKV = 0, B = 1, D = 64, threads = 1, rounds = 21, count = 0;
    int causal = 0, forward = 1, backward = 0, peers_layout = 1, layer = 0, bf16 = 0;
    build builds[MAX_BUILDS] = {{0}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--causal")) causal = 1;
        else if (!strcmp(a, "--layer")) layer = 1;
        else if (!strcmp(a, "--bf16")) bf16 = 1;
        else if (a[0] == '-' && a[1] == '-' && !value) return usage();
        else if (!strcmp(a, "--tokens")) T = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(a, "--heads")) H = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(a, "--kv-heads")) HKV = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(a, "--batch")) B = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(a, "--head-dim")) D = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(a, "--threads")) threads = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(a, "--rounds")) rounds = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(a, "--mode")) {
            i++;
            if (strcmp(value, "fwd") && strcmp(value, "fwdbwd") && strcmp(value, "bwd"))
                return usage();
            forward = strcmp(value, "bwd") != 0;
            backward = strcmp(value, "fwd") != 0;
        } else if (!strcmp(a, "--layout")) {
            i++;
            peers_layout = !strcmp(value, "peers");
            if (!peers_layout && strcmp(value, "bthd")) return usage();
        } else if (a[0] == '-') return usage();
        else if (count < MAX_BUILDS) builds[count++].path = a;
        else return usage();
    }
    if (HKV == 0) HKV = H;
    if (count < 2 || T == 0 || H == 0 || D == 0 || B == 0 || H % HKV || threads == 0 ||
        rounds == 0 || (layer && bf16))
        return usage();

    size_t n = B * H * T * D, nk = B * HKV * T * D;
    float *q = malloc(n * sizeof *q), *k = malloc(nk * sizeof *k), *v = malloc(nk * sizeof *v);
    float *out = malloc(n * sizeof *out), *dout = malloc(n * sizeof *dout);
    float *dq = malloc(n * sizeof *dq), *dk = malloc(nk * sizeof *dk);
    float *dv = malloc(nk * sizeof *dv);
    float *lse = malloc(B * H * T * sizeof *lse);
    if (!q || !k || !v || !out || !dout || !dq || !dk || !dv || !lse) return 1;
    uint64_t state = 0x9E3779B97F4A7C15ull; /* xorshift64: inputs uniform in [-1, 1] */
    float *inputs[4] = {q, k, v, dout};
    for (int t = 0; t < 4; t++)
        for (size_t i = 0; i < (t == 1 || t == 2 ? nk : n); i++) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            inputs[t][i] = (float)((double)(state >> 11) / (double)(1ull << 52) - 1.0);
        }
    /* bf16 copies: q, k, v, out, dout, dq, dk, dv */
    size_t sizes16[8] = {n, nk, nk, n, n, n, nk, nk};
    uint16_t *x16[8] = {NULL};
    for (int t = 0; t < 8 && bf16; t++)
        if (!(x16[t] = malloc(sizes16[t] * sizeof *x16[t]))) return 1;
    if (bf16) {
        to_bf16(q, n, x16[0]);
        to_bf16(k, nk, x16[1]);
        to_bf16(v, nk, x16[2]);
        to_bf16(dout, n, x16[4]);
    }
    attn_sdpa_config cfg = {.batch = B, .heads = H, .kv_heads = HKV, .q_tokens = T, .kv_tokens = T,
                            .head_dim = D, .causal = causal, .align = ATTN_ALIGN_TOP_LEFT};
    if (peers_layout) {
        size_t bhtd[3] = {H * T * D, D, T * D}, bthd[3] = {T * H * D, H * D, D};
        size_t kv_bhtd[3] = {HKV * T * D, D, T * D};
        memcpy(cfg.q_strides, bhtd, sizeof bhtd);
        memcpy(cfg.kv_strides, kv_bhtd, sizeof kv_bhtd);
        memcpy(cfg.out_strides, bthd, sizeof bthd);
    }
    attn_gpt2_config layer_cfg = {.n_embd = H * D, .n_head = H, .block_size = T};
    for (size_t b = 0; b < count; b++) {
        if (load(&builds[b], threads) || (layer && load_layer(&builds[b], &layer_cfg))) return 1;
        builds[b].ms = calloc(rounds, sizeof(double));
        if (!builds[b].ms) return 1;
        if (bf16 && (!builds[b].forward16 || !builds[b].backward16)) {
            fprintf(stderr, "ab_attention: %s has no attn_sdpa_*_16\n", builds[b].path);
            return 1;
        }
    }
    if (bf16) { /* process-wide: every build sees it */
        request_amx_fn request =
            (request_amx_fn)(uintptr_t)dlsym(builds[0].handle, "attn_cpu_request_amx");
        printf("AMX tiles: %s\n", request && request() == ATTN_OK ? "granted" : "not granted");
    }

    for (size_t r = 0; r <= rounds; r++) /* round 0: the warm-up */
        for (size_t b = 0; b < count; b++) {
            build *x = &builds[b];
            attn_status st = ATTN_OK;
            double t0 = 0.0;
            if (layer) {
                /* x = q and dy = dout, (B, T, H x D); y into out, dx into dq */
                if (!forward) st = x->layer_forward(x->layer, q, B, T, out, NULL);
                t0 = now_ms();
                if (forward && st == ATTN_OK) st = x->layer_forward(x->layer, q, B, T, out, NULL);
                if (backward && st == ATTN_OK) st = x->layer_backward(x->layer, dout, B, T, dq);
            } else if (bf16) {
                const attn_dtype bf = ATTN_DTYPE_BF16;
                if (!forward)
                    st = x->forward16(x->ctx, &cfg, bf, x16[0], x16[1], x16[2], x16[3], lse, NULL,
                                      NULL);
                t0 = now_ms();
                if (forward && st == ATTN_OK)
                    st = x->forward16(x->ctx, &cfg, bf, x16[0], x16[1], x16[2], x16[3], lse, NULL,
                                      NULL);
                if (backward && st == ATTN_OK)
                    st = x->backward16(x->ctx, &cfg, bf, x16[0], x16[1], x16[2], x16[3], lse,
                                       x16[4], x16[5], x16[6], x16[7], NULL);
            } else {
                if (!forward) st = x->forward(x->ctx, &cfg, q, k, v, out, lse, NULL, NULL);
                t0 = now_ms();
                if (forward && st == ATTN_OK)
                    st = x->forward(x->ctx, &cfg, q, k, v, out, lse, NULL, NULL);
                if (backward && st == ATTN_OK)
                    st = x->backward(x->ctx, &cfg, q, k, v, out, lse, dout, dq, dk, dv, NULL);
            }
            double ms = now_ms() - t0;
            if (st != ATTN_OK) {
                fprintf(stderr, "ab_attention: %s failed (status %d)\n", x->path, (int)st);
                return 1;
            }
            if (r > 0) x->ms[r - 1] = ms;
            if (r == rounds) {
                uint64_t h = 1469598103934665603ull;
                if (bf16) {
                    h = hash_bits(h, x16[3], n);
                    for (int t = 5; t < 8 && backward; t++) h = hash_bits(h, x16[t], sizes16[t]);
                } else
                    h = hash_floats(h, out, n);
                if (backward && layer) h = hash_floats(h, dq, n);
                else if (backward && !bf16)
                    h = hash_floats(hash_floats(hash_floats(h, dq, n), dk, nk), dv, nk);
                x->hash = h;
            }
        }

    if (layer)
        printf("GPT-2 layer B=%zu T=%zu n_embd=%zu n_head=%zu, %zu thread%s, %s, %zu rounds\n", B,
               T, H * D, H, threads, threads == 1 ? "" : "s",
               !forward ? "backward alone" : backward ? "forward+backward" : "forward", rounds);
    else
        printf("B=%zu T=%zu H=%zu Hkv=%zu hd=%zu %s, %zu thread%s, %s%s, %zu rounds, layout %s\n",
               B, T, H, HKV, D, causal ? "causal" : "no mask", threads, threads == 1 ? "" : "s",
               bf16 ? "bf16 " : "",
               !forward ? "backward alone" : backward ? "forward+backward" : "forward", rounds,
               peers_layout ? "peers" : "bthd");
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
        x->ctx_free(x->ctx);
        free(x->ms);
    }
    float *buffers[] = {q, k, v, out, dout, dq, dk, dv, lse};
    for (size_t i = 0; i < sizeof buffers / sizeof *buffers; i++) free(buffers[i]);
    for (int t = 0; t < 8; t++) free(x16[t]);
    return 0;
}
