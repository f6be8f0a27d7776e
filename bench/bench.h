/*
 * bench.h — what the sections of attn-bench share: the options, the
 * timer and median, the machine's description, and OpenBLAS, found at run
 * time (dlopen) as the practical peak to compare with. OpenBLAS is never a
 * link dependency: without it a section reports our kernels alone.
 *
 * A section is a function in a file of its own (bench_<name>.c), listed in
 * the table of attn_bench.c.
 */
#ifndef ATTN_BENCH_H
#define ATTN_BENCH_H

#include "attn.h"

#include <stdbool.h>
#include <stddef.h>

#define BENCH_MAX_THREAD_COUNTS 8
#define BENCH_MAX_KERNELS 4
#define BENCH_MAX_TOKEN_COUNTS 8

typedef struct bench_options {
    size_t threads[BENCH_MAX_THREAD_COUNTS]; /* thread counts, in the order given */
    size_t thread_counts;
    attn_kernels kernels[BENCH_MAX_KERNELS]; /* resolved: never AUTO */
    size_t kernel_counts;
    size_t runs; /* timed runs per measurement (after one warm-up): the median is reported */
    bool quick;  /* fewer shapes and runs */
    size_t tokens[BENCH_MAX_TOKEN_COUNTS]; /* --tokens: sequence lengths for the attention,
                                              layer, dropout and bf16 sections */
    size_t token_counts;                   /* 0: each section's own lengths */
    const char *peer_python; /* --peer-python: PyTorch 2.15's python for the decode
                                section's peers (NULL: .venv-peers/bin/python if there) */
    attn_dtype kv_dtypes[6]; /* --kv-dtypes: the decode section's KV cache types */
    size_t kv_dtype_counts;  /* 0: f32, bf16, f16, fp8, int8, int4 */
} bench_options;

/* cblas_sgemm and the OpenBLAS calls around it, when found. */
typedef void bench_cblas_sgemm_fn(int order, int trans_a, int trans_b, int m, int n, int k,
                                  float alpha, const float *a, int lda, const float *b, int ldb,
                                  float beta, float *c, int ldc);
typedef struct bench_blas {
    void *handle;                     /* NULL: not found */
    const char *library;              /* the file that was loaded */
    bench_cblas_sgemm_fn *sgemm;
    void (*set_num_threads)(int);
    const char *core;                 /* openblas_get_corename(), or "?" */
    const char *config;               /* openblas_get_config(), or "?" */
    char core_note[128];              /* why the core was asked for, or "" */
} bench_blas;

/* Row-major c (m, n) = alpha op(a) op(b) + beta c through OpenBLAS on
 * threads threads. Sizes must fit in int. */
void bench_blas_sgemm(const bench_blas *blas, size_t threads, bool trans_a, bool trans_b,
                      size_t m, size_t n, size_t k, float alpha, const float *a, size_t lda,
                      const float *b, size_t ldb, float beta, float *c, size_t ldc);

/* Seconds on a monotonic clock. */
double bench_now(void);
/* The median of n values (sorts them). */
double bench_median(double *values, size_t n);
/* The sequence lengths a section times: --tokens when given, else the
 * section's own list (its first quick_count entries under --quick). */
size_t bench_tokens(const bench_options *o, const size_t *own, size_t own_count,
                    size_t quick_count, const size_t **tokens);

/* Median seconds of runs calls of fn(arg) after one warm-up call (a single
 * run: the warm-up itself). */
typedef void (*bench_fn)(void *arg);
double bench_time_median(bench_fn fn, void *arg, size_t runs);
/* n floats uniform in [-1, 1) from a fixed seed; NULL when out of memory. */
float *bench_random(size_t n, unsigned seed);
/* ||a - b|| / ||b|| over n values. */
double bench_rel_l2(const float *a, const float *b, size_t n);
/* The 1, 5 and 15 minute load averages ("?" where unknown), into buf. */
const char *bench_load(char *buf, size_t size);

/* GFLOP/s of float FMAs of the widest vectors the CPU has (*bits: 512 or
 * 256) on threads threads at once, the median of runs runs (bench_peak.c);
 * NAN where this CPU (or build) has no FMA vectors. */
double bench_fma_peak(size_t threads, size_t runs, unsigned *bits);

/* The sections. Each prints its own table and returns CLI_OK or CLI_FAILED. */
int bench_peak(const bench_options *o, const bench_blas *blas);
int bench_sgemm(const bench_options *o, const bench_blas *blas);
int bench_attention(const bench_options *o, const bench_blas *blas);
int bench_layer(const bench_options *o, const bench_blas *blas);
int bench_dropout(const bench_options *o, const bench_blas *blas);
int bench_variants(const bench_options *o, const bench_blas *blas);
int bench_decode(const bench_options *o, const bench_blas *blas);
int bench_bf16(const bench_options *o, const bench_blas *blas);
int bench_masks(const bench_options *o, const bench_blas *blas);
/* The decode section's whole-model rows (bench_lm.c): peer_python runs
 * bench/lm_peer.py, or NULL to skip the PyTorch peer. */
int bench_decode_model(const bench_options *o, const char *peer_python);

#endif /* ATTN_BENCH_H */
