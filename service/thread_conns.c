/* thread_conns.c: per-thread connections for the service.
 *
 * Every thread that reads or writes the stores off the order path's event
 * loops (API workers, the blocking threads) gets its own SQLite connection
 * and its own Redis connection on first use, freed when the thread ends:
 * no connection is ever shared between threads, so none needs a lock. */
#include <stdio.h>
#include <stdlib.h>

#include "service/app.h"
#include "service/log.h"

typedef struct tls_conns {
    db *d;
    stock_conn *sc;
} tls_conns;

static void tls_free(void *p) {
    tls_conns *t = p;
    db_close(t->d);
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

db *svc_thread_db(svc_app *a) {
    tls_conns *t = tls(a);
    char err[256];
    if (!t) return NULL;
    if (!t->d && !(t->d = db_open(a->cfg.db_path, &a->db_opt, err, sizeof err)))
        svc_log(SVC_LOG_ERROR, "database: %s", err);
    return t->d;
}

stock_conn *svc_thread_stock(svc_app *a) {
    tls_conns *t = tls(a);
    char err[256];
    if (!t) return NULL;
    if (!t->sc && !(t->sc = stock_conn_new(&a->stock_cfg, err, sizeof err)))
        svc_log(SVC_LOG_ERROR, "redis: %s", err);
    return t->sc;
}
