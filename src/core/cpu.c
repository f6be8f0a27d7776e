/* cpu.c — which kernel sets this CPU runs and which one a ctx takes: the
 * ctx's choice, made here in core so that the context needs nothing from
 * the kernels it chooses between; and what the CPU is (attn_cpu_info_get),
 * for the tuning and the benchmarks. */
#define _GNU_SOURCE /* syscall(), sysconf's cache sizes */
#include "cpu_info.h"
#include "internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(ATTN_HAVE_X86_KERNELS) && (defined(__GNUC__) || defined(__clang__))
#define ATTN_CPUID 1
#include <cpuid.h>
#endif
#if defined(ATTN_CPUID) && defined(__linux__)
#include <sys/syscall.h>
#endif

const char *attn_kernels_name(attn_kernels kernels) {
    switch (kernels) {
    case ATTN_KERNELS_AUTO: return "auto";
    case ATTN_KERNELS_REFERENCE: return "reference";
    case ATTN_KERNELS_PORTABLE: return "portable";
    case ATTN_KERNELS_AVX2: return "avx2";
    case ATTN_KERNELS_AVX512: return "avx512";
    }
    return "?";
}

#if defined(ATTN_HAVE_X86_KERNELS)
/* F16C (CPUID leaf 1, ECX bit 29): the AVX2 kernels widen binary16 and fp8
 * codes with it. Asked by CPUID, as clang's __builtin_cpu_supports does not
 * know it. */
static bool cpu_has_f16c(void) {
    unsigned int a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1u);
}
#endif

bool attn_kernels_supported(attn_kernels kernels) {
    switch (kernels) {
    case ATTN_KERNELS_AUTO:
    case ATTN_KERNELS_REFERENCE:
    case ATTN_KERNELS_PORTABLE:
        return true;
#if defined(ATTN_HAVE_X86_KERNELS)
    case ATTN_KERNELS_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    case ATTN_KERNELS_AVX512:
        return __builtin_cpu_supports("avx512f");
#else
    case ATTN_KERNELS_AVX2:
    case ATTN_KERNELS_AVX512:
        return false;
#endif
    }
    return false;
}

static bool parse_kernels(const char *name, attn_kernels *out) {
    for (attn_kernels k = ATTN_KERNELS_REFERENCE; k <= ATTN_KERNELS_AVX512; k++) {
        if (strcmp(name, attn_kernels_name(k)) == 0) {
            *out = k;
            return true;
        }
    }
    return false;
}

attn_status attn_kernels_resolve(attn_kernels requested, attn_kernels *out) {
    if (requested == ATTN_KERNELS_AUTO) {
        const char *env = getenv("ATTN_KERNELS");
        if (env && *env && strcmp(env, "auto") != 0) {
            if (!parse_kernels(env, &requested)) return ATTN_ERR_INVALID;
        } else {
            requested = attn_kernels_supported(ATTN_KERNELS_AVX512) ? ATTN_KERNELS_AVX512
                        : attn_kernels_supported(ATTN_KERNELS_AVX2) ? ATTN_KERNELS_AVX2
                                                                    : ATTN_KERNELS_PORTABLE;
        }
    }
    if (requested < ATTN_KERNELS_REFERENCE || requested > ATTN_KERNELS_AVX512 ||
        !attn_kernels_supported(requested))
        return ATTN_ERR_INVALID;
    *out = requested;
    return ATTN_OK;
}

/* ---- what the CPU is ------------------------------------------------------ */

/* Cache sizes of cpu0 from Linux's sysfs: each cache's level, type and size
 * ("48K"); what sysconf does not know (non-glibc, some VMs). */
static void caches_from_sysfs(attn_cpu_info *info) {
    for (int index = 0; index < 16; index++) {
        char path[96], type[32] = "", size_text[32] = "";
        unsigned level = 0;
        FILE *f;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", index);
        if (!(f = fopen(path, "r"))) break;
        int ok = fscanf(f, "%u", &level) == 1;
        fclose(f);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", index);
        if ((f = fopen(path, "r"))) {
            ok = ok && fscanf(f, "%31s", type) == 1;
            fclose(f);
        }
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", index);
        if ((f = fopen(path, "r"))) {
            ok = ok && fscanf(f, "%31s", size_text) == 1;
            fclose(f);
        }
        if (!ok || strcmp(type, "Instruction") == 0) continue;
        char *end;
        unsigned long long bytes = strtoull(size_text, &end, 10);
        if (*end == 'K') bytes <<= 10;
        else if (*end == 'M') bytes <<= 20;
        size_t *slot = level == 1 ? &info->l1d_bytes : level == 2 ? &info->l2_bytes
                       : level == 3 ? &info->l3_bytes : NULL;
        if (slot && *slot == 0) *slot = (size_t)bytes;
    }
}

/* Whatever CPUID left unknown: sysconf (glibc), then sysfs. */
static void caches_from_os(attn_cpu_info *info) {
#if defined(_SC_LEVEL1_DCACHE_SIZE) && defined(_SC_LEVEL2_CACHE_SIZE) && defined(_SC_LEVEL3_CACHE_SIZE)
    long l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE),
         l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (info->l1d_bytes == 0 && l1 > 0) info->l1d_bytes = (size_t)l1;
    if (info->l2_bytes == 0 && l2 > 0) info->l2_bytes = (size_t)l2;
    if (info->l3_bytes == 0 && l3 > 0) info->l3_bytes = (size_t)l3;
#endif
    if (info->l1d_bytes == 0 || info->l2_bytes == 0 || info->l3_bytes == 0)
        caches_from_sysfs(info);
}

#if defined(ATTN_CPUID)

typedef struct cpuid_regs {
    unsigned eax, ebx, ecx, edx;
} cpuid_regs;

/* CPUID leaf.subleaf; zeros when the leaf is beyond the CPU's maximum. */
static cpuid_regs cpuid(unsigned leaf, unsigned subleaf) {
    cpuid_regs r = {0, 0, 0, 0};
    if (!__get_cpuid_count(leaf, subleaf, &r.eax, &r.ebx, &r.ecx, &r.edx))
        r = (cpuid_regs){0, 0, 0, 0};
    return r;
}

/* The display family of CPUID leaf 1's eax: the extended field counts for
 * base family 15 (AMD's 25 is Zen 3/4, 26 Zen 5). */
static unsigned display_family(unsigned eax) {
    unsigned base = (eax >> 8) & 0xf;
    return base == 0xf ? base + ((eax >> 20) & 0xff) : base;
}

static bool bit(unsigned word, unsigned n) { return (word >> n) & 1u; }

/* XCR0: the register state the OS saves on a context switch (XGETBV 0),
 * read only where CPUID says the OS enabled XSAVE (OSXSAVE). */
static uint64_t os_saved_state(void) {
    if (!bit(cpuid(1, 0).ecx, 27)) return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/* XCR0 bits: SSE and AVX (1, 2); opmask, upper ZMM0-15, ZMM16-31 (5-7);
 * AMX tile config and tile data (17, 18). */
#define XSTATE_AVX ((uint64_t)0x6)
#define XSTATE_AVX512 ((uint64_t)0xE6)
#define XSTATE_AMX ((uint64_t)3 << 17)

/* Whether Linux lets this process use the AMX tile data (the permission a
 * process must ask for with ARCH_REQ_XCOMP_PERM before its first tile
 * instruction). Only asked here; attn_cpu_request_amx requests it, when
 * the application calls it. Elsewhere: XCR0 alone. */
static bool amx_permitted(void) {
#if defined(__linux__) && defined(SYS_arch_prctl)
    enum { ARCH_GET_XCOMP_PERM = 0x1022, XFEATURE_XTILEDATA = 18 };
    uint64_t permitted = 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &permitted) != 0) return false;
    return bit((unsigned)(permitted >> XFEATURE_XTILEDATA), 0);
#else
    return true;
#endif
}

/* AMX-BF16 and AMX-TILE (CPUID 7.0 EDX 22, 24) and the tile state saved
 * by the OS. */
static bool amx_present(cpuid_regs r7, uint64_t xcr0) {
    return bit(r7.edx, 22) && bit(r7.edx, 24) && (xcr0 & XSTATE_AMX) == XSTATE_AMX;
}

/* Those, and the process's permission. */
static bool amx_usable(cpuid_regs r7, uint64_t xcr0) {
    return amx_present(r7, xcr0) && amx_permitted();
}

/* The 48-byte brand string of leaves 0x80000002-4, leading blanks dropped. */
static void brand_string(attn_cpu_info *info) {
    if (cpuid(0x80000000u, 0).eax < 0x80000004u) return;
    char brand[49];
    for (unsigned i = 0; i < 3; i++) {
        cpuid_regs r = cpuid(0x80000002u + i, 0);
        memcpy(brand + 16 * i, &r, 16);
    }
    brand[48] = '\0';
    const char *start = brand;
    while (*start == ' ') start++;
    snprintf(info->model_name, sizeof info->model_name, "%s", start);
    size_t len = strlen(info->model_name);
    while (len > 0 && info->model_name[len - 1] == ' ') info->model_name[--len] = '\0';
}

/* Data and unified caches from a deterministic cache leaf (Intel's 4,
 * AMD's 0x8000001D: the same layout), subleaf by subleaf. A cache shared by
 * several cores counts whole (l3: the slice a core sees, a CCX's on AMD). */
static void caches_from_cpuid(attn_cpu_info *info, unsigned leaf) {
    for (unsigned sub = 0; sub < 16; sub++) {
        cpuid_regs r = cpuid(leaf, sub);
        unsigned type = r.eax & 0x1f, level = (r.eax >> 5) & 0x7;
        if (type == 0) break;
        if (type == 2) continue; /* instructions */
        size_t ways = (r.ebx >> 22) + 1, partitions = ((r.ebx >> 12) & 0x3ff) + 1,
               line = (r.ebx & 0xfff) + 1, sets = (size_t)r.ecx + 1;
        size_t bytes = ways * partitions * line * sets;
        if (level == 1) info->l1d_bytes = bytes;
        else if (level == 2) info->l2_bytes = bytes;
        else if (level == 3) info->l3_bytes = bytes;
    }
}

static void x86_info(attn_cpu_info *info) {
    cpuid_regs r0 = cpuid(0, 0);
    unsigned max_leaf = r0.eax;
    memcpy(info->vendor, &r0.ebx, 4);
    memcpy(info->vendor + 4, &r0.edx, 4);
    memcpy(info->vendor + 8, &r0.ecx, 4);
    info->vendor[12] = '\0';
    bool intel = strcmp(info->vendor, "GenuineIntel") == 0;
    bool amd = strcmp(info->vendor, "AuthenticAMD") == 0;
    brand_string(info);

    /* display family and model: the extended fields count for family 15
     * (and, for the model, family 6 too) */
    cpuid_regs r1 = cpuid(1, 0);
    unsigned base_family = (r1.eax >> 8) & 0xf, base_model = (r1.eax >> 4) & 0xf;
    info->family = display_family(r1.eax);
    info->model = base_family == 0x6 || base_family == 0xf
                      ? base_model + (((r1.eax >> 16) & 0xf) << 4) : base_model;

    /* features: the CPU has them and the OS saves their registers */
    uint64_t xcr0 = os_saved_state();
    cpuid_regs r7 = max_leaf >= 7 ? cpuid(7, 0) : (cpuid_regs){0, 0, 0, 0};
    cpuid_regs r7_1 = max_leaf >= 7 && r7.eax >= 1 ? cpuid(7, 1) : (cpuid_regs){0, 0, 0, 0};
    bool avx_state = (xcr0 & XSTATE_AVX) == XSTATE_AVX;
    bool avx512_state = (xcr0 & XSTATE_AVX512) == XSTATE_AVX512;
    info->avx2_fma = avx_state && bit(r1.ecx, 28) && bit(r1.ecx, 12) && bit(r7.ebx, 5);
    info->avx512f = avx512_state && bit(r7.ebx, 16);
    info->avx512_bf16 = info->avx512f && bit(r7_1.eax, 5);
    info->avx512_fp16 = info->avx512f && bit(r7.edx, 23);
    info->amx_bf16 = amx_usable(r7, xcr0);

    /* what the tuning keys on */
    if (amd && info->family == 25 && info->avx512f) info->uarch = "zen4";
    else if (amd && info->family == 26) info->uarch = "zen5";
    else if (intel && info->avx512f) info->uarch = "intel-avx512";
    else if (intel && info->avx2_fma) info->uarch = "intel-avx2";
    /* Zen 4 runs a 512-bit operation as two 256-bit halves */
    info->fma_vector_bits = info->avx512f ? (strcmp(info->uarch, "zen4") == 0 ? 256 : 512)
                            : info->avx2_fma ? 256 : 128;

    if (intel && max_leaf >= 4) caches_from_cpuid(info, 4);
    if (amd) {
        unsigned max_ext = cpuid(0x80000000u, 0).eax;
        bool topology_ext = max_ext >= 0x80000001u && bit(cpuid(0x80000001u, 0).ecx, 22);
        if (topology_ext && max_ext >= 0x8000001Du) {
            caches_from_cpuid(info, 0x8000001Du);
        } else if (max_ext >= 0x80000006u) {
            /* the legacy leaves: L1d in KiB, L2 in KiB, L3 in 512 KiB units */
            info->l1d_bytes = (size_t)(cpuid(0x80000005u, 0).ecx >> 24) << 10;
            cpuid_regs r6 = cpuid(0x80000006u, 0);
            info->l2_bytes = (size_t)(r6.ecx >> 16) << 10;
            info->l3_bytes = (size_t)(r6.edx >> 18) << 19;
        }
    }
}

#endif /* ATTN_CPUID */

attn_status attn_cpu_request_amx(void) {
#if defined(ATTN_CPUID) && defined(__linux__) && defined(SYS_arch_prctl)
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    if (!attn_cpu_amx_bf16_present()) return ATTN_ERR_UNSUPPORTED;
    if (!amx_permitted() && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0)
        return ATTN_ERR_UNSUPPORTED;
    return amx_permitted() ? ATTN_OK : ATTN_ERR_UNSUPPORTED;
#else
    return ATTN_ERR_UNSUPPORTED;
#endif
}

bool attn_cpu_amx_bf16_usable(void) {
    return attn_cpu_amx_bf16_present() && attn_cpu_amx_permitted();
}

bool attn_cpu_amx_bf16_present(void) {
#if defined(ATTN_CPUID)
    return cpuid(0, 0).eax >= 7 && amx_present(cpuid(7, 0), os_saved_state());
#else
    return false;
#endif
}

bool attn_cpu_amx_int8_present(void) {
#if defined(ATTN_CPUID)
    /* AMX-INT8: CPUID 7.0 EDX 25, beside the tiles attn_cpu_amx_bf16_present finds */
    return attn_cpu_amx_bf16_present() && bit(cpuid(7, 0).edx, 25);
#else
    return false;
#endif
}

bool attn_cpu_amx_permitted(void) {
#if defined(ATTN_CPUID)
    return amx_permitted();
#else
    return false;
#endif
}

bool attn_cpu_bf16_dot_pays(void) {
#if defined(ATTN_CPUID)
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
           !__builtin_cpu_is("intel");
#else
    return false;
#endif
}

bool attn_cpu_gemv_streamed(void) {
#if defined(ATTN_CPUID)
    return __builtin_cpu_is("amd");
#else
    return false;
#endif
}

attn_status attn_cpu_info_get(attn_cpu_info *out) {
    if (!out) return ATTN_ERR_NULL;
    attn_cpu_info info;
    memset(&info, 0, sizeof info);
    info.uarch = "generic";
#if defined(ATTN_CPUID)
    x86_info(&info);
#elif defined(__aarch64__)
    info.fma_vector_bits = 128; /* NEON */
#endif
    caches_from_os(&info);
    *out = info;
    return ATTN_OK;
}
