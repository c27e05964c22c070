/* Reading and writing safetensors files.
 *
 * Format: a u64 little-endian header length N, N bytes of JSON
 * {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
 * then raw little-endian tensor data; offsets are relative to the end of the
 * header. A file is mapped read-only (mmap); tensor data pointers point into
 * the mapping and stay valid until kvf_safetensors_close(). Every header
 * entry is validated against the file size when the file is opened, so a
 * truncated or malformed file is an error there, never a fault later. */
#ifndef KVF_SAFETENSORS_H
#define KVF_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "kvf/dtype.h"
#include "kvf/status.h"

#define KVF_ST_MAX_DIMS 8

typedef struct {
    const char *name;      /* owned by the file handle */
    kvf_dtype_t dtype;     /* KVF_DTYPE_UNKNOWN for types we do not read */
    char dtype_name[16];   /* as written in the header ("F32", "I64", ...) */
    int ndim;
    int64_t shape[KVF_ST_MAX_DIMS];
    const void *data;      /* into the mapping; nbytes long */
    size_t nbytes;
} kvf_st_tensor_t;

typedef struct kvf_safetensors kvf_safetensors_t;

/* Maps and validates path. Errors (KVF_ERR_IO, KVF_ERR_FORMAT) are logged
 * with the file name and the offending tensor. On success *st_p is owned by
 * the caller, who closes it with kvf_safetensors_close(). */
kvf_status_t kvf_safetensors_open(const char *path, kvf_safetensors_t **st_p);

/* Unmaps the file; NULL is a no-op. Tensor pointers die with it. */
void kvf_safetensors_close(kvf_safetensors_t *st);

/* The tensor called name, or NULL. Owned by st. */
const kvf_st_tensor_t *kvf_safetensors_find(const kvf_safetensors_t *st, const char *name);

/* Number of tensors and the i-th (header order is not preserved). */
size_t kvf_safetensors_count(const kvf_safetensors_t *st);
const kvf_st_tensor_t *kvf_safetensors_tensor(const kvf_safetensors_t *st, size_t i);

/* The path given to open (owned by st). */
const char *kvf_safetensors_path(const kvf_safetensors_t *st);

/* 64-bit FNV-1a hash of the JSON header bytes (names, dtypes, shapes,
 * offsets): equal files have equal hashes. */
uint64_t kvf_safetensors_header_hash(const kvf_safetensors_t *st);

/* One tensor to write: data is n elements of dtype in little-endian order,
 * n = product of shape. Borrowed for the duration of the call. */
typedef struct {
    const char *name;
    kvf_dtype_t dtype;
    int ndim;
    int64_t shape[KVF_ST_MAX_DIMS];
    const void *data;
} kvf_st_write_t;

/* Writes n tensors to path (replacing it) in the order given. */
kvf_status_t kvf_safetensors_write(const char *path, const kvf_st_write_t *tensors, size_t n);

/* 64-bit FNV-1a over len bytes, continuing from hash (start with
 * KVF_FNV64_INIT). Used for model fingerprints. */
#define KVF_FNV64_INIT 0xcbf29ce484222325ull
uint64_t kvf_fnv64(uint64_t hash, const void *bytes, size_t len);

#endif
