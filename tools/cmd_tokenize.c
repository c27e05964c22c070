/* kvf tokenize: text -> ids (BOS per the tokenizer config), or ids -> text. */
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
    bool no_bos = false;
    const kvf_flag_t flags[] = {
        {"model", KVF_FLAG_STRING, &model_dir, "DIR", "model directory with tokenizer.json", NULL},
        {"text", KVF_FLAG_STRING, &text, "TEXT", "text to encode", NULL},
        {"decode", KVF_FLAG_STRING, &decode, "IDS", "comma-separated ids to decode instead", NULL},
        {"no-bos", KVF_FLAG_BOOL, &no_bos, NULL, "never prepend BOS", NULL},
    };
    kvf_flagset_t set = {
        .prog = argv[0],
        .usage = "--model DIR (--text TEXT | --decode 1,2,3)",
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
    if (!model_dir || (!text) == (!decode)) {
        fprintf(stderr, "%s: needs --model and one of --text or --decode (see --help)\n", argv[0]);
        return 2;
    }
    kvf_tokenizer_t *tok;
    kvf_status_t st = kvf_tokenizer_load(model_dir, &tok);
    if (st != KVF_OK) {
        fprintf(stderr, "%s: cannot load the tokenizer of %s: %s\n", argv[0], model_dir,
                kvf_status_str(st));
        return 1;
    }
    if (text) {
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
