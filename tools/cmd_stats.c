/* kvf stats --router URL [--json]: the cluster as the router sees it. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "kvf/auth.h"
#include "kvf/clientsock.h"
#include "kvf/flags.h"

static const char *role_name(Kvf__Role r)
{
    return r == KVF__ROLE__ROLE_PREFILL ? "prefill" : r == KVF__ROLE__ROLE_DECODE ? "decode" : "?";
}

static void print_json_string(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            printf("\\u%04x", *s);
        else
            putchar(*s);
    }
    putchar('"');
}

/* Asks the router for its StatsReply, waiting up to timeout_ms. Returns 0
 * with *in_p the caller's (kvf_envelope_free), or 1 after a line on
 * stderr. */
static int fetch_stats(kvf_client_t *client, const char *prog, const char *router,
                       int timeout_ms, kvf_envelope_t **in_p)
{
    kvf_status_t st = kvf_client_stats(client, "kvf-stats", timeout_ms, in_p);
    if (st == KVF_ERR_TIMEOUT)
        fprintf(stderr, "%s: no stats from %s%s\n", prog, router,
                kvf_auth_enabled() ? ""
                                   : " (a router with a cluster key answers only clients that "
                                     "have it: --cluster-key-file)");
    else if (st != KVF_OK)
        fprintf(stderr, "%s: router at %s does not answer\n", prog, router);
    return st == KVF_OK ? 0 : 1;
}

static void print_node_json(const Kvf__NodeStats *n)
{
    const Kvf__Load *l = n->load;
    printf("{\"id\": ");
    print_json_string(n->node_id);
    printf(", \"role\": \"%s\", \"state\": ", role_name(n->role));
    print_json_string(n->state);
    printf(", \"inbox\": ");
    print_json_string(n->inbox_url);
    printf(", \"blocks_used\": %u, \"blocks_total\": %u, \"blocks_free\": %u, "
           "\"running\": %u, \"queued_requests\": %u, \"queued_tokens\": %llu, "
           "\"age_ms\": %llu, \"dispatched\": %llu, \"blocks_cached\": %u, "
           "\"tier_ram_blocks\": %u, \"tier_disk_blocks\": %u, \"tier_disk_read_ns\": %llu, "
           "\"tier_disk_read_busy_ns\": %llu, \"disk_break_even_tokens\": %u}",
           l ? l->blocks_used : 0, l ? l->blocks_total : 0, l ? l->blocks_free : 0,
           l ? l->running : 0, l ? l->queued_requests : 0,
           (unsigned long long)(l ? l->queued_tokens : 0), (unsigned long long)n->age_ms,
           (unsigned long long)n->dispatched, l ? l->blocks_cached : 0,
           l ? l->tier_ram_blocks : 0, l ? l->tier_disk_blocks : 0,
           (unsigned long long)(l ? l->tier_disk_read_ns : 0),
           (unsigned long long)(l ? l->tier_disk_read_busy_ns : 0), n->disk_break_even_tokens);
}

/* A node's KV tiers, when it has blocks in them or measured disk reads. */
static void print_node_tiers(const Kvf__NodeStats *n)
{
    const Kvf__Load *l = n->load;
    if (!l || (!l->tier_ram_blocks && !l->tier_disk_blocks && !l->tier_disk_read_ns))
        return;
    printf("  %s kv tiers: %u ram + %u disk blocks", n->node_id, l->tier_ram_blocks,
           l->tier_disk_blocks);
    if (l->tier_disk_read_ns && l->tier_disk_read_busy_ns)
        printf("; disk reads %.3f ms queued to checked, %.0f MB/s each, %u at once",
               (double)l->tier_disk_read_ns / 1e6,
               (double)l->tier_disk_read_bytes * 1e3 / (double)l->tier_disk_read_busy_ns,
               l->tier_disk_io_threads);
    if (n->disk_break_even_tokens == UINT32_MAX)
        printf("; no disk hit is cheaper than recomputing");
    else if (n->disk_break_even_tokens)
        printf("; disk hit break-even %u tokens", n->disk_break_even_tokens);
    printf("\n");
}

/* --json: one object, the nodes and the request counts. */
static void print_stats_json(const Kvf__StatsReply *s)
{
    printf("{\"nodes\": [");
    for (size_t i = 0; i < s->n_nodes; i++) {
        printf("%s", i ? ", " : "");
        print_node_json(s->nodes[i]);
    }
    printf("], \"requests\": {\"total\": %llu, \"running\": %llu, \"queued\": %llu, "
           "\"failed\": %llu, \"cancelled\": %llu, \"redispatched\": %llu}, "
           "\"prefill\": {\"tokens_computed\": %llu, \"tokens_cached\": %llu, "
           "\"kv_bytes_shipped\": %llu, \"kv_bytes_pulled\": %llu, \"local\": %llu}, "
           "\"stale_dropped\": %llu}\n",
           (unsigned long long)s->requests_total, (unsigned long long)s->requests_running,
           (unsigned long long)s->requests_queued, (unsigned long long)s->requests_failed,
           (unsigned long long)s->requests_cancelled, (unsigned long long)s->redispatched,
           (unsigned long long)s->prefill_tokens_computed,
           (unsigned long long)s->prefill_tokens_cached, (unsigned long long)s->kv_bytes_shipped,
           (unsigned long long)s->kv_bytes_pulled, (unsigned long long)s->local_prefills,
           (unsigned long long)s->stale_dropped);
}

/* A table of the nodes, then the request counts. */
static void print_stats_table(const Kvf__StatsReply *s)
{
    printf("%-28s %-8s %-9s %12s %8s %8s\n", "node", "role", "state", "kv blocks", "running",
           "queued");
    for (size_t i = 0; i < s->n_nodes; i++) {
        const Kvf__NodeStats *n = s->nodes[i];
        const Kvf__Load *l = n->load;
        char blocks[32];
        snprintf(blocks, sizeof(blocks), "%u/%u", l ? l->blocks_used : 0,
                 l ? l->blocks_total : 0);
        printf("%-28s %-8s %-9s %12s %8u %8u\n", n->node_id, role_name(n->role), n->state,
               blocks, l ? l->running : 0, l ? l->queued_requests : 0);
    }
    for (size_t i = 0; i < s->n_nodes; i++)
        print_node_tiers(s->nodes[i]);
    printf("requests: %llu total, %llu running, %llu queued, %llu failed, %llu cancelled\n",
           (unsigned long long)s->requests_total, (unsigned long long)s->requests_running,
           (unsigned long long)s->requests_queued, (unsigned long long)s->requests_failed,
           (unsigned long long)s->requests_cancelled);
    printf("prefill: %llu prompt tokens computed, %llu reused from prefix caches, %llu KV bytes "
           "shipped, %llu KV bytes pulled, %llu prefilled on decode nodes\n",
           (unsigned long long)s->prefill_tokens_computed,
           (unsigned long long)s->prefill_tokens_cached, (unsigned long long)s->kv_bytes_shipped,
           (unsigned long long)s->kv_bytes_pulled, (unsigned long long)s->local_prefills);
}

int kvf_cmd_stats(int argc, char **argv)
{
    const char *router = NULL, *key_file = NULL;
    bool json = false;
    int timeout_ms = 5000;
    kvf_flag_t flags[] = {
        {"router", KVF_FLAG_STRING, &router, "URL", "the router's client URL (required)", NULL},
        {"json", KVF_FLAG_BOOL, &json, NULL, "print one JSON object", NULL},
        {"timeout-ms", KVF_FLAG_INT, &timeout_ms, "MS", "how long to wait for the router", NULL},
        KVF_AUTH_FLAG_ENTRY(&key_file),
    };
    kvf_flagset_t set = {
        .prog = argv[0],
        .usage = "--router URL [--json]",
        .summary = "Prints the cluster's nodes (id, role, state, load, KV blocks used and total) "
                   "and request\ncounts, as the router sees them.",
        .flags = flags,
        .n_flags = KVF_NFLAGS(flags),
    };
    int rc = kvf_flags_parse(&set, argc, argv);
    if (rc != KVF_FLAGS_RUN)
        return rc == KVF_FLAGS_EXIT ? 0 : 2;
    if (!router) {
        fprintf(stderr, "%s: --router URL is required\n", argv[0]);
        return 2;
    }
    if (kvf_auth_setup(key_file) != KVF_OK)
        return 1;
    kvf_client_t *client;
    if (kvf_client_create(router, &client) != KVF_OK) {
        fprintf(stderr, "%s: cannot connect to %s\n", argv[0], router);
        return 1;
    }
    kvf_envelope_t *in = NULL;
    rc = fetch_stats(client, argv[0], router, timeout_ms, &in);
    if (rc == 0) {
        if (json)
            print_stats_json(in->stats_reply);
        else
            print_stats_table(in->stats_reply);
        kvf_envelope_free(in);
    }
    kvf_client_destroy(client);
    return rc;
}
