/* The fast path of loading tokenizer.json: model.vocab and model.merges,
 * which are almost all of a large file (128k entries and 280k merges for
 * Llama 3), are read straight from the text, their strings decoded in
 * place, without building a JSON tree; the small rest of the document is
 * handed to cJSON with those two values replaced by {} and []. Layout in
 * tokenizer_internal.h. */
#include "tokenizer_internal.h"

#include "kvf/array.h"
#include "kvf/log.h"
#include "kvf/utf8.h"

#include <stdlib.h>
#include <string.h>

/* Deeper nesting is refused, as cJSON refuses it. */
#define SCAN_MAX_DEPTH 1000

typedef struct {
    char *p, *end;
    const char *path;
    const char *start; /* of the document, for offsets in errors */
} scanner_t;

static kvf_status_t scan_error(scanner_t *s, const char *what)
{
    kvf_log_error("%s: malformed JSON at byte %zu: %s", s->path, (size_t)(s->p - s->start), what);
    return KVF_ERR_FORMAT;
}

static void skip_ws(scanner_t *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t'))
        s->p++;
}

static int hex4(const char *p)
{
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0)
            return -1;
        v = v << 4 | d;
    }
    return v;
}

/* One \u escape at s->p (after the backslash and 'u'), a surrogate pair
 * taking two; *cp_p is the code point. */
static kvf_status_t unicode_escape(scanner_t *s, uint32_t *cp_p)
{
    if (s->end - s->p < 4 || hex4(s->p) < 0)
        return scan_error(s, "bad \\u escape");
    uint32_t cp = (uint32_t)hex4(s->p);
    s->p += 4;
    if (cp >= 0xdc00 && cp <= 0xdfff)
        return scan_error(s, "unpaired low surrogate");
    if (cp >= 0xd800 && cp <= 0xdbff) {
        if (s->end - s->p < 6 || s->p[0] != '\\' || s->p[1] != 'u' || hex4(s->p + 2) < 0xdc00 ||
            hex4(s->p + 2) > 0xdfff)
            return scan_error(s, "unpaired high surrogate");
        cp = 0x10000 + ((cp - 0xd800) << 10) + ((uint32_t)hex4(s->p + 2) - 0xdc00);
        s->p += 6;
    }
    *cp_p = cp;
    return KVF_OK;
}

/* The string at s->p (its opening quote). With decode, its content is
 * decoded in place (never longer than the escaped form) and
 * *out_p and *len_p name it; without, it is only checked. */
static kvf_status_t scan_string(scanner_t *s, bool decode, char **out_p, size_t *len_p)
{
    char *w = ++s->p;
    char *out = w;
    for (;;) {
        /* the common case: a run of plain characters */
        char *q = s->p;
        while (q < s->end && *q != '"' && *q != '\\' && (unsigned char)*q >= 0x20)
            q++;
        if (decode && w != s->p)
            memmove(w, s->p, (size_t)(q - s->p));
        w += q - s->p;
        s->p = q;
        if (q >= s->end)
            return scan_error(s, "unterminated string");
        if (*q == '"')
            break;
        if ((unsigned char)*q < 0x20)
            return scan_error(s, "control character in a string");
        if (s->end - q < 2)
            return scan_error(s, "unterminated string");
        char e = q[1];
        s->p = q + 2;
        char c;
        switch (e) {
        case '"':
            c = '"';
            break;
        case '\\':
            c = '\\';
            break;
        case '/':
            c = '/';
            break;
        case 'b':
            c = '\b';
            break;
        case 'f':
            c = '\f';
            break;
        case 'n':
            c = '\n';
            break;
        case 'r':
            c = '\r';
            break;
        case 't':
            c = '\t';
            break;
        case 'u': {
            uint32_t cp;
            kvf_status_t st = unicode_escape(s, &cp);
            if (st != KVF_OK)
                return st;
            uint8_t buf[4];
            int n = kvf_utf8_encode(cp, buf);
            if (decode)
                memcpy(w, buf, (size_t)n);
            w += n;
            continue;
        }
        default:
            return scan_error(s, "bad escape");
        }
        if (decode)
            *w = c;
        w++;
    }
    s->p++; /* the closing quote */
    if (decode) {
        *out_p = out;
        *len_p = (size_t)(w - out);
    }
    return KVF_OK;
}

static kvf_status_t skip_value(scanner_t *s, int depth);

/* The members or elements of the object or array at s->p, skipped. */
static kvf_status_t skip_container(scanner_t *s, int depth)
{
    char close = *s->p == '{' ? '}' : ']';
    bool object = close == '}';
    if (depth >= SCAN_MAX_DEPTH)
        return scan_error(s, "nested too deeply");
    s->p++;
    skip_ws(s);
    if (s->p < s->end && *s->p == close) {
        s->p++;
        return KVF_OK;
    }
    for (;;) {
        kvf_status_t st;
        skip_ws(s);
        if (object) {
            if (s->p >= s->end || *s->p != '"')
                return scan_error(s, "expected a member name");
            if ((st = scan_string(s, false, NULL, NULL)) != KVF_OK)
                return st;
            skip_ws(s);
            if (s->p >= s->end || *s->p != ':')
                return scan_error(s, "expected ':'");
            s->p++;
        }
        if ((st = skip_value(s, depth + 1)) != KVF_OK)
            return st;
        skip_ws(s);
        if (s->p < s->end && *s->p == ',') {
            s->p++;
            continue;
        }
        if (s->p < s->end && *s->p == close) {
            s->p++;
            return KVF_OK;
        }
        return scan_error(s, object ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static kvf_status_t skip_literal(scanner_t *s)
{
    static const char *const words[] = {"true", "false", "null"};
    for (size_t i = 0; i < 3; i++) {
        size_t n = strlen(words[i]);
        if ((size_t)(s->end - s->p) >= n && !memcmp(s->p, words[i], n)) {
            s->p += n;
            return KVF_OK;
        }
    }
    /* a number: the characters it may contain; cJSON checks the rest */
    char *q = s->p;
    while (q < s->end && (strchr("+-.eE", *q) || (*q >= '0' && *q <= '9')) && *q)
        q++;
    if (q == s->p)
        return scan_error(s, "expected a value");
    s->p = q;
    return KVF_OK;
}

static kvf_status_t skip_value(scanner_t *s, int depth)
{
    skip_ws(s);
    if (s->p >= s->end)
        return scan_error(s, "expected a value");
    if (*s->p == '"')
        return scan_string(s, false, NULL, NULL);
    if (*s->p == '{' || *s->p == '[')
        return skip_container(s, depth);
    return skip_literal(s);
}

/* The member name at s->p: *which_p is the index of the one of wants[n]
 * it equals, or -1. The text is not modified: a name with escapes is
 * decoded into a small buffer (the names looked for are short). */
static kvf_status_t scan_name(scanner_t *s, const char *const *wants, int n, int *which_p)
{
    char *begin = s->p + 1;
    kvf_status_t st = scan_string(s, false, NULL, NULL);
    if (st != KVF_OK)
        return st;
    const char *name = begin;
    size_t len = (size_t)(s->p - 1 - begin);
    char buf[64];
    if (memchr(begin, '\\', len) && len < sizeof(buf) - 2) {
        memcpy(buf, begin - 1, len + 2);
        scanner_t t = {.p = buf, .end = buf + len + 2, .path = s->path, .start = buf};
        char *decoded;
        if (scan_string(&t, true, &decoded, &len) != KVF_OK)
            return scan_error(s, "bad member name");
        name = decoded;
    }
    *which_p = -1;
    for (int i = 0; i < n; i++)
        if (strlen(wants[i]) == len && !memcmp(wants[i], name, len))
            *which_p = i;
    return KVF_OK;
}

/* ---- model.vocab and model.merges ------------------------------------------ */

static kvf_status_t scan_id(scanner_t *s, uint32_t *id_p)
{
    skip_ws(s);
    char *q = s->p;
    uint64_t v = 0;
    while (q < s->end && *q >= '0' && *q <= '9' && v < KVF_TOK_MAX_IDS)
        v = v * 10 + (uint64_t)(*q++ - '0');
    /* an id written as 5.0 or 5e0 goes through strtod, as cJSON reads it */
    if (q < s->end && (*q == '.' || *q == 'e' || *q == 'E')) {
        char num[64];
        char *n0 = s->p;
        if (skip_literal(s) != KVF_OK || (size_t)(s->p - n0) >= sizeof(num))
            return scan_error(s, "bad id");
        memcpy(num, n0, (size_t)(s->p - n0));
        num[s->p - n0] = '\0';
        double d = strtod(num, NULL);
        if (!(d >= 0 && d < KVF_TOK_MAX_IDS) || d != (double)(uint32_t)d)
            return scan_error(s, "id out of range");
        *id_p = (uint32_t)d;
        return KVF_OK;
    }
    if (q == s->p || v >= KVF_TOK_MAX_IDS)
        return scan_error(s, "model.vocab id is not an integer in range");
    s->p = q;
    *id_p = (uint32_t)v;
    return KVF_OK;
}

static kvf_status_t scan_vocab(scanner_t *s, kvf_tok_scan_t *out)
{
    size_t cap = 0;
    s->p++; /* '{' */
    skip_ws(s);
    if (s->p < s->end && *s->p == '}') {
        s->p++;
        return KVF_OK;
    }
    for (;;) {
        skip_ws(s);
        if (s->p >= s->end || *s->p != '"')
            return scan_error(s, "expected a token in model.vocab");
        kvf_tok_vocab_item_t item;
        char *text;
        size_t len;
        kvf_status_t st = scan_string(s, true, &text, &len);
        if (st != KVF_OK)
            return st;
        item.text = text;
        item.len = (uint32_t)len;
        skip_ws(s);
        if (s->p >= s->end || *s->p != ':')
            return scan_error(s, "expected ':'");
        s->p++;
        if ((st = scan_id(s, &item.id)) != KVF_OK)
            return st;
        st = kvf_array_reserve(&out->vocab, &cap, out->n_vocab + 1, 1024, sizeof(*out->vocab));
        if (st != KVF_OK)
            return st;
        out->vocab[out->n_vocab++] = item;
        skip_ws(s);
        if (s->p < s->end && *s->p == ',') {
            s->p++;
            continue;
        }
        if (s->p < s->end && *s->p == '}') {
            s->p++;
            return KVF_OK;
        }
        return scan_error(s, "expected ',' or '}' in model.vocab");
    }
}

/* One side of a merge pair: a string, then the expected separator. */
static kvf_status_t scan_side(scanner_t *s, char sep, const char **text_p, uint32_t *len_p)
{
    skip_ws(s);
    if (s->p >= s->end || *s->p != '"')
        return scan_error(s, "a merge pair is not two strings");
    char *text;
    size_t len;
    kvf_status_t st = scan_string(s, true, &text, &len);
    if (st != KVF_OK)
        return st;
    skip_ws(s);
    if (s->p >= s->end || *s->p != sep)
        return scan_error(s, "a merge pair is not two strings");
    s->p++;
    *text_p = text;
    *len_p = (uint32_t)len;
    return KVF_OK;
}

/* One merge: "left right" or ["left", "right"]. */
static kvf_status_t scan_merge(scanner_t *s, kvf_tok_merge_item_t *m)
{
    if (*s->p == '[') {
        s->p++;
        kvf_status_t st = scan_side(s, ',', &m->left, &m->left_len);
        return st == KVF_OK ? scan_side(s, ']', &m->right, &m->right_len) : st;
    }
    if (*s->p != '"')
        return scan_error(s, "a merge is neither a string nor a pair of strings");
    char *text;
    size_t len;
    kvf_status_t st = scan_string(s, true, &text, &len);
    if (st != KVF_OK)
        return st;
    char *sp = memchr(text, ' ', len);
    if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp + 1 - text)))
        return scan_error(s, "a merge is not 'left right'");
    *m = (kvf_tok_merge_item_t){.left = text,
                                .left_len = (uint32_t)(sp - text),
                                .right = sp + 1,
                                .right_len = (uint32_t)(len - (size_t)(sp + 1 - text))};
    return KVF_OK;
}

static kvf_status_t scan_merges(scanner_t *s, kvf_tok_scan_t *out)
{
    size_t cap = 0;
    s->p++; /* '[' */
    skip_ws(s);
    if (s->p < s->end && *s->p == ']') {
        s->p++;
        return KVF_OK;
    }
    for (;;) {
        skip_ws(s);
        if (s->p >= s->end)
            return scan_error(s, "unterminated model.merges");
        kvf_status_t st =
            kvf_array_reserve(&out->merges, &cap, out->n_merges + 1, 1024, sizeof(*out->merges));
        if (st != KVF_OK)
            return st;
        if ((st = scan_merge(s, &out->merges[out->n_merges])) != KVF_OK)
            return st;
        out->n_merges++;
        skip_ws(s);
        if (s->p < s->end && *s->p == ',') {
            s->p++;
            continue;
        }
        if (s->p < s->end && *s->p == ']') {
            s->p++;
            return KVF_OK;
        }
        return scan_error(s, "expected ',' or ']' in model.merges");
    }
}

/* ---- the document ---------------------------------------------------------- */

typedef struct {
    char *begin, *end;
} span_t;

/* The members of the model object at s->p: the first "vocab" when it is an
 * object and the first "merges" when it is an array are read, and their
 * spans noted; everything else is skipped. */
static kvf_status_t scan_model(scanner_t *s, kvf_tok_scan_t *out, span_t *vocab, span_t *merges)
{
    s->p++; /* '{' */
    for (;;) {
        skip_ws(s);
        if (s->p < s->end && *s->p == '}') {
            s->p++;
            return KVF_OK;
        }
        if (s->p >= s->end || *s->p != '"')
            return scan_error(s, "expected a member name in model");
        static const char *const names[] = {"vocab", "merges"};
        int which;
        kvf_status_t st = scan_name(s, names, 2, &which);
        if (st != KVF_OK)
            return st;
        bool is_vocab = which == 0, is_merges = which == 1;
        skip_ws(s);
        if (s->p >= s->end || *s->p != ':')
            return scan_error(s, "expected ':'");
        s->p++;
        skip_ws(s);
        char *value = s->p;
        if (is_vocab && !out->has_vocab && s->p < s->end && *s->p == '{') {
            st = scan_vocab(s, out);
            out->has_vocab = st == KVF_OK;
            *vocab = (span_t){value, s->p};
        } else if (is_merges && !out->has_merges && s->p < s->end && *s->p == '[') {
            st = scan_merges(s, out);
            out->has_merges = st == KVF_OK;
            *merges = (span_t){value, s->p};
        } else {
            st = skip_value(s, 2);
        }
        if (st != KVF_OK)
            return st;
        skip_ws(s);
        if (s->p < s->end && *s->p == ',')
            s->p++;
        else if (s->p >= s->end || *s->p != '}')
            return scan_error(s, "expected ',' or '}' in model");
    }
}

/* The document's root members; the first "model" that is an object is
 * scanned by scan_model(). */
static kvf_status_t scan_root(scanner_t *s, kvf_tok_scan_t *out, span_t *vocab, span_t *merges)
{
    skip_ws(s);
    if (s->p >= s->end || *s->p != '{')
        return scan_error(s, "the document is not an object");
    s->p++;
    bool model_seen = false;
    for (;;) {
        skip_ws(s);
        if (s->p < s->end && *s->p == '}') {
            s->p++;
            return KVF_OK;
        }
        if (s->p >= s->end || *s->p != '"')
            return scan_error(s, "expected a member name");
        static const char *const names[] = {"model"};
        int which;
        kvf_status_t st = scan_name(s, names, 1, &which);
        if (st != KVF_OK)
            return st;
        bool is_model = which == 0;
        skip_ws(s);
        if (s->p >= s->end || *s->p != ':')
            return scan_error(s, "expected ':'");
        s->p++;
        skip_ws(s);
        if (is_model && !model_seen && s->p < s->end && *s->p == '{') {
            model_seen = true;
            st = scan_model(s, out, vocab, merges);
        } else {
            model_seen |= is_model;
            st = skip_value(s, 1);
        }
        if (st != KVF_OK)
            return st;
        skip_ws(s);
        if (s->p < s->end && *s->p == ',')
            s->p++;
        else if (s->p >= s->end || *s->p != '}')
            return scan_error(s, "expected ',' or '}'");
    }
}

/* Copies text into out->rest with each span (in order; empty ones absent)
 * replaced by its empty value. */
static kvf_status_t build_rest(const char *text, size_t len, span_t a, span_t b,
                               kvf_tok_scan_t *out)
{
    if (a.begin && b.begin && b.begin < a.begin) {
        span_t t = a;
        a = b;
        b = t;
    }
    out->rest = malloc(len + 4);
    if (!out->rest)
        return KVF_ERR_NOMEM;
    const char *from = text;
    size_t n = 0;
    span_t spans[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        if (!spans[i].begin)
            continue;
        memcpy(out->rest + n, from, (size_t)(spans[i].begin - from));
        n += (size_t)(spans[i].begin - from);
        out->rest[n++] = spans[i].begin[0];
        out->rest[n++] = spans[i].begin[0] == '{' ? '}' : ']';
        from = spans[i].end;
    }
    memcpy(out->rest + n, from, (size_t)(text + len - from));
    n += (size_t)(text + len - from);
    out->rest_len = n;
    return KVF_OK;
}

kvf_status_t kvf_tokenizer__scan(char *text, size_t len, const char *path, kvf_tok_scan_t *out)
{
    *out = (kvf_tok_scan_t){0};
    scanner_t s = {.p = text, .end = text + len, .path = path, .start = text};
    span_t vocab = {0}, merges = {0};
    /* The spans are recorded before their strings are decoded in place;
     * the rest of the text is not modified. */
    kvf_status_t st = scan_root(&s, out, &vocab, &merges);
    if (st == KVF_OK)
        st = build_rest(text, len, vocab, merges, out);
    if (st != KVF_OK)
        kvf_tokenizer__scan_free(out);
    return st;
}

void kvf_tokenizer__scan_free(kvf_tok_scan_t *scan)
{
    free(scan->vocab);
    free(scan->merges);
    free(scan->rest);
    *scan = (kvf_tok_scan_t){0};
}
