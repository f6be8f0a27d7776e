/*
 * presets.c — the four released GPT-2 configurations.
 *
 * Head counts are those of the released checkpoints (head_dim 64 for all):
 * seed 002 lists 24 heads for medium and 36 for large, which do not even
 * divide their widths (1024 / 24, 1280 / 36). GPT-2's c_attn has a bias, so
 * qkv_bias is true here where seed 002's config dict says False.
 */
#include "internal.h"

#include <string.h>

static const attn_gpt2_preset presets[] = {
    {"gpt2-small", 50257, 1024, 768, 12, 12, 0.1, true},
    {"gpt2-medium", 50257, 1024, 1024, 16, 24, 0.1, true},
    {"gpt2-large", 50257, 1024, 1280, 20, 36, 0.1, true},
    {"gpt2-xl", 50257, 1024, 1600, 25, 48, 0.1, true},
};
#define PRESET_COUNT (sizeof presets / sizeof presets[0])

size_t attn_gpt2_preset_count(void) { return PRESET_COUNT; }

attn_status attn_gpt2_preset_at(size_t index, attn_gpt2_preset *out) {
    if (!out) return ATTN_ERR_NULL;
    if (index >= PRESET_COUNT) return ATTN_ERR_NOT_FOUND;
    *out = presets[index];
    return ATTN_OK;
}

attn_status attn_gpt2_preset_find(attn_ctx *ctx, const char *name, attn_gpt2_preset *out) {
    attn_clear_error(ctx);
    if (!name || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_gpt2_preset_find: %s is NULL",
                         !name ? "name" : "out");
    for (size_t i = 0; i < PRESET_COUNT; i++) {
        const char *full = presets[i].name;
        if (strcmp(name, full) == 0 || strcmp(name, full + strlen("gpt2-")) == 0) {
            *out = presets[i];
            return ATTN_OK;
        }
    }
    return attn_fail(ctx, ATTN_ERR_NOT_FOUND,
                     "no GPT-2 preset named '%s' (try gpt2-small, gpt2-medium, gpt2-large, gpt2-xl)",
                     name);
}

attn_status attn_gpt2_preset_model_params(attn_ctx *ctx, const attn_gpt2_preset *p, size_t *out) {
    attn_clear_error(ctx);
    if (!p || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_gpt2_preset_model_params: %s is NULL",
                         !p ? "preset" : "out");
    const char *name = p->name ? p->name : "(unnamed)";
    const char *zero = !p->vocab_size       ? "vocab_size"
                       : !p->context_length ? "context_length"
                       : !p->n_embd         ? "n_embd"
                       : !p->n_head         ? "n_head"
                                            : NULL;
    if (zero) return attn_fail(ctx, ATTN_ERR_INVALID, "preset %s: %s is 0", name, zero);
    if (p->n_embd % p->n_head)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "preset %s: n_embd (%zu) must be divisible by n_head (%zu)", name,
                         p->n_embd, p->n_head);
    /* wte + wpe + n_layer blocks + ln_f; the output head shares wte.
     * A block: ln_1 (2C) + c_attn (3C^2, + 3C with qkv_bias) + c_proj (C^2 + C)
     *          + ln_2 (2C) + mlp.c_fc (4C^2 + 4C) + mlp.c_proj (4C^2 + C)
     *          = 12C^2 + 13C, or 12C^2 + 10C without the qkv bias. */
    size_t C = p->n_embd, embeddings, positions, per_layer, layers, total;
    size_t linear = p->qkv_bias ? 13 : 10;
    bool ok = attn_mul_size(p->vocab_size, C, &embeddings) &&
              attn_mul_size(p->context_length, C, &positions) &&
              attn_mul3_size(12, C, C, &per_layer) && C <= (size_t)-1 / linear &&
              attn_add_size(per_layer, linear * C, &per_layer) &&
              attn_mul_size(p->n_layer, per_layer, &layers) &&
              attn_add_size(embeddings, positions, &total) && attn_add_size(total, layers, &total) &&
              C <= (size_t)-1 / 2 && attn_add_size(total, 2 * C, &total);
    if (!ok)
        return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                         "preset %s: parameter count overflows size_t (sum of terms)", name);
    *out = total;
    return ATTN_OK;
}
