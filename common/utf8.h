/* utf8.h: UTF-8 checks and repairs for text that came from outside.
 *
 * Anything a client sends (paths, query values, JSON strings, headers) may
 * be invalid UTF-8 or may be cut in the middle of a character by a length
 * limit. Text we hand to jansson must be valid UTF-8 (json_pack fails on
 * anything else), and text we show people should never end in half a
 * character. These functions follow RFC 3629 exactly as jansson does:
 * no overlong forms, no surrogates (U+D800..U+DFFF), nothing above
 * U+10FFFF. */
#ifndef FLASHSALE_UTF8_H
#define FLASHSALE_UTF8_H

#include <stddef.h>

/* Length in bytes of the valid UTF-8 character starting at s (at most n
 * bytes available), or 0 when the bytes there are not one. */
size_t utf8_char_len(const unsigned char *s, size_t n);

/* Whether s[0..n) is entirely valid UTF-8. */
int utf8_valid(const char *s, size_t n);

/* Copies src[0..n) into dst (cap bytes, cap >= 4), always NUL-terminated:
 * every invalid byte becomes U+FFFD, and when dst is too small the copy
 * stops on a character boundary and ends in "..." (three dots, so the
 * cut is visible). Returns the bytes written, excluding the NUL. */
size_t utf8_clean(char *dst, size_t cap, const char *src, size_t n);

/* The same for a NUL-terminated src; returns dst, for use in printf
 * arguments: utf8_clip(buf, sizeof buf, user_text). */
const char *utf8_clip(char *dst, size_t cap, const char *src);

#endif
