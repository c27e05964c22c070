/* The soak's load: requests kept in flight for the whole run, native
 * (the router's client socket, one socket for every stream) and HTTP
 * (/v1/completions, streamed and whole), with prompts as ids or text from
 * the pool; beside them, abort-bound streams that the driver aborts
 * mid-stream (native: Cancel; HTTP: the socket closed after some events),
 * launched so that the aborts keep pace with the run's target. Every
 * request ends in exactly one outcome (soak.h); none is forgotten: one
 * with no output for stall_s, or still running drain_bound_s after the
 * run, is LOST. One thread (main) runs all of it from a poll loop. */
#include <cjson/cJSON.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvf/array.h"
#include "kvf/clientsock.h"
#include "kvf/clock.h"
#include "kvf/log.h"
#include "kvf/msg.h"
#include "soak.h"
#include "soak_http.h"

#define LOAD_SLOTS            64
#define LOAD_POLL_MS          3
#define LOAD_HTTP_ABORT_MAX   6 /* an HTTP abort comes after 1..this many text events */
#define LOAD_NATIVE_ABORT_MAX 64

typedef struct {
    bool busy;
    bool abort_bound;
    kvf_soak_kind_t kind;
    int prompt;      /* pool index */
    int abort_after; /* native: tokens, HTTP: text events before the abort; -1: never */
    uint64_t id;     /* native client_req_id */
    uint64_t progress_ns;
    uint32_t *out; /* (n_out) native ids received */
    size_t n_out, cap_out;
    kvf_soak_buf_t text; /* text received */
    uint32_t next_seq;
    bool seq_ok, cancel_sent;
    int events;             /* HTTP: events with text */
    char finish[16];        /* HTTP: the finish_reason given */
    char error[200];        /* HTTP stream: the error event's message */
    long completion_tokens; /* HTTP usage; -1: none */
    kvf_soak_http_t http;
} load_req_t;

typedef struct {
    kvf_soak_t *s;
    kvf_client_t *client;
    load_req_t reqs[LOAD_SLOTS];
    int n_slots;
    uint64_t rng, next_id;
    unsigned steady_running, aborts_running, aborts_done;
} load_t;

#define LOAD_NOTES_LOGGED 300

/* text with every run of digits as one '#'. */
static void note_key(const char *text, char *key, size_t len)
{
    size_t k = 0;
    for (const char *c = text; *c && k + 1 < len; c++) {
        bool digit = *c >= '0' && *c <= '9';
        if (!digit)
            key[k++] = *c;
        else if (k == 0 || key[k - 1] != '#')
            key[k++] = '#';
    }
    key[k] = '\0';
}

void kvf_soak_note(kvf_soak_t *s, kvf_soak_kind_t kind, kvf_soak_outcome_t outcome, bool clear,
                   const char *fmt, ...)
{
    static const char *const outcome_names[KVF_SOAK_OUTCOMES] = {"same", "differs", "failed",
                                                                 "aborted", "lost"};
    kvf_soak_tally_t *t = &s->tally;
    char text[sizeof(t->notes[0].example)], key[sizeof(t->notes[0].key)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    if (t->notes_logged++ < LOAD_NOTES_LOGGED)
        fprintf(stderr, "soak: [%7.1f s] %s %s: %s\n", kvf_soak_elapsed_s(s),
                kvf_soak_kind_name(kind), outcome_names[outcome], text);
    if (outcome == KVF_SOAK_FAILED && !clear)
        t->unclear++;
    note_key(text, key, sizeof(key));
    for (int i = 0; i < t->n_notes; i++) {
        kvf_soak_note_t *n = &t->notes[i];
        if (n->kind == kind && n->outcome == outcome && !strcmp(n->key, key)) {
            n->count++;
            return;
        }
    }
    if (t->n_notes == KVF_SOAK_NOTES) {
        t->notes_dropped++;
        return;
    }
    kvf_soak_note_t *n = &t->notes[t->n_notes++];
    snprintf(n->key, sizeof(n->key), "%s", key);
    snprintf(n->example, sizeof(n->example), "%s", text);
    n->kind = kind;
    n->outcome = outcome;
    n->count = 1;
    n->clear = clear;
}

/* ---- outcomes ------------------------------------------------------------------ */

static void end_request(load_t *l, load_req_t *r, kvf_soak_outcome_t outcome)
{
    l->s->tally.n[r->kind][outcome]++;
    if (r->abort_bound)
        l->aborts_running--;
    else
        l->steady_running--;
    if (outcome == KVF_SOAK_ABORTED)
        l->aborts_done++;
    else if (r->abort_bound && (outcome == KVF_SOAK_SAME || outcome == KVF_SOAK_DIFF))
        l->s->tally.abort_misses++;
    kvf_soak_http_close(&r->http);
    kvf_soak_buf_free(&r->text);
    free(r->out);
    memset(r, 0, sizeof(*r));
}

static size_t common_ids(const uint32_t *a, size_t na, const uint32_t *b, size_t nb)
{
    size_t k = 0;
    while (k < na && k < nb && a[k] == b[k])
        k++;
    return k;
}

static size_t common_bytes(const char *a, size_t na, const char *b, size_t nb)
{
    size_t k = 0;
    while (k < na && k < nb && a[k] == b[k])
        k++;
    return k;
}

/* How the text received compares with the reference's, byte for byte
 * (U+0000 included): *equal_p whole, or (prefix) its start. Returns the
 * bytes in common. */
static size_t compare_text(const kvf_soak_prompt_t *p, const kvf_soak_buf_t *text, bool prefix,
                           bool *equal_p)
{
    size_t t = common_bytes(text->data, text->len, p->ref_text, p->n_ref_text);
    *equal_p = t == text->len && (prefix || t == p->n_ref_text);
    return t;
}

/* A request that finished: equal to its reference (ids on the native
 * path, text and token count over HTTP, finish reason length) or not. */
static void completed(load_t *l, load_req_t *r, bool length, long n_tokens)
{
    const kvf_soak_prompt_t *p = &l->s->pool[r->prompt];
    bool same_text;
    size_t t = compare_text(p, &r->text, false, &same_text);
    bool same = same_text && length && r->seq_ok && n_tokens == (long)p->n_ref;
    size_t k = 0;
    if (r->kind == KVF_SOAK_NATIVE) {
        k = common_ids(r->out, r->n_out, p->ref, p->n_ref);
        same = same && k == r->n_out && k == p->n_ref;
    }
    if (!same) {
        char ids[64] = "";
        if (r->kind == KVF_SOAK_NATIVE)
            snprintf(ids, sizeof(ids), "ids equal up to %zu, ", k);
        kvf_soak_note(l->s, r->kind, KVF_SOAK_DIFF, true,
                      "prompt %d (%zu tokens, max %u): %ld tokens (colocated %zu), %stext equal "
                      "up to byte %zu of %zu (received %zu), finish length %d, chunks in order %d",
                      r->prompt, p->n_ids, p->max_tokens, n_tokens, p->n_ref, ids, t, p->n_ref_text,
                      r->text.len, length, r->seq_ok);
    }
    end_request(l, r, same ? KVF_SOAK_SAME : KVF_SOAK_DIFF);
}

/* A request the driver aborted: what it received must be the start of its
 * reference. */
static void aborted(load_t *l, load_req_t *r)
{
    const kvf_soak_prompt_t *p = &l->s->pool[r->prompt];
    bool start_ok;
    size_t t = compare_text(p, &r->text, true, &start_ok);
    size_t k = common_ids(r->out, r->n_out, p->ref, p->n_ref);
    if (!start_ok || k != r->n_out || !r->seq_ok) {
        l->s->tally.bad_prefix++;
        kvf_soak_note(l->s, r->kind, KVF_SOAK_ABORTED, true,
                      "prompt %d: aborted after %zu tokens, %d text events, %zu bytes that are not "
                      "the start of the colocated output (ids equal up to %zu, bytes up to %zu, "
                      "chunks in order %d)",
                      r->prompt, r->n_out, r->events, r->text.len, k, t, r->seq_ok);
    }
    end_request(l, r, KVF_SOAK_ABORTED);
}

static void failed(load_t *l, load_req_t *r, bool clear, const char *what)
{
    kvf_soak_note(l->s, r->kind, KVF_SOAK_FAILED, clear, "%s", what);
    end_request(l, r, KVF_SOAK_FAILED);
}

static void lost(load_t *l, load_req_t *r, const char *why)
{
    kvf_soak_note(l->s, r->kind, KVF_SOAK_LOST, false, "%s", why);
    if (r->kind == KVF_SOAK_NATIVE && !r->cancel_sent)
        kvf_client_cancel(l->client, "soak", r->id, 100); /* so the router lets it go */
    end_request(l, r, KVF_SOAK_LOST);
}

/* ---- native ---------------------------------------------------------------------- */

static void native_send(load_t *l, load_req_t *r)
{
    const kvf_soak_prompt_t *p = &l->s->pool[r->prompt];
    Kvf__Sampling sp = KVF__SAMPLING__INIT;
    sp.temperature = 0;
    sp.max_tokens = p->max_tokens;
    sp.ignore_eos = true;
    kvf_client_generate_t g = {.client_req_id = r->id,
                               .prompt = p->text,
                               .ids = p->text ? NULL : p->ids,
                               .n_ids = p->text ? 0 : p->n_ids,
                               .sampling = &sp};
    kvf_status_t st = kvf_client_generate(l->client, "soak", &g, 2000);
    if (st != KVF_OK) {
        char why[96];
        snprintf(why, sizeof(why), "GenerateRequest not sent: %s", kvf_status_str(st));
        failed(l, r, true, why);
    }
}

static void native_finish(load_t *l, load_req_t *r, const Kvf__GenerateChunk *ch)
{
    char why[224];
    if (r->cancel_sent) {
        aborted(l, r);
        return;
    }
    switch (ch->finish_reason) {
    case KVF__FINISH_REASON__FINISH_LENGTH:
    case KVF__FINISH_REASON__FINISH_STOP:
        completed(l, r, ch->finish_reason == KVF__FINISH_REASON__FINISH_LENGTH, (long)r->n_out);
        return;
    case KVF__FINISH_REASON__FINISH_CANCELLED:
        snprintf(why, sizeof(why), "cancelled without a Cancel (status %d): %s", ch->status,
                 ch->error);
        failed(l, r, ch->error[0] != '\0', why);
        return;
    default:
        snprintf(why, sizeof(why), "FINISH_ERROR, status %d (%s): %s", ch->status,
                 kvf_status_str(ch->status), ch->error);
        failed(l, r, ch->error[0] != '\0', why);
    }
}

static load_req_t *native_find(load_t *l, uint64_t id)
{
    for (int i = 0; i < l->n_slots; i++)
        if (l->reqs[i].busy && l->reqs[i].kind == KVF_SOAK_NATIVE && l->reqs[i].id == id)
            return &l->reqs[i];
    return NULL; /* a late chunk of a request already given up */
}

static void native_chunk(load_t *l, const Kvf__GenerateChunk *ch)
{
    load_req_t *r = native_find(l, ch->client_req_id);
    if (!r)
        return;
    r->progress_ns = kvf_clock_ns();
    if (ch->seq != r->next_seq)
        r->seq_ok = false;
    r->next_seq = ch->seq + 1;
    if (kvf_array_reserve(&r->out, &r->cap_out, r->n_out + ch->n_tokens, 64, sizeof(*r->out)) !=
            KVF_OK ||
        kvf_soak_buf_append(&r->text, (const char *)ch->text.data, ch->text.len) != KVF_OK) {
        lost(l, r, "out of memory in the driver");
        return;
    }
    memcpy(r->out + r->n_out, ch->tokens, ch->n_tokens * sizeof(*r->out));
    r->n_out += ch->n_tokens;
    l->s->tally.native_tokens += ch->n_tokens;
    if (ch->finish_reason != KVF__FINISH_REASON__FINISH_NONE) {
        native_finish(l, r, ch);
    } else if (r->abort_after >= 0 && !r->cancel_sent && r->n_out >= (size_t)r->abort_after) {
        r->cancel_sent = true;
        kvf_status_t st = kvf_client_cancel(l->client, "soak", r->id, 2000);
        if (st != KVF_OK) {
            char why[96];
            snprintf(why, sizeof(why), "Cancel not sent: %s", kvf_status_str(st));
            lost(l, r, why);
        }
    }
}

/* Takes every reply the native socket holds, waiting up to wait_ms for
 * the first. */
static void native_drain(load_t *l, int wait_ms)
{
    kvf_envelope_t *in;
    while (kvf_client_recv(l->client, wait_ms, &in) == KVF_OK) {
        if (in->body_case == KVF__ENVELOPE__BODY_GENERATE_CHUNK)
            native_chunk(l, in->generate_chunk);
        kvf_envelope_free(in);
        wait_ms = 0;
    }
}

/* ---- HTTP ------------------------------------------------------------------------ */

static char *http_body(const kvf_soak_prompt_t *p, bool stream)
{
    cJSON *root = cJSON_CreateObject();
    if (p->text) {
        cJSON_AddStringToObject(root, "prompt", p->text);
    } else {
        cJSON *ids = cJSON_AddArrayToObject(root, "prompt");
        for (size_t i = 0; i < p->n_ids; i++)
            cJSON_AddItemToArray(ids, cJSON_CreateNumber(p->ids[i]));
    }
    cJSON_AddNumberToObject(root, "max_tokens", p->max_tokens);
    cJSON_AddNumberToObject(root, "temperature", 0);
    cJSON_AddBoolToObject(root, "ignore_eos", true);
    cJSON_AddBoolToObject(root, "stream", stream);
    if (stream)
        cJSON_AddBoolToObject(cJSON_AddObjectToObject(root, "stream_options"), "include_usage",
                              true);
    char *body = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return body;
}

static void http_send(load_t *l, load_req_t *r)
{
    char *body = http_body(&l->s->pool[r->prompt], r->kind == KVF_SOAK_HTTP_STREAM);
    char err[160];
    kvf_status_t st = body ? kvf_soak_http_post(&r->http, l->s->http_port, "/v1/completions", body,
                                                err, sizeof(err))
                           : KVF_ERR_NOMEM;
    free(body);
    if (st != KVF_OK) {
        char why[200];
        snprintf(why, sizeof(why), "request not sent: %s", st == KVF_ERR_NOMEM ? "no memory" : err);
        failed(l, r, true, why);
    }
}

/* choices[0]'s text and finish_reason, and usage.completion_tokens, of a
 * completion or one of its chunks (parsed by kvf_soak_json_parse). */
static bool http_take_choice(load_req_t *r, const cJSON *root)
{
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(root, "choices");
    const cJSON *c = cJSON_GetArrayItem(choices, 0);
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(c, "text");
    const cJSON *finish = cJSON_GetObjectItemCaseSensitive(c, "finish_reason");
    const cJSON *usage = cJSON_GetObjectItemCaseSensitive(root, "usage");
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(usage, "completion_tokens");
    if (cJSON_IsString(text) && text->valuestring[0]) {
        r->events++;
        if (kvf_soak_json_text(text, &r->text) != KVF_OK)
            return false;
    }
    if (cJSON_IsString(finish))
        snprintf(r->finish, sizeof(r->finish), "%s", finish->valuestring);
    if (cJSON_IsNumber(ct))
        r->completion_tokens = (long)ct->valuedouble;
    return true;
}

/* "type/code: message" of an OpenAI error object, or "" when root has none. */
static void http_error_text(const cJSON *root, char *out, size_t len)
{
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "error");
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(e, "message");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(e, "type");
    const cJSON *code = cJSON_GetObjectItemCaseSensitive(e, "code");
    out[0] = '\0';
    if (cJSON_IsString(msg) && msg->valuestring[0])
        snprintf(out, len, "%s/%s: %s", cJSON_IsString(type) ? type->valuestring : "-",
                 cJSON_IsString(code) ? code->valuestring : "-", msg->valuestring);
}

/* A response whose status is not 200: a failure, clear when its body is an
 * error object with a message. */
static void http_refused(load_t *l, load_req_t *r)
{
    cJSON *root = cJSON_Parse(r->http.body.data ? r->http.body.data : "");
    char msg[160], why[224];
    http_error_text(root, msg, sizeof(msg));
    cJSON_Delete(root);
    if (msg[0])
        snprintf(why, sizeof(why), "HTTP %d %s", r->http.status, msg);
    else
        snprintf(why, sizeof(why), "HTTP %d without an error body: %.80s", r->http.status,
                 r->http.body.data ? r->http.body.data : "");
    failed(l, r, msg[0] != '\0', why);
}

static void http_whole_end(load_t *l, load_req_t *r)
{
    cJSON *root = kvf_soak_json_parse(r->http.body.data ? r->http.body.data : "");
    bool ok = root && http_take_choice(r, root);
    cJSON_Delete(root);
    if (!ok) {
        lost(l, r, "HTTP 200 whose body is not a completion");
        return;
    }
    completed(l, r, !strcmp(r->finish, "length"), r->completion_tokens);
}

/* One event of a stream; false once the request has ended. */
static bool http_stream_event(load_t *l, load_req_t *r, const char *data)
{
    if (!strcmp(data, "[DONE]")) {
        char why[224];
        snprintf(why, sizeof(why), "error event: %s", r->error);
        if (r->error[0])
            failed(l, r, true, why);
        else
            completed(l, r, !strcmp(r->finish, "length"), r->completion_tokens);
        return false;
    }
    cJSON *root = kvf_soak_json_parse(data);
    bool ok = root && http_take_choice(r, root);
    if (ok && cJSON_GetObjectItemCaseSensitive(root, "error")) {
        http_error_text(root, r->error, sizeof(r->error));
        if (!r->error[0])
            snprintf(r->error, sizeof(r->error), "an error event without a message");
    }
    cJSON_Delete(root);
    if (!ok) {
        lost(l, r, "a malformed event in the stream");
        return false;
    }
    if (r->abort_after >= 0 && r->events >= r->abort_after && !r->finish[0] && !r->error[0]) {
        aborted(l, r); /* closes the socket mid-stream */
        return false;
    }
    return true;
}

/* The connection of r is readable (or hung up). */
static void http_input(load_t *l, load_req_t *r)
{
    char err[160];
    size_t before = r->http.body_total;
    int status_before = r->http.status;
    kvf_status_t st = kvf_soak_http_pump(&r->http, err, sizeof(err));
    if (r->http.body_total != before || r->http.status != status_before)
        r->progress_ns = kvf_clock_ns();
    if (st != KVF_OK) {
        lost(l, r, err);
        return;
    }
    if (r->http.status && r->http.status != 200) {
        if (r->http.complete)
            http_refused(l, r);
        return;
    }
    if (r->kind == KVF_SOAK_HTTP_WHOLE) {
        if (r->http.complete)
            http_whole_end(l, r);
        return;
    }
    const char *ev;
    while ((ev = kvf_soak_http_event(&r->http)) != NULL)
        if (!http_stream_event(l, r, ev))
            return;
    if (r->http.complete)
        lost(l, r, "the stream ended without data: [DONE]");
}

/* Waits up to LOAD_POLL_MS for HTTP input and handles what came; false
 * when no HTTP request is in flight (nothing waited). */
static bool http_poll(load_t *l)
{
    struct pollfd fds[LOAD_SLOTS];
    int slot[LOAD_SLOTS], n = 0;
    for (int i = 0; i < l->n_slots; i++) {
        if (l->reqs[i].busy && l->reqs[i].kind != KVF_SOAK_NATIVE && l->reqs[i].http.fd >= 0) {
            fds[n] = (struct pollfd){.fd = l->reqs[i].http.fd, .events = POLLIN};
            slot[n++] = i;
        }
    }
    if (n == 0)
        return false;
    if (poll(fds, (nfds_t)n, LOAD_POLL_MS) > 0)
        for (int k = 0; k < n; k++)
            if (fds[k].revents)
                http_input(l, &l->reqs[slot[k]]);
    return true;
}

/* ---- the loop -------------------------------------------------------------------- */

/* Starts one request; false when no slot is free. */
static bool launch(load_t *l, bool abort_bound)
{
    load_req_t *r = NULL;
    for (int i = 0; i < l->n_slots && !r; i++)
        if (!l->reqs[i].busy)
            r = &l->reqs[i];
    if (!r)
        return false;
    *r = (load_req_t){.busy = true,
                      .abort_bound = abort_bound,
                      .abort_after = -1,
                      .seq_ok = true,
                      .completion_tokens = -1,
                      .http = {.fd = -1}};
    r->prompt = (int)(kvf_soak_rand(&l->rng) % KVF_SOAK_POOL);
    const kvf_soak_prompt_t *p = &l->s->pool[r->prompt];
    if (abort_bound) {
        r->kind = kvf_soak_rand(&l->rng) & 1 ? KVF_SOAK_NATIVE : KVF_SOAK_HTTP_STREAM;
        uint64_t most = r->kind == KVF_SOAK_NATIVE ? LOAD_NATIVE_ABORT_MAX : LOAD_HTTP_ABORT_MAX;
        if (most > p->n_ref - 1)
            most = p->n_ref - 1;
        r->abort_after = (int)kvf_soak_between(&l->rng, 1, most);
        l->aborts_running++;
    } else {
        r->kind = (kvf_soak_kind_t)(kvf_soak_rand(&l->rng) % KVF_SOAK_KINDS);
        l->steady_running++;
    }
    r->id = l->next_id++;
    r->progress_ns = kvf_clock_ns();
    l->s->tally.sent[r->kind]++;
    if (r->kind == KVF_SOAK_NATIVE)
        native_send(l, r);
    else
        http_send(l, r);
    return true;
}

/* Keeps the steady requests in flight, and the aborts on pace: by time t
 * of the run, aborts_target * t / duration of them. */
static void fill(load_t *l, uint64_t now)
{
    const kvf_soak_t *s = l->s;
    double t = (double)(now - s->t0_ns) / 1e9;
    double quota = s->aborts_target * (t < s->duration_s ? t / s->duration_s : 1.0);
    /* At most one round of slots per call: a request refused at once (its
     * slot free again) is not sent again in a tight loop. */
    int budget = l->n_slots;
    while (budget-- > 0 && l->aborts_running < (unsigned)s->abort_inflight &&
           l->aborts_done + l->aborts_running < quota + 2 && launch(l, true))
        ;
    while (budget-- > 0 && l->steady_running < (unsigned)s->inflight && launch(l, false))
        ;
}

/* Requests with no output for stall_s, or all of them once give_up: LOST. */
static void watchdog(load_t *l, uint64_t now, bool give_up)
{
    uint64_t stall_ns = (uint64_t)(l->s->stall_s * 1e9);
    for (int i = 0; i < l->n_slots; i++) {
        load_req_t *r = &l->reqs[i];
        if (!r->busy || (!give_up && now - r->progress_ns < stall_ns))
            continue;
        char why[128];
        snprintf(why, sizeof(why), "%s (%zu tokens, %d text events so far)",
                 give_up ? "still running when the drain bound passed"
                         : "no output for the stall "
                           "limit",
                 r->n_out, r->events);
        lost(l, r, why);
    }
}

static unsigned busy_count(const load_t *l)
{
    return l->steady_running + l->aborts_running;
}

void kvf_soak_load_run(kvf_soak_t *s)
{
    load_t *l = calloc(1, sizeof(*l));
    KVF_ASSERT(l);
    l->s = s;
    l->n_slots = s->inflight + s->abort_inflight;
    KVF_ASSERT(l->n_slots <= LOAD_SLOTS);
    l->rng = s->seed ^ 0x10adull;
    l->next_id = 1;
    if (kvf_client_create(s->cluster.client_url, &l->client) != KVF_OK) {
        fprintf(stderr, "soak: cannot open a client socket to %s\n", s->cluster.client_url);
        free(l);
        return;
    }
    uint64_t end = s->t0_ns + (uint64_t)(s->duration_s * 1e9);
    uint64_t hard_end = end + (uint64_t)(s->drain_bound_s * 1e9);
    for (;;) {
        uint64_t now = kvf_clock_ns();
        if (now < end && !atomic_load(&s->stop_load))
            fill(l, now);
        else if (busy_count(l) == 0)
            break;
        else if (now > hard_end) {
            watchdog(l, now, true);
            break;
        }
        native_drain(l, http_poll(l) ? 0 : LOAD_POLL_MS);
        watchdog(l, kvf_clock_ns(), false);
    }
    kvf_client_destroy(l->client);
    free(l);
}
