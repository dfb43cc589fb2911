/* fam_db.c: the db family: `db` and `db-optimistic`, whose stock lives in
 * SQLite.
 *
 *   db             the order goes straight to the committer, whose
 *                  transaction takes the stock with a conditional UPDATE
 *                  (... SET sold = sold + q WHERE stock_initial - sold >= q)
 *                  before inserting the order: the take and the order
 *                  commit together or not at all
 *   db-optimistic  a blocking thread reads the stock and its version
 *                  outside any transaction, as an application would; the
 *                  committer then tries UPDATE ... WHERE version = v, and a
 *                  moved version sends the order back to read again (at
 *                  most OPTIMISTIC_TRIES times)
 *
 * The SQL is the db module's (db_stock_read, and the DB_TAKE_* of an
 * insert in db/db.c); this file is the service's side of both. Nothing is
 * reserved in Redis, so a refusal has nothing to give back. */
#include <stdio.h>

#include "service/ops/health.h"
#include "service/order/commit.h"
#include "service/order/fam_db.h"
#include "service/order/pipeline.h"

#define OPTIMISTIC_TRIES 20

/* db-optimistic, step one, on a blocking thread: read the stock and its
 * version, then let the committer try the versioned update. */
static void read_version(svc_order *op) {
    db *d = svc_thread_db(op->a);
    long long available = 0, version = 0;
    if (!d || db_stock_read(d, op->p->sku, &available, &version) != DB_OK) {
        svc_health_poke_db(op->a->health);
        svc_order_refuse(op, RF_DB_DOWN, 0);
        return;
    }
    if (available < op->quantity) {
        svc_order_refuse(op, available > 0 ? RF_INSUFFICIENT : RF_SOLD_OUT, available);
        return;
    }
    op->fam_data.db.tries++;
    svc_commit_prepare_insert(op, DB_TAKE_OPTIMISTIC, version);
    svc_commit_send(op);
}

static void submit(svc_order *op) {
    if (op->p->strategy == STOCK_DB_OPTIMISTIC) {
        svc_pipeline_run_blocking(op, read_version);
        return;
    }
    svc_commit_prepare_insert(op, DB_TAKE_CONDITIONAL, 0);
    svc_commit_send(op);
}

/* The order came back refused: nothing was reserved in Redis, so there is
 * nothing to give back. */
static void refused(svc_order *op) {
    const db_job *j = &op->job;
    switch (j->status) {
    case DB_NOSTOCK:
        svc_order_refuse(op, j->available > 0 ? RF_INSUFFICIENT : RF_SOLD_OUT, j->available);
        return;
    case DB_LIMIT:
        svc_order_refuse(op, RF_LIMIT, j->available);
        return;
    case DB_CONFLICT:
        if (op->fam_data.db.tries < OPTIMISTIC_TRIES) {
            svc_order_to(op, SVC_ORDER_RESERVING);   /* read the new version, try again */
            svc_pipeline_run_blocking(op, read_version);
            return;
        }
        svc_order_refuse(op, RF_CONFLICT, op->fam_data.db.tries);
        return;
    case DB_DUPKEY:
        svc_commit_prepare_lookup(op, "");    /* answer as a replay of the key's order */
        svc_commit_send(op);
        return;
    default:
        svc_health_poke_db(op->a->health);
        svc_order_refuse(op, j->status == DB_UNKNOWN ? RF_DB_UNKNOWN : RF_DB_DOWN, 0);
        return;
    }
}

/* On the order's home loop. */
static void committed(svc_order *op) {
    if (op->job.status != DB_OK) {
        refused(op);
        return;
    }
    svc_order_answer(op, &op->job.order, 0);      /* no pending record to clear */
}

const svc_family svc_family_db = {
    .name = "db",
    .submit = submit,
    .committed = committed,
};
