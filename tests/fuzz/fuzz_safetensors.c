/* Fuzzes kvf_safetensors_open on a file holding the input, then walks the
 * tensors it accepted. */
#include <stdio.h>

#include "fuzz.h"
#include "kvf/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvf_fuzz_quiet();
    const char *dir = kvf_fuzz_write("model.safetensors", data, size);
    if (!dir)
        return 0;
    char path[160];
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    kvf_safetensors_t *st = NULL;
    if (kvf_safetensors_open(path, &st) != KVF_OK)
        return 0;
    size_t n = kvf_safetensors_count(st);
    for (size_t i = 0; i < n; i++) {
        const kvf_st_tensor_t *t = kvf_safetensors_tensor(st, i);
        (void)kvf_safetensors_find(st, t->name);
    }
    (void)kvf_safetensors_header_hash(st);
    kvf_safetensors_close(st);
    return 0;
}
