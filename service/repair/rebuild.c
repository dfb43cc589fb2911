/* rebuild.c: rebuilding a product's Redis stock copy from SQLite.
 *
 * When a SKU's Redis copy is missing, or was built for another Redis
 * process (run_id), a new generation starts in SQLite and Redis is loaded
 * with stock_initial - sold (db.h says why that number is exact), plus the
 * per-user tallies when the product has a limit. Orders reserved under an
 * older generation can no longer commit (DB_STALE), so a lost copy never
 * sells its units twice. Run by maintenance, at start, and by audit. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "service/app.h"
#include "service/log.h"
#include "service/products.h"
#include "service/repair/repair.h"

typedef struct users_acc {
    stock_user_units *v;
    size_t n, cap;
} users_acc;

static int add_user(const char *user, long long units, void *ud) {
    users_acc *u = ud;
    if (u->n == u->cap) {
        size_t cap = u->cap ? u->cap * 2 : 64;
        stock_user_units *v = realloc(u->v, cap * sizeof *v);
        if (!v) return 1;
        u->v = v;
        u->cap = cap;
    }
    u->v[u->n].user_id = strdup(user);
    u->v[u->n++].units = units;
    return 0;
}

/* Whether p's Redis copy is valid for the running Redis (its run_id) and
 * of the generation SQLite has now. A copy of an older generation is as
 * good as missing: every order reserved from it would be refused at its
 * commit (DB_STALE) for ever. That happens when a rebuild started a new
 * generation in SQLite but could not load Redis (Redis failed, or the
 * primary moved, between the two): the copy there still looks valid. */
static int copy_current(db *d, stock_conn *sc, svc_product *p) {
    long long total, copy_gen = 0;
    db_product now;
    return stock_read(sc, &p->sp, &total, NULL) == STOCK_RESERVED &&
           stock_read_gen(sc, &p->sp, &copy_gen) == STOCK_RESERVED &&
           db_product_get(d, p->sku, &now) == DB_OK && copy_gen >= now.stock_gen;
}

int svc_rebuild(svc_app *a, db *d, stock_conn *sc, svc_product *p, int force) {
    /* One rebuild at a time in this process, and none over a valid copy.
     * Orders sent before a rebuild finished come back MISSING and ask for
     * another, and a GET may find the copy missing while maintenance
     * rebuilds it: building a new generation over a copy that is valid for
     * this Redis process (its run_id), made by us or another instance,
     * would refuse every order reserved from it meanwhile (DB_STALE, 503).
     * Found by tests/soak.py: two or three rebuilds per SKU per restart. */
    static pthread_mutex_t rebuild_mu = PTHREAD_MUTEX_INITIALIZER;
    long long redis_gen = 0;
    db_product dp;
    users_acc users = { 0 };
    int rc = -1;
    pthread_mutex_lock(&rebuild_mu);
    if (!force && copy_current(d, sc, p)) {
        rc = 0;
        goto out;
    }
    if (stock_read_gen(sc, &p->sp, &redis_gen) != STOCK_RESERVED) {
        svc_log(SVC_LOG_WARN, "rebuild %s: %s", p->sku, stock_conn_errstr(sc));
        goto out;
    }
    if (db_product_new_gen(d, p->sku, redis_gen, &dp, p->per_user_limit > 0 ? add_user : NULL,
                           &users) != DB_OK) {
        svc_log(SVC_LOG_WARN, "rebuild %s: %s", p->sku, db_errstr(d));
        goto out;
    }
    long long available = dp.stock_initial - dp.sold - dp.held;
    if (available < 0) {
        /* Only possible if something outside the service sold units. */
        svc_log(SVC_LOG_ERROR, "rebuild %s: sold %lld exceeds stock_initial %lld; loading 0",
                p->sku, dp.sold, dp.stock_initial);
        available = 0;
    }
    int loaded = stock_load(sc, &p->sp, dp.stock_gen, available, users.v, users.n, 0);
    if (loaded < 0) {
        svc_log(SVC_LOG_WARN, "rebuild %s: %s", p->sku, stock_conn_errstr(sc));
        goto out;
    }
    atomic_fetch_add(&a->m.rebuilds, 1);
    svc_product_soldout_clear(p);
    svc_product_changed(p);
    if (loaded == 0)
        svc_log(SVC_LOG_INFO, "rebuilt the Redis stock of %s from SQLite: %lld available "
                "(stock_initial %lld - sold %lld - held %lld), generation %lld",
                p->sku, available, dp.stock_initial, dp.sold, dp.held, dp.stock_gen);
    rc = 0;
out:
    for (size_t i = 0; i < users.n; i++) free((char *)users.v[i].user_id);
    free(users.v);
    pthread_mutex_unlock(&rebuild_mu);
    return rc;
}
