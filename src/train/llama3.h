/*
 * llama3.h — the book's Llama3Model (attn.h, attn_llama3_config), the body
 * of an attn_model made by attn_model_new_llama3. model.c checks the
 * generic arguments (ids, shapes, modes) and hands the work here.
 */
#ifndef ATTN_TRAIN_LLAMA3_H
#define ATTN_TRAIN_LLAMA3_H

#include "attn.h"

typedef struct attn_llama3 attn_llama3;

/* ATTN_OK, or the first value of cfg at fault (who names the caller). */
attn_status attn_llama3_check_config(attn_ctx *ctx, const char *who,
                                     const attn_llama3_config *cfg);
/* A model of a checked cfg, its weights drawn from init_rng (left where it
 * was on failure). */
attn_status attn_llama3_new(attn_ctx *ctx, const attn_llama3_config *cfg, attn_rng *init_rng,
                            attn_llama3 **out);
void attn_llama3_free(attn_llama3 *m);
/* Its parameters in state_dict order (valid until it is freed), and their
 * scalars. */
attn_param *attn_llama3_params(attn_llama3 *m, size_t *count, size_t *scalars);
void attn_llama3_zero_grad(attn_llama3 *m);
/* attn_model_forward on checked arguments: tokens (and targets) are ids of
 * the vocabulary (targets may be ATTN_IGNORE_INDEX), 0 < seq <=
 * context_length. Everything the backward needs is kept. */
attn_status attn_llama3_forward(attn_llama3 *m, const int32_t *tokens, const int32_t *targets,
                                size_t batch, size_t seq, float *logits, float *loss);
/* The backward of the last forward (which had targets). */
attn_status attn_llama3_backward(attn_llama3 *m);

#endif /* ATTN_TRAIN_LLAMA3_H */
