/* The native client front end: GenerateRequest, Cancel and StatsRequest
 * on the client socket (kvf/clientsock.h), GenerateChunk and StatsReply
 * back. See router_internal.h. */
#include <stdlib.h>
#include <string.h>

#include "kvf/clock.h"
#include "kvf/log.h"
#include "router_internal.h"

/* The sink of a request from the native client socket: one per request,
 * freed with its last chunk. */
struct kvf_native_sink {
    kvf_router_t *router;
    kvf_client_hdr_t hdr;
    uint64_t client_req_id;
    uint64_t req_id;
    uint32_t seq;
    kvf_native_sink_t *next; /* the router's list of live native requests */
};

static void native_unlink(kvf_router_t *r, kvf_native_sink_t *ns)
{
    for (kvf_native_sink_t **pp = &r->natives; *pp; pp = &(*pp)->next) {
        if (*pp == ns) {
            *pp = ns->next;
            return;
        }
    }
}

static void native_on_chunk(void *arg, const kvf_router_chunk_t *c)
{
    kvf_native_sink_t *ns = arg;
    Kvf__GenerateChunk chunk = KVF__GENERATE_CHUNK__INIT;
    chunk.client_req_id = ns->client_req_id;
    chunk.seq = ns->seq++;
    chunk.tokens = (uint32_t *)c->tokens;
    chunk.n_tokens = c->n_tokens;
    chunk.text.data = (uint8_t *)c->text;
    chunk.text.len = c->text ? c->text_len : 0;
    chunk.finish_reason = (Kvf__FinishReason)c->finish;
    chunk.status = c->status;
    chunk.error = (char *)(c->error ? c->error : "");
    chunk.prompt_tokens = c->prompt_tokens;
    chunk.ttft_us = c->ttft_us;
    chunk.prefill_compute_us = c->prefill_compute_us;
    chunk.handoff_us = c->handoff_us;
    chunk.kv_bytes = c->kv_bytes;
    chunk.cached_tokens = c->cached_tokens;
    chunk.local_prefill = c->local_prefill;
    kvf_envelope_t env;
    kvf_envelope_init(&env, "router");
    env.body_case = KVF__ENVELOPE__BODY_GENERATE_CHUNK;
    env.generate_chunk = &chunk;
    kvf_status_t st = kvf_client_server_send(ns->router->clients, &ns->hdr, &env);
    if (st != KVF_OK)
        kvf_log_warn("request %llu: reply to client: %s", (unsigned long long)c->req_id,
                     kvf_status_str(st));
    if (c->finish != KVF__FINISH_REASON__FINISH_NONE) {
        native_unlink(ns->router, ns);
        free(ns);
    }
}

static void on_generate(kvf_router_t *r, const Kvf__GenerateRequest *g, const kvf_client_hdr_t *hdr)
{
    kvf_native_sink_t *ns = calloc(1, sizeof(*ns));
    if (!ns)
        return;
    ns->router = r;
    ns->hdr = *hdr;
    ns->client_req_id = g->client_req_id;
    ns->next = r->natives;
    r->natives = ns;
    kvf_router_gen_t gen = {
        /* bytes, not NUL-terminated: an empty one is no prompt */
        .prompt = g->prompt.len ? (const char *)g->prompt.data : NULL,
        .prompt_len = g->prompt.len,
        .ids = g->prompt_ids,
        .n_ids = g->n_prompt_ids,
        .sampling = g->sampling,
        .cache_salt = g->cache_salt.data,
        .cache_salt_len = g->cache_salt.len,
    };
    kvf_router_sink_t sink = {native_on_chunk, ns};
    /* The id the request will get. A refused (or at once finished) request
     * has had its final chunk, and ns is gone: do not touch it after. */
    ns->req_id = r->next_req_id;
    kvf_router_submit(r, &gen, &sink);
}

static void on_client_cancel(kvf_router_t *r, const Kvf__Cancel *c, const kvf_client_hdr_t *hdr)
{
    /* A client names its own request id; it is unique per connection (the
     * pipe id, the header's first 4 bytes). */
    for (kvf_native_sink_t *ns = r->natives; ns; ns = ns->next) {
        if (ns->client_req_id == c->req_id && ns->hdr.len >= 4 && hdr->len >= 4 &&
            !memcmp(ns->hdr.bytes, hdr->bytes, 4)) {
            kvf_router_cancel(r, ns->req_id);
            return;
        }
    }
}

static void load_of(const kvf_router_node_t *node, Kvf__Load *load)
{
    kvf__load__init(load);
    load->blocks_free = node->blocks_free;
    load->blocks_used = node->blocks_used;
    load->blocks_total = node->blocks_total;
    load->running = node->running;
    load->queued_requests = node->queued_requests;
    load->queued_tokens = node->queued_tokens;
    load->blocks_cached = node->blocks_cached;
    load->tier_ram_blocks = node->tier_ram_blocks;
    load->tier_disk_blocks = node->tier_disk_blocks;
    load->tier_disk_read_ns = node->disk_read_ns;
    load->tier_disk_read_busy_ns = node->disk_read_busy_ns;
    load->tier_disk_read_bytes = node->disk_read_bytes;
    load->tier_disk_io_threads = node->disk_io_threads;
}

static void on_stats(kvf_router_t *r, const Kvf__StatsRequest *sr, const kvf_client_hdr_t *hdr)
{
    Kvf__NodeStats ns[ROUTER_MAX_NODES], *nsp[ROUTER_MAX_NODES];
    Kvf__Load loads[ROUTER_MAX_NODES];
    size_t n = 0;
    uint64_t now = kvf_clock_ns();
    for (int i = 0; i < ROUTER_MAX_NODES; i++) {
        kvf_router_node_t *node = &r->nodes.slots[i];
        if (!node->used)
            continue;
        kvf__node_stats__init(&ns[n]);
        load_of(node, &loads[n]);
        ns[n].node_id = node->id;
        ns[n].role = node->role;
        ns[n].state = (char *)kvf_router__node_state_name(node->state);
        ns[n].load = &loads[n];
        ns[n].inbox_url = node->inbox;
        ns[n].age_ms = (now - node->registered_ns) / 1000000u;
        ns[n].dispatched = node->dispatched;
        ns[n].disk_break_even_tokens = kvf_router__disk_break_even(r, node);
        nsp[n] = &ns[n];
        n++;
    }
    Kvf__StatsReply rep = KVF__STATS_REPLY__INIT;
    rep.req_id = sr->req_id;
    rep.nodes = nsp;
    rep.n_nodes = n;
    rep.requests_total = r->count.requests;
    rep.requests_running = r->count.running - r->queue_len;
    rep.requests_queued = r->queue_len;
    rep.requests_failed = r->count.failed;
    rep.requests_cancelled = r->count.cancelled;
    rep.stale_dropped = r->count.stale;
    rep.redispatched = r->count.redispatched;
    rep.prefill_tokens_computed = r->count.prefill_computed;
    rep.prefill_tokens_cached = r->count.prefill_cached;
    rep.kv_bytes_shipped = r->count.kv_bytes;
    rep.local_prefills = r->count.local_prefills;
    rep.kv_bytes_pulled = r->count.kv_bytes_pulled;
    kvf_envelope_t env;
    kvf_envelope_init(&env, "router");
    env.body_case = KVF__ENVELOPE__BODY_STATS_REPLY;
    env.stats_reply = &rep;
    kvf_client_server_send(r->clients, hdr, &env);
}

void kvf_router__handle_client_message(kvf_router_t *r, kvf_envelope_t *env,
                                       const kvf_client_hdr_t *hdr)
{
    switch (env->body_case) {
    case KVF__ENVELOPE__BODY_GENERATE_REQUEST:
        on_generate(r, env->generate_request, hdr);
        break;
    case KVF__ENVELOPE__BODY_CANCEL:
        on_client_cancel(r, env->cancel, hdr);
        break;
    case KVF__ENVELOPE__BODY_STATS_REQUEST:
        on_stats(r, env->stats_request, hdr);
        break;
    default:
        r->count.malformed++;
        kvf_log_warn("unexpected %s on the client socket dropped", kvf_envelope_body_name(env));
    }
}

void kvf_router__natives_fini(kvf_router_t *r)
{
    while (r->natives) {
        kvf_native_sink_t *ns = r->natives;
        r->natives = ns->next;
        free(ns);
    }
}
