/*
 * test_hostile_api.c — the attention calls of the C API (attn_sdpa_*, their
 * packed varlen form, attn_kv_cache_*) given what they must refuse: NULLs,
 * zero sizes, SIZE_MAX and int64 extremes, NaN, infinite and float-
 * overflowing scales and softcaps, strides whose rows overlap, outputs that
 * share memory with inputs, mismatched configs. Each case must return a
 * status other than ATTN_OK, with a message that names the argument or the
 * value at fault, leave every output as it was (filled with a sentinel
 * first) and a cache's lengths as they were. Around the sweep, the cases of
 * the ones that must work: a window past the positions a cache holds is
 * no window (bit for bit), a paged cache with page_size 1 and a window of
 * SIZE_MAX attends as the contiguous one, and a valid call still runs.
 * The modules' forward and backward refuse y over x and dx over dy.
 * Prints the cases tried per surface.
 */
#define _POSIX_C_SOURCE 200809L

#include "attn.h"
#include "check.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SENTINEL (-1234.5f)

static attn_ctx *ctx;

static void fill_pattern(float *x, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((i * 2654435761u + seed * 40503u) % 1000) / 500.0f - 1.0f;
}
static void fill_value(float *x, size_t n, float value) {
    for (size_t i = 0; i < n; i++) x[i] = value;
}
static bool all_value(const float *x, size_t n, float value) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&x[i], &value, sizeof value) != 0) return false;
    return true;
}

/* One refused case: not ATTN_OK, want (when not ATTN_OK itself) the status,
 * the message holds fragment; what names the case in a failure. */
static void check_refused(const char *what, attn_status got, attn_status want,
                          const char *fragment) {
    const char *msg = attn_ctx_last_error(ctx);
    bool ok = got != ATTN_OK && (want == ATTN_OK || got == want) && strstr(msg, fragment);
    CHECK(ok);
    if (!ok)
        fprintf(stderr, "  case \"%s\": %s, message \"%s\" (want %s naming \"%s\")\n", what,
                attn_status_name(got), msg, attn_status_name(want), fragment);
}

/* ---- attn_sdpa_*: a small GQA problem and its buffers --------------------- */

enum { B = 2, H = 4, KH = 2, T = 8, S = 8, D = 8 };
#define QN ((size_t)B * T * H * D)
#define KN ((size_t)B * S * KH * D)
#define LN ((size_t)B * H * T)
/* every tensor of the calls in one block, so that outputs can be pointed
 * into inputs */
typedef struct sdpa_buffers {
    float q[QN], k[KN], v[KN], out[QN], lse[LN], dout[QN], dq[QN], dk[KN], dv[KN];
    float slopes[H], sinks[H], sinks_grad[H];
    int32_t cu_q[B + 1], cu_kv[B + 1];
} sdpa_buffers;

static attn_sdpa_config base_config(void) {
    return (attn_sdpa_config){.batch = B, .heads = H, .kv_heads = KH, .q_tokens = T,
                              .kv_tokens = S, .head_dim = D, .causal = true};
}

static void reset_buffers(sdpa_buffers *m) {
    fill_pattern(m->q, QN, 1);
    fill_pattern(m->k, KN, 2);
    fill_pattern(m->v, KN, 3);
    fill_pattern(m->dout, QN, 4);
    fill_pattern(m->slopes, H, 5);
    fill_pattern(m->sinks, H, 6);
    fill_value(m->out, QN, SENTINEL);
    fill_value(m->lse, LN, SENTINEL);
    fill_value(m->dq, QN, SENTINEL);
    fill_value(m->dk, KN, SENTINEL);
    fill_value(m->dv, KN, SENTINEL);
    fill_value(m->sinks_grad, H, SENTINEL);
}

/* A forward case: the config and pointers, what it must say. */
typedef struct fwd_case {
    const char *what;
    attn_sdpa_config cfg;
    const float *q, *k, *v;
    float *out, *lse;
    attn_status want;
    const char *fragment;
} fwd_case;

static int sweep_forward(sdpa_buffers *m) {
    attn_sdpa_config c = base_config();
    attn_sdpa_config packed = c;
    packed.cu_seqlens_q = m->cu_q;
    packed.cu_seqlens_kv = m->cu_kv;
    float *q = m->q, *k = m->k, *v = m->v, *out = m->out, *lse = m->lse;
    static float nan_at_1[H], inf_at_1[H];
    for (size_t h = 0; h < H; h++) nan_at_1[h] = inf_at_1[h] = 0.5f;
    nan_at_1[1] = NAN;
    inf_at_1[1] = INFINITY;
    fwd_case cases[64];
    size_t n = 0;
    /* a case: the valid call, then the statements that spoil it (C the
     * config, F the case) */
#define ADD(what_, want_, fragment_, ...)                                              \
    do {                                                                             \
        fwd_case *F = &cases[n++];                                                   \
        *F = (fwd_case){what_, c, q, k, v, out, lse, want_, fragment_};              \
        attn_sdpa_config *C = &F->cfg;                                               \
        (void)C;                                                                     \
        __VA_ARGS__;                                                                 \
    } while (0)
    ADD("batch 0", ATTN_ERR_SHAPE, "batch (0)", C->batch = 0);
    ADD("heads 0", ATTN_ERR_SHAPE, "heads (0)", C->heads = 0);
    ADD("q_tokens 0", ATTN_ERR_SHAPE, "q_tokens (0)", C->q_tokens = 0);
    ADD("kv_tokens 0", ATTN_ERR_SHAPE, "kv_tokens (0)", C->kv_tokens = 0);
    ADD("head_dim 0", ATTN_ERR_SHAPE, "head_dim (0)", C->head_dim = 0);
    ADD("kv_heads 3 of 4", ATTN_ERR_SHAPE, "kv_heads (3)", C->kv_heads = 3);
    ADD("kv_heads 8 of 4", ATTN_ERR_SHAPE, "kv_heads (8)", C->kv_heads = 8);
    ADD("batch SIZE_MAX", ATTN_ERR_OVERFLOW, "18446744073709551615", C->batch = SIZE_MAX);
    ADD("heads SIZE_MAX", ATTN_ERR_SHAPE, "heads (18446744073709551615)", C->heads = SIZE_MAX);
    ADD("q_tokens SIZE_MAX", ATTN_ERR_OVERFLOW, "18446744073709551615",
        C->q_tokens = SIZE_MAX);
    ADD("kv_tokens SIZE_MAX", ATTN_ERR_OVERFLOW, "18446744073709551615",
        C->kv_tokens = SIZE_MAX);
    ADD("head_dim SIZE_MAX", ATTN_ERR_OVERFLOW, "18446744073709551615",
        C->head_dim = SIZE_MAX);
    ADD("v_head_dim SIZE_MAX", ATTN_ERR_OVERFLOW, "18446744073709551615",
        C->v_head_dim = SIZE_MAX);
    ADD("head_dim 2^62", ATTN_ERR_OVERFLOW, "overflows", C->head_dim = (size_t)1 << 62);
    ADD("scale NaN", ATTN_ERR_INVALID, "scale (nan)", C->scale = NAN);
    ADD("scale inf", ATTN_ERR_INVALID, "scale (inf)", C->scale = INFINITY);
    ADD("scale -inf", ATTN_ERR_INVALID, "scale (-inf)", C->scale = -INFINITY);
    ADD("scale 1e300", ATTN_ERR_INVALID, "scale (1e+300)", C->scale = 1e300);
    ADD("scale -1e300", ATTN_ERR_INVALID, "scale (-1e+300)", C->scale = -1e300);
    ADD("scale 3.5e38", ATTN_ERR_INVALID, "scale (3.5e+38)", C->scale = 3.5e38);
    ADD("softcap NaN", ATTN_ERR_INVALID, "softcap (nan)", C->softcap = NAN);
    ADD("softcap inf", ATTN_ERR_INVALID, "softcap (inf)", C->softcap = INFINITY);
    ADD("softcap -1", ATTN_ERR_INVALID, "softcap (-1)", C->softcap = -1.0);
    ADD("softcap 1e300", ATTN_ERR_INVALID, "softcap (1e+300) is beyond float32's range",
        C->softcap = 1e300);
    ADD("softcap 1e-46", ATTN_ERR_INVALID, "softcap (1e-46) rounds to 0 in float32",
        C->softcap = 1e-46);
    ADD("sinks NaN", ATTN_ERR_INVALID, "sinks[1] is nan: each query head's must be finite",
        C->sinks = nan_at_1);
    ADD("alibi_slopes inf", ATTN_ERR_INVALID, "alibi_slopes[1] is inf",
        C->alibi_slopes = inf_at_1);
    ADD("dropout -0.1", ATTN_ERR_INVALID, "dropout (-0.1)", C->dropout = -0.1);
    ADD("dropout 1", ATTN_ERR_INVALID, "dropout (1)", C->dropout = 1.0);
    ADD("dropout NaN", ATTN_ERR_INVALID, "dropout (nan)", C->dropout = NAN);
    ADD("dropout without rng", ATTN_ERR_NULL, "needs an rng", C->dropout = 0.5);
    ADD("align 7", ATTN_ERR_INVALID, "align (7)", C->align = (attn_align)7);
    ADD("q_offset LLONG_MAX", ATTN_ERR_INVALID, "q_offset (9223372036854775807)",
        C->align = ATTN_ALIGN_OFFSET, C->q_offset = LLONG_MAX);
    ADD("q_offset LLONG_MIN", ATTN_ERR_INVALID, "q_offset (-9223372036854775808)",
        C->align = ATTN_ALIGN_OFFSET, C->q_offset = LLONG_MIN);
    ADD("window_left -2", ATTN_ERR_INVALID, "window (-2, 0)", C->window = true,
        C->window_left = -2);
    ADD("window_right LLONG_MIN", ATTN_ERR_INVALID, "-9223372036854775808", C->window = true,
        C->window_right = LLONG_MIN);
    ADD("cfg NULL", ATTN_ERR_NULL, "cfg is NULL", (void)0);
    ADD("q NULL", ATTN_ERR_NULL, "q is NULL", F->q = NULL);
    ADD("k NULL", ATTN_ERR_NULL, "k is NULL", F->k = NULL);
    ADD("v NULL", ATTN_ERR_NULL, "v is NULL", F->v = NULL);
    ADD("out NULL", ATTN_ERR_NULL, "out is NULL", F->out = NULL);
    /* strides */
    ADD("out rows on one another (h stride 0)", ATTN_ERR_INVALID, "out's strides (256, 32, 0)",
        C->out_strides[0] = T * H * D, C->out_strides[1] = H * D, C->out_strides[2] = 0);
    ADD("out rows half over one another", ATTN_ERR_INVALID, "make rows overlap",
        C->out_strides[0] = T * H * D / 2, C->out_strides[1] = H * D / 2,
        C->out_strides[2] = D / 2);
    ADD("q strides SIZE_MAX", ATTN_ERR_OVERFLOW, "q's strides (18446744073709551615",
        C->q_strides[0] = SIZE_MAX, C->q_strides[1] = H * D, C->q_strides[2] = D);
    ADD("v strides past memory", ATTN_ERR_OVERFLOW, "v's strides",
        C->v_strides[0] = SIZE_MAX / 4, C->v_strides[1] = KH * D, C->v_strides[2] = D);
    /* aliasing */
    ADD("out == k", ATTN_ERR_INVALID, "out [", F->out = k);
    ADD("out == v", ATTN_ERR_INVALID, "overlaps v [", F->out = v);
    ADD("out == q", ATTN_ERR_INVALID, "overlaps q [", F->out = q);
    ADD("out over the tail of k", ATTN_ERR_INVALID, "overlaps k [", F->out = m->k + KN - 3);
    ADD("out under the head of v", ATTN_ERR_INVALID, "out [", F->out = m->v - QN + 1);
    ADD("lse inside out", ATTN_ERR_INVALID, "lse [", F->lse = out + 5);
    ADD("lse over q", ATTN_ERR_INVALID, "overlaps q [", F->lse = m->q + QN - 1);
    ADD("out over alibi_slopes", ATTN_ERR_INVALID, "overlaps alibi_slopes [",
        C->alibi_slopes = m->out + 7);
    ADD("lse over sinks", ATTN_ERR_INVALID, "overlaps sinks [", C->sinks = m->lse + LN - 1);
    ADD("out over cu_seqlens_kv", ATTN_ERR_INVALID, "overlaps cu_seqlens_kv [",
        *C = packed, F->out = (float *)(void *)m->cu_kv);
    /* packed sequences */
    ADD("cu_seqlens_q without cu_seqlens_kv", ATTN_ERR_INVALID,
        "cu_seqlens_q needs cu_seqlens_kv", C->cu_seqlens_q = m->cu_q);
    ADD("cu_seqlens_kv without cu_seqlens_q", ATTN_ERR_NULL, "(cu_seqlens_q is NULL)",
        C->cu_seqlens_kv = m->cu_kv);
#undef ADD
    for (size_t i = 0; i < n; i++) {
        fwd_case *f = &cases[i];
        reset_buffers(m);
        for (int b = 0; b <= B; b++) m->cu_q[b] = m->cu_kv[b] = b * T;
        const attn_sdpa_config *cfg = strcmp(f->what, "cfg NULL") ? &f->cfg : NULL;
        attn_status st = attn_sdpa_forward(ctx, cfg, f->q, f->k, f->v, f->out, f->lse, NULL,
                                           NULL);
        check_refused(f->what, st, f->want, f->fragment);
        CHECK(all_value(m->out, QN, SENTINEL) && all_value(m->lse, LN, SENTINEL));
    }
    int tried = (int)n;
    /* the packed form: offsets the runner refuses, named */
    struct { int32_t q[B + 1], kv[B + 1]; const char *fragment; } bad_cu[] = {
        {{1, 8, 16}, {0, 8, 16}, "cu_seqlens_q[0] (1) must be 0"},
        {{0, 5, 3}, {0, 8, 16}, "cu_seqlens_q must not decrease"},
        {{0, 8, 16}, {0, 12, 16}, "sequence 0 of cu_seqlens_kv has 12 tokens"},
        {{0, 8, -1}, {0, 8, 16}, "offsets >= 0"},
        {{0, 8, INT32_MIN}, {0, 8, 16}, "offsets >= 0"},
    };
    for (size_t i = 0; i < sizeof bad_cu / sizeof bad_cu[0]; i++) {
        reset_buffers(m);
        memcpy(m->cu_q, bad_cu[i].q, sizeof m->cu_q);
        memcpy(m->cu_kv, bad_cu[i].kv, sizeof m->cu_kv);
        attn_status st = attn_sdpa_forward(ctx, &packed, q, k, v, out, lse, NULL, NULL);
        check_refused(bad_cu[i].fragment, st, ATTN_OK, bad_cu[i].fragment);
        CHECK(all_value(m->out, QN, SENTINEL) && all_value(m->lse, LN, SENTINEL));
        tried++;
    }
    /* 16-bit storage: dtypes it does not take */
    attn_dtype bad_dtypes[] = {ATTN_DTYPE_F64, ATTN_DTYPE_I8, ATTN_DTYPE_I4, (attn_dtype)99};
    for (size_t i = 0; i < sizeof bad_dtypes / sizeof bad_dtypes[0]; i++) {
        reset_buffers(m);
        attn_status st = attn_sdpa_forward_16(ctx, &c, bad_dtypes[i], q, k, v, out, lse, NULL,
                                              NULL);
        char want[32];
        snprintf(want, sizeof want, ", %d) must be", (int)bad_dtypes[i]);
        check_refused("forward_16 dtype", st, ATTN_ERR_INVALID, want);
        CHECK(all_value(m->out, QN, SENTINEL) && all_value(m->lse, LN, SENTINEL));
        tried++;
    }
    /* 16-bit and float64 calls refuse aliasing too */
    reset_buffers(m);
    check_refused("forward_16 out == k",
                  attn_sdpa_forward_16(ctx, &c, ATTN_DTYPE_BF16, q, k, v, k, lse, NULL, NULL),
                  ATTN_ERR_INVALID, "overlaps k [");
    CHECK(all_value(m->lse, LN, SENTINEL));
    double *dq64 = calloc(QN, sizeof(double)), *dk64 = calloc(KN, sizeof(double));
    CHECK_STATUS(attn_sdpa_forward_f64(ctx, &c, dq64, dk64, dk64, dk64, NULL, NULL, NULL),
                 ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "out [");
    free(dq64);
    free(dk64);
    return tried + 2;
}

/* A backward case: the nine tensors (q, k, v, out, lse, dout, dq, dk, dv). */
static int sweep_backward(sdpa_buffers *m) {
    attn_sdpa_config c = base_config();
    attn_sdpa_config sinks = c;
    sinks.sinks = m->sinks;
    sinks.sinks_grad = m->sinks_grad;
    /* a forward for out and lse, the backward's inputs */
    reset_buffers(m);
    CHECK_STATUS(attn_sdpa_forward(ctx, &sinks, m->q, m->k, m->v, m->out, m->lse, NULL, NULL),
                 ATTN_OK);
    float out_saved[QN], lse_saved[LN];
    memcpy(out_saved, m->out, sizeof out_saved);
    memcpy(lse_saved, m->lse, sizeof lse_saved);
    static const char *const names[9] = {"q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv"};
    float *t[9] = {m->q, m->k, m->v, m->out, m->lse, m->dout, m->dq, m->dk, m->dv};
    int tried = 0;
    for (int i = 0; i < 9; i++) { /* each NULL */
        float *u[9];
        memcpy(u, t, sizeof u);
        u[i] = NULL;
        char want[32];
        snprintf(want, sizeof want, ": %s is NULL", names[i]);
        check_refused(want, attn_sdpa_backward(ctx, &c, u[0], u[1], u[2], u[3], u[4], u[5],
                                               u[6], u[7], u[8], NULL),
                      ATTN_ERR_NULL, want);
        tried++;
    }
    /* an output onto each input and onto another output */
    struct { int out, onto, shift; const char *fragment; } alias[] = {
        {6, 0, 0, "dq ["}, {6, 5, 0, "overlaps dout ["}, {6, 3, 0, "overlaps out ["},
        {6, 4, 0, "overlaps lse ["}, {7, 1, 0, "overlaps k ["}, {8, 2, 0, "overlaps v ["},
        {7, 8, 0, "dv ["}, {8, 7, 3, "dv ["}, {7, 6, 5, "dk ["}, {8, 0, 1, "overlaps q ["},
    };
    for (size_t a = 0; a < sizeof alias / sizeof alias[0]; a++) {
        reset_buffers(m);
        memcpy(m->out, out_saved, sizeof out_saved);
        memcpy(m->lse, lse_saved, sizeof lse_saved);
        float *u[9];
        memcpy(u, t, sizeof u);
        u[alias[a].out] = t[alias[a].onto] + alias[a].shift;
        attn_status st = attn_sdpa_backward(ctx, &c, u[0], u[1], u[2], u[3], u[4], u[5], u[6],
                                            u[7], u[8], NULL);
        check_refused(alias[a].fragment, st, ATTN_ERR_INVALID, alias[a].fragment);
        CHECK(all_value(m->dq, QN, SENTINEL) && all_value(m->dk, KN, SENTINEL) &&
              all_value(m->dv, KN, SENTINEL));
        CHECK(memcmp(m->out, out_saved, sizeof out_saved) == 0);
        tried++;
    }
    /* sinks_grad onto sinks, and onto dq */
    float *sg[2] = {m->sinks, m->dq + 3};
    const char *sg_want[2] = {"sinks_grad [", "sinks_grad ["};
    for (int i = 0; i < 2; i++) {
        reset_buffers(m);
        memcpy(m->out, out_saved, sizeof out_saved);
        memcpy(m->lse, lse_saved, sizeof lse_saved);
        attn_sdpa_config cs = sinks;
        cs.sinks_grad = sg[i];
        check_refused(sg_want[i], attn_sdpa_backward(ctx, &cs, m->q, m->k, m->v, m->out, m->lse,
                                                     m->dout, m->dq, m->dk, m->dv, NULL),
                      ATTN_ERR_INVALID, sg_want[i]);
        CHECK(all_value(m->dq, QN, SENTINEL) && all_value(m->sinks_grad, H, SENTINEL));
        tried++;
    }
    /* dq's rows overlap where q's layout broadcasts a row to every head */
    attn_sdpa_config bc = c;
    bc.q_strides[0] = T * D;
    bc.q_strides[1] = D;
    bc.q_strides[2] = 0;
    reset_buffers(m);
    check_refused("dq rows", attn_sdpa_backward(ctx, &bc, m->q, m->k, m->v, m->out, m->lse,
                                                m->dout, m->dq, m->dk, m->dv, NULL),
                  ATTN_ERR_INVALID, "dq's strides (64, 8, 0)");
    CHECK(all_value(m->dq, QN, SENTINEL));
    /* as an input, that broadcast layout is fine: the forward runs */
    CHECK_STATUS(attn_sdpa_forward(ctx, &bc, m->q, m->k, m->v, m->out, NULL, NULL, NULL),
                 ATTN_OK);
    return tried + 2;
}

/* What may share memory: inputs with inputs (k and v one buffer), and a
 * valid call gives the same bits as before the checks existed: the same
 * call on separate copies. */
static void check_allowed(sdpa_buffers *m) {
    reset_buffers(m);
    float want[QN];
    CHECK_STATUS(attn_sdpa_forward(ctx, &(attn_sdpa_config){.batch = B, .heads = H,
                                                            .kv_heads = KH, .q_tokens = T,
                                                            .kv_tokens = S, .head_dim = D},
                                   m->q, m->k, m->k, want, NULL, NULL, NULL),
                 ATTN_OK);
    attn_sdpa_config c = base_config();
    c.causal = false;
    float *kv = malloc(KN * sizeof(float));
    memcpy(kv, m->k, KN * sizeof(float));
    CHECK_STATUS(attn_sdpa_forward(ctx, &c, m->q, kv, kv, m->out, NULL, NULL, NULL), ATTN_OK);
    CHECK(memcmp(m->out, want, sizeof want) == 0);
    free(kv);
}

/* ---- modules: y and x, dx and dy ------------------------------------------ */

static int sweep_modules(void) {
    enum { MB = 2, MT = 5, C = 8 };
    attn_rng *rng;
    CHECK_STATUS(attn_rng_new(ctx, 7, &rng), ATTN_OK);
    attn_mha_config mc = {.d_in = C, .d_out = C, .context_length = MT, .num_heads = 2};
    attn_mha *mha;
    CHECK_STATUS(attn_mha_new(ctx, &mc, rng, &mha), ATTN_OK);
    attn_module *m = attn_mha_module(mha);
    /* x, y and the spare rows around them in one block */
    float *mem = malloc(3 * MB * MT * C * sizeof(float)), *x = mem + MB * MT * C;
    fill_pattern(mem, 3 * MB * MT * C, 14);
    float want[MB * MT * C], saved[3 * MB * MT * C];
    CHECK_STATUS(attn_module_forward(m, x, MB, MT, want, NULL), ATTN_OK);
    memcpy(saved, mem, sizeof saved);
    struct { const char *what; float *y; const char *fragment; } fwd[] = {
        {"y == x", x, "y ["}, {"y over x's head", x - MB * MT * C + 1, "overlaps x ["},
        {"y over x's tail", x + MB * MT * C - 1, "overlaps x ["}};
    for (size_t i = 0; i < sizeof fwd / sizeof fwd[0]; i++) {
        check_refused(fwd[i].what, attn_module_forward(m, x, MB, MT, fwd[i].y, NULL),
                      ATTN_ERR_INVALID, fwd[i].fragment);
        CHECK(memcmp(mem, saved, sizeof saved) == 0);
    }
    /* the valid forward before the checks, and now: the same bits */
    float got[MB * MT * C];
    CHECK_STATUS(attn_module_forward(m, x, MB, MT, got, NULL), ATTN_OK);
    CHECK(memcmp(got, want, sizeof got) == 0);
    float *dy = x;
    check_refused("dx == dy", attn_module_backward(m, dy, MB, MT, dy), ATTN_ERR_INVALID,
                  "dx [");
    check_refused("dx over dy's tail", attn_module_backward(m, dy, MB, MT, dy + 3),
                  ATTN_ERR_INVALID, "overlaps dy [");
    CHECK(memcmp(mem, saved, sizeof saved) == 0);
    /* the module's own parameters (read by both passes) and gradients
     * (written by the backward): y over a weight, dx over a gradient, dy a
     * gradient; nothing written, the parameters and gradients unchanged */
    attn_param w;
    CHECK_STATUS(attn_module_param_at(m, 1, &w), ATTN_OK);
    float *w_saved = malloc(w.numel * sizeof(float)), *g_saved = malloc(w.numel * sizeof(float));
    memcpy(w_saved, w.data, w.numel * sizeof(float));
    memcpy(g_saved, w.grad, w.numel * sizeof(float));
    check_refused("y over a weight", attn_module_forward(m, x, MB, MT, w.data, NULL),
                  ATTN_ERR_INVALID, "overlaps the module's parameters and gradients [");
    check_refused("y over a gradient", attn_module_forward(m, x, MB, MT, w.grad, NULL),
                  ATTN_ERR_INVALID, "overlaps the module's parameters and gradients [");
    check_refused("dx over a gradient", attn_module_backward(m, x, MB, MT, w.grad),
                  ATTN_ERR_INVALID, "dx [");
    check_refused("dx over a weight", attn_module_backward(m, x, MB, MT, w.data),
                  ATTN_ERR_INVALID, "overlaps the module's parameters [");
    check_refused("dy a gradient", attn_module_backward(m, w.grad, MB, MT, got),
                  ATTN_ERR_INVALID, "the module's gradients [");
    CHECK(memcmp(w.data, w_saved, w.numel * sizeof(float)) == 0);
    CHECK(memcmp(w.grad, g_saved, w.numel * sizeof(float)) == 0);
    /* a weight as x and dy (both read) is allowed */
    CHECK_STATUS(attn_module_forward(m, w.data, MB, MT, got, NULL), ATTN_OK);
    CHECK_STATUS(attn_module_backward(m, w.data, MB, MT, want), ATTN_OK);
    free(w_saved);
    free(g_saved);
    free(mem);
    attn_mha_free(mha);
    attn_rng_free(rng);
    return 10;
}

/* ---- the KV cache -------------------------------------------------------- */

enum { KV_HEADS = 2, Q_HEADS = 4, HD = 8, MAX_LEN = 128 };

static attn_kv_cache_config kv_config(void) {
    return (attn_kv_cache_config){.num_layers = 2, .batch = 2, .kv_heads = KV_HEADS,
                                  .head_dim = HD, .max_len = MAX_LEN};
}

static int sweep_cache_new(void) {
    static const size_t huge_windows[2] = {SIZE_MAX, 3};
    struct { const char *what; attn_kv_cache_config cfg; attn_status want; const char *fragment; }
        cases[32];
    size_t n = 0;
#define ADD(what_, want_, fragment_, ...)                                              \
    do {                                                                             \
        cases[n].what = what_;                                                       \
        cases[n].cfg = kv_config();                                                  \
        cases[n].want = want_;                                                       \
        cases[n].fragment = fragment_;                                               \
        attn_kv_cache_config *C = &cases[n++].cfg;                                   \
        __VA_ARGS__;                                                                 \
    } while (0)
    ADD("num_layers 0", ATTN_ERR_INVALID, "num_layers (0)", C->num_layers = 0);
    ADD("batch 0", ATTN_ERR_INVALID, "batch (0)", C->batch = 0);
    ADD("kv_heads 0", ATTN_ERR_INVALID, "kv_heads (0)", C->kv_heads = 0);
    ADD("head_dim 0", ATTN_ERR_INVALID, "head_dim (0)", C->head_dim = 0);
    ADD("max_len 0", ATTN_ERR_INVALID, "max_len (0)", C->max_len = 0);
    ADD("layout 5", ATTN_ERR_INVALID, "layout 5", C->layout = (attn_kv_layout)5);
    ADD("k_dtype 99", ATTN_ERR_INVALID, "k_dtype 99", C->k_dtype = (attn_dtype)99);
    ADD("v_dtype F64", ATTN_ERR_INVALID, "v_dtype 3", C->v_dtype = ATTN_DTYPE_F64);
    ADD("I4 head_dim 8", ATTN_ERR_SHAPE, "head_dim 8", C->k_dtype = ATTN_DTYPE_I4);
    ADD("kv_heads x head_dim", ATTN_ERR_OVERFLOW, "kv_heads (9223372036854775807)",
        C->kv_heads = SIZE_MAX / 2, C->head_dim = 4);
    ADD("batch x max_len", ATTN_ERR_OVERFLOW, "batch (288230376151711743) x max_len (128)",
        C->batch = SIZE_MAX / 64);
    ADD("max_len SIZE_MAX", ATTN_ERR_OVERFLOW, "max_len (18446744073709551615)",
        C->max_len = SIZE_MAX);
    ADD("max_len 2^62 + 1", ATTN_ERR_OVERFLOW, "max_len (4611686018427387905)",
        C->max_len = ((size_t)1 << 62) + 1);
    ADD("paged max_len SIZE_MAX, page_size 2^61", ATTN_ERR_OVERFLOW,
        "max_len (18446744073709551615)", C->layout = ATTN_KV_PAGED, C->max_len = SIZE_MAX,
        C->page_size = (size_t)1 << 61, C->num_pages = 1);
    ADD("paged page_size SIZE_MAX", ATTN_ERR_OVERFLOW, "page_size (18446744073709551615)",
        C->layout = ATTN_KV_PAGED, C->page_size = SIZE_MAX);
    ADD("paged num_pages SIZE_MAX", ATTN_ERR_OVERFLOW, "num_pages (18446744073709551615)",
        C->layout = ATTN_KV_PAGED, C->num_pages = SIZE_MAX);
    ADD("paged num_pages 2^32", ATTN_ERR_OVERFLOW, "num_pages (4294967296)",
        C->layout = ATTN_KV_PAGED, C->num_pages = (size_t)1 << 32);
    ADD("paged page_size 1, max_len 2^62", ATTN_ERR_OVERFLOW, "4611686018427387904",
        C->layout = ATTN_KV_PAGED, C->page_size = 1, C->max_len = (size_t)1 << 62,
        C->windows = huge_windows);
    ADD("past memory", ATTN_ERR_NO_MEMORY, "past this machine's memory",
        C->max_len = (size_t)1 << 40);
#undef ADD
    for (size_t i = 0; i < n; i++) {
        attn_kv_cache *cache = (attn_kv_cache *)&cases[i]; /* must be set to NULL */
        attn_status st = attn_kv_cache_new(ctx, &cases[i].cfg, &cache);
        check_refused(cases[i].what, st, cases[i].want, cases[i].fragment);
        CHECK(cache == NULL);
        if (st == ATTN_OK) attn_kv_cache_free(cache);
    }
    attn_kv_cache *cache = NULL;
    attn_kv_cache_config c = kv_config();
    check_refused("ctx NULL", attn_kv_cache_new(NULL, &c, &cache), ATTN_ERR_NULL, "");
    check_refused("cfg NULL", attn_kv_cache_new(ctx, NULL, &cache), ATTN_ERR_NULL,
                  "attn_kv_cache_new: cfg is NULL");
    check_refused("out NULL", attn_kv_cache_new(ctx, &c, NULL), ATTN_ERR_NULL,
                  "attn_kv_cache_new: out is NULL");
    return (int)n + 3;
}

/* The lengths of every (layer, sequence) of a cache. */
static void lengths_of(const attn_kv_cache *cache, size_t out[4]) {
    for (size_t l = 0; l < 2; l++)
        for (size_t s = 0; s < 2; s++) CHECK_STATUS(attn_kv_cache_length(cache, l, s, &out[l * 2 + s]), ATTN_OK);
}

enum { ROWS = 2 * 3 }; /* 3 new tokens per sequence of 2 */

static int sweep_attend(attn_kv_layout layout) {
    attn_kv_cache_config cfg = kv_config();
    cfg.layout = layout;
    cfg.page_size = layout == ATTN_KV_PAGED ? 4 : 0;
    cfg.num_pages = layout == ATTN_KV_PAGED ? 6 : 0;
    attn_kv_cache *cache;
    CHECK_STATUS(attn_kv_cache_new(ctx, &cfg, &cache), ATTN_OK);
    enum { QF = ROWS * Q_HEADS * HD, KF = ROWS * KV_HEADS * HD };
    /* one block, so that out can be pointed into the inputs */
    float *mem = malloc((2 * QF + 2 * KF) * sizeof(float));
    float *q = mem, *out = q + QF, *k = out + QF, *v = k + KF;
    fill_pattern(q, QF, 7);
    fill_pattern(k, KF, 8);
    fill_pattern(v, KF, 9);
    /* some history first: 3 tokens per sequence of layer 0 */
    attn_kv_attend_args ok = {.layer = 0, .new_tokens = 3, .q_heads = Q_HEADS, .q = q,
                              .k_new = k, .v_new = v, .out = out};
    CHECK_STATUS(attn_kv_cache_attend(cache, &ok), ATTN_OK);
    size_t before[4], after[4];
    lengths_of(cache, before);
    size_t lens_past[2] = {SIZE_MAX, 1}, lens_wrap[2] = {1, SIZE_MAX}, lens_long[2] = {0, MAX_LEN};
    struct { const char *what; attn_kv_attend_args a; attn_status want; const char *fragment; }
        cases[40];
    size_t n = 0;
#define ADD(what_, want_, fragment_, ...)                                              \
    do {                                                                             \
        cases[n].what = what_;                                                       \
        cases[n].a = ok;                                                             \
        cases[n].want = want_;                                                       \
        cases[n].fragment = fragment_;                                               \
        attn_kv_attend_args *A = &cases[n++].a;                                      \
        __VA_ARGS__;                                                                 \
    } while (0)
    ADD("layer 2", ATTN_ERR_INVALID, "layer 2", A->layer = 2);
    ADD("layer SIZE_MAX", ATTN_ERR_INVALID, "layer 18446744073709551615", A->layer = SIZE_MAX);
    ADD("q_heads 0", ATTN_ERR_SHAPE, "q_heads (0)", A->q_heads = 0);
    ADD("q_heads 3", ATTN_ERR_SHAPE, "q_heads (3)", A->q_heads = 3);
    ADD("q_heads SIZE_MAX - 1", ATTN_ERR_OVERFLOW, "18446744073709551614 heads",
        A->q_heads = SIZE_MAX - 1);
    ADD("scale NaN", ATTN_ERR_INVALID, "scale nan", A->scale = NAN);
    ADD("scale inf", ATTN_ERR_INVALID, "scale inf", A->scale = INFINITY);
    ADD("scale -1", ATTN_ERR_INVALID, "scale -1", A->scale = -1.0);
    ADD("scale 1e300", ATTN_ERR_INVALID, "scale 1e+300", A->scale = 1e300);
    ADD("scale 3.5e38", ATTN_ERR_INVALID, "scale 3.5e+38", A->scale = 3.5e38);
    ADD("q NULL", ATTN_ERR_NULL, "q is NULL (q, k_new, v_new and out", A->q = NULL);
    ADD("k_new NULL", ATTN_ERR_NULL, "k_new is NULL (q, k_new, v_new and out", A->k_new = NULL);
    ADD("v_new NULL", ATTN_ERR_NULL, "v_new is NULL (q, k_new, v_new and out", A->v_new = NULL);
    ADD("out NULL", ATTN_ERR_NULL, "out is NULL (q, k_new, v_new and out", A->out = NULL);
    ADD("new_tokens SIZE_MAX", ATTN_ERR_OVERFLOW, "overflow", A->new_tokens = SIZE_MAX);
    ADD("new_tokens past max_len", ATTN_ERR_OVERFLOW, "126 new would pass max_len 128",
        A->new_tokens = MAX_LEN - 2);
    ADD("new_lens SIZE_MAX", ATTN_ERR_OVERFLOW, "overflow", A->new_lens = lens_past);
    ADD("new_lens wrap", ATTN_ERR_OVERFLOW, "overflow", A->new_lens = lens_wrap);
    ADD("new_lens past max_len", ATTN_ERR_OVERFLOW, "128 new would pass max_len 128",
        A->new_lens = lens_long);
    ADD("out == q", ATTN_ERR_INVALID, "out [", A->out = q);
    ADD("out == k_new", ATTN_ERR_INVALID, "overlaps k_new [", A->out = k);
    ADD("out == v_new", ATTN_ERR_INVALID, "overlaps v_new [", A->out = v);
    ADD("out over k_new's tail", ATTN_ERR_INVALID, "overlaps k_new [", A->out = k + KF - 1);
    ADD("out over q's tail", ATTN_ERR_INVALID, "overlaps q [", A->out = q + 1);
    ADD("out over new_lens", ATTN_ERR_INVALID, "overlaps new_lens [",
        A->new_lens = (const size_t *)(void *)out, A->new_tokens = 0);
#undef ADD
    for (size_t i = 0; i < n; i++) {
        fill_value(out, QF, SENTINEL);
        attn_kv_attend_args a = cases[i].a;
        if (a.new_lens == (const size_t *)(void *)out) {
            /* new_lens read from out's memory: 3 and 3 */
            size_t three[2] = {3, 3};
            memcpy(out, three, sizeof three);
        }
        float saved[QF];
        memcpy(saved, out, sizeof saved);
        attn_status st = attn_kv_cache_attend(cache, &a);
        check_refused(cases[i].what, st, cases[i].want, cases[i].fragment);
        CHECK(memcmp(out, saved, sizeof saved) == 0);
        lengths_of(cache, after);
        CHECK(memcmp(before, after, sizeof before) == 0);
    }
    int tried = (int)n;
    check_refused("args NULL", attn_kv_cache_attend(cache, NULL), ATTN_ERR_NULL, "args");
    CHECK_STATUS(attn_kv_cache_attend(NULL, &ok), ATTN_ERR_NULL);
    tried += 2;
    if (layout == ATTN_KV_PAGED) {
        /* 6 pages of 4: sequence 0 at 3 tokens (1 page each), 20 more
         * need 5 pages, and sequence 1 5 more: 7 in all */
        size_t lens[2] = {20, 20};
        attn_kv_attend_args a = ok;
        a.new_lens = lens;
        float *big = calloc(40 * Q_HEADS * HD * 2 + 80 * KV_HEADS * HD, sizeof(float));
        a.q = big;
        a.out = big + 40 * Q_HEADS * HD;
        a.k_new = a.out + 40 * Q_HEADS * HD;
        a.v_new = a.k_new + 40 * KV_HEADS * HD;
        check_refused("pool out of pages", attn_kv_cache_attend(cache, &a), ATTN_ERR_OVERFLOW,
                      "out of pages");
        check_refused("append: pool out of pages",
                      attn_kv_cache_append(cache, 0, lens, 0, a.k_new, a.v_new),
                      ATTN_ERR_OVERFLOW, "out of pages");
        lengths_of(cache, after);
        CHECK(memcmp(before, after, sizeof before) == 0);
        free(big);
        tried += 2;
    }
    /* append, reset_sequence and length: the limits */
    check_refused("append layer 9", attn_kv_cache_append(cache, 9, NULL, 1, k, v),
                  ATTN_ERR_INVALID, "layer 9");
    check_refused("append k_new NULL", attn_kv_cache_append(cache, 0, NULL, 1, NULL, v),
                  ATTN_ERR_NULL, "k_new and v_new");
    check_refused("append past max_len", attn_kv_cache_append(cache, 0, NULL, MAX_LEN, k, v),
                  ATTN_ERR_OVERFLOW, "would pass max_len 128");
    check_refused("append SIZE_MAX", attn_kv_cache_append(cache, 1, NULL, SIZE_MAX, k, v),
                  ATTN_ERR_OVERFLOW, "overflow");
    check_refused("reset_sequence 2", attn_kv_cache_reset_sequence(cache, 2), ATTN_ERR_INVALID,
                  "sequence 2");
    size_t len;
    check_refused("length seq 2", attn_kv_cache_length(cache, 0, 2, &len), ATTN_ERR_INVALID,
                  "sequence 2 of 2");
    check_refused("length out NULL", attn_kv_cache_length(cache, 0, 0, NULL), ATTN_ERR_NULL,
                  "out");
    lengths_of(cache, after);
    CHECK(memcmp(before, after, sizeof before) == 0);
    tried += 7;
    attn_kv_cache_free(cache);
    free(mem);
    return tried;
}

/* ---- what must work ------------------------------------------------------- */

/* One attend of `rows` new tokens per sequence (2 sequences) into a fresh
 * cache of windows {w, w} and layout, then `steps` single-token steps;
 * every output in outs (rows + steps tokens per sequence, in order). */
static attn_status run_cache(size_t w, attn_kv_layout layout, size_t page_size, size_t rows,
                             size_t steps, double scale, float *outs) {
    size_t windows[2] = {w, w};
    attn_kv_cache_config cfg = kv_config();
    cfg.windows = windows;
    cfg.layout = layout;
    cfg.page_size = page_size;
    attn_kv_cache *cache;
    attn_status st = attn_kv_cache_new(ctx, &cfg, &cache);
    if (st != ATTN_OK) return st;
    size_t all = rows + steps, qf = Q_HEADS * HD, kf = KV_HEADS * HD;
    float *q = malloc(2 * all * qf * sizeof(float)), *k = malloc(2 * all * kf * sizeof(float)),
          *v = malloc(2 * all * kf * sizeof(float));
    fill_pattern(q, 2 * all * qf, 11);
    fill_pattern(k, 2 * all * kf, 12);
    fill_pattern(v, 2 * all * kf, 13);
    attn_kv_attend_args a = {.layer = 1, .new_tokens = rows, .q_heads = Q_HEADS, .scale = scale,
                             .q = q, .k_new = k, .v_new = v, .out = outs};
    st = attn_kv_cache_attend(cache, &a);
    for (size_t i = 0; st == ATTN_OK && i < steps; i++) {
        size_t at = 2 * (rows + i);
        a = (attn_kv_attend_args){.layer = 1, .new_tokens = 1, .q_heads = Q_HEADS,
                                  .scale = scale, .q = q + at * qf, .k_new = k + at * kf,
                                  .v_new = v + at * kf, .out = outs + at * qf};
        st = attn_kv_cache_attend(cache, &a);
    }
    size_t len = 0;
    if (st == ATTN_OK) {
        attn_status l = attn_kv_cache_length(cache, 1, 1, &len);
        if (l != ATTN_OK || len != all) st = ATTN_ERR_INVALID;
    }
    attn_kv_cache_free(cache);
    free(q);
    free(k);
    free(v);
    return st;
}

static void check_windows(void) {
    /* the prompt path (an empty cache, 64 rows or more) and the decode
     * path after it; a window of MAX_LEN or more sees every position */
    enum { PROMPT = 64, STEPS = 8, N = 2 * (PROMPT + STEPS) * Q_HEADS * HD };
    float *want = malloc(N * sizeof(float)), *got = malloc(N * sizeof(float));
    CHECK_STATUS(run_cache(MAX_LEN, ATTN_KV_CONTIGUOUS, 0, PROMPT, STEPS, 0.0, want), ATTN_OK);
    const size_t huge[] = {MAX_LEN + 1, (size_t)INT64_MAX, (size_t)INT64_MAX + 2,
                           (size_t)1 << 63, SIZE_MAX};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        for (int paged = 0; paged < 2; paged++) {
            for (size_t page = 1; page <= (paged ? 16u : 1u); page *= 16) {
                fill_value(got, N, SENTINEL);
                attn_status st = run_cache(huge[i], paged ? ATTN_KV_PAGED : ATTN_KV_CONTIGUOUS,
                                           paged ? page : 0, PROMPT, STEPS, 0.0, got);
                CHECK_STATUS(st, ATTN_OK);
                bool same = memcmp(got, want, N * sizeof(float)) == 0;
                CHECK(same);
                if (!same || st != ATTN_OK)
                    fprintf(stderr, "  window %zu, %s, page_size %zu: not window %d's bits\n",
                            huge[i], paged ? "paged" : "contiguous", page, MAX_LEN);
            }
        }
    }
    /* a scale past float32's range on the prompt path: refused, named,
     * nothing written */
    fill_value(got, N, SENTINEL);
    check_refused("prompt scale 1e300",
                  run_cache(0, ATTN_KV_CONTIGUOUS, 0, PROMPT, 0, 1e300, got), ATTN_ERR_INVALID,
                  "scale 1e+300");
    CHECK(all_value(got, N, SENTINEL));
    free(want);
    free(got);
}

/* ALiBi far from position 0 (q_offset up to 2^40): one query over keys
 * 0..3 of equal scores and slope 1 weighs key j by e^j whatever the offset,
 * out = sum j e^j / sum e^j, on every kernel set (the fused kernels' float32
 * distances lost their low bits past 2^24 and gave the keys equal weights;
 * such problems go to the reference). */
static void check_alibi_far(void) {
    double want = (exp(1) + 2 * exp(2) + 3 * exp(3)) / (1 + exp(1) + exp(2) + exp(3));
    const attn_kernels sets[] = {ATTN_KERNELS_REFERENCE, ATTN_KERNELS_AUTO};
    for (int e = 20; e <= 40; e += 4)
        for (size_t s = 0; s < 2; s++) {
            attn_ctx *c = NULL;
            CHECK_STATUS(attn_ctx_new(&(attn_ctx_config){.kernels = sets[s]}, &c), ATTN_OK);
            float q[1] = {0}, k[4] = {0, 0, 0, 0}, v[4] = {0, 1, 2, 3}, out[1], lse[1];
            float slope[1] = {1};
            attn_sdpa_config cfg = {.batch = 1, .heads = 1, .q_tokens = 1, .kv_tokens = 4,
                                    .head_dim = 1, .align = ATTN_ALIGN_OFFSET,
                                    .q_offset = (int64_t)1 << e, .alibi_slopes = slope};
            CHECK_STATUS(attn_sdpa_forward(c, &cfg, q, k, v, out, lse, NULL, NULL), ATTN_OK);
            CHECK_NEAR(out[0], want, 1e-5);
            attn_ctx_free(c);
        }
}

/* An lse with a NaN given to the backward: every kernel set gives the
 * reference's gradients (the fused kernels weighed that row's keys 0, and
 * dq, dk, dv differed by kernel set). */
static void check_nan_lse(void) {
    enum { NH = 2, NT = 4, ND = 8, N = NH * NT * ND };
    float q[N], k[N], v[N], o[N], lse[NH * NT], dout[N], g[2][3][N];
    for (int i = 0; i < N; i++) {
        q[i] = sinf((float)i), k[i] = cosf(0.7f * (float)i), v[i] = sinf(1.3f * (float)i);
        dout[i] = cosf(0.3f * (float)i);
    }
    const attn_kernels sets[] = {ATTN_KERNELS_REFERENCE, ATTN_KERNELS_AUTO};
    for (size_t s = 0; s < 2; s++) {
        attn_ctx *c = NULL;
        CHECK_STATUS(attn_ctx_new(&(attn_ctx_config){.kernels = sets[s]}, &c), ATTN_OK);
        attn_sdpa_config cfg = {.batch = 1, .heads = NH, .q_tokens = NT, .kv_tokens = NT,
                                .head_dim = ND, .causal = true};
        CHECK_STATUS(attn_sdpa_forward(c, &cfg, q, k, v, o, lse, NULL, NULL), ATTN_OK);
        lse[1] = NAN;
        CHECK_STATUS(attn_sdpa_backward(c, &cfg, q, k, v, o, lse, dout, g[s][0], g[s][1],
                                        g[s][2], NULL),
                     ATTN_OK);
        attn_ctx_free(c);
    }
    CHECK(memcmp(g[0], g[1], sizeof g[0]) == 0);
}

int main(void) {
    attn_ctx_config cc = {.num_threads = 2};
    CHECK_STATUS(attn_ctx_new(&cc, &ctx), ATTN_OK);
    sdpa_buffers *m = calloc(1, sizeof *m);
    int fwd = sweep_forward(m), bwd = sweep_backward(m);
    check_allowed(m);
    int modules = sweep_modules();
    int kv_new = sweep_cache_new();
    int kv_contiguous = sweep_attend(ATTN_KV_CONTIGUOUS), kv_paged = sweep_attend(ATTN_KV_PAGED);
    check_windows();
    check_alibi_far();
    check_nan_lse();
    printf("hostile cases: sdpa forward %d, sdpa backward %d, module forward/backward %d, "
           "kv_cache_new %d, kv attend/append contiguous %d, paged %d\n",
           fwd, bwd, modules, kv_new, kv_contiguous, kv_paged);
    free(m);
    attn_ctx_free(ctx);
    return check_summary();
}
