/* sdpa16.c — scaled dot-product attention on 16-bit storage (bf16, f16):
 * attn_sdpa_forward_16 / attn_sdpa_backward_16.
 *
 * Two paths, one contract (attn.h):
 *   - bf16 on a CPU with avx512_bf16 (and a ctx on the AVX-512 kernels):
 *     the fused bf16 kernels (kernels/flash16), where the problem is theirs
 *     (no dropout, softcap, ALiBi or sinks; v_head_dim == head_dim; scale
 *     >= 0) and its values are finite and small enough for float tiles;
 *     on AMX tiles where the process may use them and head_dim is a
 *     multiple of 32, else on vdpbf16ps where that outruns the float FMA
 *     (AMD's cores, not Intel's: core/cpu_info.h);
 *   - everything else: the tensors widened to float (exactly), the float
 *     attention of sdpa.c on them (every feature), each output rounded to
 *     the dtype once (to nearest even; NaN stays NaN).
 */
#include "half.h"
#include "internal.h"
#include "ops/sdpa16.h"
#include "ops/sdpa_internal.h"
#include "parallel.h"
#include "rng/dropout.h"
#if defined(ATTN_HAVE_X86_KERNELS)
#include "kernels/flash16/flash16.h"
#endif

#include <float.h>
#include <math.h>
#include <string.h>

/* ---- element conversions ----------------------------------------------------- */

/* A row of n elements, the dtype chosen once per row (the bf16 loops, a
 * shift and a rounding add, are then simple enough to vectorise). */
static void widen_row(attn_dtype dtype, const uint16_t *x, float *y, size_t n) {
    if (dtype == ATTN_DTYPE_BF16)
        for (size_t d = 0; d < n; d++) y[d] = attn_bf16_to_float(x[d]);
    else
        for (size_t d = 0; d < n; d++) y[d] = attn_f16_to_float(x[d]);
}

static void narrow_row(attn_dtype dtype, const float *x, uint16_t *y, size_t n) {
    if (dtype == ATTN_DTYPE_BF16)
        for (size_t d = 0; d < n; d++) y[d] = attn_float_to_bf16(x[d]);
    else
        for (size_t d = 0; d < n; d++) y[d] = attn_float_to_f16(x[d]);
}

/* ---- views: the (b, t, h) rows of a tensor ----------------------------------- */

/* Which of a problem's views: q-side rows (q, out) or k-side (k, v). */
typedef struct view16 {
    attn_view_strides st;
    bool keys;
    size_t heads, width;
} view16;

/* One copy between a view's 16-bit rows and its contiguous float copy. */
typedef struct view_copy {
    const attn_attention_problem *p;
    attn_dtype dtype;
    view16 from;
    attn_view_strides to_st;
    const void *src;
    void *dst;
    bool widening;
} view_copy;

/* The rows of tokens [begin, end) of the batch x longest-length grid (a
 * token past its sequence's length has none). */
static void copy_tokens(void *arg, size_t begin, size_t end) {
    const view_copy *c = arg;
    const attn_attention_problem *p = c->p;
    size_t longest = c->from.keys ? p->kv_len : p->q_len;
    for (size_t bt = begin; bt < end; bt++) {
        size_t b = bt / longest, i = bt % longest;
        attn_attention_seq s = attn_attention_seq_of(p, b);
        bool keys = c->from.keys;
        size_t start = keys ? s.kv_start : s.q_start, len = keys ? s.kv_len : s.q_len;
        if (i >= len) continue;
        for (size_t h = 0; h < c->from.heads; h++) {
            size_t a = attn_view_offset(c->from.st, b, start, h, i);
            size_t z = attn_view_offset(c->to_st, b, start, h, i);
            if (c->widening) {
                const uint16_t *x = (const uint16_t *)c->src + a;
                widen_row(c->dtype, x, (float *)c->dst + z, c->from.width);
            } else {
                const float *x = (const float *)c->src + z;
                narrow_row(c->dtype, x, (uint16_t *)c->dst + a, c->from.width);
            }
        }
    }
}

/* Copies every row of view from (16-bit, strides from) to (float, to_st)
 * widened, or back (float to 16-bit) rounded when !widening, on the ctx's
 * threads (on one, they left the others idle: 2-3% of the widened bf16
 * forward at T = 1024 on two threads). */
static void copy_view(attn_ctx *ctx, const attn_attention_problem *p, attn_dtype dtype,
                      view16 from, attn_view_strides to_st, const void *src, void *dst,
                      bool widening) {
    view_copy c = {p, dtype, from, to_st, src, dst, widening};
    size_t longest = from.keys ? p->kv_len : p->q_len;
    size_t min_tokens = 16384 / (from.heads * from.width + 1) + 1;
    attn_workers w = attn_ctx_workers(ctx);
    attn_pool_for(w.pool, w.threads, p->batch * longest, min_tokens, copy_tokens, &c);
}

static view16 q_view(const attn_attention_problem *p) {
    return (view16){p->q_strides, false, p->q_heads, p->head_dim};
}
static view16 k_view(const attn_attention_problem *p) {
    return (view16){p->k_strides, true, p->kv_heads, p->head_dim};
}
static view16 v_view(const attn_attention_problem *p) {
    return (view16){p->v_strides, true, p->kv_heads, p->v_head_dim};
}
static view16 out_view(const attn_attention_problem *p) {
    return (view16){p->out_strides, false, p->q_heads, p->v_head_dim};
}

/* Elements of a float copy of a view: B x T x H x width, or total x H x
 * width packed (the sizes attn_attention_check has bounded). */
static size_t view_elements(const attn_attention_problem *p, view16 v) {
    size_t tokens = v.keys ? p->kv_len : p->q_len;
    if (p->cu_seqlens_q)
        tokens = (size_t)(v.keys ? p->cu_seqlens_kv[p->batch] : p->cu_seqlens_q[p->batch]);
    else
        tokens *= p->batch;
    return tokens * v.heads * v.width;
}

/* ---- the widened path ---------------------------------------------------------- */

/* The strides {b, t, h} of a head-major float copy of width-wide rows:
 * (B, H, T, width), or (H, total, width) packed (no batch stride). */
static void head_major(size_t st[3], size_t tokens, size_t heads, size_t width, bool packed) {
    st[0] = packed ? 0 : heads * tokens * width;
    st[1] = width;
    st[2] = tokens * width;
}

/* cfg on the widened copies, each head-major: the float kernels then read
 * every head's rows where they lie, where in the (B, T, H, D) layout they
 * first gather each head's strided rows (the widened bf16 forward ran
 * 1.02-1.09x faster head-major, forward+backward 1.12-1.14x; a Skylake-SP). */
static attn_sdpa_config widened_config(const attn_sdpa_config *cfg) {
    attn_sdpa_config c = *cfg;
    bool packed = cfg->cu_seqlens_q != NULL;
    size_t q_tokens = packed ? (size_t)cfg->cu_seqlens_q[cfg->batch] : cfg->q_tokens;
    size_t kv_tokens = packed ? (size_t)cfg->cu_seqlens_kv[cfg->batch] : cfg->kv_tokens;
    size_t kv_heads = cfg->kv_heads ? cfg->kv_heads : cfg->heads;
    size_t v_dim = cfg->v_head_dim ? cfg->v_head_dim : cfg->head_dim;
    head_major(c.q_strides, q_tokens, cfg->heads, cfg->head_dim, packed);
    head_major(c.kv_strides, kv_tokens, kv_heads, cfg->head_dim, packed);
    head_major(c.v_strides, kv_tokens, kv_heads, v_dim, packed);
    head_major(c.out_strides, q_tokens, cfg->heads, v_dim, packed);
    return c;
}

/* Float buffers of n[i] elements each, in one allocation; NULL (and a
 * message) when out of memory. The first `copies` are the widened inputs,
 * every element of which copy_view writes: only the rest (the outputs)
 * start zeroed. (Zeroing them all cost the widened bf16 forward 6% at
 * T = 1024: 12 MiB cleared, then overwritten.) */
static float *alloc_buffers(attn_ctx *ctx, const char *fn, const size_t *n, size_t count,
                            size_t copies, float **bufs) {
    size_t total = 0, copied = 0;
    bool fits = true;
    for (size_t i = 0; i < count; i++) {
        fits = fits && attn_add_size(total, n[i], &total);
        if (i + 1 == copies) copied = total;
    }
    float *all = fits && attn_floats_fit(total) ? attn_malloc((total ? total : 1) * sizeof *all) : NULL;
    if (!all) {
        attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: cannot allocate %zu floats for the widened tensors",
                  fn, total);
        return NULL;
    }
    memset(all + copied, 0, (total - copied) * sizeof *all);
    for (size_t i = 0, at = 0; i < count; at += n[i], i++) bufs[i] = all + at;
    return all;
}

static attn_status forward_widened(attn_ctx *ctx, const char *fn, const attn_sdpa_config *cfg,
                                   attn_dtype dtype, const attn_attention_problem *p,
                                   const void *q, const void *k, const void *v, void *out,
                                   float *lse, attn_rng *rng, attn_sdpa_dropout *drawn) {
    view16 views[4] = {q_view(p), k_view(p), v_view(p), out_view(p)};
    size_t n[4];
    float *f[4];
    for (int i = 0; i < 4; i++) n[i] = view_elements(p, views[i]);
    float *all = alloc_buffers(ctx, fn, n, 4, 3, f); /* q, k, v copied; out */
    if (!all) return ATTN_ERR_NO_MEMORY;
    attn_sdpa_config c = widened_config(cfg);
    attn_attention_problem pf = attn_sdpa_problem_of(&c, f[0], f[1], f[2], f[3], lse);
    /* memory first: a failure must not have advanced the rng */
    size_t bytes = attn_attention_forward_bytes(ctx, &pf, false, false);
    void *workspace = attn_ctx_workspace(ctx, bytes);
    if (!workspace) {
        attn_free(all);
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY,
                         "%s: cannot allocate %zu bytes of attention workspace", fn, bytes);
    }
    copy_view(ctx, p, dtype, views[0], pf.q_strides, q, f[0], true);
    copy_view(ctx, p, dtype, views[1], pf.k_strides, k, f[1], true);
    copy_view(ctx, p, dtype, views[2], pf.v_strides, v, f[2], true);
    attn_dropout_stream stream, *dropout = NULL;
    if (cfg->dropout > 0.0) {
        attn_dropout_stream_begin(&stream, rng, cfg->dropout,
                                  cfg->batch * cfg->heads * cfg->q_tokens * cfg->kv_tokens);
        *drawn = (attn_sdpa_dropout){stream.philox_seed, stream.philox_offset};
        dropout = &stream;
    }
    attn_status st = attn_attention_forward(ctx, fn, &pf, dropout, NULL, NULL, NULL, workspace);
    if (st == ATTN_OK) copy_view(ctx, p, dtype, views[3], pf.out_strides, f[3], out, false);
    attn_free(all);
    return st;
}

static attn_status backward_widened(attn_ctx *ctx, const char *fn, const attn_sdpa_config *cfg,
                                    attn_dtype dtype, const attn_attention_problem *p,
                                    const void *const in[5], const float *lse, void *dq, void *dk,
                                    void *dv, const attn_sdpa_dropout *drawn) {
    /* q, k, v, out, dout; then dq, dk, dv */
    view16 views[8] = {q_view(p), k_view(p), v_view(p), out_view(p), out_view(p),
                       q_view(p), k_view(p), v_view(p)};
    size_t n[8];
    float *f[8];
    for (int i = 0; i < 8; i++) n[i] = view_elements(p, views[i]);
    float *all = alloc_buffers(ctx, fn, n, 8, 5, f);
    if (!all) return ATTN_ERR_NO_MEMORY;
    attn_sdpa_config c = widened_config(cfg);
    attn_attention_problem pf = attn_sdpa_problem_of(&c, f[0], f[1], f[2], f[3], (float *)lse);
    attn_view_strides to[5] = {pf.q_strides, pf.k_strides, pf.v_strides, pf.out_strides,
                               pf.out_strides};
    for (int i = 0; i < 5; i++) copy_view(ctx, p, dtype, views[i], to[i], in[i], f[i], true);
    attn_attention_dropout drop = attn_sdpa_drop_of(cfg, drawn);
    attn_attention_grads g = {.dout = f[4], .dq = f[5], .dk = f[6], .dv = f[7],
                              .dsinks = cfg->sinks ? cfg->sinks_grad : NULL};
    attn_status st = attn_attention_backward(ctx, fn, &pf, &drop, &g, NULL);
    if (st == ATTN_OK) {
        copy_view(ctx, p, dtype, views[5], pf.q_strides, f[5], dq, false);
        copy_view(ctx, p, dtype, views[6], pf.k_strides, f[6], dk, false);
        copy_view(ctx, p, dtype, views[7], pf.v_strides, f[7], dv, false);
    }
    attn_free(all);
    return st;
}

/* ---- the bf16 kernels: when they take a problem -------------------------------- */

#if defined(ATTN_HAVE_X86_KERNELS)
/* The ctx's kernels run vdpbf16ps (its kernel set has them where the CPU
 * does, with the AVX-512BW permutes beside it). */
static bool bf16_kernels_usable(const attn_ctx *ctx) { return ctx->ks.flash16_dot != NULL; }

/* ---- the scan for values the bf16 kernels must not take ----------------------
 *
 * The largest |x| of q, k, v (and dout) on the ctx's threads: it was 4.9%
 * of the AMX forward at T = 1024 on one thread, read by one thread. A unit
 * is SCAN16_ROWS tokens of every head where a token's heads lie side by
 * side (h stride = width: rows read in memory order, as attention/fused.c's
 * scan), else one head's rows. */

#define SCAN16_PARTS 64
#define SCAN16_ROWS 256

typedef struct scan16_view {
    const uint16_t *x; /* NULL: not scanned */
    view16 v;
    size_t units; /* per batch */
    bool flat;    /* heads side by side */
} scan16_view;

typedef struct scan16 {
    const attn_attention_problem *p;
    scan16_view views[4];                /* q, k, v, dout */
    uint16_t part_max[SCAN16_PARTS][4]; /* largest |x| (bf16 bits) per part */
} scan16;

static scan16_view scan16_view_of(const attn_attention_problem *p, const uint16_t *x, view16 v) {
    size_t len = v.keys ? p->kv_len : p->q_len; /* the longest, with cu_seqlens */
    bool flat = v.st.h == v.width;
    return (scan16_view){.x = x, .v = v, .flat = flat,
                         .units = !x ? 0 : flat ? (len + SCAN16_ROWS - 1) / SCAN16_ROWS : v.heads};
}

/* Units [begin, end), numbered through the views in order, batch by batch. */
static void scan16_units(void *arg, size_t part, size_t begin, size_t end) {
    scan16 *job = arg;
    const attn_attention_problem *p = job->p;
    uint16_t *top = job->part_max[part];
    for (size_t i = begin; i < end; i++) {
        size_t t = 0, u = i;
        while (u >= p->batch * job->views[t].units) u -= p->batch * job->views[t++].units;
        const scan16_view *x = &job->views[t];
        size_t b = u / x->units;
        u %= x->units;
        attn_attention_seq s = attn_attention_seq_of(p, b);
        size_t start = x->v.keys ? s.kv_start : s.q_start, len = x->v.keys ? s.kv_len : s.q_len;
        size_t r0 = x->flat ? u * SCAN16_ROWS : 0, h = x->flat ? 0 : u;
        if (r0 >= len) continue;
        size_t rows = x->flat && len - r0 > SCAN16_ROWS ? SCAN16_ROWS : len - r0;
        uint16_t m = attn_flash16_max_magnitude(x->x + attn_view_offset(x->v.st, b, start, h, r0),
                                                rows, x->v.st.t,
                                                x->flat ? x->v.heads * x->v.width : x->v.width);
        top[t] = m > top[t] ? m : top[t];
    }
}

/* top[t] = the largest |x| of q, k, v, dout (0 for dout NULL), or false
 * when some element is inf or NaN. */
static bool scan_magnitudes(attn_ctx *ctx, const attn_attention_problem *p,
                            const uint16_t *const x[4], float top[4]) {
    view16 views[4] = {q_view(p), k_view(p), v_view(p), out_view(p)};
    scan16 job = {.p = p};
    size_t units = 0;
    for (int t = 0; t < 4; t++) {
        job.views[t] = scan16_view_of(p, x[t], views[t]);
        units += p->batch * job.views[t].units;
    }
    /* parts of at least 64 Ki elements, a unit counted as its fewest */
    size_t rows = p->q_len < p->kv_len ? p->q_len : p->kv_len;
    rows = rows < SCAN16_ROWS ? rows : SCAN16_ROWS;
    size_t min_units = ((size_t)1 << 16) / (rows * p->head_dim + 1) + 1;
    attn_workers w = attn_ctx_workers(ctx);
    size_t threads = w.threads < SCAN16_PARTS ? w.threads : SCAN16_PARTS;
    attn_pool_for_parts(w.pool, threads, units, min_units, scan16_units, &job);
    for (int t = 0; t < 4; t++) {
        uint16_t largest = 0;
        for (size_t part = 0; part < SCAN16_PARTS; part++)
            largest = job.part_max[part][t] > largest ? job.part_max[part][t] : largest;
        if (largest >= 0x7F80u) return false; /* magnitudes order as their bits */
        top[t] = attn_bf16_to_float(largest);
    }
    return true;
}

/* The AMX kernels where the process may use the tiles now and they take
 * p, else NULL. */
static const attn_flash16_kernels *amx_kernels(const attn_ctx *ctx,
                                               const attn_attention_problem *p) {
    const attn_flash16_kernels *amx = ctx->ks.flash16_amx;
    return amx && attn_ctx_amx_usable(ctx) && !amx->declines(p) ? amx : NULL;
}

/* The bf16 kernels that run p: AMX's where they take it, else vdpbf16ps'. */
static const attn_flash16_kernels *flash16_kernels(const attn_ctx *ctx,
                                                   const attn_attention_problem *p) {
    const attn_flash16_kernels *amx = amx_kernels(ctx, p);
    return amx ? amx : ctx->ks.flash16_dot;
}

/* Whether the bf16 kernels have p's features, on this CPU, and run it
 * faster than the float kernels on its widened tensors: on AMX tiles, or
 * on vdpbf16ps where that outruns the float FMA (the kernel set's bf16_dot_pays;
 * not on Intel's cores, where it issues at half the FMA's rate) or where
 * a test asks for it (attn_sdpa16_force_dot). */
static bool bf16_kernels_have(const attn_ctx *ctx, const attn_sdpa_config *cfg,
                              const attn_attention_problem *p) {
    return bf16_kernels_usable(ctx) && !(cfg->dropout > 0.0) && !(p->softcap > 0.0f) &&
           !p->alibi_slopes && !p->sinks && p->v_head_dim == p->head_dim && p->scale >= 0.0f &&
           (amx_kernels(ctx, p) || ctx->ks.bf16_dot_pays || ctx->bf16_dot_forced);
}

/* Whether the bf16 kernels take p on these values (dout: the backward's,
 * or NULL): the features they have, and scores, sums and dP that float
 * tiles hold (as the float kernels' own scan, attention/fused.c). */
static bool bf16_kernels_take(attn_ctx *ctx, const attn_sdpa_config *cfg,
                              const attn_attention_problem *p, const uint16_t *q,
                              const uint16_t *k, const uint16_t *v, const uint16_t *dout) {
    if (!bf16_kernels_have(ctx, cfg, p)) return false;
    const uint16_t *x[4] = {q, k, v, dout};
    float top[4];
    if (!scan_magnitudes(ctx, p, x, top)) return false;
    float qm = top[0], km = top[1], vm = top[2], dm = top[3];
    double D = (double)p->head_dim, S = (double)p->kv_len, limit = FLT_MAX / 16.0;
    double raw = 1.4426950408889634 * (double)p->scale * D * qm * km;
    return !(raw >= limit || S * vm >= limit || D * dm * vm >= limit || S * dm >= limit);
}

/* The fused pass: on AMX tiles where they take p, else on vdpbf16ps. */
static attn_status run_bf16_kernels(attn_ctx *ctx, const char *fn,
                                    const attn_attention_problem *p,
                                    const attn_flash16_tensors *t, bool backward) {
    const attn_flash16_kernels *fk = flash16_kernels(ctx, p);
    size_t bytes = backward ? fk->backward_bytes(p, ctx->num_threads)
                            : fk->forward_bytes(p, ctx->num_threads);
    /* the ctx's scratch: a call after the first one of its size faults in
     * no fresh pages */
    void *workspace = attn_ctx_scratch(ctx, bytes);
    if (!workspace)
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY,
                         "%s: cannot allocate %zu bytes of attention workspace", fn, bytes);
    if (backward)
        fk->backward(attn_ctx_workers(ctx), p, t, workspace);
    else
        fk->forward(attn_ctx_workers(ctx), p, t, workspace);
    return ATTN_OK;
}
#endif

void attn_sdpa16_force_dot(attn_ctx *ctx) { ctx->bf16_dot_forced = true; }

const char *attn_sdpa16_kernel(const attn_ctx *ctx, const attn_sdpa_config *cfg,
                               attn_dtype dtype, bool backward) {
#if defined(ATTN_HAVE_X86_KERNELS)
    attn_attention_problem p = attn_sdpa_problem_of(cfg, NULL, NULL, NULL, NULL, NULL);
    if (dtype == ATTN_DTYPE_BF16 && bf16_kernels_have(ctx, cfg, &p))
        return flash16_kernels(ctx, &p)->name;
#else
    (void)ctx, (void)cfg, (void)dtype;
#endif
    (void)backward; /* both passes choose alike */
    return "widened";
}

/* ---- the entry points ------------------------------------------------------------ */

static attn_status check_dtype(attn_ctx *ctx, const char *fn, attn_dtype dtype) {
    if (dtype == ATTN_DTYPE_BF16 || dtype == ATTN_DTYPE_F16) return ATTN_OK;
    return attn_fail(ctx, ATTN_ERR_INVALID, "%s: dtype (%s, %d) must be BF16, F16 or F32", fn,
                     attn_dtype_name(dtype), (int)dtype);
}

attn_status attn_sdpa_forward_16(attn_ctx *ctx, const attn_sdpa_config *cfg, attn_dtype dtype,
                                 const void *q, const void *k, const void *v, void *out,
                                 float *lse, attn_rng *rng, attn_sdpa_dropout *drawn) {
    const char *fn = "attn_sdpa_forward_16";
    if (!ctx) return ATTN_ERR_NULL;
    if (dtype == ATTN_DTYPE_F32)
        return attn_sdpa_forward(ctx, cfg, q, k, v, out, lse, rng, drawn);
    attn_status st = attn_sdpa_check_forward_args(ctx, fn, cfg, q, k, v, out, rng, drawn);
    if (st != ATTN_OK || (st = check_dtype(ctx, fn, dtype)) != ATTN_OK) return st;
    attn_attention_problem p = attn_sdpa_problem_of(cfg, NULL, NULL, NULL, NULL, NULL);
    if ((st = attn_attention_check(ctx, fn, &p)) != ATTN_OK) return st;
#if defined(ATTN_HAVE_X86_KERNELS)
    if (dtype == ATTN_DTYPE_BF16 && bf16_kernels_take(ctx, cfg, &p, q, k, v, NULL)) {
        attn_flash16_tensors t = {.q = q, .k = k, .v = v, .out = out, .lse = lse};
        return run_bf16_kernels(ctx, fn, &p, &t, false);
    }
#endif
    return forward_widened(ctx, fn, cfg, dtype, &p, q, k, v, out, lse, rng, drawn);
}

attn_status attn_sdpa_backward_16(attn_ctx *ctx, const attn_sdpa_config *cfg, attn_dtype dtype,
                                  const void *q, const void *k, const void *v, const void *out,
                                  const float *lse, const void *dout, void *dq, void *dk,
                                  void *dv, const attn_sdpa_dropout *drawn) {
    const char *fn = "attn_sdpa_backward_16";
    if (!ctx) return ATTN_ERR_NULL;
    if (dtype == ATTN_DTYPE_F32)
        return attn_sdpa_backward(ctx, cfg, q, k, v, out, lse, dout, dq, dk, dv, drawn);
    attn_clear_error(ctx);
    attn_status st = attn_sdpa_check_config(ctx, fn, cfg);
    if (st != ATTN_OK) return st;
    const void *tensors[9] = {q, k, v, out, lse, dout, dq, dk, dv};
    if ((st = attn_sdpa_check_backward_args(ctx, fn, cfg, tensors, drawn)) != ATTN_OK ||
        (st = check_dtype(ctx, fn, dtype)) != ATTN_OK)
        return st;
    attn_attention_problem p = attn_sdpa_problem_of(cfg, NULL, NULL, NULL, NULL, NULL);
    if ((st = attn_attention_check(ctx, fn, &p)) != ATTN_OK) return st;
#if defined(ATTN_HAVE_X86_KERNELS)
    if (dtype == ATTN_DTYPE_BF16 && bf16_kernels_take(ctx, cfg, &p, q, k, v, dout)) {
        attn_flash16_tensors t = {.q = q, .k = k, .v = v, .saved_out = out, .saved_lse = lse,
                                  .dout = dout, .dq = dq, .dk = dk, .dv = dv};
        return run_bf16_kernels(ctx, fn, &p, &t, true);
    }
#endif
    const void *in[5] = {q, k, v, out, dout};
    return backward_widened(ctx, fn, cfg, dtype, &p, in, lse, dq, dk, dv, drawn);
}
