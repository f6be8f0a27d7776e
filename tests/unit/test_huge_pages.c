/*
 * test_huge_pages.c — the large allocations (KV caches, model weights) ask
 * Linux for transparent huge pages: the mapping that holds one is marked
 * "hg" (MADV_HUGEPAGE) in /proc/self/smaps. A decode step reads one row
 * of each 4 KiB page in turn; with 2 MiB pages it stops missing the TLB on
 * every row. Where the kernel offers no transparent huge pages (its mode
 * "never", or not Linux) there is nothing to ask, and the test says so.
 */
#define _POSIX_C_SOURCE 200809L

#include "check.h"
#include "internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The VmFlags line of the mapping that holds address p, into flags. */
static bool vm_flags_of(const void *p, char *flags, size_t size) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return false;
    char line[512];
    bool inside = false, found = false;
    uintptr_t at = (uintptr_t)p;
    while (!found && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
            inside = at >= lo && at < hi;
        else if (inside && strncmp(line, "VmFlags:", 8) == 0) {
            size_t n = strlen(line + 8);
            if (n >= size) n = size - 1;
            memcpy(flags, line + 8, n);
            flags[n] = '\0';
            found = true;
        }
    }
    fclose(f);
    return found;
}

int main(void) {
    FILE *mode = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char modes[128] = "";
    if (mode) {
        if (!fgets(modes, sizeof modes, mode)) modes[0] = '\0';
        fclose(mode);
    }
    if (!strstr(modes, "[madvise]") && !strstr(modes, "[always]")) {
        printf("skipped: no transparent huge pages to ask for (mode: %s)\n",
               modes[0] ? modes : "no such file");
        return 0;
    }
    size_t bytes = (size_t)8 << 20;
    unsigned char *p = attn_malloc_large(bytes);
    CHECK(p != NULL);
    if (p) {
        memset(p, 1, bytes);
        char flags[256] = "";
        CHECK(vm_flags_of(p + bytes / 2, flags, sizeof flags));
        CHECK(strstr(flags, " hg") != NULL);
        if (!strstr(flags, " hg")) fprintf(stderr, "VmFlags:%s", flags);
        attn_free(p);
    }
    return check_summary();
}
