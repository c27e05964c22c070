/* Reaching a remote pool (kvf/xfer.h): the pool's descriptor (exported,
 * then checked field by field on the other side, as untrusted input), the
 * token of two-sided backends, and the peers made from them: connected,
 * accepted, failed, disconnected. */
#include "xfer_internal.h"

#include "kvf/clock.h"
#include "kvf/crc32c.h"
#include "kvf/kv_format.h"
#include "kvf/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- descriptor ---------------------------------------------------------- */

/* Which geometry field differs, for the error message; NULL if none. */
static const char *geometry_diff(const kvf_xfer_geometry_t *a, const kvf_xfer_geometry_t *b,
                                 uint32_t *va, uint32_t *vb)
{
#define KVF_GEOM_CMP(f)                                                                            \
    if (a->f != b->f) {                                                                            \
        *va = a->f;                                                                                \
        *vb = b->f;                                                                                \
        return #f;                                                                                 \
    }
    KVF_GEOM_CMP(block_size)
    KVF_GEOM_CMP(n_layers)
    KVF_GEOM_CMP(n_kv_heads)
    KVF_GEOM_CMP(head_dim)
    KVF_GEOM_CMP(dtype)
    KVF_GEOM_CMP(layout)
#undef KVF_GEOM_CMP
    return NULL;
}

/* Frames body (taken: freed here) as a descriptor of this pool. */
static kvf_status_t desc_build(kvf_xfer_t *xfer, uint8_t *body, size_t body_len, uint8_t **desc_p,
                               size_t *len_p)
{
    kvf_status_t st;
    if (body_len > KVF_XFER_DESC_MAX) {
        kvf_log_error("xfer: descriptor body of %zu bytes is too big", body_len);
        st = KVF_ERR_TOO_BIG;
        goto fail_size;
    }
    size_t len = KVF_XFER_DESC_HEADER + body_len + 4;
    uint8_t *d = calloc(1, len);
    if (!d) {
        st = KVF_ERR_NOMEM;
        goto fail_size;
    }
    const kvf_xfer_geometry_t *g = &xfer->cfg.geometry;
    xfer_put_u32(d + 0, KVF_XFER_DESC_MAGIC);
    xfer_put_u16(d + 4, KVF_XFER_DESC_VERSION);
    xfer_put_u16(d + 6, (uint16_t)xfer->cfg.backend);
    xfer_put_u32(d + 8, KVF_XFER_DESC_HEADER);
    xfer_put_u32(d + 12, (uint32_t)body_len);
    xfer_put_u64(d + 16, (uint64_t)(uintptr_t)xfer->pool);
    xfer_put_u64(d + 24, xfer->cfg.pool_bytes);
    xfer_put_u32(d + 32, g->block_size);
    xfer_put_u32(d + 36, g->n_layers);
    xfer_put_u32(d + 40, g->n_kv_heads);
    xfer_put_u32(d + 44, g->head_dim);
    xfer_put_u32(d + 48, g->dtype);
    xfer_put_u32(d + 52, g->layout);
    xfer_put_u32(d + 56, (xfer->cfg.checksum ? 1u : 0u) | (xfer->cfg.two_sided ? 2u : 0u) |
                             ((uint32_t)xfer->cfg.mem_type << 8));
    if (body_len)
        memcpy(d + KVF_XFER_DESC_HEADER, body, body_len);
    xfer_put_u32(d + KVF_XFER_DESC_HEADER + body_len,
                 kvf_crc32c(0, d, KVF_XFER_DESC_HEADER + body_len));
    free(body);
    *desc_p = d;
    *len_p = len;
    return KVF_OK;

fail_size:
    free(body);
    return st;
}

kvf_status_t kvf_xfer_export(kvf_xfer_t *xfer, uint8_t **desc_p, size_t *len_p)
{
    uint8_t *body = NULL;
    size_t body_len = 0;
    kvf_status_t st = xfer->ops->export_body(xfer, &body, &body_len);
    if (st != KVF_OK)
        return st;
    return desc_build(xfer, body, body_len, desc_p, len_p);
}

kvf_status_t kvf_xfer_peer_token(kvf_xfer_peer_t *peer, uint8_t **token_p, size_t *len_p)
{
    kvf_xfer_t *x = peer->xfer;
    if (!x->ops->token_body || peer->accepted)
        return KVF_ERR_UNSUPPORTED;
    uint8_t *body = NULL;
    size_t body_len = 0;
    kvf_status_t st = x->ops->token_body(peer, &body, &body_len);
    if (st != KVF_OK)
        return st;
    return desc_build(x, body, body_len, token_p, len_p);
}

typedef struct {
    uint64_t pool_base, pool_bytes;
    bool checksum, two_sided;
    const uint8_t *body;
    size_t body_len;
} desc_view_t;

/* Checks every field of an untrusted descriptor, in the order that gives
 * the most useful error: framing, version, integrity, then agreement with
 * geo (and backend, unless negative). why says what is wrong. */
static kvf_status_t desc_parse_for(const kvf_xfer_geometry_t *geo, int backend, const uint8_t *d,
                                   size_t len, desc_view_t *view_p, char *why, size_t why_len)
{
    if (!d || len < 8) {
        snprintf(why, why_len, "descriptor of %zu bytes is truncated", len);
        return KVF_ERR_FORMAT;
    }
    if (xfer_get_u32(d) != KVF_XFER_DESC_MAGIC) {
        snprintf(why, why_len, "descriptor has a bad magic 0x%08x", xfer_get_u32(d));
        return KVF_ERR_FORMAT;
    }
    if (xfer_get_u16(d + 4) != KVF_XFER_DESC_VERSION) {
        snprintf(why, why_len, "descriptor version %u, this build speaks %u", xfer_get_u16(d + 4),
                      KVF_XFER_DESC_VERSION);
        return KVF_ERR_VERSION;
    }
    if (len < KVF_XFER_DESC_HEADER + 4 || xfer_get_u32(d + 8) != KVF_XFER_DESC_HEADER) {
        snprintf(why, why_len, "descriptor header is truncated or malformed (%zu bytes)", len);
        return KVF_ERR_FORMAT;
    }
    uint32_t body_len = xfer_get_u32(d + 12);
    if (body_len > KVF_XFER_DESC_MAX || len != KVF_XFER_DESC_HEADER + (size_t)body_len + 4) {
        snprintf(why, why_len, "descriptor length %zu does not match its body length %u", len,
                      body_len);
        return KVF_ERR_FORMAT;
    }
    if (kvf_crc32c(0, d, len - 4) != xfer_get_u32(d + len - 4)) {
        snprintf(why, why_len, "descriptor checksum mismatch (corrupted)");
        return KVF_ERR_FORMAT;
    }
    if (backend >= 0 && xfer_get_u16(d + 6) != (uint16_t)backend) {
        snprintf(why, why_len, "peer uses transport backend %u, this node %u", xfer_get_u16(d + 6),
                      (unsigned)backend);
        return KVF_ERR_MISMATCH;
    }
    kvf_xfer_geometry_t g = {
        .block_size = xfer_get_u32(d + 32),
        .n_layers = xfer_get_u32(d + 36),
        .n_kv_heads = xfer_get_u32(d + 40),
        .head_dim = xfer_get_u32(d + 44),
        .dtype = xfer_get_u32(d + 48),
        .layout = xfer_get_u32(d + 52),
    };
    uint32_t mine, theirs;
    const char *field = geometry_diff(geo, &g, &mine, &theirs);
    if (field && !strcmp(field, "dtype")) {
        snprintf(why, why_len, "kv format mismatch: peer %s, local %s",
                      kvf_kv_dtype_name((kvf_kv_dtype_t)theirs),
                      kvf_kv_dtype_name((kvf_kv_dtype_t)mine));
        return KVF_ERR_MISMATCH;
    }
    if (field) {
        snprintf(why, why_len, "kv geometry mismatch: peer %s %u, local %u", field, theirs, mine);
        return KVF_ERR_MISMATCH;
    }
    uint64_t base = xfer_get_u64(d + 16), bytes = xfer_get_u64(d + 24);
    uint64_t block_bytes = kvf_xfer_block_bytes(&g);
    if (!bytes || bytes % block_bytes || base > UINT64_MAX - bytes) {
        snprintf(why, why_len, "peer pool of %llu bytes is not a whole number of %llu-byte blocks",
                      (unsigned long long)bytes, (unsigned long long)block_bytes);
        return KVF_ERR_INVAL;
    }
    view_p->pool_base = base;
    view_p->pool_bytes = bytes;
    view_p->checksum = xfer_get_u32(d + 56) & 1u;
    view_p->two_sided = xfer_get_u32(d + 56) & 2u;
    view_p->body = d + KVF_XFER_DESC_HEADER;
    view_p->body_len = body_len;
    return KVF_OK;
}

static kvf_status_t desc_parse(const kvf_xfer_t *x, const uint8_t *d, size_t len,
                               desc_view_t *view_p)
{
    char why[200];
    kvf_status_t st =
        desc_parse_for(&x->cfg.geometry, (int)x->cfg.backend, d, len, view_p, why, sizeof(why));
    if (st != KVF_OK)
        kvf_log_error("xfer: %s", why);
    return st;
}

kvf_status_t kvf_xfer_check_desc_for(const kvf_xfer_geometry_t *geo, const uint8_t *desc,
                                     size_t len, char *why, size_t why_len)
{
    desc_view_t v;
    return desc_parse_for(geo, -1, desc, len, &v, why, why_len);
}

kvf_status_t kvf_xfer_check_desc(const kvf_xfer_t *xfer, const uint8_t *desc, size_t len)
{
    desc_view_t v;
    return desc_parse(xfer, desc, len, &v);
}

/* ---- peers --------------------------------------------------------------- */

/* The two ways to a peer: connect (from the receiver's descriptor) and
 * accept (from a sender's token, two-sided backends). */
static kvf_status_t peer_open(kvf_xfer_t *xfer, const uint8_t *desc, size_t len, bool accept,
                              kvf_xfer_peer_t **peer_p)
{
    if (accept && !xfer->ops->accept)
        return KVF_ERR_UNSUPPORTED;
    desc_view_t v;
    kvf_status_t st = desc_parse(xfer, desc, len, &v);
    if (st != KVF_OK)
        return st;
    kvf_xfer_peer_t *p = calloc(1, sizeof(*p));
    if (!p)
        return KVF_ERR_NOMEM;
    p->xfer = xfer;
    p->remote_base = v.pool_base;
    p->remote_bytes = v.pool_bytes;
    /* CRCs are computed by the CPU: host pools only. */
    p->checksum = (xfer->cfg.checksum || v.checksum) && xfer->cfg.mem_type == KVF_XFER_MEM_HOST;
    p->accepted = accept;
    p->two_sided = xfer->cfg.two_sided || v.two_sided;
    p->status = KVF_OK;
    p->progress_ns = kvf_clock_ns(); /* the connection's set-up runs from now */
    st = accept ? xfer->ops->accept(p, v.body, v.body_len)
                : xfer->ops->connect(p, v.body, v.body_len);
    if (st != KVF_OK)
        goto fail_connect;
    p->next = xfer->peers;
    if (xfer->peers)
        xfer->peers->prev = p;
    xfer->peers = p;
    if (!kvf_xfer_peer_ready(p))
        kvf_xfer__timer_at(xfer, p->progress_ns + (uint64_t)xfer->cfg.timeout_ms * 1000000ull);
    *peer_p = p;
    return KVF_OK;

fail_connect:
    free(p);
    return st;
}

kvf_status_t kvf_xfer_connect(kvf_xfer_t *xfer, const uint8_t *desc, size_t len,
                              kvf_xfer_peer_t **peer_p)
{
    return peer_open(xfer, desc, len, false, peer_p);
}

kvf_status_t kvf_xfer_accept(kvf_xfer_t *xfer, const uint8_t *token, size_t len,
                             kvf_xfer_peer_t **peer_p)
{
    return peer_open(xfer, token, len, true, peer_p);
}

void kvf_xfer__peer_fail(kvf_xfer_peer_t *p, kvf_status_t status)
{
    if (p->status == KVF_OK) {
        p->status = status;
        /* The cause was logged where it was found. */
        kvf_log_debug("xfer: peer failed: %s", kvf_status_str(status));
    }
    /* Every batch ends with the first cause, not a later echo of it. */
    for (kvf_xfer_batch_t *b = p->batches; b; b = b->next)
        kvf_xfer__batch_end(b, p->status);
    p->xfer->ops->shutdown(p);
}

void kvf_xfer_disconnect(kvf_xfer_peer_t *peer)
{
    if (!peer)
        return;
    peer->disconnected = true;
    kvf_xfer__peer_fail(peer, KVF_ERR_CLOSED);
    kvf_xfer__reap(peer->xfer);
}

kvf_status_t kvf_xfer_peer_status(const kvf_xfer_peer_t *peer)
{
    return peer->status;
}

bool kvf_xfer_peer_ready(const kvf_xfer_peer_t *peer)
{
    const kvf_xfer_t *x = peer->xfer;
    return peer->status == KVF_OK &&
           (!x->ops->ready || x->ops->ready((kvf_xfer_peer_t *)peer)) &&
           (!x->ops->connected || x->ops->connected(peer));
}

bool kvf_xfer_connecting(const kvf_xfer_t *xfer)
{
    for (const kvf_xfer_peer_t *p = xfer->peers; p; p = p->next)
        if (!p->accepted && p->status == KVF_OK && !kvf_xfer_peer_ready(p))
            return true;
    return false;
}
