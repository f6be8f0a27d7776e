/*
 * flash_kernel.h — the fused attention kernels, written once over a small
 * vector vocabulary and compiled once per instruction set (flash_avx512.h
 * for flash_avx512.c, flash_avx2.c and flash_portable.c complete the
 * vocabulary, then include this).
 *
 * The includer includes its instruction set's vector vocabulary
 * (kernels/vec/vec_*.h: VW floats per vector, vec, v_zero, v_set1, v_load,
 * v_store, v_fma, v_nfma, v_mul, v_sub, v_add, v_div, v_max, v_abs, v_exp2
 * for x <= 0 (exactly 0 at -inf), v_tanh (within 1.7 ulp, +-1 for +-inf),
 * v_hmax, v_hsum), then defines:
 *   NV                 vectors per register-tile row
 *   LANE_QV, LANE_KT   the lane forward's tiles (flash_lanes.h): LANE_QV
 *                      vectors of rows x LANE_KT keys
 *   v_keep(w, t, k)    per lane: k where the 32-bit word w[lane] < t, else 0
 *   v_keep_keys(s, j, begin, end)  per lane: s where begin[lane] <= j <
 *                      end[lane], else -inf
 *   FLASH_KERNELS      the name of the attn_flash_kernels table to define
 *   FLASH_ISA_NAME     "avx512", ...
 *
 * Tiles: a query block of FBR rows (forward) or BR rows (backward), a
 * multiple of RG, is held raw, or scaled by scale * log2(e) where softcap
 * or ALiBi need scaled scores (see flash_shape: raw); the softmax runs on
 * exp2. A key block of BC = NV *
 * VW keys is packed as k^T (hd, BC) and v (BC, hd padded to VW). The score
 * tile is RG rows x BC keys in registers: each step broadcasts RG query
 * values and loads NV vectors of k^T for RG * NV fused multiply-adds.
 *
 * Scores in the tiles are base-2 logits: s2 = s * log2(e). ALiBi's bias of
 * row i is taken relative to its nearest visible key (a constant per row,
 * added back to lse), so that the scores the softmax weighs stay small
 * where float32 resolves them even when every key is far from pos_i.
 */
#include "kernels/flash/flash.h"

#include "kernels/flush_zero.h"
#include "parallel.h"
#include "rng/philox.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

/* The backward's query blocks and the rows of a score tile: the
 * includer's BR and RG (AVX-512: 144 and 6, flash_avx512.h says why), else
 * 64 and 4. A row's sums do not depend on either; dk and dv of GQA sum the
 * group's heads block by block, so there BR sets the order. */
#ifndef BR
#define BR 64
#endif
/* The forward's query blocks: longer, so that each packed key block serves
 * more rows; at T = 16384 the keys and values of a head (8 MiB) stream in
 * from past L2 once per query block. */
#define FBR 288 /* 288 rows hold 6 of the lane forward's groups of 48 */
/* The lane forward's longest query blocks (lane_rows): 22 groups of 48 */
#define FBR_MAX 1056
#define BR_MAX (FBR_MAX > BR ? FBR_MAX : BR)
#ifndef RG
#define RG 4
#endif
_Static_assert(RG <= 8 && BR % RG == 0, "blocks of whole row groups, of at most 8 rows");
#define BC (NV * VW)
_Static_assert(BC <= 64, "modify_tile's lane tables hold 64 keys");
#define LOG2E 1.4426950408889634
/* Floats of one work item's per-head query tiles (heads x rows x Dp) at
 * most: a GQA item runs this many of its group's heads against each packed
 * key block. The backward's (128 KiB: at hd 64, 8 heads of 64 rows or 3 of
 * 144) and the forward's (8 heads of FBR rows: 512 KiB), within L2. */
#define GROUP_TILE_FLOATS 32768
#define FORWARD_GROUP_TILE_FLOATS 131072

static size_t padded(size_t head_dim) { return (head_dim + VW - 1) / VW * VW; }

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* Query heads per work item of blocks of rows rows: the whole group of a
 * KV head where its tiles fit budget floats, else the group in even
 * chunks that do. */
static size_t heads_per_item(const attn_attention_problem *p, size_t rows, size_t budget) {
    size_t G = p->q_heads / p->kv_heads, fit = budget / (rows * padded(p->head_dim));
    if (fit < 1) fit = 1;
    if (fit >= G) return G;
    size_t chunks = (G + fit - 1) / fit;
    return (G + chunks - 1) / chunks;
}

/* ---- shared pieces -------------------------------------------------------- */

/* The geometry of one call. */
typedef struct flash_shape {
    const attn_attention_problem *p;
    const attn_attention_dropout *drop;
    size_t D, Dp, G, k_blocks;
    /* heads per item, chunks of the group and query blocks: the backward's
     * (rows BR) and the forward's (fbr rows: FBR, or lane_rows' for the
     * lane forward) */
    size_t hc, chunks, q_blocks, fhc, fchunks, fq_blocks, fbr;
    bool blocks_outer; /* the forward's items: query blocks outermost (flash_forward) */
    float log2_scale;     /* scale * log2(e) */
    float cap2, inv_cap2; /* softcap * log2(e) and its inverse; 0: no softcap */
    bool modified;        /* softcap, ALiBi or a bias: every tile goes through modify_tile */
    const attn_flash_bias *bias; /* the relative bias (flash.h), or NULL */
    /* Where the scale goes. Plain scores stay raw (q . k, q unscaled) and
     * the forward subtracts the row max before scaling: 2^((s - m) c), c =
     * scale log2(e); lse = m scale + ln l in double. Scaling q (or the
     * score) first would round every score relative to its own size, an
     * error that grows with the logits; here the rounding is relative to s - m,
     * small where the weights are large. The backward takes the same
     * weights from the forward's m and l (row_stats), 2^((s - m) c - log2
     * l), log2 l in two floats; where it has lse alone, m is lse / scale
     * rounded and log2 l the rest (pack_queries). Softcap and ALiBi work on scaled
     * base-2 scores, so their q is scaled (exp_scale = 1). */
    bool raw;             /* raw scores (above) */
    float q_scale;        /* q's factor in the tiles: log2_scale or 1 */
    float exp_scale;      /* (s - m)'s factor into base 2: log2_scale or 1 */
} flash_shape;

static flash_shape flash_shape_of(const attn_attention_problem *p,
                                  const attn_attention_dropout *drop) {
    flash_shape f = {.p = p, .drop = drop, .D = p->head_dim};
    f.Dp = padded(f.D);
    f.G = p->q_heads / p->kv_heads;
    f.hc = heads_per_item(p, BR, GROUP_TILE_FLOATS);
    f.chunks = (f.G + f.hc - 1) / f.hc;
    f.q_blocks = (p->q_len + BR - 1) / BR;
    f.fhc = heads_per_item(p, FBR, FORWARD_GROUP_TILE_FLOATS);
    f.fchunks = (f.G + f.fhc - 1) / f.fhc;
    f.fbr = FBR;
    f.fq_blocks = (p->q_len + FBR - 1) / FBR;
    f.k_blocks = (p->kv_len + BC - 1) / BC;
    f.log2_scale = (float)(p->scale * LOG2E);
    if (p->softcap > 0.0f) {
        f.cap2 = (float)(p->softcap * LOG2E);
        f.inv_cap2 = (float)(1.0 / (p->softcap * LOG2E));
    }
    /* a chain here is one relative bias (the backend declines others),
     * whose tables flash_forward and flash_backward set */
    f.modified = f.cap2 != 0.0f || p->alibi_slopes || p->score_mod_count;
    /* raw scores need c > 0 (the row max must stay the max); a sink joins
     * their sums at the end (join_sink) */
    f.raw = !f.modified && f.log2_scale > 0.0f;
    f.q_scale = f.raw ? 1.0f : f.log2_scale;
    f.exp_scale = f.raw ? f.log2_scale : 1.0f;
    return f;
}

/* A row's sink joined to its raw scores' softmax once its keys are summed
 * (m, the row max in raw units; l, the sum of 2^((s - m) c)), rather than
 * starting the sums as a max in raw units, which would round the logit:
 * returns the row's new divisor l + e^(sink - m scale), and *lse, the log
 * of the whole sum, both in double. */
static float join_sink(float m, float l, float sink, float scale, double *lse) {
    double m2 = (double)m * scale, mx = m2 > sink ? m2 : sink;
    *lse = mx + log((double)l * exp(m2 - mx) + exp(sink - mx));
    return (float)((double)l + exp(sink - m2));
}

/* A row's end, for head h from its max m and sum *l in the forward's
 * units: *lse, the log of its sum, and *lo, that float's rounding error.
 * m scale + ln l for raw scores (the sink joined: join_sink, and *l its new
 * divisor of o), else (m + log2 l) / log2(e) less the ALiBi row shift
 * (near: the row's distance to its nearest visible key), each in double;
 * stats (row_stats): m and the divisor of o (*l), from which the backward
 * takes the weights as they are here. A row that sees no key (seen false,
 * or l 0): lse = the sink or -inf, lo 0, stats NaN (none). Whether the row
 * saw a key. */
static bool row_lse(const flash_shape *f, size_t h, float m, float *l, bool seen, int64_t near,
                    float *lse, float *lo, float stats[2]) {
    const attn_attention_problem *p = f->p;
    *lse = p->sinks ? p->sinks[h] : -INFINITY;
    *lo = 0.0f;
    stats[0] = stats[1] = NAN;
    if (!(seen && *l > 0.0f)) return false;
    double exact, slope = p->alibi_slopes ? p->alibi_slopes[h] : 0.0;
    if (f->raw && p->sinks) *l = join_sink(m, *l, p->sinks[h], p->scale, &exact);
    else
        exact = f->raw ? (double)m * p->scale + log((double)*l)
                       : ((double)m + log2((double)*l)) / LOG2E - slope * (double)near;
    *lse = (float)exact;
    *lo = (float)(exact - (double)*lse);
    stats[0] = m;
    stats[1] = *l;
    return true;
}

/* Whether a row (row false: past the block's rows) starts its sums at
 * head h's sink: with scaled scores, max = the sink in the forward's units
 * (less the ALiBi row shift, near) and sum = 2^0; raw scores join it at the
 * end (join_sink). *m = that max, else -inf. */
static bool sink_start(const flash_shape *f, size_t h, bool row, int64_t near, float *m) {
    const attn_attention_problem *p = f->p;
    *m = -INFINITY;
    if (!row || !p->sinks || f->raw) return false;
    double shift = p->alibi_slopes ? (double)p->alibi_slopes[h] * near : 0.0;
    *m = (float)((p->sinks[h] + shift) * LOG2E);
    return true;
}

/* The distance from pos to the nearest of keys [lo, hi) (0 inside, or
 * where there is none): ALiBi's row shift. */
static int64_t row_near(int64_t pos, size_t lo, size_t hi) {
    if (lo >= hi) return 0;
    return pos < (int64_t)lo ? (int64_t)lo - pos : pos >= (int64_t)hi ? pos - (int64_t)hi + 1 : 0;
}

/* Whether every query row that sees a key sees its sequence's first key:
 * no left window, and a mask's row intervals (attn_visible_keys) that all
 * begin at key 0 where they hold a key (causal, prefix-LM, key padding
 * written as a mask; not documents or chunks). O(T) over the intervals. */
static bool rows_see_first_key(const attn_attention_problem *p) {
    if (p->window && p->window_left >= 0) return false;
    const attn_block_map *m = p->block_map;
    if (!m || !m->row_lo) return true;
    for (size_t i = 0; i < m->rows_batch * m->q_len; i++)
        if (m->row_lo[i] > 0 && m->row_lo[i] < m->row_hi[i]) return false;
    return true;
}

/* Whether later query rows see more keys than earlier ones, for the
 * forward's order of work (flash_forward): causal, a window unbounded on
 * the left, or a mask's row intervals that begin at key 0 and end later
 * for the last row than for the first (prefix-LM, causal as a mask). */
static bool keys_grow_with_rows(const attn_attention_problem *p) {
    if (p->causal || (p->window && p->window_left < 0 && p->window_right >= 0)) return true;
    const attn_block_map *m = p->block_map;
    if (!m || !m->row_lo || m->q_len == 0 || !rows_see_first_key(p)) return false;
    return m->row_hi[m->q_len - 1] > m->row_hi[0];
}

/* Head h's relative bias at distance 0, by key (j - i) or by row (i - j),
 * or NULL where there is none. */
static inline const float *bias_by_key(const flash_shape *f, size_t h) {
    return f->bias ? f->bias->by_key + h * f->bias->stride : NULL;
}
static inline const float *bias_by_row(const flash_shape *f, size_t h) {
    return f->bias ? f->bias->by_row + h * f->bias->stride : NULL;
}

/* ALiBi's slope of head h in base-2 units (0: none). */
static float slope2_of(const flash_shape *f, size_t h) {
    return f->p->alibi_slopes ? (float)(f->p->alibi_slopes[h] * LOG2E) : 0.0f;
}

/* The rows [i0, i0 + rows) of a query block of one sequence: the keys
 * [begin, end) each sees (0, 0 when none, and past rows), and the distance
 * from pos_i to its nearest visible key (ALiBi's row shift). A row that
 * sees no key has begin == end. */
typedef struct block_rows {
    size_t i0, rows;
    int64_t pos0; /* pos of row i0 */
    size_t begin[BR_MAX], end[BR_MAX]; /* both non-decreasing over the rows (0 past rows) */
    int64_t near[BR_MAX];
    size_t first, last; /* the union of the rows' keys: [first, last) */
    size_t all_from, all_to; /* keys [all_from, all_to) every row sees (empty: 0, 0) */
    size_t seen_lo, seen_hi; /* from the first row that sees some key to past the last */
    /* some row in [seen_lo, seen_hi) sees no key (a mask's row intervals:
     * a document no key belongs to); its row group may be skipped by a
     * tile that key_rows still spans (gradient_tiles) */
    bool gaps;
} block_rows;

static void rows_of(const flash_shape *f, const attn_attention_seq *s, size_t i0, size_t rows,
                    block_rows *br) {
    /* the entries read: the rows' row groups */
    size_t fill = min_size(BR_MAX, (rows + RG - 1) / RG * RG);
    br->i0 = i0;
    br->rows = rows;
    br->pos0 = (int64_t)i0 + s->diagonal;
    br->first = s->kv_len;
    br->last = 0;
    size_t lo0, hi0, lo1, hi1;
    attn_visible_keys(f->p, s, i0, &lo0, &hi0);
    attn_visible_keys(f->p, s, i0 + rows - 1, &lo1, &hi1);
    if (lo0 == 0 && hi1 == s->kv_len && lo1 == 0 && hi0 == s->kv_len && hi0 > 0) {
        /* every row sees every key (no mask, or none reaching this block):
         * both ends grow with the row, so the first and last rows tell.
         * near is still the row's own (a row may sit outside the keys):
         * the one-pass backward packs lse for rows of a longer block than
         * its score tiles take, and both must shift by the same near */
        for (size_t r = 0; r < fill; r++) {
            br->begin[r] = 0;
            br->end[r] = r < rows ? s->kv_len : 0;
            br->near[r] = row_near(br->pos0 + (int64_t)r, 0, br->end[r]);
        }
        br->first = br->all_from = 0;
        br->last = br->all_to = s->kv_len;
        br->seen_lo = 0;
        br->seen_hi = rows;
        br->gaps = false;
        return;
    }
    br->seen_lo = br->seen_hi = 0;
    br->gaps = false;
    for (size_t r = 0; r < fill; r++) {
        /* a row that sees nothing keeps attn_visible_keys' empty [lo, lo):
         * both ends then still grow with the row, which key_rows' binary
         * searches need where such a row lies between rows that see keys */
        size_t lo = 0, hi = 0;
        if (r < rows) attn_visible_keys(f->p, s, i0 + r, &lo, &hi);
        if (lo >= hi) hi = lo;
        br->begin[r] = lo;
        br->end[r] = hi;
        br->near[r] = row_near(br->pos0 + (int64_t)r, lo, hi);
        if (lo < hi) {
            if (lo < br->first) br->first = lo;
            if (hi > br->last) br->last = hi;
            if (br->seen_lo == br->seen_hi) br->seen_lo = r;
            else if (br->seen_hi < r) br->gaps = true; /* rows (seen_hi .. r) see nothing */
            br->seen_hi = r + 1;
        }
    }
    if (br->first >= br->last) br->first = br->last = 0;
    /* both ends grow with the row: the last row's begin, the first's end */
    br->all_from = br->begin[rows - 1];
    br->all_to = br->end[0];
    for (size_t r = 0; r < rows; r++)
        if (br->begin[r] >= br->end[r]) br->all_from = br->all_to = 0;
}

/* The first key block of br's sweep in blocks of width keys: its first key
 * rounded down to a multiple of width where that visits no more blocks, so
 * that a sliding window's tiles are whole (a tile of width - 1 keys packed
 * through the scalar tail) and its diagonal tile is causal's. */
static size_t sweep_start(const block_rows *br, size_t width) {
    size_t aligned = br->first / width * width;
    size_t blocks = (br->last - br->first + width - 1) / width;
    return (br->last - aligned + width - 1) / width == blocks ? aligned : br->first;
}

/* Bit i of a mask. */
static inline bool flash_bit(const uint8_t *bits, uint64_t i) { return (bits[i >> 3] >> (i & 7)) & 1u; }

/* The dropout factors of n consecutive weights from flat index e0 of the
 * (B, Hq, T, S) weights: 0 or kept_scale. Philox groups of 64 (rng/philox.h)
 * come from the includer's philox_group when it has a vector one. */
static void drop_factors(const attn_attention_dropout *drop, uint64_t e0, size_t n, float *factor) {
    if (drop->kind == ATTN_DROP_BITS) {
        for (size_t j = 0; j < n; j++)
            factor[j] = flash_bit(drop->keep_bits, e0 + j) ? drop->kept_scale : 0.0f;
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

/* Strided rows ((B, T, H, D): 3 KiB apart at H = 12) are past the
 * hardware's stride prefetch, and their copies waited on memory; the
 * copies prefetch the row ROWS_AHEAD on (or the next VW x VW block's). */
#define ROWS_AHEAD 8

static inline void prefetch_row(const float *x, size_t n) {
    for (size_t i = 0; i < n; i += 16) __builtin_prefetch(x + i);
    __builtin_prefetch(x + n - 1);
}

static inline void prefetch_row_for_write(float *x, size_t n) {
    for (size_t i = 0; i < n; i += 16) __builtin_prefetch(x + i, 1);
    __builtin_prefetch(x + n - 1, 1);
}

/* xt (D, BC) = rows [0, cols) of x (row stride ld) transposed, zero beyond
 * cols. No test inside the copy loops: this runs once per (query block,
 * key block), and a per-element branch made it a fifth of the forward. */
static void transpose_keys(const float *x, size_t ld, size_t D, size_t cols, float *xt) {
    size_t jj = 0;
#if defined(HAVE_TRANSPOSE_BLOCK)
    size_t whole = D / VW * VW; /* dims in whole VW x VW blocks */
    for (; jj + VW <= cols; jj += VW) {
        const float *x_j = x + jj * ld;
        if (ld != D) /* strided rows: the next block's (past the hardware's stride prefetch) */
            for (size_t r = jj + VW; r < jj + 2 * VW && r < cols; r++) prefetch_row(x + r * ld, D);
        for (size_t d = 0; d < whole; d += VW) transpose_block(x_j + d, ld, xt + d * BC + jj, BC);
        for (size_t r = 0; r < VW; r++)
            for (size_t d = whole; d < D; d++) xt[d * BC + jj + r] = x_j[r * ld + d];
    }
#endif
    for (; jj < cols; jj++) {
        const float *x_j = x + jj * ld;
        for (size_t d = 0; d < D; d++) xt[d * BC + jj] = x_j[d];
    }
    for (jj = cols; jj < BC; jj++)
        for (size_t d = 0; d < D; d++) xt[d * BC + jj] = 0.0f;
}

/* rows (n, Dp) of x (row stride ld, D wide) times c, zero-padded; rows past
 * count are zero. */
static void pack_rows(const float *x, size_t ld, size_t count, size_t n, size_t D, size_t Dp,
                      float c, float *dst) {
    for (size_t r = 0; r < count && r < n; r++) {
        const float *src = x + r * ld;
        float *row = dst + r * Dp;
        if (ld != D && r + ROWS_AHEAD < count && r + ROWS_AHEAD < n)
            prefetch_row(src + ROWS_AHEAD * ld, D);
        for (size_t d = 0; d < D; d++) row[d] = src[d] * c;
        for (size_t d = D; d < Dp; d++) row[d] = 0.0f;
    }
    if (count < n) memset(dst + count * Dp, 0, (n - count) * Dp * sizeof *dst);
}

/* acc + a * *b, b an element every lane multiplies by (a query's, weight's or
 * key's value): the tiles' products. The compiler broadcasts it once for
 * all the FMAs that use it (vbroadcastss). */
static inline vec fma_broadcast(const float *b, vec a, vec acc) {
    return v_fma(v_set1(*b), a, acc);
}

/* The tile products' loops (a step: a few loads and broadcasts, 16-24
 * FMAs) unrolled twice, so that two steps share one pointer add and
 * compare-and-branch. Same operations in the same order, so the same bits. */
#define UNROLL_2 _Pragma("GCC unroll 2")

/* Dims per partial sum of a score. One chain of fmas over all of D rounds
 * every step relative to the running sum, which grows to the score: on
 * large logits that errs well past PyTorch's blocked SGEMM. Chains of 16
 * dims added at the end keep each rounding
 * relative to a quarter of the sum. */
#define SCORE_CHAIN 16

/* s (RG, BC) = qs (RG rows of D, row stride ld) @ kt (D, BC): a score tile,
 * summed SCORE_CHAIN dims at a time. The sums live in a local array added
 * to s once per chain: vector types may alias floats, so sums kept in s
 * itself would be stored back on every step. */
static void score_tile(const float *qs, size_t ld, size_t D, const float *kt, vec s[RG][NV]) {
    for (size_t d0 = 0; d0 < D; d0 += SCORE_CHAIN) {
        vec acc[RG][NV];
        for (int r = 0; r < RG; r++)
            for (int v = 0; v < NV; v++) acc[r][v] = v_zero();
        size_t d1 = min_size(d0 + SCORE_CHAIN, D);
        UNROLL_2
        for (size_t d = d0; d < d1; d++) {
            vec k[NV];
            for (int v = 0; v < NV; v++) k[v] = v_load(kt + d * BC + v * VW);
            for (int r = 0; r < RG; r++)
                for (int v = 0; v < NV; v++)
                    acc[r][v] = fma_broadcast(&qs[r * ld + d], k[v], acc[r][v]);
        }
        for (int r = 0; r < RG; r++)
            for (int v = 0; v < NV; v++) s[r][v] = d0 == 0 ? acc[r][v] : v_add(s[r][v], acc[r][v]);
    }
}

/* The score tile's vectors [v0, v0 + W) only (W < NV, at run time v0),
 * the others set to fill: for the edge tiles of the causal/window band,
 * whose row groups see a few of the keys. */
#define SCORE_PART(W)                                                                      \
    static void score_part_##W(const float *qs, size_t ld, size_t D, const float *kt,      \
                               size_t v0, vec fill, vec s[RG][NV]) {                       \
        vec acc[RG][W], sum[RG][W];                                                        \
        const float *k0 = kt + v0 * VW;                                                    \
        for (size_t d0 = 0; d0 < D; d0 += SCORE_CHAIN) {                                   \
            for (int r = 0; r < RG; r++)                                                   \
                for (int v = 0; v < W; v++) acc[r][v] = v_zero();                          \
            for (size_t d = d0; d < d0 + SCORE_CHAIN && d < D; d++) {                      \
                vec k[W];                                                                  \
                for (int v = 0; v < W; v++) k[v] = v_load(k0 + d * BC + v * VW);           \
                for (int r = 0; r < RG; r++)                                               \
                    for (int v = 0; v < W; v++)                                            \
                        acc[r][v] = fma_broadcast(&qs[r * ld + d], k[v], acc[r][v]);       \
            }                                                                              \
            for (int r = 0; r < RG; r++)                                                   \
                for (int v = 0; v < W; v++)                                                \
                    sum[r][v] = d0 == 0 ? acc[r][v] : v_add(sum[r][v], acc[r][v]);         \
        }                                                                                  \
        /* constant indices only, so that s stays in registers in callers */               \
        for (int r = 0; r < RG; r++)                                                       \
            for (int v = 0; v < NV; v++) {                                                 \
                s[r][v] = fill;                                                            \
                for (int w = 0; w < W; w++)                                                \
                    if (v0 + (size_t)w == (size_t)v) s[r][v] = sum[r][w];                  \
            }                                                                              \
    }
#if NV > 1
SCORE_PART(1)
#endif
#if NV > 2
SCORE_PART(2)
#endif
#if NV > 3
SCORE_PART(3)
#endif

/* The score tile of the columns [c0, c1) (whole vectors around them), the
 * other vectors set to fill. */
static void score_cols(const float *qs, size_t ld, size_t D, const float *kt, size_t c0,
                       size_t c1, vec fill, vec s[RG][NV]) {
    size_t v0 = c0 / VW, v1 = (c1 + VW - 1) / VW;
    switch (v1 - v0) {
#if NV > 1
    case 1: score_part_1(qs, ld, D, kt, v0, fill, s); return;
#endif
#if NV > 2
    case 2: score_part_2(qs, ld, D, kt, v0, fill, s); return;
#endif
#if NV > 3
    case 3: score_part_3(qs, ld, D, kt, v0, fill, s); return;
#endif
    default: score_tile(qs, ld, D, kt, s); return;
    }
}

/* o (RG, Dp) = o * alpha + p (RG, cols) @ vp (cols, Dp): W vectors of each
 * row from column c0 (W = NV in the body, 1 at the tail), accumulated in
 * registers (constant bounds, so the compiler keeps acc out of memory).
 * The block's sum starts from zero and joins o in one fma, as the lane
 * forward's (lane_values). Needs j0 < j1: a loop that may run no step
 * leaves gcc a path on which acc is still zero, and it keeps acc in memory
 * to join the two. */
#define APPLY_VALUES(NAME, W)                                                                   \
    static void apply_values_##NAME(float *o, size_t Dp, const float *alpha, const float *p,  \
                                 size_t j0, size_t j1, const float *vp, size_t c0) {      \
        vec acc[RG][W];                                                                   \
        for (int r = 0; r < RG; r++)                                                      \
            for (int v = 0; v < W; v++) acc[r][v] = v_zero();                             \
        size_t jj = j0;                                                                   \
        UNROLL_2                                                                          \
        do {                                                                              \
            vec val[W];                                                                   \
            for (int v = 0; v < W; v++) val[v] = v_load(vp + jj * Dp + c0 + v * VW);      \
            for (int r = 0; r < RG; r++)                                                  \
                for (int v = 0; v < W; v++)                                               \
                    acc[r][v] = fma_broadcast(&p[r * BC + jj], val[v], acc[r][v]);        \
        } while (++jj < j1);                                                              \
        for (int r = 0; r < RG; r++) {                                                    \
            vec scale = v_set1(alpha[r]);                                                 \
            for (int v = 0; v < W; v++) {                                                 \
                float *out = o + r * Dp + c0 + v * VW;                                    \
                v_store(out, v_fma(v_load(out), scale, acc[r][v]));                       \
            }                                                                             \
        }                                                                                 \
    }
APPLY_VALUES(body, NV)
APPLY_VALUES(tail, 1)

/* The same over the weights' columns [j0, j1) (the others are zero). */
static void apply_values(float *o, size_t Dp, const float *alpha, const float *p, size_t j0,
                         size_t j1, const float *vp) {
    size_t c0 = 0;
    for (; c0 + NV * VW <= Dp; c0 += NV * VW) apply_values_body(o, Dp, alpha, p, j0, j1, vp, c0);
    for (; c0 < Dp; c0 += VW) apply_values_tail(o, Dp, alpha, p, j0, j1, vp, c0);
}

/* Lanes for the vector forms of modify_tile, up to BC = 64: key offsets
 * 0, 1, ... of a tile, and the masks of its leading and trailing keys
 * (+inf, subtracted from a score, masks it; 0 keeps it). */
static const float lane_of[64] = {
    0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
    22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43,
    44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63};
#define INF8 INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, INFINITY
/* from 64 - a: +inf at the tile's keys [0, a) */
static const float mask_lead[128] = {INF8, INF8, INF8, INF8, INF8, INF8, INF8, INF8};
/* from 64 - z: +inf at the tile's keys [z, BC) */
static const float mask_trail[128] = {[64] = INF8, INF8, INF8, INF8, INF8, INF8, INF8, INF8};
#undef INF8

/* Rows [r0, r0 + RG) of block br against keys [j0, j0 + BC): softcap,
 * ALiBi (slope2, base 2, relative to each row's nearest key), the head's
 * relative bias (by_key: bias_by_key, NULL none), and -inf
 * outside each row's visible keys (keys past cols are outside them all),
 * in vectors: the pass touches every score of every modified tile, and a
 * scalar one (tanh above all) would outweigh the tile's products. th (RG,
 * BC), when not NULL, receives tanh(s / softcap) for the
 * backward. */
static inline void modify_tile(const flash_shape *f, const block_rows *br, float slope2,
                               const float *by_key, vec s[RG][NV], size_t r0, size_t j0,
                               float *th) {
    bool all_seen = j0 >= br->all_from && j0 + BC <= br->all_to;
    if (!f->modified && all_seen) return; /* the common tile */
    if (f->cap2 != 0.0f) {
        vec inv = v_set1(f->inv_cap2), cap = v_set1(f->cap2);
        for (int r = 0; r < RG; r++)
            for (int v = 0; v < NV; v++) {
                vec t = v_tanh(v_mul(s[r][v], inv));
                if (th) v_store(th + r * BC + v * VW, t);
                s[r][v] = v_mul(cap, t);
            }
    }
    if (slope2 != 0.0f) {
        /* s -= slope2 (|pos - j| - near), the distance exact in float */
        vec neg_slope = v_set1(-slope2);
        for (int r = 0; r < RG; r++) {
            size_t i = r0 + (size_t)r;
            if (i >= br->rows) continue;
            vec at = v_set1((float)(br->pos0 + (int64_t)i - (int64_t)j0));
            vec near = v_set1((float)br->near[i]);
            for (int v = 0; v < NV; v++) {
                vec d = v_sub(v_abs(v_sub(at, v_load(lane_of + v * VW))), near);
                s[r][v] = v_fma(neg_slope, d, s[r][v]);
            }
        }
    }
    if (by_key) {
        /* row i's keys j0 + [0, BC): distances j - i in a row of the table */
        for (int r = 0; r < RG; r++) {
            const float *at = by_key + (ptrdiff_t)j0 - (ptrdiff_t)(br->i0 + r0 + (size_t)r);
            for (int v = 0; v < NV; v++) s[r][v] = v_add(s[r][v], v_load(at + v * VW));
        }
    }
    if (all_seen) return;
    /* masked: [0, a) and [z, BC) of the tile */
    for (int r = 0; r < RG; r++) {
        size_t i = r0 + (size_t)r;
        size_t lo = i < br->rows ? br->begin[i] : 0, hi = i < br->rows ? br->end[i] : 0;
        size_t a = lo > j0 ? min_size(lo - j0, BC) : 0, z = hi > j0 ? min_size(hi - j0, BC) : 0;
        if (z < a) z = a;
        if (a == 0 && z == BC) continue;
        for (int v = 0; v < NV; v++) {
            vec cut = v_add(v_load(mask_lead + 64 - a + v * VW), v_load(mask_trail + 64 - z + v * VW));
            s[r][v] = v_sub(s[r][v], cut);
        }
    }
}

/* The columns [*c0, *c1) of the tile at j0 (cols wide) that rows [r0, r0 +
 * RG) of br see; c0 == c1 when they see none of it. */
static void group_cols(const block_rows *br, size_t r0, size_t j0, size_t cols, size_t *c0,
                       size_t *c1) {
    if (j0 >= br->all_from && j0 + cols <= br->all_to) { /* the common tile */
        *c0 = 0;
        *c1 = cols;
        return;
    }
    size_t lo = (size_t)-1, hi = 0;
    for (size_t r = r0; r < r0 + RG && r < br->rows; r++)
        if (br->begin[r] < br->end[r]) {
            lo = br->begin[r] < lo ? br->begin[r] : lo;
            hi = br->end[r] > hi ? br->end[r] : hi;
        }
    *c0 = lo > j0 ? lo - j0 : 0;
    *c1 = hi > j0 ? min_size(hi - j0, cols) : 0;
    if (*c0 >= *c1) *c0 = *c1 = 0;
}

/* Rows [*lo, *hi) of br that see some key of [k0, k1), and rows between
 * them that see none (whose tiles are zero: gradient_tiles): both ends
 * grow with the row, so two binary searches, not a linear scan: the
 * backward's edge tiles of a sliding window search at every 4 keys. */
static void key_rows(const block_rows *br, size_t k0, size_t k1, size_t *lo, size_t *hi) {
    if (k0 >= br->all_from && k1 <= br->all_to) { /* every row sees them */
        *lo = 0;
        *hi = br->rows;
        return;
    }
    size_t a = br->seen_lo, z = br->seen_hi; /* the first row whose keys end past k0 */
    while (a < z) {
        size_t mid = a + (z - a) / 2;
        if (br->end[mid] > k0) z = mid;
        else a = mid + 1;
    }
    *lo = a;
    z = br->seen_hi; /* then the first whose keys begin at k1 or later */
    while (a < z) {
        size_t mid = a + (z - a) / 2;
        if (br->begin[mid] >= k1) z = mid;
        else a = mid + 1;
    }
    *hi = a;
}

/* Row i of head h of sequence seq of batch b in a (B, T, H, D) view. */
static size_t row_at(attn_view_strides st, size_t b, const attn_attention_seq *seq, bool keys,
                     size_t h, size_t i) {
    return attn_view_offset(st, b, keys ? seq->kv_start : seq->q_start, h, i);
}

/* ---- forward -------------------------------------------------------------- */

static size_t tiles_workspace(const attn_attention_problem *p) {
    size_t D = p->head_dim, Dp = padded(D), hc = heads_per_item(p, FBR, FORWARD_GROUP_TILE_FLOATS);
    /* per head: qs (FBR, D), o (FBR, Dp), m (FBR), l (FBR, VW); kt (D, BC),
     * vp (BC, Dp), p, th (RG, BC), factors (BC) */
    return hc * (FBR * D + FBR * Dp + FBR + FBR * VW) + D * BC + BC * Dp + 2 * RG * BC + BC +
           2 * VW;
}

typedef struct forward_job {
    flash_shape f;
    float *workspace;
    size_t per_part;
    bool lanes;   /* the problem goes to forward_lanes */
    bool measure; /* forward_lanes keeps max |q|, |k|, |v| in each part's last line */
    bool windowed_pack; /* forward_lanes packs from each block's sweep (lanes_pack) */
} forward_job;

/* The work item's (batch, KV head, chunk of its heads, query block), heavy
 * query blocks first (causal: item 0 is the last query block): within each
 * head, or, with blocks_outer, the last block of every head first. */
typedef struct query_item {
    size_t b, kvh, h0, heads, qb;
} query_item;

static query_item query_item_of(const flash_shape *f, size_t item, bool forward) {
    size_t q_blocks = forward ? f->fq_blocks : f->q_blocks, chunks = forward ? f->fchunks : f->chunks;
    size_t hc = forward ? f->fhc : f->hc;
    query_item it;
    if (forward && f->blocks_outer) {
        size_t per_block = f->p->batch * f->p->kv_heads * chunks;
        it.qb = q_blocks - 1 - item / per_block;
        item %= per_block;
    } else {
        it.qb = q_blocks - 1 - item % q_blocks;
        item /= q_blocks;
    }
    size_t chunk = item % chunks;
    item /= chunks;
    it.kvh = item % f->p->kv_heads;
    it.b = item / f->p->kv_heads;
    it.h0 = it.kvh * f->G + chunk * hc;
    it.heads = chunk * hc < f->G ? min_size(hc, f->G - chunk * hc) : 0;
    return it;
}

static float max_abs_rows(const float *x, size_t rows, size_t st, size_t n, float top);

/* A part's workspace of floats floats: whole cache lines, so that each
 * part's vectors stay line-aligned, then a line for the magnitudes (max
 * |q|, |k|, |v|, |dO|) a measuring pass keeps. */
static size_t with_magnitudes_line(size_t floats) { return (floats + 15) / 16 * 16 + 16; }

/* That line of part part, in a workspace of per_part floats a part. */
static float *part_magnitudes(float *workspace, size_t per_part, size_t part) {
    return workspace + (part + 1) * per_part - 16;
}

/* magnitudes[0, n) = the largest over the parts' lines (zeroed by the
 * caller: 0 where a part measured nothing). */
static void parts_magnitudes(float *workspace, size_t per_part, size_t parts, int n,
                             float *magnitudes) {
    for (int t = 0; t < n; t++) magnitudes[t] = 0.0f;
    for (size_t part = 0; part < parts; part++) {
        const float *top = part_magnitudes(workspace, per_part, part);
        for (int t = 0; t < n; t++) magnitudes[t] = top[t] > magnitudes[t] ? top[t] : magnitudes[t];
    }
}

#include "kernels/flash/flash_lanes.h"

static size_t forward_workspace(const attn_attention_problem *p, attn_flash_fit fit) {
    size_t tiles = tiles_workspace(p), lanes = lanes_workspace(p, lane_rows(p, fit));
    return with_magnitudes_line(tiles > lanes ? tiles : lanes);
}

/* Whether the forward of f can measure its inputs itself: the lane
 * forward measures every row of q, k and v as it reads them, in cache
 * (forward_lanes); a scan before it would read them from memory. */
static bool lanes_measure(const flash_shape *f) { return lanes_take(f); }

static bool forward_measures(const attn_attention_problem *p, const attn_attention_dropout *drop) {
    flash_shape f = flash_shape_of(p, drop);
    return lanes_measure(&f);
}

/* One (batch, KV head, chunk of heads, query block): FlashAttention-2's
 * forward for each head, each key block packed once for all of them;
 * problems without dropout go to forward_lanes. */
static void forward_block(void *arg, size_t part, size_t item) {
    const forward_job *job = arg;
    const flash_shape *f = &job->f;
    const attn_attention_problem *p = f->p;
    size_t D = f->D, Dp = f->Dp;
    query_item it = query_item_of(f, item, true);
    attn_attention_seq seq = attn_attention_seq_of(p, it.b);
    size_t i0 = it.qb * f->fbr; /* fbr: FBR, or longer in the lane forward */
    if (i0 >= seq.q_len || it.heads == 0) return; /* past this sequence's rows */
    size_t rows = min_size(seq.q_len - i0, f->fbr), nh = it.heads, b = it.b;
    bool values = (float *)p->out.data != NULL, dropout = values && f->drop->kind != ATTN_DROP_NONE;
    float *qs = job->workspace + part * job->per_part; /* (nh, FBR, D) */
    float *o = qs + f->fhc * FBR * D;                    /* (nh, FBR, Dp) */
    /* l: each row's running sum as a vector of partial sums, reduced once
     * at the end, not by a horizontal sum per row and tile */
    float *m = o + f->fhc * FBR * Dp, *l = m + f->fhc * FBR;
    float *kt = l + f->fhc * FBR * VW, *vp = kt + D * BC, *pt = vp + BC * Dp, *th = pt + RG * BC;
    float *factor = th + RG * BC;
    block_rows br;
    rows_of(f, &seq, i0, rows, &br);
    if (job->lanes) {
        forward_lanes(job, part, &it, &seq, &br);
        return;
    }

    for (size_t g = 0; g < nh; g++) {
        size_t h = it.h0 + g;
        /* qs = q * q_scale; rows past the block are zero (computed, never
         * written) */
        const float *q = (const float *)p->q.data + row_at(p->q.st, b, &seq, false, h, i0);
        float *qs_g = qs + g * FBR * D;
        for (size_t r = 0; r < rows; r++)
            for (size_t d = 0; d < D; d++) qs_g[r * D + d] = q[r * p->q.st.t + d] * f->q_scale;
        memset(qs_g + rows * D, 0, (FBR - rows) * D * sizeof *qs_g);
        memset(o + g * FBR * Dp, 0, FBR * Dp * sizeof *o);
        for (size_t r = 0; r < FBR; r++) {
            bool sink = sink_start(f, h, r < rows, r < rows ? br.near[r] : 0, &m[g * FBR + r]);
            memset(l + (g * FBR + r) * VW, 0, VW * sizeof *l);
            l[(g * FBR + r) * VW] = sink ? 1.0f : 0.0f;
        }
    }
    size_t k_at = row_at(p->k.st, b, &seq, true, it.kvh, 0);
    size_t v_at = row_at(p->v.st, b, &seq, true, it.kvh, 0);
    for (size_t j0 = sweep_start(&br, BC); j0 < br.last; j0 += BC) {
        size_t cols = min_size(br.last - j0, BC);
        /* k^T (D, BC) and v (BC, Dp) of keys [j0, j0 + cols), zero beyond. v
         * is copied even where its rows could be read in place: read with the
         * tensor's row stride, 16 times per block, the rows compete for a few
         * L1 sets. */
        transpose_keys((const float *)p->k.data + k_at + j0 * p->k.st.t, p->k.st.t, D, cols, kt);
        if (values) {
            for (size_t jj = 0; jj < cols; jj++) {
                memcpy(vp + jj * Dp, (const float *)p->v.data + v_at + (j0 + jj) * p->v.st.t, D * sizeof *vp);
                memset(vp + jj * Dp + D, 0, (Dp - D) * sizeof *vp);
            }
            memset(vp + cols * Dp, 0, (BC - cols) * Dp * sizeof *vp);
        }
        for (size_t g = 0; g < nh; g++) {
            size_t h = it.h0 + g;
            float slope2 = slope2_of(f, h), *m_g = m + g * FBR, *l_g = l + g * FBR * VW;
            for (size_t r0 = 0; r0 < rows; r0 += RG) {
                vec s[RG][NV];
                size_t c0, c1;
                group_cols(&br, r0, j0, cols, &c0, &c1);
                if (c0 == c1) continue; /* all -inf: m, l and o stay as they are */
                score_cols(qs + g * FBR * D + r0 * D, D, D, kt, c0, c1, v_set1(-INFINITY), s);
                modify_tile(f, &br, slope2, bias_by_key(f, h), s, r0, j0, NULL);
                /* online softmax in the tile's units: m_new = max(m, rowmax);
                 * the running sums and outputs rescale by 2^((m - m_new)
                 * exp_scale), one vector exp2 for the rows */
                float m_new[RG], shift[VW > RG ? VW : RG], alpha[VW > RG ? VW : RG];
                /* every vector, with constant indices (s stays in registers):
                 * an edge tile's vectors outside [c0, c1) are -inf, adding
                 * exact zeros, and apply_values reads [c0, c1) only */
                for (int r = 0; r < RG; r++) {
                    vec mx = s[r][0];
                    for (int v = 1; v < NV; v++) mx = v_max(mx, s[r][v]);
                    float top = v_hmax(mx); /* (fmaxf: a libm call at -O3) */
                    m_new[r] = top > m_g[r0 + r] ? top : m_g[r0 + r];
                }
                for (int r = 0; r < (VW > RG ? VW : RG); r++)
                    shift[r] = r < RG && m_new[r] != -INFINITY
                                   ? (m_g[r0 + r] - m_new[r]) * f->exp_scale
                                   : 0.0f;
                for (int r = 0; r < RG; r += VW < RG ? VW : RG) v_store(alpha + r, v_exp2(v_load(shift + r)));
                for (int r = 0; r < RG; r++) {
                    float *p_r = pt + r * BC;
                    if (m_new[r] == -INFINITY) { /* nothing visible yet */
                        alpha[r] = 1.0f;
                        memset(p_r, 0, BC * sizeof *p_r);
                        continue;
                    }
                    vec sum = v_zero(), c = v_set1(f->exp_scale), row_max = v_set1(m_new[r]);
                    for (int v = 0; v < NV; v++) {
                        vec e = v_exp2(v_mul(v_sub(s[r][v], row_max), c));
                        sum = v_fma(e, v_set1(1.0f), sum);
                        v_store(p_r + v * VW, e);
                    }
                    float *l_r = l_g + (r0 + r) * VW;
                    v_store(l_r, v_fma(v_load(l_r), v_set1(alpha[r]), sum));
                    m_g[r0 + r] = m_new[r];
                    if (dropout && r0 + r < rows) {
                        drop_factors(f->drop, attn_drop_index(p, b, h, i0 + r0 + r, j0), cols, factor);
                        scale_by(p_r, factor, cols);
                    }
                }
                if (values) apply_values(o + g * FBR * Dp + r0 * Dp, Dp, alpha, pt, c0, c1, vp);
            }
        }
    }
    /* out = o / l; lse = ln(sum exp(s)) (row_lse); a row that sees no
     * key: 0, and lse = sink or -inf */
    for (size_t g = 0; g < nh; g++) {
        size_t h = it.h0 + g;
        for (size_t r = 0; r < rows; r++) {
            size_t gr = g * FBR + r;
            float l_gr = v_hsum(v_load(l + gr * VW)), lse, lo, stats[2];
            bool live = row_lse(f, h, m[gr], &l_gr, br.begin[r] < br.end[r], br.near[r], &lse,
                                &lo, stats);
            if (values) {
                float *out_r = (float *)p->out.data + row_at(p->out.st, b, &seq, false, h, i0 + r);
                /* o / l rounded once (a reciprocal, then a product, rounds
                 * twice; the backward's delta = dO . out feels it) */
                for (size_t d = 0; d < D; d++) out_r[d] = live ? o[gr * Dp + d] / l_gr : 0.0f;
            }
            if (p->lse) {
                size_t at = attn_lse_index(p, b, h, i0 + r);
                p->lse[at] = lse;
                if (p->lse_lo) p->lse_lo[at] = lo;
                if (p->row_stats) memcpy(p->row_stats + 2 * at, stats, sizeof stats);
            }
        }
    }
}

/* The forward's items in order of query block, the last block of every
 * head first, where a part has fewer than this many items: causal blocks
 * cost more the later they are, and a part takes the next item when it is
 * free, so that with each head's blocks in turn (heaviest first) the last
 * heads' heavy blocks start when other parts have little left. In a model
 * of that (bench/schedule_model.py: greedy list scheduling, an item's cost
 * the (row, key) pairs it computes) blocks outermost bring a causal
 * forward's span near its ideal where parts have few items, and each
 * head's blocks in turn do not. With more items a part, each head's blocks
 * in turn keep a part on one packed head (lanes_pack). */
#define BLOCKS_OUTER_ITEMS 16

static void flash_forward(attn_workers w, attn_flash_fit fit, const attn_attention_problem *p,
                          const attn_attention_dropout *drop, const attn_flash_bias *bias,
                          float *workspace, float magnitudes[3]) {
    forward_job job = {.f = flash_shape_of(p, drop), .workspace = workspace,
                       .per_part = forward_workspace(p, fit)};
    job.f.bias = bias;
    job.lanes = lanes_take(&job.f);
    if (job.lanes) {
        job.f.fbr = lane_rows(p, fit);
        job.f.fq_blocks = (p->q_len + job.f.fbr - 1) / job.f.fbr;
    }
    job.measure = magnitudes != NULL && lanes_measure(&job.f);
    job.windowed_pack = p->block_map && p->block_map->row_lo && !rows_see_first_key(p);
    size_t items = p->batch * p->kv_heads * job.f.fchunks * job.f.fq_blocks;
    size_t parts = attn_parallel_parts(w.threads);
    job.f.blocks_outer = parts > 1 && items < BLOCKS_OUTER_ITEMS * parts && keys_grow_with_rows(p);
    attn_pool_dynamic(w.pool, w.threads, items, forward_block, &job);
    if (!magnitudes) return;
    if (job.measure)
        parts_magnitudes(workspace, job.per_part, parts, 3, magnitudes);
    else
        for (int t = 0; t < 3; t++) magnitudes[t] = INFINITY;
}

/* ---- backward ------------------------------------------------------------- */

/* acc (BC, Dp) += tile^T (BC, rows) @ x (rows, Dp), tile (rows, BC): the
 * key-side products dv += A^T dO and dk += dS^T q, for KS keys from j and W
 * vectors from column c0 at a time, in registers. The rows' sum starts
 * from zero and joins acc once, so that a key's sum over many query blocks
 * is chains of one block's rows each (the forward's lane_values). */
#define ACCUMULATE_KEYS(NAME, KS, W)                                                              \
    static void accumulate_keys_##NAME(float *acc, size_t Dp, const float *tile, const float *x, \
                                    size_t rows, size_t j, size_t c0) {                     \
        vec sum[KS][W];                                                                     \
        for (int jj = 0; jj < KS; jj++)                                                     \
            for (int v = 0; v < W; v++) sum[jj][v] = v_zero();                              \
        UNROLL_2                                                                            \
        for (size_t r = 0; r < rows; r++) {                                                 \
            vec xv[W];                                                                      \
            for (int v = 0; v < W; v++) xv[v] = v_load(x + r * Dp + c0 + v * VW);           \
            for (int jj = 0; jj < KS; jj++)                                                 \
                for (int v = 0; v < W; v++)                                                 \
                    sum[jj][v] = fma_broadcast(&tile[r * BC + j + jj], xv[v], sum[jj][v]);  \
        }                                                                                   \
        for (int jj = 0; jj < KS; jj++)                                                     \
            for (int v = 0; v < W; v++) {                                                   \
                float *a = acc + (j + jj) * Dp + c0 + v * VW;                               \
                v_store(a, v_add(v_load(a), sum[jj][v]));                                   \
            }                                                                               \
    }
/* Keys per step of the key-side products (the includer's KEY_STEP, else
 * 4); a block's last step may take 4. Each step ends on the tile's BC keys. */
#ifndef KEY_STEP
#define KEY_STEP 4
#endif
_Static_assert(KEY_STEP == 4 || (KEY_STEP > 4 && (BC - 4) % KEY_STEP == 0),
               "steps of KEY_STEP keys, then one of 4, end on BC");
ACCUMULATE_KEYS(body, KEY_STEP, NV)
ACCUMULATE_KEYS(tail, KEY_STEP, 1)
#if KEY_STEP != 4
ACCUMULATE_KEYS(body4, 4, NV)
ACCUMULATE_KEYS(tail4, 4, 1)
#else
#define accumulate_keys_body4 accumulate_keys_body
#define accumulate_keys_tail4 accumulate_keys_tail
#endif

/* Over the rows of br that see each step's keys (the tile is zero
 * elsewhere: a row that sees one key of a step is in a row group whose
 * tile was computed). Keys past cols hold zero weight in tile and are
 * accumulated (as zeros) into acc's padding rows, which are never read.
 * Each (key, dim) sums its rows in order, whatever the step: the bits do
 * not depend on KEY_STEP. The steps are called by name, not through a
 * function pointer chosen once, so that they inline. */
static void accumulate_keys(float *acc, size_t Dp, const float *tile, const float *x,
                            const block_rows *br, size_t j0, size_t cols) {
    for (size_t j = 0; j < cols;) {
        size_t step = j + KEY_STEP <= BC && j + 4 < cols ? KEY_STEP : 4, lo, hi, c0 = 0;
        key_rows(br, j0 + j, j0 + j + step, &lo, &hi);
        const float *tile_lo = tile + lo * BC, *x_lo = x + lo * Dp;
        for (; lo < hi && c0 + NV * VW <= Dp; c0 += NV * VW) {
            if (step == KEY_STEP) accumulate_keys_body(acc, Dp, tile_lo, x_lo, hi - lo, j, c0);
            else accumulate_keys_body4(acc, Dp, tile_lo, x_lo, hi - lo, j, c0);
        }
        for (; lo < hi && c0 < Dp; c0 += VW) {
            if (step == KEY_STEP) accumulate_keys_tail(acc, Dp, tile_lo, x_lo, hi - lo, j, c0);
            else accumulate_keys_tail4(acc, Dp, tile_lo, x_lo, hi - lo, j, c0);
        }
        j += step;
    }
}

/* Work items (batch x KV heads) from which the backward runs in one pass
 * (below), and the most floats of one item's rows a part may then hold.
 * One pass does 5/7 of the two passes' products but has only these items
 * to share out: 4 keep the 2-4 cores of the machines here busy (on 16
 * cores, 4 items leave most idle; the choice cannot look at the threads
 * without giving other bits on other thread counts). */
#define ONE_PASS_ITEMS 4
#define ONE_PASS_FLOATS ((size_t)1 << 24)

/* Floats of one item's rows in the one-pass backward: for the group's heads
 * x its query blocks' rows, dq sums, q (times q_scale) and dO (Dp each) and
 * shift, log_sum, log_lo, delta, an attn_row_peak and VW resid lanes; 0 when the two
 * passes run. The choice depends on the problem alone (the whole one's
 * heads where it is a slice of heads), never on the threads, so that every
 * thread count, and every split of the heads, gives the same bits.
 *   One pass, per (batch, KV head): for each key block, for each query
 *     block that sees it: P, dP, dS once; dv, dk of the block, and dq of
 *     the rows summed over the key blocks in order. Five products per tile
 *     (S, dP, dv, dk, dq), as PyTorch's, but only batch x KV heads items.
 *   Two passes (A: dk, dv per key block; B: dq per query block) recompute
 *     S and dP in each: seven products per tile, any number of items. */
static size_t one_pass_floats(const attn_attention_problem *p) {
    size_t G = p->q_heads / p->kv_heads, Dp = padded(p->head_dim);
    size_t rows = (p->q_len + BR - 1) / BR * BR;
    size_t kv_heads = p->whole_kv_heads ? p->whole_kv_heads : p->kv_heads;
    if (p->batch * kv_heads < ONE_PASS_ITEMS ||
        rows > ONE_PASS_FLOATS / (G * (3 * Dp + 7 + VW)))
        return 0;
    return G * rows * (3 * Dp + 7 + VW);
}

/* Key blocks the one pass takes at a time (key_span_gradients): each
 * query block's rows (q, dO, dq: 48 KiB at D = 64) then serve KEY_SPAN
 * key blocks while in cache, where one block at a time would bring them
 * back from past L2 (3.5 MiB a head at T = 4096) for each key block. */
#define KEY_SPAN 4

/* Key blocks whose tiles a part holds at once. */
static size_t key_slots(const attn_attention_problem *p) { return one_pass_floats(p) ? KEY_SPAN : 1; }

/* The per-part scratch of the backward. */
static size_t backward_workspace(const attn_attention_problem *p) {
    size_t D = p->head_dim, Dp = padded(D), hc = heads_per_item(p, BR, GROUP_TILE_FLOATS);
    /* per head: qs, dO, dq (BR, Dp), shift, log_sum, log_lo, delta (BR), peaks (BR x 3),
     * resid lanes (BR, VW); q (BR, Dp); A, dS, th (BR, BC); kt, vt (D, BC);
     * kv0, kv1, kv2 (BC, Dp); one pass: the item's rows; Pt (RG, BC); the
     * mean key (Dp) */
    size_t floats = hc * (3 * BR * Dp + 7 * BR + BR * VW) + BR * Dp + 3 * BR * BC +
                    key_slots(p) * (2 * D * BC + 3 * BC * Dp) + 2 * VW + one_pass_floats(p) +
                    RG * BC + Dp;
    return with_magnitudes_line(floats);
}

/* Whether the backward can measure its inputs itself: the one pass of raw
 * scores packs every row of q and dO once per item and every key block of
 * k and v once, so it measures them there, in cache (a scan before it
 * would read them from memory). */
static bool backward_measures(const attn_attention_problem *p, const attn_attention_dropout *drop) {
    flash_shape f = flash_shape_of(p, drop);
    return one_pass_floats(p) != 0 && f.raw;
}

typedef struct backward_job {
    flash_shape f;
    const attn_attention_grads *g;
    attn_flash_rows rows;
    float *delta;
    float *workspace;
    size_t per_part;
    bool consistent; /* rows nearly one-hot take a consistent delta (attention.h) */
    bool measure;    /* max |q|, |k|, |v|, |dO| into each part's magnitudes */
} backward_job;

_Static_assert(sizeof(attn_row_peak) == 3 * sizeof(float), "an attn_row_peak is three floats");

typedef struct backward_tiles {
    /* per head of the item; per row the weights' shift, log_sum and log_lo
     * (pack_queries) */
    float *qs, *dO, *dq, *shift, *log_sum, *log_lo, *delta;
    attn_row_peak *peaks; /* per head; NULL: not summed */
    float *resid_lanes;   /* per head: sum_j dS_ij in VW lanes, (BR, VW) */
    float *q, *A, *dS, *th, *kt, *vt, *kv0, *kv1, *kv2;
    float *Pt; /* a row group's P, where dropout scales A */
    float *kmean; /* (D) the mean of the keys a row's delta is made consistent with */
    float *magnitudes; /* the part's, where the backward measures; else NULL */
    size_t slot_floats; /* from one key block's tiles (kt .. kv2) to the next */
    /* one pass: the item's rows packed once, (G, rows) of Dp (or 1) floats */
    float *dq_sums, *qs_all, *dO_all, *shift_all, *log_sum_all, *log_lo_all, *delta_all,
        *resid_lanes_all;
    attn_row_peak *peaks_all;
} backward_tiles;

static backward_tiles tiles_of(const backward_job *job, size_t part) {
    size_t D = job->f.D, Dp = job->f.Dp, hc = job->f.hc;
    backward_tiles t;
    t.qs = job->workspace + part * job->per_part;
    t.dO = t.qs + hc * BR * Dp;
    t.dq = t.dO + hc * BR * Dp;
    t.shift = t.dq + hc * BR * Dp;
    t.log_sum = t.shift + hc * BR;
    t.log_lo = t.log_sum + hc * BR;
    t.delta = t.log_lo + hc * BR;
    t.peaks = (attn_row_peak *)(void *)(t.delta + hc * BR);
    t.resid_lanes = t.delta + hc * BR + 3 * hc * BR;
    t.q = t.resid_lanes + hc * BR * VW;
    t.A = t.q + BR * Dp;
    t.dS = t.A + BR * BC;
    t.th = t.dS + BR * BC;
    t.kt = t.th + BR * BC;
    t.vt = t.kt + D * BC;
    t.kv0 = t.vt + D * BC;
    t.kv1 = t.kv0 + BC * Dp;
    t.kv2 = t.kv1 + BC * Dp;
    t.slot_floats = 2 * D * BC + 3 * BC * Dp;
    size_t rows = job->f.q_blocks * BR * job->f.G; /* one pass: every head of the group */
    t.dq_sums = t.kt + key_slots(job->f.p) * t.slot_floats + 2 * VW;
    t.qs_all = t.dq_sums + rows * Dp;
    t.dO_all = t.qs_all + rows * Dp;
    t.shift_all = t.dO_all + rows * Dp;
    t.log_sum_all = t.shift_all + rows;
    t.log_lo_all = t.log_sum_all + rows;
    t.delta_all = t.log_lo_all + rows;
    t.peaks_all = (attn_row_peak *)(void *)(t.delta_all + rows);
    t.resid_lanes_all = t.delta_all + rows + 3 * rows;
    t.Pt = t.dq_sums + one_pass_floats(job->f.p);
    t.kmean = t.Pt + RG * BC;
    t.magnitudes = job->measure ? part_magnitudes(job->workspace, job->per_part, part) : NULL;
    if (!job->consistent) t.peaks = NULL;
    return t;
}

/* k^T and v^T (D, BC) of keys [j0, j0 + cols) of (b, kvh), zero beyond. */
static void pack_keys_transposed(const flash_shape *f, size_t b, const attn_attention_seq *seq,
                                 size_t kvh, size_t j0, size_t cols, float *kt, float *vt) {
    const attn_attention_problem *p = f->p;
    transpose_keys((const float *)p->k.data + row_at(p->k.st, b, seq, true, kvh, j0), p->k.st.t, f->D, cols, kt);
    transpose_keys((const float *)p->v.data + row_at(p->v.st, b, seq, true, kvh, j0), p->v.st.t, f->D, cols, vt);
}

/* Where lse passes 2^20 in size, lse + lse_lo (48 bits) no longer carry a
 * weight's exponent to float's own precision, and the backward takes the
 * forward's row statistics instead (where it has them); below, lse and
 * lse_lo give the weights, the last bits measured closer to float64 on
 * rows that weigh many keys (docs/exactness.md). */
#define STATS_PAST_LSE 1048576.0f

/* Row at's statistics from the forward (row_stats), or NULL where the
 * backward takes lse: none given, none kept for the row (NaN), or an lse
 * below STATS_PAST_LSE. */
static const float *own_stats(const attn_flash_rows *rs, size_t at) {
    const float *stats = rs->stats ? rs->stats + 2 * at : NULL;
    if (!stats || stats[0] != stats[0] || fabsf(rs->lse[at]) < STATS_PAST_LSE) return NULL;
    return stats;
}

/* Head slot g of the tiles for head h, rows of block br: qs (q times
 * q_scale), dO, and per row delta and the weights' terms, P = 2^(fma(s -
 * shift, exp_scale, -log_sum) - log_lo) (shift -inf: a row that sees no
 * key); q unscaled into t->q when want_q. log_sum + log_lo is the log2 of
 * the row's divisor in two floats: one float would round it once for the
 * whole row, an error every weight of the row shares (dv = P^T dO sums it
 * up), where the weights' own roundings differ and partly cancel.
 *   From the forward's row statistics (row_stats) past STATS_PAST_LSE:
 * shift = its max m and the log2 of its divisor l, the forward's own
 * weights, their rounding relative to s - m at any size of the logits.
 *   Else from lse (and lse_lo): raw scores take shift = lse / scale rounded
 * to float, near the row's top score, and the rest, (lse - shift scale)
 * log2(e) in double, so that s - shift is exact near the top and the
 * product's rounding relative to s - shift (lse log2(e) rounded would be
 * off by |lse| 2^-24); scaled scores take lse in base 2 with ALiBi's row
 * shift, rounded, and its rounding's rest. */
static void pack_queries(const backward_job *job, const backward_tiles *t, size_t g, size_t b,
                         const attn_attention_seq *seq, size_t h, const block_rows *br,
                         bool want_q) {
    const flash_shape *f = &job->f;
    const attn_attention_problem *p = f->p;
    size_t Dp = f->Dp, i0 = br->i0, rows = br->rows;
    const float *q = (const float *)p->q.data + row_at(p->q.st, b, seq, false, h, i0);
    const float *dO = (const float *)job->g->dout + row_at(p->out.st, b, seq, false, h, i0);
    pack_rows(q, p->q.st.t, rows, BR, f->D, Dp, f->q_scale, t->qs + g * BR * Dp);
    if (want_q) pack_rows(q, p->q.st.t, rows, BR, f->D, Dp, 1.0f, t->q);
    pack_rows(dO, p->out.st.t, rows, BR, f->D, Dp, 1.0f, t->dO + g * BR * Dp);
    double slope = p->alibi_slopes ? p->alibi_slopes[h] : 0.0;
    const attn_flash_rows *rs = &job->rows;
    for (size_t r = 0; r < BR; r++) {
        float *shift = t->shift + g * BR + r, *log_sum = t->log_sum + g * BR + r;
        float *log_lo = t->log_lo + g * BR + r, *delta = t->delta + g * BR + r;
        *shift = -INFINITY;
        *log_sum = *log_lo = *delta = 0.0f;
        if (r >= rows) continue;
        size_t at = attn_lse_index(p, b, h, i0 + r);
        *delta = job->delta[at];
        const float *stats = own_stats(rs, at);
        double rest; /* the log2 of the divisor, in the shift's base-2 units */
        if (stats) {
            *shift = stats[0];
            rest = log2((double)stats[1]);
        } else if (rs->lse[at] == -INFINITY) {
            continue; /* the row sees no key */
        } else {
            double lse = (double)rs->lse[at] + (rs->lse_lo ? rs->lse_lo[at] : 0.0);
            if (!f->raw) {
                double base2 = (lse + slope * br->near[r]) * LOG2E;
                *shift = (float)base2;
                rest = base2 - (double)*shift;
            } else {
                float m = (float)(lse / p->scale);
                if (!isfinite(m)) m = 0.0f; /* lse / scale past float: lse in the rest */
                *shift = m;
                rest = (lse - (double)m * p->scale) * LOG2E;
            }
        }
        *log_sum = (float)rest;
        *log_lo = (float)(rest - (double)*log_sum);
    }
}

/* The keys of the rows (bits of risen) of the row group from r0 whose
 * largest weight rose past ATTN_ONE_HOT_WEIGHT in its tile (keys from j0):
 * the lane holding it, and softcap's factor there. The weights are A's
 * rows, or Pt's where dropout scaled A. Out of gradient_tile's row loop, and
 * only past the threshold, which few rows pass: the row loop keeps to a lane
 * compare, with no search at every rise and no horizontal max and sum per
 * row and tile. */
static void note_peaks(const flash_shape *f, const backward_tiles *t, attn_row_peak *peaks,
                       unsigned risen, size_t r0, size_t j0) {
    for (int r = 0; r < RG; r++) {
        if (!(risen >> r & 1u)) continue;
        attn_row_peak *pk = peaks + r;
        const float *P = f->drop->kind != ATTN_DROP_NONE ? t->Pt + r * BC : t->A + (r0 + r) * BC;
        size_t c = 0;
        while (c + 1 < BC && P[c] != pk->weight) c++;
        float th = f->cap2 != 0.0f ? t->th[(r0 + r) * BC + c] : 0.0f;
        pk->factor = fmaf(-th, th, 1.0f); /* as the tiles' factor */
        pk->key = (uint32_t)(j0 + c);
    }
}

/* A block's gradient tiles in two phases, each over all its row groups,
 * so that each reads one packed operand, k^T or v^T (D, BC: 16 KiB at D =
 * 64), which then stays in L1. Both in one tile per row group read the two
 * (32 KiB), which a 32 KiB L1 (Skylake, Zen 4) cannot hold with anything
 * else: they would come from L2 for every row group.
 *
 * Phase one, weight_tile: A = P for rows [r0, r0 + RG) of head slot g
 * (head h) of block br against keys [j0, j0 + cols), which they see in
 * columns [c0, c1) of it: P = 2^(fma(s - shift, exp_scale, -log_sum) -
 * log_lo) (pack_queries), zero where masked, for rows past the block and for rows
 * that saw no key (their dS zero too). Softcap's
 * tanh(s / cap) goes to th's rows, dropout's keep factors to dS's (1 past
 * cols), for phase two. */
static void weight_tile(const backward_job *job, const backward_tiles *t, size_t g, size_t b,
                        size_t h, const block_rows *br, size_t r0, size_t j0, size_t cols,
                        size_t c0, size_t c1) {
    const flash_shape *f = &job->f;
    const attn_attention_problem *p = f->p;
    vec s[RG][NV];
    const float *shift = t->shift + g * BR, *log_sum = t->log_sum + g * BR;
    const float *log_lo = t->log_lo + g * BR;
    /* outside [c0, c1): s = -inf, so P = 0 */
    score_cols(t->qs + g * BR * f->Dp + r0 * f->Dp, f->Dp, f->D, t->kt, c0, c1, v_set1(-INFINITY), s);
    modify_tile(f, br, slope2_of(f, h), bias_by_key(f, h), s, r0, j0, t->th + r0 * BC);
    vec c = v_set1(f->exp_scale);
    for (int r = 0; r < RG; r++) {
        size_t row = r0 + (size_t)r;
        float *A = t->A + row * BC, *dS = t->dS + row * BC;
        if (row >= br->rows || shift[row] == -INFINITY) {
            memset(A, 0, BC * sizeof *A);
            memset(dS, 0, BC * sizeof *dS);
            continue;
        }
        vec m = v_set1(shift[row]), neg_log_sum = v_set1(-log_sum[row]), lo = v_set1(log_lo[row]);
        for (int v = 0; v < NV; v++)
            v_store(A + v * VW, v_exp2(v_sub(v_fma(v_sub(s[r][v], m), c, neg_log_sum), lo)));
        if (f->drop->kind != ATTN_DROP_NONE) {
            drop_factors(f->drop, attn_drop_index(p, b, h, br->i0 + row, j0), cols, dS);
            for (size_t col = cols; col < BC; col++) dS[col] = 1.0f;
        }
    }
}

/* Phase two, gradient_tile: dS = P * (dP * drop - delta) (times softcap's
 * 1 - t^2), dP = dO v^T over the same columns (zero outside them, so dS is
 * too), P from phase one's A, and with dropout A = P * drop. With
 * t->peaks, each row's sums (attn_row_peak) take the tile's dS and P. */
static void gradient_tile(const backward_job *job, const backward_tiles *t, size_t g,
                          const block_rows *br, size_t r0, size_t j0, size_t c0, size_t c1) {
    const flash_shape *f = &job->f;
    const attn_attention_problem *p = f->p;
    vec dp[RG][NV];
    const float *shift = t->shift + g * BR, *delta_g = t->delta + g * BR;
    score_cols(t->dO + g * BR * f->Dp + r0 * f->Dp, f->Dp, f->D, t->vt, c0, c1, v_zero(), dp);
    bool dropout = f->drop->kind != ATTN_DROP_NONE;
    unsigned risen = 0; /* rows whose largest weight rose here */
    for (int r = 0; r < RG; r++) {
        size_t row = r0 + (size_t)r;
        float *A = t->A + row * BC, *dS = t->dS + row * BC;
        if (row >= br->rows || shift[row] == -INFINITY) continue; /* zero since phase one */
        vec delta = v_set1(delta_g[row]), P[NV], ds[NV];
        for (int v = 0; v < NV; v++) {
            P[v] = v_load(A + v * VW);
            ds[v] = dp[r][v];
            if (dropout) { /* dS holds the keep factors */
                vec keep = v_load(dS + v * VW);
                v_store(A + v * VW, v_mul(P[v], keep));
                ds[v] = v_mul(ds[v], keep);
            }
        }
        /* a softmax over one key (and no sink) is constant: its dS is
         * exactly zero (in float, dP - delta would leave rounding residue);
         * not for one block of a longer row (backward_from_lse), nor where
         * the loss reads lse (its dS is dlse) */
        if (!p->sinks && !p->backward_from_lse && !p->dlse &&
            br->end[row] - br->begin[row] == 1) {
            memset(dS, 0, BC * sizeof *dS);
            continue;
        }
        /* dS = P (dP - delta): P as before the dropout (A is P * drop) */
        for (int v = 0; v < NV; v++) ds[v] = v_mul(P[v], v_sub(ds[v], delta));
        if (t->peaks) { /* the row's sums, in lanes: no horizontal step per tile */
            attn_row_peak *pk = t->peaks + g * BR + row;
            float *lanes = t->resid_lanes + (g * BR + row) * VW;
            vec sum = ds[0], top = P[0];
            for (int v = 1; v < NV; v++) {
                sum = v_add(sum, ds[v]);
                top = v_max(top, P[v]);
            }
            v_store(lanes, v_add(v_load(lanes), sum));
            /* a weight past the threshold and the row's largest: its key
             * after the loop (no other weight's key is needed) */
            float floor = pk->weight > ATTN_ONE_HOT_WEIGHT ? pk->weight : ATTN_ONE_HOT_WEIGHT;
            if (v_any_greater(top, v_set1(floor))) {
                if (dropout)
                    for (int v = 0; v < NV; v++) v_store(t->Pt + r * BC + v * VW, P[v]);
                pk->weight = v_hmax(top);
                risen |= 1u << r;
            }
        }
        /* s = cap tanh(x / cap): ds/dx = 1 - tanh^2, rounded once (t^2
         * rounded first would be an ulp of 1 off a factor that nears 0 as
         * the cap saturates) */
        if (f->cap2 != 0.0f)
            for (int v = 0; v < NV; v++) {
                vec tv = v_load(t->th + row * BC + v * VW);
                ds[v] = v_mul(ds[v], v_nfma(tv, tv, v_set1(1.0f)));
            }
        for (int v = 0; v < NV; v++) v_store(dS + v * VW, ds[v]);
    }
    if (risen) note_peaks(f, t, t->peaks + g * BR + r0, risen, r0, j0);
}

/* The gradient tiles of head slot g (head h) for the rows of block br
 * against the keys [j0, j0 + cols) (t's k^T and v^T), each row group that
 * sees some of them, phase one and then phase two; then, a phase of its
 * own, dq (the block's rows, Dp apart) += dS kp, where dq is not NULL. Row
 * groups that see none of the keys are never read. */
static void gradient_tiles(const backward_job *job, const backward_tiles *t, size_t g, size_t b,
                           size_t h, const block_rows *br, size_t j0, size_t cols, float *dq,
                           const float *kp) {
    static const float ones[8] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f}; /* RG <= 8 */
    size_t c0[BR / RG], c1[BR / RG], groups = (br->rows + RG - 1) / RG, Dp = job->f.Dp;
    for (size_t i = 0; i < groups; i++) {
        group_cols(br, i * RG, j0, cols, &c0[i], &c1[i]);
        if (c0[i] < c1[i]) {
            weight_tile(job, t, g, b, h, br, i * RG, j0, cols, c0[i], c1[i]);
        } else if (br->gaps) {
            /* rows that see nothing between rows that see these keys:
             * key_rows' span may cross them, so their weights read as 0 */
            memset(t->A + i * RG * BC, 0, RG * BC * sizeof *t->A);
            memset(t->dS + i * RG * BC, 0, RG * BC * sizeof *t->dS);
        }
    }
    for (size_t i = 0; i < groups; i++)
        if (c0[i] < c1[i]) gradient_tile(job, t, g, br, i * RG, j0, c0[i], c1[i]);
    for (size_t i = 0; dq && i < groups; i++)
        if (c0[i] < c1[i])
            apply_values(dq + i * RG * Dp, Dp, ones, t->dS + i * RG * BC, c0[i], c1[i], kp);
}

/* The query rows [*lo, *hi) of a sequence that see some key of [j0, j1):
 * both ends of every row's keys grow with i, so a binary search on each. */
static void rows_seeing(const flash_shape *f, const attn_attention_seq *seq, size_t j0, size_t j1,
                        size_t *lo, size_t *hi) {
    size_t a = 0, z = seq->q_len; /* first row whose keys end past j0 */
    while (a < z) {
        size_t mid = a + (z - a) / 2, kb, ke;
        attn_visible_keys(f->p, seq, mid, &kb, &ke);
        (void)kb;
        if (ke > j0) z = mid; /* (an empty row past the keys ends there: the next search drops it) */
        else a = mid + 1;
    }
    *lo = a;
    z = seq->q_len; /* first row whose keys begin at j1 or later */
    while (a < z) {
        size_t mid = a + (z - a) / 2, kb, ke;
        attn_visible_keys(f->p, seq, mid, &kb, &ke);
        if (kb >= j1) z = mid;
        else a = mid + 1;
    }
    *hi = a;
}

/* The tiles of the rows from row at of the one pass's packed rows (head
 * slot 0 of rt): qs, q, dO, shift, log_sum, log_lo and delta; the scratch as t's. */
static void rows_tiles(const flash_shape *f, const backward_tiles *t, size_t at,
                       backward_tiles *rt) {
    rt->qs = t->qs_all + at * f->Dp;
    rt->q = rt->qs; /* q * q_scale: dk's factor is scale / q_scale (key_span_gradients) */
    rt->dO = t->dO_all + at * f->Dp;
    rt->shift = t->shift_all + at;
    rt->log_sum = t->log_sum_all + at;
    rt->log_lo = t->log_lo_all + at;
    rt->delta = t->delta_all + at;
}

/* The tiles of key block slot of a span (key_span_gradients): k^T, v^T
 * (D, BC) and dk, dv, k (BC, Dp), each block's own; the rest as t's. */
static backward_tiles slot_tiles(const backward_tiles *t, size_t slot) {
    backward_tiles kt = *t;
    size_t at = slot * t->slot_floats;
    kt.kt += at;
    kt.vt += at;
    kt.kv0 += at;
    kt.kv1 += at;
    kt.kv2 += at;
    return kt;
}

/* dk, dv of the key blocks [j0, j0 + blocks BC) of (b, kvh), each summed
 * over the group's query heads and the query blocks that see its keys, in
 * a fixed order; with dq_sums (one pass), also dq_sums[g][i] += dS k for
 * those rows, and their attn_row_peaks. Each query block's rows serve all
 * the span's key blocks in turn, while they are in cache; each row still
 * meets the key blocks in order, so its sums are those of one block at a
 * time. Per (query block, head), the phases in turn: the gradient tiles
 * (k^T and v^T in L1), dq += dS k, then dv and dk: dq's product out of the
 * tiles' loop leaves k^T and v^T alone in L1 there. */
static void key_span_gradients(const backward_job *job, const backward_tiles *t, size_t b,
                               size_t kvh, const attn_attention_seq *seq, size_t j0,
                               size_t blocks, float *dq_sums) {
    const flash_shape *f = &job->f;
    const attn_attention_problem *p = f->p;
    size_t D = f->D, Dp = f->Dp, rows_pad = f->q_blocks * BR;
    size_t j_end = min_size(seq->kv_len, j0 + blocks * BC);
    blocks = (j_end - j0 + BC - 1) / BC;
    backward_tiles kts[KEY_SPAN];
    for (size_t s = 0; s < blocks; s++) {
        size_t js = j0 + s * BC, cols = min_size(j_end - js, BC);
        kts[s] = slot_tiles(t, s);
        pack_keys_transposed(f, b, seq, kvh, js, cols, kts[s].kt, kts[s].vt);
        if (dq_sums)
            pack_rows((const float *)p->k.data + row_at(p->k.st, b, seq, true, kvh, js), p->k.st.t, cols,
                      BC, D, Dp, 1.0f, kts[s].kv2);
        if (t->magnitudes) { /* every key block once, in cache */
            float *top = t->magnitudes;
            top[1] = max_abs_rows(kts[s].kv2, cols, Dp, D, top[1]);
            top[2] = max_abs_rows((const float *)p->v.data + row_at(p->v.st, b, seq, true, kvh, js),
                                  cols, p->v.st.t, D, top[2]);
        }
        memset(kts[s].kv0, 0, BC * Dp * sizeof *kts[s].kv0);
        memset(kts[s].kv1, 0, BC * Dp * sizeof *kts[s].kv1);
    }
    size_t i_lo, i_hi;
    rows_seeing(f, seq, j0, j_end, &i_lo, &i_hi);
    block_rows br;
    /* query blocks on the grid of BR (one pass: dq_sums' rows) */
    for (size_t i0 = dq_sums ? i_lo / BR * BR : i_lo; i0 < i_hi; i0 += BR) {
        size_t rows = min_size(i_hi - i0, BR);
        rows_of(f, seq, i0, rows, &br);
        for (size_t g = 0; g < f->G; g++) {
            size_t h = kvh * f->G + g;
            backward_tiles rt = *t; /* the rows' tiles: packed now, or once for the item */
            if (dq_sums)
                rows_tiles(f, t, g * rows_pad + i0, &rt);
            else
                pack_queries(job, t, 0, b, seq, h, &br, true);
            /* one pass: each row's sums over the key blocks */
            rt.peaks = dq_sums && t->peaks ? t->peaks_all + g * rows_pad + i0 : NULL;
            rt.resid_lanes = t->resid_lanes_all + (g * rows_pad + i0) * VW;
            for (size_t s = 0; s < blocks; s++) {
                size_t js = j0 + s * BC, cols = min_size(j_end - js, BC);
                const backward_tiles *kt = &kts[s];
                rt.kt = kt->kt;
                rt.vt = kt->vt;
                gradient_tiles(job, &rt, 0, b, h, &br, js, cols,
                               dq_sums ? dq_sums + (g * rows_pad + i0) * Dp : NULL, kt->kv2);
                accumulate_keys(kt->kv1, Dp, t->A, rt.dO, &br, js, cols); /* dv += A^T dO */
                accumulate_keys(kt->kv0, Dp, t->dS, rt.q, &br, js, cols); /* dk += dS^T q  */
            }
        }
    }
    /* dk sums dS^T q, with q scaled by q_scale where the one pass packed it
     * (rows_tiles): 1 for raw scores, 0 where the scale rounds to 0 in
     * float (the packed q then is zero, and so is dk, scale times a sum) */
    float dk_factor = !dq_sums ? p->scale
                      : f->q_scale != 0.0f ? (float)((double)p->scale / f->q_scale)
                                          : 0.0f;
    for (size_t s = 0; s < blocks; s++) {
        size_t js = j0 + s * BC, cols = min_size(j_end - js, BC);
        const float *dk = kts[s].kv0, *dv = kts[s].kv1;
        float *dk_out = (float *)job->g->dk + row_at(p->k.st, b, seq, true, kvh, js);
        float *dv_out = (float *)job->g->dv + row_at(p->v.st, b, seq, true, kvh, js);
        for (size_t jj = 0; jj < cols; jj++) {
            if (p->k.st.t != D && jj + ROWS_AHEAD < cols) {
                prefetch_row_for_write(dk_out + (jj + ROWS_AHEAD) * p->k.st.t, D);
                prefetch_row_for_write(dv_out + (jj + ROWS_AHEAD) * p->v.st.t, D);
            }
            for (size_t d = 0; d < D; d++) {
                dk_out[jj * p->k.st.t + d] = dk[jj * Dp + d] * dk_factor;
                dv_out[jj * p->v.st.t + d] = dv[jj * Dp + d];
            }
        }
    }
}

/* Pass A: one (batch, KV head, key block): its dk, dv. */
static void backward_keys(void *arg, size_t part, size_t item) {
    const backward_job *job = arg;
    const attn_attention_problem *p = job->f.p;
    size_t kb = item % job->f.k_blocks, rest = item / job->f.k_blocks;
    size_t kvh = rest % p->kv_heads, b = rest / p->kv_heads;
    attn_attention_seq seq = attn_attention_seq_of(p, b);
    if (kb * BC >= seq.kv_len) return; /* past this sequence's keys */
    backward_tiles t = tiles_of(job, part);
    key_span_gradients(job, &t, b, kvh, &seq, kb * BC, 1, NULL);
}

/* kmean (D) = the mean of keys [from, to) of (b, kvh), the estimate of
 * each row's weighted key sum_j P_ij k_j that take_consistent_delta
 * corrects dq with; zero with softcap, whose dS carries a factor per key
 * (1 - t^2) that a key's mean cannot stand for, or where no key is. */
static void mean_key(const backward_job *job, size_t b, const attn_attention_seq *seq, size_t kvh,
                     size_t from, size_t to, float *kmean) {
    const attn_attention_problem *p = job->f.p;
    size_t D = job->f.D;
    memset(kmean, 0, D * sizeof *kmean);
    if (job->f.cap2 != 0.0f || from >= to) return;
    const float *k = (const float *)p->k.data + row_at(p->k.st, b, seq, true, kvh, from);
    for (size_t j = 0; j < to - from; j++)
        for (size_t d = 0; d < D; d++) kmean[d] += k[j * p->k.st.t + d];
    float n = (float)(to - from);
    for (size_t d = 0; d < D; d++) kmean[d] /= n;
}

/* The consistent delta (attention.h) of any row: *resid = sum_j dS_ij
 * from its lanes (zero in exact arithmetic), and dS_ij -= P_ij resid for
 * every key, which moves dq_i by resid sum_j P_ij k_j. That sum is not at
 * hand; its estimate is kmean (mean_key) and, for a row whose largest
 * weight passes ATTN_ONE_HOT_WEIGHT, c (k_j* - kmean) with c = resid P_ij*
 * (times softcap's factor): dq_i -= resid kmean + c (k_j* - kmean) (dq_row:
 * dq's unscaled sums). What the estimate misses, resid sum_j P_ij (k_j -
 * kmean) less the one-hot key's part, is small beside resid |k| where the
 * keys share a large component (scores of 1e4 from q, k in one direction),
 * where dx would otherwise lose accuracy against PyTorch float32. With
 * fix_dk (the one pass: dk summed already), dk_j* -= scale c q_i for the
 * one-hot row, and qsum += (resid - c) q_i (resid q_i for another row):
 * the share the keys' mean stands for, which spread_dk takes back from
 * the keys as the mean took it from dq.
 * Whether the row takes the new delta, delta + resid. */
static bool take_consistent_delta(const backward_job *job, const attn_row_peak *pk,
                                  const float *resid_lanes, const float *kmean, size_t b,
                                  const attn_attention_seq *seq, size_t h, size_t i,
                                  float *dq_row, float *qsum, float *resid) {
    const attn_attention_problem *p = job->f.p;
    *resid = v_hsum(v_load(resid_lanes));
    if (*resid == 0.0f) return false;
    size_t kvh = h / job->f.G, D = job->f.D;
    const float *q = (const float *)p->q.data + row_at(p->q.st, b, seq, false, h, i);
    bool one_hot = pk->weight > ATTN_ONE_HOT_WEIGHT;
    if (!one_hot) {
        for (size_t d = 0; d < D; d++) dq_row[d] -= *resid * kmean[d];
        for (size_t d = 0; qsum && d < D; d++) qsum[d] += *resid * q[d];
        return true;
    }
    /* c k + (resid - c) kmean: a row exactly one-hot (weight 1, no
     * softcap) has c = resid and takes back exactly the c k its sweep added */
    float c = *resid * pk->weight * pk->factor, rest = *resid - c;
    const float *k = (const float *)p->k.data + row_at(p->k.st, b, seq, true, kvh, pk->key);
    for (size_t d = 0; d < D; d++) dq_row[d] -= c * k[d] + rest * kmean[d];
    if (qsum) {
        float *dk = (float *)job->g->dk + row_at(p->k.st, b, seq, true, kvh, pk->key);
        for (size_t d = 0; d < D; d++) {
            dk[d] -= p->scale * c * q[d];
            qsum[d] += rest * q[d];
        }
    }
    return true;
}

/* The one pass's dk of (b, kvh) less the transpose of dq's mean-key
 * estimate (take_consistent_delta): dq_i took rest_i times the mean of the
 * keys, as though row i weighed each of them alike, so each key j in
 * [from, to) gives back scale qsum / (to - from), qsum = sum_i rest_i q_i.
 * Without it every key's dk keeps delta's mismatch: their sum is off by
 * scale sum_i resid_i q_i, a direction that keys sharing a large component
 * carry into W_key's gradient whole (x0 times it) while the true gradient
 * is made of the keys' small differences. Softcap, whose mean key is
 * zero, takes nothing. */
static void spread_dk(const backward_job *job, size_t b, const attn_attention_seq *seq, size_t kvh,
                      size_t from, size_t to, float *qsum) {
    const attn_attention_problem *p = job->f.p;
    size_t D = job->f.D;
    if (job->f.cap2 != 0.0f || from >= to) return;
    for (size_t d = 0; d < D; d++) qsum[d] *= (float)((double)p->scale / (double)(to - from));
    float *dk = (float *)job->g->dk + row_at(p->k.st, b, seq, true, kvh, from);
    for (size_t j = 0; j < to - from; j++)
        for (size_t d = 0; d < D; d++) dk[j * p->k.st.t + d] -= qsum[d];
}

/* One pass: one (batch, KV head): dk, dv key block after key block, and
 * dq of the group's heads summed over them in order; then every row's
 * consistent delta (its dq, and dk at a one-hot row's key). */
static void backward_heads(void *arg, size_t part, size_t item) {
    const backward_job *job = arg;
    const flash_shape *f = &job->f;
    const attn_attention_problem *p = f->p;
    size_t kvh = item % p->kv_heads, b = item / p->kv_heads, D = f->D, Dp = f->Dp;
    size_t rows_pad = f->q_blocks * BR;
    attn_attention_seq seq = attn_attention_seq_of(p, b);
    backward_tiles t = tiles_of(job, part);
    memset(t.dq_sums, 0, f->G * rows_pad * Dp * sizeof *t.dq_sums);
    memset(t.peaks_all, 0, f->G * rows_pad * sizeof *t.peaks_all);
    memset(t.resid_lanes_all, 0, f->G * rows_pad * VW * sizeof *t.resid_lanes_all);
    /* every head's rows packed once (not once per key span), on the grid of
     * BR the spans' query blocks use: ALiBi's row shift in the packed lse
     * (block_rows' near) is a row's own */
    block_rows br;
    for (size_t g = 0; g < f->G; g++)
        for (size_t i0 = 0; i0 < seq.q_len; i0 += BR) {
            backward_tiles rt = t;
            rows_tiles(f, &t, g * rows_pad + i0, &rt);
            rows_of(f, &seq, i0, min_size(seq.q_len - i0, BR), &br);
            pack_queries(job, &rt, 0, b, &seq, kvh * f->G + g, &br, false);
            if (t.magnitudes) { /* the rows just packed (q unscaled: raw scores) */
                t.magnitudes[0] = max_abs_rows(rt.qs, br.rows, Dp, D, t.magnitudes[0]);
                t.magnitudes[3] = max_abs_rows(rt.dO, br.rows, Dp, D, t.magnitudes[3]);
            }
        }
    for (size_t j0 = 0; j0 < seq.kv_len; j0 += KEY_SPAN * BC)
        key_span_gradients(job, &t, b, kvh, &seq, j0, KEY_SPAN, t.dq_sums);
    float resid;
    /* the keys some row sees: the spread leaves a key no row sees at 0 */
    size_t seen_lo = seq.kv_len, seen_hi = 0;
    for (size_t i = 0; t.peaks && i < seq.q_len; i++) {
        size_t lo, hi;
        attn_visible_keys(p, &seq, i, &lo, &hi);
        if (lo < hi && lo < seen_lo) seen_lo = lo;
        if (lo < hi && hi > seen_hi) seen_hi = hi;
    }
    float *qsum = t.q; /* the tiles' q is free once the spans are done */
    if (t.peaks) {
        mean_key(job, b, &seq, kvh, 0, seq.kv_len, t.kmean);
        memset(qsum, 0, D * sizeof *qsum);
    }
    for (size_t g = 0; g < f->G && t.peaks; g++) /* rows in order: the same bits */
        for (size_t i = 0; i < seq.q_len; i++)
            take_consistent_delta(job, t.peaks_all + g * rows_pad + i,
                                  t.resid_lanes_all + (g * rows_pad + i) * VW, t.kmean, b, &seq,
                                  kvh * f->G + g, i, t.dq_sums + (g * rows_pad + i) * Dp, qsum,
                                  &resid);
    if (t.peaks) spread_dk(job, b, &seq, kvh, seen_lo, seen_hi, qsum);
    for (size_t g = 0; g < f->G; g++) {
        float *dq = (float *)job->g->dq + row_at(p->q.st, b, &seq, false, kvh * f->G + g, 0);
        for (size_t i = 0; i < seq.q_len; i++) {
            if (p->q.st.t != D && i + ROWS_AHEAD < seq.q_len)
                prefetch_row_for_write(dq + (i + ROWS_AHEAD) * p->q.st.t, D);
            for (size_t d = 0; d < D; d++)
                dq[i * p->q.st.t + d] = t.dq_sums[(g * rows_pad + i) * Dp + d] * p->scale;
        }
    }
}

/* Pass B: one (batch, KV head, chunk of heads, query block): dq of each
 * head over the key blocks its rows see, each packed once for the heads;
 * every row takes the consistent delta, and leaves it to pass A. */
static void backward_queries(void *arg, size_t part, size_t item) {
    const backward_job *job = arg;
    const flash_shape *f = &job->f;
    const attn_attention_problem *p = f->p;
    size_t D = f->D, Dp = f->Dp;
    query_item it = query_item_of(f, item, false);
    attn_attention_seq seq = attn_attention_seq_of(p, it.b);
    size_t i0 = it.qb * BR, b = it.b;
    if (i0 >= seq.q_len || it.heads == 0) return;
    size_t rows = min_size(seq.q_len - i0, BR);
    backward_tiles t = tiles_of(job, part);
    float *kp = t.kv0;
    block_rows br;
    rows_of(f, &seq, i0, rows, &br);
    for (size_t g = 0; g < it.heads; g++) {
        pack_queries(job, &t, g, b, &seq, it.h0 + g, &br, false);
        memset(t.dq + g * BR * Dp, 0, BR * Dp * sizeof *t.dq);
    }
    if (t.peaks) {
        memset(t.peaks, 0, it.heads * BR * sizeof *t.peaks);
        memset(t.resid_lanes, 0, it.heads * BR * VW * sizeof *t.resid_lanes);
    }
    size_t k_at = row_at(p->k.st, b, &seq, true, it.kvh, 0);
    for (size_t j0 = sweep_start(&br, BC); j0 < br.last; j0 += BC) {
        size_t cols = min_size(br.last - j0, BC);
        pack_keys_transposed(f, b, &seq, it.kvh, j0, cols, t.kt, t.vt);
        pack_rows((const float *)p->k.data + k_at + j0 * p->k.st.t, p->k.st.t, cols, BC, D, Dp, 1.0f, kp);
        for (size_t g = 0; g < it.heads; g++)
            gradient_tiles(job, &t, g, b, it.h0 + g, &br, j0, cols, t.dq + g * BR * Dp, kp);
    }
    if (t.peaks) mean_key(job, b, &seq, it.kvh, sweep_start(&br, BC), br.last, t.kmean);
    for (size_t g = 0; g < it.heads && t.peaks; g++)
        for (size_t r = 0; r < rows; r++) {
            float resid;
            if (take_consistent_delta(job, t.peaks + g * BR + r, t.resid_lanes + (g * BR + r) * VW,
                                      t.kmean, b, &seq, it.h0 + g, i0 + r,
                                      t.dq + g * BR * Dp + r * Dp, NULL, &resid))
                job->delta[attn_lse_index(p, b, it.h0 + g, i0 + r)] =
                    (float)((double)t.delta[g * BR + r] + resid);
        }
    for (size_t g = 0; g < it.heads; g++) {
        float *dq = (float *)job->g->dq + row_at(p->q.st, b, &seq, false, it.h0 + g, i0);
        for (size_t r = 0; r < rows; r++)
            for (size_t d = 0; d < D; d++)
                dq[r * p->q.st.t + d] = t.dq[g * BR * Dp + r * Dp + d] * p->scale;
    }
}

typedef struct delta_job {
    const flash_shape *f;
    const float *dout;
    float *delta;
} delta_job;

/* delta_i = dO_i . O_i (less dlse_i) for the rows of (batch, head)s
 * [begin, end). */
static void delta_rows(void *arg, size_t begin, size_t end) {
    const delta_job *job = arg;
    const attn_attention_problem *p = job->f->p;
    for (size_t bh = begin; bh < end; bh++) {
        size_t b = bh / p->q_heads, h = bh % p->q_heads;
        attn_attention_seq seq = attn_attention_seq_of(p, b);
        for (size_t i = 0; i < seq.q_len; i++) {
            size_t off = row_at(p->out.st, b, &seq, false, h, i);
            /* four sums in double: one chain would be latency-bound */
            const float *dO = job->dout + off, *o = (float *)p->out.data + off;
            double sum[4] = {0.0, 0.0, 0.0, 0.0};
            size_t d = 0, D = job->f->D;
            if (p->out.st.t != D && i + ROWS_AHEAD < seq.q_len) {
                prefetch_row(dO + ROWS_AHEAD * p->out.st.t, D);
                prefetch_row(o + ROWS_AHEAD * p->out.st.t, D);
            }
            for (; d + 4 <= D; d += 4)
                for (int k = 0; k < 4; k++) sum[k] += (double)dO[d + k] * o[d + k];
            for (; d < D; d++) sum[0] += (double)dO[d] * o[d];
            size_t at = attn_lse_index(p, b, h, i);
            double dot = (sum[0] + sum[1]) + (sum[2] + sum[3]);
            job->delta[at] = (float)(p->dlse ? dot - p->dlse[at] : dot);
        }
    }
}

/* The weight of head h's sink in row at, e^(sink - lse): from the
 * forward's row statistics, e^(sink - m scale) / l, where the backward
 * takes them (own_stats; raw scores) and the sink lies below m scale;
 * else from lse and lse_lo, which round near the sink where it dominates
 * the row. */
static double sink_weight(const backward_job *job, size_t at, float sink) {
    const attn_flash_rows *rs = &job->rows;
    const float *stats = own_stats(rs, at);
    if (job->f.raw && stats) {
        double d = (double)sink - (double)stats[0] * job->f.p->scale;
        if (d <= 0.0) return exp(d) / (double)stats[1];
    }
    return exp((double)sink - ((double)rs->lse[at] + (rs->lse_lo ? rs->lse_lo[at] : 0.0)));
}

/* The backward's items run with float results below 2^-126 flushed to zero
 * (flush_zero.h, attn_flushed_item). Under ALiBi a row's far keys weigh
 * 2^-64 .. 2^-125, and dS = P (dP - delta) and its products with q and k
 * come out subnormal, each a microcode assist; flushed, only values below
 * float's normal range change, where the reference's are subnormal. */

static void flash_backward(attn_workers w, const attn_attention_problem *p,
                           const attn_attention_dropout *drop, const attn_flash_bias *bias,
                           const attn_attention_grads *g, attn_flash_rows rows, float *delta,
                           float *workspace, float magnitudes[4]) {
    backward_job job = {.f = flash_shape_of(p, drop), .g = g, .rows = rows, .delta = delta,
                        .workspace = workspace, .per_part = backward_workspace(p),
                        .consistent = attn_consistent_delta(p),
                        .measure = magnitudes != NULL && backward_measures(p, drop)};
    job.f.bias = bias;
    size_t BH = p->batch * p->q_heads;
    delta_job dj = {&job.f, (const float *)g->dout, delta};
    size_t min_heads = 1024 / (p->q_len + 1) + 1;
    attn_pool_for(w.pool, w.threads, BH, min_heads, delta_rows, &dj);
    /* dsinks[h] = -sum_{b,i} exp(sink_h - lse) delta: the sink's weight
     * times (its dP = 0) - delta, in a fixed order */
    if (p->sinks && g->dsinks)
        for (size_t h = 0; h < p->q_heads; h++) {
            double sum = 0.0;
            for (size_t b = 0; b < p->batch; b++) {
                attn_attention_seq seq = attn_attention_seq_of(p, b);
                for (size_t i = 0; i < seq.q_len; i++) {
                    size_t at = attn_lse_index(p, b, h, i);
                    sum += sink_weight(&job, at, p->sinks[h]) * delta[at];
                }
            }
            g->dsinks[h] = (float)-sum;
        }
    if (magnitudes)
        for (int t = 0; t < 4; t++) magnitudes[t] = INFINITY; /* unmeasured */
    if (one_pass_floats(p)) {
        attn_flushed_items heads = {backward_heads, &job};
        attn_pool_dynamic(w.pool, w.threads, p->batch * p->kv_heads, attn_flushed_item, &heads);
        if (job.measure)
            parts_magnitudes(workspace, job.per_part, attn_parallel_parts(w.threads), 4,
                             magnitudes);
        return;
    }
    /* B first: it leaves every row's consistent delta for A */
    attn_flushed_items queries = {backward_queries, &job}, keys = {backward_keys, &job};
    attn_pool_dynamic(w.pool, w.threads, p->batch * p->kv_heads * job.f.chunks * job.f.q_blocks,
                      attn_flushed_item, &queries);
    attn_pool_dynamic(w.pool, w.threads, p->batch * p->kv_heads * job.f.k_blocks, attn_flushed_item,
                      &keys);
}

/* ---- the scan for inputs the fast path must not take ---------------------- */

/* max(top, |x|) over rows rows of n floats (row stride st), inf when some x
 * is inf or NaN: x * 0 is NaN exactly then, and a sum of those is NaN if
 * one is. Four chains of each, carried across the rows and reduced once:
 * a reduction per row of one chain would make the scan latency-bound, well
 * short of the memory's speed. */
static float max_abs_rows(const float *x, size_t rows, size_t st, size_t n, float top) {
    vec largest[4], poison[4], zero = v_zero();
    for (int c = 0; c < 4; c++) largest[c] = poison[c] = zero;
    float m = 0.0f, bad = 0.0f;
    for (size_t r = 0; r < rows; r++) {
        const float *x_r = x + r * st;
        size_t i = 0;
        for (; i + 4 * VW <= n; i += 4 * VW)
            for (int c = 0; c < 4; c++) {
                vec v = v_load(x_r + i + c * VW);
                largest[c] = v_max(largest[c], v_abs(v));
                poison[c] = v_fma(v, zero, poison[c]);
            }
        for (; i + VW <= n; i += VW) {
            vec v = v_load(x_r + i);
            largest[0] = v_max(largest[0], v_abs(v));
            poison[0] = v_fma(v, zero, poison[0]);
        }
        for (; i < n; i++) {
            float a = fabsf(x_r[i]);
            m = a > m ? a : m;
            bad += x_r[i] * 0.0f;
        }
    }
    float lm = v_hmax(v_max(v_max(largest[0], largest[1]), v_max(largest[2], largest[3])));
    bad += v_hsum(v_add(v_add(poison[0], poison[1]), v_add(poison[2], poison[3])));
    m = lm > m ? lm : m;
    if (bad != bad) return INFINITY;
    return m > top ? m : top;
}

static float max_abs(const float *x, size_t n, float top) { return max_abs_rows(x, 1, n, n, top); }

/* ---- the table ------------------------------------------------------------- */

const attn_flash_kernels FLASH_KERNELS = {
    .name = FLASH_ISA_NAME,
    .max_abs = max_abs,
    .max_abs_rows = max_abs_rows,
    .forward_workspace = forward_workspace,
    .forward_measures = forward_measures,
    .forward = flash_forward,
    .backward_workspace = backward_workspace,
    .backward_measures = backward_measures,
    .backward = flash_backward,
};
