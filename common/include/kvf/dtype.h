/* Element types of weights and KV caches, and their conversions to f32.
 *
 * Conversions are exact where the format allows: bf16 is the top half of an
 * f32 (f32_bits = bf16_bits << 16); f16 covers subnormals, infinities and
 * NaN. */
#ifndef KVF_DTYPE_H
#define KVF_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kvf/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KVF_DTYPE_F32 = 0,
    KVF_DTYPE_F16 = 1,
    KVF_DTYPE_BF16 = 2,
    KVF_DTYPE_UNKNOWN = 3, /* a type this build does not read (I64, F64, ...) */
} kvf_dtype_t;

/* Bytes per element; 0 for KVF_DTYPE_UNKNOWN. */
size_t kvf_dtype_size(kvf_dtype_t dtype);

/* Lowercase name ("f32", "f16", "bf16", "unknown"); never NULL. */
const char *kvf_dtype_name(kvf_dtype_t dtype);

/* Parses "f32"/"F32"/"float32", "f16"/"F16"/"float16", "bf16"/"BF16"/"bfloat16". */
kvf_status_t kvf_dtype_parse(const char *name, kvf_dtype_t *dtype_p);

static inline float kvf_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

/* Round to nearest even; NaN stays NaN. */
static inline uint16_t kvf_f32_to_bf16(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof(bits));
    if ((bits & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((bits >> 16) | 0x40u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

float kvf_f16_to_f32(uint16_t h);
uint16_t kvf_f32_to_f16(float f);

/* Converts n elements of src (type dtype, little-endian, any alignment) to
 * f32 in dst. */
void kvf_dtype_to_f32(float *dst, const void *src, kvf_dtype_t dtype, size_t n);

#ifdef __cplusplus
}
#endif

#endif
