/*
 * check.h — the smallest test harness that does the job: checks that count,
 * report file:line and the values, and a closing line ctest and CI can read.
 */
#ifndef ATTN_CHECK_H
#define ATTN_CHECK_H

#include <math.h>
#include <stdio.h>
#include <string.h>

static int check_passed, check_failed;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (cond) {                                                                  \
            check_passed++;                                                          \
        } else {                                                                     \
            check_failed++;                                                          \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                            \
    } while (0)

/* Compares two floats within an absolute tolerance, printing both. */
#define CHECK_NEAR(got, want, tol)                                                        \
    do {                                                                                  \
        double got_ = (got), want_ = (want);                                              \
        if (fabs(got_ - want_) <= (tol)) {                                                \
            check_passed++;                                                               \
        } else {                                                                          \
            check_failed++;                                                               \
            fprintf(stderr, "%s:%d: %s = %.9g, want %.9g (tol %g)\n", __FILE__, __LINE__, \
                    #got, got_, want_, (double)(tol));                                    \
        }                                                                                 \
    } while (0)

#define CHECK_STATUS(call, want)                                                           \
    do {                                                                                   \
        attn_status got_ = (call);                                                         \
        if (got_ == (want)) {                                                              \
            check_passed++;                                                                \
        } else {                                                                           \
            check_failed++;                                                                \
            fprintf(stderr, "%s:%d: %s returned %s, want %s\n", __FILE__, __LINE__, #call, \
                    attn_status_name(got_), attn_status_name(want));                       \
        }                                                                                  \
    } while (0)

/* The message in ctx contains every one of the given fragments. */
#define CHECK_MESSAGE(ctx, fragment)                                                        \
    do {                                                                                    \
        const char *msg_ = attn_ctx_last_error(ctx);                                        \
        if (strstr(msg_, (fragment))) {                                                     \
            check_passed++;                                                                 \
        } else {                                                                            \
            check_failed++;                                                                 \
            fprintf(stderr, "%s:%d: message \"%s\" lacks \"%s\"\n", __FILE__, __LINE__, msg_, \
                    (fragment));                                                            \
        }                                                                                   \
    } while (0)

/* The worse of a running largest error and a new one, NaN the worst of all
 * and kept: fmax would drop it, and a kernel that writes NaN would pass. */
static inline double check_worse(double worst, double e) {
    return worst != worst || e <= worst ? worst : e;
}

/* Prints the closing line and returns the process exit code. */
static inline int check_summary(void) {
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}

/* UNDER_ASAN: AddressSanitizer reserves terabytes of address space, so no
 * address-space limit (setrlimit RLIMIT_AS) fits a test under it. */
#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif

#endif /* ATTN_CHECK_H */
