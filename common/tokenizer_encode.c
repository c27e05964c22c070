/* Encoding (kvf_tokenizer_encode), in the order of Hugging Face's
 * tokenizers (the JS port's encode_text):
 *
 *   1. the raw text is cut at the added tokens that are not normalized
 *      (longest match at the leftmost position); a token with lstrip /
 *      rstrip takes the white space of the text beside it;
 *   2. each text section between them is normalized (tokenizer_norm.c),
 *      then cut again at the normalized added tokens (matched in their
 *      normalized form);
 *   3. each remaining subsection is pre-tokenized (tokenizer_pre.c) and
 *      every piece goes through BPE (bpe.c);
 *   4. with add_special_tokens, the post-processor's template puts its
 *      special tokens before and after.
 *
 * Bytes that are not valid UTF-8 cannot go through normalization: each is
 * a piece of its own for BPE, between the valid runs around it. An added
 * token's single_word flag is kept but, as in the JS port, does not
 * change matching. Layout in tokenizer_internal.h. */
#include "tokenizer_internal.h"

#include "kvf/array.h"
#include "kvf/utf8.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const kvf_tokenizer_t *tok;
    kvf_tok_bpe_t bpe;
    kvf_tok_pre_run_t pre;
    uint8_t *norm; /* the normalized section */
    size_t norm_cap;
} encoder_t;

/* What a section is handed to: the section, and whether it starts the
 * text. */
typedef kvf_status_t (*section_fn)(encoder_t *enc, const uint8_t *s, size_t len, bool first);

/* White space as the JS port's trimStart/trimEnd see it (ECMAScript
 * WhiteSpace and LineTerminator). */
static bool js_space(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
           cp == 0x205f || cp == 0x3000 || cp == 0xfeff;
}

/* The end of s[from..to) with its trailing white space removed. */
static size_t trim_end(const uint8_t *s, size_t from, size_t to)
{
    while (to > from) {
        size_t start = to - 1;
        while (start > from && (s[start] & 0xc0) == 0x80 && to - start < 4)
            start--;
        uint32_t cp;
        if (kvf_utf8_next(s + start, to - start, &cp) != (int)(to - start) || !js_space(cp))
            break;
        to = start;
    }
    return to;
}

/* The start of s[from..to) with its leading white space removed. */
static size_t trim_start(const uint8_t *s, size_t from, size_t to)
{
    while (from < to) {
        uint32_t cp;
        int k = kvf_utf8_next(s + from, to - from, &cp);
        if (k <= 0 || !js_space(cp))
            break;
        from += (size_t)k;
    }
    return from;
}

/* The longest added token of the set (normalized or not) at s[pos], or
 * NULL. */
static const kvf_tok_added_t *match_added(const kvf_tokenizer_t *tok, bool normalized,
                                          const uint8_t *s, size_t len, size_t pos)
{
    const kvf_tok_added_t *best = NULL;
    for (size_t i = 0; i < tok->n_added; i++) {
        const kvf_tok_added_t *t = &tok->added[i];
        if (t->normalized == normalized && t->match_len > 0 && t->match_len <= len - pos &&
            (!best || t->match_len > best->match_len) &&
            memcmp(s + pos, t->match, t->match_len) == 0)
            best = t;
    }
    return best;
}

/* Cuts s at the added tokens of one set, emits their ids, and hands the
 * text between them to fn. first: s starts the text. */
static kvf_status_t split_added(encoder_t *enc, bool normalized, const uint8_t *s, size_t len,
                                bool first, section_fn fn)
{
    const kvf_tokenizer_t *tok = enc->tok;
    const bool *first_byte = normalized ? tok->added_norm_first_byte : tok->added_first_byte;
    kvf_status_t st;
    size_t seg = 0;
    for (size_t pos = 0; pos < len; pos++) {
        if (!first_byte[s[pos]])
            continue;
        const kvf_tok_added_t *t = match_added(tok, normalized, s, len, pos);
        if (!t)
            continue;
        size_t start = pos, end = pos + t->match_len;
        if (t->lstrip)
            start = trim_end(s, seg, start);
        if ((st = fn(enc, s + seg, start - seg, first && seg == 0)) != KVF_OK ||
            (st = kvf_tokenizer__emit(&enc->bpe, t->id)) != KVF_OK)
            return st;
        if (t->rstrip) {
            /* the white space after it, up to the next token of the set */
            size_t stop = end;
            while (stop < len &&
                   !(first_byte[s[stop]] && match_added(tok, normalized, s, len, stop)))
                stop++;
            end = trim_start(s, end, stop);
        }
        seg = end;
        pos = end - 1;
    }
    return fn(enc, s + seg, len - seg, first && seg == 0);
}

static kvf_status_t piece_to_bpe(void *ctx, const uint8_t *piece, size_t len)
{
    return kvf_tokenizer__bpe_piece(ctx, piece, len);
}

/* A subsection: pre-tokenized, its pieces through BPE; unknown tokens
 * fuse within it. */
static kvf_status_t encode_subsection(encoder_t *enc, const uint8_t *s, size_t len, bool first)
{
    if (len == 0)
        return KVF_OK;
    enc->bpe.last_unk = false;
    return kvf_tokenizer__pre_tokenize(enc->tok, &enc->pre, s, len, first, piece_to_bpe, &enc->bpe);
}

/* A valid UTF-8 run of a section: normalized, then cut at the normalized
 * added tokens. */
static kvf_status_t encode_valid(encoder_t *enc, const uint8_t *s, size_t len, bool first)
{
    const kvf_tokenizer_t *tok = enc->tok;
    if (tok->n_norms == 0)
        return encode_subsection(enc, s, len, first);
    size_t n;
    kvf_status_t st = kvf_tokenizer__normalize(tok, s, len, &enc->norm, &enc->norm_cap, &n);
    if (st != KVF_OK)
        return st;
    /* the subsections are not normalized again: enc->norm stays put */
    return split_added(enc, true, enc->norm, n, first, encode_subsection);
}

/* A section between added tokens (any bytes). */
static kvf_status_t encode_section(encoder_t *enc, const uint8_t *s, size_t len, bool first)
{
    kvf_status_t st;
    size_t i = 0;
    while (i < len) {
        size_t valid = kvf_utf8_valid_prefix(s + i, len - i);
        if (valid > 0 && (st = encode_valid(enc, s + i, valid, first && i == 0)) != KVF_OK)
            return st;
        i += valid;
        if (i < len) {
            enc->bpe.last_unk = false;
            if ((st = kvf_tokenizer__bpe_piece(&enc->bpe, s + i, 1)) != KVF_OK)
                return st;
            i++;
        }
    }
    return KVF_OK;
}

static kvf_status_t emit_all(encoder_t *enc, const uint32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        kvf_status_t st = kvf_tokenizer__emit(&enc->bpe, ids[i]);
        if (st != KVF_OK)
            return st;
    }
    return KVF_OK;
}

kvf_status_t kvf_tokenizer_encode(const kvf_tokenizer_t *tok, const char *text, size_t len,
                                  bool add_special_tokens, uint32_t **ids_p, size_t *n_p)
{
    if (!tok || (!text && len > 0))
        return KVF_ERR_INVAL;
    if (len >= INT32_MAX / 4)
        return KVF_ERR_TOO_BIG;
    if (!text)
        text = "";
    encoder_t enc = {.tok = tok, .bpe = {.tok = tok}};
    kvf_status_t st =
        kvf_array_reserve(&enc.bpe.ids, &enc.bpe.ids_cap, len / 3 + 16, 64, sizeof(*enc.bpe.ids));
    if (st != KVF_OK)
        goto fail_encode;
    if (add_special_tokens && (st = emit_all(&enc, tok->tmpl_ids, tok->n_tmpl_before)) != KVF_OK)
        goto fail_encode;
    st = split_added(&enc, false, (const uint8_t *)text, len, true, encode_section);
    if (st != KVF_OK)
        goto fail_encode;
    if (add_special_tokens && tok->n_tmpl_after &&
        (st = emit_all(&enc, tok->tmpl_ids + tok->n_tmpl_before, tok->n_tmpl_after)) != KVF_OK)
        goto fail_encode;
    *ids_p = enc.bpe.ids;
    *n_p = enc.bpe.n_ids;
    enc.bpe.ids = NULL;
fail_encode:
    kvf_tokenizer__bpe_fini(&enc.bpe);
    kvf_tokenizer__pre_run_fini(&enc.pre);
    free(enc.norm);
    return st;
}
