/* commit.h: an order's trip to the committer and back to its loop; private
 * to service/order/.
 *
 * The committer (db/writer.c) commits whatever is queued as one group (one
 * fsync), then calls svc_commit_done on its thread: each order goes back
 * to its home loop, one wake per loop per group, where a replay's lookup
 * is answered here and a commit is handed to its family's `committed`. */
#ifndef FLASHSALE_SERVICE_COMMIT_H
#define FLASHSALE_SERVICE_COMMIT_H

#include "service/order/order_int.h"
#include "service/order/orderloop.h"

/* Prepares op's insert and moves it to COMMITTING. take says how it gets
 * its stock: DB_TAKE_NONE when Redis reserved it already (under
 * op->sreq.gen); expect_version: DB_TAKE_OPTIMISTIC's. */
void svc_commit_prepare_insert(svc_order *op, db_take take, long long expect_version);
/* Prepares the lookup of the order a replayed key names (order_id, or ""
 * to find it by op's key) and moves op to LOOKING_UP. */
void svc_commit_prepare_lookup(svc_order *op, const char *order_id);
/* Queues prepared orders for the committer: one, or n at once (one lock
 * and one wake). Any thread. */
void svc_commit_send(svc_order *op);
void svc_commit_send_many(svc_app *a, svc_order **ops, size_t n);

/* The committer's side: sends every order of a committed group home
 * (*touched: the committer's list of loops to wake). Committer thread. */
void svc_commit_done(db_job **jobs, size_t n, svc_order_loop **touched);

#endif
