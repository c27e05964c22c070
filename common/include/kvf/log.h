/* Logging: one process-wide sink (the only mutable global kvferry has).
 *
 * Lines go to stderr as
 *     <monotonic seconds> <level> <role>[/<node id>] <message>
 * The level comes from KVF_LOG=debug|info|warn|error (default info) or
 * kvf_log_set_level(). The macros test the level before any formatting,
 * so a discarded line costs one comparison. Thread-safe: each line is
 * written with one write(2). */
#ifndef KVF_LOG_H
#define KVF_LOG_H

#include <stdbool.h>

#ifdef __cplusplus
#define KVF_NORETURN [[noreturn]]
extern "C" {
#else
#define KVF_NORETURN _Noreturn
#endif

typedef enum {
    KVF_LOG_DEBUG = 0,
    KVF_LOG_INFO = 1,
    KVF_LOG_WARN = 2,
    KVF_LOG_ERROR = 3,
    KVF_LOG_OFF = 4,
} kvf_log_level_t;

/* The active level; read by the macros below. */
extern kvf_log_level_t kvf_log_level;

/* Reads KVF_LOG and sets the role and node id printed on every line.
 * role is copied (e.g. "router", "prefill"); node_id may be NULL. */
void kvf_log_init(const char *role, const char *node_id);

/* Changes the node id shown on each line (copied; NULL clears it). */
void kvf_log_set_node(const char *node_id);

void kvf_log_set_level(kvf_log_level_t level);

/* Parses "debug", "info", "warn", "error" or "off"; false if unknown. */
bool kvf_log_parse_level(const char *name, kvf_log_level_t *level_p);

/* Formats and writes one line; use the macros, which check the level. */
void kvf_log_write(kvf_log_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define KVF_LOG_AT(lvl, ...)                                                                       \
    do {                                                                                           \
        if ((lvl) >= kvf_log_level)                                                                \
            kvf_log_write((lvl), __VA_ARGS__);                                                     \
    } while (0)

#define kvf_log_debug(...) KVF_LOG_AT(KVF_LOG_DEBUG, __VA_ARGS__)
#define kvf_log_info(...)  KVF_LOG_AT(KVF_LOG_INFO, __VA_ARGS__)
#define kvf_log_warn(...)  KVF_LOG_AT(KVF_LOG_WARN, __VA_ARGS__)
#define kvf_log_error(...) KVF_LOG_AT(KVF_LOG_ERROR, __VA_ARGS__)

/* Programming errors only (never input from a file or the network):
 * prints file, line and the expression, then aborts. Always on. */
#define KVF_ASSERT(expr)                                                                           \
    do {                                                                                           \
        if (!(expr))                                                                               \
            kvf_assert_fail(#expr, __FILE__, __LINE__);                                            \
    } while (0)

KVF_NORETURN void kvf_assert_fail(const char *expr, const char *file, int line);

#ifdef __cplusplus
}
#endif

#endif
