/* admission.h: how many orders the order path takes at once, and the
 * refusal of the rest at the door (503 overloaded).
 *
 * Past its capacity a service that takes every order only builds a queue:
 * each order waits for all those ahead of it, answers come later and later
 * for as long as the spike lasts, and clients time out on orders that were
 * in fact sold. Instead the order path admits at most `limit` orders at a
 * time (from svc_order_submit to the order's answer), and a POST /v1/orders
 * that finds it full is answered 503 `overloaded` with Retry-After before
 * its body is even parsed: the cheapest answer the service can give, and
 * one that took nothing. An admitted order is never shed.
 *
 * The limit is fixed (--max-inflight N) or, by default, adaptive: every
 * window (100 ms and 16 orders at least) the 90th percentile of the time
 * admitted orders spent in the path is compared with a target
 * (--order-latency-target-ms) and the limit is scaled half the way to
 * limit x target / p90, at
 * most x1.1 up and x0.8 down a window, never below SVC_ADMISSION_MIN: a
 * gradient controller in the manner of Netflix's concurrency-limits and
 * Envoy's adaptive concurrency. At saturation that is Little's law:
 * limit = throughput x target, the orders the service completes within
 * the target; below it the limit is not in use and is left where it is
 * (docs/performance.md, "Past capacity").
 *
 * One controller per strategy (svc_admit): the time in the path is the
 * strategy's own (a Lua script answers in a millisecond, a ZooKeeper lock
 * in tens), so a slow strategy's orders lower its own limit, not every
 * other's. The door, before parsing, cannot know the strategy; it sheds
 * when the orders in flight reach the sum of the limits of the strategies
 * in use (an order in the last second) plus SVC_ADMISSION_MIN, room for a
 * strategy to start. Past the door, once the product is known, an order
 * over its strategy's limit is shed too. In a spike of one product that
 * sum is that strategy's limit: nearly every excess order is shed at the
 * door, unparsed; under a mix, a saturated strategy's excess is shed
 * after parsing while the others' orders go on.
 *
 * Inside a CPU quota (a container's limit) the kernel freezes the whole
 * process for the rest of each period once it has used its share: every
 * order in the path then waits out the freeze (up to half of a 100 ms
 * period at half a CPU). The limit does not take that out of its
 * windows: it did (each p90 scaled by the share of the window not
 * frozen), and alternated runs said no -- at 1.5x the capacity goodput
 * 0.12 against 0.50 without it, late answers by the thousand: the buyer
 * waits out the freeze too, and a limit that forgives it lets the queue
 * grow. What kept the freezes from shedding buyers at 0.8x (the issue
 * 32 measurement: 20%) is the fast growth far under the target and the
 * wait to be read below. The frozen time is the operator's to see
 * (flashsale_cpu_throttled_seconds_total); the cure is more CPU.
 *
 * The wait to be read. An order's time counts from when its request
 * probably arrived, not from when it was read: a loop past what its CPU
 * can do reads, each turn, every request that came during the turn
 * before, so under overload a request waits a whole turn (40-100 ms at
 * half a CPU and 2,000 connections) before the door even sees it -- time
 * its buyer spends, which the path's own time did not show while the
 * limit let the turns grow. So each order adds its loop's last turn
 * (loop_turn_us) to its time in the path.
 *
 * The queue the service cannot see. A client has as many requests out as
 * it has connections; once every open connection waits on an admitted
 * order, buyers beyond them queue in the client, and the path's time stops
 * growing with the load: it is a closed loop over those connections, as
 * fast as the service can go and under the target, so the limit grew past
 * the connections (measured: 4,500 over 2,003, at 1.5x the capacity
 * without a quota, nothing shed while the client's backlog reached 19,000
 * and half of the runs answered 100,000+ orders after 1 s). So when a
 * window's peak held (nearly) every open connection and its p90 was past
 * half the target, the limit is held to nine tenths of the connections:
 * the rest are answered 503 at once, free again for the next buyer, and
 * what the buyers ask shows in the windows. Under half the target, or
 * below the floor, it does nothing: a closed-loop client of few
 * connections is the service at full speed, not a queue.
 *
 * Lock-free: the counters are atomics; the window's update is taken by
 * whichever thread finishes an order after the window ends (one at a
 * time, by a flag). */
#ifndef FLASHSALE_SERVICE_ADMISSION_H
#define FLASHSALE_SERVICE_ADMISSION_H

#include <stdatomic.h>
#include <stdint.h>

#include "stock/stock.h"

#define SVC_ADMISSION_WINDOW_US 100000   /* the controller's window, at least... */
#define SVC_ADMISSION_WINDOW_N 16        /* ...and at least this many orders in it */
#define SVC_ADMISSION_MIN 128            /* the adaptive limit's floor... */
#define SVC_ADMISSION_INITIAL 256        /* ...and where it starts */
#define SVC_ADMISSION_BUCKETS 88         /* window histogram: 4 a power of two, to 8 s */
#define SVC_ADMISSION_ACTIVE_US 1000000  /* a strategy is in use this long after an order */

typedef struct svc_admission {
    atomic_long inflight;          /* orders admitted and not yet answered */
    atomic_long limit;             /* admitted at most, now */
    atomic_uint_fast64_t shed;     /* refused at the door */
    /* The current window: orders finished, their times in the path (a
     * histogram, four buckets a power of two: within 13%), the most in
     * flight at once, and when it began. */
    atomic_uint_fast64_t win_n;
    atomic_uint_fast64_t win_hist[SVC_ADMISSION_BUCKETS];
    atomic_long win_peak;
    atomic_llong win_start_us;
    atomic_flag updating;          /* one thread closes a window */
    atomic_llong last_in_us;       /* when an order last entered (in use: the door) */
    atomic_llong last_p90_us;      /* the latest window's p90 (metrics) */
    long fixed;                    /* > 0: the limit, fixed (--max-inflight) */
    long max;                      /* the adaptive limit's ceiling */
    int64_t target_us;             /* the adaptive target: p90 of the time in the path */
    long (*conns)(void *ud);       /* open connections now (NULL: not known) */
    void *conns_ud;
} svc_admission;

/* Sets ad up: a fixed limit when fixed > 0, else adaptive between
 * SVC_ADMISSION_MIN and max with target_ms as the p90 of the time in the
 * path. */
void svc_admission_init(svc_admission *ad, long fixed, long max, int target_ms);

/* Whether an order arriving now would be refused: the path holds its
 * limit. Counts it as shed when so. A check, not a reservation: orders
 * that passed it and are not yet in the path (being parsed on another
 * loop, or waiting for their product to be read) may take the path a
 * little past the limit. */
int svc_admission_shed(svc_admission *ad);

/* An order enters the path (svc_order_submit) at now_us... */
void svc_admission_enter(svc_admission *ad, int64_t now_us);
/* ...and leaves it, answered, after micros in it: feeds the controller. */
void svc_admission_leave(svc_admission *ad, int64_t micros);

/* The figures /metrics shows (of one strategy, with svc_admit). */
long svc_admission_limit(const svc_admission *ad);
long svc_admission_inflight(const svc_admission *ad);
uint64_t svc_admission_shed_count(const svc_admission *ad);
int64_t svc_admission_p90_us(const svc_admission *ad);

/* --------------------------------------------------- per strategy, and the door */

typedef struct svc_admit {
    svc_admission by_strategy[STOCK_STRATEGY_COUNT];
    long fixed;                    /* > 0: --max-inflight, for all orders together */
    atomic_uint_fast64_t door_shed;
} svc_admit;

/* Sets every strategy's controller up (svc_admission_init); with fixed > 0
 * the door admits fixed orders in all, and no strategy is limited apart. */
void svc_admit_init(svc_admit *am, long fixed, long max, int target_ms);
/* Gives the controllers the open connections (fn(ud), any thread, cheap),
 * for the rule's connection bound (svc_admission_next). Before any order. */
void svc_admit_count_conns(svc_admit *am, long (*fn)(void *ud), void *ud);
/* Before the body is parsed: whether the order path is full for every
 * strategy in use (see above). Counts it as shed when so. */
int svc_admit_door(svc_admit *am);
/* Once the product is known: whether strategy s is at its limit. Counts
 * it as shed when so. */
int svc_admit_shed(svc_admit *am, stock_strategy s);
/* An order of strategy s enters the path at now_us, and leaves it after
 * micros. */
void svc_admit_enter(svc_admit *am, stock_strategy s, int64_t now_us);
void svc_admit_leave(svc_admit *am, stock_strategy s, int64_t micros);
/* The door's limit now, the orders in flight, the orders shed (door and
 * strategies). */
long svc_admit_door_limit(svc_admit *am);
long svc_admit_inflight(svc_admit *am);
uint64_t svc_admit_shed_count(svc_admit *am);
/* Whether strategy s had an order in the path in the last second. */
int svc_admit_in_use(svc_admit *am, stock_strategy s, int64_t now_us);

/* The adaptive rule, pure, for the unit tests: the next limit from the
 * current one, a window's p90 of the time in the path, its peak in
 * flight, the target, and the open connections (0: not known); bounded by
 * [SVC_ADMISSION_MIN, max]. */
long svc_admission_next(long limit, int64_t p90_us, long peak, int64_t target_us, long max,
                        long conns);

#endif
