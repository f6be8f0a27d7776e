/*
 * flex_kernel.h — the flex kernels (flex.h), written once over the vector
 * vocabulary and compiled once per instruction set: flex_portable.c,
 * flex_avx2.c and flex_avx512.c include their kernels/vec/vec_*.h, define
 *   RG             rows of the register tile
 *   NV             vectors of the register tile's row (CW = NV * VW columns)
 *   FLEX_KERNELS   the name of the attn_flex_kernels table to define
 *   FLEX_ISA_NAME  "avx2", ...
 * and include this.
 *
 * Every product of the passes is one register-tile product (tile_mm): C
 * (RG rows x CW columns at a time, in registers) += A B over an inner
 * dimension walked in order, A read through two strides so that a tile
 * and its transpose (P^T dO, dS^T q) are both operands without a copy.
 * Buffers are padded to whole register tiles: rows to RG, columns to CW;
 * padded key columns hold -inf scores (weight 0) and zero k and v, and
 * padded rows of q and dO are zero, so padding never reaches an output.
 *
 * A tile's scores are s = (q . k) * scale in float, the chain applied to
 * the tile in place (in vectors but for BIAS, read through its strides;
 * ALiBi and the relative tables by distance; CALLBACK hands the tile
 * itself), then the mask, so that a modifier sees every element of the
 * tile, as flex_attention's score_mod sees every score. The weights are
 * exp2((s - m) log2 e) against the running row max m.
 */
#include "kernels/flex/flex.h"
#include "kernels/flush_zero.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define CW (NV * VW)
_Static_assert(CW % RG == 0, "a key block padded to CW is whole row groups");
#define FLEX_LOG2E 1.4426950408889634
/* Block sizes with no map: flex_attention's defaults. */
#define FLEX_DEFAULT_BLOCK 64

static size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }
static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }
static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* ---- geometry and workspace ------------------------------------------------ */

typedef struct flex_geom {
    const attn_attention_problem *p;
    const attn_block_map *map; /* NULL: every block, cut by the rows' intervals */
    size_t bq, bkv, q_blocks, kv_blocks, G;
    size_t bqp, bkvp, Dp, Dvp; /* padded to RG, CW, CW, CW */
    size_t stored;             /* modifiers whose input the backward recomputes (softcap, callback) */
} flex_geom;

static bool keeps_input(attn_score_mod_kind kind) {
    return kind == ATTN_SCORE_SOFTCAP || kind == ATTN_SCORE_CALLBACK;
}

static flex_geom geom_of(const attn_attention_problem *p) {
    flex_geom g = {.p = p, .map = p->block_map};
    g.bq = g.map ? g.map->block_q : FLEX_DEFAULT_BLOCK;
    g.bkv = g.map ? g.map->block_kv : FLEX_DEFAULT_BLOCK;
    g.q_blocks = (p->q_len + g.bq - 1) / g.bq;
    g.kv_blocks = (p->kv_len + g.bkv - 1) / g.bkv;
    g.G = p->q_heads / p->kv_heads;
    g.bqp = round_up(g.bq, RG);
    g.bkvp = round_up(g.bkv, CW);
    g.Dp = round_up(p->head_dim, CW);
    g.Dvp = round_up(p->v_head_dim, CW);
    for (size_t k = 0; k < p->score_mod_count; k++)
        if (keeps_input(p->score_mods[k].kind)) g.stored++;
    return g;
}

/* One part's tiles (all 64-byte aligned). */
typedef struct flex_tiles {
    float *q, *dout;     /* bqp x Dp, bqp x Dvp: rows of one head */
    float *kt, *vt;      /* D x bkvp, Dv x bkvp: a key block transposed */
    float *s, *pm, *dp;  /* bqp x bkvp: scores, weights, dP then dS */
    float *inputs;       /* stored x bqp x bkvp: the kept modifiers' inputs */
    float *acc;          /* bqp x max(Dp, Dvp): out or dq */
    float *dk, *dv;      /* bkvp x Dp, bkvp x Dvp */
    float *m, *l, *lse, *lse_lo, *delta; /* bqp each */
    size_t *beg, *end;   /* bqp each: the rows' visible keys */
    /* bqp each, summed by grad_tile where sums is set (the rows pass of a
     * consistent delta): sum_j dS_ij, the largest weight, its key */
    float *resid, *peak;
    size_t *peak_key;
    /* with sums, per row (stored floats, a row's together): each softcap's
     * factor d cap tanh(x / cap) / dx at the largest weight's key, as
     * chain_backward takes it there */
    float *peak_factor;
    /* with sums: the keys of the tiles the rows' sweep visits, summed
     * (Dp) and counted, whose mean stands for each row's sum_j P_ij k_j
     * in its consistent delta (consistent_dq); the keys' passes take
     * ksum for the spread of a key block (spread_block) */
    float *ksum, *kcount;
    bool sums;
    bool weighed; /* the last grad_tile gave some row a weight */
} flex_tiles;

/* Lays the tiles out from base (NULL: only counts); returns the floats. */
static size_t carve(const flex_geom *g, float *base, flex_tiles *t) {
    const attn_attention_problem *p = g->p;
    size_t at = 0, score = g->bqp * g->bkvp;
#define PIECE(field, floats)                                       \
    do {                                                           \
        if (base) t->field = (void *)(base + at);                  \
        at += round_up((floats), 16);                              \
    } while (0)
    PIECE(q, g->bqp * g->Dp);
    PIECE(dout, g->bqp * g->Dvp);
    PIECE(kt, p->head_dim * g->bkvp);
    PIECE(vt, p->v_head_dim * g->bkvp);
    PIECE(s, score);
    PIECE(pm, score);
    PIECE(dp, score);
    PIECE(inputs, g->stored * score);
    PIECE(acc, g->bqp * max_sz(g->Dp, g->Dvp));
    PIECE(dk, g->bkvp * g->Dp);
    PIECE(dv, g->bkvp * g->Dvp);
    PIECE(m, g->bqp);
    PIECE(l, g->bqp);
    PIECE(lse, g->bqp);
    PIECE(lse_lo, g->bqp);
    PIECE(delta, g->bqp);
    PIECE(beg, g->bqp * sizeof(size_t) / sizeof(float));
    PIECE(end, g->bqp * sizeof(size_t) / sizeof(float));
    PIECE(resid, g->bqp);
    PIECE(peak, g->bqp);
    PIECE(peak_key, g->bqp * sizeof(size_t) / sizeof(float));
    PIECE(peak_factor, g->bqp * g->stored);
    PIECE(ksum, g->Dp);
    PIECE(kcount, 1);
#undef PIECE
    return at;
}

/* Whether the backward sums modifier m's tensor gradient. */
static bool graded(const attn_score_mod *m) {
    return (m->kind == ATTN_SCORE_BIAS || attn_score_mod_relative(m->kind)) && m->tensor_grad;
}

/* The backward runs in one pass where there are items enough to share out
 * (4 keep the 2-4 cores of the machines here busy) and a part's dq sums
 * fit; the choice depends on the problem alone, as the fused kernels'. */
#define ONE_PASS_ITEMS 4
#define ONE_PASS_FLOATS ((size_t)1 << 24)

/* Floats of a part's one-pass scratch (k's rows of a key block, then dq
 * sums of the group's heads over every query block), or 0 when the two
 * passes run.
 *   One pass, per (batch, KV head): for each key block in order, the
 *     tiles of its column: P, dP, dS once; dv, dk of the block, and each
 *     tile's rows' dq summed. Five products per tile (S, dP, dv, dk, dq).
 *   Two passes (dk, dv per key block; dq per query block) recompute S and
 *     dP in each: seven products per tile, any number of items.
 * A row's dq sums the same products over the same key blocks in the same
 * (ascending) order either way, so both give the same bits. Modifiers
 * whose tensor gradient is summed keep the two passes, where the rows
 * pass owns those sums. */
static size_t one_pass_floats(const flex_geom *g) {
    const attn_attention_problem *p = g->p;
    for (size_t k = 0; k < p->score_mod_count; k++)
        if (graded(&p->score_mods[k])) return 0;
    size_t head = g->q_blocks * g->bqp;
    if (p->batch * p->kv_heads < ONE_PASS_ITEMS || head > ONE_PASS_FLOATS / (g->G * g->Dp))
        return 0;
    /* and the rows' sums of a consistent delta: resid, peak, its key;
     * per query block, its sweep's keys summed and counted, its rows'
     * share for the keys (block_qsum); per row the softcaps' factors at
     * its peak; and per tile whether it weighed */
    size_t blocks = g->G * g->q_blocks;
    return round_up(g->bkvp * g->Dp, 16) + g->G * head * g->Dp + 2 * round_up(g->G * head, 16) +
           round_up(g->G * head * sizeof(size_t) / sizeof(float), 16) + blocks * g->Dp +
           round_up(blocks, 16) + round_up(blocks * g->Dp, 16) +
           round_up(g->G * head * g->stored, 16) + round_up((blocks * g->kv_blocks + 3) / 4, 16);
}

/* The one pass's scratch past k's rows: dq sums (G x head rows of Dp),
 * then per row resid, peak and the peak's key, then per query block of
 * each head the keys' sum (Dp) and count (flex_tiles' fields) and its
 * rows' share qs (Dp), then per row the softcaps' factors at its peak
 * (stored floats), then per tile (query block of a head, key block)
 * whether it gave some row a weight. */
typedef struct one_pass_sums {
    float *dq, *resid, *peak;
    size_t *peak_key;
    float *ksum, *kcount, *qs, *peak_factor;
    unsigned char *weighed;
} one_pass_sums;

static one_pass_sums one_pass_sums_at(const flex_geom *g, float *dq) {
    size_t head = g->q_blocks * g->bqp;
    one_pass_sums o = {.dq = dq, .resid = dq + g->G * head * g->Dp};
    o.peak = o.resid + round_up(g->G * head, 16);
    o.peak_key = (size_t *)(void *)(o.peak + round_up(g->G * head, 16));
    o.ksum = (float *)(void *)o.peak_key +
             round_up(g->G * head * sizeof(size_t) / sizeof(float), 16);
    o.kcount = o.ksum + g->G * g->q_blocks * g->Dp;
    o.qs = o.kcount + round_up(g->G * g->q_blocks, 16);
    o.peak_factor = o.qs + round_up(g->G * g->q_blocks * g->Dp, 16);
    o.weighed = (unsigned char *)(void *)(o.peak_factor + round_up(g->G * head * g->stored, 16));
    return o;
}

static size_t flex_part_floats(const attn_attention_problem *p, bool backward) {
    flex_geom g = geom_of(p);
    return carve(&g, NULL, NULL) + (backward ? one_pass_floats(&g) : 0);
}

/* ---- the register tile -------------------------------------------------------- */

/* C (rows x cols, row stride ldc) = A B, or C += A B (accumulate): A's
 * element (r, t) at a[r * ars + t * aks], B (inner x cols, row stride
 * ldb); rows a multiple of RG, cols of CW. The inner sum runs t = 0, 1,
 * ... in order for every element. */
static void tile_mm(const float *a, size_t ars, size_t aks, const float *bm, size_t ldb,
                    size_t inner, float *c, size_t ldc, size_t rows, size_t cols,
                    bool accumulate) {
    for (size_t r0 = 0; r0 < rows; r0 += RG) {
        for (size_t c0 = 0; c0 < cols; c0 += CW) {
            vec x[RG][NV];
            for (int r = 0; r < RG; r++)
                for (int v = 0; v < NV; v++)
                    x[r][v] = accumulate ? v_load(c + (r0 + r) * ldc + c0 + v * VW) : v_zero();
            const float *ap = a + r0 * ars, *bp = bm + c0;
            for (size_t t = 0; t < inner; t++) {
                vec bv[NV];
                for (int v = 0; v < NV; v++) bv[v] = v_load(bp + t * ldb + v * VW);
                for (int r = 0; r < RG; r++) {
                    vec ar = v_set1(ap[r * ars + t * aks]);
                    for (int v = 0; v < NV; v++) x[r][v] = v_fma(ar, bv[v], x[r][v]);
                }
            }
            for (int r = 0; r < RG; r++)
                for (int v = 0; v < NV; v++) v_store(c + (r0 + r) * ldc + c0 + v * VW, x[r][v]);
        }
    }
}

/* ---- packing ------------------------------------------------------------------ */

/* Rows [i0, i0 + nr) of head h of sequence b (its first packed token
 * start) of view x (width n) into dst (row stride ld), zeros past n and in
 * the rows up to bqp. */
static void pack_rows(const float *x, attn_view_strides st, size_t b, size_t start, size_t h,
                      size_t i0, size_t nr, size_t n, float *dst, size_t ld, size_t rows) {
    for (size_t r = 0; r < rows; r++) {
        float *d = dst + r * ld;
        if (r < nr) {
            memcpy(d, x + attn_view_offset(st, b, start, h, i0 + r), n * sizeof(float));
            memset(d + n, 0, (ld - n) * sizeof(float));
        } else {
            memset(d, 0, ld * sizeof(float));
        }
    }
}

/* Keys [j0, j0 + nc) of KV head kh of sequence b (its first packed key
 * start, width n) transposed into dst (n x ld), zeros in the columns past
 * nc. */
static void pack_transposed(const float *x, attn_view_strides st, size_t b, size_t start,
                            size_t kh, size_t j0, size_t nc, size_t n, float *dst, size_t ld) {
    for (size_t d = 0; d < n; d++) memset(dst + d * ld + nc, 0, (ld - nc) * sizeof(float));
    for (size_t j = 0; j < nc; j++) {
        const float *src = x + attn_view_offset(st, b, start, kh, j0 + j);
        for (size_t d = 0; d < n; d++) dst[d * ld + j] = src[d];
    }
}

/* ---- which tiles ------------------------------------------------------------- */

/* The key blocks of a map row (or the query blocks of a map column), in
 * ascending order, each full (tile SIZE_MAX) or partial (its bits' tile);
 * with no map, every block. */
typedef struct flex_walk {
    const uint32_t *full, *part;
    const size_t *part_tile;
    size_t nf, np, fi, pi;
    size_t count, next; /* no map: blocks next .. count - 1 */
    bool mapped;
} flex_walk;

static flex_walk walk_row(const flex_geom *g, size_t b, size_t h, size_t qb) {
    flex_walk w = {.count = g->kv_blocks, .mapped = g->map != NULL};
    if (!g->map) return w;
    const attn_block_map *m = g->map;
    size_t r = attn_block_map_row(m, b, h, qb);
    w.full = m->full + m->full_at[r];
    w.nf = m->full_at[r + 1] - m->full_at[r];
    w.part = m->part + m->part_at[r];
    w.part_tile = m->part_tile + m->part_at[r];
    w.np = m->part_at[r + 1] - m->part_at[r];
    return w;
}

static flex_walk walk_column(const flex_geom *g, size_t b, size_t h, size_t kb) {
    flex_walk w = {.count = g->q_blocks, .mapped = g->map != NULL};
    if (!g->map) return w;
    const attn_block_map *m = g->map;
    size_t c = attn_block_map_column(m, b, h, kb);
    w.full = m->t_full + m->t_full_at[c];
    w.nf = m->t_full_at[c + 1] - m->t_full_at[c];
    w.part = m->t_part + m->t_part_at[c];
    w.part_tile = m->t_part_tile + m->t_part_at[c];
    w.np = m->t_part_at[c + 1] - m->t_part_at[c];
    return w;
}

static bool walk_next(flex_walk *w, size_t *block, size_t *tile) {
    if (!w->mapped) {
        if (w->next >= w->count) return false;
        *block = w->next++;
        *tile = SIZE_MAX;
        return true;
    }
    bool has_f = w->fi < w->nf, has_p = w->pi < w->np;
    if (!has_f && !has_p) return false;
    if (has_f && (!has_p || w->full[w->fi] < w->part[w->pi])) {
        *block = w->full[w->fi++];
        *tile = SIZE_MAX;
    } else {
        *block = w->part[w->pi];
        *tile = w->part_tile[w->pi++];
    }
    return true;
}

/* The rows of query block qb (keys of key block kb) that sequence s has:
 * 0 past its length. Blocks are cut from each sequence's first token, in
 * its own positions, as the map's are; with packed sequences the geometry
 * is the longest's and a map may be longer still, so a block of the walk
 * may lie past a shorter sequence. */
static size_t seq_rows(const flex_geom *g, const attn_attention_seq *s, size_t qb) {
    size_t i0 = qb * g->bq;
    return i0 < s->q_len ? min_sz(g->bq, s->q_len - i0) : 0;
}

static size_t seq_keys(const flex_geom *g, const attn_attention_seq *s, size_t kb) {
    size_t j0 = kb * g->bkv;
    return j0 < s->kv_len ? min_sz(g->bkv, s->kv_len - j0) : 0;
}

/* The visible keys [beg, end) of rows [i0, i0 + nr) of sequence b
 * (causal, window and the map's row intervals). */
static void row_ranges(const attn_attention_problem *p, size_t b, size_t i0, size_t nr,
                       size_t *beg, size_t *end) {
    attn_attention_seq s = attn_attention_seq_of(p, b);
    for (size_t r = 0; r < nr; r++) attn_visible_keys(p, &s, i0 + r, &beg[r], &end[r]);
}

enum { COVER_NONE = 0, COVER_ALL = 1, COVER_SOME = 2 };

/* Whether the rows' intervals reach keys [j0, j0 + nc): none, all of them
 * in every row, or some. */
static int ranges_cover(const size_t *beg, const size_t *end, size_t nr, size_t j0, size_t nc) {
    bool any = false, all = true;
    for (size_t r = 0; r < nr; r++) {
        size_t lo = beg[r] > j0 ? beg[r] : j0, hi = end[r] < j0 + nc ? end[r] : j0 + nc;
        if (lo < hi) any = true;
        if (beg[r] > j0 || end[r] < j0 + nc) all = false;
    }
    return !any ? COVER_NONE : all ? COVER_ALL : COVER_SOME;
}

/* ---- the score tile ---------------------------------------------------------- */

/* Where a tile is, for the chain and for a failure's message. */
typedef struct flex_at {
    size_t b, h, i0, nr, j0, nc, tile; /* tile: the map's bits, SIZE_MAX for none */
    int cover;
    size_t item;
} flex_at;

static void record_failure(attn_flex_failure *f, const flex_at *at, size_t mod, int code,
                           bool backward) {
    if (f->failed && f->item <= at->item) return;
    *f = (attn_flex_failure){.failed = true, .item = at->item, .code = code, .mod = mod,
                             .b = at->b, .h = at->h, .q0 = at->i0, .kv0 = at->j0,
                             .rows = at->nr, .cols = at->nc, .backward = backward};
}

/*
 * Modifiers that depend on a score's distance j - i alone (ALiBi, the
 * relative tables) take each distance's term once per tile, nr + nc - 1 of
 * them, into a buffer by distance: row r's terms are then the buffer's
 * contiguous run from the tile's largest distance back, added a vector at
 * a time. Each score gets the same term in the same one addition as an
 * element-by-element loop would give it.
 */
enum { BY_DISTANCE = 2 * ATTN_BLOCK_MAP_MAX_BLOCK + VW };
_Static_assert(FLEX_DEFAULT_BLOCK <= ATTN_BLOCK_MAP_MAX_BLOCK, "a tile fits the distance buffer");

/* The tile's smallest distance j - i: its last row's first key. */
static inline int64_t first_distance(const flex_at *at) {
    return (int64_t)at->j0 - (int64_t)(at->i0 + at->nr - 1);
}

/* buf (BY_DISTANCE floats) with the padded columns' distances, past the
 * tile's nr + nc - 1, holding 0: row r reads round_up(nc, VW) of them. */
static inline float *by_distance(const flex_at *at, float *buf) {
    for (size_t e = at->nr - 1 + at->nc; e < at->nr - 1 + round_up(at->nc, VW); e++) buf[e] = 0.0f;
    return buf;
}

/* s (nr rows, stride ld) += the terms by distance of each score. */
static inline void add_by_distance(const flex_at *at, const float *by, float *s, size_t ld) {
    size_t cols = round_up(at->nc, VW);
    for (size_t r = 0; r < at->nr; r++) {
        const float *terms = by + (at->nr - 1 - r); /* row r's key 0 is distance j0 - i0 - r */
        for (size_t c = 0; c < cols; c += VW)
            v_store(s + r * ld + c, v_add(v_load(s + r * ld + c), v_load(terms + c)));
    }
}

/* out with the NaN lanes of in put back: the vector exp2 (under v_tanh,
 * and in softcap's gradient) gives 0 for NaN, where the scalar functions
 * and the reference give NaN, and a NaN score must reach its row's sum. */
static inline vec keep_nan(vec in, vec out) {
    if (!v_any_nan(in)) return out;
    float x[VW], y[VW];
    v_store(x, in);
    v_store(y, out);
    for (size_t i = 0; i < VW; i++)
        if (x[i] != x[i]) y[i] = x[i];
    return v_load(y);
}

/* The chain on the tile s (row stride ld) in order; keeps each kept
 * modifier's input in inputs when that is not NULL. False when a callback
 * failed (recorded in f). */
static bool apply_chain(const flex_geom *g, const attn_flex_args *a, const flex_at *at, float *s,
                        size_t ld, float *inputs, attn_flex_failure *f) {
    const attn_attention_problem *p = g->p;
    size_t slot = 0, score = g->bqp * g->bkvp, T = p->q_len;
    float by_d[BY_DISTANCE];
    for (size_t k = 0; k < p->score_mod_count; k++) {
        const attn_score_mod *m = &p->score_mods[k];
        if (inputs && keeps_input(m->kind)) {
            float *keep = inputs + slot++ * score;
            for (size_t r = 0; r < at->nr; r++)
                memcpy(keep + r * ld, s + r * ld, at->nc * sizeof(float));
        }
        switch (m->kind) {
        case ATTN_SCORE_SCALE: {
            vec factor = v_set1((float)m->value);
            size_t cols = round_up(at->nc, VW);
            for (size_t r = 0; r < at->nr; r++)
                for (size_t c = 0; c < cols; c += VW)
                    v_store(s + r * ld + c, v_mul(v_load(s + r * ld + c), factor));
            break;
        }
        case ATTN_SCORE_SOFTCAP: {
            vec cap = v_set1((float)m->value), inv = v_set1((float)(1.0 / m->value));
            size_t cols = round_up(at->nc, VW);
            for (size_t r = 0; r < at->nr; r++)
                for (size_t c = 0; c < cols; c += VW) {
                    float *x = s + r * ld + c;
                    vec in = v_load(x);
                    v_store(x, keep_nan(in, v_mul(cap, v_tanh(v_mul(in, inv)))));
                }
            break;
        }
        case ATTN_SCORE_ALIBI: {
            float slope = m->tensor[at->h];
            float *by = by_distance(at, by_d);
            int64_t d0 = first_distance(at) - m->offset; /* ALiBi's distance of by[0] */
            for (size_t e = 0; e < at->nr - 1 + at->nc; e++) {
                int64_t d = d0 + (int64_t)e;
                by[e] = m->signed_distance ? slope * (float)d : -slope * (float)(d < 0 ? -d : d);
            }
            add_by_distance(at, by, s, ld);
            break;
        }
        case ATTN_SCORE_BIAS: {
            const float *base = m->tensor + at->b * m->strides[0] + at->h * m->strides[1];
            for (size_t r = 0; r < at->nr; r++) {
                const float *row = base + (at->i0 + r) * m->strides[2];
                for (size_t c = 0; c < at->nc; c++) s[r * ld + c] += row[(at->j0 + c) * m->strides[3]];
            }
            break;
        }
        case ATTN_SCORE_REL_BIAS:
        case ATTN_SCORE_REL_TABLE: { /* the element per distance: fill_buckets */
            const float *table = m->tensor + at->h * m->buckets;
            const int32_t *bucket = a->buckets[k] + (T - 1) + first_distance(at);
            float *by = by_distance(at, by_d);
            for (size_t e = 0; e < at->nr - 1 + at->nc; e++) by[e] = table[bucket[e]];
            add_by_distance(at, by, s, ld);
            break;
        }
        case ATTN_SCORE_CALLBACK: {
            attn_score_tile tile = {at->b, at->h, at->i0, at->j0, at->nr, at->nc, ld, s};
            int code = m->fn(m->user, &tile);
            if (code != 0) {
                record_failure(f, at, k, code, false);
                return false;
            }
            break;
        }
        }
    }
    return true;
}

/* -inf where the map's bits or the rows' intervals hide a key, and in the
 * padded columns. */
static void mask_tile(const flex_geom *g, const flex_at *at, float *s, size_t ld,
                      const size_t *beg, const size_t *end) {
    if (at->tile != SIZE_MAX) {
        const attn_block_map *m = g->map;
        for (size_t r = 0; r < at->nr; r++) {
            const uint64_t *bits = m->bits + (at->tile * m->block_q + r) * m->words_per_row;
            for (size_t w = 0; w * 64 < at->nc; w++) {
                uint64_t word = bits[w];
                if (word == ~(uint64_t)0) continue;
                size_t top = min_sz(at->nc, w * 64 + 64);
                for (size_t c = w * 64; c < top; c++)
                    if (!((word >> (c & 63)) & 1u)) s[r * ld + c] = -INFINITY;
            }
        }
    }
    if (at->cover == COVER_SOME) {
        for (size_t r = 0; r < at->nr; r++) {
            size_t lo = beg[r] > at->j0 ? beg[r] - at->j0 : 0;
            size_t hi = end[r] > at->j0 ? min_sz(end[r] - at->j0, at->nc) : 0;
            if (lo > at->nc) lo = at->nc;
            for (size_t c = 0; c < lo; c++) s[r * ld + c] = -INFINITY;
            for (size_t c = hi > lo ? hi : lo; c < at->nc; c++) s[r * ld + c] = -INFINITY;
        }
    }
    size_t cols = round_up(at->nc, CW);
    for (size_t r = 0; r < at->nr; r++)
        for (size_t c = at->nc; c < cols; c++) s[r * ld + c] = -INFINITY;
}

/* The tile's final scores into t->s from t->q (packed rows) and kt (the
 * key block transposed): q . k * scale, the chain, the mask; raw: q . k
 * unscaled (no chain), the forward's scale then entering its exponents. */
static bool score_tile(const flex_geom *g, const attn_flex_args *a, flex_tiles *t,
                       const float *kt, const flex_at *at, bool keep_inputs, bool raw,
                       attn_flex_failure *f) {
    size_t ld = g->bkvp, cols = round_up(at->nc, CW);
    tile_mm(t->q, g->Dp, 1, kt, ld, g->p->head_dim, t->s, ld, round_up(at->nr, RG), cols,
            false);
    vec scale = v_set1(g->p->scale);
    for (size_t r = 0; r < at->nr && !raw; r++)
        for (size_t c = 0; c < cols; c += VW)
            v_store(t->s + r * ld + c, v_mul(v_load(t->s + r * ld + c), scale));
    if (g->p->score_mod_count &&
        !apply_chain(g, a, at, t->s, ld, keep_inputs ? t->inputs : NULL, f))
        return false;
    mask_tile(g, at, t->s, ld, t->beg, t->end);
    return true;
}

/* ---- key blocks, packed once per call ----------------------------------------- */

/* Each (b, KV head, key block) packed once, before the tiles that read it
 * (a block serves every query block that visits it, of every head of the
 * group): k^T (D x bkvp), then v as rows (bkvp x Dvp) for the forward, or
 * v^T (Dv x bkvp) and k as rows (bkvp x Dp) for the backward's row pass. */
static size_t key_block_floats(const flex_geom *g, bool backward) {
    const attn_attention_problem *p = g->p;
    size_t kt = round_up(p->head_dim * g->bkvp, 16);
    if (!backward) return kt + round_up(g->bkvp * g->Dvp, 16);
    return kt + round_up(p->v_head_dim * g->bkvp, 16) + round_up(g->bkvp * g->Dp, 16);
}

/* The backward's keys are followed by each (b, head, query block)'s
 * share qs (Dp) that the rows pass leaves to the keys pass (block_qsum). */
static size_t flex_keys_floats(const attn_attention_problem *p, bool backward) {
    flex_geom g = geom_of(p);
    return p->batch * p->kv_heads * g.kv_blocks * key_block_floats(&g, backward) +
           (backward ? p->batch * p->q_heads * g.q_blocks * g.Dp : 0);
}

typedef struct keys_job {
    const flex_geom *g;
    float *keys;
    bool backward;
} keys_job;

static float *key_block(const flex_geom *g, float *keys, bool backward, size_t b, size_t kh,
                        size_t kb) {
    return keys + ((b * g->p->kv_heads + kh) * g->kv_blocks + kb) * key_block_floats(g, backward);
}

/* The two passes' qs of query block qb of head h of sequence b. */
static float *keys_qs(const flex_geom *g, float *keys, size_t b, size_t h, size_t qb) {
    const attn_attention_problem *p = g->p;
    return key_block(g, keys, true, p->batch, 0, 0) +
           ((b * p->q_heads + h) * g->q_blocks + qb) * g->Dp;
}

static void pack_keys_item(void *arg, size_t part, size_t item) {
    (void)part;
    const keys_job *job = arg;
    const flex_geom *g = job->g;
    const attn_attention_problem *p = g->p;
    size_t kb = item % g->kv_blocks, rest = item / g->kv_blocks;
    size_t kh = rest % p->kv_heads, b = rest / p->kv_heads;
    attn_attention_seq s = attn_attention_seq_of(p, b);
    size_t j0 = kb * g->bkv, nc = seq_keys(g, &s, kb), at = s.kv_start;
    if (!nc) return; /* past the sequence: no tile reads it */
    size_t D = p->head_dim, Dv = p->v_head_dim;
    float *blk = key_block(g, job->keys, job->backward, b, kh, kb);
    float *after_kt = blk + round_up(D * g->bkvp, 16);
    pack_transposed((const float *)p->k.data, p->k.st, b, at, kh, j0, nc, D, blk, g->bkvp);
    if (!job->backward) {
        pack_rows((const float *)p->v.data, p->v.st, b, at, kh, j0, nc, Dv, after_kt, g->Dvp,
                  nc);
        return;
    }
    pack_transposed((const float *)p->v.data, p->v.st, b, at, kh, j0, nc, Dv, after_kt,
                    g->bkvp);
    pack_rows((const float *)p->k.data, p->k.st, b, at, kh, j0, nc, D,
              after_kt + round_up(Dv * g->bkvp, 16), g->Dp, nc);
}

static void pack_keys(attn_workers w, const flex_geom *g, float *keys, bool backward) {
    keys_job job = {g, keys, backward};
    const attn_attention_problem *p = g->p;
    attn_pool_dynamic(w.pool, w.threads, p->batch * p->kv_heads * g->kv_blocks, pack_keys_item,
                      &job);
}

/* ---- forward ------------------------------------------------------------------- */

typedef struct flex_job {
    const flex_geom *g;
    const attn_flex_args *a;
    float *parts;
    size_t part_floats, tile_floats; /* a part's floats, and its tiles' (carve) */
    /* backward */
    const attn_attention_grads *gr;
    const float *lse, *lse_lo;
    float *delta;
    unsigned grad_mods; /* bit k: modifier k's tensor_grad is summed in this pass */
    size_t target;      /* the mods pass: its modifier */
    /* nearly one-hot rows take a consistent delta (one_hot_of): per row
     * of the lse layout, c = P_ij* resid (0: none), the key j* and the
     * softcaps' factors there (g->stored floats a row, a row's together) */
    bool consistent;
    float *one_hot;
    uint32_t *one_hot_key;
    float *one_hot_factor;
} flex_job;

static flex_tiles tiles_of(const flex_job *job, size_t part) {
    flex_tiles t = {0};
    carve(job->g, job->parts + part * job->part_floats, &t);
    return t;
}

/* Rows [i0, i0 + nr) of head h of sequence seq (nr > 0): out (when wanted),
 * lse, lse_lo. */
static void forward_rows(const flex_job *job, flex_tiles *t, const attn_attention_seq *seq,
                         size_t h, size_t qb, size_t item, attn_flex_failure *f) {
    const flex_geom *g = job->g;
    const attn_attention_problem *p = g->p;
    size_t b = seq->b, i0 = qb * g->bq, nr = seq_rows(g, seq, qb), kh = h / g->G;
    size_t D = p->head_dim, Dv = p->v_head_dim, ld = g->bkvp, rows = round_up(nr, RG);
    pack_rows((const float *)p->q.data, p->q.st, b, seq->q_start, h, i0, nr, D, t->q, g->Dp,
              g->bqp);
    float sink = p->sinks ? p->sinks[h] : -INFINITY;
    for (size_t r = 0; r < nr; r++) {
        t->m[r] = sink;
        t->l[r] = p->sinks ? 1.0f : 0.0f;
    }
    memset(t->acc, 0, g->bqp * g->Dvp * sizeof(float));
    /* Without a chain or a sink the scores stay raw and the scale enters
     * the exponent, 2^((s - m) scale log2 e), as the fused kernels do: the
     * rounding is then relative to s - m, not to each scaled score. */
    bool raw = !p->score_mod_count && !p->sinks && p->scale > 0.0f;
    float c2 = raw ? (float)(p->scale * FLEX_LOG2E) : (float)FLEX_LOG2E;
    vec l2e = v_set1(c2);
    flex_walk w = walk_row(g, b, h, qb);
    size_t kb, tile;
    while (walk_next(&w, &kb, &tile)) {
        size_t j0 = kb * g->bkv, nc = seq_keys(g, seq, kb);
        if (!nc) continue;
        flex_at at = {b, h, i0, nr, j0, nc, tile, ranges_cover(t->beg, t->end, nr, j0, nc), item};
        if (at.cover == COVER_NONE) continue;
        const float *kt = key_block(g, job->a->keys, false, b, kh, kb);
        const float *v = kt + round_up(D * g->bkvp, 16);
        if (!score_tile(g, job->a, t, kt, &at, false, raw, f)) return;
        size_t cols = round_up(nc, CW);
        /* the weights replace the scores in place */
        for (size_t r = 0; r < nr; r++) {
            float *s = t->s + r * ld, *pr = s;
            vec mx = v_set1(-INFINITY);
            int nan = 0;
            for (size_t c = 0; c < cols; c += VW) {
                vec x = v_load(s + c);
                mx = v_max(mx, x);
                nan |= v_any_nan(x);
            }
            float top = v_hmax(mx), mn = t->m[r] > top ? t->m[r] : top;
            /* A NaN or +inf score the row sees (hidden ones are -inf by
             * now) makes its softmax NaN, as PyTorch's: the max and exp2
             * would pass over it. The row's sum stays NaN from here on. */
            if (nan || top == INFINITY) {
                t->l[r] = NAN;
                memset(pr, 0, cols * sizeof(float));
                continue;
            }
            if (mn == -INFINITY) {
                memset(pr, 0, cols * sizeof(float));
                continue;
            }
            float alpha = exp2f((t->m[r] - mn) * c2);
            vec mv = v_set1(mn), sum = v_zero();
            for (size_t c = 0; c < cols; c += VW) {
                vec e = v_exp2(v_mul(v_sub(v_load(s + c), mv), l2e));
                v_store(pr + c, e);
                sum = v_add(sum, e);
            }
            t->l[r] = t->l[r] * alpha + v_hsum(sum);
            t->m[r] = mn;
            if (alpha != 1.0f) {
                vec av = v_set1(alpha);
                float *o = t->acc + r * g->Dvp;
                for (size_t c = 0; c < g->Dvp; c += VW) v_store(o + c, v_mul(v_load(o + c), av));
            }
        }
        /* rows past nr hold the zero rows' scores, 0: only their own outputs see them */
        tile_mm(t->s, ld, 1, v, g->Dvp, nc, t->acc, g->Dvp, rows, g->Dvp, true);
    }
    for (size_t r = 0; r < nr; r++) {
        size_t i = i0 + r;
        float l = t->l[r];
        if (p->out.data) {
            float *o = (float *)p->out.data + attn_view_offset(p->out.st, b, seq->q_start, h, i);
            const float *acc = t->acc + r * g->Dvp;
            float inv = l > 0.0f ? 1.0f / l : 0.0f;
            for (size_t d = 0; d < Dv; d++) o[d] = l != l ? NAN : l > 0.0f ? acc[d] * inv : 0.0f;
        }
        /* raw: the row max scaled and rounded to float as the backward's
         * scores are (s * scale in float), so that the backward's s - lse -
         * lse_lo is the forward's exponent and not that rounding, half an
         * ulp of s, which past |s| 2^24 is a unit or more of the exponent */
        double m = raw ? (double)(float)((double)t->m[r] * (double)p->scale) : (double)t->m[r];
        double lse = l != l ? NAN : l > 0.0f ? m + log((double)l) : -INFINITY;
        size_t at = attn_lse_index(p, b, h, i);
        if (p->lse) p->lse[at] = (float)lse;
        /* what lse's float leaves out, as (m - float(lse)) + log l: past |m|
         * 2^53 the double m + log l has already dropped log l */
        if (p->lse_lo)
            p->lse_lo[at] = l > 0.0f ? (float)((m - (double)(float)lse) + log((double)l)) : 0.0f;
    }
}

/* Item (b, KV head, query block): the group's heads in order. */
static void forward_item(void *arg, size_t part, size_t item) {
    const flex_job *job = arg;
    const flex_geom *g = job->g;
    attn_flex_failure *f = &job->a->failures[part];
    if (f->failed) return;
    size_t qb = item % g->q_blocks, rest = item / g->q_blocks;
    size_t kh = rest % g->p->kv_heads, b = rest / g->p->kv_heads;
    attn_attention_seq s = attn_attention_seq_of(g->p, b);
    size_t i0 = qb * g->bq, nr = seq_rows(g, &s, qb);
    if (!nr) return; /* past the sequence */
    flex_tiles t = tiles_of(job, part);
    row_ranges(g->p, b, i0, nr, t.beg, t.end);
    for (size_t h = kh * g->G; h < (kh + 1) * g->G; h++) forward_rows(job, &t, &s, h, qb, item, f);
}

static void flex_forward(attn_workers w, const attn_flex_args *a, float *parts) {
    const attn_attention_problem *p = a->p;
    flex_geom g = geom_of(p);
    size_t tiles = carve(&g, NULL, NULL);
    flex_job job = {.g = &g, .a = a, .parts = parts, .part_floats = tiles, .tile_floats = tiles};
    pack_keys(w, &g, a->keys, false);
    attn_pool_dynamic(w.pool, w.threads, p->batch * p->kv_heads * g.q_blocks, forward_item, &job);
}

/* ---- backward ------------------------------------------------------------------ */

/* Rows of head h of sequence s packed for the backward: q, dO, lse,
 * lse_lo, delta. */
static void pack_backward_rows(const flex_job *job, flex_tiles *t, const attn_attention_seq *s,
                               size_t h, size_t i0, size_t nr) {
    const attn_attention_problem *p = job->g->p;
    size_t b = s->b;
    pack_rows((const float *)p->q.data, p->q.st, b, s->q_start, h, i0, nr, p->head_dim, t->q,
              job->g->Dp, job->g->bqp);
    pack_rows((const float *)job->gr->dout, p->out.st, b, s->q_start, h, i0, nr, p->v_head_dim,
              t->dout, job->g->Dvp, job->g->bqp);
    for (size_t r = 0; r < nr; r++) {
        size_t at = attn_lse_index(p, b, h, i0 + r);
        t->lse[r] = job->lse[at];
        t->lse_lo[r] = job->lse_lo ? job->lse_lo[at] : 0.0f;
        t->delta[r] = job->delta[at];
    }
}

/* ds (VW) *= d(cap tanh(x / cap)) / dx at x = in (VW), inv = 1 / cap:
 * sech^2 (x / cap) = 4 e / (1 + e)^2 with e = exp(-2 |x| / cap) (1 -
 * tanh^2 would cancel where the cap saturates, losing the small
 * gradients' bits); e is 0 past 2^-125, where the factor is below
 * float's smallest normal anyway. */
static inline void softcap_grad(const float *in, float *ds, float inv) {
    vec x = v_load(in), d = v_load(ds);
    vec e = v_exp2(v_mul(v_abs(x), v_set1(-2.0f * inv * (float)FLEX_LOG2E)));
    vec u = v_add(v_set1(1.0f), e);
    vec out = v_mul(d, v_div(v_mul(v_set1(4.0f), e), v_mul(u, u)));
    if (v_any_nan(x)) {
        /* a NaN input: NaN where a gradient reaches it (its row is NaN),
         * 0 where none does (a hidden key, dS 0: the input kept there may
         * be a modifier's NaN of a score the map hides anyway) */
        float xs[VW], dl[VW], o[VW];
        v_store(xs, x);
        v_store(dl, d);
        v_store(o, out);
        for (size_t i = 0; i < VW; i++)
            if (xs[i] != xs[i]) o[i] = dl[i] == 0.0f ? 0.0f : xs[i];
        out = v_load(o);
    }
    v_store(ds, out);
}

/* softcap_grad's factor at one input x: the bits chain_backward
 * multiplies dS by at that score. */
static float softcap_factor(float x, float inv) {
    float in[VW], d[VW];
    for (size_t i = 0; i < VW; i++) in[i] = x, d[i] = 1.0f;
    softcap_grad(in, d, inv);
    return d[0];
}

/* Hidden scores (final -inf: the mask's, or the chain's own) keep a zero
 * gradient whatever a callback's backward made of it: the input it kept
 * there may be NaN or inf (an earlier modifier's of a key the mask hides
 * anyway), and 0 x NaN would reach the tables' sums and dq, dk. The
 * softcap's step keeps them itself (softcap_grad). */
static void zero_hidden(flex_tiles *t, const flex_at *at, size_t ld) {
    for (size_t r = 0; r < at->nr; r++)
        for (size_t c = 0; c < at->nc; c++)
            if (t->s[r * ld + c] == -INFINITY) t->dp[r * ld + c] = 0.0f;
}

/* Back through the chain, last modifier first: t->dp holds dL/d(final
 * score) and leaves with dL/d(q . k * scale); the tensor gradients of
 * the modifiers in job->grad_mods are summed on the way. */
static bool chain_backward(const flex_job *job, flex_tiles *t, const flex_at *at,
                           attn_flex_failure *f) {
    const flex_geom *g = job->g;
    const attn_attention_problem *p = g->p;
    size_t ld = g->bkvp, slot = g->stored, score = g->bqp * g->bkvp, T = p->q_len;
    float *ds = t->dp;
    for (size_t k = p->score_mod_count; k-- > 0;) {
        const attn_score_mod *m = &p->score_mods[k];
        bool summed = ((job->grad_mods >> k) & 1u) && m->tensor_grad;
        switch (m->kind) {
        case ATTN_SCORE_SCALE: {
            float v = (float)m->value;
            for (size_t r = 0; r < at->nr; r++)
                for (size_t c = 0; c < at->nc; c++) ds[r * ld + c] *= v;
            break;
        }
        case ATTN_SCORE_SOFTCAP: {
            const float *in = t->inputs + --slot * score;
            float inv = (float)(1.0 / m->value);
            for (size_t r = 0; r < at->nr; r++) {
                /* whole vectors, then the row's last elements through a
                 * vector padded with 0 (a factor of 1), so that every
                 * element takes the same arithmetic and the padded
                 * columns, never copied into in, are not read */
                size_t c = 0;
                for (; c + VW <= at->nc; c += VW)
                    softcap_grad(in + r * ld + c, ds + r * ld + c, inv);
                if (c < at->nc) {
                    float x[VW] = {0}, d[VW] = {0};
                    memcpy(x, in + r * ld + c, (at->nc - c) * sizeof(float));
                    memcpy(d, ds + r * ld + c, (at->nc - c) * sizeof(float));
                    softcap_grad(x, d, inv);
                    memcpy(ds + r * ld + c, d, (at->nc - c) * sizeof(float));
                }
            }
            break;
        }
        case ATTN_SCORE_ALIBI:
            break;
        case ATTN_SCORE_BIAS: {
            float *base = summed ? m->tensor_grad + at->b * m->strides[0] +
                                       at->h * m->strides[1]
                                 : NULL;
            if (summed && m->strides[3] == 0) {
                /* one element for a row's every key (and, stride 0 along
                 * the queries, for the tile's every row): its terms,
                 * summed in double, join it once, not one float add a
                 * term (PyTorch sums them pairwise) */
                double tile = 0.0;
                for (size_t r = 0; r < at->nr; r++) {
                    double sum = 0.0;
                    for (size_t c = 0; c < at->nc; c++) sum += ds[r * ld + c];
                    if (m->strides[2] == 0) tile += sum;
                    else base[(at->i0 + r) * m->strides[2]] += (float)sum;
                }
                if (m->strides[2] == 0) base[0] += (float)tile;
            } else if (summed) {
                for (size_t r = 0; r < at->nr; r++) {
                    float *row = base + (at->i0 + r) * m->strides[2];
                    for (size_t c = 0; c < at->nc; c++)
                        row[(at->j0 + c) * m->strides[3]] += ds[r * ld + c];
                }
            }
            break;
        }
        case ATTN_SCORE_REL_BIAS:
        case ATTN_SCORE_REL_TABLE:
            if (summed) {
                float *table = m->tensor_grad + at->h * m->buckets;
                const int32_t *bucket = job->a->buckets[k] + (T - 1);
                for (size_t r = 0; r < at->nr; r++) {
                    const int32_t *row = bucket + ((ptrdiff_t)at->j0 - (ptrdiff_t)(at->i0 + r));
                    for (size_t c = 0; c < at->nc; c++) table[row[c]] += ds[r * ld + c];
                }
            }
            break;
        case ATTN_SCORE_CALLBACK: {
            float *in = t->inputs + --slot * score;
            if (m->grad_fn) {
                attn_score_tile tile = {at->b, at->h, at->i0, at->j0, at->nr, at->nc, ld, in};
                int code = m->grad_fn(m->user, &tile, ds);
                if (code != 0) {
                    record_failure(f, at, k, code, true);
                    return false;
                }
            }
            zero_hidden(t, at, ld);
            break;
        }
        }
    }
    return true;
}

/* Row r's peak_factor: each kept modifier's factor at tile column c
 * (softcap's; 1 for a callback, whose chain takes no consistent delta). */
static void note_peak_factors(const flex_geom *g, flex_tiles *t, size_t r, size_t c) {
    const attn_attention_problem *p = g->p;
    size_t slot = 0, score = g->bqp * g->bkvp;
    for (size_t k = 0; k < p->score_mod_count; k++) {
        const attn_score_mod *m = &p->score_mods[k];
        if (!keeps_input(m->kind)) continue;
        float x = t->inputs[slot * score + r * g->bkvp + c];
        t->peak_factor[r * g->stored + slot++] =
            m->kind == ATTN_SCORE_SOFTCAP ? softcap_factor(x, (float)(1.0 / m->value)) : 1.0f;
    }
}

/* The tile's P (t->pm) and dS (t->dp, before the chain's backward): needs
 * t->q, t->dout and the rows' statistics packed, and the key block's k^T
 * and v^T. */
static bool grad_tile(const flex_job *job, flex_tiles *t, const float *kt, const float *vt,
                      const flex_at *at, attn_flex_failure *f) {
    const flex_geom *g = job->g;
    size_t ld = g->bkvp, cols = round_up(at->nc, CW), rows = round_up(at->nr, RG);
    if (!score_tile(g, job->a, t, kt, at, g->stored > 0, false, f)) return false;
    t->weighed = false;
    vec l2e = v_set1((float)FLEX_LOG2E);
    tile_mm(t->dout, g->Dvp, 1, vt, ld, g->p->v_head_dim, t->dp, ld, rows, cols, false);
    for (size_t r = 0; r < at->nr; r++) {
        float *s = t->s + r * ld, *pr = t->pm + r * ld, *dp = t->dp + r * ld;
        if (t->lse[r] == -INFINITY) {
            memset(pr, 0, cols * sizeof(float));
            memset(dp, 0, cols * sizeof(float));
            continue;
        }
        if (t->lse[r] != t->lse[r]) {
            /* a row the forward made NaN: NaN weights on the keys it sees,
             * so that its gradients, and the keys', are NaN as PyTorch's */
            for (size_t c = 0; c < cols; c++)
                pr[c] = dp[c] = c < at->nc && s[c] != -INFINITY ? NAN : 0.0f;
            continue;
        }
        vec lse = v_set1(t->lse[r]), lo = v_set1(t->lse_lo[r]), delta = v_set1(t->delta[r]);
        vec sum = v_zero(), top = v_zero();
        for (size_t c = 0; c < cols; c += VW) {
            vec e = v_exp2(v_mul(v_sub(v_sub(v_load(s + c), lse), lo), l2e));
            vec ds = v_mul(e, v_sub(v_load(dp + c), delta));
            v_store(pr + c, e);
            v_store(dp + c, ds);
            top = v_max(top, e);
            if (t->sums) sum = v_add(sum, ds);
        }
        float most = v_hmax(top);
        t->weighed |= most > 0.0f;
        if (t->sums) { /* padded columns weigh 0 and give dS 0 */
            t->resid[r] += v_hsum(sum);
            for (size_t c = 0; most > t->peak[r] && c < at->nc; c++)
                if (pr[c] == most) {
                    t->peak[r] = most;
                    t->peak_key[r] = at->j0 + c;
                    note_peak_factors(g, t, r, c);
                }
        }
    }
    for (size_t r = at->nr; r < rows; r++) {
        memset(t->pm + r * ld, 0, cols * sizeof(float));
        memset(t->dp + r * ld, 0, cols * sizeof(float));
    }
    return true;
}

/* The factor a chain of linear modifiers (scale, ALiBi, biases: consistent
 * below) gives the gradient of its final score on its way back to
 * modifier `from` (0: to q . k * scale): the product of the scales after. */
static float scale_after(const attn_attention_problem *p, size_t from) {
    float a = 1.0f;
    for (size_t k = from; k < p->score_mod_count; k++)
        if (p->score_mods[k].kind == ATTN_SCORE_SCALE) a *= (float)p->score_mods[k].value;
    return a;
}

/* scale_after at the peak key of row `at` (lse layout), where softcaps
 * are in the chain too: each one's factor there (one_hot_factor) joins
 * the product, in the chain's order. */
static float factor_after(const flex_job *job, size_t at, size_t from) {
    const attn_attention_problem *p = job->g->p;
    const float *caps = job->one_hot_factor + at * job->g->stored;
    float a = 1.0f;
    size_t slot = 0;
    for (size_t k = 0; k < p->score_mod_count; k++) {
        const attn_score_mod *m = &p->score_mods[k];
        float f;
        if (m->kind == ATTN_SCORE_SCALE) f = (float)m->value;
        else if (keeps_input(m->kind)) f = caps[slot++];
        else continue;
        if (k >= from) a *= f;
    }
    return a;
}

/* Row i of head h (tile row r of t's sums, summed by grad_tile over all
 * its keys) as the consistent delta takes it: where one weight P_ij*
 * passes ATTN_ONE_HOT_WEIGHT, delta + resid (resid = sum_j dS_ij) is the
 * delta of the tiles' own P and dP (attention_problem.h), and dS_ij falls
 * by P_ij resid, which to within a rounding only j* carries: c = P_ij*
 * resid there, kept with j* in the row's one_hot entry (0: none) and the
 * softcaps' factors there (factors, g->stored of them) for the fix-ups,
 * which take c back through the chain (factor_after). Returns c. */
static float one_hot_of(const flex_job *job, size_t b, size_t h, size_t i, float resid,
                        float peak, size_t key, const float *factors) {
    size_t at = attn_lse_index(job->g->p, b, h, i);
    float c = 0.0f;
    if (peak > ATTN_ONE_HOT_WEIGHT && resid != 0.0f && isfinite(resid)) c = peak * resid;
    job->one_hot[at] = c;
    job->one_hot_key[at] = (uint32_t)key;
    if (c != 0.0f)
        memcpy(job->one_hot_factor + at * job->g->stored, factors,
               job->g->stored * sizeof(float));
    return c;
}

/* dq's sums of row i of head h (D floats, before the scale) less c k_j*,
 * through the chain's scales and softcaps. */
static void one_hot_dq(const flex_job *job, const attn_attention_seq *s, size_t h, size_t i,
                       float *sums) {
    const attn_attention_problem *p = job->g->p;
    size_t at = attn_lse_index(p, s->b, h, i);
    if (job->one_hot[at] == 0.0f) return; /* its factors unwritten */
    float c = job->one_hot[at] * factor_after(job, at, 0);
    if (c == 0.0f) return;
    const float *k = (const float *)p->k.data +
                     attn_view_offset(p->k.st, s->b, s->kv_start, h / job->g->G,
                                      job->one_hot_key[at]);
    for (size_t d = 0; d < p->head_dim; d++) sums[d] -= c * k[d];
}

/* A tile's keys (nc rows of Dp) into its rows' sums: ksum += each row in
 * order, kcount += nc, where grad_tile gave some row of the tile a weight
 * (a tile a map lists whose keys the rows do not see adds nothing: a
 * sequence of a packed batch then sums what it sums alone). The rows pass
 * and the one pass add the same blocks in the same (ascending) order, so
 * both give the same bits. */
static void add_keys(const flex_tiles *t, float *ksum, float *kcount, const float *k, size_t Dp,
                     size_t nc) {
    if (!t->weighed) return;
    for (size_t c = 0; c < nc; c++)
        for (size_t d = 0; d < Dp; d += VW)
            v_store(ksum + d, v_add(v_load(ksum + d), v_load(k + c * Dp + d)));
    *kcount += (float)nc;
}

/* The rest of row i's consistent delta, after one_hot_of (and one_hot_dq):
 * delta + resid moves dS_ij by -P_ij resid at every key, and so dq_i by
 * -resid sum_j P_ij k_j, of which one_hot_dq took the peak key's c k_j*.
 * The sum is not at hand; the mean of the keys the row's sweep visited
 * (ksum / kcount) stands for the rest, (resid - c) kmean. Where q and k
 * share a large component that mean carries it, and with it most of the
 * error that delta's mismatch with the tiles' own P and dP would put into
 * dq: a forward of other rounding (the fused kernels', which take a
 * relative bias's forward but not its gradient) leaves each row's weights
 * summing to 1 only within a few roundings of the scores. Not with a
 * softcap in the chain (g->stored, no callback being there): its factor
 * differs from key to key, which a mean of the keys cannot stand for (the
 * fused kernels' mean_key is zero there too); its rows take one_hot_dq's
 * part alone. */
static float consistent_dq(const flex_job *job, const attn_attention_seq *s, size_t h, size_t i,
                           float resid, const float *ksum, float kcount, float *sums) {
    const attn_attention_problem *p = job->g->p;
    if (resid == 0.0f || !isfinite(resid) || kcount == 0.0f || job->g->stored) return 0.0f;
    float rest = (resid - job->one_hot[attn_lse_index(p, s->b, h, i)]) * scale_after(p, 0);
    float inv = 1.0f / kcount;
    for (size_t d = 0; d < p->head_dim; d++) sums[d] -= rest * (ksum[d] * inv);
    return rest;
}

/* The transpose of consistent_dq's estimate, for the keys: row i took
 * rest_i times the mean of its block's weighed keys from dq_i, as though
 * it weighed each of them alike, so each of those keys gives back scale
 * rest_i q_i / kcount. qs (D) sums that share over a query block's rows:
 * qs += rest q_i per row in order (block_qsum), then qs *= scale /
 * kcount (block_qsum_done). Without it the keys' dk sum to scale sum_i
 * resid_i q_i off, a direction that keys sharing a large component carry
 * whole into W_key's gradient (x^T dk). */
static void block_qsum(const flex_job *job, const attn_attention_seq *s, size_t h, size_t i,
                       float rest, float *qs) {
    const attn_attention_problem *p = job->g->p;
    if (rest == 0.0f) return;
    const float *q = (const float *)p->q.data + attn_view_offset(p->q.st, s->b, s->q_start, h, i);
    for (size_t d = 0; d < p->head_dim; d++) qs[d] += rest * q[d];
}

static void block_qsum_done(const flex_job *job, float kcount, float *qs) {
    const attn_attention_problem *p = job->g->p;
    float a = kcount == 0.0f ? 0.0f : (float)((double)p->scale / (double)kcount);
    for (size_t d = 0; d < p->head_dim; d++) qs[d] *= a;
}

/* dk of keys [j0, j0 + nc) of KV head kh of sequence s, written, less
 * corr (D): the sum of the qs of the query blocks whose tiles with the
 * key block weighed (over the group's heads in order, each in its map
 * column's order), the same for every key of the block. */
static void spread_block(const flex_job *job, const attn_attention_seq *s, size_t kh, size_t j0,
                         size_t nc, const float *corr) {
    const attn_attention_problem *p = job->g->p;
    for (size_t j = 0; j < nc; j++) {
        float *kd = (float *)job->gr->dk + attn_view_offset(p->k.st, s->b, s->kv_start, kh, j0 + j);
        for (size_t d = 0; d < p->head_dim; d++) kd[d] -= corr[d];
    }
}

static void add_qs(const flex_job *job, const float *qs, float *corr) {
    for (size_t d = 0; d < job->g->p->head_dim; d++) corr[d] += qs[d];
}

/* The gradients of the modifiers in mods at (i, j*) of row i of head h,
 * less c through the scales and softcaps after each. */
static void one_hot_mods(const flex_job *job, const attn_attention_seq *s, size_t h, size_t i,
                         unsigned mods) {
    const attn_attention_problem *p = job->g->p;
    size_t at = attn_lse_index(p, s->b, h, i), j = job->one_hot_key[at];
    float c = job->one_hot[at];
    if (c == 0.0f) return;
    for (size_t k = 0; k < p->score_mod_count; k++) {
        const attn_score_mod *m = &p->score_mods[k];
        if (!((mods >> k) & 1u) || !m->tensor_grad) continue;
        float ck = c * factor_after(job, at, k + 1);
        if (m->kind == ATTN_SCORE_BIAS)
            m->tensor_grad[s->b * m->strides[0] + h * m->strides[1] + i * m->strides[2] +
                           j * m->strides[3]] -= ck;
        else
            m->tensor_grad[h * m->buckets + job->a->buckets[k][p->q_len - 1 + j - i]] -= ck;
    }
}

/* dk of KV head kh of sequence s, written: each key j* of a nearly
 * one-hot row less scale c q_i through the chain's scales and softcaps,
 * the group's heads and their rows in order. */
static void one_hot_dk(const flex_job *job, const attn_attention_seq *s, size_t kh) {
    const flex_geom *g = job->g;
    const attn_attention_problem *p = g->p;
    for (size_t h = kh * g->G; h < (kh + 1) * g->G; h++)
        for (size_t i = 0; i < s->q_len; i++) {
            size_t at = attn_lse_index(p, s->b, h, i);
            float c = job->one_hot[at];
            if (c == 0.0f) continue;
            float a = factor_after(job, at, 0) * p->scale;
            const float *q = (const float *)p->q.data +
                             attn_view_offset(p->q.st, s->b, s->q_start, h, i);
            float *dk = (float *)job->gr->dk + attn_view_offset(p->k.st, s->b, s->kv_start, kh,
                                                                job->one_hot_key[at]);
            for (size_t d = 0; d < p->head_dim; d++) dk[d] -= a * c * q[d];
        }
}

/* Item (b, KV head) of the two passes' fix-up of dk (one_hot_dk). */
static void one_hot_dk_item(void *arg, size_t part, size_t item) {
    (void)part;
    const flex_job *job = arg;
    const attn_attention_problem *p = job->g->p;
    attn_attention_seq s = attn_attention_seq_of(p, item / p->kv_heads);
    one_hot_dk(job, &s, item % p->kv_heads);
}

/* dk, dv of key block kb of KV head kh of sequence s (nc > 0 keys) over the
 * group's heads in order and, per head, the query blocks of the map's
 * column in order. With sums (the one pass), each tile's dS also adds dS k
 * to its rows' dq sums: sums holds the group's heads, each q_blocks x bqp
 * rows of Dp, and kr takes k's rows (bkvp x Dp); with a consistent delta
 * it marks the tiles that weighed, for spread_one_pass. Without (the keys
 * pass, after the rows pass), dk then takes spread_block of the qs the
 * rows pass left for the tiles that weighed. */
static bool key_block_backward(const flex_job *job, flex_tiles *t, const attn_attention_seq *s,
                               size_t kh, size_t kb, size_t item, float *sums, float *kr,
                               attn_flex_failure *f) {
    const flex_geom *g = job->g;
    const attn_attention_problem *p = g->p;
    size_t b = s->b, D = p->head_dim, Dv = p->v_head_dim, ld = g->bkvp;
    size_t j0 = kb * g->bkv, nc = seq_keys(g, s, kb), krows = round_up(nc, RG);
    size_t head_floats = g->q_blocks * g->bqp * g->Dp;
    pack_transposed((const float *)p->k.data, p->k.st, b, s->kv_start, kh, j0, nc, D, t->kt, ld);
    pack_transposed((const float *)p->v.data, p->v.st, b, s->kv_start, kh, j0, nc, Dv, t->vt, ld);
    if (sums)
        pack_rows((const float *)p->k.data, p->k.st, b, s->kv_start, kh, j0, nc, D, kr, g->Dp,
                  nc);
    memset(t->dk, 0, g->bkvp * g->Dp * sizeof(float));
    memset(t->dv, 0, g->bkvp * g->Dvp * sizeof(float));
    float *corr = t->ksum; /* the tiles' own ksum: unused by the keys' passes */
    memset(corr, 0, g->Dp * sizeof(float));
    for (size_t h = kh * g->G; h < (kh + 1) * g->G; h++) {
        flex_walk w = walk_column(g, b, h, kb);
        size_t qb, tile;
        while (walk_next(&w, &qb, &tile)) {
            size_t i0 = qb * g->bq, nr = seq_rows(g, s, qb);
            if (!nr) continue;
            row_ranges(p, b, i0, nr, t->beg, t->end);
            flex_at at = {b, h, i0, nr, j0, nc, tile, ranges_cover(t->beg, t->end, nr, j0, nc),
                          item};
            if (at.cover == COVER_NONE) continue;
            pack_backward_rows(job, t, s, h, i0, nr);
            float *ksum = NULL, *kcount = NULL;
            if (sums && job->consistent) { /* the one pass sums each row's over its tiles */
                one_pass_sums o = one_pass_sums_at(g, sums);
                size_t blk = (h - kh * g->G) * g->q_blocks + qb, row0 = blk * g->bqp;
                t->sums = true;
                t->resid = o.resid + row0;
                t->peak = o.peak + row0;
                t->peak_key = o.peak_key + row0;
                t->peak_factor = o.peak_factor + row0 * g->stored;
                ksum = o.ksum + blk * g->Dp;
                kcount = o.kcount + blk;
            }
            if (!grad_tile(job, t, t->kt, t->vt, &at, f)) return false;
            if (ksum) add_keys(t, ksum, kcount, kr, g->Dp, nc);
            if (ksum && t->weighed)
                one_pass_sums_at(g, sums).weighed[((h - kh * g->G) * g->q_blocks + qb) *
                                                      g->kv_blocks + kb] = 1;
            if (!sums && job->consistent && t->weighed)
                add_qs(job, keys_qs(g, job->a->keys, b, h, qb), corr);
            /* dv (keys x Dv) += P^T dO */
            tile_mm(t->pm, 1, ld, t->dout, g->Dvp, nr, t->dv, g->Dvp, krows, g->Dvp, true);
            if (!chain_backward(job, t, &at, f)) return false;
            /* dk (keys x D) += dS^T q */
            tile_mm(t->dp, 1, ld, t->q, g->Dp, nr, t->dk, g->Dp, krows, g->Dp, true);
            /* dq (rows x D) += dS k, as the rows pass adds it */
            if (sums)
                tile_mm(t->dp, ld, 1, kr, g->Dp, nc,
                        sums + (h - kh * g->G) * head_floats + qb * g->bqp * g->Dp, g->Dp,
                        round_up(nr, RG), g->Dp, true);
        }
    }
    float *dk = job->gr->dk, *dv = job->gr->dv, scale = p->scale;
    for (size_t j = 0; j < nc; j++) {
        float *kd = dk + attn_view_offset(p->k.st, b, s->kv_start, kh, j0 + j);
        float *vd = dv + attn_view_offset(p->v.st, b, s->kv_start, kh, j0 + j);
        for (size_t d = 0; d < D; d++) kd[d] = t->dk[j * g->Dp + d] * scale;
        memcpy(vd, t->dv + j * g->Dvp, Dv * sizeof(float));
    }
    if (!sums && job->consistent) spread_block(job, s, kh, j0, nc, corr);
    return true;
}

/* The one pass's spread_block of every key block of KV head kh of
 * sequence s, once every row's qs is summed: corr over the tiles that
 * key_block_backward marked, in the keys pass's order. */
static void spread_one_pass(const flex_job *job, flex_tiles *t, const attn_attention_seq *s,
                            size_t kh, const one_pass_sums *o) {
    const flex_geom *g = job->g;
    for (size_t kb = 0; kb < g->kv_blocks; kb++) {
        size_t nc = seq_keys(g, s, kb);
        if (!nc) continue;
        memset(t->ksum, 0, g->Dp * sizeof(float));
        for (size_t h = kh * g->G; h < (kh + 1) * g->G; h++) {
            flex_walk w = walk_column(g, s->b, h, kb);
            size_t qb, tile;
            while (walk_next(&w, &qb, &tile)) {
                if (!seq_rows(g, s, qb)) continue; /* past the sequence (a longer map) */
                size_t blk = (h - kh * g->G) * g->q_blocks + qb;
                if (o->weighed[blk * g->kv_blocks + kb]) add_qs(job, o->qs + blk * g->Dp, t->ksum);
            }
        }
        spread_block(job, s, kh, kb * g->bkv, nc, t->ksum);
    }
}

/* Item (b, KV head, key block) of the two passes: dk, dv of the block. */
static void keys_item(void *arg, size_t part, size_t item) {
    const flex_job *job = arg;
    const flex_geom *g = job->g;
    const attn_attention_problem *p = g->p;
    attn_flex_failure *f = &job->a->failures[part];
    if (f->failed) return;
    size_t kb = item % g->kv_blocks, rest = item / g->kv_blocks;
    size_t kh = rest % p->kv_heads, b = rest / p->kv_heads;
    attn_attention_seq s = attn_attention_seq_of(p, b);
    if (!seq_keys(g, &s, kb)) return; /* past the sequence: no keys */
    flex_tiles t = tiles_of(job, part);
    key_block_backward(job, &t, &s, kh, kb, item, NULL, NULL, f);
}

/* Item (b, KV head) of the one pass: every key block in order, then dq of
 * the group's heads from their sums. */
static void one_pass_item(void *arg, size_t part, size_t item) {
    const flex_job *job = arg;
    const flex_geom *g = job->g;
    const attn_attention_problem *p = g->p;
    attn_flex_failure *f = &job->a->failures[part];
    if (f->failed) return;
    size_t kh = item % p->kv_heads, b = item / p->kv_heads;
    attn_attention_seq s = attn_attention_seq_of(p, b);
    flex_tiles t = tiles_of(job, part);
    float *kr = job->parts + part * job->part_floats + job->tile_floats;
    float *sums = kr + round_up(g->bkvp * g->Dp, 16);
    size_t head_rows = g->q_blocks * g->bqp, head_floats = head_rows * g->Dp;
    one_pass_sums o = one_pass_sums_at(g, sums);
    memset(sums, 0, g->G * head_floats * sizeof(float));
    for (size_t r = 0; r < g->G * head_rows; r++) {
        o.resid[r] = o.peak[r] = 0.0f;
        o.peak_key[r] = 0;
    }
    memset(o.ksum, 0, g->G * g->q_blocks * g->Dp * sizeof(float));
    memset(o.kcount, 0, g->G * g->q_blocks * sizeof(float));
    memset(o.qs, 0, g->G * g->q_blocks * g->Dp * sizeof(float));
    memset(o.weighed, 0, g->G * g->q_blocks * g->kv_blocks);
    for (size_t kb = 0; kb < g->kv_blocks; kb++) {
        if (!seq_keys(g, &s, kb)) continue; /* past the sequence: no keys */
        /* the failure's item is the two passes' (b, KV head, key block) */
        size_t keys_item_number = (b * p->kv_heads + kh) * g->kv_blocks + kb;
        if (!key_block_backward(job, &t, &s, kh, kb, keys_item_number, sums, kr, f)) return;
    }
    for (size_t h = kh * g->G; h < (kh + 1) * g->G; h++) {
        float *head = sums + (h - kh * g->G) * head_floats;
        for (size_t i = 0; i < s.q_len; i++) {
            size_t r = (h - kh * g->G) * head_rows + i / g->bq * g->bqp + i % g->bq;
            float *row = head + (i / g->bq * g->bqp + i % g->bq) * g->Dp;
            float *dq = (float *)job->gr->dq + attn_view_offset(p->q.st, b, s.q_start, h, i);
            if (job->consistent) {
                size_t blk = (h - kh * g->G) * g->q_blocks + i / g->bq;
                if (one_hot_of(job, b, h, i, o.resid[r], o.peak[r], o.peak_key[r],
                               o.peak_factor + r * g->stored) != 0.0f)
                    one_hot_dq(job, &s, h, i, row);
                float rest = consistent_dq(job, &s, h, i, o.resid[r], o.ksum + blk * g->Dp,
                                           o.kcount[blk], row);
                block_qsum(job, &s, h, i, rest, o.qs + blk * g->Dp);
                if (i % g->bq == g->bq - 1 || i + 1 == s.q_len)
                    block_qsum_done(job, o.kcount[blk], o.qs + blk * g->Dp);
            }
            for (size_t d = 0; d < p->head_dim; d++) dq[d] = row[d] * p->scale;
        }
    }
    if (job->consistent) {
        spread_one_pass(job, &t, &s, kh, &o);
        one_hot_dk(job, &s, kh);
    }
}

/* dS of every tile of rows [i0, i0 + nr) of head h of sequence s (nr >
 * 0), through the chain; with want_dq, t->acc += dS k. */
static bool rows_backward(const flex_job *job, flex_tiles *t, const attn_attention_seq *s,
                          size_t h, size_t qb, size_t item, bool want_dq, attn_flex_failure *f) {
    const flex_geom *g = job->g;
    const attn_attention_problem *p = g->p;
    size_t b = s->b, i0 = qb * g->bq, nr = seq_rows(g, s, qb), kh = h / g->G, ld = g->bkvp;
    pack_backward_rows(job, t, s, h, i0, nr);
    flex_walk w = walk_row(g, b, h, qb);
    size_t kb, tile;
    while (walk_next(&w, &kb, &tile)) {
        size_t j0 = kb * g->bkv, nc = seq_keys(g, s, kb);
        if (!nc) continue;
        flex_at at = {b, h, i0, nr, j0, nc, tile, ranges_cover(t->beg, t->end, nr, j0, nc), item};
        if (at.cover == COVER_NONE) continue;
        const float *kt = key_block(g, job->a->keys, true, b, kh, kb);
        const float *vt = kt + round_up(p->head_dim * ld, 16);
        const float *k = vt + round_up(p->v_head_dim * ld, 16);
        if (!grad_tile(job, t, kt, vt, &at, f) || !chain_backward(job, t, &at, f)) return false;
        /* dq (rows x D) += dS k */
        if (want_dq)
            tile_mm(t->dp, ld, 1, k, g->Dp, nc, t->acc, g->Dp, round_up(nr, RG), g->Dp, true);
        if (want_dq && t->sums) add_keys(t, t->ksum, t->kcount, k, g->Dp, nc);
    }
    return true;
}

/* Item (b, KV head, query block): dq of the group's heads (and the
 * modifiers' gradients the item owns). */
static void rows_item(void *arg, size_t part, size_t item) {
    const flex_job *job = arg;
    const flex_geom *g = job->g;
    const attn_attention_problem *p = g->p;
    attn_flex_failure *f = &job->a->failures[part];
    if (f->failed) return;
    size_t qb = item % g->q_blocks, rest = item / g->q_blocks;
    size_t kh = rest % p->kv_heads, b = rest / p->kv_heads;
    attn_attention_seq s = attn_attention_seq_of(p, b);
    size_t i0 = qb * g->bq, nr = seq_rows(g, &s, qb);
    if (!nr) return; /* past the sequence */
    flex_tiles t = tiles_of(job, part);
    row_ranges(p, b, i0, nr, t.beg, t.end);
    t.sums = job->consistent;
    for (size_t h = kh * g->G; h < (kh + 1) * g->G; h++) {
        memset(t.acc, 0, g->bqp * g->Dp * sizeof(float));
        for (size_t r = 0; r < nr; r++) {
            t.resid[r] = t.peak[r] = 0.0f;
            t.peak_key[r] = 0;
        }
        memset(t.ksum, 0, g->Dp * sizeof(float));
        *t.kcount = 0.0f;
        float *qs = keys_qs(g, job->a->keys, b, h, qb); /* for the keys pass after */
        memset(qs, 0, g->Dp * sizeof(float));
        if (!rows_backward(job, &t, &s, h, qb, item, true, f)) return;
        for (size_t r = 0; r < nr; r++) {
            float *dq =
                (float *)job->gr->dq + attn_view_offset(p->q.st, b, s.q_start, h, i0 + r);
            if (t.sums &&
                one_hot_of(job, b, h, i0 + r, t.resid[r], t.peak[r], t.peak_key[r],
                           t.peak_factor + r * g->stored) != 0.0f) {
                one_hot_dq(job, &s, h, i0 + r, t.acc + r * g->Dp);
                one_hot_mods(job, &s, h, i0 + r, job->grad_mods);
            }
            if (t.sums)
                block_qsum(job, &s, h, i0 + r,
                           consistent_dq(job, &s, h, i0 + r, t.resid[r], t.ksum, *t.kcount,
                                         t.acc + r * g->Dp),
                           qs);
            for (size_t d = 0; d < p->head_dim; d++) dq[d] = t.acc[r * g->Dp + d] * p->scale;
        }
        if (t.sums) block_qsum_done(job, *t.kcount, qs);
    }
}

/* The extents of the mods pass's items for modifier k: (batch, heads,
 * query blocks), 1 where the tensor is shared along that axis (the item
 * then sums every b, h or block in order). */
static void mod_item_dims(const flex_geom *g, const attn_score_mod *m, size_t dims[3]) {
    const attn_attention_problem *p = g->p;
    if (attn_score_mod_relative(m->kind)) {
        dims[0] = 1, dims[1] = p->q_heads, dims[2] = 1;
        return;
    }
    dims[0] = m->strides[0] ? p->batch : 1;
    dims[1] = m->strides[1] ? p->q_heads : 1;
    dims[2] = m->strides[2] ? g->q_blocks : 1;
}

static void mods_item(void *arg, size_t part, size_t item) {
    const flex_job *job = arg;
    const flex_geom *g = job->g;
    const attn_attention_problem *p = g->p;
    attn_flex_failure *f = &job->a->failures[part];
    if (f->failed) return;
    size_t dims[3];
    mod_item_dims(g, &p->score_mods[job->target], dims);
    size_t qi = item % dims[2], hi = item / dims[2] % dims[1], bi = item / dims[2] / dims[1];
    flex_tiles t = tiles_of(job, part);
    for (size_t b = dims[0] == 1 ? 0 : bi; b < (dims[0] == 1 ? p->batch : bi + 1); b++) {
        attn_attention_seq s = attn_attention_seq_of(p, b);
        for (size_t h = dims[1] == 1 ? 0 : hi; h < (dims[1] == 1 ? p->q_heads : hi + 1); h++)
            for (size_t qb = dims[2] == 1 ? 0 : qi; qb < (dims[2] == 1 ? g->q_blocks : qi + 1);
                 qb++) {
                size_t i0 = qb * g->bq, nr = seq_rows(g, &s, qb);
                if (!nr) continue;
                row_ranges(p, b, i0, nr, t.beg, t.end);
                if (!rows_backward(job, &t, &s, h, qb, item, false, f)) return;
                for (size_t r = 0; job->consistent && r < nr; r++)
                    one_hot_mods(job, &s, h, i0 + r, job->grad_mods);
            }
    }
}

/* delta_i = dO_i . O_i (less dlse_i), per (b, h), summed in order of d. */
static void delta_item(void *arg, size_t part, size_t item) {
    (void)part;
    const flex_job *job = arg;
    const attn_attention_problem *p = job->g->p;
    size_t h = item % p->q_heads, b = item / p->q_heads;
    attn_attention_seq s = attn_attention_seq_of(p, b);
    for (size_t i = 0; i < s.q_len; i++) {
        size_t at = attn_view_offset(p->out.st, b, s.q_start, h, i);
        const float *o = (const float *)p->out.data + at, *d_o = (const float *)job->gr->dout + at;
        double sum = 0.0; /* exact products, one rounding of the sum */
        for (size_t d = 0; d < p->v_head_dim; d++) sum += (double)o[d] * d_o[d];
        size_t r = attn_lse_index(p, b, h, i);
        job->delta[r] = (float)(p->dlse ? sum - p->dlse[r] : sum);
    }
}

/* Whether the rows pass owns modifier m's gradient elements item by item:
 * no two (b, KV head, query block) items reach the same element. */
static bool rows_pass_owns(const flex_geom *g, const attn_score_mod *m) {
    const attn_attention_problem *p = g->p;
    if (attn_score_mod_relative(m->kind)) return p->batch == 1 && g->q_blocks == 1;
    return (m->strides[0] || p->batch == 1) && (m->strides[1] || p->kv_heads == 1) &&
           (m->strides[2] || g->q_blocks == 1);
}

/* Whether the rows pass gives nearly one-hot rows a consistent delta
 * (one_hot_of): as the fused kernels do (attn_consistent_delta), and
 * where the kernel can take a change of dS at one key back through the
 * chain: scales, ALiBi and biases pass it as it is (or scaled), a softcap
 * times its factor at that key (note_peak_factors). Not with a callback:
 * its grad_fn multiplies whole tiles in place and gives no factor at one
 * score that the fix-ups could take. */
static bool consistent_delta(const attn_attention_problem *p) {
    if (!attn_consistent_delta(p)) return false;
    for (size_t k = 0; k < p->score_mod_count; k++)
        if (p->score_mods[k].kind == ATTN_SCORE_CALLBACK) return false;
    return true;
}

static bool any_failed(const attn_workers w, const attn_flex_args *a) {
    for (size_t i = 0; i < attn_parallel_parts(w.threads); i++)
        if (a->failures[i].failed) return true;
    return false;
}

/* The backward's items run with float results below 2^-126 flushed to zero
 * (kernels/flush_zero.h) where no callback is in the chain: a bias that
 * falls with distance (ALiBi's, a relative table's) gives far keys weights
 * of 2^-64 .. 2^-125, and dS = P (dP - delta) and its products then come out
 * subnormal, each a microcode assist. A callback runs in the caller's
 * floating-point environment, as it would alone. */
static void backward_items(attn_workers w, size_t n, attn_item_fn fn, flex_job *job) {
    const attn_attention_problem *p = job->g->p;
    bool callback = false;
    for (size_t k = 0; k < p->score_mod_count; k++)
        callback |= p->score_mods[k].kind == ATTN_SCORE_CALLBACK;
    if (callback) {
        attn_pool_dynamic(w.pool, w.threads, n, fn, job);
        return;
    }
    attn_flushed_items f = {fn, job};
    attn_pool_dynamic(w.pool, w.threads, n, attn_flushed_item, &f);
}

static void flex_backward(attn_workers w, const attn_flex_args *a, const attn_attention_grads *gr,
                          const float *lse, const float *lse_lo, float *delta, float *parts) {
    const attn_attention_problem *p = a->p;
    flex_geom g = geom_of(p);
    size_t one_pass = one_pass_floats(&g), tiles = carve(&g, NULL, NULL);
    size_t rows = attn_flex_rows(p);
    flex_job job = {.g = &g, .a = a, .parts = parts, .part_floats = tiles + one_pass,
                    .tile_floats = tiles, .gr = gr, .lse = lse, .lse_lo = lse_lo,
                    .delta = delta, .consistent = consistent_delta(p),
                    .one_hot = delta + rows, .one_hot_key = (uint32_t *)(delta + 2 * rows),
                    .one_hot_factor = delta + 3 * rows};
    attn_pool_dynamic(w.pool, w.threads, p->batch * p->q_heads, delta_item, &job);
    if (one_pass) {
        backward_items(w, p->batch * p->kv_heads, one_pass_item, &job);
        return;
    }
    /* without a consistent delta (a callback's chain among them) the keys
     * pass first, as the one pass meets a failing tile */
    if (!job.consistent) backward_items(w, p->batch * p->kv_heads * g.kv_blocks, keys_item, &job);
    if (any_failed(w, a)) return;
    unsigned separate = 0;
    for (size_t k = 0; k < p->score_mod_count; k++) {
        const attn_score_mod *m = &p->score_mods[k];
        if (!graded(m)) continue;
        if (rows_pass_owns(&g, m)) job.grad_mods |= 1u << k;
        else separate |= 1u << k;
    }
    pack_keys(w, &g, a->keys, true);
    /* with a consistent delta the rows pass first: it finds the nearly
     * one-hot rows and each query block's share qs that the keys pass
     * takes from dk (spread_block); then the one-hot rows' keys' dk */
    backward_items(w, p->batch * p->kv_heads * g.q_blocks, rows_item, &job);
    if (job.consistent && !any_failed(w, a)) {
        job.grad_mods = 0; /* the rows pass summed its modifiers' gradients */
        backward_items(w, p->batch * p->kv_heads * g.kv_blocks, keys_item, &job);
    }
    if (job.consistent && !any_failed(w, a))
        attn_pool_dynamic(w.pool, w.threads, p->batch * p->kv_heads, one_hot_dk_item, &job);
    for (size_t k = 0; k < p->score_mod_count; k++) {
        if (!((separate >> k) & 1u) || any_failed(w, a)) continue;
        size_t dims[3];
        mod_item_dims(&g, &p->score_mods[k], dims);
        job.grad_mods = 1u << k;
        job.target = k;
        backward_items(w, dims[0] * dims[1] * dims[2], mods_item, &job);
    }
}

const attn_flex_kernels FLEX_KERNELS = {
    .name = FLEX_ISA_NAME,
    .part_floats = flex_part_floats,
    .keys_floats = flex_keys_floats,
    .forward = flex_forward,
    .backward = flex_backward,
};
