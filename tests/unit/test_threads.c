/*
 * test_threads.c — every module on 1 and on 2 to 4096 threads: the same forward
 * (training, with dropout), the same backward, bit for bit, and contexts
 * used from several threads at once (one ctx per thread, as attn.h allows);
 * the kernels run on the ctx's own workers, kept from call to call.
 * Sized so that the kernels really split their work. Run under
 * ThreadSanitizer by CI (-DATTN_TSAN=ON), where a data race fails it.
 */
#define _POSIX_C_SOURCE 200809L

#include "attn.h"
#include "check.h"

#include <dirent.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { B = 4, T = 32, C = 128, HEADS = 4 }; /* rows 128 > 4 x the 17 a thread needs */

static attn_status build(attn_ctx *ctx, attn_rng *rng, attn_module_kind kind, attn_module **out) {
    attn_status st = ATTN_ERR_INVALID;
    *out = NULL;
    switch (kind) {
    case ATTN_MODULE_SIMPLE: {
        attn_simple *m;
        st = attn_simple_new(ctx, &(attn_simple_config){.d_in = C}, &m);
        *out = attn_simple_module(m);
        break;
    }
    case ATTN_MODULE_SA_V1: {
        attn_sa_v1 *m;
        st = attn_sa_v1_new(ctx, &(attn_sa_v1_config){.d_in = C, .d_out = C}, rng, &m);
        *out = attn_sa_v1_module(m);
        break;
    }
    case ATTN_MODULE_SA_V2: {
        attn_sa_v2 *m;
        st = attn_sa_v2_new(ctx, &(attn_sa_v2_config){.d_in = C, .d_out = C, .qkv_bias = true},
                            rng, &m);
        *out = attn_sa_v2_module(m);
        break;
    }
    case ATTN_MODULE_CAUSAL: {
        attn_causal *m;
        attn_causal_config cfg = {.d_in = C, .d_out = C, .context_length = T, .dropout = 0.2};
        st = attn_causal_new(ctx, &cfg, rng, &m);
        *out = attn_causal_module(m);
        break;
    }
    case ATTN_MODULE_MHA_WRAPPER: {
        attn_mha_wrapper *m;
        attn_mha_wrapper_config cfg = {.d_in = C, .d_out = C / HEADS, .context_length = T,
                                       .num_heads = HEADS, .dropout = 0.2};
        st = attn_mha_wrapper_new(ctx, &cfg, rng, &m);
        *out = attn_mha_wrapper_module(m);
        break;
    }
    case ATTN_MODULE_MHA: {
        attn_mha *m;
        attn_mha_config cfg = {.d_in = C, .d_out = C, .context_length = T, .num_heads = HEADS,
                               .dropout = 0.2, .mask = ATTN_MASK_RENORMALIZE};
        st = attn_mha_new(ctx, &cfg, rng, &m);
        *out = attn_mha_module(m);
        break;
    }
    case ATTN_MODULE_GPT2: {
        attn_gpt2 *m;
        attn_gpt2_config cfg = {.n_embd = C, .n_head = HEADS, .block_size = T, .dropout = 0.2};
        st = attn_gpt2_new(ctx, &cfg, rng, &m);
        *out = attn_gpt2_module(m);
        break;
    }
    case ATTN_MODULE_GQA: {
        attn_gqa *m;
        attn_gqa_config cfg = {.d_in = C, .d_out = C, .num_heads = HEADS, .num_kv_groups = 2,
                               .dropout = 0.2, .qkv_bias = true};
        st = attn_gqa_new(ctx, &cfg, rng, &m);
        *out = attn_gqa_module(m);
        break;
    }
    case ATTN_MODULE_MLA: {
        attn_mla *m;
        attn_mla_config cfg = {.d_in = C, .d_out = C, .num_heads = HEADS, .dropout = 0.2};
        st = attn_mla_new(ctx, &cfg, rng, &m);
        *out = attn_mla_module(m);
        break;
    }
    case ATTN_MODULE_SWA: {
        attn_swa *m;
        attn_swa_config cfg = {.d_in = C, .d_out = C, .num_heads = HEADS,
                               .sliding_window_size = 5, .dropout = 0.2};
        st = attn_swa_new(ctx, &cfg, rng, &m);
        *out = attn_swa_module(m);
        break;
    }
    }
    return st;
}

/* One module's forward and backward on a ctx of `threads` threads: y, dx and
 * every gradient, concatenated into out (allocated); NULL on any failure.
 * Touches no shared state (it runs on several threads at once). */
static float *run(attn_module_kind kind, size_t threads, size_t *n_out) {
    attn_ctx *ctx;
    attn_rng *rng;
    attn_module *m;
    if (attn_ctx_new(&(attn_ctx_config){.num_threads = threads}, &ctx) != ATTN_OK) return NULL;
    attn_rng_new(ctx, 42, &rng);
    if (build(ctx, rng, kind, &m) != ATTN_OK) {
        fprintf(stderr, "build: %s\n", attn_ctx_last_error(ctx));
        return NULL;
    }
    float *x = malloc(B * T * C * sizeof *x), *dy = malloc(B * T * C * sizeof *dy);
    if (!x || !dy) abort();
    for (size_t i = 0; i < B * T * C; i++) {
        x[i] = 0.01f * (float)(i % 101) - 0.5f;
        dy[i] = 0.02f * (float)(i % 37) - 0.3f;
    }
    size_t scalars = attn_module_num_scalars(m);
    size_t n = 2 * B * T * C + scalars;
    float *out = calloc(n, sizeof *out);
    if (!out || attn_module_forward(m, x, B, T, out, rng) != ATTN_OK ||
        attn_module_backward(m, dy, B, T, out + B * T * C) != ATTN_OK) {
        fprintf(stderr, "kind %d: %s\n", (int)kind, attn_ctx_last_error(ctx));
        free(out);
        out = NULL;
    }
    free(x);
    free(dy);
    size_t at = 2 * B * T * C;
    for (size_t i = 0; out && i < attn_module_param_count(m); i++) {
        attn_param p;
        attn_module_param_at(m, i, &p);
        memcpy(out + at, p.grad, p.numel * sizeof *out);
        at += p.numel;
    }
    attn_module_free(m);
    attn_rng_free(rng);
    attn_ctx_free(ctx);
    *n_out = n;
    return out;
}

static const attn_module_kind kinds[] = {ATTN_MODULE_SIMPLE, ATTN_MODULE_SA_V1, ATTN_MODULE_SA_V2,
                                         ATTN_MODULE_CAUSAL, ATTN_MODULE_MHA_WRAPPER,
                                         ATTN_MODULE_MHA, ATTN_MODULE_GPT2, ATTN_MODULE_GQA,
                                         ATTN_MODULE_MLA, ATTN_MODULE_SWA};
#define NUM_KINDS (sizeof kinds / sizeof kinds[0])

/* Two application threads, each with its own ctx of 2 worker threads. */
typedef struct job {
    attn_module_kind kind;
    float *result;
    size_t n;
} job;

static void *run_job(void *p) {
    job *j = p;
    j->result = run(j->kind, 2, &j->n);
    return NULL;
}

/* The threads of this process now (Linux's /proc/self/task), 0 where that
 * cannot be read. */
static size_t process_threads(void) {
    DIR *dir = opendir("/proc/self/task");
    if (!dir) return 0;
    size_t n = 0;
    for (struct dirent *e; (e = readdir(dir)) != NULL;)
        if (e->d_name[0] != '.') n++;
    closedir(dir);
    return n;
}

/* The process's thread count once it equals want, or after a second: a
 * joined thread may stay listed in /proc/self/task for a moment after
 * pthread_join returns. */
static size_t threads_settled_to(size_t want) {
    size_t now = process_threads();
    for (int wait = 0; wait < 100 && now != want; wait++) {
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
        now = process_threads();
    }
    return now;
}

static void *nothing(void *arg) { return arg; }

/* The fused attention's forward, its backward (and the scan before it) and
 * the SGEMM each run on the ctx's workers, started once (per loop, the
 * threads cost up to 10% of a 2-thread attention at T = 128): after its
 * first call, a fresh ctx of 4 threads keeps 3 workers beside the
 * process's own threads, and attn_ctx_free joins them. Threads started per
 * loop would be gone after the call. */
static void test_ctx_keeps_its_workers(void) {
    /* a thread first: ThreadSanitizer's runtime starts one of its own then */
    pthread_t first;
    if (pthread_create(&first, NULL, nothing, NULL) == 0) pthread_join(first, NULL);
    size_t before = process_threads();
    if (before == 0) {
        printf("no /proc/self/task here: the ctx's workers not counted\n");
        return;
    }
    enum { H = 4, S = 96, D = 32, N = H * S * D };
    float *x = malloc(5 * N * sizeof *x), *grads = malloc(3 * N * sizeof *grads);
    float *lse = malloc(H * S * sizeof *lse), *y = malloc(S * S * sizeof *y);
    if (!x || !grads || !lse || !y) abort();
    for (size_t i = 0; i < 5 * N; i++) x[i] = 0.01f * (float)(i % 97) - 0.4f;
    float *q = x, *k = x + N, *v = x + 2 * N, *out = x + 3 * N, *dout = x + 4 * N;
    attn_sdpa_config cfg = {.batch = 1, .heads = H, .q_tokens = S, .kv_tokens = S, .head_dim = D,
                            .causal = true};
    for (int call = 0; call < 3; call++) {
        attn_ctx *ctx = NULL;
        CHECK(attn_ctx_new(&(attn_ctx_config){.num_threads = 4}, &ctx) == ATTN_OK);
        for (int again = 0; again < 2; again++) {
            if (call == 0)
                CHECK(attn_sdpa_forward(ctx, &cfg, q, k, v, out, lse, NULL, NULL) == ATTN_OK);
            else if (call == 1)
                CHECK(attn_sdpa_backward(ctx, &cfg, q, k, v, out, lse, dout, grads, grads + N,
                                         grads + 2 * N, NULL) == ATTN_OK);
            else
                CHECK(attn_linear(ctx, q, k, NULL, y, S, S, S) == ATTN_OK);
            size_t now = process_threads();
            CHECK(now == before + 3);
            if (now != before + 3)
                fprintf(stderr, "call %d: %zu threads, not %zu + 3\n", call, now, before);
        }
        attn_ctx_free(ctx);
        CHECK(threads_settled_to(before) == before);
    }
    free(x);
    free(grads);
    free(lse);
    free(y);
}

/* attn.h: a ctx takes up to 4096 threads and runs no loop in more than 64
 * parts, so a ctx of 65 or 4096 threads says the count it was given and
 * keeps 63 workers (not 64 or 4095), joined by attn_ctx_free. */
static void test_ctx_past_64_threads(void) {
    size_t before = process_threads();
    if (before == 0) return; /* test_ctx_keeps_its_workers said why */
    enum { N = 256 };
    float *a = malloc(N * N * sizeof *a), *y = malloc(N * N * sizeof *y);
    if (!a || !y) abort();
    for (size_t i = 0; i < N * N; i++) a[i] = 0.01f * (float)(i % 89) - 0.4f;
    static const size_t counts[] = {64, 65, 4096};
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        attn_ctx *ctx = NULL;
        CHECK(attn_ctx_new(&(attn_ctx_config){.num_threads = counts[c]}, &ctx) == ATTN_OK);
        CHECK(attn_ctx_num_threads(ctx) == counts[c]);
        CHECK(attn_linear(ctx, a, a, NULL, y, N, N, N) == ATTN_OK);
        size_t now = process_threads();
        CHECK(now == before + 63);
        if (now != before + 63)
            fprintf(stderr, "%zu threads: %zu threads, not %zu + 63\n", counts[c], now, before);
        attn_ctx_free(ctx);
        CHECK(threads_settled_to(before) == before);
    }
    free(a);
    free(y);
}

int main(void) {
    test_ctx_keeps_its_workers();
    test_ctx_past_64_threads();
    /* counts that split the work unevenly, more threads than cores, and
     * counts past the 64 parts a loop takes */
    static const size_t counts[] = {2, 3, 4, 7, 16, 65, 4096};
    for (size_t k = 0; k < NUM_KINDS; k++) {
        size_t n1 = 0;
        float *one = run(kinds[k], 1, &n1);
        CHECK(one != NULL);
        for (size_t c = 0; one && c < sizeof counts / sizeof counts[0]; c++) {
            size_t n = 0;
            float *many = run(kinds[k], counts[c], &n);
            CHECK(many && n == n1);
            if (many && n == n1) {
                bool same = memcmp(one, many, n1 * sizeof *one) == 0;
                if (!same)
                    fprintf(stderr, "kind %d: 1 and %zu threads differ\n", (int)kinds[k],
                            counts[c]);
                CHECK(same);
            }
            free(many);
        }
        free(one);
    }
    job jobs[2] = {{.kind = ATTN_MODULE_MHA}, {.kind = ATTN_MODULE_GPT2}};
    pthread_t threads[2];
    for (int i = 0; i < 2; i++) CHECK(pthread_create(&threads[i], NULL, run_job, &jobs[i]) == 0);
    for (int i = 0; i < 2; i++) pthread_join(threads[i], NULL);
    for (int i = 0; i < 2; i++) {
        size_t n = 0;
        float *alone = run(jobs[i].kind, 1, &n);
        CHECK(alone && jobs[i].result && n == jobs[i].n &&
              memcmp(alone, jobs[i].result, n * sizeof *alone) == 0);
        free(alone);
        free(jobs[i].result);
    }
    return check_summary();
}
