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

#endif
