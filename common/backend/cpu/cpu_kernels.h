/* CPU backend kernels, private to common/backend/cpu/.
 *
 * One set of numerics (docs/numerics.md). Every kernel exists for each
 * instruction set (portable C, AVX2+FMA+F16C, AVX-512F, AArch64 NEON),
 * chosen at run time (cpu_isa.c), and all give the same bits for every
 * input:
 *
 * - matmul: every output element is one FMA chain over k in increasing
 *   order, starting from 0; then + bias, then + the old y. Vectors run
 *   across output columns, never across k, so the vector width, the number
 *   of rows in the batch and the thread count cannot change a sum.
 * - dot products of length head_dim (q·k): 16 lanes, lane l the FMA chain
 *   over elements l, l+16, l+32, ... (zeros past head_dim), then the fixed
 *   tree ((l, l+8), then (l, l+4), (l, l+2), (l, l+1)).
 * - attention: each query row alone, keys in chunks of 16 absolute
 *   positions, one online-softmax step per chunk; p·v as one FMA chain per
 *   element over the chunk's keys in order. int8 pools: q·k over the
 *   integers, exact, and the value scale on p (see "int8 pools"). A sliding window starts at the
 *   chunk holding the first key in it; keys before that key have p = 0.
 * - exp: one polynomial (kvf_cpu_exp), evaluated with the same operations
 *   in every instruction set.
 * - tanh (Gemma2's soft-capping of scores, its GeGLU): kvf_det_softcap and
 *   kvf_det_gelu_tanh of kvf/detmath.h, one scalar function compiled once
 *   and called by every instruction set's kernels.
 *
 * Weights are repacked once (cpu_pack.c) into panels of 32 output rows:
 * panel p holds rows 32p..32p+31 as k groups of 32 values (k-major), zero
 * past n, in f32, bf16 or f16; 16-bit values are widened exactly in
 * registers. */
#ifndef KVF_CPU_KERNELS_H
#define KVF_CPU_KERNELS_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvf/backend.h"
#include "kvf/detmath.h"
#include "kvf/dtype.h"
#include "kvf/kv_format.h"

/* Whether this compiler builds the x86 SIMD kernels: GCC's target
 * pragmas compile them for AVX2/AVX-512 whatever the build's -march
 * (clang ignores those pragmas: its builds run the portable kernels). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KVF_CPU_X86_KERNELS 1
#endif

/* Output rows (columns of y) per weight panel. */
#define KVF_CPU_PANEL 32
/* Keys per online-softmax step, at absolute positions 16c..16c+15. */
#define KVF_CPU_KEY_CHUNK 16



/* A weight w(n, k) repacked into panels (see above). */
typedef struct {
    int n, k;
    int n_panels;      /* ceil(n / 32) */
    kvf_dtype_t dtype; /* f32, bf16 or f16 */
    void *data;        /* (n_panels, k, 32) elements of dtype, 64-byte aligned */
} kvf_cpu_packed_t;

/* Packs w(n, k) (row-major f32) into *p in dtype. KVF_ERR_INVAL when a
 * value is not exactly representable in dtype (a 16-bit pack of weights
 * that did not come from a 16-bit checkpoint). On success p->data is owned
 * by the caller: kvf_cpu_packed_free(). */
kvf_status_t kvf_cpu_pack(kvf_cpu_packed_t *p, const float *w, int n, int k, kvf_dtype_t dtype);
void kvf_cpu_packed_free(kvf_cpu_packed_t *p);
/* Bytes the packed values take. */
size_t kvf_cpu_packed_bytes(const kvf_cpu_packed_t *p);

/* One matmul: y(m, n) = x(m, k) · wᵀ [+ bias] [+ y]. */
typedef struct {
    float *y;
    const float *x;
    const float *bias; /* (n) or NULL */
    const kvf_cpu_packed_t *w;
    int m;
    int accumulate;
} kvf_cpu_gemm_t;

/* One attention work item: rows = n_tok tokens x group query heads that
 * share one kv head. Token i has position pos[i] and query rows
 * q + i*ld_q + h*head_dim for h < group; the output row goes to the same
 * place in out (row stride ld_out). Key j of the sequence is row j %
 * block_size of keys[j / block_size] (values alike), head_dim elements of
 * dtype; a scaled format's row scale is kscales[j / block_size][j %
 * block_size] (vscales alike). The kernel reads keys in chunks of 16
 * (chunk-outer, every row of the tile inner, so a chunk is read once per
 * tile): f32 rows in place, other formats decoded exactly
 * (kvf_kv_format.h's values: keys into the scratch, values in registers
 * where the instruction set can), then the same f32 math; int8 keys and
 * values are used as integers instead ("int8 pools" below). */
typedef struct {
    int n_tok;
    const int32_t *pos;          /* (n_tok) */
    const float *q;              /* first query row of the head group, token 0 */
    int ld_q;
    float *out;
    int ld_out;
    int group;                   /* query heads per kv head */
    int head_dim;
    int block_size;
    kvf_kv_dtype_t dtype;
    const void *const *keys;     /* (n_blocks) */
    const void *const *values;   /* (n_blocks) */
    const float *const *kscales; /* (n_blocks), scaled formats only */
    const float *const *vscales;
    float scale;                 /* 1 / sqrt(head_dim), or the model's (kvf_model_attn_scale) */
    float softcap;               /* > 0: each scaled score s becomes kvf_det_softcap(s, softcap) */
    int window;                  /* sliding window W (keys > pos - W); 0: none */
} kvf_cpu_attn_tile_t;

/* The first key a query at pos attends to under window (0: none). Keys of
 * the first chunk below it get probability 0, so the chunks and their
 * sums stay those of absolute positions. */
static inline int kvf_cpu_attn_first_key(int window, int pos)
{
    return window > 0 && pos >= window ? pos - window + 1 : 0;
}

/* Floats of scratch one attention call needs per thread for tiles of up
 * to rows (token, head) rows of head_dim. */
size_t kvf_cpu_attn_scratch_floats(int head_dim, int rows);

/* Decodes n_rows consecutive rows of n elements of dt (row r's scale
 * scales[r]; scales NULL for an unscaled format) to f32 rows ld_out
 * apart: the values of kvf_kv_decode_row. */
typedef void (*kvf_cpu_decode_fn)(kvf_kv_dtype_t dt, const void *src, const float *scales,
                                  int n_rows, int n, float *out, int ld_out);

/* The most kv heads one attention_heads call takes (more: a task a head). */
#define KVF_CPU_MAX_KV_HEADS 32

/* Chunks one decode tile (one query token) takes each phase at a time:
 * the scores of all of them, then their softmax steps, then their p·v. */
#define KVF_CPU_DECODE_CHUNKS 16

/* The attention scratch: per row its numerator (hdp floats), running max
 * and sum; the decoded keys and values of one chunk (16 rows of hdp); per
 * row the scores of two chunks (s: 2 x rows x 16), one chunk's
 * probabilities (p: rows x 16) and its rescale factor (alpha); for a
 * decode tile, per row the scores and probabilities of
 * KVF_CPU_DECODE_CHUNKS chunks (ds, dp: rows x 256) and per chunk each
 * row's rescale factor (da: 16 x rows). */
typedef struct {
    float *acc, *m, *l, *kbuf, *vbuf;
    float *s, *p, *alpha;
    float *ds, *dp, *da;
    int16_t *qi; /* int8 pools: per row its query in int16 (hdp, zeros past head_dim) */
    float *qs;   /* and that query's scale */
    int hdp;
} kvf_cpu_attn_scratch_t;

static inline int kvf_cpu_attn_hdp(int head_dim)
{
    return (head_dim + 15) & ~15;
}

static inline kvf_cpu_attn_scratch_t kvf_cpu_attn_scratch(float *s, int head_dim, int rows)
{
    kvf_cpu_attn_scratch_t sc;
    const int hdp = kvf_cpu_attn_hdp(head_dim), rp = (rows + 15) & ~15;
    sc.hdp = hdp;
    sc.kbuf = s;
    sc.vbuf = s + (size_t)KVF_CPU_KEY_CHUNK * hdp;
    sc.acc = s + (size_t)2 * KVF_CPU_KEY_CHUNK * hdp;
    sc.m = sc.acc + (size_t)rows * hdp;
    sc.l = sc.m + rp;
    sc.alpha = sc.l + rp;
    sc.s = sc.alpha + rp;
    sc.p = sc.s + (size_t)2 * rp * KVF_CPU_KEY_CHUNK;
    sc.ds = sc.p + (size_t)rp * KVF_CPU_KEY_CHUNK;
    sc.dp = sc.ds + (size_t)rows * KVF_CPU_DECODE_CHUNKS * KVF_CPU_KEY_CHUNK;
    sc.da = sc.dp + (size_t)rows * KVF_CPU_DECODE_CHUNKS * KVF_CPU_KEY_CHUNK;
    sc.qs = sc.da + (size_t)rows * KVF_CPU_DECODE_CHUNKS;
    sc.qi = (int16_t *)(void *)(sc.qs + rp);
    return sc;
}

/* The first chunk's first key and the last key any row of t reads. */
static inline void kvf_cpu_attn_span(const kvf_cpu_attn_tile_t *t, int *j_first_p, int *j_last_p)
{
    int first = t->pos[0], last = 0;
    for (int i = 0; i < t->n_tok; i++) {
        const int lo = kvf_cpu_attn_first_key(t->window, t->pos[i]);
        first = lo < first ? lo : first;
        last = t->pos[i] > last ? t->pos[i] : last;
    }
    *j_first_p = first / KVF_CPU_KEY_CHUNK * KVF_CPU_KEY_CHUNK;
    *j_last_p = last;
}

/* Rows of keys and values j0 .. j0+15 of a chunk whose first n keys exist
 * (rows past n: the chunk's first, readable, result unused). f32 rows are
 * the pool's own; other formats are decoded into sc's buffers, one call
 * per run of keys in one block (int8 values without their scales). */
static inline void kvf_cpu_attn_chunk_rows(const kvf_cpu_attn_tile_t *t, int j0, int n,
                                           kvf_cpu_decode_fn dec, const kvf_cpu_attn_scratch_t *sc,
                                           const float **krows, const float **vrows)
{
    const int hd = t->head_dim, bs = t->block_size;
    const kvf_kv_dtype_t dt = t->dtype;
    const size_t row_bytes = (size_t)hd * kvf_kv_elem_bytes(dt);
    const bool scaled = kvf_kv_scaled(dt);
    int b = j0 / bs, r = j0 % bs;
    for (int j = 0; j < n;) {
        const int run = bs - r < n - j ? bs - r : n - j; /* keys j.. in block b */
        const char *kd = (const char *)t->keys[b] + (size_t)r * row_bytes;
        const char *vd = (const char *)t->values[b] + (size_t)r * row_bytes;
        if (dt == KVF_KV_F32) {
            for (int i = 0; i < run; i++) {
                krows[j + i] = (const float *)(const void *)(kd + (size_t)i * row_bytes);
                vrows[j + i] = (const float *)(const void *)(vd + (size_t)i * row_bytes);
            }
        } else {
            float *kb = sc->kbuf + (size_t)j * sc->hdp, *vb = sc->vbuf + (size_t)j * sc->hdp;
            dec(dt, kd, scaled ? t->kscales[b] + r : NULL, run, hd, kb, sc->hdp);
            /* int8 values: without their scales, which go onto p */
            dec(dt, vd, scaled && dt != KVF_KV_INT8 ? t->vscales[b] + r : NULL, run, hd, vb,
                sc->hdp);
            for (int i = 0; i < run; i++) {
                krows[j + i] = kb + (size_t)i * sc->hdp;
                vrows[j + i] = vb + (size_t)i * sc->hdp;
            }
        }
        j += run;
        b++;
        r = 0;
    }
    for (int j = n; j < KVF_CPU_KEY_CHUNK; j++) {
        krows[j] = krows[0];
        vrows[j] = vrows[0];
    }
}

/* One cache line at p requested into L2 (a hint; nothing changes value).
 * Written as the instruction: GCC 12 deletes __builtin_prefetch from
 * loops it proves free of side effects. */
static inline void kvf_cpu_prefetch(const void *p)
{
#if defined(__x86_64__) && defined(__GNUC__)
    __asm__ volatile("prefetcht1 %0" : : "m"(*(const char *)p));
#elif defined(__aarch64__) && defined(__GNUC__)
    __asm__ volatile("prfm pldl2keep, %0" : : "Q"(*(const char *)p));
#else
    (void)p;
#endif
}

/* The factor V_LOAD_KV takes for a row of dt with scale `scale`: the
 * scale, for fp8 times 2^8. The fp8 decode makes an f16 of the value /
 * 2^8 (cpu_kernels_avx512.c); (v x 2^8) x s and v x (2^8 x s) are the
 * same real product, both 2^8 multiplies exact (s <= FLT_MAX / 448), so
 * the one rounding gives the same bits and the decode saves a multiply. */
static inline float kvf_cpu_kv_factor(kvf_kv_dtype_t dt, float scale)
{
    return dt == KVF_KV_FP8 ? scale * 256.0f : scale;
}

/* ---- int8 pools: q·k over the integers ---------------------------------
 *
 * With an int8 pool a score is computed from the integers: each query row
 * is quantized once per tile to int16 (kvf_cpu_i8_quant: a scale per row,
 * amax / qmax), then for key j with int8 row k and scale sk
 *
 *   score = (float)(sum_d qi[d] * k[d]) * (sq * sk)
 *
 * The sum is exact in int32 (|qi| <= qmax, qmax * 127 * head_dim <
 * 2^31), so it has one value whatever order or vector width adds it up:
 * every instruction set gives the same bits by construction, and the
 * float steps after it are two products. The query's rounding (1 part in
 * 2 * qmax of its largest element, qmax = 32767 up to head_dim 516:
 * kvf_kv_i8_qmax) is
 * far below the key's (1 in 254). On the values side the row scale
 * multiplies the probability instead of each element: acc = fma(p * sv,
 * (float)v, acc), so a value row is a convert, no multiply. */

/* q (hd floats) as qi (hdp int16, zeros past hd) and its scale *sq, by
 * kvf/kv_format.h's rules (kvf_kv_i8_qscale, kvf_kv_i8_qround). */
static inline void kvf_cpu_i8_quant(const float *q, int hd, int hdp, int16_t *qi, float *sq)
{
    float amax = 0;
    for (int d = 0; d < hd; d++) {
        const float a = fabsf(q[d]);
        amax = a > amax ? a : amax;
    }
    const float s = kvf_kv_i8_qscale(amax, hd);
    for (int d = 0; d < hd; d++)
        qi[d] = (int16_t)kvf_kv_i8_qround(q[d], s, hd);
    for (int d = hd; d < hdp; d++)
        qi[d] = 0;
    *sq = s;
}

/* The exact integer dot product of qi and k over hd elements. */
static inline int32_t kvf_cpu_i8_dot(const int16_t *qi, const int8_t *k, int hd)
{
    int32_t s = 0;
    for (int d = 0; d < hd; d++)
        s += (int32_t)qi[d] * (int32_t)k[d];
    return s;
}


/* The rows (and scales) of one side (0: keys, 1: values) of an int8 tile
 * for keys j0 .. j0+n-1; entries n .. 15 repeat the first. */
static inline void kvf_cpu_i8_rows(const kvf_cpu_attn_tile_t *t, int side, int j0, int n,
                                   const int8_t **rows, float *scales)
{
    const int bs = t->block_size, hd = t->head_dim;
    const void *const *data = side ? t->values : t->keys;
    const float *const *sc = side ? t->vscales : t->kscales;
    int b = j0 / bs, r = j0 % bs;
    for (int j = 0; j < n; j++) {
        rows[j] = (const int8_t *)data[b] + (size_t)r * (size_t)hd;
        scales[j] = sc[b][r];
        if (++r == bs) {
            b++;
            r = 0;
        }
    }
    for (int j = n; j < KVF_CPU_KEY_CHUNK; j++) {
        rows[j] = rows[0];
        scales[j] = scales[0];
    }
}

/* The scores (before the attention scale) of two quantized query rows
 * against 16 int8 key rows, element by element: the reference every
 * instruction set's version equals. */
static inline void kvf_cpu_i8_scores2_ref(const int16_t *q0, float sq0, const int16_t *q1,
                                          float sq1, const int8_t *const *rows, const float *ks,
                                          int hd, float *o0, float *o1)
{
    for (int j = 0; j < KVF_CPU_KEY_CHUNK; j++) {
        o0[j] = kvf_kv_i8_score(kvf_cpu_i8_dot(q0, rows[j], hd), sq0, ks[j]);
        o1[j] = kvf_kv_i8_score(kvf_cpu_i8_dot(q1, rows[j], hd), sq1, ks[j]);
    }
}

/* A stream of prefetches over the rows of keys j0 .. end-1 of n_t tiles
 * (the kv heads of one token, or one tile), block by block; in each block
 * the pieces in the order sides x tiles (keys of every tile, then values
 * of every tile, or one side alone), which is the pool's address order
 * (a slice holds K [head][slot] then V), each piece's scales with its
 * first line; where a block's pieces and scales lie end to end, as in a
 * pool slice, as one run (kvf_cpu_pf_whole), so the step from piece to
 * piece (out of line) is rare and a kernel's take in its loops is a
 * compare. A decode tile takes a few lines at a time between its
 * loads, so the misses it keeps in flight are spread over its compute
 * instead of asked for in bursts (which stall the core once its miss
 * buffers are full). */
typedef struct {
    const kvf_cpu_attn_tile_t *t; /* n_t tiles: the same positions and blocks */
    int n_t, side0, n_sides;
    int b, b_last, r_last, r0; /* the current block, the last; the current block's first row */
    int piece;                 /* (side0 + piece / n_t, tile piece % n_t) */
    const char *p, *e;         /* the current piece's next line, its end */
} kvf_cpu_pf_stream_t;

/* The bytes [lo, hi) of block b's pieces (sides x tiles, whole blocks of
 * rows, then a scaled format's scales) when they tile that span without a
 * gap, as the pieces of a pool slice do; false otherwise. */
static inline bool kvf_cpu_pf_whole(const kvf_cpu_pf_stream_t *s, int b, const char **lo,
                                    const char **hi)
{
    const kvf_cpu_attn_tile_t *t0 = s->t, *tl = s->t + s->n_t - 1;
    const int np = s->n_t * s->n_sides, last_side = s->side0 + s->n_sides - 1;
    const bool scaled = kvf_kv_scaled(t0->dtype);
    const size_t blk = (size_t)t0->block_size * (size_t)t0->head_dim * kvf_kv_elem_bytes(t0->dtype);
    const size_t sb = scaled ? (size_t)t0->block_size * sizeof(float) : 0;
    const char *l = (const char *)(s->side0 ? t0->values[b] : t0->keys[b]);
    const char *h = scaled ? (const char *)(last_side ? tl->vscales[b] : tl->kscales[b]) + sb
                           : (const char *)(last_side ? tl->values[b] : tl->keys[b]) + blk;
    if ((uintptr_t)h < (uintptr_t)l || (uintptr_t)h - (uintptr_t)l != (size_t)np * (blk + sb))
        return false;
    *lo = l;
    *hi = h;
    return true;
}

static inline void kvf_cpu_pf_piece(kvf_cpu_pf_stream_t *s)
{
    const kvf_cpu_attn_tile_t *t = s->t + s->piece % s->n_t;
    const int side = s->side0 + s->piece / s->n_t;
    const size_t row_bytes = (size_t)t->head_dim * kvf_kv_elem_bytes(t->dtype);
    const int r1 = s->b == s->b_last ? s->r_last : t->block_size - 1;
    const char *lo, *hi;
    if (s->piece == 0 && s->n_t * s->n_sides > 1 && kvf_cpu_pf_whole(s, s->b, &lo, &hi)) {
        /* the block's pieces as one run: its rows before r0 (first block)
         * and past r1 (last) in the middle pieces are requested too */
        s->p = (const char *)((uintptr_t)(lo + (size_t)s->r0 * row_bytes) & ~(uintptr_t)63);
        s->e = hi;
        s->piece = s->n_t * s->n_sides - 1;
        return;
    }
    const char *d = (const char *)(side ? t->values[s->b] : t->keys[s->b]);
    s->p = (const char *)((uintptr_t)(d + (size_t)s->r0 * row_bytes) & ~(uintptr_t)63);
    s->e = d + (size_t)(r1 + 1) * row_bytes;
    if (kvf_kv_scaled(t->dtype))
        kvf_cpu_prefetch((side ? t->vscales[s->b] : t->kscales[s->b]) + s->r0);
}

/* A stream over sides side0 .. side0 + n_sides - 1 (0: keys, 1: values)
 * of tiles t[0 .. n_t-1], keys j0 .. end-1. */
static inline void kvf_cpu_pf_init(kvf_cpu_pf_stream_t *s, const kvf_cpu_attn_tile_t *t, int n_t,
                                   int side0, int n_sides, int j0, int end)
{
    *s = (kvf_cpu_pf_stream_t){.t = t, .n_t = n_t, .side0 = side0, .n_sides = n_sides, .b = 1};
    if (j0 >= end)
        return;
    const int bs = t->block_size;
    s->b = j0 / bs;
    s->b_last = (end - 1) / bs;
    s->r_last = (end - 1) % bs;
    s->r0 = j0 % bs;
    kvf_cpu_pf_piece(s);
}

/* Past the current piece: the next one, or the next block's first; false
 * once the stream has ended. */
static inline bool kvf_cpu_pf_next(kvf_cpu_pf_stream_t *s)
{
    if (s->b > s->b_last)
        return false;
    if (++s->piece == s->n_t * s->n_sides) {
        if (s->b == s->b_last) {
            s->b++;
            return false;
        }
        s->b++;
        s->piece = 0;
        s->r0 = 0;
    }
    kvf_cpu_pf_piece(s);
    return true;
}

/* kvf_cpu_pf_take across the end of a piece: out of line, so the usual
 * case stays a compare and the prefetches in the kernels' loops. */
static __attribute__((noinline, unused)) void kvf_cpu_pf_more(kvf_cpu_pf_stream_t *s, int n)
{
    while (n > 0) {
        while (s->p >= s->e)
            if (!kvf_cpu_pf_next(s))
                return;
        const char *p = s->p;
        for (; n > 0 && p < s->e; n--, p += 64)
            kvf_cpu_prefetch(p);
        s->p = p;
    }
}

/* The stream's next n lines requested. */
static inline __attribute__((always_inline)) void kvf_cpu_pf_take(kvf_cpu_pf_stream_t *s, int n)
{
    const char *p = s->p;
    if (__builtin_expect(s->e - p >= (ptrdiff_t)n * 64, 1)) { /* within the piece */
        for (int i = 0; i < n; i++)
            kvf_cpu_prefetch(p + (size_t)i * 64);
        s->p = p + (size_t)n * 64;
        return;
    }
    kvf_cpu_pf_more(s, n);
}

/* Every line of the stream before key j's rows requested (in a block the
 * stream walks several pieces of: its pieces up to the last one's row j). */
static __attribute__((noinline, unused)) void kvf_cpu_pf_upto(kvf_cpu_pf_stream_t *s, int j)
{
    const kvf_cpu_attn_tile_t *t = s->t + s->n_t - 1; /* the last piece's tile */
    const int bj = j / t->block_size, last = s->n_t * s->n_sides - 1;
    const size_t row_bytes = (size_t)t->head_dim * kvf_kv_elem_bytes(t->dtype);
    for (;;) {
        if (s->b > bj || s->b > s->b_last)
            return;
        const char *stop = s->e;
        if (s->b == bj && s->piece == last) {
            const int side = s->side0 + s->n_sides - 1;
            const char *d = (const char *)(side ? t->values[bj] : t->keys[bj]);
            const char *to = d + (size_t)(j % t->block_size) * row_bytes;
            if (s->p >= to)
                return;
            stop = to < stop ? to : stop;
        }
        const char *p = s->p;
        for (; p < stop; p += 64)
            kvf_cpu_prefetch(p);
        s->p = p;
        if (p < s->e)
            return;
        if (!kvf_cpu_pf_next(s))
            return;
    }
}

/* Requests the key rows, then the value rows (and their scales) of the
 * chunk at key j0, keys j0 .. last. A block's rows of one head are one
 * contiguous run, but consecutive blocks sit a whole block's layers
 * apart, so no hardware prefetcher sees the next run coming. Asking for
 * each run in address order, K before V, measured faster than
 * interleaving K and V lines (bench/: 16k context, batch 16). */
static inline void kvf_cpu_attn_prefetch(const kvf_cpu_attn_tile_t *t, int j0, int last)
{
    if (j0 > last)
        return;
    const int bs = t->block_size;
    const size_t row_bytes = (size_t)t->head_dim * kvf_kv_elem_bytes(t->dtype);
    const int n = last - j0 + 1 < KVF_CPU_KEY_CHUNK ? last - j0 + 1 : KVF_CPU_KEY_CHUNK;
    const int b_first = j0 / bs, b_last = (j0 + n - 1) / bs;
    for (int kv = 0; kv < 2; kv++)
        for (int b = b_first; b <= b_last; b++) {
            const int r0 = b == b_first ? j0 % bs : 0;
            const int r1 = b == b_last ? (j0 + n - 1) % bs : bs - 1;
            const char *d = (const char *)(kv ? t->values[b] : t->keys[b]) + (size_t)r0 * row_bytes;
            const size_t bytes = (size_t)(r1 - r0 + 1) * row_bytes;
            size_t o = 0;
            for (; o + 256 <= bytes; o += 256) {
                kvf_cpu_prefetch(d + o);
                kvf_cpu_prefetch(d + o + 64);
                kvf_cpu_prefetch(d + o + 128);
                kvf_cpu_prefetch(d + o + 192);
            }
            for (; o < bytes; o += 64)
                kvf_cpu_prefetch(d + o);
            if (kvf_kv_scaled(t->dtype))
                kvf_cpu_prefetch((kv ? t->vscales[b] : t->kscales[b]) + r0);
        }
}

/* Scratch a gemm call needs: two panels widened to f32. */
#define KVF_CPU_GEMM_SCRATCH_FLOATS(k) ((size_t)2 * (size_t)(k) * KVF_CPU_PANEL)

/* The kernels of one instruction set. */
typedef struct {
    kvf_cpu_isa_t isa;
    /* Weight panels per matmul task when x has at most small_m rows (a
     * multiple of the kernels' tile widths there), and that small_m. */
    int small_panels_per_task;
    int small_m;
    /* Columns of panels [p0, p1) of g->w, for every row of x. scratch:
     * KVF_CPU_GEMM_SCRATCH_FLOATS(k) floats, the caller's thread's own. */
    void (*gemm)(const kvf_cpu_gemm_t *g, int p0, int p1, float *scratch);
    /* out[i] = silu(gate[i]) * up[i] for i < n. */
    void (*swiglu_row)(float *out, const float *gate, const float *up, int n);
    /* scratch: kvf_cpu_attn_scratch_floats(head_dim, n_tok * group). */
    void (*attention)(const kvf_cpu_attn_tile_t *t, float *scratch);
    /* The decode tiles (n_tok 1) of one token's n kv heads, t[0..n-1]:
     * the same positions and blocks, outputs those of n attention calls.
     * scratch: kvf_cpu_attn_scratch_floats(head_dim, n * group). */
    void (*attention_heads)(const kvf_cpu_attn_tile_t *t, int n, float *scratch);
    /* The exact decode of a row of KV elements (kvf/kv_format.h). */
    kvf_cpu_decode_fn decode_row;
} kvf_cpu_kernels_t;

extern const kvf_cpu_kernels_t kvf_cpu_kernels_scalar;
#if defined(KVF_CPU_X86_KERNELS)
extern const kvf_cpu_kernels_t kvf_cpu_kernels_avx2;
extern const kvf_cpu_kernels_t kvf_cpu_kernels_avx512;
#endif
#if defined(__aarch64__)
extern const kvf_cpu_kernels_t kvf_cpu_kernels_neon;
#endif

/* The kernels for isa (which the CPU must have: kvf_cpu_isa_supported). */
const kvf_cpu_kernels_t *kvf_cpu_kernels(kvf_cpu_isa_t isa);

#endif
