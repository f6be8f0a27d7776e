/*
 * test_flash.c — the fused attention backend against the reference one.
 *
 * For every instruction set this CPU runs (portable, AVX2, AVX-512) and
 * random problems covering every feature of the attention contract and
 * their combinations — GQA (MQA too), causal and sliding windows (one-sided
 * and (0, 0)), the three diagonals with T != S, softcap, ALiBi, sinks,
 * packed variable-length batches with empty and one-token sequences, no
 * dropout, keep bits or Philox, odd head dims and lengths around the tile
 * edges, padded row strides — attn_attention_fused's out, lse, dq, dk, dv
 * and dsinks are within relative L2 1e-5 of attn_attention_reference's
 * (double-accumulating), and bitwise the same on 1, 2 and 3 threads (told
 * of no L2, 2 MiB and 1 MiB: the lane forward's query blocks then differ on
 * long plain problems, lane_rows). Rows
 * exactly one-hot with each feature of the backward's tiles, in both of its
 * passes' shapes: dq and dk zero to a rounding of a rounding (the
 * consistent delta). Also
 * Philox's known-answer vectors, the kernels' max_abs scan and what
 * declines_values leaves to the reference. Fresh random inputs each run (the
 * seed is printed and replays it):
 *   test_flash [--isa portable|avx2|avx512] [--cases N] [seed [cases]]
 * --isa tests one set of kernels (ctest runs the three as their own tests,
 * in parallel); a set this CPU lacks is a skip (exit code 77).
 * --cases sets the number of random cases (60) with a fresh seed; the
 * sanitized build runs the portable set with fewer (tests/CMakeLists.txt).
 */
#include "attn.h"
#include "attention/attention.h"
#include "check.h"
#include "kernels/flash/flash.h"
#include "rng/philox.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double uniform(uint64_t *s) { return (double)(splitmix(s) >> 11) / 9007199254740992.0; }
static size_t below(uint64_t *s, size_t n) { return (size_t)(uniform(s) * (double)n) % n; }
static bool chance(uint64_t *s, double p) { return uniform(s) < p; }

static double rel_l2(const float *got, const float *want, size_t n) {
    double diff = 0.0, norm = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        diff += d * d;
        norm += (double)want[i] * want[i];
    }
    return norm > 0.0 ? sqrt(diff / norm) : sqrt(diff);
}

static void philox_known_answers(void) {
    /* Random123's kat_vectors for philox4x32-10 */
    const uint32_t cases[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
         0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
         0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    for (int c = 0; c < 3; c++) {
        uint32_t out[4];
        attn_philox4x32_10(cases[c], cases[c] + 4, out);
        CHECK(memcmp(out, cases[c] + 6, sizeof out) == 0);
    }
}

/* A random problem with its inputs, and the buffers both backends write. */
typedef struct flash_case {
    attn_attention_problem p;
    attn_attention_dropout drop;
    bool keep_lse;               /* the backward gets the forward's lse (else recomputes it) */
    size_t q_rows, kv_rows;      /* token rows of the q/out and k/v buffers */
    size_t n_q, n_k, n_v, n_lse; /* floats of each buffer */
    float *q, *k, *v, *dout, *slopes, *sinks;
    int32_t cu_q[16], cu_kv[16]; /* batch + 1 <= 10 */
    uint8_t *bits;
} flash_case;

typedef struct results {
    float *out, *lse, *dq, *dk, *dv, *dsinks;
} results;

static float *random_floats(uint64_t *seed, size_t n, double lo, double hi) {
    float *x = malloc((n ? n : 1) * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * uniform(seed));
    return x;
}

/* Lengths near the tile edges (BR = 64 rows, BC = 16, 32 or 64 keys, lane
 * groups of 16 to 48 rows). */
static size_t random_len(uint64_t *seed, size_t most) {
    static const size_t edges[] = {1,  2,  15, 16, 17, 31, 32, 33,  47,  48,
                                   49, 63, 64, 65, 95, 96, 97, 127, 128, 129};
    if (chance(seed, 0.4)) {
        size_t n = edges[below(seed, sizeof edges / sizeof *edges)];
        return n <= most ? n : most;
    }
    return 1 + below(seed, most);
}

static int64_t random_bound(uint64_t *seed) {
    switch (below(seed, 4)) {
    case 0: return -1;
    case 1: return 0;
    case 2: return (int64_t)below(seed, 8);
    default: return (int64_t)below(seed, 80);
    }
}

/* c points into itself (cu_seqlens): filled in place. */
static void make_case(flash_case *c, uint64_t *seed, int index) {
    *c = (flash_case){0};
    attn_attention_problem *p = &c->p;
    p->batch = 1 + below(seed, 3);
    p->kv_heads = 1 + below(seed, 3);
    size_t groups[] = {1, 1, 2, 3, 4, 6};
    p->q_heads = p->kv_heads * groups[below(seed, 6)];
    if (index % 7 == 3) { /* MQA */
        p->kv_heads = 1;
        p->q_heads = 2 + below(seed, 7);
    }
    /* the lane forward's longer query blocks (lane_rows): one query head
     * per KV head, 8 of them, over 400 rows, plain scores, no left window */
    bool long_blocks = index % 15 == 14;
    if (long_blocks) {
        p->batch = 2;
        p->kv_heads = p->q_heads = 4;
    }
    if (index % 3 == 1) /* batch x KV heads >= 8: the one-pass backward */
        p->batch = 8 / p->kv_heads + below(seed, 2);
    p->head_dim = index % 4 == 0 ? 64 : 1 + below(seed, 80);
    p->v_head_dim = p->head_dim;
    bool varlen = chance(seed, 0.25);
    p->q_len = random_len(seed, index % 3 == 0 ? 150 : 90);
    p->kv_len = chance(seed, 0.5) ? random_len(seed, 150) : p->q_len;
    if (index % 6 == 5) p->q_len = p->kv_len = 128; /* rows of whole 64-element dropout groups */
    else if (index % 10 == 9) {
        /* lengths about a lane forward's query block (288 rows, groups of 16
         * to 48) and the one-pass backward's span of 4 key blocks (256) */
        static const size_t long_lens[] = {255, 256, 257, 287, 288, 289, 337};
        p->q_len = long_lens[below(seed, 7)];
        p->kv_len = chance(seed, 0.5) ? long_lens[below(seed, 7)] : p->q_len;
    }
    if (long_blocks) {
        p->q_len = 400 + below(seed, 200);
        p->kv_len = chance(seed, 0.5) ? 300 + below(seed, 300) : p->q_len;
    }
    p->scale = (float)(chance(seed, 0.8) ? 1.0 / sqrt((double)p->head_dim) : 0.05 + uniform(seed));
    p->causal = chance(seed, 0.5);
    p->renormalize = p->causal && chance(seed, 0.2);
    p->diagonal = (attn_diagonal)below(seed, 3);
    p->q_offset = (int64_t)below(seed, 60) - 20;
    if (chance(seed, 0.35)) {
        p->window = true;
        p->window_left = random_bound(seed);
        p->window_right = random_bound(seed);
    }
    if (chance(seed, 0.3)) p->softcap = (float)(2.0 + 30.0 * uniform(seed));
    if (chance(seed, 0.3)) c->slopes = random_floats(seed, p->q_heads, 0.0, 0.25);
    if (chance(seed, 0.3)) c->sinks = random_floats(seed, p->q_heads, -2.0, 2.0);
    if (long_blocks) { /* plain scores: the lane forward */
        p->window_left = -1;
        p->softcap = 0.0f;
        free(c->slopes);
        free(c->sinks);
        c->slopes = c->sinks = NULL;
    }
    if (index % 30 == 16) {
        /* ALiBi over one key per sequence, seen by the first rows alone
         * (rows at pos in [0, w] or, without causal, pos <= w), in the
         * one pass: the rows that see a key span are a shorter block than
         * the query block the pass packs, and both shift by each row's
         * distance to the key (near, nonzero at pos != 0) */
        p->kv_len = 1;
        p->q_len = 8 + below(seed, 80);
        p->window = true;
        p->window_left = 1 + (int64_t)below(seed, 6);
        p->window_right = -1;
        p->diagonal = ATTN_DIAGONAL_OFFSET;
        p->q_offset = p->causal ? 0 : -(int64_t)below(seed, 3);
        if (!c->slopes) c->slopes = random_floats(seed, p->q_heads, 0.05, 0.25);
    }
    p->alibi_slopes = c->slopes;
    p->sinks = c->sinks;

    size_t Hq = p->q_heads, Hkv = p->kv_heads, D = p->head_dim;
    /* row strides: dense, or padded (a token's heads inside a wider row) */
    size_t q_row = Hq * D + (chance(seed, 0.3) ? below(seed, 9) : 0);
    size_t kv_row = Hkv * D + (chance(seed, 0.3) ? below(seed, 9) : 0);
    if (varlen) {
        /* lengths up to the longest, some empty or of one token; the
         * longest is some sequence's */
        size_t B = p->batch, tq = 0, tk = 0, T = 0, S = 0;
        c->cu_q[0] = c->cu_kv[0] = 0;
        for (size_t b = 0; b < B; b++) {
            size_t lq = chance(seed, 0.15) ? below(seed, 2) : random_len(seed, p->q_len);
            size_t lk = chance(seed, 0.15) ? below(seed, 2) : random_len(seed, p->kv_len);
            if (chance(seed, 0.3)) lk = lq; /* self-attention lengths */
            tq += lq;
            tk += lk;
            T = lq > T ? lq : T;
            S = lk > S ? lk : S;
            c->cu_q[b + 1] = (int32_t)tq;
            c->cu_kv[b + 1] = (int32_t)tk;
        }
        p->q_len = T ? T : 1;
        p->kv_len = S ? S : 1;
        p->cu_seqlens_q = c->cu_q;
        p->cu_seqlens_kv = c->cu_kv;
        p->total_q = tq;
        c->q_rows = tq;
        c->kv_rows = tk;
        p->q.st = (attn_view_strides){0, q_row, D};
        p->k.st = p->v.st = (attn_view_strides){0, kv_row, D};
        p->out.st = (attn_view_strides){0, Hq * D, D};
        c->n_lse = Hq * tq;
    } else {
        c->q_rows = p->batch * p->q_len;
        c->kv_rows = p->batch * p->kv_len;
        p->q.st = (attn_view_strides){p->q_len * q_row, q_row, D};
        p->k.st = p->v.st = (attn_view_strides){p->kv_len * kv_row, kv_row, D};
        p->out.st = (attn_view_strides){p->q_len * Hq * D, Hq * D, D};
        c->n_lse = p->batch * Hq * p->q_len;
    }
    c->n_q = c->q_rows * q_row;
    c->n_k = c->n_v = c->kv_rows * kv_row;
    c->q = random_floats(seed, c->n_q, -1.0, 1.0);
    c->k = random_floats(seed, c->n_k, -1.0, 1.0);
    c->v = random_floats(seed, c->n_v, -1.0, 1.0);
    c->dout = random_floats(seed, c->q_rows * Hq * D, -1.0, 1.0);
    p->q.data = c->q;
    p->k.data = c->k;
    p->v.data = c->v;

    /* dropout: none, keep bits (a Philox mask drawn here), or Philox */
    int drop = long_blocks ? 0 : (int)below(seed, 3);
    double prob = 0.05 + 0.5 * uniform(seed);
    c->drop.kept_scale = (float)(1.0 / (1.0 - prob));
    c->drop.seed = splitmix(seed);
    c->drop.offset = below(seed, 1000);
    c->drop.keep_threshold = attn_philox_keep_threshold(prob);
    size_t n_w = p->batch * Hq * p->q_len * p->kv_len;
    if (drop == 1) {
        c->bits = calloc(n_w / 8 + 1, 1);
        for (size_t e = 0; e < n_w; e++)
            if (attn_philox_dropout_word(c->drop.seed, c->drop.offset, e) < c->drop.keep_threshold)
                c->bits[e >> 3] |= (uint8_t)(1u << (e & 7));
        c->drop.kind = ATTN_DROP_BITS;
        c->drop.keep_bits = c->bits;
    } else {
        c->drop.kind = drop == 2 ? ATTN_DROP_PHILOX : ATTN_DROP_NONE;
    }
    c->keep_lse = chance(seed, 0.7);
}

static void free_case(flash_case *c) {
    free(c->q);
    free(c->k);
    free(c->v);
    free(c->dout);
    free(c->slopes);
    free(c->sinks);
    free(c->bits);
}

static results alloc_results(const flash_case *c) {
    size_t Hq = c->p.q_heads, D = c->p.head_dim;
    results r = {
        .out = calloc(c->q_rows * Hq * D + 1, 4), .lse = calloc(c->n_lse + 1, 4),
        .dq = calloc(c->n_q + 1, 4), .dk = calloc(c->n_k + 1, 4), .dv = calloc(c->n_v + 1, 4),
        .dsinks = calloc(Hq, 4),
    };
    return r;
}

static void free_results(results *r) {
    free(r->out);
    free(r->lse);
    free(r->dq);
    free(r->dk);
    free(r->dv);
    free(r->dsinks);
}

/* One backend's forward then backward on c, into r. */
static void run(const attn_attention_backend *be, attn_ctx *ctx, const flash_case *c, results *r) {
    attn_attention_problem p = c->p;
    p.out.data = r->out;
    p.lse = r->lse;
    attn_attention_trace none = {0};
    void *ws = calloc(1, be->forward_bytes(ctx, &p, &none));
    be->forward(ctx, &p, &c->drop, NULL, ws);
    free(ws);
    if (!c->keep_lse && be == &attn_attention_fused) p.lse = NULL;
    attn_attention_grads g = {.dout = c->dout, .dq = r->dq, .dk = r->dk, .dv = r->dv,
                              .dsinks = p.sinks ? r->dsinks : NULL};
    ws = malloc(be->backward_bytes(ctx, &p));
    memset(ws, 0xff, be->backward_bytes(ctx, &p)); /* NaN: the backend zeroes what it needs */
    be->backward(ctx, &p, &c->drop, &g, ws);
    free(ws);
}

static bool same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * 4) == 0; }

/* A ctx on the stack (a copy of the set's) started its workers on its first
 * parallel call (attn_ctx_pool): join them, as attn_ctx_free would. */
static void ctx_done(attn_ctx *ctx) {
    attn_pool_free(ctx->pool);
    ctx->pool = NULL;
    ctx->pool_tried = false;
}

static void describe(const char *isa, const flash_case *c) {
    const attn_attention_problem *p = &c->p;
    fprintf(stderr,
            "%s: B=%zu Hq=%zu Hkv=%zu T=%zu S=%zu D=%zu varlen=%d causal=%d renorm=%d diag=%d "
            "off=%lld window=%d(%lld,%lld) softcap=%g alibi=%d sinks=%d drop=%d lse=%d\n",
            isa, p->batch, p->q_heads, p->kv_heads, p->q_len, p->kv_len, p->head_dim,
            p->cu_seqlens_q != NULL, p->causal, p->renormalize, (int)p->diagonal,
            (long long)p->q_offset, p->window, (long long)p->window_left,
            (long long)p->window_right, (double)p->softcap, p->alibi_slopes != NULL,
            p->sinks != NULL, (int)c->drop.kind, c->keep_lse);
}

/* dsinks_h = -sum_(b, i) exp(sink_h - lse_i) delta_i, delta_i = dO_i .
 * out_i, sums terms of both signs: its error relative to the sum of their
 * magnitudes (|dO_i| . |out_i| from the reference's out and lse), the
 * largest over h. */
static double sink_error(const flash_case *c, const results *ref, const float *dsinks) {
    const attn_attention_problem *p = &c->p;
    double worst = 0.0;
    for (size_t h = 0; h < p->q_heads; h++) {
        double size = 0.0;
        for (size_t b = 0; b < p->batch; b++) {
            attn_attention_seq s = attn_attention_seq_of(p, b);
            for (size_t i = 0; i < s.q_len; i++) {
                size_t at = attn_view_offset(p->out.st, b, s.q_start, h, i);
                double delta = 0.0;
                for (size_t d = 0; d < p->head_dim; d++)
                    delta += fabs((double)c->dout[at + d] * ref->out[at + d]);
                size += exp((double)p->sinks[h] - ref->lse[attn_lse_index(p, b, h, i)]) * delta;
            }
        }
        double err = fabs((double)dsinks[h] - ref->dsinks[h]) / (size + 1e-30);
        worst = err > worst ? err : worst;
    }
    return worst;
}

/* One random problem: the fused backend on 1, 2 and 3 threads against the
 * reference. Whole buffers are compared: the holes padded strides leave are
 * written by neither backend (zero in both). */
static void one_case(const char *isa, attn_ctx kernels_ctx, uint64_t *seed, int index) {
    flash_case c;
    make_case(&c, seed, index);
    attn_ctx ctx_ref = {.num_threads = 3, .kernels = ATTN_KERNELS_REFERENCE};
    if (getenv("TEST_FLASH_VERBOSE")) describe(isa, &c);
    results ref = alloc_results(&c), fused[3];
    run(&attn_attention_reference, &ctx_ref, &c, &ref);
    for (size_t t = 0; t < 3; t++) {
        attn_ctx ctx = kernels_ctx;
        ctx.num_threads = t + 1;
        /* no L2 known (FBR-row blocks), then 2 MiB and 1 MiB: the lane
         * forward's blocks may differ (lane_rows), its bits may not */
        ctx.l2_bytes = t == 0 ? 0 : (size_t)2 << 20 >> (t - 1);
        fused[t] = alloc_results(&c);
        CHECK(attn_attention_fused.declines(&ctx, &c.p, (attn_pass){.backward = true}) == NULL);
        CHECK(!attn_attention_fused.declines_values(&ctx, &c.p, c.dout));
        run(&attn_attention_fused, &ctx, &c, &fused[t]);
        ctx_done(&ctx);
    }
    size_t n_out = c.q_rows * c.p.q_heads * c.p.head_dim, Hq = c.p.q_heads;
    double e_out = rel_l2(fused[0].out, ref.out, n_out);
    double e_dq = rel_l2(fused[0].dq, ref.dq, c.n_q);
    double e_dk = rel_l2(fused[0].dk, ref.dk, c.n_k);
    double e_dv = rel_l2(fused[0].dv, ref.dv, c.n_v);
    double e_sink = c.p.sinks ? sink_error(&c, &ref, fused[0].dsinks) : 0.0;
    /* lse where finite (rows that see no key hold -inf, or the sink, in both) */
    double e_lse = 0.0;
    bool lse_inf_same = true;
    for (size_t i = 0; i < c.n_lse; i++) {
        if (isinf(ref.lse[i]) || isinf(fused[0].lse[i])) {
            lse_inf_same = lse_inf_same && ref.lse[i] == fused[0].lse[i];
            continue;
        }
        e_lse = check_worse(e_lse, fabs((double)fused[0].lse[i] - ref.lse[i]) /
                                       fmax(1.0, fabs(ref.lse[i])));
    }
    double tol = 1e-5;
    bool ok = e_out <= tol && e_dq <= tol && e_dk <= tol && e_dv <= tol && e_sink <= tol &&
              e_lse <= tol && lse_inf_same;
    CHECK(ok);
    if (!ok) {
        describe(isa, &c);
        fprintf(stderr, "  rel L2 out %.3g dq %.3g dk %.3g dv %.3g dsinks %.3g, lse %.3g (inf rows same: %d)\n",
                e_out, e_dq, e_dk, e_dv, e_sink, e_lse, lse_inf_same);
    }
    for (size_t t = 1; t < 3; t++) {
        bool same = same_bits(fused[t].out, fused[0].out, n_out) &&
                    same_bits(fused[t].lse, fused[0].lse, c.n_lse) &&
                    same_bits(fused[t].dq, fused[0].dq, c.n_q) &&
                    same_bits(fused[t].dk, fused[0].dk, c.n_k) &&
                    same_bits(fused[t].dv, fused[0].dv, c.n_v) &&
                    same_bits(fused[t].dsinks, fused[0].dsinks, Hq);
        CHECK(same);
        if (!same) {
            describe(isa, &c);
            fprintf(stderr, "  %zu threads differ from 1 thread\n", t + 1);
        }
    }
    free_results(&ref);
    for (size_t t = 0; t < 3; t++) free_results(&fused[t]);
    free_case(&c);
}

/* c on the reference (one thread) into *ref and on the fused kernels of
 * kernels_ctx (two threads) into *fused. */
static void run_both(attn_ctx kernels_ctx, const flash_case *c, results *ref, results *fused) {
    attn_ctx ctx_ref = {.num_threads = 1, .kernels = ATTN_KERNELS_REFERENCE};
    attn_ctx ctx = kernels_ctx;
    ctx.num_threads = 2;
    *ref = alloc_results(c);
    *fused = alloc_results(c);
    run(&attn_attention_reference, &ctx_ref, c, ref);
    run(&attn_attention_fused, &ctx, c, fused);
    ctx_done(&ctx);
}

/* The consistent delta (attention.h) on rows exactly one-hot: key j is
 * 30 e_j (plus noise of 0.01) and query i is 30 e_pi(i) for a key pi(i) it
 * sees, so that its scaled score leads the others by ~110 and their
 * weights are 0 (or < 1e-30 with ALiBi) in float. Then dS = P (dP - delta)
 * is 0 in exact arithmetic, and so are dq and dk. delta = dO . O alone
 * left P (dP - delta) at a rounding of dP: max |dq|, |dk| 9e-7 to 7e-6 in
 * every case (measured with the weight threshold out of reach); with the
 * row's own delta what is left is a rounding of that rounding (below
 * 5e-13). Per feature of the backward's tiles (plain, causal, softcap,
 * ALiBi, keep bits, Philox, GQA), in both shapes (batch x KV heads 2: two
 * passes; 4: one pass), max |dq| and |dk| stay under 1e-9; dv (= P^T dO)
 * matches the reference as everywhere. */
static void one_hot_cases(const char *isa, attn_ctx kernels_ctx, uint64_t *seed) {
    const char *features[7] = {"plain", "causal", "softcap", "alibi", "keep bits", "philox", "gqa"};
    for (int feature = 0; feature < 7; feature++)
        for (size_t items = 2; items <= 4; items += 2) {
            flash_case c = {0};
            attn_attention_problem *p = &c.p;
            size_t T = 2 + below(seed, 63), D = 64; /* a key per basis vector */
            p->batch = items / 2;
            p->kv_heads = 2;
            p->q_heads = feature == 6 ? 4 : 2;
            p->head_dim = p->v_head_dim = D;
            p->q_len = p->kv_len = T;
            p->scale = 0.125f;
            p->causal = feature == 1;
            p->softcap = feature == 2 ? 1000.0f : 0.0f;
            if (feature == 3) c.slopes = random_floats(seed, p->q_heads, 0.0, 0.25);
            p->alibi_slopes = c.slopes;
            size_t Hq = p->q_heads, Hkv = p->kv_heads;
            c.q_rows = c.kv_rows = p->batch * T;
            c.n_q = c.q_rows * Hq * D;
            c.n_k = c.n_v = c.kv_rows * Hkv * D;
            c.q = random_floats(seed, c.n_q, -0.01, 0.01);
            c.k = random_floats(seed, c.n_k, -0.01, 0.01);
            c.v = random_floats(seed, c.n_v, -1.0, 1.0);
            c.dout = random_floats(seed, c.n_q, -1.0, 1.0);
            for (size_t b = 0; b < p->batch; b++)
                for (size_t i = 0; i < T; i++) { /* (B, T, H, D) */
                    for (size_t h = 0; h < Hkv; h++) c.k[((b * T + i) * Hkv + h) * D + i] += 30.0f;
                    for (size_t h = 0; h < Hq; h++) { /* a key row i sees */
                        size_t key = below(seed, p->causal ? i + 1 : T);
                        c.q[((b * T + i) * Hq + h) * D + key] += 30.0f;
                    }
                }
            p->q.data = c.q;
            p->k.data = c.k;
            p->v.data = c.v;
            p->q.st = p->out.st = (attn_view_strides){T * Hq * D, Hq * D, D};
            p->k.st = p->v.st = (attn_view_strides){T * Hkv * D, Hkv * D, D};
            c.n_lse = p->batch * Hq * T;
            c.keep_lse = true;
            c.drop.kept_scale = 1.25f;
            c.drop.seed = splitmix(seed);
            c.drop.keep_threshold = attn_philox_keep_threshold(0.2);
            size_t n_w = p->batch * Hq * T * T;
            if (feature == 4) {
                c.bits = calloc(n_w / 8 + 1, 1);
                for (size_t e = 0; e < n_w; e++)
                    if (attn_philox_dropout_word(c.drop.seed, 0, e) < c.drop.keep_threshold)
                        c.bits[e >> 3] |= (uint8_t)(1u << (e & 7));
                c.drop.kind = ATTN_DROP_BITS;
                c.drop.keep_bits = c.bits;
            }
            if (feature == 5) c.drop.kind = ATTN_DROP_PHILOX;
            results ref, fused;
            run_both(kernels_ctx, &c, &ref, &fused);
            float most_dq = 0.0f, most_dk = 0.0f;
            for (size_t e = 0; e < c.n_q; e++) most_dq = fmaxf(most_dq, fabsf(fused.dq[e]));
            for (size_t e = 0; e < c.n_k; e++) most_dk = fmaxf(most_dk, fabsf(fused.dk[e]));
            double e_dv = rel_l2(fused.dv, ref.dv, c.n_v);
            bool ok = most_dq <= 1e-9f && most_dk <= 1e-9f && e_dv <= 1e-5;
            if (getenv("TEST_FLASH_VERBOSE") || !ok)
                printf("  %s one-hot %-9s T=%zu %s: max |dq| %.3g |dk| %.3g, dv rel L2 %.3g\n", isa,
                       features[feature], T, items == 2 ? "two passes" : "one pass", most_dq,
                       most_dk, e_dv);
            CHECK(ok);
            free_results(&ref);
            free_results(&fused);
            free_case(&c);
        }
}

/* A far key whose weight is tiny (e^-40 .. e^-60 in the last row: ALiBi's
 * far keys, or a score far below the others) and whose value is about as
 * large as the weight is small (e^gap times 0.1 .. 10), so that it still
 * moves out, dq and dk by a few percent or more: P (dP - delta) is then not
 * small where P is. dq and dk within 5e-5 of the reference, and each row
 * of dq within 1e-3 (a backward that dropped such weights, as a floor on P
 * would, lost whole rows' gradients: error 1). The far key's float score,
 * near 60 (86 in base 2), carries float32's rounding (its ulp there is
 * 7.6e-6) into its weight, which the heavy value carries into dq and dk:
 * over 4800 draws they reached 3e-5 where few rows average it (T up to 8),
 * a row of dq with ALiBi 1e-4. With and without ALiBi, T = S = 2 .. 40, one
 * KV head. */
static void far_heavy_key_cases(const char *isa, attn_ctx kernels_ctx, uint64_t *seed) {
    for (int alibi = 0; alibi <= 1; alibi++)
        for (int round = 0; round < 4; round++) {
            flash_case c = {0};
            attn_attention_problem *p = &c.p;
            size_t T = 2 + below(seed, 39), D = 16;
            p->batch = 1;
            p->q_heads = p->kv_heads = 1;
            p->head_dim = p->v_head_dim = D;
            p->q_len = p->kv_len = T;
            p->scale = 1.0f;
            p->causal = true;
            c.q_rows = c.kv_rows = T;
            c.n_q = c.n_k = c.n_v = T * D;
            c.q = random_floats(seed, c.n_q, -0.5, 0.5);
            c.k = random_floats(seed, c.n_k, -0.5, 0.5);
            c.v = random_floats(seed, c.n_v, -1.0, 1.0);
            c.dout = random_floats(seed, c.n_q, -1.0, 1.0);
            double gap = 40.0 + 20.0 * uniform(seed);
            double big = exp(gap) * pow(10.0, 2.0 * uniform(seed) - 1.0);
            if (alibi) { /* slope * distance: key 0 is gap below row T - 1's own key */
                c.slopes = malloc(sizeof *c.slopes);
                c.slopes[0] = (float)(gap / (double)(T - 1));
            } else { /* key 0 scores gap below the rest for every row: q . k0 = -gap */
                for (size_t i = 0; i < T; i++) c.q[i * D] = 1.0f;
                for (size_t d = 0; d < D; d++) c.k[d] = d == 0 ? (float)-gap : 0.0f;
            }
            p->alibi_slopes = c.slopes;
            for (size_t d = 0; d < D; d++) c.v[d] *= (float)big; /* key 0's value */
            p->q.data = c.q;
            p->k.data = c.k;
            p->v.data = c.v;
            p->q.st = p->out.st = p->k.st = p->v.st = (attn_view_strides){T * D, D, D};
            c.n_lse = T;
            c.keep_lse = true;
            results ref, fused;
            run_both(kernels_ctx, &c, &ref, &fused);
            double worst = 0.0;
            for (size_t i = 1; i < T; i++) /* row 0 sees key 0 alone: its dq is 0 */
                worst = check_worse(worst, rel_l2(fused.dq + i * D, ref.dq + i * D, D));
            double e_dq = rel_l2(fused.dq, ref.dq, c.n_q), e_dk = rel_l2(fused.dk, ref.dk, c.n_k);
            bool ok = worst <= 1e-3 && e_dq <= 5e-5 && e_dk <= 5e-5;
            if (getenv("TEST_FLASH_VERBOSE") || !ok)
                printf("  %s far heavy key %s T=%zu gap %.1f v x %.3g: dq rel L2 %.3g (worst row "
                       "%.3g), dk %.3g\n",
                       isa, alibi ? "alibi" : "plain", T, gap, big, e_dq, worst, e_dk);
            CHECK(ok);
            free_results(&ref);
            free_results(&fused);
            free_case(&c);
        }
}

/* The scan that sends non-finite inputs to the reference: the largest |x|
 * at every length (whole vectors and tails), and inf for an inf or NaN
 * anywhere. */
static void max_abs_cases(const attn_flash_kernels *fk, uint64_t *seed) {
    float x[80];
    const float poisons[3] = {INFINITY, -INFINITY, NAN};
    for (size_t n = 1; n <= 80; n++) {
        float want = 0.0f;
        for (size_t i = 0; i < n; i++) {
            x[i] = (float)((uniform(seed) - 0.5) * 1e4 * uniform(seed));
            want = fabsf(x[i]) > want ? fabsf(x[i]) : want;
        }
        CHECK(fk->max_abs(x, n, 0.0f) == want);
        CHECK(fk->max_abs(x, n, 2e4f) == 2e4f); /* top when larger */
        size_t at = below(seed, n);
        float kept = x[at];
        x[at] = poisons[n % 3];
        CHECK(isinf(fk->max_abs(x, n, 0.0f)));
        x[at] = kept;
    }
}

/* declines_values: ordinary values taken; NaN or inf in any input, a sink or a
 * slope, or magnitudes past float32's range in the tiles, no. */
static void takes_values_cases(attn_ctx kernels_ctx, uint64_t *seed) {
    attn_ctx ctx = kernels_ctx;
    ctx.num_threads = 2;
    for (int index = 0; index < 8; index++) {
        flash_case c;
        make_case(&c, seed, index);
        if (c.p.cu_seqlens_q) { /* row 0 may be no sequence's */
            free_case(&c);
            continue;
        }
        CHECK(!attn_attention_fused.declines_values(&ctx, &c.p, NULL));
        CHECK(!attn_attention_fused.declines_values(&ctx, &c.p, c.dout));
        float *targets[4] = {c.q, c.k, c.v, c.dout};
        size_t rows[4] = {0, 0, 0, 0}; /* the first row of each is the problem's */
        for (int t = 0; t < 4; t++) {
            float kept = targets[t][rows[t]];
            targets[t][rows[t]] = index % 2 ? NAN : INFINITY;
            CHECK(attn_attention_fused.declines_values(&ctx, &c.p, c.dout));
            targets[t][rows[t]] = 3e19f; /* q . k past float32 */
            if (t < 2 && c.p.head_dim > 0) {
                float kept_other = targets[1 - t][0];
                targets[1 - t][0] = 3e19f;
                CHECK(attn_attention_fused.declines_values(&ctx, &c.p, c.dout));
                targets[1 - t][0] = kept_other;
            }
            targets[t][rows[t]] = kept;
        }
        if (c.sinks) {
            c.sinks[0] = NAN;
            CHECK(attn_attention_fused.declines_values(&ctx, &c.p, NULL));
        }
        if (c.slopes) {
            c.slopes[0] = 1e37f; /* ALiBi's bias past float32 */
            CHECK(attn_attention_fused.declines_values(&ctx, &c.p, NULL));
        }
        free_case(&c);
    }
    ctx_done(&ctx);
}

int main(int argc, char **argv) {
    const char *only_isa = NULL;
    int cases = 60;
    while (argc > 2 && (strcmp(argv[1], "--isa") == 0 || strcmp(argv[1], "--cases") == 0)) {
        if (strcmp(argv[1], "--isa") == 0) only_isa = argv[2];
        else cases = atoi(argv[2]);
        argc -= 2;
        argv += 2;
    }
    struct timespec now;
    timespec_get(&now, TIME_UTC);
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10)
                             : (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
    if (argc > 2) cases = atoi(argv[2]);
    printf("seed %llu\n", (unsigned long long)seed);
    /* each set, and the ctx that takes it */
    const char *names[3] = {"portable", "avx2", "avx512"};
    const attn_flash_kernels *sets[3] = {&attn_flash_portable, NULL, NULL};
    attn_ctx ctxs[3] = {{.kernels = ATTN_KERNELS_PORTABLE}, {.kernels = ATTN_KERNELS_AVX2},
                        {.kernels = ATTN_KERNELS_AVX512}};
#if defined(ATTN_HAVE_X86_KERNELS)
    if (attn_kernels_supported(ATTN_KERNELS_AVX2)) sets[1] = &attn_flash_avx2;
    if (attn_kernels_supported(ATTN_KERNELS_AVX512)) sets[2] = &attn_flash_avx512;
#endif
    for (int s = 0; s < 3; s++) ctxs[s].ks = (attn_kernel_set){.name = names[s], .flash = sets[s]};
    int first = 0, last = 2; /* the sets to test: all, or --isa's */
    if (only_isa) {
        while (first < 3 && strcmp(only_isa, names[first]) != 0) first++;
        if (first == 3) {
            printf("--isa %s: not one of portable, avx2, avx512\n", only_isa);
            return 2;
        }
        if (!sets[first]) {
            printf("skipped: no %s kernels on this CPU or build\n", only_isa);
            return 77;
        }
        last = first;
    }
    for (int s = first; s <= last; s++) {
        if (!sets[s]) continue;
        printf("%s\n", sets[s]->name);
        max_abs_cases(sets[s], &seed);
        takes_values_cases(ctxs[s], &seed);
        for (int i = 0; i < cases; i++) one_case(sets[s]->name, ctxs[s], &seed, i);
        one_hot_cases(sets[s]->name, ctxs[s], &seed);
        far_heavy_key_cases(sets[s]->name, ctxs[s], &seed);
    }
    philox_known_answers();
    return check_summary();
}
