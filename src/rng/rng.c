/*
 * rng.c — PyTorch's CPU generator, draw for draw.
 *
 * torch.manual_seed(s) seeds a standard mt19937 (Matsumoto & Nishimura's
 * init_genrand with the low 32 bits of s). From that one stream:
 *   rand / uniform_  float32: one 32-bit draw per element, its low 24 bits
 *                    scaled by 2^-24, then x * (to - from) + from in float.
 *   randn            fills uniforms first, then Box-Muller over blocks of 16
 *                    (tensors of >= 16 elements) or the scalar double path.
 *   bernoulli_(p)    per element a 53-bit double from two draws (mt19937
 *                    builds), or an MKL MCG31m1 stream seeded by one draw.
 * PyTorch's kaiming_uniform_ bound is computed in Python doubles; we repeat
 * the same double arithmetic so the float bound is the same bit pattern.
 */
#include "internal.h"
#include "rng/dropout.h"
#include "rng/philox.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MT_N 624
#define MT_M 397

struct attn_rng {
    attn_ctx *ctx;
    uint32_t state[MT_N];
    int next; /* index of the next word to temper; MT_N: regenerate first */
    attn_bernoulli_method bernoulli;
    uint64_t seed;           /* the last manual seed: the Philox key */
    uint64_t philox_offset;  /* the next Philox dropout call's offset */
    /* PyTorch caches the second Box-Muller value of the scalar double path. */
    bool has_next_double_normal;
    double next_double_normal;
};

static void mt_seed(attn_rng *rng, uint64_t seed) {
    rng->seed = seed;
    rng->philox_offset = 0;
    rng->state[0] = (uint32_t)(seed & 0xffffffffu);
    for (int i = 1; i < MT_N; i++) {
        uint32_t prev = rng->state[i - 1];
        rng->state[i] = 1812433253u * (prev ^ (prev >> 30)) + (uint32_t)i;
    }
    rng->next = MT_N;
    rng->has_next_double_normal = false;
}

/* The twist of all MT_N words, in three loops without a modulo so that the
 * compiler runs each in vectors: word i reads words i + 1 and i + MT_M
 * (mod MT_N), the latter already new once i + MT_M wraps, at a distance of
 * MT_N - MT_M words, far more than a vector. */
static inline uint32_t mt_twist(uint32_t upper, uint32_t lower, uint32_t far) {
    uint32_t y = (upper & 0x80000000u) | (lower & 0x7fffffffu);
    return far ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
}

static void mt_regenerate(attn_rng *rng) {
    uint32_t *s = rng->state;
    int i = 0;
    for (; i < MT_N - MT_M; i++) s[i] = mt_twist(s[i], s[i + 1], s[i + MT_M]);
    for (; i < MT_N - 1; i++) s[i] = mt_twist(s[i], s[i + 1], s[i + MT_M - MT_N]);
    s[MT_N - 1] = mt_twist(s[MT_N - 1], s[0], s[MT_M - 1]);
    rng->next = 0;
}

static inline uint32_t mt_temper(uint32_t y) {
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

static uint32_t mt_next(attn_rng *rng) {
    if (rng->next >= MT_N) mt_regenerate(rng);
    return mt_temper(rng->state[rng->next++]);
}

/* The stream's next n words, as n calls of mt_next give them. */
static void mt_fill(attn_rng *rng, uint32_t *out, size_t n) {
    while (n > 0) {
        if (rng->next >= MT_N) mt_regenerate(rng);
        size_t take = (size_t)(MT_N - rng->next);
        if (take > n) take = n;
        const uint32_t *words = rng->state + rng->next;
        for (size_t i = 0; i < take; i++) out[i] = mt_temper(words[i]);
        rng->next += (int)take;
        out += take;
        n -= take;
    }
}

/* The generator's random64(): the first draw is the high word. */
static uint64_t mt_next64(attn_rng *rng) {
    uint64_t hi = mt_next(rng);
    uint64_t lo = mt_next(rng);
    return (hi << 32) | lo;
}

/* uniform_real_distribution<float>: 24 random bits, arithmetic in float. */
static float uniform_float(attn_rng *rng, float from, float to) {
    float x = (float)(mt_next(rng) & 0xffffffu) * (1.0f / 16777216.0f);
    return fmaf(x, to - from, from);
}

/* uniform_real_distribution<double> on [0, 1): 53 random bits. */
static double uniform_double(attn_rng *rng) {
    return (double)(mt_next64(rng) & ((UINT64_C(1) << 53) - 1)) *
           (1.0 / 9007199254740992.0);
}

attn_status attn_rng_new(attn_ctx *ctx, uint64_t seed, attn_rng **out) {
    attn_clear_error(ctx);
    if (!out) return attn_fail(ctx, ATTN_ERR_NULL, "attn_rng_new: out is NULL");
    *out = NULL;
    attn_rng *rng = attn_calloc(1, sizeof *rng);
    if (!rng) return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "attn_rng_new: out of memory");
    rng->ctx = ctx;
    rng->bernoulli = ATTN_BERNOULLI_MT19937;
    mt_seed(rng, seed);
    *out = rng;
    return ATTN_OK;
}

void attn_rng_free(attn_rng *rng) { attn_free(rng); }

attn_status attn_rng_manual_seed(attn_rng *rng, uint64_t seed) {
    if (!rng) return ATTN_ERR_NULL;
    attn_clear_error(rng->ctx);
    mt_seed(rng, seed);
    return ATTN_OK;
}

attn_status attn_rng_set_bernoulli_method(attn_rng *rng, attn_bernoulli_method method) {
    if (!rng) return ATTN_ERR_NULL;
    attn_clear_error(rng->ctx);
    if (method != ATTN_BERNOULLI_MT19937 && method != ATTN_BERNOULLI_MKL_MCG31 &&
        method != ATTN_BERNOULLI_PHILOX)
        return attn_fail(rng->ctx, ATTN_ERR_INVALID,
                         "attn_rng_set_bernoulli_method: unknown method %d", (int)method);
    rng->bernoulli = method;
    return ATTN_OK;
}

attn_bernoulli_method attn_rng_bernoulli(const attn_rng *rng) { return rng->bernoulli; }

attn_rng *attn_rng_snapshot(const attn_rng *rng) {
    attn_rng *copy = attn_malloc(sizeof *copy);
    if (copy) *copy = *rng;
    return copy;
}

void attn_rng_restore(attn_rng *rng, const attn_rng *snapshot) { *rng = *snapshot; }

uint32_t attn_rng_draw_u32(attn_rng *rng) { return mt_next(rng); }

attn_status attn_rng_next_u32(attn_rng *rng, uint32_t *out) {
    if (!rng) return ATTN_ERR_NULL;
    attn_clear_error(rng->ctx);
    if (!out) return attn_fail(rng->ctx, ATTN_ERR_NULL, "attn_rng_next_u32: out is NULL");
    *out = mt_next(rng);
    return ATTN_OK;
}

static attn_status check_output(attn_rng *rng, const char *fn, const void *out, size_t n) {
    if (!rng) return ATTN_ERR_NULL;
    attn_clear_error(rng->ctx);
    if (!out && n > 0) return attn_fail(rng->ctx, ATTN_ERR_NULL, "%s: out is NULL", fn);
    return ATTN_OK;
}

attn_status attn_rng_rand(attn_rng *rng, float *out, size_t n) {
    attn_status st = check_output(rng, "attn_rng_rand", out, n);
    if (st != ATTN_OK) return st;
    for (size_t i = 0; i < n; i++) out[i] = uniform_float(rng, 0.0f, 1.0f);
    return ATTN_OK;
}

attn_status attn_rng_uniform(attn_rng *rng, float *out, size_t n, double from, double to) {
    attn_status st = check_output(rng, "attn_rng_uniform", out, n);
    if (st != ATTN_OK) return st;
    /* PyTorch's uniform_ checks, in its order: each bound within float's
     * range, from <= to, and the width to - from (in double) at most FLT_MAX. */
    const double lo = -FLT_MAX, hi = FLT_MAX;
    if (!(from >= lo && from <= hi))
        return attn_fail(rng->ctx, ATTN_ERR_INVALID,
                         "attn_rng_uniform: from=%g is out of bounds for float32 [%g, %g]", from,
                         lo, hi);
    if (!(to >= lo && to <= hi))
        return attn_fail(rng->ctx, ATTN_ERR_INVALID,
                         "attn_rng_uniform: to=%g is out of bounds for float32 [%g, %g]", to, lo,
                         hi);
    if (!(from <= to))
        return attn_fail(rng->ctx, ATTN_ERR_INVALID,
                         "attn_rng_uniform: need from <= to, got from=%g to=%g", from, to);
    if (!(to - from <= hi))
        return attn_fail(rng->ctx, ATTN_ERR_INVALID,
                         "attn_rng_uniform: to - from (%g) exceeds float32's max (%g), from=%g "
                         "to=%g",
                         to - from, hi, from, to);
    /* PyTorch casts the double bounds to the tensor's type first. */
    float f_from = (float)from, f_to = (float)to;
    for (size_t i = 0; i < n; i++) out[i] = uniform_float(rng, f_from, f_to);
    return ATTN_OK;
}

/* normal_fill_16: Box-Muller on 16 uniforms, pairs (j, j + 8), in float as
 * PyTorch's AVX2 kernel does it (the angle is float(2 pi) * u2). Its vector
 * log/sin/cos differ from libm's in the last bits, hence "within ulps". */
static void normal_fill_16(float *data) {
    const float two_pi = (float)(2.0 * 3.14159265358979323846);
    for (int j = 0; j < 8; j++) {
        float u1 = 1.0f - data[j];
        float u2 = data[j + 8];
        float radius = sqrtf(-2.0f * logf(u1));
        float theta = two_pi * u2;
        data[j] = radius * cosf(theta);
        data[j + 8] = radius * sinf(theta);
    }
}

/* normal_distribution<double> with PyTorch's one-value cache. */
static double normal_double(attn_rng *rng) {
    const double pi = 3.14159265358979323846;
    if (rng->has_next_double_normal) {
        rng->has_next_double_normal = false;
        return rng->next_double_normal;
    }
    double u1 = uniform_double(rng);
    double u2 = uniform_double(rng);
    double r = sqrt(-2.0 * log1p(-u2));
    double theta = 2.0 * pi * u1;
    rng->next_double_normal = r * sin(theta);
    rng->has_next_double_normal = true;
    return r * cos(theta);
}

attn_status attn_rng_randn(attn_rng *rng, float *out, size_t n) {
    attn_status st = check_output(rng, "attn_rng_randn", out, n);
    if (st != ATTN_OK) return st;
    if (n < 16) {
        for (size_t i = 0; i < n; i++) out[i] = (float)normal_double(rng);
        return ATTN_OK;
    }
    for (size_t i = 0; i < n; i++) out[i] = uniform_float(rng, 0.0f, 1.0f);
    for (size_t i = 0; i + 16 <= n; i += 16) normal_fill_16(out + i);
    if (n % 16 != 0) {
        /* PyTorch redraws the last 16 values as one more block. */
        float *tail = out + n - 16;
        for (int i = 0; i < 16; i++) tail[i] = uniform_float(rng, 0.0f, 1.0f);
        normal_fill_16(tail);
    }
    return ATTN_OK;
}

attn_status attn_rng_linear_init(attn_rng *rng, float *weight, float *bias,
                                 size_t out_features, size_t in_features) {
    if (!rng) return ATTN_ERR_NULL;
    attn_clear_error(rng->ctx);
    if (!weight)
        return attn_fail(rng->ctx, ATTN_ERR_NULL, "attn_rng_linear_init: weight is NULL");
    size_t n;
    if (!attn_mul_size(out_features, in_features, &n))
        return attn_fail(rng->ctx, ATTN_ERR_OVERFLOW,
                         "attn_rng_linear_init: out_features (%zu) * in_features (%zu) overflows",
                         out_features, in_features);
    /* kaiming_uniform_(w, a=sqrt(5)): gain = sqrt(2 / (1 + a^2)),
     * std = gain / sqrt(fan_in), bound = sqrt(3) * std, all in double.
     * fan_in 0 makes PyTorch divide by zero; it warns and leaves w empty. */
    if (in_features == 0 && n > 0)
        return attn_fail(rng->ctx, ATTN_ERR_INVALID,
                         "attn_rng_linear_init: in_features is 0 (fan_in must be positive)");
    if (n > 0) {
        double a = sqrt(5.0);
        double gain = sqrt(2.0 / (1.0 + a * a));
        double std = gain / sqrt((double)in_features);
        double bound = sqrt(3.0) * std;
        attn_status st = attn_rng_uniform(rng, weight, n, -bound, bound);
        if (st != ATTN_OK) return st;
    }
    if (bias) {
        double bound = in_features > 0 ? 1.0 / sqrt((double)in_features) : 0.0;
        return attn_rng_uniform(rng, bias, out_features, -bound, bound);
    }
    return ATTN_OK;
}

/* MCG31m1: x <- a x mod (2^31 - 1), u = x / m. */
#define MCG31_A 1132489760u
#define MCG31_M 2147483647u

void attn_dropout_stream_begin(attn_dropout_stream *s, attn_rng *rng, double p, size_t n) {
    *s = (attn_dropout_stream){.rng = rng, .method = rng->bernoulli, .keep = 1.0 - p};
    s->passthrough = p == 0.0 || n == 0;
    s->drop_all = p == 1.0;
    s->kept_scale = attn_dropout_kept_scale(p);
    if (s->passthrough || s->drop_all) return;
    /* uniform_double(rng) < keep, with the uniform x 2^-53 for an integer x
     * below 2^53 (both products exact), is x < keep 2^53, that is x <
     * ceil(keep 2^53) */
    s->keep_below = (uint64_t)ceil(s->keep * 9007199254740992.0);
    if (s->method == ATTN_BERNOULLI_PHILOX) {
        s->philox_seed = rng->seed;
        s->philox_offset = rng->philox_offset++;
        s->keep_threshold = attn_philox_keep_threshold(p);
        return;
    }
    if (s->method == ATTN_BERNOULLI_MKL_MCG31) {
        /* One 32-bit draw seeds the stream; MKL maps seed 0 to 1. */
        uint32_t seed = mt_next(rng);
        s->mcg_state = seed % MCG31_M;
        if (s->mcg_state == 0) s->mcg_state = 1;
    }
}

void attn_dropout_stream_cancel(attn_dropout_stream *s) {
    if (s->method == ATTN_BERNOULLI_PHILOX && !s->passthrough && !s->drop_all)
        s->rng->philox_offset = s->philox_offset;
}

static bool dropout_keeps(attn_dropout_stream *s) {
    if (s->method == ATTN_BERNOULLI_PHILOX) {
        uint64_t e = s->index++;
        if ((e & 63) == 0) attn_philox_dropout_group(s->philox_seed, s->philox_offset, e >> 6, s->group);
        return s->group[e & 63] < s->keep_threshold;
    }
    if (s->method == ATTN_BERNOULLI_MKL_MCG31) {
        /* The stream's first uniform is the seed itself: u_0 = x_0 / m. */
        double u = (double)s->mcg_state / (double)MCG31_M;
        s->mcg_state = (uint32_t)(((uint64_t)s->mcg_state * MCG31_A) % MCG31_M);
        return u < s->keep;
    }
    return uniform_double(s->rng) < s->keep;
}

float attn_dropout_stream_next(attn_dropout_stream *s) {
    if (s->passthrough) return 1.0f;
    return !s->drop_all && dropout_keeps(s) ? s->kept_scale : 0.0f;
}

void attn_dropout_stream_keeps(attn_dropout_stream *s, uint8_t *keep, size_t n) {
    if (s->passthrough || s->drop_all) {
        memset(keep, s->passthrough ? 1 : 0, n);
        return;
    }
    if (s->method != ATTN_BERNOULLI_MT19937) {
        for (size_t i = 0; i < n; i++) keep[i] = dropout_keeps(s);
        return;
    }
    /* two words an element, drawn a block at a time */
    enum { BLOCK = 512 };
    uint32_t words[2 * BLOCK];
    while (n > 0) {
        size_t m = n < BLOCK ? n : BLOCK;
        mt_fill(s->rng, words, 2 * m);
        for (size_t i = 0; i < m; i++) {
            uint64_t x = (((uint64_t)words[2 * i] << 32) | words[2 * i + 1]) &
                         ((UINT64_C(1) << 53) - 1);
            keep[i] = x < s->keep_below;
        }
        keep += m;
        n -= m;
    }
}

void attn_dropout_stream_apply(attn_dropout_stream *s, const float *x, float *y, size_t n,
                               uint8_t *keep_mask) {
    if (s->passthrough) {
        if (y != x) memmove(y, x, n * sizeof *y);
        if (keep_mask) memset(keep_mask, 1, n);
        return;
    }
    enum { BLOCK = 1024 };
    uint8_t block[BLOCK];
    for (size_t i0 = 0; i0 < n; i0 += BLOCK) {
        size_t m = n - i0 < BLOCK ? n - i0 : BLOCK;
        uint8_t *keep = keep_mask ? keep_mask + i0 : block;
        attn_dropout_stream_keeps(s, keep, m);
        for (size_t i = 0; i < m; i++) y[i0 + i] = x[i0 + i] * (keep[i] ? s->kept_scale : 0.0f);
    }
}

attn_status attn_rng_dropout(attn_rng *rng, const float *x, float *y, size_t n, double p,
                             uint8_t *keep_mask) {
    if (!rng) return ATTN_ERR_NULL;
    attn_clear_error(rng->ctx);
    if ((!x || !y) && n > 0)
        return attn_fail(rng->ctx, ATTN_ERR_NULL, "attn_rng_dropout: %s is NULL",
                         !x ? "x" : "y");
    char number[ATTN_NUMBER_CHARS];
    if (!(p >= 0.0 && p <= 1.0))
        return attn_fail(rng->ctx, ATTN_ERR_INVALID, "attn_rng_dropout: p (%s) must be in [0, 1]",
                         attn_number_text(p, number));
    attn_dropout_stream stream;
    attn_dropout_stream_begin(&stream, rng, p, n);
    attn_dropout_stream_apply(&stream, x, y, n, keep_mask);
    return ATTN_OK;
}

/* ---- the draws of torch.utils.data and torch.multinomial ---------------- */

attn_status attn_rng_random_int64(attn_rng *rng, int64_t *out) {
    if (!rng) return ATTN_ERR_NULL;
    attn_clear_error(rng->ctx);
    if (!out) return attn_fail(rng->ctx, ATTN_ERR_NULL, "attn_rng_random_int64: out is NULL");
    /* uniform_int_distribution<int64_t>: random64() modulo int64's max + 1 */
    *out = (int64_t)(mt_next64(rng) % (UINT64_C(1) << 63));
    return ATTN_OK;
}

attn_status attn_rng_randperm(attn_rng *rng, size_t n, int64_t *out) {
    if (!rng) return ATTN_ERR_NULL;
    attn_clear_error(rng->ctx);
    if (!out && n > 0) return attn_fail(rng->ctx, ATTN_ERR_NULL, "attn_rng_randperm: out is NULL");
    if (n > (size_t)INT64_MAX)
        return attn_fail(rng->ctx, ATTN_ERR_INVALID,
                         "attn_rng_randperm: n (%zu) does not fit an int64 index", n);
    for (size_t i = 0; i < n; i++) out[i] = (int64_t)i;
    /* randperm_cpu: a forward Fisher-Yates whose swap partner is one 32-bit
     * draw modulo the number of places left (n - 1 draws). */
    for (size_t i = 0; i + 1 < n; i++) {
        size_t z = (size_t)((uint64_t)mt_next(rng) % (uint64_t)(n - i));
        int64_t keep = out[i];
        out[i] = out[i + z];
        out[i + z] = keep;
    }
    return ATTN_OK;
}

attn_status attn_rng_multinomial(attn_rng *rng, const float *probs, size_t n, int64_t *out) {
    if (!rng) return ATTN_ERR_NULL;
    attn_clear_error(rng->ctx);
    if (!probs || !out)
        return attn_fail(rng->ctx, ATTN_ERR_NULL, "attn_rng_multinomial: %s is NULL",
                         !probs ? "probs" : "out");
    if (n == 0)
        return attn_fail(rng->ctx, ATTN_ERR_INVALID,
                         "attn_rng_multinomial: n is 0 (no category to draw)");
    /* PyTorch's checks, before any draw: every weight finite and >= 0, and
     * the float sum not 0. */
    float sum = 0.0f;
    for (size_t i = 0; i < n; i++) {
        if (!(probs[i] >= 0.0f && probs[i] < INFINITY))
            return attn_fail(rng->ctx, ATTN_ERR_INVALID,
                             "attn_rng_multinomial: probs[%zu] = %g (must be finite and >= 0)",
                             i, (double)probs[i]);
        sum += probs[i];
    }
    if (sum == 0.0f)
        return attn_fail(rng->ctx, ATTN_ERR_INVALID,
                         "attn_rng_multinomial: the %zu probs sum to 0", n);
    /* The single-sample path draws q ~ Exp(1) for every category (in
     * order, a double -log(1 - u) rounded to float) and returns the first
     * argmax of the float ratios p / q: a Gumbel-max draw. A NaN ratio
     * (0 / 0) wins, as argmax ranks NaN above all. */
    size_t best = 0;
    float best_ratio = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float q = (float)(-1.0 * log(1.0 - uniform_double(rng)));
        float ratio = probs[i] / q;
        if (i == 0 || (!isnan(best_ratio) && (isnan(ratio) || ratio > best_ratio))) {
            best = i;
            best_ratio = ratio;
        }
    }
    *out = (int64_t)best;
    return ATTN_OK;
}

/* ---- the generator's state, for checkpoints ------------------------------ */

/* Little-endian bytes: the 624 mt19937 words, the next index, the
 * Bernoulli method, the seed, the Philox offset, and the cached Box-Muller
 * value (a flag word, then its double's bits). */
#define RNG_STATE_SIZE (MT_N * 4 + 4 + 4 + 8 + 8 + 4 + 8)

size_t attn_rng_state_size(void) { return RNG_STATE_SIZE; }

static void put_le(unsigned char *p, uint64_t v, size_t bytes) {
    for (size_t i = 0; i < bytes; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_le(const unsigned char *p, size_t bytes) {
    uint64_t v = 0;
    for (size_t i = 0; i < bytes; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

attn_status attn_rng_get_state(const attn_rng *rng, void *state, size_t size) {
    if (!rng) return ATTN_ERR_NULL;
    attn_clear_error(rng->ctx);
    if (!state) return attn_fail(rng->ctx, ATTN_ERR_NULL, "attn_rng_get_state: state is NULL");
    if (size != RNG_STATE_SIZE)
        return attn_fail(rng->ctx, ATTN_ERR_SHAPE,
                         "attn_rng_get_state: size %zu, the state takes %d bytes", size,
                         RNG_STATE_SIZE);
    unsigned char *p = state;
    for (int i = 0; i < MT_N; i++, p += 4) put_le(p, rng->state[i], 4);
    put_le(p, (uint64_t)rng->next, 4), p += 4;
    put_le(p, (uint64_t)rng->bernoulli, 4), p += 4;
    put_le(p, rng->seed, 8), p += 8;
    put_le(p, rng->philox_offset, 8), p += 8;
    put_le(p, rng->has_next_double_normal ? 1u : 0u, 4), p += 4;
    uint64_t bits;
    memcpy(&bits, &rng->next_double_normal, sizeof bits);
    put_le(p, bits, 8);
    return ATTN_OK;
}

attn_status attn_rng_set_state(attn_rng *rng, const void *state, size_t size) {
    if (!rng) return ATTN_ERR_NULL;
    attn_clear_error(rng->ctx);
    if (!state) return attn_fail(rng->ctx, ATTN_ERR_NULL, "attn_rng_set_state: state is NULL");
    if (size != RNG_STATE_SIZE)
        return attn_fail(rng->ctx, ATTN_ERR_SHAPE,
                         "attn_rng_set_state: size %zu, the state takes %d bytes", size,
                         RNG_STATE_SIZE);
    const unsigned char *p = state;
    const unsigned char *tail = p + MT_N * 4;
    uint64_t next = get_le(tail, 4), method = get_le(tail + 4, 4), has = get_le(tail + 24, 4);
    if (next > MT_N || (method != ATTN_BERNOULLI_MT19937 && method != ATTN_BERNOULLI_MKL_MCG31 &&
                        method != ATTN_BERNOULLI_PHILOX) || has > 1)
        return attn_fail(rng->ctx, ATTN_ERR_FORMAT,
                         "attn_rng_set_state: not a generator state (next %llu, Bernoulli "
                         "method %llu, cached-normal flag %llu)",
                         (unsigned long long)next, (unsigned long long)method,
                         (unsigned long long)has);
    /* each Philox dropout call takes the next offset: one past 2^63 is a
     * count no generator reaches, and near 2^64 would wrap to a fresh
     * generator's offsets and repeat its masks */
    uint64_t offset = get_le(tail + 16, 8);
    if (offset > (uint64_t)1 << 63)
        return attn_fail(rng->ctx, ATTN_ERR_FORMAT,
                         "attn_rng_set_state: not a generator state (Philox offset %llu, past "
                         "2^63 calls)",
                         (unsigned long long)offset);
    for (int i = 0; i < MT_N; i++) rng->state[i] = (uint32_t)get_le(p + 4 * i, 4);
    rng->next = (int)next;
    rng->bernoulli = (attn_bernoulli_method)method;
    rng->seed = get_le(tail + 8, 8);
    rng->philox_offset = offset;
    rng->has_next_double_normal = has == 1;
    uint64_t bits = get_le(tail + 28, 8);
    memcpy(&rng->next_double_normal, &bits, sizeof bits);
    return ATTN_OK;
}
