/* Growing a malloc'd array: the one doubling rule the modules share, so
 * that none writes its own loop (and its own overflow check).
 *
 * An array here is a pointer T *items to cap items of item_size bytes,
 * allocated by malloc/realloc (or NULL with cap 0) and freed by its owner
 * with free(). The functions take the pointer's address as void * (a
 * T **), and read and write the pointer through memcpy, so any object
 * type T works without a cast at the call. */
#ifndef KVF_ARRAY_H
#define KVF_ARRAY_H

#include <stddef.h>

#include "kvf/status.h"

/* The capacity an array of cap items grows to so that it holds need:
 * cap (min_cap when cap is 0, 1 when both are) doubled until it is at
 * least need, or need itself where doubling would pass SIZE_MAX. cap
 * itself when it holds need already. Pure: allocates nothing. */
size_t kvf_array_grow_cap(size_t cap, size_t need, size_t min_cap);

/* Reallocates *items_pp (a T **) to n_items items of item_size bytes.
 * KVF_ERR_NOMEM when n_items * item_size overflows or realloc fails, and
 * KVF_ERR_INVAL for n_items or item_size 0; on failure *items_pp is
 * untouched (the old array, still the caller's). For arrays that share one
 * capacity: kvf_array_grow_cap once, then this for each. */
kvf_status_t kvf_array_resize(void *items_pp, size_t n_items, size_t item_size);

/* Room for need items in *items_pp (a T **) of *cap_p items: nothing to do
 * when *cap_p >= need; else grows both to kvf_array_grow_cap(*cap_p, need,
 * min_cap) items. KVF_ERR_NOMEM (as kvf_array_resize) leaves *items_pp and
 * *cap_p untouched. Items past the old capacity are uninitialised. */
kvf_status_t kvf_array_reserve(void *items_pp, size_t *cap_p, size_t need, size_t min_cap,
                               size_t item_size);

#endif
