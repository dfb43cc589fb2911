/* thread_conns.c: the connections of the service's threads.
 *
 * Redis: every thread that reads or writes the stock off the order path's
 * event loops (API workers, the blocking threads) gets its own connection
 * on first use, freed when the thread ends: none is shared between
 * threads, so none needs a lock.
 *
 * The database: connections are the instance's budget (--db-max-
 * connections; a PostgreSQL server is shared by every instance), so a
 * thread takes one from the pool for a piece of work and gives it back
 * (svc_db_take, svc_db_give), and a take waits at most
 * --db-connection-wait-ms. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/clock.h"
#include "service/app.h"
#include "service/log.h"

typedef struct tls_conns {
    stock_conn *sc;
} tls_conns;

static void tls_free(void *p) {
    tls_conns *t = p;
    stock_conn_free(t->sc);
    free(t);
}

void svc_thread_conns_init(svc_app *a) { pthread_key_create(&a->tls, tls_free); }

void svc_thread_conns_free(svc_app *a) {
    /* The calling thread's own (the main thread, after a start that
     * recovered on it), then the key: other threads freed theirs on exit. */
    tls_conns *t = pthread_getspecific(a->tls);
    if (t) {
        pthread_setspecific(a->tls, NULL);
        tls_free(t);
    }
    pthread_key_delete(a->tls);
}

static tls_conns *tls(svc_app *a) {
    tls_conns *t = pthread_getspecific(a->tls);
    if (!t && (t = calloc(1, sizeof *t)) != NULL) pthread_setspecific(a->tls, t);
    return t;
}

/* Says a failed take at most once a second, with how many were not said:
 * a database that is down fails every take of every thread. */
static void log_failed_take(db_status st, const char *err) {
    static _Atomic int64_t said_at;
    static atomic_long unsaid;
    int64_t now = clock_mono_ms(), at = atomic_load(&said_at);
    if (now - at < 1000 || !atomic_compare_exchange_strong(&said_at, &at, now)) {
        atomic_fetch_add(&unsaid, 1);
        return;
    }
    long more = atomic_exchange(&unsaid, 0);
    svc_log_level lv = st == DB_NOCONN ? SVC_LOG_WARN : SVC_LOG_ERROR;
    if (more) svc_log(lv, "database: %s (and %ld more failed takes since)", err, more);
    else svc_log(lv, "database: %s", err);
}

db *svc_db_take(svc_app *a, int *busy) {
    db *d = NULL;
    char err[600];
    db_status st = db_pool_take(a->dbpool, a->cfg.db_connection_wait_ms, &d, err, sizeof err);
    if (busy) *busy = st == DB_NOCONN;
    if (st != DB_OK) log_failed_take(st, err);
    return d;
}

void svc_db_give(svc_app *a, db *d) { db_pool_give(a->dbpool, d); }

stock_conn *svc_thread_stock(svc_app *a) {
    tls_conns *t = tls(a);
    char err[256];
    if (!t) return NULL;
    if (!t->sc && !(t->sc = stock_conn_new(&a->stock_cfg, err, sizeof err)))
        svc_log(SVC_LOG_ERROR, "redis: %s", err);
    return t->sc;
}
