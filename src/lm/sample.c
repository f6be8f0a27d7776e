/*
 * sample.c — choosing the next token from a row of logits, as the book's
 * generate (ch05) does it, with top_p (nucleus) sampling added:
 *   temperature 0   argmax, the first of equal maxima
 *   else            logits below the top_k-th largest -> -inf (torch.topk +
 *                   torch.where, so ties with the k-th are kept), then
 *     without top_p the book's own draw: softmax(logits / temperature) in
 *                   float and torch.multinomial(probs, 1) from the rng, so
 *                   the book's seed gives the book's tokens (where the
 *                   float quotients, or a temperature past float's range,
 *                   turn PyTorch's softmax NaN: the softmax in double);
 *     with top_p    p = softmax(logits / temperature) (in double), the
 *                   smallest set of most likely tokens whose probability
 *                   reaches top_p kept (ties broken by index), renormalised,
 *                   and one token drawn by inverse CDF over the kept tokens
 *                   in index order with u = torch.rand(1) from the rng
 *                   (PyTorch has no nucleus draw to follow).
 * Either way a seed gives the same tokens run after run.
 */
#include "lm/sample.h"

#include <math.h>
#include <stdint.h>

/* A kept token for the nucleus sort. */
typedef struct ranked {
    double p;
    size_t index;
} ranked;

/* Scratch layout: probs (V doubles), then order (V ranked), then a float
 * copy of the logits for the top_k selection (V floats). */
size_t attn_sample_scratch_bytes(size_t vocab_size) {
    size_t per_token = sizeof(double) + sizeof(ranked) + sizeof(float), bytes;
    return attn_mul_size(vocab_size, per_token, &bytes) ? bytes : 0;
}

/* ---- checks ------------------------------------------------------------- */

attn_status attn_sampling_check(attn_ctx *ctx, const char *who, const attn_sampling *s,
                                size_t vocab_size, const attn_rng *rng) {
    if (!s) return attn_fail(ctx, ATTN_ERR_NULL, "%s: s (the sampling) is NULL", who);
    if (vocab_size == 0) return attn_fail(ctx, ATTN_ERR_INVALID, "%s: vocab_size is 0", who);
    if (vocab_size > (size_t)INT32_MAX)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: vocab_size %zu does not fit an int32 token id",
                         who, vocab_size);
    if (!(s->temperature >= 0.0) || isinf(s->temperature))
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: temperature %g must be finite and >= 0 (0: greedy)", who,
                         s->temperature);
    char number[ATTN_NUMBER_CHARS];
    if (!(s->top_p >= 0.0 && s->top_p <= 1.0))
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: top_p %s must be in [0, 1] (0 or 1: all)",
                         who, attn_number_text(s->top_p, number));
    if (s->top_k > vocab_size)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: top_k %zu is more than vocab_size %zu (0: all)", who, s->top_k,
                         vocab_size);
    if (s->temperature > 0.0 && !rng)
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: temperature %g samples, so rng must not be NULL",
                         who, s->temperature);
    return ATTN_OK;
}

static attn_status check_args(attn_ctx *ctx, const char *who, const float *logits,
                              size_t vocab_size, const attn_sampling *s, attn_rng *rng,
                              int32_t *out) {
    if (!logits || !s || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: %s is NULL", who,
                         !logits ? "logits" : !out ? "out" : "s");
    attn_status st = attn_sampling_check(ctx, who, s, vocab_size, rng);
    if (st != ATTN_OK) return st;
    for (size_t i = 0; i < vocab_size; i++)
        if (isnan(logits[i]))
            return attn_fail(ctx, ATTN_ERR_INVALID, "%s: logits[%zu] is NaN", who, i);
    return ATTN_OK;
}

/* ---- greedy -------------------------------------------------------------- */

static size_t argmax(const float *x, size_t n) {
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* ---- top_k: the k-th largest logit -------------------------------------- */

static void swap_floats(float *a, float *b) {
    float t = *a;
    *a = *b;
    *b = t;
}

/* The k-th largest (k >= 1) of x[0 .. n-1], reordering x: quickselect with
 * a three-way partition, so runs of equal logits cost nothing extra. */
static float kth_largest(float *x, size_t n, size_t k) {
    size_t lo = 0, hi = n, want = k - 1; /* the want-th in descending order */
    for (;;) {
        if (hi - lo == 1) return x[lo];
        float a = x[lo], b = x[lo + (hi - lo) / 2], c = x[hi - 1];
        float pivot = (a > b) == (b > c) ? b : (a > b) == (c > a) ? a : c; /* median */
        /* [lo, gt) > pivot, [gt, i) == pivot, [lt, hi) < pivot */
        size_t gt = lo, i = lo, lt = hi;
        while (i < lt) {
            if (x[i] > pivot) swap_floats(&x[gt++], &x[i++]);
            else if (x[i] < pivot) swap_floats(&x[i], &x[--lt]);
            else i++;
        }
        if (want < gt) hi = gt;
        else if (want < lt) return pivot;
        else lo = lt;
    }
}

/* ---- top_p: the nucleus ---------------------------------------------------- */

/* x ranks before y: higher probability, ties by lower index (a total
 * order, so the nucleus is one set whatever the algorithm). */
static bool ranks_before(const ranked *x, const ranked *y) {
    return x->p > y->p || (x->p == y->p && x->index < y->index);
}

static void swap_ranked(ranked *a, ranked *b) {
    ranked t = *a;
    *a = *b;
    *b = t;
}

/* Reorders order[0 .. n-1] so that its first m (returned) are the smallest
 * set of top-ranked tokens whose probabilities sum to >= target (m >= 1
 * when n >= 1, n when the whole set falls short), *kept their sum: a
 * quickselect that weighs each side, so a 50257-token row costs O(V), not
 * a sort. */
static size_t select_nucleus(ranked *order, size_t n, double target, double *kept) {
    size_t lo = 0, hi = n;
    double before = 0.0; /* the sum of order[0 .. lo-1], all in the nucleus */
    while (hi > lo) {
        /* median of three to the end as the pivot (Lomuto) */
        size_t mid = lo + (hi - lo) / 2, last = hi - 1;
        if (ranks_before(&order[mid], &order[lo])) swap_ranked(&order[mid], &order[lo]);
        if (ranks_before(&order[last], &order[lo])) swap_ranked(&order[last], &order[lo]);
        if (ranks_before(&order[mid], &order[last])) swap_ranked(&order[mid], &order[last]);
        ranked pivot = order[last];
        size_t store = lo;
        double ahead = 0.0; /* the sum of those ranking before the pivot */
        for (size_t i = lo; i < last; i++)
            if (ranks_before(&order[i], &pivot)) {
                ahead += order[i].p;
                swap_ranked(&order[i], &order[store++]);
            }
        swap_ranked(&order[store], &order[last]);
        if (before + ahead >= target && store > lo) {
            hi = store; /* the nucleus ends before the pivot */
        } else if (before + ahead + pivot.p >= target) {
            *kept = before + ahead + pivot.p;
            return store + 1;
        } else {
            before += ahead + pivot.p;
            lo = store + 1;
        }
    }
    *kept = before;
    return lo;
}

/* Zeroes probs (V, summing to total) outside the smallest set of most
 * likely tokens whose share reaches top_p; returns the new total. */
static double keep_nucleus(double *probs, size_t vocab_size, double total, double top_p,
                           ranked *order) {
    size_t n = 0;
    for (size_t i = 0; i < vocab_size; i++)
        if (probs[i] > 0.0) order[n++] = (ranked){probs[i], i};
    double kept;
    size_t m = select_nucleus(order, n, top_p * total, &kept);
    for (size_t j = m; j < n; j++) probs[order[j].index] = 0.0;
    return kept;
}

/* ---- sampling ------------------------------------------------------------- */

/* probs = exp((logits - max) / T) for logits >= floor (the top_k
 * threshold, or -inf), else 0; returns their sum. */
static double weights(const float *logits, size_t vocab_size, float floor, double temperature,
                      double *probs) {
    float max = logits[argmax(logits, vocab_size)];
    double total = 0.0;
    for (size_t i = 0; i < vocab_size; i++) {
        double p = 0.0;
        if (logits[i] >= floor && logits[i] != -INFINITY)
            p = exp(((double)logits[i] - (double)max) / temperature);
        probs[i] = p;
        total += p;
    }
    return total;
}

static attn_status book_draw(attn_ctx *ctx, const char *who, const float *logits,
                             size_t vocab_size, double temperature, size_t top_k, attn_rng *rng,
                             float *probs, int32_t *out);

static attn_status sample_scaled(attn_ctx *ctx, const float *logits, size_t vocab_size,
                                 const attn_sampling *s, attn_rng *rng, void *scratch,
                                 int32_t *out) {
    if (!(s->top_p > 0.0 && s->top_p < 1.0))
        return book_draw(ctx, "attn_sample", logits, vocab_size, s->temperature, s->top_k, rng,
                         scratch, out);
    double *probs = scratch;
    ranked *order = (ranked *)(probs + vocab_size);
    float *copy = (float *)(order + vocab_size);

    float max = logits[argmax(logits, vocab_size)];
    if (max == INFINITY || max == -INFINITY)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "attn_sample: the largest logit is %s: no distribution to sample "
                         "(temperature %g)",
                         max > 0 ? "inf" : "-inf (every logit)", s->temperature);
    float floor = -INFINITY;
    if (s->top_k > 0 && s->top_k < vocab_size) {
        for (size_t i = 0; i < vocab_size; i++) copy[i] = logits[i];
        floor = kth_largest(copy, vocab_size, s->top_k);
    }
    double total = weights(logits, vocab_size, floor, s->temperature, probs);
    total = keep_nucleus(probs, vocab_size, total, s->top_p, order);

    float u;
    attn_status st = attn_rng_rand(rng, &u, 1);
    if (st != ATTN_OK) return attn_fail(ctx, st, "attn_sample: drawing from the rng failed");
    /* inverse CDF: the first kept token whose cumulative weight passes
     * u * total; rounding can leave the last kept one */
    double target = (double)u * total, cumulative = 0.0;
    size_t chosen = vocab_size;
    for (size_t i = 0; i < vocab_size; i++) {
        if (probs[i] <= 0.0) continue;
        chosen = i;
        cumulative += probs[i];
        if (cumulative > target) break;
    }
    *out = (int32_t)chosen; /* the max logit has weight 1, so one is kept */
    return ATTN_OK;
}

attn_status attn_sample_into(attn_ctx *ctx, const float *logits, size_t vocab_size,
                             const attn_sampling *s, attn_rng *rng, void *scratch, int32_t *out) {
    attn_clear_error(ctx);
    attn_status st = check_args(ctx, "attn_sample", logits, vocab_size, s, rng, out);
    if (st != ATTN_OK) return st;
    if (s->temperature == 0.0) {
        *out = (int32_t)argmax(logits, vocab_size);
        return ATTN_OK;
    }
    if (scratch) return sample_scaled(ctx, logits, vocab_size, s, rng, scratch, out);
    size_t bytes = attn_sample_scratch_bytes(vocab_size);
    void *own = bytes ? attn_malloc(bytes) : NULL;
    if (!own)
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY,
                         "attn_sample: no memory for the scratch of %zu logits", vocab_size);
    st = sample_scaled(ctx, logits, vocab_size, s, rng, own, out);
    attn_free(own);
    return st;
}

attn_status attn_sample(attn_ctx *ctx, const float *logits, size_t vocab_size,
                        const attn_sampling *s, attn_rng *rng, int32_t *out) {
    return attn_sample_into(ctx, logits, vocab_size, s, rng, NULL, out);
}

/* ---- the book's generate, draw for draw ------------------------------------ */

/* The softmax of the kept logits (>= floor, top the largest, finite) over
 * temperature, in double, into probs (floats): exp((l - top) / T), so a
 * temperature past float's range, either way, still gives its value or
 * its limit (uniform over the finite kept logits, or the maxima alone). */
static void softmax_in_double(const float *logits, size_t vocab_size, float floor, float top,
                              double temperature, float *probs) {
    double total = 0.0;
    for (size_t i = 0; i < vocab_size; i++)
        if (logits[i] >= floor && logits[i] != -INFINITY)
            total += exp(((double)logits[i] - (double)top) / temperature);
    for (size_t i = 0; i < vocab_size; i++) {
        double p = 0.0;
        if (logits[i] >= floor && logits[i] != -INFINITY)
            p = exp(((double)logits[i] - (double)top) / temperature);
        probs[i] = (float)(p / total); /* total >= 1: the top's term */
    }
}

/* torch.where(logits < topk(logits, k)[-1], -inf, logits), / temperature,
 * torch.softmax and torch.multinomial(probs, 1), all in float as PyTorch
 * computes them; probs is scratch of vocab_size floats. */
static attn_status book_draw(attn_ctx *ctx, const char *who, const float *logits,
                             size_t vocab_size, double temperature, size_t top_k, attn_rng *rng,
                             float *probs, int32_t *out) {
    float floor = -INFINITY;
    if (top_k > 0 && top_k < vocab_size) {
        for (size_t i = 0; i < vocab_size; i++) probs[i] = logits[i];
        floor = kth_largest(probs, vocab_size, top_k);
    }
    /* logits / temperature in float, then torch.softmax in float: exp(x -
     * max), times the float reciprocal of the sum. */
    const float t = (float)temperature;
    float max = -INFINITY, top = -INFINITY; /* of the quotients, of the kept logits */
    bool nan = false;
    for (size_t i = 0; i < vocab_size; i++) {
        float kept = logits[i] < floor ? -INFINITY : logits[i], x = kept / t;
        if (isnan(x)) nan = true;
        probs[i] = x;
        if (x > max) max = x;
        if (kept > top) top = kept;
    }
    if (isinf(top))
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: the largest logit is %s: no distribution to sample "
                         "(temperature %g)",
                         who, top > 0 ? "inf" : "-inf (every logit)", temperature);
    /* PyTorch divides by the temperature as a float: one past float's
     * range is inf there (-inf / inf: NaN), one below it 0 (0 / 0: NaN),
     * and a quotient past float's range is +-inf; each turns its softmax
     * NaN, which torch.multinomial refuses. The largest kept logit is
     * finite, so the distribution exists: it is drawn from its value in
     * double, from the same rng words. */
    if (nan || isinf(max)) {
        softmax_in_double(logits, vocab_size, floor, top, temperature, probs);
    } else {
        double total = 0.0;
        for (size_t i = 0; i < vocab_size; i++) {
            probs[i] = (float)exp((double)(probs[i] - max));
            total += probs[i];
        }
        const float scale = 1.0f / (float)total;
        for (size_t i = 0; i < vocab_size; i++) probs[i] *= scale;
    }
    int64_t chosen = 0;
    attn_status st = attn_rng_multinomial(rng, probs, vocab_size, &chosen);
    if (st != ATTN_OK)
        return attn_fail(ctx, st, "%s: drawing from %zu probabilities failed", who, vocab_size);
    *out = (int32_t)chosen;
    return ATTN_OK;
}

attn_status attn_sample_book(attn_ctx *ctx, const float *logits, size_t vocab_size,
                             double temperature, size_t top_k, attn_rng *rng, int32_t *out) {
    attn_clear_error(ctx);
    attn_sampling s = {temperature, top_k, 0.0};
    attn_status st = check_args(ctx, "attn_sample_book", logits, vocab_size, &s, rng, out);
    if (st != ATTN_OK) return st;
    /* The filter keeps ties with the k-th largest, so it never moves the
     * argmax: greedy needs no filtering. */
    if (temperature == 0.0) {
        *out = (int32_t)argmax(logits, vocab_size);
        return ATTN_OK;
    }
    size_t bytes;
    float *probs = attn_mul_size(vocab_size, sizeof(float), &bytes) ? attn_malloc(bytes) : NULL;
    if (!probs)
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY,
                         "attn_sample_book: no memory for %zu probabilities", vocab_size);
    st = book_draw(ctx, "attn_sample_book", logits, vocab_size, temperature, top_k, rng, probs,
                   out);
    attn_free(probs);
    return st;
}
