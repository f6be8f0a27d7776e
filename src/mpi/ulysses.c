/*
 * ulysses.c — DeepSpeed-Ulysses context parallelism (Jacobs et al., 2023):
 * each rank holds a contiguous chunk of the tokens with every head; an
 * all-to-all gives each rank the whole sequence of H / P heads (query heads
 * r H / P ..., and their KV heads r Hkv / P ...: the GQA groups stay
 * whole), it runs the attention on them alone, and a second all-to-all
 * returns the outputs (and lse) to the tokens' ranks. The backward sends q,
 * k, v, out, dout and lse the same way and dq, dk, dv back. Two
 * collectives per pass, each moving a rank's whole chunk: no overlap, but
 * no rank computes more than its share. A block map over the whole
 * sequence is the rank's problem's own where it is one for every head;
 * a map per head is sliced to the rank's heads (heads_map).
 */
#include "mpi/ulysses.h"

#include <limits.h>
#include <math.h>
#include <string.h>

/* One tensor moved by an exchange: `heads` heads of `width` floats per
 * token, as the rank's (b, t, h)-strided chunk view and as the whole
 * sequence of its H / P heads, (B, heads / P, T, width) contiguous. */
typedef struct part {
    size_t heads, width;
    const float *in;   /* the chunk view, read by to_heads */
    float *out;        /* the chunk view, written by from_heads */
    attn_view_strides s;
    float *full;
} part;

typedef struct plan {
    attn_mpi_group *g;
    size_t batch, tokens, local;
    size_t *count, *start; /* (P) each rank's tokens */
    int *sc, *sd, *rc, *rd; /* (P) counts and displacements, floats */
    float *sbuf, *rbuf;
} plan;

/* Floats a rank sends to each rank, or receives from each, over parts
 * (to_heads: its chunk of H / P heads; the reverse from_heads). */
static size_t part_floats(const plan *pl, const part *parts, size_t n, size_t tokens) {
    size_t P = (size_t)pl->g->size, sum = 0;
    for (size_t i = 0; i < n; i++) sum += pl->batch * (parts[i].heads / P) * tokens * parts[i].width;
    return sum;
}

static void plan_free(plan *pl) {
    attn_free(pl->count);
    attn_free(pl->start);
    attn_free(pl->sc);
    attn_free(pl->sd);
    attn_free(pl->rc);
    attn_free(pl->rd);
    attn_free(pl->sbuf);
    attn_free(pl->rbuf);
}

/* The counts and buffers of exchanges over in_parts (to the heads) and
 * out_parts (back): allocated, counts checked against int. */
static attn_status plan_new(attn_mpi_group *g, const char *who, const attn_mpi_job *job,
                            const part *in_parts, size_t n_in, const part *out_parts,
                            size_t n_out, plan *pl) {
    size_t P = (size_t)g->size;
    *pl = (plan){.g = g, .batch = job->batch, .tokens = job->tokens, .local = job->local};
    pl->count = attn_calloc(P, sizeof *pl->count);
    pl->start = attn_calloc(P, sizeof *pl->start);
    pl->sc = attn_calloc(P, sizeof *pl->sc);
    pl->sd = attn_calloc(P, sizeof *pl->sd);
    pl->rc = attn_calloc(P, sizeof *pl->rc);
    pl->rd = attn_calloc(P, sizeof *pl->rd);
    if (!pl->count || !pl->start || !pl->sc || !pl->sd || !pl->rc || !pl->rd)
        return attn_fail(g->ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory", who);
    for (size_t p = 0; p < P; p++) {
        size_t b[2], e[2];
        attn_mpi_local_ranges(ATTN_MPI_ULYSSES, job->tokens, P, p, b, e, &pl->count[p]);
        pl->start[p] = b[0];
    }
    /* the largest buffer either way: a chunk of all heads, or all tokens of
     * H / P heads */
    size_t most = 0;
    const part *sets[2] = {in_parts, out_parts};
    size_t ns[2] = {n_in, n_out};
    for (int k = 0; k < 2; k++) {
        size_t chunk = part_floats(pl, sets[k], ns[k], job->local) * P;
        size_t whole = part_floats(pl, sets[k], ns[k], job->tokens);
        if (chunk > most) most = chunk;
        if (whole > most) most = whole;
    }
    if (most > INT_MAX)
        return attn_fail(g->ctx, ATTN_ERR_OVERFLOW,
                         "%s: %zu floats are too many for one all-to-all (at most %d)", who, most,
                         INT_MAX);
    pl->sbuf = attn_alloc_floats(most);
    pl->rbuf = attn_alloc_floats(most);
    if (!pl->sbuf || !pl->rbuf)
        return attn_fail(g->ctx, ATTN_ERR_NO_MEMORY,
                         "%s: out of memory for the all-to-all's buffers (2 x %zu floats)", who,
                         most);
    return ATTN_OK;
}

/* Token chunks (all heads) -> whole sequences (the rank's heads). */
static int to_heads(plan *pl, const part *parts, size_t n) {
    attn_mpi_group *g = pl->g;
    size_t P = (size_t)g->size, B = pl->batch, T = pl->tokens, Tl = pl->local;
    float *w = pl->sbuf;
    for (size_t p = 0; p < P; p++) {
        pl->sd[p] = (int)(w - pl->sbuf);
        for (size_t i = 0; i < n; i++) {
            const part *x = &parts[i];
            size_t hp = x->heads / P;
            for (size_t b = 0; b < B; b++)
                for (size_t hh = 0; hh < hp; hh++)
                    for (size_t t = 0; t < Tl; t++, w += x->width)
                        memcpy(w, x->in + attn_view_offset(x->s, b, 0, p * hp + hh, t),
                               x->width * sizeof *w);
        }
        pl->sc[p] = (int)(w - pl->sbuf) - pl->sd[p];
    }
    size_t at = 0;
    for (size_t p = 0; p < P; p++) {
        pl->rd[p] = (int)at;
        pl->rc[p] = (int)part_floats(pl, parts, n, pl->count[p]);
        at += (size_t)pl->rc[p];
    }
    int rc = MPI_Alltoallv(pl->sbuf, pl->sc, pl->sd, MPI_FLOAT, pl->rbuf, pl->rc, pl->rd,
                           MPI_FLOAT, g->comm);
    if (rc != MPI_SUCCESS) return rc;
    const float *r = pl->rbuf;
    for (size_t p = 0; p < P; p++)
        for (size_t i = 0; i < n; i++) {
            const part *x = &parts[i];
            size_t hp = x->heads / P, len = pl->count[p] * x->width;
            for (size_t bh = 0; bh < B * hp; bh++, r += len)
                memcpy(x->full + (bh * T + pl->start[p]) * x->width, r, len * sizeof *r);
        }
    return MPI_SUCCESS;
}

/* Whole sequences (the rank's heads) -> token chunks (all heads). */
static int from_heads(plan *pl, const part *parts, size_t n) {
    attn_mpi_group *g = pl->g;
    size_t P = (size_t)g->size, B = pl->batch, T = pl->tokens, Tl = pl->local;
    float *w = pl->sbuf;
    for (size_t p = 0; p < P; p++) {
        pl->sd[p] = (int)(w - pl->sbuf);
        for (size_t i = 0; i < n; i++) {
            const part *x = &parts[i];
            size_t hp = x->heads / P, len = pl->count[p] * x->width;
            for (size_t bh = 0; bh < B * hp; bh++, w += len)
                memcpy(w, x->full + (bh * T + pl->start[p]) * x->width, len * sizeof *w);
        }
        pl->sc[p] = (int)(w - pl->sbuf) - pl->sd[p];
    }
    size_t at = 0;
    for (size_t p = 0; p < P; p++) {
        pl->rd[p] = (int)at;
        pl->rc[p] = (int)part_floats(pl, parts, n, Tl);
        at += (size_t)pl->rc[p];
    }
    int rc = MPI_Alltoallv(pl->sbuf, pl->sc, pl->sd, MPI_FLOAT, pl->rbuf, pl->rc, pl->rd,
                           MPI_FLOAT, g->comm);
    if (rc != MPI_SUCCESS) return rc;
    const float *r = pl->rbuf;
    for (size_t p = 0; p < P; p++)
        for (size_t i = 0; i < n; i++) {
            const part *x = &parts[i];
            size_t hp = x->heads / P;
            for (size_t b = 0; b < B; b++)
                for (size_t hh = 0; hh < hp; hh++)
                    for (size_t t = 0; t < Tl; t++, r += x->width)
                        memcpy(x->out + attn_view_offset(x->s, b, 0, p * hp + hh, t), r,
                               x->width * sizeof *r);
        }
    return MPI_SUCCESS;
}

/*
 * The job's map as the rank's heads see it: the map itself where it is
 * one for every head; else its rows of heads r H / P ... (a slice, kept
 * in the group from the last call over an equal map). *map NULL without
 * one.
 */
static attn_status heads_map(attn_mpi_group *g, const char *who, const attn_mpi_job *job,
                             const attn_block_map **map) {
    const attn_block_map *m = job->map;
    *map = m;
    if (!m || m->heads == 1) return ATTN_OK;
    size_t hp = job->heads / (size_t)g->size, h0 = (size_t)g->rank * hp;
    if (!(g->maps.valid && g->maps.checksum == job->map_checksum && g->maps.n == 1)) {
        attn_mpi_maps_free(&g->maps);
        attn_block_mask **sub = attn_calloc(1, sizeof *sub);
        if (!sub)
            return attn_fail(g->ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory for a block map",
                             who);
        attn_status st = attn_block_map_heads(g->ctx, who, m, h0, h0 + hp, sub);
        if (st != ATTN_OK) {
            attn_free(sub);
            return st;
        }
        g->maps = (attn_mpi_maps){.valid = true, .checksum = job->map_checksum, .n = 1,
                                  .sub = sub};
    }
    *map = attn_block_mask_map(g->maps.sub[0]);
    return ATTN_OK;
}

/* The attention of the rank's heads over the whole sequence. */
static attn_attention_problem heads_problem(const attn_mpi_group *g, const attn_mpi_job *job) {
    size_t P = (size_t)g->size, H = job->heads / P, Hkv = job->kv_heads / P;
    size_t T = job->tokens, D = job->head_dim;
    return (attn_attention_problem){
        .batch = job->batch, .q_heads = H, .kv_heads = Hkv, .q_len = T, .kv_len = T,
        .head_dim = D, .v_head_dim = D,
        .q.st = {H * T * D, D, T * D}, .out.st = {H * T * D, D, T * D},
        .k.st = {Hkv * T * D, D, T * D}, .v.st = {Hkv * T * D, D, T * D},
        .scale = job->scale, .causal = job->causal, .whole_kv_heads = job->kv_heads};
}

/* The job's head_stats as p's lse_lo and row_stats, laid out as p's lse
 * (rows floats): the forward writes them, the backward on the same rank
 * reads them. */
static void set_head_stats(attn_attention_problem *p, const attn_mpi_job *job, size_t rows) {
    if (!job->head_stats) return;
    p->lse_lo = job->head_stats;
    p->row_stats = job->head_stats + rows;
}

/* The whole problem's values as the backends judge them (p's whole_tops,
 * tops (6)): each rank's max |x| of q, k, v (and dout) over its heads,
 * whether its given lse holds a NaN, and its largest finite |lse|, the
 * largest over the ranks. A value past the fused kernels' range in one
 * head sends the whole problem to the reference in one process, and an
 * lse too large to weigh with alone has the backward take its own for
 * every row; so each does every rank's heads. */
static int agree_tops(attn_mpi_group *g, attn_attention_problem *p, const float *dout,
                      float tops[6]) {
    for (int t = 0; t < 6; t++) tops[t] = 0.0f;
    if (g->ctx->ks.flash) attn_value_tops(g->ctx, p, true, dout, tops); /* else: none scans */
    for (size_t r = 0, n = dout && p->lse ? attn_lse_rows(p) : 0; r < n; r++) {
        float x = p->lse[r];
        if (x != x) tops[4] = INFINITY;
        else if (isfinite(x) && fabsf(x) > tops[5]) tops[5] = fabsf(x);
    }
    int rc = MPI_Allreduce(MPI_IN_PLACE, tops, 6, MPI_FLOAT, MPI_MAX, g->comm);
    if (rc == MPI_SUCCESS) p->whole_tops = tops;
    return rc;
}

/* lse (B, H, T_local) as a part of width 1. */
static attn_view_strides lse_strides(const attn_mpi_job *job) {
    return (attn_view_strides){job->heads * job->local, 1, job->local};
}

attn_status attn_mpi_ulysses_forward(attn_mpi_group *g, const char *who,
                                     const attn_mpi_job *job) {
    attn_ctx *ctx = g->ctx;
    size_t P = (size_t)g->size, B = job->batch, D = job->head_dim, T = job->tokens;
    size_t Hq = job->heads / (P ? P : 1), Hk = job->kv_heads / (P ? P : 1);
    attn_status st = attn_mpi_job_check(g, who, job);
    float *full = NULL, *lse_own = NULL;
    void *ws = NULL;
    plan pl = {0};
    attn_attention_problem p = {0};
    /* q, out (B, Hq, T, D), k, v (B, Hk, T, D), lse (B, Hq, T) */
    size_t qn = B * Hq * T * D, kn = B * Hk * T * D;
    if (st == ATTN_OK) {
        full = attn_alloc_floats(2 * qn + 2 * kn + B * Hq * T);
        lse_own = job->lse ? NULL : attn_alloc_floats(B * job->heads * job->local);
        if (!full || (!job->lse && !lse_own) || !attn_mpi_timeline_reserve(g, 1))
            st = attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory for %zu floats", who,
                           2 * qn + 2 * kn);
    }
    float *lse_out = job->lse ? job->lse : lse_own;
    part in[3], out[2];
    if (st == ATTN_OK) {
        in[0] = (part){job->heads, D, job->q, NULL, job->q_s, full};
        in[1] = (part){job->kv_heads, D, job->k, NULL, job->k_s, full + qn};
        in[2] = (part){job->kv_heads, D, job->v, NULL, job->v_s, full + qn + kn};
        out[0] = (part){job->heads, D, NULL, job->out, job->out_s, full + qn + 2 * kn};
        out[1] = (part){job->heads, 1, NULL, lse_out, lse_strides(job), full + 2 * qn + 2 * kn};
        st = plan_new(g, who, job, in, 3, out, 2, &pl);
    }
    const attn_block_map *map = NULL;
    if (st == ATTN_OK) st = heads_map(g, who, job, &map);
    if (st == ATTN_OK) {
        p = heads_problem(g, job);
        p.block_map = map;
        p.q.data = full;
        p.k.data = full + qn;
        p.v.data = full + qn + kn;
        p.out.data = full + qn + 2 * kn;
        p.lse = full + 2 * qn + 2 * kn;
        set_head_stats(&p, job, B * Hq * T);
        st = attn_attention_check(ctx, who, &p);
    }
    if (st == ATTN_OK) {
        size_t bytes = attn_attention_forward_bytes(ctx, &p, false, false);
        if (!(ws = attn_aligned_alloc(64, bytes)))
            st = attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: cannot allocate %zu bytes of attention "
                                                    "workspace", who, bytes);
    }
    st = attn_mpi_agree(g, who, st, NULL);
    if (st == ATTN_OK) {
        attn_mpi_step *step = &g->steps[0];
        step->begin = MPI_Wtime();
        float tops[6];
        int rc = to_heads(&pl, in, 3);
        if (rc == MPI_SUCCESS) rc = agree_tops(g, &p, NULL, tops);
        step->posted = MPI_Wtime();
        /* checked and its workspace in hand; were it to fail, the
         * collective below still runs (every rank takes part) and the
         * failure is returned */
        if (rc == MPI_SUCCESS) st = attn_attention_forward(ctx, who, &p, NULL, NULL, NULL, NULL, ws);
        step->computed = MPI_Wtime();
        if (rc == MPI_SUCCESS) rc = from_heads(&pl, out, 2);
        step->arrived = MPI_Wtime();
        g->n_steps = 1;
        if (rc != MPI_SUCCESS)
            st = attn_mpi_error(g, who, "the exchange (MPI_Alltoallv, MPI_Allreduce)", rc);
    }
    plan_free(&pl);
    attn_free(full);
    attn_free(lse_own);
    attn_free(ws);
    return st;
}

attn_status attn_mpi_ulysses_backward(attn_mpi_group *g, const char *who,
                                      const attn_mpi_job *job) {
    attn_ctx *ctx = g->ctx;
    size_t P = (size_t)g->size, B = job->batch, D = job->head_dim, T = job->tokens;
    size_t Hq = job->heads / (P ? P : 1), Hk = job->kv_heads / (P ? P : 1);
    attn_status st = attn_mpi_job_check(g, who, job);
    float *full = NULL;
    void *ws = NULL;
    plan pl = {0};
    attn_attention_problem p = {0};
    /* in: q, out, dout (B, Hq, T, D), k, v (B, Hk, T, D), lse (B, Hq, T);
     * back: dq (B, Hq, T, D), dk, dv (B, Hk, T, D) */
    size_t qn = B * Hq * T * D, kn = B * Hk * T * D, ln = B * Hq * T;
    if (st == ATTN_OK) {
        full = attn_alloc_floats(4 * qn + 4 * kn + ln);
        if (!full || !attn_mpi_timeline_reserve(g, 1))
            st = attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory for %zu floats", who,
                           4 * qn + 4 * kn + ln);
    }
    float *fq = full, *fk = fq + qn, *fv = fk + kn, *fo = fv + kn, *fdo = fo + qn, *fl = fdo + qn;
    float *fdq = fl + ln, *fdk = fdq + qn, *fdv = fdk + kn;
    part in[6], out[3];
    if (st == ATTN_OK) {
        in[0] = (part){job->heads, D, job->q, NULL, job->q_s, fq};
        in[1] = (part){job->kv_heads, D, job->k, NULL, job->k_s, fk};
        in[2] = (part){job->kv_heads, D, job->v, NULL, job->v_s, fv};
        in[3] = (part){job->heads, D, job->out, NULL, job->out_s, fo};
        in[4] = (part){job->heads, D, job->dout, NULL, job->out_s, fdo};
        in[5] = (part){job->heads, 1, job->lse, NULL, lse_strides(job), fl};
        out[0] = (part){job->heads, D, NULL, job->dq, job->q_s, fdq};
        out[1] = (part){job->kv_heads, D, NULL, job->dk, job->k_s, fdk};
        out[2] = (part){job->kv_heads, D, NULL, job->dv, job->v_s, fdv};
        st = plan_new(g, who, job, in, 6, out, 3, &pl);
    }
    const attn_block_map *map = NULL;
    if (st == ATTN_OK) st = heads_map(g, who, job, &map);
    if (st == ATTN_OK) {
        p = heads_problem(g, job);
        p.block_map = map;
        p.q.data = fq;
        p.k.data = fk;
        p.v.data = fv;
        p.out.data = fo;
        p.lse = fl;
        set_head_stats(&p, job, ln);
        /* whole rows (every key of each of its heads): the backward's
         * consistent delta holds, as in one process */
        st = attn_attention_check(ctx, who, &p);
    }
    if (st == ATTN_OK) {
        size_t bytes = attn_attention_backward_bytes(ctx, &p);
        if (!(ws = attn_aligned_alloc(64, bytes)))
            st = attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: cannot allocate %zu bytes of attention "
                                                    "workspace", who, bytes);
    }
    st = attn_mpi_agree(g, who, st, NULL);
    if (st == ATTN_OK) {
        attn_mpi_step *step = &g->steps[0];
        step->begin = MPI_Wtime();
        float tops[6];
        int rc = to_heads(&pl, in, 6);
        if (rc == MPI_SUCCESS) rc = agree_tops(g, &p, fdo, tops);
        step->posted = MPI_Wtime();
        attn_attention_grads gr = {.dout = fdo, .dq = fdq, .dk = fdk, .dv = fdv};
        if (rc == MPI_SUCCESS) st = attn_attention_backward(ctx, who, &p, NULL, &gr, ws);
        step->computed = MPI_Wtime();
        if (rc == MPI_SUCCESS) rc = from_heads(&pl, out, 3);
        step->arrived = MPI_Wtime();
        g->n_steps = 1;
        if (rc != MPI_SUCCESS)
            st = attn_mpi_error(g, who, "the exchange (MPI_Alltoallv, MPI_Allreduce)", rc);
    }
    plan_free(&pl);
    attn_free(full);
    attn_free(ws);
    return st;
}
