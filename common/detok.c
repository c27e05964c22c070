/* Decoding (kvf_tokenizer_decode) and the incremental decoder for
 * streaming (kvf_detok_*): each id's piece (tokenizer_decoder.c) through
 * what of the decoder chain depends on more than one token: the lossy
 * UTF-8 decoding of ByteLevel bytes and of byte-fallback runs, the first
 * token under Metaspace, the joining space when there is no decoder, and
 * Strip steps on the joined text. Layout in tokenizer_internal.h. */
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

/* Appends the lossy decoding of s[0..n) (nothing held) to text. */
static kvf_status_t text_append_lossy(kvf_tok_text_t *text, const uint8_t *s, size_t n)
{
    kvf_status_t st = kvf_array_reserve(&text->data, &text->cap, text->len + 3 * n + 1, 64, 1);
    if (st != KVF_OK)
        return st;
    append_lossy(text->data, &text->len, s, n, false);
    text->data[text->len] = '\0';
    return KVF_OK;
}

/* The piece of a known id: precomputed, or made in *scratch for the first
 * token of a chain whose first token differs. */
static kvf_status_t piece_for(const kvf_tokenizer_t *tok, uint32_t id, bool first,
                              kvf_tok_text_t *scratch, const char **s_p, size_t *len_p, int *byte_p)
{
    const kvf_tok_decoder_t *d = &tok->dec;
    if (first && d->first_differs) {
        kvf_status_t st = kvf_tokenizer__make_piece(tok, id, true, scratch, byte_p);
        *s_p = scratch->data ? scratch->data : "";
        *len_p = scratch->len;
        return st;
    }
    const kvf_tok_piece_t *p = &d->pieces[id];
    *s_p = d->arena + p->off;
    *len_p = p->len;
    *byte_p = p->byte;
    return KVF_OK;
}

/* The text of a finished byte-fallback run, through the per-element steps. */
static kvf_status_t run_text(const kvf_tok_decoder_t *d, const uint8_t *run, size_t n, bool first,
                             kvf_tok_text_t *out)
{
    kvf_tok_text_t text = {0};
    kvf_status_t st = text_append_lossy(&text, run, n);
    if (st == KVF_OK)
        st = kvf_tokenizer__apply_steps(d->after, d->n_after, first, &text);
    if (st == KVF_OK)
        st = kvf_tokenizer__text_append(out, text.data, text.len);
    free(text.data);
    return st;
}

/* ---- the whole sequence ---------------------------------------------------- */

/* Pieces through byte-fallback runs and the joining space into out. */
static kvf_status_t decode_elements(const kvf_tokenizer_t *tok, const uint32_t *ids, size_t n,
                                    kvf_tok_text_t *out)
{
    const kvf_tok_decoder_t *d = &tok->dec;
    kvf_tok_text_t run = {0}, scratch = {0};
    bool started = false, in_run = false, had_element = false;
    kvf_status_t st = KVF_OK;
    for (size_t i = 0; i <= n && st == KVF_OK; i++) {
        if (i < n && !kvf_tokenizer_has_id(tok, ids[i]))
            continue;
        const char *s = "";
        size_t len = 0;
        int byte = -1;
        if (i < n)
            st = piece_for(tok, ids[i], !started, &scratch, &s, &len, &byte);
        started = true;
        if (st == KVF_OK && byte >= 0) {
            uint8_t b = (uint8_t)byte;
            st = kvf_tokenizer__text_append(&run, &b, 1);
            in_run = true;
            continue;
        }
        if (st == KVF_OK && in_run) {
            st = run_text(d, (const uint8_t *)run.data, run.len, !had_element, out);
            run.len = 0;
            in_run = false;
            had_element = true;
        }
        if (i == n || st != KVF_OK)
            break;
        if (d->space_join && had_element)
            st = kvf_tokenizer__text_append(out, " ", 1);
        if (st == KVF_OK)
            st = kvf_tokenizer__text_append(out, s, len);
        had_element = true;
    }
    free(run.data);
    free(scratch.data);
    return st;
}

kvf_status_t kvf_tokenizer_decode(const kvf_tokenizer_t *tok, const uint32_t *ids, size_t n,
                                  char **text_p, size_t *len_p)
{
    if (!tok || (!ids && n > 0))
        return KVF_ERR_INVAL;
    const kvf_tok_decoder_t *d = &tok->dec;
    kvf_tok_text_t text = {0}, raw = {0};
    kvf_status_t st = kvf_tokenizer__text_append(&text, "", 0);
    if (st == KVF_OK && d->byte_level) {
        for (size_t i = 0; i < n && st == KVF_OK; i++)
            if (kvf_tokenizer_has_id(tok, ids[i]))
                st = kvf_tokenizer__text_append(&raw, d->arena + d->pieces[ids[i]].off,
                                                d->pieces[ids[i]].len);
        if (st == KVF_OK)
            st = text_append_lossy(&text, (const uint8_t *)raw.data, raw.len);
        free(raw.data);
    } else if (st == KVF_OK) {
        st = decode_elements(tok, ids, n, &text);
    }
    if (st == KVF_OK)
        st = kvf_tokenizer__apply_steps(d->whole, d->n_whole, false, &text);
    if (st != KVF_OK) {
        free(text.data);
        return st;
    }
    *text_p = text.data;
    if (len_p)
        *len_p = text.len;
    return KVF_OK;
}

/* ---- streaming ------------------------------------------------------------- */

static void detok_restart(kvf_detok_t *detok)
{
    const kvf_tok_decoder_t *d = &detok->tok->dec;
    detok->n_pending = 0;
    detok->n_run = 0;
    detok->in_run = detok->started = detok->had_element = false;
    for (size_t k = 0; k < KVF_DETOK_MAX_STRIPS; k++) {
        detok->strip_left[k] = k < d->n_whole ? d->whole[k].start : 0;
        detok->strip_held[k] = 0;
    }
}

void kvf_detok_init(kvf_detok_t *detok, const kvf_tokenizer_t *tok)
{
    *detok = (kvf_detok_t){.tok = tok};
    detok_restart(detok);
}

static kvf_status_t out_append(kvf_detok_t *detok, const void *s, size_t n)
{
    kvf_status_t st = kvf_array_reserve(&detok->out, &detok->out_cap, detok->out_len + n + 1, 64, 1);
    if (st != KVF_OK)
        return st;
    if (n)
        memcpy(detok->out + detok->out_len, s, n);
    detok->out_len += n;
    return KVF_OK;
}

/* One character c[0..n) = cp through the Strip steps from step k on. */
static kvf_status_t strip_char(kvf_detok_t *detok, size_t k, uint32_t cp, const char *c, size_t n)
{
    const kvf_tok_decoder_t *d = &detok->tok->dec;
    for (; k < d->n_whole; k++) {
        const kvf_tok_step_t *step = &d->whole[k];
        bool is = cp == step->strip_cp;
        if (detok->strip_left[k]) {
            if (is) {
                detok->strip_left[k]--;
                return KVF_OK;
            }
            detok->strip_left[k] = 0;
        }
        if (is && detok->strip_held[k] < step->stop) {
            detok->strip_held[k]++;
            return KVF_OK;
        }
        /* a held run followed by another character is not the end: out */
        uint8_t held[4];
        size_t held_len = is ? 0 : kvf_utf8_encode(step->strip_cp, held);
        for (; !is && detok->strip_held[k]; detok->strip_held[k]--) {
            kvf_status_t st = strip_char(detok, k + 1, step->strip_cp, (const char *)held, held_len);
            if (st != KVF_OK)
                return st;
        }
    }
    return out_append(detok, c, n);
}

/* Text (valid UTF-8) to the caller, through the Strip steps. */
static kvf_status_t emit(kvf_detok_t *detok, const char *s, size_t n)
{
    const kvf_tok_decoder_t *d = &detok->tok->dec;
    bool direct = true;
    for (size_t k = 0; k < d->n_whole; k++)
        direct &= !detok->strip_left[k] && !d->whole[k].stop;
    if (direct)
        return out_append(detok, s, n);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = kvf_utf8_next((const uint8_t *)s + i, n - i, &cp);
        if (k <= 0) /* not reached: the text is valid UTF-8 */
            return KVF_ERR_INVAL;
        kvf_status_t st = strip_char(detok, 0, cp, s + i, (size_t)k);
        if (st != KVF_OK)
            return st;
        i += (size_t)k;
    }
    return KVF_OK;
}

/* Bytes through the lossy decoding: whole characters out, an incomplete
 * one held; with end, nothing is held. */
static kvf_status_t stream_bytes(kvf_detok_t *detok, const void *bytes, size_t n, bool end)
{
    size_t total = detok->n_pending + n;
    /* the joined bytes, then room for their text (3 bytes per byte) */
    kvf_status_t st = kvf_array_reserve(&detok->scratch, &detok->scratch_cap, total * 4 + 1, 64, 1);
    if (st != KVF_OK)
        return st;
    uint8_t *joined = detok->scratch;
    char *text = (char *)detok->scratch + total;
    memcpy(joined, detok->pending, detok->n_pending);
    if (n)
        memcpy(joined + detok->n_pending, bytes, n);
    size_t len = 0;
    size_t used = append_lossy(text, &len, joined, total, !end);
    detok->n_pending = total - used; /* at most 3: an incomplete character */
    memmove(detok->pending, joined + used, detok->n_pending);
    return emit(detok, text, len);
}

/* Ends a byte-fallback run: its held bytes become text. */
static kvf_status_t end_run(kvf_detok_t *detok)
{
    const kvf_tok_decoder_t *d = &detok->tok->dec;
    if (!detok->in_run)
        return KVF_OK;
    detok->in_run = false;
    bool first = !detok->had_element;
    detok->had_element = true;
    if (!d->n_after)
        return stream_bytes(detok, NULL, 0, true);
    kvf_tok_text_t text = {0};
    kvf_status_t st = run_text(d, detok->run, detok->n_run, first, &text);
    detok->n_run = 0;
    if (st == KVF_OK)
        st = emit(detok, text.data ? text.data : "", text.len);
    free(text.data);
    return st;
}

/* One known id's piece into the stream. */
static kvf_status_t push_piece(kvf_detok_t *detok, const char *s, size_t len, int byte)
{
    const kvf_tok_decoder_t *d = &detok->tok->dec;
    if (d->byte_level)
        return stream_bytes(detok, s, len, false);
    if (byte >= 0) {
        uint8_t b = (uint8_t)byte;
        detok->in_run = true;
        if (!d->n_after)
            return stream_bytes(detok, &b, 1, false);
        kvf_status_t st =
            kvf_array_reserve(&detok->run, &detok->run_cap, detok->n_run + 1, 16, 1);
        if (st == KVF_OK)
            detok->run[detok->n_run++] = b;
        return st;
    }
    kvf_status_t st = end_run(detok);
    if (st == KVF_OK && d->space_join && detok->had_element)
        st = emit(detok, " ", 1);
    if (st == KVF_OK)
        st = emit(detok, s, len);
    detok->had_element = true;
    return st;
}

static kvf_status_t hand_out(kvf_detok_t *detok, kvf_status_t st, const char **text_p,
                             size_t *len_p)
{
    if (st == KVF_OK)
        st = out_append(detok, "", 0);
    if (st != KVF_OK)
        return st;
    detok->out[detok->out_len] = '\0';
    *text_p = detok->out;
    *len_p = detok->out_len;
    return KVF_OK;
}

kvf_status_t kvf_detok_push(kvf_detok_t *detok, uint32_t id, const char **text_p, size_t *len_p)
{
    detok->out_len = 0;
    if (!kvf_tokenizer_has_id(detok->tok, id))
        return hand_out(detok, KVF_OK, text_p, len_p);
    kvf_tok_text_t scratch = {0};
    const char *s;
    size_t len;
    int byte;
    kvf_status_t st = piece_for(detok->tok, id, !detok->started, &scratch, &s, &len, &byte);
    detok->started = true;
    if (st == KVF_OK)
        st = push_piece(detok, s, len, byte);
    free(scratch.data);
    return hand_out(detok, st, text_p, len_p);
}

kvf_status_t kvf_detok_flush(kvf_detok_t *detok, const char **text_p, size_t *len_p)
{
    detok->out_len = 0;
    kvf_status_t st = end_run(detok);
    if (st == KVF_OK && detok->n_pending)
        st = stream_bytes(detok, NULL, 0, true);
    /* held Strip characters end the text: the Strip takes them */
    detok_restart(detok);
    return hand_out(detok, st, text_p, len_p);
}

void kvf_detok_fini(kvf_detok_t *detok)
{
    free(detok->out);
    free(detok->run);
    free(detok->scratch);
    detok->out = NULL;
    detok->run = detok->scratch = NULL;
    detok->out_cap = detok->run_cap = detok->scratch_cap = 0;
    detok->n_pending = detok->n_run = 0;
}
