/* Private to the HTTP front end (http.c, http_generate.c): the server's
 * state, a request's per-connection state and the response helpers. */
#ifndef KVF_HTTP_INTERNAL_H
#define KVF_HTTP_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "exchange.h"
#include "http.h"
#include "openai.h"
#include "strbuf.h"

/* HTTP status codes counted one by one on /metrics (http.c). */
#define HTTP_N_COUNTED 10

struct kvf_http {
    kvf_router_t *router;
    struct MHD_Daemon *daemon;
    uint16_t port;
    char model_name[256];
    char *api_key;           /* owned; NULL: none */
    kvf_openai_server_t api; /* strings: model_name, the router's tokenizer */
    size_t max_body;
    unsigned loop_wait_ms, max_wait_ms;
    int64_t started; /* unix seconds */
    atomic_uint_fast64_t next_id;
    atomic_uint_fast64_t responses[HTTP_N_COUNTED + 1]; /* by counted_codes; last: other */
    kvf_exch_set_t exchanges;
};

/* Per HTTP request state, owned by the connection (freed on completion). */
typedef enum {
    ROUTE_NONE,
    ROUTE_COMPLETIONS,
    ROUTE_CHAT,
    ROUTE_MODELS,
    ROUTE_MODEL, /* /v1/models/{id} */
    ROUTE_HEALTH,
    ROUTE_METRICS,
} route_t;

typedef struct {
    route_t route;
    bool post;
    bool too_big;
    kvf_strbuf_t body;
    kvf_exch_t *ex; /* the connection's reference, or NULL */
} conn_req_t;

/* Queues resp with code and counts it for /metrics. */
enum MHD_Result kvf_http__queue_response(kvf_http_t *h, struct MHD_Connection *c, unsigned code,
                                         struct MHD_Response *resp);
/* root: consumed; header: one more header (name, value) or NULL. */
enum MHD_Result kvf_http__respond_json(kvf_http_t *h, struct MHD_Connection *c, unsigned code,
                                       cJSON *root, const char *const *header);
/* An error object; overload and unavailability say when to try again. */
enum MHD_Result kvf_http__respond_error(kvf_http_t *h, struct MHD_Connection *c,
                                        const kvf_openai_error_t *err);
/* A server_error with code and the message what. */
enum MHD_Result kvf_http__respond_unavailable(kvf_http_t *h, struct MHD_Connection *c,
                                              unsigned code, const char *what);

/* A completion or chat request whose body has arrived (http_generate.c). */
enum MHD_Result kvf_http__handle_generate(kvf_http_t *h, struct MHD_Connection *c, conn_req_t *cr);

#endif
