/* flash_portable.c — the fused attention kernels in portable C: a "vector"
 * is 4 floats, left to the compiler to map onto what the target has. */
#include <math.h>
#include <stdint.h>

#include "kernels/vec/vec_portable.h"

#define NV 2
#define LANE_QV 2 /* the lane forward's tiles: 4 keys x 8 rows */
#define LANE_KT 4
#define FLASH_KERNELS attn_flash_portable
#define FLASH_ISA_NAME "portable"

static inline vec v_keep_keys(vec s, int32_t key, const int32_t *begin, const int32_t *end) {
    for (int i = 0; i < VW; i++)
        if (key < begin[i] || key >= end[i]) s.x[i] = -INFINITY;
    return s;
}
static inline vec v_keep(const uint32_t *w, uint64_t threshold, float kept) {
    vec f;
    for (int i = 0; i < VW; i++) f.x[i] = w[i] < threshold ? kept : 0.0f;
    return f;
}

#include "kernels/flash/flash_kernel.h"
