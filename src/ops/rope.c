/* rope.c — RoPE's inverse frequencies (rope.h). */
#include "ops/rope.h"

#include "internal.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>

void attn_rope_inv_freq(double rope_base, const attn_rope_scaling *scaling, size_t head_dim,
                        float *inv_freq) {
    size_t half = head_dim / 2;
    const float two_pi = (float)(2.0 * 3.14159265358979323846);
    const attn_rope_scaling *s = scaling;
    for (size_t i = 0; i < half; i++) {
        /* 1.0 / (theta_base ** (arange(0, head_dim, 2) / head_dim)) */
        float exponent = (float)(2 * i) / (float)head_dim;
        float power = (float)pow((double)(float)rope_base, (double)exponent);
        float inv = 1.0f / power;
        if (s && s->factor > 0.0) {
            double orig = (double)s->original_context_length;
            /* a tensor against a Python float compares in float32 */
            float low_wavelen = (float)(orig / s->low_freq_factor);
            float high_wavelen = (float)(orig / s->high_freq_factor);
            /* 2 pi / inv_freq: PyTorch computes a scalar over a tensor as
             * reciprocal(tensor) * scalar */
            float wavelen = (1.0f / inv) * two_pi;
            float factor = (float)s->factor, low = (float)s->low_freq_factor;
            float scaled = wavelen > low_wavelen ? inv / factor : inv;
            float smooth = ((1.0f / wavelen) * (float)orig - low) /
                           (float)(s->high_freq_factor - s->low_freq_factor);
            float smoothed = (1.0f - smooth) * (inv / factor) + smooth * inv;
            bool medium = wavelen <= low_wavelen && wavelen >= high_wavelen;
            inv = medium ? smoothed : scaled;
        }
        inv_freq[i] = inv;
    }
}

attn_status attn_rope_check_base(attn_ctx *ctx, const char *who, const char *name,
                                 double rope_base) {
    if (!(rope_base > 0.0) || !isfinite(rope_base))
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: %s (%g) must be positive and finite", who,
                         name, rope_base);
    if ((float)rope_base == 0.0f || isinf((float)rope_base))
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: %s (%g) is outside float32's range (%g to %g)", who, name,
                         rope_base, (double)FLT_TRUE_MIN, (double)FLT_MAX);
    return ATTN_OK;
}
