/* The runtime a prefill or decode node shares: its inbox, outboxes to the
 * router and peers (one per URL, cached), registration with the router and
 * heartbeats. The node's own event loop owns the kvf_node_t and calls it.
 *
 * Registration: kvf_node_tick() sends Register every second until the
 * router answers with RegisterReply. A refusal (model or geometry mismatch)
 * is final: kvf_node_tick() then returns the refusal's status and the node
 * should exit. A router that restarts answers a heartbeat from a node it
 * does not know with Error{NOT_FOUND}; kvf_node_handle() turns that into a
 * new Register, so nodes come back by themselves.
 *
 * Heartbeats come from a thread of their own, so that no compute, however
 * long, starves them (docs/PROTOCOL.md, Liveness). The loop publishes what
 * they carry: kvf_node_tick() calls fill_load and fill_work when a
 * snapshot is due (every quarter heartbeat period; call it every loop turn
 * and between layers of long computes), and every heartbeat_ms the thread
 * sends the latest snapshot: Heartbeat (load, state, the attempts named by
 * fill_work) to the router and one KvLease per peer URL named there. The
 * thread names attempts and leases only while the loop is alive: when its
 * last snapshot is older than max(loop_stuck_ms, 8 x the longest gap
 * between snapshots seen so far), the heartbeats go on with the load
 * alone, and what the node holds times out where it is held. */
#ifndef KVF_NODE_H
#define KVF_NODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvf/kvcache.h"
#include "kvf/msg.h"
#include "kvf/status.h"

typedef struct kvf_node kvf_node_t;

/* What a node's loop publishes for its heartbeats (see above). */
typedef struct kvf_node_snapshot kvf_node_snapshot_t;

/* A loop whose last snapshot is older than this (and than 8 x its longest
 * gap between snapshots) is stuck: heartbeats stop naming its work. */
#define KVF_NODE_LOOP_STUCK_MS 60000u

/* The longest reservation lease a node asks for or accepts (1 hour). */
#define KVF_NODE_LEASE_MS_MAX 3600000u

typedef struct {
    Kvf__Role role;                /* KVF__ROLE__ROLE_PREFILL or _DECODE */
    const char *node_id;           /* copied; NULL: "<role>-<pid>-<random>" */
    const char *router_url;        /* the router's inbox (copied) */
    const char *listen_url;        /* this node's inbox (copied) */
    const char *model_fingerprint; /* copied */
    Kvf__KvGeometry geometry;      /* copied (plain values) */
    uint32_t capacity_blocks;
    const uint8_t *xfer_desc;      /* transfer descriptor, copied; may be NULL */
    size_t xfer_desc_len;
    uint32_t max_running;
    uint32_t max_context;
    bool prefill_local;
    bool prefix_pull;              /* a prefill node that pulls (docs/prefix-cache.md) */
    unsigned heartbeat_ms;         /* 0: 500 */
    unsigned loop_stuck_ms;        /* 0: KVF_NODE_LOOP_STUCK_MS */
    /* Fills the load reported with each heartbeat; called from tick. */
    void (*fill_load)(void *arg, Kvf__Load *load);
    /* Names the attempts the node works on and the leases it holds
     * (kvf_node_snapshot_work, _lease); called from tick; may be NULL. */
    void (*fill_work)(void *arg, kvf_node_snapshot_t *snap);
    void *load_arg; /* both callbacks' argument */
} kvf_node_config_t;

/* The KV geometry a node announces in Register (f32, layout 1). */
Kvf__KvGeometry kvf_node_wire_geometry(const kvf_kv_geometry_t *geo);

/* Names attempt (req_id, epoch) in the next heartbeats, done prompt
 * tokens computed so far. NOMEM: left out of this snapshot. */
kvf_status_t kvf_node_snapshot_work(kvf_node_snapshot_t *snap, uint64_t req_id, uint64_t epoch,
                                    uint32_t done);

/* Asks the decode node at url, with every heartbeat, to renew the lease of
 * reservation (req_id, epoch) (a KvLease; the answer, KvLeaseReply, comes
 * to the node's inbox). url is copied. */
kvf_status_t kvf_node_snapshot_lease(kvf_node_snapshot_t *snap, const char *url, uint64_t req_id,
                                     uint64_t epoch);

/* Binds the inbox, connects to the router and starts the heartbeat
 * thread. On success *node_p is owned
 * by the caller: kvf_node_destroy(). */
kvf_status_t kvf_node_create(const kvf_node_config_t *cfg, kvf_node_t **node_p);

/* Stops the heartbeat thread, closes every socket and frees the node.
 * NULL is a no-op. */
void kvf_node_destroy(kvf_node_t *node);

const char *kvf_node_id(const kvf_node_t *node);

/* The cluster's prefix-block hash key, from the router's RegisterReply:
 * key_p[0..1]; returns its generation (0: none received yet, and key_p is
 * untouched), which grows when a restarted router hands out another. */
uint32_t kvf_node_prefix_key(const kvf_node_t *node, uint64_t key_p[2]);
kvf_inbox_t *kvf_node_inbox(kvf_node_t *node);
bool kvf_node_registered(const kvf_node_t *node);

/* Sends Register, or publishes the heartbeats' snapshot, when one is due.
 * Cheap when nothing is due: call it every loop iteration and between
 * layers of long computes. Returns KVF_OK, or the router's final refusal. */
kvf_status_t kvf_node_tick(kvf_node_t *node);

/* Publishes a snapshot now (e.g. after the loop gave its work up, so the
 * heartbeats stop naming it at once). */
void kvf_node_publish(kvf_node_t *node);

/* Milliseconds until kvf_node_tick() has something to do. */
int kvf_node_timeout_ms(const kvf_node_t *node);

/* Offers a received envelope to the runtime. Returns true when it was the
 * runtime's (RegisterReply, or the router's "unknown node" error) and has
 * been handled, or when it was refused and must be dropped: a
 * PrefillRequest, Cancel, PrefixResync or Error without this
 * registration's token (only the router has it), or a KvAlloc without
 * the credential the router gave that attempt's prefill node
 * (docs/PROTOCOL.md, "Identity"). The caller still frees env. */
bool kvf_node_handle(kvf_node_t *node, const kvf_envelope_t *env);

/* The refusals of kvf_node_handle by reason, "token=N alloc_token=N"
 * (the stats lines); buf is always terminated. */
void kvf_node_refusals_format(const kvf_node_t *node, char *buf, size_t len);
/* Their total. */
uint64_t kvf_node_refused(const kvf_node_t *node);
/* The control plane's refusals for a stats line: the sockets'
 * (kvf_auth_counters_format) then "| messages refused: " and this
 * runtime's (kvf_node_refusals_format). */
void kvf_node_control_format(const kvf_node_t *node, char *buf, size_t len);

/* Sends env to the inbox at url through a cached outbox, waiting up to
 * timeout_ms for the socket to take it. The envelope's sender is set to
 * the node id. */
kvf_status_t kvf_node_send(kvf_node_t *node, const char *url, kvf_envelope_t *env,
                           int timeout_ms);

/* Same, to the router; the envelope carries this registration's token. */
kvf_status_t kvf_node_send_router(kvf_node_t *node, kvf_envelope_t *env, int timeout_ms);

/* Marks the node draining (reported in heartbeats: the router sends it no
 * new work). */
void kvf_node_set_draining(kvf_node_t *node, bool draining);

/* Replaces the transfer descriptor (copied) the node registers with; from
 * now on every heartbeat carries it too, so the router hands the new one
 * out (a decode node that listens anew: docs/transfer-recovery.md). */
kvf_status_t kvf_node_set_xfer_desc(kvf_node_t *node, const uint8_t *desc, size_t len);

/* Tells the router this node leaves; no heartbeat follows it. */
kvf_status_t kvf_node_deregister(kvf_node_t *node, const char *reason);

/* Drops the cached outbox to url (e.g. a peer that died). */
void kvf_node_forget_peer(kvf_node_t *node, const char *url);

#endif
