/* The HTTP front end's limits on a request's head (http_internal.h,
 * HTTP_MAX_TARGET and HTTP_MAX_HEADERS): an over-long request target gets
 * 414 and over-large header fields 431, each an OpenAI error object like
 * every other error the router writes (openai_reply.c). libmicrohttpd
 * would answer both with its own HTML page, and it has no hook for that
 * page: its per-connection memory is set well above these limits
 * (HTTP_CONN_MEMORY), so that the head reaches the access handler and the
 * router answers first. */
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include <microhttpd.h>

#include "http_internal.h"

/* The mark a request whose target is too long starts with (*con_cls):
 * static, so a request that libmicrohttpd ends before the handler runs
 * leaves nothing to free. */
static const char target_too_long;

const void *const kvf_http__target_too_long = &target_too_long;

/* MHD_OPTION_URI_LOG_CALLBACK: the request line has been read; uri is the
 * whole target (path and query), which the handler no longer sees. */
void *kvf_http__on_uri(void *cls, const char *uri, struct MHD_Connection *c)
{
    (void)cls;
    (void)c;
    return uri && strlen(uri) > HTTP_MAX_TARGET ? (void *)&target_too_long : NULL;
}

static enum MHD_Result add_field(void *cls, enum MHD_ValueKind kind, const char *key,
                                 const char *value)
{
    (void)kind;
    size_t *total = cls;
    *total += (key ? strlen(key) : 0) + (value ? strlen(value) : 0) + 4; /* ": " and CRLF */
    return MHD_YES;
}

bool kvf_http__check_head(kvf_http_t *h, struct MHD_Connection *c, bool target_too_long,
                          enum MHD_Result *ret)
{
    kvf_openai_error_t err;
    size_t fields = 0;
    MHD_get_connection_values(c, MHD_HEADER_KIND, add_field, &fields);
    if (target_too_long) {
        kvf_openai_set_error(&err, MHD_HTTP_URI_TOO_LONG, "invalid_request_error", NULL,
                             "uri_too_long", "the request target is longer than %u bytes",
                             (unsigned)HTTP_MAX_TARGET);
    } else if (fields > HTTP_MAX_HEADERS) {
        kvf_openai_set_error(&err, MHD_HTTP_REQUEST_HEADER_FIELDS_TOO_LARGE,
                             "invalid_request_error", NULL, "header_fields_too_large",
                             "the request's header fields take %zu bytes; at most %u are "
                             "accepted",
                             fields, (unsigned)HTTP_MAX_HEADERS);
    } else {
        return false;
    }
    *ret = kvf_http__respond_error(h, c, &err);
    return true;
}
