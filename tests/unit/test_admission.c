/* test_admission.c: the order path's admission limit (service/order/
 * admission.h), promise by promise, without a clock to wait on:
 * - a fixed limit: orders pass until it is held, then each is shed and
 *   counted; one leaving lets the next in; the limit never moves;
 * - the adaptive rule: a p90 under the target grows the limit only when
 *   it was in use, by at most x1.1 a window (x1.5 while the p90 is under
 *   half the target); one over it shrinks it half
 *   the way, by at most x0.8; the floor and the ceiling hold; a p90 never
 *   seen (0) leaves it;
 * - the connection bound: a window whose peak held every open connection,
 *   its p90 past half the target, leaves the limit at nine tenths of them
 *   at most; fast, or with connections to spare, the time rule alone;
 * - windows: the p90 of a window (within its bucket's width) reaches the
 *   metrics, and a window closes only after 100 ms and 16 orders;
 * - per strategy (svc_admit): the door admits up to the limits of the
 *   strategies in use plus SVC_ADMISSION_MIN; a strategy at its own limit
 *   is shed while another is not; with --max-inflight one limit holds
 *   for all, at the door. */
#include <unistd.h>

#include "common/clock.h"
#include "service/order/admission.h"
#include "tests/unit/t.h"

static void fixed_limit_sheds_past_it(void) {
    svc_admission ad;
    svc_admission_init(&ad, 3, 1000, 50);
    for (int i = 0; i < 3; i++) {
        CHECK(!svc_admission_shed(&ad));
        svc_admission_enter(&ad, clock_mono_us());
    }
    CHECK(svc_admission_shed(&ad));
    CHECK(svc_admission_shed(&ad));
    CHECK(svc_admission_shed_count(&ad) == 2);
    CHECK(svc_admission_inflight(&ad) == 3);
    svc_admission_leave(&ad, 1000);
    CHECK(!svc_admission_shed(&ad));
    CHECK(svc_admission_limit(&ad) == 3);
}

static void rule_grows_only_a_limit_in_use(void) {
    /* Faster than aimed (a target of 50 ms). */
    CHECK(svc_admission_next(200, 40000, 190, 50000, 10000, 0) == 220);     /* x1.1 at most */
    CHECK(svc_admission_next(200, 10000, 190, 50000, 10000, 0) == 300);     /* far under: x1.5 */
    CHECK(svc_admission_next(200, 20000, 190, 50000, 10000, 0) == 300);
    CHECK(svc_admission_next(200, 10000, 90, 50000, 10000, 0) == 200);      /* not in use */
    CHECK(svc_admission_next(9990, 10000, 9990, 50000, 10000, 0) == 10000); /* ceiling */
    /* Just under the target: a small step, but a step. */
    long n = svc_admission_next(200, 49000, 200, 50000, 10000, 0);
    CHECK(n > 200 && n <= 203);
}

static void rule_shrinks_a_slow_path(void) {
    CHECK(svc_admission_next(1000, 400000, 1000, 50000, 10000, 0) == 800);  /* x0.8 at most */
    CHECK(svc_admission_next(1000, 60000, 1000, 50000, 10000, 0) == 916);   /* half the way */
    CHECK(svc_admission_next(SVC_ADMISSION_MIN, 400000, SVC_ADMISSION_MIN, 50000, 10000, 0) ==
          SVC_ADMISSION_MIN);                                            /* floor */
    CHECK(svc_admission_next(300, 0, 300, 50000, 10000, 0) == 300);         /* no p90 */
}

static void rule_keeps_a_tenth_of_held_connections_free(void) {
    /* The measured case: 2,003 connections, every one waiting on an order,
     * p90 80 ms of a 100 ms target -- the time rule would grow the limit
     * past the connections; held to nine tenths of them instead. */
    CHECK(svc_admission_next(3651, 80000, 2000, 100000, 16384, 2003) == 2003 - 200);
    /* Under the cap already: the time rule's step, x1.1 (the cap lowers,
     * never raises). */
    CHECK(svc_admission_next(1500, 80000, 2000, 100000, 16384, 2003) == 1650);
    /* Fast (under half the target): a closed loop at full speed, left alone. */
    CHECK(svc_admission_next(3651, 40000, 2000, 100000, 16384, 2003) > 3651);
    /* Connections not all held (1,500 of 2,003): the time rule alone. */
    CHECK(svc_admission_next(3651, 80000, 1500, 100000, 16384, 2003) ==
          svc_admission_next(3651, 80000, 1500, 100000, 16384, 0));
    /* Few connections: never below the floor. */
    CHECK(svc_admission_next(200, 80000, 64, 100000, 16384, 64) == SVC_ADMISSION_MIN);
    /* Slow past the target too: the smaller of the two. */
    CHECK(svc_admission_next(3000, 400000, 2000, 100000, 16384, 2003) == 1803);
    CHECK(svc_admission_next(1000, 400000, 1000, 100000, 16384, 1010) == 800);
}

static void window_p90_reaches_the_metrics(void) {
    svc_admission ad;
    svc_admission_init(&ad, 0, 10000, 50);
    CHECK(svc_admission_limit(&ad) == SVC_ADMISSION_INITIAL);
    for (int i = 0; i < 20; i++) svc_admission_enter(&ad, clock_mono_us());
    for (int i = 0; i < 10; i++) svc_admission_leave(&ad, 3000);   /* fewer than 16: open */
    CHECK(svc_admission_p90_us(&ad) == 0);
    usleep(SVC_ADMISSION_WINDOW_US + 20000);
    for (int i = 0; i < 10; i++) svc_admission_leave(&ad, 3000);   /* 20 in a closed window */
    int64_t m = svc_admission_p90_us(&ad);
    CHECK(m >= 2500 && m <= 3600);        /* 3 ms, within its bucket (512 us wide) */
    CHECK(svc_admission_inflight(&ad) == 0);
    /* Fast, but the limit was not in use (a peak of 20 of 256): it stays. */
    CHECK(svc_admission_limit(&ad) == SVC_ADMISSION_INITIAL);
}

static void strategies_are_limited_apart(void) {
    static svc_admit am;                       /* large: not on the stack */
    svc_admit_init(&am, 0, 100000, 100);
    CHECK(svc_admit_door_limit(&am) == SVC_ADMISSION_MIN);    /* none in use: room for one */
    for (int i = 0; i < SVC_ADMISSION_INITIAL; i++) {
        CHECK(!svc_admit_shed(&am, STOCK_LOCK));
        svc_admit_enter(&am, STOCK_LOCK, clock_mono_us());
    }
    CHECK(svc_admit_shed(&am, STOCK_LOCK));                  /* lock at its own limit... */
    CHECK(!svc_admit_shed(&am, STOCK_LUA));                  /* ...lua is not */
    CHECK(svc_admit_door_limit(&am) == SVC_ADMISSION_INITIAL + SVC_ADMISSION_MIN);
    CHECK(!svc_admit_door(&am));                             /* room for lua to start */
    for (int i = 0; i < SVC_ADMISSION_MIN; i++) svc_admit_enter(&am, STOCK_LUA, clock_mono_us());
    CHECK(svc_admit_door_limit(&am) == 2 * SVC_ADMISSION_INITIAL + SVC_ADMISSION_MIN);
    CHECK(!svc_admit_door(&am));
    for (int i = 0; i < SVC_ADMISSION_INITIAL; i++) svc_admit_enter(&am, STOCK_LUA, clock_mono_us());
    CHECK(svc_admit_inflight(&am) == 2 * SVC_ADMISSION_INITIAL + SVC_ADMISSION_MIN);
    CHECK(svc_admit_door(&am));                              /* both full, and the room */
    CHECK(svc_admit_shed_count(&am) == 2);                   /* one at lock's, one at the door */
    svc_admit_leave(&am, STOCK_LOCK, 1000);
    CHECK(!svc_admit_door(&am));
    CHECK(!svc_admit_shed(&am, STOCK_LOCK));
}

static void fixed_limit_is_one_for_all(void) {
    static svc_admit am;
    svc_admit_init(&am, 3, 100000, 100);
    svc_admit_enter(&am, STOCK_LOCK, clock_mono_us());
    svc_admit_enter(&am, STOCK_LOCK, clock_mono_us());
    CHECK(!svc_admit_shed(&am, STOCK_LOCK));                 /* no limit of its own */
    CHECK(!svc_admit_door(&am));
    svc_admit_enter(&am, STOCK_LUA, clock_mono_us());
    CHECK(svc_admit_door(&am));                              /* three in all */
    CHECK(svc_admit_door_limit(&am) == 3);
    svc_admit_leave(&am, STOCK_LUA, 10);
    CHECK(!svc_admit_door(&am));
}

TEST_MAIN(T(fixed_limit_sheds_past_it), T(rule_grows_only_a_limit_in_use),
          T(rule_shrinks_a_slow_path),
          T(rule_keeps_a_tenth_of_held_connections_free), T(window_p90_reaches_the_metrics),
          T(strategies_are_limited_apart), T(fixed_limit_is_one_for_all))
