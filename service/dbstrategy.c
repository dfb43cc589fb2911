/* dbstrategy.c: the `db` and `db-optimistic` strategies, whose stock
 * lives in SQLite.
 *
 *   db             the order goes straight to the committer, whose
 *                  transaction takes the stock with a conditional UPDATE
 *                  (... SET sold = sold + q WHERE stock_initial - sold >= q)
 *                  before inserting the order: the take and the order
 *                  commit together or not at all
 *   db-optimistic  a pool thread reads the stock and its version outside
 *                  any transaction, as an application would; the committer
 *                  then tries UPDATE ... WHERE version = v, and a moved
 *                  version sends the order back to read again (at most
 *                  OPTIMISTIC_TRIES times)
 *
 * The SQL is the db module's (db_stock_read, and the DB_TAKE_* of an
 * insert in db/db.c); this file is the service's side of both. Nothing is
 * reserved in Redis, so a refusal has nothing to give back. */
#include <stdio.h>
#include <stdlib.h>

#include "service/order.h"

#define OPTIMISTIC_TRIES 20

void svc_db_submit(svc_order *op) {
    svc_prepare_insert(op, DB_TAKE_CONDITIONAL, 0);
    db_writer_submit(op->a->writer, &op->job);
}

/* db-optimistic, step one: read the stock and its version (outside any
 * transaction, as an application would), then let the committer try the
 * versioned update. */
void svc_db_optimistic_read(svc_order *op) {
    db *d = svc_thread_db(op->a);
    long long available = 0, version = 0;
    if (!d || db_stock_read(d, op->p->sku, &available, &version) != DB_OK) {
        svc_health_poke_db(op->a->health);
        svc_refuse(op, RF_DB_DOWN, 0);
        return;
    }
    if (available < op->quantity) {
        svc_refuse(op, available > 0 ? RF_INSUFFICIENT : RF_SOLD_OUT, available);
        return;
    }
    op->tries++;
    svc_prepare_insert(op, DB_TAKE_OPTIMISTIC, version);
    db_writer_submit(op->a->writer, &op->job);
}

/* A db strategy's order came back refused: nothing was reserved in Redis,
 * so there is nothing to give back. */
static void refused(svc_order *op) {
    const db_job *j = &op->job;
    switch (j->status) {
    case DB_NOSTOCK:
        svc_refuse(op, j->available > 0 ? RF_INSUFFICIENT : RF_SOLD_OUT, j->available);
        return;
    case DB_LIMIT:
        svc_refuse(op, RF_LIMIT, j->available);
        return;
    case DB_CONFLICT:
        if (op->tries < OPTIMISTIC_TRIES) {
            op->phase = PH_DB_READ;       /* read the new version, try again */
            svc_pool_push(op->a->pool, op);
            return;
        }
        svc_refuse(op, RF_CONFLICT, op->tries);
        return;
    case DB_DUPKEY:
        svc_prepare_lookup(op, "");           /* answer as a replay of the key's order */
        db_writer_submit(op->a->writer, &op->job);
        return;
    default:
        svc_health_poke_db(op->a->health);
        svc_refuse(op, j->status == DB_UNKNOWN ? RF_DB_UNKNOWN : RF_DB_DOWN, 0);
        return;
    }
}

void svc_db_committed(svc_order *op) {
    if (op->job.status != DB_OK) {
        refused(op);
        return;
    }
    svc_answer_order(op, &op->job.order, 0);
    free(op);                                /* no pending record to clear */
}
