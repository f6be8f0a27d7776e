/* safetensors_internal.h — what the GPT-2 checkpoint loader needs from
 * safetensors.c beyond the public API. */
#ifndef ATTN_SAFETENSORS_INTERNAL_H
#define ATTN_SAFETENSORS_INTERNAL_H

#include "internal.h"

/* The ctx the file was opened with: its messages go there. */
attn_ctx *attn_safetensors_ctx(const attn_safetensors *st);

#endif /* ATTN_SAFETENSORS_INTERNAL_H */
