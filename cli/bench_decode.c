/* Placeholder until written. */
typedef int attn_placeholder_cli_bench_decode_c;
