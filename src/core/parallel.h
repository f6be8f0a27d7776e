/* parallel.h — split a loop over the ctx's threads (no pool yet: threads
 * are started per call, so only loops worth more than that cost use it). */
#ifndef ATTN_PARALLEL_H
#define ATTN_PARALLEL_H

#include <stddef.h>

/* Runs body(arg, begin, end) over [0, n) cut into at most num_threads
 * contiguous ranges; the calling thread runs the first. Falls back to one
 * range when n is small or a thread cannot be started. */
typedef void (*attn_range_fn)(void *arg, size_t begin, size_t end);
void attn_parallel_for(size_t num_threads, size_t n, size_t min_per_thread, attn_range_fn body,
                       void *arg);

#endif /* ATTN_PARALLEL_H */
