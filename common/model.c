/* Model loading: config.json, generation_config.json, safetensors weights.
 * See kvf/model.h. */
#include "kvf/model.h"
#include "kvf/detmath.h"
#include "kvf/log.h"
#include "kvf/safetensors.h"
#include "kvf/sampling.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KVF_JSON_MAX_BYTES (64u << 20)
#define KVF_MODEL_MAX_SHARDS 1024
/* Models at least this large log loading progress on a terminal. */
#define KVF_MODEL_PROGRESS_BYTES (256u << 20)

/* Reads a whole (JSON) file into a NUL-terminated malloc'd buffer owned by
 * the caller. KVF_ERR_NOT_FOUND when it does not exist (not logged: some
 * files are optional), other errors logged. */
static kvf_status_t read_text_file(const char *path, char **text_p)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return errno == ENOENT ? KVF_ERR_NOT_FOUND : KVF_ERR_IO;
    kvf_status_t st = KVF_OK;
    char *buf = NULL;
    if (fseek(fp, 0, SEEK_END) != 0) {
        st = KVF_ERR_IO;
        goto fail_read;
    }
    long size = ftell(fp);
    if (size < 0 || (unsigned long)size > KVF_JSON_MAX_BYTES) {
        kvf_log_error("%s: unreadable or larger than %u bytes", path, KVF_JSON_MAX_BYTES);
        st = size < 0 ? KVF_ERR_IO : KVF_ERR_TOO_BIG;
        goto fail_read;
    }
    rewind(fp);
    buf = malloc((size_t)size + 1);
    if (!buf) {
        st = KVF_ERR_NOMEM;
        goto fail_read;
    }
    if (fread(buf, 1, (size_t)size, fp) != (size_t)size) {
        kvf_log_error("%s: read failed", path);
        st = KVF_ERR_IO;
        free(buf);
        goto fail_read;
    }
    buf[size] = 0;
    *text_p = buf;
fail_read:
    fclose(fp);
    return st;
}

/* Parses a JSON file; *root_p owned by the caller (cJSON_Delete). */
static kvf_status_t read_json_file(const char *path, cJSON **root_p)
{
    char *text;
    kvf_status_t st = read_text_file(path, &text);
    if (st != KVF_OK)
        return st;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root) {
        kvf_log_error("%s: not valid JSON", path);
        return KVF_ERR_FORMAT;
    }
    *root_p = root;
    return KVF_OK;
}

/* Integer field: -1 absent (keeps *v), 0 read, -2 present but not a
 * non-negative integer. */
static int json_int(const cJSON *obj, const char *key, int *v)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!it || cJSON_IsNull(it))
        return -1;
    if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > 1e9 ||
        it->valuedouble != (double)(int)it->valuedouble)
        return -2;
    *v = (int)it->valuedouble;
    return 0;
}

static int json_double(const cJSON *obj, const char *key, double *v)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!it || cJSON_IsNull(it))
        return -1;
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble))
        return -2;
    *v = it->valuedouble;
    return 0;
}

static void add_eos(kvf_model_config_t *cfg, int64_t id)
{
    if (id < 0 || kvf_model_is_eos(cfg, id) || cfg->n_eos >= KVF_MODEL_MAX_EOS)
        return;
    cfg->eos_ids[cfg->n_eos++] = id;
}

/* eos_token_id: an int or a list of ints. */
static kvf_status_t parse_eos(kvf_model_config_t *cfg, const cJSON *obj, const char *path)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, "eos_token_id");
    if (!it || cJSON_IsNull(it))
        return KVF_OK;
    if (cJSON_IsNumber(it)) {
        add_eos(cfg, (int64_t)it->valuedouble);
        return KVF_OK;
    }
    if (cJSON_IsArray(it)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, it)
        {
            if (!cJSON_IsNumber(e))
                goto fail_type;
            add_eos(cfg, (int64_t)e->valuedouble);
        }
        return KVF_OK;
    }
fail_type:
    kvf_log_error("%s: eos_token_id must be an integer or a list of integers", path);
    return KVF_ERR_FORMAT;
}

bool kvf_model_is_eos(const kvf_model_config_t *cfg, int64_t id)
{
    for (int i = 0; i < cfg->n_eos; i++)
        if (cfg->eos_ids[i] == id)
            return true;
    return false;
}

kvf_status_t kvf_model_config_validate(const kvf_model_config_t *c, const char *source)
{
    const char *why = NULL;
    if (c->n_layers <= 0 || c->n_layers > 4096)
        why = "num_hidden_layers out of range";
    else if (c->hidden <= 0 || c->hidden > (1 << 20))
        why = "hidden_size out of range";
    else if (c->n_heads <= 0 || c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads != 0)
        why = "num_attention_heads must be a positive multiple of num_key_value_heads";
    else if (c->head_dim <= 0 || c->head_dim % 2 != 0 || c->head_dim > 1024)
        why = "head_dim must be even and at most 1024";
    else if (c->inter <= 0 || c->inter > (1 << 22))
        why = "intermediate_size out of range";
    else if (c->vocab <= 0 || c->vocab > (1 << 24))
        why = "vocab_size out of range";
    else if (c->max_pos <= 0)
        why = "max_position_embeddings must be positive";
    else if (!(c->rope_theta > 0))
        why = "rope_theta must be positive";
    else if (!(c->rms_eps > 0))
        why = "rms_norm_eps must be positive";
    else if (c->rope_scaling != KVF_ROPE_SCALING_NONE && !(c->rope_factor > 0))
        why = "rope_scaling factor must be positive";
    if (why) {
        kvf_log_error("%s: %s", source, why);
        return KVF_ERR_FORMAT;
    }
    return KVF_OK;
}

static kvf_status_t parse_rope_scaling(kvf_model_config_t *cfg, const cJSON *root,
                                       const char *path)
{
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (!rs || cJSON_IsNull(rs))
        return KVF_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!cJSON_IsString(type))
        type = cJSON_GetObjectItemCaseSensitive(rs, "type");
    if (!cJSON_IsObject(rs) || !cJSON_IsString(type)) {
        kvf_log_error("%s: rope_scaling must be null or an object with rope_type", path);
        return KVF_ERR_FORMAT;
    }
    cfg->rope_factor = 1.0;
    json_double(rs, "factor", &cfg->rope_factor);
    if (!strcmp(type->valuestring, "default")) {
        cfg->rope_scaling = KVF_ROPE_SCALING_NONE;
    } else if (!strcmp(type->valuestring, "linear")) {
        cfg->rope_scaling = KVF_ROPE_SCALING_LINEAR;
    } else if (!strcmp(type->valuestring, "llama3")) {
        cfg->rope_scaling = KVF_ROPE_SCALING_LLAMA3;
        cfg->rope_low_freq_factor = 1.0;
        cfg->rope_high_freq_factor = 4.0;
        cfg->rope_orig_max_pos = 8192;
        json_double(rs, "low_freq_factor", &cfg->rope_low_freq_factor);
        json_double(rs, "high_freq_factor", &cfg->rope_high_freq_factor);
        json_int(rs, "original_max_position_embeddings", &cfg->rope_orig_max_pos);
        if (!(cfg->rope_high_freq_factor > cfg->rope_low_freq_factor) ||
            cfg->rope_orig_max_pos <= 0) {
            kvf_log_error("%s: rope_scaling llama3: bad frequency factors", path);
            return KVF_ERR_FORMAT;
        }
    } else {
        kvf_log_error("%s: rope_scaling type '%s' is not supported (default, linear, llama3)",
                      path, type->valuestring);
        return KVF_ERR_UNSUPPORTED;
    }
    return KVF_OK;
}

kvf_status_t kvf_model_config_load(const char *dir, kvf_model_config_t *cfg_p)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    cJSON *root;
    kvf_status_t st = read_json_file(path, &root);
    if (st == KVF_ERR_NOT_FOUND)
        kvf_log_error("%s: not found (is %s a Hugging Face model directory?)", path, dir);
    if (st != KVF_OK)
        return st;
    kvf_model_config_t cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.bos_id = -1;
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *arch = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    if (!cJSON_IsString(arch)) {
        kvf_log_error("%s: no \"architectures\" list", path);
        st = KVF_ERR_FORMAT;
        goto fail_parse;
    }
    snprintf(cfg.arch_name, sizeof(cfg.arch_name), "%s", arch->valuestring);
    if (!strcmp(arch->valuestring, "LlamaForCausalLM")) {
        cfg.arch = KVF_ARCH_LLAMA;
    } else if (!strcmp(arch->valuestring, "MistralForCausalLM")) {
        cfg.arch = KVF_ARCH_MISTRAL;
    } else if (!strcmp(arch->valuestring, "Qwen2ForCausalLM")) {
        cfg.arch = KVF_ARCH_QWEN2;
        cfg.qkv_bias = true;
    } else {
        kvf_log_error("%s: architecture '%s' is not supported (LlamaForCausalLM, "
                      "MistralForCausalLM, Qwen2ForCausalLM)",
                      path, arch->valuestring);
        st = KVF_ERR_UNSUPPORTED;
        goto fail_parse;
    }
    static const struct {
        const char *key;
        size_t off;
        bool required;
    } ints[] = {
        {"num_hidden_layers", offsetof(kvf_model_config_t, n_layers), true},
        {"hidden_size", offsetof(kvf_model_config_t, hidden), true},
        {"num_attention_heads", offsetof(kvf_model_config_t, n_heads), true},
        {"num_key_value_heads", offsetof(kvf_model_config_t, n_kv_heads), false},
        {"head_dim", offsetof(kvf_model_config_t, head_dim), false},
        {"intermediate_size", offsetof(kvf_model_config_t, inter), true},
        {"vocab_size", offsetof(kvf_model_config_t, vocab), true},
        {"max_position_embeddings", offsetof(kvf_model_config_t, max_pos), false},
    };
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
        int r = json_int(root, ints[i].key, (int *)((char *)&cfg + ints[i].off));
        if (r == -2 || (r == -1 && ints[i].required)) {
            kvf_log_error("%s: \"%s\" %s", path, ints[i].key,
                          r == -1 ? "is missing" : "must be a non-negative integer");
            st = KVF_ERR_FORMAT;
            goto fail_parse;
        }
    }
    if (cfg.n_kv_heads == 0)
        cfg.n_kv_heads = cfg.n_heads;
    if (cfg.head_dim == 0 && cfg.n_heads > 0)
        cfg.head_dim = cfg.hidden / cfg.n_heads;
    if (cfg.max_pos == 0)
        cfg.max_pos = 2048;
    cfg.rope_theta = 10000.0;
    cfg.rms_eps = 1e-6;
    if (json_double(root, "rope_theta", &cfg.rope_theta) == -2 ||
        json_double(root, "rms_norm_eps", &cfg.rms_eps) == -2) {
        kvf_log_error("%s: rope_theta and rms_norm_eps must be numbers", path);
        st = KVF_ERR_FORMAT;
        goto fail_parse;
    }
    cfg.tie_embeddings = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings"));
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "attention_bias")))
        cfg.qkv_bias = true;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "mlp_bias"))) {
        kvf_log_error("%s: mlp_bias is not supported", path);
        st = KVF_ERR_UNSUPPORTED;
        goto fail_parse;
    }
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (cJSON_IsString(act) && strcmp(act->valuestring, "silu") != 0) {
        kvf_log_error("%s: hidden_act '%s' is not supported (silu)", path, act->valuestring);
        st = KVF_ERR_UNSUPPORTED;
        goto fail_parse;
    }
    const cJSON *td = cJSON_GetObjectItemCaseSensitive(root, "torch_dtype");
    cfg.dtype = KVF_DTYPE_F32;
    if (cJSON_IsString(td))
        (void)kvf_dtype_parse(td->valuestring, &cfg.dtype);
    st = parse_rope_scaling(&cfg, root, path);
    if (st != KVF_OK)
        goto fail_parse;
    /* Sliding-window attention is not supported: say so when a config
     * turns it on for contexts it would change. */
    int window = 0;
    const cJSON *use_sw = cJSON_GetObjectItemCaseSensitive(root, "use_sliding_window");
    if (json_int(root, "sliding_window", &window) == 0 && window > 0 && window < cfg.max_pos &&
        (cfg.arch == KVF_ARCH_MISTRAL || cJSON_IsTrue(use_sw)))
        kvf_log_warn("%s: sliding_window %d is not applied: contexts beyond %d tokens differ "
                     "from the reference implementation",
                     path, window, window);
    const cJSON *bos = cJSON_GetObjectItemCaseSensitive(root, "bos_token_id");
    if (cJSON_IsNumber(bos))
        cfg.bos_id = (int64_t)bos->valuedouble;
    st = parse_eos(&cfg, root, path);
    if (st != KVF_OK)
        goto fail_parse;
    st = kvf_model_config_validate(&cfg, path);
    if (st != KVF_OK)
        goto fail_parse;
    cJSON_Delete(root);

    /* generation_config.json (optional) adds EOS ids and may set BOS. */
    snprintf(path, sizeof(path), "%s/generation_config.json", dir);
    st = read_json_file(path, &root);
    if (st == KVF_ERR_NOT_FOUND) {
        st = KVF_OK;
    } else if (st == KVF_OK) {
        bos = cJSON_GetObjectItemCaseSensitive(root, "bos_token_id");
        if (cJSON_IsNumber(bos))
            cfg.bos_id = (int64_t)bos->valuedouble;
        st = parse_eos(&cfg, root, path);
        cJSON_Delete(root);
    }
    if (st != KVF_OK)
        return st;
    *cfg_p = cfg;
    return KVF_OK;

fail_parse:
    cJSON_Delete(root);
    return st;
}

/* ---- weights -------------------------------------------------------- */

typedef struct {
    kvf_safetensors_t **shards; /* (n_shards) */
    int n_shards;
} shard_set_t;

static void shards_close(shard_set_t *s)
{
    for (int i = 0; i < s->n_shards; i++)
        kvf_safetensors_close(s->shards[i]);
    free(s->shards);
    s->shards = NULL;
    s->n_shards = 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Collects the shard file names (sorted, unique): those in the index's
 * weight_map, else model.safetensors, else every *.safetensors. The names
 * are malloc'd and owned by the caller, as is the array. */
static kvf_status_t list_shards(const char *dir, char ***names_p, int *n_p)
{
    char path[4096];
    char **names = NULL;
    int n = 0;
    kvf_status_t st = KVF_OK;
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    cJSON *index;
    st = read_json_file(path, &index);
    if (st == KVF_OK) {
        const cJSON *map = cJSON_GetObjectItemCaseSensitive(index, "weight_map");
        if (!cJSON_IsObject(map)) {
            kvf_log_error("%s: no weight_map object", path);
            cJSON_Delete(index);
            return KVF_ERR_FORMAT;
        }
        int cap = cJSON_GetArraySize(map);
        names = calloc(cap ? (size_t)cap : 1, sizeof(*names));
        if (!names) {
            cJSON_Delete(index);
            return KVF_ERR_NOMEM;
        }
        const cJSON *e;
        cJSON_ArrayForEach(e, map)
        {
            if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || !e->valuestring[0]) {
                kvf_log_error("%s: tensor %s: bad shard file name", path, e->string);
                st = KVF_ERR_FORMAT;
                break;
            }
            bool seen = false;
            for (int i = 0; i < n && !seen; i++)
                seen = !strcmp(names[i], e->valuestring);
            if (seen)
                continue;
            if (n >= KVF_MODEL_MAX_SHARDS || !(names[n] = strdup(e->valuestring))) {
                st = n >= KVF_MODEL_MAX_SHARDS ? KVF_ERR_TOO_BIG : KVF_ERR_NOMEM;
                break;
            }
            n++;
        }
        cJSON_Delete(index);
        if (st != KVF_OK)
            goto fail_names;
    } else if (st == KVF_ERR_NOT_FOUND) {
        st = KVF_OK;
        DIR *d = opendir(dir);
        if (!d) {
            kvf_log_error("%s: cannot list directory: %m", dir);
            return KVF_ERR_IO;
        }
        int cap = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
            size_t len = strlen(de->d_name);
            if (len < 12 || strcmp(de->d_name + len - 12, ".safetensors") != 0)
                continue;
            if (n == cap) {
                cap = cap ? 2 * cap : 8;
                char **grown = cap <= KVF_MODEL_MAX_SHARDS ? realloc(names, (size_t)cap * sizeof(*names)) : NULL;
                if (!grown) {
                    st = KVF_ERR_NOMEM;
                    break;
                }
                names = grown;
            }
            if (!(names[n] = strdup(de->d_name))) {
                st = KVF_ERR_NOMEM;
                break;
            }
            n++;
        }
        closedir(d);
        if (st != KVF_OK)
            goto fail_names;
        /* A lone model.safetensors wins over stray other files. */
        for (int i = 0; i < n; i++) {
            if (!strcmp(names[i], "model.safetensors")) {
                char *keep = names[i];
                for (int j = 0; j < n; j++)
                    if (j != i)
                        free(names[j]);
                names[0] = keep;
                n = 1;
                break;
            }
        }
        if (n == 0) {
            kvf_log_error("%s: no model.safetensors, index or *.safetensors file", dir);
            st = KVF_ERR_NOT_FOUND;
            goto fail_names;
        }
    } else {
        return st;
    }
    qsort(names, (size_t)n, sizeof(*names), cmp_str);
    *names_p = names;
    *n_p = n;
    return KVF_OK;
fail_names:
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return st;
}

static kvf_status_t shards_open(const char *dir, shard_set_t *s)
{
    char **names;
    int n;
    kvf_status_t st = list_shards(dir, &names, &n);
    if (st != KVF_OK)
        return st;
    s->shards = calloc((size_t)n, sizeof(*s->shards));
    if (!s->shards) {
        st = KVF_ERR_NOMEM;
        goto fail_alloc;
    }
    char path[4096];
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        st = kvf_safetensors_open(path, &s->shards[i]);
        if (st != KVF_OK)
            break;
        s->n_shards++;
    }
    if (st != KVF_OK)
        shards_close(s);
fail_alloc:
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return st;
}

/* One weight the model needs: name, expected shape, where it goes. */
typedef struct {
    char name[128];
    int64_t rows, cols; /* cols 0 for a vector */
    bool matrix;        /* a projection: in the matrix slab, else in the slab */
    size_t slab_off;    /* floats from its slab's start */
} want_t;

/* Appends a tensor to the slab plan at *off. pad: align the next tensor
 * to 64 bytes; without it the next one follows directly (q|k|v, gate|up
 * form one matrix). */
static void want_add(want_t *w, int *n, size_t *off, const char *name, int64_t rows,
                     int64_t cols, bool pad)
{
    want_t *t = &w[(*n)++];
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->rows = rows;
    t->cols = cols;
    t->matrix = false;
    t->slab_off = *off;
    *off += (size_t)rows * (size_t)(cols ? cols : 1);
    if (pad)
        *off = (*off + 15) & ~(size_t)15;
}

static kvf_status_t find_tensor(const shard_set_t *s, const want_t *w, const char *dir,
                                const kvf_st_tensor_t **t_p, const char **file_p)
{
    for (int i = 0; i < s->n_shards; i++) {
        const kvf_st_tensor_t *t = kvf_safetensors_find(s->shards[i], w->name);
        if (!t)
            continue;
        const char *file = kvf_safetensors_path(s->shards[i]);
        if (t->dtype == KVF_DTYPE_UNKNOWN) {
            kvf_log_error("%s: tensor %s: dtype %s is not supported (F32, F16, BF16)", file,
                          w->name, t->dtype_name);
            return KVF_ERR_UNSUPPORTED;
        }
        bool ok = w->cols ? (t->ndim == 2 && t->shape[0] == w->rows && t->shape[1] == w->cols)
                          : (t->ndim == 1 && t->shape[0] == w->rows);
        if (!ok) {
            char got[128] = "";
            size_t len = 0;
            for (int d = 0; d < t->ndim && len < sizeof(got) - 24; d++)
                len += (size_t)snprintf(got + len, sizeof(got) - len, "%s%lld", d ? ", " : "",
                                        (long long)t->shape[d]);
            if (w->cols)
                kvf_log_error("%s: tensor %s: shape [%s], expected [%lld, %lld]", file, w->name,
                              got, (long long)w->rows, (long long)w->cols);
            else
                kvf_log_error("%s: tensor %s: shape [%s], expected [%lld]", file, w->name, got,
                              (long long)w->rows);
            return KVF_ERR_FORMAT;
        }
        *t_p = t;
        *file_p = file;
        return KVF_OK;
    }
    kvf_log_error("%s: tensor %s is missing from the safetensors files", dir, w->name);
    return KVF_ERR_NOT_FOUND;
}

static void compute_inv_freq(const kvf_model_config_t *c, double *inv_freq)
{
    int half = c->head_dim / 2;
    for (int i = 0; i < half; i++) {
        /* kvf_det_pow: the same bits on every CPU and C library */
        double f = kvf_det_pow(c->rope_theta, -2.0 * i / c->head_dim);
        if (c->rope_scaling == KVF_ROPE_SCALING_LINEAR) {
            f /= c->rope_factor;
        } else if (c->rope_scaling == KVF_ROPE_SCALING_LLAMA3) {
            double low_wl = c->rope_orig_max_pos / c->rope_low_freq_factor;
            double high_wl = c->rope_orig_max_pos / c->rope_high_freq_factor;
            double wl = 2.0 * M_PI / f;
            if (wl > low_wl) {
                f /= c->rope_factor;
            } else if (wl >= high_wl) {
                double smooth = (c->rope_orig_max_pos / wl - c->rope_low_freq_factor) /
                                (c->rope_high_freq_factor - c->rope_low_freq_factor);
                f = (1 - smooth) * f / c->rope_factor + smooth * f;
            }
        }
        inv_freq[i] = f;
    }
}

static uint64_t config_hash(const kvf_model_config_t *c)
{
    int64_t geo[] = {c->arch,       c->n_layers,      c->hidden,        c->n_heads,
                     c->n_kv_heads, c->head_dim,      c->inter,         c->vocab,
                     c->max_pos,    c->tie_embeddings, c->qkv_bias,     c->rope_scaling};
    double real[] = {c->rope_theta, c->rms_eps, c->rope_factor, c->rope_low_freq_factor,
                     c->rope_high_freq_factor};
    uint64_t h = kvf_fnv64(KVF_FNV64_INIT, geo, sizeof(geo));
    return kvf_fnv64(h, real, sizeof(real));
}

kvf_status_t kvf_model_load(const char *dir, kvf_model_t **model_p)
{
    kvf_status_t st;
    kvf_model_t *m = calloc(1, sizeof(*m));
    if (!m)
        return KVF_ERR_NOMEM;
    st = kvf_model_config_load(dir, &m->cfg);
    if (st != KVF_OK)
        goto fail_config;
    const kvf_model_config_t *c = &m->cfg;
    shard_set_t shards = {0};
    st = shards_open(dir, &shards);
    if (st != KVF_OK)
        goto fail_config;

    int64_t q_dim = (int64_t)c->n_heads * c->head_dim, kv_dim = (int64_t)c->n_kv_heads * c->head_dim;
    int max_wants = 3 + 12 * c->n_layers; /* 12 tensors per layer with biases */
    want_t *wants = calloc((size_t)max_wants, sizeof(*wants));
    m->layers = calloc((size_t)c->n_layers, sizeof(*m->layers));
    m->rope_inv_freq = calloc((size_t)c->head_dim / 2, sizeof(double));
    if (!wants || !m->layers || !m->rope_inv_freq) {
        st = KVF_ERR_NOMEM;
        goto fail_wants;
    }
    /* Plan the slabs: projections in one (a backend that keeps its own
     * copy may drop it: kvf_model_drop_matrices), the embedding, norms and
     * biases in the other. The order makes wq|wk|wv and gate|up adjacent. */
    int nw = 0;
    size_t off = 0, moff = 0;
    char name[128];
    want_add(wants, &nw, &off, "model.embed_tokens.weight", c->vocab, c->hidden, true);
    for (int l = 0; l < c->n_layers; l++) {
#define LAYER_WANT(suffix, rows, cols, pad)                                                        \
    do {                                                                                           \
        snprintf(name, sizeof(name), "model.layers.%d.%s", l, suffix);                            \
        bool mat_ = (cols) != 0;                                                                   \
        want_add(wants, &nw, mat_ ? &moff : &off, name, rows, cols, pad);                          \
        wants[nw - 1].matrix = mat_;                                                               \
    } while (0)
        LAYER_WANT("input_layernorm.weight", c->hidden, 0, true);
        LAYER_WANT("self_attn.q_proj.weight", q_dim, c->hidden, false);
        LAYER_WANT("self_attn.k_proj.weight", kv_dim, c->hidden, false);
        LAYER_WANT("self_attn.v_proj.weight", kv_dim, c->hidden, true);
        if (c->qkv_bias) {
            LAYER_WANT("self_attn.q_proj.bias", q_dim, 0, false);
            LAYER_WANT("self_attn.k_proj.bias", kv_dim, 0, false);
            LAYER_WANT("self_attn.v_proj.bias", kv_dim, 0, true);
        }
        LAYER_WANT("self_attn.o_proj.weight", c->hidden, q_dim, true);
        LAYER_WANT("post_attention_layernorm.weight", c->hidden, 0, true);
        LAYER_WANT("mlp.gate_proj.weight", c->inter, c->hidden, false);
        LAYER_WANT("mlp.up_proj.weight", c->inter, c->hidden, true);
        LAYER_WANT("mlp.down_proj.weight", c->hidden, c->inter, true);
#undef LAYER_WANT
    }
    want_add(wants, &nw, &off, "model.norm.weight", c->hidden, 0, true);
    if (!c->tie_embeddings) {
        want_add(wants, &nw, &moff, "lm_head.weight", c->vocab, c->hidden, true);
        wants[nw - 1].matrix = true;
    }

    m->slab_bytes = off * sizeof(float);
    m->mslab_bytes = moff * sizeof(float);
    m->slab = aligned_alloc(64, (m->slab_bytes + 63) & ~(size_t)63);
    m->mslab = aligned_alloc(64, (m->mslab_bytes + 63) & ~(size_t)63);
    if (!m->slab || !m->mslab) {
        kvf_log_error("%s: cannot allocate %zu bytes for the weights", dir,
                      m->slab_bytes + m->mslab_bytes);
        st = KVF_ERR_NOMEM;
        goto fail_slab;
    }
    /* Convert every weight; find all first so a bad file fails fast. */
    const kvf_st_tensor_t **found = calloc((size_t)nw, sizeof(*found));
    if (!found) {
        st = KVF_ERR_NOMEM;
        goto fail_slab;
    }
    for (int i = 0; i < nw && st == KVF_OK; i++) {
        const char *file;
        st = find_tensor(&shards, &wants[i], dir, &found[i], &file);
    }
    if (st != KVF_OK) {
        free(found);
        goto fail_slab;
    }
    const size_t total_bytes = m->slab_bytes + m->mslab_bytes;
    bool progress = total_bytes >= KVF_MODEL_PROGRESS_BYTES && isatty(STDERR_FILENO);
    size_t done = 0;
    int last_pct = 0;
    m->matrix_dtype = KVF_DTYPE_UNKNOWN;
    for (int i = 0; i < nw; i++) {
        size_t count = (size_t)wants[i].rows * (size_t)(wants[i].cols ? wants[i].cols : 1);
        float *dst = (wants[i].matrix ? m->mslab : m->slab) + wants[i].slab_off;
        kvf_dtype_to_f32(dst, found[i]->data, found[i]->dtype, count);
        if (wants[i].matrix)
            m->matrix_dtype = m->matrix_dtype == KVF_DTYPE_UNKNOWN ||
                                      m->matrix_dtype == found[i]->dtype
                                  ? found[i]->dtype
                                  : KVF_DTYPE_F32;
        done += count * sizeof(float);
        int pct = (int)(100.0 * (double)done / (double)total_bytes);
        if (progress && pct / 10 > last_pct / 10) {
            kvf_log_info("loading %s: %d%% of %.2f GiB", dir, pct,
                         (double)total_bytes / (1 << 30));
            last_pct = pct;
        }
    }
    if (m->matrix_dtype == KVF_DTYPE_UNKNOWN)
        m->matrix_dtype = KVF_DTYPE_F32;
    free(found);

    /* Point the tensors into the slab, in the plan's order. */
    int wi = 0;
    m->embed = m->slab + wants[wi++].slab_off;
    for (int l = 0; l < c->n_layers; l++) {
        kvf_layer_weights_t *L = &m->layers[l];
        L->attn_norm = m->slab + wants[wi++].slab_off;
        L->wq = L->wqkv = m->mslab + wants[wi++].slab_off;
        L->wk = m->mslab + wants[wi++].slab_off;
        L->wv = m->mslab + wants[wi++].slab_off;
        if (c->qkv_bias) {
            L->bqkv = m->slab + wants[wi].slab_off;
            wi += 3;
        }
        L->wo = m->mslab + wants[wi++].slab_off;
        L->ffn_norm = m->slab + wants[wi++].slab_off;
        L->wgu = m->mslab + wants[wi++].slab_off;
        wi++; /* up_proj, adjacent to gate_proj */
        L->wdown = m->mslab + wants[wi++].slab_off;
    }
    m->final_norm = m->slab + wants[wi++].slab_off;
    m->lm_head = c->tie_embeddings ? m->embed : m->mslab + wants[wi++].slab_off;
    KVF_ASSERT(wi == nw);
    compute_inv_freq(c, m->rope_inv_freq);

    uint64_t h = config_hash(c);
    for (int i = 0; i < shards.n_shards; i++) {
        uint64_t sh = kvf_safetensors_header_hash(shards.shards[i]);
        h = kvf_fnv64(h, &sh, sizeof(sh));
    }
    snprintf(m->fingerprint, sizeof(m->fingerprint), "%016" PRIx64, h);
    free(wants);
    shards_close(&shards);
    kvf_log_debug("loaded %s: %s, %d layers, %.1f MiB of f32 weights (%s projections in the "
                  "files), fingerprint %s",
                  dir, c->arch_name, c->n_layers, (double)total_bytes / (1 << 20),
                  kvf_dtype_name(m->matrix_dtype), m->fingerprint);
    *model_p = m;
    return KVF_OK;

fail_slab:
    free(m->slab);
    free(m->mslab);
fail_wants:
    free(wants);
    shards_close(&shards);
fail_config:
    free(m->rope_inv_freq);
    free(m->layers);
    free(m);
    return st;
}

void kvf_model_destroy(kvf_model_t *model)
{
    if (!model)
        return;
    free(model->slab);
    free(model->mslab);
    free(model->layers);
    free(model->rope_inv_freq);
    free(model);
}

void kvf_model_drop_matrices(kvf_model_t *model)
{
    free(model->mslab);
    model->mslab = NULL;
    model->mslab_bytes = 0;
    for (int l = 0; l < model->cfg.n_layers; l++) {
        kvf_layer_weights_t *L = &model->layers[l];
        L->wqkv = L->wq = L->wk = L->wv = L->wo = L->wgu = L->wdown = NULL;
    }
    if (!model->cfg.tie_embeddings)
        model->lm_head = NULL;
    model->matrices_dropped = true;
}

void kvf_model_drop_weights(kvf_model_t *model)
{
    kvf_model_drop_matrices(model);
    free(model->slab);
    model->slab = NULL;
    model->slab_bytes = 0;
    model->embed = model->final_norm = model->lm_head = NULL;
    memset(model->layers, 0, (size_t)model->cfg.n_layers * sizeof(*model->layers));
}

const char *kvf_model_fingerprint(const kvf_model_t *model)
{
    return model->fingerprint;
}

size_t kvf_model_weight_bytes(const kvf_model_t *model)
{
    return model->slab_bytes + model->mslab_bytes;
}

/* ---- random models --------------------------------------------------- */

/* Uniform in [-1, 1). */
static float rand_sym(uint64_t *state)
{
    return (float)((double)(kvf_splitmix64(state) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

static kvf_status_t write_config_json(const char *dir, const kvf_model_config_t *c,
                                      kvf_dtype_t dtype)
{
    static const char *arch_names[] = {"LlamaForCausalLM", "MistralForCausalLM",
                                       "Qwen2ForCausalLM"};
    static const char *model_types[] = {"llama", "mistral", "qwen2"};
    char path[4096];
    kvf_status_t st = KVF_OK;
    cJSON *root = cJSON_CreateObject();
    cJSON *archs = cJSON_AddArrayToObject(root, "architectures");
    cJSON_AddItemToArray(archs, cJSON_CreateString(arch_names[c->arch]));
    cJSON_AddStringToObject(root, "model_type", model_types[c->arch]);
    cJSON_AddNumberToObject(root, "num_hidden_layers", c->n_layers);
    cJSON_AddNumberToObject(root, "hidden_size", c->hidden);
    cJSON_AddNumberToObject(root, "num_attention_heads", c->n_heads);
    cJSON_AddNumberToObject(root, "num_key_value_heads", c->n_kv_heads);
    cJSON_AddNumberToObject(root, "head_dim", c->head_dim);
    cJSON_AddNumberToObject(root, "intermediate_size", c->inter);
    cJSON_AddNumberToObject(root, "vocab_size", c->vocab);
    cJSON_AddNumberToObject(root, "max_position_embeddings", c->max_pos);
    cJSON_AddNumberToObject(root, "rope_theta", c->rope_theta);
    cJSON_AddNumberToObject(root, "rms_norm_eps", c->rms_eps);
    cJSON_AddBoolToObject(root, "tie_word_embeddings", c->tie_embeddings);
    if (c->arch != KVF_ARCH_QWEN2)
        cJSON_AddBoolToObject(root, "attention_bias", c->qkv_bias);
    cJSON_AddStringToObject(root, "hidden_act", "silu");
    cJSON_AddStringToObject(root, "torch_dtype", dtype == KVF_DTYPE_F32   ? "float32"
                                                 : dtype == KVF_DTYPE_F16 ? "float16"
                                                                          : "bfloat16");
    if (c->bos_id >= 0)
        cJSON_AddNumberToObject(root, "bos_token_id", (double)c->bos_id);
    if (c->n_eos > 0)
        cJSON_AddNumberToObject(root, "eos_token_id", (double)c->eos_ids[0]);
    for (int pass = 0; pass < 2 && st == KVF_OK; pass++) {
        if (pass == 1) {
            cJSON_Delete(root);
            root = cJSON_CreateObject();
            if (c->bos_id >= 0)
                cJSON_AddNumberToObject(root, "bos_token_id", (double)c->bos_id);
            cJSON *eos = cJSON_AddArrayToObject(root, "eos_token_id");
            for (int i = 0; i < c->n_eos; i++)
                cJSON_AddItemToArray(eos, cJSON_CreateNumber((double)c->eos_ids[i]));
        }
        snprintf(path, sizeof(path), "%s/%s", dir,
                 pass == 0 ? "config.json" : "generation_config.json");
        char *text = cJSON_Print(root);
        FILE *fp = text ? fopen(path, "w") : NULL;
        if (!fp || fputs(text, fp) < 0 || fputc('\n', fp) == EOF) {
            kvf_log_error("%s: cannot write: %m", path);
            st = text ? KVF_ERR_IO : KVF_ERR_NOMEM;
        }
        if (fp && fclose(fp) != 0)
            st = KVF_ERR_IO;
        free(text);
    }
    cJSON_Delete(root);
    return st;
}

kvf_status_t kvf_model_write_random(const char *dir, const kvf_model_config_t *cfg,
                                    kvf_dtype_t dtype, uint64_t seed)
{
    kvf_status_t st = kvf_model_config_validate(cfg, dir);
    if (st != KVF_OK)
        return st;
    if (dtype == KVF_DTYPE_UNKNOWN)
        return KVF_ERR_INVAL;
    st = write_config_json(dir, cfg, dtype);
    if (st != KVF_OK)
        return st;
    const kvf_model_config_t *c = cfg;
    int64_t q_dim = (int64_t)c->n_heads * c->head_dim, kv_dim = (int64_t)c->n_kv_heads * c->head_dim;
    int max_t = 3 + 12 * c->n_layers;
    kvf_st_write_t *t = calloc((size_t)max_t, sizeof(*t));
    char (*names)[96] = calloc((size_t)max_t, sizeof(*names));
    void **bufs = calloc((size_t)max_t, sizeof(*bufs));
    int n = 0;
    uint64_t rng = seed;
    if (!t || !names || !bufs) {
        st = KVF_ERR_NOMEM;
        goto fail_tensors;
    }
    /* kind: 0 = matrix with uniform(-sqrt(3/cols), sqrt(3/cols)) (unit
     * variance outputs), 1 = norm weight near 1, 2 = bias, 3 = embedding. */
#define ADD_TENSOR(nm_fmt, layer, rows, cols, kind)                                                \
    do {                                                                                           \
        snprintf(names[n], sizeof(names[n]), nm_fmt, layer);                                       \
        size_t cnt = (size_t)(rows) * (size_t)((cols) ? (cols) : 1);                               \
        bufs[n] = malloc(cnt * kvf_dtype_size(dtype));                                             \
        if (!bufs[n]) {                                                                            \
            st = KVF_ERR_NOMEM;                                                                    \
            goto fail_tensors;                                                                     \
        }                                                                                          \
        float scale = (kind) == 0 ? sqrtf(3.0f / (float)((cols) ? (cols) : 1))                     \
                      : (kind) == 1 ? 0.1f                                                         \
                      : (kind) == 2 ? 0.1f                                                         \
                                    : 1.0f;                                                        \
        for (size_t i = 0; i < cnt; i++) {                                                         \
            float v = rand_sym(&rng) * scale + ((kind) == 1 ? 1.0f : 0.0f);                        \
            if (dtype == KVF_DTYPE_F32)                                                            \
                ((float *)bufs[n])[i] = v;                                                         \
            else if (dtype == KVF_DTYPE_BF16)                                                      \
                ((uint16_t *)bufs[n])[i] = kvf_f32_to_bf16(v);                                     \
            else                                                                                   \
                ((uint16_t *)bufs[n])[i] = kvf_f32_to_f16(v);                                      \
        }                                                                                          \
        t[n].name = names[n];                                                                      \
        t[n].dtype = dtype;                                                                        \
        t[n].ndim = (cols) ? 2 : 1;                                                                \
        t[n].shape[0] = (rows);                                                                    \
        t[n].shape[1] = (cols);                                                                    \
        t[n].data = bufs[n];                                                                       \
        n++;                                                                                       \
    } while (0)
    ADD_TENSOR("model.embed_tokens.weight%.0d", 0, c->vocab, c->hidden, 3);
    for (int l = 0; l < c->n_layers; l++) {
        ADD_TENSOR("model.layers.%d.input_layernorm.weight", l, c->hidden, 0, 1);
        ADD_TENSOR("model.layers.%d.self_attn.q_proj.weight", l, q_dim, c->hidden, 0);
        ADD_TENSOR("model.layers.%d.self_attn.k_proj.weight", l, kv_dim, c->hidden, 0);
        ADD_TENSOR("model.layers.%d.self_attn.v_proj.weight", l, kv_dim, c->hidden, 0);
        if (c->qkv_bias) {
            ADD_TENSOR("model.layers.%d.self_attn.q_proj.bias", l, q_dim, 0, 2);
            ADD_TENSOR("model.layers.%d.self_attn.k_proj.bias", l, kv_dim, 0, 2);
            ADD_TENSOR("model.layers.%d.self_attn.v_proj.bias", l, kv_dim, 0, 2);
        }
        ADD_TENSOR("model.layers.%d.self_attn.o_proj.weight", l, c->hidden, q_dim, 0);
        ADD_TENSOR("model.layers.%d.post_attention_layernorm.weight", l, c->hidden, 0, 1);
        ADD_TENSOR("model.layers.%d.mlp.gate_proj.weight", l, c->inter, c->hidden, 0);
        ADD_TENSOR("model.layers.%d.mlp.up_proj.weight", l, c->inter, c->hidden, 0);
        ADD_TENSOR("model.layers.%d.mlp.down_proj.weight", l, c->hidden, c->inter, 0);
    }
    ADD_TENSOR("model.norm.weight%.0d", 0, c->hidden, 0, 1);
    if (!c->tie_embeddings)
        ADD_TENSOR("lm_head.weight%.0d", 0, c->vocab, c->hidden, 0);
#undef ADD_TENSOR
    char path[4096];
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    st = kvf_safetensors_write(path, t, (size_t)n);
fail_tensors:
    for (int i = 0; i < n && bufs; i++)
        free(bufs[i]);
    free(bufs);
    free(names);
    free(t);
    return st;
}
