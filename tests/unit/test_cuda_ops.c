/* What of the CUDA backend runs without a GPU: the launchers' shape checks
 * (each launcher calls its check before it touches the device), a pool
 * over provided device memory (upload of landed blocks, coalesced runs,
 * range checks, release), the engine refusing a CPU backend on a device
 * pool, the engine's greedy token, the backend flags, and the clear error
 * kvf_backend_cuda_create gives where there is no GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "../../common/backend/cuda/cuda_ops.h"
#include "kvf/backend.h"
#include "kvf/backend_flags.h"
#include "kvf/engine.h"
#include "kvf/gpu.h"
#include "kvf/kvcache.h"
#include "kvf/log.h"
#include "kvf/model.h"
#include "kvf/sampling.h"
#include "support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- shape checks ------------------------------------------------------ */

static void test_elementwise_checks(void **state)
{
    (void)state;
    assert_int_equal(kvf_cuda_check_embed(4, 64, 512), KVF_OK);
    assert_int_equal(kvf_cuda_check_embed(0, 64, 512), KVF_OK);
    assert_int_equal(kvf_cuda_check_embed(-1, 64, 512), KVF_ERR_INVAL);
    assert_int_equal(kvf_cuda_check_embed(4, 0, 512), KVF_ERR_INVAL);

    assert_int_equal(kvf_cuda_check_rmsnorm(8, 64, 64, KVF_DTYPE_BF16, 1e-5f), KVF_OK);
    assert_int_equal(kvf_cuda_check_rmsnorm(8, 64, 63, KVF_DTYPE_BF16, 1e-5f), KVF_ERR_INVAL);
    assert_int_equal(kvf_cuda_check_rmsnorm(8, 64, 64, KVF_DTYPE_UNKNOWN, 1e-5f), KVF_ERR_INVAL);
    assert_int_equal(kvf_cuda_check_rmsnorm(8, 64, 64, KVF_DTYPE_F32, 0.0f), KVF_ERR_INVAL);
    assert_int_equal(kvf_cuda_check_rmsnorm(8, 64, 64, KVF_DTYPE_F32, NAN), KVF_ERR_INVAL);

    assert_int_equal(kvf_cuda_check_swiglu(4, 96, KVF_DTYPE_F16), KVF_OK);
    assert_int_equal(kvf_cuda_check_swiglu(4, 0, KVF_DTYPE_F16), KVF_ERR_INVAL);
    assert_int_equal(kvf_cuda_check_argmax(2, 512), KVF_OK);
    assert_int_equal(kvf_cuda_check_argmax(2, 0), KVF_ERR_INVAL);
    assert_int_equal(kvf_cuda_check_gather(128, 3), KVF_OK);
    assert_int_equal(kvf_cuda_check_gather(127, 3), KVF_ERR_INVAL);
    assert_int_equal(kvf_cuda_check_gemm(7, 3072, 2048, KVF_DTYPE_BF16), KVF_OK);
    assert_int_equal(kvf_cuda_check_gemm(7, 0, 2048, KVF_DTYPE_BF16), KVF_ERR_INVAL);
    assert_int_equal(kvf_cuda_check_gemm(7, 64, 64, KVF_DTYPE_UNKNOWN), KVF_ERR_INVAL);
}

/* A valid attention description for 8 query heads over 2 kv heads of 64. */
static kvf_cuda_attn_t attn_ok(void)
{
    static float dummy[4];
    static int32_t ids[4];
    kvf_cuda_attn_t a = {.kv_layer = dummy,
                         .block_stride = 4 * 2 * 2 * 16 * 64,
                         .n_pool_blocks = 10,
                         .n_heads = 8,
                         .n_kv_heads = 2,
                         .head_dim = 64,
                         .block_size = 16,
                         .scale = 0.125f,
                         .q = dummy,
                         .ld_q = 768,
                         .out = dummy,
                         .ld_out = 512,
                         .adt = KVF_DTYPE_BF16,
                         .n_tokens = 3,
                         .pos = ids,
                         .seq = ids,
                         .block_tables = ids,
                         .bt_stride = 4,
                         .n_seqs = 2};
    return a;
}

static void test_attention_checks(void **state)
{
    (void)state;
    kvf_cuda_attn_t a = attn_ok();
    assert_int_equal(kvf_cuda_check_attention(&a), KVF_OK);
    kvf_cuda_attn_t b = a;
    b.n_kv_heads = 3; /* 8 heads are not a multiple of 3 */
    assert_int_equal(kvf_cuda_check_attention(&b), KVF_ERR_INVAL);
    b = a;
    b.head_dim = 60; /* not a multiple of 8 */
    assert_int_equal(kvf_cuda_check_attention(&b), KVF_ERR_UNSUPPORTED);
    b = a;
    b.head_dim = 512;
    b.ld_q = b.ld_out = 8 * 512 * 2;
    b.block_stride = (int64_t)1 << 30;
    assert_int_equal(kvf_cuda_check_attention(&b), KVF_ERR_UNSUPPORTED);
    b = a;
    b.n_heads = 128;
    b.n_kv_heads = 2; /* a group of 64 */
    b.ld_q = b.ld_out = 128 * 64;
    assert_int_equal(kvf_cuda_check_attention(&b), KVF_ERR_UNSUPPORTED);
    b = a;
    b.ld_q = 500; /* q rows narrower than 8 heads of 64 */
    assert_int_equal(kvf_cuda_check_attention(&b), KVF_ERR_INVAL);
    b = a;
    b.block_stride = 100; /* below one layer's slice */
    assert_int_equal(kvf_cuda_check_attention(&b), KVF_ERR_INVAL);
    b = a;
    b.block_tables = NULL;
    assert_int_equal(kvf_cuda_check_attention(&b), KVF_ERR_INVAL);
    b = a;
    b.adt = KVF_DTYPE_UNKNOWN;
    assert_int_equal(kvf_cuda_check_attention(&b), KVF_ERR_INVAL);
    b = a;
    b.scale = 0;
    assert_int_equal(kvf_cuda_check_attention(&b), KVF_ERR_INVAL);
    b = a;
    b.softcap = 50.0f; /* Gemma2's soft-cap */
    assert_int_equal(kvf_cuda_check_attention(&b), KVF_OK);
    b.softcap = -1.0f;
    assert_int_equal(kvf_cuda_check_attention(&b), KVF_ERR_INVAL);
    b.softcap = NAN;
    assert_int_equal(kvf_cuda_check_attention(&b), KVF_ERR_INVAL);

    /* prefill tiles: the last position must fall inside the table */
    static int32_t tiles[2] = {0, 3};
    kvf_cuda_prefill_tiles_t t = {tiles, 1, 63};
    assert_int_equal(kvf_cuda_check_prefill_tiles(&a, &t), KVF_OK);
    t.max_tile_pos = 64; /* block 4 of a 4-wide table */
    assert_int_equal(kvf_cuda_check_prefill_tiles(&a, &t), KVF_ERR_INVAL);
    kvf_cuda_prefill_tiles_t none = {NULL, 0, 0};
    assert_int_equal(kvf_cuda_check_prefill_tiles(&a, &none), KVF_OK);
    kvf_cuda_prefill_tiles_t missing = {NULL, 2, 10};
    assert_int_equal(kvf_cuda_check_prefill_tiles(&a, &missing), KVF_ERR_INVAL);

    /* decode plans */
    int group = a.n_heads / a.n_kv_heads;
    int keys = kvf_cuda_decode_split_keys(group, a.block_size);
    assert_true(keys > 0 && keys % a.block_size == 0 && group * keys <= 4096);
    assert_int_equal(kvf_cuda_decode_split_keys(32, 256), 256); /* at least one block */
    assert_int_equal(kvf_cuda_decode_split_keys(1, 16), 512);
    static float ws[4];
    static int32_t dec[3] = {0, 1, 2};
    kvf_cuda_decode_plan_t p = {dec, 3, 1, keys, ws};
    assert_int_equal(kvf_cuda_check_decode_plan(&a, &p), KVF_OK);
    kvf_cuda_decode_plan_t q = p;
    q.split_keys = keys + 1; /* not a multiple of the block size */
    assert_int_equal(kvf_cuda_check_decode_plan(&a, &q), KVF_ERR_INVAL);
    q = p;
    q.split_keys = 4096; /* scores of 4 heads x 4096 keys do not fit */
    assert_int_equal(kvf_cuda_check_decode_plan(&a, &q), KVF_ERR_INVAL);
    q = p;
    q.n_splits = 0;
    assert_int_equal(kvf_cuda_check_decode_plan(&a, &q), KVF_ERR_INVAL);
    q = p;
    q.n_splits = 100; /* far past a table of 4 blocks */
    assert_int_equal(kvf_cuda_check_decode_plan(&a, &q), KVF_ERR_INVAL);
    q = p;
    q.ws = NULL;
    assert_int_equal(kvf_cuda_check_decode_plan(&a, &q), KVF_ERR_INVAL);
    q = p;
    q.n_dec = 0;
    q.ws = NULL;
    assert_int_equal(kvf_cuda_check_decode_plan(&a, &q), KVF_OK);
    assert_int_equal(kvf_cuda_decode_ws_floats(3, 8, 2, 64), (size_t)3 * 8 * 2 * 66);
    assert_int_equal(kvf_cuda_prefill_tile_tokens(4), KVF_CUDA_PREFILL_ROWS / 4);
    assert_int_equal(kvf_cuda_prefill_tile_tokens(128), 1);
}

/* ---- a pool over provided "device" memory ------------------------------- */

typedef struct {
    uint8_t *host, *dev;
    int uploads, queued, released;
    size_t last_off, last_bytes;
} fake_mem_t;

static kvf_status_t fake_upload(void *arg, size_t off, size_t bytes)
{
    fake_mem_t *f = arg;
    memcpy(f->dev + off, f->host + off, bytes);
    f->uploads++;
    f->last_off = off;
    f->last_bytes = bytes;
    return KVF_OK;
}

static kvf_status_t fake_upload_queued(void *arg, size_t off, size_t bytes)
{
    fake_mem_t *f = arg;
    f->queued++;
    f->uploads--; /* counted by fake_upload: only the queued ones here */
    return fake_upload(arg, off, bytes);
}

static void fake_release(void *arg)
{
    fake_mem_t *f = arg;
    free(f->host);
    free(f->dev);
    f->host = f->dev = NULL;
    f->released++;
}

static void test_device_pool(void **state)
{
    (void)state;
    kvf_kv_geometry_t g = {
        .n_layers = 2, .n_kv_heads = 2, .head_dim = 8, .block_size = 4, .dtype = KVF_KV_F32};
    size_t bb = kvf_kv_block_bytes(&g);
    fake_mem_t f = {0};
    f.host = calloc(8, bb);
    f.dev = calloc(8, bb);
    kvf_kvpool_memory_t mem = {.host_base = f.host,
                               .device_base = f.dev,
                               .arg = &f,
                               .upload = fake_upload,
                               .release = fake_release};
    kvf_kvpool_t *pool = NULL;
    assert_int_equal(kvf_kvpool_create_on(&g, 8, &mem, &pool), KVF_OK);
    assert_ptr_equal(kvf_kvpool_base(pool), f.host);
    assert_ptr_equal(kvf_kvpool_device_base(pool), f.dev);
    assert_int_equal(kvf_kvpool_bytes(pool), 8 * bb);
    /* landed blocks 2, 3, 4 and 6: two copies (runs 2-4 and 6) */
    for (size_t i = 0; i < 8 * bb; i++)
        f.host[i] = (uint8_t)(i * 7 + 1);
    uint32_t ids[] = {2, 3, 4, 6};
    assert_int_equal(kvf_kvpool_upload(pool, ids, 4), KVF_OK);
    assert_int_equal(f.uploads, 2);
    assert_int_equal(f.last_off, 6 * bb);
    assert_int_equal(f.last_bytes, bb);
    assert_memory_equal(f.dev + 2 * bb, f.host + 2 * bb, 3 * bb);
    assert_memory_equal(f.dev + 6 * bb, f.host + 6 * bb, bb);
    for (size_t i = 0; i < bb; i++) /* block 5 was not asked for */
        assert_int_equal(f.dev[5 * bb + i], 0);
    /* an id out of range: nothing copied */
    uint32_t bad[] = {1, 8};
    assert_int_equal(kvf_kvpool_upload(pool, bad, 2), KVF_ERR_INVAL);
    assert_int_equal(f.uploads, 2);
    /* memory without a queued copy: upload_queued uploads */
    uint32_t one[] = {5};
    assert_int_equal(kvf_kvpool_upload_queued(pool, one, 1), KVF_OK);
    assert_int_equal(f.uploads, 3);
    assert_memory_equal(f.dev + 5 * bb, f.host + 5 * bb, bb);
    assert_int_equal(kvf_kvpool_upload_queued(pool, bad, 2), KVF_ERR_INVAL);
    /* the engine will not run the CPU ops on device memory */
    kvf_model_config_t c;
    memset(&c, 0, sizeof(c));
    c.n_layers = 2;
    c.n_kv_heads = 2;
    c.head_dim = 8;
    kvf_model_t model;
    memset(&model, 0, sizeof(model));
    model.cfg = c;
    kvf_backend_t be;
    assert_int_equal(kvf_backend_cpu_create(1, &be), KVF_OK);
    kvf_engine_t *e = NULL;
    assert_int_equal(kvf_engine_create(&model, &be, pool, &e), KVF_ERR_MISMATCH);
    assert_null(e);
    kvf_backend_destroy(&be);
    kvf_kvpool_destroy(pool);
    assert_int_equal(f.released, 1);
    /* with one: upload_queued queues (a copy per run), upload still waits */
    fake_mem_t fq = {0};
    fq.host = calloc(8, bb);
    fq.dev = calloc(8, bb);
    for (size_t i = 0; i < 8 * bb; i++)
        fq.host[i] = (uint8_t)(i * 5 + 3);
    kvf_kvpool_memory_t mq = mem;
    mq.host_base = fq.host;
    mq.device_base = fq.dev;
    mq.arg = &fq;
    mq.upload_queued = fake_upload_queued;
    assert_int_equal(kvf_kvpool_create_on(&g, 8, &mq, &pool), KVF_OK);
    assert_int_equal(kvf_kvpool_upload_queued(pool, ids, 4), KVF_OK);
    assert_int_equal(fq.queued, 2);
    assert_int_equal(fq.uploads, 0);
    assert_memory_equal(fq.dev + 2 * bb, fq.host + 2 * bb, 3 * bb);
    assert_memory_equal(fq.dev + 6 * bb, fq.host + 6 * bb, bb);
    assert_int_equal(kvf_kvpool_upload(pool, one, 1), KVF_OK);
    assert_int_equal(fq.queued, 2);
    assert_int_equal(fq.uploads, 1);
    kvf_kvpool_destroy(pool);
    assert_int_equal(fq.released, 1);
    /* a host pool: upload is a no-op, there is no device copy */
    assert_int_equal(kvf_kvpool_create(&g, 2, &pool), KVF_OK);
    assert_null(kvf_kvpool_device_base(pool));
    assert_int_equal(kvf_kvpool_upload(pool, ids, 1), KVF_OK);
    assert_int_equal(kvf_kvpool_upload_queued(pool, ids, 1), KVF_OK);
    kvf_kvpool_destroy(pool);
    /* memory without an upload callback is refused, and stays the caller's */
    fake_mem_t f2 = {0};
    f2.dev = malloc(bb);
    kvf_kvpool_memory_t m2 = {.host_base = NULL,
                              .device_base = f2.dev,
                              .arg = &f2,
                              .upload = NULL,
                              .release = fake_release};
    assert_int_equal(kvf_kvpool_create_on(&g, 1, &m2, &pool), KVF_ERR_INVAL);
    assert_int_equal(f2.released, 0);
    free(f2.dev);
    /* no mirror: upload has nothing to copy from */
    fake_mem_t f3 = {0};
    f3.dev = calloc(1, bb);
    kvf_kvpool_memory_t m3 = {.host_base = NULL,
                              .device_base = f3.dev,
                              .arg = &f3,
                              .upload = fake_upload,
                              .release = fake_release};
    assert_int_equal(kvf_kvpool_create_on(&g, 1, &m3, &pool), KVF_OK);
    assert_null(kvf_kvpool_base(pool));
    uint32_t zero = 0;
    assert_int_equal(kvf_kvpool_upload(pool, &zero, 1), KVF_ERR_INVAL);
    kvf_kvpool_destroy(pool);
    assert_int_equal(f3.released, 1);
}

/* ---- engine greedy token, flags, no-GPU errors ---------------------------- */

static void test_greedy_token_cpu(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvf_cuda_ops_XXXXXX";
    kvf_model_config_t c = kvf_test_model_config(4, 2, false);
    c.vocab = 300;
    c.max_pos = 256;
    kvf_test_write_model(dir, &c, 4);
    kvf_engine_stack_t st;
    kvf_engine_stack_config_t sc = {.threads = 1, .block_size = 16, .max_blocks = 8};
    assert_int_equal(kvf_engine_stack_init(&st, dir, &sc), KVF_OK);
    kvf_block_table_t bt;
    kvf_block_table_init(&bt);
    assert_int_equal(kvf_block_table_reserve(&bt, st.pool, 21), KVF_OK);
    uint32_t ids[21];
    for (int i = 0; i < 21; i++)
        ids[i] = (uint32_t)(i * 13 + 5) % 300;
    float *logits = malloc(300 * sizeof(float));
    uint32_t g1 = 999, g2 = 999;
    /* logits and greedy token of the prompt's last position */
    kvf_engine_seq_t q = {.tokens = ids,
                          .n_tokens = 20,
                          .start_pos = 0,
                          .block_ids = bt.blocks,
                          .n_blocks = bt.n_blocks,
                          .logits = logits,
                          .greedy_token = &g1};
    assert_int_equal(kvf_engine_forward(st.engine, &q, 1, NULL), KVF_OK);
    assert_int_equal(g1, kvf_sample_argmax(logits, 300));
    /* greedy token alone (no logits row wanted), next to a sequence that
     * wants nothing */
    kvf_block_table_t bt2;
    kvf_block_table_init(&bt2);
    assert_int_equal(kvf_block_table_reserve(&bt2, st.pool, 3), KVF_OK);
    kvf_engine_seq_t two[2] = {{.tokens = ids + 20,
                                .n_tokens = 1,
                                .start_pos = 20,
                                .block_ids = bt.blocks,
                                .n_blocks = bt.n_blocks,
                                .greedy_token = &g2},
                               {.tokens = ids,
                                .n_tokens = 3,
                                .start_pos = 0,
                                .block_ids = bt2.blocks,
                                .n_blocks = bt2.n_blocks}};
    assert_int_equal(kvf_engine_forward(st.engine, two, 2, NULL), KVF_OK);
    /* the same step with logits: the same token */
    q = (kvf_engine_seq_t){.tokens = ids + 20,
                           .n_tokens = 1,
                           .start_pos = 20,
                           .block_ids = bt.blocks,
                           .n_blocks = bt.n_blocks,
                           .logits = logits};
    assert_int_equal(kvf_engine_forward(st.engine, &q, 1, NULL), KVF_OK);
    assert_int_equal(g2, kvf_sample_argmax(logits, 300));
    kvf_block_table_release(&bt, st.pool);
    kvf_block_table_release(&bt2, st.pool);
    kvf_block_table_fini(&bt);
    kvf_block_table_fini(&bt2);
    free(logits);

    /* --backend cuda: a clear error without a GPU (or without CUDA) */
    if (kvf_gpu_count() == 0) {
        kvf_cuda_config_t cc = kvf_cuda_config_default();
        kvf_backend_t be;
        kvf_status_t s = kvf_backend_cuda_create(&cc, st.model, &be);
        assert_int_equal(s, kvf_gpu_built_with_cuda() ? KVF_ERR_DEVICE : KVF_ERR_UNSUPPORTED);
        kvf_engine_stack_t st2;
        kvf_engine_stack_config_t sc2 = sc;
        sc2.backend = KVF_BACKEND_CUDA;
        sc2.cuda = cc;
        assert_int_not_equal(kvf_engine_stack_init(&st2, dir, &sc2), KVF_OK);
        assert_null(st2.engine);
    }
    kvf_engine_stack_fini(&st);
    kvf_test_remove_model(dir);
}

static void test_backend_flags(void **state)
{
    (void)state;
    kvf_engine_stack_config_t sc;
    memset(&sc, 0, sizeof(sc));
    kvf_backend_flags_t f = {0};
    assert_int_equal(kvf_backend_flags_apply(&f, &sc), KVF_OK);
    assert_int_equal(sc.backend, KVF_BACKEND_CPU);
    assert_int_equal(sc.kv_dtype, KVF_KV_F32); /* the CPU's default KV format */
    f = (kvf_backend_flags_t){
        .backend = "cuda", .device = 1, .gpu_dtype = "f16", .no_graphs = true};
    assert_int_equal(kvf_backend_flags_apply(&f, &sc), KVF_OK);
    assert_int_equal(sc.backend, KVF_BACKEND_CUDA);
    assert_int_equal(sc.cuda.device, 1);
    assert_int_equal(sc.cuda.wdtype, KVF_DTYPE_F16);
    assert_false(sc.cuda.cuda_graphs);
    f = (kvf_backend_flags_t){.backend = "cuda"};
    assert_int_equal(kvf_backend_flags_apply(&f, &sc), KVF_OK);
    assert_int_equal(sc.cuda.wdtype, KVF_DTYPE_BF16);
    assert_true(sc.cuda.cuda_graphs);
    assert_int_equal(sc.kv_dtype, KVF_KV_BF16); /* the GPU's default KV format */
    f = (kvf_backend_flags_t){.backend = "cuda", .kv_dtype = "f32"};
    assert_int_equal(kvf_backend_flags_apply(&f, &sc), KVF_OK);
    assert_int_equal(sc.kv_dtype, KVF_KV_F32);
    f = (kvf_backend_flags_t){.kv_dtype = "int8"};
    assert_int_equal(kvf_backend_flags_apply(&f, &sc), KVF_OK);
    assert_int_equal(sc.kv_dtype, KVF_KV_INT8);
    f = (kvf_backend_flags_t){.kv_dtype = "fp4"};
    assert_int_equal(kvf_backend_flags_apply(&f, &sc), KVF_ERR_INVAL);
    assert_int_equal(sc.kv_dtype, KVF_KV_INT8); /* left as it was */
    f = (kvf_backend_flags_t){.backend = "tpu"};
    assert_int_equal(kvf_backend_flags_apply(&f, &sc), KVF_ERR_INVAL);
    f = (kvf_backend_flags_t){.backend = "cuda", .gpu_dtype = "int4"};
    assert_int_equal(kvf_backend_flags_apply(&f, &sc), KVF_ERR_INVAL);
    f = (kvf_backend_flags_t){.backend = "cuda", .device = -1};
    assert_int_equal(kvf_backend_flags_apply(&f, &sc), KVF_ERR_INVAL);
    assert_string_equal(kvf_backend_kind_name(KVF_BACKEND_CUDA), "cuda");
    assert_string_equal(kvf_backend_kind_name(KVF_BACKEND_CPU), "cpu");
}

int main(void)
{
    kvf_log_set_level(KVF_LOG_OFF); /* the checks refuse on purpose; their logs are noise here */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_elementwise_checks), cmocka_unit_test(test_attention_checks),
        cmocka_unit_test(test_device_pool),        cmocka_unit_test(test_greedy_token_cpu),
        cmocka_unit_test(test_backend_flags),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
