/*
 * pretrain.c — the book's chapter-5 training loop (gpt_train.py's
 * train_model_simple with evaluate_model, calc_loss_loader and
 * generate_and_print_sample) as a run stepped through events.
 *
 * The draws follow PyTorch's: each pass over a loader begins with its
 * seeds drawn from the global generator (attn_data_loader_begin), the
 * training forward draws its dropout from the same generator, and the
 * evaluation and the greedy sample draw nothing. evaluate_model iterates
 * train_loader inside the epoch's own pass over it, so that inner pass has
 * a loader of its own (eval_loader), made alike.
 *
 * The run is a small state machine, so that it can be saved between any
 * two events and resumed there:
 *   STEP    the next call takes an optimizer step (beginning the epoch's
 *           pass first), or gives DONE after the last epoch
 *   EVAL    the step just taken is due an evaluation
 *   SAMPLE  the epoch's last step is done: the sample, then the next epoch
 */
#include "internal.h"
#include "io/file.h"
#include "modules/module.h"
#include "train/model.h"
#include "train/text_data.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_START_CONTEXT "Every effort moves you"
#define STATE_MAGIC "ATTNPRT1"
#define STATE_VERSION 2u
#define STATE_SUFFIX ".state"

enum { PHASE_STEP = 0, PHASE_EVAL = 1, PHASE_SAMPLE = 2, PHASE_FAILED = 3 };

struct attn_pretrain {
    attn_ctx *ctx;
    attn_model *model;
    attn_tokenizer *tok;
    attn_rng *rng;
    attn_pretrain_options o;
    char *start_context; /* a copy; NULL for no sample */
    size_t vocab_size, context_length;

    attn_text_dataset *train, *val;
    attn_data_loader *train_loader, *eval_loader, *val_loader;
    attn_optimizer *opt;
    const attn_param *params;
    size_t param_count, steps_per_epoch, train_windows;
    uint64_t train_hash, val_hash;

    int64_t *order;            /* this epoch's training order (train_windows) */
    size_t *indices;           /* one batch's, as the loader gives them */
    int32_t *inputs, *targets; /* one batch, (batch_size, max_length) */
    int32_t *gen_ids;          /* the sample's ids: the context, then new ones */
    size_t gen_capacity;
    float *logits;             /* (context_length, vocab_size) */
    attn_lm *sampler;          /* the GPT model's weights for the sample; NULL until needed */
    bool sampler_failed;       /* it could not be made: samples recompute every position */
    char *sample;
    size_t sample_capacity, sample_length;

    /* where the run stands (saved in checkpoints) */
    int phase;
    size_t epoch;       /* 0-based: the epoch under way, or the next */
    size_t batch;       /* the epoch's next batch */
    bool epoch_begun;   /* its loader pass has drawn its order */
    size_t steps_taken; /* global_step + 1 */
    uint64_t tokens_seen;
    double step_loss;
    size_t history_count, history_capacity;
    uint64_t *history_tokens;
    double *history_train, *history_val;

    attn_status failed_status;
    char failed_message[160];
};

attn_pretrain_options attn_pretrain_defaults(void) {
    return (attn_pretrain_options){.epochs = 10, .batch_size = 2, .max_length = 0, .stride = 0,
                                   .train_ratio = 0.9, .lr = 0.0004, .weight_decay = 0.1,
                                   .eval_freq = 5, .eval_iter = 5, .start_context = NULL,
                                   .sample_tokens = 50};
}

/* FNV-1a, 64 bits: identifies the data and the weights in a checkpoint. */
#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

static uint64_t fnv_bytes(uint64_t h, const void *bytes, size_t n) {
    const unsigned char *p = bytes;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * FNV_PRIME;
    return h;
}

/* The hash of n 32-bit words, little-endian whatever the host. */
static uint64_t fnv_words(uint64_t h, const void *words, size_t n) {
    const uint32_t *w = words;
    for (size_t i = 0; i < n; i++) {
        unsigned char le[4] = {(unsigned char)w[i], (unsigned char)(w[i] >> 8),
                               (unsigned char)(w[i] >> 16), (unsigned char)(w[i] >> 24)};
        h = fnv_bytes(h, le, 4);
    }
    return h;
}

static uint64_t weights_hash(const attn_pretrain *r) {
    uint64_t h = FNV_OFFSET;
    for (size_t i = 0; i < r->param_count; i++)
        h = fnv_words(h, r->params[i].data, r->params[i].numel);
    return h;
}

/* What the weights do not show of the model (a window, a dropout rate,
 * the attention's kind, RoPE's constants), as named numbers. The state
 * keeps them and resume finds them as the state saw them, or names the one
 * that moved: a model made from a checkpoint's metadata (attn pretrain
 * --resume) would otherwise train on with an edited window or rate, its
 * weights' hash unchanged. */
#define ARCH_FIELDS 12
typedef struct arch_field {
    const char *name;
    double value;
} arch_field;

static size_t architecture_of(const attn_model *m, arch_field f[ARCH_FIELDS]) {
    size_t n = 0;
#define FIELD(key, v) (f[n++] = (arch_field){key, (double)(v)})
    attn_gpt_config g;
    attn_llama3_config l;
    if (attn_model_is_gpt(m) && attn_model_get_gpt_config(m, &g) == ATTN_OK) {
        FIELD("emb_dim", g.emb_dim);
        FIELD("n_heads", g.n_heads);
        FIELD("n_layers", g.n_layers);
        FIELD("drop_rate", g.drop_rate);
        FIELD("qkv_bias", g.qkv_bias);
        FIELD("attention", g.attention);
        FIELD("n_kv_groups", g.n_kv_groups);
        /* latent_dim 0 is the book's None: the width it stands for */
        FIELD("latent_dim", g.attention == ATTN_GPT_MLA
                                ? attn_mla_latent_width(g.emb_dim, g.latent_dim)
                                : 0);
        FIELD("sliding_window_size", g.sliding_window_size);
        FIELD("sliding_window_stride", g.sliding_window_stride);
    } else if (attn_model_is_llama3(m) && attn_model_get_llama3_config(m, &l) == ATTN_OK) {
        FIELD("emb_dim", l.emb_dim);
        FIELD("n_heads", l.n_heads);
        FIELD("n_layers", l.n_layers);
        FIELD("hidden_dim", l.hidden_dim);
        FIELD("n_kv_groups", l.n_kv_groups);
        FIELD("rope_base", l.rope_base);
        FIELD("rope_factor", l.rope_factor);
        FIELD("rope_low_freq_factor", l.rope_low_freq_factor);
        FIELD("rope_high_freq_factor", l.rope_high_freq_factor);
        FIELD("rope_original_context_length", l.rope_original_context_length);
    } else {
        attn_model_config c = attn_model_get_config(m);
        FIELD("d_model", c.d_model);
        FIELD("n_layers", c.n_layers);
        FIELD("n_heads", c.n_heads);
        FIELD("attention", c.attention);
        FIELD("mlp", c.mlp);
        FIELD("dropout", c.dropout);
        FIELD("qkv_bias", c.qkv_bias);
    }
#undef FIELD
    return n;
}

void attn_pretrain_free(attn_pretrain *r) {
    if (!r) return;
    attn_free(r->start_context);
    attn_text_dataset_free(r->train);
    attn_text_dataset_free(r->val);
    attn_data_loader_free(r->train_loader);
    attn_data_loader_free(r->eval_loader);
    attn_data_loader_free(r->val_loader);
    attn_optimizer_free(r->opt);
    attn_free(r->order);
    attn_free(r->indices);
    attn_free(r->inputs);
    attn_free(r->targets);
    attn_free(r->gen_ids);
    attn_free(r->logits);
    attn_lm_free(r->sampler);
    attn_free(r->sample);
    attn_free(r->history_tokens);
    attn_free(r->history_train);
    attn_free(r->history_val);
    attn_free(r);
}

/* ---- checking the options --------------------------------------------------- */

static attn_status check_options(attn_ctx *ctx, const attn_pretrain_options *o,
                                 size_t context_length) {
    const char *fn = "attn_pretrain_new";
    if (o->batch_size == 0)
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: batch_size is 0 (need a positive one)", fn);
    if (o->eval_freq == 0)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: eval_freq is 0 (global_step %% eval_freq needs a positive one)", fn);
    if (o->eval_iter == 0)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: eval_iter is 0 (calc_loss_loader would divide by 0 batches)", fn);
    if (o->max_length > context_length)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: max_length %zu is longer than the model's context_length %zu", fn,
                         o->max_length, context_length);
    if (!(o->lr > 0.0) || !isfinite(o->lr))
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: lr %g must be finite and > 0", fn, o->lr);
    if (!(o->weight_decay >= 0.0) || !isfinite(o->weight_decay))
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: weight_decay %g must be finite and >= 0", fn,
                         o->weight_decay);
    if (!(o->train_ratio > 0.0 && o->train_ratio <= 1.0))
        return attn_fail(ctx, ATTN_ERR_INVALID, "%s: train_ratio %g must be in (0, 1]", fn,
                         o->train_ratio);
    return ATTN_OK;
}

/* The two parts of the text as datasets, checked for enough windows. */
static attn_status make_datasets(attn_pretrain *r, const char *text, size_t length) {
    const char *fn = "attn_pretrain_new";
    const attn_pretrain_options *o = &r->o;
    size_t split = 0;
    attn_status st = attn_text_split(r->ctx, text, length, o->train_ratio, &split);
    if (st == ATTN_OK)
        st = attn_text_dataset_encode(r->ctx, r->tok, text, split, o->max_length, o->stride,
                                      &r->train);
    if (st == ATTN_OK)
        st = attn_text_dataset_encode(r->ctx, r->tok, text + split, length - split,
                                      o->max_length, o->stride, &r->val);
    if (st != ATTN_OK) return st;
    size_t train_ids = attn_text_dataset_num_ids(r->train);
    size_t val_ids = attn_text_dataset_num_ids(r->val);
    r->train_windows = attn_text_dataset_len(r->train);
    if (r->train_windows < o->batch_size)
        return attn_fail(r->ctx, ATTN_ERR_INVALID,
                         "%s: the training text (train_ratio %g) is %zu tokens: %zu windows of "
                         "max_length %zu (stride %zu), fewer than one batch of %zu",
                         fn, o->train_ratio, train_ids, r->train_windows, o->max_length,
                         o->stride, o->batch_size);
    if (o->train_ratio < 1.0 && attn_text_dataset_len(r->val) == 0)
        return attn_fail(r->ctx, ATTN_ERR_INVALID,
                         "%s: the validation text (the last %g of it) is %zu tokens: no window "
                         "of max_length %zu (it needs %zu)",
                         fn, 1.0 - o->train_ratio, val_ids, o->max_length, o->max_length + 1);
    r->steps_per_epoch = r->train_windows / o->batch_size;
    size_t total;
    if (!attn_mul_size(r->steps_per_epoch, o->epochs, &total))
        return attn_fail(r->ctx, ATTN_ERR_INVALID,
                         "%s: epochs %zu of %zu steps each overflow a step count", fn, o->epochs,
                         r->steps_per_epoch);
    r->train_hash = fnv_words(FNV_OFFSET, attn_text_dataset_ids(r->train), train_ids);
    r->val_hash = fnv_words(FNV_OFFSET, attn_text_dataset_ids(r->val), val_ids);
    return ATTN_OK;
}

/* The sample's context ids, encoded once (tokenizer.encode(start_context)). */
static attn_status encode_start_context(attn_pretrain *r) {
    const char *fn = "attn_pretrain_new";
    size_t len = strlen(r->start_context), count = 0;
    /* a byte-level BPE token covers at least one byte */
    size_t capacity;
    if (!attn_add_size(len, r->o.sample_tokens, &capacity) || capacity > (size_t)INT32_MAX)
        return attn_fail(r->ctx, ATTN_ERR_OVERFLOW,
                         "%s: start_context (%zu bytes) + sample_tokens %zu is too long", fn, len,
                         r->o.sample_tokens);
    r->gen_ids = attn_calloc(capacity ? capacity : 1, sizeof *r->gen_ids);
    if (!r->gen_ids)
        return attn_fail(r->ctx, ATTN_ERR_NO_MEMORY, "%s: no memory for %zu sample ids", fn,
                         capacity);
    /* the book's text_to_token_ids: <|endoftext|> allowed, as in the text */
    attn_status st = attn_encode_with_endoftext(r->ctx, "attn_pretrain_new: start_context",
                                                r->tok, r->start_context, len, r->gen_ids,
                                                capacity, &count);
    if (st != ATTN_OK) return st;
    r->gen_capacity = count; /* the context's length; the sample adds sample_tokens */
    return ATTN_OK;
}

attn_status attn_training_fits_memory(attn_ctx *ctx, const char *who, const attn_param *params,
                                      size_t count, size_t limit) {
    size_t floats = 0;
    for (size_t i = 0; i < count; i++) floats += params[i].numel;
    double bytes = 16.0 * (double)floats;
    if (limit && bytes > (double)limit)
        return attn_fail(ctx, ATTN_ERR_NO_MEMORY,
                         "%s: the model's %zu parameters, their gradients and AdamW's two "
                         "moments take %.0f bytes, past this machine's memory (%zu bytes)",
                         who, floats, bytes, limit);
    return ATTN_OK;
}

attn_status attn_pretrain_new(attn_ctx *ctx, attn_model *model, attn_tokenizer *tok,
                              const char *text, size_t length, const attn_pretrain_options *opts,
                              attn_rng *rng, attn_pretrain **out) {
    const char *fn = "attn_pretrain_new";
    if (out) *out = NULL;
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!model || !tok || !rng || !out || (!text && length > 0))
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: %s is NULL", fn,
                         !model ? "model" : !tok ? "tok" : !rng ? "rng" : !out ? "out" : "text");
    attn_model_config mc = attn_model_get_config(model);
    attn_pretrain_options o = opts ? *opts : attn_pretrain_defaults();
    if (o.max_length == 0) o.max_length = mc.context_length;
    if (o.stride == 0) o.stride = o.max_length;
    attn_status st = check_options(ctx, &o, mc.context_length);
    if (st != ATTN_OK) return st;
    size_t tok_vocab = attn_tokenizer_vocab_size(tok);
    if (tok_vocab != mc.vocab_size)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "%s: the tokenizer's vocabulary is %zu tokens but the model's "
                         "vocab_size is %zu",
                         fn, tok_vocab, mc.vocab_size);
    size_t cells, logit_count;
    if (!attn_mul_size(o.batch_size, o.max_length, &cells) ||
        !attn_mul_size(mc.context_length, mc.vocab_size, &logit_count) ||
        !attn_floats_fit(logit_count) || cells > (size_t)-1 / sizeof(int32_t))
        return attn_fail(ctx, ATTN_ERR_OVERFLOW,
                         "%s: batch_size %zu x max_length %zu (or the logits) overflow", fn,
                         o.batch_size, o.max_length);

    attn_pretrain *r = attn_calloc(1, sizeof *r);
    if (!r) return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory", fn);
    r->ctx = ctx;
    r->model = model;
    r->tok = tok;
    r->rng = rng;
    r->o = o;
    r->vocab_size = mc.vocab_size;
    r->context_length = mc.context_length;
    const char *start = o.start_context ? o.start_context : DEFAULT_START_CONTEXT;
    if (start[0] != '\0') {
        size_t n = strlen(start) + 1;
        r->start_context = attn_malloc(n);
        if (!r->start_context) {
            attn_pretrain_free(r);
            return attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: out of memory", fn);
        }
        memcpy(r->start_context, start, n);
    }
    r->o.start_context = r->start_context;

    st = make_datasets(r, text, length);
    if (st == ATTN_OK && r->start_context) st = encode_start_context(r);
    attn_optimizer_config oc = attn_optimizer_defaults(ATTN_OPTIMIZER_ADAMW);
    oc.lr = o.lr;
    oc.weight_decay = o.weight_decay;
    if (st == ATTN_OK) st = attn_model_params(model, &r->params, &r->param_count);
    if (st == ATTN_OK)
        st = attn_training_fits_memory(ctx, fn, r->params, r->param_count,
                                       attn_physical_memory());
    if (st == ATTN_OK) st = attn_optimizer_new(ctx, &oc, r->params, r->param_count, &r->opt);
    if (st == ATTN_OK)
        st = attn_data_loader_new(ctx, r->train_windows, o.batch_size, true, true,
                                  &r->train_loader);
    if (st == ATTN_OK)
        st = attn_data_loader_new(ctx, r->train_windows, o.batch_size, true, true,
                                  &r->eval_loader);
    if (st == ATTN_OK)
        st = attn_data_loader_new(ctx, attn_text_dataset_len(r->val), o.batch_size, false, false,
                                  &r->val_loader);
    if (st == ATTN_OK) {
        r->order = attn_calloc(r->train_windows, sizeof *r->order);
        r->indices = attn_calloc(o.batch_size, sizeof *r->indices);
        r->inputs = attn_calloc(cells, sizeof *r->inputs);
        r->targets = attn_calloc(cells, sizeof *r->targets);
        r->logits = r->start_context ? attn_alloc_floats(logit_count) : NULL;
        if (!r->order || !r->indices || !r->inputs || !r->targets || (r->start_context && !r->logits))
            st = attn_fail(ctx, ATTN_ERR_NO_MEMORY, "%s: no memory for a batch of %zu x %zu", fn,
                           o.batch_size, o.max_length);
    }
    if (st != ATTN_OK) {
        attn_pretrain_free(r);
        return st;
    }
    r->phase = PHASE_STEP;
    r->step_loss = NAN;
    *out = r;
    return ATTN_OK;
}

/* ---- the loop ------------------------------------------------------------------ */

static void fill_event(const attn_pretrain *r, attn_pretrain_event *ev,
                       attn_pretrain_event_kind kind, size_t epoch) {
    *ev = (attn_pretrain_event){
        .kind = kind,
        .epoch = epoch + 1,
        .step = r->steps_taken ? r->steps_taken - 1 : 0,
        .steps_per_epoch = r->steps_per_epoch,
        .total_steps = r->steps_per_epoch * r->o.epochs,
        .tokens_seen = r->tokens_seen,
        .step_loss = r->step_loss,
        .train_loss = NAN,
        .val_loss = NAN,
    };
}

/* Fails the run: this call and every later one return status. */
static attn_status run_fail(attn_pretrain *r, attn_status status) {
    r->phase = PHASE_FAILED;
    r->failed_status = status;
    snprintf(r->failed_message, sizeof r->failed_message, "%s", attn_ctx_last_error(r->ctx));
    return status;
}

/* optimizer.zero_grad(); loss = calc_loss_batch(...); loss.backward();
 * optimizer.step(), on the epoch's next batch. */
static attn_status train_step(attn_pretrain *r) {
    size_t bs = r->o.batch_size, L = r->o.max_length;
    /* model.train() with gradients on, as PyTorch's steps run, before
     * every step: the caller's model may come in eval mode or with
     * gradients off, and a resumed run may begin in the middle of an epoch,
     * where no epoch's beginning has set them */
    attn_status st = attn_model_set_training(r->model, true);
    if (st == ATTN_OK) st = attn_model_set_grad_enabled(r->model, true);
    if (st != ATTN_OK) return st;
    if (!r->epoch_begun) {
        /* for input_batch, target_batch in train_loader: the pass's draws */
        st = attn_data_loader_begin(r->train_loader, r->rng);
        for (size_t b = 0; st == ATTN_OK && b < r->steps_per_epoch; b++) {
            size_t rows = 0;
            st = attn_data_loader_batch(r->train_loader, b, r->indices, &rows);
            for (size_t k = 0; st == ATTN_OK && k < rows; k++)
                r->order[b * bs + k] = (int64_t)r->indices[k];
        }
        if (st != ATTN_OK) return st;
        r->epoch_begun = true;
        r->batch = 0;
    }
    for (size_t k = 0; k < bs; k++) {
        st = attn_text_dataset_get(r->train, (size_t)r->order[r->batch * bs + k],
                                   r->inputs + k * L, r->targets + k * L);
        if (st != ATTN_OK) return st;
    }
    float loss = NAN;
    st = attn_optimizer_zero_grad(r->opt);
    if (st == ATTN_OK)
        st = attn_model_forward(r->model, r->inputs, r->targets, bs, L, NULL, &loss, r->rng);
    if (st != ATTN_OK) return st;
    if (!isfinite(loss))
        return attn_fail(r->ctx, ATTN_ERR_INVALID, "step %zu: loss is %s", r->steps_taken,
                         isnan(loss) ? "nan" : loss > 0 ? "inf" : "-inf");
    st = attn_model_backward(r->model);
    if (st == ATTN_OK) st = attn_optimizer_step(r->opt);
    if (st != ATTN_OK) return st;
    r->tokens_seen += (uint64_t)bs * L;
    r->steps_taken++;
    r->batch++;
    r->step_loss = (double)loss;
    return ATTN_OK;
}

/* calc_loss_loader(loader, num_batches=eval_iter): NaN for an empty loader. */
static attn_status loader_loss(attn_pretrain *r, const attn_text_dataset *d, attn_data_loader *l,
                               double *out) {
    size_t n = attn_data_loader_len(l);
    if (n == 0) {
        *out = NAN;
        return ATTN_OK;
    }
    if (n > r->o.eval_iter) n = r->o.eval_iter;
    attn_status st = attn_data_loader_begin(l, r->rng);
    double total = 0.0;
    for (size_t b = 0; st == ATTN_OK && b < n; b++) {
        size_t rows = 0;
        float loss = NAN;
        st = attn_text_dataset_batch(d, l, b, r->inputs, r->targets, &rows);
        if (st == ATTN_OK)
            st = attn_model_forward(r->model, r->inputs, r->targets, rows, r->o.max_length, NULL,
                                    &loss, NULL);
        total += (double)loss; /* loss.item(), summed as a Python float */
    }
    *out = total / (double)n;
    return st;
}

/* model.eval() and torch.no_grad() on, or back to training. */
static attn_status eval_mode(attn_pretrain *r, bool on) {
    attn_status st = attn_model_set_training(r->model, !on);
    if (st == ATTN_OK) st = attn_model_set_grad_enabled(r->model, !on);
    return st;
}

/* Back to training after work in eval mode that returned st: st with its
 * message, which the mode's setters would clear, or the setters' status. */
static attn_status eval_mode_off(attn_pretrain *r, attn_status st) {
    char message[ATTN_ERROR_CAPACITY];
    snprintf(message, sizeof message, "%s", attn_ctx_last_error(r->ctx));
    attn_status back = eval_mode(r, false);
    if (st != ATTN_OK) return attn_fail(r->ctx, st, "%s", message);
    return back;
}

static attn_status evaluate(attn_pretrain *r, double *train_loss, double *val_loss) {
    attn_status st = eval_mode(r, true);
    if (st == ATTN_OK) st = loader_loss(r, r->train, r->eval_loader, train_loss);
    if (st == ATTN_OK) st = loader_loss(r, r->val, r->val_loader, val_loss);
    if ((st = eval_mode_off(r, st)) != ATTN_OK) return st;
    if (r->history_count == r->history_capacity) {
        size_t cap = r->history_capacity ? 2 * r->history_capacity : 64;
        uint64_t *t = attn_realloc(r->history_tokens, cap * sizeof *t);
        if (t) r->history_tokens = t;
        double *a = attn_realloc(r->history_train, cap * sizeof *a);
        if (a) r->history_train = a;
        double *v = attn_realloc(r->history_val, cap * sizeof *v);
        if (v) r->history_val = v;
        if (!t || !a || !v)
            return attn_fail(r->ctx, ATTN_ERR_NO_MEMORY, "pretrain: no memory for the history");
        r->history_capacity = cap;
    }
    r->history_tokens[r->history_count] = r->tokens_seen;
    r->history_train[r->history_count] = *train_loss;
    r->history_val[r->history_count] = *val_loss;
    r->history_count++;
    return ATTN_OK;
}

/* token_ids_to_text of the sample's n ids into r->sample. */
static attn_status decode_sample(attn_pretrain *r, size_t n) {
    attn_status st;
    for (;;) {
        size_t length = 0;
        st = attn_tokenizer_decode(r->tok, r->gen_ids, n, r->sample, r->sample_capacity, &length);
        if (st == ATTN_OK) {
            r->sample_length = length;
            return ATTN_OK;
        }
        if (st != ATTN_ERR_SHAPE || length <= r->sample_capacity) return st;
        char *grown = attn_realloc(r->sample, length + 1);
        if (!grown)
            return attn_fail(r->ctx, ATTN_ERR_NO_MEMORY, "pretrain: no memory for a %zu-byte sample",
                             length);
        r->sample = grown;
        r->sample_capacity = length + 1;
    }
}

/* The book's GPTModel as an attn_lm holding r->model's weights as they
 * are now (made on first use); false where it cannot be (not that model,
 * or no memory: the caller recomputes). */
static bool sampler_ready(attn_pretrain *r) {
    if (r->sampler_failed || !attn_model_is_gpt(r->model)) return false;
    if (!r->sampler) {
        attn_gpt_config g;
        attn_lm_config cfg = {0};
        bool made = attn_model_get_gpt_config(r->model, &g) == ATTN_OK;
        if (made) cfg = attn_model_lm_config_of_gpt(&g);
        if (!made || attn_lm_new(r->ctx, &cfg, NULL, &r->sampler) != ATTN_OK) {
            r->sampler = NULL;
            r->sampler_failed = true;
            attn_clear_error(r->ctx);
            return false;
        }
    }
    for (size_t i = 0; i < attn_lm_param_count(r->sampler); i++) {
        attn_param to, from;
        if (attn_lm_param_at(r->sampler, i, &to) != ATTN_OK ||
            attn_model_param(r->model, to.name, &from) != ATTN_OK || !to.data ||
            from.numel != to.numel) {
            attn_lm_free(r->sampler);
            r->sampler = NULL;
            r->sampler_failed = true;
            attn_clear_error(r->ctx);
            return false;
        }
        memcpy(to.data, from.data, to.numel * sizeof *to.data);
    }
    return true;
}

/* generate_text_simple(model, idx, max_new_tokens, context_size), greedy,
 * then token_ids_to_text. Where the whole sample fits the context (so
 * generate_text_simple crops nothing), the GPT model runs as an attn_lm
 * with a KV cache: each step computes its new token alone instead of every
 * position again, with logits equal to the full forward's but for the
 * order of their sums, so the argmax differs only where two logits tie to
 * float rounding. */
static attn_status generate_sample(attn_pretrain *r) {
    size_t n = r->gen_capacity, V = r->vocab_size;
    if (n > 0 && n + r->o.sample_tokens <= r->context_length && sampler_ready(r)) {
        size_t count = 0;
        attn_generate_args g = {.prompt = r->gen_ids,
                                .prompt_len = n,
                                .max_new_tokens = r->o.sample_tokens,
                                .out = r->gen_ids + n,
                                .count = &count};
        attn_status st = attn_lm_generate(r->sampler, &g);
        if (st != ATTN_OK) return st;
        n += count;
        return decode_sample(r, n);
    }
    attn_status st = eval_mode(r, true);
    for (size_t k = 0; st == ATTN_OK && k < r->o.sample_tokens; k++) {
        size_t window = n < r->context_length ? n : r->context_length;
        st = attn_model_forward(r->model, r->gen_ids + (n - window), NULL, 1, window, r->logits,
                                NULL, NULL);
        if (st != ATTN_OK) break;
        /* torch.argmax: the first of the largest (a NaN counts as largest) */
        const float *z = r->logits + (window - 1) * V;
        size_t best = 0;
        for (size_t v = 1; v < V && !isnan(z[best]); v++)
            if (z[v] > z[best] || isnan(z[v])) best = v;
        r->gen_ids[n++] = (int32_t)best;
    }
    if ((st = eval_mode_off(r, st)) != ATTN_OK) return st;
    return decode_sample(r, n);
}

attn_status attn_pretrain_next(attn_pretrain *r, attn_pretrain_event *ev) {
    if (!r) return ATTN_ERR_NULL;
    attn_clear_error(r->ctx);
    if (!ev) return attn_fail(r->ctx, ATTN_ERR_NULL, "attn_pretrain_next: ev is NULL");
    if (r->phase == PHASE_FAILED)
        return attn_fail(r->ctx, r->failed_status, "%s", r->failed_message);
    for (;;) {
        attn_status st;
        switch (r->phase) {
        case PHASE_STEP:
            if (r->epoch >= r->o.epochs) {
                fill_event(r, ev, ATTN_PRETRAIN_DONE, r->epoch ? r->epoch - 1 : 0);
                return ATTN_OK;
            }
            st = train_step(r);
            if (st != ATTN_OK) return run_fail(r, st);
            fill_event(r, ev, ATTN_PRETRAIN_STEP, r->epoch);
            if ((r->steps_taken - 1) % r->o.eval_freq == 0) r->phase = PHASE_EVAL;
            else if (r->batch == r->steps_per_epoch) r->phase = PHASE_SAMPLE;
            return ATTN_OK;
        case PHASE_EVAL: {
            double train_loss = NAN, val_loss = NAN;
            st = evaluate(r, &train_loss, &val_loss);
            if (st != ATTN_OK) return run_fail(r, st);
            fill_event(r, ev, ATTN_PRETRAIN_EVAL, r->epoch);
            ev->train_loss = train_loss;
            ev->val_loss = val_loss;
            r->phase = r->batch == r->steps_per_epoch ? PHASE_SAMPLE : PHASE_STEP;
            return ATTN_OK;
        }
        case PHASE_SAMPLE: {
            size_t epoch = r->epoch;
            if (r->start_context) {
                st = generate_sample(r);
                if (st != ATTN_OK) return run_fail(r, st);
            }
            r->epoch++;
            r->epoch_begun = false;
            r->batch = 0;
            r->phase = PHASE_STEP;
            if (!r->start_context) continue;
            fill_event(r, ev, ATTN_PRETRAIN_SAMPLE, epoch);
            ev->sample = r->sample;
            ev->sample_length = r->sample_length;
            return ATTN_OK;
        }
        default:
            return attn_fail(r->ctx, ATTN_ERR_INVALID, "attn_pretrain_next: bad phase %d",
                             r->phase);
        }
    }
}

attn_status attn_pretrain_history(const attn_pretrain *r, size_t *n,
                                  const uint64_t **tokens_seen, const double **train_losses,
                                  const double **val_losses) {
    if (!r) return ATTN_ERR_NULL;
    attn_clear_error(r->ctx);
    if (!n) return attn_fail(r->ctx, ATTN_ERR_NULL, "attn_pretrain_history: n is NULL");
    *n = r->history_count;
    if (tokens_seen) *tokens_seen = r->history_tokens;
    if (train_losses) *train_losses = r->history_train;
    if (val_losses) *val_losses = r->history_val;
    return ATTN_OK;
}

/* ---- checkpoints ------------------------------------------------------------------ */

/* A little-endian writer into an attn_file through a buffer, hashing
 * every byte for the trailer. */
typedef struct state_writer {
    attn_ctx *ctx;
    attn_file *file;
    unsigned char buf[1 << 16];
    size_t used;
    uint64_t hash;
    attn_status st;
} state_writer;

static void w_flush(state_writer *w) {
    if (w->st == ATTN_OK && w->used > 0) w->st = attn_file_write(w->ctx, w->file, w->buf, w->used);
    w->used = 0;
}

static void w_bytes(state_writer *w, const void *bytes, size_t n) {
    const unsigned char *p = bytes;
    w->hash = fnv_bytes(w->hash, p, n);
    while (n > 0) {
        if (w->used == sizeof w->buf) w_flush(w);
        size_t take = sizeof w->buf - w->used < n ? sizeof w->buf - w->used : n;
        memcpy(w->buf + w->used, p, take);
        w->used += take;
        p += take;
        n -= take;
    }
}

static void w_u64(state_writer *w, uint64_t v) {
    unsigned char le[8];
    for (int i = 0; i < 8; i++) le[i] = (unsigned char)(v >> (8 * i));
    w_bytes(w, le, 8);
}

static void w_f64(state_writer *w, double x) {
    uint64_t v;
    memcpy(&v, &x, sizeof v);
    w_u64(w, v);
}

static void w_u32(state_writer *w, uint32_t v) {
    unsigned char le[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                           (unsigned char)(v >> 24)};
    w_bytes(w, le, 4);
}

static char *state_path(attn_ctx *ctx, const char *path) {
    size_t n = strlen(path), bytes = n + sizeof STATE_SUFFIX;
    char *p = attn_malloc(bytes);
    if (!p) {
        (void)attn_fail(ctx, ATTN_ERR_NO_MEMORY, "pretrain: out of memory");
        return NULL;
    }
    memcpy(p, path, n);
    memcpy(p + n, STATE_SUFFIX, sizeof STATE_SUFFIX);
    return p;
}

/* The fields before the optimizer's state; resume reads them in this order. */
static void write_header(state_writer *w, const attn_pretrain *r, uint64_t model_hash) {
    w_bytes(w, STATE_MAGIC, 8);
    w_u32(w, STATE_VERSION);
    w_u64(w, r->o.batch_size);
    w_u64(w, r->o.max_length);
    w_u64(w, r->o.stride);
    w_f64(w, r->o.train_ratio);
    w_u64(w, attn_text_dataset_num_ids(r->train));
    w_u64(w, attn_text_dataset_num_ids(r->val));
    w_u64(w, r->train_hash);
    w_u64(w, r->val_hash);
    w_u64(w, r->vocab_size);
    w_u64(w, r->context_length);
    w_u64(w, attn_model_num_scalars(r->model));
    w_u64(w, model_hash);
    arch_field arch[ARCH_FIELDS];
    size_t fields = architecture_of(r->model, arch);
    w_u32(w, (uint32_t)fields);
    for (size_t i = 0; i < fields; i++) {
        size_t len = strlen(arch[i].name);
        w_u32(w, (uint32_t)len);
        w_bytes(w, arch[i].name, len);
        w_f64(w, arch[i].value);
    }
    w_u32(w, (uint32_t)r->phase);
    w_u64(w, r->epoch);
    w_u64(w, r->batch);
    w_u32(w, r->epoch_begun ? 1u : 0u);
    w_u64(w, r->steps_taken);
    w_u64(w, r->tokens_seen);
    w_f64(w, r->step_loss);
    w_u64(w, r->train_windows);
    for (size_t i = 0; i < r->train_windows; i++) w_u64(w, (uint64_t)r->order[i]);
}

attn_status attn_pretrain_save(attn_pretrain *r, const char *path) {
    const char *fn = "attn_pretrain_save";
    if (!r) return ATTN_ERR_NULL;
    attn_clear_error(r->ctx);
    if (!path) return attn_fail(r->ctx, ATTN_ERR_NULL, "%s: path is NULL", fn);
    if (r->phase == PHASE_FAILED)
        return attn_fail(r->ctx, ATTN_ERR_INVALID,
                         "%s: the run failed (%s); its last checkpoint is the one to keep", fn,
                         r->failed_message);
    size_t rng_size = attn_rng_state_size(), opt_floats = attn_optimizer_state_size(r->opt);
    size_t opt_steps = 0;
    unsigned char *rng_state = attn_malloc(rng_size);
    float *opt_state = attn_alloc_floats(opt_floats ? opt_floats : 1);
    char *spath = state_path(r->ctx, path);
    state_writer *w = attn_calloc(1, sizeof *w);
    attn_status st = ATTN_OK;
    if (!rng_state || !opt_state || !w)
        st = attn_fail(r->ctx, ATTN_ERR_NO_MEMORY, "%s: no memory for the optimizer's %zu floats",
                       fn, opt_floats);
    if (st == ATTN_OK && !spath) st = ATTN_ERR_NO_MEMORY;
    if (st == ATTN_OK) st = attn_rng_get_state(r->rng, rng_state, rng_size);
    if (st == ATTN_OK) st = attn_optimizer_get_state(r->opt, opt_state, opt_floats, &opt_steps);
    /* both files written and closed before either is put in place: an
     * interrupted or failed save leaves the last checkpoint's pair as it was */
    attn_file *model_file = NULL;
    if (st == ATTN_OK) st = attn_file_open(r->ctx, spath, &w->file);
    if (st == ATTN_OK) st = attn_file_open(r->ctx, path, &model_file);
    if (st == ATTN_OK) st = attn_model_save_to(r->model, model_file, path);
    if (st == ATTN_OK) {
        w->ctx = r->ctx;
        w->hash = FNV_OFFSET;
        write_header(w, r, weights_hash(r));
        w_u64(w, rng_size);
        w_bytes(w, rng_state, rng_size);
        w_u64(w, opt_steps);
        w_u64(w, opt_floats);
        for (size_t i = 0; i < opt_floats; i++) {
            uint32_t bits;
            memcpy(&bits, &opt_state[i], sizeof bits);
            w_u32(w, bits);
        }
        w_u64(w, r->history_count);
        for (size_t i = 0; i < r->history_count; i++) {
            w_u64(w, r->history_tokens[i]);
            w_f64(w, r->history_train[i]);
            w_f64(w, r->history_val[i]);
        }
        w_u64(w, w->hash);
        w_flush(w);
        st = w->st;
        /* the model put in place, then the state; where the state cannot
         * be, the model goes back to the last checkpoint's */
        if (st == ATTN_OK) {
            st = attn_file_commit_pair(r->ctx, model_file, w->file);
            model_file = NULL;
            w->file = NULL;
        }
    }
    attn_file_discard(model_file);
    if (w && w->file) attn_file_discard(w->file);
    attn_free(w);
    attn_free(spath);
    attn_free(rng_state);
    attn_free(opt_state);
    return st;
}

/* A little-endian reader over a whole state file in memory. */
typedef struct state_reader {
    const unsigned char *p;
    size_t size, at;
    bool short_read;
} state_reader;

static const unsigned char *r_take(state_reader *s, size_t n) {
    if (s->short_read || s->size - s->at < n) {
        s->short_read = true;
        return NULL;
    }
    const unsigned char *p = s->p + s->at;
    s->at += n;
    return p;
}

static uint64_t r_u(state_reader *s, size_t bytes) {
    const unsigned char *p = r_take(s, bytes);
    uint64_t v = 0;
    for (size_t i = 0; p && i < bytes; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static double r_f64(state_reader *s) {
    uint64_t v = r_u(s, 8);
    double x;
    memcpy(&x, &v, sizeof x);
    return x;
}

/* x in the fewest digits that read back as x (buf: 32 chars). */
static const char *shortest(double x, char buf[32]) {
    snprintf(buf, 32, "%.15g", x);
    if (strtod(buf, NULL) != x) snprintf(buf, 32, "%.17g", x);
    return buf;
}

/* Compares a saved value with the run's: the message names both. */
#define SAME(what, saved, now)                                                                 \
    do {                                                                                       \
        uint64_t saved_ = (saved), now_ = (uint64_t)(now);                                     \
        if (saved_ != now_)                                                                    \
            return attn_fail(r->ctx, ATTN_ERR_INVALID,                                         \
                             "%s: %s: the checkpoint's %s is %llu, this run's %llu", fn, spath, \
                             what, (unsigned long long)saved_, (unsigned long long)now_);      \
    } while (0)

typedef struct saved_run {
    int phase;
    size_t epoch, batch, steps_taken, history_count, opt_steps;
    bool epoch_begun;
    uint64_t tokens_seen, model_hash;
    double step_loss;
    size_t order_at, rng_at, opt_at, history_at; /* offsets into the file */
} saved_run;

static attn_status parse_state(attn_pretrain *r, const char *fn, const char *spath,
                               state_reader *s, saved_run *out) {
    const unsigned char *magic = r_take(s, 8);
    if (!magic || memcmp(magic, STATE_MAGIC, 8) != 0)
        return attn_fail(r->ctx, ATTN_ERR_FORMAT, "%s: %s is not an attn pretraining state", fn,
                         spath);
    uint64_t version = r_u(s, 4);
    if (version != STATE_VERSION)
        return attn_fail(r->ctx, ATTN_ERR_FORMAT, "%s: %s has version %llu (this reads %u)", fn,
                         spath, (unsigned long long)version, STATE_VERSION);
    if (s->size < 8 + 12 ||
        r_u(&(state_reader){.p = s->p + s->size - 8, .size = 8}, 8) !=
            fnv_bytes(FNV_OFFSET, s->p, s->size - 8))
        return attn_fail(r->ctx, ATTN_ERR_FORMAT, "%s: %s is damaged (its checksum disagrees)",
                         fn, spath);
    SAME("batch_size", r_u(s, 8), r->o.batch_size);
    SAME("max_length", r_u(s, 8), r->o.max_length);
    SAME("stride", r_u(s, 8), r->o.stride);
    double ratio = r_f64(s);
    if (ratio != r->o.train_ratio)
        return attn_fail(r->ctx, ATTN_ERR_INVALID,
                         "%s: %s: the checkpoint's train_ratio is %g, this run's %g", fn, spath,
                         ratio, r->o.train_ratio);
    SAME("training token count", r_u(s, 8), attn_text_dataset_num_ids(r->train));
    SAME("validation token count", r_u(s, 8), attn_text_dataset_num_ids(r->val));
    if (r_u(s, 8) != r->train_hash || r_u(s, 8) != r->val_hash)
        return attn_fail(r->ctx, ATTN_ERR_INVALID,
                         "%s: %s: the checkpoint was trained on other text (its tokens' hash "
                         "differs)",
                         fn, spath);
    SAME("vocab_size", r_u(s, 8), r->vocab_size);
    SAME("context_length", r_u(s, 8), r->context_length);
    SAME("parameter count", r_u(s, 8), attn_model_num_scalars(r->model));
    out->model_hash = r_u(s, 8);
    arch_field arch[ARCH_FIELDS];
    size_t fields = architecture_of(r->model, arch);
    SAME("count of architecture fields", r_u(s, 4), fields);
    for (size_t i = 0; i < fields; i++) {
        size_t len = strlen(arch[i].name);
        uint64_t saved_len = r_u(s, 4);
        const unsigned char *name = saved_len == len ? r_take(s, len) : NULL;
        if (!name || memcmp(name, arch[i].name, len) != 0)
            return attn_fail(r->ctx, ATTN_ERR_INVALID,
                             "%s: %s: the checkpoint's architecture field %zu is not %s, this "
                             "run's (another kind of model)",
                             fn, spath, i, arch[i].name);
        double saved = r_f64(s);
        if (saved != arch[i].value && !s->short_read) {
            char was[32], now[32];
            return attn_fail(r->ctx, ATTN_ERR_INVALID,
                             "%s: %s: the checkpoint was saved with %s %s, this run's model "
                             "has %s",
                             fn, spath, arch[i].name, shortest(saved, was),
                             shortest(arch[i].value, now));
        }
    }
    uint64_t phase = r_u(s, 4);
    out->epoch = (size_t)r_u(s, 8);
    out->batch = (size_t)r_u(s, 8);
    uint64_t begun = r_u(s, 4);
    out->steps_taken = (size_t)r_u(s, 8);
    out->tokens_seen = r_u(s, 8);
    out->step_loss = r_f64(s);
    SAME("training window count", r_u(s, 8), r->train_windows);
    out->order_at = s->at;
    bool order_ok = true;
    for (size_t i = 0; i < r->train_windows; i++) order_ok &= r_u(s, 8) < r->train_windows;
    uint64_t rng_size = r_u(s, 8);
    out->rng_at = s->at;
    const unsigned char *rng_bytes = rng_size == attn_rng_state_size() ? r_take(s, (size_t)rng_size)
                                                                      : NULL;
    /* the generator's bytes as well as their size: a scratch generator
     * takes them, so that resume cannot fail after the model is replaced */
    attn_rng *scratch = NULL;
    if (rng_bytes && attn_rng_new(r->ctx, 0, &scratch) != ATTN_OK)
        return attn_fail(r->ctx, ATTN_ERR_NO_MEMORY, "%s: no memory for a generator to check "
                         "the state of %s", fn, spath);
    bool rng_ok = rng_bytes &&
                  attn_rng_set_state(scratch, rng_bytes, (size_t)rng_size) == ATTN_OK;
    attn_rng_free(scratch);
    out->opt_steps = (size_t)r_u(s, 8);
    uint64_t opt_floats = r_u(s, 8);
    out->opt_at = s->at;
    bool opt_ok = opt_floats == attn_optimizer_state_size(r->opt) &&
                  opt_floats <= (s->size - s->at) / 4 && r_take(s, (size_t)opt_floats * 4) &&
                  out->opt_steps <= ATTN_OPTIMIZER_MAX_STEPS;
    out->history_count = (size_t)r_u(s, 8);
    out->history_at = s->at;
    bool history_ok = out->history_count <= (s->size - s->at) / 24 &&
                      r_take(s, out->history_count * 24) != NULL;
    /* only where a run can stop: before an epoch's first step, between its
     * steps, at an evaluation after a step, at its sample after the last */
    size_t b = out->batch, spe = r->steps_per_epoch;
    bool position_ok = begun == 1 ? (phase == PHASE_STEP && b >= 1 && b < spe) ||
                                        (phase == PHASE_EVAL && b >= 1 && b <= spe) ||
                                        (phase == PHASE_SAMPLE && b == spe)
                                  : begun == 0 && phase == PHASE_STEP && b == 0;
    if (s->short_read || !order_ok || !rng_ok || !opt_ok || !history_ok || !position_ok ||
        s->size - s->at != 8)
        return attn_fail(r->ctx, ATTN_ERR_FORMAT,
                         "%s: %s does not hold a state for this run (%s)", fn, spath,
                         s->short_read || s->size - s->at != 8 ? "its length"
                         : !order_ok                          ? "the loader order"
                         : !rng_ok                            ? "the generator"
                         : !opt_ok                            ? "the optimizer's size or steps"
                         : !history_ok                        ? "the history"
                                                              : "the position");
    out->phase = (int)phase;
    out->epoch_begun = begun == 1;
    return ATTN_OK;
}
#undef SAME

/* Where a model file misses the state's hash of the weights: a copy of
 * the checkpoint converted to another dtype (bf16, f16) loads, rounded, and
 * its hash differs for that reason, which the message then names; note is
 * empty when every parameter is float32 as attn_pretrain_save writes it. */
static void saved_dtype_note(attn_pretrain *r, const char *path, char *note, size_t size) {
    note[0] = '\0';
    attn_safetensors *file = NULL;
    if (attn_safetensors_open(r->ctx, path, &file) != ATTN_OK) return;
    for (size_t i = 0; i < r->param_count; i++) {
        attn_safetensors_info info;
        if (attn_safetensors_find(file, r->params[i].name, &info) == ATTN_OK &&
            info.dtype != ATTN_DTYPE_F32) {
            snprintf(note, size, "; it holds %s as %s, where attn_pretrain_save writes F32",
                     r->params[i].name, attn_dtype_name(info.dtype));
            break;
        }
    }
    attn_safetensors_free(file);
}

attn_status attn_pretrain_resume(attn_pretrain *r, const char *path) {
    const char *fn = "attn_pretrain_resume";
    if (!r) return ATTN_ERR_NULL;
    attn_clear_error(r->ctx);
    if (!path) return attn_fail(r->ctx, ATTN_ERR_NULL, "%s: path is NULL", fn);
    char *spath = state_path(r->ctx, path);
    if (!spath) return ATTN_ERR_NO_MEMORY;
    unsigned char *bytes = NULL;
    size_t size = 0;
    attn_status st = attn_file_read_whole(r->ctx, fn, spath, &bytes, &size);
    state_reader s = {.p = bytes, .size = size};
    saved_run saved = {0};
    if (st == ATTN_OK) st = parse_state(r, fn, spath, &s, &saved);
    /* everything the run will take, allocated before anything changes */
    size_t n_hist = saved.history_count, scalars = attn_model_num_scalars(r->model);
    size_t opt_floats = attn_optimizer_state_size(r->opt);
    float *backup = NULL, *opt_state = NULL;
    uint64_t *tokens = NULL;
    double *train = NULL, *val = NULL;
    if (st == ATTN_OK) {
        backup = attn_alloc_floats(scalars ? scalars : 1);
        opt_state = attn_alloc_floats(opt_floats ? opt_floats : 1);
        tokens = attn_calloc(n_hist ? n_hist : 1, sizeof *tokens);
        train = attn_calloc(n_hist ? n_hist : 1, sizeof *train);
        val = attn_calloc(n_hist ? n_hist : 1, sizeof *val);
        if (!backup || !opt_state || !tokens || !train || !val)
            st = attn_fail(r->ctx, ATTN_ERR_NO_MEMORY, "%s: no memory to load %s", fn, spath);
    }
    if (st == ATTN_OK) {
        /* the model: loaded whole or not at all, then checked against the
         * state's hash of it (a model and state from different saves) */
        size_t at = 0;
        for (size_t i = 0; i < r->param_count; i++) {
            memcpy(backup + at, r->params[i].data, r->params[i].numel * sizeof(float));
            at += r->params[i].numel;
        }
        st = attn_model_load_run(r->model, path);
        if (st == ATTN_OK && weights_hash(r) != saved.model_hash) {
            at = 0;
            for (size_t i = 0; i < r->param_count; i++) {
                memcpy(r->params[i].data, backup + at, r->params[i].numel * sizeof(float));
                at += r->params[i].numel;
            }
            char dtype_note[160];
            saved_dtype_note(r, path, dtype_note, sizeof dtype_note);
            st = attn_fail(r->ctx, ATTN_ERR_INVALID,
                           "%s: %s is not the model %s was saved with (its weights' hash "
                           "differs%s)",
                           fn, path, spath, dtype_note);
        }
    }
    if (st == ATTN_OK) {
        for (size_t i = 0; i < opt_floats; i++) {
            uint32_t bits = (uint32_t)r_u(&(state_reader){.p = bytes + saved.opt_at + 4 * i,
                                                          .size = 4},
                                          4);
            memcpy(&opt_state[i], &bits, sizeof bits);
        }
        state_reader h = {.p = bytes + saved.history_at, .size = n_hist * 24};
        for (size_t i = 0; i < n_hist; i++) {
            tokens[i] = r_u(&h, 8);
            train[i] = r_f64(&h);
            val[i] = r_f64(&h);
        }
        state_reader o = {.p = bytes + saved.order_at, .size = r->train_windows * 8};
        /* these cannot fail: the sizes, the step count and the generator's
         * bytes were checked */
        st = attn_rng_set_state(r->rng, bytes + saved.rng_at, attn_rng_state_size());
        if (st == ATTN_OK) st = attn_optimizer_set_state(r->opt, opt_state, opt_floats,
                                                        saved.opt_steps);
        if (st == ATTN_OK) {
            for (size_t i = 0; i < r->train_windows; i++) r->order[i] = (int64_t)r_u(&o, 8);
            r->phase = saved.phase;
            r->epoch = saved.epoch;
            r->batch = saved.batch;
            r->epoch_begun = saved.epoch_begun;
            r->steps_taken = saved.steps_taken;
            r->tokens_seen = saved.tokens_seen;
            r->step_loss = saved.step_loss;
            attn_free(r->history_tokens);
            attn_free(r->history_train);
            attn_free(r->history_val);
            r->history_tokens = tokens;
            r->history_train = train;
            r->history_val = val;
            r->history_capacity = n_hist ? n_hist : 1;
            r->history_count = n_hist;
            tokens = NULL, train = NULL, val = NULL;
        }
    }
    attn_free(tokens);
    attn_free(train);
    attn_free(val);
    attn_free(backup);
    attn_free(opt_state);
    attn_free(bytes);
    attn_free(spath);
    return st;
}
