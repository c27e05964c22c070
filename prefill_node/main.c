/* kvf-prefill: a prefill node of a kvferry cluster. Parses flags, builds the
 * node (prefill.c) and runs its loop until SIGINT or SIGTERM. */
#include "prefill.h"

#include "kvf/auth.h"
#include "kvf/backend_flags.h"
#include "kvf/flags.h"
#include "kvf/node_tiers.h"
#include "kvf/log.h"
#include "kvf/signals.h"

#include <signal.h>
#include <string.h>

/* The only mutable global: set by the signal handler, read by the loop. */
static volatile sig_atomic_t stop_requested;

typedef struct {
    const char *router_url, *listen_url, *model_dir, *node_id;
    int threads, max_batch_tokens;
    kvf_backend_flags_t bf;
    int block_size, alloc_timeout_ms, stats_interval_ms;
    const char *cluster_key_file;
    bool require_key;
    uint64_t kv_mem, kv_host_mem, kv_disk_size;
    const char *kv_disk;
    bool checksum, no_prefix_cache, no_prefix_pull;
} prefill_opts_t;

/* Returns -1 to run, else the exit code (help printed, or a bad flag). */
static int parse_prefill_flags(int argc, char **argv, prefill_opts_t *o)
{
    *o = (prefill_opts_t){
        .max_batch_tokens = KVF_PREFILL_MAX_BATCH_TOKENS_DEFAULT,
        .block_size = 16,
        .alloc_timeout_ms = KVF_PREFILL_ALLOC_TIMEOUT_MS_DEFAULT,
        .kv_mem = KVF_PREFILL_KV_MEM_DEFAULT,
    };
    kvf_flag_t flags[] = {
        {"router", KVF_FLAG_STRING, &o->router_url, "URL", "the router's inbox (required)", NULL},
        {"listen", KVF_FLAG_STRING, &o->listen_url, "URL", "this node's inbox (required)", NULL},
        {"model", KVF_FLAG_STRING, &o->model_dir, "DIR",
         "Hugging Face model directory (required)", NULL},
        {"threads", KVF_FLAG_INT, &o->threads, "N", "compute threads; 0: one per CPU", NULL},
        KVF_BACKEND_FLAG_ENTRIES(&o->bf),
        KVF_KV_DTYPE_FLAG_ENTRY(&o->bf),
        {"kv-mem", KVF_FLAG_SIZE, &o->kv_mem, "BYTES", "local KV pool size", NULL},
        {"max-batch-tokens", KVF_FLAG_INT, &o->max_batch_tokens, "N",
         "prompt tokens per forward; longer prompts are chunked", NULL},
        {"block-size", KVF_FLAG_INT, &o->block_size, "N",
         "tokens per KV block; must match the decode nodes", NULL},
        {"node-id", KVF_FLAG_STRING, &o->node_id, "ID",
         "node id (default: prefill-<pid>-<random>)", NULL},
        {"checksum", KVF_FLAG_BOOL, &o->checksum, NULL,
         "send a CRC32C with every shipped range (the decode node verifies it)", NULL},
        {"no-prefix-cache", KVF_FLAG_BOOL, &o->no_prefix_cache, NULL,
         "compute every prompt from its first token (default: a prompt whose leading "
         "blocks an earlier one computed reuses their K/V)",
         NULL},
        {"no-prefix-pull", KVF_FLAG_BOOL, &o->no_prefix_pull, NULL,
         "compute the prompt blocks the decode node holds already but this node does not "
         "(default: they are read from the decode node's pool, one-sided)",
         NULL},
        KVF_NODE_TIERS_FLAG_ENTRIES(&o->kv_host_mem, &o->kv_disk, &o->kv_disk_size),
        {"alloc-timeout-ms", KVF_FLAG_INT, &o->alloc_timeout_ms, "MS",
         "how long to wait for a decode node's KvAllocReply", NULL},
        {"stats-interval-ms", KVF_FLAG_INT, &o->stats_interval_ms, "MS",
         "log the counters this often when they changed (default 30000)", NULL},
        KVF_AUTH_FLAG_ENTRY(&o->cluster_key_file),
        KVF_AUTH_REQUIRE_FLAG_ENTRY(&o->require_key),
    };
    kvf_flagset_t set = {
        .prog = "kvf-prefill",
        .usage = "--router URL --listen URL --model DIR [options]",
        .summary = "Prefill node of a kvferry cluster: registers with the router, batches the\n"
                   "prompts it is sent into forwards (chunking long ones), ships each layer's\n"
                   "K/V blocks to the chosen decode node while later layers compute, samples\n"
                   "the first token and hands the request to the decode node. Computes on the\n"
                   "CPU, or on a GPU with --backend cuda.\n"
                   "SIGTERM drains it: new work is handed back to the router, every request\n"
                   "held is completed and shipped, then it deregisters and exits 0. A second\n"
                   "SIGTERM, or SIGINT, stops it at once (requests in flight are reported to\n"
                   "the router, which sends them elsewhere).",
        .flags = flags,
        .n_flags = KVF_NFLAGS(flags),
        .env = true,
    };
    int rc = kvf_flags_parse(&set, argc, argv);
    if (rc != KVF_FLAGS_RUN)
        return rc == KVF_FLAGS_EXIT ? 0 : 2;
    return -1;
}

/* Returns -1 when the options make a node, else 2 after logging why. */
static int check_prefill_opts(const prefill_opts_t *o)
{
    if (!o->router_url || !o->listen_url || !o->model_dir) {
        kvf_log_error("--router, --listen and --model are required (see --help)");
        return 2;
    }
    if (o->max_batch_tokens < 1 || o->block_size < 1 || o->block_size > 256 ||
        o->alloc_timeout_ms < 1 || o->stats_interval_ms < 0) {
        kvf_log_error("--max-batch-tokens, --alloc-timeout-ms must be positive, "
                      "--stats-interval-ms not negative and --block-size in 1..256");
        return 2;
    }
    kvf_node_tiers_config_t tc = {
        .host_bytes = o->kv_host_mem, .disk_dir = o->kv_disk, .disk_bytes = o->kv_disk_size};
    const char *bad = kvf_node_tiers_check(&tc, o->no_prefix_cache);
    if (bad) {
        kvf_log_error("%s", bad);
        return 2;
    }
    return -1;
}

int main(int argc, char **argv)
{
    prefill_opts_t o;
    int rc = parse_prefill_flags(argc, argv, &o);
    if (rc >= 0)
        return rc;
    kvf_log_init("prefill", o.node_id);
    rc = check_prefill_opts(&o);
    if (rc >= 0)
        return rc;
    if (kvf_auth_setup(o.cluster_key_file) != KVF_OK || kvf_auth_require(o.require_key) != KVF_OK)
        return 1;
    kvf_signals_install(&stop_requested);
    kvf_prefill_config_t cfg = {
        .router_url = o.router_url,
        .listen_url = o.listen_url,
        .model_dir = o.model_dir,
        .node_id = o.node_id,
        .threads = o.threads,
        .backend = o.bf,
        .kv_mem = o.kv_mem,
        .max_batch_tokens = o.max_batch_tokens,
        .block_size = o.block_size,
        .checksum = o.checksum,
        .no_prefix_cache = o.no_prefix_cache,
        .no_prefix_pull = o.no_prefix_pull,
        .kv_host_mem = o.kv_host_mem,
        .kv_disk_dir = o.kv_disk,
        .kv_disk_size = o.kv_disk_size,
        .alloc_timeout_ms = o.alloc_timeout_ms,
        .stats_interval_ms = (uint32_t)o.stats_interval_ms,
    };
    kvf_prefill_t *node = NULL;
    kvf_status_t st = kvf_prefill_create(&cfg, &node);
    if (st != KVF_OK) {
        kvf_log_error("cannot start: %s", kvf_status_str(st));
        return 1;
    }
    st = kvf_prefill_run(node, &stop_requested);
    kvf_prefill_destroy(node);
    if (st != KVF_OK) {
        kvf_log_error("exiting: %s", kvf_status_str(st));
        return 1;
    }
    return 0;
}
