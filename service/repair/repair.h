/* repair.h: making Redis agree with SQLite, in one place.
 *
 * SQLite is the truth; Redis holds a working copy of each SKU's stock and
 * a pending record per reservation not yet known committed. Everything
 * that brings the copy back in line lives behind this header:
 *
 *   rebuild     a missing or stale copy is loaded again from SQLite under a
 *               new generation (rebuild.c)
 *   reconcile   pending records no live request owns are settled: the
 *               order committed -> record cleared; not -> voided in SQLite
 *               first, then its units given back (reconcile.c)
 *   queue       rebuilds asked for by the order path and the API, and
 *               undos that failed, retried until Redis answers (queue.c);
 *               run by the maintenance thread (ops/maint.c)
 *   recover     at start-up, before serving: rebuild what is missing,
 *               settle what dead instances left (recover.c)
 *   audit       `flashsale audit [--repair]`: every discrepancy printed,
 *               and what is safely fixable fixed (audit.c) */
#ifndef FLASHSALE_SERVICE_REPAIR_H
#define FLASHSALE_SERVICE_REPAIR_H

#include "db/db.h"
#include "stock/stock.h"

typedef struct svc_app svc_app;
typedef struct svc_product svc_product;
typedef struct svc_repair svc_repair;

/* ------------------------------------------------------------------ queue */

svc_repair *svc_repair_new(svc_app *a);
/* Frees r, logging each undo never done (left to reconciliation). */
void svc_repair_free(svc_repair *r);
/* Asks for p's Redis copy to be rebuilt from SQLite (deduplicated). Any
 * thread; never waits. */
void svc_repair_request_rebuild(svc_repair *r, svc_product *p);
/* The same, replacing even a copy that looks valid. */
void svc_repair_request_forced_rebuild(svc_repair *r, svc_product *p);
/* Hands over a reservation whose undo failed (or whose script's outcome is
 * unknown), to retry until it succeeds. Any thread; never waits. */
void svc_repair_retry_undo(svc_repair *r, svc_product *p, const char *order_id,
                           const char *idem_key);
/* Hands over an order answered 503 while its COMMIT's outcome was unknown:
 * revoked in the database as soon as it answers (db_order_revoke), then
 * its units given back (in_db: the stock is the database's, nothing to
 * give back in Redis). marked: its revoke mark is in Redis already (else
 * the queue writes it first). Any thread; never waits. */
void svc_repair_revoke(svc_repair *r, svc_product *p, const char *order_id,
                       const char *idem_key, int in_db, int marked);
/* Whether order_id waits to be revoked (reconciliation leaves it). */
int svc_repair_revoking(svc_repair *r, const char *order_id);
/* Waits up to ms for repair work to be queued, or for svc_repair_interrupt. */
void svc_repair_wait(svc_repair *r, int ms);
void svc_repair_interrupt(svc_repair *r);
/* Runs the queued rebuilds (none when d is NULL) and undo retries on the
 * caller's connections. */
void svc_repair_run(svc_repair *r, db *d, stock_conn *sc);

/* ---------------------------------------------------------------- rebuild */

/* Rebuilds p's Redis copy now, on the caller's connections, unless the copy
 * is valid for the running Redis and force is 0 (a copy that is valid may
 * still be wrong only after a write of unknown outcome: restock, audit).
 * Returns 0, or -1 with the reason logged. */
int svc_rebuild(svc_app *a, db *d, stock_conn *sc, svc_product *p, int force);

/* -------------------------------------------------------------- reconcile */

/* Settles every pending record that no live request owns: committed orders
 * are confirmed, the others voided and given back. only_dead: skip records
 * of live instances younger than the pending timeout. A complete sweep is
 * the pending-record gauges' reading. Returns the number settled, or -1 on
 * error. */
int svc_reconcile(svc_app *a, db *d, stock_conn *sc, int only_dead);
/* The same for one product's pending records. */
int svc_reconcile_product(svc_app *a, db *d, stock_conn *sc, svc_product *p, int only_dead);

/* ---------------------------------------------------------------- recover */

/* Brings Redis in line with SQLite before serving: every product cached,
 * missing copies rebuilt, dead instances' reservations settled. Redis
 * being down is not fatal (logged; maintenance catches up). */
void svc_repair_recover(svc_app *a, db *d);

/* ------------------------------------------------------------------ audit */

/* `flashsale audit` (a->cfg loaded): prints every discrepancy between
 * Redis and SQLite; repair fixes what is safely fixable. Returns the exit
 * code: 0 consistent, 1 discrepancies left, 2 usage or connection error. */
int svc_audit_main(svc_app *a, int repair);

#endif
