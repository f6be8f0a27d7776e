/*
 * bgemm_amx_32x32.c — the bf16 kernel set on AMX (Sapphire Rapids and
 * later): a 32 x 32 tile of C in four 16 x 16 float tiles, fed by
 * tdpbf16ps, 32 values of k a step.
 *
 * Tiles: 0-3 C (rows 0-15 / 16-31 x columns 0-15 / 16-31), 4-5 A (16 rows
 * x 32 bf16 of k), 6-7 B (16 pairs of k x 16 columns, a pair per column).
 * Per step the kernel loads two A and two B tiles and runs four tdpbf16ps:
 * 32 x 32 x 32 products. Layouts (gemm16.h, k_unit 32):
 *   A panel: step s, row i: its 32 values of k, 64 bytes: a tile row;
 *   B panel: the bf16 pairs of the vdpbf16ps kernel (16 pairs of k, each
 *            32 columns x 2): a B tile is every other 64 bytes of it.
 * Each C element adds its k products pair by pair into a float (as Intel's
 * pseudo-code gives tdpbf16ps: the even element's product, then the
 * odd's, each rounded); bf16 denormals read as zero.
 *
 * The tiles need the process's permission from Linux (arch_prctl
 * ARCH_REQ_XCOMP_PERM): the application asks for it; the library runs this
 * kernel only once it has been given (gemm16_config.c). The tile
 * configuration is loaded and released by every microkernel call, so no
 * state outlives it. Compiled with -mavx512f -mavx512bw -mamx-tile
 * -mamx-bf16 (this file only).
 */
#include "kernels/gemm/gemm16.h"
#include "kernels/amx_tiles.h"
#include "kernels/gemm/transpose16_avx512.h"

#include <immintrin.h>

#define MR 32
#define NR 32
#define KU 32 /* values of k a step */

void attn_bgemm_amx_32x32(size_t steps, const void *a_panel, const void *b_panel, float *c,
                          size_t ldc, float alpha, float beta) {
    attn_amx_load_tiles();
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const uint16_t *a = a_panel, *b = b_panel;
    for (size_t s = 0; s < steps; s++) {
        _tile_loadd(4, a, 64);
        _tile_loadd(5, a + 16 * KU, 64);
        _tile_loadd(6, b, 4 * NR);
        _tile_loadd(7, b + 32, 4 * NR);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
        a += MR * KU;
        b += NR * KU;
    }
    _Alignas(64) float acc[MR * NR];
    _tile_stored(0, acc, 4 * NR);
    _tile_stored(1, acc + 16, 4 * NR);
    _tile_stored(2, acc + 16 * NR, 4 * NR);
    _tile_stored(3, acc + 16 * NR + 16, 4 * NR);
    _tile_release();
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    for (size_t r = 0; r < MR; r++) {
        float *c_r = c + r * ldc;
        for (size_t h = 0; h < NR; h += 16) {
            __m512 x = _mm512_mul_ps(va, _mm512_load_ps(acc + r * NR + h));
            if (beta != 0.0f) x = _mm512_fmadd_ps(vb, _mm512_loadu_ps(c_r + h), x);
            _mm512_storeu_ps(c_r + h, x);
        }
    }
}

/* ---- packing ---------------------------------------------------------------- */

static size_t min_len(size_t a, size_t b) { return a < b ? a : b; }
static __mmask32 first_bits(size_t n) {
    return n >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << n) - 1u);
}

/* A as is: row i's values of k are adjacent, copied 32 at a time. */
static void pack_a_rows(size_t kc, size_t rows, const uint16_t *src, size_t ld, uint16_t *dst) {
    size_t steps = (kc + KU - 1) / KU;
    for (size_t q = 0; q * MR < rows; q++) {
        size_t n = min_len(MR, rows - q * MR);
        uint16_t *panel = dst + q * steps * MR * KU;
        for (size_t i = 0; i < MR; i++)
            for (size_t s = 0; s < steps; s++) {
                __m512i x = i < n ? _mm512_maskz_loadu_epi16(first_bits(kc - s * KU),
                                                             src + (q * MR + i) * ld + s * KU)
                                  : _mm512_setzero_si512();
                _mm512_store_si512(panel + (s * MR + i) * KU, x);
            }
    }
}

/* A transposed (element (i, k) at src[k*ld + i]): per step, rows k of 32
 * values of i are interleaved into pairs (i's values of k = 2t, 2t + 1)
 * and the 16 x 16 blocks of pairs transposed, giving row i's 32 values. */
static void pack_a_columns(size_t kc, size_t rows, const uint16_t *src, size_t ld,
                           uint16_t *dst) {
    __m512i low_half = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                        40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                        32, 0);
    __m512i high_half = _mm512_add_epi16(low_half, _mm512_set1_epi16(16));
    size_t steps = (kc + KU - 1) / KU;
    for (size_t q = 0; q * MR < rows; q++) {
        __mmask32 in = first_bits(rows - q * MR);
        uint16_t *panel = dst + q * steps * MR * KU;
        for (size_t s = 0; s < steps; s++) {
            __m512 lo[16], hi[16];
            for (size_t t = 0; t < 16; t++) {
                size_t k = s * KU + 2 * t;
                __m512i even = k < kc ? _mm512_maskz_loadu_epi16(in, src + k * ld + q * MR)
                                      : _mm512_setzero_si512();
                __m512i odd = k + 1 < kc ? _mm512_maskz_loadu_epi16(in, src + (k + 1) * ld + q * MR)
                                         : _mm512_setzero_si512();
                lo[t] = _mm512_castsi512_ps(_mm512_permutex2var_epi16(even, low_half, odd));
                hi[t] = _mm512_castsi512_ps(_mm512_permutex2var_epi16(even, high_half, odd));
            }
            attn_transpose16(lo);
            attn_transpose16(hi);
            for (size_t i = 0; i < 16; i++) {
                _mm512_store_ps(panel + (s * MR + i) * KU, lo[attn_transpose16_order[i]]);
                _mm512_store_ps(panel + (s * MR + 16 + i) * KU, hi[attn_transpose16_order[i]]);
            }
        }
    }
}

void attn_bgemm_amx_32x32_pack_a(attn_dtype dtype, size_t kc, size_t rows, const uint16_t *src,
                                 size_t ld, bool trans, void *dst) {
    (void)dtype; /* bf16 only */
    if (trans)
        pack_a_columns(kc, rows, src, ld, dst);
    else
        pack_a_rows(kc, rows, src, ld, dst);
}

/* B: the vdpbf16ps kernel's pairs, panel by panel, then zero pairs up to
 * the step. */
void attn_bgemm_amx_32x32_pack_b(attn_dtype dtype, size_t kc, size_t cols, const uint16_t *src,
                                 size_t ld, bool trans, void *dst) {
    size_t pairs = (kc + 1) / 2, padded = (kc + KU - 1) / KU * KU / 2;
    uint16_t *d = dst;
    for (size_t q = 0; q * NR < cols; q++) {
        uint16_t *panel = d + q * padded * 2 * NR;
        attn_bgemm_avx512bf16_14x32_pack_b(dtype, kc, min_len(NR, cols - q * NR),
                                           trans ? src + q * NR * ld : src + q * NR, ld, trans,
                                           panel);
        memset(panel + pairs * 2 * NR, 0, (padded - pairs) * 2 * NR * sizeof *panel);
    }
}
