/*
 * flash16_amx.c — the bf16 fused attention of flash16.h, forward and
 * backward, on AMX tiles (amx_bf16, amx_tile: Sapphire Rapids and later),
 * the softmax on AVX-512. Blocks of 32 query rows x 32 keys; each product
 * in four 16 x 16 float tiles, tdpbf16ps over its reduction in steps of 32
 * bf16 (A: 16 rows x 32 bf16; B: 16 pairs x 16 columns x 2, the pairs of
 * the reduction interleaved). The forward (below) works in keys x rows, so
 * that the online softmax runs down columns of 16 rows a vector; the
 * backward as its header says.
 *
 * tdpbf16ps sums each element's products pair by pair in float (even
 * element, then odd, each rounded; bf16 denormals read as zero): the sums
 * of vdpbf16ps in another order of each pair's halves. The softmax, the
 * gradients and their bf16 roundings are flash16_avx512bf16.c's formulas,
 * so the results agree with that file's up to the rounding of the sums
 * (and the forward's lazy rescale), and have the same bits for any thread
 * count (each output is one item's, summed in a fixed order).
 *
 * Takes head_dim a multiple of 32 (64 and 128: whole tile steps, no
 * padding); the rest stays on the vdpbf16ps kernels.
 *
 * The tiles need the process's permission from Linux (ARCH_REQ_XCOMP_PERM,
 * which the application asks for with attn_cpu_request_amx;
 * attn_cpu_amx_bf16_usable only reads it): call these only where
 * attn_ctx_amx_usable says so and amx_declines does not. Each item loads
 * the tile configuration and releases the tiles, so no state outlives it.
 * Compiled with -mavx512f -mavx512bw -mavx512bf16 -mamx-tile -mamx-bf16.
 */
#include <immintrin.h>

#include "cpu_info.h"
#include "kernels/amx_tiles.h"
#include "kernels/flash16/flash16_common.h"
#include "kernels/gemm/transpose16_avx512.h"
#include "parallel.h"

#include <math.h>
#include <string.h>

#define BR 32 /* query rows of a block: two tiles of 16 */
#define BC 32 /* keys of a block: two tiles of 16 in S, one A tile of P */
#define KU 32 /* values of d a tile step */
#define TR 16 /* rows of a tile */

/* Steps of 32 (query rows in the backward's pass A, keys in its pass B and
 * in the forward) that an accumulation takes between a load and a store of
 * its C tiles. With one step a call (the tiles loaded, multiplied once,
 * stored), each call waits for the last one's stores to reach the cache;
 * 4 steps a call pay that wait a quarter as often, the same bits, and 8
 * gain nothing more. */
#define STEPS 4

_Static_assert(BR <= FLASH16_MAX_ROWS, "rows16 holds a query block");

/* Tiles: 0-3 C (rows 0-15 / 16-31 x columns 0-15 / 16-31 of a 32 x 32
 * product), 4-5 A (rows 0-15 / 16-31), 6-7 B (columns 0-15 / 16-31).
 * Literal numbers: the intrinsics paste them into the instructions. */
#define C00 0
#define C01 1
#define C10 2
#define C11 3
#define A0 4
#define A1 5
#define B0 6
#define B1 7


/* The four C tiles into c (32 x 32 floats, rows of 128 bytes). */
static inline void store_product(float *c) {
    _tile_stored(C00, c, BC * 4);
    _tile_stored(C01, c + TR, BC * 4);
    _tile_stored(C10, c + TR * BC, BC * 4);
    _tile_stored(C11, c + TR * BC + TR, BC * 4);
}

static inline void multiply_2x2(void) {
    _tile_dpbf16ps(C00, A0, B0);
    _tile_dpbf16ps(C01, A0, B1);
    _tile_dpbf16ps(C10, A1, B0);
    _tile_dpbf16ps(C11, A1, B1);
}

static inline void zero_product(void) {
    _tile_zero(C00);
    _tile_zero(C01);
    _tile_zero(C10);
    _tile_zero(C11);
}

/* ---- geometry and workspace --------------------------------------------------- */

typedef struct amx_shape {
    const attn_attention_problem *p;
    size_t D, G, q_blocks, k_blocks;
    float c; /* scale * log2 e */
} amx_shape;

static amx_shape shape_of(const attn_attention_problem *p) {
    amx_shape f = {.p = p, .D = p->head_dim};
    f.G = p->q_heads / p->kv_heads;
    f.q_blocks = (p->q_len + BR - 1) / BR;
    f.k_blocks = (p->kv_len + BC - 1) / BC;
    f.c = (float)(p->scale * FLASH16_LOG2E);
    return f;
}

/* Per (batch, KV head, key block): K^T in pairs along d, (D / 2, BC) of 32
 * bits, and V in pairs of keys, (BC / 2, D) of 32 bits: D BC 2 bytes each. */
static size_t key_block_bytes(const amx_shape *f) { return lines(f->D * BC * 2); }
static size_t key_blocks(const amx_shape *f) {
    return mul_or_max(mul_or_max(f->p->batch, f->p->kv_heads), f->k_blocks);
}
static size_t query_blocks(const amx_shape *f) {
    return mul_or_max(mul_or_max(f->p->batch, f->p->q_heads), f->q_blocks);
}

static const char *amx_declines(const attn_attention_problem *p) {
    return p->head_dim % KU == 0 ? NULL : "head_dim is not a multiple of 32 (AMX's step)";
}

/* ---- packing (once per call, O((T + S) D)) ---------------------------------- */

/* kt (D / 2, BC) = keys [0, cols) of k (rows of stride ld) in pairs along
 * d, zero past cols: per 16 keys and 32 values of d, the 16 x 16 block of
 * pairs transposed. A B tile is 16 rows of it at 64-byte column 0 or 1. */
static void pack_keys(size_t D, const uint16_t *k, size_t ld, size_t cols, uint32_t *kt) {
    for (size_t j0 = 0; j0 < BC; j0 += TR)
        for (size_t d0 = 0; d0 < D; d0 += KU) {
            __m512 r[TR];
            for (size_t j = 0; j < TR; j++)
                r[j] = j0 + j < cols ? _mm512_loadu_ps(k + (j0 + j) * ld + d0)
                                     : _mm512_setzero_ps();
            attn_transpose16(r);
            for (size_t p2 = 0; p2 < TR; p2++)
                _mm512_storeu_ps(kt + (d0 / 2 + p2) * BC + j0, r[attn_transpose16_order[p2]]);
        }
}

/* vi (BC / 2, D) = rows [0, cols) of v (stride ld) two by two, interleaved
 * in each 32-bit lane (row 2j low, 2j + 1 high), zero past cols. */
static void pack_values(size_t D, const uint16_t *v, size_t ld, size_t cols, uint32_t *vi) {
    const __m512i low = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                         40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                         32, 0);
    const __m512i high = _mm512_add_epi16(low, _mm512_set1_epi16(16));
    for (size_t jp = 0; jp < BC / 2; jp++)
        for (size_t d0 = 0; d0 < D; d0 += KU) {
            size_t j = 2 * jp;
            __m512i even = j < cols ? _mm512_loadu_si512(v + j * ld + d0) : _mm512_setzero_si512();
            __m512i odd = j + 1 < cols ? _mm512_loadu_si512(v + (j + 1) * ld + d0)
                                       : _mm512_setzero_si512();
            _mm512_storeu_si512(vi + jp * D + d0, _mm512_permutex2var_epi16(even, low, odd));
            _mm512_storeu_si512(vi + jp * D + d0 + TR, _mm512_permutex2var_epi16(even, high, odd));
        }
}

/* xn (32, D) = rows [0, count) of x (stride ld), zero after. */
static void pack_rows(size_t D, const uint16_t *x, size_t ld, size_t count, uint16_t *xn) {
    memset(xn, 0, BR * D * sizeof *xn);
    for (size_t r = 0; r < count; r++) memcpy(xn + r * D, x + r * ld, D * sizeof *xn);
}

/* s (32, 32) = x (32 rows of D bf16, stride ldx elements) @ kt (D / 2
 * pairs x 32, from pack_keys): S, dP and their transposes. */
static inline void score_tiles(size_t D, const uint16_t *q, size_t ldq, const uint32_t *kt,
                               float *s) {
    zero_product();
    for (size_t d0 = 0; d0 < D; d0 += KU) {
        _tile_loadd(A0, q + d0, ldq * 2);
        _tile_loadd(A1, q + TR * ldq + d0, ldq * 2);
        _tile_loadd(B0, kt + d0 / 2 * BC, BC * 4);
        _tile_loadd(B1, kt + d0 / 2 * BC + TR, BC * 4);
        multiply_2x2();
    }
    store_product(s);
}

/* -inf outside row r's visible keys in the block at j0 (s: its BC scores). */
static inline void mask_row(const rows16 *br, size_t r, size_t j0, __m512 s[2]) {
    size_t lo = r < br->rows ? br->begin[r] : 0, hi = r < br->rows ? br->end[r] : 0;
    size_t a = lo > j0 ? min_size(lo - j0, BC) : 0, z = hi > j0 ? min_size(hi - j0, BC) : 0;
    if (a == 0 && z == BC) return;
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int v = 0; v < 2; v++) {
        __m512i key = _mm512_add_epi32(lane, _mm512_set1_epi32(v * 16));
        __mmask16 keep = _mm512_cmp_epi32_mask(key, _mm512_set1_epi32((int)a), _MM_CMPINT_NLT) &
                         _mm512_cmp_epi32_mask(key, _mm512_set1_epi32((int)z), _MM_CMPINT_LT);
        s[v] = _mm512_mask_blend_ps(keep, _mm512_set1_ps(-INFINITY), s[v]);
    }
}

/* ---- forward ------------------------------------------------------------------- */

/*
 * In keys x rows, so that the softmax runs down columns: a vector holds 16
 * query rows of one key, and each row's max, sum and rescale are vector
 * operations, with no sums across lanes:
 *
 *   S^T (32, 32) = K Q^T     A = K rows (in place, a short block padded),
 *                            B = Q^T in pairs along d (packed per item);
 *   P^T = 2^fma(s, c, -M)    M, l, alpha: vectors of 16 rows;
 *   O^T (D, 32) = O^T alpha + V^T P^T
 *                            A = V^T in pairs of keys (packed once),
 *                            B = P^T in pairs of keys (two keys' vectors
 *                            interleaved), stored, added on AVX-512.
 */
typedef struct forward_job {
    amx_shape f;
    const attn_flash16_tensors *t;
    uint8_t *keys; /* per key block (b, kvh, kb): K rows, then V^T in pairs of keys */
    uint8_t *parts;
    size_t part_bytes;
} forward_job;

static const uint16_t *key_rows(const forward_job *job, size_t block) {
    return (const uint16_t *)(job->keys + 2 * block * key_block_bytes(&job->f));
}
static const uint32_t *values_transposed(const forward_job *job, size_t block) {
    return (const uint32_t *)(job->keys + (2 * block + 1) * key_block_bytes(&job->f));
}

/* vt (D, BC / 2) = V^T in pairs of keys: vi (BC / 2, D) from pack_values,
 * transposed 16 x 16 at a time. An A tile is 16 rows of it. */
static void pack_values_transposed(size_t D, const uint32_t *vi, uint32_t *vt) {
    for (size_t d0 = 0; d0 < D; d0 += TR) {
        __m512 r[TR];
        for (size_t jp = 0; jp < TR; jp++) r[jp] = _mm512_loadu_ps(vi + jp * D + d0);
        attn_transpose16(r);
        for (size_t d = 0; d < TR; d++)
            _mm512_storeu_ps(vt + (d0 + d) * (BC / 2), r[attn_transpose16_order[d]]);
    }
}

/* Per part: Q^T in pairs along d (D / 2, BR), whose bytes the packing
 * first uses for V in pairs of keys (BC / 2, D); O^T (D, BR) floats; M, l
 * (BR); S^T of two blocks (32 x 32 floats each); the P V product (D, BR)
 * floats; P^T in pairs of keys (BC / 2, BR) of STEPS blocks. */
static size_t forward_part_bytes(const amx_shape *f) {
    return lines(BR * f->D * 2) + 2 * lines(BR * f->D * 4) + 2 * lines(BR * 4) +
           2 * lines(BR * BC * 4) + STEPS * lines(BR * BC * 2);
}

size_t attn_flash16_amx_forward_bytes(const attn_attention_problem *p, size_t threads) {
    amx_shape f = shape_of(p);
    size_t keys = mul_or_max(key_blocks(&f), mul_or_max(2, key_block_bytes(&f)));
    return add_or_max(keys, mul_or_max(attn_parallel_parts(threads), forward_part_bytes(&f)));
}

static void pack_forward_keys(void *arg, size_t part, size_t begin, size_t end) {
    const forward_job *job = arg;
    const amx_shape *f = &job->f;
    const attn_attention_problem *p = f->p;
    uint32_t *vi = (uint32_t *)(job->parts + part * job->part_bytes); /* Q^T's bytes */
    for (size_t item = begin; item < end; item++) {
        size_t kb = item % f->k_blocks, rest = item / f->k_blocks;
        size_t kvh = rest % p->kv_heads, b = rest / p->kv_heads;
        attn_attention_seq seq = attn_attention_seq_of(p, b);
        size_t j0 = kb * BC, cols = j0 < seq.kv_len ? min_size(seq.kv_len - j0, BC) : 0;
        size_t j = cols ? j0 : 0; /* (an empty block reads nothing) */
        pack_rows(f->D, job->t->k + row_at(p->k.st, b, &seq, true, kvh, j), p->k.st.t,
                  cols, (uint16_t *)key_rows(job, item));
        pack_values(f->D, job->t->v + row_at(p->v.st, b, &seq, true, kvh, j),
                    p->v.st.t, cols, vi);
        pack_values_transposed(f->D, vi, (uint32_t *)values_transposed(job, item));
    }
}

/* The keys [a, z) of a block at j0 that each query row of br sees, 16 rows
 * a vector (0, 0 for rows past br->rows). */
static void key_bounds(const rows16 *br, size_t j0, __m512i a[2], __m512i z[2]) {
    _Alignas(64) int32_t lo[BR], hi[BR];
    for (size_t r = 0; r < BR; r++) {
        size_t begin = r < br->rows ? br->begin[r] : 0, end = r < br->rows ? br->end[r] : 0;
        lo[r] = (int32_t)(begin > j0 ? min_size(begin - j0, BC) : 0);
        hi[r] = (int32_t)(end > j0 ? min_size(end - j0, BC) : 0);
    }
    for (int h = 0; h < 2; h++) {
        a[h] = _mm512_load_si512(lo + 16 * h);
        z[h] = _mm512_load_si512(hi + 16 * h);
    }
}

/* Which of 16 rows (bounds a, z) see key j. */
static inline __mmask16 rows_seeing_key(__m512i a, __m512i z, int j) {
    __m512i key = _mm512_set1_epi32(j);
    return _mm512_cmp_epi32_mask(key, a, _MM_CMPINT_NLT) &
           _mm512_cmp_epi32_mask(key, z, _MM_CMPINT_LT);
}

/* Two floats vectors as bf16 pairs: lane k holds (a[k], b[k]). */
static inline __m512i bf16_interleave(__m512 a, __m512 b) {
    const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                           24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                           16, 0);
    return _mm512_permutexvar_epi16(order, (__m512i)_mm512_cvtne2ps_pbh(b, a));
}

/* How far (log2) a row's max may pass its M before M moves: until then
 * the block's P are up to 2^8 and O, l keep their scale, so that O can
 * stay on the tiles (FlashAttention-3's lazy rescale). P's bf16 rounding
 * is relative, and out = O / l, lse = M + log2 l: the same values. */
#define LAZY_RESCALE 8.0f

/* The online softmax of one block's S^T (keys x rows), 16 rows a vector,
 * as flash16_avx512bf16.c's row by row: M = max(M, rowmax(s) c), once
 * rounded, where a row's max passes its M by more than LAZY_RESCALE (then
 * for every row), else M as it was (a row's first M: its max); P =
 * 2^fma(s, c, -M), into pt (BC / 2 pairs of keys, BR) bf16; l = l alpha +
 * sum(P) unrounded; alpha = 2^(M_old - M) (0 where M_old is -inf). Masked
 * scores are -inf: their P is 0. True when some M moved: O must then be
 * rescaled by alpha; else alpha is 1 (or O and l are still 0). */
static inline bool softmax_by_key(const rows16 *br, size_t j0, bool whole, float c,
                                  float *st, uint32_t *pt, float *m, float *l,
                                  __m512 alpha[2]) {
    __m512i a[2], z[2];
    if (!whole) key_bounds(br, j0, a, z);
    const __m512 minus_inf = _mm512_set1_ps(-INFINITY), vc = _mm512_set1_ps(c);
    __m512 m_old[2], top_c[2];
    __mmask16 had[2], passes = 0;
    for (int h = 0; h < 2; h++) {
        __m512 top = minus_inf;
        for (int j = 0; j < BC; j++) {
            float *s = st + j * BR + 16 * h;
            __m512 x = _mm512_loadu_ps(s);
            if (!whole) {
                x = _mm512_mask_blend_ps(rows_seeing_key(a[h], z[h], j), minus_inf, x);
                _mm512_storeu_ps(s, x);
            }
            top = _mm512_max_ps(top, x);
        }
        __mmask16 seen = _mm512_cmp_ps_mask(top, minus_inf, _CMP_NEQ_OQ);
        top_c[h] = _mm512_mask_mul_ps(minus_inf, seen, top, vc);
        m_old[h] = _mm512_loadu_ps(m + 16 * h);
        had[h] = _mm512_cmp_ps_mask(m_old[h], minus_inf, _CMP_NEQ_OQ);
        __m512 limit = _mm512_add_ps(m_old[h], _mm512_set1_ps(LAZY_RESCALE));
        passes |= had[h] & _mm512_cmp_ps_mask(top_c[h], limit, _CMP_GT_OQ);
    }
    bool rescale = passes != 0;
    for (int h = 0; h < 2; h++) {
        __m512 m_new = rescale ? _mm512_max_ps(m_old[h], top_c[h])
                               : _mm512_mask_blend_ps(had[h], top_c[h], m_old[h]);
        alpha[h] = rescale ? _mm512_maskz_mov_ps(had[h], v_exp2(_mm512_sub_ps(m_old[h], m_new)))
                           : _mm512_set1_ps(1.0f);
        /* a row with M still -inf: NaN exponents, which v_exp2 gives as 0 */
        __m512 neg_m = _mm512_sub_ps(_mm512_setzero_ps(), m_new), sum = _mm512_setzero_ps();
        for (int j = 0; j < BC; j += 2) {
            __m512 e0 = v_exp2(_mm512_fmadd_ps(_mm512_loadu_ps(st + j * BR + 16 * h), vc, neg_m));
            __m512 e1 = v_exp2(_mm512_fmadd_ps(_mm512_loadu_ps(st + (j + 1) * BR + 16 * h), vc,
                                               neg_m));
            sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
            _mm512_storeu_si512(pt + j / 2 * BR + 16 * h, bf16_interleave(e0, e1));
        }
        _mm512_storeu_ps(l + 16 * h, _mm512_fmadd_ps(_mm512_loadu_ps(l + 16 * h), alpha[h], sum));
        _mm512_storeu_ps(m + 16 * h, m_new);
    }
    return rescale;
}

/* Up to STEPS blocks of the forward's O += P V, gathered while no M moves:
 * vt (D, BC / 2 pairs) and pt (BC / 2 pairs, BR) of each. */
typedef struct value_steps {
    size_t n;
    const uint32_t *vt[STEPS], *pt[STEPS];
} value_steps;

/* ot (D, BR) += the sum over the gathered blocks of vt @ pt on the tiles,
 * 32 values of d at a time, the sums kept on the tiles over the blocks and
 * added in their order (the bits of one block a call); empties s. */
static inline void accumulate_by_key(size_t D, value_steps *s, float *ot) {
    for (size_t n0 = 0; n0 < D && s->n; n0 += 2 * TR) {
        float *o = ot + n0 * BR;
        _tile_loadd(C00, o, BR * 4);
        _tile_loadd(C01, o + TR, BR * 4);
        _tile_loadd(C10, o + TR * BR, BR * 4);
        _tile_loadd(C11, o + TR * BR + TR, BR * 4);
        for (size_t k = 0; k < s->n; k++) {
            _tile_loadd(B0, s->pt[k], BR * 4);
            _tile_loadd(B1, s->pt[k] + TR, BR * 4);
            _tile_loadd(A0, s->vt[k] + n0 * (BC / 2), BC * 2);
            _tile_loadd(A1, s->vt[k] + (n0 + TR) * (BC / 2), BC * 2);
            multiply_2x2();
        }
        store_product(o); /* (rows of BR == BC floats) */
    }
    s->n = 0;
}

/* pv (D, BR) = vt (D, BC / 2 pairs) @ pt (BC / 2 pairs, BR) in floats, 32
 * values of d at a time. */
static inline void product_by_key(size_t D, const uint32_t *vt, const uint32_t *pt, float *pv) {
    _tile_loadd(B0, pt, BR * 4);
    _tile_loadd(B1, pt + TR, BR * 4);
    for (size_t n0 = 0; n0 < D; n0 += 2 * TR) {
        zero_product();
        _tile_loadd(A0, vt + n0 * (BC / 2), BC * 2);
        _tile_loadd(A1, vt + (n0 + TR) * (BC / 2), BC * 2);
        multiply_2x2();
        store_product(pv + n0 * BR); /* (rows of BR == BC floats) */
    }
}

/* ot (D, BR) = ot alpha + pv: the rescale of FlashAttention's output. */
static inline void rescale_add(size_t D, const __m512 alpha[2], const float *pv, float *ot) {
    for (size_t d = 0; d < D; d++) {
        float *o_d = ot + d * BR;
        const float *pv_d = pv + d * BR;
        _mm512_storeu_ps(o_d, _mm512_fmadd_ps(_mm512_loadu_ps(o_d), alpha[0],
                                              _mm512_loadu_ps(pv_d)));
        _mm512_storeu_ps(o_d + TR, _mm512_fmadd_ps(_mm512_loadu_ps(o_d + TR), alpha[1],
                                                   _mm512_loadu_ps(pv_d + TR)));
    }
}

/* Rows [0, rows) of out (stride ld) = ot^T (D, BR) times inv per row,
 * rounded to bf16 (to nearest even: the values are finite), 16 x 16 at a
 * time transposed. */
static void write_rows(size_t D, const float *ot, const float *inv, size_t rows, uint16_t *out,
                       size_t ld) {
    const __m512i half = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1);
    for (size_t r0 = 0; r0 < rows; r0 += TR)
        for (size_t d0 = 0; d0 < D; d0 += TR) {
            __m512 x[TR];
            for (size_t d = 0; d < TR; d++) x[d] = _mm512_loadu_ps(ot + (d0 + d) * BR + r0);
            attn_transpose16(x);
            for (size_t r = 0; r < TR && r0 + r < rows; r++) {
                __m512 y = _mm512_mul_ps(x[attn_transpose16_order[r]], _mm512_set1_ps(inv[r0 + r]));
                __m512i u = _mm512_castps_si512(y);
                __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
                u = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(half, odd)), 16);
                _mm256_storeu_si256((__m256i *)(out + (r0 + r) * ld + d0),
                                    _mm512_cvtepi32_epi16(u));
            }
        }
}

/* One (batch, query head, query block): FlashAttention-2's forward. */
static void forward_block(void *arg, size_t part, size_t item) {
    const forward_job *job = arg;
    const amx_shape *f = &job->f;
    const attn_attention_problem *p = f->p;
    const attn_flash16_tensors *t = job->t;
    size_t qb = f->q_blocks - 1 - item % f->q_blocks, rest = item / f->q_blocks; /* heavy first */
    size_t h = rest % p->q_heads, b = rest / p->q_heads, kvh = h / f->G, D = f->D;
    attn_attention_seq seq = attn_attention_seq_of(p, b);
    size_t i0 = qb * BR;
    if (i0 >= seq.q_len) return; /* past this sequence's rows */
    size_t rows = min_size(seq.q_len - i0, BR);
    uint8_t *at = job->parts + part * job->part_bytes;
    uint32_t *qt = (uint32_t *)at;
    float *ot = (float *)(at += lines(BR * D * 2));
    float *m = (float *)(at += lines(BR * D * 4));
    float *l = (float *)(at += lines(BR * 4));
    float *s[2];
    s[0] = (float *)(at += lines(BR * 4));
    s[1] = (float *)(at += lines(BR * BC * 4));
    float *pv = (float *)(at += lines(BR * BC * 4));
    uint32_t *pt = (uint32_t *)(at + lines(BR * D * 4)); /* STEPS blocks */
    pack_keys(D, t->q + row_at(p->q.st, b, &seq, false, h, i0), p->q.st.t, rows, qt);
    memset(ot, 0, BR * D * sizeof *ot);
    for (size_t r = 0; r < BR; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    rows16 br;
    rows_of(p, &seq, i0, rows, &br);
    size_t block0 = (b * p->kv_heads + kvh) * f->k_blocks;
    __m512 alpha[2];
    value_steps to_o = {0};
    attn_amx_load_tiles();
    /* S^T of the next block goes to the tiles before this block's output
     * rescale, so that the two overlap (the tiles run beside AVX-512) */
    size_t kb0 = br.first / BC;
    if (kb0 * BC < br.last) score_tiles(D, key_rows(job, block0 + kb0), D, qt, s[0]);
    for (size_t kb = kb0; kb * BC < br.last; kb++) {
        size_t j0 = kb * BC;
        float *s_now = s[(kb - kb0) % 2], *s_next = s[(kb - kb0 + 1) % 2];
        const uint32_t *vt = values_transposed(job, block0 + kb);
        uint32_t *pt_k = pt + to_o.n * (BC / 2) * BR;
        bool rescale = softmax_by_key(&br, j0, keys_seen_whole(&br, j0, BC), f->c, s_now, pt_k,
                                      m, l, alpha);
        if (rescale) {
            accumulate_by_key(D, &to_o, ot); /* the blocks before, at the old scale */
            product_by_key(D, vt, pt_k, pv); /* P V, added below */
        } else { /* O += P V, with the blocks gathered */
            to_o.vt[to_o.n] = vt;
            to_o.pt[to_o.n++] = pt_k;
            if (to_o.n == STEPS || (kb + 1) * BC >= br.last) accumulate_by_key(D, &to_o, ot);
        }
        if ((kb + 1) * BC < br.last)
            score_tiles(D, key_rows(job, block0 + kb + 1), D, qt, s_next); /* S^T = K Q^T */
        if (rescale) rescale_add(D, alpha, pv, ot);
    }
    _tile_release();
    /* out = o / l; lse = (M + log2 l) / log2 e; a row that sees no key: 0, -inf */
    float inv[BR];
    for (size_t r = 0; r < rows; r++) {
        bool seen = br.begin[r] < br.end[r] && l[r] > 0.0f;
        inv[r] = seen ? 1.0f / l[r] : 0.0f;
        if (t->lse)
            t->lse[attn_lse_index(p, b, h, i0 + r)] =
                seen ? (float)(((double)m[r] + log2((double)l[r])) / FLASH16_LOG2E) : -INFINITY;
    }
    write_rows(D, ot, inv, rows, t->out + row_at(p->out.st, b, &seq, false, h, i0),
               p->out.st.t);
}

void attn_flash16_amx_forward(attn_workers w, const attn_attention_problem *p,
                              const attn_flash16_tensors *t, void *workspace) {
    forward_job job = {.f = shape_of(p), .t = t};
    job.keys = workspace;
    job.parts = job.keys + key_blocks(&job.f) * 2 * key_block_bytes(&job.f);
    job.part_bytes = forward_part_bytes(&job.f);
    attn_pool_for_parts(w.pool, w.threads, key_blocks(&job.f), 4, pack_forward_keys, &job);
    attn_pool_dynamic(w.pool, w.threads, query_blocks(&job.f), forward_block, &job);
}

/* ---- backward ------------------------------------------------------------------ */

/*
 * FlashAttention-2's backward in two deterministic passes, as
 * flash16_avx512bf16.c's, each product on the tiles:
 *
 *   pass A, per key block (dk, dv over the query blocks and the group's
 *   heads), in keys x rows:
 *     S^T = K Q^T, dP^T = V dO^T    A = K, V rows; B = Q^T, dO^T in pairs along d
 *     P^T, dS^T                     AVX-512, a vector = 16 query rows of one key
 *     dV += P^T dO, dK += dS^T Q    A = P^T, dS^T (bf16); B = dO, Q in pairs of rows
 *   pass B, per query block (dq over the key blocks), in rows x keys:
 *     S = Q K^T, dP = dO V^T        A = Q, dO rows; B = K^T, V^T in pairs along d
 *     dQ += dS K                    A = dS (bf16); B = K in pairs of keys
 *
 * P = 2^(fma(s, scale, -lse) log2 e) and dS = P (dP - delta), delta = dO . O
 * (in double; for rows nearly one-hot, what pass B leaves, attention.h), as
 * the vdpbf16ps kernels compute them; P and dS rounded to bf16 before they
 * multiply.
 *
 * Packed once per call, per key block (b, kvh, kb): K, V rows (BC, D), K^T,
 * V^T in pairs along d and K in pairs of keys; per query block (b, h, qb): Q,
 * dO rows (BR, D), Q^T, dO^T in pairs along d, Q, dO in pairs of rows, and
 * each row's lse and delta. Every piece is D BC 2 bytes (BR == BC).
 */
_Static_assert(BR == BC, "a query block packs as a key block");

enum { KEY_PIECES = 5, QUERY_PIECES = 6 };

static size_t piece_bytes(const amx_shape *f) { return key_block_bytes(f); }
static size_t key_side_bytes(const amx_shape *f) { return KEY_PIECES * piece_bytes(f); }
static size_t query_side_bytes(const amx_shape *f) {
    return QUERY_PIECES * piece_bytes(f) + 2 * lines(BR * 4);
}
/* Per part: pass A dk, dv (BC, D) floats; pass B dq (BR, D); both: S and
 * dP (32 x 32 floats); pass A P and dS, pass B dS (32 x 32 bf16), of
 * STEPS blocks each. */
static size_t backward_part_bytes(const amx_shape *f) {
    return 2 * lines(BC * f->D * 4) + 2 * lines(BR * BC * 4) + 2 * STEPS * lines(BR * BC * 2);
}

size_t attn_flash16_amx_backward_bytes(const attn_attention_problem *p, size_t threads) {
    amx_shape f = shape_of(p);
    size_t keys = mul_or_max(key_blocks(&f), key_side_bytes(&f));
    size_t queries = mul_or_max(query_blocks(&f), query_side_bytes(&f));
    size_t parts = mul_or_max(attn_parallel_parts(threads), backward_part_bytes(&f));
    return add_or_max(add_or_max(keys, queries), parts);
}

typedef struct backward_job {
    amx_shape f;
    const attn_flash16_tensors *t;
    uint8_t *keys, *queries, *parts;
    size_t part_bytes;
} backward_job;

/* A block's packed pieces: rows as stored (n), pairs along d transposed
 * (t), pairs of rows (i). */
typedef struct key_pieces {
    uint16_t *kn, *vn;
    uint32_t *kt, *vt, *ki;
} key_pieces;

typedef struct query_pieces {
    uint16_t *qn, *dOn;
    uint32_t *qt, *dOt, *qi, *dOi;
    float *lse, *delta;
} query_pieces;

static key_pieces key_pieces_of(const backward_job *job, size_t block) {
    size_t n = piece_bytes(&job->f);
    uint8_t *at = job->keys + block * key_side_bytes(&job->f);
    key_pieces k = {(uint16_t *)at, (uint16_t *)(at + n), (uint32_t *)(at + 2 * n),
                    (uint32_t *)(at + 3 * n), (uint32_t *)(at + 4 * n)};
    return k;
}

static query_pieces query_pieces_of(const backward_job *job, size_t block) {
    size_t n = piece_bytes(&job->f);
    uint8_t *at = job->queries + block * query_side_bytes(&job->f);
    query_pieces q = {(uint16_t *)at, (uint16_t *)(at + n), (uint32_t *)(at + 2 * n),
                      (uint32_t *)(at + 3 * n), (uint32_t *)(at + 4 * n),
                      (uint32_t *)(at + 5 * n), (float *)(at + 6 * n),
                      (float *)(at + 6 * n + lines(BR * 4))};
    return q;
}

static void pack_backward_keys(void *arg, size_t begin, size_t end) {
    const backward_job *job = arg;
    const amx_shape *f = &job->f;
    const attn_attention_problem *p = f->p;
    for (size_t item = begin; item < end; item++) {
        size_t kb = item % f->k_blocks, rest = item / f->k_blocks;
        size_t kvh = rest % p->kv_heads, b = rest / p->kv_heads;
        attn_attention_seq seq = attn_attention_seq_of(p, b);
        size_t j0 = kb * BC, cols = j0 < seq.kv_len ? min_size(seq.kv_len - j0, BC) : 0;
        size_t j = cols ? j0 : 0;
        key_pieces ks = key_pieces_of(job, item);
        const uint16_t *k = job->t->k + row_at(p->k.st, b, &seq, true, kvh, j);
        const uint16_t *v = job->t->v + row_at(p->v.st, b, &seq, true, kvh, j);
        pack_rows(f->D, k, p->k.st.t, cols, ks.kn);
        pack_rows(f->D, v, p->v.st.t, cols, ks.vn);
        pack_keys(f->D, ks.kn, f->D, BC, ks.kt);
        pack_keys(f->D, ks.vn, f->D, BC, ks.vt);
        pack_values(f->D, ks.kn, f->D, BC, ks.ki);
    }
}

static void pack_backward_queries(void *arg, size_t begin, size_t end) {
    const backward_job *job = arg;
    const amx_shape *f = &job->f;
    const attn_attention_problem *p = f->p;
    const attn_flash16_tensors *t = job->t;
    for (size_t item = begin; item < end; item++) {
        size_t qb = item % f->q_blocks, rest = item / f->q_blocks;
        size_t h = rest % p->q_heads, b = rest / p->q_heads;
        attn_attention_seq seq = attn_attention_seq_of(p, b);
        size_t i0 = qb * BR, rows = i0 < seq.q_len ? min_size(seq.q_len - i0, BR) : 0;
        size_t i = rows ? i0 : 0;
        query_pieces qs = query_pieces_of(job, item);
        size_t q_at = row_at(p->q.st, b, &seq, false, h, i);
        size_t o_at = row_at(p->out.st, b, &seq, false, h, i);
        pack_rows(f->D, t->q + q_at, p->q.st.t, rows, qs.qn);
        pack_rows(f->D, t->dout + o_at, p->out.st.t, rows, qs.dOn);
        pack_keys(f->D, qs.qn, f->D, BR, qs.qt);
        pack_keys(f->D, qs.dOn, f->D, BR, qs.dOt);
        pack_values(f->D, qs.qn, f->D, BR, qs.qi);
        pack_values(f->D, qs.dOn, f->D, BR, qs.dOi);
        query_stats(p, t, b, h, i0, rows, BR, o_at, qs.lse, qs.delta);
    }
}

/* acc (32, D floats) += the sum over s < n of a[s] (32 x 32 bf16, rows of
 * 64 bytes) @ bi[s] (16 pairs of rows x D), 32 columns at a time, the sums
 * kept on the tiles over the n steps and added in step order (each step's
 * products as one step a call would add them: the same bits). */
static inline void accumulate_tiles(size_t D, size_t n, const uint16_t *const *a,
                                    const uint32_t *const *bi, float *acc) {
    for (size_t n0 = 0; n0 < D; n0 += 2 * TR) {
        _tile_loadd(C00, acc + n0, D * 4);
        _tile_loadd(C01, acc + n0 + TR, D * 4);
        _tile_loadd(C10, acc + TR * D + n0, D * 4);
        _tile_loadd(C11, acc + TR * D + n0 + TR, D * 4);
        for (size_t s = 0; s < n; s++) {
            _tile_loadd(A0, a[s], BC * 2);
            _tile_loadd(A1, a[s] + TR * BC, BC * 2);
            _tile_loadd(B0, bi[s] + n0, D * 4);
            _tile_loadd(B1, bi[s] + n0 + TR, D * 4);
            multiply_2x2();
        }
        _tile_stored(C00, acc + n0, D * 4);
        _tile_stored(C01, acc + n0 + TR, D * 4);
        _tile_stored(C10, acc + TR * D + n0, D * 4);
        _tile_stored(C11, acc + TR * D + n0 + TR, D * 4);
    }
}

/* Up to STEPS steps of an accumulation, gathered before they multiply. */
typedef struct steps {
    size_t n;
    const uint16_t *a[STEPS];
    const uint32_t *b[STEPS];
} steps;

/* Adds the gathered steps into acc and empties s. */
static inline void accumulate_steps(size_t D, steps *s, float *acc) {
    if (s->n) accumulate_tiles(D, s->n, s->a, s->b, acc);
    s->n = 0;
}

/* Per 16 query rows: their keys [a, z) within a block (int32 lanes), lse,
 * delta, and which rows have one key only (their dS is exactly zero). */
typedef struct row_lanes {
    __m512i a[2], z[2];
    __m512 neg_lse[2], delta[2];
    __mmask16 live[2], single[2];
} row_lanes;

static void row_lanes_of(const rows16 *br, size_t j0, const query_pieces *qs, row_lanes *rl) {
    _Alignas(64) int32_t a[BR], z[BR];
    for (size_t r = 0; r < BR; r++) {
        size_t lo = r < br->rows ? br->begin[r] : 0, hi = r < br->rows ? br->end[r] : 0;
        a[r] = (int32_t)(lo > j0 ? min_size(lo - j0, BC) : 0);
        z[r] = (int32_t)(hi > j0 ? min_size(hi - j0, BC) : 0);
    }
    for (int h = 0; h < 2; h++) {
        rl->a[h] = _mm512_load_si512(a + 16 * h);
        rl->z[h] = _mm512_load_si512(z + 16 * h);
        __m512 lse = _mm512_loadu_ps(qs->lse + 16 * h);
        rl->live[h] = _mm512_cmp_ps_mask(lse, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
        rl->neg_lse[h] = _mm512_sub_ps(_mm512_setzero_ps(), lse);
        rl->delta[h] = _mm512_loadu_ps(qs->delta + 16 * h);
        __mmask16 single = 0;
        for (int r = 0; r < 16; r++) {
            size_t row = (size_t)(16 * h + r);
            if (row < br->rows && br->end[row] - br->begin[row] == 1)
                single |= (__mmask16)(1u << r);
        }
        rl->single[h] = single;
    }
}

/* Pass A's P^T and dS^T (keys x rows) from S^T and dP^T (32 x 32 floats),
 * rounded to bf16 (rows of 64 bytes): zero where a row does not see the
 * key, and for rows past the block or that see no key. */
static void gradients_by_key(const row_lanes *rl, float scale, const float *st,
                             const float *dpt, uint16_t *pt, uint16_t *dst) {
    __m512 vs = _mm512_set1_ps(scale), log2e = _mm512_set1_ps((float)FLASH16_LOG2E);
    for (int j = 0; j < BC; j++) {
        __m512 P[2], dS[2];
        for (int h = 0; h < 2; h++) {
            __m512i key = _mm512_set1_epi32(j);
            __mmask16 keep = rl->live[h] &
                             _mm512_cmp_epi32_mask(key, rl->a[h], _MM_CMPINT_NLT) &
                             _mm512_cmp_epi32_mask(key, rl->z[h], _MM_CMPINT_LT);
            /* the exponent's fma first: its rounding relative to the result */
            __m512 x = _mm512_fmadd_ps(_mm512_loadu_ps(st + j * BR + 16 * h), vs, rl->neg_lse[h]);
            P[h] = _mm512_maskz_mov_ps(keep, v_exp2(_mm512_mul_ps(x, log2e)));
            __m512 dp = _mm512_sub_ps(_mm512_loadu_ps(dpt + j * BR + 16 * h), rl->delta[h]);
            dS[h] = _mm512_maskz_mul_ps((__mmask16)~rl->single[h], P[h], dp);
        }
        _mm512_storeu_si512(pt + j * BR, (__m512i)_mm512_cvtne2ps_pbh(P[1], P[0]));
        _mm512_storeu_si512(dst + j * BR, (__m512i)_mm512_cvtne2ps_pbh(dS[1], dS[0]));
    }
}

/* Pass B's dS (rows x keys) from S and dP, rounded to bf16, the same
 * values as gradients_by_key's transposed; with peaks, each row's sums for
 * the consistent delta (and resid's lanes) take the tile (attention.h). */
static void gradients_by_row(const rows16 *br, size_t j0, const query_pieces *qs, float scale,
                             const float *s, const float *dp, uint16_t *ds, attn_row_peak *peaks,
                             __m512 *resid) {
    __m512 vs = _mm512_set1_ps(scale), log2e = _mm512_set1_ps((float)FLASH16_LOG2E);
    for (size_t r = 0; r < BR; r++) {
        float lse = qs->lse[r];
        if (r >= br->rows || lse == -INFINITY || br->end[r] - br->begin[r] == 1) {
            _mm512_storeu_si512(ds + r * BC, _mm512_setzero_si512());
            continue;
        }
        __m512 x[2] = {_mm512_loadu_ps(s + r * BC), _mm512_loadu_ps(s + r * BC + 16)};
        mask_row(br, r, j0, x);
        __m512 neg_lse = _mm512_set1_ps(-lse), delta = _mm512_set1_ps(qs->delta[r]), g[2], P[2];
        for (int v = 0; v < 2; v++) {
            P[v] = v_exp2(_mm512_mul_ps(_mm512_fmadd_ps(x[v], vs, neg_lse), log2e));
            g[v] = _mm512_mul_ps(P[v], _mm512_sub_ps(_mm512_loadu_ps(dp + r * BC + 16 * v), delta));
        }
        if (peaks) row_peak_add(P, g, 2, j0, peaks + r, resid + r);
        _mm512_storeu_si512(ds + r * BC, (__m512i)_mm512_cvtne2ps_pbh(g[1], g[0]));
    }
}

/* Pass A: one (batch, KV head, key block). */
static void backward_keys(void *arg, size_t part, size_t item) {
    const backward_job *job = arg;
    const amx_shape *f = &job->f;
    const attn_attention_problem *p = f->p;
    size_t kb = item % f->k_blocks, rest = item / f->k_blocks;
    size_t kvh = rest % p->kv_heads, b = rest / p->kv_heads, D = f->D;
    attn_attention_seq seq = attn_attention_seq_of(p, b);
    size_t j0 = kb * BC;
    if (j0 >= seq.kv_len) return; /* past this sequence's keys */
    size_t cols = min_size(seq.kv_len - j0, BC);
    key_pieces ks = key_pieces_of(job, item);
    uint8_t *at = job->parts + part * job->part_bytes;
    float *dk = (float *)at, *dv = (float *)(at + lines(BC * D * 4));
    float *st = (float *)(at + 2 * lines(BC * D * 4)), *dpt = st + BR * BC;
    uint16_t *pt = (uint16_t *)(dpt + BR * BC), *dst = pt + STEPS * BR * BC; /* STEPS each */
    memset(dk, 0, BC * D * sizeof *dk);
    memset(dv, 0, BC * D * sizeof *dv);
    size_t i_lo, i_hi;
    rows_seeing(p, &seq, j0, j0 + cols, &i_lo, &i_hi);
    rows16 br;
    row_lanes rl;
    steps to_dv = {0}, to_dk = {0};
    attn_amx_load_tiles();
    for (size_t qb = i_lo / BR; qb * BR < i_hi; qb++) {
        size_t i0 = qb * BR;
        rows_of(p, &seq, i0, min_size(seq.q_len - i0, BR), &br);
        for (size_t g = 0; g < f->G; g++) {
            size_t h = kvh * f->G + g;
            query_pieces qs = query_pieces_of(job, (b * p->q_heads + h) * f->q_blocks + qb);
            row_lanes_of(&br, j0, &qs, &rl);
            score_tiles(D, ks.kn, D, qs.qt, st);   /* S^T = K Q^T */
            score_tiles(D, ks.vn, D, qs.dOt, dpt); /* dP^T = V dO^T */
            uint16_t *pt_s = pt + to_dv.n * BR * BC, *dst_s = dst + to_dk.n * BR * BC;
            gradients_by_key(&rl, p->scale, st, dpt, pt_s, dst_s);
            to_dv.a[to_dv.n] = pt_s; /* dv += P^T dO */
            to_dv.b[to_dv.n++] = qs.dOi;
            to_dk.a[to_dk.n] = dst_s; /* dk += dS^T q */
            to_dk.b[to_dk.n++] = qs.qi;
            if (to_dv.n == STEPS) {
                accumulate_steps(D, &to_dv, dv);
                accumulate_steps(D, &to_dk, dk);
            }
        }
    }
    accumulate_steps(D, &to_dv, dv);
    accumulate_steps(D, &to_dk, dk);
    _tile_release();
    store_key_grads(p, job->t->dk, job->t->dv, b, &seq, kvh, j0, cols, dk, dv, D);
}

/* Pass B: one (batch, query head, query block); rows nearly one-hot take
 * the consistent delta, and leave it in the packed rows for pass A. */
static void backward_queries(void *arg, size_t part, size_t item) {
    const backward_job *job = arg;
    const amx_shape *f = &job->f;
    const attn_attention_problem *p = f->p;
    size_t qb = f->q_blocks - 1 - item % f->q_blocks, rest = item / f->q_blocks; /* heavy first */
    size_t h = rest % p->q_heads, b = rest / p->q_heads, kvh = h / f->G, D = f->D;
    attn_attention_seq seq = attn_attention_seq_of(p, b);
    size_t i0 = qb * BR;
    if (i0 >= seq.q_len) return;
    size_t rows = min_size(seq.q_len - i0, BR);
    query_pieces qs = query_pieces_of(job, (b * p->q_heads + h) * f->q_blocks + qb);
    uint8_t *at = job->parts + part * job->part_bytes;
    float *dq = (float *)at;
    float *s = (float *)(at + 2 * lines(BC * D * 4)), *dp = s + BR * BC;
    uint16_t *ds = (uint16_t *)(dp + BR * BC);
    memset(dq, 0, BR * D * sizeof *dq);
    rows16 br;
    rows_of(p, &seq, i0, rows, &br);
    size_t block0 = (b * p->kv_heads + kvh) * f->k_blocks;
    attn_row_peak peaks[BR] = {{0}};
    __m512 resid[BR]; /* each row's sum of dS, in lanes */
    for (size_t r = 0; r < BR; r++) resid[r] = _mm512_setzero_ps();
    bool consistent = attn_consistent_delta(p);
    attn_amx_load_tiles();
    steps to_dq = {0};
    for (size_t kb = br.first / BC; kb * BC < br.last; kb++) {
        key_pieces ks = key_pieces_of(job, block0 + kb);
        score_tiles(D, qs.qn, D, ks.kt, s);   /* S = Q K^T */
        score_tiles(D, qs.dOn, D, ks.vt, dp); /* dP = dO V^T */
        uint16_t *ds_s = ds + to_dq.n * BR * BC;
        gradients_by_row(&br, kb * BC, &qs, p->scale, s, dp, ds_s, consistent ? peaks : NULL,
                         resid);
        to_dq.a[to_dq.n] = ds_s; /* dq += dS k */
        to_dq.b[to_dq.n++] = ks.ki;
        if (to_dq.n == STEPS) accumulate_steps(D, &to_dq, dq);
    }
    accumulate_steps(D, &to_dq, dq);
    _tile_release();
    for (size_t r = 0; r < rows && consistent; r++)
        take_consistent_delta(p, job->t->k, b, &seq, kvh, peaks + r, resid[r], qs.delta + r,
                              dq + r * D);
    uint16_t *dq_out = job->t->dq + row_at(p->q.st, b, &seq, false, h, i0);
    for (size_t r = 0; r < rows; r++)
        for (size_t d = 0; d < D; d++)
            dq_out[r * p->q.st.t + d] = attn_float_to_bf16(dq[r * D + d] * p->scale);
}

void attn_flash16_amx_backward(attn_workers w, const attn_attention_problem *p,
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

const attn_flash16_kernels attn_flash16_amx_kernels = {
    .name = "amx",
    .declines = amx_declines,
    .forward_bytes = attn_flash16_amx_forward_bytes,
    .backward_bytes = attn_flash16_amx_backward_bytes,
    .forward = attn_flash16_amx_forward,
    .backward = attn_flash16_amx_backward,
};
