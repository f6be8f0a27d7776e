/*
 * ring.c — ring attention (Liu et al., 2023) over MPI, plain and zigzag.
 *
 * Forward, rank r of P: K/V blocks travel r -> r + 1. At step t the rank
 * holds the block of rank s = r - t (mod P), posts the block's send to the
 * right and the next block's receive from the left, runs the fused kernel
 * on every (query chunk, key chunk) pair of the block that any query sees
 * (causal: key chunks wholly after a query chunk are skipped), with
 *   diagonal = ATTN_DIAGONAL_OFFSET, q_offset = the query chunk's global
 *   start - the key chunk's,
 * and merges the pair's (out, lse) into the running ones (merge_rows), then
 * waits for the next block: compute and transfer overlap. With a block
 * map over the whole sequence, a pair runs on its rectangle of it (the
 * query chunk's global tokens x the key chunk's: pair_maps, at token
 * offsets that need not fall on block edges), and a pair the map leaves
 * empty is skipped like a causally hidden one: no compute, while the
 * block still travels on.
 *
 * Backward: the K/V ring again, and dK/dV accumulators on a second ring,
 * each travelling with its block: at step t the rank adds its block
 * gradients (from the WHOLE rows' lse and out: backward_from_lse) to the
 * accumulator the left rank sent after its step t - 1, and sends it on;
 * after P steps every accumulator is one hop from its owner. dq sums
 * locally.
 *
 * Every buffer is allocated, and every rank agrees it has them, before the
 * first message: from then on nothing fails but MPI itself.
 */
#include "mpi/ring.h"

#include <math.h>
#include <string.h>

enum { TAG_KV = 11, TAG_DKV = 12 };

/* A rank's chunks: global first token, length, and offset in its local
 * tensors, in local order. */
typedef struct chunks {
    size_t n, local;
    size_t start[2], len[2], at[2];
} chunks;

static chunks chunks_of(const attn_mpi_group *g, size_t tokens, int rank) {
    chunks c = {0};
    size_t b[2], e[2];
    c.n = attn_mpi_local_ranges(g->mode, tokens, (size_t)g->size, (size_t)rank, b, e, &c.local);
    for (size_t i = 0, at = 0; i < c.n; i++) {
        c.start[i] = b[i];
        c.len[i] = e[i] - b[i];
        c.at[i] = at;
        at += c.len[i];
    }
    return c;
}

/* The owner of the block a rank holds at step t. */
static int owner_at(const attn_mpi_group *g, int rank, size_t t) {
    return (int)(((size_t)rank + (size_t)g->size - t % (size_t)g->size) % (size_t)g->size);
}

/* Whether any query of my chunk a may see a key of the block's chunk c by
 * the lengths and causality alone. */
static bool pair_seen(const attn_mpi_job *job, const chunks *mine, size_t a, const chunks *blk,
                      size_t c) {
    size_t la = mine->len[a], lc = blk->len[c];
    if (!la || !lc) return false;
    return !(job->causal && blk->start[c] > mine->start[a] + la - 1);
}

/* The index of pair (step t, my chunk a, the block's chunk c) in the
 * group's sub-maps. */
static size_t pair_index(size_t t, size_t a, size_t c) { return (t * 2 + a) * 2 + c; }

/*
 * The rectangle of the job's map each pair sees (its queries' global
 * tokens x its keys'), into the group's sub-maps: kept from the last call
 * over an equal map with the same causality (the forward's, for its
 * backward), else built. A pair whose rectangle shows nothing gets NULL
 * and is skipped; a pair causality skips gets none (which a call without
 * causality would need: causality is part of what is kept).
 */
static attn_status pair_maps(attn_mpi_group *g, const char *who, const attn_mpi_job *job) {
    size_t P = (size_t)g->size, n = 4 * P;
    if (!job->map || (g->maps.valid && g->maps.checksum == job->map_checksum &&
                      g->maps.causal == job->causal && g->maps.n == n))
        return ATTN_OK;
    attn_mpi_maps_free(&g->maps);
    attn_block_mask **sub = attn_calloc(n, sizeof *sub);
    if (!sub)
        return attn_fail(g->ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory for %zu block maps", who,
                         n);
    const attn_block_map *m = job->map;
    chunks mine = chunks_of(g, job->tokens, g->rank);
    attn_status st = ATTN_OK;
    for (size_t t = 0; t < P && st == ATTN_OK; t++) {
        chunks blk = chunks_of(g, job->tokens, owner_at(g, g->rank, t));
        for (size_t a = 0; a < mine.n && st == ATTN_OK; a++)
            for (size_t c = 0; c < blk.n && st == ATTN_OK; c++) {
                if (!pair_seen(job, &mine, a, &blk, c)) continue;
                attn_block_mask **x = &sub[pair_index(t, a, c)];
                st = attn_block_map_slice(g->ctx, who, m, 0, m->heads, mine.start[a],
                                          mine.start[a] + mine.len[a], blk.start[c],
                                          blk.start[c] + blk.len[c], x);
                if (st == ATTN_OK && attn_block_map_empty(attn_block_mask_map(*x))) {
                    attn_block_mask_free(*x);
                    *x = NULL;
                }
            }
    }
    g->maps = (attn_mpi_maps){.valid = st == ATTN_OK, .causal = job->causal,
                              .checksum = job->map_checksum, .n = n, .sub = sub};
    if (st != ATTN_OK) attn_mpi_maps_free(&g->maps);
    return st;
}

/*
 * The problem of query chunk a (of mine, in a packed (B, H, T_local, D)
 * buffer) against key chunk c of the block of step t (packed (B, Hkv, n,
 * D), K then V), with the pair's rectangle of the job's map: false when no
 * query of the chunk sees a key of it. Pointers are the caller's.
 */
static bool pair_problem(const attn_mpi_group *g, const attn_mpi_job *job, size_t t,
                         const chunks *mine, size_t a, const chunks *blk, size_t c,
                         attn_attention_problem *p) {
    if (!pair_seen(job, mine, a, blk, c)) return false;
    const attn_block_map *map = NULL;
    if (job->map) {
        const attn_block_mask *sub = g->maps.sub[pair_index(t, a, c)];
        if (!sub) return false;
        map = attn_block_mask_map(sub);
    }
    size_t H = job->heads, Hkv = job->kv_heads, D = job->head_dim;
    size_t Tl = mine->local, n = blk->local;
    *p = (attn_attention_problem){
        .batch = job->batch, .q_heads = H, .kv_heads = Hkv, .q_len = mine->len[a],
        .kv_len = blk->len[c], .head_dim = D, .v_head_dim = D,
        .q.st = {H * Tl * D, D, Tl * D},
        .k.st = {Hkv * n * D, D, n * D},
        .v.st = {Hkv * n * D, D, n * D},
        .out.st = {H * Tl * D, D, Tl * D},
        .scale = job->scale, .causal = job->causal,
        .diagonal = ATTN_DIAGONAL_OFFSET,
        .q_offset = (int64_t)mine->start[a] - (int64_t)blk->start[c],
        .block_map = map};
    return true;
}

/* Workspace bytes for every pair of every step (the largest), after the
 * runner's checks of each: ATTN_OK or the failure. */
static attn_status pairs_workspace(attn_mpi_group *g, const char *who, const attn_mpi_job *job,
                                   bool backward, size_t *bytes) {
    chunks mine = chunks_of(g, job->tokens, g->rank);
    *bytes = 0;
    for (size_t t = 0; t < (size_t)g->size; t++) {
        chunks blk = chunks_of(g, job->tokens, owner_at(g, g->rank, t));
        for (size_t a = 0; a < mine.n; a++)
            for (size_t c = 0; c < blk.n; c++) {
                attn_attention_problem p;
                if (!pair_problem(g, job, t, &mine, a, &blk, c, &p)) continue;
                p.lse = backward ? (float *)job->lse : NULL;
                p.backward_from_lse = backward;
                /* the tensors present as they will be (not where): a
                 * backend declines a problem by what it lacks (the flex
                 * backward, out), and the bytes are the taker's */
                p.q.data = (void *)job->q;
                p.k.data = (void *)job->k;
                p.v.data = (void *)job->v;
                p.out.data = job->out;
                attn_status st = attn_attention_check(g->ctx, who, &p);
                if (st != ATTN_OK) return st;
                size_t n = backward ? attn_attention_backward_bytes(g->ctx, &p)
                                    : attn_attention_forward_bytes(g->ctx, &p, false, false);
                if (n > *bytes) *bytes = n;
            }
    }
    return ATTN_OK;
}

/* Rows of a pair's (out, lse) merged into the running ones by the
 * log-sum-exp rule, in a numerically stable form:
 *   lse = max + log1p(exp(min - max))
 *   out = out - sigmoid(lse_blk - lse_acc) (out - out_blk)
 * A block row that saw no key (lse -inf) changes nothing; the first one a
 * row sees is copied; an element where either is not finite is the
 * weighted sum itself, w_acc out + w_blk out_blk, which keeps an infinity.
 * acc (B, H, T_local, D) at chunk offset `at`, blk (B, H, T_local, D)
 * likewise, lse (B, H, T_local) both. */
static void merge_rows(const attn_mpi_job *job, size_t Tl, size_t at, size_t len, float *acc_o,
                       float *acc_l, const float *blk_o, const float *blk_l) {
    size_t D = job->head_dim;
    for (size_t bh = 0; bh < job->batch * job->heads; bh++)
        for (size_t i = at; i < at + len; i++) {
            size_t row = bh * Tl + i;
            float lb = blk_l[row], la = acc_l[row];
            float *o = acc_o + row * D;
            const float *ob = blk_o + row * D;
            if (lb == -INFINITY) continue;
            if (la == -INFINITY) {
                memcpy(o, ob, D * sizeof *o);
                acc_l[row] = lb;
                continue;
            }
            double hi = la > lb ? la : lb, lo = la > lb ? lb : la;
            float w = (float)(1.0 / (1.0 + exp((double)la - (double)lb))); /* sigmoid(lb - la) */
            /* the two weights in double, for the elements that are not
             * finite: neither rounds to 0 where it is not */
            double wa = 1.0 / (1.0 + exp((double)lb - (double)la)), wb = 1.0 - wa;
            if (la > lb) wb = 1.0 / (1.0 + exp((double)la - (double)lb)), wa = 1.0 - wb;
            for (size_t d = 0; d < D; d++) {
                if (isfinite(o[d]) && isfinite(ob[d]))
                    o[d] -= w * (o[d] - ob[d]);
                else /* an infinity a row weighs stays one: o - w (o - ob) is inf - inf */
                    o[d] = (float)(wa * (double)o[d] + wb * (double)ob[d]);
            }
            acc_l[row] = (float)(hi + log1p(exp(lo - hi)));
        }
}

/* Lets MPI move the messages of the step while the kernels run between
 * pairs (a test completes nothing it should not). */
static void progress(MPI_Request *reqs, int n) {
    int done;
    MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
}

static double now(void) { return MPI_Wtime(); }

/* The most tokens any rank holds: the size of a K/V block in flight. */
static size_t largest_local(const attn_mpi_group *g, size_t T) {
    size_t most = 0;
    for (int s = 0; s < g->size; s++) {
        chunks c = chunks_of(g, T, s);
        if (c.local > most) most = c.local;
    }
    return most;
}

/* ---- forward ---------------------------------------------------------------- */

attn_status attn_mpi_ring_forward(attn_mpi_group *g, const char *who, const attn_mpi_job *job) {
    attn_ctx *ctx = g->ctx;
    size_t P = (size_t)g->size, B = job->batch, H = job->heads, Hkv = job->kv_heads;
    size_t D = job->head_dim, T = job->tokens;
    chunks mine = chunks_of(g, T, g->rank);
    size_t Tl = mine.local, nmax = largest_local(g, T);
    size_t rows = B * H * Tl, kv_floats = 2 * B * Hkv * nmax * D, ws_bytes = 0;
    attn_status st = attn_mpi_job_check(g, who, job);
    if (st == ATTN_OK) st = pair_maps(g, who, job);
    if (st == ATTN_OK) st = pairs_workspace(g, who, job, false, &ws_bytes);
    /* q (B, H, Tl, D) packed; two K/V blocks; the running (out, lse), a
     * pair's at the same layout, and the pair's lse as the kernel writes it */
    float *qp = NULL, *kv[2] = {NULL, NULL}, *acc_o = NULL, *acc_l = NULL, *blk_o = NULL,
          *blk_l = NULL, *pair_l = NULL;
    void *ws = NULL;
    MPI_Datatype row = MPI_DATATYPE_NULL;
    if (st == ATTN_OK) {
        qp = attn_alloc_floats(rows * D);
        kv[0] = attn_alloc_floats(kv_floats);
        kv[1] = attn_alloc_floats(kv_floats);
        acc_o = attn_alloc_floats(rows * D);
        blk_o = attn_alloc_floats(rows * D);
        acc_l = attn_alloc_floats(rows);
        blk_l = attn_alloc_floats(rows);
        pair_l = attn_alloc_floats(rows);
        ws = attn_aligned_alloc(64, ws_bytes);
        if (!qp || !kv[0] || !kv[1] || !acc_o || !blk_o || !acc_l || !blk_l || !pair_l || !ws ||
            !attn_mpi_timeline_reserve(g, P))
            st = attn_fail(ctx, ATTN_ERR_NO_MEMORY,
                           "%s: out of memory for the ring's buffers (%zu floats)", who,
                           4 * rows * D + 2 * kv_floats);
    }
    if (st == ATTN_OK) {
        int rc = attn_mpi_row_type(D, &row);
        if (rc != MPI_SUCCESS) st = attn_mpi_error(g, who, "MPI_Type_contiguous", rc);
    }
    st = attn_mpi_agree(g, who, st, NULL);
    if (st != ATTN_OK) goto done;

    /* from here on nothing fails but MPI */
    attn_mpi_pack(qp, job->q, job->q_s, B, H, Tl, D);
    attn_mpi_pack(kv[0], job->k, job->k_s, B, Hkv, Tl, D);
    attn_mpi_pack(kv[0] + B * Hkv * Tl * D, job->v, job->v_s, B, Hkv, Tl, D);
    for (size_t i = 0; i < rows; i++) acc_l[i] = -INFINITY;
    int left = (int)(((size_t)g->rank + P - 1) % P), right = (int)(((size_t)g->rank + 1) % P);
    MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL}; /* send, receive */
    int rc = MPI_SUCCESS;
    for (size_t t = 0; t < P && rc == MPI_SUCCESS; t++) {
        attn_mpi_step *step = &g->steps[t];
        step->begin = now();
        chunks blk = chunks_of(g, T, owner_at(g, g->rank, t));
        float *cur = kv[t % 2];
        if (t + 1 < P) {
            /* the buffer the next block lands in was last step's send */
            rc = MPI_Wait(&req[0], MPI_STATUS_IGNORE);
            chunks next = chunks_of(g, T, owner_at(g, g->rank, t + 1));
            if (rc == MPI_SUCCESS)
                rc = MPI_Irecv(kv[(t + 1) % 2], (int)(2 * B * Hkv * next.local), row, left,
                               TAG_KV, g->comm, &req[1]);
            if (rc == MPI_SUCCESS)
                rc = MPI_Isend(cur, (int)(2 * B * Hkv * blk.local), row, right, TAG_KV, g->comm,
                               &req[0]);
            if (rc != MPI_SUCCESS) break;
        }
        step->posted = now();
        for (size_t a = 0; a < mine.n; a++)
            for (size_t c = 0; c < blk.n; c++) {
                attn_attention_problem p;
                if (!pair_problem(g, job, t, &mine, a, &blk, c, &p)) continue;
                size_t at = mine.at[a];
                p.q.data = qp + at * D;
                p.k.data = cur + blk.at[c] * D;
                p.v.data = cur + B * Hkv * blk.local * D + blk.at[c] * D;
                p.out.data = blk_o + at * D;
                p.lse = pair_l; /* (B, H, la) */
                /* checked and its workspace in hand; were it to fail, the
                 * ring still runs to its end (the other ranks wait on
                 * this one's blocks) and the failure is returned then */
                attn_status pair = attn_attention_forward(ctx, who, &p, NULL, NULL, NULL, NULL, ws);
                if (st == ATTN_OK) st = pair;
                size_t la = mine.len[a];
                for (size_t bh = 0; bh < B * H; bh++)
                    memcpy(blk_l + bh * Tl + at, pair_l + bh * la, la * sizeof *blk_l);
                merge_rows(job, Tl, at, la, acc_o, acc_l, blk_o, blk_l);
                if (t + 1 < P) progress(req, 2);
            }
        step->computed = now();
        if (t + 1 < P) rc = MPI_Wait(&req[1], MPI_STATUS_IGNORE);
        step->arrived = now();
        g->n_steps = t + 1;
    }
    if (rc == MPI_SUCCESS) rc = MPI_Waitall(2, req, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
        st = attn_mpi_error(g, who, "the K/V ring", rc);
        goto done;
    }
    if (st != ATTN_OK) goto done;
    attn_mpi_unpack(job->out, job->out_s, acc_o, B, H, Tl, D);
    if (job->lse) memcpy(job->lse, acc_l, rows * sizeof *acc_l);
done:
    if (row != MPI_DATATYPE_NULL) MPI_Type_free(&row);
    attn_free(qp);
    attn_free(kv[0]);
    attn_free(kv[1]);
    attn_free(acc_o);
    attn_free(acc_l);
    attn_free(blk_o);
    attn_free(blk_l);
    attn_free(pair_l);
    attn_free(ws);
    return st;
}

/* ---- backward ---------------------------------------------------------------- */

/* dst (n floats) += src */
static void add_floats(float *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

/* dst rows [at, at + len) of a (BH, n, D) buffer += src's */
static void add_rows(float *dst, const float *src, size_t bh, size_t n, size_t at, size_t len,
                     size_t D) {
    for (size_t x = 0; x < bh; x++)
        add_floats(dst + (x * n + at) * D, src + (x * n + at) * D, len * D);
}

attn_status attn_mpi_ring_backward(attn_mpi_group *g, const char *who, const attn_mpi_job *job) {
    attn_ctx *ctx = g->ctx;
    size_t P = (size_t)g->size, B = job->batch, H = job->heads, Hkv = job->kv_heads;
    size_t D = job->head_dim, T = job->tokens;
    chunks mine = chunks_of(g, T, g->rank);
    size_t Tl = mine.local, nmax = largest_local(g, T);
    size_t rows = B * H * Tl, kv_floats = 2 * B * Hkv * nmax * D, ws_bytes = 0;
    attn_status st = attn_mpi_job_check(g, who, job);
    if (st == ATTN_OK) st = pair_maps(g, who, job);
    if (st == ATTN_OK) st = pairs_workspace(g, who, job, true, &ws_bytes);
    /* q, out, dout, dq (the sum), dq (a pair's): (B, H, Tl, D) packed; lse
     * per chunk (B, H, len) as the kernel reads it; K/V blocks, dK/dV
     * accumulators (two of each: one in flight, one in use), a block's
     * gradient and a pair's */
    float *qp = NULL, *op = NULL, *dop = NULL, *dq = NULL, *dq_pair = NULL, *lse_c = NULL;
    float *kv[2] = {NULL, NULL}, *dkv[2] = {NULL, NULL}, *dkv_blk = NULL, *dkv_pair = NULL;
    void *ws = NULL;
    MPI_Datatype row = MPI_DATATYPE_NULL;
    if (st == ATTN_OK) {
        qp = attn_alloc_floats(rows * D);
        op = attn_alloc_floats(rows * D);
        dop = attn_alloc_floats(rows * D);
        dq = attn_alloc_floats(rows * D);
        dq_pair = attn_alloc_floats(rows * D);
        lse_c = attn_alloc_floats(rows);
        for (int i = 0; i < 2; i++) {
            kv[i] = attn_alloc_floats(kv_floats);
            dkv[i] = attn_alloc_floats(kv_floats);
        }
        dkv_blk = attn_alloc_floats(kv_floats);
        dkv_pair = attn_alloc_floats(kv_floats);
        ws = attn_aligned_alloc(64, ws_bytes);
        if (!qp || !op || !dop || !dq || !dq_pair || !lse_c || !kv[0] || !kv[1] || !dkv[0] ||
            !dkv[1] || !dkv_blk || !dkv_pair || !ws || !attn_mpi_timeline_reserve(g, P))
            st = attn_fail(ctx, ATTN_ERR_NO_MEMORY,
                           "%s: out of memory for the ring's buffers (%zu floats)", who,
                           5 * rows * D + 6 * kv_floats);
    }
    if (st == ATTN_OK) {
        int rc = attn_mpi_row_type(D, &row);
        if (rc != MPI_SUCCESS) st = attn_mpi_error(g, who, "MPI_Type_contiguous", rc);
    }
    st = attn_mpi_agree(g, who, st, NULL);
    if (st != ATTN_OK) goto done;

    attn_mpi_pack(qp, job->q, job->q_s, B, H, Tl, D);
    attn_mpi_pack(op, job->out, job->out_s, B, H, Tl, D);
    attn_mpi_pack(dop, job->dout, job->out_s, B, H, Tl, D);
    attn_mpi_pack(kv[0], job->k, job->k_s, B, Hkv, Tl, D);
    attn_mpi_pack(kv[0] + B * Hkv * Tl * D, job->v, job->v_s, B, Hkv, Tl, D);
    for (size_t a = 0; a < mine.n; a++)
        for (size_t bh = 0; bh < B * H; bh++)
            memcpy(lse_c + B * H * mine.at[a] + bh * mine.len[a], job->lse + bh * Tl + mine.at[a],
                   mine.len[a] * sizeof *lse_c);
    int left = (int)(((size_t)g->rank + P - 1) % P), right = (int)(((size_t)g->rank + 1) % P);
    /* K/V send, K/V receive, dK/dV receive, and a dK/dV send per buffer
     * (a buffer's send is two steps old when it receives again: no wait) */
    enum { KV_SEND, KV_RECV, DKV_RECV, DKV_SEND };
    MPI_Request req[5] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL,
                          MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    int rc = MPI_SUCCESS;
    for (size_t t = 0; t < P && rc == MPI_SUCCESS; t++) {
        attn_mpi_step *step = &g->steps[t];
        step->begin = now();
        chunks blk = chunks_of(g, T, owner_at(g, g->rank, t));
        float *cur = kv[t % 2], *acc = dkv[t % 2];
        size_t blk_floats = 2 * B * Hkv * blk.local * D;
        if (t + 1 < P) {
            rc = MPI_Wait(&req[KV_SEND], MPI_STATUS_IGNORE);
            chunks next = chunks_of(g, T, owner_at(g, g->rank, t + 1));
            if (rc == MPI_SUCCESS)
                rc = MPI_Irecv(kv[(t + 1) % 2], (int)(2 * B * Hkv * next.local), row, left,
                               TAG_KV, g->comm, &req[KV_RECV]);
            if (rc == MPI_SUCCESS)
                rc = MPI_Isend(cur, (int)(2 * B * Hkv * blk.local), row, right, TAG_KV, g->comm,
                               &req[KV_SEND]);
        }
        if (t > 0 && rc == MPI_SUCCESS) {
            /* this block's accumulator, from the left rank's last step */
            rc = MPI_Wait(&req[DKV_SEND + t % 2], MPI_STATUS_IGNORE);
            if (rc == MPI_SUCCESS)
                rc = MPI_Irecv(acc, (int)(2 * B * Hkv * blk.local), row, left, TAG_DKV, g->comm,
                               &req[DKV_RECV]);
        }
        if (rc != MPI_SUCCESS) break;
        step->posted = now();
        /* the block's gradient: straight into the accumulator at step 0 */
        float *sum = t == 0 ? acc : dkv_blk;
        memset(sum, 0, blk_floats * sizeof *sum);
        for (size_t a = 0; a < mine.n; a++)
            for (size_t c = 0; c < blk.n; c++) {
                attn_attention_problem p;
                if (!pair_problem(g, job, t, &mine, a, &blk, c, &p)) continue;
                size_t at = mine.at[a], kat = blk.at[c], vat = B * Hkv * blk.local * D;
                p.q.data = qp + at * D;
                p.k.data = cur + kat * D;
                p.v.data = cur + vat + kat * D;
                p.out.data = op + at * D;
                p.lse = lse_c + B * H * at;
                p.backward_from_lse = true;
                attn_attention_grads gr = {.dout = dop + at * D, .dq = dq_pair + at * D,
                                           .dk = dkv_pair + kat * D,
                                           .dv = dkv_pair + vat + kat * D};
                /* as the forward's pairs: a failure is returned at the end */
                attn_status pair = attn_attention_backward(ctx, who, &p, NULL, &gr, ws);
                if (st == ATTN_OK) st = pair;
                add_rows(dq, dq_pair, B * H, Tl, at, mine.len[a], D);
                add_rows(sum, dkv_pair, B * Hkv, blk.local, kat, blk.len[c], D);
                add_rows(sum + vat, dkv_pair + vat, B * Hkv, blk.local, kat, blk.len[c], D);
                progress(req, 5);
            }
        step->computed = now();
        if (t > 0) {
            rc = MPI_Wait(&req[DKV_RECV], MPI_STATUS_IGNORE);
            if (rc == MPI_SUCCESS) add_floats(acc, dkv_blk, blk_floats);
        }
        /* on to the next rank: the last step's goes to the block's owner */
        if (rc == MPI_SUCCESS)
            rc = MPI_Isend(acc, (int)(2 * B * Hkv * blk.local), row, right, TAG_DKV, g->comm,
                           &req[DKV_SEND + t % 2]);
        if (rc == MPI_SUCCESS && t + 1 < P) rc = MPI_Wait(&req[KV_RECV], MPI_STATUS_IGNORE);
        step->arrived = now();
        g->n_steps = t + 1;
    }
    /* my own block's accumulator, from the left rank's last step (one rank:
     * the one it just sent itself), into the buffer not in flight */
    float *own = dkv[P % 2];
    if (rc == MPI_SUCCESS) rc = MPI_Wait(&req[DKV_SEND + P % 2], MPI_STATUS_IGNORE);
    if (rc == MPI_SUCCESS)
        rc = MPI_Irecv(own, (int)(2 * B * Hkv * Tl), row, left, TAG_DKV, g->comm,
                       &req[DKV_RECV]);
    if (rc == MPI_SUCCESS) rc = MPI_Waitall(5, req, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
        st = attn_mpi_error(g, who, "the ring", rc);
        goto done;
    }
    if (st != ATTN_OK) goto done;
    attn_mpi_unpack(job->dq, job->q_s, dq, B, H, Tl, D);
    attn_mpi_unpack(job->dk, job->k_s, own, B, Hkv, Tl, D);
    attn_mpi_unpack(job->dv, job->v_s, own + B * Hkv * Tl * D, B, Hkv, Tl, D);
done:
    if (row != MPI_DATATYPE_NULL) MPI_Type_free(&row);
    attn_free(qp);
    attn_free(op);
    attn_free(dop);
    attn_free(dq);
    attn_free(dq_pair);
    attn_free(lse_c);
    for (int i = 0; i < 2; i++) {
        attn_free(kv[i]);
        attn_free(dkv[i]);
    }
    attn_free(dkv_blk);
    attn_free(dkv_pair);
    attn_free(ws);
    return st;
}
