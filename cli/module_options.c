/* module_options.c — parse the module options and build the module. */
#include "module_options.h"

#include "cli.h"

#include <math.h>
#include <string.h>

const char cli_module_names[] = "simple|sa1|sa2|causal|mha-wrapper|mha|gpt2";

bool cli_known_module(const char *name) {
    const char *names[] = {"simple", "sa1", "sa2", "causal", "mha-wrapper", "mha", "gpt2"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i]) == 0) return true;
    return false;
}

static bool parse_mask(const char *text, attn_mask_method *out) {
    if (strcmp(text, "neg-inf") == 0) *out = ATTN_MASK_NEG_INF;
    else if (strcmp(text, "renormalize") == 0) *out = ATTN_MASK_RENORMALIZE;
    else if (strcmp(text, "none") == 0) *out = ATTN_MASK_NONE;
    else return false;
    return true;
}

int cli_module_option(const char *opt, const char *value, cli_module_options *o) {
    if (strcmp(opt, "--qkv-bias") == 0) {
        o->qkv_bias = true;
        return 1;
    }
    size_t *size_target = strcmp(opt, "--d-in") == 0      ? &o->d_in
                          : strcmp(opt, "--d-out") == 0   ? &o->d_out
                          : strcmp(opt, "--heads") == 0   ? &o->heads
                          : strcmp(opt, "--context") == 0 ? &o->context
                                                          : NULL;
    if (size_target) {
        if (!cli_parse_size(value, size_target) || *size_target == 0)
            return cli_usage_error("%s: expected a positive integer, got '%s'", opt, value);
    } else if (strcmp(opt, "--module") == 0) {
        if (!cli_known_module(value))
            return cli_usage_error("--module: expected one of %s, got '%s'", cli_module_names,
                                   value);
        o->module = value;
    } else if (strcmp(opt, "--dropout") == 0) {
        if (!cli_parse_double(value, &o->dropout) || !(o->dropout >= 0.0 && o->dropout <= 1.0))
            return cli_usage_error("--dropout: expected a probability in [0, 1], got '%s'", value);
    } else if (strcmp(opt, "--scale") == 0) {
        double scale;
        if (!cli_parse_double(value, &scale) || !isfinite(scale))
            return cli_usage_error("--scale: expected a finite number, got '%s'", value);
        o->scale = (float)scale;
    } else if (strcmp(opt, "--mask") == 0) {
        if (!parse_mask(value, &o->mask))
            return cli_usage_error("--mask: expected neg-inf, renormalize or none, got '%s'", value);
    } else {
        return 0;
    }
    return 1;
}

int cli_module_resolve(cli_module_options *o, size_t width, size_t tokens) {
    if (o->d_in == 0) o->d_in = width;
    if (o->d_in != width)
        return cli_usage_error("input width (%zu) does not match --d-in (%zu)", width, o->d_in);
    if (strcmp(o->module, "simple") == 0 || strcmp(o->module, "gpt2") == 0) {
        if (o->d_out && o->d_out != o->d_in)
            return cli_usage_error("--d-out (%zu) must equal d_in (%zu) for %s", o->d_out, o->d_in,
                                   o->module);
        o->d_out = o->d_in;
    }
    if (o->d_out == 0)
        return cli_usage_error("--d-out is required for --module %s", o->module);
    if (o->context == 0) o->context = tokens;
    return CLI_OK;
}

attn_status cli_build_module(attn_ctx *ctx, attn_rng *rng, const cli_module_options *o,
                             attn_module **out) {
    attn_status st;
    const char *name = o->module;
    if (strcmp(name, "simple") == 0) {
        attn_simple *m = NULL;
        st = attn_simple_new(ctx, &(attn_simple_config){.d_in = o->d_in}, &m);
        *out = attn_simple_module(m);
    } else if (strcmp(name, "sa1") == 0) {
        attn_sa_v1 *m = NULL;
        attn_sa_v1_config cfg = {.d_in = o->d_in, .d_out = o->d_out, .scale = o->scale};
        st = attn_sa_v1_new(ctx, &cfg, rng, &m);
        *out = attn_sa_v1_module(m);
    } else if (strcmp(name, "sa2") == 0) {
        attn_sa_v2 *m = NULL;
        attn_sa_v2_config cfg = {.d_in = o->d_in, .d_out = o->d_out, .qkv_bias = o->qkv_bias,
                                 .scale = o->scale};
        st = attn_sa_v2_new(ctx, &cfg, rng, &m);
        *out = attn_sa_v2_module(m);
    } else if (strcmp(name, "causal") == 0) {
        attn_causal *m = NULL;
        attn_causal_config cfg = {.d_in = o->d_in, .d_out = o->d_out, .context_length = o->context,
                                  .dropout = o->dropout, .qkv_bias = o->qkv_bias,
                                  .scale = o->scale, .mask = o->mask};
        st = attn_causal_new(ctx, &cfg, rng, &m);
        *out = attn_causal_module(m);
    } else if (strcmp(name, "mha-wrapper") == 0) {
        attn_mha_wrapper *m = NULL;
        attn_mha_wrapper_config cfg = {.d_in = o->d_in, .d_out = o->d_out,
                                       .context_length = o->context, .num_heads = o->heads,
                                       .dropout = o->dropout, .qkv_bias = o->qkv_bias,
                                       .scale = o->scale, .mask = o->mask};
        st = attn_mha_wrapper_new(ctx, &cfg, rng, &m);
        *out = attn_mha_wrapper_module(m);
    } else if (strcmp(name, "mha") == 0) {
        attn_mha *m = NULL;
        attn_mha_config cfg = {.d_in = o->d_in, .d_out = o->d_out, .context_length = o->context,
                               .num_heads = o->heads, .dropout = o->dropout,
                               .qkv_bias = o->qkv_bias, .scale = o->scale, .mask = o->mask};
        st = attn_mha_new(ctx, &cfg, rng, &m);
        *out = attn_mha_module(m);
    } else {
        attn_gpt2 *m = NULL;
        attn_gpt2_config cfg = {.n_embd = o->d_in, .n_head = o->heads, .block_size = o->context,
                                .dropout = o->dropout, .scale = o->scale};
        st = attn_gpt2_new(ctx, &cfg, rng, &m);
        *out = attn_gpt2_module(m);
    }
    return st;
}
