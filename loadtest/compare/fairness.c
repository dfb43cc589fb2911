/* fairness.c: `flashload compare`'s fairness group (docs/fairness.md;
 * Alibaba Cloud's "Implementation Principles and Best Practices of Distributed Lock"
 * §6.1 counts fairness among what a distributed lock must have: "when the
 * lock wakes up, it does so in sequence"): buyers who
 * arrive at a lock in a known order, each on a connection of its own, each
 * order holding the lock for the product's critical-section pause once it
 * has it; the order they were served in is set against the order they
 * came in. Two scenes per lock:
 *
 *   queue    the buyers arrive close together while the first of them
 *            holds the lock: who is served next, and next?
 *   stream   they keep arriving, faster than the lock is handed on, so the
 *            line grows while it is served: each hand-off is a chance for
 *            a newcomer to overtake those waiting (an unfair lock's
 *            starvation).
 *
 * Buyers alternate between the instances of the scene (two, but one for
 * `local`, whose mutex is one process's), so a lock that is fair only
 * inside one process shows it. The service order is the order of the
 * 201s' arrival at the buyers: holders follow each other by the pause
 * (tens of ms), far more than the answers' spread. Measured per scene:
 * pairs of served buyers served against arrival order (of all pairs),
 * the median and longest wait (request to answer, less the buyer's own
 * hold), and the buyers not served while someone who came later was
 * (starved). Before the buyers, one order on each instance warms its path
 * to the lock (a ZooKeeper session, an etcd connection are opened on first
 * use, and would make the first buyers of one instance late); it is not
 * counted. The books are checked too: the product must show exactly the
 * units the 201s took. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "loadtest/compare/compare_int.h"

typedef struct buyer {
    const fl_target *t;
    const char *token, *sku;
    int index;
    int64_t start_us;            /* when to send (monotonic) */
    int64_t sent_us, answered_us;
    int status;                  /* -1: no answer */
    char error[48];
} buyer;

static void sleep_until(int64_t at_us) {
    int64_t left = at_us - clock_mono_us();
    if (left <= 0) return;
    struct timespec ts = { left / 1000000, (left % 1000000) * 1000 };
    while (nanosleep(&ts, &ts) != 0) {}
}

static void *buyer_run(void *arg) {
    buyer *b = arg;
    fl_http h;
    fl_err e;
    char path[128], body[256];
    fl_http_init(&h, b->t, b->token, 30000);
    /* A warm keep-alive connection first: the send is then the arrival. */
    snprintf(path, sizeof path, "/v1/products/%s", b->sku);
    fl_http_request(&h, "GET", path, NULL, &e);
    snprintf(body, sizeof body, "{\"sku\":\"%s\",\"user_id\":\"fair-%d\",\"quantity\":1}", b->sku,
             b->index);
    sleep_until(b->start_us);
    b->sent_us = clock_mono_us();
    b->status = fl_http_request(&h, "POST", "/v1/orders", body, &e);
    b->answered_us = clock_mono_us();
    if (b->status > 0 && b->status != 201 && h.resp.body)
        fl_json_str(h.resp.body, h.resp.body_len, "error", b->error, sizeof b->error);
    fl_http_close(&h);
    return NULL;
}

static buyer *sort_base;
static int by_answer(const void *x, const void *y) {
    const buyer *a = &sort_base[*(const int *)x], *b = &sort_base[*(const int *)y];
    return a->answered_us < b->answered_us ? -1 : a->answered_us > b->answered_us;
}

static int cmp_ms(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

const char *fl_fair_scene_name(int kind) { return kind == FL_FAIR_STREAM ? "stream" : "queue"; }

void fl_fair_scene_setup(fl_scene *sc, int kind) {
    sc->group = FL_GROUP_FAIRNESS;
    sc->fair_scene = kind;
    sc->segments = 1;
    /* The gaps are wider than an instance's own jitter (a request to its
     * lock call: a worker thread scheduled, a round trip), so that the
     * order the buyers sent in is the order they reached the lock. */
    if (kind == FL_FAIR_QUEUE) {
        sc->waiters = 12;        /* one every 10 ms, one served every 60 ms: a long line */
        sc->gap_ms = 10;
        sc->cs_delay_ms = 60;
    } else {
        sc->waiters = 24;        /* one every 20 ms, one served every 30 ms */
        sc->gap_ms = 20;
        sc->cs_delay_ms = 30;
    }
    sc->stock = sc->waiters;
    sc->duration_s = (sc->waiters * (sc->cs_delay_ms + 5) + 500) / 1000.0;
    snprintf(sc->condition, sizeof sc->condition,
             kind == FL_FAIR_QUEUE
                 ? "fairness: %d buyers %d ms apart at a held lock, %d ms each, %d instance%s"
                 : "fairness: %d buyers %d ms apart, a little faster than the lock is handed "
                   "on (%d ms each), %d instance%s",
             sc->waiters, sc->gap_ms, sc->cs_delay_ms, sc->instances,
             sc->instances > 1 ? "s, alternating" : "");
}

/* The figures of one run, from its buyers. */
static void figures(const fl_scene *sc, buyer *b, fl_scene_result *res) {
    int n = sc->waiters, served = 0, order[FL_FAIR_MAX];
    double waits[FL_FAIR_MAX];
    int64_t last_served_arrival = -1;
    for (int i = 0; i < n; i++)
        if (b[i].status == 201) order[served++] = i;
    sort_base = b;
    qsort(order, (size_t)served, sizeof order[0], by_answer);
    res->fair_served = served;
    res->fair_pairs = (long)served * (served - 1) / 2;
    res->fair_out_of_order = 0;
    for (int x = 0; x < served; x++) {
        res->fair_order[x] = (unsigned char)order[x];
        for (int y = x + 1; y < served; y++)
            if (order[x] > order[y]) res->fair_out_of_order++;
        /* The wait: the answer's time less the buyer's own hold. */
        waits[x] = (double)(b[order[x]].answered_us - b[order[x]].sent_us) / 1000.0 -
                   sc->cs_delay_ms;
        if (waits[x] < 0) waits[x] = 0;
        if (order[x] > last_served_arrival) last_served_arrival = order[x];
    }
    res->fair_starved = 0;
    for (int i = 0; i < n; i++)
        if (b[i].status != 201 && i < last_served_arrival) res->fair_starved++;
    qsort(waits, (size_t)served, sizeof waits[0], cmp_ms);
    res->fair_wait_median_ms = served ? waits[served / 2] : 0;
    res->fair_wait_max_ms = served ? waits[served - 1] : 0;
}

int fl_fair_run(const fl_world *w, const char *sku, fl_scene_result *res, fl_err *e) {
    const fl_scene *sc = &res->sc;
    int n = sc->waiters;
    buyer b[FL_FAIR_MAX];
    pthread_t t[FL_FAIR_MAX];
    if (n > FL_FAIR_MAX || sc->instances > w->ntargets) return fl_errf(e, "bad fairness scene");
    fl_http h;
    fl_http_init(&h, &w->targets[0], w->token, 10000);
    int warm = sc->instances;
    fl_product_spec ps = { .stock = n + warm, .segments = 1, .cs_delay_ms = sc->cs_delay_ms };
    snprintf(ps.sku, sizeof ps.sku, "%s", sku);
    snprintf(ps.strategy, sizeof ps.strategy, "%s", sc->strategy);
    int rc = fl_product_create(&h, &ps, e);
    fl_http_close(&h);
    if (rc) return -1;
    for (int i = 0; i < warm; i++) {
        char body[200];
        snprintf(body, sizeof body, "{\"sku\":\"%s\",\"user_id\":\"fair-warm-%d\",\"quantity\":1}",
                 sku, i);
        fl_http_init(&h, &w->targets[i], w->token, 30000);
        rc = fl_http_request(&h, "POST", "/v1/orders", body, e);
        fl_http_close(&h);
        if (rc != 201) return rc < 0 ? -1 : fl_errf(e, "the warm-up order on instance %d was "
                                                       "answered %d", i + 1, rc);
    }
    int64_t t0 = clock_mono_us() + 300000;   /* every buyer's connection warm by then */
    int started = 0;
    for (int i = 0; i < n; i++) {
        b[i] = (buyer){ .t = &w->targets[i % sc->instances], .token = w->token, .sku = sku,
                        .index = i, .start_us = t0 + (int64_t)i * sc->gap_ms * 1000,
                        .status = -1 };
        if (pthread_create(&t[i], NULL, buyer_run, &b[i]) != 0) break;
        started++;
    }
    for (int i = 0; i < started; i++) pthread_join(t[i], NULL);
    if (started < n) return fl_errf(e, "could not start a buyer thread");
    figures(sc, b, res);
    /* The answers' latency, request to answer, the hold included. */
    uint64_t lat[FL_FAIR_MAX];
    int nl = 0;
    for (int i = 0; i < n; i++)
        if (b[i].status > 0) lat[nl++] = (uint64_t)(b[i].answered_us - b[i].sent_us);
    for (int x = 1; x < nl; x++)
        for (int y = x; y > 0 && lat[y - 1] > lat[y]; y--) {
            uint64_t tmp = lat[y];
            lat[y] = lat[y - 1];
            lat[y - 1] = tmp;
        }
    if (nl) {
        res->p50_us = lat[nl / 2];
        res->p90_us = lat[nl * 9 / 10];
        res->p99_us = res->p999_us = lat[nl * 99 / 100];
        res->max_us = lat[nl - 1];
    }
    /* The answers, and the books. */
    long long units = 0;
    for (int i = 0; i < n; i++) {
        if (b[i].status == 201) units++;
        else if (b[i].status == 429) res->status_429++;
        else if (b[i].status >= 500) res->status_5xx++;
        else if (b[i].status < 0) res->transport_errors++;
    }
    res->answered = (uint64_t)(n - (int)res->transport_errors);
    res->created = res->status_201 = (uint64_t)units;
    fl_product p = { 0 };
    fl_http_init(&h, &w->targets[0], w->token, 10000);
    int got = -1;
    for (int tries = 0; tries < 20; tries++) {   /* reads are up to 50 ms old */
        if ((got = fl_product_get(&h, sku, &p, e)) == 0 && p.sold == units + warm) break;
        clock_sleep_ms(50);
    }
    fl_http_close(&h);
    p.sold -= warm;                  /* the buyers' units only, from here */
    res->verdict.sold = p.sold;
    res->verdict.oversold = p.sold > n ? p.sold - n : 0;
    res->verdict.min_stock = p.stock_available;
    res->ran = 1;
    if (got != 0) {
        snprintf(res->verdict_line, sizeof res->verdict_line, "FAIL: the product could not be "
                 "read: %.200s", e->msg);
    } else if (p.sold != units || p.stock_available != n - units) {
        snprintf(res->verdict_line, sizeof res->verdict_line,
                 "FAIL: %lld 201s, but the product shows %lld sold and %lld available of %d",
                 units, p.sold, p.stock_available, n);
    } else {
        snprintf(res->verdict_line, sizeof res->verdict_line,
                 "PASS: %ld of %ld pairs out of arrival order, wait median %.0f ms, longest "
                 "%.0f ms, %d starved%s",
                 res->fair_out_of_order, res->fair_pairs, res->fair_wait_median_ms,
                 res->fair_wait_max_ms, res->fair_starved,
                 units < n ? " (some not served: see the answers)" : "");
    }
    int books = !strncmp(res->verdict_line, "PASS", 4);
    res->verdict.pass = books;
    /* The fair lock claims the order; the others' figures are what they are. */
    int claims = !strcmp(sc->strategy, "fair-lock");
    res->as_expected = books && units == n &&
                       (!claims || (res->fair_out_of_order == 0 && res->fair_starved == 0));
    if (books && claims && !res->as_expected)
        snprintf(res->forced_why, sizeof res->forced_why, "the fair lock served %ld pairs out "
                 "of arrival order, %d starved", res->fair_out_of_order, res->fair_starved);
    else if (books && units < n)
        snprintf(res->forced_why, sizeof res->forced_why, "%lld of %d buyers served "
                 "(429: %llu, 5xx: %llu, no answer: %llu)", units, n,
                 (unsigned long long)res->status_429, (unsigned long long)res->status_5xx,
                 (unsigned long long)res->transport_errors);
    int64_t first = 0, last = 0;
    for (int i = 0; i < n; i++) {
        if (!first || b[i].sent_us < first) first = b[i].sent_us;
        if (b[i].answered_us > last) last = b[i].answered_us;
    }
    double secs = (double)(last - first) / 1e6;
    res->orders_per_s = secs > 0 ? (double)units / secs : 0;
    res->answers_per_s = secs > 0 ? (double)res->answered / secs : 0;
    return 0;
}
