/*
 * amx_tiles.h — the one AMX tile configuration the bf16 kernels use
 * (kernels/gemm/bgemm_amx_32x32.c, kernels/flash16/flash16_amx.c): palette
 * 1, tiles 0-7 each 16 rows of 64 bytes (16 floats, or 32 bf16). For files
 * compiled with -mamx-tile.
 */
#ifndef ATTN_AMX_TILES_H
#define ATTN_AMX_TILES_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* LDTILECFG's 64 bytes. */
typedef struct attn_amx_tile_config {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} attn_amx_tile_config;

/* Loads the configuration on this thread (TILERELEASE when done). */
static inline void attn_amx_load_tiles(void) {
    attn_amx_tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
    _tile_loadconfig(&cfg);
}

#endif /* ATTN_AMX_TILES_H */
