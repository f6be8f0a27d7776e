/*
 * test_reference_attention.c — the reference attention backend
 * (src/attention/reference.c) against a brute-force float64 attention
 * written here from the contract's formulas: the (T, S) scores of each
 * head materialised with an explicit visibility mask and ALiBi bias, a
 * softmax with the sink in its denominator, dropout, and the analytic
 * backward, itself checked against central finite differences. Random
 * small problems cover each feature and their combinations (GQA/MQA,
 * v_head_dim != head_dim, causal, windows, diagonals and offsets, softcap,
 * ALiBi, sinks and dsinks, packed varlen batches with empty sequences,
 * strided layouts, Philox and bit-mask dropout, the renormalising mask);
 * every case runs at 1, 2 and 3 threads and must give the same bits. The
 * backward of one block of keys given the whole rows' lse and out
 * (backward_from_lse) sums to the whole problem's.
 */
#include "attn.h"
#include "attention/attention.h"
#include "check.h"
#include "kernels/kernels.h"
#include "rng/philox.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- random numbers --------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t rnd_u32(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}
static size_t rnd_int(size_t lo, size_t hi) { return lo + rnd_u32() % (hi - lo + 1); } /* [lo, hi] */
static double rnd_uniform(double lo, double hi) {
    return lo + (hi - lo) * (double)rnd_u32() / 2147483648.0;
}
static bool rnd_bool(void) { return rnd_u32() & 1u; }

/* ---- a test problem ---------------------------------------------------------- */

enum { MAX_BATCH = 4 };

/* A problem with its own storage. Element d of row (b, token, h) of a tensor
 * lives at b * sb + token * st + h * sh + d, token = cu[b] + i when packed. */
typedef struct tcase {
    size_t B, Hq, Hkv, T, S, D, Dv;
    bool causal, renormalize, window, varlen;
    attn_diagonal diagonal;
    int64_t q_offset, left, right;
    double scale, softcap;
    bool alibi, sinks;
    int32_t cu_q[MAX_BATCH + 1], cu_kv[MAX_BATCH + 1];
    int layout[4]; /* q, k, v, out: 0 (B, T, H, D), 1 (B, H, T, D), 2 (B, T, H, D) padded */
    attn_drop_kind drop;
    double drop_p;
    bool drop_all;
    /* storage */
    attn_view_strides st[4];
    size_t n[4];
    float *t[4]; /* q, k, v, out */
    float *slopes, *sink_vals, *lse, *dout, *dq, *dk, *dv, *dsinks;
    uint8_t *bits;
    attn_attention_problem p;
    attn_attention_dropout dr;
} tcase;

enum { Q, K, V, O };

static size_t tokens_of(const tcase *c, bool kv) {
    if (c->varlen) return (size_t)(kv ? c->cu_kv : c->cu_q)[c->B];
    return kv ? c->S : c->T;
}

/* Strides and size of tensor x (heads H, features F, tokens per sequence L). */
static void layout_tensor(tcase *c, int x, size_t H, size_t F, size_t L) {
    size_t total = tokens_of(c, x == K || x == V);
    size_t rows = c->varlen ? total : L; /* tokens per b */
    if (rows == 0) rows = 1;
    attn_view_strides s;
    switch (c->layout[x]) {
    case 1: /* (B, H, T, F); packed: (H, total, F) */
        s.t = F;
        s.h = rows * F;
        s.b = c->varlen ? 0 : H * rows * F;
        break;
    case 2: /* (B, T, H, F) with a gap after each token's heads */
        s.h = F;
        s.t = H * F + 3;
        s.b = c->varlen ? 0 : rows * s.t + 5;
        break;
    default:
        s.h = F;
        s.t = H * F;
        s.b = c->varlen ? 0 : rows * H * F;
        break;
    }
    c->st[x] = s;
    size_t batches = c->varlen ? 1 : c->B;
    c->n[x] = (batches - 1) * s.b + (rows - 1) * s.t + (H - 1) * s.h + F + 8;
}

static size_t seq_q_len(const tcase *c, size_t b) {
    return c->varlen ? (size_t)(c->cu_q[b + 1] - c->cu_q[b]) : c->T;
}
static size_t seq_kv_len(const tcase *c, size_t b) {
    return c->varlen ? (size_t)(c->cu_kv[b + 1] - c->cu_kv[b]) : c->S;
}
static int64_t seq_diagonal(const tcase *c, size_t b) {
    if (c->diagonal == ATTN_DIAGONAL_TOP_LEFT) return 0;
    if (c->diagonal == ATTN_DIAGONAL_OFFSET) return c->q_offset;
    return (int64_t)seq_kv_len(c, b) - (int64_t)seq_q_len(c, b);
}

/* Offset of row (b, i) of head h of tensor x. */
static size_t at(const tcase *c, int x, size_t b, size_t h, size_t i) {
    size_t token = i;
    if (c->varlen) token += (size_t)(x == K || x == V ? c->cu_kv : c->cu_q)[b];
    return b * c->st[x].b + token * c->st[x].t + h * c->st[x].h;
}

static size_t lse_at(const tcase *c, size_t b, size_t h, size_t i) {
    if (c->varlen) return h * (size_t)c->cu_q[c->B] + (size_t)c->cu_q[b] + i;
    return (b * c->Hq + h) * c->T + i;
}

static uint64_t drop_at(const tcase *c, size_t b, size_t h, size_t i, size_t j) {
    return (((uint64_t)b * c->Hq + h) * c->T + i) * c->S + j;
}

static float *fill(size_t n, double amp) {
    float *x = malloc(n * sizeof *x);
    for (size_t e = 0; e < n; e++) x[e] = (float)rnd_uniform(-amp, amp);
    return x;
}

static float *nans(size_t n) {
    float *x = malloc(n * sizeof *x);
    for (size_t e = 0; e < n; e++) x[e] = NAN;
    return x;
}

/* Allocates and fills the tensors of c (its sizes and features set) and
 * describes it as a problem. */
static void tcase_build(tcase *c) {
    c->softcap = (double)(float)c->softcap; /* as the problem holds it */
    if (c->varlen) {
        /* q_len, kv_len: the longest lengths */
        size_t tq = 1, tk = 1;
        for (size_t b = 0; b < c->B; b++) {
            if (seq_q_len(c, b) > tq) tq = seq_q_len(c, b);
            if (seq_kv_len(c, b) > tk) tk = seq_kv_len(c, b);
        }
        c->T = tq;
        c->S = tk;
    }
    layout_tensor(c, Q, c->Hq, c->D, c->T);
    layout_tensor(c, K, c->Hkv, c->D, c->S);
    layout_tensor(c, V, c->Hkv, c->Dv, c->S);
    layout_tensor(c, O, c->Hq, c->Dv, c->T);
    c->t[Q] = fill(c->n[Q], 1.5);
    c->t[K] = fill(c->n[K], 1.5);
    c->t[V] = fill(c->n[V], 1.0);
    c->t[O] = nans(c->n[O]);
    c->dout = fill(c->n[O], 1.0);
    c->slopes = fill(c->Hq, 0.5);
    for (size_t h = 0; h < c->Hq; h++) c->slopes[h] = fabsf(c->slopes[h]);
    c->sink_vals = fill(c->Hq, 2.0);
    size_t rows = c->varlen ? c->Hq * (size_t)c->cu_q[c->B] : c->B * c->Hq * c->T;
    c->lse = nans(rows);
    c->dq = nans(c->n[Q]);
    c->dk = nans(c->n[K]);
    c->dv = nans(c->n[V]);
    c->dsinks = nans(c->Hq);
    size_t weights = c->B * c->Hq * c->T * c->S;
    c->bits = calloc(weights / 8 + 1, 1);
    double keep = 1.0 - c->drop_p;
    for (size_t e = 0; e < weights; e++)
        if (rnd_uniform(0.0, 1.0) < keep) attn_set_bit(c->bits, e);

    attn_attention_problem p = {
        .batch = c->B, .q_heads = c->Hq, .kv_heads = c->Hkv, .q_len = c->T, .kv_len = c->S,
        .head_dim = c->D, .v_head_dim = c->Dv,
        .q = attn_view_f32(c->t[Q], c->st[Q]), .k = attn_view_f32(c->t[K], c->st[K]),
        .v = attn_view_f32(c->t[V], c->st[V]), .out = attn_view_f32(c->t[O], c->st[O]),
        .lse = c->lse,
        .scale = (float)c->scale, .causal = c->causal, .renormalize = c->renormalize,
        .diagonal = c->diagonal, .q_offset = c->q_offset,
        .window = c->window, .window_left = c->left, .window_right = c->right,
        .softcap = (float)c->softcap,
        .alibi_slopes = c->alibi ? c->slopes : NULL, .sinks = c->sinks ? c->sink_vals : NULL,
        .cu_seqlens_q = c->varlen ? c->cu_q : NULL, .cu_seqlens_kv = c->varlen ? c->cu_kv : NULL,
        .total_q = c->varlen ? (size_t)c->cu_q[c->B] : 0,
    };
    c->p = p;
    attn_attention_dropout dr = {.kind = c->drop, .kept_scale = (float)(1.0 / keep)};
    if (c->drop == ATTN_DROP_BITS) dr.keep_bits = c->bits;
    if (c->drop == ATTN_DROP_PHILOX) {
        dr.seed = 0x1234ABCDull + rnd_u32();
        dr.offset = rnd_u32() % 7;
        dr.keep_threshold = c->drop_all ? 0 : attn_philox_keep_threshold(c->drop_p);
        if (c->drop_all) dr.kept_scale = 0.0f;
    }
    c->dr = dr;
}

static void tcase_free(tcase *c) {
    for (int x = 0; x < 4; x++) free(c->t[x]);
    free(c->slopes);
    free(c->sink_vals);
    free(c->lse);
    free(c->dout);
    free(c->dq);
    free(c->dk);
    free(c->dv);
    free(c->dsinks);
    free(c->bits);
}

/* ---- brute force, float64 ---------------------------------------------------- */

/* Everything the brute force computes, in double, dense (b, h, i, j) order:
 * out and dq, dk, dv indexed like the tensors. */
typedef struct brute {
    double *out, *lse, *dq, *dk, *dv, *dsinks;
    double *scores, *weights, *dropped; /* (B, Hq, T, S), hidden: -inf / 0 */
} brute;

/* Inputs as doubles (perturbed by the finite differences). */
typedef struct brute_in {
    double *q, *k, *v, *sinks;
} brute_in;

static bool visible(const tcase *c, int64_t pos, size_t j) {
    int64_t jj = (int64_t)j;
    if (c->causal && jj > pos) return false;
    if (c->window && c->left >= 0 && jj < pos - c->left) return false;
    if (c->window && c->right >= 0 && jj > pos + c->right) return false;
    return true;
}

static double drop_of(const tcase *c, uint64_t e) {
    if (c->drop == ATTN_DROP_NONE) return 1.0;
    if (c->drop == ATTN_DROP_BITS) return attn_bit(c->bits, (size_t)e) ? (double)c->dr.kept_scale : 0.0;
    uint32_t w = attn_philox_dropout_word(c->dr.seed, c->dr.offset, e);
    return w < c->dr.keep_threshold ? (double)c->dr.kept_scale : 0.0;
}

static double *zeros(size_t n) { return calloc(n ? n : 1, sizeof(double)); }

/* Forward (and, when want_grads, the analytic backward with dout) of c on
 * inputs in. loss (optional): sum of out * dout. */
static void brute_run(const tcase *c, const brute_in *in, bool want_grads, brute *r,
                      double *loss) {
    size_t B = c->B, Hq = c->Hq, T = c->T, S = c->S, D = c->D, Dv = c->Dv, G = c->Hq / c->Hkv;
    size_t rows = c->varlen ? Hq * (size_t)c->cu_q[B] : B * Hq * T;
    r->out = zeros(c->n[O]);
    r->lse = zeros(rows);
    r->scores = zeros(B * Hq * T * S);
    r->weights = zeros(B * Hq * T * S);
    r->dropped = zeros(B * Hq * T * S);
    r->dq = zeros(c->n[Q]);
    r->dk = zeros(c->n[K]);
    r->dv = zeros(c->n[V]);
    r->dsinks = zeros(Hq);
    double *x = zeros(S), *s = zeros(S), *P = zeros(S), *dA = zeros(S);
    double total = 0.0;
    for (size_t b = 0; b < B; b++) {
        size_t Tb = seq_q_len(c, b), Sb = seq_kv_len(c, b);
        for (size_t h = 0; h < Hq; h++) {
            size_t g = h / G;
            for (size_t i = 0; i < Tb; i++) {
                int64_t pos = (int64_t)i + seq_diagonal(c, b);
                const double *qi = in->q + at(c, Q, b, h, i);
                size_t n_visible = 0;
                /* the explicit (S) score row with its mask and bias */
                double m = -INFINITY;
                for (size_t j = 0; j < Sb; j++) {
                    const double *kj = in->k + at(c, K, b, g, j);
                    double dot = 0.0;
                    for (size_t d = 0; d < D; d++) dot += qi[d] * kj[d];
                    x[j] = dot * (double)(float)c->scale;
                    double sc = c->softcap > 0 ? c->softcap * tanh(x[j] / c->softcap) : x[j];
                    if (c->alibi) sc -= (double)c->slopes[h] * fabs((double)(pos - (int64_t)j));
                    s[j] = visible(c, pos, j) ? sc : -INFINITY;
                    if (visible(c, pos, j)) {
                        n_visible++;
                        if (s[j] > m) m = s[j];
                    }
                    r->scores[drop_at(c, b, h, i, j)] = c->renormalize && !visible(c, pos, j) ? sc : s[j];
                }
                double sink = c->sinks ? in->sinks[h] : -INFINITY;
                if (sink > m) m = sink;
                double Z = 0.0;
                for (size_t j = 0; j < Sb; j++) Z += n_visible ? exp(s[j] - m) : 0.0;
                if (c->sinks) Z += exp(sink - m);
                double lse = n_visible ? m + log(Z) : sink;
                r->lse[lse_at(c, b, h, i)] = lse;
                for (size_t j = 0; j < Sb; j++) {
                    P[j] = n_visible ? exp(s[j] - m) / Z : 0.0;
                    r->weights[drop_at(c, b, h, i, j)] = P[j];
                    r->dropped[drop_at(c, b, h, i, j)] = P[j] * drop_of(c, drop_at(c, b, h, i, j));
                }
                double *oi = r->out + at(c, O, b, h, i);
                const float *doi = c->dout + at(c, O, b, h, i);
                for (size_t d = 0; d < Dv; d++) {
                    double acc = 0.0;
                    for (size_t j = 0; j < Sb; j++)
                        acc += P[j] * drop_of(c, drop_at(c, b, h, i, j)) * in->v[at(c, V, b, g, j) + d];
                    oi[d] = acc;
                    total += acc * doi[d];
                }
                if (!want_grads || !n_visible) continue;
                /* dA = dO v^T, dP = dA * drop, delta = sum P dP */
                double delta = 0.0;
                for (size_t j = 0; j < Sb; j++) {
                    double dot = 0.0;
                    for (size_t d = 0; d < Dv; d++) dot += (double)doi[d] * in->v[at(c, V, b, g, j) + d];
                    dA[j] = dot * drop_of(c, drop_at(c, b, h, i, j));
                    delta += P[j] * dA[j];
                }
                for (size_t j = 0; j < Sb; j++) {
                    double A = P[j] * drop_of(c, drop_at(c, b, h, i, j));
                    for (size_t d = 0; d < Dv; d++) r->dv[at(c, V, b, g, j) + d] += A * doi[d];
                    double dS = P[j] * (dA[j] - delta);
                    if (c->softcap > 0) {
                        double t = tanh(x[j] / c->softcap);
                        dS *= 1.0 - t * t;
                    }
                    dS *= (double)(float)c->scale;
                    const double *kj = in->k + at(c, K, b, g, j);
                    for (size_t d = 0; d < D; d++) {
                        r->dq[at(c, Q, b, h, i) + d] += dS * kj[d];
                        r->dk[at(c, K, b, g, j) + d] += dS * qi[d];
                    }
                }
                if (c->sinks) r->dsinks[h] -= exp(sink - lse) * delta;
            }
        }
    }
    free(x);
    free(s);
    free(P);
    free(dA);
    if (loss) *loss = total;
}

static void brute_free(brute *r) {
    free(r->out);
    free(r->lse);
    free(r->dq);
    free(r->dk);
    free(r->dv);
    free(r->dsinks);
    free(r->scores);
    free(r->weights);
    free(r->dropped);
}

static double *to_double(const float *x, size_t n) {
    double *y = malloc((n ? n : 1) * sizeof *y);
    for (size_t e = 0; e < n; e++) y[e] = x[e];
    return y;
}

/* ---- the reference backend ----------------------------------------------------- */

typedef struct ref_result {
    float *out, *lse, *dq, *dk, *dv, *dsinks;
    float *scores, *weights, *dropped;
} ref_result;

static attn_ctx *ctxs[4];      /* the reference kernels, by thread count 1, 2, 3 */
static attn_ctx *fast_ctxs[4]; /* the ctx's default (fast) kernels, the same */

static float *copy_floats(const float *x, size_t n) {
    float *y = malloc((n ? n : 1) * sizeof *y);
    memcpy(y, x, n * sizeof *y);
    return y;
}

/* Runs the reference forward and backward at `threads`, with a trace when
 * traced; the results are copied out. */
static ref_result ref_run(tcase *c, size_t threads, bool traced) {
    const attn_attention_backend *ref = &attn_attention_reference;
    attn_ctx *ctx = ctxs[threads];
    size_t weights = c->B * c->Hq * c->T * c->S;
    size_t rows = c->varlen ? c->Hq * (size_t)c->cu_q[c->B] : c->B * c->Hq * c->T;
    ref_result r = {0};
    attn_attention_trace trace = {0};
    if (traced) {
        trace.scores = r.scores = nans(weights);
        trace.weights = r.weights = nans(weights);
        trace.dropped = r.dropped = nans(weights);
    }
    for (size_t e = 0; e < c->n[O]; e++) c->t[O][e] = NAN;
    for (size_t e = 0; e < rows; e++) c->lse[e] = NAN;
    void *work = malloc(ref->forward_bytes(ctx, &c->p, &trace));
    ref->forward(ctx, &c->p, &c->dr, traced ? &trace : NULL, work);
    free(work);
    r.out = copy_floats(c->t[O], c->n[O]);
    r.lse = copy_floats(c->lse, rows);

    for (size_t e = 0; e < c->n[Q]; e++) c->dq[e] = NAN;
    for (size_t e = 0; e < c->n[K]; e++) c->dk[e] = NAN;
    for (size_t e = 0; e < c->n[V]; e++) c->dv[e] = NAN;
    for (size_t h = 0; h < c->Hq; h++) c->dsinks[h] = NAN;
    attn_attention_grads g = {.dout = c->dout, .dq = c->dq, .dk = c->dk, .dv = c->dv,
                              .dsinks = c->sinks ? c->dsinks : NULL};
    work = malloc(ref->backward_bytes(ctx, &c->p));
    ref->backward(ctx, &c->p, &c->dr, &g, work);
    free(work);
    r.dq = copy_floats(c->dq, c->n[Q]);
    r.dk = copy_floats(c->dk, c->n[K]);
    r.dv = copy_floats(c->dv, c->n[V]);
    r.dsinks = copy_floats(c->dsinks, c->Hq);
    return r;
}

static void ref_free(ref_result *r) {
    free(r->out);
    free(r->lse);
    free(r->dq);
    free(r->dk);
    free(r->dv);
    free(r->dsinks);
    free(r->scores);
    free(r->weights);
    free(r->dropped);
}

/* Bitwise equal, NaNs included. */
static bool same_bits(const float *a, const float *b, size_t n) {
    return (a == NULL) == (b == NULL) && (!a || memcmp(a, b, n * sizeof *a) == 0);
}

/* ---- comparisons ------------------------------------------------------------------ */

static int case_id;
static int failures_reported;

/* got (float) against want (double) at the n offsets of rows of tensor x:
 * |got - want| <= tol * max(1, max |want|), and got finite. */
typedef struct cmp {
    double worst, scale;
    bool bad;
} cmp;

static void cmp_add(cmp *m, float got, double want) {
    double err = fabs((double)got - want);
    if (!(err <= m->worst) || isnan(err)) m->worst = isnan(err) ? INFINITY : err;
    if (fabs(want) > m->scale) m->scale = fabs(want);
}

static void cmp_check(cmp *m, const char *what, double tol, int line) {
    double s = m->scale > 1.0 ? m->scale : 1.0;
    bool ok = m->worst <= tol * s;
    if (ok) {
        check_passed++;
    } else {
        check_failed++;
        if (failures_reported++ < 40)
            fprintf(stderr, "%s:%d: case %d: %s off by %.3g (scale %.3g, tol %.3g)\n", __FILE__,
                    line, case_id, what, m->worst, m->scale, tol * s);
    }
}

#define TOL 4e-6

/* Compares every logical element of the reference's results with the brute force. */
static void compare(const tcase *c, const ref_result *r, const brute *w, bool traced) {
    cmp out = {0}, lse = {0}, dq = {0}, dk = {0}, dv = {0}, ds = {0};
    cmp sc = {0}, wt = {0}, dr = {0};
    bool lse_ok = true, score_inf_ok = true;
    for (size_t b = 0; b < c->B; b++) {
        size_t Tb = seq_q_len(c, b), Sb = seq_kv_len(c, b);
        for (size_t h = 0; h < c->Hq; h++) {
            for (size_t i = 0; i < Tb; i++) {
                for (size_t d = 0; d < c->Dv; d++)
                    cmp_add(&out, r->out[at(c, O, b, h, i) + d], w->out[at(c, O, b, h, i) + d]);
                for (size_t d = 0; d < c->D; d++)
                    cmp_add(&dq, r->dq[at(c, Q, b, h, i) + d], w->dq[at(c, Q, b, h, i) + d]);
                double wl = w->lse[lse_at(c, b, h, i)];
                float gl = r->lse[lse_at(c, b, h, i)];
                if (isinf(wl)) lse_ok = lse_ok && gl == (float)wl;
                else cmp_add(&lse, gl, wl);
                if (!traced) continue;
                for (size_t j = 0; j < Sb; j++) {
                    uint64_t e = drop_at(c, b, h, i, j);
                    if (isinf(w->scores[e])) score_inf_ok = score_inf_ok && r->scores[e] == (float)w->scores[e];
                    else cmp_add(&sc, r->scores[e], w->scores[e]);
                    cmp_add(&wt, r->weights[e], w->weights[e]);
                    cmp_add(&dr, r->dropped[e], w->dropped[e]);
                }
            }
        }
        for (size_t g = 0; g < c->Hkv; g++)
            for (size_t j = 0; j < Sb; j++) {
                for (size_t d = 0; d < c->D; d++)
                    cmp_add(&dk, r->dk[at(c, K, b, g, j) + d], w->dk[at(c, K, b, g, j) + d]);
                for (size_t d = 0; d < c->Dv; d++)
                    cmp_add(&dv, r->dv[at(c, V, b, g, j) + d], w->dv[at(c, V, b, g, j) + d]);
            }
    }
    if (c->sinks)
        for (size_t h = 0; h < c->Hq; h++) cmp_add(&ds, r->dsinks[h], w->dsinks[h]);
    cmp_check(&out, "out", TOL, __LINE__);
    cmp_check(&lse, "lse", TOL, __LINE__);
    cmp_check(&dq, "dq", TOL, __LINE__);
    cmp_check(&dk, "dk", TOL, __LINE__);
    cmp_check(&dv, "dv", TOL, __LINE__);
    cmp_check(&ds, "dsinks", TOL, __LINE__);
    if (!lse_ok && failures_reported++ < 40) fprintf(stderr, "case %d: infinite lse differs\n", case_id);
    CHECK(lse_ok);
    if (traced) {
        cmp_check(&sc, "trace scores", TOL, __LINE__);
        cmp_check(&wt, "trace weights", TOL, __LINE__);
        cmp_check(&dr, "trace dropped", TOL, __LINE__);
        CHECK(score_inf_ok);
    }
}

/* Runs c at 1, 2 and 3 threads (the same bits) and compares with the brute force. */
static void run_case(tcase *c, bool traced) {
    case_id++;
    ref_result r[4];
    for (size_t n = 1; n <= 3; n++) r[n] = ref_run(c, n, traced);
    size_t rows = c->varlen ? c->Hq * (size_t)c->cu_q[c->B] : c->B * c->Hq * c->T;
    size_t weights = c->B * c->Hq * c->T * c->S;
    for (size_t n = 2; n <= 3; n++) {
        bool same = same_bits(r[1].out, r[n].out, c->n[O]) && same_bits(r[1].lse, r[n].lse, rows) &&
                    same_bits(r[1].dq, r[n].dq, c->n[Q]) && same_bits(r[1].dk, r[n].dk, c->n[K]) &&
                    same_bits(r[1].dv, r[n].dv, c->n[V]) &&
                    same_bits(r[1].dsinks, r[n].dsinks, c->Hq);
        if (traced)
            same = same && same_bits(r[1].scores, r[n].scores, weights) &&
                   same_bits(r[1].weights, r[n].weights, weights) &&
                   same_bits(r[1].dropped, r[n].dropped, weights);
        if (!same && failures_reported++ < 40)
            fprintf(stderr, "case %d: %zu threads differ from 1\n", case_id, n);
        CHECK(same);
    }
    brute_in in = {to_double(c->t[Q], c->n[Q]), to_double(c->t[K], c->n[K]),
                   to_double(c->t[V], c->n[V]), to_double(c->sink_vals, c->Hq)};
    brute w;
    brute_run(c, &in, true, &w, NULL);
    compare(c, &r[1], &w, traced);
    brute_free(&w);
    free(in.q);
    free(in.k);
    free(in.v);
    free(in.sinks);
    for (size_t n = 1; n <= 3; n++) ref_free(&r[n]);
}

/* ---- cases --------------------------------------------------------------------------- */

static tcase small_case(void) {
    tcase c = {.B = 2, .Hq = 2, .Hkv = 2, .T = 4, .S = 5, .D = 3, .Dv = 3, .scale = 0.7,
               .layout = {0, 0, 0, 0}};
    return c;
}

/* Draws every feature at random. */
static tcase random_case(size_t max_len, size_t max_dim) {
    tcase c = {0};
    c.B = rnd_int(1, 3);
    c.Hkv = rnd_int(1, 3);
    c.Hq = c.Hkv * rnd_int(1, 3);
    c.T = rnd_int(1, max_len);
    c.S = rnd_int(1, max_len);
    c.D = rnd_int(1, max_dim);
    c.Dv = rnd_bool() ? c.D : rnd_int(1, max_dim);
    c.scale = rnd_uniform(0.2, 1.2);
    c.causal = rnd_int(0, 2) == 0;
    c.renormalize = c.causal && rnd_int(0, 3) == 0;
    c.diagonal = (attn_diagonal)rnd_int(0, 2);
    c.q_offset = (int64_t)rnd_int(0, 6) - 2;
    c.window = rnd_int(0, 2) == 0;
    c.left = (int64_t)rnd_int(0, 4) - 1;
    c.right = (int64_t)rnd_int(0, 4) - 1;
    c.softcap = rnd_int(0, 2) == 0 ? rnd_uniform(0.5, 4.0) : 0.0;
    c.alibi = rnd_int(0, 2) == 0;
    c.sinks = rnd_int(0, 2) == 0;
    c.varlen = rnd_int(0, 2) == 0;
    if (c.varlen) {
        c.B = rnd_int(1, MAX_BATCH);
        c.cu_q[0] = c.cu_kv[0] = 0;
        for (size_t b = 0; b < c.B; b++) {
            c.cu_q[b + 1] = c.cu_q[b] + (int32_t)rnd_int(0, max_len);
            c.cu_kv[b + 1] = c.cu_kv[b] + (int32_t)rnd_int(0, max_len);
        }
    }
    for (int x = 0; x < 4; x++) c.layout[x] = (int)rnd_int(0, 2);
    int drop = (int)rnd_int(0, 5);
    c.drop = drop <= 2 ? ATTN_DROP_NONE : drop <= 4 ? ATTN_DROP_PHILOX : ATTN_DROP_BITS;
    c.drop_p = c.drop == ATTN_DROP_NONE ? 0.0 : rnd_uniform(0.1, 0.6);
    return c;
}

static void test_random(int count, size_t max_len, size_t max_dim, bool traced) {
    for (int n = 0; n < count; n++) {
        tcase c = random_case(max_len, max_dim);
        tcase_build(&c);
        run_case(&c, traced);
        tcase_free(&c);
    }
}

/* One feature at a time, on the small case. */
static void test_each_feature(void) {
    for (int f = 0; f < 16; f++) {
        tcase c = small_case();
        switch (f) {
        case 1: c.causal = true; break;
        case 2: c.causal = true, c.T = 7, c.S = 3; break; /* rows that see no key */
        case 3: c.causal = true, c.diagonal = ATTN_DIAGONAL_TOP_LEFT; break;
        case 4: c.Hq = 6, c.Hkv = 2; break;  /* GQA */
        case 5: c.Hq = 3, c.Hkv = 1; break;  /* MQA */
        case 6: c.Dv = 5; break;
        case 7: c.window = true, c.left = 1, c.right = 0; break;
        case 8: c.window = true, c.left = -1, c.right = 1, c.causal = true; break;
        case 9: c.softcap = 0.8; break;
        case 10: c.alibi = true, c.causal = true; break;
        case 11: c.sinks = true, c.causal = true, c.T = 7, c.S = 3; break;
        case 12:
            c.varlen = true, c.B = 4;
            memcpy(c.cu_q, (int32_t[]){0, 3, 3, 8, 9}, sizeof(int32_t[5]));
            memcpy(c.cu_kv, (int32_t[]){0, 4, 6, 6, 12}, sizeof(int32_t[5]));
            c.causal = true;
            break;
        case 13: c.diagonal = ATTN_DIAGONAL_OFFSET, c.q_offset = 2, c.causal = true, c.T = 3, c.S = 7; break;
        case 14: c.drop = ATTN_DROP_PHILOX, c.drop_p = 0.4; break;
        case 15: c.drop = ATTN_DROP_BITS, c.drop_p = 0.3, c.causal = true; break;
        default: break;
        }
        tcase_build(&c);
        run_case(&c, true);
        tcase_free(&c);
    }
}

/* keep_threshold 0 drops every weight: zeros out, dv and dq, and lse as without dropout. */
static void test_drop_all(void) {
    tcase c = small_case();
    c.drop = ATTN_DROP_PHILOX, c.drop_p = 0.5, c.drop_all = true, c.causal = true;
    tcase_build(&c);
    run_case(&c, true);
    ref_result r = ref_run(&c, 1, false);
    bool zero = true;
    for (size_t b = 0; b < c.B; b++)
        for (size_t h = 0; h < c.Hq; h++)
            for (size_t i = 0; i < c.T; i++)
                for (size_t d = 0; d < c.Dv; d++) zero = zero && r.out[at(&c, O, b, h, i) + d] == 0.0f;
    CHECK(zero);
    ref_free(&r);
    tcase_free(&c);
}

/* Rows that see no key: out 0, lse -inf (the sink with sinks), dq 0, no NaN;
 * keys no row sees: dk, dv 0. */
static void test_empty_rows(void) {
    for (int sinks = 0; sinks < 2; sinks++) {
        tcase c = small_case();
        c.window = true, c.left = 0, c.right = 0; /* only key pos_i, gone for pos_i < 0 */
        c.diagonal = ATTN_DIAGONAL_OFFSET, c.q_offset = -2, c.sinks = sinks;
        c.T = 4, c.S = 3;
        tcase_build(&c);
        run_case(&c, false);
        ref_result r = ref_run(&c, 2, false);
        bool ok = true;
        for (size_t b = 0; b < c.B; b++)
            for (size_t h = 0; h < c.Hq; h++) {
                for (size_t i = 0; i < 2; i++) { /* pos -2, -1 */
                    for (size_t d = 0; d < c.Dv; d++) ok = ok && r.out[at(&c, O, b, h, i) + d] == 0.0f;
                    for (size_t d = 0; d < c.D; d++) ok = ok && r.dq[at(&c, Q, b, h, i) + d] == 0.0f;
                    float want = sinks ? c.sink_vals[h] : -INFINITY;
                    ok = ok && r.lse[lse_at(&c, b, h, i)] == want;
                }
                for (size_t i = 2; i < c.T; i++)
                    for (size_t d = 0; d < c.Dv; d++) ok = ok && isfinite(r.out[at(&c, O, b, h, i) + d]);
            }
        for (size_t b = 0; b < c.B; b++) /* key 2 is seen by no query (pos 0, 1) */
            for (size_t g = 0; g < c.Hkv; g++) {
                for (size_t d = 0; d < c.D; d++) ok = ok && r.dk[at(&c, K, b, g, 2) + d] == 0.0f;
                for (size_t d = 0; d < c.Dv; d++) ok = ok && r.dv[at(&c, V, b, g, 2) + d] == 0.0f;
            }
        CHECK(ok);
        ref_free(&r);
        tcase_free(&c);
    }
}

/* The renormalising mask equals -inf masking bit for bit on finite inputs. */
static void test_renormalize_equals_neg_inf(void) {
    for (int n = 0; n < 20; n++) {
        tcase c = random_case(6, 4);
        c.causal = true;
        c.renormalize = true;
        tcase_build(&c);
        ref_result renorm = ref_run(&c, 1, false);
        c.p.renormalize = false;
        ref_result neg_inf = ref_run(&c, 1, false);
        size_t rows = c.varlen ? c.Hq * (size_t)c.cu_q[c.B] : c.B * c.Hq * c.T;
        bool same = same_bits(renorm.out, neg_inf.out, c.n[O]) &&
                    same_bits(renorm.lse, neg_inf.lse, rows) &&
                    same_bits(renorm.dq, neg_inf.dq, c.n[Q]) &&
                    same_bits(renorm.dk, neg_inf.dk, c.n[K]) &&
                    same_bits(renorm.dv, neg_inf.dv, c.n[V]);
        CHECK(same);
        ref_free(&renorm);
        ref_free(&neg_inf);
        tcase_free(&c);
    }
}

/* Problems big enough for the passes to split over threads. */
static void test_threads_split(void) {
    for (int n = 0; n < 4; n++) {
        tcase c = random_case(40, 24);
        c.T = 40 + (size_t)n, c.S = 44, c.D = 24, c.Dv = n == 1 ? 16 : 24;
        c.Hkv = 2, c.Hq = 4;
        if (c.varlen) {
            c.B = 3;
            memcpy(c.cu_q, (int32_t[]){0, 40, 41, 80}, sizeof(int32_t[4]));
            memcpy(c.cu_kv, (int32_t[]){0, 44, 44, 90}, sizeof(int32_t[4]));
        } else {
            c.B = 2;
        }
        tcase_build(&c);
        run_case(&c, n == 0);
        tcase_free(&c);
    }
}

/* The brute-force backward (the oracle of the oracle) against central
 * differences of its own forward's loss sum(out * dout), in double. */
static void test_brute_backward_by_differences(void) {
    for (int n = 0; n < 25; n++) {
        tcase c = random_case(4, 3);
        if (n % 2 == 0) c.softcap = 1.1, c.sinks = true, c.alibi = true;
        tcase_build(&c);
        brute_in in = {to_double(c.t[Q], c.n[Q]), to_double(c.t[K], c.n[K]),
                       to_double(c.t[V], c.n[V]), to_double(c.sink_vals, c.Hq)};
        brute w;
        brute_run(&c, &in, true, &w, NULL);
        double *xs[4] = {in.q, in.k, in.v, in.sinks};
        double *gs[4] = {w.dq, w.dk, w.dv, w.dsinks};
        size_t ns[4] = {c.n[Q], c.n[K], c.n[V], c.sinks ? c.Hq : 0};
        double worst = 0.0;
        for (int x = 0; x < 4; x++)
            for (size_t e = 0; e < ns[x]; e++) {
                double keep = xs[x][e], step = 1e-5, lp, lm;
                brute tmp;
                xs[x][e] = keep + step;
                brute_run(&c, &in, false, &tmp, &lp);
                brute_free(&tmp);
                xs[x][e] = keep - step;
                brute_run(&c, &in, false, &tmp, &lm);
                brute_free(&tmp);
                xs[x][e] = keep;
                double fd = (lp - lm) / (2 * step), err = fabs(fd - gs[x][e]);
                if (err > worst) worst = err;
            }
        if (!(worst <= 1e-7)) fprintf(stderr, "brute backward case %d: off by %g\n", n, worst);
        CHECK(worst <= 1e-7);
        brute_free(&w);
        free(in.q);
        free(in.k);
        free(in.v);
        free(in.sinks);
        tcase_free(&c);
    }
}

/* backward_from_lse: the keys of a problem split in two blocks, each block's
 * backward given the whole rows' lse and out (ring attention, split KV), on
 * the reference and on the fused backend (a row that sees one key of a
 * block may see more of the whole row: its dS is not zero).
 * The blocks' dq sum to the whole problem's, their dk and dv rows are the
 * whole's, and each block's dsinks is the whole's. Positions stay the
 * whole problem's through ATTN_DIAGONAL_OFFSET. */
static void test_backward_from_lse(void) {
    for (int n = 0; n < 80; n++) {
        bool fused = n % 2 == 1;
        const attn_attention_backend *ref = fused ? &attn_attention_fused
                                                  : &attn_attention_reference;
        tcase c = random_case(7, 4);
        c.varlen = false, c.renormalize = false, c.drop = ATTN_DROP_NONE, c.drop_p = 0.0;
        c.B = rnd_int(1, 2);
        if (c.S < 2) c.S = 2 + rnd_int(0, 4);
        if (n < 4) c.causal = true, c.alibi = true, c.softcap = 1.3, c.sinks = n % 2 == 0;
        if (fused) c.Dv = c.D; /* the one shape it declines */
        tcase_build(&c);
        size_t threads = 1 + (size_t)(n % 3);
        ref_result whole = ref_run(&c, threads, false); /* leaves out and lse in c */
        int64_t diag = seq_diagonal(&c, 0);
        size_t split = rnd_int(1, c.S - 1);
        float *dq_sum = calloc(c.n[Q], sizeof(float)), *dsinks = nans(c.Hq);
        for (size_t e = 0; e < c.n[K]; e++) c.dk[e] = NAN;
        for (size_t e = 0; e < c.n[V]; e++) c.dv[e] = NAN;
        bool sinks_ok = true;
        for (int blk = 0; blk < 2; blk++) {
            size_t lo = blk ? split : 0, len = blk ? c.S - split : split;
            attn_attention_problem p = c.p;
            p.kv_len = len;
            p.k.data = c.t[K] + lo * c.st[K].t;
            p.v.data = c.t[V] + lo * c.st[V].t;
            p.diagonal = ATTN_DIAGONAL_OFFSET;
            p.q_offset = diag - (int64_t)lo;
            p.backward_from_lse = true;
            for (size_t e = 0; e < c.n[Q]; e++) c.dq[e] = NAN;
            attn_attention_grads g = {.dout = c.dout, .dq = c.dq, .dk = c.dk + lo * c.st[K].t,
                                      .dv = c.dv + lo * c.st[V].t,
                                      .dsinks = c.sinks ? dsinks : NULL};
            attn_ctx *ctx = fused ? fast_ctxs[threads] : ctxs[threads];
            void *work = calloc(1, ref->backward_bytes(ctx, &p));
            ref->backward(ctx, &p, &c.dr, &g, work);
            free(work);
            for (size_t b = 0; b < c.B; b++)
                for (size_t h = 0; h < c.Hq; h++)
                    for (size_t i = 0; i < c.T; i++)
                        for (size_t d = 0; d < c.D; d++) {
                            size_t e = at(&c, Q, b, h, i) + d;
                            dq_sum[e] += c.dq[e];
                        }
            if (c.sinks)
                for (size_t h = 0; h < c.Hq; h++)
                    sinks_ok = sinks_ok && fabsf(dsinks[h] - whole.dsinks[h]) <=
                                               1e-5f * fmaxf(1.0f, fabsf(whole.dsinks[h]));
        }
        case_id++;
        cmp dq = {0}, dk = {0}, dv = {0};
        for (size_t b = 0; b < c.B; b++) {
            for (size_t h = 0; h < c.Hq; h++)
                for (size_t i = 0; i < c.T; i++)
                    for (size_t d = 0; d < c.D; d++)
                        cmp_add(&dq, dq_sum[at(&c, Q, b, h, i) + d], whole.dq[at(&c, Q, b, h, i) + d]);
            for (size_t g = 0; g < c.Hkv; g++)
                for (size_t j = 0; j < c.S; j++) {
                    for (size_t d = 0; d < c.D; d++)
                        cmp_add(&dk, c.dk[at(&c, K, b, g, j) + d], whole.dk[at(&c, K, b, g, j) + d]);
                    for (size_t d = 0; d < c.Dv; d++)
                        cmp_add(&dv, c.dv[at(&c, V, b, g, j) + d], whole.dv[at(&c, V, b, g, j) + d]);
                }
        }
        cmp_check(&dq, fused ? "from_lse fused dq" : "from_lse dq", 1e-5, __LINE__);
        cmp_check(&dk, fused ? "from_lse fused dk" : "from_lse dk", 1e-5, __LINE__);
        cmp_check(&dv, fused ? "from_lse fused dv" : "from_lse dv", 1e-5, __LINE__);
        if (!sinks_ok && failures_reported++ < 40)
            fprintf(stderr, "case %d: a block's dsinks differs from the whole's\n", case_id);
        CHECK(sinks_ok);
        free(dq_sum);
        free(dsinks);
        ref_free(&whole);
        tcase_free(&c);
    }
}

int main(void) {
    for (size_t n = 1; n <= 3; n++)
        if (attn_ctx_new(&(attn_ctx_config){.num_threads = n, .kernels = ATTN_KERNELS_REFERENCE},
                         &ctxs[n]) != ATTN_OK ||
            attn_ctx_new(&(attn_ctx_config){.num_threads = n}, &fast_ctxs[n]) != ATTN_OK)
            return 1;
    CHECK(strcmp(attn_attention_reference.name, "reference") == 0);
    /* the oracle runs every float32 and float64 problem, every pass; 16-bit
     * views are the runner's to widen first */
    attn_attention_problem shapes[4] = {{.q.dtype = ATTN_DTYPE_F32}, {.q.dtype = ATTN_DTYPE_F64},
                                        {.q.dtype = ATTN_DTYPE_BF16},
                                        {.q.dtype = ATTN_DTYPE_F16}};
    for (int i = 0; i < 4; i++) {
        attn_pass pass = {.backward = i % 2, .traced = i < 2, .dropout = true};
        CHECK((attn_attention_reference.declines(ctxs[1], &shapes[i], pass) == NULL) == (i < 2));
    }
    test_brute_backward_by_differences();
    test_each_feature();
    test_drop_all();
    test_empty_rows();
    test_renormalize_equals_neg_inf();
    test_random(300, 6, 4, false);
    test_random(40, 5, 3, true);
    test_threads_split();
    test_backward_from_lse();
    for (size_t n = 1; n <= 3; n++) {
        attn_ctx_free(ctxs[n]);
        attn_ctx_free(fast_ctxs[n]);
    }
    return check_summary();
}
