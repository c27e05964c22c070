/* Helpers of the kvf bench commands. See bench_util.h. */
#include "bench_util.h"

#include "kvf/clock.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double kvf_bench_median(double *v, size_t n)
{
    qsort(v, n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void kvf_bench_percentiles(double *v, size_t n, double out[3])
{
    if (!n) {
        out[0] = out[1] = out[2] = NAN;
        return;
    }
    qsort(v, n, sizeof(*v), cmp_double);
    static const double q[3] = {0.50, 0.90, 0.99};
    for (int i = 0; i < 3; i++) {
        size_t k = (size_t)ceil(q[i] * (double)n) - 1;
        out[i] = v[k < n ? k : n - 1];
    }
}

int kvf_bench_write_json(const cJSON *root, const char *path, const char *prog)
{
    char *text = cJSON_Print(root);
    FILE *f = text ? fopen(path, "w") : NULL;
    int rc = 0;
    if (!f || fputs(text, f) < 0 || fputc('\n', f) == EOF)
        rc = 1;
    if (f && fclose(f) != 0)
        rc = 1;
    if (rc)
        fprintf(stderr, "%s: cannot write %s\n", prog, path);
    free(text);
    return rc;
}

void kvf_bench_random_tokens(uint32_t *tokens, size_t n, int vocab)
{
    uint32_t seed = 12345;
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        tokens[i] = (seed >> 8) % (uint32_t)vocab;
    }
}

double kvf_bench_step_weight_bytes(const kvf_model_config_t *c, double total_bytes,
                                   size_t elem_bytes)
{
    double bytes = total_bytes;
    if (!c->tie_embeddings)
        bytes -= (double)c->vocab * c->hidden * (double)elem_bytes;
    return bytes > 0 ? bytes : 0;
}

int kvf_bench_reap(pid_t pid, uint64_t deadline_ns, unsigned poll_ms)
{
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (kvf_clock_ns() > deadline_ns) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            break;
        }
        kvf_clock_sleep_ms(poll_ms);
    }
    return status;
}

int kvf_bench_parse_levels(const char *text, bool integers, double *out, int max)
{
    int n = 0;
    const char *p = text;
    for (;;) {
        char *end;
        errno = 0;
        double v = strtod(p, &end);
        if (end == p || errno || !(v > 0) || !isfinite(v) || n == max ||
            (integers && (v != floor(v) || v > 1e6)))
            return -1;
        out[n++] = v;
        if (*end == '\0')
            return n;
        if (*end != ',')
            return -1;
        p = end + 1;
    }
}
