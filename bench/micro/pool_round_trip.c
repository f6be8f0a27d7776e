/*
 * pool_round_trip.c — what a parallel call of the ctx's pool costs beyond
 * its work: a pool of one worker beside the caller, attn_pool_dynamic over
 * `items` items that each spin for `work_us`, `gap_us` of the caller's own
 * work between calls; the median, 10th and 90th percentile of 2000 calls,
 * and how many items each side ran.
 *
 *   cc -O2 -Isrc -Isrc/core -Iinclude bench/micro/pool_round_trip.c \
 *      build/libattn.a -lm -lpthread -o /tmp/prt
 *   /tmp/prt [work_us 0] [items 2] [gap_us 0]
 *
 * Not part of the build: it reads the library's internal headers.
 */
#define _POSIX_C_SOURCE 199309L
#include "core/parallel.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void spin_for(double seconds) {
    double t0 = now();
    while (now() - t0 < seconds) {
    }
}

typedef struct job {
    atomic_size_t by_part[2];
    double work;
} job;

static void item(void *arg, size_t part, size_t index) {
    (void)index;
    job *j = arg;
    atomic_fetch_add(&j->by_part[part], 1);
    spin_for(j->work);
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    double work = (argc > 1 ? atof(argv[1]) : 0.0) * 1e-6;
    size_t items = argc > 2 ? strtoul(argv[2], NULL, 10) : 2;
    double gap = (argc > 3 ? atof(argv[3]) : 0.0) * 1e-6;
    enum { CALLS = 2000 };
    static double t[CALLS];
    attn_pool *pool = attn_pool_new(1);
    job j = {.work = work};
    for (int i = 0; i < CALLS; i++) {
        double t0 = now();
        attn_pool_dynamic(pool, 2, items, item, &j);
        t[i] = now() - t0;
        spin_for(gap);
    }
    qsort(t, CALLS, sizeof t[0], by_value);
    printf("work %.0f us x %zu items, gap %.0f us: median %.1f us (p10 %.1f, p90 %.1f); "
           "items run by the caller %zu, by the worker %zu\n",
           work * 1e6, items, gap * 1e6, t[CALLS / 2] * 1e6, t[CALLS / 10] * 1e6,
           t[9 * CALLS / 10] * 1e6, (size_t)j.by_part[0], (size_t)j.by_part[1]);
    attn_pool_free(pool);
    return 0;
}
