/* The pure parts of kvf-prefill's scheduling: which tokens of which prompts
 * go into one forward, and which (block, layer) slices a chunk completes.
 * No I/O, no state: the node (prefill.c) and tests/unit/test_prefill_plan.c
 * call them.
 *
 * Shipping rule (docs/PROTOCOL.md, step 4): after layer l of a chunk that
 * covers prompt positions [start, start + n), the node ships the layer-l
 * slice of every block that the chunk completes: a block whose last slot is
 * written, or, on the prompt's final chunk, the block holding the prompt's
 * last token. Every block is shipped by exactly one chunk, so each remote
 * slice is written exactly once. */
#ifndef KVF_PREFILL_PLAN_H
#define KVF_PREFILL_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "kvf/kvcache.h"
#include "kvf/xfer.h"

/* The prompt blocks [*first_p, *end_p) (block indices in position order)
 * that the chunk [start, start + n) of an n_prompt-token prompt completes;
 * first == end when it completes none. Needs block_size >= 1, n >= 1 and
 * start + n <= n_prompt (the caller's contract). */
void kvf_prefill_plan_blocks(uint32_t block_size, uint32_t start, uint32_t n, uint32_t n_prompt,
                             uint32_t *first_p, uint32_t *end_p);

/* Splits a forward's token budget over prompts waiting in scheduling order:
 * remaining[i] tokens still to compute for prompt i; take[i] receives how
 * many of them go into this forward (0 for those that do not fit). Prompts
 * are taken whole while they fit; the first one that does not is chunked to
 * the budget left, and the forward stops there. Returns how many prompts
 * (a prefix of the list) take part.
 *
 * Chunk shapes follow the engine's so that a chunked prefill computes the
 * same bits as one forward over the whole prompt (the colocated baseline):
 * a chunk ends on a multiple of `align` tokens (the CPU backend's attention
 * tile and the block size, 16), so every chunk after the first starts where
 * the one-forward prefill starts a tile; and it leaves at least `min_tail`
 * tokens for later, so the last chunk, should it run alone, is not so short
 * that the projections take the backend's few-row kernels (<= 8 rows),
 * which round differently from the BLAS path a long prompt's rows take.
 * When the budget left cannot hold such a chunk, the prompt waits for the
 * next forward, unless it is the forward's first (then the tail rule yields:
 * progress comes first). align >= 1. */
size_t kvf_prefill_plan_forward(const uint32_t *remaining, size_t n, uint32_t budget,
                                uint32_t align, uint32_t min_tail, uint32_t *take);

/* Byte offset of the (block, layer) slice in a pool of geometry geo: the
 * layout [block][layer][K,V][kv_head][slot][head_dim] that both ends of a
 * handoff share (checked through the transport descriptor). Used for the
 * remote side, whose pool this node only knows by its geometry. */
uint64_t kvf_prefill_slice_offset(const kvf_kv_geometry_t *geo, uint32_t block, int layer);

/* Writes into slices (room for end - first) the puts that ship layer
 * `layer` of prompt blocks [first, end): local offsets from pool for
 * local_blocks[b], remote offsets (same geometry) for remote_blocks[b].
 * Returns the number written (end - first). */
size_t kvf_prefill_plan_slices(const kvf_kvpool_t *pool, int layer, const uint32_t *local_blocks,
                               const uint32_t *remote_blocks, uint32_t first, uint32_t end,
                               kvf_xfer_slice_t *slices);

#endif
