/*
 * modules.c — MultiHeadAttention and GPT-2's CausalSelfAttention context-
 * parallel: the projections run on the rank's tokens with the module's own
 * weights, the attention across ranks (ring, zigzag or Ulysses), and the
 * backward sums each parameter's gradient over the ranks (MPI_Allreduce),
 * so that every rank holds the whole sequence's gradient.
 *   MultiHeadAttention: q, k, v (B, Tl, C) = W_query(x), W_key(x), W_value(x)
 *   GPT-2:              qkv (B, Tl, 3C) = c_attn(x), q, k, v its column blocks
 *   context (B, Tl, C) = attention over all T tokens, heads of D = C / H
 *   y (B, Tl, C) = out_proj(context) | c_proj(context)
 */
#include "mpi/group.h"
#include "mpi/sdpa.h"

#include "kernels/dispatch.h"
#include "modules/module.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

/* A module as the layer runs it. */
typedef struct cp_module {
    attn_module_attention att;
    bool fused;   /* GPT-2: one c_attn (3C, C) */
    size_t d_in, C;
    /* MultiHeadAttention: W_query, W_key, W_value, out_proj; GPT-2: c_attn,
     * -, -, c_proj (biases NULL when absent) */
    attn_param w[4], b[4];
} cp_module;

static attn_status describe(attn_ctx *ctx, const char *who, attn_module *m, cp_module *out) {
    *out = (cp_module){.d_in = attn_module_d_in(m), .C = attn_module_d_out(m)};
    static const char *const mha_names[4] = {"W_query", "W_key", "W_value", "out_proj"};
    static const char *const gpt2_names[2] = {"c_attn", "c_proj"};
    const char *const *names;
    size_t n;
    if (attn_mha_attention(m, &out->att)) {
        names = mha_names;
        n = 4;
    } else if (attn_gpt2_attention(m, &out->att)) {
        out->fused = true;
        names = gpt2_names;
        n = 2;
    } else {
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: context parallelism runs MultiHeadAttention and GPT-2's "
                         "CausalSelfAttention, not %s",
                         who, attn_module_class_name(m));
    }
    for (size_t i = 0; i < n; i++) {
        size_t slot = out->fused && i == 1 ? 3 : i;
        char name[ATTN_PARAM_NAME_MAX];
        snprintf(name, sizeof name, "%s.weight", names[i]);
        attn_status st = attn_module_param(m, name, &out->w[slot]);
        if (st != ATTN_OK) return st;
        bool bias = out->fused || i == 3 || out->att.qkv_bias;
        snprintf(name, sizeof name, "%s.bias", names[i]);
        if (bias && (st = attn_module_param(m, name, &out->b[slot])) != ATTN_OK) return st;
    }
    if (m && attn_module_training(m) && out->att.dropout > 0.0)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: context parallelism runs without dropout (dropout %g in training "
                         "mode): set eval mode or dropout 0",
                         who, out->att.dropout);
    return ATTN_OK;
}

/* What the ranks running m must share: the module's kind, sizes, scale and
 * causality, and a checksum of its weights (names, shapes, every bit),
 * which a different seed, weights file or option changes. */
static void module_record(attn_mpi_record *rec, attn_module *m, const cp_module *cm,
                          size_t batch, size_t tokens) {
    uint64_t h = ATTN_MPI_HASH_SEED;
    size_t count = attn_module_param_count(m);
    for (size_t i = 0; i < count; i++) {
        attn_param p;
        if (attn_module_param_at(m, i, &p) != ATTN_OK) break; /* i < count: it holds */
        h = attn_mpi_hash(h, p.name, strlen(p.name) + 1);
        h = attn_mpi_hash(h, p.shape, p.ndim * sizeof *p.shape);
        h = attn_mpi_hash(h, p.data, p.numel * sizeof *p.data);
    }
    attn_mpi_record_int(rec, "batch", (int64_t)batch);
    attn_mpi_record_int(rec, "tokens", (int64_t)tokens);
    attn_mpi_record_text(rec, "the module", attn_module_class_name(m));
    attn_mpi_record_int(rec, "d_in", (int64_t)cm->d_in);
    attn_mpi_record_int(rec, "d_out", (int64_t)cm->C);
    attn_mpi_record_int(rec, "heads", (int64_t)cm->att.heads);
    attn_mpi_record_float(rec, "scale", cm->att.scale);
    attn_mpi_record_int(rec, "causal", cm->att.causal);
    attn_mpi_record_int(rec, "the parameters", (int64_t)count);
    attn_mpi_record_hex(rec, "the weights' checksum", h);
}

/* The attention job over the projections: q, k, v strided in acts (MHA:
 * three (B, Tl, C) blocks; GPT-2: columns of (B, Tl, 3C)), context (B, Tl,
 * C). */
static attn_mpi_job module_job(const cp_module *cm, size_t batch, size_t tokens, size_t Tl,
                               float *acts, float *lse, float *head_stats) {
    size_t C = cm->C, D = cm->att.head_dim, rows = batch * Tl;
    attn_mpi_job job = {.batch = batch, .heads = cm->att.heads, .kv_heads = cm->att.heads,
                        .tokens = tokens, .head_dim = D, .local = Tl, .scale = cm->att.scale,
                        .causal = cm->att.causal, .lse = lse, .head_stats = head_stats};
    if (cm->fused) {
        attn_view_strides in = {Tl * 3 * C, 3 * C, D};
        job.q = acts;
        job.k = acts + C;
        job.v = acts + 2 * C;
        job.q_s = job.k_s = job.v_s = in;
    } else {
        attn_view_strides in = {Tl * C, C, D};
        job.q = acts;
        job.k = acts + rows * C;
        job.v = acts + 2 * rows * C;
        job.q_s = job.k_s = job.v_s = in;
    }
    job.out = acts + 3 * rows * C;
    job.out_s = (attn_view_strides){Tl * C, C, D};
    return job;
}

attn_status attn_mpi_module_forward(attn_mpi_group *g, attn_module *m, const float *x_local,
                                    size_t batch, size_t tokens, float *y_local) {
    if (!g) return ATTN_ERR_NULL;
    attn_ctx *ctx = g->ctx;
    attn_clear_error(ctx);
    const char *who = "attn_mpi_module_forward";
    cp_module cm;
    attn_status st = ATTN_OK;
    size_t Tl = attn_mpi_local_count(g->mode, tokens, (size_t)g->size, (size_t)g->rank);
    if (!m) st = attn_fail(ctx, ATTN_ERR_NULL, "%s: m is NULL", who);
    else if (!x_local || !y_local)
        st = attn_fail(ctx, ATTN_ERR_NULL, "%s: %s is NULL", who, !x_local ? "x_local" : "y_local");
    else if (!batch || !tokens)
        st = attn_fail(ctx, ATTN_ERR_SHAPE, "%s: batch (%zu) and tokens (%zu) must be positive",
                       who, batch, tokens);
    else
        st = describe(ctx, who, m, &cm);
    if (st == ATTN_OK && m->mask_buffer && tokens > m->mask_buffer)
        st = attn_fail(ctx, ATTN_ERR_SHAPE, "%s: sequence length (%zu) exceeds context_length (%zu)",
                       who, tokens, m->mask_buffer);
    size_t rows = batch * Tl, n;
    if (st == ATTN_OK && (!attn_mul3_size(batch, tokens, 4 * cm.C + cm.d_in, &n) ||
                          !attn_floats_fit(n)))
        st = attn_fail(ctx, ATTN_ERR_OVERFLOW, "%s: (%zu, %zu, %zu) overflows", who, batch, tokens,
                       cm.C);
    /* x's copy (B, Tl, d_in), q/k/v + context (4 (B, Tl, C)), lse (B, H, Tl) */
    attn_mpi_saved next = {0};
    if (st == ATTN_OK) {
        next = (attn_mpi_saved){.module = m, .batch = batch, .tokens = tokens, .local = Tl};
        next.x = attn_alloc_floats(rows * cm.d_in);
        next.acts = attn_alloc_floats(4 * rows * cm.C);
        next.lse = attn_alloc_floats(rows * cm.att.heads);
        next.versions = attn_calloc(m->num_params ? m->num_params : 1, sizeof *next.versions);
        /* Ulysses: each rank's heads' row statistics, (B, H / P, T) x 3 */
        if (g->mode == ATTN_MPI_ULYSSES)
            next.head_stats = attn_alloc_floats(3 * batch * (cm.att.heads / (size_t)g->size) *
                                                tokens);
        if (!next.x || !next.acts || !next.lse || !next.versions ||
            (g->mode == ATTN_MPI_ULYSSES && !next.head_stats) || !attn_module_identity_of(m))
            st = attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory for %zu activations", who,
                           rows * (4 * cm.C + cm.d_in));
    }
    attn_mpi_record rec = {0};
    if (st == ATTN_OK) module_record(&rec, m, &cm, batch, tokens);
    st = attn_mpi_agree(g, who, st, &rec);
    if (st == ATTN_OK) /* overlaps the single-process forward refuses, once sizes agree */
        st = attn_mpi_agree(g, who,
                            attn_module_check_spans(m, who, false, "x_local", x_local, "y_local",
                                                    y_local, rows),
                            NULL);
    if (st != ATTN_OK) {
        attn_mpi_saved_free(&next);
        return st;
    }
    size_t C = cm.C;
    float *acts = next.acts;
    if (cm.fused) {
        attn_k_linear(ctx, x_local, cm.w[0].data, cm.b[0].data, acts, rows, C, 3 * C);
    } else {
        for (int i = 0; i < 3; i++)
            attn_k_linear(ctx, x_local, cm.w[i].data, cm.b[i].data, acts + (size_t)i * rows * C,
                          rows, cm.d_in, C);
    }
    attn_mpi_job job = module_job(&cm, batch, tokens, Tl, acts, next.lse, next.head_stats);
    st = attn_mpi_attention(g, who, &job, false);
    if (st == ATTN_OK) {
        attn_k_linear(ctx, acts + 3 * rows * C, cm.w[3].data, cm.b[3].data, y_local, rows, C, C);
        if (attn_module_grad_enabled(m)) {
            memcpy(next.x, x_local, rows * cm.d_in * sizeof *next.x);
            /* the versions of the weights this forward read, for its backward */
            memcpy(next.versions, attn_module_versions(m), m->num_params * sizeof *next.versions);
            next.valid = true;
            attn_module_identity_hold(m->cp_id);
            next.module_id = m->cp_id;
            attn_mpi_saved_free(&g->saved);
            g->saved = next;
            return ATTN_OK;
        }
        /* as one process: a forward without gradients leaves nothing to
         * differentiate, not an earlier forward's activations */
        if (g->saved.module == m) attn_mpi_saved_free(&g->saved);
    }
    attn_mpi_saved_free(&next);
    return st;
}

/* Sums the ranks' gradients in place, in pieces whose counts fit int. */
static int allreduce_sum(float *x, size_t n, MPI_Comm comm) {
    for (size_t at = 0; at < n;) {
        size_t piece = n - at < (size_t)1 << 30 ? n - at : (size_t)1 << 30;
        int rc = MPI_Allreduce(MPI_IN_PLACE, x + at, (int)piece, MPI_FLOAT, MPI_SUM, comm);
        if (rc != MPI_SUCCESS) return rc;
        at += piece;
    }
    return MPI_SUCCESS;
}

attn_status attn_mpi_module_backward(attn_mpi_group *g, attn_module *m, const float *dy_local,
                                     float *dx_local) {
    if (!g) return ATTN_ERR_NULL;
    attn_ctx *ctx = g->ctx;
    attn_clear_error(ctx);
    const char *who = "attn_mpi_module_backward";
    attn_mpi_saved *s = &g->saved;
    cp_module cm;
    attn_status st = ATTN_OK;
    if (!m || !dy_local) st = attn_fail(ctx, ATTN_ERR_NULL, "%s: %s is NULL", who, !m ? "m" : "dy_local");
    else if (!s->valid || s->module != m || m->cp_id != s->module_id)
        st = attn_fail(ctx, ATTN_ERR_INVALID,
                       "%s: no forward of this module to differentiate (call "
                       "attn_mpi_module_forward first, with gradients enabled)",
                       who);
    else
        st = describe(ctx, who, m, &cm);
    /* the gradients as they were (ours are added to zeros, summed over the
     * ranks, then these added back: += as every backward); dcontext, and
     * dq, dk, dv at the projections' layout */
    size_t rows = s->batch * s->local, scalars = m ? attn_module_num_scalars(m) : 0;
    float *before = NULL, *dbuf = NULL;
    if (st == ATTN_OK) {
        before = attn_alloc_floats(scalars);
        dbuf = attn_alloc_floats(4 * rows * cm.C);
        if (!before || !dbuf)
            st = attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory for %zu floats", who,
                           scalars + 4 * rows * cm.C);
    }
    attn_mpi_record rec = {0};
    if (st == ATTN_OK) module_record(&rec, m, &cm, s->batch, s->tokens);
    st = attn_mpi_agree(g, who, st, &rec);
    if (st == ATTN_OK) /* overlaps the single-process backward refuses, once sizes agree */
        st = attn_mpi_agree(g, who,
                            attn_module_check_spans(m, who, true, "dy_local", dy_local,
                                                    "dx_local", dx_local, rows),
                            NULL);
    /* weights changed since the forward alike on every rank (an optimizer
     * step; a change on some ranks only is the disagreement above) */
    if (st == ATTN_OK)
        st = attn_mpi_agree(g, who, attn_module_check_versions_at(m, who, s->versions), NULL);
    if (st != ATTN_OK) {
        attn_free(before);
        attn_free(dbuf);
        return st;
    }
    /* every gradient, contiguous after the parameters (module.h's storage) */
    attn_param first;
    if ((st = attn_module_param_at(m, 0, &first)) != ATTN_OK) {
        attn_free(before);
        attn_free(dbuf);
        return st;
    }
    float *grads = first.grad;
    memcpy(before, grads, scalars * sizeof *grads);
    memset(grads, 0, scalars * sizeof *grads);

    size_t C = cm.C, B = s->batch, Tl = s->local;
    float *context = s->acts + 3 * rows * C, *dcontext = dbuf + 3 * rows * C;
    /* forward: y = context W_out^T + b_out */
    attn_k_linear_backward(ctx, context, cm.w[3].data, dy_local, dcontext, false, cm.w[3].grad,
                           cm.b[3].grad, rows, C, C);
    attn_mpi_job job = module_job(&cm, B, s->tokens, Tl, s->acts, s->lse, s->head_stats);
    attn_mpi_job grads_at = module_job(&cm, B, s->tokens, Tl, dbuf, NULL, NULL);
    job.dout = dcontext;
    job.dq = (float *)grads_at.q;
    job.dk = (float *)grads_at.k;
    job.dv = (float *)grads_at.v;
    st = attn_mpi_attention(g, who, &job, true);
    if (st == ATTN_OK) {
        /* forward: the projections of x */
        if (cm.fused) {
            attn_k_linear_backward(ctx, s->x, cm.w[0].data, dbuf, dx_local, false, cm.w[0].grad,
                                   cm.b[0].grad, rows, C, 3 * C);
        } else {
            for (int i = 0; i < 3; i++)
                attn_k_linear_backward(ctx, s->x, cm.w[i].data, dbuf + (size_t)i * rows * C,
                                       dx_local, i > 0, cm.w[i].grad, cm.b[i].grad, rows,
                                       cm.d_in, C);
        }
        int rc = allreduce_sum(grads, scalars, g->comm);
        if (rc != MPI_SUCCESS) st = attn_mpi_error(g, who, "MPI_Allreduce", rc);
    }
    if (st == ATTN_OK) {
        for (size_t i = 0; i < scalars; i++) grads[i] += before[i];
    } else {
        memcpy(grads, before, scalars * sizeof *grads); /* a failure changes nothing */
    }
    attn_free(before);
    attn_free(dbuf);
    return st;
}
