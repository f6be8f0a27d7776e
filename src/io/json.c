/* Placeholder until written. */
typedef int attn_placeholder_src_io_json_c;
