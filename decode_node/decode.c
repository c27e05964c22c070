/* The decode node's construction and teardown: the configuration, the
 * engine stack (model, backend, pool, engine), the transport over the
 * pool, the node runtime and the step scratch, in that order. See decode.h
 * for the whole and decode_internal.h for where each part lives. */
#include "decode_internal.h"

#include "kvf/backend.h"
#include "kvf/kvcache.h"
#include "kvf/log.h"
#include "kvf/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvf_decode_get_stats(const kvf_decode_t *d, kvf_decode_stats_t *stats_p)
{
    *stats_p = d->stats;
    stats_p->malformed_dropped += kvf_inbox_dropped(kvf_node_inbox(d->node));
}

/* Copies cfg's strings into d and fills the defaults. */
static kvf_status_t take_config(kvf_decode_t *d, const kvf_decode_config_t *cfg)
{
    d->cfg = *cfg;
    d->router_url = strdup(cfg->router_url);
    d->listen_url = strdup(cfg->listen_url);
    d->model_dir = strdup(cfg->model_dir);
    d->node_id = cfg->node_id ? strdup(cfg->node_id) : NULL;
    if (!d->router_url || !d->listen_url || !d->model_dir || (cfg->node_id && !d->node_id))
        return KVF_ERR_NOMEM;
    d->cfg.router_url = d->router_url;
    d->cfg.listen_url = d->listen_url;
    d->cfg.model_dir = d->model_dir;
    d->cfg.node_id = d->node_id;
    if (!d->cfg.kv_mem)
        d->cfg.kv_mem = KVF_DECODE_KV_MEM_DEFAULT;
    if (d->cfg.max_running <= 0)
        d->cfg.max_running = KVF_DECODE_MAX_RUNNING_DEFAULT;
    if (d->cfg.block_size <= 0)
        d->cfg.block_size = KVF_KV_BLOCK_SIZE_DEFAULT;
    if (!d->cfg.lease_ms)
        d->cfg.lease_ms = KVF_DECODE_LEASE_MS_DEFAULT;
    if (!d->cfg.max_batch_tokens)
        d->cfg.max_batch_tokens = KVF_DECODE_MAX_BATCH_TOKENS_DEFAULT;
    if (!d->cfg.stats_interval_ms)
        d->cfg.stats_interval_ms = 30000;
    return KVF_OK;
}

/* Model, backend, pool and engine, and the model's tokenizer. The pool:
 * the budget, but no more than max_running full-context sequences can
 * ever use, with a host mirror the transport ships into. */
static kvf_status_t open_engine(kvf_decode_t *d)
{
    kvf_engine_stack_config_t sc = {
        .threads = d->cfg.threads,
        .block_size = d->cfg.block_size,
        .budget_bytes = d->cfg.kv_mem,
        .max_full_sequences = (uint32_t)d->cfg.max_running,
        .kv_host_mirror = true,
    };
    kvf_status_t st = kvf_backend_flags_apply(&d->cfg.backend, &sc);
    if (st != KVF_OK)
        return st;
    st = kvf_engine_stack_init(&d->rt, d->model_dir, &sc);
    if (st != KVF_OK)
        return st;
    /* The requests' text and stop strings (the router loads the same). */
    st = kvf_tokenizer_load(d->model_dir, &d->tok);
    if (st != KVF_OK) {
        kvf_engine_stack_fini(&d->rt);
        return st;
    }
    const kvf_model_config_t *mc = &d->rt.model->cfg;
    d->vocab = mc->vocab;
    d->max_context = mc->max_pos > 0 ? (uint32_t)mc->max_pos : 1;
    d->block_size = (uint32_t)d->cfg.block_size;
    d->block_bytes = kvf_kv_block_bytes(kvf_kvpool_geometry(d->rt.pool));
    st = kvf_node_prefix_init(&d->pc, d->rt.pool, kvf_model_fingerprint(d->rt.model),
                              !d->cfg.no_prefix_cache);
    if (st != KVF_OK) {
        kvf_tokenizer_destroy(d->tok);
        kvf_engine_stack_fini(&d->rt);
        return st;
    }
    return KVF_OK;
}

static void close_engine(kvf_decode_t *d)
{
    kvf_node_prefix_fini(&d->pc); /* requests' references are gone by now */
    kvf_tokenizer_destroy(d->tok);
    kvf_engine_stack_fini(&d->rt);
}

/* The transfer handle registered over the pool: the receiving end of
 * every handoff. Two-sided when the operator says so, or (auto) when a
 * one-sided receiver would not survive a prefill node dying mid-put: one
 * prefill node's death must not take the decode node down. */
static kvf_status_t open_transport(kvf_decode_t *d)
{
    kvf_xfer_config_t xc = {
        .backend = KVF_XFER_UCX,
        .mem_type = KVF_XFER_MEM_HOST,
        .pool = kvf_kvpool_base(d->rt.pool),
        .pool_bytes = kvf_kvpool_bytes(d->rt.pool),
        .geometry = kvf_xfer_geometry_of_pool(kvf_kvpool_geometry(d->rt.pool)),
    };
    kvf_status_t st = kvf_xfer_caps(&xc, &d->xfer_caps);
    if (st != KVF_OK)
        return st;
    if (d->cfg.xfer_mode == KVF_DECODE_XFER_AUTO)
        d->two_sided = d->xfer_caps.one_sided && !d->xfer_caps.one_sided_survives_sender_death;
    else
        d->two_sided = d->cfg.xfer_mode == KVF_DECODE_XFER_AM;
    xc.two_sided = d->two_sided;
    return kvf_xfer_create(&xc, &d->xfer);
}

/* The node runtime: inbox, router registration (with the transport's
 * descriptor), heartbeats carrying dec_fill_load's load. */
static kvf_status_t open_node(kvf_decode_t *d)
{
    uint8_t *desc = NULL;
    size_t desc_len = 0;
    kvf_status_t st = kvf_xfer_export(d->xfer, &desc, &desc_len);
    if (st != KVF_OK)
        return st;
    const kvf_kv_geometry_t *geo = kvf_kvpool_geometry(d->rt.pool);
    kvf_node_config_t nc = {
        .role = KVF__ROLE__ROLE_DECODE,
        .node_id = d->node_id,
        .router_url = d->router_url,
        .listen_url = d->listen_url,
        .model_fingerprint = kvf_model_fingerprint(d->rt.model),
        .geometry = kvf_node_wire_geometry(geo),
        .capacity_blocks = kvf_kvpool_num_blocks(d->rt.pool),
        .xfer_desc = desc,
        .xfer_desc_len = desc_len,
        .max_running = (uint32_t)d->cfg.max_running,
        .max_context = d->max_context,
        .prefill_local = d->cfg.prefill_local,
        .fill_load = dec_fill_load,
        .fill_work = dec_fill_work,
        .load_arg = d,
    };
    st = kvf_node_create(&nc, &d->node);
    free(desc); /* the node keeps its own copy */
    if (st != KVF_OK) {
        kvf_log_error("node runtime on %s: %s", d->listen_url, kvf_status_str(st));
        return st;
    }
    kvf_log_set_node(kvf_node_id(d->node));
    d->pc.node = d->node;
    return KVF_OK;
}

/* Per-step scratch for max_running rows. */
static kvf_status_t alloc_scratch(kvf_decode_t *d)
{
    size_t rows = (size_t)d->cfg.max_running;
    d->seqs = calloc(rows, sizeof(*d->seqs));
    d->step_reqs = calloc(rows, sizeof(*d->step_reqs));
    /* Pinned on a GPU: sampled rows come back at full copy speed. */
    d->logits = kvf_backend_host_alloc(&d->rt.backend, rows * (size_t)d->vocab * sizeof(float));
    d->greedy = calloc(rows, sizeof(*d->greedy));
    if (!d->seqs || !d->step_reqs || !d->logits || !d->greedy)
        return KVF_ERR_NOMEM;
    return KVF_OK;
}

static void free_scratch(kvf_decode_t *d)
{
    free(d->greedy);
    kvf_backend_host_free(&d->rt.backend, d->logits);
    free(d->step_reqs);
    free(d->seqs);
}

static void log_started(const kvf_decode_t *d)
{
    const kvf_model_config_t *mc = &d->rt.model->cfg;
    char be_desc[128];
    kvf_backend_describe(&d->rt.backend, be_desc, sizeof(be_desc));
    uint32_t blocks = kvf_kvpool_num_blocks(d->rt.pool);
    const kvf_kv_geometry_t *geo = kvf_kvpool_geometry(d->rt.pool);
    kvf_log_info("model %s (%s, %d layers, vocab %d, context %u), kv pool %u blocks of %u "
                 "tokens (%.1f MiB), kv %s (%zu bytes per token), max running %d, backend %s, "
                 "%s transfers%s",
                 d->model_dir, mc->arch_name, mc->n_layers, mc->vocab, d->max_context, blocks,
                 d->block_size, (double)blocks * (double)d->block_bytes / (1024.0 * 1024.0),
                 kvf_kv_dtype_name(geo->dtype), kvf_kv_bytes_per_token(geo),
                 d->cfg.max_running, be_desc, d->two_sided ? "two-sided" : "one-sided",
                 d->cfg.prefill_local ? ", prefills locally" : "");
}

static void free_config(kvf_decode_t *d)
{
    free(d->node_id);
    free(d->model_dir);
    free(d->listen_url);
    free(d->router_url);
}

kvf_status_t kvf_decode_create(const kvf_decode_config_t *cfg, kvf_decode_t **dec_p)
{
    if (!cfg->router_url || !cfg->listen_url || !cfg->model_dir) {
        kvf_log_error("decode node needs a router url, a listen url and a model directory");
        return KVF_ERR_INVAL;
    }
    kvf_decode_t *d = calloc(1, sizeof(*d));
    if (!d)
        return KVF_ERR_NOMEM;
    kvf_status_t st = take_config(d, cfg);
    if (st != KVF_OK)
        goto fail_config;
    st = open_engine(d);
    if (st != KVF_OK)
        goto fail_config;
    st = open_transport(d);
    if (st != KVF_OK)
        goto fail_transport;
    st = open_node(d);
    if (st != KVF_OK)
        goto fail_node;
    st = dec_loop_open(d);
    if (st != KVF_OK)
        goto fail_loop;
    st = dec_tiers_open(d);
    if (st != KVF_OK)
        goto fail_tiers;
    st = alloc_scratch(d);
    if (st != KVF_OK)
        goto fail_scratch;
    log_started(d);
    *dec_p = d;
    return KVF_OK;

fail_scratch:
    free_scratch(d);
    kvf_node_tiers_fini(&d->nt);
fail_tiers:
fail_loop:
    dec_loop_close(d);
    kvf_node_destroy(d->node);
fail_node:
    kvf_xfer_destroy(d->xfer);
fail_transport:
    close_engine(d);
fail_config:
    free_config(d);
    free(d);
    return st;
}

void kvf_decode_destroy(kvf_decode_t *d)
{
    if (!d)
        return;
    while (d->n_reqs)
        dec_req_release_blocks(d, d->reqs[d->n_reqs - 1]);
    free(d->reqs);
    dec_req_cancelled_free(d);
    dec_senders_free(d);
    dec_stash_free(d);
    free(d->chunks);
    free(d->chunk_text);
    free_scratch(d);
    kvf_node_tiers_fini(&d->nt); /* before the pool: copies in flight write into it */
    dec_loop_close(d); /* after the requests: their timers are in its set */
    kvf_node_destroy(d->node);
    /* The transport goes before the pool: its registration of the pool
     * memory ends first. */
    kvf_xfer_destroy(d->xfer);
    close_engine(d);
    free_config(d);
    free(d);
}
