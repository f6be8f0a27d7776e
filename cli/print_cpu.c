/* print_cpu.c — the CPU as the library sees it, in two lines: what its
 * kernels are chosen and tuned for. attn version prints them, and so does
 * the header of attn-bench, beside the figures they explain. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

/* Whether /proc/cpuinfo lists flag for the first CPU (a CPU feature Linux
 * knows, whether or not this process may use it yet). */
static bool proc_flag(const char *flag) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return false;
    char line[8192], word[64];
    bool found = false;
    snprintf(word, sizeof word, " %s", flag);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5) != 0) continue;
        line[strcspn(line, "\n")] = ' ';
        char *at = strstr(line, word);
        found = at && (at[strlen(word)] == ' ');
        break;
    }
    fclose(f);
    return found;
}

/* "48 KiB", "2 MiB", or "?" (unknown). */
static const char *cache_size(size_t bytes, char *buf, size_t size) {
    if (bytes == 0) snprintf(buf, size, "?");
    else if (bytes % (1u << 20) == 0) snprintf(buf, size, "%zu MiB", bytes >> 20);
    else snprintf(buf, size, "%zu KiB", bytes >> 10);
    return buf;
}

void cli_print_cpu(FILE *out, const char *prefix) {
    attn_cpu_info cpu;
    if (attn_cpu_info_get(&cpu) != ATTN_OK) return;
    char l1[32], l2[32], l3[32];
    fprintf(out, "%s%s (%s, family %u, model %u): %s, %u-bit FMA\n", prefix,
            cpu.model_name[0] ? cpu.model_name : "?", cpu.vendor[0] ? cpu.vendor : "?",
            cpu.family, cpu.model, cpu.uarch, cpu.fma_vector_bits);
    /* AMX is usable once the process asks Linux for it: say when the CPU
     * has it but this process has not asked */
    const char *amx = cpu.amx_bf16 ? " amx_bf16"
                      : proc_flag("amx_bf16") ? " amx_bf16(not requested)" : "";
    fprintf(out, "%sL1d %s, L2 %s, L3 %s; %s%s%s%s%s\n", prefix,
            cache_size(cpu.l1d_bytes, l1, sizeof l1), cache_size(cpu.l2_bytes, l2, sizeof l2),
            cache_size(cpu.l3_bytes, l3, sizeof l3), cpu.avx2_fma ? "avx2 fma" : "no avx2",
            cpu.avx512f ? " avx512f" : "", cpu.avx512_bf16 ? " avx512_bf16" : "",
            cpu.avx512_fp16 ? " avx512_fp16" : "", amx);
}
