/* The simulator's event loop: arrivals placed by the router's own code
 * (router_view.c), its wait queue, the nodes' heartbeats, the end of each
 * request, and the statistics of a run. The nodes are in node.c. See
 * sim.h and docs/simulator.md. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "kvf/kvcache.h"
#include "sim_internal.h"

struct sim_event {
    uint64_t at_ns, seq;
    uint32_t kind, index;
};

void kvf_sim_config_defaults(kvf_sim_config_t *cfg)
{
    cfg->block_size = KVF_KV_BLOCK_SIZE_DEFAULT;
    cfg->chunk_tokens = 2048;
    cfg->max_batch = 256;
    cfg->prefix_cache = 64;
    cfg->heartbeat_ms = 500;
    cfg->max_queue = 256;
    cfg->queue_timeout_ms = 30000;
    cfg->route = KVF_ROUTE_KV;
    cfg->seed = 1;
    cfg->arrival_scale = 1;
}

int kvf_sim_gpus(const kvf_sim_config_t *cfg)
{
    return (cfg->n_colocated + cfg->n_prefill + cfg->n_decode) * cfg->model.tp;
}

/* ---- events ------------------------------------------------------------------- */

static bool before(const struct sim_event *a, const struct sim_event *b)
{
    return a->at_ns < b->at_ns || (a->at_ns == b->at_ns && a->seq < b->seq);
}

kvf_status_t sim_push(sim_t *s, uint64_t at_ns, sim_event_kind_t kind, uint32_t index)
{
    if (s->n_heap == s->cap_heap) {
        size_t cap = s->cap_heap ? s->cap_heap * 2 : 256;
        struct sim_event *grown = realloc(s->heap, cap * sizeof(*grown));
        if (!grown)
            return KVF_ERR_NOMEM;
        s->heap = grown;
        s->cap_heap = cap;
    }
    size_t i = s->n_heap++;
    s->heap[i] = (struct sim_event){at_ns, s->seq++, kind, index};
    while (i && before(&s->heap[i], &s->heap[(i - 1) / 2])) {
        struct sim_event t = s->heap[i];
        s->heap[i] = s->heap[(i - 1) / 2];
        s->heap[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
    return KVF_OK;
}

static struct sim_event pop(sim_t *s)
{
    struct sim_event top = s->heap[0];
    s->heap[0] = s->heap[--s->n_heap];
    for (size_t i = 0;;) {
        size_t l = 2 * i + 1, m = i;
        if (l < s->n_heap && before(&s->heap[l], &s->heap[m]))
            m = l;
        if (l + 1 < s->n_heap && before(&s->heap[l + 1], &s->heap[m]))
            m = l + 1;
        if (m == i)
            break;
        struct sim_event t = s->heap[i];
        s->heap[i] = s->heap[m];
        s->heap[m] = t;
        i = m;
    }
    return top;
}

/* ---- requests ------------------------------------------------------------------- */

uint64_t sim_msg_delay_ns(const sim_t *s)
{
    /* the dispatch to the node that prefills; the tokens, decode node to
     * router and router to client */
    return (uint64_t)llround(3 * s->cfg->hw.msg_latency_s * 1e9);
}

void sim_end(sim_t *s, sim_req_t *r, bool refused)
{
    if (!refused) {
        sim_node_t *dn = &s->nodes[r->d];
        dn->blocks_free += r->blocks;
        dn->reserved--;
        r->t_done = s->now + sim_msg_delay_ns(s);
    }
    r->state = refused ? REQ_REFUSED : REQ_FINISHED;
    kvf_sim__req_fini(&r->q);
    s->n_ended++;
}

static void queue_push(sim_t *s, sim_req_t *r)
{
    r->state = REQ_IN_QUEUE;
    sim_req_append(&s->queue, &s->queue_tail, r);
    s->queue_len++;
}

static sim_req_t *queue_pop(sim_t *s)
{
    sim_req_t *r = s->queue;
    s->queue = r->next;
    if (!s->queue)
        s->queue_tail = NULL;
    s->queue_len--;
    r->next = NULL;
    return r;
}

/* Whether r fits in a decode node at all (the router refuses one that
 * never could: sched.c). */
static bool could_fit(const sim_t *s, const sim_req_t *r)
{
    uint32_t need = kvf_router__blocks_for(r->w->n_prompt + r->w->n_output, s->cfg->block_size);
    for (int i = 0; i < s->n_nodes; i++)
        if (s->nodes[i].decodes && s->nodes[i].blocks_total >= need)
            return true;
    return false;
}

/* As the router's kvf_router__schedule: placed now when a node can take
 * it, else queued (refused when it could never fit or the queue is
 * full). */
static void schedule(sim_t *s, sim_req_t *r)
{
    int p, d;
    if (kvf_sim__place(s->sr, &r->q, &p, &d)) {
        sim_node_start(s, r, p, d);
        return;
    }
    if (!could_fit(s, r) || s->queue_len >= s->cfg->max_queue) {
        sim_end(s, r, true);
        return;
    }
    queue_push(s, r);
}

/* The tokens of r whose block hashes routing needs: its shared prefix
 * and the first block past it. No other request has that block, and a
 * node lists only prefixes (node.c), so every lookup of a later block
 * misses: the routing is the same as with the whole chain, and a
 * 32k-token prompt is not hashed to no purpose. */
static uint32_t hashed_tokens(const sim_t *s, const sim_req_t *r)
{
    uint32_t bs = s->cfg->block_size, shared = r->prefix >= 0 ? r->w->prefix_tokens : 0;
    uint32_t upto = (shared / bs + 1) * bs;
    return upto < r->w->n_prompt ? upto : r->w->n_prompt;
}

/* r's block hashes over those tokens, by the router's code. */
static void hash_prompt(sim_t *s, sim_req_t *r, uint32_t n_hashed)
{
    r->q.ask.n_prompt = n_hashed;
    kvf_router__req_hashes(s->sr->r, &r->q);
    r->q.ask.n_prompt = r->w->n_prompt;
}

static void arrive(sim_t *s, size_t i)
{
    sim_req_t *r = &s->reqs[i];
    r->t_arrive = s->now;
    kvf_sim__req_init(&r->q, &r->sampling, i + 1, s->prompt, r->w->n_prompt, r->w->n_output);
    uint32_t n_hashed = hashed_tokens(s, r);
    kvf_sim_prompt_fill(r->w, i, s->prompt, n_hashed);
    hash_prompt(s, r, n_hashed);
    schedule(s, r);
    r->q.ask.prompt = NULL; /* read once, for the block hashes */
    if (i + 1 < s->w->n) {
        double at = s->w->reqs[i + 1].at_s * s->cfg->arrival_scale;
        if (sim_push(s, (uint64_t)llround(at * 1e9), EV_ARRIVE, (uint32_t)(i + 1)) != KVF_OK)
            s->failed = true;
    }
}

/* Node i's heartbeat: its load to the router, which then drains its
 * queue, oldest first, while nodes take them (registry.c, sched.c). */
static void beat(sim_t *s, int i)
{
    sim_node_t *n = &s->nodes[i];
    kvf_sim_load_t load = {n->blocks_free, n->blocks_total, n->reserved, n->fifo_n, n->fifo_tokens};
    kvf_sim_router_beat(s->sr, i, &load);
    uint64_t timeout = (uint64_t)s->cfg->queue_timeout_ms * 1000000ull;
    while (s->queue) {
        sim_req_t *r = s->queue;
        if (s->now - r->t_arrive > timeout) {
            sim_end(s, queue_pop(s), true);
            continue;
        }
        int p, d;
        if (!kvf_sim__place(s->sr, &r->q, &p, &d))
            break;
        sim_node_start(s, queue_pop(s), p, d);
    }
    if (s->n_ended < s->w->n && sim_push(s, s->now + (uint64_t)s->cfg->heartbeat_ms * 1000000ull,
                                         EV_BEAT, (uint32_t)i) != KVF_OK)
        s->failed = true;
}

/* ---- a run ------------------------------------------------------------------------ */

static int cmp_prefix(const void *a, const void *b)
{
    int32_t x = ((const sim_prefix_t *)a)->id, y = ((const sim_prefix_t *)b)->id;
    return (x > y) - (x < y);
}

/* The distinct prefix ids of the workload, sorted, and each request's
 * index among them. */
static kvf_status_t index_prefixes(sim_t *s)
{
    const kvf_sim_workload_t *w = s->w;
    s->prefixes = calloc(w->n ? w->n : 1, sizeof(*s->prefixes));
    if (!s->prefixes)
        return KVF_ERR_NOMEM;
    size_t n = 0;
    for (size_t i = 0; i < w->n; i++)
        if (w->reqs[i].prefix_id >= 0)
            s->prefixes[n++].id = w->reqs[i].prefix_id;
    qsort(s->prefixes, n, sizeof(*s->prefixes), cmp_prefix);
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (!u || s->prefixes[u - 1].id != s->prefixes[i].id)
            s->prefixes[u++] = s->prefixes[i];
    s->n_prefixes = u;
    for (size_t i = 0; i < w->n; i++) {
        sim_prefix_t key = {.id = w->reqs[i].prefix_id};
        sim_prefix_t *px = key.id >= 0 && w->reqs[i].prefix_tokens
                               ? bsearch(&key, s->prefixes, u, sizeof(key), cmp_prefix)
                               : NULL;
        s->reqs[i].prefix = px ? (int32_t)(px - s->prefixes) : -1;
    }
    return KVF_OK;
}

static kvf_status_t nodes_init(sim_t *s, uint32_t capacity)
{
    const kvf_sim_config_t *cfg = s->cfg;
    s->n_nodes = cfg->n_colocated ? cfg->n_colocated : cfg->n_prefill + cfg->n_decode;
    for (int i = 0; i < s->n_nodes; i++) {
        sim_node_t *n = &s->nodes[i];
        bool prefill_node = !cfg->n_colocated && i < cfg->n_prefill;
        n->decodes = !prefill_node;
        n->prefills = prefill_node || cfg->n_colocated || cfg->local_prefill_max_tokens;
        n->blocks_free = n->blocks_total = capacity;
        n->pieces = malloc(cfg->chunk_tokens * sizeof(*n->pieces));
        n->lru = malloc((cfg->prefix_cache ? cfg->prefix_cache : 1) * sizeof(*n->lru));
        if (!n->pieces || !n->lru)
            return KVF_ERR_NOMEM;
        /* heartbeats spread over the period, as nodes started apart would */
        uint64_t offset = (uint64_t)cfg->heartbeat_ms * 1000000ull * (uint64_t)(i + 1) /
                          (uint64_t)(s->n_nodes + 1);
        kvf_status_t st = sim_push(s, offset, EV_BEAT, (uint32_t)i);
        if (st != KVF_OK)
            return st;
    }
    return KVF_OK;
}

/* Checks cfg and builds the run's state; err says what is wrong. */
static kvf_status_t sim_init(sim_t *s, const kvf_sim_config_t *cfg, const kvf_sim_workload_t *w,
                             char *err, size_t err_len)
{
    *s = (sim_t){.cfg = cfg, .w = w};
    int n = cfg->n_colocated + cfg->n_prefill + cfg->n_decode;
    if ((cfg->n_colocated && (cfg->n_prefill || cfg->n_decode)) ||
        (!cfg->n_colocated && (cfg->n_prefill <= 0 || cfg->n_decode <= 0)) || n > SIM_MAX_NODES ||
        !cfg->chunk_tokens || !cfg->block_size || !cfg->max_batch || !cfg->heartbeat_ms) {
        snprintf(err, err_len,
                 "a cluster is --prefill N --decode M (both >= 1) or --colocated N, "
                 "at most %d nodes",
                 SIM_MAX_NODES);
        return KVF_ERR_INVAL;
    }
    uint32_t capacity = kvf_sim_capacity_blocks(&cfg->hw, &cfg->model, cfg->block_size);
    if (!capacity) {
        snprintf(err, err_len,
                 "the weights (%.1f GB) do not fit in %d x %.0f GB of %s with room "
                 "for KV: raise --tp",
                 cfg->model.weight_bytes / 1e9, cfg->model.tp, cfg->hw.hbm_bytes / 1e9,
                 cfg->hw.name);
        return KVF_ERR_INVAL;
    }
    s->block_bytes = cfg->model.kv_bytes_per_token * cfg->block_size;
    uint32_t longest = 1;
    for (size_t i = 0; i < w->n; i++)
        longest = w->reqs[i].n_prompt > longest ? w->reqs[i].n_prompt : longest;
    s->reqs = calloc(w->n ? w->n : 1, sizeof(*s->reqs));
    s->prompt = malloc(longest * sizeof(*s->prompt));
    if (!s->reqs || !s->prompt)
        return KVF_ERR_NOMEM;
    for (size_t i = 0; i < w->n; i++)
        s->reqs[i].w = &w->reqs[i];
    kvf_status_t st = index_prefixes(s);
    if (st == KVF_OK)
        st = kvf_sim_router_create(cfg, capacity, &s->sr);
    if (st == KVF_OK)
        st = nodes_init(s, capacity);
    if (st == KVF_OK && w->n)
        st = sim_push(s, (uint64_t)llround(w->reqs[0].at_s * cfg->arrival_scale * 1e9), EV_ARRIVE,
                      0);
    if (st != KVF_OK)
        snprintf(err, err_len, "cannot set up the run: %s", kvf_status_str(st));
    return st;
}

static void sim_fini(sim_t *s)
{
    for (size_t i = 0; s->reqs && i < s->w->n; i++)
        kvf_sim__req_fini(&s->reqs[i].q);
    for (int i = 0; i < s->n_nodes; i++)
        sim_node_fini(&s->nodes[i]);
    for (size_t i = 0; s->prefixes && i < s->n_prefixes; i++)
        free(s->prefixes[i].hashes);
    kvf_sim_router_destroy(s->sr);
    free(s->prefixes);
    free(s->reqs);
    free(s->prompt);
    free(s->heap);
}

static void loop(sim_t *s)
{
    while (s->n_ended < s->w->n && s->n_heap && !s->failed) {
        struct sim_event ev = pop(s);
        s->now = ev.at_ns;
        if (ev.kind == EV_ARRIVE)
            arrive(s, ev.index);
        else if (ev.kind == EV_STEP)
            sim_node_step_done(s, (int)ev.index);
        else if (ev.kind == EV_SHIPPED)
            sim_node_shipped(s, &s->reqs[ev.index]);
        else if (ev.kind == EV_ALLOC)
            sim_node_alloc(s, &s->reqs[ev.index]);
        else if (ev.kind == EV_GRANT)
            sim_node_grant(s, &s->reqs[ev.index]);
        else if (ev.kind == EV_KICK)
            sim_node_kick(s, (int)ev.index);
        else
            beat(s, (int)ev.index);
    }
}

/* The pools' busy shares over the run. */
static void utilisation(const sim_t *s, double span_ns, kvf_sim_result_t *res)
{
    double busy[2] = {0, 0};
    int count[2] = {0, 0};
    for (int i = 0; i < s->n_nodes; i++) {
        int pool = s->nodes[i].decodes ? 1 : 0;
        busy[pool] += (double)s->nodes[i].busy_ns;
        count[pool]++;
    }
    res->util_prefill = count[0] && span_ns > 0 ? busy[0] / (span_ns * count[0]) : 0;
    res->util_decode = count[1] && span_ns > 0 ? busy[1] / (span_ns * count[1]) : 0;
}

/* Whether finished request r met both SLOs (0: no bound). */
static bool within_slo(const kvf_sim_config_t *cfg, double ttft_ms, double tpot_ms)
{
    return (!cfg->slo_ttft_ms || ttft_ms <= cfg->slo_ttft_ms) &&
           (!cfg->slo_tpot_ms || tpot_ms <= cfg->slo_tpot_ms);
}

static kvf_status_t collect(const sim_t *s, kvf_sim_result_t *res)
{
    size_t n = s->w->n;
    *res = (kvf_sim_result_t){.n = n,
                              .steps = s->steps,
                              .transfers = s->transfers,
                              .kv_bytes = s->kv_bytes,
                              .cached_tokens = s->cached_tokens};
    res->ttft_ms = malloc((n ? n : 1) * sizeof(double));
    res->tpot_ms = malloc((n ? n : 1) * sizeof(double));
    double *e2e = malloc((n ? n : 1) * sizeof(double));
    if (!res->ttft_ms || !res->tpot_ms || !e2e) {
        free(e2e);
        kvf_sim_result_fini(res);
        return KVF_ERR_NOMEM;
    }
    uint64_t first = n ? s->reqs[0].t_arrive : 0, last = first, tokens = 0;
    size_t good = 0, n_e2e = 0;
    for (size_t i = 0; i < n; i++) {
        const sim_req_t *r = &s->reqs[i];
        if (r->state != REQ_FINISHED) {
            res->n_refused += r->state == REQ_REFUSED;
            continue;
        }
        res->n_done++;
        tokens += r->out;
        last = r->t_done > last ? r->t_done : last;
        double ttft = (double)(r->t_first - r->t_arrive) / 1e6;
        double tpot = r->out > 1 ? (double)(r->t_done - r->t_first) / 1e6 / (r->out - 1) : 0;
        res->ttft_ms[res->n_ttft++] = ttft;
        if (r->out > 1)
            res->tpot_ms[res->n_tpot++] = tpot;
        e2e[n_e2e++] = (double)(r->t_done - r->t_arrive) / 1e6;
        good += within_slo(s->cfg, ttft, tpot);
    }
    double span_ns = (double)(last - first);
    res->duration_s = span_ns / 1e9;
    kvf_bench_percentiles(res->ttft_ms, res->n_ttft, res->ttft);
    kvf_bench_percentiles(res->tpot_ms, res->n_tpot, res->tpot);
    kvf_bench_percentiles(e2e, n_e2e, res->e2e);
    free(e2e);
    res->attainment = n ? (double)good / (double)n : 0;
    if (res->duration_s > 0) {
        res->goodput = (double)good / res->duration_s;
        res->req_per_s = (double)res->n_done / res->duration_s;
        res->tok_per_s = (double)tokens / res->duration_s;
    }
    utilisation(s, span_ns, res);
    return KVF_OK;
}

kvf_status_t kvf_sim_run(const kvf_sim_config_t *cfg, const kvf_sim_workload_t *w,
                         kvf_sim_result_t *res, char *err, size_t err_len)
{
    sim_t *s = malloc(sizeof(*s));
    if (!s) {
        snprintf(err, err_len, "out of memory");
        return KVF_ERR_NOMEM;
    }
    kvf_status_t st = sim_init(s, cfg, w, err, err_len);
    if (st == KVF_OK) {
        loop(s);
        st = s->failed ? KVF_ERR_NOMEM : collect(s, res);
        if (st != KVF_OK)
            snprintf(err, err_len, "out of memory");
    }
    sim_fini(s);
    free(s);
    return st;
}

void kvf_sim_result_fini(kvf_sim_result_t *res)
{
    free(res->ttft_ms);
    free(res->tpot_ms);
    res->ttft_ms = res->tpot_ms = NULL;
}
