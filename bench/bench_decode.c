/*
 * bench_decode.c — attn-bench's decode section, the kernel rows: one token
 * against a KV cache (attn_kv_cache_attend), batch 1, 32 query heads over 8
 * KV heads, head_dim 128, at cache lengths 4096, 16384 and 65536,
 * contiguous and paged (pages of 16 tokens), K and V stored in each type of
 * --kv-dtypes.
 *
 * A decode step is memory-bound: it reads the whole cache, L tokens of
 * attn_kv_cache_token_bytes each (K and V, scales included), once. So its
 * figure is that traffic per
 * second, next to what the machine copies per second on as many threads
 * (a STREAM-like copy measured in the same run: memcpy between two arrays
 * of at least 4x the last-level cache, read + write bytes counted as STREAM
 * does), and next to PyTorch's SDPA on the same step (bench/decode_peer.py,
 * in the peers' venv). Then the whole-model rows (bench_lm.c).
 */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"
#include "cli.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { Q_HEADS = 32, KV_HEADS = 8, HEAD_DIM = 128, PAGE = 16, ROW = KV_HEADS * HEAD_DIM };
enum { MAX_LENGTHS = 3, FILL_ROWS = 1024, MAX_RUNS = 1000 };
static const size_t lengths[MAX_LENGTHS] = {4096, 16384, 65536};

/* ---- the copy bandwidth ------------------------------------------------------- */

typedef struct copy_slice {
    float *dst;
    const float *src;
    size_t n, streams; /* streams: the read's parts side by side */
    uint64_t sum;
} copy_slice;

static void *copy_slice_run(void *p) {
    copy_slice *s = p;
    memcpy(s->dst, s->src, s->n * sizeof(float));
    return NULL;
}

/* A read-only pass: the 32-bit words of src summed in four vectors of the
 * instruction set's register width a step, so that the loop is not
 * optimised away, in `streams` parts read side by side (four vectors of
 * each in turn; words past the parts' whole steps are not read). Wide
 * loads matter: a loop of 8-byte loads keeps fewer cache-line misses in
 * flight and reads less, which would flatter the kernel; so does a vector
 * wider than the registers, which the compiler keeps on the stack. So do
 * parts: where the hardware prefetchers follow one stream only within its
 * page (the Xeons here), one stream reads a third less than four. */
#define SUM_WORDS(name, bytes, attrs)                                                              \
    typedef uint32_t name##_words __attribute__((vector_size(bytes)));                             \
    attrs static uint64_t name(const float *src, size_t n, size_t streams) {                       \
        enum { W = bytes / 4 };                                                                    \
        name##_words a = {0}, b = {0}, c = {0}, d = {0};                                           \
        size_t part = n / streams;                                                                 \
        for (size_t i = 0; i + 4 * W <= part; i += 4 * W)                                          \
            for (size_t s = 0; s < streams; s++) {                                                 \
                const float *at = src + s * part + i;                                              \
                name##_words x, y, z, t;                                                           \
                memcpy(&x, at, bytes);                                                             \
                memcpy(&y, at + W, bytes);                                                         \
                memcpy(&z, at + 2 * W, bytes);                                                     \
                memcpy(&t, at + 3 * W, bytes);                                                     \
                a += x;                                                                            \
                b += y;                                                                            \
                c += z;                                                                            \
                d += t;                                                                            \
            }                                                                                      \
        name##_words all = a + b + c + d;                                                          \
        uint64_t sum = 0;                                                                          \
        for (int k = 0; k < W; k++) sum += all[k];                                                 \
        return sum;                                                                                \
    }

SUM_WORDS(sum_words, 16, )
#if defined(__x86_64__) && defined(__GNUC__)
SUM_WORDS(sum_words_avx512, 64, __attribute__((target("avx512f"))))
SUM_WORDS(sum_words_avx2, 32, __attribute__((target("avx2"))))
#endif

static void *read_slice_run(void *p) {
    copy_slice *s = p;
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx512f")) {
        s->sum = sum_words_avx512(s->src, s->n, s->streams);
        return NULL;
    }
    if (__builtin_cpu_supports("avx2")) {
        s->sum = sum_words_avx2(s->src, s->n, s->streams);
        return NULL;
    }
#endif
    s->sum = sum_words(s->src, s->n, s->streams);
    return NULL;
}

/* Bytes per array: 4x the last-level cache (sysconf, else 32 MiB assumed),
 * at least 256 MiB, at most 4 GiB. */
static size_t copy_array_bytes(void) {
    long llc = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
    llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
    size_t bytes = 4 * (llc > 0 ? (size_t)llc : (size_t)32 << 20);
    if (bytes < (size_t)256 << 20) bytes = (size_t)256 << 20;
    if (bytes > (size_t)4 << 30) bytes = (size_t)4 << 30;
    return bytes;
}

/* GB/s of a copy of n floats on threads threads (median of runs), counted
 * as STREAM's copy: 8 bytes per float (read + write); with dst NULL, of a
 * read of them in streams parts a thread (sum_words): 4 bytes per float
 * (the parts' unread ends, under 64 floats each, counted too). 0 on
 * failure. */
static double copy_bandwidth(float *dst, const float *src, size_t n, size_t threads,
                             size_t runs, size_t streams) {
    void *(*slice_run)(void *) = dst ? copy_slice_run : read_slice_run;
    double t[MAX_RUNS];
    copy_slice slices[64];
    pthread_t ids[64];
    if (threads > 64) threads = 64;
    for (size_t i = 0; i < threads; i++)
        slices[i] = (copy_slice){dst ? dst + n * i / threads : NULL, src + n * i / threads,
                                 n * (i + 1) / threads - n * i / threads, streams, 0};
    for (size_t r = 0; r <= runs; r++) {
        double t0 = bench_now();
        size_t started = 0;
        for (size_t i = 1; i < threads; i++, started++)
            if (pthread_create(&ids[i], NULL, slice_run, &slices[i]) != 0) break;
        slice_run(&slices[0]);
        for (size_t i = 1; i <= started; i++) pthread_join(ids[i], NULL);
        if (started + 1 < threads) return 0.0;
        if (r > 0) t[r - 1] = bench_now() - t0; /* the first is the warm-up */
    }
    return (dst ? 8.0 : 4.0) * (double)n / bench_median(t, runs) / 1e9;
}

/* ---- attn ---------------------------------------------------------------------- */

typedef struct decode_case {
    size_t threads, length;
    attn_kv_layout layout;
    attn_dtype dtype;   /* of K and of V */
    size_t token_bytes; /* one token's K and V */
    double ms;          /* median ms per step; 0: failed */
    double torch_ms;    /* 0: no peer */
} decode_case;

/* A cache of one layer holding length tokens of random K and V. */
static attn_status filled_cache(attn_ctx *ctx, attn_kv_layout layout, attn_dtype dtype,
                                size_t length, size_t spare, const float *rows,
                                attn_kv_cache **out) {
    attn_kv_cache_config cfg = {.num_layers = 1, .batch = 1, .kv_heads = KV_HEADS,
                                .head_dim = HEAD_DIM, .max_len = length + spare,
                                .layout = layout, .page_size = PAGE, .k_dtype = dtype,
                                .v_dtype = dtype};
    attn_status st = attn_kv_cache_new(ctx, &cfg, out);
    for (size_t at = 0; st == ATTN_OK && at < length; at += FILL_ROWS) {
        size_t n = length - at < FILL_ROWS ? length - at : FILL_ROWS;
        st = attn_kv_cache_append(*out, 0, NULL, n, rows, rows + FILL_ROWS * ROW);
    }
    return st;
}

/* Median ms of one decode step of case c (each appends its token, so the
 * cache grows by one per step from length); 0 after printing why not. */
static double time_steps(decode_case *c, size_t runs, const float *rows, const float *token) {
    size_t threads = c->threads, length = c->length;
    attn_ctx *ctx = NULL;
    attn_kv_cache *cache = NULL;
    double t[MAX_RUNS], ms = 0.0;
    float out[Q_HEADS * HEAD_DIM];
    attn_ctx_config cc = {.num_threads = threads};
    attn_status st = attn_ctx_new(&cc, &ctx);
    if (st == ATTN_OK) st = filled_cache(ctx, c->layout, c->dtype, length, runs + 1, rows, &cache);
    c->token_bytes = attn_kv_cache_token_bytes(cache);
    attn_kv_attend_args a = {.new_tokens = 1, .q_heads = Q_HEADS, .q = token,
                             .k_new = token + Q_HEADS * HEAD_DIM,
                             .v_new = token + Q_HEADS * HEAD_DIM + ROW, .out = out};
    for (size_t r = 0; st == ATTN_OK && r <= runs; r++) {
        double t0 = bench_now();
        st = attn_kv_cache_attend(cache, &a);
        if (r > 0) t[r - 1] = bench_now() - t0;
    }
    if (st == ATTN_OK)
        ms = 1e3 * bench_median(t, runs);
    else
        printf("  L=%zu: %s\n", length, ctx ? attn_ctx_last_error(ctx) : "no ctx");
    attn_kv_cache_free(cache);
    attn_ctx_free(ctx);
    return ms;
}

/* ---- the PyTorch peer ---------------------------------------------------------- */

/* Reads the peer's "decode_peer threads=N L=L ms=M" lines into the cases;
 * false when it could not run. */
static bool run_peer(const bench_options *o, const char *python, size_t num_lengths,
                     decode_case *cases, size_t num_cases) {
    char threads[128] = "", lens[64] = "", command[1024];
    size_t used = 0;
    for (size_t i = 0; i < o->thread_counts && used < sizeof threads - 24; i++)
        used += (size_t)snprintf(threads + used, sizeof threads - used, "%s%zu", i ? "," : "",
                                 o->threads[i]);
    used = 0;
    for (size_t i = 0; i < num_lengths; i++)
        used += (size_t)snprintf(lens + used, sizeof lens - used, "%s%zu", i ? "," : "",
                                 lengths[i]);
    snprintf(command, sizeof command,
             "'%s' bench/decode_peer.py --threads %s --lengths %s --runs %zu", python, threads,
             lens, o->runs);
    FILE *p = popen(command, "r");
    if (!p) return false;
    char line[512];
    bool any = false;
    while (fgets(line, sizeof line, p)) {
        size_t n, L;
        double ms;
        if (sscanf(line, "decode_peer threads=%zu L=%zu ms=%lf", &n, &L, &ms) == 3) {
            for (size_t i = 0; i < num_cases; i++)
                if (cases[i].threads == n && cases[i].length == L &&
                cases[i].dtype == ATTN_DTYPE_F32) {
                    cases[i].torch_ms = ms;
                    any = true;
                }
        } else if (strncmp(line, "decode_peer", 11) == 0) {
            printf("  %s", line);
        }
    }
    return pclose(p) == 0 && any;
}

/* --peer-python, else the peers' venv where it is. */
static const char *peer_python(const bench_options *o) {
    if (o->peer_python) return o->peer_python;
    static const char venv[] = ".venv-peers/bin/python";
    return access(venv, X_OK) == 0 ? venv : NULL;
}

int bench_decode(const bench_options *o, const bench_blas *blas) {
    (void)blas;
    size_t num_lengths = o->quick ? 2 : MAX_LENGTHS;
    printf("== decode: one token against the KV cache, batch 1, %d query heads / %d KV heads, "
           "head_dim %d ==\n", Q_HEADS, KV_HEADS, HEAD_DIM);
    static const attn_dtype all_dtypes[] = {ATTN_DTYPE_F32, ATTN_DTYPE_BF16, ATTN_DTYPE_F16,
                                            ATTN_DTYPE_F8_E4M3, ATTN_DTYPE_I8, ATTN_DTYPE_I4};
    const attn_dtype *dtypes = o->kv_dtype_counts ? o->kv_dtypes : all_dtypes;
    size_t num_dtypes = o->kv_dtype_counts ? o->kv_dtype_counts : 6;
    /* the AMX tiles, asked for as an application that wants attn's AMX
     * kernels does: bf16 and int8 keys are scored on them */
    printf("  AMX tiles: %s\n", attn_cpu_request_amx() == ATTN_OK
                                    ? "granted (bf16 and int8 keys scored on them)"
                                    : "none (this CPU or OS has none)");

    /* the copy bandwidth first, its arrays freed before the caches are made */
    size_t copy_bytes = copy_array_bytes(), n = copy_bytes / sizeof(float);
    double copy_gbs[BENCH_MAX_THREAD_COUNTS] = {0}, read_gbs[BENCH_MAX_THREAD_COUNTS] = {0};
    float *src = malloc(copy_bytes), *dst = malloc(copy_bytes);
    if (src && dst) {
        for (size_t i = 0; i < n; i++) src[i] = (float)(i & 1023);
        memset(dst, 0, copy_bytes);
        for (size_t i = 0; i < o->thread_counts; i++) {
            copy_gbs[i] = copy_bandwidth(dst, src, n, o->threads[i], o->runs, 1);
            /* the faster of one stream a thread and four side by side */
            double one = copy_bandwidth(NULL, src, n, o->threads[i], o->runs, 1);
            double four = copy_bandwidth(NULL, src, n, o->threads[i], o->runs, 4);
            read_gbs[i] = one > four ? one : four;
        }
    } else {
        printf("  (no copy bandwidth: cannot allocate 2 x %zu MiB)\n", copy_bytes >> 20);
    }
    free(src);
    free(dst);

    size_t runs = o->runs > MAX_RUNS - 1 ? MAX_RUNS - 1 : o->runs;
    float *rows = bench_random(2 * FILL_ROWS * ROW, 1), *token = bench_random(Q_HEADS * HEAD_DIM + 2 * ROW, 2);
    decode_case cases[6 * BENCH_MAX_THREAD_COUNTS * MAX_LENGTHS * 2];
    size_t num_cases = 0;
    int rc = CLI_OK;
    if (!rows || !token) {
        printf("  out of memory\n");
        rc = CLI_FAILED;
    }
    for (size_t d = 0; rc == CLI_OK && d < num_dtypes; d++)
        for (size_t t = 0; rc == CLI_OK && t < o->thread_counts; t++)
            for (int layout = 0; layout < 2; layout++)
                for (size_t l = 0; l < num_lengths; l++) {
                    decode_case *c = &cases[num_cases++];
                    *c = (decode_case){.threads = o->threads[t], .length = lengths[l],
                                       .layout = layout ? ATTN_KV_PAGED : ATTN_KV_CONTIGUOUS,
                                       .dtype = dtypes[d]};
                    c->ms = time_steps(c, runs, rows, token);
                    if (c->ms == 0.0) rc = CLI_FAILED;
                }
    free(rows);
    free(token);

    const char *python = peer_python(o);
    bool peer = python && run_peer(o, python, num_lengths, cases, num_cases);
    if (!peer)
        printf("  (PyTorch peer not run: %s)\n",
               python ? "bench/decode_peer.py failed"
                      : "no .venv-peers/bin/python (scripts/setup-bench-peers.sh) and no "
                        "--peer-python");

    printf("copy: memcpy between 2 arrays of %zu MiB, (read + write) bytes / s as STREAM "
           "counts;\nread: the faster of one pass summing one of them and of four parts of it summed "
           "side by side\n(what a read-only kernel can reach)\n",
           copy_bytes >> 20);
    printf("%7s %5s %10s %6s %9s %7s %9s %9s %8s %9s %8s %9s %8s\n", "threads", "kv", "layout",
           "L", "ms/step", "of f32", "K+V GB/s", "copy GB/s", "of copy", "read GB/s", "of read",
           "torch ms", "speedup");
    for (size_t i = 0; i < num_cases; i++) {
        const decode_case *c = &cases[i];
        size_t t = 0;
        while (o->threads[t] != c->threads) t++;
        double bytes = (double)c->length * (double)c->token_bytes;
        double gbs = c->ms > 0 ? bytes / (c->ms * 1e-3) / 1e9 : 0.0, f32_ms = 0.0;
        for (size_t j = 0; j < num_cases; j++)
            if (cases[j].dtype == ATTN_DTYPE_F32 && cases[j].threads == c->threads &&
                cases[j].layout == c->layout && cases[j].length == c->length)
                f32_ms = cases[j].ms;
        char of_f32[16] = "-";
        if (f32_ms > 0 && c->ms > 0) snprintf(of_f32, sizeof of_f32, "%.2fx", c->ms / f32_ms);
        printf("%7zu %5s %10s %6zu %9.3f %7s %9.1f %9.1f %7.0f%% %9.1f %7.0f%%", c->threads,
               cli_kv_dtype_name(c->dtype), c->layout == ATTN_KV_PAGED ? "paged/16" : "contiguous",
               c->length, c->ms, of_f32, gbs, copy_gbs[t],
               copy_gbs[t] > 0 ? 100.0 * gbs / copy_gbs[t] : 0.0, read_gbs[t],
               read_gbs[t] > 0 ? 100.0 * gbs / read_gbs[t] : 0.0);
        if (c->torch_ms > 0 && c->ms > 0)
            printf(" %9.3f %7.2fx\n", c->torch_ms, c->torch_ms / c->ms);
        else
            printf(" %9s %8s\n", "-", "-");
    }
    printf("  kv: K and V's stored type; of f32: ms / the f32 cache's ms on the same case; K+V "
           "GB/s: the\n  cache's bytes (attn_kv_cache_token_bytes x L) per second; speedup: "
           "torch ms / attn ms\n  (PyTorch SDPA on the same float32 step, enable_gqa; > 1: attn "
           "is faster).\n");

    if (bench_decode_model(o, python) != CLI_OK) rc = CLI_FAILED;
    return rc;
}
