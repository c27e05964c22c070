/* Paged KV cache: one contiguous pool of blocks, an allocator with a free
 * list and reference counts, and per-sequence block tables.
 *
 * Layout (docs/ARCHITECTURE.md, KV layout): [block][layer] slices, each
 * [K,V][kv_head][slot][head_dim] elements of the pool's format, then for
 * fp8/int8 the [K,V][kv_head][slot] f32 scales (kvf/kv_format.h). One
 * (block, layer) slice is contiguous, so shipping layer l of a sequence is
 * a list of contiguous slices, and one head's keys within a block are
 * contiguous.
 *
 * Thread rules: the allocator (alloc/ref/free, block tables) is not locked;
 * it belongs to one thread, the node's event loop. Compute threads read and
 * write block contents only for blocks that thread handed them. */
#ifndef KVF_KVCACHE_H
#define KVF_KVCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvf/kv_format.h"
#include "kvf/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVF_KV_BLOCK_SIZE_DEFAULT 16
#define KVF_KV_BLOCK_SIZE_MAX     256

typedef struct {
    int n_layers;
    int n_kv_heads;
    int head_dim;
    int block_size;       /* tokens per block, 1..256 */
    kvf_kv_dtype_t dtype; /* element format (kvf/kv_format.h) */
} kvf_kv_geometry_t;

/* Bytes one token occupies: 2 * layers * kv_heads * (head_dim * element
 * + 4 for a scaled format's scale). */
size_t kvf_kv_bytes_per_token(const kvf_kv_geometry_t *geo);

/* Bytes of one (block, layer) slice: block_size tokens of one layer. */
size_t kvf_kv_slice_bytes(const kvf_kv_geometry_t *geo);

/* Bytes of one block (every layer). */
size_t kvf_kv_block_bytes(const kvf_kv_geometry_t *geo);

/* Checks ranges; logs and returns KVF_ERR_INVAL / KVF_ERR_UNSUPPORTED. */
kvf_status_t kvf_kv_geometry_validate(const kvf_kv_geometry_t *geo);

typedef struct kvf_kvpool kvf_kvpool_t;

/* Allocates a zeroed pool of num_blocks blocks (64-byte aligned). On
 * success *pool_p is owned by the caller: kvf_kvpool_destroy(). */
kvf_status_t kvf_kvpool_create(const kvf_kv_geometry_t *geo, uint32_t num_blocks,
                               kvf_kvpool_t **pool_p);

/* Same, with as many blocks as fit in budget_bytes (at least one, else
 * KVF_ERR_NO_SPACE). */
kvf_status_t kvf_kvpool_create_budget(const kvf_kv_geometry_t *geo, uint64_t budget_bytes,
                                      kvf_kvpool_t **pool_p);

/* Memory for a pool whose blocks live on a device (kvf/backend.h,
 * kvf_backend_cuda_kvpool_create): host_base is a host mirror of the same
 * size, device_base the copy the kernels use, both zeroed. */
typedef struct {
    void *host_base;   /* (bytes) host memory, 64-byte aligned; NULL: none (nothing
                          reads the pool on the host) */
    void *device_base; /* (bytes) device memory */
    void *arg;
    /* Copies [off, off + bytes) of the mirror to the device and returns
     * when the copy is done. */
    kvf_status_t (*upload)(void *arg, size_t off, size_t bytes);
    /* (optional) The same copy queued ahead of every computation queued
     * after it on the device (the CUDA backend's one stream), returning at
     * once; NULL: upload is used. */
    kvf_status_t (*upload_queued)(void *arg, size_t off, size_t bytes);
    /* Frees both copies and arg. */
    void (*release)(void *arg);
} kvf_kvpool_memory_t;

/* A pool over memory the caller provides (mem->host_base and device_base
 * must hold num_blocks blocks). On success the pool owns the memory and
 * releases it in kvf_kvpool_destroy(); on failure the caller still owns
 * it. */
kvf_status_t kvf_kvpool_create_on(const kvf_kv_geometry_t *geo, uint32_t num_blocks,
                                  const kvf_kvpool_memory_t *mem, kvf_kvpool_t **pool_p);

/* Frees the pool; NULL is a no-op. */
void kvf_kvpool_destroy(kvf_kvpool_t *pool);

/* The device copy of the blocks; NULL for a host pool. */
void *kvf_kvpool_device_base(const kvf_kvpool_t *pool);

/* Copies blocks ids[0..n) (every layer) from the host memory to the device
 * copy, for blocks whose K/V landed in the host memory (a transfer). A
 * no-op for a host pool. KVF_ERR_INVAL for an out-of-range id (nothing
 * copied). */
kvf_status_t kvf_kvpool_upload(kvf_kvpool_t *pool, const uint32_t *ids, uint32_t n);

/* kvf_kvpool_upload without the wait: the copies are queued ahead of any
 * computation queued after them (every later forward reads the blocks
 * uploaded), and the caller goes on at once. The blocks' host memory must
 * stay as it is until the device has run them: the caller holds the
 * blocks (nothing writes their host copies meanwhile). A copy that fails
 * later surfaces as the next forward's error. Pools whose memory has no
 * queued copy upload and wait; a no-op for a host pool. */
kvf_status_t kvf_kvpool_upload_queued(kvf_kvpool_t *pool, const uint32_t *ids, uint32_t n);

const kvf_kv_geometry_t *kvf_kvpool_geometry(const kvf_kvpool_t *pool);

/* The pool memory (owned by the pool) and its size: what the transport
 * registers. */
void *kvf_kvpool_base(const kvf_kvpool_t *pool);
size_t kvf_kvpool_bytes(const kvf_kvpool_t *pool);

/* Byte offset of the (block, layer) slice from the base. block < num_blocks
 * and layer < n_layers are the caller's contract (asserted). */
size_t kvf_kvpool_slice_offset(const kvf_kvpool_t *pool, uint32_t block, int layer);
size_t kvf_kvpool_slice_bytes(const kvf_kvpool_t *pool);

/* Keys (kv = 0) or values (kv = 1) of one head in one (block, layer):
 * (block_size, head_dim) elements of the pool's dtype, contiguous. */
void *kvf_kvpool_head_data(const kvf_kvpool_t *pool, uint32_t block, int layer, int kv, int head);

/* The scales of those rows ((block_size) f32), or NULL for an unscaled
 * format. */
float *kvf_kvpool_head_scales(const kvf_kvpool_t *pool, uint32_t block, int layer, int kv,
                              int head);

/* Accounting. used + free = num_blocks at all times. */
uint32_t kvf_kvpool_num_blocks(const kvf_kvpool_t *pool);
uint32_t kvf_kvpool_free_blocks(const kvf_kvpool_t *pool);
uint32_t kvf_kvpool_used_blocks(const kvf_kvpool_t *pool);

/* Takes n free blocks (reference count 1), all or none: KVF_ERR_NO_SPACE
 * when fewer than n are free. ids_p receives n block ids (caller's array). */
kvf_status_t kvf_kvpool_alloc(kvf_kvpool_t *pool, uint32_t n, uint32_t *ids_p);

/* Adds a reference to an allocated block (a shared prefix). KVF_ERR_INVAL
 * for a free or out-of-range id. */
kvf_status_t kvf_kvpool_ref(kvf_kvpool_t *pool, uint32_t id);

/* Drops one reference from each of n blocks; a block whose count reaches 0
 * goes back to the free list. Ids that are out of range or already free are
 * skipped and reported with KVF_ERR_INVAL (the valid ones are still freed). */
kvf_status_t kvf_kvpool_release(kvf_kvpool_t *pool, const uint32_t *ids, uint32_t n);

/* Reference count of a block (0 = free); 0 for an out-of-range id. */
uint32_t kvf_kvpool_refcount(const kvf_kvpool_t *pool, uint32_t id);

/* True when id < num_blocks and the block is allocated. */
bool kvf_kvpool_is_allocated(const kvf_kvpool_t *pool, uint32_t id);

/* A sequence's block table: block ids in position order; token at position
 * p lives in blocks[p / block_size], slot p % block_size. Caller owns the
 * struct (init/fini); the array grows as needed. */
typedef struct {
    uint32_t *blocks; /* (n_blocks) */
    uint32_t n_blocks;
    uint32_t cap;
} kvf_block_table_t;

void kvf_block_table_init(kvf_block_table_t *bt);

/* Frees the array (not the blocks: release them first). */
void kvf_block_table_fini(kvf_block_table_t *bt);

/* Appends n given block ids (e.g. reserved by a peer). */
kvf_status_t kvf_block_table_append(kvf_block_table_t *bt, const uint32_t *ids, uint32_t n);

/* Allocates from pool whatever blocks are needed so the table covers
 * n_tokens positions. All or nothing: KVF_ERR_NO_SPACE leaves it as it was. */
kvf_status_t kvf_block_table_reserve(kvf_block_table_t *bt, kvf_kvpool_t *pool, uint32_t n_tokens);

/* Releases every block of the table to pool and empties it. */
void kvf_block_table_release(kvf_block_table_t *bt, kvf_kvpool_t *pool);

/* Blocks needed for n_tokens positions. */
uint32_t kvf_kv_blocks_for_tokens(const kvf_kv_geometry_t *geo, uint32_t n_tokens);

#ifdef __cplusplus
}
#endif

#endif
