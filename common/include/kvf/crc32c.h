/* CRC32C (Castagnoli), used to frame control messages and, optionally, to
 * check KV slices end to end. Uses the SSE4.2 instruction when the CPU has
 * it, a table otherwise; both give the same values. */
#ifndef KVF_CRC32C_H
#define KVF_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extends crc (0 to start) over len bytes of data. */
uint32_t kvf_crc32c(uint32_t crc, const void *data, size_t len);

#endif
