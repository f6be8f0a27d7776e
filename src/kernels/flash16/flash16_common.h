/*
 * flash16_common.h — what the bf16 fused kernels share, whatever their
 * tiles (vdpbf16ps registers, flash16_avx512bf16.c; AMX tiles,
 * flash16_amx.c): the exponent, the bf16 rounding, which keys each query
 * row sees, and workspace arithmetic. Static inline, for files compiled
 * with -mavx512f at least.
 */
#ifndef ATTN_FLASH16_COMMON_H
#define ATTN_FLASH16_COMMON_H

#include <immintrin.h>

#include "half.h"
#include "kernels/flash16/flash16.h"
#include "kernels/vec/vec_avx512.h" /* v_exp2, as the float kernels' */

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define FLASH16_MAX_ROWS 64 /* query rows of the largest block */
#define FLASH16_LOG2E 1.4426950408889634

static inline size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* Row i of head h of a sequence in a (B, T, H, D) view. */
static inline size_t row_at(attn_view_strides st, size_t b, const attn_attention_seq *seq,
                            bool keys, size_t h, size_t i) {
    return attn_view_offset(st, b, keys ? seq->kv_start : seq->q_start, h, i);
}

/* 32 bf16 (n of them, the rest 0) as two vectors of floats. */
static inline void bf16_floats(const uint16_t *x, size_t n, __m512 f[2]) {
    __mmask32 in = n >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << n) - 1u);
    __m512i bits = _mm512_maskz_loadu_epi16(in, x);
    __m256i half[2] = {_mm512_castsi512_si256(bits), _mm512_extracti64x4_epi64(bits, 1)};
    for (int k = 0; k < 2; k++)
        f[k] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half[k]), 16));
}

/* dO . o in double: each product of two bf16 values is exact in float (8
 * significant bits each), summed in double 8 lanes a vector and reduced
 * once: a product at a time into one double would wait on every add. */
static inline float dot_bf16(const uint16_t *dO, const uint16_t *o, size_t n) {
    __m512d sum[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(),
                      _mm512_setzero_pd()};
    for (size_t d = 0; d < n; d += 32) {
        __m512 a[2], b[2];
        bf16_floats(dO + d, n - d, a);
        bf16_floats(o + d, n - d, b);
        for (int k = 0; k < 2; k++) {
            __m512 x = _mm512_mul_ps(a[k], b[k]);
            __m256 low = _mm512_castps512_ps256(x);
            __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
            sum[2 * k] = _mm512_add_pd(sum[2 * k], _mm512_cvtps_pd(low));
            sum[2 * k + 1] = _mm512_add_pd(sum[2 * k + 1], _mm512_cvtps_pd(high));
        }
    }
    __m512d all = _mm512_add_pd(_mm512_add_pd(sum[0], sum[1]), _mm512_add_pd(sum[2], sum[3]));
    return (float)_mm512_reduce_add_pd(all);
}

/* lse and delta = dO . O (dot_bf16) of the rows [i0, i0 + rows) of (b, h),
 * whose dO and saved O start at o_at; -inf and 0 for the rows of the
 * block (n of them) past those. */
static inline void query_stats(const attn_attention_problem *p, const attn_flash16_tensors *t,
                               size_t b, size_t h, size_t i0, size_t rows, size_t n,
                               size_t o_at, float *lse, float *delta) {
    for (size_t r = 0; r < n; r++) {
        lse[r] = -INFINITY;
        delta[r] = 0.0f;
        if (r >= rows) continue;
        lse[r] = t->saved_lse[attn_lse_index(p, b, h, i0 + r)];
        size_t at = o_at + r * p->out.st.t;
        delta[r] = dot_bf16(t->dout + at, t->saved_out + at, p->head_dim);
    }
}

/* A row's tile of n vectors of P and dS (keys from j0) added to its sums
 * for the consistent delta (attention.h; no softcap here: factor 1): sum_j
 * dS_ij in the lanes of *resid (reduced once, take_consistent_delta), the
 * largest weight and its key only once past ATTN_ONE_HOT_WEIGHT. */
static inline void row_peak_add(const __m512 *P, const __m512 *dS, int n, size_t j0,
                                attn_row_peak *pk, __m512 *resid) {
    __m512 sum = dS[0], top = P[0];
    for (int v = 1; v < n; v++) {
        sum = _mm512_add_ps(sum, dS[v]);
        top = _mm512_max_ps(top, P[v]);
    }
    *resid = _mm512_add_ps(*resid, sum);
    float floor = pk->weight > ATTN_ONE_HOT_WEIGHT ? pk->weight : ATTN_ONE_HOT_WEIGHT;
    if (_mm512_cmp_ps_mask(top, _mm512_set1_ps(floor), _CMP_GT_OQ)) {
        float most = _mm512_reduce_max_ps(top);
        _Alignas(64) float lanes[64]; /* n <= 4 vectors */
        for (int v = 0; v < n; v++) _mm512_store_ps(lanes + 16 * v, P[v]);
        size_t c = 0;
        while (c + 1 < (size_t)(16 * n) && lanes[c] != most) c++;
        *pk = (attn_row_peak){most, 1.0f, (uint32_t)(j0 + c)};
    }
}

/* After pass B's sweep of a row of head kvh's group: where its largest
 * weight passes ATTN_ONE_HOT_WEIGHT, the consistent delta (attention.h):
 * dq_row (dq's unscaled float sums) -= c k_j*, c = resid P_ij* (resid the
 * sum of its lanes), and the row's packed delta grows by resid, for pass A. */
static inline void take_consistent_delta(const attn_attention_problem *p, const uint16_t *k_all,
                                         size_t b, const attn_attention_seq *seq, size_t kvh,
                                         const attn_row_peak *pk, __m512 resid_lanes, float *delta,
                                         float *dq_row) {
    if (!(pk->weight > ATTN_ONE_HOT_WEIGHT)) return;
    float resid = _mm512_reduce_add_ps(resid_lanes);
    if (resid == 0.0f) return;
    float c = resid * pk->weight;
    const uint16_t *k = k_all + row_at(p->k.st, b, seq, true, kvh, pk->key);
    for (size_t d = 0; d < p->head_dim; d++) dq_row[d] -= c * attn_bf16_to_float(k[d]);
    *delta = (float)((double)*delta + resid);
}

/* dk (times scale) and dv of the keys [j0, j0 + cols) of (b, kvh), from
 * float sums with row stride ld, rounded to bf16 into the gradients. */
static inline void store_key_grads(const attn_attention_problem *p, uint16_t *dk_all,
                                   uint16_t *dv_all, size_t b, const attn_attention_seq *seq,
                                   size_t kvh, size_t j0, size_t cols, const float *dk,
                                   const float *dv, size_t ld) {
    uint16_t *dk_out = dk_all + row_at(p->k.st, b, seq, true, kvh, j0);
    uint16_t *dv_out = dv_all + row_at(p->v.st, b, seq, true, kvh, j0);
    for (size_t j = 0; j < cols; j++)
        for (size_t d = 0; d < p->head_dim; d++) {
            dk_out[j * p->k.st.t + d] = attn_float_to_bf16(dk[j * ld + d] * p->scale);
            dv_out[j * p->v.st.t + d] = attn_float_to_bf16(dv[j * ld + d]);
        }
}

/* Rows [i0, i0 + rows) of a query block: the keys [begin, end) each sees
 * (0, 0 when none, and past rows), their union [first, last), and the keys
 * [all_from, all_to) every row sees. */
typedef struct rows16 {
    size_t rows;
    size_t begin[FLASH16_MAX_ROWS], end[FLASH16_MAX_ROWS];
    size_t first, last, all_from, all_to;
} rows16;

static inline void rows_of(const attn_attention_problem *p, const attn_attention_seq *s,
                           size_t i0, size_t rows, rows16 *br) {
    br->rows = rows;
    br->first = s->kv_len;
    br->last = 0;
    for (size_t r = 0; r < FLASH16_MAX_ROWS; r++) {
        size_t lo = 0, hi = 0;
        if (r < rows) attn_visible_keys(p, s, i0 + r, &lo, &hi);
        if (lo >= hi) lo = hi = 0;
        br->begin[r] = lo;
        br->end[r] = hi;
        if (lo < hi) {
            br->first = lo < br->first ? lo : br->first;
            br->last = hi > br->last ? hi : br->last;
        }
    }
    if (br->first >= br->last) br->first = br->last = 0;
    /* both ends grow with the row: the last row's begin, the first's end */
    br->all_from = br->begin[rows - 1];
    br->all_to = br->end[0];
    for (size_t r = 0; r < rows; r++)
        if (br->begin[r] >= br->end[r]) br->all_from = br->all_to = 0;
}

/* Whether every row of br sees all keys [j0, j0 + width). */
static inline bool keys_seen_whole(const rows16 *br, size_t j0, size_t width) {
    return j0 >= br->all_from && j0 + width <= br->all_to;
}

/* The query rows [*lo, *hi) of a sequence that see some key of [j0, j1):
 * both ends of every row's keys grow with i, so a binary search on each. */
static inline void rows_seeing(const attn_attention_problem *p, const attn_attention_seq *seq,
                               size_t j0, size_t j1, size_t *lo, size_t *hi) {
    size_t a = 0, z = seq->q_len, kb, ke;
    while (a < z) {
        size_t mid = a + (z - a) / 2;
        attn_visible_keys(p, seq, mid, &kb, &ke);
        if (ke > j0) z = mid;
        else a = mid + 1;
    }
    *lo = a;
    z = seq->q_len;
    while (a < z) {
        size_t mid = a + (z - a) / 2;
        attn_visible_keys(p, seq, mid, &kb, &ke);
        if (kb >= j1) z = mid;
        else a = mid + 1;
    }
    *hi = a;
}

/* ---- workspace arithmetic: SIZE_MAX on overflow (an allocation that fails) */

static inline size_t mul_or_max(size_t a, size_t b) {
    size_t n;
    return attn_mul_size(a, b, &n) ? n : (size_t)-1;
}

static inline size_t add_or_max(size_t a, size_t b) {
    size_t n;
    return attn_add_size(a, b, &n) ? n : (size_t)-1;
}

/* Bytes rounded up to whole cache lines. */
static inline size_t lines(size_t bytes) {
    return bytes > (size_t)-1 - 63 ? (size_t)-1 : (bytes + 63) / 64 * 64;
}

#endif /* ATTN_FLASH16_COMMON_H */
