#include "kvf/dtype.h"

#include <math.h>
#include <strings.h>

size_t kvf_dtype_size(kvf_dtype_t dtype)
{
    switch (dtype) {
    case KVF_DTYPE_F32: return 4;
    case KVF_DTYPE_F16: return 2;
    case KVF_DTYPE_BF16: return 2;
    case KVF_DTYPE_UNKNOWN: return 0;
    }
    return 0;
}

const char *kvf_dtype_name(kvf_dtype_t dtype)
{
    switch (dtype) {
    case KVF_DTYPE_F32: return "f32";
    case KVF_DTYPE_F16: return "f16";
    case KVF_DTYPE_BF16: return "bf16";
    case KVF_DTYPE_UNKNOWN: return "unknown";
    }
    return "unknown";
}

kvf_status_t kvf_dtype_parse(const char *name, kvf_dtype_t *dtype_p)
{
    if (!name)
        return KVF_ERR_INVAL;
    if (!strcasecmp(name, "f32") || !strcasecmp(name, "float32"))
        *dtype_p = KVF_DTYPE_F32;
    else if (!strcasecmp(name, "f16") || !strcasecmp(name, "float16"))
        *dtype_p = KVF_DTYPE_F16;
    else if (!strcasecmp(name, "bf16") || !strcasecmp(name, "bfloat16"))
        *dtype_p = KVF_DTYPE_BF16;
    else
        return KVF_ERR_INVAL;
    return KVF_OK;
}

float kvf_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24, exact in f32 */
        float v = ldexpf((float)mant, -24);
        memcpy(&bits, &v, sizeof(bits));
        bits |= sign;
    } else if (exp == 31) {
        /* infinity; a NaN quieted, its payload kept (as F16C and NEON convert) */
        bits = sign | 0x7f800000u | (mant ? 0x400000u : 0) | (mant << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

uint16_t kvf_f32_to_f16(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof(bits));
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    float a = fabsf(f);
    if (isnan(f))
        return sign | 0x7e00u;
    if (a >= 65520.0f)
        return sign | 0x7c00u;
    if (a < 6.103515625e-05f) {
        /* subnormal range: round a * 2^24 to the nearest integer (even on ties) */
        float m = nearbyintf(a * 16777216.0f);
        return sign | (uint16_t)m;
    }
    uint32_t ab = bits & 0x7fffffffu;
    uint32_t rounded = ab + 0xfffu + ((ab >> 13) & 1u);
    return sign | (uint16_t)((rounded >> 13) - (112u << 10));
}

void kvf_dtype_to_f32(float *dst, const void *src, kvf_dtype_t dtype, size_t n)
{
    const uint8_t *s = src;
    switch (dtype) {
    case KVF_DTYPE_F32:
        memcpy(dst, src, n * sizeof(float));
        break;
    case KVF_DTYPE_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = (uint16_t)(s[2 * i] | (s[2 * i + 1] << 8));
            dst[i] = kvf_f16_to_f32(h);
        }
        break;
    case KVF_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = (uint16_t)(s[2 * i] | (s[2 * i + 1] << 8));
            dst[i] = kvf_bf16_to_f32(h);
        }
        break;
    case KVF_DTYPE_UNKNOWN:
        break;
    }
}
