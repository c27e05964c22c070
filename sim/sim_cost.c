/* The simulator's cost model: built-in profiles, profile files, step and
 * transfer times. See sim_cost.h and docs/simulator.md. */
#include "sim_cost.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kvf/file.h"
#include "kvf/kvcache.h"

/* Assumed, not from a datasheet (docs/simulator.md, "Profiles"): the
 * share of peak a tuned engine reaches on large matrix products and on
 * streaming reads, the memory left to weights and KV after activations
 * and the runtime, a transfer's set-up and a step's launch overhead. */
#define EFF_COMPUTE      0.6
#define EFF_MEMORY       0.8
#define KV_MEM_FRACTION  0.9
#define TRANSFER_FIXED_S 50e-6
#define STEP_OVERHEAD_S  200e-6

/* InfiniBand NDR, 400 Gb/s per port (NVIDIA ConnectX-7 datasheet), one
 * port per GPU. */
#define NET_NDR_BW (400e9 / 8)

/* Dense bf16 tensor throughput is half the datasheets' "with sparsity"
 * figure; NVLink bandwidth is their bidirectional total, halved for one
 * direction. */
static const kvf_sim_profile_t builtin[] = {
    {"h100-sxm",
     "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM): 80 GB HBM3, 3.35 TB/s, "
     "BF16 1,979 TFLOPS with sparsity, NVLink 900 GB/s",
     80e9, 3.35e12, 989.5e12, 450e9, NET_NDR_BW, EFF_COMPUTE, EFF_COMPUTE, EFF_MEMORY,
     KV_MEM_FRACTION, TRANSFER_FIXED_S, STEP_OVERHEAD_S, 0, 0, 0, 0, 0, 0, 0, {0}, {0}, 0, {0}, {0}, 0},
    {"h200-sxm",
     "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): 141 GB HBM3e, 4.8 TB/s, "
     "BF16 1,979 TFLOPS with sparsity, NVLink 900 GB/s",
     141e9, 4.8e12, 989.5e12, 450e9, NET_NDR_BW, EFF_COMPUTE, EFF_COMPUTE, EFF_MEMORY,
     KV_MEM_FRACTION, TRANSFER_FIXED_S, STEP_OVERHEAD_S, 0, 0, 0, 0, 0, 0, 0, {0}, {0}, 0, {0}, {0}, 0},
    {"a100-sxm-80gb",
     "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM): 80 GB HBM2e, "
     "2,039 GB/s, BF16 624 TFLOPS with sparsity, NVLink 600 GB/s",
     80e9, 2.039e12, 312e12, 300e9, NET_NDR_BW, EFF_COMPUTE, EFF_COMPUTE, EFF_MEMORY,
     KV_MEM_FRACTION, TRANSFER_FIXED_S, STEP_OVERHEAD_S, 0, 0, 0, 0, 0, 0, 0, {0}, {0}, 0, {0}, {0}, 0},
};
#define N_BUILTIN (sizeof(builtin) / sizeof(builtin[0]))

const char *kvf_sim_profile_names(void)
{
    return "h100 (h100-sxm), h200 (h200-sxm), a100 (a100-sxm-80gb)";
}

/* The names each built-in answers to (any case). */
static const struct {
    const char *name;
    size_t index;
} aliases[] = {
    {"h100", 0}, {"h100-sxm", 0}, {"h100-sxm5", 0}, {"h200", 1},          {"h200-sxm", 1},
    {"a100", 2}, {"a100-sxm", 2}, {"a100-80gb", 2}, {"a100-sxm-80gb", 2},
};

bool kvf_sim_profile_builtin(const char *name, kvf_sim_profile_t *profile_p)
{
    for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); i++)
        if (!strcasecmp(name, aliases[i].name)) {
            *profile_p = builtin[aliases[i].index];
            return true;
        }
    return false;
}

/* How a profile field is checked: a positive number, a fraction in
 * (0, 1], or a number >= 0 (times, counts). */
typedef enum { FIELD_POSITIVE, FIELD_FRACTION, FIELD_NONNEG } field_kind_t;

typedef struct {
    const char *key;
    double scale; /* file units to the profile's */
    field_kind_t kind;
    bool required; /* without a base */
    size_t offset;
} profile_field_t;

static const profile_field_t fields[] = {
    {"hbm_gb", 1e9, FIELD_POSITIVE, true, offsetof(kvf_sim_profile_t, hbm_bytes)},
    {"hbm_tb_s", 1e12, FIELD_POSITIVE, true, offsetof(kvf_sim_profile_t, hbm_bw)},
    {"tflops", 1e12, FIELD_POSITIVE, true, offsetof(kvf_sim_profile_t, flops)},
    {"nvlink_gb_s", 1e9, FIELD_POSITIVE, true, offsetof(kvf_sim_profile_t, nvlink_bw)},
    {"net_gb_s", 1e9, FIELD_POSITIVE, true, offsetof(kvf_sim_profile_t, net_bw)},
    {"compute_eff", 1, FIELD_FRACTION, false, offsetof(kvf_sim_profile_t, compute_eff)},
    {"decode_compute_eff", 1, FIELD_FRACTION, false,
     offsetof(kvf_sim_profile_t, decode_compute_eff)},
    {"mem_eff", 1, FIELD_FRACTION, false, offsetof(kvf_sim_profile_t, mem_eff)},
    {"attn_eff", 1, FIELD_FRACTION, false, offsetof(kvf_sim_profile_t, attn_eff)},
    {"kv_mem_fraction", 1, FIELD_FRACTION, false, offsetof(kvf_sim_profile_t, kv_mem_fraction)},
    {"transfer_fixed_us", 1e-6, FIELD_NONNEG, false, offsetof(kvf_sim_profile_t, transfer_fixed_s)},
    {"step_overhead_us", 1e-6, FIELD_NONNEG, false, offsetof(kvf_sim_profile_t, step_overhead_s)},
    {"host_cpus", 1, FIELD_NONNEG, false, offsetof(kvf_sim_profile_t, host_cpus)},
    {"host_load", 1, FIELD_NONNEG, false, offsetof(kvf_sim_profile_t, host_load)},
    {"node_threads", 1, FIELD_NONNEG, false, offsetof(kvf_sim_profile_t, node_threads)},
    {"msg_latency_us", 1e-6, FIELD_NONNEG, false, offsetof(kvf_sim_profile_t, msg_latency_s)},
    {"llc_mb", 1 << 20, FIELD_NONNEG, false, offsetof(kvf_sim_profile_t, llc_bytes)},
    {"dram_gb_s", 1e9, FIELD_NONNEG, false, offsetof(kvf_sim_profile_t, dram_bw)},
};

static const char *const kind_rule[] = {"a positive number", "a number in (0, 1]", "a number >= 0"};

/* Field f of o, when present, into the profile at p; false when present
 * and breaking its kind's rule. */
static bool take(const cJSON *o, const profile_field_t *f, kvf_sim_profile_t *p, bool *seen_p)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, f->key);
    *seen_p = j != NULL;
    if (!j)
        return true;
    if (!cJSON_IsNumber(j))
        return false;
    double v = j->valuedouble;
    bool ok = f->kind == FIELD_NONNEG ? v >= 0 : v > 0 && (f->kind != FIELD_FRACTION || v <= 1);
    if (ok)
        *(double *)((char *)p + f->offset) = v * f->scale;
    return ok;
}

/* "key": [[x, eff], ...] of root, when present: at most
 * KVF_SIM_EFF_POINTS_MAX pairs of x >= 1 (increasing, what) and an
 * efficiency in (0, 1] into xs, effs and *n_p; false after a message. */
static bool take_eff_points(const cJSON *root, const char *key, const char *what, int *n_p,
                            double *xs, double *effs, const char *path, char *err, size_t err_len)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!a)
        return true;
    int n = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : -1;
    bool ok = n >= 1 && n <= KVF_SIM_EFF_POINTS_MAX;
    for (int i = 0; ok && i < n; i++) {
        const cJSON *pt = cJSON_GetArrayItem(a, i);
        const cJSON *t = cJSON_GetArrayItem(pt, 0), *e = cJSON_GetArrayItem(pt, 1);
        ok = cJSON_IsArray(pt) && cJSON_GetArraySize(pt) == 2 && cJSON_IsNumber(t) &&
             cJSON_IsNumber(e) && t->valuedouble >= 1 && e->valuedouble > 0 &&
             e->valuedouble <= 1 && (i == 0 || t->valuedouble > xs[i - 1]);
        if (ok) {
            xs[i] = t->valuedouble;
            effs[i] = e->valuedouble;
        }
    }
    if (!ok) {
        snprintf(err, err_len,
                 "%s: \"%s\" must be 1 to %d pairs [%s >= 1, efficiency in (0, 1]], %s "
                 "increasing",
                 path, key, KVF_SIM_EFF_POINTS_MAX, what, what);
        return false;
    }
    *n_p = n;
    return true;
}

/* The profile's starting point: the base the file names, else the
 * assumed efficiencies and overheads with no hardware numbers. */
static bool profile_base(const cJSON *root, kvf_sim_profile_t *p, char *err, size_t err_len)
{
    const cJSON *base = cJSON_GetObjectItemCaseSensitive(root, "base");
    *p = (kvf_sim_profile_t){.compute_eff = EFF_COMPUTE,
                             .decode_compute_eff = 0,
                             .mem_eff = EFF_MEMORY,
                             .kv_mem_fraction = KV_MEM_FRACTION,
                             .transfer_fixed_s = TRANSFER_FIXED_S,
                             .step_overhead_s = STEP_OVERHEAD_S};
    if (!base)
        return true;
    if (!cJSON_IsString(base) || !kvf_sim_profile_builtin(base->valuestring, p)) {
        snprintf(err, err_len, "\"base\" must name a built-in profile: %s",
                 kvf_sim_profile_names());
        return false;
    }
    return true;
}

kvf_status_t kvf_sim_profile_load(const char *path, kvf_sim_profile_t *profile_p, char *err,
                                  size_t err_len)
{
    char *text;
    size_t len;
    kvf_status_t st = kvf_file_read(path, 1u << 20, &text, &len);
    if (st != KVF_OK) {
        snprintf(err, err_len, "cannot read %s: %s", path, kvf_status_str(st));
        return st;
    }
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    st = KVF_ERR_FORMAT;
    kvf_sim_profile_t p;
    if (!cJSON_IsObject(root)) {
        snprintf(err, err_len, "%s: not a JSON object", path);
        goto done;
    }
    if (!profile_base(root, &p, err, err_len))
        goto done;
    bool has_base = cJSON_GetObjectItemCaseSensitive(root, "base") != NULL;
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        const profile_field_t *f = &fields[i];
        bool seen;
        if (!take(root, f, &p, &seen)) {
            snprintf(err, err_len, "%s: \"%s\" must be %s", path, f->key, kind_rule[f->kind]);
            goto done;
        }
        if (f->required && !seen && !has_base) {
            snprintf(err, err_len, "%s: \"%s\" is missing (or give \"base\")", path, f->key);
            goto done;
        }
    }
    if (!take_eff_points(root, "prefill_eff", "tokens", &p.n_prefill_eff, p.prefill_eff_tokens,
                         p.prefill_eff, path, err, err_len) ||
        !take_eff_points(root, "decode_eff", "seqs", &p.n_decode_eff, p.decode_eff_seqs,
                         p.decode_eff, path, err, err_len))
        goto done;
    /* without its own, decode tokens reach what prompt tokens do */
    if (!cJSON_GetObjectItemCaseSensitive(root, "decode_compute_eff") &&
        (!has_base || cJSON_GetObjectItemCaseSensitive(root, "compute_eff")))
        p.decode_compute_eff = p.compute_eff;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(root, "name");
    snprintf(p.name, sizeof(p.name), "%s", cJSON_IsString(name) ? name->valuestring : "file");
    p.source = "a profile file";
    *profile_p = p;
    st = KVF_OK;
done:
    cJSON_Delete(root);
    return st;
}

void kvf_sim_model_init(const kvf_model_config_t *cfg, double weight_elem_bytes,
                        kvf_kv_dtype_t kv_dtype, int tp, kvf_sim_model_t *model_p)
{
    double h = cfg->hidden, q = (double)cfg->n_heads * cfg->head_dim;
    double kv = (double)cfg->n_kv_heads * cfg->head_dim, v = cfg->vocab;
    /* q, k, v, o projections and the gated MLP (gate, up, down) */
    double layer_params = h * q + 2 * h * kv + q * h + 3 * h * cfg->inter;
    double params = cfg->n_layers * layer_params + v * h * (cfg->tie_embeddings ? 1 : 2);
    kvf_kv_geometry_t geo = {.n_layers = cfg->n_layers,
                             .n_kv_heads = cfg->n_kv_heads,
                             .head_dim = cfg->head_dim,
                             .block_size = 1,
                             .dtype = kv_dtype};
    *model_p = (kvf_sim_model_t){
        .n_layers = cfg->n_layers,
        .hidden = cfg->hidden,
        .q_dim = (int)q,
        .vocab = cfg->vocab,
        .tp = tp,
        .weight_bytes = params * weight_elem_bytes,
        .step_weight_bytes = (params - (cfg->tie_embeddings ? 0 : v * h)) * weight_elem_bytes,
        .layer_flops = 2 * cfg->n_layers * layer_params,
        .head_flops = 2 * v * h,
        .attn_flops = 4.0 * cfg->n_layers * q,
        .kv_bytes_per_token = (double)kvf_kv_bytes_per_token(&geo),
        .kv_dtype = kv_dtype,
        .act_bytes = 2 * h,
    };
}

uint32_t kvf_sim_capacity_blocks(const kvf_sim_profile_t *hw, const kvf_sim_model_t *m,
                                 uint32_t block_size)
{
    double room = hw->hbm_bytes * m->tp * hw->kv_mem_fraction - m->weight_bytes;
    double blocks = room / (m->kv_bytes_per_token * block_size);
    if (blocks < 1)
        return 0;
    return blocks > 4e9 ? 4000000000u : (uint32_t)blocks;
}

void kvf_sim_step_add_chunk(kvf_sim_step_t *s, uint32_t start, uint32_t n, bool last)
{
    s->prefill_tokens += n;
    /* token i of the chunk attends to start + i + 1 keys */
    s->prefill_pairs += (uint64_t)n * start + (uint64_t)n * (n + 1) / 2;
    s->prefill_kv_read += start;
    s->prefill_ends += last;
}

/* The FLOPs of s's decode tokens and of its prompt tokens. */
/* The FLOPs of s's decode tokens (their matrix products), of their
 * attention, and of its prompt tokens. */
static void step_flops(const kvf_sim_model_t *m, const kvf_sim_step_t *s, double *decode_p,
                       double *attn_p, double *prefill_p)
{
    *decode_p = (m->layer_flops + m->head_flops) * s->decode_seqs;
    *attn_p = m->attn_flops * (double)s->decode_ctx;
    *prefill_p = m->layer_flops * s->prefill_tokens + m->head_flops * s->prefill_ends +
                 m->attn_flops * (double)s->prefill_pairs;
}

double kvf_sim_step_flops(const kvf_sim_model_t *m, const kvf_sim_step_t *s)
{
    double d, a, p;
    step_flops(m, s, &d, &a, &p);
    return d + a + p;
}

double kvf_sim_step_bytes(const kvf_sim_model_t *m, const kvf_sim_step_t *s)
{
    /* KV read (what each attends to before it) and written (one row per
     * token computed) */
    double kv_tokens =
        (double)s->decode_ctx + (double)s->prefill_kv_read + s->decode_seqs + s->prefill_tokens;
    return m->step_weight_bytes + m->kv_bytes_per_token * kv_tokens;
}

double kvf_sim_step_time(const kvf_sim_profile_t *hw, const kvf_sim_model_t *m,
                         const kvf_sim_step_t *s)
{
    double d, a, p;
    step_flops(m, s, &d, &a, &p);
    const double de = kvf_sim_decode_eff(hw, s->decode_seqs);
    double compute = (d / de + a / (hw->attn_eff > 0 ? hw->attn_eff : de) +
                      (p > 0 ? p / kvf_sim_prefill_eff(hw, s->prefill_tokens) : 0)) /
                     (hw->flops * m->tp);
    double memory = kvf_sim_step_bytes(m, s) / (hw->hbm_bw * hw->mem_eff * m->tp);
    double t = compute > memory ? compute : memory;
    if (m->tp > 1) {
        /* a ring all-reduce moves 2 (tp - 1) / tp of the buffer per GPU */
        double tokens = (double)s->decode_seqs + s->prefill_tokens;
        double buffer = tokens * m->act_bytes;
        t += 2.0 * m->n_layers * (2.0 * (m->tp - 1) / m->tp) * buffer / hw->nvlink_bw;
    }
    return t + hw->step_overhead_s;
}

/* Points (xs increasing, k of them) interpolated linearly in log2(n),
 * the end points' past them. */
static double eff_at(int k, const double *xs, const double *effs, double n)
{
    if (n <= xs[0])
        return effs[0];
    for (int i = 1; i < k; i++)
        if (n <= xs[i]) {
            double x0 = log2(xs[i - 1]), x1 = log2(xs[i]);
            double f = (log2(n) - x0) / (x1 - x0);
            return effs[i - 1] + f * (effs[i] - effs[i - 1]);
        }
    return effs[k - 1];
}

double kvf_sim_prefill_eff(const kvf_sim_profile_t *hw, double n)
{
    if (hw->n_prefill_eff <= 0)
        return hw->compute_eff;
    return eff_at(hw->n_prefill_eff, hw->prefill_eff_tokens, hw->prefill_eff, n);
}

double kvf_sim_decode_eff(const kvf_sim_profile_t *hw, double n)
{
    if (hw->n_decode_eff <= 0)
        return hw->decode_compute_eff;
    return eff_at(hw->n_decode_eff, hw->decode_eff_seqs, hw->decode_eff, n);
}

double kvf_sim_host_share(const kvf_sim_profile_t *hw, double busy_threads)
{
    double demand = busy_threads + hw->host_load;
    if (hw->host_cpus <= 0 || demand <= hw->host_cpus)
        return 1;
    return hw->host_cpus / demand;
}

double kvf_sim_transfer_time(const kvf_sim_profile_t *hw, int tp, double bytes)
{
    return hw->transfer_fixed_s + bytes / (hw->net_bw * (tp > 0 ? tp : 1));
}
