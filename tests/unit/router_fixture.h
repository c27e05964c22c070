/* The router core in-process for unit tests (test_router, test_router_route):
 * a router on ipc:// sockets and two inboxes standing for nodes, whose
 * internals the test drives on its own thread, as the router's loop
 * would (tests/unit/router_fixture.c). */
#ifndef KVF_TEST_ROUTER_FIXTURE_H
#define KVF_TEST_ROUTER_FIXTURE_H

#include <stdbool.h>
#include <stdint.h>

#include "router_internal.h"

#define RFX_MODEL KVF_TEST_DATA "/golden/tiny-llama-f32"
#define RFX_NODES 4

typedef struct {
    kvf_router_t *r;
    kvf_inbox_t *node_inbox[RFX_NODES]; /* where the router's messages to "nodes" land */
    char urls[2 + RFX_NODES][128];      /* router inbox, client socket, node 0, 1, ... */
    uint8_t prefix_key[16];     /* the first accepted node's RegisterReply key */
    bool prefix_key_seen;
    /* rfx_register_* present the id's current registration token (a node
     * registering again as itself); false: none (a new process). */
    bool present_token;
} fixture_t;

/* cmocka setup: the router (heartbeats every 50 ms, a queue of 4) with
 * the given timeouts; tweak (may be NULL) adjusts its config first. */
int rfx_setup(void **state, unsigned queue_timeout_ms, unsigned request_timeout_ms,
              void (*tweak)(kvf_router_config_t *cfg));
int rfx_teardown(void **state);

/* Registers a node of role at inbox url (one of the fixture's) whose pool
 * has the given block size and KV format (64 blocks). */
void rfx_register_pool(fixture_t *fx, Kvf__Role role, const char *id, const char *url,
                       uint32_t block_size, Kvf__KvDtype dtype);
/* A valid transfer descriptor (as kvf_xfer_export writes them) for a
 * 64-block pool of geometry g: desc holds at least 128 bytes. */
void rfx_xfer_desc(const Kvf__KvGeometry *g, uint8_t *desc, size_t *len_p);
/* The same, a decode node that also prefills when prefill_local. */
void rfx_register_node(fixture_t *fx, Kvf__Role role, const char *id, const char *url,
                       uint32_t block_size, Kvf__KvDtype dtype, bool prefill_local);
/* The same with 16-token f32 blocks. */
void rfx_register(fixture_t *fx, Kvf__Role role, const char *id, const char *url);
void rfx_register_decode(fixture_t *fx, const char *id, const char *url);
kvf_router_node_t *rfx_node_named(fixture_t *fx, const char *id);

/* The next message in fixture node `node`'s inbox of the given kind, or
 * NULL within wait_ms (other kinds are skipped). */
kvf_envelope_t *rfx_node_recv(fixture_t *fx, int node, int body_case, int wait_ms);

/* Runs the router's loop until done says so or 10 s pass. */
void rfx_run_until(fixture_t *fx, bool (*done)(fixture_t *, void *), void *arg);

/* The value of the metrics line that starts with `line` in the router's
 * /metrics text (fails the test when there is none). */
unsigned long long rfx_metric(fixture_t *fx, const char *line);

#endif
