/* Placeholder until written. */
typedef int attn_placeholder_src_generate_sample_c;
