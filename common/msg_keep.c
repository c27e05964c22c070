/* Messages a loop reads during a long compute and keeps for later
 * (kvf/msg.h, kvf_inbox_keep). */
#include "kvf/array.h"
#include "kvf/log.h"
#include "kvf/msg.h"

#include <stdlib.h>

void kvf_inbox_keep(kvf_inbox_t *inbox, kvf_kept_t *kept, int urgent_body, kvf_envelope_fn urgent,
                    void *arg)
{
    while (kept->n < KVF_KEPT_MAX) {
        kvf_envelope_t *env = NULL;
        kvf_status_t st = kvf_inbox_recv(inbox, 0, &env);
        if (st == KVF_ERR_AGAIN || st == KVF_ERR_TIMEOUT)
            return;
        if (st != KVF_OK)
            continue; /* dropped and counted by the inbox */
        if ((int)env->body_case == urgent_body) {
            urgent(arg, env);
            continue;
        }
        if (kvf_array_reserve(&kept->envs, &kept->cap, kept->n + 1, 16, sizeof(*kept->envs)) !=
            KVF_OK) {
            kvf_log_warn("no memory to keep a %s message: dropped", kvf_envelope_body_name(env));
            kvf_envelope_free(env);
            continue;
        }
        kept->envs[kept->n++] = env;
    }
}

void kvf_kept_handle(kvf_kept_t *kept, kvf_envelope_fn fn, void *arg)
{
    /* fn runs no compute that keeps more, so nothing is added meanwhile. */
    size_t n = kept->n;
    kept->n = 0;
    for (size_t i = 0; i < n; i++)
        fn(arg, kept->envs[i]);
}

void kvf_kept_free(kvf_kept_t *kept)
{
    for (size_t i = 0; i < kept->n; i++)
        kvf_envelope_free(kept->envs[i]);
    free(kept->envs);
    kept->envs = NULL;
    kept->n = kept->cap = 0;
}
