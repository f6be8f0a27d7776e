/* model.h — what the small model's files share beyond attn.h. */
#ifndef ATTN_TRAIN_MODEL_H
#define ATTN_TRAIN_MODEL_H

#include "attn.h"

/* The ctx the model was made with (its errors go there). */
attn_ctx *attn_model_ctx(const attn_model *m);

/* Whether m is the book's GPTModel (attn_model_new_gpt). */
bool attn_model_is_gpt(const attn_model *m);

/* Whether m is the book's Llama3Model (attn_model_new_llama3). */
bool attn_model_is_llama3(const attn_model *m);

/* attn_model_save into file, an attn_file the caller opened for path and
 * closes or commits (NULL: path is written and committed here), so that a
 * checkpoint's files are committed together. */
attn_status attn_model_save_to(attn_model *m, attn_file *file, const char *path);

/* attn_model_load, the file's dropout rate checked too: a run that goes on
 * (attn_pretrain_resume) draws the masks its saved part drew only with
 * the same rate. */
attn_status attn_model_load_run(attn_model *m, const char *path);

/* Drops the last forward's activations: the weights changed under them
 * (a load), and a backward would mix the two; the next backward needs a
 * new forward. */
void attn_model_forget_forward(attn_model *m);

/* The attn_model_config a book's config runs as. */
attn_model_config attn_model_config_of_gpt(const attn_gpt_config *g);
attn_model_config attn_model_config_of_llama3(const attn_llama3_config *l);

/* The attn_lm_config of the same model as a book's GPT config (chapter 4's
 * bonus GPTs as gpt-gqa, gpt-mla, or gpt2 with windows), float32: attn_lm
 * takes its weights under the same names. */
attn_lm_config attn_model_lm_config_of_gpt(const attn_gpt_config *g);

/* ATTN_ERR_NO_MEMORY (naming who, the parameters and the bytes) where
 * params' weights, gradients and AdamW's two moments alone, 16 bytes a
 * parameter, pass limit bytes (0: no limit); checked before AdamW's state
 * is allocated, as each allocation would succeed under overcommit and the
 * run be killed part-way. The batch's activations come on top. */
attn_status attn_training_fits_memory(attn_ctx *ctx, const char *who, const attn_param *params,
                                      size_t count, size_t limit);

/* The most steps an optimizer's state may count: the bias corrections
 * take steps + 1 as a double, exact up to here. attn_optimizer_set_state
 * refuses more, and a run's saved state is checked against it before
 * anything is restored. */
#define ATTN_OPTIMIZER_MAX_STEPS ((size_t)1 << 53)

#endif /* ATTN_TRAIN_MODEL_H */
