/* kvf-decode: a decode node of a kvferry cluster. */
#include "kvf/flags.h"
#include "kvf/log.h"

int main(int argc, char **argv)
{
    const char *router_url = NULL;
    const char *listen_url = NULL;
    const char *model_dir = NULL;
    kvf_flag_t flags[] = {
        {"router", KVF_FLAG_STRING, &router_url, "URL", "the router's inbox", NULL},
        {"listen", KVF_FLAG_STRING, &listen_url, "URL", "this node's inbox", NULL},
        {"model", KVF_FLAG_STRING, &model_dir, "DIR", "Hugging Face model directory", NULL},
    };
    kvf_flagset_t set = {
        .prog = "kvf-decode",
        .usage = "--router URL --listen URL --model DIR",
        .summary = "Decode node of a kvferry cluster. This version parses and checks its "
                   "flags only; it does not\nserve yet.",
        .flags = flags,
        .n_flags = KVF_NFLAGS(flags),
        .env = true,
    };
    int rc = kvf_flags_parse(&set, argc, argv);
    if (rc != KVF_FLAGS_RUN)
        return rc == KVF_FLAGS_EXIT ? 0 : 2;
    kvf_log_init("decode", NULL);
    kvf_log_error("kvf-decode does not serve in this version (see --help)");
    return 1;
}
