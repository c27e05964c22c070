// Attention of single tokens (decode) over the paged KV pool, split over
// the context (flash-decoding), f32 math on CUDA cores; K/V of any pool
// format are decoded to f32 (exactly) as they are read.
//
// Why split: a decode batch has few tokens, so one CTA per (token, kv head)
// leaves most SMs idle while each CTA walks a long context. Splitting the
// keys into n_splits ranges of split_keys gives n_dec * n_kv_heads *
// n_splits CTAs; a second kernel merges their partial softmaxes exactly:
// a split s with max m_s, sum l_s = sum_j exp(S_j - m_s) and unnormalized
// acc_s = sum_j exp(S_j - m_s) V_j contributes with weight w_s = exp(m_s - M),
// M = max_s m_s, and out = sum_s w_s acc_s / sum_s w_s l_s.
//
// Kernel 1, CTA (i, g, s), for token t = tokens[i], kv head g and keys
// [s * split_keys, min((s + 1) * split_keys, pos[t] + 1)) (from the
// window's first key on, under a sliding window), all group query
// heads of g at once so each K and V row is read once per group (GQA):
//   1. q rows of the group -> shared;
//   2. scores: warps take keys in turn; lanes stride over head_dim (one
//      key's head_dim floats are contiguous: coalesced) and a warp
//      reduction gives each head's dot; scores -> shared (group, split_keys);
//   3. per head: max m and p = exp(S - m) in place, sum l;
//   4. acc[h][d] = sum_j p[h][j] V[j][d]: threads own columns d and keep all
//      heads' sums in registers, so each V element is loaded once; for
//      head_dim < 128 the spare threads take every n-th key and the parts
//      are summed in shared memory.
//   Partial records in ws, [(i * n_heads + h) * n_splits + s] * (head_dim + 2):
//   acc (head_dim floats), m, l. A split past the token's context writes
//   m = -inf, l = 0 and no acc.
// Kernel 2, one warp per (i, h): the merge above over the splits that hold
// keys (the same count kernel 1 used), out row tokens[i] in adt.
//
// Block ids are checked against the pool on the device as well: an id
// outside it (or a position past the table row) reads as zero K and V,
// as in the prefill kernel, instead of being dereferenced.
#include "attention_common.cuh"

#include <math.h>

#define DEC_THREADS KVF_CUDA_DECODE_THREADS
#define DEC_WARPS   (DEC_THREADS / 32)
// head_dim floats per lane in a key's dot product.
#define DEC_D_PER_LANE (KVF_CUDA_MAX_HEAD_DIM / 32)

static_assert(DEC_THREADS % 32 == 0, "whole warps");

// Dynamic shared memory of kernel 1 (floats):
//   q / red (group, max(hd, DEC_THREADS)) the group's q rows in step 2, then
//       the column parts of step 4 (at most DEC_THREADS per head)
//   s       (group, split_keys) scores, then probabilities
//   sq      (group)  int8 pools: each q row's scale (kvf_attn_i8)
// shapes.c keeps group * split_keys <= 4096, so at most 48 KiB.
static size_t kvf_attn_decode_smem_bytes(int group, int hd, int split_keys)
{
    int cols = hd > DEC_THREADS ? hd : DEC_THREADS;
    return sizeof(float) * ((size_t)group * (size_t)cols + (size_t)group * (size_t)split_keys +
                            (size_t)group);
}

// GCAP: group rounded up to a power of two; step 4 keeps GCAP sums per
// thread in registers (heads past group are skipped).
// Grid (n_dec, n_kv_heads, n_splits), DEC_THREADS threads.
template <int GCAP>
__global__ void __launch_bounds__(DEC_THREADS)
    kvf_attn_decode_split_kernel(kvf_cuda_attn_t a, const int32_t *__restrict__ tokens,
                                 int n_splits, int split_keys, float *__restrict__ ws)
{
    extern __shared__ __align__(16) float kvf_decode_smem[];

    const int i = blockIdx.x, g = blockIdx.y, s = blockIdx.z;
    const int hd = a.head_dim, bs = a.block_size, group = a.n_heads / a.n_kv_heads;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int rec_len = hd + 2;
    // Record of (i, query head g * group + 0, s); head h's is n_splits records on.
    float *rec0 = ws + (((size_t)i * a.n_heads + (size_t)g * group) * n_splits + s) * rec_len;
    const size_t rec_head = (size_t)n_splits * rec_len;

    const int t = tokens[i];
    const bool tok_ok = t >= 0 && t < a.n_tokens; // the host checks; never read past pos
    const int n_ctx = tok_ok ? a.pos[t] + 1 : 0;
    // A split before the window's first key is empty, one across it starts there.
    const int k0 = max(s * split_keys, tok_ok ? kvf_attn_first_key(a, a.pos[t]) : 0);
    const int k1 = min(s * split_keys + split_keys, n_ctx);
    if (k0 >= k1) {
        // Past the context: an empty partial (the merge also skips it by count).
        if (tid < group) {
            rec0[tid * rec_head + hd] = -INFINITY;
            rec0[tid * rec_head + hd + 1] = 0.0f;
        }
        return; // the whole CTA, before any barrier
    }
    const int n = k1 - k0; // keys of this split, 1 .. split_keys
    const int seq = a.seq[t];
    const int32_t *bt = kvf_attn_table(a, seq);
    const long long v_delta = kvf_attn_v_delta(a);   // K data row -> V data row (bytes)
    const long long vs_delta = kvf_attn_vs_delta(a); // K scale -> V scale (bytes)
    const long long elem = (long long)kvf_kv_elem_bytes(a.kv_dtype);

    float *q_s = kvf_decode_smem;                                        // (group, hd)
    float *red = kvf_decode_smem;                                        // step 4, after q
    float *s_s = kvf_decode_smem + (size_t)group * max(hd, DEC_THREADS); // (group, split_keys)
    float *sq_s = s_s + (size_t)group * split_keys;                      // (group)
    const bool i8 = kvf_attn_i8(a);

    // 1. q rows of the group: adjacent in the token's row (int8 pools:
    //    rounded to integers, warp w taking heads w, w + DEC_WARPS, ...).
    const float *qt = a.q + (size_t)t * (size_t)a.ld_q + (size_t)g * group * hd;
    for (int idx = tid; idx < group * hd; idx += DEC_THREADS)
        q_s[idx] = qt[idx];
    __syncthreads();
    if (i8) {
        for (int h = warp; h < group; h += DEC_WARPS) {
            const float sq = kvf_attn_i8_quant_row(q_s + h * hd, hd, lane);
            if (lane == 0)
                sq_s[h] = sq;
        }
        __syncthreads();
    }

    // 2. Scores. Warp w takes keys w, w + DEC_WARPS, ...; lane holds
    //    d = lane + 32 c of the key in registers, reused by every head.
    for (int j = warp; j < n; j += DEC_WARPS) {
        const int p = k0 + j;
        const kvf_attn_key_t key = kvf_attn_key(a, bt, p, g);
        const float ksc = kvf_attn_scale_at(a, key.k >= 0 ? key.ks : -1);
        float kr[DEC_D_PER_LANE];
#pragma unroll
        for (int c = 0; c < DEC_D_PER_LANE; c++) {
            int d = lane + 32 * c;
            kr[c] = key.k >= 0 && d < hd ? kvf_attn_elem(a, key.k, d, i8 ? 1.0f : ksc) : 0.0f;
        }
        for (int h = 0; h < group; h++) {
            const float *qh = q_s + h * hd;
            float dot = 0.0f;
            if (i8) {
                int isum = 0; // integers times integers: exact
#pragma unroll
                for (int c = 0; c < DEC_D_PER_LANE; c++) {
                    int d = lane + 32 * c;
                    if (d < hd)
                        isum += (int)qh[d] * (int)kr[c];
                }
                dot = kvf_kv_i8_score(kvf_warp_sum_i(isum), sq_s[h], ksc);
            } else {
#pragma unroll
                for (int c = 0; c < DEC_D_PER_LANE; c++) {
                    int d = lane + 32 * c;
                    if (d < hd)
                        dot = fmaf(qh[d], kr[c], dot);
                }
                dot = kvf_warp_sum(dot);
            }
            if (lane == 0)
                s_s[h * split_keys + j] = kvf_attn_softcap(dot * a.scale, a.softcap);
        }
    }
    __syncthreads();

    // 3. Per head (warp w takes heads w, w + DEC_WARPS, ...): m, p, l.
    //    n >= 1, so m is finite and l >= 1.
    for (int h = warp; h < group; h += DEC_WARPS) {
        float *sr = s_s + h * split_keys;
        float m = -INFINITY;
        for (int j = lane; j < n; j += 32)
            m = fmaxf(m, sr[j]);
        m = kvf_warp_max(m);
        float l = 0.0f;
        for (int j = lane; j < n; j += 32) {
            float pj = expf(sr[j] - m);
            sr[j] = pj;
            l += pj;
        }
        l = kvf_warp_sum(l);
        if (lane == 0) {
            rec0[h * rec_head + hd] = m;
            rec0[h * rec_head + hd + 1] = l;
        }
    }
    __syncthreads(); // p complete; q_s is free for red

    // 4. acc = P V, in passes of at most DEC_THREADS columns. A pass of
    //    `width` columns gives thread (kg, cl) column c0 + cl and every
    //    n_kg-th key of each block, n_kg = DEC_THREADS / width key groups.
    for (int c0 = 0; c0 < hd; c0 += DEC_THREADS) {
        const int width = min(DEC_THREADS, hd - c0);
        const int n_kg = DEC_THREADS / width;
        const int cl = tid % width, kg = tid / width;
        float acc[GCAP];
#pragma unroll
        for (int h = 0; h < GCAP; h++)
            acc[h] = 0.0f;
        if (kg < n_kg) {
            // Block by block, so the table is read once per block.
            for (int bi = k0 / bs; bi <= (k1 - 1) / bs; bi++) {
                const kvf_attn_key_t key = kvf_attn_key(a, bt, bi * bs, g); // slot 0
                if (key.k < 0)
                    continue; // zero V: adds nothing (its p still counts in l, as in step 2)
                const long long vb = key.k + v_delta, vsb = key.ks + vs_delta;
                const int lo = max(k0, bi * bs), hi = min(k1, bi * bs + bs);
                for (int p = lo + kg; p < hi; p += n_kg) {
                    const long long slot = p - bi * bs;
                    const float vsc = kvf_attn_scale_at(a, vsb + slot * (long long)sizeof(float));
                    // int8: the integer, and its scale on p
                    const float vv =
                        kvf_attn_elem(a, vb + slot * hd * elem, c0 + cl, i8 ? 1.0f : vsc);
                    const float *pr = s_s + (p - k0);
#pragma unroll
                    for (int h = 0; h < GCAP; h++)
                        if (h < group)
                            acc[h] = fmaf(i8 ? pr[h * split_keys] * vsc : pr[h * split_keys], vv,
                                          acc[h]);
                }
            }
        }
        if (n_kg == 1) {
            // One key group: thread cl holds the whole sum of its column.
            // Where width does not divide DEC_THREADS (head_dim 96, 80, ...)
            // the threads tid >= width have kg >= n_kg and a wrapped cl: their
            // zero acc must not overwrite columns 0 .. DEC_THREADS - width - 1.
            if (kg < n_kg) {
#pragma unroll
                for (int h = 0; h < GCAP; h++)
                    if (h < group)
                        rec0[h * rec_head + c0 + cl] = acc[h];
            }
        } else {
            // red (n_kg, group, width): the key groups' parts, summed per column.
            if (kg < n_kg) {
#pragma unroll
                for (int h = 0; h < GCAP; h++)
                    if (h < group)
                        red[(kg * group + h) * width + cl] = acc[h];
            }
            __syncthreads();
            for (int idx = tid; idx < group * width; idx += DEC_THREADS) {
                const int h = idx / width, c = idx - h * width;
                float sum = 0.0f;
                for (int k = 0; k < n_kg; k++)
                    sum += red[(k * group + h) * width + c];
                rec0[h * rec_head + c0 + c] = sum;
            }
            __syncthreads(); // red is rewritten by a following pass
        }
    }
}

// Merge: one warp per (i, h), DEC_WARPS pairs per CTA; grid
// ceil(n_dec * n_heads / DEC_WARPS).
template <typename T>
__global__ void __launch_bounds__(DEC_THREADS)
    kvf_attn_decode_merge_kernel(kvf_cuda_attn_t a, const int32_t *__restrict__ tokens, int n_dec,
                                 int n_splits, int split_keys, const float *__restrict__ ws)
{
    const int lane = threadIdx.x & 31;
    const long long pair = (long long)blockIdx.x * DEC_WARPS + (threadIdx.x >> 5);
    if (pair >= (long long)n_dec * a.n_heads)
        return; // a whole warp; this kernel has no barriers
    const int i = (int)(pair / a.n_heads), h = (int)(pair % a.n_heads);
    const int t = tokens[i];
    if (t < 0 || t >= a.n_tokens)
        return;
    const int hd = a.head_dim, rec_len = hd + 2;
    const float *rec = ws + ((size_t)i * a.n_heads + h) * (size_t)n_splits * rec_len;
    // Splits holding keys: the same count kernel 1 found non-empty.
    const long long n_ctx = (long long)a.pos[t] + 1;
    const int n_used =
        n_ctx <= 0 ? 0 : (int)min((long long)n_splits, (n_ctx + split_keys - 1) / split_keys);

    float m = -INFINITY;
    for (int s = lane; s < n_used; s += 32)
        m = fmaxf(m, rec[(size_t)s * rec_len + hd]);
    m = kvf_warp_max(m);
    float den = 0.0f;
    for (int s = lane; s < n_used; s += 32) {
        const float *r = rec + (size_t)s * rec_len;
        if (r[hd + 1] > 0.0f) // skips an empty record, m = -inf
            den += expf(r[hd] - m) * r[hd + 1];
    }
    den = kvf_warp_sum(den);
    const float inv = den > 0.0f ? 1.0f / den : 0.0f;

    T *orow = (T *)a.out + (size_t)t * (size_t)a.ld_out + (size_t)h * hd;
    for (int d = lane; d < hd; d += 32) {
        float num = 0.0f;
        for (int s = 0; s < n_used; s++) {
            const float *r = rec + (size_t)s * rec_len;
            if (r[hd + 1] > 0.0f)
                num = fmaf(expf(r[hd] - m), r[d], num);
        }
        orow[d] = kvf_from_f32<T>(num * inv);
    }
}

template <int GCAP>
static kvf_status_t kvf_attn_decode_split_launch(cudaStream_t st, const kvf_cuda_attn_t *a,
                                                 const kvf_cuda_decode_plan_t *p)
{
    int group = a->n_heads / a->n_kv_heads;
    size_t smem = kvf_attn_decode_smem_bytes(group, a->head_dim, p->split_keys);
    if (smem > 48 * 1024) {
        // Not reached with shapes.c's score limit; kept so a larger limit
        // there still launches (or fails here with a logged error).
        kvf_status_t s = KVF_CUDA_TRY(
            cudaFuncSetAttribute(kvf_attn_decode_split_kernel<GCAP>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
            "attention decode: shared memory opt-in");
        if (s != KVF_OK)
            return s;
    }
    dim3 grid((unsigned)p->n_dec, (unsigned)a->n_kv_heads, (unsigned)p->n_splits);
    kvf_attn_decode_split_kernel<GCAP>
        <<<grid, DEC_THREADS, smem, st>>>(*a, p->tokens, p->n_splits, p->split_keys, p->ws);
    return KVF_CUDA_LAUNCHED("attention decode (splits)");
}

kvf_status_t kvf_cuda_attention_decode(cudaStream_t st, const kvf_cuda_attn_t *a,
                                       const kvf_cuda_decode_plan_t *p)
{
    kvf_status_t s = kvf_cuda_check_attention(a);
    if (s != KVF_OK)
        return s;
    s = kvf_cuda_check_decode_plan(a, p);
    if (s != KVF_OK || p->n_dec == 0)
        return s;

    int group = a->n_heads / a->n_kv_heads;
    if (group <= 1)
        s = kvf_attn_decode_split_launch<1>(st, a, p);
    else if (group <= 2)
        s = kvf_attn_decode_split_launch<2>(st, a, p);
    else if (group <= 4)
        s = kvf_attn_decode_split_launch<4>(st, a, p);
    else if (group <= 8)
        s = kvf_attn_decode_split_launch<8>(st, a, p);
    else if (group <= 16)
        s = kvf_attn_decode_split_launch<16>(st, a, p);
    else
        s = kvf_attn_decode_split_launch<KVF_CUDA_MAX_GROUP>(st, a, p);
    if (s != KVF_OK)
        return s;

    long long pairs = (long long)p->n_dec * a->n_heads;
    unsigned n_ctas = (unsigned)((pairs + DEC_WARPS - 1) / DEC_WARPS);
    KVF_DISPATCH_ADT(a->adt, T,
                     kvf_attn_decode_merge_kernel<T><<<n_ctas, DEC_THREADS, 0, st>>>(
                         *a, p->tokens, p->n_dec, p->n_splits, p->split_keys, p->ws));
    return KVF_CUDA_LAUNCHED("attention decode (merge)");
}
