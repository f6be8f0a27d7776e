/*
 * test_sample.c — attn_sample against an independent reading of the book's
 * generate (ch05) plus top_p: greedy is the first maximum; top_k = 1 and a
 * tiny top_p are greedy at any temperature; the frequencies of 20000 draws
 * match softmax(logits / T) restricted to top_k / top_p and renormalised,
 * within a bound computed from n; one uniform per call; seeds reproduce;
 * every error names its value; temperatures past float's range draw from
 * PyTorch's softmax where it is defined, else from the softmax itself.
 * Then attn_lm_generate on a small random model: the same tokens as the
 * loop written out by hand (forward with the cache, attn_sample, feed back)
 * for greedy and sampled runs, contiguous and paged caches; stop tokens,
 * on_token stopping, the context limit and every error.
 *
 * The logits are fresh each run, seeded from the clock (printed); pass a
 * seed as the first argument to repeat a run.
 */
#include "check.h"

#include "attn.h"
#include "lm/sample.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#define DRAWS 20000

static attn_ctx *ctx;

/* ---- the oracle: the distribution written out plainly ------------------ */

static int desc_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x > y ? -1 : x < y;
}

/* want (V) = the distribution attn_sample should draw from, in double:
 * torch.topk's k-th value as the floor (ties kept), softmax(l / T), then
 * the nucleus: tokens are kept in descending probability (ties by index)
 * until their sum reaches top_p, renormalised. */
static void oracle(const float *logits, size_t n, double t, size_t k, double top_p,
                   double *want) {
    double *sorted = malloc(n * sizeof *sorted);
    for (size_t i = 0; i < n; i++) sorted[i] = logits[i];
    qsort(sorted, n, sizeof *sorted, desc_double);
    double floor = k ? sorted[k - 1] : -INFINITY, max = sorted[0], sum = 0;
    for (size_t i = 0; i < n; i++) {
        want[i] = logits[i] >= floor ? exp((logits[i] - max) / t) : 0.0;
        sum += want[i];
    }
    for (size_t i = 0; i < n; i++) want[i] /= sum;
    if (top_p > 0 && top_p < 1) {
        bool *kept = calloc(n, sizeof *kept);
        double reached = 0;
        while (reached < top_p) { /* the most likely not yet kept, lowest index first */
            size_t best = n;
            for (size_t i = 0; i < n; i++)
                if (!kept[i] && want[i] > 0 && (best == n || want[i] > want[best])) best = i;
            if (best == n) break;
            kept[best] = true;
            reached += want[best];
        }
        for (size_t i = 0; i < n; i++) want[i] = kept[i] ? want[i] / reached : 0.0;
        free(kept);
    }
    free(sorted);
}

/* ---- helpers -------------------------------------------------------------- */

static void random_logits(attn_rng *rng, float *x, size_t n, float spread) {
    attn_rng_randn(rng, x, n);
    for (size_t i = 0; i < n; i++) x[i] *= spread;
}

static size_t first_max(const float *x, size_t n) {
    size_t b = 0;
    for (size_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static int32_t sample(const float *logits, size_t n, double t, size_t k, double p,
                      attn_rng *rng) {
    attn_sampling s = {.temperature = t, .top_k = k, .top_p = p};
    int32_t token = -1;
    CHECK_STATUS(attn_sample(ctx, logits, n, &s, rng, &token), ATTN_OK);
    return token;
}

/* ---- the tests ---------------------------------------------------------- */

static void test_greedy(attn_rng *data) {
    float x[50];
    for (int trial = 0; trial < 20; trial++) {
        random_logits(data, x, 50, 2.0f);
        size_t at = first_max(x, 50);
        /* a tie later in the row must not win */
        size_t twin = at + 1 + (size_t)trial % (50 - at > 1 ? 50 - at - 1 : 1);
        if (twin < 50) x[twin] = x[at];
        CHECK(sample(x, 50, 0.0, 0, 0.0, NULL) == (int32_t)at);
        /* top_k and top_p do not matter to greedy */
        CHECK(sample(x, 50, 0.0, 3, 0.5, NULL) == (int32_t)at);
    }
    /* a tie of the maxima goes to the first */
    float tie[4] = {1.0f, 3.0f, 3.0f, -2.0f};
    CHECK(sample(tie, 4, 0.0, 0, 0.0, NULL) == 1);
    /* +inf is a legitimate maximum for argmax; -inf everywhere picks 0 */
    float inf[3] = {0.0f, INFINITY, 1.0f};
    CHECK(sample(inf, 3, 0.0, 0, 0.0, NULL) == 1);
    float ninf[3] = {-INFINITY, -INFINITY, -INFINITY};
    CHECK(sample(ninf, 3, 0.0, 0, 0.0, NULL) == 0);
}

/* top_k = 1 keeps only the maximum, and so does a tiny top_p (when the
 * maximum is unique), at any temperature. */
static void test_reduces_to_greedy(attn_rng *data, attn_rng *draws) {
    float x[1000];
    const double temps[] = {1e-3, 0.5, 1.0, 3.0, 1e3};
    for (int trial = 0; trial < 10; trial++) {
        random_logits(data, x, 1000, 1.0f);
        int32_t at = (int32_t)first_max(x, 1000);
        for (size_t t = 0; t < sizeof temps / sizeof temps[0]; t++) {
            for (int d = 0; d < 20; d++) {
                CHECK(sample(x, 1000, temps[t], 1, 0.0, draws) == at);
                CHECK(sample(x, 1000, temps[t], 0, 1e-9, draws) == at);
            }
        }
    }
}

/* Draws DRAWS tokens and compares their frequencies with the oracle's:
 * excluded tokens never, each kept token within 5.5 standard errors, and
 * Pearson's chi-square below a bound far in its tail. */
static void check_frequencies(const char *what, const float *x, size_t n, double t, size_t k,
                              double p, attn_rng *draws) {
    double want[64];
    size_t counts[64] = {0};
    oracle(x, n, t, k, p, want);
    attn_sampling s = {.temperature = t, .top_k = k, .top_p = p};
    size_t bytes = attn_sample_scratch_bytes(n);
    double *scratch = malloc(bytes);
    for (int i = 0; i < DRAWS; i++) {
        int32_t token = -1;
        /* half through the caller's scratch, half through attn_sample's own */
        attn_status st = i % 2 ? attn_sample(ctx, x, n, &s, draws, &token)
                               : attn_sample_into(ctx, x, n, &s, draws, scratch, &token);
        CHECK(st == ATTN_OK && token >= 0 && (size_t)token < n);
        if (st == ATTN_OK && token >= 0 && (size_t)token < n) counts[token]++;
    }
    free(scratch);
    double chi2 = 0;
    size_t kept = 0;
    bool ok = true;
    for (size_t i = 0; i < n; i++) {
        double f = (double)counts[i] / DRAWS;
        if (want[i] == 0) {
            ok &= counts[i] == 0;
            continue;
        }
        kept++;
        double se = sqrt(want[i] * (1 - want[i]) / DRAWS);
        ok &= fabs(f - want[i]) <= 5.5 * se + 1.0 / DRAWS;
        chi2 += (counts[i] - DRAWS * want[i]) * (counts[i] - DRAWS * want[i]) / (DRAWS * want[i]);
    }
    /* chi-square with kept - 1 <= 63 degrees of freedom: mean df, sd
     * sqrt(2 df); 12 sd above the mean is far beyond chance */
    double df = kept > 1 ? (double)(kept - 1) : 1;
    ok &= chi2 <= df + 12 * sqrt(2 * df);
    if (!ok) {
        fprintf(stderr, "%s: T %g top_k %zu top_p %g, chi2 %.2f (df %.0f)\n", what, t, k, p,
                chi2, df);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, "  token %zu logit %8.4f want %.5f got %.5f\n", i, x[i], want[i],
                    (double)counts[i] / DRAWS);
    }
    CHECK(ok);
}

static void test_frequencies(attn_rng *data, attn_rng *draws) {
    float x[12];
    random_logits(data, x, 12, 1.2f);
    check_frequencies("softmax", x, 12, 1.0, 0, 0.0, draws);
    check_frequencies("cold", x, 12, 0.6, 0, 1.0, draws);
    check_frequencies("hot", x, 12, 2.5, 0, 0.0, draws);
    check_frequencies("top_k", x, 12, 0.8, 5, 0.0, draws);
    check_frequencies("top_p", x, 12, 1.3, 0, 0.75, draws);
    check_frequencies("top_k+top_p", x, 12, 1.7, 7, 0.6, draws);
    /* ties at the k-th value are all kept (torch.topk + where) */
    float ties[8] = {2.0f, 0.5f, 1.0f, 1.0f, -1.0f, 1.0f, 0.0f, 1.0f};
    check_frequencies("top_k ties", ties, 8, 1.0, 2, 0.0, draws);
    /* -inf logits (a mask) are never drawn */
    float masked[6] = {0.3f, -INFINITY, 1.1f, -0.4f, -INFINITY, 0.9f};
    check_frequencies("masked", masked, 6, 1.0, 0, 0.0, draws);
    check_frequencies("masked top_k", masked, 6, 1.0, 5, 0.0, draws);
}

/* A GPT-2-sized row: top_k keeps exactly the k largest (quickselect), and
 * top_p's draws stay inside the nucleus. */
static void test_large_vocab(attn_rng *data, attn_rng *draws) {
    size_t n = 50257;
    float *x = malloc(n * sizeof *x);
    double *want = malloc(n * sizeof *want);
    random_logits(data, x, n, 3.0f);
    oracle(x, n, 1.0, 40, 0.0, want);
    bool inside = true;
    for (int i = 0; i < 500; i++) {
        int32_t token = sample(x, n, 1.0, 40, 0.0, draws);
        inside &= token >= 0 && want[token] > 0;
    }
    CHECK(inside);
    oracle(x, n, 0.9, 0, 0.3, want);
    inside = true;
    for (int i = 0; i < 500; i++) {
        int32_t token = sample(x, n, 0.9, 0, 0.3, draws);
        inside &= token >= 0 && want[token] > 0;
    }
    CHECK(inside);
    /* all equal: every token stays in top_k's set (ties), any may come */
    for (size_t i = 0; i < n; i++) x[i] = 0.25f;
    bool beyond = false;
    for (int i = 0; i < 50; i++) beyond |= sample(x, n, 1.0, 10, 0.0, draws) >= 10;
    CHECK(beyond);
    free(x);
    free(want);
}

/* Same seed, same tokens; another seed, others; and exactly one uniform
 * (one torch.rand float) drawn per call. */
static void test_reproducible(attn_rng *data, uint64_t seed) {
    float x[30];
    random_logits(data, x, 30, 1.0f);
    attn_rng *a, *b, *c;
    CHECK_STATUS(attn_rng_new(ctx, seed, &a), ATTN_OK);
    CHECK_STATUS(attn_rng_new(ctx, seed, &b), ATTN_OK);
    CHECK_STATUS(attn_rng_new(ctx, seed + 1, &c), ATTN_OK);
    bool same = true, differs = false;
    for (int i = 0; i < 200; i++) {
        int32_t ta = sample(x, 30, 1.1, 20, 0.95, a), tb = sample(x, 30, 1.1, 20, 0.95, b);
        int32_t tc = sample(x, 30, 1.1, 20, 0.95, c);
        same &= ta == tb;
        differs |= ta != tc;
    }
    CHECK(same);
    CHECK(differs);
    /* a drew 200 floats' worth: b, moved by 200 torch.rand floats, agrees */
    attn_rng_manual_seed(b, seed);
    float skip[200];
    attn_rng_rand(b, skip, 200);
    uint32_t ua = 0, ub = 1;
    attn_rng_next_u32(a, &ua);
    attn_rng_next_u32(b, &ub);
    CHECK(ua == ub);
    /* greedy draws nothing */
    attn_rng_manual_seed(a, seed);
    attn_rng_manual_seed(b, seed);
    for (int i = 0; i < 10; i++) sample(x, 30, 0.0, 0, 0.0, a);
    attn_rng_next_u32(a, &ua);
    attn_rng_next_u32(b, &ub);
    CHECK(ua == ub);
    attn_rng_free(a);
    attn_rng_free(b);
    attn_rng_free(c);
}

/* Without top_p, attn_sample is the book's draw: attn_sample_book's token
 * from the same generator state, and the generator left in the same state
 * (torch.multinomial's draws), for any temperature and top_k. */
static void test_book_draws(attn_rng *data, uint64_t seed) {
    float x[300];
    random_logits(data, x, 300, 2.0f);
    attn_rng *a, *b;
    CHECK_STATUS(attn_rng_new(ctx, seed, &a), ATTN_OK);
    CHECK_STATUS(attn_rng_new(ctx, seed, &b), ATTN_OK);
    const double temperatures[] = {0.3, 1.0, 1.4, 5.0};
    const size_t top_ks[] = {0, 1, 25, 299};
    int same = 0;
    for (int i = 0; i < 64; i++) {
        double t = temperatures[i % 4];
        size_t k = top_ks[(i / 4) % 4];
        int32_t ta = sample(x, 300, t, k, i % 2 ? 1.0 : 0.0, a), tb = -1;
        CHECK_STATUS(attn_sample_book(ctx, x, 300, t, k, b, &tb), ATTN_OK);
        same += ta == tb;
    }
    CHECK(same == 64);
    uint32_t ua = 0, ub = 1;
    attn_rng_next_u32(a, &ua);
    attn_rng_next_u32(b, &ub);
    CHECK(ua == ub);
    attn_rng_free(a);
    attn_rng_free(b);
}

static void test_errors(attn_rng *draws) {
    float x[5] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f};
    int32_t token = 77;
    attn_sampling s = {.temperature = 1.0};
#define EXPECT(call, status, fragment)      \
    do {                                   \
        CHECK_STATUS(call, status);        \
        CHECK_MESSAGE(ctx, fragment);      \
        CHECK(token == 77);                \
    } while (0)
    s.temperature = -0.5;
    EXPECT(attn_sample(ctx, x, 5, &s, draws, &token), ATTN_ERR_INVALID, "temperature -0.5");
    s.temperature = NAN;
    EXPECT(attn_sample(ctx, x, 5, &s, draws, &token), ATTN_ERR_INVALID, "temperature nan");
    s.temperature = INFINITY;
    EXPECT(attn_sample(ctx, x, 5, &s, draws, &token), ATTN_ERR_INVALID, "temperature inf");
    s = (attn_sampling){.temperature = 1.0, .top_p = -0.1};
    EXPECT(attn_sample(ctx, x, 5, &s, draws, &token), ATTN_ERR_INVALID, "top_p -0.1");
    s.top_p = 1.5;
    EXPECT(attn_sample(ctx, x, 5, &s, draws, &token), ATTN_ERR_INVALID, "top_p 1.5");
    s.top_p = NAN;
    EXPECT(attn_sample(ctx, x, 5, &s, draws, &token), ATTN_ERR_INVALID, "top_p nan");
    s = (attn_sampling){.temperature = 1.0, .top_k = 6};
    EXPECT(attn_sample(ctx, x, 5, &s, draws, &token), ATTN_ERR_INVALID, "top_k 6");
    s = (attn_sampling){.temperature = 1.0};
    EXPECT(attn_sample(ctx, x, 5, &s, NULL, &token), ATTN_ERR_NULL, "rng");
    EXPECT(attn_sample(ctx, NULL, 5, &s, draws, &token), ATTN_ERR_NULL, "logits");
    EXPECT(attn_sample(ctx, x, 5, NULL, draws, &token), ATTN_ERR_NULL, "NULL");
    CHECK_STATUS(attn_sample(ctx, x, 5, &s, draws, NULL), ATTN_ERR_NULL);
    EXPECT(attn_sample(ctx, x, 0, &s, draws, &token), ATTN_ERR_INVALID, "vocab_size is 0");
    x[3] = NAN;
    EXPECT(attn_sample(ctx, x, 5, &s, draws, &token), ATTN_ERR_INVALID, "logits[3] is NaN");
    s.temperature = 0;
    EXPECT(attn_sample(ctx, x, 5, &s, draws, &token), ATTN_ERR_INVALID, "logits[3] is NaN");
    s.temperature = 1;
    float inf[3] = {0.0f, INFINITY, 1.0f}, ninf[2] = {-INFINITY, -INFINITY};
    EXPECT(attn_sample(ctx, inf, 3, &s, draws, &token), ATTN_ERR_INVALID, "inf");
    EXPECT(attn_sample(ctx, ninf, 2, &s, draws, &token), ATTN_ERR_INVALID, "-inf");
    /* a NULL ctx gives the status alone */
    CHECK_STATUS(attn_sample(NULL, inf, 3, &s, draws, &token), ATTN_ERR_INVALID);
    /* with an rng but temperature 0, greedy still works; errors cleared */
    s.temperature = 0;
    CHECK_STATUS(attn_sample(ctx, inf, 3, &s, NULL, &token), ATTN_OK);
    CHECK(token == 1);
    CHECK(attn_ctx_last_error(ctx)[0] == '\0');
    /* attn_sample_book's refusals name attn_sample_book, the call made */
    x[3] = 0.5f;
    token = 77;
    EXPECT(attn_sample_book(ctx, x, 0, 1.0, 0, draws, &token), ATTN_ERR_INVALID,
           "attn_sample_book: vocab_size is 0");
    EXPECT(attn_sample_book(ctx, x, 5, NAN, 0, draws, &token), ATTN_ERR_INVALID,
           "attn_sample_book: temperature nan");
    EXPECT(attn_sample_book(ctx, x, 5, 1.0, 6, draws, &token), ATTN_ERR_INVALID,
           "attn_sample_book: top_k 6 is more than vocab_size 5");
    EXPECT(attn_sample_book(ctx, x, 5, 1.0, 0, NULL, &token), ATTN_ERR_NULL,
           "attn_sample_book: temperature 1 samples, so rng must not be NULL");
    x[3] = NAN;
    EXPECT(attn_sample_book(ctx, x, 5, 0.0, 0, draws, &token), ATTN_ERR_INVALID,
           "attn_sample_book: logits[3] is NaN");
    EXPECT(attn_sample(ctx, x, 5, &s, draws, &token), ATTN_ERR_INVALID,
           "attn_sample: logits[3] is NaN");
#undef EXPECT
}

/* How often each of n tokens is drawn in `draws` calls of attn_sample. */
static void tally(const float *x, size_t n, const attn_sampling *s, attn_rng *r, int draws,
                  int *seen) {
    for (size_t i = 0; i < n; i++) seen[i] = 0;
    for (int d = 0; d < draws; d++) {
        int32_t t = -1;
        CHECK_STATUS(attn_sample(ctx, x, n, s, r, &t), ATTN_OK);
        if (t >= 0 && (size_t)t < n) seen[t]++;
    }
}

/* Temperatures past float's range, which the book's draw divides by as a
 * float, as PyTorch does. Where PyTorch's softmax is defined the draws are
 * its: a temperature that is inf in float makes finite logits 0, the draws
 * of all-zero logits at temperature 1. Where it is NaN only because of the
 * temperature (0 / 0, -inf / inf, a quotient past float's range) the draw
 * is from the distribution itself: uniform over the finite kept logits for
 * a huge temperature, the largest alone (ties shared) for a tiny one; with
 * top_p too. An infinite largest logit is still refused. */
static void test_extreme_temperatures(uint64_t seed) {
    const float x[4] = {0.1f, 0.2f, 0.3f, 0.4f}, zeros[4] = {0};
    const double huge[3] = {1e39, 1e300, 3.5e38};
    for (size_t i = 0; i < 3; i++) {
        attn_rng *a, *b;
        CHECK_STATUS(attn_rng_new(ctx, seed, &a), ATTN_OK);
        CHECK_STATUS(attn_rng_new(ctx, seed, &b), ATTN_OK);
        int same = 0;
        for (int d = 0; d < 32; d++) {
            int32_t got = -1, want = -2;
            CHECK_STATUS(attn_sample_book(ctx, x, 4, huge[i], 0, a, &got), ATTN_OK);
            CHECK_STATUS(attn_sample_book(ctx, zeros, 4, 1.0, 0, b, &want), ATTN_OK);
            same += got == want;
        }
        CHECK(same == 32);
        attn_rng_free(a);
        attn_rng_free(b);
    }
    attn_rng *r;
    CHECK_STATUS(attn_rng_new(ctx, seed, &r), ATTN_OK);
    int seen[4];
    /* top_k's -inf, and a -inf logit, over a huge temperature */
    const float masked[4] = {0.1f, -INFINITY, 0.3f, 0.4f};
    for (size_t i = 0; i < 3; i++) {
        attn_sampling s = {.temperature = huge[i], .top_k = 2};
        tally(x, 4, &s, r, 200, seen);
        CHECK(seen[0] == 0 && seen[1] == 0 && seen[2] > 50 && seen[3] > 50);
        s.top_k = 0;
        tally(masked, 4, &s, r, 300, seen);
        CHECK(seen[1] == 0 && seen[0] > 50 && seen[2] > 50 && seen[3] > 50);
        s.top_p = 0.99; /* in double */
        tally(masked, 4, &s, r, 300, seen);
        CHECK(seen[1] == 0 && seen[0] > 50 && seen[2] > 50 && seen[3] > 50);
    }
    int32_t token = -1;
    CHECK_STATUS(attn_sample_book(ctx, masked, 4, 1e300, 0, r, &token), ATTN_OK);
    CHECK(token == 0 || token == 2 || token == 3);
    /* tiny: 0 in float (1e-300: 0 / 0), or quotients past float's range
     * (1e-39: -1 / 1e-39 is -inf, 0.4 / 1e-39 inf) */
    const float falling[3] = {0.0f, -1.0f, -2.0f}, below[2] = {-1.0f, -2.0f};
    const float tie[3] = {-1.0f, 2.0f, 2.0f};
    const double tiny[3] = {1e-300, 1e-39, 1e-40};
    for (size_t i = 0; i < 3; i++) {
        for (int top_p = 0; top_p < 2; top_p++) {
            attn_sampling s = {.temperature = tiny[i], .top_p = top_p ? 0.99 : 0.0};
            tally(falling, 3, &s, r, 20, seen);
            CHECK(seen[0] == 20);
            tally(below, 2, &s, r, 20, seen);
            CHECK(seen[0] == 20);
            tally(x, 4, &s, r, 20, seen);
            CHECK(seen[3] == 20);
            tally(tie, 3, &s, r, 200, seen);
            CHECK(seen[0] == 0 && seen[1] > 50 && seen[2] > 50);
        }
        token = -1;
        CHECK_STATUS(attn_sample_book(ctx, falling, 3, tiny[i], 2, r, &token), ATTN_OK);
        CHECK(token == 0);
    }
    /* an infinite largest logit has no distribution, whatever the temperature */
    const float inf[3] = {0.0f, INFINITY, 1.0f}, ninf[2] = {-INFINITY, -INFINITY};
    token = 77;
    CHECK_STATUS(attn_sample_book(ctx, inf, 3, 1e300, 0, r, &token), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "the largest logit is inf: no distribution to sample (temperature 1e+300)");
    CHECK_STATUS(attn_sample_book(ctx, ninf, 2, 1e-300, 0, r, &token), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "the largest logit is -inf (every logit)");
    CHECK(token == 77);
    attn_rng_free(r);
}

/* ---- attn_lm_generate ----------------------------------------------------- */

typedef struct token_log {
    int32_t seen[64];
    size_t n, stop_after;
} token_log;

static bool log_token(void *user, int32_t token) {
    token_log *l = user;
    if (l->n < 64) l->seen[l->n] = token;
    l->n++;
    return l->n != l->stop_after;
}

/* The loop by hand: prefill, then sample / feed back, steps tokens. */
static attn_status by_hand(attn_lm *lm, const int32_t *prompt, size_t n, const attn_sampling *s,
                           attn_rng *rng, int32_t *out, size_t steps) {
    attn_lm_config cfg = attn_lm_get_config(lm);
    attn_kv_cache *cache;
    attn_status st = attn_lm_cache_new(lm, 1, 0, ATTN_KV_CONTIGUOUS, 0, &cache);
    if (st != ATTN_OK) return st;
    float *logits = malloc(cfg.vocab_size * sizeof *logits);
    attn_lm_forward_args f = {.cache = cache, .tokens = prompt, .batch = 1,
                              .tokens_per_seq = n, .last_only = true, .logits = logits};
    st = attn_lm_forward(lm, &f);
    for (size_t i = 0; st == ATTN_OK && i < steps; i++) {
        st = attn_sample(ctx, logits, cfg.vocab_size, s, rng, &out[i]);
        f.tokens = &out[i];
        f.tokens_per_seq = 1;
        if (st == ATTN_OK && i + 1 < steps) st = attn_lm_forward(lm, &f);
    }
    free(logits);
    attn_kv_cache_free(cache);
    return st;
}

static void test_generate_matches_loop(attn_lm *lm, uint64_t seed) {
    attn_lm_config cfg = attn_lm_get_config(lm);
    int32_t prompt[7];
    for (size_t i = 0; i < 7; i++) prompt[i] = (int32_t)((seed + 31 * i) % cfg.vocab_size);
    const attn_sampling modes[] = {{0}, {.temperature = 1.0}, {.temperature = 0.7, .top_k = 20},
                                   {.temperature = 1.3, .top_p = 0.8}};
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        for (int layout = 0; layout < 2; layout++) {
            attn_rng *r1, *r2;
            attn_rng_new(ctx, seed + m, &r1);
            attn_rng_new(ctx, seed + m, &r2);
            int32_t want[40], got[40];
            CHECK_STATUS(by_hand(lm, prompt, 7, &modes[m], r1, want, 40), ATTN_OK);
            attn_kv_cache *cache = NULL;
            if (layout)
                CHECK_STATUS(attn_lm_cache_new(lm, 1, 0, ATTN_KV_PAGED, 5, &cache), ATTN_OK);
            size_t count = 99;
            token_log log = {0};
            attn_generate_args a = {.prompt = prompt, .prompt_len = 7, .max_new_tokens = 40,
                                    .sampling = modes[m], .rng = r2, .cache = cache,
                                    .on_token = log_token, .user = &log, .out = got,
                                    .count = &count};
            CHECK_STATUS(attn_lm_generate(lm, &a), ATTN_OK);
            CHECK(count == 40 && log.n == 40);
            bool same = count == 40;
            for (size_t i = 0; same && i < 40; i++) same = got[i] == want[i] && log.seen[i] == got[i];
            if (!same)
                fprintf(stderr, "generate vs by hand: mode %zu, %s cache\n", m,
                        layout ? "paged" : "no");
            CHECK(same);
            if (cache) {
                /* a cache given is reset first: a second run writes the same */
                attn_rng_manual_seed(r2, seed + m);
                int32_t again[40];
                a.out = again;
                a.on_token = NULL;
                CHECK_STATUS(attn_lm_generate(lm, &a), ATTN_OK);
                CHECK(count == 40 && memcmp(again, got, sizeof got) == 0);
                size_t len = 0;
                CHECK_STATUS(attn_kv_cache_length(cache, 0, 0, &len), ATTN_OK);
                CHECK(len == 7 + 39); /* the last token is never fed */
            }
            attn_kv_cache_free(cache);
            attn_rng_free(r1);
            attn_rng_free(r2);
        }
    }
}

static bool holds(const int32_t *ids, size_t n, int32_t id) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id) return true;
    return false;
}

static void test_generate_stops(attn_lm *lm) {
    attn_lm_config cfg = attn_lm_get_config(lm);
    int32_t prompt[3] = {1, 2, 3}, full[30], out[30];
    size_t count = 0;
    attn_generate_args a = {.prompt = prompt, .prompt_len = 3, .max_new_tokens = 30,
                            .out = full, .count = &count};
    CHECK_STATUS(attn_lm_generate(lm, &a), ATTN_OK);
    CHECK(count == 30);
    /* a stop token ends the run before its first appearance; one the run
     * never writes changes nothing */
    int32_t stop[2] = {0, full[12]};
    while (holds(full, 30, stop[0])) stop[0]++;
    CHECK((size_t)stop[0] < cfg.vocab_size);
    size_t first = 0;
    while (full[first] != stop[1]) first++;
    a.out = out;
    a.stop_tokens = stop;
    a.num_stop_tokens = 2;
    CHECK_STATUS(attn_lm_generate(lm, &a), ATTN_OK);
    CHECK(count == first && memcmp(out, full, first * sizeof *out) == 0);
    /* on_token returning false stops after that token */
    token_log log = {.stop_after = 5};
    a.stop_tokens = NULL;
    a.num_stop_tokens = 0;
    a.on_token = log_token;
    a.user = &log;
    CHECK_STATUS(attn_lm_generate(lm, &a), ATTN_OK);
    CHECK(count == 5 && log.n == 5 && memcmp(out, full, 5 * sizeof *out) == 0);
    /* no new tokens: nothing runs */
    a.on_token = NULL;
    a.max_new_tokens = 0;
    count = 7;
    CHECK_STATUS(attn_lm_generate(lm, &a), ATTN_OK);
    CHECK(count == 0);
}

static void test_generate_limits(attn_lm *lm) {
    attn_ctx *mctx = ctx; /* the model was made with ctx */
    attn_lm_config cfg = attn_lm_get_config(lm);
    size_t T = cfg.context_length;
    int32_t *prompt = calloc(T + 10, sizeof *prompt), *out = calloc(T + 10, sizeof *out);
    for (size_t i = 0; i < T + 10; i++) prompt[i] = (int32_t)(i % cfg.vocab_size);
    size_t count = 0;
    /* prompt + max_new_tokens - 1 == context_length fits */
    attn_generate_args a = {.prompt = prompt, .prompt_len = 5, .max_new_tokens = T - 4,
                            .out = out, .count = &count};
    CHECK_STATUS(attn_lm_generate(lm, &a), ATTN_OK);
    CHECK(count == T - 4);
    /* one more does not, before any work */
    a.max_new_tokens = T - 3;
    count = 9;
    CHECK_STATUS(attn_lm_generate(lm, &a), ATTN_ERR_OVERFLOW);
    CHECK_MESSAGE(mctx, "context_length");
    CHECK(count == 0);
    /* a prompt longer than the context is cut to its last T tokens */
    int32_t cut_out[1], whole_out[1];
    a = (attn_generate_args){.prompt = prompt, .prompt_len = T + 10, .max_new_tokens = 1,
                             .out = cut_out, .count = &count};
    CHECK_STATUS(attn_lm_generate(lm, &a), ATTN_OK);
    a.prompt = prompt + 10;
    a.prompt_len = T;
    a.out = whole_out;
    CHECK_STATUS(attn_lm_generate(lm, &a), ATTN_OK);
    CHECK(cut_out[0] == whole_out[0]);
    a.prompt_len = T;
    a.max_new_tokens = 2;
    CHECK_STATUS(attn_lm_generate(lm, &a), ATTN_ERR_OVERFLOW);
    /* a cache given too short, or for two sequences */
    attn_kv_cache *small, *two;
    CHECK_STATUS(attn_lm_cache_new(lm, 1, 8, ATTN_KV_PAGED, 4, &small), ATTN_OK);
    CHECK_STATUS(attn_lm_cache_new(lm, 2, 0, ATTN_KV_CONTIGUOUS, 0, &two), ATTN_OK);
    a = (attn_generate_args){.prompt = prompt, .prompt_len = 5, .max_new_tokens = 5,
                             .out = out, .count = &count, .cache = small};
    CHECK_STATUS(attn_lm_generate(lm, &a), ATTN_ERR_OVERFLOW);
    CHECK_MESSAGE(mctx, "holds 8 tokens");
    a.max_new_tokens = 4;
    CHECK_STATUS(attn_lm_generate(lm, &a), ATTN_OK);
    a.cache = two;
    CHECK_STATUS(attn_lm_generate(lm, &a), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(mctx, "2 sequences");
    attn_kv_cache_free(small);
    attn_kv_cache_free(two);
    free(prompt);
    free(out);
}

static void test_generate_errors(attn_lm *lm) {
    attn_lm_config cfg = attn_lm_get_config(lm);
    int32_t prompt[2] = {1, 2}, out[4];
    size_t count = 5;
    attn_generate_args a = {.prompt = prompt, .prompt_len = 2, .max_new_tokens = 4,
                            .out = out, .count = &count};
    CHECK_STATUS(attn_lm_generate(NULL, &a), ATTN_ERR_NULL);
    CHECK_STATUS(attn_lm_generate(lm, NULL), ATTN_ERR_NULL);
    a.out = NULL;
    CHECK_STATUS(attn_lm_generate(lm, &a), ATTN_ERR_NULL);
    a.out = out;
    a.prompt = NULL;
    CHECK_STATUS(attn_lm_generate(lm, &a), ATTN_ERR_NULL);
    a.prompt = prompt;
    a.num_stop_tokens = 1;
    CHECK_STATUS(attn_lm_generate(lm, &a), ATTN_ERR_NULL);
    int32_t stops[2] = {1, (int32_t)cfg.vocab_size};
    a.stop_tokens = stops;
    a.num_stop_tokens = 2;
    CHECK_STATUS(attn_lm_generate(lm, &a), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "stop_tokens[1]");
    stops[1] = -1;
    CHECK_STATUS(attn_lm_generate(lm, &a), ATTN_ERR_INVALID);
    a.stop_tokens = NULL;
    a.num_stop_tokens = 0;
    a.prompt_len = 0;
    CHECK_STATUS(attn_lm_generate(lm, &a), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "empty");
    a.prompt_len = 2;
    prompt[1] = (int32_t)cfg.vocab_size;
    CHECK_STATUS(attn_lm_generate(lm, &a), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "prompt[1]");
    prompt[1] = -1;
    CHECK_STATUS(attn_lm_generate(lm, &a), ATTN_ERR_INVALID);
    prompt[1] = 2;
    a.sampling.temperature = 0.5;
    CHECK_STATUS(attn_lm_generate(lm, &a), ATTN_ERR_NULL);
    CHECK_MESSAGE(ctx, "rng");
    a.sampling = (attn_sampling){.temperature = -1};
    CHECK_STATUS(attn_lm_generate(lm, &a), ATTN_ERR_INVALID);
    a.sampling = (attn_sampling){.top_k = cfg.vocab_size + 1};
    CHECK_STATUS(attn_lm_generate(lm, &a), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "attn_lm_generate: top_k");
    CHECK(count == 0);
}

static void test_generate(uint64_t seed) {
    attn_rng *init;
    attn_rng_new(ctx, seed, &init);
    const attn_lm_config cfgs[] = {
        {.arch = ATTN_LM_GPT2, .vocab_size = 300, .context_length = 64, .emb_dim = 32,
         .n_heads = 4, .n_layers = 2, .qkv_bias = true},
        {.arch = ATTN_LM_LLAMA3, .vocab_size = 257, .context_length = 48, .emb_dim = 32,
         .n_heads = 4, .n_kv_groups = 2, .n_layers = 2, .hidden_dim = 48},
    };
    for (size_t i = 0; i < 2; i++) {
        attn_lm *lm;
        CHECK_STATUS(attn_lm_new(ctx, &cfgs[i], init, &lm), ATTN_OK);
        if (!lm) continue;
        test_generate_matches_loop(lm, seed);
        test_generate_stops(lm);
        test_generate_limits(lm);
        test_generate_errors(lm);
        attn_lm_free(lm);
    }
    attn_rng_free(init);
}

int main(int argc, char **argv) {
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : (uint64_t)time(NULL);
    printf("test_sample: seed %llu\n", (unsigned long long)seed);
    if (attn_ctx_new(NULL, &ctx) != ATTN_OK) return 1;
    attn_rng *data, *draws;
    if (attn_rng_new(ctx, seed, &data) != ATTN_OK) return 1;
    if (attn_rng_new(ctx, seed ^ 0x9e3779b97f4a7c15ull, &draws) != ATTN_OK) return 1;
    test_greedy(data);
    test_reduces_to_greedy(data, draws);
    test_frequencies(data, draws);
    test_large_vocab(data, draws);
    test_reproducible(data, seed);
    test_book_draws(data, seed);
    test_errors(draws);
    test_extreme_temperatures(seed);
    test_generate(seed);
    attn_rng_free(data);
    attn_rng_free(draws);
    attn_ctx_free(ctx);
    return check_summary();
}
