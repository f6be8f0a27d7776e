/*
 * address_space.h — for tests that bound a call's memory with RLIMIT_AS:
 * the address space the process maps already, which the limit counts
 * too. Linux only, and not under ASan (whose shadow maps terabytes). The
 * includer defines _POSIX_C_SOURCE (sysconf).
 */
#ifndef ATTN_TEST_ADDRESS_SPACE_H
#define ATTN_TEST_ADDRESS_SPACE_H

#include "check.h" /* UNDER_ASAN */

#if defined(__linux__) && !defined(UNDER_ASAN)
#include <stdio.h>
#include <unistd.h>

/* Bytes of address space this process maps now (/proc/self/statm), or 0. */
static size_t mapped_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    if (f) {
        if (fscanf(f, "%lu", &pages) != 1) pages = 0;
        fclose(f);
    }
    long page = sysconf(_SC_PAGESIZE);
    return (size_t)pages * (size_t)(page > 0 ? page : 4096);
}
#endif

#endif /* ATTN_TEST_ADDRESS_SPACE_H */
