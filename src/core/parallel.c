/* parallel.c — attn_parallel_for on POSIX threads. */
#include "parallel.h"

#include <pthread.h>
#include <stdatomic.h>

typedef struct range_job {
    attn_part_fn body;
    void *arg;
    size_t part, begin, end;
} range_job;

static void *run_range(void *p) {
    range_job *job = p;
    job->body(job->arg, job->part, job->begin, job->end);
    return NULL;
}

size_t attn_parallel_parts(size_t num_threads) {
    if (num_threads == 0) return 1;
    return num_threads > ATTN_PARALLEL_MAX ? ATTN_PARALLEL_MAX : num_threads;
}

void attn_parallel_for_parts(size_t num_threads, size_t n, size_t min_per_thread,
                             attn_part_fn body, void *arg) {
    if (n == 0) return;
    size_t parts = attn_parallel_parts(num_threads);
    if (min_per_thread == 0) min_per_thread = 1;
    if (parts > n / min_per_thread) parts = n / min_per_thread;
    if (parts <= 1) {
        body(arg, 0, 0, n);
        return;
    }
    range_job jobs[ATTN_PARALLEL_MAX];
    pthread_t threads[ATTN_PARALLEL_MAX];
    int started[ATTN_PARALLEL_MAX] = {0};
    for (size_t i = 0; i < parts; i++)
        jobs[i] = (range_job){body, arg, i, n * i / parts, n * (i + 1) / parts};
    for (size_t i = 1; i < parts; i++)
        started[i] = pthread_create(&threads[i], NULL, run_range, &jobs[i]) == 0;
    run_range(&jobs[0]);
    /* A range whose thread did not start runs here, so the work is done. */
    for (size_t i = 1; i < parts; i++) {
        if (started[i])
            pthread_join(threads[i], NULL);
        else
            run_range(&jobs[i]);
    }
}

typedef struct range_adapter {
    attn_range_fn body;
    void *arg;
} range_adapter;

static void run_without_part(void *arg, size_t part, size_t begin, size_t end) {
    (void)part;
    const range_adapter *a = arg;
    a->body(a->arg, begin, end);
}

void attn_parallel_for(size_t num_threads, size_t n, size_t min_per_thread, attn_range_fn body,
                       void *arg) {
    range_adapter adapter = {body, arg};
    attn_parallel_for_parts(num_threads, n, min_per_thread, run_without_part, &adapter);
}

typedef struct dynamic_job {
    attn_item_fn body;
    void *arg;
    size_t n;
    atomic_size_t next;
} dynamic_job;

static void run_items(void *arg, size_t part, size_t begin, size_t end) {
    (void)begin;
    (void)end;
    dynamic_job *job = arg;
    for (;;) {
        size_t item = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed);
        if (item >= job->n) return;
        job->body(job->arg, part, item);
    }
}

void attn_parallel_dynamic(size_t num_threads, size_t n, attn_item_fn body, void *arg) {
    if (n == 0) return;
    dynamic_job job = {body, arg, n, 0};
    size_t parts = attn_parallel_parts(num_threads);
    if (parts > n) parts = n;
    /* one "range" per part; each part then takes items until none are left */
    attn_parallel_for_parts(parts, parts, 1, run_items, &job);
}
