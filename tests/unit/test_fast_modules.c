/*
 * test_fast_modules.c — every module, forward and backward, on the fast
 * kernels of each instruction set this CPU runs, against the same module on
 * the reference kernels: relative L2 <= 1e-5 for the output, dL/dx and
 * every parameter's gradient, and bitwise the same results on 1, 2 and 3
 * threads. Dropout modules run in training mode with the same dropout seed
 * on both sides, so they draw the same masks.
 *
 * The GPT-2 module's backward takes its heads in groups when their scratch
 * would pass a budget (32 MiB): half the runs here shrink the fast side's
 * budget so that the groups form on these small shapes, one head up to
 * all, and meet the reference, which takes all heads at once.
 *
 * Fresh random sizes and inputs each run: the seed is printed; pass it as
 * argv[1] to replay.
 */
#include "attn.h"
#include "check.h"
#include "modules/module.h"

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#define TOLERANCE 1e-5

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double uniform(uint64_t *s) { return (double)(splitmix(s) >> 11) / 9007199254740992.0; }
static size_t below(uint64_t *s, size_t n) { return (size_t)(splitmix(s) % n); }

typedef enum variant { SA_V1, SA_V2, CAUSAL, WRAPPER, MHA, GPT2, VARIANTS } variant;
static const char *const variant_names[] = {"sa_v1", "sa_v2", "causal", "mha_wrapper", "mha",
                                            "gpt2"};

typedef struct shape {
    size_t batch, tokens, d_in, d_out, heads;
    double dropout;
    attn_mask_method mask;
    size_t gpt2_backward_scratch; /* floats; 0: the module's default */
} shape;

static attn_module *build(attn_ctx *ctx, variant v, const shape *s, uint64_t init_seed) {
    attn_rng *rng;
    if (attn_rng_new(ctx, init_seed, &rng) != ATTN_OK) return NULL;
    attn_module *m = NULL;
    attn_status st = ATTN_ERR_INVALID;
    switch (v) {
    case SA_V1: {
        attn_sa_v1 *p = NULL;
        /* torch.rand weights, all positive: scale the scores down so the
         * softmax stays well conditioned for any width */
        st = attn_sa_v1_new(ctx, &(attn_sa_v1_config){.d_in = s->d_in, .d_out = s->d_out,
                                                      .scale = 1.0f / (float)(s->d_in * s->d_out)},
                            rng, &p);
        m = attn_sa_v1_module(p);
        break;
    }
    case SA_V2: {
        attn_sa_v2 *p = NULL;
        st = attn_sa_v2_new(ctx, &(attn_sa_v2_config){.d_in = s->d_in, .d_out = s->d_out,
                                                      .qkv_bias = true},
                            rng, &p);
        m = attn_sa_v2_module(p);
        break;
    }
    case CAUSAL: {
        attn_causal *p = NULL;
        attn_causal_config c = {.d_in = s->d_in, .d_out = s->d_out, .context_length = s->tokens,
                                .dropout = s->dropout, .qkv_bias = true, .mask = s->mask};
        st = attn_causal_new(ctx, &c, rng, &p);
        m = attn_causal_module(p);
        break;
    }
    case WRAPPER: {
        attn_mha_wrapper *p = NULL;
        attn_mha_wrapper_config c = {.d_in = s->d_in, .d_out = s->d_out / s->heads,
                                     .context_length = s->tokens, .num_heads = s->heads,
                                     .dropout = s->dropout, .mask = s->mask};
        st = attn_mha_wrapper_new(ctx, &c, rng, &p);
        m = attn_mha_wrapper_module(p);
        break;
    }
    case MHA: {
        attn_mha *p = NULL;
        attn_mha_config c = {.d_in = s->d_in, .d_out = s->d_out, .context_length = s->tokens,
                             .num_heads = s->heads, .dropout = s->dropout, .qkv_bias = true,
                             .mask = s->mask};
        st = attn_mha_new(ctx, &c, rng, &p);
        m = attn_mha_module(p);
        break;
    }
    case GPT2:
    case VARIANTS: {
        attn_gpt2 *p = NULL;
        st = attn_gpt2_new(ctx, &(attn_gpt2_config){.n_embd = s->d_out, .n_head = s->heads,
                                                    .block_size = s->tokens,
                                                    .dropout = s->dropout},
                           rng, &p);
        if (p && s->gpt2_backward_scratch)
            attn_gpt2_set_backward_scratch(p, s->gpt2_backward_scratch);
        m = attn_gpt2_module(p);
        break;
    }
    }
    attn_rng_free(rng);
    return st == ATTN_OK ? m : NULL;
}

/* Everything one run produces: y, dx, then every parameter's gradient. */
typedef struct run_result {
    float *values;
    size_t count;
} run_result;

static bool run(attn_ctx *ctx, variant v, const shape *s, uint64_t init_seed, uint64_t drop_seed,
                const float *x, const float *dy, run_result *out) {
    attn_module *m = build(ctx, v, s, init_seed);
    if (!m) return false;
    size_t d_in = attn_module_d_in(m), d_out = attn_module_d_out(m);
    size_t rows = s->batch * s->tokens, count = rows * (d_out + d_in);
    for (size_t p = 0; p < attn_module_param_count(m); p++) {
        attn_param param;
        attn_module_param_at(m, p, &param);
        count += param.numel;
    }
    out->values = malloc(count * sizeof *out->values);
    out->count = count;
    attn_rng *drop;
    attn_rng_new(ctx, drop_seed, &drop);
    bool ok = attn_module_set_training(m, s->dropout > 0.0) == ATTN_OK &&
              attn_module_forward(m, x, s->batch, s->tokens, out->values, drop) == ATTN_OK &&
              attn_module_zero_grad(m) == ATTN_OK &&
              attn_module_backward(m, dy, s->batch, s->tokens, out->values + rows * d_out) ==
                  ATTN_OK;
    size_t at = rows * (d_out + d_in);
    for (size_t p = 0; ok && p < attn_module_param_count(m); p++) {
        attn_param param;
        attn_module_param_at(m, p, &param);
        memcpy(out->values + at, param.grad, param.numel * sizeof(float));
        at += param.numel;
    }
    attn_rng_free(drop);
    attn_module_free(m);
    return ok;
}

/*
 * Relative L2 of each part (y, dx, each gradient) against the reference.
 * A gradient's float32 rounding error scales with the terms summed into it,
 * not with the sum: where those cancel its relative error grows. The key
 * bias's gradient is analytically zero (softmax ignores the constant
 * q_i . b_k it adds to a row of scores) and holds only rounding noise; a
 * 1 x 1 out_proj gradient, a sum of 24 rows of dy . ctx that cancelled to
 * a tenth of the module's typical gradient, came out 1.1e-5 off on correct
 * kernels. So each
 * gradient's error is taken relative to its own norm, or to the norm a
 * gradient of its size typically has in this module (RMS over all
 * gradients), whichever is larger.
 */
static double worst_part(const run_result *got, const run_result *want, const size_t *bounds,
                         size_t parts) {
    double grad_sq = 0.0;
    for (size_t i = bounds[2]; i < bounds[parts]; i++)
        grad_sq += (double)want->values[i] * want->values[i];
    size_t grads = bounds[parts] - bounds[2];
    double rms = grads ? sqrt(grad_sq / (double)grads) : 0.0;
    double worst = 0.0;
    for (size_t p = 0; p < parts; p++) {
        double err = 0.0, norm = 0.0;
        for (size_t i = bounds[p]; i < bounds[p + 1]; i++) {
            double d = (double)got->values[i] - want->values[i];
            err += d * d;
            norm += (double)want->values[i] * want->values[i];
        }
        norm = sqrt(norm);
        if (p >= 2) {
            double floor = rms * sqrt((double)(bounds[p + 1] - bounds[p]));
            if (norm < floor) norm = floor;
        }
        double rel = norm > 0.0 ? sqrt(err) / norm : sqrt(err);
        if (!(rel <= worst)) worst = rel;
    }
    return worst;
}

static double compare_variant(attn_kernels kernels, variant v, uint64_t *seed) {
    shape s = {.batch = 1 + below(seed, 3), .tokens = 1 + below(seed, 40),
               .heads = 1 + below(seed, 4), .dropout = below(seed, 2) ? 0.25 : 0.0,
               .mask = (attn_mask_method)below(seed, 3)};
    s.d_in = 1 + below(seed, 96);
    s.d_out = s.heads * (1 + below(seed, 24));
    if (v == GPT2) s.d_in = s.d_out;
    if (v == SA_V1 || v == SA_V2) s.dropout = 0.0;
    uint64_t init_seed = splitmix(seed), drop_seed = splitmix(seed);
    size_t rows = s.batch * s.tokens;
    /* a budget of 8 slices of rows x hs x (1 .. heads) floats: groups of
     * that many heads, rounded down to a divisor of heads */
    bool grouped = v == GPT2 && below(seed, 2);
    if (grouped) s.dropout = 0.0; /* attention dropout takes all heads at once */
    shape fast = s;
    if (grouped)
        fast.gpt2_backward_scratch = 8 * rows * (s.d_out / s.heads) * (1 + below(seed, s.heads));
    float *x = malloc(rows * s.d_in * sizeof *x), *dy = malloc(rows * s.d_out * sizeof *dy);
    for (size_t i = 0; i < rows * s.d_in; i++) x[i] = (float)(2.0 * uniform(seed) - 1.0);
    for (size_t i = 0; i < rows * s.d_out; i++) dy[i] = (float)(2.0 * uniform(seed) - 1.0);

    attn_ctx *ref_ctx;
    attn_ctx_new(&(attn_ctx_config){.num_threads = 1, .kernels = ATTN_KERNELS_REFERENCE}, &ref_ctx);
    run_result want, got[3];
    CHECK(run(ref_ctx, v, &s, init_seed, drop_seed, x, dy, &want));
    bool same = true;
    double err = 0.0;
    for (int t = 0; t < 3; t++) {
        attn_ctx *ctx;
        attn_ctx_new(&(attn_ctx_config){.num_threads = (size_t)t + 1, .kernels = kernels}, &ctx);
        CHECK(run(ctx, v, &fast, init_seed, drop_seed, x, dy, &got[t]));
        attn_ctx_free(ctx);
    }
    /* Parts: y, dx, then the gradients in state_dict order. */
    size_t bounds[32] = {0, rows * s.d_out, rows * (s.d_out + s.d_in)}, parts = 2;
    attn_module *m = build(ref_ctx, v, &s, init_seed);
    for (size_t p = 0; m && p < attn_module_param_count(m) && parts < 31; p++) {
        attn_param param;
        attn_module_param_at(m, p, &param);
        bounds[parts + 1] = bounds[parts] + param.numel;
        parts++;
    }
    attn_module_free(m);
    if (bounds[parts] == want.count) {
        err = worst_part(&got[0], &want, bounds, parts);
        for (int t = 1; t < 3; t++)
            same = same && memcmp(got[0].values, got[t].values, want.count * sizeof(float)) == 0;
    } else {
        err = INFINITY;
    }
    if (!(err <= TOLERANCE) || !same)
        fprintf(stderr,
                "%s %s (B %zu, T %zu, d_in %zu, d_out %zu, heads %zu, dropout %g, mask %d, "
                "gpt2 backward scratch %zu): worst rel L2 %.3g, threads %s\n",
                attn_kernels_name(kernels), variant_names[v], s.batch, s.tokens, s.d_in, s.d_out,
                s.heads, s.dropout, (int)s.mask, fast.gpt2_backward_scratch, err,
                same ? "identical" : "DIFFER");
    CHECK(err <= TOLERANCE);
    CHECK(same);
    free(want.values);
    for (int t = 0; t < 3; t++) free(got[t].values);
    free(x);
    free(dy);
    attn_ctx_free(ref_ctx);
    return err;
}

int main(int argc, char **argv) {
    struct timespec now;
    timespec_get(&now, TIME_UTC);
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10)
                             : (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
    printf("seed %llu\n", (unsigned long long)seed);
    const attn_kernels sets[] = {ATTN_KERNELS_PORTABLE, ATTN_KERNELS_AVX2, ATTN_KERNELS_AVX512};
    for (size_t k = 0; k < sizeof sets / sizeof sets[0]; k++) {
        if (!attn_kernels_supported(sets[k])) {
            printf("%s: not supported here, skipped\n", attn_kernels_name(sets[k]));
            continue;
        }
        int before = check_failed;
        double worst = 0.0;
        for (int round = 0; round < 3; round++) {
            for (int v = 0; v < VARIANTS; v++) {
                double err = compare_variant(sets[k], (variant)v, &seed);
                if (!(err <= worst)) worst = err;
            }
        }
        printf("%s: %s (worst relative L2 %.2g)\n", attn_kernels_name(sets[k]),
               check_failed == before ? "ok" : "FAILED", worst);
    }
    return check_summary();
}
