/* cmd_pretrain.c — attn pretrain: the book's chapter-5 training run
 * (gpt_train.py's train_model_simple) on text files, printing what the
 * book prints, line for line (attn.h, "Pretraining: the book's chapter 5"). */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"
#include "interrupt.h"
#include "outputs.h"
#include "loss_plot.h"
#include "png_write.h"

#include "io/json.h"
#include "train/text_data.h"
#include "utf8.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_SEED 123
#define DEFAULT_TOKENIZER "data/gpt2-bpe"
/* Chapter 5 shortens GPT-2's context to 256 tokens for every run it makes. */
#define PRESET_CONTEXT 256
#define MAX_TEXTS 64
/* The most text a run reads, all --text files together: the run holds it,
 * its token ids and their windows in memory at once. A file past it (an
 * endless one such as /dev/zero) is refused once that much is read. */
#define MAX_TEXT_BYTES ((size_t)2 << 30)
#define MAX_TEXT_NAME "2 GiB"

static const char pretrain_help[] =
    "usage: attn pretrain [--preset NAME | --config cfg.json | --resume FILE]\n"
    "                     --text FILE... [--tokenizer DIR] [--epochs N] [--batch-size N]\n"
    "                     [--lr X] [--weight-decay X] [--eval-freq N] [--eval-iter N]\n"
    "                     [--max-length N] [--stride N] [--seed S] [--sample TEXT]\n"
    "                     [--threads N] [--save FILE] [--plot FILE.png]\n"
    "\n"
    "Trains the book's GPTModel (or its Llama3Model) from scratch as chapter 5 of\n"
    "\"Build a Large Language Model (From Scratch)\" does (gpt_train.py's\n"
    "train_model_simple), loss for loss with the book's code in PyTorch: the text is\n"
    "cut at 90% of its characters, each part cut into windows of --max-length\n"
    "tokens every --stride, the training windows shuffled into batches each epoch;\n"
    "AdamW steps; every --eval-freq steps the mean loss of --eval-iter batches of\n"
    "each part is printed as\n"
    "  Ep 1 (Step 000000): Train loss 9.781, Val loss 9.933\n"
    "and after each epoch a greedy sample of 50 tokens from --sample (newlines\n"
    "printed as spaces). Nothing else goes to stdout; a terminal's stderr gets a\n"
    "live progress line.\n"
    "\n"
    "Model (one of):\n"
    "  --preset NAME   gpt2-small (default), gpt2-medium, gpt2-large or gpt2-xl: the\n"
    "                  book's GPT_CONFIG_124M (and its larger sizes) with the context\n"
    "                  chapter 5 uses, 256 tokens, for every size; vocab 50257,\n"
    "                  drop_rate 0.1, qkv_bias false\n"
    "  --config F      a JSON file with the book's cfg keys (vocab_size,\n"
    "                  context_length, emb_dim, n_heads, n_layers, drop_rate,\n"
    "                  qkv_bias) or Hugging Face GPT-2's (vocab_size, n_positions,\n"
    "                  n_embd, n_head, n_layer; resid_pdrop as drop_rate, 0.1 where\n"
    "                  absent, attn_pdrop and embd_pdrop the same); with the\n"
    "                  book's Llama 3 keys (hidden_dim, n_kv_groups, rope_base,\n"
    "                  rope_freq) or Hugging Face Llama's, the book's Llama3Model\n"
    "                  (float32, no dropout); with chapter 4's bonus keys, that\n"
    "                  script's GPTModel: n_kv_groups (gpt_with_kv_gqa.py),\n"
    "                  latent_dim (gpt_with_kv_mla.py) or sliding_window_size and\n"
    "                  sliding_window_stride (gpt_with_kv_swa.py)\n"
    "  --resume FILE   continue the run saved with --save FILE (FILE and\n"
    "                  FILE.state): the model's config is the checkpoint's; give the\n"
    "                  same --text, --tokenizer, --batch-size, --max-length and\n"
    "                  --stride; --epochs counts from the start of the saved run\n"
    "                  and must be more than the epochs it has finished\n"
    "Data:\n"
    "  --text FILE...  one or more text files (UTF-8), read as Python reads them\n"
    "                  (\\r\\n as \\n); several are joined with <|endoftext|> between\n"
    "                  them; at most " MAX_TEXT_NAME " in all\n"
    "  --tokenizer DIR GPT-2's BPE files (encoder.json + vocab.bpe); default\n"
    "                  data/gpt2-bpe when that directory is in the current one\n"
    "  --max-length N  tokens per window (default: the model's context length)\n"
    "  --stride N      tokens between windows (default: --max-length)\n"
    "Training (the book's notebook run by default):\n"
    "  --epochs N      default 10\n"
    "  --batch-size N  default 2\n"
    "  --lr X          AdamW's learning rate (default 0.0004; betas 0.9, 0.999,\n"
    "                  eps 1e-8)\n"
    "  --weight-decay X  default 0.1\n"
    "  --eval-freq N   evaluate every N steps (default 5)\n"
    "  --eval-iter N   batches per evaluation (default 5)\n"
    "  --sample TEXT   the samples' start (default \"Every effort moves you\"; \"\": none)\n"
    "  --seed S        torch.manual_seed(S) before the model is made (default 123): the\n"
    "                  same generator then draws the loaders' order and the dropout;\n"
    "                  with --resume the saved run's generator goes on (no --seed\n"
    "                  applies there)\n"
    "  --threads N     worker threads (default: all online CPUs)\n"
    "Outputs (checked before training starts):\n"
    "  --save FILE     the model as safetensors (the book's state_dict names; `attn\n"
    "                  generate --weights FILE` reads it) and the run's state as\n"
    "                  FILE.state, after every epoch and at the end\n"
    "  --plot FILE.png the book's figure 5.12: training and validation loss against\n"
    "                  epochs and tokens seen\n"
    "\n"
    "Interrupting (Ctrl-C, SIGTERM, SIGHUP): the run stops after the step,\n"
    "evaluation or sample under way; with --save it is saved there (continue it\n"
    "with --resume FILE: the same losses as a run never stopped), --plot shows the\n"
    "losses so far, and one line on stderr says where it stopped. A second signal\n"
    "ends it at once (a save under way is finished first). No temporary file is\n"
    "left behind either way.\n"
    "\n"
    "Exit status: 0 done, 1 the run failed (a loss that is not finite, a file that\n"
    "cannot be written: --save keeps the last epoch's checkpoint), 2 bad usage,\n"
    "128 + the signal's number when interrupted (130 for Ctrl-C, 143 for SIGTERM).\n";

static const char *const options[] = {
    "--config", "--preset",    "--text",      "--tokenizer", "--epochs",     "--batch-size",
    "--lr",     "--weight-decay", "--eval-freq", "--eval-iter", "--seed",     "--threads",
    "--sample", "--save",      "--resume",    "--plot",      "--max-length", "--stride",
    NULL};

typedef struct pretrain_cli {
    const char *config, *preset, *tokenizer, *save, *resume, *plot;
    const char *texts[MAX_TEXTS];
    size_t n_texts, threads;
    uint64_t seed;
    attn_pretrain_options run;
} pretrain_cli;

static int size_option(const char *opt, const char *value, size_t *out, bool positive) {
    if (!cli_parse_size(value, out) || (positive && *out == 0))
        return cli_usage_error("%s: expected a %s integer, got '%s'", opt,
                               positive ? "positive" : "non-negative", value);
    return CLI_OK;
}

static int parse_args(int argc, char **argv, pretrain_cli *o) {
    *o = (pretrain_cli){.threads = cli_default_threads(), .seed = DEFAULT_SEED,
                        .run = attn_pretrain_defaults()};
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i];
        const char *value = cli_option_value(argc, argv, &i, options);
        if (!value) return CLI_USAGE;
        int rc = CLI_OK;
        double x = 0.0;
        if (strcmp(opt, "--text") == 0) {
            /* --text A B C: every argument up to the next option */
            for (;;) {
                if (o->n_texts == MAX_TEXTS)
                    return cli_usage_error("--text: at most %d files", MAX_TEXTS);
                o->texts[o->n_texts++] = value;
                if (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0) break;
                value = argv[++i];
            }
        } else if (strcmp(opt, "--config") == 0) o->config = value;
        else if (strcmp(opt, "--preset") == 0) o->preset = value;
        else if (strcmp(opt, "--tokenizer") == 0) o->tokenizer = value;
        else if (strcmp(opt, "--save") == 0) o->save = value;
        else if (strcmp(opt, "--resume") == 0) o->resume = value;
        else if (strcmp(opt, "--plot") == 0) o->plot = value;
        else if (strcmp(opt, "--sample") == 0) o->run.start_context = value;
        else if (strcmp(opt, "--epochs") == 0) rc = size_option(opt, value, &o->run.epochs, false);
        else if (strcmp(opt, "--batch-size") == 0)
            rc = size_option(opt, value, &o->run.batch_size, true);
        else if (strcmp(opt, "--eval-freq") == 0)
            rc = size_option(opt, value, &o->run.eval_freq, true);
        else if (strcmp(opt, "--eval-iter") == 0)
            rc = size_option(opt, value, &o->run.eval_iter, true);
        else if (strcmp(opt, "--max-length") == 0)
            rc = size_option(opt, value, &o->run.max_length, true);
        else if (strcmp(opt, "--stride") == 0) rc = size_option(opt, value, &o->run.stride, true);
        else if (strcmp(opt, "--threads") == 0) rc = size_option(opt, value, &o->threads, true);
        else if (strcmp(opt, "--seed") == 0) {
            if (!cli_parse_u64(value, &o->seed))
                rc = cli_usage_error("--seed: expected a non-negative integer, got '%s'", value);
        } else if (strcmp(opt, "--lr") == 0) {
            if (!cli_parse_double(value, &x)) return cli_bad_number(opt, value, "a positive number");
            if (!(x > 0.0) || !isfinite(x))
                rc = cli_usage_error("--lr: expected a positive finite number, got '%s'", value);
            o->run.lr = x;
        } else if (strcmp(opt, "--weight-decay") == 0) {
            if (!cli_parse_double(value, &x))
                return cli_bad_number(opt, value, "a non-negative number");
            if (!(x >= 0.0) || !isfinite(x))
                rc = cli_usage_error("--weight-decay: expected a non-negative finite number, "
                                     "got '%s'",
                                     value);
            o->run.weight_decay = x;
        }
        if (rc != CLI_OK) return rc;
    }
    if (!!o->config + !!o->preset + !!o->resume > 1)
        return cli_usage_error("pretrain: give one of --preset, --config and --resume");
    if (o->n_texts == 0) return cli_usage_error("pretrain: give the training text as --text FILE");
    if (o->plot) {
        size_t n = strlen(o->plot);
        if (n < 4 || strcmp(o->plot + n - 4, ".png") != 0)
            return cli_usage_error("--plot: expected a .png file name, got '%s'", o->plot);
        if (o->run.epochs == 0)
            return cli_usage_error("--plot: --epochs 0 trains nothing to plot");
    }
    if (o->resume && o->run.epochs == 0)
        return cli_usage_error("--resume: --epochs 0 trains nothing: give the epochs the run "
                               "is to reach, counted from its start");
    if (!o->tokenizer) {
        struct stat sb;
        if (stat(DEFAULT_TOKENIZER, &sb) != 0 || !S_ISDIR(sb.st_mode))
            return cli_usage_error("pretrain: give --tokenizer DIR (GPT-2's encoder.json and "
                                   "vocab.bpe); there is no %s here",
                                   DEFAULT_TOKENIZER);
        o->tokenizer = DEFAULT_TOKENIZER;
    }
    return CLI_OK;
}

/* ---- the model --------------------------------------------------------------- */

/* The number under key in the JSON object obj (a config's top level, for
 * the dropout rates attn_lm_config_read does not keep; a checkpoint's
 * rope_freq), looked up as the library reads the rest of a config
 * (attn_json_get: of duplicate keys the last, as Python's json keeps it):
 * 1 with the number in *out, 0 where the key is absent, -1 where it holds
 * something else (a string, null, a list). */
static int json_value(const attn_json *obj, const char *key, double *out) {
    const attn_json *v = attn_json_get(obj, key);
    if (!v) return 0;
    return attn_json_as_double(v, out) ? 1 : -1;
}

/* The book's Llama3Model of a config.json's attn_lm_config: its RMSNorm
 * has eps 1e-5 and its output head is a weight of its own. */
static int llama3_config_of(const attn_lm_config *lc, const char *path, attn_llama3_config *out) {
    /* the config read keeps gpt_with_kv_swa.py's window on any model (attn
     * generate --config applies it), but the book's Llama3Model has none */
    if (lc->sliding_window_size != 0)
        return cli_usage_error("--config: '%s' has a sliding_window_size (%zu) and Llama 3's "
                               "keys; the book's Llama3Model has no sliding window",
                               path, lc->sliding_window_size);
    if (lc->tie_embeddings)
        return cli_usage_error("--config: '%s' ties the output head to the embedding; the "
                               "book's Llama3Model keeps out_head apart",
                               path);
    if (lc->norm_eps != 0.0 || signbit(lc->norm_eps)) {
        if (lc->norm_eps != 1e-5)
            return cli_usage_error("--config: '%s' has norm eps %g; the book's Llama3Model's "
                                   "RMSNorm has 1e-05",
                                   path, lc->norm_eps);
    }
    *out = (attn_llama3_config){.vocab_size = lc->vocab_size,
                                .context_length = lc->context_length,
                                .emb_dim = lc->emb_dim,
                                .n_heads = lc->n_heads,
                                .n_layers = lc->n_layers,
                                .hidden_dim = lc->hidden_dim,
                                .n_kv_groups = lc->n_kv_groups ? lc->n_kv_groups : lc->n_heads,
                                .rope_base = lc->rope_base > 0.0 ? lc->rope_base : 500000.0,
                                .rope_factor = lc->rope_factor,
                                .rope_low_freq_factor = lc->rope_low_freq_factor,
                                .rope_high_freq_factor = lc->rope_high_freq_factor,
                                .rope_original_context_length = lc->rope_original_context_length};
    return CLI_OK;
}

/* A size or a number among a checkpoint's metadata. */
static bool metadata_size(attn_safetensors *st, const char *key, size_t *out) {
    const char *v = attn_safetensors_metadata_get(st, key);
    return v && cli_parse_size(v, out);
}
static bool metadata_double(attn_safetensors *st, const char *key, double *out) {
    const char *v = attn_safetensors_metadata_get(st, key);
    return v && cli_parse_double(v, out);
}

/* Chapter 4's bonus GPT a checkpoint's metadata names by its keys, as
 * attn_model_save writes them (none: the book's GPTModel); false where a
 * value is not one it writes. */
static bool checkpoint_gpt_variant(attn_safetensors *st, attn_gpt_config *g) {
    const char *latent = attn_safetensors_metadata_get(st, "latent_dim");
    const char *window = attn_safetensors_metadata_get(st, "sliding_window_size");
    if (attn_safetensors_metadata_get(st, "n_kv_groups")) {
        g->attention = ATTN_GPT_GQA;
        return metadata_size(st, "n_kv_groups", &g->n_kv_groups);
    }
    if (latent) {
        g->attention = ATTN_GPT_MLA;
        return strcmp(latent, "null") == 0 || metadata_size(st, "latent_dim", &g->latent_dim);
    }
    if (window) {
        double stride = 0.0;
        g->attention = ATTN_GPT_SWA;
        if (!metadata_size(st, "sliding_window_size", &g->sliding_window_size) ||
            !metadata_double(st, "sliding_window_stride", &stride) || stride != floor(stride) ||
            !(fabs(stride) <= 9007199254740992.0))
            return false;
        g->sliding_window_stride = (int64_t)stride;
    }
    return true;
}

/* The model a --resume checkpoint's metadata describes ("format":
 * "attn-gpt" or "attn-llama3", as attn_model_save writes them). */
static int checkpoint_model_new(attn_ctx *ctx, const char *path, attn_rng *rng,
                                attn_model **out) {
    attn_safetensors *st = NULL;
    if (attn_safetensors_open(ctx, path, &st) != ATTN_OK)
        return cli_library_error(ctx, "--resume");
    const char *format = attn_safetensors_metadata_get(st, "format");
    bool gpt = format && strcmp(format, "attn-gpt") == 0;
    bool llama = format && strcmp(format, "attn-llama3") == 0;
    size_t vocab = 0, context = 0, emb = 0, heads = 0, layers = 0;
    bool ok = (gpt || llama) && metadata_size(st, "vocab_size", &vocab) &&
              metadata_size(st, "context_length", &context) &&
              metadata_size(st, "emb_dim", &emb) && metadata_size(st, "n_heads", &heads) &&
              metadata_size(st, "n_layers", &layers);
    attn_gpt_config g = {.vocab_size = vocab, .context_length = context, .emb_dim = emb,
                         .n_heads = heads, .n_layers = layers};
    attn_llama3_config l = {.vocab_size = vocab, .context_length = context, .emb_dim = emb,
                            .n_heads = heads, .n_layers = layers};
    if (ok && gpt) {
        const char *bias = attn_safetensors_metadata_get(st, "qkv_bias");
        ok = metadata_double(st, "drop_rate", &g.drop_rate) && bias &&
             (strcmp(bias, "true") == 0 || strcmp(bias, "false") == 0);
        if (ok) g.qkv_bias = strcmp(bias, "true") == 0;
        if (ok) ok = checkpoint_gpt_variant(st, &g);
    } else if (ok) {
        const char *freq = attn_safetensors_metadata_get(st, "rope_freq");
        ok = metadata_size(st, "hidden_dim", &l.hidden_dim) &&
             metadata_size(st, "n_kv_groups", &l.n_kv_groups) &&
             metadata_double(st, "rope_base", &l.rope_base) && freq;
        attn_json *f = NULL;
        if (ok && strcmp(freq, "null") != 0) {
            double original = 0.0;
            ok = attn_json_parse(ctx, freq, strlen(freq), "--resume", &f) == ATTN_OK &&
                 json_value(f, "factor", &l.rope_factor) > 0 &&
                 json_value(f, "low_freq_factor", &l.rope_low_freq_factor) > 0 &&
                 json_value(f, "high_freq_factor", &l.rope_high_freq_factor) > 0 &&
                 json_value(f, "original_context_length", &original) > 0 && original >= 0.0 &&
                 original < 1e15 && original == floor(original);
            l.rope_original_context_length = (size_t)original;
        }
        attn_json_free(f);
    }
    attn_safetensors_free(st);
    if (!ok)
        return cli_usage_error("--resume: '%s' is not a checkpoint of attn pretrain (no "
                               "\"format\": \"attn-gpt\" or \"attn-llama3\" config in its "
                               "metadata)",
                               path);
    attn_status status = gpt ? attn_model_new_gpt(ctx, &g, rng, out)
                             : attn_model_new_llama3(ctx, &l, rng, out);
    return status == ATTN_OK ? CLI_OK : cli_library_error(ctx, "--resume");
}

/* The model of --preset, --config or the --resume checkpoint's metadata,
 * its weights drawn from rng (torch.manual_seed, then the book's
 * GPTModel(cfg) or Llama3Model(cfg)): a config with Llama 3's keys
 * (hidden_dim, n_kv_groups, rope_base) is the book's Llama3Model. */
static int pretrain_model_new(attn_ctx *ctx, const pretrain_cli *o, attn_rng *rng,
                              attn_model **out) {
    if (o->resume) return checkpoint_model_new(ctx, o->resume, rng, out);
    attn_gpt_config g = {0};
    if (o->config) {
        attn_lm_config lc;
        if (attn_lm_config_read(ctx, o->config, &lc) != ATTN_OK)
            return cli_library_error(ctx, "--config");
        if (lc.arch == ATTN_LM_LLAMA3) {
            attn_llama3_config l;
            int rc = llama3_config_of(&lc, o->config, &l);
            if (rc != CLI_OK) return rc;
            if (attn_model_new_llama3(ctx, &l, rng, out) != ATTN_OK)
                return cli_library_error(ctx, "--config");
            return CLI_OK;
        }
        attn_json *root;
        if (attn_json_read_file(ctx, o->config, &root) != ATTN_OK)
            return cli_library_error(ctx, "--config");
        /* one rate for the book's three dropouts: the book's drop_rate, which
         * its GPTModel reads (no default), or GPT-2's resid_pdrop (GPT2Config's
         * default 0.1), its attn_pdrop and embd_pdrop the same */
        double drop = 0.0, hf_width = 0.0;
        const char *key = "drop_rate";
        int found = json_value(root, key, &drop);
        bool hf = json_value(root, "n_embd", &hf_width) == 1;
        if (found == 0 && hf) found = json_value(root, key = "resid_pdrop", &drop);
        if (found == 0 && hf) {
            drop = 0.1;
            found = 1;
        }
        static const char *const others[] = {"attn_pdrop", "embd_pdrop"};
        double other = drop;
        const char *differs = NULL;
        for (size_t i = 0; hf && found > 0 && !differs && i < 2; i++) {
            int got = json_value(root, others[i], &other);
            if (got < 0) {
                found = -1;
                key = others[i];
            } else if (got > 0 && other != drop) {
                differs = others[i];
            }
        }
        /* gpt_with_kv_swa.py's keys as its cfg has them (attn_lm_config_read
         * checked them: a positive window, an integer stride): the config
         * read drops the window where the stride is 0, a model whose
         * layers have none but whose module is still the script's */
        double window = 0.0, stride = 0.0;
        const attn_json *w = attn_json_get(root, "sliding_window_size");
        bool swa = w && w->type != ATTN_JSON_NULL && json_value(root, "sliding_window_size",
                                                                &window) == 1 &&
                   json_value(root, "sliding_window_stride", &stride) == 1;
        attn_json_free(root);
        if (found < 0)
            return cli_usage_error("--config: \"%s\" in '%s' must be a number (a probability)",
                                   key, o->config);
        if (found == 0)
            return cli_usage_error("--config: '%s' has no \"drop_rate\", which the book's "
                                   "GPTModel reads (0.0 for none)",
                                   o->config);
        if (differs)
            return cli_usage_error("--config: '%s': %s %g differs from resid_pdrop %g; the "
                                   "book's GPTModel has one drop_rate for every dropout",
                                   o->config, differs, other, drop);
        if (!(drop >= 0.0 && drop <= 1.0))
            return cli_usage_error("--config: drop_rate %g is not a probability", drop);
        g = (attn_gpt_config){.vocab_size = lc.vocab_size, .context_length = lc.context_length,
                              .emb_dim = lc.emb_dim, .n_heads = lc.n_heads,
                              .n_layers = lc.n_layers, .drop_rate = drop,
                              .qkv_bias = lc.qkv_bias};
        if (swa && lc.arch != ATTN_LM_GPT2)
            return cli_usage_error("--config: '%s' has sliding windows and %s; the book's "
                                   "bonus GPTs have one or the other (gpt_with_kv_swa.py's "
                                   "MultiHeadAttentionWithSWA)",
                                   o->config, lc.arch == ATTN_LM_GPT_GQA ? "n_kv_groups"
                                                                         : "latent_dim");
        if (lc.arch == ATTN_LM_GPT_GQA && lc.n_kv_groups == 0)
            /* the config read takes null for "one a head", which the script's
             * num_heads % num_kv_groups cannot take */
            return cli_usage_error("--config: '%s' has \"n_kv_groups\": null; "
                                   "gpt_with_kv_gqa.py's GroupedQueryAttention needs a count "
                                   "that divides n_heads (%zu)",
                                   o->config, lc.n_heads);
        if (lc.arch == ATTN_LM_GPT_GQA) {
            g.attention = ATTN_GPT_GQA;
            g.n_kv_groups = lc.n_kv_groups;
        } else if (lc.arch == ATTN_LM_GPT_MLA) {
            g.attention = ATTN_GPT_MLA;
            g.latent_dim = lc.latent_dim;
        } else if (swa) {
            g.attention = ATTN_GPT_SWA;
            g.sliding_window_size = (size_t)window;
            g.sliding_window_stride = (int64_t)stride;
        }
    } else {
        attn_gpt2_preset p;
        const char *name = o->preset ? o->preset : "gpt2-small";
        if (attn_gpt2_preset_find(ctx, name, &p) != ATTN_OK)
            return cli_usage_error("--preset: %s", attn_ctx_last_error(ctx));
        g = (attn_gpt_config){.vocab_size = p.vocab_size, .context_length = PRESET_CONTEXT,
                              .emb_dim = p.n_embd, .n_heads = p.n_head, .n_layers = p.n_layer,
                              .drop_rate = 0.1, .qkv_bias = false};
    }
    if (attn_model_new_gpt(ctx, &g, rng, out) != ATTN_OK)
        return cli_library_error(ctx, o->config ? "--config" : "--preset");
    return CLI_OK;
}

/* ---- the text ------------------------------------------------------------------ */

/* The file at path, read to its end but no further than limit bytes: a
 * longer one (or an endless one, a device or a pipe) sets *too_long, with
 * nothing in *out, once limit + 1 bytes are read. */
static int read_small_file(const char *opt, const char *path, size_t limit, char **out,
                           size_t *length, bool *too_long) {
    *too_long = false;
    FILE *f = fopen(path, "rb");
    if (!f) return cli_usage_error("%s: cannot read '%s': %s", opt, path, strerror(errno));
    size_t cap = limit < ((size_t)1 << 16) ? limit + 1 : (size_t)1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf && n <= limit) {
        if (n == cap) {
            size_t more = cap > limit + 1 - cap ? limit + 1 : 2 * cap;
            char *grown = realloc(buf, more + 1);
            if (!grown) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = grown;
            cap = more;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    bool failed = ferror(f) != 0;
    int err = errno; /* why the read failed ("Is a directory") */
    fclose(f);
    if (!buf) return cli_failure("%s: out of memory reading '%s'", opt, path);
    if (failed || n > limit) {
        free(buf);
        *too_long = !failed;
        return failed ? cli_usage_error("%s: cannot read '%s': %s", opt, path, strerror(err))
                      : CLI_OK;
    }
    buf[n] = '\0';
    *out = buf;
    *length = n;
    return CLI_OK;
}

/* The files as Python's open(path, "r", encoding="utf-8").read() gives them
 * ("\r\n" and "\r" as "\n"), joined with <|endoftext|> between them. */
static int read_texts(const pretrain_cli *o, char **out, size_t *length) {
    static const char sep[] = "<|endoftext|>";
    char *all = NULL;
    size_t n = 0;
    for (size_t t = 0; t < o->n_texts; t++) {
        char *text = NULL;
        size_t len = 0, joined = n + (t ? sizeof sep - 1 : 0);
        bool too_long = joined > MAX_TEXT_BYTES;
        int rc = too_long ? CLI_OK
                          : read_small_file("--text", o->texts[t], MAX_TEXT_BYTES - joined, &text,
                                            &len, &too_long);
        if (rc == CLI_OK && too_long)
            rc = t == 0 ? cli_usage_error("--text: '%s' holds more than " MAX_TEXT_NAME ", the "
                                          "most attn pretrain reads",
                                          o->texts[t])
                        : cli_usage_error("--text: '%s' takes the texts past " MAX_TEXT_NAME
                                          " together, the most attn pretrain reads",
                                          o->texts[t]);
        if (rc != CLI_OK) {
            free(all);
            return rc;
        }
        size_t bad = attn_utf8_invalid_at((const unsigned char *)text, len);
        if (bad < len) {
            unsigned byte = (unsigned char)text[bad];
            free(text);
            free(all);
            return cli_usage_error("--text: '%s' is not UTF-8: byte %zu (0x%02x) starts no "
                                   "character",
                                   o->texts[t], bad, byte);
        }
        size_t kept = 0;
        for (size_t i = 0; i < len; i++) {
            if (text[i] == '\r') {
                text[kept++] = '\n';
                if (i + 1 < len && text[i + 1] == '\n') i++;
            } else {
                text[kept++] = text[i];
            }
        }
        char *grown = realloc(all, n + (t ? sizeof sep - 1 : 0) + kept + 1);
        if (!grown) {
            free(text);
            free(all);
            return cli_failure("--text: out of memory");
        }
        all = grown;
        if (t) memcpy(all + n, sep, sizeof sep - 1), n += sizeof sep - 1;
        memcpy(all + n, text, kept);
        n += kept;
        all[n] = '\0';
        free(text);
    }
    *out = all;
    *length = n;
    return CLI_OK;
}

/* ---- progress and output -------------------------------------------------------- */

typedef struct progress {
    bool live, shown;
    double start;
    uint64_t tokens_at_start;
    size_t steps_at_start;
} progress;

static void progress_clear(progress *p) {
    if (p->live && p->shown) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
        p->shown = false;
    }
}

static void progress_show(progress *p, const attn_pretrain_event *ev) {
    if (!p->live) return;
    double elapsed = cli_now_seconds() - p->start;
    size_t done = ev->step + 1 - p->steps_at_start;
    double rate = elapsed > 0 ? (double)(ev->tokens_seen - p->tokens_at_start) / elapsed : 0.0;
    char spent[32], left[32];
    cli_format_duration(elapsed, spent, sizeof spent);
    cli_format_duration(done ? elapsed / (double)done * (double)(ev->total_steps - ev->step - 1) : 0,
                    left, sizeof left);
    fprintf(stderr, "\r\033[Kstep %zu/%zu  %.0f tokens/s  elapsed %s  left %s", ev->step + 1,
            ev->total_steps, rate, spent, left);
    fflush(stderr);
    p->shown = true;
}

/* Python's f"{x:.3f}" (nan, inf and -inf as it spells them). */
static void print_loss(double x) {
    if (isnan(x)) fputs("nan", stdout);
    else if (isinf(x)) fputs(x > 0 ? "inf" : "-inf", stdout);
    else printf("%.3f", x);
}

/* The sample as the book prints it: tiktoken's decode (UTF-8 with
 * errors="replace"), then .replace("\n", " "). */
static void print_sample(const char *text, size_t n) {
    cli_write_text(stdout, text, n, true, true);
    putchar('\n');
}

/* The figure of the history so far. evals is the number of evaluations of
 * the whole run: the epochs axis is torch.linspace(0, num_epochs, evals),
 * as the book draws it, of which an interrupted run has the first points. */
static int write_plot(attn_ctx *ctx, cli_outputs *outs, size_t index, const char *path,
                      attn_pretrain *run, size_t epochs, size_t evals) {
    size_t n = 0;
    const uint64_t *tokens = NULL;
    const double *train = NULL, *val = NULL;
    if (attn_pretrain_history(run, &n, &tokens, &train, &val) != ATTN_OK)
        return cli_library_error(ctx, "--plot");
    if (evals < n) evals = n;
    double *x = malloc((2 * n + 1) * sizeof *x);
    if (!x) return cli_failure("--plot: out of memory");
    double *epochs_seen = x + n;
    for (size_t i = 0; i < n; i++) {
        x[i] = (double)tokens[i];
        epochs_seen[i] = evals > 1 ? (double)epochs * (double)i / (double)(evals - 1) : 0.0;
    }
    cli_loss_history h = {.tokens_seen = x, .epochs_seen = epochs_seen, .train_losses = train,
                          .val_losses = val, .n = n};
    char err[256] = "";
    bool ok = cli_loss_plot_png(ctx, cli_outputs_file(outs, index, "loss plot"), path, &h, err,
                                sizeof err);
    free(x);
    if (!ok) return cli_failure("--plot: %s", err);
    return CLI_OK;
}

/* ---- the run --------------------------------------------------------------------- */

typedef struct pretrain_state {
    attn_ctx *ctx;
    attn_rng *rng;
    attn_model *model;
    attn_tokenizer *tok;
    attn_pretrain *run;
    char *text;
    const char *state_path; /* --save's FILE.state (check_outputs'), NULL without --save */
} pretrain_state;

static void state_free(pretrain_state *s) {
    attn_pretrain_free(s->run);
    attn_tokenizer_free(s->tok);
    attn_model_free(s->model);
    attn_rng_free(s->rng);
    free(s->text);
    attn_ctx_free(s->ctx);
}

/* The outputs of set are none of the run's inputs: the texts, the config,
 * the tokenizer's files (a file, or the names a tokenizer directory holds). */
static int not_inputs(cli_outputs *set, const pretrain_cli *o) {
    int rc = CLI_OK;
    for (size_t t = 0; rc == CLI_OK && t < o->n_texts; t++)
        rc = cli_outputs_not_input(set, "--text", o->texts[t]);
    if (rc == CLI_OK) rc = cli_outputs_not_input(set, "--config", o->config);
    if (rc == CLI_OK) rc = cli_outputs_not_input(set, "--tokenizer", o->tokenizer);
    static const char *const names[] = {"encoder.json", "vocab.bpe", "vocab.json", "merges.txt"};
    for (size_t i = 0; rc == CLI_OK && o->tokenizer && i < sizeof names / sizeof *names; i++) {
        char path[4096];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", o->tokenizer, names[i]) < sizeof path)
            rc = cli_outputs_not_input(set, "--tokenizer", path);
    }
    return rc;
}

/* Whether paths a and b name one existing file (links included). */
static bool same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return a && b && stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

/* The outputs are not the --resume checkpoint's files (its model and its
 * .state), which the run reads: only --save FILE of --resume FILE itself
 * replaces them, both at once, with the run's next checkpoint. */
static int not_resumed(const pretrain_cli *o, const char *state_path) {
    if (!o->resume) return CLI_OK;
    size_t n = strlen(o->resume);
    char *resume_state = malloc(n + sizeof ".state");
    if (!resume_state) return cli_failure("--resume: out of memory");
    memcpy(resume_state, o->resume, n);
    memcpy(resume_state + n, ".state", sizeof ".state");
    const char *inputs[2] = {o->resume, resume_state};
    const struct {
        const char *opt, *path;
        int allowed; /* the input it may replace: 0, 1, or -1 for none */
    } outs[3] = {{"--save", o->save, 0}, {"--save", state_path, 1}, {"--plot", o->plot, -1}};
    int rc = CLI_OK;
    for (int i = 0; rc == CLI_OK && i < 3; i++)
        for (int k = 0; rc == CLI_OK && k < 2; k++)
            if (k != outs[i].allowed && same_file(outs[i].path, inputs[k]))
                rc = cli_usage_error("%s: '%s' is the input --resume's %s ('%s'): write the "
                                     "output to another file",
                                     outs[i].opt, outs[i].path, k ? "state" : "model",
                                     inputs[k]);
    free(resume_state);
    return rc;
}

/* Every output checked (and --save's two files probed) before any work. */
static int check_outputs(const pretrain_cli *o, cli_outputs *outs, size_t *plot_index,
                         char **state_path) {
    if (o->save) {
        size_t n = strlen(o->save);
        *state_path = malloc(n + sizeof ".state");
        if (!*state_path) return cli_failure("--save: out of memory");
        memcpy(*state_path, o->save, n);
        memcpy(*state_path + n, ".state", sizeof ".state");
        cli_outputs probe;
        size_t index;
        cli_outputs_init(&probe, outs->ctx);
        int rc = cli_outputs_add(&probe, "--save", o->save, &index);
        if (rc == CLI_OK) rc = cli_outputs_add(&probe, "--save", *state_path, &index);
        if (rc == CLI_OK) rc = not_inputs(&probe, o);
        /* --plot's file is written too: not one of --save's */
        if (rc == CLI_OK && o->plot) rc = cli_outputs_add(&probe, "--plot", o->plot, &index);
        cli_outputs_free(&probe);
        if (rc != CLI_OK) return rc;
    }
    int resumed = not_resumed(o, *state_path);
    if (resumed != CLI_OK) return resumed;
    if (o->plot) {
        if (!cli_png_available())
            return cli_usage_error("--plot: this attn was built without libpng, so it writes no "
                                   "PNG");
        int rc = cli_outputs_add(outs, "--plot", o->plot, plot_index);
        if (rc == CLI_OK) rc = not_inputs(outs, o);
        if (rc != CLI_OK) return rc;
    }
    return CLI_OK;
}

/* Whether the library replaces path whole (absent, or a regular file):
 * anything else (a FIFO, a device) is written in place, with no temporary. */
static bool replaced_whole(const char *path) {
    struct stat st;
    return stat(path, &st) != 0 || S_ISREG(st.st_mode);
}

/* attn_pretrain_save with the signals held: a signal waits until both
 * files are in place, so that none leaves the library's temporaries behind
 * or a model without its state. Where either file is written in place (a
 * FIFO) the signals stay free: opening a FIFO waits for its reader, and a
 * signal must end that wait. Only once what the run printed is out
 * (cli_stdout_flushed): a run whose printing failed fails, and leaves no
 * file new or changed. */
static int save_run(pretrain_state *s, const char *path) {
    if (!cli_stdout_flushed()) return CLI_FAILED;
    bool hold = replaced_whole(path) && replaced_whole(s->state_path);
    if (hold) cli_interrupt_hold();
    attn_status st = attn_pretrain_save(s->run, path);
    if (hold) cli_interrupt_release();
    return st == ATTN_OK ? CLI_OK : cli_library_error(s->ctx, "--save");
}

/* A resumed run whose first event is past --epochs (its DONE, or the
 * evaluation or sample still owed by a later epoch than --epochs) would
 * train nothing: a usage error naming both counts. */
static int check_resumed_epochs(const pretrain_cli *o, const attn_pretrain_event *ev) {
    if (ev->kind != ATTN_PRETRAIN_DONE && ev->epoch <= o->run.epochs) return CLI_OK;
    /* DONE carries the epochs finished; the others, the epoch under way */
    size_t finished = ev->kind == ATTN_PRETRAIN_DONE ? ev->epoch : ev->epoch - 1;
    return cli_usage_error("--epochs %zu: the run saved in '%s' has finished %zu epoch%s, so it "
                           "trains nothing: give --epochs %zu or more (counted from the run's "
                           "start)",
                           o->run.epochs, o->resume, finished, finished == 1 ? "" : "s",
                           finished + 1);
}

/* The run stopped by signal sig after the event last (NULL: before the
 * first): saved unless the save already holds it (saved), the plot of the
 * evaluations so far, one line, and the status of a command the signal
 * stopped. */
static int stop_interrupted(pretrain_state *s, const pretrain_cli *o, cli_outputs *outs,
                            size_t plot_index, int sig, const attn_pretrain_event *last,
                            bool saved) {
    const char *name = cli_interrupt_name(sig);
    if (!last) {
        cli_note("pretrain: interrupted (%s) before its first step: nothing was trained, "
                 "nothing saved",
                 name);
        return cli_interrupt_status(sig);
    }
    int rc = CLI_OK;
    if (o->save && !saved) rc = save_run(s, o->save);
    size_t evaluations = 0;
    const uint64_t *tokens;
    const double *train, *val;
    if (rc == CLI_OK && o->plot &&
        attn_pretrain_history(s->run, &evaluations, &tokens, &train, &val) != ATTN_OK)
        rc = cli_library_error(s->ctx, "--plot");
    if (rc == CLI_OK && o->plot && evaluations > 0) {
        size_t evals = last->total_steps ? (last->total_steps - 1) / o->run.eval_freq + 1 : 0;
        rc = write_plot(s->ctx, outs, plot_index, o->plot, s->run, o->run.epochs, evals);
        if (rc == CLI_OK) rc = cli_outputs_commit(outs, true);
    }
    if (rc != CLI_OK) return rc;
    const char *plot_note = !o->plot          ? ""
                            : evaluations > 0 ? "; plotted the losses so far in "
                                              : "; no evaluation yet to plot in ";
    if (o->save)
        cli_note("pretrain: interrupted (%s) at epoch %zu, step %06zu; saved the run in %s: "
                 "continue it with --resume %s%s%s",
                 name, last->epoch, last->step, o->save, o->save, plot_note,
                 o->plot ? o->plot : "");
    else
        cli_note("pretrain: interrupted (%s) at epoch %zu, step %06zu; nothing saved (--save "
                 "FILE keeps a run to --resume)%s%s",
                 name, last->epoch, last->step, plot_note, o->plot ? o->plot : "");
    return cli_interrupt_status(sig);
}

static int train(pretrain_state *s, const pretrain_cli *o, cli_outputs *outs,
                 size_t plot_index) {
    progress p = {.live = isatty(fileno(stderr)) != 0, .start = cli_now_seconds()};
    bool first = true;
    attn_pretrain_event last = {0};
    bool saved = false; /* --save holds the run as it stands */
    for (;;) {
        /* the safe point: between events (attn.h, "Save and resume at any
         * point between events") */
        int sig = cli_interrupt_pending();
        if (sig) {
            progress_clear(&p);
            return stop_interrupted(s, o, outs, plot_index, sig, first ? NULL : &last, saved);
        }
        attn_pretrain_event ev;
        if (attn_pretrain_next(s->run, &ev) != ATTN_OK) {
            progress_clear(&p);
            return cli_library_error(s->ctx, "pretrain");
        }
        if (first) {
            if (o->resume) {
                int rc = check_resumed_epochs(o, &ev);
                if (rc != CLI_OK) return rc;
            }
            p.steps_at_start = ev.kind == ATTN_PRETRAIN_STEP ? ev.step : 0;
            p.tokens_at_start = ev.tokens_seen - (ev.kind == ATTN_PRETRAIN_STEP ?
                                (uint64_t)o->run.batch_size * o->run.max_length : 0);
            first = false;
        }
        last = ev;
        saved = false;
        bool epoch_end = false;
        switch (ev.kind) {
        case ATTN_PRETRAIN_STEP:
            progress_show(&p, &ev);
            epoch_end = o->run.start_context && o->run.start_context[0] == '\0' &&
                        (ev.step + 1) % ev.steps_per_epoch == 0;
            break;
        case ATTN_PRETRAIN_EVAL:
            progress_clear(&p);
            printf("Ep %zu (Step %06zu): Train loss ", ev.epoch, ev.step);
            print_loss(ev.train_loss);
            fputs(", Val loss ", stdout);
            print_loss(ev.val_loss);
            putchar('\n');
            fflush(stdout);
            break;
        case ATTN_PRETRAIN_SAMPLE:
            progress_clear(&p);
            print_sample(ev.sample, ev.sample_length);
            fflush(stdout);
            epoch_end = true;
            break;
        case ATTN_PRETRAIN_DONE:
            progress_clear(&p);
            return o->save ? save_run(s, o->save) : CLI_OK;
        }
        /* --save after every epoch: a later failure keeps the last good one */
        if (epoch_end && o->save) {
            int rc = save_run(s, o->save);
            if (rc != CLI_OK) {
                progress_clear(&p);
                return rc;
            }
            saved = true;
        }
    }
}

static int parse_pretrain(int argc, char **argv) {
    pretrain_cli o;
    return parse_args(argc, argv, &o);
}

static int run_pretrain(int argc, char **argv) {
    pretrain_cli o;
    int rc = parse_args(argc, argv, &o);
    if (rc != CLI_OK) return rc;
    pretrain_state s = {0};
    attn_ctx_config cc = {.num_threads = o.threads};
    if ((rc = cli_ctx_new(&cc, &s.ctx)) != CLI_OK) return rc;
    cli_outputs outs;
    cli_outputs_init(&outs, s.ctx);
    size_t plot_index = 0;
    char *state_path = NULL;
    size_t length = 0;
    rc = check_outputs(&o, &outs, &plot_index, &state_path);
    s.state_path = state_path;
    if (rc == CLI_OK) rc = read_texts(&o, &s.text, &length);
    if (rc == CLI_OK && attn_tokenizer_load(s.ctx, o.tokenizer, &s.tok) != ATTN_OK)
        rc = cli_library_error(s.ctx, "--tokenizer");
    /* the files are joined with <|endoftext|>: a tokenizer without that
     * token would refuse the name as if a file held it */
    if (rc == CLI_OK && o.n_texts > 1 && attn_endoftext_id(s.tok) < 0)
        rc = cli_usage_error("--text: %zu files are joined with <|endoftext|>, and the "
                             "--tokenizer '%s' has no such token (its last id is not it): give "
                             "one --text file, or GPT-2's tokenizer",
                             o.n_texts, o.tokenizer);
    if (rc == CLI_OK && attn_rng_new(s.ctx, o.seed, &s.rng) != ATTN_OK)
        rc = cli_library_error(s.ctx, "--seed");
    if (rc == CLI_OK) rc = pretrain_model_new(s.ctx, &o, s.rng, &s.model);
    if (rc == CLI_OK) {
        attn_status st = attn_pretrain_new(s.ctx, s.model, s.tok, s.text, length, &o.run, s.rng,
                                           &s.run);
        /* the run's checks are about the flags' values */
        if (st == ATTN_ERR_INVALID) rc = cli_usage_error("pretrain: %s", attn_ctx_last_error(s.ctx));
        else if (st != ATTN_OK) rc = cli_library_error(s.ctx, "pretrain");
    }
    if (rc == CLI_OK && o.resume) {
        attn_status st = attn_pretrain_resume(s.run, o.resume);
        /* a checkpoint of another --batch-size, --max-length, --stride or
         * --text, or a model and state that do not belong together, is
         * refused as the run's own checks are; a file that cannot be read
         * or is damaged is a failure */
        if (st == ATTN_ERR_INVALID)
            rc = cli_usage_error("--resume: %s", attn_ctx_last_error(s.ctx));
        else if (st != ATTN_OK) rc = cli_library_error(s.ctx, "--resume");
    }
    if (rc == CLI_OK) {
        if (o.run.max_length == 0) o.run.max_length = attn_model_get_config(s.model).context_length;
        /* A signal before this point ends the process (interrupt.h): the
         * run has nothing to keep yet. From here it stops between events. */
        cli_interrupt_cooperate(true);
        rc = train(&s, &o, &outs, plot_index);
    }
    if (rc == CLI_OK && o.plot) {
        rc = write_plot(s.ctx, &outs, plot_index, o.plot, s.run, o.run.epochs, 0);
        if (rc == CLI_OK) rc = cli_outputs_commit(&outs, true);
    }
    rc = cli_interrupt_finish("pretrain", "the run is complete", rc);
    cli_outputs_free(&outs);
    free(state_path);
    state_free(&s);
    return rc;
}

const cli_command cli_pretrain_command = {
    .name = "pretrain",
    .summary = "train the book's GPT (or Llama 3) on text as chapter 5 does, loss for loss",
    .help = pretrain_help,
    .value_options = options,
    .parse = parse_pretrain,
    .run = run_pretrain,
};
