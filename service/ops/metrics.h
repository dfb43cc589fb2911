/* metrics.h: the service's metrics.
 *
 * Counters and histograms in fixed arrays, updated with relaxed atomic
 * adds (no lock, no allocation on the order path), rendered at a scrape
 * (metrics.c; every series and its labels: docs/metrics.md). Every label
 * takes its values from a fixed table: routes, statuses, error codes,
 * outcomes, the stock module's strategies and Redis call kinds. None names
 * a SKU, a user or an order: a service may sell thousands of SKUs, and a
 * series per SKU would grow Prometheus without bound. */
#ifndef FLASHSALE_SERVICE_METRICS_H
#define FLASHSALE_SERVICE_METRICS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "http/http.h"
#include "stock/stock.h"

typedef struct svc_app svc_app;

enum svc_route_id {
    ROUTE_PRODUCT_CREATE, ROUTE_PRODUCT_GET, ROUTE_PRODUCT_RESTOCK, ROUTE_ORDER_CREATE,
    ROUTE_ORDER_GET, ROUTE_ORDER_LIST, ROUTE_ORDER_CONFIRM, ROUTE_ORDER_CANCEL, ROUTE_STRATEGIES,
    ROUTE_HEALTHZ, ROUTE_METRICS, ROUTE_OPENAPI, ROUTE_TICKET_TAKE, ROUTE_TICKET_GET,
    ROUTE_COUNT
};

/* How an order that reached its strategy ended. Finer than the error code
 * a client sees: 429 lock_timeout is lock_timeout, lock_fenced (the lease
 * ran out before the write) or optimistic_conflict (db-optimistic's
 * retries ran out). */
typedef enum svc_outcome {
    OUT_CREATED, OUT_REPLAYED, OUT_SOLD_OUT, OUT_INSUFFICIENT, OUT_LIMIT, OUT_KEY_REUSED,
    OUT_IN_PROGRESS, OUT_LOCK_TIMEOUT, OUT_FENCED, OUT_CONFLICT, OUT_REDIS_UNAVAILABLE,
    OUT_DB_UNAVAILABLE, OUT_LOCK_UNAVAILABLE, OUT_DB_BUSY, OUT_COUNT
} svc_outcome;

#define SVC_NSTATUS 15            /* the statuses the API answers, and "other" */
#define SVC_NERROR 35             /* none, the API's error codes, and "other" */

#define HIST_BUCKETS 16
typedef struct svc_histogram {
    atomic_uint_fast64_t bucket[HIST_BUCKETS + 1];  /* last: +Inf; the count is their sum */
    atomic_uint_fast64_t sum;                       /* microseconds, or orders */
} svc_histogram;

/* Adds a latency in microseconds: two relaxed atomic adds. */
void svc_histogram_observe(svc_histogram *h, int64_t micros);

/* Why units of a hold came back. */
enum { SVC_RETURN_CANCEL, SVC_RETURN_EXPIRY, SVC_RETURN_CAUSES };

typedef struct svc_metrics {
    svc_histogram route_latency[ROUTE_COUNT + 1];        /* last: unrouted */
    atomic_uint_fast64_t responses[ROUTE_COUNT + 1][SVC_NSTATUS][SVC_NERROR];
    svc_histogram order_latency[STOCK_STRATEGY_COUNT];   /* POST /v1/orders, by strategy */
    atomic_uint_fast64_t orders[STOCK_STRATEGY_COUNT][OUT_COUNT];
    svc_histogram redis_call[STOCK_CALL_COUNT];
    svc_histogram commit_latency;                         /* a group's BEGIN to COMMIT */
    svc_histogram commit_orders;                          /* orders per group */
    atomic_uint_fast64_t redis_errors;
    atomic_uint_fast64_t room_orders_held;           /* orders that waited for their turn */
    atomic_uint_fast64_t room_places_known;          /* places given back from memory */
    atomic_uint_fast64_t db_errors;
    atomic_uint_fast64_t reserve_batches, reserve_orders;
    atomic_uint_fast64_t rebuilds, settled_commit, settled_undo;
    atomic_uint_fast64_t holds_ended[3];             /* confirmed, cancelled, expired */
    atomic_uint_fast64_t hold_returned[SVC_RETURN_CAUSES];   /* units given back */
    atomic_uint_fast64_t hold_forgotten;             /* returns refused as forgotten */
    atomic_llong units_held;                         /* of reserved holds (holds thread) */
    svc_histogram expiry_lag;                        /* deadline to expiry, microseconds */
    svc_histogram lock_acquire;
    atomic_uint_fast64_t lock_outcomes[3];           /* acquired, timeout, error */
    /* What the latest complete maintenance sweep found (svc_metrics_swept). */
    atomic_llong pending_records;                    /* left pending after it */
    atomic_llong pending_oldest_ms;                  /* the oldest of those, by Redis' clock */
    atomic_llong swept_wall_ms;                      /* when (0: no sweep yet) */
    atomic_llong oversold[STOCK_STRATEGY_COUNT];     /* units sold beyond stock_initial */
    /* Release of a lock by this process -> the next acquire of it here
     * completing, when that acquirer was waiting: per strategy. */
    svc_histogram lock_handoff[STOCK_STRATEGY_COUNT];
} svc_metrics;

const char *svc_outcome_name(svc_outcome o);

/* Renders every metric as Prometheus text into a malloc'd buffer (the
 * caller frees it). -1 when out of memory (nothing to free). */
int svc_metrics_render(svc_app *a, char **out, size_t *len);
/* The observers the modules are given (lifecycle.c wires them): a Redis
 * call of the stock module, a group commit of the writer, and every HTTP
 * answer (counted and timed by route, status and error code). */
void svc_metrics_redis_call(stock_call call, int64_t micros, void *ud);
void svc_metrics_commit(size_t orders, int64_t micros, int ok, void *ud);
void svc_metrics_http(const http_answer *ans, void *ud);
/* A sweep over every product's pending records is done (repair/): records
 * left pending, the oldest one's age, and the units sold beyond
 * stock_initial per strategy (SQLite's sold - stock_initial, when > 0). */
void svc_metrics_swept(svc_app *a, long long records, long long oldest_ms,
                       const long long oversold[STOCK_STRATEGY_COUNT]);

/* The process' own figures, from /proc (process.c), for the standard
 * process_* metrics. Returns 0, or -1 when /proc could not be read. */
typedef struct svc_process_stats {
    double cpu_seconds;         /* user + system */
    double start_time;          /* since the Unix epoch, seconds */
    long long resident_bytes, virtual_bytes;
    long long open_fds, max_fds;
} svc_process_stats;
int svc_process_read(svc_process_stats *out);

#endif
