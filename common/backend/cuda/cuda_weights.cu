// The CUDA backend's weights: one device slab holding every weight, the
// projections and embeddings in the configured dtype (bf16, f16 or f32),
// norms and biases in f32, each at a 256-byte boundary (cuda_backend.cuh).
#include <string.h>

#include "cuda_backend.cuh"
#include "kvf/log.h"

typedef struct {
    cuda_ctx_t *c;
    uint8_t *dev; // slab cursor base
    size_t off;   // bytes used
    void *stage;  // pinned staging buffer (UPLOAD_CHUNK_BYTES)
    bool dry;     // only count bytes
} uploader_t;

// Places n f32 values (converted to dtype) at the slab's next 256-byte
// boundary; returns the device address (NULL on a dry run).
static kvf_status_t upload(uploader_t *u, const float *src, size_t n, kvf_dtype_t dtype,
                           void **dst_p)
{
    size_t esz = kvf_dtype_size(dtype), bytes = n * esz;
    u->off = align256(u->off);
    void *dst = u->dry ? NULL : u->dev + u->off;
    if (!u->dry) {
        size_t per = UPLOAD_CHUNK_BYTES / esz;
        for (size_t i = 0; i < n; i += per) {
            size_t cnt = n - i < per ? n - i : per;
            if (dtype == KVF_DTYPE_F32) {
                memcpy(u->stage, src + i, cnt * sizeof(float));
            } else {
                uint16_t *h = (uint16_t *)u->stage;
                for (size_t j = 0; j < cnt; j++)
                    h[j] = dtype == KVF_DTYPE_BF16 ? kvf_f32_to_bf16(src[i + j])
                                                   : kvf_f32_to_f16(src[i + j]);
            }
            TRY(cudaMemcpy((uint8_t *)dst + i * esz, u->stage, cnt * esz, cudaMemcpyHostToDevice),
                "weight upload");
        }
    }
    u->off += bytes;
    *dst_p = dst;
    return KVF_OK;
}

static kvf_status_t upload_model(uploader_t *u)
{
    cuda_ctx_t *c = u->c;
    const kvf_model_t *mdl = c->model;
    const kvf_model_config_t *m = &mdl->cfg;
    const size_t h = (size_t)m->hidden, qkv = (size_t)c->qkv_dim, in = (size_t)m->inter;
    void *p;
    CHECK(upload(u, mdl->embed, (size_t)m->vocab * h, c->wdt, &p));
    c->embed = p;
    if (mdl->lm_head == mdl->embed) {
        c->lm_head = c->embed;
    } else {
        CHECK(upload(u, mdl->lm_head, (size_t)m->vocab * h, c->wdt, &p));
        c->lm_head = p;
    }
    CHECK(upload(u, mdl->final_norm, h, KVF_DTYPE_F32, &p));
    c->final_norm = (float *)p;
    for (int l = 0; l < m->n_layers; l++) {
        const kvf_layer_weights_t *W = &mdl->layers[l];
        cuda_layer_t *L = &c->layers[l];
        CHECK(upload(u, W->attn_norm, h, KVF_DTYPE_F32, &p));
        L->attn_norm = (float *)p;
        CHECK(upload(u, W->ffn_norm, h, KVF_DTYPE_F32, &p));
        L->ffn_norm = (float *)p;
        CHECK(upload(u, W->wqkv, qkv * h, c->wdt, &p));
        L->wqkv = p;
        L->bqkv = NULL;
        if (W->bqkv) {
            CHECK(upload(u, W->bqkv, qkv, KVF_DTYPE_F32, &p));
            L->bqkv = (const float *)p;
        }
        L->post_attn_norm = L->post_ffn_norm = NULL;
        if (W->post_attn_norm) {
            CHECK(upload(u, W->post_attn_norm, h, KVF_DTYPE_F32, &p));
            L->post_attn_norm = (const float *)p;
            CHECK(upload(u, W->post_ffn_norm, h, KVF_DTYPE_F32, &p));
            L->post_ffn_norm = (const float *)p;
        }
        L->q_norm = L->k_norm = NULL;
        if (W->q_norm) {
            CHECK(upload(u, W->q_norm, (size_t)m->head_dim, KVF_DTYPE_F32, &p));
            L->q_norm = (const float *)p;
            CHECK(upload(u, W->k_norm, (size_t)m->head_dim, KVF_DTYPE_F32, &p));
            L->k_norm = (const float *)p;
        }
        CHECK(upload(u, W->wo, h * (size_t)c->q_dim, c->wdt, &p));
        L->wo = p;
        CHECK(upload(u, W->wgu, 2 * in * h, c->wdt, &p));
        L->wgu = p;
        CHECK(upload(u, W->wdown, h * in, c->wdt, &p));
        L->wdown = p;
    }
    u->off = align256(u->off);
    return KVF_OK;
}

kvf_status_t kvf_cuda__weights_create(cuda_ctx_t *c)
{
    uploader_t u;
    memset(&u, 0, sizeof(u));
    u.c = c;
    u.dry = true;
    CHECK(upload_model(&u));
    c->wslab_bytes = u.off;
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    if (c->wslab_bytes > free_b) {
        kvf_log_error("cuda backend: %.2f GB of %s weights do not fit in %.2f GB free on device "
                      "%d",
                      c->wslab_bytes / 1e9, kvf_dtype_name(c->wdt), free_b / 1e9, c->cfg.device);
        return KVF_ERR_NOMEM;
    }
    CHECK(kvf_cuda__dev_alloc(&c->wslab, c->wslab_bytes, "weights"));
    TRY(cudaMallocHost(&u.stage, UPLOAD_CHUNK_BYTES), "pinned staging");
    u.dry = false;
    u.dev = (uint8_t *)c->wslab;
    u.off = 0;
    kvf_status_t st = upload_model(&u);
    cudaFreeHost(u.stage);
    return st;
}
