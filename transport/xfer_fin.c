/* The completion message ("FIN", layout in xfer_internal.h): built by the
 * sender after a batch's data is in the receiver's memory, checked by the
 * receiver against its reservations (xfer_resv.c) and turned into the
 * LANDED, ABORTED or REJECTED event, or a fence point. */
#include "xfer_internal.h"

#include "kvf/clock.h"
#include "kvf/crc32c.h"
#include "kvf/log.h"

#include <stdlib.h>

/* ---- sender -------------------------------------------------------------- */

/* Builds the completion message of batch b: every remote range it wrote
 * (so the receiver can check them against the reservation) and, when the
 * connection has checksums, the CRC32C of each. */
kvf_status_t kvf_xfer__fin_build(kvf_xfer_batch_t *b, uint32_t flags, uint64_t bytes)
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

/* ---- receiver ------------------------------------------------------------ */

static void fin_reject(kvf_xfer_t *x, uint64_t req_id, uint64_t epoch, kvf_status_t why)
{
    x->stats.completions_rejected++;
    kvf_xfer__event_push(x, KVF_XFER_EV_REJECTED, req_id, epoch, 0, false, why);
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
        if (!len || !kvf_xfer__resv_covers(r, off, len))
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
    kvf_resv_t *r = kvf_xfer__resv_find(x, req_id);
    if (!r || r->epoch != epoch || r->state != KVF_RESV_LIVE) {
        kvf_log_debug("xfer: request %llu epoch %llu: completion without a live reservation",
                      (unsigned long long)req_id, (unsigned long long)epoch);
        fin_reject(x, req_id, epoch, KVF_ERR_STALE);
        /* The sender flushed before sending this: for its request, nothing
         * more can land, which is the fence point a cancelled reservation
         * waits for. */
        if (r && r->epoch == epoch && fence) {
            if (r->state == KVF_RESV_FENCED)
                kvf_xfer__resv_remove(x, r);
            else if (r->state == KVF_RESV_EXPIRED)
                r->state = KVF_RESV_DONE;
        }
        return;
    }
    if (flags & KVF_XFER_ABORT) {
        r->state = KVF_RESV_DONE;
        kvf_xfer__event_push(x, KVF_XFER_EV_ABORTED, req_id, epoch, 0, false, KVF_ERR_CANCELLED);
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
    /* A layer landed: its sender is making progress (docs/PROTOCOL.md,
     * Liveness). Only the receiver's end moves; the sender's own end
     * moves with a KvLeaseReply. */
    kvf_xfer__resv_extend(r, kvf_clock_ns() + r->lease_ns);
    kvf_xfer__event_push(x, KVF_XFER_EV_LANDED, req_id, epoch, bytes, flags & KVF_XFER_LAST,
                         KVF_OK);
}
