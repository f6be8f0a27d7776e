/* Placeholder until written. */
typedef int attn_placeholder_cli_cmd_generate_c;
