/* kvf bench transfer: ships batches of KV slices between two processes with
 * the transfer API and compares the bandwidth with ucx_perftest's
 * ucp_put_bw at the same slice size and transport, measured in the same run
 * (docs/DESIGN.md, "Measuring performance").
 *
 * Method. This process is the sender; it re-executes itself with --serve as
 * the receiver. A batch is `batch` puts of `slice` bytes, then the flush and
 * the completion message; batches run one after another (post, wait).
 *  - GB/s (the ratio's basis) uses the memory ucx_perftest uses: every put
 *    of a batch goes from the same local to the same remote slot, as
 *    perftest puts its one buffer again and again, so the ratio measures
 *    what the transfer layer adds (flush, completion, bookkeeping).
 *  - "spread GB/s" puts every slice of a batch in its own slot (local
 *    offsets ascending, remote ones descending: nothing coalesces), so
 *    large batches leave the caches as real KV transfers do.
 * On a shared 2-core machine other tenants preempt either process for whole
 * scheduler ticks, and a mean measures them: GB/s (the ratio's basis) comes
 * from the median batch time (the mean is printed beside it), and the
 * ceiling is the best of a few ucx_perftest runs (its overall bandwidth). The fixed cost per batch
 * is the intercept a of a least-squares fit of seconds per batch = a + bytes / B over every cell,
 * each weighted by 1/time^2 so that small and large batches count alike in
 * relative terms. */
#include "bench_transfer.h"
#include "bench_util.h"
#include "transfer_perftest.h"
#include "transfer_receiver.h"

#include "kvf/clock.h"
#include "kvf/crc32c.h"
#include "kvf/flags.h"
#include "kvf/kv_format.h"
#include "kvf/kvcache.h"
#include "kvf/model.h"
#include "kvf/xfer.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A batch's deadline covers the whole batch: 4 GiB over loopback TCP takes
 * seconds. */
#define BENCH_TIMEOUT_MS 120000u

/* ---- the sender ------------------------------------------------------ */

#define MAX_ITERS  200000
#define MAX_SLICES 1024 /* per batch */

/* One transport's run: its settings and the buffers measure() uses. */
typedef struct {
    const char *tls; /* "shm" or "tcp" */
    bool shm, two_sided, quick;
    int spin_us;     /* the receiver's busy-poll */
    double budget_s; /* per cell and kind */
    kvf_xfer_slice_t *slices; /* (MAX_SLICES) */
    double *samples;          /* (MAX_ITERS) seconds per batch */
} tls_run_t;

/* Mean seconds per batch of n slices of slice bytes (see the method
 * above), the median in *median_p. */
static double measure(tls_run_t *t, kvf_xfer_peer_t *peer, uint64_t slice, int n, bool spread,
                      double *median_p, int *iters_p)
{
    kvf_xfer_slice_t *slices = t->slices;
    double *samples = t->samples;
    uint64_t slots = KVF_BENCH_XFER_POOL / slice;
    for (int i = 0; i < n; i++) {
        uint64_t k = spread ? (uint64_t)i % slots : 0;
        slices[i] = (kvf_xfer_slice_t){k * slice, (slots - 1 - k) * slice, slice};
    }
    kvf_xfer_batch_spec_t spec = {.req_id = 1, .epoch = 1, .slices = slices, .n_slices = (size_t)n};
    uint64_t t_start = 0;
    int iters = 0;
    /* Batches of 256 MiB and more take up to seconds over TCP: fewer of
     * them keep the whole run within a few minutes. */
    bool huge = (uint64_t)n * slice >= (256u << 20);
    int min_iters = huge ? 2 : 3;
    for (int it = huge ? -1 : -2;; it++) { /* warm-up batches first */
        uint64_t t0 = kvf_clock_ns();
        if (it == 0)
            t_start = t0;
        kvf_xfer_batch_t *b;
        kvf_status_t st = kvf_xfer_post(peer, &spec, &b);
        if (st == KVF_OK) {
            st = kvf_xfer_wait(b, -1);
            kvf_xfer_batch_release(b);
        }
        if (st != KVF_OK) {
            fprintf(stderr, "kvf bench transfer: batch failed: %s\n", kvf_status_str(st));
            return -1;
        }
        uint64_t t1 = kvf_clock_ns();
        if (it < 0)
            continue;
        samples[iters++] = (double)(t1 - t0) / 1e9;
        if ((iters >= min_iters && (double)(t1 - t_start) / 1e9 >= t->budget_s) ||
            iters >= MAX_ITERS)
            break;
    }
    double total = 0;
    for (int i = 0; i < iters; i++)
        total += samples[i];
    *median_p = kvf_bench_median(samples, (size_t)iters);
    *iters_p = iters;
    return total / iters;
}

typedef struct {
    const char *tls;
    bool two_sided;
    uint64_t slice;
    int batch;
    double sec;       /* median seconds per batch */
    double gbps;      /* from the median: the ratio's basis */
    double gbps_mean; /* from the mean, other tenants' preemptions included */
    double perf_gbps, spread_gbps;
} row_t;

/* Weighted least squares of sec = a + bytes / B; a in seconds, B in B/s. */
static void fit(const row_t *rows, int n, double *a_p, double *bw_p)
{
    double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (int i = 0; i < n; i++) {
        double x = (double)rows[i].slice * rows[i].batch, y = rows[i].sec;
        double w = 1.0 / (y * y);
        sw += w;
        sx += w * x;
        sy += w * y;
        sxx += w * x * x;
        sxy += w * x * y;
    }
    double b = (sw * sxy - sx * sy) / (sw * sxx - sx * sx);
    *a_p = (sy - b * sx) / sw;
    *bw_p = b > 0 ? 1.0 / b : 0;
}

static void print_size(char *buf, size_t len, uint64_t bytes)
{
    if (bytes >= (1u << 20))
        snprintf(buf, len, "%" PRIu64 "M", bytes >> 20);
    else
        snprintf(buf, len, "%" PRIu64 "K", bytes >> 10);
}

typedef struct {
    double fixed_us, fit_gbps, min_ratio_64k, crc_gbps, crc_batch_gbps, crc_nocrc_gbps;
    int ok;
} tls_result_t;

/* A receiver process and this process's transfer endpoint connected to it. */
typedef struct {
    kvf_bench_receiver_t r;
    kvf_xfer_t *x;
    kvf_xfer_peer_t *peer;
} sender_t;

/* Starts a receiver (CRC32C required with checksum) and connects to it.
 * Returns 0; -1 when the receiver did not start; -2 when the connection
 * failed (the receiver runs: sender_close() stops it). */
static int sender_open(sender_t *s, const tls_run_t *t, bool checksum)
{
    s->x = NULL;
    s->peer = NULL;
    if (kvf_bench_receiver_start(&s->r, checksum, t->two_sided, t->spin_us) != 0)
        return -1;
    kvf_xfer_config_t cfg = {.backend = KVF_XFER_UCX,
                             .pool_bytes = KVF_BENCH_XFER_POOL,
                             .geometry = kvf_bench_xfer_geom,
                             .timeout_ms = BENCH_TIMEOUT_MS,
                             .checksum = checksum};
    if (kvf_xfer_create(&cfg, &s->x) != KVF_OK ||
        kvf_xfer_connect(s->x, s->r.desc, s->r.desc_len, &s->peer) != KVF_OK)
        return -2;
    return 0;
}

/* Closes the endpoint and stops the receiver: 0, or -1 when the receiver
 * reported a problem. */
static int sender_close(sender_t *s)
{
    kvf_xfer_destroy(s->x);
    s->x = NULL;
    return kvf_bench_receiver_stop(&s->r);
}

/* Sets UCX_TLS for the transport and picks the receiver's spin and the
 * transfer mode; prints both. */
static void tls_run_init(tls_run_t *t, const char *tls_name, const char *mode, bool quick)
{
    memset(t, 0, sizeof(*t));
    t->shm = !strcmp(tls_name, "shm");
    t->tls = t->shm ? "shm" : "tcp";
    t->quick = quick;
    t->budget_s = quick ? 0.03 : 0.1;
    /* KVF_BENCH_UCX_TLS narrows the transports (e.g. "posix,self"). */
    const char *over = getenv("KVF_BENCH_UCX_TLS");
    setenv("UCX_TLS", over ? over : t->shm ? "sm,self" : "tcp,self", 1);
    setenv("UCX_NET_DEVICES", "lo", 1); /* TCP on the loopback only */
    printf("\n== %s (UCX_TLS=%s) ==\n", tls_name, getenv("UCX_TLS"));
    /* The receiver's CPU carries TCP puts but not shared-memory ones (those
     * are the sender's copies); there it only drains completion messages,
     * and a spinning receiver would take the sender's core on a 2-core
     * machine. */
    t->spin_us = t->shm ? 50 : 5000;
    /* Shared memory: one-sided puts. TCP: two-sided, as deployments use it
     * there (see kvf_xfer_config_t.two_sided); --mode overrides. */
    t->two_sided = !strcmp(mode, "am") || (!strcmp(mode, "auto") && !t->shm);
    printf("mode: %s\n", t->two_sided ? "two-sided (active messages)" : "one-sided (rma put)");
    t->slices = malloc(MAX_SLICES * sizeof(*t->slices));
    t->samples = malloc(MAX_ITERS * sizeof(*t->samples));
}

/* One cell of the grid: batches of n slices of slice bytes, into one slot
 * and spread; fills *row and prints it. Returns -1 when a batch failed. */
static int measure_cell(tls_run_t *t, kvf_xfer_peer_t *peer, uint64_t slice, int n, double perf,
                        row_t *row, tls_result_t *res)
{
    int iters = 0;
    double med = 0, med_spread = 0;
    double sec = measure(t, peer, slice, n, false, &med, &iters);
    /* Spread batches larger than the pool would only wrap round it. */
    double bytes = (double)slice * n;
    double spread = sec < 0                      ? -1
                    : bytes > (double)KVF_BENCH_XFER_POOL ? 0
                                                 : measure(t, peer, slice, n, true, &med_spread,
                                                           &iters);
    if (sec < 0 || spread < 0)
        return -1;
    *row = (row_t){.tls = t->tls,
                   .two_sided = t->two_sided,
                   .slice = slice,
                   .batch = n,
                   .sec = med,
                   .gbps = bytes / med / 1e9,
                   .gbps_mean = bytes / sec / 1e9,
                   .perf_gbps = perf,
                   .spread_gbps = spread > 0 ? bytes / med_spread / 1e9 : NAN};
    double ratio = perf > 0 ? row->gbps / perf : NAN;
    if (slice >= 65536 && ratio < res->min_ratio_64k)
        res->min_ratio_64k = ratio;
    char sz[16];
    print_size(sz, sizeof(sz), slice);
    char spread_txt[32] = "-";
    if (spread > 0)
        snprintf(spread_txt, sizeof(spread_txt), "%.2f", row->spread_gbps);
    printf("%8s %6d %10.1f %10.1f %8.2f %10.2f %10.2f %6.0f%% %12s\n", sz, n, med * 1e6,
           sec * 1e6, row->gbps, row->gbps_mean, perf, ratio * 100, spread_txt);
    fflush(stdout);
    return 0;
}

/* Every cell of the grid, each slice size right after its ucx_perftest
 * ceiling; appends rows at rows[*n_rows_p] and fits the fixed cost. */
static int measure_grid(tls_run_t *t, row_t *rows, int *n_rows_p, tls_result_t *res)
{
    static const uint64_t slices_full[] = {4096, 16384, 65536, 262144, 1048576, 4194304};
    static const int batches_full[] = {1, 4, 16, 64, 256, 1024};
    static const uint64_t slices_quick[] = {4096, 65536, 1048576};
    static const int batches_quick[] = {1, 16, 256};
    const uint64_t *sl = t->quick ? slices_quick : slices_full;
    const int *bt = t->quick ? batches_quick : batches_full;
    int ns = t->quick ? 3 : 6, nb = t->quick ? 3 : 6;
    sender_t s;
    int rc = sender_open(&s, t, false);
    if (rc == -1) {
        fprintf(stderr, "kvf bench transfer: the receiver did not start\n");
        return -1;
    }
    if (rc != 0) {
        sender_close(&s);
        return -1;
    }
    memset(kvf_xfer_pool(s.x), 0x6b, KVF_BENCH_XFER_POOL);
    printf("%8s %6s %10s %10s %8s %10s %10s %7s %12s\n", "slice", "batch", "median us", "mean us",
           "GB/s", "mean GB/s", "perftest", "ratio", "spread GB/s");
    int first = *n_rows_p;
    res->min_ratio_64k = INFINITY;
    rc = 0;
    for (int i = 0; i < ns && rc == 0; i++) {
        /* perftest right before our rows of the same size: both see the
         * machine in the same state. Our receiver sleeps meanwhile. */
        double perf = kvf_bench_perftest_gbps(sl[i], t->quick);
        for (int j = 0; j < nb && rc == 0; j++) {
            rc = measure_cell(t, s.peer, sl[i], bt[j], perf, &rows[*n_rows_p], res);
            if (rc == 0)
                (*n_rows_p)++;
        }
    }
    if (rc == 0) {
        double a, bw;
        fit(rows + first, *n_rows_p - first, &a, &bw);
        res->fixed_us = a * 1e6;
        res->fit_gbps = bw / 1e9;
        printf("fit (medians): time per batch = %.2f us + bytes / %.2f GB/s\n", res->fixed_us,
               res->fit_gbps);
        res->ok = 1;
    }
    if (sender_close(&s) != 0)
        fprintf(stderr, "kvf bench transfer: the receiver reported a problem\n");
    return rc;
}

/* Checksum cost: the same batch (16 x 256 KiB) with CRC32C on; the sender
 * computes it before the completion message, the receiver checks it on
 * arrival (off the sender's clock; its rate is the local CRC rate printed
 * beside). rows: the grid's, for the same batch with it off. */
static int measure_checksum(tls_run_t *t, const row_t *rows, int n_rows, tls_result_t *res)
{
    sender_t s;
    int rc = sender_open(&s, t, true);
    if (rc == -1)
        return -1;
    if (rc == 0) {
        int iters;
        double med;
        double sec = measure(t, s.peer, 262144, 16, false, &med, &iters);
        res->crc_batch_gbps = sec > 0 ? 16.0 * 262144 / med / 1e9 : 0;
        for (int k = 0; k < n_rows; k++)
            if (rows[k].slice == 262144 && rows[k].batch == 16 && !strcmp(rows[k].tls, t->tls))
                res->crc_nocrc_gbps = rows[k].gbps;
        uint8_t *pool = kvf_xfer_pool(s.x);
        uint64_t t0 = kvf_clock_ns();
        volatile uint32_t sink = 0; /* keeps the loop from being optimised away */
        for (int k = 0; k < 8; k++)
            sink ^= kvf_crc32c(0, pool, 64u << 20);
        (void)sink;
        res->crc_gbps = 8.0 * (64u << 20) / (double)(kvf_clock_ns() - t0);
        printf("checksum on (16 x 256K): %.2f GB/s", res->crc_batch_gbps);
        if (res->crc_nocrc_gbps > 0)
            printf(" vs %.2f GB/s off", res->crc_nocrc_gbps);
        printf("; crc32c alone %.2f GB/s\n", res->crc_gbps);
    }
    sender_close(&s);
    return 0;
}

/* The grid and the checksum cost over one transport ("shm" or "tcp");
 * appends its rows at rows[*n_rows_p]. */
static int run_tls(const char *tls_name, const char *mode, bool quick, row_t *rows,
                   int *n_rows_p, tls_result_t *res)
{
    tls_run_t t;
    tls_run_init(&t, tls_name, mode, quick);
    int rc = -1;
    if (t.slices && t.samples && measure_grid(&t, rows, n_rows_p, res) == 0)
        rc = measure_checksum(&t, rows, *n_rows_p, res);
    free(t.slices);
    free(t.samples);
    return rc;
}

/* ---- the command ------------------------------------------------------ */

typedef struct {
    const char *tls, *json, *mode;
    const char *kv_dtype, *model_dir; /* what a token of KV weighs, for the summary */
    bool quick;
    bool serve_role, checksum, two_sided; /* the receiver's */
    int spin_us;
} transfer_opts_t;

/* Returns -1 to run, else the exit code (help printed, or a bad flag). */
static int parse_transfer_opts(int argc, char **argv, transfer_opts_t *o)
{
    *o = (transfer_opts_t){.mode = "auto", .spin_us = 5000, .kv_dtype = "f32"};
    const kvf_flag_t flags[] = {
        {"tls", KVF_FLAG_STRING, &o->tls, "shm|tcp", "transport (default: both)", NULL},
        {"json", KVF_FLAG_STRING, &o->json, "FILE", "also write the results as JSON", NULL},
        {"quick", KVF_FLAG_BOOL, &o->quick, NULL, "a small grid with short runs (smoke test)",
         NULL},
        {"mode", KVF_FLAG_STRING, &o->mode, "auto|rma|am",
         "one-sided puts (rma) or two-sided messages (am); auto: rma over shm, am over tcp", NULL},
        {"kv-dtype", KVF_FLAG_STRING, &o->kv_dtype, "f32|bf16|f16|fp8|int8",
         "KV format whose bytes per token the summary reports (tokens/s at the fitted rate)",
         NULL},
        {"model", KVF_FLAG_STRING, &o->model_dir, "DIR",
         "the model whose KV bytes per token the summary reports (default: one layer, one kv "
         "head of head dim 64)",
         NULL},
        {"serve", KVF_FLAG_BOOL, &o->serve_role, NULL, "(internal) run as the receiving process",
         NULL},
        {"two-sided", KVF_FLAG_BOOL, &o->two_sided, NULL, "(with --serve) two-sided receiver",
         NULL},
        {"checksum", KVF_FLAG_BOOL, &o->checksum, NULL, "(with --serve) require CRC32C", NULL},
        {"spin-us", KVF_FLAG_INT, &o->spin_us, "US",
         "(with --serve) busy-poll this long after the last completion before sleeping", NULL},
    };
    kvf_flagset_t set = {
        .prog = argv[0],
        .usage = "[--tls shm|tcp] [--json FILE] [--quick]",
        .summary = "Ships batches of 4 KiB..4 MiB slices (1..1024 per batch) to a second process "
                   "with the transfer API and prints GB/s, the ratio to ucx_perftest ucp_put_bw at "
                   "the same size and transport (measured in the same run), and the fixed cost "
                   "per batch from a fit of time = a + bytes/B.",
        .flags = flags,
        .n_flags = KVF_NFLAGS(flags),
    };
    int rc = kvf_flags_parse(&set, argc, argv);
    if (rc == KVF_FLAGS_EXIT)
        return 0;
    if (rc < 0)
        return 2;
    return -1;
}

/* The KV geometry whose bytes per token the summary reports: --model's,
 * or one layer and one kv head of the bench's head dim; in --kv-dtype.
 * Returns 0, or 2 after a line on stderr. */
static int kv_token_geometry(const char *prog, const transfer_opts_t *o, kvf_kv_geometry_t *geo)
{
    *geo = (kvf_kv_geometry_t){.n_layers = 1, .n_kv_heads = 1,
                               .head_dim = (int)kvf_bench_xfer_geom.head_dim, .block_size = 1};
    if (kvf_kv_dtype_parse(o->kv_dtype, &geo->dtype) != KVF_OK) {
        fprintf(stderr, "%s: --kv-dtype must be f32, bf16, f16, fp8 or int8, not '%s'\n", prog,
                o->kv_dtype);
        return 2;
    }
    if (!o->model_dir)
        return 0;
    kvf_model_config_t cfg;
    if (kvf_model_config_load(o->model_dir, &cfg) != KVF_OK) {
        fprintf(stderr, "%s: cannot read %s/config.json\n", prog, o->model_dir);
        return 2;
    }
    geo->n_layers = cfg.n_layers;
    geo->n_kv_heads = cfg.n_kv_heads;
    geo->head_dim = cfg.head_dim;
    return 0;
}

static void print_summary(const char *const *list, int nt, const tls_result_t *res,
                          const kvf_kv_geometry_t *kv)
{
    size_t per_token = kvf_kv_bytes_per_token(kv);
    printf("\nsummary (KV %s: %zu bytes per token of %d layers x %d kv heads x head dim %d):\n",
           kvf_kv_dtype_name(kv->dtype), per_token, kv->n_layers, kv->n_kv_heads, kv->head_dim);
    for (int t = 0; t < nt; t++)
        if (res[t].ok)
            printf("  %s: fixed cost %.2f us/batch, fitted %.2f GB/s (%.0f KV tokens/s), lowest "
                   "ratio for slices >= 64 KiB %.0f%%\n",
                   list[t], res[t].fixed_us, res[t].fit_gbps,
                   res[t].fit_gbps * 1e9 / (double)per_token, res[t].min_ratio_64k * 100);
}

static cJSON *row_json(const row_t *row)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "tls", row->tls);
    cJSON_AddStringToObject(o, "mode", row->two_sided ? "am" : "rma");
    cJSON_AddNumberToObject(o, "slice_bytes", (double)row->slice);
    cJSON_AddNumberToObject(o, "batch", row->batch);
    cJSON_AddNumberToObject(o, "gbps", row->gbps);
    cJSON_AddNumberToObject(o, "gbps_mean", row->gbps_mean);
    cJSON_AddNumberToObject(o, "perftest_gbps", row->perf_gbps);
    if (isnan(row->spread_gbps))
        cJSON_AddNullToObject(o, "spread_gbps"); /* batch larger than the pool */
    else
        cJSON_AddNumberToObject(o, "spread_gbps", row->spread_gbps);
    if (row->perf_gbps > 0)
        cJSON_AddNumberToObject(o, "ratio", row->gbps / row->perf_gbps);
    else
        cJSON_AddNullToObject(o, "ratio");
    return o;
}

/* The rows and each transport's fit and checksum rates, as --json FILE. */
static int write_results_json(const char *path, const char *prog, const row_t *rows, int n_rows,
                              const char *const *list, int nt, const tls_result_t *res,
                              const kvf_kv_geometry_t *kv)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "kv_dtype", kvf_kv_dtype_name(kv->dtype));
    cJSON_AddNumberToObject(root, "kv_bytes_per_token", (double)kvf_kv_bytes_per_token(kv));
    cJSON *arr = cJSON_AddArrayToObject(root, "rows");
    for (int i = 0; i < n_rows; i++)
        cJSON_AddItemToArray(arr, row_json(&rows[i]));
    cJSON *fc = cJSON_AddObjectToObject(root, "fixed_cost_us");
    cJSON *fb = cJSON_AddObjectToObject(root, "fit_gbps");
    cJSON *ck = cJSON_AddObjectToObject(root, "checksum_gbps");
    for (int t = 0; t < nt; t++) {
        if (!res[t].ok)
            continue;
        cJSON_AddNumberToObject(fc, list[t], res[t].fixed_us);
        cJSON_AddNumberToObject(fb, list[t], res[t].fit_gbps);
        cJSON *c = cJSON_AddObjectToObject(ck, list[t]);
        cJSON_AddNumberToObject(c, "batch_16x256k_on", res[t].crc_batch_gbps);
        cJSON_AddNumberToObject(c, "batch_16x256k_off", res[t].crc_nocrc_gbps);
        cJSON_AddNumberToObject(c, "crc32c_alone", res[t].crc_gbps);
    }
    int rc = kvf_bench_write_json(root, path, prog);
    cJSON_Delete(root);
    return rc;
}

int kvf_bench_transfer(int argc, char **argv)
{
    transfer_opts_t o;
    int rc = parse_transfer_opts(argc, argv, &o);
    if (rc >= 0)
        return rc;
    if (o.serve_role)
        return kvf_bench_xfer_serve(o.checksum, o.two_sided, o.spin_us);
    if (strcmp(o.mode, "auto") && strcmp(o.mode, "rma") && strcmp(o.mode, "am")) {
        fprintf(stderr, "%s: --mode must be auto, rma or am, not '%s'\n", argv[0], o.mode);
        return 2;
    }
    kvf_kv_geometry_t kv;
    if (kv_token_geometry(argv[0], &o, &kv) != 0)
        return 2;
    const char *list[2];
    int nt = 0;
    if (!o.tls || !strcmp(o.tls, "shm"))
        list[nt++] = "shm";
    if (!o.tls || !strcmp(o.tls, "tcp"))
        list[nt++] = "tcp";
    if (!nt) {
        fprintf(stderr, "%s: --tls must be shm or tcp, not '%s'\n", argv[0], o.tls);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    row_t *rows = calloc(2 * 36, sizeof(*rows));
    if (!rows)
        return 1;
    int n_rows = 0;
    tls_result_t res[2] = {{0}};
    int fails = 0;
    for (int t = 0; t < nt; t++)
        if (run_tls(list[t], o.mode, o.quick, rows, &n_rows, &res[t]) != 0)
            fails++;
    print_summary(list, nt, res, &kv);
    if (o.json)
        fails += write_results_json(o.json, argv[0], rows, n_rows, list, nt, res, &kv);
    free(rows);
    return fails ? 1 : 0;
}
