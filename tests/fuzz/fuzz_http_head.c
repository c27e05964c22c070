/* Fuzzes kvf_http__classify_head (router/http_head.c), which reads the
 * first bytes of every HTTP connection before libmicrohttpd does. Beyond
 * not crashing: a head it passes has ended (an empty line), and a refusal
 * carries one of the statuses the gate answers with. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "http_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvf_fuzz_quiet();
    if (size > HTTP_GATE_PEEK)
        size = HTTP_GATE_PEEK; /* the gate never looks at more */
    char *buf = malloc(size ? size : 1); /* exactly size bytes: ASan sees any overread */
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    kvf_openai_error_t err;
    switch (kvf_http__classify_head(buf, size, &err)) {
    case KVF_HTTP_HEAD_PASS:
        if (!memmem(buf, size, "\n\n", 2) && !memmem(buf, size, "\n\r\n", 3))
            abort();
        break;
    case KVF_HTTP_HEAD_REFUSE:
        if (err.code != 400 && err.code != 413 && err.code != 414 && err.code != 431 &&
            err.code != 505)
            abort();
        break;
    case KVF_HTTP_HEAD_MORE:
        break;
    }
    free(buf);
    return 0;
}
