/*
 * internal.h — what every part of the library shares and users never see:
 * the context, error reporting and checked size arithmetic.
 */
#ifndef ATTN_INTERNAL_H
#define ATTN_INTERNAL_H

#include "attn.h"
#include "parallel.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

#define ATTN_ERROR_CAPACITY 512

/* Memory a ctx lends its kernels from call to call (the SGEMM's packed
 * panels), so that a call does not map and fault in fresh pages each time:
 * 64-byte aligned, grown on demand, freed with the ctx. */
typedef struct attn_ctx_buffer {
    void *data;
    size_t bytes;
} attn_ctx_buffer;

/* The kernels of the ctx's instruction set, chosen once when the ctx is
 * made (kernels/kernel_set.c), so that no call switches on the instruction
 * set. A NULL entry runs the reference loops (every entry of the
 * reference set, ATTN_KERNELS_REFERENCE). */
typedef struct attn_kernel_set {
    const char *name;                             /* "avx512", "reference", ... */
    const struct attn_flash_kernels *flash;       /* fused float attention */
    const struct attn_flash16_kernels *flash16_amx; /* fused bf16 attention on AMX tiles, */
    const struct attn_flash16_kernels *flash16_dot; /* on vdpbf16ps (NULL: the CPU lacks it) */
    const struct attn_decode_kernels *decode;     /* attention of new tokens over a cache, */
    const struct attn_decode_kernels *decode_amx; /* its bf16 keys on AMX tiles (or NULL) */
    const struct attn_flex_kernels *flex;         /* fused attention under block maps and score mods */
    const struct attn_gemm_kernel *gemm;          /* SGEMM */
    const struct attn_gemm16_kernel *gemm16;      /* 16-bit GEMM on widened panels */
    const struct attn_gemm16_kernel *bgemm_amx;   /* bf16 GEMM on AMX tiles, */
    const struct attn_gemm16_kernel *bgemm_dot;   /* on vdpbf16ps (NULL: the CPU lacks it) */
    const struct attn_gemv_kernel *gemv;          /* matrix-vector products of decoding */
    const struct attn_activation_kernels *activation; /* the training layers' GELU (NULL: scalar) */
    bool bf16_dot_pays; /* vdpbf16ps outruns the float FMA here (AMD's cores) */
} attn_kernel_set;

struct attn_ctx {
    size_t num_threads;
    attn_kernels kernels; /* resolved: never AUTO */
    attn_kernel_set ks;   /* the kernels of `kernels` on this CPU */
    attn_trace_fn trace;
    void *trace_user;
    bool trace_shapes_only;
    char error[ATTN_ERROR_CAPACITY];
    char explain[ATTN_ERROR_CAPACITY]; /* the last attention call's choice (attention/registry.c) */
    attn_ctx_buffer scratch;
    attn_ctx_buffer workspace; /* the attention passes' (attn_ctx_workspace) */
    struct attn_pool *pool; /* num_threads - 1 workers, from the first parallel call */
    bool pool_tried;        /* made (or failed: threads then start per call) */
    bool bf16_dot_forced;   /* bf16 attention on vdpbf16ps where it does not pay (tests) */
    size_t l2_bytes;        /* one core's L2 (0: unknown): the forward's query blocks */
    size_t l3_bytes;        /* the L3 a core sees (0: unknown): decode's prefetching */
};

/* Resolves requested (AUTO: the ATTN_KERNELS environment variable, else the
 * best the CPU runs) into kernels this CPU runs, or ATTN_ERR_INVALID
 * (core/cpu.c). */
attn_status attn_kernels_resolve(attn_kernels requested, attn_kernels *out);

/* The ctx's worker threads for attn_pool_for_parts / attn_pool_dynamic
 * (parallel.h), started on first use; NULL for one thread or when they
 * cannot be had (callers then start threads per call). */
struct attn_pool *attn_ctx_pool(attn_ctx *ctx);

/* Whether the ctx's calls may run AMX bf16 tiles now: the CPU and OS have
 * them (asked once, at attn_ctx_new: the kernel set has AMX entries) and
 * the process has Linux's permission (asked each time: the application
 * may get it later). */
bool attn_ctx_amx_usable(const attn_ctx *ctx);

/* A ctx of cfg's threads and trace hook, its kernels (resolved) and their
 * set filled in: the part of attn_ctx_new that needs no kernel tables
 * (kernels/kernel_set.c makes the set). */
attn_status attn_ctx_alloc(const attn_ctx_config *cfg, attn_kernels kernels, attn_ctx **out);

/* The ctx's threads and pool, for the kernels (attn_workers, parallel.h). */
attn_workers attn_ctx_workers(attn_ctx *ctx);

/* At least bytes of ctx's scratch (its earlier contents lost), or NULL
 * when it cannot grow; valid until the next call or attn_ctx_free. */
void *attn_ctx_scratch(attn_ctx *ctx, size_t bytes);

/* At least bytes of ctx's attention workspace, aligned to 64 bytes
 * (attn_aligned_alloc), or NULL when it cannot grow; valid until the next
 * call or attn_ctx_free. Kept from call to call, as the SGEMM's scratch is
 * (no fresh pages to fault in), but a buffer of its own: the scratch's
 * allocation may fail into the reference SGEMM, this one's fails the call.
 * Not zeroed, as the workspaces callers pass are not: the reference sets
 * what it reads, and the fused kernels zero their tiles themselves, on the
 * threads that use them (fused.c). */
void *attn_ctx_workspace(attn_ctx *ctx, size_t bytes);

/* Records a formatted message in ctx (if any) and returns status, so that
 * failures read: return attn_fail(ctx, ATTN_ERR_SHAPE, "x (%zu) ...", n); */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
attn_status attn_fail(attn_ctx *ctx, attn_status status, const char *fmt, ...);
/* x as the shortest "%.Ng" that reads back as x, into buf: a refused value
 * is quoted as it was given, never rounded into the range it left
 * (1.0000001 as "1.0000001", not "1"). Returns buf. */
#define ATTN_NUMBER_CHARS 32
const char *attn_number_text(double x, char buf[ATTN_NUMBER_CHARS]);
/* n bytes of untrusted text (a file's tensor name, a header's string) for a
 * message, into dst (cap bytes, NUL-terminated) as attn_fail quotes it:
 * control characters, NUL and bytes that are not UTF-8 as \n, \t, \r or
 * \xNN; text that does not fit ends in "...". Whether it was cut. */
bool attn_escape_text(char *dst, size_t cap, const char *text, size_t n);

/* Clears the last error; called at the start of public entry points. */
void attn_clear_error(attn_ctx *ctx);

/* a * b, or false when the product overflows size_t. */
static inline bool attn_mul_size(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > (size_t)-1 / a) return false;
    *out = a * b;
    return true;
}

/* a * b * c, or false on overflow. */
static inline bool attn_mul3_size(size_t a, size_t b, size_t c, size_t *out) {
    size_t ab;
    return attn_mul_size(a, b, &ab) && attn_mul_size(ab, c, out);
}

/* The elements of a shape into *numel, and the product of its nonzero
 * dimensions into *nonzero (NULL: not wanted); returns ndim, or the
 * dimension at which that product overflows size_t. A zero dimension
 * counts as one for the check, as NumPy's does, so the verdict does not
 * depend on where the zero is. */
static inline size_t attn_shape_numel(size_t ndim, const size_t *shape, size_t *nonzero,
                                      size_t *numel) {
    size_t product = 1;
    bool empty = false;
    for (size_t d = 0; d < ndim; d++) {
        if (shape[d] == 0) empty = true;
        else if (!attn_mul_size(product, shape[d], &product)) return d;
    }
    if (nonzero) *nonzero = product;
    *numel = empty ? 0 : product;
    return ndim;
}

/* a + b, or false on overflow. */
static inline bool attn_add_size(size_t a, size_t b, size_t *out) {
    if (b > (size_t)-1 - a) return false;
    *out = a + b;
    return true;
}

/* True when n floats fit in memory's address arithmetic (n * 4 bytes). */
static inline bool attn_floats_fit(size_t n) { return n <= (size_t)-1 / sizeof(float); }

/*
 * The library's allocator (alloc.c): malloc, calloc, realloc and free by
 * other names, which every allocation in src/ goes through. Sizes of 0 are
 * allocated as 1, so NULL always means failure; attn_calloc checks
 * count * size. In a build with ATTN_ALLOC_FAILURE_INJECTION, a test can
 * make the n-th call from now fail (n = 1: the next one; 0: none) and read
 * how many calls there were since.
 */
void *attn_malloc(size_t size);
void *attn_calloc(size_t count, size_t size);
void *attn_realloc(void *p, size_t size);
void attn_free(void *p);
/* alignment-aligned memory (a power of two; size rounded up to it) for a
 * caller that falls back to a path needing no memory when it gets NULL
 * (the SGEMM's pack buffers); freed with attn_free. */
void *attn_aligned_alloc_or_fallback(size_t alignment, size_t size);
/* The same for a caller that fails without it: the fused kernels'
 * workspaces, whose tiles are laid out in 64-byte lines. From malloc (16
 * bytes past a line, or past a page from mmap) every vector load of a tile
 * would span two lines. */
void *attn_aligned_alloc(size_t alignment, size_t size);
/* attn_malloc for large arrays read across (KV cache pools): from 2 MiB
 * on, aligned to 2 MiB and advised to take transparent huge pages. */
void *attn_malloc_large(size_t size);
/* attn_calloc likewise (model weights, read whole every token). */
void *attn_calloc_large(size_t count, size_t size);
/* The bytes of memory this machine has (0 where it cannot be told): the
 * bound past which a request for one object is refused before allocating. */
size_t attn_physical_memory(void);
#ifdef ATTN_ALLOC_FAILURE_INJECTION
void attn_alloc_fail_at(size_t n);
size_t attn_alloc_calls(void);
/* Whether the failed call was an attn_aligned_alloc_or_fallback. */
bool attn_alloc_failed_with_fallback(void);
#endif

/* Allocation of n floats (zeroed), NULL on overflow or failure. */
float *attn_alloc_floats(size_t n);

/* The Bernoulli method of an rng (the rng's own, opaque elsewhere). */
attn_bernoulli_method attn_rng_bernoulli(const attn_rng *rng);
/* A copy of rng's whole state (NULL when out of memory; free it with
 * attn_rng_free), and putting it back: for operations that draw and then
 * may fail, so that a failure leaves the rng where it was. */
attn_rng *attn_rng_snapshot(const attn_rng *rng);
void attn_rng_restore(attn_rng *rng, const attn_rng *snapshot);
/* The next 32-bit draw of an rng the caller holds (attn_rng_next_u32
 * without its checks, for code that has done them). */
uint32_t attn_rng_draw_u32(attn_rng *rng);

/* True when the ctx's trace hook wants the data of traced tensors (a hook
 * is set, not trace_shapes_only): only then keep copies for it. */
static inline bool attn_trace_wants_data(const attn_ctx *ctx) {
    return ctx && ctx->trace && !ctx->trace_shapes_only;
}

/* Reports an intermediate tensor to the ctx's trace hook, if one is set
 * (with data NULL under trace_shapes_only). */
void attn_trace(attn_ctx *ctx, const char *module, const char *name, size_t ndim,
                const size_t *shape, const float *data);

#endif /* ATTN_INTERNAL_H */
