/* Fuzzes the transfer descriptor check (kvf_xfer_check_desc) against a
 * handle that holds only a configuration: the check reads nothing else,
 * so no backend is opened. Each input is tried as it is and with its
 * trailing CRC32C recomputed, to reach the checks past the checksum. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "kvf/crc32c.h"
#include "xfer_internal.h"

/* The geometry the committed seeds were exported with. */
static const kvf_xfer_config_t fuzz_cfg = {
    .backend = KVF_XFER_UCX,
    .mem_type = KVF_XFER_MEM_HOST,
    .pool_bytes = 4 * 16 * 2 * 2 * 2 * 8 * 4,
    .geometry = {.block_size = 16, .n_layers = 2, .n_kv_heads = 2, .head_dim = 8,
                 .dtype = KVF_XFER_DTYPE_F32, .layout = 1},
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvf_fuzz_quiet();
    kvf_xfer_t x;
    memset(&x, 0, sizeof(x));
    x.cfg = fuzz_cfg;
    (void)kvf_xfer_check_desc(&x, data, size);
    if (size < 4)
        return 0;
    uint8_t *d = malloc(size);
    if (!d)
        return 0;
    memcpy(d, data, size);
    xfer_put_u32(d + size - 4, kvf_crc32c(0, d, size - 4));
    (void)kvf_xfer_check_desc(&x, d, size);
    free(d);
    return 0;
}
