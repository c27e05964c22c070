/* The simulated nodes: a prefill node's FIFO of prompts computed in
 * chunks, a decode node's batch producing one token per sequence and
 * step, both on a colocated node (one step carries the decode batch and a
 * prefill chunk), the KV transfer between them, and the prefixes each
 * node caches (reported to the router as PrefixUpdate). Step and
 * transfer times come from the cost model (sim_cost.h). See
 * sim_internal.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvf/log.h"
#include "sim_internal.h"

static uint64_t to_ns(double s)
{
    uint64_t ns = (uint64_t)(s * 1e9 + 0.5);
    return ns ? ns : 1;
}

static uint32_t blocks_for(const sim_t *s, uint32_t tokens)
{
    return kvf_router__blocks_for(tokens, s->cfg->block_size);
}

/* ---- prefix caches ------------------------------------------------------------ */

static sim_prefix_t *prefix_of(sim_t *s, const sim_req_t *r)
{
    return r->prefix >= 0 ? &s->prefixes[r->prefix] : NULL;
}

/* Node i now holds r's prefix: it moves to the front of i's LRU, or joins
 * it (the oldest leaving when full), and the router hears of the change. */
static void cache_prefix(sim_t *s, int i, sim_req_t *r)
{
    sim_node_t *n = &s->nodes[i];
    sim_prefix_t *px = prefix_of(s, r);
    uint32_t cap = s->cfg->prefix_cache;
    if (!px || !cap)
        return;
    if (!px->hashes && r->q.ask.hashes) {
        uint32_t nb = r->w->prefix_tokens / s->cfg->block_size;
        px->n = nb < r->q.ask.n_hashes ? nb : r->q.ask.n_hashes;
        px->hashes = px->n ? malloc(px->n * sizeof(uint64_t)) : NULL;
        if (!px->hashes) {
            px->n = 0;
            return;
        }
        memcpy(px->hashes, r->q.ask.hashes, px->n * sizeof(uint64_t));
    }
    if (!px->n)
        return;
    uint32_t at = 0;
    while (at < n->n_lru && n->lru[at] != r->prefix)
        at++;
    if (at < n->n_lru) { /* known: to the front */
        memmove(n->lru + 1, n->lru, at * sizeof(*n->lru));
        n->lru[0] = r->prefix;
        return;
    }
    if (n->n_lru == cap) {
        sim_prefix_t *old = &s->prefixes[n->lru[--n->n_lru]];
        kvf_sim__report(s->sr, i, NULL, 0, old->hashes, old->n);
    }
    memmove(n->lru + 1, n->lru, n->n_lru * sizeof(*n->lru));
    n->lru[0] = r->prefix;
    n->n_lru++;
    kvf_sim__report(s->sr, i, px->hashes, px->n, NULL, 0);
}

/* ---- a split request's KV allocation ------------------------------------------- */

static uint64_t msg_ns(const sim_t *s)
{
    return (uint64_t)llround(s->cfg->hw.msg_latency_s * 1e9);
}

/* The prefill node sends r's KvAlloc to its decode node. */
static void send_alloc(sim_t *s, sim_req_t *r)
{
    r->alloc = ALLOC_SENT;
    if (sim_push(s, s->now + msg_ns(s), EV_ALLOC, (uint32_t)(r - s->reqs)) != KVF_OK)
        s->failed = true;
}

/* The KvAllocs of the prompts that reached prefill node n during its step,
 * sent once it ends (its loop takes its inbox between forwards), in
 * arrival order: the FIFO from the first of them on. */
static void send_allocs(sim_t *s, sim_node_t *n)
{
    for (sim_req_t *r = n->unsent; r; r = r->next)
        if (r->alloc == ALLOC_UNSENT)
            send_alloc(s, r);
    n->unsent = NULL;
}

/* Decode node d answers r's KvAlloc at `at`: the reply reaches the prefill
 * node a message later. */
static void answer_alloc(sim_t *s, sim_req_t *r, uint64_t at)
{
    if (sim_push(s, at + msg_ns(s), EV_GRANT, (uint32_t)(r - s->reqs)) != KVF_OK)
        s->failed = true;
}

/* A decode node takes its inbox between steps (decode_node/loop.c): a
 * KvAlloc that comes during a step is answered at its end, with the
 * others that came meanwhile, so their replies arrive together (one
 * instant: every grant of it is in before the prefill node looks for
 * work, sim_node_grant). An idle node answers each as it comes, one
 * message's time after the one before, so a prefill node that starts on
 * the first reply has the others only after. */
void sim_node_alloc(sim_t *s, sim_req_t *r)
{
    sim_node_t *dn = &s->nodes[r->d];
    if (dn->busy) {
        answer_alloc(s, r, dn->step_end_ns);
        return;
    }
    uint64_t at = dn->alloc_free_ns > s->now ? dn->alloc_free_ns : s->now;
    dn->alloc_free_ns = at + msg_ns(s);
    answer_alloc(s, r, dn->alloc_free_ns);
}

/* r's blocks are granted: its prompt may join its prefill node's next
 * forward. The node looks for work once every reply of this instant is
 * in (the replies of one decode step come together). */
void sim_node_grant(sim_t *s, sim_req_t *r)
{
    r->alloc = ALLOC_GRANTED;
    if (sim_push(s, s->now, EV_KICK, (uint32_t)r->p) != KVF_OK)
        s->failed = true;
}

/* ---- placing a request ------------------------------------------------------------ */

void sim_node_start(sim_t *s, sim_req_t *r, int p, int d)
{
    sim_node_t *dn = &s->nodes[d], *pn = &s->nodes[p];
    r->p = p;
    r->d = d;
    r->state = REQ_PREFILLING;
    r->blocks = blocks_for(s, r->w->n_prompt + r->w->n_output);
    dn->blocks_free = dn->blocks_free > r->blocks ? dn->blocks_free - r->blocks : 0;
    dn->reserved++;
    /* what p holds of the prompt it need not compute (the nodes' rule) */
    uint32_t cap = kvf_router__reuse_cap(r->w->n_prompt, s->cfg->block_size);
    r->known = kvf_sim__hits(s->sr, p, &r->q, cap) * s->cfg->block_size;
    s->cached_tokens += r->known;
    sim_req_append(&pn->fifo, &pn->fifo_tail, r);
    pn->fifo_n++;
    pn->fifo_tokens += r->w->n_prompt - r->known;
    r->alloc = p == d ? ALLOC_GRANTED : ALLOC_UNSENT;
    if (r->alloc == ALLOC_UNSENT && !pn->busy)
        send_alloc(s, r);
    else if (r->alloc == ALLOC_UNSENT && !pn->unsent)
        pn->unsent = r; /* sent after the step (send_allocs) */
    sim_node_kick(s, p);
}

/* ---- steps --------------------------------------------------------------------------- */

/* Nodes in a step once one starting now does: those already in one, and
 * it. */
static int busy_nodes(const sim_t *s)
{
    int busy = 1;
    for (int i = 0; i < s->n_nodes; i++)
        busy += s->nodes[i].busy;
    return busy;
}

/* The share of its CPUs a step starting now on some node gets when the
 * nodes share one host (kvf_sim_host_share): the busy nodes keep their
 * threads busy. Fixed for the step: a node that starts or ends meanwhile
 * does not change it. */
static double host_share(const kvf_sim_profile_t *hw, int busy)
{
    if (hw->host_cpus <= 0)
        return 1;
    double threads = hw->node_threads > 0 ? hw->node_threads : 1;
    return kvf_sim_host_share(hw, busy * threads);
}

/* The host's memory for a step starting now (hw: the profile, changed
 * in place). When the busy nodes' weights (each node process has its own
 * copy) do not fit in the last-level cache together, each copy keeps an
 * even share of it, llc / (busy x weights) of its bytes, and streams the
 * rest past it at dram_bw: the step reads its bytes at the harmonic mix
 * of the two bandwidths. (Measured on the 2-core host, a 4-layer model of
 * 20 MiB, two copies past a 32 MiB cache: the decode node's steps while
 * the prefill node computes were 1.2-1.5x its steps alone, not the 2.2x
 * of all its weights at dram_bw.) Fixed for the step, like the share. */
static void host_cache(kvf_sim_profile_t *hw, double weight_bytes, int busy)
{
    if (hw->host_cpus <= 0 || hw->llc_bytes <= 0 || hw->dram_bw <= 0 || busy <= 1 ||
        weight_bytes <= 0)
        return;
    const double held = hw->llc_bytes / (busy * weight_bytes);
    if (held >= 1)
        return;
    const double past = fmin(hw->hbm_bw, hw->dram_bw);
    hw->hbm_bw = 1 / (held / hw->hbm_bw + (1 - held) / past);
}

/* The prompt chunks of node n's next step: the FIFO's prompts whose KV
 * blocks are granted, oldest first (prefill_node/forward.c, pick_forward,
 * takes the ready ones in arrival order), at most chunk_tokens in all. */
static void take_chunks(sim_t *s, sim_node_t *n, kvf_sim_step_t *step)
{
    uint32_t budget = s->cfg->chunk_tokens;
    n->n_pieces = 0;
    for (sim_req_t *r = n->fifo; r && budget; r = r->next) {
        if (r->alloc != ALLOC_GRANTED)
            continue;
        uint32_t left = r->w->n_prompt - r->known;
        uint32_t take = left < budget ? left : budget;
        n->pieces[n->n_pieces++] = (sim_piece_t){r, take};
        kvf_sim_step_add_chunk(step, r->known, take, take == left);
        budget -= take;
    }
}

void sim_node_kick(sim_t *s, int i)
{
    sim_node_t *n = &s->nodes[i];
    if (n->busy)
        return;
    kvf_sim_step_t step = {0};
    if (n->prefills)
        take_chunks(s, n, &step);
    n->step_decode = n->decodes ? n->n_batch : 0;
    step.decode_seqs = n->step_decode;
    step.decode_ctx = n->step_decode ? n->batch_ctx : 0;
    if (!n->n_pieces && !n->step_decode)
        return; /* idle until work arrives */
    kvf_sim_profile_t hw = s->cfg->hw;
    const int busy = busy_nodes(s);
    host_cache(&hw, s->cfg->model.step_weight_bytes, busy);
    const double share = host_share(&hw, busy);
    uint64_t took = to_ns(kvf_sim_step_time(&hw, &s->cfg->model, &step) / share);
    /* what the step carries and takes, as a node logs its steps (the
     * calibration's step-by-step comparison, docs/simulator.md) */
    kvf_log_debug("sim step at %.6f s on node %d: %u decoding (context %llu), %u prompt tokens "
                  "(after %llu), %.3f ms at a CPU share of %.2f",
                  (double)s->now / 1e9, i, step.decode_seqs, (unsigned long long)step.decode_ctx,
                  step.prefill_tokens, (unsigned long long)step.prefill_kv_read, (double)took / 1e6,
                  share);
    n->busy = true;
    n->busy_ns += took;
    n->step_end_ns = s->now + took;
    s->steps++;
    if (sim_push(s, s->now + took, EV_STEP, (uint32_t)i) != KVF_OK)
        s->failed = true;
}

/* r joins decode node n's batch with its first token produced. */
static void join_batch(sim_t *s, sim_node_t *n, sim_req_t *r)
{
    r->state = REQ_DECODING;
    r->out = 1;
    r->t_first = s->now + sim_msg_delay_ns(s);
    if (r->w->n_output <= 1) {
        sim_end(s, r, false);
        return;
    }
    if (n->n_batch == n->cap_batch) {
        uint32_t cap = n->cap_batch ? n->cap_batch * 2 : 64;
        sim_req_t **grown = realloc(n->batch, cap * sizeof(*grown));
        if (!grown) {
            s->failed = true;
            return;
        }
        n->batch = grown;
        n->cap_batch = cap;
    }
    n->batch[n->n_batch++] = r;
    n->batch_ctx += r->w->n_prompt + r->out;
}

/* r's prompt is computed on its prefill node: it decodes there (a local
 * prefill) or its KV goes to its decode node, less the blocks that node
 * caches (the last block always travels), once both links are free. */
static void prompt_done(sim_t *s, sim_req_t *r)
{
    cache_prefix(s, r->p, r);
    if (r->p == r->d) {
        join_batch(s, &s->nodes[r->d], r);
        return;
    }
    r->state = REQ_SHIPPING;
    uint32_t nb = blocks_for(s, r->w->n_prompt);
    uint32_t held = kvf_sim__hits(s->sr, r->d, &r->q, nb ? nb - 1 : 0);
    double bytes = (double)(nb - held) * s->block_bytes;
    sim_node_t *pn = &s->nodes[r->p], *dn = &s->nodes[r->d];
    uint64_t start = s->now;
    if (pn->link_free_ns > start)
        start = pn->link_free_ns;
    if (dn->link_free_ns > start)
        start = dn->link_free_ns;
    /* the KV, then KvReady from the prefill node to the decode node */
    double took = kvf_sim_transfer_time(&s->cfg->hw, s->cfg->model.tp, bytes);
    uint64_t end = start + to_ns(took) + (uint64_t)llround(s->cfg->hw.msg_latency_s * 1e9);
    pn->link_free_ns = dn->link_free_ns = end;
    s->kv_bytes += bytes;
    s->transfers++;
    if (sim_push(s, end, EV_SHIPPED, (uint32_t)(r - s->reqs)) != KVF_OK)
        s->failed = true;
}

/* r's KV is on its decode node. A node takes the KvReady between steps
 * (decode_node/loop.c: the inbox, then the joins and their first tokens,
 * then a step), so during a step r waits for its end. */
void sim_node_shipped(sim_t *s, sim_req_t *r)
{
    sim_node_t *dn = &s->nodes[r->d];
    cache_prefix(s, r->d, r);
    if (dn->busy) {
        sim_req_append(&dn->landed, &dn->landed_tail, r);
        return;
    }
    join_batch(s, dn, r);
    sim_node_kick(s, r->d);
}

/* The step's chunks are computed: finished prompts leave the FIFO. */
static void chunks_done(sim_t *s, sim_node_t *n)
{
    for (uint32_t k = 0; k < n->n_pieces; k++) {
        sim_req_t *r = n->pieces[k].r;
        r->known += n->pieces[k].n;
        n->fifo_tokens -= n->pieces[k].n;
        if (r->known < r->w->n_prompt)
            continue;
        /* out of the FIFO: near its head (the granted come first but for
         * prompts still waiting for their blocks) */
        sim_req_t **at = &n->fifo, *prev = NULL;
        while (*at != r) {
            prev = *at;
            at = &(*at)->next;
        }
        *at = r->next;
        if (n->fifo_tail == r)
            n->fifo_tail = prev;
        n->fifo_n--;
        r->next = NULL;
        prompt_done(s, r);
    }
    n->n_pieces = 0;
}

/* The step's decoding sequences have their next token; the finished ones
 * leave the batch (the others keep their order). */
static void tokens_done(sim_t *s, sim_node_t *n)
{
    uint32_t kept = 0;
    for (uint32_t k = 0; k < n->n_batch; k++) {
        sim_req_t *r = n->batch[k];
        if (k < n->step_decode) {
            r->out++;
            n->batch_ctx++;
            if (r->out >= r->w->n_output) {
                n->batch_ctx -= r->w->n_prompt + r->out;
                sim_end(s, r, false);
                continue;
            }
        }
        n->batch[kept++] = r;
    }
    n->n_batch = kept;
    n->step_decode = 0;
}

void sim_node_step_done(sim_t *s, int i)
{
    sim_node_t *n = &s->nodes[i];
    n->busy = false;
    tokens_done(s, n);
    chunks_done(s, n);
    while (n->landed) { /* in arrival order, as the node's inbox */
        sim_req_t *r = n->landed;
        n->landed = r->next;
        r->next = NULL;
        join_batch(s, n, r);
    }
    n->landed_tail = NULL;
    n->alloc_free_ns = s->now;
    send_allocs(s, n);
    sim_node_kick(s, i);
}

void sim_node_fini(sim_node_t *n)
{
    free(n->batch);
    free(n->pieces);
    free(n->lru);
}
