/* The CPU backend's reading of every KV format is kvf/kv_format.h's
 * decoders, code for code, on every instruction set this machine runs:
 * every f16 and bf16 code, every fp8 and int8 code with a row scale that
 * rounds, placed as V rows of one-key sequences (a query at position 0
 * over one key returns that key's value row: p = 1, l = 1). NaN codes
 * read back as NaN; -0 reads back as +0 (0 + 1 * -0). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kvf/backend.h"
#include "kvf/kv_format.h"
#include "kvf/kvcache.h"
#include "support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { HD = 64 };

/* The f32 value of code c of dt with scale (the reference decoders). */
static float reference(kvf_kv_dtype_t dt, uint32_t c, float scale)
{
    switch (dt) {
    case KVF_KV_F16: return kvf_kv_f16_decode((uint16_t)c);
    case KVF_KV_BF16: return kvf_kv_bf16_decode((uint16_t)c);
    case KVF_KV_FP8: return kvf_kv_fp8_decode((uint8_t)c) * scale;
    default: return (float)(int8_t)(uint8_t)c * scale;
    }
}

/* Every code of dt as V rows; the attention output against reference. */
static void check_codes(kvf_backend_t *be, kvf_kv_dtype_t dt, float scale, const char *isa)
{
    const uint32_t n_codes = kvf_kv_elem_bytes(dt) == 2 ? 65536u : 256u;
    const int rows = (int)(n_codes / HD);
    kvf_kv_geometry_t g = {.n_layers = 1, .n_kv_heads = 1, .head_dim = HD, .block_size = 1,
                           .dtype = dt};
    kvf_kvpool_t *pool;
    assert_int_equal(kvf_kvpool_create(&g, (uint32_t)rows, &pool), KVF_OK);
    kvf_block_table_t *bt = calloc((size_t)rows, sizeof(*bt));
    const uint32_t **tables = calloc((size_t)rows, sizeof(*tables));
    int32_t *pos = calloc((size_t)rows, sizeof(int32_t)), *seq = calloc((size_t)rows, 4);
    for (int r = 0; r < rows; r++) {
        kvf_block_table_init(&bt[r]);
        assert_int_equal(kvf_block_table_reserve(&bt[r], pool, 1), KVF_OK);
        tables[r] = bt[r].blocks;
        seq[r] = r;
        char *vd = kvf_kvpool_head_data(pool, bt[r].blocks[0], 0, 1, 0);
        for (int i = 0; i < HD; i++) {
            uint32_t c = (uint32_t)(r * HD + i);
            if (kvf_kv_elem_bytes(dt) == 2) {
                uint16_t h = (uint16_t)c;
                memcpy(vd + 2 * i, &h, 2);
            } else {
                vd[i] = (char)(uint8_t)c;
            }
        }
        if (kvf_kv_scaled(dt)) {
            kvf_kvpool_head_scales(pool, bt[r].blocks[0], 0, 0, 0)[0] = 1.0f;
            kvf_kvpool_head_scales(pool, bt[r].blocks[0], 0, 1, 0)[0] = scale;
        }
    }
    float *q = calloc((size_t)rows * HD, sizeof(float));
    float *out = malloc((size_t)rows * HD * sizeof(float));
    kvf_batch_layout_t b = {.n_tokens = rows, .pos = pos, .seq = seq, .n_seqs = rows,
                            .block_tables = tables};
    assert_int_equal(be->ops->attention(be->ctx, out, q, HD, pool, 0, 1, &b), KVF_OK);
    int nan_codes = 0;
    for (uint32_t c = 0; c < n_codes; c++) {
        float want = reference(dt, c, scale), got = out[c];
        if (isnan(want)) {
            nan_codes++;
            if (!isnan(got))
                fail_msg("kv %s on %s: code %#x reads %g, want NaN", kvf_kv_dtype_name(dt), isa,
                         c, got);
        } else if (!(got == want)) {
            fail_msg("kv %s on %s: code %#x (scale %g) reads %.9g, want %.9g",
                     kvf_kv_dtype_name(dt), isa, c, scale, got, want);
        }
    }
    /* the NaN codes of each format: f16 2 x 1023, bf16 2 x 127, fp8 2, int8 none */
    const int want_nans[KVF_KV_N_DTYPES] = {0, 2046, 254, 2, 0};
    assert_int_equal(nan_codes, want_nans[dt]);
    for (int r = 0; r < rows; r++) {
        kvf_block_table_release(&bt[r], pool);
        kvf_block_table_fini(&bt[r]);
    }
    assert_int_equal(kvf_kvpool_used_blocks(pool), 0);
    kvf_kvpool_destroy(pool);
    free(bt);
    free(tables);
    free(pos);
    free(seq);
    free(q);
    free(out);
}

static void test_every_code(void **state)
{
    (void)state;
    kvf_cpu_isa_t isas[KVF_CPU_ISA_COUNT];
    int n = kvf_test_cpu_isas(isas);
    const kvf_kv_dtype_t dts[] = {KVF_KV_F16, KVF_KV_BF16, KVF_KV_FP8, KVF_KV_INT8};
    for (int i = 0; i < n; i++) {
        kvf_backend_t be;
        kvf_test_cpu_backend(&be, 2, isas[i], KVF_CPU_WEIGHTS_NATIVE);
        for (int d = 0; d < 4; d++) {
            check_codes(&be, dts[d], 1.0f, kvf_cpu_isa_name(isas[i]));
            if (kvf_kv_scaled(dts[d])) {
                check_codes(&be, dts[d], 0.0371f, kvf_cpu_isa_name(isas[i]));
                check_codes(&be, dts[d], 3.1e-41f, kvf_cpu_isa_name(isas[i])); /* subnormal */
            }
        }
        kvf_backend_destroy(&be);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_code),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
