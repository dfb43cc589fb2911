/* reconcile.c: settling the pending records no live request owns.
 *
 * A pending record marks units reserved in Redis for an order not yet
 * known committed. When its owner is dead (or the record is older than
 * the pending timeout) it is settled against SQLite: if the order is
 * there the record is cleared; otherwise the order is voided in SQLite
 * first (so it can never commit afterwards) and then its units are given
 * back. An order marked to be revoked (answered 503 while its COMMIT's
 * outcome was unknown) is revoked instead -- with its record, or, once a
 * rebuild has dropped the record, by its mark alone. Run by maintenance,
 * at start, and by audit --repair. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "service/app.h"
#include "service/log.h"
#include "service/products.h"
#include "service/repair/repair.h"

/* How long a sweep waits for the database to confirm a commit before it
 * revokes an order (db_barrier). */
#define REVOKE_PROBE_MS 250

typedef struct pend {
    char order_id[DB_ORDER_ID_LEN + 1];
    char instance[112];
    char idem_key[DB_KEY_MAX + 1];
    long long age_ms;
    int lane;                    /* a spread product's lane (-1: not spread) */
} pend;

typedef struct pend_acc {
    pend *v;
    size_t n, cap;
} pend_acc;

static void collect_pending(const stock_pending *rec, void *ud) {
    pend_acc *acc = ud;
    if (acc->n == acc->cap) {
        size_t cap = acc->cap ? acc->cap * 2 : 64;
        pend *v = realloc(acc->v, cap * sizeof *v);
        if (!v) return;
        acc->v = v;
        acc->cap = cap;
    }
    pend *p = &acc->v[acc->n++];
    snprintf(p->order_id, sizeof p->order_id, "%s", rec->order_id);
    snprintf(p->instance, sizeof p->instance, "%s", rec->instance);
    snprintf(p->idem_key, sizeof p->idem_key, "%s", rec->idem_key);
    p->age_ms = rec->age_ms;
    p->lane = rec->lane;
}

/* Whether a pending record may be settled now. */
static int settleable(svc_app *a, stock_conn *sc, const pend *r, int only_dead) {
    if (!only_dead || r->age_ms >= a->cfg.pending_timeout_ms) return 1;
    if (!strcmp(r->instance, a->instance_id)) return 0;    /* ours, in flight */
    size_t nl = strlen(a->instance_name);
    if (!strncmp(r->instance, a->instance_name, nl) && r->instance[nl] == '#')
        return 1;                                           /* our previous run */
    return stock_instance_alive(sc, r->instance) == 0;      /* its owner is gone */
}

/* Settles the record of an order marked to be revoked (stock_revoke_mark)
 * by an owner that did not get to it: the order was answered 503, so it
 * is revoked in the database (never confirmed, though its row be there),
 * and then its units come back -- by the copy loaded again when a row was
 * deleted (the database no longer counts them), else by the undo. Returns
 * 1 if settled. */
static int settle_revoked(svc_app *a, db *d, stock_conn *sc, svc_product *p, const pend *r,
                          const stock_ref *ref) {
    int removed = 0, done = 0;
    if (db_barrier(d, REVOKE_PROBE_MS) != DB_OK ||
        db_order_revoke(d, r->order_id, p->sku, 0, p->per_user_limit > 0, &removed) != DB_OK)
        return 0;
    svc_log(SVC_LOG_INFO, "revoked %s's order %s (owner %s gone or late; it was answered 503%s)",
            p->sku,
            r->order_id, r->instance, removed ? " and its row had committed" : "");
    if (removed) {
        if (a->repair) svc_repair_request_forced_rebuild(a->repair, p);
        else if (svc_rebuild(a, d, sc, p, 1) != 0) return 0;
    } else if (stock_undo(sc, ref, 1, &done) != 0 || !done) {
        return 0;
    }
    stock_revoke_unmark(sc, &p->sp, r->order_id);
    return 1;
}

/* Revokes an order by its mark alone: a rebuild dropped its pending
 * record (load.lua), counting the order sold if its row was there then.
 * The revoke deletes the row; the copy is loaded again without it. Returns
 * 1 if done. */
static int settle_mark(svc_app *a, db *d, stock_conn *sc, svc_product *p, const pend *m) {
    int removed = 0;
    if (db_barrier(d, REVOKE_PROBE_MS) != DB_OK ||
        db_order_revoke(d, m->order_id, p->sku, 0, p->per_user_limit > 0, &removed) != DB_OK)
        return 0;
    svc_log(SVC_LOG_INFO, "revoked %s's order %s by its mark (owner %s gone or late; it was "
            "answered 503%s)", p->sku, m->order_id, m->instance[0] ? m->instance : "?",
            removed ? " and its row had committed" : "");
    if (removed) {
        if (a->repair) svc_repair_request_forced_rebuild(a->repair, p);
        else if (svc_rebuild(a, d, sc, p, 1) != 0) return 0;
    }
    return stock_revoke_unmark(sc, &p->sp, m->order_id) == 0;
}

static void collect_mark(const char *order_id, const char *instance, long long age_ms, void *ud) {
    stock_pending rec = { .lane = -1, .order_id = order_id, .instance = instance,
                          .idem_key = "", .age_ms = age_ms };
    collect_pending(&rec, ud);
}

static int by_id(const void *x, const void *y) {
    return strcmp(((const pend *)x)->order_id, ((const pend *)y)->order_id);
}

/* The marks of p without a pending record (those with one are settled
 * with it): settles those that may be, as their records would be. */
static int settle_marks(svc_app *a, db *d, stock_conn *sc, svc_product *p, int only_dead,
                        pend_acc *records) {
    pend_acc marks = { 0 };
    int settled = 0;
    if (stock_revoke_scan(sc, &p->sp, collect_mark, &marks) != 0) {
        free(marks.v);
        return 0;
    }
    if (records->n) qsort(records->v, records->n, sizeof *records->v, by_id);
    for (size_t k = 0; k < marks.n; k++) {
        const pend *m = &marks.v[k];
        if (records->n && bsearch(m, records->v, records->n, sizeof *records->v, by_id)) continue;
        if (a->repair && svc_repair_revoking(a->repair, m->order_id)) continue;  /* ours, queued */
        if (settleable(a, sc, m, only_dead) && settle_mark(a, d, sc, p, m)) settled++;
    }
    free(marks.v);
    return settled;
}

/* Settles one record: returns 1 if settled. */
static int settle(svc_app *a, db *d, stock_conn *sc, svc_product *p, const pend *r) {
    char lane[16];
    snprintf(lane, sizeof lane, "%d:0", r->lane);    /* a spread product: that lane only */
    stock_ref ref = { &p->sp, r->order_id, r->idem_key, r->lane >= 0 ? lane : NULL };
    int done = 0;
    if (a->repair && svc_repair_revoking(a->repair, r->order_id)) return 0;   /* its revoke does */
    int marked = stock_revoke_marked(sc, &p->sp, r->order_id);
    if (marked < 0) return 0;
    if (marked) return settle_revoked(a, d, sc, p, r, &ref);
    db_status st = db_order_void(d, r->order_id, p->sku, "reservation not committed in time");
    /* A row found is kept only once it is durable: a COMMIT canceled while
     * it waited for the synchronous standby left it on the primary alone,
     * and a failover would take it away with its units counted sold. The
     * barrier, confirmed, confirms it too. */
    if (st == DB_EXISTS && db_barrier(d, REVOKE_PROBE_MS) != DB_OK) return 0;
    if (st == DB_EXISTS) {
        if (stock_confirm(sc, &ref, 1) != 0) return 0;
        atomic_fetch_add(&a->m.settled_commit, 1);
        svc_log(SVC_LOG_INFO, "kept %s's order %s (owner %s, %lld ms old: its row committed)",
                p->sku, r->order_id, r->instance, r->age_ms);
        return 1;
    }
    if (st != DB_OK) return 0;
    /* Voided: it can never commit now, so its units go back. */
    if (stock_undo(sc, &ref, 1, &done) != 0 || !done) return 0;
    atomic_fetch_add(&a->m.settled_undo, 1);
    svc_log(SVC_LOG_INFO, "gave back %s's reservation %s (owner %s, %lld ms old, never committed)",
            p->sku, r->order_id, r->instance, r->age_ms);
    return 1;
}

/* What a sweep over every product found, for the metrics. */
typedef struct backlog {
    long long left;              /* pending records not settled by it */
    long long oldest_ms;         /* the oldest of those */
} backlog;

/* Settles p's records that may be settled; counts the rest in bl (NULL:
 * not counted). Returns the number settled, or -1 on error. */
static int reconcile_product(svc_app *a, db *d, stock_conn *sc, svc_product *p, int only_dead,
                             backlog *bl) {
    pend_acc acc = { 0 };
    int settled = 0;
    if (!stock_strategy_about(p->strategy)->uses_redis) return 0;
    if (stock_pending_scan(sc, &p->sp, collect_pending, &acc) != 0) {
        free(acc.v);
        return -1;
    }
    for (size_t k = 0; k < acc.n; k++) {
        if (settleable(a, sc, &acc.v[k], only_dead) && settle(a, d, sc, p, &acc.v[k])) {
            settled++;
        } else if (bl) {
            bl->left++;
            if (acc.v[k].age_ms > bl->oldest_ms) bl->oldest_ms = acc.v[k].age_ms;
        }
    }
    settled += settle_marks(a, d, sc, p, only_dead, &acc);
    free(acc.v);
    return settled;
}

int svc_reconcile_product(svc_app *a, db *d, stock_conn *sc, svc_product *p, int only_dead) {
    return reconcile_product(a, d, sc, p, only_dead, NULL);
}

/* Every product's records, and (the product rows being at hand) what each
 * strategy sold beyond its stock: a complete sweep is the backlog gauges'
 * reading (svc_metrics_swept), so a scrape never scans Redis itself. */
int svc_reconcile(svc_app *a, db *d, stock_conn *sc, int only_dead) {
    db_product *all;
    size_t n;
    int settled = 0;
    backlog bl = { 0, 0 };
    long long oversold[STOCK_STRATEGY_COUNT] = { 0 };
    if (db_product_list(d, &all, &n) != DB_OK) {
        svc_log(SVC_LOG_WARN, "reconcile: %s", db_errstr(d));
        return -1;
    }
    for (size_t i = 0; i < n && settled >= 0; i++) {
        svc_product *p = svc_product_cache_put(a->products, &all[i]);
        if (!p) continue;
        if (all[i].sold + all[i].held > all[i].stock_initial)
            oversold[p->strategy] += all[i].sold + all[i].held - all[i].stock_initial;
        int k = reconcile_product(a, d, sc, p, only_dead, &bl);
        settled = k < 0 ? -1 : settled + k;
    }
    free(all);
    if (settled >= 0) svc_metrics_swept(a, bl.left, bl.oldest_ms, oversold);
    return settled;
}
