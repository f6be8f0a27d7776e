/* kv_cache.h — what the layers above the KV cache see of it beyond attn.h. */
#ifndef ATTN_GENERATE_KV_CACHE_H
#define ATTN_GENERATE_KV_CACHE_H

#include "attn.h"

/* The ctx the cache was made on: its attention runs on that ctx's threads
 * and workspace, and its failures are written there. */
attn_ctx *attn_kv_cache_ctx(const attn_kv_cache *cache);

#endif
