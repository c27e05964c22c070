// Causal prefill attention on tensor cores, for 16-bit activations (bf16 or
// f16 weights): the same tiles, masking and online softmax as
// attention_prefill.cu, with Q K^T and P V as warp matrix products (WMMA,
// 16 x 16 x 16, f32 accumulation).
//
// Why: in a 2048-token prefill of a 1B-class model attention is a tenth of
// the FLOPs; on CUDA cores in f32 it would take longer than every GEMM of
// the forward together. The f32 kernel stays for f32 activations (exact
// comparisons with the CPU) and head dims that are not a multiple of 16.
//
// Work split: one CTA per (tile, kv head g), 4 warps; the CTA's 64 query
// rows are the (token, query head) pairs of g's group (row = token * group
// + head_in_group), so each K/V element is loaded once per group, and warp
// w owns rows 16 w .. 16 w + 15 for the whole kernel: after the K/V chunk
// is in shared memory (the only CTA-wide step), a warp touches its own rows
// of S, P and O alone.
//
// Per chunk of 64 keys:
//   K, V (64, hd) from the pool -> T in shared memory (missing keys 0):
//     decoded to f32 and rounded to T, or copied when the pool holds T's
//     own 16-bit format (bf16 K/V for bf16 activations, f16 for f16);
//   S = Q K^T (16 x 64 per warp: 4 x hd/16 products) -> shared, f32;
//   per row: scale, causal mask, m' = max(m, max S), P = exp(S - m') -> T,
//     alpha = exp(m - m'), l' = l alpha + sum P (the f32 values);
//   O (shared, f32) *= alpha per row, then O += P V (hd/16 x 4 products).
// Finally out = O / l in T. Accumulator fragments have no documented
// element-to-row mapping, so O lives in shared memory between chunks and
// the per-row rescale is done there.
#include <mma.h>

#include "attention_common.cuh"
#include "kvf/log.h"

#include <math.h>

#define TC_ROWS    KVF_CUDA_PREFILL_ROWS // query rows per CTA
#define TC_KEYS    64                    // keys per chunk
#define TC_WARPS   4                     // 16 rows each
#define TC_THREADS (TC_WARPS * 32)

static_assert(TC_ROWS == 16 * TC_WARPS, "each warp owns 16 rows");

// Shared-memory layout for head dim hd (a multiple of 16). Padding: rows of
// 16-bit tiles are hd + 8 elements (WMMA wants a multiple of 8 and 32-byte
// aligned tile starts; the pad also spreads rows over banks), f32 tiles hd
// + 4. Every section's size is a multiple of 128 bytes, so every section
// and every 16-row tile inside it starts 32-byte aligned.
typedef struct {
    int ldq, lds, ldp, ldo;
    size_t q, k, v, p, s, o, key_off, sc, row_pos, m, l, alpha, total; // byte offsets
} tc_layout_t;

static __host__ __device__ size_t tc_round(size_t x)
{
    return (x + 127) & ~(size_t)127;
}

static __host__ __device__ tc_layout_t tc_layout(int hd)
{
    tc_layout_t L;
    L.ldq = hd + 8;
    L.lds = TC_KEYS + 4;
    L.ldp = TC_KEYS + 8;
    L.ldo = hd + 4;
    size_t off = 0;
    L.q = off;
    off += tc_round((size_t)TC_ROWS * L.ldq * 2);
    L.k = off;
    off += tc_round((size_t)TC_KEYS * L.ldq * 2);
    L.v = off;
    off += tc_round((size_t)TC_KEYS * L.ldq * 2);
    L.p = off;
    off += tc_round((size_t)TC_ROWS * L.ldp * 2);
    L.s = off;
    off += tc_round((size_t)TC_ROWS * L.lds * 4);
    L.o = off;
    off += tc_round((size_t)TC_ROWS * L.ldo * 4);
    L.key_off = off;
    off += tc_round((size_t)TC_KEYS * 8);
    L.sc = off;
    off += tc_round((size_t)TC_KEYS * 2 * 4);
    L.row_pos = off;
    off += tc_round((size_t)TC_ROWS * 4);
    L.m = off;
    off += tc_round((size_t)TC_ROWS * 4);
    L.l = off;
    off += tc_round((size_t)TC_ROWS * 4);
    L.alpha = off;
    off += tc_round((size_t)TC_ROWS * 4);
    L.total = off;
    return L;
}

// Grid (n_tiles, n_kv_heads), TC_THREADS threads; T is __nv_bfloat16 or
// __half, the activation type (out) and the type of the products' inputs.
template <typename T>
__global__ void __launch_bounds__(TC_THREADS)
    kvf_attn_prefill_tc_kernel(kvf_cuda_attn_t a, const int32_t *__restrict__ tiles)
{
    using namespace nvcuda;
    extern __shared__ __align__(128) unsigned char kvf_tc_smem[];

    const int hd = a.head_dim, group = a.n_heads / a.n_kv_heads;
    const int g = blockIdx.y;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const tc_layout_t L = tc_layout(hd);
    T *q_s = (T *)(kvf_tc_smem + L.q);                           // (TC_ROWS, ldq)
    T *k_s = (T *)(kvf_tc_smem + L.k);                           // (TC_KEYS, ldq)
    T *v_s = (T *)(kvf_tc_smem + L.v);                           // (TC_KEYS, ldq)
    T *p_s = (T *)(kvf_tc_smem + L.p);                           // (TC_ROWS, ldp)
    float *s_s = (float *)(kvf_tc_smem + L.s);                   // (TC_ROWS, lds)
    float *o_s = (float *)(kvf_tc_smem + L.o);                   // (TC_ROWS, ldo)
    long long *key_off = (long long *)(kvf_tc_smem + L.key_off); // (TC_KEYS)
    float *ksc_s = (float *)(kvf_tc_smem + L.sc);                // (TC_KEYS) K scales
    float *vsc_s = ksc_s + TC_KEYS;                              // (TC_KEYS) V scales
    int *row_pos = (int *)(kvf_tc_smem + L.row_pos);             // (TC_ROWS) -1: inactive
    float *m_s = (float *)(kvf_tc_smem + L.m);                   // (TC_ROWS) running max
    float *l_s = (float *)(kvf_tc_smem + L.l);                   // (TC_ROWS) running sum
    float *alpha_s = (float *)(kvf_tc_smem + L.alpha);           // (TC_ROWS) this chunk's rescale

    // The host checks tiles; clamp anyway (the same branch in every thread).
    int first = 0;
    const int count = kvf_attn_prefill_tile(a, tiles, TC_ROWS, group, &first);
    if (count <= 0)
        return;
    const int n_rows = count * group;
    const int seq = a.seq[first];
    const int32_t *bt = kvf_attn_table(a, seq);

    // Q rows (inactive ones zero), O = 0, softmax state.
    for (int idx = tid; idx < TC_ROWS * hd; idx += TC_THREADS) {
        int r = idx / hd, d = idx - r * hd;
        float qv = 0.0f;
        if (r < n_rows) {
            int tok = r / group, h = g * group + r % group;
            qv = a.q[(size_t)(first + tok) * (size_t)a.ld_q + (size_t)h * hd + d];
        }
        q_s[r * L.ldq + d] = kvf_from_f32<T>(qv);
        o_s[r * L.ldo + d] = 0.0f;
    }
    if (tid < TC_ROWS) {
        row_pos[tid] = tid < n_rows ? a.pos[first + tid / group] : -1;
        m_s[tid] = -INFINITY;
        l_s[tid] = 0.0f;
    }
    __syncthreads();
    int last = -1, first_pos = INT_MAX;
    for (int r = 0; r < n_rows; r += group) {
        last = max(last, row_pos[r]);
        first_pos = min(first_pos, row_pos[r]);
    }
    const int n_keys = last + 1;
    // Under a sliding window, chunks wholly before every row's window are skipped.
    const int k_begin = n_rows > 0 ? kvf_attn_first_key(a, first_pos) / TC_KEYS * TC_KEYS : 0;
    const int r0 = 16 * warp; // this warp's first row

    for (int k0 = k_begin; k0 < n_keys; k0 += TC_KEYS) {
        if (tid < TC_KEYS)
            kvf_attn_chunk_key(a, bt, k0 + tid, n_keys, g, key_off, ksc_s, vsc_s, tid);
        // Also: every warp is done with the previous chunk's k_s / v_s.
        __syncthreads();
        kvf_attn_load_kv<T>(a, key_off, ksc_s, vsc_s, TC_KEYS, k_s, L.ldq, v_s, L.ldq, TC_THREADS);
        __syncthreads();

        // S (this warp's 16 rows x 64 keys) = Q K^T.
        for (int kb = 0; kb < TC_KEYS / 16; kb++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::fill_fragment(acc, 0.0f);
            for (int d0 = 0; d0 < hd; d0 += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
                wmma::load_matrix_sync(fa, q_s + r0 * L.ldq + d0, L.ldq);
                // K^T as a (hd, keys) column-major matrix is K's rows.
                wmma::load_matrix_sync(fb, k_s + (16 * kb) * L.ldq + d0, L.ldq);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            wmma::store_matrix_sync(s_s + r0 * L.lds + 16 * kb, acc, L.lds, wmma::mem_row_major);
        }
        __syncwarp();

        // Online softmax over the chunk, row by row; lanes take keys lane
        // and lane + 32.
        for (int i = 0; i < 16; i++) {
            const int r = r0 + i, rp = row_pos[r], lo = kvf_attn_first_key(a, rp);
            const int p0k = k0 + lane, p1k = k0 + lane + 32;
            float s0 = p0k <= rp && p0k >= lo
                           ? kvf_attn_softcap(s_s[r * L.lds + lane] * a.scale, a.softcap)
                           : -INFINITY;
            float s1 = p1k <= rp && p1k >= lo
                           ? kvf_attn_softcap(s_s[r * L.lds + lane + 32] * a.scale, a.softcap)
                           : -INFINITY;
            const float m_old = m_s[r], l_old = l_s[r];
            const float m_new = fmaxf(m_old, kvf_warp_max(fmaxf(s0, s1)));
            // No key of this row yet: exponentials against 0 give 0, not NaN.
            const float m_ref = m_new == -INFINITY ? 0.0f : m_new;
            const float p0 = expf(s0 - m_ref), p1 = expf(s1 - m_ref);
            p_s[r * L.ldp + lane] = kvf_from_f32<T>(p0);
            p_s[r * L.ldp + lane + 32] = kvf_from_f32<T>(p1);
            const float alpha = expf(m_old - m_ref); // 0 while m_old is -inf
            const float sum = kvf_warp_sum(p0 + p1); // every lane has read m_s, l_s
            if (lane == 0) {
                m_s[r] = m_new;
                l_s[r] = l_old * alpha + sum;
                alpha_s[r] = alpha;
            }
        }
        __syncwarp();
        for (int idx = lane; idx < 16 * hd; idx += 32) {
            int r = r0 + idx / hd, d = idx % hd;
            o_s[r * L.ldo + d] *= alpha_s[r];
        }
        __syncwarp();

        // O (16 x hd) += P (16 x 64) V (64 x hd).
        for (int d0 = 0; d0 < hd; d0 += 16) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::load_matrix_sync(acc, o_s + r0 * L.ldo + d0, L.ldo, wmma::mem_row_major);
            for (int kb = 0; kb < TC_KEYS / 16; kb++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
                wmma::load_matrix_sync(fa, p_s + r0 * L.ldp + 16 * kb, L.ldp);
                wmma::load_matrix_sync(fb, v_s + (16 * kb) * L.ldq + d0, L.ldq);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            wmma::store_matrix_sync(o_s + r0 * L.ldo + d0, acc, L.ldo, wmma::mem_row_major);
        }
        __syncwarp();
    }
    __syncthreads();

    T *out = (T *)a.out;
    for (int idx = tid; idx < n_rows * hd; idx += TC_THREADS) {
        const int r = idx / hd, d = idx - r * hd;
        const int tok = r / group, h = g * group + r % group;
        // l >= 1 for a row with a valid position; 0 only for a negative
        // one, whose output is then 0.
        const float l = l_s[r];
        out[(size_t)(first + tok) * (size_t)a.ld_out + (size_t)h * hd + d] =
            kvf_from_f32<T>(l > 0.0f ? o_s[r * L.ldo + d] / l : 0.0f);
    }
}

template <typename T>
static kvf_status_t kvf_attn_prefill_tc_launch(cudaStream_t st, const kvf_cuda_attn_t *a,
                                               const kvf_cuda_prefill_tiles_t *t)
{
    // Opt in once to the largest head dim's need, a constant, so a
    // concurrent launch for a smaller head dim never lowers it.
    const size_t cap = tc_layout(128).total;
    kvf_status_t s =
        KVF_CUDA_TRY(cudaFuncSetAttribute(kvf_attn_prefill_tc_kernel<T>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, (int)cap),
                     "attention prefill (tensor cores): shared memory opt-in");
    if (s != KVF_OK)
        return s;
    dim3 grid((unsigned)t->n_tiles, (unsigned)a->n_kv_heads);
    kvf_attn_prefill_tc_kernel<T>
        <<<grid, TC_THREADS, tc_layout(a->head_dim).total, st>>>(*a, t->tiles);
    return KVF_CUDA_LAUNCHED("attention prefill (tensor cores)");
}

kvf_status_t kvf_cuda_attention_prefill_tc(cudaStream_t st, const kvf_cuda_attn_t *a,
                                           const kvf_cuda_prefill_tiles_t *t)
{
    kvf_status_t s = kvf_cuda_check_attention(a);
    if (s != KVF_OK)
        return s;
    s = kvf_cuda_check_prefill_tiles(a, t);
    if (s != KVF_OK || t->n_tiles == 0)
        return s;
    if (!kvf_cuda_prefill_tc_ok(a)) {
        kvf_log_error("cuda attention (tensor cores): %s activations, head dim %d: needs bf16 "
                      "or f16 and a multiple of 16 up to 128",
                      kvf_dtype_name(a->adt), a->head_dim);
        return KVF_ERR_UNSUPPORTED;
    }
    if (a->adt == KVF_DTYPE_BF16)
        return kvf_attn_prefill_tc_launch<__nv_bfloat16>(st, a, t);
    return kvf_attn_prefill_tc_launch<__half>(st, a, t);
}
