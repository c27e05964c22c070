/* The tokenizer's vocabulary: model.vocab, added_tokens and model.merges
 * read into the arena and the two maps, and the id/text queries of
 * kvf/tokenizer.h (layout in tokenizer_internal.h). */
#include "tokenizer_internal.h"

#include "kvf/array.h"
#include "kvf/log.h"
#include "kvf/utf8.h"

#include <stdlib.h>
#include <string.h>

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
        bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        uint32_t cp = printable ? (uint32_t)b : next++;
        tok->cp_to_byte[cp] = (int16_t)b;
        tok->byte_spelling_len[b] = (uint8_t)kvf_utf8_encode(cp, tok->byte_spelling[b]);
    }
}

/* Sets a vocabulary id's spelling; its bytes are the ByteLevel decoding of
 * the spelling (characters outside the mapping stand for their own UTF-8). */
static kvf_status_t set_token(kvf_tokenizer_t *tok, uint32_t id, const char *text)
{
    size_t len = strlen(text);
    kvf_tok_entry_t e = {.present = true, .text_len = (uint32_t)len};
    kvf_status_t st = arena_add(tok, text, len, &e.text_off);
    if (st != KVF_OK)
        return st;
    uint8_t *bytes = malloc(len + 1);
    if (!bytes)
        return KVF_ERR_NOMEM;
    size_t n = 0;
    const uint8_t *s = (const uint8_t *)text;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int k = kvf_utf8_next(s + i, len - i, &cp);
        if (k > 0 && cp < KVF_TOK_BYTE_LEVEL_CPS && tok->cp_to_byte[cp] >= 0) {
            bytes[n++] = (uint8_t)tok->cp_to_byte[cp];
            i += (size_t)k;
        } else {
            size_t step = k > 0 ? (size_t)k : k < 0 ? (size_t)-k : len - i;
            memcpy(bytes + n, s + i, step);
            n += step;
            i += step;
        }
    }
    st = arena_add(tok, bytes, n, &e.bytes_off);
    free(bytes);
    if (st != KVF_OK)
        return st;
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
static kvf_status_t count_ids(const char *path, const cJSON *vocab, const cJSON *added,
                              uint32_t *n_ids_p)
{
    uint32_t max_id = 0;
    bool any = false;
    for (const cJSON *v = vocab->child; v; v = v->next) {
        uint32_t id;
        if (!v->string || !kvf_tokenizer__json_id(v, &id)) {
            kvf_log_error("%s: model.vocab entry '%s' has no valid id", path,
                          v->string ? v->string : "?");
            return KVF_ERR_FORMAT;
        }
        max_id = id > max_id ? id : max_id;
        any = true;
    }
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
static kvf_status_t load_vocab(kvf_tokenizer_t *tok, const char *path, const cJSON *vocab,
                               const cJSON *added)
{
    kvf_status_t st = count_ids(path, vocab, added, &tok->n_ids);
    if (st != KVF_OK)
        return st;
    tok->tokens = calloc(tok->n_ids, sizeof(*tok->tokens));
    if (!tok->tokens)
        return KVF_ERR_NOMEM;
    for (const cJSON *v = vocab->child; v; v = v->next) {
        uint32_t id = (uint32_t)v->valuedouble;
        if (tok->tokens[id].present) {
            kvf_log_error("%s: id %u appears twice in model.vocab", path, id);
            return KVF_ERR_FORMAT;
        }
        st = set_token(tok, id, v->string);
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
    if (!x->slots)
        return KVF_ERR_NOMEM;
    x->mask = (uint32_t)(cap - 1);
    return KVF_OK;
}

/* FNV-1a of a spelling. */
static uint32_t spelling_hash(const char *text, size_t len)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (uint8_t)text[i]) * 1099511628211ull;
    return (uint32_t)(h ^ h >> 32);
}

static uint32_t pair_hash(uint64_t pair)
{
    pair ^= pair >> 33;
    pair *= 0xff51afd7ed558ccdull;
    pair ^= pair >> 33;
    return (uint32_t)pair;
}

uint32_t kvf_tokenizer__vocab_find(const kvf_tokenizer_t *tok, const char *text, size_t len)
{
    const kvf_tok_index_t *x = &tok->vocab;
    if (!x->slots)
        return KVF_TOK_NO_ID;
    for (uint32_t h = spelling_hash(text, len) & x->mask;; h = (h + 1) & x->mask) {
        uint32_t s = x->slots[h];
        if (!s)
            return KVF_TOK_NO_ID;
        const kvf_tok_entry_t *e = &tok->tokens[s - 1];
        if (e->text_len == len && !memcmp(tok->arena + e->text_off, text, len))
            return s - 1;
    }
}

/* The vocabulary map, over the finished arena: model.vocab entries only
 * (an added token's text is not a spelling). */
static kvf_status_t index_vocab(kvf_tokenizer_t *tok, const char *path, const cJSON *vocab)
{
    kvf_status_t st = index_init(&tok->vocab, (size_t)cJSON_GetArraySize(vocab));
    if (st != KVF_OK)
        return st;
    const kvf_tok_index_t *x = &tok->vocab;
    for (const cJSON *v = vocab->child; v; v = v->next) {
        uint32_t id = (uint32_t)v->valuedouble;
        const kvf_tok_entry_t *e = &tok->tokens[id];
        const char *spelling = token_spelling(tok, id);
        uint32_t h = spelling_hash(spelling, e->text_len) & x->mask;
        for (; x->slots[h]; h = (h + 1) & x->mask) {
            const kvf_tok_entry_t *o = &tok->tokens[x->slots[h] - 1];
            if (o->text_len == e->text_len &&
                !memcmp(tok->arena + o->text_off, spelling, e->text_len)) {
                kvf_log_error("%s: token '%s' appears twice in model.vocab", path, v->string);
                return KVF_ERR_FORMAT;
            }
        }
        x->slots[h] = id + 1;
    }
    return KVF_OK;
}

/* ---- merges --------------------------------------------------------------- */

/* The two spellings of merge m: "left right" (ByteLevel spellings never
 * contain a plain space) or ["left", "right"]. Pointers into m. */
static kvf_status_t merge_sides(const char *path, uint32_t rank, const cJSON *m,
                                const char **left_p, size_t *left_len_p, const char **right_p,
                                size_t *right_len_p)
{
    if (cJSON_IsString(m)) {
        const char *sp = strchr(m->valuestring, ' ');
        if (!sp || strchr(sp + 1, ' ')) {
            kvf_log_error("%s: merge %u '%s' is not 'left right'", path, rank, m->valuestring);
            return KVF_ERR_FORMAT;
        }
        *left_p = m->valuestring;
        *left_len_p = (size_t)(sp - m->valuestring);
        *right_p = sp + 1;
        *right_len_p = strlen(sp + 1);
        return KVF_OK;
    }
    if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
        cJSON_IsString(m->child->next)) {
        *left_p = m->child->valuestring;
        *left_len_p = strlen(*left_p);
        *right_p = m->child->next->valuestring;
        *right_len_p = strlen(*right_p);
        return KVF_OK;
    }
    kvf_log_error("%s: merge %u is neither a string nor a pair of strings", path, rank);
    return KVF_ERR_FORMAT;
}

/* Adds merge m at rank: its sides and their concatenation must be
 * vocabulary entries. joined is scratch space (*joined_cap bytes). */
static kvf_status_t add_merge(kvf_tokenizer_t *tok, const char *path, uint32_t rank, const cJSON *m,
                              char **joined, size_t *joined_cap)
{
    const char *left, *right;
    size_t left_len, right_len;
    kvf_status_t st = merge_sides(path, rank, m, &left, &left_len, &right, &right_len);
    if (st != KVF_OK)
        return st;
    if ((st = kvf_array_reserve(joined, joined_cap, left_len + right_len + 1, 64, 1)) != KVF_OK)
        return st;
    memcpy(*joined, left, left_len);
    memcpy(*joined + left_len, right, right_len);
    uint32_t a = kvf_tokenizer__vocab_find(tok, left, left_len);
    uint32_t b = kvf_tokenizer__vocab_find(tok, right, right_len);
    uint32_t merged = kvf_tokenizer__vocab_find(tok, *joined, left_len + right_len);
    if (a == KVF_TOK_NO_ID || b == KVF_TOK_NO_ID || merged == KVF_TOK_NO_ID) {
        kvf_log_error("%s: merge %u '%.*s' '%.*s' names a token missing from the vocabulary", path,
                      rank, (int)left_len, left, (int)right_len, right);
        return KVF_ERR_FORMAT;
    }
    uint64_t pair = (uint64_t)a << 32 | b;
    const kvf_tok_index_t *x = &tok->merges;
    uint32_t h = pair_hash(pair) & x->mask;
    for (; x->slots[h]; h = (h + 1) & x->mask)
        if (tok->merge_nodes[x->slots[h] - 1].pair == pair)
            return KVF_OK; /* a repeated merge keeps its first (lowest) rank */
    tok->merge_nodes[tok->n_merges] =
        (kvf_tok_merge_t){.pair = pair, .rank = rank, .merged = merged};
    x->slots[h] = (uint32_t)++tok->n_merges;
    return KVF_OK;
}

static kvf_status_t load_merges(kvf_tokenizer_t *tok, const char *path, const cJSON *merges)
{
    size_t n = (size_t)cJSON_GetArraySize(merges);
    tok->merge_nodes = calloc(n ? n : 1, sizeof(*tok->merge_nodes));
    if (!tok->merge_nodes)
        return KVF_ERR_NOMEM;
    kvf_status_t ist = index_init(&tok->merges, n);
    if (ist != KVF_OK)
        return ist;
    char *joined = NULL;
    size_t joined_cap = 0;
    kvf_status_t st = KVF_OK;
    uint32_t rank = 0;
    for (const cJSON *m = merges ? merges->child : NULL; m && st == KVF_OK; m = m->next, rank++)
        st = add_merge(tok, path, rank, m, &joined, &joined_cap);
    free(joined);
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

kvf_status_t kvf_tokenizer__load_vocab(kvf_tokenizer_t *tok, const char *path, const cJSON *vocab,
                                       const cJSON *added, const cJSON *merges)
{
    kvf_status_t st = load_vocab(tok, path, vocab, added);
    if (st == KVF_OK)
        st = load_added(tok, added);
    if (st != KVF_OK)
        return st;
    /* The arena is complete: pointers into it hold from here on. */
    for (size_t i = 0; i < tok->n_added; i++)
        tok->added[i].content = tok->arena + tok->added[i].content_off;
    st = match_added_forms(tok);
    if (st == KVF_OK)
        st = index_vocab(tok, path, vocab);
    if (st == KVF_OK)
        st = load_merges(tok, path, merges);
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
    *len_p = tok->tokens[id].bytes_len;
    return (const uint8_t *)tok->arena + tok->tokens[id].bytes_off;
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
