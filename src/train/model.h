/* model.h — what the small model's files share beyond attn.h. */
#ifndef ATTN_TRAIN_MODEL_H
#define ATTN_TRAIN_MODEL_H

#include "attn.h"

/* The ctx the model was made with (its errors go there). */
attn_ctx *attn_model_ctx(const attn_model *m);

#endif /* ATTN_TRAIN_MODEL_H */
