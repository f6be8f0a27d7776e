/* cmd_grad.c — attn grad: forward, then backward from a given dL/dy, every
 * gradient written as .npy, to check against any autograd. */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"
#include "context_parallel.h"
#include "module_options.h"
#include "outputs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char grad_help_head[] =
    "usage: attn grad --module simple|sa1|sa2|causal|mha-wrapper|mha|gpt2|\n"
    "                          gqa|mla|swa\n"
    "                 --input x.npy --grad-output dy.npy --out DIR [--seed S]\n"
    "                 [--d-in N] [--d-out N] [--heads N] [--context N] [--qkv-bias]\n"
    "                 [--dropout P --train] [--scale S] [--mask neg-inf|renormalize|none]\n"
    "                 [--kv-groups N (gqa)] [--latent-dim N (mla)] [--window W (swa)]\n"
    "                 [--bernoulli mt19937|mkl|philox] [--threads N]\n"
    "                 [--kernels auto|reference|portable|avx2|avx512]\n"
    "                 [--context-parallel ring|zigzag|ulysses (under mpirun)]\n"
    "\n"
    "Builds the module as 'attn forward' does (same options, same weights), runs\n"
    "its forward on x (in training mode with --train, drawing dropout), then its\n"
    "backward with dy = dL/dy, shaped as the output. Writes into DIR (created if\n"
    "missing):\n"
    "  output.npy          the forward's output y\n"
    "  input.npy           dL/dx, shaped as the input\n"
    "  <name>.npy          dL/dW for every parameter, by its PyTorch state_dict\n"
    "                      name: W_query.weight.npy, heads.0.W_key.bias.npy,\n"
    "                      c_attn.weight.npy, ...\n"
    "With PyTorch: y = module(x); y.backward(dy) gives x.grad and each p.grad.\n";

typedef struct grad_paths {
    const char *grad_output, *out_dir;
    const char *context_parallel; /* NULL: one process */
} grad_paths;

static int take_path(void *user, const char *opt, const char *value) {
    grad_paths *p = user;
    if (strcmp(opt, "--context-parallel") == 0) {
        p->context_parallel = value;
        return cli_context_parallel_check(value);
    }
    if (strcmp(opt, "--grad-output") == 0) p->grad_output = value;
    else p->out_dir = value;
    return CLI_OK;
}

static bool same_shape(const attn_npy *a, size_t rank, const size_t *shape) {
    if (a->ndim != rank) return false;
    for (size_t i = 0; i < rank; i++)
        if (a->shape[i] != shape[i]) return false;
    return true;
}

static void format_shape(char *buf, size_t size, size_t rank, const size_t *shape) {
    size_t used = (size_t)snprintf(buf, size, "(");
    for (size_t i = 0; i < rank && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, i ? ", %zu" : "%zu", shape[i]);
    if (used < size) snprintf(buf + used, size - used, ")");
}

static const char *const grad_options[] = {CLI_RUN_VALUE_OPTIONS, "--grad-output", "--out",
                                           "--context-parallel", NULL};

static void print_more_help(FILE *out) {
    cli_print_run_options_help(out);
    fputs(CLI_CONTEXT_PARALLEL_HELP, out);
}

typedef struct grad_args {
    cli_run_options run;
    grad_paths paths;
} grad_args;

static int parse_args(int argc, char **argv, grad_args *a) {
    *a = (grad_args){.run = cli_run_defaults()};
    static const char *const own[] = {"--grad-output", "--out", "--context-parallel", NULL};
    cli_extra_options extra = {.options = own, .take = take_path, .user = &a->paths};
    if (cli_parse_run_options(argc, argv, &a->run, &extra) != CLI_OK) return CLI_USAGE;
    if (!a->run.module.module)
        return cli_usage_error("grad: --module is required (try 'attn grad --help')");
    if (!a->run.input || !a->paths.grad_output || !a->paths.out_dir)
        return cli_usage_error("grad: --input, --grad-output and --out are required");
    return CLI_OK;
}

static int parse_grad(int argc, char **argv) {
    grad_args a;
    return parse_args(argc, argv, &a);
}

static int run_grad(int argc, char **argv) {
    grad_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc != CLI_OK) return rc;
    cli_run_options o = a.run;
    grad_paths paths = a.paths;
    /* under mpirun rank 0 says it, once (context_parallel.c) */
    if (o.module.dropout > 0.0 && !o.train && !paths.context_parallel)
        fprintf(stderr, "attn: note: --dropout has no effect without --train (eval mode)\n");
    if (paths.context_parallel) {
#ifdef ATTN_HAVE_MPI
        return cli_cp_grad(&o, paths.context_parallel, paths.grad_output, paths.out_dir);
#else
        return cli_usage_error("--context-parallel: this build has no MPI (install Open MPI, "
                               "then configure with -DATTN_MPI=ON)");
#endif
    }

    cli_run run;
    cli_outputs out;
    cli_outputs_init(&out, NULL);
    attn_npy dy = {0};
    float *y = NULL, *dx = NULL;
    size_t *at = NULL;
    rc = cli_run_open(&run, &o);
    if (rc != CLI_OK) goto done;
    attn_module *m = run.module;
    /* DIR/output.npy, DIR/input.npy, then one file per parameter. */
    size_t params = attn_module_param_count(m);
    at = malloc((params + 2) * sizeof *at);
    if (!at) {
        rc = cli_failure("out of memory for %zu outputs", params + 2);
        goto done;
    }
    cli_outputs_init(&out, run.ctx);
    const char *dir = paths.out_dir;
    if ((rc = cli_outputs_dir(&out, "--out", dir)) != CLI_OK ||
        (rc = cli_outputs_add_in_dir(&out, "--out", dir, "output", &at[0])) != CLI_OK ||
        (rc = cli_outputs_add_in_dir(&out, "--out", dir, "input", &at[1])) != CLI_OK)
        goto done;
    for (size_t i = 0; i < params; i++) {
        attn_param p;
        if (attn_module_param_at(m, i, &p) != ATTN_OK) {
            rc = cli_library_error(run.ctx, "grad");
            goto done;
        }
        if ((rc = cli_outputs_add_in_dir(&out, "--out", dir, p.name, &at[2 + i])) != CLI_OK)
            goto done;
    }
    if ((rc = cli_outputs_not_input(&out, "--input", o.input)) != CLI_OK ||
        (rc = cli_outputs_not_input(&out, "--grad-output", paths.grad_output)) != CLI_OK)
        goto done;
    size_t d_in = attn_module_d_in(m), d_out = attn_module_d_out(m);
    size_t rows = run.batch * run.tokens; /* overflow is checked by the forward below */
    y = calloc(rows, d_out * sizeof *y);
    dx = calloc(rows, d_in * sizeof *dx);
    if (!y || !dx) {
        rc = cli_failure("out of memory for %zu x %zu activations", rows, d_out + d_in);
        goto done;
    }
    size_t y_shape[3], x_shape[3];
    size_t rank = cli_run_shape(&run, d_out, y_shape);
    cli_run_shape(&run, d_in, x_shape);
    if (attn_npy_read(run.ctx, paths.grad_output, &dy) != ATTN_OK) {
        rc = cli_library_error(run.ctx, "--grad-output");
        goto done;
    }
    if (!same_shape(&dy, rank, y_shape)) {
        char want[96], got[96];
        format_shape(want, sizeof want, rank, y_shape);
        format_shape(got, sizeof got, dy.ndim, dy.shape);
        rc = cli_usage_error("--grad-output: shape %s does not match the output's %s", got, want);
        goto done;
    }
    if (attn_module_forward(m, run.x.data, run.batch, run.tokens, y, run.rng) != ATTN_OK) {
        rc = cli_library_error(run.ctx, "forward");
        goto done;
    }
    if (attn_module_backward(m, dy.data, run.batch, run.tokens, dx) != ATTN_OK) {
        rc = cli_library_error(run.ctx, "backward");
        goto done;
    }
    rc = cli_outputs_npy(&out, at[0], y, rank, y_shape);
    if (rc == CLI_OK) rc = cli_outputs_npy(&out, at[1], dx, rank, x_shape);
    for (size_t i = 0; i < params && rc == CLI_OK; i++) {
        attn_param p;
        if (attn_module_param_at(m, i, &p) != ATTN_OK) rc = cli_library_error(run.ctx, "grad");
        else rc = cli_outputs_npy(&out, at[2 + i], p.grad, p.ndim, p.shape);
    }
    if (rc == CLI_OK) rc = cli_outputs_commit(&out, false);
done:
    cli_outputs_free(&out);
    free(at);
    free(y);
    free(dx);
    attn_npy_free(&dy);
    cli_run_close(&run);
    return rc;
}

const cli_command cli_grad_command = {
    .name = "grad",
    .summary = "forward and backward of any variant: every gradient as .npy",
    .help = grad_help_head,
    .more_help = print_more_help,
    .value_options = grad_options,
    .parse = parse_grad,
    .run = run_grad,
};
