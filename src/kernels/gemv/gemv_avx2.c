/* Placeholder until written. */
typedef int attn_placeholder_src_kernels_gemv_gemv_avx2_c;
