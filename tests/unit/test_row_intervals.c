/*
 * test_row_intervals.c — block maps whose rows are single key intervals
 * (attn_block_map's row_lo / row_hi), run by the fused backends through
 * attn_visible_keys as they run causal and windows. Maps are built with
 * attn_block_mask_from_fn from masks written here (visible()).
 *
 *   - a causal map (kv <= q) against cfg.causal with ATTN_ALIGN_TOP_LEFT,
 *     and a window map against cfg.window: out, lse, dq, dk, dv bit for
 *     bit, T == S and T != S;
 *   - key padding (kv < length[b], one length 0: rows that see nothing),
 *     prefix-LM, packed documents (causal within each), documents of the
 *     queries that no key belongs to (rows in the middle that see
 *     nothing), chunked causal: each against this file's float64
 *     attention of the same inputs within 1e-5 relative L2 (out, dq, dk,
 *     dv), lse within 1e-5 (1 + |lse|), -inf and zeros exactly where a
 *     row sees nothing; GQA; 1 and 2 threads bit for bit; the record
 *     (attn_ctx_last_explain) says the fused backend ran, forward and
 *     backward;
 *   - packed documents also against the same documents as a varlen batch
 *     (cu_seqlens, causal) within 1e-6 relative L2; key padding against
 *     each sequence run alone on its own keys, the same;
 *   - bf16: the same masks on bf16-rounded inputs against the float64
 *     attention of those inputs, within 1e-2 relative L2 (two bf16
 *     roundings of out, P and dS at 2^-9 each), lse within 2e-3 (1 +
 *     |lse|), as test_sdpa16.c bounds the bf16 kernels; fused16 runs where
 *     the CPU has avx512_bf16 (forced onto vdpbf16ps), else the problem is
 *     widened and fused runs;
 *   - a map that is not row intervals (every third key hidden; a map that
 *     differs by head) is declined by fused and fused16, by name (fused16
 *     where the ctx has bf16 kernels; elsewhere the widened problem's fused).
 * And a NaN in a key that no query sees, between two query blocks' keys,
 * is declined by fused as the scan would decline it.
 * Fresh random inputs each run: the seed is printed; ATTN_TEST_SEED or
 * argv[1] replays it.
 */
#include "attn.h"
#include "check.h"
#include "half.h"
#include "ops/sdpa16.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { H = 4, HKV = 2, D = 32, MAX_B = 2 };

static uint64_t rng_state;
static double uniform(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) * 0x1p-53 * 2.0 - 1.0;
}

/* ---- masks -------------------------------------------------------------- */

typedef enum mask_kind {
    MASK_CAUSAL,     /* kv <= q */
    MASK_WINDOW,     /* q - left <= kv <= q + right */
    MASK_KV_LENGTH,  /* kv < amount[b] */
    MASK_PREFIX_LM,  /* kv <= q or kv < amount[b] */
    MASK_DOCUMENTS,  /* q_doc == kv_doc (and kv <= q with doc_causal) */
    MASK_CHUNKED,    /* q / chunk == kv / chunk and kv <= q */
    MASK_ROWS,       /* row_lo <= kv < row_hi: any monotone intervals */
    MASK_STRIDED,    /* kv <= q and kv % 3 != 1: not an interval */
    MASK_PER_HEAD    /* kv <= q + h: a map per head */
} mask_kind;

typedef struct mask_desc {
    const char *name;
    mask_kind kind;
    size_t B, T, S;
    int64_t left, right;      /* MASK_WINDOW */
    int64_t amount[MAX_B];    /* MASK_KV_LENGTH: lengths; MASK_PREFIX_LM: prefixes */
    size_t chunk;             /* MASK_CHUNKED */
    const int32_t *q_doc, *kv_doc; /* MASK_DOCUMENTS: (B, T), (B, S) */
    bool doc_causal;
    const int64_t *row_lo, *row_hi; /* MASK_ROWS: (B, T) */
} mask_desc;

static bool visible(const mask_desc *m, size_t b, size_t h, size_t i, size_t j) {
    int64_t q = (int64_t)i, k = (int64_t)j;
    switch (m->kind) {
    case MASK_CAUSAL: return k <= q;
    case MASK_WINDOW: return q - m->left <= k && k <= q + m->right;
    case MASK_KV_LENGTH: return k < m->amount[b];
    case MASK_PREFIX_LM: return k <= q || k < m->amount[b];
    case MASK_DOCUMENTS:
        return m->q_doc[b * m->T + i] == m->kv_doc[b * m->S + j] && (!m->doc_causal || k <= q);
    case MASK_CHUNKED: return q / (int64_t)m->chunk == k / (int64_t)m->chunk && k <= q;
    case MASK_ROWS: return m->row_lo[b * m->T + i] <= k && k < m->row_hi[b * m->T + i];
    case MASK_STRIDED: return k <= q && k % 3 != 1;
    case MASK_PER_HEAD: return k <= q + (int64_t)h;
    }
    return false;
}

static int mask_fn(void *user, size_t b, size_t h, size_t q_idx, size_t kv_idx) {
    return visible(user, b, h, q_idx, kv_idx) ? 1 : 0;
}

static bool per_batch(const mask_desc *m) {
    return m->kind == MASK_KV_LENGTH || m->kind == MASK_PREFIX_LM || m->kind == MASK_DOCUMENTS ||
           m->kind == MASK_ROWS;
}

static attn_block_mask *map_of(attn_ctx *ctx, const mask_desc *m, size_t block) {
    attn_block_mask_config c = {.batch = per_batch(m) ? m->B : 1,
                                .heads = m->kind == MASK_PER_HEAD ? H : 1,
                                .q_len = m->T, .kv_len = m->S, .block_q = block, .block_kv = block};
    attn_block_mask *map = NULL;
    CHECK_STATUS(attn_block_mask_from_fn(ctx, &c, mask_fn, (void *)m, &map), ATTN_OK);
    return map;
}

/* ---- tensors and results ------------------------------------------------ */

typedef struct inputs {
    size_t B, T, S;
    float *q, *k, *v, *dout; /* (B, T, H, D), (B, S, HKV, D) */
} inputs;

typedef struct result {
    float *out, *lse, *dq, *dk, *dv; /* lse (B, H, T) */
} result;

static size_t nq_of(const inputs *in) { return in->B * in->T * H * D; }
static size_t nk_of(const inputs *in) { return in->B * in->S * HKV * D; }

static inputs make_inputs(size_t B, size_t T, size_t S, double amp) {
    inputs in = {B, T, S, malloc(B * T * H * D * 4), malloc(B * S * HKV * D * 4),
                 malloc(B * S * HKV * D * 4), malloc(B * T * H * D * 4)};
    for (size_t e = 0; e < nq_of(&in); e++) {
        in.q[e] = (float)(amp * uniform());
        in.dout[e] = (float)uniform();
    }
    for (size_t e = 0; e < nk_of(&in); e++) {
        in.k[e] = (float)(amp * uniform());
        in.v[e] = (float)uniform();
    }
    return in;
}

static void free_inputs(inputs *in) {
    free(in->q);
    free(in->k);
    free(in->v);
    free(in->dout);
}

static result make_result(const inputs *in) {
    return (result){calloc(nq_of(in), 4), calloc(in->B * H * in->T, 4), calloc(nq_of(in), 4),
                    calloc(nk_of(in), 4), calloc(nk_of(in), 4)};
}

static void free_result(result *r) {
    free(r->out);
    free(r->lse);
    free(r->dq);
    free(r->dk);
    free(r->dv);
}

static attn_sdpa_config config_of(const inputs *in) {
    return (attn_sdpa_config){.batch = in->B, .heads = H, .kv_heads = HKV, .q_tokens = in->T,
                              .kv_tokens = in->S, .head_dim = D, .align = ATTN_ALIGN_TOP_LEFT};
}

/* Whether the record says the fused backend (float or bf16) ran. */
static bool fused_ran(attn_ctx *ctx, const char *label) {
    const char *e = attn_ctx_last_explain(ctx);
    bool ran = (strncmp(e, "fused [", 7) == 0 || strstr(e, "; fused [") != NULL ||
                strstr(e, "fused16 [") != NULL) &&
               strstr(e, "]: ran") != NULL && !strstr(e, "reference: ran");
    if (!ran) fprintf(stderr, "%s: explain '%s' shows no fused run\n", label, e);
    return ran;
}

static void run_f32(attn_ctx *ctx, const attn_sdpa_config *cfg, const inputs *in, result *r,
                    const char *label) {
    CHECK_STATUS(attn_sdpa_forward(ctx, cfg, in->q, in->k, in->v, r->out, r->lse, NULL, NULL),
                 ATTN_OK);
    CHECK(fused_ran(ctx, label));
    CHECK_STATUS(attn_sdpa_backward(ctx, cfg, in->q, in->k, in->v, r->out, r->lse, in->dout, r->dq,
                                    r->dk, r->dv, NULL),
                 ATTN_OK);
    CHECK(fused_ran(ctx, label));
}

static bool same_bits(const result *a, const result *b, const inputs *in) {
    size_t nq = nq_of(in) * 4, nk = nk_of(in) * 4;
    return memcmp(a->out, b->out, nq) == 0 && memcmp(a->lse, b->lse, in->B * H * in->T * 4) == 0 &&
           memcmp(a->dq, b->dq, nq) == 0 && memcmp(a->dk, b->dk, nk) == 0 &&
           memcmp(a->dv, b->dv, nk) == 0;
}

/* ---- the float64 truth -------------------------------------------------- */

typedef struct truth {
    double *out, *lse, *dq, *dk, *dv;
} truth;

/* Attention of in under mask m in double, forward and backward. */
static truth truth_of(const inputs *in, const mask_desc *m) {
    size_t B = in->B, T = in->T, S = in->S, G = H / HKV;
    truth t = {calloc(nq_of(in), 8), calloc(B * H * T, 8), calloc(nq_of(in), 8),
               calloc(nk_of(in), 8), calloc(nk_of(in), 8)};
    double scale = 1.0 / sqrt((double)D), *p = malloc(S * 8), *dp = malloc(S * 8);
    for (size_t b = 0; b < B; b++)
        for (size_t h = 0; h < H; h++)
            for (size_t i = 0; i < T; i++) {
                const float *qi = in->q + ((b * T + i) * H + h) * D;
                const float *doi = in->dout + ((b * T + i) * H + h) * D;
                size_t kvh = h / G;
                double mx = -INFINITY, sum = 0.0;
                for (size_t j = 0; j < S; j++) {
                    p[j] = -INFINITY;
                    if (!visible(m, b, h, i, j)) continue;
                    const float *kj = in->k + ((b * S + j) * HKV + kvh) * D;
                    double s = 0.0;
                    for (size_t d = 0; d < D; d++) s += (double)qi[d] * kj[d];
                    p[j] = s * scale;
                    mx = p[j] > mx ? p[j] : mx;
                }
                double *lse = t.lse + (b * H + h) * T + i;
                if (mx == -INFINITY) {
                    *lse = -INFINITY;
                    continue; /* out, dq zero; no key's gradient */
                }
                for (size_t j = 0; j < S; j++) sum += p[j] == -INFINITY ? 0.0 : exp(p[j] - mx);
                *lse = mx + log(sum);
                double delta = 0.0;
                for (size_t j = 0; j < S; j++) {
                    p[j] = p[j] == -INFINITY ? 0.0 : exp(p[j] - *lse);
                    const float *vj = in->v + ((b * S + j) * HKV + kvh) * D;
                    double dot = 0.0;
                    for (size_t d = 0; d < D; d++) dot += (double)doi[d] * vj[d];
                    dp[j] = dot;
                    delta += p[j] * dot;
                }
                double *out = t.out + ((b * T + i) * H + h) * D, *dq = t.dq + ((b * T + i) * H + h) * D;
                for (size_t j = 0; j < S; j++) {
                    if (p[j] == 0.0) continue;
                    const float *kj = in->k + ((b * S + j) * HKV + kvh) * D;
                    const float *vj = in->v + ((b * S + j) * HKV + kvh) * D;
                    double *dk = t.dk + ((b * S + j) * HKV + kvh) * D;
                    double *dv = t.dv + ((b * S + j) * HKV + kvh) * D;
                    double ds = p[j] * (dp[j] - delta);
                    for (size_t d = 0; d < D; d++) {
                        out[d] += p[j] * vj[d];
                        dq[d] += scale * ds * kj[d];
                        dk[d] += scale * ds * qi[d];
                        dv[d] += p[j] * doi[d];
                    }
                }
            }
    free(p);
    free(dp);
    return t;
}

static void free_truth(truth *t) {
    free(t->out);
    free(t->lse);
    free(t->dq);
    free(t->dk);
    free(t->dv);
}

/* ||got - want|| / ||want|| (the absolute norm where want is zero). */
static double rel_l2(const float *got, const double *want, size_t n) {
    double diff = 0.0, norm = 0.0;
    for (size_t e = 0; e < n; e++) {
        diff += (got[e] - want[e]) * (got[e] - want[e]);
        norm += want[e] * want[e];
    }
    return norm > 0.0 ? sqrt(diff / norm) : sqrt(diff);
}

static double rel_l2_f(const float *got, const float *want, size_t n) {
    double diff = 0.0, norm = 0.0;
    for (size_t e = 0; e < n; e++) {
        diff += ((double)got[e] - want[e]) * ((double)got[e] - want[e]);
        norm += (double)want[e] * want[e];
    }
    return norm > 0.0 ? sqrt(diff / norm) : sqrt(diff);
}

/* r against the truth within tol (relative L2), lse within lse_tol (1 +
 * |lse|); rows that see nothing exactly: lse -inf, out and dq 0. */
static void check_truth(const result *r, const truth *t, const inputs *in, double tol,
                        double lse_tol, const char *label) {
    size_t nq = nq_of(in), nk = nk_of(in);
    const float *got[4] = {r->out, r->dq, r->dk, r->dv};
    const double *want[4] = {t->out, t->dq, t->dk, t->dv};
    const char *names[4] = {"out", "dq", "dk", "dv"};
    for (int x = 0; x < 4; x++) {
        double e = rel_l2(got[x], want[x], x < 2 ? nq : nk);
        if (!(e <= tol)) fprintf(stderr, "%s: %s off by %.3e (tol %.1e)\n", label, names[x], e, tol);
        CHECK(e <= tol);
    }
    double worst = 0.0;
    bool empty_rows_exact = true;
    for (size_t b = 0; b < in->B; b++)
        for (size_t h = 0; h < H; h++)
            for (size_t i = 0; i < in->T; i++) {
                size_t at = (b * H + h) * in->T + i;
                double want_lse = t->lse[at];
                if (isinf(want_lse)) {
                    const float *out = r->out + ((b * in->T + i) * H + h) * D;
                    const float *dq = r->dq + ((b * in->T + i) * H + h) * D;
                    bool zero = r->lse[at] == -INFINITY;
                    for (size_t d = 0; d < D; d++) zero = zero && out[d] == 0.0f && dq[d] == 0.0f;
                    empty_rows_exact = empty_rows_exact && zero;
                    continue;
                }
                double d = fabs(r->lse[at] - want_lse) / (1.0 + fabs(want_lse));
                worst = d > worst || isnan(d) ? d : worst;
            }
    if (!(worst <= lse_tol)) fprintf(stderr, "%s: lse off by %.3e\n", label, worst);
    CHECK(worst <= lse_tol);
    if (!empty_rows_exact) fprintf(stderr, "%s: a row that sees nothing is not 0, -inf\n", label);
    CHECK(empty_rows_exact);
}

/* ---- the cases ---------------------------------------------------------- */

/* Rows of the truth that see nothing (to say a case has them). */
static size_t empty_rows(const truth *t, const inputs *in) {
    size_t n = 0;
    for (size_t e = 0; e < in->B * H * in->T; e++) n += isinf(t->lse[e]) != 0;
    return n;
}

/* The map of m against the truth, on 1 and 2 threads (the same bits);
 * with kept, the inputs and the 1-thread result stay for more checks
 * (false: no map, nothing kept). */
static bool check_map(attn_ctx *one, attn_ctx *two, const mask_desc *m, size_t block,
                      result *kept, inputs *kept_in) {
    attn_block_mask *map = map_of(one, m, block);
    if (!map) return false;
    attn_block_mask_info info;
    CHECK_STATUS(attn_block_mask_get_info(map, &info), ATTN_OK);
    CHECK(info.row_intervals);
    inputs in = make_inputs(m->B, m->T, m->S, 1.5);
    attn_sdpa_config cfg = config_of(&in);
    cfg.block_mask = map;
    result r1 = make_result(&in), r2 = make_result(&in);
    run_f32(one, &cfg, &in, &r1, m->name);
    run_f32(two, &cfg, &in, &r2, m->name);
    CHECK(same_bits(&r1, &r2, &in));
    truth t = truth_of(&in, m);
    check_truth(&r1, &t, &in, 1e-5, 1e-5, m->name);
    printf("  %-34s f32 out %.1e dq %.1e dk %.1e dv %.1e (%zu rows see nothing)\n", m->name,
           rel_l2(r1.out, t.out, nq_of(&in)), rel_l2(r1.dq, t.dq, nq_of(&in)),
           rel_l2(r1.dk, t.dk, nk_of(&in)), rel_l2(r1.dv, t.dv, nk_of(&in)), empty_rows(&t, &in));
    free_truth(&t);
    free_result(&r2);
    if (kept) {
        *kept = r1;
        *kept_in = in;
    } else {
        free_result(&r1);
        free_inputs(&in);
    }
    attn_block_mask_free(map);
    return true;
}

/* A causal map against cfg.causal (top-left), a window map against
 * cfg.window: the same bits, on 1 and 2 threads. */
static void check_fixed_features(attn_ctx *one, attn_ctx *two, size_t T, size_t S) {
    mask_desc causal = {.name = "causal map", .kind = MASK_CAUSAL, .B = 2, .T = T, .S = S};
    mask_desc window = {.name = "window map (37, 5)", .kind = MASK_WINDOW, .B = 2, .T = T, .S = S,
                          .left = 37, .right = 5};
    const mask_desc *masks[2] = {&causal, &window};
    for (int x = 0; x < 2; x++) {
        const mask_desc *m = masks[x];
        inputs in = make_inputs(2, T, S, 1.5);
        attn_sdpa_config fixed = config_of(&in), mapped = config_of(&in);
        if (m->kind == MASK_CAUSAL) {
            fixed.causal = true;
        } else {
            fixed.window = true;
            fixed.window_left = m->left;
            fixed.window_right = m->right;
        }
        attn_block_mask *map = map_of(one, m, 64);
        mapped.block_mask = map;
        attn_ctx *ctxs[2] = {one, two};
        for (int c = 0; c < 2; c++) {
            result a = make_result(&in), b = make_result(&in);
            run_f32(ctxs[c], &fixed, &in, &a, m->name);
            run_f32(ctxs[c], &mapped, &in, &b, m->name);
            bool same = same_bits(&a, &b, &in);
            if (!same)
                fprintf(stderr, "%s T=%zu S=%zu on %d threads: not the fixed feature's bits\n",
                        m->name, T, S, c + 1);
            CHECK(same);
            free_result(&a);
            free_result(&b);
        }
        printf("  %-34s T=%zu S=%zu: the fixed feature's bits\n", m->name, T, S);
        attn_block_mask_free(map);
        free_inputs(&in);
    }
}

/* Packed documents (causal within each) as a map against the same
 * documents as a varlen batch. */
static void check_documents_varlen(attn_ctx *ctx, const result *r, const inputs *in,
                                   const int32_t *cu, size_t docs) {
    size_t longest = 0;
    for (size_t d = 0; d < docs; d++)
        longest = (size_t)(cu[d + 1] - cu[d]) > longest ? (size_t)(cu[d + 1] - cu[d]) : longest;
    attn_sdpa_config cfg = {.batch = docs, .heads = H, .kv_heads = HKV, .q_tokens = longest,
                            .kv_tokens = longest, .head_dim = D, .causal = true,
                            .cu_seqlens_q = cu, .cu_seqlens_kv = cu};
    result v = make_result(in); /* lse (H, total) = (1, H, T) */
    run_f32(ctx, &cfg, in, &v, "documents as varlen");
    size_t nq = nq_of(in), nk = nk_of(in);
    double e[5] = {rel_l2_f(r->out, v.out, nq), rel_l2_f(r->lse, v.lse, H * in->T),
                   rel_l2_f(r->dq, v.dq, nq), rel_l2_f(r->dk, v.dk, nk), rel_l2_f(r->dv, v.dv, nk)};
    for (int x = 0; x < 5; x++) {
        if (!(e[x] <= 1e-6)) fprintf(stderr, "documents vs varlen: tensor %d off by %.3e\n", x, e[x]);
        CHECK(e[x] <= 1e-6);
    }
    printf("  %-34s vs varlen: out %.1e lse %.1e dq %.1e dk %.1e dv %.1e\n", "documents", e[0],
           e[1], e[2], e[3], e[4]);
    free_result(&v);
}

/* Key padding as a map against each sequence alone on its own keys. */
static void check_kv_length_alone(attn_ctx *ctx, const result *r, const inputs *in,
                                  const int64_t *length) {
    for (size_t b = 0; b < in->B; b++) {
        size_t len = (size_t)length[b];
        if (len == 0) continue; /* nothing to run alone: the truth checked its zeros */
        size_t qn = in->T * H * D, kn = len * HKV * D;
        inputs one = {1, in->T, len, in->q + b * qn, malloc(kn * 4), malloc(kn * 4), in->dout + b * qn};
        for (size_t j = 0; j < len; j++) {
            memcpy(one.k + j * HKV * D, in->k + (b * in->S + j) * HKV * D, HKV * D * 4);
            memcpy(one.v + j * HKV * D, in->v + (b * in->S + j) * HKV * D, HKV * D * 4);
        }
        attn_sdpa_config cfg = config_of(&one);
        result a = make_result(&one);
        run_f32(ctx, &cfg, &one, &a, "a sequence alone");
        /* the padded run's dk, dv of this sequence's visible keys */
        float *dk = malloc(kn * 4), *dv = malloc(kn * 4);
        for (size_t j = 0; j < len; j++) {
            memcpy(dk + j * HKV * D, r->dk + (b * in->S + j) * HKV * D, HKV * D * 4);
            memcpy(dv + j * HKV * D, r->dv + (b * in->S + j) * HKV * D, HKV * D * 4);
        }
        double e[5] = {rel_l2_f(r->out + b * qn, a.out, qn),
                       rel_l2_f(r->lse + b * H * in->T, a.lse, H * in->T),
                       rel_l2_f(r->dq + b * qn, a.dq, qn), rel_l2_f(dk, a.dk, kn),
                       rel_l2_f(dv, a.dv, kn)};
        for (int x = 0; x < 5; x++) {
            if (!(e[x] <= 1e-6)) fprintf(stderr, "kv length %zu alone: tensor %d off by %.3e\n", len, x, e[x]);
            CHECK(e[x] <= 1e-6);
        }
        bool pad_zero = true; /* keys past the length: no gradient */
        for (size_t e2 = (b * in->S + len) * HKV * D; e2 < (b + 1) * in->S * HKV * D; e2++)
            pad_zero = pad_zero && r->dk[e2] == 0.0f && r->dv[e2] == 0.0f;
        CHECK(pad_zero);
        free(dk);
        free(dv);
        free(one.k);
        free(one.v);
        free_result(&a);
    }
    printf("  %-34s vs each sequence alone within 1e-6\n", "key padding");
}

/* bf16 round trip of x, in place. */
static void round_bf16(float *x, size_t n) {
    for (size_t e = 0; e < n; e++) x[e] = attn_bf16_to_float(attn_float_to_bf16(x[e]));
}

static bool cpu_has_bf16(void) {
#if defined(__x86_64__) || defined(__i386__)
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
#else
    return false;
#endif
}

/* m's map on bf16 tensors against the truth of the rounded inputs. */
static void check_map_bf16(attn_ctx *one, attn_ctx *two, const mask_desc *m) {
    attn_block_mask *map = map_of(one, m, 64);
    if (!map) return;
    inputs in = make_inputs(m->B, m->T, m->S, 1.5);
    size_t nq = nq_of(&in), nk = nk_of(&in);
    round_bf16(in.q, nq);
    round_bf16(in.dout, nq);
    round_bf16(in.k, nk);
    round_bf16(in.v, nk);
    uint16_t *q = malloc(nq * 2), *k = malloc(nk * 2), *v = malloc(nk * 2), *dout = malloc(nq * 2);
    for (size_t e = 0; e < nq; e++) {
        q[e] = attn_float_to_bf16(in.q[e]);
        dout[e] = attn_float_to_bf16(in.dout[e]);
    }
    for (size_t e = 0; e < nk; e++) {
        k[e] = attn_float_to_bf16(in.k[e]);
        v[e] = attn_float_to_bf16(in.v[e]);
    }
    attn_sdpa_config cfg = config_of(&in);
    cfg.block_mask = map;
    uint16_t *bits[2][4];
    float *lse[2];
    attn_ctx *ctxs[2] = {one, two};
    for (int c = 0; c < 2; c++) {
        uint16_t *out = calloc(nq, 2), *dq = calloc(nq, 2), *dk = calloc(nk, 2), *dv = calloc(nk, 2);
        lse[c] = calloc(in.B * H * in.T, 4);
        CHECK_STATUS(attn_sdpa_forward_16(ctxs[c], &cfg, ATTN_DTYPE_BF16, q, k, v, out, lse[c],
                                          NULL, NULL),
                     ATTN_OK);
        CHECK(fused_ran(ctxs[c], m->name));
        if (cpu_has_bf16()) CHECK(strstr(attn_ctx_last_explain(ctxs[c]), "fused16 [") != NULL);
        CHECK_STATUS(attn_sdpa_backward_16(ctxs[c], &cfg, ATTN_DTYPE_BF16, q, k, v, out, lse[c],
                                           dout, dq, dk, dv, NULL),
                     ATTN_OK);
        CHECK(fused_ran(ctxs[c], m->name));
        bits[c][0] = out;
        bits[c][1] = dq;
        bits[c][2] = dk;
        bits[c][3] = dv;
    }
    bool same = memcmp(lse[0], lse[1], in.B * H * in.T * 4) == 0;
    for (int x = 0; x < 4; x++) same = same && memcmp(bits[0][x], bits[1][x], (x < 2 ? nq : nk) * 2) == 0;
    CHECK(same);
    result r = make_result(&in);
    float *dst[4] = {r.out, r.dq, r.dk, r.dv};
    for (int x = 0; x < 4; x++)
        for (size_t e = 0; e < (x < 2 ? nq : nk); e++) dst[x][e] = attn_bf16_to_float(bits[0][x][e]);
    memcpy(r.lse, lse[0], in.B * H * in.T * 4);
    truth t = truth_of(&in, m);
    check_truth(&r, &t, &in, 1e-2, 2e-3, m->name);
    printf("  %-34s bf16 out %.1e dq %.1e dk %.1e dv %.1e on %s\n", m->name,
           rel_l2(r.out, t.out, nq), rel_l2(r.dq, t.dq, nq), rel_l2(r.dk, t.dk, nk),
           rel_l2(r.dv, t.dv, nk), strstr(attn_ctx_last_explain(one), "fused16 [") ? "fused16" : "widened");
    free_truth(&t);
    free_result(&r);
    for (int c = 0; c < 2; c++) {
        for (int x = 0; x < 4; x++) free(bits[c][x]);
        free(lse[c]);
    }
    free(q);
    free(k);
    free(v);
    free(dout);
    free_inputs(&in);
    attn_block_mask_free(map);
}

/* Maps that are not row intervals: fused and fused16 decline them by name. */
static void check_declined(attn_ctx *ctx) {
    mask_desc strided = {.name = "every third key hidden", .kind = MASK_STRIDED, .B = 1, .T = 96, .S = 96};
    mask_desc per_head = {.name = "a map per head", .kind = MASK_PER_HEAD, .B = 1, .T = 96, .S = 96};
    const mask_desc *masks[2] = {&strided, &per_head};
    for (int x = 0; x < 2; x++) {
        attn_block_mask *map = map_of(ctx, masks[x], 32);
        if (!map) continue;
        attn_block_mask_info info;
        CHECK_STATUS(attn_block_mask_get_info(map, &info), ATTN_OK);
        CHECK(!info.row_intervals);
        inputs in = make_inputs(1, 96, 96, 1.0);
        attn_sdpa_config cfg = config_of(&in);
        cfg.block_mask = map;
        result r = make_result(&in);
        CHECK_STATUS(attn_sdpa_forward(ctx, &cfg, in.q, in.k, in.v, r.out, r.lse, NULL, NULL), ATTN_OK);
        const char *e = attn_ctx_last_explain(ctx);
        bool named = strstr(e, "fused: declined (a block mask)") != NULL;
        if (!named) fprintf(stderr, "%s: explain '%s'\n", masks[x]->name, e);
        CHECK(named);
        uint16_t *q = calloc(nq_of(&in), 2), *k = calloc(nk_of(&in), 2), *v = calloc(nk_of(&in), 2);
        uint16_t *out = calloc(nq_of(&in), 2);
        CHECK_STATUS(attn_sdpa_forward_16(ctx, &cfg, ATTN_DTYPE_BF16, q, k, v, out, r.lse, NULL, NULL),
                     ATTN_OK);
        /* fused16 where the ctx has bf16 kernels; else fused, widened */
        e = attn_ctx_last_explain(ctx);
        named = strstr(e, cpu_has_bf16() ? "fused16: declined (a block mask)"
                                         : "widened to float32: ran; fused: declined (a block mask)") != NULL;
        if (!named) fprintf(stderr, "%s bf16: explain '%s'\n", masks[x]->name, e);
        CHECK(named);
        printf("  %-34s declined by fused and fused16\n", masks[x]->name);
        free(q);
        free(k);
        free(v);
        free(out);
        free_result(&r);
        free_inputs(&in);
        attn_block_mask_free(map);
    }
}

/* Random monotone intervals [lo, hi) for (B, T) rows over S keys: both
 * ends step up by a few keys a row, so that a row's keys may begin after
 * the previous row's. Runs of rows that see nothing (whole row groups)
 * fall inside query blocks; the row after a run begins at or just past
 * the end of the row before it (the builder's row intervals place an
 * empty row there), often within the same few keys, where the backward's
 * key steps span the rows on both sides and the run between them. */
static void random_intervals(size_t B, size_t T, size_t S, int64_t *lo, int64_t *hi) {
    for (size_t b = 0; b < B; b++) {
        int64_t a = 0, z = 1 + (int64_t)(8 * (uniform() + 1.0));
        size_t empty_left = 0;
        for (size_t i = 0; i < T; i++) {
            a += (int64_t)(2.0 * (uniform() + 1.0)); /* 0 .. 3 keys */
            z += (int64_t)(2.5 * (uniform() + 1.0)); /* 0 .. 4 keys */
            if (a > (int64_t)S) a = (int64_t)S;
            if (z > (int64_t)S) z = (int64_t)S;
            if (z < a) z = a;
            if (empty_left == 0 && uniform() > 0.94) {
                empty_left = 8 + (size_t)(8 * (uniform() + 1.0));
                if (i > 0) { /* the next rows resume from the last end */
                    a = hi[b * T + i - 1] + (uniform() > 0.0 ? 0 : 1);
                    z = a + 1 + (int64_t)(20 * (uniform() + 1.0));
                    if (a > (int64_t)S) a = (int64_t)S;
                    if (z > (int64_t)S) z = (int64_t)S;
                }
            }
            bool empty = empty_left > 0;
            empty_left -= empty;
            lo[b * T + i] = a;
            hi[b * T + i] = empty ? a : z;
        }
    }
}

/* A NaN in a key no query sees, between two query blocks' keys: the
 * fused forward measures every key (as the scan would) and declines. */
static void check_unseen_nan(attn_ctx *ctx) {
    enum { NT = 400, NS = 440 };
    int32_t q_doc[NT], kv_doc[NS];
    for (size_t i = 0; i < NT; i++) q_doc[i] = i < 288 ? 0 : 2;
    for (size_t j = 0; j < NS; j++) kv_doc[j] = j < 288 ? 0 : j < 328 ? 7 : 2;
    mask_desc m = {.name = "a NaN in a key no query sees", .kind = MASK_DOCUMENTS, .B = 1,
                   .T = NT, .S = NS, .q_doc = q_doc, .kv_doc = kv_doc};
    attn_block_mask *map = map_of(ctx, &m, 64);
    if (!map) return;
    inputs in = make_inputs(1, NT, NS, 1.0);
    in.k[(300 * HKV + 1) * D + 5] = NAN;
    attn_sdpa_config cfg = config_of(&in);
    cfg.block_mask = map;
    result r = make_result(&in);
    CHECK_STATUS(attn_sdpa_forward(ctx, &cfg, in.q, in.k, in.v, r.out, r.lse, NULL, NULL), ATTN_OK);
    const char *e = attn_ctx_last_explain(ctx);
    bool declined = strstr(e, "]: declined (a non-finite input") != NULL;
    if (!declined) fprintf(stderr, "%s: explain '%s'\n", m.name, e);
    CHECK(declined);
    printf("  %-34s declined by fused\n", m.name);
    free_result(&r);
    free_inputs(&in);
    attn_block_mask_free(map);
}

int main(int argc, char **argv) {
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
    const char *env = getenv("ATTN_TEST_SEED");
    if (env) seed = strtoull(env, NULL, 10);
    if (argc > 1) seed = strtoull(argv[1], NULL, 10);
    printf("seed %llu (ATTN_TEST_SEED or argv[1] to repeat)\n", (unsigned long long)seed);
    rng_state = seed * 2654435761u + 1;

    attn_ctx *one = NULL, *two = NULL;
    CHECK_STATUS(attn_ctx_new(&(attn_ctx_config){.num_threads = 1}, &one), ATTN_OK);
    CHECK_STATUS(attn_ctx_new(&(attn_ctx_config){.num_threads = 2}, &two), ATTN_OK);
    if (!one || !two) return check_summary();
    if (attn_ctx_kernels(one) == ATTN_KERNELS_REFERENCE) {
        printf("the ctx runs the reference kernels: no fused backend to test\n");
        attn_ctx_free(one);
        attn_ctx_free(two);
        return 77;
    }
    attn_sdpa16_force_dot(one);
    attn_sdpa16_force_dot(two);

    /* (1) the fixed features' bits */
    check_fixed_features(one, two, 200, 200);
    check_fixed_features(one, two, 150, 97);
    check_fixed_features(one, two, 97, 330);

    /* (2) masks against the float64 truth */
    enum { T = 300, S = 300 };
    /* packed documents in runs, causal within each, one of a single token */
    static const size_t doc_len[] = {70, 1, 93, 64, 72};
    enum { DOCS = sizeof doc_len / sizeof *doc_len };
    int32_t *docs = malloc(T * sizeof *docs), cu[DOCS + 1] = {0};
    for (size_t d = 0, i = 0; d < DOCS; d++) {
        cu[d + 1] = cu[d] + (int32_t)doc_len[d];
        for (size_t n = 0; n < doc_len[d]; n++) docs[i++] = (int32_t)d;
    }
    /* documents of queries that no key belongs to: rows in the middle and
     * at the end that see nothing; two sequences, T != S */
    enum { XT = 260, XS = 190 };
    int32_t *x_q = malloc(2 * XT * sizeof *x_q), *x_kv = malloc(2 * XS * sizeof *x_kv);
    for (size_t i = 0; i < XT; i++) {
        x_q[i] = i < 50 ? 0 : i < 90 ? 1 : i < 200 ? 2 : 9; /* no key of docs 1, 9 */
        x_q[XT + i] = i < 20 ? 4 : i < 150 ? 5 : 6;         /* no key of doc 4 */
    }
    for (size_t j = 0; j < XS; j++) {
        x_kv[j] = j < 60 ? 0 : 2;
        x_kv[XS + j] = j < 100 ? 5 : 6;
    }
    enum { RT = 330, RS = 310 };
    int64_t *r_lo = malloc(2 * RT * sizeof *r_lo), *r_hi = malloc(2 * RT * sizeof *r_hi);
    random_intervals(2, RT, RS, r_lo, r_hi);
    const mask_desc masks[] = {
        {"random monotone intervals", MASK_ROWS, 2, RT, RS, .row_lo = r_lo, .row_hi = r_hi},
        {"key padding (lengths 211, 0)", MASK_KV_LENGTH, 2, 170, 260, .amount = {211, 0}},
        {"prefix-LM (prefixes 77, 0)", MASK_PREFIX_LM, 2, T, S, .amount = {77, 0}},
        {"prefix-LM T != S (prefix 40)", MASK_PREFIX_LM, 1, 180, 230, .amount = {40}},
        {"packed documents (5, causal)", MASK_DOCUMENTS, 1, T, S, .q_doc = docs, .kv_doc = docs,
         .doc_causal = true},
        {"documents no key belongs to", MASK_DOCUMENTS, 2, XT, XS, .q_doc = x_q, .kv_doc = x_kv},
        {"chunked causal (chunk 48)", MASK_CHUNKED, 1, T, S, .chunk = 48},
        {"chunked causal T != S (chunk 32)", MASK_CHUNKED, 2, 140, 200, .chunk = 32},
        {"window map T != S (0, 3)", MASK_WINDOW, 1, 150, 120, .left = 0, .right = 3},
    };
    enum { MASKS = sizeof masks / sizeof *masks };
    for (size_t x = 0; x < MASKS; x++) {
        const mask_desc *m = &masks[x];
        result kept;
        inputs kept_in;
        bool keep = m->kind == MASK_KV_LENGTH || (m->kind == MASK_DOCUMENTS && m->doc_causal);
        if (!check_map(one, two, m, x % 2 ? 32 : 64, keep ? &kept : NULL, &kept_in) || !keep)
            continue;
        if (m->kind == MASK_KV_LENGTH) check_kv_length_alone(two, &kept, &kept_in, m->amount);
        else check_documents_varlen(two, &kept, &kept_in, cu, DOCS);
        free_result(&kept);
        free_inputs(&kept_in);
    }
    for (size_t x = 0; x < MASKS; x++) check_map_bf16(one, two, &masks[x]);
    check_declined(one);
    check_unseen_nan(one);
    check_unseen_nan(two);

    free(r_lo);
    free(r_hi);
    free(docs);
    free(x_q);
    free(x_kv);
    attn_ctx_free(one);
    attn_ctx_free(two);
    return check_summary();
}
