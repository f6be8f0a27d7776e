/* cmd_train.c — attn train: the small language model (attn.h, "A small
 * language model") trained on a synthetic task, evaluated on held-out
 * sequences, optionally saved. */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"
#include "interrupt.h"
#include "module_options.h"
#include "outputs.h"

#include "train/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Defaults that learn induction to >= 99% held-out accuracy (seed 1) in a
 * few minutes on two cores; the learning tests run exactly these. */
#define DEFAULT_LAYERS 2
#define DEFAULT_HEADS 4
#define DEFAULT_D_MODEL 32
#define DEFAULT_CONTEXT 32
#define DEFAULT_VOCAB 32
#define DEFAULT_BATCH 32
#define DEFAULT_STEPS 600
#define DEFAULT_ADAMW_LR 1e-2
#define DEFAULT_SGD_LR 0.5
#define DEFAULT_SGD_MOMENTUM 0.9
#define DEFAULT_CLIP 1.0
#define DEFAULT_EVAL_SEQUENCES 512

static const char train_help[] =
    "usage: attn train [--task copy|reverse|sort|induction] [--layers N] [--heads N]\n"
    "                  [--d-model N] [--context N] [--vocab N] [--steps N] [--batch N]\n"
    "                  [--lr X] [--optimizer adamw|sgd] [--momentum X] [--weight-decay X]\n"
    "                  [--warmup N] [--clip X] [--dropout P] [--attention mha|gpt2] [--mlp]\n"
    "                  [--seed S] [--eval N] [--log-every N] [--threads N] [--save FILE]\n"
    "\n"
    "Trains a small GPT-style model (token + position embeddings, N blocks of\n"
    "LayerNorm -> causal multi-head attention -> residual [-> LayerNorm -> MLP ->\n"
    "residual], final LayerNorm, output projection, cross-entropy) on generated\n"
    "sequences, then prints its accuracy on held-out sequences and optionally\n"
    "saves the weights.\n"
    "\n"
    "Tasks (token 0 is a separator, data tokens are 1..V-1; each row is T+1\n"
    "tokens s, the model reads s[0..T-1] and predicts s[1..T]; only the answer\n"
    "tokens are scored, in the loss and in the accuracy):\n"
    "  copy       x_1..x_n 0 x_1..x_n         (n = T/2, x uniform)\n"
    "  reverse    x_1..x_n 0 x_n..x_1\n"
    "  sort       x_1..x_n 0 sorted(x)\n"
    "             answers: the n tokens after the separator\n"
    "  induction  0 p_1..p_L 0 p_1..p_L 0 p_1...  the period repeated to T+1 tokens,\n"
    "             p distinct, L uniform in [Lmax/2, Lmax], Lmax = (T-1)/2;\n"
    "             answers: every token after the second separator (each is the\n"
    "             token that followed the current one the time before)\n"
    "\n"
    "Model and data:\n"
    "  --task N        default induction\n"
    "  --layers N      blocks (default 2)           --heads N     heads (default 4)\n"
    "  --d-model N     width (default 32)           --context N   T (default 32)\n"
    "  --vocab N       V (default 32)               --batch N     sequences per step (32)\n"
    "  --attention K   mha (MultiHeadAttention, default) or gpt2 (CausalSelfAttention)\n"
    "  --mlp           add the MLP half to every block (Linear C->4C, exact GELU, 4C->C)\n"
    "  --dropout P     every dropout of the model (default 0)\n"
    "Optimization:\n"
    "  --steps N       optimizer steps (default 600)\n"
    "  --optimizer K   adamw (default; betas 0.9, 0.999, eps 1e-8) or sgd\n"
    "  --lr X          peak learning rate (adamw 1e-2, sgd 0.5)\n"
    "  --momentum X    sgd momentum (default 0.9)\n"
    "  --weight-decay X  adamw 0.01 (decoupled), sgd 0\n"
    "  --warmup N      linear warmup steps (default steps/10), then a cosine decay\n"
    "                  that would reach 0 one step past the last\n"
    "  --clip X        clip the gradients' global norm to X (default 1; 0: off)\n"
    "Runs:\n"
    "  --seed S        default 1. The model's weights come from an attn_rng seeded S\n"
    "                  (as torch.manual_seed(S) then the PyTorch constructors);\n"
    "                  training batches from one seeded S+1, held-out sequences from\n"
    "                  S+2, dropout from S+3.\n"
    "  --eval N        held-out sequences (default 512)\n"
    "  --log-every N   a progress line every N steps when stdout is not a terminal\n"
    "                  (default steps/20); a terminal gets one live line\n"
    "  --threads N     worker threads (default: all online CPUs)\n"
    "  --save FILE     write the weights as safetensors (state_dict names, the config\n"
    "                  in its metadata; see attn_model_save in attn.h)\n"
    "\n"
    "Interrupting (Ctrl-C, SIGTERM, SIGHUP): training stops after the step under\n"
    "way and one line on stderr says where; nothing is evaluated or saved (a\n"
    "model part trained, with no optimizer state to continue from, is not what\n"
    "--save promises), and --save's file stays as it was. After the last step\n"
    "the model is trained: a signal stops the held-out evaluation at its next\n"
    "batch, and --save still writes the model. A second signal ends it at once.\n"
    "Exit status: 0 done, 1 failed, 2 bad usage, 128 + the signal's number when\n"
    "interrupted (130 for Ctrl-C, 143 for SIGTERM).\n"
    "\n"
    "The last line reads like: held-out accuracy: 99.61% (answer tokens, 512 sequences)\n";

typedef struct train_options {
    attn_task_kind task;
    attn_model_config model;
    size_t steps, batch, warmup, eval_sequences, log_every, threads;
    bool warmup_set, log_every_set;
    attn_optimizer_kind optimizer;
    double lr, momentum, weight_decay, clip;
    bool lr_set, weight_decay_set, momentum_set, clip_set;
    uint64_t seed;
    const char *save;
} train_options;

/* Linear warmup to the peak, then a cosine decay from the peak at the
 * first step after it down to 0 one step past the last: every step moves
 * the weights (a decay that reached 0 at the last step left it idle, and
 * --steps 1 trained nothing). */
static double scheduled_lr(const train_options *o, size_t step /* 1-based */) {
    if (o->warmup > 0 && step <= o->warmup) return o->lr * (double)step / (double)o->warmup;
    if (o->steps <= o->warmup) return o->lr;
    double progress = (double)(step - o->warmup - 1) / (double)(o->steps - o->warmup);
    return o->lr * 0.5 * (1.0 + cos(3.14159265358979323846 * progress));
}

/* Answer tokens predicted right (argmax of the logits), and their count. */
static void count_correct(const float *logits, const int32_t *targets, size_t rows, size_t V,
                          size_t *correct, size_t *scored) {
    for (size_t n = 0; n < rows; n++) {
        if (targets[n] == ATTN_IGNORE_INDEX) continue;
        const float *z = logits + n * V;
        size_t best = 0;
        for (size_t v = 1; v < V; v++)
            if (z[v] > z[best]) best = v;
        *correct += best == (size_t)targets[n];
        *scored += 1;
    }
}

static int parse_size_option(const char *opt, const char *value, size_t *out, bool positive) {
    if (!cli_parse_size(value, out) || (positive && *out == 0))
        return cli_usage_error("%s: expected a %s integer, got '%s'", opt,
                               positive ? "positive" : "non-negative", value);
    return CLI_OK;
}

static const char *const options[] = {
    "--task", "--layers", "--heads", "--d-model", "--context", "--vocab", "--steps",
    "--batch", "--lr", "--optimizer", "--momentum", "--weight-decay", "--warmup", "--clip",
    "--dropout", "--attention", "--seed", "--eval", "--log-every", "--threads", "--save",
    NULL};

static int parse_options(int argc, char **argv, train_options *o) {
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i];
        if (strcmp(opt, "--mlp") == 0) {
            o->model.mlp = true;
            continue;
        }
        const char *value = cli_option_value(argc, argv, &i, options);
        if (!value) return CLI_USAGE;
        int rc = CLI_OK;
        double x;
        if (strcmp(opt, "--task") == 0) {
            if (attn_task_find(NULL, value, &o->task) != ATTN_OK)
                rc = cli_usage_error("--task: expected copy, reverse, sort or induction, got '%s'",
                                     value);
        } else if (strcmp(opt, "--layers") == 0) {
            rc = parse_size_option(opt, value, &o->model.n_layers, true);
        } else if (strcmp(opt, "--heads") == 0) {
            rc = parse_size_option(opt, value, &o->model.n_heads, true);
        } else if (strcmp(opt, "--d-model") == 0) {
            rc = parse_size_option(opt, value, &o->model.d_model, true);
        } else if (strcmp(opt, "--context") == 0) {
            rc = parse_size_option(opt, value, &o->model.context_length, true);
        } else if (strcmp(opt, "--vocab") == 0) {
            rc = parse_size_option(opt, value, &o->model.vocab_size, true);
        } else if (strcmp(opt, "--steps") == 0) {
            rc = parse_size_option(opt, value, &o->steps, true);
        } else if (strcmp(opt, "--batch") == 0) {
            rc = parse_size_option(opt, value, &o->batch, true);
        } else if (strcmp(opt, "--warmup") == 0) {
            rc = parse_size_option(opt, value, &o->warmup, false);
            o->warmup_set = true;
        } else if (strcmp(opt, "--eval") == 0) {
            rc = parse_size_option(opt, value, &o->eval_sequences, true);
        } else if (strcmp(opt, "--log-every") == 0) {
            rc = parse_size_option(opt, value, &o->log_every, true);
            o->log_every_set = true;
        } else if (strcmp(opt, "--threads") == 0) {
            rc = parse_size_option(opt, value, &o->threads, true);
        } else if (strcmp(opt, "--seed") == 0) {
            if (!cli_parse_u64(value, &o->seed))
                rc = cli_usage_error("--seed: expected a non-negative integer, got '%s'", value);
        } else if (strcmp(opt, "--optimizer") == 0) {
            if (strcmp(value, "adamw") == 0) o->optimizer = ATTN_OPTIMIZER_ADAMW;
            else if (strcmp(value, "sgd") == 0) o->optimizer = ATTN_OPTIMIZER_SGD;
            else rc = cli_usage_error("--optimizer: expected adamw or sgd, got '%s'", value);
        } else if (strcmp(opt, "--attention") == 0) {
            attn_module_kind kind;
            if (cli_module_kind(value, &kind) &&
                (kind == ATTN_MODULE_MHA || kind == ATTN_MODULE_GPT2))
                o->model.attention = kind;
            else rc = cli_usage_error("--attention: expected mha or gpt2, got '%s'", value);
        } else if (strcmp(opt, "--save") == 0) {
            o->save = value;
        } else {
            /* the real-valued options */
            const char *expected = strcmp(opt, "--dropout") == 0 ? "a probability in [0, 1]"
                                                                  : "a non-negative number";
            if (!cli_parse_double(value, &x) || !isfinite(x) || x < 0.0)
                return cli_bad_number(opt, value, expected);
            if (strcmp(opt, "--lr") == 0) o->lr = x, o->lr_set = true;
            else if (strcmp(opt, "--momentum") == 0) o->momentum = x, o->momentum_set = true;
            else if (strcmp(opt, "--weight-decay") == 0)
                o->weight_decay = x, o->weight_decay_set = true;
            else if (strcmp(opt, "--clip") == 0) o->clip = x, o->clip_set = true;
            else if (x > 1.0) rc = cli_bad_number(opt, value, expected);
            else o->model.dropout = x;
        }
        if (rc != CLI_OK) return rc;
    }
    return CLI_OK;
}

/* The progress line: live (\r, one line) on a terminal, plain lines else. */
typedef struct progress {
    bool live;
    size_t every;
    double start;
} progress;

static void report(progress *p, const train_options *o, size_t step, float loss, size_t correct,
                   size_t scored, double lr) {
    double elapsed = cli_now_seconds() - p->start;
    double tokens_per_s = elapsed > 0 ? (double)(step * o->batch * o->model.context_length) / elapsed
                                      : 0.0;
    char left[32];
    cli_format_duration(elapsed / (double)step * (double)(o->steps - step), left, sizeof left);
    double acc = scored ? 100.0 * (double)correct / (double)scored : 0.0;
    if (p->live) {
        printf("\rstep %zu/%zu  loss %.4f  acc %6.2f%%  lr %.2e  %.0f tok/s  left %s   ", step,
               o->steps, (double)loss, acc, lr, tokens_per_s, left);
        if (step == o->steps) putchar('\n');
        fflush(stdout);
    } else if (step % p->every == 0 || step == 1 || step == o->steps) {
        printf("step %zu/%zu loss %.4f acc %.2f%% lr %.2e tok/s %.0f left %s\n", step, o->steps,
               (double)loss, acc, lr, tokens_per_s, left);
        fflush(stdout);
    }
}

typedef struct run {
    attn_ctx *ctx;
    attn_rng *init_rng, *data_rng, *eval_rng, *dropout_rng;
    attn_model *model;
    attn_optimizer *opt;
    int32_t *tokens, *targets;
    float *logits;
    cli_outputs out; /* --save's file */
    size_t save_at;
} run;

static void run_free(run *r) {
    cli_outputs_free(&r->out);
    attn_optimizer_free(r->opt);
    attn_model_free(r->model);
    attn_rng_free(r->init_rng);
    attn_rng_free(r->data_rng);
    attn_rng_free(r->eval_rng);
    attn_rng_free(r->dropout_rng);
    free(r->tokens);
    free(r->targets);
    free(r->logits);
    attn_ctx_free(r->ctx);
}

/* Accuracy on held-out sequences, in eval mode without gradients;
 * *evaluated of them: fewer where a signal stops it between batches. */
static int evaluate(run *r, const train_options *o, double *accuracy, size_t *evaluated) {
    const attn_model_config *c = &o->model;
    size_t correct = 0, scored = 0, done = 0;
    if (attn_model_set_training(r->model, false) != ATTN_OK ||
        attn_model_set_grad_enabled(r->model, false) != ATTN_OK)
        return cli_library_error(r->ctx, "train");
    while (done < o->eval_sequences && !cli_interrupt_pending()) {
        size_t b = o->eval_sequences - done < o->batch ? o->eval_sequences - done : o->batch;
        if (attn_task_batch(r->ctx, o->task, c->vocab_size, c->context_length, r->eval_rng, b,
                            r->tokens, r->targets, NULL) != ATTN_OK ||
            attn_model_forward(r->model, r->tokens, NULL, b, c->context_length, r->logits, NULL,
                               NULL) != ATTN_OK)
            return cli_library_error(r->ctx, "held-out evaluation");
        count_correct(r->logits, r->targets, b * c->context_length, c->vocab_size, &correct,
                      &scored);
        done += b;
    }
    *evaluated = done;
    *accuracy = scored ? (double)correct / (double)scored : 0.0;
    if (attn_model_set_training(r->model, true) != ATTN_OK ||
        attn_model_set_grad_enabled(r->model, true) != ATTN_OK)
        return cli_library_error(r->ctx, "train");
    return CLI_OK;
}

static int train(run *r, const train_options *o) {
    const attn_model_config *c = &o->model;
    size_t T = c->context_length, V = c->vocab_size, params_count;
    const attn_param *params;
    if (attn_model_params(r->model, &params, &params_count) != ATTN_OK)
        return cli_library_error(r->ctx, "train");
    progress p = {.live = isatty(fileno(stdout)) != 0, .every = o->log_every, .start = cli_now_seconds()};
    for (size_t step = 1; step <= o->steps; step++) {
        /* the safe point: between steps */
        int sig = cli_interrupt_pending();
        if (sig) {
            if (p.live && step > 1) putchar('\n');
            fflush(stdout);
            cli_note("train: interrupted (%s) after step %zu of %zu; nothing evaluated or saved",
                     cli_interrupt_name(sig), step - 1, o->steps);
            return cli_interrupt_status(sig);
        }
        double lr = scheduled_lr(o, step);
        float loss;
        size_t correct = 0, scored = 0;
        if (attn_task_batch(r->ctx, o->task, V, T, r->data_rng, o->batch, r->tokens, r->targets,
                            NULL) != ATTN_OK ||
            attn_model_zero_grad(r->model) != ATTN_OK ||
            attn_model_forward(r->model, r->tokens, r->targets, o->batch, T, r->logits, &loss,
                               r->dropout_rng) != ATTN_OK ||
            attn_model_backward(r->model) != ATTN_OK ||
            (o->clip > 0.0 &&
             attn_clip_grad_norm(r->ctx, params, params_count, o->clip, NULL) != ATTN_OK) ||
            attn_optimizer_set_lr(r->opt, lr) != ATTN_OK || attn_optimizer_step(r->opt) != ATTN_OK)
            return cli_library_error(r->ctx, "train");
        if (!isfinite(loss)) {
            if (p.live) putchar('\n');
            /* a NaN's sign says nothing: "nan" as attn pretrain and Python write it */
            const char *value = isnan(loss) ? "nan" : loss > 0 ? "inf" : "-inf";
            /* --lr is the suspect unless other optimizer settings were given */
            bool others = o->momentum_set || o->weight_decay_set || o->clip_set;
            return cli_failure("train: the loss is %s at step %zu (try a lower --lr%s)", value,
                               step, others ? " or other optimizer settings" : "");
        }
        count_correct(r->logits, r->targets, o->batch * T, V, &correct, &scored);
        report(&p, o, step, loss, correct, scored, lr);
    }
    double elapsed = cli_now_seconds() - p.start;
    double accuracy = 0.0;
    size_t evaluated = 0;
    int rc = evaluate(r, o, &accuracy, &evaluated);
    if (rc != CLI_OK) return rc;
    char wall[32];
    cli_format_duration(elapsed, wall, sizeof wall);
    printf("trained %zu steps in %.1f s (%s)\n", o->steps, elapsed, wall);
    if (o->save) {
        /* written whole to the temporary now; in place once everything is
         * printed (cli_outputs_commit), so that a failed stdout leaves no
         * file new or changed */
        if (attn_model_save_to(r->model, cli_outputs_file(&r->out, r->save_at, NULL),
                               o->save) != ATTN_OK)
            return cli_library_error(r->ctx, "--save");
        if ((rc = cli_outputs_close(&r->out)) != CLI_OK) return rc;
        printf("saved %zu parameters to %s (safetensors)\n", attn_model_num_scalars(r->model),
               o->save);
    }
    int sig = cli_interrupt_pending();
    if (sig && evaluated < o->eval_sequences) {
        /* the model is trained whole (and saved): only the evaluation stops */
        if (o->save && (rc = cli_outputs_commit(&r->out, true)) != CLI_OK) return rc;
        fflush(stdout);
        cli_note("train: interrupted (%s) in the held-out evaluation after %zu of %zu "
                 "sequences%s",
                 cli_interrupt_name(sig), evaluated, o->eval_sequences,
                 o->save ? "; the trained model is saved" : "");
        return cli_interrupt_status(sig);
    }
    printf("held-out accuracy: %.2f%% (answer tokens, %zu sequences)\n", 100.0 * accuracy,
           o->eval_sequences);
    return o->save ? cli_outputs_commit(&r->out, true) : CLI_OK;
}

/* The options with their defaults, parsed and checked. */
static int parse_args(int argc, char **argv, train_options *o) {
    *o = (train_options){
        .task = ATTN_TASK_INDUCTION,
        .model = {.vocab_size = DEFAULT_VOCAB, .context_length = DEFAULT_CONTEXT,
                  .d_model = DEFAULT_D_MODEL, .n_layers = DEFAULT_LAYERS,
                  .n_heads = DEFAULT_HEADS, .attention = ATTN_MODULE_MHA},
        .steps = DEFAULT_STEPS, .batch = DEFAULT_BATCH, .eval_sequences = DEFAULT_EVAL_SEQUENCES,
        .threads = cli_default_threads(), .optimizer = ATTN_OPTIMIZER_ADAMW,
        .clip = DEFAULT_CLIP, .seed = 1,
    };
    int rc = parse_options(argc, argv, o);
    if (rc != CLI_OK) return rc;
    if (!o->warmup_set) o->warmup = o->steps / 10;
    if (o->warmup > o->steps)
        return cli_usage_error("--warmup (%zu) exceeds --steps (%zu)", o->warmup, o->steps);
    if (!o->log_every_set) o->log_every = o->steps >= 20 ? o->steps / 20 : 1;
    if (o->optimizer != ATTN_OPTIMIZER_SGD && o->momentum_set)
        return cli_usage_error("--momentum applies to --optimizer sgd only");
    return CLI_OK;
}

static int parse_train(int argc, char **argv) {
    train_options o;
    return parse_args(argc, argv, &o);
}

static int run_train(int argc, char **argv) {
    train_options o;
    int rc = parse_args(argc, argv, &o);
    if (rc != CLI_OK) return rc;

    attn_optimizer_config oc = attn_optimizer_defaults(o.optimizer);
    oc.lr = o.lr_set ? o.lr : o.optimizer == ATTN_OPTIMIZER_ADAMW ? DEFAULT_ADAMW_LR : DEFAULT_SGD_LR;
    o.lr = oc.lr;
    if (o.weight_decay_set) oc.weight_decay = o.weight_decay;
    if (o.optimizer == ATTN_OPTIMIZER_SGD) oc.momentum = o.momentum_set ? o.momentum : DEFAULT_SGD_MOMENTUM;

    run r = {0};
    attn_ctx_config cc = {.num_threads = o.threads};
    if ((rc = cli_ctx_new(&cc, &r.ctx)) != CLI_OK) return rc;
    /* A --save path that cannot be written fails now, not after the last
     * step of training; its temporary replaces the file whole, after the
     * run's last line, or not at all (cli_outputs). */
    cli_outputs_init(&r.out, r.ctx);
    if (o.save && (rc = cli_outputs_add(&r.out, "--save", o.save, &r.save_at)) != CLI_OK) {
        run_free(&r);
        return rc;
    }
    size_t cells = o.batch * o.model.context_length;
    attn_status made = ATTN_OK;
    const attn_param *params = NULL;
    size_t count = 0;
    if (o.batch > ((size_t)1 << 20) || o.model.context_length > ((size_t)1 << 20) ||
        o.model.vocab_size > ((size_t)1 << 24) ||
        cells > (size_t)-1 / sizeof(float) / o.model.vocab_size) {
        rc = cli_usage_error("--batch %zu x --context %zu x --vocab %zu is too large", o.batch,
                             o.model.context_length, o.model.vocab_size);
    } else if (attn_task_check(r.ctx, o.task, o.model.vocab_size, o.model.context_length) != ATTN_OK) {
        rc = cli_usage_error("%s (see --vocab, --context)", attn_ctx_last_error(r.ctx));
    } else if (attn_rng_new(r.ctx, o.seed, &r.init_rng) != ATTN_OK ||
               attn_rng_new(r.ctx, o.seed + 1, &r.data_rng) != ATTN_OK ||
               attn_rng_new(r.ctx, o.seed + 2, &r.eval_rng) != ATTN_OK ||
               attn_rng_new(r.ctx, o.seed + 3, &r.dropout_rng) != ATTN_OK) {
        rc = cli_library_error(r.ctx, "train");
    } else if ((made = attn_model_new(r.ctx, &o.model, r.init_rng, &r.model)) != ATTN_OK ||
               attn_model_params(r.model, &params, &count) != ATTN_OK) {
        /* a config the options give that no model has is the options' fault */
        rc = made == ATTN_ERR_INVALID || made == ATTN_ERR_SHAPE
                 ? cli_usage_error("%s (see --d-model, --heads, --layers)",
                                   attn_ctx_last_error(r.ctx))
                 : cli_library_error(r.ctx, "train");
    } else {
        r.tokens = malloc(cells * sizeof *r.tokens);
        r.targets = malloc(cells * sizeof *r.targets);
        r.logits = malloc(cells * o.model.vocab_size * sizeof *r.logits);
        if (!r.tokens || !r.targets || !r.logits)
            rc = cli_failure("out of memory for a batch of %zu x %zu", o.batch,
                             o.model.context_length);
        else if (attn_optimizer_new(r.ctx, &oc, params, count, &r.opt) != ATTN_OK)
            rc = cli_library_error(r.ctx, "--optimizer");
        else {
            printf("task %s: vocab %zu, context %zu; model: %zu layers, %zu heads, d_model %zu, "
                   "%s attention%s, dropout %g, %zu parameters\n",
                   attn_task_name(o.task), o.model.vocab_size, o.model.context_length,
                   o.model.n_layers, o.model.n_heads, o.model.d_model,
                   attn_module_kind_name(o.model.attention),
                   o.model.mlp ? " + mlp" : "", o.model.dropout, attn_model_num_scalars(r.model));
            if (o.optimizer == ATTN_OPTIMIZER_ADAMW)
                printf("adamw lr %g (warmup %zu, cosine decay), betas %g, %g, eps %g", oc.lr,
                       o.warmup, oc.beta1, oc.beta2, oc.eps);
            else
                printf("sgd lr %g (warmup %zu, cosine decay), momentum %g", oc.lr, o.warmup,
                       oc.momentum);
            printf(", weight decay %g, clip %g; %zu steps of %zu sequences; seed %llu; "
                   "%zu threads\n",
                   oc.weight_decay, o.clip, o.steps, o.batch, (unsigned long long)o.seed,
                   o.threads);
            fflush(stdout);
            cli_interrupt_cooperate(true);
            rc = train(&r, &o);
            rc = cli_interrupt_finish("train", "the model is trained", rc);
        }
    }
    run_free(&r);
    return rc;
}

const cli_command cli_train_command = {
    .name = "train",
    .summary = "train a small language model on copy, reverse, sort or induction",
    .help = train_help,
    .value_options = options,
    .parse = parse_train,
    .run = run_train,
};
