/*
 * attn.h — the public API of libattn: the attention mechanisms of transformer
 * language models in C11, number for number with PyTorch.
 *
 * Conventions
 *   - Every function that can fail returns an attn_status. On failure a
 *     message naming the offending values is kept in the attn_ctx the object
 *     was made from: read it with attn_ctx_last_error(). The library never
 *     aborts, exits or prints. The few calls with no ctx to write to (a
 *     block map's queries, attn_gpt2_preset_at) say in their comments which
 *     argument each status names.
 *   - Tensors are flat, row-major float32 arrays with their sizes passed
 *     explicitly. Shapes are given in comments as (B, T, C): batch, tokens,
 *     channels. Outputs are written into buffers the caller owns.
 *   - Weights follow PyTorch: an nn.Linear weight is (out_features,
 *     in_features) and y = x W^T + b. Parameters are found by their PyTorch
 *     state_dict names ("W_query.weight", "c_attn.bias", ...).
 *   - Functions that give an object through an out pointer (the _new
 *     constructors, the attn_block_mask_from_* builders, attn_npy_read and
 *     attn_npy_parse) set *out to NULL (an attn_npy to all zeros) on every
 *     failure, whenever out itself is not NULL, so a failed call leaves
 *     nothing to free and nothing stale.
 *   - An output never shares memory with an input or another output,
 *     unless the function's comment says it may ("y may equal x"). The
 *     attention calls (attn_sdpa_*, attn_kv_cache_attend) and the modules'
 *     forward and backward refuse any overlap of the spans (first byte to
 *     last) with ATTN_ERR_INVALID naming both arguments, before writing
 *     anything (a module's outputs also with its own parameters and
 *     gradients, and dy with the gradients); elsewhere an overlap gives
 *     undefined results.
 *   - Messages quote values as given, with control characters and bytes
 *     that are not UTF-8 written as \n, \t, \xNN: safe to print.
 *   - No global mutable state. An attn_ctx holds the thread count, the last
 *     error message and an optional trace hook; use one ctx (and the objects
 *     made from it) from one thread at a time.
 */
#ifndef ATTN_H
#define ATTN_H

/* The header is C99 (bool, int32_t, long long in its structs) and C++11:
 * under an older standard it gives one error, with the fix, and declares
 * nothing (the layout those types give is the ABI, see below). */
#if !defined(__cplusplus) && (!defined(__STDC_VERSION__) || __STDC_VERSION__ < 199901L)
#error "attn.h needs C99 or later (bool, stdint.h, long long): compile with -std=c99 or later"
#elif defined(__cplusplus) && __cplusplus < 201103L && !defined(_MSC_VER)
#error "attn.h needs C++11 or later (long long): compile with -std=c++11 or later"
#else /* a standard the declarations below are written in */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library is compiled with hidden visibility: what this header declares
 * is all that libattn.so exports. */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

#define ATTN_VERSION_MAJOR 0
#define ATTN_VERSION_MINOR 7
#define ATTN_VERSION_PATCH 0
#define ATTN_VERSION_STRING "0.7.0"

/* The version of the library linked in, e.g. "0.1.0". */
const char *attn_version(void);

/*
 * The ABI: the layout of every struct below and the signature of every
 * function. While the version is 0.x any minor release may change it, so the
 * ABI version is the minor version, and the shared library's SONAME carries
 * it (libattn.so.0.4): a program linked against another 0.x minor fails to
 * load instead of handing the library structs of the wrong size. A program
 * that loads the library by path (dlopen, ctypes), which the SONAME does not
 * guard, compares attn_abi_version() with the ATTN_ABI_VERSION it was built
 * with. docs/abi.md gives the whole policy.
 */
#define ATTN_ABI_VERSION 7

/* The ATTN_ABI_VERSION the library linked in was built with. */
int attn_abi_version(void);

/* A field of a public struct: its name, offsetof and sizeof (an array's
 * whole size). */
typedef struct attn_abi_field {
    const char *name;
    size_t offset, size;
} attn_abi_field;

/* A public struct as the library was compiled: its name, sizeof, and its
 * fields in the order this header declares them. */
typedef struct attn_abi_struct {
    const char *name;
    size_t size;
    size_t num_fields;
    const attn_abi_field *fields;
} attn_abi_struct;

/*
 * Every struct this header defines (these two included), in the order it
 * defines them; *count (when count is not NULL) receives how many. The table
 * is static, never freed. Bindings that mirror the structs check their
 * copies against it: the Python package's tests do.
 */
const attn_abi_struct *attn_abi_layout(size_t *count);

/* ------------------------------------------------------------------------ */
/* Status and context                                                        */
/* ------------------------------------------------------------------------ */

typedef enum attn_status {
    ATTN_OK = 0,
    ATTN_ERR_NULL,      /* a required pointer was NULL                        */
    ATTN_ERR_INVALID,   /* a value out of range (zero size, bad probability)  */
    ATTN_ERR_SHAPE,     /* sizes that do not fit together                      */
    ATTN_ERR_OVERFLOW,  /* a size whose product overflows size_t               */
    ATTN_ERR_NO_MEMORY, /* an allocation failed                               */
    ATTN_ERR_NOT_FOUND, /* no parameter, preset or module of that name        */
    ATTN_ERR_IO,        /* a file could not be opened, read or written        */
    ATTN_ERR_FORMAT,    /* a file is not in the format it claims              */
    ATTN_ERR_UNSUPPORTED /* the CPU or OS lacks what was asked for (since 0.4) */
} attn_status;

/* A short name for a status: "ATTN_ERR_SHAPE". Never NULL. */
const char *attn_status_name(attn_status status);

/*
 * Called by modules for every intermediate tensor of a forward pass (when
 * set), in the order they are computed: name ("queries", "attn_weights",
 * ...), rank, shape (the batch first), and the data in row-major order, or
 * NULL for a view. Tracing makes modules keep their intermediates (the
 * (B, H, T, T) attention weights too), so it is for inspection, not for
 * speed. With trace_shapes_only the data is always NULL and modules keep
 * nothing for the trace: shapes at any size for the memory of a forward.
 */
typedef void (*attn_trace_fn)(void *user, const char *module, const char *name,
                              size_t ndim, const size_t *shape, const float *data);

/*
 * The kernels a ctx runs. The reference kernels are plain loops that
 * accumulate in double: the oracle every fast kernel is tested against,
 * and the closest to exact. The fast kernels (packed, register-tiled GEMM;
 * fused, tiled attention) accumulate in float, per instruction set.
 */
typedef enum attn_kernels {
    ATTN_KERNELS_AUTO = 0,  /* the fastest this CPU runs; the environment
                               variable ATTN_KERNELS (reference, portable,
                               avx2, avx512) chooses instead when set      */
    ATTN_KERNELS_REFERENCE, /* double-accumulating loops: the oracle       */
    ATTN_KERNELS_PORTABLE,  /* the fast algorithms in portable C           */
    ATTN_KERNELS_AVX2,      /* AVX2 + FMA + F16C                           */
    ATTN_KERNELS_AVX512     /* AVX-512F                                    */
} attn_kernels;

/* "auto", "reference", "portable", "avx2", "avx512" ("?" if unknown). */
const char *attn_kernels_name(attn_kernels kernels);
/* Whether this CPU (and build) runs them; AUTO and REFERENCE always do. */
bool attn_kernels_supported(attn_kernels kernels);

typedef struct attn_ctx_config {
    size_t num_threads;  /* 0 or 1: single-threaded; at most 4096, of which
                            at most 64 run (see below)                      */
    attn_trace_fn trace; /* optional                                       */
    void *trace_user;    /* passed to trace                                */
    attn_kernels kernels; /* 0: AUTO                                        */
    bool trace_shapes_only; /* trace gets shapes, data NULL (see above)    */
} attn_ctx_config;

typedef struct attn_ctx attn_ctx;

/* cfg may be NULL for the defaults. ATTN_ERR_INVALID, with no ctx to hold
 * a message, for num_threads past 4096, a kernels value not in the enum or
 * one this CPU cannot run, or an ATTN_KERNELS name (lower case) not known. */
attn_status attn_ctx_new(const attn_ctx_config *cfg, attn_ctx **out);
/* Frees ctx (NULL is fine). Free the objects made from it first. */
void attn_ctx_free(attn_ctx *ctx);
/* The message of the last call made through ctx: the failure's, or "" after
 * a call that succeeded (each call clears it first). Read it before the next
 * call, cleanup's included. */
const char *attn_ctx_last_error(const attn_ctx *ctx);
/* The thread count the ctx was made with (at least 1; a count past 64 runs
 * as 64, below); 0 for a NULL ctx. */
size_t attn_ctx_num_threads(const attn_ctx *ctx);
/* No loop runs in more than 64 parts at once, whatever the thread count: a
 * ctx of more than 64 threads runs as one of 64, with the same bits. A ctx
 * also keeps its kernels' scratch memory (the SGEMM's packed panels,
 * the attention's tiles) from call to call, as much as its largest call
 * needed, and, with more than one thread, min(num_threads, 64) - 1 worker
 * threads for its fast kernels (the fused attention, the matrix products, the KV
 * cache's attend), started by the first such call, watching for the next
 * for up to 0.1 ms after each (yielding the processor; not where the
 * workers are as many as the machine's processors or more), then asleep;
 * attn_ctx_free frees and joins them. (The reference kernels, and the lighter loops of
 * training, start threads per call.) */
/* The kernels the ctx runs: never AUTO (resolved at attn_ctx_new, which
 * fails with ATTN_ERR_INVALID when asked for kernels the CPU cannot run or
 * when ATTN_KERNELS holds an unknown name). */
attn_kernels attn_ctx_kernels(const attn_ctx *ctx);
/* The kernel of each kind the ctx runs, chosen once at attn_ctx_new from
 * its kernels and the CPU ("avx512: flash avx512, flash16 vdpbf16ps,
 * decode avx512, gemm sgemm_avx512_14x32, ..."; "reference"
 * where the reference loops run), into buf (cap bytes, NUL-terminated, cut
 * to fit; buf may be NULL when cap is 0). Returns the length of the whole
 * text, as snprintf does. */
size_t attn_ctx_describe_kernels(const attn_ctx *ctx, char *buf, size_t cap);
/* How the ctx's last attention call chose its backend, one entry per
 * backend asked, in the order asked: "fused16: declined (dropout); fused:
 * declined (bf16 views); reference: declined (bf16 views); widened to
 * float32: fused (avx512): ran". "" before any attention call;
 * valid until the ctx's next call. attn sdpa --explain prints it. */
const char *attn_ctx_last_explain(const attn_ctx *ctx);

/* ------------------------------------------------------------------------ */
/* PyTorch-compatible random numbers                                         */
/* ------------------------------------------------------------------------ */

/*
 * attn_rng reproduces PyTorch's CPU generator (mt19937): with the same seed
 * and the same sequence of calls, rand, uniform and the nn.Linear init give
 * bit-identical floats to torch.manual_seed + torch.rand / nn.Linear.
 *
 * Bernoulli draws (dropout masks) differ between PyTorch builds:
 *   ATTN_BERNOULLI_MT19937   builds without MKL (Debian's python3-torch) and
 *                            PyPI builds on non-Intel CPUs: per element a
 *                            53-bit double from two mt19937 draws (the first
 *                            is the high word); keep when u < 1 - p.
 *   ATTN_BERNOULLI_MKL_MCG31 builds with MKL on Intel CPUs (the seeds'
 *                            printed dropout example): one 32-bit mt19937
 *                            draw seeds an MCG31m1 stream, element k keeps
 *                            when its k-th uniform u < 1 - p (ICDF method).
 * Those two are serial streams: a dropout call must draw its mask element
 * by element, in order. The third is not PyTorch's CPU mask, but a
 * counter-based one the fused kernels draw inside the kernel:
 *   ATTN_BERNOULLI_PHILOX    Philox4x32-10 (PyTorch's CUDA generator) keyed
 *                            by the rng's seed; each dropout call takes the
 *                            next offset, and element e of the call (its
 *                            flat index in the (B, H, T, S) weights) keeps
 *                            when word (e / 16) % 4 of the block at counter
 *                            (16 (e / 64) + e % 16, offset) is
 *                            < floor((1 - p) * 2^32) (16 neighbours take
 *                            one word of 16 blocks: a vector lane each).
 *                            Any tile draws its own mask on any thread, and
 *                            the backward draws it again instead of keeping
 *                            it; mt19937 draws are not consumed.
 */
typedef enum attn_bernoulli_method {
    ATTN_BERNOULLI_MT19937 = 0,
    ATTN_BERNOULLI_MKL_MCG31 = 1,
    ATTN_BERNOULLI_PHILOX = 2
} attn_bernoulli_method;

typedef struct attn_rng attn_rng;

/* ctx receives the rng's error messages; it may be NULL (statuses only). */
attn_status attn_rng_new(attn_ctx *ctx, uint64_t seed, attn_rng **out);
/* Frees rng (NULL is fine). */
void attn_rng_free(attn_rng *rng);
/* torch.manual_seed(seed) */
attn_status attn_rng_manual_seed(attn_rng *rng, uint64_t seed);
/* Chooses how dropout masks are drawn (see above); ATTN_ERR_INVALID for
 * an unknown method. */
attn_status attn_rng_set_bernoulli_method(attn_rng *rng, attn_bernoulli_method method);
/* The next raw 32-bit mt19937 output (the generator's random()). */
attn_status attn_rng_next_u32(attn_rng *rng, uint32_t *out);
/* torch.rand(n): uniform [0, 1), bit-identical. */
attn_status attn_rng_rand(attn_rng *rng, float *out, size_t n);
/* tensor.uniform_(from, to) on a float32 tensor of n elements, bit-identical. */
attn_status attn_rng_uniform(attn_rng *rng, float *out, size_t n, double from, double to);
/* torch.randn(n): standard normal. Bit-identical for n < 16; for n >= 16
 * the same draws, Box-Muller order and float arithmetic as PyTorch's AVX2
 * kernel, with libm's log/sin/cos in place of its vector ones: most values
 * are bit-identical, the rest within a few float ulps. */
attn_status attn_rng_randn(attn_rng *rng, float *out, size_t n);
/* nn.Linear(in_features, out_features).reset_parameters(): weight
 * (out_features, in_features) ~ U(-1/sqrt(in), 1/sqrt(in)) via
 * kaiming_uniform_(a=sqrt(5)), then bias (out_features) if non-NULL. */
attn_status attn_rng_linear_init(attn_rng *rng, float *weight, float *bias,
                                 size_t out_features, size_t in_features);
/* F.dropout(x, p, training=True) on n elements: y = x * mask / (1 - p).
 * y may equal x. keep_mask (optional) receives 1 or 0 per element. */
attn_status attn_rng_dropout(attn_rng *rng, const float *x, float *y, size_t n, double p,
                             uint8_t *keep_mask);

/*
 * The draws of the book's data loading and sampling, draw for draw with
 * PyTorch 1.13's CPU generator (Debian's python3-torch):
 */
/* torch.empty((), dtype=torch.int64).random_(): a 64-bit draw (two 32-bit
 * draws, the first the high word) modulo 2^63. DataLoader and
 * RandomSampler draw their seeds this way. */
attn_status attn_rng_random_int64(attn_rng *rng, int64_t *out);
/* torch.randperm(n, generator=rng) into out[n]: for i in 0 .. n-2 the
 * element at i swaps with the one at i + (a 32-bit draw % (n - i)).
 * PyTorch 2.x does the same below n = 2^32 / 20; above it (not here) it
 * draws 64-bit and shuffles inside out. */
attn_status attn_rng_randperm(attn_rng *rng, size_t n, int64_t *out);
/* torch.multinomial(probs, num_samples=1) on one row of n float weights
 * (need not sum to 1): every weight finite and >= 0 with a nonzero sum, or
 * ATTN_ERR_INVALID before any draw. Draws 2n 32-bit words (an Exp(1) per
 * category) and returns the first argmax of probs[i] / q_i, as PyTorch
 * 1.13 without MKL and current 2.x builds do; 2.x wheels that still drew
 * exponential_ from MKL's stream on Intel CPUs pick other indices. */
attn_status attn_rng_multinomial(attn_rng *rng, const float *probs, size_t n, int64_t *out);
/* The generator's whole state (torch's get_state / set_state, in this
 * library's layout of attn_rng_state_size bytes, little-endian): the
 * mt19937 words and position, the Bernoulli method, the seed, the Philox
 * offset and the cached normal. A generator set from another's state draws
 * what that one would. size must be attn_rng_state_size() (ATTN_ERR_SHAPE);
 * bytes that are no state (a Philox offset past 2^63 among them) are
 * ATTN_ERR_FORMAT, the generator unchanged. */
size_t attn_rng_state_size(void);
attn_status attn_rng_get_state(const attn_rng *rng, void *state, size_t size);
attn_status attn_rng_set_state(attn_rng *rng, const void *state, size_t size);

/*
 * What the library knows of the CPU it runs on, read once from CPUID (and
 * the OS for the caches): the kernels choose tiles, vector widths and
 * blocks from it, and the benchmarks print it beside every figure.
 */
typedef struct attn_cpu_info {
    char vendor[16];          /* "GenuineIntel", "AuthenticAMD", "" elsewhere */
    char model_name[64];      /* the brand string ("AMD EPYC 9R14 ...")      */
    unsigned family, model;   /* display family and model (Zen 4: 25, Zen 5: 26) */
    const char *uarch;        /* "zen4", "zen5", "intel-avx512", "intel-avx2",
                                 "generic": what the tuning keys on         */
    bool avx2_fma, avx512f, avx512_bf16, avx512_fp16, amx_bf16; /* usable (OS too) */
    unsigned fma_vector_bits; /* widest FMA datapath: 512 full width; 256
                                 where 512-bit ops are split (Zen 4)        */
    size_t l1d_bytes, l2_bytes, l3_bytes; /* per core; l3: per slice/CCX    */
} attn_cpu_info;

/* Fills *out (never fails on a valid pointer; unknown fields stay 0/""). */
attn_status attn_cpu_info_get(attn_cpu_info *out);

/*
 * Asks the OS for the AMX tile state for this process (Linux:
 * arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA), as oneDNN and PyTorch do),
 * so that the bf16 kernels may run on AMX tiles: ATTN_OK once given (also
 * when it already was), ATTN_ERR_UNSUPPORTED where the CPU or OS has no
 * AMX. The library never asks by itself, since the permission is the
 * whole process's; without it, bf16 runs on AVX-512.
 */
attn_status attn_cpu_request_amx(void);

/*
 * Element types, as safetensors names them. The 16-bit ones are also what
 * attn_sdpa_forward_16 and attn_gemm_16 take: raw bits in uint16_t
 * (bf16: the top half of a float32; f16: IEEE binary16).
 */
typedef enum attn_dtype {
    ATTN_DTYPE_F32 = 0, /* loadable */
    ATTN_DTYPE_F16,     /* loadable, exact */
    ATTN_DTYPE_BF16,    /* loadable, exact */
    ATTN_DTYPE_F64,     /* loadable, rounded to nearest float */
    ATTN_DTYPE_BOOL,    /* listed only, from here on */
    ATTN_DTYPE_U8,
    ATTN_DTYPE_I8,
    ATTN_DTYPE_I16,
    ATTN_DTYPE_U16,
    ATTN_DTYPE_I32,
    ATTN_DTYPE_U32,
    ATTN_DTYPE_I64,
    ATTN_DTYPE_U64,
    ATTN_DTYPE_F8_E4M3,
    ATTN_DTYPE_F8_E5M2,
    ATTN_DTYPE_I4       /* a KV cache's int4 (attn_kv_cache_config) */
} attn_dtype;

/* The safetensors spelling of a dtype: "F32", "BF16", ... ("?" if unknown). */
const char *attn_dtype_name(attn_dtype dtype);

/* ------------------------------------------------------------------------ */
/* Operations: the seeds' tensor steps as functions                          */
/* ------------------------------------------------------------------------ */

/* c (m, n) = a (m, k) @ b, where b is (k, n), or (n, k) when b_transposed. */
attn_status attn_matmul(attn_ctx *ctx, const float *a, const float *b, float *c, size_t m,
                        size_t k, size_t n, bool b_transposed);
/* torch.softmax(x, dim=-1) over rows of length cols; y may equal x. */
attn_status attn_softmax(attn_ctx *ctx, const float *x, float *y, size_t rows, size_t cols);
/* y (rows, out) = x (rows, in) @ weight^T (+ bias); weight is (out, in). */
attn_status attn_linear(attn_ctx *ctx, const float *x, const float *weight, const float *bias,
                        float *y, size_t rows, size_t in_features, size_t out_features);
/*
 * BLAS's sgemm, row-major: c (m, n) = alpha * op(a) @ op(b) + beta * c,
 * where op(a) (m, k) is a, or with trans_a the transpose of a stored
 * (k, m); op(b) (k, n) is b, or with trans_b the transpose of b stored
 * (n, k). lda, ldb, ldc are the stored row strides (at least the stored
 * row lengths). beta == 0 never reads c; alpha == 0 reads neither a nor b
 * (c = beta * c, as BLAS's). Runs on the ctx's kernels and
 * threads: the reference sums in double; the fast kernels in float, with
 * results bitwise the same for any thread count.
 */
attn_status attn_gemm(attn_ctx *ctx, bool trans_a, bool trans_b, size_t m, size_t n, size_t k,
                      float alpha, const float *a, size_t lda, const float *b, size_t ldb,
                      float beta, float *c, size_t ldc);
/*
 * The same on 16-bit a and b (dtype ATTN_DTYPE_BF16 or ATTN_DTYPE_F16, raw
 * bits) with c in float, as OpenBLAS's sbgemm: every product exact in
 * float, sums in float. bf16 runs on AMX tiles where the process may use
 * them (attn_cpu_request_amx), on vdpbf16ps where that is faster than
 * float (AMD's avx512_bf16; not Intel's, which issues it at half the rate
 * of two float FMAs), else widened to float on packing and run on the
 * float kernels, as f16 always is. AMX and vdpbf16ps read bf16 denormals
 * as zero. For the projections of a bf16 model: weights stored once in
 * bf16, half the bytes.
 */
attn_status attn_gemm_16(attn_ctx *ctx, attn_dtype dtype, bool trans_a, bool trans_b, size_t m,
                         size_t n, size_t k, float alpha, const void *a, size_t lda,
                         const void *b, size_t ldb, float beta, float *c, size_t ldc);
/* scores (T, T) in place: masked_fill(triu(ones, diagonal=1), -inf). */
attn_status attn_mask_causal_neg_inf(attn_ctx *ctx, float *scores, size_t tokens);
/* weights (T, T) in place: multiply by tril(ones), divide rows by their sums. */
attn_status attn_mask_causal_renormalize(attn_ctx *ctx, float *weights, size_t tokens);

/*
 * Scaled dot-product attention on the caller's tensors, forward and
 * backward, for every variant the modules use:
 *
 *   out[b, h, i] = sum_j dropout(P[b, h, i, j]) v[b, h / G, j]
 *   P[b, h, i, :] = softmax over the keys j query i sees (and the head's sink) of
 *       s_ij = softcap(q_i . k_j * scale) - alibi_slope_h * |pos_i - j|
 *
 * on the fused kernels (online softmax, no (T, S) buffer) unless the ctx
 * runs the reference ones. q, out are (B, H, T, hd) and k, v (B, H_kv, S,
 * hd), each addressed through (b, t, h) element strides (zeros: the
 * contiguous (B, T, H, hd) layout of a module's projections); each head's
 * hd values are contiguous. Every field added since 0.1 is off when zero,
 * so a config written for 0.1 means what it meant:
 *   - GQA/MQA: kv_heads (0: heads) divides heads; query heads h*G..h*G+G-1
 *     share KV head h (PyTorch's enable_gqa, repeat_interleave).
 *   - Positions: query i sits at key position pos_i = i + S - T
 *     (ATTN_ALIGN_BOTTOM_RIGHT, the default: the last query sees every
 *     key, as FlashAttention and a KV cache need), pos_i = i
 *     (ATTN_ALIGN_TOP_LEFT: PyTorch's is_causal) or i + q_offset.
 *   - causal hides key j from query i when j > pos_i.
 *   - window: query i sees keys pos_i - window_left <= j <= pos_i +
 *     window_right, a bound of -1 unbounded (FlashAttention-2's
 *     window_size; the book's sliding_window_size W is (W - 1, 0) with
 *     causal).
 *   - softcap > 0: s = softcap * tanh(s / softcap) (Gemma 2), after scale.
 *   - alibi_slopes (heads finite floats): s -= slope_h * |pos_i - j|.
 *   - sinks (heads finite floats): a logit in each row's softmax denominator
 *     with no value (gpt-oss); the backward writes its gradient to
 *     sinks_grad.
 *   - cu_seqlens_q, cu_seqlens_kv (batch + 1 int32 each): packed variable-
 *     length batches. q, out are (total_q, H, hd) and k, v (total_kv, H_kv,
 *     hd), sequence b being rows [cu[b], cu[b + 1]); q_tokens and kv_tokens
 *     are then the longest lengths, the b strides are ignored, and lse is
 *     (H, total_q). block_mask and score_mods are then in each sequence's
 *     own positions, as flash_attn_varlen's: query i and key j of sequence
 *     b are the mask's (b, h, i, j) (its batch 1 or batch; its q_len and
 *     kv_len at least every sequence's, ATTN_ERR_SHAPE naming the sequence
 *     otherwise), and ALiBi's, T5's, a bias tensor's (b, h, q_idx, kv_idx)
 *     and a callback's tile are local alike (one ALiBi offset for every
 *     sequence).
 * A query that sees no key outputs zeros and lse -inf (with a sink: the
 * sink), never NaN.
 *
 * Memory: the outputs (out and lse; the backward's dq, dk, dv, sinks_grad
 * and the score modifiers' tensor_grad) may not overlap any input (q, k,
 * v, the backward's out, lse and dout, alibi_slopes, sinks, cu_seqlens_*,
 * the score modifiers' tensors) or one another, not even out == q; inputs
 * may share memory (k and v one buffer, a fused qkv tensor read through
 * strides). Each tensor's span runs from its first element to its last
 * under its strides (a bias's over the problem). An output whose strides make two
 * of its rows overlap is refused as well (ATTN_ERR_INVALID), and strides
 * that reach past the end of memory (ATTN_ERR_OVERFLOW).
 */
typedef enum attn_align {
    ATTN_ALIGN_BOTTOM_RIGHT = 0,
    ATTN_ALIGN_TOP_LEFT = 1,
    ATTN_ALIGN_OFFSET = 2
} attn_align;

typedef struct attn_sdpa_config {
    size_t batch, heads, q_tokens, kv_tokens, head_dim;
    size_t q_strides[3], kv_strides[3], out_strides[3]; /* (b, t, h); 0, 0, 0: contiguous */
    double scale;   /* 0: 1/sqrt(head_dim); else as the modules' scale */
    bool causal;
    double dropout; /* probability; > 0 needs an rng in ATTN_BERNOULLI_PHILOX mode */
    /* ---- since 0.2 (zero: off) ---- */
    size_t kv_heads;             /* 0: heads */
    size_t v_head_dim;           /* 0: head_dim; v and out have v_head_dim features */
    size_t v_strides[3];         /* 0, 0, 0: kv_strides */
    attn_align align;
    long long q_offset;          /* with ATTN_ALIGN_OFFSET */
    bool window;
    long long window_left, window_right; /* -1: unbounded */
    double softcap;
    const float *alibi_slopes;   /* (heads) */
    const float *sinks;          /* (heads) */
    float *sinks_grad;           /* (heads): written by attn_sdpa_backward when sinks is set */
    const int32_t *cu_seqlens_q, *cu_seqlens_kv; /* (batch + 1) */
    /* ---- since 0.5 (NULL, 0: off): programmable attention, below ---- */
    const struct attn_block_mask *block_mask; /* the keys each query sees, ANDed with causal and window */
    const struct attn_score_mod *score_mods;  /* applied in order to q . k * scale */
    size_t score_mod_count;
} attn_sdpa_config;

/* What a forward's dropout drew from, for its backward. */
typedef struct attn_sdpa_dropout {
    uint64_t seed, offset;
} attn_sdpa_dropout;

/* out and lse (B, H, T: each row's log-sum-exp, the backward's input; may
 * be NULL for inference). rng and drawn are needed only with dropout: the
 * mask is Philox's (see attn_bernoulli_method), drawn inside the kernel. */
attn_status attn_sdpa_forward(attn_ctx *ctx, const attn_sdpa_config *cfg, const float *q,
                              const float *k, const float *v, float *out, float *lse,
                              attn_rng *rng, attn_sdpa_dropout *drawn);
/* dq (q's layout), dk, dv (k's and v's) from dout (out's layout), given the
 * forward's out and lse and, with dropout, what it drew. With GQA, dk and dv
 * sum their query heads' gradients in a fixed order: the same bits for any
 * thread count. The weights are recomputed from the scores against lse, as
 * FlashAttention's are: lse from a forward on other kernels (the
 * reference's scores are summed in double) puts each weight off by its
 * scores' rounding difference times scale, which large logits make large;
 * the modules keep their forward's own statistics and are exact either way.
 * A float lse alone is exact to |lse| 2^-24: where a row's |lse| passes 64
 * the fast kernels take their own lse first (one more pass over the
 * scores, without values). */
attn_status attn_sdpa_backward(attn_ctx *ctx, const attn_sdpa_config *cfg, const float *q,
                               const float *k, const float *v, const float *out,
                               const float *lse, const float *dout, float *dq, float *dk,
                               float *dv, const attn_sdpa_dropout *drawn);

/* The same two on float64 tensors (for gradient checks in double, e.g.
 * torch.autograd.gradcheck): the same config and semantics, always on the
 * reference kernels (plain loops, whatever the ctx's kernels; slow, meant
 * for small shapes), every score, weight and sum in double. scale and
 * softcap are used in double (the float calls round them to float);
 * alibi_slopes, sinks and sinks_grad stay float; dropout keeps with the same
 * Philox mask as the float calls and scales by float(1 / (1 - p)). The
 * backward recomputes from q, k, v: out and lse are checked, not read. */
attn_status attn_sdpa_forward_f64(attn_ctx *ctx, const attn_sdpa_config *cfg, const double *q,
                                  const double *k, const double *v, double *out, double *lse,
                                  attn_rng *rng, attn_sdpa_dropout *drawn);
attn_status attn_sdpa_backward_f64(attn_ctx *ctx, const attn_sdpa_config *cfg, const double *q,
                                   const double *k, const double *v, const double *out,
                                   const double *lse, const double *dout, double *dq, double *dk,
                                   double *dv, const attn_sdpa_dropout *drawn);

/*
 * The same two on 16-bit storage: q, k, v, out, dout, dq, dk, dv hold dtype
 * elements (ATTN_DTYPE_BF16 or ATTN_DTYPE_F16, raw bits; ATTN_DTYPE_F32
 * runs the float calls on them) in the config's layout; lse, alibi_slopes,
 * sinks and sinks_grad stay float. Scores, the softmax and every sum are
 * float; each output is rounded to dtype once. bf16 products run on AMX
 * tiles where the process may use them (attn_cpu_request_amx) and on
 * vdpbf16ps on AMD's CPUs with avx512_bf16, and there the weights P (the
 * backward's dS too) are rounded to bf16 before they multiply V (K, Q), as
 * PyTorch's bf16 SDPA does; elsewhere (Intel's cores issue vdpbf16ps at
 * half the float FMA's rate), and for f16, the tensors are widened to
 * float and run on the float kernels. Conformance: within PyTorch bf16's
 * own error against float64 on the same inputs. A backward whose score
 * modifiers take a gradient (a bias's, a table's, a callback's) runs the
 * float forward again on the widened tensors and reads its float32 out,
 * not the rounded one, so that gradient is float32's, as PyTorch's is.
 */
attn_status attn_sdpa_forward_16(attn_ctx *ctx, const attn_sdpa_config *cfg, attn_dtype dtype,
                                 const void *q, const void *k, const void *v, void *out,
                                 float *lse, attn_rng *rng, attn_sdpa_dropout *drawn);
attn_status attn_sdpa_backward_16(attn_ctx *ctx, const attn_sdpa_config *cfg, attn_dtype dtype,
                                  const void *q, const void *k, const void *v, const void *out,
                                  const float *lse, const void *dout, void *dq, void *dk,
                                  void *dv, const attn_sdpa_dropout *drawn);

/* The backward of a loss that reads lse as well as out (a z-loss; partial
 * attentions merged by their lse; PyTorch's flex_attention with
 * return_lse): dlse, lse's gradient in lse's layout and type (double for
 * ATTN_DTYPE_F64, float otherwise), adds dlse_i P_ij to the gradient of
 * each score s_ij (d lse_i / d s_ij = P_ij; the sink's too). dtype
 * ATTN_DTYPE_F32, F64, BF16 or F16, the tensors typed as attn_sdpa_backward's,
 * _f64's or _16's; the same semantics otherwise. dlse may not be NULL.
 * Nearly one-hot rows keep delta from out here (no consistent delta,
 * docs/exactness.md), as PyTorch's kernels do. A row that sees no key
 * (out 0, lse -inf) passes its dlse to nothing but its sink's gradient:
 * its dq is 0 and it adds nothing to dk and dv, as PyTorch's
 * flex_attention gives (not the NaN of autograd through a logsumexp over
 * -inf alone). */
attn_status attn_sdpa_backward_dlse(attn_ctx *ctx, const attn_sdpa_config *cfg, attn_dtype dtype,
                                    const void *q, const void *k, const void *v, const void *out,
                                    const void *lse, const void *dout, const void *dlse,
                                    void *dq, void *dk, void *dv,
                                    const attn_sdpa_dropout *drawn);

/* ------------------------------------------------------------------------ */
/* Programmable attention: masks, block maps and score modifiers as data     */
/* ------------------------------------------------------------------------ */

/*
 * What PyTorch's flex_attention takes as Python functions, as data: a mask
 * says which keys each query sees, visible(b, h, q_idx, kv_idx) with q_idx
 * in [0, T) and kv_idx in [0, S) (flex_attention's mask_mod), and score
 * modifiers change each score s = q . k * scale in order (its score_mod).
 * attn_sdpa_config's block_mask and score_mods hand them to every
 * attn_sdpa_* call, forward and backward:
 *
 *   s_ij = mod_n(... mod_1(q_i . k_j * scale)),  P_i = softmax over the
 *   keys j that block_mask (and causal, window) leave visible (and the sink)
 *
 * Masks are immutable values: primitives that reduce to per-row key
 * intervals, so that a tile of the score matrix is classified empty, full
 * or partial in closed form and no (T, S) mask is ever built, and AND, OR,
 * NOT of them. A combinator copies its operands (and a primitive its
 * arrays): every mask is freed on its own, whatever it was built from. A
 * tree holds at most 4096 nodes, 256 deep (each row's test visits them).
 */
typedef struct attn_mask attn_mask;

/* Every key. */
attn_status attn_mask_new_all(attn_ctx *ctx, attn_mask **out);
/* kv_idx <= q_idx + offset (0: PyTorch's is_causal; S - T: bottom-right). */
attn_status attn_mask_new_causal(attn_ctx *ctx, int64_t offset, attn_mask **out);
/* q_idx + offset - left <= kv_idx <= q_idx + offset + right; a bound of -1
 * is unbounded on that side (FlashAttention-2's window_size). */
attn_status attn_mask_new_window(attn_ctx *ctx, int64_t left, int64_t right, int64_t offset,
                                 attn_mask **out);
/* (q_idx + offset) / chunk == kv_idx / chunk, the division floored as
 * Python's // (a negative q_idx + offset sees no key): Llama 4's chunked
 * (local) attention, with causal ANDed by the caller. */
attn_status attn_mask_new_chunked(attn_ctx *ctx, size_t chunk, int64_t offset, attn_mask **out);
/* Prefix-LM: kv_idx <= q_idx or kv_idx < prefix[b] (a bidirectional prefix
 * and a causal rest); count 1 gives every sequence prefix[0], else count is
 * the batch. */
attn_status attn_mask_new_prefix_lm(attn_ctx *ctx, const int64_t *prefix, size_t count,
                                    attn_mask **out);
/* Packed documents: q_doc[b * q_len + q_idx] == kv_doc[b * kv_len + kv_idx]
 * (kv_doc NULL: q_doc, with kv_len = q_len); batch 1 broadcasts. Ids in
 * runs (each document contiguous) classify tiles in closed form; any ids
 * work. */
attn_status attn_mask_new_document(attn_ctx *ctx, const int32_t *q_doc, const int32_t *kv_doc,
                                   size_t batch, size_t q_len, size_t kv_len, attn_mask **out);
/* Global tokens: q_idx < tokens or kv_idx < tokens. */
attn_status attn_mask_new_global(attn_ctx *ctx, size_t tokens, attn_mask **out);
/* Key padding: kv_idx < length[b] (count 1: every sequence length[0]). */
attn_status attn_mask_new_kv_length(attn_ctx *ctx, const int64_t *length, size_t count,
                                    attn_mask **out);
attn_status attn_mask_new_and(attn_ctx *ctx, const attn_mask *a, const attn_mask *b,
                              attn_mask **out);
attn_status attn_mask_new_or(attn_ctx *ctx, const attn_mask *a, const attn_mask *b,
                             attn_mask **out);
attn_status attn_mask_new_not(attn_ctx *ctx, const attn_mask *a, attn_mask **out);
void attn_mask_free(attn_mask *m);
/* Whether (b, h, q_idx, kv_idx) is visible, element by element (for tests
 * and tools: the block map is how kernels read a mask). */
attn_status attn_mask_visible(attn_ctx *ctx, const attn_mask *m, size_t b, size_t h,
                              size_t q_idx, size_t kv_idx, bool *out);

/*
 * A block map (flex_attention's BlockMask): the score matrix of each
 * (batch, head) cut into tiles of block_q queries by block_kv keys, and
 * for each query block the key blocks to visit, split into full ones (every
 * element visible: no test) and partial ones (a bit per element, kept in
 * the map). Blocks left out are skipped. batch or heads 1 is one map for
 * every sequence or head (flex's B=None, H=None). Built once, used by any
 * number of calls and layers of the same lengths; the backward reads its
 * transpose (built with it). A map of a closed-form mask whose rows are
 * single key intervals also runs on the fixed-feature kernels. Every
 * builder refuses a map past this machine's memory (ATTN_ERR_NO_MEMORY,
 * naming the bytes it takes at least and the memory) before allocating it.
 */
typedef struct attn_block_mask attn_block_mask;

typedef struct attn_block_mask_config {
    size_t batch, heads;       /* 1 where the map is the same for every b / h */
    size_t q_len, kv_len;      /* T, S */
    size_t block_q, block_kv;  /* 0: 64 each; else a power of two from 16 to 256 */
} attn_block_mask_config;

/* From a mask description: tiles classified in closed form, partial tiles'
 * bits evaluated from it (no (T, S) mask is built). */
attn_status attn_block_mask_from_mask(attn_ctx *ctx, const attn_block_mask_config *cfg,
                                      const attn_mask *mask, attn_block_mask **out);
/* From a dense boolean mask (nonzero: visible; PyTorch's bool attn_mask)
 * of (batch, heads, T, S) of the config, element (b, h, i, j) at b *
 * strides[0] + h * strides[1] + i * strides[2] + j * strides[3] (a stride
 * of 0 broadcasts). */
attn_status attn_block_mask_from_bool(attn_ctx *ctx, const attn_block_mask_config *cfg,
                                      const uint8_t *mask, const size_t strides[4],
                                      attn_block_mask **out);
/* From a dense additive float mask: -inf hides an element; NaN and +inf are
 * refused (ATTN_ERR_INVALID naming where); the finite values are scores to
 * add, which the caller passes as an ATTN_SCORE_BIAS modifier over the same
 * tensor. */
attn_status attn_block_mask_from_additive(attn_ctx *ctx, const attn_block_mask_config *cfg,
                                          const float *mask, const size_t strides[4],
                                          attn_block_mask **out);
/* From a callback, once per element: 1 visible, 0 hidden, negative an error
 * (returned as ATTN_ERR_INVALID naming the element). */
typedef int (*attn_mask_fn)(void *user, size_t b, size_t h, size_t q_idx, size_t kv_idx);
attn_status attn_block_mask_from_fn(attn_ctx *ctx, const attn_block_mask_config *cfg,
                                    attn_mask_fn fn, void *user, attn_block_mask **out);
/* From block lists (BlockMask.from_kv_blocks): for each (b, h, query block)
 * num[.] partial key blocks in indices[. * max + 0 .. num[.]), and, if
 * full_num is not NULL, full_num[.] full ones in full_indices (stride
 * full_max); int32, (batch, heads, q_blocks) rows. A partial block's
 * elements are those mask (NULL: all) leaves visible. A block out of range
 * or listed twice is refused, naming it. */
attn_status attn_block_mask_from_kv_blocks(attn_ctx *ctx, const attn_block_mask_config *cfg,
                                           const int32_t *num, const int32_t *indices,
                                           size_t max, const int32_t *full_num,
                                           const int32_t *full_indices, size_t full_max,
                                           const attn_mask *mask, attn_block_mask **out);
void attn_block_mask_free(attn_block_mask *m);

typedef struct attn_block_mask_info {
    attn_block_mask_config config;  /* block sizes filled in */
    size_t q_blocks, kv_blocks;
    size_t full_blocks, partial_blocks; /* over all (b, h, query block) of the map */
    double sparsity;                /* percent of (batch, heads) tiles skipped, as BlockMask.sparsity() */
    bool row_intervals;             /* each row sees one interval of keys, the same for every head */
} attn_block_mask_info;
/* The map's sizes and counts into *out; ATTN_ERR_NULL for a NULL m or out.
 * This and attn_block_mask_to_string keep no message: a map may be shared
 * read-only between threads, so it writes to no ctx; each status names its
 * argument here. */
attn_status attn_block_mask_get_info(const attn_block_mask *m, attn_block_mask_info *out);
/* The map of (b, h) (below the map's batch and heads) as
 * BlockMask.to_string() draws it, a line per query block, a character per
 * key block ('#' full, '~' partial, '.' skipped), into buf (size bytes,
 * NUL-terminated); *needed (if not NULL) receives the bytes the whole
 * drawing takes, with its NUL, even where the size refuses: size 0 asks
 * only that, a smaller size is ATTN_ERR_INVALID (buf untouched), as are b
 * or h past the map's; ATTN_ERR_NULL for a NULL m, or a NULL buf with size
 * above 0. No message (above). */
attn_status attn_block_mask_to_string(const attn_block_mask *m, size_t b, size_t h, char *buf,
                                      size_t size, size_t *needed);

/*
 * Score modifiers, applied in order to s = q . k * scale, each with its
 * backward. A chain in attn_sdpa_config.score_mods replaces the config's
 * softcap and alibi_slopes (a config with both is refused): put them in
 * the chain where they belong.
 */
typedef enum attn_score_mod_kind {
    ATTN_SCORE_SCALE = 1,   /* s *= value */
    ATTN_SCORE_SOFTCAP,     /* s = value * tanh(s / value), value > 0 */
    ATTN_SCORE_ALIBI,       /* s -= tensor[h] * |q_idx + offset - kv_idx|, or with
                               signed_distance s += tensor[h] * (kv_idx - q_idx - offset) */
    ATTN_SCORE_BIAS,        /* s += tensor[b, h, q_idx, kv_idx] through strides (0 broadcasts) */
    ATTN_SCORE_REL_BIAS,    /* s += tensor[h * buckets + bucket(kv_idx - q_idx)]: T5's buckets */
    ATTN_SCORE_CALLBACK,    /* fn on each score tile, grad_fn in the backward */
    ATTN_SCORE_REL_TABLE    /* s += tensor[h * buckets + e], e = q_idx - kv_idx + offset (or
                               with signed_distance kv_idx - q_idx + offset), a negative e
                               counting from the row's end as Python's indexing does
                               (table[h, q_idx - kv_idx]): every e the problem's lengths
                               reach must lie in [-buckets, buckets) */
} attn_score_mod_kind;

/* A tile of scores handed to a callback: rows [q0, q0 + rows) of (b, h)
 * against keys [kv0, kv0 + cols), row-major with row stride ld. */
typedef struct attn_score_tile {
    size_t b, h, q0, kv0, rows, cols, ld;
    float *scores;
} attn_score_tile;
/* Forward: tile->scores in place (the modifier's input in, its output
 * out). Backward: tile->scores holds the modifier's input and grad (same
 * layout) the gradient of its output, which grad_fn turns in place into
 * the gradient of its input. Nonzero: an error, returned as
 * ATTN_ERR_INVALID naming the modifier and the tile; the attn_sdpa_* call
 * then leaves its outputs (and its rng) as they were: a call that runs a
 * callback copies them first, and puts them back when one fails. Called
 * from the ctx's threads, concurrently. float64 calls hand callbacks float
 * copies of their scores. */
typedef int (*attn_score_fn)(void *user, const attn_score_tile *tile);
typedef int (*attn_score_grad_fn)(void *user, const attn_score_tile *tile, float *grad);

typedef struct attn_score_mod {
    attn_score_mod_kind kind;
    double value;            /* SCALE: the factor; SOFTCAP: the cap */
    const float *tensor;     /* ALIBI: slopes (heads); BIAS: the bias; REL_BIAS, REL_TABLE:
                                (heads, buckets) */
    float *tensor_grad;      /* BIAS, REL_BIAS, REL_TABLE: written by the backward (tensor's
                                layout; broadcast elements get their sums); NULL: not wanted */
    size_t strides[4];       /* BIAS: element strides of (b, h, q_idx, kv_idx) */
    int64_t offset;          /* ALIBI: the query's position is q_idx + offset; REL_TABLE: added
                                to the distance */
    bool signed_distance;    /* ALIBI: attention-gym's signed form; REL_TABLE: kv_idx - q_idx */
    size_t buckets, max_distance; /* REL_BIAS: T5's num_buckets and max_distance (past the
                                     buckets / 2 exact ones, buckets / 4 bidirectional);
                                     REL_TABLE: a head's row length */
    bool bidirectional;      /* REL_BIAS: T5's bidirectional */
    attn_score_fn fn;        /* CALLBACK */
    attn_score_grad_fn grad_fn;
    void *user;
} attn_score_mod;

/* ------------------------------------------------------------------------ */
/* Modules                                                                   */
/* ------------------------------------------------------------------------ */

/*
 * How a causal module hides the future:
 *   ATTN_MASK_NEG_INF      scores.masked_fill_(triu, -inf), then softmax (default)
 *   ATTN_MASK_RENORMALIZE  softmax, multiply by tril, divide by row sums
 *   ATTN_MASK_NONE         no mask (what seed 000's out-of-place masked_fill does)
 */
typedef enum attn_mask_method {
    ATTN_MASK_NEG_INF = 0,
    ATTN_MASK_RENORMALIZE = 1,
    ATTN_MASK_NONE = 2
} attn_mask_method;

/* A parameter tensor of a module, named as in the PyTorch state_dict. grad
 * has the shape of data and holds what backward passes accumulated into it
 * (PyTorch's .grad); it exists, zeroed, from construction. */
typedef struct attn_param {
    const char *name;
    float *data;
    float *grad;
    size_t ndim;
    size_t shape[2];
    size_t numel;
} attn_param;

/* Every module can be used through this generic view. */
typedef struct attn_module attn_module;

typedef enum attn_module_kind {
    ATTN_MODULE_SIMPLE,      /* simplified self-attention, no weights     */
    ATTN_MODULE_SA_V1,       /* SelfAttention_v1                          */
    ATTN_MODULE_SA_V2,       /* SelfAttention_v2                          */
    ATTN_MODULE_CAUSAL,      /* CausalAttention                           */
    ATTN_MODULE_MHA_WRAPPER, /* MultiHeadAttentionWrapper                 */
    ATTN_MODULE_MHA,         /* MultiHeadAttention                        */
    ATTN_MODULE_GPT2,        /* GPT-2 CausalSelfAttention (fused c_attn)  */
    ATTN_MODULE_GQA,         /* GroupedQueryAttention (the book's ch04)   */
    ATTN_MODULE_MLA,         /* MultiHeadLatentAttention (ch04)           */
    ATTN_MODULE_SWA          /* MultiHeadAttentionWithSWA (ch04)          */
} attn_module_kind;

/* Which of the ATTN_MODULE_KIND_COUNT variants m is. */
attn_module_kind attn_module_get_kind(const attn_module *m);
/* The PyTorch class name: "MultiHeadAttention". */
const char *attn_module_class_name(const attn_module *m);
/* The input width: x is (B, T, d_in). */
size_t attn_module_d_in(const attn_module *m);
/* The output width: y is (B, T, d_out) (num_heads * d_out for the
 * wrapper). */
size_t attn_module_d_out(const attn_module *m);
/* Number of parameter tensors, and the total number of scalars. */
size_t attn_module_param_count(const attn_module *m);
/* The number of scalars in all parameters together (numel summed). */
size_t attn_module_num_scalars(const attn_module *m);
/* Parameters in state_dict order. */
attn_status attn_module_param_at(attn_module *m, size_t index, attn_param *out);
/* The parameter of that state_dict name ("out_proj.weight"): its data
 * and grad pointers stay valid until the module is freed.
 * ATTN_ERR_NOT_FOUND naming the module and the name when there is none. */
attn_status attn_module_param(attn_module *m, const char *name, attn_param *out);
/* module.train() / module.eval(); modules start in training mode like
 * PyTorch, which matters only where dropout > 0. */
attn_status attn_module_set_training(attn_module *m, bool training);
/* True in training mode (module.training). */
bool attn_module_training(const attn_module *m);
/*
 * y (B, T, d_out) = module(x (B, T, d_in)). rng supplies dropout draws and
 * is needed only in training mode with dropout > 0 (else may be NULL).
 * y may not overlap x (ATTN_ERR_INVALID).
 */
attn_status attn_module_forward(attn_module *m, const float *x, size_t batch, size_t tokens,
                                float *y, attn_rng *rng);
/*
 * Training. With gradients enabled (the default, as PyTorch parameters
 * require grad) a forward keeps what its backward needs: a copy of x, the
 * projections, and the dropout masks it drew, one bit per element (so the
 * backward uses the very mask the forward drew). Disabled, a forward keeps
 * nothing (torch.no_grad()) and backward fails.
 */
attn_status attn_module_set_grad_enabled(attn_module *m, bool enabled);
/* Whether forwards keep what backward needs (default true). */
bool attn_module_grad_enabled(const attn_module *m);
/* Every parameter's grad set to zero: optimizer.zero_grad(set_to_none=False). */
attn_status attn_module_zero_grad(attn_module *m);
/*
 * The backward of the last forward. dy (B, T, d_out) is dL/dy; dx (B, T,
 * d_in) receives dL/dx (overwritten; NULL when not wanted), and every
 * parameter's dL/dW is added to its grad (+=). batch and tokens must be
 * those of the last forward. Calling it again adds the same gradients
 * again (as retain_graph=True would). Fails with ATTN_ERR_INVALID before
 * any forward or when gradients were disabled for it, when dx overlaps dy,
 * and where a parameter changed since the forward (an optimizer step, a
 * load, a write through its data), naming it and its versions (the count
 * of changes the module has seen) at the forward and now, as PyTorch
 * refuses a tensor "modified by an inplace operation".
 */
attn_status attn_module_backward(attn_module *m, const float *dy, size_t batch, size_t tokens,
                                 float *dx);
/* Frees any module through its generic view (NULL is fine); the same as
 * the variant's _free. */
void attn_module_free(attn_module *m);

/*
 * Scale: every weighted module takes an optional scale for the scores; 0
 * means the seeds' default 1/sqrt(head_dim) (head_dim = d_out for the single
 * head modules). Any other value is used: it must be finite and round to a
 * finite float32 (|scale| < FLT_MAX plus half an ulp), or the constructor
 * fails with ATTN_ERR_INVALID. The scores are multiplied by scale rounded to
 * float32, as PyTorch's scores * scale does, so a scale below float32's
 * range (1e-50) multiplies by 0 and gives uniform attention, as there.
 *
 * Each variant's _backward is attn_module_backward on its module.
 *
 * Construction draws the weights from init_rng in the order the seeds' class
 * constructors do, so torch.manual_seed(s); Module(...) and
 * attn_rng_manual_seed(rng, s); attn_X_new(...) hold equal weights.
 */

/* 1. Simplified self-attention: context = softmax(x x^T) x, no weights. */
typedef struct attn_simple_config {
    size_t d_in;
} attn_simple_config;
typedef struct attn_simple attn_simple;
/* Builds a SimplifiedSelfAttention for width cfg->d_in (no weights) into
 * *out. ATTN_ERR_NULL, ATTN_ERR_INVALID (d_in 0), ATTN_ERR_NO_MEMORY. */
attn_status attn_simple_new(attn_ctx *ctx, const attn_simple_config *cfg, attn_simple **out);
/* y (B, T, d_in) = softmax(x x^T) x for x (B, T, d_in), B = batch, T =
 * tokens. ATTN_ERR_NULL, ATTN_ERR_SHAPE (zero batch or tokens),
 * ATTN_ERR_OVERFLOW. */
attn_status attn_simple_forward(attn_simple *m, const float *x, size_t batch, size_t tokens,
                                float *y);
/* attn_module_backward on this module: dy (B, T, d_in) in, dx (B, T, d_in)
 * out (the module has no parameters). */
attn_status attn_simple_backward(attn_simple *m, const float *dy, size_t batch, size_t tokens,
                                 float *dx);
/* The seeds' one-query steps for x (T, d_in) and query row q:
 * scores (T) = x[q] . x[i], weights (T) = softmax(scores), context (d_in). */
attn_status attn_simple_forward_query(attn_simple *m, const float *x, size_t tokens,
                                      size_t query_index, float *scores, float *weights,
                                      float *context);
/* The generic view of the module (NULL for NULL): parameters, train/eval,
 * forward, backward, safetensors. */
attn_module *attn_simple_module(attn_simple *m);
/* Frees the module (NULL is fine). */
void attn_simple_free(attn_simple *m);

/* 2. SelfAttention_v1: W_query, W_key, W_value are (d_in, d_out), x @ W,
 *    initialised with torch.rand. */
typedef struct attn_sa_v1_config {
    size_t d_in, d_out;
    double scale; /* 0: the default, 1/sqrt(head_dim) */
} attn_sa_v1_config;
typedef struct attn_sa_v1 attn_sa_v1;
/* Builds a SelfAttention_v1 from cfg, drawing its weights from init_rng into
 * *out. Errors name the values: ATTN_ERR_NULL, ATTN_ERR_INVALID (a zero
 * width, a bad scale), ATTN_ERR_OVERFLOW, ATTN_ERR_NO_MEMORY. */
attn_status attn_sa_v1_new(attn_ctx *ctx, const attn_sa_v1_config *cfg, attn_rng *init_rng,
                           attn_sa_v1 **out);
/* y (B, T, d_out) = module(x (B, T, d_in)), B = batch, T = tokens.
 * ATTN_ERR_NULL, ATTN_ERR_SHAPE (zero batch or tokens), ATTN_ERR_OVERFLOW. */
attn_status attn_sa_v1_forward(attn_sa_v1 *m, const float *x, size_t batch, size_t tokens,
                               float *y);
/* attn_module_backward on this module: dy (B, T, d_out) in, dx (B, T, d_in)
 * out, parameter gradients accumulated. */
attn_status attn_sa_v1_backward(attn_sa_v1 *m, const float *dy, size_t batch, size_t tokens,
                                float *dx);
/* The generic view of the module (NULL for NULL): parameters, train/eval,
 * forward, backward, safetensors. */
attn_module *attn_sa_v1_module(attn_sa_v1 *m);
/* Frees the module (NULL is fine). */
void attn_sa_v1_free(attn_sa_v1 *m);

/* 3. SelfAttention_v2: nn.Linear projections (optional qkv_bias). */
typedef struct attn_sa_v2_config {
    size_t d_in, d_out;
    bool qkv_bias;
    double scale; /* 0: the default, 1/sqrt(head_dim) */
} attn_sa_v2_config;
typedef struct attn_sa_v2 attn_sa_v2;
/* Builds a SelfAttention_v2 from cfg, drawing its weights from init_rng into
 * *out. Errors name the values: ATTN_ERR_NULL, ATTN_ERR_INVALID (a zero
 * width, a bad scale), ATTN_ERR_OVERFLOW, ATTN_ERR_NO_MEMORY. */
attn_status attn_sa_v2_new(attn_ctx *ctx, const attn_sa_v2_config *cfg, attn_rng *init_rng,
                           attn_sa_v2 **out);
/* y (B, T, d_out) = module(x (B, T, d_in)), B = batch, T = tokens.
 * ATTN_ERR_NULL, ATTN_ERR_SHAPE (zero batch or tokens), ATTN_ERR_OVERFLOW. */
attn_status attn_sa_v2_forward(attn_sa_v2 *m, const float *x, size_t batch, size_t tokens,
                               float *y);
/* attn_module_backward on this module: dy (B, T, d_out) in, dx (B, T, d_in)
 * out, parameter gradients accumulated. */
attn_status attn_sa_v2_backward(attn_sa_v2 *m, const float *dy, size_t batch, size_t tokens,
                                float *dx);
/* The generic view of the module (NULL for NULL): parameters, train/eval,
 * forward, backward, safetensors. */
attn_module *attn_sa_v2_module(attn_sa_v2 *m);
/* Frees the module (NULL is fine). */
void attn_sa_v2_free(attn_sa_v2 *m);

/* 4. CausalAttention: causal mask and dropout on the attention weights. */
typedef struct attn_causal_config {
    size_t d_in, d_out, context_length;
    double dropout; /* probability of dropping an attention weight */
    bool qkv_bias;
    double scale; /* 0: the default, 1/sqrt(head_dim) */
    attn_mask_method mask;
} attn_causal_config;
typedef struct attn_causal attn_causal;
/* Builds a CausalAttention from cfg, drawing its weights from init_rng into
 * *out. Errors name the values: ATTN_ERR_NULL, ATTN_ERR_INVALID (a zero
 * width, a bad dropout, scale, mask or head count), ATTN_ERR_OVERFLOW,
 * ATTN_ERR_NO_MEMORY. */
attn_status attn_causal_new(attn_ctx *ctx, const attn_causal_config *cfg, attn_rng *init_rng,
                            attn_causal **out);
/* y (B, T, d_out) = module(x (B, T, d_in)), B = batch, T = tokens (T at most
 * the context length). dropout_rng draws the dropout masks in training
 * mode with dropout > 0 (else it may be NULL).
 * ATTN_ERR_NULL, ATTN_ERR_SHAPE (zero batch or tokens, tokens past context_length),
 * ATTN_ERR_OVERFLOW. */
attn_status attn_causal_forward(attn_causal *m, const float *x, size_t batch, size_t tokens,
                                float *y, attn_rng *dropout_rng);
/* attn_module_backward on this module: dy (B, T, d_out) in, dx (B, T, d_in)
 * out, parameter gradients accumulated. */
attn_status attn_causal_backward(attn_causal *m, const float *dy, size_t batch, size_t tokens,
                                 float *dx);
/* The generic view of the module (NULL for NULL): parameters, train/eval,
 * forward, backward, safetensors. */
attn_module *attn_causal_module(attn_causal *m);
/* Frees the module (NULL is fine). */
void attn_causal_free(attn_causal *m);

/* 5. MultiHeadAttentionWrapper: num_heads CausalAttention heads of width
 *    d_out each, outputs concatenated to (B, T, num_heads * d_out). */
typedef struct attn_mha_wrapper_config {
    size_t d_in, d_out, context_length, num_heads;
    double dropout;
    bool qkv_bias;
    double scale; /* 0: the default, 1/sqrt(head_dim) */
    attn_mask_method mask;
} attn_mha_wrapper_config;
typedef struct attn_mha_wrapper attn_mha_wrapper;
/* Builds a MultiHeadAttentionWrapper from cfg, drawing its weights from init_rng into
 * *out. Errors name the values: ATTN_ERR_NULL, ATTN_ERR_INVALID (a zero
 * width, a bad dropout, scale, mask or head count), ATTN_ERR_OVERFLOW,
 * ATTN_ERR_NO_MEMORY. */
attn_status attn_mha_wrapper_new(attn_ctx *ctx, const attn_mha_wrapper_config *cfg,
                                 attn_rng *init_rng, attn_mha_wrapper **out);
/* y (B, T, num_heads * d_out) = module(x (B, T, d_in)), B = batch, T = tokens (T at most
 * the context length). dropout_rng draws the dropout masks in training
 * mode with dropout > 0 (else it may be NULL).
 * ATTN_ERR_NULL, ATTN_ERR_SHAPE (zero batch or tokens, tokens past context_length),
 * ATTN_ERR_OVERFLOW. */
attn_status attn_mha_wrapper_forward(attn_mha_wrapper *m, const float *x, size_t batch,
                                     size_t tokens, float *y, attn_rng *dropout_rng);
/* attn_module_backward on this module: dy (B, T, num_heads * d_out) in, dx (B, T, d_in)
 * out, parameter gradients accumulated. */
attn_status attn_mha_wrapper_backward(attn_mha_wrapper *m, const float *dy, size_t batch, size_t tokens,
                                      float *dx);
/* The generic view of the module (NULL for NULL): parameters, train/eval,
 * forward, backward, safetensors. */
attn_module *attn_mha_wrapper_module(attn_mha_wrapper *m);
/* Frees the module (NULL is fine). */
void attn_mha_wrapper_free(attn_mha_wrapper *m);

/* 6. MultiHeadAttention: one projection split into num_heads heads of
 *    head_dim = d_out / num_heads, then out_proj (with bias). */
typedef struct attn_mha_config {
    size_t d_in, d_out, context_length, num_heads;
    double dropout;
    bool qkv_bias;
    double scale; /* 0: the default, 1/sqrt(head_dim) */
    attn_mask_method mask;
} attn_mha_config;
typedef struct attn_mha attn_mha;
/* Builds a MultiHeadAttention from cfg, drawing its weights from init_rng into
 * *out. Errors name the values: ATTN_ERR_NULL, ATTN_ERR_INVALID (a zero
 * width, a bad dropout, scale, mask or head count), ATTN_ERR_OVERFLOW,
 * ATTN_ERR_NO_MEMORY. */
attn_status attn_mha_new(attn_ctx *ctx, const attn_mha_config *cfg, attn_rng *init_rng,
                         attn_mha **out);
/* y (B, T, d_out) = module(x (B, T, d_in)), B = batch, T = tokens (T at most
 * the context length). dropout_rng draws the dropout masks in training
 * mode with dropout > 0 (else it may be NULL).
 * ATTN_ERR_NULL, ATTN_ERR_SHAPE (zero batch or tokens, tokens past context_length),
 * ATTN_ERR_OVERFLOW. */
attn_status attn_mha_forward(attn_mha *m, const float *x, size_t batch, size_t tokens,
                             float *y, attn_rng *dropout_rng);
/* attn_module_backward on this module: dy (B, T, d_out) in, dx (B, T, d_in)
 * out, parameter gradients accumulated. */
attn_status attn_mha_backward(attn_mha *m, const float *dy, size_t batch, size_t tokens,
                              float *dx);
/* The generic view of the module (NULL for NULL): parameters, train/eval,
 * forward, backward, safetensors. */
attn_module *attn_mha_module(attn_mha *m);
/* Frees the module (NULL is fine). */
void attn_mha_free(attn_mha *m);

/* 7. GPT-2 CausalSelfAttention: c_attn (3C, C) with bias gives q, k, v;
 *    c_proj (C, C) with bias. Parameter names as in GPT-2 checkpoints
 *    (c_attn.weight, c_attn.bias, c_proj.weight, c_proj.bias), stored in
 *    nn.Linear layout (out, in); Hugging Face's Conv1D stores the transpose.
 *    dropout, when > 0, is applied to the attention weights and to the
 *    output, as GPT-2's attn_pdrop and resid_pdrop (the seed has none). */
typedef struct attn_gpt2_config {
    size_t n_embd, n_head, block_size;
    double dropout;
    double scale; /* 0: the default, 1/sqrt(head_dim) */
} attn_gpt2_config;
typedef struct attn_gpt2 attn_gpt2;
/* Builds a CausalSelfAttention from cfg, drawing its weights from init_rng into
 * *out. Errors name the values: ATTN_ERR_NULL, ATTN_ERR_INVALID (a zero
 * width, a bad dropout, scale, mask or head count), ATTN_ERR_OVERFLOW,
 * ATTN_ERR_NO_MEMORY. */
attn_status attn_gpt2_new(attn_ctx *ctx, const attn_gpt2_config *cfg, attn_rng *init_rng,
                          attn_gpt2 **out);
/* y (B, T, n_embd) = module(x (B, T, n_embd)), B = batch, T = tokens (T at most
 * the context length). dropout_rng draws the dropout masks in training
 * mode with dropout > 0 (else it may be NULL).
 * ATTN_ERR_NULL, ATTN_ERR_SHAPE (zero batch or tokens, tokens past context_length),
 * ATTN_ERR_OVERFLOW. */
attn_status attn_gpt2_forward(attn_gpt2 *m, const float *x, size_t batch, size_t tokens,
                              float *y, attn_rng *dropout_rng);
/* attn_module_backward on this module: dy (B, T, n_embd) in, dx (B, T, n_embd)
 * out, parameter gradients accumulated. */
attn_status attn_gpt2_backward(attn_gpt2 *m, const float *dy, size_t batch, size_t tokens,
                               float *dx);
/* The generic view of the module (NULL for NULL): parameters, train/eval,
 * forward, backward, safetensors. */
attn_module *attn_gpt2_module(attn_gpt2 *m);
/* Frees the module (NULL is fine). */
void attn_gpt2_free(attn_gpt2 *m);

/*
 * The book's chapter-4 attention (rasbt/LLMs-from-scratch ch04: 04_gqa,
 * 05_mla, 06_swa), causal, without a KV cache: same parameter names,
 * registration order and initialisation as its classes, so the same seed
 * gives the same weights. Each module's _forward, _backward, _module and
 * _free work as MultiHeadAttention's; tokens are unlimited (the classes
 * have no context_length).
 */

/* 8. GroupedQueryAttention(d_in, d_out, dropout, num_heads, num_kv_groups,
 *    qkv_bias): W_query (d_out), W_key and W_value (num_kv_groups *
 *    head_dim), out_proj (no bias); num_heads / num_kv_groups query heads
 *    share each key/value head. */
typedef struct attn_gqa_config {
    size_t d_in, d_out, num_heads, num_kv_groups;
    double dropout;
    bool qkv_bias;
    double scale; /* 0: the default, 1/sqrt(head_dim) */
} attn_gqa_config;
typedef struct attn_gqa attn_gqa;
attn_status attn_gqa_new(attn_ctx *ctx, const attn_gqa_config *cfg, attn_rng *init_rng,
                         attn_gqa **out);
attn_status attn_gqa_forward(attn_gqa *m, const float *x, size_t batch, size_t tokens,
                             float *y, attn_rng *dropout_rng);
attn_status attn_gqa_backward(attn_gqa *m, const float *dy, size_t batch, size_t tokens,
                              float *dx);
attn_module *attn_gqa_module(attn_gqa *m);
void attn_gqa_free(attn_gqa *m);

/* 9. MultiHeadLatentAttention(d_in, d_out, dropout, num_heads, qkv_bias,
 *    latent_dim): W_query (d_out); W_DKV down to latent_dim (0: the
 *    book's default max(16, d_out / 8)); W_UK, W_UV up to d_out; out_proj. */
typedef struct attn_mla_config {
    size_t d_in, d_out, num_heads, latent_dim;
    double dropout;
    bool qkv_bias;
    double scale; /* 0: the default, 1/sqrt(head_dim) */
} attn_mla_config;
typedef struct attn_mla attn_mla;
attn_status attn_mla_new(attn_ctx *ctx, const attn_mla_config *cfg, attn_rng *init_rng,
                         attn_mla **out);
attn_status attn_mla_forward(attn_mla *m, const float *x, size_t batch, size_t tokens,
                             float *y, attn_rng *dropout_rng);
attn_status attn_mla_backward(attn_mla *m, const float *dy, size_t batch, size_t tokens,
                              float *dx);
attn_module *attn_mla_module(attn_mla *m);
void attn_mla_free(attn_mla *m);

/* 10. MultiHeadAttentionWithSWA(d_in, d_out, dropout, num_heads, qkv_bias,
 *     sliding_window_size): MultiHeadAttention's parameters; query i sees
 *     keys i - W + 1 .. i (0: no window, plain causal). */
typedef struct attn_swa_config {
    size_t d_in, d_out, num_heads, sliding_window_size;
    double dropout;
    bool qkv_bias;
    double scale; /* 0: the default, 1/sqrt(head_dim) */
} attn_swa_config;
typedef struct attn_swa attn_swa;
attn_status attn_swa_new(attn_ctx *ctx, const attn_swa_config *cfg, attn_rng *init_rng,
                         attn_swa **out);
attn_status attn_swa_forward(attn_swa *m, const float *x, size_t batch, size_t tokens,
                             float *y, attn_rng *dropout_rng);
attn_status attn_swa_backward(attn_swa *m, const float *dy, size_t batch, size_t tokens,
                              float *dx);
attn_module *attn_swa_module(attn_swa *m);
void attn_swa_free(attn_swa *m);

/* ------------------------------------------------------------------------ */
/* Any module by kind                                                        */
/* ------------------------------------------------------------------------ */

/* How many kinds there are: ATTN_MODULE_SIMPLE (0) .. ATTN_MODULE_SWA. */
#define ATTN_MODULE_KIND_COUNT 10

/* A kind's name, as the CLI's --module spells it: "simple", "sa1", "sa2",
 * "causal", "mha-wrapper", "mha", "gpt2", "gqa", "mla", "swa"; "" for a
 * value that is no kind. */
const char *attn_module_kind_name(attn_module_kind kind);
/* The PyTorch class a kind builds ("MultiHeadAttention"), as
 * attn_module_class_name gives it for the module; "" for no kind. */
const char *attn_module_kind_class_name(attn_module_kind kind);
/* The kind of that name (attn_module_kind_name's spelling) into *out.
 * ATTN_ERR_NULL, ATTN_ERR_NOT_FOUND naming the name and listing the kinds. */
attn_status attn_module_kind_from_name(attn_ctx *ctx, const char *name, attn_module_kind *out);

/*
 * What attn_module_new builds: each kind reads the fields its constructor
 * takes (its own config struct above) and ignores the rest, so that one
 * config can describe several kinds. Each field means what it means in
 * those structs (0 for scale, latent_dim, sliding_window_size: the default).
 */
typedef struct attn_module_config {
    size_t d_in;           /* every kind; GPT-2's n_embd */
    size_t d_out;          /* 0 for simple and gpt2 (which keep d_in), else the
                            * output width (each head's for mha-wrapper) */
    size_t context_length; /* causal, mha-wrapper, mha; GPT-2's block_size */
    size_t num_heads;      /* mha-wrapper, mha, gqa, mla, swa; GPT-2's n_head */
    size_t num_kv_groups;  /* gqa */
    size_t latent_dim;     /* mla; 0: the book's max(16, d_out / 8) */
    size_t sliding_window_size; /* swa; 0: no window (plain causal) */
    double dropout;        /* every kind but simple, sa1, sa2 */
    bool qkv_bias;         /* sa2, causal, mha-wrapper, mha, gqa, mla, swa */
    double scale;          /* every kind but simple; 0: 1/sqrt(head_dim) */
    attn_mask_method mask; /* causal, mha-wrapper, mha */
} attn_module_config;

/*
 * Builds a module of that kind from cfg into *out, drawing its weights from
 * init_rng (unused by simple, which may pass NULL): the module the kind's own
 * constructor (attn_mha_new, ...) builds from the same fields and rng, weight
 * for weight. Free it with attn_module_free. Errors name the values:
 * ATTN_ERR_NULL, ATTN_ERR_INVALID (no such kind; simple's or gpt2's d_out
 * neither 0 nor d_in), then the constructor's own.
 */
attn_status attn_module_new(attn_ctx *ctx, attn_module_kind kind, const attn_module_config *cfg,
                            attn_rng *init_rng, attn_module **out);

/* ------------------------------------------------------------------------ */
/* GPT-2 presets and parameter counting                                      */
/* ------------------------------------------------------------------------ */

typedef struct attn_gpt2_preset {
    const char *name; /* "gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl" */
    size_t vocab_size, context_length, n_embd, n_head, n_layer;
    double dropout;
    bool qkv_bias; /* true: GPT-2's c_attn has a bias */
} attn_gpt2_preset;

/* The number of GPT-2 presets (4: small, medium, large, xl). */
size_t attn_gpt2_preset_count(void);
/* Preset index (0 .. count - 1) into *out; ATTN_ERR_NOT_FOUND past the end. */
attn_status attn_gpt2_preset_at(size_t index, attn_gpt2_preset *out);
/* By name; "small" and "gpt2-small" both work. */
attn_status attn_gpt2_preset_find(attn_ctx *ctx, const char *name, attn_gpt2_preset *out);
/* Scalars in a whole GPT-2 model of this preset (tied token embedding and
 * output head, as in the released checkpoints; c_attn's bias counted where
 * qkv_bias says): 124,439,808 for small. ATTN_ERR_INVALID for a zero
 * vocab_size, context_length, n_embd or n_head, or n_embd not a multiple of
 * n_head; ATTN_ERR_OVERFLOW past size_t. */
attn_status attn_gpt2_preset_model_params(attn_ctx *ctx, const attn_gpt2_preset *preset,
                                          size_t *out);

/* ------------------------------------------------------------------------ */
/* Files written whole or not at all                                         */
/* ------------------------------------------------------------------------ */

/*
 * Every file the library writes goes through an attn_file. A regular file
 * (or a new path) is written to a temporary beside it, flushed, fsync'd and
 * closed with every status checked, and renamed over the destination only
 * then: a full disk or a size limit leaves the previous file intact, byte
 * for byte, and no temporary behind. Through a symbolic link, the file it
 * names is replaced. A destination that is neither (a pipe, a terminal,
 * /dev/full) or that names an open descriptor (/dev/stdout, /dev/fd/N,
 * /proc/self/fd/N) cannot be replaced and is written in place: a descriptor
 * where it stands (after the file's bytes when it appends, as a shell's >>
 * does), and one open for reading only is refused.
 *
 * attn_file_open checks the destination (ATTN_ERR_IO for a directory, a
 * missing parent, no permission) and creates the temporary. attn_file_write
 * appends bytes. attn_file_close makes the temporary complete and durable;
 * attn_file_commit (which closes first when needed) renames it into place
 * and frees the handle, whatever it returns. attn_file_discard removes the
 * temporary and frees the handle at any step before the commit (NULL is
 * fine). After a failed write or close only attn_file_discard remains to
 * call, and the temporary is already gone. To write several files as one,
 * open all, write all and close all before committing any: a failure up to
 * the last close leaves every destination untouched.
 */
typedef struct attn_file attn_file;
attn_status attn_file_open(attn_ctx *ctx, const char *path, attn_file **out);
attn_status attn_file_write(attn_ctx *ctx, attn_file *file, const void *bytes, size_t size);
attn_status attn_file_close(attn_ctx *ctx, attn_file *file);
attn_status attn_file_commit(attn_ctx *ctx, attn_file *file);
void attn_file_discard(attn_file *file);
/* The temporary's path while file is open and writes to one ("DIR/.BASE.
 * <12 hex>.attn-tmp"), for a program that must remove it where it cannot
 * call attn_file_discard (a signal handler). NULL for NULL, for a file
 * written in place, and after a failed write or close (the temporary is
 * then already removed). The string stays valid until the next call on
 * file; attn_file_commit and attn_file_discard free it with the handle, so
 * a caller that keeps the path past them keeps a copy. */
const char *attn_file_temporary_path(const attn_file *file);

/* ------------------------------------------------------------------------ */
/* NumPy .npy files (float32 or int32, C order)                              */
/* ------------------------------------------------------------------------ */

#define ATTN_NPY_MAX_DIMS 8

typedef struct attn_npy {
    size_t ndim;
    size_t shape[ATTN_NPY_MAX_DIMS];
    size_t numel;
    float *data; /* owned: release with attn_npy_free */
} attn_npy;

/* Reads a little- or big-endian float32 (or float64, rounded to float32: a
 * finite value beyond float32's range is ATTN_ERR_FORMAT naming its index
 * and value, where a conversion would make it an infinity) array. */
attn_status attn_npy_read(attn_ctx *ctx, const char *path, attn_npy *out);
/* Parses an in-memory .npy image (for fuzzing and embedded use). */
attn_status attn_npy_parse(attn_ctx *ctx, const void *bytes, size_t size, attn_npy *out);
/* Writes data (shape[0] x ... x shape[ndim-1] floats) as a version 1.0
 * '<f4' C-order .npy, whole or not at all (attn_file). ATTN_ERR_NULL,
 * ATTN_ERR_INVALID (ndim > 8), ATTN_ERR_OVERFLOW, ATTN_ERR_IO naming the
 * path and the system's reason. */
attn_status attn_npy_write(attn_ctx *ctx, const char *path, const float *data, size_t ndim,
                           const size_t *shape);
/* The same .npy image appended to an open attn_file (which the caller then
 * commits or discards): for writing several files as one. */
attn_status attn_npy_write_file(attn_ctx *ctx, attn_file *file, const float *data, size_t ndim,
                                const size_t *shape);
/* Frees the data of a read or parsed array and zeroes it (NULL is fine). */
void attn_npy_free(attn_npy *npy);

/* An integer array: offsets and indices (cu_seqlens, token ids). */
typedef struct attn_npy_i32 {
    size_t ndim;
    size_t shape[ATTN_NPY_MAX_DIMS];
    size_t numel;
    int32_t *data; /* owned: release with attn_npy_i32_free */
} attn_npy_i32;

/* Reads a little- or big-endian int32 (or int64) array into int32; an
 * int64 value outside int32 is ATTN_ERR_FORMAT naming it and its index.
 * One-byte arrays (bool '|b1', uint8 '|u1', int8 '|i1': masks) are
 * widened to 0/1 and their values. 
 * Fortran order is read for arrays of at most one dimension (the same
 * bytes as C order). Other errors as attn_npy_read's. */
attn_status attn_npy_read_i32(attn_ctx *ctx, const char *path, attn_npy_i32 *out);
attn_status attn_npy_parse_i32(attn_ctx *ctx, const void *bytes, size_t size, attn_npy_i32 *out);
void attn_npy_i32_free(attn_npy_i32 *npy);

/* ------------------------------------------------------------------------ */
/* safetensors files                                                         */
/* ------------------------------------------------------------------------ */

/*
 * The safetensors format (Hugging Face): an 8-byte little-endian header
 * length N, N bytes of JSON, then the raw little-endian data. The JSON maps
 * each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
 * (offsets relative to the data section) and may hold "__metadata__", a map
 * of strings to strings.
 *
 * Reading is strict, as the reference implementation is: the header must be
 * UTF-8 JSON of that shape, at most ATTN_SAFETENSORS_MAX_HEADER bytes; every
 * tensor's byte range must match its dtype and shape, and the ranges must
 * tile the data section exactly (no overlap, no gap, nothing after).
 * Failures are ATTN_ERR_FORMAT (or ATTN_ERR_OVERFLOW for sizes past size_t)
 * with a message naming the file, the tensor and the values at fault.
 * Tensors of any safetensors dtype are listed; F32, F16, BF16 and F64 ones
 * can be loaded as float32: F16 and BF16 exactly, F64 rounded to nearest
 * (as torch's .float()).
 *
 * Writing produces F32 tensors sorted by name with the JSON padded by spaces
 * to a multiple of 8 bytes: byte for byte what the safetensors package's
 * save_file writes for the same float32 arrays and metadata (one metadata
 * entry; with several, the package's own order is unspecified).
 */

#define ATTN_SAFETENSORS_MAX_DIMS 8
/* The reference implementation's cap on the JSON header (100 MB). */
#define ATTN_SAFETENSORS_MAX_HEADER ((size_t)100000000)



/* A float32 tensor to write: name, data (numel floats, row-major) and shape. */
typedef struct attn_named_tensor {
    const char *name;
    const float *data;
    size_t ndim; /* 0 (a scalar) to ATTN_SAFETENSORS_MAX_DIMS */
    size_t shape[ATTN_SAFETENSORS_MAX_DIMS];
} attn_named_tensor;

/* One "__metadata__" entry. */
typedef struct attn_metadata_entry {
    const char *key, *value;
} attn_metadata_entry;

/*
 * Writes count float32 tensors (and metadata_count metadata entries; the
 * metadata may be NULL when the count is 0) to path. Names must be unique,
 * non-empty, valid UTF-8 and not "__metadata__". Errors: ATTN_ERR_NULL,
 * ATTN_ERR_INVALID (a bad or duplicate name, ndim too large),
 * ATTN_ERR_OVERFLOW, ATTN_ERR_IO.
 */
attn_status attn_safetensors_write(attn_ctx *ctx, const char *path,
                                   const attn_named_tensor *tensors, size_t count,
                                   const attn_metadata_entry *metadata, size_t metadata_count);

/* Writes count parameters (attn_param, e.g. from attn_module_param_at) under
 * prefix + name (prefix may be NULL), with metadata {"format": "pt"}. */
attn_status attn_safetensors_write_params(attn_ctx *ctx, const char *path,
                                          const attn_param *params, size_t count,
                                          const char *prefix);

/* An opened safetensors file: its header, parsed and checked; tensor data
 * is read (and converted) when asked for. */
typedef struct attn_safetensors attn_safetensors;

typedef struct attn_safetensors_info {
    const char *name; /* owned by the attn_safetensors */
    attn_dtype dtype;
    size_t ndim;
    size_t shape[ATTN_SAFETENSORS_MAX_DIMS];
    size_t numel;
    size_t data_begin, data_end; /* byte offsets into the data section */
    size_t index;                /* for attn_safetensors_load */
} attn_safetensors_info;

/* Opens path and checks its header against the file's size. */
attn_status attn_safetensors_open(attn_ctx *ctx, const char *path, attn_safetensors **out);
/* The same for an in-memory image (copied: bytes need not outlive the
 * result). Messages name "<memory>". For fuzzing and embedded use. */
attn_status attn_safetensors_parse(attn_ctx *ctx, const void *bytes, size_t size,
                                   attn_safetensors **out);
/* Closes the file and frees st (NULL is fine). */
void attn_safetensors_free(attn_safetensors *st);
/* Tensors in file order of their data (by data_offsets). */
size_t attn_safetensors_count(const attn_safetensors *st);
/* Tensor index's name, dtype, shape, numel, data offsets and index.
 * ATTN_ERR_NOT_FOUND past the end, ATTN_ERR_NULL for a NULL out. */
attn_status attn_safetensors_info_at(attn_safetensors *st, size_t index,
                                     attn_safetensors_info *out);
/* ATTN_ERR_NOT_FOUND when no tensor has that name. */
attn_status attn_safetensors_find(attn_safetensors *st, const char *name,
                                  attn_safetensors_info *out);
/* Tensor index's data as float32 into dst, which holds numel floats
 * (numel must equal the tensor's). ATTN_ERR_FORMAT for dtypes other than
 * F32, F16, BF16 and F64, ATTN_ERR_SHAPE for a wrong numel, ATTN_ERR_IO
 * when the file cannot be read, ATTN_ERR_INVALID (naming the element) for
 * an F64 value finite past float32's range, where tensor.float() would
 * give an infinity. */
attn_status attn_safetensors_load(attn_safetensors *st, size_t index, float *dst, size_t numel);
/* "__metadata__" entries, in file order; the value for key, or NULL. */
size_t attn_safetensors_metadata_count(const attn_safetensors *st);
/* Metadata entry index (key and value stay owned by st);
 * ATTN_ERR_NOT_FOUND past the end. */
attn_status attn_safetensors_metadata_at(attn_safetensors *st, size_t index,
                                         attn_metadata_entry *out);
/* The value for key, or NULL when the file has no such entry. */
const char *attn_safetensors_metadata_get(const attn_safetensors *st, const char *key);

/*
 * A module's state_dict: its parameters under their PyTorch names
 * ("W_query.weight", "out_proj.bias", ...) and the seeds' causal-mask
 * buffers ("mask" (T, T) = triu(ones, 1) for CausalAttention and
 * MultiHeadAttention, "heads.N.mask" for the wrapper, GPT-2's "bias"
 * (1, 1, T, T) = tril(ones)), float32, metadata {"format": "pt"}: what
 * safetensors.torch.save_file(module.state_dict(), path) writes for the
 * seeds' PyTorch class.
 */
attn_status attn_safetensors_save_module(attn_ctx *ctx, attn_module *m, const char *path);
/*
 * module.load_state_dict(load_file(path), strict=True): every parameter
 * must be in the file with its shape, and the file may hold nothing else
 * but the module's mask buffers, which may be absent and, when present,
 * must be those masks.
 * With a prefix (e.g. "encoder.layer0."), only tensors whose names start
 * with it are considered, the prefix stripped; the rest of the file is
 * ignored. Nothing is changed unless every parameter loads. A load drops
 * the module's last forward (its activations belong to the old weights):
 * attn_module_backward then needs a new forward. Errors name the
 * missing, unexpected or mis-shaped tensors: ATTN_ERR_NOT_FOUND,
 * ATTN_ERR_SHAPE, ATTN_ERR_FORMAT, ATTN_ERR_IO.
 */
attn_status attn_safetensors_load_module(attn_ctx *ctx, attn_module *m, const char *path,
                                         const char *prefix);
/* The same from an already opened file. */
attn_status attn_safetensors_load_module_from(attn_safetensors *st, attn_module *m,
                                              const char *prefix);

/* ------------------------------------------------------------------------ */
/* Hugging Face GPT-2 checkpoints                                            */
/* ------------------------------------------------------------------------ */

/*
 * Layer `layer`'s attention of a Hugging Face GPT-2 checkpoint in
 * safetensors (model.safetensors of GPT2Model or GPT2LMHeadModel):
 *   h.N.attn.c_attn.weight (C, 3C)  h.N.attn.c_attn.bias (3C)
 *   h.N.attn.c_proj.weight (C, C)   h.N.attn.c_proj.bias (C)
 * with or without the "transformer." prefix. Hugging Face's Conv1D stores
 * the transpose of nn.Linear's weight (in, out); the loader transposes it
 * into the module's (out, in). The checkpoint does not record n_head: the
 * module's n_head must be the model's (config.json's n_head, 12 for GPT-2
 * small). m is the module of an attn_gpt2 (attn_gpt2_module). Errors:
 * ATTN_ERR_INVALID for another kind of module, ATTN_ERR_NOT_FOUND naming
 * the missing tensor (and how many layers the file has), ATTN_ERR_SHAPE
 * when n_embd differs. Nothing changes unless all four tensors load; a
 * load drops the last forward, so attn_module_backward needs a new one.
 */
attn_status attn_gpt2_load_hf(attn_ctx *ctx, attn_module *m, const char *path, size_t layer);
/* The same from an already opened file (messages go to its ctx). */
attn_status attn_gpt2_load_hf_from(attn_safetensors *st, attn_module *m, size_t layer);
/* The reverse: writes the module as layer `layer` of a Hugging Face
 * checkpoint (h.N.attn.c_attn.weight in Conv1D layout, ...), no prefix,
 * metadata {"format": "pt"}. */
attn_status attn_gpt2_save_hf(attn_ctx *ctx, attn_module *m, const char *path, size_t layer);

/* ------------------------------------------------------------------------ */
/* Optimizers                                                                */
/* ------------------------------------------------------------------------ */

/*
 * torch.optim.SGD and torch.optim.AdamW (the single-tensor path, which
 * PyTorch runs for CPU tensors by default; AdamW's first moment as PyTorch
 * 2 updates it, with lerp), with the same update order and float32
 * arithmetic, fused multiply-adds where PyTorch's CPU kernels fuse them:
 *
 * SGD, per parameter p with gradient g:
 *   g = g + weight_decay * p                          (if weight_decay != 0)
 *   buf = g on the first step, else buf = momentum * buf + (1 - dampening) * g
 *                                                     (if momentum != 0)
 *   g = nesterov ? g + momentum * buf : buf           (if momentum != 0)
 *   p = p - lr * g
 * AdamW, at step t (1, 2, ...):
 *   p = p * (1 - lr * weight_decay)
 *   m = m.lerp(g, w), w = 1 - beta1: m + w * (g - m) for w < 0.5,
 *       else g + (w - 1) * (g - m)
 *   v = beta2 * v + (1 - beta2) * g * g
 *   vmax = max(vmax, v)                               (amsgrad)
 *   denom = sqrt(amsgrad ? vmax : v) / (1 - beta2^t)^0.5 + eps
 *   p = p - (lr / (1 - beta1^t)) * m / denom
 *
 * The optimizer keeps pointers to the parameters' data and grad: they must
 * outlive it. Gradients are read, never cleared: zero them between steps
 * (attn_optimizer_zero_grad, or the model's zero_grad).
 */
typedef enum attn_optimizer_kind {
    ATTN_OPTIMIZER_SGD = 0,
    ATTN_OPTIMIZER_ADAMW = 1
} attn_optimizer_kind;

typedef struct attn_optimizer_config {
    attn_optimizer_kind kind;
    double lr;
    double weight_decay; /* SGD: L2 added to the gradient; AdamW: decoupled */
    /* SGD */
    double momentum, dampening;
    bool nesterov; /* needs momentum > 0 and dampening == 0, as in PyTorch */
    /* AdamW */
    double beta1, beta2, eps;
    bool amsgrad;
} attn_optimizer_config;

/* PyTorch's defaults. SGD: momentum 0, dampening 0, weight_decay 0, no
 * nesterov, and lr NAN: PyTorch has no default lr for SGD, so
 * attn_optimizer_new fails until one is set. AdamW: lr 1e-3, betas (0.9,
 * 0.999), eps 1e-8, weight_decay 0.01, amsgrad off. An unknown kind gives
 * the SGD defaults with that kind (attn_optimizer_new then rejects it). */
attn_optimizer_config attn_optimizer_defaults(attn_optimizer_kind kind);

typedef struct attn_optimizer attn_optimizer;

/* An optimizer over count parameters (every one needs data and grad, and a
 * numel that agrees with its shape; no two of the data and grad spans may
 * share memory: ATTN_ERR_INVALID naming both). The configuration is
 * checked as PyTorch checks it, plus finiteness. Errors go to ctx. */
attn_status attn_optimizer_new(attn_ctx *ctx, const attn_optimizer_config *cfg,
                               const attn_param *params, size_t count, attn_optimizer **out);
/* optimizer.step(): one update of every parameter from its grad. */
attn_status attn_optimizer_step(attn_optimizer *opt);
/* optimizer.zero_grad(set_to_none=False): every parameter's grad to 0. */
attn_status attn_optimizer_zero_grad(attn_optimizer *opt);
/* param_group["lr"] = lr, for schedules; lr must be finite and >= 0. */
attn_status attn_optimizer_set_lr(attn_optimizer *opt, double lr);
double attn_optimizer_lr(const attn_optimizer *opt);
/* Steps taken so far. */
size_t attn_optimizer_steps(const attn_optimizer *opt);
/* The optimizer's state, for checkpoints: its buffers as one array of
 * attn_optimizer_state_size floats (per parameter in order: SGD's momentum
 * buffer; AdamW's exp_avg, exp_avg_sq and, with amsgrad, max_exp_avg_sq)
 * and the steps taken. _set_state takes what _get_state gave for an
 * optimizer of the same config over the same parameters (n must match:
 * ATTN_ERR_SHAPE otherwise; steps at most 2^53: ATTN_ERR_INVALID). */
size_t attn_optimizer_state_size(const attn_optimizer *opt);
attn_status attn_optimizer_get_state(const attn_optimizer *opt, float *state, size_t n,
                                     size_t *steps);
attn_status attn_optimizer_set_state(attn_optimizer *opt, const float *state, size_t n,
                                     size_t steps);
void attn_optimizer_free(attn_optimizer *opt);

/*
 * torch.nn.utils.clip_grad_norm_(params, max_norm) (norm_type 2): the L2
 * norm of all gradients together, total = ||(||g_1||, ..., ||g_n||)||, then
 * every gradient multiplied by min(1, max_norm / (total + 1e-6)), that
 * factor in float32 as PyTorch computes it. The squares are summed in
 * double, so total is the norm rounded once; PyTorch sums in float32, so
 * its total carries that sum's rounding, which grows with the gradients'
 * size, and the clipped gradients with it (docs/training.md). Where
 * float32's sum of squares overflows (gradients near 1e19 or more) or
 * underflows (near 1e-23 or less), total is the finite
 * norm, and clips by it, where PyTorch's is inf (every gradient zeroed) or
 * 0. total_norm (optional) receives the norm before clipping. max_norm
 * must be >= 0; inf clips nothing (PyTorch's way to read the norm; every
 * gradient multiplied by 1, or by NaN where the norm is inf or NaN, as
 * PyTorch's). No parameters (count 0) is a norm of 0, as
 * clip_grad_norm_([]) gives.
 */
attn_status attn_clip_grad_norm(attn_ctx *ctx, const attn_param *params, size_t count,
                                double max_norm, float *total_norm);

/* ------------------------------------------------------------------------ */
/* A small language model                                                    */
/* ------------------------------------------------------------------------ */

/*
 * A GPT-style model to train around the attention modules:
 *   x (B, T, C) = dropout(tok_emb[tokens] + pos_emb[0..T-1])
 *   per block:  x = x + [shortcut dropout] attn(ln1(x))
 *               x = x + dropout(mlp.proj(gelu(mlp.fc(ln2(x)))))   (if mlp)
 *   logits (B, T, V) = head(ln_f(x))                              (no bias)
 *   loss = cross_entropy(logits, targets, ignore_index=-100)      (the mean)
 * attn is the library's MultiHeadAttention (ATTN_MODULE_MHA, C -> C,
 * n_heads heads) or GPT-2's CausalSelfAttention (ATTN_MODULE_GPT2). The
 * shortcut dropout follows mha only (as the book's TransformerBlock does):
 * CausalSelfAttention applies its own resid_dropout. LayerNorm has eps
 * 1e-5; GELU is the exact erf form (nn.GELU()); mlp.fc is C -> 4C.
 *
 * Parameters, in state_dict order and initialised from init_rng in this
 * order, as the PyTorch constructors would:
 *   tok_emb.weight (V, C), pos_emb.weight (T, C)     N(0, 1) (nn.Embedding)
 *   blocks.<i>.ln1.weight, .ln1.bias (C)             ones, zeros (no draws)
 *   blocks.<i>.attn.<module parameter>               the module's constructor
 *   blocks.<i>.ln2.weight, .ln2.bias (C)             (if mlp)
 *   blocks.<i>.mlp.fc.weight (4C, C), .bias (4C)     nn.Linear (if mlp)
 *   blocks.<i>.mlp.proj.weight (C, 4C), .bias (C)    nn.Linear (if mlp)
 *   ln_f.weight, ln_f.bias (C)
 *   head.weight (V, C)                               nn.Linear, bias=False
 * Dropout draws from the forward's rng in the order of the forward above.
 * tests/train/torch_lm.py is the same model in PyTorch.
 */
typedef struct attn_model_config {
    size_t vocab_size, context_length, d_model, n_layers, n_heads;
    attn_module_kind attention; /* ATTN_MODULE_MHA or ATTN_MODULE_GPT2 */
    bool mlp;                   /* add the MLP half of each block */
    double dropout;             /* every dropout of the model, in [0, 1] */
    bool qkv_bias;              /* MultiHeadAttention's qkv_bias; ignored for
                                   GPT-2, whose c_attn always has a bias */
} attn_model_config;

/*
 * The book's GPTModel (llms-from-scratch ch04/ch05 previous_chapters.py) as
 * an attn_model, to pretrain as chapter 5 does. Its cfg dict's keys:
 *   x (B, T, C) = drop_emb(tok_emb[tokens] + pos_emb[0..T-1])
 *   per block:  x = x + drop_shortcut(att(norm1(x)))
 *               x = x + drop_shortcut(ff.layers.2(gelu(ff.layers.0(norm2(x)))))
 *   logits (B, T, V) = out_head(final_norm(x))                    (no bias)
 * att is MultiHeadAttention (ATTN_MODULE_MHA: W_query, W_key, W_value with
 * qkv_bias, out_proj, causal mask, dropout on the attention weights); the
 * norms are the book's LayerNorm (eps 1e-5, scale and shift); gelu is the
 * book's tanh form; every dropout is drop_rate. The parameters carry the
 * book's state_dict names in its order:
 *   tok_emb.weight, pos_emb.weight, per block trf_blocks.<i>.att.W_query
 *   .weight (.bias), W_key, W_value, att.out_proj.weight/.bias,
 *   ff.layers.0.weight/.bias, ff.layers.2.weight/.bias, norm1.scale/.shift,
 *   norm2.scale/.shift; final_norm.scale/.shift, out_head.weight.
 * The weights are drawn from init_rng as torch.manual_seed(s);
 * GPTModel(cfg) draws them (tok_emb, pos_emb, per block W_query, W_key,
 * W_value, out_proj, ff.layers.0, ff.layers.2; out_head), and a training
 * forward draws its dropout masks in the order of the book's forward
 * (drop_emb; per block the attention weights', drop_shortcut after att and
 * after ff). Everything else is attn_model's: attn_model_get_config gives
 * (emb_dim as d_model, ATTN_MODULE_MHA (the bonus GPTs' module kind below),
 * mlp, drop_rate as dropout);
 * attn_model_save writes the book's names with "format": "attn-gpt" and
 * these keys as metadata, which attn_lm_load reads as the config.
 *
 * attention picks one of chapter 4's bonus GPTs instead (llms-from-scratch
 * ch04/04_gqa, 05_mla, 06_swa: gpt_with_kv_*.py's GPTModel, trained with
 * use_cache False): the same model but for att, the script's module, with
 * its parameters under att. in its registration order, drawn in its
 * construction order, its dropout on the attention weights, and no mask
 * buffers (the scripts make their masks in the forward):
 *   ATTN_GPT_GQA  GroupedQueryAttention (ATTN_MODULE_GQA): W_key, W_value
 *                 (n_kv_groups * head_dim wide), W_query (qkv_bias each),
 *                 out_proj without bias;
 *   ATTN_GPT_MLA  MultiHeadLatentAttention (ATTN_MODULE_MLA): W_query,
 *                 W_DKV (down to latent_dim), W_UK, W_UV (qkv_bias each),
 *                 out_proj with bias;
 *   ATTN_GPT_SWA  MultiHeadAttentionWithSWA (ATTN_MODULE_SWA):
 *                 MultiHeadAttention's parameters; the layers the stride
 *                 picks see the last sliding_window_size positions only.
 * attn_model_save adds the variant's cfg keys to the metadata (n_kv_groups;
 * latent_dim, "null" for 0; sliding_window_size and sliding_window_stride),
 * and attn_lm_load reads the file as the same model.
 */
typedef enum attn_gpt_attention {
    ATTN_GPT_MHA = 0, /* ch04's GPTModel: MultiHeadAttention                 */
    ATTN_GPT_GQA = 1, /* gpt_with_kv_gqa.py: GroupedQueryAttention          */
    ATTN_GPT_MLA = 2, /* gpt_with_kv_mla.py: MultiHeadLatentAttention       */
    ATTN_GPT_SWA = 3  /* gpt_with_kv_swa.py: MultiHeadAttentionWithSWA      */
} attn_gpt_attention;

typedef struct attn_gpt_config {
    size_t vocab_size, context_length, emb_dim, n_heads, n_layers;
    double drop_rate; /* in [0, 1] */
    bool qkv_bias;
    /* Chapter 4's bonus GPTs (see above); each field belongs to one
     * attention and is 0 for the others. */
    attn_gpt_attention attention;
    size_t n_kv_groups;            /* GQA: the cfg's n_kv_groups, dividing n_heads */
    size_t latent_dim;             /* MLA: 0 is the cfg's None, max(16, emb_dim / 8) */
    size_t sliding_window_size;    /* SWA: the cfg's W, at least 1 */
    int64_t sliding_window_stride; /* SWA: the cfg's K: K > 0 windows layer i where
                                      i % (K + 1) < K; 0 none; below 0 every layer */
} attn_gpt_config;

/*
 * The book's Llama3Model (llms-from-scratch 1.0.19, llms_from_scratch.llama3)
 * as an attn_model, float32 (the cfg dict's dtype torch.float32), to
 * pretrain as chapter 5 does. Its cfg dict's keys:
 *   x (B, T, C) = tok_emb[tokens]                           (no positions)
 *   per block:  x = x + att(norm1(x))
 *               x = x + ff.fc3(silu(ff.fc1(norm2(x))) * ff.fc2(norm2(x)))
 *   logits (B, T, V) = out_head(final_norm(x))              (no bias)
 * att is GroupedQueryAttention: W_query (C -> C), W_key and W_value (C ->
 * n_kv_groups * head_dim), head_dim = emb_dim / n_heads, every linear layer
 * without bias; RoPE (compute_rope_params / apply_rope: split halves, base
 * rope_base, the Llama 3.1 frequency scaling when rope_factor > 0, angles
 * and tables in float32) on queries and keys; causal softmax(q k^T /
 * sqrt(head_dim)); query heads h * G .. h * G + G - 1 (G = n_heads /
 * n_kv_groups) share KV head h; out_proj. The norms are RMSNorm, eps 1e-5,
 * a weight and no bias; fc1, fc2 are C -> hidden_dim, fc3 back. There is
 * no dropout. The parameters carry the book's state_dict names in its
 * order (a module's submodules in their assignment order):
 *   tok_emb.weight (V, C); per block trf_blocks.<i>.att.W_key.weight,
 *   att.W_value.weight, att.W_query.weight, att.out_proj.weight,
 *   ff.fc1.weight, ff.fc2.weight, ff.fc3.weight, norm1.weight, norm2.weight;
 *   final_norm.weight, out_head.weight.
 * The weights are drawn from init_rng as torch.manual_seed(s);
 * Llama3Model(cfg) draws them (tok_emb's normal_, then per block W_key,
 * W_value, W_query, out_proj, fc1, fc2, fc3, then out_head: nn.Linear's
 * kaiming uniform; norms are ones). Everything else is attn_model's:
 * attn_model_get_config gives vocab_size, context_length, emb_dim as
 * d_model, n_layers, n_heads, ATTN_MODULE_GQA, mlp, dropout 0, no qkv_bias;
 * attn_model_save writes the book's names with "format": "attn-llama3" and
 * these keys as metadata (rope_freq as the book's dict in JSON, or null),
 * which attn_lm_load (attn generate --weights) reads as the config.
 * rope_factor, rope_low_freq_factor, rope_high_freq_factor and
 * rope_original_context_length are the book's rope_freq dict (factor,
 * low_freq_factor, high_freq_factor, original_context_length), spelled as
 * attn_lm_config spells them; rope_factor 0 is rope_freq None.
 */
typedef struct attn_llama3_config {
    size_t vocab_size, context_length, emb_dim, n_heads, n_layers, hidden_dim;
    size_t n_kv_groups; /* divides n_heads */
    double rope_base;   /* > 0 */
    double rope_factor; /* 0: no frequency scaling */
    double rope_low_freq_factor, rope_high_freq_factor;
    size_t rope_original_context_length;
} attn_llama3_config;

/* The RoPE tables of cfg as compute_rope_params(head_dim, rope_base,
 * context_length, rope_freq) returns them: cos and sin (context_length,
 * head_dim) each, the two halves of a row equal. The inverse frequencies
 * and angles are float32 step by step as PyTorch computes them, with
 * rope_base ** (2i / head_dim) correctly rounded: bit for bit the book's
 * for its configs (head_dim 64 or 128, rope_base 500000), while for some
 * others PyTorch's float32 pow (not correctly rounded) differs in the last
 * bit. Each cos and sin is the float32 nearest the angle's (PyTorch's own
 * float32 cos and sin may differ from it in the last bit). */
attn_status attn_llama3_rope_tables(attn_ctx *ctx, const attn_llama3_config *cfg, float *cos,
                                    float *sin);

/* Targets equal to this are not scored (F.cross_entropy's ignore_index). */
#define ATTN_IGNORE_INDEX (-100)

typedef struct attn_model attn_model;

attn_status attn_model_new(attn_ctx *ctx, const attn_model_config *cfg, attn_rng *init_rng,
                           attn_model **out);
/* The book's GPTModel (see attn_gpt_config). */
attn_status attn_model_new_gpt(attn_ctx *ctx, const attn_gpt_config *cfg, attn_rng *init_rng,
                               attn_model **out);
/* The book's Llama3Model (see attn_llama3_config). */
attn_status attn_model_new_llama3(attn_ctx *ctx, const attn_llama3_config *cfg,
                                  attn_rng *init_rng, attn_model **out);
void attn_model_free(attn_model *m);
attn_model_config attn_model_get_config(const attn_model *m);
/* The config of a model made by attn_model_new_gpt (ATTN_ERR_INVALID for
 * one made by attn_model_new). */
attn_status attn_model_get_gpt_config(const attn_model *m, attn_gpt_config *out);
/* The config of a model made by attn_model_new_llama3 (ATTN_ERR_INVALID for
 * any other). */
attn_status attn_model_get_llama3_config(const attn_model *m, attn_llama3_config *out);
/* Number of parameter tensors, and of scalars. */
size_t attn_model_param_count(const attn_model *m);
size_t attn_model_num_scalars(const attn_model *m);
attn_status attn_model_param_at(attn_model *m, size_t index, attn_param *out);
attn_status attn_model_param(attn_model *m, const char *name, attn_param *out);
/* Every parameter, in state_dict order: the array attn_optimizer_new
 * takes. It stays valid until the model is freed. */
attn_status attn_model_params(attn_model *m, const attn_param **params, size_t *count);
/* model.train() / model.eval(): dropout on or off, in every module. */
attn_status attn_model_set_training(attn_model *m, bool training);
/* With gradients disabled (torch.no_grad()) a forward keeps nothing for
 * backward; evaluation is then cheaper. Enabled by default. */
attn_status attn_model_set_grad_enabled(attn_model *m, bool enabled);
/* Every parameter's grad to 0. */
attn_status attn_model_zero_grad(attn_model *m);
/*
 * tokens (B, T) are ids in [0, V); T <= context_length. logits (B, T, V)
 * is optional. With targets (B, T) (ids in [0, V) or ATTN_IGNORE_INDEX),
 * *loss receives the mean cross-entropy over the targets that are not
 * ignored (NaN when all are, as PyTorch gives, and a backward then adds
 * nothing); without targets, loss must
 * be NULL and logits given. dropout_rng is needed only in training mode
 * with dropout > 0.
 */
attn_status attn_model_forward(attn_model *m, const int32_t *tokens, const int32_t *targets,
                               size_t batch, size_t tokens_per_row, float *logits, float *loss,
                               attn_rng *dropout_rng);
/* loss.backward() for the last forward (which had targets and gradients
 * enabled): every parameter's dloss/dW is added to its grad. Refused
 * (ATTN_ERR_INVALID, before anything is written) where a parameter changed
 * since that forward, as a module's backward is. Unlike a module's
 * backward, a failure here (ATTN_ERR_NO_MEMORY in a layer's attention) may
 * leave the later layers' gradients added: zero them before trying again. */
attn_status attn_model_backward(attn_model *m);
/*
 * Saves every parameter to path as a safetensors file (see "safetensors
 * files"): float32 tensors under their state_dict names, and "__metadata__"
 * holding the config as strings: "format": "attn-lm", vocab_size,
 * context_length, d_model, n_layers, n_heads, attention ("mha" or "gpt2"),
 * mlp, qkv_bias, dropout (the book's models: "attn-gpt" and "attn-llama3"
 * with their cfg keys, see attn_gpt_config and attn_llama3_config).
 * safetensors.torch.load_file and the PyTorch model's load_state_dict read
 * it.
 */
attn_status attn_model_save(attn_model *m, const char *path);
/* load_state_dict(strict=True) from such a file into a model of the same
 * config: every parameter with its shape and nothing else (a file of the
 * model's own format must also agree in its metadata, dropout aside, a
 * latent_dim of null agreeing with the width it stands for; the
 * book's GPTModel's also holds its mask buffers, which must be the causal
 * mask: ATTN_ERR_FORMAT naming the element otherwise).
 * Nothing changes unless all of it loads; a load drops the last forward,
 * so attn_model_backward needs a new forward. */
attn_status attn_model_load(attn_model *m, const char *path);

/* ------------------------------------------------------------------------ */
/* Generation: the KV cache, decoding, and the book's GPT-2 and Llama 3      */
/* ------------------------------------------------------------------------ */

/*
 * A KV cache holds, per layer and per sequence of a batch, the keys and
 * values of the tokens seen so far, at the KV-head count (GQA keeps
 * kv_heads, not q_heads): the book's KVCache (llms-from-scratch kv_cache/)
 * preallocated as its optimized version, or paged as vLLM's block table.
 *
 *   ATTN_KV_CONTIGUOUS  per layer one (batch, capacity, kv_heads, head_dim)
 *                       block each for K and V;
 *   ATTN_KV_PAGED       per layer a pool of num_pages pages of page_size
 *                       tokens, each (page_size, kv_heads, head_dim) for K
 *                       and for V; a sequence's page table maps its logical
 *                       page j to a pool page, taken from the layer's free
 *                       list as the sequence grows and given back by reset.
 *
 * A layer with a sliding window W (windows[layer] > 0) keeps only its last
 * W tokens, as the book's SWA cache (gpt_with_kv_swa.py) does: a ring of W
 * slots per sequence (paged: ceil(W / page_size) + 1 pages). Other layers
 * keep every token up to max_len. A window of max_len or more (up to
 * SIZE_MAX) sees every position a sequence reaches and is taken as
 * max_len. max_len is at most 2^62.
 *
 * Each layer counts, per sequence, the tokens appended to it: its length,
 * which is also the position of that sequence's next token.
 *
 * K and V are each stored in one element type (k_dtype, v_dtype, chosen
 * apart), quantised as they are appended, rounding to nearest (ties to
 * even). A (token, KV head) row of head_dim elements takes:
 *
 *   ATTN_DTYPE_F32      4 D bytes: the values as given
 *   ATTN_DTYPE_BF16     2 D bytes: bfloat16
 *   ATTN_DTYPE_F16      2 D bytes: IEEE binary16 (past 65504: infinity)
 *   ATTN_DTYPE_F8_E4M3  D + 4 bytes: a float32 scale s = amax / 448 (amax
 *                       the row's largest |x|), then fp8 e4m3 of
 *                       x * (448 / amax) (OCP FP8: 4 exponent bits, bias
 *                       7, no infinities; the value read back is s * e4m3)
 *   ATTN_DTYPE_I8       D + 4 bytes: s = amax / 127, then int8
 *                       round(x * (127 / amax)); read back as s * code
 *   ATTN_DTYPE_I4       D / 2 + 4 D / 32 bytes (head_dim a multiple of 32):
 *                       per group of 32 elements a scale s = amax / 7 and
 *                       round(x * (7 / amax)) in [-7, 7] as a 4-bit nibble
 *
 * each factor (448, 127 or 7) / amax in float32; where it overflows (amax
 * below about 1e-36) x and amax are first scaled by 2^64, exactly, so that
 * such a row is coded as any other. docs/generation.md gives the bytes.
 *
 * so that a token costs num_layers x kv_heads x (K's + V's row bytes)
 * (attn_kv_cache_token_bytes). A row holding NaN or infinity is kept, not
 * refused: float32 and the 16-bit types keep the value, the scaled ones
 * make the row's (int4: the group's) scale NaN. A NaN or infinite score
 * makes its query row NaN; an infinite value makes the outputs that weigh
 * it infinite or NaN. The attention reads
 * the stored type: the keys and values of earlier tokens as stored, and the
 * new tokens of a call as they will be stored (a sequence's prompt of 64
 * rows or more into its empty cache, on the fast kernels, whatever the
 * batch's other sequences hold, reads its own rows in
 * float32, as prefill does in vLLM; not one whose queries, keys or values
 * hold NaN or infinity, which reads them as stored, so that they reach
 * only the rows that see them; a shorter one runs as decode steps, as
 * stored).
 */
typedef enum attn_kv_layout { ATTN_KV_CONTIGUOUS = 0, ATTN_KV_PAGED = 1 } attn_kv_layout;

typedef struct attn_kv_cache_config {
    size_t num_layers, batch, kv_heads, head_dim;
    size_t max_len;          /* the most tokens (positions) a sequence may reach */
    attn_kv_layout layout;
    size_t page_size;        /* paged: tokens per page; 0 means 16          */
    size_t num_pages;        /* paged: pages per layer; 0 means enough for
                                every sequence at max_len                   */
    const size_t *windows;   /* num_layers entries, 0 = keep all; NULL = none */
    attn_dtype k_dtype, v_dtype; /* how K and V are stored: ATTN_DTYPE_F32 (0),
                                    BF16, F16, F8_E4M3, I8 or I4 (see above) */
    bool values_are_keys;    /* one array, read as K and as V (a latent
                                cache, as gpt-mla's): v_dtype is k_dtype,
                                a token costs K's bytes alone, and v_new is
                                NULL or k_new in every call */
} attn_kv_cache_config;

typedef struct attn_kv_cache attn_kv_cache;

/* Errors name the values: ATTN_ERR_NULL, ATTN_ERR_INVALID (a zero size, a
 * layout or dtype not listed), ATTN_ERR_SHAPE (I4 with head_dim not a
 * multiple of 32), ATTN_ERR_OVERFLOW (max_len past 2^62 among them),
 * ATTN_ERR_NO_MEMORY. */
attn_status attn_kv_cache_new(attn_ctx *ctx, const attn_kv_cache_config *cfg,
                              attn_kv_cache **out);
void attn_kv_cache_free(attn_kv_cache *cache);
attn_kv_cache_config attn_kv_cache_get_config(const attn_kv_cache *cache);
/* Every sequence of every layer back to length 0 (paged: pages freed). */
attn_status attn_kv_cache_reset(attn_kv_cache *cache);
/* Sequence seq of layer back to length 0 (the others keep theirs). */
attn_status attn_kv_cache_reset_sequence(attn_kv_cache *cache, size_t seq);
/* The tokens appended so far to sequence seq of layer. */
attn_status attn_kv_cache_length(const attn_kv_cache *cache, size_t layer, size_t seq,
                                 size_t *out);
/* Bytes the cache holds for K and V (all layers, allocated pages). */
size_t attn_kv_cache_bytes(const attn_kv_cache *cache);
/* Bytes one token of one sequence takes: all layers, K and V, scales
 * included (the row bytes above). */
size_t attn_kv_cache_token_bytes(const attn_kv_cache *cache);

/*
 * One attention step of a layer against its cache, new tokens included,
 * then the new tokens appended (flash_attn_with_kvcache):
 *
 *   new_lens   batch entries: the new tokens of each sequence (0 allowed),
 *              or NULL for new_tokens each. Rows are packed sequence after
 *              sequence: row r of sequence s is at (sum of new_lens[< s]) + r.
 *   q          (rows, q_heads, head_dim); q_heads a multiple of kv_heads,
 *              query head h reading KV head h / (q_heads / kv_heads)
 *   k_new, v_new  (rows, kv_heads, head_dim)
 *   out        (rows, q_heads, head_dim); may not overlap q, k_new, v_new
 *              or new_lens (ATTN_ERR_INVALID)
 *   scale      0 means 1 / sqrt(head_dim); else > 0 and within float32's
 *              range, as attn_sdpa_forward's
 *
 * New token r of sequence s has position p = length(s) + r and attends,
 * causally, to the positions max(0, p - W + 1) .. p (W the layer's window,
 * else all): the cached ones and the new ones before it and itself, with
 * the scores of attn_sdpa_forward's modifiers: s_j = softcap(q . k_j *
 * scale) - alibi_h (p - j), softcap(x) = c tanh(x / c), and head h's sink
 * a logit in the softmax's denominator that weighs no value (gpt-oss). A
 * NaN or infinite q . k_j * scale makes the row NaN, softcap or not. The
 * result does not depend on the layout or page size, bit for bit, and for a
 * given thread count not on anything but the inputs. One token against a
 * long cache is split over the KV length so that every thread has work
 * (partial softmaxes merged by their log-sum-exp).
 * block_mask (below) narrows what each token sees with any mask of
 * "Programmable attention", over positions.
 * Errors (nothing is written, nothing appended): ATTN_ERR_NULL,
 * ATTN_ERR_SHAPE (q_heads not a multiple of kv_heads, a block_mask of other
 * sizes), ATTN_ERR_INVALID (layer, scale, a negative or non-finite softcap,
 * a non-finite slope or sink, named with its head, out overlapping an
 * input), ATTN_ERR_OVERFLOW (a
 * sequence would pass max_len, or the pool is out of pages: the message
 * names the sequence, its length, the new tokens and the limit),
 * ATTN_ERR_NO_MEMORY.
 */
typedef struct attn_kv_attend_args {
    size_t layer;
    const size_t *new_lens; /* batch entries, or NULL */
    size_t new_tokens;      /* per sequence when new_lens is NULL */
    size_t q_heads;
    double scale;
    const float *q, *k_new, *v_new;
    float *out;
    /* score modifiers (0, NULL: off), as attn_sdpa_config's: */
    float softcap;              /* s = softcap * tanh(s / softcap); finite, >= 0 */
    const float *alibi_slopes;  /* q_heads finite slopes: s -= slope_h * (p - j) */
    const float *sinks;         /* q_heads finite logits, one in each row's softmax */
    /* Optional (NULL: none): a block map (see "Programmable attention")
     * over absolute positions, ANDed with the causal and window rule: new
     * token r of sequence s, at position p = length(s) + r, sees position
     * j only where the map lets query p see key j (under its query head;
     * for sequence s). Its batch is 1 or the cache's, its heads 1 or
     * q_heads, and its q_len and kv_len reach every position of the call
     * (build it once at max_len: one map, a document mask over the whole
     * sequence say, serves every step and every layer). A token that sees
     * no position gets zeros. Refused naming the sizes (ATTN_ERR_SHAPE),
     * nothing appended. */
    const attn_block_mask *block_mask;
} attn_kv_attend_args;
attn_status attn_kv_cache_attend(attn_kv_cache *cache, const attn_kv_attend_args *args);
/* Appends keys and values to layer without attending: a prefix whose K and
 * V were computed elsewhere (a saved prompt, a benchmark's long cache).
 * new_lens, new_tokens and the (rows, kv_heads, head_dim) packing of k_new
 * and v_new are attn_kv_cache_attend's, and so are the limits: ATTN_ERR_NULL,
 * ATTN_ERR_INVALID (layer), ATTN_ERR_OVERFLOW (nothing appended). */
attn_status attn_kv_cache_append(attn_kv_cache *cache, size_t layer, const size_t *new_lens,
                                 size_t new_tokens, const float *k_new, const float *v_new);

/*
 * Speculative decoding: a tree of draft tokens verified in one step. Draft
 * token r's parent is parents[r] (an earlier draft token, or -1 for the
 * sequence's last cached token); it sits at position length + depth(r)
 * (its RoPE angle is the caller's) and sees every cached position, its
 * ancestors and itself: a causal step whose new rows are masked by the
 * tree. attn_tree_mask builds that mask, bits of row r (words_per_row
 * uint64 words from bits + r * words_per_row, at least ceil(n / 64)): bit
 * j % 64 of word j / 64 set where draft j is r itself or an ancestor;
 * depths (n, or NULL) receives each token's depth. A parent at or after
 * its child, or below -1, is refused naming it.
 */
attn_status attn_tree_mask(attn_ctx *ctx, const int32_t *parents, size_t n, uint64_t *bits,
                           size_t words_per_row, size_t *depths);

typedef struct attn_kv_tree_args {
    size_t layer, seq;       /* one sequence of the cache's batch */
    size_t draft_tokens;     /* n >= 1 */
    const int32_t *parents;  /* n, as attn_tree_mask takes them */
    size_t q_heads;
    double scale;            /* as attn_kv_attend_args's */
    const float *q, *k_new, *v_new; /* (n, q_heads | kv_heads, head_dim) */
    float *out;              /* (n, q_heads, head_dim) */
    float softcap;           /* as attn_kv_attend_args's (0: off) */
    const float *alibi_slopes; /* NULL: a tree with slopes is refused */
    const float *sinks;      /* as attn_kv_attend_args's (NULL: off) */
} attn_kv_tree_args;
/* The draft tokens' attention over sequence seq's cache and the tree
 * (forward only); nothing is appended: the draft rows are read as the cache
 * would store them. Layers with a window are refused (ATTN_ERR_UNSUPPORTED),
 * and so are ALiBi slopes: a draft's distance to an ancestor is their
 * depths' difference, not their rows'. Otherwise the errors of
 * attn_kv_cache_attend. */
attn_status attn_kv_cache_attend_tree(attn_kv_cache *cache, const attn_kv_tree_args *args);
/* Appends the verified branch, draft rows rows[0 .. count) of k_new and
 * v_new (root to leaf: rising, >= 0), to sequence seq of layer, as
 * attn_kv_cache_append would append them. The rows are the caller's to
 * keep within the tree: each below its draft_tokens (k_new and v_new hold
 * that many rows; this call does not see the tree) and each the parent of
 * the next, the first a child of -1. */
attn_status attn_kv_cache_append_branch(attn_kv_cache *cache, size_t layer, size_t seq,
                                        const int32_t *rows, size_t count, const float *k_new,
                                        const float *v_new);

/*
 * The book's generating models (llms-from-scratch 1.0.19 and the chapter-4
 * bonus code), inference only, with or without a KV cache:
 *
 * ATTN_LM_GPT2    ch04's GPTModel (kv_cache/gpt2.py): tok_emb + pos_emb,
 *                 blocks of LayerNorm (eps 1e-5, scale/shift) ->
 *                 MultiHeadAttention (W_query/W_key/W_value with qkv_bias,
 *                 out_proj) -> residual -> LayerNorm -> FeedForward
 *                 (emb -> 4 emb, GELU tanh form, -> emb) -> residual;
 *                 final_norm, out_head (no bias).
 * ATTN_LM_GPT_GQA ch04/04_gqa's GPTModel (gpt_with_kv_gqa.py): GPT-2's
 *                 model with GroupedQueryAttention in its blocks:
 *                 n_kv_groups KV heads (W_key, W_value of n_kv_groups
 *                 head_dim rows, with qkv_bias), query head h reading KV
 *                 head h / (n_heads / n_kv_groups) (repeat_interleave), an
 *                 out_proj without bias.
 * ATTN_LM_GPT_MLA ch04/05_mla's GPTModel (gpt_with_kv_mla.py): GPT-2's
 *                 model with MultiHeadLatentAttention: q = x W_query^T,
 *                 c = x W_DKV^T (latent_dim wide), k = c W_UK^T,
 *                 v = c W_UV^T (each with qkv_bias), out_proj with bias.
 *                 The cache holds each token's latent c, as the book's
 *                 does: one KV head of latent_dim, values_are_keys. Against
 *                 it each head's query is taken down to the latent
 *                 (W_UK_h^T q_h; q_h . b_UK_h, the same for every key, is
 *                 left to the softmax) and its output up again
 *                 (W_UV_h sum_j p_j c_j + b_UV_h), where the book
 *                 up-projects the whole cache at each step: the same
 *                 values, rounded in another order (docs/generation.md).
 * ATTN_LM_LLAMA3  kv_cache/llama3.py's Llama3Model: tok_emb, blocks of
 *                 RMSNorm -> GroupedQueryAttention (n_kv_groups KV heads,
 *                 no biases, RoPE on q and k: split halves, base rope_base,
 *                 the Llama 3 frequency scaling when rope_factor > 0) ->
 *                 residual -> RMSNorm -> SwiGLU FeedForward (fc1, fc2 emb
 *                 -> hidden_dim, silu(fc1) * fc2, fc3 back) -> residual;
 *                 final_norm (RMSNorm), out_head (no bias).
 *
 * Parameter names are the book's state_dict names:
 *   gpt2:   tok_emb.weight, pos_emb.weight, trf_blocks.<i>.att.W_query.weight
 *           (.bias), ...W_key, ...W_value, trf_blocks.<i>.att.out_proj.weight
 *           and .bias, trf_blocks.<i>.ff.layers.0.weight/.bias,
 *           trf_blocks.<i>.ff.layers.2.weight/.bias, trf_blocks.<i>.norm1.scale
 *           /.shift, ...norm2..., final_norm.scale/.shift, out_head.weight
 *   gpt-gqa: as gpt2 but trf_blocks.<i>.att.W_key.weight (.bias), W_value,
 *           W_query in that order (the module registers them so), and no
 *           out_proj.bias
 *   gpt-mla: as gpt2 but trf_blocks.<i>.att.W_query.weight (.bias), W_DKV,
 *           W_UK, W_UV in place of W_query, W_key, W_value
 * Any of them may give some layers a sliding window, as ch04/06_swa's
 * GPTModel (gpt_with_kv_swa.py) does: sliding_window_size W > 0 makes a
 * layer's query at position p see positions p - W + 1 .. p, and
 * sliding_window_stride K chooses the layers: with K > 0, layer i has the
 * window where i % (K + 1) < K (K windowed layers, then one without);
 * with K = 0 every layer has it. (The book's cfg dict says "no window" by
 * a stride of 0 and "every layer" by a negative one; the config readers
 * translate.) attn_lm_cache_config gives such a layer's cache the window
 * (a ring of W slots, as the book's trimmed cache).
 *   llama3: tok_emb.weight, trf_blocks.<i>.att.W_query.weight, W_key, W_value,
 *           out_proj, trf_blocks.<i>.ff.fc1.weight, fc2, fc3,
 *           trf_blocks.<i>.norm1.weight, norm2, final_norm.weight,
 *           out_head.weight
 * attn_lm_load also reads Hugging Face's names (GPT2LMHeadModel's
 * [transformer.]wte/wpe/h.<i>.ln_1/attn.c_attn (Conv1D, split into
 * q, k, v)/attn.c_proj/ln_2/mlp.c_fc/mlp.c_proj/ln_f, lm_head tied to wte;
 * LlamaForCausalLM's model.embed_tokens, model.layers.<i>.self_attn.
 * q_proj/k_proj/v_proj/o_proj, mlp.gate_proj/up_proj/down_proj,
 * input_layernorm, post_attention_layernorm, model.norm, lm_head (or tied)).
 */
typedef enum attn_lm_arch {
    ATTN_LM_GPT2 = 1,
    ATTN_LM_LLAMA3 = 2,
    ATTN_LM_GPT_GQA = 3,
    ATTN_LM_GPT_MLA = 4
} attn_lm_arch;

typedef struct attn_lm_config {
    attn_lm_arch arch;
    size_t vocab_size, context_length, emb_dim, n_heads, n_layers;
    size_t n_kv_groups;     /* llama3, gpt-gqa: KV heads (0: n_heads); gpt2: n_heads */
    size_t hidden_dim;      /* llama3: FeedForward width; gpt2: 0 (4 emb_dim)  */
    bool qkv_bias;          /* gpt2, gpt-gqa, gpt-mla */
    bool tie_embeddings;    /* out_head is tok_emb (Hugging Face's tying)      */
    double norm_eps;        /* 0 means 1e-5; -0.0 (ATTN_LM_EPS_ZERO): exactly 0 */
    double rope_base;       /* llama3: RoPE theta; 0 means 500000              */
    double rope_factor;     /* llama3: Llama 3 frequency scaling, 0 = none     */
    double rope_low_freq_factor, rope_high_freq_factor;
    size_t rope_original_context_length;
    /* How the linear layers' weights (q, k, v, out_proj, the FeedForward,
     * out_head) and the token embedding are held: ATTN_DTYPE_F32 (0),
     * ATTN_DTYPE_BF16 or ATTN_DTYPE_F16 (half the bytes; norms, biases and
     * GPT-2's pos_emb stay float32). The products widen them to float32
     * and accumulate in float32: a 16-bit model's logits are those of the
     * float32 model holding the widened weights. attn_lm_new rounds its
     * drawn weights to it (nearest even); attn_lm_load takes the file's
     * (attn_lm_load_as: the caller's). */
    attn_dtype weights_dtype;
    size_t sliding_window_size;   /* W: windowed layers' width; 0 = no window   */
    size_t sliding_window_stride; /* K: layers i % (K + 1) < K; 0 = every one   */
    size_t latent_dim;            /* gpt-mla: 0 means max(16, emb_dim / 8)      */
} attn_lm_config;

typedef struct attn_lm attn_lm;

/* An epsilon of exactly 0 for norm_eps (transformers' rms_norm_eps 0):
 * negative zero, since a zeroed config's +0.0 means "not given" (1e-5).
 * The config readers store a written 0 as this. */
#define ATTN_LM_EPS_ZERO (-0.0)

/* A model of cfg with weights drawn from init_rng as the PyTorch
 * constructors would (nn.Embedding N(0, 1), nn.Linear's uniform, norms ones
 * and zeros), or all zeros when init_rng is NULL. */
attn_status attn_lm_new(attn_ctx *ctx, const attn_lm_config *cfg, attn_rng *init_rng,
                        attn_lm **out);
/*
 * A model from path: a safetensors file, or a directory holding
 * model.safetensors (or a sharded checkpoint's model.safetensors.index.json
 * and its shards; the index may be path itself) and config.json (Hugging
 * Face's save_pretrained: GPT-2's
 * n_embd/n_layer/n_head/n_positions/vocab_size/layer_norm_epsilon, Llama's
 * hidden_size/num_attention_heads/num_key_value_heads/intermediate_size/
 * num_hidden_layers/max_position_embeddings/rope_theta/rope_scaling (or
 * transformers 5's rope_parameters)/rms_norm_eps/tie_word_embeddings, a
 * model_type of llama, or mistral without a window; or the book's cfg dict
 * keys; a key that would change the arithmetic is refused by name,
 * docs/generation.md). cfg, when
 * given, is the config (config_json is then ignored); else config_json
 * (a path) or the config.json in the directory (or beside the index);
 * else, for a file, the metadata attn_model_save wrote ("format":
 * "attn-gpt": n_heads, and the whole config for chapter 4's bonus GPTs;
 * "attn-llama3": the whole config), else the
 * config.json beside it, else the config the tensors' shapes give (n_heads
 * = emb_dim / 64 for GPT-2; Llama needs a config). Every tensor must be there
 * with its shape: ATTN_ERR_NOT_FOUND / ATTN_ERR_SHAPE / ATTN_ERR_FORMAT
 * name it.
 */
attn_status attn_lm_load(attn_ctx *ctx, const char *path, const char *config_json,
                         const attn_lm_config *cfg, attn_lm **out);
/*
 * attn_lm_load with the weights held in weights_dtype (ATTN_DTYPE_F32,
 * BF16 or F16; cfg's weights_dtype is not read). attn_lm_load itself holds
 * them in the file's dtype: its token embedding's when that is BF16 or F16,
 * else float32. Each tensor is converted on the way in:
 *   - to float32 exactly from F16/BF16 (F64 rounded to nearest);
 *   - from F32/F64 to bf16/f16 rounded to nearest even, the caller's
 *     request; a finite value past the 16-bit range (f16: 65504) is
 *     refused (ATTN_ERR_INVALID naming the tensor);
 *   - between bf16 and f16 only when every value is held exactly: else
 *     ATTN_ERR_INVALID naming the tensor and a value (a bf16 checkpoint
 *     asked as f16 overflows past 65504 or loses bits below 2^-14).
 * A 16-bit load reads each tensor through a float32 buffer of its size.
 */
attn_status attn_lm_load_as(attn_ctx *ctx, const char *path, const char *config_json,
                            const attn_lm_config *cfg, attn_dtype weights_dtype, attn_lm **out);
/*
 * attn_lm_load and attn_lm_load_as, with flags (or'ed):
 *   ATTN_LM_LOAD_FILE_DTYPE  weights_dtype is not read: the file's, as
 *                            attn_lm_load holds them
 *   ATTN_LM_LOAD_NON_STRICT  tensors the model does not use are ignored
 *                            (load_state_dict(strict=False)'s unexpected
 *                            keys); a missing one is still refused
 * Without NON_STRICT, as attn_lm_load and attn_lm_load_as, a file holding a
 * tensor the config's model does not use is refused (ATTN_ERR_FORMAT
 * naming the first three and how many), as load_state_dict(strict=True)
 * refuses unexpected keys. Not counted as unused: a tied head stored
 * anyway (lm_head / out_head) and the buffers checkpoints carry beside the
 * parameters (GPT-2's h.N.attn.bias and attn.masked_bias, Llama's
 * rotary_emb.inv_freq). Every loader checks the names before allocating
 * the model: a config (or a file) naming more layers than the file holds
 * is refused at once (ATTN_ERR_NOT_FOUND naming the first tensor missing),
 * and a model past this machine's memory before any allocation
 * (ATTN_ERR_NO_MEMORY naming its bytes and the limit; attn_lm_new too).
 * Other flag bits: ATTN_ERR_INVALID.
 */
typedef enum attn_lm_load_flags {
    ATTN_LM_LOAD_FILE_DTYPE = 1,
    ATTN_LM_LOAD_NON_STRICT = 2
} attn_lm_load_flags;
attn_status attn_lm_load_ex(attn_ctx *ctx, const char *path, const char *config_json,
                            const attn_lm_config *cfg, attn_dtype weights_dtype, unsigned flags,
                            attn_lm **out);
/* The config a config.json gives, read as attn_lm_load reads it (any of
 * the three dialects; tie_embeddings as the file says, else false): for a
 * model of random weights (attn_lm_new) of a published shape. Its values
 * are checked as attn_lm_new checks them, a refusal naming the file's keys
 * (hidden_size, ...) and the file. */
attn_status attn_lm_config_read(attn_ctx *ctx, const char *config_json, attn_lm_config *out);
/* The book's names, float32 (safetensors.torch.load_file + load_state_dict).
 * A model of 16-bit weights writes them widened (exactly) to float32:
 * attn_lm_load_as in its weights dtype gives the same model back. */
attn_status attn_lm_save(attn_lm *m, const char *path);
void attn_lm_free(attn_lm *m);
/*
 * The dtype the linear layers' products take their inputs in (the
 * activations; the weights are held in weights_dtype):
 *   ATTN_DTYPE_F32   the default: nothing is rounded but the float32 sums,
 *                    so a 16-bit model's logits are the float32 model's on
 *                    the widened weights;
 *   ATTN_DTYPE_BF16  on a model of bf16 weights: each product's input rows
 *                    are rounded to bf16 (nearest even) and the products
 *                    run on the bf16 GEMM (AVX-512 BF16's vdpbf16ps, AMX
 *                    tiles) where the CPU has it, with float32 sums: a
 *                    prompt's products at up to twice the float32 rate, as
 *                    torch.autocast(dtype=torch.bfloat16) rounds them (and
 *                    llama.cpp rounds a 16-bit model's activations to its
 *                    weights' type). Where the CPU has no bf16 products the
 *                    same numbers run on widened operands. The logits move
 *                    by the rounding: docs/generation.md measures it.
 * Other dtypes, or BF16 on a model of f32 or f16 weights: ATTN_ERR_INVALID
 * naming them, the model unchanged. Norms, attention, the KV cache and the
 * softmax are not affected, nor are gpt-mla's per-head products with its
 * cached latent (each head's query taken down to the latent, its output up:
 * float32 inputs, the weights widened).
 */
attn_status attn_lm_set_matmul_dtype(attn_lm *m, attn_dtype dtype);
attn_dtype attn_lm_get_matmul_dtype(const attn_lm *m);
attn_lm_config attn_lm_get_config(const attn_lm *m);
size_t attn_lm_param_count(const attn_lm *m);
attn_status attn_lm_param_at(attn_lm *m, size_t index, attn_param *out);
attn_status attn_lm_param(attn_lm *m, const char *name, attn_param *out);
/* A parameter's storage: its dtype (ATTN_DTYPE_F32, or the weights dtype
 * for the tensors it covers) and data (numel floats, or numel bf16/f16
 * bits as uint16_t). attn_param's data is NULL for a 16-bit tensor. */
attn_status attn_lm_param_data(attn_lm *m, size_t index, attn_dtype *dtype, const void **data);
/* Bytes the model's parameters take in memory (a tied head counted once). */
size_t attn_lm_weight_bytes(const attn_lm *m);

/* A cache fitting m: its layers, KV heads, head_dim and windows (gpt-mla:
 * one KV head of latent_dim, values_are_keys), for batch sequences of up
 * to max_len tokens (0: context_length), K and V in float32.
 * A windowed model (sliding_window_size) refuses, ATTN_ERR_SHAPE, a cache
 * of other windows; a model without windows takes the cache's. A model
 * other than gpt-mla refuses a values_are_keys cache (ATTN_ERR_SHAPE). */
attn_status attn_lm_cache_new(attn_lm *m, size_t batch, size_t max_len, attn_kv_layout layout,
                              size_t page_size, attn_kv_cache **out);
/* The configuration attn_lm_cache_new makes (contiguous, float32), for the
 * caller to change (layout, k_dtype, v_dtype, ...) before attn_kv_cache_new:
 * ATTN_ERR_INVALID for max_len past context_length. Its windows point into
 * m (valid while m lives). */
attn_status attn_lm_cache_config(const attn_lm *m, size_t batch, size_t max_len,
                                 attn_kv_cache_config *out);

/*
 * Logits of new tokens. tokens are packed rows as attn_kv_cache_attend's
 * (lens: batch entries, or NULL for tokens_per_seq each).
 *   cache NULL   every sequence starts at position 0 and attends causally
 *                within its own tokens (the book's forward without cache).
 *   cache given  sequence s continues at its cache length: the tokens are
 *                appended, as the book's forward with cache.
 * logits receive (rows, vocab_size), or with last_only (batch, vocab_size):
 * each sequence's last new token (a sequence with no new tokens gets
 * zeros). Positions past context_length, or past what any layer of the
 * cache has room for (max_len, a paged layer's free pages), are
 * ATTN_ERR_OVERFLOW; a cache whose layers hold different lengths for a
 * sequence (a prefix appended into some layers only) is ATTN_ERR_INVALID.
 * Such checks come before any work; a failure inside the layers
 * (ATTN_ERR_NO_MEMORY in a layer's attention) may leave the earlier
 * layers' caches appended: reset those sequences
 * (attn_kv_cache_reset_sequence) before trying again.
 */
typedef struct attn_lm_forward_args {
    attn_kv_cache *cache;
    const int32_t *tokens;
    size_t batch;
    const size_t *lens;
    size_t tokens_per_seq;
    bool last_only;
    float *logits;
} attn_lm_forward_args;
attn_status attn_lm_forward(attn_lm *m, const attn_lm_forward_args *args);

/*
 * Choosing the next token from logits, as the book's generate (ch05):
 * temperature 0 is greedy (argmax, the first of equal maxima); else the
 * top_k largest logits are kept (0: all) and divided by temperature. With
 * top_p 0 or 1 the rest is attn_sample_book's: the book's softmax and
 * torch.multinomial, draw for draw. With 0 < top_p < 1 (nucleus sampling,
 * not in the book) the softmax is in double, the smallest set of most
 * likely tokens whose probability reaches top_p is kept and renormalised,
 * and one token drawn by inverse CDF with one torch.rand uniform.
 */
typedef struct attn_sampling {
    double temperature;
    size_t top_k;
    double top_p;
} attn_sampling;
attn_status attn_sample(attn_ctx *ctx, const float *logits, size_t vocab_size,
                        const attn_sampling *s, attn_rng *rng, int32_t *out);
/*
 * One step of the book's generate (ch05) as PyTorch runs it, for a caller
 * that replays the book's run: top_k (0: all) filters with torch.where(
 * logits < k-th largest, -inf, logits); temperature 0 is argmax (no draw);
 * else torch.multinomial(torch.softmax(logits / temperature), 1), drawing
 * what PyTorch draws (attn_rng_multinomial: 2 vocab_size words). The
 * softmax is in float like PyTorch's, though not its vector exp: an index
 * differs only where two categories' ratios p / q tie within float
 * rounding. attn_sample without top_p draws the same. PyTorch divides by
 * the temperature as a float: past float's range it is inf there (finite
 * logits then 0: a uniform draw), below it 0. Where that, or a quotient
 * past float's range, turns PyTorch's softmax NaN (it refuses to draw),
 * the draw is from the softmax in double, from the same rng words: uniform
 * over the finite kept logits for a huge temperature, the largest logits
 * alone for a tiny one. A largest logit of +inf or -inf is
 * ATTN_ERR_INVALID at any temperature > 0 (temperature 0 takes the
 * argmax, as torch.argmax does).
 */
attn_status attn_sample_book(attn_ctx *ctx, const float *logits, size_t vocab_size,
                             double temperature, size_t top_k, attn_rng *rng, int32_t *out);

/*
 * Token by token, as the book's generate_text_simple with its cache: the
 * prompt (batch 1) is prefilled, then each step samples a token, stops at
 * one of stop_tokens (not written) and feeds it back. out receives up to
 * max_new_tokens ids, *count how many. cache NULL: one made for
 * prompt_len + max_new_tokens and freed; a cache given is checked against
 * the model (ATTN_ERR_SHAPE, the cache unchanged) and the run's positions
 * (max_len; paged, every layer's pages: ATTN_ERR_OVERFLOW, the cache
 * unchanged), then reset.
 * rng is needed when temperature > 0. on_token, when given, is called
 * after each token (streaming); returning false stops. It must not free or
 * change the model, the cache, the rng or the arrays the call is using
 * (stop, then free them once attn_lm_generate has returned).
 */
typedef bool (*attn_token_fn)(void *user, int32_t token);
typedef struct attn_generate_args {
    const int32_t *prompt;
    size_t prompt_len, max_new_tokens;
    attn_sampling sampling;
    attn_rng *rng;
    const int32_t *stop_tokens;
    size_t num_stop_tokens;
    attn_kv_cache *cache;
    attn_token_fn on_token;
    void *user;
    int32_t *out;
    size_t *count;
} attn_generate_args;
attn_status attn_lm_generate(attn_lm *m, const attn_generate_args *args);

/*
 * Byte-level BPE tokenizers, read from local files (nothing is fetched):
 * GPT-2's (a directory or the pair encoder.json + vocab.bpe, or Hugging
 * Face's vocab.json + merges.txt) or a tiktoken file (base64 token, rank
 * per line; Llama 3's tokenizer.model, with its special tokens). Encoding
 * splits text with the model's pre-tokenizer pattern, then merges by rank.
 *
 * path: a directory holding encoder.json + vocab.bpe, vocab.json +
 * merges.txt or tokenizer.model; one file of a GPT-2 pair (the other found
 * beside it); or a tiktoken file. GPT-2's files use GPT-2's pattern and
 * merge as transformers' GPT2Tokenizer; a tiktoken file uses Llama 3's
 * pattern and merges as tiktoken, and gets the 256 special tokens of the
 * book's Llama3Tokenizer after its ranks (with Meta's 128000 ranks:
 * <|begin_of_text|> 128000, <|end_of_text|> 128001, <|start_header_id|>
 * 128006, <|end_header_id|> 128007, <|eot_id|> 128009, <|reserved_i|>
 * 128002 + i for the others up to 128255). Special tokens come only by id:
 * text naming one is encoded as plain text (tiktoken's encode with
 * disallowed_special=()); they decode to their names. vocab_size is the
 * largest id + 1. Text need not be valid UTF-8: each invalid byte is a
 * character of its own, so decode(encode(text)) is text. The Unicode classes
 * are Unicode 16's, as tiktoken 0.9's (src/text/unicode_classes.c).
 * Errors: ATTN_ERR_IO (a file missing or unreadable), ATTN_ERR_FORMAT (the
 * message names the file and line, or line:column in JSON), ATTN_ERR_NULL,
 * ATTN_ERR_NO_MEMORY; on failure *out is NULL. A tokenizer is read-only
 * after loading; its errors go to the ctx it was loaded with.
 */
typedef struct attn_tokenizer attn_tokenizer;
attn_status attn_tokenizer_load(attn_ctx *ctx, const char *path, attn_tokenizer **out);
void attn_tokenizer_free(attn_tokenizer *t);
size_t attn_tokenizer_vocab_size(const attn_tokenizer *t);
/* ids receive up to capacity ids; *count the number the text has (a
 * larger count than capacity is ATTN_ERR_SHAPE, nothing lost: call again). */
attn_status attn_tokenizer_encode(attn_tokenizer *t, const char *text, size_t length,
                                  int32_t *ids, size_t capacity, size_t *count);
/* The bytes of ids (UTF-8, possibly cut inside a character at the ends);
 * same capacity rule; text is not NUL-terminated. An id that is no token
 * is ATTN_ERR_INVALID naming its index. */
attn_status attn_tokenizer_decode(attn_tokenizer *t, const int32_t *ids, size_t n, char *text,
                                  size_t capacity, size_t *length);

/* ------------------------------------------------------------------------ */
/* The book's text data (pretraining, ch02 and ch05)                         */
/* ------------------------------------------------------------------------ */

/*
 * gpt_train.py's train/validation split: *split receives the byte offset
 * of character (code point) int(train_ratio * len(text)) of the UTF-8 text,
 * as Python counts them; text[0 .. split) is the training part, the rest
 * validation, each tokenized on its own. Pass the text as Python reads it
 * (open(..., "r") turns "\r\n" into "\n"); text that is not UTF-8 (which
 * Python would not read) is ATTN_ERR_INVALID naming the first bad byte.
 */
attn_status attn_text_split(attn_ctx *ctx, const char *text, size_t length, double train_ratio,
                            size_t *split);

/*
 * The book's GPTDatasetV1: windows i = 0, stride, 2 stride, ... while
 * i < n_ids - max_length, window k's input ids[i .. i + max_length) and
 * target ids[i + 1 .. i + max_length + 1). _new copies the ids; _encode
 * tokenizes text first as tokenizer.encode(text, allowed_special=
 * {"<|endoftext|>"}) does (that name in the text is the tokenizer's last
 * id when it decodes to it, GPT-2's 50256, else ATTN_ERR_INVALID).
 * max_length and stride must be positive. Errors go to ctx.
 */
typedef struct attn_text_dataset attn_text_dataset;
attn_status attn_text_dataset_new(attn_ctx *ctx, const int32_t *ids, size_t n_ids,
                                  size_t max_length, size_t stride, attn_text_dataset **out);
attn_status attn_text_dataset_encode(attn_ctx *ctx, attn_tokenizer *tok, const char *text,
                                     size_t length, size_t max_length, size_t stride,
                                     attn_text_dataset **out);
void attn_text_dataset_free(attn_text_dataset *d);
/* len(dataset): the number of windows (0 for NULL). */
size_t attn_text_dataset_len(const attn_text_dataset *d);
size_t attn_text_dataset_max_length(const attn_text_dataset *d);
/* The token ids the windows are cut from (valid while d lives). */
size_t attn_text_dataset_num_ids(const attn_text_dataset *d);
const int32_t *attn_text_dataset_ids(const attn_text_dataset *d);
/* dataset[index]: input and target, max_length ids each. */
attn_status attn_text_dataset_get(const attn_text_dataset *d, size_t index, int32_t *input,
                                  int32_t *target);

/*
 * DataLoader(dataset, batch_size, shuffle, drop_last, num_workers=0) over
 * dataset_len items: len(loader) batches (dataset_len / batch_size, rounded
 * up unless drop_last). Each pass (a for loop over the loader: each epoch,
 * each evaluation) starts with attn_data_loader_begin, which draws from
 * rng, the global generator, what iter(loader) and its first next() draw:
 * the iterator's _base_seed (a random_int64), then with shuffle
 * RandomSampler's seed (another), whose own generator gives the pass's
 * order, randperm(dataset_len); without shuffle the order is 0 .. n-1.
 * Begin a pass only where PyTorch iterates (calc_loss_loader skips an
 * empty loader). Batch b holds order[b * batch_size ...], batch_size
 * items (fewer in a last partial one). shuffle needs dataset_len > 0 and
 * batch_size must be positive, as PyTorch's samplers require. A loader
 * holds one pass: for a pass that runs inside another over the same data
 * (the book's evaluate_model inside an epoch over train_loader), begin it
 * on a second loader made alike.
 */
typedef struct attn_data_loader attn_data_loader;
attn_status attn_data_loader_new(attn_ctx *ctx, size_t dataset_len, size_t batch_size,
                                 bool shuffle, bool drop_last, attn_data_loader **out);
void attn_data_loader_free(attn_data_loader *l);
/* len(loader) (0 for NULL). */
size_t attn_data_loader_len(const attn_data_loader *l);
attn_status attn_data_loader_begin(attn_data_loader *l, attn_rng *rng);
/* The dataset indices of batch b of the pass begun (indices: batch_size
 * entries), *count how many. */
attn_status attn_data_loader_batch(const attn_data_loader *l, size_t b, size_t *indices,
                                   size_t *count);
/* Batch b of the pass begun as the loader's collate stacks it: inputs and
 * targets (rows, max_length), room for batch_size rows; *rows how many. The
 * loader must have been made over attn_text_dataset_len(d) items. */
attn_status attn_text_dataset_batch(const attn_text_dataset *d, const attn_data_loader *l,
                                    size_t b, int32_t *inputs, int32_t *targets, size_t *rows);

/* ------------------------------------------------------------------------ */
/* Pretraining: the book's chapter 5                                         */
/* ------------------------------------------------------------------------ */

/*
 * gpt_train.py's train_model_simple as a run stepped through events, so a
 * command prints and a binding collects from the same loop. The text is
 * split at character int(train_ratio * len(text)) (attn_text_split); each
 * part is tokenized and cut into windows of max_length tokens every stride
 * (create_dataloader_v1); the training loader shuffles and drops the last
 * partial batch, the validation loader does neither. The optimizer is
 * AdamW(lr, weight_decay) with PyTorch's other defaults. rng is the global
 * generator: after torch.manual_seed(s) and the model's construction from
 * it, it draws what PyTorch draws, in the same order: each loader pass's
 * seeds (attn_data_loader_begin) and the training forward's dropout.
 *
 * Events, in the book's order: every optimizer step gives STEP; then, when
 * global_step % eval_freq == 0, EVAL (evaluate_model: eval mode, no
 * gradients, the mean loss of the first eval_iter batches of a fresh pass
 * over each loader); after each epoch SAMPLE (generate_and_print_sample:
 * greedy, sample_tokens new tokens, the window cropped to the model's
 * context_length; the argmax of the logits, which is the argmax of their
 * softmax up to ties the rounding of softmax can make); at the end DONE
 * (and DONE again on every later call).
 *
 * The model may be any attn_model: vocab_size and context_length come
 * from attn_model_get_config. The run keeps pointers to model, tok and rng
 * (they must outlive it) and copies the text's token ids.
 *
 * attn_pretrain_new checks everything before anything is drawn or trained
 * (ATTN_ERR_INVALID, the message naming the values): epochs may be 0,
 * every other count positive; max_length <= context_length; lr finite and
 * > 0, weight_decay finite and >= 0; train_ratio in (0, 1]; the
 * tokenizer's vocabulary the model's; the training part long enough for
 * one batch of windows (n tokens make ceil((n - max_length) / stride)
 * windows; the message names n, max_length, stride and batch_size).
 * A validation part too short for one window is refused as well (the book
 * would print "nan" for every validation loss); train_ratio 1 asks for no
 * validation: val_loss is then NaN (as the book's calc_loss_loader gives
 * for an empty loader).
 *
 * A step whose loss is NaN or infinite stops the run before its backward:
 * ATTN_ERR_INVALID, "step 17: loss is nan" (global_step, as STEP would
 * have numbered it); the model is as after the last good step (the
 * generator has drawn that step's dropout). Later calls repeat the error.
 *
 * Checkpoints: attn_pretrain_save writes the model at path (attn_model_save:
 * loadable by attn_model_load, `attn generate --weights`, PyTorch's
 * load_state_dict) and the run's state at path + ".state": the optimizer's
 * moments and step count, the generator's state, the epoch, the position
 * in it and its loader order, tokens seen, the loss history, and what
 * identifies the data (token counts and hashes), the weights (a hash) and
 * what the weights do not show of the model (its config's dropout rate,
 * window, attention kind or RoPE constants, by name: a model made from a
 * checkpoint's edited metadata is refused, naming the value that moved).
 * Each file is written whole or not at all; the state is written after
 * the model, so a pair that a failure left mismatched is refused on
 * resume. attn_pretrain_resume, on a run made by attn_pretrain_new over
 * the same model config, text, tokenizer and batch_size / max_length /
 * stride / train_ratio, loads both and continues where the saved run
 * stood: its later events are bit for bit the uninterrupted run's. epochs,
 * lr, weight_decay, eval_freq, eval_iter and the sample settings are the
 * new run's (a larger epochs extends a finished run). Nothing changes
 * unless all of it loads. Save and resume at any point between events.
 */
typedef struct attn_pretrain_options {
    size_t epochs, batch_size;
    size_t max_length;           /* 0: the model's context_length */
    size_t stride;               /* 0: max_length */
    double train_ratio, lr, weight_decay;
    size_t eval_freq, eval_iter;
    const char *start_context;   /* NULL: "Every effort moves you"; "": no SAMPLE events */
    size_t sample_tokens;
} attn_pretrain_options;

/* The book's notebook run: epochs 10, batch_size 2, max_length and stride
 * the context, train_ratio 0.9, lr 0.0004, weight_decay 0.1, eval_freq 5,
 * eval_iter 5, "Every effort moves you", 50 sample tokens. */
attn_pretrain_options attn_pretrain_defaults(void);

typedef enum attn_pretrain_event_kind {
    ATTN_PRETRAIN_STEP = 0,
    ATTN_PRETRAIN_EVAL = 1,
    ATTN_PRETRAIN_SAMPLE = 2,
    ATTN_PRETRAIN_DONE = 3
} attn_pretrain_event_kind;

typedef struct attn_pretrain_event {
    attn_pretrain_event_kind kind;
    size_t epoch;                  /* 1-based */
    size_t step;                   /* global_step of the last step taken (the book's, 0-based) */
    size_t steps_per_epoch, total_steps;
    uint64_t tokens_seen;
    double step_loss;              /* STEP: that batch's loss */
    double train_loss, val_loss;   /* EVAL: as evaluate_model returns them */
    const char *sample;            /* SAMPLE: the decoded text, context included */
    size_t sample_length;          /* (valid until the next call on the run) */
} attn_pretrain_event;

typedef struct attn_pretrain attn_pretrain;

/* Errors go to ctx; on failure *out is NULL. o NULL: the defaults. */
attn_status attn_pretrain_new(attn_ctx *ctx, attn_model *model, attn_tokenizer *tok,
                              const char *text, size_t length, const attn_pretrain_options *o,
                              attn_rng *rng, attn_pretrain **out);
/* The next event (see above). */
attn_status attn_pretrain_next(attn_pretrain *run, attn_pretrain_event *ev);
/* The EVAL history so far (the book's train_losses, val_losses and
 * track_tokens_seen), n entries each, valid until the next call on run.
 * A resumed run's history includes the saved run's. */
attn_status attn_pretrain_history(const attn_pretrain *run, size_t *n,
                                  const uint64_t **tokens_seen, const double **train_losses,
                                  const double **val_losses);
/* A checkpoint at path (the model) and path + ".state" (see above). */
attn_status attn_pretrain_save(attn_pretrain *run, const char *path);
attn_status attn_pretrain_resume(attn_pretrain *run, const char *path);
void attn_pretrain_free(attn_pretrain *run);

/* ------------------------------------------------------------------------ */
/* Synthetic tasks                                                           */
/* ------------------------------------------------------------------------ */

/*
 * Sequences to learn, drawn from an attn_rng (so runs are reproducible).
 * Token 0 is a separator; data tokens are 1 .. V-1. Each row is a sequence
 * s of T + 1 tokens: tokens = s[0 .. T-1], and targets[t] = s[t+1] on the
 * answer tokens, ATTN_IGNORE_INDEX elsewhere. With n = T / 2:
 *   copy       s = x_1 .. x_n, 0, x_1 .. x_n           (x uniform in 1..V-1)
 *   reverse    s = x_1 .. x_n, 0, x_n .. x_1
 *   sort       s = x_1 .. x_n, 0, sorted(x)
 *              answers: the n tokens after the separator (a 0 pads odd T)
 *   induction  s = 0, p_1 .. p_L, 0, p_1 .. p_L, 0, p_1 ... (repeated to
 *              fill T + 1) with L uniform in [max(1, Lmax / 2), Lmax],
 *              Lmax = (T - 1) / 2, and p distinct tokens (so V - 1 >= Lmax);
 *              answers: every token after the second separator. Each is
 *              the token that followed the current one the time before
 *              (an induction head's rule); the varying L keeps position
 *              from telling it.
 */
typedef enum attn_task_kind {
    ATTN_TASK_COPY = 0,
    ATTN_TASK_REVERSE = 1,
    ATTN_TASK_SORT = 2,
    ATTN_TASK_INDUCTION = 3
} attn_task_kind;

/* "copy", "reverse", "sort", "induction"; "" for an unknown kind. */
const char *attn_task_name(attn_task_kind kind);
attn_status attn_task_find(attn_ctx *ctx, const char *name, attn_task_kind *out);
/* Whether the task fits vocab_size and context_length (the message says
 * why not). */
attn_status attn_task_check(attn_ctx *ctx, attn_task_kind kind, size_t vocab_size,
                            size_t context_length);
/* tokens and targets (batch, context_length); answers (optional) receives
 * the number of answer tokens. */
attn_status attn_task_batch(attn_ctx *ctx, attn_task_kind kind, size_t vocab_size,
                            size_t context_length, attn_rng *rng, size_t batch, int32_t *tokens,
                            int32_t *targets, size_t *answers);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif

#endif /* a standard the declarations are written in */
#endif /* ATTN_H */
