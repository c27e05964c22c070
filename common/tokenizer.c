/* Byte-level BPE tokenizer (see kvf/tokenizer.h for the contract).
 *
 * Layout of a loaded tokenizer: every id owns a string in one arena (the
 * tokenizer.json spelling) and the bytes it decodes to; the vocabulary is an
 * open-addressing hash map from spelling to id, the merges a hash map from
 * an id pair to (rank, merged id). BPE on one piece keeps its symbols in a
 * linked list and candidate merges in a binary heap ordered by
 * (rank, position), so a piece of n bytes costs O(n log n), never O(n^2):
 * a run of 100 KB of CJK letters is one regex piece. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "kvf/tokenizer.h"

#include "kvf/file.h"
#include "kvf/log.h"
#include "kvf/utf8.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_IDS        (1u << 24) /* ids above this are rejected as malformed */
#define MAX_FILE_BYTES (512u << 20)
#define NO_ID          UINT32_MAX
#define BYTE_LEVEL_CPS 0x144 /* code points used by the byte <-> symbol mapping */

/* The GPT-2 pre-tokenizer, used by ByteLevel with use_regex. */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

typedef enum {
    SPLIT_ISOLATED, /* matches and the text between them are pieces */
    SPLIT_REMOVED,  /* matches are dropped, the text between them kept */
} split_behavior_t;

typedef struct {
    pcre2_code *re;
    split_behavior_t behavior;
} split_step_t;

typedef struct {
    uint32_t id;
    uint32_t len;
    uint32_t content_off; /* raw text (not ByteLevel) in the arena */
    const char *content;  /* the same, once the arena is complete */
    bool lstrip, rstrip;
} added_token_t;

typedef struct {
    uint32_t text_off, text_len;   /* spelling in tokenizer.json */
    uint32_t bytes_off, bytes_len; /* bytes it decodes to */
    bool present;
} token_entry_t;

typedef struct {
    uint64_t key; /* left << 32 | right; UINT64_MAX = empty slot */
    uint32_t rank;
    uint32_t merged;
} merge_slot_t;

struct kvf_tokenizer {
    char *arena; /* spellings and bytes of every token */
    size_t arena_len, arena_cap;
    token_entry_t *tokens; /* [n_ids] */
    uint32_t n_ids;

    uint32_t *vocab_slots; /* open addressing over model.vocab: id + 1, 0 = empty */
    uint32_t vocab_mask;

    merge_slot_t *merge_slots;
    uint32_t merge_mask;

    uint32_t byte_id[256];         /* ByteLevel symbol id of each byte, NO_ID if absent */
    uint8_t byte_spelling[256][3]; /* UTF-8 of each byte's symbol */
    uint8_t byte_spelling_len[256];
    int16_t cp_to_byte[BYTE_LEVEL_CPS]; /* -1: not a byte symbol */

    split_step_t *steps;
    size_t n_steps;
    bool add_prefix_space;
    bool ignore_merges;

    added_token_t *added;
    size_t n_added;
    bool added_first_byte[256];

    int64_t bos_id, eos_id;
    bool adds_bos;
};

/* ---- hashing ------------------------------------------------------------ */

static uint64_t hash_bytes(const void *data, size_t len)
{
    const uint8_t *p = data;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static uint32_t table_size_for(size_t n)
{
    uint32_t size = 16;
    while (size < n * 2 + 1)
        size <<= 1;
    return size;
}

static const char *token_spelling(const kvf_tokenizer_t *tok, uint32_t id)
{
    return tok->arena + tok->tokens[id].text_off;
}

static uint32_t vocab_find(const kvf_tokenizer_t *tok, const char *text, size_t len)
{
    if (!tok->vocab_slots)
        return NO_ID;
    uint32_t i = (uint32_t)hash_bytes(text, len) & tok->vocab_mask;
    for (;;) {
        uint32_t v = tok->vocab_slots[i];
        if (v == 0)
            return NO_ID;
        const token_entry_t *e = &tok->tokens[v - 1];
        if (e->text_len == len && memcmp(tok->arena + e->text_off, text, len) == 0)
            return v - 1;
        i = (i + 1) & tok->vocab_mask;
    }
}

static const merge_slot_t *merge_find(const kvf_tokenizer_t *tok, uint32_t left, uint32_t right)
{
    uint64_t key = (uint64_t)left << 32 | right;
    uint32_t i = (uint32_t)hash_u64(key) & tok->merge_mask;
    for (;;) {
        const merge_slot_t *s = &tok->merge_slots[i];
        if (s->key == key)
            return s;
        if (s->key == UINT64_MAX)
            return NULL;
        i = (i + 1) & tok->merge_mask;
    }
}

/* ---- loading -------------------------------------------------------------- */

/* Appends len bytes to the arena; *off_p is their offset. */
static kvf_status_t arena_add(kvf_tokenizer_t *tok, const void *data, size_t len, uint32_t *off_p)
{
    if (tok->arena_len + len + 1 > tok->arena_cap) {
        size_t cap = tok->arena_cap ? tok->arena_cap : 4096;
        while (cap < tok->arena_len + len + 1)
            cap *= 2;
        if (cap > UINT32_MAX)
            return KVF_ERR_TOO_BIG;
        char *grown = realloc(tok->arena, cap);
        if (!grown)
            return KVF_ERR_NOMEM;
        tok->arena = grown;
        tok->arena_cap = cap;
    }
    *off_p = (uint32_t)tok->arena_len;
    memcpy(tok->arena + tok->arena_len, data, len);
    tok->arena_len += len;
    tok->arena[tok->arena_len++] = '\0';
    return KVF_OK;
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves,
 * the other 68 bytes take U+0100 onward in byte order. */
static void build_byte_mapping(kvf_tokenizer_t *tok)
{
    for (int i = 0; i < BYTE_LEVEL_CPS; i++)
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
    token_entry_t e = {.present = true, .text_len = (uint32_t)len};
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
        if (k > 0 && cp < BYTE_LEVEL_CPS && tok->cp_to_byte[cp] >= 0) {
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

static bool json_id(const cJSON *item, uint32_t *id_p)
{
    if (!cJSON_IsNumber(item) || !(item->valuedouble >= 0 && item->valuedouble < MAX_IDS) ||
        item->valuedouble != (double)(uint32_t)item->valuedouble)
        return false;
    *id_p = (uint32_t)item->valuedouble;
    return true;
}

static kvf_status_t load_vocab(kvf_tokenizer_t *tok, const char *path, const cJSON *vocab,
                               const cJSON *added)
{
    uint32_t max_id = 0;
    size_t n_vocab = 0;
    bool any = false;
    for (const cJSON *v = vocab->child; v; v = v->next) {
        uint32_t id;
        if (!v->string || !json_id(v, &id)) {
            kvf_log_error("%s: model.vocab entry '%s' has no valid id", path,
                          v->string ? v->string : "?");
            return KVF_ERR_FORMAT;
        }
        max_id = id > max_id ? id : max_id;
        n_vocab++;
        any = true;
    }
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next) {
        uint32_t id;
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(a, "content");
        if (!json_id(cJSON_GetObjectItemCaseSensitive(a, "id"), &id) || !cJSON_IsString(content) ||
            !content->valuestring[0]) {
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
    tok->n_ids = max_id + 1;
    tok->tokens = calloc(tok->n_ids, sizeof(*tok->tokens));
    tok->vocab_mask = table_size_for(n_vocab) - 1;
    tok->vocab_slots = calloc((size_t)tok->vocab_mask + 1, sizeof(*tok->vocab_slots));
    if (!tok->tokens || !tok->vocab_slots)
        return KVF_ERR_NOMEM;
    for (const cJSON *v = vocab->child; v; v = v->next) {
        uint32_t id = (uint32_t)v->valuedouble;
        if (tok->tokens[id].present) {
            kvf_log_error("%s: id %u appears twice in model.vocab", path, id);
            return KVF_ERR_FORMAT;
        }
        kvf_status_t st = set_token(tok, id, v->string);
        if (st != KVF_OK)
            return st;
        size_t len = tok->tokens[id].text_len;
        uint32_t i = (uint32_t)hash_bytes(v->string, len) & tok->vocab_mask;
        while (tok->vocab_slots[i]) {
            if (tok->tokens[tok->vocab_slots[i] - 1].text_len == len &&
                !memcmp(token_spelling(tok, tok->vocab_slots[i] - 1), v->string, len)) {
                kvf_log_error("%s: token '%s' appears twice in model.vocab", path, v->string);
                return KVF_ERR_FORMAT;
            }
            i = (i + 1) & tok->vocab_mask;
        }
        tok->vocab_slots[i] = id + 1;
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
        added_token_t *t = &tok->added[tok->n_added++];
        t->id = id;
        t->len = (uint32_t)strlen(content);
        /* the pointer is set once the arena stops moving */
        kvf_status_t st = arena_add(tok, content, t->len, &t->content_off);
        if (st != KVF_OK)
            return st;
        /* An added token's text is raw, not ByteLevel. When the id is also
         * in the vocabulary (GPT-2's <|endoftext|>), that entry stays. */
        if (!tok->tokens[id].present)
            tok->tokens[id] = (token_entry_t){.present = true,
                                              .text_off = t->content_off,
                                              .text_len = t->len,
                                              .bytes_off = t->content_off,
                                              .bytes_len = t->len};
        t->lstrip = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "lstrip"));
        t->rstrip = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "rstrip"));
        tok->added_first_byte[(uint8_t)content[0]] = true;
    }
    return KVF_OK;
}

static kvf_status_t merge_insert(kvf_tokenizer_t *tok, uint32_t left, uint32_t right, uint32_t rank,
                                 uint32_t merged)
{
    uint64_t key = (uint64_t)left << 32 | right;
    uint32_t i = (uint32_t)hash_u64(key) & tok->merge_mask;
    while (tok->merge_slots[i].key != UINT64_MAX) {
        if (tok->merge_slots[i].key == key)
            return KVF_OK; /* a repeated merge keeps its first (lowest) rank */
        i = (i + 1) & tok->merge_mask;
    }
    tok->merge_slots[i] = (merge_slot_t){.key = key, .rank = rank, .merged = merged};
    return KVF_OK;
}

static kvf_status_t load_merges(kvf_tokenizer_t *tok, const char *path, const cJSON *merges)
{
    size_t n = (size_t)cJSON_GetArraySize(merges);
    tok->merge_mask = table_size_for(n) - 1;
    tok->merge_slots = malloc(((size_t)tok->merge_mask + 1) * sizeof(*tok->merge_slots));
    if (!tok->merge_slots)
        return KVF_ERR_NOMEM;
    for (size_t i = 0; i <= tok->merge_mask; i++)
        tok->merge_slots[i].key = UINT64_MAX;
    char *joined = NULL;
    size_t joined_cap = 0;
    kvf_status_t st = KVF_OK;
    uint32_t rank = 0;
    for (const cJSON *m = merges ? merges->child : NULL; m; m = m->next, rank++) {
        const char *left, *right;
        size_t left_len, right_len;
        if (cJSON_IsString(m)) {
            /* "left right": ByteLevel spellings never contain a plain space */
            const char *sp = strchr(m->valuestring, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                kvf_log_error("%s: merge %u '%s' is not 'left right'", path, rank, m->valuestring);
                st = KVF_ERR_FORMAT;
                goto fail_merge;
            }
            left = m->valuestring;
            left_len = (size_t)(sp - left);
            right = sp + 1;
            right_len = strlen(right);
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
                   cJSON_IsString(m->child->next)) {
            left = m->child->valuestring;
            left_len = strlen(left);
            right = m->child->next->valuestring;
            right_len = strlen(right);
        } else {
            kvf_log_error("%s: merge %u is neither a string nor a pair of strings", path, rank);
            st = KVF_ERR_FORMAT;
            goto fail_merge;
        }
        if (left_len + right_len + 1 > joined_cap) {
            joined_cap = (left_len + right_len + 1) * 2;
            char *grown = realloc(joined, joined_cap);
            if (!grown) {
                st = KVF_ERR_NOMEM;
                goto fail_merge;
            }
            joined = grown;
        }
        memcpy(joined, left, left_len);
        memcpy(joined + left_len, right, right_len);
        uint32_t a = vocab_find(tok, left, left_len);
        uint32_t b = vocab_find(tok, right, right_len);
        uint32_t merged = vocab_find(tok, joined, left_len + right_len);
        if (a == NO_ID || b == NO_ID || merged == NO_ID) {
            kvf_log_error("%s: merge %u '%.*s' '%.*s' names a token missing from the vocabulary",
                          path, rank, (int)left_len, left, (int)right_len, right);
            st = KVF_ERR_FORMAT;
            goto fail_merge;
        }
        st = merge_insert(tok, a, b, rank, merged);
        if (st != KVF_OK)
            goto fail_merge;
    }
fail_merge:
    free(joined);
    return st;
}

static kvf_status_t add_step(kvf_tokenizer_t *tok, const char *path, const char *pattern,
                             bool literal, split_behavior_t behavior)
{
    /* With PCRE2_UCP, \s is Unicode white space (U+0085 and the Z
     * separators included) and \p{L}, \p{N} are the Unicode categories, as
     * in the Onig regexes the files were written for. */
    int err;
    PCRE2_SIZE err_off;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    pcre2_code *re =
        pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opts, &err, &err_off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof(msg));
        kvf_log_error("%s: pre-tokenizer regex does not compile at offset %zu: %s", path,
                      (size_t)err_off, (const char *)msg);
        return KVF_ERR_FORMAT;
    }
    /* JIT when this build of PCRE2 has it; the interpreter otherwise. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    split_step_t *grown = realloc(tok->steps, (tok->n_steps + 1) * sizeof(*grown));
    if (!grown) {
        pcre2_code_free(re);
        return KVF_ERR_NOMEM;
    }
    tok->steps = grown;
    tok->steps[tok->n_steps++] = (split_step_t){.re = re, .behavior = behavior};
    return KVF_OK;
}

static const char *json_type(const cJSON *obj)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(obj, "type");
    return cJSON_IsString(t) ? t->valuestring : "";
}

static kvf_status_t load_pre_tokenizer(kvf_tokenizer_t *tok, const char *path, const cJSON *pre,
                                       bool *byte_level_p)
{
    if (!pre || cJSON_IsNull(pre))
        return KVF_OK;
    const char *type = json_type(pre);
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers");
        for (const cJSON *p = list ? list->child : NULL; p; p = p->next) {
            kvf_status_t st = load_pre_tokenizer(tok, path, p, byte_level_p);
            if (st != KVF_OK)
                return st;
        }
        return KVF_OK;
    }
    if (!strcmp(type, "ByteLevel")) {
        *byte_level_p = true;
        const cJSON *use_regex = cJSON_GetObjectItemCaseSensitive(pre, "use_regex");
        /* The prefix space is added to each segment before any split. */
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pre, "add_prefix_space")))
            tok->add_prefix_space = true;
        if (!use_regex || cJSON_IsTrue(use_regex))
            return add_step(tok, path, GPT2_PATTERN, false, SPLIT_ISOLATED);
        return KVF_OK;
    }
    if (!strcmp(type, "Split")) {
        const cJSON *pattern = cJSON_GetObjectItemCaseSensitive(pre, "pattern");
        const cJSON *regex = cJSON_GetObjectItemCaseSensitive(pattern, "Regex");
        const cJSON *string = cJSON_GetObjectItemCaseSensitive(pattern, "String");
        const cJSON *behavior = cJSON_GetObjectItemCaseSensitive(pre, "behavior");
        split_behavior_t b;
        if (cJSON_IsString(behavior) && !strcmp(behavior->valuestring, "Isolated")) {
            b = SPLIT_ISOLATED;
        } else if (cJSON_IsString(behavior) && !strcmp(behavior->valuestring, "Removed")) {
            b = SPLIT_REMOVED;
        } else {
            kvf_log_error("%s: Split behavior '%s' is not supported (Isolated, Removed)", path,
                          cJSON_IsString(behavior) ? behavior->valuestring : "?");
            return KVF_ERR_UNSUPPORTED;
        }
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pre, "invert"))) {
            kvf_log_error("%s: inverted Split is not supported", path);
            return KVF_ERR_UNSUPPORTED;
        }
        if (cJSON_IsString(regex))
            return add_step(tok, path, regex->valuestring, false, b);
        if (cJSON_IsString(string))
            return add_step(tok, path, string->valuestring, true, b);
        kvf_log_error("%s: Split without a Regex or String pattern", path);
        return KVF_ERR_FORMAT;
    }
    kvf_log_error("%s: pre-tokenizer '%s' is not supported (ByteLevel, Split, Sequence)", path,
                  type);
    return KVF_ERR_UNSUPPORTED;
}

/* The id of a special token the post_processor puts first, or -1. */
static int64_t template_bos(const cJSON *post)
{
    if (!post)
        return -1;
    const char *type = json_type(post);
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(post, "processors");
        for (const cJSON *p = list ? list->child : NULL; p; p = p->next) {
            int64_t id = template_bos(p);
            if (id >= 0)
                return id;
        }
        return -1;
    }
    if (strcmp(type, "TemplateProcessing"))
        return -1;
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(post, "single");
    const cJSON *first = cJSON_IsArray(single) ? single->child : NULL;
    const cJSON *special = cJSON_GetObjectItemCaseSensitive(first, "SpecialToken");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(special, "id");
    if (!cJSON_IsString(name))
        return -1;
    const cJSON *table = cJSON_GetObjectItemCaseSensitive(post, "special_tokens");
    const cJSON *entry = cJSON_GetObjectItemCaseSensitive(table, name->valuestring);
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(entry, "ids");
    uint32_t id;
    if (!cJSON_IsArray(ids) || cJSON_GetArraySize(ids) != 1 || !json_id(ids->child, &id))
        return -1;
    return id;
}

/* tokenizer_config.json names tokens as a string or {"content": ...}. */
static const char *config_token(const cJSON *config, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(config, key);
    if (cJSON_IsObject(v))
        v = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static kvf_status_t load_config(kvf_tokenizer_t *tok, const char *dir, const cJSON *post)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    char *text;
    size_t len;
    int64_t tmpl = template_bos(post);
    tok->bos_id = tmpl;
    tok->adds_bos = tmpl >= 0;
    tok->eos_id = -1;
    kvf_status_t st = kvf_file_read(path, MAX_FILE_BYTES, &text, &len);
    if (st == KVF_ERR_NOT_FOUND)
        return KVF_OK;
    if (st != KVF_OK)
        return st;
    cJSON *config = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(config)) {
        kvf_log_error("%s: not a JSON object", path);
        cJSON_Delete(config);
        return KVF_ERR_FORMAT;
    }
    uint32_t id;
    const char *bos = config_token(config, "bos_token");
    const char *eos = config_token(config, "eos_token");
    if (bos && kvf_tokenizer_token_id(tok, bos, &id) == KVF_OK)
        tok->bos_id = id;
    else if (bos)
        kvf_log_warn("%s: bos_token '%s' is not a token", path, bos);
    if (eos && kvf_tokenizer_token_id(tok, eos, &id) == KVF_OK)
        tok->eos_id = id;
    else if (eos)
        kvf_log_warn("%s: eos_token '%s' is not a token", path, eos);
    const cJSON *add_bos = cJSON_GetObjectItemCaseSensitive(config, "add_bos_token");
    if (cJSON_IsBool(add_bos))
        tok->adds_bos = cJSON_IsTrue(add_bos) && tok->bos_id >= 0;
    cJSON_Delete(config);
    return KVF_OK;
}

static kvf_status_t parse_tokenizer_json(kvf_tokenizer_t *tok, const char *path, const cJSON *root)
{
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    const char *type = json_type(model);
    if (!cJSON_IsObject(model) || (type[0] && strcmp(type, "BPE"))) {
        kvf_log_error("%s: model type '%s' is not supported (byte-level BPE only)", path, type);
        return KVF_ERR_UNSUPPORTED;
    }
    if (!cJSON_IsObject(vocab) || (merges && !cJSON_IsArray(merges)) ||
        (added && !cJSON_IsArray(added) && !cJSON_IsNull(added))) {
        kvf_log_error("%s: model.vocab, model.merges or added_tokens malformed", path);
        return KVF_ERR_FORMAT;
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback")) ||
        cJSON_IsString(cJSON_GetObjectItemCaseSensitive(model, "continuing_subword_prefix")) ||
        cJSON_IsString(cJSON_GetObjectItemCaseSensitive(model, "end_of_word_suffix"))) {
        kvf_log_error("%s: BPE with byte_fallback or subword affixes is not supported", path);
        return KVF_ERR_UNSUPPORTED;
    }
    if (!cJSON_IsArray(added))
        added = NULL;
    tok->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));
    kvf_status_t st = load_vocab(tok, path, vocab, added);
    if (st == KVF_OK)
        st = load_merges(tok, path, merges);
    if (st == KVF_OK)
        st = load_added(tok, added);
    if (st != KVF_OK)
        return st;
    for (size_t i = 0; i < tok->n_added; i++)
        tok->added[i].content = tok->arena + tok->added[i].content_off;
    bool byte_level = false;
    st = load_pre_tokenizer(tok, path, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"),
                            &byte_level);
    if (st != KVF_OK)
        return st;
    if (!byte_level) {
        kvf_log_error("%s: no ByteLevel pre-tokenizer: only byte-level BPE is supported", path);
        return KVF_ERR_UNSUPPORTED;
    }
    const cJSON *normalizer = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (normalizer && !cJSON_IsNull(normalizer))
        kvf_log_warn("%s: normalizer '%s' is not applied (text is encoded as given)", path,
                     json_type(normalizer));
    for (int b = 0; b < 256; b++)
        tok->byte_id[b] =
            vocab_find(tok, (const char *)tok->byte_spelling[b], tok->byte_spelling_len[b]);
    return KVF_OK;
}

kvf_status_t kvf_tokenizer_load(const char *model_dir, kvf_tokenizer_t **tok_p)
{
    char path[4096];
    if ((size_t)snprintf(path, sizeof(path), "%s/tokenizer.json", model_dir) >= sizeof(path))
        return KVF_ERR_INVAL;
    char *text;
    size_t len;
    kvf_status_t st = kvf_file_read(path, MAX_FILE_BYTES, &text, &len);
    if (st == KVF_ERR_NOT_FOUND)
        kvf_log_error("%s: not found", path);
    if (st != KVF_OK)
        return st;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(root)) {
        kvf_log_error("%s: not valid JSON", path);
        st = KVF_ERR_FORMAT;
        goto fail_parse;
    }
    kvf_tokenizer_t *tok = calloc(1, sizeof(*tok));
    if (!tok) {
        st = KVF_ERR_NOMEM;
        goto fail_parse;
    }
    build_byte_mapping(tok);
    st = parse_tokenizer_json(tok, path, root);
    if (st != KVF_OK)
        goto fail_tok;
    st = load_config(tok, model_dir, cJSON_GetObjectItemCaseSensitive(root, "post_processor"));
    if (st != KVF_OK)
        goto fail_tok;
    cJSON_Delete(root);
    kvf_log_debug("tokenizer %s: %u ids, bos %lld (%s), eos %lld", model_dir, tok->n_ids,
                  (long long)tok->bos_id, tok->adds_bos ? "added" : "not added",
                  (long long)tok->eos_id);
    *tok_p = tok;
    return KVF_OK;
fail_tok:
    kvf_tokenizer_destroy(tok);
fail_parse:
    cJSON_Delete(root);
    return st;
}

void kvf_tokenizer_destroy(kvf_tokenizer_t *tok)
{
    if (!tok)
        return;
    for (size_t i = 0; i < tok->n_steps; i++)
        pcre2_code_free(tok->steps[i].re);
    free(tok->steps);
    free(tok->added);
    free(tok->merge_slots);
    free(tok->vocab_slots);
    free(tok->tokens);
    free(tok->arena);
    free(tok);
}

/* ---- encoding -------------------------------------------------------------- */

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

/* Capacity for need elements of elem bytes, doubling from *cap. Returns
 * the (maybe moved) buffer, or NULL with buf still valid and still the
 * caller's. */
static void *grow(void *buf, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return buf;
    size_t cap2 = *cap ? *cap : 64;
    while (cap2 < need)
        cap2 *= 2;
    void *grown = realloc(buf, cap2 * elem);
    if (grown)
        *cap = cap2;
    return grown;
}

static kvf_status_t emit(encoder_t *enc, uint32_t id)
{
    if (enc->n_ids == enc->ids_cap) {
        uint32_t *ids = grow(enc->ids, &enc->ids_cap, enc->n_ids + 1, sizeof(*ids));
        if (!ids)
            return KVF_ERR_NOMEM;
        enc->ids = ids;
    }
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
    const merge_slot_t *m = merge_find(enc->tok, enc->sym[left], enc->sym[right]);
    if (m)
        heap_push(enc->heap, n_heap, (uint64_t)m->rank << 32 | (uint32_t)left);
}

/* Room for n symbols: sym, prev and next hold n, the heap 2n (n - 1 pairs
 * at first, then each merge pops one entry and pushes at most two). */
static kvf_status_t reserve_symbols(encoder_t *enc, size_t n)
{
    size_t cap = enc->sym_cap ? enc->sym_cap : 64;
    while (cap < n)
        cap *= 2;
    uint32_t *sym = realloc(enc->sym, cap * sizeof(*sym));
    if (sym)
        enc->sym = sym;
    int32_t *prev = sym ? realloc(enc->prev, cap * sizeof(*prev)) : NULL;
    if (prev)
        enc->prev = prev;
    int32_t *next = prev ? realloc(enc->next, cap * sizeof(*next)) : NULL;
    if (next)
        enc->next = next;
    uint64_t *heap = next ? realloc(enc->heap, 2 * cap * sizeof(*heap)) : NULL;
    if (!heap)
        return KVF_ERR_NOMEM;
    enc->heap = heap;
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
        char *spelled = grow(enc->spelled, &enc->spelled_cap, len * 2 + 1, 1);
        if (!spelled)
            return KVF_ERR_NOMEM;
        enc->spelled = spelled;
        size_t n = 0;
        for (size_t i = 0; i < len; i++) {
            memcpy(enc->spelled + n, tok->byte_spelling[piece[i]],
                   tok->byte_spelling_len[piece[i]]);
            n += tok->byte_spelling_len[piece[i]];
        }
        uint32_t id = vocab_find(tok, enc->spelled, n);
        if (id != NO_ID)
            return emit(enc, id);
    }
    if (len > enc->sym_cap && (st = reserve_symbols(enc, len)) != KVF_OK)
        return st;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        uint32_t id = tok->byte_id[piece[i]];
        if (id == NO_ID) {
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
        const merge_slot_t *m = merge_find(tok, enc->sym[left], enc->sym[right]);
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
    const split_step_t *sp = &enc->tok->steps[step];
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
        if (sp->behavior == SPLIT_ISOLATED &&
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
        uint8_t *prefixed = grow(enc->prefixed, &enc->prefixed_cap, len + 1, 1);
        if (!prefixed)
            return KVF_ERR_NOMEM;
        enc->prefixed = prefixed;
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
static const added_token_t *match_added(const kvf_tokenizer_t *tok, const uint8_t *text, size_t len,
                                        size_t pos)
{
    const added_token_t *best = NULL;
    for (size_t i = 0; i < tok->n_added; i++) {
        const added_token_t *t = &tok->added[i];
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
    enc.ids = grow(NULL, &enc.ids_cap, len / 3 + 16, sizeof(*enc.ids));
    if (!enc.ids)
        return KVF_ERR_NOMEM;
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
        const added_token_t *t = match_added(tok, s, len, pos);
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

/* ---- decoding -------------------------------------------------------------- */

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
        const token_entry_t *e = &tok->tokens[ids[i]];
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
    uint32_t id = vocab_find(tok, text, len);
    if (id == NO_ID)
        return KVF_ERR_NOT_FOUND;
    *id_p = id;
    return KVF_OK;
}

/* ---- streaming ------------------------------------------------------------- */

void kvf_detok_init(kvf_detok_t *detok, const kvf_tokenizer_t *tok)
{
    *detok = (kvf_detok_t){.tok = tok};
}

static kvf_status_t detok_reserve(kvf_detok_t *detok, size_t need)
{
    if (need <= detok->out_cap)
        return KVF_OK;
    size_t cap = detok->out_cap ? detok->out_cap : 64;
    while (cap < need)
        cap *= 2;
    char *grown = realloc(detok->out, cap);
    if (!grown)
        return KVF_ERR_NOMEM;
    detok->out = grown;
    detok->out_cap = cap;
    return KVF_OK;
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
