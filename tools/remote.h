/* The native client side of kvf generate and kvf stats: talks to a
 * router's client socket (kvf/clientsock.h). */
#ifndef KVF_TOOLS_REMOTE_H
#define KVF_TOOLS_REMOTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *router_url;  /* the router's --client URL */
    const char *prompt;      /* text (the router tokenizes, adds BOS), or */
    const uint32_t *ids;     /* prompt ids used exactly as given */
    size_t n_ids;
    uint32_t max_tokens;     /* 0: the router's default */
    float temperature, top_p;
    uint32_t top_k;
    uint64_t seed;
    bool has_seed;
    bool ignore_eos;
    const char *const *stop; /* (n_stop) stop strings */
    size_t n_stop;
    bool print_ids;          /* print the generated ids, comma-separated, not text */
    bool verbose;            /* timings on stderr */
    int timeout_ms;          /* give up when the router says nothing this long */
} kvf_remote_generate_t;

/* Runs one generation through the router, streaming to stdout. Returns
 * the process exit code (0 on success). */
int kvf_remote_generate(const kvf_remote_generate_t *req);

#endif
