/* Weight panels for the CPU kernels (cpu_kernels.h). */
#include "cpu_kernels.h"

#include <stdlib.h>
#include <string.h>

kvf_status_t kvf_cpu_pack(kvf_cpu_packed_t *p, const float *w, int n, int k, kvf_dtype_t dtype)
{
    if (n <= 0 || k <= 0 ||
        (dtype != KVF_DTYPE_F32 && dtype != KVF_DTYPE_BF16 && dtype != KVF_DTYPE_F16))
        return KVF_ERR_INVAL;
    int n_panels = (n + KVF_CPU_PANEL - 1) / KVF_CPU_PANEL;
    size_t elems = (size_t)n_panels * (size_t)k * KVF_CPU_PANEL;
    size_t esize = kvf_dtype_size(dtype);
    size_t bytes = (elems * esize + 63) & ~(size_t)63;
    void *data = aligned_alloc(64, bytes);
    if (!data)
        return KVF_ERR_NOMEM;
    float *d32 = data;
    uint16_t *d16 = data;
    for (int pn = 0; pn < n_panels; pn++) {
        size_t base = (size_t)pn * (size_t)k * KVF_CPU_PANEL;
        for (int c = 0; c < KVF_CPU_PANEL; c++) {
            int r = pn * KVF_CPU_PANEL + c;
            const float *wr = r < n ? w + (size_t)r * (size_t)k : NULL;
            for (int d = 0; d < k; d++) {
                float v = wr ? wr[d] : 0.0f;
                size_t at = base + (size_t)d * KVF_CPU_PANEL + (size_t)c;
                if (dtype == KVF_DTYPE_F32) {
                    d32[at] = v;
                    continue;
                }
                uint16_t h = dtype == KVF_DTYPE_BF16 ? kvf_f32_to_bf16(v) : kvf_f32_to_f16(v);
                float back = dtype == KVF_DTYPE_BF16 ? kvf_bf16_to_f32(h) : kvf_f16_to_f32(h);
                if (memcmp(&back, &v, sizeof(v)) != 0) {
                    free(data);
                    return KVF_ERR_INVAL;
                }
                d16[at] = h;
            }
        }
    }
    p->n = n;
    p->k = k;
    p->n_panels = n_panels;
    p->dtype = dtype;
    p->data = data;
    return KVF_OK;
}

void kvf_cpu_packed_free(kvf_cpu_packed_t *p)
{
    if (!p)
        return;
    free(p->data);
    memset(p, 0, sizeof(*p));
}

size_t kvf_cpu_packed_bytes(const kvf_cpu_packed_t *p)
{
    return (size_t)p->n_panels * (size_t)p->k * KVF_CPU_PANEL * kvf_dtype_size(p->dtype);
}
