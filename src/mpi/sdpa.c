/*
 * sdpa.c — the attention over chunks by the group's mode (ring or zigzag:
 * ring.c; Ulysses: ulysses.c), and the public SDPA entry points, which
 * check their arguments, agree on them across the ranks and hand the chunks
 * to it as one job.
 */
#include "mpi/sdpa.h"

#include "mpi/ring.h"
#include "mpi/ulysses.h"
#include "overlap.h"

#include <float.h>
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

/* A rank's chunk of a call's tensor: its rows are of q's and out's heads,
 * of k's and v's, or of lse's (one float a head). */
typedef enum chunk_rows { CHUNK_Q, CHUNK_KV, CHUNK_LSE } chunk_rows;
typedef struct chunk_arg {
    const char *name;
    const void *data;
    chunk_rows rows;
    bool out;
} chunk_arg;

/* No output chunk overlapping an input's or another output's, as the
 * single-process calls refuse (attn.h). */
static attn_status check_chunks(attn_mpi_group *g, const char *who, const attn_mpi_job *job,
                                const chunk_arg *args, size_t n) {
    enum { MOST = 9 }; /* the backward's nine */
    attn_span outs[MOST], ins[MOST];
    size_t n_outs = 0, n_ins = 0;
    size_t rows = job->batch * job->local;
    for (size_t i = 0; i < n && i < MOST; i++) {
        size_t floats = args[i].rows == CHUNK_Q    ? rows * job->heads * job->head_dim
                        : args[i].rows == CHUNK_KV ? rows * job->kv_heads * job->head_dim
                                                   : rows * job->heads;
        attn_span span = {args[i].name, args[i].data, floats * sizeof(float)};
        if (args[i].out) outs[n_outs++] = span;
        else ins[n_ins++] = span;
    }
    return attn_check_overlap(g->ctx, who, outs, n_outs, ins, n_ins);
}

/* The checks of a public SDPA call, then agreement on them and the sizes. */
static attn_status sdpa_begin(attn_mpi_group *g, const char *who,
                              const attn_mpi_sdpa_config *cfg, const void *const *need,
                              const char *const *need_names, size_t n_need,
                              const chunk_arg *chunks, size_t n_chunks, attn_mpi_job *job) {
    attn_status st = ATTN_OK;
    if (!cfg) st = attn_fail(g->ctx, ATTN_ERR_NULL, "%s: cfg is NULL", who);
    for (size_t i = 0; i < n_need && st == ATTN_OK; i++)
        if (!need[i]) st = attn_fail(g->ctx, ATTN_ERR_NULL, "%s: %s is NULL", who, need_names[i]);
    /* as attn_sdpa_check_config: what rounds to a finite float */
    if (st == ATTN_OK && !isfinite(cfg->scale))
        st = attn_fail(g->ctx, ATTN_ERR_INVALID, "%s: scale (%g) must be finite", who,
                       cfg->scale);
    if (st == ATTN_OK && !(fabs(cfg->scale) < 0x1.ffffffp127))
        st = attn_fail(g->ctx, ATTN_ERR_INVALID,
                       "%s: scale (%.9g) is beyond float32's range (largest %.9g)", who,
                       cfg->scale, (double)FLT_MAX);
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
    st = attn_mpi_agree(g, who, st, &rec);
    /* the chunks' spans once the sizes are agreed (a rank's own wrong
     * sizes are named as such above), then agreement on them */
    if (st == ATTN_OK) st = attn_mpi_agree(g, who, check_chunks(g, who, job, chunks, n_chunks), NULL);
    return st;
}

attn_status attn_mpi_sdpa_forward(attn_mpi_group *g, const attn_mpi_sdpa_config *cfg,
                                  const float *q, const float *k, const float *v, float *out,
                                  float *lse) {
    if (!g) return ATTN_ERR_NULL;
    attn_clear_error(g->ctx);
    const char *who = "attn_mpi_sdpa_forward";
    const void *need[4] = {q, k, v, out};
    static const char *const names[4] = {"q", "k", "v", "out"};
    const chunk_arg chunks[5] = {{"q", q, CHUNK_Q, false},   {"k", k, CHUNK_KV, false},
                                 {"v", v, CHUNK_KV, false},  {"out", out, CHUNK_Q, true},
                                 {"lse", lse, CHUNK_LSE, true}};
    attn_mpi_job job;
    attn_status st = sdpa_begin(g, who, cfg, need, names, 4, chunks, 5, &job);
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
    const chunk_arg chunks[9] = {
        {"q", q, CHUNK_Q, false},      {"k", k, CHUNK_KV, false},   {"v", v, CHUNK_KV, false},
        {"out", out, CHUNK_Q, false},  {"lse", lse, CHUNK_LSE, false},
        {"dout", dout, CHUNK_Q, false}, {"dq", dq, CHUNK_Q, true},   {"dk", dk, CHUNK_KV, true},
        {"dv", dv, CHUNK_KV, true}};
    attn_mpi_job job;
    attn_status st = sdpa_begin(g, who, cfg, need, names, 9, chunks, 9, &job);
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
