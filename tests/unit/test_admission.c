/* test_admission.c: the order path's admission limit (service/order/
 * admission.h), promise by promise, without a clock to wait on:
 * - a fixed limit: orders pass until it is held, then each is shed and
 *   counted; one leaving lets the next in; the limit never moves;
 * - the adaptive rule: a median under the aim grows the limit only when
 *   it was in use, by at most x1.25 a window; one over it shrinks it by
 *   at most x0.9; the floor and the ceiling hold; a median never seen
 *   (0) leaves it;
 * - the aim: twice the baseline, within a quarter of the target and the
 *   target;
 * - windows: the median of a window (within its bucket's width) reaches
 *   the metrics, and a window closes only after 100 ms and 16 orders. */
#include <unistd.h>

#include "service/order/admission.h"
#include "tests/unit/t.h"

static void fixed_limit_sheds_past_it(void) {
    svc_admission ad;
    svc_admission_init(&ad, 3, 1000, 50);
    for (int i = 0; i < 3; i++) {
        CHECK(!svc_admission_shed(&ad));
        svc_admission_enter(&ad);
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
    /* 10 ms against an aim of 50 (baseline 25): faster than aimed. */
    CHECK(svc_admission_next(200, 10000, 25000, 190, 50000, 10000) == 250);  /* x1.25 at most */
    CHECK(svc_admission_next(200, 10000, 25000, 90, 50000, 10000) == 200);   /* not in use */
    CHECK(svc_admission_next(9990, 10000, 25000, 9990, 50000, 10000) == 10000);  /* ceiling */
    /* Just under the aim (24 ms): a small step, but a step. */
    long n = svc_admission_next(100, 23000, 12000, 100, 50000, 10000);
    CHECK(n > 100 && n <= 103);
}

static void rule_shrinks_a_slow_path(void) {
    CHECK(svc_admission_next(200, 400000, 5000, 200, 50000, 10000) == 180);   /* x0.9 at most */
    CHECK(svc_admission_next(1000, 20000, 5000, 1000, 50000, 10000) < 1000);  /* aim 12.5 ms */
    CHECK(svc_admission_next(SVC_ADMISSION_MIN, 400000, 5000, 64, 50000, 10000) ==
          SVC_ADMISSION_MIN);                                                 /* floor */
    CHECK(svc_admission_next(300, 0, 0, 300, 50000, 10000) == 300);           /* no median */
}

static void aim_follows_the_baseline_within_the_target(void) {
    CHECK(svc_admission_aim(10000, 50000) == 20000);    /* twice the baseline */
    CHECK(svc_admission_aim(1000, 50000) == 12500);     /* at least a quarter of the target */
    CHECK(svc_admission_aim(40000, 50000) == 50000);    /* at most the target */
    /* A slow loop (baseline 20 ms) is not a queue: 40 ms is not cut. */
    CHECK(svc_admission_next(300, 40000, 20000, 300, 50000, 10000) == 300);
}

static void window_median_reaches_the_metrics(void) {
    svc_admission ad;
    svc_admission_init(&ad, 0, 10000, 50);
    CHECK(svc_admission_limit(&ad) == SVC_ADMISSION_INITIAL);
    for (int i = 0; i < 20; i++) svc_admission_enter(&ad);
    for (int i = 0; i < 10; i++) svc_admission_leave(&ad, 3000);   /* fewer than 16: open */
    CHECK(svc_admission_median_us(&ad) == 0);
    usleep(SVC_ADMISSION_WINDOW_US + 20000);
    for (int i = 0; i < 10; i++) svc_admission_leave(&ad, 3000);   /* 20 in a closed window */
    int64_t m = svc_admission_median_us(&ad);
    CHECK(m >= 2500 && m <= 3600);        /* 3 ms, within its bucket (512 us wide) */
    CHECK(svc_admission_inflight(&ad) == 0);
    /* Fast, but the limit was not in use (a peak of 20 of 256): it stays. */
    CHECK(svc_admission_limit(&ad) == SVC_ADMISSION_INITIAL);
}

TEST_MAIN(T(fixed_limit_sheds_past_it), T(rule_grows_only_a_limit_in_use),
          T(rule_shrinks_a_slow_path), T(aim_follows_the_baseline_within_the_target),
          T(window_median_reaches_the_metrics))
