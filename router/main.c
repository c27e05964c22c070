/* kvf-router: the client-facing process of a kvferry cluster. Parses
 * flags, builds the router (router.h) and its HTTP front end (http.h) and
 * runs the loop until SIGINT or SIGTERM. */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "kvf/auth.h"
#include "kvf/flags.h"
#include "chat.h"
#include "http.h"
#include "kvf/log.h"
#include "kvf/msg.h"
#include "kvf/signals.h"
#include "router.h"

static volatile sig_atomic_t stop_flag;

typedef struct {
    const char *listen_url, *client_url, *model_dir;
    int heartbeat_ms, max_queue, queue_timeout_ms, request_timeout_ms, max_attempts;
    int default_max_tokens, prefill_timeout_ms, stall_timeout_ms;
    const char *http_listen, *served_model_name, *api_key, *chat_template;
    const char *cluster_key_file;
    bool require_key;
    const char *route, *local_prefill;
    double prefill_weight, decode_weight, transfer_weight;
    double tier_ram_weight, tier_disk_weight, pull_weight;
    uint64_t max_body;
    int http_max_connections, http_max_per_ip, http_header_timeout, http_idle_timeout;
    int http_threads;
    bool http_seen; /* --http was given: it must work */
} router_opts_t;

static void router_opts_defaults(router_opts_t *o)
{
    *o = (router_opts_t){
        .listen_url = "tcp://127.0.0.1:5555",
        .client_url = "tcp://127.0.0.1:5556",
        .heartbeat_ms = 500,
        .max_queue = 256,
        .queue_timeout_ms = 30000,
        .request_timeout_ms = 600000,
        .max_attempts = 5,
        .default_max_tokens = 256,
        .prefill_timeout_ms = 60000,
        .stall_timeout_ms = 30000,
        .http_listen = "127.0.0.1:8000",
        .max_body = 4u << 20,
        .http_max_connections = 8192,
        .http_max_per_ip = 64,
        .http_header_timeout = 10,
        .http_idle_timeout = 120,
        .http_threads = 4,
        .route = "kv",
        .local_prefill = "0",
        .prefill_weight = 1.0,
        .decode_weight = 1.0,
        .transfer_weight = 1.0,
        .tier_ram_weight = KVF_ROUTER_TIER_RAM_WEIGHT,
        .pull_weight = KVF_ROUTER_PULL_WEIGHT,
        .tier_disk_weight = KVF_ROUTER_TIER_DISK_WEIGHT,
    };
}

/* Returns -1 to run, else the exit code (help printed, or a bad flag). */
static int parse_router_flags(int argc, char **argv, router_opts_t *o)
{
    router_opts_defaults(o);
    kvf_flag_t flags[] = {
        {"listen", KVF_FLAG_STRING, &o->listen_url, "URL", "inbox the nodes send to", NULL},
        {"client", KVF_FLAG_STRING, &o->client_url, "URL", "native client socket", NULL},
        {"model", KVF_FLAG_STRING, &o->model_dir, "DIR",
         "model directory (tokenizer and configs only; required)", NULL},
        {"heartbeat-ms", KVF_FLAG_INT, &o->heartbeat_ms, "MS",
         "node heartbeat period; 3 missed = dead", NULL},
        {"max-queue", KVF_FLAG_INT, &o->max_queue, "N",
         "requests waiting for a decode node before 'overloaded'", NULL},
        {"queue-timeout-ms", KVF_FLAG_INT, &o->queue_timeout_ms, "MS",
         "longest wait in the queue", NULL},
        {"request-timeout-ms", KVF_FLAG_INT, &o->request_timeout_ms, "MS",
         "longest life of a request", NULL},
        {"prefill-timeout-ms", KVF_FLAG_INT, &o->prefill_timeout_ms, "MS",
         "dispatch to first token before the request is sent again", NULL},
        {"stall-timeout-ms", KVF_FLAG_INT, &o->stall_timeout_ms, "MS",
         "longest gap between tokens before the request is sent again", NULL},
        {"max-attempts", KVF_FLAG_INT, &o->max_attempts, "N",
         "dispatches of one request before it fails", NULL},
        {"default-max-tokens", KVF_FLAG_INT, &o->default_max_tokens, "N",
         "max tokens of a request that names none", NULL},
        {"http", KVF_FLAG_STRING, &o->http_listen, "HOST:PORT",
         "OpenAI-compatible HTTP API, /health and /metrics ('off' or '' disables)",
         &o->http_seen},
        {"served-model-name", KVF_FLAG_STRING, &o->served_model_name, "NAME",
         "model name of the HTTP API (default: the model directory's name)", NULL},
        {"api-key", KVF_FLAG_STRING, &o->api_key, "KEY",
         "require 'Authorization: Bearer KEY' on /v1/ (default: none)", NULL},
        {"chat-template", KVF_FLAG_STRING, &o->chat_template, "NAME",
         KVF_CHAT_TEMPLATE_NAMES " (default: recognised from the model's "
         "tokenizer_config.json)",
         NULL},
        {"max-body", KVF_FLAG_SIZE, &o->max_body, "BYTES", "largest HTTP request body", NULL},
        {"http-max-connections", KVF_FLAG_INT, &o->http_max_connections, "N",
         "concurrent HTTP connections", NULL},
        {"http-max-connections-per-ip", KVF_FLAG_INT, &o->http_max_per_ip, "N",
         "concurrent HTTP connections from one client address (keep it below "
         "--http-max-connections)",
         NULL},
        {"http-header-timeout", KVF_FLAG_INT, &o->http_header_timeout, "S",
         "seconds an HTTP connection may be idle before its request's headers arrive", NULL},
        {"http-idle-timeout", KVF_FLAG_INT, &o->http_idle_timeout, "S",
         "seconds an HTTP connection may be idle once its headers arrived (not counting waits "
         "for the model's output)",
         NULL},
        {"http-threads", KVF_FLAG_INT, &o->http_threads, "N", "the HTTP server's epoll threads",
         NULL},
        {"route", KVF_FLAG_STRING, &o->route, "kv|load|random",
         "how a request's nodes are picked: kv = cost over cached prefixes and load "
         "(docs/prefix-cache.md), load = most room / least queued, random",
         NULL},
        {"prefill-weight", KVF_FLAG_DOUBLE, &o->prefill_weight, "W",
         "kv cost: weight of the prompt blocks a prefill node must compute plus its queue", NULL},
        {"decode-weight", KVF_FLAG_DOUBLE, &o->decode_weight, "W",
         "kv cost: weight of a decode node's blocks in use", NULL},
        {"transfer-weight", KVF_FLAG_DOUBLE, &o->transfer_weight, "W",
         "kv cost: credit per prompt block a decode node holds already", NULL},
        {"pull-weight", KVF_FLAG_DOUBLE, &o->pull_weight, "F",
         "kv cost: credit of a prompt block a prefill node would read from the decode node's "
         "cache instead of computing it, as a fraction of a pool hit's (default 0.75)",
         NULL},
        {"tier-ram-weight", KVF_FLAG_DOUBLE, &o->tier_ram_weight, "F",
         "kv cost: credit of a prompt block in a prefill node's RAM KV tier, as a fraction of "
         "a pool hit's (default 0.9)",
         NULL},
        {"tier-disk-weight", KVF_FLAG_DOUBLE, &o->tier_disk_weight, "F",
         "kv cost: credit of a prompt block in a node's disk KV tier, as a fraction of a pool "
         "hit's, given only past the measured break-even (default 0.5)",
         NULL},
        {"local-prefill-max-tokens", KVF_FLAG_STRING, &o->local_prefill, "N|auto",
         "conditional disaggregation: a decode node with --prefill-local holding a "
         "request's prefix prefills it itself when at most N tokens are left (0: never; "
         "auto: the measured break-even)",
         NULL},
        KVF_AUTH_FLAG_ENTRY(&o->cluster_key_file),
        KVF_AUTH_REQUIRE_FLAG_ENTRY(&o->require_key),
    };
    kvf_flagset_t set = {
        .prog = "kvf-router",
        .usage = "--model DIR [--listen URL] [--client URL] [options]",
        .summary =
            "Router of a kvferry cluster. Keeps the registry of prefill and decode nodes (they\n"
            "register at --listen and heartbeat), takes generate requests from native clients\n"
            "at --client (kvf generate --router URL), tokenizes them, picks a decode and a prefill\n"
            "node (--route: by where the prompt's prefix is cached and by load), streams the\n"
            "tokens back, and\n"
            "re-dispatches a request whose node died. URLs are nanomsg URLs "
            "(tcp://127.0.0.1:5555,\n"
            "ipc:///path). --http serves the OpenAI API (/v1/completions, /v1/chat/completions,\n"
            "/v1/models), /health and Prometheus /metrics.",
        .flags = flags,
        .n_flags = KVF_NFLAGS(flags),
        .env = true,
    };
    int rc = kvf_flags_parse(&set, argc, argv);
    if (rc != KVF_FLAGS_RUN)
        return rc == KVF_FLAGS_EXIT ? 0 : 2;
    return -1;
}

/* --local-prefill-max-tokens: N or auto; false when malformed. */
static bool parse_local_prefill(const char *text, unsigned *max_p, bool *auto_p)
{
    *auto_p = !strcmp(text, "auto");
    *max_p = 0;
    if (*auto_p)
        return true;
    char *end;
    errno = 0;
    unsigned long v = strtoul(text, &end, 10);
    if (end == text || *end || errno || v > (1ul << 24) || text[0] == '-')
        return false;
    *max_p = (unsigned)v;
    return true;
}

/* Returns -1 when the options make a router, else 2 after logging why. */
static int check_router_opts(const router_opts_t *o)
{
    kvf_route_policy_t policy;
    unsigned max_local;
    bool local_auto;
    if (!kvf_route_policy_parse(o->route, &policy)) {
        kvf_log_error("--route must be kv, load or random (not '%s')", o->route);
        return 2;
    }
    if (!parse_local_prefill(o->local_prefill, &max_local, &local_auto)) {
        kvf_log_error("--local-prefill-max-tokens must be a token count or auto (not '%s')",
                      o->local_prefill);
        return 2;
    }
    if (!(o->prefill_weight >= 0) || !(o->decode_weight >= 0) || !(o->transfer_weight >= 0) ||
        o->prefill_weight > 1e6 || o->decode_weight > 1e6 || o->transfer_weight > 1e6) {
        kvf_log_error("the cost weights must be between 0 and 1e6");
        return 2;
    }
    if (!(o->tier_ram_weight >= 0 && o->tier_ram_weight <= 1) ||
        !(o->tier_disk_weight >= 0 && o->tier_disk_weight <= 1) ||
        !(o->pull_weight >= 0 && o->pull_weight <= 1)) {
        kvf_log_error("--tier-ram-weight, --tier-disk-weight and --pull-weight are fractions, 0 "
                      "to 1");
        return 2;
    }
    if (!o->model_dir) {
        kvf_log_error("--model DIR is required (see --help)");
        return 2;
    }
    if (o->heartbeat_ms < 50 || o->max_queue < 0 || o->queue_timeout_ms < 1 ||
        o->request_timeout_ms < 1 || o->max_attempts < 1 || o->default_max_tokens < 1 ||
        o->prefill_timeout_ms < 1 || o->stall_timeout_ms < 1 || o->max_body < 1 ||
        o->max_body > (1ull << 32) || o->http_max_connections < 1 ||
        o->http_max_per_ip < 1 || o->http_header_timeout < 1 || o->http_idle_timeout < 1 ||
        o->http_threads < 1 || o->http_threads > 64) {
        kvf_log_error("a numeric option is out of range (see --help)");
        return 2;
    }
    return -1;
}

static kvf_router_config_t router_config(const router_opts_t *o)
{
    kvf_route_policy_t policy = KVF_ROUTE_KV;
    unsigned max_local = 0;
    bool local_auto = false;
    (void)kvf_route_policy_parse(o->route, &policy); /* checked by check_router_opts */
    (void)parse_local_prefill(o->local_prefill, &max_local, &local_auto);
    return (kvf_router_config_t){
        .listen_url = o->listen_url,
        .client_url = o->client_url,
        .model_dir = o->model_dir,
        .heartbeat_ms = (unsigned)o->heartbeat_ms,
        .dead_after_missed = 3,
        .max_queue = (unsigned)o->max_queue,
        .queue_timeout_ms = (unsigned)o->queue_timeout_ms,
        .request_timeout_ms = (unsigned)o->request_timeout_ms,
        .max_attempts = (unsigned)o->max_attempts,
        .default_max_tokens = (unsigned)o->default_max_tokens,
        .prefill_timeout_ms = (unsigned)o->prefill_timeout_ms,
        .stall_timeout_ms = (unsigned)o->stall_timeout_ms,
        .route = policy,
        .prefill_weight = o->prefill_weight,
        .decode_weight = o->decode_weight,
        .transfer_weight = o->transfer_weight,
        .tier_ram_weight = o->tier_ram_weight,
        .pull_weight = o->pull_weight,
        .tier_disk_weight = o->tier_disk_weight,
        .local_prefill_max_tokens = max_local,
        .local_prefill_auto = local_auto,
    };
}

/* The HTTP front end, unless --http is off (then *http_p is NULL). The
 * default address may be taken (another router, a test running beside):
 * then the router serves without HTTP; a given --http must work. */
static kvf_status_t start_http(kvf_router_t *router, const router_opts_t *o, kvf_http_t **http_p)
{
    *http_p = NULL;
    if (!o->http_listen || !*o->http_listen || !strcmp(o->http_listen, "off"))
        return KVF_OK;
    kvf_http_config_t hc = {
        .listen = o->http_listen,
        .served_model_name = o->served_model_name,
        .api_key = o->api_key,
        .chat_template = o->chat_template,
        .max_body = (size_t)o->max_body,
        .max_connections = (unsigned)o->http_max_connections,
        .max_connections_per_ip = (unsigned)o->http_max_per_ip,
        .header_timeout_s = (unsigned)o->http_header_timeout,
        .idle_timeout_s = (unsigned)o->http_idle_timeout,
        .threads = (unsigned)o->http_threads,
    };
    kvf_status_t st = kvf_http_create(router, &hc, http_p);
    if (st != KVF_OK && (o->http_seen || st != KVF_ERR_IO))
        return st;
    if (st != KVF_OK)
        kvf_log_warn("continuing without the HTTP API (give --http HOST:PORT or --http off)");
    return KVF_OK;
}

/* Without a cluster key, says what a socket open to other hosts lets any
 * process there do (README.md, "Identity without a key"). */
static void warn_open_sockets(const router_opts_t *o)
{
    if (kvf_auth_enabled())
        return;
    if (!kvf_net_url_is_local(o->listen_url))
        kvf_log_warn("no cluster key, and the node inbox %s is open to other hosts: any process "
                     "that reaches it can register a node under a new id and, as a prefill "
                     "node, receive prompts. Give every process --cluster-key-file (kvf keygen "
                     "PATH), or --require-key to refuse to start without one",
                     o->listen_url);
    if (!kvf_net_url_is_local(o->client_url))
        kvf_log_warn("no cluster key, and the client socket %s is open to other hosts: any "
                     "process that reaches it can submit requests and read kvf stats (every "
                     "node's inbox)",
                     o->client_url);
}

int main(int argc, char **argv)
{
    router_opts_t o;
    int rc = parse_router_flags(argc, argv, &o);
    if (rc >= 0)
        return rc;
    kvf_log_init("router", NULL);
    rc = check_router_opts(&o);
    if (rc >= 0)
        return rc;
    if (kvf_auth_setup(o.cluster_key_file) != KVF_OK || kvf_auth_require(o.require_key) != KVF_OK)
        return 1;
    warn_open_sockets(&o);
    kvf_router_config_t cfg = router_config(&o);
    kvf_router_t *router;
    kvf_status_t st = kvf_router_create(&cfg, &router);
    if (st != KVF_OK) {
        kvf_log_error("cannot start: %s", kvf_status_str(st));
        return 1;
    }
    kvf_http_t *http;
    if (start_http(router, &o, &http) != KVF_OK) {
        kvf_router_destroy(router);
        return 1;
    }
    kvf_signals_install(&stop_flag);
    st = kvf_router_run(router, &stop_flag);
    kvf_http_destroy(http); /* the loop has stopped: nothing holds its exchanges any more */
    kvf_router_destroy(router);
    return st == KVF_OK ? 0 : 1;
}
