/*
 * test_hostile_lm.c — attn_lm's loader and constructors against inputs
 * that name more than they hold:
 *   - sizes: n_layers 2^40 and a model past this machine's memory are
 *     refused at once (no loop over the layers, no allocation), naming the
 *     bytes and the limit; a config or a tensor name giving 10^9 layers to
 *     a 1-layer file is refused naming the first tensor missing; a config
 *     of 10^8 tokens, positions or feed-forward units over a file without
 *     them, naming the tensor, before the model is allocated; a tied
 *     config over a file whose head is not its embedding;
 *   - strictness: a 2-layer file under a 1-layer config is refused naming
 *     the unused tensors and their count; ATTN_LM_LOAD_NON_STRICT loads it,
 *     its first layer the file's, bit for bit;
 *   - configs: a written norm eps of 0 is kept (exactly 0, -0.0), a zeroed
 *     one is 1e-5; a written rope_theta, rope_base or factor of 0 is
 *     refused naming it; Llama's attention_bias or mlp_bias true is
 *     refused whatever the other says; a value the model refuses (hidden_size
 *     0, heads that do not divide it, rope_theta past float32) is named by
 *     the file's key, with the file;
 *   - a sharded checkpoint's tensor of another shape, or past f16's range,
 *     is named with the shard holding it;
 *   - a file of attn train --save (attn_model_save's "attn-lm" metadata) is
 *     named as such;
 *   - attn_lm_generate's message gives the prompt's length as given;
 *   - a tied head's bytes are counted once;
 *   - caches refused before anything is written: a paged pool that a later
 *     layer lacks (every layer's length kept, the next call that fits
 *     right), another model's cache given to attn_lm_generate (its tokens
 *     kept), a paged pool too small for attn_lm_generate's run (its token
 *     kept, no id written; a window's ring of pages taken); a page_size of
 *     2^63 named;
 *   - NULLs and unknown flags.
 * Each refusal must come within a second: the old loader spent minutes.
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */

#include "attn.h"
#include "address_space.h"
#include "check.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__linux__)
#include <sys/resource.h>
#endif

static char dir[64];

static const char *path_in(char *buf, size_t size, const char *name) {
    snprintf(buf, size, "%s/%s", dir, name);
    return buf;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static bool write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return false;
    fputs(text, f);
    return fclose(f) == 0;
}

static attn_lm_config tiny_gpt2(size_t layers) {
    return (attn_lm_config){.arch = ATTN_LM_GPT2, .vocab_size = 11, .context_length = 8,
                            .emb_dim = 8, .n_heads = 2, .n_layers = layers, .qkv_bias = true};
}

/* A model of cfg, drawn from seed, saved to path. */
static attn_lm *saved_model(attn_ctx *ctx, attn_lm_config cfg, uint64_t seed, const char *path) {
    attn_rng *rng = NULL;
    attn_lm *m = NULL;
    if (attn_rng_new(ctx, seed, &rng) != ATTN_OK) return NULL;
    attn_status st = attn_lm_new(ctx, &cfg, rng, &m);
    attn_rng_free(rng);
    if (st != ATTN_OK || attn_lm_save(m, path) != ATTN_OK) {
        attn_lm_free(m);
        return NULL;
    }
    return m;
}

/* The model's parameters as named tensors (rename: one name replaced),
 * with n_meta entries of metadata. */
static attn_status write_renamed_meta(attn_ctx *ctx, attn_lm *m, const char *path,
                                      const char *from, const char *to,
                                      const attn_metadata_entry *meta, size_t n_meta) {
    size_t n = attn_lm_param_count(m);
    attn_named_tensor *t = calloc(n, sizeof *t);
    if (!t) return ATTN_ERR_NO_MEMORY;
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        attn_param p;
        attn_lm_param_at(m, i, &p);
        if (strcmp(p.name, "out_head.weight") == 0 && attn_lm_get_config(m).tie_embeddings)
            continue;
        t[kept] = (attn_named_tensor){.name = strcmp(p.name, from) == 0 ? to : p.name,
                                      .data = p.data, .ndim = p.ndim};
        memcpy(t[kept].shape, p.shape, p.ndim * sizeof(size_t));
        kept++;
    }
    attn_status st = attn_safetensors_write(ctx, path, t, kept, meta, n_meta);
    free(t);
    return st;
}

static attn_status write_renamed(attn_ctx *ctx, attn_lm *m, const char *path, const char *from,
                                 const char *to) {
    return write_renamed_meta(ctx, m, path, from, to, NULL, 0);
}

static void test_sizes(attn_ctx *ctx) {
    attn_lm *m = (attn_lm *)&m; /* must come back NULL */
    /* n_layers 2^40 of tiny blocks: the old constructor listed them one by one */
    attn_lm_config c = tiny_gpt2((size_t)1 << 40);
    double t0 = now();
    attn_status st = attn_lm_new(ctx, &c, NULL, &m);
    CHECK(st == ATTN_ERR_NO_MEMORY || st == ATTN_ERR_OVERFLOW);
    CHECK(m == NULL);
    CHECK_MESSAGE(ctx, "n_layers (1099511627776)");
    CHECK(now() - t0 < 1.0);
    /* 2^62 layers: the bytes overflow size_t */
    c.n_layers = (size_t)1 << 62;
    CHECK_STATUS(attn_lm_new(ctx, &c, NULL, &m), ATTN_ERR_OVERFLOW);
    CHECK_MESSAGE(ctx, "overflow size_t");
    /* 100000 layers of emb_dim 1024: 5 TB, past any machine this runs on */
    c = (attn_lm_config){.arch = ATTN_LM_GPT2, .vocab_size = 50257, .context_length = 1024,
                         .emb_dim = 1024, .n_heads = 16, .n_layers = 100000};
    t0 = now();
    CHECK_STATUS(attn_lm_new(ctx, &c, NULL, &m), ATTN_ERR_NO_MEMORY);
    CHECK_MESSAGE(ctx, "past this machine's memory (");
    CHECK_MESSAGE(ctx, "n_layers (100000)");
    CHECK(now() - t0 < 1.0);
    /* Llama 3 too, with 16-bit weights */
    c = (attn_lm_config){.arch = ATTN_LM_LLAMA3, .vocab_size = 128256, .context_length = 8192,
                         .emb_dim = 4096, .n_heads = 32, .n_kv_groups = 8, .n_layers = 32000,
                         .hidden_dim = 14336, .weights_dtype = ATTN_DTYPE_BF16};
    CHECK_STATUS(attn_lm_new(ctx, &c, NULL, &m), ATTN_ERR_NO_MEMORY);
    CHECK_MESSAGE(ctx, "bytes, past this machine's memory");
    /* a model that fits still builds */
    c = tiny_gpt2(3);
    CHECK_STATUS(attn_lm_new(ctx, &c, NULL, &m), ATTN_OK);
    attn_lm_free(m);
}

static void test_layers_the_file_lacks(attn_ctx *ctx) {
    char weights[128], cfg_path[128], renamed[128];
    attn_lm *one = saved_model(ctx, tiny_gpt2(1), 7, path_in(weights, sizeof weights, "one.st"));
    CHECK(one != NULL);
    if (!one) return;
    attn_lm *m = (attn_lm *)&m;
    /* a config of 10^9 layers over a 1-layer file */
    write_text(path_in(cfg_path, sizeof cfg_path, "huge.json"),
               "{\"vocab_size\": 11, \"context_length\": 8, \"emb_dim\": 8, \"n_heads\": 2, "
               "\"n_layers\": 1000000000, \"qkv_bias\": true}");
    double t0 = now();
    CHECK_STATUS(attn_lm_load(ctx, weights, cfg_path, NULL, &m), ATTN_ERR_NOT_FOUND);
    CHECK(m == NULL);
    CHECK_MESSAGE(ctx, "'trf_blocks.1.att.W_query.weight'");
    CHECK_MESSAGE(ctx, "n_layers 1000000000");
    CHECK(now() - t0 < 1.0);
    /* the same through the config struct */
    attn_lm_config c = tiny_gpt2(1000000000);
    CHECK_STATUS(attn_lm_load(ctx, weights, NULL, &c, &m), ATTN_ERR_NOT_FOUND);
    CHECK_MESSAGE(ctx, "'trf_blocks.1.att.W_query.weight'");
    /* no config (GPT-2's heads of 64 then): one block tensor renamed to
     * layer 999999999, so that the names give 10^9 layers */
    attn_lm_config wide = {.arch = ATTN_LM_GPT2, .vocab_size = 11, .context_length = 8,
                           .emb_dim = 64, .n_heads = 1, .n_layers = 1, .qkv_bias = true};
    char wide_path[128];
    attn_lm_free(one);
    one = saved_model(ctx, wide, 3, path_in(wide_path, sizeof wide_path, "wide.st"));
    CHECK(one != NULL);
    if (!one) return;
    CHECK_STATUS(attn_lm_load(ctx, wide_path, NULL, NULL, &m), ATTN_OK); /* as saved: loads */
    attn_lm_free(m);
    m = (attn_lm *)&m;
    CHECK_STATUS(write_renamed(ctx, one, path_in(renamed, sizeof renamed, "renamed.st"),
                               "trf_blocks.0.att.W_query.weight",
                               "trf_blocks.999999999.att.W_query.weight"),
                 ATTN_OK);
    t0 = now();
    CHECK_STATUS(attn_lm_load(ctx, renamed, NULL, NULL, &m), ATTN_ERR_NOT_FOUND);
    CHECK(m == NULL);
    CHECK_MESSAGE(ctx, "'trf_blocks.0.att.W_query.weight'");
    CHECK_MESSAGE(ctx, "n_layers 1000000000");
    CHECK(now() - t0 < 1.0);
    attn_lm_free(one);
}

static void test_strict(attn_ctx *ctx) {
    char weights[128], cfg_path[128];
    attn_lm *two = saved_model(ctx, tiny_gpt2(2), 11, path_in(weights, sizeof weights, "two.st"));
    CHECK(two != NULL);
    if (!two) return;
    write_text(path_in(cfg_path, sizeof cfg_path, "one.json"),
               "{\"vocab_size\": 11, \"context_length\": 8, \"emb_dim\": 8, \"n_heads\": 2, "
               "\"n_layers\": 1, \"qkv_bias\": true}");
    attn_lm *m = (attn_lm *)&m;
    CHECK_STATUS(attn_lm_load(ctx, weights, cfg_path, NULL, &m), ATTN_ERR_FORMAT);
    CHECK(m == NULL);
    /* block 1's 16 tensors: the first three named (file order), the rest counted */
    CHECK_MESSAGE(ctx, "holds 16 tensors the GPT-2 model of n_layers 1 does not use");
    CHECK_MESSAGE(ctx, "'trf_blocks.1.");
    CHECK_MESSAGE(ctx, "and 13 more");
    CHECK_MESSAGE(ctx, "non-strict");
    CHECK_STATUS(attn_lm_load_as(ctx, weights, cfg_path, NULL, ATTN_DTYPE_F32, &m),
                 ATTN_ERR_FORMAT);
    /* non-strict: loads, block 0 the file's block 0 */
    CHECK_STATUS(attn_lm_load_ex(ctx, weights, cfg_path, NULL, ATTN_DTYPE_F32,
                                 ATTN_LM_LOAD_FILE_DTYPE | ATTN_LM_LOAD_NON_STRICT, &m),
                 ATTN_OK);
    if (m) {
        attn_param got, want;
        CHECK(attn_lm_get_config(m).n_layers == 1);
        CHECK_STATUS(attn_lm_param(m, "trf_blocks.0.ff.layers.0.weight", &got), ATTN_OK);
        CHECK_STATUS(attn_lm_param(two, "trf_blocks.0.ff.layers.0.weight", &want), ATTN_OK);
        CHECK(got.numel == want.numel &&
              memcmp(got.data, want.data, got.numel * sizeof(float)) == 0);
        attn_lm_free(m);
    }
    /* a missing tensor is refused non-strict too */
    attn_lm_config three = tiny_gpt2(3);
    m = (attn_lm *)&m;
    CHECK_STATUS(attn_lm_load_ex(ctx, weights, NULL, &three, ATTN_DTYPE_F32,
                                 ATTN_LM_LOAD_NON_STRICT, &m),
                 ATTN_ERR_NOT_FOUND);
    CHECK(m == NULL);
    CHECK_MESSAGE(ctx, "'trf_blocks.2.att.W_query.weight'");
    /* unknown flags */
    CHECK_STATUS(attn_lm_load_ex(ctx, weights, NULL, NULL, ATTN_DTYPE_F32, 4u, &m),
                 ATTN_ERR_INVALID);
    CHECK(m == NULL);
    CHECK_MESSAGE(ctx, "flags 0x4");
    /* a tied model saved with its out_head (the book's state_dict) loads strictly */
    attn_lm_config tied = tiny_gpt2(1);
    tied.tie_embeddings = true;
    char tied_path[128];
    attn_lm *t = saved_model(ctx, tied, 5, path_in(tied_path, sizeof tied_path, "tied.st"));
    CHECK(t != NULL);
    CHECK_STATUS(attn_lm_load(ctx, tied_path, NULL, &tied, &m), ATTN_OK);
    attn_lm_free(m);
    /* the tied head is tok_emb's storage, neither held nor counted twice */
    if (t) {
        size_t floats = 0;
        for (size_t i = 0; i < attn_lm_param_count(t); i++) {
            attn_param p;
            attn_lm_param_at(t, i, &p);
            if (strcmp(p.name, "out_head.weight") != 0) floats += p.numel;
        }
        CHECK(attn_lm_weight_bytes(t) == floats * sizeof(float));
    }
    attn_lm_free(t);
    attn_lm_free(two);
}

static void test_config_zeros(attn_ctx *ctx) {
    char p[128];
    attn_lm_config c;
    /* a written eps of 0 is kept: negative zero, an epsilon of exactly 0 */
    write_text(path_in(p, sizeof p, "eps0.json"),
               "{\"hidden_size\": 16, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
               "\"vocab_size\": 11, \"intermediate_size\": 24, \"max_position_embeddings\": 8, "
               "\"rms_norm_eps\": 0}");
    CHECK_STATUS(attn_lm_config_read(ctx, p, &c), ATTN_OK);
    CHECK(c.norm_eps == 0.0 && signbit(c.norm_eps));
    attn_lm *m = NULL;
    CHECK_STATUS(attn_lm_new(ctx, &c, NULL, &m), ATTN_OK);
    if (m) {
        double eps = attn_lm_get_config(m).norm_eps;
        CHECK(eps == 0.0 && signbit(eps));
        attn_lm_free(m);
    }
    /* not written: LlamaConfig's 1e-6; a zeroed struct's eps: 1e-5 */
    write_text(p, "{\"hidden_size\": 16, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
                  "\"vocab_size\": 11, \"intermediate_size\": 24, \"max_position_embeddings\": 8}");
    CHECK_STATUS(attn_lm_config_read(ctx, p, &c), ATTN_OK);
    CHECK(c.norm_eps == 1e-6);
    attn_lm_config zeroed = tiny_gpt2(1);
    CHECK_STATUS(attn_lm_new(ctx, &zeroed, NULL, &m), ATTN_OK);
    if (m) CHECK(attn_lm_get_config(m).norm_eps == 1e-5);
    attn_lm_free(m);
    /* GPT-2's layer_norm_epsilon 0 and the book's norm_eps 0 likewise */
    write_text(p, "{\"n_embd\": 8, \"n_layer\": 1, \"n_head\": 2, \"vocab_size\": 11, "
                  "\"n_positions\": 8, \"layer_norm_epsilon\": 0}");
    CHECK_STATUS(attn_lm_config_read(ctx, p, &c), ATTN_OK);
    CHECK(c.norm_eps == 0.0 && signbit(c.norm_eps));
    write_text(p, "{\"vocab_size\": 11, \"context_length\": 8, \"emb_dim\": 8, \"n_heads\": 2, "
                  "\"n_layers\": 1, \"norm_eps\": 0.0}");
    CHECK_STATUS(attn_lm_config_read(ctx, p, &c), ATTN_OK);
    CHECK(c.norm_eps == 0.0 && signbit(c.norm_eps));
    write_text(p, "{\"vocab_size\": 11, \"context_length\": 8, \"emb_dim\": 8, \"n_heads\": 2, "
                  "\"n_layers\": 1, \"norm_eps\": -1e-5}");
    CHECK_STATUS(attn_lm_config_read(ctx, p, &c), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "\"norm_eps\" (-1e-05)");
    /* a count of 0 KV groups holds no head: refused by name, not read as
     * "one a head" (the book's GroupedQueryAttention divides by it) */
    write_text(p, "{\"vocab_size\": 11, \"context_length\": 8, \"emb_dim\": 8, \"n_heads\": 2, "
                  "\"n_layers\": 1, \"hidden_dim\": 24, \"n_kv_groups\": 0}");
    CHECK_STATUS(attn_lm_config_read(ctx, p, &c), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "\"n_kv_groups\" is 0");
    write_text(p, "{\"hidden_size\": 16, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
                  "\"vocab_size\": 11, \"intermediate_size\": 24, \"max_position_embeddings\": 8, "
                  "\"num_key_value_heads\": 0}");
    CHECK_STATUS(attn_lm_config_read(ctx, p, &c), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "\"num_key_value_heads\" is 0");
    /* GPT-2's n_inner 0 is a feed-forward of no units, which transformers
     * builds as given: refused, not read as the 4 * n_embd of no n_inner */
    write_text(p, "{\"n_embd\": 8, \"n_layer\": 1, \"n_head\": 2, \"vocab_size\": 11, "
                  "\"n_positions\": 8, \"n_inner\": 0}");
    CHECK_STATUS(attn_lm_config_read(ctx, p, &c), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "\"n_inner\" is 0, a feed-forward of no units");
    write_text(p, "{\"n_embd\": 8, \"n_layer\": 1, \"n_head\": 2, \"vocab_size\": 11, "
                  "\"n_positions\": 8, \"n_inner\": null}");
    CHECK_STATUS(attn_lm_config_read(ctx, p, &c), ATTN_OK);
    CHECK(c.hidden_dim == 0); /* 0: gpt2's 4 emb_dim */
    write_text(p, "{\"n_embd\": 8, \"n_layer\": 1, \"n_head\": 2, \"vocab_size\": 11, "
                  "\"n_positions\": 0}");
    CHECK_STATUS(attn_lm_config_read(ctx, p, &c), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "\"n_positions\" is 0, a context of no token");
    /* Llama's biases, each flag read alone: attention_bias true with
     * mlp_bias false is a model with q/k/v/o biases (Qwen2's), which a
     * non-strict load would run without them */
    static const char *const bias_flags[][2] = {{"true", "false"}, {"false", "true"},
                                                {"true", "true"}};
    for (size_t i = 0; i < 3; i++) {
        char text[400];
        snprintf(text, sizeof text,
                 "{\"hidden_size\": 16, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
                 "\"vocab_size\": 11, \"intermediate_size\": 24, "
                 "\"max_position_embeddings\": 8, \"attention_bias\": %s, \"mlp_bias\": %s}",
                 bias_flags[i][0], bias_flags[i][1]);
        write_text(p, text);
        CHECK_STATUS(attn_lm_config_read(ctx, p, &c), ATTN_ERR_INVALID);
        CHECK_MESSAGE(ctx, i == 1 ? "\"mlp_bias\": true" : "\"attention_bias\": true");
        CHECK_MESSAGE(ctx, p);
    }
    write_text(p, "{\"hidden_size\": 16, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
                  "\"vocab_size\": 11, \"intermediate_size\": 24, \"max_position_embeddings\": 8, "
                  "\"attention_bias\": false, \"mlp_bias\": false}");
    CHECK_STATUS(attn_lm_config_read(ctx, p, &c), ATTN_OK);
    /* rope_theta 0 makes 0^x frequencies: refused by name, not replaced */
    write_text(p, "{\"hidden_size\": 16, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
                  "\"vocab_size\": 11, \"intermediate_size\": 24, \"max_position_embeddings\": 8, "
                  "\"rope_theta\": 0}");
    CHECK_STATUS(attn_lm_config_read(ctx, p, &c), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "\"rope_theta\" (0)");
    write_text(p, "{\"vocab_size\": 11, \"context_length\": 8, \"emb_dim\": 8, \"n_heads\": 2, "
                  "\"n_layers\": 1, \"hidden_dim\": 24, \"rope_base\": 0}");
    CHECK_STATUS(attn_lm_config_read(ctx, p, &c), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "\"rope_base\" (0)");
    /* positive, but 0 in float32, where the frequencies are made: they
     * would be infinite, and every logit NaN */
    write_text(p, "{\"vocab_size\": 11, \"context_length\": 8, \"emb_dim\": 8, \"n_heads\": 2, "
                  "\"n_layers\": 1, \"hidden_dim\": 24, \"rope_base\": 1e-300}");
    CHECK_STATUS(attn_lm_config_read(ctx, p, &c), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "rope_base (1e-300) is outside float32's range");
    CHECK_MESSAGE(ctx, "(the config read from ");
    c.rope_base = 1e-300; /* and from the struct */
    attn_lm *tiny_base = NULL;
    CHECK_STATUS(attn_lm_new(ctx, &c, NULL, &tiny_base), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "rope_base (1e-300) is outside float32's range");
    CHECK(tiny_base == NULL);
    write_text(p, "{\"hidden_size\": 16, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
                  "\"vocab_size\": 11, \"intermediate_size\": 24, \"max_position_embeddings\": 8, "
                  "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 0, "
                  "\"low_freq_factor\": 1, \"high_freq_factor\": 4, "
                  "\"original_max_position_embeddings\": 8}}");
    CHECK_STATUS(attn_lm_config_read(ctx, p, &c), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "\"factor\" (0)");
    /* a llama3 rope without one of its four numbers (without the factor it
     * read as no scaling, silently), under either key */
    static const char *const rope_keys[] = {"factor", "low_freq_factor", "high_freq_factor",
                                            "original_max_position_embeddings"};
    static const char *const rope_values[] = {"8", "1", "4", "8"};
    for (int key = 0; key < 2; key++)
        for (size_t left_out = 0; left_out < 4; left_out++) {
            char text[640], fields[320] = "";
            size_t used = 0;
            for (size_t i = 0; i < 4; i++)
                if (i != left_out)
                    used += (size_t)snprintf(fields + used, sizeof fields - used, ", \"%s\": %s",
                                             rope_keys[i], rope_values[i]);
            snprintf(text, sizeof text,
                     "{\"hidden_size\": 16, \"num_hidden_layers\": 1, \"num_attention_heads\": "
                     "2, \"vocab_size\": 11, \"intermediate_size\": 24, "
                     "\"max_position_embeddings\": 8, \"%s\": {\"rope_type\": \"llama3\"%s}}",
                     key ? "rope_parameters" : "rope_scaling", fields);
            write_text(p, text);
            CHECK_STATUS(attn_lm_config_read(ctx, p, &c), ATTN_ERR_INVALID);
            char want[96];
            snprintf(want, sizeof want, "of type \"llama3\" has no \"%s\"", rope_keys[left_out]);
            CHECK_MESSAGE(ctx, want);
        }
    /* the book's rope_freq: None, or a dict of all four, as compute_rope_params reads it */
    static const char *const book_keys[] = {"factor", "low_freq_factor", "high_freq_factor",
                                            "original_context_length"};
    for (size_t left_out = 0; left_out < 5; left_out++) {
        char text[640], fields[320] = "";
        size_t used = 0;
        for (size_t i = 0; i < 4; i++)
            if (i != left_out)
                used += (size_t)snprintf(fields + used, sizeof fields - used, "%s\"%s\": %s",
                                         used ? ", " : "", book_keys[i], rope_values[i]);
        snprintf(text, sizeof text,
                 "{\"vocab_size\": 11, \"context_length\": 8, \"emb_dim\": 8, \"n_heads\": 2, "
                 "\"n_layers\": 1, \"hidden_dim\": 24, \"rope_base\": 500000, "
                 "\"rope_freq\": {%s}}", fields);
        write_text(p, text);
        if (left_out == 4) { /* all four */
            CHECK_STATUS(attn_lm_config_read(ctx, p, &c), ATTN_OK);
            CHECK(c.rope_factor == 8.0 && c.rope_original_context_length == 8);
            continue;
        }
        CHECK_STATUS(attn_lm_config_read(ctx, p, &c), ATTN_ERR_INVALID);
        char want[96];
        snprintf(want, sizeof want, "\"rope_freq\" has no \"%s\"", book_keys[left_out]);
        CHECK_MESSAGE(ctx, want);
    }
    write_text(p, "{\"vocab_size\": 11, \"context_length\": 8, \"emb_dim\": 8, \"n_heads\": 2, "
                  "\"n_layers\": 1, \"hidden_dim\": 24, \"rope_freq\": 8}");
    CHECK_STATUS(attn_lm_config_read(ctx, p, &c), ATTN_ERR_FORMAT);
    CHECK_MESSAGE(ctx, "\"rope_freq\" must be an object or null");
    write_text(p, "{\"vocab_size\": 11, \"context_length\": 8, \"emb_dim\": 8, \"n_heads\": 2, "
                  "\"n_layers\": 1, \"hidden_dim\": 24, \"rope_freq\": null}");
    CHECK_STATUS(attn_lm_config_read(ctx, p, &c), ATTN_OK);
    CHECK(c.rope_factor == 0.0);
}

/* ---- sizes the file's tensors do not have ----------------------------------- */

typedef struct zero_tensor {
    const char *name;
    size_t rows, cols; /* cols 0: a vector */
} zero_tensor;

/* A safetensors file of zero tensors of these names and shapes. */
static attn_status write_zeros(attn_ctx *ctx, const char *path, const zero_tensor *z, size_t n) {
    static const float zeros[1024];
    attn_named_tensor t[32];
    if (n > 32) return ATTN_ERR_INVALID;
    for (size_t i = 0; i < n; i++) {
        if (z[i].rows * (z[i].cols ? z[i].cols : 1) > 1024) return ATTN_ERR_INVALID;
        t[i] = (attn_named_tensor){.name = z[i].name, .data = zeros, .ndim = z[i].cols ? 2 : 1,
                                   .shape = {z[i].rows, z[i].cols}};
    }
    return attn_safetensors_write(ctx, path, t, n, NULL, 0);
}


/* attn_lm_load of weights under the config at cfg_path, with at most 256
 * MiB more address space than the process maps (where a limit can be set):
 * a loader that allocates the config's model before it reads the file's
 * shapes fails for memory, not for the shape. */
static attn_status load_limited(attn_ctx *ctx, const char *weights, const char *cfg_path,
                                attn_lm **m) {
#if defined(__linux__) && !defined(UNDER_ASAN)
    struct rlimit old, tight;
    size_t now = mapped_bytes();
    if (now && getrlimit(RLIMIT_AS, &old) == 0) {
        tight = old;
        tight.rlim_cur = (rlim_t)(now + ((size_t)256 << 20));
        if (old.rlim_cur == RLIM_INFINITY || tight.rlim_cur < old.rlim_cur) {
            if (setrlimit(RLIMIT_AS, &tight) == 0) {
                attn_status st = attn_lm_load(ctx, weights, cfg_path, NULL, m);
                setrlimit(RLIMIT_AS, &old);
                return st;
            }
        }
    }
#endif
    return attn_lm_load(ctx, weights, cfg_path, NULL, m);
}

/* A config whose vocab_size, context or feed-forward width the file's
 * tensors do not have is refused naming the tensor and both shapes before
 * the model is allocated (a model of 10^8 tokens is gigabytes written for
 * an embedding the file holds 11 rows of), in the book's names and
 * in Hugging Face's GPT-2 (Conv1D, stored (in, out)) and Llama; the same
 * files under their own configs load. */
static void test_sizes_the_file_lacks(attn_ctx *ctx) {
    char weights[128], cfg_path[128];
    attn_lm *book = saved_model(ctx, tiny_gpt2(1), 13,
                                path_in(weights, sizeof weights, "sized.st"));
    CHECK(book != NULL);
    attn_lm_free(book);
    attn_lm *m = (attn_lm *)&m;
    write_text(path_in(cfg_path, sizeof cfg_path, "sized.json"),
               "{\"vocab_size\": 100000000, \"context_length\": 8, \"emb_dim\": 8, "
               "\"n_heads\": 2, \"n_layers\": 1, \"qkv_bias\": true}");
    double t0 = now();
    CHECK_STATUS(load_limited(ctx, weights, cfg_path, &m), ATTN_ERR_SHAPE);
    CHECK(m == NULL);
    CHECK_MESSAGE(ctx, "tensor 'tok_emb.weight' is (11, 8), the config needs (100000000, 8)");
    CHECK(now() - t0 < 1.0);
    /* one file: named alone, as no shard of anything */
    char alone[200];
    snprintf(alone, sizeof alone, "attn_lm_load: %s: tensor 'tok_emb.weight'", weights);
    CHECK_MESSAGE(ctx, alone);
    /* a config that ties the head over a file whose out_head is another
     * tensor: refused naming the first element that differs, in float32
     * and in bf16 (transformers reads such a file with the head's values
     * in both places, the book's model with the embedding's) */
    write_text(cfg_path, "{\"vocab_size\": 11, \"context_length\": 8, \"emb_dim\": 8, "
                         "\"n_heads\": 2, \"n_layers\": 1, \"qkv_bias\": true, "
                         "\"tie_embeddings\": true}");
    CHECK_STATUS(attn_lm_load(ctx, weights, cfg_path, NULL, &m), ATTN_ERR_INVALID);
    CHECK(m == NULL);
    CHECK_MESSAGE(ctx, "ties the head to the embedding, but the file's 'out_head.weight' holds");
    CHECK_MESSAGE(ctx, "at element 0 where the embedding holds");
    CHECK_STATUS(attn_lm_load_as(ctx, weights, cfg_path, NULL, ATTN_DTYPE_BF16, &m),
                 ATTN_ERR_INVALID);
    CHECK(m == NULL);
    CHECK_MESSAGE(ctx, "'out_head.weight' holds");

    /* Hugging Face's GPT-2, one block */
    static const zero_tensor gpt2[] = {
        {"wte.weight", 11, 8},       {"wpe.weight", 8, 8},
        {"h.0.attn.c_attn.weight", 8, 24}, {"h.0.attn.c_attn.bias", 24, 0},
        {"h.0.attn.c_proj.weight", 8, 8},  {"h.0.attn.c_proj.bias", 8, 0},
        {"h.0.mlp.c_fc.weight", 8, 32},    {"h.0.mlp.c_fc.bias", 32, 0},
        {"h.0.mlp.c_proj.weight", 32, 8},  {"h.0.mlp.c_proj.bias", 8, 0},
        {"h.0.ln_1.weight", 8, 0},   {"h.0.ln_1.bias", 8, 0},
        {"h.0.ln_2.weight", 8, 0},   {"h.0.ln_2.bias", 8, 0},
        {"ln_f.weight", 8, 0},       {"ln_f.bias", 8, 0}};
    CHECK_STATUS(write_zeros(ctx, path_in(weights, sizeof weights, "hf_gpt2.st"), gpt2,
                             sizeof gpt2 / sizeof *gpt2),
                 ATTN_OK);
    write_text(cfg_path, "{\"n_embd\": 8, \"n_layer\": 1, \"n_head\": 2, \"vocab_size\": 11, "
                         "\"n_positions\": 8}");
    CHECK_STATUS(attn_lm_load(ctx, weights, cfg_path, NULL, &m), ATTN_OK);
    attn_lm_free(m);
    m = (attn_lm *)&m;
    write_text(cfg_path, "{\"n_embd\": 8, \"n_layer\": 1, \"n_head\": 2, \"vocab_size\": 11, "
                         "\"n_positions\": 100000000}");
    t0 = now();
    CHECK_STATUS(load_limited(ctx, weights, cfg_path, &m), ATTN_ERR_SHAPE);
    CHECK(m == NULL);
    CHECK_MESSAGE(ctx, "tensor 'wpe.weight' is (8, 8), the config needs (100000000, 8)");
    CHECK(now() - t0 < 1.0);
    /* values of the config that the model refuses: named with the file
     * they were read from; n_inner by its own key */
    write_text(cfg_path, "{\"n_embd\": 8, \"n_layer\": 1, \"n_head\": 2, \"vocab_size\": 11, "
                         "\"n_positions\": 8, \"n_inner\": 33}");
    CHECK_STATUS(attn_lm_load(ctx, weights, cfg_path, NULL, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "\"n_inner\" (33) is not 4 * n_embd (8)");
    CHECK_MESSAGE(ctx, cfg_path);
    write_text(cfg_path, "{\"n_embd\": 8, \"n_layer\": 1, \"n_head\": 2, \"vocab_size\": 11, "
                         "\"n_positions\": 8, \"n_inner\": 32}");
    CHECK_STATUS(attn_lm_load(ctx, weights, cfg_path, NULL, &m), ATTN_OK);
    attn_lm_free(m);
    m = (attn_lm *)&m;
    write_text(cfg_path, "{\"n_embd\": 8, \"n_layer\": 1, \"n_head\": 3, \"vocab_size\": 11, "
                         "\"n_positions\": 8}");
    CHECK_STATUS(attn_lm_load(ctx, weights, cfg_path, NULL, &m), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "n_head (3) must divide n_embd (8)");
    CHECK_MESSAGE(ctx, cfg_path);
    CHECK(m == NULL);
    write_text(cfg_path, "{\"n_embd\": 0, \"n_layer\": 1, \"n_head\": 2, \"vocab_size\": 11, "
                         "\"n_ctx\": 8}");
    CHECK_STATUS(attn_lm_load(ctx, weights, cfg_path, NULL, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "vocab_size (11), n_ctx (8), n_embd (0), n_head (2) and n_layer (1) must "
                       "be positive");
    CHECK_MESSAGE(ctx, cfg_path);

    /* Hugging Face's Llama, one block, one KV head of two */
    static const zero_tensor llama[] = {
        {"model.embed_tokens.weight", 11, 16},
        {"model.layers.0.self_attn.q_proj.weight", 16, 16},
        {"model.layers.0.self_attn.k_proj.weight", 8, 16},
        {"model.layers.0.self_attn.v_proj.weight", 8, 16},
        {"model.layers.0.self_attn.o_proj.weight", 16, 16},
        {"model.layers.0.mlp.gate_proj.weight", 24, 16},
        {"model.layers.0.mlp.up_proj.weight", 24, 16},
        {"model.layers.0.mlp.down_proj.weight", 16, 24},
        {"model.layers.0.input_layernorm.weight", 16, 0},
        {"model.layers.0.post_attention_layernorm.weight", 16, 0},
        {"model.norm.weight", 16, 0},
        {"lm_head.weight", 11, 16}};
    CHECK_STATUS(write_zeros(ctx, path_in(weights, sizeof weights, "hf_llama.st"), llama,
                             sizeof llama / sizeof *llama),
                 ATTN_OK);
    static const char *const llama_cfg =
        "{\"hidden_size\": 16, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
        "\"num_key_value_heads\": 1, \"vocab_size\": 11, \"intermediate_size\": %s, "
        "\"max_position_embeddings\": 8}";
    char text[400];
    snprintf(text, sizeof text, llama_cfg, "24");
    write_text(cfg_path, text);
    CHECK_STATUS(attn_lm_load(ctx, weights, cfg_path, NULL, &m), ATTN_OK);
    attn_lm_free(m);
    m = (attn_lm *)&m;
    snprintf(text, sizeof text, llama_cfg, "100000000");
    write_text(cfg_path, text);
    t0 = now();
    CHECK_STATUS(load_limited(ctx, weights, cfg_path, &m), ATTN_ERR_SHAPE);
    CHECK(m == NULL);
    CHECK_MESSAGE(ctx, "tensor 'model.layers.0.mlp.gate_proj.weight' is (24, 16), the config "
                       "needs (100000000, 16)");
    CHECK(now() - t0 < 1.0);
    snprintf(text, sizeof text,
             "{\"hidden_size\": 16, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
             "\"num_key_value_heads\": 1, \"vocab_size\": 11, \"intermediate_size\": 24, "
             "\"max_position_embeddings\": 8, \"rope_theta\": 1e300}");
    write_text(cfg_path, text);
    CHECK_STATUS(attn_lm_load(ctx, weights, cfg_path, NULL, &m), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "rope_theta (1e+300) is outside float32's range");
    CHECK_MESSAGE(ctx, cfg_path);
    /* each refused value by its key in the file (Hugging Face's), not by
     * attn_lm_config's field; the book's cfg keys are the fields' names */
    static const struct {
        const char *fields, *says;
    } refused[] = {
        {"\"hidden_size\": 0, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, "
         "\"intermediate_size\": 24",
         "hidden_size (0), num_attention_heads (2) and num_hidden_layers (1) must be positive"},
        {"\"hidden_size\": 16, \"num_attention_heads\": 3, \"num_key_value_heads\": 1, "
         "\"intermediate_size\": 24",
         "num_attention_heads (3) must divide hidden_size (16)"},
        {"\"hidden_size\": 16, \"num_attention_heads\": 2, \"num_key_value_heads\": 3, "
         "\"intermediate_size\": 24",
         "num_key_value_heads (3) must divide num_attention_heads (2)"},
        {"\"hidden_size\": 16, \"num_attention_heads\": 16, \"num_key_value_heads\": 1, "
         "\"intermediate_size\": 24",
         "hidden_size (16) / num_attention_heads (16) is 1"},
        {"\"hidden_size\": 16, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, "
         "\"intermediate_size\": 0",
         "llama3 needs intermediate_size (0 given)"},
        {"\"hidden_size\": 16, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, "
         "\"intermediate_size\": 24, \"rope_scaling\": {\"rope_type\": \"llama3\", "
         "\"factor\": 8, \"low_freq_factor\": 1, \"high_freq_factor\": 1, "
         "\"original_max_position_embeddings\": 8}",
         "RoPE scaling (rope_scaling) needs factor (8) > 0, positive low_freq_factor (1) and "
         "high_freq_factor (1) that differ, and original_max_position_embeddings (8) > 0"},
        {"\"hidden_size\": 16, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, "
         "\"intermediate_size\": 24, \"rope_parameters\": {\"rope_type\": \"llama3\", "
         "\"rope_theta\": 1e-300, \"factor\": 8, \"low_freq_factor\": 1, "
         "\"high_freq_factor\": 4, \"original_max_position_embeddings\": 8}",
         "rope_theta (1e-300) is outside float32's range"},
        {"\"hidden_size\": 16, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, "
         "\"intermediate_size\": 24, \"rope_theta\": -1",
         "\"rope_theta\" (-1) must be a finite number > 0"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        snprintf(text, sizeof text,
                 "{%s, \"num_hidden_layers\": 1, \"vocab_size\": 11, "
                 "\"max_position_embeddings\": 8}", refused[i].fields);
        write_text(cfg_path, text);
        m = (attn_lm *)&m;
        CHECK_STATUS(attn_lm_load(ctx, weights, cfg_path, NULL, &m),
                     i == 1 || i == 2 || i == 3 ? ATTN_ERR_SHAPE : ATTN_ERR_INVALID);
        CHECK(m == NULL);
        CHECK_MESSAGE(ctx, refused[i].says);
        CHECK_MESSAGE(ctx, cfg_path);
    }
    /* the book's keys: attn_lm_config's names */
    write_text(cfg_path, "{\"vocab_size\": 11, \"context_length\": 8, \"emb_dim\": 8, "
                         "\"n_heads\": 3, \"n_layers\": 1, \"qkv_bias\": true}");
    CHECK_STATUS(attn_lm_load(ctx, path_in(weights, sizeof weights, "sized.st"), cfg_path, NULL,
                              &m), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "n_heads (3) must divide emb_dim (8)");
    CHECK_MESSAGE(ctx, cfg_path);
}

/* A sharded checkpoint (model.safetensors.index.json and its shards): a
 * tensor of another shape, or one a 16-bit load cannot hold, is named
 * with the shard holding it, not only the index it was found through. */
static void test_sharded_names_the_shard(attn_ctx *ctx) {
    char shard1[128], shard2[128], index[128], cfg_path[128];
    static const zero_tensor first[] = {
        {"model.embed_tokens.weight", 11, 16},
        {"model.layers.0.self_attn.q_proj.weight", 16, 16},
        {"model.layers.0.self_attn.k_proj.weight", 8, 16},
        {"model.layers.0.self_attn.v_proj.weight", 8, 16},
        {"model.layers.0.self_attn.o_proj.weight", 16, 16},
        {"model.layers.0.mlp.gate_proj.weight", 24, 16}};
    zero_tensor second[] = {
        {"model.layers.0.mlp.up_proj.weight", 24, 16},
        {"model.layers.0.mlp.down_proj.weight", 16, 24},
        {"model.layers.0.input_layernorm.weight", 16, 0},
        {"model.layers.0.post_attention_layernorm.weight", 16, 0},
        {"model.norm.weight", 15, 0}, /* the config's hidden_size is 16 */
        {"lm_head.weight", 11, 16}};
    CHECK_STATUS(write_zeros(ctx, path_in(shard1, sizeof shard1, "shard-1.st"), first, 6),
                 ATTN_OK);
    CHECK_STATUS(write_zeros(ctx, path_in(shard2, sizeof shard2, "shard-2.st"), second, 6),
                 ATTN_OK);
    char map[2048] = "{\"weight_map\": {";
    for (size_t i = 0; i < 12; i++)
        snprintf(map + strlen(map), sizeof map - strlen(map), "%s\"%s\": \"%s\"",
                 i ? ", " : "", i < 6 ? first[i].name : second[i - 6].name,
                 i < 6 ? "shard-1.st" : "shard-2.st");
    snprintf(map + strlen(map), sizeof map - strlen(map), "}}");
    write_text(path_in(index, sizeof index, "sharded.safetensors.index.json"), map);
    write_text(path_in(cfg_path, sizeof cfg_path, "sharded.json"),
               "{\"hidden_size\": 16, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
               "\"num_key_value_heads\": 1, \"vocab_size\": 11, \"intermediate_size\": 24, "
               "\"max_position_embeddings\": 8}");
    attn_lm *m = (attn_lm *)&m;
    CHECK_STATUS(attn_lm_load(ctx, index, cfg_path, NULL, &m), ATTN_ERR_SHAPE);
    CHECK(m == NULL);
    char want[400];
    snprintf(want, sizeof want, "%s (a shard of %s): tensor 'model.norm.weight' is (15)",
             shard2, index);
    CHECK_MESSAGE(ctx, want);
    /* the right shape, but past f16's range in the second shard */
    second[4].rows = 16;
    static const float big[16 * 24] = {[5] = 1e5f};
    attn_named_tensor t[6];
    for (size_t i = 0; i < 6; i++)
        t[i] = (attn_named_tensor){.name = second[i].name, .data = big,
                                   .ndim = second[i].cols ? 2 : 1,
                                   .shape = {second[i].rows, second[i].cols}};
    CHECK_STATUS(attn_safetensors_write(ctx, shard2, t, 6, NULL, 0), ATTN_OK);
    CHECK_STATUS(attn_lm_load_as(ctx, index, cfg_path, NULL, ATTN_DTYPE_BF16, &m), ATTN_OK);
    attn_lm_free(m);
    m = (attn_lm *)&m;
    CHECK_STATUS(attn_lm_load_as(ctx, index, cfg_path, NULL, ATTN_DTYPE_F16, &m),
                 ATTN_ERR_INVALID);
    CHECK(m == NULL);
    snprintf(want, sizeof want,
             "%s (a shard of %s): tensor 'model.layers.0.mlp.up_proj.weight' (F32) holds 100000 "
             "at element 5", shard2, index);
    CHECK_MESSAGE(ctx, want);
    unlink(shard1);
    unlink(shard2);
    unlink(index);
    unlink(cfg_path);
}

static void test_train_file(attn_ctx *ctx) {
    char p[128];
    float w[4] = {0};
    attn_named_tensor t = {.name = "tok_emb.weight", .data = w, .ndim = 2, .shape = {2, 2}};
    attn_metadata_entry meta[] = {{"format", "attn-lm"}, {"attention", "mha"},
                                  {"d_model", "2"}, {"n_layers", "1"}};
    CHECK_STATUS(attn_safetensors_write(ctx, path_in(p, sizeof p, "trained.st"), &t, 1, meta, 4),
                 ATTN_OK);
    attn_lm *m = (attn_lm *)&m;
    CHECK_STATUS(attn_lm_load(ctx, p, NULL, NULL, &m), ATTN_ERR_FORMAT);
    CHECK(m == NULL);
    CHECK_MESSAGE(ctx, "saved by attn_model_save (attn train --save");
    CHECK_MESSAGE(ctx, "attn_model_load");
}

static void test_generate_message(attn_ctx *ctx) {
    attn_lm_config c = tiny_gpt2(1);
    attn_lm *m = NULL;
    CHECK_STATUS(attn_lm_new(ctx, &c, NULL, &m), ATTN_OK);
    if (!m) return;
    int32_t *prompt = calloc(30000, sizeof *prompt), out[8];
    size_t count = 0;
    attn_generate_args a = {.prompt = prompt, .prompt_len = 30000, .max_new_tokens = 4,
                            .out = out, .count = &count};
    CHECK_STATUS(attn_lm_generate(m, &a), ATTN_ERR_OVERFLOW);
    CHECK_MESSAGE(ctx, "the prompt (30000 tokens, cut to its last 8)");
    CHECK_MESSAGE(ctx, "at most 1 new tokens do");
    a.prompt_len = 3;
    a.max_new_tokens = (size_t)-1;
    CHECK_STATUS(attn_lm_generate(m, &a), ATTN_ERR_OVERFLOW);
    CHECK_MESSAGE(ctx, "the prompt (3 tokens) and max_new_tokens 18446744073709551615");
    CHECK_MESSAGE(ctx, "context_length 8: at most 6 new tokens do");
    free(prompt);

    /* a paged pool of 2 pages of 2 tokens, on another ctx, holding one
     * token: a run of 6 positions needs 3 pages, refused before the reset
     * (the cache keeps its token, nothing is written); the pool's own
     * failure (a forward past it) is written in the cache's ctx and copied
     * into the model's, which the caller reads */
    attn_ctx *other = NULL;
    CHECK_STATUS(attn_ctx_new(NULL, &other), ATTN_OK);
    attn_kv_cache_config kc;
    CHECK_STATUS(attn_lm_cache_config(m, 1, 8, &kc), ATTN_OK);
    kc.layout = ATTN_KV_PAGED;
    kc.page_size = 2;
    kc.num_pages = 2;
    attn_kv_cache *cache = NULL;
    CHECK_STATUS(attn_kv_cache_new(other, &kc, &cache), ATTN_OK);
    int32_t three[3] = {1, 2, 3};
    float logits[4 * 11];
    attn_lm_forward_args f = {.cache = cache, .tokens = three, .batch = 1, .tokens_per_seq = 1,
                              .last_only = true, .logits = logits};
    CHECK_STATUS(attn_lm_forward(m, &f), ATTN_OK);
    a = (attn_generate_args){.prompt = three, .prompt_len = 3, .max_new_tokens = 4,
                             .cache = cache, .out = out, .count = &count};
    out[0] = -5;
    count = 9;
    CHECK_STATUS(attn_lm_generate(m, &a), ATTN_ERR_OVERFLOW);
    CHECK_MESSAGE(ctx, "attn_lm_generate: the page pool of layer 0 is out of pages");
    CHECK_MESSAGE(ctx, "max_new_tokens 4 need 3 pages of 2 tokens, the pool holds 2");
    CHECK(count == 0 && out[0] == -5);
    size_t len = 0;
    CHECK_STATUS(attn_kv_cache_length(cache, 0, 0, &len), ATTN_OK);
    CHECK(len == 1);
    /* 3 positions fit the 2 pages: the run goes on to its end */
    a.max_new_tokens = 2;
    CHECK_STATUS(attn_lm_generate(m, &a), ATTN_OK);
    CHECK(count == 2);
    f.tokens_per_seq = 3;
    CHECK_STATUS(attn_lm_forward(m, &f), ATTN_ERR_OVERFLOW);
    CHECK_MESSAGE(ctx, "out of pages");
    attn_kv_cache_free(cache);
    /* a window layer's ring of pages (window 2, 2 pages of 2 tokens)
     * takes any run the context holds */
    const size_t window[1] = {2};
    kc.windows = window;
    CHECK_STATUS(attn_kv_cache_new(other, &kc, &cache), ATTN_OK);
    a.cache = cache;
    a.max_new_tokens = 6;
    CHECK_STATUS(attn_lm_generate(m, &a), ATTN_OK);
    CHECK(count == 6);
    attn_kv_cache_free(cache);
    attn_ctx_free(other);
    attn_lm_free(m);
}

/* A file without a config of its own takes the config.json beside it, as
 * a directory of the two does: its shapes give neither GPT-2's heads (of 4
 * here, not 64) nor Llama's config. A file with the metadata
 * attn_model_save writes keeps its own. */
static void test_config_beside(attn_ctx *ctx) {
    char own[128], plain[128], beside[128];
    attn_lm_config c = tiny_gpt2(1);
    attn_lm *m = saved_model(ctx, c, 5, path_in(plain, sizeof plain, "plain.st")), *back = NULL;
    CHECK(m != NULL);
    if (!m) return;
    const attn_metadata_entry meta[] = {{"format", "attn-gpt"}, {"n_heads", "2"}};
    CHECK_STATUS(write_renamed_meta(ctx, m, path_in(own, sizeof own, "own.st"), "", "", meta, 2),
                 ATTN_OK);
    CHECK_STATUS(attn_lm_load(ctx, plain, NULL, NULL, &back), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "pass a config");
    write_text(path_in(beside, sizeof beside, "config.json"),
               "{\"vocab_size\": 11, \"context_length\": 8, \"emb_dim\": 8, \"n_heads\": 2, "
               "\"n_layers\": 1, \"qkv_bias\": true}");
    CHECK_STATUS(attn_lm_load(ctx, plain, NULL, NULL, &back), ATTN_OK);
    CHECK(back && attn_lm_get_config(back).n_heads == 2);
    attn_lm_free(back);
    back = NULL;
    write_text(beside, "{\"vocab_size\": 11, \"context_length\": 8, \"emb_dim\": 8, "
                       "\"n_heads\": 4, \"n_layers\": 1, \"qkv_bias\": true}");
    CHECK_STATUS(attn_lm_load(ctx, own, NULL, NULL, &back), ATTN_OK);
    CHECK(back && attn_lm_get_config(back).n_heads == 2);
    attn_lm_free(back);
    unlink(beside);
    attn_lm_free(m);
}

static void test_nulls(attn_ctx *ctx) {
    attn_lm *m = (attn_lm *)&m;
    attn_lm_config c = tiny_gpt2(1);
    CHECK_STATUS(attn_lm_load_ex(NULL, "x", NULL, NULL, ATTN_DTYPE_F32, 0, &m), ATTN_ERR_NULL);
    CHECK_STATUS(attn_lm_load_ex(ctx, NULL, NULL, NULL, ATTN_DTYPE_F32, 0, &m), ATTN_ERR_NULL);
    CHECK_STATUS(attn_lm_load_ex(ctx, "x", NULL, NULL, ATTN_DTYPE_F32, 0, NULL), ATTN_ERR_NULL);
    CHECK_STATUS(attn_lm_new(ctx, NULL, NULL, &m), ATTN_ERR_NULL);
    CHECK_STATUS(attn_lm_new(ctx, &c, NULL, NULL), ATTN_ERR_NULL);
    CHECK_STATUS(attn_lm_config_read(ctx, NULL, &c), ATTN_ERR_NULL);
    CHECK_STATUS(attn_lm_generate(NULL, NULL), ATTN_ERR_NULL);
    CHECK_STATUS(attn_lm_save(NULL, "x"), ATTN_ERR_NULL);
    char missing[128];
    CHECK_STATUS(attn_lm_load(ctx, path_in(missing, sizeof missing, "none.st"), NULL, NULL, &m),
                 ATTN_ERR_IO);
    CHECK(m == NULL);
}

/* A cache whose layers hold different lengths (a prefix appended into one
 * layer by hand): attn_lm_forward refuses it before any layer's work,
 * every layer's length as it was; and attn_lm_cache_new without a model
 * still clears its out. */
static void test_uneven_cache(attn_ctx *ctx) {
    attn_lm_config c = tiny_gpt2(2);
    attn_lm *m = NULL;
    CHECK_STATUS(attn_lm_new(ctx, &c, NULL, &m), ATTN_OK);
    attn_kv_cache *cache = (attn_kv_cache *)&c;
    CHECK_STATUS(attn_lm_cache_new(NULL, 1, 8, ATTN_KV_CONTIGUOUS, 0, &cache), ATTN_ERR_NULL);
    CHECK(cache == NULL);
    if (!m) return;
    CHECK_STATUS(attn_lm_cache_new(m, 1, 8, ATTN_KV_CONTIGUOUS, 0, &cache), ATTN_OK);
    float kv[2 * 8] = {0};
    CHECK_STATUS(attn_kv_cache_append(cache, 1, NULL, 2, kv, kv), ATTN_OK);
    int32_t tokens[3] = {1, 2, 3};
    float logits[3 * 11];
    attn_lm_forward_args a = {.cache = cache, .tokens = tokens, .batch = 1, .tokens_per_seq = 3,
                              .logits = logits};
    CHECK_STATUS(attn_lm_forward(m, &a), ATTN_ERR_INVALID);
    CHECK_MESSAGE(ctx, "attn_lm_forward: sequence 0 of the cache holds 0 tokens in layer 0 but 2 "
                       "in layer 1");
    size_t len0 = 9, len1 = 9;
    CHECK_STATUS(attn_kv_cache_length(cache, 0, 0, &len0), ATTN_OK);
    CHECK_STATUS(attn_kv_cache_length(cache, 1, 0, &len1), ATTN_OK);
    CHECK(len0 == 0 && len1 == 2);
    attn_kv_cache_free(cache);
    attn_lm_free(m);
}

/* A 2-layer Llama 3 of 64 positions whose layer 0 keeps a window of 4 in a
 * paged cache of 3 pages of 4 tokens (its ring reuses one page), layer 1
 * every token. */
static attn_lm *windowed_llama(attn_ctx *ctx, attn_kv_cache **cache) {
    attn_lm_config c = {.arch = ATTN_LM_LLAMA3, .vocab_size = 11, .context_length = 64,
                        .emb_dim = 8, .n_heads = 2, .n_layers = 2, .n_kv_groups = 1,
                        .hidden_dim = 16, .rope_base = 10000.0};
    attn_lm *m = NULL;
    attn_rng *rng = NULL;
    *cache = NULL;
    CHECK_STATUS(attn_rng_new(ctx, 7, &rng), ATTN_OK);
    CHECK_STATUS(attn_lm_new(ctx, &c, rng, &m), ATTN_OK);
    attn_rng_free(rng);
    if (!m) return NULL;
    attn_kv_cache_config kc;
    size_t windows[2] = {4, 0};
    CHECK_STATUS(attn_lm_cache_config(m, 1, 64, &kc), ATTN_OK);
    kc.windows = windows;
    kc.layout = ATTN_KV_PAGED;
    kc.page_size = 4;
    kc.num_pages = 3;
    CHECK_STATUS(attn_kv_cache_new(ctx, &kc, cache), ATTN_OK);
    return m;
}

static attn_status forward_n(attn_lm *m, attn_kv_cache *cache, const int32_t *tokens, size_t n,
                             float *logits) {
    attn_lm_forward_args a = {.cache = cache, .tokens = tokens, .batch = 1, .tokens_per_seq = n,
                              .last_only = true, .logits = logits};
    return attn_lm_forward(m, &a);
}

/* attn_lm_forward with room in layer 0's pool but not in layer 1's: the
 * call is refused before any layer appends (both lengths as they were), so
 * a later call that fits runs, with the logits of a cache that never saw
 * the refusal. */
static void test_pages_of_a_later_layer(attn_ctx *ctx) {
    attn_kv_cache *cache = NULL, *clean = NULL;
    attn_lm *m = windowed_llama(ctx, &cache);
    attn_lm *twin = windowed_llama(ctx, &clean);
    if (!m || !cache || !twin || !clean) goto done;
    const int32_t tokens[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    float logits[11], want[11];
    CHECK_STATUS(forward_n(m, cache, tokens, 8, logits), ATTN_OK);
    CHECK_STATUS(forward_n(m, cache, tokens, 8, logits), ATTN_ERR_OVERFLOW);
    CHECK_MESSAGE(ctx, "attn_lm_forward: the page pool of layer 1 is out of pages");
    size_t len0 = 0, len1 = 0;
    CHECK_STATUS(attn_kv_cache_length(cache, 0, 0, &len0), ATTN_OK);
    CHECK_STATUS(attn_kv_cache_length(cache, 1, 0, &len1), ATTN_OK);
    CHECK(len0 == 8 && len1 == 8);
    /* 4 more take layer 1's last page */
    CHECK_STATUS(forward_n(m, cache, tokens, 4, logits), ATTN_OK);
    CHECK_STATUS(attn_kv_cache_length(cache, 0, 0, &len0), ATTN_OK);
    CHECK_STATUS(attn_kv_cache_length(cache, 1, 0, &len1), ATTN_OK);
    CHECK(len0 == 12 && len1 == 12);
    CHECK_STATUS(forward_n(twin, clean, tokens, 8, want), ATTN_OK);
    CHECK_STATUS(forward_n(twin, clean, tokens, 4, want), ATTN_OK);
    CHECK(memcmp(logits, want, sizeof want) == 0);
done:
    attn_kv_cache_free(cache);
    attn_kv_cache_free(clean);
    attn_lm_free(m);
    attn_lm_free(twin);
}

/* attn_lm_generate given the cache of another model (2 layers to its 1)
 * refuses it before resetting it: the cache keeps its 3 tokens. */
static void test_generate_foreign_cache(attn_ctx *ctx) {
    attn_lm_config one = tiny_gpt2(1), two = tiny_gpt2(2);
    attn_lm *m = NULL, *other = NULL;
    attn_kv_cache *cache = NULL;
    CHECK_STATUS(attn_lm_new(ctx, &one, NULL, &m), ATTN_OK);
    CHECK_STATUS(attn_lm_new(ctx, &two, NULL, &other), ATTN_OK);
    if (!m || !other) goto done;
    CHECK_STATUS(attn_lm_cache_new(other, 1, 8, ATTN_KV_CONTIGUOUS, 0, &cache), ATTN_OK);
    if (!cache) goto done;
    const int32_t three[3] = {1, 2, 3};
    float logits[11];
    CHECK_STATUS(forward_n(other, cache, three, 3, logits), ATTN_OK);
    int32_t out[2];
    size_t count = 9, len = 0;
    attn_generate_args a = {.prompt = three, .prompt_len = 3, .max_new_tokens = 2,
                            .cache = cache, .out = out, .count = &count};
    CHECK_STATUS(attn_lm_generate(m, &a), ATTN_ERR_SHAPE);
    CHECK_MESSAGE(ctx, "attn_lm_generate: the cache (layers 2, batch 1");
    CHECK(count == 0);
    for (size_t l = 0; l < 2; l++) {
        CHECK_STATUS(attn_kv_cache_length(cache, l, 0, &len), ATTN_OK);
        CHECK(len == 3);
    }
done:
    attn_kv_cache_free(cache);
    attn_lm_free(m);
    attn_lm_free(other);
}

/* A page_size of 2^63 is named as the value at fault, not only as the
 * tokens it makes. */
static void test_huge_page_size(attn_ctx *ctx) {
    attn_lm_config c = tiny_gpt2(1);
    attn_lm *m = NULL;
    CHECK_STATUS(attn_lm_new(ctx, &c, NULL, &m), ATTN_OK);
    if (!m) return;
    attn_kv_cache_config kc;
    CHECK_STATUS(attn_lm_cache_config(m, 1, 8, &kc), ATTN_OK);
    kc.layout = ATTN_KV_PAGED;
    kc.page_size = (size_t)1 << 63;
    attn_kv_cache *cache = (attn_kv_cache *)&kc; /* must come back NULL */
    CHECK_STATUS(attn_kv_cache_new(ctx, &kc, &cache), ATTN_ERR_OVERFLOW);
    CHECK_MESSAGE(ctx, "page_size (9223372036854775808)");
    CHECK(cache == NULL);
    attn_lm_free(m);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/test_hostile_lm_XXXXXX");
    if (!mkdtemp(dir)) return 1;
    attn_ctx *ctx = NULL;
    attn_ctx_config cc = {.num_threads = 1};
    if (attn_ctx_new(&cc, &ctx) != ATTN_OK) return 1;
    test_sizes(ctx);
    test_layers_the_file_lacks(ctx);
    test_sizes_the_file_lacks(ctx);
    test_strict(ctx);
    test_config_zeros(ctx);
    test_sharded_names_the_shard(ctx);
    test_train_file(ctx);
    test_generate_message(ctx);
    test_config_beside(ctx);
    test_nulls(ctx);
    test_uneven_cache(ctx);
    test_pages_of_a_later_layer(ctx);
    test_generate_foreign_cache(ctx);
    test_huge_page_size(ctx);
    attn_ctx_free(ctx);
    const char *names[] = {"one.st", "huge.json", "renamed.st", "wide.st", "two.st", "one.json", "tied.st",
                           "eps0.json", "trained.st", "own.st", "plain.st", "config.json",
                           "sized.st", "sized.json", "hf_gpt2.st", "hf_llama.st"};
    char p[128];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        unlink(path_in(p, sizeof p, names[i]));
    rmdir(dir);
    return check_summary();
}
