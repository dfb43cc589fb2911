/* service.h: the flashsale service's own parts and how they are wired.
 *
 * The service wires the modules together (http.h, stock.h, db.h) and owns
 * the order pipeline (pipeline.c, orderloop.c), on event loops (one per
 * thread; common/loop.h):
 *
 *   event loop    HTTP request in, validated, connection suspended; the
 *                 loop's `lua` orders of one iteration reserved per SKU in
 *                 one script call on the loop's own Redis connection
 *     committer   the reserved orders of every loop committed as one group
 *                 (one fsync), then handed back to their loops in one wake
 *   event loop    201 answered; the pending records cleared in the next
 *                 script call
 *
 * A failure after the reservation gives the units back (undo) before the
 * client hears 503; whatever a crash leaves behind is found by the
 * maintenance thread through the pending records and settled against
 * SQLite. Nothing here is visible outside the service. */
#ifndef FLASHSALE_SERVICE_H
#define FLASHSALE_SERVICE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "common/loop.h"
#include "db/db.h"
#include "http/http.h"
#include "stock/stock.h"

/* ------------------------------------------------------------------ logging */

typedef enum svc_log_level {
    SVC_LOG_DEBUG, SVC_LOG_INFO, SVC_LOG_WARN, SVC_LOG_ERROR, SVC_LOG_QUIET
} svc_log_level;
void svc_log_set_level(svc_log_level lvl);
/* One line to stderr: time, level, message. */
void svc_log(svc_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ------------------------------------------------------------ configuration */

typedef struct svc_config {
    char listen[128];
    char redis_url[512];
    char db_path[512];
    char strategy[32];
    char admin_token[256];
    char key_prefix[64];
    char redlock[2048];       /* "URL,URL,URL": the Redlock servers ("": none) */
    char zookeeper[1024];     /* zk://host:port[/base] ("": none) */
    char etcd[1024];          /* etcd://host:port[/prefix] ("": none) */
    int threads;              /* HTTP event-loop threads */
    int redis_timeout_ms;
    int db_busy_timeout_ms;
    int synchronous_full;
    unsigned max_connections;
    unsigned max_per_client;  /* connections one client address may hold (0: no cap) */
    unsigned idle_timeout_s;
    unsigned request_timeout_s;   /* a started request must be in within this */
    unsigned request_timeout_ms;  /* the same, set by svc_config_load; an embedder (the
                                   * request fuzzer) may make it finer after that */
    int api_workers;          /* threads in each API pool (Redis work; SQLite-only work) */
    long long pending_timeout_ms;   /* a reservation older than this is settled */
    long long idem_ttl_ms;
    int shutdown_grace_ms;
    int lock_ttl_ms;          /* default lease of the lock strategies */
    int lock_wait_ms;         /* how long an order waits for a lock */
    int lock_workers;         /* threads that run the blocking strategies */
    int fault_injection;      /* products may set cs_delay_ms and lock_ttl_ms */
    int insecure_admin;       /* open admin endpoints on a non-loopback address */
    int verbose;
} svc_config;

/* Fills c from defaults, then environment (FLASHSALE_*), then argv. Returns
 * 0 to run, 1 when --help or --version was printed, -1 on a usage error
 * (printed). */
int svc_config_load(svc_config *c, int argc, char **argv);

/* ---------------------------------------------------------------- validation */

/* What was wrong with a request: an API error code, the field, a message. */
typedef struct svc_verr {
    int status;
    const char *code;
    char message[256];
} svc_verr;

int svc_valid_sku(const char *s);
/* 1..128 characters of valid UTF-8, no control characters (C0, DEL, C1). */
int svc_valid_user_id(const char *s);
/* 1..128 visible ASCII characters. */
int svc_valid_idem_key(const char *s);

typedef struct svc_order_input {
    const char *sku;
    const char *user_id;
    int quantity;
} svc_order_input;

/* Checks a POST /v1/orders body. Strings point into body. Returns 0 or -1
 * with e filled. */
int svc_validate_order(json_t *body, svc_order_input *in, svc_verr *e);

typedef struct svc_product_input {
    const char *sku;
    const char *name;
    const char *strategy;     /* NULL: the service default */
    int segments;
    long long stock;
    long long per_user_limit;
    long long cs_delay_ms;    /* fault injection only */
    long long lock_ttl_ms;    /* fault injection only */
} svc_product_input;

/* Checks a POST /v1/products body; default_strategy fills a missing
 * "strategy"; fault_injection allows cs_delay_ms and lock_ttl_ms. */
int svc_validate_product(json_t *body, const char *default_strategy, int fault_injection,
                         svc_product_input *in, svc_verr *e);
/* Checks a restock body: {"quantity": 1..10^9}. */
int svc_validate_restock(json_t *body, long long *qty, svc_verr *e);

/* Fingerprint of an order request, for idempotent replays: 16 hex chars. */
void svc_order_fingerprint(const char *sku, const char *user_id, int quantity, char out[17]);

/* ------------------------------------------------------------------ order ids */

/* A new order id: 26 characters of Crockford base32 (a ULID): 48 bits of
 * milliseconds then 80 random bits, increasing within this process, so ids
 * sort by creation time. *wall_ms gets the time encoded. Thread-safe. */
void svc_order_id_new(char out[27], int64_t *wall_ms);
/* Whether s looks like an order id (26 base32 characters). */
int svc_order_id_valid(const char *s);

/* ------------------------------------------------------------------ metrics
 *
 * Counters and histograms in fixed arrays, updated with relaxed atomic
 * adds (no lock, no allocation on the order path), rendered at a scrape
 * (metrics.c; every series and its labels: docs/metrics.md). Every label
 * takes its values from a fixed table: routes, statuses, error codes,
 * outcomes, the stock module's strategies and Redis call kinds. None names
 * a SKU, a user or an order: a service may sell thousands of SKUs, and a
 * series per SKU would grow Prometheus without bound. */

enum svc_route_id {
    ROUTE_PRODUCT_CREATE, ROUTE_PRODUCT_GET, ROUTE_PRODUCT_RESTOCK, ROUTE_ORDER_CREATE,
    ROUTE_ORDER_GET, ROUTE_ORDER_LIST, ROUTE_STRATEGIES, ROUTE_HEALTHZ, ROUTE_METRICS,
    ROUTE_OPENAPI, ROUTE_COUNT
};

/* How an order that reached its strategy ended. Finer than the error code
 * a client sees: 429 lock_timeout is lock_timeout, lock_fenced (the lease
 * ran out before the write) or optimistic_conflict (db-optimistic's
 * retries ran out). */
typedef enum svc_outcome {
    OUT_CREATED, OUT_REPLAYED, OUT_SOLD_OUT, OUT_INSUFFICIENT, OUT_LIMIT, OUT_KEY_REUSED,
    OUT_IN_PROGRESS, OUT_LOCK_TIMEOUT, OUT_FENCED, OUT_CONFLICT, OUT_REDIS_UNAVAILABLE,
    OUT_DB_UNAVAILABLE, OUT_LOCK_UNAVAILABLE, OUT_COUNT
} svc_outcome;

#define SVC_NSTATUS 14            /* the statuses the API answers, and "other" */
#define SVC_NERROR 26             /* none, the API's error codes, and "other" */

#define HIST_BUCKETS 16
typedef struct svc_histogram {
    atomic_uint_fast64_t bucket[HIST_BUCKETS + 1];  /* last: +Inf; the count is their sum */
    atomic_uint_fast64_t sum;                       /* microseconds, or orders */
} svc_histogram;

/* Adds a latency in microseconds: two relaxed atomic adds. */
void svc_histogram_observe(svc_histogram *h, int64_t micros);

typedef struct svc_metrics {
    svc_histogram route_latency[ROUTE_COUNT + 1];        /* last: unrouted */
    atomic_uint_fast64_t responses[ROUTE_COUNT + 1][SVC_NSTATUS][SVC_NERROR];
    svc_histogram order_latency[STOCK_STRATEGY_COUNT];   /* POST /v1/orders, by strategy */
    atomic_uint_fast64_t orders[STOCK_STRATEGY_COUNT][OUT_COUNT];
    svc_histogram redis_call[STOCK_CALL_COUNT];
    svc_histogram commit_latency;                         /* a group's BEGIN to COMMIT */
    svc_histogram commit_orders;                          /* orders per group */
    atomic_uint_fast64_t redis_errors;
    atomic_uint_fast64_t db_errors;
    atomic_uint_fast64_t reserve_batches, reserve_orders;
    atomic_uint_fast64_t rebuilds, settled_commit, settled_undo;
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

typedef struct svc_app svc_app;
/* Renders every metric as Prometheus text into a malloc'd buffer (the
 * caller frees it). -1 when out of memory (nothing to free). */
int svc_metrics_render(svc_app *a, char **out, size_t *len);
/* The observers the modules are given (lifecycle.c wires them): a Redis
 * call of the stock module, and a group commit of the writer. */
void svc_metrics_redis_call(stock_call call, int64_t micros, void *ud);
void svc_metrics_commit(size_t orders, int64_t micros, int ok, void *ud);
/* A sweep over every product's pending records is done (reconcile.c):
 * records left pending, the oldest one's age, and the units sold beyond
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

/* ------------------------------------------------------------------ products */

/* A product as the service caches it. Never freed while the service runs
 * (products cannot be deleted), so pointers to it stay valid. */
typedef struct svc_product {
    char sku[DB_SKU_MAX + 1];
    stock_strategy strategy;
    int segments;
    long long per_user_limit;
    stock_product sp;              /* the stock module's view (points into this) */
    atomic_int rebuilding;         /* a rebuild of its Redis copy is queued */
    atomic_int rebuild_forced;     /* ...and must replace even a valid copy */
    struct svc_product *next;          /* hash chain */
} svc_product;

typedef struct svc_product_cache svc_product_cache;
svc_product_cache *svc_product_cache_new(void);
void svc_product_cache_free(svc_product_cache *pc);
/* The cached product, or NULL. */
svc_product *svc_product_cache_get(svc_product_cache *pc, const char *sku);
/* Caches p (from the database) unless present; returns the cached one. */
svc_product *svc_product_cache_put(svc_product_cache *pc, const db_product *p);
/* Calls fn for each cached product. */
void svc_product_cache_each(svc_product_cache *pc, void (*fn)(svc_product *p, void *ud), void *ud);

/* ------------------------------------------------------------------ workers */

/* Threads for work that may wait on Redis or SQLite (workers.c): the HTTP
 * threads defer such requests and hand them over. */
typedef struct svc_workers svc_workers;
svc_workers *svc_workers_start(const char *name, int threads, char *err, size_t errlen);
/* Queues fn(arg). Returns 0, or -1 when out of memory (not queued). */
int svc_workers_submit(svc_workers *w, void (*fn)(void *arg), void *arg);
/* Runs what is queued, then stops the threads and frees w. */
void svc_workers_stop(svc_workers *w);

/* ------------------------------------------------------------------- health */

/* Probed health of the dependencies (health.c). */
typedef struct svc_health svc_health;
typedef enum svc_health_state { HEALTH_OK, HEALTH_DOWN, HEALTH_UNKNOWN } svc_health_state;
typedef struct svc_health_view {
    svc_health_state redis, db;
    int64_t redis_age_ms, db_age_ms;   /* since the latest probe completed; -1: none yet */
} svc_health_view;

svc_health *svc_health_start(svc_app *a, char *err, size_t errlen);
void svc_health_stop(svc_health *h);
/* Reads the latest probe results; never waits on a dependency. */
void svc_health_read(const svc_health *h, svc_health_view *v);
/* Asks for a database probe now (after a failed commit). */
void svc_health_poke_db(svc_health *h);
const char *svc_health_state_name(svc_health_state s);

/* ---------------------------------------------------------------------- app */

typedef struct svc_pool svc_pool;
typedef struct svc_maint svc_maint;

struct svc_app {
    svc_config cfg;
    char instance_name[96];        /* stable across restarts: host:port */
    char instance_id[112];         /* instance_name#nonce: this run */
    stock_strategy default_strategy;
    stock_config stock_cfg;
    db_options db_opt;
    http_server *http;
    loop **loops;                  /* event loops: HTTP and the order path */
    pthread_t *loop_threads;
    int nloops, nrunning;
    db_writer *writer;
    svc_pool *pool;                   /* strategies that may block */
    struct svc_order_loop **order_loops;   /* the order path on each loop (orderloop.c) */
    struct svc_order_loop *give_touched;   /* the committer's: loops it is handing back to */
    svc_workers *api;                  /* API work that may wait on Redis (and SQLite) */
    svc_workers *api_db;               /* API work that needs SQLite only (order lookups) */
    svc_health *health;
    svc_maint *maint;
    svc_product_cache *products;
    svc_metrics m;
    atomic_int shutting_down;
    pthread_key_t tls;             /* per-thread db and stock connections */
};

/* Starts the whole service from a->cfg (lifecycle.c): recovery, threads,
 * then the HTTP listener. Returns 0; 2 for a configuration error, 1 for
 * one at run time (both with a message in err). */
int svc_start(svc_app *a, char *err, size_t errlen);
/* Stops accepting, answers every request in flight, commits, stops every
 * thread and frees what svc_start made. */
void svc_stop(svc_app *a);

/* Sets up the per-thread connection slots (once, before threads start). */
void svc_tls_init(svc_app *a);
/* The calling thread's own connections (opened on first use). NULL with the
 * error logged when they cannot be opened. */
db *svc_thread_db(svc_app *a);
stock_conn *svc_thread_stock(svc_app *a);

/* Finds a product: cache first, then the database. Returns DB_OK,
 * DB_NOTFOUND or DB_ERROR. */
db_status svc_product_find(svc_app *a, const char *sku, svc_product **out);

/* Why strategy s cannot take orders on this instance -- the server it
 * needs was not configured ("start flashsale with --zookeeper") -- or NULL
 * when it can (strategies.c). */
const char *svc_strategy_unavailable(const svc_app *a, stock_strategy s);
/* The flag that configures the lock server s needs ("--etcd"), or NULL. */
const char *svc_strategy_flag(stock_strategy s);

/* The HTTP routes (api.c). */
extern const http_route svc_api_routes[];
extern const size_t svc_api_nroutes;
/* The HTTP observer: counts and times every answer (metrics.c). */
void svc_api_observe(const http_answer *ans, void *ud);

/* ------------------------------------------------------------ order pipeline */

/* One order request on its way through the pipeline (pipeline.c). */
typedef struct svc_order svc_order;

/* Starts the pool for strategies that may block, each thread with its own
 * connections. */
svc_pool *svc_pool_start(svc_app *a, int threads, char *err, size_t errlen);
/* The order path's state on each event loop (call after http_start, so its
 * flush follows libmicrohttpd's); waiting, with a bound, for the loops'
 * Redis work to be answered (at shutdown); freeing it, loops stopped. */
int svc_order_loops_start(svc_app *a, char *err, size_t errlen);
void svc_order_loops_drain(svc_app *a, int64_t wait_ms);
void svc_order_loops_free(svc_app *a);
/* Takes over a validated order request: reserves, commits and answers it. */
void svc_order_submit(svc_app *a, http_req *req, svc_product *p, const svc_order_input *in,
                      const char *idem_key);
/* The writer's callback (registered by main). */
void svc_order_batch_done(db_job **jobs, size_t n, void *ud);
/* Drains the pool's queue, then stops its threads. */
void svc_pool_stop(svc_pool *s);

/* `flashsale audit` (audit.c): prints every discrepancy between Redis and
 * SQLite; repair fixes what is safely fixable. Returns the exit code. */
int svc_audit_main(svc_app *a, int repair);

/* ---------------------------------------------------------------- maintenance */

/* Starts the maintenance thread: heartbeat, pending-record sweeps, stock
 * rebuilds, retries of failed undos. */
svc_maint *svc_maint_start(svc_app *a, char *err, size_t errlen);
void svc_maint_stop(svc_maint *m);
/* Asks for p's Redis copy to be rebuilt from SQLite (deduplicated). */
void svc_maint_request_rebuild(svc_maint *m, svc_product *p);
/* The same, replacing even a copy that looks valid. */
void svc_maint_request_forced_rebuild(svc_maint *m, svc_product *p);
/* Hands over a reservation whose undo failed, to retry until it succeeds. */
void svc_maint_retry_undo(svc_maint *m, svc_product *p, const char *order_id, const char *idem_key);
/* Rebuilds p's Redis copy now, on the caller's connections, unless the copy
 * is valid for the running Redis and force is 0 (a copy that is valid may
 * still be wrong only after a write of unknown outcome: restock, audit).
 * Returns 0, or -1 with the reason logged. */
int svc_rebuild(svc_app *a, db *d, stock_conn *sc, svc_product *p, int force);
/* Settles every pending record that no live request owns: committed orders
 * are confirmed, the others voided and given back. only_dead: skip records
 * of live instances younger than the pending timeout. Returns the number
 * settled, or -1 on error. */
int svc_reconcile(svc_app *a, db *d, stock_conn *sc, int only_dead);
/* The same for one product's pending records. */
int svc_reconcile_product(svc_app *a, db *d, stock_conn *sc, svc_product *p, int only_dead);

#endif
