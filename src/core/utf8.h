/*
 * utf8.h — the library's one reading and writing of UTF-8, strict as
 * Python's decoder: no overlong forms, no surrogates (U+D800..U+DFFF), no
 * code points past U+10FFFF. The JSON reader and writers, the tokenizer,
 * the text split and the messages' escaping all read text through it, so
 * that they agree on what is a character.
 */
#ifndef ATTN_CORE_UTF8_H
#define ATTN_CORE_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* The length (1 to 4) of the well-formed character at s, of the n > 0 bytes
 * there, its code point in *cp; 0 when s[0] starts none (*cp then 0). */
size_t attn_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);

/* The UTF-8 of code point cp (at most U+10FFFF) into out; its length. */
size_t attn_utf8_encode(uint32_t cp, unsigned char out[4]);

/* The offset of the first byte of s[0, n) that starts no well-formed
 * character, or n when all of it is UTF-8. */
size_t attn_utf8_invalid_at(const unsigned char *s, size_t n);

#endif
