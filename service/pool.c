/* pool.c: threads for the strategies that may block.
 *
 * The read-check-write strategies other than `lock` (redlock, zookeeper,
 * etcd, db-lock, local, the unsafe baselines, and `lock` orders that no
 * one segment can hold) wait for a lock on the thread that runs them, and
 * db-optimistic reads SQLite: they run here, one order per thread at a
 * time, each thread with its own connections, and hand their orders on to
 * the committer. */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/clock.h"
#include "service/order.h"

/* Strategies that may block run here, one order per thread at a time. */
struct svc_pool {
    svc_app *a;
    pthread_t *threads;
    int nthreads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    svc_order *head, *tail;
    int stopping;
};

void svc_pool_push(svc_pool *s, svc_order *op) {
    op->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->tail) s->tail->next = op;
    else s->head = op;
    s->tail = op;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static svc_order *take(svc_pool *s) {
    pthread_mutex_lock(&s->mu);
    while (!s->head && !s->stopping) pthread_cond_wait(&s->cv, &s->mu);
    svc_order *op = s->head;
    if (op && !(s->head = op->next)) s->tail = NULL;
    pthread_mutex_unlock(&s->mu);
    return op;
}

/* A lock server in trouble: one line a second at most, not one per order. */
static void log_lock_down(const svc_order *op, stock_conn *sc) {
    static _Atomic int64_t last_us;
    int64_t now = clock_mono_us(), then = atomic_load(&last_us);
    if (now - then < 1000000 || !atomic_compare_exchange_strong(&last_us, &then, now)) return;
    svc_log(SVC_LOG_WARN, "%s: lock server unavailable (orders answered 503): %s",
            stock_strategy_about(op->p->strategy)->name, stock_conn_errstr(sc));
}

/* Runs one read-check-write reservation, which may wait for a lock. */
static void reserve_one(svc_app *a, stock_conn *sc, svc_order *op) {
    stock_reserve_one(sc, &op->sreq);
    const stock_req *r = &op->sreq;
    if (r->lock_wait_us >= 0) {
        svc_histogram_observe(&a->m.lock_acquire, r->lock_wait_us);
        int o = r->result == STOCK_LOCK_TIMEOUT ? 1
              : (r->result == STOCK_UNAVAILABLE && !r->outcome_unknown) ||
                r->result == STOCK_LOCK_DOWN ? 2 : 0;
        atomic_fetch_add(&a->m.lock_outcomes[o], 1);
    }
    if (r->handoff_us >= 0) svc_histogram_observe(&a->m.lock_handoff[op->p->strategy], r->handoff_us);
    if (r->result == STOCK_LOCK_DOWN) log_lock_down(op, sc);
    if (svc_order_reserved(op)) db_writer_submit(a->writer, &op->job);
}

static void *pool_main(void *arg) {
    svc_pool *s = arg;
    pthread_setname_np(pthread_self(), "fs-pool");
    svc_app *a = s->a;
    char err[256];
    stock_conn *sc = stock_conn_new(&a->stock_cfg, err, sizeof err);
    svc_order *op;
    assert(sc != NULL);   /* the configuration was checked at start */
    while ((op = take(s)) != NULL) {
        if (op->phase == PH_DB_READ) svc_db_optimistic_read(op);
        else reserve_one(a, sc, op);
    }
    stock_conn_free(sc);
    return NULL;
}

svc_pool *svc_pool_start(svc_app *a, int threads, char *err, size_t errlen) {
    svc_pool *s = calloc(1, sizeof *s);
    if (!s || !(s->threads = calloc((size_t)threads, sizeof *s->threads))) {
        free(s);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->a = a;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    for (s->nthreads = 0; s->nthreads < threads; s->nthreads++) {
        if (pthread_create(&s->threads[s->nthreads], NULL, pool_main, s) != 0) {
            snprintf(err, errlen, "cannot start the pool's threads");
            svc_pool_stop(s);
            return NULL;
        }
    }
    return s;
}

void svc_pool_stop(svc_pool *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < s->nthreads; i++) pthread_join(s->threads[i], NULL);
    assert(s->head == NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->threads);
    free(s);
}
