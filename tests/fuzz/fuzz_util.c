/* Scratch files and logging for the fuzz harnesses (see fuzz.h). */
#include "fuzz.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvf/log.h"

void kvf_fuzz_quiet(void)
{
    static int done;
    if (!done) {
        kvf_log_set_level(KVF_LOG_OFF);
        done = 1;
    }
}

static char fuzz_dir[64];

/* At exit: removes the scratch directory and the files written in it. */
static void remove_dir(void)
{
    DIR *d = opendir(fuzz_dir);
    if (d) {
        struct dirent *e;
        char path[sizeof(fuzz_dir) + 256];
        while ((e = readdir(d)))
            if (e->d_name[0] != '.') {
                snprintf(path, sizeof(path), "%s/%s", fuzz_dir, e->d_name);
                unlink(path);
            }
        closedir(d);
    }
    rmdir(fuzz_dir);
}

const char *kvf_fuzz_write(const char *name, const uint8_t *data, size_t size)
{
    char *dir = fuzz_dir;
    if (!dir[0]) {
        snprintf(dir, sizeof(fuzz_dir), "/tmp/kvf-fuzz-%ld", (long)getpid());
        if (mkdir(dir, 0700) == 0)
            atexit(remove_dir);
    }
    char path[128];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f)
        return NULL;
    int ok = fwrite(data, 1, size, f) == size;
    if (fclose(f) != 0 || !ok)
        return NULL;
    return dir;
}
