/* clock.h: monotonic and wall-clock time in the units the modules use.
 *
 * Deadlines, lease remainders and latencies are measured on CLOCK_MONOTONIC,
 * never on the wall clock, so a clock step (NTP, an operator) cannot make a
 * lock look held longer than it is or a request time out early. The wall
 * clock is used only for timestamps shown to people. */
#ifndef FLASHSALE_CLOCK_H
#define FLASHSALE_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Monotonic time in microseconds since an arbitrary epoch. */
static inline int64_t clock_mono_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Monotonic time in milliseconds. */
static inline int64_t clock_mono_ms(void) { return clock_mono_us() / 1000; }

/* Wall-clock time in milliseconds since the Unix epoch. */
static inline int64_t clock_wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Sleeps for ms milliseconds (restarting after signals). */
static inline void clock_sleep_ms(int64_t ms) {
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000 };
    while (nanosleep(&ts, &ts) != 0) {}
}

#endif
