/*
 * sdpa.c — the attention over chunks by the group's mode (ring or zigzag:
 * ring.c; Ulysses: ulysses.c), and the public SDPA entry points, which
 * check their arguments, agree on them across the ranks and hand the chunks
 * to it as one job.
 */
#include "mpi/sdpa.h"

#include "mpi/ring.h"
#include "mpi/ulysses.h"

#include <math.h>

attn_status attn_mpi_attention(attn_mpi_group *g, const char *who, const attn_mpi_job *job,
                               bool backward) {
    if (g->mode == ATTN_MPI_ULYSSES)
        return backward ? attn_mpi_ulysses_backward(g, who, job)
                        : attn_mpi_ulysses_forward(g, who, job);
    return backward ? attn_mpi_ring_backward(g, who, job) : attn_mpi_ring_forward(g, who, job);
}

/* The job of the public SDPA calls: contiguous (B, H, T_local, D) chunks. */
static attn_mpi_job sdpa_job(const attn_mpi_group *g, const attn_mpi_sdpa_config *cfg) {
    size_t H = cfg->heads, Hkv = cfg->kv_heads ? cfg->kv_heads : cfg->heads, D = cfg->head_dim;
    size_t Tl = attn_mpi_local_count(g->mode, cfg->tokens, (size_t)g->size, (size_t)g->rank);
    attn_mpi_job job = {.batch = cfg->batch, .heads = H, .kv_heads = Hkv, .tokens = cfg->tokens,
                        .head_dim = D, .local = Tl, .causal = cfg->causal};
    job.scale = cfg->scale != 0.0 ? (float)cfg->scale : (float)(1.0 / sqrt((double)(D ? D : 1)));
    job.map = cfg->block_mask ? attn_block_mask_map(cfg->block_mask) : NULL;
    job.q_s = job.out_s = (attn_view_strides){H * Tl * D, D, Tl * D};
    job.k_s = job.v_s = (attn_view_strides){Hkv * Tl * D, D, Tl * D};
    return job;
}

/* The block map, if any, over the whole sequence: tokens x tokens, batch
 * and heads 1 or the call's; its checksum into the job. */
static attn_status check_map(attn_mpi_group *g, const char *who, attn_mpi_job *job) {
    const attn_block_map *m = job->map;
    if (!m) return ATTN_OK;
    if (m->q_len != job->tokens || m->kv_len != job->tokens)
        return attn_fail(g->ctx, ATTN_ERR_SHAPE,
                         "%s: the block mask is of q_len %zu, kv_len %zu where the sequence is "
                         "of %zu tokens (the map is over the whole sequence, not a chunk)",
                         who, m->q_len, m->kv_len, job->tokens);
    if ((m->batch != 1 && m->batch != job->batch) || (m->heads != 1 && m->heads != job->heads))
        return attn_fail(g->ctx, ATTN_ERR_SHAPE,
                         "%s: the block mask's batch (%zu) and heads (%zu) must each be 1 or the "
                         "call's (%zu, %zu)",
                         who, m->batch, m->heads, job->batch, job->heads);
    job->map_checksum = attn_mpi_map_checksum(m);
    return ATTN_OK;
}

/* The checks of a public SDPA call, then agreement on them and the sizes. */
static attn_status sdpa_begin(attn_mpi_group *g, const char *who,
                              const attn_mpi_sdpa_config *cfg, const void *const *need,
                              const char *const *need_names, size_t n_need, attn_mpi_job *job) {
    attn_status st = ATTN_OK;
    if (!cfg) st = attn_fail(g->ctx, ATTN_ERR_NULL, "%s: cfg is NULL", who);
    for (size_t i = 0; i < n_need && st == ATTN_OK; i++)
        if (!need[i]) st = attn_fail(g->ctx, ATTN_ERR_NULL, "%s: %s is NULL", who, need_names[i]);
    if (st == ATTN_OK && !(isfinite(cfg->scale) && fabs(cfg->scale) <= 3.4028234663852886e38))
        st = attn_fail(g->ctx, ATTN_ERR_INVALID, "%s: scale (%g) must be finite in float32", who,
                       cfg->scale);
    if (st == ATTN_OK) {
        *job = sdpa_job(g, cfg);
        st = attn_mpi_job_check(g, who, job);
    }
    if (st == ATTN_OK) st = check_map(g, who, job);
    attn_mpi_record rec = {0};
    if (st == ATTN_OK) {
        attn_mpi_record_int(&rec, "batch", (int64_t)job->batch);
        attn_mpi_record_int(&rec, "heads", (int64_t)job->heads);
        attn_mpi_record_int(&rec, "kv_heads", (int64_t)job->kv_heads);
        attn_mpi_record_int(&rec, "tokens", (int64_t)job->tokens);
        attn_mpi_record_int(&rec, "head_dim", (int64_t)job->head_dim);
        attn_mpi_record_int(&rec, "causal", job->causal);
        attn_mpi_record_float(&rec, "scale", job->scale);
        /* the map: whether there is one, its geometry, its content */
        const attn_block_map *m = job->map;
        attn_mpi_record_int(&rec, "whether a block_mask is set", m != NULL);
        attn_mpi_record_int(&rec, "the block_mask's batch", m ? (int64_t)m->batch : 0);
        attn_mpi_record_int(&rec, "the block_mask's heads", m ? (int64_t)m->heads : 0);
        attn_mpi_record_int(&rec, "the block_mask's block_q", m ? (int64_t)m->block_q : 0);
        attn_mpi_record_int(&rec, "the block_mask's block_kv", m ? (int64_t)m->block_kv : 0);
        attn_mpi_record_hex(&rec, "the block_mask's content (checksum)", job->map_checksum);
    }
    return attn_mpi_agree(g, who, st, &rec);
}

attn_status attn_mpi_sdpa_forward(attn_mpi_group *g, const attn_mpi_sdpa_config *cfg,
                                  const float *q, const float *k, const float *v, float *out,
                                  float *lse) {
    if (!g) return ATTN_ERR_NULL;
    attn_clear_error(g->ctx);
    const char *who = "attn_mpi_sdpa_forward";
    const void *need[4] = {q, k, v, out};
    static const char *const names[4] = {"q", "k", "v", "out"};
    attn_mpi_job job;
    attn_status st = sdpa_begin(g, who, cfg, need, names, 4, &job);
    if (st != ATTN_OK) return st;
    job.q = q;
    job.k = k;
    job.v = v;
    job.out = out;
    job.lse = lse;
    return attn_mpi_attention(g, who, &job, false);
}

attn_status attn_mpi_sdpa_backward(attn_mpi_group *g, const attn_mpi_sdpa_config *cfg,
                                   const float *q, const float *k, const float *v,
                                   const float *out, const float *lse, const float *dout,
                                   float *dq, float *dk, float *dv) {
    if (!g) return ATTN_ERR_NULL;
    attn_clear_error(g->ctx);
    const char *who = "attn_mpi_sdpa_backward";
    const void *need[9] = {q, k, v, out, lse, dout, dq, dk, dv};
    static const char *const names[9] = {"q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv"};
    attn_mpi_job job;
    attn_status st = sdpa_begin(g, who, cfg, need, names, 9, &job);
    if (st != ATTN_OK) return st;
    job.q = q;
    job.k = k;
    job.v = v;
    job.out = (float *)out; /* read only in the backward */
    job.lse = (float *)lse;
    job.dout = dout;
    job.dq = dq;
    job.dk = dk;
    job.dv = dv;
    return attn_mpi_attention(g, who, &job, true);
}
