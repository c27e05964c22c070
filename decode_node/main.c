/* kvf-decode: a decode node of a kvferry cluster. Parses flags, builds the
 * node (decode.h) and runs its loop until SIGTERM (drain) or SIGINT (stop). */
#include "decode.h"

#include "kvf/auth.h"
#include "kvf/backend_flags.h"
#include "kvf/flags.h"
#include "kvf/node_tiers.h"
#include "kvf/kvcache.h"
#include "kvf/log.h"
#include "kvf/signals.h"

#include <signal.h>
#include <string.h>

/* The one mutable global: set by the signal handler, read by the loop. */
static volatile sig_atomic_t g_stop;

typedef struct {
    const char *router_url, *listen_url, *model_dir, *node_id;
    uint64_t kv_mem;
    int max_running, threads;
    kvf_backend_flags_t bf;
    bool prefill_local, no_prefix_cache;
    uint64_t kv_host_mem, kv_disk_size;
    const char *kv_disk;
    int block_size, lease_ms, drain_timeout_ms, max_batch_tokens, stats_interval_ms;
    const char *xfer_mode, *cluster_key_file;
    bool require_key;
} decode_opts_t;

/* Returns -1 to run, else the exit code (help printed, or a bad flag). */
static int parse_decode_flags(int argc, char **argv, decode_opts_t *o)
{
    *o = (decode_opts_t){
        .kv_mem = KVF_DECODE_KV_MEM_DEFAULT,
        .max_running = KVF_DECODE_MAX_RUNNING_DEFAULT,
        .block_size = 16,
        .lease_ms = KVF_DECODE_LEASE_MS_DEFAULT,
        .drain_timeout_ms = 120000,
        .max_batch_tokens = KVF_DECODE_MAX_BATCH_TOKENS_DEFAULT,
        .xfer_mode = "auto",
    };
    kvf_flag_t flags[] = {
        {"router", KVF_FLAG_STRING, &o->router_url, "URL", "the router's inbox (required)", NULL},
        {"listen", KVF_FLAG_STRING, &o->listen_url, "URL", "this node's inbox (required)", NULL},
        {"model", KVF_FLAG_STRING, &o->model_dir, "DIR",
         "Hugging Face model directory (required)", NULL},
        {"kv-mem", KVF_FLAG_SIZE, &o->kv_mem, "BYTES",
         "KV pool budget; capped to what max-running full-context sequences use", NULL},
        {"max-running", KVF_FLAG_INT, &o->max_running, "N",
         "most requests held at once, reserved or decoding", NULL},
        {"threads", KVF_FLAG_INT, &o->threads, "N", "compute threads, 0: one per CPU", NULL},
        KVF_BACKEND_FLAG_ENTRIES(&o->bf),
        KVF_KV_DTYPE_FLAG_ENTRY(&o->bf),
        {"prefill-local", KVF_FLAG_BOOL, &o->prefill_local, NULL,
         "also serve prefill requests naming this node (the colocated baseline)", NULL},
        {"no-prefix-cache", KVF_FLAG_BOOL, &o->no_prefix_cache, NULL,
         "keep no prompt blocks for later requests (default: the full prompt blocks a "
         "prefill node shipped stay cached, and are not shipped again)",
         NULL},
        KVF_NODE_TIERS_FLAG_ENTRIES(&o->kv_host_mem, &o->kv_disk, &o->kv_disk_size),
        {"block-size", KVF_FLAG_INT, &o->block_size, "N",
         "tokens per KV block, 1..256; must match the cluster", NULL},
        {"drain-timeout-ms", KVF_FLAG_INT, &o->drain_timeout_ms, "MS",
         "SIGTERM drains: finish held sequences, then exit; give up after this long", NULL},
        {"lease-ms", KVF_FLAG_INT, &o->lease_ms, "MS",
         "how long a reservation may wait for its K/V and KvReady", NULL},
        {"max-batch-tokens", KVF_FLAG_INT, &o->max_batch_tokens, "N",
         "tokens per forward: decoding sequences plus local prompt chunks", NULL},
        {"xfer-mode", KVF_FLAG_STRING, &o->xfer_mode, "auto|rma|am",
         "how prefill nodes write K/V here: one-sided puts (rma) or two-sided messages (am); "
         "auto: am unless UCX_TLS leaves tcp out",
         NULL},
        {"node-id", KVF_FLAG_STRING, &o->node_id, "ID",
         "this node's id (default: decode-<pid>-<random>)", NULL},
        {"stats-interval-ms", KVF_FLAG_INT, &o->stats_interval_ms, "MS",
         "log the counters this often when they changed (default 30000)", NULL},
        KVF_AUTH_FLAG_ENTRY(&o->cluster_key_file),
        KVF_AUTH_REQUIRE_FLAG_ENTRY(&o->require_key),
    };
    kvf_flagset_t set = {
        .prog = "kvf-decode",
        .usage = "--router URL --listen URL --model DIR [options]",
        .summary =
            "Decode node of a kvferry cluster. Loads the model on its backend (the CPU, or a\n"
            "GPU with --backend cuda), registers with the router, reserves KV blocks for\n"
            "prefill nodes (KvAlloc), receives their K/V over the transport and decodes\n"
            "every admitted sequence in one continuous batch, streaming tokens to the\n"
            "router. With --prefill-local it also prefills requests itself. SIGTERM drains\n"
            "it: the router is told, no new work is taken, every sequence held is finished,\n"
            "then the node deregisters and exits 0. A second SIGTERM, or SIGINT, stops it\n"
            "at once: requests held are reported failed to the router (which dispatches\n"
            "them again) and blocks freed. Logs go to stderr (KVF_LOG sets the level).",
        .flags = flags,
        .n_flags = KVF_NFLAGS(flags),
        .env = true,
    };
    int rc = kvf_flags_parse(&set, argc, argv);
    if (rc != KVF_FLAGS_RUN)
        return rc == KVF_FLAGS_EXIT ? 0 : 2;
    return -1;
}

/* Returns -1 when the options make a node (the transfer mode in
 * *mode_p), else 2 after logging why. */
static int check_decode_opts(const decode_opts_t *o, kvf_decode_xfer_mode_t *mode_p)
{
    if (!o->router_url || !o->listen_url || !o->model_dir) {
        kvf_log_error("--router, --listen and --model are required (see --help)");
        return 2;
    }
    if (o->max_running < 1 || o->block_size < 1 || o->block_size > KVF_KV_BLOCK_SIZE_MAX ||
        o->lease_ms < 1 || o->max_batch_tokens < 1 || o->stats_interval_ms < 0) {
        kvf_log_error("--max-running, --lease-ms and --max-batch-tokens must be positive, "
                      "--stats-interval-ms not negative, --block-size in 1..256");
        return 2;
    }
    if (!strcmp(o->xfer_mode, "auto")) {
        *mode_p = KVF_DECODE_XFER_AUTO;
    } else if (!strcmp(o->xfer_mode, "rma")) {
        *mode_p = KVF_DECODE_XFER_RMA;
    } else if (!strcmp(o->xfer_mode, "am")) {
        *mode_p = KVF_DECODE_XFER_AM;
    } else {
        kvf_log_error("--xfer-mode must be auto, rma or am, not '%s'", o->xfer_mode);
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

static kvf_decode_config_t decode_config(const decode_opts_t *o, kvf_decode_xfer_mode_t mode)
{
    return (kvf_decode_config_t){
        .router_url = o->router_url,
        .listen_url = o->listen_url,
        .model_dir = o->model_dir,
        .node_id = o->node_id,
        .kv_mem = o->kv_mem,
        .max_running = o->max_running,
        .threads = o->threads,
        .backend = o->bf,
        .prefill_local = o->prefill_local,
        .no_prefix_cache = o->no_prefix_cache,
        .kv_host_mem = o->kv_host_mem,
        .kv_disk_dir = o->kv_disk,
        .kv_disk_size = o->kv_disk_size,
        .block_size = o->block_size,
        .lease_ms = (uint32_t)o->lease_ms,
        .drain_timeout_ms = o->drain_timeout_ms > 0 ? (uint32_t)o->drain_timeout_ms : 1,
        .max_batch_tokens = (uint32_t)o->max_batch_tokens,
        .xfer_mode = mode,
        .stats_interval_ms = (uint32_t)o->stats_interval_ms,
    };
}

int main(int argc, char **argv)
{
    decode_opts_t o;
    int rc = parse_decode_flags(argc, argv, &o);
    if (rc >= 0)
        return rc;
    kvf_log_init("decode", o.node_id);
    kvf_decode_xfer_mode_t mode;
    rc = check_decode_opts(&o, &mode);
    if (rc >= 0)
        return rc;
    if (kvf_auth_setup(o.cluster_key_file) != KVF_OK || kvf_auth_require(o.require_key) != KVF_OK)
        return 1;
    kvf_signals_install(&g_stop);
    kvf_decode_config_t cfg = decode_config(&o, mode);
    kvf_decode_t *dec = NULL;
    kvf_status_t st = kvf_decode_create(&cfg, &dec);
    if (st != KVF_OK) {
        kvf_log_error("cannot start: %s", kvf_status_str(st));
        return 1;
    }
    st = kvf_decode_run(dec, &g_stop);
    kvf_decode_destroy(dec);
    if (st != KVF_OK) {
        kvf_log_error("stopped: %s", kvf_status_str(st));
        return 1;
    }
    return 0;
}
