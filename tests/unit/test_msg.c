/* Messaging between real processes: senders started as separate processes
 * (this binary re-executed with --sender) push envelopes into an inbox over
 * tcp:// on a free loopback port and over ipc://; none may be lost and each
 * sender's order must be kept. Also: a garbage frame is dropped, counted,
 * and the inbox keeps serving. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <nanomsg/nn.h>
#include <nanomsg/pipeline.h>

#include "kvf/clock.h"
#include "kvf/log.h"
#include "kvf/identity.h"
#include "kvf/msg.h"
#include "support.h"

#define N_MSGS 10000
#define N_SENDERS 2

static char self_path[4096];

/* Child mode: pushes count heartbeats with seq 0..count-1 to url. */
static int run_sender(const char *url, const char *name, int count)
{
    kvf_outbox_t *out;
    if (kvf_outbox_create(url, &out) != KVF_OK)
        return 3;
    Kvf__Heartbeat hb = KVF__HEARTBEAT__INIT;
    Kvf__Load load = KVF__LOAD__INIT;
    hb.node_id = (char *)name;
    hb.load = &load;
    kvf_envelope_t env;
    kvf_envelope_init(&env, name);
    env.body_case = KVF__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    for (int i = 0; i < count; i++) {
        hb.seq = (uint64_t)i;
        load.queued_tokens = (uint64_t)i * 3;
        if (kvf_outbox_send(out, &env, 10000) != KVF_OK) {
            kvf_outbox_destroy(out);
            return 4;
        }
    }
    /* nanomsg drops what is still queued when a socket closes, so stay
     * until the receiver says it has everything (closes our stdin). */
    char c;
    while (read(STDIN_FILENO, &c, 1) > 0) {
    }
    kvf_outbox_destroy(out);
    return 0;
}

/* Starts a sender; *release_fd_p is the write end of its stdin: closing
 * it lets the sender exit. */
static pid_t spawn_sender(const char *url, const char *name, int *release_fd_p)
{
    int fds[2];
    assert_int_equal(pipe2(fds, O_CLOEXEC), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[0], STDIN_FILENO);
        close(fds[0]);
        close(fds[1]);
        char count[16];
        snprintf(count, sizeof(count), "%d", N_MSGS);
        execl(self_path, self_path, "--sender", url, name, count, (char *)NULL);
        _exit(127);
    }
    close(fds[0]);
    *release_fd_p = fds[1];
    return pid;
}

static void exchange(const char *url)
{
    pid_t pids[N_SENDERS];
    int release[N_SENDERS];
    char names[N_SENDERS][16];
    for (int s = 0; s < N_SENDERS; s++) {
        snprintf(names[s], sizeof(names[s]), "sender%d", s);
        pids[s] = spawn_sender(url, names[s], &release[s]);
    }
    kvf_inbox_t *in;
    assert_int_equal(kvf_inbox_create(url, 0, &in), KVF_OK);
    uint64_t next[N_SENDERS] = {0};
    int total = 0;
    uint64_t deadline = kvf_clock_ns() + 60ull * 1000000000u;
    while (total < N_SENDERS * N_MSGS && kvf_clock_ns() < deadline) {
        kvf_envelope_t *env = NULL;
        kvf_status_t st = kvf_inbox_recv(in, 1000, &env);
        if (st == KVF_ERR_TIMEOUT)
            continue;
        assert_int_equal(st, KVF_OK);
        assert_int_equal(env->body_case, KVF__ENVELOPE__BODY_HEARTBEAT);
        int s = -1;
        for (int k = 0; k < N_SENDERS; k++)
            if (!strcmp(env->sender, names[k]))
                s = k;
        assert_true(s >= 0);
        assert_int_equal(env->heartbeat->seq, next[s]);
        assert_int_equal(env->heartbeat->load->queued_tokens, next[s] * 3);
        next[s]++;
        total++;
        kvf_envelope_free(env);
    }
    for (int s = 0; s < N_SENDERS; s++) {
        int status = 0;
        close(release[s]);
        if (total < N_SENDERS * N_MSGS)
            kill(pids[s], SIGKILL);
        assert_int_equal(waitpid(pids[s], &status, 0), pids[s]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    assert_int_equal(total, N_SENDERS * N_MSGS);
    kvf_envelope_t *extra = NULL;
    assert_int_equal(kvf_inbox_recv(in, 0, &extra), KVF_ERR_AGAIN);
    assert_int_equal(kvf_inbox_dropped(in), 0);
    kvf_inbox_destroy(in);
}

static void test_tcp_two_processes(void **state)
{
    (void)state;
    int port;
    assert_int_equal(kvf_net_free_port(&port), KVF_OK);
    char url[64];
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", port);
    exchange(url);
}

/* Ports kvf_net_free_port hands out: free, distinct over its last 64,
 * and below the ephemeral range (where outgoing connections take their
 * local ports) whenever that range leaves room. */
static void test_free_ports(void **state)
{
    (void)state;
    int low = 0, high = 0;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d %d", &low, &high) != 2)
            low = 0;
        fclose(f);
    }
    int ports[64];
    for (int i = 0; i < 64; i++) {
        assert_int_equal(kvf_net_free_port(&ports[i]), KVF_OK);
        assert_true(ports[i] > 0 && ports[i] < 65536);
        if (low > 11000)
            assert_true(ports[i] >= 10000 && ports[i] < low);
        for (int j = 0; j < i; j++)
            assert_int_not_equal(ports[i], ports[j]);
    }
}

static void test_ipc_two_processes(void **state)
{
    (void)state;
    char url[128];
    snprintf(url, sizeof(url), "ipc:///tmp/kvf-test-msg-%d.ipc", (int)getpid());
    exchange(url);
    unlink(url + strlen("ipc://"));
}

static void test_garbage_dropped_and_counted(void **state)
{
    (void)state;
    char url[128];
    snprintf(url, sizeof(url), "ipc:///tmp/kvf-test-msg-g-%d.ipc", (int)getpid());
    kvf_inbox_t *in;
    assert_int_equal(kvf_inbox_create(url, 1024, &in), KVF_OK);
    kvf_outbox_t *out;
    assert_int_equal(kvf_outbox_create(url, &out), KVF_OK);
    const uint8_t junk[] = "not a kvferry frame";
    assert_int_equal(kvf_outbox_send_frame(out, junk, sizeof(junk), 5000), KVF_OK);
    kvf_envelope_t *env = NULL;
    assert_int_equal(kvf_inbox_recv(in, 5000, &env), KVF_ERR_FORMAT);
    assert_int_equal(kvf_inbox_dropped(in), 1);

    /* A frame far above the limit (beyond KVF_MSG_OVERSIZE_FACTOR times
     * it) never reaches us (nanomsg drops it); the next valid one still
     * does. */
    uint8_t *big = calloc(1, 65536);
    assert_non_null(big);
    assert_int_equal(kvf_outbox_send_frame(out, big, 65536, 5000), KVF_OK);
    free(big);
    Kvf__Cancel cancel = KVF__CANCEL__INIT;
    cancel.req_id = 42;
    cancel.epoch = 3;
    kvf_envelope_t msg;
    kvf_envelope_init(&msg, "router");
    msg.body_case = KVF__ENVELOPE__BODY_CANCEL;
    msg.cancel = &cancel;
    /* The oversized frame makes nanomsg drop the connection; the outbox
     * reconnects and the next send goes through. */
    uint64_t deadline = kvf_clock_ns() + 10ull * 1000000000u;
    kvf_status_t st = KVF_ERR_TIMEOUT;
    while (kvf_clock_ns() < deadline) {
        assert_int_equal(kvf_outbox_send(out, &msg, 5000), KVF_OK);
        st = kvf_inbox_recv(in, 300, &env);
        if (st == KVF_OK)
            break;
    }
    assert_int_equal(st, KVF_OK);
    assert_int_equal(env->cancel->req_id, 42);
    assert_int_equal(env->cancel->epoch, 3);
    kvf_envelope_free(env);
    kvf_outbox_destroy(out);
    kvf_inbox_destroy(in);
    unlink(url + strlen("ipc://"));
}

/* Counts the lines of log holding text. */
static int count_lines(const char *log, const char *text)
{
    int n = 0;
    for (const char *p = log; (p = strstr(p, text)); p += strlen(text))
        n++;
    return n;
}

/* A frame over the inbox's limit is dropped with a line giving its size
 * and the limit; a flood of malformed frames logs the first
 * KVF_REFUSALS_LOG_BURST only (the rest are counted for a summary). */
static void test_drops_logged_with_a_bound(void **state)
{
    (void)state;
    char url[128];
    snprintf(url, sizeof(url), "ipc:///tmp/kvf-test-msg-d-%d.ipc", (int)getpid());
    kvf_inbox_t *in;
    assert_int_equal(kvf_inbox_create(url, 1024, &in), KVF_OK);
    kvf_outbox_t *out;
    assert_int_equal(kvf_outbox_create(url, &out), KVF_OK);
    kvf_log_level_t level = kvf_log_level;
    kvf_log_set_level(KVF_LOG_WARN);
    kvf_test_stderr_begin();
    uint8_t *big = calloc(1, 4096);
    assert_non_null(big);
    assert_int_equal(kvf_outbox_send_frame(out, big, 4096, 5000), KVF_OK);
    free(big);
    kvf_envelope_t *env = NULL;
    kvf_status_t st = kvf_inbox_recv(in, 5000, &env);
    const uint8_t junk[] = "not a kvferry frame";
    for (int i = 0; i < 50; i++)
        assert_int_equal(kvf_outbox_send_frame(out, junk, sizeof(junk), 5000), KVF_OK);
    int format = 0;
    for (int i = 0; i < 50; i++)
        format += kvf_inbox_recv(in, 5000, &env) == KVF_ERR_FORMAT;
    char *log = kvf_test_stderr_end();
    kvf_log_set_level(level);
    assert_int_equal(st, KVF_ERR_TOO_BIG);
    assert_int_equal(format, 50);
    assert_int_equal(kvf_inbox_dropped(in), 51);
    if (!strstr(log, "dropped a 4096-byte message: ") || !strstr(log, "(the limit is 1024 bytes)"))
        fail_msg("no line for the oversized frame: %s", log);
    /* the burst of a window: the oversized frame and 4 malformed ones (a
     * second window's burst if this ran across one, never all 51) */
    int lines = count_lines(log, "dropped a ");
    if (lines < KVF_REFUSALS_LOG_BURST || lines > 2 * KVF_REFUSALS_LOG_BURST)
        fail_msg("%d lines, want %d: %s", lines, KVF_REFUSALS_LOG_BURST, log);
    free(log);
    kvf_outbox_destroy(out);
    kvf_inbox_destroy(in);
    unlink(url + strlen("ipc://"));
}

static void test_bad_urls(void **state)
{
    (void)state;
    kvf_inbox_t *in = NULL;
    kvf_log_set_level(KVF_LOG_OFF);
    assert_true(kvf_inbox_create("nonsense://x", 0, &in) < 0);
    assert_true(kvf_inbox_create("tcp://127.0.0.1:notaport", 0, &in) < 0);
    assert_null(in);
    kvf_outbox_t *out = NULL;
    assert_true(kvf_outbox_create("bogus", &out) < 0);
    assert_null(out);
    kvf_log_set_level(KVF_LOG_INFO);
}

int main(int argc, char **argv)
{
    if (argc == 5 && !strcmp(argv[1], "--sender"))
        return run_sender(argv[2], argv[3], atoi(argv[4]));
    ssize_t n = readlink("/proc/self/exe", self_path, sizeof(self_path) - 1);
    if (n <= 0)
        return 1;
    self_path[n] = '\0';
    kvf_log_init("test", NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tcp_two_processes),
        cmocka_unit_test(test_free_ports),
        cmocka_unit_test(test_ipc_two_processes),
        cmocka_unit_test(test_garbage_dropped_and_counted),
        cmocka_unit_test(test_drops_logged_with_a_bound),
        cmocka_unit_test(test_bad_urls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
