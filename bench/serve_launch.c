/* Starting and stopping the configurations kvf bench serve runs against.
 * See serve_launch.h. */
#include "serve_launch.h"
#include "bench_util.h"

#include "kvf/clientsock.h"
#include "kvf/clock.h"
#include "kvf/msg.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void url_free_port(char *buf, size_t len)
{
    int port = 0;
    kvf_net_free_port(&port);
    snprintf(buf, len, "tcp://127.0.0.1:%d", port);
}

static pid_t spawn(kvf_serve_launch_t *l, const char *bin_dir, const char *log_name,
                   char **argv)
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

/* Waits until the router lists want live nodes. */
static bool launch_wait(const kvf_serve_launch_t *l, int want, int timeout_ms)
{
    uint64_t deadline = kvf_clock_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (kvf_clock_ns() < deadline) {
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

bool kvf_serve_launch(kvf_serve_launch_t *l, const char *bin_dir, const char *model,
                      bool colocated, int threads, const char *kv_mem, const char *run_dir)
{
    memset(l, 0, sizeof(*l));
    snprintf(l->run_dir, sizeof(l->run_dir), "%s", run_dir);
    mkdir(run_dir, 0755);
    url_free_port(l->router_url, sizeof(l->router_url));
    url_free_port(l->client_url, sizeof(l->client_url));
    char *router_argv[] = {"kvf-router", "--listen", l->router_url, "--client", l->client_url,
                           "--model", (char *)model, NULL};
    spawn(l, bin_dir, colocated ? "colocated-router" : "split-router", router_argv);
    char t1[16], t2[16], u1[64], u2[64];
    snprintf(t1, sizeof(t1), "%d", threads);
    snprintf(t2, sizeof(t2), "%d", 2 * threads);
    url_free_port(u1, sizeof(u1));
    url_free_port(u2, sizeof(u2));
    if (colocated) {
        char *argv[] = {"kvf-decode", "--router", l->router_url, "--listen", u1, "--model",
                        (char *)model, "--threads", t2, "--prefill-local", "--kv-mem",
                        (char *)kv_mem, "--node-id", "colocated-0", NULL};
        spawn(l, bin_dir, "colocated-decode", argv);
    } else {
        char *dargv[] = {"kvf-decode", "--router", l->router_url, "--listen", u1, "--model",
                         (char *)model, "--threads", t1, "--kv-mem", (char *)kv_mem,
                         "--node-id", "decode-0", NULL};
        char *pargv[] = {"kvf-prefill", "--router", l->router_url, "--listen", u2, "--model",
                         (char *)model, "--threads", t1, "--node-id", "prefill-0", NULL};
        spawn(l, bin_dir, "split-decode", dargv);
        spawn(l, bin_dir, "split-prefill", pargv);
    }
    if (!launch_wait(l, colocated ? 1 : 2, 120000)) {
        fprintf(stderr, "bench serve: the %s configuration did not come up (logs in %s)\n",
                colocated ? "colocated" : "split", run_dir);
        kvf_serve_launch_stop(l);
        return false;
    }
    return true;
}
