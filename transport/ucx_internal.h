/* Private to the UCX backend (ucx.c: the handle, capabilities, incoming
 * messages, the event loop; ucx_peer.c: endpoints and their shutdown;
 * ucx_batch.c: puts, two-sided slices and completion messages): its state
 * and what its files call in each other. */
#ifndef KVF_UCX_INTERNAL_H
#define KVF_UCX_INTERNAL_H

#include "xfer_internal.h"

#include <ucp/api/ucp.h>

#define KVF_UCX_AM_FIN   17u /* active message id of the completion message */
#define KVF_UCX_AM_DATA  18u /* two-sided mode: one slice */
#define KVF_UCX_DATA_HDR 32u /* u64 req_id, epoch, remote offset, length */

/* One handle's UCX state (kvf_xfer_t.be). */
/* The most listening workers kvf_xfer_relisten keeps retired at once. */
#define UCX_RETIRED_MAX 8

/* A listening worker kvf_xfer_relisten replaced: still progressed, so
 * completions its senders post keep arriving, until it has delivered
 * nothing for the handle's retire_ns. */
typedef struct {
    ucp_worker_h worker;
    ucp_address_t *address;
    int efd;
    uint64_t idle_since_ns;
} ucx_retired_t;

typedef struct {
    ucp_context_h context;
    ucp_worker_h worker;
    ucp_mem_h memh;
    ucp_address_t *address;
    size_t address_len;
    void *rkey_buf; /* the pool's packed rkey; none in two-sided mode */
    size_t rkey_len;
    int efd;
    /* What kvf_xfer_fd gives: an epoll set of every worker's event fd, so
     * a relisten changes no fd the caller waits on. */
    int epfd;
    ucx_retired_t retired[UCX_RETIRED_MAX];
    int n_retired;
    uint64_t retire_ns;
    ucs_memory_type_t mem_type;
    bool warned_no_peer_mode;
} ucx_xfer_t;

/* Shutting a connection down: first a flush, so that puts already posted
 * complete (over TCP, UCX 1.13 emulates puts with messages, and a receiver
 * still applying them when the sender's endpoint goes away can fail inside
 * UCX), bounded by the handle's grace period; then a forced close; the
 * rkey goes once nothing can use it. */
typedef enum {
    UCX_PEER_OPEN = 0,
    UCX_PEER_FLUSHING, /* flush_req in progress, until force_at_ns */
    UCX_PEER_CLOSING,  /* close_req in progress */
    UCX_PEER_CLOSED,   /* ep and rkey are gone */
} ucx_peer_phase_t;

/* One peer's UCX state (kvf_xfer_peer_t.be). */
typedef struct {
    ucp_ep_h ep;
    ucp_rkey_h rkey; /* the remote pool's; none in two-sided mode */
    ucx_peer_phase_t phase;
    bool close_wanted; /* shut down from the next progress on */
    void *flush_req, *close_req;
    uint64_t force_at_ns;
    /* A flush issued at connect: it completes once UCX has set the
     * endpoint up, which may need the receiver to answer. Until then the
     * connection is not ready (kvf_xfer_peer_ready), so a sender can keep
     * a forward from waiting on a set-up driven only between its layers. */
    void *probe_req;
    bool wired;
} ucx_peer_t;

/* ucx.c: the one place UCX status codes become kvferry's. */
kvf_status_t kvf_ucx__status(ucs_status_t s);

/* ucx_peer.c: the ops of kvf_xfer_ops_t for peers (see there). */
kvf_status_t kvf_ucx__connect(kvf_xfer_peer_t *peer, const uint8_t *body, size_t len);
void kvf_ucx__shutdown(kvf_xfer_peer_t *peer);
bool kvf_ucx__shutdown_done(kvf_xfer_peer_t *peer);
bool kvf_ucx__connected(const kvf_xfer_peer_t *peer);
void kvf_ucx__peer_free(kvf_xfer_peer_t *peer);

/* ucx_peer.c: moves every wanted shutdown on a step (outside callbacks);
 * returns how many moved. */
unsigned kvf_ucx__peers_progress(kvf_xfer_t *xfer);

/* ucx_peer.c: whether a shutdown is under way (they are polled, not
 * signalled through the fd). */
bool kvf_ucx__peers_closing(const kvf_xfer_t *xfer);

/* ucx_peer.c: before the worker goes: the peers still there lose their
 * rkeys and forget requests the worker's destruction ends. */
void kvf_ucx__peers_abandon(kvf_xfer_t *xfer);

/* ucx_batch.c: the ops of kvf_xfer_ops_t for batches (see there). */
kvf_status_t kvf_ucx__post(kvf_xfer_batch_t *batch);
kvf_status_t kvf_ucx__get(kvf_xfer_batch_t *batch);
void kvf_ucx__batch_free(kvf_xfer_batch_t *batch);

#endif
