/* module_options.c — parse the module options and build the module. */
#include "module_options.h"

#include "cli.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What each kind's PyTorch class takes; any other option given is refused. */
enum {
    TAKES_SIZES = CLI_GIVEN_D_IN | CLI_GIVEN_D_OUT,
    TAKES_CAUSAL = CLI_GIVEN_CONTEXT | CLI_GIVEN_DROPOUT | CLI_GIVEN_TRAIN | CLI_GIVEN_MASK,
    /* the book's chapter-4 classes: no context_length, always the -inf mask */
    TAKES_BOOK = TAKES_SIZES | CLI_GIVEN_SCALE | CLI_GIVEN_QKV_BIAS | CLI_GIVEN_HEADS |
                 CLI_GIVEN_DROPOUT | CLI_GIVEN_TRAIN,
};

static const unsigned takes[ATTN_MODULE_KIND_COUNT] = {
    [ATTN_MODULE_SIMPLE] = TAKES_SIZES,
    [ATTN_MODULE_SA_V1] = TAKES_SIZES | CLI_GIVEN_SCALE,
    [ATTN_MODULE_SA_V2] = TAKES_SIZES | CLI_GIVEN_SCALE | CLI_GIVEN_QKV_BIAS,
    [ATTN_MODULE_CAUSAL] = TAKES_SIZES | CLI_GIVEN_SCALE | CLI_GIVEN_QKV_BIAS | TAKES_CAUSAL,
    [ATTN_MODULE_MHA_WRAPPER] =
        TAKES_SIZES | CLI_GIVEN_SCALE | CLI_GIVEN_QKV_BIAS | TAKES_CAUSAL | CLI_GIVEN_HEADS,
    [ATTN_MODULE_MHA] =
        TAKES_SIZES | CLI_GIVEN_SCALE | CLI_GIVEN_QKV_BIAS | TAKES_CAUSAL | CLI_GIVEN_HEADS,
    /* GPT-2 masks with -inf only, and its c_attn always has a bias. */
    [ATTN_MODULE_GPT2] = TAKES_SIZES | CLI_GIVEN_SCALE | CLI_GIVEN_HEADS | CLI_GIVEN_CONTEXT |
                         CLI_GIVEN_DROPOUT | CLI_GIVEN_TRAIN,
    [ATTN_MODULE_GQA] = TAKES_BOOK | CLI_GIVEN_KV_GROUPS,
    [ATTN_MODULE_MLA] = TAKES_BOOK | CLI_GIVEN_LATENT_DIM,
    [ATTN_MODULE_SWA] = TAKES_BOOK | CLI_GIVEN_WINDOW,
};

bool cli_module_kind(const char *name, attn_module_kind *out) {
    /* the library's table names the kinds; no ctx: the message is the CLI's */
    return name && attn_module_kind_from_name(NULL, name, out) == ATTN_OK;
}

bool cli_known_module(const char *name) {
    attn_module_kind kind;
    return cli_module_kind(name, &kind);
}

bool cli_module_has_context(attn_module_kind kind) {
    return kind < ATTN_MODULE_KIND_COUNT && (takes[kind] & CLI_GIVEN_CONTEXT);
}

int cli_unknown_module(const char *option, const char *value) {
    char names[160] = "";
    for (size_t i = 0, len = 0; i < ATTN_MODULE_KIND_COUNT && len < sizeof names; i++)
        len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", i ? "|" : "",
                                attn_module_kind_name((attn_module_kind)i));
    return cli_usage_error("%s: expected one of %s, got '%s'", option, names, value);
}

bool cli_module_flag(const char *opt) { return strcmp(opt, "--qkv-bias") == 0; }

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
        o->given |= CLI_GIVEN_QKV_BIAS;
        return 1;
    }
    size_t *size_target = NULL;
    unsigned bit = 0;
    if (strcmp(opt, "--d-in") == 0) size_target = &o->d_in, bit = CLI_GIVEN_D_IN;
    else if (strcmp(opt, "--d-out") == 0) size_target = &o->d_out, bit = CLI_GIVEN_D_OUT;
    else if (strcmp(opt, "--heads") == 0) size_target = &o->heads, bit = CLI_GIVEN_HEADS;
    else if (strcmp(opt, "--context") == 0) size_target = &o->context, bit = CLI_GIVEN_CONTEXT;
    else if (strcmp(opt, "--kv-groups") == 0) size_target = &o->kv_groups, bit = CLI_GIVEN_KV_GROUPS;
    else if (strcmp(opt, "--latent-dim") == 0) size_target = &o->latent_dim, bit = CLI_GIVEN_LATENT_DIM;
    else if (strcmp(opt, "--window") == 0) size_target = &o->window, bit = CLI_GIVEN_WINDOW;
    if (size_target) {
        if (!cli_parse_size(value, size_target) || *size_target == 0)
            return cli_usage_error("%s: expected a positive integer, got '%s'", opt, value);
    } else if (strcmp(opt, "--module") == 0) {
        if (!cli_known_module(value)) return cli_unknown_module("--module", value);
        o->module = value;
    } else if (strcmp(opt, "--dropout") == 0) {
        bit = CLI_GIVEN_DROPOUT;
        if (!cli_parse_double(value, &o->dropout))
            return cli_bad_number(opt, value, "a probability in [0, 1]");
        if (!(o->dropout >= 0.0 && o->dropout <= 1.0))
            return cli_usage_error("--dropout: expected a probability in [0, 1], got '%s'", value);
    } else if (strcmp(opt, "--scale") == 0) {
        bit = CLI_GIVEN_SCALE;
        if (!cli_parse_double(value, &o->scale))
            return cli_bad_number(opt, value, "a finite number");
        if (!isfinite(o->scale))
            return cli_usage_error("--scale: expected a finite number, got '%s'", value);
        /* The scores are multiplied by the scale rounded to float32, as in
         * PyTorch: from FLT_MAX plus half an ulp on that is infinity. */
        if (fabs(o->scale) >= 0x1.ffffffp127)
            return cli_usage_error("--scale: %s is beyond float32's range (largest %.9g)", value,
                                   (double)FLT_MAX);
    } else if (strcmp(opt, "--mask") == 0) {
        bit = CLI_GIVEN_MASK;
        if (!parse_mask(value, &o->mask))
            return cli_usage_error("--mask: expected neg-inf, renormalize or none, got '%s'", value);
    } else {
        return 0;
    }
    o->given |= bit;
    return 1;
}

int cli_module_check(const cli_module_options *o) {
    static const struct {
        unsigned bit;
        const char *option, *parameter;
    } options[] = {
        {CLI_GIVEN_HEADS, "--heads", "num_heads"},
        {CLI_GIVEN_CONTEXT, "--context", "context_length"},
        {CLI_GIVEN_QKV_BIAS, "--qkv-bias", "qkv_bias"},
        {CLI_GIVEN_DROPOUT, "--dropout", "dropout"},
        {CLI_GIVEN_TRAIN, "--train", "dropout to train"},
        {CLI_GIVEN_SCALE, "--scale", "scale"},
        {CLI_GIVEN_MASK, "--mask", "mask"},
        {CLI_GIVEN_KV_GROUPS, "--kv-groups", "num_kv_groups"},
        {CLI_GIVEN_LATENT_DIM, "--latent-dim", "latent_dim"},
        {CLI_GIVEN_WINDOW, "--window", "sliding_window_size"},
    };
    attn_module_kind kind;
    if (!cli_module_kind(o->module, &kind))
        return CLI_OK; /* no module yet: the command says it is required */
    unsigned taken = takes[kind];
    bool book = taken & (CLI_GIVEN_KV_GROUPS | CLI_GIVEN_LATENT_DIM | CLI_GIVEN_WINDOW);
    bool gpt2 = kind == ATTN_MODULE_GPT2;
    for (size_t i = 0; i < sizeof options / sizeof options[0]; i++) {
        if (!(o->given & options[i].bit) || (taken & options[i].bit)) continue;
        const char *why = "";
        if (gpt2 && options[i].bit == CLI_GIVEN_QKV_BIAS)
            why = "; its c_attn always has a bias";
        else if (gpt2 && options[i].bit == CLI_GIVEN_MASK)
            why = "; it always masks the future with -inf";
        else if (book && options[i].bit == CLI_GIVEN_MASK)
            why = "; it always masks with -inf";
        else if (book && options[i].bit == CLI_GIVEN_CONTEXT)
            why = "; it runs any sequence length";
        return cli_usage_error("%s does not apply to --module %s (%s takes no %s%s)",
                               options[i].option, o->module, attn_module_kind_class_name(kind),
                               options[i].parameter, why);
    }
    return CLI_OK;
}

int cli_module_resolve(cli_module_options *o, size_t width, size_t tokens) {
    int rc = cli_module_check(o);
    if (rc != CLI_OK) return rc;
    if (o->d_in == 0) o->d_in = width;
    if (o->d_in != width)
        return cli_usage_error("input width (%zu) does not match --d-in (%zu)", width, o->d_in);
    attn_module_kind kind;
    cli_module_kind(o->module, &kind); /* known: cli_module_check passed */
    if (kind == ATTN_MODULE_SIMPLE || kind == ATTN_MODULE_GPT2) {
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
    attn_module_kind kind;
    if (!cli_module_kind(o->module, &kind))
        return attn_module_kind_from_name(ctx, o->module ? o->module : "", &kind);
    /* each kind reads the fields its class takes; cli_module_check refused
     * the options it does not */
    attn_module_config cfg = {.d_in = o->d_in, .d_out = o->d_out, .context_length = o->context,
                              .num_heads = o->heads,
                              .num_kv_groups = o->kv_groups ? o->kv_groups : o->heads,
                              .latent_dim = o->latent_dim, .sliding_window_size = o->window,
                              .dropout = o->dropout, .qkv_bias = o->qkv_bias,
                              .scale = o->scale, .mask = o->mask};
    return attn_module_new(ctx, kind, &cfg, rng, out);
}

/* ---- running a module on an .npy input ---------------------------------- */

cli_run_options cli_run_defaults(void) {
    return (cli_run_options){.module = {.heads = 1}, .seed = 123,
                             .threads = cli_default_threads(),
                             .bernoulli = ATTN_BERNOULLI_MT19937, .kernels = ATTN_KERNELS_AUTO};
}

const char cli_run_options_help[] =
    "  --d-in       defaults to the input's last dimension\n"
    "  --d-out      output width; for mha-wrapper the width of each head; simple\n"
    "               and gpt2 keep d_in (gpt2: n_embd)\n"
    "  --heads      num_heads (mha-wrapper, mha, gqa, mla, swa) or n_head (gpt2);\n"
    "               default 1\n"
    "  --context    context_length (causal, mha-wrapper, mha) or block_size\n"
    "               (gpt2); default T\n"
    "  --qkv-bias   biases in W_query, W_key, W_value (sa2, causal, mha-wrapper,\n"
    "               mha, gqa, swa; mla: W_query, W_DKV, W_UK, W_UV; gpt2's c_attn\n"
    "               always has one)\n"
    "  --dropout P  dropout probability (causal, mha-wrapper, mha, gpt2, gqa, mla,\n"
    "               swa); draws only with --train (training mode)\n"
    "  --kv-groups N  gqa's num_kv_groups: key/value heads, each shared by\n"
    "               heads / N query heads (1: multi-query); default --heads\n"
    "  --latent-dim N  mla's latent_dim, the width keys and values are\n"
    "               up-projected from; default max(16, d_out / 8)\n"
    "  --window W   swa's sliding_window_size: query i sees keys i-W+1 .. i;\n"
    "               default none (plain causal)\n"
    "  --scale S    multiplies the scores (every module but simple), rounded to\n"
    "               float32 as in PyTorch; 0 or absent: 1/sqrt(head_dim)\n"
    "  --mask       how causal, mha-wrapper and mha mask the future (default\n"
    "               neg-inf; gpt2, gqa, mla and swa always use neg-inf)\n"
    "  --bernoulli  dropout draws of PyTorch builds without MKL (mt19937,\n"
    "               default) or with MKL on Intel CPUs (mkl), or counter-based\n"
    "               Philox drawn inside the fused kernels (philox)\n"
    "  --threads    worker threads (default: all online CPUs)\n"
    "  --kernels    auto (default: the fastest this CPU runs, or the ATTN_KERNELS\n"
    "               environment variable), reference (the double-accumulating\n"
    "               loops, closest to exact), portable, avx2 or avx512\n"
    "An option the module's PyTorch class does not take is an error.\n";

void cli_print_run_options_help(FILE *out) { fputs(cli_run_options_help, out); }

static bool listed(const char *opt, const char *const *list) {
    for (size_t i = 0; list && list[i]; i++)
        if (strcmp(opt, list[i]) == 0) return true;
    return false;
}

int cli_parse_run_options(int argc, char **argv, cli_run_options *o, const cli_extra_options *extra) {
    static const char *const run_options[] = {CLI_RUN_VALUE_OPTIONS};
    enum { RUN_OPTIONS = sizeof run_options / sizeof run_options[0], MAX_OPTIONS = 32 };
    const char *known[MAX_OPTIONS + 1];
    size_t n = 0;
    for (; n < RUN_OPTIONS; n++) known[n] = run_options[n];
    for (size_t i = 0; extra->options && extra->options[i] && n < MAX_OPTIONS; i++)
        known[n++] = extra->options[i];
    known[n] = NULL;
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i];
        if (cli_module_flag(opt)) {
            cli_module_option(opt, NULL, &o->module);
        } else if (strcmp(opt, "--train") == 0) {
            o->train = true;
            o->module.given |= CLI_GIVEN_TRAIN;
        } else if (listed(opt, extra->flags)) {
            if (extra->take(extra->user, opt, NULL) != CLI_OK) return CLI_USAGE;
        } else {
            const char *value = cli_option_value(argc, argv, &i, known);
            if (!value) return CLI_USAGE;
            int handled = cli_module_option(opt, value, &o->module);
            if (handled == CLI_USAGE) return CLI_USAGE;
            if (handled) continue;
            if (strcmp(opt, "--input") == 0) {
                o->input = value;
            } else if (strcmp(opt, "--seed") == 0) {
                if (!cli_parse_u64(value, &o->seed))
                    return cli_usage_error("--seed: expected a non-negative integer, got '%s'", value);
            } else if (strcmp(opt, "--threads") == 0) {
                if (!cli_parse_size(value, &o->threads) || o->threads == 0)
                    return cli_usage_error("--threads: expected a positive integer, got '%s'", value);
            } else if (strcmp(opt, "--bernoulli") == 0) {
                if (strcmp(value, "mt19937") == 0) o->bernoulli = ATTN_BERNOULLI_MT19937;
                else if (strcmp(value, "mkl") == 0) o->bernoulli = ATTN_BERNOULLI_MKL_MCG31;
                else if (strcmp(value, "philox") == 0) o->bernoulli = ATTN_BERNOULLI_PHILOX;
                else return cli_usage_error("--bernoulli: expected mt19937, mkl or philox, got '%s'",
                                            value);
            } else if (strcmp(opt, "--kernels") == 0) {
                int rc = cli_parse_kernels(value, &o->kernels);
                if (rc != CLI_OK) return rc;
            } else if (extra->take(extra->user, opt, value) != CLI_OK) {
                return CLI_USAGE;
            }
        }
    }
    return cli_module_check(&o->module);
}

int cli_run_open(cli_run *run, cli_run_options *o) {
    *run = (cli_run){0};
    int rc = cli_ctx_new(&(attn_ctx_config){.num_threads = o->threads, .kernels = o->kernels},
                         &run->ctx);
    if (rc != CLI_OK) return rc;
    if (attn_npy_read(run->ctx, o->input, &run->x) != ATTN_OK)
        return cli_library_error(run->ctx, "--input");
    const attn_npy *x = &run->x;
    char shape[128];
    cli_format_shape(shape, sizeof shape, x->ndim, x->shape);
    if (x->ndim != 2 && x->ndim != 3)
        return cli_usage_error("--input: '%s' is %s: expected shape (B, T, d_in) or (T, d_in), "
                               "got %zu dimensions", o->input, shape, x->ndim);
    run->batch = x->ndim == 3 ? x->shape[0] : 1;
    run->tokens = x->shape[x->ndim - 2];
    if (run->batch == 0 || run->tokens == 0 || x->shape[x->ndim - 1] == 0)
        return cli_usage_error("--input: '%s' is %s: empty (batch %zu, tokens %zu, d_in %zu)",
                               o->input, shape, run->batch, run->tokens, x->shape[x->ndim - 1]);
    rc = cli_module_resolve(&o->module, x->shape[x->ndim - 1], run->tokens);
    if (rc != CLI_OK) return rc;
    if (attn_rng_new(run->ctx, o->seed, &run->rng) != ATTN_OK ||
        attn_rng_set_bernoulli_method(run->rng, o->bernoulli) != ATTN_OK ||
        cli_build_module(run->ctx, run->rng, &o->module, &run->module) != ATTN_OK ||
        attn_module_set_training(run->module, o->train) != ATTN_OK)
        return cli_library_error(run->ctx, o->module.module);
    return CLI_OK;
}

void cli_run_close(cli_run *run) {
    attn_module_free(run->module);
    attn_rng_free(run->rng);
    attn_npy_free(&run->x);
    attn_ctx_free(run->ctx);
    *run = (cli_run){0};
}

size_t cli_run_shape(const cli_run *run, size_t width, size_t shape[3]) {
    size_t rank = run->x.ndim;
    shape[0] = rank == 3 ? run->batch : run->tokens;
    shape[1] = rank == 3 ? run->tokens : width;
    shape[2] = width;
    return rank;
}
