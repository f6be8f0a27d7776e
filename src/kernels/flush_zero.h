/*
 * flush_zero.h — float results below the normal range (2^-126) flushed to
 * zero for a stretch of a kernel's work: x86's MXCSR flush-to-zero bit,
 * set on the calling thread and put back as it was (elsewhere nothing
 * changes). Subnormal inputs are still read as they are (no
 * denormals-are-zero): a caller's tiny values keep their meaning, and only
 * results that would be subnormal, each a microcode assist, become 0.
 */
#ifndef ATTN_KERNELS_FLUSH_ZERO_H
#define ATTN_KERNELS_FLUSH_ZERO_H

#include "parallel.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>

/* Sets flush-to-zero; returns the control word to put back. */
static inline unsigned attn_flush_zero_begin(void) {
    unsigned saved = _mm_getcsr();
    _mm_setcsr(saved | _MM_FLUSH_ZERO_ON);
    return saved;
}

static inline void attn_flush_zero_end(unsigned saved) { _mm_setcsr(saved); }
#else
static inline unsigned attn_flush_zero_begin(void) { return 0; }
static inline void attn_flush_zero_end(unsigned saved) { (void)saved; }
#endif

/* Pool items (parallel.h) run under flush-to-zero: attn_pool_dynamic(pool,
 * threads, n, attn_flushed_item, &(attn_flushed_items){fn, arg}) runs
 * fn(arg, part, item) with the bit set around each item. */
typedef struct attn_flushed_items {
    attn_item_fn fn;
    void *arg;
} attn_flushed_items;

static inline void attn_flushed_item(void *arg, size_t part, size_t item) {
    const attn_flushed_items *f = arg;
    unsigned saved = attn_flush_zero_begin();
    f->fn(f->arg, part, item);
    attn_flush_zero_end(saved);
}

#endif /* ATTN_KERNELS_FLUSH_ZERO_H */
