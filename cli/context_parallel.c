/* context_parallel.c — attn forward|grad --context-parallel under mpirun
 * (built with ATTN_MPI only): rank 0 reads the input, every rank builds
 * the same module from the same seed, the tokens are scattered by the
 * mode's layout, the module runs context-parallel, rank 0 gathers and
 * writes. Every failure is agreed on, so every rank exits with it and none
 * waits for a rank that gave up. */
#define _POSIX_C_SOURCE 200809L
#include "context_parallel.h"
#include "outputs.h"

#include "attn_mpi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static attn_mpi_mode mode_of(const char *name) {
    return strcmp(name, "ulysses") == 0  ? ATTN_MPI_ULYSSES
           : strcmp(name, "zigzag") == 0 ? ATTN_MPI_ZIGZAG
                                         : ATTN_MPI_RING;
}

/* The worst exit code of any rank: a rank that failed on its own (and
 * printed why) fails them all; the others say so. */
static int agree_rc(int rc, int rank) {
    int worst = rc;
    if (MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS)
        return CLI_FAILED;
    if (worst != CLI_OK && rc == CLI_OK)
        fprintf(stderr, "attn: rank %d: stopping, another rank failed\n", rank);
    return worst;
}

/* A run: the ctx, module and group every rank holds; the whole input on
 * rank 0 only, its shape on every rank. */
typedef struct cp_run {
    int rank, size;
    attn_ctx *ctx;
    attn_rng *rng;
    attn_module *module;
    attn_mpi_group *group;
    attn_npy x;                 /* rank 0 */
    size_t ndim, batch, tokens, width, local;
} cp_run;

static void cp_close(cp_run *r) {
    attn_mpi_group_free(r->group);
    attn_module_free(r->module);
    attn_rng_free(r->rng);
    attn_npy_free(&r->x);
    attn_ctx_free(r->ctx);
}

/* Library failures are collective: each rank prints its message. */
static int lib_error(const cp_run *r, const char *what) {
    char label[64];
    snprintf(label, sizeof label, "rank %d: %s", r->rank, what);
    return cli_library_error(r->ctx, label);
}

/* What the ranks' command lines must share, agreed before anything else
 * is exchanged: ranks running another command, or the same with another
 * module, option, seed or weights, would run different collectives (a
 * hang) or compute with different weights (a wrong output). The library's
 * calls agree on the module and a checksum of its weights too; these name
 * the option. Not agreed: --threads and --kernels (each node's own; the
 * numbers stay within the single process's bounds), and the paths rank 0
 * alone reads or writes. */
static attn_status agree_options(cp_run *r, const char *command, const cli_run_options *o,
                                 const cli_weights_options *weights) {
    const cli_module_options *mo = &o->module;
    char dropout[32], scale[32];
    snprintf(dropout, sizeof dropout, "%.17g", mo->dropout);
    snprintf(scale, sizeof scale, "%.17g", mo->scale);
    bool have_weights = weights && weights->path;
    const attn_mpi_value v[] = {
        {"--module", mo->module, 0},
        {"--d-in", NULL, (int64_t)mo->d_in},
        {"--d-out", NULL, (int64_t)mo->d_out},
        {"--heads", NULL, (int64_t)mo->heads},
        {"--context", NULL, (int64_t)mo->context},
        {"--qkv-bias", NULL, mo->qkv_bias},
        {"--dropout", dropout, 0},
        {"--scale", scale, 0},
        {"--mask", NULL, (int64_t)mo->mask},
        {"--train", NULL, o->train},
        {"--seed", NULL, (int64_t)o->seed},
        {"--bernoulli", NULL, (int64_t)o->bernoulli},
        {"--weights (given)", NULL, have_weights},
        {"--layer", NULL, have_weights && weights->have_layer ? (int64_t)weights->layer : -1},
    };
    return attn_mpi_group_agree(r->group, command, v, sizeof v / sizeof *v);
}

static int cp_open(cp_run *r, const char *command, cli_run_options *o, const char *mode,
                   const cli_weights_options *weights) {
    *r = (cp_run){0};
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized && MPI_Init(NULL, NULL) != MPI_SUCCESS)
        return cli_failure("--context-parallel: MPI_Init failed");
    MPI_Comm_rank(MPI_COMM_WORLD, &r->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &r->size);
    int rc = cli_ctx_new(&(attn_ctx_config){.num_threads = o->threads, .kernels = o->kernels},
                         &r->ctx);
    if ((rc = agree_rc(rc, r->rank)) != CLI_OK) return rc;
    /* the group agrees on the mode, then on the command and its options:
     * from here every rank runs the same steps */
    if (attn_mpi_group_new(r->ctx, MPI_COMM_WORLD, mode_of(mode), &r->group) != ATTN_OK)
        return lib_error(r, "--context-parallel");
    if (agree_options(r, command, o, weights) != ATTN_OK)
        return lib_error(r, "--context-parallel");
    /* the one process's note, once for the job */
    if (r->rank == 0 && o->module.dropout > 0.0 && !o->train)
        fprintf(stderr, "attn: note: --dropout has no effect without --train (eval mode)\n");
    /* rank 0 reads the input; its shape goes to everyone */
    unsigned long long shape[5] = {0};
    if (r->rank == 0) {
        if (attn_npy_read(r->ctx, o->input, &r->x) != ATTN_OK)
            rc = cli_library_error(r->ctx, "--input");
        else if (r->x.ndim != 2 && r->x.ndim != 3)
            rc = cli_usage_error("--input: expected shape (B, T, d_in) or (T, d_in), got %zu "
                                 "dimensions", r->x.ndim);
        if (rc == CLI_OK) {
            const attn_npy *x = &r->x;
            shape[0] = x->ndim;
            shape[1] = x->ndim == 3 ? x->shape[0] : 1;
            shape[2] = x->shape[x->ndim - 2];
            shape[3] = x->shape[x->ndim - 1];
        }
        shape[4] = (unsigned long long)rc;
    }
    if (MPI_Bcast(shape, 5, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
        return cli_failure("--context-parallel: MPI_Bcast failed");
    if (shape[4] != CLI_OK) {
        if (r->rank != 0)
            fprintf(stderr, "attn: rank %d: stopping, rank 0 could not read --input\n", r->rank);
        return (int)shape[4]; /* rank 0 said why */
    }
    r->ndim = shape[0];
    r->batch = shape[1];
    r->tokens = shape[2];
    r->width = shape[3];
    if (r->batch == 0 || r->tokens == 0)
        rc = cli_usage_error("--input: empty shape (batch %zu, tokens %zu)", r->batch, r->tokens);
    if (rc == CLI_OK) rc = cli_module_resolve(&o->module, r->width, r->tokens);
    attn_module_kind kind;
    if (rc == CLI_OK && (!cli_module_kind(o->module.module, &kind) ||
                         (kind != ATTN_MODULE_MHA && kind != ATTN_MODULE_GPT2)))
        rc = cli_usage_error("--context-parallel: runs --module mha and gpt2, not '%s'",
                             o->module.module);
    if (rc == CLI_OK &&
        (attn_rng_new(r->ctx, o->seed, &r->rng) != ATTN_OK ||
         attn_rng_set_bernoulli_method(r->rng, o->bernoulli) != ATTN_OK ||
         cli_build_module(r->ctx, r->rng, &o->module, &r->module) != ATTN_OK ||
         attn_module_set_training(r->module, o->train) != ATTN_OK))
        rc = cli_library_error(r->ctx, o->module.module);
    if (rc == CLI_OK && weights && weights->path)
        rc = cli_load_weights(r->ctx, r->module, o->module.module, weights);
    if ((rc = agree_rc(rc, r->rank)) != CLI_OK) return rc;
    size_t b[2], e[2];
    attn_mpi_local_ranges(mode_of(mode), r->tokens, (size_t)r->size, (size_t)r->rank, b, e,
                          &r->local);
    return CLI_OK;
}

/* The output's shape, with the input's rank. */
static size_t out_shape(const cp_run *r, size_t width, size_t shape[3]) {
    shape[0] = r->ndim == 3 ? r->batch : r->tokens;
    shape[1] = r->ndim == 3 ? r->tokens : width;
    shape[2] = width;
    return r->ndim;
}

/* Local buffers: n floats each, agreed on. */
static int alloc_all(const cp_run *r, float **bufs, const size_t *n, size_t count) {
    int rc = CLI_OK;
    for (size_t i = 0; i < count; i++)
        if (!(bufs[i] = calloc(n[i] ? n[i] : 1, sizeof *bufs[i])))
            rc = cli_failure("rank %d: out of memory for %zu floats", r->rank, n[i]);
    return agree_rc(rc, r->rank);
}

static int finish(int rc) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
    return rc;
}

int cli_cp_forward(cli_run_options *o, const char *mode, const cli_weights_options *weights,
                   const char *output) {
    cp_run r;
    float *buf[3] = {NULL, NULL, NULL}; /* x_local, y_local, y (rank 0) */
    cli_outputs out;
    cli_outputs_init(&out, NULL);
    size_t at = 0;
    int rc = cp_open(&r, "attn forward", o, mode, weights);
    if (rc != CLI_OK) goto done;
    if (attn_module_set_grad_enabled(r.module, false) != ATTN_OK) /* inference only */
        rc = lib_error(&r, "forward");
    /* rank 0 opens its output before anything is computed */
    if (rc == CLI_OK && r.rank == 0) {
        cli_outputs_init(&out, r.ctx);
        if ((rc = cli_outputs_add(&out, "--output", output, &at)) == CLI_OK &&
            (rc = cli_outputs_not_input(&out, "--input", o->input)) == CLI_OK && weights)
            rc = cli_outputs_not_input(&out, "--weights", weights->path);
    }
    if ((rc = agree_rc(rc, r.rank)) != CLI_OK) goto done;
    size_t d_out = attn_module_d_out(r.module);
    size_t n[3] = {r.batch * r.local * r.width, r.batch * r.local * d_out,
                   r.rank == 0 ? r.batch * r.tokens * d_out : 0};
    if ((rc = alloc_all(&r, buf, n, 3)) != CLI_OK) goto done;
    if (attn_mpi_scatter_tokens(r.group, 0, r.x.data, r.batch, r.tokens, r.width, buf[0]) !=
        ATTN_OK) {
        rc = lib_error(&r, "scatter");
        goto done;
    }
    if (attn_mpi_module_forward(r.group, r.module, buf[0], r.batch, r.tokens, buf[1]) != ATTN_OK) {
        rc = lib_error(&r, "forward");
        goto done;
    }
    if (attn_mpi_gather_tokens(r.group, 0, buf[1], r.batch, r.tokens, d_out, buf[2]) !=
        ATTN_OK) {
        rc = lib_error(&r, "gather");
        goto done;
    }
    if (r.rank == 0) {
        size_t shape[3];
        size_t rank = out_shape(&r, d_out, shape);
        if ((rc = cli_outputs_npy(&out, at, buf[2], rank, shape)) == CLI_OK)
            rc = cli_outputs_commit(&out, false);
    }
    rc = agree_rc(rc, r.rank); /* rank 0's write fails the run on every rank */
done:
    cli_outputs_free(&out);
    for (int i = 0; i < 3; i++) free(buf[i]);
    cp_close(&r);
    return finish(rc);
}

int cli_cp_grad(cli_run_options *o, const char *mode, const char *grad_output,
                const char *out_dir) {
    cp_run r;
    attn_npy dy = {0};
    /* x_local, dy_local, y_local, dx_local; y, dx (rank 0) */
    float *buf[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    cli_outputs out;
    cli_outputs_init(&out, NULL);
    size_t *at = NULL; /* output, input, then each parameter's gradient */
    int rc = cp_open(&r, "attn grad", o, mode, NULL);
    if (rc != CLI_OK) goto done;
    size_t d_in = attn_module_d_in(r.module), d_out = attn_module_d_out(r.module);
    size_t y_shape[3], x_shape[3];
    size_t ndim = out_shape(&r, d_out, y_shape);
    out_shape(&r, d_in, x_shape);
    /* rank 0 reads dy and checks it against the output's shape */
    if (r.rank == 0) {
        if (attn_npy_read(r.ctx, grad_output, &dy) != ATTN_OK) {
            rc = cli_library_error(r.ctx, "--grad-output");
        } else {
            bool same = dy.ndim == ndim;
            for (size_t i = 0; same && i < ndim; i++) same = dy.shape[i] == y_shape[i];
            if (!same)
                rc = cli_usage_error("--grad-output: shape does not match the output's (%zu "
                                     "dimensions, %zu tokens)",
                                     ndim, r.tokens);
        }
    }
    /* rank 0 makes --out and opens every output before anything is computed */
    size_t n_params = attn_module_param_count(r.module);
    if (rc == CLI_OK && r.rank == 0) {
        cli_outputs_init(&out, r.ctx);
        if (!(at = calloc(n_params + 2, sizeof *at)))
            rc = cli_failure("out of memory");
        if (rc == CLI_OK && (rc = cli_outputs_dir(&out, "--out", out_dir)) == CLI_OK &&
            (rc = cli_outputs_add_in_dir(&out, "--out", out_dir, "output", &at[0])) == CLI_OK)
            rc = cli_outputs_add_in_dir(&out, "--out", out_dir, "input", &at[1]);
        for (size_t i = 0; i < n_params && rc == CLI_OK; i++) {
            attn_param p;
            if (attn_module_param_at(r.module, i, &p) != ATTN_OK)
                rc = lib_error(&r, "grad");
            else
                rc = cli_outputs_add_in_dir(&out, "--out", out_dir, p.name, &at[2 + i]);
        }
        if (rc == CLI_OK && (rc = cli_outputs_not_input(&out, "--input", o->input)) == CLI_OK)
            rc = cli_outputs_not_input(&out, "--grad-output", grad_output);
    }
    if ((rc = agree_rc(rc, r.rank)) != CLI_OK) goto done;
    size_t rows = r.batch * r.local, all = r.batch * r.tokens;
    size_t n[6] = {rows * d_in, rows * d_out, rows * d_out, rows * d_in,
                   r.rank == 0 ? all * d_out : 0, r.rank == 0 ? all * d_in : 0};
    if ((rc = alloc_all(&r, buf, n, 6)) != CLI_OK) goto done;
    if (attn_mpi_scatter_tokens(r.group, 0, r.x.data, r.batch, r.tokens, d_in, buf[0]) !=
            ATTN_OK ||
        attn_mpi_scatter_tokens(r.group, 0, dy.data, r.batch, r.tokens, d_out, buf[1]) !=
            ATTN_OK) {
        rc = lib_error(&r, "scatter");
        goto done;
    }
    if (attn_mpi_module_forward(r.group, r.module, buf[0], r.batch, r.tokens, buf[2]) != ATTN_OK) {
        rc = lib_error(&r, "forward");
        goto done;
    }
    if (attn_mpi_module_backward(r.group, r.module, buf[1], buf[3]) != ATTN_OK) {
        rc = lib_error(&r, "backward");
        goto done;
    }
    if (attn_mpi_gather_tokens(r.group, 0, buf[2], r.batch, r.tokens, d_out, buf[4]) !=
            ATTN_OK ||
        attn_mpi_gather_tokens(r.group, 0, buf[3], r.batch, r.tokens, d_in, buf[5]) != ATTN_OK) {
        rc = lib_error(&r, "gather");
        goto done;
    }
    /* every rank holds the summed parameter gradients; rank 0 writes */
    if (r.rank == 0) {
        rc = cli_outputs_npy(&out, at[0], buf[4], ndim, y_shape);
        if (rc == CLI_OK) rc = cli_outputs_npy(&out, at[1], buf[5], ndim, x_shape);
        for (size_t i = 0; i < n_params && rc == CLI_OK; i++) {
            attn_param p;
            if (attn_module_param_at(r.module, i, &p) != ATTN_OK)
                rc = lib_error(&r, "grad");
            else
                rc = cli_outputs_npy(&out, at[2 + i], p.grad, p.ndim, p.shape);
        }
        if (rc == CLI_OK) rc = cli_outputs_commit(&out, false);
    }
    rc = agree_rc(rc, r.rank); /* rank 0's write fails the run on every rank */
done:
    cli_outputs_free(&out);
    free(at);
    for (int i = 0; i < 6; i++) free(buf[i]);
    attn_npy_free(&dy);
    cp_close(&r);
    return finish(rc);
}
