/* Thread pool tests: every task runs exactly once per run, over many short
 * runs (the late-worker races live there), with thread indices in range. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kvf/threadpool.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct {
    atomic_int *hits; /* (n_tasks) */
    int n_threads;
    atomic_int bad_thread;
} job_t;

static void count_task(void *arg, int task, int thread)
{
    job_t *j = arg;
    atomic_fetch_add(&j->hits[task], 1);
    if (thread < 0 || thread >= j->n_threads)
        atomic_store(&j->bad_thread, 1);
}

static void check_pool(int n_threads)
{
    kvf_threadpool_t *tp;
    assert_int_equal(kvf_threadpool_create(n_threads, &tp), KVF_OK);
    assert_int_equal(kvf_threadpool_size(tp), n_threads);
    atomic_int hits[64];
    job_t j = {.hits = hits, .n_threads = n_threads};
    for (int run = 0; run < 20000; run++) {
        int n = 1 + run % 64;
        for (int i = 0; i < n; i++)
            atomic_store(&hits[i], 0);
        kvf_threadpool_run(tp, count_task, &j, n);
        for (int i = 0; i < n; i++)
            if (atomic_load(&hits[i]) != 1)
                fail_msg("%d threads, run %d: task %d ran %d times", n_threads, run, i,
                         atomic_load(&hits[i]));
        if (run % 5000 == 4999)
            usleep(2000); /* let the workers fall asleep, then wake them */
    }
    assert_int_equal(atomic_load(&j.bad_thread), 0);
    kvf_threadpool_run(tp, count_task, &j, 0);
    kvf_threadpool_destroy(tp);
}

static void test_runs(void **state)
{
    (void)state;
    check_pool(1);
    check_pool(2);
    check_pool(3);
}

static void test_default_size(void **state)
{
    (void)state;
    kvf_threadpool_t *tp;
    assert_int_equal(kvf_threadpool_create(0, &tp), KVF_OK);
    assert_int_equal(kvf_threadpool_size(tp), kvf_cpu_count());
    kvf_threadpool_destroy(tp);
    kvf_threadpool_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runs),
        cmocka_unit_test(test_default_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
