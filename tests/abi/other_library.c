/*
 * other_library.c — stands in for libattn of another 0.x minor in the ABI
 * tests (tests/CMakeLists.txt builds it with that minor's SONAME). As the
 * previous minor it exports attn_version alone, as releases before
 * attn_abi_version did; as the next minor (ATTN_OTHER_ABI defined) it
 * exports attn_abi_version too, returning that minor's ABI version.
 */
const char *attn_version(void);
const char *attn_version(void) { return ATTN_OTHER_VERSION; }

#ifdef ATTN_OTHER_ABI
int attn_abi_version(void);
int attn_abi_version(void) { return ATTN_OTHER_ABI; }
#endif
