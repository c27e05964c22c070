/* The tokenizer's vocabulary: model.vocab, added_tokens and model.merges
 * read into the arena and the two maps, and the id/text queries of
 * kvf/tokenizer.h (layout in tokenizer_internal.h). */
#include "tokenizer_internal.h"

#include "kvf/array.h"
#include "kvf/log.h"
#include "kvf/utf8.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Asks for transparent huge pages over the whole 2 MiB pages inside
 * p[0..bytes), a fresh allocation not yet touched: the tables below are
 * read at random, 1.7 million times while a 256k vocabulary's merges are
 * read, and with 4 KiB pages most of those reads also miss the TLB. Only a
 * hint: where the kernel offers none, nothing changes. */
static void advise_huge(void *p, size_t bytes)
{
    const uintptr_t huge = (uintptr_t)2 << 20;
    uintptr_t begin = ((uintptr_t)p + huge - 1) & ~(huge - 1);
    uintptr_t end = ((uintptr_t)p + bytes) & ~(huge - 1);
    if (p && end > begin)
        (void)madvise((void *)begin, end - begin, MADV_HUGEPAGE);
}

/* ---- the arena ------------------------------------------------------------ */

/* Appends len bytes and a NUL to the arena; *off_p is their offset. The
 * arena may move: pointers into it are taken once loading is done. */
static kvf_status_t arena_add(kvf_tokenizer_t *tok, const void *data, size_t len, uint32_t *off_p)
{
    size_t need = tok->arena_len + len + 1;
    /* offsets into the arena are uint32_t: no capacity past that */
    if (kvf_array_grow_cap(tok->arena_cap, need, 4096) > UINT32_MAX)
        return KVF_ERR_TOO_BIG;
    kvf_status_t st = kvf_array_reserve(&tok->arena, &tok->arena_cap, need, 4096, 1);
    if (st != KVF_OK)
        return st;
    *off_p = (uint32_t)tok->arena_len;
    memcpy(tok->arena + tok->arena_len, data, len);
    tok->arena_len += len;
    tok->arena[tok->arena_len++] = '\0';
    return KVF_OK;
}

static const char *token_spelling(const kvf_tokenizer_t *tok, uint32_t id)
{
    return tok->arena + tok->tokens[id].text_off;
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves,
 * the other 68 bytes take U+0100 onward in byte order. */
void kvf_tokenizer__byte_mapping(kvf_tokenizer_t *tok)
{
    for (int i = 0; i < KVF_TOK_BYTE_LEVEL_CPS; i++)
        tok->cp_to_byte[i] = -1;
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) {
        tok->byte_value[b] = (uint8_t)b;
        bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        uint32_t cp = printable ? (uint32_t)b : next++;
        tok->cp_to_byte[cp] = (int16_t)b;
        tok->byte_spelling_len[b] = (uint8_t)kvf_utf8_encode(cp, tok->byte_spelling[b]);
    }
}

/* Sets a vocabulary id's spelling; its bytes are the ByteLevel decoding of
 * the spelling (characters outside the mapping stand for their own UTF-8),
 * never longer than the spelling. */
static kvf_status_t set_token(kvf_tokenizer_t *tok, uint32_t id, const char *text, size_t len)
{
    kvf_tok_entry_t e = {.present = true, .text_len = (uint32_t)len};
    kvf_status_t st = arena_add(tok, text, len, &e.text_off);
    if (st != KVF_OK)
        return st;
    /* room for the bytes and their NUL, written in place */
    st = kvf_array_reserve(&tok->arena, &tok->arena_cap, tok->arena_len + len + 1, 4096, 1);
    if (st != KVF_OK)
        return st;
    e.bytes_off = (uint32_t)tok->arena_len;
    uint8_t *bytes = (uint8_t *)tok->arena + e.bytes_off;
    size_t n = 0;
    const uint8_t *s = (const uint8_t *)tok->arena + e.text_off;
    for (size_t i = 0; i < len;) {
        uint32_t cp = s[i];
        int k = cp < 0x80 ? 1 : kvf_utf8_next(s + i, len - i, &cp);
        if (k > 0 && cp < KVF_TOK_BYTE_LEVEL_CPS && tok->cp_to_byte[cp] >= 0) {
            bytes[n++] = (uint8_t)tok->cp_to_byte[cp];
            i += (size_t)k;
        } else {
            size_t step = k > 0 ? (size_t)k : k < 0 ? (size_t)-k : len - i;
            memmove(bytes + n, s + i, step);
            n += step;
            i += step;
        }
    }
    bytes[n] = '\0';
    tok->arena_len += n + 1;
    e.bytes_len = (uint32_t)n;
    tok->tokens[id] = e;
    return KVF_OK;
}

bool kvf_tokenizer__json_id(const cJSON *item, uint32_t *id_p)
{
    if (!cJSON_IsNumber(item) || !(item->valuedouble >= 0 && item->valuedouble < KVF_TOK_MAX_IDS) ||
        item->valuedouble != (double)(uint32_t)item->valuedouble)
        return false;
    *id_p = (uint32_t)item->valuedouble;
    return true;
}

/* ---- vocabulary and added tokens ------------------------------------------ */

/* Checks every id of model.vocab and added_tokens; *n_ids_p is one more
 * than the largest. */
static kvf_status_t count_ids(const char *path, const kvf_tok_scan_t *scan, const cJSON *added,
                              uint32_t *n_ids_p)
{
    uint32_t max_id = 0;
    bool any = scan->n_vocab > 0;
    for (size_t i = 0; i < scan->n_vocab; i++)
        max_id = scan->vocab[i].id > max_id ? scan->vocab[i].id : max_id;
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next) {
        uint32_t id;
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(a, "content");
        if (!kvf_tokenizer__json_id(cJSON_GetObjectItemCaseSensitive(a, "id"), &id) ||
            !cJSON_IsString(content) || !content->valuestring[0]) {
            kvf_log_error("%s: malformed entry in added_tokens", path);
            return KVF_ERR_FORMAT;
        }
        max_id = id > max_id ? id : max_id;
        any = true;
    }
    if (!any) {
        kvf_log_error("%s: empty vocabulary", path);
        return KVF_ERR_FORMAT;
    }
    *n_ids_p = max_id + 1;
    return KVF_OK;
}

/* The spelling and bytes of every model.vocab entry. */
static kvf_status_t load_vocab(kvf_tokenizer_t *tok, const char *path, const kvf_tok_scan_t *scan,
                               const cJSON *added)
{
    kvf_status_t st = count_ids(path, scan, added, &tok->n_ids);
    if (st != KVF_OK)
        return st;
    tok->tokens = calloc(tok->n_ids, sizeof(*tok->tokens));
    advise_huge(tok->tokens, tok->n_ids * sizeof(*tok->tokens));
    if (!tok->tokens)
        return KVF_ERR_NOMEM;
    /* spellings and bytes: about twice the vocabulary's text */
    size_t text_bytes = 0;
    for (size_t i = 0; i < scan->n_vocab; i++)
        text_bytes += 2 * ((size_t)scan->vocab[i].len + 1);
    st = kvf_array_reserve(&tok->arena, &tok->arena_cap, text_bytes + 4096, 4096, 1);
    advise_huge(tok->arena, tok->arena_cap);
    if (st != KVF_OK)
        return st;
    for (size_t i = 0; i < scan->n_vocab; i++) {
        uint32_t id = scan->vocab[i].id;
        if (tok->tokens[id].present) {
            kvf_log_error("%s: id %u appears twice in model.vocab", path, id);
            return KVF_ERR_FORMAT;
        }
        st = set_token(tok, id, scan->vocab[i].text, scan->vocab[i].len);
        if (st != KVF_OK)
            return st;
    }
    return KVF_OK;
}

static kvf_status_t load_added(kvf_tokenizer_t *tok, const cJSON *added)
{
    size_t n = (size_t)cJSON_GetArraySize(added);
    tok->added = calloc(n ? n : 1, sizeof(*tok->added));
    if (!tok->added)
        return KVF_ERR_NOMEM;
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next) {
        uint32_t id = (uint32_t)cJSON_GetObjectItemCaseSensitive(a, "id")->valuedouble;
        const char *content = cJSON_GetObjectItemCaseSensitive(a, "content")->valuestring;
        kvf_tok_added_t *t = &tok->added[tok->n_added++];
        t->id = id;
        t->len = (uint32_t)strlen(content);
        /* the pointer is set once the arena stops moving */
        kvf_status_t st = arena_add(tok, content, t->len, &t->content_off);
        if (st != KVF_OK)
            return st;
        /* An added token's text is raw, not ByteLevel. When the id is also
         * in the vocabulary (GPT-2's <|endoftext|>), that entry stays. */
        if (!tok->tokens[id].present)
            tok->tokens[id] = (kvf_tok_entry_t){.present = true,
                                                .text_off = t->content_off,
                                                .text_len = t->len,
                                                .bytes_off = t->content_off,
                                                .bytes_len = t->len};
        t->lstrip = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "lstrip"));
        t->rstrip = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "rstrip"));
        t->single_word = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "single_word"));
        t->special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "special"));
        /* absent, "normalized" is the opposite of "special"; with no
         * normalizer a normalized token is matched in the raw text */
        const cJSON *normalized = cJSON_GetObjectItemCaseSensitive(a, "normalized");
        t->normalized =
            (cJSON_IsBool(normalized) ? cJSON_IsTrue(normalized) : !t->special) && tok->n_norms > 0;
    }
    return KVF_OK;
}

/* What each added token is matched as: its content, or for a normalized
 * one its normalized form (kept in tok->added_norm_text). Needs the
 * finished arena. */
static kvf_status_t match_added_forms(kvf_tokenizer_t *tok)
{
    size_t total = 0, cap = 0;
    uint8_t *scratch = NULL;
    size_t scratch_cap = 0;
    uint32_t *offs = calloc(tok->n_added ? tok->n_added : 1, sizeof(*offs));
    kvf_status_t st = offs ? KVF_OK : KVF_ERR_NOMEM;
    for (size_t i = 0; i < tok->n_added && st == KVF_OK; i++) {
        kvf_tok_added_t *t = &tok->added[i];
        if (!t->normalized)
            continue;
        size_t n;
        st = kvf_tokenizer__normalize(tok, (const uint8_t *)t->content, t->len, &scratch,
                                      &scratch_cap, &n);
        if (st == KVF_OK && n > UINT32_MAX / 2)
            st = KVF_ERR_TOO_BIG;
        if (st == KVF_OK)
            st = kvf_array_reserve(&tok->added_norm_text, &cap, total + n + 1, 256, 1);
        if (st != KVF_OK)
            break;
        memcpy(tok->added_norm_text + total, scratch, n);
        offs[i] = (uint32_t)total;
        t->match_len = (uint32_t)n;
        total += n;
    }
    for (size_t i = 0; i < tok->n_added && st == KVF_OK; i++) {
        kvf_tok_added_t *t = &tok->added[i];
        if (!t->normalized) {
            t->match = t->content;
            t->match_len = t->len;
        } else {
            t->match = tok->added_norm_text + offs[i];
        }
        /* a token that normalizes to nothing matches nowhere */
        if (t->match_len > 0) {
            bool *first = t->normalized ? tok->added_norm_first_byte : tok->added_first_byte;
            first[(uint8_t)t->match[0]] = true;
        }
    }
    free(offs);
    free(scratch);
    return st;
}

/* ---- the maps ------------------------------------------------------------- */

/* Room for n keys at most half the slots. */
static kvf_status_t index_init(kvf_tok_index_t *x, size_t n)
{
    size_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    if (cap > (size_t)UINT32_MAX)
        return KVF_ERR_TOO_BIG;
    x->slots = calloc(cap, sizeof(*x->slots));
    advise_huge(x->slots, cap * sizeof(*x->slots));
    if (!x->slots)
        return KVF_ERR_NOMEM;
    x->mask = (uint32_t)(cap - 1);
    return KVF_OK;
}

/* FNV-1a of a spelling. */
#define FNV_BASIS 1469598103934665603ull

/* FNV-1a's state after text[0..len), from state h. */
static uint64_t fnv_more(uint64_t h, const char *text, size_t len)
{
    for (size_t i = 0; i < len; i++)
        h = (h ^ (uint8_t)text[i]) * 1099511628211ull;
    return h;
}

static uint32_t fnv_final(uint64_t h)
{
    return (uint32_t)(h ^ h >> 32);
}

static uint32_t spelling_hash(const char *text, size_t len)
{
    return fnv_final(fnv_more(FNV_BASIS, text, len));
}

static uint32_t pair_hash(uint64_t pair)
{
    pair ^= pair >> 33;
    pair *= 0xff51afd7ed558ccdull;
    pair ^= pair >> 33;
    return (uint32_t)pair;
}

/* The id spelled text[0..len), whose spelling_hash() is hash. */
static uint32_t vocab_find_hashed(const kvf_tokenizer_t *tok, const char *text, size_t len,
                                  uint32_t hash)
{
    const kvf_tok_index_t *x = &tok->vocab;
    if (!x->slots)
        return KVF_TOK_NO_ID;
    for (uint32_t h = hash & x->mask;; h = (h + 1) & x->mask) {
        uint32_t s = x->slots[h];
        if (!s)
            return KVF_TOK_NO_ID;
        const kvf_tok_entry_t *e = &tok->tokens[s - 1];
        if (e->text_len == len && !memcmp(tok->arena + e->text_off, text, len))
            return s - 1;
    }
}

uint32_t kvf_tokenizer__vocab_find(const kvf_tokenizer_t *tok, const char *text, size_t len)
{
    return vocab_find_hashed(tok, text, len, spelling_hash(text, len));
}

/* The vocabulary map, over the finished arena: model.vocab entries only
 * (an added token's text is not a spelling). */
static kvf_status_t index_vocab(kvf_tokenizer_t *tok, const char *path, const kvf_tok_scan_t *scan)
{
    kvf_status_t st = index_init(&tok->vocab, scan->n_vocab);
    if (st != KVF_OK)
        return st;
    const kvf_tok_index_t *x = &tok->vocab;
    for (size_t i = 0; i < scan->n_vocab; i++) {
        uint32_t id = scan->vocab[i].id;
        const kvf_tok_entry_t *e = &tok->tokens[id];
        const char *spelling = token_spelling(tok, id);
        uint32_t h = spelling_hash(spelling, e->text_len) & x->mask;
        for (; x->slots[h]; h = (h + 1) & x->mask) {
            const kvf_tok_entry_t *o = &tok->tokens[x->slots[h] - 1];
            if (o->text_len == e->text_len &&
                !memcmp(tok->arena + o->text_off, spelling, e->text_len)) {
                kvf_log_error("%s: token '%s' appears twice in model.vocab", path, spelling);
                return KVF_ERR_FORMAT;
            }
        }
        x->slots[h] = id + 1;
    }
    return KVF_OK;
}

/* ---- merges --------------------------------------------------------------- */

/* Merges are read in batches, the lookups of each batch in steps over
 * the whole batch: the hashes of its spellings, then the vocabulary slots
 * they fall on, the entries those name and their spellings are fetched
 * before they are compared, so that the random reads of a batch overlap
 * instead of waiting one by one (the merges of a 256k vocabulary make 1.7
 * million lookups). */
#define MERGE_BATCH 32

/* One merge of a batch: its joined spelling, the hashes of left, right and
 * joined, then their ids. */
typedef struct {
    const kvf_tok_merge_item_t *m;
    size_t joined_off; /* in the batch's scratch text */
    uint32_t hash[3];
    uint32_t id[3];
} merge_job_t;

static void prefetch_slots(const kvf_tokenizer_t *tok, const merge_job_t *jobs, size_t n)
{
    for (size_t j = 0; j < n; j++)
        for (int k = 0; k < 3; k++)
            __builtin_prefetch(&tok->vocab.slots[jobs[j].hash[k] & tok->vocab.mask]);
}

/* The entries, then (entries == false) the spellings, the first slot of
 * each hash names. */
static void prefetch_entries(const kvf_tokenizer_t *tok, const merge_job_t *jobs, size_t n,
                             bool entries)
{
    for (size_t j = 0; j < n; j++) {
        for (int k = 0; k < 3; k++) {
            uint32_t s = tok->vocab.slots[jobs[j].hash[k] & tok->vocab.mask];
            if (!s)
                continue;
            if (entries)
                __builtin_prefetch(&tok->tokens[s - 1]);
            else
                __builtin_prefetch(tok->arena + tok->tokens[s - 1].text_off);
        }
    }
}

/* The hashes of merges[0..n) and their joined spellings in *text. */
static kvf_status_t hash_batch(const kvf_tok_merge_item_t *merges, size_t n, merge_job_t *jobs,
                               char **text, size_t *text_cap)
{
    size_t need = 0;
    for (size_t j = 0; j < n; j++)
        need += (size_t)merges[j].left_len + merges[j].right_len;
    kvf_status_t st = kvf_array_reserve(text, text_cap, need + 1, 256, 1);
    if (st != KVF_OK)
        return st;
    size_t off = 0;
    for (size_t j = 0; j < n; j++) {
        const kvf_tok_merge_item_t *m = &merges[j];
        uint64_t left = fnv_more(FNV_BASIS, m->left, m->left_len);
        jobs[j] = (merge_job_t){.m = m, .joined_off = off};
        jobs[j].hash[0] = fnv_final(left);
        jobs[j].hash[1] = spelling_hash(m->right, m->right_len);
        jobs[j].hash[2] = fnv_final(fnv_more(left, m->right, m->right_len));
        memcpy(*text + off, m->left, m->left_len);
        memcpy(*text + off + m->left_len, m->right, m->right_len);
        off += (size_t)m->left_len + m->right_len;
    }
    return KVF_OK;
}

/* Adds a resolved merge at rank. */
static void insert_merge(kvf_tokenizer_t *tok, uint32_t rank, const uint32_t id[3])
{
    uint64_t pair = (uint64_t)id[0] << 32 | id[1];
    const kvf_tok_index_t *x = &tok->merges;
    uint32_t h = pair_hash(pair) & x->mask;
    for (; x->slots[h]; h = (h + 1) & x->mask)
        if (tok->merge_nodes[x->slots[h] - 1].pair == pair)
            return; /* a repeated merge keeps its first (lowest) rank */
    tok->merge_nodes[tok->n_merges] =
        (kvf_tok_merge_t){.pair = pair, .rank = rank, .merged = id[2]};
    x->slots[h] = (uint32_t)++tok->n_merges;
}

/* Adds merges[first..first+n) (n <= MERGE_BATCH): both sides and their
 * concatenation must be vocabulary entries. */
static kvf_status_t add_batch(kvf_tokenizer_t *tok, const char *path, const kvf_tok_scan_t *scan,
                              size_t first, size_t n, char **text, size_t *text_cap)
{
    merge_job_t jobs[MERGE_BATCH];
    kvf_status_t st = hash_batch(&scan->merges[first], n, jobs, text, text_cap);
    if (st != KVF_OK)
        return st;
    prefetch_slots(tok, jobs, n);
    prefetch_entries(tok, jobs, n, true);
    prefetch_entries(tok, jobs, n, false);
    for (size_t j = 0; j < n; j++) {
        const kvf_tok_merge_item_t *m = jobs[j].m;
        const char *spelling[3] = {m->left, m->right, *text + jobs[j].joined_off};
        size_t len[3] = {m->left_len, m->right_len, (size_t)m->left_len + m->right_len};
        for (int k = 0; k < 3; k++)
            jobs[j].id[k] = vocab_find_hashed(tok, spelling[k], len[k], jobs[j].hash[k]);
        if (jobs[j].id[0] == KVF_TOK_NO_ID || jobs[j].id[1] == KVF_TOK_NO_ID ||
            jobs[j].id[2] == KVF_TOK_NO_ID) {
            kvf_log_error("%s: merge %zu '%.*s' '%.*s' names a token missing from the vocabulary",
                          path, first + j, (int)m->left_len, m->left, (int)m->right_len, m->right);
            return KVF_ERR_FORMAT;
        }
        __builtin_prefetch(
            &tok->merges.slots[pair_hash((uint64_t)jobs[j].id[0] << 32 | jobs[j].id[1]) &
                               tok->merges.mask]);
    }
    for (size_t j = 0; j < n; j++)
        insert_merge(tok, (uint32_t)(first + j), jobs[j].id);
    return KVF_OK;
}

static kvf_status_t load_merges(kvf_tokenizer_t *tok, const char *path, const kvf_tok_scan_t *scan)
{
    size_t n = scan->n_merges;
    tok->merge_nodes = calloc(n ? n : 1, sizeof(*tok->merge_nodes));
    advise_huge(tok->merge_nodes, n * sizeof(*tok->merge_nodes));
    if (!tok->merge_nodes)
        return KVF_ERR_NOMEM;
    kvf_status_t st = index_init(&tok->merges, n);
    char *text = NULL;
    size_t text_cap = 0;
    for (size_t i = 0; i < n && st == KVF_OK; i += MERGE_BATCH)
        st = add_batch(tok, path, scan, i, n - i < MERGE_BATCH ? n - i : MERGE_BATCH, &text,
                       &text_cap);
    free(text);
    return st;
}

const kvf_tok_merge_t *kvf_tokenizer__merge_find(const kvf_tokenizer_t *tok, uint32_t left,
                                                 uint32_t right)
{
    uint64_t pair = (uint64_t)left << 32 | right;
    const kvf_tok_index_t *x = &tok->merges;
    if (!x->slots)
        return NULL;
    for (uint32_t h = pair_hash(pair) & x->mask;; h = (h + 1) & x->mask) {
        uint32_t s = x->slots[h];
        if (!s)
            return NULL;
        if (tok->merge_nodes[s - 1].pair == pair)
            return &tok->merge_nodes[s - 1];
    }
}

/* ---- loading and freeing --------------------------------------------------- */

kvf_status_t kvf_tokenizer__load_vocab(kvf_tokenizer_t *tok, const char *path,
                                       const kvf_tok_scan_t *scan, const cJSON *added)
{
    kvf_status_t st = load_vocab(tok, path, scan, added);
    if (st == KVF_OK)
        st = load_added(tok, added);
    if (st != KVF_OK)
        return st;
    /* The arena is complete: pointers into it hold from here on. */
    for (size_t i = 0; i < tok->n_added; i++)
        tok->added[i].content = tok->arena + tok->added[i].content_off;
    st = match_added_forms(tok);
    if (st == KVF_OK)
        st = index_vocab(tok, path, scan);
    if (st == KVF_OK)
        st = load_merges(tok, path, scan);
    if (st != KVF_OK)
        return st;
    for (int b = 0; b < 256; b++)
        tok->byte_id[b] = kvf_tokenizer__vocab_find(tok, (const char *)tok->byte_spelling[b],
                                                    tok->byte_spelling_len[b]);
    return KVF_OK;
}

void kvf_tokenizer__free_vocab(kvf_tokenizer_t *tok)
{
    free(tok->merges.slots);
    free(tok->vocab.slots);
    free(tok->merge_nodes);
    free(tok->added);
    free(tok->tokens);
    free(tok->arena);
}

/* ---- queries ---------------------------------------------------------------- */

size_t kvf_tokenizer_vocab_size(const kvf_tokenizer_t *tok)
{
    return tok->n_ids;
}

bool kvf_tokenizer_has_id(const kvf_tokenizer_t *tok, uint32_t id)
{
    return id < tok->n_ids && tok->tokens[id].present;
}

int64_t kvf_tokenizer_bos_id(const kvf_tokenizer_t *tok)
{
    return tok->bos_id;
}

int64_t kvf_tokenizer_eos_id(const kvf_tokenizer_t *tok)
{
    return tok->eos_id;
}

bool kvf_tokenizer_adds_bos(const kvf_tokenizer_t *tok)
{
    return tok->adds_bos;
}

const char *kvf_tokenizer_token_text(const kvf_tokenizer_t *tok, uint32_t id)
{
    return kvf_tokenizer_has_id(tok, id) ? token_spelling(tok, id) : NULL;
}

const uint8_t *kvf_tokenizer_token_bytes(const kvf_tokenizer_t *tok, uint32_t id, size_t *len_p)
{
    if (!kvf_tokenizer_has_id(tok, id)) {
        *len_p = 0;
        return NULL;
    }
    const kvf_tok_piece_t *p = &tok->dec.pieces[id];
    if (p->byte >= 0) {
        *len_p = 1;
        return &tok->byte_value[p->byte];
    }
    *len_p = p->len;
    return p->len ? (const uint8_t *)tok->dec.arena + p->off : (const uint8_t *)"";
}

kvf_status_t kvf_tokenizer_token_id(const kvf_tokenizer_t *tok, const char *text, uint32_t *id_p)
{
    size_t len = strlen(text);
    for (size_t i = 0; i < tok->n_added; i++) {
        if (tok->added[i].len == len && !memcmp(tok->added[i].content, text, len)) {
            *id_p = tok->added[i].id;
            return KVF_OK;
        }
    }
    uint32_t id = kvf_tokenizer__vocab_find(tok, text, len);
    if (id == KVF_TOK_NO_ID)
        return KVF_ERR_NOT_FOUND;
    *id_p = id;
    return KVF_OK;
}
