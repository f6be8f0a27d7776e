/*
 * bench_peak.c — the machine's floating-point peak, measured: independent
 * float fused multiply-adds on every thread at once, with 512-bit and
 * 256-bit vectors. It is the ceiling of every kernel here, above the
 * SGEMM's (OpenBLAS's SGEMM 2048^3 ran at 0.61-0.80 of it on the 2-vCPU
 * Xeon), and the width that reaches it tells what the CPU's datapath is:
 * on Zen 4, which splits 512-bit operations in two, both widths should
 * give the same FLOP/s; on the Xeon, 512 bits gave 1.8x 256 (the core
 * clocks lower for 512-bit work).
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
#define CHAINS_512 24 /* of AVX-512's 32 registers */
#define CHAINS_256 12 /* of AVX2's 16 */

#ifdef BENCH_PEAK_X86
/* The chains are named registers, not an array: at -O2 an array of
 * vectors stays in memory, and each fma then waits on a store. Each
 * starts from a different value: chains the compiler can prove equal it
 * computes once (1 + i 1e-7 rounded to equal floats, and 24 chains ran
 * as 20). */
#define CHAINS_4(X, a, b, c, d) X(a) X(b) X(c) X(d)
#define CHAINS_12(X) CHAINS_4(X, 0, 1, 2, 3) CHAINS_4(X, 4, 5, 6, 7) CHAINS_4(X, 8, 9, 10, 11)
#define CHAINS_24(X) CHAINS_12(X) CHAINS_4(X, 12, 13, 14, 15) CHAINS_4(X, 16, 17, 18, 19) \
    CHAINS_4(X, 20, 21, 22, 23)

/* The loop, over the vocabulary VEC (type), SET1, FMADD, ADD and STOREU
 * defined around each use: steps x the chains' fmas, and a sum of the
 * chains so that the work is kept. */
#define INIT(i) VEC acc##i = SET1(1.0f + (float)(i) / 64.0f);
#define STEP(i) acc##i = FMADD(acc##i, b, c);
#define SUM(i) total = ADD(total, acc##i);
#define FMA_STEPS(CHAINS)                                  \
    const VEC b = SET1(0.999999f), c = SET1(1e-7f);        \
    CHAINS(INIT)                                           \
    for (uint64_t s = 0; s < steps; s++) {                 \
        CHAINS(STEP)                                       \
    }                                                      \
    VEC total = SET1(0.0f);                                \
    CHAINS(SUM)                                            \
    float lanes[sizeof(VEC) / sizeof(float)];              \
    STOREU(lanes, total);                                  \
    return lanes[0] + lanes[1];

#define VEC __m512
#define SET1 _mm512_set1_ps
#define FMADD _mm512_fmadd_ps
#define ADD _mm512_add_ps
#define STOREU _mm512_storeu_ps
__attribute__((target("avx512f"))) static float fma_steps_512(uint64_t steps) {
    FMA_STEPS(CHAINS_24)
}
#undef VEC
#undef SET1
#undef FMADD
#undef ADD
#undef STOREU

#define VEC __m256
#define SET1 _mm256_set1_ps
#define FMADD _mm256_fmadd_ps
#define ADD _mm256_add_ps
#define STOREU _mm256_storeu_ps
__attribute__((target("avx2,fma"))) static float fma_steps_256(uint64_t steps) {
    FMA_STEPS(CHAINS_12)
}
#undef VEC
#undef SET1
#undef FMADD
#undef ADD
#undef STOREU
#endif

typedef struct peak_run {
    unsigned bits;
    uint64_t steps;
    float sum; /* the loop's result, read after the join */
} peak_run;

static void *run_steps(void *arg) {
    peak_run *r = arg;
#ifdef BENCH_PEAK_X86
    r->sum = r->bits == 512 ? fma_steps_512(r->steps) : fma_steps_256(r->steps);
#endif
    return NULL;
}

/* Flops of one step of the loop of bits. */
static double step_flops(unsigned bits) {
    return bits == 512 ? 2.0 * 16 * CHAINS_512 : 2.0 * 8 * CHAINS_256;
}

/* Seconds for threads threads to run steps steps each at once; NAN when a
 * thread cannot start. */
static double time_threads(size_t threads, unsigned bits, uint64_t steps) {
    enum { MAX = 256 };
    pthread_t ids[MAX];
    peak_run runs[MAX];
    if (threads > MAX) threads = MAX;
    double t0 = bench_now();
    size_t started = 0;
    for (; started + 1 < threads; started++) {
        runs[started] = (peak_run){.bits = bits, .steps = steps};
        if (pthread_create(&ids[started], NULL, run_steps, &runs[started]) != 0) break;
    }
    runs[started] = (peak_run){.bits = bits, .steps = steps};
    run_steps(&runs[started]); /* the last on this thread */
    for (size_t i = 0; i < started; i++) pthread_join(ids[i], NULL);
    double t = bench_now() - t0;
    return started + 1 == threads && isfinite(runs[started].sum) ? t : NAN;
}

bool bench_peak_supported(unsigned bits) {
    attn_cpu_info cpu;
    if (attn_cpu_info_get(&cpu) != ATTN_OK) return false;
#ifdef BENCH_PEAK_X86
    return bits == 512 ? cpu.avx512f : bits == 256 ? cpu.avx2_fma : false;
#else
    return false;
#endif
}

double bench_fma_peak(size_t threads, unsigned bits, size_t runs) {
    if (!bench_peak_supported(bits) || threads == 0) return NAN;
    /* steps for about 0.1 s a run, from a short first run */
    uint64_t steps = 1u << 16;
    double t = time_threads(1, bits, steps);
    if (!(t > 0.0)) return NAN;
    steps = (uint64_t)((double)steps * 0.1 / t) + 1;
    double rates[64];
    if (runs > 64) runs = 64;
    if (runs == 0) runs = 1;
    for (size_t r = 0; r < runs; r++) {
        t = time_threads(threads, bits, steps);
        rates[r] = (double)threads * (double)steps * step_flops(bits) / t / 1e9;
    }
    return bench_median(rates, runs);
}

unsigned bench_widest_fma(void) {
    return bench_peak_supported(512) ? 512 : bench_peak_supported(256) ? 256 : 0;
}

int bench_peak(const bench_options *o, const bench_blas *blas) {
    (void)blas;
    attn_cpu_info cpu;
    attn_cpu_info_get(&cpu);
    printf("peak: float fmas, %d (512-bit) or %d (256-bit) independent chains a thread, all "
           "threads at once; GFLOP/s\n", CHAINS_512, CHAINS_256);
    if (!bench_widest_fma()) {
        printf("  no FMA vectors this section can time on this CPU\n");
        return CLI_OK;
    }
    printf("%4s | %9s %9s | %9s %9s | %s\n", "thr", "512-bit", "a thread", "256-bit", "a thread",
           "512 / 256");
    for (size_t i = 0; i < o->thread_counts; i++) {
        size_t threads = o->threads[i];
        double wide = bench_fma_peak(threads, 512, o->runs);
        double narrow = bench_fma_peak(threads, 256, o->runs);
        char cells[2][32], ratio[16] = "-";
        const double rates[2] = {wide, narrow};
        for (int w = 0; w < 2; w++)
            if (isnan(rates[w])) snprintf(cells[w], sizeof cells[w], "%9s %9s", "-", "-");
            else snprintf(cells[w], sizeof cells[w], "%9.1f %9.1f", rates[w], rates[w] / (double)threads);
        if (!isnan(wide) && !isnan(narrow)) snprintf(ratio, sizeof ratio, "%.2f", wide / narrow);
        printf("%4zu | %s | %s | %s\n", threads, cells[0], cells[1], ratio);
        fflush(stdout);
    }
    printf("  the library's table says %u-bit FMAs on this core (%s); 512 / 256 near 2 "
           "means 512 bits run full width, near 1 that they are split\n",
           cpu.fma_vector_bits, cpu.uarch ? cpu.uarch : "?");
    return CLI_OK;
}
