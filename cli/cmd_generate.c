/* cmd_generate.c — attn generate: the book's GPT-2 or Llama 3 (or a Hugging
 * Face checkpoint of either) writing tokens with its KV cache
 * (attn_lm_generate): greedy or sampled, streamed or at the end, from token
 * ids or from text through a tokenizer. */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"
#include "interrupt.h"
#include "train/text_data.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char generate_help[] =
    "usage: attn generate (--weights FILE|DIR [--config config.json] |\n"
    "                      --random-init SEED (--preset NAME | --config config.json))\n"
    "                     (--prompt-ids 1,2,3 | --prompt TEXT --tokenizer PATH)\n"
    "                     --max-new-tokens N [--model gpt2|gpt-gqa|gpt-mla|llama3]\n"
    "                     [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
    "                     [--stop-ids ID,...] [--cache contiguous|paged] [--page-size N]\n"
    "                     [--kv-dtype T | --k-dtype T --v-dtype T]\n"
    "                     [--tokenizer PATH] [--stream] [--stats] [--threads N]\n"
    "                     [--kernels auto|reference|portable|avx2|avx512]\n"
    "                     [--weights-dtype f32|bf16|f16] [--matmul-dtype f32|bf16]\n"
    "                     [--non-strict]\n"
    "\n"
    "Writes up to N new tokens after the prompt, one at a time, with a KV cache:\n"
    "the prompt is prefilled (cut to its last context_length tokens, as the book's\n"
    "generate_text_simple does), then each token is chosen from the last logits\n"
    "and fed back. The prompt and every new token but the last must fit the\n"
    "model's context_length: a longer run is refused before it starts.\n"
    "\n"
    "Output: the new token ids on the last line, comma separated; with\n"
    "--tokenizer, the decoded new text first (then a newline), as the book\n"
    "prints it: bytes that are not UTF-8 as U+FFFD. A stop token ends the run\n"
    "and is not written.\n"
    "\n"
    "  --weights P     a safetensors file (the book's state_dict names or Hugging\n"
    "                  Face's), a directory from save_pretrained (model.safetensors\n"
    "                  or a sharded model.safetensors.index.json, and config.json),\n"
    "                  or a sharded checkpoint's index file itself\n"
    "  --config F      the model's config.json (Hugging Face's keys or the book's\n"
    "                  cfg dict); without it, the config.json beside the weights;\n"
    "                  without either, a file of GPT-2 weights takes its sizes\n"
    "                  from the tensors (n_heads = emb_dim / 64)\n"
    "  --model M       gpt2, gpt-gqa or gpt-mla (the book's GPT with grouped-\n"
    "                  query or latent attention, gpt_with_kv_gqa.py and\n"
    "                  gpt_with_kv_mla.py) or llama3: the architecture the\n"
    "                  weights (or --random-init's --config) must have\n"
    "  --non-strict    load a file holding tensors the model does not use\n"
    "                  (load_state_dict(strict=False)), with a warning naming\n"
    "                  them; without it such a file is refused\n"
    "  --random-init S a model of --preset's (or --config's) shape with weights\n"
    "                  drawn as PyTorch's constructors draw them, torch.manual_seed(S)\n"
    "  --preset NAME   gpt2-small, gpt2-medium, gpt2-large, gpt2-xl, llama3.2-1b,\n"
    "                  llama3.2-3b, or the 2-layer gpt2-tiny and llama3-tiny (the\n"
    "                  real vocabularies, 64 wide)\n"
    "  --prompt-ids L  the prompt as token ids, comma separated\n"
    "  --prompt TEXT   the prompt as text, encoded with --tokenizer as the book's\n"
    "                  text_to_token_ids does (<|endoftext|>: GPT-2's special token)\n"
    "  --tokenizer P   GPT-2's (a directory, encoder.json + vocab.bpe or vocab.json\n"
    "                  + merges.txt) or a tiktoken file (Llama 3's\n"
    "                  tokenizer.model): encodes --prompt, decodes the output\n"
    "  --max-new-tokens N  the most tokens to write\n"
    "  --temperature T 0 (default): greedy, the first of equal maxima; > 0:\n"
    "                  sample from softmax(logits / T)\n"
    "  --top-k K       sample among the K largest logits (0, default: all)\n"
    "  --top-p P       then among the fewest most likely tokens reaching\n"
    "                  probability P (0 or 1, default: all)\n"
    "  --seed S        the sampler's torch.manual_seed (default 123)\n"
    "  --stop-ids L    token ids that end the run (comma separated)\n"
    "  --cache C       contiguous (default) or paged\n"
    "  --page-size N   tokens per page of the paged cache (default 16)\n"
    "  --kv-dtype T    how the cache stores K and V: f32 (default), bf16, f16,\n"
    "                  fp8 (e4m3, a scale per token and head), int8 (a scale\n"
    "                  per token and head) or int4 (a scale per 32 elements);\n"
    "                  --k-dtype and --v-dtype choose them apart\n"
    "  --stream        prints each token (or its text) as it comes\n"
    "  --stats         prints to stderr the load time, the weights' bytes, the\n"
    "                  cache's bytes per token and the accuracy class of its\n"
    "                  K/V types (measured: docs/generation.md), the time to first token\n"
    "                  (prefill + first token) and the per-token times\n"
    "  --threads N     worker threads (default: all online CPUs)\n"
    "  --kernels K     auto (default), reference, portable, avx2 or avx512\n"
    "  --weights-dtype T  how the linear layers and the embedding are held:\n"
    "                  f32, bf16 or f16 (default: the file's; f32 with\n"
    "                  --random-init); float32 accumulation either way. A\n"
    "                  checkpoint T cannot hold (bf16 as f16 past 65504 or\n"
    "                  below f16's precision) is refused, naming the tensor\n"
    "  --matmul-dtype T  the products' inputs: f32 (default: only the sums\n"
    "                  round) or bf16 (bf16 weights only: the activations\n"
    "                  rounded to bf16 and the products on the CPU's bf16\n"
    "                  instructions, a prompt up to twice as fast; the\n"
    "                  logits move by the rounding, docs/generation.md)\n"
    "\n"
    "Interrupting (Ctrl-C, SIGTERM, SIGHUP) while it writes tokens: it stops after\n"
    "the token under way, writes the output of the tokens so far (complete lines),\n"
    "and one line on stderr says how many; a second signal ends it at once.\n"
    "Exit status: 0 done, 1 failed, 2 bad usage, 128 + the signal's number when\n"
    "interrupted (130 for Ctrl-C, 143 for SIGTERM).\n";

static const char *const generate_value_options[] = {
    "--weights", "--config",   "--model",   "--random-init", "--preset",   "--prompt-ids",
    "--prompt",  "--tokenizer", "--max-new-tokens", "--temperature", "--top-k", "--top-p",
    "--seed",    "--stop-ids", "--cache",   "--page-size",   "--threads",  "--kernels",
    "--kv-dtype", "--k-dtype", "--v-dtype", "--weights-dtype", "--matmul-dtype", NULL};

typedef struct id_list {
    int32_t *ids;
    size_t n;
} id_list;

typedef struct generate_options {
    const char *weights, *config, *preset, *prompt, *prompt_ids, *stop_ids, *tokenizer;
    attn_lm_arch model; /* 0: any */
    bool random_init, max_given, stream, stats, non_strict;
    uint64_t init_seed, seed;
    size_t max_new_tokens, page_size, threads;
    attn_sampling sampling;
    attn_kv_layout layout;
    attn_dtype k_dtype, v_dtype;
    bool kv_dtype_given; /* as --kv-dtype, not --k-dtype and --v-dtype */
    attn_kernels kernels;
    /* --weights-dtype */
    bool weights_dtype_given;
    attn_dtype weights_dtype;
    attn_dtype matmul_dtype; /* --matmul-dtype */
} generate_options;

/* ---- presets -------------------------------------------------------------- */

typedef struct preset {
    const char *name;
    attn_lm_config cfg;
} preset;

#define GPT2(V, T, C, H, L)                                                              \
    {.arch = ATTN_LM_GPT2, .vocab_size = V, .context_length = T, .emb_dim = C, .n_heads = H, \
     .n_layers = L, .qkv_bias = true, .tie_embeddings = true}
/* Llama 3.2's RoPE: theta 500000, scaled by 32 from 8192 positions */
#define LLAMA32(T, C, H, KV, L, HID)                                                        \
    {.arch = ATTN_LM_LLAMA3, .vocab_size = 128256, .context_length = T, .emb_dim = C,         \
     .n_heads = H, .n_kv_groups = KV, .n_layers = L, .hidden_dim = HID, .tie_embeddings = true, \
     .rope_base = 500000.0, .rope_factor = 32.0, .rope_low_freq_factor = 1.0,                 \
     .rope_high_freq_factor = 4.0, .rope_original_context_length = 8192}

/* the tiny ones untied: a random tied head mostly repeats the input token */
#define GPT2_UNTIED(V, T, C, H, L) \
    {.arch = ATTN_LM_GPT2, .vocab_size = V, .context_length = T, .emb_dim = C, .n_heads = H, \
     .n_layers = L, .qkv_bias = true}
#define LLAMA32_UNTIED(T, C, H, KV, L, HID)                                                  \
    {.arch = ATTN_LM_LLAMA3, .vocab_size = 128256, .context_length = T, .emb_dim = C,          \
     .n_heads = H, .n_kv_groups = KV, .n_layers = L, .hidden_dim = HID, .rope_base = 500000.0, \
     .rope_factor = 32.0, .rope_low_freq_factor = 1.0, .rope_high_freq_factor = 4.0,           \
     .rope_original_context_length = 8192}

static const preset presets[] = {
    {"gpt2-small", GPT2(50257, 1024, 768, 12, 12)},
    {"gpt2-medium", GPT2(50257, 1024, 1024, 16, 24)},
    {"gpt2-large", GPT2(50257, 1024, 1280, 20, 36)},
    {"gpt2-xl", GPT2(50257, 1024, 1600, 25, 48)},
    {"llama3.2-1b", LLAMA32(131072, 2048, 32, 8, 16, 8192)},
    {"llama3.2-3b", LLAMA32(131072, 3072, 24, 8, 28, 8192)},
    {"gpt2-tiny", GPT2_UNTIED(50257, 256, 64, 4, 2)},
    {"llama3-tiny", LLAMA32_UNTIED(256, 64, 4, 2, 2, 128)},
};
#define NUM_PRESETS (sizeof presets / sizeof presets[0])

static const char *arch_name(attn_lm_arch arch) {
    return arch == ATTN_LM_GPT2      ? "gpt2"
           : arch == ATTN_LM_GPT_GQA ? "gpt-gqa"
           : arch == ATTN_LM_GPT_MLA ? "gpt-mla"
           : arch == ATTN_LM_LLAMA3  ? "llama3"
                                     : "unknown";
}

static const preset *find_preset(const char *name) {
    for (size_t i = 0; i < NUM_PRESETS; i++)
        if (strcmp(name, presets[i].name) == 0) return &presets[i];
    return NULL;
}

/* ---- argument parsing ---------------------------------------------------- */

/* "1,2,3": token ids (0 .. INT32_MAX), at least one; NULL ids when text is
 * only being checked. */
static int parse_ids(const char *opt, const char *text, id_list *out) {
    size_t n = 1;
    for (const char *c = text; *c; c++) n += *c == ',';
    int32_t *ids = out ? malloc(n * sizeof *ids) : NULL;
    if (out && !ids) return cli_failure("%s: out of memory for %zu ids", opt, n);
    const char *at = text;
    for (size_t i = 0; i < n; i++) {
        const char *comma = strchr(at, ',');
        size_t len = comma ? (size_t)(comma - at) : strlen(at);
        char digits[24];
        uint64_t id;
        bool ok = len > 0 && len < sizeof digits;
        if (ok) {
            memcpy(digits, at, len);
            digits[len] = '\0';
            ok = cli_parse_u64(digits, &id) && id <= INT32_MAX;
        }
        if (!ok) {
            free(ids);
            return cli_usage_error("%s: expected token ids (integers 0 .. %d) separated by "
                                   "commas, got '%s'",
                                   opt, INT32_MAX, text);
        }
        if (ids) ids[i] = (int32_t)id;
        at += len + 1;
    }
    if (out) *out = (id_list){ids, n};
    return CLI_OK;
}

static int parse_count(const char *opt, const char *value, size_t *out, bool positive) {
    if (!cli_parse_size(value, out) || (positive && *out == 0))
        return cli_usage_error("%s: expected a %s integer, got '%s'", opt,
                               positive ? "positive" : "non-negative", value);
    return CLI_OK;
}

/* One value option. */
static int take_value(generate_options *o, const char *opt, const char *value) {
    const char **text = strcmp(opt, "--weights") == 0      ? &o->weights
                        : strcmp(opt, "--config") == 0     ? &o->config
                        : strcmp(opt, "--prompt") == 0     ? &o->prompt
                        : strcmp(opt, "--tokenizer") == 0  ? &o->tokenizer
                        : strcmp(opt, "--prompt-ids") == 0 ? &o->prompt_ids
                        : strcmp(opt, "--stop-ids") == 0   ? &o->stop_ids
                        : strcmp(opt, "--preset") == 0     ? &o->preset
                                                           : NULL;
    if (text) {
        *text = value;
        if (strcmp(opt, "--prompt-ids") == 0 || strcmp(opt, "--stop-ids") == 0)
            return parse_ids(opt, value, NULL);
        if (strcmp(opt, "--preset") == 0 && !find_preset(value))
            return cli_usage_error("--preset: expected gpt2-small, gpt2-medium, gpt2-large, "
                                   "gpt2-xl, llama3.2-1b, llama3.2-3b, gpt2-tiny or "
                                   "llama3-tiny, got '%s'",
                                   value);
        return CLI_OK;
    }
    if (strcmp(opt, "--model") == 0) {
        if (strcmp(value, "gpt2") == 0) o->model = ATTN_LM_GPT2;
        else if (strcmp(value, "gpt-gqa") == 0) o->model = ATTN_LM_GPT_GQA;
        else if (strcmp(value, "gpt-mla") == 0) o->model = ATTN_LM_GPT_MLA;
        else if (strcmp(value, "llama3") == 0) o->model = ATTN_LM_LLAMA3;
        else return cli_usage_error("--model: expected gpt2, gpt-gqa, gpt-mla or llama3, got "
                                    "'%s'", value);
    } else if (strcmp(opt, "--random-init") == 0 || strcmp(opt, "--seed") == 0) {
        bool init = strcmp(opt, "--random-init") == 0;
        if (!cli_parse_u64(value, init ? &o->init_seed : &o->seed))
            return cli_usage_error("%s: expected a non-negative integer, got '%s'", opt, value);
        o->random_init |= init;
    } else if (strcmp(opt, "--max-new-tokens") == 0) {
        o->max_given = true;
        return parse_count(opt, value, &o->max_new_tokens, false);
    } else if (strcmp(opt, "--top-k") == 0) {
        return parse_count(opt, value, &o->sampling.top_k, false);
    } else if (strcmp(opt, "--page-size") == 0) {
        return parse_count(opt, value, &o->page_size, true);
    } else if (strcmp(opt, "--threads") == 0) {
        return parse_count(opt, value, &o->threads, true);
    } else if (strcmp(opt, "--temperature") == 0) {
        if (!cli_parse_double(value, &o->sampling.temperature))
            return cli_bad_number(opt, value, "a number >= 0");
        if (!(o->sampling.temperature >= 0.0) || isinf(o->sampling.temperature))
            return cli_usage_error("--temperature: expected a finite number >= 0 (0: greedy), "
                                   "got '%s'",
                                   value);
    } else if (strcmp(opt, "--top-p") == 0) {
        if (!cli_parse_double(value, &o->sampling.top_p))
            return cli_bad_number(opt, value, "a probability in [0, 1]");
        if (!(o->sampling.top_p >= 0.0 && o->sampling.top_p <= 1.0))
            return cli_usage_error("--top-p: expected a probability in [0, 1], got '%s'", value);
    } else if (strcmp(opt, "--kv-dtype") == 0) {
        if (cli_parse_kv_dtype(opt, value, &o->k_dtype) != CLI_OK) return CLI_USAGE;
        o->v_dtype = o->k_dtype;
    } else if (strcmp(opt, "--k-dtype") == 0 || strcmp(opt, "--v-dtype") == 0) {
        return cli_parse_kv_dtype(opt, value, opt[2] == 'k' ? &o->k_dtype : &o->v_dtype);
    } else if (strcmp(opt, "--cache") == 0) {
        if (strcmp(value, "contiguous") == 0) o->layout = ATTN_KV_CONTIGUOUS;
        else if (strcmp(value, "paged") == 0) o->layout = ATTN_KV_PAGED;
        else return cli_usage_error("--cache: expected contiguous or paged, got '%s'", value);
    } else if (strcmp(opt, "--weights-dtype") == 0) {
        o->weights_dtype_given = true;
        if (strcmp(value, "f32") == 0) o->weights_dtype = ATTN_DTYPE_F32;
        else if (strcmp(value, "bf16") == 0) o->weights_dtype = ATTN_DTYPE_BF16;
        else if (strcmp(value, "f16") == 0) o->weights_dtype = ATTN_DTYPE_F16;
        else return cli_usage_error("--weights-dtype: expected f32, bf16 or f16, got '%s'", value);
    } else if (strcmp(opt, "--matmul-dtype") == 0) {
        if (strcmp(value, "f32") == 0) o->matmul_dtype = ATTN_DTYPE_F32;
        else if (strcmp(value, "bf16") == 0) o->matmul_dtype = ATTN_DTYPE_BF16;
        else return cli_usage_error("--matmul-dtype: expected f32 or bf16, got '%s'", value);
    } else { /* --kernels */
        return cli_parse_kernels(value, &o->kernels);
    }
    return CLI_OK;
}

static int parse_args(int argc, char **argv, generate_options *o) {
    *o = (generate_options){.seed = 123, .threads = cli_default_threads(),
                            .kernels = ATTN_KERNELS_AUTO, .layout = ATTN_KV_CONTIGUOUS};
    bool page_size_given = false, kv_given = false, k_or_v_given = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--stream") == 0) {
            o->stream = true;
            continue;
        }
        if (strcmp(argv[i], "--stats") == 0) {
            o->stats = true;
            continue;
        }
        if (strcmp(argv[i], "--non-strict") == 0) {
            o->non_strict = true;
            continue;
        }
        const char *value = cli_option_value(argc, argv, &i, generate_value_options);
        if (!value || take_value(o, argv[i - 1], value) != CLI_OK) return CLI_USAGE;
        page_size_given |= strcmp(argv[i - 1], "--page-size") == 0;
        kv_given |= strcmp(argv[i - 1], "--kv-dtype") == 0;
        k_or_v_given |= strcmp(argv[i - 1], "--k-dtype") == 0 ||
                        strcmp(argv[i - 1], "--v-dtype") == 0;
    }
    o->kv_dtype_given = kv_given;
    if (kv_given && k_or_v_given)
        return cli_usage_error("generate: --kv-dtype sets K and V; --k-dtype and --v-dtype set "
                               "them apart: give one or the others");
    if (!o->weights == !o->random_init)
        return cli_usage_error("generate: give the model as --weights, or as --random-init "
                               "SEED --preset NAME (try 'attn generate --help')");
    if (o->random_init && !o->preset == !o->config)
        return cli_usage_error("generate: --random-init needs the model's shape: --preset NAME "
                               "or --config config.json (one of them)");
    if (o->preset && !o->random_init)
        return cli_usage_error("generate: --preset goes with --random-init");
    if (o->non_strict && !o->weights)
        return cli_usage_error("generate: --non-strict is how --weights loads: give --weights");
    if (!o->prompt == !o->prompt_ids)
        return cli_usage_error("generate: give the prompt as --prompt-ids or as --prompt "
                               "(one of them)");
    if (o->prompt && !o->tokenizer)
        return cli_usage_error("generate: --prompt needs --tokenizer to encode it");
    if (o->prompt && !*o->prompt)
        return cli_usage_error("generate: --prompt is empty: a prompt needs a token");
    if (!o->max_given) return cli_usage_error("generate: --max-new-tokens N is required");
    if (page_size_given && o->layout != ATTN_KV_PAGED)
        return cli_usage_error("generate: --page-size sizes the paged cache: add --cache paged");
    if (o->preset && o->model && find_preset(o->preset)->cfg.arch != o->model)
        return cli_usage_error("generate: --preset %s is not a %s model", o->preset,
                               arch_name(o->model));
    return CLI_OK;
}

static int parse_generate(int argc, char **argv) {
    generate_options o;
    return parse_args(argc, argv, &o);
}

/* ---- running -------------------------------------------------------------- */

static int load_model(attn_ctx *ctx, const generate_options *o, attn_lm **out) {
    *out = NULL;
    if (o->random_init) {
        attn_rng *rng;
        if (attn_rng_new(ctx, o->init_seed, &rng) != ATTN_OK)
            return cli_library_error(ctx, "--random-init");
        attn_lm_config cfg;
        attn_status st = ATTN_OK;
        if (o->preset)
            cfg = find_preset(o->preset)->cfg;
        else
            st = attn_lm_config_read(ctx, o->config, &cfg);
        if (st == ATTN_OK && o->model && cfg.arch != o->model) {
            attn_rng_free(rng);
            return cli_failure("--model: the config '%s' is %s's, not %s", o->config,
                               arch_name(cfg.arch), arch_name(o->model));
        }
        cfg.weights_dtype = o->weights_dtype_given ? o->weights_dtype : ATTN_DTYPE_F32;
        if (st == ATTN_OK) st = attn_lm_new(ctx, &cfg, rng, out);
        attn_rng_free(rng);
        return st == ATTN_OK ? CLI_OK : cli_library_error(ctx, o->preset ? "--preset" : "--config");
    }
    unsigned flags = o->weights_dtype_given ? 0u : (unsigned)ATTN_LM_LOAD_FILE_DTYPE;
    attn_status loaded = attn_lm_load_ex(ctx, o->weights, o->config, NULL, o->weights_dtype,
                                         flags, out);
    if (loaded != ATTN_OK && o->non_strict) {
        /* the strict load's message names the tensors the model leaves
         * unused: the warning, when the non-strict load then succeeds */
        char *strict_error = strdup(attn_ctx_last_error(ctx));
        if (!strict_error) return cli_failure("--weights: out of memory");
        loaded = attn_lm_load_ex(ctx, o->weights, o->config, NULL, o->weights_dtype,
                                 flags | ATTN_LM_LOAD_NON_STRICT, out);
        if (loaded == ATTN_OK)
            fprintf(stderr, "attn generate: warning: --non-strict: %s\n", strict_error);
        free(strict_error);
    }
    if (loaded != ATTN_OK) {
        /* a config file's failure begins with its path */
        const char *message = attn_ctx_last_error(ctx);
        size_t n = o->config ? strlen(o->config) : 0;
        bool config = n && strncmp(message, o->config, n) == 0 && message[n] == ':';
        return cli_library_error(ctx, config ? "--config" : "--weights");
    }
    attn_lm_arch arch = attn_lm_get_config(*out).arch;
    if (o->model && arch != o->model) {
        attn_lm_free(*out);
        *out = NULL;
        return cli_failure("--model: the weights in '%s' are %s, not %s", o->weights,
                           arch_name(arch), arch_name(o->model));
    }
    return CLI_OK;
}

/* The bytes of ids (*text, *length; freed by the caller). */
static int decode(attn_ctx *ctx, attn_tokenizer *tok, const int32_t *ids, size_t n, char **text,
                  size_t *length) {
    size_t capacity = 16 * n + 16;
    for (int attempt = 0; attempt < 2; attempt++) {
        char *buf = malloc(capacity ? capacity : 1);
        if (!buf) return cli_failure("out of memory decoding %zu tokens", n);
        attn_status st = attn_tokenizer_decode(tok, ids, n, buf, capacity, length);
        if (st == ATTN_OK) {
            *text = buf;
            return CLI_OK;
        }
        free(buf);
        if (st != ATTN_ERR_SHAPE) return cli_library_error(ctx, "--tokenizer");
        capacity = *length; /* the length it needs */
    }
    return cli_library_error(ctx, "--tokenizer");
}

/* The prompt's ids, from --prompt-ids or --prompt through the tokenizer as
 * the book's text_to_token_ids encodes it, tokenizer.encode(text,
 * allowed_special={"<|endoftext|>"}): the name is the special token where
 * the tokenizer has it (GPT-2's 50256), plain text where it has none
 * (Llama 3's, whose tiktoken encoding holds no such special). */
static int prompt_ids(attn_ctx *ctx, const generate_options *o, attn_tokenizer *tok,
                      id_list *out) {
    if (o->prompt_ids) return parse_ids("--prompt-ids", o->prompt_ids, out);
    size_t len = strlen(o->prompt), capacity = len + 1, count = 0;
    bool special = attn_endoftext_id(tok) >= 0;
    for (int attempt = 0; attempt < 2; attempt++) {
        int32_t *ids = malloc(capacity * sizeof *ids);
        if (!ids) return cli_failure("--prompt: out of memory for %zu tokens", capacity);
        attn_status st =
            special ? attn_encode_with_endoftext(ctx, "the prompt", tok, o->prompt, len, ids,
                                                 capacity, &count)
                    : attn_tokenizer_encode(tok, o->prompt, len, ids, capacity, &count);
        if (st == ATTN_OK) {
            *out = (id_list){ids, count};
            return count ? CLI_OK : cli_failure("--prompt: the text encodes to no tokens");
        }
        free(ids);
        if (st != ATTN_ERR_SHAPE) return cli_library_error(ctx, "--prompt");
        capacity = count;
    }
    return cli_library_error(ctx, "--prompt");
}

static double seconds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* What the token callback needs: streaming and the clock. */
typedef struct stream_state {
    attn_ctx *ctx;
    attn_tokenizer *tok; /* NULL: stream ids */
    bool stream;
    int32_t *ids;        /* the tokens so far (the run's out) */
    size_t count, printed_bytes;
    double start, first, last;
    bool failed;
} stream_state;

/* Returning false stops the run (attn_lm_generate): after a failure, and
 * at a signal, the safe point between tokens. */
static bool on_token(void *user, int32_t token) {
    stream_state *s = user;
    s->last = seconds_now();
    if (s->count == 0) s->first = s->last;
    s->count++; /* attn_lm_generate has written it to ids[count - 1] */
    bool go_on = !cli_interrupt_pending();
    if (!s->stream) return go_on;
    if (!s->tok) {
        printf(s->count == 1 ? "%d" : ",%d", (int)token);
    } else {
        /* the text of everything so far, printed past what already was:
         * a character cut between tokens waits for the next token */
        char *text;
        size_t length;
        if (decode(s->ctx, s->tok, s->ids, s->count, &text, &length) != CLI_OK) {
            s->failed = true;
            return false;
        }
        s->printed_bytes += cli_write_text(stdout, text + s->printed_bytes,
                                           length - s->printed_bytes, false, false);
        free(text);
    }
    /* a reader gone under an ignored SIGPIPE: the run stops, and
     * cli_finish reports the failed write */
    if (fflush(stdout) != 0 || ferror(stdout)) return false;
    return go_on;
}

static int print_ids(const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", (int)ids[i]);
    putchar('\n');
    return CLI_OK;
}

/* Prints the run's result (what streaming has not printed yet). */
static int print_result(attn_ctx *ctx, const stream_state *s) {
    if (s->tok) {
        /* the text as the book prints it (tiktoken's decode replaces
         * ill-formed UTF-8), what streaming has not printed */
        char *text;
        size_t length;
        int rc = decode(ctx, s->tok, s->ids, s->count, &text, &length);
        if (rc != CLI_OK) return rc;
        size_t from = s->stream ? s->printed_bytes : 0;
        cli_write_text(stdout, text + from, length - from, true, false);
        free(text);
        putchar('\n');
        return print_ids(s->ids, s->count);
    }
    if (s->stream) putchar('\n');
    else print_ids(s->ids, s->count);
    return CLI_OK;
}

/* The model: its load time (reading or drawing its weights) and the bytes
 * they take, in their dtype. */
typedef struct model_stats {
    double load_seconds;
    size_t weight_bytes;
    attn_dtype weights_dtype, matmul_dtype;
} model_stats;

/* ---- the accuracy of the cache's types ------------------------------------- */

/* What each (K, V) storage type costs in accuracy: the mean KL divergence
 * (nats) of the next-token distribution from the float32 cache's, as
 * bench/kv_accuracy/kv_accuracy.py measures it on the trained
 * chapter-5-sized GPT (docs/generation.md, "KV cache types: memory and
 * accuracy"; the table there is the source of these numbers). */
static const struct {
    attn_dtype k, v;
    double mean_kl;
} kv_measured[] = {
    {ATTN_DTYPE_F32, ATTN_DTYPE_F32, 0.0},
    {ATTN_DTYPE_BF16, ATTN_DTYPE_BF16, 3.6e-8},
    {ATTN_DTYPE_F16, ATTN_DTYPE_F16, 5.9e-10},
    {ATTN_DTYPE_F8_E4M3, ATTN_DTYPE_F8_E4M3, 8.5e-6},
    {ATTN_DTYPE_I8, ATTN_DTYPE_I8, 4.4e-7},
    {ATTN_DTYPE_I4, ATTN_DTYPE_I4, 1.0e-4},
    {ATTN_DTYPE_I8, ATTN_DTYPE_I4, 3.5e-5},
    {ATTN_DTYPE_BF16, ATTN_DTYPE_I8, 1.8e-7},
    {ATTN_DTYPE_F8_E4M3, ATTN_DTYPE_I4, 4.3e-5},
};

/* The same for a latent cache (values_are_keys), one type: generation.md's
 * table of the trained model with latent attention. */
static const struct {
    attn_dtype t;
    double mean_kl;
} latent_measured[] = {
    {ATTN_DTYPE_F32, 0.0},       {ATTN_DTYPE_BF16, 4.4e-9}, {ATTN_DTYPE_F16, 7.1e-11},
    {ATTN_DTYPE_F8_E4M3, 7.5e-7}, {ATTN_DTYPE_I8, 2.7e-8},  {ATTN_DTYPE_I4, 1.1e-5},
};

/* The classes of generation.md: below 1e-5 nats a sampled run would need
 * some 1e5 tokens to tell the two caches apart; below 1e-3 the argmax
 * rarely changes. */
static const char *kv_class(double mean_kl) {
    return mean_kl == 0.0 ? "exact" : mean_kl < 1e-5 ? "near-exact"
                                    : mean_kl < 1e-3 ? "near-lossless"
                                                     : "lossy";
}

/* The measured K=V row of a type, or -1 (none). */
static double kv_measured_kl(attn_dtype k, attn_dtype v) {
    for (size_t i = 0; i < sizeof kv_measured / sizeof kv_measured[0]; i++)
        if (kv_measured[i].k == k && kv_measured[i].v == v) return kv_measured[i].mean_kl;
    return -1.0;
}

/* A pair not measured takes the class of the worse of its two types' K=V
 * figures, which errs on the cautious side: a K=V row carries the type's
 * error in both K and V. */
static void print_kv_accuracy(attn_dtype k, attn_dtype v) {
    const char *kn = cli_kv_dtype_name(k), *vn = cli_kv_dtype_name(v);
    double kl = kv_measured_kl(k, v);
    if (kl == 0.0) {
        fprintf(stderr, "attn generate: kv cache %s/%s: exact (the reference of the accuracy "
                "table, docs/generation.md)\n", kn, vn);
        return;
    }
    if (kl > 0.0) {
        fprintf(stderr, "attn generate: kv cache %s/%s: %s (mean KL %.1e on the trained "
                "chapter-5-sized model, docs/generation.md)\n", kn, vn, kv_class(kl), kl);
        return;
    }
    double kk = kv_measured_kl(k, k), vv = kv_measured_kl(v, v);
    const char *worse = kk >= vv ? kn : vn;
    kl = kk >= vv ? kk : vv;
    fprintf(stderr, "attn generate: kv cache %s/%s: %s, estimated from %s/%s (mean KL %.1e on "
            "the trained chapter-5-sized model, docs/generation.md)\n", kn, vn, kv_class(kl),
            worse, worse, kl);
}

/* A latent cache's bytes and the measured class of its type. */
static void print_latent_accuracy(attn_dtype t, size_t token_bytes) {
    const char *name = cli_kv_dtype_name(t);
    fprintf(stderr, "attn generate: kv cache %zu bytes/token (the latent in %s, read as K and "
            "V; all layers, scales included)\n", token_bytes, name);
    for (size_t i = 0; i < sizeof latent_measured / sizeof latent_measured[0]; i++) {
        double kl = latent_measured[i].mean_kl;
        if (latent_measured[i].t != t) continue;
        if (kl == 0.0)
            fprintf(stderr, "attn generate: kv cache %s (latent): exact (the reference of the "
                    "accuracy table, docs/generation.md)\n", name);
        else
            fprintf(stderr, "attn generate: kv cache %s (latent): %s (mean KL %.1e on the "
                    "trained chapter-5-sized model with latent attention, docs/generation.md)"
                    "\n", name, kv_class(kl), kl);
    }
}

static void print_stats(const stream_state *s, size_t prompt_len, const model_stats *ms,
                        const attn_kv_cache *cache) {
    attn_kv_cache_config c = attn_kv_cache_get_config(cache);
    fprintf(stderr, "attn generate: load %.1f ms, weights %s %.1f MiB, products on %s inputs\n",
            1e3 * ms->load_seconds,
            ms->weights_dtype == ATTN_DTYPE_BF16  ? "bf16"
            : ms->weights_dtype == ATTN_DTYPE_F16 ? "f16"
                                                  : "f32",
            (double)ms->weight_bytes / (1024.0 * 1024.0),
            ms->matmul_dtype == ATTN_DTYPE_BF16 ? "bf16" : "f32");
    if (c.values_are_keys) {
        print_latent_accuracy(c.k_dtype, attn_kv_cache_token_bytes(cache));
    } else {
        fprintf(stderr, "attn generate: kv cache %zu bytes/token (K %s, V %s; all layers, "
                "scales included)\n", attn_kv_cache_token_bytes(cache),
                cli_kv_dtype_name(c.k_dtype), cli_kv_dtype_name(c.v_dtype));
        print_kv_accuracy(c.k_dtype, c.v_dtype);
    }
    /* the last step's attention: the backend (and kernel) that ran, the
     * explain record's "NAME: ran" among "NAME: declined (...)" */
    const char *explain = attn_ctx_last_explain(s->ctx);
    const char *ran = strstr(explain, ": ran");
    if (ran) {
        const char *name = explain;
        for (const char *at = explain; at < ran; at++)
            if (at[0] == ';' && at[1] == ' ') name = at + 2;
        fprintf(stderr, "attn generate: attention %.*s\n", (int)(ran - name), name);
    }
    if (s->count > 0)
        fprintf(stderr, "attn generate: time to first token %.1f ms\n",
                1e3 * (s->first - s->start));
    fprintf(stderr, "attn generate: prompt %zu tokens", prompt_len);
    if (s->count == 0) {
        fputs(", no new tokens\n", stderr);
        return;
    }
    fprintf(stderr, ", prefill + first token %.1f ms, %zu new tokens", 1e3 * (s->first - s->start),
            s->count);
    if (s->count > 1)
        fprintf(stderr, ", %.2f ms per token after (%.1f tokens/s)",
                1e3 * (s->last - s->first) / (double)(s->count - 1),
                (double)(s->count - 1) / (s->last - s->first));
    fputc('\n', stderr);
}

/* The option a refusal of the cache stems from, for its message: the K or V
 * type the library names, as the user gave it, else the page size, else
 * --cache. */
static const char *cache_option(const generate_options *o, const char *message) {
    bool k = strstr(message, "k_dtype") != NULL, v = strstr(message, "v_dtype") != NULL;
    if (k || v) return o->kv_dtype_given ? "--kv-dtype" : k ? "--k-dtype" : "--v-dtype";
    if (o->page_size) return "--page-size";
    return "--cache";
}

/* The cache for the run: the prompt (cut to context_length) and all but
 * the last new token; a run past context_length gets a full-size one and
 * attn_lm_generate's refusal. */
static int make_cache(attn_ctx *ctx, attn_lm *m, const generate_options *o, size_t prompt_len,
                      attn_kv_cache **out) {
    size_t context = attn_lm_get_config(m).context_length;
    size_t kept = prompt_len < context ? prompt_len : context;
    /* the positions the run needs, kept + max_new_tokens - 1, past the
     * context: refused here, before a cache or the output is sized by a
     * max_new_tokens that may be any size_t */
    if (o->max_new_tokens > context - kept + 1) {
        if (prompt_len > kept)
            return cli_failure("--max-new-tokens: the prompt (%zu tokens, cut to its last %zu) "
                               "and %zu new tokens do not fit the model's context_length %zu: "
                               "at most %zu new tokens do",
                               prompt_len, kept, o->max_new_tokens, context, context - kept + 1);
        return cli_failure("--max-new-tokens: the prompt (%zu tokens) and %zu new tokens do not "
                           "fit the model's context_length %zu: at most %zu new tokens do",
                           prompt_len, o->max_new_tokens, context, context - kept + 1);
    }
    size_t positions = kept + (o->max_new_tokens ? o->max_new_tokens - 1 : 0);
    attn_kv_cache_config cfg;
    if (attn_lm_cache_config(m, 1, positions, &cfg) != ATTN_OK)
        return cli_library_error(ctx, "--cache");
    cfg.layout = o->layout;
    cfg.page_size = o->page_size;
    if (cfg.values_are_keys && o->k_dtype != o->v_dtype)
        return cli_usage_error("--k-dtype %s, --v-dtype %s: this model caches one latent a "
                               "token, read as keys and as values: one type (--kv-dtype)",
                               cli_kv_dtype_name(o->k_dtype), cli_kv_dtype_name(o->v_dtype));
    cfg.k_dtype = o->k_dtype;
    cfg.v_dtype = o->v_dtype;
    if (attn_kv_cache_new(ctx, &cfg, out) == ATTN_OK) return CLI_OK;
    const char *why = attn_ctx_last_error(ctx);
    /* the cache's head_dim is then the latent's, not the model's heads' */
    if (cfg.values_are_keys)
        return cli_failure("%s: %s (this model caches its latent: one KV head of latent_dim "
                           "%zu)", cache_option(o, why), why, cfg.head_dim);
    return cli_library_error(ctx, cache_option(o, why));
}

static int generate(attn_ctx *ctx, attn_lm *m, const generate_options *o, attn_tokenizer *tok,
                    const id_list *prompt, const id_list *stops, const model_stats *ms) {
    attn_kv_cache *cache = NULL;
    attn_rng *rng = NULL;
    int rc = make_cache(ctx, m, o, prompt->n, &cache);
    if (rc == CLI_OK && attn_rng_new(ctx, o->seed, &rng) != ATTN_OK)
        rc = cli_library_error(ctx, "--seed");
    int32_t *out = rc == CLI_OK ? malloc((o->max_new_tokens ? o->max_new_tokens : 1) *
                                         sizeof *out)
                                : NULL;
    if (rc == CLI_OK && !out)
        rc = cli_failure("--max-new-tokens: out of memory for %zu tokens", o->max_new_tokens);
    if (rc == CLI_OK) {
        stream_state s = {.ctx = ctx, .tok = tok, .stream = o->stream, .ids = out};
        size_t count = 0;
        attn_generate_args a = {.prompt = prompt->ids, .prompt_len = prompt->n,
                                .max_new_tokens = o->max_new_tokens, .sampling = o->sampling,
                                .rng = rng, .stop_tokens = stops->ids,
                                .num_stop_tokens = stops->n, .cache = cache,
                                .on_token = on_token, .user = &s, .out = out, .count = &count};
        s.start = seconds_now();
        cli_interrupt_cooperate(true);
        attn_status st = attn_lm_generate(m, &a);
        if (s.failed) rc = CLI_FAILED;
        else if (st != ATTN_OK) rc = cli_library_error(ctx, "generate");
        else rc = print_result(ctx, &s);
        if (st == ATTN_OK && o->stats) print_stats(&s, prompt->n, ms, cache);
        int sig = cli_interrupt_pending();
        if (rc == CLI_OK && sig && s.count < o->max_new_tokens) {
            fflush(stdout);
            cli_note("generate: interrupted (%s) after %zu new token%s", cli_interrupt_name(sig),
                     s.count, s.count == 1 ? "" : "s");
            rc = cli_interrupt_status(sig);
        }
        rc = cli_interrupt_finish("generate", "every token is written", rc);
    }
    free(out);
    attn_rng_free(rng);
    attn_kv_cache_free(cache);
    return rc;
}

static int run_generate(int argc, char **argv) {
    generate_options o;
    int rc = parse_args(argc, argv, &o);
    if (rc != CLI_OK) return rc;
    attn_ctx *ctx;
    if ((rc = cli_ctx_new(&(attn_ctx_config){.num_threads = o.threads, .kernels = o.kernels},
                          &ctx)) != CLI_OK)
        return rc;
    attn_lm *m = NULL;
    attn_tokenizer *tok = NULL;
    id_list prompt = {0}, stops = {0};
    model_stats ms = {.load_seconds = seconds_now()};
    rc = load_model(ctx, &o, &m);
    ms.load_seconds = seconds_now() - ms.load_seconds;
    if (m) {
        ms.weight_bytes = attn_lm_weight_bytes(m);
        ms.weights_dtype = attn_lm_get_config(m).weights_dtype;
    }
    if (rc == CLI_OK && attn_lm_set_matmul_dtype(m, o.matmul_dtype) != ATTN_OK)
        rc = cli_library_error(ctx, "--matmul-dtype");
    ms.matmul_dtype = o.matmul_dtype;
    if (rc == CLI_OK && o.tokenizer && attn_tokenizer_load(ctx, o.tokenizer, &tok) != ATTN_OK)
        rc = cli_library_error(ctx, "--tokenizer");
    /* a model that can write ids the tokenizer cannot decode: refused
     * before the run, not found when its text is printed */
    if (rc == CLI_OK && tok && attn_tokenizer_vocab_size(tok) < attn_lm_get_config(m).vocab_size)
        rc = cli_failure("--tokenizer: '%s' has %zu tokens, fewer than the model's vocab_size "
                         "%zu, so the model can write ids it cannot decode: give a tokenizer of "
                         "the model's vocabulary (or --prompt-ids without --tokenizer)",
                         o.tokenizer, attn_tokenizer_vocab_size(tok),
                         attn_lm_get_config(m).vocab_size);
    if (rc == CLI_OK) rc = prompt_ids(ctx, &o, tok, &prompt);
    if (rc == CLI_OK && o.stop_ids) rc = parse_ids("--stop-ids", o.stop_ids, &stops);
    for (size_t i = 0; rc == CLI_OK && i < stops.n; i++)
        if ((size_t)stops.ids[i] >= attn_lm_get_config(m).vocab_size)
            rc = cli_failure("--stop-ids: %d is not a token id of the model's vocabulary (0 .. "
                             "%zu), so it could never stop the run",
                             (int)stops.ids[i], attn_lm_get_config(m).vocab_size - 1);
    if (rc == CLI_OK) rc = generate(ctx, m, &o, tok, &prompt, &stops, &ms);
    free(prompt.ids);
    free(stops.ids);
    attn_tokenizer_free(tok);
    attn_lm_free(m);
    attn_ctx_free(ctx);
    return rc;
}

const cli_command cli_generate_command = {
    .name = "generate",
    .summary = "writes tokens with the book's GPT-2 or Llama 3 and a KV cache",
    .help = generate_help,
    .value_options = generate_value_options,
    .parse = parse_generate,
    .run = run_generate,
};
