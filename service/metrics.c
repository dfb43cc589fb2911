/* metrics.c: counters and histograms, rendered in the Prometheus text
 * format (0.0.4). Updates are relaxed atomic adds: no lock on the order
 * path; a scrape may see counters a few operations apart, as Prometheus
 * expects. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "service/service.h"

/* Upper bounds in microseconds: 0.25 ms .. 10 s. */
static const int64_t BOUNDS_US[HIST_BUCKETS] = {
    250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000,
    2500000, 10000000,
};

static const char *const ROUTE_NAMES[ROUTE_COUNT + 1] = {
    [ROUTE_PRODUCT_CREATE] = "product_create", [ROUTE_PRODUCT_GET] = "product_get",
    [ROUTE_PRODUCT_RESTOCK] = "product_restock", [ROUTE_ORDER_CREATE] = "order_create",
    [ROUTE_ORDER_GET] = "order_get", [ROUTE_ORDER_LIST] = "order_list",
    [ROUTE_STRATEGIES] = "strategies", [ROUTE_HEALTHZ] = "healthz", [ROUTE_METRICS] = "metrics",
    [ROUTE_OPENAPI] = "openapi", [ROUTE_COUNT] = "unrouted",
};

static const char *const OUTCOME_NAMES[OUT_COUNT] = {
    [OUT_CREATED] = "created", [OUT_REPLAYED] = "replayed", [OUT_SOLD_OUT] = "sold_out",
    [OUT_INSUFFICIENT] = "insufficient_stock", [OUT_LIMIT] = "per_user_limit",
    [OUT_KEY_REUSED] = "idempotency_key_reused", [OUT_IN_PROGRESS] = "request_in_progress",
    [OUT_LOCK_TIMEOUT] = "lock_timeout", [OUT_REDIS_UNAVAILABLE] = "redis_unavailable",
    [OUT_DB_UNAVAILABLE] = "db_unavailable", [OUT_SHUTTING_DOWN] = "shutting_down",
    [OUT_CONFLICT] = "optimistic_conflict",
};

const char *svc_outcome_name(svc_outcome o) { return OUTCOME_NAMES[o]; }

void svc_histogram_observe(svc_histogram *h, int64_t micros) {
    int i = 0;
    while (i < HIST_BUCKETS && micros > BOUNDS_US[i]) i++;
    atomic_fetch_add_explicit(&h->bucket[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_us, (uint64_t)(micros > 0 ? micros : 0),
                              memory_order_relaxed);
}

void svc_api_observe(int route_id, int status, int64_t micros, void *ud) {
    svc_app *a = ud;
    int r = route_id < 0 || route_id >= ROUTE_COUNT ? ROUTE_COUNT : route_id;
    int cls = status / 100;
    svc_histogram_observe(&a->m.route_latency[r], micros);
    atomic_fetch_add_explicit(&a->m.route_status[r][cls >= 0 && cls < 6 ? cls : 0], 1,
                              memory_order_relaxed);
}

/* A growing text buffer. */
typedef struct buf {
    char *p;
    size_t len, cap;
} buf;

static void put(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(buf *b, const char *fmt, ...) {
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        b->cap = b->cap * 2 + (size_t)n + 64;
        char *q = realloc(b->p, b->cap);
        if (!q) abort();
        b->p = q;
    }
}

static void put_histogram(buf *b, const char *name, const char *labels, svc_histogram *h) {
    uint64_t cum = 0;
    for (int i = 0; i <= HIST_BUCKETS; i++) {
        cum += atomic_load(&h->bucket[i]);
        if (i < HIST_BUCKETS)
            put(b, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, labels[0] ? "," : "",
                (double)BOUNDS_US[i] / 1e6, (unsigned long long)cum);
        else
            put(b, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, labels[0] ? "," : "",
                (unsigned long long)cum);
    }
    put(b, "%s_sum{%s} %.6f\n", name, labels, (double)atomic_load(&h->sum_us) / 1e6);
    put(b, "%s_count{%s} %llu\n", name, labels, (unsigned long long)atomic_load(&h->count));
}

static void put_product(svc_product *p, void *ud) {
    buf *b = ud;
    for (int o = 0; o < OUT_COUNT; o++) {
        uint64_t n = atomic_load(&p->outcomes[o]);
        if (n)
            put(b, "flashsale_orders_total{sku=\"%s\",strategy=\"%s\",outcome=\"%s\"} %llu\n",
                p->sku, stock_strategy_about(p->strategy)->name, OUTCOME_NAMES[o],
                (unsigned long long)n);
    }
}

static void counter(buf *b, const char *name, const char *help, uint64_t v) {
    put(b, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name,
        (unsigned long long)v);
}

void svc_metrics_render(svc_app *a, char **out, size_t *len) {
    buf b = { malloc(8192), 0, 8192 };
    char labels[64];
    svc_metrics *m = &a->m;
    if (!b.p) abort();
    put(&b, "# HELP flashsale_orders_total Order requests by SKU, strategy and outcome.\n"
            "# TYPE flashsale_orders_total counter\n");
    svc_product_cache_each(a->products, put_product, &b);

    put(&b, "# HELP flashsale_http_request_duration_seconds Time from request to answer.\n"
            "# TYPE flashsale_http_request_duration_seconds histogram\n");
    for (int r = 0; r <= ROUTE_COUNT; r++) {
        snprintf(labels, sizeof labels, "route=\"%s\"", ROUTE_NAMES[r]);
        put_histogram(&b, "flashsale_http_request_duration_seconds", labels, &m->route_latency[r]);
    }
    put(&b, "# HELP flashsale_http_responses_total Answers by route and status class.\n"
            "# TYPE flashsale_http_responses_total counter\n");
    for (int r = 0; r <= ROUTE_COUNT; r++)
        for (int c = 1; c < 6; c++) {
            uint64_t n = atomic_load(&m->route_status[r][c]);
            if (n)
                put(&b, "flashsale_http_responses_total{route=\"%s\",code=\"%dxx\"} %llu\n",
                    ROUTE_NAMES[r], c, (unsigned long long)n);
        }
    put(&b, "# HELP flashsale_lock_acquire_duration_seconds Time to get a stock lock.\n"
            "# TYPE flashsale_lock_acquire_duration_seconds histogram\n");
    put_histogram(&b, "flashsale_lock_acquire_duration_seconds", "", &m->lock_acquire);
    put(&b, "# HELP flashsale_lock_acquires_total Lock acquisitions by outcome.\n"
            "# TYPE flashsale_lock_acquires_total counter\n");
    static const char *const LOCK_OUT[3] = { "acquired", "timeout", "error" };
    for (int i = 0; i < 3; i++)
        put(&b, "flashsale_lock_acquires_total{outcome=\"%s\"} %llu\n", LOCK_OUT[i],
            (unsigned long long)atomic_load(&m->lock_outcomes[i]));

    counter(&b, "flashsale_redis_errors_total", "Redis operations that failed.",
            atomic_load(&m->redis_errors));
    counter(&b, "flashsale_db_errors_total", "Database operations that failed.",
            atomic_load(&m->db_errors));
    counter(&b, "flashsale_reserve_batches_total", "Pipelined reservation round trips.",
            atomic_load(&m->reserve_batches));
    counter(&b, "flashsale_reserve_orders_total", "Reservations sent in those round trips.",
            atomic_load(&m->reserve_orders));
    counter(&b, "flashsale_stock_rebuilds_total", "Redis stock copies rebuilt from SQLite.",
            atomic_load(&m->rebuilds));
    put(&b, "# HELP flashsale_reconciled_total Pending reservations settled by reconciliation.\n"
            "# TYPE flashsale_reconciled_total counter\n"
            "flashsale_reconciled_total{result=\"committed\"} %llu\n"
            "flashsale_reconciled_total{result=\"given_back\"} %llu\n",
        (unsigned long long)atomic_load(&m->settled_commit),
        (unsigned long long)atomic_load(&m->settled_undo));
    db_writer_stats ws;
    db_writer_get_stats(a->writer, &ws);
    counter(&b, "flashsale_db_commit_groups_total", "Group-commit transactions.", ws.groups);
    counter(&b, "flashsale_db_commit_jobs_total", "Orders and lookups handled by the writer.",
            ws.jobs);
    counter(&b, "flashsale_db_commit_failures_total", "Group commits that failed.", ws.failures);
    put(&b, "# HELP flashsale_sqlite_memory_bytes Memory SQLite holds: page caches of every "
            "connection, statements.\n# TYPE flashsale_sqlite_memory_bytes gauge\n"
            "flashsale_sqlite_memory_bytes %lld\n", db_memory_used());
    put(&b, "# HELP flashsale_http_inflight Requests received and not yet answered.\n"
            "# TYPE flashsale_http_inflight gauge\nflashsale_http_inflight %ld\n"
            "# HELP flashsale_http_connections Open HTTP connections.\n"
            "# TYPE flashsale_http_connections gauge\nflashsale_http_connections %ld\n"
            "# HELP flashsale_http_refused_connections_total Connections refused at the limit.\n"
            "# TYPE flashsale_http_refused_connections_total counter\n"
            "flashsale_http_refused_connections_total %ld\n"
            "# HELP flashsale_http_refused_per_client_total Connections refused because their "
            "address held --max-connections-per-client.\n"
            "# TYPE flashsale_http_refused_per_client_total counter\n"
            "flashsale_http_refused_per_client_total %ld\n"
            "# HELP flashsale_http_request_timeouts_total Connections closed because a started "
            "request did not arrive within --request-timeout.\n"
            "# TYPE flashsale_http_request_timeouts_total counter\n"
            "flashsale_http_request_timeouts_total %ld\n",
        http_inflight(a->http), http_connections(a->http), http_refused(a->http),
        http_refused_per_client(a->http), http_timed_out(a->http));
    *out = b.p;
    *len = b.len;
}
