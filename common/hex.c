/* Hexadecimal text of bytes. See kvf/hex.h. */
#include "kvf/hex.h"

#include <stdlib.h>

static int digit_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

void kvf_hex_encode(const uint8_t *bytes, size_t len, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < len; i++) {
        out[2 * i] = digits[bytes[i] >> 4];
        out[2 * i + 1] = digits[bytes[i] & 15];
    }
    out[2 * len] = '\0';
}

kvf_status_t kvf_hex_decode(const char *text, size_t n_digits, uint8_t **bytes_p, size_t *len_p)
{
    if (n_digits % 2)
        return KVF_ERR_INVAL;
    size_t len = n_digits / 2;
    uint8_t *bytes = malloc(len ? len : 1);
    if (!bytes)
        return KVF_ERR_NOMEM;
    for (size_t i = 0; i < len; i++) {
        int hi = digit_value(text[2 * i]), lo = digit_value(text[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            free(bytes);
            return KVF_ERR_INVAL;
        }
        bytes[i] = (uint8_t)(hi << 4 | lo);
    }
    *bytes_p = bytes;
    *len_p = len;
    return KVF_OK;
}
