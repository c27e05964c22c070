#include "remote.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvf/clientsock.h"
#include "kvf/clock.h"
#include "kvf/log.h"

int kvf_remote_generate(const kvf_remote_generate_t *req)
{
    kvf_client_t *client;
    if (kvf_client_create(req->router_url, &client) != KVF_OK) {
        fprintf(stderr, "kvf generate: cannot connect to %s\n", req->router_url);
        return 1;
    }
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
    Kvf__GenerateRequest g = KVF__GENERATE_REQUEST__INIT;
    uint64_t my_id = kvf_clock_ns();
    g.client_req_id = my_id;
    g.prompt = (char *)(req->prompt ? req->prompt : "");
    g.prompt_ids = (uint32_t *)req->ids;
    g.n_prompt_ids = req->n_ids;
    g.sampling = &s;
    kvf_envelope_t env;
    kvf_envelope_init(&env, "kvf-generate");
    env.body_case = KVF__ENVELOPE__BODY_GENERATE_REQUEST;
    env.generate_request = &g;
    int timeout = req->timeout_ms > 0 ? req->timeout_ms : 120000;
    uint64_t t0 = kvf_clock_ns();
    if (kvf_client_send(client, &env, timeout) != KVF_OK) {
        fprintf(stderr, "kvf generate: router at %s does not answer\n", req->router_url);
        kvf_client_destroy(client);
        return 1;
    }
    int rc = 1;
    size_t n_tokens = 0;
    uint64_t t_first = 0;
    uint32_t next_seq = 0;
    for (;;) {
        kvf_envelope_t *in = NULL;
        kvf_status_t st = kvf_client_recv(client, timeout, &in);
        if (st == KVF_ERR_TIMEOUT) {
            fprintf(stderr, "kvf generate: no answer from the router for %d ms\n", timeout);
            break;
        }
        if (st != KVF_OK)
            continue; /* a malformed reply: dropped */
        if (in->body_case != KVF__ENVELOPE__BODY_GENERATE_CHUNK ||
            in->generate_chunk->client_req_id != my_id) {
            kvf_envelope_free(in);
            continue;
        }
        const Kvf__GenerateChunk *c = in->generate_chunk;
        if (c->seq != next_seq)
            fprintf(stderr, "kvf generate: chunk %u arrived, expected %u\n", c->seq, next_seq);
        next_seq = c->seq + 1;
        if (c->n_tokens && !t_first)
            t_first = kvf_clock_ns();
        for (size_t i = 0; i < c->n_tokens; i++) {
            if (req->print_ids)
                printf("%s%u", n_tokens ? "," : "", c->tokens[i]);
            n_tokens++;
        }
        if (!req->print_ids && c->text && *c->text)
            fputs(c->text, stdout);
        fflush(stdout);
        if (c->finish_reason != KVF__FINISH_REASON__FINISH_NONE) {
            if (req->print_ids || n_tokens)
                printf("\n");
            fflush(stdout);
            if (c->finish_reason == KVF__FINISH_REASON__FINISH_ERROR) {
                fprintf(stderr, "kvf generate: %s (%s)\n", c->error,
                        kvf_status_str((kvf_status_t)c->status));
            } else {
                rc = 0;
            }
            if (req->verbose) {
                double total_s = (double)(kvf_clock_ns() - t0) / 1e9;
                double decode_s = t_first ? (double)(kvf_clock_ns() - t_first) / 1e9 : 0;
                fprintf(stderr,
                        "ttft %.1f ms (router %.1f ms), prefill compute %.1f ms, kv handoff "
                        "after last layer %.2f ms, kv shipped %llu bytes, %zu tokens in %.3f s, "
                        "time per output token %.2f ms (%.1f tokens/s), finish %s\n",
                        t_first ? (double)(t_first - t0) / 1e6 : 0.0, (double)c->ttft_us / 1e3,
                        (double)c->prefill_compute_us / 1e3, (double)c->handoff_us / 1e3,
                        (unsigned long long)c->kv_bytes, n_tokens, total_s,
                        n_tokens > 1 ? decode_s * 1e3 / (double)(n_tokens - 1) : 0.0,
                        n_tokens > 1 && decode_s > 0 ? (double)(n_tokens - 1) / decode_s : 0.0,
                        c->finish_reason == KVF__FINISH_REASON__FINISH_STOP     ? "stop"
                        : c->finish_reason == KVF__FINISH_REASON__FINISH_LENGTH ? "length"
                        : c->finish_reason == KVF__FINISH_REASON__FINISH_CANCELLED
                            ? "cancelled"
                            : "error");
            }
            kvf_envelope_free(in);
            break;
        }
        kvf_envelope_free(in);
    }
    kvf_client_destroy(client);
    return rc;
}
