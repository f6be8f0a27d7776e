/* parallel.c — attn_parallel_for on POSIX threads, started per call or kept
 * in a pool. */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */
#include "parallel.h"

#include "internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

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

/* How many parts a loop of n items takes (at least min_per_thread each). */
static size_t parts_for(size_t num_threads, size_t n, size_t min_per_thread) {
    size_t parts = attn_parallel_parts(num_threads);
    if (min_per_thread == 0) min_per_thread = 1;
    if (parts > n / min_per_thread) parts = n / min_per_thread;
    return parts;
}

static void fill_jobs(range_job *jobs, size_t parts, size_t n, attn_part_fn body, void *arg) {
    for (size_t i = 0; i < parts; i++)
        jobs[i] = (range_job){body, arg, i, n * i / parts, n * (i + 1) / parts};
}

/* jobs[0 .. parts) on parts - 1 new threads and the caller's. */
static void run_on_new_threads(range_job *jobs, size_t parts) {
    pthread_t threads[ATTN_PARALLEL_MAX];
    int started[ATTN_PARALLEL_MAX] = {0};
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

void attn_parallel_for_parts(size_t num_threads, size_t n, size_t min_per_thread,
                             attn_part_fn body, void *arg) {
    attn_pool_for_parts(NULL, num_threads, n, min_per_thread, body, arg);
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
    attn_pool_for(NULL, num_threads, n, min_per_thread, body, arg);
}

void attn_pool_for(attn_pool *pool, size_t num_threads, size_t n, size_t min_per_thread,
                   attn_range_fn body, void *arg) {
    range_adapter adapter = {body, arg};
    attn_pool_for_parts(pool, num_threads, n, min_per_thread, run_without_part, &adapter);
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
    attn_pool_dynamic(NULL, num_threads, n, body, arg);
}

/* ---- the pool -------------------------------------------------------------- */

typedef struct pool_worker {
    attn_pool *pool;
    size_t index; /* the part it runs: 1 .. workers */
} pool_worker;

struct attn_pool {
    pthread_mutex_t lock;
    pthread_cond_t wake, done;
    size_t workers;
    pthread_t threads[ATTN_PARALLEL_MAX];
    pool_worker worker[ATTN_PARALLEL_MAX];
    atomic_bool busy; /* a caller holds the pool (nested calls start threads) */
    /* the current job, written under lock */
    range_job jobs[ATTN_PARALLEL_MAX];
    size_t parts;                /* the workers run jobs[1 .. parts) */
    atomic_size_t pending;       /* of those, not finished */
    _Atomic uint64_t generation; /* one more per job (and at stop) */
    uint64_t watch_ns;           /* SPIN_NS, or 0: more threads than processors */
    size_t sleepers;             /* workers waiting on wake, under lock */
    bool caller_waits;           /* the caller waiting on done, under lock */
    bool stop;
};

/*
 * How long a worker watches for the next job after one ends, and the caller
 * for the workers' end of a job, before sleeping on the condition variable.
 * Waking a sleeping thread takes a system call on each side, and in a
 * virtual machine an exit to the hypervisor: as long as a small model's
 * matrix-vector product (docs/tuning.md). A model's calls follow one
 * another microseconds apart, so a worker that watches for a while takes
 * the next call at once; past it the workers sleep and use no processor
 * time. A watching thread yields the processor at every look, so that on a
 * busy machine it does not hold a processor another thread needs; a pool
 * with more threads than the machine has processors does not watch at all.
 */
#define SPIN_NS ((uint64_t)100000)

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Whether a job other than generation seen was published. */
static bool job_published(const attn_pool *pool, uint64_t seen) {
    return atomic_load_explicit(&pool->generation, memory_order_acquire) != seen;
}

/* Whether every worker's part of the job has ended. */
static bool job_ended(const attn_pool *pool, uint64_t unused) {
    (void)unused;
    return atomic_load_explicit(&pool->pending, memory_order_acquire) == 0;
}

/* Looks at ready(pool, arg), yielding the processor between looks, until it
 * holds or the pool's watch has passed; whether it holds. */
static bool watch(const attn_pool *pool, bool (*ready)(const attn_pool *, uint64_t),
                  uint64_t arg) {
    if (ready(pool, arg)) return true;
    if (!pool->watch_ns) return false;
    uint64_t start = now_ns();
    for (unsigned i = 1; !ready(pool, arg); i++) {
        sched_yield();
        if (i % 16 == 0 && now_ns() - start > pool->watch_ns) return false;
    }
    return true;
}

/* A worker: watches for a job, sleeps when none comes, runs its part of
 * each; the job's last part to end wakes a sleeping caller. The jobs are
 * read under the lock the caller wrote them under. */
static void *pool_main(void *p) {
    pool_worker *w = p;
    attn_pool *pool = w->pool;
    uint64_t seen = 0;
    for (;;) {
        watch(pool, job_published, seen);
        pthread_mutex_lock(&pool->lock);
        pool->sleepers++;
        while (!pool->stop && atomic_load(&pool->generation) == seen)
            pthread_cond_wait(&pool->wake, &pool->lock);
        pool->sleepers--;
        if (pool->stop) break;
        seen = atomic_load(&pool->generation);
        if (w->index >= pool->parts) { /* a job of fewer parts */
            pthread_mutex_unlock(&pool->lock);
            continue;
        }
        range_job job = pool->jobs[w->index];
        pthread_mutex_unlock(&pool->lock);
        run_range(&job);
        if (atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&pool->lock);
            if (pool->caller_waits) pthread_cond_signal(&pool->done);
            pthread_mutex_unlock(&pool->lock);
        }
    }
    pthread_mutex_unlock(&pool->lock);
    return NULL;
}

attn_pool *attn_pool_new(size_t workers) {
    if (workers == 0) return NULL;
    if (workers > ATTN_PARALLEL_MAX - 1) workers = ATTN_PARALLEL_MAX - 1;
    /* an allocation with a fallback: without a pool, threads start per call */
    attn_pool *pool = attn_aligned_alloc_or_fallback(64, sizeof *pool);
    if (!pool) return NULL;
    memset(pool, 0, sizeof *pool);
    if (pthread_mutex_init(&pool->lock, NULL) != 0) {
        attn_free(pool);
        return NULL;
    }
    if (pthread_cond_init(&pool->wake, NULL) != 0) {
        pthread_mutex_destroy(&pool->lock);
        attn_free(pool);
        return NULL;
    }
    if (pthread_cond_init(&pool->done, NULL) != 0) {
        pthread_cond_destroy(&pool->wake);
        pthread_mutex_destroy(&pool->lock);
        attn_free(pool);
        return NULL;
    }
    atomic_init(&pool->busy, false);
    atomic_init(&pool->pending, 0);
    atomic_init(&pool->generation, 0);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    pool->watch_ns = cpus > 0 && (size_t)cpus > workers ? SPIN_NS : 0;
    for (size_t i = 0; i < workers; i++) {
        pool->worker[i] = (pool_worker){pool, i + 1};
        if (pthread_create(&pool->threads[i], NULL, pool_main, &pool->worker[i]) != 0) break;
        pool->workers = i + 1;
    }
    if (pool->workers == 0) {
        attn_pool_free(pool);
        return NULL;
    }
    return pool;
}

void attn_pool_free(attn_pool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->lock);
    pool->stop = true;
    atomic_fetch_add(&pool->generation, 1); /* ends a worker's watch */
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);
    for (size_t i = 0; i < pool->workers; i++) pthread_join(pool->threads[i], NULL);
    pthread_cond_destroy(&pool->done);
    pthread_cond_destroy(&pool->wake);
    pthread_mutex_destroy(&pool->lock);
    attn_free(pool);
}

void attn_pool_for_parts(attn_pool *pool, size_t num_threads, size_t n, size_t min_per_thread,
                         attn_part_fn body, void *arg) {
    if (n == 0) return;
    size_t parts = parts_for(num_threads, n, min_per_thread);
    if (parts <= 1) {
        body(arg, 0, 0, n);
        return;
    }
    if (!pool || parts - 1 > pool->workers || atomic_exchange(&pool->busy, true)) {
        range_job jobs[ATTN_PARALLEL_MAX];
        fill_jobs(jobs, parts, n, body, arg);
        run_on_new_threads(jobs, parts);
        return;
    }
    range_job first;
    pthread_mutex_lock(&pool->lock);
    fill_jobs(pool->jobs, parts, n, body, arg);
    first = pool->jobs[0];
    pool->parts = parts;
    atomic_store(&pool->pending, parts - 1);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_release);
    if (pool->sleepers) pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);
    run_range(&first);
    if (!watch(pool, job_ended, 0)) {
        pthread_mutex_lock(&pool->lock);
        pool->caller_waits = true;
        while (atomic_load(&pool->pending) > 0) pthread_cond_wait(&pool->done, &pool->lock);
        pool->caller_waits = false;
        pthread_mutex_unlock(&pool->lock);
    }
    atomic_store(&pool->busy, false);
}

void attn_pool_dynamic(attn_pool *pool, size_t num_threads, size_t n, attn_item_fn body,
                       void *arg) {
    if (n == 0) return;
    dynamic_job job = {body, arg, n, 0};
    size_t parts = attn_parallel_parts(num_threads);
    if (parts > n) parts = n;
    /* one "range" per part; each part then takes items until none are left */
    attn_pool_for_parts(pool, parts, parts, 1, run_items, &job);
}

typedef struct zero_job {
    unsigned char *data;
    size_t bytes, parts;
} zero_job;

/* Where part of z starts: on a line, but for the end of the last. */
static size_t zero_edge(const zero_job *z, size_t part) {
    return part == z->parts ? z->bytes : z->bytes / 64 / z->parts * part * 64;
}

static void zero_parts(void *arg, size_t part, size_t begin, size_t end) {
    (void)part;
    const zero_job *z = arg;
    size_t from = zero_edge(z, begin), to = zero_edge(z, end);
    memset(z->data + from, 0, to - from);
}

void attn_pool_zero(attn_pool *pool, size_t num_threads, void *data, size_t bytes) {
    size_t parts = attn_parallel_parts(num_threads);
    if (parts > bytes / ATTN_ZERO_PART_BYTES) parts = bytes / ATTN_ZERO_PART_BYTES;
    if (parts <= 1) {
        if (bytes) memset(data, 0, bytes);
        return;
    }
    zero_job z = {data, bytes, parts};
    attn_pool_for_parts(pool, parts, parts, 1, zero_parts, &z);
}
