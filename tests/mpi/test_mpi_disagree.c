/*
 * test_mpi_disagree.c — ranks that disagree, under mpirun -np P: the last
 * rank passes another mode, call, size, scale, causality, block map, module
 * or weights than the others. Every rank must fail, with the same message
 * naming the value and the lowest rank on each side ("the ranks disagree
 * on the mode: rank 0 ring, rank 1 ulysses"), no rank may hang (ctest's
 * timeout), and the outputs stay as they were. Then the same calls with
 * every rank alike succeed, so that the checks cannot pass by failing
 * everything.
 * usage: test_mpi_disagree
 */
#include "attn.h"
#include "attn_mpi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, nranks, last, failures;

static float *filled(size_t n, float value) {
    float *x = malloc((n ? n : 1) * sizeof *x);
    if (!x) MPI_Abort(MPI_COMM_WORLD, 2);
    for (size_t i = 0; i < n; i++) x[i] = value + (float)(i % 7) * 0.125f;
    return x;
}

/* Every rank failed, its message holds want (the same text on every rank),
 * and out (n floats, may be NULL) still holds 12345. */
static void expect_disagreement(attn_ctx *ctx, const char *what, attn_status st,
                                const char *want, const float *out, size_t n) {
    const char *msg = attn_ctx_last_error(ctx);
    bool ok = st != ATTN_OK && strstr(msg, want) != NULL;
    for (size_t i = 0; i < n && ok; i++) ok = out[i] == 12345.0f;
    if (!ok)
        fprintf(stderr, "rank %d: %s: status %s, message '%s' (want '%s')\n", rank, what,
                attn_status_name(st), msg, want);
    int all = ok;
    MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (rank == 0) printf("  %-52s %s\n", what, all ? "every rank: the same clear error" : "FAILED");
    if (!all) failures++;
}

static void expect_ok(attn_ctx *ctx, const char *what, attn_status st) {
    int all = st == ATTN_OK;
    if (!all) fprintf(stderr, "rank %d: %s: %s\n", rank, what, attn_ctx_last_error(ctx));
    MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (rank == 0) printf("  %-52s %s\n", what, all ? "ok on every rank" : "FAILED");
    if (!all) failures++;
}

static void test_group(attn_ctx *ctx) {
    const attn_mpi_mode pairs[3][2] = {{ATTN_MPI_RING, ATTN_MPI_ULYSSES},
                                       {ATTN_MPI_RING, ATTN_MPI_ZIGZAG},
                                       {ATTN_MPI_ZIGZAG, ATTN_MPI_ULYSSES}};
    for (int i = 0; i < 3; i++) {
        attn_mpi_group *g = NULL;
        attn_mpi_mode mode = pairs[i][rank == last];
        attn_status st = attn_mpi_group_new(ctx, MPI_COMM_WORLD, mode, &g);
        char what[96], want[128];
        snprintf(what, sizeof what, "group: %s, rank %d %s", attn_mpi_mode_name(pairs[i][0]), last,
                 attn_mpi_mode_name(pairs[i][1]));
        snprintf(want, sizeof want, "the ranks disagree on the mode: rank 0 %s, rank %d %s",
                 attn_mpi_mode_name(pairs[i][0]), last, attn_mpi_mode_name(pairs[i][1]));
        expect_disagreement(ctx, what, st, want, NULL, 0);
        if (g != NULL) failures++; /* a failed group_new leaves *out NULL */
        attn_mpi_group_free(g);
    }
    /* a mode that is none, on the last rank or on all: every rank fails,
     * where the others used to wait in the collective calls for it */
    for (int all = 0; all < 2; all++) {
        attn_mpi_group *g = NULL;
        attn_mpi_mode mode = all || rank == last ? (attn_mpi_mode)7 : ATTN_MPI_RING;
        attn_status st = attn_mpi_group_new(ctx, MPI_COMM_WORLD, mode, &g);
        char want[128];
        if (all)
            snprintf(want, sizeof want, "mode (7) is not ring, zigzag or ulysses");
        else
            snprintf(want, sizeof want, "the ranks disagree on the mode: rank 0 ring, rank %d ?",
                     last);
        expect_disagreement(ctx, all ? "group: mode 7 on every rank" : "group: mode 7 on the last",
                            st, want, NULL, 0);
        if (g != NULL) failures++;
        attn_mpi_group_free(g);
    }
}

/* The SDPA calls over a (1, H, T, D) sequence. */
static void test_sdpa(attn_ctx *ctx, attn_mpi_mode mode) {
    size_t H = 2 * (size_t)nranks, T = 29, D = 8, Tl = 0, b[2], e[2];
    attn_mpi_local_ranges(mode, T, (size_t)nranks, (size_t)rank, b, e, &Tl);
    size_t n = H * Tl * D;
    float *q = filled(n, 0.25f), *out = filled(n, 0.0f), *lse = filled(H * Tl, 0.0f);
    float *d = filled(3 * n, 0.0f);
    attn_mpi_group *g = NULL;
    if (attn_mpi_group_new(ctx, MPI_COMM_WORLD, mode, &g) != ATTN_OK) MPI_Abort(MPI_COMM_WORLD, 2);
    attn_mpi_sdpa_config base = {.batch = 1, .heads = H, .tokens = T, .head_dim = D,
                                 .causal = true};
    const char *m = attn_mpi_mode_name(mode);
    char what[96], want[160];
    struct {
        const char *name, *want;
        attn_mpi_sdpa_config last_cfg;
    } cases[] = {
        {"scale", "disagree on scale: rank 0 0.353553385, rank %d 0.5", base},
        {"causal", "disagree on causal: rank 0 1, rank %d 0", base},
        {"head_dim", "disagree on head_dim: rank 0 8, rank %d 4", base},
        {"kv_heads", "disagree on kv_heads: rank 0 %zu, rank %d %zu", base},
    };
    cases[0].last_cfg.scale = 0.5;
    cases[1].last_cfg.causal = false;
    cases[2].last_cfg.head_dim = 4;
    cases[3].last_cfg.kv_heads = H / 2; /* divisible by P: Ulysses runs it too */
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        for (size_t i = 0; i < n; i++) out[i] = 12345.0f;
        attn_mpi_sdpa_config cfg = rank == last ? cases[c].last_cfg : base;
        attn_status st = attn_mpi_sdpa_forward(g, &cfg, q, q, q, out, lse);
        snprintf(what, sizeof what, "%s sdpa: rank %d's %s differs", m, last, cases[c].name);
        if (c == 3) snprintf(want, sizeof want, cases[c].want, H, last, H / 2);
        else snprintf(want, sizeof want, cases[c].want, last);
        expect_disagreement(ctx, what, st, want, out, n);
    }
    /* a forward on the other ranks, a backward on the last */
    for (size_t i = 0; i < n; i++) out[i] = 12345.0f;
    attn_status st;
    if (rank == last) {
        for (size_t i = 0; i < 3 * n; i++) d[i] = 12345.0f;
        st = attn_mpi_sdpa_backward(g, &base, q, q, q, q, lse, q, d, d + n, d + 2 * n);
    } else {
        st = attn_mpi_sdpa_forward(g, &base, q, q, q, out, lse);
    }
    snprintf(what, sizeof what, "%s sdpa: rank %d runs the backward", m, last);
    snprintf(want, sizeof want,
             "the ranks disagree on the call: rank 0 attn_mpi_sdpa_forward, rank %d "
             "attn_mpi_sdpa_backward",
             last);
    expect_disagreement(ctx, what, st, want, rank == last ? d : out, rank == last ? 3 * n : n);
    /* a scatter on the other ranks, a gather on the last */
    size_t W = 5;
    float *whole = filled(T * W, 1.0f), *part = filled(Tl * W, 0.0f);
    for (size_t i = 0; i < T * W; i++) whole[i] = 12345.0f;
    for (size_t i = 0; i < Tl * W; i++) part[i] = 12345.0f;
    st = rank == last ? attn_mpi_gather_tokens(g, 0, part, 1, T, W, whole)
                      : attn_mpi_scatter_tokens(g, 0, whole, 1, T, W, part);
    snprintf(what, sizeof what, "%s: rank %d gathers, the others scatter", m, last);
    snprintf(want, sizeof want,
             "the ranks disagree on the call: rank 0 attn_mpi_scatter_tokens, rank %d "
             "attn_mpi_gather_tokens",
             last);
    expect_disagreement(ctx, what, st, want, rank == last ? whole : part,
                        rank == last ? 0 : Tl * W);
    /* alike: it runs */
    st = attn_mpi_sdpa_forward(g, &base, q, q, q, out, lse);
    snprintf(what, sizeof what, "%s sdpa: every rank alike", m);
    expect_ok(ctx, what, st);
    attn_mpi_group_free(g);
    free(q);
    free(out);
    free(lse);
    free(d);
    free(whole);
    free(part);
}

static attn_module *mha(attn_ctx *ctx, uint64_t seed, size_t C, size_t heads,
                        attn_mask_method mask) {
    attn_rng *rng = NULL;
    attn_mha *m = NULL;
    attn_mha_config cfg = {.d_in = C, .d_out = C, .context_length = 64, .num_heads = heads,
                           .mask = mask};
    if (attn_rng_new(ctx, seed, &rng) != ATTN_OK || attn_mha_new(ctx, &cfg, rng, &m) != ATTN_OK)
        MPI_Abort(MPI_COMM_WORLD, 2);
    attn_rng_free(rng);
    attn_module_set_training(attn_mha_module(m), false);
    return attn_mha_module(m);
}

static attn_module *gpt2(attn_ctx *ctx, uint64_t seed, size_t C, size_t heads) {
    attn_rng *rng = NULL;
    attn_gpt2 *m = NULL;
    attn_gpt2_config cfg = {.n_embd = C, .n_head = heads, .block_size = 64};
    if (attn_rng_new(ctx, seed, &rng) != ATTN_OK || attn_gpt2_new(ctx, &cfg, rng, &m) != ATTN_OK)
        MPI_Abort(MPI_COMM_WORLD, 2);
    attn_rng_free(rng);
    attn_module_set_training(attn_gpt2_module(m), false);
    return attn_gpt2_module(m);
}

static void test_modules(attn_ctx *ctx, attn_mpi_mode mode) {
    size_t P = (size_t)nranks, heads = 2 * P, C = 4 * heads, T = 23, Tl = 0, b[2], e[2];
    attn_mpi_local_ranges(mode, T, P, (size_t)rank, b, e, &Tl);
    float *x = filled(Tl * C, -0.5f), *y = filled(Tl * C, 12345.0f), *dx = filled(Tl * C, 12345.0f);
    attn_mpi_group *g = NULL;
    if (attn_mpi_group_new(ctx, MPI_COMM_WORLD, mode, &g) != ATTN_OK) MPI_Abort(MPI_COMM_WORLD, 2);
    const char *m = attn_mpi_mode_name(mode);
    char what[96], want[160];
    attn_module *same = mha(ctx, 7, C, heads, ATTN_MASK_NEG_INF);
    struct {
        const char *name, *want;
        attn_module *last_module;
    } cases[] = {
        {"seed", "disagree on the weights' checksum: rank 0 0x", mha(ctx, 8, C, heads, ATTN_MASK_NEG_INF)},
        {"module kind", "disagree on the module: rank 0 MultiHeadAttention, rank %d CausalSelfAttention",
         gpt2(ctx, 7, C, heads)},
        {"causality", "disagree on causal: rank 0 1, rank %d 0", mha(ctx, 7, C, heads, ATTN_MASK_NONE)},
        {"heads", "disagree on heads: rank 0 %zu, rank %d %zu", mha(ctx, 7, C, heads / 2, ATTN_MASK_NEG_INF)},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        for (size_t i = 0; i < Tl * C; i++) y[i] = 12345.0f;
        attn_module *mod = rank == last ? cases[c].last_module : same;
        attn_status st = attn_mpi_module_forward(g, mod, x, 1, T, y);
        snprintf(what, sizeof what, "%s module: rank %d's %s differs", m, last, cases[c].name);
        if (c == 3) snprintf(want, sizeof want, cases[c].want, heads, last, heads / 2);
        else snprintf(want, sizeof want, cases[c].want, last);
        expect_disagreement(ctx, what, st, want, y, Tl * C);
    }
    /* the weights changed on one rank between the forward and the backward */
    attn_status st = attn_mpi_module_forward(g, same, x, 1, T, y);
    expect_ok(ctx, "module forward, every rank alike", st);
    attn_param p;
    attn_module_param_at(same, 0, &p);
    float keep = p.data[0];
    if (rank == last) p.data[0] += 1.0f;
    for (size_t i = 0; i < Tl * C; i++) dx[i] = 12345.0f;
    st = attn_mpi_module_backward(g, same, y, dx);
    snprintf(what, sizeof what, "%s module: rank %d's weights change before the backward", m, last);
    expect_disagreement(ctx, what, st, "disagree on the weights' checksum", dx, Tl * C);
    p.data[0] = keep;
    /* a forward on the other ranks, a backward on the last */
    for (size_t i = 0; i < Tl * C; i++) y[i] = dx[i] = 12345.0f;
    st = rank == last ? attn_mpi_module_backward(g, same, x, dx)
                      : attn_mpi_module_forward(g, same, x, 1, T, y);
    snprintf(what, sizeof what, "%s module: rank %d runs the backward", m, last);
    snprintf(want, sizeof want,
             "the ranks disagree on the call: rank 0 attn_mpi_module_forward, rank %d "
             "attn_mpi_module_backward",
             last);
    expect_disagreement(ctx, what, st, want, rank == last ? dx : y, Tl * C);
    st = attn_mpi_module_backward(g, same, x, dx);
    expect_ok(ctx, "module backward, every rank alike", st);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) attn_module_free(cases[c].last_module);
    attn_module_free(same);
    attn_mpi_group_free(g);
    free(x);
    free(y);
    free(dx);
}

static void test_agree(attn_ctx *ctx) {
    attn_mpi_group *g = NULL;
    if (attn_mpi_group_new(ctx, MPI_COMM_WORLD, ATTN_MPI_RING, &g) != ATTN_OK)
        MPI_Abort(MPI_COMM_WORLD, 2);
    char want[160];
    attn_mpi_value v[2] = {{"--seed", NULL, 1}, {"--module", "mha", 0}};
    expect_ok(ctx, "group_agree: alike", attn_mpi_group_agree(g, "prog", v, 2));
    if (rank == last) v[0].number = 2;
    snprintf(want, sizeof want, "prog: the ranks disagree on --seed: rank 0 1, rank %d 2", last);
    expect_disagreement(ctx, "group_agree: a number differs", attn_mpi_group_agree(g, "prog", v, 2),
                        want, NULL, 0);
    v[0].number = 1;
    if (rank == last) v[1].text = "gpt2";
    snprintf(want, sizeof want, "the ranks disagree on --module: rank 0 mha, rank %d gpt2", last);
    expect_disagreement(ctx, "group_agree: a text differs", attn_mpi_group_agree(g, "prog", v, 2),
                        want, NULL, 0);
    v[1].text = "mha";
    snprintf(want, sizeof want, "the ranks disagree on the number of values: rank 0 2, rank %d 1",
             last);
    expect_disagreement(ctx, "group_agree: the count differs",
                        attn_mpi_group_agree(g, "prog", v, rank == last ? 1 : 2), want, NULL, 0);
    snprintf(want, sizeof want, "the ranks disagree on the call: rank 0 prog forward, rank %d prog grad",
             last);
    expect_disagreement(ctx, "group_agree: another step",
                        attn_mpi_group_agree(g, rank == last ? "prog grad" : "prog forward", v, 2),
                        want, NULL, 0);
    /* steps and texts longer than a field shows, differing at their ends:
     * compared whole, and shown apart */
    const char *stem = "a program's step named at length, one of many steps alike, each of them: ";
    char step[128], path[128];
    snprintf(step, sizeof step, "%s%s", stem, rank == last ? "backward" : "forward");
    snprintf(want, sizeof want, "the ranks disagree on the call: rank 0 ");
    expect_disagreement(ctx, "group_agree: another step, named at length",
                        attn_mpi_group_agree(g, step, v, 2), want, NULL, 0);
    snprintf(path, sizeof path, "/data/runs/a-long-experiment-name/checkpoints/step-%s.safetensors",
             rank == last ? "2000" : "1000");
    v[1].text = path;
    snprintf(want, sizeof want, "--module: rank 0 /data/runs/a-long-experiment-n...ckpoints/"
                                "step-1000.safetensors, rank %d /data/runs/a-long-experiment-n"
                                "...ckpoints/step-2000.safetensors (", last);
    expect_disagreement(ctx, "group_agree: a long text differs at its end",
                        attn_mpi_group_agree(g, "prog", v, 2), want, NULL, 0);
    attn_mpi_group_free(g);
}

/* A prefix-LM map of (1, 1, T, T) in blocks of block_q x 16. */
static attn_block_mask *prefix_map(attn_ctx *ctx, int64_t prefix, size_t T, size_t block_q) {
    attn_mask *m = NULL;
    attn_block_mask *bm = NULL;
    attn_block_mask_config c = {1, 1, T, T, block_q, 16};
    if (attn_mask_new_prefix_lm(ctx, &prefix, 1, &m) != ATTN_OK ||
        attn_block_mask_from_mask(ctx, &c, m, &bm) != ATTN_OK)
        MPI_Abort(MPI_COMM_WORLD, 2);
    attn_mask_free(m);
    return bm;
}

/* Block maps: the last rank passes another map (its content, its block
 * size, none, or one not over the whole sequence), forward and backward. */
static void test_maps(attn_ctx *ctx, attn_mpi_mode mode) {
    size_t H = 2 * (size_t)nranks, T = 29, D = 8, Tl = 0, b[2], e[2];
    attn_mpi_local_ranges(mode, T, (size_t)nranks, (size_t)rank, b, e, &Tl);
    size_t n = H * Tl * D;
    float *q = filled(n, 0.25f), *out = filled(n, 0.0f), *lse = filled(H * Tl, 0.0f);
    float *d = filled(3 * n, 0.0f);
    attn_mpi_group *g = NULL;
    if (attn_mpi_group_new(ctx, MPI_COMM_WORLD, mode, &g) != ATTN_OK) MPI_Abort(MPI_COMM_WORLD, 2);
    attn_block_mask *base_map = prefix_map(ctx, 10, T, 16);
    attn_block_mask *other[4] = {prefix_map(ctx, 11, T, 16), prefix_map(ctx, 10, T, 32), NULL,
                                 prefix_map(ctx, 10, T + 1, 16)};
    const char *names[4] = {"content", "block_q", "presence", "length"};
    char wants[4][160];
    snprintf(wants[0], sizeof wants[0],
             "the ranks disagree on the block_mask's content (checksum): rank 0 0x");
    snprintf(wants[1], sizeof wants[1],
             "the ranks disagree on the block_mask's block_q: rank 0 16, rank %d 32", last);
    snprintf(wants[2], sizeof wants[2],
             "the ranks disagree on whether a block_mask is set: rank 0 1, rank %d 0", last);
    snprintf(wants[3], sizeof wants[3],
             "the block mask is of q_len 30, kv_len 30 where the sequence is of 29 tokens");
    attn_mpi_sdpa_config base = {.batch = 1, .heads = H, .tokens = T, .head_dim = D,
                                 .causal = true, .block_mask = base_map};
    const char *m = attn_mpi_mode_name(mode);
    char what[96];
    for (int pass = 0; pass < 2; pass++)
        for (size_t c = 0; c < 4; c++) {
            attn_mpi_sdpa_config cfg = base;
            if (rank == last) cfg.block_mask = other[c];
            attn_status st;
            if (pass == 0) {
                for (size_t i = 0; i < n; i++) out[i] = 12345.0f;
                st = attn_mpi_sdpa_forward(g, &cfg, q, q, q, out, lse);
            } else {
                for (size_t i = 0; i < 3 * n; i++) d[i] = 12345.0f;
                st = attn_mpi_sdpa_backward(g, &cfg, q, q, q, q, lse, q, d, d + n, d + 2 * n);
            }
            snprintf(what, sizeof what, "%s sdpa %s: rank %d's map's %s differs", m,
                     pass ? "backward" : "forward", last, names[c]);
            expect_disagreement(ctx, what, st, wants[c], pass ? d : out, pass ? 3 * n : n);
            if (c == 0) {
                /* the content's checksum in the message: rank 0's, then the last's */
                char tail[32];
                snprintf(tail, sizeof tail, ", rank %d 0x", last);
                expect_disagreement(ctx, "  ... naming the last rank's too", st, tail, NULL, 0);
            }
        }
    /* alike: it runs */
    snprintf(what, sizeof what, "%s sdpa: every rank's map alike", m);
    expect_ok(ctx, what, attn_mpi_sdpa_forward(g, &base, q, q, q, out, lse));
    attn_block_mask_free(base_map);
    for (int i = 0; i < 4; i++) attn_block_mask_free(other[i]);
    attn_mpi_group_free(g);
    free(q);
    free(out);
    free(lse);
    free(d);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    last = nranks - 1;
    attn_ctx *ctx = NULL;
    if (attn_ctx_new(&(attn_ctx_config){.num_threads = 1}, &ctx) != ATTN_OK)
        MPI_Abort(MPI_COMM_WORLD, 2);
    if (rank == 0) printf("disagreements P=%d\n", nranks);
    test_group(ctx);
    const attn_mpi_mode modes[3] = {ATTN_MPI_RING, ATTN_MPI_ZIGZAG, ATTN_MPI_ULYSSES};
    for (int i = 0; i < 3; i++) {
        test_sdpa(ctx, modes[i]);
        test_modules(ctx, modes[i]);
        test_maps(ctx, modes[i]);
    }
    test_agree(ctx);
    MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) printf(failures ? "FAILED: %d checks\n" : "all checks passed\n", failures);
    attn_ctx_free(ctx);
    MPI_Finalize();
    return failures ? 1 : 0;
}
