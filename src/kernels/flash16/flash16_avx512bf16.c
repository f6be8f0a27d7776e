/* flash16_avx512bf16.c — the bf16 fused attention kernels of flash16.h on
 * AVX-512 BF16 (vdpbf16ps, vcvtne2ps2bf16) and AVX-512BW (vpermw): score
 * tiles of 4 rows x 64 keys in 16 float accumulators, as the float kernels'
 * (flash_kernel.h), each step a pair of products per lane. */
#include <immintrin.h>

#include "kernels/flash16/flash16_common.h"
#include "parallel.h"

#include <math.h>
#include <string.h>

#define BR 64 /* query rows of a block */
#define RG 4  /* rows of a register tile (even: rows pair up) */
#define BC 64 /* keys of a block */
#define NV (BC / VW)
#define LOG2E FLASH16_LOG2E

_Static_assert(BR <= FLASH16_MAX_ROWS, "rows16 holds a query block");

/* Two bf16 in one 32-bit lane: lo first (the lower half). */
static inline uint32_t pair_of(uint16_t lo, uint16_t hi) { return (uint32_t)lo | (uint32_t)hi << 16; }

static inline uint32_t load_u32(const void *p) {
    uint32_t x;
    memcpy(&x, p, sizeof x);
    return x;
}

/* 32 bf16 (lo: 16 of a, hi: 16 of b), rounded to nearest even. */
static inline __m512i bf16_pack(vec a, vec b) { return (__m512i)_mm512_cvtne2ps_pbh(b, a); }

/* The same with a and b interleaved: lane k holds (a[k], b[k]), for the
 * products that pair two rows. */
static inline __m512i bf16_interleave(vec a, vec b) {
    const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                           24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                           16, 0);
    return _mm512_permutexvar_epi16(order, bf16_pack(a, b));
}

static inline vec dot_pairs(vec acc, uint32_t pair, __m512i b) {
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32((int)pair), (__m512bh)b);
}

/* ---- geometry -------------------------------------------------------------- */

/* The sizes of one call: D features, D2 pairs of them, DQ = 2 D2 (a row as
 * the score tiles read it), DV = D rounded up to whole vectors (a row of
 * the products along keys or rows). */
typedef struct shape16 {
    const attn_attention_problem *p;
    size_t D, D2, DQ, DV, G, q_blocks, k_blocks;
    float c; /* scale * log2 e */
} shape16;

static shape16 shape_of(const attn_attention_problem *p) {
    shape16 f = {.p = p, .D = p->head_dim};
    f.D2 = (f.D + 1) / 2;
    f.DQ = 2 * f.D2;
    f.DV = (f.D + VW - 1) / VW * VW;
    f.G = p->q_heads / p->kv_heads;
    f.q_blocks = (p->q_len + BR - 1) / BR;
    f.k_blocks = (p->kv_len + BC - 1) / BC;
    f.c = (float)(p->scale * LOG2E);
    return f;
}

static bool tile_seen_whole(const rows16 *br, size_t j0) { return keys_seen_whole(br, j0, BC); }

/* The columns [*c0, *c1) of the tile at j0 that rows [r0, r0 + RG) see. */
static void group_cols(const rows16 *br, size_t r0, size_t j0, size_t *c0, size_t *c1) {
    if (tile_seen_whole(br, j0)) {
        *c0 = 0;
        *c1 = BC;
        return;
    }
    size_t lo = (size_t)-1, hi = 0;
    for (size_t r = r0; r < r0 + RG && r < br->rows; r++)
        if (br->begin[r] < br->end[r]) {
            lo = br->begin[r] < lo ? br->begin[r] : lo;
            hi = br->end[r] > hi ? br->end[r] : hi;
        }
    *c0 = lo > j0 ? lo - j0 : 0;
    *c1 = hi > j0 ? min_size(hi - j0, BC) : 0;
    if (*c0 >= *c1) *c0 = *c1 = 0;
}

/* ---- packing (once per call, O((T + S) D)) ------------------------------- */

/* xt (D2, BC) = keys [0, cols) of x (rows of stride ld) in pairs along d,
 * zero past cols: for S = Q K^T and dP = dO V^T. */
static void pack_transposed(const shape16 *f, const uint16_t *x, size_t ld, size_t cols,
                            uint32_t *xt) {
    size_t D = f->D;
    memset(xt, 0, f->D2 * BC * sizeof *xt);
    for (size_t j = 0; j < cols; j++) {
        const uint16_t *row = x + j * ld;
        for (size_t p2 = 0; p2 < D / 2; p2++) xt[p2 * BC + j] = load_u32(row + 2 * p2);
        if (D % 2) xt[(D / 2) * BC + j] = pair_of(row[D - 1], 0);
    }
}

/* xi (n / 2, DV) = rows [0, count) of x (row stride ld, n rows in all), two
 * rows interleaved in each lane, zero past count and D: for the products
 * along keys (O += P V, dQ += dS K) or along query rows (dV += P^T dO,
 * dK += dS^T Q). */
static void pack_pairs(const shape16 *f, const uint16_t *x, size_t ld, size_t count, size_t n,
                       uint32_t *xi) {
    memset(xi, 0, n / 2 * f->DV * sizeof *xi);
    for (size_t jp = 0; jp < n / 2 && 2 * jp < count; jp++) {
        const uint16_t *r0 = x + 2 * jp * ld;
        uint32_t *dst = xi + jp * f->DV;
        if (2 * jp + 1 < count)
            for (size_t d = 0; d < f->D; d++) dst[d] = pair_of(r0[d], r0[ld + d]);
        else
            for (size_t d = 0; d < f->D; d++) dst[d] = pair_of(r0[d], 0);
    }
}

/* xn (BR, DQ) = rows [0, rows) of a query-side tensor (row stride ld) as
 * stored, zero past rows and D. */
static void pack_rows(const shape16 *f, const uint16_t *x, size_t ld, size_t rows, uint16_t *xn) {
    memset(xn, 0, BR * f->DQ * sizeof *xn);
    for (size_t r = 0; r < rows; r++) memcpy(xn + r * f->DQ, x + r * ld, f->D * sizeof *xn);
}

/* ---- tiles ----------------------------------------------------------------- */

/* s (RG, BC) = x (RG rows of DQ bf16) @ yt (D2, BC pairs): a score tile. */
static inline void score_tile(const uint16_t *x, size_t DQ, const uint32_t *yt, size_t D2,
                              vec s[RG][NV]) {
    vec acc[RG][NV];
    for (int r = 0; r < RG; r++)
        for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
    for (size_t p2 = 0; p2 < D2; p2++) {
        __m512i y[NV];
        for (int v = 0; v < NV; v++) y[v] = _mm512_loadu_si512(yt + p2 * BC + v * VW);
        for (int r = 0; r < RG; r++) {
            uint32_t xp = load_u32(x + r * DQ + 2 * p2);
            for (int v = 0; v < NV; v++) acc[r][v] = dot_pairs(acc[r][v], xp, y[v]);
        }
    }
    for (int r = 0; r < RG; r++)
        for (int v = 0; v < NV; v++) s[r][v] = acc[r][v];
}

/* -inf outside each row's visible keys, rows [r0, r0 + RG) of br against
 * the tile at j0 (rows past br->rows see nothing). */
static inline void mask_tile(const rows16 *br, size_t r0, size_t j0, vec s[RG][NV]) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int r = 0; r < RG; r++) {
        size_t i = r0 + (size_t)r;
        size_t lo = i < br->rows ? br->begin[i] : 0, hi = i < br->rows ? br->end[i] : 0;
        size_t a = lo > j0 ? min_size(lo - j0, BC) : 0, z = hi > j0 ? min_size(hi - j0, BC) : 0;
        if (a == 0 && z == BC) continue;
        for (int v = 0; v < NV; v++) {
            __m512i key = _mm512_add_epi32(lane, _mm512_set1_epi32(v * VW));
            __mmask16 keep = _mm512_cmp_epi32_mask(key, _mm512_set1_epi32((int)a), _MM_CMPINT_NLT) &
                             _mm512_cmp_epi32_mask(key, _mm512_set1_epi32((int)z), _MM_CMPINT_LT);
            s[r][v] = _mm512_mask_blend_ps(keep, _mm512_set1_ps(-INFINITY), s[r][v]);
        }
    }
}

/* o (RG, DV) = o * alpha + w (RG rows of BC / 2 pairs) @ y (pairs [jp0,
 * jp1) of BC / 2 rows of DV): W vectors of each row from column c0. */
#define APPLY_PAIRS(NAME, W)                                                                    \
    static inline void apply_pairs_##NAME(float *o, size_t DV, const float *alpha,           \
                                          const uint32_t *w, size_t jp0, size_t jp1,       \
                                          const uint32_t *y, size_t c0) {                  \
        vec acc[RG][W];                                                                     \
        for (int r = 0; r < RG; r++)                                                        \
            for (int v = 0; v < W; v++) {                                                   \
                acc[r][v] = _mm512_loadu_ps(o + r * DV + c0 + v * VW);                      \
                if (alpha) acc[r][v] = _mm512_mul_ps(acc[r][v], _mm512_set1_ps(alpha[r]));  \
            }                                                                               \
        for (size_t jp = jp0; jp < jp1; jp++) {                                             \
            __m512i val[W];                                                                 \
            for (int v = 0; v < W; v++) val[v] = _mm512_loadu_si512(y + jp * DV + c0 + v * VW); \
            for (int r = 0; r < RG; r++)                                                    \
                for (int v = 0; v < W; v++)                                                 \
                    acc[r][v] = dot_pairs(acc[r][v], w[r * (BC / 2) + jp], val[v]);         \
        }                                                                                   \
        for (int r = 0; r < RG; r++)                                                        \
            for (int v = 0; v < W; v++) _mm512_storeu_ps(o + r * DV + c0 + v * VW, acc[r][v]); \
    }
APPLY_PAIRS(body, 4)
APPLY_PAIRS(tail, 1)

static void apply_pairs(float *o, size_t DV, const float *alpha, const uint32_t *w, size_t jp0,
                        size_t jp1, const uint32_t *y) {
    size_t c0 = 0;
    for (; c0 + 4 * VW <= DV; c0 += 4 * VW) apply_pairs_body(o, DV, alpha, w, jp0, jp1, y, c0);
    for (; c0 < DV; c0 += VW) apply_pairs_tail(o, DV, alpha, w, jp0, jp1, y, c0);
}

/* acc (BC, DV) += w^T @ x over row pairs [rp0, rp1): w (BR / 2, BC) pairs of
 * rows per key, x (BR / 2, DV) pairs of rows per feature; 4 keys and W
 * vectors at a time (dv += P^T dO, dk += dS^T q). */
#define ACCUMULATE_KEYS(NAME, W)                                                              \
    static inline void accumulate_keys_##NAME(float *acc, size_t DV, const uint32_t *w,      \
                                              const uint32_t *x, size_t rp0, size_t rp1,   \
                                              size_t j, size_t c0) {                       \
        vec sum[4][W];                                                                      \
        for (int jj = 0; jj < 4; jj++)                                                      \
            for (int v = 0; v < W; v++) sum[jj][v] = _mm512_loadu_ps(acc + (j + jj) * DV + c0 + v * VW); \
        for (size_t rp = rp0; rp < rp1; rp++) {                                             \
            __m512i xv[W];                                                                  \
            for (int v = 0; v < W; v++) xv[v] = _mm512_loadu_si512(x + rp * DV + c0 + v * VW); \
            for (int jj = 0; jj < 4; jj++)                                                  \
                for (int v = 0; v < W; v++)                                                 \
                    sum[jj][v] = dot_pairs(sum[jj][v], w[rp * BC + j + jj], xv[v]);         \
        }                                                                                   \
        for (int jj = 0; jj < 4; jj++)                                                      \
            for (int v = 0; v < W; v++) _mm512_storeu_ps(acc + (j + jj) * DV + c0 + v * VW, sum[jj][v]); \
    }
ACCUMULATE_KEYS(body, 4)
ACCUMULATE_KEYS(tail, 1)

static void accumulate_keys(float *acc, size_t DV, const uint32_t *w, const uint32_t *x,
                            size_t rp0, size_t rp1, size_t cols) {
    for (size_t j = 0; j < cols; j += 4) {
        size_t c0 = 0;
        for (; c0 + 4 * VW <= DV; c0 += 4 * VW) accumulate_keys_body(acc, DV, w, x, rp0, rp1, j, c0);
        for (; c0 < DV; c0 += VW) accumulate_keys_tail(acc, DV, w, x, rp0, rp1, j, c0);
    }
}

/* ---- workspace layout ---------------------------------------------------- */

/* Per (batch, KV head, key block): bytes of one packed K^T-like (D2, BC)
 * and of one interleaved (BC / 2, DV) block. */
static size_t kt_bytes(const shape16 *f) { return lines(f->D2 * BC * 4); }
static size_t ki_bytes(const shape16 *f) { return lines(BC / 2 * f->DV * 4); }
static size_t key_blocks(const shape16 *f) {
    return mul_or_max(mul_or_max(f->p->batch, f->p->kv_heads), f->k_blocks);
}
static size_t query_blocks(const shape16 *f) {
    return mul_or_max(mul_or_max(f->p->batch, f->p->q_heads), f->q_blocks);
}

/* The forward's per-part scratch: q (BR, DQ) bf16; o (BR, DV), m, l (BR);
 * the weights of a tile (RG, BC / 2 pairs). */
static size_t forward_part_bytes(const shape16 *f) {
    return lines(BR * f->DQ * 2) + lines(BR * f->DV * 4) + 2 * lines(BR * 4) + lines(RG * BC / 2 * 4);
}

size_t attn_flash16_forward_bytes(const attn_attention_problem *p, size_t threads) {
    shape16 f = shape_of(p);
    size_t keys = mul_or_max(key_blocks(&f), add_or_max(kt_bytes(&f), ki_bytes(&f)));
    return add_or_max(keys, mul_or_max(attn_parallel_parts(threads), forward_part_bytes(&f)));
}

/* ---- forward ----------------------------------------------------------------- */

typedef struct forward_job {
    shape16 f;
    const attn_flash16_tensors *t;
    uint8_t *kt, *vi; /* packed key blocks, (b, kvh, kb) order */
    uint8_t *parts;
    size_t part_bytes;
} forward_job;

/* K^T and interleaved V of key blocks [begin, end). */
static void pack_forward_keys(void *arg, size_t begin, size_t end) {
    const forward_job *job = arg;
    const shape16 *f = &job->f;
    const attn_attention_problem *p = f->p;
    for (size_t item = begin; item < end; item++) {
        size_t kb = item % f->k_blocks, rest = item / f->k_blocks;
        size_t kvh = rest % p->kv_heads, b = rest / p->kv_heads;
        attn_attention_seq seq = attn_attention_seq_of(p, b);
        size_t j0 = kb * BC, cols = j0 < seq.kv_len ? min_size(seq.kv_len - j0, BC) : 0;
        size_t j = cols ? j0 : 0; /* (an empty block reads nothing) */
        pack_transposed(f, job->t->k + row_at(p->k.st, b, &seq, true, kvh, j),
                        p->k.st.t, cols, (uint32_t *)(job->kt + item * kt_bytes(f)));
        pack_pairs(f, job->t->v + row_at(p->v.st, b, &seq, true, kvh, j), p->v.st.t,
                   cols, BC, (uint32_t *)(job->vi + item * ki_bytes(f)));
    }
}

/* One (batch, query head, query block): FlashAttention-2's forward. */
static void forward_block(void *arg, size_t part, size_t item) {
    const forward_job *job = arg;
    const shape16 *f = &job->f;
    const attn_attention_problem *p = f->p;
    const attn_flash16_tensors *t = job->t;
    size_t qb = f->q_blocks - 1 - item % f->q_blocks, rest = item / f->q_blocks; /* heavy first */
    size_t h = rest % p->q_heads, b = rest / p->q_heads, kvh = h / f->G;
    attn_attention_seq seq = attn_attention_seq_of(p, b);
    size_t i0 = qb * BR, DQ = f->DQ, DV = f->DV;
    if (i0 >= seq.q_len) return; /* past this sequence's rows */
    size_t rows = min_size(seq.q_len - i0, BR);
    uint8_t *at = job->parts + part * job->part_bytes;
    uint16_t *qt = (uint16_t *)at;
    float *o = (float *)(at += lines(BR * DQ * 2));
    float *m = (float *)(at += lines(BR * DV * 4));
    float *l = (float *)(at += lines(BR * 4));
    uint32_t *pt = (uint32_t *)(at + lines(BR * 4));
    pack_rows(f, t->q + row_at(p->q.st, b, &seq, false, h, i0), p->q.st.t, rows, qt);
    memset(o, 0, BR * DV * sizeof *o);
    for (size_t r = 0; r < BR; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    rows16 br;
    rows_of(p, &seq, i0, rows, &br);
    size_t block0 = (b * p->kv_heads + kvh) * f->k_blocks;
    vec c = _mm512_set1_ps(f->c);
    for (size_t kb = br.first / BC; kb * BC < br.last; kb++) {
        size_t j0 = kb * BC;
        const uint32_t *kt = (const uint32_t *)(job->kt + (block0 + kb) * kt_bytes(f));
        const uint32_t *vi = (const uint32_t *)(job->vi + (block0 + kb) * ki_bytes(f));
        bool whole = tile_seen_whole(&br, j0);
        for (size_t r0 = 0; r0 < rows; r0 += RG) {
            size_t c0, c1;
            group_cols(&br, r0, j0, &c0, &c1);
            if (c0 == c1) continue; /* m, l and o stay as they are */
            vec s[RG][NV];
            score_tile(qt + r0 * DQ, DQ, kt, f->D2, s);
            if (!whole) mask_tile(&br, r0, j0, s);
            /* online softmax: M = max(M, rowmax(s) c), once rounded; the
             * sums and outputs rescale by 2^(M_old - M) */
            float alpha[RG];
            for (int r = 0; r < RG; r++) {
                vec mx = _mm512_max_ps(_mm512_max_ps(s[r][0], s[r][1]), _mm512_max_ps(s[r][2], s[r][3]));
                float top = _mm512_reduce_max_ps(mx), *m_r = m + r0 + r;
                float m_new = top == -INFINITY ? *m_r : top * f->c > *m_r ? top * f->c : *m_r;
                uint32_t *p_r = pt + r * (BC / 2);
                if (m_new == -INFINITY) { /* nothing visible yet */
                    alpha[r] = 1.0f;
                    memset(p_r, 0, BC / 2 * sizeof *p_r);
                    continue;
                }
                alpha[r] = *m_r == -INFINITY ? 0.0f : exp2f(*m_r - m_new);
                vec neg_m = _mm512_set1_ps(-m_new), sum = _mm512_setzero_ps(), e[NV];
                for (int v = 0; v < NV; v++) {
                    e[v] = v_exp2(_mm512_fmadd_ps(s[r][v], c, neg_m));
                    sum = _mm512_add_ps(sum, e[v]);
                }
                _mm512_storeu_si512(p_r, bf16_pack(e[0], e[1]));
                _mm512_storeu_si512(p_r + VW, bf16_pack(e[2], e[3]));
                l[r0 + r] = l[r0 + r] * alpha[r] + _mm512_reduce_add_ps(sum);
                *m_r = m_new;
            }
            apply_pairs(o + r0 * DV, DV, alpha, pt, c0 / 2, (c1 + 1) / 2, vi);
        }
    }
    /* out = o / l; lse = (M + log2 l) / log2 e; a row that sees no key: 0, -inf */
    for (size_t r = 0; r < rows; r++) {
        bool seen = br.begin[r] < br.end[r] && l[r] > 0.0f;
        uint16_t *out = t->out + row_at(p->out.st, b, &seq, false, h, i0 + r);
        float inv = seen ? 1.0f / l[r] : 0.0f;
        for (size_t d = 0; d < f->D; d++) out[d] = attn_float_to_bf16(o[r * DV + d] * inv);
        if (t->lse)
            t->lse[attn_lse_index(p, b, h, i0 + r)] =
                seen ? (float)(((double)m[r] + log2((double)l[r])) / LOG2E) : -INFINITY;
    }
}

void attn_flash16_forward(attn_workers w, const attn_attention_problem *p,
                          const attn_flash16_tensors *t, void *workspace) {
    forward_job job = {.f = shape_of(p), .t = t};
    size_t blocks = key_blocks(&job.f);
    job.kt = workspace;
    job.vi = job.kt + blocks * kt_bytes(&job.f);
    job.parts = job.vi + blocks * ki_bytes(&job.f);
    job.part_bytes = forward_part_bytes(&job.f);
    attn_pool_for(w.pool, w.threads, blocks, 4, pack_forward_keys, &job);
    attn_pool_dynamic(w.pool, w.threads, query_blocks(&job.f), forward_block, &job);
}

/* ---- backward ---------------------------------------------------------------- */

/*
 * Packed once per call: per key block (b, kvh, kb) k^T and v^T (D2, BC) and
 * k interleaved (BC / 2, DV); per query block (b, h, qb) q and dO as stored
 * (BR, DQ), q and dO interleaved (BR / 2, DV), and each row's lse and delta
 * = dO . O. Per part: dk, dv (BC, DV) and P, dS interleaved (BR / 2, BC)
 * for pass A; dq (BR, DV) and a tile of dS (RG, BC / 2) for pass B.
 */
static size_t rows_bytes(const shape16 *f) { return lines(BR * f->DQ * 2); }
static size_t pairs_bytes(const shape16 *f) { return lines(BR / 2 * f->DV * 4); }
static size_t key_side_bytes(const shape16 *f) { return 2 * kt_bytes(f) + ki_bytes(f); }
static size_t query_side_bytes(const shape16 *f) {
    return 2 * rows_bytes(f) + 2 * pairs_bytes(f) + 2 * lines(BR * 4);
}
static size_t backward_part_bytes(const shape16 *f) {
    size_t keys = 2 * lines(BC * f->DV * 4) + 2 * lines(BR / 2 * BC * 4);
    size_t queries = lines(BR * f->DV * 4) + lines(RG * BC / 2 * 4);
    return keys > queries ? keys : queries;
}

size_t attn_flash16_backward_bytes(const attn_attention_problem *p, size_t threads) {
    shape16 f = shape_of(p);
    size_t keys = mul_or_max(key_blocks(&f), key_side_bytes(&f));
    size_t queries = mul_or_max(query_blocks(&f), query_side_bytes(&f));
    size_t parts = mul_or_max(attn_parallel_parts(threads), backward_part_bytes(&f));
    return add_or_max(add_or_max(keys, queries), parts);
}

typedef struct backward_job {
    shape16 f;
    const attn_flash16_tensors *t;
    uint8_t *keys, *queries, *parts;
    size_t part_bytes;
} backward_job;

typedef struct key_side {
    const uint32_t *kt, *vt, *ki;
} key_side;

typedef struct query_side {
    uint16_t *qn, *dOn;
    uint32_t *qi, *dOi;
    float *lse, *delta;
} query_side;

static key_side key_side_of(const backward_job *job, size_t block) {
    const shape16 *f = &job->f;
    const uint8_t *at = job->keys + block * key_side_bytes(f);
    key_side k = {(const uint32_t *)at, (const uint32_t *)(at + kt_bytes(f)),
                  (const uint32_t *)(at + 2 * kt_bytes(f))};
    return k;
}

static query_side query_side_of(const backward_job *job, size_t block) {
    const shape16 *f = &job->f;
    uint8_t *at = job->queries + block * query_side_bytes(f);
    query_side q;
    q.qn = (uint16_t *)at;
    q.dOn = (uint16_t *)(at += rows_bytes(f));
    q.qi = (uint32_t *)(at += rows_bytes(f));
    q.dOi = (uint32_t *)(at += pairs_bytes(f));
    q.lse = (float *)(at += pairs_bytes(f));
    q.delta = (float *)(at + lines(BR * 4));
    return q;
}

static void pack_backward_keys(void *arg, size_t begin, size_t end) {
    const backward_job *job = arg;
    const shape16 *f = &job->f;
    const attn_attention_problem *p = f->p;
    for (size_t item = begin; item < end; item++) {
        size_t kb = item % f->k_blocks, rest = item / f->k_blocks;
        size_t kvh = rest % p->kv_heads, b = rest / p->kv_heads;
        attn_attention_seq seq = attn_attention_seq_of(p, b);
        size_t j0 = kb * BC, cols = j0 < seq.kv_len ? min_size(seq.kv_len - j0, BC) : 0;
        size_t j = cols ? j0 : 0;
        key_side ks = key_side_of(job, item);
        const uint16_t *k = job->t->k + row_at(p->k.st, b, &seq, true, kvh, j);
        const uint16_t *v = job->t->v + row_at(p->v.st, b, &seq, true, kvh, j);
        pack_transposed(f, k, p->k.st.t, cols, (uint32_t *)ks.kt);
        pack_transposed(f, v, p->v.st.t, cols, (uint32_t *)ks.vt);
        pack_pairs(f, k, p->k.st.t, cols, BC, (uint32_t *)ks.ki);
    }
}

static void pack_backward_queries(void *arg, size_t begin, size_t end) {
    const backward_job *job = arg;
    const shape16 *f = &job->f;
    const attn_attention_problem *p = f->p;
    const attn_flash16_tensors *t = job->t;
    for (size_t item = begin; item < end; item++) {
        size_t qb = item % f->q_blocks, rest = item / f->q_blocks;
        size_t h = rest % p->q_heads, b = rest / p->q_heads;
        attn_attention_seq seq = attn_attention_seq_of(p, b);
        size_t i0 = qb * BR, rows = i0 < seq.q_len ? min_size(seq.q_len - i0, BR) : 0;
        size_t i = rows ? i0 : 0;
        query_side qs = query_side_of(job, item);
        size_t q_at = row_at(p->q.st, b, &seq, false, h, i);
        size_t o_at = row_at(p->out.st, b, &seq, false, h, i);
        pack_rows(f, t->q + q_at, p->q.st.t, rows, qs.qn);
        pack_rows(f, t->dout + o_at, p->out.st.t, rows, qs.dOn);
        pack_pairs(f, t->q + q_at, p->q.st.t, rows, BR, qs.qi);
        pack_pairs(f, t->dout + o_at, p->out.st.t, rows, BR, qs.dOi);
        query_stats(p, t, b, h, i0, rows, BR, o_at, qs.lse, qs.delta);
    }
}

/* P = exp(s scale - lse) and dS = P (dP - delta) of rows [r0, r0 + RG) of
 * query block qs (rows br) against the key block ks at j0; zero where
 * masked and for rows past the block or that see no key. With peaks, each
 * row's sums for the consistent delta (and resid's lanes) take the tile
 * (attention.h). */
static inline void gradient_tile(const shape16 *f, const query_side *qs, const key_side *ks,
                                 const rows16 *br, size_t r0, size_t j0, vec P[RG][NV],
                                 vec dS[RG][NV], attn_row_peak *peaks, __m512 *resid) {
    score_tile(qs->qn + r0 * f->DQ, f->DQ, ks->kt, f->D2, P);
    if (!tile_seen_whole(br, j0)) mask_tile(br, r0, j0, P);
    score_tile(qs->dOn + r0 * f->DQ, f->DQ, ks->vt, f->D2, dS);
    vec scale = _mm512_set1_ps(f->p->scale), log2e = _mm512_set1_ps((float)LOG2E);
    for (int r = 0; r < RG; r++) {
        size_t row = r0 + (size_t)r;
        float lse = qs->lse[row];
        if (row >= br->rows || lse == -INFINITY) {
            for (int v = 0; v < NV; v++) P[r][v] = dS[r][v] = _mm512_setzero_ps();
            continue;
        }
        vec neg_lse = _mm512_set1_ps(-lse), delta = _mm512_set1_ps(qs->delta[row]);
        /* the exponent's fma first: its rounding is relative to the
         * (small) result, not to the score's size */
        for (int v = 0; v < NV; v++)
            P[r][v] = v_exp2(_mm512_mul_ps(_mm512_fmadd_ps(P[r][v], scale, neg_lse), log2e));
        /* a softmax over one key is constant: its dS is exactly zero */
        bool single = br->end[row] - br->begin[row] == 1;
        for (int v = 0; v < NV; v++)
            dS[r][v] = single ? _mm512_setzero_ps()
                              : _mm512_mul_ps(P[r][v], _mm512_sub_ps(dS[r][v], delta));
        if (peaks) row_peak_add(P[r], dS[r], NV, j0, peaks + row, resid + row);
    }
}

/* The rows of seq that see keys [j0, j1) within query block i0 (rows
 * long), as [*lo, *hi) of the block. */
static void block_rows_seeing(size_t i_lo, size_t i_hi, size_t i0, size_t rows, size_t *lo,
                              size_t *hi) {
    *lo = i_lo > i0 ? i_lo - i0 : 0;
    *hi = i_hi < i0 + rows ? i_hi - i0 : rows;
}

/* Pass A: one (batch, KV head, key block): dk, dv summed over the query
 * blocks that see the keys and the group's heads, in a fixed order. */
static void backward_keys(void *arg, size_t part, size_t item) {
    const backward_job *job = arg;
    const shape16 *f = &job->f;
    const attn_attention_problem *p = f->p;
    size_t kb = item % f->k_blocks, rest = item / f->k_blocks;
    size_t kvh = rest % p->kv_heads, b = rest / p->kv_heads, DV = f->DV;
    attn_attention_seq seq = attn_attention_seq_of(p, b);
    size_t j0 = kb * BC;
    if (j0 >= seq.kv_len) return; /* past this sequence's keys */
    size_t cols = min_size(seq.kv_len - j0, BC);
    key_side ks = key_side_of(job, item);
    uint8_t *at = job->parts + part * job->part_bytes;
    float *dk = (float *)at, *dv = (float *)(at + lines(BC * DV * 4));
    uint32_t *Ai = (uint32_t *)(at + 2 * lines(BC * DV * 4));
    uint32_t *dSi = (uint32_t *)((uint8_t *)Ai + lines(BR / 2 * BC * 4));
    memset(dk, 0, BC * DV * sizeof *dk);
    memset(dv, 0, BC * DV * sizeof *dv);
    size_t i_lo, i_hi;
    rows_seeing(p, &seq, j0, j0 + cols, &i_lo, &i_hi);
    rows16 br;
    for (size_t qb = i_lo / BR; qb * BR < i_hi; qb++) {
        size_t i0 = qb * BR, rows = min_size(seq.q_len - i0, BR), lo, hi;
        rows_of(p, &seq, i0, rows, &br);
        block_rows_seeing(i_lo, i_hi, i0, rows, &lo, &hi);
        for (size_t g = 0; g < f->G; g++) {
            size_t h = kvh * f->G + g;
            query_side qs = query_side_of(job, (b * p->q_heads + h) * f->q_blocks + qb);
            for (size_t r0 = lo / RG * RG; r0 < hi; r0 += RG) {
                uint32_t *A_r = Ai + r0 / 2 * BC, *dS_r = dSi + r0 / 2 * BC;
                size_t c0, c1;
                group_cols(&br, r0, j0, &c0, &c1);
                if (c0 == c1) {
                    memset(A_r, 0, RG / 2 * BC * sizeof *A_r);
                    memset(dS_r, 0, RG / 2 * BC * sizeof *dS_r);
                    continue;
                }
                vec P[RG][NV], dS[RG][NV];
                gradient_tile(f, &qs, &ks, &br, r0, j0, P, dS, NULL, NULL);
                for (int r = 0; r < RG; r += 2)
                    for (int v = 0; v < NV; v++) {
                        _mm512_storeu_si512(A_r + r / 2 * BC + v * VW, bf16_interleave(P[r][v], P[r + 1][v]));
                        _mm512_storeu_si512(dS_r + r / 2 * BC + v * VW, bf16_interleave(dS[r][v], dS[r + 1][v]));
                    }
            }
            accumulate_keys(dv, DV, Ai, qs.dOi, lo / 2, (hi + 1) / 2, cols); /* dv += P^T dO */
            accumulate_keys(dk, DV, dSi, qs.qi, lo / 2, (hi + 1) / 2, cols); /* dk += dS^T q */
        }
    }
    store_key_grads(p, job->t->dk, job->t->dv, b, &seq, kvh, j0, cols, dk, dv, DV);
}

/* Pass B: one (batch, query head, query block): dq over the key blocks its
 * rows see; rows nearly one-hot take the consistent delta, and leave it in
 * the packed rows for pass A. */
static void backward_queries(void *arg, size_t part, size_t item) {
    const backward_job *job = arg;
    const shape16 *f = &job->f;
    const attn_attention_problem *p = f->p;
    size_t qb = f->q_blocks - 1 - item % f->q_blocks, rest = item / f->q_blocks; /* heavy first */
    size_t h = rest % p->q_heads, b = rest / p->q_heads, kvh = h / f->G, DV = f->DV;
    attn_attention_seq seq = attn_attention_seq_of(p, b);
    size_t i0 = qb * BR;
    if (i0 >= seq.q_len) return;
    size_t rows = min_size(seq.q_len - i0, BR);
    query_side qs = query_side_of(job, (b * p->q_heads + h) * f->q_blocks + qb);
    uint8_t *at = job->parts + part * job->part_bytes;
    float *dq = (float *)at;
    uint32_t *dSn = (uint32_t *)(at + lines(BR * DV * 4));
    memset(dq, 0, BR * DV * sizeof *dq);
    rows16 br;
    rows_of(p, &seq, i0, rows, &br);
    size_t block0 = (b * p->kv_heads + kvh) * f->k_blocks;
    attn_row_peak peaks[BR] = {{0}};
    __m512 resid[BR]; /* each row's sum of dS, in lanes */
    for (size_t r = 0; r < BR; r++) resid[r] = _mm512_setzero_ps();
    bool consistent = attn_consistent_delta(p);
    for (size_t kb = br.first / BC; kb * BC < br.last; kb++) {
        size_t j0 = kb * BC;
        key_side ks = key_side_of(job, block0 + kb);
        for (size_t r0 = 0; r0 < rows; r0 += RG) {
            size_t c0, c1;
            group_cols(&br, r0, j0, &c0, &c1);
            if (c0 == c1) continue;
            vec P[RG][NV], dS[RG][NV];
            gradient_tile(f, &qs, &ks, &br, r0, j0, P, dS, consistent ? peaks : NULL, resid);
            for (int r = 0; r < RG; r++) {
                _mm512_storeu_si512(dSn + r * (BC / 2), bf16_pack(dS[r][0], dS[r][1]));
                _mm512_storeu_si512(dSn + r * (BC / 2) + VW, bf16_pack(dS[r][2], dS[r][3]));
            }
            apply_pairs(dq + r0 * DV, DV, NULL, dSn, c0 / 2, (c1 + 1) / 2, ks.ki); /* dq += dS k */
        }
    }
    for (size_t r = 0; r < rows && consistent; r++)
        take_consistent_delta(p, job->t->k, b, &seq, kvh, peaks + r, resid[r], qs.delta + r,
                              dq + r * DV);
    uint16_t *dq_out = job->t->dq + row_at(p->q.st, b, &seq, false, h, i0);
    for (size_t r = 0; r < rows; r++)
        for (size_t d = 0; d < f->D; d++)
            dq_out[r * p->q.st.t + d] = attn_float_to_bf16(dq[r * DV + d] * p->scale);
}

void attn_flash16_backward(attn_workers w, const attn_attention_problem *p,
                           const attn_flash16_tensors *t, void *workspace) {
    backward_job job = {.f = shape_of(p), .t = t};
    size_t keys = key_blocks(&job.f), queries = query_blocks(&job.f);
    job.keys = workspace;
    job.queries = job.keys + keys * key_side_bytes(&job.f);
    job.parts = job.queries + queries * query_side_bytes(&job.f);
    job.part_bytes = backward_part_bytes(&job.f);
    attn_pool_for(w.pool, w.threads, keys, 4, pack_backward_keys, &job);
    attn_pool_for(w.pool, w.threads, queries, 4, pack_backward_queries, &job);
    /* B first: it leaves the consistent delta of nearly one-hot rows for A */
    attn_pool_dynamic(w.pool, w.threads, queries, backward_queries, &job);
    attn_pool_dynamic(w.pool, w.threads, keys, backward_keys, &job);
}

/* ---- the values' scan (sdpa16.c) --------------------------------------------- */

uint16_t attn_flash16_max_magnitude(const uint16_t *x, size_t rows, size_t stride, size_t width) {
    const __m512i magnitude = _mm512_set1_epi16(0x7FFF);
    __m512i top = _mm512_setzero_si512();
    for (size_t r = 0; r < rows; r++)
        for (size_t d0 = 0; d0 < width; d0 += 32) {
            size_t n = min_size(width - d0, 32);
            __mmask32 in = n == 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << n) - 1u);
            __m512i v = _mm512_maskz_loadu_epi16(in, x + r * stride + d0);
            top = _mm512_max_epu16(top, _mm512_and_si512(v, magnitude));
        }
    _Alignas(64) uint16_t lanes[32];
    _mm512_store_si512(lanes, top);
    uint16_t largest = 0;
    for (int i = 0; i < 32; i++) largest = lanes[i] > largest ? lanes[i] : largest;
    return largest;
}

const attn_flash16_kernels attn_flash16_dot_kernels = {
    .name = "vdpbf16ps",
    .declines = NULL,
    .forward_bytes = attn_flash16_forward_bytes,
    .backward_bytes = attn_flash16_backward_bytes,
    .forward = attn_flash16_forward,
    .backward = attn_flash16_backward,
};
