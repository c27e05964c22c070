// Stand-in for CUDA's <cuda_fp16.h> under the CPU emulator (../emu.h): the
// binary16 storage type and the conversions the kernels use. They round
// exactly as the device's cvt.rn.f16.f32 does: to nearest, ties to even,
// into the subnormals below 2^-14, to infinity from 65520 up, and a NaN
// becomes the canonical 0x7fff. Written from the IEEE definition, not from
// kvf/dtype.h, so the tests compare two implementations.
#ifndef KVF_CUDA_EMU_FP16_H
#define KVF_CUDA_EMU_FP16_H

#include <stdint.h>
#include <string.h>

struct __half {
    unsigned short __x; // the bits, as in CUDA's type
};

// Rounds m >> shift to nearest, ties to even (1 <= shift <= 31).
inline uint32_t kvf_emu_round_shift(uint32_t m, unsigned shift)
{
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    return q + (rem > half || (rem == half && (q & 1u)));
}

inline __half __float2half_rn(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    __half r;
    if (a > 0x7f800000u) {
        r.__x = 0x7fffu;
    } else if (a >= 0x477ff000u) {
        r.__x = (unsigned short)(sign | 0x7c00u); // 65520 and up (and inf) round to inf
    } else if (a >= 0x38800000u) {
        // Normal (2^-14 and up): rebias the exponent (127 -> 15) and round
        // off 13 mantissa bits; a carry into the exponent is right.
        r.__x = (unsigned short)(sign | kvf_emu_round_shift(a - (112u << 23), 13));
    } else if (a >= 0x33000000u) {
        // 2^-25 .. 2^-14: a multiple of the subnormal unit 2^-24. The value
        // is m * 2^(e - 150) with the 24-bit significand m and biased
        // exponent e; in units, m >> (126 - e). Rounding up from the largest
        // subnormal gives 0x400, the smallest normal: right again.
        uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
        r.__x = (unsigned short)(sign | kvf_emu_round_shift(m, 126u - e));
    } else {
        r.__x = (unsigned short)sign; // below half the smallest subnormal
    }
    return r;
}

inline __half __float2half(float f)
{
    return __float2half_rn(f);
}

inline float __half2float(__half h)
{
    const uint32_t sign = (uint32_t)(h.__x & 0x8000u) << 16;
    uint32_t e = (h.__x >> 10) & 0x1fu, m = h.__x & 0x3ffu, u;
    if (e == 31) {
        u = sign | 0x7f800000u | (m << 13);
    } else if (e != 0) {
        u = sign | ((e + 112u) << 23) | (m << 13);
    } else if (m == 0) {
        u = sign;
    } else {
        // Subnormal m * 2^-24: shift m up to the implicit bit, one exponent
        // step per shift.
        e = 113;
        while (!(m & 0x400u)) {
            m <<= 1;
            e--;
        }
        u = sign | (e << 23) | ((m & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

// The value with these bits, as CUDA's __ushort_as_half.
inline __half __ushort_as_half(unsigned short x)
{
    __half r;
    r.__x = x;
    return r;
}

#endif
