/* kvf tokenize: text -> ids (BOS per the tokenizer config), or ids -> text;
 * --jsonl: one JSON string a line on stdin -> one JSON id list a line;
 * --decode --jsonl: one JSON id list a line on stdin -> one JSON string a
 * line (tests/integration/tokenizer_ref.sh compares both with Hugging
 * Face's). */
#include "commands.h"
#include "kvf/flags.h"
#include "kvf/tokenizer.h"
#include "kvf/utf8.h"

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
    return cp < 0 ? 0 : kvf_utf8_encode((uint32_t)cp, (uint8_t *)out);
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
        if (st != KVF_OK) {
            fprintf(stderr, "%s: stdin line %lu: %s\n", prog, lineno, kvf_status_str(st));
            break;
        }
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

/* A warning on stderr for each of ids[0..n) the vocabulary lacks. */
static void warn_unknown(const char *prog, const kvf_tokenizer_t *tok, const uint32_t *ids,
                         size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!kvf_tokenizer_has_id(tok, ids[i]))
            fprintf(stderr, "%s: warning: id %u is not in the tokenizer's vocabulary\n", prog,
                    ids[i]);
}

/* ---- --decode --jsonl --------------------------------------------------------- */

/* Parses line, a JSON list of ids ("[1, 2,3]", "[]"; white space around
 * allowed), into ids (room for as many as line has characters); false when
 * it is not one or an id does not fit 32 bits. */
static bool json_id_list(const char *line, uint32_t *ids, size_t *n_p)
{
    const char *s = line + strspn(line, " \t\r\n");
    if (*s++ != '[')
        return false;
    size_t n = 0;
    s += strspn(s, " \t\r\n");
    if (*s != ']') {
        for (;;) {
            if (*s < '0' || *s > '9' || (s[0] == '0' && s[1] >= '0' && s[1] <= '9'))
                return false;
            uint64_t v = 0;
            while (*s >= '0' && *s <= '9') {
                v = v * 10 + (uint64_t)(*s++ - '0');
                if (v > UINT32_MAX)
                    return false;
            }
            ids[n++] = (uint32_t)v;
            s += strspn(s, " \t\r\n");
            if (*s == ']')
                break;
            if (*s++ != ',')
                return false;
            s += strspn(s, " \t\r\n");
        }
    }
    s++;
    if (s[strspn(s, " \t\r\n")] != '\0')
        return false;
    *n_p = n;
    return true;
}

/* Prints text[0..len) (UTF-8, U+0000 allowed) as a JSON string literal:
 * '"' and '\\' escaped, control characters as \uXXXX, the rest as is. */
static void put_json_string(const char *text, size_t len)
{
    putchar('"');
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    printf("\"\n");
}

/* Decodes every line of stdin (a JSON list of ids) and prints its text as
 * a JSON string, a line each; a line that is not a list of ids is an
 * error. */
static kvf_status_t decode_jsonl(const char *prog, const kvf_tokenizer_t *tok)
{
    char *line = NULL;
    uint32_t *ids = NULL;
    size_t cap = 0;
    ssize_t got;
    unsigned long lineno = 0;
    kvf_status_t st = KVF_OK;
    while (st == KVF_OK && (got = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        uint32_t *grown = realloc(ids, ((size_t)got + 1) * sizeof(*ids));
        if (!grown) {
            st = KVF_ERR_NOMEM;
            break;
        }
        ids = grown;
        size_t n;
        if (!json_id_list(line, ids, &n)) {
            fprintf(stderr, "%s: stdin line %lu is not a JSON list of ids\n", prog, lineno);
            st = KVF_ERR_FORMAT;
            break;
        }
        warn_unknown(prog, tok, ids, n);
        char *text;
        size_t len;
        st = kvf_tokenizer_decode(tok, ids, n, &text, &len);
        if (st != KVF_OK) {
            fprintf(stderr, "%s: stdin line %lu: %s\n", prog, lineno, kvf_status_str(st));
            break;
        }
        put_json_string(text, len);
        free(text);
    }
    free(line);
    free(ids);
    return st;
}

/* Prints the text of ids[0..n) (a warning for each id the vocabulary
 * lacks). */
static kvf_status_t decode_ids(const char *prog, const kvf_tokenizer_t *tok, const uint32_t *ids,
                               size_t n)
{
    warn_unknown(prog, tok, ids, n);
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

/* Copies argv into args without each "--decode" that has no value after it
 * (the last argument, or followed by another option): "--decode --jsonl"
 * decodes stdin. Returns the new argc; *bare_p: whether one was dropped. */
static int drop_bare_decode(int argc, char **argv, char **args, bool *bare_p)
{
    int n = 0;
    *bare_p = false;
    for (int i = 0; i < argc; i++) {
        if (i > 0 && !strcmp(argv[i], "--decode") &&
            (i + 1 == argc || !strncmp(argv[i + 1], "--", 2))) {
            *bare_p = true;
            continue;
        }
        args[n++] = argv[i];
    }
    args[n] = NULL;
    return n;
}

/* Runs the mode the flags chose on a loaded tokenizer; 0, 1 (failed) or 2
 * (bad ids on the command line). */
static int run_mode(const char *prog, const kvf_tokenizer_t *tok, const char *text,
                    const char *decode, bool decode_stdin, bool jsonl, bool no_bos)
{
    kvf_status_t st;
    if (jsonl && decode_stdin) {
        st = decode_jsonl(prog, tok);
    } else if (jsonl) {
        st = encode_jsonl(prog, tok, !no_bos);
    } else if (text) {
        st = encode_text(tok, text, !no_bos);
    } else {
        uint32_t *ids;
        size_t n;
        if (kvf_parse_id_list(decode, &ids, &n) != KVF_OK) {
            fprintf(stderr, "%s: --decode: not a list of ids: %s\n", prog, decode);
            return 2;
        }
        st = decode_ids(prog, tok, ids, n);
        free(ids);
    }
    if (st != KVF_OK)
        fprintf(stderr, "%s: %s\n", prog, kvf_status_str(st));
    return st == KVF_OK ? 0 : 1;
}

int kvf_cmd_tokenize(int argc, char **argv)
{
    const char *model_dir = NULL, *text = NULL, *decode = NULL;
    bool no_bos = false, jsonl = false, decode_stdin;
    const kvf_flag_t flags[] = {
        {"model", KVF_FLAG_STRING, &model_dir, "DIR", "model directory with tokenizer.json", NULL},
        {"text", KVF_FLAG_STRING, &text, "TEXT", "text to encode", NULL},
        {"decode", KVF_FLAG_STRING, &decode, "IDS",
         "comma-separated ids to decode instead; with --jsonl and no IDS, decode stdin", NULL},
        {"no-bos", KVF_FLAG_BOOL, &no_bos, NULL, "add no special tokens (no BOS)", NULL},
        {"jsonl", KVF_FLAG_BOOL, &jsonl, NULL,
         "encode stdin: one JSON string a line in, one JSON list of ids a line out "
         "(with --decode: lists in, strings out)",
         NULL},
    };
    kvf_flagset_t set = {
        .prog = argv[0],
        .usage = "--model DIR (--text TEXT | --decode 1,2,3 | --jsonl < strings.jsonl | "
                 "--decode --jsonl < id-lists.jsonl)",
        .summary = "Encodes TEXT with the model's tokenizer and prints the ids comma-separated "
                   "(BOS first when tokenizer_config.json asks for it), or decodes ids to text.",
        .flags = flags,
        .n_flags = KVF_NFLAGS(flags),
    };
    char **args = malloc(((size_t)argc + 1) * sizeof(*args));
    if (!args)
        return 1;
    int rc = kvf_flags_parse(&set, drop_bare_decode(argc, argv, args, &decode_stdin), args);
    free(args);
    if (rc == KVF_FLAGS_EXIT)
        return 0;
    if (rc < 0)
        return 2;
    if (!model_dir || (text != NULL) + (decode != NULL) + (jsonl || decode_stdin) != 1 ||
        (decode_stdin && !jsonl)) {
        fprintf(stderr,
                "%s: needs --model and one of --text, --decode IDS, --jsonl or --decode --jsonl "
                "(see --help)\n",
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
    rc = run_mode(argv[0], tok, text, decode, decode_stdin, jsonl, no_bos);
    kvf_tokenizer_destroy(tok);
    return rc;
}
