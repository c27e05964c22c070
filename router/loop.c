/* The router's event loop: node and client messages, work posted by other
 * threads, timers; and the router's lifecycle. See router_internal.h. */
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include "kvf/clock.h"
#include "kvf/log.h"
#include "metrics.h"
#include "router_internal.h"

/* Messages taken from one socket before the loop looks at the others. */
#define LOOP_BURST 256

/* ---- work from other threads ------------------------------------------------ */

struct kvf_posted {
    void (*fn)(kvf_router_t *, void *);
    void *arg;
    kvf_posted_t *next;
};

kvf_status_t kvf_router_post(kvf_router_t *r, void (*fn)(kvf_router_t *, void *), void *arg)
{
    kvf_posted_t *p = malloc(sizeof(*p));
    if (!p)
        return KVF_ERR_NOMEM;
    p->fn = fn;
    p->arg = arg;
    p->next = NULL;
    pthread_mutex_lock(&r->post_lock);
    if (r->posted_tail)
        r->posted_tail->next = p;
    else
        r->posted = p;
    r->posted_tail = p;
    pthread_mutex_unlock(&r->post_lock);
    uint64_t one = 1;
    ssize_t w = write(r->post_fd, &one, sizeof(one));
    (void)w; /* the counter saturating still leaves the fd readable */
    return KVF_OK;
}

static void run_posted(kvf_router_t *r)
{
    uint64_t count;
    ssize_t rd = read(r->post_fd, &count, sizeof(count));
    (void)rd;
    pthread_mutex_lock(&r->post_lock);
    kvf_posted_t *p = r->posted;
    r->posted = r->posted_tail = NULL;
    pthread_mutex_unlock(&r->post_lock);
    while (p) {
        kvf_posted_t *next = p->next;
        p->fn(r, p->arg);
        free(p);
        p = next;
    }
}

/* ---- messages ------------------------------------------------------------------ */

static void handle_node_message(kvf_router_t *r, kvf_envelope_t *env)
{
    switch (env->body_case) {
    case KVF__ENVELOPE__BODY_REGISTER:
        kvf_router__on_register(r, env->register_);
        break;
    case KVF__ENVELOPE__BODY_HEARTBEAT:
        kvf_router__on_heartbeat(r, env->heartbeat);
        break;
    case KVF__ENVELOPE__BODY_DEREGISTER:
        kvf_router__on_deregister(r, env->deregister);
        break;
    case KVF__ENVELOPE__BODY_PREFILL_DONE:
        kvf_router__on_prefill_done(r, env->prefill_done);
        break;
    case KVF__ENVELOPE__BODY_TOKEN_CHUNK:
        kvf_router__on_token_chunk(r, env->token_chunk);
        break;
    case KVF__ENVELOPE__BODY_TOKEN_BATCH:
        for (size_t i = 0; i < env->token_batch->n_chunks; i++)
            kvf_router__on_token_chunk(r, env->token_batch->chunks[i]);
        break;
    case KVF__ENVELOPE__BODY_ERROR:
        kvf_router__on_error(r, env->error, env->sender);
        break;
    default:
        r->count.malformed++;
        kvf_log_warn("unexpected %s from %s dropped", kvf_envelope_body_name(env), env->sender);
    }
}

static void recv_nodes(kvf_router_t *r)
{
    for (int burst = 0; burst < LOOP_BURST; burst++) {
        kvf_envelope_t *env = NULL;
        kvf_status_t st = kvf_inbox_recv(r->inbox, 0, &env);
        if (st == KVF_ERR_AGAIN)
            break;
        if (st != KVF_OK) {
            r->count.malformed++;
            continue;
        }
        handle_node_message(r, env);
        kvf_envelope_free(env);
    }
}

static void recv_clients(kvf_router_t *r)
{
    for (int burst = 0; burst < LOOP_BURST; burst++) {
        kvf_envelope_t *env = NULL;
        kvf_client_hdr_t hdr;
        kvf_status_t st = kvf_client_server_recv(r->clients, &env, &hdr);
        if (st == KVF_ERR_AGAIN)
            break;
        if (st != KVF_OK) {
            r->count.malformed++;
            continue;
        }
        kvf_router__handle_client_message(r, env, &hdr);
        kvf_envelope_free(env);
    }
}

static void check_timers(kvf_router_t *r)
{
    kvf_router__check_liveness(r, kvf_clock_ns());
    /* Re-dispatching above stamps requests with a newer time than now. */
    kvf_router__check_deadlines(r, kvf_clock_ns());
}

kvf_status_t kvf_router_run(kvf_router_t *r, volatile sig_atomic_t *stop)
{
    kvf_log_info("serving: nodes at %s, clients at %s", r->cfg.listen_url, r->cfg.client_url);
    uint64_t next_timer = 0;
    while (!*stop) {
        struct pollfd fds[3] = {
            {.fd = kvf_inbox_fd(r->inbox), .events = POLLIN},
            {.fd = kvf_client_server_fd(r->clients), .events = POLLIN},
            {.fd = r->post_fd, .events = POLLIN},
        };
        int rc = poll(fds, 3, 50);
        if (rc > 0 && (fds[2].revents & POLLIN))
            run_posted(r);
        recv_nodes(r);
        recv_clients(r);
        uint64_t now = kvf_clock_ns();
        if (now >= next_timer) {
            check_timers(r);
            next_timer = now + 100000000ull;
        }
    }
    kvf_log_info("stopping: %llu requests served, %llu failed, %llu cancelled, %llu stale "
                 "messages dropped",
                 (unsigned long long)r->count.completed, (unsigned long long)r->count.failed,
                 (unsigned long long)r->count.cancelled, (unsigned long long)r->count.stale);
    return KVF_OK;
}

/* ---- accessors --------------------------------------------------------------------- */

const kvf_model_config_t *kvf_router_model(const kvf_router_t *r)
{
    return &r->model;
}

const kvf_tokenizer_t *kvf_router_tokenizer(const kvf_router_t *r)
{
    return r->tok;
}

const char *kvf_router_model_dir(const kvf_router_t *r)
{
    return r->cfg.model_dir;
}

kvf_metrics_t *kvf_router_metrics(kvf_router_t *r)
{
    return r->metrics;
}

/* ---- lifecycle --------------------------------------------------------------------- */

static void config_defaults(kvf_router_config_t *cfg)
{
    if (!cfg->heartbeat_ms)
        cfg->heartbeat_ms = 500;
    if (!cfg->dead_after_missed)
        cfg->dead_after_missed = 3;
    if (!cfg->max_attempts)
        cfg->max_attempts = 5;
    if (!cfg->default_max_tokens)
        cfg->default_max_tokens = 256;
    if (!cfg->prefill_timeout_ms)
        cfg->prefill_timeout_ms = 60000;
    if (!cfg->stall_timeout_ms)
        cfg->stall_timeout_ms = 30000;
}

kvf_status_t kvf_router_create(const kvf_router_config_t *cfg, kvf_router_t **router_p)
{
    kvf_router_t *r = calloc(1, sizeof(*r));
    if (!r)
        return KVF_ERR_NOMEM;
    r->cfg = *cfg;
    config_defaults(&r->cfg);
    r->next_req_id = 1;
    if (getrandom(&r->seed_state, sizeof(r->seed_state), GRND_NONBLOCK) !=
        (ssize_t)sizeof(r->seed_state))
        r->seed_state = kvf_clock_ns() ^ ((uint64_t)getpid() << 32);
    r->post_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (r->post_fd < 0) {
        free(r);
        return KVF_ERR_IO;
    }
    pthread_mutex_init(&r->post_lock, NULL);
    kvf_status_t st = kvf_model_config_load(cfg->model_dir, &r->model);
    if (st != KVF_OK)
        goto fail_model;
    st = kvf_tokenizer_load(cfg->model_dir, &r->tok);
    if (st != KVF_OK)
        goto fail_model;
    st = kvf_inbox_create(cfg->listen_url, 0, &r->inbox);
    if (st != KVF_OK)
        goto fail_inbox;
    st = kvf_client_server_create(cfg->client_url, &r->clients);
    if (st != KVF_OK)
        goto fail_clients;
    st = kvf_outboxes_create(ROUTER_MAX_NODES, &r->outboxes);
    if (st != KVF_OK)
        goto fail_outboxes;
    st = kvf_metrics_create(&r->metrics);
    if (st != KVF_OK)
        goto fail_metrics;
    *router_p = r;
    return KVF_OK;
fail_metrics:
    kvf_outboxes_destroy(r->outboxes);
fail_outboxes:
    kvf_client_server_destroy(r->clients);
fail_clients:
    kvf_inbox_destroy(r->inbox);
fail_inbox:
    kvf_tokenizer_destroy(r->tok);
fail_model:
    pthread_mutex_destroy(&r->post_lock);
    close(r->post_fd);
    free(r);
    return st;
}

void kvf_router_destroy(kvf_router_t *r)
{
    if (!r)
        return;
    kvf_router__requests_fini(r);
    kvf_router__natives_fini(r);
    while (r->posted) {
        kvf_posted_t *p = r->posted;
        r->posted = p->next;
        free(p);
    }
    pthread_mutex_destroy(&r->post_lock);
    if (r->post_fd >= 0)
        close(r->post_fd);
    kvf_router__registry_fini(r);
    kvf_outboxes_destroy(r->outboxes);
    kvf_client_server_destroy(r->clients);
    kvf_inbox_destroy(r->inbox);
    kvf_tokenizer_destroy(r->tok);
    kvf_metrics_destroy(r->metrics);
    free(r);
}
