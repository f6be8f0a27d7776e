/*
 * sample.h — attn_sample with the caller's scratch, so that a generation
 * loop allocates its scratch once instead of once per token.
 */
#ifndef ATTN_SAMPLE_H
#define ATTN_SAMPLE_H

#include "internal.h"

/* Bytes of scratch attn_sample_into needs for vocab_size logits (0 when it
 * does not fit size_t). */
size_t attn_sample_scratch_bytes(size_t vocab_size);

/* The checks attn_sample makes of s, vocab_size and rng (not the logits):
 * for a caller that wants them before work that precedes the sampling.
 * Messages begin with who, the public function the caller called. */
attn_status attn_sampling_check(attn_ctx *ctx, const char *who, const attn_sampling *s,
                                size_t vocab_size, const attn_rng *rng);

/* attn_sample, with scratch holding attn_sample_scratch_bytes(vocab_size)
 * bytes (suitably aligned for double), or NULL to allocate it for the call. */
attn_status attn_sample_into(attn_ctx *ctx, const float *logits, size_t vocab_size,
                             const attn_sampling *s, attn_rng *rng, void *scratch, int32_t *out);

#endif /* ATTN_SAMPLE_H */
