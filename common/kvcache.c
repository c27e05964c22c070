/* Paged KV pool and allocator. See kvf/kvcache.h. */
#include "kvf/kvcache.h"
#include "kvf/array.h"
#include "kvf/log.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>

struct kvf_kvpool {
    kvf_kv_geometry_t geo;
    uint8_t *base; /* (num_blocks, block_bytes), 64-byte aligned */
    size_t bytes;
    size_t block_bytes;
    size_t slice_bytes;
    uint32_t num_blocks;
    uint32_t *free_list; /* (num_blocks) stack of free ids; top at n_free - 1 */
    uint32_t n_free;
    uint32_t *refcount;      /* (num_blocks) 0 = free */
    kvf_kvpool_memory_t mem; /* device pool: the mirror is base; zeroed for a host pool */
};

size_t kvf_kv_slice_bytes(const kvf_kv_geometry_t *g)
{
    return 2 * (size_t)g->n_kv_heads * (size_t)g->block_size *
           kvf_kv_row_bytes(g->dtype, g->head_dim);
}

size_t kvf_kv_block_bytes(const kvf_kv_geometry_t *g)
{
    return kvf_kv_slice_bytes(g) * (size_t)g->n_layers;
}

size_t kvf_kv_bytes_per_token(const kvf_kv_geometry_t *g)
{
    return 2 * (size_t)g->n_layers * (size_t)g->n_kv_heads *
           kvf_kv_row_bytes(g->dtype, g->head_dim);
}

uint32_t kvf_kv_blocks_for_tokens(const kvf_kv_geometry_t *g, uint32_t n_tokens)
{
    return (uint32_t)(((uint64_t)n_tokens + (uint64_t)g->block_size - 1) / (uint64_t)g->block_size);
}

kvf_status_t kvf_kv_geometry_validate(const kvf_kv_geometry_t *g)
{
    if (g->n_layers <= 0 || g->n_kv_heads <= 0 || g->head_dim <= 0 || g->block_size < 1 ||
        g->block_size > KVF_KV_BLOCK_SIZE_MAX || g->n_layers > 4096 || g->n_kv_heads > 4096 ||
        g->head_dim > 4096) {
        kvf_log_error("kv geometry out of range: layers %d, kv heads %d, head dim %d, block "
                      "size %d (1..%d)",
                      g->n_layers, g->n_kv_heads, g->head_dim, g->block_size,
                      KVF_KV_BLOCK_SIZE_MAX);
        return KVF_ERR_INVAL;
    }
    if ((unsigned)g->dtype >= KVF_KV_N_DTYPES) {
        kvf_log_error("kv dtype %d is not a KV format", (int)g->dtype);
        return KVF_ERR_UNSUPPORTED;
    }
    /* the scales after the data stay 4-byte aligned */
    if (kvf_kv_scaled(g->dtype) && g->head_dim % 4) {
        kvf_log_error("kv dtype %s needs a head dim that is a multiple of 4, not %d",
                      kvf_kv_dtype_name(g->dtype), g->head_dim);
        return KVF_ERR_UNSUPPORTED;
    }
    return KVF_OK;
}

/* A pool of num_blocks blocks: in host memory it allocates, or over mem
 * (owned by the caller until this succeeds). */
/* A host pool's memory. Attention reads every block of a sequence, each
 * in its own place: on 4 KiB pages that is a TLB miss per block and head,
 * which costs more than the read. A pool of at least one huge page is
 * aligned to it and asks for transparent huge pages (a hint: where the
 * kernel gives none, the pool works the same on small pages). */
#define POOL_HUGE_PAGE ((size_t)2 << 20)
static void *pool_alloc(size_t bytes)
{
    if (bytes < POOL_HUGE_PAGE)
        return aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    const size_t rounded = (bytes + POOL_HUGE_PAGE - 1) & ~(POOL_HUGE_PAGE - 1);
    void *base = aligned_alloc(POOL_HUGE_PAGE, rounded);
#if defined(MADV_HUGEPAGE)
    if (base)
        (void)madvise(base, rounded, MADV_HUGEPAGE);
#endif
    return base;
}

static kvf_status_t pool_create(const kvf_kv_geometry_t *geo, uint32_t num_blocks,
                                const kvf_kvpool_memory_t *mem, kvf_kvpool_t **pool_p)
{
    kvf_status_t st = kvf_kv_geometry_validate(geo);
    if (st != KVF_OK)
        return st;
    if (num_blocks == 0)
        return KVF_ERR_INVAL;
    kvf_kvpool_t *p = calloc(1, sizeof(*p));
    if (!p)
        return KVF_ERR_NOMEM;
    p->geo = *geo;
    p->slice_bytes = kvf_kv_slice_bytes(geo);
    p->block_bytes = kvf_kv_block_bytes(geo);
    p->num_blocks = num_blocks;
    if (p->block_bytes > SIZE_MAX / num_blocks) {
        st = KVF_ERR_TOO_BIG;
        goto fail_base;
    }
    p->bytes = p->block_bytes * num_blocks;
    if (mem) {
        if (!mem->device_base || !mem->upload || !mem->release) {
            st = KVF_ERR_INVAL;
            goto fail_base;
        }
        p->mem = *mem;
        p->base = mem->host_base;
    } else {
        p->base = pool_alloc(p->bytes);
        if (!p->base) {
            kvf_log_error("kv pool: cannot allocate %zu bytes (%u blocks)", p->bytes, num_blocks);
            st = KVF_ERR_NOMEM;
            goto fail_base;
        }
        memset(p->base, 0, p->bytes);
    }
    p->free_list = malloc(num_blocks * sizeof(uint32_t));
    p->refcount = calloc(num_blocks, sizeof(uint32_t));
    if (!p->free_list || !p->refcount) {
        st = KVF_ERR_NOMEM;
        goto fail_lists;
    }
    /* Stack with block 0 on top, so allocation hands out low ids first. */
    for (uint32_t i = 0; i < num_blocks; i++)
        p->free_list[i] = num_blocks - 1 - i;
    p->n_free = num_blocks;
    *pool_p = p;
    return KVF_OK;

fail_lists:
    free(p->free_list);
    free(p->refcount);
    if (!mem)
        free(p->base);
fail_base:
    free(p);
    return st;
}

kvf_status_t kvf_kvpool_create(const kvf_kv_geometry_t *geo, uint32_t num_blocks,
                               kvf_kvpool_t **pool_p)
{
    return pool_create(geo, num_blocks, NULL, pool_p);
}

kvf_status_t kvf_kvpool_create_on(const kvf_kv_geometry_t *geo, uint32_t num_blocks,
                                  const kvf_kvpool_memory_t *mem, kvf_kvpool_t **pool_p)
{
    if (!mem)
        return KVF_ERR_INVAL;
    return pool_create(geo, num_blocks, mem, pool_p);
}

kvf_status_t kvf_kvpool_create_budget(const kvf_kv_geometry_t *geo, uint64_t budget_bytes,
                                      kvf_kvpool_t **pool_p)
{
    kvf_status_t st = kvf_kv_geometry_validate(geo);
    if (st != KVF_OK)
        return st;
    uint64_t n = budget_bytes / kvf_kv_block_bytes(geo);
    if (n == 0) {
        kvf_log_error("kv pool: a budget of %llu bytes holds no block of %zu bytes",
                      (unsigned long long)budget_bytes, kvf_kv_block_bytes(geo));
        return KVF_ERR_NO_SPACE;
    }
    if (n > UINT32_MAX - 1)
        n = UINT32_MAX - 1;
    return kvf_kvpool_create(geo, (uint32_t)n, pool_p);
}

void kvf_kvpool_destroy(kvf_kvpool_t *pool)
{
    if (!pool)
        return;
    free(pool->free_list);
    free(pool->refcount);
    if (pool->mem.release)
        pool->mem.release(pool->mem.arg);
    else
        free(pool->base);
    free(pool);
}

void *kvf_kvpool_device_base(const kvf_kvpool_t *pool)
{
    return pool->mem.device_base;
}

typedef kvf_status_t (*pool_copy_fn)(void *arg, size_t off, size_t bytes);

/* Copies blocks ids[0..n) with copy, one call per run of consecutive ids. */
static kvf_status_t upload_with(kvf_kvpool_t *pool, const uint32_t *ids, uint32_t n,
                                pool_copy_fn copy)
{
    if (!copy)
        return KVF_OK;
    if (!pool->base)
        return KVF_ERR_INVAL; /* no host memory to upload from */
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] >= pool->num_blocks)
            return KVF_ERR_INVAL;
    /* Runs of consecutive ids are one contiguous copy (a block holds every
     * layer). */
    for (uint32_t i = 0; i < n;) {
        uint32_t j = i + 1;
        while (j < n && ids[j] == ids[j - 1] + 1)
            j++;
        kvf_status_t st = copy(pool->mem.arg, (size_t)ids[i] * pool->block_bytes,
                               (size_t)(j - i) * pool->block_bytes);
        if (st != KVF_OK)
            return st;
        i = j;
    }
    return KVF_OK;
}

kvf_status_t kvf_kvpool_upload(kvf_kvpool_t *pool, const uint32_t *ids, uint32_t n)
{
    return upload_with(pool, ids, n, pool->mem.upload);
}

kvf_status_t kvf_kvpool_upload_queued(kvf_kvpool_t *pool, const uint32_t *ids, uint32_t n)
{
    return upload_with(pool, ids, n,
                       pool->mem.upload_queued ? pool->mem.upload_queued : pool->mem.upload);
}

const kvf_kv_geometry_t *kvf_kvpool_geometry(const kvf_kvpool_t *pool)
{
    return &pool->geo;
}

void *kvf_kvpool_base(const kvf_kvpool_t *pool)
{
    return pool->base;
}

size_t kvf_kvpool_bytes(const kvf_kvpool_t *pool)
{
    return pool->bytes;
}

size_t kvf_kvpool_slice_offset(const kvf_kvpool_t *pool, uint32_t block, int layer)
{
    KVF_ASSERT(block < pool->num_blocks && layer >= 0 && layer < pool->geo.n_layers);
    return (size_t)block * pool->block_bytes + (size_t)layer * pool->slice_bytes;
}

size_t kvf_kvpool_slice_bytes(const kvf_kvpool_t *pool)
{
    return pool->slice_bytes;
}

void *kvf_kvpool_head_data(const kvf_kvpool_t *pool, uint32_t block, int layer, int kv, int head)
{
    const kvf_kv_geometry_t *g = &pool->geo;
    return pool->base + kvf_kvpool_slice_offset(pool, block, layer) +
           kvf_kv_data_offset(g->dtype, g->n_kv_heads, g->block_size, g->head_dim, kv, head);
}

float *kvf_kvpool_head_scales(const kvf_kvpool_t *pool, uint32_t block, int layer, int kv, int head)
{
    const kvf_kv_geometry_t *g = &pool->geo;
    if (!kvf_kv_scaled(g->dtype))
        return NULL;
    return (float *)(pool->base + kvf_kvpool_slice_offset(pool, block, layer) +
                     kvf_kv_scale_offset(g->dtype, g->n_kv_heads, g->block_size, g->head_dim, kv,
                                         head));
}

uint32_t kvf_kvpool_num_blocks(const kvf_kvpool_t *pool)
{
    return pool->num_blocks;
}

uint32_t kvf_kvpool_free_blocks(const kvf_kvpool_t *pool)
{
    return pool->n_free;
}

uint32_t kvf_kvpool_used_blocks(const kvf_kvpool_t *pool)
{
    return pool->num_blocks - pool->n_free;
}

kvf_status_t kvf_kvpool_alloc(kvf_kvpool_t *pool, uint32_t n, uint32_t *ids_p)
{
    if (n > pool->n_free)
        return KVF_ERR_NO_SPACE;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t id = pool->free_list[--pool->n_free];
        pool->refcount[id] = 1;
        ids_p[i] = id;
    }
    return KVF_OK;
}

bool kvf_kvpool_is_allocated(const kvf_kvpool_t *pool, uint32_t id)
{
    return id < pool->num_blocks && pool->refcount[id] > 0;
}

kvf_status_t kvf_kvpool_ref(kvf_kvpool_t *pool, uint32_t id)
{
    if (!kvf_kvpool_is_allocated(pool, id) || pool->refcount[id] == UINT32_MAX)
        return KVF_ERR_INVAL;
    pool->refcount[id]++;
    return KVF_OK;
}

kvf_status_t kvf_kvpool_release(kvf_kvpool_t *pool, const uint32_t *ids, uint32_t n)
{
    kvf_status_t st = KVF_OK;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t id = ids[i];
        if (!kvf_kvpool_is_allocated(pool, id)) {
            kvf_log_warn("kv pool: release of block %u, which is %s", id,
                         id < pool->num_blocks ? "free" : "out of range");
            st = KVF_ERR_INVAL;
            continue;
        }
        if (--pool->refcount[id] == 0)
            pool->free_list[pool->n_free++] = id;
    }
    return st;
}

uint32_t kvf_kvpool_refcount(const kvf_kvpool_t *pool, uint32_t id)
{
    return id < pool->num_blocks ? pool->refcount[id] : 0;
}

void kvf_block_table_init(kvf_block_table_t *bt)
{
    memset(bt, 0, sizeof(*bt));
}

void kvf_block_table_fini(kvf_block_table_t *bt)
{
    free(bt->blocks);
    memset(bt, 0, sizeof(*bt));
}

static kvf_status_t table_grow(kvf_block_table_t *bt, uint32_t need)
{
    if (need <= bt->cap)
        return KVF_OK;
    /* the capacity is a uint32_t: exactly need where doubling passes it */
    size_t cap = kvf_array_grow_cap(bt->cap, need, 8);
    if (cap > UINT32_MAX)
        cap = need;
    kvf_status_t st = kvf_array_resize(&bt->blocks, cap, sizeof(*bt->blocks));
    if (st != KVF_OK)
        return st;
    bt->cap = (uint32_t)cap;
    return KVF_OK;
}

kvf_status_t kvf_block_table_append(kvf_block_table_t *bt, const uint32_t *ids, uint32_t n)
{
    if (n > UINT32_MAX - bt->n_blocks)
        return KVF_ERR_TOO_BIG;
    kvf_status_t st = table_grow(bt, bt->n_blocks + n);
    if (st != KVF_OK)
        return st;
    memcpy(bt->blocks + bt->n_blocks, ids, (size_t)n * sizeof(*ids));
    bt->n_blocks += n;
    return KVF_OK;
}

kvf_status_t kvf_block_table_reserve(kvf_block_table_t *bt, kvf_kvpool_t *pool, uint32_t n_tokens)
{
    uint32_t need = kvf_kv_blocks_for_tokens(&pool->geo, n_tokens);
    if (need <= bt->n_blocks)
        return KVF_OK;
    kvf_status_t st = table_grow(bt, need);
    if (st != KVF_OK)
        return st;
    st = kvf_kvpool_alloc(pool, need - bt->n_blocks, bt->blocks + bt->n_blocks);
    if (st != KVF_OK)
        return st;
    bt->n_blocks = need;
    return KVF_OK;
}

void kvf_block_table_release(kvf_block_table_t *bt, kvf_kvpool_t *pool)
{
    (void)kvf_kvpool_release(pool, bt->blocks, bt->n_blocks);
    bt->n_blocks = 0;
}
