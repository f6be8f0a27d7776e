/*
 * factory.c — every module kind in one table: its name, its class (through
 * the variant's ops) and how attn_module_config becomes its constructor's
 * config. The CLI, the Python package and the trainer build modules by kind
 * through attn_module_new, and name kinds through this table, so a kind
 * added here is known to all of them.
 */
#include "modules/module.h"

#include <stdio.h>
#include <string.h>

/* Calls the kind's own constructor and gives its generic view. */
typedef attn_status (*build_fn)(attn_ctx *ctx, const attn_module_config *c, attn_rng *rng,
                                attn_module **out);

static attn_status build_simple(attn_ctx *ctx, const attn_module_config *c, attn_rng *rng,
                                attn_module **out) {
    (void)rng; /* no weights */
    attn_simple *m = NULL;
    attn_status st = attn_simple_new(ctx, &(attn_simple_config){.d_in = c->d_in}, &m);
    *out = attn_simple_module(m);
    return st;
}

static attn_status build_sa_v1(attn_ctx *ctx, const attn_module_config *c, attn_rng *rng,
                               attn_module **out) {
    attn_sa_v1 *m = NULL;
    attn_sa_v1_config cfg = {.d_in = c->d_in, .d_out = c->d_out, .scale = c->scale};
    attn_status st = attn_sa_v1_new(ctx, &cfg, rng, &m);
    *out = attn_sa_v1_module(m);
    return st;
}

static attn_status build_sa_v2(attn_ctx *ctx, const attn_module_config *c, attn_rng *rng,
                               attn_module **out) {
    attn_sa_v2 *m = NULL;
    attn_sa_v2_config cfg = {.d_in = c->d_in, .d_out = c->d_out, .qkv_bias = c->qkv_bias,
                             .scale = c->scale};
    attn_status st = attn_sa_v2_new(ctx, &cfg, rng, &m);
    *out = attn_sa_v2_module(m);
    return st;
}

static attn_status build_causal(attn_ctx *ctx, const attn_module_config *c, attn_rng *rng,
                                attn_module **out) {
    attn_causal *m = NULL;
    attn_causal_config cfg = {.d_in = c->d_in, .d_out = c->d_out,
                              .context_length = c->context_length, .dropout = c->dropout,
                              .qkv_bias = c->qkv_bias, .scale = c->scale, .mask = c->mask};
    attn_status st = attn_causal_new(ctx, &cfg, rng, &m);
    *out = attn_causal_module(m);
    return st;
}

static attn_status build_mha_wrapper(attn_ctx *ctx, const attn_module_config *c, attn_rng *rng,
                                     attn_module **out) {
    attn_mha_wrapper *m = NULL;
    attn_mha_wrapper_config cfg = {.d_in = c->d_in, .d_out = c->d_out,
                                   .context_length = c->context_length,
                                   .num_heads = c->num_heads, .dropout = c->dropout,
                                   .qkv_bias = c->qkv_bias, .scale = c->scale, .mask = c->mask};
    attn_status st = attn_mha_wrapper_new(ctx, &cfg, rng, &m);
    *out = attn_mha_wrapper_module(m);
    return st;
}

static attn_status build_mha(attn_ctx *ctx, const attn_module_config *c, attn_rng *rng,
                             attn_module **out) {
    attn_mha *m = NULL;
    attn_mha_config cfg = {.d_in = c->d_in, .d_out = c->d_out,
                           .context_length = c->context_length, .num_heads = c->num_heads,
                           .dropout = c->dropout, .qkv_bias = c->qkv_bias, .scale = c->scale,
                           .mask = c->mask};
    attn_status st = attn_mha_new(ctx, &cfg, rng, &m);
    *out = attn_mha_module(m);
    return st;
}

static attn_status build_gpt2(attn_ctx *ctx, const attn_module_config *c, attn_rng *rng,
                              attn_module **out) {
    attn_gpt2 *m = NULL;
    attn_gpt2_config cfg = {.n_embd = c->d_in, .n_head = c->num_heads,
                            .block_size = c->context_length, .dropout = c->dropout,
                            .scale = c->scale};
    attn_status st = attn_gpt2_new(ctx, &cfg, rng, &m);
    *out = attn_gpt2_module(m);
    return st;
}

static attn_status build_gqa(attn_ctx *ctx, const attn_module_config *c, attn_rng *rng,
                             attn_module **out) {
    attn_gqa *m = NULL;
    attn_gqa_config cfg = {.d_in = c->d_in, .d_out = c->d_out, .num_heads = c->num_heads,
                           .num_kv_groups = c->num_kv_groups,
                           .dropout = c->dropout, .qkv_bias = c->qkv_bias, .scale = c->scale};
    attn_status st = attn_gqa_new(ctx, &cfg, rng, &m);
    *out = attn_gqa_module(m);
    return st;
}

static attn_status build_mla(attn_ctx *ctx, const attn_module_config *c, attn_rng *rng,
                             attn_module **out) {
    attn_mla *m = NULL;
    attn_mla_config cfg = {.d_in = c->d_in, .d_out = c->d_out, .num_heads = c->num_heads,
                           .latent_dim = c->latent_dim, .dropout = c->dropout,
                           .qkv_bias = c->qkv_bias, .scale = c->scale};
    attn_status st = attn_mla_new(ctx, &cfg, rng, &m);
    *out = attn_mla_module(m);
    return st;
}

static attn_status build_swa(attn_ctx *ctx, const attn_module_config *c, attn_rng *rng,
                             attn_module **out) {
    attn_swa *m = NULL;
    attn_swa_config cfg = {.d_in = c->d_in, .d_out = c->d_out, .num_heads = c->num_heads,
                           .sliding_window_size = c->sliding_window_size,
                           .dropout = c->dropout, .qkv_bias = c->qkv_bias, .scale = c->scale};
    attn_status st = attn_swa_new(ctx, &cfg, rng, &m);
    *out = attn_swa_module(m);
    return st;
}

typedef struct kind_entry {
    const char *name;
    const attn_module_ops *ops;
    build_fn build;
    bool keeps_width; /* d_out is d_in: 0 or d_in is accepted */
    bool weighted;    /* draws weights from init_rng */
} kind_entry;

static const kind_entry kinds[ATTN_MODULE_KIND_COUNT] = {
    [ATTN_MODULE_SIMPLE] = {"simple", &attn_simple_ops, build_simple, true, false},
    [ATTN_MODULE_SA_V1] = {"sa1", &attn_sa_v1_ops, build_sa_v1, false, true},
    [ATTN_MODULE_SA_V2] = {"sa2", &attn_sa_v2_ops, build_sa_v2, false, true},
    [ATTN_MODULE_CAUSAL] = {"causal", &attn_causal_ops, build_causal, false, true},
    [ATTN_MODULE_MHA_WRAPPER] = {"mha-wrapper", &attn_mha_wrapper_ops, build_mha_wrapper, false,
                                 true},
    [ATTN_MODULE_MHA] = {"mha", &attn_mha_ops, build_mha, false, true},
    [ATTN_MODULE_GPT2] = {"gpt2", &attn_gpt2_ops, build_gpt2, true, true},
    [ATTN_MODULE_GQA] = {"gqa", &attn_gqa_ops, build_gqa, false, true},
    [ATTN_MODULE_MLA] = {"mla", &attn_mla_ops, build_mla, false, true},
    [ATTN_MODULE_SWA] = {"swa", &attn_swa_ops, build_swa, false, true},
};
_Static_assert(ATTN_MODULE_SWA + 1 == ATTN_MODULE_KIND_COUNT,
               "ATTN_MODULE_KIND_COUNT counts the kinds of attn_module_kind");

static const kind_entry *entry_of(attn_module_kind kind) {
    return (unsigned)kind < ATTN_MODULE_KIND_COUNT ? &kinds[kind] : NULL;
}

const char *attn_module_kind_name(attn_module_kind kind) {
    const kind_entry *e = entry_of(kind);
    return e ? e->name : "";
}

const char *attn_module_kind_class_name(attn_module_kind kind) {
    const kind_entry *e = entry_of(kind);
    return e ? e->ops->class_name : "";
}

attn_status attn_module_kind_from_name(attn_ctx *ctx, const char *name, attn_module_kind *out) {
    attn_clear_error(ctx);
    if (!name || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_module_kind_from_name: %s is NULL",
                         !name ? "name" : "out");
    for (size_t i = 0; i < ATTN_MODULE_KIND_COUNT; i++) {
        if (strcmp(name, kinds[i].name) == 0) {
            *out = (attn_module_kind)i;
            return ATTN_OK;
        }
    }
    char list[128] = "";
    for (size_t i = 0, len = 0; i < ATTN_MODULE_KIND_COUNT && len < sizeof list; i++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "",
                                kinds[i].name);
    return attn_fail(ctx, ATTN_ERR_NOT_FOUND, "no module kind named '%s' (%s)", name, list);
}

attn_status attn_module_new(attn_ctx *ctx, attn_module_kind kind, const attn_module_config *cfg,
                            attn_rng *init_rng, attn_module **out) {
    if (out) *out = NULL; /* on any failure */
    if (!ctx) return ATTN_ERR_NULL;
    attn_clear_error(ctx);
    if (!cfg || !out)
        return attn_fail(ctx, ATTN_ERR_NULL, "attn_module_new: %s is NULL", !cfg ? "cfg" : "out");
    const kind_entry *e = entry_of(kind);
    if (!e)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "attn_module_new: kind %d is no module kind (0 to %d)", (int)kind,
                         ATTN_MODULE_KIND_COUNT - 1);
    const char *cls = e->ops->class_name;
    if (!init_rng && e->weighted)
        return attn_fail(ctx, ATTN_ERR_NULL,
                         "attn_module_new: init_rng is NULL (%s draws its weights from it)", cls);
    if (e->keeps_width && cfg->d_out != 0 && cfg->d_out != cfg->d_in)
        return attn_fail(ctx, ATTN_ERR_INVALID,
                         "attn_module_new: %s's d_out (%zu) must be 0 or d_in (%zu)", cls,
                         cfg->d_out, cfg->d_in);
    return e->build(ctx, cfg, init_rng, out);
}
