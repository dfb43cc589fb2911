/* commit.c: an order's trip to the committer and back.
 *
 * An order whose units are taken (or that a db family commits with its
 * units) becomes an insert job; a replay becomes a lookup job. The
 * committer commits every queued job as one group, then svc_commit_done
 * stages each order for its home loop and wakes each loop once. On the
 * loop, a lookup is answered here (the replay, or why not); a commit goes
 * to its family, which knows what its units were and so what a failure
 * must give back. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "service/log.h"
#include "service/ops/health.h"
#include "service/order/commit.h"
#include "service/order/family.h"

void svc_commit_prepare_lookup(svc_order *op, const char *order_id) {
    memset(&op->job, 0, sizeof op->job);
    op->job.kind = DB_JOB_LOOKUP;
    snprintf(op->job.order.order_id, sizeof op->job.order.order_id, "%s", order_id);
    snprintf(op->job.order.idem_key, sizeof op->job.order.idem_key, "%s", op->idem_key);
    svc_order_to(op, SVC_ORDER_LOOKING_UP);
}

/* Field by field, the strings by their length: this runs for every order. */
void svc_commit_prepare_insert(svc_order *op, db_take take, long long expect_version) {
    db_job *j = &op->job;
    db_order *o = &j->order;
    j->kind = DB_JOB_INSERT;
    j->take = take;
    /* A spread product's limit spans lanes no one script sees: SQLite's. */
    j->per_user_limit = take == DB_TAKE_NONE && !op->p->sp.lanes ? 0 : op->p->per_user_limit;
    j->expect_version = expect_version;
    j->status = DB_OK;
    j->available = 0;
    j->next = NULL;
    memcpy(o->order_id, op->order_id, sizeof o->order_id);
    memcpy(o->sku, op->p->sku, strlen(op->p->sku) + 1);
    memcpy(o->user_id, op->user_id, strlen(op->user_id) + 1);
    o->quantity = op->quantity;
    memcpy(o->idem_key, op->idem_key, strlen(op->idem_key) + 1);
    memcpy(o->created_at, op->created_at, sizeof o->created_at);
    o->gen = op->sreq.gen;
    o->expires_ms = op->expires_ms;
    o->status = op->expires_ms ? DB_ORDER_RESERVED : DB_ORDER_CONFIRMED;
    o->decided_ms = 0;
    o->payment_ref[0] = '\0';
    o->takes = op->sreq.takes;
    svc_order_to(op, SVC_ORDER_COMMITTING);
}

void svc_commit_send(svc_order *op) {
    assert(op->state == SVC_ORDER_COMMITTING || op->state == SVC_ORDER_LOOKING_UP);
    db_writer_submit(op->a->writer, &op->job);
}

void svc_commit_send_many(svc_app *a, svc_order **ops, size_t n) {
    db_job *jobs[STOCK_BATCH_MAX];
    assert(n <= STOCK_BATCH_MAX);
    if (n == 0) return;                   /* a batch refused whole: no commit to queue */
    for (size_t i = 0; i < n; i++) {
        assert(ops[i]->state == SVC_ORDER_COMMITTING || ops[i]->state == SVC_ORDER_LOOKING_UP);
        jobs[i] = &ops[i]->job;
    }
    db_writer_submit_many(a->writer, jobs, n);
}

/* ------------------------------------------------------------ on the loop */

static int same_request(const svc_order *op, const db_order *o) {
    return !strcmp(o->sku, op->p->sku) && !strcmp(o->user_id, op->user_id) &&
           o->quantity == op->quantity;
}

/* A replay's lookup is done: answer the order it names, or why not. */
static void looked_up(svc_order *op) {
    const db_job *j = &op->job;
    if (j->status == DB_OK && same_request(op, &j->order)) {
        svc_order_answer(op, &j->order, 1);
    } else if (j->status == DB_OK) {
        svc_order_refuse(op, RF_KEY_REUSED, 0);
    } else if (j->status == DB_NOTFOUND) {
        svc_order_refuse(op, RF_IN_PROGRESS, 0);
    } else {
        svc_health_poke_db(op->a->health);
        svc_order_refuse(op, RF_DB_DOWN, 0);
    }
}

/* An order back from the committer, on its home loop. */
static void back_home(svc_order *op) {
    assert(svc_order_loop_owned(op->home));
    if (op->state == SVC_ORDER_LOOKING_UP) {
        looked_up(op);
        return;
    }
    assert(op->state == SVC_ORDER_COMMITTING);
    op->fam->committed(op);
}

/* ------------------------------------------------------- on the committer */

void svc_commit_done(db_job **jobs, size_t n, svc_order_loop **touched) {
    int failed = 0;
    for (size_t i = 0; i < n; i++) {
        svc_order *op = (svc_order *)((char *)jobs[i] - offsetof(svc_order, job));
        failed |= jobs[i]->kind == DB_JOB_INSERT &&
                  (jobs[i]->status == DB_ERROR || jobs[i]->status == DB_BUSY);
        op->arrive = back_home;
        svc_order_loop_give(touched, op->home, op);
    }
    svc_order_loop_give_done(touched);
    static _Atomic int64_t last_log_us;
    if (failed && clock_mono_us() - atomic_load(&last_log_us) > 1000000) {
        atomic_store(&last_log_us, clock_mono_us());
        svc_log(SVC_LOG_ERROR,
                "database: group commit failed (orders answered 503, stock given back)");
    }
}
