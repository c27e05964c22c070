/* One run of the multiturn trace against a router's native client socket,
 * and what it measured. See serve_multiturn.h. */
#include "serve_multiturn.h"
#include "bench_util.h"

#include "kvf/clientsock.h"
#include "kvf/clock.h"
#include "kvf/msg.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One turn of one conversation in this run. */
typedef struct {
    uint32_t *prompt; /* (n_prompt) built when the turn is sent */
    uint32_t n_prompt;
    uint32_t *answer; /* (max_tokens) the tokens streamed back */
    uint32_t n_answer;
    uint64_t t_sent, t_first, t_last, t_done; /* ns */
    int finish;                               /* -1 while running or unsent */
    bool sent;
    uint32_t cached_tokens, ideal_cached;
    uint64_t kv_bytes;
    bool local_prefill;
} mt_req_t;

typedef struct {
    uint32_t next_turn; /* the next one to send */
    uint64_t due_ns;    /* when it may be sent */
    bool in_flight, ended;
} mt_conv_t;

typedef struct {
    kvf_client_t *client;
    const kvf_multiturn_trace_t *t;
    const kvf_multiturn_run_opts_t *o;
    mt_req_t *reqs;   /* (n_conv * n_turns) conversation-major */
    mt_conv_t *convs; /* (n_conv) */
    /* The requests in send order, for the ideal hit. */
    size_t *sent_order;
    const uint32_t **sent_prompts;
    uint32_t *sent_lens;
    size_t n_sent, n_ended;
    uint64_t base_id, t0;
} mt_driver_t;

/* The router's counters, to take the run's deltas. */
typedef struct {
    uint64_t computed, cached, kv_bytes, local, pulled;
    bool ok;
} mt_counters_t;

static mt_counters_t read_counters(kvf_client_t *c)
{
    mt_counters_t k = {0};
    kvf_envelope_t *in;
    if (kvf_client_stats(c, "bench-serve", 5000, &in) != KVF_OK)
        return k;
    const Kvf__StatsReply *s = in->stats_reply;
    k = (mt_counters_t){s->prefill_tokens_computed, s->prefill_tokens_cached, s->kv_bytes_shipped,
                        s->local_prefills, s->kv_bytes_pulled, true};
    kvf_envelope_free(in);
    return k;
}

static void end_conversation(mt_driver_t *d, mt_conv_t *c)
{
    if (!c->ended) {
        c->ended = true;
        d->n_ended++;
    }
}

/* Builds conversation ci's next turn from the answers before it and sends
 * it. A turn that cannot be sent ends its conversation. */
static void send_turn(mt_driver_t *d, uint32_t ci)
{
    mt_conv_t *c = &d->convs[ci];
    uint32_t turn = c->next_turn;
    size_t base = (size_t)ci * d->t->n_turns;
    mt_req_t *q = &d->reqs[base + turn];
    const uint32_t *answers[turn + 1];
    uint32_t n_answers[turn + 1];
    for (uint32_t k = 0; k < turn; k++) {
        answers[k] = d->reqs[base + k].answer;
        n_answers[k] = d->reqs[base + k].n_answer;
    }
    if (kvf_multiturn_trace_prompt(d->t, ci, turn, answers, n_answers, &q->prompt, &q->n_prompt) !=
        KVF_OK) {
        end_conversation(d, c);
        return;
    }
    d->sent_order[d->n_sent] = base + turn;
    d->sent_prompts[d->n_sent] = q->prompt;
    d->sent_lens[d->n_sent++] = q->n_prompt;
    Kvf__Sampling s = KVF__SAMPLING__INIT;
    s.temperature = 0; /* greedy: the same answers, so the same next prompts, on every run */
    s.max_tokens = kvf_multiturn_trace_turn(d->t, ci, turn)->max_tokens;
    s.ignore_eos = true;
    kvf_client_generate_t g = {.client_req_id = d->base_id + base + turn,
                               .ids = q->prompt,
                               .n_ids = q->n_prompt,
                               .sampling = &s};
    q->sent = true;
    q->t_sent = kvf_clock_ns();
    c->next_turn++;
    if (kvf_client_generate(d->client, "bench-serve", &g, 5000) != KVF_OK) {
        q->finish = KVF__FINISH_REASON__FINISH_ERROR;
        end_conversation(d, c);
        return;
    }
    c->in_flight = true;
}

/* A streamed chunk: its tokens, and at the end of a turn the next turn's
 * due time (or the end of the conversation). */
static void on_chunk(mt_driver_t *d, const Kvf__GenerateChunk *ch)
{
    uint64_t idx = ch->client_req_id - d->base_id;
    size_t n_req = (size_t)d->t->n_conv * d->t->n_turns;
    if (ch->client_req_id < d->base_id || idx >= n_req || !d->reqs[idx].sent ||
        d->reqs[idx].finish >= 0)
        return;
    mt_req_t *q = &d->reqs[idx];
    uint32_t ci = (uint32_t)(idx / d->t->n_turns), turn = (uint32_t)(idx % d->t->n_turns);
    const kvf_multiturn_turn_t *u = kvf_multiturn_trace_turn(d->t, ci, turn);
    uint64_t now = kvf_clock_ns();
    if (ch->n_tokens) {
        if (!q->t_first)
            q->t_first = now;
        q->t_last = now;
        for (size_t k = 0; k < ch->n_tokens && q->n_answer < u->max_tokens; k++)
            q->answer[q->n_answer++] = ch->tokens[k];
    }
    if (ch->finish_reason == KVF__FINISH_REASON__FINISH_NONE)
        return;
    q->finish = ch->finish_reason;
    q->t_done = now;
    q->cached_tokens = ch->cached_tokens;
    q->kv_bytes = ch->kv_bytes;
    q->local_prefill = ch->local_prefill;
    mt_conv_t *c = &d->convs[ci];
    c->in_flight = false;
    bool ok = q->finish == KVF__FINISH_REASON__FINISH_STOP ||
              q->finish == KVF__FINISH_REASON__FINISH_LENGTH;
    if (!ok || c->next_turn >= d->t->n_turns) {
        end_conversation(d, c);
        return;
    }
    double gap = kvf_multiturn_trace_turn(d->t, ci, c->next_turn)->gap;
    c->due_ns = now + (uint64_t)(gap * d->o->think_ms * 1e6);
}

/* Sends every turn that is due, then waits for one reply: until the next
 * due turn, 20 ms at most. */
static void drive_once(mt_driver_t *d, bool stopping)
{
    uint64_t now = kvf_clock_ns();
    int wait_ms = 20;
    for (uint32_t ci = 0; ci < d->t->n_conv; ci++) {
        mt_conv_t *c = &d->convs[ci];
        if (c->ended || c->in_flight)
            continue;
        if (stopping) {
            end_conversation(d, c);
            continue;
        }
        if (now >= c->due_ns)
            send_turn(d, ci);
        else {
            int until = kvf_clock_ms_until(c->due_ns);
            wait_ms = until < wait_ms ? until : wait_ms;
        }
    }
    if (d->n_ended == d->t->n_conv)
        return;
    kvf_envelope_t *in = NULL;
    if (kvf_client_recv(d->client, wait_ms, &in) != KVF_OK)
        return;
    if (in->body_case == KVF__ENVELOPE__BODY_GENERATE_CHUNK)
        on_chunk(d, in->generate_chunk);
    kvf_envelope_free(in);
}

static uint64_t fnv1a(uint64_t h, const uint32_t *v, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        for (int b = 0; b < 4; b++) {
            h ^= (v[i] >> (8 * b)) & 0xff;
            h *= 0x100000001b3ull;
        }
    }
    h ^= n; /* the length ends each part: no two splits of one stream alike */
    return h * 0x100000001b3ull;
}

/* Each request's ideal hit against the prompts sent before it: after the
 * run, since it compares every pair of prompts (up to their common
 * prefix). */
static void ideal_hits(mt_driver_t *d)
{
    for (size_t j = 0; j < d->n_sent; j++) {
        mt_req_t *q = &d->reqs[d->sent_order[j]];
        q->ideal_cached =
            kvf_multiturn_ideal_cached(q->prompt, q->n_prompt, d->sent_prompts, d->sent_lens, j);
    }
}

/* The counts, sums and the digest over the requests. */
static void sum_requests(const mt_driver_t *d, kvf_multiturn_result_t *res, double *ttft,
                         size_t *n_ttft_p, double *short_ttft, size_t *n_short_p)
{
    size_t n_ttft = 0, n_short = 0, n_good = 0;
    uint64_t t_end = d->t0, digest = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < res->n_requests; i++) {
        const mt_req_t *q = &d->reqs[i];
        if (!q->sent)
            continue;
        res->n_sent++;
        digest = fnv1a(fnv1a(digest, q->prompt, q->n_prompt), q->answer, q->n_answer);
        if (q->finish != KVF__FINISH_REASON__FINISH_STOP &&
            q->finish != KVF__FINISH_REASON__FINISH_LENGTH)
            continue;
        res->n_ok++;
        res->prompt_tokens += q->n_prompt;
        res->cached_tokens += q->cached_tokens;
        res->ideal_cached += q->ideal_cached;
        uint32_t cached = q->cached_tokens < q->n_prompt ? q->cached_tokens : q->n_prompt;
        res->prefill_computed += q->n_prompt - cached;
        res->kv_bytes += q->kv_bytes;
        res->local_prefills += q->local_prefill;
        if (q->t_done > t_end)
            t_end = q->t_done;
        if (!q->t_first)
            continue; /* no token came: no latency to count */
        double f = (double)(q->t_first - q->t_sent) / 1e6;
        double tpot =
            q->n_answer > 1 ? (double)(q->t_last - q->t_first) / 1e6 / (q->n_answer - 1) : 0;
        ttft[n_ttft++] = f;
        if (i % d->t->n_turns >= 1 && q->n_prompt - q->ideal_cached <= d->o->short_tokens)
            short_ttft[n_short++] = f;
        n_good += f <= d->o->slo_ttft_ms && tpot <= d->o->slo_tpot_ms;
    }
    res->n_failed = res->n_sent - res->n_ok;
    res->digest = digest;
    res->duration_s = (double)(t_end - d->t0) / 1e9;
    res->req_per_s = res->duration_s > 0 ? (double)res->n_ok / res->duration_s : 0;
    res->goodput = res->duration_s > 0 ? (double)n_good / res->duration_s : 0;
    *n_ttft_p = n_ttft;
    *n_short_p = n_short;
}

/* Fills res from the requests, and the router's counters when it kept
 * them (else the sums of the final chunks stay). */
static int summarize(mt_driver_t *d, const mt_counters_t *before, const mt_counters_t *after,
                     kvf_multiturn_result_t *res)
{
    res->n_requests = (size_t)d->t->n_conv * d->t->n_turns;
    double *ttft = calloc(res->n_requests + 1, sizeof(double));
    double *short_ttft = calloc(res->n_requests + 1, sizeof(double));
    if (!ttft || !short_ttft) {
        free(ttft);
        free(short_ttft);
        return -1;
    }
    size_t n_ttft, n_short;
    ideal_hits(d);
    sum_requests(d, res, ttft, &n_ttft, short_ttft, &n_short);
    double p[3];
    kvf_bench_percentiles(ttft, n_ttft, p);
    res->ttft_p50 = p[0];
    res->ttft_p99 = p[2];
    kvf_bench_percentiles(short_ttft, n_short, p);
    res->short_ttft_p50 = p[0];
    res->n_short = n_short;
    free(ttft);
    free(short_ttft);
    /* A router that keeps the counters has counted every prompt token of
     * the run as computed or cached. */
    if (before->ok && after->ok &&
        after->computed + after->cached > before->computed + before->cached) {
        res->from_stats = true;
        res->prefill_computed = after->computed - before->computed;
        res->kv_bytes = after->kv_bytes - before->kv_bytes;
        res->local_prefills = after->local - before->local;
        res->kv_pulled = after->pulled - before->pulled;
    }
    res->hit_rate = res->prompt_tokens ? (double)res->cached_tokens / res->prompt_tokens : 0;
    res->ideal_rate = res->prompt_tokens ? (double)res->ideal_cached / res->prompt_tokens : 0;
    return 0;
}

/* The requests' buffers and the conversations' start times. */
static kvf_status_t driver_init(mt_driver_t *d, const kvf_multiturn_trace_t *t,
                                const kvf_multiturn_run_opts_t *o)
{
    size_t n = (size_t)t->n_conv * t->n_turns;
    *d = (mt_driver_t){.t = t, .o = o};
    d->reqs = calloc(n, sizeof(*d->reqs));
    d->convs = calloc(t->n_conv, sizeof(*d->convs));
    d->sent_prompts = calloc(n, sizeof(*d->sent_prompts));
    d->sent_lens = calloc(n, sizeof(*d->sent_lens));
    d->sent_order = calloc(n, sizeof(*d->sent_order));
    if (!d->reqs || !d->convs || !d->sent_prompts || !d->sent_lens || !d->sent_order)
        return KVF_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        d->reqs[i].finish = -1;
        d->reqs[i].answer = malloc((t->turns[i].max_tokens + 1) * sizeof(uint32_t));
        if (!d->reqs[i].answer)
            return KVF_ERR_NOMEM;
    }
    d->t0 = kvf_clock_ns();
    d->base_id = d->t0;
    double at = 0;
    for (uint32_t ci = 0; ci < t->n_conv; ci++) {
        at += kvf_multiturn_trace_turn(t, ci, 0)->gap / o->rate;
        d->convs[ci].due_ns = d->t0 + (uint64_t)(at * 1e9);
    }
    return KVF_OK;
}

static void driver_fini(mt_driver_t *d)
{
    for (size_t i = 0; d->reqs && i < (size_t)d->t->n_conv * d->t->n_turns; i++) {
        free(d->reqs[i].prompt);
        free(d->reqs[i].answer);
    }
    free(d->reqs);
    free(d->convs);
    free(d->sent_prompts);
    free(d->sent_lens);
    free(d->sent_order);
}

int kvf_multiturn_run(const char *client_url, const kvf_multiturn_trace_t *t,
                      const kvf_multiturn_run_opts_t *o, volatile sig_atomic_t *stop,
                      kvf_multiturn_result_t *res)
{
    mt_driver_t d;
    int rc = 1;
    if (driver_init(&d, t, o) != KVF_OK) {
        fprintf(stderr, "bench serve: out of memory\n");
        goto out;
    }
    if (kvf_client_create(client_url, &d.client) != KVF_OK) {
        fprintf(stderr, "bench serve: cannot connect to %s\n", client_url);
        goto out;
    }
    mt_counters_t before = read_counters(d.client);
    d.t0 = kvf_clock_ns(); /* the conversations' start times count from here */
    for (uint32_t ci = 0; ci < t->n_conv; ci++)
        d.convs[ci].due_ns += d.t0 - d.base_id;
    uint64_t deadline = d.t0 + (uint64_t)o->timeout_s * 1000000000ull;
    bool said_stop = false;
    while (d.n_ended < t->n_conv && kvf_clock_ns() < deadline) {
        if (*stop && !said_stop) {
            fprintf(stderr, "bench serve: stopped by a signal; sending no more turns\n");
            said_stop = true;
        }
        drive_once(&d, *stop != 0);
    }
    if (d.n_ended < t->n_conv)
        fprintf(stderr, "bench serve: the run timed out after %d s\n", o->timeout_s);
    mt_counters_t after = read_counters(d.client);
    kvf_client_destroy(d.client);
    if (summarize(&d, &before, &after, res) != 0)
        goto out;
    rc = res->n_ok == res->n_requests ? 0 : 1;
out:
    driver_fini(&d);
    return rc;
}
