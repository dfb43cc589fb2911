/* maint.c: the maintenance thread, and the two repairs it runs.
 *
 * - Heartbeat: <prefix>instance:<id> with a short TTL, so other instances
 *   can tell a live owner of a pending record from a dead one.
 * - Rebuild: when a SKU's Redis copy is missing or was built for another
 *   Redis process, start a new generation in SQLite and load
 *   stock_initial - sold (see db.h on why that number is exact).
 * - Reconcile: every pending record whose owner is dead (or that is older
 *   than the pending timeout) is settled: if its order is in SQLite the
 *   record is cleared, otherwise the order is voided in SQLite first (so it
 *   can never commit afterwards) and then its units are given back.
 * - Undo retries: reservations whose undo failed (Redis down) are retried
 *   until Redis answers. */
#include <assert.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "service/service.h"

#define HEARTBEAT_TTL_MS 5000
#define SWEEP_EVERY_MS 2000

typedef struct orphan {
    product *p;
    char order_id[DB_ORDER_ID_LEN + 1];
    char idem_key[DB_KEY_MAX + 1];
    struct orphan *next;
} orphan;

struct maint {
    app *a;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stopping;
    product **rebuild;             /* queued rebuilds */
    size_t nrebuild, caprebuild;
    orphan *orphans;
    uint64_t errors_seen;          /* redis + db errors at the last sweep */
    int trims_left;                /* sweeps that still trim (see trim_after_errors) */
};

/* ------------------------------------------------------------------ rebuild */

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

int stock_rebuild(app *a, db *d, stock_conn *sc, product *p, int force) {
    /* One rebuild at a time in this process, and none over a valid copy.
     * Orders sent before a rebuild finished come back MISSING and ask for
     * another, and a GET may find the copy missing while maintenance
     * rebuilds it: building a new generation over a copy that is valid for
     * this Redis process (its run_id), made by us or another instance,
     * would refuse every order reserved from it meanwhile (DB_STALE, 503).
     * Found by tests/soak.py: two or three rebuilds per SKU per restart. */
    static pthread_mutex_t rebuild_mu = PTHREAD_MUTEX_INITIALIZER;
    long long redis_gen = 0, total;
    db_product dp;
    users_acc users = { 0 };
    int rc = -1;
    pthread_mutex_lock(&rebuild_mu);
    if (!force && stock_read(sc, &p->sp, &total, NULL) == STOCK_RESERVED) {
        rc = 0;
        goto out;
    }
    if (stock_read_gen(sc, &p->sp, &redis_gen) != STOCK_RESERVED) {
        log_msg(LOG_WARN, "rebuild %s: %s", p->sku, stock_conn_errstr(sc));
        goto out;
    }
    if (db_product_new_gen(d, p->sku, redis_gen, &dp) != DB_OK) {
        log_msg(LOG_WARN, "rebuild %s: %s", p->sku, db_errstr(d));
        goto out;
    }
    if (p->per_user_limit > 0 && db_user_units(d, p->sku, add_user, &users) != DB_OK) {
        log_msg(LOG_WARN, "rebuild %s: %s", p->sku, db_errstr(d));
        goto out;
    }
    long long available = dp.stock_initial - dp.sold;
    if (available < 0) {
        /* Only possible if something outside the service sold units. */
        log_msg(LOG_ERROR, "rebuild %s: sold %lld exceeds stock_initial %lld; loading 0", p->sku,
                dp.sold, dp.stock_initial);
        available = 0;
    }
    int loaded = stock_load(sc, &p->sp, dp.stock_gen, available, users.v, users.n, 0);
    if (loaded < 0) {
        log_msg(LOG_WARN, "rebuild %s: %s", p->sku, stock_conn_errstr(sc));
        goto out;
    }
    atomic_fetch_add(&a->m.rebuilds, 1);
    if (loaded == 0)
        log_msg(LOG_INFO, "rebuilt the Redis stock of %s from SQLite: %lld available "
                "(stock_initial %lld - sold %lld), generation %lld",
                p->sku, available, dp.stock_initial, dp.sold, dp.stock_gen);
    rc = 0;
out:
    for (size_t i = 0; i < users.n; i++) free((char *)users.v[i].user_id);
    free(users.v);
    pthread_mutex_unlock(&rebuild_mu);
    return rc;
}

/* ---------------------------------------------------------------- reconcile */

typedef struct pend {
    char order_id[DB_ORDER_ID_LEN + 1];
    char instance[112];
    char idem_key[DB_KEY_MAX + 1];
    long long age_ms;
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
}

/* Whether a pending record may be settled now. */
static int settleable(app *a, stock_conn *sc, const pend *r, int only_dead) {
    if (!only_dead || r->age_ms >= a->cfg.pending_timeout_ms) return 1;
    if (!strcmp(r->instance, a->instance_id)) return 0;    /* ours, in flight */
    size_t nl = strlen(a->instance_name);
    if (!strncmp(r->instance, a->instance_name, nl) && r->instance[nl] == '#')
        return 1;                                           /* our previous run */
    return stock_instance_alive(sc, r->instance) == 0;      /* its owner is gone */
}

/* Settles one record: returns 1 if settled. */
static int settle(app *a, db *d, stock_conn *sc, product *p, const pend *r) {
    stock_ref ref = { &p->sp, r->order_id, r->idem_key };
    int done = 0;
    db_status st = db_order_void(d, r->order_id, p->sku, "reservation not committed in time");
    if (st == DB_EXISTS) {
        if (stock_confirm(sc, &ref, 1) != 0) return 0;
        atomic_fetch_add(&a->m.settled_commit, 1);
        return 1;
    }
    if (st != DB_OK) return 0;
    /* Voided: it can never commit now, so its units go back. */
    if (stock_undo(sc, &ref, 1, &done) != 0 || !done) return 0;
    atomic_fetch_add(&a->m.settled_undo, 1);
    log_msg(LOG_INFO, "gave back %s's reservation %s (owner %s, %lld ms old, never committed)",
            p->sku, r->order_id, r->instance, r->age_ms);
    return 1;
}

int reconcile_product(app *a, db *d, stock_conn *sc, product *p, int only_dead) {
    pend_acc acc = { 0 };
    int settled = 0;
    if (!stock_strategy_about(p->strategy)->uses_redis) return 0;
    if (stock_pending_scan(sc, &p->sp, collect_pending, &acc) != 0) {
        free(acc.v);
        return -1;
    }
    for (size_t k = 0; k < acc.n; k++)
        if (settleable(a, sc, &acc.v[k], only_dead)) settled += settle(a, d, sc, p, &acc.v[k]);
    free(acc.v);
    return settled;
}

int reconcile(app *a, db *d, stock_conn *sc, int only_dead) {
    db_product *all;
    size_t n;
    int settled = 0;
    if (db_product_list(d, &all, &n) != DB_OK) {
        log_msg(LOG_WARN, "reconcile: %s", db_errstr(d));
        return -1;
    }
    for (size_t i = 0; i < n && settled >= 0; i++) {
        product *p = product_cache_put(a->products, &all[i]);
        if (!p) continue;
        int k = reconcile_product(a, d, sc, p, only_dead);
        settled = k < 0 ? -1 : settled + k;
    }
    free(all);
    return settled;
}

/* ------------------------------------------------------------------- thread */

void maint_request_forced_rebuild(maint *m, product *p) {
    atomic_store(&p->rebuild_forced, 1);   /* before queueing: seen by its run */
    maint_request_rebuild(m, p);
}

void maint_request_rebuild(maint *m, product *p) {
    if (atomic_exchange(&p->rebuilding, 1)) return;   /* already queued */
    pthread_mutex_lock(&m->mu);
    if (m->nrebuild == m->caprebuild) {
        size_t cap = m->caprebuild ? m->caprebuild * 2 : 16;
        product **v = realloc(m->rebuild, cap * sizeof *v);
        if (!v) {
            pthread_mutex_unlock(&m->mu);
            atomic_store(&p->rebuilding, 0);
            return;
        }
        m->rebuild = v;
        m->caprebuild = cap;
    }
    m->rebuild[m->nrebuild++] = p;
    pthread_cond_signal(&m->cv);
    pthread_mutex_unlock(&m->mu);
}

void maint_retry_undo(maint *m, product *p, const char *order_id, const char *idem_key) {
    orphan *o = calloc(1, sizeof *o);
    if (!o) return;   /* the sweeper settles it after the pending timeout */
    o->p = p;
    snprintf(o->order_id, sizeof o->order_id, "%s", order_id);
    snprintf(o->idem_key, sizeof o->idem_key, "%s", idem_key ? idem_key : "");
    pthread_mutex_lock(&m->mu);
    o->next = m->orphans;
    m->orphans = o;
    pthread_mutex_unlock(&m->mu);
}

static void run_rebuilds(maint *m, db *d, stock_conn *sc) {
    pthread_mutex_lock(&m->mu);
    size_t n = m->nrebuild;
    product **todo = malloc((n ? n : 1) * sizeof *todo);
    if (todo) {
        if (n) memcpy(todo, m->rebuild, n * sizeof *todo);
        m->nrebuild = 0;
    } else {
        n = 0;
    }
    pthread_mutex_unlock(&m->mu);
    for (size_t i = 0; i < n; i++) {
        atomic_store(&todo[i]->rebuilding, 0);
        int force = atomic_exchange(&todo[i]->rebuild_forced, 0);
        if (stock_rebuild(m->a, d, sc, todo[i], force) != 0) {
            if (force) maint_request_forced_rebuild(m, todo[i]);
            else maint_request_rebuild(m, todo[i]);
        }
    }
    free(todo);
}

static void run_orphans(maint *m, stock_conn *sc) {
    pthread_mutex_lock(&m->mu);
    orphan *list = m->orphans;
    m->orphans = NULL;
    pthread_mutex_unlock(&m->mu);
    while (list) {
        orphan *o = list;
        list = o->next;
        stock_ref ref = { &o->p->sp, o->order_id, o->idem_key };
        int done = 0;
        int rc = stock_undo(sc, &ref, 1, &done);
        if (rc == 0 && done) {
            free(o);
            continue;
        }
        /* Still failing: keep it for later. When Redis itself failed, keep
         * the rest too, untried: one timeout per orphan would hold up the
         * heartbeat behind a stalled Redis. */
        pthread_mutex_lock(&m->mu);
        o->next = m->orphans;
        m->orphans = o;
        if (rc != 0) {
            orphan *last = list;
            while (last && last->next) last = last->next;
            if (last) {
                last->next = m->orphans;
                m->orphans = list;
            }
            list = NULL;
        }
        pthread_mutex_unlock(&m->mu);
    }
}

/* An outage of Redis or the database makes every thread answer a burst of
 * 503s, and glibc keeps the memory they freed: RSS stepped up ~10 MB at the
 * soak's first Redis outage and 1-2 MB at each next one, with valgrind
 * finding every byte freed. Trimming at the sweeps during an outage and
 * just after it returns that memory (soak, 6 restarts in 200 s: 41 MB at
 * the end without, 34 MB with a trim at every sweep); in steady state, with
 * no errors, nothing is trimmed, so the hot path never meets it. */
static void trim_after_errors(maint *m) {
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

static void *maint_main(void *arg) {
    maint *m = arg;
    pthread_setname_np(pthread_self(), "fs-maint");
    app *a = m->a;
    char err[256];
    db *d = db_open(a->cfg.db_path, &a->db_opt, err, sizeof err);
    stock_conn *sc = stock_conn_new(&a->stock_cfg, err, sizeof err);
    int64_t next_beat = 0, next_sweep = clock_mono_ms() + SWEEP_EVERY_MS;
    assert(sc != NULL);
    if (!d) log_msg(LOG_ERROR, "maintenance: %s", err);
    pthread_mutex_lock(&m->mu);
    while (!m->stopping) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 200 * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        if (m->nrebuild == 0) pthread_cond_timedwait(&m->cv, &m->mu, &until);
        pthread_mutex_unlock(&m->mu);
        int64_t now = clock_mono_ms();
        if (now >= next_beat) {
            stock_heartbeat(sc, HEARTBEAT_TTL_MS);
            next_beat = now + 1000;
        }
        if (d) {
            run_rebuilds(m, d, sc);
            if (now >= next_sweep) {
                reconcile(a, d, sc, 1);
                next_sweep = now + SWEEP_EVERY_MS;
                trim_after_errors(m);
            }
        }
        run_orphans(m, sc);
        pthread_mutex_lock(&m->mu);
    }
    pthread_mutex_unlock(&m->mu);
    run_orphans(m, sc);   /* a last try for undos that failed during shutdown */
    stock_conn_free(sc);
    db_close(d);
    return NULL;
}

maint *maint_start(app *a, char *err, size_t errlen) {
    maint *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    m->a = a;
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cv, NULL);
    if (pthread_create(&m->thread, NULL, maint_main, m) != 0) {
        snprintf(err, errlen, "cannot start the maintenance thread");
        free(m);
        return NULL;
    }
    return m;
}

void maint_stop(maint *m) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->stopping = 1;
    pthread_cond_signal(&m->cv);
    pthread_mutex_unlock(&m->mu);
    pthread_join(m->thread, NULL);
    while (m->orphans) {
        orphan *o = m->orphans;
        m->orphans = o->next;
        log_msg(LOG_WARN, "reservation %s of %s left for reconciliation (Redis unreachable)",
                o->order_id, o->p->sku);
        free(o);
    }
    free(m->rebuild);
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cv);
    free(m);
}
