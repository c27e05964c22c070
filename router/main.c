/* kvf-router: the client-facing process of a kvferry cluster. */
#include "kvf/flags.h"
#include "kvf/log.h"

#include <stdio.h>

int main(int argc, char **argv)
{
    const char *listen_url = "tcp://127.0.0.1:5555";
    const char *client_url = "tcp://127.0.0.1:5556";
    const char *model_dir = NULL;
    kvf_flag_t flags[] = {
        {"listen", KVF_FLAG_STRING, &listen_url, "URL", "inbox the nodes send to", NULL},
        {"client", KVF_FLAG_STRING, &client_url, "URL", "native client socket", NULL},
        {"model", KVF_FLAG_STRING, &model_dir, "DIR", "model directory (tokenizer, config)",
         NULL},
    };
    kvf_flagset_t set = {
        .prog = "kvf-router",
        .usage = "--listen URL --client URL --model DIR",
        .summary = "Router of a kvferry cluster: keeps the node registry, schedules requests "
                   "onto prefill and decode\nnodes and streams tokens to clients. This version "
                   "parses and checks its flags only; it does not\nserve yet.",
        .flags = flags,
        .n_flags = KVF_NFLAGS(flags),
        .env = true,
    };
    int rc = kvf_flags_parse(&set, argc, argv);
    if (rc != KVF_FLAGS_RUN)
        return rc == KVF_FLAGS_EXIT ? 0 : 2;
    kvf_log_init("router", NULL);
    kvf_log_error("kvf-router does not serve in this version (see --help)");
    return 1;
}
