/* NEON kernels (AArch64 Advanced SIMD, present on every AArch64 CPU):
 * cpu_kernels_vec.h over 4-float vectors. Same bits as
 * cpu_kernels_scalar.c. */
#include "cpu_canon.h"
#include "cpu_kernels.h"

#if defined(__aarch64__)
#include <arm_neon.h>

typedef float32x4_t vf;
#define VL 4
#define V_ZERO() vdupq_n_f32(0.0f)
#define V_SET1(x) vdupq_n_f32(x)
#define V_LOAD(p) vld1q_f32(p)
#define V_STORE(p, v) vst1q_f32((p), (v))
#define V_ADD(a, b) vaddq_f32((a), (b))
#define V_SUB(a, b) vsubq_f32((a), (b))
#define V_MUL(a, b) vmulq_f32((a), (b))
#define V_DIV(a, b) vdivq_f32((a), (b))
#define V_NEG(a) vnegq_f32(a)
#define V_FMA(a, b, c) vfmaq_f32((c), (a), (b))
#define V_MAXF(a, b) vmaxq_f32((a), (b))
#define V_MINF(a, b) vminq_f32((a), (b))
#define V_ROUND(x) vrndnq_f32(x)
#define V_EXP2I(n) \
    vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127)), 23))
#define V_LOAD_BF16(p) vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16))
#define V_LOAD_F16(p) vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)))
#define KFN(name) name##_neon

/* The 16-lane tree of cpu_canon.h on lanes 0-3, 4-7, 8-11, 12-15. */
static inline __attribute__((always_inline)) float tree16(vf v0, vf v1, vf v2, vf v3)
{
    vf a0 = vaddq_f32(v0, v2), a1 = vaddq_f32(v1, v3); /* l + l+8 */
    vf b = vaddq_f32(a0, a1);                          /* l + l+4 */
    float32x2_t c = vadd_f32(vget_low_f32(b), vget_high_f32(b)); /* l + l+2 */
    return vget_lane_f32(c, 0) + vget_lane_f32(c, 1);
}

static inline __attribute__((always_inline)) float dot16(const float *q, const float *k, int hd)
{
    vf v0 = V_ZERO(), v1 = V_ZERO(), v2 = V_ZERO(), v3 = V_ZERO();
    int d = 0;
    for (; d + 16 <= hd; d += 16) {
        v0 = vfmaq_f32(v0, vld1q_f32(q + d), vld1q_f32(k + d));
        v1 = vfmaq_f32(v1, vld1q_f32(q + d + 4), vld1q_f32(k + d + 4));
        v2 = vfmaq_f32(v2, vld1q_f32(q + d + 8), vld1q_f32(k + d + 8));
        v3 = vfmaq_f32(v3, vld1q_f32(q + d + 12), vld1q_f32(k + d + 12));
    }
    if (d < hd) {
        float qa[16] = {0}, ka[16] = {0};
        memcpy(qa, q + d, (size_t)(hd - d) * sizeof(float));
        memcpy(ka, k + d, (size_t)(hd - d) * sizeof(float));
        v0 = vfmaq_f32(v0, vld1q_f32(qa), vld1q_f32(ka));
        v1 = vfmaq_f32(v1, vld1q_f32(qa + 4), vld1q_f32(ka + 4));
        v2 = vfmaq_f32(v2, vld1q_f32(qa + 8), vld1q_f32(ka + 8));
        v3 = vfmaq_f32(v3, vld1q_f32(qa + 12), vld1q_f32(ka + 12));
    }
    return tree16(v0, v1, v2, v3);
}
#define DOT16(q, k, hd) dot16((q), (k), (hd))

/* The largest of s[ja .. nj-1], NaN ignored, -inf if none. */
static inline __attribute__((always_inline)) float hmax16(const float *s, int ja, int nj)
{
    float mc = -INFINITY;
    for (int j = ja; j < nj; j++)
        mc = s[j] > mc ? s[j] : mc;
    return mc;
}
#define HMAX16(s, ja, nj) hmax16((s), (ja), (nj))
#define TREE16P(p) tree16(vld1q_f32(p), vld1q_f32((p) + 4), vld1q_f32((p) + 8), vld1q_f32((p) + 12))
#define DOT16X16S(q, base, ld, hd, out)                                                            \
    do {                                                                                           \
        for (int j_ = 0; j_ < 16; j_++)                                                            \
            (out)[j_] = dot16((q), (base) + (size_t)j_ * (ld), (hd));                              \
    } while (0)

/* The KV decodes: kvf/kv_format.h's own, element by element. */
static void decode_row_neon(kvf_kv_dtype_t dt, const void *src, const float *scales, int n_rows,
                            int n, float *out, int ld_out)
{
    const size_t row_bytes = (size_t)n * kvf_kv_elem_bytes(dt);
    for (int r = 0; r < n_rows; r++)
        kvf_kv_decode_row(dt, (const char *)src + (size_t)r * row_bytes, scales ? scales[r] : 1.0f,
                          n, out + (size_t)r * (size_t)ld_out);
}

#define DECODE_ROWS(dt, src, scales, n_rows, n, out, ld) \
    decode_row_neon((dt), (src), (scales), (n_rows), (n), (out), (ld))

/* 32 q registers: decode rows x 1-2 panels (8 accumulators a row and
 * panel), and 4 rows x half a panel (16) for larger batches. */
#define SMALL_M 3
#define SMALL_P(M) ((M) == 1 ? 2 : 1)
#define SMALL_CASES SMALL_CASE(1) SMALL_CASE(2) SMALL_CASE(3)
#define BIG_MR 4
#define BIG_P 1
#define BIG_NV 4
#define BIG_CASES BIG_CASE(1) BIG_CASE(2) BIG_CASE(3) BIG_CASE(4)
#define TILE_ACC_MAX 24
#define TILE_W_MAX 16

#define ISA_ID KVF_CPU_ISA_NEON
#define SMALL_PANELS_PER_TASK 4

#include "cpu_kernels_vec.h"

#endif
