/* Placeholder until written. */
typedef int attn_placeholder_src_lm_lm_load_c;
