/* ucx_perftest as kvf bench transfer's ceiling. See transfer_perftest.h. */
#include "transfer_perftest.h"

#include "kvf/clock.h"
#include "kvf/msg.h"

#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

/* The server in the background on port, its output discarded. */
static pid_t start_perftest_server(const char *port)
{
    pid_t server = fork();
    if (server == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        char *argv[] = {"ucx_perftest", "-p", (char *)port, NULL};
        execvp("ucx_perftest", argv);
        _exit(127);
    }
    return server;
}

/* The client's ucp_put_bw against 127.0.0.1:port; its overall bandwidth
 * in MB/s (1e6 bytes), 0 when it printed none, -1 when it could not
 * start. */
static double run_perftest_client(const char *port, const char *size, const char *iters,
                                  const char *warmup)
{
    int out[2];
    if (pipe(out))
        return -1;
    pid_t client = fork();
    if (client == 0) {
        dup2(out[1], 1);
        close(out[0]);
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 2);
        char *argv[] = {"ucx_perftest", "-p",         (char *)port,   "-t",
                        "ucp_put_bw",   "-s",         (char *)size,   "-n",
                        (char *)iters,  "-w",         (char *)warmup, "127.0.0.1",
                        NULL};
        execvp("ucx_perftest", argv);
        _exit(127);
    }
    close(out[1]);
    FILE *f = fdopen(out[0], "r");
    char line[512];
    double mbps = 0;
    while (f && fgets(line, sizeof(line), f)) {
        double v[7];
        /* iterations, overhead 50%ile / average / overall (us), then
         * bandwidth average / overall in MB/s with MB = 2^20 */
        if (sscanf(line, " Final: %lf %lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3], &v[4],
                   &v[5], &v[6]) == 7)
            mbps = v[5] * 1048576.0 / 1e6;
    }
    if (f)
        fclose(f);
    int status;
    if (client > 0)
        waitpid(client, &status, 0);
    return mbps;
}

/* ucp_put_bw at size bytes between two ucx_perftest processes on
 * 127.0.0.1 (server in the background on a free port, then the client);
 * GB/s (1e9 bytes), or 0 when it could not run. */
static double perftest_once_gbps(uint64_t size, bool quick)
{
    uint64_t target = quick ? (128ull << 20) : (1ull << 30);
    uint64_t iters = target / size;
    if (iters < 200)
        iters = 200;
    if (iters > 200000)
        iters = 200000;
    char s_size[32], s_iters[32], s_warm[32], s_port[16];
    snprintf(s_size, sizeof(s_size), "%" PRIu64, size);
    snprintf(s_iters, sizeof(s_iters), "%" PRIu64, iters);
    snprintf(s_warm, sizeof(s_warm), "%" PRIu64, iters / 10 + 10);
    for (int attempt = 0; attempt < 5; attempt++) {
        int port;
        if (kvf_net_free_port(&port) != KVF_OK)
            return 0;
        snprintf(s_port, sizeof(s_port), "%d", port);
        pid_t server = start_perftest_server(s_port);
        if (server < 0)
            return 0;
        kvf_clock_sleep_ms(150 + 100 * (unsigned)attempt);
        double mbps = run_perftest_client(s_port, s_size, s_iters, s_warm);
        if (mbps < 0)
            return 0;
        int status;
        kill(server, SIGKILL);
        waitpid(server, &status, 0);
        if (mbps > 0)
            return mbps / 1e3;
    }
    return 0;
}

double kvf_bench_perftest_gbps(uint64_t size, bool quick)
{
    double perf = 0;
    for (int k = 0; k < (quick ? 2 : 3); k++) {
        double g = perftest_once_gbps(size, quick);
        perf = g > perf ? g : perf;
    }
    return perf;
}
