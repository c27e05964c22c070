/* Fuzzes kvf_tokenizer_load on a directory whose tokenizer.json holds the
 * input; a tokenizer that loads encodes and decodes a short text, then
 * encodes the input's own first bytes (whatever they are: the
 * normalizers, pre-tokenizers and added tokens of the file meet text
 * made of its own characters). */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "kvf/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvf_fuzz_quiet();
    const char *dir = kvf_fuzz_write("tokenizer.json", data, size);
    if (!dir)
        return 0;
    kvf_tokenizer_t *tok = NULL;
    if (kvf_tokenizer_load(dir, &tok) != KVF_OK)
        return 0;
    static const char text[] = "Hello, world! 123 \xc3\xa9\xff";
    uint32_t *ids = NULL;
    size_t n = 0;
    if (kvf_tokenizer_encode(tok, text, strlen(text), true, &ids, &n) == KVF_OK) {
        char *out = NULL;
        if (kvf_tokenizer_decode(tok, ids, n, &out, NULL) == KVF_OK)
            free(out);
        free(ids);
    }
    if (kvf_tokenizer_encode(tok, (const char *)data, size < 256 ? size : 256, false, &ids, &n) ==
        KVF_OK)
        free(ids);
    uint32_t odd[] = {0, 1, 7, 100000, UINT32_MAX};
    char *out = NULL;
    if (kvf_tokenizer_decode(tok, odd, sizeof(odd) / sizeof(odd[0]), &out, NULL) == KVF_OK)
        free(out);
    kvf_tokenizer_destroy(tok);
    return 0;
}
