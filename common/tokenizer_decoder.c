/* The decoder section of tokenizer.json (kvf/tokenizer.h): its steps read
 * into the before / after / whole lists of kvf_tok_decoder_t, the string
 * steps themselves (Replace, Metaspace, Strip), and every id's piece. How
 * the pieces become text, whole and streaming, is detok.c; the layout is
 * in tokenizer_internal.h.
 *
 * The semantics are those of Hugging Face's tokenizers as its JavaScript
 * port (@huggingface/tokenizers) implements them: every token, added ones
 * included, goes through the chain; Metaspace removes one leading space of
 * the first token; a byte run is decoded lossily (each invalid subpart one
 * U+FFFD). */
#include "tokenizer_internal.h"

#include "kvf/array.h"
#include "kvf/log.h"
#include "kvf/utf8.h"

#include <stdlib.h>
#include <string.h>

#define NO_CP UINT32_MAX /* a Strip character that matches nothing */

kvf_status_t kvf_tokenizer__text_append(kvf_tok_text_t *text, const void *s, size_t n)
{
    kvf_status_t st = kvf_array_reserve(&text->data, &text->cap, text->len + n + 1, 64, 1);
    if (st != KVF_OK)
        return st;
    if (n)
        memcpy(text->data + text->len, s, n);
    text->len += n;
    text->data[text->len] = '\0';
    return KVF_OK;
}

/* ---- the string steps ------------------------------------------------------- */

/* Every occurrence of from (left to right, not overlapping) becomes to. */
static kvf_status_t replace_string(const char *in, size_t len, const char *from, size_t from_len,
                                   const char *to, size_t to_len, kvf_tok_text_t *out)
{
    kvf_status_t st = kvf_tokenizer__text_append(out, "", 0);
    size_t i = 0;
    while (st == KVF_OK && i < len) {
        const char *hit = memmem(in + i, len - i, from, from_len);
        size_t keep = hit ? (size_t)(hit - (in + i)) : len - i;
        st = kvf_tokenizer__text_append(out, in + i, keep);
        i += keep;
        if (hit && st == KVF_OK) {
            st = kvf_tokenizer__text_append(out, to, to_len);
            i += from_len;
        }
    }
    return st;
}

/* Every match of re becomes to, taken literally. */
static kvf_status_t replace_regex(const char *in, size_t len, const pcre2_code *re, const char *to,
                                  size_t to_len, kvf_tok_text_t *out)
{
    uint32_t opts =
        PCRE2_SUBSTITUTE_GLOBAL | PCRE2_SUBSTITUTE_LITERAL | PCRE2_SUBSTITUTE_OVERFLOW_LENGTH;
    PCRE2_SIZE need = len + 1;
    for (int attempt = 0; attempt < 2; attempt++) {
        out->len = 0;
        kvf_status_t st = kvf_array_reserve(&out->data, &out->cap, need + 1, 64, 1);
        if (st != KVF_OK)
            return st;
        PCRE2_SIZE got = out->cap;
        int rc = pcre2_substitute(re, (PCRE2_SPTR)in, len, 0, opts, NULL, NULL, (PCRE2_SPTR)to,
                                  to_len, (PCRE2_UCHAR *)out->data, &got);
        if (rc >= 0) {
            out->len = got;
            return KVF_OK;
        }
        if (rc != PCRE2_ERROR_NOMEMORY)
            break;
        need = got;
    }
    kvf_log_error("decoder: Replace regex failed on a token");
    return KVF_ERR_FORMAT;
}

/* The code point ending at s[end), stepping back over continuation bytes. */
static size_t last_char_start(const char *s, size_t end)
{
    size_t i = end - 1;
    while (i > 0 && ((uint8_t)s[i] & 0xc0) == 0x80)
        i--;
    return i;
}

static bool char_is(const char *s, size_t at, size_t n, uint32_t cp)
{
    uint32_t c;
    return kvf_utf8_next((const uint8_t *)s + at, n - at, &c) > 0 && c == cp;
}

/* Up to start copies of cp off the front and stop off the back; when the
 * two cuts cross, nothing is left. */
static kvf_status_t strip(const char *in, size_t len, const kvf_tok_step_t *step,
                          kvf_tok_text_t *out)
{
    size_t from = 0, to = len;
    for (uint32_t k = 0; k < step->start && from < len && char_is(in, from, len, step->strip_cp);
         k++)
        from += (size_t)kvf_utf8_next((const uint8_t *)in + from, len - from, NULL);
    for (uint32_t k = 0; k < step->stop && to > 0; k++) {
        size_t at = last_char_start(in, to);
        if (!char_is(in, at, to, step->strip_cp))
            break;
        to = at;
    }
    return kvf_tokenizer__text_append(out, in + from, to > from ? to - from : 0);
}

static kvf_status_t apply_step(const kvf_tok_step_t *step, bool first, const char *in, size_t len,
                               kvf_tok_text_t *out)
{
    kvf_status_t st;
    switch (step->kind) {
    case KVF_TOK_STEP_REPLACE:
        if (step->re)
            return replace_regex(in, len, step->re, step->to, step->to_len, out);
        return replace_string(in, len, step->from, step->from_len, step->to, step->to_len, out);
    case KVF_TOK_STEP_METASPACE:
        st = replace_string(in, len, step->from, step->from_len, " ", 1, out);
        if (st == KVF_OK && first && step->strip_first && out->len && out->data[0] == ' ') {
            memmove(out->data, out->data + 1, out->len--);
        }
        return st;
    case KVF_TOK_STEP_STRIP:
        return strip(in, len, step, out);
    }
    return KVF_ERR_INVAL;
}

kvf_status_t kvf_tokenizer__apply_steps(const kvf_tok_step_t *steps, size_t n, bool first,
                                        kvf_tok_text_t *text)
{
    kvf_tok_text_t next = {0};
    for (size_t i = 0; i < n; i++) {
        next.len = 0;
        kvf_status_t st =
            apply_step(&steps[i], first, text->data ? text->data : "", text->len, &next);
        if (st != KVF_OK) {
            free(next.data);
            return st;
        }
        kvf_tok_text_t swap = *text;
        *text = next;
        next = swap;
    }
    free(next.data);
    return KVF_OK;
}

/* ---- reading the steps -------------------------------------------------------- */

static kvf_status_t copy_string(const char *s, char **out_p, size_t *len_p)
{
    *out_p = strdup(s);
    if (!*out_p)
        return KVF_ERR_NOMEM;
    *len_p = strlen(s);
    return KVF_OK;
}

static kvf_status_t read_replace(const char *path, const cJSON *j, kvf_tok_step_t *step)
{
    const cJSON *pattern = cJSON_GetObjectItemCaseSensitive(j, "pattern");
    const cJSON *string = cJSON_GetObjectItemCaseSensitive(pattern, "String");
    const cJSON *regex = cJSON_GetObjectItemCaseSensitive(pattern, "Regex");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(j, "content");
    if (!cJSON_IsString(content) || !(cJSON_IsString(string) || cJSON_IsString(regex)) ||
        (cJSON_IsString(string) && !string->valuestring[0])) {
        kvf_log_error("%s: Replace decoder needs a non-empty String or a Regex, and content", path);
        return KVF_ERR_FORMAT;
    }
    step->kind = KVF_TOK_STEP_REPLACE;
    kvf_status_t st = copy_string(content->valuestring, &step->to, &step->to_len);
    if (st != KVF_OK || cJSON_IsString(string))
        return st == KVF_OK ? copy_string(string->valuestring, &step->from, &step->from_len) : st;
    return kvf_tokenizer__compile(path, "Replace decoder", regex->valuestring,
                                  PCRE2_ZERO_TERMINATED, false, &step->re);
}

static kvf_status_t read_metaspace(const char *path, const cJSON *j, kvf_tok_step_t *step)
{
    const cJSON *repl = cJSON_GetObjectItemCaseSensitive(j, "replacement");
    const cJSON *scheme = cJSON_GetObjectItemCaseSensitive(j, "prepend_scheme");
    const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(j, "add_prefix_space");
    if ((repl && (!cJSON_IsString(repl) || !repl->valuestring[0])) ||
        (scheme && !cJSON_IsString(scheme))) {
        kvf_log_error("%s: Metaspace decoder with a malformed replacement or prepend_scheme", path);
        return KVF_ERR_FORMAT;
    }
    step->kind = KVF_TOK_STEP_METASPACE;
    /* prepend_scheme "always" / "first" put a space before the first word
     * when encoding, "never" does not; files older than it say
     * add_prefix_space. Where one was added, decoding removes it. */
    if (scheme)
        step->strip_first = strcmp(scheme->valuestring, "never") != 0;
    else
        step->strip_first = !cJSON_IsFalse(prefix);
    return copy_string(repl ? repl->valuestring : "\xe2\x96\x81", &step->from, &step->from_len);
}

static kvf_status_t read_strip(const char *path, const cJSON *j, kvf_tok_step_t *step)
{
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(j, "content");
    const cJSON *start = cJSON_GetObjectItemCaseSensitive(j, "start");
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(j, "stop");
    uint32_t n_start = 0, n_stop = 0;
    if (!cJSON_IsString(content) || (start && !kvf_tokenizer__json_id(start, &n_start)) ||
        (stop && !kvf_tokenizer__json_id(stop, &n_stop))) {
        kvf_log_error("%s: Strip decoder needs content and non-negative start / stop", path);
        return KVF_ERR_FORMAT;
    }
    step->kind = KVF_TOK_STEP_STRIP;
    step->start = n_start;
    step->stop = n_stop;
    /* content is one character; any other string matches no character */
    const uint8_t *s = (const uint8_t *)content->valuestring;
    size_t len = strlen(content->valuestring);
    uint32_t cp;
    int k = len ? kvf_utf8_next(s, len, &cp) : 0;
    step->strip_cp = k > 0 && (size_t)k == len ? cp : NO_CP;
    return KVF_OK;
}

/* Where the chain is: the list the next string step goes to. */
typedef enum { PHASE_BEFORE, PHASE_AFTER, PHASE_WHOLE } phase_t;

static kvf_status_t add_step(kvf_tokenizer_t *tok, phase_t phase, kvf_tok_step_t **step_p)
{
    kvf_tok_decoder_t *d = &tok->dec;
    kvf_tok_step_t **list = phase == PHASE_BEFORE  ? &d->before
                            : phase == PHASE_AFTER ? &d->after
                                                   : &d->whole;
    size_t *n = phase == PHASE_BEFORE  ? &d->n_before
                : phase == PHASE_AFTER ? &d->n_after
                                       : &d->n_whole;
    kvf_tok_step_t *grown = realloc(*list, (*n + 1) * sizeof(*grown));
    if (!grown)
        return KVF_ERR_NOMEM;
    *list = grown;
    grown[*n] = (kvf_tok_step_t){0};
    *step_p = &grown[(*n)++];
    return KVF_OK;
}

static kvf_status_t refuse(const char *path, const char *type, const char *why)
{
    kvf_log_error("%s: decoder '%s' %s", path, type, why);
    return KVF_ERR_UNSUPPORTED;
}

/* A step that joins or marks (ByteLevel, ByteFallback, Fuse). */
static kvf_status_t read_join(kvf_tokenizer_t *tok, const char *path, const char *type,
                              phase_t *phase)
{
    kvf_tok_decoder_t *d = &tok->dec;
    if (!strcmp(type, "Fuse")) {
        *phase = PHASE_WHOLE;
        return KVF_OK;
    }
    if (!strcmp(type, "ByteFallback")) {
        if (*phase != PHASE_BEFORE)
            return refuse(path, type, "after ByteFallback, Fuse or ByteLevel is not supported");
        d->byte_fallback = true;
        *phase = PHASE_AFTER;
        return KVF_OK;
    }
    if (d->n_before || d->byte_fallback || *phase != PHASE_BEFORE)
        return refuse(path, type, "is supported only as the first decoder");
    d->byte_level = true;
    *phase = PHASE_WHOLE;
    return KVF_OK;
}

static kvf_status_t read_chain(kvf_tokenizer_t *tok, const char *path, const cJSON *j,
                               phase_t *phase)
{
    const char *type = kvf_tokenizer__json_type(j);
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "decoders");
        if (list && !cJSON_IsArray(list)) {
            kvf_log_error("%s: Sequence decoder without a decoders list", path);
            return KVF_ERR_FORMAT;
        }
        for (const cJSON *c = list ? list->child : NULL; c; c = c->next) {
            kvf_status_t st = read_chain(tok, path, c, phase);
            if (st != KVF_OK)
                return st;
        }
        return KVF_OK;
    }
    if (!strcmp(type, "Fuse") || !strcmp(type, "ByteFallback") || !strcmp(type, "ByteLevel"))
        return read_join(tok, path, type, phase);
    bool known = !strcmp(type, "Replace") || !strcmp(type, "Metaspace") || !strcmp(type, "Strip");
    if (!known)
        return refuse(path, type,
                      "is not supported (ByteLevel, Metaspace, Replace, "
                      "ByteFallback, Fuse, Strip, Sequence)");
    if (*phase == PHASE_WHOLE && (strcmp(type, "Strip") || tok->dec.byte_level))
        return refuse(path, type, "after Fuse or ByteLevel is not supported");
    kvf_tok_step_t *step;
    kvf_status_t st = add_step(tok, *phase, &step);
    if (st != KVF_OK)
        return st;
    if (!strcmp(type, "Replace"))
        return read_replace(path, j, step);
    if (!strcmp(type, "Metaspace")) {
        st = read_metaspace(path, j, step);
        tok->dec.first_differs |= step->strip_first;
        return st;
    }
    return read_strip(path, j, step);
}

/* ---- pieces ------------------------------------------------------------------ */

/* The token an id stands for, as Hugging Face's decoder sees it: an added
 * token's content, else the vocabulary spelling. added_of (may be NULL: a
 * search) maps ids to an index into tok->added + 1. True for an added
 * token. */
static bool token_string(const kvf_tokenizer_t *tok, uint32_t id, const uint32_t *added_of,
                         const char **s_p, size_t *len_p)
{
    const kvf_tok_added_t *a = NULL;
    if (added_of) {
        a = added_of[id] ? &tok->added[added_of[id] - 1] : NULL;
    } else {
        for (size_t i = 0; i < tok->n_added && !a; i++)
            a = tok->added[i].id == id ? &tok->added[i] : NULL;
    }
    if (a) {
        *s_p = a->content;
        *len_p = a->len;
        return true;
    }
    *s_p = tok->arena + tok->tokens[id].text_off;
    *len_p = tok->tokens[id].text_len;
    return false;
}

/* "<0xNN>" with two hex digits: the byte, else -1. */
static int fallback_byte(const char *s, size_t len)
{
    if (len != 6 || memcmp(s, "<0x", 3) || s[5] != '>')
        return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

static kvf_status_t piece_of(const kvf_tokenizer_t *tok, uint32_t id, const uint32_t *added_of,
                             bool first, kvf_tok_text_t *text, int *byte_p)
{
    const kvf_tok_decoder_t *d = &tok->dec;
    text->len = 0;
    *byte_p = -1;
    const char *s;
    size_t len;
    bool is_added = token_string(tok, id, added_of, &s, &len);
    if (d->byte_level && !is_added) /* ByteLevel leaves added tokens as they are */
        return kvf_tokenizer__text_append(text, tok->arena + tok->tokens[id].bytes_off,
                                          tok->tokens[id].bytes_len);
    kvf_status_t st = kvf_tokenizer__text_append(text, s, len);
    if (st == KVF_OK)
        st = kvf_tokenizer__apply_steps(d->before, d->n_before, first, text);
    if (st != KVF_OK)
        return st;
    if (d->byte_fallback && (*byte_p = fallback_byte(text->data, text->len)) >= 0)
        return KVF_OK;
    return kvf_tokenizer__apply_steps(d->after, d->n_after, first, text);
}

kvf_status_t kvf_tokenizer__make_piece(const kvf_tokenizer_t *tok, uint32_t id, bool first,
                                       kvf_tok_text_t *text, int *byte_p)
{
    return piece_of(tok, id, NULL, first, text, byte_p);
}

static kvf_status_t build_pieces(kvf_tokenizer_t *tok)
{
    kvf_tok_decoder_t *d = &tok->dec;
    d->pieces = calloc(tok->n_ids ? tok->n_ids : 1, sizeof(*d->pieces));
    uint32_t *added_of = calloc(tok->n_ids ? tok->n_ids : 1, sizeof(*added_of));
    kvf_tok_text_t text = {0}, arena = {0};
    kvf_status_t st = d->pieces && added_of ? KVF_OK : KVF_ERR_NOMEM;
    for (size_t i = 0; st == KVF_OK && i < tok->n_added; i++)
        added_of[tok->added[i].id] = (uint32_t)i + 1;
    for (uint32_t id = 0; st == KVF_OK && id < tok->n_ids; id++) {
        d->pieces[id].byte = -1;
        if (!tok->tokens[id].present)
            continue;
        int byte;
        st = piece_of(tok, id, added_of, false, &text, &byte);
        if (st == KVF_OK && arena.len + text.len > UINT32_MAX)
            st = KVF_ERR_TOO_BIG;
        if (st != KVF_OK)
            break;
        d->pieces[id] = (kvf_tok_piece_t){
            .off = (uint32_t)arena.len, .len = (uint32_t)text.len, .byte = (int16_t)byte};
        st = kvf_tokenizer__text_append(&arena, text.data, text.len);
    }
    free(text.data);
    free(added_of);
    d->arena = arena.data;
    d->arena_len = arena.len;
    d->arena_cap = arena.cap;
    return st;
}

kvf_status_t kvf_tokenizer__load_decoder(kvf_tokenizer_t *tok, const char *path,
                                         const cJSON *decoder)
{
    phase_t phase = PHASE_BEFORE;
    kvf_status_t st = KVF_OK;
    if (!decoder || cJSON_IsNull(decoder))
        tok->dec.space_join = true;
    else if (!cJSON_IsObject(decoder))
        st = refuse(path, "?", "is not an object");
    else
        st = read_chain(tok, path, decoder, &phase);
    if (st != KVF_OK)
        return st;
    if (tok->dec.n_whole > KVF_DETOK_MAX_STRIPS)
        return refuse(path, "Strip", "more than " KVF_DETOK_MAX_STRIPS_STR " after a Fuse");
    return build_pieces(tok);
}

static void free_steps(kvf_tok_step_t *steps, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(steps[i].from);
        free(steps[i].to);
        pcre2_code_free(steps[i].re);
    }
    free(steps);
}

void kvf_tokenizer__free_decoder(kvf_tokenizer_t *tok)
{
    kvf_tok_decoder_t *d = &tok->dec;
    free_steps(d->before, d->n_before);
    free_steps(d->after, d->n_after);
    free_steps(d->whole, d->n_whole);
    free(d->pieces);
    free(d->arena);
    *d = (kvf_tok_decoder_t){0};
}
