/* NCCL backend of the transfer API (KVF_HAVE_NCCL builds): one 2-rank
 * communicator per (prefill, decode) pair, rank 0 the sender, rank 1 the
 * receiver, pools in GPU memory.
 *
 * Connecting. The sender's kvf_xfer_connect makes a ncclUniqueId and starts
 * a non-blocking ncclCommInitRankConfig as rank 0; the id travels in the
 * token (kvf_xfer_peer_token) through the control plane to the receiver,
 * whose kvf_xfer_accept joins as rank 1. kvf_xfer_progress polls both until
 * the communicator is ready, so no call blocks the event loop.
 *
 * A batch, on the peer's stream:
 *   sender:   header (the completion message, padded to a fixed size) then,
 *             grouped, one ncclSend per coalesced range;
 *   receiver: a standing ncclRecv of the header; once it has arrived, the
 *             ranges are checked (inside the pool, else the communicator is
 *             aborted; inside a live reservation, else received into a
 *             scratch buffer and dropped), then grouped ncclRecv into the
 *             pool, and when those complete on the GPU the completion is
 *             handled as with UCX (kvf_xfer__on_fin: LANDED or REJECTED).
 * Two-sided transfer lets the receiver choose where data goes, so a stale
 * request never writes into blocks it does not own. A peer that dies is
 * found by ncclCommGetAsyncError or by the batch deadline; either way the
 * communicator is aborted. */
#include "xfer_internal.h"

#ifdef KVF_HAVE_NCCL
#include "kvf/log.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#define NCCL_HDR_RANGES 4096u /* ranges per batch on this backend */
#define NCCL_HDR_BYTES  (KVF_XFER_FIN_HEADER + NCCL_HDR_RANGES * KVF_XFER_FIN_RANGE)
#define NCCL_SLOTS      8u /* sender: batches in flight per peer */

typedef struct {
    int device;    /* the GPU current at create; made current on every entry */
    bool own_pool; /* cudaMalloc'd here */
} nccl_xfer_t;

/* One thread may drive handles on several GPUs (as the two-GPU test does):
 * each entry point makes its handle's device current. */
static void use_device(const kvf_xfer_t *x)
{
    const nccl_xfer_t *nx = x->be;
    if (nx)
        cudaSetDevice(nx->device);
}

typedef enum {
    NCCL_RX_IDLE = 0, /* no header receive posted */
    NCCL_RX_HEADER,   /* waiting for a header */
    NCCL_RX_DATA,     /* waiting for the ranges */
} nccl_rx_t;

typedef struct {
    ncclUniqueId id;
    ncclComm_t comm;
    cudaStream_t stream;
    bool ready, aborted;
    /* sender: header slots, each in use until its batch's event fires */
    uint8_t *hdr_dev[NCCL_SLOTS]; /* (NCCL_HDR_BYTES,) device */
    uint8_t *hdr_host;            /* (NCCL_SLOTS, NCCL_HDR_BYTES) pinned host */
    kvf_xfer_batch_t *slot_batch[NCCL_SLOTS];
    /* receiver */
    nccl_rx_t rx;
    cudaEvent_t rx_event;
    uint8_t *scratch; /* (scratch_bytes,) device: discarded ranges */
    size_t scratch_bytes;
    size_t fin_len;
} nccl_peer_t;

typedef struct {
    cudaEvent_t done;
    unsigned slot;
} nccl_batch_t;

/* The one place NCCL and CUDA results become kvferry's. */
static kvf_status_t status_from_nccl(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess:
        return KVF_OK;
    case ncclInProgress:
        return KVF_ERR_AGAIN;
    case ncclInvalidArgument:
    case ncclInvalidUsage:
        return KVF_ERR_INVAL;
    case ncclRemoteError:
        return KVF_ERR_PEER;
    case ncclSystemError:
        return KVF_ERR_IO;
    default:
        return KVF_ERR_TRANSPORT;
    }
}

static kvf_status_t status_from_cuda(cudaError_t e)
{
    switch (e) {
    case cudaSuccess:
        return KVF_OK;
    case cudaErrorNotReady:
        return KVF_ERR_AGAIN;
    case cudaErrorMemoryAllocation:
        return KVF_ERR_NOMEM;
    default:
        return KVF_ERR_DEVICE;
    }
}

/* Logs a failed call (once, here) and converts its result. */
static kvf_status_t nccl_check(ncclResult_t r, const char *what)
{
    if (r != ncclSuccess && r != ncclInProgress)
        kvf_log_error("xfer/nccl: %s failed: %s", what, ncclGetErrorString(r));
    return status_from_nccl(r);
}

static kvf_status_t cuda_check(cudaError_t e, const char *what)
{
    if (e != cudaSuccess)
        kvf_log_error("xfer/nccl: %s failed: %s", what, cudaGetErrorString(e));
    return status_from_cuda(e);
}

/* ---- handle -------------------------------------------------------------- */

static kvf_status_t nccl_open(kvf_xfer_t *x)
{
    if (x->cfg.mem_type != KVF_XFER_MEM_CUDA) {
        kvf_log_error("xfer/nccl: the pool must be in GPU memory");
        return KVF_ERR_UNSUPPORTED;
    }
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        kvf_log_error("xfer/nccl: no GPU");
        return KVF_ERR_DEVICE;
    }
    nccl_xfer_t *nx = calloc(1, sizeof(*nx));
    if (!nx)
        return KVF_ERR_NOMEM;
    if (cudaGetDevice(&nx->device) != cudaSuccess)
        nx->device = 0;
    if (!x->pool) {
        void *pool;
        kvf_status_t st = cuda_check(cudaMalloc(&pool, x->cfg.pool_bytes), "pool allocation");
        if (st != KVF_OK) {
            free(nx);
            return st;
        }
        x->pool = pool;
        nx->own_pool = true;
    }
    x->be = nx;
    return KVF_OK;
}

static void nccl_close(kvf_xfer_t *x)
{
    use_device(x);
    nccl_xfer_t *nx = x->be;
    /* Leftover peers (xfer.c frees them after this) lose their
     * communicators now: nothing may still write into the pool. */
    for (kvf_xfer_peer_t *p = x->peers; p; p = p->next) {
        nccl_peer_t *np = p->be;
        if (np && np->comm && !np->aborted) {
            ncclCommAbort(np->comm);
            np->aborted = true;
        }
    }
    if (nx->own_pool) {
        cudaFree(x->pool);
        x->pool = NULL;
    }
    free(nx);
    x->be = NULL;
}

/* The receiver's descriptor has nothing backend-specific: the pairing id
 * comes with each sender's token. */
static kvf_status_t nccl_export_body(kvf_xfer_t *x, uint8_t **body_p, size_t *len_p)
{
    (void)x;
    *body_p = NULL;
    *len_p = 0;
    return KVF_OK;
}

/* ---- peers --------------------------------------------------------------- */

static void peer_release(nccl_peer_t *np)
{
    if (np->rx_event)
        cudaEventDestroy(np->rx_event);
    for (unsigned i = 0; i < NCCL_SLOTS; i++)
        if (np->hdr_dev[i])
            cudaFree(np->hdr_dev[i]);
    if (np->hdr_host)
        cudaFreeHost(np->hdr_host);
    if (np->scratch)
        cudaFree(np->scratch);
    if (np->stream)
        cudaStreamDestroy(np->stream);
    free(np);
}

/* Allocates the peer's CUDA resources and starts joining the pair's
 * communicator as rank (non-blocking: progress finishes it). */
static kvf_status_t peer_init(kvf_xfer_peer_t *p, int rank)
{
    nccl_peer_t *np = p->be;
    kvf_status_t st = cuda_check(cudaStreamCreateWithFlags(&np->stream, cudaStreamNonBlocking),
                                 "stream creation");
    if (st != KVF_OK)
        return st;
    if (rank == 0) {
        for (unsigned i = 0; i < NCCL_SLOTS && st == KVF_OK; i++)
            st = cuda_check(cudaMalloc((void **)&np->hdr_dev[i], NCCL_HDR_BYTES),
                            "header allocation");
        if (st == KVF_OK)
            st = cuda_check(
                cudaMallocHost((void **)&np->hdr_host, (size_t)NCCL_SLOTS * NCCL_HDR_BYTES),
                "pinned header allocation");
    } else {
        st = cuda_check(cudaMalloc((void **)&np->hdr_dev[0], NCCL_HDR_BYTES), "header allocation");
        if (st == KVF_OK)
            st = cuda_check(cudaMallocHost((void **)&np->hdr_host, NCCL_HDR_BYTES),
                            "pinned header allocation");
        if (st == KVF_OK)
            st = cuda_check(cudaEventCreateWithFlags(&np->rx_event, cudaEventDisableTiming),
                            "event creation");
    }
    if (st != KVF_OK)
        return st;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    return nccl_check(ncclCommInitRankConfig(&np->comm, 2, np->id, rank, &config),
                      "communicator init");
}

static kvf_status_t nccl_connect(kvf_xfer_peer_t *p, const uint8_t *body, size_t len)
{
    use_device(p->xfer);
    (void)body;
    if (len != 0) {
        kvf_log_error("xfer/nccl: unexpected descriptor body of %zu bytes", len);
        return KVF_ERR_FORMAT;
    }
    nccl_peer_t *np = calloc(1, sizeof(*np));
    if (!np)
        return KVF_ERR_NOMEM;
    p->be = np;
    kvf_status_t st = nccl_check(ncclGetUniqueId(&np->id), "unique id");
    if (st == KVF_OK || st == KVF_ERR_AGAIN)
        st = peer_init(p, 0);
    if (st != KVF_OK && st != KVF_ERR_AGAIN)
        goto fail_init;
    return KVF_OK;

fail_init:
    if (np->comm)
        ncclCommAbort(np->comm);
    peer_release(np);
    p->be = NULL;
    return st;
}

/* Token body: the pair's ncclUniqueId. */
static kvf_status_t nccl_token_body(kvf_xfer_peer_t *p, uint8_t **body_p, size_t *len_p)
{
    nccl_peer_t *np = p->be;
    uint8_t *b = malloc(sizeof(np->id));
    if (!b)
        return KVF_ERR_NOMEM;
    memcpy(b, &np->id, sizeof(np->id));
    *body_p = b;
    *len_p = sizeof(np->id);
    return KVF_OK;
}

static kvf_status_t nccl_accept(kvf_xfer_peer_t *p, const uint8_t *body, size_t len)
{
    use_device(p->xfer);
    if (len != sizeof(ncclUniqueId)) {
        kvf_log_error("xfer/nccl: token body of %zu bytes, expected %zu", len,
                      sizeof(ncclUniqueId));
        return KVF_ERR_FORMAT;
    }
    nccl_peer_t *np = calloc(1, sizeof(*np));
    if (!np)
        return KVF_ERR_NOMEM;
    p->be = np;
    memcpy(&np->id, body, len);
    kvf_status_t st = peer_init(p, 1);
    if (st != KVF_OK && st != KVF_ERR_AGAIN) {
        if (np->comm)
            ncclCommAbort(np->comm);
        peer_release(np);
        p->be = NULL;
        return st;
    }
    return KVF_OK;
}

static void nccl_shutdown(kvf_xfer_peer_t *p)
{
    nccl_peer_t *np = p->be;
    if (np->comm && !np->aborted) {
        /* Abort, not finalize: the peer may be gone, and pending
         * operations must end now rather than wait for it. */
        ncclCommAbort(np->comm);
        np->aborted = true;
    }
}

static bool nccl_shutdown_done(kvf_xfer_peer_t *p)
{
    nccl_peer_t *np = p->be;
    return np->aborted || !np->comm;
}

static void nccl_peer_free(kvf_xfer_peer_t *p)
{
    if (p->be)
        peer_release(p->be);
    p->be = NULL;
}

/* ---- sender -------------------------------------------------------------- */

static bool nccl_ready(kvf_xfer_peer_t *p)
{
    nccl_peer_t *np = p->be;
    if (!np->ready)
        return false;
    for (unsigned i = 0; i < NCCL_SLOTS; i++)
        if (!np->slot_batch[i])
            return true;
    return false;
}

static kvf_status_t nccl_post(kvf_xfer_batch_t *b)
{
    use_device(b->peer->xfer);
    kvf_xfer_peer_t *p = b->peer;
    nccl_peer_t *np = p->be;
    if (b->n_ranges > NCCL_HDR_RANGES || b->fin_len > NCCL_HDR_BYTES) {
        kvf_log_error("xfer/nccl: batch of %zu ranges is above this backend's %u", b->n_ranges,
                      NCCL_HDR_RANGES);
        return KVF_ERR_TOO_BIG;
    }
    unsigned slot = 0;
    while (np->slot_batch[slot])
        slot++; /* nccl_ready found a free one */
    nccl_batch_t *nb = calloc(1, sizeof(*nb));
    if (!nb)
        return KVF_ERR_NOMEM;
    kvf_status_t st =
        cuda_check(cudaEventCreateWithFlags(&nb->done, cudaEventDisableTiming), "event creation");
    if (st != KVF_OK) {
        free(nb);
        return st;
    }
    nb->slot = slot;
    b->be = nb;
    np->slot_batch[slot] = b;
    uint8_t *host = np->hdr_host + (size_t)slot * NCCL_HDR_BYTES;
    memset(host, 0, NCCL_HDR_BYTES);
    memcpy(host, b->fin, b->fin_len);
    st = cuda_check(cudaMemcpyAsync(np->hdr_dev[slot], host, NCCL_HDR_BYTES, cudaMemcpyHostToDevice,
                                    np->stream),
                    "header copy");
    if (st == KVF_OK)
        st = nccl_check(
            ncclSend(np->hdr_dev[slot], NCCL_HDR_BYTES, ncclUint8, 1, np->comm, np->stream),
            "header send");
    if (st != KVF_OK && st != KVF_ERR_AGAIN)
        goto fail;
    /* The ranges in one group: the receiver posts its matching receives
     * (same order, same sizes) once it has read the header. */
    const uint8_t *pool = p->xfer->pool;
    st = nccl_check(ncclGroupStart(), "group start");
    for (size_t i = 0; i < b->n_ranges && (st == KVF_OK || st == KVF_ERR_AGAIN); i++)
        st = nccl_check(ncclSend(pool + b->ranges[i].local_off, b->ranges[i].len, ncclUint8, 1,
                                 np->comm, np->stream),
                        "send");
    kvf_status_t end = nccl_check(ncclGroupEnd(), "group end");
    if (st == KVF_OK || st == KVF_ERR_AGAIN)
        st = end;
    if (st != KVF_OK && st != KVF_ERR_AGAIN)
        goto fail;
    st = cuda_check(cudaEventRecord(nb->done, np->stream), "event record");
    if (st != KVF_OK)
        goto fail;
    return KVF_OK;

fail:
    kvf_xfer__peer_fail(p, KVF_ERR_TRANSPORT);
    return p->status;
}

static void nccl_batch_free(kvf_xfer_batch_t *b)
{
    nccl_batch_t *nb = b->be;
    if (!nb)
        return;
    nccl_peer_t *np = b->peer->be;
    if (np && np->slot_batch[nb->slot] == b)
        np->slot_batch[nb->slot] = NULL;
    cudaEventDestroy(nb->done); /* released by CUDA once it fires */
    free(nb);
    b->be = NULL;
}

/* ---- receiver ------------------------------------------------------------ */

static kvf_status_t rx_post_header(kvf_xfer_peer_t *p)
{
    nccl_peer_t *np = p->be;
    kvf_status_t st =
        nccl_check(ncclRecv(np->hdr_dev[0], NCCL_HDR_BYTES, ncclUint8, 0, np->comm, np->stream),
                   "header receive");
    if (st != KVF_OK && st != KVF_ERR_AGAIN)
        return st;
    st = cuda_check(cudaEventRecord(np->rx_event, np->stream), "event record");
    if (st == KVF_OK)
        np->rx = NCCL_RX_HEADER;
    return st;
}

/* The header arrived: check it (untrusted) and post the matching receives. */
static kvf_status_t rx_post_data(kvf_xfer_peer_t *p)
{
    kvf_xfer_t *x = p->xfer;
    nccl_peer_t *np = p->be;
    kvf_status_t st =
        cuda_check(cudaMemcpy(np->hdr_host, np->hdr_dev[0], NCCL_HDR_BYTES, cudaMemcpyDeviceToHost),
                   "header copy");
    if (st != KVF_OK)
        return st;
    const uint8_t *h = np->hdr_host;
    uint32_t nr = xfer_get_u32(h + 32);
    if (xfer_get_u32(h) != KVF_XFER_FIN_MAGIC || nr > NCCL_HDR_RANGES) {
        kvf_log_error("xfer/nccl: malformed batch header from peer");
        return KVF_ERR_PEER;
    }
    uint64_t req_id = xfer_get_u64(h + 8), epoch = xfer_get_u64(h + 16);
    size_t largest = 0;
    for (uint32_t i = 0; i < nr; i++) {
        const uint8_t *rec = h + KVF_XFER_FIN_HEADER + (size_t)i * KVF_XFER_FIN_RANGE;
        uint64_t off = xfer_get_u64(rec), len = xfer_get_u64(rec + 8);
        if (!len || off > x->cfg.pool_bytes || len > x->cfg.pool_bytes - off) {
            /* The sizes must be received to keep the stream in step, and a
             * range this wrong means the peer cannot be trusted: cut it. */
            kvf_log_error("xfer/nccl: request %llu: range outside the pool; closing the pair",
                          (unsigned long long)req_id);
            return KVF_ERR_PEER;
        }
        if (!kvf_xfer__resv_accepts(x, req_id, epoch, off, len) && len > largest)
            largest = len;
    }
    if (largest > np->scratch_bytes) {
        if (np->scratch)
            cudaFree(np->scratch);
        np->scratch = NULL;
        np->scratch_bytes = 0;
        st = cuda_check(cudaMalloc((void **)&np->scratch, largest), "scratch allocation");
        if (st != KVF_OK)
            return st;
        np->scratch_bytes = largest;
    }
    st = nccl_check(ncclGroupStart(), "group start");
    for (uint32_t i = 0; i < nr && (st == KVF_OK || st == KVF_ERR_AGAIN); i++) {
        const uint8_t *rec = h + KVF_XFER_FIN_HEADER + (size_t)i * KVF_XFER_FIN_RANGE;
        uint64_t off = xfer_get_u64(rec), len = xfer_get_u64(rec + 8);
        /* Data for a request that owns no such blocks lands in scratch. */
        uint8_t *dst =
            kvf_xfer__resv_accepts(x, req_id, epoch, off, len) ? x->pool + off : np->scratch;
        st = nccl_check(ncclRecv(dst, len, ncclUint8, 0, np->comm, np->stream), "receive");
    }
    kvf_status_t end = nccl_check(ncclGroupEnd(), "group end");
    if (st == KVF_OK || st == KVF_ERR_AGAIN)
        st = end;
    if (st != KVF_OK && st != KVF_ERR_AGAIN)
        return st;
    np->fin_len = KVF_XFER_FIN_HEADER + (size_t)nr * KVF_XFER_FIN_RANGE;
    st = cuda_check(cudaEventRecord(np->rx_event, np->stream), "event record");
    if (st == KVF_OK)
        np->rx = NCCL_RX_DATA;
    return st;
}

/* ---- event loop ---------------------------------------------------------- */

static unsigned peer_progress(kvf_xfer_peer_t *p)
{
    nccl_peer_t *np = p->be;
    if (np->aborted || p->status != KVF_OK)
        return 0;
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(np->comm, &async);
    if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
        kvf_log_error("xfer/nccl: communicator failed: %s",
                      ncclGetErrorString(r != ncclSuccess ? r : async));
        kvf_xfer__peer_fail(p, KVF_ERR_PEER);
        return 1;
    }
    if (!np->ready) {
        if (async == ncclInProgress)
            return 0;
        np->ready = true;
    }
    unsigned n = 0;
    kvf_status_t st = KVF_OK;
    if (!p->accepted) {
        for (unsigned i = 0; i < NCCL_SLOTS; i++) {
            kvf_xfer_batch_t *b = np->slot_batch[i];
            if (!b || b->status != KVF_ERR_AGAIN)
                continue;
            nccl_batch_t *nb = b->be;
            cudaError_t e = cudaEventQuery(nb->done);
            if (e == cudaErrorNotReady)
                continue;
            n++;
            if (e != cudaSuccess) {
                st = cuda_check(e, "batch");
                break;
            }
            np->slot_batch[i] = NULL; /* the header slot is free again */
            kvf_xfer__batch_end(b, KVF_OK);
        }
    } else if (np->rx == NCCL_RX_IDLE) {
        st = rx_post_header(p);
        n++;
    } else {
        cudaError_t e = cudaEventQuery(np->rx_event);
        if (e == cudaSuccess) {
            n++;
            if (np->rx == NCCL_RX_HEADER) {
                st = rx_post_data(p);
            } else {
                kvf_xfer__on_fin(p->xfer, np->hdr_host, np->fin_len);
                np->rx = NCCL_RX_IDLE;
                st = rx_post_header(p);
            }
        } else if (e != cudaErrorNotReady) {
            st = cuda_check(e, "receive");
        }
    }
    if (st != KVF_OK && st != KVF_ERR_AGAIN)
        kvf_xfer__peer_fail(p, st == KVF_ERR_PEER ? KVF_ERR_PEER : KVF_ERR_TRANSPORT);
    return n;
}

static unsigned nccl_progress(kvf_xfer_t *x)
{
    use_device(x);
    unsigned n = 0;
    for (kvf_xfer_peer_t *p = x->peers; p; p = p->next)
        n += peer_progress(p);
    return n;
}

static void nccl_caps(const kvf_xfer_config_t *cfg, kvf_xfer_caps_t *caps_p)
{
    (void)cfg;
    *caps_p = (kvf_xfer_caps_t){
        .one_sided = false, /* the receiver places every range itself */
        .one_sided_survives_sender_death = true,
        /* No fd at all: completions are CUDA events, polled (1 ms, the
         * prefill node's period for a transport without an fd). */
        .fd_wakes_on_data = false,
        .poll_ms = 1,
    };
}

const kvf_xfer_ops_t kvf_xfer_nccl_ops = {
    .name = "nccl",
    .caps = nccl_caps,
    .open = nccl_open,
    .close = nccl_close,
    .export_body = nccl_export_body,
    .connect = nccl_connect,
    .shutdown = nccl_shutdown,
    .shutdown_done = nccl_shutdown_done,
    .peer_free = nccl_peer_free,
    .ready = nccl_ready,
    .token_body = nccl_token_body,
    .accept = nccl_accept,
    .post = nccl_post,
    .batch_free = nccl_batch_free,
    .progress = nccl_progress,
    .fd = NULL, /* no fd: the loop calls kvf_xfer_progress on a timer */
    .arm = NULL,
};
#endif
