/* The simulated router: the socketless router (router/detached.c) with
 * the simulated nodes registered, fed their heartbeats and prefix
 * reports through the router's own handlers, asked for its picks. See
 * sim.h and sim_internal.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim_internal.h"

/* The fingerprint the simulated nodes register with (any hex string:
 * the hash root takes it). */
#define SIM_FINGERPRINT "51a1"

/* Registers node i as the router's slot i, the way on_register fills it. */
static void register_node(kvf_sim_router_t *sr, const kvf_sim_config_t *cfg, int i, Kvf__Role role,
                          bool prefill_local, uint32_t capacity)
{
    const kvf_model_config_t *m = &cfg->model_cfg;
    Kvf__KvGeometry g = KVF__KV_GEOMETRY__INIT;
    g.block_size = cfg->block_size;
    g.dtype = (Kvf__KvDtype)cfg->kv_dtype;
    g.layout = 1;
    g.n_layers = (uint32_t)m->n_layers;
    g.n_kv_heads = (uint32_t)m->n_kv_heads;
    g.head_dim = (uint32_t)m->head_dim;
    Kvf__Register reg = KVF__REGISTER__INIT;
    reg.node_id = sr->names[i];
    reg.role = role;
    reg.inbox_url = sr->names[i];
    reg.model_fingerprint = SIM_FINGERPRINT;
    reg.geometry = &g;
    reg.capacity_blocks = capacity;
    reg.max_running = cfg->max_batch;
    reg.prefill_local = prefill_local;
    kvf_router__node_take(sr->r, &sr->r->nodes.slots[i], &reg);
    /* its first full listing: empty (nothing cached yet) */
    kvf_sim__report(sr, i, NULL, 0, NULL, 0);
}

kvf_status_t kvf_sim_router_create(const kvf_sim_config_t *cfg, uint32_t capacity_blocks,
                                   kvf_sim_router_t **sr_p)
{
    int n = cfg->n_colocated ? cfg->n_colocated : cfg->n_prefill + cfg->n_decode;
    if (n <= 0 || n > SIM_MAX_NODES || (cfg->n_colocated && (cfg->n_prefill || cfg->n_decode)))
        return KVF_ERR_INVAL;
    kvf_sim_router_t *sr = calloc(1, sizeof(*sr));
    if (!sr)
        return KVF_ERR_NOMEM;
    kvf_router_config_t rc = {
        .heartbeat_ms = cfg->heartbeat_ms,
        .max_queue = cfg->max_queue,
        .queue_timeout_ms = cfg->queue_timeout_ms,
        .route = cfg->route,
        .local_prefill_max_tokens = cfg->local_prefill_max_tokens,
    };
    kvf_status_t st = kvf_router__detached_create(&rc, &cfg->model_cfg, cfg->seed, &sr->r);
    if (st != KVF_OK) {
        free(sr);
        return st;
    }
    sr->n_nodes = n;
    for (int i = 0; i < n; i++) {
        bool prefill = !cfg->n_colocated && i < cfg->n_prefill;
        int k = prefill || cfg->n_colocated ? i : i - cfg->n_prefill;
        snprintf(sr->names[i], sizeof(sr->names[i]), "%c%d",
                 cfg->n_colocated ? 'c'
                 : prefill        ? 'p'
                                  : 'd',
                 k);
        bool local = cfg->n_colocated || (!prefill && cfg->local_prefill_max_tokens);
        register_node(sr, cfg, i, prefill ? KVF__ROLE__ROLE_PREFILL : KVF__ROLE__ROLE_DECODE, local,
                      capacity_blocks);
    }
    *sr_p = sr;
    return KVF_OK;
}

void kvf_sim_router_destroy(kvf_sim_router_t *sr)
{
    if (!sr)
        return;
    kvf_router__detached_destroy(sr->r);
    free(sr);
}

void kvf_sim_router_beat(kvf_sim_router_t *sr, int node, const kvf_sim_load_t *load)
{
    Kvf__Load l = KVF__LOAD__INIT;
    l.blocks_free = load->blocks_free;
    l.blocks_total = load->blocks_total;
    l.blocks_used = load->blocks_total - load->blocks_free;
    l.running = load->running;
    l.queued_requests = load->queued_requests;
    l.queued_tokens = load->queued_tokens;
    kvf_router__node_load(&sr->r->nodes.slots[node], &l);
}

void kvf_sim__report(kvf_sim_router_t *sr, int node, uint64_t *added, uint32_t n_added,
                     uint64_t *removed, uint32_t n_removed)
{
    Kvf__PrefixUpdate u = KVF__PREFIX_UPDATE__INIT;
    u.node_id = sr->names[node];
    u.seq = ++sr->seq[node];
    u.full = u.seq == 1;
    u.added = added;
    u.n_added = n_added;
    u.removed = removed;
    u.n_removed = n_removed;
    u.key_id = sr->r->hash_key_id;
    kvf_router__on_prefix_update(sr->r, &u, sr->names[node]);
}

void kvf_sim__req_init(kvf_router_req_t *q, Kvf__Sampling *sampling, uint64_t id,
                       const uint32_t *prompt, uint32_t n_prompt, uint32_t max_tokens)
{
    kvf__sampling__init(sampling);
    sampling->max_tokens = max_tokens;
    q->id = id;
    q->ask.prompt = (uint32_t *)prompt;
    q->ask.n_prompt = n_prompt;
    q->ask.sampling = sampling;
}

void kvf_sim__req_fini(kvf_router_req_t *q)
{
    free(q->ask.hashes);
    q->ask.hashes = NULL;
    q->ask.n_hashes = 0;
}

bool kvf_sim__place(kvf_sim_router_t *sr, kvf_router_req_t *q, int *p_p, int *d_p)
{
    kvf_router_node_t *p, *d;
    if (!kvf_router__pick(sr->r, q, &p, &d))
        return false;
    kvf_router__claim(sr->r, q, p, d);
    *p_p = (int)(p - sr->r->nodes.slots);
    *d_p = (int)(d - sr->r->nodes.slots);
    return true;
}

uint32_t kvf_sim__hits(const kvf_sim_router_t *sr, int node, const kvf_router_req_t *q,
                       uint32_t count)
{
    if (!q->ask.hashes)
        return 0;
    if (count > q->ask.n_hashes)
        count = q->ask.n_hashes;
    return kvf_router__prefix_hits(&sr->r->nodes.slots[node], q->ask.hashes, count);
}

kvf_status_t kvf_sim_router_cached(kvf_sim_router_t *sr, int node, const uint32_t *ids, uint32_t n,
                                   uint32_t n_blocks)
{
    kvf_router_req_t q = {0};
    Kvf__Sampling s;
    kvf_sim__req_init(&q, &s, 0, ids, n, 1);
    kvf_router__req_hashes(sr->r, &q);
    if (!q.ask.hashes || q.ask.n_hashes < n_blocks) {
        kvf_sim__req_fini(&q);
        return KVF_ERR_INVAL;
    }
    kvf_sim__report(sr, node, q.ask.hashes, n_blocks, NULL, 0);
    kvf_sim__req_fini(&q);
    return KVF_OK;
}

bool kvf_sim_router_pick(kvf_sim_router_t *sr, const uint32_t *ids, uint32_t n, uint32_t max_tokens,
                         const char **prefill_p, const char **decode_p)
{
    kvf_router_req_t q = {0};
    Kvf__Sampling s;
    kvf_sim__req_init(&q, &s, 1, ids, n, max_tokens);
    kvf_router_node_t *p, *d;
    bool ok = kvf_router__pick(sr->r, &q, &p, &d);
    kvf_sim__req_fini(&q);
    if (!ok)
        return false;
    *prefill_p = sr->names[p - sr->r->nodes.slots];
    *decode_p = sr->names[d - sr->r->nodes.slots];
    return true;
}
