/* generate_example.c — the book's GPT-2 generating in C, token by token:
 * a model (the book's state_dict or a Hugging Face checkpoint given as
 * argv[1]; else a small random GPT-2, attn generate's gpt2-tiny preset, drawn
 * as torch.manual_seed(123); GPTModel(cfg) would draw it), a paged KV cache,
 * greedy decoding, and each token printed as it comes. */
#include <attn.h>

#include <stdio.h>

#define NEW_TOKENS 16

static bool print_token(void *user, int32_t token) {
    size_t *printed = user;
    printf("%s%d", (*printed)++ ? "," : "", (int)token);
    return true; /* false would stop generating */
}

int main(int argc, char **argv) {
    attn_ctx *ctx;
    if (attn_ctx_new(&(attn_ctx_config){.num_threads = 2}, &ctx) != ATTN_OK) return 1;

    attn_lm *gpt = NULL;
    attn_status st;
    if (argc > 1) {
        st = attn_lm_load(ctx, argv[1], NULL, NULL, &gpt); /* config from the file */
    } else {
        attn_lm_config cfg = {.arch = ATTN_LM_GPT2, .vocab_size = 50257, .context_length = 256,
                              .emb_dim = 64, .n_heads = 4, .n_layers = 2, .qkv_bias = true};
        attn_rng *init = NULL;
        st = attn_rng_new(ctx, 123, &init);
        if (st == ATTN_OK) st = attn_lm_new(ctx, &cfg, init, &gpt);
        attn_rng_free(init);
    }
    attn_kv_cache *cache = NULL; /* pages of 16 tokens, up to 64 per sequence */
    if (st == ATTN_OK) st = attn_lm_cache_new(gpt, 1, 64, ATTN_KV_PAGED, 16, &cache);
    if (st != ATTN_OK) {
        fprintf(stderr, "setup failed: %s\n", attn_ctx_last_error(ctx));
        return 1;
    }

    const int32_t prompt[] = {15496, 11, 314, 716}; /* "Hello, I am" in GPT-2's tokens */
    int32_t out[NEW_TOKENS];
    size_t count = 0, printed = 0;
    attn_generate_args args = {.prompt = prompt, .prompt_len = 4,
                               .max_new_tokens = NEW_TOKENS,
                               .sampling = {.temperature = 0}, /* greedy */
                               .cache = cache, .on_token = print_token, .user = &printed,
                               .out = out, .count = &count};
    st = attn_lm_generate(gpt, &args);
    printf("\n");
    if (st != ATTN_OK) {
        fprintf(stderr, "generate failed: %s\n", attn_ctx_last_error(ctx));
        return 1;
    }
    attn_kv_cache_free(cache);
    attn_lm_free(gpt);
    attn_ctx_free(ctx);
    return 0;
}
