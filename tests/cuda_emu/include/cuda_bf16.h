// Stand-in for CUDA's <cuda_bf16.h> under the CPU emulator (../emu.h): the
// bfloat16 storage type and the conversions the kernels use. They round
// exactly as the device's cvt.rn.bf16.f32 does: to nearest, ties to even,
// overflow to infinity, subnormals kept, and a NaN becomes the canonical
// 0x7fff (the CPU code's kvf_f32_to_bf16 keeps the payload instead; both
// are NaN). Written from the IEEE definition, not from kvf/dtype.h, so the
// tests compare two implementations.
#ifndef KVF_CUDA_EMU_BF16_H
#define KVF_CUDA_EMU_BF16_H

#include <stdint.h>
#include <string.h>

struct __nv_bfloat16 {
    unsigned short __x; // the bits, as in CUDA's type
};

inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    __nv_bfloat16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        r.__x = 0x7fffu;
        return r;
    }
    // bf16 is the top half of an f32: add half of the dropped half's range,
    // less one unless the kept part is odd (ties to even). A carry runs into
    // the exponent, which is the right result (up to infinity).
    u += 0x7fffu + ((u >> 16) & 1u);
    r.__x = (unsigned short)(u >> 16);
    return r;
}

inline __nv_bfloat16 __float2bfloat16(float f)
{
    return __float2bfloat16_rn(f);
}

inline float __bfloat162float(__nv_bfloat16 h)
{
    uint32_t u = (uint32_t)h.__x << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

// The value with these bits, as CUDA's __ushort_as_bfloat16.
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short x)
{
    __nv_bfloat16 r;
    r.__x = x;
    return r;
}

#endif
