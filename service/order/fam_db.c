/* fam_db.c: the db family: `db`, `db-optimistic` and `db-for-update`,
 * whose stock lives in the database.
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
 *   db-for-update  a blocking thread runs the order's own transaction on
 *                  its connection: the product's row locked (SELECT ...
 *                  FOR UPDATE), checked, written, the order inserted,
 *                  committed (PostgreSQL); its unsafe twin reads and checks
 *                  before that transaction, and writes what it computed
 *
 * The SQL is the db module's (db_stock_read, and the DB_TAKE_* of an
 * insert in db/db.c); this file is the service's side of both. Nothing is
 * reserved in Redis, so a refusal has nothing to give back. */
#include <stdio.h>

#include "service/ops/health.h"
#include "service/order/commit.h"
#include "service/order/fam_db.h"
#include "service/order/pipeline.h"
#include "service/repair/repair.h"

#define OPTIMISTIC_TRIES 20

/* What this family keeps with an order it holds (order_int.h's fam_data). */
typedef struct db_data {
    int tries;                     /* db-optimistic: versioned updates tried */
} db_data;
SVC_FAM_DATA_FITS(db_data);
#define DBF(op) (*SVC_FAM_DATA(op, db_data))

/* db-optimistic, step one, on a blocking thread: read the stock and its
 * version, then let the committer try the versioned update. */
static void read_version(svc_order *op) {
    int busy = 0;
    db *d = svc_db_take(op->a, &busy);
    long long available = 0, version = 0;
    db_status st = d ? db_stock_read(d, op->p->sku, &available, &version) : DB_ERROR;
    svc_db_give(op->a, d);
    if (st != DB_OK) {
        if (!busy) svc_health_poke_db(op->a->health);
        svc_order_refuse(op, busy ? RF_DB_BUSY : RF_DB_DOWN, 0);
        return;
    }
    if (available < op->quantity) {
        svc_order_refuse(op, available > 0 ? RF_INSUFFICIENT : RF_SOLD_OUT, available);
        return;
    }
    DBF(op).tries++;
    svc_commit_prepare_insert(op, DB_TAKE_OPTIMISTIC, version);
    svc_commit_send(op);
}

static void refused(svc_order *op);

/* db-for-update's critical section (fault injection): the forcing of an
 * interleaving waits here, inside the locked transaction. */
static void in_critical_section(void *ud, long long units) {
    svc_order *op = ud;
    stock_conn *sc = svc_thread_stock(op->a);
    if (sc) stock_force_wait(sc, &op->p->sp, 0, 0, units);
}

/* db-for-update and its twin, on a blocking thread: the order's own
 * transaction on this thread's connection, then the answer. */
static void for_update(svc_order *op) {
    int busy = 0;
    db *d = svc_db_take(op->a, &busy);
    long long read = 0, version = 0, available = 0;
    int unsafe = op->p->strategy == STOCK_UNSAFE_CHECK_OUTSIDE_TX;
    if (!d) {
        if (!busy) svc_health_poke_db(op->a->health);
        svc_order_refuse(op, busy ? RF_DB_BUSY : RF_DB_DOWN, 0);
        return;
    }
    if (unsafe) {
        /* unsafe-check-outside-tx's mistake: the check before the
         * transaction that locks. */
        if (db_stock_read(d, op->p->sku, &read, &version) != DB_OK) {
            svc_db_give(op->a, d);
            svc_health_poke_db(op->a->health);
            svc_order_refuse(op, RF_DB_DOWN, 0);
            return;
        }
        if (read < op->quantity) {
            svc_db_give(op->a, d);
            svc_order_refuse(op, read > 0 ? RF_INSUFFICIENT : RF_SOLD_OUT, read);
            return;
        }
        if (op->p->sp.cs_delay_ms > 0) in_critical_section(op, read);
    }
    svc_commit_prepare_insert(op, unsafe ? DB_TAKE_READ_BEFORE : DB_TAKE_FOR_UPDATE, read);
    if (!unsafe && op->p->sp.cs_delay_ms > 0) db_set_critical(d, in_critical_section, op);
    db_job *j = &op->job;
    j->status = db_order_for_update(d, &j->order, j->take, j->per_user_limit, read, &available);
    db_set_critical(d, NULL, NULL);
    svc_db_give(op->a, d);
    j->available = available;
    if (j->status != DB_OK) {
        refused(op);
        return;
    }
    svc_order_answer(op, &j->order, 0);
}

static void submit(svc_order *op) {
    DBF(op).tries = 0;
    if (op->p->strategy == STOCK_DB_OPTIMISTIC) {
        svc_pipeline_run_blocking(op, read_version);
        return;
    }
    if (stock_strategy_about(op->p->strategy)->kind == STOCK_KIND_DB_FOR_UPDATE) {
        svc_pipeline_run_blocking(op, for_update);
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
        if (DBF(op).tries < OPTIMISTIC_TRIES) {
            svc_order_to(op, SVC_ORDER_RESERVING);   /* read the new version, try again */
            svc_pipeline_run_blocking(op, read_version);
            return;
        }
        svc_order_refuse(op, RF_CONFLICT, DBF(op).tries);
        return;
    case DB_DUPKEY:
        svc_commit_prepare_lookup(op, "");    /* answer as a replay of the key's order */
        svc_commit_send(op);
        return;
    default:
        svc_health_poke_db(op->a->health);
        /* Answered 503 with its COMMIT's outcome unknown: revoked once
         * the database answers (its units are the database's). */
        if (j->status == DB_UNKNOWN)
            svc_repair_revoke(op->a->repair, op->p, op->order_id, op->idem_key, 1, 0);
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

svc_family svc_family_db = {
    .name = "db",
    .kinds = 1u << STOCK_KIND_DB | 1u << STOCK_KIND_DB_OPTIMISTIC | 1u << STOCK_KIND_DB_FOR_UPDATE,
    .submit = submit,
    .committed = committed,
};
