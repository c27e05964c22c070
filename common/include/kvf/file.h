/* Whole-file reads for the small JSON files of a model directory
 * (config.json, tokenizer.json, *.index.json). */
#ifndef KVF_FILE_H
#define KVF_FILE_H

#include <stddef.h>

#include "kvf/status.h"

/* Reads all of path. A missing file is KVF_ERR_NOT_FOUND and not logged
 * (callers decide whether that is an error); a file above max_bytes is
 * KVF_ERR_TOO_BIG; other failures are logged with the path. On success
 * *data_p is malloc'd, NUL-terminated (the NUL is not counted in *len_p)
 * and owned by the caller (free()). */
kvf_status_t kvf_file_read(const char *path, size_t max_bytes, char **data_p, size_t *len_p);

#endif
