/* The socketless router of the cluster simulator (sim/): the router's
 * state with no loop, no socket and no tokenizer, so that the simulator
 * runs the routing code itself (route.c, prefix_index.c, and the
 * bookkeeping of registry.c and sched.c) on a simulated clock. See
 * router_internal.h, "loop.c, detached.c". */
#include <stdlib.h>
#include <string.h>

#include "kvf/sampling.h"
#include "router_internal.h"

kvf_status_t kvf_router__detached_create(const kvf_router_config_t *cfg,
                                         const kvf_model_config_t *model, uint64_t seed,
                                         kvf_router_t **router_p)
{
    kvf_router_t *r = calloc(1, sizeof(*r));
    if (!r)
        return KVF_ERR_NOMEM;
    r->cfg = *cfg;
    kvf_router__config_defaults(&r->cfg);
    r->model = *model;
    r->next_req_id = 1;
    uint64_t s = seed;
    r->seed_state = kvf_splitmix64(&s);
    uint64_t k[2] = {kvf_splitmix64(&s), kvf_splitmix64(&s)};
    memcpy(r->prefix_key, k, sizeof(r->prefix_key));
    kvf_router__keys_set(r);
    r->route_rng = r->seed_state ^ 0x5851f42d4c957f2dull; /* as kvf_router_create draws */
    *router_p = r;
    return KVF_OK;
}

void kvf_router__detached_destroy(kvf_router_t *r)
{
    if (!r)
        return;
    for (int i = 0; i < ROUTER_MAX_NODES; i++)
        kvf_router__prefix_drop(&r->nodes.slots[i]);
    free(r);
}
