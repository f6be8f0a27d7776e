/* Placeholder until written. */
typedef int attn_placeholder_src_generate_generate_c;
