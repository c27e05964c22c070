/* Loading a tokenizer (kvf/tokenizer.h): tokenizer.json's model section
 * and post-processor, tokenizer_config.json's BOS/EOS. The vocabulary and
 * merges are read by tokenizer_vocab.c, the normalizer by
 * tokenizer_norm.c, the pre-tokenizer by tokenizer_pre.c; layout in
 * tokenizer_internal.h. */
#include "tokenizer_internal.h"

#include "kvf/file.h"
#include "kvf/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FILE_BYTES (512u << 20)

const char *kvf_tokenizer__json_type(const cJSON *obj)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(obj, "type");
    return cJSON_IsString(t) ? t->valuestring : "";
}

kvf_status_t kvf_tokenizer__compile(const char *path, const char *what, const char *pattern,
                                    size_t len, bool literal, pcre2_code **re_p)
{
    /* With PCRE2_UCP, \s is Unicode white space (U+0085 and the Z
     * separators included) and \p{L}, \p{N} are the Unicode categories, as
     * in the Onig regexes the files were written for. */
    int err;
    PCRE2_SIZE err_off;
    /* PCRE2_LITERAL takes no UCP */
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, len, opts, &err, &err_off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof(msg));
        kvf_log_error("%s: %s regex does not compile at offset %zu: %s", path, what,
                      (size_t)err_off, (const char *)msg);
        return KVF_ERR_FORMAT;
    }
    /* JIT when this build of PCRE2 has it; the interpreter otherwise. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *re_p = re;
    return KVF_OK;
}

/* ---- BOS and EOS ------------------------------------------------------------ */

/* The ids one SpecialToken item of a template stands for: its entry in
 * special_tokens, or the token it names. Appended to tok->tmpl_ids. */
static kvf_status_t template_special(kvf_tokenizer_t *tok, const char *path, const cJSON *post,
                                     const cJSON *item)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(item, "id");
    if (!cJSON_IsString(name)) {
        kvf_log_error("%s: post_processor SpecialToken without an id", path);
        return KVF_ERR_FORMAT;
    }
    const cJSON *table = cJSON_GetObjectItemCaseSensitive(post, "special_tokens");
    const cJSON *entry = cJSON_GetObjectItemCaseSensitive(table, name->valuestring);
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(entry, "ids");
    size_t n = cJSON_IsArray(ids) ? (size_t)cJSON_GetArraySize(ids) : 1;
    uint32_t *grown =
        realloc(tok->tmpl_ids, (tok->n_tmpl_before + tok->n_tmpl_after + n + 1) * sizeof(*grown));
    if (!grown)
        return KVF_ERR_NOMEM;
    tok->tmpl_ids = grown;
    uint32_t *out = grown + tok->n_tmpl_before + tok->n_tmpl_after;
    if (!cJSON_IsArray(ids)) {
        if (kvf_tokenizer_token_id(tok, name->valuestring, out) != KVF_OK) {
            kvf_log_error("%s: post_processor token '%s' is not a token", path, name->valuestring);
            return KVF_ERR_FORMAT;
        }
    } else {
        size_t i = 0;
        for (const cJSON *id = ids->child; id; id = id->next, i++) {
            if (!kvf_tokenizer__json_id(id, &out[i]) || !kvf_tokenizer_has_id(tok, out[i])) {
                kvf_log_error("%s: post_processor token '%s' has a bad id", path,
                              name->valuestring);
                return KVF_ERR_FORMAT;
            }
        }
    }
    tok->n_tmpl_after += n; /* moved to before by the caller when $A is yet to come */
    return KVF_OK;
}

/* TemplateProcessing's single template: the special tokens before $A and
 * after it. */
static kvf_status_t load_template(kvf_tokenizer_t *tok, const char *path, const cJSON *post)
{
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(post, "single");
    if (!cJSON_IsArray(single)) {
        kvf_log_error("%s: TemplateProcessing without a single template", path);
        return KVF_ERR_FORMAT;
    }
    bool seen_a = false;
    for (const cJSON *item = single->child; item; item = item->next) {
        const cJSON *special = cJSON_GetObjectItemCaseSensitive(item, "SpecialToken");
        const cJSON *seq = cJSON_GetObjectItemCaseSensitive(item, "Sequence");
        if (special) {
            kvf_status_t st = template_special(tok, path, post, special);
            if (st != KVF_OK)
                return st;
            if (!seen_a) {
                tok->n_tmpl_before += tok->n_tmpl_after;
                tok->n_tmpl_after = 0;
            }
        } else if (seq) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(seq, "id");
            if (!cJSON_IsString(id) || strcmp(id->valuestring, "A") || seen_a) {
                kvf_log_error("%s: the single template may hold $A once, and no other sequence",
                              path);
                return KVF_ERR_UNSUPPORTED;
            }
            seen_a = true;
        } else {
            kvf_log_error("%s: a template item is neither SpecialToken nor Sequence", path);
            return KVF_ERR_FORMAT;
        }
    }
    return KVF_OK;
}

/* The post-processor: TemplateProcessing, ByteLevel (no change to the
 * ids), or a Sequence of them. */
static kvf_status_t load_post_processor(kvf_tokenizer_t *tok, const char *path, const cJSON *post)
{
    if (!post || cJSON_IsNull(post))
        return KVF_OK;
    const char *type = kvf_tokenizer__json_type(post);
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(post, "processors");
        if (!cJSON_IsArray(list)) {
            kvf_log_error("%s: post_processor Sequence without a processors list", path);
            return KVF_ERR_FORMAT;
        }
        for (const cJSON *p = list->child; p; p = p->next) {
            kvf_status_t st = load_post_processor(tok, path, p);
            if (st != KVF_OK)
                return st;
        }
        return KVF_OK;
    }
    if (!strcmp(type, "ByteLevel"))
        return KVF_OK;
    if (!strcmp(type, "TemplateProcessing")) {
        if (tok->n_tmpl_before || tok->n_tmpl_after) {
            kvf_log_error("%s: more than one TemplateProcessing", path);
            return KVF_ERR_UNSUPPORTED;
        }
        return load_template(tok, path, post);
    }
    kvf_log_error("%s: post_processor '%s' is not supported (TemplateProcessing, ByteLevel, "
                  "Sequence)",
                  path, type);
    return KVF_ERR_UNSUPPORTED;
}

/* tokenizer_config.json names tokens as a string or {"content": ...}. */
static const char *config_token(const cJSON *config, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(config, key);
    if (cJSON_IsObject(v))
        v = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static kvf_status_t load_config(kvf_tokenizer_t *tok, const char *dir)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    char *text;
    size_t len;
    /* BOS is the template's first token; encode adds what the template
     * says, as Hugging Face's JS tokenizers do (tokenizer_config.json's
     * add_bos_token / add_eos_token are not read there either) */
    tok->bos_id = tok->n_tmpl_before ? (int64_t)tok->tmpl_ids[0] : -1;
    tok->adds_bos = tok->n_tmpl_before > 0;
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
    if (cJSON_IsBool(add_bos) && cJSON_IsTrue(add_bos) != tok->adds_bos)
        kvf_log_debug("%s: add_bos_token is %s, the post_processor's template decides", path,
                      cJSON_IsTrue(add_bos) ? "true" : "false");
    cJSON_Delete(config);
    return KVF_OK;
}

/* ---- tokenizer.json ---------------------------------------------------------- */

/* A BPE affix: absent, null and "" do nothing; any other is refused. */
static bool affix_ok(const char *path, const cJSON *model, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(model, key);
    if (!v || cJSON_IsNull(v) || (cJSON_IsString(v) && !v->valuestring[0]))
        return true;
    kvf_log_error("%s: BPE %s '%s' is not supported (only an empty one)", path, key,
                  cJSON_IsString(v) ? v->valuestring : "?");
    return false;
}

/* Refuses what this tokenizer does not implement: a model other than BPE,
 * BPE options it does not apply. */
static kvf_status_t check_model(const char *path, const cJSON *model, const cJSON *vocab,
                                const cJSON *merges, const cJSON *added)
{
    const char *type = kvf_tokenizer__json_type(model);
    if (!cJSON_IsObject(model) || (type[0] && strcmp(type, "BPE"))) {
        kvf_log_error("%s: model '%s' is not supported (BPE only)", path, type);
        return KVF_ERR_UNSUPPORTED;
    }
    if (!cJSON_IsObject(vocab) || (merges && !cJSON_IsArray(merges)) ||
        (added && !cJSON_IsArray(added) && !cJSON_IsNull(added))) {
        kvf_log_error("%s: model.vocab, model.merges or added_tokens malformed", path);
        return KVF_ERR_FORMAT;
    }
    if (!affix_ok(path, model, "continuing_subword_prefix") ||
        !affix_ok(path, model, "end_of_word_suffix"))
        return KVF_ERR_UNSUPPORTED;
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(dropout) && dropout->valuedouble > 0) {
        kvf_log_error("%s: BPE dropout is not supported", path);
        return KVF_ERR_UNSUPPORTED;
    }
    return KVF_OK;
}

/* byte_fallback's <0xNN> tokens and the unknown token. */
static void load_model_options(kvf_tokenizer_t *tok, const char *path, const cJSON *model)
{
    tok->byte_fallback = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback"));
    tok->fuse_unk = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "fuse_unk"));
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof(name), "<0x%02X>", b);
        tok->fallback_id[b] = kvf_tokenizer__vocab_find(tok, name, 6);
    }
    tok->unk_id = KVF_TOK_NO_ID;
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    uint32_t id;
    if (cJSON_IsString(unk) && kvf_tokenizer_token_id(tok, unk->valuestring, &id) == KVF_OK)
        tok->unk_id = id;
    else if (cJSON_IsString(unk))
        kvf_log_warn("%s: unk_token '%s' is not a token", path, unk->valuestring);
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
    /* the normalizers first: the normalized added tokens are matched in
     * their normalized form */
    st = kvf_tokenizer__load_normalizer(tok, path,
                                        cJSON_GetObjectItemCaseSensitive(root, "normalizer"));
    if (st != KVF_OK)
        return st;
    st = kvf_tokenizer__load_pre_tokenizer(tok, path,
                                           cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"));
    if (st != KVF_OK)
        return st;
    st = kvf_tokenizer__load_vocab(tok, path, scan, added);
    if (st == KVF_OK)
        st = kvf_tokenizer__load_decoder(tok, path,
                                         cJSON_GetObjectItemCaseSensitive(root, "decoder"));
    if (st != KVF_OK)
        return st;
    load_model_options(tok, path, model);
    return load_post_processor(tok, path, cJSON_GetObjectItemCaseSensitive(root, "post_processor"));
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
    st = load_config(tok, model_dir);
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
    kvf_tokenizer__free_decoder(tok);
    kvf_tokenizer__free_pre_tokenizer(tok);
    kvf_tokenizer__free_normalizer(tok);
    free(tok->tmpl_ids);
    free(tok->added_norm_text);
    kvf_tokenizer__free_vocab(tok);
    free(tok);
}
