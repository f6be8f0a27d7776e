/*
 * test_mpi_attention.c — context parallelism against the single-process
 * run, under mpirun -np P (every rank computes the whole problem alone as
 * the oracle, then its chunk across ranks):
 *   sdpa    attn_mpi_sdpa_forward/backward in ring, zigzag and Ulysses mode:
 *           causal and not, T not divisible by 2P (and T < 2P: empty
 *           chunks), GQA and MQA: out and lse within relative L2 1e-6 of
 *           attn_sdpa_forward's, dq, dk, dv within 1e-5 of its backward's
 *           (Ulysses: the same bits).
 *   modules MultiHeadAttention and GPT-2 (attn_mpi_module_forward/backward):
 *           y, dx and every parameter's gradient (Ulysses: y and dx the same
 *           bits).
 *   failure a rank with a bad value: every rank fails with its message,
 *           none hangs; the outputs are untouched. Also a module's
 *           weights written on every rank between its forward and backward.
 *   maps    attn_mpi_sdpa_* with a block map over the whole sequence
 *           (documents, prefix-LM, from_kv_blocks per head, dense random
 *           bool with empty rows, dense per head; GQA; causal and not;
 *           tokens < 2P) in every mode, fresh maps and inputs each run: out, lse, dq, dk,
 *           dv within the sdpa part's bounds of attn_sdpa_* with the same
 *           map.
 *   nonfinite  a NaN key and infinite values, in every mode: NaN and inf
 *           where the single process has them, the rest within the bounds;
 *           Ulysses with one head's value past the fused kernels' range:
 *           every head the single process's bits.
 * usage: test_mpi_attention [sdpa|modules|failure|maps|nonfinite]... (default: all)
 */
#include "attn.h"
#include "attn_mpi.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int rank, nranks, failures;
/* the maps part's seed: fresh each run, the same on every rank */
static uint64_t map_seed;

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float *random_floats(size_t n, uint64_t seed) {
    float *x = malloc((n ? n : 1) * sizeof *x);
    if (!x) {
        fprintf(stderr, "rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((double)(splitmix(&seed) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    return x;
}

static float *zeros(size_t n) {
    float *x = calloc(n ? n : 1, sizeof *x);
    if (!x) MPI_Abort(MPI_COMM_WORLD, 2);
    return x;
}

/* Relative L2 over every rank's part: sum (got - want)^2 / sum want^2. */
static double rel_l2(const float *got, const float *want, size_t n) {
    double s[2] = {0, 0};
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        if (isinf(want[i]) && got[i] == want[i]) continue; /* lse of a row with no key */
        s[0] += d * d;
        s[1] += (double)want[i] * want[i];
    }
    MPI_Allreduce(MPI_IN_PLACE, s, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    if (s[0] != s[0]) return INFINITY;
    return s[1] > 0 ? sqrt(s[0] / s[1]) : sqrt(s[0]);
}

static void expect(bool ok, const char *what, double value, double bound) {
    if (!ok) failures++;
    if (rank == 0)
        printf("  %-44s %.3g %s %.0e%s\n", what, value, ok ? "<=" : ">", bound,
               ok ? "" : "   FAILED");
}

/* Rows [t0, t0 + n) of each (b, h) of a (B, H, T, W) tensor, appended to
 * dst (B, H, local, W) at local offset at. */
static void take_rows(float *dst, const float *src, size_t BH, size_t T, size_t local,
                      size_t t0, size_t n, size_t at, size_t W) {
    for (size_t x = 0; x < BH; x++)
        memcpy(dst + (x * local + at) * W, src + (x * T + t0) * W, n * W * sizeof *dst);
}

/* This rank's chunk of a (B, H, T, W) tensor, by the mode's layout. */
static float *local_of(attn_mpi_mode mode, const float *full, size_t BH, size_t T, size_t W) {
    size_t b[2], e[2], local;
    size_t n = attn_mpi_local_ranges(mode, T, (size_t)nranks, (size_t)rank, b, e, &local);
    float *dst = zeros(BH * local * W);
    for (size_t i = 0, at = 0; i < n; i++) {
        take_rows(dst, full, BH, T, local, b[i], e[i] - b[i], at, W);
        at += e[i] - b[i];
    }
    return dst;
}

/* One case on group g (NULL: a group of its own), with the block map bm
 * (NULL: none) named name, given to the single-process run and the ranks
 * alike. */
/* q's and k's scale in sdpa_run: 1, or large logits (rows nearly one-hot) */
static float logit_scale = 1.0f;

static void sdpa_run(attn_ctx *ctx, attn_mpi_group *g, attn_mpi_mode mode, size_t B, size_t H,
                     size_t Hkv, size_t T, size_t D, bool causal, const attn_block_mask *bm,
                     const char *name) {
    uint64_t seed = 1000 * T + 10 * H + Hkv + (causal ? 7 : 0) + (bm ? map_seed : 0);
    size_t nq = B * H * T * D, nk = B * Hkv * T * D;
    float *q = random_floats(nq, seed), *k = random_floats(nk, seed + 1);
    for (size_t i = 0; i < nq; i++) q[i] *= logit_scale;
    for (size_t i = 0; i < nk; i++) k[i] *= logit_scale;
    float *v = random_floats(nk, seed + 2), *dout = random_floats(nq, seed + 3);
    float *out = zeros(nq), *lse = zeros(B * H * T), *dq = zeros(nq), *dk = zeros(nk),
          *dv = zeros(nk);
    /* the single-process run, (B, H, T, D) contiguous: (b, t, h) strides */
    attn_sdpa_config cfg = {.batch = B, .heads = H, .kv_heads = Hkv, .q_tokens = T,
                            .kv_tokens = T, .head_dim = D, .causal = causal,
                            .q_strides = {H * T * D, D, T * D},
                            .kv_strides = {Hkv * T * D, D, T * D},
                            .out_strides = {H * T * D, D, T * D}, .block_mask = bm};
    if (attn_sdpa_forward(ctx, &cfg, q, k, v, out, lse, NULL, NULL) != ATTN_OK ||
        attn_sdpa_backward(ctx, &cfg, q, k, v, out, lse, dout, dq, dk, dv, NULL) != ATTN_OK) {
        fprintf(stderr, "rank %d: single-process run: %s\n", rank, attn_ctx_last_error(ctx));
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    float *lq = local_of(mode, q, B * H, T, D), *lk = local_of(mode, k, B * Hkv, T, D);
    float *lv = local_of(mode, v, B * Hkv, T, D), *ldo = local_of(mode, dout, B * H, T, D);
    float *want_o = local_of(mode, out, B * H, T, D), *want_l = local_of(mode, lse, B * H, T, 1);
    float *want_dq = local_of(mode, dq, B * H, T, D), *want_dk = local_of(mode, dk, B * Hkv, T, D);
    float *want_dv = local_of(mode, dv, B * Hkv, T, D);
    size_t Tl;
    size_t bb[2], ee[2];
    attn_mpi_local_ranges(mode, T, (size_t)nranks, (size_t)rank, bb, ee, &Tl);
    float *o = zeros(B * H * Tl * D), *l = zeros(B * H * Tl), *gq = zeros(B * H * Tl * D);
    float *gk = zeros(B * Hkv * Tl * D), *gv = zeros(B * Hkv * Tl * D);
    attn_mpi_group *own = NULL;
    attn_mpi_sdpa_config mc = {.batch = B, .heads = H, .kv_heads = Hkv, .tokens = T,
                               .head_dim = D, .causal = causal, .block_mask = bm};
    if ((!g && attn_mpi_group_new(ctx, MPI_COMM_WORLD, mode, &own) != ATTN_OK) ||
        attn_mpi_sdpa_forward(g ? g : own, &mc, lq, lk, lv, o, l) != ATTN_OK ||
        attn_mpi_sdpa_backward(g ? g : own, &mc, lq, lk, lv, o, l, ldo, gq, gk, gv) != ATTN_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, attn_ctx_last_error(ctx));
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (rank == 0)
        printf("%s P=%d B=%zu H=%zu Hkv=%zu T=%zu D=%zu %s%s%s\n", attn_mpi_mode_name(mode),
               nranks, B, H, Hkv, T, D, causal ? "causal" : "full", name ? ", map: " : "",
               name ? name : "");
    /* Ulysses runs each head's attention as the single process does, over
     * the same rows, on the path the whole problem takes: the same bits */
    bool same_bits = mode == ATTN_MPI_ULYSSES;
    double e, fwd = same_bits ? 0.0 : 1e-6, bwd = same_bits ? 0.0 : 1e-5;
    e = rel_l2(o, want_o, B * H * Tl * D);
    expect(e <= fwd, "out  (relative L2)", e, fwd);
    e = rel_l2(l, want_l, B * H * Tl);
    expect(e <= fwd, "lse", e, fwd);
    e = rel_l2(gq, want_dq, B * H * Tl * D);
    expect(e <= bwd, "dq", e, bwd);
    e = rel_l2(gk, want_dk, B * Hkv * Tl * D);
    expect(e <= bwd, "dk", e, bwd);
    e = rel_l2(gv, want_dv, B * Hkv * Tl * D);
    expect(e <= bwd, "dv", e, bwd);
    attn_mpi_group_free(own);
    float *all[] = {q, k, v, dout, out, lse, dq, dk, dv, lq, lk, lv, ldo, want_o, want_l,
                    want_dq, want_dk, want_dv, o, l, gq, gk, gv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
}

static void sdpa_case(attn_ctx *ctx, attn_mpi_mode mode, size_t B, size_t H, size_t Hkv,
                      size_t T, size_t D, bool causal) {
    sdpa_run(ctx, NULL, mode, B, H, Hkv, T, D, causal, NULL, NULL);
}

static void test_sdpa(attn_ctx *ctx) {
    size_t P = (size_t)nranks, H = 2 * P;
    const attn_mpi_mode modes[3] = {ATTN_MPI_RING, ATTN_MPI_ZIGZAG, ATTN_MPI_ULYSSES};
    for (int m = 0; m < 3; m++) {
        attn_mpi_mode mode = modes[m];
        /* T = 2P * 24 + 3: not divisible by P or 2P */
        size_t T = 2 * P * 24 + 3;
        sdpa_case(ctx, mode, 2, H, H, T, 32, true);
        sdpa_case(ctx, mode, 2, H, H, T, 32, false);
        sdpa_case(ctx, mode, 1, H, P, T + 64, 64, true); /* GQA, groups of 2 */
        if (mode != ATTN_MPI_ULYSSES) sdpa_case(ctx, mode, 1, H, 1, T, 16, true); /* MQA */
        sdpa_case(ctx, mode, 1, H, H, P + 1, 16, true); /* tokens < 2P: empty chunks */
        sdpa_case(ctx, mode, 1, H, H, 1, 8, false);     /* one token */
    }
    /* Ulysses' rows are whole: at large logits (q, k x 100, rows nearly
     * one-hot) its backward takes the consistent delta as one process does,
     * and agrees with it (a block's backward_from_lse put dq and dk 1.3e-4 off) */
    logit_scale = 100.0f;
    sdpa_case(ctx, ATTN_MPI_ULYSSES, 1, H, H, 2 * P * 8 + 3, 16, true);
    logit_scale = 1.0f;
}

/* ---- non-finite inputs ------------------------------------------------------------ */

static void need(attn_ctx *ctx, attn_status st);

/* got and want (n floats, this rank's part) agree: NaN where want is, the
 * same infinities, and the finite values within relative L2 bound. */
static void expect_same_nonfinite(const char *what, const float *got, const float *want,
                                  size_t n, double bound) {
    int bad = 0;
    double s[2] = {0, 0};
    for (size_t i = 0; i < n; i++) {
        if (isnan(want[i]) != isnan(got[i]) || (isinf(want[i]) && got[i] != want[i]) ||
            (isinf(got[i]) && got[i] != want[i]))
            bad++;
        else if (isfinite(want[i])) {
            double d = (double)got[i] - want[i];
            s[0] += d * d;
            s[1] += (double)want[i] * want[i];
        }
    }
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, s, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    double e = s[1] > 0 ? sqrt(s[0] / s[1]) : sqrt(s[0]);
    bool ok = bad == 0 && e <= bound;
    if (!ok) failures++;
    if (rank == 0)
        printf("  %-6s %d elements NaN or inf apart, the rest %.3g%s\n", what, bad, e,
               ok ? "" : "   FAILED");
}

/* One element of k (or v) set to value: the ranks' out, lse (and dq, dk,
 * dv where backward) NaN and infinite where the single process's are. */
static void nonfinite_run(attn_ctx *ctx, attn_mpi_mode mode, bool causal, bool in_v,
                          size_t t_at, float value, bool backward) {
    size_t B = 1, H = (size_t)nranks, T = 2 * (size_t)nranks * 4 + 3, D = 8, nq = B * H * T * D;
    float *q = random_floats(nq, 71), *k = random_floats(nq, 72), *v = random_floats(nq, 73);
    float *dout = random_floats(nq, 74);
    (in_v ? v : k)[(1 * T + t_at) * D + 2] = value; /* head 1, token t_at, element 2 */
    float *out = zeros(nq), *lse = zeros(B * H * T), *dq = zeros(nq), *dk = zeros(nq),
          *dv = zeros(nq);
    attn_sdpa_config cfg = {.batch = B, .heads = H, .q_tokens = T, .kv_tokens = T,
                            .head_dim = D, .causal = causal,
                            .q_strides = {H * T * D, D, T * D}, .kv_strides = {H * T * D, D, T * D},
                            .out_strides = {H * T * D, D, T * D}};
    need(ctx, attn_sdpa_forward(ctx, &cfg, q, k, v, out, lse, NULL, NULL));
    if (backward) need(ctx, attn_sdpa_backward(ctx, &cfg, q, k, v, out, lse, dout, dq, dk, dv,
                                               NULL));
    size_t Tl, bb[2], ee[2];
    attn_mpi_local_ranges(mode, T, (size_t)nranks, (size_t)rank, bb, ee, &Tl);
    size_t nl = B * H * Tl * D;
    float *lq = local_of(mode, q, B * H, T, D), *lk = local_of(mode, k, B * H, T, D);
    float *lv = local_of(mode, v, B * H, T, D), *ldo = local_of(mode, dout, B * H, T, D);
    float *o = zeros(nl), *l = zeros(B * H * Tl), *gq = zeros(nl), *gk = zeros(nl),
          *gv = zeros(nl);
    attn_mpi_group *g = NULL;
    attn_mpi_sdpa_config mc = {.batch = B, .heads = H, .tokens = T, .head_dim = D,
                               .causal = causal};
    need(ctx, attn_mpi_group_new(ctx, MPI_COMM_WORLD, mode, &g));
    need(ctx, attn_mpi_sdpa_forward(g, &mc, lq, lk, lv, o, l));
    if (backward) need(ctx, attn_mpi_sdpa_backward(g, &mc, lq, lk, lv, o, l, ldo, gq, gk, gv));
    if (rank == 0)
        printf("%s P=%d T=%zu %s, %s[token %zu] = %g\n", attn_mpi_mode_name(mode), nranks, T,
               causal ? "causal" : "full", in_v ? "v" : "k", t_at, (double)value);
    const float *tensors[5][2] = {{o, out}, {l, lse}, {gq, dq}, {gk, dk}, {gv, dv}};
    const char *names[5] = {"out", "lse", "dq", "dk", "dv"};
    for (int i = 0; i < (backward ? 5 : 2); i++) {
        float *want = local_of(mode, tensors[i][1], B * H, T, i == 1 ? 1 : D);
        expect_same_nonfinite(names[i], tensors[i][0], want, i == 1 ? B * H * Tl : nl,
                              i < 2 ? 1e-6 : 1e-5);
        free(want);
    }
    attn_mpi_group_free(g);
    float *all[] = {q, k, v, dout, out, lse, dq, dk, dv, lq, lk, lv, ldo, o, l, gq, gk, gv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
}

/* Ulysses with one element of one head past the fused kernels' range (in
 * q, k, v or dout): one process runs every head on the reference then, and
 * so must every rank, whose heads are clean on all but one: out, lse, dq,
 * dk and dv the same bits (NaN where it is NaN). */
static void ulysses_one_head_run(attn_ctx *ctx, int which, float value) {
    size_t B = 1, H = 2 * (size_t)nranks, T = 2 * (size_t)nranks * 4 + 5, D = 16;
    size_t nq = B * H * T * D;
    float *x[4] = {random_floats(nq, 81), random_floats(nq, 82), random_floats(nq, 83),
                   random_floats(nq, 84)}; /* q, k, v, dout */
    x[which][(0 * T + 3) * D + 5] = value; /* head 0, token 3, element 5 */
    float *want[5] = {zeros(nq), zeros(B * H * T), zeros(nq), zeros(nq), zeros(nq)};
    attn_sdpa_config cfg = {.batch = B, .heads = H, .q_tokens = T, .kv_tokens = T,
                            .head_dim = D, .causal = true,
                            .q_strides = {H * T * D, D, T * D}, .kv_strides = {H * T * D, D, T * D},
                            .out_strides = {H * T * D, D, T * D}};
    need(ctx, attn_sdpa_forward(ctx, &cfg, x[0], x[1], x[2], want[0], want[1], NULL, NULL));
    need(ctx, attn_sdpa_backward(ctx, &cfg, x[0], x[1], x[2], want[0], want[1], x[3], want[2],
                                 want[3], want[4], NULL));
    size_t Tl, bb[2], ee[2];
    attn_mpi_local_ranges(ATTN_MPI_ULYSSES, T, (size_t)nranks, (size_t)rank, bb, ee, &Tl);
    size_t nl = B * H * Tl * D;
    float *l[4];
    for (int i = 0; i < 4; i++) l[i] = local_of(ATTN_MPI_ULYSSES, x[i], B * H, T, D);
    float *got[5] = {zeros(nl), zeros(B * H * Tl), zeros(nl), zeros(nl), zeros(nl)};
    attn_mpi_group *g = NULL;
    attn_mpi_sdpa_config mc = {.batch = B, .heads = H, .tokens = T, .head_dim = D,
                               .causal = true};
    need(ctx, attn_mpi_group_new(ctx, MPI_COMM_WORLD, ATTN_MPI_ULYSSES, &g));
    need(ctx, attn_mpi_sdpa_forward(g, &mc, l[0], l[1], l[2], got[0], got[1]));
    need(ctx, attn_mpi_sdpa_backward(g, &mc, l[0], l[1], l[2], got[0], got[1], l[3], got[2],
                                     got[3], got[4]));
    static const char *const inputs[4] = {"q", "k", "v", "dout"};
    static const char *const names[5] = {"out", "lse", "dq", "dk", "dv"};
    if (rank == 0)
        printf("ulysses P=%d T=%zu causal, %s[head 0, token 3] = %g: the same bits\n", nranks, T,
               inputs[which], (double)value);
    for (int i = 0; i < 5; i++) {
        size_t n = i == 1 ? B * H * Tl : nl;
        float *w = local_of(ATTN_MPI_ULYSSES, want[i], B * H, T, i == 1 ? 1 : D);
        long apart = 0;
        for (size_t j = 0; j < n; j++)
            if (memcmp(&got[i][j], &w[j], sizeof *w) && !(isnan(got[i][j]) && isnan(w[j])))
                apart++;
        MPI_Allreduce(MPI_IN_PLACE, &apart, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        if (apart) failures++;
        if (rank == 0)
            printf("  %-6s %ld elements of other bits%s\n", names[i], apart,
                   apart ? "   FAILED" : "");
        free(w);
    }
    attn_mpi_group_free(g);
    for (int i = 0; i < 4; i++) free(x[i]), free(l[i]);
    for (int i = 0; i < 5; i++) free(want[i]), free(got[i]);
}

/* NaN and infinities in K and V reach the same rows and elements as in one
 * process: a NaN key, whose rows' weights are NaN in blocks that do not
 * hold it too (their dv), and an infinite value, whose rows stay infinite
 * when the blocks' outputs join. */
static void test_nonfinite(attn_ctx *ctx) {
    const attn_mpi_mode modes[3] = {ATTN_MPI_RING, ATTN_MPI_ZIGZAG, ATTN_MPI_ULYSSES};
    size_t T = 2 * (size_t)nranks * 4 + 3;
    for (int m = 0; m < 3; m++) {
        nonfinite_run(ctx, modes[m], true, false, T / 2, NAN, true);
        nonfinite_run(ctx, modes[m], false, true, 1, INFINITY, false);
        nonfinite_run(ctx, modes[m], false, true, T - 2, -INFINITY, false);
    }
    ulysses_one_head_run(ctx, 0, NAN);
    ulysses_one_head_run(ctx, 1, 1e37f);
    ulysses_one_head_run(ctx, 2, 1e37f);
    ulysses_one_head_run(ctx, 3, INFINITY);
    /* scores of a few hundred in head 0 alone: its rows' lse is too large
     * to weigh with alone, and one process's backward takes its own lse
     * for every row; so does every rank's */
    ulysses_one_head_run(ctx, 1, 1e3f);
    /* a scale past FLT_MAX that rounds to it is taken, as attn_sdpa_* take it;
     * one that rounds to infinity is refused on every rank */
    size_t H = (size_t)nranks, D = 8, Tl, bb[2], ee[2];
    attn_mpi_local_ranges(ATTN_MPI_RING, T, (size_t)nranks, (size_t)rank, bb, ee, &Tl);
    float *x = random_floats(H * Tl * D, 75), *o = zeros(H * Tl * D), *l = zeros(H * Tl);
    attn_mpi_group *g = NULL;
    need(ctx, attn_mpi_group_new(ctx, MPI_COMM_WORLD, ATTN_MPI_RING, &g));
    const double scales[2] = {3.4028235e38, 3.4028236e38};
    for (int i = 0; i < 2; i++) {
        attn_mpi_sdpa_config mc = {.batch = 1, .heads = H, .tokens = T, .head_dim = D,
                                   .scale = scales[i]};
        attn_status st = attn_mpi_sdpa_forward(g, &mc, x, x, x, o, l);
        int ok = i == 0 ? st == ATTN_OK
                        : st == ATTN_ERR_INVALID &&
                              strstr(attn_ctx_last_error(ctx), "beyond float32's range") != NULL;
        MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (!ok) failures++;
        if (rank == 0)
            printf("  scale %.9g: %s%s\n", scales[i], i == 0 ? "taken" : "refused",
                   ok ? "" : "   FAILED");
    }
    attn_mpi_group_free(g);
    free(x), free(o), free(l);
}

/* ---- block maps ---------------------------------------------------------------- */

static void need(attn_ctx *ctx, attn_status st) {
    if (st != ATTN_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, attn_ctx_last_error(ctx));
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
}

/* The maps every rank builds alike (from map_seed), over the whole
 * sequence of T tokens, H heads: */
enum { MAP_DOCUMENT, MAP_PREFIX_LM, MAP_KV_BLOCKS, MAP_DENSE, MAP_PER_HEAD, MAP_KINDS };
static const char *const map_names[MAP_KINDS] = {
    "documents (batch 2, blocks 16 x 16)", "prefix-LM (blocks 32 x 16)",
    "from_kv_blocks per head, partial tiles a window's (blocks 16 x 32)",
    "dense random bool, some rows empty (blocks 16 x 16)",
    "dense random bool per head (blocks 32 x 16)"};

static attn_block_mask *make_map(attn_ctx *ctx, int kind, size_t B, size_t H, size_t T) {
    uint64_t s = map_seed * 31 + (uint64_t)kind;
    attn_block_mask *bm = NULL;
    attn_mask *mask = NULL;
    attn_block_mask_config c = {.batch = 1, .heads = 1, .q_len = T, .kv_len = T,
                                .block_q = 16, .block_kv = 16};
    if (kind == MAP_DOCUMENT) {
        /* documents of 1 .. 60 tokens, their own runs in each sequence */
        int32_t *ids = malloc(B * T * sizeof *ids);
        for (size_t b = 0; b < B; b++)
            for (size_t i = 0, doc = 0, left = 0; i < T; i++, left--) {
                if (!left) {
                    doc++;
                    left = 1 + splitmix(&s) % 60;
                }
                ids[b * T + i] = (int32_t)doc;
            }
        c.batch = B;
        need(ctx, attn_mask_new_document(ctx, ids, NULL, B, T, 0, &mask));
        need(ctx, attn_block_mask_from_mask(ctx, &c, mask, &bm));
        free(ids);
    } else if (kind == MAP_PREFIX_LM) {
        int64_t prefix = (int64_t)(T / 4 + splitmix(&s) % (T / 2));
        c.block_q = 32;
        need(ctx, attn_mask_new_prefix_lm(ctx, &prefix, 1, &mask));
        need(ctx, attn_block_mask_from_mask(ctx, &c, mask, &bm));
    } else if (kind == MAP_KV_BLOCKS) {
        /* each (head, query block) lists random key blocks, partial (the
         * window's elements) or full */
        c.heads = H;
        c.block_kv = 32;
        size_t qb = (T + 15) / 16, kb = (T + 31) / 32, rows = H * qb;
        int32_t *num = calloc(rows, sizeof *num), *idx = calloc(rows * kb, sizeof *idx);
        int32_t *fnum = calloc(rows, sizeof *fnum), *fidx = calloc(rows * kb, sizeof *fidx);
        for (size_t r = 0; r < rows; r++)
            for (size_t k = 0; k < kb; k++) {
                uint64_t x = splitmix(&s) % 4;
                if (x == 1) idx[r * kb + num[r]++] = (int32_t)k;
                if (x == 2) fidx[r * kb + fnum[r]++] = (int32_t)k;
            }
        need(ctx, attn_mask_new_window(ctx, 37, 5, 0, &mask));
        need(ctx, attn_block_mask_from_kv_blocks(ctx, &c, num, idx, kb, fnum, fidx, kb, mask,
                                                 &bm));
        free(num);
        free(idx);
        free(fnum);
        free(fidx);
    } else {
        bool per_head = kind == MAP_PER_HEAD;
        if (per_head) {
            c.heads = H;
            c.block_q = 32;
        }
        size_t n = c.heads * T * T;
        uint8_t *d = malloc(n);
        for (size_t i = 0; i < n; i++) {
            size_t q = i / T % T, k = i % T;
            /* denser near the diagonal, so that tiles of every class occur */
            uint64_t x = splitmix(&s) % 100, near = q > k ? q - k : k - q;
            d[i] = near < 24 ? x < 80 : x < 25;
            if (!per_head && q % 11 == 5) d[i] = 0; /* rows that see nothing */
        }
        size_t st[4] = {0, T * T, T, 1};
        need(ctx, attn_block_mask_from_bool(ctx, &c, d, st, &bm));
        free(d);
    }
    attn_mask_free(mask);
    return bm;
}

/* Every kind of map in every mode, against the single-process run with the
 * same map: one group per mode, so that each call replaces the sub-maps
 * the last kept (and a backward reuses its forward's). Then the same map
 * again after another, and again without causal: the kept sub-maps must
 * follow the map and the pairs causality skipped. */
static void test_maps(attn_ctx *ctx) {
    map_seed = (uint64_t)MPI_Wtime() * 1000003u ^ (uint64_t)clock();
    const char *replay = getenv("ATTN_TEST_SEED"); /* the printed seed, to repeat a run */
    if (replay) map_seed = strtoull(replay, NULL, 10);
    MPI_Bcast(&map_seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("maps: seed %llu\n", (unsigned long long)map_seed);
    size_t P = (size_t)nranks, H = 2 * P, T = 2 * P * 24 + 3, D = 16;
    const attn_mpi_mode modes[3] = {ATTN_MPI_RING, ATTN_MPI_ZIGZAG, ATTN_MPI_ULYSSES};
    attn_block_mask *maps[MAP_KINDS];
    for (int k = 0; k < MAP_KINDS; k++) maps[k] = make_map(ctx, k, 2, H, T);
    /* tokens < 2P: empty chunks, pairs of one token */
    attn_block_mask *tiny = make_map(ctx, MAP_PER_HEAD, 1, H, P + 1);
    for (int m = 0; m < 3; m++) {
        attn_mpi_group *g = NULL;
        need(ctx, attn_mpi_group_new(ctx, MPI_COMM_WORLD, modes[m], &g));
        sdpa_run(ctx, g, modes[m], 2, H, H, T, D, true, maps[MAP_DOCUMENT], map_names[0]);
        sdpa_run(ctx, g, modes[m], 1, H, P, T, D, false, maps[MAP_PREFIX_LM], map_names[1]);
        sdpa_run(ctx, g, modes[m], 1, H, H, T, D, true, maps[MAP_KV_BLOCKS], map_names[2]);
        sdpa_run(ctx, g, modes[m], 1, H, H, T, D, false, maps[MAP_DENSE], map_names[3]);
        sdpa_run(ctx, g, modes[m], 1, H, P, T, D, true, maps[MAP_PER_HEAD], map_names[4]);
        sdpa_run(ctx, g, modes[m], 1, H, H, T, D, true, maps[MAP_KV_BLOCKS], map_names[2]);
        sdpa_run(ctx, g, modes[m], 1, H, H, T, D, false, maps[MAP_KV_BLOCKS], map_names[2]);
        sdpa_run(ctx, g, modes[m], 1, H, H, P + 1, D, true, tiny, map_names[4]);
        attn_mpi_group_free(g);
    }
    for (int k = 0; k < MAP_KINDS; k++) attn_block_mask_free(maps[k]);
    attn_block_mask_free(tiny);
}

/* ---- modules ------------------------------------------------------------------ */

/* x_scale: the inputs' size (1e3: large logits, rows nearly one-hot) */
static void module_case(attn_ctx *ctx, attn_mpi_mode mode, attn_module_kind kind, size_t B,
                        size_t T, float x_scale) {
    size_t P = (size_t)nranks, heads = 2 * P, C = heads * 8;
    attn_module *m[2] = {NULL, NULL}; /* the single process's, the ranks' */
    for (int i = 0; i < 2; i++) {
        attn_rng *rng = NULL;
        attn_status st = attn_rng_new(ctx, 123, &rng);
        if (st == ATTN_OK && kind == ATTN_MODULE_MHA) {
            attn_mha *mha;
            attn_mha_config cfg = {.d_in = C + 3, .d_out = C, .context_length = T,
                                   .num_heads = heads, .qkv_bias = true};
            st = attn_mha_new(ctx, &cfg, rng, &mha);
            m[i] = attn_mha_module(mha);
        } else if (st == ATTN_OK) {
            attn_gpt2 *g2;
            attn_gpt2_config cfg = {.n_embd = C, .n_head = heads, .block_size = T};
            st = attn_gpt2_new(ctx, &cfg, rng, &g2);
            m[i] = attn_gpt2_module(g2);
        }
        attn_rng_free(rng);
        if (st != ATTN_OK) {
            fprintf(stderr, "rank %d: %s\n", rank, attn_ctx_last_error(ctx));
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        attn_module_set_training(m[i], false);
    }
    size_t d_in = attn_module_d_in(m[0]), d_out = attn_module_d_out(m[0]);
    float *x = random_floats(B * T * d_in, 77 + T), *dy = random_floats(B * T * d_out, 78 + T);
    float *y = zeros(B * T * d_out), *dx = zeros(B * T * d_in);
    for (size_t i = 0; i < B * T * d_in; i++) x[i] *= x_scale;
    if (attn_module_forward(m[0], x, B, T, y, NULL) != ATTN_OK ||
        attn_module_backward(m[0], dy, B, T, dx) != ATTN_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, attn_ctx_last_error(ctx));
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    size_t Tl = 0, bb[2], ee[2];
    attn_mpi_local_ranges(mode, T, P, (size_t)rank, bb, ee, &Tl);
    /* (B, T, W) is (B, 1, T, W) for local_of */
    float *lx = local_of(mode, x, B, T, d_in), *ldy = local_of(mode, dy, B, T, d_out);
    float *want_y = local_of(mode, y, B, T, d_out), *want_dx = local_of(mode, dx, B, T, d_in);
    float *ly = zeros(B * Tl * d_out), *ldx = zeros(B * Tl * d_in);
    attn_mpi_group *g = NULL;
    if (attn_mpi_group_new(ctx, MPI_COMM_WORLD, mode, &g) != ATTN_OK ||
        attn_mpi_module_forward(g, m[1], lx, B, T, ly) != ATTN_OK ||
        attn_mpi_module_backward(g, m[1], ldy, ldx) != ATTN_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, attn_ctx_last_error(ctx));
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (rank == 0)
        printf("%s %s P=%d B=%zu T=%zu C=%zu heads=%zu x_scale=%g\n",
               attn_module_class_name(m[0]), attn_mpi_mode_name(mode), nranks, B, T, C, heads,
               (double)x_scale);
    /* Ulysses: each head's attention as one process's module runs it (its
     * rank keeps the heads' row statistics from forward to backward), and
     * the projections row for row: y and dx the same bits */
    bool same_bits = mode == ATTN_MPI_ULYSSES;
    double e = rel_l2(ly, want_y, B * Tl * d_out);
    expect(e <= (same_bits ? 0.0 : 1e-6), "y", e, same_bits ? 0.0 : 1e-6);
    e = rel_l2(ldx, want_dx, B * Tl * d_in);
    expect(e <= (same_bits ? 0.0 : 1e-5), "dx", e, same_bits ? 0.0 : 1e-5);
    /* every rank holds the whole gradient: a rank-local comparison, then
     * the worst over the ranks. A gradient that is zero in exact arithmetic
     * (the key bias: softmax ignores a shift of a row's scores) is rounding
     * residue on both sides, so its error is measured against the norm of
     * all the gradients together */
    double whole = 0.0;
    for (size_t i = 0; i < attn_module_param_count(m[0]); i++) {
        attn_param want;
        attn_module_param_at(m[0], i, &want);
        for (size_t j = 0; j < want.numel; j++) whole += (double)want.grad[j] * want.grad[j];
    }
    whole = sqrt(whole);
    for (size_t i = 0; i < attn_module_param_count(m[0]); i++) {
        attn_param want, got;
        attn_module_param_at(m[0], i, &want);
        attn_module_param_at(m[1], i, &got);
        double s[2] = {0, 0};
        for (size_t j = 0; j < want.numel; j++) {
            double d = (double)got.grad[j] - want.grad[j];
            s[0] += d * d;
            s[1] += (double)want.grad[j] * want.grad[j];
        }
        bool zero = sqrt(s[1]) < 1e-4 * whole;
        double r = sqrt(s[0]) / (zero ? whole : sqrt(s[1]));
        MPI_Allreduce(MPI_IN_PLACE, &r, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        char what[96];
        snprintf(what, sizeof what, "%s.grad%s", want.name, zero ? " (0: vs all grads)" : "");
        expect(r <= 1e-5, what, r, 1e-5);
    }
    attn_mpi_group_free(g);
    attn_module_free(m[0]);
    attn_module_free(m[1]);
    float *all[] = {x, dy, y, dx, lx, ldy, want_y, want_dx, ly, ldx};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
}

static void test_modules(attn_ctx *ctx) {
    size_t P = (size_t)nranks;
    const attn_mpi_mode modes[3] = {ATTN_MPI_RING, ATTN_MPI_ZIGZAG, ATTN_MPI_ULYSSES};
    for (int i = 0; i < 3; i++) {
        module_case(ctx, modes[i], ATTN_MODULE_MHA, 2, 2 * P * 10 + 1, 1.0f);
        module_case(ctx, modes[i], ATTN_MODULE_GPT2, 1, 2 * P * 12 + 5, 1.0f);
    }
    /* large logits: Ulysses keeps one process's exactness there (the ring's
     * blocks of a row cannot: mpi.md) */
    module_case(ctx, ATTN_MPI_ULYSSES, ATTN_MODULE_MHA, 2, 2 * P * 10 + 1, 1e3f);
    module_case(ctx, ATTN_MPI_ULYSSES, ATTN_MODULE_GPT2, 1, 2 * P * 12 + 5, 1e3f);
}

/* ---- failures -------------------------------------------------------------------- */

/* Every rank fails with st and a message naming the failing rank's fault;
 * out untouched. */
static void expect_failure(attn_ctx *ctx, const char *what, attn_status st, const char *needle,
                           const float *out, size_t n) {
    bool ok = st != ATTN_OK && strstr(attn_ctx_last_error(ctx), needle) != NULL;
    for (size_t i = 0; i < n && ok; i++) ok = out[i] == 12345.0f;
    int all = ok;
    MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!ok)
        fprintf(stderr, "rank %d: %s: status %s, message '%s'\n", rank, what,
                attn_status_name(st), attn_ctx_last_error(ctx));
    if (rank == 0) printf("  %-44s %s\n", what, all ? "every rank failed cleanly" : "FAILED");
    if (!all) failures++;
}

/* The same weights on every rank, however many modules each rank drew
 * before (the search for a freed module's address draws a rank's own
 * count). */
static void same_weights(attn_ctx *ctx, attn_module *m) {
    attn_param w0;
    need(ctx, attn_module_param_at(m, 0, &w0));
    for (size_t i = 0; i < attn_module_num_scalars(m); i++)
        w0.data[i] = 0.01f * (float)(i % 17) - 0.08f;
}

static void test_failure(attn_ctx *ctx) {
    if (rank == 0) printf("failure P=%d\n", nranks);
    const attn_mpi_mode modes[3] = {ATTN_MPI_RING, ATTN_MPI_ZIGZAG, ATTN_MPI_ULYSSES};
    size_t H = 2 * (size_t)nranks, T = 50, D = 8;
    for (int m = 0; m < 3; m++) {
        attn_mpi_group *g = NULL;
        if (attn_mpi_group_new(ctx, MPI_COMM_WORLD, modes[m], &g) != ATTN_OK)
            MPI_Abort(MPI_COMM_WORLD, 2);
        size_t Tl, bb[2], ee[2];
        attn_mpi_local_ranges(modes[m], T, (size_t)nranks, (size_t)rank, bb, ee, &Tl);
        size_t n = H * Tl * D;
        float *q = random_floats(n, 1), *o = zeros(n), *l = zeros(H * Tl);
        for (size_t i = 0; i < n; i++) o[i] = 12345.0f;
        attn_mpi_sdpa_config mc = {.batch = 1, .heads = H, .tokens = T, .head_dim = D,
                                   .causal = true};
        int last = nranks - 1;
        char what[96], needle[64];
        /* the last rank passes NULL k */
        attn_status st = attn_mpi_sdpa_forward(g, &mc, q, rank == last ? NULL : q, q, o, l);
        snprintf(what, sizeof what, "%s: rank %d's k is NULL", attn_mpi_mode_name(modes[m]), last);
        snprintf(needle, sizeof needle, "k is NULL");
        expect_failure(ctx, what, st, needle, o, n);
        /* the last rank disagrees on the sequence length */
        attn_mpi_sdpa_config bad = mc;
        if (rank == last) bad.tokens = T + 1;
        st = attn_mpi_sdpa_forward(g, &bad, q, q, q, o, l);
        snprintf(what, sizeof what, "%s: rank %d's tokens differ", attn_mpi_mode_name(modes[m]),
                 last);
        expect_failure(ctx, what, st, "disagree on tokens", o, n);
        /* a size no rank can allocate, on the last rank only: out of memory
         * (or overflow) there, a clean failure everywhere */
        attn_mpi_sdpa_config huge = mc;
        huge.batch = rank == last ? ((size_t)1 << 40) : 1;
        st = attn_mpi_sdpa_forward(g, &huge, q, q, q, o, l);
        snprintf(what, sizeof what, "%s: rank %d cannot hold its batch", attn_mpi_mode_name(modes[m]),
                 last);
        snprintf(needle, sizeof needle, "rank %d", last);
        expect_failure(ctx, what, st, rank == last ? "" : needle, o, n);
        /* a backward before any module forward */
        attn_mha *mha = NULL;
        attn_rng *rng = NULL;
        attn_mha_config cfg = {.d_in = 8, .d_out = 8, .context_length = 64, .num_heads = 2};
        if (attn_rng_new(ctx, 1, &rng) != ATTN_OK || attn_mha_new(ctx, &cfg, rng, &mha) != ATTN_OK)
            MPI_Abort(MPI_COMM_WORLD, 2);
        st = attn_mpi_module_backward(g, attn_mha_module(mha), q, o);
        expect_failure(ctx, "module backward before any forward", st, "no forward", o, 0);
        /* dropout in training mode on one rank only */
        cfg.dropout = rank == last ? 0.5 : 0.0;
        attn_mha *drop = NULL;
        if (attn_mha_new(ctx, &cfg, rng, &drop) != ATTN_OK) MPI_Abort(MPI_COMM_WORLD, 2);
        size_t local;
        attn_mpi_local_ranges(modes[m], 32, (size_t)nranks, (size_t)rank, bb, ee, &local);
        float *x = random_floats(local * 8, 5), *y = zeros(local * 8);
        for (size_t i = 0; i < local * 8; i++) y[i] = 12345.0f;
        st = attn_mpi_module_forward(g, attn_mha_module(drop), x, 1, 32, y);
        expect_failure(ctx, "module forward with dropout on one rank", st, "dropout", y,
                       local * 8);
        /* overlaps the single-process calls refuse, on the last rank only:
         * every rank fails, naming the spans, nothing written */
        st = attn_mpi_module_forward(g, attn_mha_module(mha), x, 1, 32, rank == last ? x : y);
        expect_failure(ctx, "module forward in place on one rank", st, "overlaps", y, local * 8);
        /* a forward without gradients after one with: nothing to
         * differentiate, as in one process, not the earlier forward's
         * activations (the module's 2 heads: Ulysses on 2 ranks only) */
        if (modes[m] != ATTN_MPI_ULYSSES || 2 % nranks == 0) {
            attn_module *mm = attn_mha_module(mha);
            float *dxl = zeros(local * 8);
            for (size_t i = 0; i < local * 8; i++) dxl[i] = 12345.0f;
            need(ctx, attn_mpi_module_forward(g, mm, x, 1, 32, y));
            need(ctx, attn_module_set_grad_enabled(mm, false));
            need(ctx, attn_mpi_module_forward(g, mm, x, 1, 32, y));
            need(ctx, attn_module_set_grad_enabled(mm, true));
            st = attn_mpi_module_backward(g, mm, y, dxl);
            expect_failure(ctx, "module backward after a forward without gradients", st,
                           "no forward", dxl, local * 8);
            /* a weight written on every rank alike between a forward and
             * its backward (an optimizer step): the ranks agree on the
             * weights, and every rank refuses them */
            need(ctx, attn_mpi_module_forward(g, mm, x, 1, 32, y));
            attn_param w0;
            need(ctx, attn_module_param_at(mm, 0, &w0));
            float kept = w0.data[0];
            w0.data[0] = kept + 1.0f;
            st = attn_mpi_module_backward(g, mm, y, dxl);
            expect_failure(ctx, "module backward after a step between", st,
                           "was modified after the forward (version", dxl, local * 8);
            w0.data[0] = kept;
            free(dxl);
        }
        /* a module allocated where a freed one lay, after that one's
         * forward: nothing to differentiate, not the freed one's activations,
         * whether the new module ran in no group or in another group (each
         * group's first forward). Fresh groups: a group that frees an
         * earlier forward's buffers at the forward leaves free blocks beside
         * the module's, and glibc then gives the next module another
         * address (each rank says whether it reused the freed one) */
        for (int other = 0; other < 2 && (modes[m] != ATTN_MPI_ULYSSES || 2 % nranks == 0);
             other++) {
            attn_mpi_group *ga = NULL, *gb = NULL;
            need(ctx, attn_mpi_group_new(ctx, MPI_COMM_WORLD, modes[m], &ga));
            if (other) need(ctx, attn_mpi_group_new(ctx, MPI_COMM_WORLD, modes[m], &gb));
            attn_mha *gone = NULL, *again = NULL;
            cfg.dropout = 0.0;
            if (attn_mha_new(ctx, &cfg, rng, &gone) != ATTN_OK) MPI_Abort(MPI_COMM_WORLD, 2);
            same_weights(ctx, attn_mha_module(gone));
            need(ctx, attn_mpi_module_forward(ga, attn_mha_module(gone), x, 1, 32, y));
            uintptr_t was = (uintptr_t)attn_mha_module(gone);
            attn_mha_free(gone);
            /* the allocator may hand the freed block to a later request:
             * new modules until one lands there, or 32 of them */
            attn_mha *tries[32] = {0};
            size_t n_tries = 0;
            for (; n_tries < 32; n_tries++) {
                if (attn_mha_new(ctx, &cfg, rng, &tries[n_tries]) != ATTN_OK)
                    MPI_Abort(MPI_COMM_WORLD, 2);
                if ((uintptr_t)attn_mha_module(tries[n_tries]) == was) break;
            }
            int reused = n_tries < 32, all_reused = 0;
            again = tries[reused ? n_tries : 0];
            MPI_Allreduce(&reused, &all_reused, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
            float *yb = zeros(local * 8), *dxl = zeros(local * 8);
            if (other) {
                same_weights(ctx, attn_mha_module(again));
                need(ctx, attn_mpi_module_forward(gb, attn_mha_module(again), x, 1, 32, yb));
            }
            for (size_t i = 0; i < local * 8; i++) dxl[i] = 12345.0f;
            st = attn_mpi_module_backward(ga, attn_mha_module(again), y, dxl);
            expect_failure(ctx,
                           other ? "module backward in a group that ran a freed one"
                                 : "module backward of a module where a freed one lay",
                           st, "no forward", dxl, local * 8);
            if (rank == 0 && !all_reused)
                printf("  (the allocator did not reuse the freed module's address on every "
                       "rank)\n");
            free(yb);
            free(dxl);
            for (size_t i = 0; i < n_tries + (size_t)reused; i++) attn_mha_free(tries[i]);
            attn_mpi_group_free(ga);
            attn_mpi_group_free(gb);
        }
        float *k = random_floats(n, 2), *dq = zeros(n), *dk = zeros(n), *dv = zeros(n);
        for (size_t i = 0; i < n; i++) dq[i] = 12345.0f;
        st = attn_mpi_sdpa_backward(g, &mc, q, k, k, o, l, q, dq, dk, rank == last ? dk : dv);
        expect_failure(ctx, "sdpa backward with dk == dv on one rank", st, "overlaps", dq, n);
        free(k);
        free(dq);
        free(dk);
        free(dv);
        free(x);
        free(y);
        attn_mha_free(drop);
        attn_mha_free(mha);
        attn_rng_free(rng);
        free(q);
        free(o);
        free(l);
        attn_mpi_group_free(g);
    }
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    attn_ctx *ctx = NULL;
    if (attn_ctx_new(&(attn_ctx_config){.num_threads = 1}, &ctx) != ATTN_OK)
        MPI_Abort(MPI_COMM_WORLD, 2);
    bool all = argc < 2;
    for (int i = 1; i < argc || all; i++) {
        const char *what = all ? NULL : argv[i];
        if (all || strcmp(what, "sdpa") == 0) test_sdpa(ctx);
        if (all || strcmp(what, "modules") == 0) test_modules(ctx);
        if (all || strcmp(what, "failure") == 0) test_failure(ctx);
        if (all || strcmp(what, "maps") == 0) test_maps(ctx);
        if (all || strcmp(what, "nonfinite") == 0) test_nonfinite(ctx);
        if (all) break;
    }
    MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) printf(failures ? "FAILED: %d checks\n" : "all checks passed\n", failures);
    attn_ctx_free(ctx);
    MPI_Finalize();
    return failures ? 1 : 0;
}
