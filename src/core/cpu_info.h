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
 * asks for; the library only asks whether it was given). Three CPUID
 * leaves and one system call; the calls ask the ctx instead
 * (attn_ctx_amx_usable): in a virtual machine each CPUID leaf exits to the
 * hypervisor, which costs a short bf16 call more than its work. */
bool attn_cpu_amx_bf16_usable(void);
/* Its two halves: the CPU and the OS (CPUID and XCR0: fixed for the
 * process, which the ctx asks once), and Linux's permission (one cheap
 * system call; an application may ask for it at any time). */
bool attn_cpu_amx_bf16_present(void);
/* And AMX-INT8 (tdpbssd) with them. */
bool attn_cpu_amx_int8_present(void);
bool attn_cpu_amx_permitted(void);

/* Whether vdpbf16ps outruns the float FMA on this CPU, so that the bf16
 * kernels (GEMM and attention) pay where AMX does not take the call: the
 * CPU has avx512_bf16 (and the AVX-512BW shuffles beside it) and is not
 * Intel's. On Zen 4 vdpbf16ps issues at the FMA's rate with twice the
 * products; on Intel's cores it issues at half the FMA's rate, so there the
 * bf16 kernels trail the float ones and widening pays (Intel's fast bf16 is
 * AMX). */
bool attn_cpu_bf16_dot_pays(void);

/* Whether a token's matrix-vector products read W's rows streamed (one
 * short row at a time, start to end; long ones two at a time, asked for
 * into L2 ahead) rather than paired (rows side by side, asked for into
 * L1): AMD's CPUs, whose prefetchers follow one stream. Intel's lose with
 * streamed reads what AMD's lose with paired ones. */
bool attn_cpu_gemv_streamed(void);

#endif /* ATTN_CPU_INFO_H */
