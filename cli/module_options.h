/*
 * module_options.h — the options that choose and size an attention module,
 * shared by every command that builds one (forward, grad, trace, params).
 */
#ifndef ATTN_CLI_MODULE_OPTIONS_H
#define ATTN_CLI_MODULE_OPTIONS_H

#include "attn.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Bits of cli_module_options.given: which options the command line set. */
enum {
    CLI_GIVEN_D_IN = 1u << 0,
    CLI_GIVEN_D_OUT = 1u << 1,
    CLI_GIVEN_HEADS = 1u << 2,
    CLI_GIVEN_CONTEXT = 1u << 3,
    CLI_GIVEN_QKV_BIAS = 1u << 4,
    CLI_GIVEN_DROPOUT = 1u << 5,
    CLI_GIVEN_TRAIN = 1u << 6,
    CLI_GIVEN_SCALE = 1u << 7,
    CLI_GIVEN_MASK = 1u << 8,
    CLI_GIVEN_KV_GROUPS = 1u << 9,
    CLI_GIVEN_LATENT_DIM = 1u << 10,
    CLI_GIVEN_WINDOW = 1u << 11,
};

typedef struct cli_module_options {
    const char *module; /* simple|sa1|sa2|causal|mha-wrapper|mha|gpt2|gqa|mla|swa */
    size_t d_in, d_out, heads, context;
    size_t kv_groups;  /* gqa's num_kv_groups; 0: --heads (no sharing) */
    size_t latent_dim; /* mla's; 0: the book's max(16, d_out / 8) */
    size_t window;     /* swa's sliding_window_size; 0: None (plain causal) */
    bool qkv_bias;
    double dropout;
    double scale; /* 0: the module's default, 1/sqrt(head_dim) */
    attn_mask_method mask;
    unsigned given; /* CLI_GIVEN_* (--train too, which cli_run_options holds) */
} cli_module_options;

/* The kind a --module name names (attn_module_kind_from_name); false for
 * NULL or a name that names none. */
bool cli_module_kind(const char *name, attn_module_kind *out);
bool cli_known_module(const char *name);
/* Whether the module kind takes a context_length (its forward refuses longer
 * sequences). */
bool cli_module_has_context(attn_module_kind kind);
/* Refuses an unknown module name given to option, listing the kinds'
 * names: returns CLI_USAGE after printing the error. */
int cli_unknown_module(const char *option, const char *value);

/* The module options that take a value ("--module", "--d-in", ...),
 * NULL-terminated, for a command's list of value options. */
#define CLI_MODULE_VALUE_OPTIONS                                                              \
    "--module", "--d-in", "--d-out", "--heads", "--context", "--dropout", "--scale", "--mask", \
        "--kv-groups", "--latent-dim", "--window"

/* True for the module options that take no value (--qkv-bias). */
bool cli_module_flag(const char *opt);

/* Applies one module option to o (value is unused for flags). Returns 1
 * when opt is a module option and value is good, 0 when opt is not a
 * module option, and CLI_USAGE (after printing the error) when value is
 * bad. */
int cli_module_option(const char *opt, const char *value, cli_module_options *o);

/* Refuses an option given on the command line that the chosen module does
 * not take ("--heads does not apply to --module sa1 ..."): CLI_OK or
 * CLI_USAGE (after printing the error). cli_module_resolve calls it too. */
int cli_module_check(const cli_module_options *o);

/* Fills the defaults that depend on the input, (B, T, width): d_in from
 * width, d_out for simple and gpt2, context from T. Returns CLI_OK or
 * CLI_USAGE (after printing the error). */
int cli_module_resolve(cli_module_options *o, size_t width, size_t tokens);

/* Builds the module o describes, drawing its weights from rng. */
attn_status cli_build_module(attn_ctx *ctx, attn_rng *rng, const cli_module_options *o,
                             attn_module **out);

/* The options of a command that runs a module on an .npy input (forward,
 * grad): the module options, --input, --seed, --threads, --bernoulli,
 * --kernels and --train. */
typedef struct cli_run_options {
    cli_module_options module;
    const char *input;
    uint64_t seed;
    size_t threads;
    attn_bernoulli_method bernoulli;
    attn_kernels kernels;
    bool train;
} cli_run_options;

/* The defaults: seed 123, all online CPUs, mt19937, auto kernels, eval mode. */
cli_run_options cli_run_defaults(void);
/* The help lines of those options, for a command's --help. */
extern const char cli_run_options_help[];
void cli_print_run_options_help(FILE *out);
/* The run options that take a value (the module's and --input, --seed,
 * --threads, --bernoulli, --kernels), for a command's list of value options. */
#define CLI_RUN_VALUE_OPTIONS                                                                 \
    CLI_MODULE_VALUE_OPTIONS, "--input", "--seed", "--threads", "--bernoulli", "--kernels"
/* A command's own options: value-taking ones and flags (NULL-terminated
 * lists, either may be NULL), handed to take(user, opt, value-or-NULL),
 * which returns CLI_OK or CLI_USAGE after printing the error. */
typedef struct cli_extra_options {
    const char *const *options;
    const char *const *flags;
    int (*take)(void *user, const char *opt, const char *value);
    void *user;
} cli_extra_options;
/* Parses argv[1..] into o and the command's own options, then refuses
 * options the module does not take (cli_module_check). Returns CLI_OK or
 * CLI_USAGE (after printing). */
int cli_parse_run_options(int argc, char **argv, cli_run_options *o, const cli_extra_options *extra);

/* A module built and ready to run on its input. */
typedef struct cli_run {
    attn_ctx *ctx;
    attn_rng *rng; /* the module's init rng, then its dropout draws */
    attn_module *module;
    attn_npy x;    /* (B, T, d_in) or (T, d_in) */
    size_t batch, tokens;
} cli_run;

/* Reads the input, sizes and builds the module, sets train/eval. Returns
 * CLI_OK, CLI_USAGE or CLI_FAILED (after printing); close run either way. */
int cli_run_open(cli_run *run, cli_run_options *o);
void cli_run_close(cli_run *run);
/* The shape (B, T, width), or (T, width) when the input had rank 2. */
size_t cli_run_shape(const cli_run *run, size_t width, size_t shape[3]);

#endif /* ATTN_CLI_MODULE_OPTIONS_H */
