/* queue.c: repair work asked for by the order path and the API, done by
 * the maintenance thread.
 *
 * - Rebuilds: a product whose Redis copy was found missing (an order
 *   answered STOCK_MISSING, a GET, a restock of unknown outcome) is queued
 *   once (svc_product.rebuilding deduplicates) and rebuilt from SQLite.
 * - Undo retries: reservations whose undo failed (Redis down) or whose
 *   script's outcome is unknown are retried until Redis answers; an undo is
 *   a no-op when the reservation was never made or already given back.
 * - Revokes: orders answered 503 while their COMMIT's outcome was unknown
 *   (a COMMIT canceled after the commit timeout: committed on the primary,
 *   perhaps not on its standby). A 5xx leaves nothing taken, so each is
 *   revoked in the database once it answers (db_order_revoke: the row
 *   deleted if it is there, the order voided) and only then are its units
 *   given back. Reconciliation leaves their pending records alone.
 *
 * Asking never waits (the order path asks from its loops); the work runs
 * on the thread that calls svc_repair_run, on its own connections. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "service/app.h"
#include "service/log.h"
#include "service/products.h"
#include "service/repair/repair.h"

typedef struct orphan {
    svc_product *p;
    char order_id[DB_ORDER_ID_LEN + 1];
    char idem_key[DB_KEY_MAX + 1];
    int in_db;                   /* a revoke's: the stock is the database's */
    int marked;                  /* a revoke's: marked in Redis (stock_revoke_mark) */
    struct orphan *next;
} orphan;

struct svc_repair {
    svc_app *a;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int interrupted;
    svc_product **rebuild;             /* queued rebuilds */
    size_t nrebuild, caprebuild;
    orphan *orphans;
    orphan *revokes;                   /* orders to revoke, then give back */
};

svc_repair *svc_repair_new(svc_app *a) {
    svc_repair *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->a = a;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    return r;
}

void svc_repair_free(svc_repair *r) {
    if (!r) return;
    while (r->revokes) {
        orphan *o = r->revokes;
        r->revokes = o->next;
        svc_log(SVC_LOG_ERROR, "order %s of %s answered 503 and not revoked (the database did "
                "not confirm): it may stand; left to `flashsale audit`", o->order_id, o->p->sku);
        free(o);
    }
    while (r->orphans) {
        orphan *o = r->orphans;
        r->orphans = o->next;
        svc_log(SVC_LOG_WARN, "reservation %s of %s left for reconciliation (Redis unreachable)",
                o->order_id, o->p->sku);
        free(o);
    }
    free(r->rebuild);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

/* ---------------------------------------------------------------- asking */

void svc_repair_request_forced_rebuild(svc_repair *r, svc_product *p) {
    atomic_store(&p->rebuild_forced, 1);   /* before queueing: seen by its run */
    svc_repair_request_rebuild(r, p);
}

void svc_repair_request_rebuild(svc_repair *r, svc_product *p) {
    if (atomic_exchange(&p->rebuilding, 1)) return;   /* already queued */
    pthread_mutex_lock(&r->mu);
    if (r->nrebuild == r->caprebuild) {
        size_t cap = r->caprebuild ? r->caprebuild * 2 : 16;
        svc_product **v = realloc(r->rebuild, cap * sizeof *v);
        if (!v) {
            pthread_mutex_unlock(&r->mu);
            atomic_store(&p->rebuilding, 0);
            return;
        }
        r->rebuild = v;
        r->caprebuild = cap;
    }
    r->rebuild[r->nrebuild++] = p;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* A reservation of p to queue, or NULL when out of memory. */
static orphan *orphan_new(svc_product *p, const char *order_id, const char *idem_key) {
    orphan *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    o->p = p;
    snprintf(o->order_id, sizeof o->order_id, "%s", order_id);
    snprintf(o->idem_key, sizeof o->idem_key, "%s", idem_key ? idem_key : "");
    return o;
}

void svc_repair_retry_undo(svc_repair *r, svc_product *p, const char *order_id,
                           const char *idem_key) {
    orphan *o = orphan_new(p, order_id, idem_key);
    if (!o) return;   /* the sweeps settle it after the pending timeout */
    pthread_mutex_lock(&r->mu);
    o->next = r->orphans;
    r->orphans = o;
    pthread_mutex_unlock(&r->mu);
}

void svc_repair_revoke(svc_repair *r, svc_product *p, const char *order_id,
                       const char *idem_key, int in_db, int marked) {
    orphan *o = orphan_new(p, order_id, idem_key);
    if (!o) {
        svc_log(SVC_LOG_ERROR, "order %s: out of memory queueing its revoke", order_id);
        return;
    }
    o->in_db = in_db;
    o->marked = marked;
    pthread_mutex_lock(&r->mu);
    o->next = r->revokes;
    r->revokes = o;
    pthread_mutex_unlock(&r->mu);
}

int svc_repair_revoking(svc_repair *r, const char *order_id) {
    int found = 0;
    pthread_mutex_lock(&r->mu);
    for (orphan *o = r->revokes; o && !found; o = o->next) found = !strcmp(o->order_id, order_id);
    pthread_mutex_unlock(&r->mu);
    return found;
}

/* --------------------------------------------------------------- waiting */

void svc_repair_wait(svc_repair *r, int ms) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += ms / 1000;
    until.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&r->mu);
    if (r->nrebuild == 0 && !r->interrupted) pthread_cond_timedwait(&r->cv, &r->mu, &until);
    r->interrupted = 0;
    pthread_mutex_unlock(&r->mu);
}

void svc_repair_interrupt(svc_repair *r) {
    pthread_mutex_lock(&r->mu);
    r->interrupted = 1;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* --------------------------------------------------------------- running */

static void run_rebuilds(svc_repair *r, db *d, stock_conn *sc) {
    pthread_mutex_lock(&r->mu);
    size_t n = r->nrebuild;
    svc_product **todo = malloc((n ? n : 1) * sizeof *todo);
    if (todo) {
        if (n) memcpy(todo, r->rebuild, n * sizeof *todo);
        r->nrebuild = 0;
    } else {
        n = 0;
    }
    pthread_mutex_unlock(&r->mu);
    for (size_t i = 0; i < n; i++) {
        atomic_store(&todo[i]->rebuilding, 0);
        int force = atomic_exchange(&todo[i]->rebuild_forced, 0);
        if (svc_rebuild(r->a, d, sc, todo[i], force) != 0) {
            if (force) svc_repair_request_forced_rebuild(r, todo[i]);
            else svc_repair_request_rebuild(r, todo[i]);
        }
    }
    free(todo);
}

static void run_undos(svc_repair *r, stock_conn *sc) {
    pthread_mutex_lock(&r->mu);
    orphan *list = r->orphans;
    r->orphans = NULL;
    pthread_mutex_unlock(&r->mu);
    while (list) {
        orphan *o = list;
        list = o->next;
        stock_ref ref = { &o->p->sp, o->order_id, o->idem_key, NULL };   /* every lane */
        int done = 0;
        int rc = stock_undo(sc, &ref, 1, &done);
        if (rc == 0 && done) {
            free(o);
            continue;
        }
        /* Still failing: keep it for later. When Redis itself failed, keep
         * the rest too, untried: one timeout per orphan would hold up the
         * heartbeat behind a stalled Redis. */
        pthread_mutex_lock(&r->mu);
        o->next = r->orphans;
        r->orphans = o;
        if (rc != 0) {
            orphan *last = list;
            while (last && last->next) last = last->next;
            if (last) {
                last->next = r->orphans;
                r->orphans = list;
            }
            list = NULL;
        }
        pthread_mutex_unlock(&r->mu);
    }
}

#define REVOKE_PROBE_MS 250

/* Puts the revokes of list (not empty) back in the queue, for later. */
static void requeue_revokes(svc_repair *r, orphan *list) {
    orphan *last = list;
    while (last->next) last = last->next;
    pthread_mutex_lock(&r->mu);
    last->next = r->revokes;
    r->revokes = list;
    pthread_mutex_unlock(&r->mu);
}

/* Revokes the queued orders; each revoked has its units given back (a
 * Redis copy's: by an undo, retried as the others are). One that the
 * database does not revoke yet (still unconfirmed, or the transaction
 * that inserted it still running) stays queued, and so do the rest. */
static void run_revokes(svc_repair *r, db *d, stock_conn *sc) {
    pthread_mutex_lock(&r->mu);
    orphan *list = r->revokes;
    r->revokes = NULL;
    pthread_mutex_unlock(&r->mu);
    /* Marked in Redis first, whatever the database does: should this
     * instance die before the revoke, another's sweep reads the mark and
     * revokes the order instead of keeping the row it finds. */
    for (orphan *o = list; o; o = o->next)
        if (!o->in_db && !o->marked) o->marked = stock_revoke_mark(sc, &o->p->sp, o->order_id) == 0;
    /* First a barrier, briefly: while the database confirms no commit (its
     * standby out of reach), a revoke's COMMIT would wait its whole
     * timeout, and this thread also beats the instance's heartbeat. */
    if (list && db_barrier(d, REVOKE_PROBE_MS) != DB_OK) {
        requeue_revokes(r, list);
        return;
    }
    while (list) {
        orphan *o = list;
        int removed = 0;
        const svc_product *p = o->p;
        db_status st = db_order_revoke(d, o->order_id, p->sku, o->in_db, p->per_user_limit > 0,
                                       &removed);
        if (st != DB_OK) {
            svc_log(SVC_LOG_WARN, "revoking order %s of %s: %s (tried again later)", o->order_id,
                    p->sku, db_errstr(d));
            requeue_revokes(r, list);
            return;
        }
        list = o->next;
        svc_log(SVC_LOG_INFO, "revoked order %s of %s (answered 503; %s)", o->order_id, p->sku,
                removed ? "its row had committed on the primary" : "it had not committed");
        /* Not committed: its pending record still holds its units, and an
         * undo gives them back (a no-op if another instance's sweep voided
         * it and did). Committed: the record may be gone already -- another
         * instance's sweep found the row and confirmed the units sold --
         * so the copy is loaded again from the database, which no longer
         * counts them. */
        if (!o->in_db && removed) svc_repair_request_forced_rebuild(r, o->p);
        else if (!o->in_db) svc_repair_retry_undo(r, o->p, o->order_id, o->idem_key);
        if (o->marked) stock_revoke_unmark(sc, &o->p->sp, o->order_id);   /* or left, unread */
        free(o);
    }
}

void svc_repair_run(svc_repair *r, db *d, stock_conn *sc) {
    if (d) run_rebuilds(r, d, sc);
    if (d) run_revokes(r, d, sc);
    run_undos(r, sc);
}
