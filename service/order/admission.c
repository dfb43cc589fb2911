/* admission.c: the order path's admission limit, fixed or adaptive, and
 * the count of orders shed at the door. See admission.h for why and how;
 * docs/performance.md ("Past capacity") for the measurements behind the
 * numbers. */
#include "service/order/admission.h"

#include <assert.h>

#include "common/clock.h"

#define STEP_UP 1.1                /* the most one window may scale the limit by: */
#define STEP_DOWN 0.8              /* gently up, faster down */
#define STEP_UP_FAR 1.5            /* ...and up, while the p90 is under half the target */

void svc_admission_init(svc_admission *ad, long fixed, long max, int target_ms) {
    ad->fixed = fixed > 0 ? fixed : 0;
    ad->max = max > SVC_ADMISSION_MIN ? max : SVC_ADMISSION_MIN;
    ad->target_us = (int64_t)(target_ms > 0 ? target_ms : 1) * 1000;
    atomic_store(&ad->inflight, 0);
    atomic_store(&ad->limit, ad->fixed ? ad->fixed
                             : SVC_ADMISSION_INITIAL < ad->max ? SVC_ADMISSION_INITIAL : ad->max);
    atomic_store(&ad->shed, 0);
    atomic_store(&ad->win_n, 0);
    for (int i = 0; i < SVC_ADMISSION_BUCKETS; i++) atomic_store(&ad->win_hist[i], 0);
    atomic_store(&ad->win_peak, 0);
    atomic_store(&ad->win_start_us, clock_mono_us());
    atomic_flag_clear(&ad->updating);
    atomic_store(&ad->last_p90_us, 0);
    atomic_store(&ad->last_in_us, 0);
    ad->conns = NULL;
    ad->conns_ud = NULL;
}

/* ---------------------------------------------------------------- the rule */

/* Whether a window's peak in flight held (nearly: a twentieth spared, for
 * the scraper's and idle connections) every open connection. */
static int conns_held(long peak, long conns) { return conns > 0 && peak >= conns - conns / 20; }

/* The rule by the time in the path alone. */
static long next_by_time(long limit, int64_t p90_us, long peak, int64_t target_us, long max) {
    double g = (double)target_us / (double)p90_us;
    /* Faster than the target but the limit not in use: the load, not the
     * limit, set that time, and it says nothing of more. */
    if (g > 1.0 && peak < limit / 2) return limit;
    /* Half the way to limit * g, within the steps: one noisy window moves
     * it little, the loop's answer to a change (a window or two later)
     * is seen before the next big step, and a burst of slow commits
     * cannot empty it at once. */
    double f = (1.0 + g) / 2.0;
    /* Far under the target (a sale's first second, the limit still at its
     * start): the path has room for twice the orders at least, and x1.1
     * a window would take two seconds to get from 256 to 2,000 while the
     * spike is shed at the door. */
    if (f > STEP_UP) f = g >= 2.0 ? (f < STEP_UP_FAR ? f : STEP_UP_FAR) : STEP_UP;
    if (f < STEP_DOWN) f = STEP_DOWN;
    long n = (long)((double)limit * f);
    if (g > 1.0 && n <= limit) n = limit + 1;  /* small limits still grow */
    if (n < SVC_ADMISSION_MIN) n = SVC_ADMISSION_MIN;
    if (n > max) n = max;
    return n;
}

long svc_admission_next(long limit, int64_t p90_us, long peak, int64_t target_us, long max,
                        long conns) {
    if (p90_us <= 0 || target_us <= 0) return limit;
    long n = next_by_time(limit, p90_us, peak, target_us, max);
    /* Every connection held and the path slowing: the buyers past them
     * wait in their clients, unseen (admission.h); keep a tenth free. */
    if (conns_held(peak, conns) && p90_us * 2 >= target_us) {
        long cap = conns - conns / 10;
        if (cap < SVC_ADMISSION_MIN) cap = SVC_ADMISSION_MIN;
        if (n > cap) n = cap;
    }
    return n;
}

/* --------------------------------------------------------- the window's p90 */

/* The bucket of a time: 0..3 exact, then four a power of two. */
static int bucket_of(uint64_t us) {
    if (us < 4) return (int)us;
    int k = 63 - __builtin_clzll(us);
    int i = 4 * (k - 1) + (int)((us >> (k - 2)) & 3);
    return i < SVC_ADMISSION_BUCKETS ? i : SVC_ADMISSION_BUCKETS - 1;
}

/* The middle of bucket i, in microseconds. */
static int64_t bucket_mid(int i) {
    if (i < 4) return i;
    int k = i / 4 + 1;
    int64_t width = (int64_t)1 << (k - 2);
    return (int64_t)(4 + i % 4) * width + width / 2;
}

/* Empties the window's histogram (n orders); its 90th percentile (0 when
 * empty). */
static int64_t take_p90(svc_admission *ad, uint64_t n) {
    uint64_t counts[SVC_ADMISSION_BUCKETS], seen = 0;
    int64_t p90 = 0;
    for (int i = 0; i < SVC_ADMISSION_BUCKETS; i++)
        counts[i] = atomic_exchange(&ad->win_hist[i], 0);
    for (int i = 0; i < SVC_ADMISSION_BUCKETS && n; i++) {
        seen += counts[i];
        if (seen * 10 >= n * 9) {
            p90 = bucket_mid(i);
            break;
        }
    }
    return p90;
}

/* ------------------------------------------------------------- the door */

int svc_admission_shed(svc_admission *ad) {
    if (atomic_load_explicit(&ad->inflight, memory_order_relaxed) <
        atomic_load_explicit(&ad->limit, memory_order_relaxed))
        return 0;
    atomic_fetch_add_explicit(&ad->shed, 1, memory_order_relaxed);
    return 1;
}

void svc_admission_enter(svc_admission *ad, int64_t now_us) {
    long n = atomic_fetch_add_explicit(&ad->inflight, 1, memory_order_relaxed) + 1;
    atomic_store_explicit(&ad->last_in_us, now_us, memory_order_relaxed);
    /* A racy maximum: a lost update under-reports a peak by a few. */
    if (n > atomic_load_explicit(&ad->win_peak, memory_order_relaxed))
        atomic_store_explicit(&ad->win_peak, n, memory_order_relaxed);
}

/* Ends the current window: its p90 goes to the controller. */
static void close_window(svc_admission *ad, int64_t now) {
    uint64_t n = atomic_exchange(&ad->win_n, 0);
    int64_t p90 = take_p90(ad, n);
    long peak = atomic_exchange(&ad->win_peak, atomic_load(&ad->inflight));
    atomic_store(&ad->win_start_us, now);
    if (!p90) return;
    atomic_store(&ad->last_p90_us, p90);
    if (ad->fixed) return;
    long limit = atomic_load(&ad->limit);
    long conns = ad->conns ? ad->conns(ad->conns_ud) : 0;
    atomic_store(&ad->limit, svc_admission_next(limit, p90, peak, ad->target_us, ad->max, conns));
}

void svc_admission_leave(svc_admission *ad, int64_t micros) {
    atomic_fetch_sub_explicit(&ad->inflight, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&ad->win_hist[bucket_of((uint64_t)(micros > 0 ? micros : 0))], 1,
                              memory_order_relaxed);
    uint64_t n = atomic_fetch_add_explicit(&ad->win_n, 1, memory_order_relaxed) + 1;
    if (n < SVC_ADMISSION_WINDOW_N) return;
    int64_t now = clock_mono_us();
    if (now - atomic_load_explicit(&ad->win_start_us, memory_order_relaxed) <
        SVC_ADMISSION_WINDOW_US)
        return;
    if (atomic_flag_test_and_set(&ad->updating)) return;   /* another thread closes it */
    if (now - atomic_load(&ad->win_start_us) >= SVC_ADMISSION_WINDOW_US) close_window(ad, now);
    atomic_flag_clear(&ad->updating);
}

long svc_admission_limit(const svc_admission *ad) { return atomic_load(&ad->limit); }
long svc_admission_inflight(const svc_admission *ad) { return atomic_load(&ad->inflight); }
uint64_t svc_admission_shed_count(const svc_admission *ad) { return atomic_load(&ad->shed); }
int64_t svc_admission_p90_us(const svc_admission *ad) { return atomic_load(&ad->last_p90_us); }

/* ------------------------------------------------ per strategy, and the door */

void svc_admit_init(svc_admit *am, long fixed, long max, int target_ms) {
    am->fixed = fixed > 0 ? fixed : 0;
    for (int s = 0; s < STOCK_STRATEGY_COUNT; s++)
        svc_admission_init(&am->by_strategy[s], fixed, max, target_ms);
    atomic_store(&am->door_shed, 0);
}

void svc_admit_count_conns(svc_admit *am, long (*fn)(void *ud), void *ud) {
    for (int s = 0; s < STOCK_STRATEGY_COUNT; s++) {
        am->by_strategy[s].conns = fn;
        am->by_strategy[s].conns_ud = ud;
    }
}

/* In use: orders in flight (inflight, read by the caller), or one in the
 * last SVC_ADMISSION_ACTIVE_US. */
static int in_use(const svc_admission *ad, long inflight, int64_t now_us) {
    return inflight > 0 || now_us - atomic_load_explicit(&ad->last_in_us, memory_order_relaxed) <
                               SVC_ADMISSION_ACTIVE_US;
}

int svc_admit_in_use(svc_admit *am, stock_strategy s, int64_t now_us) {
    svc_admission *ad = &am->by_strategy[s];
    return in_use(ad, atomic_load_explicit(&ad->inflight, memory_order_relaxed), now_us);
}

/* The orders in flight in all, and the door's limit: --max-inflight, or
 * the limits of the strategies in use plus room for one to start. */
static void door_figures(svc_admit *am, long *inflight, long *limit) {
    int64_t now = clock_mono_us();
    long n = 0, l = SVC_ADMISSION_MIN;
    for (int s = 0; s < STOCK_STRATEGY_COUNT; s++) {
        const svc_admission *ad = &am->by_strategy[s];
        long f = atomic_load_explicit(&ad->inflight, memory_order_relaxed);
        n += f;
        if (!am->fixed && in_use(ad, f, now)) l += atomic_load_explicit(&ad->limit, memory_order_relaxed);
    }
    *inflight = n;
    *limit = am->fixed ? am->fixed : l;
}

int svc_admit_door(svc_admit *am) {
    long n, limit;
    door_figures(am, &n, &limit);
    if (n < limit) return 0;
    atomic_fetch_add_explicit(&am->door_shed, 1, memory_order_relaxed);
    return 1;
}

int svc_admit_shed(svc_admit *am, stock_strategy s) {
    assert(s < STOCK_STRATEGY_COUNT);
    if (am->fixed) return 0;                  /* one limit for all: the door's */
    return svc_admission_shed(&am->by_strategy[s]);
}

void svc_admit_enter(svc_admit *am, stock_strategy s, int64_t now_us) {
    assert(s < STOCK_STRATEGY_COUNT);
    svc_admission_enter(&am->by_strategy[s], now_us);
}

void svc_admit_leave(svc_admit *am, stock_strategy s, int64_t micros) {
    assert(s < STOCK_STRATEGY_COUNT);
    svc_admission_leave(&am->by_strategy[s], micros);
}

long svc_admit_door_limit(svc_admit *am) {
    long n, limit;
    door_figures(am, &n, &limit);
    return limit;
}

long svc_admit_inflight(svc_admit *am) {
    long n, limit;
    door_figures(am, &n, &limit);
    return n;
}

uint64_t svc_admit_shed_count(svc_admit *am) {
    uint64_t n = atomic_load(&am->door_shed);
    for (int s = 0; s < STOCK_STRATEGY_COUNT; s++) n += svc_admission_shed_count(&am->by_strategy[s]);
    return n;
}
