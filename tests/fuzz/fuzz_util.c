/* Scratch files and logging for the fuzz harnesses (see fuzz.h). */
#include "fuzz.h"

#include <stdio.h>
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

const char *kvf_fuzz_write(const char *name, const uint8_t *data, size_t size)
{
    static char dir[64];
    if (!dir[0]) {
        snprintf(dir, sizeof(dir), "/tmp/kvf-fuzz-%ld", (long)getpid());
        mkdir(dir, 0700);
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
