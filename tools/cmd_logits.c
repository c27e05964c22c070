/* kvf logits: the last position's logits of a prompt, as one JSON array. */
#include "commands.h"
#include "kvf/backend_flags.h"
#include "kvf/flags.h"
#include "local_engine.h"

#include <stdio.h>
#include <stdlib.h>

int kvf_cmd_logits(int argc, char **argv)
{
    const char *model_dir = NULL, *prompt_ids = NULL;
    int threads = 0;
    kvf_backend_flags_t bf = {0};
    const kvf_flag_t flags[] = {
        {"model", KVF_FLAG_STRING, &model_dir, "DIR", "Hugging Face model directory", NULL},
        {"prompt-ids", KVF_FLAG_STRING, &prompt_ids, "IDS", "comma-separated token ids", NULL},
        {"threads", KVF_FLAG_INT, &threads, "N", "compute threads (default: all cores)", NULL},
        KVF_BACKEND_FLAG_ENTRIES(&bf),
        KVF_KV_DTYPE_FLAG_ENTRY(&bf),
    };
    kvf_flagset_t set = {
        .prog = argv[0],
        .usage = "--model DIR --prompt-ids 1,2,3",
        .summary = "Runs the prompt through the model and prints the logits of its last position "
                   "as one JSON array (vocab_size numbers).",
        .flags = flags,
        .n_flags = KVF_NFLAGS(flags),
    };
    int rc = kvf_flags_parse(&set, argc, argv);
    if (rc == KVF_FLAGS_EXIT)
        return 0;
    if (rc < 0)
        return 2;
    if (!model_dir || !prompt_ids) {
        fprintf(stderr, "%s: needs --model DIR and --prompt-ids IDS (see --help)\n", argv[0]);
        return 2;
    }
    uint32_t *ids;
    size_t n;
    if (kvf_parse_id_list(prompt_ids, &ids, &n) != KVF_OK) {
        fprintf(stderr, "%s: --prompt-ids: not a comma-separated list of ids: %s\n", argv[0],
                prompt_ids);
        return 2;
    }
    kvf_local_engine_t le;
    rc = 1;
    if (kvf_local_engine_init(&le, argv[0], model_dir, threads, &bf, (uint32_t)n) != KVF_OK)
        goto fail_engine;
    kvf_status_t st = kvf_local_engine_feed(&le, ids, (uint32_t)n);
    if (st != KVF_OK) {
        fprintf(stderr, "%s: forward pass failed: %s\n", argv[0], kvf_status_str(st));
    } else {
        putchar('[');
        for (int i = 0; i < le.rt.model->cfg.vocab; i++)
            printf("%s%.9g", i ? ", " : "", le.logits[i]);
        printf("]\n");
        rc = 0;
    }
    kvf_local_engine_fini(&le);
fail_engine:
    free(ids);
    return rc;
}
