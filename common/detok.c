/* Decoding (kvf_tokenizer_decode) and the incremental decoder for
 * streaming (kvf_detok_*): token bytes to UTF-8 text, invalid sequences as
 * U+FFFD. Layout in tokenizer_internal.h. */
#include "tokenizer_internal.h"

#include "kvf/array.h"
#include "kvf/utf8.h"

#include <stdlib.h>
#include <string.h>

/* Appends s[0..n) to out as valid UTF-8, invalid subparts as U+FFFD. With
 * hold_tail, an incomplete character at the end is left unconsumed.
 * Returns the number of bytes consumed; out must have room for 3 * n. */
static size_t append_lossy(char *out, size_t *out_len, const uint8_t *s, size_t n, bool hold_tail)
{
    size_t i = 0, o = *out_len;
    while (i < n) {
        if (s[i] < 0x80) {
            out[o++] = (char)s[i++];
            continue;
        }
        int k = kvf_utf8_next(s + i, n - i, NULL);
        if (k > 0) {
            memcpy(out + o, s + i, (size_t)k);
            o += (size_t)k;
            i += (size_t)k;
            continue;
        }
        if (k == 0 && hold_tail)
            break;
        memcpy(out + o, "\xef\xbf\xbd", 3);
        o += 3;
        i += k == 0 ? n - i : (size_t)-k;
    }
    *out_len = o;
    return i;
}

kvf_status_t kvf_tokenizer_decode(const kvf_tokenizer_t *tok, const uint32_t *ids, size_t n,
                                  char **text_p, size_t *len_p)
{
    if (!tok || (!ids && n > 0))
        return KVF_ERR_INVAL;
    size_t raw_len = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < tok->n_ids)
            raw_len += tok->tokens[ids[i]].bytes_len;
    uint8_t *raw = malloc(raw_len + 1);
    char *text = malloc(raw_len * 3 + 1);
    if (!raw || !text) {
        free(raw);
        free(text);
        return KVF_ERR_NOMEM;
    }
    size_t r = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= tok->n_ids)
            continue;
        const kvf_tok_entry_t *e = &tok->tokens[ids[i]];
        memcpy(raw + r, tok->arena + e->bytes_off, e->bytes_len);
        r += e->bytes_len;
    }
    size_t len = 0;
    append_lossy(text, &len, raw, r, false);
    free(raw);
    text[len] = '\0';
    *text_p = text;
    if (len_p)
        *len_p = len;
    return KVF_OK;
}

/* ---- streaming ------------------------------------------------------------- */

void kvf_detok_init(kvf_detok_t *detok, const kvf_tokenizer_t *tok)
{
    *detok = (kvf_detok_t){.tok = tok};
}

static kvf_status_t detok_reserve(kvf_detok_t *detok, size_t need)
{
    return kvf_array_reserve(&detok->out, &detok->out_cap, need, 64, 1);
}

kvf_status_t kvf_detok_push(kvf_detok_t *detok, uint32_t id, const char **text_p, size_t *len_p)
{
    size_t n_bytes;
    const uint8_t *bytes = kvf_tokenizer_token_bytes(detok->tok, id, &n_bytes);
    size_t total = detok->n_pending + n_bytes;
    /* pending bytes + the token, then room for the text (3 bytes per input
     * byte at worst) after it */
    kvf_status_t st = detok_reserve(detok, total + total * 3 + 1);
    if (st != KVF_OK)
        return st;
    uint8_t *joined = (uint8_t *)detok->out + total * 3 + 1;
    memcpy(joined, detok->pending, detok->n_pending);
    if (n_bytes)
        memcpy(joined + detok->n_pending, bytes, n_bytes);
    size_t len = 0;
    size_t used = append_lossy(detok->out, &len, joined, total, true);
    detok->n_pending = total - used; /* at most 3: an incomplete character */
    memmove(detok->pending, joined + used, detok->n_pending);
    detok->out[len] = '\0';
    *text_p = detok->out;
    *len_p = len;
    return KVF_OK;
}

kvf_status_t kvf_detok_flush(kvf_detok_t *detok, const char **text_p, size_t *len_p)
{
    kvf_status_t st = detok_reserve(detok, 4);
    if (st != KVF_OK)
        return st;
    size_t len = 0;
    if (detok->n_pending)
        append_lossy(detok->out, &len, detok->pending, detok->n_pending, false);
    detok->n_pending = 0;
    detok->out[len] = '\0';
    *text_p = detok->out;
    *len_p = len;
    return KVF_OK;
}

void kvf_detok_fini(kvf_detok_t *detok)
{
    free(detok->out);
    detok->out = NULL;
    detok->out_cap = 0;
    detok->n_pending = 0;
}
