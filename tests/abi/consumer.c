/*
 * consumer.c — the smallest program linked against a libattn: it prints
 * "attn <version> ok". Linked against this build it names libattn.so.0.<minor>
 * as NEEDED; linked against the previous minor's stand-in (other_library.c),
 * that minor's SONAME, which this build's library does not answer to
 * (test_soname.sh).
 */
#include <stdio.h>

const char *attn_version(void);

int main(void) {
    printf("attn %s ok\n", attn_version());
    return 0;
}
