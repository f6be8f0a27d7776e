/*
 * text_data.h — what pretrain.c (and attn generate's --prompt) shares with
 * text_data.c beyond attn.h: the book's encoding of text with <|endoftext|>
 * allowed.
 */
#ifndef ATTN_TRAIN_TEXT_DATA_H
#define ATTN_TRAIN_TEXT_DATA_H

#include "attn.h"

/* tokenizer.encode(text, allowed_special={"<|endoftext|>"}), as the book
 * encodes both its training text and a sample's start context: the name in
 * the text is the special token (the tokenizer's last id, which must be
 * it), the text between encoded plainly. Writes *n ids into ids
 * (capacity of them: a byte-level BPE token covers at least one byte, so
 * length ids always suffice); fn names the caller in messages. */
attn_status attn_encode_with_endoftext(attn_ctx *ctx, const char *fn, attn_tokenizer *tok,
                                       const char *text, size_t length, int32_t *ids,
                                       size_t capacity, size_t *n);

/* The id of <|endoftext|>: the tokenizer's last id when it decodes to that
 * name (GPT-2's 50256), else -1 (Llama 3's tokenizer has no such token). */
int32_t attn_endoftext_id(attn_tokenizer *tok);

#endif /* ATTN_TRAIN_TEXT_DATA_H */
