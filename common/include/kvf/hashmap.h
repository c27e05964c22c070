/* The project's one hash map: uthash (<uthash.h>, Debian uthash-dev,
 * header only), set up once here. Include this header, never <uthash.h>.
 *
 * uthash is intrusive: an element embeds a `UT_hash_handle hh;` and the
 * table is a pointer to an element type, NULL when empty. The elements
 * stay where the caller put them (an array, a struct it owns); the table
 * allocates only its buckets.
 *
 *   typedef struct { uint64_t id; ...; UT_hash_handle hh; } req_t;
 *   req_t *reqs = NULL;                          the empty table
 *   KVF_HASH_ADD(reqs, id, q, st);               key in the element
 *   KVF_HASH_ADD_KEYPTR(map, name, len, e, st);  key elsewhere (borrowed)
 *   HASH_FIND(hh, reqs, &id, sizeof(id), q);     q = the element or NULL
 *   HASH_DELETE(hh, reqs, q);                    q is the caller's again
 *   HASH_CLEAR(hh, reqs);                        frees the buckets only
 *
 * What this header adds to plain uthash:
 *   - out of memory is an error the caller sees (KVF_ERR_NOMEM from the
 *     adds below), never uthash's default exit(): library code returns
 *     errors (docs/STYLE.md);
 *   - adds that report it. Use KVF_HASH_ADD / KVF_HASH_ADD_KEYPTR, not
 *     HASH_ADD*: the plain macros fail silently here.
 *
 * Keys are compared as bytes (memcmp of keylen bytes) and hashed with
 * uthash's default (Jenkins) function. A key must not change, nor move
 * for KEYPTR, while its element is in the table. Adding a key already
 * there adds a second element (HASH_FIND then returns either): look up
 * first when keys may repeat.
 *
 * Thread rules: HASH_FIND only reads; any number of threads may look up in
 * a table nobody changes. Adds and deletes need the table to themselves. */
#ifndef KVF_HASHMAP_H
#define KVF_HASHMAP_H

#ifdef UTHASH_H
#error "<uthash.h> included before kvf/hashmap.h: include only kvf/hashmap.h"
#endif

#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* A failed allocation leaves the table as it was and the element out of
 * it (hh.tbl NULL), where the default would exit the process. */
#define HASH_NONFATAL_OOM 1
#include <uthash.h>

#include "kvf/status.h"

/* Adds elt keyed by keylen bytes at keyptr (borrowed: they must stay put
 * while elt is in the table). Sets st (a kvf_status_t lvalue) to KVF_OK,
 * or KVF_ERR_NOMEM with elt not added and the table unchanged. */
#define KVF_HASH_ADD_KEYPTR(head, keyptr, keylen, elt, st)                                         \
    do {                                                                                           \
        HASH_ADD_KEYPTR(hh, head, keyptr, keylen, elt);                                            \
        (st) = (elt)->hh.tbl ? KVF_OK : KVF_ERR_NOMEM;                                             \
    } while (0)

/* Adds elt keyed by its own field (an integer or a fixed-size array), as
 * KVF_HASH_ADD_KEYPTR. */
#define KVF_HASH_ADD(head, field, elt, st)                                                         \
    KVF_HASH_ADD_KEYPTR(head, &(elt)->field, sizeof((elt)->field), elt, st)

/* A set of strings on the same table, for callers that only ask "seen it?".
 * The strings are borrowed; the set holds at most the capacity given to
 * kvf_strset_init (its nodes are one allocation). Caller owns the struct
 * (init/fini). Same thread rules as the table. */
typedef struct kvf_strset_node {
    UT_hash_handle hh;
} kvf_strset_node_t;

typedef struct {
    kvf_strset_node_t *nodes; /* (cap) */
    size_t n, cap;
    kvf_strset_node_t *head;
} kvf_strset_t;

/* An empty set with room for cap strings. KVF_ERR_NOMEM, set untouched
 * but safe to fini, when the nodes cannot be allocated. */
kvf_status_t kvf_strset_init(kvf_strset_t *set, size_t cap);

/* Adds s (borrowed: it must outlive the set, or its fini). *added_p (may
 * be NULL) is false when s was already there, which leaves the set as it
 * was. KVF_ERR_TOO_BIG when the set is full, KVF_ERR_NOMEM when the table
 * cannot grow; s is not added then. */
kvf_status_t kvf_strset_add(kvf_strset_t *set, const char *s, bool *added_p);

/* True when s is in the set. */
bool kvf_strset_has(const kvf_strset_t *set, const char *s);

/* Frees the table and the nodes (not the strings). */
void kvf_strset_fini(kvf_strset_t *set);

#endif
