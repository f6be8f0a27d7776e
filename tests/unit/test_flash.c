/*
 * test_flash.c — the fused attention kernels against the reference ones.
 *
 * For every instruction set this CPU runs (portable, AVX2, AVX-512) and
 * random shapes (T queries, S keys with S != T too, odd head dims, packed
 * q/k/v strides like GPT-2's), causal or not, both mask methods, with no
 * dropout, a bit mask, or Philox: out, lse, dq, dk, dv within relative L2
 * 1e-5 of the double-accumulating reference; bitwise the same on 1, 2 and
 * 3 threads; and Philox's known-answer vectors. Fresh random inputs each
 * run (the seed is printed; argv[1] replays it).
 */
#include "attn.h"
#include "check.h"
#include "kernels/flash/flash.h"
#include "kernels/kernels.h"
#include "rng/dropout.h"
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

typedef struct flash_case {
    size_t B, H, T, S, D;
    bool causal, packed;
    attn_mask_method mask;
    int drop; /* 0 none, 1 bits, 2 philox */
    float *q, *k, *v, *dout;
    size_t q_b, q_t, q_h, kv_b, kv_t, kv_h;
    uint8_t *bits;
    uint64_t seed, offset;
    double p;
} flash_case;

static attn_sdpa_args case_args(const flash_case *c, float *out, float *lse) {
    attn_sdpa_args a = {
        .batch = c->B, .heads = c->H, .tokens = c->T, .head_dim = c->D, .kv_tokens = c->S,
        .q = c->q, .k = c->k, .v = c->v,
        .b_stride = c->q_b, .t_stride = c->q_t, .h_stride = c->q_h,
        .kv_b_stride = c->kv_b, .kv_t_stride = c->kv_t, .kv_h_stride = c->kv_h,
        .out = out, .out_b_stride = c->T * c->H * c->D, .out_t_stride = c->H * c->D,
        .out_h_stride = c->D, .lse = lse,
        .scale = 1.0f / sqrtf((float)c->D), .causal = c->causal, .mask = c->mask,
    };
    return a;
}

static attn_flash_dropout case_dropout(const flash_case *c) {
    attn_flash_dropout d = {.kind = ATTN_FLASH_DROP_NONE, .kept_scale = attn_dropout_kept_scale(c->p)};
    if (c->drop == 1) {
        d.kind = ATTN_FLASH_DROP_BITS;
        d.keep_bits = c->bits;
    } else if (c->drop == 2) {
        d.kind = ATTN_FLASH_DROP_PHILOX;
        d.seed = c->seed;
        d.offset = c->offset;
        d.keep_threshold = attn_philox_keep_threshold(c->p);
    }
    return d;
}

/* A case's outputs; the gradients share the inputs' layout: one packed
 * buffer (dq, dk, dv interleaved as q, k, v are) or three. */
typedef struct results {
    float *out, *lse, *grads;
    float *dq, *dk, *dv;
    size_t n_grads;
} results;

static results alloc_results(const flash_case *c) {
    size_t HD = c->H * c->D, nq = c->B * c->T * HD, nkv = c->B * c->S * HD;
    results r = {.out = calloc(nq, 4), .lse = calloc(c->B * c->H * c->T, 4)};
    r.n_grads = c->packed ? 3 * nq : nq + 2 * nkv;
    r.grads = calloc(r.n_grads, 4);
    r.dq = r.grads;
    r.dk = c->packed ? r.grads + HD : r.grads + nq;
    r.dv = c->packed ? r.grads + 2 * HD : r.grads + nq + nkv;
    return r;
}

static void free_results(results *r) {
    free(r->out);
    free(r->lse);
    free(r->grads);
}

/* The reference forward (its Philox stream draws the case's mask, which
 * is also the bit mask of drop = 1 cases) and backward. */
static void run_reference(const flash_case *c, results *r) {
    attn_sdpa_args a = case_args(c, r->out, r->lse);
    size_t n = c->B * c->H * c->T * c->S;
    uint8_t *bits = c->drop ? calloc(n / 8 + 1, 1) : NULL;
    attn_dropout_stream stream = {
        .method = ATTN_BERNOULLI_PHILOX, .keep = 1.0 - c->p,
        .kept_scale = attn_dropout_kept_scale(c->p), .philox_seed = c->seed,
        .philox_offset = c->offset, .keep_threshold = attn_philox_keep_threshold(c->p)};
    a.dropout = c->drop ? &stream : NULL;
    a.keep_bits = bits;
    double *row = calloc(c->S + 1, sizeof *row);
    attn_ref_sdpa(&a, row);
    free(row);
    attn_sdpa_grad_args g = {.fwd = &a, .dout = c->dout, .dq = r->dq, .dk = r->dk, .dv = r->dv,
                             .keep_bits = bits, .kept_scale = attn_dropout_kept_scale(c->p)};
    size_t parts = 3;
    g.row_stats = calloc(2 * c->B * c->H * c->T, sizeof(double));
    g.workspace = calloc(parts * attn_sdpa_grad_workspace(c->S, c->D), sizeof(double));
    attn_ref_sdpa_backward(parts, &g);
    free(g.row_stats);
    free(g.workspace);
    free(bits);
}

static void run_fused(const attn_flash_kernels *fk, size_t threads, const flash_case *c,
                      results *r) {
    attn_sdpa_args a = case_args(c, r->out, r->lse);
    attn_flash_dropout drop = case_dropout(c);
    float *ws = calloc(threads * fk->forward_workspace(c->D), 4);
    fk->forward(threads, &a, &drop, ws);
    free(ws);
    float *delta = calloc(c->B * c->H * c->T, 4);
    ws = calloc(threads * fk->backward_workspace(c->D), 4);
    fk->backward(threads, &a, &drop, r->out, r->lse, c->dout, r->dq, r->dk, r->dv, delta, ws);
    free(ws);
    free(delta);
}

static bool same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * 4) == 0; }

static void one_case(const attn_flash_kernels *fk, uint64_t *seed, int index) {
    flash_case c = {0};
    c.B = 1 + below(seed, 2);
    c.H = 1 + below(seed, 3);
    c.T = 1 + below(seed, index % 3 == 0 ? 150 : 70);
    c.S = uniform(seed) < 0.3 ? 1 + below(seed, 150) : c.T;
    if (index % 6 == 5) c.T = c.S = 128; /* rows of whole 64-element dropout groups */
    c.D = index % 4 == 0 ? 64 : 1 + below(seed, 80);
    c.causal = uniform(seed) < 0.7;
    c.mask = uniform(seed) < 0.5 ? ATTN_MASK_NEG_INF : ATTN_MASK_RENORMALIZE;
    c.drop = (int)below(seed, 3);
    c.p = 0.05 + 0.5 * uniform(seed);
    c.packed = uniform(seed) < 0.5;
    c.seed = splitmix(seed);
    c.offset = below(seed, 1000);
    /* q, k, v: packed as GPT-2's (B, T, 3, H, D) when packed and S == T, else
     * (B, T|S, H, D) buffers of their own */
    size_t HD = c.H * c.D;
    c.packed = c.packed && c.S == c.T;
    bool pack = c.packed;
    size_t nq = c.B * c.T * HD * (pack ? 3 : 1), nkv = c.B * c.S * HD;
    float *qbuf = malloc(nq * 4), *kbuf = pack ? NULL : malloc(nkv * 4), *vbuf = pack ? NULL : malloc(nkv * 4);
    for (size_t i = 0; i < nq; i++) qbuf[i] = (float)(2.0 * uniform(seed) - 1.0);
    for (size_t i = 0; i < (pack ? 0 : nkv); i++) kbuf[i] = (float)(2.0 * uniform(seed) - 1.0);
    for (size_t i = 0; i < (pack ? 0 : nkv); i++) vbuf[i] = (float)(2.0 * uniform(seed) - 1.0);
    if (pack) {
        c.q = qbuf;
        c.k = qbuf + HD;
        c.v = qbuf + 2 * HD;
        c.q_b = c.kv_b = c.T * 3 * HD;
        c.q_t = c.kv_t = 3 * HD;
    } else {
        c.q = qbuf;
        c.k = kbuf;
        c.v = vbuf;
        c.q_b = c.T * HD;
        c.kv_b = c.S * HD;
        c.q_t = c.kv_t = HD;
    }
    c.q_h = c.kv_h = c.D;
    size_t n_out = c.B * c.T * HD, n_w = c.B * c.H * c.T * c.S;
    c.dout = malloc(n_out * 4);
    for (size_t i = 0; i < n_out; i++) c.dout[i] = (float)(2.0 * uniform(seed) - 1.0);
    /* the drop = 1 case's bits: the Philox mask, drawn here */
    c.bits = calloc(n_w / 8 + 1, 1);
    uint64_t threshold = attn_philox_keep_threshold(c.p);
    for (size_t e = 0; e < n_w; e++)
        if (attn_philox_dropout_word(c.seed, c.offset, e) < threshold) attn_set_bit(c.bits, e);

    results ref = alloc_results(&c), fused[3];
    run_reference(&c, &ref);
    for (size_t t = 0; t < 3; t++) {
        fused[t] = alloc_results(&c);
        run_fused(fk, t + 1, &c, &fused[t]);
    }
    double e_out = rel_l2(fused[0].out, ref.out, n_out);
    double e_grads = rel_l2(fused[0].grads, ref.grads, ref.n_grads);
    /* lse where finite (rows that see no key hold -inf in both) */
    double e_lse = 0.0;
    bool lse_inf_same = true;
    for (size_t i = 0; i < c.B * c.H * c.T; i++) {
        if (isinf(ref.lse[i]) || isinf(fused[0].lse[i])) {
            lse_inf_same = lse_inf_same && ref.lse[i] == fused[0].lse[i];
            continue;
        }
        e_lse = fmax(e_lse, fabs((double)fused[0].lse[i] - ref.lse[i]) / fmax(1.0, fabs(ref.lse[i])));
    }
    bool ok = e_out <= 1e-5 && e_grads <= 1e-5 && e_lse <= 1e-5 && lse_inf_same;
    CHECK(ok);
    if (!ok)
        fprintf(stderr,
                "%s: B=%zu H=%zu T=%zu S=%zu D=%zu causal=%d mask=%d drop=%d packed=%d: rel L2 "
                "out %.3g grads %.3g, lse %.3g (inf rows same: %d)\n",
                fk->name, c.B, c.H, c.T, c.S, c.D, c.causal, (int)c.mask, c.drop, pack, e_out,
                e_grads, e_lse, lse_inf_same);
    for (size_t t = 1; t < 3; t++) {
        bool same = same_bits(fused[t].out, fused[0].out, n_out) &&
                    same_bits(fused[t].lse, fused[0].lse, c.B * c.H * c.T) &&
                    same_bits(fused[t].grads, fused[0].grads, ref.n_grads);
        CHECK(same);
        if (!same) fprintf(stderr, "%s: %zu threads differ from 1 thread (T=%zu S=%zu)\n", fk->name, t + 1, c.T, c.S);
    }
    free_results(&ref);
    for (size_t t = 0; t < 3; t++) free_results(&fused[t]);
    free(qbuf);
    free(kbuf);
    free(vbuf);
    free(c.dout);
    free(c.bits);
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

int main(int argc, char **argv) {
    struct timespec now;
    timespec_get(&now, TIME_UTC);
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10)
                             : (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
    printf("seed %llu\n", (unsigned long long)seed);
    philox_known_answers();
    const attn_flash_kernels *sets[3] = {&attn_flash_portable, NULL, NULL};
#if defined(ATTN_HAVE_X86_KERNELS)
    if (attn_kernels_supported(ATTN_KERNELS_AVX2)) sets[1] = &attn_flash_avx2;
    if (attn_kernels_supported(ATTN_KERNELS_AVX512)) sets[2] = &attn_flash_avx512;
#endif
    for (int s = 0; s < 3; s++) {
        if (!sets[s]) continue;
        printf("%s\n", sets[s]->name);
        max_abs_cases(sets[s], &seed);
        for (int i = 0; i < 24; i++) one_case(sets[s], &seed, i);
    }
    return check_summary();
}
