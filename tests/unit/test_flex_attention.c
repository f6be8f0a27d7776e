/*
 * test_flex_attention.c — the flex backend (block maps and score modifiers,
 * fused) through attn_sdpa_forward / attn_sdpa_backward, against an oracle
 * in double written here from the definitions: scores q . k * scale, the
 * chain element by element, the mask from the map's own source (the dense
 * pattern the map was built from) ANDed with causal and window, softmax over
 * the visible keys and the sink, and the analytic backward (dS = P (dP -
 * delta), back through the chain). Out, lse, dq, dk, dv, dsinks and the bias,
 * T5 and relative table gradients agree within 1e-5 relative L2 (the tables
 * read by negative indices too); rows that see no key
 * give out 0 and lse -inf; a NaN input or a +inf score makes the rows that
 * see it NaN, and their gradients, as the reference's; 1 and 2 threads give
 * the same bits; the call's
 * explanation names flex; a callback's error fails the call, naming it.
 * Fresh random inputs each run: the seed is printed, ATTN_TEST_SEED repeats
 * it. `test_flex_attention --bench N` times a T = S = N forward under a 10%
 * block map against the dense one (also printed, at N = 4096, by every
 * optimised run; timings are printed, never asserted).
 */
#define _POSIX_C_SOURCE 200809L

#include "attn.h"
#include "check.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TOL 1e-5

/* ---- random numbers -------------------------------------------------------- */

static uint64_t rng_state;

static uint64_t next_u64(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double uniform(void) { return (double)(next_u64() >> 11) * 0x1.0p-53; }
static size_t below(size_t n) { return (size_t)(next_u64() % n); }
static float randn(void) {
    double u = uniform() + 1e-300, v = uniform();
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}
static float *alloc_randn(size_t n, float sd) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = randn() * sd;
    return x;
}

/* ---- a case ------------------------------------------------------------------ */

enum { PATTERN_NONE, PATTERN_BITS, PATTERN_BLOCKS, PATTERN_CAUSAL, PATTERN_ADDITIVE };

typedef struct bias_tensor {
    float *data, *grad;
    size_t n;
} bias_tensor;

typedef struct flex_case {
    size_t B, H, Hkv, T, S, D, Dv, bq, bkv;
    double scale;
    bool causal, window, bhtd;
    long long wl, wr;
    float *sinks;
    int pattern;
    size_t mb, mh;     /* the map's batch and heads */
    uint8_t *vis;      /* (mb, mh, T, S): the map's source, NULL: no map */
    float *additive;   /* PATTERN_ADDITIVE: the additive mask the map and a bias share */
    attn_block_mask *mask;
    attn_score_mod mods[6];
    size_t nmods;
    bias_tensor tensors[6];
    float *q, *k, *v, *dout;
} flex_case;

/* The callback modifier: s (1 + 0.05 ((q + 2 kv + h) mod 3)) + 0.1 sin s. */
static double callback_factor(size_t h, size_t i, size_t j) {
    return 1.0 + 0.05 * (double)((i + 2 * j + h) % 3);
}
static int callback_fn(void *user, const attn_score_tile *t) {
    (void)user;
    for (size_t r = 0; r < t->rows; r++)
        for (size_t c = 0; c < t->cols; c++) {
            float *s = &t->scores[r * t->ld + c];
            *s = *s * (float)callback_factor(t->h, t->q0 + r, t->kv0 + c) + 0.1f * sinf(*s);
        }
    return 0;
}
static int callback_grad(void *user, const attn_score_tile *t, float *grad) {
    (void)user;
    for (size_t r = 0; r < t->rows; r++)
        for (size_t c = 0; c < t->cols; c++) {
            float s = t->scores[r * t->ld + c];
            grad[r * t->ld + c] *=
                (float)callback_factor(t->h, t->q0 + r, t->kv0 + c) + 0.1f * cosf(s);
        }
    return 0;
}
/* A callback that fails on keys from 32 on. */
static int failing_fn(void *user, const attn_score_tile *t) {
    (void)user;
    return t->kv0 >= 32 ? 3 : 0;
}
static int failing_grad(void *user, const attn_score_tile *t, float *grad) {
    (void)user, (void)grad;
    return t->kv0 >= 32 ? 5 : 0;
}
/* One that fails on any tile that reaches key 32 (the reference's tiles
 * are whole rows). */
static int failing_reach_fn(void *user, const attn_score_tile *t) {
    (void)user;
    return t->kv0 + t->cols > 32 ? 6 : 0;
}
/* One that fails on queries from 64 on, after the rows before were done. */
static int failing_late_fn(void *user, const attn_score_tile *t) {
    (void)user;
    return t->q0 >= 64 ? 4 : 0;
}

/* T5's bucket as Hugging Face's _relative_position_bucket (float32 log). */
static size_t t5_bucket(long long rel, size_t buckets, size_t max_distance, bool bidirectional) {
    long long n = (long long)buckets, out = 0;
    if (bidirectional) {
        n /= 2;
        out += rel > 0 ? n : 0;
        rel = llabs(rel);
    } else {
        rel = rel < 0 ? -rel : 0;
    }
    long long max_exact = n / 2;
    if (rel < max_exact) return (size_t)(out + rel);
    float large = logf((float)rel / (float)max_exact) /
                  (float)log((double)max_distance / (double)max_exact) * (float)(n - max_exact);
    long long b = large >= (float)n ? n - 1 : max_exact + (long long)large;
    return (size_t)(out + (b > n - 1 ? n - 1 : b));
}

/* A relative table's element of a head's row for query i and key j, as
 * Python reads table[h, i - j + offset] (or j - i): a negative index from
 * the row's end. */
static size_t table_index(const attn_score_mod *m, size_t i, size_t j) {
    long long e = (m->signed_distance ? (long long)j - (long long)i : (long long)i - (long long)j) +
                  (long long)m->offset;
    return (size_t)(e < 0 ? e + (long long)m->buckets : e);
}

static size_t bias_index(const attn_score_mod *m, size_t b, size_t h, size_t i, size_t j) {
    return b * m->strides[0] + h * m->strides[1] + i * m->strides[2] + j * m->strides[3];
}

/* ---- the oracle, in double ----------------------------------------------------- */

typedef struct oracle {
    double *out, *lse, *dq, *dk, *dv, *dsinks;
    /* The same sums over |terms| (dS_ij = P_ij (dP_ij - delta_i) taken as
     * P_ij (|dP_ij| + |delta_i|)): the scale of a gradient that cancels */
    double *dq_size, *dk_size;
    double *dsinks_size; /* sum over rows of the sink's weight times sum_d |O_d dO_d| */
    double *grads[6]; /* per modifier with a tensor gradient */
    double *sizes[6]; /* the same sums of |dS|: the scale of a sum that cancels */
} oracle;

static size_t q_at(const flex_case *c, size_t b, size_t h, size_t i, size_t width) {
    return c->bhtd ? ((b * c->H + h) * c->T + i) * width : ((b * c->T + i) * c->H + h) * width;
}
static size_t kv_at(const flex_case *c, size_t b, size_t h, size_t j, size_t width) {
    return c->bhtd ? ((b * c->Hkv + h) * c->S + j) * width
                   : ((b * c->S + j) * c->Hkv + h) * width;
}

static bool visible(const flex_case *c, size_t b, size_t h, size_t i, size_t j) {
    long long pos = (long long)i + (long long)c->S - (long long)c->T, jj = (long long)j;
    if (c->causal && jj > pos) return false;
    if (c->window && c->wl >= 0 && jj < pos - c->wl) return false;
    if (c->window && c->wr >= 0 && jj > pos + c->wr) return false;
    if (!c->vis) return true;
    size_t mb = c->mb == 1 ? 0 : b, mh = c->mh == 1 ? 0 : h;
    return c->vis[((mb * c->mh + mh) * c->T + i) * c->S + j] != 0;
}

static void run_oracle(const flex_case *c, oracle *o) {
    size_t G = c->H / c->Hkv, nm = c->nmods;
    /* the scale as the float calls use it: rounded to float, 0 the default */
    double scale = (double)(float)(c->scale != 0.0 ? c->scale : 1.0 / sqrt((double)c->D));
    double *chain = malloc(c->S * (nm + 1) * sizeof(double)), *P = malloc(c->S * sizeof(double));
    bool *seen = malloc(c->S * sizeof(bool));
    for (size_t b = 0; b < c->B; b++)
        for (size_t h = 0; h < c->H; h++) {
            size_t kh = h / G;
            for (size_t i = 0; i < c->T; i++) {
                const float *q = c->q + q_at(c, b, h, i, c->D);
                double m = c->sinks ? (double)c->sinks[h] : -INFINITY;
                for (size_t j = 0; j < c->S; j++) {
                    seen[j] = visible(c, b, h, i, j);
                    const float *k = c->k + kv_at(c, b, kh, j, c->D);
                    double s = 0;
                    for (size_t d = 0; d < c->D; d++) s += (double)q[d] * k[d];
                    s *= scale;
                    for (size_t t = 0; t < nm; t++) {
                        const attn_score_mod *md = &c->mods[t];
                        chain[j * (nm + 1) + t] = s;
                        switch (md->kind) {
                        case ATTN_SCORE_SCALE: s *= (double)(float)md->value; break;
                        case ATTN_SCORE_SOFTCAP: s = md->value * tanh(s / md->value); break;
                        case ATTN_SCORE_ALIBI: {
                            double d = (double)j - (double)i - (double)md->offset;
                            s += md->signed_distance ? md->tensor[h] * d : -md->tensor[h] * fabs(d);
                            break;
                        }
                        case ATTN_SCORE_BIAS:
                            if (seen[j]) s += md->tensor[bias_index(md, b, h, i, j)];
                            break;
                        case ATTN_SCORE_REL_BIAS:
                            s += md->tensor[h * md->buckets +
                                            t5_bucket((long long)j - (long long)i, md->buckets,
                                                      md->max_distance, md->bidirectional)];
                            break;
                        case ATTN_SCORE_REL_TABLE:
                            s += md->tensor[h * md->buckets + table_index(md, i, j)];
                            break;
                        case ATTN_SCORE_CALLBACK:
                            s = s * callback_factor(h, i, j) + 0.1 * sin(s);
                            break;
                        }
                    }
                    chain[j * (nm + 1) + nm] = s;
                    if (seen[j] && s > m) m = s;
                }
                size_t row = (b * c->H + h) * c->T + i;
                double *out = o->out + q_at(c, b, h, i, c->Dv);
                if (m == -INFINITY) {
                    o->lse[row] = -INFINITY;
                    continue; /* out, grads stay 0 */
                }
                double l = c->sinks ? exp((double)c->sinks[h] - m) : 0.0;
                for (size_t j = 0; j < c->S; j++)
                    if (seen[j]) l += exp(chain[j * (nm + 1) + nm] - m);
                double lse = m + log(l);
                o->lse[row] = lse;
                const float *dO = c->dout + q_at(c, b, h, i, c->Dv);
                /* delta's size: the |terms| its float sums round at */
                double delta = 0, delta_abs = 0;
                for (size_t j = 0; j < c->S; j++) {
                    P[j] = seen[j] ? exp(chain[j * (nm + 1) + nm] - lse) : 0.0;
                    const float *v = c->v + kv_at(c, b, kh, j, c->Dv);
                    double dP = 0, dP_abs = 0;
                    for (size_t d = 0; d < c->Dv; d++) {
                        out[d] += P[j] * v[d];
                        dP += (double)dO[d] * v[d];
                        dP_abs += fabs((double)dO[d] * v[d]);
                    }
                    delta += P[j] * dP;
                    delta_abs += P[j] * dP_abs;
                }
                if (c->sinks) {
                    /* delta = dO . O cancels: the kernels' O rounds at |O_d dO_d| */
                    double terms = 0;
                    for (size_t d = 0; d < c->Dv; d++) terms += fabs(out[d] * dO[d]);
                    o->dsinks[h] -= exp((double)c->sinks[h] - lse) * delta;
                    o->dsinks_size[h] += exp((double)c->sinks[h] - lse) * terms;
                }
                for (size_t j = 0; j < c->S; j++) {
                    if (!seen[j]) continue;
                    const float *k = c->k + kv_at(c, b, kh, j, c->D);
                    const float *v = c->v + kv_at(c, b, kh, j, c->Dv);
                    /* dS_ij = P (dP - delta) cancels: float rounds it at the
                     * terms of dP and delta, not at their sums */
                    double dP = 0, dP_abs = 0;
                    for (size_t d = 0; d < c->Dv; d++) {
                        dP += (double)dO[d] * v[d];
                        dP_abs += fabs((double)dO[d] * v[d]);
                    }
                    double ds = P[j] * (dP - delta), ds_abs = P[j] * (dP_abs + delta_abs);
                    double *dv = o->dv + kv_at(c, b, kh, j, c->Dv);
                    for (size_t d = 0; d < c->Dv; d++) dv[d] += P[j] * dO[d];
                    for (size_t t = nm; t-- > 0;) {
                        const attn_score_mod *md = &c->mods[t];
                        double in = chain[j * (nm + 1) + t];
                        switch (md->kind) {
                        case ATTN_SCORE_SCALE:
                            ds *= (double)(float)md->value;
                            ds_abs *= fabs((double)(float)md->value);
                            break;
                        case ATTN_SCORE_SOFTCAP: {
                            double th = tanh(in / md->value);
                            ds *= 1.0 - th * th;
                            ds_abs *= 1.0 - th * th;
                            break;
                        }
                        case ATTN_SCORE_ALIBI: break;
                        case ATTN_SCORE_BIAS:
                            if (o->grads[t]) {
                                o->grads[t][bias_index(md, b, h, i, j)] += ds;
                                o->sizes[t][bias_index(md, b, h, i, j)] += ds_abs;
                            }
                            break;
                        case ATTN_SCORE_REL_BIAS:
                            if (o->grads[t]) {
                                size_t e = h * md->buckets +
                                           t5_bucket((long long)j - (long long)i, md->buckets,
                                                     md->max_distance, md->bidirectional);
                                o->grads[t][e] += ds;
                                o->sizes[t][e] += ds_abs;
                            }
                            break;
                        case ATTN_SCORE_REL_TABLE:
                            if (o->grads[t]) {
                                size_t e = h * md->buckets + table_index(md, i, j);
                                o->grads[t][e] += ds;
                                o->sizes[t][e] += ds_abs;
                            }
                            break;
                        case ATTN_SCORE_CALLBACK:
                            ds *= callback_factor(h, i, j) + 0.1 * cos(in);
                            ds_abs *= fabs(callback_factor(h, i, j) + 0.1 * cos(in));
                            break;
                        }
                    }
                    ds *= scale;
                    ds_abs *= scale;
                    size_t qa = q_at(c, b, h, i, c->D), ka = kv_at(c, b, kh, j, c->D);
                    for (size_t d = 0; d < c->D; d++) {
                        o->dq[qa + d] += ds * k[d];
                        o->dk[ka + d] += ds * q[d];
                        o->dq_size[qa + d] += ds_abs * fabs(k[d]);
                        o->dk_size[ka + d] += ds_abs * fabs(q[d]);
                    }
                }
            }
        }
    free(chain), free(P), free(seen);
}

/* ---- comparisons ------------------------------------------------------------- */

/* ||got - want|| / max(||want||, ||size|| / 10) over finite wants (0 / 0
 * passes); -inf wants must be got exactly. size (or NULL): the sums of
 * |terms| of a gradient summed over many scores, which may cancel (a row's
 * dS sums to 0, so a bias broadcast over keys, T5's bucket of every key a
 * row sees, or dk of a key that is a row's only one, has gradient 0):
 * float's error is then relative to the terms. */
static double rel_l2_sized(const float *got, const double *want, const double *size, size_t n,
                           bool *inf_ok) {
    double num = 0, den = 0, terms = 0;
    *inf_ok = true;
    for (size_t i = 0; i < n; i++) {
        if (isinf(want[i])) {
            if (got[i] != (float)want[i]) *inf_ok = false;
            continue;
        }
        double e = (double)got[i] - want[i];
        num += e * e;
        den += want[i] * want[i];
        if (size) terms += size[i] * size[i];
    }
    if (terms * 1e-2 > den) den = terms * 1e-2;
    if (den == 0) return num == 0 ? 0 : INFINITY;
    return sqrt(num / den);
}



#define CHECK_REL_SIZED(name, got, want, size, n, what)                                     \
    do {                                                                                     \
        bool inf_ok_;                                                                        \
        double e_ = rel_l2_sized((got), (want), (size), (n), &inf_ok_);                     \
        if (e_ <= TOL && inf_ok_) {                                                          \
            check_passed++;                                                                  \
        } else {                                                                             \
            check_failed++;                                                                  \
            fprintf(stderr, "%s: %s relative L2 error %.3g (tol %g)%s\n", (what), (name), e_, \
                    TOL, inf_ok_ ? "" : ", -inf rows differ");                              \
        }                                                                                    \
    } while (0)

#define CHECK_REL(name, got, want, n, what) CHECK_REL_SIZED(name, got, want, NULL, n, what)

/* ---- building a case ----------------------------------------------------------- */

static size_t pick(const size_t *options, size_t n) { return options[below(n)]; }

static int fn_from_vis(void *user, size_t b, size_t h, size_t i, size_t j) {
    const flex_case *c = user;
    return c->vis[((b * c->mh + h) * c->T + i) * c->S + j] != 0;
}

static void make_pattern(flex_case *c) {
    size_t n = c->mb * c->mh * c->T * c->S;
    c->vis = calloc(n, 1);
    size_t qbs = (c->T + c->bq - 1) / c->bq, kbs = (c->S + c->bkv - 1) / c->bkv;
    for (size_t bh = 0; bh < c->mb * c->mh; bh++) {
        uint8_t *v = c->vis + bh * c->T * c->S;
        if (c->pattern == PATTERN_BLOCKS) {
            for (size_t qb = 0; qb < qbs; qb++)
                for (size_t kb = 0; kb < kbs; kb++) {
                    int kind = (int)below(3); /* skipped, full, partial */
                    for (size_t i = qb * c->bq; i < (qb + 1) * c->bq && i < c->T; i++)
                        for (size_t j = kb * c->bkv; j < (kb + 1) * c->bkv && j < c->S; j++)
                            v[i * c->S + j] = kind == 1 || (kind == 2 && uniform() < 0.5);
                }
        } else if (c->pattern == PATTERN_CAUSAL) {
            long long off = (long long)below(c->S) - (long long)c->T / 2;
            for (size_t i = 0; i < c->T; i++)
                for (size_t j = 0; j < c->S; j++) v[i * c->S + j] = (long long)j <= (long long)i + off;
        } else {
            double p = 0.2 + 0.7 * uniform();
            for (size_t e = 0; e < c->T * c->S; e++) v[e] = uniform() < p;
        }
        /* rows that see no key */
        for (size_t i = 0; i < c->T; i++)
            if (uniform() < 0.08) memset(v + i * c->S, 0, c->S);
    }
}

/* A (heads, m->buckets) table of random values and, half the time, its
 * gradient, for m (without one, a lone table runs on the fused kernels). */
static void head_table(const flex_case *c, bias_tensor *t, attn_score_mod *m) {
    t->n = c->H * m->buckets;
    t->data = alloc_randn(t->n, 1.0f);
    t->grad = malloc(t->n * sizeof(float));
    m->tensor = t->data;
    m->tensor_grad = below(2) ? t->grad : NULL;
}

/* A random modifier, of kind `kind` where it is not 0. */
static attn_score_mod make_mod(flex_case *c, size_t slot, int kind) {
    attn_score_mod m = {0};
    bias_tensor *t = &c->tensors[slot];
    if (!kind) kind = 1 + (int)below(7);
    m.kind = (attn_score_mod_kind)kind;
    switch (m.kind) {
    case ATTN_SCORE_SCALE: m.value = 0.5 + uniform(); break;
    case ATTN_SCORE_SOFTCAP: m.value = 1.0 + 4.0 * uniform(); break;
    case ATTN_SCORE_ALIBI:
        t->n = c->H;
        t->data = alloc_randn(c->H, 0.05f);
        for (size_t h = 0; h < c->H; h++) t->data[h] = fabsf(t->data[h]);
        m.tensor = t->data;
        m.signed_distance = below(2);
        m.offset = (long long)below(9) - 4;
        break;
    case ATTN_SCORE_BIAS: {
        bool bb = below(2), bh = below(2), bi = below(4) == 0;
        size_t ni = bi ? 1 : c->T, ld = c->S + below(3);
        m.strides[3] = 1;
        m.strides[2] = bi ? 0 : ld;
        m.strides[1] = bh ? 0 : ni * ld;
        m.strides[0] = bb ? 0 : (bh ? 1 : c->H) * ni * ld;
        t->n = (bb ? 1 : c->B) * (bh ? 1 : c->H) * ni * ld;
        t->data = alloc_randn(t->n, 1.0f);
        t->grad = malloc(t->n * sizeof(float));
        for (size_t e = 0; e < t->n; e++) t->grad[e] = NAN; /* the backward writes them all */
        m.tensor = t->data;
        m.tensor_grad = t->grad;
        break;
    }
    case ATTN_SCORE_REL_BIAS:
        m.bidirectional = below(2);
        m.buckets = m.bidirectional ? 8 + 2 * below(12) : 4 + below(20);
        m.max_distance = 16 + below(120);
        head_table(c, t, &m);
        break;
    case ATTN_SCORE_REL_TABLE: {
        /* the elements i - j + offset (or j - i + offset) reach over the
         * case, negative ones from the row's end: rows just long enough,
         * or a little longer */
        m.signed_distance = below(2);
        long long T = (long long)c->T, S = (long long)c->S;
        m.offset = (long long)below((size_t)(T + S)) - (m.signed_distance ? S : T);
        long long lo = (m.signed_distance ? -(T - 1) : -(S - 1)) + m.offset;
        long long hi = (m.signed_distance ? S - 1 : T - 1) + m.offset;
        long long need = -lo > hi + 1 ? -lo : hi + 1;
        m.buckets = (size_t)need + below(3);
        head_table(c, t, &m);
        break;
    }
    case ATTN_SCORE_CALLBACK:
        m.fn = callback_fn;
        m.grad_fn = callback_grad;
        break;
    }
    return m;
}

/* A random case; relative: one T5 or relative table modifier without its
 * gradient, no map or a causal one, v_head_dim = head_dim (what the fused
 * kernels run). */
static void make_case(flex_case *c, size_t index, bool relative) {
    static const size_t heads[][2] = {{1, 1}, {2, 1}, {3, 3}, {4, 2}, {6, 2}};
    static const size_t lens[] = {1, 7, 16, 33, 64, 65, 100, 130, 200};
    static const size_t dims[] = {8, 16, 24, 32, 40, 64};
    static const size_t blocks[] = {16, 32, 64, 128};
    memset(c, 0, sizeof *c);
    const size_t *hh = heads[below(5)];
    c->B = 1 + below(2);
    c->H = hh[0], c->Hkv = hh[1];
    c->T = pick(lens, 9), c->S = pick(lens, 9);
    c->D = pick(dims, 6);
    c->Dv = below(3) == 0 && !relative ? pick(dims, 6) : c->D;
    c->bq = pick(blocks, 4), c->bkv = pick(blocks, 4);
    c->scale = below(2) ? 0.0 : 0.05 + 0.3 * uniform();
    c->causal = below(4) == 0;
    c->window = below(5) == 0;
    c->wl = (long long)below(40) - 1, c->wr = (long long)below(40) - 1;
    c->bhtd = below(2);
    if (below(3) == 0) c->sinks = alloc_randn(c->H, 1.0f);
    /* every pattern in turn, then at random; none only with modifiers */
    c->pattern = index < 5 ? (int)index : (int)below(5);
    c->mb = below(2) ? 1 : c->B;
    c->mh = below(2) ? 1 : c->H;
    c->nmods = below(4);
    if (c->pattern == PATTERN_NONE && c->nmods == 0) c->nmods = 1;
    if (relative) c->pattern = below(2) ? PATTERN_NONE : PATTERN_CAUSAL, c->nmods = 1;
    for (size_t t = 0; t < c->nmods; t++)
        c->mods[t] = make_mod(c, t, relative ? (below(2) ? ATTN_SCORE_REL_BIAS : ATTN_SCORE_REL_TABLE) : 0);
    if (relative) c->mods[0].tensor_grad = NULL;
    if (c->pattern != PATTERN_NONE) make_pattern(c);
    size_t qn = c->B * c->T * c->H, kn = c->B * c->S * c->Hkv;
    c->q = alloc_randn(qn * c->D, 1.0f);
    c->k = alloc_randn(kn * c->D, 1.0f);
    c->v = alloc_randn(kn * c->Dv, 1.0f);
    c->dout = alloc_randn(qn * c->Dv, 1.0f);
}

static attn_status build_mask(attn_ctx *ctx, flex_case *c) {
    if (c->pattern == PATTERN_NONE) return ATTN_OK;
    attn_block_mask_config mc = {c->mb, c->mh, c->T, c->S, c->bq, c->bkv};
    size_t strides[4] = {c->mh * c->T * c->S, c->T * c->S, c->S, 1};
    if (c->pattern == PATTERN_BITS)
        return attn_block_mask_from_bool(ctx, &mc, c->vis, strides, &c->mask);
    if (c->pattern == PATTERN_ADDITIVE) {
        /* -inf hides; the finite values are a bias over the same tensor */
        size_t n = c->mb * c->mh * c->T * c->S;
        c->additive = malloc(n * sizeof(float));
        for (size_t e = 0; e < n; e++) c->additive[e] = c->vis[e] ? randn() : -INFINITY;
        attn_status st = attn_block_mask_from_additive(ctx, &mc, c->additive, strides, &c->mask);
        if (st != ATTN_OK || c->nmods >= 6) return st;
        attn_score_mod m = {.kind = ATTN_SCORE_BIAS, .tensor = c->additive};
        m.strides[0] = c->mb == 1 ? 0 : strides[0];
        m.strides[1] = c->mh == 1 ? 0 : strides[1];
        m.strides[2] = strides[2], m.strides[3] = 1;
        size_t at = below(c->nmods + 1);
        memmove(&c->mods[at + 1], &c->mods[at], (c->nmods - at) * sizeof(attn_score_mod));
        memmove(&c->tensors[at + 1], &c->tensors[at], (c->nmods - at) * sizeof(bias_tensor));
        c->mods[at] = m;
        c->tensors[at] = (bias_tensor){0};
        c->nmods++;
        return ATTN_OK;
    }
    return attn_block_mask_from_fn(ctx, &mc, fn_from_vis, c, &c->mask);
}

static void free_case(flex_case *c) {
    attn_block_mask_free(c->mask);
    for (size_t t = 0; t < 6; t++) free(c->tensors[t].data), free(c->tensors[t].grad);
    free(c->vis), free(c->additive), free(c->sinks);
    free(c->q), free(c->k), free(c->v), free(c->dout);
}

static attn_sdpa_config config_of(const flex_case *c) {
    attn_sdpa_config cfg = {.batch = c->B, .heads = c->H, .kv_heads = c->Hkv, .q_tokens = c->T,
                            .kv_tokens = c->S, .head_dim = c->D, .v_head_dim = c->Dv,
                            .scale = c->scale, .causal = c->causal, .window = c->window,
                            .window_left = c->wl, .window_right = c->wr, .sinks = c->sinks,
                            .block_mask = c->mask, .score_mods = c->mods,
                            .score_mod_count = c->nmods};
    if (c->bhtd) {
        size_t q[3] = {c->H * c->T * c->D, c->D, c->T * c->D};
        size_t k[3] = {c->Hkv * c->S * c->D, c->D, c->S * c->D};
        size_t v[3] = {c->Hkv * c->S * c->Dv, c->Dv, c->S * c->Dv};
        size_t o[3] = {c->H * c->T * c->Dv, c->Dv, c->T * c->Dv};
        memcpy(cfg.q_strides, q, sizeof q), memcpy(cfg.kv_strides, k, sizeof k);
        memcpy(cfg.v_strides, v, sizeof v), memcpy(cfg.out_strides, o, sizeof o);
    }
    return cfg;
}

/* The float results of one run. */
typedef struct results {
    float *out, *lse, *dq, *dk, *dv, *dsinks, *grads[6];
} results;

static void results_alloc(const flex_case *c, results *r) {
    size_t qn = c->B * c->T * c->H, kn = c->B * c->S * c->Hkv;
    r->out = calloc(qn * c->Dv, sizeof(float));
    r->lse = calloc(qn, sizeof(float));
    r->dq = calloc(qn * c->D, sizeof(float));
    r->dk = calloc(kn * c->D, sizeof(float));
    r->dv = calloc(kn * c->Dv, sizeof(float));
    r->dsinks = calloc(c->H, sizeof(float));
    for (size_t t = 0; t < 6; t++) r->grads[t] = calloc(c->tensors[t].n + 1, sizeof(float));
}
static void results_free(results *r) {
    free(r->out), free(r->lse), free(r->dq), free(r->dk), free(r->dv), free(r->dsinks);
    for (size_t t = 0; t < 6; t++) free(r->grads[t]);
}

static bool run_case(attn_ctx *ctx, flex_case *c, results *r, const char *what) {
    attn_sdpa_config cfg = config_of(c);
    cfg.sinks_grad = c->sinks ? r->dsinks : NULL;
    attn_status st = attn_sdpa_forward(ctx, &cfg, c->q, c->k, c->v, r->out, r->lse, NULL, NULL);
    if (st != ATTN_OK) {
        fprintf(stderr, "%s: forward: %s\n", what, attn_ctx_last_error(ctx));
        return false;
    }
    /* a map of row intervals is the fused kernels' to run, without modifiers
     * or with a chain the fixed features say (test_fixed_features); so is
     * a lone relative table whose gradient is not asked, and there they
     * must run it */
    attn_block_mask_info info = {0};
    if (c->mask) attn_block_mask_get_info(c->mask, &info);
    bool fixed_chain = c->nmods <= 2;
    for (size_t t = 0; t < c->nmods; t++)
        fixed_chain &= c->mods[t].kind == ATTN_SCORE_SOFTCAP || c->mods[t].kind == ATTN_SCORE_ALIBI;
    bool lone_table = c->nmods == 1 && !c->mods[0].tensor_grad &&
                      (c->mods[0].kind == ATTN_SCORE_REL_BIAS ||
                       c->mods[0].kind == ATTN_SCORE_REL_TABLE);
    const char *explain = attn_ctx_last_explain(ctx);
    bool fused_may = (info.row_intervals && !c->nmods) ||
                     ((fixed_chain || lone_table) && (!c->mask || info.row_intervals));
    bool fused_must = lone_table && c->Dv == c->D && (!c->mask || info.row_intervals) &&
                      attn_ctx_kernels(ctx) != ATTN_KERNELS_REFERENCE;
    bool ran_expected = (strstr(explain, "flex [") && !fused_must) ||
                        (fused_may && strstr(explain, "fused ["));
    CHECK(ran_expected && strstr(explain, "ran") != NULL);
    if (!ran_expected || getenv("FLEX_VERBOSE")) {
        fprintf(stderr, "%s: explain: %s\n", what, attn_ctx_last_explain(ctx));
        for (size_t t = 0; t < c->nmods; t++)
            fprintf(stderr, "  mod %zu: kind %d value %g buckets %zu max_distance %zu bidirectional %d strides %zu %zu %zu %zu\n", t,
                    (int)c->mods[t].kind, c->mods[t].value, c->mods[t].buckets,
                    c->mods[t].max_distance, c->mods[t].bidirectional, c->mods[t].strides[0],
                    c->mods[t].strides[1], c->mods[t].strides[2], c->mods[t].strides[3]);
    }
    st = attn_sdpa_backward(ctx, &cfg, c->q, c->k, c->v, r->out, r->lse, c->dout, r->dq, r->dk,
                            r->dv, NULL);
    if (st != ATTN_OK) {
        fprintf(stderr, "%s: backward: %s\n", what, attn_ctx_last_error(ctx));
        return false;
    }
    for (size_t t = 0; t < c->nmods; t++)
        if (c->mods[t].tensor_grad) memcpy(r->grads[t], c->mods[t].tensor_grad, c->tensors[t].n * sizeof(float));
    return true;
}

static void test_case(attn_ctx *one, attn_ctx *two, size_t index, bool relative) {
    flex_case c;
    make_case(&c, index, relative);
    char what[256];
    snprintf(what, sizeof what,
             "case %zu (B %zu H %zu/%zu T %zu S %zu D %zu/%zu blocks %zux%zu pattern %d map "
             "%zux%zu causal %d window %d (%lld, %lld) sinks %d mods %zu%s)",
             index, c.B, c.H, c.Hkv, c.T, c.S, c.D, c.Dv, c.bq, c.bkv, c.pattern, c.mb, c.mh,
             c.causal, c.window, c.wl, c.wr, c.sinks != NULL, c.nmods, c.bhtd ? " bhtd" : "");
    CHECK_STATUS(build_mask(one, &c), ATTN_OK);
    results r1, r2;
    results_alloc(&c, &r1);
    results_alloc(&c, &r2);
    bool ok = run_case(one, &c, &r1, what);
    CHECK(ok);
    if (ok) {
        size_t qn = c.B * c.T * c.H, kn = c.B * c.S * c.Hkv;
        oracle o = {calloc(qn * c.Dv, sizeof(double)), calloc(qn, sizeof(double)),
                    calloc(qn * c.D, sizeof(double)), calloc(kn * c.D, sizeof(double)),
                    calloc(kn * c.Dv, sizeof(double)), calloc(c.H, sizeof(double)),
                    calloc(qn * c.D, sizeof(double)), calloc(kn * c.D, sizeof(double)),
                    calloc(c.H, sizeof(double)), {0}, {0}};
        for (size_t t = 0; t < c.nmods; t++)
            if (c.mods[t].tensor_grad) {
                o.grads[t] = calloc(c.tensors[t].n, sizeof(double));
                o.sizes[t] = calloc(c.tensors[t].n, sizeof(double));
            }
        run_oracle(&c, &o);
        CHECK_REL("out", r1.out, o.out, qn * c.Dv, what);
        /* lse is a logit: its float error is relative to the scores' size
         * (unit-variance q and k, scale 1 / sqrt(D): about 1), not to a
         * value that cancels toward 0 (a row of one key with q . k near 0) */
        double *logit_size = malloc(qn * sizeof *logit_size);
        for (size_t i = 0; i < qn; i++) logit_size[i] = 1.0;
        CHECK_REL_SIZED("lse", r1.lse, o.lse, logit_size, qn, what);
        free(logit_size);
        CHECK_REL_SIZED("dq", r1.dq, o.dq, o.dq_size, qn * c.D, what);
        CHECK_REL_SIZED("dk", r1.dk, o.dk, o.dk_size, kn * c.D, what);
        CHECK_REL("dv", r1.dv, o.dv, kn * c.Dv, what);
        if (c.sinks) CHECK_REL_SIZED("dsinks", r1.dsinks, o.dsinks, o.dsinks_size, c.H, what);
        for (size_t t = 0; t < c.nmods; t++) {
            if (!o.grads[t]) continue;
            /* elements the strides never reach stay as they were: compare the reached ones */
            const attn_score_mod *m = &c.mods[t];
            if (m->kind == ATTN_SCORE_BIAS)
                for (size_t e = 0; e < c.tensors[t].n; e++)
                    if (isnan(r1.grads[t][e])) r1.grads[t][e] = 0.0f;
            CHECK_REL_SIZED(m->kind == ATTN_SCORE_BIAS       ? "bias grad"
                            : m->kind == ATTN_SCORE_REL_BIAS ? "T5 table grad"
                                                             : "relative table grad",
                            r1.grads[t], o.grads[t], o.sizes[t], c.tensors[t].n, what);
        }
        /* empty rows: out exactly 0 */
        for (size_t b = 0; b < c.B; b++)
            for (size_t h = 0; h < c.H; h++)
                for (size_t i = 0; i < c.T; i++) {
                    size_t row = (b * c.H + h) * c.T + i;
                    if (o.lse[row] != -INFINITY) continue;
                    const float *out = r1.out + q_at(&c, b, h, i, c.Dv);
                    bool zero = true;
                    for (size_t d = 0; d < c.Dv; d++) zero &= out[d] == 0.0f;
                    CHECK(zero && r1.lse[row] == -INFINITY);
                }
        free(o.out), free(o.lse), free(o.dq), free(o.dk), free(o.dv), free(o.dsinks);
        free(o.dsinks_size), free(o.dq_size), free(o.dk_size);
        for (size_t t = 0; t < 6; t++) free(o.grads[t]), free(o.sizes[t]);
        /* two threads: the same bits */
        if (run_case(two, &c, &r2, what)) {
            bool same = !memcmp(r1.out, r2.out, qn * c.Dv * sizeof(float)) &&
                        !memcmp(r1.lse, r2.lse, qn * sizeof(float)) &&
                        !memcmp(r1.dq, r2.dq, qn * c.D * sizeof(float)) &&
                        !memcmp(r1.dk, r2.dk, kn * c.D * sizeof(float)) &&
                        !memcmp(r1.dv, r2.dv, kn * c.Dv * sizeof(float)) &&
                        !memcmp(r1.dsinks, r2.dsinks, c.H * sizeof(float));
            for (size_t t = 0; t < c.nmods; t++)
                if (c.mods[t].tensor_grad) {
                    for (size_t e = 0; e < c.tensors[t].n; e++)
                        if (isnan(r2.grads[t][e])) r2.grads[t][e] = 0.0f;
                    same &= !memcmp(r1.grads[t], r2.grads[t], c.tensors[t].n * sizeof(float));
                }
            if (!same) fprintf(stderr, "%s: 1 and 2 threads differ\n", what);
            CHECK(same);
        } else {
            CHECK(false);
        }
    }
    results_free(&r1);
    results_free(&r2);
    free_case(&c);
}

/* Whether each of the n floats of x is the sentinel: a refused call wrote
 * nothing there. */
static bool untouched(const float *x, size_t n, float sentinel) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&x[i], &sentinel, sizeof sentinel) != 0) return false;
    return true;
}

static float *filled(size_t n, float value) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = value;
    return x;
}

/* A callback's error fails the call, forward and backward, naming it, and
 * leaves every output as it was: the tiles before the failing one were
 * written, and the call puts them back (and, with dropout, the generator). */
static void test_callback_error(attn_ctx *one, attn_ctx *two) {
    attn_ctx *ctx = two;
    size_t B = 1, H = 2, T = 40, S = 100, D = 16;
    const float mark = -1234.5f;
    float *q = alloc_randn(B * T * H * D, 1), *k = alloc_randn(B * S * H * D, 1);
    float *v = alloc_randn(B * S * H * D, 1), *out = filled(B * T * H * D, mark);
    float *lse = filled(B * H * T, mark), *dq = filled(B * T * H * D, mark);
    float *dk = filled(B * S * H * D, mark), *dv = filled(B * S * H * D, mark);
    float *bias = alloc_randn(H * T * S, 0.5f), *bias_grad = filled(H * T * S, mark);
    attn_score_mod mods[3] = {{.kind = ATTN_SCORE_SCALE, .value = 2.0},
                              {.kind = ATTN_SCORE_CALLBACK, .fn = failing_fn},
                              {.kind = ATTN_SCORE_BIAS, .tensor = bias, .tensor_grad = bias_grad,
                               .strides = {0, T * S, S, 1}}};
    attn_sdpa_config cfg = {.batch = B, .heads = H, .q_tokens = T, .kv_tokens = S,
                            .head_dim = D, .score_mods = mods, .score_mod_count = 3};
    for (int threads = 1; threads <= 2; threads++) {
        ctx = threads == 1 ? one : two;
        CHECK_STATUS(attn_sdpa_forward(ctx, &cfg, q, k, v, out, lse, NULL, NULL),
                     ATTN_ERR_INVALID);
        CHECK_MESSAGE(ctx, "attn_sdpa_forward");
        CHECK_MESSAGE(ctx, "score_mods[1] (callback)");
        CHECK_MESSAGE(ctx, "returned 3");
        CHECK_MESSAGE(ctx, "keys 64..99");
        CHECK(untouched(out, B * T * H * D, mark) && untouched(lse, B * H * T, mark));
        /* query blocks before the failing one are done first */
        attn_sdpa_config late = cfg;
        late.q_tokens = S;
        late.score_mod_count = 2; /* the bias is (H, T, S) */
        mods[1].fn = failing_late_fn;
        float *out_late = filled(B * S * H * D, mark), *lse_late = filled(B * H * S, mark);
        CHECK_STATUS(attn_sdpa_forward(ctx, &late, k, k, v, out_late, lse_late, NULL, NULL),
                     ATTN_ERR_INVALID);
        CHECK_MESSAGE(ctx, "returned 4");
        CHECK_MESSAGE(ctx, "queries 64..99");
        CHECK(untouched(out_late, B * S * H * D, mark) && untouched(lse_late, B * H * S, mark));
        free(out_late), free(lse_late);
        mods[1].fn = failing_fn;
    }
    /* the reference runs dropout (the flex kernels decline it): the
     * generator stays where it was, as the outputs do, so that the next
     * call draws what it would have drawn */
    attn_rng *rng = NULL, *same = NULL;
    CHECK_STATUS(attn_rng_new(ctx, 7, &rng), ATTN_OK);
    CHECK_STATUS(attn_rng_new(ctx, 7, &same), ATTN_OK);
    CHECK_STATUS(attn_rng_set_bernoulli_method(rng, ATTN_BERNOULLI_PHILOX), ATTN_OK);
    CHECK_STATUS(attn_rng_set_bernoulli_method(same, ATTN_BERNOULLI_PHILOX), ATTN_OK);
    attn_sdpa_dropout drawn = {11, 12}, drawn_same;
    cfg.dropout = 0.25;
    mods[1].fn = failing_reach_fn;
    CHECK_STATUS(attn_sdpa_forward(ctx, &cfg, q, k, v, out, lse, rng, &drawn), ATTN_ERR_INVALID);
    CHECK(drawn.seed == 11 && drawn.offset == 12); /* no record of a refused call */
    /* the reference's tiles are rows: the same words as the flex kernels' */
    CHECK_MESSAGE(ctx, "score_mods[1] (callback) fn returned 6 on the tile of batch 0, head 0, "
                       "queries 0..0, keys 0..99");
    CHECK(untouched(out, B * T * H * D, mark) && untouched(lse, B * H * T, mark));
    mods[1].fn = callback_fn;
    CHECK_STATUS(attn_sdpa_forward(ctx, &cfg, q, k, v, out, lse, rng, &drawn), ATTN_OK);
    CHECK_STATUS(attn_sdpa_forward(ctx, &cfg, q, k, v, out, lse, same, &drawn_same), ATTN_OK);
    CHECK(drawn.seed == drawn_same.seed && drawn.offset == drawn_same.offset);
    attn_rng_free(rng), attn_rng_free(same);
    cfg.dropout = 0.0;
    for (size_t i = 0; i < B * T * H * D; i++) out[i] = mark;
    mods[1] = (attn_score_mod){.kind = ATTN_SCORE_CALLBACK, .fn = callback_fn,
                               .grad_fn = failing_grad};
    CHECK_STATUS(attn_sdpa_forward(ctx, &cfg, q, k, v, out, lse, NULL, NULL), ATTN_OK);
    for (int threads = 1; threads <= 2; threads++) {
        ctx = threads == 1 ? one : two;
        CHECK_STATUS(attn_sdpa_backward(ctx, &cfg, q, k, v, out, lse, out, dq, dk, dv, NULL),
                     ATTN_ERR_INVALID);
        CHECK_MESSAGE(ctx, "attn_sdpa_backward");
        CHECK_MESSAGE(ctx, "score_mods[1] (callback) grad_fn returned 5");
        CHECK_MESSAGE(ctx, "keys 64..99");
        CHECK(untouched(dq, B * T * H * D, mark) && untouched(dk, B * S * H * D, mark) &&
              untouched(dv, B * S * H * D, mark) && untouched(bias_grad, H * T * S, mark));
    }
    free(q), free(k), free(v), free(out), free(lse), free(dq), free(dk), free(dv);
    free(bias), free(bias_grad);
}

/* A chain's tensors are checked as the config's own are: memory shared
 * between an output and a modifier's tensor, or between a gradient and an
 * input, is refused before anything is written; so are ALiBi slopes that
 * are not finite and a softcap that float32 rounds to 0 (the fused
 * kernels would run without it, the float64 call with it). */
static void test_chain_bad_input(attn_ctx *ctx) {
    enum { B = 1, H = 2, T = 24, S = 24, D = 16, TS = T * S };
    size_t nq = B * T * H * D;
    float *q = alloc_randn(nq, 1), *k = alloc_randn(nq, 1), *v = alloc_randn(nq, 1);
    float *out = calloc(nq, 4), *lse = calloc(B * H * T, 4), *dq = calloc(nq, 4);
    float *dk = calloc(nq, 4), *dv = calloc(nq, 4), *bias = alloc_randn(H * TS, 1);
    float *grad = calloc(H * TS, 4), *big = alloc_randn(H * TS + nq, 1);
    attn_score_mod mod = {.kind = ATTN_SCORE_BIAS, .tensor = bias, .tensor_grad = grad,
                          .strides = {0, TS, S, 1}};
    attn_sdpa_config cfg = {.batch = B, .heads = H, .q_tokens = T, .kv_tokens = S,
                            .head_dim = D, .causal = true, .score_mods = &mod,
                            .score_mod_count = 1};
    CHECK_STATUS(attn_sdpa_forward(ctx, &cfg, q, k, v, out, lse, NULL, NULL), ATTN_OK);
    memcpy(big, bias, H * TS * sizeof(float));
    float kept = big[H * TS];
    /* the gradient over its own bias, over dq, over q */
    mod.tensor = big, mod.tensor_grad = big;
    CHECK_STATUS(attn_sdpa_backward(ctx, &cfg, q, k, v, out, lse, out, dq, dk, dv, NULL),
                 ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "score_mods[0].tensor_grad [");
    CHECK_MESSAGE(ctx, "overlaps score_mods[0].tensor [");
    CHECK(!memcmp(big, bias, H * TS * sizeof(float)) && big[H * TS] == kept);
    mod.tensor = bias, mod.tensor_grad = big;
    CHECK_STATUS(attn_sdpa_backward(ctx, &cfg, q, k, v, out, lse, out, big + 16, dk, dv, NULL),
                 ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "overlaps dq [");
    mod.tensor_grad = q;
    CHECK_STATUS(attn_sdpa_backward(ctx, &cfg, q, k, v, out, lse, out, dq, dk, dv, NULL),
                 ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "score_mods[0].tensor_grad [");
    CHECK_MESSAGE(ctx, "overlaps q [");
    /* the forward's output over the bias */
    mod.tensor = big, mod.tensor_grad = NULL;
    CHECK_STATUS(attn_sdpa_forward(ctx, &cfg, q, k, v, big + 8, lse, NULL, NULL),
                 ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "overlaps score_mods[0].tensor [");
    CHECK(big[8] == bias[8]);
    /* a relative table's gradient over its table */
    attn_score_mod rel = {.kind = ATTN_SCORE_REL_TABLE, .tensor = bias, .tensor_grad = bias,
                          .buckets = 2 * T};
    cfg.score_mods = &rel;
    CHECK_STATUS(attn_sdpa_backward(ctx, &cfg, q, k, v, out, lse, out, dq, dk, dv, NULL),
                 ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "score_mods[0].tensor_grad [");
    rel.tensor_grad = grad;
    CHECK_STATUS(attn_sdpa_backward(ctx, &cfg, q, k, v, out, lse, out, dq, dk, dv, NULL),
                 ATTN_OK);
    /* ALiBi slopes in the chain: finite, and not under an output */
    float slopes[H] = {0.5f, NAN};
    attn_score_mod alibi = {.kind = ATTN_SCORE_ALIBI, .tensor = slopes};
    cfg.score_mods = &alibi;
    CHECK_STATUS(attn_sdpa_forward(ctx, &cfg, q, k, v, out, lse, NULL, NULL), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "score_mods[0] (alibi) slope tensor[1] is nan");
    slopes[1] = 0.25f;
    alibi.tensor = lse + 3;
    CHECK_STATUS(attn_sdpa_forward(ctx, &cfg, q, k, v, out, lse, NULL, NULL), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "lse [");
    CHECK_MESSAGE(ctx, "overlaps score_mods[0].tensor [");
    /* a softcap float32 holds as 0 */
    attn_score_mod cap = {.kind = ATTN_SCORE_SOFTCAP, .value = 1e-50};
    cfg.score_mods = &cap;
    CHECK_STATUS(attn_sdpa_forward(ctx, &cfg, q, k, v, out, lse, NULL, NULL), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "score_mods[0] (softcap) value 1e-50 rounds to 0 in float32");
    double q64[1] = {0}, o64[1], l64[1];
    attn_sdpa_config one = {.batch = 1, .heads = 1, .q_tokens = 1, .kv_tokens = 1,
                            .head_dim = 1, .score_mods = &cap, .score_mod_count = 1};
    CHECK_STATUS(attn_sdpa_forward_f64(ctx, &one, q64, q64, q64, o64, l64, NULL, NULL),
                 ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "rounds to 0 in float32");
    free(q), free(k), free(v), free(out), free(lse), free(dq), free(dk), free(dv), free(bias),
        free(grad), free(big);
}

/* A callback that makes head 0's score of query 9 against key 4 +inf. */
static int inf_fn(void *user, const attn_score_tile *t) {
    (void)user;
    if (t->h == 0 && t->q0 <= 9 && 9 < t->q0 + t->rows && t->kv0 <= 4 && 4 < t->kv0 + t->cols)
        t->scores[(9 - t->q0) * t->ld + (4 - t->kv0)] = INFINITY;
    return 0;
}
static int inf_grad(void *user, const attn_score_tile *t, float *grad) {
    (void)user, (void)t, (void)grad;
    return 0;
}

/* Where x is NaN, as 0 and 1. */
static void nan_pattern(const float *x, size_t n, unsigned char *out) {
    for (size_t i = 0; i < n; i++) out[i] = isnan(x[i]) != 0;
}

/* A NaN input, or a score a modifier makes +inf, makes the rows that see it
 * NaN, and their gradients, as the reference (and PyTorch) make them: the
 * kernels' max and exp2 would pass over such a score, and a row that saw
 * nothing else would give zeros; so would softcap's vector tanh, whose
 * exp2 gives 0 for NaN (variant 2). Causal, so that the rows before the key
 * stay finite. dq may also be NaN where a row that does not see the NaN key
 * multiplies its zero weight by it (0 * NaN, as PyTorch's dense backward);
 * with the NaN in a query (variant 3), so may dk of a key that query does
 * not see, and PyTorch's dense dK = dS^T Q is NaN for every key. */
static void test_non_finite(attn_ctx *ctx) {
    attn_ctx *ref;
    attn_ctx_config rc = {.kernels = ATTN_KERNELS_REFERENCE};
    CHECK_STATUS(attn_ctx_new(&rc, &ref), ATTN_OK);
    const size_t B = 1, H = 2, T = 40, D = 16, n = B * T * H * D, rows = B * H * T;
    unsigned char *want = malloc(n), *got = malloc(n);
    for (int variant = 0; variant < 4; variant++) {
        float *q = alloc_randn(n, 1), *k = alloc_randn(n, 1), *v = alloc_randn(n, 1);
        float *dout = alloc_randn(n, 1);
        if (variant == 0 || variant == 2) k[(7 * H + 1) * D + 3] = NAN; /* key 7 of head 1 */
        if (variant == 3) q[(7 * H + 1) * D + 3] = NAN;                 /* query 7 of head 1 */
        /* softcap, then a scale: not the fixed features, the block-map kernels' */
        attn_score_mod mods[2] = {{.kind = ATTN_SCORE_SCALE, .value = 0.5}};
        if (variant == 1)
            mods[0] = (attn_score_mod){.kind = ATTN_SCORE_CALLBACK, .fn = inf_fn,
                                       .grad_fn = inf_grad};
        if (variant == 2) {
            mods[0] = (attn_score_mod){.kind = ATTN_SCORE_SOFTCAP, .value = 5.0};
            mods[1] = (attn_score_mod){.kind = ATTN_SCORE_SCALE, .value = 0.5};
        }
        attn_sdpa_config cfg = {.batch = B, .heads = H, .q_tokens = T, .kv_tokens = T,
                                .head_dim = D, .causal = true, .align = ATTN_ALIGN_TOP_LEFT,
                                .score_mods = mods, .score_mod_count = variant == 2 ? 2 : 1};
        float *r[2][5]; /* out, lse, dq, dk, dv of the fast ctx and the reference */
        for (int c = 0; c < 2; c++) {
            attn_ctx *x = c ? ref : ctx;
            for (int t = 0; t < 5; t++) r[c][t] = calloc(t == 1 ? rows : n, sizeof(float));
            CHECK_STATUS(attn_sdpa_forward(x, &cfg, q, k, v, r[c][0], r[c][1], NULL, NULL),
                         ATTN_OK);
            if (c == 0) CHECK(strstr(attn_ctx_last_explain(x), "flex [") != NULL);
            CHECK_STATUS(attn_sdpa_backward(x, &cfg, q, k, v, r[c][0], r[c][1], dout, r[c][2],
                                            r[c][3], r[c][4], NULL),
                         ATTN_OK);
        }
        size_t nan_rows = 0;
        for (int t = 0; t < 5; t++) {
            size_t len = t == 1 ? rows : n, extra = 0, missing = 0;
            nan_pattern(r[1][t], len, want);
            nan_pattern(r[0][t], len, got);
            for (size_t i = 0; i < len; i++) {
                missing += want[i] && !got[i];
                extra += got[i] && !want[i];
                if (t == 1) nan_rows += want[i];
            }
            bool extra_ok = t == 2 || (t == 3 && variant == 3);
            CHECK(missing == 0);
            CHECK(extra_ok || extra == 0);
            if (missing || (!extra_ok && extra))
                printf("FAIL non-finite variant %d, tensor %d: %zu NaN missing, %zu extra\n",
                       variant, t, missing, extra);
        }
        /* head 1's rows from 7 on; head 0's row 9; head 1's row 7 */
        CHECK(nan_rows == (variant == 1 ? 1 : variant == 3 ? 1 : T - 7));
        for (int c = 0; c < 2; c++)
            for (int t = 0; t < 5; t++) free(r[c][t]);
        free(q), free(k), free(v), free(dout);
    }
    free(want), free(got);
    attn_ctx_free(ref);
}

/* The relative L2 distance of got from want over n floats (0 where both are 0). */
/* Relative L2 of got from want; the absolute L2 where want is all zero. */
static double rel_l2_of(const float *got, const double *want, size_t n) {
    double num = 0, den = 0;
    for (size_t e = 0; e < n; e++) {
        num += ((double)got[e] - want[e]) * ((double)got[e] - want[e]);
        den += want[e] * want[e];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static double rel_l2_floats(const float *got, const float *want, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)got[i] - want[i];
        num += e * e;
        den += (double)want[i] * want[i];
    }
    return den == 0 ? (num == 0 ? 0 : INFINITY) : sqrt(num / den);
}

/* A final score of -inf hides its key: a row whose every visible key scores
 * -inf sees none, and gives out 0 and lse -inf with nothing flowing back,
 * on the fast kernels and on the reference alike (which made such a row
 * NaN: exp(-inf - -inf)). Variant 0: a bias tensor with its gradient, row
 * 5 of head 1 all -inf and row 9 of head 0 all but its own key; variants 1
 * and 2: a relative table whose distance-0 entry is -inf for head 1, so that
 * row 0 (it sees key 0 alone) sees none, without its gradient and with it
 * (the fused kernels decline a table that is not finite: the block-map
 * kernels run each). */
static void test_minus_inf_rows(attn_ctx *ctx) {
    attn_ctx *ref;
    attn_ctx_config rc = {.kernels = ATTN_KERNELS_REFERENCE};
    CHECK_STATUS(attn_ctx_new(&rc, &ref), ATTN_OK);
    const size_t B = 1, H = 2, T = 24, D = 16, n = B * T * H * D, rows = B * H * T;
    for (int variant = 0; variant < 3; variant++) {
        float *q = alloc_randn(n, 1), *k = alloc_randn(n, 1), *v = alloc_randn(n, 1);
        float *dout = alloc_randn(n, 1);
        size_t tn = variant == 0 ? H * T * T : H * 2 * T;
        float *table = alloc_randn(tn, 1), *tgrad[2] = {calloc(tn, sizeof(float)),
                                                        calloc(tn, sizeof(float))};
        attn_score_mod mod;
        size_t none_row; /* the (h, i) row, h * T + i, that sees no key */
        if (variant == 0) {
            for (size_t j = 0; j < T; j++) table[(1 * T + 5) * T + j] = -INFINITY;
            for (size_t j = 0; j < 9; j++) table[(0 * T + 9) * T + j] = -INFINITY;
            mod = (attn_score_mod){.kind = ATTN_SCORE_BIAS, .tensor = table,
                                   .strides = {0, T * T, T, 1}};
            none_row = 1 * T + 5;
        } else {
            /* e = q_idx - kv_idx, rows of 2T: e = 0 is element 0 of a head's row */
            table[1 * 2 * T + 0] = -INFINITY;
            mod = (attn_score_mod){.kind = ATTN_SCORE_REL_TABLE, .tensor = table,
                                   .buckets = 2 * T};
            none_row = 1 * T + 0;
        }
        attn_sdpa_config cfg = {.batch = B, .heads = H, .q_tokens = T, .kv_tokens = T,
                                .head_dim = D, .causal = true, .align = ATTN_ALIGN_TOP_LEFT,
                                .score_mods = &mod, .score_mod_count = 1};
        float *r[2][5]; /* out, lse, dq, dk, dv of the fast ctx and the reference */
        for (int c = 0; c < 2; c++) {
            attn_ctx *x = c ? ref : ctx;
            mod.tensor_grad = variant == 1 ? NULL : tgrad[c];
            for (int t = 0; t < 5; t++) r[c][t] = calloc(t == 1 ? rows : n, sizeof(float));
            CHECK_STATUS(attn_sdpa_forward(x, &cfg, q, k, v, r[c][0], r[c][1], NULL, NULL),
                         ATTN_OK);
            CHECK_STATUS(attn_sdpa_backward(x, &cfg, q, k, v, r[c][0], r[c][1], dout, r[c][2],
                                            r[c][3], r[c][4], NULL),
                         ATTN_OK);
            size_t nans = 0;
            for (int t = 0; t < 5; t++)
                for (size_t i = 0; i < (t == 1 ? rows : n); i++) nans += isnan(r[c][t][i]) != 0;
            for (size_t i = 0; variant != 1 && i < tn; i++) nans += isnan(tgrad[c][i]) != 0;
            CHECK(nans == 0);
            /* lse (b, h, i); out (b, i, h, d) */
            size_t h = none_row / T, i = none_row % T;
            CHECK(r[c][1][none_row] == -INFINITY);
            bool zero = true;
            for (size_t d = 0, at = (i * H + h) * D; d < D; d++)
                zero &= r[c][0][at + d] == 0.0f && r[c][2][at + d] == 0.0f;
            CHECK(zero);
            if (nans || r[c][1][none_row] != -INFINITY || !zero)
                printf("FAIL -inf rows variant %d, %s: %zu NaN, lse %g\n", variant,
                       c ? "reference" : "fast", nans, r[c][1][none_row]);
        }
        for (int t = 0; t < 5; t++) {
            size_t len = t == 1 ? rows : n;
            bool same_inf = true;
            for (size_t i = 0; i < len; i++)
                same_inf &= isinf(r[1][t][i]) == isinf(r[0][t][i]);
            for (size_t i = 0; i < len; i++)
                if (isinf(r[1][t][i])) r[0][t][i] = r[1][t][i] = 0.0f; /* compared above */
            double e = rel_l2_floats(r[0][t], r[1][t], len);
            CHECK(same_inf && e <= 1e-5);
            if (!same_inf || e > 1e-5)
                printf("FAIL -inf rows variant %d, tensor %d: rel L2 %.3g\n", variant, t, e);
        }
        if (variant != 1) {
            for (size_t i = 0; i < tn; i++)
                if (isinf(table[i])) CHECK(tgrad[0][i] == 0.0f && tgrad[1][i] == 0.0f);
            CHECK(rel_l2_floats(tgrad[0], tgrad[1], tn) <= 1e-5);
        }
        for (int c = 0; c < 2; c++) {
            for (int t = 0; t < 5; t++) free(r[c][t]);
            free(tgrad[c]);
        }
        free(q), free(k), free(v), free(dout), free(table);
    }
    attn_ctx_free(ref);
}

/* Two keys tied at a score past 2^53 (a bias of 1e17, above the others by
 * far): each weighs 1/2, though max + log(2) rounds to max in double. The
 * float64 backward once took each weight as exp(s - lse) with lse so
 * rounded, 1 each, and gave twice the gradients. With such a row the
 * answers are closed forms: out = (v0 + v1) / 2, dv0 = dv1 = dO / 2,
 * dS0 = -dS1 = (dP0 - dP1) / 4 (dP_j = dO . v_j), dq = scale (dS0 k0 + dS1
 * k1), and the bias's gradient dS. */
static void test_huge_tied_scores(attn_ctx *ctx) {
    attn_ctx *ref;
    attn_ctx_config rc = {.kernels = ATTN_KERNELS_REFERENCE};
    CHECK_STATUS(attn_ctx_new(&rc, &ref), ATTN_OK);
    enum { S = 4, D = 8 };
    double q[D], k[S * D], v[S * D], out[D], lse[1], dout[D], dq[D], dk[S * D], dv[S * D];
    for (size_t i = 0; i < D; i++) q[i] = 0.3 * randn(), dout[i] = randn();
    for (size_t i = 0; i < S * D; i++) k[i] = 0.3 * randn(), v[i] = randn();
    float bias[S] = {1e17f, 1e17f, 0.0f, 0.0f}, bias_grad[S] = {0};
    attn_score_mod mod = {.kind = ATTN_SCORE_BIAS, .tensor = bias, .tensor_grad = bias_grad,
                          .strides = {0, 0, 0, 1}};
    attn_sdpa_config cfg = {.batch = 1, .heads = 1, .q_tokens = 1, .kv_tokens = S, .head_dim = D,
                            .score_mods = &mod, .score_mod_count = 1};
    CHECK_STATUS(attn_sdpa_forward_f64(ref, &cfg, q, k, v, out, lse, NULL, NULL), ATTN_OK);
    CHECK_STATUS(attn_sdpa_backward_f64(ref, &cfg, q, k, v, out, lse, dout, dq, dk, dv, NULL),
                 ATTN_OK);
    double dP[2] = {0, 0}, scale = 1.0 / sqrt((double)D), worst = 0;
    for (size_t j = 0; j < 2; j++)
        for (size_t d = 0; d < D; d++) dP[j] += dout[d] * v[j * D + d];
    double dS0 = (dP[0] - dP[1]) / 4;
    for (size_t d = 0; d < D; d++) {
        double want_dq = scale * dS0 * (k[d] - k[D + d]);
        worst = check_worse(worst, fabs(out[d] - (v[d] + v[D + d]) / 2));
        worst = check_worse(worst, fabs(dv[d] - dout[d] / 2) + fabs(dv[D + d] - dout[d] / 2));
        worst = check_worse(worst, fabs(dv[2 * D + d]) + fabs(dv[3 * D + d]));
        worst = check_worse(worst, fabs(dq[d] - want_dq));
        double want_dk = scale * dS0 * q[d];
        worst = check_worse(worst, fabs(dk[d] - want_dk) + fabs(dk[D + d] + want_dk));
    }
    worst = check_worse(worst, fabs(bias_grad[0] - dS0) + fabs(bias_grad[1] + dS0));
    CHECK(worst < 1e-6);
    if (worst >= 1e-6) printf("FAIL huge tied scores: worst difference %.3g\n", worst);
    /* the block-map kernels in float (the bias's gradient sends the chain
     * there): their lse's low part carries log 2 past 2^53 too */
    float qf[D], kf[S * D], vf[S * D], of[D], lf[1], df[D], dqf[D], dkf[S * D], dvf[S * D];
    for (size_t i = 0; i < D; i++) qf[i] = (float)q[i], df[i] = (float)dout[i];
    for (size_t i = 0; i < S * D; i++) kf[i] = (float)k[i], vf[i] = (float)v[i];
    CHECK_STATUS(attn_sdpa_forward(ctx, &cfg, qf, kf, vf, of, lf, NULL, NULL), ATTN_OK);
    CHECK_STATUS(attn_sdpa_backward(ctx, &cfg, qf, kf, vf, of, lf, df, dqf, dkf, dvf, NULL),
                 ATTN_OK);
    CHECK(strstr(attn_ctx_last_explain(ctx), "flex [") != NULL);
    worst = 0;
    for (size_t d = 0; d < D; d++)
        worst = check_worse(worst, fabs(dvf[d] - dout[d] / 2) + fabs(dvf[D + d] - dout[d] / 2) +
                                fabs(of[d] - (v[d] + v[D + d]) / 2));
    worst = check_worse(worst, fabs(bias_grad[0] - dS0) + fabs(bias_grad[1] + dS0));
    CHECK(worst < 1e-5);
    if (worst >= 1e-5) printf("FAIL huge tied scores, block-map kernels: worst %.3g\n", worst);
    attn_ctx_free(ref);
}

/* Rows nearly one-hot (a bias puts each row's own key 12 above the rest):
 * the block-map kernels' backward makes their delta consistent with their
 * own weights, as the fused kernels do, where delta = dO . O alone gave dq
 * and dk 1e-4 .. 1e-2 off float64 (the error amplified by 1 / (1 - P)).
 * Three shapes, one per path: a relative table with its gradient summed in
 * the rows pass (one sequence, one query block), a bias tensor with its
 * gradient in its own pass (three sequences), and a bias without one in
 * the one pass (items enough). Against the float64 call, 1e-5; 1 and 2
 * threads bitwise. */
static void test_one_hot_rows(attn_ctx *ctx) {
    attn_ctx *ref;
    attn_ctx_config rc = {.kernels = ATTN_KERNELS_REFERENCE};
    CHECK_STATUS(attn_ctx_new(&rc, &ref), ATTN_OK);
    for (int variant = 0; variant < 3; variant++) {
        size_t B = variant == 0 ? 1 : variant == 1 ? 3 : 2, H = 2, T = 40, D = 24;
        size_t n = B * T * H * D, tn = variant == 0 ? H * 2 * T : B * H * T * T;
        float *q = alloc_randn(n, 1), *k = alloc_randn(n, 1), *v = alloc_randn(n, 1);
        float *dout = alloc_randn(n, 1), *table = alloc_randn(tn, 0.3f);
        float *tg = calloc(tn, sizeof(float)), *tgd = calloc(tn, sizeof(float));
        if (variant == 0) {
            for (size_t h = 0; h < H; h++) table[h * 2 * T] = 12.0f; /* e = q_idx - kv_idx = 0 */
        } else {
            for (size_t bh = 0; bh < B * H; bh++)
                for (size_t i = 0; i < T; i++) table[(bh * T + i) * T + i] = 12.0f;
        }
        attn_score_mod mod = variant == 0
                                 ? (attn_score_mod){.kind = ATTN_SCORE_REL_TABLE, .tensor = table,
                                                    .buckets = 2 * T}
                                 : (attn_score_mod){.kind = ATTN_SCORE_BIAS, .tensor = table,
                                                    .strides = {H * T * T, T * T, T, 1}};
        attn_sdpa_config cfg = {.batch = B, .heads = H, .q_tokens = T, .kv_tokens = T,
                                .head_dim = D, .causal = true, .align = ATTN_ALIGN_TOP_LEFT,
                                .score_mods = &mod, .score_mod_count = 1};
        double *x[4];
        const float *xf[4] = {q, k, v, dout};
        for (int t = 0; t < 4; t++) {
            x[t] = malloc(n * sizeof(double));
            for (size_t e = 0; e < n; e++) x[t][e] = xf[t][e];
        }
        float *got[5];
        double *want[5];
        for (int t = 0; t < 5; t++) {
            got[t] = calloc(t == 1 ? B * H * T : n, sizeof(float));
            want[t] = calloc(t == 1 ? B * H * T : n, sizeof(double));
        }
        mod.tensor_grad = variant == 2 ? NULL : tg;
        CHECK_STATUS(attn_sdpa_forward(ctx, &cfg, q, k, v, got[0], got[1], NULL, NULL), ATTN_OK);
        CHECK_STATUS(attn_sdpa_backward(ctx, &cfg, q, k, v, got[0], got[1], dout, got[2], got[3],
                                        got[4], NULL),
                     ATTN_OK);
        CHECK(strstr(attn_ctx_last_explain(ctx), "flex [") != NULL);
        { /* one thread: the same bits */
            attn_ctx *one;
            attn_ctx_config c1 = {.num_threads = 1};
            CHECK_STATUS(attn_ctx_new(&c1, &one), ATTN_OK);
            float *dq1 = calloc(n, sizeof(float)), *dk1 = calloc(n, sizeof(float));
            float *dv1 = calloc(n, sizeof(float)), *tg1 = calloc(tn, sizeof(float));
            mod.tensor_grad = variant == 2 ? NULL : tg1;
            CHECK_STATUS(attn_sdpa_backward(one, &cfg, q, k, v, got[0], got[1], dout, dq1, dk1,
                                            dv1, NULL),
                         ATTN_OK);
            CHECK(memcmp(dq1, got[2], n * sizeof(float)) == 0 &&
                  memcmp(dk1, got[3], n * sizeof(float)) == 0 &&
                  memcmp(dv1, got[4], n * sizeof(float)) == 0 &&
                  memcmp(tg1, tg, tn * sizeof(float)) == 0);
            free(dq1), free(dk1), free(dv1), free(tg1);
            attn_ctx_free(one);
        }
        mod.tensor_grad = variant == 2 ? NULL : tgd;
        CHECK_STATUS(attn_sdpa_forward_f64(ref, &cfg, x[0], x[1], x[2], want[0], want[1], NULL,
                                           NULL),
                     ATTN_OK);
        CHECK_STATUS(attn_sdpa_backward_f64(ref, &cfg, x[0], x[1], x[2], want[0], want[1], x[3],
                                            want[2], want[3], want[4], NULL),
                     ATTN_OK);
        for (int t = 2; t < 6; t++) {
            if (t == 5 && variant == 2) continue;
            double err = t == 5 ? rel_l2_floats(tg, tgd, tn) : rel_l2_of(got[t], want[t], n);
            CHECK(err <= 1e-5);
            if (err > 1e-5)
                printf("FAIL one-hot rows variant %d, %s: rel L2 %.3g\n", variant,
                       (const char *[]){"", "", "dq", "dk", "dv", "bias grad"}[t], err);
        }
        for (int t = 0; t < 5; t++) free(got[t]), free(want[t]);
        for (int t = 0; t < 4; t++) free(x[t]);
        free(q), free(k), free(v), free(dout), free(table), free(tg), free(tgd);
    }
    attn_ctx_free(ref);
}

/* Only the first query and the first key see the others: (q_idx < 1) |
 * (kv_idx < 1), flex_attention's blocks of 16. */
static int first_row_or_key(void *user, size_t b, size_t h, size_t i, size_t j) {
    (void)user, (void)b, (void)h;
    return i < 1 || j < 1;
}

/* Rows that see one key with a softcap in the chain: their softmax is
 * constant, so their dq is exactly 0 (the float64 reference's, and
 * PyTorch float32's), and the key's dk takes nothing from them. The
 * consistent delta carries the softcap's factor at the row's one key into
 * its fix-ups, as the fused kernels do; without it each row kept delta's
 * rounding residue (dq and dk 1e-5 off float64 at T 64, S 129). Variants:
 * cap 1, cap 30 (two passes), cap 1 with items enough for the one pass, a
 * bias with its gradient then cap 1 (the rows pass's fix-up of the bias's
 * gradient), and a relative table with its gradient, cap 1, a scale and
 * cap 30. dq, dk, dv and the tensor's gradient within 1e-5 relative L2 of
 * the float64 call; dq of the one-key rows, and the bias's gradient
 * there, exactly 0 where the chain has one factor; 1 and 2 threads
 * bitwise. */
static void test_softcap_one_key_rows(attn_ctx *ctx) {
    attn_ctx *ref, *one;
    attn_ctx_config rc = {.kernels = ATTN_KERNELS_REFERENCE}, c1 = {.num_threads = 1};
    CHECK_STATUS(attn_ctx_new(&rc, &ref), ATTN_OK);
    CHECK_STATUS(attn_ctx_new(&c1, &one), ATTN_OK);
    const size_t T = 64, S = 129, D = 40;
    attn_block_mask_config mc = {1, 1, T, S, 16, 16};
    attn_block_mask *mask = NULL;
    CHECK_STATUS(attn_block_mask_from_fn(ctx, &mc, first_row_or_key, NULL, &mask), ATTN_OK);
    for (int variant = 0; variant < 5; variant++) {
        size_t B = variant == 2 ? 2 : 1, H = variant == 2 ? 2 : 1;
        size_t qn = B * H * T * D, kn = B * H * S * D;
        size_t tn = variant == 3 ? B * H * T * S : variant == 4 ? H * (T + S - 1) : 0;
        float *q = alloc_randn(qn, 1), *k = alloc_randn(kn, 1), *v = alloc_randn(kn, 1);
        float *dout = alloc_randn(qn, 1), *tensor = alloc_randn(tn, 0.3f);
        float *tg = calloc(tn + 1, sizeof(float)), *tg1 = calloc(tn + 1, sizeof(float));
        float *tgd = calloc(tn + 1, sizeof(float));
        attn_score_mod cap1 = {.kind = ATTN_SCORE_SOFTCAP, .value = 1.0};
        attn_score_mod cap30 = {.kind = ATTN_SCORE_SOFTCAP, .value = 30.0};
        attn_score_mod mods[4];
        size_t nmods = 0;
        if (variant == 3)
            mods[nmods++] = (attn_score_mod){.kind = ATTN_SCORE_BIAS, .tensor = tensor,
                                             .strides = {H * T * S, T * S, S, 1}};
        if (variant == 4)
            mods[nmods++] = (attn_score_mod){.kind = ATTN_SCORE_REL_TABLE, .tensor = tensor,
                                             .buckets = T + S - 1, .offset = (int64_t)S - 1};
        mods[nmods++] = variant == 1 ? cap30 : cap1;
        if (variant == 4) {
            mods[nmods++] = (attn_score_mod){.kind = ATTN_SCORE_SCALE, .value = 0.7};
            mods[nmods++] = cap30;
        }
        attn_sdpa_config cfg = {.batch = B, .heads = H, .q_tokens = T, .kv_tokens = S,
                                .head_dim = D, .block_mask = mask, .score_mods = mods,
                                .score_mod_count = nmods};
        double *x[4];
        const float *xf[4] = {q, k, v, dout};
        size_t xn[4] = {qn, kn, kn, qn}, gn[3] = {qn, kn, kn};
        for (int t = 0; t < 4; t++) {
            x[t] = malloc(xn[t] * sizeof(double));
            for (size_t e = 0; e < xn[t]; e++) x[t][e] = xf[t][e];
        }
        float *out = calloc(qn, sizeof(float)), *lse = calloc(B * H * T, sizeof(float));
        double *outd = calloc(qn, sizeof(double)), *lsed = calloc(B * H * T, sizeof(double));
        float *got[3], *got1[3];
        double *want[3];
        for (int t = 0; t < 3; t++) {
            got[t] = calloc(gn[t], sizeof(float));
            got1[t] = calloc(gn[t], sizeof(float));
            want[t] = calloc(gn[t], sizeof(double));
        }
        if (tn) mods[0].tensor_grad = tg;
        CHECK_STATUS(attn_sdpa_forward(ctx, &cfg, q, k, v, out, lse, NULL, NULL), ATTN_OK);
        CHECK_STATUS(attn_sdpa_backward(ctx, &cfg, q, k, v, out, lse, dout, got[0], got[1],
                                        got[2], NULL),
                     ATTN_OK);
        CHECK(strstr(attn_ctx_last_explain(ctx), "flex [") != NULL);
        if (tn) mods[0].tensor_grad = tg1;
        CHECK_STATUS(attn_sdpa_backward(one, &cfg, q, k, v, out, lse, dout, got1[0], got1[1],
                                        got1[2], NULL),
                     ATTN_OK);
        bool same = memcmp(tg, tg1, tn * sizeof(float)) == 0;
        for (int t = 0; t < 3; t++) same &= memcmp(got[t], got1[t], gn[t] * sizeof(float)) == 0;
        CHECK(same);
        if (!same) printf("FAIL softcap one-key rows variant %d: threads differ\n", variant);
        if (tn) mods[0].tensor_grad = tgd;
        CHECK_STATUS(attn_sdpa_forward_f64(ref, &cfg, x[0], x[1], x[2], outd, lsed, NULL, NULL),
                     ATTN_OK);
        CHECK_STATUS(attn_sdpa_backward_f64(ref, &cfg, x[0], x[1], x[2], outd, lsed, x[3],
                                            want[0], want[1], want[2], NULL),
                     ATTN_OK);
        for (int t = 0; t < 4; t++) {
            if (t == 3 && !tn) continue;
            double err = t == 3 ? rel_l2_floats(tg, tgd, tn)
                                 : rel_l2_of(got[t], want[t], gn[t]);
            CHECK(err <= TOL);
            if (err > TOL)
                printf("FAIL softcap one-key rows variant %d, %s: rel L2 %.3g\n", variant,
                       (const char *[]){"dq", "dk", "dv", "tensor grad"}[t], err);
        }
        if (variant != 4) { /* one factor at the key: exactly what the tiles added */
            double worst = 0;
            for (size_t b = 0; b < B; b++) /* q, dq: (B, T, H, D); the bias (B, H, T, S) */
                for (size_t i = 1; i < T; i++)
                    for (size_t h = 0; h < H; h++) {
                        for (size_t d = 0; d < D; d++)
                            worst = check_worse(worst, fabs(got[0][((b * T + i) * H + h) * D + d]));
                        if (variant == 3)
                            worst = check_worse(worst, fabs(tg[((b * H + h) * T + i) * S]));
                    }
            CHECK(worst == 0.0);
            if (worst != 0.0)
                printf("FAIL softcap one-key rows variant %d: one-key rows' |dq| %.3g\n", variant,
                       worst);
        }
        for (int t = 0; t < 3; t++) free(got[t]), free(got1[t]), free(want[t]);
        for (int t = 0; t < 4; t++) free(x[t]);
        free(q), free(k), free(v), free(dout), free(tensor), free(tg), free(tg1), free(tgd);
        free(out), free(lse), free(outd), free(lsed);
    }
    attn_block_mask_free(mask);
    attn_ctx_free(one);
    attn_ctx_free(ref);
}

/* ---- timing -------------------------------------------------------------------- */

/* A chain of softcap then ALiBi at the problem's own positions is the
 * fixed features: the fused kernels run it, with their bits; the signed
 * ALiBi too where every visible key is at or before the query; elsewhere
 * the flex kernels. */
static void test_fixed_features(attn_ctx *ctx) {
    const size_t B = 2, H = 4, T = 3 + below(200), D = 32, qn = B * T * H * D;
    float *q = alloc_randn(qn, 1.0f), *k = alloc_randn(qn, 1.0f), *v = alloc_randn(qn, 1.0f);
    float *dout = alloc_randn(qn, 1.0f), slopes[4];
    for (size_t h = 0; h < H; h++) slopes[h] = (float)(0.05 + 0.3 * uniform());
    float *out[2], *lse[2], *dq[2], *dk[2], *dv[2];
    for (int r = 0; r < 2; r++) {
        out[r] = calloc(qn, sizeof(float)), lse[r] = calloc(B * H * T, sizeof(float));
        dq[r] = calloc(qn, sizeof(float)), dk[r] = calloc(qn, sizeof(float));
        dv[r] = calloc(qn, sizeof(float));
    }
    attn_sdpa_config fixed = {.batch = B, .heads = H, .q_tokens = T, .kv_tokens = T,
                              .head_dim = D, .causal = true, .align = ATTN_ALIGN_TOP_LEFT,
                              .softcap = 20.0, .alibi_slopes = slopes};
    CHECK_STATUS(attn_sdpa_forward(ctx, &fixed, q, k, v, out[0], lse[0], NULL, NULL), ATTN_OK);
    CHECK_STATUS(attn_sdpa_backward(ctx, &fixed, q, k, v, out[0], lse[0], dout, dq[0], dk[0],
                                    dv[0], NULL),
                 ATTN_OK);
    for (int signed_form = 0; signed_form < 2; signed_form++) {
        attn_score_mod chain[2] = {{.kind = ATTN_SCORE_SOFTCAP, .value = 20.0},
                                   {.kind = ATTN_SCORE_ALIBI, .tensor = slopes,
                                    .signed_distance = signed_form}};
        attn_sdpa_config said = fixed;
        said.softcap = 0.0, said.alibi_slopes = NULL;
        said.score_mods = chain, said.score_mod_count = 2;
        CHECK_STATUS(attn_sdpa_forward(ctx, &said, q, k, v, out[1], lse[1], NULL, NULL), ATTN_OK);
        CHECK(strstr(attn_ctx_last_explain(ctx), "fused [") != NULL);
        CHECK_STATUS(attn_sdpa_backward(ctx, &said, q, k, v, out[1], lse[1], dout, dq[1], dk[1],
                                        dv[1], NULL),
                     ATTN_OK);
        CHECK(memcmp(out[0], out[1], qn * sizeof(float)) == 0);
        CHECK(memcmp(lse[0], lse[1], B * H * T * sizeof(float)) == 0);
        CHECK(memcmp(dq[0], dq[1], qn * sizeof(float)) == 0);
        CHECK(memcmp(dk[0], dk[1], qn * sizeof(float)) == 0);
        CHECK(memcmp(dv[0], dv[1], qn * sizeof(float)) == 0);
        /* not the fixed features: a signed distance that sees later keys, an
         * ALiBi at other positions */
        said.causal = !signed_form;
        chain[1].offset = signed_form ? 0 : 5;
        CHECK_STATUS(attn_sdpa_forward(ctx, &said, q, k, v, out[1], lse[1], NULL, NULL), ATTN_OK);
        CHECK(strstr(attn_ctx_last_explain(ctx), "flex [") != NULL);
    }
    for (int r = 0; r < 2; r++) free(out[r]), free(lse[r]), free(dq[r]), free(dk[r]), free(dv[r]);
    free(q), free(k), free(v), free(dout);
}

/* A scattered map, the same for every head: about half of each tile. */
static int scattered(void *user, size_t b, size_t h, size_t i, size_t j) {
    (void)user, (void)b, (void)h;
    uint64_t z = ((uint64_t)i << 32 | j) * 0x9E3779B97F4A7C15ull;
    return (z >> 61) < 4 || i == j;
}

/* (B, n, heads, width) rows [h0, h0 + hn) of batch b into (1, n, hn, width). */
static void slice_heads(const float *x, size_t b, size_t n, size_t heads, size_t h0, size_t hn,
                        size_t width, float *to) {
    for (size_t i = 0; i < n; i++)
        memcpy(to + i * hn * width, x + ((b * n + i) * heads + h0) * width,
               hn * width * sizeof(float));
}

/* The backward runs in one pass over (batch, KV head) items where there are
 * 4 or more, in two passes (per key block, then per query block) where
 * fewer: each (batch, KV head) of a 2 x 2 problem, run as a problem of its
 * own, takes the two passes, and must give the one pass's bits. */
/* A callback that makes the scores of keys after the query NaN: the causal
 * map hides them, so they must count for nothing. */
static int nan_above_fn(void *user, const attn_score_tile *t) {
    (void)user;
    for (size_t r = 0; r < t->rows; r++)
        for (size_t c = 0; c < t->cols; c++)
            if (t->kv0 + c > t->q0 + r) t->scores[r * t->ld + c] = NAN;
    return 0;
}
static int identity_grad(void *user, const attn_score_tile *t, float *grad) {
    (void)user, (void)t, (void)grad;
    return 0;
}
/* 1.5 s, -inf kept; its gradient's factor NaN at -inf (cos(-inf)), as a
 * callback written without hidden keys in mind gives. */
static int keep_inf_fn(void *user, const attn_score_tile *t) {
    (void)user;
    for (size_t r = 0; r < t->rows; r++)
        for (size_t c = 0; c < t->cols; c++)
            if (!isinf(t->scores[r * t->ld + c])) t->scores[r * t->ld + c] *= 1.5f;
    return 0;
}
static int nan_at_inf_grad(void *user, const attn_score_tile *t, float *grad) {
    (void)user;
    for (size_t r = 0; r < t->rows; r++)
        for (size_t c = 0; c < t->cols; c++)
            grad[r * t->ld + c] *= 1.5f + 0.0f * cosf(t->scores[r * t->ld + c]);
    return 0;
}

/* Hidden scores a modifier made NaN (kept as the softcap's input) keep a
 * zero gradient on the block-map kernels as on the reference: the bias's
 * gradient between them was NaN in the entries such tiles reach. Hidden
 * by the map (variant 0), or by the chain: a bias of -inf, which the
 * callback then turns into NaN (variant 1). */
static void test_hidden_nan_inputs(attn_ctx *fast, int variant) {
    enum { B = 1, H = 2, T = 40, D = 16 };
    size_t n = B * T * H * D;
    float *q = alloc_randn(n, 1), *k = alloc_randn(n, 1), *v = alloc_randn(n, 1);
    float *dout = alloc_randn(n, 1), *bias = alloc_randn(H * T * T, 1);
    float *out = calloc(n, 4), *lse = calloc(B * H * T, 4), *dq = calloc(n, 4);
    float *dk = calloc(n, 4), *dv = calloc(n, 4), *grad[2] = {calloc(H * T * T, 4),
                                                              calloc(H * T * T, 4)};
    attn_ctx *ref;
    attn_ctx_config rc = {.num_threads = 1, .kernels = ATTN_KERNELS_REFERENCE};
    CHECK_STATUS(attn_ctx_new(&rc, &ref), ATTN_OK);
    attn_mask *causal;
    attn_block_mask *map;
    attn_block_mask_config mc = {.batch = 1, .heads = 1, .q_len = T, .kv_len = T, .block_q = 16,
                                 .block_kv = 16};
    CHECK_STATUS(attn_mask_new_causal(fast, 0, &causal), ATTN_OK);
    CHECK_STATUS(attn_block_mask_from_mask(fast, &mc, causal, &map), ATTN_OK);
    float *hide = calloc(T * T, 4);
    for (size_t e = 0; e < T * T; e += 7) hide[e] = -INFINITY;
    /* the gradient's bias second: after it, the step whose kept input is NaN */
    attn_score_mod by_map[3] = {{.kind = ATTN_SCORE_CALLBACK, .fn = nan_above_fn,
                                 .grad_fn = identity_grad},
                                {.kind = ATTN_SCORE_BIAS, .tensor = bias,
                                 .strides = {0, T * T, T, 1}},
                                {.kind = ATTN_SCORE_SOFTCAP, .value = 5.0}};
    attn_score_mod by_chain[3] = {{.kind = ATTN_SCORE_BIAS, .tensor = hide,
                                   .strides = {0, 0, T, 1}},
                                  {.kind = ATTN_SCORE_BIAS, .tensor = bias,
                                   .strides = {0, T * T, T, 1}},
                                  {.kind = ATTN_SCORE_CALLBACK, .fn = keep_inf_fn,
                                   .grad_fn = nan_at_inf_grad}};
    attn_score_mod *mods = variant ? by_chain : by_map;
    attn_sdpa_config cfg = {.batch = B, .heads = H, .q_tokens = T, .kv_tokens = T, .head_dim = D,
                            .block_mask = map, .score_mods = mods, .score_mod_count = 3};
    for (int run = 0; run < 2; run++) {
        attn_ctx *ctx = run ? fast : ref;
        mods[1].tensor_grad = grad[run];
        CHECK_STATUS(attn_sdpa_forward(ctx, &cfg, q, k, v, out, lse, NULL, NULL), ATTN_OK);
        CHECK_STATUS(attn_sdpa_backward(ctx, &cfg, q, k, v, out, lse, dout, dq, dk, dv, NULL),
                     ATTN_OK);
        bool finite = true;
        for (size_t e = 0; e < (size_t)H * T * T; e++) finite &= isfinite(grad[run][e]) != 0;
        for (size_t e = 0; e < n; e++) finite &= isfinite(dq[e]) && isfinite(dk[e]);
        CHECK(finite);
    }
    double e = rel_l2_floats(grad[1], grad[0], (size_t)H * T * T);
    if (!(e <= 1e-5))
        fprintf(stderr, "hidden NaN inputs (variant %d): bias grad %.3g off the reference\n",
                variant, e);
    CHECK(e <= 1e-5);
    attn_block_mask_free(map);
    attn_mask_free(causal);
    attn_ctx_free(ref);
    free(q), free(k), free(v), free(dout), free(bias), free(out), free(lse), free(dq), free(dk),
        free(dv), free(grad[0]), free(grad[1]), free(hide);
}

static void test_one_pass_bits(attn_ctx *ctx) {
    const size_t B = 2, Hkv = 2, G = 2, H = Hkv * G, T = 20 + below(200), D = 24 + below(3) * 8;
    size_t qn = B * T * H * D, kn = B * T * Hkv * D;
    float *q = alloc_randn(qn, 1.0f), *k = alloc_randn(kn, 1.0f), *v = alloc_randn(kn, 1.0f);
    float *dout = alloc_randn(qn, 1.0f), *out = calloc(qn, sizeof(float));
    float *lse = calloc(B * H * T, sizeof(float)), *dq = calloc(qn, sizeof(float));
    float *dk = calloc(kn, sizeof(float)), *dv = calloc(kn, sizeof(float));
    attn_block_mask_config mc = {1, 1, T, T, 16, 32};
    attn_block_mask *mask = NULL;
    CHECK_STATUS(attn_block_mask_from_fn(ctx, &mc, scattered, NULL, &mask), ATTN_OK);
    attn_score_mod cap = {.kind = ATTN_SCORE_SOFTCAP, .value = 8.0};
    attn_sdpa_config whole = {.batch = B, .heads = H, .kv_heads = Hkv, .q_tokens = T,
                              .kv_tokens = T, .head_dim = D, .block_mask = mask,
                              .score_mods = &cap, .score_mod_count = 1};
    CHECK_STATUS(attn_sdpa_forward(ctx, &whole, q, k, v, out, lse, NULL, NULL), ATTN_OK);
    CHECK_STATUS(attn_sdpa_backward(ctx, &whole, q, k, v, out, lse, dout, dq, dk, dv, NULL),
                 ATTN_OK);
    CHECK(strstr(attn_ctx_last_explain(ctx), "flex [") != NULL);
    size_t sq = T * G * D, sk = T * D;
    float *bufs[12];
    for (int i = 0; i < 12; i++) bufs[i] = calloc(i < 6 ? sq : sk, sizeof(float));
    float *q1 = bufs[0], *dout1 = bufs[1], *out1 = bufs[2], *dq1 = bufs[3], *want_dq = bufs[4];
    float *lse1 = bufs[5], *k1 = bufs[6], *v1 = bufs[7], *dk1 = bufs[8], *dv1 = bufs[9];
    float *want_dk = bufs[10], *want_dv = bufs[11];
    attn_sdpa_config part = whole;
    part.batch = 1, part.heads = G, part.kv_heads = 1;
    bool same = true;
    for (size_t b = 0; b < B; b++)
        for (size_t kh = 0; kh < Hkv; kh++) {
            slice_heads(q, b, T, H, kh * G, G, D, q1);
            slice_heads(dout, b, T, H, kh * G, G, D, dout1);
            slice_heads(k, b, T, Hkv, kh, 1, D, k1);
            slice_heads(v, b, T, Hkv, kh, 1, D, v1);
            CHECK_STATUS(attn_sdpa_forward(ctx, &part, q1, k1, v1, out1, lse1, NULL, NULL),
                         ATTN_OK);
            CHECK_STATUS(attn_sdpa_backward(ctx, &part, q1, k1, v1, out1, lse1, dout1, dq1, dk1,
                                            dv1, NULL),
                         ATTN_OK);
            CHECK(strstr(attn_ctx_last_explain(ctx), "flex [") != NULL);
            slice_heads(dq, b, T, H, kh * G, G, D, want_dq);
            slice_heads(dk, b, T, Hkv, kh, 1, D, want_dk);
            slice_heads(dv, b, T, Hkv, kh, 1, D, want_dv);
            same &= memcmp(dq1, want_dq, sq * sizeof(float)) == 0;
            same &= memcmp(dk1, want_dk, sk * sizeof(float)) == 0;
            same &= memcmp(dv1, want_dv, sk * sizeof(float)) == 0;
        }
    CHECK(same);
    if (!same) fprintf(stderr, "one pass against two: T %zu, D %zu: other bits\n", T, D);
    for (int i = 0; i < 12; i++) free(bufs[i]);
    attn_block_mask_free(mask);
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct sparse_blocks {
    uint64_t salt;
} sparse_blocks;

/* About 10% of the 64 x 64 tiles, whole. */
static int ten_percent(void *user, size_t b, size_t h, size_t i, size_t j) {
    (void)b, (void)h;
    const sparse_blocks *s = user;
    uint64_t z = ((uint64_t)(i / 64) << 32 | (j / 64)) * 0x9E3779B97F4A7C15ull ^ s->salt;
    z = (z ^ (z >> 29)) * 0xBF58476D1CE4E5B9ull;
    return (z >> 40) % 10 == 0;
}

static void bench(attn_ctx *ctx, size_t n) {
    size_t H = 12, D = 64;
    float *q = alloc_randn(n * H * D, 1), *k = alloc_randn(n * H * D, 1);
    float *v = alloc_randn(n * H * D, 1), *out = malloc(n * H * D * sizeof(float));
    attn_block_mask_config mc = {1, 1, n, n, 64, 64};
    sparse_blocks salt = {next_u64()};
    attn_block_mask *mask = NULL;
    if (attn_block_mask_from_fn(ctx, &mc, ten_percent, &salt, &mask) != ATTN_OK) {
        fprintf(stderr, "bench: %s\n", attn_ctx_last_error(ctx));
        CHECK(false);
        return;
    }
    attn_block_mask_info info;
    attn_block_mask_get_info(mask, &info);
    attn_sdpa_config dense = {.batch = 1, .heads = H, .q_tokens = n, .kv_tokens = n,
                              .head_dim = D};
    attn_sdpa_config sparse = dense;
    sparse.block_mask = mask;
    double best[2] = {INFINITY, INFINITY};
    for (int rep = 0; rep < 3; rep++)
        for (int which = 0; which < 2; which++) {
            double t0 = now();
            attn_status st = attn_sdpa_forward(ctx, which ? &sparse : &dense, q, k, v, out, NULL,
                                               NULL, NULL);
            double t = now() - t0;
            CHECK(st == ATTN_OK);
            if (t < best[which]) best[which] = t;
        }
    printf("T = S = %zu, H = %zu, D = %zu forward: dense %.1f ms, %.1f%% block map (%zu tiles, "
           "flex) %.1f ms: %.2fx (target at 8192: 6x)\n",
           n, H, D, 1e3 * best[0], 100.0 - info.sparsity, info.full_blocks + info.partial_blocks,
           1e3 * best[1], best[0] / best[1]);
    attn_block_mask_free(mask);
    free(q), free(k), free(v), free(out);
}

int main(int argc, char **argv) {
    const char *env = getenv("ATTN_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    printf("seed %llu (ATTN_TEST_SEED to repeat)\n", (unsigned long long)seed);
    rng_state = seed;
    attn_ctx *one, *two;
    attn_ctx_config c1 = {.num_threads = 1}, c2 = {.num_threads = 2};
    if (attn_ctx_new(&c1, &one) != ATTN_OK || attn_ctx_new(&c2, &two) != ATTN_OK) return 1;
    if (argc == 3 && !strcmp(argv[1], "--bench")) {
        bench(two, strtoul(argv[2], NULL, 10));
    } else {
        size_t cases = argc == 3 && !strcmp(argv[1], "--cases") ? strtoul(argv[2], NULL, 10) : 40;
        for (size_t i = 0; i < cases; i++) test_case(one, two, i, false);
        for (size_t i = 0; i < cases / 4; i++) test_case(one, two, i, true);
        test_callback_error(one, two);
        test_chain_bad_input(two);
        test_hidden_nan_inputs(two, 0);
        test_hidden_nan_inputs(two, 1);
        test_non_finite(two);
        test_minus_inf_rows(two);
        test_huge_tied_scores(two);
        test_one_hot_rows(two);
        test_softcap_one_key_rows(two);
        test_fixed_features(two);
        for (int round = 0; round < 3; round++) test_one_pass_bits(two);
#if defined(__OPTIMIZE__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
        /* an unoptimised or instrumented build's times say nothing, nor the portable set's */
        if (attn_ctx_kernels(two) != ATTN_KERNELS_PORTABLE) bench(two, 4096);
#endif
    }
    attn_ctx_free(one);
    attn_ctx_free(two);
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}
