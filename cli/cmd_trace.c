/* cmd_trace.c — attn trace: the shape of every intermediate of a forward. */
#include "cli.h"
#include "module_options.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char trace_help[] =
    "usage: attn trace [--preset NAME] [--module mha|gpt2|causal|mha-wrapper|sa2|sa1|simple|\n"
    "                                            gqa|mla|swa]\n"
    "                  [--batch N] [--tokens N] [--seed S]\n"
    "\n"
    "Runs one forward pass of the module at the preset's size on random input\n"
    "and prints the shape of every intermediate tensor, in order, like the\n"
    "seeds' call-flow tables. Defaults: --preset gpt2-small --module mha\n"
    "--batch 2 --tokens 6 --seed 123.\n"
    "\n"
    "Shapes need no data: the forward runs on one sequence (batch elements\n"
    "are independent, so the steps are the same), keeps nothing for the trace,\n"
    "and every shape is printed with the batch dimension N. Nothing is printed\n"
    "unless the whole forward succeeds.\n";

#define TRACE_TEXT 64
#define TRACE_MAX_DIMS 8

typedef struct trace_row {
    char module[TRACE_TEXT], name[TRACE_TEXT];
    size_t ndim;
    size_t shape[TRACE_MAX_DIMS];
} trace_row;

/* The rows collected during the forward, printed only once it succeeded. */
typedef struct trace_rows {
    trace_row *rows;
    size_t count, capacity;
    size_t batch; /* printed as the first dimension */
    bool out_of_memory;
} trace_rows;

static void add_row(void *user, const char *module, const char *name, size_t ndim,
                    const size_t *shape, const float *data) {
    (void)data; /* shapes only */
    trace_rows *t = user;
    if (t->out_of_memory) return;
    if (t->count == t->capacity) {
        size_t capacity = t->capacity ? 2 * t->capacity : 32;
        trace_row *grown = realloc(t->rows, capacity * sizeof *grown);
        if (!grown) {
            t->out_of_memory = true;
            return;
        }
        t->rows = grown;
        t->capacity = capacity;
    }
    trace_row *row = &t->rows[t->count++];
    snprintf(row->module, sizeof row->module, "%s", module);
    snprintf(row->name, sizeof row->name, "%s", name);
    row->ndim = ndim < TRACE_MAX_DIMS ? ndim : TRACE_MAX_DIMS;
    for (size_t i = 0; i < row->ndim; i++) row->shape[i] = shape[i];
    /* The forward ran on one sequence; every traced shape starts with the
     * batch (attn.h), which is the batch asked for. */
    if (row->ndim > 0 && row->shape[0] == 1) row->shape[0] = t->batch;
}

static void print_rows(const trace_rows *t) {
    printf("%3s  %-22s %-34s %s\n", "#", "module", "tensor", "shape");
    for (size_t r = 0; r < t->count; r++) {
        const trace_row *row = &t->rows[r];
        printf("%3zu  %-22s %-34s [", r + 1, row->module, row->name);
        for (size_t i = 0; i < row->ndim; i++) printf(i ? ", %zu" : "%zu", row->shape[i]);
        printf("]\n");
    }
}

typedef struct trace_args {
    const char *preset, *module;
    size_t batch, tokens;
    uint64_t seed;
} trace_args;

static const char *const trace_options[] = {"--preset", "--module", "--batch", "--tokens",
                                            "--seed", NULL};

static int parse_args(int argc, char **argv, trace_args *a) {
    *a = (trace_args){.preset = "gpt2-small", .module = "mha", .batch = 2, .tokens = 6,
                      .seed = 123};
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i], *value = cli_option_value(argc, argv, &i, trace_options);
        if (!value) return CLI_USAGE;
        if (strcmp(opt, "--preset") == 0) a->preset = value;
        else if (strcmp(opt, "--module") == 0) a->module = value;
        else if (strcmp(opt, "--batch") == 0) {
            if (!cli_parse_size(value, &a->batch) || a->batch == 0)
                return cli_usage_error("--batch: expected a positive integer, got '%s'", value);
        } else if (strcmp(opt, "--tokens") == 0) {
            if (!cli_parse_size(value, &a->tokens) || a->tokens == 0)
                return cli_usage_error("--tokens: expected a positive integer, got '%s'", value);
        } else if (strcmp(opt, "--seed") == 0) {
            if (!cli_parse_u64(value, &a->seed))
                return cli_usage_error("--seed: expected a non-negative integer, got '%s'", value);
        }
    }
    if (!cli_known_module(a->module)) return cli_unknown_module("--module", a->module);
    return CLI_OK;
}

static int parse_trace(int argc, char **argv) {
    trace_args a;
    return parse_args(argc, argv, &a);
}

static int run_trace(int argc, char **argv) {
    trace_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc != CLI_OK) return rc;
    trace_rows rows = {.batch = a.batch};
    attn_ctx *ctx;
    attn_ctx_config ctx_cfg = {.num_threads = cli_default_threads(), .trace = add_row,
                               .trace_user = &rows, .trace_shapes_only = true};
    if ((rc = cli_ctx_new(&ctx_cfg, &ctx)) != CLI_OK) return rc;
    attn_gpt2_preset preset;
    attn_rng *rng = NULL;
    attn_module *m = NULL;
    float *x = NULL, *y = NULL;
    if (attn_gpt2_preset_find(ctx, a.preset, &preset) != ATTN_OK) {
        rc = cli_usage_error("--preset: %s", attn_ctx_last_error(ctx));
        goto done;
    }
    cli_module_options o = {.module = a.module, .d_in = preset.n_embd, .d_out = preset.n_embd,
                            .heads = preset.n_head, .context = preset.context_length,
                            .qkv_bias = preset.qkv_bias};
    /* The wrapper's d_out is per head, so its concatenation is n_embd wide. */
    attn_module_kind kind;
    if (cli_module_kind(a.module, &kind) && kind == ATTN_MODULE_MHA_WRAPPER)
        o.d_out = preset.n_embd / preset.n_head;
    if (attn_rng_new(ctx, a.seed, &rng) != ATTN_OK ||
        cli_build_module(ctx, rng, &o, &m) != ATTN_OK ||
        attn_module_set_training(m, false) != ATTN_OK) {
        rc = cli_library_error(ctx, "trace");
        goto done;
    }
    size_t d_in = attn_module_d_in(m), d_out = attn_module_d_out(m);
    /* The shapes printed are those of the whole batch: refuse one whose
     * tensors could not exist. */
    size_t rows_all = a.batch * a.tokens;
    if (rows_all / a.batch != a.tokens ||
        rows_all > (size_t)-1 / sizeof(float) / (d_in + d_out)) {
        rc = cli_usage_error("--batch %zu x --tokens %zu x %zu floats overflows size_t", a.batch,
                             a.tokens, d_in + d_out);
        goto done;
    }
    /* the forward would refuse it too, after the inputs were drawn */
    if (cli_module_kind(a.module, &kind) && cli_module_has_context(kind) &&
        a.tokens > preset.context_length) {
        rc = cli_failure("trace: %s forward: sequence length (%zu) exceeds context_length (%zu)",
                         attn_module_class_name(m), a.tokens, preset.context_length);
        goto done;
    }
    x = calloc(a.tokens, d_in * sizeof *x);
    y = calloc(a.tokens, d_out * sizeof *y);
    if (!x || !y) {
        rc = cli_failure("out of memory for %zu tokens", a.tokens);
        goto done;
    }
    if (attn_rng_rand(rng, x, a.tokens * d_in) != ATTN_OK) {
        rc = cli_library_error(ctx, "trace");
        goto done;
    }
    size_t in_shape[3] = {1, a.tokens, d_in};
    add_row(&rows, attn_module_class_name(m), "x (input)", 3, in_shape, NULL);
    if (attn_module_forward(m, x, 1, a.tokens, y, NULL) != ATTN_OK) {
        rc = cli_library_error(ctx, "trace");
        goto done;
    }
    if (rows.out_of_memory) {
        rc = cli_failure("out of memory for the trace");
        goto done;
    }
    printf("%s (%s: n_embd %zu, n_head %zu, head_dim %zu), batch %zu, tokens %zu\n\n",
           attn_module_class_name(m), preset.name, preset.n_embd, preset.n_head,
           preset.n_embd / preset.n_head, a.batch, a.tokens);
    print_rows(&rows);
done:
    free(rows.rows);
    free(x);
    free(y);
    attn_module_free(m);
    attn_rng_free(rng);
    attn_ctx_free(ctx);
    return rc;
}

const cli_command cli_trace_command = {
    .name = "trace",
    .summary = "the shape of every intermediate of a module's forward pass",
    .help = trace_help,
    .value_options = trace_options,
    .parse = parse_trace,
    .run = run_trace,
};
