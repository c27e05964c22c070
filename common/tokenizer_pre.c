/* Pre-tokenizers (tokenizer_internal.h): tokenizer.json's "pre_tokenizer"
 * read into a flat list of steps, and the splitting of normalized text
 * into the pieces BPE works on. Each step splits every piece of the step
 * before; a step that rewrites its piece (Metaspace, ByteLevel's prefix
 * space) writes it into its own level of the scratch space, so the pieces
 * of one level stay valid while the levels below work.
 *
 * A Split finds the matches of its pattern, which with the text between
 * them cover the piece as alternating spans; invert swaps which spans
 * count as matches; the behavior then decides what becomes of the
 * matches (kvf_tok_split_behavior_t), as Hugging Face's
 * SplitDelimiterBehavior does. Empty spans are never pieces.
 *
 * Where Hugging Face's JS port and its Rust library differ, this follows
 * the Rust library, which the files are written for: the JS port treats
 * every behavior but Removed as Isolated, keeps only the matches of an
 * inverted Split, never splits in Metaspace and ignores its legacy
 * add_prefix_space field, and its Digits counts ASCII digits only (here,
 * as in Rust, every Unicode number). None of the seven families the
 * comparison covers depends on these. */
#include "tokenizer_internal.h"

#include "kvf/array.h"
#include "kvf/log.h"
#include "kvf/utf8.h"

#include <stdlib.h>
#include <string.h>

/* The GPT-2 pre-tokenizer, used by ByteLevel with use_regex. */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- loading ------------------------------------------------------------------ */

static kvf_status_t add_pre(kvf_tokenizer_t *tok, const char *path, const kvf_tok_pre_t *pre)
{
    if (tok->n_pres == KVF_TOK_MAX_PRE) {
        kvf_log_error("%s: more than %d pre-tokenizers", path, KVF_TOK_MAX_PRE);
        pcre2_code_free(pre->re);
        return KVF_ERR_UNSUPPORTED;
    }
    if (tok->byte_level) {
        /* the steps after ByteLevel would see its byte symbols */
        kvf_log_error("%s: pre-tokenizer after ByteLevel is not supported", path);
        pcre2_code_free(pre->re);
        return KVF_ERR_UNSUPPORTED;
    }
    tok->pres[tok->n_pres++] = *pre;
    return KVF_OK;
}

static kvf_status_t load_split(kvf_tokenizer_t *tok, const char *path, const cJSON *pre)
{
    static const struct {
        const char *name;
        kvf_tok_split_behavior_t behavior;
    } behaviors[] = {{"Isolated", KVF_TOK_SPLIT_ISOLATED},
                     {"Removed", KVF_TOK_SPLIT_REMOVED},
                     {"MergedWithPrevious", KVF_TOK_SPLIT_MERGED_PREV},
                     {"MergedWithNext", KVF_TOK_SPLIT_MERGED_NEXT},
                     {"Contiguous", KVF_TOK_SPLIT_CONTIGUOUS}};
    const cJSON *pattern = cJSON_GetObjectItemCaseSensitive(pre, "pattern");
    const cJSON *regex = cJSON_GetObjectItemCaseSensitive(pattern, "Regex");
    const cJSON *string = cJSON_GetObjectItemCaseSensitive(pattern, "String");
    const cJSON *behavior = cJSON_GetObjectItemCaseSensitive(pre, "behavior");
    kvf_tok_pre_t step = {.kind = KVF_TOK_PRE_SPLIT};
    size_t i = 0, n = sizeof(behaviors) / sizeof(behaviors[0]);
    while (i < n &&
           !(cJSON_IsString(behavior) && !strcmp(behavior->valuestring, behaviors[i].name)))
        i++;
    if (i == n) {
        kvf_log_error("%s: Split behavior '%s' is not supported", path,
                      cJSON_IsString(behavior) ? behavior->valuestring : "?");
        return KVF_ERR_UNSUPPORTED;
    }
    step.behavior = behaviors[i].behavior;
    step.invert = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pre, "invert"));
    const cJSON *pat = cJSON_IsString(regex) ? regex : string;
    if (!cJSON_IsString(pat)) {
        kvf_log_error("%s: Split without a Regex or String pattern", path);
        return KVF_ERR_FORMAT;
    }
    kvf_status_t st = kvf_tokenizer__compile(path, "pre-tokenizer", pat->valuestring,
                                             strlen(pat->valuestring), pat == string, &step.re);
    return st != KVF_OK ? st : add_pre(tok, path, &step);
}

static kvf_status_t load_byte_level(kvf_tokenizer_t *tok, const char *path, const cJSON *pre)
{
    kvf_tok_pre_t step = {.kind = KVF_TOK_PRE_BYTE_LEVEL, .behavior = KVF_TOK_SPLIT_ISOLATED};
    step.add_prefix_space = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pre, "add_prefix_space"));
    const cJSON *use_regex = cJSON_GetObjectItemCaseSensitive(pre, "use_regex");
    if (!use_regex || cJSON_IsTrue(use_regex)) {
        kvf_status_t st = kvf_tokenizer__compile(path, "pre-tokenizer", GPT2_PATTERN,
                                                 sizeof(GPT2_PATTERN) - 1, false, &step.re);
        if (st != KVF_OK)
            return st;
    }
    kvf_status_t st = add_pre(tok, path, &step);
    if (st == KVF_OK)
        tok->byte_level = true;
    return st;
}

static kvf_status_t load_metaspace(kvf_tokenizer_t *tok, const char *path, const cJSON *pre)
{
    kvf_tok_pre_t step = {.kind = KVF_TOK_PRE_METASPACE,
                          .behavior = KVF_TOK_SPLIT_MERGED_NEXT,
                          .prepend = KVF_TOK_PREPEND_ALWAYS};
    const cJSON *repl = cJSON_GetObjectItemCaseSensitive(pre, "replacement");
    const char *r = cJSON_IsString(repl) ? repl->valuestring : "\xe2\x96\x81"; /* U+2581 */
    size_t r_len = strlen(r);
    if (r_len == 0 || r_len > sizeof(step.replacement) ||
        kvf_utf8_next((const uint8_t *)r, r_len, NULL) != (int)r_len) {
        kvf_log_error("%s: Metaspace replacement is not one character", path);
        return KVF_ERR_FORMAT;
    }
    memcpy(step.replacement, r, r_len);
    step.replacement_len = (uint8_t)r_len;
    const cJSON *scheme = cJSON_GetObjectItemCaseSensitive(pre, "prepend_scheme");
    const cJSON *legacy = cJSON_GetObjectItemCaseSensitive(pre, "add_prefix_space");
    if (cJSON_IsString(scheme)) {
        if (!strcmp(scheme->valuestring, "first"))
            step.prepend = KVF_TOK_PREPEND_FIRST;
        else if (!strcmp(scheme->valuestring, "never"))
            step.prepend = KVF_TOK_PREPEND_NEVER;
        else if (strcmp(scheme->valuestring, "always")) {
            kvf_log_error("%s: Metaspace prepend_scheme '%s' is not supported", path,
                          scheme->valuestring);
            return KVF_ERR_UNSUPPORTED;
        }
    } else if (cJSON_IsBool(legacy)) {
        /* the field prepend_scheme replaced: true is "always" */
        step.prepend = cJSON_IsTrue(legacy) ? KVF_TOK_PREPEND_ALWAYS : KVF_TOK_PREPEND_NEVER;
    }
    const cJSON *split = cJSON_GetObjectItemCaseSensitive(pre, "split");
    if (!split || cJSON_IsTrue(split)) {
        kvf_status_t st = kvf_tokenizer__compile(path, "Metaspace", r, r_len, true, &step.re);
        if (st != KVF_OK)
            return st;
    }
    return add_pre(tok, path, &step);
}

static kvf_status_t load_digits(kvf_tokenizer_t *tok, const char *path, const cJSON *pre)
{
    /* Digits is a Split on numeric characters: one piece each, or runs */
    bool individual = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(pre, "individual_digits"));
    const char *pattern = individual ? "\\p{N}" : "\\p{N}+";
    kvf_tok_pre_t step = {.kind = KVF_TOK_PRE_SPLIT, .behavior = KVF_TOK_SPLIT_ISOLATED};
    kvf_status_t st =
        kvf_tokenizer__compile(path, "Digits", pattern, strlen(pattern), false, &step.re);
    return st != KVF_OK ? st : add_pre(tok, path, &step);
}

kvf_status_t kvf_tokenizer__load_pre_tokenizer(kvf_tokenizer_t *tok, const char *path,
                                               const cJSON *pre)
{
    if (!pre || cJSON_IsNull(pre))
        return KVF_OK;
    const char *type = kvf_tokenizer__json_type(pre);
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers");
        if (!cJSON_IsArray(list)) {
            kvf_log_error("%s: pre-tokenizer Sequence without a pretokenizers list", path);
            return KVF_ERR_FORMAT;
        }
        for (const cJSON *p = list->child; p; p = p->next) {
            kvf_status_t st = kvf_tokenizer__load_pre_tokenizer(tok, path, p);
            if (st != KVF_OK)
                return st;
        }
        return KVF_OK;
    }
    if (!strcmp(type, "ByteLevel"))
        return load_byte_level(tok, path, pre);
    if (!strcmp(type, "Split"))
        return load_split(tok, path, pre);
    if (!strcmp(type, "Metaspace"))
        return load_metaspace(tok, path, pre);
    if (!strcmp(type, "Digits"))
        return load_digits(tok, path, pre);
    kvf_log_error("%s: pre-tokenizer '%s' is not supported (ByteLevel, Split, Metaspace, "
                  "Digits, Sequence)",
                  path, type);
    return KVF_ERR_UNSUPPORTED;
}

void kvf_tokenizer__free_pre_tokenizer(kvf_tokenizer_t *tok)
{
    for (size_t i = 0; i < tok->n_pres; i++)
        pcre2_code_free(tok->pres[i].re);
    tok->n_pres = 0;
}

/* ---- splitting ---------------------------------------------------------------- */

static kvf_status_t pre_step(const kvf_tokenizer_t *tok, kvf_tok_pre_run_t *run, size_t step,
                             const uint8_t *s, size_t len, bool at_start, kvf_tok_piece_fn fn,
                             void *ctx);

/* Appends the piece [start, end) to the level's cuts. */
static kvf_status_t add_cut(kvf_tok_pre_level_t *lv, size_t *n_cuts, size_t start, size_t end)
{
    kvf_status_t st =
        kvf_array_reserve(&lv->cuts, &lv->cuts_cap, *n_cuts + 2, 32, sizeof(*lv->cuts));
    if (st != KVF_OK)
        return st;
    lv->cuts[(*n_cuts)++] = start;
    lv->cuts[(*n_cuts)++] = end;
    return KVF_OK;
}

/* Folds one span into the pieces by the behavior (SplitDelimiterBehavior's
 * rules: a match merges into its neighbour unless the neighbour is a
 * match too, and Contiguous joins runs of matches). MergedWithNext is
 * folded over the spans in reverse order by the caller. */
static kvf_status_t fold_span(kvf_tok_pre_level_t *lv, size_t *n_cuts, kvf_tok_split_behavior_t b,
                              size_t start, size_t end, bool match, bool *prev_match, bool reverse)
{
    bool merge = false;
    if (b == KVF_TOK_SPLIT_REMOVED && match)
        return KVF_OK;
    if (b == KVF_TOK_SPLIT_MERGED_PREV || b == KVF_TOK_SPLIT_MERGED_NEXT)
        merge = match && !*prev_match && *n_cuts > 0;
    else if (b == KVF_TOK_SPLIT_CONTIGUOUS)
        merge = match && *prev_match && *n_cuts > 0;
    *prev_match = match;
    if (!merge)
        return add_cut(lv, n_cuts, start, end);
    if (reverse)
        lv->cuts[*n_cuts - 2] = start;
    else
        lv->cuts[*n_cuts - 1] = end;
    return KVF_OK;
}

/* The next non-empty match of re in s[off..len): *ms_p, *me_p; false when
 * there is none. */
static kvf_status_t next_match(kvf_tok_pre_run_t *run, const pcre2_code *re, const uint8_t *s,
                               size_t len, size_t off, size_t *ms_p, size_t *me_p, bool *found_p)
{
    *found_p = false;
    while (off < len) {
        int rc = pcre2_match(re, s, len, off, PCRE2_NO_UTF_CHECK, run->md, run->mctx);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !run->jit_stack) {
            run->jit_stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
            run->mctx = pcre2_match_context_create(NULL);
            if (!run->jit_stack || !run->mctx)
                return KVF_ERR_NOMEM;
            pcre2_jit_stack_assign(run->mctx, NULL, run->jit_stack);
            continue;
        }
        if (rc == PCRE2_ERROR_NOMATCH)
            return KVF_OK;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof(msg));
            kvf_log_error("tokenizer: pre-tokenizer regex failed: %s", (const char *)msg);
            return KVF_ERR_INTERNAL;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(run->md);
        if (ov[1] > ov[0]) {
            *ms_p = ov[0];
            *me_p = ov[1];
            *found_p = true;
            return KVF_OK;
        }
        /* an empty match splits nothing: step one character */
        off = ov[0] + 1;
        while (off < len && (s[off] & 0xc0) == 0x80)
            off++;
    }
    return KVF_OK;
}

/* The spans of s as (start, end, is_match) triples into spans[0..*n_p). */
static kvf_status_t find_spans(kvf_tok_pre_run_t *run, const kvf_tok_pre_t *pre, const uint8_t *s,
                               size_t len, size_t **spans, size_t *cap, size_t *n_p)
{
    size_t n = 0, last = 0, ms, me;
    bool found;
    kvf_status_t st;
    for (size_t off = 0;; off = me) {
        if ((st = next_match(run, pre->re, s, len, off, &ms, &me, &found)) != KVF_OK)
            return st;
        if ((st = kvf_array_reserve(spans, cap, n + 6, 48, sizeof(**spans))) != KVF_OK)
            return st;
        if (!found)
            break;
        if (ms > last) {
            (*spans)[n++] = last, (*spans)[n++] = ms, (*spans)[n++] = pre->invert;
        }
        (*spans)[n++] = ms, (*spans)[n++] = me, (*spans)[n++] = !pre->invert;
        last = me;
    }
    if (last < len)
        (*spans)[n++] = last, (*spans)[n++] = len, (*spans)[n++] = pre->invert;
    *n_p = n;
    return KVF_OK;
}

/* Splits s by the step's pattern into the level's cuts. */
static kvf_status_t split_cuts(kvf_tok_pre_run_t *run, const kvf_tok_pre_t *pre,
                               kvf_tok_pre_level_t *lv, const uint8_t *s, size_t len,
                               size_t *n_cuts_p)
{
    size_t n_sp;
    kvf_status_t st = find_spans(run, pre, s, len, &lv->spans, &lv->spans_cap, &n_sp);
    const size_t *sp = lv->spans;
    *n_cuts_p = 0;
    bool prev_match = false;
    bool reverse = pre->behavior == KVF_TOK_SPLIT_MERGED_NEXT;
    for (size_t k = 0; k < n_sp && st == KVF_OK; k += 3) {
        size_t i = reverse ? n_sp - 3 - k : k;
        st = fold_span(lv, n_cuts_p, pre->behavior, sp[i], sp[i + 1], sp[i + 2] != 0, &prev_match,
                       reverse);
    }
    if (st == KVF_OK && reverse && *n_cuts_p >= 4) { /* the pieces were made back to front */
        for (size_t a = 0, b = *n_cuts_p - 2; a < b; a += 2, b -= 2) {
            size_t t0 = lv->cuts[a], t1 = lv->cuts[a + 1];
            lv->cuts[a] = lv->cuts[b];
            lv->cuts[a + 1] = lv->cuts[b + 1];
            lv->cuts[b] = t0;
            lv->cuts[b + 1] = t1;
        }
    }
    return st;
}

/* Metaspace's rewrite of s into the level's buffer: every space becomes
 * the replacement, which is put first as the prepend scheme says. */
static kvf_status_t metaspace(const kvf_tok_pre_t *pre, kvf_tok_pre_level_t *lv, const uint8_t *s,
                              size_t len, bool at_start, size_t *out_len_p)
{
    size_t spaces = 0;
    for (size_t i = 0; i < len; i++)
        spaces += s[i] == ' ';
    size_t rl = pre->replacement_len;
    size_t need = len + (spaces + 1) * rl;
    kvf_status_t st = kvf_array_reserve(&lv->buf, &lv->buf_cap, need + 1, 64, 1);
    if (st != KVF_OK)
        return st;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == ' ') {
            memcpy(lv->buf + n, pre->replacement, rl);
            n += rl;
        } else {
            lv->buf[n++] = s[i];
        }
    }
    bool starts = n >= rl && !memcmp(lv->buf, pre->replacement, rl);
    bool prepend = pre->prepend == KVF_TOK_PREPEND_ALWAYS ||
                   (pre->prepend == KVF_TOK_PREPEND_FIRST && at_start);
    if (prepend && !starts) {
        memmove(lv->buf + rl, lv->buf, n);
        memcpy(lv->buf, pre->replacement, rl);
        n += rl;
    }
    *out_len_p = n;
    return KVF_OK;
}

/* One step over one piece: rewrite, split, and hand each resulting piece
 * to the next step (or to fn after the last). */
static kvf_status_t pre_step(const kvf_tokenizer_t *tok, kvf_tok_pre_run_t *run, size_t step,
                             const uint8_t *s, size_t len, bool at_start, kvf_tok_piece_fn fn,
                             void *ctx)
{
    if (len == 0)
        return KVF_OK;
    if (step == tok->n_pres)
        return fn(ctx, s, len);
    const kvf_tok_pre_t *pre = &tok->pres[step];
    kvf_tok_pre_level_t *lv = &run->level[step];
    kvf_status_t st;
    if (pre->kind == KVF_TOK_PRE_METASPACE) {
        if ((st = metaspace(pre, lv, s, len, at_start, &len)) != KVF_OK)
            return st;
        s = lv->buf;
    } else if (pre->kind == KVF_TOK_PRE_BYTE_LEVEL && pre->add_prefix_space && s[0] != ' ') {
        if ((st = kvf_array_reserve(&lv->buf, &lv->buf_cap, len + 2, 64, 1)) != KVF_OK)
            return st;
        lv->buf[0] = ' ';
        memcpy(lv->buf + 1, s, len);
        s = lv->buf;
        len++;
    }
    if (!pre->re)
        return pre_step(tok, run, step + 1, s, len, at_start, fn, ctx);
    size_t n_cuts;
    if ((st = split_cuts(run, pre, lv, s, len, &n_cuts)) != KVF_OK)
        return st;
    /* the cuts of this level stay put while the deeper levels run */
    for (size_t i = 0; i < n_cuts; i += 2) {
        size_t a = lv->cuts[i], b = lv->cuts[i + 1];
        if ((st = pre_step(tok, run, step + 1, s + a, b - a, at_start && a == 0, fn, ctx)) !=
            KVF_OK)
            return st;
    }
    return KVF_OK;
}

kvf_status_t kvf_tokenizer__pre_tokenize(const kvf_tokenizer_t *tok, kvf_tok_pre_run_t *run,
                                         const uint8_t *s, size_t len, bool at_start,
                                         kvf_tok_piece_fn fn, void *ctx)
{
    if (tok->n_pres && !run->md) {
        /* only the whole match is read */
        run->md = pcre2_match_data_create(4, NULL);
        if (!run->md)
            return KVF_ERR_NOMEM;
    }
    return pre_step(tok, run, 0, s, len, at_start, fn, ctx);
}

void kvf_tokenizer__pre_run_fini(kvf_tok_pre_run_t *run)
{
    for (size_t i = 0; i < KVF_TOK_MAX_PRE; i++) {
        free(run->level[i].buf);
        free(run->level[i].cuts);
        free(run->level[i].spans);
    }
    pcre2_match_data_free(run->md);
    pcre2_match_context_free(run->mctx);
    pcre2_jit_stack_free(run->jit_stack);
}
