/*
 * kernel_set.h — the one place the instruction set is chosen: a ctx's
 * attn_kernel_set (core/internal.h) is filled here once, when the ctx is
 * made, with the kernel tables of its instruction set on this CPU; every
 * call then reads its entry (flash, flash16, decode, gemm, gemm16, gemv)
 * and never switches on the instruction set itself.
 */
#ifndef ATTN_KERNEL_SET_H
#define ATTN_KERNEL_SET_H

#include "internal.h"

#include <stdbool.h>
#include <stddef.h>

/* *set = the kernels of isa (resolved, never AUTO) on this CPU: the fused
 * Zen 4 set on a Zen 4 core, the bf16 entries where the CPU has
 * avx512_bf16 (AMX where it and the OS have the tiles); every entry NULL
 * for ATTN_KERNELS_REFERENCE. */
void attn_kernel_set_fill(attn_kernels isa, attn_kernel_set *set);

/* The 16-bit GEMM a call of dtype takes on set: for bf16 AMX tiles where
 * the process may use them now (tiles: attn_ctx_amx_usable), else
 * vdpbf16ps where it outruns the float FMA, else (and for f16) widened
 * panels; NULL for the reference set. */
const struct attn_gemm16_kernel *attn_kernel_set_gemm16(const attn_kernel_set *set,
                                                        attn_dtype dtype, bool tiles);

/* "avx512: flash avx512, flash16 vdpbf16ps+amx, decode avx512, ...": every
 * entry's kernel, into buf (cap bytes, NUL-terminated, cut to fit); the
 * whole text's length (attn_ctx_describe_kernels). */
size_t attn_kernel_set_describe(const attn_kernel_set *set, char *buf, size_t cap);

#endif /* ATTN_KERNEL_SET_H */
