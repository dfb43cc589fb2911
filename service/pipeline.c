/* pipeline.c: the order path, from a validated request to its answer.
 *
 * An svc_order carries one request. Where it goes depends on its product's
 * strategy (strategies.c is the one table that says):
 *
 *   script    (`lua`) on the event loop that received the request: the
 *             loop's orders of one iteration are reserved per SKU in one
 *             script call on the loop's own Redis connection (orderloop.c);
 *             the reserved ones go to the committer in one hand-off
 *   lock      on the loop that owns the segment's lock (lockloop.c)
 *   rcw       (redlock, zookeeper, etcd, db-lock, local, unsafe-*) on a
 *             pool thread (pool.c), one order at a time, since its
 *             strategy may wait for a lock
 *   db        straight to the committer, which takes the stock in the
 *             order's own transaction (dbstrategy.c; db-optimistic reads
 *             its version on a pool thread first)
 *
 *   committer (db/writer.c) commits everything queued as one group (one
 *             fsync), then hands each order back to its home loop: one
 *             wake per loop per group. There the 201 is sent and the
 *             order's pending record is queued to be cleared in the next
 *             script call; or, when the commit failed, the units go back
 *             (undo.lua) before the client hears why.
 *
 * Every answer comes from answer.c. */
#include <assert.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/utf8.h"
#include "service/order.h"

/* ------------------------------------------------------------ db hand-off */

void svc_prepare_lookup(svc_order *op, const char *order_id) {
    memset(&op->job, 0, sizeof op->job);
    op->job.kind = DB_JOB_LOOKUP;
    snprintf(op->job.order.order_id, sizeof op->job.order.order_id, "%s", order_id);
    snprintf(op->job.order.idem_key, sizeof op->job.order.idem_key, "%s", op->idem_key);
}

/* Prepares the order's insert. take says how it gets its stock: DB_TAKE_NONE
 * when Redis reserved it already (under op->sreq.gen). Field by field, the
 * strings by their length: this runs for every order. */
void svc_prepare_insert(svc_order *op, db_take take, long long expect_version) {
    db_job *j = &op->job;
    db_order *o = &j->order;
    j->kind = DB_JOB_INSERT;
    j->take = take;
    j->per_user_limit = take == DB_TAKE_NONE ? 0 : op->p->per_user_limit;
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
}

/* -------------------------------------------------------- reservation results */

int svc_order_reserved(svc_order *op) {
    const stock_req *r = &op->sreq;
    switch (r->result) {
    case STOCK_RESERVED:
        svc_prepare_insert(op, DB_TAKE_NONE, 0);
        return 1;
    case STOCK_REPLAY:
        if (!r->replay_same) {
            svc_refuse(op, RF_KEY_REUSED, 0);
            return 0;
        }
        svc_prepare_lookup(op, r->replay_order_id);   /* answered once the db has looked */
        return 1;
    case STOCK_SOLD_OUT:
        svc_refuse(op, RF_SOLD_OUT, 0);
        return 0;
    case STOCK_INSUFFICIENT:
        svc_refuse(op, RF_INSUFFICIENT, r->available);
        return 0;
    case STOCK_LIMIT:
        svc_refuse(op, RF_LIMIT, r->available);
        return 0;
    case STOCK_MISSING:
        svc_maint_request_rebuild(op->a->maint, op->p);
        svc_refuse(op, RF_REBUILDING, 0);
        return 0;
    case STOCK_LOCK_TIMEOUT:
        svc_refuse(op, RF_LOCK_TIMEOUT, 0);
        return 0;
    case STOCK_FENCED:
        svc_refuse(op, RF_FENCED, 0);
        return 0;
    case STOCK_LOCK_DOWN:
        svc_refuse(op, RF_LOCK_DOWN, 0);
        return 0;
    case STOCK_UNAVAILABLE:
        if (r->outcome_unknown) {
            /* Redis may have run the script before the connection broke.
             * The order is never committed (it goes no further), and the
             * units go back by maintenance's undo retries (a no-op if the
             * script did not run): trying the undo here first would make
             * the client wait a second timeout on a Redis that just failed
             * to answer one. */
            svc_maint_retry_undo(op->a->maint, op->p, op->order_id, op->idem_key);
            svc_refuse(op, RF_REDIS_DOWN_TAKEN, 0);
        } else {
            svc_refuse(op, RF_REDIS_DOWN, 0);
        }
        return 0;
    }
    assert(!"unknown stock result");
    return 0;
}

/* --------------------------------------------------------------- commits */

static int same_request(const svc_order *op, const db_order *o) {
    return !strcmp(o->sku, op->p->sku) && !strcmp(o->user_id, op->user_id) &&
           o->quantity == op->quantity;
}

/* A replay's lookup is done. */
static void looked_up(svc_order *op) {
    const db_job *j = &op->job;
    if (j->status == DB_OK && same_request(op, &j->order)) {
        svc_answer_order(op, &j->order, 1);
        free(op);
    } else if (j->status == DB_OK) {
        svc_refuse(op, RF_KEY_REUSED, 0);
    } else if (j->status == DB_NOTFOUND) {
        svc_refuse(op, RF_IN_PROGRESS, 0);
    } else {
        svc_health_poke_db(op->a->health);
        svc_refuse(op, RF_DB_DOWN, 0);
    }
}

/* The units of a reservation that will not commit are back (or will be,
 * by maintenance's retries): now answer as the commit failed. */
static void undone(void *ud, int done) {
    svc_order *op = ud;
    if (!done) svc_maint_retry_undo(op->a->maint, op->p, op->order_id, op->idem_key);
    if (op->lookup_after_undo) {
        /* The key names an order already in SQLite (its Redis record was
         * lost): answer as a replay of that order. */
        op->lookup_after_undo = 0;
        svc_prepare_lookup(op, "");
        db_writer_submit(op->a->writer, &op->job);
        return;
    }
    svc_refuse(op, op->fail, 0);
}

static void undo_then_refuse(svc_order *op, svc_refusal rf) {
    stock_ref ref = { &op->p->sp, op->order_id, op->idem_key };
    op->fail = rf;
    svc_order_loop_undo(op->home, &ref, undone, op);
}

void svc_order_committed(svc_order *op) {
    if (op->job.kind == DB_JOB_LOOKUP) {
        looked_up(op);
        return;
    }
    if (op->job.take != DB_TAKE_NONE) {          /* a db strategy's own take */
        svc_db_committed(op);
        return;
    }
    switch (op->job.status) {
    case DB_OK:
        svc_answer_order(op, &op->job.order, 0);
        svc_order_loop_clear(op->home, op->p, op->order_id);
        free(op);
        return;
    case DB_DUPKEY:
        op->lookup_after_undo = 1;
        undo_then_refuse(op, RF_KEY_REUSED);
        return;
    case DB_UNKNOWN:
        /* Whether it committed is unknown: the pending record stays, and
         * reconciliation settles it against the database later. */
        svc_health_poke_db(op->a->health);
        svc_refuse(op, RF_DB_UNKNOWN, 0);
        return;
    case DB_STALE:
        undo_then_refuse(op, RF_STALE);
        return;
    default:
        svc_health_poke_db(op->a->health);
        undo_then_refuse(op, RF_DB_DOWN);
        return;
    }
}

/* The committer's callback, on its thread: every order goes home. */
void svc_order_batch_done(db_job **jobs, size_t n, void *ud) {
    svc_app *a = ud;
    int failed = 0;
    for (size_t i = 0; i < n; i++) {
        svc_order *op = (svc_order *)((char *)jobs[i] - offsetof(svc_order, job));
        failed |= jobs[i]->kind == DB_JOB_INSERT &&
                  (jobs[i]->status == DB_ERROR || jobs[i]->status == DB_BUSY);
        svc_order_loop_give(op->home, op);
    }
    svc_order_loop_give_done(a);
    static _Atomic int64_t last_log_us;
    if (failed && clock_mono_us() - atomic_load(&last_log_us) > 1000000) {
        atomic_store(&last_log_us, clock_mono_us());
        svc_log(SVC_LOG_ERROR,
                "database: group commit failed (orders answered 503, stock given back)");
    }
}

/* ------------------------------------------------------------------ submit */

void svc_order_submit(svc_app *a, http_req *req, svc_product *p, const svc_order_input *in,
                      const char *idem_key) {
    /* Not calloc: the op is 1.6 KB, mostly string room, and every field
     * is set below or before it is read. */
    svc_order *op = malloc(sizeof *op);
    int64_t wall_ms;
    if (!op) {
        const char *retry[] = { "Retry-After", "1", NULL };
        http_reply_error_with(req, 503, "shutting_down", NULL, retry,
                              "The service is out of memory; retry shortly.");
        return;
    }
    op->a = a;
    op->req = req;
    op->p = p;
    op->home = svc_order_loop_home(a);
    op->quantity = in->quantity;
    op->phase = PH_RESERVE_ONE;
    op->fail = 0;
    op->lookup_after_undo = 0;
    op->tries = 0;
    op->next = NULL;
    op->job.kind = DB_JOB_INSERT;
    svc_order_id_new(op->order_id, &wall_ms);
    db_format_time(wall_ms, op->created_at);
    /* Validated lengths: a user id is at most 128 characters (512 bytes),
     * a key at most 128 bytes. */
    size_t ul = strlen(in->user_id), kl = idem_key ? strlen(idem_key) : 0;
    assert(ul < sizeof op->user_id && kl < sizeof op->idem_key);
    memcpy(op->user_id, in->user_id, ul + 1);
    memcpy(op->idem_key, idem_key ? idem_key : "", kl + 1);
    svc_order_fingerprint(p->sku, in->user_id, in->quantity, op->fingerprint);
    op->sreq = (stock_req){ .product = &p->sp, .order_id = op->order_id, .user_id = op->user_id,
                            .quantity = op->quantity, .idem_key = op->idem_key,
                            .fingerprint = op->fingerprint };
    http_tag(req, (int)p->strategy);     /* its latency, by strategy (metrics.c) */
    http_defer(req);
    svc_strategy_submit(op);
}
