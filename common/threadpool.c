/* Fork-join thread pool. See kvf/threadpool.h. */
#include "kvf/threadpool.h"
#include "kvf/log.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
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
    /* The current run. generation changes when a run is posted. */
    _Atomic unsigned generation;
    kvf_task_fn fn;
    void *arg;
    int n_tasks;
    atomic_int next_task;
    atomic_int active;    /* workers still inside the current run */
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

static void run_tasks(struct kvf_threadpool *p, int thread)
{
    for (;;) {
        int i = atomic_fetch_add_explicit(&p->next_task, 1, memory_order_relaxed);
        if (i >= p->n_tasks)
            break;
        p->fn(p->arg, i, thread);
    }
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    struct kvf_threadpool *p = w->pool;
    /* Generation 0 is "no run yet": a run posted before this thread got
     * here must still count this worker in. */
    unsigned seen = 0;
    for (;;) {
        unsigned gen;
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
        run_tasks(p, w->index);
        atomic_fetch_sub_explicit(&p->active, 1, memory_order_release);
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
    p->fn = fn;
    p->arg = arg;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next_task, 0, memory_order_relaxed);
    atomic_store_explicit(&p->active, p->n_threads - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->lock);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    if (p->sleepers > 0)
        pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    run_tasks(p, 0);
    int spins = 0;
    while (atomic_load_explicit(&p->active, memory_order_acquire) > 0) {
        if (++spins < KVF_POOL_SPIN)
            cpu_relax();
        else
            sched_yield();
    }
}
