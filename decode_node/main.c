/* kvf-decode: a decode node of a kvferry cluster. Parses flags, builds the
 * node (decode.h) and runs its loop until SIGTERM (drain) or SIGINT (stop). */
#include "decode.h"

#include "kvf/backend_flags.h"
#include "kvf/flags.h"
#include "kvf/kvcache.h"
#include "kvf/log.h"
#include "kvf/signals.h"

#include <signal.h>
#include <string.h>

/* The one mutable global: set by the signal handler, read by the loop. */
static volatile sig_atomic_t g_stop;

int main(int argc, char **argv)
{
    const char *router_url = NULL, *listen_url = NULL, *model_dir = NULL, *node_id = NULL;
    uint64_t kv_mem = KVF_DECODE_KV_MEM_DEFAULT;
    int max_running = KVF_DECODE_MAX_RUNNING_DEFAULT;
    int threads = 0;
    kvf_backend_flags_t bf = {0};
    bool prefill_local = false;
    int block_size = 16;
    int lease_ms = KVF_DECODE_LEASE_MS_DEFAULT;
    int drain_timeout_ms = 120000;
    int max_batch_tokens = KVF_DECODE_MAX_BATCH_TOKENS_DEFAULT;
    const char *xfer_mode = "auto";
    kvf_flag_t flags[] = {
        {"router", KVF_FLAG_STRING, &router_url, "URL", "the router's inbox (required)", NULL},
        {"listen", KVF_FLAG_STRING, &listen_url, "URL", "this node's inbox (required)", NULL},
        {"model", KVF_FLAG_STRING, &model_dir, "DIR", "Hugging Face model directory (required)",
         NULL},
        {"kv-mem", KVF_FLAG_SIZE, &kv_mem, "BYTES",
         "KV pool budget; capped to what max-running full-context sequences use", NULL},
        {"max-running", KVF_FLAG_INT, &max_running, "N",
         "most requests held at once, reserved or decoding", NULL},
        {"threads", KVF_FLAG_INT, &threads, "N", "compute threads, 0: one per CPU", NULL},
        KVF_BACKEND_FLAG_ENTRIES(&bf),
        {"prefill-local", KVF_FLAG_BOOL, &prefill_local, NULL,
         "also serve prefill requests naming this node (the colocated baseline)", NULL},
        {"block-size", KVF_FLAG_INT, &block_size, "N",
         "tokens per KV block, 1..256; must match the cluster", NULL},
        {"drain-timeout-ms", KVF_FLAG_INT, &drain_timeout_ms, "MS",
         "SIGTERM drains: finish held sequences, then exit; give up after this long", NULL},
        {"lease-ms", KVF_FLAG_INT, &lease_ms, "MS",
         "how long a reservation may wait for its K/V and KvReady", NULL},
        {"max-batch-tokens", KVF_FLAG_INT, &max_batch_tokens, "N",
         "tokens per forward: decoding sequences plus local prompt chunks", NULL},
        {"xfer-mode", KVF_FLAG_STRING, &xfer_mode, "auto|rma|am",
         "how prefill nodes write K/V here: one-sided puts (rma) or two-sided messages (am); "
         "auto: am unless UCX_TLS leaves tcp out",
         NULL},
        {"node-id", KVF_FLAG_STRING, &node_id, "ID",
         "this node's id (default: decode-<pid>-<random>)", NULL},
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
    kvf_log_init("decode", node_id);
    if (!router_url || !listen_url || !model_dir) {
        kvf_log_error("--router, --listen and --model are required (see --help)");
        return 2;
    }
    if (max_running < 1 || block_size < 1 || block_size > KVF_KV_BLOCK_SIZE_MAX || lease_ms < 1 ||
        max_batch_tokens < 1) {
        kvf_log_error("--max-running, --lease-ms and --max-batch-tokens must be positive, "
                      "--block-size in 1..256");
        return 2;
    }

    kvf_decode_xfer_mode_t mode;
    if (!strcmp(xfer_mode, "auto")) {
        mode = KVF_DECODE_XFER_AUTO;
    } else if (!strcmp(xfer_mode, "rma")) {
        mode = KVF_DECODE_XFER_RMA;
    } else if (!strcmp(xfer_mode, "am")) {
        mode = KVF_DECODE_XFER_AM;
    } else {
        kvf_log_error("--xfer-mode must be auto, rma or am, not '%s'", xfer_mode);
        return 2;
    }

    kvf_signals_install(&g_stop);

    kvf_decode_config_t cfg = {
        .router_url = router_url,
        .listen_url = listen_url,
        .model_dir = model_dir,
        .node_id = node_id,
        .kv_mem = kv_mem,
        .max_running = max_running,
        .threads = threads,
        .backend = bf,
        .prefill_local = prefill_local,
        .block_size = block_size,
        .lease_ms = (uint32_t)lease_ms,
        .drain_timeout_ms = drain_timeout_ms > 0 ? (uint32_t)drain_timeout_ms : 1,
        .max_batch_tokens = (uint32_t)max_batch_tokens,
        .xfer_mode = mode,
    };
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
