#include "kvf/utf8.h"

int kvf_utf8_next(const uint8_t *s, size_t n, uint32_t *cp_p)
{
    uint8_t b0 = s[0];
    if (b0 < 0x80) {
        if (cp_p)
            *cp_p = b0;
        return 1;
    }
    int len;
    uint8_t lo = 0x80, hi = 0xbf; /* allowed range of the second byte */
    uint32_t cp;
    if (b0 >= 0xc2 && b0 <= 0xdf) {
        len = 2;
        cp = b0 & 0x1f;
    } else if (b0 >= 0xe0 && b0 <= 0xef) {
        len = 3;
        cp = b0 & 0x0f;
        if (b0 == 0xe0)
            lo = 0xa0; /* no overlong forms */
        else if (b0 == 0xed)
            hi = 0x9f; /* no surrogates */
    } else if (b0 >= 0xf0 && b0 <= 0xf4) {
        len = 4;
        cp = b0 & 0x07;
        if (b0 == 0xf0)
            lo = 0x90;
        else if (b0 == 0xf4)
            hi = 0x8f; /* nothing above U+10FFFF */
    } else {
        return -1;
    }
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n)
            return 0;
        uint8_t b = s[i];
        if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xbf))
            return -i;
        cp = (cp << 6) | (b & 0x3f);
    }
    if (cp_p)
        *cp_p = cp;
    return len;
}

size_t kvf_utf8_encode(uint32_t cp, uint8_t out[4])
{
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xc0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp >= 0xd800 && cp <= 0xdfff)
        return 0;
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xe0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (uint8_t)(0x80 | (cp & 0x3f));
        return 3;
    }
    if (cp < 0x110000) {
        out[0] = (uint8_t)(0xf0 | (cp >> 18));
        out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3f));
        out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
        out[3] = (uint8_t)(0x80 | (cp & 0x3f));
        return 4;
    }
    return 0;
}

size_t kvf_utf8_valid_prefix(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int k = kvf_utf8_next(s + i, n - i, NULL);
        if (k <= 0)
            break;
        i += (size_t)k;
    }
    return i;
}
