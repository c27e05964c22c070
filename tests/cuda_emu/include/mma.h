// Stand-in for CUDA's <mma.h> (warp matrix products, nvcuda::wmma) under the
// CPU emulator (../emu.h): 16 x 16 x 16 fragments of __half or
// __nv_bfloat16 inputs with float accumulators, which is what the kernels
// use.
//
// A fragment is spread over the warp as on the device: each lane holds
// num_elements (8) elements of the 16 x 16 tile, element (r, c) in lane
// (16 r + c) % 32. The device's mapping is undocumented and differs; code
// that touches x[] must not depend on which elements a lane holds.
//
// load_matrix_sync and store_matrix_sync are each lane's own reads and
// writes, done when that lane gets there: data another lane wrote needs a
// __syncwarp (or __syncthreads) before the load, as for any shared memory,
// or the two thread orders disagree. mma_sync is a warp operation: when the
// last lane arrives, D = A B + C is computed once in f32 (exact products,
// fmaf in k order; the device's tensor cores round the sum differently) and
// each lane gets its part of D.
#ifndef KVF_CUDA_EMU_MMA_H
#define KVF_CUDA_EMU_MMA_H

#include "../emu.h"

namespace nvcuda
{
namespace wmma
{

struct matrix_a;
struct matrix_b;
struct accumulator;
struct row_major;
struct col_major;

enum layout_t {
    mem_row_major,
    mem_col_major,
};

template <typename Use, int M, int N, int K, typename T, typename Layout = void> class fragment
{
    static_assert(M == 16 && N == 16 && K == 16, "only 16 x 16 x 16 is emulated");

  public:
    static constexpr int num_elements = 16 * 16 / 32;
    T x[num_elements]; // this lane's elements: x[i] is tile element lane + 32 i (row-major)
};

namespace emu
{

inline float to_f32(float v)
{
    return v;
}
inline float to_f32(__half v)
{
    return __half2float(v);
}
inline float to_f32(__nv_bfloat16 v)
{
    return __bfloat162float(v);
}

// Tile element (r, c) of element i of this lane.
inline void coords(int i, int *r, int *c)
{
    int e = (int)kvf_emu::lane() + 32 * i;
    *r = e / 16;
    *c = e % 16;
}

template <typename T> inline void load(T *x, const T *p, unsigned ldm, bool row_major)
{
    for (int i = 0; i < 16 * 16 / 32; i++) {
        int r, c;
        coords(i, &r, &c);
        x[i] = row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
    }
}

// One lane's operands of mma_sync.
struct mma_args {
    float a[8], b[8], c[8]; // this lane's elements of A, B and C
    float *d;               // where this lane's elements of D go
};

inline void mma_complete(void *const *args, unsigned lanes)
{
    float a[16][16], b[16][16], c[16][16];
    for (unsigned lane = 0; lane < lanes; lane++) {
        const mma_args *m = (const mma_args *)args[lane];
        for (int i = 0; i < 8; i++) {
            int e = (int)lane + 32 * i;
            a[e / 16][e % 16] = m->a[i];
            b[e / 16][e % 16] = m->b[i];
            c[e / 16][e % 16] = m->c[i];
        }
    }
    for (unsigned lane = 0; lane < lanes; lane++) {
        const mma_args *m = (const mma_args *)args[lane];
        for (int i = 0; i < 8; i++) {
            int e = (int)lane + 32 * i, r = e / 16, col = e % 16;
            float acc = c[r][col];
            for (int k = 0; k < 16; k++)
                acc = fmaf(a[r][k], b[k][col], acc);
            m->d[i] = acc;
        }
    }
}

} // namespace emu

template <typename Use, typename T, typename L>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, L> &f, T v)
{
    for (int i = 0; i < f.num_elements; i++)
        f.x[i] = v;
}

template <typename Use, typename T>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, row_major> &f, const T *p, unsigned ldm)
{
    emu::load(f.x, p, ldm, true);
}

template <typename Use, typename T>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, col_major> &f, const T *p, unsigned ldm)
{
    emu::load(f.x, p, ldm, false);
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p,
                             unsigned ldm, layout_t layout)
{
    emu::load(f.x, p, ldm, layout == mem_row_major);
}

inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                              unsigned ldm, layout_t layout)
{
    for (int i = 0; i < f.num_elements; i++) {
        int r, c;
        emu::coords(i, &r, &c);
        if (layout == mem_row_major)
            p[(size_t)r * ldm + c] = f.x[i];
        else
            p[(size_t)c * ldm + r] = f.x[i];
    }
}

template <typename T, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                     const fragment<matrix_a, 16, 16, 16, T, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, T, LB> &b,
                     const fragment<accumulator, 16, 16, 16, float> &c)
{
    emu::mma_args m;
    for (int i = 0; i < 8; i++) {
        m.a[i] = emu::to_f32(a.x[i]);
        m.b[i] = emu::to_f32(b.x[i]);
        m.c[i] = c.x[i];
    }
    m.d = d.x; // written while this lane waits, after c was read
    kvf_emu::warp_collective(0xffffffffu, &m, emu::mma_complete);
}

} // namespace wmma
} // namespace nvcuda

#endif
