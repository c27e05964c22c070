/* kvf bench tokenizer-load: loads DIR/tokenizer.json (and its
 * tokenizer_config.json) --runs times and reports the median, minimum and
 * maximum load time and the vocabulary size; the first load also warms the
 * page cache, so a cold start costs reading the file on top. */
#include "bench_tokenizer.h"
#include "bench_util.h"
#include "kvf/clock.h"
#include "kvf/flags.h"
#include "kvf/tokenizer.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>

int kvf_bench_tokenizer_load(int argc, char **argv)
{
    const char *model_dir = NULL, *json = NULL;
    int runs = 9;
    const kvf_flag_t flags[] = {
        {"model", KVF_FLAG_STRING, &model_dir, "DIR", "directory with tokenizer.json", NULL},
        {"runs", KVF_FLAG_INT, &runs, "N", "loads to time (the median is reported)", NULL},
        {"json", KVF_FLAG_STRING, &json, "PATH", "also write the results as JSON", NULL},
    };
    kvf_flagset_t set = {
        .prog = argv[0],
        .usage = "--model DIR [--runs N] [--json PATH]",
        .summary = "Times kvf_tokenizer_load() of DIR's tokenizer.json N times and prints the "
                   "median, minimum and maximum in milliseconds.",
        .flags = flags,
        .n_flags = KVF_NFLAGS(flags),
    };
    int rc = kvf_flags_parse(&set, argc, argv);
    if (rc == KVF_FLAGS_EXIT)
        return 0;
    if (rc < 0)
        return 2;
    if (!model_dir || runs < 1) {
        fprintf(stderr, "%s: needs --model DIR and --runs >= 1 (see --help)\n", argv[0]);
        return 2;
    }
    double *ms = malloc((size_t)runs * sizeof(*ms));
    if (!ms)
        return 1;
    size_t vocab = 0;
    rc = 1;
    for (int i = 0; i < runs; i++) {
        kvf_tokenizer_t *tok;
        uint64_t t0 = kvf_clock_ns();
        kvf_status_t st = kvf_tokenizer_load(model_dir, &tok);
        uint64_t t1 = kvf_clock_ns();
        if (st != KVF_OK) {
            fprintf(stderr, "%s: cannot load the tokenizer of %s: %s\n", argv[0], model_dir,
                    kvf_status_str(st));
            goto done;
        }
        vocab = kvf_tokenizer_vocab_size(tok);
        kvf_tokenizer_destroy(tok);
        ms[i] = (double)(t1 - t0) / 1e6;
    }
    double min = ms[0], max = ms[0];
    for (int i = 1; i < runs; i++) {
        min = ms[i] < min ? ms[i] : min;
        max = ms[i] > max ? ms[i] : max;
    }
    double median = kvf_bench_median(ms, (size_t)runs);
    printf("tokenizer-load %s: %zu tokens, median %.1f ms (min %.1f, max %.1f) over %d loads\n",
           model_dir, vocab, median, min, max, runs);
    rc = 0;
    if (json) {
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "model", model_dir);
        cJSON_AddNumberToObject(root, "vocab", (double)vocab);
        cJSON_AddNumberToObject(root, "runs", runs);
        cJSON_AddNumberToObject(root, "median_ms", median);
        cJSON_AddNumberToObject(root, "min_ms", min);
        cJSON_AddNumberToObject(root, "max_ms", max);
        rc = kvf_bench_write_json(root, json, argv[0]);
        cJSON_Delete(root);
    }
done:
    free(ms);
    return rc;
}
