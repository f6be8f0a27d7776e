/* consumer.c — a program outside the project, built against an installed
 * attn: through pkg-config and through find_package(attn). It runs one
 * MultiHeadAttention forward and prints "attn <version> ok". */
#include <attn.h>

#include <stdio.h>

int main(void) {
    attn_ctx *ctx = NULL;
    attn_rng *rng = NULL;
    attn_mha *mha = NULL;
    float x[2 * 4] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f}, y[2 * 4];
    attn_mha_config cfg = {.d_in = 4, .d_out = 4, .context_length = 2, .num_heads = 2};
    int rc = 1;
    if (attn_ctx_new(NULL, &ctx) == ATTN_OK && attn_rng_new(ctx, 123, &rng) == ATTN_OK &&
        attn_mha_new(ctx, &cfg, rng, &mha) == ATTN_OK &&
        attn_module_set_training(attn_mha_module(mha), false) == ATTN_OK &&
        attn_mha_forward(mha, x, 1, 2, y, NULL) == ATTN_OK) {
        printf("attn %s ok\n", attn_version());
        rc = 0;
    } else {
        fprintf(stderr, "consumer: %s\n", attn_ctx_last_error(ctx));
    }
    attn_mha_free(mha);
    attn_rng_free(rng);
    attn_ctx_free(ctx);
    return rc;
}
