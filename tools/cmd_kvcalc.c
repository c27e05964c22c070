/* kvf kvcalc: KV cache size per token, per request and per batch.
 *
 * bytes per token = 2 (K and V) x layers x kv_heads x (head_dim x bytes per
 * element + 4 for fp8's and int8's per-row scale): kvf_kv_bytes_per_token,
 * the pool's own count (kvf/kvcache.h, kvf/kv_format.h). With --model the
 * geometry comes from config.json (the engine's loader) and the weights'
 * bytes from the safetensors headers, for comparison. */
#include "commands.h"
#include "kvf/file.h"
#include "kvf/flags.h"
#include "kvf/kv_format.h"
#include "kvf/kvcache.h"
#include "kvf/model.h"
#include "kvf/safetensors.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GIB (1024.0 * 1024.0 * 1024.0)

/* Bytes of the weights on disk: the sum over model.safetensors's tensors,
 * or the total_size a sharded checkpoint's index states. */
static kvf_status_t weight_bytes(const char *dir, uint64_t *bytes_p)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    if (access(path, F_OK) == 0) {
        kvf_safetensors_t *st;
        kvf_status_t status = kvf_safetensors_open(path, &st);
        if (status != KVF_OK)
            return status;
        uint64_t sum = 0;
        for (size_t i = 0; i < kvf_safetensors_count(st); i++)
            sum += kvf_safetensors_tensor(st, i)->nbytes;
        kvf_safetensors_close(st);
        *bytes_p = sum;
        return KVF_OK;
    }
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    char *text;
    size_t len;
    kvf_status_t status = kvf_file_read(path, 64u << 20, &text, &len);
    if (status != KVF_OK)
        return status;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "metadata");
    const cJSON *total = cJSON_GetObjectItemCaseSensitive(meta, "total_size");
    status = KVF_ERR_FORMAT;
    if (cJSON_IsNumber(total) && total->valuedouble >= 0) {
        *bytes_p = (uint64_t)total->valuedouble;
        status = KVF_OK;
    }
    cJSON_Delete(root);
    return status;
}

static void print_bytes(const char *what, uint64_t bytes)
{
    printf("%-22s %" PRIu64 " bytes (%.6f GiB)\n", what, bytes, (double)bytes / GIB);
}

typedef struct {
    const char *model_dir, *kv_dtype;
    int layers, kv_heads, head_dim, context, batch;
    kvf_kv_dtype_t dtype;   /* from kv_dtype */
    kvf_model_config_t cfg; /* with --model */
} kvcalc_opts_t;

/* Returns -1 to run, else the exit code (help printed, or bad flags). */
static int parse_kvcalc_opts(int argc, char **argv, kvcalc_opts_t *o)
{
    *o = (kvcalc_opts_t){.kv_dtype = "f32", .batch = 1};
    const kvf_flag_t flags[] = {
        {"model", KVF_FLAG_STRING, &o->model_dir, "DIR", "take the geometry from DIR/config.json",
         NULL},
        {"layers", KVF_FLAG_INT, &o->layers, "L", "decoder layers (without --model)", NULL},
        {"kv-heads", KVF_FLAG_INT, &o->kv_heads, "H", "key/value heads (without --model)", NULL},
        {"head-dim", KVF_FLAG_INT, &o->head_dim, "D", "head dimension (without --model)", NULL},
        {"context", KVF_FLAG_INT, &o->context, "N", "tokens per request (prompt + output)", NULL},
        {"batch", KVF_FLAG_INT, &o->batch, "B", "concurrent requests", NULL},
        {"kv-dtype", KVF_FLAG_STRING, &o->kv_dtype, "f32|f16|bf16|fp8|int8",
         "KV cache format (fp8 and int8 count their per-row f32 scales)", NULL},
    };
    kvf_flagset_t set = {
        .prog = argv[0],
        .usage = "(--model DIR | --layers L --kv-heads H --head-dim D) --context N [--batch B] "
                 "[--kv-dtype T]",
        .summary = "Prints the KV cache bytes per token, per request and for the batch: "
                   "2 x layers x kv_heads x (head_dim x bytes + 4 for an fp8/int8 scale) x "
                   "tokens, as the nodes' pools hold it. With --model, also the weight bytes "
                   "for comparison.",
        .flags = flags,
        .n_flags = KVF_NFLAGS(flags),
    };
    int rc = kvf_flags_parse(&set, argc, argv);
    if (rc == KVF_FLAGS_EXIT)
        return 0;
    if (rc < 0)
        return 2;
    if (kvf_kv_dtype_parse(o->kv_dtype, &o->dtype) != KVF_OK) {
        fprintf(stderr, "%s: --kv-dtype must be f32, f16, bf16, fp8 or int8, not '%s'\n", argv[0],
                o->kv_dtype);
        return 2;
    }
    if (o->context <= 0 || o->batch <= 0) {
        fprintf(stderr, "%s: needs --context N > 0 (and --batch B > 0)\n", argv[0]);
        return 2;
    }
    return -1;
}

/* The geometry: from --model's config.json, or the flags. Returns -1 when
 * there is one, else the exit code after a line on stderr. */
static int resolve_geometry(const char *prog, kvcalc_opts_t *o)
{
    if (!o->model_dir) {
        if (o->layers <= 0 || o->kv_heads <= 0 || o->head_dim <= 0) {
            fprintf(stderr,
                    "%s: needs --model DIR or positive --layers, --kv-heads and --head-dim\n",
                    prog);
            return 2;
        }
        return -1;
    }
    if (o->layers || o->kv_heads || o->head_dim) {
        fprintf(stderr, "%s: give --model or --layers/--kv-heads/--head-dim, not both\n", prog);
        return 2;
    }
    kvf_status_t st = kvf_model_config_load(o->model_dir, &o->cfg);
    if (st != KVF_OK) {
        fprintf(stderr, "%s: cannot read %s/config.json: %s\n", prog, o->model_dir,
                kvf_status_str(st));
        return 1;
    }
    o->layers = o->cfg.n_layers;
    o->kv_heads = o->cfg.n_kv_heads;
    o->head_dim = o->cfg.head_dim;
    return -1;
}

int kvf_cmd_kvcalc(int argc, char **argv)
{
    kvcalc_opts_t o;
    int rc = parse_kvcalc_opts(argc, argv, &o);
    if (rc < 0)
        rc = resolve_geometry(argv[0], &o);
    if (rc >= 0)
        return rc;
    kvf_kv_geometry_t geo = {.n_layers = o.layers, .n_kv_heads = o.kv_heads,
                             .head_dim = o.head_dim, .block_size = 1, .dtype = o.dtype};
    uint64_t per_token = kvf_kv_bytes_per_token(&geo);
    uint64_t per_request = per_token * (uint64_t)o.context;
    uint64_t per_batch = per_request * (uint64_t)o.batch;
    if (o.model_dir)
        printf("%-22s %s (%s)\n", "model", o.model_dir, o.cfg.arch_name);
    printf("%-22s layers %d, kv_heads %d, head_dim %d, kv dtype %s (%zu bytes%s)\n", "geometry",
           o.layers, o.kv_heads, o.head_dim, kvf_kv_dtype_name(o.dtype),
           kvf_kv_elem_bytes(o.dtype), kvf_kv_scaled(o.dtype) ? " + a 4-byte scale per row" : "");
    printf("%-22s context %d tokens, batch %d\n", "load", o.context, o.batch);
    print_bytes("kv_bytes_per_token", per_token);
    print_bytes("kv_bytes_per_request", per_request);
    print_bytes("kv_bytes_batch", per_batch);
    if (!o.model_dir)
        return 0;
    uint64_t weights;
    kvf_status_t st = weight_bytes(o.model_dir, &weights);
    if (st != KVF_OK) {
        fprintf(stderr, "%s: cannot size the weights of %s: %s\n", argv[0], o.model_dir,
                kvf_status_str(st));
        return 1;
    }
    print_bytes("weight_bytes", weights);
    printf("%-22s %.4f\n", "kv_batch_per_weight", (double)per_batch / (double)weights);
    return 0;
}
