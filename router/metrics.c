#include "metrics.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kvf/auth.h"
#include "kvf/msg.h"
#include "strbuf.h"

/* Bucket upper bounds in seconds (the +Inf bucket is implicit). */
static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,
                                     0.5,   0.75,  1.0,  2.5,  5.0,  7.5,  10.0, 20.0, 40.0};
static const double itl_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03,
                                    0.04,  0.05,   0.075, 0.1,  0.15,  0.2,  0.3,   0.4,
                                    0.5,   0.75,   1.0,   2.5,  5.0,   7.5,  10.0};
static const double e2e_bounds[] = {0.01, 0.025, 0.05, 0.1,   0.3,   0.5,   0.8,  1.0,
                                    1.5,  2.0,   2.5,  5.0,   10.0,  15.0,  20.0, 30.0,
                                    40.0, 50.0,  60.0, 120.0, 240.0, 480.0, 960.0};
static const double handoff_bounds[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                        0.05,   0.1,     0.25,   0.5,   1.0,    2.5,   5.0,  10.0};

#define METRICS_MAX_BUCKETS 32
#define NELEM(a)            (sizeof(a) / sizeof((a)[0]))

typedef struct {
    const double *bounds; /* (n_bounds) ascending */
    size_t n_bounds;
    uint64_t counts[METRICS_MAX_BUCKETS + 1]; /* per bucket, not cumulative; last: +Inf */
    uint64_t count;
    double sum;
} histogram_t;

/* Finish reasons as labels, indexed by Kvf__FinishReason. */
static const char *const finish_labels[] = {"none", "stop", "length", "cancelled", "error"};
#define N_FINISH 5

struct kvf_metrics {
    uint64_t requests[N_FINISH]; /* finished, by finish reason */
    uint64_t prompt_tokens, generation_tokens;
    uint64_t kv_bytes, kv_pull_bytes;
    uint64_t prefix_queries, prefix_hits, prefix_query_tokens, prefix_hit_tokens;
    histogram_t ttft, itl, e2e, handoff;
};

static void histogram_init(histogram_t *h, const double *bounds, size_t n)
{
    memset(h, 0, sizeof(*h));
    h->bounds = bounds;
    h->n_bounds = n;
}

/* Adds n observations of value v (seconds). */
static void histogram_observe(histogram_t *h, double v, uint64_t n)
{
    size_t b = 0;
    while (b < h->n_bounds && v > h->bounds[b])
        b++;
    h->counts[b] += n;
    h->count += n;
    h->sum += v * (double)n;
}

kvf_status_t kvf_metrics_create(kvf_metrics_t **metrics_p)
{
    kvf_metrics_t *m = calloc(1, sizeof(*m));
    if (!m)
        return KVF_ERR_NOMEM;
    histogram_init(&m->ttft, ttft_bounds, NELEM(ttft_bounds));
    histogram_init(&m->itl, itl_bounds, NELEM(itl_bounds));
    histogram_init(&m->e2e, e2e_bounds, NELEM(e2e_bounds));
    histogram_init(&m->handoff, handoff_bounds, NELEM(handoff_bounds));
    *metrics_p = m;
    return KVF_OK;
}

void kvf_metrics_destroy(kvf_metrics_t *m)
{
    free(m);
}

void kvf_metrics_observe_tokens(kvf_metrics_t *m, uint64_t arrival_ns, uint64_t *last_ns,
                                size_t n_tokens, uint64_t now_ns)
{
    if (!m || n_tokens == 0)
        return;
    if (*last_ns == 0) {
        histogram_observe(&m->ttft, (double)(now_ns - arrival_ns) * 1e-9, 1);
        /* Tokens that came with the first one came at once. */
        if (n_tokens > 1)
            histogram_observe(&m->itl, 0.0, n_tokens - 1);
    } else {
        double gap = (double)(now_ns - *last_ns) * 1e-9;
        histogram_observe(&m->itl, gap / (double)n_tokens, n_tokens);
    }
    *last_ns = now_ns;
}

void kvf_metrics_observe_finished(kvf_metrics_t *m, int finish, uint32_t prompt_tokens,
                                  uint32_t generation_tokens, uint64_t e2e_ns)
{
    if (!m)
        return;
    if (finish < 0 || finish >= N_FINISH)
        finish = KVF__FINISH_REASON__FINISH_ERROR;
    m->requests[finish]++;
    m->prompt_tokens += prompt_tokens;
    m->generation_tokens += generation_tokens;
    histogram_observe(&m->e2e, (double)e2e_ns * 1e-9, 1);
}

void kvf_metrics_observe_rejected(kvf_metrics_t *m)
{
    if (m)
        m->requests[KVF__FINISH_REASON__FINISH_ERROR]++;
}

void kvf_metrics_observe_handoff(kvf_metrics_t *m, uint64_t handoff_us, uint64_t kv_bytes)
{
    if (!m)
        return;
    histogram_observe(&m->handoff, (double)handoff_us * 1e-6, 1);
    m->kv_bytes += kv_bytes;
}

void kvf_metrics_observe_pull(kvf_metrics_t *m, uint64_t kv_bytes)
{
    if (m)
        m->kv_pull_bytes += kv_bytes;
}

void kvf_metrics_observe_prefix(kvf_metrics_t *m, uint64_t prompt_tokens, uint64_t cached_tokens)
{
    if (!m)
        return;
    m->prefix_queries++;
    m->prefix_hits += cached_tokens > 0;
    m->prefix_query_tokens += prompt_tokens;
    m->prefix_hit_tokens += cached_tokens;
}

/* A label value with \, " and newline escaped, as the text format asks. */
static void put_label(kvf_strbuf_t *sb, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            kvf_strbuf_printf(sb, "\\%c", *v);
        else if (*v == '\n')
            kvf_strbuf_puts(sb, "\\n");
        else
            kvf_strbuf_append(sb, v, 1);
    }
}

static void put_header(kvf_strbuf_t *sb, const char *name, const char *type, const char *help)
{
    kvf_strbuf_printf(sb, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void put_histogram(kvf_strbuf_t *sb, const char *name, const char *help,
                          const histogram_t *h)
{
    put_header(sb, name, "histogram", help);
    uint64_t cumulative = 0;
    for (size_t b = 0; b < h->n_bounds; b++) {
        cumulative += h->counts[b];
        kvf_strbuf_printf(sb, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[b],
                          (unsigned long long)cumulative);
    }
    kvf_strbuf_printf(sb, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)h->count);
    kvf_strbuf_printf(sb, "%s_sum %.9g\n%s_count %llu\n", name, h->sum, name,
                      (unsigned long long)h->count);
}

static void put_counter(kvf_strbuf_t *sb, const char *name, const char *help, uint64_t v)
{
    put_header(sb, name, "counter", help);
    kvf_strbuf_printf(sb, "%s %llu\n", name, (unsigned long long)v);
}

/* One gauge line per node: name{node="..",role=".."} value. */
static void put_node_gauge(kvf_strbuf_t *sb, const char *name, const kvf_router_node_info_t *n,
                           double v)
{
    kvf_strbuf_printf(sb, "%s{node=\"", name);
    put_label(sb, n->id);
    kvf_strbuf_printf(sb, "\",role=\"%s\"} %.9g\n", n->role, v);
}

/* The control plane's refusals in this process, by reason (kvf/auth.h
 * counts them where the router's sockets take frames). */
static void put_auth(kvf_strbuf_t *sb)
{
    put_header(sb, "kvf_control_authenticated", "gauge",
               "1 when the control plane is authenticated (--cluster-key-file), else 0.");
    kvf_strbuf_printf(sb, "kvf_control_authenticated %d\n", kvf_auth_enabled() ? 1 : 0);
    kvf_auth_counters_t c;
    kvf_auth_counters(&c);
    put_header(sb, "kvf_control_refused_total", "counter",
               "Control messages refused by the router's sockets, by reason (untagged, bad_tag, "
               "replay, stale, misdirected).");
    for (int r = 0; r < KVF_AUTH_N_REASONS; r++)
        kvf_strbuf_printf(sb, "kvf_control_refused_total{reason=\"%s\"} %llu\n",
                          kvf_auth_reason_name((kvf_auth_reason_t)r),
                          (unsigned long long)c.refused[r]);
}

/* The node gauges: nodes by role and state, and each node's blocks,
 * sequences and queue. */
static void put_nodes(kvf_strbuf_t *sb, const kvf_router_snapshot_t *snap)
{
    static const char *const roles[] = {"prefill", "decode"};
    static const char *const states[] = {"live", "draining", "dead", "quarantined"};
    put_header(sb, "kvf_nodes", "gauge", "Registered nodes by role and state.");
    for (size_t r = 0; r < NELEM(roles); r++) {
        for (size_t s = 0; s < NELEM(states); s++) {
            unsigned count = 0;
            for (size_t i = 0; i < snap->n_nodes; i++)
                count += !strcmp(snap->nodes[i].role, roles[r]) &&
                         !strcmp(snap->nodes[i].state, states[s]);
            kvf_strbuf_printf(sb, "kvf_nodes{role=\"%s\",state=\"%s\"} %u\n", roles[r], states[s],
                              count);
        }
    }
    put_header(sb, "kvf_kv_blocks_used", "gauge", "KV cache blocks in use on a node.");
    for (size_t i = 0; i < snap->n_nodes; i++)
        put_node_gauge(sb, "kvf_kv_blocks_used", &snap->nodes[i], snap->nodes[i].blocks_used);
    put_header(sb, "kvf_prefix_cache_blocks", "gauge",
               "Prefix-cache blocks on a node that no request uses (evictable, counted free).");
    for (size_t i = 0; i < snap->n_nodes; i++)
        put_node_gauge(sb, "kvf_prefix_cache_blocks", &snap->nodes[i],
                       snap->nodes[i].blocks_cached);
    put_header(sb, "kvf_prefix_index_blocks", "gauge",
               "Cached block hashes of a node in the router's index (KV-aware routing).");
    for (size_t i = 0; i < snap->n_nodes; i++)
        put_node_gauge(sb, "kvf_prefix_index_blocks", &snap->nodes[i],
                       snap->nodes[i].prefix_indexed);
    put_header(sb, "kvf_kv_tier_ram_blocks", "gauge",
               "Cached KV blocks a node's host RAM tier holds (docs/kv-tiers.md).");
    for (size_t i = 0; i < snap->n_nodes; i++)
        put_node_gauge(sb, "kvf_kv_tier_ram_blocks", &snap->nodes[i],
                       snap->nodes[i].tier_ram_blocks);
    put_header(sb, "kvf_kv_tier_disk_blocks", "gauge",
               "Cached KV blocks a node's disk tier holds (docs/kv-tiers.md).");
    for (size_t i = 0; i < snap->n_nodes; i++)
        put_node_gauge(sb, "kvf_kv_tier_disk_blocks", &snap->nodes[i],
                       snap->nodes[i].tier_disk_blocks);
    put_header(sb, "kvf_kv_blocks_total", "gauge", "KV cache blocks of a node's pool.");
    for (size_t i = 0; i < snap->n_nodes; i++)
        put_node_gauge(sb, "kvf_kv_blocks_total", &snap->nodes[i], snap->nodes[i].blocks_total);
    put_header(sb, "kvf_kv_cache_usage_perc", "gauge",
               "Fraction of a node's KV cache blocks in use (1 = full).");
    for (size_t i = 0; i < snap->n_nodes; i++) {
        const kvf_router_node_info_t *n = &snap->nodes[i];
        put_node_gauge(sb, "kvf_kv_cache_usage_perc", n,
                       n->blocks_total ? (double)n->blocks_used / n->blocks_total : 0.0);
    }
    put_header(sb, "kvf_node_running_requests", "gauge", "Sequences a node is working on.");
    for (size_t i = 0; i < snap->n_nodes; i++)
        put_node_gauge(sb, "kvf_node_running_requests", &snap->nodes[i], snap->nodes[i].running);
    put_header(sb, "kvf_node_queued_tokens", "gauge",
               "Prompt tokens a node holds queued, not yet prefilled (scaling signal of the "
               "prefill pool).");
    for (size_t i = 0; i < snap->n_nodes; i++)
        put_node_gauge(sb, "kvf_node_queued_tokens", &snap->nodes[i],
                       (double)snap->nodes[i].queued_tokens);
}

kvf_status_t kvf_metrics_render(const kvf_metrics_t *m, const kvf_router_snapshot_t *snap,
                                char **text_p, size_t *len_p)
{
    kvf_strbuf_t sb;
    kvf_strbuf_init(&sb);

    put_header(&sb, "kvf_requests_total", "counter",
               "Requests finished, by finish reason (error includes refused requests).");
    for (int f = 1; f < N_FINISH; f++)
        kvf_strbuf_printf(&sb, "kvf_requests_total{finished_reason=\"%s\"} %llu\n",
                          finish_labels[f], (unsigned long long)m->requests[f]);
    put_counter(&sb, "kvf_prompt_tokens_total", "Prompt tokens of finished requests.",
                m->prompt_tokens);
    put_counter(&sb, "kvf_generation_tokens_total", "Tokens generated for finished requests.",
                m->generation_tokens);
    put_counter(&sb, "kvf_kv_transfer_bytes_total",
                "KV cache bytes shipped from prefill to decode nodes.", m->kv_bytes);
    put_counter(&sb, "kvf_kv_pull_bytes_total",
                "KV cache bytes prefill nodes read from decode nodes' cached prefix blocks.",
                m->kv_pull_bytes);
    put_counter(&sb, "kvf_prefix_cache_queries_total",
                "Prefills that looked up their prompt in the prefix cache.", m->prefix_queries);
    put_counter(&sb, "kvf_prefix_cache_hits_total",
                "Prefills that reused cached prompt blocks.", m->prefix_hits);
    put_counter(&sb, "kvf_prefix_cache_query_tokens_total",
                "Prompt tokens of the prefills that looked up the prefix cache.",
                m->prefix_query_tokens);
    put_counter(&sb, "kvf_prefix_cache_hit_tokens_total",
                "Prompt tokens reused from the prefix cache instead of computed.",
                m->prefix_hit_tokens);
    put_counter(&sb, "kvf_local_prefills_total",
                "Prefills a decode node ran itself (--prefill-local: conditional "
                "disaggregation, or no prefill node).",
                snap->local_prefills);
    put_histogram(&sb, "kvf_time_to_first_token_seconds",
                  "Time from a request's arrival to its first token.", &m->ttft);
    put_histogram(&sb, "kvf_inter_token_latency_seconds",
                  "Time between consecutive tokens of a request.", &m->itl);
    put_histogram(&sb, "kvf_e2e_request_latency_seconds",
                  "Time from a request's arrival to its end.", &m->e2e);
    put_histogram(&sb, "kvf_kv_transfer_seconds",
                  "KV handoff time of a prefill (transfer completion to the decode node).",
                  &m->handoff);
    put_auth(&sb);
    put_header(&sb, "kvf_register_refused_total", "counter",
               "Node registrations the router refused, by reason (invalid, model_shape, "
               "block_size, kv_dtype, layout, fingerprint, descriptor).");
    for (int r = 0; r < KVF_ROUTER_N_REFUSALS; r++)
        kvf_strbuf_printf(&sb, "kvf_register_refused_total{reason=\"%s\"} %llu\n",
                          kvf_router_refusal_name((kvf_router_refusal_t)r),
                          (unsigned long long)snap->register_refused[r]);

    put_header(&sb, "kvf_messages_refused_total", "counter",
               "Node messages the router dropped, by reason (token, sender, inbox, id_taken, "
               "not_assigned, descriptor).");
    for (int r = 0; r < KVF_ROUTER_N_MSG_REFUSALS; r++)
        kvf_strbuf_printf(&sb, "kvf_messages_refused_total{reason=\"%s\"} %llu\n",
                          kvf_router_msg_refusal_name((kvf_router_msg_refusal_t)r),
                          (unsigned long long)snap->messages_refused[r]);

    put_header(&sb, "kvf_num_requests_waiting", "gauge",
               "Requests queued for a decode node with room.");
    kvf_strbuf_printf(&sb, "kvf_num_requests_waiting %u\n", snap->requests_queued);
    put_header(&sb, "kvf_num_requests_running", "gauge", "Requests dispatched to nodes.");
    kvf_strbuf_printf(&sb, "kvf_num_requests_running %u\n", snap->requests_running);

    put_nodes(&sb, snap);
    return kvf_strbuf_take(&sb, text_p, len_p);
}
