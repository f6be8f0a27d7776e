/*
 * module_options.h — the options that choose and size an attention module,
 * shared by every command that builds one (forward, grad, trace, params).
 */
#ifndef ATTN_CLI_MODULE_OPTIONS_H
#define ATTN_CLI_MODULE_OPTIONS_H

#include "attn.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct cli_module_options {
    const char *module; /* simple|sa1|sa2|causal|mha-wrapper|mha|gpt2 */
    size_t d_in, d_out, heads, context;
    bool qkv_bias;
    double dropout;
    float scale;
    attn_mask_method mask;
} cli_module_options;

/* "simple|sa1|sa2|causal|mha-wrapper|mha|gpt2", for messages. */
extern const char cli_module_names[];
bool cli_known_module(const char *name);

/* Applies one module option to o (--qkv-bias is a flag: value unused). Returns 1 when opt is a module option
 * and value is good, 0 when opt is not a module option, and CLI_USAGE
 * (after printing the error) when value is bad. */
int cli_module_option(const char *opt, const char *value, cli_module_options *o);

/* Fills the defaults that depend on the input, (B, T, width): d_in from
 * width, d_out for simple and gpt2, context from T. Returns CLI_OK or
 * CLI_USAGE (after printing the error). */
int cli_module_resolve(cli_module_options *o, size_t width, size_t tokens);

/* Builds the module o describes, drawing its weights from rng. */
attn_status cli_build_module(attn_ctx *ctx, attn_rng *rng, const cli_module_options *o,
                             attn_module **out);

#endif /* ATTN_CLI_MODULE_OPTIONS_H */
