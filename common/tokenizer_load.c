/* Loading a tokenizer (kvf/tokenizer.h): tokenizer.json's model section
 * and pre-tokenizer, tokenizer_config.json's BOS/EOS. The vocabulary and
 * merges are read by tokenizer_vocab.c; layout in tokenizer_internal.h. */
#include "tokenizer_internal.h"

#include "kvf/file.h"
#include "kvf/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FILE_BYTES (512u << 20)

/* The GPT-2 pre-tokenizer, used by ByteLevel with use_regex. */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static const char *json_type(const cJSON *obj)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(obj, "type");
    return cJSON_IsString(t) ? t->valuestring : "";
}

/* ---- pre-tokenizer ---------------------------------------------------------- */

static kvf_status_t add_step(kvf_tokenizer_t *tok, const char *path, const char *pattern,
                             bool literal, kvf_tok_split_behavior_t behavior)
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
    kvf_tok_split_step_t *grown = realloc(tok->steps, (tok->n_steps + 1) * sizeof(*grown));
    if (!grown) {
        pcre2_code_free(re);
        return KVF_ERR_NOMEM;
    }
    tok->steps = grown;
    tok->steps[tok->n_steps++] = (kvf_tok_split_step_t){.re = re, .behavior = behavior};
    return KVF_OK;
}

/* A Split pre-tokenizer: a regex or literal, Isolated or Removed. */
static kvf_status_t load_split(kvf_tokenizer_t *tok, const char *path, const cJSON *pre)
{
    const cJSON *pattern = cJSON_GetObjectItemCaseSensitive(pre, "pattern");
    const cJSON *regex = cJSON_GetObjectItemCaseSensitive(pattern, "Regex");
    const cJSON *string = cJSON_GetObjectItemCaseSensitive(pattern, "String");
    const cJSON *behavior = cJSON_GetObjectItemCaseSensitive(pre, "behavior");
    kvf_tok_split_behavior_t b;
    if (cJSON_IsString(behavior) && !strcmp(behavior->valuestring, "Isolated")) {
        b = KVF_TOK_SPLIT_ISOLATED;
    } else if (cJSON_IsString(behavior) && !strcmp(behavior->valuestring, "Removed")) {
        b = KVF_TOK_SPLIT_REMOVED;
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
            return add_step(tok, path, GPT2_PATTERN, false, KVF_TOK_SPLIT_ISOLATED);
        return KVF_OK;
    }
    if (!strcmp(type, "Split"))
        return load_split(tok, path, pre);
    kvf_log_error("%s: pre-tokenizer '%s' is not supported (ByteLevel, Split, Sequence)", path,
                  type);
    return KVF_ERR_UNSUPPORTED;
}

/* ---- BOS and EOS ------------------------------------------------------------ */

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
    if (!cJSON_IsArray(ids) || cJSON_GetArraySize(ids) != 1 ||
        !kvf_tokenizer__json_id(ids->child, &id))
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

/* ---- tokenizer.json ---------------------------------------------------------- */

/* Refuses what this tokenizer does not implement: a model other than
 * byte-level BPE, BPE options it does not apply. */
static kvf_status_t check_model(const char *path, const cJSON *model, const cJSON *vocab,
                                const cJSON *merges, const cJSON *added)
{
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
    return KVF_OK;
}

static kvf_status_t parse_tokenizer_json(kvf_tokenizer_t *tok, const char *path, const cJSON *root,
                                         const kvf_tok_scan_t *scan)
{
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    kvf_status_t st = check_model(path, model, vocab, merges, added);
    if (st != KVF_OK)
        return st;
    if (!cJSON_IsArray(added))
        added = NULL;
    tok->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));
    st = kvf_tokenizer__load_vocab(tok, path, scan, added);
    if (st == KVF_OK)
        st = kvf_tokenizer__load_decoder(tok, path,
                                         cJSON_GetObjectItemCaseSensitive(root, "decoder"));
    if (st != KVF_OK)
        return st;
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
    /* model.vocab and model.merges are read from the text; cJSON parses the
     * rest (kvf_tokenizer__scan). text lives until the vocabulary is read. */
    kvf_tok_scan_t scan;
    st = kvf_tokenizer__scan(text, len, path, &scan);
    if (st != KVF_OK) {
        free(text);
        return st;
    }
    cJSON *root = cJSON_ParseWithLength(scan.rest, scan.rest_len);
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
    kvf_tokenizer__byte_mapping(tok);
    st = parse_tokenizer_json(tok, path, root, &scan);
    kvf_tokenizer__scan_free(&scan);
    free(text);
    text = NULL;
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
    kvf_tokenizer__scan_free(&scan);
    free(text);
    return st;
}

void kvf_tokenizer_destroy(kvf_tokenizer_t *tok)
{
    if (!tok)
        return;
    for (size_t i = 0; i < tok->n_steps; i++)
        pcre2_code_free(tok->steps[i].re);
    free(tok->steps);
    kvf_tokenizer__free_decoder(tok);
    kvf_tokenizer__free_vocab(tok);
    free(tok);
}
