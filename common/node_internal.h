/* What common/node.c (registration, sockets) and common/node_beat.c (the
 * heartbeat thread and the snapshots it sends) share. */
#ifndef KVF_NODE_INTERNAL_H
#define KVF_NODE_INTERNAL_H

#include "kvf/identity.h"
#include "kvf/node.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct {
    uint32_t url; /* index into the snapshot's urls */
    uint64_t req_id, epoch;
} node_lease_t;

struct kvf_node_snapshot {
    Kvf__Load load;
    uint64_t taken_ns; /* when the loop published it */
    Kvf__WorkRef *work;
    size_t n_work, cap_work;
    node_lease_t *leases;
    size_t n_leases, cap_leases;
    char **urls; /* owned */
    size_t n_urls, cap_urls;
};

/* The heartbeat thread's side (node_beat.c). Everything in it but the
 * thread's own sockets is under lock. */
typedef struct {
    pthread_t thread;
    bool started;
    pthread_mutex_t send_lock; /* held by the thread while a beat goes out */
    pthread_mutex_t lock;
    pthread_cond_t wake;
    bool stop, beat_now;
    bool registered;            /* heartbeats go out only while registered */
    bool draining;
    unsigned period_ms;         /* heartbeat period (the router's) */
    kvf_node_snapshot_t snaps[3];
    kvf_node_snapshot_t *building;  /* the loop's (no lock needed) */
    kvf_node_snapshot_t *published; /* the newest, taken by the thread */
    kvf_node_snapshot_t *sending;   /* the thread's (no lock needed) */
    bool fresh;                     /* published is newer than sending */
    uint64_t next_publish_ns;       /* the loop's */
    uint64_t last_taken_ns;         /* the loop's: its last snapshot */
    uint64_t longest_gap_ns;        /* between two snapshots (under lock) */
    /* the thread's own */
    kvf_outbox_t *router;
    kvf_outboxes_t *peers;
    uint64_t seq;
    Kvf__WorkRef **ptrs; /* scratch of one message */
    Kvf__WorkRef *refs;
    size_t cap_ptrs, cap_refs;
} node_beat_t;

struct kvf_node {
    kvf_node_config_t cfg; /* strings point at the copies below */
    char *node_id;
    char *router_url;
    char *listen_url;
    char *fingerprint;
    uint8_t *xfer_desc; /* replaced under beat.send_lock (the heartbeat thread reads it) */
    bool desc_changed;  /* since the node was created: heartbeats carry xfer_desc */
    kvf_inbox_t *inbox;
    kvf_outbox_t *router;
    kvf_outboxes_t *peers;
    bool registered;
    uint64_t prefix_key[2];  /* the router's block-hash key (RegisterReply) */
    uint32_t prefix_key_gen; /* 0: none yet; +1 each time it changes */
    kvf_status_t refused; /* KVF_OK unless the router refused us */
    /* This registration's token (RegisterReply.reg_token; 0 bytes: none
     * yet). Written by the loop only while heartbeats are stopped (not
     * registered), read by both. */
    uint8_t reg_token[KVF_REG_TOKEN_LEN];
    size_t reg_token_len;
    kvf_refusals_t refusals; /* messages dropped by kvf_node_handle (the loop's) */
    uint64_t next_register_ns;
    unsigned register_retry_ms; /* the next retry's delay (node.c) */
    node_beat_t beat;
};

/* Sets up b (nothing started); KVF_OK or NOMEM / the sockets' error. */
kvf_status_t kvf_node__beat_init(kvf_node_t *node);
/* Starts the thread. */
kvf_status_t kvf_node__beat_start(kvf_node_t *node);
/* Stops and joins the thread, frees b. */
void kvf_node__beat_fini(kvf_node_t *node);
/* The loop's turn: publishes a snapshot when one is due. */
void kvf_node__beat_tick(kvf_node_t *node, uint64_t now_ns);
/* Milliseconds until the next snapshot is due. */
int kvf_node__beat_timeout_ms(const kvf_node_t *node);
/* Heartbeats start (registered, period_ms from the router) or stop; the
 * first one goes at once. Returns with no beat under way. */
void kvf_node__beat_set_registered(kvf_node_t *node, bool registered, unsigned period_ms);
/* The state the heartbeats report changed: the next one goes at once. */
void kvf_node__beat_set_draining(kvf_node_t *node, bool draining);

#endif
