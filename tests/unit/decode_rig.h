/* The rig the kvf-decode tests (test_decode_node.c, test_decode_text.c,
 * test_decode_failures.c) run the node in: kvf-decode as a process, the
 * test playing the router (and, for the KV handoff, the prefill node) over
 * real sockets and the real transport, with the golden greedy
 * continuations of tests/data/golden (an independent float64 reference)
 * to check the tokens against. cmocka assertions: a failure fails the
 * calling test. */
#ifndef KVF_TEST_DECODE_RIG_H
#define KVF_TEST_DECODE_RIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvf/backend.h"
#include "kvf/engine.h"
#include "kvf/kvcache.h"
#include "kvf/model.h"
#include "kvf/msg.h"
#include "kvf/xfer.h"
#include "prefix_view.h"

#define DRIG_MODEL_DIR  KVF_TEST_DATA "/golden/tiny-llama-f32"
#define DRIG_N_PROMPTS  4
#define DRIG_N_GREEDY   24
#define DRIG_BLOCK_SIZE 8
#define DRIG_LEASE_MS   600
#define DRIG_MAX_REQ    24
#define DRIG_MAX_OUT    512
#define DRIG_MAX_TEXT   8192

/* A golden prompt and its greedy continuation. */
typedef struct {
    uint32_t ids[64];
    int n_ids;
    uint32_t greedy[DRIG_N_GREEDY];
} drig_prompt_t;

/* What the fake router saw of one request (of one epoch). */
typedef struct {
    uint64_t req_id;
    bool prefill_done; /* a local prefill's PrefillDone came */
    uint32_t base;     /* tokens earlier epochs streamed (a re-dispatch) */
    uint32_t tokens[DRIG_MAX_OUT];
    int n_tokens;             /* tokens of this epoch */
    char text[DRIG_MAX_TEXT]; /* every chunk's text, concatenated (U+0000 included) */
    size_t text_len;
    size_t text_after[DRIG_MAX_OUT + 1]; /* text_len once i tokens had come */
    uint32_t next_seq;
    uint32_t n_generated;   /* from the last chunk */
    int first_chunk_tokens; /* tokens of the first chunk, -1 before it */
    int finish;             /* Kvf__FinishReason, 0 until finished */
    int error;              /* last Error status, 0 if none */
    int n_chunks_after_finish;
    int n_relayed;              /* chunks carrying a relayed PrefillDone (first only) */
    uint64_t relayed_kv_bytes;  /* its kv_bytes: KvReady's (DRIG_RELAY_KV_BYTES) */
} drig_req_t;

/* The kv_bytes drig_send_kv_ready's KvReady says; the decode node relays
 * them on the first chunk. */
#define DRIG_RELAY_KV_BYTES 4242

/* The test's side of the rig: the node process, the fake router's view
 * of it, and the golden prompts. */
typedef struct {
    pid_t pid;
    char router_url[64], node_url[64];
    kvf_inbox_t *inbox; /* the fake router's (and fake prefill node's) inbox */
    kvf_outbox_t *to_node;
    uint8_t desc[4096];
    size_t desc_len;
    uint32_t capacity;
    uint32_t max_context;
    bool have_load;
    uint32_t blocks_used, blocks_total, running;
    uint64_t heartbeats;
    bool deregistered;
    drig_req_t reqs[DRIG_MAX_REQ];
    int n_reqs;
    /* the last KvAllocReply */
    bool have_alloc_reply;
    uint64_t alloc_req_id;
    int alloc_status;
    uint32_t alloc_blocks[64];
    size_t n_alloc_blocks;
    drig_prompt_t prompts[DRIG_N_PROMPTS];
    /* what the node's prefix-cache reports list */
    prefix_view_t prefix;
} drig_t;

/* The cluster key the rig hands the node in RegisterReply. */
extern const uint8_t drig_prefix_key[16];

/* The fake prefill node: its own pool and engine, the real transport. */
typedef struct {
    kvf_model_t *model;
    kvf_backend_t be;
    kvf_kvpool_t *pool;
    kvf_engine_t *engine;
    kvf_xfer_t *xfer;
    kvf_xfer_peer_t *peer;
    float *logits;
} drig_prefill_t;

/* cmocka setup: a zeroed rig with the golden prompts loaded. */
int drig_setup(void **state);

/* cmocka teardown: kills a node a failed test left running, frees the rig. */
int drig_teardown(void **state);

/* Starts kvf-decode (--prefill-local, lease DRIG_LEASE_MS, 10-token
 * forwards) with one optional extra flag and value (extra, e.g.
 * "--max-running 2", or NULL) and waits for its first heartbeat; the
 * Register is checked and answered on the way. */
void drig_start(drig_t *h, const char *extra);

/* SIGTERM, then waits (still receiving) for the node to exit; its wait
 * status. */
int drig_stop(drig_t *h);

/* Receives for up to ms milliseconds, or until done(h, arg) holds (done
 * NULL: the whole time). Whether done came to hold. */
bool drig_pump(drig_t *h, int ms, bool (*done)(drig_t *, const void *), const void *arg);

/* drig_pump conditions: arg is the request id (a const uint64_t *). */
bool drig_req_finished(drig_t *h, const void *arg);
bool drig_req_errored(drig_t *h, const void *arg);
bool drig_alloc_replied(drig_t *h, const void *arg);

/* The record of a request, a new empty one when nothing came for it yet. */
drig_req_t *drig_seen(drig_t *h, uint64_t req_id);

/* Waits for a heartbeat sent after the call that reports no block in use. */
void drig_expect_no_blocks_used(drig_t *h);

/* Sends env to the node as the fake router (2 s at most). */
void drig_send(drig_t *h, kvf_envelope_t *env);

/* A Cancel from the router (reason may be NULL). */
void drig_send_cancel(drig_t *h, uint64_t req_id, uint64_t epoch, const char *reason);

/* As the router sends it: max_tokens in total, a seed always. */
Kvf__Sampling drig_greedy_sampling(uint32_t max_tokens);

/* A PrefillRequest for the node itself; n_generated: the last tokens of
 * ids an earlier epoch streamed. */
void drig_send_prefill_request_resumed(drig_t *h, uint64_t req_id, uint64_t epoch,
                                       const uint32_t *ids, size_t n, Kvf__Sampling *s,
                                       uint32_t n_generated);

/* The same for a new request (nothing generated yet). */
void drig_send_prefill_request(drig_t *h, uint64_t req_id, uint64_t epoch, const uint32_t *ids,
                               size_t n, Kvf__Sampling *s);

/* The tokenizer's text for ids, NUL-terminated (malloc'd, the caller
 * frees it). */
char *drig_decode_text(const uint32_t *ids, size_t n, size_t *len_p);

/* Every golden token of g from the node, the first in a chunk of its
 * own, and the text of them all. */
void drig_check_golden(drig_t *h, uint64_t req_id, const drig_prompt_t *g);

/* Opens the fake prefill node and connects its transport to the node's
 * descriptor (from its Register). */
void drig_prefill_open(drig_t *h, drig_prefill_t *f);
void drig_prefill_close(drig_prefill_t *f);

/* A KvAlloc from the fake prefill node (forgets the last KvAllocReply). */
void drig_send_kv_alloc(drig_t *h, uint64_t req_id, uint64_t epoch, uint32_t n_tokens,
                        uint32_t max_new);

/* A KvReady from the fake prefill node: the n-token prompt ids, its first
 * token first, sampling s. */
void drig_send_kv_ready(drig_t *h, uint64_t req_id, uint64_t epoch, uint32_t first,
                        const uint32_t *ids, uint32_t n, Kvf__Sampling *s);

/* Computes the prompt into local blocks and ships every (block, layer)
 * slice into the node's blocks of the last KvAllocReply in one LAST
 * batch; returns the first token (greedy). */
uint32_t drig_prefill_and_ship(drig_t *h, drig_prefill_t *f, uint64_t req_id, uint64_t epoch,
                               const drig_prompt_t *g);

#endif
