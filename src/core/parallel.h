/* parallel.h — split a loop over the ctx's threads: started per call, or
 * kept in a pool (below) by the callers that have a ctx. */
#ifndef ATTN_PARALLEL_H
#define ATTN_PARALLEL_H

#include <stddef.h>

/* At most this many parts run at once, whatever the thread count. */
#define ATTN_PARALLEL_MAX 64

/* Runs body(arg, begin, end) over [0, n) cut into at most num_threads
 * contiguous ranges; the calling thread runs the first. Falls back to one
 * range when n is small or a thread cannot be started. */
typedef void (*attn_range_fn)(void *arg, size_t begin, size_t end);
void attn_parallel_for(size_t num_threads, size_t n, size_t min_per_thread, attn_range_fn body,
                       void *arg);

/* The same, telling each range its part index in [0, attn_parallel_parts(
 * num_threads)), so that it can use a per-part workspace. */
typedef void (*attn_part_fn)(void *arg, size_t part, size_t begin, size_t end);
void attn_parallel_for_parts(size_t num_threads, size_t n, size_t min_per_thread,
                             attn_part_fn body, void *arg);
/* The most parts attn_parallel_for_parts uses for num_threads (>= 1). */
size_t attn_parallel_parts(size_t num_threads);

/* Runs body(arg, part, item) for every item in [0, n), handed out one at
 * a time to whichever of up to num_threads parts is free: for items of
 * uneven cost. Each item runs once, whole, on one part; which part runs it
 * varies, so items must not depend on it beyond per-part scratch. */
typedef void (*attn_item_fn)(void *arg, size_t part, size_t item);
void attn_parallel_dynamic(size_t num_threads, size_t n, attn_item_fn body, void *arg);

/*
 * A pool of worker threads that a ctx keeps (core/context.c): started on the
 * ctx's first parallel call (attn_ctx_pool), watching for the next call for
 * a fraction of a millisecond after each (parallel.c's SPIN_NS), asleep
 * after that, joined by attn_ctx_free. Starting threads costs tens of
 * microseconds a call, as much as a whole matrix-vector product of a
 * decoding step, and waking sleeping ones a good part of that.
 */
typedef struct attn_pool attn_pool;
/* A pool of workers threads beside the caller's, or NULL (out of memory, or
 * no thread could start). */
attn_pool *attn_pool_new(size_t workers);
/* Wakes, stops and joins the workers; NULL is fine. */
void attn_pool_free(attn_pool *pool);

/* attn_parallel_for_parts and attn_parallel_dynamic on pool's workers (the
 * same parts, the same ranges); they start threads as the plain ones do
 * when pool is NULL or busy (a call from inside one of its own bodies). */
void attn_pool_for_parts(attn_pool *pool, size_t num_threads, size_t n, size_t min_per_thread,
                         attn_part_fn body, void *arg);
void attn_pool_dynamic(attn_pool *pool, size_t num_threads, size_t n, attn_item_fn body,
                       void *arg);
/* And attn_parallel_for's. */
void attn_pool_for(attn_pool *pool, size_t num_threads, size_t n, size_t min_per_thread,
                   attn_range_fn body, void *arg);

/* Zeroes bytes at data in up to num_threads parts of whole 64-byte lines
 * (the last takes the rest), part i's on the thread that runs part i of the
 * pool's loops: a kernel's workspace of per-part regions then comes into
 * the caches of the cores that use them. Below ATTN_ZERO_PART_BYTES a part
 * it takes fewer parts, and zeroes it all here below twice that: a part
 * that small takes some 10 us (25 GB/s), about what waking a worker may
 * cost. */
#define ATTN_ZERO_PART_BYTES ((size_t)256 << 10)
void attn_pool_zero(attn_pool *pool, size_t num_threads, void *data, size_t bytes);

/* Where a kernel's loops run: at most threads parts, on pool's workers (a
 * ctx's: attn_ctx_workers), or on threads started for each loop where pool
 * is NULL. The fused attention kernels and the matrix products take one,
 * so that a ctx's calls reuse its workers: threads started per loop cost
 * short calls (a short attention, a GPT-2 linear of few tokens) a share of
 * their time. */
typedef struct attn_workers {
    size_t threads;
    attn_pool *pool;
} attn_workers;

#endif /* ATTN_PARALLEL_H */
