/* kv_cache.h — what the layers above the KV cache see of it beyond attn.h. */
#ifndef ATTN_GENERATE_KV_CACHE_H
#define ATTN_GENERATE_KV_CACHE_H

#include "attn.h"

/* The ctx the cache was made on: its attention runs on that ctx's threads
 * and workspace, and its failures are written there. */
attn_ctx *attn_kv_cache_ctx(const attn_kv_cache *cache);

/* The limits attn_kv_cache_append checks before layer takes new_lens (or
 * new_tokens each): the layer, max_len and the pool's free pages, each
 * refusal named for who; nothing is written. For a caller that appends to
 * several layers in one call and must refuse it before the first append. */
attn_status attn_kv_cache_check_append(attn_kv_cache *cache, const char *who, size_t layer,
                                       const size_t *new_lens, size_t new_tokens);

/* For a paged cache, the pages layer takes for sequence seq, emptied, to
 * hold a prompt of `prompt` tokens and then tokens one at a time up to
 * `total` positions (*need: a window layer's ring reuses its pages), and
 * the pages it then has (*have: the free ones and seq's own, which the
 * emptying gives back); 0 and 0 for a contiguous cache. For a caller that
 * runs such steps and must refuse the run before the first of them. */
void attn_kv_cache_run_pages(const attn_kv_cache *cache, size_t layer, size_t seq, size_t prompt,
                             size_t total, size_t *need, size_t *have);

#endif
