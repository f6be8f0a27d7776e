/* Placeholder until written. */
typedef int attn_placeholder_src_kernels_decode_decode_avx2_c;
