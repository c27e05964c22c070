/* Encoding (kvf_tokenizer_encode): added tokens are cut out first, each
 * segment between them goes through the pre-tokenizer regexes, each piece
 * through BPE. BPE on one piece keeps its symbols in a linked list and
 * candidate merges in a binary heap ordered by (rank, position), so a
 * piece of n bytes costs O(n log n), never O(n^2): a run of 100 KB of CJK
 * letters is one regex piece. Layout in tokenizer_internal.h. */
#include "tokenizer_internal.h"

#include "kvf/array.h"
#include "kvf/log.h"
#include "kvf/utf8.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* Scratch space of one encode call. */
typedef struct {
    const kvf_tokenizer_t *tok;
    uint32_t *ids; /* output */
    size_t n_ids, ids_cap;
    uint32_t *sym; /* BPE symbols of the current piece */
    int32_t *prev, *next;
    uint64_t *heap; /* rank << 32 | left symbol index */
    size_t sym_cap; /* of sym, prev and next; the heap holds 2 * sym_cap */
    char *spelled;  /* the piece in ByteLevel spelling (ignore_merges) */
    size_t spelled_cap;
    uint8_t *prefixed; /* a segment with the prefix space */
    size_t prefixed_cap;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
} encoder_t;

/* The encoder's buffers start at this many items and double. */
#define ENC_MIN_CAP 64

static kvf_status_t emit(encoder_t *enc, uint32_t id)
{
    kvf_status_t st =
        kvf_array_reserve(&enc->ids, &enc->ids_cap, enc->n_ids + 1, ENC_MIN_CAP, sizeof(*enc->ids));
    if (st != KVF_OK)
        return st;
    enc->ids[enc->n_ids++] = id;
    return KVF_OK;
}

static void heap_push(uint64_t *heap, size_t *n, uint64_t key)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (heap[parent] <= key)
            break;
        heap[i] = heap[parent];
        i = parent;
    }
    heap[i] = key;
}

static uint64_t heap_pop(uint64_t *heap, size_t *n)
{
    uint64_t top = heap[0];
    uint64_t last = heap[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= *n)
            break;
        if (child + 1 < *n && heap[child + 1] < heap[child])
            child++;
        if (heap[child] >= last)
            break;
        heap[i] = heap[child];
        i = child;
    }
    if (*n > 0)
        heap[i] = last;
    return top;
}

static void push_pair(encoder_t *enc, size_t *n_heap, int32_t left)
{
    int32_t right = enc->next[left];
    if (right < 0)
        return;
    const kvf_tok_merge_t *m = kvf_tokenizer__merge_find(enc->tok, enc->sym[left], enc->sym[right]);
    if (m)
        heap_push(enc->heap, n_heap, (uint64_t)m->rank << 32 | (uint32_t)left);
}

/* Room for n symbols: sym, prev and next hold n, the heap 2n (n - 1 pairs
 * at first, then each merge pops one entry and pushes at most two). */
static kvf_status_t reserve_symbols(encoder_t *enc, size_t n)
{
    size_t cap = kvf_array_grow_cap(enc->sym_cap, n, ENC_MIN_CAP);
    if (kvf_array_resize(&enc->sym, cap, sizeof(*enc->sym)) != KVF_OK ||
        kvf_array_resize(&enc->prev, cap, sizeof(*enc->prev)) != KVF_OK ||
        kvf_array_resize(&enc->next, cap, sizeof(*enc->next)) != KVF_OK ||
        kvf_array_resize(&enc->heap, cap, 2 * sizeof(*enc->heap)) != KVF_OK)
        return KVF_ERR_NOMEM;
    enc->sym_cap = cap;
    return KVF_OK;
}

/* BPE over one pre-tokenized piece of raw bytes. */
static kvf_status_t bpe_piece(encoder_t *enc, const uint8_t *piece, size_t len)
{
    const kvf_tokenizer_t *tok = enc->tok;
    kvf_status_t st;
    if (tok->ignore_merges) {
        /* a byte's symbol is at most 2 bytes of UTF-8 (below U+0144) */
        st = kvf_array_reserve(&enc->spelled, &enc->spelled_cap, len * 2 + 1, ENC_MIN_CAP, 1);
        if (st != KVF_OK)
            return st;
        size_t n = 0;
        for (size_t i = 0; i < len; i++) {
            memcpy(enc->spelled + n, tok->byte_spelling[piece[i]],
                   tok->byte_spelling_len[piece[i]]);
            n += tok->byte_spelling_len[piece[i]];
        }
        uint32_t id = kvf_tokenizer__vocab_find(tok, enc->spelled, n);
        if (id != KVF_TOK_NO_ID)
            return emit(enc, id);
    }
    if (len > enc->sym_cap && (st = reserve_symbols(enc, len)) != KVF_OK)
        return st;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        uint32_t id = tok->byte_id[piece[i]];
        if (id == KVF_TOK_NO_ID) {
            kvf_log_debug("tokenizer: byte 0x%02x has no symbol; skipped", piece[i]);
            continue;
        }
        enc->sym[n] = id;
        enc->prev[n] = (int32_t)n - 1;
        enc->next[n] = (int32_t)n + 1;
        n++;
    }
    if (n == 0)
        return KVF_OK;
    enc->next[n - 1] = -1;
    size_t n_heap = 0;
    for (size_t i = 0; i + 1 < n; i++)
        push_pair(enc, &n_heap, (int32_t)i);
    while (n_heap > 0) {
        uint64_t top = heap_pop(enc->heap, &n_heap);
        int32_t left = (int32_t)(uint32_t)top;
        uint32_t rank = (uint32_t)(top >> 32);
        int32_t right = enc->next[left];
        /* stale entries: the left symbol died or its pair changed */
        if (enc->prev[left] == -2 || right < 0)
            continue;
        const kvf_tok_merge_t *m = kvf_tokenizer__merge_find(tok, enc->sym[left], enc->sym[right]);
        if (!m || m->rank != rank)
            continue;
        enc->sym[left] = m->merged;
        enc->next[left] = enc->next[right];
        if (enc->next[right] >= 0)
            enc->prev[enc->next[right]] = left;
        enc->prev[right] = -2;
        if (enc->prev[left] >= 0)
            push_pair(enc, &n_heap, enc->prev[left]);
        push_pair(enc, &n_heap, left);
    }
    for (int32_t i = 0; i >= 0; i = enc->next[i])
        if ((st = emit(enc, enc->sym[i])) != KVF_OK)
            return st;
    return KVF_OK;
}

static kvf_status_t split_piece(encoder_t *enc, size_t step, const uint8_t *s, size_t len);

static kvf_status_t regex_split(encoder_t *enc, size_t step, const uint8_t *s, size_t len)
{
    const kvf_tok_split_step_t *sp = &enc->tok->steps[step];
    size_t off = 0, last = 0;
    kvf_status_t st;
    while (off < len) {
        int rc = pcre2_match(sp->re, s, len, off, PCRE2_NO_UTF_CHECK, enc->md, enc->mctx);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !enc->jit_stack) {
            enc->jit_stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
            enc->mctx = pcre2_match_context_create(NULL);
            if (!enc->jit_stack || !enc->mctx)
                return KVF_ERR_NOMEM;
            pcre2_jit_stack_assign(enc->mctx, NULL, enc->jit_stack);
            continue;
        }
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof(msg));
            kvf_log_error("tokenizer: pre-tokenizer regex failed: %s", (const char *)msg);
            return KVF_ERR_INTERNAL;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(enc->md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) { /* an empty match splits nothing: step one character */
            off = ms + 1;
            while (off < len && (s[off] & 0xc0) == 0x80)
                off++;
            continue;
        }
        if (ms > last && (st = split_piece(enc, step + 1, s + last, ms - last)) != KVF_OK)
            return st;
        if (sp->behavior == KVF_TOK_SPLIT_ISOLATED &&
            (st = split_piece(enc, step + 1, s + ms, me - ms)) != KVF_OK)
            return st;
        last = off = me;
    }
    if (last < len)
        return split_piece(enc, step + 1, s + last, len - last);
    return KVF_OK;
}

static kvf_status_t split_piece(encoder_t *enc, size_t step, const uint8_t *s, size_t len)
{
    if (len == 0)
        return KVF_OK;
    if (step == enc->tok->n_steps)
        return bpe_piece(enc, s, len);
    return regex_split(enc, step, s, len);
}

/* A segment between added tokens: valid UTF-8 runs go through the
 * pre-tokenizer, each invalid byte is a piece of its own. */
static kvf_status_t encode_segment(encoder_t *enc, const uint8_t *s, size_t len)
{
    if (len == 0)
        return KVF_OK;
    kvf_status_t st;
    if (enc->tok->add_prefix_space && s[0] != ' ') {
        st = kvf_array_reserve(&enc->prefixed, &enc->prefixed_cap, len + 1, ENC_MIN_CAP, 1);
        if (st != KVF_OK)
            return st;
        enc->prefixed[0] = ' ';
        memcpy(enc->prefixed + 1, s, len);
        s = enc->prefixed;
        len++;
    }
    size_t i = 0;
    while (i < len) {
        size_t valid = kvf_utf8_valid_prefix(s + i, len - i);
        if (valid > 0 && (st = split_piece(enc, 0, s + i, valid)) != KVF_OK)
            return st;
        i += valid;
        if (i < len) {
            if ((st = bpe_piece(enc, s + i, 1)) != KVF_OK)
                return st;
            i++;
        }
    }
    return KVF_OK;
}

static bool is_space(uint8_t c)
{
    return c == ' ' || (c >= '\t' && c <= '\r');
}

/* The longest added token starting at text[pos], or NULL. */
static const kvf_tok_added_t *match_added(const kvf_tokenizer_t *tok, const uint8_t *text,
                                          size_t len, size_t pos)
{
    const kvf_tok_added_t *best = NULL;
    for (size_t i = 0; i < tok->n_added; i++) {
        const kvf_tok_added_t *t = &tok->added[i];
        if (t->len <= len - pos && (!best || t->len > best->len) &&
            memcmp(text + pos, t->content, t->len) == 0)
            best = t;
    }
    return best;
}

kvf_status_t kvf_tokenizer_encode(const kvf_tokenizer_t *tok, const char *text, size_t len,
                                  bool add_bos, uint32_t **ids_p, size_t *n_p)
{
    if (!tok || (!text && len > 0))
        return KVF_ERR_INVAL;
    if (len >= INT32_MAX)
        return KVF_ERR_TOO_BIG;
    if (!text)
        text = "";
    encoder_t enc = {.tok = tok};
    kvf_status_t st = KVF_OK;
    st = kvf_array_reserve(&enc.ids, &enc.ids_cap, len / 3 + 16, ENC_MIN_CAP, sizeof(*enc.ids));
    if (st != KVF_OK)
        return st;
    if (tok->n_steps) {
        /* only the whole match is read: one pair of offsets would do, a few
         * more cost nothing */
        enc.md = pcre2_match_data_create(4, NULL);
        if (!enc.md) {
            st = KVF_ERR_NOMEM;
            goto fail_encode;
        }
    }
    if (add_bos && tok->adds_bos && (st = emit(&enc, (uint32_t)tok->bos_id)) != KVF_OK)
        goto fail_encode;
    const uint8_t *s = (const uint8_t *)text;
    size_t seg = 0;
    for (size_t pos = 0; pos < len; pos++) {
        if (!tok->added_first_byte[s[pos]])
            continue;
        const kvf_tok_added_t *t = match_added(tok, s, len, pos);
        if (!t)
            continue;
        size_t start = pos, end = pos + t->len;
        while (t->lstrip && start > seg && is_space(s[start - 1]))
            start--;
        while (t->rstrip && end < len && is_space(s[end]))
            end++;
        if ((st = encode_segment(&enc, s + seg, start - seg)) != KVF_OK ||
            (st = emit(&enc, t->id)) != KVF_OK)
            goto fail_encode;
        seg = end;
        pos = end - 1;
    }
    if ((st = encode_segment(&enc, s + seg, len - seg)) != KVF_OK)
        goto fail_encode;
    *ids_p = enc.ids;
    *n_p = enc.n_ids;
    enc.ids = NULL;
fail_encode:
    free(enc.ids);
    free(enc.sym);
    free(enc.prev);
    free(enc.next);
    free(enc.heap);
    free(enc.spelled);
    free(enc.prefixed);
    pcre2_match_data_free(enc.md);
    pcre2_match_context_free(enc.mctx);
    pcre2_jit_stack_free(enc.jit_stack);
    return st;
}
