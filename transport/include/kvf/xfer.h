/* KV block transfer between processes: a prefill node writes (RMA put) the
 * K/V slices of a request straight into a decode node's registered pool
 * (or, two-sided, sends them for the decode node to place).
 *
 * One API over several backends (UCX by default; NCCL for GPU pairs when
 * built with KVF_HAVE_NCCL). Every handle is single-threaded: the node's
 * event loop owns it and drives it with kvf_xfer_progress().
 *
 * Sender (prefill node P)                 Receiver (decode node D)
 * -----------------------                 ------------------------
 * kvf_xfer_create(pool)                   kvf_xfer_create(pool)
 *                                         kvf_xfer_export() -> descriptor bytes,
 *                                           sent in Register to the router
 * kvf_xfer_connect(D's descriptor)          (validated: length, magic, version,
 *   (once per decode node, cached)           checksum, pool size, geometry)
 *   -> KvAlloc{req_id, epoch} ------->     blocks allocated,
 *                                         kvf_xfer_reserve(req_id, epoch,
 *                                           ranges, lease_ms)
 *   <- KvAllocReply{blocks, lease_ms} --
 * per layer: kvf_xfer_post(slices)
 *   ... the last one with KVF_XFER_LAST   kvf_xfer_poll() -> LANDED events;
 * kvf_xfer_test()/wait() per batch          LANDED with last = all bytes are in
 *   -> KvReady ---------------------->      the pool and verified
 *
 * Completion: after a batch's puts, the sender flushes its endpoint (all of
 * the endpoint's puts are then complete in the receiver's memory) and sends
 * a completion message (active message) carrying request id, epoch, flags,
 * byte count and, when checksums are on, each written range with its
 * CRC32C. The receiver checks it against a live reservation: unknown or
 * stale (request id, epoch), ranges outside the reservation, byte counts
 * above it, or a CRC that does not match its own pool are REJECTED and
 * counted, never reported as landed.
 *
 * Fencing. RMA writes are invisible to the receiver's CPU, so the receiver
 * cannot tell by itself when the last write of a request has landed. Its
 * blocks become reusable (a RELEASED event) only at a point where no write
 * of the request can still arrive:
 *  1. a completion with KVF_XFER_LAST or KVF_XFER_ABORT for (req_id, epoch)
 *     arrived: the sender sends it after its endpoint flush completed, and
 *     promises to post nothing more for that request (all of a request's
 *     batches go through one peer handle, so the flush covers them all); or
 *  2. the lease has ended plus the grace period: the sender never posts a
 *     batch after its lease end (not_after_ns, computed on the sender's
 *     clock from the moment it SENT the allocation request, or the renewal
 *     the receiver answered (kvf_xfer_renew, kvf_xfer_extend), so it ends
 *     no later than the receiver's lease), and a batch still outstanding at
 *     its deadline is failed and its endpoint flushed for at most grace_ms,
 *     then closed by force, which stops further writes; one found past its
 *     lease end (its loop was not looking) is closed by force at once,
 *     without the flush. Both ends use the same grace_ms (default 1 s),
 *     which also covers data already in the network at that moment.
 * kvf_xfer_cancel() therefore reports RELEASED at once when the request had
 * fully landed (or the sender aborted it), and otherwise when one of the
 * two points is reached. A completion for a cancelled reservation is
 * rejected (KVF_ERR_STALE) but still used as a fence point.
 *
 * Two-sided transfer (UCX with config two_sided, and NCCL) needs no such
 * fence for data it has not yet accepted: the receiver places every slice
 * itself after checking it against a live reservation, and drops the rest.
 * A two-sided UCX receiver exports no rkey and reports RELEASED at once.
 *
 * A peer that dies or stops answering completes each of its batches with
 * an error within the handle's timeout (default 5 s), never a hang. */
#ifndef KVF_XFER_H
#define KVF_XFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvf/kvcache.h"
#include "kvf/status.h"

typedef struct kvf_xfer kvf_xfer_t;             /* a local pool registered with a backend */
typedef struct kvf_xfer_peer kvf_xfer_peer_t;   /* a connection to one remote pool */
typedef struct kvf_xfer_batch kvf_xfer_batch_t; /* one posted list of puts */

typedef enum {
    KVF_XFER_UCX = 0,  /* UCX RMA put; UCX_TLS selects shm, tcp, rdma, ... */
    KVF_XFER_NCCL = 1, /* NCCL send/recv between two GPUs (KVF_HAVE_NCCL builds) */
} kvf_xfer_backend_t;

typedef enum {
    KVF_XFER_MEM_HOST = 0, /* pool in host memory */
    KVF_XFER_MEM_CUDA = 1, /* pool in GPU memory (needs a CUDA-aware backend) */
} kvf_xfer_mem_t;

/* Element types, numbered as kvf.KvDtype in proto/kvferry.proto. */
typedef enum {
    KVF_XFER_DTYPE_F32 = 0,
    KVF_XFER_DTYPE_F16 = 1,
    KVF_XFER_DTYPE_BF16 = 2,
    KVF_XFER_DTYPE_FP8 = 3,
    KVF_XFER_DTYPE_INT8 = 4,
} kvf_xfer_dtype_t;

/* The KV pool's shape; both ends must agree on every field. */
typedef struct {
    uint32_t block_size; /* tokens per block */
    uint32_t n_layers;
    uint32_t n_kv_heads;
    uint32_t head_dim;
    uint32_t dtype;  /* kvf_xfer_dtype_t */
    uint32_t layout; /* 1 = [block][layer][K,V][kv_head][slot][head_dim], then for
                        fp8/int8 the K and V scales (kvf/kv_format.h) */
} kvf_xfer_geometry_t;

typedef struct {
    kvf_xfer_backend_t backend;
    kvf_xfer_mem_t mem_type;
    /* The pool: pool_bytes at pool (borrowed: must outlive the handle).
     * pool == NULL lets the backend allocate it (UCX then allocates memory
     * the peer can map directly, the fastest path over shared memory); see
     * kvf_xfer_pool(). pool_bytes must be a whole number of blocks. */
    void *pool;
    uint64_t pool_bytes;
    kvf_xfer_geometry_t geometry;
    uint32_t timeout_ms; /* a batch fails after this long without progress on its
                          * connection (kvf_xfer__batch_deadline); 0 = 5000 */
    uint32_t grace_ms;   /* receiver: fence margin after a lease ends; 0 = 1000 */
    bool checksum;       /* send (sender) / require (receiver) a CRC32C per range;
                          * host pools only */
    /* UCX: two-sided transfer. Slices travel as active messages and the
     * receiver copies them into its pool after checking each against a live
     * reservation, so data of a cancelled or unknown request never lands
     * and kvf_xfer_cancel releases at once. A receiver that sets it exports
     * no rkey (its senders must follow); a sender that sets it uses it for
     * every peer. Whether a receiver needs it to survive a dying sender:
     * kvf_xfer_caps(). */
    bool two_sided;
} kvf_xfer_config_t;

/* What a backend, as configured for this process, guarantees: the facts a
 * node's choices depend on, answered by the transport (kvf_xfer_caps). */
typedef struct {
    /* Data can be written one-sided (RMA into the receiver's pool), so
     * cfg.two_sided is a real choice. false: the backend always has the
     * receiver place the data itself (NCCL). */
    bool one_sided;
    /* A one-sided receiver survives a sender that dies in the middle of a
     * put. false: a receiver that must outlive its senders sets
     * cfg.two_sided (UCX 1.13 when TCP may carry the puts: it emulates them
     * there with messages whose receiver aborts the process if the sender
     * vanishes mid-put). true where one_sided is false. */
    bool one_sided_survives_sender_death;
    /* kvf_xfer_fd() polls readable for everything that needs progress:
     * incoming data and completions, connection set-up. false (also when
     * there is no fd): a loop expecting transfer traffic must call
     * kvf_xfer_progress every poll_ms while it does (UCX 1.13's
     * shared-memory transports do not wake the worker's fd for incoming
     * data or connection set-up). */
    bool fd_wakes_on_data;
    uint32_t poll_ms; /* when !fd_wakes_on_data: the progress period; else 0 */
} kvf_xfer_caps_t;

/* One put: len bytes from local pool offset local_off to remote pool
 * offset remote_off. */
typedef struct {
    uint64_t local_off;
    uint64_t remote_off;
    uint64_t len;
} kvf_xfer_slice_t;

/* A byte range of the local pool (a reservation's blocks). */
typedef struct {
    uint64_t off;
    uint64_t len;
} kvf_xfer_range_t;

/* kvf_xfer_batch_spec_t.flags */
#define KVF_XFER_LAST  0x1u /* the request's final batch: no more after it */
#define KVF_XFER_ABORT 0x2u /* the sender gives the request up (no slices) */

typedef struct {
    uint64_t req_id;
    uint64_t epoch;
    const kvf_xfer_slice_t *slices; /* borrowed for the call only */
    size_t n_slices;                /* 0 allowed (e.g. with KVF_XFER_ABORT) */
    uint32_t flags;
    uint64_t not_after_ns; /* the lease end on kvf_clock_ns(); 0 = no lease */
} kvf_xfer_batch_spec_t;

typedef enum {
    KVF_XFER_EV_LANDED = 1,   /* a batch landed in a live reservation (verified) */
    KVF_XFER_EV_ABORTED = 2,  /* the sender aborted a live reservation's request */
    KVF_XFER_EV_EXPIRED = 3,  /* a lease ended before its last batch landed */
    KVF_XFER_EV_REJECTED = 4, /* a completion failed the checks (status says why) */
    KVF_XFER_EV_RELEASED = 5, /* a cancelled reservation's blocks are reusable */
} kvf_xfer_event_kind_t;

typedef struct {
    kvf_xfer_event_kind_t kind;
    uint64_t req_id;
    uint64_t epoch;
    uint64_t bytes;      /* LANDED: bytes of the batch */
    bool last;           /* LANDED: it carried KVF_XFER_LAST */
    kvf_status_t status; /* REJECTED: STALE, INVAL (ranges), MISMATCH (crc), FORMAT */
} kvf_xfer_event_t;

typedef struct {
    uint64_t batches_posted, batches_ok, batches_failed;
    uint64_t bytes_posted; /* after validation, before coalescing */
    uint64_t bytes_read;   /* kvf_xfer_get: bytes of its batches that ended OK */
    uint64_t puts_issued;  /* after coalescing */
    uint64_t completions_landed, completions_rejected, crc_failures;
    uint64_t slices_dropped;    /* two-sided: slices no live reservation owned */
    uint64_t reservations_live; /* reserved, not yet released */
    uint64_t relistens;         /* kvf_xfer_relisten calls that gave a new endpoint */
    uint64_t listeners_retired; /* old endpoints still delivering (kvf_xfer_relisten) */
} kvf_xfer_stats_t;

/* ---- handle -------------------------------------------------------------- */

/* The capabilities of cfg's backend in this process (its environment, e.g.
 * UCX_TLS, included), before or after a handle is created; only
 * cfg->backend and cfg->mem_type are read. UNSUPPORTED if the backend is
 * not in this build. */
kvf_status_t kvf_xfer_caps(const kvf_xfer_config_t *cfg, kvf_xfer_caps_t *caps_p);

/* Opens a backend over the pool described by cfg (copied). Errors:
 * INVAL (bad config), UNSUPPORTED (backend or memory type not in this
 * build), TRANSPORT (the backend failed). *xfer_p is owned by the caller
 * and released with kvf_xfer_destroy(). */
kvf_status_t kvf_xfer_create(const kvf_xfer_config_t *cfg, kvf_xfer_t **xfer_p);

/* Disconnects every peer (outstanding batches fail with CLOSED), frees
 * the handle and, if the backend allocated the pool, the pool. NULL ok. */
void kvf_xfer_destroy(kvf_xfer_t *xfer);

/* The pool's base address (the caller's, or the one the backend
 * allocated); owned by the handle. */
void *kvf_xfer_pool(const kvf_xfer_t *xfer);

/* Writes this pool's descriptor into a malloc'd buffer owned by the
 * caller (*desc_p, *len_p set only on success). Opaque, versioned bytes:
 * they go into the node's Register message. */
kvf_status_t kvf_xfer_export(kvf_xfer_t *xfer, uint8_t **desc_p, size_t *len_p);

/* Gives the receiving side a new listening endpoint and with it a new
 * descriptor (kvf_xfer_export then returns it; the pool and what it
 * holds are unchanged). The old endpoint keeps delivering completions
 * for a lease period, then goes. For a receiver that lost a sender
 * mid-message: over UCX's shared-memory transports every sender's
 * messages share one queue, which a sender killed between claiming a
 * slot and filling it blocks for all (docs/transfer-recovery.md). Peers
 * that connect with the new descriptor get a queue of their own.
 * UNSUPPORTED for a backend without it; AGAIN while this handle has
 * connections of its own (a sender's). */
kvf_status_t kvf_xfer_relisten(kvf_xfer_t *xfer);

/* Checks a peer's descriptor without connecting: FORMAT (length, magic,
 * checksum, body), VERSION, MISMATCH (geometry, backend), INVAL (pool
 * size). Logs the first problem found. desc is untrusted input. */
kvf_status_t kvf_xfer_check_desc(const kvf_xfer_t *xfer, const uint8_t *desc, size_t len);

/* The same checks without a transport of one's own (the router, at a
 * node's registration): against geometry geo, any backend; why (always
 * written on failure) says what is wrong. */
kvf_status_t kvf_xfer_check_desc_for(const kvf_xfer_geometry_t *geo, const uint8_t *desc,
                                     size_t len, char *why, size_t why_len);

/* Validates desc (as kvf_xfer_check_desc) and connects to that pool.
 * desc is borrowed for the call. *peer_p belongs to xfer and is released
 * with kvf_xfer_disconnect() (or by kvf_xfer_destroy()). */
kvf_status_t kvf_xfer_connect(kvf_xfer_t *xfer, const uint8_t *desc, size_t len,
                              kvf_xfer_peer_t **peer_p);

/* Two-sided backends (NCCL) need the receiver's half too: after
 * kvf_xfer_connect the sender takes a token (opaque, versioned bytes in a
 * malloc'd buffer owned by the caller, e.g. carried in KvAlloc) and the
 * receiver passes it to kvf_xfer_accept; batches can be posted once both
 * halves met (kvf_xfer_post returns AGAIN until then). The token is
 * validated like a descriptor. UCX needs neither: UNSUPPORTED. *peer_p
 * belongs to xfer, as with kvf_xfer_connect. */
kvf_status_t kvf_xfer_peer_token(kvf_xfer_peer_t *peer, uint8_t **token_p, size_t *len_p);
kvf_status_t kvf_xfer_accept(kvf_xfer_t *xfer, const uint8_t *token, size_t len,
                             kvf_xfer_peer_t **peer_p);

/* Closes the connection (by force: outstanding batches fail with CLOSED
 * but stay valid until released). NULL ok. */
void kvf_xfer_disconnect(kvf_xfer_peer_t *peer);

/* The peer's state: OK, or the error that failed it (PEER, TIMEOUT,
 * CLOSED). A failed peer accepts no new batch; reconnect from the
 * descriptor. */
kvf_status_t kvf_xfer_peer_status(const kvf_xfer_peer_t *peer);

/* Whether a batch posted to peer now starts at once: its connection is set
 * up (which may take the receiver's answers). A connection not set up
 * within the handle's timeout_ms fails (TIMEOUT). */
bool kvf_xfer_peer_ready(const kvf_xfer_peer_t *peer);

/* Whether some connection is still being set up: a loop whose transport's
 * fd does not wake for everything (kvf_xfer_caps_t) progresses every
 * poll_ms meanwhile. */
bool kvf_xfer_connecting(const kvf_xfer_t *xfer);

/* ---- sender -------------------------------------------------------------- */

/* Posts the puts of spec to the peer; slices are validated against both
 * pools (INVAL, nothing sent), adjacent ones coalesced, then put, flushed
 * and followed by the completion message. Errors: PEER/CLOSED (the peer
 * failed), TIMEOUT (now is past spec->not_after_ns: the lease ended),
 * AGAIN (a two-sided connection is not ready yet, or its queue is full:
 * progress and retry), INVAL (also: an accepted peer only receives).
 * *batch_p is owned by the caller: kvf_xfer_batch_release() it once done
 * with it (a batch released early is still driven to its end). */
kvf_status_t kvf_xfer_post(kvf_xfer_peer_t *peer, const kvf_xfer_batch_spec_t *spec,
                           kvf_xfer_batch_t **batch_p);

/* Reads (one-sided RMA get) the peer's pool into the local pool: each
 * slice's len bytes at remote_off land at local_off. Nothing runs on the
 * peer's CPU and nothing is written there, so it needs no reservation;
 * the caller knows from its own protocol that the remote bytes hold still
 * until spec->not_after_ns (a decode node's cached blocks, which it keeps
 * while the caller's lease on them lasts). The batch ends OK only when
 * every byte is in the local pool before not_after_ns (a read that ends
 * later may have seen blocks reused: TIMEOUT), and it ends (kvf_xfer_test
 * stops saying AGAIN) only once no read of it can still write the local
 * pool, a failed one too, so the local ranges are the caller's again as
 * soon as it ended. spec->flags must be 0. Errors as kvf_xfer_post, and
 * UNSUPPORTED where nothing can be read one-sided (a two-sided
 * connection, NCCL). A two-sided receiver stays unreadable on purpose:
 * UCX 1.13 serves a read over TCP with messages, and the serving process
 * aborts (ucp_get_req_handler: "Endpoint timeout") when the reader dies
 * mid-read, as it does under emulated puts; a one-sided receiver is one
 * only where TCP cannot carry the data (kvf_xfer_caps). */
kvf_status_t kvf_xfer_get(kvf_xfer_peer_t *peer, const kvf_xfer_batch_spec_t *spec,
                          kvf_xfer_batch_t **batch_p);

/* OK when the batch completed (one-sided: puts flushed into the peer's
 * memory and completion message sent; two-sided and NCCL: every slice and
 * the completion handed to the transport, the receiver's LANDED event
 * being the landing), AGAIN while in progress, or the error that ended it (TIMEOUT,
 * PEER, CLOSED, TRANSPORT). Does not progress: see kvf_xfer_progress. */
kvf_status_t kvf_xfer_test(const kvf_xfer_batch_t *batch);

/* Progresses the handle until the batch ends or timeout_ms passes
 * (-1: until the batch's own deadline, which always comes). Returns as
 * kvf_xfer_test, or TIMEOUT when timeout_ms passed first (the batch goes
 * on). */
kvf_status_t kvf_xfer_wait(kvf_xfer_batch_t *batch, int timeout_ms);

/* Releases the caller's hold on the batch. NULL ok. */
void kvf_xfer_batch_release(kvf_xfer_batch_t *batch);

/* ---- receiver ------------------------------------------------------------ */

/* Declares that (req_id, epoch) may write the given ranges of this pool
 * until lease_ms from now (0: no lease; then only a LAST/ABORT completion
 * fences a cancel). ranges is copied. Errors: INVAL (a range outside the
 * pool, or req_id already reserved), NOMEM. */
kvf_status_t kvf_xfer_reserve(kvf_xfer_t *xfer, uint64_t req_id, uint64_t epoch,
                              const kvf_xfer_range_t *ranges, size_t n_ranges, uint32_t lease_ms);

/* Ends a reservation (sequence finished, cancelled, failed): from now on
 * nothing from (req_id, epoch) is accepted, and a RELEASED event says
 * when its blocks may be reused (at once if it had fully landed or was
 * aborted). NOT_FOUND if there is no such reservation. */
kvf_status_t kvf_xfer_cancel(kvf_xfer_t *xfer, uint64_t req_id, uint64_t epoch);

/* Renews a live reservation's lease: it now ends one lease (the lease_ms
 * it was reserved with) from now, unless it already ends later. The
 * receiver renews while the sender shows progress: a batch that lands
 * renews by itself, and the decode node renews on its prefill node's
 * KvLease (docs/PROTOCOL.md, Liveness). The sender learns of a renewal
 * only from the receiver's answer, and moves its not_after_ns no further
 * than the time it asked plus one lease, so it still stops writing before
 * the receiver's lease ends. NOT_FOUND when (req_id, epoch) has no live
 * reservation (landed, expired, cancelled or unknown). */
kvf_status_t kvf_xfer_renew(kvf_xfer_t *xfer, uint64_t req_id, uint64_t epoch);

/* Takes the oldest pending event into *ev_p; AGAIN when there is none. */
kvf_status_t kvf_xfer_poll(kvf_xfer_t *xfer, kvf_xfer_event_t *ev_p);

/* ---- event loop ---------------------------------------------------------- */

/* Drives the backend (sends, completions, incoming messages) and the
 * deadlines (batch timeouts, leases). Never blocks. Returns how many
 * things happened (0: idle). */
unsigned kvf_xfer_progress(kvf_xfer_t *xfer);

/* kvf_xfer_progress again and again while it finds work, for at most
 * budget_ms: some backends move a bounded amount per call (UCX copies a
 * shared-memory put in the calls that follow it), so a loop that only
 * looks now and then (between the layers of a forward) makes them keep
 * up. Returns how many things happened. */
unsigned kvf_xfer_progress_for(kvf_xfer_t *xfer, unsigned budget_ms);

/* Sender: the receiver renewed the lease of (req_id, epoch) until
 * not_after_ns on this clock (kvf_xfer_renew's answer): the request's
 * batches still running may write until then too. Never moves one
 * earlier. */
void kvf_xfer_extend(kvf_xfer_t *xfer, uint64_t req_id, uint64_t epoch, uint64_t not_after_ns);

/* A file descriptor that polls readable when the handle has work; -1 if
 * the backend has none (then call kvf_xfer_progress on a timer). Owned
 * by the handle. */
int kvf_xfer_fd(const kvf_xfer_t *xfer);

/* Arms the fd before the loop sleeps on it. AGAIN: events are pending,
 * call kvf_xfer_progress instead of sleeping. */
kvf_status_t kvf_xfer_arm(kvf_xfer_t *xfer);

/* Milliseconds until the next internal deadline (batch timeout, lease or
 * fence), -1 if none: the longest the loop may sleep on the fd. */
int kvf_xfer_timeout_ms(const kvf_xfer_t *xfer);

void kvf_xfer_stats(const kvf_xfer_t *xfer, kvf_xfer_stats_t *stats_p);

/* Bytes of one block of geometry g, fp8/int8 scales included: the pool's
 * kvf_kv_block_bytes (0 if g is invalid). */
uint64_t kvf_xfer_block_bytes(const kvf_xfer_geometry_t *g);

/* The transfer geometry of a KV pool (kvf/kvcache.h: its format, layout 1). */
kvf_xfer_geometry_t kvf_xfer_geometry_of_pool(const kvf_kv_geometry_t *geo);

#endif
