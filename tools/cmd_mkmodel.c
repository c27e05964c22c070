/* kvf mkmodel: writes a random-weight Hugging Face model directory.
 *
 * Weights, config.json and generation_config.json come from the engine's
 * kvf_model_write_random(); this file adds the tokenizer. The tokenizer is
 * the project's byte-level BPE (tools/data/byte_bpe_512, compiled in),
 * fitted to --vocab:
 *
 *   vocab == 512   unchanged: ids 0..255 bytes, 256..509 merges,
 *                  510 <|begin_of_text|> (BOS), 511 <|end_of_text|> (EOS).
 *   vocab  > 512   ids 0..511 unchanged; ids 512..vocab-1 are extra merges
 *                  appended after the shipped ones (lowest priority), each
 *                  joining two existing tokens into a new string, so every id
 *                  is a real vocabulary entry that encodes and decodes.
 *   258 <= vocab < 512
 *                  the first vocab-2 ids are kept (bytes, then the merges
 *                  whose result is kept), BOS = vocab-2, EOS = vocab-1.
 *
 * So BOS and EOS always sit at valid ids below vocab, and every id below
 * vocab decodes to non-empty text.
 *
 * With --tokenizer DIR the model gets a published tokenizer instead:
 * DIR's tokenizer.json and tokenizer_config.json (its chat_template with
 * it) are copied byte for byte, the vocabulary covers every id the
 * tokenizer knows (kvf_tokenizer_vocab_size; a larger --vocab pads the
 * embedding as real checkpoints do), and BOS / EOS are the tokenizer's
 * (no BOS where it has none, as in Qwen's configs). */
#include "commands.h"
#include "kvf/dtype.h"
#include "kvf/file.h"
#include "kvf/flags.h"
#include "kvf/hashmap.h"
#include "kvf/log.h"
#include "kvf/model.h"
#include "kvf/tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

extern const unsigned char kvf_mkmodel_tokenizer_json[];
extern const size_t kvf_mkmodel_tokenizer_json_len;

#define MIN_VOCAB 258 /* 256 byte symbols + BOS + EOS */
#define MAX_VOCAB (1 << 22)
#define BOS_TEXT  "<|begin_of_text|>"
#define EOS_TEXT  "<|end_of_text|>"

/* ---- tokenizer.json ---------------------------------------------------- */

/* Token string of every vocabulary id below n (NULL where absent); the
 * strings are owned by vocab. *by_id_p is malloc'd, owned by the caller. */
static kvf_status_t strings_by_id(const cJSON *vocab, size_t n, const char ***by_id_p)
{
    const char **by_id = calloc(n, sizeof(*by_id));
    if (!by_id)
        return KVF_ERR_NOMEM;
    for (const cJSON *v = vocab->child; v; v = v->next)
        if (cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < (double)n)
            by_id[(size_t)v->valuedouble] = v->string;
    *by_id_p = by_id;
    return KVF_OK;
}

static int vocab_id(const cJSON *vocab, const char *text, size_t len)
{
    for (const cJSON *v = vocab->child; v; v = v->next)
        if (strlen(v->string) == len && !memcmp(v->string, text, len))
            return v->valueint;
    return -1;
}

/* Keeps ids below keep: drops the other vocabulary entries and every merge
 * that uses or makes one. */
static void truncate_vocab(cJSON *vocab, cJSON *merges, int keep)
{
    cJSON *v = vocab->child;
    while (v) {
        cJSON *next = v->next;
        if (v->valueint >= keep)
            cJSON_Delete(cJSON_DetachItemViaPointer(vocab, v));
        v = next;
    }
    cJSON *m = merges->child;
    while (m) {
        cJSON *next = m->next;
        const char *s = m->valuestring;
        const char *sp = strchr(s, ' ');
        char joined[256];
        size_t left = sp ? (size_t)(sp - s) : 0, right = sp ? strlen(sp + 1) : 0;
        bool drop = !sp || left + right >= sizeof(joined);
        if (!drop) {
            memcpy(joined, s, left);
            memcpy(joined + left, sp + 1, right);
            drop = vocab_id(vocab, s, left) < 0 || vocab_id(vocab, sp + 1, right) < 0 ||
                   vocab_id(vocab, joined, left + right) < 0;
        }
        if (drop)
            cJSON_Delete(cJSON_DetachItemViaPointer(merges, m));
        m = next;
    }
}

/* Appends n_new merges of two existing tokens each, ids first_id onward. */
static kvf_status_t extend_vocab(cJSON *vocab, cJSON *merges, int base, int first_id, int n_new)
{
    kvf_status_t st = KVF_ERR_NOMEM;
    size_t n_all = (size_t)base + (size_t)n_new;
    const char **by_id = NULL;
    char **owned = calloc((size_t)n_new + 1, sizeof(*owned));
    /* every token string, to pick only new ones */
    kvf_strset_t set;
    kvf_status_t set_st = kvf_strset_init(&set, n_all);
    /* the order tokens are combined in: the shipped merges (word pieces)
     * first, then the byte symbols, then the new tokens themselves */
    const char **order = calloc(n_all, sizeof(*order));
    if (!owned || set_st != KVF_OK || !order ||
        strings_by_id(vocab, (size_t)base, &by_id) != KVF_OK)
        goto fail_extend;
    size_t n_order = 0;
    for (int id = 256; id < base; id++)
        if (by_id[id])
            order[n_order++] = by_id[id];
    for (int id = 0; id < 256 && id < base; id++)
        if (by_id[id])
            order[n_order++] = by_id[id];
    size_t n_base = n_order;
    for (size_t i = 0; i < n_base; i++)
        if (kvf_strset_add(&set, order[i], NULL) != KVF_OK)
            goto fail_extend;
    int made = 0;
    char merge_text[1024];
    for (size_t a = 0; a < n_order && made < n_new; a++) {
        for (size_t b = 0; b < n_base && made < n_new; b++) {
            size_t la = strlen(order[a]), lb = strlen(order[b]);
            if (la + lb + 2 > sizeof(merge_text))
                continue;
            memcpy(merge_text, order[a], la);
            memcpy(merge_text + la, order[b], lb + 1);
            if (kvf_strset_has(&set, merge_text))
                continue;
            char *joined = strdup(merge_text);
            if (!joined)
                goto fail_extend;
            owned[made] = joined;
            if (kvf_strset_add(&set, joined, NULL) != KVF_OK)
                goto fail_extend;
            order[n_order++] = joined;
            snprintf(merge_text, sizeof(merge_text), "%s %s", order[a], order[b]);
            if (!cJSON_AddNumberToObject(vocab, joined, first_id + made) ||
                !cJSON_AddItemToArray(merges, cJSON_CreateString(merge_text)))
                goto fail_extend;
            made++;
        }
    }
    st = made == n_new ? KVF_OK : KVF_ERR_INTERNAL;
fail_extend:
    for (int i = 0; owned && i < n_new; i++)
        free(owned[i]);
    free(owned);
    free(order);
    free(by_id);
    kvf_strset_fini(&set);
    return st;
}

/* Builds tokenizer.json for vocab ids; *root_p is owned by the caller
 * (cJSON_Delete). */
static kvf_status_t build_tokenizer(int vocab_size, cJSON **root_p, int *bos_p, int *eos_p)
{
    cJSON *root = cJSON_ParseWithLength((const char *)kvf_mkmodel_tokenizer_json,
                                        kvf_mkmodel_tokenizer_json_len);
    cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges) || !cJSON_IsArray(added)) {
        kvf_log_error("mkmodel: the built-in tokenizer does not parse");
        cJSON_Delete(root);
        return KVF_ERR_INTERNAL;
    }
    int base = cJSON_GetArraySize(vocab); /* 510: bytes and merges */
    int bos, eos;
    kvf_status_t st = KVF_OK;
    if (vocab_size < base + 2) {
        truncate_vocab(vocab, merges, vocab_size - 2);
        bos = vocab_size - 2;
        eos = vocab_size - 1;
    } else {
        bos = base;
        eos = base + 1;
        st = extend_vocab(vocab, merges, base, base + 2, vocab_size - base - 2);
    }
    if (st != KVF_OK) {
        cJSON_Delete(root);
        return st;
    }
    for (cJSON *a = added->child; a; a = a->next) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(a, "content");
        cJSON *id = cJSON_GetObjectItemCaseSensitive(a, "id");
        if (cJSON_IsString(content) && cJSON_IsNumber(id))
            cJSON_SetNumberValue(id, !strcmp(content->valuestring, BOS_TEXT) ? bos : eos);
    }
    /* the post_processor template names BOS by id too */
    cJSON *post = cJSON_GetObjectItemCaseSensitive(root, "post_processor");
    cJSON *special = cJSON_GetObjectItemCaseSensitive(post, "special_tokens");
    cJSON *entry = cJSON_GetObjectItemCaseSensitive(special, BOS_TEXT);
    cJSON *ids = cJSON_GetObjectItemCaseSensitive(entry, "ids");
    if (cJSON_IsArray(ids) && cJSON_IsNumber(ids->child))
        cJSON_SetNumberValue(ids->child, bos);
    *root_p = root;
    *bos_p = bos;
    *eos_p = eos;
    return KVF_OK;
}

static kvf_status_t write_json(const char *dir, const char *name, const cJSON *root)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    char *text = cJSON_Print(root);
    if (!text)
        return KVF_ERR_NOMEM;
    kvf_status_t st = KVF_OK;
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fputc('\n', f) == EOF) {
        kvf_log_error("%s: cannot write: %s", path, strerror(errno));
        st = KVF_ERR_IO;
    }
    if (f && fclose(f) != 0 && st == KVF_OK) {
        kvf_log_error("%s: cannot write: %s", path, strerror(errno));
        st = KVF_ERR_IO;
    }
    free(text);
    return st;
}

static kvf_status_t write_tokenizer_config(const char *dir, int bos, int eos, int max_pos)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddBoolToObject(root, "add_bos_token", true);
    cJSON_AddBoolToObject(root, "add_eos_token", false);
    cJSON_AddStringToObject(root, "bos_token", BOS_TEXT);
    cJSON_AddStringToObject(root, "eos_token", EOS_TEXT);
    cJSON_AddBoolToObject(root, "clean_up_tokenization_spaces", false);
    cJSON_AddNumberToObject(root, "model_max_length", max_pos);
    cJSON_AddStringToObject(root, "tokenizer_class", "PreTrainedTokenizerFast");
    cJSON *decoder = cJSON_AddObjectToObject(root, "added_tokens_decoder");
    for (int i = 0; i < 2; i++) {
        char key[16];
        snprintf(key, sizeof(key), "%d", i ? eos : bos);
        cJSON *t = cJSON_AddObjectToObject(decoder, key);
        cJSON_AddStringToObject(t, "content", i ? EOS_TEXT : BOS_TEXT);
        cJSON_AddBoolToObject(t, "single_word", false);
        cJSON_AddBoolToObject(t, "lstrip", false);
        cJSON_AddBoolToObject(t, "rstrip", false);
        cJSON_AddBoolToObject(t, "normalized", false);
        cJSON_AddBoolToObject(t, "special", true);
    }
    kvf_status_t st = write_json(dir, "tokenizer_config.json", root);
    cJSON_Delete(root);
    return st;
}

/* mkdir -p */
static kvf_status_t make_dirs(const char *dir)
{
    char path[4096];
    if (snprintf(path, sizeof(path), "%s", dir) >= (int)sizeof(path))
        return KVF_ERR_INVAL;
    for (char *p = path + 1;; p++) {
        bool end = *p == '\0';
        if (*p == '/' || end) {
            *p = '\0';
            if (mkdir(path, 0755) != 0 && errno != EEXIST) {
                kvf_log_error("%s: cannot create: %s", path, strerror(errno));
                return kvf_status_from_errno(errno);
            }
            if (end)
                break;
            *p = '/';
        }
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        kvf_log_error("%s: not a directory", dir);
        return KVF_ERR_INVAL;
    }
    return KVF_OK;
}

/* What the command line asks for. */
typedef struct {
    const char *dir;
    const char *arch, *dtype_name;
    const char *tokenizer_dir; /* --tokenizer: a published tokenizer's directory, or NULL */
    bool qwen2, tie, theta_seen, eps_seen, vocab_seen, trained_like;
    int layers, hidden, heads, kv_heads, inter, vocab, max_pos, head_dim;
    int sliding_window, window_layers;
    double rope_theta, rms_eps;
    double query_scalar, attn_softcap, final_softcap; /* gemma2 */
    uint64_t seed;
} mkmodel_opts_t;

/* Parses the flags into *o (defaults first). Returns -1 to go on, else
 * the command's exit code (0 after --help, 2 for a bad command line). */
static int parse_opts(int argc, char **argv, mkmodel_opts_t *o)
{
    *o = (mkmodel_opts_t){.arch = "llama",
                          .dtype_name = "f32",
                          .layers = 4,
                          .hidden = 256,
                          .heads = 4,
                          .kv_heads = 2,
                          .inter = 688,
                          .vocab = 512,
                          .max_pos = 4096,
                          .rope_theta = 10000.0,
                          .rms_eps = 1e-5,
                          .query_scalar = 256,
                          .attn_softcap = 5,
                          .final_softcap = 10};
    const kvf_flag_t flags[] = {
        {"arch", KVF_FLAG_STRING, &o->arch, "llama|mistral|qwen2|qwen3|gemma2", "architecture",
         NULL},
        {"qwen2", KVF_FLAG_BOOL, &o->qwen2, NULL, "same as --arch qwen2", NULL},
        {"layers", KVF_FLAG_INT, &o->layers, "N", "decoder layers", NULL},
        {"hidden", KVF_FLAG_INT, &o->hidden, "N", "hidden size", NULL},
        {"heads", KVF_FLAG_INT, &o->heads, "N", "attention heads", NULL},
        {"kv-heads", KVF_FLAG_INT, &o->kv_heads, "N", "key/value heads (GQA; = heads for MHA)",
         NULL},
        {"head-dim", KVF_FLAG_INT, &o->head_dim, "N", "head dimension (0: hidden / heads)", NULL},
        {"inter", KVF_FLAG_INT, &o->inter, "N", "MLP intermediate size", NULL},
        {"vocab", KVF_FLAG_INT, &o->vocab, "N",
         "vocabulary size (at least 258; with --tokenizer: at least the tokenizer's)",
         &o->vocab_seen},
        {"tokenizer", KVF_FLAG_STRING, &o->tokenizer_dir, "DIR",
         "copy DIR's tokenizer.json and tokenizer_config.json; vocab size, BOS and EOS from them",
         NULL},
        {"max-pos", KVF_FLAG_INT, &o->max_pos, "N", "max_position_embeddings", NULL},
        {"dtype", KVF_FLAG_STRING, &o->dtype_name, "f32|bf16|f16", "weight type", NULL},
        {"tie", KVF_FLAG_BOOL, &o->tie, NULL, "tie lm_head to the embedding", NULL},
        {"sliding-window", KVF_FLAG_INT, &o->sliding_window, "N",
         "sliding-window attention over the last N positions (mistral, qwen2, qwen3; gemma2 on "
         "layers 0, 2, 4, ...; 0: none)",
         NULL},
        {"window-layers", KVF_FLAG_INT, &o->window_layers, "N",
         "qwen2/qwen3 max_window_layers: the window applies from layer N on (default 0)", NULL},
        {"rope-theta", KVF_FLAG_DOUBLE, &o->rope_theta, "T",
         "RoPE base (qwen2/qwen3 default: 1000000)",
         &o->theta_seen},
        {"rms-eps", KVF_FLAG_DOUBLE, &o->rms_eps, "E", "RMSNorm epsilon (qwen2/qwen3 default: 1e-6)",
         &o->eps_seen},
        {"query-scalar", KVF_FLAG_DOUBLE, &o->query_scalar, "S",
         "gemma2 query_pre_attn_scalar: scores scaled by S^-1/2 (default 256)", NULL},
        {"attn-softcap", KVF_FLAG_DOUBLE, &o->attn_softcap, "C",
         "gemma2 attn_logit_softcapping (default 5, small enough to bite; 0: none)", NULL},
        {"final-softcap", KVF_FLAG_DOUBLE, &o->final_softcap, "C",
         "gemma2 final_logit_softcapping (default 10: random tied embeddings give logits "
         "near 40, which a cap of 3 would flatten into ties; 0: none)",
         NULL},
        {"seed", KVF_FLAG_UINT64, &o->seed, "S", "random seed (same seed, same weights)", NULL},
        {"trained-like", KVF_FLAG_BOOL, &o->trained_like, NULL,
         "weight statistics closer to a trained model's: heavy-tailed matrices, a few large K "
         "channels per kv head (x8, x4), V channels of unequal scale (for KV cache accuracy "
         "measurements)",
         NULL},
    };
    const char *positional[1] = {NULL};
    kvf_flagset_t set = {
        .prog = argv[0],
        .usage = "OUTDIR [options]",
        .summary = "Writes a random-weight Hugging Face model directory (config.json, "
                   "model.safetensors, tokenizer.json, tokenizer_config.json, "
                   "generation_config.json) for tests, demos and benchmarks. The tokenizer is "
                   "the project's byte-level BPE, extended with extra merges or truncated to "
                   "--vocab; BOS and EOS are ids 510 and 511, or vocab-2 and vocab-1 when "
                   "vocab < 512. With --tokenizer DIR, DIR's published tokenizer instead, the "
                   "vocabulary covering all its ids and BOS / EOS its own.",
        .flags = flags,
        .n_flags = KVF_NFLAGS(flags),
        .positional = positional,
        .max_positional = 1,
    };
    int rc = kvf_flags_parse(&set, argc, argv);
    if (rc == KVF_FLAGS_EXIT)
        return 0;
    if (rc < 0)
        return 2;
    o->dir = positional[0];
    if (!o->dir) {
        fprintf(stderr, "%s: needs OUTDIR (see --help)\n", argv[0]);
        return 2;
    }
    if (o->qwen2)
        o->arch = "qwen2";
    return -1;
}

/* The model's config from the options; false (after saying why) for
 * options that make no model. */
static bool config_from_opts(const char *prog, const mkmodel_opts_t *o, kvf_model_config_t *cfg)
{
    static const char *arch_opts[] = {"llama", "mistral", "qwen2", "qwen3", "gemma2"};
    static const char *arch_names[] = {"LlamaForCausalLM", "MistralForCausalLM",
                                       "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                                       "Gemma2ForCausalLM"};
    int arch = -1;
    for (int i = 0; i < 5; i++)
        if (!strcmp(o->arch, arch_opts[i]))
            arch = i;
    if (arch < 0) {
        fprintf(stderr, "%s: --arch must be llama, mistral, qwen2, qwen3 or gemma2, not '%s'\n",
                prog, o->arch);
        return false;
    }
    bool is_qwen = arch == KVF_ARCH_QWEN2 || arch == KVF_ARCH_QWEN3;
    if (o->sliding_window < 0 || (o->sliding_window > 0 && arch == KVF_ARCH_LLAMA) ||
        o->window_layers < 0 || (o->window_layers > 0 && !is_qwen)) {
        fprintf(stderr, "%s: --sliding-window N >= 0 needs --arch mistral, qwen2, qwen3 or gemma2; "
                        "--window-layers qwen2 or qwen3\n",
                prog);
        return false;
    }
    bool gemma = arch == KVF_ARCH_GEMMA2;
    if (gemma && (!(o->query_scalar > 0) || o->attn_softcap < 0 || o->final_softcap < 0)) {
        fprintf(stderr, "%s: --query-scalar must be positive, the soft-caps non-negative\n", prog);
        return false;
    }
    kvf_dtype_t dtype;
    if (kvf_dtype_parse(o->dtype_name, &dtype) != KVF_OK) {
        fprintf(stderr, "%s: --dtype must be f32, bf16 or f16, not '%s'\n", prog, o->dtype_name);
        return false;
    }
    if (!o->tokenizer_dir && (o->vocab < MIN_VOCAB || o->vocab > MAX_VOCAB)) {
        fprintf(stderr, "%s: --vocab must be between %d (256 bytes + BOS + EOS) and %d, not %d\n",
                prog, MIN_VOCAB, MAX_VOCAB, o->vocab);
        return false;
    }
    if (o->heads <= 0 || (o->head_dim == 0 && o->hidden % o->heads != 0)) {
        fprintf(stderr, "%s: --hidden %d is not a multiple of --heads %d (or give --head-dim)\n",
                prog, o->hidden, o->heads);
        return false;
    }
    *cfg = (kvf_model_config_t){
        .arch = (kvf_arch_t)arch,
        .n_layers = o->layers,
        .hidden = o->hidden,
        .n_heads = o->heads,
        .n_kv_heads = o->kv_heads,
        .head_dim = o->head_dim ? o->head_dim : o->hidden / o->heads,
        .inter = o->inter,
        .vocab = o->vocab,
        .max_pos = o->max_pos,
        .rope_theta = is_qwen && !o->theta_seen ? 1000000.0 : o->rope_theta,
        .rms_eps = is_qwen && !o->eps_seen ? 1e-6 : o->rms_eps,
        .tie_embeddings = o->tie || gemma, /* Gemma2 ties its LM head */
        .qkv_bias = arch == KVF_ARCH_QWEN2,
        .qk_norm = arch == KVF_ARCH_QWEN3,
        .sliding_window = o->sliding_window,
        .window_first_layer = o->window_layers,
        .window_period = gemma ? 2 : 1,
        .act = gemma ? KVF_ACT_GELU_TANH : KVF_ACT_SILU,
        .embed_scale = gemma,
        .norm_plus_one = gemma,
        .sandwich_norms = gemma,
        .attn_scalar = gemma ? o->query_scalar : 0,
        .attn_softcap = gemma ? o->attn_softcap : 0,
        .final_softcap = gemma ? o->final_softcap : 0,
        .dtype = dtype,
        .n_eos = 1,
    };
    snprintf(cfg->arch_name, sizeof(cfg->arch_name), "%s", arch_names[arch]);
    return kvf_model_config_validate(cfg, "mkmodel") == KVF_OK;
}

/* ---- --tokenizer DIR ------------------------------------------------------ */

#define PUBLISHED_MAX_BYTES (256u << 20) /* Gemma's tokenizer.json is 17 MB */

/* Copies src_dir/name to dst_dir/name byte for byte. A missing source is
 * KVF_ERR_NOT_FOUND, not logged; other failures are logged. */
static kvf_status_t copy_file(const char *src_dir, const char *dst_dir, const char *name)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", src_dir, name);
    char *data;
    size_t len;
    kvf_status_t st = kvf_file_read(path, PUBLISHED_MAX_BYTES, &data, &len);
    if (st != KVF_OK)
        return st;
    snprintf(path, sizeof(path), "%s/%s", dst_dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len) {
        kvf_log_error("%s: cannot write: %s", path, strerror(errno));
        st = KVF_ERR_IO;
    }
    if (f && fclose(f) != 0 && st == KVF_OK) {
        kvf_log_error("%s: cannot write: %s", path, strerror(errno));
        st = KVF_ERR_IO;
    }
    free(data);
    return st;
}

/* Loads the tokenizer of --tokenizer DIR and sets what it fixes: o->vocab
 * (its vocabulary size unless --vocab gave at least that) and cfg's BOS
 * and EOS (none where it has none). False after saying why. */
static bool published_tokenizer_ids(const char *prog, mkmodel_opts_t *o, kvf_model_config_t *cfg)
{
    char path[4096];
    struct stat sb;
    snprintf(path, sizeof(path), "%s/tokenizer.json", o->tokenizer_dir);
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fprintf(stderr, "%s: --tokenizer %s: there is no tokenizer.json there\n", prog,
                o->tokenizer_dir);
        return false;
    }
    kvf_tokenizer_t *tok;
    kvf_status_t st = kvf_tokenizer_load(o->tokenizer_dir, &tok);
    if (st != KVF_OK) {
        fprintf(stderr, "%s: --tokenizer %s: cannot load the tokenizer: %s\n", prog,
                o->tokenizer_dir, kvf_status_str(st));
        return false;
    }
    size_t n = kvf_tokenizer_vocab_size(tok);
    int64_t bos = kvf_tokenizer_bos_id(tok), eos = kvf_tokenizer_eos_id(tok);
    kvf_tokenizer_destroy(tok);
    if (n == 0 || n > MAX_VOCAB) {
        fprintf(stderr, "%s: --tokenizer %s: %zu token ids, outside 1..%d\n", prog,
                o->tokenizer_dir, n, MAX_VOCAB);
        return false;
    }
    if (o->vocab_seen && (o->vocab < (int)n || o->vocab > MAX_VOCAB)) {
        fprintf(stderr, "%s: --vocab %d must cover the tokenizer's %zu ids (and be at most %d)\n",
                prog, o->vocab, n, MAX_VOCAB);
        return false;
    }
    if (!o->vocab_seen)
        o->vocab = (int)n;
    cfg->bos_id = bos;
    cfg->n_eos = eos >= 0 ? 1 : 0;
    cfg->eos_ids[0] = eos;
    return true;
}

/* The directory's files: the tokenizer (built in, which fixes BOS and EOS
 * in cfg; or copied from --tokenizer, whose ids cfg has already), then the
 * weights and configs. */
static kvf_status_t write_model_dir(const char *prog, const mkmodel_opts_t *o,
                                    kvf_model_config_t *cfg)
{
    static const kvf_model_random_opts_t trained_like = {
        .heavy_tails = true, .kv_outlier_scale = 8.0f, .v_channel_spread = 0.7f};
    cJSON *tokenizer = NULL;
    int bos = -1, eos = -1;
    kvf_status_t st = KVF_OK;
    if (!o->tokenizer_dir) {
        st = build_tokenizer(cfg->vocab, &tokenizer, &bos, &eos);
        if (st != KVF_OK) {
            fprintf(stderr, "%s: cannot build the tokenizer: %s\n", prog, kvf_status_str(st));
            return st;
        }
        cfg->bos_id = bos;
        cfg->eos_ids[0] = eos;
    }
    st = make_dirs(o->dir);
    if (st == KVF_OK && tokenizer)
        st = write_json(o->dir, "tokenizer.json", tokenizer);
    cJSON_Delete(tokenizer);
    if (st == KVF_OK && !o->tokenizer_dir)
        st = write_tokenizer_config(o->dir, bos, eos, cfg->max_pos);
    if (st == KVF_OK && o->tokenizer_dir) {
        st = copy_file(o->tokenizer_dir, o->dir, "tokenizer.json");
        if (st == KVF_OK)
            st = copy_file(o->tokenizer_dir, o->dir, "tokenizer_config.json");
        if (st == KVF_ERR_NOT_FOUND) /* a tokenizer without a config: none to copy */
            st = KVF_OK;
    }
    if (st == KVF_OK)
        st = kvf_model_write_random_opts(o->dir, cfg, cfg->dtype, o->seed,
                                         o->trained_like ? &trained_like : NULL);
    if (st != KVF_OK)
        fprintf(stderr, "%s: cannot write %s: %s\n", prog, o->dir, kvf_status_str(st));
    return st;
}

static void print_summary(const char *dir, const kvf_model_config_t *cfg)
{
    uint64_t q_dim = (uint64_t)cfg->n_heads * (uint64_t)cfg->head_dim;
    uint64_t kv_dim = (uint64_t)cfg->n_kv_heads * (uint64_t)cfg->head_dim;
    uint64_t h = (uint64_t)cfg->hidden;
    uint64_t per_layer = (cfg->sandwich_norms ? 4 : 2) * h + q_dim * h + 2 * kv_dim * h + h * q_dim +
                         3 * (uint64_t)cfg->inter * h + (cfg->qkv_bias ? q_dim + 2 * kv_dim : 0) +
                         (cfg->qk_norm ? 2 * (uint64_t)cfg->head_dim : 0);
    uint64_t params = (uint64_t)cfg->vocab * h * (cfg->tie_embeddings ? 1 : 2) +
                      (uint64_t)cfg->n_layers * per_layer + h;
    printf("%s: %s, %d layers, hidden %d, %d heads / %d kv heads (head_dim %d), inter %d, "
           "vocab %d (bos %d, eos %d), %s, %.1fM parameters, %.1f MB of weights\n",
           dir, cfg->arch_name, cfg->n_layers, cfg->hidden, cfg->n_heads, cfg->n_kv_heads,
           cfg->head_dim, cfg->inter, cfg->vocab, (int)cfg->bos_id, (int)cfg->eos_ids[0],
           kvf_dtype_name(cfg->dtype), (double)params / 1e6,
           (double)(params * kvf_dtype_size(cfg->dtype)) / 1e6);
}

int kvf_cmd_mkmodel(int argc, char **argv)
{
    mkmodel_opts_t o;
    int rc = parse_opts(argc, argv, &o);
    if (rc >= 0)
        return rc;
    kvf_model_config_t ids = {.bos_id = -1}, cfg;
    if (o.tokenizer_dir && !published_tokenizer_ids(argv[0], &o, &ids))
        return 2;
    if (!config_from_opts(argv[0], &o, &cfg))
        return 2;
    if (o.tokenizer_dir) {
        cfg.bos_id = ids.bos_id;
        cfg.n_eos = ids.n_eos;
        cfg.eos_ids[0] = ids.eos_ids[0];
    }
    if (write_model_dir(argv[0], &o, &cfg) != KVF_OK)
        return 1;
    print_summary(o.dir, &cfg);
    return 0;
}
