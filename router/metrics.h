/* Router metrics: counters and histograms of requests, tokens, latencies
 * and KV transfers, and the control plane's refusals (kvf/auth.h, read
 * from its atomic counters), rendered in the Prometheus text format for
 * /metrics.
 *
 * Names follow the serving engines operators already watch
 * (vllm:time_to_first_token_seconds ...), with the prefix kvf_.
 *
 * Thread rules: everything here runs on the router's loop thread (the
 * observations are made where the router handles requests; /metrics is
 * rendered from a task posted to the loop). No locks. */
#ifndef KVF_METRICS_H
#define KVF_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "kvf/status.h"
#include "router.h"

/* Created with the router (kvf_router_metrics() gives it); freed with it. */
kvf_status_t kvf_metrics_create(kvf_metrics_t **metrics_p);
void kvf_metrics_destroy(kvf_metrics_t *m);

/* New tokens of a request reached its client at now_ns. *last_ns is the
 * request's time of its previous token (0 before the first) and is
 * updated. The first token observes the time to first token (from
 * arrival_ns); every later token one inter-token latency (a chunk of k
 * tokens spreads its gap over the k). */
void kvf_metrics_observe_tokens(kvf_metrics_t *m, uint64_t arrival_ns, uint64_t *last_ns,
                                size_t n_tokens, uint64_t now_ns);

/* A request that entered the router finished (finish: Kvf__FinishReason)
 * after e2e_ns, with its prompt and generated token counts. */
void kvf_metrics_observe_finished(kvf_metrics_t *m, int finish, uint32_t prompt_tokens,
                                  uint32_t generation_tokens, uint64_t e2e_ns);

/* A request refused before it entered the router (bad input, overload). */
void kvf_metrics_observe_rejected(kvf_metrics_t *m);

/* A prefill finished: the KV handoff to the decode node took handoff_us
 * and shipped kv_bytes. */
void kvf_metrics_observe_handoff(kvf_metrics_t *m, uint64_t handoff_us, uint64_t kv_bytes);
/* A prefill node read kv_bytes of the decode node's cached prefix blocks
 * instead of computing them. */
void kvf_metrics_observe_pull(kvf_metrics_t *m, uint64_t kv_bytes);
/* A prefill of prompt_tokens of which cached_tokens came from the prefill
 * node's prefix cache. */
void kvf_metrics_observe_prefix(kvf_metrics_t *m, uint64_t prompt_tokens, uint64_t cached_tokens);

/* Renders every metric, with the gauges of snap (queue, running requests,
 * nodes). On success *text_p is malloc'd, NUL-terminated, owned by the
 * caller; *len_p excludes the NUL. */
kvf_status_t kvf_metrics_render(const kvf_metrics_t *m, const kvf_router_snapshot_t *snap,
                                char **text_p, size_t *len_p);

#endif
