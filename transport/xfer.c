/* The transfer handle (kvf/xfer.h): the backend's choice and capabilities,
 * creating and destroying a handle, freeing the batches and peers nobody
 * needs any more, the pool's geometry, and the event loop's entry points
 * (progress, fd, deadlines). The rest of the backend-neutral half lives
 * one concept a file beside it: xfer_connect.c (descriptors, tokens,
 * peers), xfer_batch.c (the sender's batches), xfer_fin.c (the completion
 * message), xfer_resv.c (the receiver's reservations, fencing and events).
 * Backends (ucx.c, nccl.c) only move bytes and messages. */
#include "xfer_internal.h"

#include "kvf/clock.h"
#include "kvf/kv_format.h"
#include "kvf/log.h"

#include <stdlib.h>

/* ---- geometry ------------------------------------------------------------ */

_Static_assert((int)KVF_XFER_DTYPE_F32 == (int)KVF_KV_F32 &&
                   (int)KVF_XFER_DTYPE_F16 == (int)KVF_KV_F16 &&
                   (int)KVF_XFER_DTYPE_BF16 == (int)KVF_KV_BF16 &&
                   (int)KVF_XFER_DTYPE_FP8 == (int)KVF_KV_FP8 &&
                   (int)KVF_XFER_DTYPE_INT8 == (int)KVF_KV_INT8,
               "transfer dtypes are numbered as the pool's (kvf/kv_format.h)");

/* A block: for each layer, K and V of block_size rows per kv head, each
 * row its data and, for fp8/int8, its scale (kvf_kv_row_bytes; the pool
 * puts the scales after the data, the block's size is the same). */
uint64_t kvf_xfer_block_bytes(const kvf_xfer_geometry_t *g)
{
    if (g->dtype >= KVF_KV_N_DTYPES || !g->block_size || !g->n_layers || !g->n_kv_heads ||
        !g->head_dim || g->head_dim > INT32_MAX || g->layout != 1)
        return 0;
    uint64_t row = kvf_kv_row_bytes((kvf_kv_dtype_t)g->dtype, (int)g->head_dim);
    /* Each factor is below 2^32 and real pools are far below 2^64 bytes per
     * block; the product is checked against overflow anyway. */
    uint64_t b = 2;
    const uint64_t f[] = {g->block_size, g->n_layers, g->n_kv_heads, row};
    for (int i = 0; i < 4; i++) {
        if (b > UINT64_MAX / f[i])
            return 0;
        b *= f[i];
    }
    return b;
}

kvf_xfer_geometry_t kvf_xfer_geometry_of_pool(const kvf_kv_geometry_t *geo)
{
    return (kvf_xfer_geometry_t){
        .block_size = (uint32_t)geo->block_size,
        .n_layers = (uint32_t)geo->n_layers,
        .n_kv_heads = (uint32_t)geo->n_kv_heads,
        .head_dim = (uint32_t)geo->head_dim,
        .dtype = (uint32_t)geo->dtype,
        .layout = 1,
    };
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

/* ---- event loop ---------------------------------------------------------- */

/* Expires leases, releases fenced reservations and fails late batches;
 * recomputes the next timer. */
static void timers_run(kvf_xfer_t *x, uint64_t now)
{
    uint64_t next = kvf_xfer__resv_deadlines(x, now);
    uint64_t batches = kvf_xfer__batch_deadlines(x, now);
    x->next_timer_ns = batches < next ? batches : next;
}

/* The handle's earliest deadline passed gap_ns before the loop looked (it
 * was computing, or the machine was busy; a loop that sleeps wakes at the
 * deadline): what the peers did in that time could not be seen, so it
 * does not count against them. Batch timeouts and the receiver's leases
 * move on by the gap; a batch's not_after_ns (its sender's promise to the
 * receiver) does not, and a later lease end only holds blocks longer. */
static void starvation_forgive(kvf_xfer_t *x, uint64_t gap_ns)
{
    for (kvf_xfer_peer_t *p = x->peers; p; p = p->next) {
        p->progress_ns += gap_ns;
        for (kvf_xfer_batch_t *b = p->batches; b; b = b->next)
            if (b->status == KVF_ERR_AGAIN)
                b->timeout_ns += gap_ns;
    }
    for (size_t i = 0; i < x->n_resv; i++)
        kvf_xfer__resv_extend(&x->resv[i], x->resv[i].lease_end_ns + gap_ns);
    x->next_timer_ns = 0; /* recompute */
}

unsigned kvf_xfer_progress(kvf_xfer_t *xfer)
{
    uint64_t now = kvf_clock_ns();
    if (xfer->next_timer_ns != UINT64_MAX && now > xfer->next_timer_ns + KVF_XFER_STARVED_NS)
        starvation_forgive(xfer, now - xfer->next_timer_ns - KVF_XFER_STARVED_NS);
    unsigned n = 0;
    /* Deadlines first: a batch past its lease end fails before the backend
     * may push any more of it. */
    if (now >= xfer->next_timer_ns) {
        timers_run(xfer, now);
        n++;
    }
    n += xfer->ops->progress(xfer);
    if (kvf_clock_ns() >= xfer->next_timer_ns) {
        timers_run(xfer, kvf_clock_ns());
        n++;
    }
    if (n)
        kvf_xfer__reap(xfer);
    return n;
}

unsigned kvf_xfer_progress_for(kvf_xfer_t *xfer, unsigned budget_ms)
{
    uint64_t end = kvf_clock_ns() + (uint64_t)budget_ms * 1000000ull;
    unsigned total = 0, n;
    do {
        n = kvf_xfer_progress(xfer);
        total += n;
    } while (n && kvf_clock_ns() < end);
    return total;
}

void kvf_xfer_extend(kvf_xfer_t *xfer, uint64_t req_id, uint64_t epoch, uint64_t not_after_ns)
{
    for (kvf_xfer_peer_t *p = xfer->peers; p; p = p->next)
        for (kvf_xfer_batch_t *b = p->batches; b; b = b->next)
            if (b->req_id == req_id && b->epoch == epoch && b->not_after_ns &&
                b->not_after_ns < not_after_ns)
                b->not_after_ns = not_after_ns;
}

kvf_status_t kvf_xfer_relisten(kvf_xfer_t *xfer)
{
    if (!xfer->ops->relisten)
        return KVF_ERR_UNSUPPORTED;
    if (xfer->peers)
        return KVF_ERR_AGAIN;
    /* The old endpoint may still carry the completions of every
     * reservation made so far: it stays while it delivers, and goes after
     * one lease (the longest held, or renewed) plus the batch timeout of
     * silence. */
    uint64_t lease_ns = 0;
    for (size_t i = 0; i < xfer->n_resv; i++)
        if (xfer->resv[i].lease_ns > lease_ns)
            lease_ns = xfer->resv[i].lease_ns;
    uint64_t retire_ns = lease_ns + (uint64_t)xfer->cfg.timeout_ms * 1000000ull;
    kvf_status_t st = xfer->ops->relisten(xfer, retire_ns);
    if (st == KVF_OK)
        xfer->stats.relistens++;
    return st;
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
