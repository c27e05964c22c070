/* kvf tokenize: text -> ids (BOS per the tokenizer config), or ids -> text;
 * --jsonl: one JSON string a line on stdin -> one JSON id list a line. */
#include "commands.h"
#include "kvf/flags.h"
#include "kvf/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Prints text's ids, comma-separated. */
static kvf_status_t encode_text(const kvf_tokenizer_t *tok, const char *text, bool bos)
{
    uint32_t *ids;
    size_t n;
    kvf_status_t st = kvf_tokenizer_encode(tok, text, strlen(text), bos, &ids, &n);
    if (st != KVF_OK)
        return st;
    for (size_t i = 0; i < n; i++)
        printf("%s%u", i ? "," : "", ids[i]);
    printf("\n");
    free(ids);
    return KVF_OK;
}

/* ---- --jsonl ---------------------------------------------------------------- */

/* Appends code point cp as UTF-8 to out (room for 4 bytes). */
static size_t put_utf8(char *out, uint32_t cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Four hex digits at s; -1 when they are not. */
static long hex4(const char *s)
{
    long v = 0;
    for (int i = 0; i < 4; i++) {
        int c = s[i], d = c >= '0' && c <= '9'   ? c - '0'
                          : c >= 'a' && c <= 'f' ? c - 'a' + 10
                          : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                 : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* The escape at s (after the backslash) into out: bytes written, 0 when it
 * is not valid; *used_p: characters of s it took. */
static size_t json_escape(const char *s, char *out, size_t *used_p)
{
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    const char *k = *s ? strchr(from, *s) : NULL;
    if (k) {
        *out = to[k - from];
        *used_p = 1;
        return 1;
    }
    long cp = *s == 'u' ? hex4(s + 1) : -1;
    *used_p = 5;
    if (cp >= 0xd800 && cp < 0xdc00) { /* a surrogate pair */
        long lo = s[5] == '\\' && s[6] == 'u' ? hex4(s + 7) : -1;
        if (lo < 0xdc00 || lo > 0xdfff)
            return 0;
        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        *used_p = 11;
    } else if (cp >= 0xdc00 && cp <= 0xdfff) {
        return 0;
    }
    return cp < 0 ? 0 : put_utf8(out, (uint32_t)cp);
}

/* Decodes the JSON string literal that is line (white space around it
 * allowed) into out (as long as line), U+0000 included; false when it is
 * not one. */
static bool json_string(const char *line, char *out, size_t *len_p)
{
    const char *s = line + strspn(line, " \t\r\n");
    if (*s++ != '"')
        return false;
    size_t n = 0;
    for (;;) {
        unsigned char c = (unsigned char)*s;
        if (c == '"')
            break;
        if (c < 0x20)
            return false; /* the end of the line, or a raw control character */
        if (c != '\\') {
            out[n++] = (char)c;
            s++;
            continue;
        }
        size_t used, w = json_escape(s + 1, out + n, &used);
        if (!w)
            return false;
        n += w;
        s += 1 + used;
    }
    s++;
    if (s[strspn(s, " \t\r\n")] != '\0')
        return false;
    *len_p = n;
    return true;
}

/* Encodes every line of stdin (a JSON string) and prints its ids as a JSON
 * list, a line each; a line that is not a JSON string is an error. */
static kvf_status_t encode_jsonl(const char *prog, const kvf_tokenizer_t *tok, bool bos)
{
    char *line = NULL, *text = NULL;
    size_t cap = 0;
    ssize_t got;
    unsigned long lineno = 0;
    kvf_status_t st = KVF_OK;
    while (st == KVF_OK && (got = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        char *grown = realloc(text, (size_t)got + 1);
        if (!grown) {
            st = KVF_ERR_NOMEM;
            break;
        }
        text = grown;
        size_t len;
        if (!json_string(line, text, &len)) {
            fprintf(stderr, "%s: stdin line %lu is not a JSON string\n", prog, lineno);
            st = KVF_ERR_FORMAT;
            break;
        }
        uint32_t *ids;
        size_t n;
        st = kvf_tokenizer_encode(tok, text, len, bos, &ids, &n);
        if (st != KVF_OK)
            break;
        putchar('[');
        for (size_t i = 0; i < n; i++)
            printf("%s%u", i ? "," : "", ids[i]);
        printf("]\n");
        free(ids);
    }
    free(line);
    free(text);
    return st;
}

/* Prints the text of ids[0..n) (a warning for each id the vocabulary
 * lacks). */
static kvf_status_t decode_ids(const char *prog, const kvf_tokenizer_t *tok, const uint32_t *ids,
                               size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!kvf_tokenizer_has_id(tok, ids[i]))
            fprintf(stderr, "%s: warning: id %u is not in the tokenizer's vocabulary\n", prog,
                    ids[i]);
    char *out;
    size_t len;
    kvf_status_t st = kvf_tokenizer_decode(tok, ids, n, &out, &len);
    if (st != KVF_OK)
        return st;
    fwrite(out, 1, len, stdout);
    printf("\n");
    free(out);
    return KVF_OK;
}

int kvf_cmd_tokenize(int argc, char **argv)
{
    const char *model_dir = NULL, *text = NULL, *decode = NULL;
    bool no_bos = false, jsonl = false;
    const kvf_flag_t flags[] = {
        {"model", KVF_FLAG_STRING, &model_dir, "DIR", "model directory with tokenizer.json", NULL},
        {"text", KVF_FLAG_STRING, &text, "TEXT", "text to encode", NULL},
        {"decode", KVF_FLAG_STRING, &decode, "IDS", "comma-separated ids to decode instead", NULL},
        {"no-bos", KVF_FLAG_BOOL, &no_bos, NULL, "never prepend BOS", NULL},
        {"jsonl", KVF_FLAG_BOOL, &jsonl, NULL,
         "encode stdin: one JSON string a line in, one JSON list of ids a line out", NULL},
    };
    kvf_flagset_t set = {
        .prog = argv[0],
        .usage = "--model DIR (--text TEXT | --decode 1,2,3 | --jsonl < strings.jsonl)",
        .summary = "Encodes TEXT with the model's tokenizer and prints the ids comma-separated "
                   "(BOS first when tokenizer_config.json asks for it), or decodes ids to text.",
        .flags = flags,
        .n_flags = KVF_NFLAGS(flags),
    };
    int rc = kvf_flags_parse(&set, argc, argv);
    if (rc == KVF_FLAGS_EXIT)
        return 0;
    if (rc < 0)
        return 2;
    if (!model_dir || (text != NULL) + (decode != NULL) + jsonl != 1) {
        fprintf(stderr, "%s: needs --model and one of --text, --decode or --jsonl (see --help)\n",
                argv[0]);
        return 2;
    }
    kvf_tokenizer_t *tok;
    kvf_status_t st = kvf_tokenizer_load(model_dir, &tok);
    if (st != KVF_OK) {
        fprintf(stderr, "%s: cannot load the tokenizer of %s: %s\n", argv[0], model_dir,
                kvf_status_str(st));
        return 1;
    }
    if (jsonl) {
        st = encode_jsonl(argv[0], tok, !no_bos);
    } else if (text) {
        st = encode_text(tok, text, !no_bos);
    } else {
        uint32_t *ids;
        size_t n;
        if (kvf_parse_id_list(decode, &ids, &n) != KVF_OK) {
            fprintf(stderr, "%s: --decode: not a list of ids: %s\n", argv[0], decode);
            kvf_tokenizer_destroy(tok);
            return 2;
        }
        st = decode_ids(argv[0], tok, ids, n);
        free(ids);
    }
    if (st != KVF_OK)
        fprintf(stderr, "%s: %s\n", argv[0], kvf_status_str(st));
    kvf_tokenizer_destroy(tok);
    return st == KVF_OK ? 0 : 1;
}
