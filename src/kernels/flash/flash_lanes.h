/*
 * flash_lanes.h — the forward of problems without dropout, with query rows
 * across the vector lanes (included by flash_kernel.h, after its shared pieces).
 *
 * Masks, windows, GQA, variable lengths, softcap, ALiBi and sinks are all
 * here. Problems without softcap and ALiBi keep raw scores (flash_shape:
 * raw); the others scale q by q_scale as the tiles do and modify each score
 * vector in registers (lane_mods): a modifier costs a few operations a
 * vector, not a path of its own. The score tile is
 * LANE_KT keys x LANE_QV vectors of VW query rows: each step loads LANE_QV
 * vectors of q^T and broadcasts LANE_KT key values for LANE_KT * LANE_QV
 * fused multiply-adds, and the output tile is LANE_KT dims x the same rows.
 * A row's statistics (max, sum, the rescaling) are then one lane of a
 * vector: no horizontal reduction, no scalar step per row, and the keys and
 * values are read as rows (broadcast one value at a time), where they lie
 * or packed once per head (strided rows, below), instead of packed k^T per
 * (query block, key block).
 *
 * Layouts, per head of the work item: q^T and o^T in groups of LG rows,
 * (rows / LG, dims, LG); the block's scores, then weights, (keys, LG).
 */

#define LG (LANE_QV * VW) /* query rows per lane group */
#define LBC 64            /* keys per block */
#define LKT LANE_KT       /* keys per score tile; dims per output tile */
_Static_assert(FBR % LG == 0 && FBR_MAX % LG == 0, "query blocks hold whole lane groups");
_Static_assert(LBC % LKT == 0, "key blocks hold whole score tiles");

/* Dims of o^T: D rounded up to whole output tiles. */
static size_t lane_dims(size_t D) { return (D + LKT - 1) / LKT * LKT; }

/* Floats of a part's packed keys and values of one (batch, KV head), (S +
 * LBC, D) and (S + LBC, Dv), where the rows have a stride; 0 where they
 * lie contiguous or would take more than LANES_PACK_FLOATS. In the
 * (B, T, H, D) layout a head's rows are 3 KiB apart at H = 12 and use a
 * quarter of L2's sets, so every query block read them from L3 again;
 * packed once per part and head, they stay in L2. */
#define LANES_PACK_FLOATS ((size_t)1 << 24)
static size_t lanes_pack_floats(const attn_attention_problem *p) {
    size_t D = p->head_dim, Dv = lane_dims(D);
    if (p->k.st.t == D && (p->v.st.t == D || !(float *)p->out.data)) return 0;
    if (D + Dv > LANES_PACK_FLOATS / (2 * LBC) || p->kv_len > LANES_PACK_FLOATS / (D + Dv) - LBC)
        return 0;
    return (p->kv_len + LBC) * (D + Dv);
}

/* Rows the pack's copies prefetch ahead: strided rows (3 KiB apart) are
 * past the hardware's stride prefetch, and the copies waited on memory. */
#define PACK_AHEAD 16

/* Which head a part's packed rows hold: rows [from, rows) of (batch, KV
 * head), each at its own index; the zeroed workspace starts it empty.
 * from is 0 unless a mask's rows begin past the first key (documents,
 * chunks): a block then packs from its own sweep, so that a head's packed
 * rows are the blocks' keys, in L2, not every key before them. Floats of
 * its slot: */
typedef struct lanes_pack {
    size_t b, kvh, from, rows;
} lanes_pack;
#define LANES_PACK_SLOT ((sizeof(lanes_pack) + 63) / 64 * 16)

/* Query rows per block of the lane forward: FBR, or more where the
 * problem and the machine allow. Each block sweeps its keys once, so
 * longer blocks sweep a head's keys and values fewer times: at T = 1024 a
 * head's 512 KiB come in once, not 4 times at 288 rows; at 16384 its 8 MiB
 * 16 times, not 57. The block length does not change a row's sums.
 * - Only with one query head per KV head (a GQA item already holds its
 *   group's heads of FBR rows) and rows that see their sequence's first
 *   key (rows_see_first_key: no left window, no documents). Every row's keys then
 *   start at its sequence's first key, so every block sweeps from there in
 *   the same blocks of LBC keys (sweep_start): a row's bits do not depend
 *   on its block, and the thread count may choose the blocks.
 * - A block's q^T and o^T take at most a third of one core's L2.
 * - Each thread keeps at least 4 blocks (items are handed out one at a
 *   time), and the blocks of a head are even. */
static size_t lane_rows(const attn_attention_problem *p, attn_flash_fit fit) {
    if (p->q_heads != p->kv_heads || fit.l2_bytes == 0 || p->q_len <= FBR || !rows_see_first_key(p))
        return FBR;
    size_t per_row = (p->head_dim + lane_dims(p->head_dim)) * sizeof(float);
    size_t cap = min_size(FBR_MAX, fit.l2_bytes / 3 / per_row / LG * LG);
    if (cap <= FBR) return FBR;
    size_t heads = p->batch * p->kv_heads, threads = fit.threads ? fit.threads : 1;
    size_t blocks = (p->q_len + cap - 1) / cap, spread = (4 * threads + heads - 1) / heads;
    if (spread > blocks) blocks = spread;
    size_t rows = ((p->q_len + blocks - 1) / blocks + LG - 1) / LG * LG;
    return rows < FBR ? FBR : rows;
}

static size_t lanes_workspace(const attn_attention_problem *p, size_t rows) {
    size_t D = p->head_dim, Dv = lane_dims(D), hc = heads_per_item(p, FBR, FORWARD_GROUP_TILE_FLOATS);
    /* per head: q^T (rows, D), o^T (rows, Dv), m, l (rows); a copied key
     * and value block (LBC, D), (LBC, Dv), the rows' key bounds (2 rows
     * int32) and ALiBi's near (rows), and the packed head with its slot */
    return hc * (rows * D + rows * Dv + 2 * rows) + LBC * D + LBC * Dv + 3 * rows + LANES_PACK_SLOT +
           lanes_pack_floats(p);
}

/* The lane forward takes problems without dropout (the lse-only call
 * draws none), and key indices that fit int32 lanes. */
static bool lanes_take(const flash_shape *f) {
    const attn_attention_problem *p = f->p;
    bool dropout = (float *)p->out.data != NULL && f->drop->kind != ATTN_DROP_NONE;
    return !dropout && p->kv_len <= (size_t)INT32_MAX - LBC;
}

/* One lane group's view of the keys: the union [lo, hi) of its rows' keys
 * and the keys [all_from, all_to) every row of it sees (empty: 0, 0). */
typedef struct lane_group {
    size_t lo, hi, all_from, all_to;
} lane_group;

static lane_group lane_group_of(const block_rows *br, size_t r0, size_t width) {
    lane_group lg = {.lo = (size_t)-1, .hi = 0, .all_from = 0, .all_to = (size_t)-1};
    for (size_t r = r0; r < r0 + width; r++) {
        size_t b = r < br->rows ? br->begin[r] : 0, e = r < br->rows ? br->end[r] : 0;
        if (b < e) {
            lg.lo = b < lg.lo ? b : lg.lo;
            lg.hi = e > lg.hi ? e : lg.hi;
        }
        lg.all_from = b > lg.all_from ? b : lg.all_from;
        lg.all_to = e < lg.all_to ? e : lg.all_to;
    }
    if (lg.lo >= lg.hi) lg.lo = lg.hi = 0;
    if (lg.all_from >= lg.all_to) lg.all_from = lg.all_to = 0;
    return lg;
}

/* Softcap, ALiBi and the relative bias on a lane group's scores (base-2,
 * q scaled), as modify_tile's: s = cap2 tanh(s / cap2), then s -= slope2
 * (|pos - j| - near), pos the row's position and near the distance to its
 * nearest visible key, then s += the bias at distance i - j. pos - j is
 * exact in float (positions below 2^24), as a lane's row offset plus the
 * group's pos0 - j. */
typedef struct lane_mods {
    float cap2, inv_cap2; /* 0, 0: no softcap */
    float neg_slope2;     /* 0: no ALiBi */
    int64_t pos0;         /* pos of the group's first row */
    const float *near;    /* the group's rows' near (LG) */
    /* the head's bias by row (bias_by_row) at the group's first row's
     * distance 0 (NULL: none): lane r of key j reads by_row[r - j] */
    const float *by_row;
} lane_mods;

/* A lane's row offset within its group, as a float: flash_kernel.h's
 * lane_of (0, 1, ... 63). */
_Static_assert(LG <= 64, "lane_of holds 64 offsets");

/* The modifiers on vector u of key j's scores. */
static inline __attribute__((always_inline)) vec lane_modify(const lane_mods *md, vec x, size_t j,
                                                             int u) {
    if (md->cap2 != 0.0f) x = v_mul(v_set1(md->cap2), v_tanh(v_mul(x, v_set1(md->inv_cap2))));
    if (md->neg_slope2 != 0.0f) {
        vec at = v_add(v_load(lane_of + u * VW), v_set1((float)(md->pos0 - (int64_t)j)));
        vec d = v_sub(v_abs(at), v_load(md->near + u * VW));
        x = v_fma(v_set1(md->neg_slope2), d, x);
    }
    if (md->by_row) x = v_add(x, v_load(md->by_row + u * VW - (ptrdiff_t)j));
    return x;
}

/* st (keys [t0, t1) of the block, LG lanes each) = the group's scores
 * against the block's keys kb (rows of kld floats), key j0 its first, then
 * the modifiers md (NULL: none); rows outside a key's [begin, end) get
 * -inf where the tile is not seen by all. mx, the lanes' running maxima,
 * takes the new scores. */
static inline __attribute__((always_inline)) void
lane_scores(const float *restrict qT, size_t D, int qv, const float *restrict kb, size_t kld,
            size_t j0, size_t t0, size_t t1, const lane_group *lg, const int32_t *begin,
            const int32_t *end, const lane_mods *md, float *restrict st, vec mx[LANE_QV]) {
    for (size_t kt = t0; kt < t1; kt += LKT) {
        const float *k_t = kb + kt * kld;
        bool masked = !(j0 + kt >= lg->all_from && j0 + kt + LKT <= lg->all_to);
        for (size_t d0 = 0; d0 < D; d0 += SCORE_CHAIN) {
            size_t d1 = min_size(d0 + SCORE_CHAIN, D);
            vec acc[LKT][LANE_QV];
            for (int i = 0; i < LKT; i++)
                for (int u = 0; u < qv; u++) acc[i][u] = v_zero();
            UNROLL_2
            for (size_t d = d0; d < d1; d++) {
                vec q[LANE_QV];
                for (int u = 0; u < qv; u++) q[u] = v_load(qT + d * LG + u * VW);
                for (int i = 0; i < LKT; i++)
                    for (int u = 0; u < qv; u++)
                        acc[i][u] = fma_broadcast(&k_t[i * kld + d], q[u], acc[i][u]);
            }
            /* chains of SCORE_CHAIN dims added in order, as score_tile's */
            for (int i = 0; i < LKT; i++)
                for (int u = 0; u < qv; u++) {
                    float *s = st + (kt + (size_t)i) * LG + u * VW;
                    v_store(s, d0 == 0 ? acc[i][u] : v_add(v_load(s), acc[i][u]));
                }
        }
        /* the mask and the maxima in a pass of their own, keeping a branch
         * on the mask out of the chains' sums */
        float *s_t = st + kt * LG;
        if (md) {
            for (int i = 0; i < LKT; i++)
                for (int u = 0; u < qv; u++) {
                    float *s = s_t + i * LG + u * VW;
                    size_t j = j0 + kt + (size_t)i;
                    vec x = lane_modify(md, v_load(s), j, u);
                    if (masked) x = v_keep_keys(x, (int32_t)j, begin + u * VW, end + u * VW);
                    mx[u] = v_max(mx[u], x);
                    v_store(s, x);
                }
        } else if (masked) {
            for (int i = 0; i < LKT; i++)
                for (int u = 0; u < qv; u++) {
                    float *s = s_t + i * LG + u * VW;
                    vec x = v_keep_keys(v_load(s), (int32_t)(j0 + kt + (size_t)i), begin + u * VW, end + u * VW);
                    mx[u] = v_max(mx[u], x);
                    v_store(s, x);
                }
        } else {
            for (int i = 0; i < LKT; i++)
                for (int u = 0; u < qv; u++) mx[u] = v_max(mx[u], v_load(s_t + i * LG + u * VW));
        }
    }
}

/* oT (Dv, LG) = oT * alpha + (weights st (keys [t0, t1), LG))^T-weighted
 * values vb (rows of vld floats, Dv readable in each); alpha is all ones
 * where !rescale, and oT is then taken as it is (the same bits). The
 * block's weighted values are summed on their own and added to oT once:
 * a row's output is then chains of at most LBC keys, not one chain over
 * all of them, whose rounding grows with the row's length (values that
 * share a large component, as x W's do, lose their differences in it). */
static inline __attribute__((always_inline)) void
lane_values(float *restrict oT, size_t Dv, int qv, const vec alpha[LANE_QV], bool rescale,
            const float *restrict st, size_t t0, size_t t1, const float *restrict vb, size_t vld) {
    for (size_t dc = 0; dc < Dv; dc += LKT) {
        vec acc[LKT][LANE_QV];
        for (int i = 0; i < LKT; i++)
            for (int u = 0; u < qv; u++) acc[i][u] = v_zero();
        UNROLL_2
        for (size_t j = t0; j < t1; j++) {
            vec w[LANE_QV];
            for (int u = 0; u < qv; u++) w[u] = v_load(st + j * LG + u * VW);
            const float *v_j = vb + j * vld + dc;
            for (int i = 0; i < LKT; i++)
                for (int u = 0; u < qv; u++) acc[i][u] = fma_broadcast(&v_j[i], w[u], acc[i][u]);
        }
        for (int i = 0; i < LKT; i++)
            for (int u = 0; u < qv; u++) {
                float *o = oT + (dc + (size_t)i) * LG + u * VW;
                vec sum = rescale ? v_fma(v_load(o), alpha[u], acc[i][u])
                                  : v_add(v_load(o), acc[i][u]);
                v_store(o, sum);
            }
    }
}

/* xT (lane groups of LG rows: (rows / LG, D, LG)) = rows [0, n) of x (row
 * stride ld, D wide), rows [rows, n) zero; 16 x 16 blocks in registers
 * where the instruction set has them (a scalar copy, and its inverse
 * below, would weigh on short sequences' forwards). */
static void lanes_to_columns(const float *x, size_t ld, size_t rows, size_t n, size_t D, float *xT) {
    for (size_t r = 0; r < n; r++) {
        float *col = xT + r / LG * D * LG + r % LG;
        size_t d = 0;
#if defined(HAVE_TRANSPOSE_BLOCK)
        if (r % VW == 0 && r + VW <= rows) { /* VW whole rows: blocks of VW dims */
            if (ld != D) /* strided rows: the next block's (flash_kernel.h, ROWS_AHEAD) */
                for (size_t rr = r + VW; rr < r + 2 * VW && rr < rows; rr++) prefetch_row(x + rr * ld, D);
            for (; d + VW <= D; d += VW) transpose_block(x + r * ld + d, ld, col + d * LG, LG);
            for (size_t rr = r; rr < r + VW; rr++)
                for (size_t dd = d; dd < D; dd++) xT[rr / LG * D * LG + dd * LG + rr % LG] = x[rr * ld + dd];
            r += VW - 1;
            continue;
        }
#endif
        for (; d < D; d++) col[d * LG] = r < rows ? x[r * ld + d] : 0.0f;
    }
}

/* Rows [0, rows) of y (row stride ld, D wide) = the lane groups of xT
 * (Dv dims each): lanes_to_columns' inverse. */
static void lanes_to_rows(const float *xT, size_t rows, size_t D, size_t Dv, float *y, size_t ld) {
    for (size_t r = 0; r < rows; r++) {
        const float *col = xT + r / LG * Dv * LG + r % LG;
        size_t d = 0;
#if defined(HAVE_TRANSPOSE_BLOCK)
        if (r % VW == 0 && r + VW <= rows) {
            if (ld != D)
                for (size_t rr = r + VW; rr < r + 2 * VW && rr < rows; rr++)
                    prefetch_row_for_write(y + rr * ld, D);
            for (; d + VW <= D; d += VW) transpose_block(col + d * LG, LG, y + r * ld + d, ld);
            for (size_t rr = r; rr < r + VW; rr++)
                for (size_t dd = d; dd < D; dd++) y[rr * ld + dd] = xT[rr / LG * Dv * LG + dd * LG + rr % LG];
            r += VW - 1;
            continue;
        }
#endif
        for (; d < D; d++) y[r * ld + d] = col[d * LG];
    }
}

/* One lane group's step against one key block, for each head. */
typedef struct lane_step {
    const lane_group *lg;
    const float *kb, *vb; /* vb NULL: no values (lse only) */
    size_t kld, vld, j0, t0, t1;
    const int32_t *begin, *end;
    const lane_mods *mods; /* NULL: none */
    float *st;
    float exp_scale;
} lane_step;

/* The group's scores against keys [t0, t1) of the block, the online
 * softmax per lane and the values' update, for one head. */
static inline __attribute__((always_inline)) void
lane_step_of(const lane_step *s, size_t D, int qv, float *qT, float *oT, float *m, float *l) {
    vec mx[LANE_QV];
    for (int u = 0; u < qv; u++) mx[u] = v_set1(-INFINITY);
    lane_scores(qT, D, qv, s->kb, s->kld, s->j0, s->t0, s->t1, s->lg, s->begin, s->end, s->mods,
                s->st, mx);
    /* m_new = max(m, block max); sums and outputs rescale by 2^((m -
     * m_new) c). A lane that has seen no key yet (m_new = -inf) subtracts
     * -FLT_MAX: its scores are -inf, its weights and alpha exactly 0.
     * Where no lane's max rose, every alpha is exactly 1 (2^0, or a lane
     * still at -inf whose o and l are 0 either way): the outputs skip the
     * rescale, as in most blocks of a long row. */
    vec m_old[LANE_QV], alpha[LANE_QV], top[LANE_QV], sum[LANE_QV], c = v_set1(s->exp_scale);
    bool rises = false;
    for (int u = 0; u < qv; u++) {
        m_old[u] = v_load(m + u * VW);
        rises |= v_any_greater(mx[u], m_old[u]) != 0;
    }
    for (int u = 0; u < qv; u++) {
        vec m_new = v_max(m_old[u], mx[u]);
        top[u] = v_max(m_new, v_set1(-FLT_MAX));
        alpha[u] = rises ? v_exp2(v_mul(v_sub(m_old[u], top[u]), c)) : v_set1(1.0f);
        v_store(m + u * VW, m_new);
        sum[u] = v_zero();
    }
    for (size_t j = s->t0; j < s->t1; j++)
        for (int u = 0; u < qv; u++) {
            float *x = s->st + j * LG + u * VW;
            vec e = v_exp2(v_mul(v_sub(v_load(x), top[u]), c));
            sum[u] = v_add(sum[u], e);
            v_store(x, e);
        }
    for (int u = 0; u < qv; u++) v_store(l + u * VW, v_fma(v_load(l + u * VW), alpha[u], sum[u]));
    if (s->vb) lane_values(oT, lane_dims(D), qv, alpha, rises, s->st, s->t0, s->t1, s->vb, s->vld);
}

/* The step for each head dim the compiler should know (its loops then
 * have constant trip counts) and each group width in vectors: the last
 * group of a block takes as many vectors as it has rows, not LANE_QV of
 * padding. Called directly and inlined: through a pointer, the steps lose
 * the knowledge that st is the forward's own stack array. Each is called
 * once, but gcc 12 keeps the 128-dim and any-dim steps out of line unless
 * forced, where their AVX-512 loops spill q^T to the stack and take
 * embedded broadcasts. */
#define LANE_STEP(DIM, QV)                                                                   \
    static inline __attribute__((always_inline)) void lane_step_##DIM##_##QV(               \
        const lane_step *s, size_t D, float *qT, float *oT, float *m, float *l) {          \
        lane_step_of(s, DIM ? DIM : D, QV, qT, oT, m, l);                                   \
    }
#define LANE_STEPS(QV) LANE_STEP(64, QV) LANE_STEP(128, QV) LANE_STEP(0, QV)
LANE_STEPS(1)
LANE_STEPS(2)
#if LANE_QV > 2
LANE_STEPS(3)
#endif
_Static_assert(LANE_QV <= 3, "lane steps are instantiated for up to 3 vectors");

static inline __attribute__((always_inline)) void
lane_step_run(const lane_step *s, size_t D, size_t qv, float *qT, float *oT, float *m, float *l) {
#define LANE_STEP_CALL(QV)                                                                   \
    (D == 64    ? lane_step_64_##QV(s, D, qT, oT, m, l)                                      \
     : D == 128 ? lane_step_128_##QV(s, D, qT, oT, m, l)                                     \
                : lane_step_0_##QV(s, D, qT, oT, m, l))
    switch (qv) {
    case 1: LANE_STEP_CALL(1); break;
#if LANE_QV > 2
    case 2: LANE_STEP_CALL(2); break;
    default: LANE_STEP_CALL(3); break;
#else
    default: LANE_STEP_CALL(2); break;
#endif
    }
#undef LANE_STEP_CALL
}

/* The end of the keys that the last row before row i0 that sees any sees
 * (0: none does): where both ends of a row's keys grow with the row, what
 * the query blocks before row i0 read up to. */
static size_t keys_seen_before(const attn_attention_problem *p, const attn_attention_seq *seq,
                               size_t i0) {
    for (size_t i = i0; i-- > 0;) {
        size_t kb, ke;
        attn_visible_keys(p, seq, i, &kb, &ke);
        if (kb < ke) return ke;
    }
    return 0;
}

/* A measuring forward's keys that no row of its query block reads: those
 * before the first block's sweep (packed rows start at key 0: none) and
 * after the last block's. With the keys each block reads, every key of
 * the sequence is measured, as the scan would (a NaN in a value no row
 * sees still reaches the reference's out as 0 * NaN). A mask's row
 * intervals may leave keys between two blocks' sweeps (a document no
 * query belongs to), and a block's pack then starts at its sweep
 * (windowed: lanes_pack): each block then measures the keys between the
 * last that the rows before it see and its sweep.
 * k, v: key 0 of the (batch, KV head). */
static void measure_unread_keys(const attn_attention_problem *p, const attn_attention_seq *seq,
                                const block_rows *br, bool packs, bool windowed, bool values,
                                const float *k, const float *v, float *top) {
    size_t D = p->head_dim, from = sweep_start(br, LBC), to = br->last;
    if (from >= to) { /* no row of the block sees a key: it reads none */
        from = seq->kv_len;
        to = 0;
    }
    bool intervals = p->block_map && p->block_map->row_lo;
    bool first = br->i0 == 0 && !packs;
    bool last = br->i0 + br->rows == seq->q_len || (first && intervals);
    size_t spans[2][2] = {{0, first ? from : 0}, {to, last ? seq->kv_len : to}};
    if (windowed) {
        /* the keys from what the blocks before read up to, to the block's sweep */
        spans[0][0] = keys_seen_before(p, seq, br->i0);
        spans[0][1] = from;
    }
    for (int s = 0; s < 2; s++) {
        size_t a = spans[s][0], n = spans[s][1] > a ? spans[s][1] - a : 0;
        if (n == 0) continue;
        top[1] = max_abs_rows(k + a * p->k.st.t, n, p->k.st.t, D, top[1]);
        if (values) top[2] = max_abs_rows(v + a * p->v.st.t, n, p->v.st.t, D, top[2]);
    }
}

/* Keys below which a measuring forward that reads its keys in place has
 * measured them in another item: every key, where this item is not its
 * query block's first chunk of heads (that chunk reads the same keys);
 * else, without a block map (each row's keys one interval whose ends grow
 * with the row), the keys the rows before the block see, which the query
 * blocks before it read: each key is then measured once, by the first
 * block that reads it, where every later block reads it again. A block
 * map's rows may see keys in any order: 0. */
static size_t keys_measured_before(const flash_shape *f, const query_item *it,
                                   const attn_attention_seq *seq, const block_rows *br) {
    const attn_attention_problem *p = f->p;
    if (it->h0 != it->kvh * f->G) return seq->kv_len;
    return p->block_map ? 0 : keys_seen_before(p, seq, br->i0);
}

/* Keys [a, z) of the (batch, KV head) at k_at, v_at into the part's
 * packed rows (lanes_pack), each at its own index; with top, their max
 * |k| and |v| as they sit in cache. */
static void pack_key_rows(const attn_attention_problem *p, const attn_attention_seq *seq,
                          size_t k_at, size_t v_at, bool values, size_t a, size_t z,
                          float *k_pack, float *v_pack, float *top) {
    size_t D = p->head_dim, Dv = lane_dims(D), kld = p->k.st.t, vld = p->v.st.t;
    for (size_t j = a; j < z; j++) {
        if (j + PACK_AHEAD < seq->kv_len) {
            prefetch_row((const float *)p->k.data + k_at + (j + PACK_AHEAD) * kld, D);
            if (values) prefetch_row((const float *)p->v.data + v_at + (j + PACK_AHEAD) * vld, D);
        }
        memcpy(k_pack + j * D, (const float *)p->k.data + k_at + j * kld, D * sizeof *k_pack);
        if (values) {
            memcpy(v_pack + j * Dv, (const float *)p->v.data + v_at + j * vld, D * sizeof *v_pack);
            memset(v_pack + j * Dv + D, 0, (Dv - D) * sizeof *v_pack);
        }
    }
    if (top && z > a) { /* the rows just packed, in cache */
        top[1] = max_abs_rows(k_pack + a * D, z - a, D, D, top[1]);
        if (values) top[2] = max_abs_rows(v_pack + a * Dv, z - a, Dv, D, top[2]);
    }
}

/* One work item of the lane forward (forward_block's item, br its rows). */
static void forward_lanes(const forward_job *job, size_t part, const query_item *it,
                          const attn_attention_seq *seq, const block_rows *br) {
    const flash_shape *f = &job->f;
    const attn_attention_problem *p = f->p;
    size_t D = f->D, Dv = lane_dims(D), nh = it->heads, b = it->b, i0 = br->i0, rows = br->rows;
    size_t groups = (rows + LG - 1) / LG, fbr = f->fbr;
    bool values = (float *)p->out.data != NULL;
    float *qT = job->workspace + part * job->per_part; /* (nh, fbr, D) */
    float *oT = qT + f->fhc * fbr * D;                   /* (nh, fbr, Dv) */
    float *m = oT + f->fhc * fbr * Dv, *l = m + f->fhc * fbr;
    float *kp = l + f->fhc * fbr, *vp = kp + LBC * D;
    int32_t *begin = (int32_t *)(vp + LBC * Dv), *end = begin + fbr;
    float *near = vp + LBC * Dv + 2 * fbr; /* br's near as floats, 0 past rows */
    lanes_pack *pack = (lanes_pack *)(void *)(vp + LBC * Dv + 3 * fbr);
    float *k_pack = vp + LBC * Dv + 3 * fbr + LANES_PACK_SLOT;
    float *v_pack = k_pack + (p->kv_len + LBC) * D;
    bool packs = lanes_pack_floats(p) > 0;
    if (packs && (pack->b != b || pack->kvh != it->kvh)) *pack = (lanes_pack){.b = b, .kvh = it->kvh};
    size_t sweep = sweep_start(br, LBC);
    size_t k_at = row_at(p->k.st, b, seq, true, it->kvh, 0);
    size_t v_at = row_at(p->v.st, b, seq, true, it->kvh, 0);
    /* a measuring forward's max |q|, |k|, |v| (inf: not finite), this part's */
    float *top = job->measure ? part_magnitudes(job->workspace, job->per_part, part) : NULL;
    size_t measured_to = top && !packs ? keys_measured_before(f, it, seq, br) : 0;
    if (packs && job->windowed_pack && br->first < br->last) {
        /* rows the block does not read stay unpacked; blocks come last
         * first, so a block's keys often end inside the pack: the rows
         * below it are added */
        if (sweep > pack->rows || br->last < pack->from) {
            pack->from = pack->rows = sweep;
        } else if (sweep < pack->from) {
            pack_key_rows(p, seq, k_at, v_at, values, sweep, pack->from, k_pack, v_pack, top);
            pack->from = sweep;
        }
    }
    for (size_t r = 0; r < groups * LG; r++) {
        begin[r] = r < rows ? (int32_t)br->begin[r] : 0;
        end[r] = r < rows ? (int32_t)br->end[r] : 0;
        near[r] = r < rows ? (float)br->near[r] : 0.0f;
    }
    for (size_t g = 0; g < nh; g++) {
        size_t h = it->h0 + g;
        const float *q = (const float *)p->q.data + row_at(p->q.st, b, seq, false, h, i0);
        float *qT_g = qT + g * fbr * D;
        lanes_to_columns(q, p->q.st.t, rows, groups * LG, D, qT_g);
        if (top) top[0] = max_abs_rows(q, rows, p->q.st.t, D, top[0]);
        if (f->q_scale != 1.0f) /* q * q_scale, as the row tiles' qs */
            for (size_t x = 0; x < groups * LG * D; x += VW)
                v_store(qT_g + x, v_mul(v_load(qT_g + x), v_set1(f->q_scale)));
        memset(oT + g * fbr * Dv, 0, groups * LG * Dv * sizeof *oT);
        for (size_t r = 0; r < groups * LG; r++) {
            bool sink = sink_start(f, h, r < rows, r < rows ? br->near[r] : 0, &m[g * fbr + r]);
            l[g * fbr + r] = sink ? 1.0f : 0.0f;
        }
    }
    lane_group lgs[FBR_MAX / LG];
    /* the block's scores, then weights: on the stack, where the compiler
     * knows no other pointer reaches them (in the workspace it must assume
     * q^T and o^T may alias them) */
    _Alignas(64) float st[LBC * LG];
    /* each group's width in vectors: the last one's rows, rounded up */
    size_t widths[FBR_MAX / LG];
    for (size_t gi = 0; gi < groups; gi++) {
        widths[gi] = min_size(LANE_QV, (rows - gi * LG + VW - 1) / VW);
        lgs[gi] = lane_group_of(br, gi * LG, widths[gi] * VW);
    }

    for (size_t j0 = sweep; j0 < br->last; j0 += LBC) {
        size_t cols = min_size(br->last - j0, LBC);
        /* whole blocks of contiguous rows are read in place; a partial
         * one, rows with a stride (the (B, T, H, D) layout: 64 rows 3 KiB
         * apart at H = 12 fall in a few L1 sets), or values with D not a
         * multiple of LKT, are copied, zero beyond their keys and dims */
        const float *kb = (const float *)p->k.data + k_at + j0 * p->k.st.t, *vb = (const float *)p->v.data + v_at + j0 * p->v.st.t;
        size_t kld = p->k.st.t, vld = p->v.st.t;
        if (packs) {
            /* rows up to the block's end, packed once per part and head;
             * rows past them are zero or another head's, finite, and any
             * tile reading them masks them (weight exactly 0) */
            pack_key_rows(p, seq, k_at, v_at, values, pack->rows, j0 + cols, k_pack, v_pack, top);
            if (j0 + cols > pack->rows) pack->rows = j0 + cols;
            kb = k_pack + j0 * D;
            kld = D;
            vb = v_pack + j0 * Dv;
            vld = Dv;
        } else if (top && j0 + cols > measured_to) { /* read in place: measured as read */
            size_t a = measured_to > j0 ? measured_to - j0 : 0;
            top[1] = max_abs_rows(kb + a * kld, cols - a, kld, D, top[1]);
            if (values) top[2] = max_abs_rows(vb + a * vld, cols - a, vld, D, top[2]);
        }
        if (cols < LBC || kld != D) {
            for (size_t j = 0; j < cols; j++) memcpy(kp + j * D, kb + j * kld, D * sizeof *kp);
            memset(kp + cols * D, 0, (LBC - cols) * D * sizeof *kp);
            kb = kp;
            kld = D;
        }
        if (values && (cols < LBC || Dv != D || vld != D)) {
            for (size_t j = 0; j < cols; j++) {
                memcpy(vp + j * Dv, vb + j * vld, D * sizeof *vp);
                memset(vp + j * Dv + D, 0, (Dv - D) * sizeof *vp);
            }
            memset(vp + cols * Dv, 0, (LBC - cols) * Dv * sizeof *vp);
            vb = vp;
            vld = Dv;
        }
        for (size_t gi = 0; gi < groups; gi++) {
            const lane_group *lg = &lgs[gi];
            size_t r0 = gi * LG;
            /* the group's keys in this block, in whole tiles */
            size_t lo = lg->lo > j0 ? lg->lo - j0 : 0, hi = lg->hi > j0 ? min_size(lg->hi - j0, cols) : 0;
            if (lo >= hi) continue; /* nothing seen: m, l and o stay */
            size_t t0 = lo / LKT * LKT, t1 = (hi + LKT - 1) / LKT * LKT;
            lane_mods mods = {.cap2 = f->cap2, .inv_cap2 = f->inv_cap2,
                              .pos0 = br->pos0 + (int64_t)r0, .near = near + r0};
            lane_step step = {.lg = lg, .kb = kb, .kld = kld, .vb = values ? vb : NULL, .vld = vld,
                              .j0 = j0, .t0 = t0, .t1 = t1, .begin = begin + r0, .end = end + r0,
                              .mods = f->modified ? &mods : NULL, .st = st,
                              .exp_scale = f->exp_scale};
            for (size_t g = 0; g < nh; g++) {
                float *qT_g = qT + g * fbr * D + r0 * D, *oT_g = oT + g * fbr * Dv + r0 * Dv;
                mods.neg_slope2 = -slope2_of(f, it->h0 + g);
                const float *by_row = bias_by_row(f, it->h0 + g);
                mods.by_row = by_row ? by_row + br->i0 + r0 : NULL;
                lane_step_run(&step, D, widths[gi], qT_g, oT_g, m + g * fbr + r0, l + g * fbr + r0);
            }
        }
    }
    if (top) measure_unread_keys(p, seq, br, packs, job->windowed_pack, values, (const float *)p->k.data + k_at, (const float *)p->v.data + v_at, top);
    /* lse as forward_block's (row_lse); a row that sees no key: lse = sink
     * or -inf, out 0. Then out = o / l rounded once. */
    for (size_t g = 0; g < nh; g++) {
        size_t h = it->h0 + g;
        for (size_t r = 0; r < rows; r++) {
            float lse, lo, stats[2];
            row_lse(f, h, m[g * fbr + r], &l[g * fbr + r], br->begin[r] < br->end[r], br->near[r],
                    &lse, &lo, stats);
            if (p->lse) {
                size_t at = attn_lse_index(p, b, h, i0 + r);
                p->lse[at] = lse;
                if (p->lse_lo) p->lse_lo[at] = lo;
                if (p->row_stats) memcpy(p->row_stats + 2 * at, stats, sizeof stats);
            }
        }
        if (values) {
            /* o / l in place, then back to rows; a row that saw no key has
             * o = 0 and l = 0 (or the sink's 1), and any other l >= 1 (its
             * max's weight is exactly 1): dividing by max(l, 1) gives both */
            float *oT_g = oT + g * fbr * Dv, *l_g = l + g * fbr;
            for (size_t r0 = 0; r0 < groups * LG; r0 += VW) {
                vec l_r = v_max(v_load(l_g + r0), v_set1(1.0f));
                float *o_r = oT_g + r0 / LG * Dv * LG + r0 % LG;
                for (size_t d = 0; d < D; d++) v_store(o_r + d * LG, v_div(v_load(o_r + d * LG), l_r));
            }
            lanes_to_rows(oT_g, rows, D, Dv, (float *)p->out.data + row_at(p->out.st, b, seq, false, h, i0),
                          p->out.st.t);
        }
    }
}
