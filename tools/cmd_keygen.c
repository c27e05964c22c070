/* kvf keygen PATH: writes a new cluster key file (kvf/auth.h) for
 * --cluster-key-file. */
#include <stdio.h>

#include "commands.h"
#include "kvf/auth.h"
#include "kvf/flags.h"

int kvf_cmd_keygen(int argc, char **argv)
{
    const char *path[1] = {NULL};
    kvf_flagset_t set = {
        .prog = argv[0],
        .usage = "PATH",
        .summary = "Writes a new cluster key: 32 random bytes in a new file PATH of mode 0600 (an\n"
                   "existing file is never overwritten). Give the same file to the router, every\n"
                   "node and every client as --cluster-key-file PATH (or KVF_CLUSTER_KEY_FILE).",
        .positional = path,
        .max_positional = 1,
    };
    int rc = kvf_flags_parse(&set, argc, argv);
    if (rc != KVF_FLAGS_RUN)
        return rc == KVF_FLAGS_EXIT ? 0 : 2;
    if (set.n_positional != 1) {
        fprintf(stderr, "%s: needs PATH (see --help)\n", argv[0]);
        return 2;
    }
    if (kvf_auth_write_key_file(path[0]) != KVF_OK)
        return 1;
    fprintf(stderr, "%s: wrote %s\n", argv[0], path[0]);
    return 0;
}
