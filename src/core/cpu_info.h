/*
 * cpu_info.h — what the kernels ask of the CPU between calls, cheaper than
 * attn_cpu_info_get (core/cpu.c).
 */
#ifndef ATTN_CPU_INFO_H
#define ATTN_CPU_INFO_H

#include <stdbool.h>

/* Whether this thread may run AMX bf16 tile instructions now: the CPU has
 * AMX-BF16 and AMX-TILE, the OS saves the tile state, and Linux has given
 * the process the tile data (ARCH_REQ_XCOMP_PERM, which the application
 * asks for; the library only asks whether it was given). A few CPUID
 * leaves and one system call. */
bool attn_cpu_amx_bf16_usable(void);

#endif /* ATTN_CPU_INFO_H */
