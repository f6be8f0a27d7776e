/*
 * tasks.c — synthetic sequence tasks for the small model (copy, reverse,
 * sort, induction), drawn from an attn_rng so that a seed replays a run.
 *
 * Token 0 is the separator; data tokens are 1 .. V-1. Each row is a
 * sequence s of T + 1 tokens, split as a language model reads it:
 *   tokens  (T) = s[0 .. T-1]
 *   targets (T) : targets[t] = s[t+1] where s[t+1] is an answer token,
 *                 ATTN_IGNORE_INDEX (-100) elsewhere.
 *
 * copy, reverse, sort (n = T / 2 data tokens x, each uniform in 1..V-1):
 *   s = x_1 .. x_n, 0, f(x)_1 .. f(x)_n [, 0 when T is odd]
 *   f = identity, reversal, ascending sort; answers: f(x), the n tokens
 *   after the separator (the model reads the separator and writes f(x)).
 * induction (L uniform in [max(1, Lmax / 2), Lmax], Lmax = (T - 1) / 2,
 *   p_1 .. p_L distinct data tokens):
 *   s = 0, p_1 .. p_L, 0, p_1 .. p_L, 0, p_1 ...   (the period repeated)
 *   answers: every token after the second separator. Each one is the token
 *   that followed the current token the last time it appeared, the rule an
 *   induction head implements; L varies from row to row, so position alone
 *   cannot tell the answer.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

static const char *const task_names[] = {"copy", "reverse", "sort", "induction"};
#define TASK_COUNT (sizeof task_names / sizeof task_names[0])

const char *attn_task_name(attn_task_kind kind) {
    return (size_t)kind < TASK_COUNT ? task_names[kind] : "";
}

attn_status attn_task_find(attn_ctx *ctx, const char *name, attn_task_kind *out) {
    attn_clear_error(ctx);
    if (!name || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_task_find: %s is NULL", !name ? "name" : "out");
    for (size_t i = 0; i < TASK_COUNT; i++) {
        if (strcmp(name, task_names[i]) == 0) {
            *out = (attn_task_kind)i;
            return ATTN_OK;
        }
    }
    return attn_fail(ctx, ATTN_ERR_NOT_FOUND,
                     "no task named '%s' (copy, reverse, sort, induction)", name);
}

/* The longest induction prefix for T: two periods (L + 1 each) fit in T + 1. */
static size_t induction_max_prefix(size_t tokens) { return (tokens - 1) / 2; }

attn_status attn_task_check(attn_ctx *ctx, attn_task_kind kind, size_t vocab_size,
                            size_t context_length) {
    attn_clear_error(ctx);
    if ((size_t)kind >= TASK_COUNT)
        return attn_fail(ctx, ATTN_ERR_INVALID, "unknown task kind %d", (int)kind);
    const char *name = task_names[kind];
    if (vocab_size < 2)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "task %s: vocab_size (%zu) must be at least 2 (a separator and a data "
                         "token)",
                         name, vocab_size);
    if (vocab_size > (size_t)INT32_MAX)
        return attn_fail(ctx, ATTN_ERR_INVALID, "task %s: vocab_size (%zu) exceeds int32 ids",
                         name, vocab_size);
    if (kind == ATTN_TASK_INDUCTION) {
        if (context_length < 3)
            return attn_fail(ctx, ATTN_ERR_INVALID,
                             "task induction: context_length (%zu) must be at least 3", context_length);
        size_t lmax = induction_max_prefix(context_length);
        if (vocab_size - 1 < lmax)
            return attn_fail(ctx, ATTN_ERR_INVALID,
                             "task induction: context_length %zu needs prefixes of up to %zu "
                             "distinct tokens, but vocab_size %zu has %zu data tokens",
                             context_length, lmax, vocab_size, vocab_size - 1);
    } else if (context_length < 2) {
        return attn_fail(ctx, ATTN_ERR_INVALID, "task %s: context_length (%zu) must be at least 2",
                         name, context_length);
    }
    return ATTN_OK;
}

/* Uniform in [0, n), n >= 1, without modulo bias (rejects the low
 * 2^32 mod n draws). */
static uint32_t uniform_below(attn_rng *rng, uint32_t n) {
    uint32_t threshold = (uint32_t)(0u - n) % n, r;
    do r = attn_rng_draw_u32(rng);
    while (r < threshold);
    return r % n;
}

static int compare_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* One row: s (T + 1) and the index of its first answer. */
static size_t copy_like_row(attn_task_kind kind, uint32_t data_tokens, size_t T, attn_rng *rng,
                            int32_t *s) {
    size_t n = T / 2;
    for (size_t i = 0; i < n; i++) s[i] = 1 + (int32_t)uniform_below(rng, data_tokens);
    s[n] = 0;
    int32_t *answer = s + n + 1;
    for (size_t i = 0; i < n; i++) answer[i] = kind == ATTN_TASK_REVERSE ? s[n - 1 - i] : s[i];
    if (kind == ATTN_TASK_SORT) qsort(answer, n, sizeof *answer, compare_i32);
    for (size_t i = 2 * n + 1; i <= T; i++) s[i] = 0; /* odd T: one pad */
    return n + 1;
}

static size_t induction_row(uint32_t data_tokens, size_t T, attn_rng *rng, int32_t *s,
                            int32_t *pool) {
    size_t lmax = induction_max_prefix(T), lmin = lmax / 2 > 0 ? lmax / 2 : 1;
    size_t L = lmin + uniform_below(rng, (uint32_t)(lmax - lmin + 1));
    /* p: the first L of a partial Fisher-Yates shuffle of 1 .. V-1 */
    for (uint32_t i = 0; i < data_tokens; i++) pool[i] = (int32_t)i + 1;
    for (size_t i = 0; i < L; i++) {
        size_t k = i + uniform_below(rng, (uint32_t)(data_tokens - i));
        int32_t tmp = pool[i];
        pool[i] = pool[k];
        pool[k] = tmp;
    }
    for (size_t i = 0; i <= T; i++) {
        size_t phase = i % (L + 1);
        s[i] = phase == 0 ? 0 : pool[phase - 1];
    }
    return L + 2; /* the token after the second separator */
}

attn_status attn_task_batch(attn_ctx *ctx, attn_task_kind kind, size_t vocab_size,
                            size_t context_length, attn_rng *rng, size_t batch, int32_t *tokens,
                            int32_t *targets, size_t *answers) {
    attn_status st = attn_task_check(ctx, kind, vocab_size, context_length);
    if (st != ATTN_OK) return st;
    if (!rng || !tokens || !targets)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_task_batch: %s is NULL",
                         !rng ? "rng" : !tokens ? "tokens" : "targets");
    if (batch == 0) return attn_fail(ctx, ATTN_ERR_INVALID, "attn_task_batch: batch must be positive, got 0");
    size_t T = context_length, cells;
    if (!attn_mul_size(batch, T, &cells) || cells > (size_t)-1 / sizeof(int32_t) ||
        T + 1 > (size_t)-1 / sizeof(int32_t) || vocab_size - 1 > UINT32_MAX)
        return attn_fail(ctx, ATTN_ERR_OVERFLOW, "attn_task_batch: (%zu, %zu) tokens overflow",
                         batch, T);
    uint32_t data_tokens = (uint32_t)(vocab_size - 1);
    int32_t *s = attn_malloc((T + 1) * sizeof *s);
    int32_t *pool = kind == ATTN_TASK_INDUCTION ? attn_malloc(data_tokens * sizeof *pool) : NULL;
    if (!s || (kind == ATTN_TASK_INDUCTION && !pool)) {
        attn_free(s);
        attn_free(pool);
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_task_batch: out of memory");
    }
    size_t count = 0;
    for (size_t b = 0; b < batch; b++) {
        size_t first, last; /* answers are s[first .. last] */
        if (kind == ATTN_TASK_INDUCTION) {
            first = induction_row(data_tokens, T, rng, s, pool);
            last = T;
        } else {
            first = copy_like_row(kind, data_tokens, T, rng, s);
            last = 2 * (T / 2);
        }
        for (size_t t = 0; t < T; t++) {
            tokens[b * T + t] = s[t];
            bool answer = t + 1 >= first && t + 1 <= last;
            targets[b * T + t] = answer ? s[t + 1] : ATTN_IGNORE_INDEX;
            count += answer;
        }
    }
    attn_free(s);
    attn_free(pool);
    if (answers) *answers = count;
    return ATTN_OK;
}
