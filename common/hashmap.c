/* The string set of kvf/hashmap.h. */
#include "kvf/hashmap.h"

kvf_status_t kvf_strset_init(kvf_strset_t *set, size_t cap)
{
    *set = (kvf_strset_t){0};
    set->nodes = calloc(cap ? cap : 1, sizeof(*set->nodes));
    if (!set->nodes)
        return KVF_ERR_NOMEM;
    set->cap = cap;
    return KVF_OK;
}

kvf_status_t kvf_strset_add(kvf_strset_t *set, const char *s, bool *added_p)
{
    if (added_p)
        *added_p = false;
    if (kvf_strset_has(set, s))
        return KVF_OK;
    if (set->n == set->cap)
        return KVF_ERR_TOO_BIG;
    kvf_strset_node_t *node = &set->nodes[set->n];
    size_t len = strlen(s);
    kvf_status_t st;
    KVF_HASH_ADD_KEYPTR(set->head, s, len, node, st);
    if (st != KVF_OK)
        return st;
    set->n++;
    if (added_p)
        *added_p = true;
    return KVF_OK;
}

bool kvf_strset_has(const kvf_strset_t *set, const char *s)
{
    const kvf_strset_node_t *node;
    HASH_FIND(hh, set->head, s, strlen(s), node);
    return node != NULL;
}

void kvf_strset_fini(kvf_strset_t *set)
{
    HASH_CLEAR(hh, set->head);
    free(set->nodes);
    *set = (kvf_strset_t){0};
}
