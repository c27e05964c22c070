/* Private to transport/: the handle structures and the backend ops table
 * behind kvf/xfer.h, and what the backend-neutral files share. Those own
 * everything that is not moving bytes, one concept a file: xfer.c (the
 * handle, its teardown and event loop entry points), xfer_connect.c
 * (descriptors, tokens, peers), xfer_batch.c (the sender's batches and
 * their deadlines), xfer_fin.c (the completion message), xfer_resv.c
 * (reservations, fencing, leases, events). A backend (ucx.c, nccl.c)
 * moves bytes and messages. */
#ifndef KVF_XFER_INTERNAL_H
#define KVF_XFER_INTERNAL_H

#include "kvf/xfer.h"

/* Descriptor: fixed header, backend body, CRC32C of everything before it.
 * All integers little endian. */
#define KVF_XFER_DESC_MAGIC   0x5846564bu /* "KVFX" */
#define KVF_XFER_DESC_VERSION 1u
#define KVF_XFER_DESC_HEADER  64u
#define KVF_XFER_DESC_MAX     (64u << 10)

/* Completion message ("FIN"): header then n_ranges range records. */
#define KVF_XFER_FIN_MAGIC   0x4346564bu /* "KVFC" */
#define KVF_XFER_FIN_VERSION 1u
#define KVF_XFER_FIN_HEADER  40u
#define KVF_XFER_FIN_RANGE   24u /* u64 off, u64 len, u32 crc, u32 zero */
#define KVF_XFER_FIN_HAS_CRC 0x100u
/* Largest batch after coalescing; bounds the completion message. */
#define KVF_XFER_MAX_RANGES 65536u

#define KVF_XFER_DEFAULT_TIMEOUT_MS 5000u
#define KVF_XFER_DEFAULT_GRACE_MS   1000u
#define KVF_XFER_DEFAULT_LEASE_MS   60000u

/* Little-endian fields of descriptors, tokens and completion messages. */
static inline void xfer_put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void xfer_put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void xfer_put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint16_t xfer_get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static inline uint32_t xfer_get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static inline uint64_t xfer_get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

typedef struct kvf_xfer_ops kvf_xfer_ops_t;

/* A handle whose earliest deadline passed longer than this before it was
 * progressed was starved (its loop was computing): the time beyond it does
 * not count against its peers (xfer.c). A loop that sleeps until the
 * deadline never reaches it. */
#define KVF_XFER_STARVED_NS (100ull * 1000000ull)

typedef enum {
    KVF_RESV_LIVE = 0, /* accepting completions */
    KVF_RESV_DONE,     /* last batch landed or sender aborted: no write can come */
    KVF_RESV_EXPIRED,  /* lease ended first; waits for kvf_xfer_cancel */
    KVF_RESV_FENCED,   /* cancelled; waits for a fence point */
} kvf_resv_state_t;

typedef struct {
    uint64_t req_id, epoch;
    kvf_xfer_range_t *ranges; /* owned */
    size_t n_ranges;
    uint64_t total_bytes, landed_bytes;
    uint64_t lease_end_ns;
    uint64_t lease_ns; /* how long one lease (or renewal) lasts */
    kvf_resv_state_t state;
} kvf_resv_t;

struct kvf_xfer_batch {
    kvf_xfer_peer_t *peer;
    kvf_xfer_batch_t *next, *prev; /* in peer->batches */
    uint64_t req_id, epoch;
    uint64_t timeout_ns;      /* posted + cfg.timeout_ms, moved by starvation */
    uint64_t not_after_ns;    /* its lease end; 0: none; moves only with kvf_xfer_extend */
    kvf_status_t status;      /* AGAIN while running */
    bool released;            /* the caller let go */
    unsigned backend_busy;    /* backend requests that still point at this batch */
    kvf_xfer_slice_t *ranges; /* coalesced puts (or reads), owned */
    size_t n_ranges;
    uint64_t bytes; /* of every range */
    uint8_t *fin; /* the completion message, owned (puts only) */
    size_t fin_len;
    bool is_get; /* reads (kvf_xfer_get): ranges are remote -> local */
    void *be;    /* backend state */
};

struct kvf_xfer_peer {
    kvf_xfer_t *xfer;
    kvf_xfer_peer_t *next, *prev; /* in xfer->peers */
    kvf_xfer_batch_t *batches;    /* not yet freed */
    uint64_t remote_base;         /* the remote pool's address */
    uint64_t remote_bytes;
    bool checksum;     /* this connection sends CRCs */
    bool accepted;     /* made by kvf_xfer_accept (the receiving half) */
    bool two_sided;    /* slices go as messages (either side asked for it) */
    bool disconnected; /* the caller let go */
    bool close_now;    /* a batch passed its lease end: no flush, close by force */
    kvf_status_t status;
    /* The last time the backend completed something on this connection (a
     * put, a flush, a message): a batch fails only after cfg.timeout_ms
     * without any (kvf_xfer__batch_deadline). */
    uint64_t progress_ns;
    void *be;
};

struct kvf_xfer {
    const kvf_xfer_ops_t *ops;
    kvf_xfer_config_t cfg;
    kvf_xfer_caps_t caps;
    uint8_t *pool; /* cfg.pool, or the backend's */
    kvf_xfer_peer_t *peers;
    /* receiver */
    kvf_resv_t *resv;
    size_t n_resv, cap_resv;
    kvf_xfer_event_t *events; /* ring */
    size_t ev_head, ev_count, ev_cap;
    uint64_t next_timer_ns; /* earliest lease/fence/batch deadline; 0 = recompute */
    kvf_xfer_stats_t stats;
    bool warned_rndv;
    void *be;
};

/* A backend. Every slot is required unless marked optional. */
struct kvf_xfer_ops {
    const char *name;
    /* What the backend guarantees for cfg in this process (kvf_xfer_caps);
     * needs no handle. */
    void (*caps)(const kvf_xfer_config_t *cfg, kvf_xfer_caps_t *caps_p);
    /* Sets up xfer->be; allocates the pool into xfer->pool when it is NULL. */
    kvf_status_t (*open)(kvf_xfer_t *xfer);
    /* Frees xfer->be. Peers whose shutdown did not complete may remain:
     * close ends their requests (callbacks may run); xfer.c frees them
     * after it with peer_free. */
    void (*close)(kvf_xfer_t *xfer);
    /* The descriptor body into a malloc'd buffer owned by the caller. */
    kvf_status_t (*export_body)(kvf_xfer_t *xfer, uint8_t **body_p, size_t *len_p);
    /* Connects peer (remote_base, remote_bytes set) from a body already
     * bounds-checked by xfer_connect.c (its internal lengths still untrusted). */
    kvf_status_t (*connect)(kvf_xfer_peer_t *peer, const uint8_t *body, size_t len);
    /* Tears the connection down by force; outstanding requests end with
     * errors during later progress (each drops backend_busy). May be
     * called more than once. */
    void (*shutdown)(kvf_xfer_peer_t *peer);
    /* True when peer->be can be freed (shutdown completed). */
    bool (*shutdown_done)(kvf_xfer_peer_t *peer);
    /* Frees peer->be's memory only (it may run after close). */
    void (*peer_free)(kvf_xfer_peer_t *peer);
    /* (optional) Whether the peer can take a batch now (a two-sided
     * connection may still be forming); false makes kvf_xfer_post return
     * AGAIN. */
    bool (*ready)(kvf_xfer_peer_t *peer);
    /* (optional) Whether the connection is set up (kvf_xfer_peer_ready);
     * batches may be posted before, the backend queues them. */
    bool (*connected)(const kvf_xfer_peer_t *peer);
    /* (optional) Two-sided backends: the body of the token the receiver
     * accepts (malloc'd, owned by the caller), and the receiver's half of
     * connecting from a token's body (bounds-checked by xfer_connect.c). */
    kvf_status_t (*token_body)(kvf_xfer_peer_t *peer, uint8_t **body_p, size_t *len_p);
    kvf_status_t (*accept)(kvf_xfer_peer_t *peer, const uint8_t *body, size_t len);
    /* Starts the batch (ranges and fin ready); ends it through
     * kvf_xfer__batch_end. */
    kvf_status_t (*post)(kvf_xfer_batch_t *batch);
    /* (optional) Starts the batch's reads (one-sided gets of its ranges
     * into the local pool); ends it through kvf_xfer__batch_end, and keeps
     * backend_busy above 0 while any read may still write the local pool. */
    kvf_status_t (*get)(kvf_xfer_batch_t *batch);
    void (*batch_free)(kvf_xfer_batch_t *batch); /* (optional) */
    unsigned (*progress)(kvf_xfer_t *xfer);
    int (*fd)(const kvf_xfer_t *xfer); /* (optional): -1 */
    /* (optional) A new listening endpoint (kvf_xfer_relisten): the
     * descriptor body export_body gives changes; completions sent to the
     * old endpoint keep arriving for retire_ns. */
    kvf_status_t (*relisten)(kvf_xfer_t *xfer, uint64_t retire_ns);
    kvf_status_t (*arm)(kvf_xfer_t *xfer); /* (optional): OK */
};

extern const kvf_xfer_ops_t kvf_xfer_ucx_ops;
#ifdef KVF_HAVE_NCCL
extern const kvf_xfer_ops_t kvf_xfer_nccl_ops;
#endif

/* Backends call these. */

/* Ends a running batch with status (OK or an error); no-op if ended. */
void kvf_xfer__batch_end(kvf_xfer_batch_t *batch, kvf_status_t status);

/* Fails the peer (dead, timed out): every running batch ends with status
 * and the backend shuts the connection down. */
void kvf_xfer__peer_fail(kvf_xfer_peer_t *peer, kvf_status_t status);
/* The backend completed something on peer's connection. */
void kvf_xfer__peer_progressed(kvf_xfer_peer_t *peer);
/* When batch b fails: cfg.timeout_ms after it was posted or after its
 * connection last made progress, whichever is later, and never after the
 * lease end it was posted under. */
uint64_t kvf_xfer__batch_deadline(const kvf_xfer_batch_t *b);

/* Frees batches (and peers) nobody needs any more. */
void kvf_xfer__reap(kvf_xfer_t *xfer);

/* Whether (req_id, epoch) has a live reservation covering [off, off+len):
 * the check before a two-sided backend writes anything into the pool. */
bool kvf_xfer__resv_accepts(kvf_xfer_t *xfer, uint64_t req_id, uint64_t epoch, uint64_t off,
                            uint64_t len);

/* Handles a completion message of len untrusted bytes. */
void kvf_xfer__on_fin(kvf_xfer_t *xfer, const void *msg, size_t len);

/* Between the backend-neutral files. */

/* Brings the handle's next deadline (lease, fence, batch) forward to t. */
static inline void kvf_xfer__timer_at(kvf_xfer_t *xfer, uint64_t t)
{
    if (t < xfer->next_timer_ns)
        xfer->next_timer_ns = t;
}

/* xfer_batch.c: fails the peers of batches past their deadline; returns
 * the earliest deadline of a running batch, UINT64_MAX if none. */
uint64_t kvf_xfer__batch_deadlines(kvf_xfer_t *xfer, uint64_t now);

/* xfer_fin.c: builds batch's completion message into batch->fin (owned by
 * the batch): every remote range of batch->ranges and, when the connection
 * has checksums, their CRC32Cs. */
kvf_status_t kvf_xfer__fin_build(kvf_xfer_batch_t *batch, uint32_t flags, uint64_t bytes);

/* xfer_resv.c: queues an event for kvf_xfer_poll (lost, and logged, only
 * when out of memory). */
void kvf_xfer__event_push(kvf_xfer_t *xfer, kvf_xfer_event_kind_t kind, uint64_t req_id,
                          uint64_t epoch, uint64_t bytes, bool last, kvf_status_t status);

/* xfer_resv.c: the reservation of req_id (any state), NULL if none. */
kvf_resv_t *kvf_xfer__resv_find(kvf_xfer_t *xfer, uint64_t req_id);

/* xfer_resv.c: reports r RELEASED and frees it; the last reservation moves
 * into r's slot. */
void kvf_xfer__resv_remove(kvf_xfer_t *xfer, kvf_resv_t *r);
/* Moves a live reservation's lease end to until_ns when that is later. */
void kvf_xfer__resv_extend(kvf_resv_t *r, uint64_t until_ns);

/* xfer_resv.c: whether [off, off+len) lies inside one of r's ranges. */
bool kvf_xfer__resv_covers(const kvf_resv_t *r, uint64_t off, uint64_t len);

/* xfer_resv.c: expires leases and releases the fenced reservations whose
 * grace ended; returns the earliest lease or fence deadline ahead,
 * UINT64_MAX if none. */
uint64_t kvf_xfer__resv_deadlines(kvf_xfer_t *xfer, uint64_t now);

#endif
