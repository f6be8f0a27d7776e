/*
 * abi.c — the ABI version and the layout table of attn.h's structs, both
 * as this library was compiled. The table is built with offsetof and sizeof,
 * so it is the compiler's layout, not a copy of it; tests/unit/test_abi.c
 * parses attn.h and fails when a struct or a field is missing here, and the
 * Python tests check every ctypes mirror against the table.
 */
#include "attn.h"

#include <stddef.h>

int attn_abi_version(void) { return ATTN_ABI_VERSION; }

/* F(member) describes a member of the struct that T names where F is used. */
#define F(member) {#member, offsetof(T, member), sizeof(((T *)0)->member)}
#define S(type) {#type, sizeof(type), sizeof(type##_fields) / sizeof(type##_fields[0]), \
                 type##_fields}

#define T attn_abi_field
static const attn_abi_field attn_abi_field_fields[] = {
    F(name), F(offset), F(size)
};
#undef T

#define T attn_abi_struct
static const attn_abi_field attn_abi_struct_fields[] = {
    F(name), F(size), F(num_fields), F(fields)
};
#undef T

#define T attn_ctx_config
static const attn_abi_field attn_ctx_config_fields[] = {
    F(num_threads), F(trace), F(trace_user), F(kernels), F(trace_shapes_only)
};
#undef T

#define T attn_cpu_info
static const attn_abi_field attn_cpu_info_fields[] = {
    F(vendor), F(model_name), F(family), F(model), F(uarch), F(avx2_fma), F(avx512f),
    F(avx512_bf16), F(avx512_fp16), F(amx_bf16), F(fma_vector_bits), F(l1d_bytes), F(l2_bytes),
    F(l3_bytes)
};
#undef T

#define T attn_sdpa_config
static const attn_abi_field attn_sdpa_config_fields[] = {
    F(batch), F(heads), F(q_tokens), F(kv_tokens), F(head_dim), F(q_strides), F(kv_strides),
    F(out_strides), F(scale), F(causal), F(dropout), F(kv_heads), F(v_head_dim), F(v_strides),
    F(align), F(q_offset), F(window), F(window_left), F(window_right), F(softcap),
    F(alibi_slopes), F(sinks), F(sinks_grad), F(cu_seqlens_q), F(cu_seqlens_kv), F(block_mask),
    F(score_mods), F(score_mod_count)
};
#undef T

#define T attn_block_mask_config
static const attn_abi_field attn_block_mask_config_fields[] = {
    F(batch), F(heads), F(q_len), F(kv_len), F(block_q), F(block_kv)
};
#undef T

#define T attn_block_mask_info
static const attn_abi_field attn_block_mask_info_fields[] = {
    F(config), F(q_blocks), F(kv_blocks), F(full_blocks), F(partial_blocks), F(sparsity),
    F(row_intervals)
};
#undef T

#define T attn_score_tile
static const attn_abi_field attn_score_tile_fields[] = {
    F(b), F(h), F(q0), F(kv0), F(rows), F(cols), F(ld), F(scores)
};
#undef T

#define T attn_score_mod
static const attn_abi_field attn_score_mod_fields[] = {
    F(kind), F(value), F(tensor), F(tensor_grad), F(strides), F(offset), F(signed_distance),
    F(buckets), F(max_distance), F(bidirectional), F(fn), F(grad_fn), F(user)
};
#undef T

#define T attn_sdpa_dropout
static const attn_abi_field attn_sdpa_dropout_fields[] = {
    F(seed), F(offset)
};
#undef T

#define T attn_param
static const attn_abi_field attn_param_fields[] = {
    F(name), F(data), F(grad), F(ndim), F(shape), F(numel)
};
#undef T

#define T attn_simple_config
static const attn_abi_field attn_simple_config_fields[] = {
    F(d_in)
};
#undef T

#define T attn_sa_v1_config
static const attn_abi_field attn_sa_v1_config_fields[] = {
    F(d_in), F(d_out), F(scale)
};
#undef T

#define T attn_sa_v2_config
static const attn_abi_field attn_sa_v2_config_fields[] = {
    F(d_in), F(d_out), F(qkv_bias), F(scale)
};
#undef T

#define T attn_causal_config
static const attn_abi_field attn_causal_config_fields[] = {
    F(d_in), F(d_out), F(context_length), F(dropout), F(qkv_bias), F(scale), F(mask)
};
#undef T

#define T attn_mha_wrapper_config
static const attn_abi_field attn_mha_wrapper_config_fields[] = {
    F(d_in), F(d_out), F(context_length), F(num_heads), F(dropout), F(qkv_bias), F(scale),
    F(mask)
};
#undef T

#define T attn_mha_config
static const attn_abi_field attn_mha_config_fields[] = {
    F(d_in), F(d_out), F(context_length), F(num_heads), F(dropout), F(qkv_bias), F(scale),
    F(mask)
};
#undef T

#define T attn_gpt2_config
static const attn_abi_field attn_gpt2_config_fields[] = {
    F(n_embd), F(n_head), F(block_size), F(dropout), F(scale)
};
#undef T

#define T attn_gqa_config
static const attn_abi_field attn_gqa_config_fields[] = {
    F(d_in), F(d_out), F(num_heads), F(num_kv_groups), F(dropout), F(qkv_bias), F(scale)
};
#undef T

#define T attn_mla_config
static const attn_abi_field attn_mla_config_fields[] = {
    F(d_in), F(d_out), F(num_heads), F(latent_dim), F(dropout), F(qkv_bias), F(scale)
};
#undef T

#define T attn_swa_config
static const attn_abi_field attn_swa_config_fields[] = {
    F(d_in), F(d_out), F(num_heads), F(sliding_window_size), F(dropout), F(qkv_bias), F(scale)
};
#undef T

#define T attn_module_config
static const attn_abi_field attn_module_config_fields[] = {
    F(d_in), F(d_out), F(context_length), F(num_heads), F(num_kv_groups), F(latent_dim),
    F(sliding_window_size), F(dropout), F(qkv_bias), F(scale), F(mask)
};
#undef T

#define T attn_gpt2_preset
static const attn_abi_field attn_gpt2_preset_fields[] = {
    F(name), F(vocab_size), F(context_length), F(n_embd), F(n_head), F(n_layer), F(dropout),
    F(qkv_bias)
};
#undef T

#define T attn_npy
static const attn_abi_field attn_npy_fields[] = {
    F(ndim), F(shape), F(numel), F(data)
};
#undef T

#define T attn_npy_i32
static const attn_abi_field attn_npy_i32_fields[] = {
    F(ndim), F(shape), F(numel), F(data)
};
#undef T

#define T attn_named_tensor
static const attn_abi_field attn_named_tensor_fields[] = {
    F(name), F(data), F(ndim), F(shape)
};
#undef T

#define T attn_metadata_entry
static const attn_abi_field attn_metadata_entry_fields[] = {
    F(key), F(value)
};
#undef T

#define T attn_safetensors_info
static const attn_abi_field attn_safetensors_info_fields[] = {
    F(name), F(dtype), F(ndim), F(shape), F(numel), F(data_begin), F(data_end), F(index)
};
#undef T

#define T attn_optimizer_config
static const attn_abi_field attn_optimizer_config_fields[] = {
    F(kind), F(lr), F(weight_decay), F(momentum), F(dampening), F(nesterov), F(beta1), F(beta2),
    F(eps), F(amsgrad)
};
#undef T

#define T attn_model_config
static const attn_abi_field attn_model_config_fields[] = {
    F(vocab_size), F(context_length), F(d_model), F(n_layers), F(n_heads), F(attention), F(mlp),
    F(dropout), F(qkv_bias)
};
#undef T

#define T attn_gpt_config
static const attn_abi_field attn_gpt_config_fields[] = {
    F(vocab_size), F(context_length), F(emb_dim), F(n_heads), F(n_layers), F(drop_rate),
    F(qkv_bias), F(attention), F(n_kv_groups), F(latent_dim), F(sliding_window_size),
    F(sliding_window_stride)
};
#undef T

#define T attn_llama3_config
static const attn_abi_field attn_llama3_config_fields[] = {
    F(vocab_size), F(context_length), F(emb_dim), F(n_heads), F(n_layers), F(hidden_dim),
    F(n_kv_groups), F(rope_base), F(rope_factor), F(rope_low_freq_factor),
    F(rope_high_freq_factor), F(rope_original_context_length)
};
#undef T

#define T attn_pretrain_options
static const attn_abi_field attn_pretrain_options_fields[] = {
    F(epochs), F(batch_size), F(max_length), F(stride), F(train_ratio), F(lr), F(weight_decay),
    F(eval_freq), F(eval_iter), F(start_context), F(sample_tokens)
};
#undef T

#define T attn_pretrain_event
static const attn_abi_field attn_pretrain_event_fields[] = {
    F(kind), F(epoch), F(step), F(steps_per_epoch), F(total_steps), F(tokens_seen), F(step_loss),
    F(train_loss), F(val_loss), F(sample), F(sample_length)
};
#undef T

#define T attn_kv_cache_config
static const attn_abi_field attn_kv_cache_config_fields[] = {
    F(num_layers), F(batch), F(kv_heads), F(head_dim), F(max_len), F(layout), F(page_size),
    F(num_pages), F(windows), F(k_dtype), F(v_dtype), F(values_are_keys)
};
#undef T

#define T attn_kv_attend_args
static const attn_abi_field attn_kv_attend_args_fields[] = {
    F(layer), F(new_lens), F(new_tokens), F(q_heads), F(scale), F(q), F(k_new), F(v_new), F(out),
    F(softcap), F(alibi_slopes), F(sinks), F(block_mask)
};
#undef T

#define T attn_kv_tree_args
static const attn_abi_field attn_kv_tree_args_fields[] = {
    F(layer), F(seq), F(draft_tokens), F(parents), F(q_heads), F(scale), F(q), F(k_new),
    F(v_new), F(out), F(softcap), F(alibi_slopes), F(sinks)
};
#undef T

#define T attn_lm_config
static const attn_abi_field attn_lm_config_fields[] = {
    F(arch), F(vocab_size), F(context_length), F(emb_dim), F(n_heads), F(n_layers),
    F(n_kv_groups), F(hidden_dim), F(qkv_bias), F(tie_embeddings), F(norm_eps), F(rope_base),
    F(rope_factor), F(rope_low_freq_factor), F(rope_high_freq_factor),
    F(rope_original_context_length), F(weights_dtype), F(sliding_window_size),
    F(sliding_window_stride), F(latent_dim)
};
#undef T

#define T attn_lm_forward_args
static const attn_abi_field attn_lm_forward_args_fields[] = {
    F(cache), F(tokens), F(batch), F(lens), F(tokens_per_seq), F(last_only), F(logits)
};
#undef T

#define T attn_sampling
static const attn_abi_field attn_sampling_fields[] = {
    F(temperature), F(top_k), F(top_p)
};
#undef T

#define T attn_generate_args
static const attn_abi_field attn_generate_args_fields[] = {
    F(prompt), F(prompt_len), F(max_new_tokens), F(sampling), F(rng), F(stop_tokens),
    F(num_stop_tokens), F(cache), F(on_token), F(user), F(out), F(count)
};
#undef T

static const attn_abi_struct layout[] = {
    S(attn_abi_field), S(attn_abi_struct), S(attn_ctx_config), S(attn_cpu_info),
    S(attn_sdpa_config), S(attn_sdpa_dropout), S(attn_block_mask_config),
    S(attn_block_mask_info), S(attn_score_tile), S(attn_score_mod), S(attn_param), S(attn_simple_config),
    S(attn_sa_v1_config), S(attn_sa_v2_config), S(attn_causal_config), S(attn_mha_wrapper_config),
    S(attn_mha_config), S(attn_gpt2_config), S(attn_gqa_config), S(attn_mla_config),
    S(attn_swa_config), S(attn_module_config), S(attn_gpt2_preset), S(attn_npy),
    S(attn_npy_i32), S(attn_named_tensor),
    S(attn_metadata_entry), S(attn_safetensors_info), S(attn_optimizer_config),
    S(attn_model_config), S(attn_gpt_config), S(attn_llama3_config),
    S(attn_kv_cache_config), S(attn_kv_attend_args), S(attn_kv_tree_args), S(attn_lm_config),
    S(attn_lm_forward_args), S(attn_sampling), S(attn_generate_args),
    S(attn_pretrain_options), S(attn_pretrain_event)
};

const attn_abi_struct *attn_abi_layout(size_t *count) {
    if (count) *count = sizeof(layout) / sizeof(layout[0]);
    return layout;
}
