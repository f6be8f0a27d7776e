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

#endif /* ATTN_KERNELS_FLUSH_ZERO_H */
