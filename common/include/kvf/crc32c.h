/* CRC32C (Castagnoli), used to frame control messages, to check KV slices
 * end to end and the blocks of the KV tiers (kvf/kv_tier.h). Uses the
 * CPU's CRC32C instructions where it has them (x86 SSE4.2; ARMv8 CRC,
 * detected at run time unless the build targets it), a table otherwise;
 * every path gives the same values (tests/unit/test_common.c). */
#ifndef KVF_CRC32C_H
#define KVF_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extends crc (0 to start) over len bytes of data. */
uint32_t kvf_crc32c(uint32_t crc, const void *data, size_t len);

/* kvf_crc32c on the table path whatever the CPU: the reference the
 * instruction paths are tested against. */
uint32_t kvf_crc32c_table(uint32_t crc, const void *data, size_t len);

/* Which path kvf_crc32c takes here: "sse4.2", "armv8-crc" or "table". */
const char *kvf_crc32c_impl(void);

#endif
