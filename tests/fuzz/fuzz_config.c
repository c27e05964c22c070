/* Fuzzes kvf_model_config_load on a directory whose config.json holds the
 * input, and validates what it accepted. */
#include "fuzz.h"
#include "kvf/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvf_fuzz_quiet();
    const char *dir = kvf_fuzz_write("config.json", data, size);
    if (!dir)
        return 0;
    kvf_model_config_t cfg;
    if (kvf_model_config_load(dir, &cfg) == KVF_OK)
        (void)kvf_model_config_validate(&cfg, "config.json");
    return 0;
}
