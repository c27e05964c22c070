/* Loading a model's weights (kvf_model_load): the safetensors shards of
 * the directory, the slab plan, conversion to f32, the fingerprint; and
 * dropping the weights once a backend holds its own. See kvf/model.h. */
#include "model_internal.h"

#include "kvf/array.h"
#include "kvf/detmath.h"
#include "kvf/hashmap.h"
#include "kvf/log.h"
#include "kvf/safetensors.h"

#include <dirent.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KVF_MODEL_MAX_SHARDS 1024
/* Tensors of a layer with every option: biases (3) and q/k norms (2). */
#define KVF_MODEL_LAYER_TENSORS 14
/* Models at least this large log loading progress on a terminal. */
#define KVF_MODEL_PROGRESS_BYTES (256u << 20)

/* ---- shards ----------------------------------------------------------- */

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

static void free_names(char **names, int n)
{
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

/* The shard files an index's weight_map names, each once. */
static kvf_status_t shards_from_index(const char *path, const cJSON *index, char ***names_p,
                                      int *n_p)
{
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(index, "weight_map");
    if (!cJSON_IsObject(map)) {
        kvf_log_error("%s: no weight_map object", path);
        return KVF_ERR_FORMAT;
    }
    int cap = cJSON_GetArraySize(map);
    char **names = calloc(cap ? (size_t)cap : 1, sizeof(*names));
    kvf_strset_t seen;
    kvf_status_t st = kvf_strset_init(&seen, (size_t)cap);
    int n = 0;
    if (!names && st == KVF_OK)
        st = KVF_ERR_NOMEM;
    const cJSON *e;
    cJSON_ArrayForEach(e, map)
    {
        if (st != KVF_OK)
            break;
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || !e->valuestring[0]) {
            kvf_log_error("%s: tensor %s: bad shard file name", path, e->string);
            st = KVF_ERR_FORMAT;
            break;
        }
        if (kvf_strset_has(&seen, e->valuestring))
            continue;
        if (n >= KVF_MODEL_MAX_SHARDS || !(names[n] = strdup(e->valuestring))) {
            st = n >= KVF_MODEL_MAX_SHARDS ? KVF_ERR_TOO_BIG : KVF_ERR_NOMEM;
            break;
        }
        st = kvf_strset_add(&seen, names[n++], NULL);
    }
    kvf_strset_fini(&seen);
    if (st != KVF_OK) {
        free_names(names, n);
        return st;
    }
    *names_p = names;
    *n_p = n;
    return KVF_OK;
}

/* Every *.safetensors file of dir, or model.safetensors alone when it is
 * one of them (it wins over stray other files). */
static kvf_status_t shards_from_dir(const char *dir, char ***names_p, int *n_p)
{
    DIR *d = opendir(dir);
    if (!d) {
        kvf_log_error("%s: cannot list directory: %m", dir);
        return KVF_ERR_IO;
    }
    kvf_status_t st = KVF_OK;
    char **names = NULL;
    int n = 0;
    size_t cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len < 12 || strcmp(de->d_name + len - 12, ".safetensors") != 0)
            continue;
        if (n == KVF_MODEL_MAX_SHARDS ||
            kvf_array_reserve(&names, &cap, (size_t)n + 1, 8, sizeof(*names)) != KVF_OK) {
            st = KVF_ERR_NOMEM;
            break;
        }
        if (!(names[n] = strdup(de->d_name))) {
            st = KVF_ERR_NOMEM;
            break;
        }
        n++;
    }
    closedir(d);
    for (int i = 0; i < n && st == KVF_OK; i++) {
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
    if (st == KVF_OK && n == 0) {
        kvf_log_error("%s: no model.safetensors, index or *.safetensors file", dir);
        st = KVF_ERR_NOT_FOUND;
    }
    if (st != KVF_OK) {
        free_names(names, n);
        return st;
    }
    *names_p = names;
    *n_p = n;
    return KVF_OK;
}

/* Collects the shard file names (sorted, unique): those in the index's
 * weight_map, else model.safetensors, else every *.safetensors. The names
 * are malloc'd and owned by the caller, as is the array. */
static kvf_status_t list_shards(const char *dir, char ***names_p, int *n_p)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    char **names = NULL;
    int n = 0;
    cJSON *index;
    kvf_status_t st = kvf_model__read_json(path, &index);
    if (st == KVF_OK) {
        st = shards_from_index(path, index, &names, &n);
        cJSON_Delete(index);
    } else if (st == KVF_ERR_NOT_FOUND) {
        st = shards_from_dir(dir, &names, &n);
    }
    if (st != KVF_OK)
        return st;
    qsort(names, (size_t)n, sizeof(*names), cmp_str);
    *names_p = names;
    *n_p = n;
    return KVF_OK;
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

/* ---- weights -------------------------------------------------------- */

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
static void want_add(want_t *w, int *n, size_t *off, const char *name, int64_t rows, int64_t cols,
                     bool pad)
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
    int64_t geo[] = {c->arch,       c->n_layers,       c->hidden,   c->n_heads,
                     c->n_kv_heads, c->head_dim,       c->inter,    c->vocab,
                     c->max_pos,    c->tie_embeddings, c->qkv_bias, c->rope_scaling};
    double real[] = {c->rope_theta, c->rms_eps, c->rope_factor, c->rope_low_freq_factor,
                     c->rope_high_freq_factor};
    uint64_t h = kvf_fnv64(KVF_FNV64_INIT, geo, sizeof(geo));
    h = kvf_fnv64(h, real, sizeof(real));
    if (c->qk_norm || c->sliding_window) {
        /* only then: the fingerprints of models without them stay */
        int64_t more[] = {c->qk_norm, c->sliding_window, c->window_first_layer};
        h = kvf_fnv64(h, more, sizeof(more));
    }
    if (c->arch == KVF_ARCH_GEMMA2) {
        int64_t g[] = {c->window_period, c->act, c->embed_scale, c->norm_plus_one,
                       c->sandwich_norms};
        double gr[] = {c->attn_scalar, c->attn_softcap, c->final_softcap};
        h = kvf_fnv64(h, g, sizeof(g));
        h = kvf_fnv64(h, gr, sizeof(gr));
    }
    return h;
}

/* Appends layer l's tensor suffix to the plan: a matrix (cols > 0) to the
 * projection slab at *moff, a vector to the other at *off. */
static void layer_want(want_t *w, int *n, size_t *off, size_t *moff, int l, const char *suffix,
                       int64_t rows, int64_t cols, bool pad)
{
    char name[128];
    snprintf(name, sizeof(name), "model.layers.%d.%s", l, suffix);
    bool matrix = cols != 0;
    want_add(w, n, matrix ? moff : off, name, rows, cols, pad);
    w[*n - 1].matrix = matrix;
}

/* Plans the slabs: projections in one (a backend that keeps its own copy
 * may drop it: kvf_model_drop_matrices), the embedding, norms and biases
 * in the other. The order makes wq|wk|wv and gate|up adjacent, and is the
 * one point_tensors() follows. Returns the number of wants (at most
 * 3 + KVF_MODEL_LAYER_TENSORS * n_layers); *floats_p and *mfloats_p are the slabs' sizes. */
static int plan_weights(const kvf_model_config_t *c, want_t *wants, size_t *floats_p,
                        size_t *mfloats_p)
{
    int64_t q_dim = (int64_t)c->n_heads * c->head_dim,
            kv_dim = (int64_t)c->n_kv_heads * c->head_dim;
    int nw = 0;
    size_t off = 0, moff = 0;
    want_add(wants, &nw, &off, "model.embed_tokens.weight", c->vocab, c->hidden, true);
    for (int l = 0; l < c->n_layers; l++) {
        layer_want(wants, &nw, &off, &moff, l, "input_layernorm.weight", c->hidden, 0, true);
        layer_want(wants, &nw, &off, &moff, l, "self_attn.q_proj.weight", q_dim, c->hidden, false);
        layer_want(wants, &nw, &off, &moff, l, "self_attn.k_proj.weight", kv_dim, c->hidden, false);
        layer_want(wants, &nw, &off, &moff, l, "self_attn.v_proj.weight", kv_dim, c->hidden, true);
        if (c->qkv_bias) {
            layer_want(wants, &nw, &off, &moff, l, "self_attn.q_proj.bias", q_dim, 0, false);
            layer_want(wants, &nw, &off, &moff, l, "self_attn.k_proj.bias", kv_dim, 0, false);
            layer_want(wants, &nw, &off, &moff, l, "self_attn.v_proj.bias", kv_dim, 0, true);
        }
        if (c->qk_norm) {
            layer_want(wants, &nw, &off, &moff, l, "self_attn.q_norm.weight", c->head_dim, 0, true);
            layer_want(wants, &nw, &off, &moff, l, "self_attn.k_norm.weight", c->head_dim, 0, true);
        }
        layer_want(wants, &nw, &off, &moff, l, "self_attn.o_proj.weight", c->hidden, q_dim, true);
        layer_want(wants, &nw, &off, &moff, l, "post_attention_layernorm.weight", c->hidden, 0,
                   true);
        if (c->sandwich_norms) {
            layer_want(wants, &nw, &off, &moff, l, "pre_feedforward_layernorm.weight", c->hidden,
                       0, true);
            layer_want(wants, &nw, &off, &moff, l, "post_feedforward_layernorm.weight", c->hidden,
                       0, true);
        }
        layer_want(wants, &nw, &off, &moff, l, "mlp.gate_proj.weight", c->inter, c->hidden, false);
        layer_want(wants, &nw, &off, &moff, l, "mlp.up_proj.weight", c->inter, c->hidden, true);
        layer_want(wants, &nw, &off, &moff, l, "mlp.down_proj.weight", c->hidden, c->inter, true);
    }
    want_add(wants, &nw, &off, "model.norm.weight", c->hidden, 0, true);
    if (!c->tie_embeddings) {
        want_add(wants, &nw, &moff, "lm_head.weight", c->vocab, c->hidden, true);
        wants[nw - 1].matrix = true;
    }
    *floats_p = off;
    *mfloats_p = moff;
    return nw;
}

static kvf_status_t alloc_slabs(kvf_model_t *m, const char *dir, size_t floats, size_t mfloats)
{
    m->slab_bytes = floats * sizeof(float);
    m->mslab_bytes = mfloats * sizeof(float);
    m->slab = aligned_alloc(64, (m->slab_bytes + 63) & ~(size_t)63);
    m->mslab = aligned_alloc(64, (m->mslab_bytes + 63) & ~(size_t)63);
    if (!m->slab || !m->mslab) {
        kvf_log_error("%s: cannot allocate %zu bytes for the weights", dir,
                      m->slab_bytes + m->mslab_bytes);
        return KVF_ERR_NOMEM;
    }
    return KVF_OK;
}

/* Finds every wanted tensor before converting any, so that a bad file
 * fails fast. */
static kvf_status_t find_weights(const shard_set_t *shards, const want_t *wants, int nw,
                                 const char *dir, const kvf_st_tensor_t **found)
{
    kvf_status_t st = KVF_OK;
    for (int i = 0; i < nw && st == KVF_OK; i++) {
        const char *file;
        st = find_tensor(shards, &wants[i], dir, &found[i], &file);
    }
    return st;
}

/* Converts every tensor to f32 into its slab; the projections' dtype in
 * the files is m->matrix_dtype (f32 when they differ). Logs progress on a
 * terminal for a large model. */
static void convert_weights(kvf_model_t *m, const want_t *wants, const kvf_st_tensor_t **found,
                            int nw, const char *dir)
{
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
            m->matrix_dtype =
                m->matrix_dtype == KVF_DTYPE_UNKNOWN || m->matrix_dtype == found[i]->dtype
                    ? found[i]->dtype
                    : KVF_DTYPE_F32;
        done += count * sizeof(float);
        int pct = (int)(100.0 * (double)done / (double)total_bytes);
        if (progress && pct / 10 > last_pct / 10) {
            kvf_log_info("loading %s: %d%% of %.2f GiB", dir, pct, (double)total_bytes / (1 << 30));
            last_pct = pct;
        }
    }
    if (m->matrix_dtype == KVF_DTYPE_UNKNOWN)
        m->matrix_dtype = KVF_DTYPE_F32;
}

/* Points the tensors into the slabs, in plan_weights()'s order. */
static void point_tensors(kvf_model_t *m, const want_t *wants, int nw)
{
    const kvf_model_config_t *c = &m->cfg;
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
        if (c->qk_norm) {
            L->q_norm = m->slab + wants[wi++].slab_off;
            L->k_norm = m->slab + wants[wi++].slab_off;
        }
        L->wo = m->mslab + wants[wi++].slab_off;
        if (c->sandwich_norms) {
            /* post_attention_layernorm is on the attention output here */
            L->post_attn_norm = m->slab + wants[wi++].slab_off;
            L->ffn_norm = m->slab + wants[wi++].slab_off;
            L->post_ffn_norm = m->slab + wants[wi++].slab_off;
        } else {
            L->ffn_norm = m->slab + wants[wi++].slab_off;
        }
        L->wgu = m->mslab + wants[wi++].slab_off;
        wi++; /* up_proj, adjacent to gate_proj */
        L->wdown = m->mslab + wants[wi++].slab_off;
    }
    m->final_norm = m->slab + wants[wi++].slab_off;
    m->lm_head = c->tie_embeddings ? m->embed : m->mslab + wants[wi++].slab_off;
    KVF_ASSERT(wi == nw);
}

/* Gemma2's RMSNorms scale by 1 + w: the sum, in float as the model
 * computes it, replaces w in every norm weight. */
static void fold_norms_plus_one(kvf_model_t *m)
{
    const kvf_model_config_t *c = &m->cfg;
    if (!c->norm_plus_one)
        return;
    for (int l = 0; l <= c->n_layers; l++) {
        const kvf_layer_weights_t *L = l < c->n_layers ? &m->layers[l] : NULL;
        float *norms[4] = {L ? L->attn_norm : m->final_norm, L ? L->post_attn_norm : NULL,
                           L ? L->ffn_norm : NULL, L ? L->post_ffn_norm : NULL};
        for (int i = 0; i < 4; i++)
            for (int d = 0; norms[i] && d < c->hidden; d++)
                norms[i][d] = 1.0f + norms[i][d];
    }
}

/* The fingerprint: the config's geometry and every shard's header. */
static void set_fingerprint(kvf_model_t *m, const shard_set_t *shards)
{
    uint64_t h = config_hash(&m->cfg);
    for (int i = 0; i < shards->n_shards; i++) {
        uint64_t sh = kvf_safetensors_header_hash(shards->shards[i]);
        h = kvf_fnv64(h, &sh, sizeof(sh));
    }
    snprintf(m->fingerprint, sizeof(m->fingerprint), "%016" PRIx64, h);
}

kvf_status_t kvf_model_load(const char *dir, kvf_model_t **model_p)
{
    kvf_model_t *m = calloc(1, sizeof(*m));
    if (!m)
        return KVF_ERR_NOMEM;
    shard_set_t shards = {0};
    want_t *wants = NULL;
    const kvf_st_tensor_t **found = NULL;
    kvf_status_t st = kvf_model_config_load(dir, &m->cfg);
    if (st == KVF_OK)
        st = shards_open(dir, &shards);
    if (st != KVF_OK)
        goto fail_load;
    const kvf_model_config_t *c = &m->cfg;
    size_t max_wants = 3 + KVF_MODEL_LAYER_TENSORS * (size_t)c->n_layers;
    wants = calloc(max_wants, sizeof(*wants));
    found = calloc(max_wants, sizeof(*found));
    m->layers = calloc((size_t)c->n_layers, sizeof(*m->layers));
    m->rope_inv_freq = calloc((size_t)c->head_dim / 2, sizeof(double));
    if (!wants || !found || !m->layers || !m->rope_inv_freq) {
        st = KVF_ERR_NOMEM;
        goto fail_load;
    }
    size_t floats, mfloats;
    int nw = plan_weights(c, wants, &floats, &mfloats);
    st = alloc_slabs(m, dir, floats, mfloats);
    if (st == KVF_OK)
        st = find_weights(&shards, wants, nw, dir, found);
    if (st == KVF_OK)
        st = kvf_model__check_unused(shards.shards, shards.n_shards, found, nw, c, dir);
    if (st != KVF_OK)
        goto fail_load;
    convert_weights(m, wants, found, nw, dir);
    point_tensors(m, wants, nw);
    fold_norms_plus_one(m);
    compute_inv_freq(c, m->rope_inv_freq);
    set_fingerprint(m, &shards);
    free(found);
    free(wants);
    shards_close(&shards);
    kvf_log_debug("loaded %s: %s, %d layers, %.1f MiB of f32 weights (%s projections in the "
                  "files), fingerprint %s",
                  dir, c->arch_name, c->n_layers, (double)kvf_model_weight_bytes(m) / (1 << 20),
                  kvf_dtype_name(m->matrix_dtype), m->fingerprint);
    *model_p = m;
    return KVF_OK;

fail_load:
    free(found);
    free(wants);
    shards_close(&shards);
    kvf_model_destroy(m);
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
