/*
 * flash_kernel.h — the fused attention kernels, written once over a small
 * vector vocabulary and compiled once per instruction set (flash_avx512.c,
 * flash_avx2.c, flash_portable.c define the vocabulary, then include this).
 *
 * The includer defines:
 *   VW                 floats per vector; NV vectors per register-tile row
 *   vec                the vector type
 *   v_zero() v_set1(x) v_load(p) v_store(p, v) v_fma(a, b, c) = a * b + c
 *   v_mul(a, b) v_sub(a, b) v_max(a, b)
 *   v_exp2(x)          2^x for x <= 0, exactly 0 for x = -inf
 *   v_hmax(v) v_hsum(v)
 *   v_keep(w, t, k)    per lane: k where the 32-bit word w[lane] < t, else 0
 *   FLASH_KERNELS      the name of the attn_flash_kernels table to define
 *   FLASH_ISA_NAME     "avx512", ...
 *
 * Tiles: a query block of BR rows (a multiple of RG) is held scaled by
 * scale * log2(e) (the softmax then runs on exp2); a key block of BC = NV *
 * VW keys is packed as k^T (hd, BC) and v (BC, hd padded to VW). The score
 * tile is RG rows x BC keys in registers: each step broadcasts RG query
 * values and loads NV vectors of k^T for RG * NV fused multiply-adds.
 */
#include "kernels/flash/flash.h"

#include "parallel.h"
#include "rng/philox.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#define BR 64
#define RG 4
#define BC (NV * VW)
#define LOG2E 1.4426950408889634

static size_t padded(size_t head_dim) { return (head_dim + VW - 1) / VW * VW; }

/* ---- shared pieces -------------------------------------------------------- */

/* The geometry of one call. */
typedef struct flash_shape {
    const attn_sdpa_args *a;
    const attn_flash_dropout *drop;
    size_t T, S, D, Dp, H, q_blocks, k_blocks;
    bool causal;
    float log2_scale; /* scale * log2(e) */
} flash_shape;

static flash_shape flash_shape_of(const attn_sdpa_args *a, const attn_flash_dropout *drop) {
    flash_shape f = {.a = a, .drop = drop, .T = a->tokens, .S = a->kv_tokens, .D = a->head_dim,
                     .H = a->heads};
    f.Dp = padded(f.D);
    f.q_blocks = (f.T + BR - 1) / BR;
    f.k_blocks = (f.S + BC - 1) / BC;
    f.causal = a->causal && a->mask != ATTN_MASK_NONE;
    f.log2_scale = (float)(a->scale * LOG2E);
    return f;
}

/* Keys [0, end) are the only ones rows [i0, i0 + rows) may see. */
static size_t visible_keys(const flash_shape *f, size_t i0, size_t rows) {
    if (!f->causal) return f->S;
    size_t last_row = i0 + rows - 1; /* sees keys j <= last_row + S - T */
    if (last_row + f->S < f->T) return 0;
    size_t end = last_row + f->S - f->T + 1;
    return end < f->S ? end : f->S;
}

/* The dropout factors of n consecutive weights from flat index e0 of the
 * (B, H, T, S) weights: 0 or kept_scale. Philox groups of 64 (rng/philox.h)
 * come from the includer's philox_group when it has a vector one. */
static void drop_factors(const attn_flash_dropout *drop, uint64_t e0, size_t n, float *factor) {
    if (drop->kind == ATTN_FLASH_DROP_BITS) {
        for (size_t j = 0; j < n; j++)
            factor[j] = attn_bit(drop->keep_bits, e0 + j) ? drop->kept_scale : 0.0f;
        return;
    }
    uint32_t words[64];
    for (uint64_t group = e0 >> 6; group << 6 < e0 + n; group++) {
#if defined(HAVE_PHILOX_GROUP)
        philox_group(drop->seed, drop->offset, group, words);
#else
        attn_philox_dropout_group(drop->seed, drop->offset, group, words);
#endif
        uint64_t lo = group << 6 > e0 ? group << 6 : e0;
        uint64_t hi = (group + 1) << 6 < e0 + n ? (group + 1) << 6 : e0 + n;
        if (hi - lo == 64) { /* a whole group: a vector of words at a time */
            for (int v = 0; v < 64; v += VW)
                v_store(factor + (lo - e0) + v, v_keep(words + v, drop->keep_threshold, drop->kept_scale));
            continue;
        }
        for (uint64_t e = lo; e < hi; e++)
            factor[e - e0] = words[e & 63] < drop->keep_threshold ? drop->kept_scale : 0.0f;
    }
}

/* x[0, n) *= factor[0, n), a vector at a time. */
static void scale_by(float *x, const float *factor, size_t n) {
    size_t j = 0;
    for (; j + VW <= n; j += VW) v_store(x + j, v_mul(v_load(x + j), v_load(factor + j)));
    for (; j < n; j++) x[j] *= factor[j];
}

/* xt (D, BC) = rows [j0, j0 + cols) of x (row stride ld) transposed, zero
 * beyond cols. No test inside the copy loops: this runs once per (query
 * block, key block), and a per-element branch made it a fifth of the
 * forward. */
static void transpose_keys(const flash_shape *f, const float *x, size_t j0, size_t cols, float *xt) {
    size_t ld = f->a->kv_t_stride, D = f->D, jj = 0;
#if defined(HAVE_TRANSPOSE_BLOCK)
    size_t whole = D / VW * VW; /* dims in whole VW x VW blocks */
    for (; jj + VW <= cols; jj += VW) {
        const float *x_j = x + (j0 + jj) * ld;
        for (size_t d = 0; d < whole; d += VW) transpose_block(x_j + d, ld, xt + d * BC + jj, BC);
        for (size_t r = 0; r < VW; r++)
            for (size_t d = whole; d < D; d++) xt[d * BC + jj + r] = x_j[r * ld + d];
    }
#endif
    for (; jj < cols; jj++) {
        const float *x_j = x + (j0 + jj) * ld;
        for (size_t d = 0; d < D; d++) xt[d * BC + jj] = x_j[d];
    }
    for (jj = cols; jj < BC; jj++)
        for (size_t d = 0; d < D; d++) xt[d * BC + jj] = 0.0f;
}

/* k^T (D, BC) and v (BC, Dp) of keys [j0, j0 + cols), zero beyond. v is
 * copied even where its rows could be read in place: apply_values reading
 * them with the tensor's row stride measured 3-5% slower than the copy
 * (T = 1024 and 4096, causal, 1 thread), likely because the strided rows,
 * read 16 times per block, compete for a few L1 sets. */
static void pack_keys(const flash_shape *f, const float *k, const float *v, size_t j0, size_t cols,
                      float *kt, float *vp) {
    size_t ld = f->a->kv_t_stride, D = f->D, Dp = f->Dp;
    transpose_keys(f, k, j0, cols, kt);
    for (size_t jj = 0; jj < cols; jj++) {
        memcpy(vp + jj * Dp, v + (j0 + jj) * ld, D * sizeof *vp);
        memset(vp + jj * Dp + D, 0, (Dp - D) * sizeof *vp);
    }
    memset(vp + cols * Dp, 0, (BC - cols) * Dp * sizeof *vp);
}

/* s (RG, BC) = qs (RG rows of D, row stride ld) @ kt (D, BC): a score tile.
 * The sums live in a local array written to s once at the end: vector
 * types may alias floats, so sums kept in s itself would be stored back on
 * every step. */
static void score_tile(const float *qs, size_t ld, size_t D, const float *kt, vec s[RG][NV]) {
    vec acc[RG][NV];
    for (int r = 0; r < RG; r++)
        for (int v = 0; v < NV; v++) acc[r][v] = v_zero();
    for (size_t d = 0; d < D; d++) {
        vec k[NV];
        for (int v = 0; v < NV; v++) k[v] = v_load(kt + d * BC + v * VW);
        for (int r = 0; r < RG; r++) {
            vec q = v_set1(qs[r * ld + d]);
            for (int v = 0; v < NV; v++) acc[r][v] = v_fma(q, k[v], acc[r][v]);
        }
    }
    for (int r = 0; r < RG; r++)
        for (int v = 0; v < NV; v++) s[r][v] = acc[r][v];
}

/* o (RG, Dp) = o * alpha + p (RG, cols) @ vp (cols, Dp): W vectors of each
 * row from column c0 (W = NV in the body, 1 at the tail), accumulated in
 * registers (constant bounds, so the compiler keeps acc out of memory). */
#define APPLY_VALUES(NAME, W)                                                                   \
    static void apply_values_##NAME(float *o, size_t Dp, const float *alpha, const float *p,  \
                                 size_t cols, const float *vp, size_t c0) {               \
        vec acc[RG][W];                                                                   \
        for (int r = 0; r < RG; r++) {                                                    \
            vec scale = v_set1(alpha[r]);                                                 \
            for (int v = 0; v < W; v++) acc[r][v] = v_mul(v_load(o + r * Dp + c0 + v * VW), scale); \
        }                                                                                 \
        for (size_t jj = 0; jj < cols; jj++) {                                            \
            vec val[W];                                                                   \
            for (int v = 0; v < W; v++) val[v] = v_load(vp + jj * Dp + c0 + v * VW);      \
            for (int r = 0; r < RG; r++) {                                                \
                vec w = v_set1(p[r * BC + jj]);                                           \
                for (int v = 0; v < W; v++) acc[r][v] = v_fma(w, val[v], acc[r][v]);      \
            }                                                                             \
        }                                                                                 \
        for (int r = 0; r < RG; r++)                                                      \
            for (int v = 0; v < W; v++) v_store(o + r * Dp + c0 + v * VW, acc[r][v]);     \
    }
APPLY_VALUES(body, NV)
APPLY_VALUES(tail, 1)

static void apply_values(float *o, size_t Dp, const float *alpha, const float *p, size_t cols,
                         const float *vp) {
    size_t c0 = 0;
    for (; c0 + NV * VW <= Dp; c0 += NV * VW) apply_values_body(o, Dp, alpha, p, cols, vp, c0);
    for (; c0 < Dp; c0 += VW) apply_values_tail(o, Dp, alpha, p, cols, vp, c0);
}

/* Sets masked scores (keys past cols, or hidden by the causal mask from
 * query row i) to -inf. */
static void mask_tile(const flash_shape *f, vec s[RG][NV], size_t i_first, size_t j0, size_t cols) {
    bool causal_edge = f->causal && j0 + BC + f->T > i_first + f->S + 1;
    if (cols == BC && !causal_edge) return;
    float row[BC];
    for (int r = 0; r < RG; r++) {
        for (int v = 0; v < NV; v++) v_store(row + v * VW, s[r][v]);
        for (size_t jj = 0; jj < BC; jj++)
            if (jj >= cols || (f->causal && attn_causal_hides(i_first + r, j0 + jj, f->T, f->S)))
                row[jj] = -INFINITY;
        for (int v = 0; v < NV; v++) s[r][v] = v_load(row + v * VW);
    }
}

/* ---- forward -------------------------------------------------------------- */

static size_t forward_workspace(size_t head_dim) {
    size_t D = head_dim, Dp = padded(head_dim);
    /* qs (BR, D), kt (D, BC), vp (BC, Dp), o (BR, Dp), m, l (BR), p (RG, BC), factors (BC) */
    return BR * D + D * BC + BC * Dp + BR * Dp + 2 * BR + RG * BC + BC + 2 * VW;
}

typedef struct forward_job {
    flash_shape f;
    float *workspace;
    size_t per_part;
} forward_job;

/* One (batch, head, query block): FlashAttention-2's forward. */
static void forward_block(void *arg, size_t part, size_t item) {
    const forward_job *job = arg;
    const flash_shape *f = &job->f;
    const attn_sdpa_args *a = f->a;
    size_t D = f->D, Dp = f->Dp;
    /* heavy blocks first: item 0 is the last query block (causal) */
    size_t qb = f->q_blocks - 1 - item % f->q_blocks, bh = item / f->q_blocks;
    size_t b = bh / f->H, h = bh % f->H;
    size_t i0 = qb * BR, rows = f->T - i0 < BR ? f->T - i0 : BR;
    float *qs = job->workspace + part * job->per_part;
    float *kt = qs + BR * D, *vp = kt + D * BC, *o = vp + BC * Dp;
    float *m = o + BR * Dp, *l = m + BR, *p = l + BR, *factor = p + RG * BC;

    /* qs = q * scale * log2(e); rows past T are zero (computed, never written) */
    const float *q = a->q + b * a->b_stride + h * a->h_stride;
    for (size_t r = 0; r < rows; r++)
        for (size_t d = 0; d < D; d++) qs[r * D + d] = q[(i0 + r) * a->t_stride + d] * f->log2_scale;
    memset(qs + rows * D, 0, (BR - rows) * D * sizeof *qs);
    memset(o, 0, BR * Dp * sizeof *o);
    for (size_t r = 0; r < BR; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    size_t kv_base = b * a->kv_b_stride + h * a->kv_h_stride;
    size_t keys = visible_keys(f, i0, rows);
    uint64_t row_e0 = (uint64_t)(bh * f->T + i0) * f->S; /* flat index of (b, h, i0, 0) */
    for (size_t j0 = 0; j0 < keys; j0 += BC) {
        size_t cols = f->S - j0 < BC ? f->S - j0 : BC;
        pack_keys(f, a->k + kv_base, a->v + kv_base, j0, cols, kt, vp);
        for (size_t r0 = 0; r0 < rows; r0 += RG) {
            vec s[RG][NV];
            score_tile(qs + r0 * D, D, D, kt, s);
            mask_tile(f, s, i0 + r0, j0, cols);
            /* online softmax: m_new = max(m, rowmax); the running sums and
             * outputs rescale by 2^(m - m_new), one vector exp2 for the rows */
            float m_new[RG], shift[VW > RG ? VW : RG], alpha[VW > RG ? VW : RG];
            for (int r = 0; r < RG; r++) {
                vec mx = s[r][0];
                for (int v = 1; v < NV; v++) mx = v_max(mx, s[r][v]);
                m_new[r] = fmaxf(m[r0 + r], v_hmax(mx));
            }
            for (int r = 0; r < (VW > RG ? VW : RG); r++)
                shift[r] = r < RG && m_new[r] != -INFINITY ? m[r0 + r] - m_new[r] : 0.0f;
            for (int r = 0; r < RG; r += VW < RG ? VW : RG) v_store(alpha + r, v_exp2(v_load(shift + r)));
            for (int r = 0; r < RG; r++) {
                float *p_r = p + r * BC;
                if (m_new[r] == -INFINITY) { /* nothing visible yet */
                    alpha[r] = 1.0f;
                    memset(p_r, 0, BC * sizeof *p_r);
                    continue;
                }
                vec sum = v_zero(), row_max = v_set1(m_new[r]);
                for (int v = 0; v < NV; v++) {
                    vec e = v_exp2(v_sub(s[r][v], row_max));
                    sum = v_fma(e, v_set1(1.0f), sum);
                    v_store(p_r + v * VW, e);
                }
                l[r0 + r] = l[r0 + r] * alpha[r] + v_hsum(sum);
                m[r0 + r] = m_new[r];
                if (f->drop->kind != ATTN_FLASH_DROP_NONE && r0 + r < rows) {
                    drop_factors(f->drop, row_e0 + (r0 + r) * f->S + j0, cols, factor);
                    scale_by(p_r, factor, cols);
                }
            }
            apply_values(o + r0 * Dp, Dp, alpha, p, cols, vp);
        }
    }
    /* out = o / l; lse = ln(sum exp(s)) = (m + log2 l) / log2(e) */
    float *out = a->out + b * a->out_b_stride + h * a->out_h_stride;
    for (size_t r = 0; r < rows; r++) {
        float *out_r = out + (i0 + r) * a->out_t_stride;
        float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        for (size_t d = 0; d < D; d++) out_r[d] = o[r * Dp + d] * inv;
        if (a->lse)
            a->lse[bh * f->T + i0 + r] =
                l[r] > 0.0f ? (float)(((double)m[r] + log2((double)l[r])) / LOG2E) : -INFINITY;
    }
}

static void flash_forward(size_t threads, const attn_sdpa_args *a, const attn_flash_dropout *drop,
                          float *workspace) {
    forward_job job = {.f = flash_shape_of(a, drop), .workspace = workspace,
                       .per_part = forward_workspace(a->head_dim)};
    attn_parallel_dynamic(threads, a->batch * a->heads * job.f.q_blocks, forward_block, &job);
}

/* ---- backward ------------------------------------------------------------- */

/* rows (n, Dp) of x (row stride ld, D wide) times c, zero-padded; rows past
 * count are zero. */
static void pack_rows(const float *x, size_t ld, size_t count, size_t n, size_t D, size_t Dp,
                      float c, float *dst) {
    for (size_t r = 0; r < count && r < n; r++) {
        const float *src = x + r * ld;
        float *row = dst + r * Dp;
        for (size_t d = 0; d < D; d++) row[d] = src[d] * c;
        for (size_t d = D; d < Dp; d++) row[d] = 0.0f;
    }
    if (count < n) memset(dst + count * Dp, 0, (n - count) * Dp * sizeof *dst);
}

/* acc (BC, Dp) += tile^T (BC, rows) @ x (rows, Dp), tile (rows, BC): the
 * key-side products dv += A^T dO and dk += dS^T q, for 4 keys from j and W
 * vectors from column c0 at a time, in registers. */
#define ACCUMULATE_KEYS(NAME, W)                                                                  \
    static void accumulate_keys_##NAME(float *acc, size_t Dp, const float *tile, const float *x, \
                                    size_t rows, size_t j, size_t c0) {                     \
        vec sum[4][W];                                                                      \
        for (int jj = 0; jj < 4; jj++)                                                      \
            for (int v = 0; v < W; v++) sum[jj][v] = v_load(acc + (j + jj) * Dp + c0 + v * VW); \
        for (size_t r = 0; r < rows; r++) {                                                 \
            vec xv[W];                                                                      \
            for (int v = 0; v < W; v++) xv[v] = v_load(x + r * Dp + c0 + v * VW);           \
            for (int jj = 0; jj < 4; jj++) {                                                \
                vec w = v_set1(tile[r * BC + j + jj]);                                      \
                for (int v = 0; v < W; v++) sum[jj][v] = v_fma(w, xv[v], sum[jj][v]);       \
            }                                                                               \
        }                                                                                   \
        for (int jj = 0; jj < 4; jj++)                                                      \
            for (int v = 0; v < W; v++) v_store(acc + (j + jj) * Dp + c0 + v * VW, sum[jj][v]); \
    }
ACCUMULATE_KEYS(body, NV)
ACCUMULATE_KEYS(tail, 1)

/* Keys past cols hold zero weight in tile and are accumulated (as zeros)
 * into acc's padding rows, which are never read: BC is a multiple of 4. */
static void accumulate_keys(float *acc, size_t Dp, const float *tile, const float *x, size_t rows,
                            size_t cols) {
    for (size_t j = 0; j < cols; j += 4) {
        size_t c0 = 0;
        for (; c0 + NV * VW <= Dp; c0 += NV * VW)
            accumulate_keys_body(acc, Dp, tile, x, rows, j, c0);
        for (; c0 < Dp; c0 += VW) accumulate_keys_tail(acc, Dp, tile, x, rows, j, c0);
    }
}

/* The per-part scratch of the backward. */
static size_t backward_workspace(size_t head_dim) {
    size_t D = head_dim, Dp = padded(head_dim);
    /* qs, q, dO (BR, Dp); A, dS (BR, BC); kt, vt (D, BC); k or dk, dv (BC, Dp);
     * dq (BR, Dp); lse2, delta (BR); factors (BC) */
    return 4 * BR * Dp + 2 * BR * BC + 2 * D * BC + 2 * BC * Dp + 2 * BR + BC + 2 * VW;
}

typedef struct backward_job {
    flash_shape f;
    const float *out, *lse, *dout;
    float *dq, *dk, *dv, *delta;
    float *workspace;
    size_t per_part;
} backward_job;

typedef struct backward_tiles {
    float *qs, *q, *dO, *A, *dS, *kt, *vt, *kv0, *kv1, *dq, *lse2, *delta, *factor;
} backward_tiles;

static backward_tiles tiles_of(const backward_job *job, size_t part) {
    size_t D = job->f.D, Dp = job->f.Dp;
    backward_tiles t;
    t.qs = job->workspace + part * job->per_part;
    t.q = t.qs + BR * Dp;
    t.dO = t.q + BR * Dp;
    t.dq = t.dO + BR * Dp;
    t.A = t.dq + BR * Dp;
    t.dS = t.A + BR * BC;
    t.kt = t.dS + BR * BC;
    t.vt = t.kt + D * BC;
    t.kv0 = t.vt + D * BC;
    t.kv1 = t.kv0 + BC * Dp;
    t.lse2 = t.kv1 + BC * Dp;
    t.delta = t.lse2 + BR;
    t.factor = t.delta + BR;
    return t;
}

/* k^T and v^T (D, BC) of keys [j0, j0 + cols), zero beyond. */
static void pack_keys_transposed(const flash_shape *f, const float *k, const float *v, size_t j0,
                                 size_t cols, float *kt, float *vt) {
    transpose_keys(f, k, j0, cols, kt);
    transpose_keys(f, v, j0, cols, vt);
}

/* The query block's rows: qs (scaled by scale log2 e), dO, and per row
 * lse in base 2 and delta; q unscaled when want_q. */
static void pack_queries(const backward_job *job, const backward_tiles *t, size_t b, size_t h,
                         size_t i0, size_t rows, bool want_q) {
    const flash_shape *f = &job->f;
    const attn_sdpa_args *a = f->a;
    size_t bh = b * f->H + h;
    const float *q = a->q + b * a->b_stride + h * a->h_stride + i0 * a->t_stride;
    const float *dO = job->dout + b * a->out_b_stride + h * a->out_h_stride + i0 * a->out_t_stride;
    pack_rows(q, a->t_stride, rows, BR, f->D, f->Dp, f->log2_scale, t->qs);
    if (want_q) pack_rows(q, a->t_stride, rows, BR, f->D, f->Dp, 1.0f, t->q);
    pack_rows(dO, a->out_t_stride, rows, BR, f->D, f->Dp, 1.0f, t->dO);
    for (size_t r = 0; r < BR; r++) {
        t->lse2[r] = r < rows ? (float)(job->lse[bh * f->T + i0 + r] * LOG2E) : -INFINITY;
        t->delta[r] = r < rows ? job->delta[bh * f->T + i0 + r] : 0.0f;
    }
}

/* A = P * drop and dS = P * (dP * drop - delta) for rows [r0, r0 + RG) of
 * the query block at i0 against keys [j0, j0 + cols): P = 2^(s - lse2),
 * zero where masked, for rows past `rows` and for rows that saw no key. */
static void gradient_tile(const backward_job *job, const backward_tiles *t, size_t bh, size_t i0,
                          size_t rows, size_t r0, size_t j0, size_t cols) {
    const flash_shape *f = &job->f;
    vec s[RG][NV], dp[RG][NV];
    score_tile(t->qs + r0 * f->Dp, f->Dp, f->D, t->kt, s);
    mask_tile(f, s, i0 + r0, j0, cols);
    score_tile(t->dO + r0 * f->Dp, f->Dp, f->D, t->vt, dp);
    for (int r = 0; r < RG; r++) {
        size_t row = r0 + r;
        float *A = t->A + row * BC, *dS = t->dS + row * BC;
        if (row >= rows || t->lse2[row] == -INFINITY) {
            memset(A, 0, BC * sizeof *A);
            memset(dS, 0, BC * sizeof *dS);
            continue;
        }
        vec shift = v_set1(t->lse2[row]), delta = v_set1(t->delta[row]);
        for (int v = 0; v < NV; v++) {
            vec P = v_exp2(v_sub(s[r][v], shift));
            v_store(A + v * VW, P);
            v_store(dS + v * VW, dp[r][v]);
        }
        if (f->drop->kind != ATTN_FLASH_DROP_NONE) {
            drop_factors(f->drop, (uint64_t)(bh * f->T + i0 + row) * f->S + j0, cols, t->factor);
            scale_by(A, t->factor, cols);
            scale_by(dS, t->factor, cols);
        }
        /* a softmax over one key is constant: its dS is exactly zero (in
         * float, dP - delta would leave rounding residue) */
        if (visible_keys(f, i0 + row, 1) == 1) {
            memset(dS, 0, BC * sizeof *dS);
            continue;
        }
        /* dS = P (dP - delta), with P = A / drop: recompute P from A's tile */
        for (int v = 0; v < NV; v++) {
            vec P = v_exp2(v_sub(s[r][v], shift));
            v_store(dS + v * VW, v_mul(P, v_sub(v_load(dS + v * VW), delta)));
        }
    }
}

/* Pass A: one (batch, head, key block): dk, dv over every query block. */
static void backward_keys(void *arg, size_t part, size_t item) {
    const backward_job *job = arg;
    const flash_shape *f = &job->f;
    const attn_sdpa_args *a = f->a;
    size_t D = f->D, Dp = f->Dp;
    size_t kb = item % f->k_blocks, bh = item / f->k_blocks, b = bh / f->H, h = bh % f->H;
    size_t j0 = kb * BC, cols = f->S - j0 < BC ? f->S - j0 : BC;
    backward_tiles t = tiles_of(job, part);
    float *dk = t.kv0, *dv = t.kv1;
    size_t kv_base = b * a->kv_b_stride + h * a->kv_h_stride;
    pack_keys_transposed(f, a->k + kv_base, a->v + kv_base, j0, cols, t.kt, t.vt);
    memset(dk, 0, BC * Dp * sizeof *dk);
    memset(dv, 0, BC * Dp * sizeof *dv);
    /* the first query row that sees key j0 */
    size_t i_first = f->causal && j0 + f->T > f->S ? j0 + f->T - f->S : 0;
    for (size_t i0 = i_first / BR * BR; i0 < f->T; i0 += BR) {
        size_t rows = f->T - i0 < BR ? f->T - i0 : BR;
        pack_queries(job, &t, b, h, i0, rows, true);
        for (size_t r0 = 0; r0 < BR; r0 += RG) gradient_tile(job, &t, bh, i0, rows, r0, j0, cols);
        accumulate_keys(dv, Dp, t.A, t.dO, BR, cols);  /* dv += A^T dO */
        accumulate_keys(dk, Dp, t.dS, t.q, BR, cols);  /* dk += dS^T q  */
    }
    float *dk_out = job->dk + kv_base, *dv_out = job->dv + kv_base;
    for (size_t jj = 0; jj < cols; jj++)
        for (size_t d = 0; d < D; d++) {
            dk_out[(j0 + jj) * a->kv_t_stride + d] = dk[jj * Dp + d] * a->scale;
            dv_out[(j0 + jj) * a->kv_t_stride + d] = dv[jj * Dp + d];
        }
}

/* Pass B: one (batch, head, query block): dq over every key block. */
static void backward_queries(void *arg, size_t part, size_t item) {
    const backward_job *job = arg;
    const flash_shape *f = &job->f;
    const attn_sdpa_args *a = f->a;
    size_t D = f->D, Dp = f->Dp;
    size_t qb = f->q_blocks - 1 - item % f->q_blocks, bh = item / f->q_blocks;
    size_t b = bh / f->H, h = bh % f->H;
    size_t i0 = qb * BR, rows = f->T - i0 < BR ? f->T - i0 : BR;
    backward_tiles t = tiles_of(job, part);
    float *kp = t.kv0;
    pack_queries(job, &t, b, h, i0, rows, false);
    memset(t.dq, 0, BR * Dp * sizeof *t.dq);
    size_t kv_base = b * a->kv_b_stride + h * a->kv_h_stride;
    size_t keys = visible_keys(f, i0, rows);
    const float ones[RG] = {1.0f, 1.0f, 1.0f, 1.0f};
    for (size_t j0 = 0; j0 < keys; j0 += BC) {
        size_t cols = f->S - j0 < BC ? f->S - j0 : BC;
        pack_keys_transposed(f, a->k + kv_base, a->v + kv_base, j0, cols, t.kt, t.vt);
        pack_rows(a->k + kv_base + j0 * a->kv_t_stride, a->kv_t_stride, cols, BC, D, Dp, 1.0f, kp);
        for (size_t r0 = 0; r0 < rows; r0 += RG) {
            gradient_tile(job, &t, bh, i0, rows, r0, j0, cols);
            apply_values(t.dq + r0 * Dp, Dp, ones, t.dS + r0 * BC, cols, kp); /* dq += dS k */
        }
    }
    float *dq = job->dq + b * a->b_stride + h * a->h_stride;
    for (size_t r = 0; r < rows; r++)
        for (size_t d = 0; d < D; d++) dq[(i0 + r) * a->t_stride + d] = t.dq[r * Dp + d] * a->scale;
}

typedef struct delta_job {
    const flash_shape *f;
    const float *out, *dout;
    float *delta;
} delta_job;

/* delta_i = dO_i . O_i for rows [begin, end) of the flattened (B, H, T). */
static void delta_rows(void *arg, size_t begin, size_t end) {
    const delta_job *job = arg;
    const attn_sdpa_args *a = job->f->a;
    size_t T = job->f->T, H = job->f->H;
    for (size_t r = begin; r < end; r++) {
        size_t b = r / (H * T), h = (r / T) % H, i = r % T;
        size_t off = b * a->out_b_stride + h * a->out_h_stride + i * a->out_t_stride;
        double sum = 0.0;
        for (size_t d = 0; d < job->f->D; d++) sum += (double)job->dout[off + d] * job->out[off + d];
        job->delta[r] = (float)sum;
    }
}

static void flash_backward(size_t threads, const attn_sdpa_args *a, const attn_flash_dropout *drop,
                           const float *out, const float *lse, const float *dout, float *dq,
                           float *dk, float *dv, float *delta, float *workspace) {
    backward_job job = {.f = flash_shape_of(a, drop), .out = out, .lse = lse, .dout = dout,
                        .dq = dq, .dk = dk, .dv = dv, .delta = delta, .workspace = workspace,
                        .per_part = backward_workspace(a->head_dim)};
    size_t BH = a->batch * a->heads;
    delta_job dj = {&job.f, out, dout, delta};
    attn_parallel_for(threads, BH * job.f.T, 1024, delta_rows, &dj);
    attn_parallel_dynamic(threads, BH * job.f.k_blocks, backward_keys, &job);
    attn_parallel_dynamic(threads, BH * job.f.q_blocks, backward_queries, &job);
}

/* ---- the scan for inputs the fast path must not take ---------------------- */

/* max(top, |x[i]|) over n floats, inf when some x[i] is inf or NaN: x * 0
 * is NaN exactly then, and a sum of those is NaN if one is. */
static float max_abs(const float *x, size_t n, float top) {
    vec largest = v_zero(), poison = v_zero(), zero = v_zero();
    size_t i = 0;
    for (; i + VW <= n; i += VW) {
        vec v = v_load(x + i);
        largest = v_max(largest, v_max(v, v_sub(zero, v)));
        poison = v_fma(v, zero, poison);
    }
    float m = v_hmax(largest), bad = v_hsum(poison);
    for (; i < n; i++) {
        float a = fabsf(x[i]);
        m = a > m ? a : m;
        bad += x[i] * 0.0f;
    }
    if (bad != bad) return INFINITY;
    return m > top ? m : top;
}

/* ---- the table ------------------------------------------------------------- */

const attn_flash_kernels FLASH_KERNELS = {
    .name = FLASH_ISA_NAME,
    .max_abs = max_abs,
    .forward_workspace = forward_workspace,
    .forward = flash_forward,
    .backward_workspace = backward_workspace,
    .backward = flash_backward,
};
