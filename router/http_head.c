/* The HTTP front end's checks of a request's head, each refusal an OpenAI
 * error object like every other error the router writes (openai_reply.c),
 * where libmicrohttpd would answer with its own HTML page (it has no hook
 * for that page):
 *   - the shape and size of a connection's first head, before
 *     libmicrohttpd reads it (kvf_http__classify_head, for http_gate.c);
 *   - the limits of every head (http_internal.h, HTTP_MAX_TARGET and
 *     HTTP_MAX_HEADERS) in the access handler: an over-long request target
 *     gets 414 and over-large header fields 431. libmicrohttpd's
 *     per-connection memory is set well above them (HTTP_CONN_MEMORY), so
 *     that a later head on a kept-alive connection reaches the handler. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

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

/* ---- the head before libmicrohttpd sees it (http_gate.c) ---------------------------- */

static void refuse(kvf_openai_error_t *err, unsigned code, const char *errcode, const char *what)
{
    kvf_openai_set_error(err, code, "invalid_request_error", NULL, errcode, "%s", what);
}

/* The request line (len bytes, no line end): method SP target SP
 * HTTP/d.d, as libmicrohttpd reads it (the version after the last space).
 * False with *err when it would refuse it. */
static bool check_request_line(const char *line, size_t len, kvf_openai_error_t *err)
{
    while (len && line[len - 1] == ' ')
        len--;
    const char *sp = memchr(line, ' ', len);
    const char *last = sp;
    for (const char *p = sp; p && p < line + len; p++)
        if (*p == ' ')
            last = p;
    const char *v = last ? last + 1 : NULL;
    size_t vlen = v ? (size_t)(line + len - v) : 0;
    if (!sp || sp == line || last == sp || vlen != 8 || memcmp(v, "HTTP/", 5) || v[6] != '.' ||
        v[5] < '0' || v[5] > '9' || v[7] < '0' || v[7] > '9') {
        refuse(err, MHD_HTTP_BAD_REQUEST, "bad_request",
               "malformed request line; expected METHOD TARGET HTTP/1.1");
        return false;
    }
    if (v[5] != '1') {
        refuse(err, MHD_HTTP_HTTP_VERSION_NOT_SUPPORTED, "http_version_not_supported",
               "this server speaks HTTP/1.0 and HTTP/1.1");
        return false;
    }
    return true;
}

/* A Content-Length value (trimmed): decimal digits that fit 64 bits. */
static bool check_content_length(const char *v, size_t len, kvf_openai_error_t *err)
{
    while (len && (*v == ' ' || *v == '\t'))
        v++, len--;
    while (len && (v[len - 1] == ' ' || v[len - 1] == '\t'))
        len--;
    uint64_t n = 0;
    bool overflow = false;
    for (size_t i = 0; i < len; i++) {
        if (v[i] < '0' || v[i] > '9') {
            len = 0;
            break;
        }
        unsigned d = (unsigned)(v[i] - '0');
        overflow |= n > (UINT64_MAX - d) / 10;
        n = n * 10 + d;
    }
    if (!len) {
        refuse(err, MHD_HTTP_BAD_REQUEST, "bad_request", "malformed Content-Length");
        return false;
    }
    if (overflow) {
        refuse(err, MHD_HTTP_CONTENT_TOO_LARGE, "request_too_large",
               "Content-Length does not fit in 64 bits");
        return false;
    }
    return true;
}

/* One header field line (no line end): a name, a colon and its value;
 * a line that starts with white space continues the one before. */
static bool check_field(const char *line, size_t len, kvf_openai_error_t *err)
{
    if (line[0] == ' ' || line[0] == '\t')
        return true;
    const char *colon = memchr(line, ':', len);
    if (!colon) {
        refuse(err, MHD_HTTP_BAD_REQUEST, "bad_request", "malformed header field (no colon)");
        return false;
    }
    size_t name_len = (size_t)(colon - line);
    if (name_len == 14 && !strncasecmp(line, "Content-Length", 14))
        return check_content_length(colon + 1, len - name_len - 1, err);
    return true;
}

kvf_http_head_t kvf_http__classify_head(const char *buf, size_t len, kvf_openai_error_t *err)
{
    size_t at = 0, fields = 0, field_bytes = 0;
    while (at < len && (buf[at] == '\r' || buf[at] == '\n'))
        at++; /* empty lines before the request line are ignored */
    bool first = true;
    for (;;) {
        const char *nl = memchr(buf + at, '\n', len - at);
        size_t line_len = (nl ? (size_t)(nl - buf) : len) - at;
        bool line_over = first && line_len > HTTP_GATE_MAX_LINE;
        if (!nl || line_over) {
            bool over = first ? line_over : field_bytes + line_len > HTTP_GATE_MAX_FIELD_BYTES;
            if (!over)
                return KVF_HTTP_HEAD_MORE;
            if (first)
                kvf_openai_set_error(err, MHD_HTTP_URI_TOO_LONG, "invalid_request_error", NULL,
                                     "uri_too_long", "the request line is longer than %u bytes",
                                     (unsigned)HTTP_GATE_MAX_LINE);
            else
                kvf_openai_set_error(err, MHD_HTTP_REQUEST_HEADER_FIELDS_TOO_LARGE,
                                     "invalid_request_error", NULL, "header_fields_too_large",
                                     "the request's header fields are larger than %u bytes",
                                     (unsigned)HTTP_MAX_HEADERS);
            return KVF_HTTP_HEAD_REFUSE;
        }
        const char *line = buf + at;
        at += line_len + 1;
        if (line_len && line[line_len - 1] == '\r')
            line_len--;
        if (first) {
            if (!check_request_line(line, line_len, err))
                return KVF_HTTP_HEAD_REFUSE;
            first = false;
            continue;
        }
        if (!line_len)
            return KVF_HTTP_HEAD_PASS; /* the end of the head */
        field_bytes += line_len + 2;
        if (++fields > HTTP_MAX_FIELDS || field_bytes > HTTP_GATE_MAX_FIELD_BYTES) {
            kvf_openai_set_error(err, MHD_HTTP_REQUEST_HEADER_FIELDS_TOO_LARGE,
                                 "invalid_request_error", NULL, "header_fields_too_large",
                                 "the request has more than %u header fields or %u bytes of "
                                 "them",
                                 (unsigned)HTTP_MAX_FIELDS, (unsigned)HTTP_MAX_HEADERS);
            return KVF_HTTP_HEAD_REFUSE;
        }
        if (!check_field(line, line_len, err))
            return KVF_HTTP_HEAD_REFUSE;
    }
}
