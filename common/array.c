/* kvf/array.h: the doubling rule, and realloc with its overflow check. */
#include "kvf/array.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

size_t kvf_array_grow_cap(size_t cap, size_t need, size_t min_cap)
{
    if (cap >= need)
        return cap;
    if (!cap)
        cap = min_cap ? min_cap : 1;
    while (cap < need) {
        if (cap > SIZE_MAX / 2)
            return need;
        cap *= 2;
    }
    return cap;
}

kvf_status_t kvf_array_resize(void *items_pp, size_t n_items, size_t item_size)
{
    if (!n_items || !item_size)
        return KVF_ERR_INVAL;
    if (n_items > SIZE_MAX / item_size)
        return KVF_ERR_NOMEM;
    void *items;
    memcpy(&items, items_pp, sizeof(items));
    void *grown = realloc(items, n_items * item_size);
    if (!grown)
        return KVF_ERR_NOMEM;
    memcpy(items_pp, &grown, sizeof(grown));
    return KVF_OK;
}

kvf_status_t kvf_array_reserve(void *items_pp, size_t *cap_p, size_t need, size_t min_cap,
                               size_t item_size)
{
    if (need <= *cap_p)
        return KVF_OK;
    size_t cap = kvf_array_grow_cap(*cap_p, need, min_cap);
    kvf_status_t st = kvf_array_resize(items_pp, cap, item_size);
    if (st != KVF_OK)
        return st;
    *cap_p = cap;
    return KVF_OK;
}
