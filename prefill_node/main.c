/* kvf-prefill: a prefill node of a kvferry cluster. Parses flags, builds the
 * node (prefill.c) and runs its loop until SIGINT or SIGTERM. */
#include "prefill.h"

#include "kvf/backend_flags.h"
#include "kvf/flags.h"
#include "kvf/log.h"
#include "kvf/signals.h"

#include <signal.h>
#include <string.h>

/* The only mutable global: set by the signal handler, read by the loop. */
static volatile sig_atomic_t stop_requested;

int main(int argc, char **argv)
{
    const char *router_url = NULL, *listen_url = NULL, *model_dir = NULL, *node_id = NULL;
    int threads = 0, max_batch_tokens = KVF_PREFILL_MAX_BATCH_TOKENS_DEFAULT;
    kvf_backend_flags_t bf = {0};
    int block_size = 16, alloc_timeout_ms = KVF_PREFILL_ALLOC_TIMEOUT_MS_DEFAULT;
    uint64_t kv_mem = KVF_PREFILL_KV_MEM_DEFAULT;
    bool checksum = false;
    kvf_flag_t flags[] = {
        {"router", KVF_FLAG_STRING, &router_url, "URL", "the router's inbox (required)", NULL},
        {"listen", KVF_FLAG_STRING, &listen_url, "URL", "this node's inbox (required)", NULL},
        {"model", KVF_FLAG_STRING, &model_dir, "DIR", "Hugging Face model directory (required)",
         NULL},
        {"threads", KVF_FLAG_INT, &threads, "N", "compute threads; 0: one per CPU", NULL},
        KVF_BACKEND_FLAG_ENTRIES(&bf),
        {"kv-mem", KVF_FLAG_SIZE, &kv_mem, "BYTES", "local KV pool size", NULL},
        {"max-batch-tokens", KVF_FLAG_INT, &max_batch_tokens, "N",
         "prompt tokens per forward; longer prompts are chunked", NULL},
        {"block-size", KVF_FLAG_INT, &block_size, "N",
         "tokens per KV block; must match the decode nodes", NULL},
        {"node-id", KVF_FLAG_STRING, &node_id, "ID", "node id (default: prefill-<pid>-<random>)",
         NULL},
        {"checksum", KVF_FLAG_BOOL, &checksum, NULL,
         "send a CRC32C with every shipped range (the decode node verifies it)", NULL},
        {"alloc-timeout-ms", KVF_FLAG_INT, &alloc_timeout_ms, "MS",
         "how long to wait for a decode node's KvAllocReply", NULL},
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
    kvf_log_init("prefill", node_id);
    if (!router_url || !listen_url || !model_dir) {
        kvf_log_error("--router, --listen and --model are required (see --help)");
        return 2;
    }
    if (max_batch_tokens < 1 || block_size < 1 || block_size > 256 || alloc_timeout_ms < 1) {
        kvf_log_error("--max-batch-tokens, --alloc-timeout-ms must be positive and --block-size "
                      "in 1..256");
        return 2;
    }

    kvf_signals_install(&stop_requested);

    kvf_prefill_config_t cfg = {
        .router_url = router_url,
        .listen_url = listen_url,
        .model_dir = model_dir,
        .node_id = node_id,
        .threads = threads,
        .backend = bf,
        .kv_mem = kv_mem,
        .max_batch_tokens = max_batch_tokens,
        .block_size = block_size,
        .checksum = checksum,
        .alloc_timeout_ms = alloc_timeout_ms,
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
