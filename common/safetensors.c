/* safetensors reader (mmap) and writer. See kvf/safetensors.h. */
#include "kvf/safetensors.h"
#include "kvf/hashmap.h"
#include "kvf/log.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* A header larger than this is refused: real headers are a few MB at most. */
#define KVF_ST_MAX_HEADER (256u << 20)

/* A tensor and its place in the by-name map. */
typedef struct {
    kvf_st_tensor_t tensor;
    UT_hash_handle hh; /* keyed by tensor.name */
} st_entry_t;

struct kvf_safetensors {
    char *path;
    void *map;          /* the whole file, read-only */
    size_t map_bytes;
    size_t header_len;  /* JSON bytes after the 8-byte length */
    uint64_t header_hash;
    st_entry_t *entries; /* (n_tensors) */
    size_t n_tensors;
    st_entry_t *by_name; /* map head: name -> entry */
    char *names;        /* one allocation holding every tensor name */
};

uint64_t kvf_fnv64(uint64_t hash, const void *bytes, size_t len)
{
    const uint8_t *p = bytes;
    for (size_t i = 0; i < len; i++) {
        hash ^= p[i];
        hash *= 0x100000001b3ull;
    }
    return hash;
}

static kvf_dtype_t dtype_from_header(const char *s)
{
    if (!strcmp(s, "F32"))
        return KVF_DTYPE_F32;
    if (!strcmp(s, "F16"))
        return KVF_DTYPE_F16;
    if (!strcmp(s, "BF16"))
        return KVF_DTYPE_BF16;
    return KVF_DTYPE_UNKNOWN;
}

static const char *dtype_to_header(kvf_dtype_t d)
{
    switch (d) {
    case KVF_DTYPE_F32: return "F32";
    case KVF_DTYPE_F16: return "F16";
    case KVF_DTYPE_BF16: return "BF16";
    case KVF_DTYPE_UNKNOWN: break;
    }
    return NULL;
}

/* Element size of a header dtype string, including types we only skip over,
 * so that their byte ranges can still be validated. 0 if unknown. */
static size_t header_dtype_size(const char *s)
{
    static const struct {
        const char *name;
        size_t size;
    } sizes[] = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4},
                 {"I16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"U16", 2}, {"U32", 4},
                 {"U64", 8}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        if (!strcmp(s, sizes[i].name))
            return sizes[i].size;
    return 0;
}

/* Reads a JSON number that must be a non-negative integer below 2^53. */
static int json_u64(const cJSON *item, uint64_t *v_p)
{
    if (!cJSON_IsNumber(item))
        return -1;
    double d = item->valuedouble;
    if (!(d >= 0) || d > 9007199254740992.0 || d != (double)(uint64_t)d)
        return -1;
    *v_p = (uint64_t)d;
    return 0;
}

/* Validates one header entry and fills t (name set by the caller). */
static kvf_status_t parse_entry(const char *path, const cJSON *entry, size_t data_bytes,
                                const uint8_t *data, kvf_st_tensor_t *t)
{
    const char *name = entry->string;
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(entry, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(entry, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(entry, "data_offsets");
    if (!cJSON_IsObject(entry) || !cJSON_IsString(dtype) || !cJSON_IsArray(shape) ||
        !cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2) {
        kvf_log_error("%s: tensor %s: header entry lacks dtype, shape or data_offsets", path,
                      name);
        return KVF_ERR_FORMAT;
    }
    size_t esize = header_dtype_size(dtype->valuestring);
    if (esize == 0) {
        kvf_log_error("%s: tensor %s: unknown dtype '%s'", path, name, dtype->valuestring);
        return KVF_ERR_FORMAT;
    }
    snprintf(t->dtype_name, sizeof(t->dtype_name), "%s", dtype->valuestring);
    t->dtype = dtype_from_header(dtype->valuestring);
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > KVF_ST_MAX_DIMS) {
        kvf_log_error("%s: tensor %s: %d dimensions (at most %d)", path, name, ndim,
                      KVF_ST_MAX_DIMS);
        return KVF_ERR_FORMAT;
    }
    t->ndim = ndim;
    uint64_t count = 1;
    for (int i = 0; i < ndim; i++) {
        uint64_t d;
        if (json_u64(cJSON_GetArrayItem(shape, i), &d) != 0 || d > (1ull << 40)) {
            kvf_log_error("%s: tensor %s: bad shape entry %d", path, name, i);
            return KVF_ERR_FORMAT;
        }
        t->shape[i] = (int64_t)d;
        if (d != 0 && count > (1ull << 48) / d) {
            kvf_log_error("%s: tensor %s: shape too large", path, name);
            return KVF_ERR_FORMAT;
        }
        count *= d;
    }
    uint64_t begin, end;
    if (json_u64(cJSON_GetArrayItem(offs, 0), &begin) != 0 ||
        json_u64(cJSON_GetArrayItem(offs, 1), &end) != 0 || begin > end) {
        kvf_log_error("%s: tensor %s: bad data_offsets", path, name);
        return KVF_ERR_FORMAT;
    }
    if (end > data_bytes) {
        kvf_log_error("%s: tensor %s: data [%llu, %llu) beyond the end of the file "
                      "(%zu data bytes): truncated?",
                      path, name, (unsigned long long)begin, (unsigned long long)end,
                      data_bytes);
        return KVF_ERR_FORMAT;
    }
    if (end - begin != count * esize) {
        kvf_log_error("%s: tensor %s: %llu data bytes for %llu elements of %s", path, name,
                      (unsigned long long)(end - begin), (unsigned long long)count,
                      dtype->valuestring);
        return KVF_ERR_FORMAT;
    }
    t->data = data + begin;
    t->nbytes = (size_t)(end - begin);
    return KVF_OK;
}

/* Maps path read-only into f (map, map_bytes). */
static kvf_status_t map_file(kvf_safetensors_t *f, const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        kvf_status_t st = errno == ENOENT ? KVF_ERR_NOT_FOUND : KVF_ERR_IO;
        kvf_log_error("%s: open failed: %m", path);
        return st;
    }
    kvf_status_t st = KVF_OK;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        kvf_log_error("%s: stat failed: %m", path);
        st = KVF_ERR_IO;
    } else if (sb.st_size < 8) {
        kvf_log_error("%s: %lld bytes, too short for a safetensors header", path,
                      (long long)sb.st_size);
        st = KVF_ERR_FORMAT;
    } else {
        f->map_bytes = (size_t)sb.st_size;
        f->map = mmap(NULL, f->map_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
        if (f->map == MAP_FAILED) {
            f->map = NULL;
            kvf_log_error("%s: mmap failed: %m", path);
            st = KVF_ERR_IO;
        }
    }
    close(fd);
    return st;
}

/* The header of the mapped file: its length, hash and JSON (*root_p owned
 * by the caller, cJSON_Delete). */
static kvf_status_t parse_header(kvf_safetensors_t *f, const char *path, cJSON **root_p)
{
    const uint8_t *bytes = f->map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | bytes[i];
    if (hlen > KVF_ST_MAX_HEADER || hlen > f->map_bytes - 8) {
        kvf_log_error("%s: header length %llu does not fit the file (%zu bytes): truncated or "
                      "not safetensors",
                      path, (unsigned long long)hlen, f->map_bytes);
        return KVF_ERR_FORMAT;
    }
    f->header_len = (size_t)hlen;
    f->header_hash = kvf_fnv64(KVF_FNV64_INIT, bytes + 8, f->header_len);
    cJSON *root = cJSON_ParseWithLength((const char *)bytes + 8, f->header_len);
    if (!cJSON_IsObject(root)) {
        kvf_log_error("%s: header is not a JSON object", path);
        cJSON_Delete(root);
        return KVF_ERR_FORMAT;
    }
    *root_p = root;
    return KVF_OK;
}

/* Every tensor entry of the header (all but __metadata__), validated,
 * with its name copied and in the by-name map. */
static kvf_status_t read_entries(kvf_safetensors_t *f, const char *path, const cJSON *root)
{
    size_t n = 0, name_bytes = 0;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (!strcmp(e->string, "__metadata__"))
            continue;
        n++;
        name_bytes += strlen(e->string) + 1;
    }
    f->entries = calloc(n ? n : 1, sizeof(*f->entries));
    f->names = malloc(name_bytes ? name_bytes : 1);
    if (!f->entries || !f->names)
        return KVF_ERR_NOMEM;
    const uint8_t *data = (const uint8_t *)f->map + 8 + f->header_len;
    size_t data_bytes = f->map_bytes - 8 - f->header_len;
    char *np = f->names;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (!strcmp(e->string, "__metadata__"))
            continue;
        st_entry_t *entry = &f->entries[f->n_tensors];
        kvf_st_tensor_t *t = &entry->tensor;
        kvf_status_t st = parse_entry(path, e, data_bytes, data, t);
        if (st != KVF_OK)
            return st;
        size_t len = strlen(e->string) + 1;
        memcpy(np, e->string, len);
        t->name = np;
        np += len;
        f->n_tensors++;
        /* A name the header repeats: the first entry is the one found. */
        if (kvf_safetensors_find(f, t->name))
            continue;
        KVF_HASH_ADD_KEYPTR(f->by_name, t->name, len - 1, entry, st);
        if (st != KVF_OK)
            return st;
    }
    return KVF_OK;
}

kvf_status_t kvf_safetensors_open(const char *path, kvf_safetensors_t **st_p)
{
    kvf_safetensors_t *f = calloc(1, sizeof(*f));
    if (!f)
        return KVF_ERR_NOMEM;
    f->path = strdup(path);
    kvf_status_t st = f->path ? map_file(f, path) : KVF_ERR_NOMEM;
    if (st != KVF_OK)
        goto fail_open;
    cJSON *root;
    st = parse_header(f, path, &root);
    if (st != KVF_OK)
        goto fail_open;
    st = read_entries(f, path, root);
    cJSON_Delete(root);
    if (st != KVF_OK)
        goto fail_open;
    *st_p = f;
    return KVF_OK;

fail_open:
    kvf_safetensors_close(f);
    return st;
}

void kvf_safetensors_close(kvf_safetensors_t *st)
{
    if (!st)
        return;
    if (st->map)
        munmap(st->map, st->map_bytes);
    HASH_CLEAR(hh, st->by_name);
    free(st->entries);
    free(st->names);
    free(st->path);
    free(st);
}

const kvf_st_tensor_t *kvf_safetensors_find(const kvf_safetensors_t *st, const char *name)
{
    const st_entry_t *e;
    HASH_FIND(hh, st->by_name, name, strlen(name), e);
    return e ? &e->tensor : NULL;
}

size_t kvf_safetensors_count(const kvf_safetensors_t *st)
{
    return st->n_tensors;
}

const kvf_st_tensor_t *kvf_safetensors_tensor(const kvf_safetensors_t *st, size_t i)
{
    return i < st->n_tensors ? &st->entries[i].tensor : NULL;
}

const char *kvf_safetensors_path(const kvf_safetensors_t *st)
{
    return st->path;
}

uint64_t kvf_safetensors_header_hash(const kvf_safetensors_t *st)
{
    return st->header_hash;
}

kvf_status_t kvf_safetensors_write(const char *path, const kvf_st_write_t *tensors, size_t n)
{
    kvf_status_t st = KVF_OK;
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return KVF_ERR_NOMEM;
    uint64_t offset = 0;
    for (size_t i = 0; i < n; i++) {
        const kvf_st_write_t *t = &tensors[i];
        const char *dname = dtype_to_header(t->dtype);
        if (!dname || t->ndim < 0 || t->ndim > KVF_ST_MAX_DIMS) {
            kvf_log_error("%s: tensor %s: cannot write dtype %s", path, t->name,
                          kvf_dtype_name(t->dtype));
            st = KVF_ERR_INVAL;
            goto fail_header;
        }
        uint64_t count = 1;
        cJSON *entry = cJSON_AddObjectToObject(root, t->name);
        cJSON *shape = entry ? cJSON_AddArrayToObject(entry, "shape") : NULL;
        cJSON *offs = entry ? cJSON_AddArrayToObject(entry, "data_offsets") : NULL;
        if (!shape || !offs || !cJSON_AddStringToObject(entry, "dtype", dname)) {
            st = KVF_ERR_NOMEM;
            goto fail_header;
        }
        for (int d = 0; d < t->ndim; d++) {
            count *= (uint64_t)t->shape[d];
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
        }
        uint64_t bytes = count * kvf_dtype_size(t->dtype);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)offset));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(offset + bytes)));
        offset += bytes;
    }
    char *json = cJSON_PrintUnformatted(root);
    if (!json) {
        st = KVF_ERR_NOMEM;
        goto fail_header;
    }
    /* Pad the header with spaces to a multiple of 8 so data is aligned. */
    size_t jlen = strlen(json);
    size_t hlen = (jlen + 7) & ~(size_t)7;
    FILE *fp = fopen(path, "wb");
    if (!fp) {
        kvf_log_error("%s: cannot create: %m", path);
        st = KVF_ERR_IO;
        goto fail_open;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    int ok = fwrite(len8, 1, 8, fp) == 8 && fwrite(json, 1, jlen, fp) == jlen;
    for (size_t i = jlen; ok && i < hlen; i++)
        ok = fputc(' ', fp) != EOF;
    for (size_t i = 0; ok && i < n; i++) {
        const kvf_st_write_t *t = &tensors[i];
        size_t count = 1;
        for (int d = 0; d < t->ndim; d++)
            count *= (size_t)t->shape[d];
        size_t bytes = count * kvf_dtype_size(t->dtype);
        ok = fwrite(t->data, 1, bytes, fp) == bytes;
    }
    if (fclose(fp) != 0)
        ok = 0;
    if (!ok) {
        kvf_log_error("%s: write failed: %m", path);
        st = KVF_ERR_IO;
    }
fail_open:
    free(json);
fail_header:
    cJSON_Delete(root);
    return st;
}
