/* utf8.c — see utf8.h. */
#include "utf8.h"

size_t attn_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned char b = s[0];
    *cp = 0;
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    size_t len;
    uint32_t c, min;
    if (b >= 0xc2 && b <= 0xdf) len = 2, c = b & 0x1fu, min = 0x80;
    else if (b >= 0xe0 && b <= 0xef) len = 3, c = b & 0x0fu, min = 0x800;
    else if (b >= 0xf0 && b <= 0xf4) len = 4, c = b & 0x07u, min = 0x10000;
    else return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        c = c << 6 | (s[i] & 0x3fu);
    }
    if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) return 0;
    *cp = c;
    return len;
}

size_t attn_utf8_encode(uint32_t cp, unsigned char out[4]) {
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xc0 | (cp >> 6));
        out[1] = (unsigned char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xe0 | (cp >> 12));
        out[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (unsigned char)(0xf0 | (cp >> 18));
    out[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

size_t attn_utf8_invalid_at(const unsigned char *s, size_t n) {
    uint32_t cp;
    for (size_t i = 0; i < n;) {
        size_t len = attn_utf8_decode(s + i, n - i, &cp);
        if (!len) return i;
        i += len;
    }
    return n;
}
