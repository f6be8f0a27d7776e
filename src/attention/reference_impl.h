/*
 * reference_impl.h — the reference backend's passes, written once over the
 * tensors' scalar type (src/attention/reference.c instantiates it twice).
 *
 * Before including this file, define
 *   REAL         the element type of the tensors (float, double)
 *   REF_TENSORS  a struct type with the fields
 *                  const REAL *q, *k, *v; REAL *out, *lse;
 *                  const REAL *dout; REAL *dq, *dk, *dv;
 *                  double scale, softcap;
 *   REF(n)       the name of function n of this instantiation
 * The problem gives the geometry (shape, strides, positions, masks, ALiBi
 * slopes and sinks); its own tensor pointers are not read here. Everything
 * is computed in double whatever REAL is; float tensors round once, where a
 * result is stored, so the float instantiation is the float backend bit
 * for bit. reference.c defines the helpers used here (dropout factors, row
 * decoding, modified scores) before including it.
 */

typedef struct REF(forward_view) {
    const attn_attention_problem *p;
    const REF_TENSORS *t;
    const attn_attention_dropout *drop;
    const attn_attention_trace *trace;
    double *workspace; /* forward_part_doubles per part */
} REF(forward_view);

/* Whether REAL is double: dropout scales by 1 / (1 - p) in the tensors' precision. */
static const bool REF(f64) = sizeof(REAL) == sizeof(double);

static double REF(dot)(const REAL *a, const REAL *b, size_t n) {
    double sum = 0.0;
    for (size_t d = 0; d < n; d++) sum += (double)a[d] * b[d];
    return sum;
}

/* The chain of score modifiers on s (n scores: query i of (b, h) against
 * keys [j0, j0 + n)), in place; saved (NULL: not kept) receives each
 * modifier's input, n doubles each, for the backward; tile holds n floats
 * for a callback. false, with *failure filled, when a callback failed. */
static bool REF(chain_forward)(const attn_attention_problem *p, size_t b, size_t h, size_t i,
                               size_t j0, size_t n, double *s, double *saved, float *tile,
                               chain_failure *failure) {
    for (size_t k = 0; k < p->score_mod_count; k++) {
        const attn_score_mod *m = &p->score_mods[k];
        if (saved) memcpy(saved + k * n, s, n * sizeof *s);
        switch (m->kind) {
        case ATTN_SCORE_SCALE: {
            double value = (double)(REAL)m->value; /* the tensors' precision */
            for (size_t e = 0; e < n; e++) s[e] *= value;
            break;
        }
        case ATTN_SCORE_SOFTCAP: {
            double cap = (double)(REAL)m->value;
            for (size_t e = 0; e < n; e++) s[e] = cap * tanh(s[e] / cap);
            break;
        }
        case ATTN_SCORE_ALIBI: {
            double slope = (double)m->tensor[h];
            int64_t pos = (int64_t)i + m->offset;
            for (size_t e = 0; e < n; e++) {
                int64_t dist = (int64_t)(j0 + e) - pos; /* kv_idx - q_idx - offset */
                if (m->signed_distance) s[e] += slope * (double)dist;
                else s[e] -= slope * (double)(dist < 0 ? -dist : dist);
            }
            break;
        }
        case ATTN_SCORE_BIAS:
            for (size_t e = 0; e < n; e++) s[e] += (double)m->tensor[bias_at(m, b, h, i, j0 + e)];
            break;
        case ATTN_SCORE_REL_BIAS:
        case ATTN_SCORE_REL_TABLE: {
            const float *table = m->tensor + h * m->buckets;
            for (size_t e = 0; e < n; e++)
                s[e] += (double)table[rel_bucket((int64_t)(j0 + e) - (int64_t)i, m)];
            break;
        }
        case ATTN_SCORE_CALLBACK: {
            for (size_t e = 0; e < n; e++) tile[e] = (float)s[e];
            attn_score_tile t = {b, h, i, j0, 1, n, n, tile};
            int code = m->fn(m->user, &t);
            if (code != 0) {
                *failure = (chain_failure){true, false, code, k, b, h, i, j0, n};
                return false;
            }
            for (size_t e = 0; e < n; e++) s[e] = (double)tile[e];
            break;
        }
        }
    }
    return true;
}

/* A key of weight 0 (a final score of -inf: hidden) passes no gradient back
 * through the chain, whatever a modifier's derivative is at the input it
 * kept there (a callback's NaN of an earlier -inf; 0 x NaN), as in the
 * block-map kernels. */
static void REF(zero_unweighed)(const double *weights, double *g, size_t n) {
    for (size_t e = 0; e < n; e++)
        if (weights[e] == 0.0) g[e] = 0.0;
}

/* The chain's backward: g (n) holds the gradient of the chain's output and
 * receives that of its input, modifier by modifier in reverse, from the
 * inputs chain_forward saved; BIAS, REL_BIAS and REL_TABLE modifiers that want
 * tensor_grad add g at their point to their sums in acc (NULL: not now).
 * weights (n) are the keys' P, whose zeros keep a zero gradient. tile and
 * grad hold n floats each for a callback. */
static bool REF(chain_backward)(const attn_attention_problem *p, size_t b, size_t h, size_t i,
                                size_t j0, size_t n, const double *saved, const double *weights,
                                double *g, double *acc, float *tile, float *grad,
                                chain_failure *failure) {
    for (size_t k = p->score_mod_count; k-- > 0;) {
        const attn_score_mod *m = &p->score_mods[k];
        const double *in = saved + k * n;
        double *sums = acc && mod_grad_doubles(p, k) ? acc + mod_grad_offset(p, k) : NULL;
        switch (m->kind) {
        case ATTN_SCORE_SCALE: {
            double value = (double)(REAL)m->value;
            for (size_t e = 0; e < n; e++) g[e] *= value;
            break;
        }
        case ATTN_SCORE_SOFTCAP: {
            double cap = (double)(REAL)m->value;
            for (size_t e = 0; e < n; e++) {
                double t = tanh(in[e] / cap); /* d(c tanh(x / c)) / dx = 1 - t^2 */
                g[e] *= 1.0 - t * t;
            }
            REF(zero_unweighed)(weights, g, n);
            break;
        }
        case ATTN_SCORE_ALIBI:
            break;
        case ATTN_SCORE_BIAS:
            if (sums)
                for (size_t e = 0; e < n; e++) sums[bias_at(m, b, h, i, j0 + e)] += g[e];
            break;
        case ATTN_SCORE_REL_BIAS:
        case ATTN_SCORE_REL_TABLE:
            if (sums)
                for (size_t e = 0; e < n; e++)
                    sums[h * m->buckets + rel_bucket((int64_t)(j0 + e) - (int64_t)i, m)] += g[e];
            break;
        case ATTN_SCORE_CALLBACK: {
            for (size_t e = 0; e < n; e++) {
                tile[e] = (float)in[e];
                grad[e] = (float)g[e];
            }
            attn_score_tile t = {b, h, i, j0, 1, n, n, tile};
            int code = m->grad_fn(m->user, &t, grad);
            if (code != 0) {
                *failure = (chain_failure){true, true, code, k, b, h, i, j0, n};
                return false;
            }
            for (size_t e = 0; e < n; e++) g[e] = (double)grad[e];
            REF(zero_unweighed)(weights, g, n);
            break;
        }
        }
    }
    return true;
}

/* One query row (b, h, i), in double: scores, softmax and weights never
 * round to REAL. row holds the sequence's S doubles. */
static bool REF(forward_row)(const REF(forward_view) *fv, size_t b, size_t h, size_t i,
                             double *row, double *chain) {
    const attn_attention_problem *p = fv->p;
    const REF_TENSORS *t = fv->t;
    const attn_attention_trace *tr = fv->trace;
    attn_attention_seq seq = attn_attention_seq_of(p, b);
    size_t S = seq.kv_len, D = p->head_dim, Dv = p->v_head_dim, g = attn_kv_head(p, h);
    size_t begin, end;
    attn_visible_keys(p, &seq, i, &begin, &end);
    bool sees_none = true, renormalize = p->renormalize;
    int64_t pos = (int64_t)i + seq.diagonal;
    const REAL *q_i = t->q + attn_view_offset(p->q.st, b, seq.q_start, h, i);
    const REAL *k = t->k + attn_view_offset(p->k.st, b, seq.kv_start, g, 0);
    const REAL *v = t->v + attn_view_offset(p->v.st, b, seq.kv_start, g, 0);
    REAL *out_i = t->out + attn_view_offset(p->out.st, b, seq.q_start, h, i);
    uint64_t trace_row = attn_drop_index(p, b, h, i, 0);

    /* row (S) = s_ij, hidden keys -inf. The renormalising mask (softmax,
     * then zero the hidden keys and divide by the kept sum) is a softmax
     * over the kept scores, so the shift is their max: a far larger hidden
     * score cannot make the kept weights underflow to 0 / 0. A NaN or +inf
     * hidden score still makes the row NaN, as it does in PyTorch. */
    bool chained = p->score_mod_count > 0;
    if (chained) {
        /* the chain runs over the keys scored below: [begin, end), or all
         * of them for the renormalising mask */
        size_t run0 = renormalize ? 0 : begin, run1 = renormalize ? S : end;
        if (run1 > run0) {
            for (size_t j = run0; j < run1; j++)
                row[j] = REF(dot)(q_i, k + j * p->k.st.t, D) * t->scale;
            chain_failure *failure = (chain_failure *)(chain + (p->score_mod_count + 1) * S);
            if (!REF(chain_forward)(p, b, h, i, run0, run1 - run0, row + run0, NULL,
                                    (float *)chain, failure))
                return false;
        }
    }
    double max = -INFINITY, hidden_max = -INFINITY;
    for (size_t j = 0; j < S; j++) {
        bool hides = !sees(p, b, h, i, j, begin, end);
        sees_none &= hides;
        if (hides && !renormalize) {
            row[j] = -INFINITY;
        } else if (!chained) {
            double x = REF(dot)(q_i, k + j * p->k.st.t, D) * t->scale;
            row[j] = modified_score(p, t->softcap, h, pos, j, x, NULL);
        }
        double *top = hides && renormalize ? &hidden_max : &max;
        if (row[j] > *top || isnan(row[j])) *top = row[j];
        if (tr && tr->scores) tr->scores[trace_row + j] = (float)row[j];
    }
    if (isnan(hidden_max) || hidden_max == INFINITY) max = hidden_max;
    /* a final score of -inf hides its key: a row whose every key scores
     * -inf sees none */
    if (max == -INFINITY) sees_none = true;
    double sink = p->sinks ? (double)p->sinks[h] : -INFINITY;
    if (p->sinks && (sink > max || isnan(sink))) max = sink;

    /* softmax; the renormalising mask then keeps the visible keys */
    double sum = 0.0, kept_sum = 0.0;
    for (size_t j = 0; j < S; j++) {
        row[j] = row[j] == -INFINITY ? 0.0 : exp(row[j] - max);
        sum += row[j];
        if (renormalize && sees(p, b, h, i, j, begin, end)) kept_sum += row[j];
    }
    if (p->sinks) {
        double e = exp(sink - max); /* the sink's share: in the denominator, no value */
        sum += e;
        kept_sum += e;
    }
    double norm = renormalize ? kept_sum : sum;
    if (t->lse) {
        REAL lse = sees_none ? (p->sinks ? (REAL)p->sinks[h] : (REAL)-INFINITY)
                             : (REAL)(max + log(norm));
        t->lse[attn_lse_index(p, b, h, i)] = lse;
        if (p->lse_lo)
            p->lse_lo[attn_lse_index(p, b, h, i)] =
                sees_none ? 0.0f : (float)((double)(max + log(norm)) - (double)lse);
    }
    bool dropping = has_dropout(fv->drop);
    for (size_t j = 0; j < S; j++) {
        bool zero = sees_none || (renormalize && !sees(p, b, h, i, j, begin, end));
        row[j] = zero ? 0.0 : row[j] / norm;
        if (tr && tr->weights) tr->weights[trace_row + j] = (float)row[j];
        if (dropping) row[j] *= drop_factor(fv->drop, trace_row + j, REF(f64));
        if (tr && tr->dropped) tr->dropped[trace_row + j] = (float)row[j];
    }
    /* out_i (Dv) = row (S) @ v (S, Dv) */
    for (size_t d = 0; d < Dv; d++) {
        double acc = 0.0;
        for (size_t j = 0; j < S; j++) acc += row[j] * v[j * p->v.st.t + d];
        out_i[d] = (REAL)acc;
    }
    return true;
}

static void REF(forward_rows)(void *arg, size_t part, size_t begin, size_t end) {
    const REF(forward_view) *fv = arg;
    const attn_attention_problem *p = fv->p;
    double *row = fv->workspace + part * forward_part_doubles(p);
    double *chain = row + p->kv_len + 1;
    for (size_t r = begin; r < end; r++) {
        size_t b, h, i;
        decode_row(p, p->q_heads, false, r, &b, &h, &i);
        if (!REF(forward_row)(fv, b, h, i, row, chain)) return; /* a callback failed */
    }
}

/* The forward on workspace of reference_forward_bytes: NULL, or
 * attn_pass_failed with the message in the ctx when a callback failed. */
static const char *REF(forward)(attn_ctx *ctx, const attn_attention_problem *p,
                                const REF_TENSORS *t, const attn_attention_dropout *drop,
                                const attn_attention_trace *trace, void *workspace) {
    REF(forward_view) fv = {p, t, drop, trace, workspace};
    clear_failures(ctx, p, workspace, forward_part_doubles(p), forward_failure_at(p));
    size_t row_cost = 2 * p->kv_len * (p->head_dim + p->v_head_dim) + 1;
    attn_parallel_for_parts(ctx->num_threads, row_count(p, p->q_heads, false),
                            MIN_FLOPS_PER_THREAD / row_cost + 1, REF(forward_rows), &fv);
    return report_failure(ctx, p, workspace, forward_part_doubles(p), forward_failure_at(p));
}

/* ---- backward (see reference.c for the passes) ------------------------------ */

typedef struct REF(backward_view) {
    const attn_attention_problem *p;
    const REF_TENSORS *t;
    const attn_attention_dropout *drop;
    float *dsinks;       /* NULL: not wanted */
    /* per row at attn_lse_index: lse as lse + lse_lo, the two parts apart
     * (a row's max past 2^53 times log(sum) would swallow log(sum)), and
     * delta */
    double *lse, *lse_lo, *delta;
    double *workspace;   /* part_doubles per part */
    size_t part_doubles;
    double *mod_sums;    /* the modifiers' tensor_grad sums (mod_grad_offset), or NULL:
                            pass 1 adds to them only when it runs serially */
} REF(backward_view);

/* Pass 1, query rows [begin, end) of the flattened (b, h, i). */
static void REF(backward_query_rows)(void *arg, size_t part, size_t begin, size_t end) {
    const REF(backward_view) *bv = arg;
    const attn_attention_problem *p = bv->p;
    const REF_TENSORS *t = bv->t;
    size_t D = p->head_dim, Dv = p->v_head_dim;
    double *P = bv->workspace + part * bv->part_doubles;
    double *dP = P + p->kv_len, *th = dP + p->kv_len, *acc = th + p->kv_len;
    /* with a chain: its inputs (count runs of S), two float tiles, the failure */
    double *saved = P + part_chain_at(p);
    float *tile = (float *)(saved + p->score_mod_count * p->kv_len), *grad = tile + p->kv_len;
    chain_failure *failure = (chain_failure *)(saved + (p->score_mod_count + 1) * p->kv_len);
    bool softcap = t->softcap > 0.0, from_lse = p->backward_from_lse;
    bool chained = p->score_mod_count > 0;
    for (size_t r = begin; r < end; r++) {
        size_t b, h, i;
        decode_row(p, p->q_heads, false, r, &b, &h, &i);
        attn_attention_seq seq = attn_attention_seq_of(p, b);
        size_t S = seq.kv_len, kv_head = attn_kv_head(p, h), first, last;
        attn_visible_keys(p, &seq, i, &first, &last);
        int64_t pos = (int64_t)i + seq.diagonal;
        size_t stat = attn_lse_index(p, b, h, i);
        const REAL *q_i = t->q + attn_view_offset(p->q.st, b, seq.q_start, h, i);
        const REAL *dout_i = t->dout + attn_view_offset(p->out.st, b, seq.q_start, h, i);
        const REAL *k = t->k + attn_view_offset(p->k.st, b, seq.kv_start, kv_head, 0);
        const REAL *v = t->v + attn_view_offset(p->v.st, b, seq.kv_start, kv_head, 0);
        REAL *dq_i = t->dq + attn_view_offset(p->q.st, b, seq.q_start, h, i);
        if (from_lse) {
            /* one block of the row's keys: the whole row's statistics are
             * given, lse_i and delta_i = dO_i . O_i (= sum_j P_ij dP_ij over
             * the row's keys, dropout included) */
            const REAL *out_i = t->out + attn_view_offset(p->out.st, b, seq.q_start, h, i);
            bv->lse[stat] = (double)t->lse[stat];
            bv->lse_lo[stat] = 0.0;
            bv->delta[stat] = REF(dot)(dout_i, out_i, Dv) - dlse_of(p, stat);
        }
        if (!sees_any(p, b, h, i, first, last)) {
            /* a row that sees no key output zeros: nothing flows back */
            for (size_t d = 0; d < D; d++) dq_i[d] = 0;
            if (!from_lse) {
                /* the sink's weight is 1: its gradient from lse alone */
                bv->lse[stat] = p->sinks ? (double)p->sinks[h] : -INFINITY;
                bv->lse_lo[stat] = 0.0;
                bv->delta[stat] = -dlse_of(p, stat);
            }
            continue;
        }
        double max = -INFINITY, sum = 0.0;
        if (chained) {
            /* s_ij of the keys [first, last) through the chain, its inputs kept */
            for (size_t j = first; j < last; j++)
                P[j] = REF(dot)(q_i, k + j * p->k.st.t, D) * t->scale;
            if (!REF(chain_forward)(p, b, h, i, first, last - first, P + first, saved, tile,
                                    failure))
                return;
        }
        if (from_lse) {
            /* P_ij = exp(s_ij - lse_i) over the visible keys, 0 elsewhere */
            double lse = bv->lse[stat];
            for (size_t j = 0; j < S; j++) {
                if (!sees(p, b, h, i, j, first, last)) {
                    P[j] = 0.0;
                } else {
                    double x = chained ? P[j] : REF(dot)(q_i, k + j * p->k.st.t, D) * t->scale;
                    double s_ij = chained ? x : modified_score(p, t->softcap, h, pos, j, x, &th[j]);
                    P[j] = s_ij == -INFINITY ? 0.0 : exp(s_ij - lse);
                }
            }
        } else {
            /* forward: P_i = softmax(mask(s_i)) with the sink, recomputed in double */
            for (size_t j = 0; j < S; j++) {
                if (!sees(p, b, h, i, j, first, last)) {
                    P[j] = -INFINITY;
                } else if (!chained) {
                    double x = REF(dot)(q_i, k + j * p->k.st.t, D) * t->scale;
                    P[j] = modified_score(p, t->softcap, h, pos, j, x, &th[j]);
                }
                if (P[j] > max || isnan(P[j])) max = P[j];
            }
            if (max == -INFINITY) { /* every key scores -inf: the row sees none */
                for (size_t d = 0; d < D; d++) dq_i[d] = 0;
                bv->lse[stat] = p->sinks ? (double)p->sinks[h] : -INFINITY;
                bv->lse_lo[stat] = 0.0;
                bv->delta[stat] = -dlse_of(p, stat);
                continue;
            }
            double sink = p->sinks ? (double)p->sinks[h] : -INFINITY;
            if (p->sinks && (sink > max || isnan(sink))) max = sink;
            for (size_t j = 0; j < S; j++) {
                P[j] = P[j] == -INFINITY ? 0.0 : exp(P[j] - max);
                sum += P[j];
            }
            if (p->sinks) sum += exp(sink - max);
            for (size_t j = 0; j < S; j++) P[j] /= sum;
        }
        /* dP_ij = (dO_i . v_j) * drop_ij; a hidden entry holds 0 (dO_i .
         * v_j), NaN exactly where PyTorch's full matmul dO v^T is not
         * finite there (a NaN or infinite dO_i or v_j), and its weight 0
         * times it joins delta as in PyTorch's softmax backward. */
        double delta = 0.0;
        for (size_t j = 0; j < S; j++) {
            if (!sees(p, b, h, i, j, first, last)) {
                dP[j] = 0.0 * REF(dot)(dout_i, v + j * p->v.st.t, Dv);
            } else {
                double dA = REF(dot)(dout_i, v + j * p->v.st.t, Dv);
                dP[j] = dA * drop_factor(bv->drop, attn_drop_index(p, b, h, i, j), REF(f64));
            }
            delta += P[j] * dP[j];
        }
        delta = from_lse ? bv->delta[stat] : delta - dlse_of(p, stat);
        /* dS_ij = P_ij (dP_ij - delta_i); masked_fill's backward zeroes the
         * hidden entries, the renormalising product keeps them (0 or NaN). */
        for (size_t d = 0; d < D; d++) acc[d] = 0.0;
        /* th_j becomes dS_ij, then, through the chain, the gradient of x_ij */
        for (size_t j = first; j < last; j++) {
            if (!sees(p, b, h, i, j, first, last)) {
                th[j] = 0.0;
                continue;
            }
            double dS = P[j] * (dP[j] - delta);
            if (softcap) dS *= 1.0 - th[j] * th[j]; /* d(c tanh(x / c)) / dx */
            th[j] = dS;
        }
        if (chained && !REF(chain_backward)(p, b, h, i, first, last - first, saved, P + first,
                                            th + first, bv->mod_sums, tile, grad, failure))
            return;
        for (size_t j = first; j < last; j++) {
            if (!sees(p, b, h, i, j, first, last)) continue;
            const REAL *k_j = k + j * p->k.st.t;
            for (size_t d = 0; d < D; d++) acc[d] += th[j] * k_j[d];
        }
        /* dq_i = scale * sum_j dS_ij k_j */
        for (size_t d = 0; d < D; d++) dq_i[d] = (REAL)(acc[d] * t->scale);
        if (!from_lse) {
            /* lse = max + log(sum) in two parts: the sum rounded, and what
             * it dropped (exact where |max| >= log(sum), Fast2Sum) */
            double log_sum = log(sum), lse = max + log_sum;
            bv->lse[stat] = lse;
            bv->lse_lo[stat] = isfinite(lse) ? log_sum - (lse - max) : 0.0;
            bv->delta[stat] = delta;
        }
    }
}

/* Pass 2, key rows [begin, end) of the flattened (b, kv head, j). */
static void REF(backward_key_rows)(void *arg, size_t part, size_t begin, size_t end) {
    const REF(backward_view) *bv = arg;
    const attn_attention_problem *p = bv->p;
    const REF_TENSORS *t = bv->t;
    size_t D = p->head_dim, Dv = p->v_head_dim, G = p->q_heads / p->kv_heads;
    double *acc_k = bv->workspace + part * bv->part_doubles + 3 * p->kv_len;
    double *acc_v = acc_k + D;
    double *saved = bv->workspace + part * bv->part_doubles + part_chain_at(p);
    float *tile = (float *)(saved + p->score_mod_count * p->kv_len), *grad = tile + p->kv_len;
    chain_failure *failure = (chain_failure *)(saved + (p->score_mod_count + 1) * p->kv_len);
    bool softcap = t->softcap > 0.0, chained = p->score_mod_count > 0;
    for (size_t r = begin; r < end; r++) {
        size_t b, kv_head, j;
        decode_row(p, p->kv_heads, true, r, &b, &kv_head, &j);
        attn_attention_seq seq = attn_attention_seq_of(p, b);
        const REAL *k_j = t->k + attn_view_offset(p->k.st, b, seq.kv_start, kv_head, j);
        const REAL *v_j = t->v + attn_view_offset(p->v.st, b, seq.kv_start, kv_head, j);
        for (size_t d = 0; d < D; d++) acc_k[d] = 0.0;
        for (size_t d = 0; d < Dv; d++) acc_v[d] = 0.0;
        for (size_t h = kv_head * G; h < kv_head * G + G; h++) {
            for (size_t i = 0; i < seq.q_len; i++) {
                size_t first, last, stat = attn_lse_index(p, b, h, i);
                attn_visible_keys(p, &seq, i, &first, &last);
                const REAL *q_i = t->q + attn_view_offset(p->q.st, b, seq.q_start, h, i);
                const REAL *dout_i =
                    t->dout + attn_view_offset(p->out.st, b, seq.q_start, h, i);
                double lse = bv->lse[stat], lse_lo = bv->lse_lo[stat], delta = bv->delta[stat];
                if (!sees(p, b, h, i, j, first, last)) {
                    /* weight 0: dv_j += 0 * dO_i, as the matmul A^T dO does */
                    for (size_t d = 0; d < Dv; d++) acc_v[d] += 0.0 * dout_i[d];
                    double dS = p->renormalize ? 0.0 * delta : 0.0;
                    if (dS != 0.0 || isnan(dS))
                        for (size_t d = 0; d < D; d++) acc_k[d] += dS * q_i[d];
                    continue;
                }
                /* forward: P_ij = exp(s_ij - lse_i), A_ij = P_ij * drop_ij */
                double th = 0.0, x = REF(dot)(q_i, k_j, D) * t->scale, s_ij = x;
                if (chained) {
                    /* the chain on this one key: a 1 x 1 tile */
                    if (!REF(chain_forward)(p, b, h, i, j, 1, &s_ij, saved, tile, failure))
                        return;
                } else {
                    s_ij = modified_score(p, t->softcap, h, (int64_t)i + seq.diagonal, j, x, &th);
                }
                double P = s_ij == -INFINITY ? 0.0 : exp((s_ij - lse) - lse_lo);
                double drop = drop_factor(bv->drop, attn_drop_index(p, b, h, i, j), REF(f64));
                double A = P * drop;
                double dP = REF(dot)(dout_i, v_j, Dv) * drop;
                double dS = P * (dP - delta);
                if (softcap) dS *= 1.0 - th * th;
                if (chained &&
                    !REF(chain_backward)(p, b, h, i, j, 1, saved, &P, &dS, NULL, tile, grad,
                                         failure))
                    return;
                for (size_t d = 0; d < Dv; d++) acc_v[d] += A * dout_i[d];
                for (size_t d = 0; d < D; d++) acc_k[d] += dS * q_i[d];
            }
        }
        /* dv_j = sum_i A_ij dO_i;  dk_j = scale * sum_i dS_ij q_i */
        REAL *dk_j = t->dk + attn_view_offset(p->k.st, b, seq.kv_start, kv_head, j);
        REAL *dv_j = t->dv + attn_view_offset(p->v.st, b, seq.kv_start, kv_head, j);
        for (size_t d = 0; d < Dv; d++) dv_j[d] = (REAL)acc_v[d];
        for (size_t d = 0; d < D; d++) dk_j[d] = (REAL)(acc_k[d] * t->scale);
    }
}

/* dsinks_h = -sum over (b, i) of P_sink delta_i, b then i ascending: the
 * sink's logit s gets dP_sink = 0 (it has no value), so dS = P (0 - delta). */
static void REF(sink_grads)(const REF(backward_view) *bv) {
    const attn_attention_problem *p = bv->p;
    for (size_t h = 0; h < p->q_heads; h++) {
        double sink = p->sinks[h], sum = 0.0;
        for (size_t b = 0; b < p->batch; b++) {
            attn_attention_seq seq = attn_attention_seq_of(p, b);
            for (size_t i = 0; i < seq.q_len; i++) {
                size_t stat = attn_lse_index(p, b, h, i);
                sum += exp((sink - bv->lse[stat]) - bv->lse_lo[stat]) * bv->delta[stat];
            }
        }
        bv->dsinks[h] = (float)-sum;
    }
}

/* The modifiers' tensor_grad from their sums, each rounded once: a BIAS
 * tensor's elements that some (b, h, i, j) reads (broadcast ones hold the
 * sum over all that read them), a REL_BIAS or REL_TABLE table whole. */
static void REF(write_mod_grads)(const attn_attention_problem *p, const double *sums) {
    for (size_t k = 0; k < p->score_mod_count; k++) {
        const attn_score_mod *m = &p->score_mods[k];
        size_t n = mod_grad_doubles(p, k);
        if (!n) continue;
        const double *sum = sums + mod_grad_offset(p, k);
        if (attn_score_mod_relative(m->kind)) {
            for (size_t e = 0; e < n; e++) m->tensor_grad[e] = (float)sum[e];
            continue;
        }
        for (size_t b = 0; b < p->batch; b++)
            for (size_t h = 0; h < p->q_heads; h++)
                for (size_t i = 0; i < p->q_len; i++)
                    for (size_t j = 0; j < p->kv_len; j++) {
                        size_t at = bias_at(m, b, h, i, j);
                        m->tensor_grad[at] = (float)sum[at];
                    }
    }
}

/* The backward on workspace of reference_backward_bytes; dsinks (NULL: not
 * wanted) is written when the problem has sinks. NULL, or attn_pass_failed
 * with the message in the ctx when a callback failed. */
static const char *REF(backward)(attn_ctx *ctx, const attn_attention_problem *p,
                                 const REF_TENSORS *t, const attn_attention_dropout *drop,
                                 float *dsinks, void *workspace) {
    size_t rows = attn_lse_rows(p), parts = attn_parallel_parts(ctx->num_threads);
    double *stats = workspace;
    size_t mod_sums = mod_grad_offset(p, p->score_mod_count);
    double *parts_at = stats + 3 * rows, *sums = parts_at + parts * part_doubles(p);
    REF(backward_view) bv = {.p = p,
                             .t = t,
                             .drop = drop,
                             .dsinks = dsinks,
                             .lse = stats,
                             .lse_lo = stats + rows,
                             .delta = stats + 2 * rows,
                             .workspace = parts_at,
                             .part_doubles = part_doubles(p),
                             .mod_sums = mod_sums ? sums : NULL};
    size_t G = p->q_heads / p->kv_heads;
    size_t q_cost = 4 * p->kv_len * (p->head_dim + p->v_head_dim) + 1;
    size_t k_cost = 4 * G * p->q_len * (p->head_dim + p->v_head_dim) + 1;
    clear_failures(ctx, p, parts_at, part_doubles(p), backward_failure_at(p));
    if (mod_sums) {
        /* A bias element broadcast over rows sums their gradients: pass 1
         * runs serially, rows in order, so the sums have one order for any
         * thread count. */
        memset(sums, 0, mod_sums * sizeof *sums);
        REF(backward_query_rows)(&bv, 0, 0, row_count(p, p->q_heads, false));
    } else {
        attn_parallel_for_parts(ctx->num_threads, row_count(p, p->q_heads, false),
                                MIN_FLOPS_PER_THREAD / q_cost + 1, REF(backward_query_rows), &bv);
    }
    const char *failed = report_failure(ctx, p, parts_at, part_doubles(p), backward_failure_at(p));
    if (failed) return failed;
    /* Pass 2 reads every row's lse and delta: pass 1 finishes first. */
    clear_failures(ctx, p, parts_at, part_doubles(p), backward_failure_at(p));
    attn_parallel_for_parts(ctx->num_threads, row_count(p, p->kv_heads, true),
                            MIN_FLOPS_PER_THREAD / k_cost + 1, REF(backward_key_rows), &bv);
    if ((failed = report_failure(ctx, p, parts_at, part_doubles(p), backward_failure_at(p))))
        return failed;
    if (mod_sums) REF(write_mod_grads)(p, sums);
    if (p->sinks && dsinks) REF(sink_grads)(&bv);
    return NULL;
}
