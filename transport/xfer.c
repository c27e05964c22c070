/* Backend-neutral half of the transfer API (kvf/xfer.h): configuration and
 * descriptor checks, slice validation and coalescing, batch lifetimes and
 * deadlines, the completion message, and the receiver's reservations and
 * fencing. Backends (ucx.c, nccl.c) only move bytes and messages. */
#include "xfer_internal.h"

#include "kvf/clock.h"
#include "kvf/crc32c.h"
#include "kvf/log.h"

#include <poll.h>
#include <stdlib.h>
#include <string.h>

/* ---- geometry ------------------------------------------------------------ */

static uint64_t dtype_bytes(uint32_t dtype)
{
    switch (dtype) {
    case KVF_XFER_DTYPE_F32:
        return 4;
    case KVF_XFER_DTYPE_F16:
    case KVF_XFER_DTYPE_BF16:
        return 2;
    case KVF_XFER_DTYPE_FP8:
    case KVF_XFER_DTYPE_INT8:
        return 1;
    default:
        return 0;
    }
}

uint64_t kvf_xfer_block_bytes(const kvf_xfer_geometry_t *g)
{
    uint64_t eb = dtype_bytes(g->dtype);
    if (!eb || !g->block_size || !g->n_layers || !g->n_kv_heads || !g->head_dim || g->layout != 1)
        return 0;
    /* Each factor is below 2^32 and real pools are far below 2^64 bytes per
     * block; the product is checked against overflow anyway. */
    uint64_t b = 2 * eb;
    const uint32_t f[] = {g->block_size, g->n_layers, g->n_kv_heads, g->head_dim};
    for (int i = 0; i < 4; i++) {
        if (b > UINT64_MAX / f[i])
            return 0;
        b *= f[i];
    }
    return b;
}

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

/* ---- handle -------------------------------------------------------------- */

static const kvf_xfer_ops_t *backend_ops(kvf_xfer_backend_t backend)
{
    switch (backend) {
    case KVF_XFER_UCX:
        return &kvf_xfer_ucx_ops;
#ifdef KVF_HAVE_NCCL
    case KVF_XFER_NCCL:
        return &kvf_xfer_nccl_ops;
#endif
    default:
        return NULL;
    }
}

kvf_status_t kvf_xfer_caps(const kvf_xfer_config_t *cfg, kvf_xfer_caps_t *caps_p)
{
    const kvf_xfer_ops_t *ops = backend_ops(cfg->backend);
    if (!ops)
        return KVF_ERR_UNSUPPORTED;
    ops->caps(cfg, caps_p);
    return KVF_OK;
}

kvf_status_t kvf_xfer_create(const kvf_xfer_config_t *cfg, kvf_xfer_t **xfer_p)
{
    uint64_t block_bytes = kvf_xfer_block_bytes(&cfg->geometry);
    if (!block_bytes) {
        kvf_log_error("xfer: invalid kv geometry");
        return KVF_ERR_INVAL;
    }
    if (!cfg->pool_bytes || cfg->pool_bytes % block_bytes) {
        kvf_log_error("xfer: pool of %llu bytes is not a whole number of %llu-byte blocks",
                      (unsigned long long)cfg->pool_bytes, (unsigned long long)block_bytes);
        return KVF_ERR_INVAL;
    }
    if ((cfg->checksum || cfg->two_sided) && cfg->mem_type != KVF_XFER_MEM_HOST) {
        kvf_log_error("xfer: checksums and two-sided mode need a pool in host memory");
        return KVF_ERR_UNSUPPORTED;
    }
    const kvf_xfer_ops_t *ops = backend_ops(cfg->backend);
    if (!ops) {
        kvf_log_error("xfer: backend %d is not in this build", (int)cfg->backend);
        return KVF_ERR_UNSUPPORTED;
    }
    kvf_xfer_t *x = calloc(1, sizeof(*x));
    if (!x)
        return KVF_ERR_NOMEM;
    x->ops = ops;
    x->cfg = *cfg;
    ops->caps(cfg, &x->caps);
    if (!x->cfg.timeout_ms)
        x->cfg.timeout_ms = KVF_XFER_DEFAULT_TIMEOUT_MS;
    if (!x->cfg.grace_ms)
        x->cfg.grace_ms = KVF_XFER_DEFAULT_GRACE_MS;
    x->pool = cfg->pool;
    x->next_timer_ns = UINT64_MAX;
    kvf_status_t st = ops->open(x);
    if (st != KVF_OK)
        goto fail_open;
    *xfer_p = x;
    return KVF_OK;

fail_open:
    free(x);
    return st;
}

void *kvf_xfer_pool(const kvf_xfer_t *xfer)
{
    return xfer->pool;
}

static void batch_free(kvf_xfer_batch_t *b)
{
    kvf_xfer_peer_t *p = b->peer;
    if (b->prev)
        b->prev->next = b->next;
    else
        p->batches = b->next;
    if (b->next)
        b->next->prev = b->prev;
    if (p->xfer->ops->batch_free)
        p->xfer->ops->batch_free(b);
    free(b->ranges);
    free(b->fin);
    free(b);
}

static void peer_unlink_free(kvf_xfer_peer_t *p)
{
    kvf_xfer_t *x = p->xfer;
    if (p->prev)
        p->prev->next = p->next;
    else
        x->peers = p->next;
    if (p->next)
        p->next->prev = p->prev;
    x->ops->peer_free(p);
    free(p);
}

void kvf_xfer__reap(kvf_xfer_t *x)
{
    kvf_xfer_peer_t *p = x->peers;
    while (p) {
        kvf_xfer_peer_t *pnext = p->next;
        kvf_xfer_batch_t *b = p->batches;
        while (b) {
            kvf_xfer_batch_t *bnext = b->next;
            if (b->released && b->status != KVF_ERR_AGAIN && !b->backend_busy)
                batch_free(b);
            b = bnext;
        }
        if (p->disconnected && !p->batches && x->ops->shutdown_done(p))
            peer_unlink_free(p);
        p = pnext;
    }
}

void kvf_xfer_destroy(kvf_xfer_t *xfer)
{
    if (!xfer)
        return;
    for (kvf_xfer_peer_t *p = xfer->peers, *next; p; p = next) {
        next = p->next; /* not disconnected yet, so the reaping keeps it */
        for (kvf_xfer_batch_t *b = p->batches; b; b = b->next)
            b->released = true; /* the caller's batch pointers die with the handle */
        kvf_xfer_disconnect(p);
    }
    /* Shutdowns complete and cancelled requests call back during progress;
     * bounded, since a forced close does not wait for the peer. */
    uint64_t until = kvf_clock_ns() + 2000000000ull;
    while (xfer->peers && kvf_clock_ns() < until) {
        xfer->ops->progress(xfer);
        kvf_xfer__reap(xfer);
    }
    /* A close can stay pending for good (a dead peer without transport
     * failure detection holds a send). Closing the backend ends all of its
     * requests, and their callbacks may still touch the batches; only
     * after it are the leftovers freed. */
    if (xfer->peers)
        kvf_log_debug("xfer: closing the backend with peers still shutting down");
    xfer->ops->close(xfer);
    while (xfer->peers) {
        kvf_xfer_peer_t *p = xfer->peers;
        while (p->batches)
            batch_free(p->batches);
        peer_unlink_free(p);
    }
    for (size_t i = 0; i < xfer->n_resv; i++)
        free(xfer->resv[i].ranges);
    free(xfer->resv);
    free(xfer->events);
    free(xfer);
}

/* ---- descriptor ---------------------------------------------------------- */

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
 * the most useful error: framing, version, integrity, then agreement. */
static kvf_status_t desc_parse(const kvf_xfer_t *x, const uint8_t *d, size_t len,
                               desc_view_t *view_p)
{
    if (!d || len < 8) {
        kvf_log_error("xfer: descriptor of %zu bytes is truncated", len);
        return KVF_ERR_FORMAT;
    }
    if (xfer_get_u32(d) != KVF_XFER_DESC_MAGIC) {
        kvf_log_error("xfer: descriptor has a bad magic 0x%08x", xfer_get_u32(d));
        return KVF_ERR_FORMAT;
    }
    if (xfer_get_u16(d + 4) != KVF_XFER_DESC_VERSION) {
        kvf_log_error("xfer: descriptor version %u, this build speaks %u", xfer_get_u16(d + 4),
                      KVF_XFER_DESC_VERSION);
        return KVF_ERR_VERSION;
    }
    if (len < KVF_XFER_DESC_HEADER + 4 || xfer_get_u32(d + 8) != KVF_XFER_DESC_HEADER) {
        kvf_log_error("xfer: descriptor header is truncated or malformed (%zu bytes)", len);
        return KVF_ERR_FORMAT;
    }
    uint32_t body_len = xfer_get_u32(d + 12);
    if (body_len > KVF_XFER_DESC_MAX || len != KVF_XFER_DESC_HEADER + (size_t)body_len + 4) {
        kvf_log_error("xfer: descriptor length %zu does not match its body length %u", len,
                      body_len);
        return KVF_ERR_FORMAT;
    }
    if (kvf_crc32c(0, d, len - 4) != xfer_get_u32(d + len - 4)) {
        kvf_log_error("xfer: descriptor checksum mismatch (corrupted)");
        return KVF_ERR_FORMAT;
    }
    if (xfer_get_u16(d + 6) != (uint16_t)x->cfg.backend) {
        kvf_log_error("xfer: peer uses transport backend %u, this node %u", xfer_get_u16(d + 6),
                      (unsigned)x->cfg.backend);
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
    const char *field = geometry_diff(&x->cfg.geometry, &g, &mine, &theirs);
    if (field) {
        kvf_log_error("xfer: kv geometry mismatch: peer %s %u, local %u", field, theirs, mine);
        return KVF_ERR_MISMATCH;
    }
    uint64_t base = xfer_get_u64(d + 16), bytes = xfer_get_u64(d + 24);
    uint64_t block_bytes = kvf_xfer_block_bytes(&g);
    if (!bytes || bytes % block_bytes || base > UINT64_MAX - bytes) {
        kvf_log_error("xfer: peer pool of %llu bytes is not a whole number of %llu-byte blocks",
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

kvf_status_t kvf_xfer_check_desc(const kvf_xfer_t *xfer, const uint8_t *desc, size_t len)
{
    desc_view_t v;
    return desc_parse(xfer, desc, len, &v);
}

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
    st = accept ? xfer->ops->accept(p, v.body, v.body_len)
                : xfer->ops->connect(p, v.body, v.body_len);
    if (st != KVF_OK)
        goto fail_connect;
    p->next = xfer->peers;
    if (xfer->peers)
        xfer->peers->prev = p;
    xfer->peers = p;
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

void kvf_xfer__batch_end(kvf_xfer_batch_t *b, kvf_status_t status)
{
    if (b->status != KVF_ERR_AGAIN)
        return;
    b->status = status;
    kvf_xfer_t *x = b->peer->xfer;
    if (status == KVF_OK)
        x->stats.batches_ok++;
    else
        x->stats.batches_failed++;
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

/* ---- sender -------------------------------------------------------------- */

static void timer_at(kvf_xfer_t *x, uint64_t t)
{
    if (t < x->next_timer_ns)
        x->next_timer_ns = t;
}

/* Validates slices against both pools and merges each slice into the one
 * before it when both its local and remote ranges continue it. */
static kvf_status_t slices_coalesce(const kvf_xfer_peer_t *p, const kvf_xfer_slice_t *s, size_t n,
                                    kvf_xfer_slice_t **out_p, size_t *n_out_p, uint64_t *bytes_p)
{
    const kvf_xfer_t *x = p->xfer;
    kvf_xfer_slice_t *out = NULL;
    if (n) {
        out = malloc(n * sizeof(*out));
        if (!out)
            return KVF_ERR_NOMEM;
    }
    size_t m = 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        const kvf_xfer_slice_t *c = &s[i];
        if (!c->len || c->local_off > x->cfg.pool_bytes ||
            c->len > x->cfg.pool_bytes - c->local_off || c->remote_off > p->remote_bytes ||
            c->len > p->remote_bytes - c->remote_off) {
            kvf_log_error("xfer: slice %zu (local %llu, remote %llu, %llu bytes) is outside the "
                          "pools (local %llu, remote %llu bytes)",
                          i, (unsigned long long)c->local_off, (unsigned long long)c->remote_off,
                          (unsigned long long)c->len, (unsigned long long)x->cfg.pool_bytes,
                          (unsigned long long)p->remote_bytes);
            free(out);
            return KVF_ERR_INVAL;
        }
        bytes += c->len;
        if (m && out[m - 1].local_off + out[m - 1].len == c->local_off &&
            out[m - 1].remote_off + out[m - 1].len == c->remote_off)
            out[m - 1].len += c->len;
        else
            out[m++] = *c;
    }
    if (m > KVF_XFER_MAX_RANGES) {
        kvf_log_error("xfer: batch of %zu ranges is above the limit of %u", m, KVF_XFER_MAX_RANGES);
        free(out);
        return KVF_ERR_TOO_BIG;
    }
    *out_p = out;
    *n_out_p = m;
    *bytes_p = bytes;
    return KVF_OK;
}

/* Builds the completion message of batch b: every remote range it wrote
 * (so the receiver can check them against the reservation) and, when the
 * connection has checksums, the CRC32C of each. */
static kvf_status_t fin_build(kvf_xfer_batch_t *b, uint32_t flags, uint64_t bytes)
{
    bool crc = b->peer->checksum;
    size_t nr = b->n_ranges;
    size_t len = KVF_XFER_FIN_HEADER + nr * KVF_XFER_FIN_RANGE;
    uint8_t *m = calloc(1, len);
    if (!m)
        return KVF_ERR_NOMEM;
    xfer_put_u32(m + 0, KVF_XFER_FIN_MAGIC);
    xfer_put_u16(m + 4, KVF_XFER_FIN_VERSION);
    xfer_put_u16(m + 6, (uint16_t)(flags | (crc ? KVF_XFER_FIN_HAS_CRC : 0)));
    xfer_put_u64(m + 8, b->req_id);
    xfer_put_u64(m + 16, b->epoch);
    xfer_put_u64(m + 24, bytes);
    xfer_put_u32(m + 32, (uint32_t)nr);
    const uint8_t *pool = b->peer->xfer->pool;
    for (size_t i = 0; i < nr; i++) {
        uint8_t *r = m + KVF_XFER_FIN_HEADER + i * KVF_XFER_FIN_RANGE;
        const kvf_xfer_slice_t *s = &b->ranges[i];
        xfer_put_u64(r, s->remote_off);
        xfer_put_u64(r + 8, s->len);
        if (crc)
            xfer_put_u32(r + 16, kvf_crc32c(0, pool + s->local_off, s->len));
    }
    b->fin = m;
    b->fin_len = len;
    return KVF_OK;
}

kvf_status_t kvf_xfer_post(kvf_xfer_peer_t *peer, const kvf_xfer_batch_spec_t *spec,
                           kvf_xfer_batch_t **batch_p)
{
    kvf_xfer_t *x = peer->xfer;
    if (peer->status != KVF_OK)
        return peer->status;
    if (spec->flags & ~(KVF_XFER_LAST | KVF_XFER_ABORT) || peer->accepted)
        return KVF_ERR_INVAL;
    if (x->ops->ready && !x->ops->ready(peer))
        return KVF_ERR_AGAIN;
    uint64_t now = kvf_clock_ns();
    if (spec->not_after_ns && now >= spec->not_after_ns) {
        kvf_log_warn("xfer: request %llu epoch %llu: lease ended, batch not posted",
                     (unsigned long long)spec->req_id, (unsigned long long)spec->epoch);
        return KVF_ERR_TIMEOUT;
    }
    kvf_xfer_batch_t *b = calloc(1, sizeof(*b));
    if (!b)
        return KVF_ERR_NOMEM;
    b->peer = peer;
    b->req_id = spec->req_id;
    b->epoch = spec->epoch;
    b->status = KVF_ERR_AGAIN;
    b->deadline_ns = now + (uint64_t)x->cfg.timeout_ms * 1000000ull;
    if (spec->not_after_ns && spec->not_after_ns < b->deadline_ns)
        b->deadline_ns = spec->not_after_ns;
    uint64_t bytes = 0;
    kvf_status_t st =
        slices_coalesce(peer, spec->slices, spec->n_slices, &b->ranges, &b->n_ranges, &bytes);
    if (st != KVF_OK)
        goto fail_slices;
    st = fin_build(b, spec->flags, bytes);
    if (st != KVF_OK)
        goto fail_fin;
    /* Linked before the backend starts: it may end the batch at once. */
    b->next = peer->batches;
    if (peer->batches)
        peer->batches->prev = b;
    peer->batches = b;
    x->stats.batches_posted++;
    x->stats.bytes_posted += bytes;
    x->stats.puts_issued += b->n_ranges;
    timer_at(x, b->deadline_ns);
    st = x->ops->post(b);
    if (st != KVF_OK) {
        /* The backend failed the peer or the batch; report it now. */
        kvf_xfer__batch_end(b, st);
        b->released = true;
        kvf_xfer__reap(x);
        return st;
    }
    *batch_p = b;
    return KVF_OK;

fail_fin:
    free(b->ranges);
fail_slices:
    free(b);
    return st;
}

kvf_status_t kvf_xfer_test(const kvf_xfer_batch_t *batch)
{
    return batch->status;
}

void kvf_xfer_batch_release(kvf_xfer_batch_t *batch)
{
    if (!batch)
        return;
    batch->released = true;
    kvf_xfer__reap(batch->peer->xfer);
}

kvf_status_t kvf_xfer_wait(kvf_xfer_batch_t *batch, int timeout_ms)
{
    kvf_xfer_t *x = batch->peer->xfer;
    uint64_t until =
        timeout_ms < 0 ? UINT64_MAX : kvf_clock_ns() + (uint64_t)timeout_ms * 1000000ull;
    uint64_t active = kvf_clock_ns(); /* last time progress did something */
    for (;;) {
        unsigned n = kvf_xfer_progress(x);
        if (batch->status != KVF_ERR_AGAIN)
            return batch->status;
        uint64_t now = kvf_clock_ns();
        if (now >= until)
            return KVF_ERR_TIMEOUT;
        if (n)
            active = now;
        /* Spin first (over shared memory a batch takes microseconds, and a
         * wake-up through the fd costs tens), then sleep on the fd, waking
         * for the next deadline, and every 10 ms where the fd may not wake
         * for the batch's traffic. */
        if (now - active < 200000)
            continue;
        int fd = kvf_xfer_fd(x);
        if (fd < 0 || kvf_xfer_arm(x) != KVF_OK)
            continue;
        int ms = kvf_xfer_timeout_ms(x);
        int left = until == UINT64_MAX ? 10 : kvf_clock_ms_until(until);
        if (ms < 0 || ms > left)
            ms = left;
        if (!x->caps.fd_wakes_on_data && ms > 10)
            ms = 10;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        (void)poll(&pfd, 1, ms);
        active = kvf_clock_ns();
    }
}

/* ---- receiver ------------------------------------------------------------ */

static void event_push(kvf_xfer_t *x, kvf_xfer_event_kind_t kind, uint64_t req_id, uint64_t epoch,
                       uint64_t bytes, bool last, kvf_status_t status)
{
    if (x->ev_count == x->ev_cap) {
        size_t cap = x->ev_cap ? 2 * x->ev_cap : 64;
        kvf_xfer_event_t *e = malloc(cap * sizeof(*e));
        if (!e) {
            /* The event is lost; the counters in the stats still show it. */
            kvf_log_error("xfer: out of memory queueing an event");
            return;
        }
        for (size_t i = 0; i < x->ev_count; i++)
            e[i] = x->events[(x->ev_head + i) % x->ev_cap];
        free(x->events);
        x->events = e;
        x->ev_cap = cap;
        x->ev_head = 0;
    }
    kvf_xfer_event_t *e = &x->events[(x->ev_head + x->ev_count) % x->ev_cap];
    *e = (kvf_xfer_event_t){.kind = kind,
                            .req_id = req_id,
                            .epoch = epoch,
                            .bytes = bytes,
                            .last = last,
                            .status = status};
    x->ev_count++;
}

kvf_status_t kvf_xfer_poll(kvf_xfer_t *xfer, kvf_xfer_event_t *ev_p)
{
    if (!xfer->ev_count)
        return KVF_ERR_AGAIN;
    *ev_p = xfer->events[xfer->ev_head];
    xfer->ev_head = (xfer->ev_head + 1) % xfer->ev_cap;
    xfer->ev_count--;
    return KVF_OK;
}

static kvf_resv_t *resv_find(kvf_xfer_t *x, uint64_t req_id)
{
    for (size_t i = 0; i < x->n_resv; i++)
        if (x->resv[i].req_id == req_id)
            return &x->resv[i];
    return NULL;
}

static void resv_remove(kvf_xfer_t *x, kvf_resv_t *r)
{
    event_push(x, KVF_XFER_EV_RELEASED, r->req_id, r->epoch, 0, false, KVF_OK);
    free(r->ranges);
    *r = x->resv[--x->n_resv];
    x->stats.reservations_live = x->n_resv;
}

static int range_cmp(const void *a, const void *b)
{
    const kvf_xfer_range_t *ra = a, *rb = b;
    return ra->off < rb->off ? -1 : ra->off > rb->off;
}

kvf_status_t kvf_xfer_reserve(kvf_xfer_t *xfer, uint64_t req_id, uint64_t epoch,
                              const kvf_xfer_range_t *ranges, size_t n_ranges, uint32_t lease_ms)
{
    if (resv_find(xfer, req_id)) {
        kvf_log_error("xfer: request %llu already has a reservation", (unsigned long long)req_id);
        return KVF_ERR_INVAL;
    }
    if (!n_ranges)
        return KVF_ERR_INVAL;
    for (size_t i = 0; i < n_ranges; i++) {
        if (!ranges[i].len || ranges[i].off > xfer->cfg.pool_bytes ||
            ranges[i].len > xfer->cfg.pool_bytes - ranges[i].off) {
            kvf_log_error("xfer: request %llu: range %zu is outside the pool",
                          (unsigned long long)req_id, i);
            return KVF_ERR_INVAL;
        }
    }
    if (xfer->n_resv == xfer->cap_resv) {
        size_t cap = xfer->cap_resv ? 2 * xfer->cap_resv : 16;
        kvf_resv_t *r = realloc(xfer->resv, cap * sizeof(*r));
        if (!r)
            return KVF_ERR_NOMEM;
        xfer->resv = r;
        xfer->cap_resv = cap;
    }
    kvf_xfer_range_t *copy = malloc(n_ranges * sizeof(*copy));
    if (!copy)
        return KVF_ERR_NOMEM;
    memcpy(copy, ranges, n_ranges * sizeof(*copy));
    /* Sorted and merged, so a completion's ranges are found by bisection. */
    qsort(copy, n_ranges, sizeof(*copy), range_cmp);
    size_t m = 0;
    uint64_t total = 0;
    for (size_t i = 0; i < n_ranges; i++) {
        total += copy[i].len;
        if (m && copy[m - 1].off + copy[m - 1].len >= copy[i].off) {
            uint64_t end = copy[i].off + copy[i].len;
            if (end > copy[m - 1].off + copy[m - 1].len)
                copy[m - 1].len = end - copy[m - 1].off;
        } else {
            copy[m++] = copy[i];
        }
    }
    uint64_t lease = lease_ms ? lease_ms : KVF_XFER_DEFAULT_LEASE_MS;
    kvf_resv_t *r = &xfer->resv[xfer->n_resv++];
    *r = (kvf_resv_t){.req_id = req_id,
                      .epoch = epoch,
                      .ranges = copy,
                      .n_ranges = m,
                      .total_bytes = total,
                      .lease_end_ns = kvf_clock_ns() + lease * 1000000ull,
                      .state = KVF_RESV_LIVE};
    xfer->stats.reservations_live = xfer->n_resv;
    timer_at(xfer, r->lease_end_ns);
    return KVF_OK;
}

kvf_status_t kvf_xfer_cancel(kvf_xfer_t *xfer, uint64_t req_id, uint64_t epoch)
{
    kvf_resv_t *r = resv_find(xfer, req_id);
    if (!r || r->epoch != epoch)
        return KVF_ERR_NOT_FOUND;
    /* Two-sided: writes are the receiver's own copies, each checked against
     * a live reservation, so none can follow this call. */
    if (xfer->cfg.two_sided) {
        resv_remove(xfer, r);
        return KVF_OK;
    }
    switch (r->state) {
    case KVF_RESV_DONE:
        resv_remove(xfer, r);
        break;
    case KVF_RESV_LIVE:
    case KVF_RESV_EXPIRED:
        r->state = KVF_RESV_FENCED;
        timer_at(xfer, r->lease_end_ns + (uint64_t)xfer->cfg.grace_ms * 1000000ull);
        break;
    case KVF_RESV_FENCED:
        break;
    }
    return KVF_OK;
}

/* Whether [off, off+len) lies inside one of r's (sorted, merged) ranges. */
static bool resv_covers(const kvf_resv_t *r, uint64_t off, uint64_t len)
{
    size_t lo = 0, hi = r->n_ranges;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (r->ranges[mid].off + r->ranges[mid].len <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == r->n_ranges)
        return false;
    const kvf_xfer_range_t *c = &r->ranges[lo];
    return off >= c->off && len <= c->len && off - c->off <= c->len - len;
}

bool kvf_xfer__resv_accepts(kvf_xfer_t *xfer, uint64_t req_id, uint64_t epoch, uint64_t off,
                            uint64_t len)
{
    const kvf_resv_t *r = resv_find(xfer, req_id);
    return r && r->epoch == epoch && r->state == KVF_RESV_LIVE && len && resv_covers(r, off, len);
}

static void fin_reject(kvf_xfer_t *x, uint64_t req_id, uint64_t epoch, kvf_status_t why)
{
    x->stats.completions_rejected++;
    event_push(x, KVF_XFER_EV_REJECTED, req_id, epoch, 0, false, why);
}

/* Checks a landed batch's ranges (and checksums) against reservation r. */
static kvf_status_t fin_verify(kvf_xfer_t *x, const kvf_resv_t *r, const uint8_t *m, uint32_t flags,
                               uint32_t nr, uint64_t bytes)
{
    bool crc = flags & KVF_XFER_FIN_HAS_CRC;
    if (x->cfg.checksum && !crc && nr)
        return KVF_ERR_FORMAT;
    if (crc && x->cfg.mem_type != KVF_XFER_MEM_HOST)
        return KVF_ERR_UNSUPPORTED; /* the CPU cannot read a device pool */
    uint64_t sum = 0;
    for (uint32_t i = 0; i < nr; i++) {
        const uint8_t *rec = m + KVF_XFER_FIN_HEADER + (size_t)i * KVF_XFER_FIN_RANGE;
        uint64_t off = xfer_get_u64(rec), len = xfer_get_u64(rec + 8);
        if (!len || !resv_covers(r, off, len))
            return KVF_ERR_INVAL;
        sum += len;
    }
    if (sum != bytes)
        return KVF_ERR_INVAL;
    /* Ranges first: a checksum is only computed over memory the
     * reservation owns. */
    for (uint32_t i = 0; crc && i < nr; i++) {
        const uint8_t *rec = m + KVF_XFER_FIN_HEADER + (size_t)i * KVF_XFER_FIN_RANGE;
        uint64_t off = xfer_get_u64(rec), len = xfer_get_u64(rec + 8);
        if (kvf_crc32c(0, x->pool + off, len) != xfer_get_u32(rec + 16)) {
            x->stats.crc_failures++;
            return KVF_ERR_MISMATCH;
        }
    }
    return KVF_OK;
}

void kvf_xfer__on_fin(kvf_xfer_t *x, const void *msg, size_t len)
{
    const uint8_t *m = msg;
    if (len < KVF_XFER_FIN_HEADER || xfer_get_u32(m) != KVF_XFER_FIN_MAGIC ||
        xfer_get_u16(m + 4) != KVF_XFER_FIN_VERSION) {
        kvf_log_warn("xfer: malformed completion message (%zu bytes) dropped", len);
        fin_reject(x, 0, 0, KVF_ERR_FORMAT);
        return;
    }
    uint32_t flags = xfer_get_u16(m + 6);
    uint64_t req_id = xfer_get_u64(m + 8), epoch = xfer_get_u64(m + 16),
             bytes = xfer_get_u64(m + 24);
    uint32_t nr = xfer_get_u32(m + 32);
    if ((flags & ~(KVF_XFER_LAST | KVF_XFER_ABORT | KVF_XFER_FIN_HAS_CRC)) ||
        nr > KVF_XFER_MAX_RANGES || len != KVF_XFER_FIN_HEADER + (size_t)nr * KVF_XFER_FIN_RANGE) {
        kvf_log_warn("xfer: request %llu: malformed completion message dropped",
                     (unsigned long long)req_id);
        fin_reject(x, req_id, epoch, KVF_ERR_FORMAT);
        return;
    }
    bool fence = flags & (KVF_XFER_LAST | KVF_XFER_ABORT);
    kvf_resv_t *r = resv_find(x, req_id);
    if (!r || r->epoch != epoch || r->state != KVF_RESV_LIVE) {
        kvf_log_debug("xfer: request %llu epoch %llu: completion without a live reservation",
                      (unsigned long long)req_id, (unsigned long long)epoch);
        fin_reject(x, req_id, epoch, KVF_ERR_STALE);
        /* The sender flushed before sending this: for its request, nothing
         * more can land, which is the fence point a cancelled reservation
         * waits for. */
        if (r && r->epoch == epoch && fence) {
            if (r->state == KVF_RESV_FENCED)
                resv_remove(x, r);
            else if (r->state == KVF_RESV_EXPIRED)
                r->state = KVF_RESV_DONE;
        }
        return;
    }
    if (flags & KVF_XFER_ABORT) {
        r->state = KVF_RESV_DONE;
        event_push(x, KVF_XFER_EV_ABORTED, req_id, epoch, 0, false, KVF_ERR_CANCELLED);
        return;
    }
    kvf_status_t st = fin_verify(x, r, m, flags, nr, bytes);
    if (flags & KVF_XFER_LAST)
        r->state = KVF_RESV_DONE;
    if (st != KVF_OK) {
        kvf_log_error("xfer: request %llu epoch %llu: completion rejected: %s",
                      (unsigned long long)req_id, (unsigned long long)epoch, kvf_status_str(st));
        fin_reject(x, req_id, epoch, st);
        return;
    }
    r->landed_bytes += bytes;
    x->stats.completions_landed++;
    event_push(x, KVF_XFER_EV_LANDED, req_id, epoch, bytes, flags & KVF_XFER_LAST, KVF_OK);
}

/* ---- event loop ---------------------------------------------------------- */

/* Expires leases, releases fenced reservations and fails late batches;
 * recomputes the next timer. */
static void timers_run(kvf_xfer_t *x, uint64_t now)
{
    uint64_t next = UINT64_MAX;
    uint64_t grace = (uint64_t)x->cfg.grace_ms * 1000000ull;
    for (size_t i = 0; i < x->n_resv;) {
        kvf_resv_t *r = &x->resv[i];
        if (r->state == KVF_RESV_LIVE && now >= r->lease_end_ns) {
            kvf_log_warn("xfer: request %llu epoch %llu: lease ended before the last batch",
                         (unsigned long long)r->req_id, (unsigned long long)r->epoch);
            r->state = KVF_RESV_EXPIRED;
            event_push(x, KVF_XFER_EV_EXPIRED, r->req_id, r->epoch, 0, false, KVF_ERR_TIMEOUT);
        }
        if (r->state == KVF_RESV_FENCED && now >= r->lease_end_ns + grace) {
            resv_remove(x, r); /* moved the last one into slot i */
            continue;
        }
        if (r->state == KVF_RESV_LIVE && r->lease_end_ns < next)
            next = r->lease_end_ns;
        if (r->state == KVF_RESV_FENCED && r->lease_end_ns + grace < next)
            next = r->lease_end_ns + grace;
        i++;
    }
    for (kvf_xfer_peer_t *p = x->peers; p; p = p->next) {
        bool late = false;
        for (kvf_xfer_batch_t *b = p->batches; b; b = b->next) {
            if (b->status != KVF_ERR_AGAIN)
                continue;
            if (now >= b->deadline_ns)
                late = true;
            else if (b->deadline_ns < next)
                next = b->deadline_ns;
        }
        if (late) {
            kvf_log_error("xfer: a batch passed its %u ms deadline; closing the connection",
                          x->cfg.timeout_ms);
            kvf_xfer__peer_fail(p, KVF_ERR_TIMEOUT);
        }
    }
    x->next_timer_ns = next;
}

unsigned kvf_xfer_progress(kvf_xfer_t *xfer)
{
    unsigned n = xfer->ops->progress(xfer);
    if (kvf_clock_ns() >= xfer->next_timer_ns) {
        timers_run(xfer, kvf_clock_ns());
        n++;
    }
    if (n)
        kvf_xfer__reap(xfer);
    return n;
}

int kvf_xfer_fd(const kvf_xfer_t *xfer)
{
    return xfer->ops->fd ? xfer->ops->fd(xfer) : -1;
}

kvf_status_t kvf_xfer_arm(kvf_xfer_t *xfer)
{
    if (xfer->ev_count)
        return KVF_ERR_AGAIN;
    return xfer->ops->arm ? xfer->ops->arm(xfer) : KVF_OK;
}

int kvf_xfer_timeout_ms(const kvf_xfer_t *xfer)
{
    if (xfer->next_timer_ns == UINT64_MAX)
        return -1;
    return kvf_clock_ms_until(xfer->next_timer_ns);
}

void kvf_xfer_stats(const kvf_xfer_t *xfer, kvf_xfer_stats_t *stats_p)
{
    *stats_p = xfer->stats;
}

kvf_xfer_geometry_t kvf_xfer_geometry_of_pool(const kvf_kv_geometry_t *geo)
{
    return (kvf_xfer_geometry_t){
        .block_size = (uint32_t)geo->block_size,
        .n_layers = (uint32_t)geo->n_layers,
        .n_kv_heads = (uint32_t)geo->n_kv_heads,
        .head_dim = (uint32_t)geo->head_dim,
        .dtype = KVF_XFER_DTYPE_F32,
        .layout = 1,
    };
}
