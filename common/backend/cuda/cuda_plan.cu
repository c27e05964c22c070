// The host side of a CUDA forward (cuda_backend.cuh): a batch's plan (rows,
// prefill tiles, decode splits, the block-table width a graph replays) and
// its inputs, packed into one pinned buffer that one copy uploads.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.cuh"

static int next_pow2(int x)
{
    int p = 1;
    while (p < x)
        p <<= 1;
    return p;
}

int kvf_cuda__out_rows(const kvf_engine_seq_t *q)
{
    if (q->logits)
        return q->all_logits ? (int)q->n_tokens : 1;
    return q->greedy_token ? 1 : 0;
}

// Rows, output rows, decode tokens and prefill tiles of the batch; the most
// blocks a sequence needs and the last decode position.
static void count_batch(const cuda_ctx_t *c, const kvf_kv_geometry_t *g,
                        const kvf_engine_seq_t *seqs, int n_seqs, batch_plan_t *p,
                        int *need_blocks_p, int *max_dec_pos_p)
{
    const kvf_model_config_t *m = &c->model->cfg;
    int group = m->n_heads / m->n_kv_heads, tile = kvf_cuda_prefill_tile_tokens(group);
    int need_blocks = 1, max_dec_pos = 0;
    for (int s = 0; s < n_seqs; s++) {
        const kvf_engine_seq_t *q = &seqs[s];
        p->n += (int)q->n_tokens;
        p->n_out += kvf_cuda__out_rows(q);
        int nb = (int)kvf_kv_blocks_for_tokens(g, q->start_pos + q->n_tokens);
        if (nb > need_blocks)
            need_blocks = nb;
        if (q->n_tokens == 1) {
            p->n_dec++;
            if ((int)q->start_pos > max_dec_pos)
                max_dec_pos = (int)q->start_pos;
        } else {
            p->decode_only = false;
            p->n_tiles += ((int)q->n_tokens + tile - 1) / tile;
            int last = (int)(q->start_pos + q->n_tokens - 1);
            if (last > p->max_tile_pos)
                p->max_tile_pos = last;
        }
    }
    *need_blocks_p = need_blocks;
    *max_dec_pos_p = max_dec_pos;
}

// Decode splits: enough CTAs to fill the GPU twice over (a batch of one
// sequence has only n_kv_heads of them per split), each split at most the
// score buffer's keys and a whole number of blocks. Chosen from the table
// width's bucket in every mode, so a replayed graph and launched kernels
// split (and sum) the same way; splits past a token's context do nothing.
static void plan_decode_splits(const cuda_ctx_t *c, const kvf_kv_geometry_t *g, int bucket,
                               int max_dec_pos, batch_plan_t *p)
{
    const kvf_model_config_t *m = &c->model->cfg;
    int group = m->n_heads / m->n_kv_heads;
    int max_keys = kvf_cuda_decode_split_keys(group, g->block_size);
    int bucket_keys = bucket * g->block_size;
    int want = p->n_dec > 0
                   ? (2 * c->n_sms + p->n_dec * m->n_kv_heads - 1) / (p->n_dec * m->n_kv_heads)
                   : 1;
    int keys_per = (bucket_keys + want - 1) / want;
    keys_per = (keys_per + g->block_size - 1) / g->block_size * g->block_size;
    if (keys_per < 64)
        keys_per = (64 + g->block_size - 1) / g->block_size * g->block_size;
    p->split_keys = keys_per < max_keys ? keys_per : max_keys;
    int keys = p->decode_only ? bucket_keys : max_dec_pos + 1;
    p->n_splits = (keys + p->split_keys - 1) / p->split_keys;
    if (p->n_splits < 1)
        p->n_splits = 1;
}

// Where each input sits in the metadata buffer (256-byte aligned).
static void layout_meta(const kvf_model_config_t *m, batch_plan_t *p)
{
    meta_layout_t *ml = &p->ml;
    size_t off = 0, n = (size_t)p->n;
    ml->tokens = off;
    off = align256(off + n * 4);
    ml->pos = off;
    off = align256(off + n * 4);
    ml->seq = off;
    off = align256(off + n * 4);
    ml->tok_block = off;
    off = align256(off + n * 4);
    ml->cos_sin = off;
    off = align256(off + n * m->head_dim * sizeof(float));
    ml->tables = off;
    off = align256(off + (size_t)p->n_seqs * p->bt_stride * 4);
    ml->tiles = off;
    off = align256(off + (size_t)p->n_tiles * 8);
    ml->dec = off;
    off = align256(off + (size_t)p->n_dec * 4);
    ml->out_rows = off;
    off = align256(off + (size_t)p->n_out * 4);
    ml->total = off;
}

void kvf_cuda__plan_batch(const cuda_ctx_t *c, const kvf_kv_geometry_t *g,
                          const kvf_engine_seq_t *seqs, int n_seqs, bool to_host, batch_plan_t *p)
{
    memset(p, 0, sizeof(*p));
    p->n_seqs = n_seqs;
    p->decode_only = !to_host && c->cfg.cuda_graphs;
    int need_blocks, max_dec_pos;
    count_batch(c, g, seqs, n_seqs, p, &need_blocks, &max_dec_pos);
    // Graphs replay one shape: bucket the table width (and with it the
    // number of decode splits) so growing contexts reuse a graph.
    int bucket = next_pow2(need_blocks);
    p->bt_stride = p->decode_only ? bucket : need_blocks;
    plan_decode_splits(c, g, bucket, max_dec_pos, p);
    layout_meta(&c->model->cfg, p);
}

void kvf_cuda__fill_meta(const cuda_ctx_t *c, const kvf_kv_geometry_t *g,
                         const kvf_engine_seq_t *seqs, const batch_plan_t *p)
{
    const kvf_model_t *m = c->model;
    const int hd = m->cfg.head_dim, half = hd / 2;
    int group = m->cfg.n_heads / m->cfg.n_kv_heads, tile = kvf_cuda_prefill_tile_tokens(group);
    uint8_t *base = (uint8_t *)c->meta_host;
    int32_t *tokens = (int32_t *)(base + p->ml.tokens), *pos = (int32_t *)(base + p->ml.pos),
            *seq = (int32_t *)(base + p->ml.seq), *tok_block = (int32_t *)(base + p->ml.tok_block),
            *tables = (int32_t *)(base + p->ml.tables), *tiles = (int32_t *)(base + p->ml.tiles),
            *dec = (int32_t *)(base + p->ml.dec), *out_rows = (int32_t *)(base + p->ml.out_rows);
    float *cos_sin = (float *)(base + p->ml.cos_sin);
    int t = 0, n_tiles = 0, n_dec = 0, o = 0;
    for (int s = 0; s < p->n_seqs; s++) {
        const kvf_engine_seq_t *q = &seqs[s];
        int nb = (int)kvf_kv_blocks_for_tokens(g, q->start_pos + q->n_tokens);
        int32_t *row = tables + (size_t)s * p->bt_stride;
        for (int b = 0; b < p->bt_stride; b++)
            row[b] = b < nb ? (int32_t)q->block_ids[b] : 0; // padding is never read
        if (q->n_tokens == 1)
            dec[n_dec++] = t;
        else
            for (int i = 0; i < (int)q->n_tokens; i += tile) {
                tiles[2 * n_tiles] = t + i;
                tiles[2 * n_tiles + 1] = (int)q->n_tokens - i < tile ? (int)q->n_tokens - i : tile;
                n_tiles++;
            }
        int rows = kvf_cuda__out_rows(q);
        for (int r = 0; r < rows; r++)
            out_rows[o++] = t + (int)q->n_tokens - rows + r;
        for (uint32_t i = 0; i < q->n_tokens; i++, t++) {
            int32_t ps = (int32_t)(q->start_pos + i);
            tokens[t] = (int32_t)q->tokens[i];
            pos[t] = ps;
            seq[t] = s;
            tok_block[t] = (int32_t)q->block_ids[ps / g->block_size];
            float *cs = cos_sin + (size_t)t * hd;
            for (int d = 0; d < half; d++) {
                double a = (double)ps * m->rope_inv_freq[d];
                cs[d] = (float)cos(a);
                cs[half + d] = (float)sin(a);
            }
        }
    }
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

kvf_status_t kvf_cuda__collect_touched(cuda_ctx_t *c, const kvf_kv_geometry_t *g,
                                       const kvf_engine_seq_t *seqs, int n_seqs, size_t *n_p)
{
    size_t n = 0;
    for (int s = 0; s < n_seqs; s++) {
        uint32_t b0 = seqs[s].start_pos / (uint32_t)g->block_size;
        uint32_t b1 = (seqs[s].start_pos + seqs[s].n_tokens - 1) / (uint32_t)g->block_size;
        n += b1 - b0 + 1;
    }
    if (n > c->cap_touched) {
        uint32_t *t = (uint32_t *)realloc(c->touched, n * sizeof(uint32_t));
        if (!t)
            return KVF_ERR_NOMEM;
        c->touched = t;
        c->cap_touched = n;
    }
    n = 0;
    for (int s = 0; s < n_seqs; s++) {
        uint32_t b0 = seqs[s].start_pos / (uint32_t)g->block_size;
        uint32_t b1 = (seqs[s].start_pos + seqs[s].n_tokens - 1) / (uint32_t)g->block_size;
        for (uint32_t b = b0; b <= b1; b++)
            c->touched[n++] = seqs[s].block_ids[b];
    }
    qsort(c->touched, n, sizeof(uint32_t), cmp_u32);
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (u == 0 || c->touched[i] != c->touched[u - 1])
            c->touched[u++] = c->touched[i];
    *n_p = u;
    return KVF_OK;
}
