/* metrics.c: counters and histograms, rendered in the Prometheus text
 * format (0.0.4). docs/metrics.md lists every series, its labels and what
 * bounds each label.
 *
 * Updates are relaxed atomic adds into fixed arrays (metrics.h): no lock,
 * no allocation and no formatting on the order path; a histogram
 * observation is two adds (its bucket and its sum; the count is the sum of
 * the buckets, computed at a scrape). A scrape may see counters a few
 * operations apart, as Prometheus expects.
 *
 * Labels come from fixed tables only: the strategies and Redis call kinds
 * are the stock module's (stock_strategy_about, stock_call_name), so a new
 * strategy or call kind there is a new label value here with no change to
 * this file; routes, statuses and error codes are the tables below. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/version.h"
#include "service/app.h"
#include "service/ops/metrics.h"

/* ------------------------------------------------------------------ tables */

/* A histogram's upper bounds, in the unit observed, and the factor that
 * turns that unit into the exposed one (microseconds into seconds). */
typedef struct bounds {
    int n;
    int64_t le[HIST_BUCKETS];
    double scale;
} bounds;

/* Latencies, 50 us .. 10 s: a Redis round trip is ~0.1 ms, a lock wait
 * or a stalled store seconds. */
static const bounds LATENCY = {
    16,
    { 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000,
      1000000, 2500000, 10000000 },
    1e-6,
};

/* Orders per group commit: the writer takes at most 4096 (lifecycle.c). */
static const bounds GROUP = {
    13, { 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096 }, 1,
};

static const char *const ROUTE_NAMES[ROUTE_COUNT + 1] = {
    [ROUTE_PRODUCT_CREATE] = "product_create", [ROUTE_PRODUCT_GET] = "product_get",
    [ROUTE_PRODUCT_RESTOCK] = "product_restock", [ROUTE_ORDER_CREATE] = "order_create",
    [ROUTE_ORDER_GET] = "order_get", [ROUTE_ORDER_LIST] = "order_list",
    [ROUTE_ORDER_CONFIRM] = "order_confirm", [ROUTE_ORDER_CANCEL] = "order_cancel",
    [ROUTE_STRATEGIES] = "strategies", [ROUTE_HEALTHZ] = "healthz", [ROUTE_METRICS] = "metrics",
    [ROUTE_OPENAPI] = "openapi", [ROUTE_TICKET_TAKE] = "ticket_take",
    [ROUTE_TICKET_GET] = "ticket_get", [ROUTE_COUNT] = "unrouted",
};

static const char *const OUTCOME_NAMES[OUT_COUNT] = {
    [OUT_CREATED] = "created", [OUT_REPLAYED] = "replayed", [OUT_SOLD_OUT] = "sold_out",
    [OUT_INSUFFICIENT] = "insufficient_stock", [OUT_LIMIT] = "per_user_limit",
    [OUT_KEY_REUSED] = "idempotency_key_reused", [OUT_IN_PROGRESS] = "request_in_progress",
    [OUT_LOCK_TIMEOUT] = "lock_timeout", [OUT_FENCED] = "lock_fenced",
    [OUT_CONFLICT] = "optimistic_conflict", [OUT_REDIS_UNAVAILABLE] = "redis_unavailable",
    [OUT_DB_UNAVAILABLE] = "db_unavailable", [OUT_LOCK_UNAVAILABLE] = "lock_unavailable",
    [OUT_DB_BUSY] = "db_connections_busy",
};

/* The statuses the API answers (docs/openapi.yaml); the last slot counts
 * any other, as status="other" (tests/test_metrics.py checks the two
 * agree). */
static const int STATUSES[SVC_NSTATUS] = {
    200, 201, 400, 401, 403, 404, 405, 409, 413, 415, 422, 429, 500, 503, 0,
};

/* The API's error codes (docs/api.md, the Error schema's enum), after
 * "none" (an answer that is not an error) and before "other". */
static const char *const ERRORS[] = {
    "none", "bad_request", "invalid_json", "invalid_field", "missing_field", "unauthorized",
    "not_found", "unknown_sku", "unknown_order", "method_not_allowed", "sold_out",
    "insufficient_stock", "sku_exists", "per_user_limit", "order_expired", "order_cancelled",
    "order_confirmed", "request_in_progress",
    "body_too_large", "unsupported_media_type", "idempotency_key_reused", "lock_timeout",
    "strategy_unavailable", "lock_unavailable", "redis_unavailable", "db_unavailable",
    "shutting_down", "overloaded", "invalid_ticket", "not_your_turn", "sale_not_open",
    "turn_over", "no_waiting_room", "internal_error", "other",
};
/* Every slot named: a code past the table counts as the last, "other". */
_Static_assert(sizeof ERRORS / sizeof ERRORS[0] == SVC_NERROR, "ERRORS and SVC_NERROR differ");

const char *svc_outcome_name(svc_outcome o) { return OUTCOME_NAMES[o]; }

static int status_slot(int status) {
    switch (status) {
    case 200: return 0;
    case 201: return 1;
    case 400: return 2;
    case 401: return 3;
    case 403: return 4;
    case 404: return 5;
    case 405: return 6;
    case 409: return 7;
    case 413: return 8;
    case 415: return 9;
    case 422: return 10;
    case 429: return 11;
    case 500: return 12;
    case 503: return 13;
    default: return SVC_NSTATUS - 1;
    }
}

/* Only error answers look their code up, and they have just formatted a
 * JSON body: a scan of 22 short strings is small beside that. */
static int error_slot(const char *code) {
    if (!code) return 0;
    for (int i = 1; i < SVC_NERROR - 1; i++)
        if (code[0] == ERRORS[i][0] && !strcmp(code, ERRORS[i])) return i;
    return SVC_NERROR - 1;
}

/* ------------------------------------------------------------- observing */

static void hist_add(svc_histogram *h, const bounds *b, int64_t v) {
    int i = 0;
    while (i < b->n && v > b->le[i]) i++;
    atomic_fetch_add_explicit(&h->bucket[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum, (uint64_t)(v > 0 ? v : 0), memory_order_relaxed);
}

void svc_histogram_observe(svc_histogram *h, int64_t micros) { hist_add(h, &LATENCY, micros); }

void svc_metrics_http(const http_answer *ans, void *ud) {
    svc_app *a = ud;
    int r = ans->route_id < 0 || ans->route_id >= ROUTE_COUNT ? ROUTE_COUNT : ans->route_id;
    hist_add(&a->m.route_latency[r], &LATENCY, ans->micros);
    atomic_fetch_add_explicit(&a->m.responses[r][status_slot(ans->status)][error_slot(ans->error)],
                              1, memory_order_relaxed);
    if (r == ROUTE_ORDER_CREATE && ans->tag >= 0 && ans->tag < STOCK_STRATEGY_COUNT)
        hist_add(&a->m.order_latency[ans->tag], &LATENCY, ans->micros);
}

void svc_metrics_redis_call(stock_call call, int64_t micros, void *ud) {
    svc_app *a = ud;
    if (call < 0 || call >= STOCK_CALL_COUNT) call = STOCK_CALL_OTHER;
    hist_add(&a->m.redis_call[call], &LATENCY, micros);
}

void svc_metrics_commit(size_t orders, int64_t micros, int ok, void *ud) {
    svc_app *a = ud;
    (void)ok;                      /* failures: flashsale_db_commit_failures_total */
    hist_add(&a->m.commit_latency, &LATENCY, micros);
    hist_add(&a->m.commit_orders, &GROUP, (int64_t)orders);
}

void svc_metrics_swept(svc_app *a, long long records, long long oldest_ms,
                       const long long oversold[STOCK_STRATEGY_COUNT]) {
    svc_metrics *m = &a->m;
    for (int s = 0; s < STOCK_STRATEGY_COUNT; s++) atomic_store(&m->oversold[s], oversold[s]);
    atomic_store(&m->pending_records, records);
    atomic_store(&m->pending_oldest_ms, oldest_ms);
    atomic_store(&m->swept_wall_ms, (long long)clock_wall_ms());
}

/* -------------------------------------------------------------- rendering */

/* A growing text buffer. Out of memory, it stops growing and says so
 * (oom); the page is then not served, rather than served cut short. */
typedef struct buf {
    char *p;
    size_t len, cap;
    int oom;
} buf;

static void put(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(buf *b, const char *fmt, ...) {
    va_list ap;
    while (!b->oom) {
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)(n < 0 ? 0 : n) + 64;
        char *q = realloc(b->p, cap);
        if (!q || n < 0) {
            if (q) b->p = q;
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
}

static void family(buf *b, const char *name, const char *type, const char *help) {
    put(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One histogram's series; labels is "" or `name="value",...`. */
static void put_histogram(buf *b, const char *name, const char *labels, svc_histogram *h,
                          const bounds *bd) {
    uint64_t cum = 0;
    const char *sep = labels[0] ? "," : "";
    for (int i = 0; i < bd->n; i++) {
        cum += atomic_load_explicit(&h->bucket[i], memory_order_relaxed);
        put(b, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep,
            (double)bd->le[i] * bd->scale, (unsigned long long)cum);
    }
    cum += atomic_load_explicit(&h->bucket[bd->n], memory_order_relaxed);
    put(b, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep, (unsigned long long)cum);
    double sum = (double)atomic_load_explicit(&h->sum, memory_order_relaxed) * bd->scale;
    if (labels[0]) {
        put(b, "%s_sum{%s} %.6f\n%s_count{%s} %llu\n", name, labels, sum, name, labels,
            (unsigned long long)cum);
    } else {
        put(b, "%s_sum %.6f\n%s_count %llu\n", name, sum, name, (unsigned long long)cum);
    }
}

static void counter(buf *b, const char *name, const char *help, uint64_t v) {
    family(b, name, "counter", help);
    put(b, "%s %llu\n", name, (unsigned long long)v);
}

/* A label value in the text format's escaping (backslash, quote, newline). */
static void put_label_value(buf *b, const char *s) {
    for (; *s; s++) {
        if (*s == '\\' || *s == '"') put(b, "\\%c", *s);
        else if (*s == '\n') put(b, "\\n");
        else put(b, "%c", *s);
    }
}

static const char *strategy_name(int s) { return stock_strategy_about((stock_strategy)s)->name; }

static void render_orders(buf *b, svc_metrics *m) {
    char labels[96];
    family(b, "flashsale_orders_total", "counter",
           "Orders that reached their product's strategy, by strategy and outcome.");
    for (int s = 0; s < STOCK_STRATEGY_COUNT; s++)
        for (int o = 0; o < OUT_COUNT; o++)
            put(b, "flashsale_orders_total{strategy=\"%s\",outcome=\"%s\"} %llu\n",
                strategy_name(s), OUTCOME_NAMES[o],
                (unsigned long long)atomic_load_explicit(&m->orders[s][o], memory_order_relaxed));
    family(b, "flashsale_order_duration_seconds", "histogram",
           "POST /v1/orders from request in to answer out, by the product's strategy.");
    for (int s = 0; s < STOCK_STRATEGY_COUNT; s++) {
        snprintf(labels, sizeof labels, "strategy=\"%s\"", strategy_name(s));
        put_histogram(b, "flashsale_order_duration_seconds", labels, &m->order_latency[s],
                      &LATENCY);
    }
}

static void render_http(buf *b, svc_metrics *m) {
    char labels[64];
    family(b, "flashsale_http_request_duration_seconds", "histogram",
           "Time from request to answer, by route.");
    for (int r = 0; r <= ROUTE_COUNT; r++) {
        snprintf(labels, sizeof labels, "route=\"%s\"", ROUTE_NAMES[r]);
        put_histogram(b, "flashsale_http_request_duration_seconds", labels, &m->route_latency[r],
                      &LATENCY);
    }
    family(b, "flashsale_http_responses_total", "counter",
           "Answers by route, HTTP status and API error code (code=\"none\": not an error).");
    for (int r = 0; r <= ROUTE_COUNT; r++)
        for (int s = 0; s < SVC_NSTATUS; s++)
            for (int e = 0; e < SVC_NERROR; e++) {
                uint64_t n = atomic_load_explicit(&m->responses[r][s][e], memory_order_relaxed);
                if (!n) continue;
                if (STATUSES[s])
                    put(b, "flashsale_http_responses_total{route=\"%s\",status=\"%d\",code=\"%s\"}"
                           " %llu\n", ROUTE_NAMES[r], STATUSES[s], ERRORS[e], (unsigned long long)n);
                else
                    put(b, "flashsale_http_responses_total{route=\"%s\",status=\"other\","
                           "code=\"%s\"} %llu\n", ROUTE_NAMES[r], ERRORS[e], (unsigned long long)n);
            }
}

/* The admission limits of the order path (order/admission.h): the door's,
 * and each strategy's. */
static void render_admission(svc_app *a, buf *b) {
    svc_admit *am = &a->adm;
    counter(b, "flashsale_orders_shed_total",
            "POST /v1/orders answered 503 overloaded: at the door, before parsing, or at its "
            "strategy's admission limit; nothing taken.", svc_admit_shed_count(am));
    family(b, "flashsale_order_admission_limit", "gauge",
           "Orders the door admits at once: --max-inflight, or the sum of the adaptive "
           "limits of the strategies in use plus room for one more to start.");
    put(b, "flashsale_order_admission_limit %ld\n", svc_admit_door_limit(am));
    family(b, "flashsale_orders_inflight", "gauge",
           "Orders admitted into the order path and not yet answered.");
    put(b, "flashsale_orders_inflight %ld\n", svc_admit_inflight(am));
    /* Read at the scrape, from the quota's own cpu.stat: nothing on the
     * order path, and rate() over it is the frozen share. */
    long long frozen_us = cpus_throttled_us(&a->cfg.cpus);
    family(b, "flashsale_cpu_throttled_seconds_total", "counter",
           "Time the kernel has kept this process's CPU-quota group (a container's limit) "
           "frozen, summed over its CPUs (the quota's cpu.stat); 0 without a quota. rate() "
           "over it, divided by the CPUs busy, is the share of the time frozen.");
    put(b, "flashsale_cpu_throttled_seconds_total %.6f\n",
        frozen_us > 0 ? (double)frozen_us / 1e6 : 0.0);
    family(b, "flashsale_order_admission_latency_target_seconds", "gauge",
           "--order-latency-target-ms: the p90 of the time in the order path each "
           "strategy's adaptive limit aims at (shown with a fixed limit too).");
    put(b, "flashsale_order_admission_latency_target_seconds %.3f\n",
        (double)a->cfg.latency_target_ms / 1e3);
    /* Per strategy, the strategies in use (an order in the last second)
     * and those that ever shed: the figures of the others are their
     * starting points, not news. */
    static const struct { const char *name, *type, *help; } F[] = {
        { "flashsale_strategy_admission_limit", "gauge",
          "Orders of this strategy admitted at once now (adaptive; --max-inflight: that)." },
        { "flashsale_strategy_orders_inflight", "gauge",
          "Orders of this strategy in the order path now." },
        { "flashsale_strategy_orders_shed_total", "counter",
          "Orders of this strategy shed at its own limit (503 overloaded), after parsing." },
        { "flashsale_strategy_admission_latency_seconds", "gauge",
          "90th percentile of the time this strategy's admitted orders spent in the path "
          "in its latest window (100 ms, 16 orders at least), counted from before the "
          "request was read (plus its loop's last turn): what its adaptive limit compares "
          "with --order-latency-target-ms." },
    };
    int64_t now = clock_mono_us();
    for (size_t f = 0; f < sizeof F / sizeof F[0]; f++) {
        family(b, F[f].name, F[f].type, F[f].help);
        for (int s = 0; s < STOCK_STRATEGY_COUNT; s++) {
            const svc_admission *ad = &am->by_strategy[s];
            if (!svc_admit_in_use(am, (stock_strategy)s, now) && !svc_admission_shed_count(ad))
                continue;
            put(b, "%s{strategy=\"%s\"} ", F[f].name, strategy_name(s));
            if (f == 0) put(b, "%ld\n", svc_admission_limit(ad));
            else if (f == 1) put(b, "%ld\n", svc_admission_inflight(ad));
            else if (f == 2) put(b, "%llu\n", (unsigned long long)svc_admission_shed_count(ad));
            else put(b, "%.6f\n", (double)svc_admission_p90_us(ad) / 1e6);
        }
    }
}

static void render_stores(svc_app *a, buf *b, svc_metrics *m) {
    char labels[64];
    family(b, "flashsale_redis_call_duration_seconds", "histogram",
           "Redis calls of the stock module, from sending to the reply (failures included), "
           "by kind of call.");
    for (int c = 0; c < STOCK_CALL_COUNT; c++) {
        snprintf(labels, sizeof labels, "call=\"%s\"", stock_call_name((stock_call)c));
        put_histogram(b, "flashsale_redis_call_duration_seconds", labels, &m->redis_call[c],
                      &LATENCY);
    }
    family(b, "flashsale_db_commit_duration_seconds", "histogram",
           "SQLite group commits holding orders, from BEGIN to COMMIT (fsync included).");
    put_histogram(b, "flashsale_db_commit_duration_seconds", "", &m->commit_latency, &LATENCY);
    family(b, "flashsale_db_commit_group_orders", "histogram",
           "Orders per SQLite group commit (one transaction, one fsync).");
    put_histogram(b, "flashsale_db_commit_group_orders", "", &m->commit_orders, &GROUP);

    long long swept = atomic_load(&m->swept_wall_ms);
    family(b, "flashsale_pending_reservations", "gauge",
           "Reservations in Redis not known committed or given back, as the latest "
           "maintenance sweep left them (every SKU; the same on every instance).");
    put(b, "flashsale_pending_reservations %lld\n", atomic_load(&m->pending_records));
    family(b, "flashsale_pending_oldest_age_seconds", "gauge",
           "Age of the oldest of those at that sweep (0: none).");
    put(b, "flashsale_pending_oldest_age_seconds %.3f\n",
        (double)atomic_load(&m->pending_oldest_ms) / 1e3);
    family(b, "flashsale_pending_timeout_seconds", "gauge",
           "--pending-timeout-ms: a reservation this old is settled by the next sweep.");
    put(b, "flashsale_pending_timeout_seconds %.3f\n", (double)a->cfg.pending_timeout_ms / 1e3);
    family(b, "flashsale_pending_sweep_timestamp_seconds", "gauge",
           "When the latest complete sweep ended (0: none yet): the two above are that old.");
    put(b, "flashsale_pending_sweep_timestamp_seconds %.3f\n", (double)swept / 1e3);
    family(b, "flashsale_oversold_units", "gauge",
           "Units committed beyond stock_initial (SQLite), summed over the strategy's "
           "products, at the latest sweep. Above 0 is an oversell.");
    for (int s = 0; s < STOCK_STRATEGY_COUNT; s++)
        put(b, "flashsale_oversold_units{strategy=\"%s\"} %lld\n", strategy_name(s),
            atomic_load(&m->oversold[s]));

    family(b, "flashsale_lock_acquire_duration_seconds", "histogram",
           "Time to get a stock lock.");
    put_histogram(b, "flashsale_lock_acquire_duration_seconds", "", &m->lock_acquire, &LATENCY);
    family(b, "flashsale_lock_acquires_total", "counter", "Lock acquisitions by outcome.");
    static const char *const LOCK_OUT[3] = { "acquired", "timeout", "error" };
    for (int i = 0; i < 3; i++)
        put(b, "flashsale_lock_acquires_total{outcome=\"%s\"} %llu\n", LOCK_OUT[i],
            (unsigned long long)atomic_load(&m->lock_outcomes[i]));

    family(b, "flashsale_lock_handoff_seconds", "histogram",
           "Time from this process releasing a stock lock to its next acquire here "
           "completing, when that acquirer was waiting.");
    for (int s = 0; s < STOCK_STRATEGY_COUNT; s++) {
        stock_kind k = stock_strategy_about((stock_strategy)s)->kind;
        if (k != STOCK_KIND_RCW && k != STOCK_KIND_LOCK) continue;
        snprintf(labels, sizeof labels, "strategy=\"%s\"", strategy_name(s));
        put_histogram(b, "flashsale_lock_handoff_seconds", labels, &m->lock_handoff[s],
                      &LATENCY);
    }

    counter(b, "flashsale_redis_errors_total", "Redis operations that failed.",
            atomic_load(&m->redis_errors));
    counter(b, "flashsale_room_orders_held_total", "Orders of a product with a waiting "
            "room that waited in the instance for their place's turn (--room-order-wait-ms).",
            atomic_load(&m->room_orders_held));
    counter(b, "flashsale_room_places_known_total", "Places of a waiting room given back from "
            "this instance's memory (a user asking for its place again, its turn not over): "
            "no Redis call.", atomic_load(&m->room_places_known));
    counter(b, "flashsale_db_errors_total", "Database operations that failed.",
            atomic_load(&m->db_errors));
    counter(b, "flashsale_reserve_batches_total", "Pipelined reservation round trips.",
            atomic_load(&m->reserve_batches));
    counter(b, "flashsale_reserve_orders_total", "Reservations sent in those round trips.",
            atomic_load(&m->reserve_orders));
    counter(b, "flashsale_stock_rebuilds_total", "Redis stock copies rebuilt from SQLite.",
            atomic_load(&m->rebuilds));
    family(b, "flashsale_reconciled_total", "counter",
           "Pending reservations settled by reconciliation.");
    put(b, "flashsale_reconciled_total{result=\"committed\"} %llu\n"
           "flashsale_reconciled_total{result=\"given_back\"} %llu\n",
        (unsigned long long)atomic_load(&m->settled_commit),
        (unsigned long long)atomic_load(&m->settled_undo));
    family(b, "flashsale_holds_ended_total", "counter",
           "Holds that left reserved, by outcome (this instance decided it).");
    static const char *const HOLD_OUT[3] = { "confirmed", "cancelled", "expired" };
    for (int i = 0; i < 3; i++)
        put(b, "flashsale_holds_ended_total{outcome=\"%s\"} %llu\n", HOLD_OUT[i],
            (unsigned long long)atomic_load(&m->holds_ended[i]));
    family(b, "flashsale_hold_units_returned_total", "counter",
           "Units of ended holds given back to the Redis stock copy, by cause.");
    put(b, "flashsale_hold_units_returned_total{cause=\"cancel\"} %llu\n"
           "flashsale_hold_units_returned_total{cause=\"expiry\"} %llu\n",
        (unsigned long long)atomic_load(&m->hold_returned[SVC_RETURN_CANCEL]),
        (unsigned long long)atomic_load(&m->hold_returned[SVC_RETURN_EXPIRY]));
    family(b, "flashsale_hold_returns_forgotten_total", "counter",
           "Returns of ended holds decided before the forgetting mark (not given; left owed).");
    put(b, "flashsale_hold_returns_forgotten_total %llu\n",
        (unsigned long long)atomic_load(&m->hold_forgotten));
    family(b, "flashsale_units_held", "gauge",
           "Units of reserved holds over every product (SQLite, read each second).");
    put(b, "flashsale_units_held %lld\n", atomic_load(&m->units_held));
    family(b, "flashsale_hold_expiry_lag_seconds", "histogram",
           "From a hold's deadline to its expiry being committed (this instance).");
    put_histogram(b, "flashsale_hold_expiry_lag_seconds", "", &m->expiry_lag, &LATENCY);
    db_writer_stats ws;
    db_writer_get_stats(a->writer, &ws);
    counter(b, "flashsale_db_commit_groups_total", "Group-commit transactions.", ws.groups);
    counter(b, "flashsale_db_commit_jobs_total", "Orders and lookups handled by the writer.",
            ws.jobs);
    counter(b, "flashsale_db_commit_failures_total", "Group commits that failed.", ws.failures);
    db_pool_stats ps;
    db_pool_get_stats(a->dbpool, &ps);
    family(b, "flashsale_db_connections", "gauge",
           "Database connections this instance holds open, by state (in_use: taken by a part "
           "of it; idle: in its pool).");
    put(b, "flashsale_db_connections{state=\"in_use\"} %d\n", ps.in_use);
    put(b, "flashsale_db_connections{state=\"idle\"} %d\n", ps.open - ps.in_use);
    family(b, "flashsale_db_connections_max", "gauge",
           "The instance's budget of database connections (--db-max-connections).");
    put(b, "flashsale_db_connections_max %d\n", ps.max);
    family(b, "flashsale_db_connection_waiting", "gauge",
           "Parts of the instance waiting now for one of its database connections.");
    put(b, "flashsale_db_connection_waiting %d\n", ps.waiting);
    counter(b, "flashsale_db_connection_waits_total",
            "Takes of a database connection that found all in use and waited.", ps.waits);
    counter(b, "flashsale_db_connection_wait_timeouts_total",
            "Waits for a database connection that ran out (--db-connection-wait-ms): the "
            "request was refused 503 overloaded, nothing taken.", ps.timeouts);
    family(b, "flashsale_db_connection_wait_seconds_total", "counter",
           "Time spent waiting for a database connection, all takes together.");
    put(b, "flashsale_db_connection_wait_seconds_total %.6f\n", (double)ps.wait_us / 1e6);
    counter(b, "flashsale_db_connect_failures_total",
            "Database connections that could not be opened.", ps.failures);
    family(b, "flashsale_sqlite_memory_bytes", "gauge",
           "Memory SQLite holds: page caches of every connection, statements.");
    put(b, "flashsale_sqlite_memory_bytes %lld\n", db_memory_used());
}

/* The process_* series under the names Prometheus' client libraries use,
 * so dashboards made for any of them work. */
static void render_process(buf *b) {
    svc_process_stats ps;
    if (svc_process_read(&ps) != 0) return;
    family(b, "process_cpu_seconds_total", "counter",
           "Total user and system CPU time spent in seconds.");
    put(b, "process_cpu_seconds_total %.2f\n", ps.cpu_seconds);
    family(b, "process_open_fds", "gauge", "Number of open file descriptors.");
    put(b, "process_open_fds %lld\n", ps.open_fds);
    family(b, "process_max_fds", "gauge", "Maximum number of open file descriptors.");
    put(b, "process_max_fds %lld\n", ps.max_fds);
    family(b, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.");
    put(b, "process_virtual_memory_bytes %lld\n", ps.virtual_bytes);
    family(b, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
    put(b, "process_resident_memory_bytes %lld\n", ps.resident_bytes);
    family(b, "process_start_time_seconds", "gauge",
           "Start time of the process since unix epoch in seconds.");
    put(b, "process_start_time_seconds %.2f\n", ps.start_time);
}

int svc_metrics_render(svc_app *a, char **out, size_t *len) {
    buf b = { malloc(65536), 0, 65536, 0 };
    svc_metrics *m = &a->m;
    *out = NULL;
    *len = 0;
    if (!b.p) return -1;
    family(&b, "flashsale_build_info", "gauge",
           "Always 1; version is what the binaries print with --version.");
    put(&b, "flashsale_build_info{version=\"");
    put_label_value(&b, flashsale_version);
    put(&b, "\"} 1\n");
    render_orders(&b, m);
    render_admission(a, &b);
    render_http(&b, m);
    render_stores(a, &b, m);
    family(&b, "flashsale_http_inflight", "gauge", "Requests received and not yet answered.");
    put(&b, "flashsale_http_inflight %ld\n", http_inflight(a->http));
    family(&b, "flashsale_http_connections", "gauge", "Open HTTP connections.");
    put(&b, "flashsale_http_connections %ld\n", http_connections(a->http));
    counter(&b, "flashsale_http_refused_connections_total", "Connections refused at the limit.",
            (uint64_t)http_refused(a->http));
    counter(&b, "flashsale_http_refused_per_client_total",
            "Connections refused because their address held --max-connections-per-client.",
            (uint64_t)http_refused_per_client(a->http));
    counter(&b, "flashsale_http_request_timeouts_total",
            "Connections closed because a started request did not arrive within "
            "--request-timeout.", (uint64_t)http_timed_out(a->http));
    render_process(&b);
    if (b.oom) {
        free(b.p);
        return -1;
    }
    *out = b.p;
    *len = b.len;
    return 0;
}
