/* A small fork-join thread pool for compute kernels (pthreads).
 *
 * kvf_threadpool_run() splits n_tasks among the pool's threads and the
 * caller, and returns when all have finished. Workers spin briefly between
 * runs (a forward pass issues a run every few tens of microseconds), then
 * sleep on a condition variable so an idle node does not burn a core.
 *
 * Thread rules: one thread at a time calls run() on a pool (the compute
 * thread that owns it); tasks must not call run() on the same pool. */
#ifndef KVF_THREADPOOL_H
#define KVF_THREADPOOL_H

#include "kvf/status.h"

typedef struct kvf_threadpool kvf_threadpool_t;

/* task: the task index in [0, n_tasks); thread: the index of the running
 * thread in [0, n_threads) (0 = the caller), for per-thread scratch. */
typedef void (*kvf_task_fn)(void *arg, int task, int thread);

/* Starts n_threads - 1 workers (the caller is thread 0); n_threads <= 0
 * means one per online CPU. On success *pool_p is owned by the caller:
 * kvf_threadpool_destroy(). */
kvf_status_t kvf_threadpool_create(int n_threads, kvf_threadpool_t **pool_p);

/* Stops and joins the workers and frees the pool; NULL is a no-op. */
void kvf_threadpool_destroy(kvf_threadpool_t *pool);

/* Threads that run tasks, the caller included. */
int kvf_threadpool_size(const kvf_threadpool_t *pool);

/* Runs fn(arg, i, thread) for every i in [0, n_tasks), in any order and on
 * any thread; returns when every task has returned. */
void kvf_threadpool_run(kvf_threadpool_t *pool, kvf_task_fn fn, void *arg, int n_tasks);

/* The number of online CPUs (at least 1). */
int kvf_cpu_count(void);

#endif
