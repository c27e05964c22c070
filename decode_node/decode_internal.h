/* The decode node's private parts, shared by its files (decode.h is the
 * public face; handoff.h the per-request state machine):
 *
 *   decode.c    kvf_decode_create / destroy: the node's pieces, in order
 *   requests.c  the request table: find, add, end, release
 *   admit.c     the one admission path (KvAlloc and local PrefillRequest)
 *   messages.c  control messages from the router and prefill nodes
 *   events.c    transport events (LANDED, EXPIRED, ...), seal deadlines and
 *               the senders whose connection has carried data
 *   step.c      one continuous-batching step: gather rows, forward, sample
 *   generate.c  a sequence's tokens: sampler set-up, joining, the finish rule
 *   output.c    what leaves for the router: token chunks, errors, PrefillDone
 *   loop.c      kvf_decode_run: the event loop, drain and stop
 *
 * Everything here runs on the loop's thread. */
#ifndef KVF_DECODE_INTERNAL_H
#define KVF_DECODE_INTERNAL_H

#include "decode.h"
#include "handoff.h"

#include "kvf/engine.h"
#include "kvf/evloop.h"
#include "kvf/msg.h"
#include "kvf/node.h"
#include "kvf/node_prefix.h"
#include "kvf/node_tiers.h"
#include "kvf/prefix_cache.h"
#include "kvf/sampling.h"
#include "kvf/textstream.h"
#include "kvf/timer.h"
#include "kvf/tokenizer.h"
#include "kvf/xfer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Slack after a reservation's lease before the node gives up a handoff
 * that has not sealed (KvReady and the last batch both seen). */
#define DECODE_SEAL_MARGIN_MS 2000

/* Attempts remembered as cancelled before any message of theirs came
 * (requests.c); past it the oldest is forgotten. Each is remembered for
 * as long as a reservation may wait to seal (lease plus the margin): a
 * KvAlloc later than that finds it gone (a restarted router numbers its
 * requests from 1 again). */
#define DECODE_CANCELLED_MAX 4096

/* One request this node holds, for one epoch. */
typedef struct {
    uint64_t req_id;
    uint64_t epoch;
    kvf_handoff_t h;
    bool local;       /* prefilled here (--prefill-local): no transfer */
    bool reserved;    /* a transfer reservation exists: blocks return on RELEASED */
    char *sender;     /* transferred: the prefill node's id (KvAlloc); owned */
    uint32_t *blocks; /* (n_blocks) block table in position order; owned */
    uint32_t n_blocks;
    uint32_t n_tokens;           /* tokens whose K/V the sequence starts from */
    uint32_t max_new;            /* generation room taken at admission */
    uint32_t *prompt;            /* (n_tokens) local prefill only; owned */
    uint32_t prefilled;          /* local: prompt tokens computed so far */
    uint32_t n_generated_before; /* tokens earlier epochs streamed */
    uint32_t max_tokens;         /* tokens left to generate in this epoch */
    bool ignore_eos;
    kvf_sampler_t sampler;
    bool has_sampler;
    kvf_textstream_t *text; /* the client's text, stop strings matched here; owned */
    uint32_t first_token;   /* transferred: sampled by the prefill node (KvReady) */
    uint32_t next_token;    /* fed at position pos by the next step */
    uint32_t pos;
    uint32_t gen; /* tokens emitted in this epoch (an ending EOS not counted) */
    uint32_t chunk_seq;
    uint64_t prefill_us;    /* local: forward time of the steps holding its chunks */
    uint64_t kv_bytes;      /* bytes landed by the transfer */
    /* transferred: the prefill node's PrefillDone as KvReady told it,
     * relayed on the attempt's first chunk (relay_prefill until then) */
    bool relay_prefill;
    uint64_t pf_compute_us, pf_handoff_us, pf_kv_bytes;
    uint32_t pf_cached_tokens;
    kvf_timer_t seal_timer; /* transferred: the handoff must seal before it fires */
    /* the prefix cache: leading blocks it held at admission (not written
     * by the transfer), and the prompt's full blocks to list once sealed */
    uint32_t cached_blocks;
    uint64_t *prefix_hashes;  /* (n_prefix) owned */
    uint32_t *prefix_tokens;  /* (n_prefix * block_size) owned */
    uint32_t n_prefix;
    uint32_t key_gen;
    /* the whole sequence, for listing its full blocks when it ends (blocks
     * of generated tokens included: a decode step writes the bits a
     * prefill writes, test_engine): prompt and earlier epochs' tokens,
     * then this epoch's kept tokens; NULL when there was no memory */
    uint32_t *seq_ids; /* (n_seq_ids, cap_seq_ids) owned */
    uint32_t n_seq_ids, cap_seq_ids;
    uint32_t kv_len;   /* positions whose K/V is in its blocks */
    uint32_t tier_pending; /* copies from the KV tiers in flight (tiers.c) */
    uint32_t tier_good;    /* blocks before the first copy that failed */
    /* transferred: the KvAlloc's reply inbox while its answer waits for
     * copies from the tiers (tier_pending); owned, NULL once answered */
    char *alloc_reply_to;
    uint8_t *salt;     /* (salt_len) the request's cache_salt; owned */
    size_t salt_len;
    bool kv_on_device;      /* transferred K/V copied from the host mirror (device pools) */
} dec_req_t;

/* An attempt the router cancelled before its KvAlloc came (epoch 0: every
 * epoch of the request). */
typedef struct {
    uint64_t req_id, epoch;
    uint64_t at_ns; /* when the Cancel came */
} dec_cancelled_t;

/* A TokenChunk waiting for the next TokenBatch: at most one token, and
 * its text, text_len bytes at text_off in the batch's text buffer (it may
 * hold U+0000: it travels as bytes with its length). */
typedef struct {
    uint64_t req_id, epoch;
    uint32_t seq;
    uint32_t token;
    bool has_token;
    Kvf__FinishReason finish;
    uint32_t n_generated;
    uint64_t rng_state;
    size_t text_off, text_len;
    bool prefill; /* carries the attempt's relayed PrefillDone (below) */
    uint64_t pf_compute_us, pf_handoff_us, pf_kv_bytes;
    uint32_t pf_cached_tokens;
} dec_chunk_t;

struct kvf_decode {
    kvf_decode_config_t cfg;  /* strings point at the copies below */
    bool draining;            /* SIGTERM: finishing what it holds, taking nothing new */
    bool drain_expired;       /* the drain took longer than drain_timeout_ms */
    kvf_status_t node_status; /* the node runtime's last tick: a refusal ends the loop */
    /* A prefill node was lost while it held a reservation here: the
     * transport listens anew at the end of the loop turn (loop.c). */
    bool relisten_wanted;
    char *router_url, *listen_url, *model_dir, *node_id;
    kvf_engine_stack_t rt; /* model, backend, pool, engine */
    /* the prefix cache: prompt blocks prefill nodes shipped or this node
     * prefilled itself (pc.cache NULL: off) */
    kvf_node_prefix_t pc;
    kvf_node_tiers_t nt; /* the KV tiers (tiers.c; nt.tiers NULL: none) */
    uint64_t prefix_hit_blocks, prefix_query_blocks;
    kvf_tokenizer_t *tok;  /* the model's, for the requests' text */
    kvf_xfer_t *xfer;
    kvf_xfer_caps_t xfer_caps;
    bool two_sided; /* the pool receives two-sided transfers */
    kvf_node_t *node;
    int vocab;
    uint32_t max_context;
    uint32_t block_size;
    size_t block_bytes;

    /* The loop's one wait, and its deadlines (loop.c). */
    kvf_evloop_t *loop;
    kvf_timer_t node_timer;    /* the node runtime's next register / heartbeat */
    kvf_timer_t xfer_timer;    /* the transport's next internal deadline */
    kvf_timer_t stats_timer;   /* the next stats line */
    kvf_timer_t drain_timer;   /* the end of a graceful drain */
    kvf_timer_t recheck_timer; /* a handoff the transport's fd may not wake for */

    dec_req_t **reqs; /* (n_reqs) in admission order: local prefills are served FIFO */
    size_t n_reqs, cap_reqs;

    /* Cancels that came before the attempt they end (requests.c): a ring
     * of (n_cancelled) entries from cancelled_head, allocated on first use. */
    dec_cancelled_t *cancelled;
    size_t n_cancelled, cancelled_head;

    /* Messages read during a step for the loop, in order (loop.c). */
    kvf_kept_t stash;

    /* Prefill nodes whose connection to this pool has carried a batch
     * (events.c): (n_senders) ids, owned. */
    char **senders;
    size_t n_senders;

    /* step scratch, max_running rows */
    kvf_engine_seq_t *seqs;
    dec_req_t **step_reqs;
    float *logits;    /* (max_running, vocab) */
    uint32_t *greedy; /* (max_running) tokens of greedy rows, found by the engine */

    dec_chunk_t *chunks; /* (n_chunks) pending for the next TokenBatch */
    size_t n_chunks, cap_chunks;
    char *chunk_text; /* (text_len) the pending chunks' texts, one after another */
    size_t text_len, text_cap;
    size_t text_start; /* where the text of the chunk being built starts */
    bool text_lost;    /* the chunk being built lost text to out of memory */

    kvf_decode_stats_t stats;
    kvf_decode_stats_t logged;
    kvf_auth_counters_t logged_auth; /* the control plane's refusals at the last stats line */
    uint64_t logged_refused;         /* the runtime's message refusals then (kvf_node_refused) */
};

/* ---- requests.c: the table ------------------------------------------------ */

/* Frees r (sampler, text stream, block table, prompt) and disarms its
 * timer; its blocks must be back in the pool or never taken. */
void dec_req_free(kvf_decode_t *d, dec_req_t *r);

/* Appends r to the table, which then owns it. NOMEM: r stays the caller's. */
kvf_status_t dec_req_add(kvf_decode_t *d, dec_req_t *r);

/* The live attempt of req_id (at most one), or NULL. */
dec_req_t *dec_req_find_live(const kvf_decode_t *d, uint64_t req_id);

/* The entry of (req_id, epoch) in any state, or NULL. */
dec_req_t *dec_req_find(const kvf_decode_t *d, uint64_t req_id, uint64_t epoch);

/* Whether an entry of req_id with an epoch >= epoch exists in any state. */
bool dec_req_seen_epoch(const kvf_decode_t *d, uint64_t req_id, uint64_t epoch);

/* Whether an ended attempt of req_id still holds a transfer reservation
 * (the transport keys reservations by req_id alone). */
bool dec_req_releasing_reserved(const kvf_decode_t *d, uint64_t req_id);

/* Remembers that the router cancelled (req_id, epoch) (epoch 0: every
 * epoch) while this node held no live entry of it: the attempt's KvAlloc
 * may still be on its way (it comes from the prefill node, on another
 * connection than the Cancel), and must not then take blocks. */
void dec_req_note_cancelled(kvf_decode_t *d, uint64_t req_id, uint64_t epoch);

/* Whether a Cancel noted by dec_req_note_cancelled, no older than a lease
 * plus DECODE_SEAL_MARGIN_MS, covers (req_id, epoch). */
bool dec_req_was_cancelled(const kvf_decode_t *d, uint64_t req_id, uint64_t epoch);

/* Frees what dec_req_note_cancelled remembered. */
void dec_req_cancelled_free(kvf_decode_t *d);

/* Requests admitted and not yet ended. */
uint32_t dec_req_live_count(const kvf_decode_t *d);

/* Allocates n_blocks pool blocks into r's block table. */
kvf_status_t dec_req_alloc_blocks(kvf_decode_t *d, dec_req_t *r, uint32_t n_blocks);

/* Returns r's blocks to the pool and removes and frees r: the end of
 * RELEASING. */
void dec_req_release_blocks(kvf_decode_t *d, dec_req_t *r);

/* Ends a live request (finished, cancelled, failed). Its blocks go back
 * to the pool once no write of its transfer can land any more: at once
 * for a local prefill, on the transport's RELEASED event otherwise. r may
 * be freed on return. */
void dec_req_end(kvf_decode_t *d, dec_req_t *r);

/* The request failed here: the router hears status and the text, the
 * failure is counted, and r ends (it may be freed on return). */
void dec_req_fail(kvf_decode_t *d, dec_req_t *r, kvf_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- admit.c: admission ------------------------------------------------------ */

/* What a request asks of the node, whichever message brought it. */
typedef struct {
    uint64_t req_id, epoch;
    bool local;             /* prefilled here: no reservation */
    uint32_t n_tokens;      /* tokens whose K/V the sequence starts from */
    uint32_t max_new;       /* generation room to reserve */
    const uint32_t *prompt; /* local: (n_tokens) token ids, copied */
    const uint64_t *prefix_hashes; /* transferred: KvAlloc's, n_prefix */
    const uint32_t *prefix_tokens; /* (n_prefix * block_size) */
    uint32_t n_prefix;
    const uint8_t *cache_salt; /* (cache_salt_len): the hashes' root depends on it */
    size_t cache_salt_len;
    const char *sender;     /* transferred: the prefill node's id, copied */
    const char *reply_inbox; /* transferred: where the KvAllocReply goes, copied */
    const char *what;       /* the message, for logs */
} dec_admit_spec_t;

/* The one admission path. KVF_OK: a new entry in the table (blocks
 * allocated, reserved with the transport unless local), *r_p set; a
 * transferred request whose next offered blocks a KV tier holds is not
 * reserved yet: r->alloc_reply_to set, its copies in flight, it is
 * reserved and answered once they are in (tiers.c).
 * KVF_ERR_STALE: the message is for an epoch older than (or equal to, for
 * a local request) one this node has seen; dropped and counted, no answer.
 * KVF_ERR_AGAIN: the same epoch is live already (a duplicate); *r_p is it;
 * counted as malformed. KVF_ERR_CANCELLED: the router cancelled the
 * attempt before this message came (dec_req_note_cancelled); counted as
 * stale, why says so (answered: the sender stops waiting). Any other
 * status: refused (counted) and why holds the reason to answer with. A
 * live older epoch is ended first. */
kvf_status_t dec_admit(kvf_decode_t *d, const dec_admit_spec_t *spec, char *why, size_t why_len,
                       dec_req_t **r_p);

/* Lets the prefill node write r's prompt blocks from r->cached_blocks on
 * (a reservation with the transport) and arms or moves r's seal deadline. */
kvf_status_t dec_reserve_prompt_blocks(kvf_decode_t *d, dec_req_t *r);

/* ---- prefix.c: the prefix cache ---------------------------------------------- */

/* r's n_blocks blocks: the longest held run of spec's prefix blocks (its
 * hashes checked against its tokens under this node's key), then fresh
 * ones, evicting cached blocks nobody uses where the pool is short; keeps
 * spec's prefix for dec_prefix_list. The prefix blocks after the held run
 * that a KV tier holds start coming back into the fresh ones
 * (dec_tiers_promote). */
kvf_status_t dec_prefix_alloc(kvf_decode_t *d, dec_req_t *r, const dec_admit_spec_t *spec,
                              uint32_t n_blocks);
/* Lists r's prompt blocks in the cache: their K/V has landed and sealed. */
void dec_prefix_list(kvf_decode_t *d, const dec_req_t *r);
/* r keeps the ids of its sequence (n ids: the prompt and earlier epochs'
 * tokens) for dec_prefix_list_all; without memory it is not listed. */
void dec_prefix_keep_ids(dec_req_t *r, const uint32_t *ids, size_t n);
/* r generated tok (kept). */
void dec_prefix_note_token(dec_req_t *r, uint32_t tok);
/* r ends well: every full block of its sequence (prompt and generated
 * tokens) is listed in the cache, on a host pool. */
void dec_prefix_list_all(kvf_decode_t *d, const dec_req_t *r);

/* ---- tiers.c: the KV tiers -------------------------------------------------- */

/* The tiers of d's config (none when it asks for none). */
kvf_status_t dec_tiers_open(kvf_decode_t *d);
/* A request r whose pool hit ends at block `from` takes the next blocks
 * [from, most) a tier holds: copies start into its blocks and r waits
 * (r->tier_pending): a local prefill before it computes, a transferred
 * request before it is reserved and its KvAlloc answered (the prefill
 * node then skips the blocks that came back good). Returns where they
 * end. */
uint32_t dec_tiers_promote(kvf_decode_t *d, dec_req_t *r, uint32_t from, uint32_t most);

/* ---- messages.c ------------------------------------------------------------- */

/* Answers a KvAlloc of (req_id, epoch) at inbox: status and error, and
 * with r its blocks, lease and cached_blocks. A send that fails with r
 * fails r (the prefill node will never write). */
void dec_reply_kv_alloc(kvf_decode_t *d, uint64_t req_id, uint64_t epoch, const char *inbox,
                        kvf_status_t status, const char *error, const dec_req_t *r);

/* Handles one envelope from the inbox; env stays the caller's. */
void dec_on_envelope(kvf_decode_t *d, const kvf_envelope_t *env);

/* ---- events.c ----------------------------------------------------------------- */

/* Takes every pending transport event. */
void dec_drain_events(kvf_decode_t *d);

/* Arms r's seal deadline: lease plus DECODE_SEAL_MARGIN_MS from now. */
void dec_arm_seal_deadline(kvf_decode_t *d, dec_req_t *r);
/* Moves r's armed seal deadline to a lease plus the margin from now (its
 * reservation was renewed). */
void dec_renew_seal_deadline(kvf_decode_t *d, dec_req_t *r);

/* Whether a handoff under way may need the transport progressed although
 * nothing wakes the loop, where the transport's fd does not wake for
 * everything (see loop.c): a KvReady taken before the last LANDED, or a
 * sender whose connection has not carried a batch yet; with no_fd (no
 * transport fd at all), any handoff under way. */
bool dec_handoff_needs_recheck(const kvf_decode_t *d, bool no_fd);

/* Frees the table of proven senders. */
void dec_senders_free(kvf_decode_t *d);

/* ---- step.c ------------------------------------------------------------------- */

/* Whether a sequence is decoding or prefilling: a step has rows. */
bool dec_has_work(const kvf_decode_t *d);

/* One engine forward over every decoding sequence and local prompt
 * chunks, then sampling; the tokens leave in one TokenBatch. */
void dec_step(kvf_decode_t *d);

/* ---- generate.c --------------------------------------------------------------- */

/* How a sequence generates, from the message that starts it (KvReady, or
 * a local PrefillRequest). */
typedef struct {
    const Kvf__Sampling *sampling;       /* as the router built it */
    const kvf_sampling_params_t *params; /* converted from it (kvf_sampling_msg_params) */
    const uint32_t *token_ids; /* (n_token_ids) prompt and the tokens earlier epochs streamed */
    size_t n_token_ids;
    uint32_t n_generated; /* the last n_generated of token_ids were streamed already */
    bool resume_rng;      /* continue the sampler from rng_state */
    uint64_t rng_state;
} dec_gen_spec_t;

/* Sets up r's sampler, token budget, EOS rule and text stream (stops from
 * the sampling message, rebuilt from the tokens already streamed). On an
 * error the caller fails r (dec_req_free cleans up what was set). */
kvf_status_t dec_req_start_generation(kvf_decode_t *d, dec_req_t *r, const dec_gen_spec_t *g);

/* The sequence has its K/V and its first token (r->first_token for a
 * transfer; sampled after a local prefill): it joins the batch and its
 * first token goes out, unless that token already ends it (r may be
 * freed on return). */
void dec_req_join(kvf_decode_t *d, dec_req_t *r, uint32_t first);

/* r produced tok: the finish rule (EOS, stop string, length), the chunk
 * with its text, the end (r may be freed on return). */
void dec_req_take_token(kvf_decode_t *d, dec_req_t *r, uint32_t tok);

/* ---- output.c ----------------------------------------------------------------- */

/* Sends env to the router; a failure is logged (the router's request
 * timeout covers a lost message). */
void dec_send_router(kvf_decode_t *d, kvf_envelope_t *env);

/* Sends Error{req_id, epoch, status, text} to the router. */
void dec_send_error(kvf_decode_t *d, uint64_t req_id, uint64_t epoch, kvf_status_t status,
                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Adds text to the chunk r's next dec_emit_chunk queues (the text its
 * tokens add for the client). */
void dec_chunk_add_text(kvf_decode_t *d, const char *text, size_t len);

/* Queues r's chunk for the next TokenBatch: token when has_token, the
 * finish reason, and the text added since the last chunk. On out of
 * memory the chunk is dropped and logged: the router sees a gap in the
 * positions and dispatches the request again. */
void dec_emit_chunk(kvf_decode_t *d, dec_req_t *r, bool has_token, uint32_t token,
                    Kvf__FinishReason finish);

/* Sends every pending chunk in one TokenBatch. */
void dec_flush_chunks(kvf_decode_t *d);

/* Tells the router a local prefill is done (its timings; the first token
 * follows as a chunk). */
void dec_send_prefill_done(kvf_decode_t *d, const dec_req_t *r);

/* ---- loop.c ------------------------------------------------------------------- */

/* Reads the inbox between the layers of a step: lease renewals are taken
 * at once (a long step must not let a reservation its prefill node still
 * renews run out), the rest is kept for the loop's next turn, in order. */
void dec_inbox_during_step(kvf_decode_t *d);
/* Frees what is kept (the node stops). */
void dec_stash_free(kvf_decode_t *d);

/* The attempts named in each heartbeat (kvf_node_config_t.fill_work):
 * every request held and not yet ending. */
void dec_fill_work(void *arg, kvf_node_snapshot_t *snap);

/* The load reported with each heartbeat (kvf_node_config_t.fill_load). */
void dec_fill_load(void *arg, Kvf__Load *load);

/* Makes the loop's wait and its timers and watches the inbox and the
 * transport (after the node runtime and the transport exist). */
kvf_status_t dec_loop_open(kvf_decode_t *d);

/* Disarms the loop's own timers and frees the wait (requests' timers
 * must be gone first). NULL loop ok. */
void dec_loop_close(kvf_decode_t *d);

#endif
