// Causal attention of prefill tiles over the paged KV pool: flash-attention
// style (tiled keys, online softmax), f32 math on CUDA cores.
//
// Work split: one CTA per (tile, kv head g). A tile is a run of consecutive
// tokens of one sequence with consecutive positions, so all its queries use
// one block table row and one key range, 0 .. the tile's last position. The
// CTA's query rows are the (token, query head) pairs of g's group,
// row = token * group + head_in_group (at most KVF_CUDA_PREFILL_ROWS), so
// every K/V element is read from the pool once per group instead of once
// per query head (GQA).
//
// Per CTA:
//   Q (rows, head_dim) -> shared memory, once.
//   for each chunk of KC keys from position 0 to the tile's last position:
//     K, V (KC, head_dim) -> shared memory. Key position p lives in block
//       block_tables[seq][p / block_size], slot p % block_size; chunks need
//       not line up with blocks, so each key is looked up on its own;
//     S = Q K^T * scale, -inf where the key comes after the row's position;
//     online softmax per row: m' = max(m, max_j S), alpha = exp(m - m'),
//       P = exp(S - m'), l' = l * alpha + sum_j P;
//     O = O * alpha + P V   (O lives in registers).
//   out = O / l, in the activation dtype.
//
// Why online softmax: a tile's context can be long (chunked prefill of a long
// prompt); keeping only (m, l, O) per row bounds shared memory by the chunk,
// not by the context. A row whose keys so far are all masked keeps m = -inf;
// its exponentials are taken against 0 instead of m so that no
// exp(-inf - -inf) = NaN appears.
//
// Block ids are checked against the pool here as well as on the host: an
// id outside the pool (or a position past the table row) reads as zero K and
// V instead of being dereferenced.
#include "attention_common.cuh"

#include <math.h>

#define PF_THREADS 256
#define PF_WARPS   (PF_THREADS / 32)
#define PF_ROWS    KVF_CUDA_PREFILL_ROWS
// P V phase: threads form PF_PV_RG row groups x PF_PV_CL column lanes; a
// thread owns rows rg + PF_PV_RG * i and columns cl + PF_PV_CL * c.
#define PF_PV_RG 16
#define PF_PV_CL 16

static_assert(PF_PV_RG * PF_PV_CL == PF_THREADS, "P V mapping covers the CTA");
static_assert(PF_ROWS % PF_PV_RG == 0 && PF_ROWS % PF_WARPS == 0, "rows split evenly");

// Dynamic shared memory of one CTA, in this order (floats unless said):
//   key_off (kc) int64   byte offset of each chunk key's K data row; -1: read zeros
//   k_sc, v_sc (kc each) its K and V scales (1 for an unscaled format)
//   row_pos (PF_ROWS) int position of each query row; -1: inactive row
//   alpha   (PF_ROWS)    this chunk's rescale factor of each row
//   l       (PF_ROWS)    final softmax denominator of each row
//   q       (PF_ROWS, hd + 1) query rows (pad: with kc 16 a warp reads 2 rows)
//   k       (kc, hd + 1) key chunk (pad: lanes read different keys at one d)
//   v       (kc, hd)     value chunk (lanes read consecutive d: no pad needed)
//   s       (PF_ROWS, kc + 1) scores, then probabilities (pad: a warp reads
//                        2 rows at one key in the P V phase)
//   sq      (PF_ROWS)    int8 pools: each q row's scale (kvf_attn_i8)
static __host__ __device__ size_t kvf_attn_prefill_smem_bytes(int hd, int kc)
{
    size_t floats = 2 * (size_t)kc + 2 * (size_t)PF_ROWS + (size_t)PF_ROWS * (size_t)(hd + 1) +
                    (size_t)kc * (size_t)(hd + 1) + (size_t)kc * (size_t)hd +
                    (size_t)PF_ROWS * (size_t)(kc + 1) + (size_t)PF_ROWS;
    return (size_t)kc * sizeof(long long) + (size_t)PF_ROWS * sizeof(int) + floats * sizeof(float);
}

// HD_CAP: head_dim rounded up to a size class (registers of O are sized by
// it; columns past head_dim are skipped). KC: keys per chunk, smaller for
// large head dims so shared memory stays near 100 KiB at head_dim 256.
// Grid (n_tiles, n_kv_heads), PF_THREADS threads.
template <int HD_CAP, int KC, typename T>
__global__ void __launch_bounds__(PF_THREADS)
    kvf_attn_prefill_kernel(kvf_cuda_attn_t a, const int32_t *__restrict__ tiles)
{
    static_assert(HD_CAP % PF_PV_CL == 0, "P V columns split evenly");
    static_assert(KC <= 64, "the softmax phase gives each lane at most two keys");
    static_assert(PF_THREADS % KC == 0 && PF_ROWS % (PF_THREADS / KC) == 0,
                  "S mapping covers the rows");
    extern __shared__ __align__(16) unsigned char kvf_prefill_smem[];

    const int hd = a.head_dim, group = a.n_heads / a.n_kv_heads;
    const int g = blockIdx.y;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    // The host checks tiles; clamp anyway so a bad one cannot reach outside
    // the batch or past PF_ROWS rows. Every thread takes the same branch.
    int first = 0;
    const int count = kvf_attn_prefill_tile(a, tiles, PF_ROWS, group, &first);
    if (count <= 0)
        return;
    const int n_rows = count * group;
    const int seq = a.seq[first];
    const int32_t *bt = kvf_attn_table(a, seq);
    // Keys are found by kvf_attn_key (attention_common.cuh).
    long long *key_off = (long long *)kvf_prefill_smem; // (KC)
    float *ksc_s = (float *)(key_off + KC);             // (KC)
    float *vsc_s = ksc_s + KC;                          // (KC)
    int *row_pos = (int *)(vsc_s + KC);                 // (PF_ROWS)
    float *alpha_s = (float *)(row_pos + PF_ROWS);      // (PF_ROWS)
    float *l_s = alpha_s + PF_ROWS;                     // (PF_ROWS)
    float *q_s = l_s + PF_ROWS;                         // (PF_ROWS, hd + 1)
    float *k_s = q_s + PF_ROWS * (hd + 1);              // (KC, hd + 1)
    float *v_s = k_s + KC * (hd + 1);                   // (KC, hd)
    float *s_s = v_s + KC * hd;                         // (PF_ROWS, KC + 1)
    float *sq_s = s_s + PF_ROWS * (KC + 1);             // (PF_ROWS)
    const bool i8 = kvf_attn_i8(a);

    // Q rows; inactive rows are zero so no garbage enters the dot products.
    // A token's group heads are adjacent in q, so reads are contiguous.
    for (int idx = tid; idx < PF_ROWS * hd; idx += PF_THREADS) {
        int r = idx / hd, d = idx - r * hd;
        float qv = 0.0f;
        if (r < n_rows) {
            int tok = r / group, h = g * group + r % group;
            qv = a.q[(size_t)(first + tok) * (size_t)a.ld_q + (size_t)h * hd + d];
        }
        q_s[r * (hd + 1) + d] = qv;
    }
    if (tid < PF_ROWS)
        row_pos[tid] = tid < n_rows ? a.pos[first + tid / group] : -1;
    __syncthreads();
    if (i8) { // the rows as integers (inactive ones: all zero, scale 0)
        for (int r = warp; r < PF_ROWS; r += PF_WARPS) {
            const float sq = kvf_attn_i8_quant_row(q_s + r * (hd + 1), hd, lane);
            if (lane == 0)
                sq_s[r] = sq;
        }
        __syncthreads();
    }

    // Keys 0 .. the tile's last position (the same value in every thread).
    int last = -1, first_pos = INT_MAX;
    for (int r = 0; r < n_rows; r += group) {
        last = max(last, row_pos[r]);
        first_pos = min(first_pos, row_pos[r]);
    }
    const int n_keys = last + 1;
    // Under a sliding window, chunks wholly before every row's window are skipped.
    const int k_begin = n_rows > 0 ? kvf_attn_first_key(a, first_pos) / KC * KC : 0;

    // Online softmax state of this warp's rows warp + PF_WARPS * i, the same
    // in every lane (butterfly reductions leave every lane the same value).
    constexpr int SM_ROWS = PF_ROWS / PF_WARPS;
    float m_run[SM_ROWS], l_run[SM_ROWS];
#pragma unroll
    for (int i = 0; i < SM_ROWS; i++) {
        m_run[i] = -INFINITY;
        l_run[i] = 0.0f;
    }
    // O of rows rg + PF_PV_RG * i, columns cl + PF_PV_CL * c.
    constexpr int PV_ROWS = PF_ROWS / PF_PV_RG, PV_COLS = HD_CAP / PF_PV_CL;
    const int rg = tid / PF_PV_CL, cl = tid % PF_PV_CL;
    float o[PV_ROWS][PV_COLS];
#pragma unroll
    for (int i = 0; i < PV_ROWS; i++)
#pragma unroll
        for (int c = 0; c < PV_COLS; c++)
            o[i][c] = 0.0f;

    for (int k0 = k_begin; k0 < n_keys; k0 += KC) {
        // Where each key of the chunk lives. key_off was last read in the
        // previous chunk's load, which every thread finished before that
        // chunk's second barrier.
        if (tid < KC)
            kvf_attn_chunk_key(a, bt, k0 + tid, n_keys, g, key_off, ksc_s, vsc_s, tid);
        // Also orders the previous chunk's P V reads of v_s and s_s before
        // this chunk's writes.
        __syncthreads();

        // K, V chunk decoded to f32; missing keys are zeros, so P (0 there) times V stays 0.
        kvf_attn_load_kv<float>(a, key_off, ksc_s, vsc_s, KC, k_s, hd + 1, v_s, hd, PF_THREADS,
                                true);
        __syncthreads();

        // S (PF_ROWS, KC): thread = key j, rows srg + S_RG * i. The K read
        // differs per lane (pad makes it conflict-free), Q is a broadcast.
        {
            constexpr int S_RG = PF_THREADS / KC, S_ROWS = PF_ROWS / S_RG;
            const int j = tid % KC, srg = tid / KC;
            float acc[S_ROWS];
#pragma unroll
            for (int i = 0; i < S_ROWS; i++)
                acc[i] = 0.0f;
            const float *kr = k_s + j * (hd + 1);
            const float *qr = q_s + srg * (hd + 1);
            if (i8) {
                int iacc[S_ROWS]; // integers times integers: exact
#pragma unroll
                for (int i = 0; i < S_ROWS; i++)
                    iacc[i] = 0;
#pragma unroll 4
                for (int d = 0; d < hd; d++) {
                    int kd = (int)kr[d];
#pragma unroll
                    for (int i = 0; i < S_ROWS; i++)
                        iacc[i] += (int)qr[i * S_RG * (hd + 1) + d] * kd;
                }
#pragma unroll
                for (int i = 0; i < S_ROWS; i++)
                    acc[i] = kvf_kv_i8_score(iacc[i], sq_s[srg + S_RG * i], ksc_s[j]);
            } else {
#pragma unroll 4
                for (int d = 0; d < hd; d++) {
                    float kd = kr[d];
#pragma unroll
                    for (int i = 0; i < S_ROWS; i++)
                        acc[i] = fmaf(qr[i * S_RG * (hd + 1) + d], kd, acc[i]);
                }
            }
            const int p = k0 + j;
#pragma unroll
            for (int i = 0; i < S_ROWS; i++) {
                int r = srg + S_RG * i;
                // Selected, not multiplied: a masked score is -inf whatever the dot was.
                const bool seen = p <= row_pos[r] && p >= kvf_attn_first_key(a, row_pos[r]);
                s_s[r * (KC + 1) + j] =
                    seen ? kvf_attn_softcap(acc[i] * a.scale, a.softcap) : -INFINITY;
            }
        }
        __syncthreads();

        // Online softmax: warp w owns rows w + PF_WARPS * i, lanes the keys
        // lane and lane + 32. S becomes P in place.
#pragma unroll
        for (int i = 0; i < SM_ROWS; i++) {
            const int r = warp + PF_WARPS * i;
            float *sr = s_s + r * (KC + 1);
            float s0 = lane < KC ? sr[lane] : -INFINITY;
            float s1 = lane + 32 < KC ? sr[lane + 32] : -INFINITY;
            float m_new = fmaxf(m_run[i], kvf_warp_max(fmaxf(s0, s1)));
            // No key of this row yet: exponentials against 0 give 0, not NaN.
            float m_ref = m_new == -INFINITY ? 0.0f : m_new;
            float p0 = expf(s0 - m_ref), p1 = expf(s1 - m_ref);
            // int8: P V takes p times the value scale (l sums p itself)
            if (lane < KC)
                sr[lane] = i8 ? p0 * vsc_s[lane] : p0;
            if (lane + 32 < KC)
                sr[lane + 32] = i8 ? p1 * vsc_s[lane + 32] : p1;
            float alpha = expf(m_run[i] - m_ref); // 0 while m_run is -inf
            l_run[i] = l_run[i] * alpha + kvf_warp_sum(p0 + p1);
            m_run[i] = m_new;
            if (lane == 0)
                alpha_s[r] = alpha;
        }
        __syncthreads();

        // O = O * alpha + P V. Per key: PV_ROWS P reads (two rows per warp,
        // padded apart) and PV_COLS V reads (consecutive columns).
#pragma unroll
        for (int i = 0; i < PV_ROWS; i++) {
            float al = alpha_s[rg + PF_PV_RG * i];
#pragma unroll
            for (int c = 0; c < PV_COLS; c++)
                o[i][c] *= al;
        }
        for (int j = 0; j < KC; j++) {
            float pj[PV_ROWS];
#pragma unroll
            for (int i = 0; i < PV_ROWS; i++)
                pj[i] = s_s[(rg + PF_PV_RG * i) * (KC + 1) + j];
            const float *vr = v_s + j * hd;
#pragma unroll
            for (int c = 0; c < PV_COLS; c++) {
                int col = cl + PF_PV_CL * c;
                if (col < hd) {
                    float vv = vr[col];
#pragma unroll
                    for (int i = 0; i < PV_ROWS; i++)
                        o[i][c] = fmaf(pj[i], vv, o[i][c]);
                }
            }
        }
    }

    // Denominators from the softmax owners to the output owners.
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < SM_ROWS; i++)
            l_s[warp + PF_WARPS * i] = l_run[i];
    }
    __syncthreads();

    T *out = (T *)a.out;
#pragma unroll
    for (int i = 0; i < PV_ROWS; i++) {
        const int r = rg + PF_PV_RG * i;
        if (r >= n_rows)
            continue;
        const int tok = r / group, h = g * group + r % group;
        // l >= 1 for a row with a valid position (its largest score gives
        // exp(0)); 0 only for a negative position, whose output is then 0.
        const float l = l_s[r];
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        T *orow = out + (size_t)(first + tok) * (size_t)a.ld_out + (size_t)h * hd;
#pragma unroll
        for (int c = 0; c < PV_COLS; c++) {
            int col = cl + PF_PV_CL * c;
            if (col < hd)
                orow[col] = kvf_from_f32<T>(o[i][c] * inv);
        }
    }
}

template <int HD_CAP, int KC, typename T>
static kvf_status_t kvf_attn_prefill_launch(cudaStream_t st, const kvf_cuda_attn_t *a,
                                            const kvf_cuda_prefill_tiles_t *t)
{
    // Opt in to more than 48 KiB with this instantiation's largest need, a
    // constant, so concurrent launchers with other head dims never lower it.
    size_t cap = kvf_attn_prefill_smem_bytes(HD_CAP, KC);
    if (cap > 48 * 1024) {
        kvf_status_t s = KVF_CUDA_TRY(
            cudaFuncSetAttribute(kvf_attn_prefill_kernel<HD_CAP, KC, T>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)cap),
            "attention prefill: shared memory opt-in");
        if (s != KVF_OK)
            return s;
    }
    dim3 grid((unsigned)t->n_tiles, (unsigned)a->n_kv_heads);
    size_t smem = kvf_attn_prefill_smem_bytes(a->head_dim, KC);
    kvf_attn_prefill_kernel<HD_CAP, KC, T><<<grid, PF_THREADS, smem, st>>>(*a, t->tiles);
    return KVF_CUDA_LAUNCHED("attention prefill");
}

// Size classes of head_dim. Shared memory (KiB) at the class's largest
// head_dim: 16/64: 30, 32/64: 42, 64/32: 42, 128/32: 74, 256/16: 101.
template <typename T>
static kvf_status_t kvf_attn_prefill_dispatch(cudaStream_t st, const kvf_cuda_attn_t *a,
                                              const kvf_cuda_prefill_tiles_t *t)
{
    if (a->head_dim <= 16)
        return kvf_attn_prefill_launch<16, 64, T>(st, a, t);
    if (a->head_dim <= 32)
        return kvf_attn_prefill_launch<32, 64, T>(st, a, t);
    if (a->head_dim <= 64)
        return kvf_attn_prefill_launch<64, 32, T>(st, a, t);
    if (a->head_dim <= 128)
        return kvf_attn_prefill_launch<128, 32, T>(st, a, t);
    return kvf_attn_prefill_launch<256, 16, T>(st, a, t);
}

kvf_status_t kvf_cuda_attention_prefill(cudaStream_t st, const kvf_cuda_attn_t *a,
                                        const kvf_cuda_prefill_tiles_t *t)
{
    kvf_status_t s = kvf_cuda_check_attention(a);
    if (s != KVF_OK)
        return s;
    s = kvf_cuda_check_prefill_tiles(a, t);
    if (s != KVF_OK || t->n_tiles == 0)
        return s;
    KVF_DISPATCH_ADT(a->adt, T, return kvf_attn_prefill_dispatch<T>(st, a, t));
    return KVF_ERR_INTERNAL; // not reached: every dtype case returns
}
