/* Clock helpers. All times are CLOCK_MONOTONIC unless named otherwise. */
#ifndef KVF_CLOCK_H
#define KVF_CLOCK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Nanoseconds on the monotonic clock (arbitrary origin). */
uint64_t kvf_clock_ns(void);

/* Milliseconds on the monotonic clock. */
static inline uint64_t kvf_clock_ms(void)
{
    return kvf_clock_ns() / 1000000u;
}

/* CPU time this process has used, all its threads (CLOCK_PROCESS_CPUTIME_ID),
 * in nanoseconds: against kvf_clock_ns over the same span, how much of a
 * core the process got. */
uint64_t kvf_clock_cpu_ns(void);

/* Seconds since the Unix epoch on the real-time clock (for `created`
 * fields and logs meant for people). */
int64_t kvf_clock_unix_s(void);

/* Milliseconds left until deadline_ns (monotonic), 0 if passed; capped
 * at INT32_MAX so it fits poll(2). */
int kvf_clock_ms_until(uint64_t deadline_ns);

/* Sleeps for ms milliseconds, resuming after signals. */
void kvf_clock_sleep_ms(unsigned ms);

#ifdef __cplusplus
}
#endif

#endif
