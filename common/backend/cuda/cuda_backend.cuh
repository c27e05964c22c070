// Private to the CUDA backend (cuda_backend.cu describes it): the context
// and the batch plan, shared by the files the backend is made of.
//
//   cuda_backend.cu  the context: device, streams, cuBLAS, events; the ops
//                    table and the kvf/backend.h entry points
//   cuda_buffers.cu  device memory: allocation, the activation buffers that
//                    grow with the batch
//   cuda_weights.cu  the weight slab and its upload
//   cuda_plan.cu     the host side of a batch: its plan and packed inputs
//   cuda_forward.cu  the forward pass: enqueued kernels, hooks, results
//   cuda_graphs.cu   decode steps captured as CUDA graphs and replayed
//   cuda_kvpool.cu   KV pools in device memory
#ifndef KVF_CUDA_BACKEND_CUH
#define KVF_CUDA_BACKEND_CUH

#include <cublas_v2.h>

#include <stdint.h>

#include "cuda_common.cuh"
#include "kvf/backend.h"
#include "kvf/engine.h"
#include "kvf/model.h"

// Returns the kvf_status_t of a failed CUDA call (logged with what).
#define TRY(call, what)                                                                            \
    do {                                                                                           \
        kvf_status_t st_ = KVF_CUDA_TRY((call), (what));                                           \
        if (st_ != KVF_OK)                                                                         \
            return st_;                                                                            \
    } while (0)

// Returns a failed kvf_status_t.
#define CHECK(call)                                                                                \
    do {                                                                                           \
        kvf_status_t st_ = (call);                                                                 \
        if (st_ != KVF_OK)                                                                         \
            return st_;                                                                            \
    } while (0)

#define GRAPH_CACHE          16
#define BLAS_WORKSPACE_BYTES ((size_t)32 << 20)
#define UPLOAD_CHUNK_BYTES   ((size_t)64 << 20)

typedef struct {
    float *attn_norm, *ffn_norm; // (hidden) f32
    const void *wqkv;            // (q_dim + 2 kv_dim, hidden) wdt
    const float *bqkv;           // (q_dim + 2 kv_dim) f32, or NULL
    const float *q_norm, *k_norm; // (head_dim) f32 (Qwen3), or NULL
    const float *post_attn_norm, *post_ffn_norm; // (hidden) f32 (Gemma2), or NULL
    const void *wo;              // (hidden, q_dim)
    const void *wgu;             // (2 inter, hidden)
    const void *wdown;           // (hidden, inter)
} cuda_layer_t;

// Offsets (bytes) of the per-batch inputs in the metadata buffer; the same
// numbers for the same shape, so a captured graph finds them where it
// expects.
typedef struct {
    size_t tokens, pos, seq, tok_block, cos_sin, tables, tiles, dec, out_rows, total;
} meta_layout_t;

// What a forward computes: the host-side plan of a batch.
typedef struct {
    int n, n_seqs, n_out, bt_stride;
    int n_tiles, max_tile_pos, n_dec, n_splits, split_keys;
    bool decode_only;
    meta_layout_t ml;
} batch_plan_t;

typedef struct {
    bool used;
    int n, bt_stride, n_out, n_splits, split_keys;
    const void *pool_dev; // the pool the graph's kernels address (base, size, layout)
    uint32_t pool_blocks;
    int pool_block_size;
    uint64_t last_use;
    cudaGraphExec_t exec;
} graph_entry_t;

typedef struct cuda_ctx {
    kvf_cuda_config_t cfg;
    const kvf_model_t *model;
    kvf_dtype_t wdt;
    size_t wsz; // bytes per weight element
    cudaStream_t stream, copy_stream;
    cublasHandle_t blas;
    void *blas_ws;

    void *wslab; // every weight on the device
    size_t wslab_bytes;
    const void *embed;   // (vocab, hidden) wdt
    const void *lm_head; // (vocab, hidden) wdt; = embed when tied
    float *final_norm;   // (hidden)
    cuda_layer_t *layers;

    int q_dim, kv_dim, qkv_dim;
    // activations for cap_tokens rows
    int cap_tokens;
    float *x;     // (cap, hidden) residual stream
    float *delta; // (cap, hidden) a block's output, added into x by the next norm
    float *qkv;   // (cap, qkv_dim)
    float *gu;    // (cap, 2 inter)
    void *h;      // (cap, hidden) adt: normed rows
    void *att;    // (cap, q_dim) adt
    void *act;    // (cap, inter) adt
    int cap_out;
    void *hout;        // (cap_out, hidden) adt
    float *logits;     // (cap_out, vocab)
    int32_t *ids;      // (cap_out) device argmax
    int32_t *ids_host; // (cap_out) pinned
    size_t cap_ws;
    float *dec_ws; // decode split partials
    size_t cap_meta;
    void *meta_dev, *meta_host; // per-batch inputs (pinned host copy)
    cudaEvent_t *layer_done;    // (n_layers) compute of layer l's K/V done
    cudaEvent_t *copy_done;     // (n_layers) layer l's K/V in the host mirror
    uint32_t *touched;          // (cap_touched) blocks a batch writes (host)
    size_t cap_touched;

    int n_sms; // multiprocessors: sizes the decode split

    graph_entry_t graphs[GRAPH_CACHE];
    uint64_t use_clock;
} cuda_ctx_t;

static inline size_t align256(size_t x)
{
    return (x + 255) & ~(size_t)255;
}

// ---- cuda_buffers.cu ----------------------------------------------------------

// cudaFree of p unless NULL.
void kvf_cuda__dev_free(void *p);

// *p = bytes (256 when 0) of device memory: KVF_ERR_NOMEM, logged with what,
// and *p NULL when they are not there.
kvf_status_t kvf_cuda__dev_alloc(void **p, size_t bytes, const char *what);

// Grows the activation, output, decode workspace and batch input buffers to
// what plan p needs (and drops the graphs that captured the old ones).
kvf_status_t kvf_cuda__reserve(cuda_ctx_t *c, const batch_plan_t *p);

// Frees the buffers kvf_cuda__reserve() made.
void kvf_cuda__free_buffers(cuda_ctx_t *c);

// ---- cuda_weights.cu ------------------------------------------------------------

// Sizes the slab for c->model's weights in c->wdt, checks it fits in the
// device's free memory (KVF_ERR_NOMEM, logged), allocates it and uploads
// every weight, setting c's weight pointers.
kvf_status_t kvf_cuda__weights_create(cuda_ctx_t *c);

// ---- cuda_plan.cu ---------------------------------------------------------------

// Rows of logits (or greedy ids) sequence q wants: all its tokens', its
// last token's, or none.
int kvf_cuda__out_rows(const kvf_engine_seq_t *q);

// The plan of a batch of n_seqs sequences over a pool of geometry g;
// to_host: the forward copies K/V to the host mirror (no graph then).
void kvf_cuda__plan_batch(const cuda_ctx_t *c, const kvf_kv_geometry_t *g,
                          const kvf_engine_seq_t *seqs, int n_seqs, bool to_host, batch_plan_t *p);

// Fills the pinned metadata buffer c->meta_host for the batch of plan p.
void kvf_cuda__fill_meta(const cuda_ctx_t *c, const kvf_kv_geometry_t *g,
                         const kvf_engine_seq_t *seqs, const batch_plan_t *p);

// c->touched[0..*n_p) = the blocks the batch writes, sorted, without
// repeats (grown as needed: KVF_ERR_NOMEM).
kvf_status_t kvf_cuda__collect_touched(cuda_ctx_t *c, const kvf_kv_geometry_t *g,
                                       const kvf_engine_seq_t *seqs, int n_seqs, size_t *n_p);

// ---- cuda_forward.cu ------------------------------------------------------------

// Enqueues the whole forward of plan p (after the metadata upload) on
// c->stream: what a graph captures. With n_touched > 0 it also enqueues
// the per-layer copies to the host mirror; with mark_layers, it records
// layer_done[l] once layer l's K/V is in the pool (for the hooks).
kvf_status_t kvf_cuda__enqueue_forward(cuda_ctx_t *c, kvf_kvpool_t *pool, const batch_plan_t *p,
                                       size_t n_touched, bool mark_layers);

// The ops table's forward (kvf_backend_ops_t.forward).
kvf_status_t kvf_cuda__forward(void *ctx, kvf_kvpool_t *pool, const kvf_engine_seq_t *seqs,
                               int n_seqs, const kvf_engine_hooks_t *hooks);

// ---- cuda_graphs.cu -------------------------------------------------------------

// Destroys every cached graph.
void kvf_cuda__graphs_clear(cuda_ctx_t *c);

// A graph for plan p over pool: the same shape and the same pool (a graph
// bakes in the pool's address, size and layout); NULL when there is none.
graph_entry_t *kvf_cuda__graph_find(cuda_ctx_t *c, const kvf_kvpool_t *pool, const batch_plan_t *p);

// Captures the forward of plan p into a graph (evicting the least recently
// used one when the cache is full).
kvf_status_t kvf_cuda__graph_capture(cuda_ctx_t *c, kvf_kvpool_t *pool, const batch_plan_t *p,
                                     graph_entry_t **e_p);

#endif
