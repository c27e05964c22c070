/* kvf-router: the client-facing process of a kvferry cluster. */
#include <signal.h>
#include <string.h>

#include "kvf/flags.h"
#include "http.h"
#include "kvf/log.h"
#include "kvf/signals.h"
#include "router.h"

static volatile sig_atomic_t stop_flag;

int main(int argc, char **argv)
{
    const char *listen_url = "tcp://127.0.0.1:5555";
    const char *client_url = "tcp://127.0.0.1:5556";
    const char *model_dir = NULL;
    int heartbeat_ms = 500, max_queue = 256, queue_timeout_ms = 30000;
    int request_timeout_ms = 600000, max_attempts = 5, default_max_tokens = 256;
    const char *http_listen = "127.0.0.1:8000", *served_model_name = NULL, *api_key = NULL;
    const char *chat_template = NULL;
    uint64_t max_body = 4u << 20;
    int http_max_connections = 512;
    bool http_seen = false;
    int prefill_timeout_ms = 60000, stall_timeout_ms = 30000;
    kvf_flag_t flags[] = {
        {"listen", KVF_FLAG_STRING, &listen_url, "URL", "inbox the nodes send to", NULL},
        {"client", KVF_FLAG_STRING, &client_url, "URL", "native client socket", NULL},
        {"model", KVF_FLAG_STRING, &model_dir, "DIR",
         "model directory (tokenizer and configs only; required)", NULL},
        {"heartbeat-ms", KVF_FLAG_INT, &heartbeat_ms, "MS",
         "node heartbeat period; 3 missed = dead", NULL},
        {"max-queue", KVF_FLAG_INT, &max_queue, "N",
         "requests waiting for a decode node before 'overloaded'", NULL},
        {"queue-timeout-ms", KVF_FLAG_INT, &queue_timeout_ms, "MS", "longest wait in the queue",
         NULL},
        {"request-timeout-ms", KVF_FLAG_INT, &request_timeout_ms, "MS",
         "longest life of a request", NULL},
        {"prefill-timeout-ms", KVF_FLAG_INT, &prefill_timeout_ms, "MS",
         "dispatch to first token before the request is sent again", NULL},
        {"stall-timeout-ms", KVF_FLAG_INT, &stall_timeout_ms, "MS",
         "longest gap between tokens before the request is sent again", NULL},
        {"max-attempts", KVF_FLAG_INT, &max_attempts, "N",
         "dispatches of one request before it fails", NULL},
        {"default-max-tokens", KVF_FLAG_INT, &default_max_tokens, "N",
         "max tokens of a request that names none", NULL},
        {"http", KVF_FLAG_STRING, &http_listen, "HOST:PORT",
         "OpenAI-compatible HTTP API, /health and /metrics ('off' or '' disables)", &http_seen},
        {"served-model-name", KVF_FLAG_STRING, &served_model_name, "NAME",
         "model name of the HTTP API (default: the model directory's name)", NULL},
        {"api-key", KVF_FLAG_STRING, &api_key, "KEY",
         "require 'Authorization: Bearer KEY' on /v1/ (default: none)", NULL},
        {"chat-template", KVF_FLAG_STRING, &chat_template, "NAME",
         "llama3, chatml, qwen2, llama2 or mistral (default: recognised from the model's "
         "tokenizer_config.json)",
         NULL},
        {"max-body", KVF_FLAG_SIZE, &max_body, "BYTES", "largest HTTP request body", NULL},
        {"http-max-connections", KVF_FLAG_INT, &http_max_connections, "N",
         "concurrent HTTP connections", NULL},
    };
    kvf_flagset_t set = {
        .prog = "kvf-router",
        .usage = "--model DIR [--listen URL] [--client URL] [options]",
        .summary =
            "Router of a kvferry cluster. Keeps the registry of prefill and decode nodes (they\n"
            "register at --listen and heartbeat), takes generate requests from native clients\n"
            "at --client (kvf generate --router URL), tokenizes them, picks a decode node by free\n"
            "KV blocks and a prefill node by queued prompt tokens, streams the tokens back, and\n"
            "re-dispatches a request whose node died. URLs are nanomsg URLs (tcp://127.0.0.1:5555,\n"
            "ipc:///path). --http serves the OpenAI API (/v1/completions, /v1/chat/completions,\n"
            "/v1/models), /health and Prometheus /metrics.",
        .flags = flags,
        .n_flags = KVF_NFLAGS(flags),
        .env = true,
    };
    int rc = kvf_flags_parse(&set, argc, argv);
    if (rc != KVF_FLAGS_RUN)
        return rc == KVF_FLAGS_EXIT ? 0 : 2;
    kvf_log_init("router", NULL);
    if (!model_dir) {
        kvf_log_error("--model DIR is required (see --help)");
        return 2;
    }
    if (heartbeat_ms < 50 || max_queue < 0 || queue_timeout_ms < 1 || request_timeout_ms < 1 ||
        max_attempts < 1 || default_max_tokens < 1 || prefill_timeout_ms < 1 ||
        stall_timeout_ms < 1 || max_body < 1 || max_body > (1ull << 32) ||
        http_max_connections < 1) {
        kvf_log_error("a numeric option is out of range (see --help)");
        return 2;
    }
    kvf_router_config_t cfg = {
        .listen_url = listen_url,
        .client_url = client_url,
        .model_dir = model_dir,
        .heartbeat_ms = (unsigned)heartbeat_ms,
        .dead_after_missed = 3,
        .max_queue = (unsigned)max_queue,
        .queue_timeout_ms = (unsigned)queue_timeout_ms,
        .request_timeout_ms = (unsigned)request_timeout_ms,
        .max_attempts = (unsigned)max_attempts,
        .default_max_tokens = (unsigned)default_max_tokens,
        .prefill_timeout_ms = (unsigned)prefill_timeout_ms,
        .stall_timeout_ms = (unsigned)stall_timeout_ms,
    };
    kvf_router_t *router;
    kvf_status_t st = kvf_router_create(&cfg, &router);
    if (st != KVF_OK) {
        kvf_log_error("cannot start: %s", kvf_status_str(st));
        return 1;
    }
    kvf_http_t *http = NULL;
    if (http_listen && *http_listen && strcmp(http_listen, "off") != 0) {
        kvf_http_config_t hc = {
            .listen = http_listen,
            .served_model_name = served_model_name,
            .api_key = api_key,
            .chat_template = chat_template,
            .max_body = (size_t)max_body,
            .max_connections = (unsigned)http_max_connections,
        };
        st = kvf_http_create(router, &hc, &http);
        /* The default address may be taken (another router, a test running
         * beside): then serve without HTTP. A given --http must work. */
        if (st != KVF_OK && (http_seen || st != KVF_ERR_IO)) {
            kvf_router_destroy(router);
            return 1;
        }
        if (st != KVF_OK)
            kvf_log_warn("continuing without the HTTP API (give --http HOST:PORT or --http off)");
    }
    kvf_signals_install(&stop_flag);
    st = kvf_router_run(router, &stop_flag);
    kvf_http_destroy(http); /* the loop has stopped: nothing holds its exchanges any more */
    kvf_router_destroy(router);
    return st == KVF_OK ? 0 : 1;
}
