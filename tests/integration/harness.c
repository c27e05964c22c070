#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvf/auth.h"
#include "kvf/clock.h"
#include "kvf/msg.h"

/* Where the binaries are: $KVF_BIN_DIR (a relocated build, e.g. the GPU
 * check's bundle) or this build's. */
static const char *bin_dir(void)
{
    const char *e = getenv("KVF_BIN_DIR");
    return e && *e ? e : KVF_BIN_DIR;
}

static void tcp_url(char *buf, size_t len)
{
    int port;
    assert_int_equal(kvf_net_free_port(&port), KVF_OK);
    snprintf(buf, len, "tcp://127.0.0.1:%d", port);
}

/* Every process started and not yet reaped, kept outside the clusters
 * (which live on test stacks that a failed assertion unwinds). */
#define H_MAX_PIDS 64
static pid_t h_pids[H_MAX_PIDS];

static void pid_track(pid_t pid)
{
    for (int k = 0; k < H_MAX_PIDS; k++) {
        if (!h_pids[k]) {
            h_pids[k] = pid;
            return;
        }
    }
}

static void pid_untrack(pid_t pid)
{
    for (int k = 0; k < H_MAX_PIDS; k++)
        if (h_pids[k] == pid)
            h_pids[k] = 0;
}

int h_teardown(void **state)
{
    (void)state;
    int n = 0;
    for (int k = 0; k < H_MAX_PIDS; k++) {
        if (h_pids[k] > 0) {
            kill(h_pids[k], SIGKILL);
            waitpid(h_pids[k], NULL, 0);
            h_pids[k] = 0;
            n++;
        }
    }
    if (n)
        fprintf(stderr, "harness: killed %d processes a failed test left running\n", n);
    return 0;
}

void h_cluster_init(h_cluster_t *c, const char *model, const char *ucx_tls)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->dir, sizeof(c->dir), "/tmp/kvf-cluster-XXXXXX");
    assert_non_null(mkdtemp(c->dir));
    c->model = model;
    c->ucx_tls = ucx_tls;
    tcp_url(c->router_url, sizeof(c->router_url));
    tcp_url(c->client_url, sizeof(c->client_url));
}

void h_cluster_key(h_cluster_t *c, const char *path)
{
    c->key_file = path;
    assert_int_equal(kvf_auth_load_key_file(path), KVF_OK);
}

/* Starts argv[0] (a binary in build/bin) in slot i of procs (a new one,
 * or one whose process is gone) with its output appended to its log. */
static void spawn_in(h_cluster_t *c, int i, const char *name, const char *url, char **argv)
{
    h_proc_t *p = &c->procs[i];
    assert_true(p->pid <= 0);
    snprintf(p->name, sizeof(p->name), "%s", name);
    snprintf(p->url, sizeof(p->url), "%s", url ? url : "");
    char log[sizeof(c->dir) + sizeof(p->name) + 8];
    snprintf(log, sizeof(log), "%s/%s.log", c->dir, name);
    snprintf(p->log, sizeof(p->log), "%s", log);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(p->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
            close(fd);
        }
        int null = open("/dev/null", O_RDONLY);
        if (null >= 0)
            dup2(null, STDIN_FILENO);
        if (c->ucx_tls)
            setenv("UCX_TLS", c->ucx_tls, 1);
        setenv("UCX_NET_DEVICES", "lo", 1);
        if (!getenv("KVF_LOG"))
            setenv("KVF_LOG", "info", 1);
        if (c->key_file)
            setenv(KVF_AUTH_KEY_ENV, c->key_file, 1);
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", bin_dir(), argv[0]);
        execv(path, argv);
        _exit(127);
    }
    p->pid = pid;
    pid_track(pid);
}

/* Starts argv[0] in a new slot; returns its index. */
static int spawn(h_cluster_t *c, const char *name, const char *url, char **argv)
{
    assert_true(c->n_procs < H_MAX_PROCS);
    c->procs[c->n_procs].pid = 0;
    spawn_in(c, c->n_procs, name, url, argv);
    return c->n_procs++;
}

static int collect_args(char **argv, int n, va_list ap)
{
    const char *a;
    while ((a = va_arg(ap, const char *)) != NULL && n < 62)
        argv[n++] = (char *)a;
    argv[n] = NULL;
    return n;
}

void h_start_router(h_cluster_t *c, ...)
{
    /* No HTTP API unless the test asks for one (its --http comes later
     * and wins): the default port is not a free one. */
    char *argv[64] = {"kvf-router", "--listen", c->router_url, "--client", c->client_url,
                      "--model",    (char *)c->model, "--http", "off"};
    va_list ap;
    va_start(ap, c);
    collect_args(argv, 9, ap);
    va_end(ap);
    spawn(c, "router", c->router_url, argv);
}

/* A node's command line: a fresh inbox, then the extra flags of ap. */
static void node_argv(h_cluster_t *c, const char *role, const char *name, char *url, char *bin,
                      char **argv, va_list ap)
{
    tcp_url(url, 64);
    snprintf(bin, 32, "kvf-%s", role);
    char *head[] = {bin,       "--router",       c->router_url, "--listen",   url,
                    "--model", (char *)c->model, "--node-id",   (char *)name, "--threads",
                    "1"};
    memcpy(argv, head, sizeof(head));
    collect_args(argv, 11, ap);
}

int h_start_node(h_cluster_t *c, const char *role, const char *name, ...)
{
    char url[64], bin[32];
    char *argv[64];
    va_list ap;
    va_start(ap, name);
    node_argv(c, role, name, url, bin, argv, ap);
    va_end(ap);
    return spawn(c, name, url, argv);
}

void h_restart_node(h_cluster_t *c, int i, const char *role, ...)
{
    char url[64], bin[32], name[sizeof(c->procs[i].name)];
    char *argv[64];
    snprintf(name, sizeof(name), "%s", c->procs[i].name);
    va_list ap;
    va_start(ap, role);
    node_argv(c, role, name, url, bin, argv, ap);
    va_end(ap);
    spawn_in(c, i, name, url, argv);
}

void h_kill(h_cluster_t *c, int i)
{
    if (c->procs[i].pid > 0) {
        kill(c->procs[i].pid, SIGKILL);
        waitpid(c->procs[i].pid, NULL, 0);
        pid_untrack(c->procs[i].pid);
        c->procs[i].pid = 0;
    }
}

static void print_log_tail(const h_proc_t *p)
{
    FILE *f = fopen(p->log, "r");
    if (!f)
        return;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, size > 4000 ? size - 4000 : 0, SEEK_SET);
    char buf[4096];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    fprintf(stderr, "---- %s (%s) ----\n%s\n", p->name, p->log, buf);
}

void h_cluster_stop(h_cluster_t *c, bool print_logs)
{
    /* Called with print_logs false on the success path: then every process
     * must drain and exit 0 on SIGTERM (a crash, a sanitizer report or a
     * hang fails the test). */
    bool expect_clean = !print_logs;
    char unclean[256] = "";
    for (int i = c->n_procs - 1; i >= 0; i--)
        if (c->procs[i].pid > 0)
            kill(c->procs[i].pid, SIGTERM);
    /* Generous: a clean stop takes well under a second, but a slow machine
     * under the sanitizers (leak check at exit) needs room. */
    uint64_t deadline = kvf_clock_ns() + 60000000000ull;
    for (int i = 0; i < c->n_procs; i++) {
        h_proc_t *p = &c->procs[i];
        while (p->pid > 0) {
            int status = 0;
            pid_t pid = p->pid;
            pid_t r = waitpid(pid, &status, WNOHANG);
            if (r == pid || (r < 0 && errno == ECHILD)) {
                pid_untrack(pid);
                p->pid = 0;
                if (r == pid && (!WIFEXITED(status) || WEXITSTATUS(status) != 0)) {
                    fprintf(stderr, "harness: %s ended with status 0x%x\n", p->name, status);
                    print_logs = true;
                    size_t len = strlen(unclean);
                    snprintf(unclean + len, sizeof(unclean) - len, " %s", p->name);
                }
                break;
            }
            if (kvf_clock_ns() > deadline) {
                fprintf(stderr, "harness: %s did not stop in 60 s: SIGKILL\n", p->name);
                kill(pid, SIGKILL);
                waitpid(pid, NULL, 0);
                pid_untrack(pid);
                p->pid = 0;
                print_logs = true;
                size_t len = strlen(unclean);
                snprintf(unclean + len, sizeof(unclean) - len, " %s", p->name);
                break;
            }
            kvf_clock_sleep_ms(20);
        }
    }
    if (print_logs || getenv("KVF_TEST_LOGS")) {
        for (int i = 0; i < c->n_procs; i++)
            print_log_tail(&c->procs[i]);
        fprintf(stderr, "harness: logs kept in %s\n", c->dir);
    } else {
        for (int i = 0; i < c->n_procs; i++)
            unlink(c->procs[i].log);
        rmdir(c->dir);
    }
    c->n_procs = 0;
    if (expect_clean && unclean[0])
        fail_msg("processes did not stop cleanly:%s", unclean);
}

/* Asks the router for its stats over a fresh client socket. */
static kvf_envelope_t *stats_request(h_cluster_t *c, int timeout_ms)
{
    kvf_client_t *client;
    if (kvf_client_create(c->client_url, &client) != KVF_OK)
        return NULL;
    kvf_envelope_t *in = NULL;
    if (kvf_client_stats(client, "harness", timeout_ms, &in) != KVF_OK)
        in = NULL;
    kvf_client_destroy(client);
    return in;
}

int h_stats(h_cluster_t *c, h_node_stats_t *out, int max)
{
    kvf_envelope_t *in = stats_request(c, 2000);
    if (!in)
        return -1;
    const Kvf__StatsReply *s = in->stats_reply;
    int n = 0;
    for (size_t i = 0; i < s->n_nodes && n < max; i++, n++) {
        const Kvf__NodeStats *ns = s->nodes[i];
        h_node_stats_t *o = &out[n];
        memset(o, 0, sizeof(*o));
        snprintf(o->id, sizeof(o->id), "%s", ns->node_id);
        o->role = ns->role;
        snprintf(o->state, sizeof(o->state), "%s", ns->state);
        if (ns->load) {
            o->blocks_used = ns->load->blocks_used;
            o->blocks_total = ns->load->blocks_total;
            o->running = ns->load->running;
            o->tier_ram_blocks = ns->load->tier_ram_blocks;
            o->tier_disk_blocks = ns->load->tier_disk_blocks;
        }
        o->dispatched = ns->dispatched;
    }
    int total = (int)s->n_nodes;
    kvf_envelope_free(in);
    return total;
}

uint64_t h_redispatched(h_cluster_t *c)
{
    kvf_envelope_t *in = stats_request(c, 2000);
    assert_non_null(in);
    uint64_t v = in->stats_reply->redispatched;
    kvf_envelope_free(in);
    return v;
}

bool h_log_holds(const h_cluster_t *c, int i, const char *text)
{
    FILE *f = fopen(c->procs[i].log, "r");
    if (!f)
        return false;
    char line[2048];
    bool found = false;
    while (!found && fgets(line, sizeof(line), f))
        found = strstr(line, text) != NULL;
    fclose(f);
    return found;
}

void h_totals(h_cluster_t *c, h_totals_t *t)
{
    kvf_envelope_t *in = stats_request(c, 2000);
    assert_non_null(in);
    const Kvf__StatsReply *s = in->stats_reply;
    t->prefill_computed = s->prefill_tokens_computed;
    t->prefill_cached = s->prefill_tokens_cached;
    t->kv_bytes = s->kv_bytes_shipped;
    t->local_prefills = s->local_prefills;
    t->redispatched = s->redispatched;
    kvf_envelope_free(in);
}

void h_wait_nodes(h_cluster_t *c, int n_nodes, int timeout_ms)
{
    uint64_t deadline = kvf_clock_ns() + (uint64_t)timeout_ms * 1000000ull;
    int live = 0;
    while (kvf_clock_ns() < deadline) {
        h_node_stats_t st[H_MAX_PROCS];
        int n = h_stats(c, st, H_MAX_PROCS);
        live = 0;
        for (int i = 0; i < n && i < H_MAX_PROCS; i++)
            live += !strcmp(st[i].state, "live");
        if (live >= n_nodes)
            return;
        kvf_clock_sleep_ms(100);
    }
    fprintf(stderr, "harness: %d of %d nodes live after %d ms\n", live, n_nodes, timeout_ms);
    h_cluster_stop(c, true);
    fail();
}

void h_wait_no_blocks_used(h_cluster_t *c, int timeout_ms)
{
    uint64_t deadline = kvf_clock_ns() + (uint64_t)timeout_ms * 1000000ull;
    h_node_stats_t st[H_MAX_PROCS];
    int n = 0;
    while (kvf_clock_ns() < deadline) {
        n = h_stats(c, st, H_MAX_PROCS);
        int busy = 0;
        for (int i = 0; i < n && i < H_MAX_PROCS; i++)
            busy += st[i].blocks_used != 0 && strcmp(st[i].state, "dead") != 0;
        if (n > 0 && busy == 0)
            return;
        kvf_clock_sleep_ms(100);
    }
    for (int i = 0; i < n && i < H_MAX_PROCS; i++)
        fprintf(stderr, "harness: node %s (%s) uses %u of %u blocks\n", st[i].id, st[i].state,
                st[i].blocks_used, st[i].blocks_total);
    h_cluster_stop(c, true);
    fail();
}

static void send_generate(kvf_client_t *client, h_gen_t *g, uint64_t id)
{
    Kvf__Sampling s = KVF__SAMPLING__INIT;
    s.temperature = g->temperature;
    s.top_p = g->top_p;
    s.top_k = g->top_k;
    s.seed = g->seed;
    s.has_seed = g->has_seed;
    s.max_tokens = g->max_tokens;
    s.ignore_eos = g->ignore_eos;
    kvf_client_generate_t r = {.client_req_id = id,
                               .prompt = g->text,
                               .ids = g->prompt,
                               .n_ids = g->n_prompt,
                               .sampling = &s};
    assert_int_equal(kvf_client_generate(client, "harness", &r, 5000), KVF_OK);
}

static void send_cancel(kvf_client_t *client, uint64_t id)
{
    assert_int_equal(kvf_client_cancel(client, "harness", id, 5000), KVF_OK);
}

void h_generate_many(h_cluster_t *c, h_gen_t *gens, size_t n, const int *cancel_after,
                     int timeout_ms)
{
    h_generate_many_ex(c, gens, n, cancel_after, timeout_ms, NULL, NULL);
}

void h_signal(h_cluster_t *c, int i, int sig)
{
    if (c->procs[i].pid > 0)
        kill(c->procs[i].pid, sig);
}

bool h_reaped(h_cluster_t *c, int i, int *status_p)
{
    h_proc_t *p = &c->procs[i];
    int status;
    if (p->pid <= 0 || waitpid(p->pid, &status, WNOHANG) != p->pid)
        return false;
    pid_untrack(p->pid);
    p->pid = 0;
    *status_p = status;
    return true;
}

int h_terminate(h_cluster_t *c, int i, int timeout_ms)
{
    h_proc_t *p = &c->procs[i];
    if (p->pid <= 0)
        return -1;
    kill(p->pid, SIGTERM);
    uint64_t deadline = kvf_clock_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (kvf_clock_ns() < deadline) {
        int status;
        if (h_reaped(c, i, &status))
            return status;
        kvf_clock_sleep_ms(20);
    }
    kill(p->pid, SIGKILL);
    waitpid(p->pid, NULL, 0);
    pid_untrack(p->pid);
    p->pid = 0;
    return -1;
}

int h_find(const h_cluster_t *c, const char *name)
{
    for (int i = 0; i < c->n_procs; i++)
        if (!strcmp(c->procs[i].name, name))
            return i;
    return -1;
}

void h_generate_many_ex(h_cluster_t *c, h_gen_t *gens, size_t n, const int *cancel_after,
                        int timeout_ms, h_progress_fn progress, void *arg)
{
    size_t total_tokens = 0;
    kvf_client_t *client;
    assert_int_equal(kvf_client_create(c->client_url, &client), KVF_OK);
    uint64_t base = 1000;
    for (size_t i = 0; i < n; i++) {
        /* Results of an earlier run are dropped: one that failed before
         * its test freed them would otherwise run on into this one. */
        h_gen_free(&gens[i]);
        gens[i].status = 0;
        gens[i].error[0] = '\0';
        gens[i].finish = -1;
        gens[i].seq_ok = true;
        gens[i].next_seq = 0;
        send_generate(client, &gens[i], base + i);
    }
    bool *cancelled = calloc(n, sizeof(bool));
    assert_non_null(cancelled);
    size_t done = 0;
    uint64_t deadline = kvf_clock_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (done < n && kvf_clock_ns() < deadline) {
        kvf_envelope_t *in = NULL;
        if (kvf_client_recv(client, 50, &in) != KVF_OK) {
            if (progress)
                progress(c, arg, total_tokens);
            continue;
        }
        if (in->body_case != KVF__ENVELOPE__BODY_GENERATE_CHUNK ||
            in->generate_chunk->client_req_id < base ||
            in->generate_chunk->client_req_id >= base + n) {
            kvf_envelope_free(in);
            continue;
        }
        const Kvf__GenerateChunk *ch = in->generate_chunk;
        size_t i = ch->client_req_id - base;
        h_gen_t *g = &gens[i];
        if (ch->seq != g->next_seq)
            g->seq_ok = false;
        g->next_seq = ch->seq + 1;
        for (size_t k = 0; k < ch->n_tokens; k++) {
            if (g->n_out == g->cap_out) {
                g->cap_out = g->cap_out ? g->cap_out * 2 : 64;
                g->out = realloc(g->out, g->cap_out * sizeof(*g->out));
                assert_non_null(g->out);
            }
            g->out[g->n_out++] = ch->tokens[k];
            total_tokens++;
        }
        size_t tl = ch->text.len; /* bytes: the text may hold U+0000 */
        if (tl) {
            g->out_text = realloc(g->out_text, g->n_text + tl + 1);
            assert_non_null(g->out_text);
            memcpy(g->out_text + g->n_text, ch->text.data, tl);
            g->n_text += tl;
            g->out_text[g->n_text] = '\0';
        }
        if (ch->finish_reason != KVF__FINISH_REASON__FINISH_NONE && g->finish < 0) {
            g->finish = ch->finish_reason;
            g->status = ch->status;
            snprintf(g->error, sizeof(g->error), "%s", ch->error);
            done++;
        } else if (cancel_after && cancel_after[i] >= 0 && !cancelled[i] &&
                   g->n_out >= (size_t)cancel_after[i]) {
            cancelled[i] = true;
            send_cancel(client, base + i);
        }
        kvf_envelope_free(in);
        if (progress)
            progress(c, arg, total_tokens);
    }
    free(cancelled);
    kvf_client_destroy(client);
    if (done < n) {
        fprintf(stderr, "harness: %zu of %zu generations finished in %d ms\n", done, n, timeout_ms);
        for (size_t i = 0; i < n; i++)
            if (gens[i].finish < 0)
                fprintf(stderr, "  #%zu: %zu tokens so far\n", i, gens[i].n_out);
        h_cluster_stop(c, true);
        fail();
    }
}

void h_gen_free(h_gen_t *g)
{
    free(g->out);
    free(g->out_text);
    g->out = NULL;
    g->out_text = NULL;
    g->n_out = g->cap_out = g->n_text = 0;
}

void h_gen_random(h_gen_t *g, size_t n_prompt, uint32_t vocab, uint64_t seed, uint32_t max_tokens,
                  bool ignore_eos)
{
    memset(g, 0, sizeof(*g));
    g->n_prompt = n_prompt;
    g->prompt = h_prompt(n_prompt, vocab, seed);
    g->prompt[0] = vocab - 2; /* BOS, as a tokenized prompt starts */
    g->max_tokens = max_tokens;
    g->ignore_eos = ignore_eos;
}

void h_references(const char *model, const h_gen_t *gens, size_t n, uint32_t **refs,
                  size_t *n_refs)
{
    for (size_t i = 0; i < n; i++)
        refs[i] = h_colocated(model, &gens[i], &n_refs[i]);
}

void h_gens_free(h_gen_t *gens, uint32_t **refs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(gens[i].prompt);
        gens[i].prompt = NULL;
        h_gen_free(&gens[i]);
        if (refs) {
            free(refs[i]);
            refs[i] = NULL;
        }
    }
}

/* The kvf generate command of g's colocated reference (malloc'd, the
 * caller's): the generated ids on one line with ids, else the text. */
static char *colocated_cmd(const char *model, const h_gen_t *g, bool ids)
{
    size_t cap = 256 + g->n_prompt * 12;
    char *cmd = malloc(cap);
    assert_non_null(cmd);
    int off = snprintf(cmd, cap, "%s/kvf generate --model %s --threads 1%s --max-tokens %u",
                       bin_dir(), model, ids ? " --ids" : "", g->max_tokens);
    /* The nodes read KVF_BACKEND / KVF_GPU_DTYPE / KVF_DEVICE /
     * KVF_KV_DTYPE from the environment (a cluster test on a GPU, or in
     * another KV format): the reference runs on the same backend with the
     * same KV cache. */
    const char *env_flags[][2] = {{"KVF_BACKEND", "backend"},
                                  {"KVF_GPU_DTYPE", "gpu-dtype"},
                                  {"KVF_DEVICE", "device"},
                                  {"KVF_KV_DTYPE", "kv-dtype"}};
    for (size_t i = 0; i < sizeof(env_flags) / sizeof(env_flags[0]); i++) {
        const char *v = getenv(env_flags[i][0]);
        if (v && *v)
            off += snprintf(cmd + off, cap - (size_t)off, " --%s %s", env_flags[i][1], v);
    }
    if (g->temperature > 0)
        off += snprintf(cmd + off, cap - (size_t)off, " --temperature %.9g", g->temperature);
    if (g->top_k)
        off += snprintf(cmd + off, cap - (size_t)off, " --top-k %u", g->top_k);
    if (g->top_p > 0 && g->top_p < 1)
        off += snprintf(cmd + off, cap - (size_t)off, " --top-p %.9g", g->top_p);
    if (g->has_seed)
        off += snprintf(cmd + off, cap - (size_t)off, " --seed %llu", (unsigned long long)g->seed);
    if (g->ignore_eos)
        off += snprintf(cmd + off, cap - (size_t)off, " --ignore-eos");
    off += snprintf(cmd + off, cap - (size_t)off, " --prompt-ids ");
    for (size_t i = 0; i < g->n_prompt; i++)
        off += snprintf(cmd + off, cap - (size_t)off, "%s%u", i ? "," : "", g->prompt[i]);
    return cmd;
}

/* pclose's status of the reference command, which must have exited 0. */
static void colocated_close(FILE *f, char *cmd)
{
    int rc = pclose(f);
    if (rc != 0)
        fprintf(stderr, "harness: '%s' exited with %d\n", cmd, rc);
    assert_int_equal(rc, 0);
    free(cmd);
}

uint32_t *h_colocated(const char *model, const h_gen_t *g, size_t *n_p)
{
    char *cmd = colocated_cmd(model, g, true);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = 0, ocap = 64;
    uint32_t *out = malloc(ocap * sizeof(*out));
    assert_non_null(out);
    unsigned v;
    int ch;
    while (fscanf(f, "%u", &v) == 1) {
        if (n == ocap) {
            ocap *= 2;
            out = realloc(out, ocap * sizeof(*out));
            assert_non_null(out);
        }
        out[n++] = v;
        ch = fgetc(f);
        if (ch != ',')
            break;
    }
    colocated_close(f, cmd);
    *n_p = n;
    return out;
}

char *h_colocated_text(const char *model, const h_gen_t *g, size_t *len_p)
{
    char *cmd = colocated_cmd(model, g, false);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = 0, cap = 256;
    char *text = malloc(cap);
    assert_non_null(text);
    size_t got;
    while ((got = fread(text + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n - 1 == 0) {
            cap *= 2;
            text = realloc(text, cap);
            assert_non_null(text);
        }
    }
    colocated_close(f, cmd);
    if (n > 0 && text[n - 1] == '\n')
        n--; /* kvf generate ends its text with a newline */
    text[n] = '\0';
    *len_p = n;
    return text;
}

uint32_t *h_prompt(size_t n, uint32_t vocab, uint64_t seed)
{
    uint32_t *p = malloc((n ? n : 1) * sizeof(*p));
    assert_non_null(p);
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = 1 + (uint32_t)(x % (vocab - 3));
    }
    return p;
}

void h_mkmodel(const char *dir, const char *args)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "%s/kvf mkmodel %s %s > /dev/null", bin_dir(), dir, args);
    assert_int_equal(system(cmd), 0);
}

void h_check_outputs(h_cluster_t *c, const h_gen_t *gens, uint32_t *const *refs,
                     const size_t *n_refs, size_t n, unsigned finish_mask)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        const h_gen_t *g = &gens[i];
        size_t k = 0;
        while (k < g->n_out && k < n_refs[i] && g->out[k] == refs[i][k])
            k++;
        bool same = g->n_out == n_refs[i] && k == g->n_out;
        bool finished = g->finish >= 0 && (finish_mask & (1u << g->finish));
        if (!same || !g->seq_ok || !finished) {
            fprintf(stderr,
                    "request %zu (%zu prompt tokens, max %u): %zu tokens (colocated %zu), first "
                    "difference at %zu, finish %d, chunks in order %d, error '%s'\n",
                    i, g->n_prompt, g->max_tokens, g->n_out, n_refs[i], k, g->finish, g->seq_ok,
                    g->error);
            bad++;
        }
    }
    if (bad) {
        h_cluster_stop(c, true);
        fail_msg("%d of %zu requests differ from the colocated output", bad, n);
    }
}

int h_rmmodel(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}
