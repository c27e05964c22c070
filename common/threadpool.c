/* Fork-join thread pool. See kvf/threadpool.h. */
#include "kvf/threadpool.h"
#include "kvf/log.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* Spin iterations (~a few tens of microseconds) before a worker sleeps. */
#define KVF_POOL_SPIN 20000

typedef struct {
    struct kvf_threadpool *pool;
    int index;
    pthread_t thread;
} worker_t;

struct kvf_threadpool {
    int n_threads;
    worker_t *workers; /* (n_threads - 1) */
    /* The current run. generation changes when a run is posted. claim
     * holds (generation << 32 | next task index): a task is taken by a
     * compare-and-swap that also checks the generation, so a worker that
     * wakes late cannot take (or skip) a task of a later run. The caller
     * waits for `done` tasks, not for workers: a worker the scheduler has
     * parked costs nothing unless it holds a task. */
    _Atomic uint32_t generation;
    _Atomic(kvf_task_fn) fn;
    _Atomic(void *) arg;
    atomic_int n_tasks;
    _Atomic uint64_t claim;
    atomic_int done;
    atomic_bool stop;
    pthread_mutex_t lock; /* guards sleeping and the wakeup */
    pthread_cond_t wake;
    int sleepers;
};

int kvf_cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

#define CLAIM_CLOSED 0xffffffffu

/* Takes and runs tasks of run gen until none is left (or gen is over).
 * The caller closes the claim word before it rewrites fn/arg/n_tasks for
 * the next run, so a successful claim proves the fields read since the
 * claim word was loaded belong to gen. Sequentially consistent atomics
 * throughout: the argument needs a single order of these operations. */
static void run_tasks(struct kvf_threadpool *p, uint32_t gen, int thread)
{
    uint64_t c = atomic_load(&p->claim);
    if ((uint32_t)(c >> 32) != gen || (uint32_t)c == CLAIM_CLOSED)
        return;
    kvf_task_fn fn = atomic_load(&p->fn);
    void *arg = atomic_load(&p->arg);
    int n_tasks = atomic_load(&p->n_tasks);
    for (;;) {
        if ((uint32_t)(c >> 32) != gen || (uint32_t)c >= (uint32_t)n_tasks)
            return;
        if (!atomic_compare_exchange_weak(&p->claim, &c, c + 1))
            continue;
        fn(arg, (int)(uint32_t)c, thread);
        atomic_fetch_add(&p->done, 1);
        c = atomic_load(&p->claim);
    }
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    struct kvf_threadpool *p = w->pool;
    /* Generation 0 is "no run yet": a run posted before this thread got
     * here must still count this worker in. */
    uint32_t seen = 0;
    for (;;) {
        uint32_t gen;
        int spins = 0;
        while ((gen = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen &&
               !atomic_load_explicit(&p->stop, memory_order_relaxed)) {
            if (++spins < KVF_POOL_SPIN) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&p->lock);
            p->sleepers++;
            while (atomic_load_explicit(&p->generation, memory_order_acquire) == seen &&
                   !atomic_load_explicit(&p->stop, memory_order_relaxed))
                pthread_cond_wait(&p->wake, &p->lock);
            p->sleepers--;
            pthread_mutex_unlock(&p->lock);
        }
        if (atomic_load_explicit(&p->stop, memory_order_relaxed))
            break;
        seen = gen;
        run_tasks(p, gen, w->index);
    }
    return NULL;
}

kvf_status_t kvf_threadpool_create(int n_threads, kvf_threadpool_t **pool_p)
{
    if (n_threads <= 0)
        n_threads = kvf_cpu_count();
    if (n_threads > 1024)
        return KVF_ERR_INVAL;
    struct kvf_threadpool *p = calloc(1, sizeof(*p));
    if (!p)
        return KVF_ERR_NOMEM;
    p->n_threads = n_threads;
    p->workers = calloc((size_t)n_threads, sizeof(*p->workers));
    if (!p->workers) {
        free(p);
        return KVF_ERR_NOMEM;
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    int started = 0;
    for (int i = 1; i < n_threads; i++) {
        worker_t *w = &p->workers[i - 1];
        w->pool = p;
        w->index = i;
        int rc = pthread_create(&w->thread, NULL, worker_main, w);
        if (rc != 0) {
            kvf_log_error("thread pool: cannot start worker %d of %d (errno %d)", i, n_threads,
                          rc);
            p->n_threads = started + 1;
            kvf_threadpool_destroy(p);
            return KVF_ERR_NOMEM;
        }
        started++;
    }
    *pool_p = p;
    return KVF_OK;
}

void kvf_threadpool_destroy(kvf_threadpool_t *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (int i = 1; i < p->n_threads; i++)
        pthread_join(p->workers[i - 1].thread, NULL);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->lock);
    free(p->workers);
    free(p);
}

int kvf_threadpool_size(const kvf_threadpool_t *p)
{
    return p->n_threads;
}

void kvf_threadpool_run(kvf_threadpool_t *p, kvf_task_fn fn, void *arg, int n_tasks)
{
    if (n_tasks <= 0)
        return;
    if (p->n_threads == 1 || n_tasks == 1) {
        for (int i = 0; i < n_tasks; i++)
            fn(arg, i, 0);
        return;
    }
    uint32_t gen = atomic_load_explicit(&p->generation, memory_order_relaxed) + 1;
    if (gen == 0) /* 0 means "no run yet" to a starting worker */
        gen = 1;
    atomic_store(&p->claim, ((uint64_t)gen << 32) | CLAIM_CLOSED);
    atomic_store(&p->fn, fn);
    atomic_store(&p->arg, arg);
    atomic_store(&p->n_tasks, n_tasks);
    atomic_store(&p->done, 0);
    atomic_store(&p->claim, (uint64_t)gen << 32);
    pthread_mutex_lock(&p->lock);
    atomic_store_explicit(&p->generation, gen, memory_order_release);
    if (p->sleepers > 0)
        pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    run_tasks(p, gen, 0);
    int spins = 0;
    while (atomic_load_explicit(&p->done, memory_order_acquire) < n_tasks) {
        if (++spins < KVF_POOL_SPIN)
            cpu_relax();
        else
            sched_yield();
    }
}
