/* Timer heap tests: against a brute-force model (a plain array searched
 * for its minimum) under random arming, re-arming, cancelling and runs,
 * with callbacks that change the set while it runs; and the contract's
 * corners (ties fire in arming order, a callback re-arming itself "now",
 * a callback cancelling a due timer, timeouts, fini). Times are made up:
 * nothing here reads the clock. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kvf/timer.h"

#include <stdint.h>
#include <string.h>

/* ---- the model -------------------------------------------------------------- */

#define N_TIMERS 48

typedef struct {
    bool armed;
    uint64_t deadline, seq;
} model_timer_t;

typedef struct fixture fixture_t;

typedef struct {
    kvf_timer_t timer;
    fixture_t *fx;
    int id;
    unsigned fired;
} entry_t;

struct fixture {
    kvf_timers_t timers;
    entry_t entries[N_TIMERS];
    model_timer_t model[N_TIMERS];
    uint64_t model_seq;
    bool running;
    uint64_t run_now;
    uint64_t rng;
    bool act_in_callbacks; /* the random test's callbacks change the set */
    int log[4 * N_TIMERS]; /* ids in firing order */
    size_t n_log;
};

static uint32_t next_rand(fixture_t *fx)
{
    fx->rng = fx->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(fx->rng >> 33);
}

/* The model's earliest armed timer (by deadline, then arming order); -1
 * if none is armed, or (due_only) none is due at now. */
static int model_min(const fixture_t *fx, bool due_only, uint64_t now)
{
    int best = -1;
    for (int i = 0; i < N_TIMERS; i++) {
        const model_timer_t *m = &fx->model[i];
        if (!m->armed || (due_only && m->deadline > now))
            continue;
        if (best < 0 || m->deadline < fx->model[best].deadline ||
            (m->deadline == fx->model[best].deadline && m->seq < fx->model[best].seq))
            best = i;
    }
    return best;
}

static void do_arm(fixture_t *fx, int id, uint64_t deadline)
{
    assert_int_equal(kvf_timer_arm(&fx->timers, &fx->entries[id].timer, deadline), KVF_OK);
    if (fx->running && deadline <= fx->run_now)
        deadline = fx->run_now + 1; /* the contract: due after the run's now */
    fx->model[id] = (model_timer_t){.armed = true, .deadline = deadline, .seq = fx->model_seq++};
}

static void do_cancel(fixture_t *fx, int id)
{
    kvf_timer_cancel(&fx->timers, &fx->entries[id].timer);
    fx->model[id].armed = false;
}

static void check_against_model(const fixture_t *fx)
{
    size_t armed = 0;
    for (int i = 0; i < N_TIMERS; i++) {
        armed += fx->model[i].armed;
        assert_int_equal(kvf_timer_armed(&fx->entries[i].timer), fx->model[i].armed);
    }
    assert_int_equal(kvf_timers_count(&fx->timers), armed);
    int min = model_min(fx, false, 0);
    uint64_t want = min < 0 ? UINT64_MAX : fx->model[min].deadline;
    assert_int_equal(kvf_timers_next_ns(&fx->timers), want);
}

/* One random change to the set: arm, re-arm or cancel a random timer. */
static void random_op(fixture_t *fx, uint64_t now)
{
    int id = (int)(next_rand(fx) % N_TIMERS);
    uint32_t op = next_rand(fx) % 4;
    if (op == 0)
        do_cancel(fx, id);
    else /* deadlines around now, some in the past, many equal */
        do_arm(fx, id, now + next_rand(fx) % 64 - (now >= 16 ? 16 : now));
}

static void on_fire(kvf_timer_t *timer, void *arg)
{
    entry_t *e = arg;
    fixture_t *fx = e->fx;
    assert_ptr_equal(timer, &e->timer);
    assert_false(kvf_timer_armed(timer)); /* disarmed before the call */
    /* The heap fires exactly what the model says is earliest and due. */
    assert_int_equal(model_min(fx, true, fx->run_now), e->id);
    fx->model[e->id].armed = false;
    e->fired++;
    fx->log[fx->n_log++ % (4 * N_TIMERS)] = e->id;
    if (fx->act_in_callbacks) {
        /* Change the set from inside the run: itself, others, anything. */
        int n_ops = (int)(next_rand(fx) % 3);
        for (int i = 0; i < n_ops; i++)
            random_op(fx, fx->run_now);
    }
    check_against_model(fx);
}

static void fixture_init(fixture_t *fx, uint64_t seed, bool act_in_callbacks)
{
    memset(fx, 0, sizeof(*fx));
    kvf_timers_init(&fx->timers);
    fx->rng = seed;
    fx->act_in_callbacks = act_in_callbacks;
    for (int i = 0; i < N_TIMERS; i++) {
        fx->entries[i] = (entry_t){.fx = fx, .id = i};
        kvf_timer_init(&fx->entries[i].timer, on_fire, &fx->entries[i]);
    }
}

static void run_at(fixture_t *fx, uint64_t now)
{
    fx->running = true;
    fx->run_now = now;
    size_t before = fx->n_log;
    unsigned fired = kvf_timers_run(&fx->timers, now);
    fx->running = false;
    assert_int_equal(fired, fx->n_log - before);
    assert_int_equal(model_min(fx, true, now), -1); /* nothing due is left */
    check_against_model(fx);
}

static void random_rounds(uint64_t seed, bool act_in_callbacks)
{
    fixture_t fx;
    fixture_init(&fx, seed, act_in_callbacks);
    uint64_t now = 0;
    for (int round = 0; round < 3000; round++) {
        int n_ops = (int)(next_rand(&fx) % 8);
        for (int i = 0; i < n_ops; i++) {
            random_op(&fx, now);
            check_against_model(&fx);
        }
        now += next_rand(&fx) % 24; /* sometimes the same now twice */
        run_at(&fx, now);
    }
    assert_true(fx.n_log > 1000); /* the rounds did fire timers */
    kvf_timers_fini(&fx.timers);
    for (int i = 0; i < N_TIMERS; i++)
        assert_false(kvf_timer_armed(&fx.entries[i].timer));
}

static void test_random_against_model(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 4; seed++)
        random_rounds(seed, false);
}

static void test_random_callbacks_change_the_set(void **state)
{
    (void)state;
    for (uint64_t seed = 11; seed <= 14; seed++)
        random_rounds(seed, true);
}

/* ---- the contract's corners ------------------------------------------------- */

static void test_ties_fire_in_arming_order(void **state)
{
    (void)state;
    fixture_t fx;
    fixture_init(&fx, 1, false);
    const int order[] = {5, 2, 9, 0, 7};
    for (int i = 0; i < 5; i++)
        do_arm(&fx, order[i], 100);
    do_arm(&fx, 3, 99);
    do_arm(&fx, 2, 100); /* re-armed: now the last of the 100s */
    run_at(&fx, 100);
    const int want[] = {3, 5, 9, 0, 7, 2};
    assert_int_equal(fx.n_log, 6);
    for (int i = 0; i < 6; i++)
        assert_int_equal(fx.log[i], want[i]);
    kvf_timers_fini(&fx.timers);
}

typedef struct {
    kvf_timers_t *timers;
    kvf_timer_t self, other;
    unsigned self_fired, other_fired;
    uint64_t rearm_at; /* self re-arms itself for this deadline */
    bool cancel_other, rearm_other;
} corner_t;

static void corner_self(kvf_timer_t *timer, void *arg)
{
    corner_t *c = arg;
    c->self_fired++;
    if (c->rearm_at)
        assert_int_equal(kvf_timer_arm(c->timers, timer, c->rearm_at), KVF_OK);
    kvf_timer_cancel(c->timers, &c->self); /* harmless when not armed */
    if (c->rearm_at)
        assert_int_equal(kvf_timer_arm(c->timers, timer, c->rearm_at), KVF_OK);
    if (c->cancel_other)
        kvf_timer_cancel(c->timers, &c->other);
    if (c->rearm_other)
        assert_int_equal(kvf_timer_arm(c->timers, &c->other, 500), KVF_OK);
}

static void corner_other(kvf_timer_t *timer, void *arg)
{
    corner_t *c = arg;
    (void)timer;
    c->other_fired++;
}

static void corner_init(corner_t *c, kvf_timers_t *timers)
{
    memset(c, 0, sizeof(*c));
    c->timers = timers;
    kvf_timers_init(timers);
    kvf_timer_init(&c->self, corner_self, c);
    kvf_timer_init(&c->other, corner_other, c);
}

static void test_rearm_self_now_fires_next_run(void **state)
{
    (void)state;
    kvf_timers_t timers;
    corner_t c;
    corner_init(&c, &timers);
    c.rearm_at = 10; /* already past at the run's now: must not loop */
    assert_int_equal(kvf_timer_arm(&timers, &c.self, 10), KVF_OK);
    assert_int_equal(kvf_timers_run(&timers, 50), 1);
    assert_int_equal(c.self_fired, 1);
    assert_true(kvf_timer_armed(&c.self));
    assert_int_equal(kvf_timers_next_ns(&timers), 51); /* due just after the run */
    assert_int_equal(kvf_timers_timeout_ms(&timers, 51), 0);
    assert_int_equal(kvf_timers_run(&timers, 50), 0); /* same now: not again */
    assert_int_equal(kvf_timers_run(&timers, 51), 1);
    assert_int_equal(c.self_fired, 2);
    c.rearm_at = 1000; /* a periodic timer's usual re-arm */
    assert_int_equal(kvf_timers_run(&timers, 60), 1);
    assert_int_equal(kvf_timers_next_ns(&timers), 1000);
    assert_int_equal(kvf_timers_run(&timers, 999), 0);
    kvf_timers_fini(&timers);
    assert_false(kvf_timer_armed(&c.self));
}

static void test_callback_cancels_or_moves_a_due_timer(void **state)
{
    (void)state;
    kvf_timers_t timers;
    corner_t c;
    corner_init(&c, &timers);
    c.cancel_other = true;
    assert_int_equal(kvf_timer_arm(&timers, &c.self, 10), KVF_OK);
    assert_int_equal(kvf_timer_arm(&timers, &c.other, 20), KVF_OK);
    assert_int_equal(kvf_timers_run(&timers, 30), 1); /* other was due, but cancelled */
    assert_int_equal(c.other_fired, 0);
    assert_int_equal(kvf_timers_count(&timers), 0);
    assert_int_equal(kvf_timers_next_ns(&timers), UINT64_MAX);
    assert_int_equal(kvf_timers_timeout_ms(&timers, 30), -1);

    c.cancel_other = false;
    c.rearm_other = true; /* moved from due to 500 */
    assert_int_equal(kvf_timer_arm(&timers, &c.self, 10), KVF_OK);
    assert_int_equal(kvf_timer_arm(&timers, &c.other, 20), KVF_OK);
    assert_int_equal(kvf_timers_run(&timers, 30), 1);
    assert_int_equal(c.other_fired, 0);
    assert_int_equal(kvf_timers_run(&timers, 499), 0);
    assert_int_equal(kvf_timers_run(&timers, 500), 1);
    assert_int_equal(c.other_fired, 1);
    kvf_timers_fini(&timers);
}

static void test_timeout_ms(void **state)
{
    (void)state;
    kvf_timers_t timers;
    corner_t c;
    corner_init(&c, &timers);
    assert_int_equal(kvf_timers_timeout_ms(&timers, 0), -1);
    assert_int_equal(kvf_timer_arm(&timers, &c.other, 5000000), KVF_OK); /* 5 ms */
    assert_int_equal(kvf_timers_timeout_ms(&timers, 0), 5);
    assert_int_equal(kvf_timers_timeout_ms(&timers, 1), 5); /* rounded up */
    assert_int_equal(kvf_timers_timeout_ms(&timers, 4000001), 1);
    assert_int_equal(kvf_timers_timeout_ms(&timers, 5000000), 0);
    assert_int_equal(kvf_timers_timeout_ms(&timers, 9000000), 0);
    assert_int_equal(kvf_timer_arm(&timers, &c.other, UINT64_MAX - 1), KVF_OK);
    assert_int_equal(kvf_timers_timeout_ms(&timers, 0), INT32_MAX);
    kvf_timer_cancel(&timers, &c.other);
    kvf_timer_cancel(&timers, &c.other); /* twice: a no-op */
    assert_int_equal(kvf_timers_timeout_ms(&timers, 0), -1);
    kvf_timers_fini(&timers);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_against_model),
        cmocka_unit_test(test_random_callbacks_change_the_set),
        cmocka_unit_test(test_ties_fire_in_arming_order),
        cmocka_unit_test(test_rearm_self_now_fires_next_run),
        cmocka_unit_test(test_callback_cancels_or_moves_a_due_timer),
        cmocka_unit_test(test_timeout_ms),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
