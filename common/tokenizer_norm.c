/* Normalizers (tokenizer_internal.h): tokenizer.json's "normalizer" read
 * into a flat list of steps, and applied to the text between added
 * tokens before pre-tokenization. The Unicode forms come from utf8proc;
 * Prepend puts its string before non-empty text; Replace rewrites every
 * non-overlapping match of a literal or a regex, left to right. */
#include "tokenizer_internal.h"

#include "kvf/array.h"
#include "kvf/log.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

static kvf_status_t add_norm(kvf_tokenizer_t *tok, const char *path, kvf_tok_norm_t norm)
{
    if (tok->n_norms == KVF_TOK_MAX_NORM) {
        kvf_log_error("%s: more than %d normalizers", path, KVF_TOK_MAX_NORM);
        pcre2_code_free(norm.re);
        free(norm.content);
        return KVF_ERR_UNSUPPORTED;
    }
    tok->norms[tok->n_norms++] = norm;
    return KVF_OK;
}

static kvf_status_t dup_string(const cJSON *item, char **out_p, size_t *len_p)
{
    size_t len = strlen(item->valuestring);
    char *copy = malloc(len + 1);
    if (!copy)
        return KVF_ERR_NOMEM;
    memcpy(copy, item->valuestring, len + 1);
    *out_p = copy;
    *len_p = len;
    return KVF_OK;
}

static kvf_status_t load_replace(kvf_tokenizer_t *tok, const char *path, const cJSON *norm)
{
    const cJSON *pattern = cJSON_GetObjectItemCaseSensitive(norm, "pattern");
    const cJSON *regex = cJSON_GetObjectItemCaseSensitive(pattern, "Regex");
    const cJSON *string = cJSON_GetObjectItemCaseSensitive(pattern, "String");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(norm, "content");
    const cJSON *pat = cJSON_IsString(regex) ? regex : string;
    if (!cJSON_IsString(pat) || !cJSON_IsString(content)) {
        kvf_log_error("%s: Replace normalizer without a String/Regex pattern and a content", path);
        return KVF_ERR_FORMAT;
    }
    kvf_tok_norm_t n = {.kind = KVF_TOK_NORM_REPLACE};
    kvf_status_t st = kvf_tokenizer__compile(path, "Replace normalizer", pat->valuestring,
                                             strlen(pat->valuestring), pat == string, &n.re);
    if (st != KVF_OK)
        return st;
    if ((st = dup_string(content, &n.content, &n.content_len)) != KVF_OK) {
        pcre2_code_free(n.re);
        return st;
    }
    return add_norm(tok, path, n);
}

kvf_status_t kvf_tokenizer__load_normalizer(kvf_tokenizer_t *tok, const char *path,
                                            const cJSON *norm)
{
    if (!norm || cJSON_IsNull(norm))
        return KVF_OK;
    const char *type = kvf_tokenizer__json_type(norm);
    static const struct {
        const char *name;
        kvf_tok_norm_kind_t kind;
    } forms[] = {{"NFC", KVF_TOK_NORM_NFC},
                 {"NFD", KVF_TOK_NORM_NFD},
                 {"NFKC", KVF_TOK_NORM_NFKC},
                 {"NFKD", KVF_TOK_NORM_NFKD}};
    for (size_t i = 0; i < sizeof(forms) / sizeof(forms[0]); i++)
        if (!strcmp(type, forms[i].name))
            return add_norm(tok, path, (kvf_tok_norm_t){.kind = forms[i].kind});
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(norm, "normalizers");
        if (!cJSON_IsArray(list)) {
            kvf_log_error("%s: normalizer Sequence without a normalizers list", path);
            return KVF_ERR_FORMAT;
        }
        for (const cJSON *n = list->child; n; n = n->next) {
            kvf_status_t st = kvf_tokenizer__load_normalizer(tok, path, n);
            if (st != KVF_OK)
                return st;
        }
        return KVF_OK;
    }
    if (!strcmp(type, "Prepend")) {
        const cJSON *prepend = cJSON_GetObjectItemCaseSensitive(norm, "prepend");
        if (!cJSON_IsString(prepend)) {
            kvf_log_error("%s: Prepend normalizer without a prepend string", path);
            return KVF_ERR_FORMAT;
        }
        kvf_tok_norm_t n = {.kind = KVF_TOK_NORM_PREPEND};
        kvf_status_t st = dup_string(prepend, &n.content, &n.content_len);
        return st != KVF_OK ? st : add_norm(tok, path, n);
    }
    if (!strcmp(type, "Replace"))
        return load_replace(tok, path, norm);
    kvf_log_error("%s: normalizer '%s' is not supported (NFC, NFD, NFKC, NFKD, Prepend, "
                  "Replace, Sequence)",
                  path, type);
    return KVF_ERR_UNSUPPORTED;
}

void kvf_tokenizer__free_normalizer(kvf_tokenizer_t *tok)
{
    for (size_t i = 0; i < tok->n_norms; i++) {
        pcre2_code_free(tok->norms[i].re);
        free(tok->norms[i].content);
    }
    tok->n_norms = 0;
}

/* ---- applying them ---------------------------------------------------------- */

/* Two buffers the steps write into in turn. */
typedef struct {
    uint8_t *data;
    size_t len, cap;
} norm_buf_t;

static kvf_status_t buf_put(norm_buf_t *b, const void *data, size_t len)
{
    kvf_status_t st = kvf_array_reserve(&b->data, &b->cap, b->len + len + 1, 64, 1);
    if (st != KVF_OK)
        return st;
    memcpy(b->data + b->len, data, len);
    b->len += len;
    return KVF_OK;
}

static kvf_status_t unicode_form(kvf_tok_norm_kind_t kind, const uint8_t *s, size_t len,
                                 norm_buf_t *out)
{
    int opts = UTF8PROC_STABLE;
    if (kind == KVF_TOK_NORM_NFC || kind == KVF_TOK_NORM_NFKC)
        opts |= UTF8PROC_COMPOSE;
    else
        opts |= UTF8PROC_DECOMPOSE;
    if (kind == KVF_TOK_NORM_NFKC || kind == KVF_TOK_NORM_NFKD)
        opts |= UTF8PROC_COMPAT;
    utf8proc_uint8_t *mapped = NULL;
    utf8proc_ssize_t n = utf8proc_map(s, (utf8proc_ssize_t)len, &mapped, (utf8proc_option_t)opts);
    if (n < 0) {
        /* the text was checked to be valid UTF-8: only memory can fail */
        kvf_log_error("tokenizer: normalization failed: %s", utf8proc_errmsg(n));
        return n == UTF8PROC_ERROR_NOMEM ? KVF_ERR_NOMEM : KVF_ERR_INTERNAL;
    }
    kvf_status_t st = buf_put(out, mapped, (size_t)n);
    free(mapped);
    return st;
}

static kvf_status_t replace_all(const kvf_tok_norm_t *norm, const uint8_t *s, size_t len,
                                norm_buf_t *out)
{
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md)
        return KVF_ERR_NOMEM;
    kvf_status_t st = KVF_OK;
    size_t off = 0, last = 0;
    while (off <= len && st == KVF_OK) {
        int rc = pcre2_match(norm->re, s, len, off, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc < 0) {
            if (rc != PCRE2_ERROR_NOMATCH) {
                kvf_log_error("tokenizer: Replace normalizer regex failed (%d)", rc);
                st = KVF_ERR_INTERNAL;
            }
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if ((st = buf_put(out, s + last, ov[0] - last)) != KVF_OK ||
            (st = buf_put(out, norm->content, norm->content_len)) != KVF_OK)
            break;
        last = ov[1];
        off = ov[1];
        if (ov[1] == ov[0]) { /* an empty match: the next character is kept as is */
            if (off == len)
                break;
            off++;
            while (off < len && (s[off] & 0xc0) == 0x80)
                off++;
            st = buf_put(out, s + last, off - last);
            last = off;
        }
    }
    if (st == KVF_OK)
        st = buf_put(out, s + last, len - last);
    pcre2_match_data_free(md);
    return st;
}

static kvf_status_t apply(const kvf_tok_norm_t *norm, const uint8_t *s, size_t len, norm_buf_t *out)
{
    switch (norm->kind) {
    case KVF_TOK_NORM_PREPEND:
        if (len == 0)
            return KVF_OK;
        kvf_status_t st = buf_put(out, norm->content, norm->content_len);
        return st != KVF_OK ? st : buf_put(out, s, len);
    case KVF_TOK_NORM_REPLACE:
        return replace_all(norm, s, len, out);
    default:
        return unicode_form(norm->kind, s, len, out);
    }
}

kvf_status_t kvf_tokenizer__normalize(const kvf_tokenizer_t *tok, const uint8_t *s, size_t len,
                                      uint8_t **out_p, size_t *cap_p, size_t *out_len_p)
{
    norm_buf_t bufs[2] = {{.data = *out_p, .cap = *cap_p}, {0}};
    kvf_status_t st = buf_put(&bufs[0], s, len);
    int cur = 0;
    for (size_t i = 0; i < tok->n_norms && st == KVF_OK; i++) {
        norm_buf_t *src = &bufs[cur], *dst = &bufs[!cur];
        dst->len = 0;
        st = apply(&tok->norms[i], src->data, src->len, dst);
        cur = !cur;
    }
    /* the result goes back to the caller's buffer; the other is freed */
    free(bufs[!cur].data);
    *out_p = bufs[cur].data;
    *cap_p = bufs[cur].cap;
    *out_len_p = bufs[cur].len;
    return st;
}
