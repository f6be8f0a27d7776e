/* mha_example.c — the README's example: GPT-2 small's MultiHeadAttention,
 * initialised as torch.manual_seed(123); MultiHeadAttention(...) would be. */
#include <attn.h>

#include <stdio.h>
#include <stdlib.h>

int main(void) {
    enum { B = 2, T = 6, C = 768 };
    attn_ctx *ctx;
    if (attn_ctx_new(&(attn_ctx_config){.num_threads = 2}, &ctx) != ATTN_OK) return 1;

    attn_rng *rng; /* torch.manual_seed(123) */
    attn_mha *mha; /* MultiHeadAttention(768, 768, 1024, 0.1, num_heads=12) */
    attn_mha_config cfg = {.d_in = C, .d_out = C, .context_length = 1024, .num_heads = 12,
                           .dropout = 0.1};
    float *x = malloc(sizeof(float) * B * T * C), *y = malloc(sizeof(float) * B * T * C);
    if (!x || !y || attn_rng_new(ctx, 123, &rng) != ATTN_OK ||
        attn_mha_new(ctx, &cfg, rng, &mha) != ATTN_OK) {
        fprintf(stderr, "setup failed: %s\n", attn_ctx_last_error(ctx));
        return 1;
    }
    attn_module *m = attn_mha_module(mha);
    attn_param w;
    if (attn_module_set_training(m, false) != ATTN_OK ||     /* mha.eval() */
        attn_rng_randn(rng, x, B * T * C) != ATTN_OK ||       /* x = torch.randn(2, 6, 768) */
        attn_mha_forward(mha, x, B, T, y, NULL) != ATTN_OK || /* y = mha(x) */
        attn_module_param(m, "out_proj.weight", &w) != ATTN_OK) {
        fprintf(stderr, "failed: %s\n", attn_ctx_last_error(ctx));
        return 1;
    }
    printf("out_proj.weight is [%zu, %zu]; y[0, 0, :3] = %.4f %.4f %.4f\n", w.shape[0],
           w.shape[1], y[0], y[1], y[2]);

    /* Errors are values, with a message naming what was wrong. */
    attn_mha *bad;
    cfg.num_heads = 7;
    if (attn_mha_new(ctx, &cfg, rng, &bad) != ATTN_OK)
        printf("num_heads 7: %s\n", attn_ctx_last_error(ctx));

    attn_mha_free(mha);
    attn_rng_free(rng);
    attn_ctx_free(ctx);
    free(x);
    free(y);
    return 0;
}
