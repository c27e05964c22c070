/* The BPE model on one pre-tokenized piece (tokenizer_encode.c drives
 * it). The initial symbols are the piece's bytes' ByteLevel symbols when
 * the tokenizer is byte-level, its characters otherwise; a character the
 * vocabulary lacks stays a symbol of its own that no merge joins, and
 * comes out as its <0xNN> byte tokens (byte_fallback) or the unknown
 * token. BPE keeps the symbols in a linked list and candidate merges in a
 * binary heap ordered by (rank, position), so a piece of n bytes costs
 * O(n log n), never O(n^2): a run of 100 KB of CJK letters is one piece.
 * Layout in tokenizer_internal.h. */
#include "tokenizer_internal.h"

#include "kvf/array.h"
#include "kvf/log.h"
#include "kvf/utf8.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* The encoder's buffers start at this many items and double. */
#define ENC_MIN_CAP 64

kvf_status_t kvf_tokenizer__emit(kvf_tok_bpe_t *enc, uint32_t id)
{
    kvf_status_t st =
        kvf_array_reserve(&enc->ids, &enc->ids_cap, enc->n_ids + 1, ENC_MIN_CAP, sizeof(*enc->ids));
    if (st != KVF_OK)
        return st;
    enc->ids[enc->n_ids++] = id;
    enc->last_unk = false;
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

static void push_pair(kvf_tok_bpe_t *enc, size_t *n_heap, int32_t left)
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
static kvf_status_t reserve_symbols(kvf_tok_bpe_t *enc, size_t n)
{
    size_t cap = kvf_array_grow_cap(enc->sym_cap, n, ENC_MIN_CAP);
    if (kvf_array_resize(&enc->sym, cap, sizeof(*enc->sym)) != KVF_OK ||
        kvf_array_resize(&enc->sym_off, cap + 1, sizeof(*enc->sym_off)) != KVF_OK ||
        kvf_array_resize(&enc->prev, cap, sizeof(*enc->prev)) != KVF_OK ||
        kvf_array_resize(&enc->next, cap, sizeof(*enc->next)) != KVF_OK ||
        kvf_array_resize(&enc->heap, cap, 2 * sizeof(*enc->heap)) != KVF_OK)
        return KVF_ERR_NOMEM;
    enc->sym_cap = cap;
    return KVF_OK;
}

/* A symbol the vocabulary lacks: its bytes as <0xNN> tokens when every
 * one exists (byte_fallback), else the unknown token, fused with an
 * unknown token just before (fuse_unk), else nothing. */
static kvf_status_t emit_missing(kvf_tok_bpe_t *enc, const uint8_t *bytes, size_t len)
{
    const kvf_tokenizer_t *tok = enc->tok;
    kvf_status_t st;
    bool all = tok->byte_fallback;
    for (size_t i = 0; i < len && all; i++)
        all = tok->fallback_id[bytes[i]] != KVF_TOK_NO_ID;
    if (all) {
        for (size_t i = 0; i < len; i++)
            if ((st = kvf_tokenizer__emit(enc, tok->fallback_id[bytes[i]])) != KVF_OK)
                return st;
        return KVF_OK;
    }
    if (tok->unk_id == KVF_TOK_NO_ID)
        return KVF_OK;
    if (tok->fuse_unk && enc->last_unk)
        return KVF_OK;
    st = kvf_tokenizer__emit(enc, tok->unk_id);
    enc->last_unk = true;
    return st;
}

/* ignore_merges: a piece that is a whole vocabulary entry is that entry.
 * *id_p is KVF_TOK_NO_ID when it is not one. */
static kvf_status_t whole_piece(kvf_tok_bpe_t *enc, const uint8_t *piece, size_t len,
                                uint32_t *id_p)
{
    const kvf_tokenizer_t *tok = enc->tok;
    if (!tok->byte_level) {
        *id_p = kvf_tokenizer__vocab_find(tok, (const char *)piece, len);
        return KVF_OK;
    }
    /* a byte's symbol is at most 2 bytes of UTF-8 (below U+0144) */
    kvf_status_t st =
        kvf_array_reserve(&enc->spelled, &enc->spelled_cap, len * 2 + 1, ENC_MIN_CAP, 1);
    if (st != KVF_OK)
        return st;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        memcpy(enc->spelled + n, tok->byte_spelling[piece[i]], tok->byte_spelling_len[piece[i]]);
        n += tok->byte_spelling_len[piece[i]];
    }
    *id_p = kvf_tokenizer__vocab_find(tok, enc->spelled, n);
    return KVF_OK;
}

/* The initial symbols of a piece into enc->sym / sym_off; *n_p of them. */
static void initial_symbols(kvf_tok_bpe_t *enc, const uint8_t *piece, size_t len, size_t *n_p)
{
    const kvf_tokenizer_t *tok = enc->tok;
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        size_t step = 1;
        uint32_t id;
        if (tok->byte_level) {
            id = tok->byte_id[piece[i]];
            if (id == KVF_TOK_NO_ID) {
                kvf_log_debug("tokenizer: byte 0x%02x has no symbol; skipped", piece[i]);
                i++;
                continue;
            }
        } else {
            /* a character (an invalid byte counts as one) */
            int k = kvf_utf8_next(piece + i, len - i, NULL);
            step = k > 0 ? (size_t)k : 1;
            id = kvf_tokenizer__vocab_find(tok, (const char *)piece + i, step);
        }
        enc->sym[n] = id;
        enc->sym_off[n] = (uint32_t)i;
        enc->prev[n] = (int32_t)n - 1;
        enc->next[n] = (int32_t)n + 1;
        n++;
        i += step;
    }
    enc->sym_off[n] = (uint32_t)len;
    *n_p = n;
}

/* Merges the n symbols of enc by rank until no pair merges. */
static void merge_symbols(kvf_tok_bpe_t *enc, size_t n)
{
    const kvf_tokenizer_t *tok = enc->tok;
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
}

kvf_status_t kvf_tokenizer__bpe_piece(kvf_tok_bpe_t *enc, const uint8_t *piece, size_t len)
{
    const kvf_tokenizer_t *tok = enc->tok;
    kvf_status_t st;
    if (len == 0)
        return KVF_OK;
    if (tok->ignore_merges) {
        uint32_t id;
        if ((st = whole_piece(enc, piece, len, &id)) != KVF_OK)
            return st;
        if (id != KVF_TOK_NO_ID)
            return kvf_tokenizer__emit(enc, id);
    }
    if (len > enc->sym_cap && (st = reserve_symbols(enc, len)) != KVF_OK)
        return st;
    size_t n;
    initial_symbols(enc, piece, len, &n);
    if (n == 0)
        return KVF_OK;
    merge_symbols(enc, n);
    for (int32_t i = 0; i >= 0; i = enc->next[i]) {
        if (enc->sym[i] != KVF_TOK_NO_ID)
            st = kvf_tokenizer__emit(enc, enc->sym[i]);
        else /* never merged: one initial symbol */
            st = emit_missing(enc, piece + enc->sym_off[i], enc->sym_off[i + 1] - enc->sym_off[i]);
        if (st != KVF_OK)
            return st;
    }
    return KVF_OK;
}

void kvf_tokenizer__bpe_fini(kvf_tok_bpe_t *enc)
{
    free(enc->ids);
    free(enc->sym);
    free(enc->sym_off);
    free(enc->prev);
    free(enc->next);
    free(enc->heap);
    free(enc->spelled);
}
