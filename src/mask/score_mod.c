/* score_mod.c — the checks of a chain of score modifiers (attn.h), made
 * once by every call that takes one, before anything runs. */
#include "mask/mask_internal.h"

#include <float.h>
#include <math.h>
#include <stdint.h>

attn_status attn_score_mods_check(attn_ctx *ctx, const char *who, const attn_score_mod *mods,
                                  size_t count, size_t heads) {
    if (count && !mods)
        return attn_fail(ctx, ATTN_ERR_NULL, "%s: score_mod_count is %zu but score_mods is NULL",
                         who, count);
    for (size_t i = 0; i < count; i++) {
        const attn_score_mod *m = &mods[i];
        switch (m->kind) {
        case ATTN_SCORE_SCALE:
            if (!isfinite(m->value) || fabs(m->value) >= 0x1.ffffffp127)
                return attn_fail(ctx, ATTN_ERR_INVALID,
                                 "%s: score_mods[%zu] (scale) value %g must be a finite float",
                                 who, i, m->value);
            break;
        case ATTN_SCORE_SOFTCAP:
            if (!(m->value > 0.0) || !isfinite(m->value) || m->value >= 0x1.ffffffp127)
                return attn_fail(ctx, ATTN_ERR_INVALID,
                                 "%s: score_mods[%zu] (softcap) value %g must be finite and > 0",
                                 who, i, m->value);
            /* the float kernels hold the cap in float32, where 0 turns it off */
            if ((float)m->value == 0.0f)
                return attn_fail(ctx, ATTN_ERR_INVALID,
                                 "%s: score_mods[%zu] (softcap) value %g rounds to 0 in float32, "
                                 "which turns it off (smallest %g)",
                                 who, i, m->value, (double)FLT_TRUE_MIN);
            break;
        case ATTN_SCORE_ALIBI:
        case ATTN_SCORE_BIAS:
            if (!m->tensor)
                return attn_fail(ctx, ATTN_ERR_NULL, "%s: score_mods[%zu] (%s) has no tensor", who,
                                 i, m->kind == ATTN_SCORE_ALIBI ? "alibi slopes" : "bias");
            if (m->kind == ATTN_SCORE_ALIBI &&
                (m->offset > ((int64_t)1 << 62) || m->offset < -((int64_t)1 << 62)))
                return attn_fail(ctx, ATTN_ERR_INVALID,
                                 "%s: score_mods[%zu] (alibi) offset %lld must be within +-2^62",
                                 who, i, (long long)m->offset);
            for (size_t h = 0; m->kind == ATTN_SCORE_ALIBI && h < heads; h++)
                if (!isfinite(m->tensor[h]))
                    return attn_fail(ctx, ATTN_ERR_INVALID,
                                     "%s: score_mods[%zu] (alibi) slope tensor[%zu] is %g: each "
                                     "query head's must be finite",
                                     who, i, h, (double)m->tensor[h]);
            break;
        case ATTN_SCORE_REL_BIAS:
            if (!m->tensor)
                return attn_fail(ctx, ATTN_ERR_NULL, "%s: score_mods[%zu] (relative bias) has no "
                                 "table", who, i);
            if (m->buckets < 2 || (m->bidirectional && m->buckets < 4) || m->buckets > INT32_MAX)
                return attn_fail(ctx, ATTN_ERR_INVALID,
                                 "%s: score_mods[%zu] (relative bias) buckets %zu: T5's buckets "
                                 "need 2 .. 2^31 - 1 (4 .. bidirectional)",
                                 who, i, m->buckets);
            /* T5's logarithmic buckets divide by log(max_distance / max_exact):
             * at or below the exact buckets that log is 0 or negative, and the
             * buckets it gives lie outside the table */
            size_t max_exact = (m->bidirectional ? m->buckets / 2 : m->buckets) / 2;
            if (m->max_distance <= max_exact)
                return attn_fail(ctx, ATTN_ERR_INVALID,
                                 "%s: score_mods[%zu] (relative bias) max_distance %zu must "
                                 "exceed the %zu exact buckets of buckets %zu%s",
                                 who, i, m->max_distance, max_exact, m->buckets,
                                 m->bidirectional ? " (bidirectional)" : "");
            break;
        case ATTN_SCORE_REL_TABLE:
            if (!m->tensor)
                return attn_fail(ctx, ATTN_ERR_NULL, "%s: score_mods[%zu] (relative table) has "
                                 "no table", who, i);
            if (m->buckets < 1 || m->buckets > INT32_MAX ||
                m->offset > ((int64_t)1 << 62) || m->offset < -((int64_t)1 << 62))
                return attn_fail(ctx, ATTN_ERR_INVALID,
                                 "%s: score_mods[%zu] (relative table) buckets %zu and offset "
                                 "%lld: buckets must be in 1 .. 2^31 - 1, offset within +-2^62",
                                 who, i, m->buckets, (long long)m->offset);
            break;
        case ATTN_SCORE_CALLBACK:
            if (!m->fn)
                return attn_fail(ctx, ATTN_ERR_NULL, "%s: score_mods[%zu] (callback) has no fn",
                                 who, i);
            break;
        default:
            return attn_fail(ctx, ATTN_ERR_INVALID,
                             "%s: score_mods[%zu] kind %d is not an attn_score_mod_kind", who, i,
                             (int)m->kind);
        }
    }
    return ATTN_OK;
}
