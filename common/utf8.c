/* utf8.c: UTF-8 validation and repair (see utf8.h). */
#include "common/utf8.h"

#include <assert.h>
#include <string.h>

size_t utf8_char_len(const unsigned char *s, size_t n) {
    if (n == 0) return 0;
    unsigned c = s[0];
    size_t len;
    unsigned min, cp;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) len = 2, min = 0x80, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, min = 0x800, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, min = 0x10000, cp = c & 0x07;
    else return 0;                       /* 0x80..0xC1 (continuation, overlong), 0xF5.. */
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

int utf8_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        size_t l = utf8_char_len(p + i, n - i);
        if (l == 0) return 0;
        i += l;
    }
    return 1;
}

size_t utf8_clean(char *dst, size_t cap, const char *src, size_t n) {
    static const char REPLACEMENT[] = "\xEF\xBF\xBD";
    const unsigned char *p = (const unsigned char *)src;
    size_t in = 0, out = 0;
    assert(cap >= 4);
    while (in < n) {
        size_t l = utf8_char_len(p + in, n - in);
        const char *piece = l ? src + in : REPLACEMENT;
        size_t plen = l ? l : 3;
        /* Keep room for "..." unless this piece is the last one. */
        size_t reserve = in + (l ? l : 1) < n ? 3 : 0;
        if (out + plen + reserve >= cap) {
            while (out + 3 >= cap) {         /* back off to a boundary that fits */
                do out--; while (out > 0 && ((unsigned char)dst[out] & 0xC0) == 0x80);
            }
            memcpy(dst + out, "...", 3);
            out += 3;
            break;
        }
        memcpy(dst + out, piece, plen);
        out += plen;
        in += l ? l : 1;
    }
    dst[out] = '\0';
    return out;
}

const char *utf8_clip(char *dst, size_t cap, const char *src) {
    utf8_clean(dst, cap, src, strlen(src));
    return dst;
}
