#include "kvf/file.h"

#include "kvf/array.h"
#include "kvf/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kvf_status_t kvf_file_read(const char *path, size_t max_bytes, char **data_p, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        int err = errno;
        if (err == ENOENT)
            return KVF_ERR_NOT_FOUND;
        kvf_log_error("%s: cannot open: %s", path, strerror(err));
        return kvf_status_from_errno(err);
    }
    kvf_status_t st = KVF_OK;
    char *data = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            if (len > max_bytes) {
                kvf_log_error("%s: larger than %zu bytes", path, max_bytes);
                st = KVF_ERR_TOO_BIG;
                goto fail_read;
            }
            /* cap bytes of the file, then its NUL */
            cap = kvf_array_grow_cap(cap, cap + 1, 65536);
            if ((st = kvf_array_resize(&data, cap + 1, 1)) != KVF_OK)
                goto fail_read;
        }
        size_t got = fread(data + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) {
                kvf_log_error("%s: read failed: %s", path, strerror(errno));
                st = KVF_ERR_IO;
                goto fail_read;
            }
            break;
        }
    }
    if (len > max_bytes) {
        kvf_log_error("%s: larger than %zu bytes", path, max_bytes);
        st = KVF_ERR_TOO_BIG;
        goto fail_read;
    }
    fclose(f);
    data[len] = '\0';
    *data_p = data;
    *len_p = len;
    return KVF_OK;
fail_read:
    free(data);
    fclose(f);
    return st;
}
