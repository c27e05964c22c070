/* Runs every file of the directories named on the command line through
 * LLVMFuzzerTestOneInput: a harness's corpus as a plain test where there is
 * no libFuzzer (gcc builds). Fails only when a file cannot be read; a
 * crash in the harness fails the test by itself. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>

#include "fuzz.h"

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? 2 * cap : 4096;
            uint8_t *nb = realloc(buf, cap);
            if (!nb)
                break;
            buf = nb;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        if (got == 0)
            break;
        len += got;
    }
    int err = ferror(f);
    fclose(f);
    if (!err && buf)
        LLVMFuzzerTestOneInput(buf, len);
    free(buf);
    return err || !buf ? -1 : 0;
}

static int run_dir(const char *dir, unsigned *n_p)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "replay: cannot open %s\n", dir);
        return -1;
    }
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (run_file(path) != 0) {
            fprintf(stderr, "replay: cannot read %s\n", path);
            rc = -1;
            continue;
        }
        (*n_p)++;
    }
    closedir(d);
    return rc;
}

int main(int argc, char **argv)
{
    unsigned n = 0;
    int rc = 0;
    for (int i = 1; i < argc; i++)
        if (run_dir(argv[i], &n) != 0)
            rc = 1;
    printf("replay: ran %u inputs\n", n);
    return rc || n == 0;
}
