/* fam_blocking.c: the blocking family: the read-check-write strategies
 * whose lock a thread waits for.
 *
 * redlock, zookeeper, etcd, db-lock, local, the unsafe baselines, the
 * `lock` orders no one segment can hold (rerouted by the lock family), and
 * a spread product's orders no one lane can hold (rerouted by the script
 * family, taken in steps by stock_reserve)
 * take their units with stock_reserve_one (stock/rcw.c): choose segments,
 * lock them as the strategy does, read, check, write, unlock. The lock may
 * keep the thread waiting, so each order runs on one of the pipeline's
 * blocking threads, one at a time, on that thread's own Redis connection;
 * then it goes to the committer like any Redis reservation. */
#include <stdio.h>

#include "common/clock.h"
#include "service/log.h"
#include "service/order/commit.h"
#include "service/order/fam_blocking.h"
#include "service/order/pipeline.h"
#include "service/order/reservation.h"

/* A lock server in trouble: one line a second at most, not one per order. */
static void log_lock_down(const svc_order *op, stock_conn *sc) {
    static _Atomic int64_t last_us;
    int64_t now = clock_mono_us(), then = atomic_load(&last_us);
    if (now - then < 1000000 || !atomic_compare_exchange_strong(&last_us, &then, now)) return;
    svc_log(SVC_LOG_WARN, "%s: lock server unavailable (orders answered 503): %s",
            stock_strategy_about(op->p->strategy)->name, stock_conn_errstr(sc));
}

/* Counts what the strategy's locks cost (flashsale_lock_*). */
static void count_locks(svc_app *a, const svc_order *op) {
    const stock_req *r = &op->sreq;
    if (r->lock_wait_us >= 0) {
        svc_histogram_observe(&a->m.lock_acquire, r->lock_wait_us);
        int o = r->result == STOCK_LOCK_TIMEOUT ? 1
              : (r->result == STOCK_UNAVAILABLE && !r->outcome_unknown) ||
                r->result == STOCK_LOCK_DOWN ? 2 : 0;
        atomic_fetch_add(&a->m.lock_outcomes[o], 1);
    }
    if (r->handoff_us >= 0)
        svc_histogram_observe(&a->m.lock_handoff[op->p->strategy], r->handoff_us);
}

/* On a blocking thread: one read-check-write reservation, which may wait
 * for a lock. */
static void reserve_one(svc_order *op) {
    svc_app *a = op->a;
    stock_conn *sc = svc_thread_stock(a);
    if (!sc) {                                 /* no connection could be made: nothing sent */
        op->sreq.result = STOCK_UNAVAILABLE;
        op->sreq.outcome_unknown = 0;
    } else if (op->p->sp.lanes) {
        /* A spread product's order no one lane held (the script family
         * rerouted it here): taken in steps over the lanes. */
        stock_req *r = &op->sreq;
        stock_reserve(sc, &r, 1);
    } else {
        stock_reserve_one(sc, &op->sreq);
        count_locks(a, op);
        if (op->sreq.result == STOCK_LOCK_DOWN) log_lock_down(op, sc);
    }
    if (svc_reservation_result(op)) svc_commit_send(op);
}

static void submit(svc_order *op) { svc_pipeline_run_blocking(op, reserve_one); }

svc_family svc_family_blocking = {
    .name = "blocking",
    .kinds = 1u << STOCK_KIND_RCW,
    .submit = submit,
    .committed = svc_reservation_committed,
};
