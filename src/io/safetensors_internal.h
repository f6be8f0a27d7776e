/* safetensors_internal.h — what the readers beside io (the modules' state_dict
 * and the GPT-2 checkpoint loader, in src/modules/; the language models'
 * loader, in src/lm/) need from safetensors.c beyond the public API. */
#ifndef ATTN_SAFETENSORS_INTERNAL_H
#define ATTN_SAFETENSORS_INTERNAL_H

#include "internal.h"

/* The ctx the file was opened with: its messages go there. */
attn_ctx *attn_safetensors_ctx(const attn_safetensors *st);
/* The file's name in messages: its path, or "<memory>". */
const char *attn_safetensors_label(const attn_safetensors *st);
/* The file holding tensor index: a sharded checkpoint's shard (its path),
 * else attn_safetensors_label's. */
const char *attn_safetensors_file_of(const attn_safetensors *st, size_t index);
/* The index of the tensor of that name, or attn_safetensors_count(st) when
 * there is none; unlike attn_safetensors_find it leaves the ctx's message. */
size_t attn_safetensors_index(const attn_safetensors *st, const char *name);
/* Whether attn_safetensors_load converts dtype to float32. */
bool attn_safetensors_dtype_loadable(attn_dtype dtype);
/* Untrusted text (a tensor's name) for a message: control characters and
 * bytes that are not UTF-8 escaped as attn_fail does (\t, \xNN), and text
 * that does not fit in cap bytes cut with "...". */
void attn_safetensors_printable(char *dst, size_t cap, const char *src);
/* attn_safetensors_write's file appended to f, an attn_file the caller
 * opened (path: its name in messages) and closes or commits, so that a
 * caller writing several files commits them together. */
attn_status attn_safetensors_write_to(attn_ctx *ctx, attn_file *f, const char *path,
                                      const attn_named_tensor *tensors, size_t count,
                                      const attn_metadata_entry *metadata,
                                      size_t metadata_count);
/* A sharded checkpoint as one file: the index at index_path
 * (model.safetensors.index.json, Hugging Face's save_pretrained of a large
 * model) names each tensor's shard, a file beside it; every shard is
 * opened and checked, and the handle holds all their tensors, each read
 * from its own shard (data_begin/data_end are offsets there). A shard name
 * that is not a plain file name, a tensor the map puts in a shard that
 * lacks it, and a tensor in two shards are ATTN_ERR_FORMAT naming them. No
 * metadata. One shard file is open at a time, opened again when a tensor
 * of it is loaded (ATTN_ERR_IO where it changed meanwhile). Freed with
 * attn_safetensors_free. */
attn_status attn_safetensors_open_index(attn_ctx *ctx, const char *index_path,
                                        attn_safetensors **out);
/* Writes "[2, 3]" for a shape into buf. */
void attn_safetensors_format_shape(char *buf, size_t cap, size_t ndim, const size_t *shape);

#endif /* ATTN_SAFETENSORS_INTERNAL_H */
