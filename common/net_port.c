/* kvf_net_free_port: TCP ports on 127.0.0.1 for tests and local clusters
 * that start one process per port (nothing holds the port until that
 * process binds it).
 *
 * A port the kernel hands out for bind(0) comes from the ephemeral range
 * (net.ipv4.ip_local_port_range), the range every outgoing connection
 * also draws its local port from: between the probe and the bind, any
 * connect() on the machine (a node reaching its router, curl, another
 * test) may take it. So the port is drawn at random below that range,
 * where only listeners live, and probed; bind(0) is the fallback when
 * the range starts too low to leave room. */
#include "kvf/msg.h"
#include "kvf/clock.h"
#include "kvf/sampling.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

/* Ports drawn below the ephemeral range start here (above the ports of
 * most well-known services). */
#define NET_DRAW_LOW   10000
#define NET_DRAW_TRIES 64

/* Ports this process was handed lately: a caller that starts one process
 * per port must get distinct ones. */
#define NET_RECENT_PORTS 64
static int net_recent[NET_RECENT_PORTS];
static unsigned net_n_recent;
static uint64_t net_rng;
static pthread_mutex_t net_lock = PTHREAD_MUTEX_INITIALIZER;

static bool net_port_recent(int port)
{
    unsigned n = net_n_recent < NET_RECENT_PORTS ? net_n_recent : NET_RECENT_PORTS;
    for (unsigned i = 0; i < n; i++)
        if (net_recent[i] == port)
            return true;
    return false;
}

/* Binds a socket to loopback port `port` (0: any): the socket (to close)
 * and the port bound. */
static kvf_status_t net_bind(int port, int *fd_p, int *port_p)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return kvf_status_from_errno(errno);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof(addr);
    if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 ||
        getsockname(fd, (struct sockaddr *)&addr, &alen) < 0) {
        kvf_status_t st = kvf_status_from_errno(errno);
        close(fd);
        return st;
    }
    *fd_p = fd;
    *port_p = ntohs(addr.sin_port);
    return KVF_OK;
}

/* The first port of the ephemeral range; 0 when unknown. */
static int ephemeral_low(void)
{
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    int low = 0, high = 0;
    if (!f)
        return 0;
    if (fscanf(f, "%d %d", &low, &high) != 2)
        low = 0;
    fclose(f);
    return low;
}

/* A free port below the ephemeral range not handed out lately; 0 when
 * none was found in NET_DRAW_TRIES draws or there is no room. */
static int draw_below_ephemeral(void)
{
    int low = ephemeral_low();
    if (low <= NET_DRAW_LOW + 1000 || low > 65536)
        return 0;
    if (!net_rng)
        net_rng = kvf_clock_ns() ^ ((uint64_t)getpid() << 32);
    for (int i = 0; i < NET_DRAW_TRIES; i++) {
        int port = NET_DRAW_LOW + (int)(kvf_splitmix64(&net_rng) % (uint64_t)(low - NET_DRAW_LOW));
        int fd, got;
        if (net_port_recent(port) || net_bind(port, &fd, &got) != KVF_OK)
            continue;
        close(fd);
        return got;
    }
    return 0;
}

/* bind(0)'s port, passing over those handed out lately (their sockets
 * stay bound until a new one is found, so the kernel offers another). */
static kvf_status_t any_port(int *port_p)
{
    int held[8], n_held = 0, fd = -1, port = 0;
    kvf_status_t st = net_bind(0, &fd, &port);
    while (st == KVF_OK && net_port_recent(port) && n_held < 8) {
        held[n_held++] = fd;
        st = net_bind(0, &fd, &port);
    }
    if (st == KVF_OK) {
        close(fd);
        *port_p = port;
    }
    while (n_held > 0)
        close(held[--n_held]);
    return st;
}

kvf_status_t kvf_net_free_port(int *port_p)
{
    pthread_mutex_lock(&net_lock);
    int port = draw_below_ephemeral();
    kvf_status_t st = port ? KVF_OK : any_port(&port);
    if (st == KVF_OK) {
        net_recent[net_n_recent++ % NET_RECENT_PORTS] = port;
        *port_p = port;
    }
    pthread_mutex_unlock(&net_lock);
    return st;
}
