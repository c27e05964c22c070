/* Token sampling. See kvf/sampling.h. */
#include "kvf/sampling.h"

#include <math.h>
#include <stdlib.h>

kvf_sampling_params_t kvf_sampling_defaults(void)
{
    kvf_sampling_params_t p = {.temperature = 0, .top_k = 0, .top_p = 1, .seed = 0};
    return p;
}

kvf_status_t kvf_sampling_validate(const kvf_sampling_params_t *p)
{
    if (!(p->temperature >= 0) || !isfinite(p->temperature) || p->top_k < 0 ||
        !(p->top_p > 0 && p->top_p <= 1))
        return KVF_ERR_INVAL;
    return KVF_OK;
}

kvf_status_t kvf_sampler_init(kvf_sampler_t *s, const kvf_sampling_params_t *params, int vocab)
{
    if (vocab <= 0 || kvf_sampling_validate(params) != KVF_OK)
        return KVF_ERR_INVAL;
    s->params = *params;
    s->rng = params->seed;
    s->vocab = vocab;
    s->probs = malloc((size_t)vocab * sizeof(float));
    s->order = malloc((size_t)vocab * sizeof(int32_t));
    if (!s->probs || !s->order) {
        free(s->probs);
        free(s->order);
        s->probs = NULL;
        s->order = NULL;
        return KVF_ERR_NOMEM;
    }
    return KVF_OK;
}

void kvf_sampler_fini(kvf_sampler_t *s)
{
    free(s->probs);
    free(s->order);
    s->probs = NULL;
    s->order = NULL;
}

uint64_t kvf_sampler_state(const kvf_sampler_t *s)
{
    return s->rng;
}

void kvf_sampler_set_state(kvf_sampler_t *s, uint64_t state)
{
    s->rng = state;
}

uint32_t kvf_sample_argmax(const float *logits, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best] || (isnan(logits[best]) && !isnan(logits[i])))
            best = i;
    return (uint32_t)best;
}

/* Descending probability, then ascending id: a total order, so the
 * candidate list (and the choice) does not depend on the sort algorithm. */
static int cmp_desc(const void *a, const void *b, void *probs)
{
    const float *p = probs;
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (p[i] != p[j])
        return p[i] > p[j] ? -1 : 1;
    return (i > j) - (i < j);
}

/* Sift-down for a heap of ids with the weakest candidate (last in
 * cmp_desc order) on top. */
static void heap_sift(int32_t *h, int n, int i, const float *p)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && cmp_desc(&h[l], &h[m], (void *)p) > 0)
            m = l;
        if (r < n && cmp_desc(&h[r], &h[m], (void *)p) > 0)
            m = r;
        if (m == i)
            return;
        int32_t t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

static void sort_ids(int32_t *ids, int n, const float *p)
{
    /* Heap sort: allocation-free; moving the weakest to the end each time
     * leaves the ids in cmp_desc order. */
    for (int i = n / 2 - 1; i >= 0; i--)
        heap_sift(ids, n, i, p);
    for (int end = n - 1; end > 0; end--) {
        int32_t t = ids[0];
        ids[0] = ids[end];
        ids[end] = t;
        heap_sift(ids, end, 0, p);
    }
}

bool kvf_sampler_is_greedy(const kvf_sampler_t *s)
{
    return s->params.temperature < 1e-6f || s->params.top_k == 1;
}

uint32_t kvf_sampler_sample(kvf_sampler_t *s, const float *logits)
{
    const kvf_sampling_params_t *p = &s->params;
    const int V = s->vocab;
    if (kvf_sampler_is_greedy(s))
        return kvf_sample_argmax(logits, V);
    uint64_t draw = kvf_splitmix64(&s->rng);
    double u = (double)(draw >> 11) * (1.0 / 9007199254740992.0); /* [0, 1) */

    /* Softmax at temperature, in double for the sum. */
    float mx = logits[kvf_sample_argmax(logits, V)];
    double total = 0;
    for (int i = 0; i < V; i++) {
        float z = (logits[i] - mx) / p->temperature;
        s->probs[i] = isnan(z) ? 0.0f : expf(z);
        total += s->probs[i];
    }
    int n = 0;
    int k = p->top_k > 0 && p->top_k < V ? p->top_k : V;
    if (k == V && p->top_p >= 1.0f) {
        /* No truncation: walk the distribution in id order. */
        double target = u * total, acc = 0;
        for (int i = 0; i < V; i++) {
            acc += s->probs[i];
            if (acc > target && s->probs[i] > 0)
                return (uint32_t)i;
        }
        return kvf_sample_argmax(logits, V);
    }
    /* Candidates: the k most likely (selected with a heap of size k), sorted. */
    int32_t *ids = s->order;
    for (int i = 0; i < V; i++) {
        if (n < k) {
            ids[n++] = i;
            if (n == k)
                for (int j = k / 2 - 1; j >= 0; j--)
                    heap_sift(ids, k, j, s->probs);
        } else if (cmp_desc(&i, &ids[0], s->probs) < 0) {
            ids[0] = i;
            heap_sift(ids, k, 0, s->probs);
        }
    }
    sort_ids(ids, n, s->probs);
    /* Top-p: the shortest prefix whose mass reaches top_p of the total. */
    double mass = 0;
    int keep = n;
    for (int i = 0; i < n; i++) {
        mass += s->probs[ids[i]];
        if (mass >= p->top_p * total) {
            keep = i + 1;
            break;
        }
    }
    double kept = 0;
    for (int i = 0; i < keep; i++)
        kept += s->probs[ids[i]];
    double target = u * kept, acc = 0;
    for (int i = 0; i < keep; i++) {
        acc += s->probs[ids[i]];
        if (acc > target)
            return (uint32_t)ids[i];
    }
    return (uint32_t)ids[0];
}
