/*
 * bench_peak.c — the machine's floating-point peak, measured: independent
 * float fused multiply-adds on every thread at once, with 512-bit and
 * 256-bit vectors. It is the ceiling of every kernel here, above the
 * SGEMM's, and the width that reaches it tells what the CPU's datapath is:
 * on Zen 4, which splits 512-bit operations in two, both widths should
 * give the same FLOP/s; on Intel's AVX-512 cores 512 bits give less than
 * twice 256 (the core clocks lower for 512-bit work). Beside them, the
 * bf16 dot product vdpbf16ps (two products a lane), on which the library's
 * bf16 kernels run where it beats the float fmas: on AMD's cores, twice
 * their FLOP/s by the ANCHORS; on Intel's, half, so the kernels widen bf16
 * to float there when AMX is not theirs.
 *
 * The loops are compiled for their instruction sets with target
 * attributes and run only where the CPU has them.
 */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"
#include "cli.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define BENCH_PEAK_X86 1
#endif

/* Independent chains per loop: enough to cover the FMA's latency on both
 * pipes (4 cycles x 2 pipes = 8), with room for cores that need more. */
#define CHAINS_512 24 /* of AVX-512's 32 registers: CHAINS_24 below */
#define CHAINS_256 12 /* of AVX2's 16 */

#ifdef BENCH_PEAK_X86
/* The chains are named registers, not an array: at -O2 an array of
 * vectors stays in memory, and each fma then waits on a store. Each
 * starts from a different value: chains the compiler can prove equal it
 * computes once (so not from 1 + i 1e-7, some of which round to equal
 * floats). */
#define CHAINS_4(X, W, a, b, c, d) X(W, a) X(W, b) X(W, c) X(W, d)
#define CHAINS_12(X, W) \
    CHAINS_4(X, W, 0, 1, 2, 3) CHAINS_4(X, W, 4, 5, 6, 7) CHAINS_4(X, W, 8, 9, 10, 11)
#define CHAINS_24(X, W) CHAINS_12(X, W) CHAINS_4(X, W, 12, 13, 14, 15) \
    CHAINS_4(X, W, 16, 17, 18, 19) CHAINS_4(X, W, 20, 21, 22, 23)

/* The loop over a vocabulary W: W_VEC (type), W_OPERANDS (b and c),
 * W_SET1, W_FMADD, W_ADD and W_STOREU. steps x the chains' acc =
 * W_FMADD(acc, b, c), and a sum of the chains so that the work is kept. */
#define INIT(W, i) W##_VEC acc##i = W##_SET1(1.0f + (float)(i) / 64.0f);
#define STEP(W, i) acc##i = W##_FMADD(acc##i, b, c);
#define SUM(W, i) total = W##_ADD(total, acc##i);
#define FMA_STEPS(CHAINS, W)                               \
    W##_OPERANDS                                           \
    CHAINS(INIT, W)                                        \
    for (uint64_t s = 0; s < steps; s++) {                 \
        CHAINS(STEP, W)                                    \
    }                                                      \
    W##_VEC total = W##_SET1(0.0f);                        \
    CHAINS(SUM, W)                                         \
    float lanes[sizeof(W##_VEC) / sizeof(float)];          \
    W##_STOREU(lanes, total);                              \
    return lanes[0] + lanes[1];

#define F512_VEC __m512
#define F512_OPERANDS const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
#define F512_SET1 _mm512_set1_ps
#define F512_FMADD _mm512_fmadd_ps
#define F512_ADD _mm512_add_ps
#define F512_STOREU _mm512_storeu_ps
__attribute__((target("avx512f"))) static float fma_steps_512(uint64_t steps) {
    FMA_STEPS(CHAINS_24, F512)
}

#define F256_VEC __m256
#define F256_OPERANDS const __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
#define F256_SET1 _mm256_set1_ps
#define F256_FMADD _mm256_fmadd_ps
#define F256_ADD _mm256_add_ps
#define F256_STOREU _mm256_storeu_ps
__attribute__((target("avx2,fma"))) static float fma_steps_256(uint64_t steps) {
    FMA_STEPS(CHAINS_12, F256)
}

/* The bf16 dot: acc += b_lo c_lo + b_hi c_hi in each lane, the pairs
 * constant (1e-3 each: the sums stay far from overflow). */
#define BF16_VEC __m512
#define BF16_OPERANDS                                                                 \
    const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f)), \
                   c = b;
#define BF16_SET1 _mm512_set1_ps
#define BF16_FMADD _mm512_dpbf16_ps
#define BF16_ADD _mm512_add_ps
#define BF16_STOREU _mm512_storeu_ps
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static float bf16_dot_steps(uint64_t steps) {
    FMA_STEPS(CHAINS_24, BF16)
}
#endif

/* The loops this section times. */
typedef enum peak_loop { FMA_512, FMA_256, BF16_DOT } peak_loop;

static bool loop_supported(peak_loop loop) {
    attn_cpu_info cpu;
    if (attn_cpu_info_get(&cpu) != ATTN_OK) return false;
#ifdef BENCH_PEAK_X86
    switch (loop) {
    case FMA_512: return cpu.avx512f;
    case FMA_256: return cpu.avx2_fma;
    case BF16_DOT: return cpu.avx512f && cpu.avx512_bf16;
    }
#endif
    (void)loop;
    return false;
}

/* Flops of one step of a loop: 2 a product. */
static double step_flops(peak_loop loop) {
    switch (loop) {
    case FMA_512: return 2.0 * 16 * CHAINS_512;
    case FMA_256: return 2.0 * 8 * CHAINS_256;
    case BF16_DOT: return 2.0 * 32 * CHAINS_512;
    }
    return 0.0;
}

typedef struct peak_run {
    peak_loop loop;
    uint64_t steps;
    float sum; /* the loop's result, read after the join */
} peak_run;

static void *run_steps(void *arg) {
    peak_run *r = arg;
#ifdef BENCH_PEAK_X86
    switch (r->loop) {
    case FMA_512: r->sum = fma_steps_512(r->steps); break;
    case FMA_256: r->sum = fma_steps_256(r->steps); break;
    case BF16_DOT: r->sum = bf16_dot_steps(r->steps); break;
    }
#endif
    return NULL;
}

/* Seconds for threads threads to run steps steps of loop each at once;
 * NAN when a thread cannot start. */
static double time_threads(size_t threads, peak_loop loop, uint64_t steps) {
    enum { MAX = 256 };
    pthread_t ids[MAX];
    peak_run runs[MAX];
    if (threads > MAX) threads = MAX;
    double t0 = bench_now();
    size_t started = 0;
    for (; started + 1 < threads; started++) {
        runs[started] = (peak_run){.loop = loop, .steps = steps};
        if (pthread_create(&ids[started], NULL, run_steps, &runs[started]) != 0) break;
    }
    runs[started] = (peak_run){.loop = loop, .steps = steps};
    run_steps(&runs[started]); /* the last on this thread */
    for (size_t i = 0; i < started; i++) pthread_join(ids[i], NULL);
    double t = bench_now() - t0;
    return started + 1 == threads && isfinite(runs[started].sum) ? t : NAN;
}

/* GFLOP/s of loop on threads threads at once, the median of runs runs;
 * NAN where the CPU lacks its instructions. */
static double loop_rate(peak_loop loop, size_t threads, size_t runs) {
    if (!loop_supported(loop) || threads == 0) return NAN;
    /* steps for about 0.1 s a run, from a short first run */
    uint64_t steps = 1u << 16;
    double t = time_threads(1, loop, steps);
    if (!(t > 0.0)) return NAN;
    steps = (uint64_t)((double)steps * 0.1 / t) + 1;
    double rates[64];
    if (runs > 64) runs = 64;
    if (runs == 0) runs = 1;
    for (size_t r = 0; r < runs; r++) {
        t = time_threads(threads, loop, steps);
        rates[r] = (double)threads * (double)steps * step_flops(loop) / t / 1e9;
    }
    return bench_median(rates, runs);
}

double bench_fma_peak(size_t threads, size_t runs, unsigned *bits) {
    peak_loop widest = loop_supported(FMA_512) ? FMA_512 : FMA_256;
    *bits = widest == FMA_512 ? 512 : 256;
    return loop_rate(widest, threads, runs);
}

/* "rate rate/threads" in two cells, or dashes. */
static void rate_cells(double rate, size_t threads, char *out, size_t size) {
    if (isnan(rate)) snprintf(out, size, "%9s %9s", "-", "-");
    else snprintf(out, size, "%9.1f %9.1f", rate, rate / (double)threads);
}

/* a / b to two places, or a dash. */
static void ratio_cell(double a, double b, char *out, size_t size) {
    if (isnan(a) || isnan(b)) snprintf(out, size, "%9s", "-");
    else snprintf(out, size, "%9.2f", a / b);
}

int bench_peak(const bench_options *o, const bench_blas *blas) {
    (void)blas;
    attn_cpu_info cpu;
    if (attn_cpu_info_get(&cpu) != ATTN_OK)
        return cli_failure("bench: cannot read the CPU's features");
    printf("peak: float fmas, %d (512-bit) or %d (256-bit) independent chains a thread, and the "
           "bf16 dot vdpbf16ps (512-bit, %d chains, 2 products a lane), all threads at once; "
           "GFLOP/s\n", CHAINS_512, CHAINS_256, CHAINS_512);
    if (!loop_supported(FMA_512) && !loop_supported(FMA_256)) {
        printf("  no FMA vectors this section can time on this CPU\n");
        return CLI_OK;
    }
    printf("%4s | %9s %9s | %9s %9s | %9s | %9s %9s | %9s\n", "thr", "512-bit", "a thread",
           "256-bit", "a thread", "512 / 256", "bf16 dot", "a thread", "bf16/512");
    for (size_t i = 0; i < o->thread_counts; i++) {
        size_t threads = o->threads[i];
        double wide = loop_rate(FMA_512, threads, o->runs);
        double narrow = loop_rate(FMA_256, threads, o->runs);
        double dot = loop_rate(BF16_DOT, threads, o->runs);
        char cells[3][32], ratios[2][16];
        rate_cells(wide, threads, cells[0], sizeof cells[0]);
        rate_cells(narrow, threads, cells[1], sizeof cells[1]);
        rate_cells(dot, threads, cells[2], sizeof cells[2]);
        ratio_cell(wide, narrow, ratios[0], sizeof ratios[0]);
        ratio_cell(dot, wide, ratios[1], sizeof ratios[1]);
        printf("%4zu | %s | %s | %s | %s | %s\n", threads, cells[0], cells[1], ratios[0], cells[2],
               ratios[1]);
        fflush(stdout);
    }
    printf("  512 / 256: near 2, 512-bit fmas run full width; near 1, they are split. The "
           "library's table says %u-bit on this core (%s).\n",
           cpu.fma_vector_bits, cpu.uarch ? cpu.uarch : "?");
    printf("  bf16 / 512: above 1, vdpbf16ps gives more products than the float fmas. The "
           "library's bf16 kernels take it on AMD's cores; on Intel's they run on AMX tiles "
           "where the process asked for them (attn_cpu_request_amx), else widen bf16 to "
           "float.\n");
    return CLI_OK;
}
