/* cmd_params.c — attn params: parameter counts of a GPT-2 preset. */
#include "cli.h"
#include "module_options.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Formats n as "1,234,567" into buf (at least 32 bytes). */
static const char *grouped(size_t n, char *buf) {
    char digits[24];
    int len = snprintf(digits, sizeof digits, "%zu", n), out = 0;
    for (int i = 0; i < len; i++) {
        buf[out++] = digits[i];
        if ((len - i - 1) % 3 == 0 && i != len - 1) buf[out++] = ',';
    }
    buf[out] = '\0';
    return buf;
}

static const char params_help[] =
    "usage: attn params --preset NAME [--module mha|gpt2] [--qkv-bias]\n"
    "\n"
    "Parameter counts per tensor and in total of one attention module at a\n"
    "GPT-2 preset's size (gpt2-small, gpt2-medium, gpt2-large, gpt2-xl; 'all'\n"
    "for every one), and of the whole GPT-2 model of that size. mha is the\n"
    "seeds' MultiHeadAttention (qkv_bias off unless --qkv-bias); gpt2 is\n"
    "GPT-2's fused CausalSelfAttention (default).\n";

static int print_params(attn_ctx *ctx, const attn_gpt2_preset *p, const char *module,
                        bool qkv_bias) {
    attn_rng *rng = NULL;
    attn_module *m = NULL;
    cli_module_options o = {.module = module, .d_in = p->n_embd, .d_out = p->n_embd,
                        .heads = p->n_head, .context = p->context_length, .qkv_bias = qkv_bias};
    size_t model_total;
    if (attn_rng_new(ctx, 0, &rng) != ATTN_OK || cli_build_module(ctx, rng, &o, &m) != ATTN_OK ||
        attn_gpt2_preset_model_params(ctx, p, &model_total) != ATTN_OK) {
        attn_rng_free(rng);
        return cli_library_error(ctx, "params");
    }
    printf("%s: n_embd %zu, n_head %zu (head_dim %zu), n_layer %zu, context %zu\n", p->name,
           p->n_embd, p->n_head, p->n_embd / p->n_head, p->n_layer, p->context_length);
    printf("%s:\n", attn_module_class_name(m));
    int rc = CLI_OK;
    for (size_t i = 0; i < attn_module_param_count(m); i++) {
        attn_param param;
        if (attn_module_param_at(m, i, &param) != ATTN_OK) {
            rc = cli_library_error(ctx, "params");
            break;
        }
        char shape[48], count[32];
        if (param.ndim == 1) snprintf(shape, sizeof shape, "[%zu]", param.shape[0]);
        else snprintf(shape, sizeof shape, "[%zu, %zu]", param.shape[0], param.shape[1]);
        printf("  %-18s %-14s %13s\n", param.name, shape, grouped(param.numel, count));
    }
    if (rc == CLI_OK) {
        char count[32];
        printf("  %-33s %13s\n", "total", grouped(attn_module_num_scalars(m), count));
        printf("whole GPT-2 model (%zu layers, tied embeddings): %s\n", p->n_layer,
               grouped(model_total, count));
    }
    attn_module_free(m);
    attn_rng_free(rng);
    return rc;
}

typedef struct params_args {
    const char *preset, *module;
    bool qkv_bias;
} params_args;

static const char *const params_options[] = {"--preset", "--module", NULL};

static int parse_args(int argc, char **argv, params_args *a) {
    *a = (params_args){.module = "gpt2"};
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i];
        if (strcmp(opt, "--qkv-bias") == 0) {
            a->qkv_bias = true;
            continue;
        }
        const char *value = cli_option_value(argc, argv, &i, params_options);
        if (!value) return CLI_USAGE;
        if (strcmp(opt, "--preset") == 0) a->preset = value;
        else a->module = value;
    }
    if (!a->preset) return cli_usage_error("params: --preset is required (try 'attn params --help')");
    attn_module_kind kind;
    if (!cli_module_kind(a->module, &kind) ||
        (kind != ATTN_MODULE_MHA && kind != ATTN_MODULE_GPT2))
        return cli_usage_error("--module: expected mha or gpt2, got '%s'", a->module);
    cli_module_options o = {.module = a->module, .given = a->qkv_bias ? CLI_GIVEN_QKV_BIAS : 0};
    return cli_module_check(&o);
}

static int parse_params(int argc, char **argv) {
    params_args a;
    return parse_args(argc, argv, &a);
}

static int run_params(int argc, char **argv) {
    params_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc != CLI_OK) return rc;
    attn_ctx *ctx;
    if ((rc = cli_ctx_new(NULL, &ctx)) != CLI_OK) return rc;
    if (strcmp(a.preset, "all") == 0) {
        for (size_t i = 0; i < attn_gpt2_preset_count() && rc == CLI_OK; i++) {
            attn_gpt2_preset p;
            /* the preset calls take no ctx: the status is all there is */
            attn_status st = attn_gpt2_preset_at(i, &p);
            if (st != ATTN_OK) {
                rc = cli_failure("params: GPT-2 preset %zu of %zu: %s", i,
                                 attn_gpt2_preset_count(), attn_status_name(st));
                break;
            }
            if (i) putchar('\n');
            rc = print_params(ctx, &p, a.module, a.qkv_bias);
        }
    } else {
        attn_gpt2_preset p;
        if (attn_gpt2_preset_find(ctx, a.preset, &p) != ATTN_OK)
            rc = cli_usage_error("--preset: %s", attn_ctx_last_error(ctx));
        else
            rc = print_params(ctx, &p, a.module, a.qkv_bias);
    }
    attn_ctx_free(ctx);
    return rc;
}

const cli_command cli_params_command = {
    .name = "params",
    .summary = "parameter counts per tensor and in total for a GPT-2 preset",
    .help = params_help,
    .value_options = params_options,
    .parse = parse_params,
    .run = run_params,
};
