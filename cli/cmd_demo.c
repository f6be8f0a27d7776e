/*
 * cmd_demo.c — attn demo: the seeds' walk-through of chapter 3 on "Your journey
 * starts with one step", step by step, every tensor printed as PyTorch
 * prints it. Each step shows the PyTorch line it reproduces.
 */
#include "cli.h"
#include "tensor_print.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const float inputs[6 * 3] = {
    0.43f, 0.15f, 0.89f, /* Your    (x^1) */
    0.55f, 0.87f, 0.66f, /* journey (x^2) */
    0.57f, 0.85f, 0.64f, /* starts  (x^3) */
    0.22f, 0.58f, 0.33f, /* with    (x^4) */
    0.77f, 0.25f, 0.10f, /* one     (x^5) */
    0.05f, 0.80f, 0.55f, /* step    (x^6) */
};

static void section(const char *title) { printf("\n=== %s ===\n", title); }

/* Prints the PyTorch statement, then the tensor as print() shows it. */
static void show(const char *statement, const float *data, size_t ndim, const size_t *shape) {
    printf("\n>>> %s\n", statement);
    attn_print_tensor(stdout, data, ndim, shape);
}

static void show_matrix(const char *statement, const float *data, size_t rows, size_t cols) {
    show(statement, data, 2, (size_t[]){rows, cols});
}

static void show_batch(const char *statement, const float *data, size_t batch, size_t tokens,
                       size_t width) {
    show(statement, data, 3, (size_t[]){batch, tokens, width});
    printf("context_vecs.shape: ");
    attn_print_size(stdout, 3, (size_t[]){batch, tokens, width});
}

/*
 * Every step can fail (out of memory for a kernel's scratch or a module's
 * weights): the demo then stops with the library's message and exit 1,
 * since each tensor after the failed step would be printed from a step that
 * did not happen. TRY needs rc and a done: label that frees what the
 * function made.
 */
#define TRY(call)                                                                                  \
    do {                                                                                           \
        if ((call) != ATTN_OK) {                                                                   \
            rc = cli_library_error(ctx, "demo");                                                   \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

static int simplified(attn_ctx *ctx) {
    int rc = CLI_OK;
    attn_simple *m = NULL;
    section("3.3 Simplified self-attention (no trainable weights)");
    show_matrix("inputs  # Your journey starts with one step", inputs, 6, 3);
    TRY(attn_simple_new(ctx, &(attn_simple_config){.d_in = 3}, &m));
    float scores[6], weights[6], context[3], sum = 0;
    TRY(attn_simple_forward_query(m, inputs, 6, 1, scores, weights, context));
    show("print(attn_scores_2)  # query = inputs[1], 'journey'", scores, 1, (size_t[]){6});
    show("print(attn_weights_2)  # torch.softmax(attn_scores_2, dim=0)", weights, 1,
         (size_t[]){6});
    for (int i = 0; i < 6; i++) sum += weights[i];
    show("print(attn_weights_2.sum())", &sum, 0, NULL);
    show("print(context_vec_2)", context, 1, (size_t[]){3});

    float all_scores[36], all_weights[36], all_context[18];
    TRY(attn_matmul(ctx, inputs, inputs, all_scores, 6, 3, 6, true));
    show_matrix("print(attn_scores)  # inputs @ inputs.T", all_scores, 6, 6);
    TRY(attn_softmax(ctx, all_scores, all_weights, 6, 6));
    show_matrix("print(attn_weights)  # torch.softmax(attn_scores, dim=-1)", all_weights, 6, 6);
    TRY(attn_simple_forward(m, inputs, 1, 6, all_context));
    show_matrix("print(all_context_vecs)  # attn_weights @ inputs", all_context, 6, 3);
done:
    attn_simple_free(m);
    return rc;
}

static int self_attention(attn_ctx *ctx, attn_rng *rng) {
    int rc = CLI_OK;
    attn_sa_v1 *sa1 = NULL;
    attn_sa_v2 *sa2 = NULL;
    section("3.4 Self-attention with trainable weights");
    printf("torch.manual_seed(123); W_query, W_key, W_value = torch.rand(3, 2) x 3\n");
    TRY(attn_rng_manual_seed(rng, 123));
    TRY(attn_sa_v1_new(ctx, &(attn_sa_v1_config){.d_in = 3, .d_out = 2}, rng, &sa1));
    attn_module *m1 = attn_sa_v1_module(sa1);
    attn_param wq, wk, wv;
    TRY(attn_module_param(m1, "W_query", &wq));
    TRY(attn_module_param(m1, "W_key", &wk));
    TRY(attn_module_param(m1, "W_value", &wv));
    float query[12], key[12], value[12], scores[36], weights[36], context[12];
    TRY(attn_matmul(ctx, inputs, wq.data, query, 6, 3, 2, false));
    TRY(attn_matmul(ctx, inputs, wk.data, key, 6, 3, 2, false));
    TRY(attn_matmul(ctx, inputs, wv.data, value, 6, 3, 2, false));
    show_matrix("print(query)  # inputs @ W_query", query, 6, 2);
    TRY(attn_matmul(ctx, query, key, scores, 6, 2, 6, true));
    show_matrix("print(attn_scores)  # query @ key.T", scores, 6, 6);
    for (int i = 0; i < 36; i++) scores[i] /= sqrtf(2.0f);
    TRY(attn_softmax(ctx, scores, weights, 6, 6));
    show_matrix("print(attn_weights)  # softmax(attn_scores / d_k**0.5)", weights, 6, 6);
    TRY(attn_matmul(ctx, weights, value, context, 6, 6, 2, false));
    show_matrix("print(context_vec)  # attn_weights @ value", context, 6, 2);
    TRY(attn_sa_v1_forward(sa1, inputs, 1, 6, context));
    show_matrix("torch.manual_seed(123); print(SelfAttention_v1(3, 2)(inputs))", context, 6, 2);

    TRY(attn_rng_manual_seed(rng, 789));
    TRY(attn_sa_v2_new(ctx, &(attn_sa_v2_config){.d_in = 3, .d_out = 2}, rng, &sa2));
    TRY(attn_sa_v2_forward(sa2, inputs, 1, 6, context));
    show_matrix("torch.manual_seed(789); print(SelfAttention_v2(3, 2)(inputs))", context, 6, 2);

    section("3.5 Hiding future words with causal attention");
    attn_module *m2 = attn_sa_v2_module(sa2);
    TRY(attn_module_param(m2, "W_query.weight", &wq));
    TRY(attn_module_param(m2, "W_key.weight", &wk));
    float queries[12], keys[12], raw_scores[36], mask[36], masked[36];
    TRY(attn_linear(ctx, inputs, wq.data, NULL, queries, 6, 3, 2));
    TRY(attn_linear(ctx, inputs, wk.data, NULL, keys, 6, 3, 2));
    TRY(attn_matmul(ctx, queries, keys, raw_scores, 6, 2, 6, true));
    for (int i = 0; i < 36; i++) scores[i] = raw_scores[i] / sqrtf(2.0f);
    TRY(attn_softmax(ctx, scores, weights, 6, 6));
    show_matrix("print(attn_weights)  # of sa_v2, before masking", weights, 6, 6);
    for (int i = 0; i < 36; i++) mask[i] = (i % 6) <= (i / 6) ? 1.0f : 0.0f;
    show_matrix("print(mask_simple)  # torch.tril(torch.ones(6, 6))", mask, 6, 6);
    for (int i = 0; i < 36; i++) masked[i] = weights[i] * mask[i];
    show_matrix("print(masked_simple)  # attn_weights * mask_simple", masked, 6, 6);
    TRY(attn_mask_causal_renormalize(ctx, masked, 6));
    show_matrix("print(masked_simple_norm)  # masked_simple / row_sums", masked, 6, 6);
    memcpy(masked, raw_scores, sizeof masked);
    TRY(attn_mask_causal_neg_inf(ctx, masked, 6));
    show_matrix("print(masked)  # attn_scores.masked_fill(mask.bool(), -torch.inf)", masked, 6, 6);
    for (int i = 0; i < 36; i++) masked[i] /= sqrtf(2.0f);
    TRY(attn_softmax(ctx, masked, weights, 6, 6));
    show_matrix("print(attn_weights)  # softmax(masked / d_k**0.5): the same, in one pass", weights,
                6, 6);

    printf("\nDropout: the seeds' PyTorch drew its Bernoulli masks through MKL (MCG31m1);\n"
           "attn reproduces that stream here (ATTN_BERNOULLI_MKL_MCG31).\n");
    TRY(attn_rng_set_bernoulli_method(rng, ATTN_BERNOULLI_MKL_MCG31));
    float ones[36], dropped[36];
    for (int i = 0; i < 36; i++) ones[i] = 1.0f;
    TRY(attn_rng_manual_seed(rng, 123));
    TRY(attn_rng_dropout(rng, ones, dropped, 36, 0.5, NULL));
    show_matrix("torch.manual_seed(123); print(torch.nn.Dropout(0.5)(torch.ones(6, 6)))", dropped,
                6, 6);
    TRY(attn_rng_manual_seed(rng, 123));
    TRY(attn_rng_dropout(rng, weights, dropped, 36, 0.5, NULL));
    show_matrix("torch.manual_seed(123); print(dropout(attn_weights))", dropped, 6, 6);
    TRY(attn_rng_set_bernoulli_method(rng, ATTN_BERNOULLI_MT19937));
done:
    attn_sa_v1_free(sa1);
    attn_sa_v2_free(sa2);
    return rc;
}

static int causal_and_multi_head(attn_ctx *ctx, attn_rng *rng) {
    int rc = CLI_OK;
    attn_causal *ca = NULL;
    attn_mha_wrapper *mw = NULL;
    attn_mha *mha = NULL;
    float batch[36], y[48];
    memcpy(batch, inputs, sizeof inputs);
    memcpy(batch + 18, inputs, sizeof inputs);
    printf("\n>>> batch = torch.stack((inputs, inputs), dim=0); print(batch.shape)\n");
    attn_print_size(stdout, 3, (size_t[]){2, 6, 3});

    TRY(attn_rng_manual_seed(rng, 123));
    attn_causal_config ca_cfg = {.d_in = 3, .d_out = 2, .context_length = 6, .dropout = 0.0};
    TRY(attn_causal_new(ctx, &ca_cfg, rng, &ca));
    TRY(attn_causal_forward(ca, batch, 2, 6, y, NULL));
    show_batch("torch.manual_seed(123); print(CausalAttention(3, 2, 6, 0.0)(batch))", y, 2, 6, 2);

    section("3.6 Multi-head attention");
    TRY(attn_rng_manual_seed(rng, 123));
    attn_mha_wrapper_config mw_cfg = {.d_in = 3, .d_out = 2, .context_length = 6, .num_heads = 2};
    TRY(attn_mha_wrapper_new(ctx, &mw_cfg, rng, &mw));
    TRY(attn_mha_wrapper_forward(mw, batch, 2, 6, y, NULL));
    show_batch("torch.manual_seed(123); print(MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=2)(batch))",
               y, 2, 6, 4);

    attn_mha_config cfg = {.d_in = 3, .d_out = 2, .context_length = 6, .num_heads = 2,
                           .scale = 1.0f / sqrtf(2.0f)};
    TRY(attn_rng_manual_seed(rng, 123));
    TRY(attn_mha_new(ctx, &cfg, rng, &mha));
    TRY(attn_mha_forward(mha, batch, 2, 6, y, NULL));
    show_batch("torch.manual_seed(123); print(MultiHeadAttention(3, 2, 6, 0.0, num_heads=2)(batch))",
               y, 2, 6, 2);
    attn_mha_free(mha);
    mha = NULL;
    printf("\nSeed error: that MultiHeadAttention divides by `key.shape[-1]**0.5`, the global\n"
           "`key` of section 3.4 (width 2), not the head's keys (head_dim 1). The output\n"
           "above reproduces the seed with scale 1/sqrt(2); with the right scale,\n"
           "1/sqrt(head_dim) = 1 (attn's default):\n");
    cfg.scale = 0.0f;
    TRY(attn_rng_manual_seed(rng, 123));
    TRY(attn_mha_new(ctx, &cfg, rng, &mha));
    TRY(attn_mha_forward(mha, batch, 2, 6, y, NULL));
    show_batch("print(mha(batch))  # scaled by keys.shape[-1]**0.5", y, 2, 6, 2);
    attn_mha_free(mha);
    mha = NULL;

    static const float a[24] = {0.2745f, 0.6584f, 0.2775f, 0.8573f, 0.8993f, 0.0390f,
                                0.9268f, 0.7388f, 0.7179f, 0.7058f, 0.9156f, 0.4340f,
                                0.0772f, 0.3565f, 0.1479f, 0.5331f, 0.4066f, 0.2318f,
                                0.4545f, 0.9737f, 0.4606f, 0.5159f, 0.4220f, 0.5786f};
    float aat[18];
    for (int head = 0; head < 2; head++)
        TRY(attn_matmul(ctx, a + 12 * head, a + 12 * head, aat + 9 * head, 3, 4, 3, true));
    show("print(a @ a.transpose(2, 3))  # a: (1, 2, 3, 4)", aat, 4, (size_t[]){1, 2, 3, 3});
    show_matrix("print(first_head)  # a[0, 0, :, :]", a, 3, 4);
    show_matrix("print(first_head @ first_head.T)", aat, 3, 3);
    show_matrix("print(second_head)  # a[0, 1, :, :]", a + 12, 3, 4);
    show_matrix("print(second_head @ second_head.T)", aat + 9, 3, 3);

    attn_mha_config big = {.d_in = 768, .d_out = 768, .context_length = 1024, .num_heads = 12,
                           .dropout = 0.1};
    TRY(attn_mha_new(ctx, &big, rng, &mha));
    printf("\n>>> sum(p.numel() for p in MultiHeadAttention(768, 768, 1024, 0.1, 12).parameters())\n"
           "%zu\n",
           attn_module_num_scalars(attn_mha_module(mha)));
    printf("Seed error: the guide says 2,359,296, forgetting out_proj's 768 biases.\n");
done:
    attn_causal_free(ca);
    attn_mha_wrapper_free(mw);
    attn_mha_free(mha);
    return rc;
}

static int parse_demo(int argc, char **argv) {
    if (argc > 1) return cli_usage_error("demo: unexpected argument '%s'", argv[1]);
    return CLI_OK;
}

static int run_demo(int argc, char **argv) {
    int rc = parse_demo(argc, argv);
    if (rc != CLI_OK) return rc;
    attn_ctx *ctx;
    attn_rng *rng;
    if ((rc = cli_ctx_new(NULL, &ctx)) != CLI_OK) return rc;
    if (attn_rng_new(ctx, 123, &rng) != ATTN_OK) {
        attn_ctx_free(ctx);
        return cli_failure("cannot create an rng");
    }
    printf("attn %s: chapter 3 of the seeds, computed in C\n", attn_version());
    rc = simplified(ctx);
    if (rc == CLI_OK) rc = self_attention(ctx, rng);
    if (rc == CLI_OK) rc = causal_and_multi_head(ctx, rng);
    attn_rng_free(rng);
    attn_ctx_free(ctx);
    return rc;
}

static const char *const no_options[] = {NULL};

const cli_command cli_demo_command = {
    .name = "demo",
    .summary = "the seeds' walk-through on \"Your journey starts with one step\"",
    .help = "usage: attn demo\n\nThe seeds' chapter 3 walk-through, every tensor printed as "
            "PyTorch does.\n",
    .value_options = no_options,
    .parse = parse_demo,
    .run = run_demo,
};
