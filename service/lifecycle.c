/* lifecycle.c: starting and stopping the service as a whole.
 *
 * Start: open SQLite (migrating the schema), recover (repair/recover.c:
 * rebuild any Redis stock copy that is missing or stale, settle pending
 * reservations left by dead instances), start the threads, then listen.
 * Stop: stop accepting, let every request in flight be answered, let the
 * writer commit what it holds, clear pending records, free everything. A
 * start that fails half way is undone the same way (teardown).
 *
 * Kept apart from main() so that the request-surface fuzzer can run the
 * real service, router and handlers in its own process, and start and stop
 * it again. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "common/clock.h"
#include "lock/lock.h"
#include "service/api/api.h"
#include "service/app.h"
#include "service/log.h"
#include "service/ops/health.h"
#include "service/holds/holds.h"
#include "service/ops/maint.h"
#include "service/room/beats.h"
#include "service/order/order.h"
#include "service/products.h"
#include "service/repair/repair.h"
#include "rtopo/rtopo.h"

/* The key prefix and instance id configured here are handed to the stock
 * module (stock_config), which keeps copies of its own: they must fit. */
_Static_assert(sizeof ((svc_config *)0)->key_prefix <= STOCK_PREFIX_MAX + 1,
               "--key-prefix takes more than the stock module keeps (STOCK_PREFIX_MAX)");
_Static_assert(sizeof ((svc_app *)0)->instance_id <= STOCK_INSTANCE_MAX + 1,
               "an instance id is longer than the stock module keeps (STOCK_INSTANCE_MAX)");

static void *loop_main(void *arg) {
    loop *l = arg;
    pthread_setname_np(pthread_self(), "fs-loop");
    loop_run(l);
    return NULL;
}

/* The event loops that carry HTTP and the order path, one per thread. */
static int loops_start(svc_app *a, char *err, size_t errlen) {
    a->nloops = a->cfg.threads;
    a->loops = calloc((size_t)a->nloops, sizeof *a->loops);
    a->loop_threads = calloc((size_t)a->nloops, sizeof *a->loop_threads);
    if (!a->loops || !a->loop_threads) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int i = 0; i < a->nloops; i++)
        if (!(a->loops[i] = loop_new(err, errlen))) return -1;
    return 0;
}

/* Runs each loop on its own thread (after everything is attached). */
static int loops_run(svc_app *a, char *err, size_t errlen) {
    for (; a->nrunning < a->nloops; a->nrunning++) {
        if (pthread_create(&a->loop_threads[a->nrunning], NULL, loop_main,
                           a->loops[a->nrunning]) != 0) {
            snprintf(err, errlen, "cannot start the event-loop threads");
            return -1;
        }
    }
    return 0;
}

static void loops_stop(svc_app *a) {
    for (int i = 0; i < a->nrunning; i++) loop_stop(a->loops[i]);
    for (int i = 0; i < a->nrunning; i++) pthread_join(a->loop_threads[i], NULL);
    a->nrunning = 0;
}

static void loops_free(svc_app *a) {
    for (int i = 0; i < a->nloops && a->loops; i++) loop_free(a->loops[i]);
    free(a->loops);
    free(a->loop_threads);
    a->loops = NULL;
    a->loop_threads = NULL;
}

static void make_instance_id(svc_app *a) {
    char host[64] = "localhost";
    unsigned char nonce[4];
    gethostname(host, sizeof host - 1);
    const char *port = strrchr(a->cfg.listen, ':');
    if (port && strcmp(port, ":0") != 0)
        snprintf(a->instance_name, sizeof a->instance_name, "%s%s", host, port);
    else
        snprintf(a->instance_name, sizeof a->instance_name, "%s:pid%d", host, (int)getpid());
    if (getrandom(nonce, sizeof nonce, 0) != sizeof nonce) memset(nonce, 0, sizeof nonce);
    snprintf(a->instance_id, sizeof a->instance_id, "%s#%02x%02x%02x%02x", a->instance_name,
             nonce[0], nonce[1], nonce[2], nonce[3]);
}

/* ------------------------------------------------------------------ redis */

int svc_redis_open(svc_app *a, char *err, size_t errlen) {
    rtopo_spec spec;
    char why[256];
    if (rtopo_parse(a->cfg.redis_url, &spec, why, sizeof why) != 0) {
        snprintf(err, errlen, "--redis: %s", why);
        return -1;
    }
    /* One server: the stock module connects to the URL as it always did.
     * Sentinel: a thread follows the primary, and every connection with it.
     * Cluster: a thread follows the slot map; each SKU's keys go to the
     * primary serving their slot. */
    a->stock_cfg.primary = NULL;
    a->stock_cfg.cluster = NULL;
    if (spec.kind == RTOPO_CLUSTER) {
        if (!(a->cluster = rtopo_cluster_start(&spec, a->cfg.redis_timeout_ms, why, sizeof why))) {
            snprintf(err, errlen, "--redis: %s", why);
            return -1;
        }
        a->stock_cfg.cluster = a->cluster;
        if (rtopo_cluster_error(a->cluster, why, sizeof why))
            svc_log(SVC_LOG_WARN, "redis: no cluster node answered CLUSTER SLOTS yet (%s); "
                    "orders answer 503 until one does", why);
    }
    if (spec.kind == RTOPO_SENTINEL) {
        if (!(a->primary = rtopo_primary_start(&spec, a->cfg.redis_timeout_ms, why, sizeof why))) {
            snprintf(err, errlen, "--redis: %s", why);
            return -1;
        }
        a->stock_cfg.primary = a->primary;
        rconn_addr at;
        if (!rtopo_primary_get(a->primary, &at))
            svc_log(SVC_LOG_WARN, "redis: no sentinel named the primary of '%s' yet; orders "
                    "answer 503 until one does", spec.master);
    }
    return 0;
}

void svc_redis_close(svc_app *a) {
    rtopo_primary_stop(a->primary);
    a->primary = NULL;
    a->stock_cfg.primary = NULL;
    rtopo_cluster_stop(a->cluster);
    a->cluster = NULL;
    a->stock_cfg.cluster = NULL;
}

/* ------------------------------------------------------------ lock servers */

/* A lock module client for urls[0..n), or NULL with err naming flag. */
static lock_client *lock_open(svc_app *a, const char *flag, const char *const *urls, int n,
                              int watchdog, int fair, char *err, size_t errlen) {
    lock_options lo = { .urls = urls, .nurls = n, .timeout_ms = a->cfg.redis_timeout_ms,
                         .watchdog = watchdog, .fair = fair };
    char why[256];
    lock_client *c = lock_client_new(&lo, why, sizeof why);
    if (!c) snprintf(err, errlen, "%s: %s", flag, why);
    return c;
}

/* Checks that url is of a scheme a flag wants, naming both if not. */
static int want_scheme(const char *flag, const char *url, const char *const *schemes,
                       const char *form, char *err, size_t errlen) {
    for (const char *const *s = schemes; *s; s++)
        if (!strncmp(url, *s, strlen(*s)) && url[strlen(*s)]) return 0;
    snprintf(err, errlen, "%s: '%.200s' is not %s", flag, url, form);
    return -1;
}

/* The URLs a lock server's flag gave (value), as its row says it takes
 * them: one, or a majority list split at the commas into buf (urls point
 * into it). Returns how many, or -1 with err naming the flag. */
static int lock_urls(const stock_lock_server_info *li, const char *value, char *buf, size_t len,
                     const char **urls, char *err, size_t errlen) {
    if (!li->majority) {
        urls[0] = value;
        return want_scheme(li->flag, value, li->schemes, li->form, err, errlen) ? -1 : 1;
    }
    int n = 0;
    snprintf(buf, len, "%s", value);
    for (char *save = NULL, *u = strtok_r(buf, ",", &save); u; u = strtok_r(NULL, ",", &save)) {
        if (n == LOCK_MAX_SERVERS) {
            snprintf(err, errlen, "%s: more than %d servers", li->flag, LOCK_MAX_SERVERS);
            return -1;
        }
        if (want_scheme(li->flag, u, li->schemes, li->form, err, errlen)) return -1;
        urls[n++] = u;
    }
    if (n < 3 || n % 2 == 0) {
        snprintf(err, errlen, "%s: want %s; got %d", li->flag, li->majority, n);
        return -1;
    }
    return n;
}

/* Lock server srv's clients (its row says which), when it is there: one
 * renewing held leases, and where the row asks for it one renewing nothing
 * (for products whose injected pause stands for a whole-process pause).
 * Returns 0 (also when its flag was not given), or -1 with err. */
static int lock_server_open(svc_app *a, stock_lock_server srv, char *err, size_t errlen) {
    const stock_lock_server_info *li = stock_lock_server_about(srv);
    char buf[SVC_LOCK_URLS_MAX];
    const char *urls[LOCK_MAX_SERVERS] = { a->cfg.redis_url };
    const char *value = a->cfg.lock_urls[srv];
    int n = 1;
    if (!li->client) return 0;
    if (!li->own_redis) {
        if (!li->flag || !value[0]) return 0;        /* not configured: unavailable */
        if ((n = lock_urls(li, value, buf, sizeof buf, urls, err, errlen)) < 0) return -1;
    }
    /* On a cluster too, the service's own Redis: each lock's keys share its
     * SKU's slot ({sku}:lock:<segment>), on the primary serving it. */
    const char *flag = li->own_redis ? "--redis" : li->flag;
    stock_config *sc = &a->stock_cfg;
    if (!(sc->locks[srv] = lock_open(a, flag, urls, n, 1, li->fair, err, errlen))) return -1;
    if (li->frozen &&
        !(sc->locks_frozen[srv] = lock_open(a, flag, urls, n, 0, li->fair, err, errlen)))
        return -1;
    return 0;
}

/* The lock strategies' clients, per server (stock_lock_server_about). The
 * servers are not contacted here; a URL that cannot be a server's is a
 * usage error. Returns 0, or -1 with err naming the flag. */
static int locks_open(svc_app *a, char *err, size_t errlen) {
    for (int s = 0; s < STOCK_LOCKS_COUNT; s++)
        if (lock_server_open(a, (stock_lock_server)s, err, errlen) != 0) return -1;
    return 0;
}

static void locks_close(svc_app *a) {
    for (int i = 0; i < STOCK_LOCKS_COUNT; i++) {
        lock_client_free(a->stock_cfg.locks[i]);
        lock_client_free(a->stock_cfg.locks_frozen[i]);
        a->stock_cfg.locks[i] = a->stock_cfg.locks_frozen[i] = NULL;
    }
}

/* Undoes svc_start, whatever it reached: every part that was made is
 * stopped and freed, in the reverse order of its making. The loops stop
 * before the parts that live on them are freed, and the handles the loops
 * read (writer, maint, health...) are cleared only once they have stopped:
 * with nothing in flight nothing uses a stopped part, and a loop thread
 * never reads a handle while this thread writes it. */
static void teardown(svc_app *a) {
    svc_threadpool_stop(a->api);
    svc_threadpool_stop(a->api_db);
    /* The expiry thread queues its work to the writer and waits for it. */
    svc_holds_stop(a->holds);
    /* The writer first: its last groups hand orders back to the loops. */
    db_writer_stop(a->writer);
    svc_db_give(a, a->writer_db);
    a->writer_db = NULL;
    /* The loops' last clears and undos (and the blocking threads). */
    svc_orders_drain(a, 2000);
    svc_maint_stop(a->maint);
    svc_room_beats_stop(a->room_beats);
    atomic_store(&a->http_up, 0);
    svc_health_stop(a->health);
    /* Nothing is in flight: the loops may stop, then what lives on them. */
    loops_stop(a);
    a->api = a->api_db = NULL;
    a->writer = NULL;
    a->maint = NULL;
    a->room_beats = NULL;
    a->holds = NULL;
    a->health = NULL;
    svc_orders_free(a);
    http_stop(a->http);
    a->http = NULL;
    loops_free(a);
    svc_repair_free(a->repair);
    a->repair = NULL;
    svc_product_cache_free(a->products);
    a->products = NULL;
    svc_thread_conns_free(a);
    /* Every part that took a connection has stopped and given it back. */
    db_pool_free(a->dbpool);
    a->dbpool = NULL;
    locks_close(a);
    svc_redis_close(a);
}

/* Stops accepting and waits until every request in flight is answered:
 * each waits at most for the Redis and database timeouts, so this ends. */
static void quiesce(svc_app *a) {
    atomic_store(&a->shutting_down, 1);
    if (!a->http) return;
    http_quiesce(a->http);
    int64_t start = clock_mono_ms(), warned = 0;
    while (http_inflight(a->http) > 0) {
        if (!warned && clock_mono_ms() - start > a->cfg.shutdown_grace_ms) {
            svc_log(SVC_LOG_WARN, "shutdown: %ld requests still in flight after %d ms",
                    http_inflight(a->http), a->cfg.shutdown_grace_ms);
            warned = 1;
        }
        clock_sleep_ms(5);
    }
}

/* The threads and the loops, then the listener; -1 with err. */
static int start_parts(svc_app *a, char *err, size_t errlen) {
    char why[256];
    /* The committer's connection is its own for the instance's life: the
     * first of the budget, taken before any other part can want one. */
    if (!(a->writer_db = svc_db_take(a, NULL))) {
        snprintf(why, sizeof why, "the committer could not open its database connection");
        goto err;
    }
    if ((a->writer = db_writer_start(a->writer_db, 4096, svc_orders_committed, a, why,
                                     sizeof why))) {
        db_writer_observe(a->writer, svc_metrics_commit, a);
        db_writer_pace(a->writer, a->cfg.commit_gap_us);
    }
    if (!a->writer ||
        !(a->maint = svc_maint_start(a, why, sizeof why)) ||
        !(a->room_beats = svc_room_beats_start(a, why, sizeof why)) ||
        !(a->holds = svc_holds_start(a, why, sizeof why)) ||
        !(a->health = svc_health_start(a, why, sizeof why)) ||
        !(a->api = svc_threadpool_start("fs-api", a->cfg.api_workers, why, sizeof why)) ||
        !(a->api_db = svc_threadpool_start("fs-api-db", a->cfg.api_workers, why, sizeof why)) ||
        loops_start(a, why, sizeof why) != 0)
        goto err;
    /* The HTTP layer's hook (which may read more orders) runs before the
     * order path's whatever the order they attach in: the loops' phases
     * say so (HTTP_PHASE_RANK, then SVC_ORDERS_PHASE_RANK; common/loop.h). */
    http_options ho = { .listen = a->cfg.listen, .loops = a->loops, .nloops = a->nloops,
                        .max_connections = a->cfg.max_connections,
                        .max_per_client = a->cfg.max_per_client,
                        .conn_memory = (size_t)a->cfg.conn_memory_kib * 1024,
                        .idle_timeout_s = a->cfg.idle_timeout_s,
                        .request_timeout_ms = a->cfg.request_timeout_ms, .max_body = 64 * 1024,
                        .routes = svc_api_routes, .nroutes = svc_api_nroutes,
                        .observer = svc_metrics_http, .ud = a };
    if (a->cfg.listen[0] && !(a->http = http_start(&ho, why, sizeof why))) goto err;
    atomic_store(&a->http_up, a->http != NULL);   /* the maintenance thread may look */
    if (svc_orders_start(a, why, sizeof why) != 0 || loops_run(a, why, sizeof why) != 0)
        goto err;
    return 0;
err:
    snprintf(err, errlen, "start: %s", why);
    return -1;
}

/* The open HTTP connections, for the admission limit's connection bound
 * (0 before the listener is up). */
static long open_conns(void *ud) {
    svc_app *a = ud;
    return atomic_load(&a->http_up) ? http_connections(a->http) : 0;
}

/* Whether a SIGTERM or SIGINT is pending: they are blocked until main's
 * sigwait, which takes them once the service has started. */
static int stop_asked(void) {
    sigset_t pending;
    return sigpending(&pending) == 0 &&
           (sigismember(&pending, SIGTERM) == 1 || sigismember(&pending, SIGINT) == 1);
}

/* The first database connection, which opens the database (and migrates
 * its schema). A server that cannot be opened yet -- down, a standby not
 * promoted yet (read-only), out of connections: a failover or a restart
 * under way -- is tried again about once a second, each failure logged,
 * for --db-start-wait-ms or until a SIGTERM or SIGINT comes; a file (SQLite)
 * once. NULL with why on failure. */
static db *open_database(svc_app *a, char *why, size_t whylen) {
    int64_t until = clock_mono_ms() + a->cfg.db_start_wait_ms;
    int server = db_target_server(a->cfg.db_path);
    for (int tries = 1;; tries++) {
        db *d = NULL;
        db_status st = db_pool_take(a->dbpool, a->cfg.db_connection_wait_ms, &d, why, whylen);
        if (st == DB_OK) {
            if (tries > 1) svc_log(SVC_LOG_INFO, "database: opened at try %d", tries);
            return d;
        }
        int64_t left = until - clock_mono_ms();
        if (!server || st != DB_DOWN || left <= 0) return NULL;
        if (stop_asked()) {
            svc_log(SVC_LOG_WARN, "database: stopped while waiting for it (a signal came)");
            return NULL;
        }
        svc_log(SVC_LOG_WARN, "database: cannot open it yet (%s); trying again for up to %lld s "
                "more (--db-start-wait-ms)", why, (long long)(left + 999) / 1000);
        for (int i = 0; i < 10 && !stop_asked() && clock_mono_ms() < until; i++)
            clock_sleep_ms(100);
    }
}

int svc_start(svc_app *a, char *err, size_t errlen) {
    char why[256];
    if (stock_strategy_parse(a->cfg.strategy, &a->default_strategy) != 0) {
        snprintf(err, errlen, "--strategy: no strategy named '%s' (see --help)", a->cfg.strategy);
        return 2;
    }
    make_instance_id(a);
    atomic_store(&a->shutting_down, 0);
    svc_admit_init(&a->adm, a->cfg.max_inflight, (long)a->cfg.max_connections,
                       a->cfg.latency_target_ms);
    svc_admit_count_conns(&a->adm, open_conns, a);
    a->stock_cfg = (stock_config){ .redis_url = a->cfg.redis_url, .prefix = a->cfg.key_prefix,
                                   .timeout_ms = a->cfg.redis_timeout_ms,
                                   .instance = a->instance_id, .idem_ttl_ms = a->cfg.idem_ttl_ms,
                                   .lock_ttl_ms = a->cfg.lock_ttl_ms,
                                   .lock_wait_ms = a->cfg.lock_wait_ms,
                                   .observe = svc_metrics_redis_call, .observe_ud = a };
    /* A statement that waits past both the lock wait and the COMMIT's
     * bound is not waiting for the database: a pooler's full pool, a
     * server gone silent. It is canceled, and its request answered. */
    a->db_opt = (db_options){ a->cfg.synchronous_full, a->cfg.db_busy_timeout_ms, 0,
                              a->cfg.db_commit_timeout_ms,
                              a->cfg.db_busy_timeout_ms + a->cfg.db_commit_timeout_ms };
    if (svc_redis_open(a, err, errlen) != 0 || locks_open(a, err, errlen) != 0) goto usage;
    stock_conn *probe = stock_conn_new(&a->stock_cfg, why, sizeof why);
    if (!probe) {
        snprintf(err, errlen, "--redis: %s", why);
        goto usage;
    }
    stock_conn_free(probe);
    svc_thread_conns_init(a);
    if (!(a->products = svc_product_cache_new(a->cluster != NULL)) || !(a->repair = svc_repair_new(a))) {
        snprintf(err, errlen, "start: out of memory");
        goto fail;
    }
    if (!(a->dbpool = db_pool_new(a->cfg.db_path, &a->db_opt, a->cfg.db_max_connections, why,
                                  sizeof why))) {
        snprintf(err, errlen, "start: %s", why);
        goto fail;
    }
    a->stock_cfg.db_pool = a->dbpool;           /* the db-lock table's connections */
    a->stock_cfg.db_wait_ms = a->cfg.db_connection_wait_ms;
    db *d = open_database(a, why, sizeof why);
    if (!d) {
        char shown[600];
        db_target_redact(a->cfg.db_path, shown, sizeof shown);
        snprintf(err, errlen, "database %s: %s", shown, why);
        goto fail;
    }
    if (db_pooled(d))
        svc_log(SVC_LOG_INFO, "database: reached through a pooler (the server connection is not "
                "this client's own: PgBouncer?): no named statements, settings per transaction");
    svc_repair_recover(a, d);
    svc_db_give(a, d);
    if (start_parts(a, err, errlen) != 0) goto fail;
    return 0;
usage:
    locks_close(a);
    svc_redis_close(a);
    return 2;
fail:
    teardown(a);
    return 1;
}

void svc_stop(svc_app *a) {
    quiesce(a);
    teardown(a);
}
