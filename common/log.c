#include "kvf/log.h"
#include "kvf/clock.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

kvf_log_level_t kvf_log_level = KVF_LOG_INFO;

/* The sink's identity; written at start-up by main() before threads. */
static char log_role[32] = "kvf";
static char log_node[64];

bool kvf_log_parse_level(const char *name, kvf_log_level_t *level_p)
{
    static const char *const names[] = {"debug", "info", "warn", "error", "off"};
    for (int i = 0; i < 5; i++) {
        if (strcasecmp(name, names[i]) == 0) {
            *level_p = (kvf_log_level_t)i;
            return true;
        }
    }
    return false;
}

void kvf_log_init(const char *role, const char *node_id)
{
    snprintf(log_role, sizeof(log_role), "%s", role ? role : "kvf");
    kvf_log_set_node(node_id);
    const char *env = getenv("KVF_LOG");
    kvf_log_level_t level;
    if (env && *env) {
        if (kvf_log_parse_level(env, &level))
            kvf_log_level = level;
        else
            kvf_log_write(KVF_LOG_WARN, "KVF_LOG=%s is not debug|info|warn|error|off", env);
    }
}

void kvf_log_set_node(const char *node_id)
{
    snprintf(log_node, sizeof(log_node), "%s", node_id ? node_id : "");
}

void kvf_log_set_level(kvf_log_level_t level)
{
    kvf_log_level = level;
}

void kvf_log_write(kvf_log_level_t level, const char *fmt, ...)
{
    static const char *const tags[] = {"debug", "info", "warn", "error", "off"};
    char line[2048];
    double t = (double)kvf_clock_ns() / 1e9;
    int n = snprintf(line, sizeof(line), "%12.6f %-5s %s%s%s ", t, tags[level], log_role,
                     log_node[0] ? "/" : "", log_node);
    if (n < 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof(line) - 2)
        len = sizeof(line) - 2;
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}

void kvf_assert_fail(const char *expr, const char *file, int line)
{
    fprintf(stderr, "kvf: assertion failed: %s (%s:%d)\n", expr, file, line);
    abort();
}
