/*
 * sgemm_portable_4x8.c — the portable kernel set: a 4 x 8 tile of C in
 * plain C, for any CPU. Written so that compilers keep the tile in vector
 * registers with the build's baseline instruction set (eight SSE or NEON
 * registers): the step's row of B is read into a local array, and every
 * row of the tile adds a_i times it. Multiply, then add: no fused
 * multiply-add is assumed, so the rounding is the same wherever it runs.
 */
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/gemm_pack.h"

#define MR 4
#define NR 8
_Static_assert(NR <= ATTN_GEMM_NR_MAX, "an edge tile pads its bias to ATTN_GEMM_NR_MAX");

void attn_sgemm_portable_4x8(size_t k, const float *a, const float *b, float *c, size_t ldc,
                             float alpha, float beta, const float *bias) {
    float acc[MR][NR];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) acc[i][j] = 0.0f;
    for (size_t p = 0; p < k; p++) {
        float b_p[NR];
        for (int j = 0; j < NR; j++) b_p[j] = b[j];
        for (int i = 0; i < MR; i++) {
            float a_i = a[i];
            for (int j = 0; j < NR; j++) acc[i][j] += a_i * b_p[j];
        }
        a += MR;
        b += NR;
    }
    for (int i = 0; i < MR; i++) {
        float *c_i = c + (size_t)i * ldc;
        if (beta == 0.0f)
            for (int j = 0; j < NR; j++) c_i[j] = alpha * acc[i][j];
        else
            for (int j = 0; j < NR; j++) c_i[j] = beta * c_i[j] + alpha * acc[i][j];
        if (bias)
            for (int j = 0; j < NR; j++) c_i[j] = c_i[j] + bias[j];
    }
}

ATTN_GEMM_DEFINE_PACK(attn_sgemm_portable_4x8, MR, NR)
