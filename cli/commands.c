/* commands.c — attn trace, attn params and attn forward. */
#include "cli.h"
#include "tensor_print.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- building any module from options ---------------------------------- */

typedef struct module_options {
    const char *module; /* simple|sa1|sa2|causal|mha-wrapper|mha|gpt2 */
    size_t d_in, d_out, heads, context;
    bool qkv_bias;
    double dropout;
    float scale;
    attn_mask_method mask;
} module_options;

static const char module_names[] = "simple|sa1|sa2|causal|mha-wrapper|mha|gpt2";

static bool parse_mask(const char *text, attn_mask_method *out) {
    if (strcmp(text, "neg-inf") == 0) *out = ATTN_MASK_NEG_INF;
    else if (strcmp(text, "renormalize") == 0) *out = ATTN_MASK_RENORMALIZE;
    else if (strcmp(text, "none") == 0) *out = ATTN_MASK_NONE;
    else return false;
    return true;
}

/* Builds the module o describes, drawing its weights from rng. */
static attn_status build_module(attn_ctx *ctx, attn_rng *rng, const module_options *o,
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

static bool known_module(const char *name) {
    const char *names[] = {"simple", "sa1", "sa2", "causal", "mha-wrapper", "mha", "gpt2"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i]) == 0) return true;
    return false;
}

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

static void print_shape(size_t ndim, const size_t *shape) {
    putchar('[');
    for (size_t i = 0; i < ndim; i++) printf(i ? ", %zu" : "%zu", shape[i]);
    putchar(']');
}

/* ---- attn trace -------------------------------------------------------- */

static const char trace_help[] =
    "usage: attn trace [--preset NAME] [--module mha|gpt2|causal|mha-wrapper|sa2|sa1|simple]\n"
    "                  [--batch N] [--tokens N] [--seed S]\n"
    "\n"
    "Runs one forward pass of the module at the preset's size on random input\n"
    "and prints the shape of every intermediate tensor, in order, like the\n"
    "seeds' call-flow tables. Defaults: --preset gpt2-small --module mha\n"
    "--batch 2 --tokens 6 --seed 123.\n";

typedef struct trace_state {
    int step;
} trace_state;

static void print_trace_row(void *user, const char *module, const char *name, size_t ndim,
                            const size_t *shape, const float *data) {
    trace_state *state = user;
    printf("%3d  %-22s %-34s ", ++state->step, module, name);
    print_shape(ndim, shape);
    printf("%s\n", data ? "" : "  (view)");
}

int cli_trace(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        fputs(trace_help, stdout);
        return CLI_OK;
    }
    const char *preset_name = "gpt2-small", *module = "mha";
    size_t batch = 2, tokens = 6;
    uint64_t seed = 123;
    static const char *const options[] = {"--preset", "--module", "--batch", "--tokens", "--seed",
                                           NULL};
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i], *value = cli_option_value(argc, argv, &i, options);
        if (!value) return CLI_USAGE;
        if (strcmp(opt, "--preset") == 0) preset_name = value;
        else if (strcmp(opt, "--module") == 0) module = value;
        else if (strcmp(opt, "--batch") == 0) {
            if (!cli_parse_size(value, &batch) || batch == 0)
                return cli_usage_error("--batch: expected a positive integer, got '%s'", value);
        } else if (strcmp(opt, "--tokens") == 0) {
            if (!cli_parse_size(value, &tokens) || tokens == 0)
                return cli_usage_error("--tokens: expected a positive integer, got '%s'", value);
        } else if (strcmp(opt, "--seed") == 0) {
            if (!cli_parse_u64(value, &seed))
                return cli_usage_error("--seed: expected a non-negative integer, got '%s'", value);
        }
    }
    if (!known_module(module))
        return cli_usage_error("--module: expected one of %s, got '%s'", module_names, module);

    trace_state state = {0};
    attn_ctx *ctx;
    attn_ctx_config ctx_cfg = {.num_threads = cli_default_threads(), .trace = print_trace_row,
                               .trace_user = &state};
    if (attn_ctx_new(&ctx_cfg, &ctx) != ATTN_OK) return cli_usage_error("cannot create a context");
    attn_gpt2_preset preset;
    int rc = CLI_OK;
    attn_rng *rng = NULL;
    attn_module *m = NULL;
    float *x = NULL, *y = NULL;
    if (attn_gpt2_preset_find(ctx, preset_name, &preset) != ATTN_OK) {
        rc = cli_usage_error("--preset: %s", attn_ctx_last_error(ctx));
        goto done;
    }
    module_options o = {.module = module, .d_in = preset.n_embd, .d_out = preset.n_embd,
                        .heads = preset.n_head, .context = preset.context_length,
                        .qkv_bias = preset.qkv_bias};
    /* The wrapper's d_out is per head, so its concatenation is n_embd wide. */
    if (strcmp(module, "mha-wrapper") == 0) o.d_out = preset.n_embd / preset.n_head;
    if (attn_rng_new(ctx, seed, &rng) != ATTN_OK || build_module(ctx, rng, &o, &m) != ATTN_OK) {
        rc = cli_library_error(ctx, "trace");
        goto done;
    }
    attn_module_set_training(m, false);
    size_t d_in = attn_module_d_in(m), d_out = attn_module_d_out(m);
    size_t rows = batch * tokens;
    bool fits = rows / batch == tokens && rows <= (size_t)-1 / sizeof(float) / (d_in + d_out);
    x = fits ? calloc(rows * d_in, sizeof *x) : NULL;
    y = fits ? calloc(rows * d_out, sizeof *y) : NULL;
    if (!x || !y) {
        rc = cli_usage_error("out of memory for batch %zu x tokens %zu", batch, tokens);
        goto done;
    }
    attn_rng_rand(rng, x, batch * tokens * d_in);
    printf("%s (%s: n_embd %zu, n_head %zu, head_dim %zu), batch %zu, tokens %zu\n\n",
           attn_module_class_name(m), preset.name, preset.n_embd, preset.n_head,
           preset.n_embd / preset.n_head, batch, tokens);
    printf("%3s  %-22s %-34s %s\n", "#", "module", "tensor", "shape");
    size_t in_shape[3] = {batch, tokens, d_in};
    print_trace_row(&state, attn_module_class_name(m), "x (input)", 3, in_shape, x);
    if (attn_module_forward(m, x, batch, tokens, y, NULL) != ATTN_OK)
        rc = cli_library_error(ctx, "trace");
done:
    free(x);
    free(y);
    attn_module_free(m);
    attn_rng_free(rng);
    attn_ctx_free(ctx);
    return rc;
}

/* ---- attn params ------------------------------------------------------- */

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
    module_options o = {.module = module, .d_in = p->n_embd, .d_out = p->n_embd,
                        .heads = p->n_head, .context = p->context_length, .qkv_bias = qkv_bias};
    size_t model_total;
    if (attn_rng_new(ctx, 0, &rng) != ATTN_OK || build_module(ctx, rng, &o, &m) != ATTN_OK ||
        attn_gpt2_preset_model_params(ctx, p, &model_total) != ATTN_OK) {
        attn_rng_free(rng);
        return cli_library_error(ctx, "params");
    }
    printf("%s: n_embd %zu, n_head %zu (head_dim %zu), n_layer %zu, context %zu\n", p->name,
           p->n_embd, p->n_head, p->n_embd / p->n_head, p->n_layer, p->context_length);
    printf("%s:\n", attn_module_class_name(m));
    for (size_t i = 0; i < attn_module_param_count(m); i++) {
        attn_param param;
        attn_module_param_at(m, i, &param);
        char shape[48], count[32];
        if (param.ndim == 1) snprintf(shape, sizeof shape, "[%zu]", param.shape[0]);
        else snprintf(shape, sizeof shape, "[%zu, %zu]", param.shape[0], param.shape[1]);
        printf("  %-18s %-14s %13s\n", param.name, shape, grouped(param.numel, count));
    }
    char count[32];
    printf("  %-33s %13s\n", "total", grouped(attn_module_num_scalars(m), count));
    printf("whole GPT-2 model (%zu layers, tied embeddings): %s\n", p->n_layer,
           grouped(model_total, count));
    attn_module_free(m);
    attn_rng_free(rng);
    return CLI_OK;
}

int cli_params(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        fputs(params_help, stdout);
        return CLI_OK;
    }
    const char *preset_name = NULL, *module = "gpt2";
    bool qkv_bias = false;
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i];
        if (strcmp(opt, "--qkv-bias") == 0) {
            qkv_bias = true;
            continue;
        }
        static const char *const options[] = {"--preset", "--module", NULL};
        const char *value = cli_option_value(argc, argv, &i, options);
        if (!value) return CLI_USAGE;
        if (strcmp(opt, "--preset") == 0) preset_name = value;
        else module = value;
    }
    if (!preset_name) return cli_usage_error("params: --preset is required (try 'attn params --help')");
    if (strcmp(module, "mha") != 0 && strcmp(module, "gpt2") != 0)
        return cli_usage_error("--module: expected mha or gpt2, got '%s'", module);
    attn_ctx *ctx;
    if (attn_ctx_new(NULL, &ctx) != ATTN_OK) return cli_usage_error("cannot create a context");
    int rc = CLI_OK;
    if (strcmp(preset_name, "all") == 0) {
        for (size_t i = 0; i < attn_gpt2_preset_count() && rc == CLI_OK; i++) {
            attn_gpt2_preset p;
            attn_gpt2_preset_at(i, &p);
            if (i) putchar('\n');
            rc = print_params(ctx, &p, module, qkv_bias);
        }
    } else {
        attn_gpt2_preset p;
        if (attn_gpt2_preset_find(ctx, preset_name, &p) != ATTN_OK)
            rc = cli_usage_error("--preset: %s", attn_ctx_last_error(ctx));
        else
            rc = print_params(ctx, &p, module, qkv_bias);
    }
    attn_ctx_free(ctx);
    return rc;
}

/* ---- attn forward ------------------------------------------------------ */

static const char forward_help[] =
    "usage: attn forward --module simple|sa1|sa2|causal|mha-wrapper|mha|gpt2\n"
    "                    --input x.npy --output y.npy [--seed S] [--d-in N] [--d-out N]\n"
    "                    [--heads N] [--context N] [--qkv-bias] [--dropout P --train]\n"
    "                    [--scale S] [--mask neg-inf|renormalize|none]\n"
    "                    [--bernoulli mt19937|mkl] [--threads N]\n"
    "\n"
    "Runs one attention variant on a float32 .npy input of shape (B, T, d_in) or\n"
    "(T, d_in) and writes the output with the same rank. The weights are those\n"
    "the seeds' PyTorch class holds after torch.manual_seed(S) (default 123).\n"
    "  --d-in       defaults to the input's last dimension\n"
    "  --d-out      output width; for mha-wrapper the width of each head; simple\n"
    "               and gpt2 keep d_in (gpt2: n_embd)\n"
    "  --heads      num_heads (mha-wrapper, mha) or n_head (gpt2); default 1\n"
    "  --context    context_length / block_size; default T\n"
    "  --dropout P  dropout probability; draws only with --train\n"
    "  --scale S    score scale; default 1/sqrt(head_dim)\n"
    "  --mask       how causal modules mask the future (default neg-inf)\n"
    "  --bernoulli  dropout draws of PyTorch builds without MKL (mt19937,\n"
    "               default) or with MKL on Intel CPUs (mkl)\n"
    "  --threads    worker threads (default: all online CPUs)\n";

int cli_forward(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        fputs(forward_help, stdout);
        return CLI_OK;
    }
    module_options o = {.module = NULL, .heads = 1};
    const char *input = NULL, *output = NULL;
    uint64_t seed = 123;
    bool train = false;
    size_t threads = cli_default_threads();
    attn_bernoulli_method bernoulli = ATTN_BERNOULLI_MT19937;
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i];
        if (strcmp(opt, "--qkv-bias") == 0) {
            o.qkv_bias = true;
            continue;
        }
        if (strcmp(opt, "--train") == 0) {
            train = true;
            continue;
        }
        static const char *const options[] = {
            "--module", "--input",   "--output", "--seed", "--d-in",      "--d-out",   "--heads",
            "--context", "--threads", "--dropout", "--scale", "--mask", "--bernoulli", NULL};
        const char *value = cli_option_value(argc, argv, &i, options);
        if (!value) return CLI_USAGE;
        size_t *size_target = strcmp(opt, "--d-in") == 0      ? &o.d_in
                              : strcmp(opt, "--d-out") == 0   ? &o.d_out
                              : strcmp(opt, "--heads") == 0   ? &o.heads
                              : strcmp(opt, "--context") == 0 ? &o.context
                              : strcmp(opt, "--threads") == 0 ? &threads
                                                              : NULL;
        if (size_target) {
            if (!cli_parse_size(value, size_target) || *size_target == 0)
                return cli_usage_error("%s: expected a positive integer, got '%s'", opt, value);
        } else if (strcmp(opt, "--module") == 0) {
            if (!known_module(value))
                return cli_usage_error("--module: expected one of %s, got '%s'", module_names, value);
            o.module = value;
        } else if (strcmp(opt, "--input") == 0) input = value;
        else if (strcmp(opt, "--output") == 0) output = value;
        else if (strcmp(opt, "--seed") == 0) {
            if (!cli_parse_u64(value, &seed))
                return cli_usage_error("--seed: expected a non-negative integer, got '%s'", value);
        } else if (strcmp(opt, "--dropout") == 0) {
            if (!cli_parse_double(value, &o.dropout) || !(o.dropout >= 0.0 && o.dropout <= 1.0))
                return cli_usage_error("--dropout: expected a probability in [0, 1], got '%s'", value);
        } else if (strcmp(opt, "--scale") == 0) {
            double scale;
            if (!cli_parse_double(value, &scale) || !isfinite(scale))
                return cli_usage_error("--scale: expected a finite number, got '%s'", value);
            o.scale = (float)scale;
        } else if (strcmp(opt, "--mask") == 0) {
            if (!parse_mask(value, &o.mask))
                return cli_usage_error("--mask: expected neg-inf, renormalize or none, got '%s'", value);
        } else if (strcmp(opt, "--bernoulli") == 0) {
            if (strcmp(value, "mt19937") == 0) bernoulli = ATTN_BERNOULLI_MT19937;
            else if (strcmp(value, "mkl") == 0) bernoulli = ATTN_BERNOULLI_MKL_MCG31;
            else return cli_usage_error("--bernoulli: expected mt19937 or mkl, got '%s'", value);
        }
    }
    if (!o.module) return cli_usage_error("forward: --module is required (try 'attn forward --help')");
    if (!input || !output) return cli_usage_error("forward: --input and --output are required");
    if (o.dropout > 0.0 && !train)
        fprintf(stderr, "attn: note: --dropout has no effect without --train (eval mode)\n");

    attn_ctx *ctx;
    if (attn_ctx_new(&(attn_ctx_config){.num_threads = threads}, &ctx) != ATTN_OK)
        return cli_usage_error("--threads: %zu is too many", threads);
    int rc = CLI_OK;
    attn_npy x = {0};
    attn_rng *rng = NULL;
    attn_module *m = NULL;
    float *y = NULL;
    if (attn_npy_read(ctx, input, &x) != ATTN_OK) {
        rc = cli_library_error(ctx, "--input");
        goto done;
    }
    if (x.ndim != 2 && x.ndim != 3) {
        rc = cli_usage_error("--input: expected shape (B, T, d_in) or (T, d_in), got %zu dimensions",
                             x.ndim);
        goto done;
    }
    size_t batch = x.ndim == 3 ? x.shape[0] : 1, tokens = x.shape[x.ndim - 2];
    size_t width = x.shape[x.ndim - 1];
    if (o.d_in == 0) o.d_in = width;
    if (o.d_in != width) {
        rc = cli_usage_error("input width (%zu) does not match --d-in (%zu)", width, o.d_in);
        goto done;
    }
    if (strcmp(o.module, "simple") == 0 || strcmp(o.module, "gpt2") == 0) {
        if (o.d_out && o.d_out != o.d_in) {
            rc = cli_usage_error("--d-out (%zu) must equal d_in (%zu) for %s", o.d_out, o.d_in,
                                 o.module);
            goto done;
        }
        o.d_out = o.d_in;
    }
    if (o.d_out == 0) {
        rc = cli_usage_error("forward: --d-out is required for --module %s", o.module);
        goto done;
    }
    if (batch == 0 || tokens == 0) {
        rc = cli_usage_error("--input: empty shape (batch %zu, tokens %zu)", batch, tokens);
        goto done;
    }
    if (o.context == 0) o.context = tokens;
    if (attn_rng_new(ctx, seed, &rng) != ATTN_OK ||
        attn_rng_set_bernoulli_method(rng, bernoulli) != ATTN_OK ||
        build_module(ctx, rng, &o, &m) != ATTN_OK) {
        rc = cli_library_error(ctx, "forward");
        goto done;
    }
    attn_module_set_training(m, train);
    size_t d_out = attn_module_d_out(m);
    size_t y_count = batch * tokens; /* overflow is checked by the forward below */
    y = calloc(y_count, d_out * sizeof *y);
    if (!y) {
        rc = cli_usage_error("out of memory for the output (%zu x %zu floats)", y_count, d_out);
        goto done;
    }
    if (attn_module_forward(m, x.data, batch, tokens, y, rng) != ATTN_OK) {
        rc = cli_library_error(ctx, "forward");
        goto done;
    }
    size_t y_shape[3] = {batch, tokens, d_out};
    const size_t *shape = x.ndim == 3 ? y_shape : y_shape + 1;
    if (attn_npy_write(ctx, output, y, x.ndim, shape) != ATTN_OK)
        rc = cli_library_error(ctx, "--output");
done:
    free(y);
    attn_module_free(m);
    attn_rng_free(rng);
    attn_npy_free(&x);
    attn_ctx_free(ctx);
    return rc;
}
