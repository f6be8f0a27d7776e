/*
 * test_cpu_info.c — attn_cpu_info_get against what the OS says of the same
 * CPU: /proc/cpuinfo's vendor_id, model name, cpu family, model and flags
 * (Linux clears a flag whose registers it does not save, so the flags are
 * the "usable" features), the compiler's __builtin_cpu_supports, and the
 * caches of /sys/devices/system/cpu/cpu0/cache. AMX: usable only once the
 * process has Linux's permission, so the test checks the field before and
 * after asking for it (ARCH_REQ_XCOMP_PERM: the test may change its own
 * process; the library only asks).
 */
#define _GNU_SOURCE
#include "attn.h"
#include "check.h"
#include "cpu_info.h"
#include "internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/syscall.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#define X86 1
#endif

typedef struct proc_cpu {
    bool found;
    char vendor[64], model_name[128];
    unsigned family, model;
    char flags[4096];
} proc_cpu;

/* The value after "key<tabs>: " of the first processor's line, trimmed. */
static bool field(const char *line, const char *key, char *out, size_t size) {
    size_t len = strlen(key);
    if (strncmp(line, key, len) != 0) return false;
    const char *v = line + len;
    while (*v == ' ' || *v == '\t') v++;
    if (*v++ != ':') return false; /* "model" is not "model name" */
    while (*v == ' ' || *v == '\t') v++;
    snprintf(out, size, "%.*s", (int)strcspn(v, "\n"), v);
    return true;
}

static proc_cpu read_proc_cpuinfo(void) {
    proc_cpu p = {0};
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return p;
    char line[8192], number[32];
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '\n') {
            if (p.found) break; /* the first processor only */
            continue;
        }
        p.found = true;
        if (field(line, "cpu family", number, sizeof number)) p.family = (unsigned)atoi(number);
        else if (field(line, "model", number, sizeof number)) p.model = (unsigned)atoi(number);
        else if (field(line, "flags", p.flags + 1, sizeof p.flags - 2)) {
            /* " flag flag ... ": every flag between blanks */
            p.flags[0] = ' ';
            strcat(p.flags, " ");
        } else {
            (void)(field(line, "vendor_id", p.vendor, sizeof p.vendor) ||
                   field(line, "model name", p.model_name, sizeof p.model_name));
        }
    }
    fclose(f);
    return p;
}

static bool has_flag(const proc_cpu *p, const char *flag) {
    char word[64];
    snprintf(word, sizeof word, " %s ", flag);
    return strstr(p->flags, word) != NULL;
}

/* The size of cpu0's cache of this level and kind ("Data"/"Unified") from
 * sysfs, 0 when absent. */
static size_t sysfs_cache(unsigned want_level) {
    for (int index = 0; index < 16; index++) {
        char path[96], type[32] = "", size_text[32] = "";
        unsigned level = 0;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", index);
        FILE *f = fopen(path, "r");
        if (!f) break;
        if (fscanf(f, "%u", &level) != 1) level = 0;
        fclose(f);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", index);
        if ((f = fopen(path, "r"))) {
            if (fscanf(f, "%31s", type) != 1) type[0] = '\0';
            fclose(f);
        }
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", index);
        if ((f = fopen(path, "r"))) {
            if (fscanf(f, "%31s", size_text) != 1) size_text[0] = '\0';
            fclose(f);
        }
        if (level != want_level || strcmp(type, "Instruction") == 0) continue;
        char *end;
        unsigned long long bytes = strtoull(size_text, &end, 10);
        if (*end == 'K') bytes <<= 10;
        else if (*end == 'M') bytes <<= 20;
        return (size_t)bytes;
    }
    return 0;
}

#if defined(X86) && defined(__linux__) && defined(SYS_arch_prctl)
enum { ARCH_GET_XCOMP_PERM = 0x1022, XFEATURE_XTILEDATA = 18 };

static bool amx_permitted(void) {
    uint64_t permitted = 0;
    return syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &permitted) == 0 &&
           ((permitted >> XFEATURE_XTILEDATA) & 1u);
}

/* Before and after this process asks Linux for the AMX tile data, through
 * attn_cpu_request_amx, whose answer must match what the OS then says. */
static void amx(const proc_cpu *p) {
    attn_cpu_info info;
    CHECK_STATUS(attn_cpu_info_get(&info), ATTN_OK);
    bool before = amx_permitted();
    CHECK(info.amx_bf16 == (has_flag(p, "amx_bf16") && has_flag(p, "amx_tile") && before));
    attn_status st = attn_cpu_request_amx();
    bool after = amx_permitted();
    CHECK_STATUS(attn_cpu_info_get(&info), ATTN_OK);
    printf("amx_bf16: %s before asking, %s after (attn_cpu_request_amx: %s)\n",
           before ? "usable" : "not usable", info.amx_bf16 ? "usable" : "not usable",
           attn_status_name(st));
    CHECK((st == ATTN_OK) == (has_flag(p, "amx_bf16") && has_flag(p, "amx_tile") && after));
    CHECK(st == ATTN_OK || st == ATTN_ERR_UNSUPPORTED);
    CHECK(info.amx_bf16 == (st == ATTN_OK));
    CHECK(attn_cpu_request_amx() == st); /* asking again changes nothing */
}
#else
static void amx(const proc_cpu *p) {
    (void)p;
}
#endif

int main(void) {
    CHECK_STATUS(attn_cpu_info_get(NULL), ATTN_ERR_NULL);
    attn_cpu_info info;
    memset(&info, 0x5a, sizeof info);
    CHECK_STATUS(attn_cpu_info_get(&info), ATTN_OK);
    printf("vendor '%s', model '%s', family %u model %u, uarch %s, fma %u bits\n", info.vendor,
           info.model_name, info.family, info.model, info.uarch, info.fma_vector_bits);
    printf("avx2_fma %d avx512f %d avx512_bf16 %d avx512_fp16 %d amx_bf16 %d; "
           "L1d %zu, L2 %zu, L3 %zu bytes\n", info.avx2_fma, info.avx512f, info.avx512_bf16,
           info.avx512_fp16, info.amx_bf16, info.l1d_bytes, info.l2_bytes, info.l3_bytes);
    CHECK(memchr(info.vendor, '\0', sizeof info.vendor) != NULL);
    CHECK(memchr(info.model_name, '\0', sizeof info.model_name) != NULL);
    CHECK(info.uarch != NULL);
    static const char *const uarchs[] = {"zen4", "zen5", "intel-avx512", "intel-avx2", "generic"};
    bool known = false;
    for (size_t i = 0; info.uarch && i < 5; i++) known = known || strcmp(info.uarch, uarchs[i]) == 0;
    CHECK(known);

    /* the field's meanings among themselves */
    CHECK(!info.avx512_bf16 || info.avx512f);
    CHECK(!info.avx512_fp16 || info.avx512f);
    CHECK(info.fma_vector_bits == (!info.avx512f ? (info.avx2_fma ? 256u : info.fma_vector_bits)
                                   : strcmp(info.uarch, "zen4") == 0 ? 256u : 512u));

    /* the same CPU as /proc/cpuinfo describes */
    proc_cpu p = read_proc_cpuinfo();
#if defined(X86)
    if (p.found) { /* /proc may be absent (containers): then the builtins alone */
        CHECK(strcmp(info.vendor, p.vendor) == 0);
        if (strcmp(info.model_name, p.model_name) != 0)
            fprintf(stderr, "model '%s' vs /proc/cpuinfo '%s'\n", info.model_name, p.model_name);
        CHECK(strcmp(info.model_name, p.model_name) == 0);
        CHECK(info.family == p.family);
        CHECK(info.model == p.model);
        CHECK(info.avx2_fma == (has_flag(&p, "avx2") && has_flag(&p, "fma")));
        CHECK(info.avx512f == has_flag(&p, "avx512f"));
        CHECK(info.avx512_bf16 == has_flag(&p, "avx512_bf16"));
        CHECK(info.avx512_fp16 == has_flag(&p, "avx512_fp16"));
        amx(&p);
    }
    CHECK(info.avx512f == (__builtin_cpu_supports("avx512f") != 0));
    CHECK(info.avx512_bf16 == (__builtin_cpu_supports("avx512bf16") != 0));
    CHECK(info.avx2_fma == (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")));
    bool intel = strcmp(info.vendor, "GenuineIntel") == 0,
         amd = strcmp(info.vendor, "AuthenticAMD") == 0;
    CHECK(intel || amd);
    if (intel)
        CHECK(strcmp(info.uarch, info.avx512f    ? "intel-avx512"
                                 : info.avx2_fma ? "intel-avx2"
                                                 : "generic") == 0);
    if (amd && info.family == 25 && info.avx512f) CHECK(strcmp(info.uarch, "zen4") == 0);
    if (amd && info.family == 26) CHECK(strcmp(info.uarch, "zen5") == 0);
    /* every x86 CPU of this century reports its L1d and L2 */
    CHECK(info.l1d_bytes >= 16384 && info.l1d_bytes <= (1u << 20));
    CHECK(info.l2_bytes >= 131072 && info.l2_bytes <= ((size_t)64 << 20));
#else
    CHECK(info.vendor[0] == '\0');
    CHECK(strcmp(info.uarch, "generic") == 0);
    (void)p;
#endif
    /* every AVX-512 core takes the one AVX-512 set */
    attn_ctx *ctx = NULL;
    attn_ctx_config avx512 = {.kernels = ATTN_KERNELS_AVX512};
    attn_ctx_config portable = {.kernels = ATTN_KERNELS_PORTABLE};
    if (attn_ctx_new(&avx512, &ctx) == ATTN_OK) CHECK(strcmp(ctx->ks.name, "avx512") == 0);
    attn_ctx_free(ctx);
    ctx = NULL;
    CHECK(attn_ctx_new(&portable, &ctx) == ATTN_OK && strcmp(ctx->ks.name, "portable") == 0);
    /* the kernel table as attn version prints it: each kind's kernel, cut
     * to the buffer and its whole length returned, as snprintf */
    char text[512], cut[16];
    size_t n = attn_ctx_describe_kernels(ctx, text, sizeof text);
    CHECK(n == strlen(text) && strstr(text, "portable: flash portable") == text);
    CHECK(strstr(text, "gemm sgemm_portable_4x8") && strstr(text, "gemv gemv_portable"));
    CHECK(attn_ctx_describe_kernels(ctx, cut, sizeof cut) == n && strlen(cut) == sizeof cut - 1);
    CHECK(attn_ctx_describe_kernels(ctx, NULL, 0) == n);
    attn_ctx_free(ctx);
    ctx = NULL;
    attn_ctx_config reference = {.kernels = ATTN_KERNELS_REFERENCE};
    CHECK(attn_ctx_new(&reference, &ctx) == ATTN_OK);
    attn_ctx_describe_kernels(ctx, text, sizeof text);
    CHECK(strstr(text, "reference: flash reference") == text && !strstr(text, "portable"));
    attn_ctx_free(ctx);
    ctx = NULL;
    if (attn_ctx_new(&avx512, &ctx) == ATTN_OK) {
        attn_ctx_describe_kernels(ctx, text, sizeof text);
        CHECK(strstr(text, "avx512: flash avx512,") == text);
        /* the fused bf16 attention where the CPU has vdpbf16ps */
        CHECK((strstr(text, "flash16 vdpbf16ps") != NULL) == (info.avx512_bf16 != 0));
    }
    attn_ctx_free(ctx);
    /* the caches the OS reports for cpu0, where it does */
    size_t l1 = sysfs_cache(1), l2 = sysfs_cache(2), l3 = sysfs_cache(3);
    if (l1) CHECK(info.l1d_bytes == l1);
    if (l2) CHECK(info.l2_bytes == l2);
    if (l3) CHECK(info.l3_bytes > 0);
    printf("sysfs: L1d %zu, L2 %zu, L3 %zu bytes\n", l1, l2, l3);
    return check_summary();
}
