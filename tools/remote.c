/* kvf generate --router: one generation through a router's client socket.
 * See remote.h. */
#include "remote.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvf/clientsock.h"
#include "kvf/clock.h"
#include "kvf/log.h"

/* Sends the GenerateRequest of req as client request my_id. */
static kvf_status_t send_request(kvf_client_t *client, const kvf_remote_generate_t *req,
                                 uint64_t my_id, int timeout_ms)
{
    Kvf__Sampling s = KVF__SAMPLING__INIT;
    s.temperature = req->temperature;
    s.top_p = req->top_p;
    s.top_k = req->top_k;
    s.seed = req->seed;
    s.has_seed = req->has_seed;
    s.max_tokens = req->max_tokens;
    s.ignore_eos = req->ignore_eos;
    s.stop = (char **)req->stop;
    s.n_stop = req->n_stop;
    kvf_client_generate_t g = {.client_req_id = my_id,
                               .prompt = req->prompt,
                               .ids = req->ids,
                               .n_ids = req->n_ids,
                               .sampling = &s};
    return kvf_client_generate(client, "kvf-generate", &g, timeout_ms);
}

static const char *finish_name(Kvf__FinishReason r)
{
    return r == KVF__FINISH_REASON__FINISH_STOP        ? "stop"
           : r == KVF__FINISH_REASON__FINISH_LENGTH    ? "length"
           : r == KVF__FINISH_REASON__FINISH_CANCELLED ? "cancelled"
                                                       : "error";
}

/* Where a stream stands: what the client saw, and when. */
typedef struct {
    uint64_t t0;      /* the request sent, ns */
    uint64_t t_first; /* the first token arrived, ns; 0 before */
    size_t n_tokens;
    uint32_t next_seq;
} stream_t;

/* --verbose: the timings of the finished stream on stderr. */
static void print_timings(const stream_t *s, const Kvf__GenerateChunk *c)
{
    size_t n_tokens = s->n_tokens;
    double total_s = (double)(kvf_clock_ns() - s->t0) / 1e9;
    double decode_s = s->t_first ? (double)(kvf_clock_ns() - s->t_first) / 1e9 : 0;
    fprintf(stderr,
            "ttft %.1f ms (router %.1f ms), prefill compute %.1f ms, kv handoff "
            "after last layer %.2f ms, kv shipped %llu bytes, %zu tokens in %.3f s, "
            "time per output token %.2f ms (%.1f tokens/s), finish %s\n",
            s->t_first ? (double)(s->t_first - s->t0) / 1e6 : 0.0, (double)c->ttft_us / 1e3,
            (double)c->prefill_compute_us / 1e3, (double)c->handoff_us / 1e3,
            (unsigned long long)c->kv_bytes, n_tokens, total_s,
            n_tokens > 1 ? decode_s * 1e3 / (double)(n_tokens - 1) : 0.0,
            n_tokens > 1 && decode_s > 0 ? (double)(n_tokens - 1) / decode_s : 0.0,
            finish_name(c->finish_reason));
}

/* Prints one chunk of the stream. Returns -1 while the stream goes on,
 * else the exit code it ended with. */
static int on_chunk(const kvf_remote_generate_t *req, stream_t *s, const Kvf__GenerateChunk *c)
{
    if (c->seq != s->next_seq)
        fprintf(stderr, "kvf generate: chunk %u arrived, expected %u\n", c->seq, s->next_seq);
    s->next_seq = c->seq + 1;
    if (c->n_tokens && !s->t_first)
        s->t_first = kvf_clock_ns();
    for (size_t i = 0; i < c->n_tokens; i++) {
        if (req->print_ids)
            printf("%s%u", s->n_tokens ? "," : "", c->tokens[i]);
        s->n_tokens++;
    }
    if (!req->print_ids && c->text.len)
        fwrite(c->text.data, 1, c->text.len, stdout); /* it may hold U+0000 */
    fflush(stdout);
    if (c->finish_reason == KVF__FINISH_REASON__FINISH_NONE)
        return -1;
    if (req->print_ids || s->n_tokens)
        printf("\n");
    fflush(stdout);
    int rc = 0;
    if (c->finish_reason == KVF__FINISH_REASON__FINISH_ERROR) {
        fprintf(stderr, "kvf generate: %s (%s)\n", c->error,
                kvf_status_str((kvf_status_t)c->status));
        rc = 1;
    }
    if (req->verbose)
        print_timings(s, c);
    return rc;
}

int kvf_remote_generate(const kvf_remote_generate_t *req)
{
    kvf_client_t *client;
    if (kvf_client_create(req->router_url, &client) != KVF_OK) {
        fprintf(stderr, "kvf generate: cannot connect to %s\n", req->router_url);
        return 1;
    }
    uint64_t my_id = kvf_clock_ns();
    int timeout = req->timeout_ms > 0 ? req->timeout_ms : 120000;
    stream_t s = {.t0 = kvf_clock_ns()};
    if (send_request(client, req, my_id, timeout) != KVF_OK) {
        fprintf(stderr, "kvf generate: router at %s does not answer\n", req->router_url);
        kvf_client_destroy(client);
        return 1;
    }
    int rc = -1;
    while (rc < 0) {
        kvf_envelope_t *in = NULL;
        kvf_status_t st = kvf_client_recv(client, timeout, &in);
        if (st == KVF_ERR_TIMEOUT) {
            fprintf(stderr, "kvf generate: no answer from the router for %d ms\n", timeout);
            rc = 1;
            break;
        }
        if (st != KVF_OK)
            continue; /* a malformed reply: dropped */
        if (in->body_case == KVF__ENVELOPE__BODY_GENERATE_CHUNK &&
            in->generate_chunk->client_req_id == my_id)
            rc = on_chunk(req, &s, in->generate_chunk);
        kvf_envelope_free(in);
    }
    kvf_client_destroy(client);
    return rc;
}
