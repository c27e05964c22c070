/* Command-line flags, the same way in every kvferry binary.
 *
 *   --name VALUE, --name=VALUE    long options only
 *   --flag / --no-flag            booleans
 *   --help, --version             print and return KVF_FLAGS_EXIT
 *   KVF_<NAME>=VALUE              environment override (when the flag set
 *                                 enables it); the command line wins.
 *                                 NAME is the flag's name upper-cased with
 *                                 '-' turned into '_': --kv-mem -> KVF_KV_MEM
 *
 * Sizes accept K, M, G, T suffixes (powers of 1024, optional "iB"/"B").
 * The help text is generated from the table, so it always matches what
 * the binary parses. */
#ifndef KVF_FLAGS_H
#define KVF_FLAGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvf/status.h"

typedef enum {
    KVF_FLAG_BOOL,   /* bool *            */
    KVF_FLAG_INT,    /* int *             */
    KVF_FLAG_UINT64, /* uint64_t *        */
    KVF_FLAG_SIZE,   /* uint64_t *, bytes with K/M/G/T suffixes */
    KVF_FLAG_DOUBLE, /* double *          */
    KVF_FLAG_STRING, /* const char **: points into argv or environ */
} kvf_flag_type_t;

typedef struct {
    const char *name;    /* without the leading "--" */
    kvf_flag_type_t type;
    void *value;         /* where the parsed value goes; keeps its default otherwise */
    const char *metavar; /* shown in help, e.g. "URL"; NULL for booleans */
    const char *help;
    bool *seen;          /* optional: set to true when the flag was given */
} kvf_flag_t;

typedef struct {
    const char *prog;        /* "kvf-router", "kvf generate" */
    const char *usage;       /* the synopsis after prog, e.g. "--model DIR [options]" */
    const char *summary;     /* one paragraph: what the command does today */
    const kvf_flag_t *flags;
    size_t n_flags;
    bool env;                /* read KVF_<NAME> overrides */
    const char **positional; /* storage for positional arguments, or NULL */
    int max_positional;
    int n_positional;        /* out: how many were found */
} kvf_flagset_t;

typedef enum {
    KVF_FLAGS_RUN = 0,  /* parsed: go on */
    KVF_FLAGS_EXIT = 1, /* --help or --version printed: exit 0 */
} kvf_flags_outcome_t;

/* Parses argv[1..argc) into the flag table. Returns KVF_FLAGS_RUN or
 * KVF_FLAGS_EXIT, or a negative kvf_status_t after printing the problem
 * and a pointer to --help on stderr. */
int kvf_flags_parse(kvf_flagset_t *set, int argc, char **argv);

/* Prints the generated help text to stdout. */
void kvf_flags_print_help(const kvf_flagset_t *set);

/* Prints "<prog> <version>" plus the GPU summary to stdout. */
void kvf_flags_print_version(const char *prog);

/* Parses a byte size ("512M", "2GiB", "4096"). */
kvf_status_t kvf_parse_size(const char *text, uint64_t *bytes_p);

/* Parses a comma-separated list of non-negative ids ("1,2,3").
 * *ids_p is malloc'd and owned by the caller; set only on success. */
kvf_status_t kvf_parse_id_list(const char *text, uint32_t **ids_p, size_t *n_p);

#define KVF_NFLAGS(arr) (sizeof(arr) / sizeof((arr)[0]))

#endif
