/* maint.c: the maintenance thread.
 *
 * - Heartbeat: <prefix>instance:<id> with a short TTL, so other instances
 *   can tell a live owner of a pending record from a dead one.
 * - Repairs (repair/): queued rebuilds and undo retries as soon as they
 *   are asked for; a sweep of every product's pending records every two
 *   seconds, settling those of dead owners.
 * - Memory: after an outage, or after a burst of connections has closed,
 *   the memory freed is given back.
 * - Tallies (PostgreSQL): every FOLD_EVERY_MS, the units the groups counted
 *   in their tally rows are folded into the products rows (db_fold_tallies),
 *   so the tallies' table stays small however long the sale.
 * - Connections: each round takes one of the budget (db/pool.h) and gives
 *   it back; the pool's connections idle past DB_POOL_IDLE_MS are closed. */
#include <assert.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/clock.h"
#include "service/app.h"
#include "service/log.h"
#include "service/ops/maint.h"
#include "service/repair/repair.h"
#include "rtopo/rtopo.h"

#define HEARTBEAT_TTL_MS 5000
#define SWEEP_EVERY_MS 2000
#define FOLD_EVERY_MS 10000
#define WAKE_EVERY_MS 200
#define TRIM_CHECK_MS 2000         /* connection churn: looked at this often */
#define TRIM_AFTER_CLOSED 256      /* ...and trimmed after this many closes */

struct svc_maint {
    svc_app *a;
    pthread_t thread;
    atomic_int stopping;
    uint64_t errors_seen;          /* redis + db errors at the last sweep */
    unsigned primary_seen;         /* the Sentinel primary's (or the cluster map's)
                                      version last logged */
    int trims_left;                /* sweeps that still trim (see trim_after_errors) */
    long closed_seen;              /* connections closed at the last trim */
    int64_t next_conn_check;       /* ms (trim_after_connections) */
};

/* An outage of Redis or the database makes every thread answer a burst of
 * 503s, and glibc keeps the memory they freed: RSS stepped up ~10 MB at the
 * soak's first Redis outage and 1-2 MB at each next one, with valgrind
 * finding every byte freed. Trimming at the sweeps during an outage and
 * just after it returns that memory (soak, 6 restarts in 200 s: 41 MB at
 * the end without, 34 MB with a trim at every sweep); in steady state, with
 * no errors, nothing is trimmed, so the hot path never meets it. */
static void trim_after_errors(svc_maint *m) {
    uint64_t errors = atomic_load(&m->a->m.redis_errors) + atomic_load(&m->a->m.db_errors);
    if (errors != m->errors_seen) {
        m->errors_seen = errors;
        m->trims_left = 2;
    }
    if (m->trims_left > 0) {
        m->trims_left--;
        malloc_trim(0);
    }
}

/* Each HTTP connection's buffers (libmicrohttpd's pool, 16 KiB) come from
 * the malloc arena of the event loop that accepted it, and glibc keeps
 * what a burst of connections freed once they close: 3,000 idle and 400
 * slow connections took RSS from 19 to 117 MB (32 KiB pools) and it stayed
 * at 115 MB after they had all closed, with malloc_stats showing 50 MB
 * held by each loop's arena and 21 KB of it in use; valgrind finds
 * nothing lost. A malloc_trim(0) then gives it back (19.6 MB). So after
 * TRIM_AFTER_CLOSED closes, at most every TRIM_CHECK_MS, the freed memory
 * is returned: the bursts are what it is for, and steady traffic on
 * keep-alive connections closes none. (docs/performance.md, "Memory".) */
static void trim_after_connections(svc_maint *m, int64_t now) {
    if (!atomic_load(&m->a->http_up) || now < m->next_conn_check) return;
    m->next_conn_check = now + TRIM_CHECK_MS;
    long closed = http_closed(m->a->http);
    if (closed - m->closed_seen < TRIM_AFTER_CLOSED) return;
    m->closed_seen = closed;
    malloc_trim(0);
}

/* A Sentinel-watched primary that moved: one log line per move. */
static void log_primary(svc_maint *m) {
    svc_app *a = m->a;
    rconn_addr at;
    if (!a->primary || rtopo_primary_version(a->primary) == m->primary_seen) return;
    m->primary_seen = rtopo_primary_get(a->primary, &at);
    if (m->primary_seen)
        svc_log(SVC_LOG_INFO, "redis: the primary is %s:%d (Sentinel)", at.host, at.port);
}

/* A cluster whose slot map changed (a failover, a reshard): one log line
 * per change, naming the primaries. */
static void log_cluster(svc_maint *m) {
    svc_app *a = m->a;
    char map[1024];
    if (!a->cluster || rtopo_cluster_version(a->cluster) == m->primary_seen) return;
    m->primary_seen = rtopo_cluster_describe(a->cluster, map, sizeof map);
    if (m->primary_seen)
        svc_log(SVC_LOG_INFO, "redis cluster: primaries %s", map);
}

static void *maint_main(void *arg) {
    svc_maint *m = arg;
    pthread_setname_np(pthread_self(), "fs-maint");
    svc_app *a = m->a;
    char err[256];
    stock_conn *sc = stock_conn_new(&a->stock_cfg, err, sizeof err);
    int64_t next_beat = 0, next_sweep = clock_mono_ms() + SWEEP_EVERY_MS;
    int64_t next_fold = clock_mono_ms() + FOLD_EVERY_MS;
    assert(sc != NULL);   /* the configuration was checked at start */
    while (!atomic_load(&m->stopping)) {
        svc_repair_wait(a->repair, WAKE_EVERY_MS);
        if (atomic_load(&m->stopping)) break;
        int64_t now = clock_mono_ms();
        log_primary(m);
        log_cluster(m);
        if (now >= next_beat) {
            stock_heartbeat(sc, HEARTBEAT_TTL_MS);
            next_beat = now + 1000;
        }
        /* A connection of the budget for this round, given back after it
         * (NULL: none free or the database down; the repairs that need one
         * wait for a later round). Idle ones past their time are closed. */
        db *d = svc_db_take(a, NULL);
        svc_repair_run(a->repair, d, sc);
        trim_after_connections(m, now);
        if (d && now >= next_sweep) {
            svc_reconcile(a, d, sc, 1);
            next_sweep = now + SWEEP_EVERY_MS;
            trim_after_errors(m);
        }
        if (d && db_tallies(d) && now >= next_fold) {
            long long folded = 0;
            db_status st = db_fold_tallies(d, &folded);
            if (st != DB_OK && st != DB_BUSY)
                svc_log(SVC_LOG_WARN, "maintenance: folding the tallies: %s", db_errstr(d));
            next_fold = now + FOLD_EVERY_MS;
        }
        svc_db_give(a, d);
        db_pool_trim(a->dbpool);
    }
    svc_repair_run(a->repair, NULL, sc);   /* a last try for undos that failed at shutdown */
    stock_conn_free(sc);
    return NULL;
}

svc_maint *svc_maint_start(svc_app *a, char *err, size_t errlen) {
    svc_maint *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    m->a = a;
    if (pthread_create(&m->thread, NULL, maint_main, m) != 0) {
        snprintf(err, errlen, "cannot start the maintenance thread");
        free(m);
        return NULL;
    }
    return m;
}

void svc_maint_stop(svc_maint *m) {
    if (!m) return;
    atomic_store(&m->stopping, 1);
    svc_repair_interrupt(m->a->repair);
    pthread_join(m->thread, NULL);
    free(m);
}
