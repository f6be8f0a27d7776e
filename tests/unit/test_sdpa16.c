/*
 * test_sdpa16.c — attn_sdpa_forward_16 / attn_sdpa_backward_16 (bf16 and
 * f16 storage) against the exact attention of their inputs.
 *
 * For each case, random bf16 q, k, v, dout (uniform in [-amp, amp], then
 * rounded) are widened to double and run through attn_sdpa_*_f64: the
 * float64 truth for these very inputs. Then
 *   - the widened path (a ctx on the portable kernels: the tensors widened
 *     to float, the float attention, each output rounded once) must equal,
 *     bit for bit, the float calls on the widened tensors rounded by this
 *     file's own round-to-nearest-even (the conversions);
 *   - the fast path (a ctx on the AVX-512 kernels; vdpbf16ps where the CPU
 *     has avx512_bf16) must be within 2.5x the widened path's error vs the
 *     truth (relative L2 over each tensor: out, dq, dk, dv), plus 1e-4; its
 *     lse within 2e-3 (1 + |lse|); on an avx512_bf16 CPU it must differ
 *     from the widened path somewhere (else the kernel did not run);
 *   - 1, 2 and 3 threads give the same bits;
 *   - those fast ctxs are forced onto vdpbf16ps; one that is not takes it
 *     only where it outruns the float FMA (not on Intel's cores), else the
 *     widened path, bit for bit;
 *   - then, where the CPU has AMX, this process asks for the tiles
 *     (attn_cpu_request_amx, as an application does) and the cases of
 *     head_dim 64 and 128 run again on the same inputs, forward and
 *     backward now on AMX (the internal query attn_sdpa16_kernel says so):
 *     the same checks against the truth, and out, dq and dk must each
 *     differ from the vdpbf16ps kernels' somewhere (else AMX did not run);
 *     without AMX the test says that it skipped this part;
 * over shapes with odd lengths, head_dim 64/128/80/33, GQA, causal with
 * every alignment, windows, packed varlen batches, padded strides and
 * large scores (q, k up to 24: scaled scores in the hundreds). f16 and the
 * features the bf16 kernels leave to the widened path (dropout, softcap,
 * ALiBi, sinks, NaN or inf inputs, also past the scan's first 256 tokens
 * and in (B, H, T, D) strides) are checked bitwise against the float calls,
 * and so is a bias whose gradient the backward writes, which comes from the
 * float32 forward's out (not the rounded one) and must be within float32's
 * error of the float64 call's. Then the argument errors, with the values
 * named.
 *
 * Fresh random inputs each run: the seed is printed; argv[1] replays it.
 */
#include "attn.h"
#include "check.h"
#include "ops/sdpa16.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double uniform(uint64_t *s) { return (double)(splitmix(s) >> 11) * 0x1p-53 * 2.0 - 1.0; }

/* ---- this file's own conversions (independent of the library's) ---- */

static float from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}
static uint32_t to_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
static float bf16_value(uint16_t h) { return from_bits((uint32_t)h << 16); }
static uint16_t bf16_round(float x) {
    if (isnan(x)) return (uint16_t)((to_bits(x) >> 16) | 0x40u);
    uint32_t u = to_bits(x);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
/* f16 through double: exact arithmetic on the value. */
static float f16_value(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return (float)((h & 0x8000) ? -v : v);
}
static uint16_t f16_round(float x) {
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs((double)x);
    if (isnan(x)) return (uint16_t)(sign | 0x7E00 | ((to_bits(x) >> 13) & 0x3FF));
    if (a >= 65520.0) return (uint16_t)(sign | 0x7C00);
    int e;
    frexp(a, &e); /* a = f 2^e, f in [0.5, 1) */
    int exp = e - 1 < -14 ? -14 : e - 1;      /* the binade's exponent, subnormals at -14 */
    double units = nearbyint(ldexp(a, 10 - exp)); /* in ulps 2^(exp - 10), to even */
    uint32_t bits = (uint32_t)units;             /* 1024.. for normals, may carry to 2048 */
    if (a < ldexp(1.0, -14)) return (uint16_t)(sign | bits);
    if (bits >= 2048) {
        bits /= 2;
        exp++;
    }
    return (uint16_t)(sign | (uint32_t)(exp + 15) << 10 | (bits - 1024));
}

static float value_of(attn_dtype dt, uint16_t h) { return dt == ATTN_DTYPE_BF16 ? bf16_value(h) : f16_value(h); }
static uint16_t round_to(attn_dtype dt, float x) { return dt == ATTN_DTYPE_BF16 ? bf16_round(x) : f16_round(x); }

/* ---- cases ---- */

typedef struct case16 {
    const char *name;
    size_t B, H, Hkv, T, S, D;
    bool causal;
    attn_align align;
    long long q_offset;
    bool window;
    long long left, right;
    bool varlen, padded;
    double amp, scale;
} case16;

/* A case's tensors: 16-bit inputs (q, k, v, dout) and the buffers' sizes,
 * over a base that padded strides leave gaps in. */
typedef struct tensors16 {
    attn_sdpa_config cfg;
    int32_t cu_q[4], cu_kv[4];
    size_t nq, nk, rows_q; /* elements of q-side and k-side buffers; lse rows */
    uint16_t *q, *k, *v, *dout;
} tensors16;

static size_t pad_of(const case16 *c) { return c->padded ? 3 : 0; }

static void make_case(const case16 *c, attn_dtype dt, uint64_t *seed, tensors16 *t) {
    memset(t, 0, sizeof *t);
    attn_sdpa_config *cfg = &t->cfg;
    *cfg = (attn_sdpa_config){.batch = c->B, .heads = c->H, .q_tokens = c->T,
                              .kv_tokens = c->S, .head_dim = c->D, .scale = c->scale,
                              .causal = c->causal, .kv_heads = c->Hkv, .align = c->align,
                              .q_offset = c->q_offset, .window = c->window,
                              .window_left = c->left, .window_right = c->right};
    size_t tq = c->B * c->T, tk = c->B * c->S;
    if (c->varlen) { /* sequences of T, T - 2, ... tokens (at least 1) */
        t->cu_q[0] = t->cu_kv[0] = 0;
        for (size_t b = 0; b < c->B; b++) {
            size_t lq = c->T > 2 * b ? c->T - 2 * b : 1, lk = c->S > 3 * b ? c->S - 3 * b : 1;
            t->cu_q[b + 1] = t->cu_q[b] + (int32_t)lq;
            t->cu_kv[b + 1] = t->cu_kv[b] + (int32_t)lk;
        }
        cfg->cu_seqlens_q = t->cu_q;
        cfg->cu_seqlens_kv = t->cu_kv;
        tq = (size_t)t->cu_q[c->B];
        tk = (size_t)t->cu_kv[c->B];
    }
    size_t pad = pad_of(c), wq = c->H * c->D + pad, wk = c->Hkv * c->D + pad;
    if (c->padded) { /* (b, t, h) strides with gaps after each token's heads */
        size_t sq[3] = {c->T * wq, wq, c->D}, sk[3] = {c->S * wk, wk, c->D};
        memcpy(cfg->q_strides, sq, sizeof sq);
        memcpy(cfg->out_strides, sq, sizeof sq);
        memcpy(cfg->kv_strides, sk, sizeof sk);
    }
    t->nq = tq * wq;
    t->nk = tk * wk;
    t->rows_q = c->varlen ? c->H * tq : c->B * c->H * c->T;
    uint16_t **bufs[4] = {&t->q, &t->k, &t->v, &t->dout};
    size_t sizes[4] = {t->nq, t->nk, t->nk, t->nq};
    for (int i = 0; i < 4; i++) {
        *bufs[i] = malloc(sizes[i] * sizeof(uint16_t));
        double amp = i == 2 || i == 3 ? 1.0 : c->amp;
        for (size_t e = 0; e < sizes[i]; e++) (*bufs[i])[e] = round_to(dt, (float)(amp * uniform(seed)));
    }
}

static void free_case(tensors16 *t) {
    free(t->q);
    free(t->k);
    free(t->v);
    free(t->dout);
}

/* What a pass gives: out, lse; dq, dk, dv. */
typedef struct result16 {
    uint16_t *out, *dq, *dk, *dv;
    float *lse;
} result16;

static attn_status run16(attn_ctx *ctx, attn_dtype dt, const tensors16 *t, result16 *r) {
    r->out = calloc(t->nq, 2);
    r->dq = calloc(t->nq, 2);
    r->dk = calloc(t->nk, 2);
    r->dv = calloc(t->nk, 2);
    r->lse = calloc(t->rows_q, sizeof(float));
    attn_status st = attn_sdpa_forward_16(ctx, &t->cfg, dt, t->q, t->k, t->v, r->out, r->lse, NULL, NULL);
    if (st != ATTN_OK) return st;
    return attn_sdpa_backward_16(ctx, &t->cfg, dt, t->q, t->k, t->v, r->out, r->lse, t->dout,
                                 r->dq, r->dk, r->dv, NULL);
}

static void free_result(result16 *r) {
    free(r->out);
    free(r->dq);
    free(r->dk);
    free(r->dv);
    free(r->lse);
}

/* The float64 truth: (out, lse, dq, dk, dv) of the 16-bit inputs. The
 * backward recomputes from q, k, v (out and lse are only checked). */
typedef struct truth64 {
    double *out, *lse, *dq, *dk, *dv;
} truth64;

static double *widened64(attn_dtype dt, const uint16_t *x, size_t n) {
    double *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++) y[i] = value_of(dt, x[i]);
    return y;
}

static void truth_of(attn_ctx *ctx, attn_dtype dt, const tensors16 *t, truth64 *w) {
    double *q = widened64(dt, t->q, t->nq), *k = widened64(dt, t->k, t->nk);
    double *v = widened64(dt, t->v, t->nk), *dout = widened64(dt, t->dout, t->nq);
    w->out = calloc(t->nq, sizeof(double));
    w->lse = calloc(t->rows_q, sizeof(double));
    w->dq = calloc(t->nq, sizeof(double));
    w->dk = calloc(t->nk, sizeof(double));
    w->dv = calloc(t->nk, sizeof(double));
    CHECK_STATUS(attn_sdpa_forward_f64(ctx, &t->cfg, q, k, v, w->out, w->lse, NULL, NULL), ATTN_OK);
    CHECK_STATUS(attn_sdpa_backward_f64(ctx, &t->cfg, q, k, v, w->out, w->lse, dout, w->dq, w->dk,
                                        w->dv, NULL),
                 ATTN_OK);
    free(q);
    free(k);
    free(v);
    free(dout);
}

static void free_truth(truth64 *w) {
    free(w->out);
    free(w->lse);
    free(w->dq);
    free(w->dk);
    free(w->dv);
}

/* Elements of a padded buffer that are the tensor's (not the gaps). */
static bool in_view(const case16 *c, size_t e, size_t heads) {
    size_t w = heads * c->D + pad_of(c);
    return e % w < heads * c->D;
}

/* ||got - want|| / ||want|| over the view's elements. */
static double rel_l2(const case16 *c, attn_dtype dt, const uint16_t *got, const double *want,
                     size_t n, size_t heads) {
    double num = 0.0, den = 0.0;
    for (size_t e = 0; e < n; e++) {
        if (!in_view(c, e, heads)) continue;
        double d = value_of(dt, got[e]) - want[e];
        num += d * d;
        den += want[e] * want[e];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

static bool same16(const uint16_t *a, const uint16_t *b, size_t n) { return memcmp(a, b, n * 2) == 0; }

static bool same_lse(const float *a, const float *b, size_t n) {
    return memcmp(a, b, n * sizeof *a) == 0;
}

static attn_ctx *make_ctx(size_t threads, attn_kernels kernels) {
    attn_ctx *ctx = NULL;
    attn_ctx_new(&(attn_ctx_config){.num_threads = threads, .kernels = kernels}, &ctx);
    return ctx;
}

static bool cpu_has_bf16(void) {
#if defined(__x86_64__) || defined(__i386__)
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
#else
    return false;
#endif
}

/* The widened path bit for bit: the float calls on the widened tensors,
 * rounded here. */
static void check_widened_bitwise(attn_ctx *ctx, attn_dtype dt, const tensors16 *t,
                                  const result16 *r, const char *name) {
    size_t nq = t->nq, nk = t->nk;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *dout = malloc(nq * 4);
    float *out = calloc(nq, 4), *lse = calloc(t->rows_q, 4), *dq = calloc(nq, 4);
    float *dk = calloc(nk, 4), *dv = calloc(nk, 4), *o16 = malloc(nq * 4);
    for (size_t e = 0; e < nq; e++) {
        q[e] = value_of(dt, t->q[e]);
        dout[e] = value_of(dt, t->dout[e]);
        o16[e] = value_of(dt, r->out[e]);
    }
    for (size_t e = 0; e < nk; e++) {
        k[e] = value_of(dt, t->k[e]);
        v[e] = value_of(dt, t->v[e]);
    }
    CHECK_STATUS(attn_sdpa_forward(ctx, &t->cfg, q, k, v, out, lse, NULL, NULL), ATTN_OK);
    /* the backward as the 16-bit call runs it: on the rounded out */
    CHECK_STATUS(attn_sdpa_backward(ctx, &t->cfg, q, k, v, o16, lse, dout, dq, dk, dv, NULL), ATTN_OK);
    bool ok = same_lse(lse, r->lse, t->rows_q);
    for (size_t e = 0; e < nq; e++)
        ok = ok && r->out[e] == round_to(dt, out[e]) && r->dq[e] == round_to(dt, dq[e]);
    for (size_t e = 0; e < nk; e++)
        ok = ok && r->dk[e] == round_to(dt, dk[e]) && r->dv[e] == round_to(dt, dv[e]);
    if (!ok) fprintf(stderr, "%s (%s): widened path != float calls rounded\n", name, attn_dtype_name(dt));
    CHECK(ok);
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv), free(o16);
}

/* The fast path on t (fresh or kept inputs of case c): its errors vs the
 * float64 truth within 2.5x the widened path's, its lse, that it ran, the
 * same bits on 1, 2, 3 threads, padded gaps untouched. *kept gets the
 * outputs of 1 thread (the caller frees them). */
static void check_tensors(const case16 *c, const tensors16 *tp, attn_ctx *portable,
                          attn_ctx *fast[3], attn_ctx *ref, result16 *kept) {
    attn_dtype dt = ATTN_DTYPE_BF16;
    const tensors16 t = *tp;
    truth64 w;
    truth_of(ref, dt, &t, &w);
    result16 wide, f[3];
    CHECK_STATUS(run16(portable, dt, &t, &wide), ATTN_OK);
    check_widened_bitwise(portable, dt, &t, &wide, c->name);
    for (int i = 0; i < 3; i++) CHECK_STATUS(run16(fast[i], dt, &t, &f[i]), ATTN_OK);
    /* errors vs the truth */
    const char *names[4] = {"out", "dq", "dk", "dv"};
    uint16_t *wide_t[4] = {wide.out, wide.dq, wide.dk, wide.dv};
    uint16_t *fast_t[4] = {f[0].out, f[0].dq, f[0].dk, f[0].dv};
    double *truth[4] = {w.out, w.dq, w.dk, w.dv};
    size_t n[4] = {t.nq, t.nq, t.nk, t.nk}, heads[4] = {c->H, c->H, c->Hkv, c->Hkv};
    printf("  %-28s", c->name);
    for (int i = 0; i < 4; i++) {
        double ew = rel_l2(c, dt, wide_t[i], truth[i], n[i], heads[i]);
        double ef = rel_l2(c, dt, fast_t[i], truth[i], n[i], heads[i]);
        printf(" %s %.2e/%.2e", names[i], ef, ew);
        if (!(ef <= 2.5 * ew + 1e-4)) {
            fprintf(stderr, "%s: fast %s error %.3e > 2.5 x widened %.3e + 1e-4\n", c->name,
                    names[i], ef, ew);
            CHECK(ef <= 2.5 * ew + 1e-4);
        } else {
            check_passed++;
        }
    }
    printf("\n");
    double worst = 0.0;
    for (size_t i = 0; i < t.rows_q; i++) {
        double d = isinf(w.lse[i]) ? (f[0].lse[i] == w.lse[i] ? 0.0 : INFINITY)
                                   : fabs(f[0].lse[i] - w.lse[i]) / (1.0 + fabs(w.lse[i]));
        worst = d > worst ? d : worst;
    }
    if (worst > 2e-3) fprintf(stderr, "%s: lse off by %.3e (relative to 1 + |lse|)\n", c->name, worst);
    CHECK(worst <= 2e-3);
    /* the kernel ran: its P and dS rounding shows somewhere */
    bool differs = !same16(f[0].out, wide.out, t.nq) || !same16(f[0].dq, wide.dq, t.nq);
    if (cpu_has_bf16() && !differs) fprintf(stderr, "%s: fast path equals the widened one\n", c->name);
    CHECK(!cpu_has_bf16() || differs);
    /* any thread count, the same bits */
    for (int i = 1; i < 3; i++) {
        bool same = same16(f[0].out, f[i].out, t.nq) && same_lse(f[0].lse, f[i].lse, t.rows_q) &&
                    same16(f[0].dq, f[i].dq, t.nq) && same16(f[0].dk, f[i].dk, t.nk) &&
                    same16(f[0].dv, f[i].dv, t.nk);
        if (!same) fprintf(stderr, "%s: %d threads differ from 1\n", c->name, i + 1);
        CHECK(same);
    }
    /* outputs leave the gaps of padded strides alone (calloc'd: zero) */
    if (c->padded) {
        bool clean = true;
        for (size_t e = 0; e < t.nq; e++)
            if (!in_view(c, e, c->H)) clean = clean && f[0].out[e] == 0 && f[0].dq[e] == 0;
        CHECK(clean);
    }
    free_result(&wide);
    for (int i = 1; i < 3; i++) free_result(&f[i]);
    *kept = f[0];
    free_truth(&w);
}

/* The choice on a ctx no test has forced, before any AMX request: the
 * vdpbf16ps kernels where they outrun the float FMA (avx512_bf16 on a CPU
 * not Intel's), else the widened path, which must then be bit for bit the
 * float calls on the widened tensors (on Intel's cores vdpbf16ps issues at
 * half the FMA's rate: core/cpu_info.h). */
static void check_default_choice(const case16 *c, const tensors16 *t, attn_kernels best) {
    attn_ctx *ctx = make_ctx(2, best);
    attn_cpu_info cpu;
    CHECK_STATUS(attn_cpu_info_get(&cpu), ATTN_OK);
    bool intel = strcmp(cpu.vendor, "GenuineIntel") == 0;
    bool dot = best == ATTN_KERNELS_AVX512 && cpu_has_bf16() && !intel;
    const char *want = dot ? "vdpbf16ps" : "widened";
    for (int backward = 0; backward < 2; backward++) {
        const char *got = attn_sdpa16_kernel(ctx, &t->cfg, ATTN_DTYPE_BF16, backward);
        if (strcmp(got, want) != 0)
            fprintf(stderr, "%s: the default %s runs on %s, not %s\n", c->name,
                    backward ? "backward" : "forward", got, want);
        CHECK(strcmp(got, want) == 0);
    }
    printf("  default choice (no AMX asked for, %s): %s\n", cpu.vendor[0] ? cpu.vendor : "?",
           want);
    if (strcmp(want, "widened") == 0) {
        result16 r;
        CHECK_STATUS(run16(ctx, ATTN_DTYPE_BF16, t, &r), ATTN_OK);
        check_widened_bitwise(ctx, ATTN_DTYPE_BF16, t, &r, c->name);
        free_result(&r);
    }
    attn_ctx_free(ctx);
}

/* Whether the AMX forward can take case c (head_dim in whole tile steps). */
static bool amx_shape(const case16 *c) { return c->D % 32 == 0; }

/* A case on fresh inputs; those AMX may take are kept with their fast
 * outputs (*kept_t, *kept_r) for the AMX pass, the rest freed. */
static bool check_case(const case16 *c, uint64_t *seed, attn_ctx *portable, attn_ctx *fast[3],
                       attn_ctx *ref, tensors16 *kept_t, result16 *kept_r) {
    make_case(c, ATTN_DTYPE_BF16, seed, kept_t);
    check_tensors(c, kept_t, portable, fast, ref, kept_r);
    if (amx_shape(c)) return true;
    free_result(kept_r);
    free_case(kept_t);
    return false;
}

/* Asks the OS for the AMX tile data, as an application that wants attn's
 * AMX kernels does (the library never asks by itself); true when given. */
static bool request_amx(void) {
    attn_cpu_info cpu;
    return attn_cpu_request_amx() == ATTN_OK && attn_cpu_info_get(&cpu) == ATTN_OK &&
           cpu.amx_bf16;
}

/* Elements where two 16-bit tensors differ. */
static size_t count_differing(const uint16_t *a, const uint16_t *b, size_t n) {
    size_t count = 0;
    for (size_t e = 0; e < n; e++) count += a[e] != b[e];
    return count;
}

/* The kept cases again, on AMX now: the same checks, the query saying
 * "amx" for both passes, and out, dq, dk that each differ from the
 * vdpbf16ps kernels' somewhere over the cases (the order of their sums and
 * the blocks of 32 keys round otherwise). */
static void check_amx(const case16 *const cases[], tensors16 *t, result16 *vdp, size_t n,
                      attn_ctx *portable, attn_ctx *fast[3], attn_ctx *ref, bool vdp_ran) {
    size_t differing[4] = {0, 0, 0, 0}, elements[4] = {0, 0, 0, 0};
    for (size_t i = 0; i < n; i++) {
        for (int backward = 0; backward < 2; backward++) {
            const char *kernel = attn_sdpa16_kernel(fast[0], &t[i].cfg, ATTN_DTYPE_BF16, backward);
            if (strcmp(kernel, "amx") != 0)
                fprintf(stderr, "%s: %s on %s, not amx\n", cases[i]->name,
                        backward ? "backward" : "forward", kernel);
            CHECK(strcmp(kernel, "amx") == 0);
        }
        result16 amx;
        check_tensors(cases[i], &t[i], portable, fast, ref, &amx);
        uint16_t *a[4] = {amx.out, amx.dq, amx.dk, amx.dv};
        uint16_t *v[4] = {vdp[i].out, vdp[i].dq, vdp[i].dk, vdp[i].dv};
        size_t sizes[4] = {t[i].nq, t[i].nq, t[i].nk, t[i].nk};
        for (int x = 0; x < 4; x++) {
            differing[x] += count_differing(a[x], v[x], sizes[x]);
            elements[x] += sizes[x];
        }
        free_result(&amx);
    }
    printf("  amx vs vdpbf16ps, elements that differ: out %zu/%zu dq %zu/%zu dk %zu/%zu "
           "dv %zu/%zu\n", differing[0], elements[0], differing[1], elements[1], differing[2],
           elements[2], differing[3], elements[3]);
    /* dv = P^T dO from the same P: only the order of its sums differs, which
     * rarely shows in bf16; out, dq, dk carry the rounding of S and dP */
    for (int x = 0; x < 3; x++)
        if (vdp_ran) CHECK(differing[x] > 0);
}

/* Case t (freed here) on the fast ctx: bitwise the float calls. */
static void check_widened_case(attn_ctx *fast, attn_dtype dt, tensors16 *t, const char *name) {
    result16 r;
    CHECK_STATUS(run16(fast, dt, t, &r), ATTN_OK);
    check_widened_bitwise(fast, dt, t, &r, name);
    printf("  %-28s bitwise the float calls rounded\n", name);
    free_result(&r);
    free_case(t);
}

/* A dout so small that the bf16 products would flush its products: the
 * forward runs where it may, the backward bitwise the float call on the
 * widened tensors, the 16-bit out and the forward's lse. */
static void check_tiny_dout(uint64_t *seed, attn_ctx *fast) {
    case16 c = {"tiny dout", 2, 4, 2, 19, 23, 64, true, ATTN_ALIGN_BOTTOM_RIGHT, 0, false, 0, 0,
                false, false, 1.0, 0.0};
    attn_dtype dt = ATTN_DTYPE_BF16;
    tensors16 t;
    make_case(&c, dt, seed, &t);
    for (size_t e = 0; e < t.nq; e++) t.dout[e] = round_to(dt, value_of(dt, t.dout[e]) * 1e-37f);
    result16 r;
    CHECK_STATUS(run16(fast, dt, &t, &r), ATTN_OK);
    size_t nq = t.nq, nk = t.nk;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *dout = malloc(nq * 4);
    float *o16 = malloc(nq * 4), *dq = calloc(nq, 4), *dk = calloc(nk, 4), *dv = calloc(nk, 4);
    for (size_t e = 0; e < nq; e++) {
        q[e] = value_of(dt, t.q[e]);
        dout[e] = value_of(dt, t.dout[e]);
        o16[e] = value_of(dt, r.out[e]);
    }
    for (size_t e = 0; e < nk; e++) {
        k[e] = value_of(dt, t.k[e]);
        v[e] = value_of(dt, t.v[e]);
    }
    CHECK_STATUS(attn_sdpa_backward(fast, &t.cfg, q, k, v, o16, r.lse, dout, dq, dk, dv, NULL),
                 ATTN_OK);
    bool ok = true;
    for (size_t e = 0; e < nq; e++) ok = ok && r.dq[e] == round_to(dt, dq[e]);
    for (size_t e = 0; e < nk; e++)
        ok = ok && r.dk[e] == round_to(dt, dk[e]) && r.dv[e] == round_to(dt, dv[e]);
    if (!ok) fprintf(stderr, "bf16 dout near 1e-37: backward != float call rounded\n");
    CHECK(ok);
    printf("  %-28s backward bitwise the float call rounded\n", "bf16 dout near 1e-37");
    free(q), free(k), free(v), free(dout), free(o16), free(dq), free(dk), free(dv);
    free_result(&r);
    free_case(&t);
}

/* f16, and the features only the widened path has: bitwise the float calls. */
static void check_widened_features(uint64_t *seed, attn_ctx *fast) {
    float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f}, sinks[4] = {0.3f, -1.0f, 2.0f, 0.0f};
    float sinks_grad[4];
    case16 c = {"features", 2, 4, 2, 19, 23, 64, true, ATTN_ALIGN_BOTTOM_RIGHT, 0, false, 0, 0,
                false, false, 1.0, 0.0};
    for (int variant = 0; variant < 5; variant++) {
        attn_dtype dt = variant == 0 ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16;
        tensors16 t;
        make_case(&c, dt, seed, &t);
        const char *name = "f16";
        if (variant == 1) {
            name = "bf16 softcap + ALiBi + sinks";
            t.cfg.softcap = 5.0;
            t.cfg.alibi_slopes = slopes;
            t.cfg.sinks = sinks;
            t.cfg.sinks_grad = sinks_grad;
        } else if (variant == 2) {
            name = "bf16 NaN in q";
            t.q[5] = 0x7FC0;
        } else if (variant == 3) {
            name = "bf16 head_dim 64, v_head_dim 32";
            t.cfg.v_head_dim = 32;
        } else {
            /* normal bf16 values whose products with the weights fall
             * below float32's normal range, which the bf16 products flush */
            name = "bf16 v near 1e-37";
            for (size_t e = 0; e < t.nk; e++) t.v[e] = round_to(dt, value_of(dt, t.v[e]) * 1e-37f);
        }
        check_widened_case(fast, dt, &t, name);
    }
    /* the scan's later units: past its first 256 tokens (heads side by
     * side), of a later batch and head, and in (B, H, T, D) strides */
    case16 long_case = {"scan", 2, 4, 2, 300, 300, 64, true, ATTN_ALIGN_BOTTOM_RIGHT, 0, false,
                        0, 0, false, false, 1.0, 0.0};
    for (int variant = 0; variant < 2; variant++) {
        tensors16 t;
        make_case(&long_case, ATTN_DTYPE_BF16, seed, &t);
        size_t H = long_case.H, Hkv = long_case.Hkv, T = long_case.T, S = long_case.S;
        size_t D = long_case.D;
        const char *name;
        if (variant == 0) {
            name = "bf16 inf in k, key 290";
            t.k[((1 * S + 290) * Hkv + 1) * D + 5] = 0x7F80; /* (b 1, key 290, head 1, d 5) */
        } else {
            name = "bf16 NaN in v, (B,H,T,D)";
            size_t q_st[3] = {H * T * D, D, T * D}, kv_st[3] = {Hkv * S * D, D, S * D};
            memcpy(t.cfg.q_strides, q_st, sizeof q_st);
            memcpy(t.cfg.kv_strides, kv_st, sizeof kv_st);
            t.v[(1 * Hkv + 1) * S * D + (S - 1) * D + 63] = 0xFFC0; /* b 1, head 1, last key */
        }
        check_widened_case(fast, ATTN_DTYPE_BF16, &t, name);
    }
}

/* Dropout through the 16-bit call: the float call's mask and values. */
static void check_dropout(uint64_t *seed, attn_ctx *fast) {
    case16 c = {"dropout", 1, 2, 2, 17, 17, 32, true, ATTN_ALIGN_BOTTOM_RIGHT, 0, false, 0, 0,
                false, false, 1.0, 0.0};
    tensors16 t;
    make_case(&c, ATTN_DTYPE_BF16, seed, &t);
    t.cfg.dropout = 0.25;
    size_t nq = t.nq, nk = t.nk;
    uint16_t *out = calloc(nq, 2);
    float *lse = calloc(t.rows_q, 4), *qf = malloc(nq * 4), *kf = malloc(nk * 4), *vf = malloc(nk * 4);
    float *outf = calloc(nq, 4), *lsef = calloc(t.rows_q, 4);
    for (size_t e = 0; e < nq; e++) qf[e] = bf16_value(t.q[e]);
    for (size_t e = 0; e < nk; e++) kf[e] = bf16_value(t.k[e]), vf[e] = bf16_value(t.v[e]);
    attn_rng *r1, *r2;
    attn_rng_new(fast, 77, &r1);
    attn_rng_new(fast, 77, &r2);
    attn_rng_set_bernoulli_method(r1, ATTN_BERNOULLI_PHILOX);
    attn_rng_set_bernoulli_method(r2, ATTN_BERNOULLI_PHILOX);
    attn_sdpa_dropout d1, d2;
    CHECK_STATUS(attn_sdpa_forward_16(fast, &t.cfg, ATTN_DTYPE_BF16, t.q, t.k, t.v, out, lse, r1, &d1), ATTN_OK);
    CHECK_STATUS(attn_sdpa_forward(fast, &t.cfg, qf, kf, vf, outf, lsef, r2, &d2), ATTN_OK);
    bool same = d1.seed == d2.seed && d1.offset == d2.offset && same_lse(lse, lsef, t.rows_q);
    for (size_t e = 0; e < nq; e++) same = same && out[e] == bf16_round(outf[e]);
    CHECK(same);
    printf("  %-28s bitwise the float call rounded\n", "bf16 dropout 0.25");
    attn_rng_free(r1);
    attn_rng_free(r2);
    free(out), free(lse), free(qf), free(kf), free(vf), free(outf), free(lsef);
    free_case(&t);
}

/* A bias (ATTN_SCORE_BIAS, broadcast over batch) whose gradient the
 * backward writes: float32's, from the float32 forward's out, as PyTorch
 * computes it; the 16-bit out's rounding would reach every dS_ij of a row
 * through delta_i = dout_i . out_i. The bias gradient, and dq, dk, dv
 * rounded, must be the float calls' on the widened tensors bit for bit,
 * and the bias gradient within float32's error of the float64 call's. */
static void check_bias_grad(uint64_t *seed, attn_ctx *fast) {
    case16 c = {"bias", 2, 4, 2, 19, 23, 64, true, ATTN_ALIGN_BOTTOM_RIGHT, 0, false, 0, 0,
                false, false, 1.0, 0.0};
    size_t H = c.H, T = c.T, S = c.S, nb = H * T * S;
    for (int variant = 0; variant < 2; variant++) {
        attn_dtype dt = variant == 0 ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F16;
        tensors16 t;
        make_case(&c, dt, seed, &t);
        size_t nq = t.nq, nk = t.nk, rows = t.rows_q;
        float *bias = malloc(nb * 4), *g16 = calloc(nb, 4), *g32 = calloc(nb, 4);
        for (size_t e = 0; e < nb; e++) bias[e] = (float)(2.0 * uniform(seed));
        attn_score_mod mod = {.kind = ATTN_SCORE_BIAS, .tensor = bias,
                              .strides = {0, T * S, S, 1}};
        t.cfg.score_mods = &mod;
        t.cfg.score_mod_count = 1;
        /* the 16-bit calls */
        uint16_t *out = calloc(nq, 2), *dq = calloc(nq, 2), *dk = calloc(nk, 2);
        uint16_t *dv = calloc(nk, 2);
        float *lse = calloc(rows, 4);
        CHECK_STATUS(attn_sdpa_forward_16(fast, &t.cfg, dt, t.q, t.k, t.v, out, lse, NULL, NULL),
                     ATTN_OK);
        mod.tensor_grad = g16;
        CHECK_STATUS(attn_sdpa_backward_16(fast, &t.cfg, dt, t.q, t.k, t.v, out, lse, t.dout, dq,
                                           dk, dv, NULL),
                     ATTN_OK);
        /* the float calls on the widened tensors */
        float *qf = malloc(nq * 4), *kf = malloc(nk * 4), *vf = malloc(nk * 4);
        float *doutf = malloc(nq * 4), *outf = calloc(nq, 4), *lsef = calloc(rows, 4);
        float *dqf = calloc(nq, 4), *dkf = calloc(nk, 4), *dvf = calloc(nk, 4);
        for (size_t e = 0; e < nq; e++) {
            qf[e] = value_of(dt, t.q[e]);
            doutf[e] = value_of(dt, t.dout[e]);
        }
        for (size_t e = 0; e < nk; e++) {
            kf[e] = value_of(dt, t.k[e]);
            vf[e] = value_of(dt, t.v[e]);
        }
        mod.tensor_grad = NULL;
        CHECK_STATUS(attn_sdpa_forward(fast, &t.cfg, qf, kf, vf, outf, lsef, NULL, NULL), ATTN_OK);
        mod.tensor_grad = g32;
        CHECK_STATUS(attn_sdpa_backward(fast, &t.cfg, qf, kf, vf, outf, lsef, doutf, dqf, dkf, dvf,
                                        NULL),
                     ATTN_OK);
        bool same = same_lse(lse, lsef, rows) && memcmp(g16, g32, nb * 4) == 0;
        for (size_t e = 0; e < nq; e++)
            same = same && out[e] == round_to(dt, outf[e]) && dq[e] == round_to(dt, dqf[e]);
        for (size_t e = 0; e < nk; e++)
            same = same && dk[e] == round_to(dt, dkf[e]) && dv[e] == round_to(dt, dvf[e]);
        CHECK(same);
        /* the float64 call's bias gradient (its bias stays float) */
        double *q64 = widened64(dt, t.q, nq), *k64 = widened64(dt, t.k, nk);
        double *v64 = widened64(dt, t.v, nk), *d64 = widened64(dt, t.dout, nq);
        double *o64 = calloc(nq, 8), *l64 = calloc(rows, 8), *dq64 = calloc(nq, 8);
        double *dk64 = calloc(nk, 8), *dv64 = calloc(nk, 8);
        float *g64f = calloc(nb, 4);
        mod.tensor_grad = NULL;
        CHECK_STATUS(attn_sdpa_forward_f64(fast, &t.cfg, q64, k64, v64, o64, l64, NULL, NULL),
                     ATTN_OK);
        mod.tensor_grad = g64f;
        CHECK_STATUS(attn_sdpa_backward_f64(fast, &t.cfg, q64, k64, v64, o64, l64, d64, dq64, dk64,
                                            dv64, NULL),
                     ATTN_OK);
        double num = 0.0, den = 0.0;
        for (size_t e = 0; e < nb; e++) {
            double d = (double)g16[e] - (double)g64f[e];
            num += d * d;
            den += (double)g64f[e] * g64f[e];
        }
        double rel = sqrt(num / (den > 0.0 ? den : 1.0));
        CHECK(den > 0.0 && rel <= 1e-5);
        printf("  %-28s bias gradient the float calls' bitwise, %.2e from float64\n",
               dt == ATTN_DTYPE_BF16 ? "bf16 bias with its gradient" : "f16 bias with its gradient",
               rel);
        free(bias), free(g16), free(g32), free(g64f);
        free(out), free(dq), free(dk), free(dv), free(lse);
        free(qf), free(kf), free(vf), free(doutf), free(outf), free(lsef), free(dqf), free(dkf),
            free(dvf);
        free(q64), free(k64), free(v64), free(d64), free(o64), free(l64), free(dq64), free(dk64),
            free(dv64);
        free_case(&t);
    }
}

static void check_errors(attn_ctx *ctx) {
    uint16_t q[64] = {0}, k[64] = {0}, v[64] = {0}, out[64], dq[64], dk[64], dv[64];
    float lse[8];
    attn_sdpa_config cfg = {.batch = 1, .heads = 1, .q_tokens = 2, .kv_tokens = 2, .head_dim = 4};
    CHECK_STATUS(attn_sdpa_forward_16(NULL, &cfg, ATTN_DTYPE_BF16, q, k, v, out, lse, NULL, NULL),
                 ATTN_ERR_NULL);
    CHECK_STATUS(attn_sdpa_forward_16(ctx, NULL, ATTN_DTYPE_BF16, q, k, v, out, lse, NULL, NULL),
                 ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "attn_sdpa_forward_16: cfg is NULL");
    CHECK_STATUS(attn_sdpa_forward_16(ctx, &cfg, ATTN_DTYPE_BF16, q, NULL, v, out, lse, NULL, NULL),
                 ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "attn_sdpa_forward_16: k is NULL");
    CHECK_STATUS(attn_sdpa_forward_16(ctx, &cfg, ATTN_DTYPE_I32, q, k, v, out, lse, NULL, NULL),
                 ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "dtype (I32, 9) must be BF16, F16 or F32");
    CHECK_STATUS(attn_sdpa_forward_16(ctx, &cfg, (attn_dtype)99, q, k, v, out, lse, NULL, NULL),
                 ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "(?, 99)");
    attn_sdpa_config bad = cfg;
    bad.heads = 3;
    bad.kv_heads = 2;
    CHECK_STATUS(attn_sdpa_forward_16(ctx, &bad, ATTN_DTYPE_BF16, q, k, v, out, lse, NULL, NULL),
                 ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "attn_sdpa_forward_16: kv_heads (2) must divide heads (3)");
    bad = cfg;
    bad.dropout = 0.5;
    CHECK_STATUS(attn_sdpa_forward_16(ctx, &bad, ATTN_DTYPE_F16, q, k, v, out, lse, NULL, NULL),
                 ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "dropout (0.5) needs an rng");
    bad = cfg;
    bad.scale = INFINITY;
    CHECK_STATUS(attn_sdpa_backward_16(ctx, &bad, ATTN_DTYPE_BF16, q, k, v, out, lse, q, dq, dk, dv, NULL),
                 ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "attn_sdpa_backward_16: scale (inf) must be finite");
    CHECK_STATUS(attn_sdpa_backward_16(ctx, &cfg, ATTN_DTYPE_BF16, q, k, v, out, NULL, q, dq, dk, dv, NULL),
                 ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "attn_sdpa_backward_16: lse is NULL");
    CHECK_STATUS(attn_sdpa_backward_16(ctx, &cfg, ATTN_DTYPE_U8, q, k, v, out, lse, q, dq, dk, dv, NULL),
                 ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "attn_sdpa_backward_16: dtype (U8, 5) must be BF16, F16 or F32");
    bad = cfg;
    bad.q_tokens = 0;
    CHECK_STATUS(attn_sdpa_backward_16(ctx, &bad, ATTN_DTYPE_BF16, q, k, v, out, lse, q, dq, dk, dv, NULL),
                 ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "attn_sdpa_backward_16: batch (1), heads (1), kv_heads (1), q_tokens (0)");
    /* F32 runs the float calls: their bits, their messages */
    float qf[8], kf[8], vf[8], of[8], og[8], lf[2], lg[2];
    for (int i = 0; i < 8; i++) qf[i] = (float)i * 0.3f - 1.0f, kf[i] = 0.5f - (float)i * 0.1f, vf[i] = (float)i;
    CHECK_STATUS(attn_sdpa_forward_16(ctx, &cfg, ATTN_DTYPE_F32, qf, kf, vf, of, lf, NULL, NULL), ATTN_OK);
    CHECK_STATUS(attn_sdpa_forward(ctx, &cfg, qf, kf, vf, og, lg, NULL, NULL), ATTN_OK);
    CHECK(memcmp(of, og, sizeof of) == 0 && memcmp(lf, lg, sizeof lf) == 0);
    CHECK_STATUS(attn_sdpa_forward_16(ctx, &cfg, ATTN_DTYPE_F32, qf, NULL, vf, of, lf, NULL, NULL),
                 ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "attn_sdpa_forward: k is NULL");
}

/* Finite scores too large for the 16-bit tiles' exponents (|s c| past
 * 2^24, where their rounding reaches whole powers of 2): q = k = (a, 0,
 * ...), v = 1, so every weight is 1 / S and out is exactly 1, lse = log S
 * + a^2 / 8; the fused16 kernels gave NaN and +inf (S = 1, 40) or 0 and
 * -inf from a ~ 2e5 (scaled scores ~5e9). */
static void check_huge_scores(attn_ctx *ctx, const char *kernels) {
    enum { D = 64 };
    const float amps[] = {5e3f, 2e5f, 2.6e5f, 1e7f};
    const size_t lengths[] = {1, 2, 40};
    double worst = 0.0;
    for (size_t ia = 0; ia < sizeof amps / sizeof *amps; ia++)
        for (size_t il = 0; il < sizeof lengths / sizeof *lengths; il++) {
            size_t S = lengths[il];
            uint16_t q[D] = {0}, *k = calloc(S * D, 2), *v = calloc(S * D, 2), out[D];
            float lse = 0.0f;
            q[0] = bf16_round(amps[ia]);
            for (size_t j = 0; j < S; j++) {
                k[j * D] = q[0];
                for (size_t d = 0; d < D; d++) v[j * D + d] = bf16_round(1.0f);
            }
            attn_sdpa_config cfg = {.batch = 1, .heads = 1, .q_tokens = 1, .kv_tokens = S,
                                    .head_dim = D};
            CHECK(attn_sdpa_forward_16(ctx, &cfg, ATTN_DTYPE_BF16, q, k, v, out, &lse, NULL,
                                       NULL) == ATTN_OK);
            double a = bf16_value(q[0]), want = log((double)S) + a * a / 8.0;
            size_t wrong = 0;
            while (wrong < D && bf16_value(out[wrong]) == 1.0f) wrong++;
            if (wrong < D)
                printf("FAIL huge scores (%s): a %g, S %zu: out[%zu] = %g, not 1\n", kernels, a,
                       S, wrong, bf16_value(out[wrong]));
            CHECK(wrong == D);
            double rel = fabs((double)lse - want) / want;
            CHECK(rel <= 1e-6);
            worst = check_worse(worst, rel);
            free(k), free(v);
        }
    printf("  huge scores (a to 1e7) on %s: out 1, lse within %.2g of log S + a^2/8\n", kernels,
           worst);
}

int main(int argc, char **argv) {
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : (uint64_t)time(NULL) ^ (uint64_t)clock();
    printf("test_sdpa16: seed %llu (bf16 kernels: %s)\n", (unsigned long long)seed,
           cpu_has_bf16() ? "vdpbf16ps" : "not on this CPU: the widened path");
    attn_kernels best = attn_kernels_supported(ATTN_KERNELS_AVX512) ? ATTN_KERNELS_AVX512
                                                                    : ATTN_KERNELS_PORTABLE;
    attn_ctx *portable = make_ctx(1, ATTN_KERNELS_PORTABLE), *ref = make_ctx(1, ATTN_KERNELS_REFERENCE);
    attn_ctx *fast[3] = {make_ctx(1, best), make_ctx(2, best), make_ctx(3, best)};
    /* the vdpbf16ps kernels on every CPU that has them, also where the
     * default widens (Intel's) */
    for (int i = 0; i < 3; i++) attn_sdpa16_force_dot(fast[i]);
    /* name, B, H, Hkv, T, S, D, causal, align, q_offset, window, left, right, varlen, padded, amp, scale */
    const case16 cases[] = {
        {"plain 1x2 T=77 d64", 1, 2, 2, 77, 77, 64, false, ATTN_ALIGN_BOTTOM_RIGHT, 0, false, 0, 0, false, false, 1, 0},
        {"causal T=130 d64", 1, 2, 2, 130, 130, 64, true, ATTN_ALIGN_BOTTOM_RIGHT, 0, false, 0, 0, false, false, 1, 0},
        {"causal d128 GQA 4:2", 2, 4, 2, 67, 67, 128, true, ATTN_ALIGN_BOTTOM_RIGHT, 0, false, 0, 0, false, false, 1, 0},
        {"d80 T=45 S=150 br", 1, 3, 1, 45, 150, 80, true, ATTN_ALIGN_BOTTOM_RIGHT, 0, false, 0, 0, false, false, 1, 0},
        {"d80 T=150 S=45 top-left", 1, 2, 1, 150, 45, 80, true, ATTN_ALIGN_TOP_LEFT, 0, false, 0, 0, false, false, 1, 0},
        {"d33 offset -7 causal", 1, 2, 2, 40, 60, 33, true, ATTN_ALIGN_OFFSET, -7, false, 0, 0, false, false, 1, 0},
        {"window (20, 5) d64", 1, 2, 2, 200, 200, 64, false, ATTN_ALIGN_BOTTOM_RIGHT, 0, true, 20, 5, false, false, 1, 0},
        {"window causal (70, -) d64", 1, 2, 1, 190, 190, 64, true, ATTN_ALIGN_BOTTOM_RIGHT, 0, true, 70, -1, false, false, 1, 0},
        {"varlen 3 seqs d64 causal", 3, 2, 1, 70, 90, 64, true, ATTN_ALIGN_BOTTOM_RIGHT, 0, false, 0, 0, true, false, 1, 0},
        {"padded strides d64", 2, 2, 2, 33, 41, 64, false, ATTN_ALIGN_BOTTOM_RIGHT, 0, false, 0, 0, false, true, 1, 0},
        {"large scores (amp 24)", 2, 4, 4, 61, 61, 64, true, ATTN_ALIGN_BOTTOM_RIGHT, 0, false, 0, 0, false, false, 24, 0},
        {"scale 0.7, T=1", 8, 4, 4, 1, 65, 64, false, ATTN_ALIGN_BOTTOM_RIGHT, 0, false, 0, 0, false, false, 1, 0.7},
        {"d64 T=45 S=150 br GQA 6:2", 1, 6, 2, 45, 150, 64, true, ATTN_ALIGN_BOTTOM_RIGHT, 0, false, 0, 0, false, false, 1, 0},
        {"d128 T=100 S=37 top-left", 2, 2, 1, 100, 37, 128, true, ATTN_ALIGN_TOP_LEFT, 0, false, 0, 0, false, false, 1, 0},
        {"d64 offset 13 causal", 1, 2, 2, 70, 50, 64, true, ATTN_ALIGN_OFFSET, 13, false, 0, 0, false, false, 1, 0},
    };
    enum { CASES = sizeof cases / sizeof *cases };
    /* the AMX pass reruns the cases of head_dim 64, 128 on their inputs */
    tensors16 kept_t[CASES];
    result16 kept_r[CASES];
    const case16 *kept_c[CASES];
    size_t kept = 0;
    const char *first = "widened";
    printf("  case                         relative L2 error vs float64: fast/widened\n");
    for (size_t i = 0; i < CASES; i++) {
        if (check_case(&cases[i], &seed, portable, fast, ref, &kept_t[kept], &kept_r[kept])) {
            if (kept == 0) first = attn_sdpa16_kernel(fast[0], &kept_t[0].cfg, ATTN_DTYPE_BF16, false);
            kept_c[kept++] = &cases[i];
        }
    }
    printf("  forward of those cases on: %s\n", first);
    if (kept > 0) check_default_choice(kept_c[0], &kept_t[0], best);
    check_huge_scores(fast[0], "the forced vdpbf16ps kernels");
    if (request_amx()) {
        printf("  AMX granted: the cases of head_dim 64, 128 again, on AMX tiles\n");
        check_amx(kept_c, kept_t, kept_r, kept, portable, fast, ref, strcmp(first, "vdpbf16ps") == 0);
    } else {
        printf("  AMX pass skipped: no AMX tiles for this process on this CPU/OS\n");
    }
    for (size_t i = 0; i < kept; i++) {
        free_result(&kept_r[i]);
        free_case(&kept_t[i]);
    }
    if (request_amx()) {
        attn_ctx *amx = make_ctx(1, best);
        check_huge_scores(amx, "AMX");
        attn_ctx_free(amx);
    }
    check_widened_features(&seed, fast[1]);
    check_tiny_dout(&seed, fast[1]);
    check_dropout(&seed, fast[0]);
    check_bias_grad(&seed, fast[0]);
    check_errors(fast[0]);
    attn_ctx_free(portable);
    attn_ctx_free(ref);
    for (int i = 0; i < 3; i++) attn_ctx_free(fast[i]);
    return check_summary();
}
