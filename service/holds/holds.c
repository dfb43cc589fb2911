/* holds.c: ending holds and giving their units back. See holds.h.
 *
 * Two ways in. svc_hold_decide, on an API worker, for a confirm or a
 * cancel, decided in the committer's group commit (db_writer_decide); and
 * the expiry thread, which every tick ends the holds whose
 * deadline has passed (up to EXPIRE_BATCH per transaction, batch after
 * batch while the tick's time lasts) and, every second, finishes the
 * returns that a decider left owed (it died between its decision and the
 * return, or Redis failed). Both give units back the same way: SQLite has
 * decided and recorded the debt; stock_return gives the units to the copy
 * of the debt's generation, exactly once whoever repeats it; then the
 * debt is cleared.
 *
 * And every FORGET_EVERY_MS the same thread forgets the markers that make
 * those returns exactly-once, so that they do not fill Redis in a long
 * sale (stock_returned_forget): for each of this instance's hold products
 * whose stock is a Redis copy, those of orders decided before
 *   W = min(now - --returned-keep-ms, the oldest debt of the SKU still owed).
 * Why both bounds: a marker may go only once its debt is cleared (a return
 * still owed must find its marker, or the watermark's answer would leave
 * it owed for ever), hence the oldest debt; and a decision read its clock
 * before it committed, so one not yet committed when the oldest debt was
 * read may be stamped before it: keep_ms covers that time (seconds at
 * most) and the clock skew between instances. A return stamped before W
 * anyway is refused (`forgotten`): it stays owed and is logged, never
 * given twice. */
#include "service/holds/holds.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "service/app.h"
#include "service/log.h"
#include "service/products.h"
#include "service/repair/repair.h"

#define TICK_MS 100               /* how late past its deadline a hold may end */
#define TICK_BUDGET_MS 400        /* one tick's expiry work, before looking at stop */
#define EXPIRE_BATCH 256          /* holds ended per transaction: the write lock is held
                                     this long, and the order path's commits wait */
#define OWING_EVERY_MS 1000
#define OWING_GRACE_MS 2000       /* a decider's own return gets this long first */
#define FORGET_EVERY_MS 5000      /* return markers are forgotten this often */
#define FORGOTTEN_LOG_MS 60000    /* a forgotten debt is retried every owing scan, and said
                                     at most this often (with the count since) */

struct svc_holds {
    svc_app *a;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    _Atomic int64_t forgotten_said_ms;          /* say_forgotten: when last said, */
    atomic_uint_fast64_t forgotten_said_at;     /* ...and the count then */
};

/* A debt of units, on its way back. */
typedef struct owed {
    svc_product *p;
    char order_id[DB_ORDER_ID_LEN + 1];
    char *user_id, *takes;        /* owned */
    int quantity;
    long long reserve_gen, return_gen;
    long long decided_ms;         /* as SQLite recorded it: names the marker's bucket */
    int cause;                    /* SVC_RETURN_CANCEL / _EXPIRY */
} owed;

static int stock_in_db(const svc_product *p) {
    return !stock_strategy_about(p->strategy)->uses_redis;
}

static void owed_free(owed *o, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(o[i].user_id);
        free(o[i].takes);
    }
}

/* The forgetting mark of p's copy, for a log line (-1: not read). */
static long long forget_mark(stock_conn *sc, const svc_product *p) {
    long long w = -1;
    return stock_returned_mark(sc, &p->sp, &w) == 0 ? w : -1;
}

/* Whether a refused (forgotten) return is to be said now: at most once per
 * FORGOTTEN_LOG_MS for the service h runs for (without h, a decision made
 * with no holds thread started: every time), since such a debt stays owed
 * and its retry, every owing scan, would otherwise say it every second for
 * as long as nobody looks. *since gets the refusals not said before. */
static int say_forgotten(svc_app *a, svc_holds *h, uint64_t *since) {
    uint64_t total = atomic_load(&a->m.hold_forgotten);
    if (!h) {                                 /* not started (a tool's own run): always */
        *since = 1;
        return 1;
    }
    int64_t now = clock_mono_ms(), last = atomic_load(&h->forgotten_said_ms);
    if (now - last < FORGOTTEN_LOG_MS ||
        !atomic_compare_exchange_strong(&h->forgotten_said_ms, &last, now))
        return 0;
    *since = total - atomic_exchange(&h->forgotten_said_at, total);
    return 1;
}

/* Gives back the units of o[0..n) and clears each debt settled. What fails
 * stays owed: the next owing scan retries it. Returns how many were
 * settled. */
static size_t give_back(svc_app *a, svc_holds *h, stock_conn *sc, owed *o, size_t n) {
    if (n == 0) return 0;
    stock_return_req *req = calloc(n, sizeof *req);
    if (!req || !sc) {
        free(req);
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        req[i] = (stock_return_req){ .product = &o[i].p->sp, .order_id = o[i].order_id,
                                     .user_id = o[i].user_id, .takes = o[i].takes,
                                     .quantity = o[i].quantity, .reserve_gen = o[i].reserve_gen,
                                     .return_gen = o[i].return_gen,
                                     .decided_ms = o[i].decided_ms };
    }
    if (stock_return(sc, req, n) != 0)
        svc_log(SVC_LOG_WARN, "holds: giving units back: %s (retried)", stock_conn_errstr(sc));
    db_debt *debts = calloc(n, sizeof *debts);
    size_t nd = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t since = 0;
        if (req[i].forgotten) {
            /* Not settled: the debt stays (never dropped silently, never
             * given twice), counted, and said (say_forgotten). */
            atomic_fetch_add(&a->m.hold_forgotten, 1);
            if (say_forgotten(a, h, &since))
                svc_log(SVC_LOG_ERROR, "holds: %s (order %s): a hold decided at %lld ms, before "
                        "the forgetting mark %lld: this instance's clock is behind the others' "
                        "by more than --returned-keep-ms? (left owed; %llu such refusals since "
                        "this was last said, flashsale_hold_returns_forgotten_total)",
                        o[i].p->sku, o[i].order_id, o[i].decided_ms, forget_mark(sc, o[i].p),
                        (unsigned long long)since);
        }
        if (req[i].given) {
            atomic_fetch_add(&a->m.hold_returned[o[i].cause], (uint64_t)o[i].quantity);
            svc_product_changed(o[i].p);
            svc_product_soldout_clear(o[i].p);
        }
        if (req[i].result == STOCK_MISSING) svc_repair_request_rebuild(a->repair, o[i].p);
        if (req[i].result == STOCK_RESERVED && debts)
            debts[nd++] = (db_debt){ o[i].order_id, o[i].return_gen };
    }
    /* Settled debts are cleared in one group; what is not stays owed, and
     * the next owing scan settles it (a repeat adds nothing). */
    if (nd && db_writer_returned(a->writer, debts, nd) != DB_OK) {
        svc_log(SVC_LOG_WARN, "holds: clearing returned debts failed (retried)");
        nd = 0;
    }
    free(debts);
    free(req);
    return nd;
}

/* Counts an ended hold in the metrics. */
static void count_end(svc_app *a, svc_product *p, const db_decision *dc) {
    svc_product_changed(p);
    int k = dc->order.status == DB_ORDER_CONFIRMED ? 0
          : dc->order.status == DB_ORDER_CANCELLED ? 1 : 2;
    atomic_fetch_add(&a->m.holds_ended[k], 1);
    if (k == 2 && dc->order.expires_ms > 0)
        svc_histogram_observe(&a->m.expiry_lag, (dc->now_ms - dc->order.expires_ms) * 1000);
}

/* Fills o from a decision that left units owed. Returns 0, or -1 when out
 * of memory (the debt stays for the owing scan). */
static int owed_of(owed *o, svc_product *p, const db_decision *dc) {
    memset(o, 0, sizeof *o);
    o->p = p;
    memcpy(o->order_id, dc->order.order_id, sizeof o->order_id);
    o->user_id = strdup(dc->order.user_id);
    o->takes = strdup(dc->takes);
    o->quantity = dc->order.quantity;
    o->reserve_gen = dc->reserve_gen;
    o->return_gen = dc->return_gen;
    o->decided_ms = dc->now_ms;                 /* what the decision stored as decided_ms */
    o->cause = dc->order.status == DB_ORDER_CANCELLED ? SVC_RETURN_CANCEL : SVC_RETURN_EXPIRY;
    if (o->user_id && o->takes) return 0;
    owed_free(o, 1);
    return -1;
}

db_status svc_hold_decide(svc_app *a, db_decision *dc) {
    int busy = 0;
    db *d = svc_db_take(a, &busy);
    db_order o;
    svc_product *p = NULL;
    if (!d) return busy ? DB_NOCONN : DB_ERROR;
    /* The product says where the stock is: in SQLite, or a Redis copy.
     * The connection goes back before the wait for the committer. */
    db_status st = db_order_get(d, dc->order_id, &o);
    if (st == DB_OK) st = svc_product_find(a, d, o.sku, &p);
    svc_db_give(a, d);
    if (st != DB_OK) return st;
    dc->stock_in_db = stock_in_db(p);
    /* In the committer's next group, with the orders around it: one fsync
     * for many confirms and cancels. The clock is read as late as it can
     * be, just before the group is queued. */
    dc->now_ms = clock_wall_ms();
    if ((st = db_writer_decide(a->writer, dc)) != DB_OK || !dc->changed) return st;
    count_end(a, p, dc);
    owed one;
    if (dc->return_gen > 0 && owed_of(&one, p, dc) == 0) {
        give_back(a, a->holds, svc_thread_stock(a), &one, 1);
        owed_free(&one, 1);
    }
    /* Units back in a store: this instance forgets "sold out" at once. */
    if (dc->order.status != DB_ORDER_CONFIRMED) svc_product_soldout_clear(p);
    return DB_OK;
}

/* ------------------------------------------------------------- expiry */

/* Ends one batch of due holds, in the committer's next group, and gives
 * their units back. Returns how many ended (EXPIRE_BATCH: maybe more), or
 * -1. */
static int expire_batch(svc_holds *h, db *d, stock_conn *sc, db_expired *ex, owed *back) {
    svc_app *a = h->a;
    size_t n = 0, nback = 0;
    int64_t now = clock_wall_ms();
    /* Nothing due (the usual tick): no write transaction, no write lock
     * taken from the other instances on the file. */
    int due = db_hold_any_due(d, now);
    if (due <= 0) return due;
    if (db_writer_expire(a->writer, now, EXPIRE_BATCH, ex, &n) != DB_OK) return -1;
    for (size_t i = 0; i < n; i++) {
        atomic_fetch_add(&a->m.holds_ended[2], 1);
        svc_histogram_observe(&a->m.expiry_lag, (now - ex[i].expires_ms) * 1000);
        svc_product *p = NULL;
        if (svc_product_find(a, d, ex[i].sku, &p) != DB_OK) continue;  /* owed: retried */
        svc_product_changed(p);
        if (ex[i].return_gen <= 0) {                   /* the db strategies: back already */
            svc_product_soldout_clear(p);
            continue;
        }
        owed *o = &back[nback];
        memset(o, 0, sizeof *o);
        db_order ord;
        /* The buyer, for its count in Redis: only a product with a limit. */
        o->p = p;
        memcpy(o->order_id, ex[i].order_id, sizeof o->order_id);
        o->user_id = strdup(p->per_user_limit > 0 && db_order_get(d, ex[i].order_id, &ord) == DB_OK
                                ? ord.user_id : "");
        o->takes = ex[i].takes;
        ex[i].takes = NULL;                             /* now back's */
        o->quantity = ex[i].quantity;
        o->reserve_gen = ex[i].reserve_gen;
        o->return_gen = ex[i].return_gen;
        o->decided_ms = now;                    /* the sweep stores its now_ms as decided_ms */
        o->cause = SVC_RETURN_EXPIRY;
        if (o->user_id) nback++;
        else owed_free(o, 1);
    }
    db_expired_free(ex, n);
    give_back(a, h, sc, back, nback);
    owed_free(back, nback);
    return (int)n;
}

typedef struct owing_list {
    svc_app *a;
    db *d;
    owed *v;
    size_t n;
} owing_list;

static void add_owing(const db_owed *w, void *ud) {
    owing_list *l = ud;
    svc_product *p = svc_product_cache_get(l->a->products, w->sku);
    if (!p || l->n == EXPIRE_BATCH) return;   /* not cached yet: the next scan */
    owed *o = &l->v[l->n];
    memset(o, 0, sizeof *o);
    o->p = p;
    snprintf(o->order_id, sizeof o->order_id, "%s", w->order_id);
    o->user_id = strdup(w->user_id);
    o->takes = strdup(w->takes ? w->takes : "");
    o->quantity = w->quantity;
    o->reserve_gen = w->reserve_gen;
    o->return_gen = w->return_gen;
    o->decided_ms = w->decided_ms;
    o->cause = w->status == DB_ORDER_CANCELLED ? SVC_RETURN_CANCEL : SVC_RETURN_EXPIRY;
    if (o->user_id && o->takes) l->n++;
    else owed_free(o, 1);
}

/* Finishes the returns that deciders left owed. */
/* One owing scan: up to EXPIRE_BATCH debts, oldest first. Returns how many
 * were settled, or -1 when the batch was not full (nothing more to find). */
static long settle_owing_batch(svc_holds *h, db *d, stock_conn *sc, owed *buf) {
    svc_app *a = h->a;
    owing_list l = { a, d, buf, 0 };
    if (db_hold_owing(d, clock_wall_ms() - OWING_GRACE_MS, EXPIRE_BATCH, add_owing, &l) != DB_OK)
        svc_log(SVC_LOG_WARN, "holds: scanning owed units: %s", db_errstr(d));
    size_t settled = l.n ? give_back(a, h, sc, l.v, l.n) : 0;
    int full = l.n == EXPIRE_BATCH;
    owed_free(l.v, l.n);
    return full ? (long)settled : -1;
}

/* Settles the debts left owing: batch after batch while full batches
 * settle (after an outage -- a failover, a restart -- thousands may be
 * owed at once, and a batch a second would leave them owed for many
 * seconds), within the tick's budget. A batch that settles nothing (Redis
 * still away) ends it: the next scan tries again. */
static void settle_owing(svc_holds *h, db *d, stock_conn *sc, owed *buf) {
    int64_t start = clock_mono_ms();
    while (settle_owing_batch(h, d, sc, buf) > 0 && clock_mono_ms() - start < TICK_BUDGET_MS) {}
}

/* ------------------------------------------------------------ forgetting */

typedef struct product_list {
    svc_product **v;
    size_t n, cap;
    int nomem;
} product_list;

/* Collects the products whose holds' returns go to a Redis copy (the
 * products never go away: the pointers stay valid outside the cache's
 * lock, which the Redis and SQLite calls must not be made under). */
static void add_hold_product(svc_product *p, void *ud) {
    product_list *l = ud;
    if (p->hold_seconds <= 0 || stock_in_db(p)) return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        svc_product **v = realloc(l->v, cap * sizeof *v);
        if (!v) {
            l->nomem = 1;
            return;
        }
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = p;
}

/* Forgets the return markers of this instance's hold products that no
 * return can need any more. A failure leaves them to the next round. */
static void forget_returned(svc_app *a, db *d, stock_conn *sc) {
    product_list l = { 0 };
    if (!sc) return;
    svc_product_cache_each(a->products, add_hold_product, &l);
    for (size_t i = 0; i < l.n; i++) {
        svc_product *p = l.v[i];
        /* The clock first, the debts after: a decision stamped before the
         * clock read here and committed after the debts' read is the one
         * keep_ms must cover. */
        long long now = clock_wall_ms(), forgot = 0;
        int64_t oldest = -1;
        if (db_hold_oldest_owed(d, p->sku, &oldest) != DB_OK) {
            svc_log(SVC_LOG_WARN, "holds: reading %s's oldest debt: %s", p->sku, db_errstr(d));
            continue;
        }
        long long w = stock_returned_watermark(now, a->cfg.returned_keep_ms, oldest);
        if (stock_returned_forget(sc, &p->sp, w, &forgot) != 0)
            svc_log(SVC_LOG_WARN, "holds: forgetting %s's return markers: %s (retried)", p->sku,
                    stock_conn_errstr(sc));
    }
    if (l.nomem) svc_log(SVC_LOG_WARN, "holds: out of memory listing products to forget");
    free(l.v);
}

static void *holds_main(void *arg) {
    svc_holds *h = arg;
    svc_app *a = h->a;
    pthread_setname_np(pthread_self(), "fs-holds");
    stock_conn *sc = svc_thread_stock(a);
    db_expired *ex = calloc(EXPIRE_BATCH, sizeof *ex);
    owed *back = calloc(EXPIRE_BATCH, sizeof *back);
    int64_t next_owing = clock_mono_ms() + OWING_EVERY_MS;
    int64_t next_forget = clock_mono_ms() + FORGET_EVERY_MS;
    if (!ex || !back) svc_log(SVC_LOG_ERROR, "holds: out of memory: no expiry");
    pthread_mutex_lock(&h->mu);
    while (!h->stop) {
        pthread_mutex_unlock(&h->mu);
        int64_t start = clock_mono_ms();
        /* A connection for the tick, given back after it: between ticks
         * the thread holds none. */
        db *d = ex && back ? svc_db_take(a, NULL) : NULL;
        if (d) {
            while (expire_batch(h, d, sc, ex, back) == EXPIRE_BATCH &&
                   clock_mono_ms() - start < TICK_BUDGET_MS) {}
            if (clock_mono_ms() >= next_owing) {
                settle_owing(h, d, sc, back);
                long long held = 0;
                if (db_hold_units(d, &held) == DB_OK) atomic_store(&a->m.units_held, held);
                next_owing = clock_mono_ms() + OWING_EVERY_MS;
            }
            if (clock_mono_ms() >= next_forget) {
                forget_returned(a, d, sc);
                next_forget = clock_mono_ms() + FORGET_EVERY_MS;
            }
        }
        svc_db_give(a, d);
        pthread_mutex_lock(&h->mu);
        if (!h->stop) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += TICK_MS * 1000000L;
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&h->cv, &h->mu, &until);
        }
    }
    pthread_mutex_unlock(&h->mu);
    free(ex);
    free(back);
    return NULL;
}

svc_holds *svc_holds_start(svc_app *a, char *err, size_t errlen) {
    svc_holds *h = calloc(1, sizeof *h);
    if (!h) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    h->a = a;
    atomic_store(&h->forgotten_said_ms, INT64_MIN / 2);    /* the first is said at once */
    atomic_store(&h->forgotten_said_at, 0);
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    if (pthread_create(&h->thread, NULL, holds_main, h) != 0) {
        snprintf(err, errlen, "cannot start the holds thread");
        pthread_mutex_destroy(&h->mu);
        pthread_cond_destroy(&h->cv);
        free(h);
        return NULL;
    }
    return h;
}

void svc_holds_stop(svc_holds *h) {
    if (!h) return;
    pthread_mutex_lock(&h->mu);
    h->stop = 1;
    pthread_cond_signal(&h->cv);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->thread, NULL);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    free(h);
}
