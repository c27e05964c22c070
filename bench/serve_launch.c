/* Starting and stopping the configurations kvf bench serve runs against.
 * See serve_launch.h. */
#include "serve_launch.h"
#include "bench_util.h"

#include "kvf/auth.h"
#include "kvf/clientsock.h"
#include "kvf/clock.h"
#include "kvf/msg.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void url_free_port(char *buf, size_t len)
{
    int port = 0;
    kvf_net_free_port(&port);
    snprintf(buf, len, "tcp://127.0.0.1:%d", port);
}

static pid_t spawn(kvf_serve_launch_t *l, const char *bin_dir, const char *log_name, char **argv)
{
    char path[512], log[512];
    snprintf(path, sizeof(path), "%s/%s", bin_dir, argv[0]);
    snprintf(log, sizeof(log), "%s/%s.log", l->run_dir, log_name);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
            close(fd);
        }
        setenv("UCX_NET_DEVICES", "lo", 0);
        execv(path, argv);
        _exit(127);
    }
    if (pid > 0 && l->n < KVF_SERVE_MAX_PROCS)
        l->pids[l->n++] = pid;
    return pid;
}

void kvf_serve_launch_stop(kvf_serve_launch_t *l)
{
    for (int i = l->n - 1; i >= 0; i--)
        kill(l->pids[i], SIGTERM);
    uint64_t deadline = kvf_clock_ns() + 5000000000ull;
    for (int i = 0; i < l->n; i++)
        (void)kvf_bench_reap(l->pids[i], deadline, 20);
    l->n = 0;
}

/* True when one of the processes started has exited: it is reaped and
 * taken off the list (nothing is signalled under its pid again). */
static bool reap_exited(kvf_serve_launch_t *l)
{
    for (int i = 0; i < l->n; i++) {
        int status;
        if (waitpid(l->pids[i], &status, WNOHANG) == l->pids[i]) {
            memmove(&l->pids[i], &l->pids[i + 1], (size_t)(l->n - i - 1) * sizeof(pid_t));
            l->n--;
            return true;
        }
    }
    return false;
}

/* Waits until the router lists want live nodes; false at once when a
 * process exits meanwhile (a flag its binary refuses, a port taken). */
static bool launch_wait(kvf_serve_launch_t *l, int want, int timeout_ms)
{
    uint64_t deadline = kvf_clock_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (kvf_clock_ns() < deadline) {
        if (reap_exited(l)) {
            fprintf(stderr, "bench serve: a process exited before the cluster came up\n");
            return false;
        }
        kvf_client_t *c;
        if (kvf_client_create(l->client_url, &c) == KVF_OK) {
            kvf_envelope_t *in;
            int live = 0;
            if (kvf_client_stats(c, "bench-serve", 1000, &in) == KVF_OK) {
                for (size_t i = 0; i < in->stats_reply->n_nodes; i++)
                    live += !strcmp(in->stats_reply->nodes[i]->state, "live");
                kvf_envelope_free(in);
            }
            kvf_client_destroy(c);
            if (live >= want)
                return true;
        }
        kvf_clock_sleep_ms(200);
    }
    return false;
}

/* Starts one node of role "kvf-decode" or "kvf-prefill", the i-th of n. */
static void spawn_node(kvf_serve_launch_t *l, const char *bin_dir, const char *model,
                       const kvf_serve_cluster_t *c, bool decode, int i, int n)
{
    char threads[16], url[64], id[64], log[96], disk[320];
    snprintf(threads, sizeof(threads), "%d", decode ? c->decode_threads : c->prefill_threads);
    url_free_port(url, sizeof(url));
    bool colocated = decode && c->decode_prefill_local && c->prefill_nodes == 0;
    if (colocated)
        snprintf(id, sizeof(id), "%s-%d", c->name, i);
    else
        snprintf(id, sizeof(id), "%s-%d", decode ? "decode" : "prefill", i);
    if (n == 1)
        snprintf(log, sizeof(log), "%s-%s", c->name, decode ? "decode" : "prefill");
    else
        snprintf(log, sizeof(log), "%s-%s-%d", c->name, decode ? "decode" : "prefill", i);
    char *argv[24] = {decode ? "kvf-decode" : "kvf-prefill",
                      "--router",
                      l->router_url,
                      "--listen",
                      url,
                      "--model",
                      (char *)model,
                      "--threads",
                      threads,
                      "--node-id",
                      id};
    int argc = 11;
    if (decode) {
        argv[argc++] = "--kv-mem";
        argv[argc++] = (char *)c->kv_mem;
        if (c->decode_prefill_local)
            argv[argc++] = "--prefill-local";
    } else {
        const char *flag[3] = {"--kv-mem", "--kv-host-mem", "--kv-disk-size"};
        const char *value[3] = {c->prefill_kv_mem, c->prefill_kv_host_mem,
                                c->prefill_kv_disk_size};
        for (int k = 0; k < 3; k++)
            if (value[k]) {
                argv[argc++] = (char *)flag[k];
                argv[argc++] = (char *)value[k];
            }
        if (c->prefill_kv_disk) { /* one tier file per node */
            snprintf(disk, sizeof(disk), "%s/%s", c->prefill_kv_disk, id);
            mkdir(c->prefill_kv_disk, 0755);
            mkdir(disk, 0755);
            argv[argc++] = "--kv-disk";
            argv[argc++] = disk;
        }
    }
    argv[argc] = NULL;
    spawn(l, bin_dir, log, argv);
}

bool kvf_serve_launch_cluster(kvf_serve_launch_t *l, const char *bin_dir, const char *model,
                              const kvf_serve_cluster_t *c, const char *run_dir)
{
    memset(l, 0, sizeof(*l));
    if (c->decode_nodes < 1 || c->decode_nodes > KVF_SERVE_MAX_NODES || c->prefill_nodes < 0 ||
        c->prefill_nodes > KVF_SERVE_MAX_NODES || c->n_router_args < 0 ||
        c->n_router_args > KVF_SERVE_MAX_ARGS) {
        fprintf(stderr, "bench serve: %s: 1 to %d decode nodes, 0 to %d prefill nodes\n", c->name,
                KVF_SERVE_MAX_NODES, KVF_SERVE_MAX_NODES);
        return false;
    }
    snprintf(l->run_dir, sizeof(l->run_dir), "%s", run_dir);
    mkdir(run_dir, 0755);
    url_free_port(l->router_url, sizeof(l->router_url));
    url_free_port(l->client_url, sizeof(l->client_url));
    /* No HTTP: the bench talks to the client socket, and a fixed HTTP port
     * would clash with any other router on this machine. */
    char *router_argv[12 + KVF_SERVE_MAX_ARGS] = {"kvf-router",  "--listen",    l->router_url,
                                                  "--client",    l->client_url, "--model",
                                                  (char *)model, "--http",      "off"};
    int argc = 9;
    for (int i = 0; i < c->n_router_args; i++)
        router_argv[argc++] = (char *)c->router_args[i];
    router_argv[argc] = NULL;
    char log[96];
    snprintf(log, sizeof(log), "%s-router", c->name);
    spawn(l, bin_dir, log, router_argv);
    for (int i = 0; i < c->decode_nodes; i++)
        spawn_node(l, bin_dir, model, c, true, i, c->decode_nodes);
    for (int i = 0; i < c->prefill_nodes; i++)
        spawn_node(l, bin_dir, model, c, false, i, c->prefill_nodes);
    if (!launch_wait(l, c->decode_nodes + c->prefill_nodes, 120000)) {
        fprintf(stderr, "bench serve: the %s configuration did not come up (logs in %s)\n", c->name,
                run_dir);
        kvf_serve_launch_stop(l);
        return false;
    }
    return true;
}

bool kvf_serve_launch(kvf_serve_launch_t *l, const char *bin_dir, const char *model, bool colocated,
                      int threads, const char *kv_mem, const char *run_dir)
{
    kvf_serve_cluster_t c = {.name = colocated ? "colocated" : "split",
                             .prefill_nodes = colocated ? 0 : 1,
                             .decode_nodes = 1,
                             .prefill_threads = threads,
                             .decode_threads = colocated ? 2 * threads : threads,
                             .kv_mem = kv_mem,
                             .decode_prefill_local = colocated};
    return kvf_serve_launch_cluster(l, bin_dir, model, &c, run_dir);
}

bool kvf_serve_setup(const char *key_file, char *bin_dir, size_t len)
{
    if (kvf_auth_setup(key_file) != KVF_OK)
        return false;
    /* The processes a run starts take the same key from the environment. */
    if (key_file && *key_file)
        setenv(KVF_AUTH_KEY_ENV, key_file, 1);
    return kvf_serve_bin_dir(bin_dir, len);
}

bool kvf_serve_bin_dir(char *bin_dir, size_t len)
{
    ssize_t bl = readlink("/proc/self/exe", bin_dir, len - 1);
    if (bl <= 0)
        return false;
    bin_dir[bl] = '\0';
    char *slash = strrchr(bin_dir, '/');
    if (slash)
        *slash = '\0';
    return true;
}

static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

volatile sig_atomic_t *kvf_serve_catch_stop(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = (int)SA_RESETHAND; /* a second signal ends the process */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    return &stop_requested;
}
