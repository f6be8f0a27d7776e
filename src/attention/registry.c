/* registry.c — the attention backends in the order the runner asks them,
 * and the record of how a call chose (attn_ctx_last_explain).
 *
 * The order is fastest first, each backend declining what it cannot run:
 * the fused float32 kernels, the fused bf16 kernels, split-KV decoding
 * over a KV cache, the flex kernels (block maps and score modifiers), then
 * the reference,
 * which runs every float32 and float64 problem and so ends every search
 * (a 16-bit problem it declines is widened by the runner and asked
 * again). A new backend is one file of its own and one line here. */
#include "attention/attention.h"

#include <stdio.h>
#include <string.h>

static const attn_attention_backend *const registry[] = {
    &attn_attention_fused,
    &attn_attention_fused16,
    &attn_attention_decode,
    &attn_attention_flex,
    &attn_attention_reference,
};

_Static_assert(sizeof registry / sizeof registry[0] <= ATTN_MAX_BACKENDS,
               "the runner keeps the candidates in ATTN_MAX_BACKENDS slots");

const attn_attention_backend *const *attn_attention_registry(size_t *count) {
    *count = sizeof registry / sizeof registry[0];
    return registry;
}

const char attn_pass_failed[] = "failed";

void attn_explain_begin(attn_ctx *ctx) { ctx->explain[0] = '\0'; }

void attn_explain_note(attn_ctx *ctx, const char *name, const char *reason) {
    size_t used = strlen(ctx->explain), cap = sizeof ctx->explain;
    if (used + 1 >= cap) return;
    if (reason == attn_pass_failed) {
        snprintf(ctx->explain + used, cap - used, "%s%s: failed", used ? "; " : "", name);
        return;
    }
    snprintf(ctx->explain + used, cap - used, "%s%s: %s%s%s", used ? "; " : "", name,
             reason ? "declined (" : "ran", reason ? reason : "", reason ? ")" : "");
}
