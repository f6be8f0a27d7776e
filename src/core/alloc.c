/*
 * alloc.c — the library's one allocator. Every allocation in src/ goes
 * through here (tests/lint/check_alloc.py keeps it so), which gives one
 * place for the size checks and, in a build configured with
 * -DATTN_ALLOC_FAILURE_INJECTION=ON, a test hook that fails the n-th call.
 *
 * The hook's counter is the only mutable state outside an attn_ctx, and it
 * exists only in that build: a normal build compiles none of it. It is
 * atomic, so threads that allocate do not race on it, but the tests that set
 * it run one operation at a time and count that operation's calls.
 *
 * One kind of allocation may fail without failing the call that makes it:
 * the SGEMM's pack buffers (attn_aligned_alloc_or_fallback), whose caller
 * then runs the reference kernel, which needs no memory. The hook records
 * when it failed one of those, and the sweep then expects success.
 */
/* madvise's MADV_HUGEPAGE is not POSIX: strict C11 leaves it undefined */
#define _DEFAULT_SOURCE
#include "internal.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#ifdef ATTN_ALLOC_FAILURE_INJECTION
#include <stdatomic.h>

static atomic_size_t calls;      /* allocator calls since attn_alloc_fail_at */
static atomic_size_t fail_at;    /* the call that fails (1-based); 0: none */
static atomic_bool fell_back;    /* the failed call was one with a fallback */

void attn_alloc_fail_at(size_t n) {
    atomic_store(&fail_at, n);
    atomic_store(&calls, 0);
    atomic_store(&fell_back, false);
}

size_t attn_alloc_calls(void) { return atomic_load(&calls); }

bool attn_alloc_failed_with_fallback(void) { return atomic_load(&fell_back); }

/* True when this call is the one chosen to fail. */
static bool injected_failure(bool has_fallback) {
    size_t n = atomic_fetch_add(&calls, 1) + 1;
    bool fail = n == atomic_load(&fail_at);
    if (fail && has_fallback) atomic_store(&fell_back, true);
    return fail;
}
#else
static bool injected_failure(bool has_fallback) {
    (void)has_fallback;
    return false;
}
#endif

void *attn_malloc(size_t size) {
    if (injected_failure(false)) return NULL;
    return malloc(size ? size : 1);
}

void *attn_calloc(size_t count, size_t size) {
    if (injected_failure(false)) return NULL;
    if (count == 0 || size == 0) count = size = 1;
    return calloc(count, size); /* calloc checks count * size itself */
}

void *attn_realloc(void *p, size_t size) {
    if (injected_failure(false)) return NULL;
    return realloc(p, size ? size : 1);
}

/* aligned_alloc with the size rounded up to a whole number of alignments */
static void *aligned(size_t alignment, size_t size) {
    if (size == 0) size = alignment;
    if (size % alignment) {
        if (size > (size_t)-1 - alignment) return NULL;
        size += alignment - size % alignment;
    }
    return aligned_alloc(alignment, size);
}

void *attn_aligned_alloc_or_fallback(size_t alignment, size_t size) {
    if (injected_failure(true)) return NULL;
    return aligned(alignment, size);
}

void *attn_aligned_alloc(size_t alignment, size_t size) {
    if (injected_failure(false)) return NULL;
    return aligned(alignment, size);
}

/* Where transparent huge pages are asked for (Linux's "madvise" mode): one
 * TLB entry covers 2 MiB instead of 4 KiB, and a kernel that reads one
 * token's row of each page in turn (a KV cache's heads) no longer misses
 * the TLB on every row. */
#define HUGE_PAGE ((size_t)2 << 20)

void *attn_malloc_large(size_t size) {
    if (injected_failure(false)) return NULL;
    if (size < HUGE_PAGE) return malloc(size ? size : 1);
    void *p = aligned(HUGE_PAGE, size);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (p) {
        size_t bytes = (size + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
        (void)madvise(p, bytes, MADV_HUGEPAGE); /* a hint: without it, 4 KiB pages */
    }
#endif
    return p;
}

void *attn_calloc_large(size_t count, size_t size) {
    size_t bytes;
    if (!attn_mul_size(count ? count : 1, size ? size : 1, &bytes)) return NULL;
    void *p = attn_malloc_large(bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

size_t attn_physical_memory(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) return 0;
    size_t n;
    return attn_mul_size((size_t)pages, (size_t)page, &n) ? n : (size_t)-1;
}

void attn_free(void *p) { free(p); }

float *attn_alloc_floats(size_t n) {
    if (!attn_floats_fit(n)) return NULL;
    return attn_calloc(n ? n : 1, sizeof(float));
}
