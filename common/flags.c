#include "kvf/flags.h"
#include "kvf/backend.h"
#include "kvf/gpu.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

kvf_status_t kvf_parse_size(const char *text, uint64_t *bytes_p)
{
    if (!text || !*text)
        return KVF_ERR_INVAL;
    errno = 0;
    char *end;
    double v = strtod(text, &end);
    if (errno || end == text || v < 0 || !isfinite(v))
        return KVF_ERR_INVAL;
    double mult = 1;
    switch (toupper((unsigned char)*end)) {
    case 'K': mult = 1024.0; end++; break;
    case 'M': mult = 1024.0 * 1024; end++; break;
    case 'G': mult = 1024.0 * 1024 * 1024; end++; break;
    case 'T': mult = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (mult > 1 && (strcasecmp(end, "iB") == 0 || strcasecmp(end, "B") == 0))
        end += strlen(end);
    else if (mult == 1 && strcasecmp(end, "B") == 0)
        end++;
    if (*end)
        return KVF_ERR_INVAL;
    double bytes = v * mult;
    if (bytes > 1.8e19)
        return KVF_ERR_INVAL;
    *bytes_p = (uint64_t)bytes;
    return KVF_OK;
}

kvf_status_t kvf_parse_id_list(const char *text, uint32_t **ids_p, size_t *n_p)
{
    size_t cap = 1;
    for (const char *p = text; *p; p++)
        cap += *p == ',';
    uint32_t *ids = malloc(cap * sizeof(*ids));
    if (!ids)
        return KVF_ERR_NOMEM;
    size_t n = 0;
    const char *p = text;
    while (*p) {
        while (isspace((unsigned char)*p))
            p++;
        if (!isdigit((unsigned char)*p))
            goto fail_parse;
        errno = 0;
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (errno || v > UINT32_MAX)
            goto fail_parse;
        ids[n++] = (uint32_t)v;
        p = end;
        while (isspace((unsigned char)*p))
            p++;
        if (*p == ',') {
            p++;
            if (!*p)
                goto fail_parse;
        } else if (*p) {
            goto fail_parse;
        }
    }
    if (n == 0)
        goto fail_parse;
    *ids_p = ids;
    *n_p = n;
    return KVF_OK;
fail_parse:
    free(ids);
    return KVF_ERR_INVAL;
}

static const kvf_flag_t *find_flag(const kvf_flagset_t *set, const char *name, size_t len,
                                   bool *negated_p)
{
    *negated_p = false;
    for (size_t i = 0; i < set->n_flags; i++) {
        const kvf_flag_t *f = &set->flags[i];
        if (strlen(f->name) == len && strncmp(f->name, name, len) == 0)
            return f;
    }
    if (len > 3 && strncmp(name, "no-", 3) == 0) {
        for (size_t i = 0; i < set->n_flags; i++) {
            const kvf_flag_t *f = &set->flags[i];
            if (f->type == KVF_FLAG_BOOL && strlen(f->name) == len - 3 &&
                strncmp(f->name, name + 3, len - 3) == 0) {
                *negated_p = true;
                return f;
            }
        }
    }
    return NULL;
}

/* Stores text into the flag's variable; prints the problem on failure. */
static kvf_status_t set_value(const kvf_flagset_t *set, const kvf_flag_t *f, const char *text,
                              const char *origin)
{
    char *end = NULL;
    errno = 0;
    switch (f->type) {
    case KVF_FLAG_BOOL:
        if (!strcmp(text, "1") || !strcasecmp(text, "true") || !strcasecmp(text, "yes") ||
            !strcasecmp(text, "on")) {
            *(bool *)f->value = true;
        } else if (!strcmp(text, "0") || !strcasecmp(text, "false") ||
                   !strcasecmp(text, "no") || !strcasecmp(text, "off")) {
            *(bool *)f->value = false;
        } else {
            goto fail_bad;
        }
        break;
    case KVF_FLAG_INT: {
        long v = strtol(text, &end, 10);
        if (errno || end == text || *end || v < -2147483647L || v > 2147483647L)
            goto fail_bad;
        *(int *)f->value = (int)v;
        break;
    }
    case KVF_FLAG_UINT64: {
        if (text[0] == '-')
            goto fail_bad;
        unsigned long long v = strtoull(text, &end, 10);
        if (errno || end == text || *end)
            goto fail_bad;
        *(uint64_t *)f->value = (uint64_t)v;
        break;
    }
    case KVF_FLAG_SIZE:
        if (kvf_parse_size(text, (uint64_t *)f->value) != KVF_OK)
            goto fail_bad;
        break;
    case KVF_FLAG_DOUBLE: {
        double v = strtod(text, &end);
        if (errno || end == text || *end || !isfinite(v))
            goto fail_bad;
        *(double *)f->value = v;
        break;
    }
    case KVF_FLAG_STRING:
        *(const char **)f->value = text;
        break;
    }
    if (f->seen)
        *f->seen = true;
    return KVF_OK;
fail_bad:
    fprintf(stderr, "%s: invalid value '%s' for --%s (%s)\n", set->prog, text, f->name, origin);
    return KVF_ERR_INVAL;
}

static kvf_status_t apply_env(const kvf_flagset_t *set)
{
    for (size_t i = 0; i < set->n_flags; i++) {
        const kvf_flag_t *f = &set->flags[i];
        char name[128] = "KVF_";
        size_t n = 4;
        for (const char *p = f->name; *p && n + 1 < sizeof(name); p++)
            name[n++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
        name[n] = '\0';
        const char *v = getenv(name);
        if (v && *v) {
            kvf_status_t st = set_value(set, f, v, name);
            if (st != KVF_OK)
                return st;
        }
    }
    return KVF_OK;
}

int kvf_flags_parse(kvf_flagset_t *set, int argc, char **argv)
{
    set->n_positional = 0;
    if (set->env) {
        kvf_status_t st = apply_env(set);
        if (st != KVF_OK)
            return st;
    }
    bool only_positional = false;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (only_positional || arg[0] != '-' || arg[1] == '\0') {
            if (set->n_positional >= set->max_positional) {
                fprintf(stderr, "%s: unexpected argument '%s' (see --help)\n", set->prog, arg);
                return KVF_ERR_INVAL;
            }
            set->positional[set->n_positional++] = arg;
            continue;
        }
        if (!strcmp(arg, "--")) {
            only_positional = true;
            continue;
        }
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            kvf_flags_print_help(set);
            return KVF_FLAGS_EXIT;
        }
        if (!strcmp(arg, "--version")) {
            kvf_flags_print_version(set->prog);
            return KVF_FLAGS_EXIT;
        }
        if (arg[1] != '-') {
            fprintf(stderr, "%s: unknown option '%s' (options are long: see --help)\n",
                    set->prog, arg);
            return KVF_ERR_INVAL;
        }
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        bool negated;
        const kvf_flag_t *f = find_flag(set, name, len, &negated);
        if (!f) {
            fprintf(stderr, "%s: unknown option '--%.*s' (see --help)\n", set->prog, (int)len,
                    name);
            return KVF_ERR_INVAL;
        }
        const char *value;
        if (f->type == KVF_FLAG_BOOL && !eq) {
            value = negated ? "false" : "true";
        } else if (negated) {
            fprintf(stderr, "%s: --no-%s takes no value\n", set->prog, f->name);
            return KVF_ERR_INVAL;
        } else if (eq) {
            value = eq + 1;
        } else if (i + 1 < argc) {
            value = argv[++i];
        } else {
            fprintf(stderr, "%s: --%s needs a value (%s)\n", set->prog, f->name,
                    f->metavar ? f->metavar : "VALUE");
            return KVF_ERR_INVAL;
        }
        kvf_status_t st = set_value(set, f, value, "command line");
        if (st != KVF_OK)
            return st;
    }
    return KVF_FLAGS_RUN;
}

static void print_default(const kvf_flag_t *f)
{
    switch (f->type) {
    case KVF_FLAG_BOOL:
        if (*(bool *)f->value)
            printf(" (default: on)");
        break;
    case KVF_FLAG_INT: printf(" (default: %d)", *(int *)f->value); break;
    case KVF_FLAG_UINT64:
    case KVF_FLAG_SIZE:
        if (*(uint64_t *)f->value)
            printf(" (default: %" PRIu64 ")", *(uint64_t *)f->value);
        break;
    case KVF_FLAG_DOUBLE: printf(" (default: %g)", *(double *)f->value); break;
    case KVF_FLAG_STRING:
        if (*(const char **)f->value)
            printf(" (default: %s)", *(const char **)f->value);
        break;
    }
}

void kvf_flags_print_help(const kvf_flagset_t *set)
{
    printf("usage: %s %s\n\n%s\n\noptions:\n", set->prog, set->usage ? set->usage : "[options]",
           set->summary ? set->summary : "");
    for (size_t i = 0; i < set->n_flags; i++) {
        const kvf_flag_t *f = &set->flags[i];
        char left[64];
        if (f->type == KVF_FLAG_BOOL)
            snprintf(left, sizeof(left), "--%s", f->name);
        else
            snprintf(left, sizeof(left), "--%s %s", f->name, f->metavar ? f->metavar : "VALUE");
        printf("  %-26s %s", left, f->help ? f->help : "");
        print_default(f);
        printf("\n");
    }
    printf("  %-26s %s\n  %-26s %s\n", "--help", "print this help and exit", "--version",
           "print the version and GPUs and exit");
    if (set->env)
        printf("\nEvery option can also be set as KVF_<NAME> in the environment "
               "(--kv-mem -> KVF_KV_MEM);\nthe command line wins. KVF_LOG=debug|info|warn|error "
               "sets the log level.\n");
}

void kvf_flags_print_version(const char *prog)
{
    char gpus[1024];
    kvf_gpu_describe(gpus, sizeof(gpus));
    kvf_cpu_isa_t isa = KVF_CPU_ISA_AUTO;
    const char *env = getenv("KVF_CPU_ISA");
    bool forced = env && env[0] && kvf_cpu_isa_resolve(KVF_CPU_ISA_AUTO, &isa) == KVF_OK;
    if (!forced)
        isa = kvf_cpu_isa_best();
    printf("%s %s\ncpu kernels: %s%s (best on this CPU: %s)\n%s\n", prog, KVF_VERSION_STRING,
           kvf_cpu_isa_name(isa), forced ? ", forced by KVF_CPU_ISA" : "",
           kvf_cpu_isa_name(kvf_cpu_isa_best()), gpus);
}
