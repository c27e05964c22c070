/* Scheduling arithmetic of kvf-prefill. See plan.h. */
#include "plan.h"

#include "kvf/log.h"

void kvf_prefill_plan_blocks(uint32_t block_size, uint32_t start, uint32_t n, uint32_t n_prompt,
                             uint32_t *first_p, uint32_t *end_p)
{
    KVF_ASSERT(block_size >= 1 && n >= 1 && start + n <= n_prompt);
    uint32_t end_pos = start + n;
    /* Blocks b with (b + 1) * block_size <= start were completed (and
     * shipped) by earlier chunks; the block holding `start` was not. */
    uint32_t first = start / block_size;
    uint32_t end =
        end_pos == n_prompt ? (n_prompt + block_size - 1) / block_size : end_pos / block_size;
    *first_p = first;
    *end_p = end > first ? end : first;
}

/* The chunk of a prompt with `remaining` tokens that fits in `left`
 * (< remaining) tokens, shaped as plan.h says; 0 when there is none. */
static uint32_t chunk_size(uint32_t remaining, uint32_t left, uint32_t align, uint32_t min_tail)
{
    uint32_t take = left - left % align;
    if (remaining - take < min_tail)
        take = remaining > min_tail ? remaining - min_tail : 0;
    return take - take % align;
}

size_t kvf_prefill_plan_forward(const uint32_t *remaining, size_t n, uint32_t budget,
                                uint32_t align, uint32_t min_tail, uint32_t *take)
{
    KVF_ASSERT(align >= 1);
    size_t used = 0;
    uint32_t left = budget;
    for (size_t i = 0; i < n; i++)
        take[i] = 0;
    for (size_t i = 0; i < n && left > 0; i++) {
        if (remaining[i] == 0)
            continue;
        if (remaining[i] <= left) {
            take[i] = remaining[i];
        } else {
            take[i] = chunk_size(remaining[i], left, align, min_tail);
            if (take[i] == 0 && left == budget) {
                /* Alone in the forward: progress first, aligned if it can. */
                take[i] = left >= align ? left - left % align : left;
            }
            if (take[i] == 0)
                break;
            used = i + 1;
            break; /* a chunked prompt ends the forward */
        }
        left -= take[i];
        used = i + 1;
    }
    return used;
}

uint64_t kvf_prefill_slice_offset(const kvf_kv_geometry_t *geo, uint32_t block, int layer)
{
    return (uint64_t)block * kvf_kv_block_bytes(geo) + (uint64_t)layer * kvf_kv_slice_bytes(geo);
}

size_t kvf_prefill_plan_slices(const kvf_kvpool_t *pool, int layer, const uint32_t *local_blocks,
                               const uint32_t *remote_blocks, uint32_t first, uint32_t end,
                               kvf_xfer_slice_t *slices)
{
    const kvf_kv_geometry_t *geo = kvf_kvpool_geometry(pool);
    uint64_t len = kvf_kvpool_slice_bytes(pool);
    size_t n = 0;
    for (uint32_t b = first; b < end; b++, n++) {
        slices[n].local_off = kvf_kvpool_slice_offset(pool, local_blocks[b], layer);
        slices[n].remote_off = kvf_prefill_slice_offset(geo, remote_blocks[b], layer);
        slices[n].len = len;
    }
    return n;
}
