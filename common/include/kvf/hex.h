/* Bytes as lowercase hexadecimal text: how a transfer descriptor travels
 * on a text line between two processes (kvf bench transfer and its
 * receiver, test_xfer and kvf_xfer_peer). */
#ifndef KVF_HEX_H
#define KVF_HEX_H

#include <stddef.h>
#include <stdint.h>

#include "kvf/status.h"

/* Writes the 2 * len hex digits of bytes[0..len) and a NUL into out, which
 * holds at least 2 * len + 1 characters. */
void kvf_hex_encode(const uint8_t *bytes, size_t len, char *out);

/* Decodes the n_digits hex digits at text (either case; n_digits even).
 * KVF_ERR_INVAL for an odd count or a character that is not a hex digit.
 * On success *bytes_p (n_digits / 2 bytes, *len_p) is malloc'd and owned
 * by the caller; nothing is set on failure. */
kvf_status_t kvf_hex_decode(const char *text, size_t n_digits, uint8_t **bytes_p, size_t *len_p);

#endif
