/* A request's output, placed by position. See stream.h. */
#include "stream.h"

#include "kvf/array.h"

#include <stdlib.h>
#include <string.h>

void kvf_stream_init(kvf_stream_t *s)
{
    memset(s, 0, sizeof(*s));
}

void kvf_stream_fini(kvf_stream_t *s)
{
    free(s->ids);
    memset(s, 0, sizeof(*s));
}

/* Room for n more tokens. */
static kvf_status_t reserve(kvf_stream_t *s, size_t n)
{
    if ((uint64_t)s->n + n <= s->cap)
        return KVF_OK;
    if ((uint64_t)s->n + n > UINT32_MAX)
        return KVF_ERR_NOMEM;
    size_t cap = kvf_array_grow_cap(s->cap, s->n + n, 64);
    if (cap > UINT32_MAX)
        cap = UINT32_MAX;
    kvf_status_t st = kvf_array_resize(&s->ids, cap, sizeof(*s->ids));
    if (st != KVF_OK)
        return st;
    s->cap = (uint32_t)cap;
    return KVF_OK;
}

kvf_status_t kvf_stream_place(kvf_stream_t *s, uint32_t n_generated, const uint32_t *tokens,
                              size_t n, kvf_stream_place_t *place_p)
{
    if (n > n_generated)
        return KVF_ERR_INVAL;
    uint32_t first = n_generated - (uint32_t)n;
    if (n_generated <= s->n && !(n == 0 && n_generated == s->n)) {
        *place_p = KVF_STREAM_RESENT;
        return KVF_OK;
    }
    if (first > s->n) {
        *place_p = KVF_STREAM_GAP;
        return KVF_OK;
    }
    if (first < s->n) {
        *place_p = KVF_STREAM_OVERLAP;
        return KVF_OK;
    }
    kvf_status_t st = reserve(s, n);
    if (st != KVF_OK)
        return st;
    if (n)
        memcpy(s->ids + s->n, tokens, n * sizeof(*tokens));
    s->n = n_generated;
    *place_p = KVF_STREAM_NEXT;
    return KVF_OK;
}

void kvf_stream_chunk(const kvf_stream_t *s, uint32_t from, const char *text, size_t text_len,
                      int finish, kvf_router_chunk_t *chunk_p)
{
    memset(chunk_p, 0, sizeof(*chunk_p));
    if (from < s->n) {
        chunk_p->tokens = s->ids + from;
        chunk_p->n_tokens = s->n - from;
    }
    chunk_p->text = text;
    chunk_p->text_len = text_len;
    chunk_p->finish = finish;
    chunk_p->completion_tokens = s->n;
}
